//! Automatic rebuild, drain and relocation. A placement member is replaced when its node has
//! been down longer than `rebuild_after`, when it is draining, or when it is full and the file
//! has a shard there to heal: for each such file a spare up node (not already in the group, not
//! draining, not full) is chosen, every shard of that position is rebuilt onto the spare by the
//! spare itself (`RebuildShard`: it copies the shard from the old node when that one still
//! serves it, else fetches `k` other shards from its peers and decodes), and only when every
//! stripe's shard is there does the file's placement switch, in one metadata batch that also
//! queues the old copies for garbage collection. Stripes written degraded (a `missing` mask at
//! commit) or reported damaged are healed the same way on their own nodes. Data never passes
//! through the metaserver; rebuild traffic is rate-limited.
//!
//! A pass scans the namespace; it runs when the set of gone, draining or full nodes changed,
//! when a degraded commit or a damage report happened, or when the previous pass left work
//! undone (backing off while nothing can progress). Passes, on-demand ones (`RepairNow`) and
//! the reconciliation of unreferenced shards (`reconcile.rs`) run one at a time. What a pass
//! finds is published as [`RepairState`] for `cairn status`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Layout, Result, ShardId};
use cairn_net::channels::Channels;
use cairn_proto::chunk_client::ChunkClient;
use cairn_proto::{RebuildShardRequest, RebuildSource, StripeInfo};
use tonic::transport::Channel;

use crate::namespace::Namespace;
use crate::repair_state::RepairState;
use crate::schema::Inode;

pub struct Repair {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) cluster: Arc<crate::cluster::Cluster>,
    rebuild_after: Duration,
    rate_bytes: u64,
    started: Instant,
    /// Connections to chunkservers (calls may take a minute: a rebuild copies a whole shard).
    channels: Channels,
    /// Held by every pass and reconciliation: one at a time.
    pub(crate) running: tokio::sync::Mutex<()>,
    /// Unreferenced shards younger than this are left alone.
    pub(crate) orphan_grace: Duration,
    /// Shards of inodes the namespace no longer has are left alone while younger than this.
    pub(crate) unknown_grace: Duration,
}

/// One node as the repair sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeView {
    pub(crate) addr: String,
    pub(crate) up: bool,
    /// Down for longer than the rebuild threshold: its shards are rebuilt elsewhere.
    gone: bool,
    draining: bool,
    full: bool,
    free: u64,
}

impl NodeView {
    /// May receive shards of files it is not yet part of.
    fn spare(&self) -> bool {
        self.up && !self.draining && !self.full
    }
}

