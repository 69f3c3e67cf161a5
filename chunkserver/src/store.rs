//! The shard store: shard files in tier directories, with an in-memory index of where each
//! shard lives and how many bytes each directory holds.
//!
//! Layout: `{dir}/shards/{bucket}/{file_name}` where both names come from a validated numeric
//! [`ShardId`] (`bucket()`, `file_name()`), never from a string a client sent, so no request can
//! reach outside the data directories. Every public method validates the ids it is given.
//!
//! Invariants:
//! - A shard file appears under its final name only complete: it is written to
//!   `{final}.tmp-{random}` and renamed over the final name; the flusher (`flush.rs`, with
//!   `sync`) then fsyncs it and the bucket directory, before a durable write is answered and
//!   within the flush interval for a buffered one. Leftover `*.tmp*` files are partial writes
//!   and are removed at open.
//! - The index holds exactly the shard files of the directories, one location per id, and the
//!   per-directory usage (file bytes including headers, shard count) is the sum over the index.
//!   Rewriting an existing id (an idempotent retry) replaces its file and its accounting.
//! - New shards go to SSD directories (rotating, skipping full ones) and only fall back to HDD
//!   directories when no SSD directory has room; "room" is `statvfs` free space above
//!   `reserve_bytes`, and on SSD also the directory's share of `ssd_capacity` not yet used.
//!   Only when every directory is full is a write `NoSpace`.
//! - Reads verify the header and every block they return; a checksum mismatch is an
//!   `ErrorKind::Corrupt` error, never data.
//! - Writes, deletes and tier moves of one shard id are serialised by a per-id claim; reads
//!   take none. A read resolves the path from the index and, if the file vanished because a
//!   move switched it to another directory meanwhile, resolves it again.
//! - The index keeps each shard's last access (from the injected [`Clock`]; the file's mtime at
//!   open) and the recent HDD reads of HDD shards, which the mover (`mover.rs`) turns into
//!   demotions and promotions following the [`TierPolicy`].

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
use tokio::sync::Notify;

use crate::engine::{drop_cached, IoEngine, IoFuture};
use crate::flush::{Flusher, Unflushed};
use crate::mover::RateLimiter;
use crate::pins::Pins;
use crate::policy::{system_ms, Clock, HotTracker, SystemClock, TierPolicy};
use crate::shard::{self, HEADER_ALIGN, MAX_SHARD_BYTES};

/// Checksumming more than this many bytes moves to the blocking pool, off the async workers.
const INLINE_HASH_BYTES: usize = 1 << 20;
/// Most bytes of whole shard files kept after an O_DIRECT read from HDD, for the mover to
/// promote from (see [`ReadBack`]).
const READ_BACK_BYTES: usize = 64 << 20;

/// Whole shard files just read, verified, with O_DIRECT from an HDD directory, kept for the
/// mover: promoting one of them copies these bytes instead of reading the HDD a second time
/// (through the page cache that second read would be free; with O_DIRECT it is not). Bounded
/// by [`READ_BACK_BYTES`], oldest out first; an entry is used only if the shard's file length
/// still matches, and the copy is verified like any other.
#[derive(Default)]
pub(crate) struct ReadBack {
    entries: HashMap<ShardId, Bytes>,
    order: std::collections::VecDeque<ShardId>,
    bytes: usize,
}

impl ReadBack {
    fn put(&mut self, id: ShardId, file: Bytes) {
        if file.len() > READ_BACK_BYTES {
            return;
        }
        if let Some(old) = self.entries.insert(id, file.clone()) {
            self.bytes -= old.len();
        } else {
            self.order.push_back(id);
        }
        self.bytes += file.len();
        while self.bytes > READ_BACK_BYTES {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(gone) = self.entries.remove(&oldest) {
                self.bytes -= gone.len();
            }
        }
    }

    /// Drop what is kept of `id` (deleted).
    fn forget(&mut self, id: &ShardId) {
        if let Some(file) = self.entries.remove(id) {
            self.bytes -= file.len();
            self.order.retain(|k| k != id);
        }
    }

