//! The metaserver's metrics (Prometheus names, all `cairn_meta_` or `cairn_repair_`), published
//! every few seconds from the namespace, the registry and the repair state. Request counts and
//! latencies come from the shared gRPC layer (`cairn_rpc_*`, `service="meta"`).

use std::sync::Arc;
use std::time::Duration;

use crate::namespace::Namespace;

/// Chunkservers by `state`: up, down, draining (gauge).
pub const NODES: &str = "cairn_meta_nodes";
/// Access rules in force (`access.rs`).
pub const ACCESS_RULES: &str = "cairn_meta_access_rules";
/// Re-reads of the access rules that found the file missing or invalid (the rules stayed).
pub const ACCESS_RELOAD_FAILURES: &str = "cairn_meta_access_reload_failures_total";
/// Regular files, directories, bytes of file data (gauges).
pub const FILES: &str = "cairn_meta_files";
pub const DIRECTORIES: &str = "cairn_meta_directories";
pub const LOGICAL_BYTES: &str = "cairn_meta_logical_bytes";
/// Raw capacity and free bytes of the up chunkservers (gauges).
pub const RAW_CAPACITY: &str = "cairn_meta_raw_capacity_bytes";
pub const RAW_FREE: &str = "cairn_meta_raw_free_bytes";
/// Shards waiting for deletion by the garbage collector (gauge).
pub const GC_PENDING: &str = "cairn_meta_gc_pending_shards";
/// Client sessions holding a lease (gauge).
pub const CLIENTS: &str = "cairn_meta_client_sessions";
/// The content audit (`audit.rs`): passes finished, data shards checked against their stripe
/// records' content hashes, and shards it marked damaged for the repair (counters).
pub const AUDIT_PASSES: &str = "cairn_meta_audit_passes_total";
pub const AUDIT_SHARDS: &str = "cairn_meta_audit_shards_total";
pub const AUDIT_DAMAGED: &str = "cairn_meta_audit_damaged_total";
/// Stripes with a shard lost or on a down node, as of the last repair pass (gauge).
pub const DEGRADED_STRIPES: &str = "cairn_repair_degraded_stripes";
/// Stripes by how many more shards each can lose before it is unreadable, by `can_lose`
/// ("0" … m), as of the last repair pass (gauge); and those of them below their layout's m,
/// i.e. that lost redundancy (gauge). Alert on the latter's `can_lose="0"` above zero.
pub const STRIPES_BY_MARGIN: &str = "cairn_repair_stripes";
pub const REDUCED_BY_MARGIN: &str = "cairn_repair_reduced_stripes";
/// Bytes of file data in stripes that can lose fewer shards than their layout's m (gauge).
pub const REDUCED_BYTES: &str = "cairn_repair_reduced_redundancy_bytes";
/// The cluster's health as `cairn status` prints it: 0 OK, 1 WARN, 2 ERR (gauge).
pub const HEALTH: &str = "cairn_health";
/// Bytes still to rebuild (gauge) and the last pass's rebuild rate (gauge, bytes/s).
pub const BYTES_TO_REBUILD: &str = "cairn_repair_bytes_to_rebuild";
pub const REBUILD_RATE: &str = "cairn_repair_rate_bytes_per_second";
/// Stripes with more than m shards gone (gauge).
pub const UNRECOVERABLE_STRIPES: &str = "cairn_repair_unrecoverable_stripes";
/// Shards and bytes rebuilt since start (counters).
pub const SHARDS_REBUILT: &str = "cairn_repair_shards_rebuilt_total";
pub const BYTES_REBUILT: &str = "cairn_repair_bytes_rebuilt_total";
/// Unreferenced shards deleted by reconciliation since start (counter).
pub const STALE_DELETED: &str = "cairn_repair_stale_shards_deleted_total";
/// Shards still placed on a draining node, by `node` (gauge).
pub const DRAIN_LEFT: &str = "cairn_repair_drain_shards_left";
/// RocksDB statistics by `property` (gauge): live_data_bytes, sst_bytes, memtable_bytes,
/// estimated_keys, pending_compaction_bytes, write_stopped (1 while writes are stopped),
/// delayed_write_rate (bytes/s while writes are slowed, else 0), background_wal_syncs,
/// durability_lost (1 once a WAL fsync failed: every change is refused until a restart).
pub const ROCKSDB: &str = "cairn_meta_rocksdb";

