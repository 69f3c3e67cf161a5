//! The shard store: shard files in tier directories, with an in-memory index of where each
//! shard lives and how many bytes each directory holds.
//!
//! Layout: `{dir}/shards/{bucket}/{file_name}` where both names come from a validated numeric
//! [`ShardId`] (`bucket()`, `file_name()`), never from a string a client sent, so no request can
//! reach outside the data directories. Every public method validates the ids it is given.
//!
//! Invariants:
//! - A shard file appears under its final name only complete: it is written to
//!   `{final}.tmp-{random}`, fsynced (with `sync`), renamed over the final name and the bucket
//!   directory fsynced. Leftover `*.tmp*` files are partial writes and are removed at open.
//! - The index holds exactly the shard files of the directories, one location per id, and the
//!   per-directory usage (file bytes including headers, shard count) is the sum over the index.
//!   Rewriting an existing id (an idempotent retry) replaces its file and its accounting.
//! - New shards go to SSD directories (rotating, skipping full ones) and only fall back to HDD
//!   directories when no SSD directory has room; "room" is `statvfs` free space above
//!   `reserve_bytes`.
//! - Reads verify the header and every block they return; a checksum mismatch is an
//!   `ErrorKind::Corrupt` error, never data.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::config::ChunkConfig;
use cairn_common::{CairnError, Result, ShardId};
use parking_lot::Mutex;

use crate::engine::IoEngine;
use crate::shard::{self, HEADER_ALIGN, MAX_SHARD_BYTES};

/// Checksumming more than this many bytes moves to the blocking pool, off the async workers.
const INLINE_HASH_BYTES: usize = 1 << 20;

/// A storage tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Ssd,
    Hdd,
}

impl Tier {
    /// The name used on the wire and in `cairn df`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Ssd => "ssd",
            Tier::Hdd => "hdd",
        }
    }
}

/// What the store needs from the configuration.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub ssd_dirs: Vec<PathBuf>,
    pub hdd_dirs: Vec<PathBuf>,
    /// fsync shard files and their directories before a write returns.
    pub sync: bool,
    /// Bytes left free on each directory's filesystem.
    pub reserve_bytes: u64,
}

impl StoreOptions {
    pub fn from_config(config: &ChunkConfig) -> StoreOptions {
        StoreOptions {
            ssd_dirs: config.ssd_dirs.clone(),
            hdd_dirs: config.hdd_dirs.clone(),
            sync: config.sync,
            reserve_bytes: config.reserve_bytes,
        }
    }
}

/// One configured data directory.
#[derive(Debug)]
struct TierDir {
    tier: Tier,
    /// The directory as configured (what `statvfs` and `cairn df` look at).
    root: PathBuf,
    /// `{root}/shards`, parent of the 256 bucket directories.
    shards: PathBuf,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DirUsage {
    bytes: u64,
    shards: u64,
}

#[derive(Clone, Copy, Debug)]
struct Location {
    dir: usize,
    /// Bytes of the whole file, header included.
    file_len: u64,
}

#[derive(Debug, Default)]
struct Index {
    shards: HashMap<ShardId, Location>,
    usage: Vec<DirUsage>,
}

impl Index {
    fn insert(&mut self, id: ShardId, loc: Location) -> Option<Location> {
        let old = self.shards.insert(id, loc);
        if let Some(old) = old {
            self.forget(old);
        }
        let u = &mut self.usage[loc.dir];
        u.bytes += loc.file_len;
        u.shards += 1;
        old
    }

    fn remove(&mut self, id: &ShardId) -> Option<Location> {
        let old = self.shards.remove(id)?;
        self.forget(old);
        Some(old)
    }

    fn forget(&mut self, loc: Location) {
        let u = &mut self.usage[loc.dir];
        u.bytes = u.bytes.saturating_sub(loc.file_len);
        u.shards = u.shards.saturating_sub(1);
    }
}

/// Shard files on SSD and HDD directories, read and written through an [`IoEngine`].
pub struct ShardStore {
    engine: Arc<dyn IoEngine>,
    dirs: Vec<TierDir>,
    index: Mutex<Index>,
    sync: bool,
    reserve_bytes: u64,
    next_ssd: AtomicUsize,
    next_hdd: AtomicUsize,
}

impl ShardStore {
    /// Create the directory structure where missing, remove partial writes and index every
    /// shard file found.
    pub async fn open(options: StoreOptions, engine: Arc<dyn IoEngine>) -> Result<ShardStore> {
        let dirs: Vec<TierDir> = (options.ssd_dirs.iter().map(|d| (Tier::Ssd, d)))
            .chain(options.hdd_dirs.iter().map(|d| (Tier::Hdd, d)))
            .map(|(tier, root)| TierDir { tier, root: root.clone(), shards: root.join("shards") })
            .collect();
        if dirs.is_empty() {
            return Err(CairnError::invalid("the chunkserver needs at least one ssd or hdd directory"));
        }
        let (dirs, index) = tokio::task::spawn_blocking(move || scan(&dirs).map(|index| (dirs, index)))
            .await
            .map_err(|e| CairnError::internal(format!("shard scan task failed: {e}")))??;
        for (dir, usage) in dirs.iter().zip(&index.usage) {
            tracing::info!(
                tier = dir.tier.as_str(),
                dir = %dir.root.display(),
                shards = usage.shards,
                bytes = usage.bytes,
                "shard directory opened"
            );
        }
        Ok(ShardStore {
            engine,
            dirs,
            index: Mutex::new(index),
            sync: options.sync,
            reserve_bytes: options.reserve_bytes,
            next_ssd: AtomicUsize::new(0),
            next_hdd: AtomicUsize::new(0),
        })
    }