    /// The kept bytes of `id`'s file if they are `file_len` long; the entry is used up.
    pub(crate) fn take(&mut self, id: &ShardId, file_len: u64) -> Option<Bytes> {
        let file = self.entries.get(id)?.clone();
        self.forget(id);
        (file.len() as u64 == file_len).then_some(file)
    }
}

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
    /// Make shards durable at all (false: never fsync, for throwaway data).
    pub sync: bool,
    /// A buffered write is on disk within this (`flush.rs`).
    pub flush_interval: std::time::Duration,
    /// `test_power_loss`: where the flusher lists the shards not on disk yet; a store opened
    /// with it deletes the shards the list names first.
    pub power_loss_log: Option<PathBuf>,
    /// Bytes left free on each directory's filesystem.
    pub reserve_bytes: u64,
    /// SSD capacity, watermarks and the promotion rule.
    pub policy: TierPolicy,
    /// Most bytes per second copied between tiers.
    pub mover_rate_bytes: u64,
    /// Read shard files of this tier with O_DIRECT (and drop written shards from the page
    /// cache), so whole-shard reads do not evict what the page cache is better used for.
    pub ssd_direct_io: bool,
    pub hdd_direct_io: bool,
    /// Where the pinned files are kept (`pins.rs`); `None`: in memory only.
    pub pins_file: Option<PathBuf>,
}

impl StoreOptions {
    pub fn from_config(config: &ChunkConfig) -> StoreOptions {
        StoreOptions {
            ssd_dirs: config.ssd_dirs.clone(),
            hdd_dirs: config.hdd_dirs.clone(),
            sync: config.sync,
            flush_interval: std::time::Duration::from_millis(config.flush_interval_ms),
            power_loss_log: config.test_power_loss.then(|| config.state_dir.join("unflushed")),
            reserve_bytes: config.reserve_bytes,
            policy: TierPolicy::from_config(config),
            mover_rate_bytes: config.mover_rate_bytes,
            ssd_direct_io: config.ssd_direct_io,
            hdd_direct_io: config.hdd_direct_io,
            pins_file: Some(config.state_dir.join("pins")),
        }
    }
}

/// One configured data directory.
#[derive(Debug)]
pub(crate) struct TierDir {
    pub(crate) tier: Tier,
    /// The directory as configured (what `statvfs` and `cairn df` look at).
    root: PathBuf,
    /// `{root}/shards`, parent of the 256 bucket directories.
    pub(crate) shards: PathBuf,
    /// Shard files here are read with O_DIRECT and dropped from the page cache once written.
    pub(crate) direct: bool,
}

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

/// What the index knows about one directory: usage (the sum over its shards) and counters
/// since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirUsage {
    pub(crate) bytes: u64,
    pub(crate) shards: u64,
    pub(crate) reads: u64,
    pub(crate) read_bytes: u64,
    pub(crate) promotions: u64,
    pub(crate) demotions: u64,
    pub(crate) writes: u64,
    pub(crate) write_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) dir: usize,
    /// Bytes of the whole file, header included.
    pub(crate) file_len: u64,
    /// Last read or write, in [`Clock`] milliseconds.
    pub(crate) last_access: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) shards: HashMap<ShardId, Location>,
    pub(crate) usage: Vec<DirUsage>,
    /// Recent HDD reads of HDD shards.
    pub(crate) hot: HotTracker,
}

impl Index {
    pub(crate) fn insert(&mut self, id: ShardId, loc: Location) -> Option<Location> {
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

/// Shard ids with a write, delete or move in progress. Whoever holds an id's claim is the only
/// one changing its file and its index entry. Each claimed id has its own `Notify`, so a
/// release wakes only the tasks waiting for that id.
#[derive(Default)]
struct Claims {
    busy: Mutex<HashMap<ShardId, Arc<Notify>>>,
}

/// The claim on one shard id; dropping it lets the next writer, deleter or mover in.
pub(crate) struct Claim<'a> {
    claims: &'a Claims,
    id: ShardId,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let released = self.claims.busy.lock().remove(&self.id);
        if let Some(waiters) = released {
            waiters.notify_waiters();
        }
    }
}

impl Claims {
    fn try_claim(&self, id: ShardId) -> Option<Claim<'_>> {
        // The guard must be gone before a Claim exists: a Claim built and dropped while the
        // map is locked (as `then_some` would, eagerly) deadlocks in its Drop, and would remove
        // someone else's claim.
        let inserted = match self.busy.lock().entry(id) {
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(Arc::new(Notify::new()));
                true
            }
            std::collections::hash_map::Entry::Occupied(_) => false,
        };
        inserted.then(|| Claim { claims: self, id })
    }

    async fn claim(&self, id: ShardId) -> Claim<'_> {
        loop {
            if let Some(claim) = self.try_claim(id) {
                return claim;
            }
            let Some(holder) = self.busy.lock().get(&id).cloned() else { continue };
            let released = holder.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // Released (and maybe claimed again, with a new Notify) before we listened: the
            // wake-up was missed, so look again instead of waiting for it.
            let same = self.busy.lock().get(&id).is_some_and(|now| Arc::ptr_eq(now, &holder));
            if same {
                released.await;
            }
        }
    }
}

#[cfg(test)]
mod claim_tests {
    use std::collections::HashSet;

