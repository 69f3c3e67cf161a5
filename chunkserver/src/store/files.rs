//! Shard files themselves: opening one for reading (from the kernel's caches when it can),
//! reading it the way its tier reads, verifying all of it, and putting a new one in place.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::checksum::{tree_root, BlockHash, BLOCK_SIZE};
use cairn_common::content::HASH_LEN;
use cairn_common::{CairnError, Result, ShardId};

use super::ShardStore;
use crate::engine::{drop_cached, IoEngine, IoFuture};
use crate::shard::{self, ShardHeader, HEADER_ALIGN};

/// Checksumming more than this many bytes moves to the blocking pool, off the async workers.
const INLINE_HASH_BYTES: usize = 1 << 20;
/// Bytes read and checked per step of a whole-file verification (whole checksum blocks).
const VERIFY_STEP: usize = 16 * BLOCK_SIZE;

/// An open shard file, and whether it was opened with O_DIRECT (its tier reads that way).
#[derive(Clone)]
pub(crate) struct ShardFile {
    pub(crate) file: Arc<std::fs::File>,
    pub(crate) direct: bool,
}

impl ShardFile {
    /// `len` bytes at `offset` (fewer at end of file), the way the file was opened. A buffered
    /// read that the page cache holds whole is copied out right here (`preadv2` with
    /// `RWF_NOWAIT`, which fails instead of waiting for the disk); anything else goes to the
    /// engine. A warm read then costs no hand-off to the engine's thread and back.
    pub(crate) fn read_at(&self, engine: &dyn IoEngine, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        if self.direct {
            return engine.read_at_direct(self.file.clone(), offset, len);
        }
        match read_cached(&self.file, offset, len) {
            Some(data) => Box::pin(std::future::ready(Ok(data))),
            None => engine.read_at(self.file.clone(), offset, len),
        }
    }

    /// Read the whole file and check that its header names `id`, its length is `expect_len`
    /// bytes (when given), every block matches its checksum and, when `content` is given (the
    /// content hash its stripe record holds), the data hashes to it; `Corrupt` when not.
    pub(crate) async fn verify(
        &self,
        engine: &dyn IoEngine,
        id: &ShardId,
        expect_len: Option<u64>,
        content: Option<[u8; HASH_LEN]>,
    ) -> Result<ShardHeader> {
        let io = |e: io::Error| CairnError::from_io(&format!("verify shard {id}"), &e);
        let mut head = self.read_at(engine, 0, HEADER_ALIGN).await.map_err(io)?;
        let header = shard::parse_header(&head, id)?;
        let file_len = header.header_len + header.data_len;
        let on_disk = self.file.metadata().map_err(io)?.len();
        if on_disk != file_len || expect_len.is_some_and(|want| want != file_len) {
            return Err(CairnError::corrupt(format!(
                "shard {id}: file has {on_disk} bytes, its header says {file_len}{}",
                expect_len.map(|l| format!(", the index {l}")).unwrap_or_default()
            )));
        }
        if head.len() < header.header_len as usize {
            head = self.read_at(engine, 0, header.header_len as usize).await.map_err(io)?;
        }
        let per_step = (VERIFY_STEP / BLOCK_SIZE) as u32;
        let mut block = 0u32;
        let mut hasher = content.map(|_| blake3::Hasher::new());
        while block < header.nblocks {
            let blocks = block..(block + per_step).min(header.nblocks);
            let hashes_at = header.hashes_range(&blocks);
            let hashes = head
                .get(hashes_at.start as usize..hashes_at.end as usize)
                .ok_or_else(|| CairnError::corrupt(format!("shard {id}: block hashes truncated")))?
                .to_vec();
            let data_at = header.data_range(&blocks);
            let data = self
                .read_at(engine, data_at.start, (data_at.end - data_at.start) as usize)
                .await
                .map_err(io)?;
            let range = blocks.clone();
            hasher = off_thread(data.len(), move || {
                header.verify(&range, &hashes, &data)?;
                if let Some(h) = hasher.as_mut() {
                    h.update(&data);
                }
                Ok::<_, CairnError>(hasher)
            })
            .await??;
            block = blocks.end;
        }
        if let (Some(h), Some(expected)) = (hasher, content) {
            if h.finalize().as_bytes() != &expected {
                return Err(CairnError::corrupt(format!(
                    "shard {id}: its data does not match the content hash its writer recorded"
                )));
            }
        }
        Ok(header)
    }