    /// The I/O engine's name, for logs.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    fn path(&self, dir: usize, id: &ShardId) -> PathBuf {
        self.dirs[dir].shards.join(id.bucket()).join(id.file_name())
    }

    /// Where shard `id` is stored, if it is.
    pub fn shard_path(&self, id: &ShardId) -> Option<PathBuf> {
        let loc = self.index.lock().shards.get(id).copied()?;
        Some(self.path(loc.dir, id))
    }

    /// Bytes free for shards in directory `dir`: free space above the reserve.
    fn room(&self, dir: usize) -> io::Result<u64> {
        Ok(disk_space(&self.dirs[dir].root)?.available.saturating_sub(self.reserve_bytes))
    }

    /// Choose the directory for a new file of `need` bytes: the shard's current directory if
    /// it is being rewritten, then SSD directories in rotation, then HDD directories.
    fn pick_dir(&self, id: &ShardId, need: u64, current: Option<usize>) -> Result<usize> {
        let rotated = |tier: Tier, next: &AtomicUsize| -> Vec<usize> {
            let of_tier: Vec<usize> = (0..self.dirs.len()).filter(|&d| self.dirs[d].tier == tier).collect();
            if of_tier.is_empty() {
                return of_tier;
            }
            let start = next.fetch_add(1, Ordering::Relaxed) % of_tier.len();
            of_tier[start..].iter().chain(&of_tier[..start]).copied().collect()
        };
        let candidates = current
            .into_iter()
            .chain(rotated(Tier::Ssd, &self.next_ssd))
            .chain(rotated(Tier::Hdd, &self.next_hdd));
        let mut report = Vec::new();
        for dir in candidates {
            match self.room(dir) {
                Ok(room) if room >= need => return Ok(dir),
                Ok(room) => report.push(format!(
                    "{} {} has {room} bytes free above the reserve",
                    self.dirs[dir].tier.as_str(),
                    self.dirs[dir].root.display()
                )),
                Err(e) => {
                    tracing::warn!(dir = %self.dirs[dir].root.display(), "statvfs failed: {e}");
                    report.push(format!("{}: statvfs failed: {e}", self.dirs[dir].root.display()));
                }
            }
        }
        report.dedup();
        Err(CairnError::new(
            cairn_common::ErrorKind::NoSpace,
            format!(
                "no room for shard {id} ({need} bytes, reserve_bytes = {}): {}",
                self.reserve_bytes,
                report.join("; ")
            ),
        ))
    }

