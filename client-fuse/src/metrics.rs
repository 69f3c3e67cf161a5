//! The client's metrics (Prometheus names, all `cairn_client_`), served by `cairn mount
//! --metrics ADDR`.

/// FUSE requests handled, by `op` (counter), and the time from the kernel's request to the
/// reply, by `op` (histogram, seconds).
pub const FUSE_OPS: &str = "cairn_client_fuse_ops_total";
pub const FUSE_SECONDS: &str = "cairn_client_fuse_op_seconds";
/// FUSE requests that could not be answered on the FUSE thread and went on as a runtime task
/// (they waited for a server or a lock), by `op` (counter).
pub const FUSE_DEFERRED: &str = "cairn_client_fuse_deferred_total";
/// Bytes returned to reads and accepted from writes (counters).
pub const READ_BYTES: &str = "cairn_client_read_bytes_total";
pub const WRITTEN_BYTES: &str = "cairn_client_written_bytes_total";
/// Stripe reads served by Reed–Solomon reconstruction instead of the data shards (counter).
pub const DEGRADED_READS: &str = "cairn_client_degraded_reads_total";
/// Shards that arrived but were not what their writer wrote (counter): a data shard whose
/// bytes do not match the content hash in its stripe record, or a shard of the wrong length.
/// Each is reported damaged and the stripe read by reconstruction from the others.
pub const CONTENT_MISMATCHES: &str = "cairn_client_content_mismatches_total";
/// Reads that waited past the hedge deadline and reconstructed around a slow node (counter).
pub const HEDGED_READS: &str = "cairn_client_hedged_reads_total";
/// Shard writes that failed or were skipped for a suspect node (counter); the stripe was
/// committed with the shard missing, for the repair to rebuild.
pub const SHARD_WRITE_FAILURES: &str = "cairn_client_shard_write_failures_total";
/// Whole-stripe fetches answered from the client's stripe cache, and those that went to the
/// chunkservers (counters).
pub const STRIPE_CACHE_HITS: &str = "cairn_client_stripe_cache_hits_total";
pub const STRIPE_CACHE_MISSES: &str = "cairn_client_stripe_cache_misses_total";
/// Bytes of whole stripes fetched for sequential readers and read-ahead (counter): about the
/// bytes they read; much more means stripes are fetched again or read ahead in vain.
pub const STRIPE_FETCHED_BYTES: &str = "cairn_client_stripe_fetched_bytes_total";
/// Sequential reads that reached a stripe read-ahead was still fetching, so the file's
/// read-ahead window grew (counter); bytes by which open files' windows have grown beyond their
/// base, mount-wide (gauge; bounded by 8 × `readahead_mib`).
pub const READAHEAD_STALLS: &str = "cairn_client_readahead_stalls_total";
pub const READAHEAD_BYTES: &str = "cairn_client_readahead_bytes";
/// Random reads answered from the client's block cache, and those that went to a chunkserver
/// (counters; one per shard range).
pub const BLOCK_CACHE_HITS: &str = "cairn_client_block_cache_hits_total";
pub const BLOCK_CACHE_MISSES: &str = "cairn_client_block_cache_misses_total";
/// Bytes held by the block cache (gauge).
pub const BLOCK_CACHE_BYTES: &str = "cairn_client_block_cache_bytes";
/// Write-back: commits of open files made in the background (not by close or fsync), the
/// valid bytes of the stripes they committed, and passes that left something uncommitted
/// because a stripe could not be stored or the commit failed (counters); the
/// age of the oldest change written to an open file and not yet committed, seconds (gauge;
/// what a crash of this client would lose).
pub const WRITE_BACK_COMMITS: &str = "cairn_client_write_back_commits_total";
pub const WRITE_BACK_BYTES: &str = "cairn_client_write_back_bytes_total";
pub const WRITE_BACK_FAILURES: &str = "cairn_client_write_back_failures_total";
pub const OLDEST_UNCOMMITTED: &str = "cairn_client_oldest_uncommitted_seconds";
/// Waits for chunkservers (`write_wait_ms`): operations that found fewer chunkservers
/// answering than a stripe needs and waited, and those whose wait ran out (they failed with
/// EIO), by `op` = create, write, read (counters); how long each wait lasted, by `op`
/// (histogram, seconds).
pub const NODE_WAITS: &str = "cairn_client_node_waits_total";
pub const NODE_WAIT_FAILURES: &str = "cairn_client_node_wait_failures_total";
pub const NODE_WAIT_SECONDS: &str = "cairn_client_node_wait_seconds";
