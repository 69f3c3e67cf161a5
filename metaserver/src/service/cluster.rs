//! What the service tells about the cluster and checks with it: the status reply, the nodes
//! with their drain and rebuild progress, chunkservers of another cluster refused, files placed
//! on a node, and damage clients report confirmed with the chunkservers.

use cairn_common::content::HASH_LEN;
use cairn_common::{CairnError, Result};
use cairn_proto::{CheckShardsRequest, ClusterStatusReply, NodeInfo, ShardState};

use super::{MetaService, Serving};
use crate::cluster::Cluster;
use crate::namespace::Namespace;

/// Every node, with the drain progress of the last repair pass and, for a down node, when its
/// rebuild starts.
pub(crate) fn nodes_with_progress(cluster: &Cluster) -> Vec<NodeInfo> {
    let repair = cluster.repair_state().lock().clone();
    let mut nodes = cluster.registry().nodes();
    for n in &mut nodes {
        n.shards_left = repair.drain_left.get(&n.id).copied().unwrap_or(0);
        if !n.up {
            n.rebuild_in_ms = repair.rebuild_in(n.last_heartbeat_ms_ago).map(|d| d.as_millis() as u64);
        }
    }
    nodes
}

/// Refuse a chunkserver that belongs to another cluster (`theirs`; "" before it joined one),
/// before anything of it is recorded.
pub(super) fn check_cluster(serving: &Serving, theirs: &str, addr: &str) -> Result<()> {
    let ns = &serving.ns;
    if theirs.is_empty() || theirs == ns.cluster_id() {
        return Ok(());
    }
    tracing::error!(addr, theirs, ours = ns.cluster_id(), "refused a chunkserver of another cluster");
    Err(CairnError::invalid(format!(
        "the chunkserver at {addr} belongs to cluster {theirs}, and this metaserver serves cluster {}: \
         refused (a metaserver started on the wrong data directory? if this namespace is the right \
         one, e.g. restored from a backup older than cluster ids, remove `cluster` from the \
         chunkserver's state_dir and restart it)",
        ns.cluster_id()
    )))
}

impl MetaService {
    /// The shards of `ids` that the chunkserver holding each says are missing or corrupt
    /// (verified against their checksums and, for data shards, their content hashes). A shard whose chunkserver does not answer is left
    /// to the repair, which rebuilds what down nodes held.
    pub(super) async fn confirmed_damage(
        &self,
        ids: Vec<cairn_common::ShardId>,
    ) -> Result<Vec<cairn_common::ShardId>> {
        let mut by_node: std::collections::BTreeMap<u32, Vec<cairn_common::ShardId>> = Default::default();
        // Each data shard's content hash from its stripe record, so the chunkserver checks the
        // bytes against what was written, not only against its own checksums.
        let mut contents: std::collections::HashMap<cairn_common::ShardId, Vec<u8>> = Default::default();
        {
            let ns = self.ns()?;
            for id in ids {
                id.validate()?;
                let Ok(inode) = ns.getattr(id.ino) else { continue };
                let layout = inode.layout();
                if !inode.is_reg()
                    || id.index >= layout.width()
                    || inode.placement.len() != layout.width() as usize
                {
                    continue;
                }
                by_node.entry(inode.placement[layout.position(id.stripe, id.index)]).or_default().push(id);
                if let Some(record) = ns.stripe_record(id.ino, id.stripe)?.filter(|r| r.version == id.version)
                {
                    let at = id.index as usize * HASH_LEN;
                    if let Some(hash) = record.hashes.get(at..at + HASH_LEN) {
                        contents.insert(id, hash.to_vec());
                    }
                }
            }
        }
        let mut confirmed = Vec::new();
        for (node, ids) in by_node {
            let Some(addr) = self.cluster()?.registry().node(node).filter(|n| n.up).map(|n| n.addr) else {
                continue;
            };
            let request = CheckShardsRequest {
                ids: ids.iter().map(|&id| id.into()).collect(),
                verify: true,
                hashes: ids.iter().map(|id| contents.get(id).cloned().unwrap_or_default()).collect(),
            };
            let checked = match self.channels.chunk(&addr) {
                Ok(mut c) => c.check_shards(request).await.map_err(CairnError::from),
                Err(e) => Err(e),
            };
            match checked {
                Ok(reply) => confirmed.extend(
                    reply
                        .into_inner()
                        .results
                        .iter()
                        .filter(|r| {
                            r.state == ShardState::ShardMissing as i32
                                || r.state == ShardState::ShardCorrupt as i32
                        })
                        .filter_map(|r| r.id.as_ref().map(cairn_common::ShardId::from))
                        .filter(|id| ids.contains(id)),
                ),
                Err(e) => tracing::warn!(node, "could not confirm reported damage with its chunkserver: {e}"),
            }
        }
        Ok(confirmed)
    }
}

