//! Automatic rebuild. A chunkserver that has been down longer than `rebuild_after` is replaced
//! in every placement group that names it: for each file, a spare up node (not already in the
//! group) is chosen, every shard the dead node held is rebuilt onto the spare by the spare
//! itself (`RebuildShard`: it fetches `k` other shards from its peers and decodes), and only
//! when every stripe's shard is rebuilt does the file's placement switch, in one metadata
//! batch. Stripes written degraded (a `missing` mask at commit) are healed the same way on
//! their own nodes. Data never passes through the metaserver; rebuild traffic is rate-limited.
//!
//! A pass scans the namespace; it runs when some node is down past the threshold, when a
//! degraded commit happened, or when the previous pass left work undone. What it finds is
//! published as [`RepairState`] for `cairn status`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Layout, Result, ShardId, MAX_MESSAGE_BYTES};
use cairn_proto::chunk_client::ChunkClient;
use cairn_proto::{RebuildShardRequest, RebuildSource, StripeInfo};
use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::namespace::Namespace;
use crate::schema::{self, Inode};
use crate::store::Cf;

/// What the last repair pass saw and did (cumulative counters since start).
#[derive(Clone, Debug, Default)]
pub struct RepairState {
    /// Stripes with at least one shard lost or on a down node, as of the last pass.
    pub degraded_stripes: u64,
    /// Bytes of shards still to rebuild, as of the last pass.
    pub bytes_to_rebuild: u64,
    /// Stripes with more than `m` shards gone (unreadable until nodes return), and their files.
    pub unrecoverable_stripes: u64,
    pub unrecoverable_files: Vec<u64>,
    pub shards_rebuilt: u64,
    pub bytes_rebuilt: u64,
    /// Rebuild rate of the last pass that rebuilt something, bytes per second.
    pub rate: u64,
}

pub struct Repair {
    ns: Arc<Namespace>,
    rebuild_after: Duration,
    rate_bytes: u64,
    started: Instant,
    channels: Mutex<HashMap<String, Channel>>,
}

/// One node as the repair sees it.
#[derive(Clone)]
struct NodeView {
    addr: String,
    up: bool,
    /// Down for longer than the rebuild threshold: its shards are rebuilt elsewhere.
    gone: bool,
    free: u64,
}

impl Repair {
    pub fn new(ns: Arc<Namespace>, rebuild_after: Duration, rate_bytes: u64) -> Repair {
        Repair {
            ns,
            rebuild_after,
            rate_bytes: rate_bytes.max(1 << 20),
            started: Instant::now(),
            channels: Mutex::new(HashMap::new()),
        }
    }

    pub async fn run(self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        let mut pending = true;
        loop {
            tick.tick().await;
            let nodes = self.nodes();
            let hint = self.ns.take_degraded_hint();
            if !(pending || hint || nodes.values().any(|n| n.gone)) {
                continue;
            }
            match self.pass(&nodes).await {
                Ok(state) => {
                    pending = state.degraded_stripes > 0;
                    *self.ns.repair_state().lock() = state;
                }
                Err(e) => {
                    tracing::warn!("repair pass: {e}");
                    pending = true;
                }
            }
        }
    }

    fn nodes(&self) -> HashMap<u32, NodeView> {
        let uptime = self.started.elapsed().as_millis() as u64;
        self.ns
            .registry()
            .nodes()
            .into_iter()
            .map(|n| {
                // A node not heard from since this metaserver started has been down at most
                // that long, as far as we know.
                let down_ms = n.last_heartbeat_ms_ago.min(uptime);
                let gone = !n.up && down_ms > self.rebuild_after.as_millis() as u64;
                let free = n.tiers.iter().map(|t| t.free).sum();
                (n.id, NodeView { addr: n.addr, up: n.up, gone, free })
            })
            .collect()
    }

    /// Scan every regular file once, healing what can be healed now.
    pub async fn pass_now(&self) -> Result<RepairState> {
        let nodes = self.nodes();
        let state = self.pass(&nodes).await?;
        *self.ns.repair_state().lock() = state.clone();
        Ok(state)
    }

