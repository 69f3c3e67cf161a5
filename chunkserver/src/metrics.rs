//! Names of the chunkserver's metrics, one constant each with the `cairn_` prefix, so the
//! exporter, dashboards and tests agree on them. Values are kept today as counters in the
//! store's index and reported per tier directory in `TierUsage` (heartbeats and `Stat`); an
//! exporter publishes them under these names with `tier` and `dir` labels.

/// Shard reads served, per tier directory (counter).
pub const SHARD_READS: &str = "cairn_chunk_shard_reads_total";
/// Bytes returned by shard reads, per tier directory (counter).
pub const SHARD_READ_BYTES: &str = "cairn_chunk_shard_read_bytes_total";
/// Shards moved from HDD to SSD (counter).
pub const PROMOTIONS: &str = "cairn_chunk_promotions_total";
/// Shards moved from SSD to HDD (counter).
pub const DEMOTIONS: &str = "cairn_chunk_demotions_total";
/// Bytes copied between tiers by the mover and by warmup (counter).
pub const MOVED_BYTES: &str = "cairn_chunk_moved_bytes_total";
/// Bytes of shard files per tier directory (gauge).
pub const TIER_USED_BYTES: &str = "cairn_chunk_tier_used_bytes";
/// Capacity per tier directory, honoring `ssd_capacity` (gauge).
pub const TIER_CAPACITY_BYTES: &str = "cairn_chunk_tier_capacity_bytes";
/// Shards waiting for promotion: read often enough from HDD, not yet moved (gauge).
pub const MOVER_BACKLOG: &str = "cairn_chunk_mover_backlog_shards";