impl Repair {
    pub fn new(
        ns: Arc<Namespace>,
        cluster: Arc<crate::cluster::Cluster>,
        rebuild_after: Duration,
        rate_bytes: u64,
    ) -> Repair {
        let started = Instant::now();
        cluster.repair_state().lock().rebuild_after = Some((rebuild_after, started));
        Repair {
            ns,
            cluster,
            rebuild_after,
            rate_bytes: rate_bytes.max(1 << 20),
            started,
            channels: Channels::new(Duration::from_secs(2), Duration::from_secs(60)),
            running: tokio::sync::Mutex::new(()),
            orphan_grace: Duration::from_secs(3600),
            unknown_grace: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// Leave shards of inodes the namespace no longer has alone while younger than `grace`
    /// (default a week; never less than the orphan grace).
    pub fn with_unknown_inode_grace(mut self, grace: Duration) -> Repair {
        self.unknown_grace = grace;
        self
    }

    /// Leave unreferenced shards younger than `grace` alone (default one hour).
    pub fn with_orphan_grace(mut self, grace: Duration) -> Repair {
        self.orphan_grace = grace;
        self
    }

    /// Run passes every `interval` while there is work, and a reconciliation every
    /// `reconcile_every` and whenever a node comes back.
    pub async fn run(self: Arc<Self>, interval: Duration, reconcile_every: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending = true;
        let mut idle_passes = 0u32;
        let mut skipped = 0u32;
        let mut last_seen = Vec::new();
        let mut was_up: HashSet<u32> = HashSet::new();
        let mut last_reconcile = Instant::now();
        loop {
            tick.tick().await;
            let nodes = self.nodes();
            let now_up: HashSet<u32> = nodes.iter().filter(|(_, n)| n.up).map(|(id, _)| *id).collect();
            let rejoined = now_up.iter().any(|id| !was_up.contains(id)) && !was_up.is_empty();
            was_up = now_up;
            if rejoined || last_reconcile.elapsed() >= reconcile_every {
                last_reconcile = Instant::now();
                let report = self.reconcile(false, false).await;
                if report.deleted > 0 || !report.errors.is_empty() {
                    tracing::info!(
                        stale = report.stale,
                        deleted = report.deleted,
                        errors = ?report.errors,
                        "reconciled chunkserver shards with the namespace"
                    );
                }
            }
            // A node going down or coming back changes what stripes can still lose: count again.
            let seen: Vec<(u32, bool, bool, bool, bool)> =
                nodes.iter().map(|(id, n)| (*id, n.up, n.gone, n.draining, n.full)).collect();
            let changed = seen != last_seen;
            let hint = self.cluster.take_degraded_hint();
            // While work is left that cannot progress, look again less and less often.
            let backoff = (1u32 << idle_passes.min(4)) - 1;
            if !(changed || hint || (pending && skipped >= backoff)) {
                skipped += 1;
                continue;
            }
            skipped = 0;
            let before = self.cluster.repair_state().lock().shards_rebuilt;
            match self.pass_now().await {
                Ok(state) => {
                    last_seen = seen;
                    pending = state.degraded_stripes > 0 || state.drain_left.values().any(|&n| n > 0);
                    let progressed = state.shards_rebuilt > before;
                    idle_passes = if pending && !progressed { idle_passes + 1 } else { 0 };
                }
                Err(e) => {
                    tracing::warn!("repair pass: {e}");
                    pending = true;
                    idle_passes += 1;
                }
            }
        }
    }

    pub(crate) fn nodes(&self) -> BTreeMap<u32, NodeView> {
        let uptime = self.started.elapsed().as_millis() as u64;
        self.cluster
            .registry()
            .health()
            .into_iter()
            .map(|n| {
                // A node not heard from since this metaserver started has been down at most
                // that long, as far as we know.
                let down_ms = n.last_heartbeat_ms_ago.min(uptime);
                let gone = !n.up && down_ms > self.rebuild_after.as_millis() as u64;
                let view = NodeView {
                    addr: n.addr,
                    up: n.up,
                    gone,
                    draining: n.draining,
                    full: n.full,
                    free: n.free,
                };
                (n.id, view)
            })
            .collect()
    }

    /// Scan every regular file once, healing what can be healed now (after any running pass).
    pub async fn pass_now(&self) -> Result<RepairState> {
        let _running = self.running.lock().await;
        let nodes = self.nodes();
        let state = self.pass(&nodes).await?;
        let mut published = self.cluster.repair_state().lock();
        // Reconciliation's own findings are kept (it may have counted deletions meanwhile).
        let state = RepairState {
            stale_shards_deleted: published.stale_shards_deleted,
            foreign_shards: published.foreign_shards,
            foreign_nodes: std::mem::take(&mut published.foreign_nodes),
            ..state
        };
        *published = state.clone();
        Ok(state)
    }

    async fn pass(&self, nodes: &BTreeMap<u32, NodeView>) -> Result<RepairState> {
        let mut state = {
            let last = self.cluster.repair_state().lock();
            RepairState {
                shards_rebuilt: last.shards_rebuilt,
                bytes_rebuilt: last.bytes_rebuilt,
                rate: last.rate,
                rebuild_after: last.rebuild_after,
                ..Default::default()
            }
        };
        for (id, n) in nodes {
            if n.draining {
                state.drain_left.insert(*id, 0);
            }
        }
        let started = Instant::now();
        let before = state.bytes_rebuilt;
        let mut after = 0;
        loop {
            let page = self.ns.inodes_after(after, 512)?;
            let Some(last) = page.last() else { break };
            after = last.ino;
            for inode in &page {
                if inode.is_reg() && !inode.placement.is_empty() {
                    let mut nodes_of = inode.placement.clone();
                    nodes_of.sort_unstable();
                    nodes_of.dedup();
                    for node in nodes_of {
                        *state.files_by_node.entry(node).or_default() += 1;
                    }
                    if let Err(e) = self.heal_file(inode, nodes, &mut state).await {
                        tracing::warn!(ino = inode.ino, "repair: {e}");
                    }
                }
            }
        }
        let rebuilt = state.bytes_rebuilt - before;
        if rebuilt > 0 {
            state.rate = (rebuilt as f64 / started.elapsed().as_secs_f64().max(1e-3)) as u64;
            tracing::info!(bytes = rebuilt, rate = state.rate, "repair pass rebuilt shards");
        }
        Ok(state)
    }

    async fn heal_file(
        &self,
        inode: &Inode,
        nodes: &BTreeMap<u32, NodeView>,
        state: &mut RepairState,
    ) -> Result<()> {
        let layout = inode.layout();
        let width = layout.width() as usize;
        let old = inode.placement.clone();
        if old.len() != width {
            return Err(CairnError::corrupt(format!("placement of {} nodes for {layout}", old.len())));
        }
        let stripes = self.stripes(inode.ino)?;
        // Placement positions where some stripe has a shard to heal.
        let mut to_heal = vec![false; width];
        for info in &stripes {
            for i in (0..layout.width()).filter(|i| info.missing & (1 << i) != 0) {
                to_heal[layout.position(info.index, i)] = true;
            }
        }
        let new = replacement(&old, nodes, &to_heal);
        let up = |id: u32| nodes.get(&id).is_some_and(|n| n.up);
        let mut healed = Vec::new();
        let mut complete = true;
        let mut unrecoverable = false;
        let m = layout.m as usize;
        // Stripes short of shards: (gone, rebuilt, moved, unavailable, written_len), counted
        // by margin once it is known whether the placement switches.
        let mut short = Vec::new();
        for info in &stripes {
            let mut lost = info.missing;
            let mut moved = 0u32;
            for (p, (o, n)) in old.iter().zip(&new).enumerate() {
                if o != n {
                    moved |= 1 << index_at(&layout, info.index, p);
                }
            }
            lost |= moved;
            for i in 0..layout.k {
                if layout.shard_len(i, info.written_len) == 0 {
                    lost &= !(1 << i);
                }
            }
            let node_of = |i: u32| old[layout.position(info.index, i)];
            // Shards that are stored and reachable where they are now.
            let readable = |i: u32| {
                info.missing & (1 << i) == 0 && up(node_of(i)) && layout.shard_len(i, info.written_len) > 0
            };
            // Lost shards that only move (their node still serves them) do not degrade the stripe.
            let gone_here = |i: u32| lost & (1 << i) != 0 && !readable(i);
            // (A data shard past the written length holds nothing: its node being down loses
            // nothing.)
            let unavailable = (0..layout.width())
                .filter(|&i| {
                    lost & (1 << i) == 0 && !up(node_of(i)) && layout.shard_len(i, info.written_len) > 0
                })
                .count();
            if lost == 0 && unavailable == 0 {
                state.count_margin(m, m, info.written_len);
                continue;
            }
            let degraded = unavailable > 0 || (0..layout.width()).any(gone_here);
            state.degraded_stripes += degraded as u64;
            let gone = (0..layout.width()).filter(|&i| gone_here(i)).fold(0u32, |mask, i| mask | 1 << i);
            let gone_count = gone.count_ones() as usize;
            if gone_count + unavailable > layout.m as usize {
                state.unrecoverable_stripes += 1;
                unrecoverable = true;
                complete = false;
                continue;
            }
            let peers: Vec<RebuildSource> = (0..layout.width())
                .filter(|&i| lost & (1 << i) == 0 && readable(i))
                .filter_map(|i| {
                    nodes.get(&node_of(i)).map(|n| RebuildSource { index: i, addr: n.addr.clone() })
                })
                .collect();
            let mut rebuilt = 0u32;
            for i in (0..layout.width()).filter(|i| lost & (1 << i) != 0) {
                let target = new[layout.position(info.index, i)];
                let len = layout.shard_len(i, info.written_len);
                state.bytes_to_rebuild += len;
                let Some(addr) = nodes.get(&target).filter(|n| n.up).map(|n| n.addr.clone()) else {
                    complete = false;
                    continue;
                };
                // A shard that only moves is copied from where it is; decoding is the fallback.
                let mut sources = Vec::with_capacity(peers.len() + 1);
                if readable(i) {
                    if let Some(n) = nodes.get(&node_of(i)) {
                        sources.push(RebuildSource { index: i, addr: n.addr.clone() });
                    }
                }
                sources.extend(peers.iter().cloned());
                let id = ShardId { ino: inode.ino, stripe: info.index, index: i, version: info.version };
                match self.rebuild_on(&addr, id, layout, info, &sources).await {
                    Ok(bytes) => {
                        rebuilt |= 1 << i;
                        state.shards_rebuilt += 1;
                        state.bytes_rebuilt += bytes;
                        state.bytes_to_rebuild -= len;
                        tokio::time::sleep(Duration::from_secs_f64(bytes as f64 / self.rate_bytes as f64))
                            .await;
                    }
                    Err(e) => {
                        tracing::warn!(%id, target, "rebuild failed: {e}");
                        complete = false;
                    }
                }
            }
            short.push((gone, rebuilt, moved, unavailable, info.written_len));
            if rebuilt != 0 {
                healed.push((info.index, info.version, rebuilt));
            }
            if rebuilt == lost && degraded {
                state.degraded_stripes -= (unavailable == 0) as u64;
            }
        }
        if unrecoverable {
            state.unrecoverable_files.push(inode.ino);
        }
        // A rebuilt shard counts where it now lives: in place always, on a spare only when
        // the placement switches to it.
        for (gone, rebuilt, moved, unavailable, written_len) in short {
            let restored = if complete { rebuilt } else { rebuilt & !moved };
            let failures = (gone & !restored).count_ones() as usize + unavailable;
            state.count_margin(m.saturating_sub(failures), m, written_len);
        }
        // Switch placement only if every shard of the replaced nodes now lives on the spares;
        // otherwise what went to spares stays unreferenced, and only in-place heals count.
        if !complete {
            let moved: Vec<usize> = (0..width).filter(|&p| old[p] != new[p]).collect();
            for (stripe, _, mask) in healed.iter_mut() {
                for &p in &moved {
                    *mask &= !(1 << index_at(&layout, *stripe, p));
                }
            }
            healed.retain(|(_, _, mask)| *mask != 0);
        }
        let placement = if complete { new } else { old.clone() };
        if placement != old || !healed.is_empty() {
            self.ns.apply_heal(inode.ino, &old, &placement, &healed)?;
        }
        // What still lives on draining nodes.
        for (p, node) in placement.iter().enumerate() {
            if let Some(left) = state.drain_left.get_mut(node) {
                *left += stripes
                    .iter()
                    .filter(|info| {
                        let i = index_at(&layout, info.index, p);
                        info.missing & (1 << i) == 0 && layout.shard_len(i, info.written_len) > 0
                    })
                    .count() as u64;
            }
        }
        Ok(())
    }

    fn stripes(&self, ino: u64) -> Result<Vec<StripeInfo>> {
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let (page, more) = self.ns.list_stripes(ino, from, 4096)?;
            from = page.last().map_or(from, |s| s.index + 1);
            out.extend(page);
            if !more {
                return Ok(out);
            }
        }
    }

    /// A client for the chunkserver at `addr` (connections are kept and shared).
    pub(crate) fn chunk_client(&self, addr: &str) -> Result<ChunkClient<Channel>> {
        self.channels.chunk(addr)
    }

    async fn rebuild_on(
        &self,
        addr: &str,
        id: ShardId,
        layout: Layout,
        info: &StripeInfo,
        sources: &[RebuildSource],
    ) -> Result<u64> {
        let mut client = self.chunk_client(addr)?;
        let req = RebuildShardRequest {
            id: Some(id.into()),
            layout: Some(layout.into()),
            written_len: info.written_len,
            sources: sources.to_vec(),
            hashes: info.hashes.to_vec(),
        };
        Ok(client.rebuild_shard(req).await.map_err(CairnError::from)?.into_inner().bytes)
    }
}

/// `old` with every member that has to go swapped for a spare (a distinct up node outside the
/// group, neither draining nor full, the one with the most free space), where one exists. A
/// member goes when it is gone, draining or removed, or when it is full and has a shard to heal.
fn replacement(old: &[u32], nodes: &BTreeMap<u32, NodeView>, to_heal: &[bool]) -> Vec<u32> {
    let mut new = old.to_vec();
    for p in 0..new.len() {
        // A member the registry no longer knows (removed) goes too.
        let must_go = nodes.get(&new[p]).is_none_or(|n| n.gone || n.draining || (n.full && to_heal[p]));
        if !must_go {
            continue;
        }
        let in_use: HashSet<u32> = new.iter().copied().collect();
        let spare = nodes
            .iter()
            .filter(|(id, n)| n.spare() && !in_use.contains(id))
            .max_by_key(|(id, n)| (n.free, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id);
        if let Some(spare) = spare {
            new[p] = spare;
        }
    }
    new
}

/// The shard index of `stripe` that lives at placement position `p` (inverse of
/// `Layout::position`).
fn index_at(layout: &Layout, stripe: u64, p: usize) -> u32 {
    let width = layout.width() as u64;
    ((p as u64 + width - stripe % width) % width) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(up: bool, gone: bool, draining: bool, full: bool, free: u64) -> NodeView {
        NodeView { addr: "h:1".into(), up, gone, draining, full, free }
    }

    #[test]
    fn replacement_moves_gone_draining_and_full_members_to_the_roomiest_spare() {
        let mut nodes = BTreeMap::new();
        nodes.insert(1, view(false, true, false, false, 100));
        nodes.insert(2, view(true, false, true, false, 100));
        nodes.insert(3, view(true, false, false, true, 0));
        nodes.insert(4, view(true, false, false, false, 10));
        nodes.insert(5, view(true, false, false, false, 50));
        nodes.insert(6, view(true, false, false, false, 50));
        nodes.insert(7, view(true, false, false, false, 90));
        nodes.insert(8, view(false, false, false, false, 1000));
        // Node 1 is gone and 2 draining: both go, to the spares with the most room (7, then
        // 5 before 6 on a tie); node 3 is full but has nothing to heal, so it stays.
        assert_eq!(replacement(&[1, 2, 3, 4], &nodes, &[false; 4]), vec![7, 5, 3, 4]);
        // Full with a shard to heal: it moves too.
        assert_eq!(replacement(&[1, 2, 3, 4], &nodes, &[false, false, true, false]), vec![7, 5, 6, 4]);
        // No spare left: the member stays.
        assert_eq!(replacement(&[1, 4, 5, 6, 7], &nodes, &[false; 5]), vec![1, 4, 5, 6, 7]);
    }

    #[test]
    fn index_at_inverts_position() {
        let layout = Layout::new(4, 2, 4096).unwrap();
        for stripe in 0..13 {
            for i in 0..6 {
                assert_eq!(index_at(&layout, stripe, layout.position(stripe, i)), i);
            }
        }
    }
}
