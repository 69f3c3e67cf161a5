//! The chunkserver's metrics, one constant each with the `cairn_` prefix, so the exporter,
//! dashboards and tests agree on them. Per-tier values are kept as counters in the store's
//! index (also reported in heartbeats and `Stat`) and published here with `tier` and `dir`
//! labels after every heartbeat. Request counts and latencies by RPC come from the shared gRPC
//! layer (`cairn_rpc_*`, `service="chunk"`).

use cairn_proto::TierUsage;

/// Shard reads served, per tier directory (counter).
pub const SHARD_READS: &str = "cairn_chunk_shard_reads_total";
/// Bytes returned by shard reads, per tier directory (counter).
pub const SHARD_READ_BYTES: &str = "cairn_chunk_shard_read_bytes_total";
/// Shards moved from HDD to SSD, counted on the SSD directory (counter).
pub const PROMOTIONS: &str = "cairn_chunk_promotions_total";
/// Shards moved from SSD to HDD, counted on the SSD directory (counter).
pub const DEMOTIONS: &str = "cairn_chunk_demotions_total";
/// Bytes of shard files per tier directory (gauge).
pub const TIER_USED_BYTES: &str = "cairn_chunk_tier_used_bytes";
/// Shard files per tier directory (gauge).
pub const TIER_SHARDS: &str = "cairn_chunk_tier_shards";
/// Capacity per tier directory, honoring `ssd_capacity` (gauge).
pub const TIER_CAPACITY_BYTES: &str = "cairn_chunk_tier_capacity_bytes";
/// Bytes still available to Cairn per tier directory (gauge).
pub const TIER_FREE_BYTES: &str = "cairn_chunk_tier_free_bytes";
/// Shards waiting for promotion: read often enough from HDD, not yet moved (gauge).
pub const MOVER_BACKLOG: &str = "cairn_chunk_mover_backlog_shards";
/// Shards and bytes the background scrub verified (counters), and the damaged shards it found
/// (counter).
pub const SCRUB_SHARDS: &str = "cairn_chunk_scrub_shards_total";
pub const SCRUB_BYTES: &str = "cairn_chunk_scrub_bytes_total";
pub const SCRUB_DAMAGED: &str = "cairn_chunk_scrub_damaged_total";

/// Flush batches and the shards they made durable (counters: their ratio is the mean batch
/// size), the time a batch took (histogram), the wait of a durable write or `SyncShards` for
/// its batch (histogram), batches with a failed fsync (counter), shards written and not yet on
/// disk (gauge).
pub const FLUSH_BATCHES: &str = "cairn_chunk_flush_batches_total";
pub const FLUSHED_SHARDS: &str = "cairn_chunk_flushed_shards_total";
pub const FLUSH_SECONDS: &str = "cairn_chunk_flush_seconds";
pub const FLUSH_WAIT_SECONDS: &str = "cairn_chunk_flush_wait_seconds";
pub const FLUSH_FAILURES: &str = "cairn_chunk_flush_failures_total";
pub const UNFLUSHED_SHARDS: &str = "cairn_chunk_unflushed_shards";

pub fn unflushed(shards: usize) {
    metrics::gauge!(UNFLUSHED_SHARDS).set(shards as f64);
}

/// Publish the per-directory values of `usage` (as the heartbeat reports them).
pub fn publish(usage: &[TierUsage], backlog: usize) {
    for t in usage {
        let labels = [("tier", t.name.clone()), ("dir", t.path.clone())];
        metrics::counter!(SHARD_READS, &labels).absolute(t.reads);
        metrics::counter!(SHARD_READ_BYTES, &labels).absolute(t.read_bytes);
        if t.name == "ssd" {
            metrics::counter!(PROMOTIONS, &labels).absolute(t.promotions);
            metrics::counter!(DEMOTIONS, &labels).absolute(t.demotions);
        }
        metrics::gauge!(TIER_USED_BYTES, &labels).set(t.used as f64);
        metrics::gauge!(TIER_SHARDS, &labels).set(t.shards as f64);
        metrics::gauge!(TIER_CAPACITY_BYTES, &labels).set(t.capacity as f64);
        metrics::gauge!(TIER_FREE_BYTES, &labels).set(t.free as f64);
    }
    metrics::gauge!(MOVER_BACKLOG).set(backlog as f64);
}
