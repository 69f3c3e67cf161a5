//! Garbage collection of shards. Operations that orphan shards (unlink, truncate, a commit that
//! replaces a stripe version) record them in `Cf::Gc` in their own batch; this task deletes them
//! from the chunkservers. An entry is removed or shrunk only after the chunkserver confirmed the
//! delete: shards on down or failing nodes stay queued for the next round. Shards on nodes that
//! no longer exist in the registry are dropped (there is nobody left to ask).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Result};
use cairn_net::channels::Channels;
use cairn_proto::DeleteShardsRequest;

use crate::namespace::Namespace;
use crate::schema::{self, GcEntry, GcShard};
use crate::store::{Batch, Cf};

/// Gc entries handled per round.
const ENTRIES_PER_ROUND: usize = 1024;
/// Shard ids per DeleteShards request.
const IDS_PER_REQUEST: usize = 4096;
const RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcRound {
    /// Shards the chunkservers confirmed deleted.
    pub deleted: usize,
    /// Shards dropped because their node no longer exists.
    pub dropped: usize,
    /// Shards left for a later round.
    pub pending: usize,
}

pub struct Gc {
    ns: Arc<Namespace>,
    cluster: Arc<crate::cluster::Cluster>,
    channels: Channels,
}

impl Gc {
    pub fn new(ns: Arc<Namespace>, cluster: Arc<crate::cluster::Cluster>) -> Gc {
        Gc { ns, cluster, channels: Channels::new(RPC_TIMEOUT, RPC_TIMEOUT) }
    }

    async fn delete_on(&self, addr: &str, shards: &[GcShard]) -> Result<()> {
        let mut client = self.channels.chunk(addr)?;
        for chunk in shards.chunks(IDS_PER_REQUEST) {
            let ids = chunk
                .iter()
                .map(|s| cairn_proto::ShardId {
                    ino: s.ino,
                    stripe: s.stripe,
                    index: s.index,
                    version: s.version,
                })
                .collect();
            client
                .delete_shards(DeleteShardsRequest {
                    ids,
                    fence: self.ns.fence(),
                    cluster_id: self.ns.cluster_id().to_string(),
                    cap: None,
                    // The shards are this group's inodes': chunkservers check the slots.
                    group: self.ns.group(),
                })
                .await?;
        }
        Ok(())
    }

    /// One pass over (up to a round's worth of) the queue.
    pub async fn run_once(&self) -> Result<GcRound> {
        let ns = self.ns.clone();
        // The entries, then an fsync: the changes that queued them (an unlink, a replaced
        // stripe, a moved placement) are on disk before any shard goes, so a power loss cannot
        // bring back a file whose shards were deleted.
        let rows = tokio::task::spawn_blocking(move || {
            let rows = ns.store().scan(Cf::Gc, &[], &[], ENTRIES_PER_ROUND)?;
            if !rows.is_empty() {
                ns.store().sync()?;
            }
            Ok::<_, CairnError>(rows)
        })
        .await
        .map_err(|e| CairnError::internal(format!("gc scan: {e}")))??;
        let mut entries = Vec::with_capacity(rows.len());
        let mut by_node: HashMap<u32, Vec<GcShard>> = HashMap::new();
        for (key, value) in rows {
            let entry: GcEntry = schema::decode("gc entry", &value)?;
            for s in &entry.shards {
                by_node.entry(s.node).or_default().push(s.clone());
            }
            entries.push((key, entry));
        }
        if entries.is_empty() {
            return Ok(GcRound::default());
        }
        let registry = self.cluster.registry().clone();
        let mut gone = HashSet::new();
        let mut calls = Vec::new();
        for (node, shards) in &by_node {
            match registry.node(*node) {
                None => {
                    gone.insert(*node);
                }
                Some(n) if n.up => calls.push(async move {
                    let result = self.delete_on(&n.addr, shards).await;
                    if let Err(e) = &result {
                        tracing::warn!(node = n.id, addr = %n.addr, "gc: delete failed, will retry: {e}");
                    }
                    (*node, result.is_ok())
                }),
                Some(_) => {}
            }
        }
        let confirmed: HashSet<u32> = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|(_, ok)| *ok)
            .map(|(n, _)| n)
            .collect();

        let mut round = GcRound::default();
        let mut batch = Batch::new();
        for (key, entry) in entries {
            let before = entry.shards.len();
            let mut left = Vec::with_capacity(before);
            for s in entry.shards {
                if confirmed.contains(&s.node) {
                    round.deleted += 1;
                } else if gone.contains(&s.node) {
                    round.dropped += 1;
                } else {
                    left.push(s);
                }
            }
            round.pending += left.len();
            if left.is_empty() {
                batch.delete(Cf::Gc, key);
            } else if left.len() != before {
                batch.put(Cf::Gc, key, schema::encode(&GcEntry { shards: left }));
            }
        }
        if !batch.is_empty() {
            let ns = self.ns.clone();
            tokio::task::spawn_blocking(move || ns.store().write(batch))
                .await
                .map_err(|e| CairnError::internal(format!("gc write: {e}")))??;
        }
        if round.deleted + round.dropped > 0 {
            tracing::debug!(?round, "gc round");
        }
        Ok(round)
    }

    /// Run rounds every `interval` until the task is dropped.
    pub async fn run(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(e) = self.run_once().await {
                tracing::warn!("gc round failed: {e}");
            }
        }
    }
}

#[cfg(test)]
#[path = "gc_tests.rs"]
mod tests;