    /// Store `data` as shard `id` (replacing any previous copy) and name the tier it went to.
    pub async fn write(&self, id: ShardId, data: Bytes) -> Result<Tier> {
        id.validate()?;
        if data.len() > MAX_SHARD_BYTES {
            return Err(CairnError::invalid(format!(
                "shard {id} has {} bytes, more than the {MAX_SHARD_BYTES} a shard may hold",
                data.len()
            )));
        }
        let header = {
            let data = data.clone();
            off_thread(data.len(), move || shard::encode_header(&id, &data)).await?
        };
        let file_len = (header.len() + data.len()) as u64;
        let current = self.index.lock().shards.get(&id).map(|loc| loc.dir);
        let dir = self.pick_dir(&id, file_len, current)?;
        let path = self.path(dir, &id);
        let tmp = path.with_file_name(format!("{}.tmp-{:016x}", id.file_name(), rand::random::<u64>()));

        let written = self.write_file(&tmp, Bytes::from(header), data).await;
        let renamed = match written {
            Ok(()) => tokio::fs::rename(&tmp, &path)
                .await
                .map_err(|e| CairnError::from_io(&format!("rename {} into place", tmp.display()), &e)),
            Err(e) => Err(e),
        };
        if let Err(e) = renamed {
            if let Err(rm) = tokio::fs::remove_file(&tmp).await {
                if rm.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %tmp.display(), "cannot remove partial shard file: {rm}");
                }
            }
            return Err(e);
        }
        if self.sync {
            let bucket = path.parent().unwrap_or(&self.dirs[dir].shards);
            self.fsync_dir(bucket).await?;
        }

        let old = self.index.lock().insert(id, Location { dir, file_len });
        if let Some(old) = old.filter(|old| old.dir != dir) {
            // The previous copy lived in another directory: remove it, or it would come back at
            // the next open as a duplicate.
            let old_path = self.path(old.dir, &id);
            if let Err(e) = tokio::fs::remove_file(&old_path).await {
                tracing::warn!(path = %old_path.display(), "cannot remove replaced shard file: {e}");
            }
        }
        Ok(self.dirs[dir].tier)
    }

    async fn write_file(&self, tmp: &Path, header: Bytes, data: Bytes) -> Result<()> {
        let ctx = || format!("write shard file {}", tmp.display());
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(tmp)
            .await
            .map_err(|e| CairnError::from_io(&ctx(), &e))?;
        let file = Arc::new(file.into_std().await);
        let data_at = header.len() as u64;
        tokio::try_join!(
            self.engine.write_at(file.clone(), 0, header),
            self.engine.write_at(file.clone(), data_at, data)
        )
        .map_err(|e| CairnError::from_io(&ctx(), &e))?;
        if self.sync {
            self.engine
                .fsync(file)
                .await
                .map_err(|e| CairnError::from_io(&format!("fsync {}", tmp.display()), &e))?;
        }
        Ok(())
    }

    async fn fsync_dir(&self, dir: &Path) -> Result<()> {
        let ctx = || format!("fsync directory {}", dir.display());
        let handle = tokio::fs::File::open(dir).await.map_err(|e| CairnError::from_io(&ctx(), &e))?;
        let handle = Arc::new(handle.into_std().await);
        self.engine.fsync(handle).await.map_err(|e| CairnError::from_io(&ctx(), &e))
    }

    /// Read `len` bytes (0: to the end) at `offset` of shard `id`, clipped at its end, every
    /// byte verified. Returns the bytes and the shard's data length.
    pub async fn read(&self, id: ShardId, offset: u64, len: u64) -> Result<(Bytes, u64)> {
        id.validate()?;
        let loc = self.index.lock().shards.get(&id).copied();
        let Some(loc) = loc else {
            return Err(CairnError::not_found(format!("shard {id} is not on this chunkserver")));
        };
        let path = self.path(loc.dir, &id);
        let io_err =
            |what: &str, e: io::Error| CairnError::from_io(&format!("{what} {}", path.display()), &e);
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => Arc::new(f.into_std().await),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CairnError::not_found(format!(
                    "shard {id} is not on this chunkserver (file gone)"
                )));
            }
            Err(e) => return Err(io_err("open shard file", e)),
        };
        let prefix =
            self.engine.read_at(file.clone(), 0, HEADER_ALIGN).await.map_err(|e| io_err("read", e))?;
        let header = shard::parse_header(&prefix, &id).map_err(|e| corrupt(&path, e))?;
        let data_len = header.data_len;
        if offset > data_len {
            return Err(CairnError::invalid(format!(
                "offset {offset} is past the end of shard {id} ({data_len} bytes)"
            )));
        }
        let end = if len == 0 { data_len } else { offset.saturating_add(len).min(data_len) };
        if offset == end {
            return Ok((Bytes::new(), data_len));
        }
        let blocks = header.blocks_for(offset, end);
        let hashes_at = header.hashes_range(&blocks);
        let hashes = if hashes_at.end <= prefix.len() as u64 {
            prefix[hashes_at.start as usize..hashes_at.end as usize].to_vec()
        } else {
            let n = (hashes_at.end - hashes_at.start) as usize;
            self.engine.read_at(file.clone(), hashes_at.start, n).await.map_err(|e| io_err("read", e))?
        };
        let data_at = header.data_range(&blocks);
        let data = self
            .engine
            .read_at(file, data_at.start, (data_at.end - data_at.start) as usize)
            .await
            .map_err(|e| io_err("read", e))?;
        let (verified, data) = {
            let blocks = blocks.clone();
            off_thread(data.len(), move || (header.verify(&blocks, &hashes, &data), data)).await?
        };
        verified.map_err(|e| corrupt(&path, e))?;
        let first = blocks.start as u64 * BLOCK_SIZE as u64;
        Ok((Bytes::from(data).slice((offset - first) as usize..(end - first) as usize), data_len))
    }

    /// Delete shards; returns how many existed. Missing ids are not errors.
    pub async fn delete(&self, ids: &[ShardId]) -> Result<u32> {
        for id in ids {
            id.validate()?;
        }
        let mut deleted = 0;
        for id in ids {
            let Some(loc) = self.index.lock().remove(id) else { continue };
            let path = self.path(loc.dir, id);
            match tokio::fs::remove_file(&path).await {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    // The file is still there: keep it indexed so usage stays true.
                    self.index.lock().insert(*id, loc);
                    return Err(CairnError::from_io(&format!("delete {}", path.display()), &e));
                }
            }
        }
        Ok(deleted)
    }

    /// Capacity and usage of every directory, SSD first.
    pub fn usage(&self) -> Vec<cairn_proto::TierUsage> {
        let usage = self.index.lock().usage.clone();
        self.dirs
            .iter()
            .zip(usage)
            .map(|(dir, used)| {
                let space = disk_space(&dir.root).unwrap_or_else(|e| {
                    tracing::warn!(dir = %dir.root.display(), "statvfs failed: {e}");
                    DiskSpace::default()
                });
                cairn_proto::TierUsage {
                    name: dir.tier.as_str().into(),
                    path: dir.root.display().to_string(),
                    capacity: space.capacity,
                    free: space.available.saturating_sub(self.reserve_bytes),
                    used: used.bytes,
                    shards: used.shards,
                }
            })
            .collect()
    }
}

