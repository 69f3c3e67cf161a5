//! The shard store: shard files in tier directories, with an in-memory index of where each
//! shard lives and how many bytes each directory holds. Its parts: `placement.rs` (tiers,
//! directories, room), `index.rs`, `claims.rs`, `files.rs` (opening, reading, verifying and
//! creating shard files), `read_back.rs`, `recovery.rs` (what open does after a crash).
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

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::config::ChunkConfig;
use cairn_common::content::HASH_LEN;
use cairn_common::{CairnError, Result, ShardId};
use parking_lot::Mutex;

use crate::engine::IoEngine;
use crate::flush::{Flusher, Unflushed};
use crate::policy::{Clock, SystemClock, TierPolicy};
use crate::shard::{self, HEADER_ALIGN, MAX_SHARD_BYTES};

mod claims;
mod files;
mod index;
mod placement;
mod read_back;
mod recovery;

pub(crate) use claims::Claim;
use claims::Claims;
pub(crate) use files::{off_thread, ShardFile};
use index::Index;
pub(crate) use index::Location;
pub use placement::Tier;
use placement::{disk_space, probe_direct, DiskSpace, TierDir};
use read_back::ReadBack;
use recovery::scan;

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
    /// Read shard files of this tier with O_DIRECT (and drop written shards from the page
    /// cache), so whole-shard reads do not evict what the page cache is better used for.
    pub ssd_direct_io: bool,
    pub hdd_direct_io: bool,
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
            ssd_direct_io: config.ssd_direct_io,
            hdd_direct_io: config.hdd_direct_io,
        }
    }
}

/// Who checks the bytes of a shard read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadCheck {
    /// The store verifies every block it reads against its checksum.
    Blocks,
    /// The reader checks the bytes against the content hash its writer recorded (a whole data
    /// shard), so the store sends them as read.
    Reader,
    /// The reader checks the blocks it gets against the content hash through the shard's
    /// BLAKE3 tree: the store sends the tree's block values with the bytes (format 2 shards;
    /// a format 1 shard is verified here and sent without them).
    Tree,
}

/// What a shard read returns.
pub struct ShardRead {
    pub data: Bytes,
    /// The shard's data length.
    pub data_len: u64,
    /// Every block's value of the shard's BLAKE3 tree, for [`ReadCheck::Tree`] on a format 2
    /// shard.
    pub tree: Option<Bytes>,
}

/// Shard files on SSD and HDD directories, read and written through an [`IoEngine`].
pub struct ShardStore {
    engine: Arc<dyn IoEngine>,
    dirs: Vec<TierDir>,
    index: Mutex<Index>,
    /// Makes written shards durable in batches; `None` when `sync` is off.
    flusher: Option<Flusher>,
    reserve_bytes: u64,
    next_ssd: AtomicUsize,
    next_hdd: AtomicUsize,
    policy: TierPolicy,
    clock: Arc<dyn Clock>,
    claims: Claims,
    read_back: Mutex<ReadBack>,
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

    // What the mover (`mover.rs`) works with: claims, locations and directories, the engine,
    // the policy and clock, and the index changes a move makes.

    pub(crate) fn engine(&self) -> &dyn IoEngine {
        self.engine.as_ref()
    }

    pub(crate) fn policy(&self) -> &TierPolicy {
        &self.policy
    }

    /// Now, on the store's clock (milliseconds).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The tier of directory `dir`.
    pub(crate) fn dir_tier(&self, dir: usize) -> Tier {
        self.dirs[dir].tier
    }

    /// The bucket directory shard `id` has in directory `dir`.
    pub(crate) fn bucket(&self, dir: usize, id: &ShardId) -> PathBuf {
        self.dirs[dir].shards.join(id.bucket())
    }

    /// The bytes of `id`'s file kept from an O_DIRECT read, if they are `file_len` long
    /// (used up either way).
    pub(crate) fn take_read_back(&self, id: &ShardId, file_len: u64) -> Option<Bytes> {
        self.read_back.lock().take(id, file_len)
    }

    /// Shard `id`, at `from`, now lives in directory `to_dir` of tier `to` (its copy is in
    /// place and synced): switch the index and count the move in both directories. A
    /// promotion counts as an access and ends the shard's HDD read history.
    pub(crate) fn record_move(&self, id: ShardId, from: Location, to_dir: usize, to: Tier) {
        let now = self.clock.now_ms();
        let mut guard = self.index.lock();
        let index = &mut *guard;
        let last_access = if to == Tier::Ssd { from.last_access.max(now) } else { from.last_access };
        index.insert(id, Location { dir: to_dir, last_access, ..from });
        for dir in [from.dir, to_dir] {
            let u = &mut index.usage[dir];
            match to {
                Tier::Ssd => u.promotions += 1,
                Tier::Hdd => u.demotions += 1,
            }
        }
        if to == Tier::Ssd {
            index.hot.forget(&id);
        }
    }

    /// Note `id` as used now (for the LRU order and warmup sessions).
    pub(crate) fn touch(&self, id: &ShardId) {
        let now = self.clock.now_ms();
        if let Some(loc) = self.index.lock().shards.get_mut(id) {
            loc.last_access = loc.last_access.max(now);
        }
    }

    /// HDD shards read often enough recently to be promoted, as of `now`; older reads are
    /// forgotten.
    pub(crate) fn hot_shards(&self, now: u64) -> Vec<ShardId> {
        let mut index = self.index.lock();
        index.hot.prune(&self.policy, now);
        index.hot.hot(&self.policy, now)
    }

    /// Forget the HDD read history of `id`.
    pub(crate) fn forget_hot(&self, id: &ShardId) {
        self.index.lock().hot.forget(id);
    }

