//! The vocabulary every Cairn component shares: ids, stripe geometry, the erasure codec, block
//! checksums and content hashes, the error taxonomy (with its one mapping to errno and to
//! gRPC), configuration, units, time and logging setup. How processes talk to each other (the
//! wire protocol, gRPC channels, TLS, roles, capabilities, leader following, the metrics
//! exporter) is `cairn-net`, above this crate.

pub mod checksum;
pub mod codec;
pub mod config;
pub mod content;
pub mod error;
pub mod ids;
pub mod layout;
pub mod space;
pub mod telemetry;
pub mod time;
pub mod units;

pub use error::{CairnError, ErrorKind, Result};
pub use ids::{InodeId, NodeId, ShardId, ROOT_INO};
pub use layout::Layout;

/// Longest name of one directory entry, in bytes (as Linux's NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Largest value of one extended attribute (as Linux's XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Longest extended attribute name (as Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Longest symlink target, in bytes (as Linux's PATH_MAX - 1 for the target string).
pub const SYMLINK_MAX: usize = 4095;
/// Largest gRPC message either side accepts (one shard of the largest unit plus framing).
pub const MAX_MESSAGE_BYTES: usize = 80 << 20;
