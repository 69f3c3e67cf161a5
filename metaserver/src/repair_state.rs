//! What the repair publishes about its last pass ([`RepairState`]): kept by the cluster
//! state (`cluster.rs`), read by the status reply, the health assessment and the metrics, and
//! written only by the repair, so none of them depends on the repair itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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
    /// Draining nodes: shards files still place on them, as of the last pass.
    pub drain_left: BTreeMap<u32, u64>,
    /// Unreferenced shards deleted by reconciliation since start.
    pub stale_shards_deleted: u64,
    /// Shards of inode numbers this namespace never handed out, and the chunkservers holding
    /// them, as of the last reconciliation (kept: see `reconcile.rs`).
    pub foreign_shards: u64,
    pub foreign_nodes: Vec<u32>,
    /// Stripes by how many more shards each can lose (`by_margin[j]`: can lose `j` more), as of
    /// the last pass, after what it healed. Unreadable stripes are not here.
    pub by_margin: Vec<u64>,
    /// The stripes of `by_margin` that can lose fewer shards than their layout's `m`, by
    /// margin, and the bytes of file data in them.
    pub reduced_by_margin: Vec<u64>,
    pub reduced_bytes: u64,
    /// Files whose placement names each node, as of the last pass (before what it moved).
    pub files_by_node: BTreeMap<u32, u64>,
    /// How long a node stays down before its shards are rebuilt elsewhere, and when the repair
    /// started (a node not heard from since has been down at most that long); `None` until a
    /// repair runs.
    pub rebuild_after: Option<(Duration, Instant)>,
}

impl RepairState {
    /// As another group's leader reports it (`RaftStatusReply.repair`).
    pub fn summary(&self) -> cairn_proto::GroupRepair {
        cairn_proto::GroupRepair {
            degraded_stripes: self.degraded_stripes,
            bytes_to_rebuild: self.bytes_to_rebuild,
            unrecoverable_stripes: self.unrecoverable_stripes,
            unrecoverable_files: self.unrecoverable_files.clone(),
            shards_rebuilt: self.shards_rebuilt,
            bytes_rebuilt: self.bytes_rebuilt,
            stripes_by_margin: self.by_margin.clone(),
            reduced_stripes_by_margin: self.reduced_by_margin.clone(),
            reduced_redundancy_bytes: self.reduced_bytes,
            stale_shards_deleted: self.stale_shards_deleted,
            files_by_node: self.files_by_node.iter().map(|(n, f)| (*n, *f)).collect(),
        }
    }

    /// This state with another group's `other` added: the cluster's, as its status tells it.
    pub fn add(&mut self, other: &cairn_proto::GroupRepair) {
        self.degraded_stripes += other.degraded_stripes;
        self.bytes_to_rebuild += other.bytes_to_rebuild;
        self.unrecoverable_stripes += other.unrecoverable_stripes;
        self.unrecoverable_files.extend(&other.unrecoverable_files);
        self.shards_rebuilt += other.shards_rebuilt;
        self.bytes_rebuilt += other.bytes_rebuilt;
        self.stale_shards_deleted += other.stale_shards_deleted;
        self.reduced_bytes += other.reduced_redundancy_bytes;
        for (ours, theirs) in [
            (&mut self.by_margin, &other.stripes_by_margin),
            (&mut self.reduced_by_margin, &other.reduced_stripes_by_margin),
        ] {
            if ours.len() < theirs.len() {
                ours.resize(theirs.len(), 0);
            }
            for (o, t) in ours.iter_mut().zip(theirs) {
                *o += t;
            }
        }
    }

    /// For a node down for `down_ms` (as the registry says), how long until the repair
    /// rebuilds its shards elsewhere (zero: it is doing so); `None` without a repair.
    pub fn rebuild_in(&self, down_ms: u64) -> Option<Duration> {
        let (after, started) = self.rebuild_after?;
        let down = Duration::from_millis(down_ms).min(started.elapsed());
        Some(after.saturating_sub(down))
    }

    pub(crate) fn count_margin(&mut self, margin: usize, m: usize, written_len: u64) {
        if self.by_margin.len() <= margin {
            self.by_margin.resize(margin + 1, 0);
        }
        self.by_margin[margin] += 1;
        if margin < m {
            if self.reduced_by_margin.len() <= margin {
                self.reduced_by_margin.resize(margin + 1, 0);
            }
            self.reduced_by_margin[margin] += 1;
            self.reduced_bytes += written_len;
        }
    }
}