    /// Shards hot enough to be promoted and not moved yet (the mover's backlog).
    pub fn promotion_backlog(&self) -> usize {
        let now = self.clock.now_ms();
        self.index.lock().hot.hot(&self.policy, now).len()
    }

    /// `(id, last access, file bytes)` of every shard on `tier`.
    pub(crate) fn shards_on(&self, tier: Tier) -> Vec<(ShardId, u64, u64)> {
        let index = self.index.lock();
        (index.shards.iter())
            .filter(|(_, loc)| self.dirs[loc.dir].tier == tier)
            .map(|(id, loc)| (*id, loc.last_access, loc.file_len))
            .collect()
    }

    /// The I/O engine's name, for logs.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    pub(crate) fn path(&self, dir: usize, id: &ShardId) -> PathBuf {
        self.dirs[dir].shards.join(id.bucket()).join(id.file_name())
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
    /// length and every block checksum are read and checked, and its data against `content`
    /// (its stripe record's content hash) when given (`Corrupt` on a mismatch).
    pub async fn check(&self, id: ShardId, verify: bool, content: Option<[u8; HASH_LEN]>) -> Result<()> {
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
            file.verify(self.engine.as_ref(), &id, Some(loc.file_len), content).await?;
        } else {
            let on_disk = file.file.metadata().map_err(|e| CairnError::from_io("shard metadata", &e))?.len();
            if on_disk != loc.file_len {
                return Err(CairnError::corrupt(format!(
                    "shard {id}: file has {on_disk} bytes, {} were written",
                    loc.file_len
                )));
            }
            if let Some(content) = content {
                file.check_content(self.engine.as_ref(), &id, Some(loc.file_len), content).await?;
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

    /// Wait for the claim on `id` (see [`Claims`]).
    pub(crate) async fn claim(&self, id: ShardId) -> Claim<'_> {
        self.claims.claim(id).await
    }

    /// The claim on `id` if nobody holds it.
    pub(crate) fn try_claim(&self, id: ShardId) -> Option<Claim<'_>> {
        self.claims.try_claim(id)
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

    /// Read `len` bytes (0: to the end) at `offset` of shard `id`, clipped at its end, every
    /// byte verified. Returns the bytes and the shard's data length.
    pub async fn read(&self, id: ShardId, offset: u64, len: u64) -> Result<(Bytes, u64)> {
        let read = self.read_as(id, offset, len, ReadCheck::Blocks).await?;
        Ok((read.data, read.data_len))
    }

    /// [`ShardStore::read`], with the bytes verified against their block checksums unless
    /// `check` leaves that to the reader.
    pub async fn read_as(&self, id: ShardId, offset: u64, len: u64, check: ReadCheck) -> Result<ShardRead> {
        id.validate()?;
        // A read from the caches completes without waiting; count it against the task's
        // budget like any tokio I/O, so a stream of them yields to other tasks now and then.
        tokio::task::consume_budget().await;
        let (loc, path, file) = self.open_for_read(&id).await?;
        let read = self.read_open(&id, &path, file, loc, (offset, len), check).await?;
        self.note_read(&id, loc.dir, read.data.len() as u64);
        Ok(read)
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
        (offset, len): (u64, u64),
        check: ReadCheck,
    ) -> Result<ShardRead> {
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
            return Ok(ShardRead { data: Bytes::new(), data_len, tree: None });
        }
        let blocks = header.blocks_for(offset, end);
        // Block values come from the header page already read, or from the file.
        let tree = if check == ReadCheck::Tree && header.format == shard::FORMAT_VERSION {
            let at = header.hashes_range(&(0..header.nblocks));
            Some(read_span(&prefix, &file, engine, at).await.map_err(|e| io_err("read", e))?)
        } else {
            None
        };
        let verify = match check {
            ReadCheck::Blocks => true,
            ReadCheck::Reader => false,
            ReadCheck::Tree => tree.is_none(),
        };
        let hashes = if verify {
            read_span(&prefix, &file, engine, header.hashes_range(&blocks))
                .await
                .map_err(|e| io_err("read", e))?
        } else {
            Bytes::new()
        };
        let data_at = header.data_range(&blocks);
        let data = if data_at.end <= prefix.len() as u64 {
            prefix.slice(data_at.start as usize..data_at.end as usize)
        } else {
            let n = (data_at.end - data_at.start) as usize;
            Bytes::from(file.read_at(engine, data_at.start, n).await.map_err(|e| io_err("read", e))?)
        };
        let data = if verify {
            let blocks = blocks.clone();
            let (checked, data) =
                off_thread(data.len(), move || (header.verify(&blocks, &hashes, &data), data)).await?;
            checked.map_err(|e| corrupt(path, e))?;
            data
        } else {
            data
        };
        // The whole file is in `prefix` (verified here, or checked by the reader; the mover
        // verifies its copy all the same).
        if keep && blocks == (0..header.nblocks) && prefix.len() as u64 == header.header_len + data_len {
            self.read_back.lock().put(id, prefix.clone());
        }
        let first = blocks.start as u64 * BLOCK_SIZE as u64;
        Ok(ShardRead { data: data.slice((offset - first) as usize..(end - first) as usize), data_len, tree })
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

/// Bytes `at` of a shard file: from `prefix` (its first bytes, already read) when they are in
/// it, else read.
async fn read_span(
    prefix: &Bytes,
    file: &ShardFile,
    engine: &dyn IoEngine,
    at: std::ops::Range<u64>,
) -> io::Result<Bytes> {
    if at.end <= prefix.len() as u64 {
        return Ok(prefix.slice(at.start as usize..at.end as usize));
    }
    file.read_at(engine, at.start, (at.end - at.start) as usize).await.map(Bytes::from)
}

#[cfg(test)]
pub(crate) mod tests;
