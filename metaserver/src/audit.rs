//! The content audit: a background pass of the leader over every stripe record that asks each
//! data shard's chunkserver whether the shard's block checksums chain to the content hash its
//! writer recorded (`CheckShards` with the hashes and without `verify`: the chunkserver reads
//! the shard's header, not its data). A chunkserver's own scrub checks the bytes against those
//! block checksums; together they tie every stored byte to the stripe record, so a shard
//! replaced with valid checksums (by a faulty or hostile chunkserver, or anyone with its disk)
//! is found before a reader needs it, while the other shards can still rebuild it. What does
//! not match, or is gone, is marked damaged and the repair rebuilds it.
//! Design: `docs/ARCHITECTURE.md`, "The content audit".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::content::HASH_LEN;
use cairn_common::{CairnError, Result, ShardId};
use cairn_net::channels::Channels;
use cairn_proto::{CheckShardsRequest, ShardState};

use crate::cluster::Cluster;
use crate::metrics::{AUDIT_DAMAGED, AUDIT_PASSES, AUDIT_SHARDS};
use crate::namespace::Namespace;

/// Inodes read per step of the walk.
const INODES_PER_STEP: usize = 256;
/// Stripe records read per page of one file.
const STRIPES_PER_PAGE: u32 = 4096;
/// Shard ids per `CheckShards` request (the chunkserver takes up to 10,000).
const IDS_PER_CHECK: usize = 1024;
/// Most shard ids waiting in all nodes' batches together: past it, every batch goes out (a
/// walk over small files spread on many nodes fills batches slowly).
const IDS_PENDING: usize = 16 * IDS_PER_CHECK;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// What one pass found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditPass {
    /// Data shards whose chunkserver answered about them.
    pub checked: u64,
    /// Of those, shards marked damaged (content mismatch, corrupt or gone).
    pub damaged: u64,
    /// Shards not checked: their chunkserver was down or did not answer.
    pub skipped: u64,
}

pub struct Audit {
    ns: Arc<Namespace>,
    cluster: Arc<Cluster>,
    channels: Channels,
    /// Most data shards checked per second.
    rate: u64,
}

impl Audit {
    pub fn new(ns: Arc<Namespace>, cluster: Arc<Cluster>, shards_per_sec: u64) -> Audit {
        Audit {
            ns,
            cluster,
            channels: Channels::new(CONNECT_TIMEOUT, RPC_TIMEOUT),
            rate: shards_per_sec.max(1),
        }
    }