    /// Check that the shard's block values chain to `content` (the content hash its stripe
    /// record holds), from its header alone: no data is read. With the blocks checked against
    /// those values (the scrub, every read), that is the whole chain from the bytes to what
    /// their writer recorded. A format 1 shard (plain block hashes, from which the content hash
    /// cannot be derived) is verified whole instead.
    pub(crate) async fn check_content(
        &self,
        engine: &dyn IoEngine,
        id: &ShardId,
        expect_len: Option<u64>,
        content: [u8; HASH_LEN],
    ) -> Result<()> {
        let io = |e: io::Error| CairnError::from_io(&format!("check shard {id}"), &e);
        let head = self.read_at(engine, 0, HEADER_ALIGN).await.map_err(io)?;
        let header = shard::parse_header(&head, id)?;
        if header.format != shard::FORMAT_VERSION {
            return self.verify(engine, id, expect_len, Some(content)).await.map(|_| ());
        }
        let at = header.hashes_range(&(0..header.nblocks));
        let values = match head.get(at.start as usize..at.end as usize) {
            Some(values) => values.to_vec(),
            None => self.read_at(engine, at.start, (at.end - at.start) as usize).await.map_err(io)?,
        };
        let values: Vec<BlockHash> =
            values.chunks_exact(HASH_LEN).map(|c| c.try_into().expect("HASH_LEN bytes")).collect();
        if tree_root(&values, header.data_len) != Some(content) {
            return Err(CairnError::corrupt(format!(
                "shard {id}: its block checksums do not chain to the content hash its writer recorded"
            )));
        }
        Ok(())
    }
}

/// `len` bytes at `offset` of `file` if the page cache has all of them; `None` if any would
/// need the disk (or the kernel lacks `RWF_NOWAIT`).
fn read_cached(file: &std::fs::File, offset: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    // SAFETY: one iovec over the vector's own capacity; the kernel writes at most `len` bytes.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
    if n < 0 || n as usize != len {
        return None;
    }
    // SAFETY: the kernel initialised exactly `n` = `len` bytes.
    unsafe { buf.set_len(len) };
    Some(buf)
}

impl ShardStore {
    /// Open shard file `path` of directory `dir` for reading, with O_DIRECT where that tier
    /// reads that way: right here when the kernel can resolve the path from its caches (the
    /// usual case on a serving chunkserver), else on the blocking pool, so a lookup that has to
    /// read directory blocks never stalls a runtime thread. The fast path saves a hand-off to
    /// the blocking pool and back per read.
    pub(crate) async fn open_shard(&self, dir: usize, path: &Path) -> io::Result<ShardFile> {
        let direct = self.dirs[dir].direct;
        let flags = if direct { libc::O_DIRECT } else { 0 };
        if let Some(file) = open_cached(path, flags) {
            return Ok(ShardFile { file: Arc::new(file), direct });
        }
        let path = path.to_path_buf();
        let file = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)
        })
        .await
        .map_err(io::Error::other)??;
        Ok(ShardFile { file: Arc::new(file), direct })
    }

    /// After a shard file was written into directory `dir` (and synced): drop its pages from
    /// the page cache if that tier reads with O_DIRECT.
    pub(crate) fn written_to(&self, dir: usize, file: &std::fs::File) {
        if self.dirs[dir].direct {
            drop_cached(file);
        }
    }

    /// Put a new shard file in place through the engine: header and data written to `tmp`,
    /// renamed to `path`; on failure `tmp` is removed and `path` untouched. Making it durable
    /// is the flusher's.
    pub(crate) async fn create_file(
        &self,
        tmp: PathBuf,
        path: PathBuf,
        header: Vec<u8>,
        data: Bytes,
    ) -> Result<Arc<std::fs::File>> {
        let ctx = format!("write shard file {}", tmp.display());
        self.engine
            .create_file(tmp, path, vec![Bytes::from(header), data])
            .await
            .map_err(|e| CairnError::from_io(&ctx, &e))
    }

    pub(crate) async fn fsync_dir(&self, dir: &Path) -> Result<()> {
        let ctx = || format!("fsync directory {}", dir.display());
        let handle = tokio::fs::File::open(dir).await.map_err(|e| CairnError::from_io(&ctx(), &e))?;
        let handle = Arc::new(handle.into_std().await);
        self.engine.fsync(handle).await.map_err(|e| CairnError::from_io(&ctx(), &e))
    }
}

/// Open `path` read-only (with extra `flags`) only if every step of its lookup is in the
/// kernel's caches: `openat2` with `RESOLVE_CACHED` (Linux 5.12) fails with EAGAIN instead of
/// reading from disk. `None` when it would block, the kernel lacks the flag, or the open fails
/// (the caller's ordinary open then reports the real error).
fn open_cached(path: &Path, flags: i32) -> Option<std::fs::File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: open_how is plain data; zero is its documented default for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | flags) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: a NUL-terminated path and a live open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    (fd >= 0).then(|| unsafe { std::fs::File::from_raw_fd(fd as i32) })
}

/// Run CPU-heavy work (checksums) on the blocking pool when it covers more than a little data.
pub(crate) async fn off_thread<T: Send + 'static>(
    bytes: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    if bytes <= INLINE_HASH_BYTES {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CairnError::internal(format!("checksum task failed: {e}")))
}
