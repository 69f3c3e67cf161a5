//! The Cairn client: everything a mount needs except FUSE itself lives in [`Client`]
//! (namespace calls to the metaserver, striping and Reed–Solomon coding of file data, shard
//! I/O to chunkservers, degraded reads). [`fuse`] adapts it to the kernel: thin callbacks that
//! hand each request to a tokio task and reply from there, so no request waits behind another.

mod background;
mod blocks;
pub mod caller;
mod client;
mod dir;
#[cfg(test)]
mod fakes;
mod file;
pub mod fuse;
mod meta;
pub mod metrics;
mod nodes;
mod readahead;
mod stripe;
mod stripe_cache;

pub use client::{
    default_block_cache_mib, Client, ClientOptions, Durability, OpenOutcome, DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_WRITE_WAIT_MS,
};
pub use fuse::{mount, MountOptions};
pub use meta::{connect_meta, connect_meta_with_timeout, MetaConn, Transport};
pub use readahead::DEFAULT_READAHEAD_MIB;
