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
//! `read_at_direct` is `read_at` for files opened with `O_DIRECT` (tiers configured with
//! `ssd_direct_io`/`hdd_direct_io`): the caller asks for any range; the engine reads the
//! [`DIRECT_ALIGN`]-aligned range around it into an aligned buffer and returns the bytes asked
//! for, so such reads bypass the page cache.

use std::alloc::{self, Layout};
use std::fs::File;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::ptr::NonNull;
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

    /// `read_at` on a file opened with `O_DIRECT`; `offset` and `len` need no alignment.
    fn read_at_direct(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>>;

    /// Write all of `data` at `offset`.
    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> IoFuture<()>;

    /// Flush the file's data and metadata to stable storage (works on directories too).
    fn fsync(&self, file: Arc<File>) -> IoFuture<()>;

    /// Create the new file `tmp` (it must not exist), write `parts` one after another, rename
    /// it to `path` (replacing what is there) and return it open; on failure `tmp` is removed
    /// and `path` is untouched. Nothing is synced: making it durable is the caller's.
    ///
    /// Both engines do this in one task on tokio's blocking pool: one hand-off where ring
    /// operations (open, a write per part, rename) would each wake a thread, which is what a
    /// small shard write's rate depends on (`bench/rpcs.sh` 4 KiB file writes).
    fn create_file(&self, tmp: PathBuf, path: PathBuf, parts: Vec<Bytes>) -> IoFuture<Arc<File>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || create_in_place(&tmp, &path, &parts))
                .await
                .map_err(io::Error::other)?
        })
    }
}

/// [`IoEngine::create_file`], blocking. Only a file this call created is removed on failure.
fn create_in_place(tmp: &Path, path: &Path, parts: &[Bytes]) -> io::Result<Arc<File>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(tmp)?;
    let written =
        parts.iter().try_for_each(|part| file.write_all(part)).and_then(|()| std::fs::rename(tmp, path));
    if let Err(e) = written {
        if let Err(rm) = std::fs::remove_file(tmp) {
            tracing::warn!(path = %tmp.display(), "cannot remove a partial file: {rm}");
        }
        return Err(e);
    }
    Ok(Arc::new(file))
}

/// Start the engine the configuration asks for. If io_uring cannot start (an old kernel, or a
/// container whose seccomp profile forbids it) the pread engine takes over, with a warning, so
/// a chunkserver still serves.
///
/// `fixed_buffers`: buffers the io_uring engine registers with its ring for `O_DIRECT` reads
/// (0 when no tier reads with `O_DIRECT`; see [`UringEngine::with_fixed_buffers`]).
pub fn open(kind: IoEngineKind, queue_depth: u32, fixed_buffers: usize) -> Arc<dyn IoEngine> {
    match kind {
        IoEngineKind::Pread => Arc::new(PreadEngine::new()),
        IoEngineKind::Uring => match UringEngine::with_fixed_buffers(queue_depth, fixed_buffers) {
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

/// The alignment `O_DIRECT` reads get of their offset, length and buffer: the page size, a
/// multiple of every logical block size Linux filesystems use.
pub const DIRECT_ALIGN: usize = 4096;

/// The aligned range `(start, len)` that covers `len` bytes at `offset`.
pub(crate) fn aligned_span(offset: u64, len: usize) -> (u64, usize) {
    let align = DIRECT_ALIGN as u64;
    let start = offset / align * align;
    let end = (offset + len as u64).div_ceil(align) * align;
    (start, (end - start) as usize)
}

/// A zeroed heap buffer aligned to [`DIRECT_ALIGN`] for `O_DIRECT` reads, filled from the front.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    filled: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(cap: usize) -> AlignedBuf {
        let layout = Self::layout(cap);
        // SAFETY: the layout has a non-zero size (at least one alignment unit).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, cap, filled: 0 }
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap.max(DIRECT_ALIGN), DIRECT_ALIGN).expect("aligned buffer layout")
    }

    /// The start of the allocation (for registering it with a ring).
    pub(crate) fn base_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes still to fill.
    pub(crate) fn spare(&self) -> usize {
        self.cap - self.filled
    }

    /// Where the next read goes: aligned whenever every read so far returned whole blocks.
    pub(crate) fn spare_ptr(&mut self) -> *mut u8 {
        // SAFETY: `filled <= cap`, inside the allocation.
        unsafe { self.ptr.as_ptr().add(self.filled) }
    }

    /// The unfilled part, for readers that want a slice (it is zeroed, so initialised).
    pub(crate) fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds `cap` initialised bytes; `filled..cap` is ours to hand out.
        unsafe { std::slice::from_raw_parts_mut(self.spare_ptr(), self.spare()) }
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.cap);
    }

    pub(crate) fn filled(&self) -> usize {
        self.filled
    }

    /// The `len` bytes at file offset `offset` out of this buffer, which holds the file from
    /// `start`; fewer when the file ended first.
    pub(crate) fn cut(&self, start: u64, offset: u64, len: usize) -> Vec<u8> {
        // SAFETY: `0..filled` is initialised and inside the allocation.
        let data = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) };
        cut(data, start, offset, len)
    }
}

/// The `len` bytes at file offset `offset` out of `data`, read from file offset `start`; fewer
/// when the read ended first.
pub(crate) fn cut(data: &[u8], start: u64, offset: u64, len: usize) -> Vec<u8> {
    let from = ((offset - start) as usize).min(data.len());
    let to = (from + len).min(data.len());
    data[from..to].to_vec()
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) };
    }
}

/// Ask the kernel to drop a file's cached pages (after a shard was written to a tier that
/// reads with `O_DIRECT`, so writes do not fill the page cache either). Advice only: dirty
/// pages stay until written back.
pub fn drop_cached(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on a descriptor we hold; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        tracing::debug!("posix_fadvise(DONTNEED) failed: {}", io::Error::from_raw_os_error(rc));
    }
}