pub(super) fn status_reply(serving: &Serving) -> Result<ClusterStatusReply> {
    let (ns, cluster) = (&serving.ns, &serving.cluster);
    let stats = ns.stats();
    let root = ns.getattr(cairn_common::ROOT_INO)?.layout();
    // The cluster's: this group's and each other group's as its leader last said.
    let mut repair = cluster.repair_state().lock().clone();
    for (_, other) in cluster.groups().repairs()? {
        if let Some(other) = other {
            repair.add(&other);
        }
    }
    let nodes = nodes_with_progress(cluster);
    let meta_cert_not_after = cairn_net::tls::identity().map_or(0, |id| id.cert.not_after);
    let health = crate::health::assess(
        &nodes,
        &repair,
        ns.store().durability_lost().as_deref(),
        &crate::health::metadata_problems(&**ns.store(), cluster),
        meta_cert_not_after,
    );
    Ok(ClusterStatusReply {
        nodes,
        files: stats.files.max(0) as u64,
        directories: stats.directories.max(0) as u64,
        logical_bytes: stats.logical_bytes.max(0) as u64,
        default_layout: Some(root.into()),
        pending_gc: ns.pending_gc()?,
        degraded_stripes: repair.degraded_stripes,
        bytes_to_rebuild: repair.bytes_to_rebuild,
        unrecoverable_stripes: repair.unrecoverable_stripes,
        unrecoverable_files: repair.unrecoverable_files,
        shards_rebuilt: repair.shards_rebuilt,
        bytes_rebuilt: repair.bytes_rebuilt,
        rebuild_rate: repair.rate,
        stale_shards_deleted: repair.stale_shards_deleted,
        requests: cairn_net::metrics::foreground_requests(),
        health: health.level.name().into(),
        health_checks: health.checks,
        stripes_by_margin: repair.by_margin,
        reduced_redundancy_bytes: repair.reduced_bytes,
        reduced_stripes_by_margin: repair.reduced_by_margin,
        cluster_id: ns.cluster_id().to_string(),
        meta_cert_not_after,
        // Filled by the service, which holds the rules.
        access_rules: Vec::new(),
    })
}

/// Files whose placement names `node`.
fn files_on(ns: &Namespace, node: u32) -> Result<u64> {
    let mut count = 0;
    let mut after = 0;
    loop {
        let page = ns.inodes_after(after, 4096)?;
        let Some(last) = page.last() else { return Ok(count) };
        after = last.ino;
        count += page.iter().filter(|inode| inode.placement.contains(&node)).count() as u64;
    }
}

/// Remove chunkserver `node` from the registry; unless `force`, only once no file's placement
/// names it (drained).
pub(super) fn remove_node(serving: &Serving, node: u32, force: bool) -> Result<()> {
    let (ns, cluster) = (&serving.ns, &serving.cluster);
    let info = cluster
        .registry()
        .nodes()
        .into_iter()
        .find(|n| n.id == node)
        .ok_or_else(|| CairnError::not_found(format!("no chunkserver with id {node}")))?;
    if !force {
        // This group's files, and each other group's as its repair last counted them.
        let mut files = files_on(ns, node)?;
        for (group, report) in cluster.groups().repairs()? {
            let Some(report) = report else {
                return Err(CairnError::unavailable(format!(
                    "metadata group {group} has not said yet which of its files chunkserver {node} holds \
                     shards of (its leader reports every 5 s): try again, or --force"
                )));
            };
            files += report.files_by_node.get(&node).copied().unwrap_or(0);
        }
        if files > 0 {
            return Err(CairnError::new(
                cairn_common::ErrorKind::NotEmpty,
                format!(
                    "chunkserver {node} ({}) still holds shards of {files} files: drain it first \
                     (cairn node drain {node}), or --force to remove it now and let the repair \
                     rebuild its shards from the others",
                    info.addr
                ),
            ));
        }
    }
    cluster.registry().remove(node)
}