    use super::*;

    #[tokio::test]
    async fn a_refused_claim_leaves_the_holder_alone_and_the_next_one_waits() {
        let claims = Claims::default();
        let id = ShardId { ino: 1, stripe: 2, index: 3, version: 4 };
        let held = claims.try_claim(id).expect("free");
        // Refused, without deadlocking and without releasing the holder's claim.
        assert!(claims.try_claim(id).is_none());
        assert!(claims.try_claim(id).is_none());
        assert!(claims.busy.lock().contains_key(&id));
        let waiter = claims.claim(id);
        tokio::pin!(waiter);
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        // Another id's release does not let it in.
        let other = ShardId { index: 4, ..id };
        drop(claims.try_claim(other).expect("free"));
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        drop(held);
        let _next = waiter.await;
        assert!(claims.try_claim(id).is_none());
        assert_eq!(claims.busy.lock().len(), 1, "released ids are forgotten");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_tasks_on_few_ids_take_turns_and_never_overlap() {
        let claims = Arc::new(Claims::default());
        let inside = Arc::new(Mutex::new(HashSet::new()));
        let tasks: Vec<_> = (0..64u32)
            .map(|n| {
                let (claims, inside) = (claims.clone(), inside.clone());
                tokio::spawn(async move {
                    let id = ShardId { ino: 1, stripe: 0, index: n % 3, version: 1 };
                    for _ in 0..50 {
                        let _claim = claims.claim(id).await;
                        assert!(inside.lock().insert(id), "two holders of {id}");
                        tokio::task::yield_now().await;
                        inside.lock().remove(&id);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(claims.busy.lock().is_empty());
    }
}

/// Shard files on SSD and HDD directories, read and written through an [`IoEngine`].
pub struct ShardStore {
    pub(crate) engine: Arc<dyn IoEngine>,
    pub(crate) dirs: Vec<TierDir>,
    pub(crate) index: Mutex<Index>,
    /// Makes written shards durable in batches; `None` when `sync` is off.
    flusher: Option<Flusher>,
    reserve_bytes: u64,
    next_ssd: AtomicUsize,
    next_hdd: AtomicUsize,
    pub(crate) policy: TierPolicy,
    pub(crate) clock: Arc<dyn Clock>,
    claims: Claims,
    pub(crate) read_back: Mutex<ReadBack>,
    /// Shared by every copy between tiers (mover and `Promote`).
    pub(crate) limiter: RateLimiter,
    /// Files whose shards stay on SSD (`cairn warmup --pin`).
    pub(crate) pins: Pins,
    /// Warmup sessions: when (store clock, ms) each was first and last seen. What a session
    /// promoted, or what was used since it began, is not evicted for it.
    pub(crate) warmups: Mutex<HashMap<u64, (u64, u64)>>,
}

impl ShardStore {
    /// Create the directory structure where missing, remove partial writes, index every shard
    /// file found and settle shards left in two directories by an interrupted move.
    pub async fn open(options: StoreOptions, engine: Arc<dyn IoEngine>) -> Result<ShardStore> {
        ShardStore::open_with_clock(options, engine, Arc::new(SystemClock)).await
    }

    /// [`ShardStore::open`] with the clock that times accesses (tests pass a manual one).
    pub async fn open_with_clock(
        options: StoreOptions,
        engine: Arc<dyn IoEngine>,
        clock: Arc<dyn Clock>,
    ) -> Result<ShardStore> {
        let dirs: Vec<TierDir> = (options.ssd_dirs.iter().map(|d| (Tier::Ssd, d, options.ssd_direct_io)))
            .chain(options.hdd_dirs.iter().map(|d| (Tier::Hdd, d, options.hdd_direct_io)))
            .map(|(tier, root, direct)| TierDir {
                tier,
                root: root.clone(),
                shards: root.join("shards"),
                direct,
            })
            .collect();
        if dirs.is_empty() {
            return Err(CairnError::invalid("the chunkserver needs at least one ssd or hdd directory"));
        }
        let pins = Pins::load(options.pins_file.clone())?;
        if let Some(log) = &options.power_loss_log {
            let dropped = crate::flush::drop_unflushed(log)?;
            tracing::warn!(
                dropped,
                "test_power_loss is on (for crash tests only): shard files never flushed were deleted, \
                 as a power loss would have"
            );
        }
        let flusher = match options.sync {
            true => Some(Flusher::start(
                options.flush_interval,
                Arc::new(|f: &std::fs::File| f.sync_data()),
                options.power_loss_log.clone(),
            )?),
            false => None,
        };
        let (dirs, (index, duplicates)) =
            tokio::task::spawn_blocking(move || scan(&dirs).map(|scanned| (dirs, scanned)))
                .await
                .map_err(|e| CairnError::internal(format!("shard scan task failed: {e}")))??;
        let store = ShardStore {
            engine,
            dirs,
            index: Mutex::new(index),
            flusher,
            reserve_bytes: options.reserve_bytes,
            next_ssd: AtomicUsize::new(0),
            next_hdd: AtomicUsize::new(0),
            policy: options.policy,
            clock,
            claims: Claims::default(),
            read_back: Mutex::new(ReadBack::default()),
            limiter: RateLimiter::new(options.mover_rate_bytes),
            pins,
            warmups: Mutex::new(HashMap::new()),
        };
        for dir in store.dirs.iter().filter(|d| d.direct) {
            probe_direct(dir)?;
        }
        store.settle_duplicates(duplicates).await;
        let usage = store.index.lock().usage.clone();
        for (dir, usage) in store.dirs.iter().zip(&usage) {
            tracing::info!(
                tier = dir.tier.as_str(),
                dir = %dir.root.display(),
                shards = usage.shards,
                bytes = usage.bytes,
                "shard directory opened"
            );
        }
        Ok(store)
    }

    /// The I/O engine's name, for logs.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    pub(crate) fn path(&self, dir: usize, id: &ShardId) -> PathBuf {
        self.dirs[dir].shards.join(id.bucket()).join(id.file_name())
    }

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

    /// Every shard this node holds (a snapshot).
    pub fn shard_ids(&self) -> Vec<ShardId> {
        let mut ids: Vec<ShardId> = self.index.lock().shards.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn shard_path(&self, id: &ShardId) -> Option<PathBuf> {
        let loc = self.index.lock().shards.get(id).copied()?;
        Some(self.path(loc.dir, id))
    }

    /// Up to `limit` shards after `after` (all from the first when `None`), in id order, each
    /// with its file length and the age of its file (since its last write or move).
    pub fn list(&self, after: Option<ShardId>, limit: usize) -> (Vec<(ShardId, u64, u64)>, bool) {
        let picked: Vec<(ShardId, Location)> = {
            let index = self.index.lock();
            let mut ids: Vec<(ShardId, Location)> = index
                .shards
                .iter()
                .filter(|(id, _)| after.is_none_or(|a| **id > a))
                .map(|(id, loc)| (*id, *loc))
                .collect();
            ids.sort_unstable_by_key(|(id, _)| *id);
            ids.truncate(limit.saturating_add(1));
            ids
        };
        let more = picked.len() > limit;
        let now = std::time::SystemTime::now();
        let out = picked
            .into_iter()
            .take(limit)
            .map(|(id, loc)| {
                let age = std::fs::metadata(self.path(loc.dir, &id))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .map_or(0, |d| d.as_millis() as u64);
                (id, loc.file_len, age)
            })
            .collect();
        (out, more)
    }

    /// Check shard `id`: `NotFound` if this node does not hold it; with `verify`, its header,
    /// length and every block checksum are read and checked (`Corrupt` on a mismatch).
    pub async fn check(&self, id: ShardId, verify: bool) -> Result<()> {
        id.validate()?;
        let Some(loc) = self.location(&id) else {
            return Err(CairnError::not_found(format!("shard {id} is not on this chunkserver")));
        };
        let path = self.path(loc.dir, &id);
        let file = match self.open_shard(loc.dir, &path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CairnError::not_found(format!("shard {id}: file {} is gone", path.display())));
            }
            Err(e) => return Err(CairnError::from_io(&format!("open {}", path.display()), &e)),
        };
        if verify {
            crate::mover::verify_file(self.engine.as_ref(), file, &id, Some(loc.file_len)).await?;
        } else {
            let on_disk = file.file.metadata().map_err(|e| CairnError::from_io("shard metadata", &e))?.len();
            if on_disk != loc.file_len {
                return Err(CairnError::corrupt(format!(
                    "shard {id}: file has {on_disk} bytes, {} were written",
                    loc.file_len
                )));
            }
        }
        Ok(())
    }

    /// The tier shard `id` is stored on, if it is.
    pub fn tier_of(&self, id: &ShardId) -> Option<Tier> {
        let loc = self.index.lock().shards.get(id).copied()?;
        Some(self.dirs[loc.dir].tier)
    }

    pub(crate) fn location(&self, id: &ShardId) -> Option<Location> {
        self.index.lock().shards.get(id).copied()
    }

    pub(crate) fn has_tier(&self, tier: Tier) -> bool {
        self.dirs.iter().any(|d| d.tier == tier)
    }

    /// Wait for the claim on `id` (see [`Claims`]).
    pub(crate) async fn claim(&self, id: ShardId) -> Claim<'_> {
        self.claims.claim(id).await
    }

    /// The claim on `id` if nobody holds it.
    pub(crate) fn try_claim(&self, id: ShardId) -> Option<Claim<'_>> {
        self.claims.try_claim(id)
    }

    /// SSD directory `dir`'s share of `ssd_capacity` (the last one takes the remainder);
    /// `None` for HDD directories and when no capacity is configured.
    fn ssd_share(&self, dir: usize) -> Option<u64> {
        let capacity = self.policy.ssd_capacity?;
        if self.dirs[dir].tier != Tier::Ssd {
            return None;
        }
        let ssd: Vec<usize> = (0..self.dirs.len()).filter(|&d| self.dirs[d].tier == Tier::Ssd).collect();
        let each = capacity / ssd.len() as u64;
        Some(if ssd.last() == Some(&dir) { capacity - each * (ssd.len() as u64 - 1) } else { each })
    }

    /// Bytes free for shards in directory `dir` holding `used` bytes: free space above the
    /// reserve, and on SSD no more than what is left of the directory's capacity share.
    fn room(&self, dir: usize, used: u64) -> io::Result<u64> {
        let free = disk_space(&self.dirs[dir].root)?.available.saturating_sub(self.reserve_bytes);
        Ok(match self.ssd_share(dir) {
            Some(share) => free.min(share.saturating_sub(used)),
            None => free,
        })
    }

    /// Bytes used and the capacity the watermarks apply to, summed over the directories of
    /// `tier`. Without a configured capacity, a directory's capacity is what it holds plus its
    /// room, so other data on the filesystem counts against the tier.
    pub(crate) fn tier_fill(&self, tier: Tier) -> (u64, u64) {
        let usage = self.index.lock().usage.clone();
        let (mut used, mut capacity) = (0u64, 0u64);
        for (d, dir) in self.dirs.iter().enumerate().filter(|(_, dir)| dir.tier == tier) {
            let u = usage[d].bytes;
            used += u;
            capacity += match self.ssd_share(d) {
                Some(share) => share,
                None => {
                    u + self.room(d, u).unwrap_or_else(|e| {
                        tracing::warn!(dir = %dir.root.display(), "statvfs failed: {e}");
                        0
                    })
                }
            };
        }
        (used, capacity)
    }

    /// The directories of `tier`, starting at the next one in its rotation.
    pub(crate) fn rotation(&self, tier: Tier) -> Vec<usize> {
        let next = match tier {
            Tier::Ssd => &self.next_ssd,
            Tier::Hdd => &self.next_hdd,
        };
        let of_tier: Vec<usize> = (0..self.dirs.len()).filter(|&d| self.dirs[d].tier == tier).collect();
        if of_tier.is_empty() {
            return of_tier;
        }
        let start = next.fetch_add(1, Ordering::Relaxed) % of_tier.len();
        of_tier[start..].iter().chain(&of_tier[..start]).copied().collect()
    }

    /// Choose a directory for a new file of `need` bytes: the shard's current directory if
    /// it is being rewritten, then SSD directories in rotation, then HDD directories.
    fn pick_dir(&self, id: &ShardId, need: u64, current: Option<usize>) -> Result<usize> {
        let candidates: Vec<usize> =
            current.into_iter().chain(self.rotation(Tier::Ssd)).chain(self.rotation(Tier::Hdd)).collect();
        self.pick_dir_from(id, need, &candidates)
    }

    /// The first of `candidates` with room for `need` bytes, or a `NoSpace` error that says
    /// how much room each had.
    pub(crate) fn pick_dir_from(&self, id: &ShardId, need: u64, candidates: &[usize]) -> Result<usize> {
        let usage = self.index.lock().usage.clone();
        let mut report = Vec::new();
        for &dir in candidates {
            match self.room(dir, usage[dir].bytes) {
                Ok(room) if room >= need => return Ok(dir),
                Ok(room) => report.push(format!(
                    "{} {} has room for {room} bytes{}",
                    self.dirs[dir].tier.as_str(),
                    self.dirs[dir].root.display(),
                    match self.ssd_share(dir) {
                        Some(share) => format!(" (capacity share {share}, reserve kept)"),
                        None => " above the reserve".into(),
                    }
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

    /// Store `data` as shard `id` (replacing any previous copy), on disk when this returns, and
    /// name the tier it went to.
    pub async fn write(&self, id: ShardId, data: Bytes) -> Result<Tier> {
        self.write_as(id, data, false).await
    }

    /// [`ShardStore::write`], answered once the shard is in place: the flusher puts it on disk
    /// within the flush interval (a mount's `durability=close`).
    pub async fn write_buffered(&self, id: ShardId, data: Bytes) -> Result<Tier> {
        self.write_as(id, data, true).await
    }

    /// Answer once every shard of `ino` written before this call is on disk.
    pub async fn sync_ino(&self, ino: u64) -> Result<()> {
        match &self.flusher {
            Some(flusher) => flusher.sync_ino(ino).await,
            None => Ok(()),
        }
    }

    /// Put every shard written so far on disk (a chunkserver stopping).
    pub async fn flush_all(&self) -> Result<()> {
        match &self.flusher {
            Some(flusher) => flusher.flush_all().await,
            None => Ok(()),
        }
    }

    /// Shards written and not yet on disk.
    pub fn unflushed(&self) -> usize {
        self.flusher.as_ref().map_or(0, Flusher::unflushed)
    }

    async fn write_as(&self, id: ShardId, data: Bytes, buffered: bool) -> Result<Tier> {
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
        let payload = data.len() as u64;
        let claim = self.claims.claim(id).await;
        let current = self.index.lock().shards.get(&id).map(|loc| loc.dir);
        let dir = self.pick_dir(&id, file_len, current)?;
        let path = self.path(dir, &id);
        let tmp = path.with_file_name(format!("{}.tmp-{:016x}", id.file_name(), rand::random::<u64>()));

        let file = self.create_file(tmp, path.clone(), header, data).await?;

        let last_access = self.clock.now_ms();
        let old = {
            let mut index = self.index.lock();
            index.hot.forget(&id);
            let old = index.insert(id, Location { dir, file_len, last_access });
            index.usage[dir].writes += 1;
            index.usage[dir].write_bytes += payload;
            old
        };
        if let Some(old) = old.filter(|old| old.dir != dir) {
            // The previous copy lived in another directory: remove it, or it would come back at
            // the next open as a duplicate.
            let old_path = self.path(old.dir, &id);
            if let Err(e) = tokio::fs::remove_file(&old_path).await {
                tracing::warn!(path = %old_path.display(), "cannot remove replaced shard file: {e}");
            }
        }
        drop(claim);
        match &self.flusher {
            Some(flusher) => {
                let shard = Unflushed { ino: id.ino, file, path, direct: self.dirs[dir].direct };
                if buffered {
                    flusher.add(shard);
                } else {
                    flusher.add_and_wait(shard).await?;
                }
            }
            None => self.written_to(dir, &file),
        }
        Ok(self.dirs[dir].tier)
    }

    /// Put a new shard file in place: header and data written to `tmp`, renamed to `path`, in
    /// one task on the blocking pool; on failure `tmp` is removed and `path` untouched. Making
    /// it durable is the flusher's. The engine is not used here: one blocking task makes one
    /// hand-off where engine calls (open, two writes, rename) made several, each a thread
    /// wake-up (`bench/rpcs.sh` 4 KiB file writes).
    async fn create_file(
        &self,
        tmp: PathBuf,
        path: PathBuf,
        header: Vec<u8>,
        data: Bytes,
    ) -> Result<Arc<std::fs::File>> {
        let file = tokio::task::spawn_blocking(move || {
            let written = write_new_file(&tmp, &header, &data).and_then(|file| {
                std::fs::rename(&tmp, &path)
                    .map_err(|e| CairnError::from_io(&format!("rename {} into place", tmp.display()), &e))?;
                Ok(file)
            });
            if written.is_err() {
                if let Err(rm) = std::fs::remove_file(&tmp) {
                    if rm.kind() != io::ErrorKind::NotFound {
                        tracing::warn!(path = %tmp.display(), "cannot remove partial shard file: {rm}");
                    }
                }
            }
            written
        })
        .await
        .map_err(|e| CairnError::internal(format!("shard write task: {e}")))??;
        Ok(Arc::new(file))
    }

    pub(crate) async fn fsync_dir(&self, dir: &Path) -> Result<()> {
        let ctx = || format!("fsync directory {}", dir.display());
        let handle = tokio::fs::File::open(dir).await.map_err(|e| CairnError::from_io(&ctx(), &e))?;
        let handle = Arc::new(handle.into_std().await);
        self.engine.fsync(handle).await.map_err(|e| CairnError::from_io(&ctx(), &e))
    }

    /// Read `len` bytes (0: to the end) at `offset` of shard `id`, clipped at its end, every
    /// byte verified. Returns the bytes and the shard's data length.
    pub async fn read(&self, id: ShardId, offset: u64, len: u64) -> Result<(Bytes, u64)> {
        id.validate()?;
        // A read from the caches completes without waiting; count it against the task's
        // budget like any tokio I/O, so a stream of them yields to other tasks now and then.
        tokio::task::consume_budget().await;
        let (loc, path, file) = self.open_for_read(&id).await?;
        let (data, data_len) = self.read_open(&id, &path, file, loc, offset, len).await?;
        self.note_read(&id, loc.dir, data.len() as u64);
        Ok((data, data_len))
    }

    /// Resolve and open the file of shard `id`. A file that vanished after the lookup was moved
    /// to another tier or deleted: look again, so a read racing a move never fails.
    async fn open_for_read(&self, id: &ShardId) -> Result<(Location, PathBuf, ShardFile)> {
        let mut loc = self.location(id);
        for _ in 0..4 {
            let Some(found) = loc else { break };
            let path = self.path(found.dir, id);
            match self.open_shard(found.dir, &path).await {
                Ok(f) => return Ok((found, path, f)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let again = self.location(id);
                    if again.map(|l| l.dir) == Some(found.dir) {
                        return Err(CairnError::not_found(format!(
                            "shard {id} is not on this chunkserver (file gone)"
                        )));
                    }
                    loc = again;
                }
                Err(e) => {
                    return Err(CairnError::from_io(&format!("open shard file {}", path.display()), &e))
                }
            }
        }
        Err(CairnError::not_found(format!("shard {id} is not on this chunkserver")))
    }

    /// Count a read of `bytes` from directory `dir`: its last access, the directory's
    /// counters, and on HDD the promotion history.
    fn note_read(&self, id: &ShardId, dir: usize, bytes: u64) {
        let now = self.clock.now_ms();
        let mut guard = self.index.lock();
        let index = &mut *guard;
        if let Some(loc) = index.shards.get_mut(id) {
            loc.last_access = loc.last_access.max(now);
            if self.dirs[loc.dir].tier == Tier::Hdd {
                index.hot.record(&self.policy, *id, now);
            }
        }
        let u = &mut index.usage[dir];
        u.reads += 1;
        u.read_bytes += bytes;
    }

    async fn read_open(
        &self,
        id: &ShardId,
        path: &Path,
        file: ShardFile,
        loc: Location,
        offset: u64,
        len: u64,
    ) -> Result<(Bytes, u64)> {
        let file_len = loc.file_len;
        // A whole O_DIRECT read from HDD may be promoted next: keep its bytes for the mover.
        let keep = file.direct && self.dirs[loc.dir].tier == Tier::Hdd && self.policy.promote_after_reads > 0;
        let id = *id;
        let io_err =
            |what: &str, e: io::Error| CairnError::from_io(&format!("{what} {}", path.display()), &e);
        let engine = self.engine.as_ref();
        // A range that starts in the first block is read with the header in one I/O (small
        // files, whole-shard and sequential reads): the header of a shard up to 8000 KiB is one
        // 4 KiB page and the data follows it. What the header then says decides; if the guess
        // was short, the missing parts are read below as usual.
        let bs = BLOCK_SIZE as u64;
        let first_read = if offset < bs {
            let end = if len == 0 { u64::MAX } else { offset.saturating_add(len) };
            let data_end = end.div_ceil(bs).saturating_mul(bs);
            (HEADER_ALIGN as u64).saturating_add(data_end).min(file_len.max(HEADER_ALIGN as u64))
        } else {
            HEADER_ALIGN as u64
        };
        let prefix =
            Bytes::from(file.read_at(engine, 0, first_read as usize).await.map_err(|e| io_err("read", e))?);
        let header = shard::parse_header(&prefix, &id).map_err(|e| corrupt(path, e))?;
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
            file.read_at(engine, hashes_at.start, n).await.map_err(|e| io_err("read", e))?
        };
        let data_at = header.data_range(&blocks);
        let data = if data_at.end <= prefix.len() as u64 {
            prefix.slice(data_at.start as usize..data_at.end as usize)
        } else {
            let n = (data_at.end - data_at.start) as usize;
            Bytes::from(file.read_at(engine, data_at.start, n).await.map_err(|e| io_err("read", e))?)
        };
        let (verified, data) = {
            let blocks = blocks.clone();
            off_thread(data.len(), move || (header.verify(&blocks, &hashes, &data), data)).await?
        };
        verified.map_err(|e| corrupt(path, e))?;
        // The whole file is in `prefix` and every block of it was just verified.
        if keep && blocks == (0..header.nblocks) && prefix.len() as u64 == header.header_len + data_len {
            self.read_back.lock().put(id, prefix.clone());
        }
        let first = blocks.start as u64 * BLOCK_SIZE as u64;
        Ok((data.slice((offset - first) as usize..(end - first) as usize), data_len))
    }

    /// Delete shards; returns how many existed. Missing ids are not errors.
    pub async fn delete(&self, ids: &[ShardId]) -> Result<u32> {
        for id in ids {
            id.validate()?;
        }
        let mut deleted = 0;
        for id in ids {
            let _claim = self.claims.claim(*id).await;
            let Some(loc) = ({
                let mut index = self.index.lock();
                index.hot.forget(id);
                self.read_back.lock().forget(id);
                index.remove(id)
            }) else {
                continue;
            };
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

    /// Capacity, usage and counters of every directory, SSD first.
    pub fn usage(&self) -> Vec<cairn_proto::TierUsage> {
        let usage = self.index.lock().usage.clone();
        self.dirs
            .iter()
            .zip(usage)
            .enumerate()
            .map(|(d, (dir, used))| {
                let space = disk_space(&dir.root).unwrap_or_else(|e| {
                    tracing::warn!(dir = %dir.root.display(), "statvfs failed: {e}");
                    DiskSpace::default()
                });
                let fs_free = space.available.saturating_sub(self.reserve_bytes);
                // A share of `ssd_capacity` is this directory's own; the whole filesystem may
                // be shared with other directories and chunkservers, and says which it is.
                let (capacity, free, fs_id) = match self.ssd_share(d) {
                    Some(share) => (share, fs_free.min(share.saturating_sub(used.bytes)), String::new()),
                    None => {
                        (space.capacity, fs_free, cairn_common::space::fs_id(&dir.root).unwrap_or_default())
                    }
                };
                cairn_proto::TierUsage {
                    name: dir.tier.as_str().into(),
                    path: dir.root.display().to_string(),
                    capacity,
                    free,
                    used: used.bytes,
                    shards: used.shards,
                    reads: used.reads,
                    read_bytes: used.read_bytes,
                    promotions: used.promotions,
                    demotions: used.demotions,
                    writes: used.writes,
                    write_bytes: used.write_bytes,
                    fs_id,
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

/// Create `path` (it must not exist), write `header` then `data`.
fn write_new_file(path: &Path, header: &[u8], data: &[u8]) -> Result<std::fs::File> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let ctx = |e: io::Error| CairnError::from_io(&format!("write shard file {}", path.display()), &e);
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(path).map_err(ctx)?;
    file.write_all(header).map_err(ctx)?;
    file.write_all(data).map_err(ctx)?;
    Ok(file)
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

/// Create the bucket directories and index the shard files of every directory. A shard found
/// in a second directory (a move interrupted between rename and delete) is not indexed but
/// returned, for `ShardStore::settle_duplicates`; directories are scanned SSD first, so the
/// indexed copy is an SSD one when there is one.
fn scan(dirs: &[TierDir]) -> Result<(Index, Vec<(ShardId, Location)>)> {
    let mut index = Index {
        shards: HashMap::new(),
        usage: vec![DirUsage::default(); dirs.len()],
        hot: HotTracker::default(),
    };
    let mut duplicates = Vec::new();
    for (d, dir) in dirs.iter().enumerate() {
        for bucket in 0..=255u8 {
            let bucket_dir = dir.shards.join(format!("{bucket:02x}"));
            std::fs::create_dir_all(&bucket_dir).map_err(|e| {
                CairnError::from_io(&format!("cannot create shard directory {}", bucket_dir.display()), &e)
            })?;
            scan_bucket(&mut index, &mut duplicates, d, &bucket_dir)?;
        }
    }
    Ok((index, duplicates))
}

fn scan_bucket(
    index: &mut Index,
    duplicates: &mut Vec<(ShardId, Location)>,
    dir: usize,
    bucket_dir: &Path,
) -> Result<()> {
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
        let last_access = meta.modified().map(system_ms).unwrap_or(0);
        let loc = Location { dir, file_len: meta.len(), last_access };
        if index.shards.contains_key(&id) {
            duplicates.push((id, loc));
            continue;
        }
        index.insert(id, loc);
    }
    Ok(())
}

#[cfg(test)]
#[path = "store_tests.rs"]
pub(crate) mod tests;

/// Refuse a tier configured for O_DIRECT on a filesystem that cannot do it (tmpfs before Linux
/// 6.6, some FUSE and network filesystems), at start rather than at the first read.
fn probe_direct(dir: &TierDir) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.shards.join(format!(".direct-probe-{:016x}", rand::random::<u64>()));
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    match opened {
        Ok(_) => Ok(()),
        Err(e) => Err(CairnError::invalid(format!(
            "{} {}: {}_direct_io is set but its filesystem refuses O_DIRECT ({e})",
            dir.tier.as_str(),
            dir.root.display(),
            dir.tier.as_str()
        ))),
    }
}