/// This replica's Raft state, published on every replica (leader or not) whenever it changes:
/// the current term; 1 while this replica leads; times the known leader changed since start
/// (counter); its last log index, applied index and their difference; the index of its last
/// snapshot; and for the leader, how far each member's log is behind its own, by `member`.
pub const RAFT_TERM: &str = "cairn_meta_raft_term";
/// Always 1, labelled with this replica's metadata `group`: joined on `instance` to tell the
/// groups' replicas apart (the alert for a group without a leader does).
pub const RAFT_GROUP: &str = "cairn_meta_raft_group";
pub const RAFT_IS_LEADER: &str = "cairn_meta_raft_is_leader";
pub const RAFT_LEADER_CHANGES: &str = "cairn_meta_raft_leader_changes_total";
pub const RAFT_LAST_LOG_INDEX: &str = "cairn_meta_raft_last_log_index";
pub const RAFT_APPLIED_INDEX: &str = "cairn_meta_raft_applied_index";
pub const RAFT_APPLY_LAG: &str = "cairn_meta_raft_apply_lag_entries";
pub const RAFT_SNAPSHOT_INDEX: &str = "cairn_meta_raft_snapshot_index";
pub const RAFT_MEMBER_LAG: &str = "cairn_meta_raft_member_lag_entries";
/// Milliseconds since a majority last acknowledged this leader (gauge; leader only, else -1).
pub const RAFT_QUORUM_ACK_AGE: &str = "cairn_meta_raft_quorum_ack_age_ms";
/// Time from proposing a change to its being applied on the leader (histogram, seconds), and
/// the changes that failed to commit (counter).
pub const RAFT_COMMIT_SECONDS: &str = "cairn_meta_raft_commit_seconds";
pub const RAFT_COMMIT_FAILURES: &str = "cairn_meta_raft_commit_failures_total";
/// What a commit is made of (histograms, seconds): a log append written and fsynced on this
/// replica (leader or follower; a commit waits for the leader's and then a follower's, one
/// after the other), and on the leader, an append carrying entries sent to a follower until its
/// answer, by `member` (the follower's fsync included). The Raft counterparts of etcd's WAL
/// fsync and peer round-trip times: a slow disk or a slow follower shows here first.
pub const RAFT_LOG_APPEND_SECONDS: &str = "cairn_meta_raft_log_append_seconds";
pub const RAFT_APPEND_RPC_SECONDS: &str = "cairn_meta_raft_append_rpc_seconds";
/// Log entries the leader proposed for namespace changes, and the changes they carried
/// (counters): changes proposed while earlier ones are committed share an entry
/// (`raft/proposals.rs`), so the second over the first is the changes per entry.
pub const RAFT_ENTRIES_PROPOSED: &str = "cairn_meta_raft_entries_proposed_total";
pub const RAFT_CHANGES_PROPOSED: &str = "cairn_meta_raft_changes_proposed_total";
/// Size in bytes of the last snapshot this replica built or installed (gauge), and how many it
/// built and installed since start (counters, by `how`: built, installed).
pub const RAFT_SNAPSHOT_BYTES: &str = "cairn_meta_raft_snapshot_bytes";
pub const RAFT_SNAPSHOTS: &str = "cairn_meta_raft_snapshots_total";

/// How many `can_lose` levels were published so far.
static PUBLISHED_LEVELS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Publish the gauges every `every` until the task is dropped.
pub async fn publish(ns: Arc<Namespace>, cluster: Arc<crate::cluster::Cluster>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let (ns, cluster) = (ns.clone(), cluster.clone());
        let _ = tokio::task::spawn_blocking(move || publish_once(&ns, &cluster)).await;
    }
}