    /// A pass every `interval` (the first after one interval), until the task is stopped (the
    /// replica stops leading).
    pub async fn run(self, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            match self.pass().await {
                Ok(p) if p.damaged > 0 => tracing::warn!(
                    checked = p.checked,
                    damaged = p.damaged,
                    skipped = p.skipped,
                    "content audit: shards that do not match their stripe records, marked for rebuild"
                ),
                Ok(p) => tracing::info!(checked = p.checked, skipped = p.skipped, "content audit pass clean"),
                Err(e) => tracing::warn!("content audit pass stopped: {e}"),
            }
        }
    }

    /// One pass over every regular file's stripe records.
    pub async fn pass(&self) -> Result<AuditPass> {
        let mut pass = AuditPass::default();
        let mut batches: BTreeMap<u32, Vec<(ShardId, Vec<u8>)>> = BTreeMap::new();
        let mut pending = 0;
        let mut after = 0;
        loop {
            let ns = self.ns.clone();
            let inodes = blocking(move || ns.inodes_after(after, INODES_PER_STEP)).await?;
            let Some(last) = inodes.last() else { break };
            after = last.ino;
            for inode in inodes.into_iter().filter(|i| i.is_reg()) {
                let layout = inode.layout();
                if inode.placement.len() != layout.width() as usize {
                    continue;
                }
                let mut from = 0;
                loop {
                    let (ns, ino) = (self.ns.clone(), inode.ino);
                    let (stripes, more) =
                        match blocking(move || ns.list_stripes(ino, from, STRIPES_PER_PAGE)).await {
                            Ok(page) => page,
                            // Removed since the inodes were read.
                            Err(e) if e.kind() == cairn_common::ErrorKind::NotFound => break,
                            Err(e) => return Err(e),
                        };
                    for stripe in &stripes {
                        for index in 0..layout.k {
                            let at = index as usize * HASH_LEN;
                            let Some(hash) = stripe.hashes.get(at..at + HASH_LEN) else { continue };
                            // Already known damaged (the repair has it), or never stored (a
                            // short stripe's data shards past its bytes).
                            if stripe.missing & (1 << index) != 0
                                || layout.shard_len(index, stripe.written_len) == 0
                            {
                                continue;
                            }
                            let id = ShardId { ino, stripe: stripe.index, index, version: stripe.version };
                            let node = inode.placement[layout.position(stripe.index, index)];
                            let batch = batches.entry(node).or_default();
                            batch.push((id, hash.to_vec()));
                            pending += 1;
                            if batch.len() >= IDS_PER_CHECK {
                                let batch = std::mem::take(batch);
                                pending -= batch.len();
                                self.check(node, batch, &mut pass).await?;
                            }
                            if pending >= IDS_PENDING {
                                self.check_all(&mut batches, &mut pass).await?;
                                pending = 0;
                            }
                        }
                    }
                    match stripes.last() {
                        Some(last) if more => from = last.index + 1,
                        _ => break,
                    }
                }
            }
        }
        self.check_all(&mut batches, &mut pass).await?;
        metrics::counter!(AUDIT_PASSES).increment(1);
        Ok(pass)
    }

    /// Send every node's batch.
    async fn check_all(
        &self,
        batches: &mut BTreeMap<u32, Vec<(ShardId, Vec<u8>)>>,
        pass: &mut AuditPass,
    ) -> Result<()> {
        for (node, batch) in std::mem::take(batches) {
            if !batch.is_empty() {
                self.check(node, batch, pass).await?;
            }
        }
        Ok(())
    }

    /// Ask `node` about `batch` (shards and the content hashes their records hold), mark what
    /// it says is missing or does not match, then wait so the pass keeps to its rate.
    async fn check(&self, node: u32, batch: Vec<(ShardId, Vec<u8>)>, pass: &mut AuditPass) -> Result<()> {
        let pace = Duration::from_secs_f64(batch.len() as f64 / self.rate as f64);
        let Some(addr) = self.cluster.registry().node(node).filter(|n| n.up).map(|n| n.addr) else {
            pass.skipped += batch.len() as u64;
            return Ok(());
        };
        let request = CheckShardsRequest {
            ids: batch.iter().map(|(id, _)| (*id).into()).collect(),
            verify: false,
            hashes: batch.iter().map(|(_, hash)| hash.clone()).collect(),
        };
        let answer = match self.channels.chunk(&addr) {
            Ok(mut client) => client.check_shards(request).await.map_err(CairnError::from),
            Err(e) => Err(e),
        };
        let results = match answer {
            Ok(reply) => reply.into_inner().results,
            Err(e) => {
                tracing::warn!(node, %addr, "content audit: the chunkserver did not answer: {e}");
                pass.skipped += batch.len() as u64;
                return Ok(());
            }
        };
        let asked: Vec<ShardId> = batch.iter().map(|(id, _)| *id).collect();
        let damaged: Vec<ShardId> = results
            .iter()
            .filter(|r| {
                r.state == ShardState::ShardMissing as i32 || r.state == ShardState::ShardCorrupt as i32
            })
            .inspect(|r| tracing::warn!(node, shard = ?r.id, "content audit: {}", r.error))
            .filter_map(|r| r.id.as_ref().map(ShardId::from))
            .filter(|id| asked.contains(id))
            .collect();
        pass.checked += results.len() as u64;
        metrics::counter!(AUDIT_SHARDS).increment(results.len() as u64);
        if !damaged.is_empty() {
            // Marked only while the shard is still the one asked about: on that node (a heal
            // may have moved it since the walk read the placement), and of the record's version
            // (`mark_damaged` compares them: a stripe rewritten meanwhile is left alone).
            let ns = self.ns.clone();
            let (marked, _) = blocking(move || {
                let on_node = |id: &ShardId| {
                    ns.find_inode(id.ino).ok().flatten().is_some_and(|inode| {
                        inode.placement.get(inode.layout().position(id.stripe, id.index)) == Some(&node)
                    })
                };
                let still: Vec<ShardId> = damaged.into_iter().filter(on_node).collect();
                ns.mark_damaged(&still)
            })
            .await?;
            pass.damaged += u64::from(marked);
            metrics::counter!(AUDIT_DAMAGED).increment(u64::from(marked));
        }
        tokio::time::sleep(pace).await;
        Ok(())
    }
}

/// Run `f` on the blocking pool (store scans, and a replicated change waits for its commit).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| CairnError::internal(format!("content audit: {e}")))?
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
