//! Positional disk I/O behind one small trait, so the shard store does not care how bytes reach
//! the disk. [`IoEngine`] is dyn-compatible: the store holds an `Arc<dyn IoEngine>`, files travel
//! as `Arc<std::fs::File>` (the engine keeps the descriptor open until the operation completes,
//! even if the caller gives up) and each call returns a boxed future.
//!
//! Two implementations answer the same contract and run the same test suite (`tests.rs`):
//! [`UringEngine`] (io_uring on one dedicated thread; the default) and [`PreadEngine`]
//! (`pread`/`pwrite` on tokio's blocking pool, for kernels or sandboxes without io_uring).
//!
//! Contract: `read_at` returns up to `len` bytes and fewer only at end of file; `write_at`
//! writes all of `data` or fails; `fsync` is a full file-integrity sync. Errors are plain
//! `std::io::Error`s with the OS error preserved, so callers can tell ENOSPC from EIO.

use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::config::IoEngineKind;

mod pread;
mod uring;

#[cfg(test)]
mod tests;

pub use pread::PreadEngine;
pub use uring::UringEngine;

/// The future every engine operation returns.
pub type IoFuture<T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'static>>;

/// Positional file I/O for async callers.
pub trait IoEngine: Send + Sync + 'static {
    /// A short name for logs ("io_uring", "pread").
    fn name(&self) -> &'static str;

    /// Read up to `len` bytes at `offset`; fewer only when the file ends first.
    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>>;

    /// Write all of `data` at `offset`.
    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> IoFuture<()>;

    /// Flush the file's data and metadata to stable storage (works on directories too).
    fn fsync(&self, file: Arc<File>) -> IoFuture<()>;
}

/// Start the engine the configuration asks for. If io_uring cannot start (an old kernel, or a
/// container whose seccomp profile forbids it) the pread engine takes over, with a warning, so
/// a chunkserver still serves.
pub fn open(kind: IoEngineKind, queue_depth: u32) -> Arc<dyn IoEngine> {
    match kind {
        IoEngineKind::Pread => Arc::new(PreadEngine::new()),
        IoEngineKind::Uring => match UringEngine::new(queue_depth) {
            Ok(engine) => Arc::new(engine),
            Err(e) => {
                tracing::warn!(
                    "io_uring is not available ({e}); using the pread engine instead \
                     (set io_engine = \"pread\" to silence this)"
                );
                Arc::new(PreadEngine::new())
            }
        },
    }
}