/// Zero the gauges [`publish`] sets, for a replica that stopped leading: a former leader would
/// otherwise go on exporting its last values (stale counts, alerts that never clear) beside the
/// new leader's. Dashboards pick the leader with `cairn_meta_raft_is_leader`.
pub fn clear() {
    for name in [
        FILES,
        DIRECTORIES,
        LOGICAL_BYTES,
        RAW_CAPACITY,
        RAW_FREE,
        GC_PENDING,
        CLIENTS,
        DEGRADED_STRIPES,
        REDUCED_BYTES,
        HEALTH,
        BYTES_TO_REBUILD,
        REBUILD_RATE,
        UNRECOVERABLE_STRIPES,
    ] {
        metrics::gauge!(name).set(0.0);
    }
    for state in ["up", "down", "draining"] {
        metrics::gauge!(NODES, "state" => state).set(0.0);
    }
    for margin in 0..PUBLISHED_LEVELS.load(std::sync::atomic::Ordering::Relaxed) {
        metrics::gauge!(STRIPES_BY_MARGIN, "can_lose" => margin.to_string()).set(0.0);
        metrics::gauge!(REDUCED_BY_MARGIN, "can_lose" => margin.to_string()).set(0.0);
    }
}

fn publish_once(ns: &Namespace, cluster: &crate::cluster::Cluster) {
    let stats = ns.stats();
    metrics::gauge!(FILES).set(stats.files as f64);
    metrics::gauge!(DIRECTORIES).set(stats.directories as f64);
    metrics::gauge!(LOGICAL_BYTES).set(stats.logical_bytes as f64);
    let nodes = cluster.registry().nodes();
    let up = nodes.iter().filter(|n| n.up).count();
    let draining = nodes.iter().filter(|n| n.state == "draining").count();
    metrics::gauge!(NODES, "state" => "up").set(up as f64);
    metrics::gauge!(NODES, "state" => "down").set((nodes.len() - up) as f64);
    metrics::gauge!(NODES, "state" => "draining").set(draining as f64);
    let (capacity, free) = cluster.registry().capacity();
    metrics::gauge!(RAW_CAPACITY).set(capacity as f64);
    metrics::gauge!(RAW_FREE).set(free as f64);
    if let Ok(pending) = ns.pending_gc() {
        metrics::gauge!(GC_PENDING).set(pending as f64);
    }
    metrics::gauge!(CLIENTS).set(cluster.sessions().live_count() as f64);
    let repair = cluster.repair_state().lock().clone();
    metrics::gauge!(DEGRADED_STRIPES).set(repair.degraded_stripes as f64);
    // Every level up to the largest m seen since start, zeros included, so an alert sees 0
    // and not "no data" when all is well, and a level that emptied reads 0, not its last count.
    let root_levels = ns.getattr(cairn_common::ROOT_INO).map_or(0, |r| r.layout().m as usize + 1);
    let now = repair.by_margin.len().max(root_levels);
    let levels = PUBLISHED_LEVELS.fetch_max(now, std::sync::atomic::Ordering::Relaxed).max(now);
    for margin in 0..levels {
        let count = |v: &[u64]| v.get(margin).copied().unwrap_or(0) as f64;
        metrics::gauge!(STRIPES_BY_MARGIN, "can_lose" => margin.to_string()).set(count(&repair.by_margin));
        metrics::gauge!(REDUCED_BY_MARGIN, "can_lose" => margin.to_string())
            .set(count(&repair.reduced_by_margin));
    }
    metrics::gauge!(REDUCED_BYTES).set(repair.reduced_bytes as f64);
    let lost = ns.store().durability_lost();
    let cert = cairn_net::tls::identity().map_or(0, |id| id.cert.not_after);
    let health = crate::health::assess(
        &crate::service::nodes_with_progress(cluster),
        &repair,
        lost.as_deref(),
        &crate::health::metadata_problems(&**ns.store(), cluster),
        cert,
    );
    metrics::gauge!(HEALTH).set(health.level.gauge());
    metrics::gauge!(BYTES_TO_REBUILD).set(repair.bytes_to_rebuild as f64);
    metrics::gauge!(REBUILD_RATE).set(repair.rate as f64);
    metrics::gauge!(UNRECOVERABLE_STRIPES).set(repair.unrecoverable_stripes as f64);
    metrics::counter!(SHARDS_REBUILT).absolute(repair.shards_rebuilt);
    metrics::counter!(BYTES_REBUILT).absolute(repair.bytes_rebuilt);
    metrics::counter!(STALE_DELETED).absolute(repair.stale_shards_deleted);
    for (node, left) in &repair.drain_left {
        metrics::gauge!(DRAIN_LEFT, "node" => node.to_string()).set(*left as f64);
    }
    for (property, value) in ns.store().properties() {
        metrics::gauge!(ROCKSDB, "property" => property).set(value as f64);
    }
}