    async fn pass(&self, nodes: &HashMap<u32, NodeView>) -> Result<RepairState> {
        let mut state = {
            let last = self.ns.repair_state().lock();
            RepairState {
                shards_rebuilt: last.shards_rebuilt,
                bytes_rebuilt: last.bytes_rebuilt,
                rate: last.rate,
                ..Default::default()
            }
        };
        let started = Instant::now();
        let before = state.bytes_rebuilt;
        let mut from = Vec::new();
        loop {
            let page = self.ns.store().scan(Cf::Inodes, &from, &[], 512)?;
            let Some((last, _)) = page.last() else { break };
            from = last.clone();
            from.push(0);
            for (_, value) in &page {
                let inode: Inode = schema::decode("inode", value)?;
                if inode.is_reg() && !inode.placement.is_empty() {
                    if let Err(e) = self.heal_file(&inode, nodes, &mut state).await {
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
        nodes: &HashMap<u32, NodeView>,
        state: &mut RepairState,
    ) -> Result<()> {
        let layout = inode.layout();
        let width = layout.width() as usize;
        let old = inode.placement.clone();
        if old.len() != width {
            return Err(CairnError::corrupt(format!("placement of {} nodes for {layout}", old.len())));
        }
        let new = self.replacement(&old, nodes);
        let up = |id: u32| nodes.get(&id).is_some_and(|n| n.up);
        let mut healed = Vec::new();
        let mut complete = true;
        let mut unrecoverable = false;
        for info in self.stripes(inode.ino)? {
            let mut lost = info.missing;
            for (p, (o, n)) in old.iter().zip(&new).enumerate() {
                if o != n {
                    lost |= 1 << index_at(&layout, info.index, p);
                }
            }
            for i in 0..layout.k {
                if layout.shard_len(i, info.written_len) == 0 {
                    lost &= !(1 << i);
                }
            }
            let node_of = |i: u32| old[layout.position(info.index, i)];
            let unavailable =
                (0..layout.width()).filter(|&i| lost & (1 << i) == 0 && !up(node_of(i))).count();
            if lost == 0 && unavailable == 0 {
                continue;
            }
            state.degraded_stripes += 1;
            if lost.count_ones() as usize + unavailable > layout.m as usize {
                state.unrecoverable_stripes += 1;
                unrecoverable = true;
                complete = false;
                continue;
            }
            let sources: Vec<RebuildSource> = (0..layout.width())
                .filter(|&i| {
                    lost & (1 << i) == 0 && up(node_of(i)) && layout.shard_len(i, info.written_len) > 0
                })
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
                let id = ShardId { ino: inode.ino, stripe: info.index, index: i, version: info.version };
                match self.rebuild_on(&addr, id, layout, info.written_len, &sources).await {
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
            if rebuilt != 0 {
                healed.push((info.index, info.version, rebuilt));
            }
            if rebuilt == lost {
                state.degraded_stripes -= (unavailable == 0) as u64;
            }
        }
        if unrecoverable {
            state.unrecoverable_files.push(inode.ino);
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
        Ok(())
    }

    /// `old` with every long-gone node swapped for a distinct up node outside the group (the
    /// one with the most free space), where one exists.
    fn replacement(&self, old: &[u32], nodes: &HashMap<u32, NodeView>) -> Vec<u32> {
        let mut new = old.to_vec();
        for p in 0..new.len() {
            if !nodes.get(&new[p]).is_some_and(|n| n.gone) {
                continue;
            }
            let in_use: HashSet<u32> = new.iter().copied().collect();
            let spare = nodes
                .iter()
                .filter(|(id, n)| n.up && !in_use.contains(id))
                .max_by_key(|(id, n)| (n.free, std::cmp::Reverse(**id)))
                .map(|(id, _)| *id);
            if let Some(spare) = spare {
                new[p] = spare;
            }
        }
        new
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

    async fn rebuild_on(
        &self,
        addr: &str,
        id: ShardId,
        layout: Layout,
        written_len: u64,
        sources: &[RebuildSource],
    ) -> Result<u64> {
        let channel = {
            let mut channels = self.channels.lock();
            match channels.get(addr) {
                Some(c) => c.clone(),
                None => {
                    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                        .map_err(|e| CairnError::invalid(format!("chunkserver address {addr:?}: {e}")))?
                        .connect_timeout(Duration::from_secs(2))
                        .timeout(Duration::from_secs(60));
                    let c = endpoint.connect_lazy();
                    channels.insert(addr.to_string(), c.clone());
                    c
                }
            }
        };
        let mut client = ChunkClient::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
        let req = RebuildShardRequest {
            id: Some(id.into()),
            layout: Some(layout.into()),
            written_len,
            sources: sources.to_vec(),
        };
        Ok(client.rebuild_shard(req).await.map_err(CairnError::from)?.into_inner().bytes)
    }
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