/// Log a corrupt shard with its path and pass the error on.
fn corrupt(path: &Path, e: CairnError) -> CairnError {
    tracing::error!(path = %path.display(), "corrupt shard: {}", e.message());
    e
}

/// Run CPU-heavy work (checksums) on the blocking pool when it covers more than a little data.
async fn off_thread<T: Send + 'static>(bytes: usize, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    if bytes <= INLINE_HASH_BYTES {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CairnError::internal(format!("checksum task failed: {e}")))
}

#[derive(Clone, Copy, Debug, Default)]
struct DiskSpace {
    capacity: u64,
    /// Bytes an unprivileged writer may still use (`f_bavail`).
    available: u64,
}

// The statvfs field types differ between platforms (u32 or u64), hence the casts.
#[allow(clippy::unnecessary_cast)]
fn disk_space(path: &Path) -> io::Result<DiskSpace> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut st = MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated string and `st` points to writable memory of the
    // right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so the struct is initialised (and it was zeroed before).
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize as u64;
    Ok(DiskSpace {
        capacity: (st.f_blocks as u64).saturating_mul(frsize),
        available: (st.f_bavail as u64).saturating_mul(frsize),
    })
}

/// Create the bucket directories and index the shard files of every directory.
fn scan(dirs: &[TierDir]) -> Result<Index> {
    let mut index = Index { shards: HashMap::new(), usage: vec![DirUsage::default(); dirs.len()] };
    for (d, dir) in dirs.iter().enumerate() {
        for bucket in 0..=255u8 {
            let bucket_dir = dir.shards.join(format!("{bucket:02x}"));
            std::fs::create_dir_all(&bucket_dir).map_err(|e| {
                CairnError::from_io(&format!("cannot create shard directory {}", bucket_dir.display()), &e)
            })?;
            scan_bucket(&mut index, d, &bucket_dir)?;
        }
    }
    Ok(index)
}

fn scan_bucket(index: &mut Index, dir: usize, bucket_dir: &Path) -> Result<()> {
    let ctx = |e: io::Error| CairnError::from_io(&format!("cannot list {}", bucket_dir.display()), &e);
    for entry in std::fs::read_dir(bucket_dir).map_err(ctx)? {
        let entry = entry.map_err(ctx)?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.contains(".tmp") {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed a partial shard write"),
                Err(e) => tracing::warn!(path = %path.display(), "cannot remove partial shard write: {e}"),
            }
            continue;
        }
        let id = match ShardId::parse_file_name(&name) {
            Some(id) if bucket_dir.ends_with(id.bucket()) => id,
            _ => {
                tracing::warn!(path = %path.display(), "ignoring a file that is not a shard of this directory");
                continue;
            }
        };
        let meta = entry.metadata().map_err(ctx)?;
        if !meta.is_file() {
            tracing::warn!(path = %path.display(), "ignoring a shard name that is not a regular file");
            continue;
        }
        if let Some(first) = index.shards.get(&id) {
            tracing::warn!(
                path = %path.display(),
                "shard {id} is also in directory #{}; ignoring this copy",
                first.dir
            );
            continue;
        }
        index.insert(id, Location { dir, file_len: meta.len() });
    }
    Ok(())
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
