//! Moving shards between tiers: the background mover that demotes least recently used shards
//! from SSD to HDD above the high watermark and promotes hot HDD shards back, the `Promote`
//! request behind `cairn warmup`, and the recovery at open of a move cut short by a crash.
//!
//! A move never leaves a shard unreadable or present nowhere. Holding the shard's claim (so no
//! write or delete of that id interleaves), it copies the file through the [`IoEngine`] to
//! `{target bucket}/{name}.tmp-move-{random}`, fsyncs it, verifies the header and every block
//! checksum of the copy, renames it into place and fsyncs the bucket directory; only then does
//! the index switch to the new directory, and only then is the source deleted (and its
//! directory fsynced). A crash before the rename leaves a temp file, removed at open; a crash
//! between rename and delete leaves a valid copy in both tiers, settled at open by
//! `ShardStore::settle_duplicates`: the SSD copy is kept when it verifies, otherwise the
//! other one. Reads never wait for a move: the source file stays in place until the index
//! points at the copy, and a read that finds the source gone looks the shard up again.
//!
//! Every byte copied, by the mover or by `Promote`, passes one [`RateLimiter`].
//!
//! [`IoEngine`]: crate::engine::IoEngine

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::{CairnError, ErrorKind, Result, ShardId};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::engine::IoEngine;
use crate::shard::{self, ShardHeader, HEADER_ALIGN};
use crate::store::{off_thread, Location, ShardFile, ShardStore, Tier};

/// Bytes per copy or verify step (a whole number of checksum blocks).
const COPY_CHUNK: usize = 16 * BLOCK_SIZE;

/// Spreads copies over time so that they average at most `rate` bytes per second.
#[derive(Debug)]
pub struct RateLimiter {
    rate: u64,
    /// When the bytes granted so far will have been "paid for".
    next: Mutex<Option<Instant>>,
}

impl RateLimiter {
    pub fn new(bytes_per_sec: u64) -> RateLimiter {
        RateLimiter { rate: bytes_per_sec.max(1), next: Mutex::new(None) }
    }

    /// Wait until `bytes` more may be copied.
    pub async fn take(&self, bytes: u64) {
        let start = {
            let mut next = self.next.lock();
            let now = Instant::now();
            let start = next.map_or(now, |n| n.max(now));
            *next = Some(start + Duration::from_secs_f64(bytes as f64 / self.rate as f64));
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

/// What [`ShardStore::move_shard`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveOutcome {
    /// Moved; the bytes of the shard file.
    Moved(u64),
    /// The shard was on the target tier already.
    Already,
    /// The shard is not on this chunkserver.
    Missing,
}

/// What a `Promote` request did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromoteSummary {
    pub promoted: u32,
    pub already: u32,
    pub missing: u32,
    pub bytes: u64,
    /// Other shards demoted to HDD to make room, and their bytes.
    pub evicted: u32,
    pub evicted_bytes: u64,
    /// Why the request stopped early (a full SSD tier is `NoSpace`), if it did, and how many
    /// named shards it did not get to; the counts above are what it did before.
    pub stopped: Option<CairnError>,
    pub not_looked_at: u32,
}

/// How a `Promote` request may make room. The default is the plainest: free space only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromoteOptions {
    /// Demote least recently used SSD shards that are not pinned, not named in the request
    /// and not used since the session began, when a named shard does not fit.
    pub evict: bool,
    /// The warmup run this request belongs to (0: none; then only the request's own shards
    /// are spared).
    pub session: u64,
}

/// Rounds of demotion one promotion may take to make room (victims busy with another move are
/// skipped in a round).
const EVICT_ROUNDS: usize = 5;

/// How long a warmup session is remembered after its last request.
const WARMUP_SESSION_IDLE_MS: u64 = 3_600_000;

/// What one pass of the mover did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub demoted: u32,
    pub promoted: u32,
    pub bytes: u64,
    pub failed: u32,
}

/// Read shard file `file` through `engine` and check its header names `id`, its length is
/// `expect_len` bytes (when given) and every block matches its checksum.
pub(crate) async fn verify_file(
    engine: &dyn IoEngine,
    file: ShardFile,
    id: &ShardId,
    expect_len: Option<u64>,
) -> Result<ShardHeader> {
    let io = |e: std::io::Error| CairnError::from_io(&format!("verify shard {id}"), &e);
    let mut head = file.read_at(engine, 0, HEADER_ALIGN).await.map_err(io)?;
    let header = shard::parse_header(&head, id)?;
    let file_len = header.header_len + header.data_len;
    let on_disk = file.file.metadata().map_err(io)?.len();
    if on_disk != file_len || expect_len.is_some_and(|want| want != file_len) {
        return Err(CairnError::corrupt(format!(
            "shard {id}: file has {on_disk} bytes, its header says {file_len}{}",
            expect_len.map(|l| format!(", the index {l}")).unwrap_or_default()
        )));
    }
    if head.len() < header.header_len as usize {
        head = file.read_at(engine, 0, header.header_len as usize).await.map_err(io)?;
    }
    let per_chunk = (COPY_CHUNK / BLOCK_SIZE) as u32;
    let mut block = 0u32;
    while block < header.nblocks {
        let blocks = block..(block + per_chunk).min(header.nblocks);
        let hashes_at = header.hashes_range(&blocks);
        let hashes = head
            .get(hashes_at.start as usize..hashes_at.end as usize)
            .ok_or_else(|| CairnError::corrupt(format!("shard {id}: block hashes truncated")))?
            .to_vec();
        let data_at = header.data_range(&blocks);
        let data =
            file.read_at(engine, data_at.start, (data_at.end - data_at.start) as usize).await.map_err(io)?;
        let range = blocks.clone();
        off_thread(data.len(), move || header.verify(&range, &hashes, &data)).await??;
        block = blocks.end;
    }
    Ok(header)
}

impl ShardStore {
    /// Move shard `id` to `to` now, waiting for any write, delete or move of it to finish.
    /// `NoSpace` when no directory of `to` has room.
    pub async fn move_shard(&self, id: ShardId, to: Tier) -> Result<MoveOutcome> {
        id.validate()?;
        let _claim = self.claim(id).await;
        let Some(loc) = self.location(&id) else { return Ok(MoveOutcome::Missing) };
        if self.dirs[loc.dir].tier == to {
            return Ok(MoveOutcome::Already);
        }
        self.move_claimed(id, loc, to).await.map(MoveOutcome::Moved)
    }

    /// The move itself (see the module doc); the caller holds the claim on `id`, which is at
    /// `loc`. Returns the bytes moved.
    async fn move_claimed(&self, id: ShardId, loc: Location, to: Tier) -> Result<u64> {
        let target = self.pick_dir_from(&id, loc.file_len, &self.rotation(to))?;
        let source = self.path(loc.dir, &id);
        let dest = self.path(target, &id);
        let tmp = dest.with_file_name(format!("{}.tmp-move-{:016x}", id.file_name(), rand::random::<u64>()));
        if let Err(e) = self.copy_verified(&id, &source, &tmp, loc, target).await {
            remove_quietly(&tmp).await;
            tracing::warn!(shard = %id, from = %source.display(), "move to {} aborted: {e}", to.as_str());
            return Err(e);
        }
        let bucket = dest.parent().unwrap_or(&self.dirs[target].shards).to_path_buf();
        let placed = match tokio::fs::rename(&tmp, &dest).await {
            Ok(()) => self.fsync_dir(&bucket).await,
            Err(e) => Err(CairnError::from_io(&format!("rename {} into place", tmp.display()), &e)),
        };
        if let Err(e) = placed {
            // The index still names the source, which is intact; drop the copy.
            remove_quietly(&tmp).await;
            remove_quietly(&dest).await;
            return Err(e);
        }

        let now = self.clock.now_ms();
        {
            let mut guard = self.index.lock();
            let index = &mut *guard;
            let last_access = if to == Tier::Ssd { loc.last_access.max(now) } else { loc.last_access };
            index.insert(id, Location { dir: target, last_access, ..loc });
            for dir in [loc.dir, target] {
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

        match tokio::fs::remove_file(&source).await {
            Ok(()) => {
                if let Some(parent) = source.parent() {
                    if let Err(e) = self.fsync_dir(parent).await {
                        tracing::warn!("after moving shard {id}: {e}");
                    }
                }
            }
            // Harmless: the next open finds two copies and keeps one.
            Err(e) => tracing::warn!(path = %source.display(), "cannot remove the moved shard's source: {e}"),
        }
        tracing::debug!(shard = %id, to = to.as_str(), bytes = loc.file_len, "shard moved");
        Ok(loc.file_len)
    }

    /// Copy `source` to the new file `tmp` through the engine at the mover's rate, keep the
    /// shard's access time as the copy's mtime, fsync it, and verify every block of the copy.
    async fn copy_verified(
        &self,
        id: &ShardId,
        source: &Path,
        tmp: &Path,
        loc: Location,
        target: usize,
    ) -> Result<()> {
        let io = |what: &str, path: &Path, e: std::io::Error| {
            CairnError::from_io(&format!("{what} {}", path.display()), &e)
        };
        let src = self.open_shard(loc.dir, source).await.map_err(|e| io("open", source, e))?;
        let dst = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(tmp)
            .await
            .map_err(|e| io("create", tmp, e))?;
        let dst = Arc::new(dst.into_std().await);
        let mut at = 0u64;
        // Just read whole (and verified) with O_DIRECT by a client: copy those bytes rather
        // than read the HDD again. The copy is verified below all the same.
        let read_back = self.read_back.lock().take(id, loc.file_len);
        if let Some(bytes) = read_back {
            self.limiter.take(bytes.len() as u64).await;
            self.engine.write_at(dst.clone(), 0, bytes).await.map_err(|e| io("write", tmp, e))?;
            at = loc.file_len;
        }
        while at < loc.file_len {
            let n = COPY_CHUNK.min((loc.file_len - at) as usize);
            self.limiter.take(n as u64).await;
            let data = src.read_at(self.engine.as_ref(), at, n).await.map_err(|e| io("read", source, e))?;
            if data.len() != n {
                return Err(CairnError::corrupt(format!(
                    "shard {id}: {} is shorter than the {} bytes indexed",
                    source.display(),
                    loc.file_len
                )));
            }
            self.engine
                .write_at(dst.clone(), at, Bytes::from(data))
                .await
                .map_err(|e| io("write", tmp, e))?;
            at += n as u64;
        }
        let mtime = std::time::UNIX_EPOCH + Duration::from_millis(loc.last_access);
        if let Err(e) = dst.set_modified(mtime) {
            tracing::debug!(path = %tmp.display(), "cannot set the copy's mtime: {e}");
        }
        self.engine.fsync(dst.clone()).await.map_err(|e| io("fsync", tmp, e))?;
        let copy = ShardFile { file: dst, direct: false };
        verify_file(self.engine.as_ref(), copy.clone(), id, Some(loc.file_len)).await?;
        self.written_to(target, &copy.file);
        Ok(())
    }

    /// Move the named shards to SSD now (`cairn warmup`), up to the SSD capacity, with no
    /// eviction and no pin ([`ShardStore::promote_with`]).
    pub async fn promote(&self, ids: &[ShardId]) -> Result<PromoteSummary> {
        self.promote_with(ids, PromoteOptions::default()).await
    }

    /// Move the named shards to SSD now. A shard that does not fit makes room by demoting
    /// others when `opts.evict` allows (see [`PromoteOptions`]). A tier that cannot fit it
    /// even then (`NoSpace`), or a move that fails, stops the request there: the summary
    /// says why and what was done before. Errors are for requests that are wrong as a whole.
    pub async fn promote_with(&self, ids: &[ShardId], opts: PromoteOptions) -> Result<PromoteSummary> {
        for id in ids {
            id.validate()?;
        }
        if !self.has_tier(Tier::Ssd) {
            return Err(CairnError::new(
                ErrorKind::NoSpace,
                "this chunkserver has no SSD tier to promote to",
            ));
        }
        let spared_since = self.warmup_started(opts.session);
        let named: std::collections::HashSet<ShardId> = ids.iter().copied().collect();
        let mut done = PromoteSummary::default();
        for (n, id) in ids.iter().enumerate() {
            let _claim = self.claim(*id).await;
            let Some(loc) = self.location(id) else {
                done.missing += 1;
                continue;
            };
            if self.dirs[loc.dir].tier == Tier::Ssd {
                // Part of this warmup now: spared by its later evictions, like a promoted one.
                self.touch(id);
                done.already += 1;
                continue;
            }
            let room = self.ssd_room_for(loc.file_len)
                || (opts.evict && self.evict(loc.file_len, &named, spared_since, &mut done).await);
            let moved = if room {
                self.move_claimed(*id, loc, Tier::Ssd).await
            } else {
                let (used, capacity) = self.tier_fill(Tier::Ssd);
                Err(CairnError::new(
                    ErrorKind::NoSpace,
                    format!(
                        "{used} of {capacity} bytes used, shard {id} needs {}{}",
                        loc.file_len,
                        if opts.evict { " and the rest is pinned or part of this warmup" } else { "" }
                    ),
                ))
            };
            match moved {
                Ok(bytes) => {
                    done.promoted += 1;
                    done.bytes += bytes;
                }
                Err(e) => {
                    let full = e.kind() == ErrorKind::NoSpace;
                    let what = if full { "the SSD tier is full" } else { "promotion failed" };
                    done.stopped = Some(CairnError::new(e.kind(), format!("{what}: {}", e.message())));
                    done.not_looked_at = (ids.len() - n) as u32;
                    return Ok(done);
                }
            }
        }
        Ok(done)
    }

    /// Note `id` as used now (for the LRU order and warmup sessions).
    fn touch(&self, id: &ShardId) {
        let now = self.clock.now_ms();
        if let Some(loc) = self.index.lock().shards.get_mut(id) {
            loc.last_access = loc.last_access.max(now);
        }
    }

    /// When (store clock) warmup `session` began on this chunkserver: shards used since are
    /// spared by its evictions. Without a session, now.
    fn warmup_started(&self, session: u64) -> u64 {
        let now = self.clock.now_ms();
        if session == 0 {
            return now;
        }
        let mut warmups = self.warmups.lock();
        warmups.retain(|_, (_, last)| now.saturating_sub(*last) < WARMUP_SESSION_IDLE_MS);
        let (started, last) = warmups.entry(session).or_insert((now, now));
        *last = now;
        *started
    }

    /// The SSD tier has room for `len` more bytes.
    fn ssd_room_for(&self, len: u64) -> bool {
        let (used, capacity) = self.tier_fill(Tier::Ssd);
        used + len <= capacity
    }

    /// Demote least recently used SSD shards, none of them pinned, in `named` or used since
    /// `spared_since`, until a shard of `len` bytes fits; nothing when they cannot free that
    /// much. True when the room is there.
    async fn evict(
        &self,
        len: u64,
        named: &std::collections::HashSet<ShardId>,
        spared_since: u64,
        done: &mut PromoteSummary,
    ) -> bool {
        // A victim another move holds (the mover demoting the same least recently used
        // shards) is skipped: look again, a few times, before calling the tier full.
        for _ in 0..EVICT_ROUNDS {
            if self.ssd_room_for(len) {
                return true;
            }
            let (used, capacity) = self.tier_fill(Tier::Ssd);
            let need = (used + len).saturating_sub(capacity);
            let candidates: Vec<(ShardId, u64, u64)> = self
                .demotable_ssd_shards()
                .into_iter()
                .filter(|(id, at, _)| *at < spared_since && !named.contains(id))
                .collect();
            let sizes: std::collections::HashMap<ShardId, u64> =
                candidates.iter().map(|&(id, _, len)| (id, len)).collect();
            let victims = self.policy.pick_demotions(candidates, need);
            if victims.iter().map(|id| sizes[id]).sum::<u64>() < need {
                return false;
            }
            let mut report = PassReport::default();
            self.demote(&victims, &mut report).await;
            done.evicted += report.demoted;
            done.evicted_bytes += report.bytes;
            if report.demoted > 0 {
                tracing::info!(
                    shards = report.demoted,
                    bytes = report.bytes,
                    "demoted shards to make room for a warmup"
                );
            }
            if (report.demoted as usize) < victims.len() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.ssd_room_for(len)
    }

    /// One round of the mover: demote least recently used SSD shards while SSD use is above
    /// the high watermark (down to the low one), then promote hot HDD shards while SSD use
    /// stays under the high watermark, making room for them by demoting SSD shards not read
    /// within the promotion window (never recently read ones). Shards busy with a write, delete or move are skipped
    /// until the next pass; a failed move is logged and counted, never fatal.
    pub async fn mover_pass(&self) -> PassReport {
        let mut report = PassReport::default();
        if !self.has_tier(Tier::Ssd) || !self.has_tier(Tier::Hdd) {
            return report;
        }
        let (used, capacity) = self.tier_fill(Tier::Ssd);
        let goal = self.policy.demotion_goal(used, capacity);
        if goal > 0 {
            tracing::info!(used, capacity, goal, "SSD tier above its high watermark: demoting");
            let picked = self.policy.pick_demotions(self.demotable_ssd_shards(), goal);
            self.demote(&picked, &mut report).await;
        }

        let now = self.clock.now_ms();
        let hot = {
            let mut index = self.index.lock();
            index.hot.prune(&self.policy, now);
            index.hot.hot(&self.policy, now)
        };
        for id in hot {
            let Some(loc) = self.location(&id) else { continue };
            let (used, capacity) = self.tier_fill(Tier::Ssd);
            let room = self.policy.promotion_room(used, capacity);
            if loc.file_len > room && !self.displace_cold(loc.file_len - room, now, &mut report).await {
                continue;
            }
            match self.move_if_free(id, Tier::Ssd).await {
                Some(Ok(bytes)) => {
                    report.promoted += 1;
                    report.bytes += bytes;
                }
                Some(Err(e)) => {
                    report.failed += 1;
                    tracing::warn!(shard = %id, "promotion failed: {e}");
                }
                None => {}
            }
        }
        report
    }

    /// Make `need` bytes of room on the SSD tier for a hot shard by demoting cold SSD shards
    /// ([`TierPolicy::pick_displacements`]). False when there are not enough cold ones or a
    /// demotion failed.
    async fn displace_cold(&self, need: u64, now: u64, report: &mut PassReport) -> bool {
        let Some(victims) = self.policy.pick_displacements(self.demotable_ssd_shards(), need, now) else {
            return false;
        };
        tracing::debug!(need, shards = victims.len(), "SSD tier full: demoting cold shards for a hot one");
        self.demote(&victims, report).await == victims.len()
    }

    /// `(id, last access, file bytes)` of every shard on the SSD tier that may be demoted:
    /// all but those of pinned files.
    fn demotable_ssd_shards(&self) -> Vec<(ShardId, u64, u64)> {
        let pinned = self.pins.snapshot();
        let index = self.index.lock();
        (index.shards.iter())
            .filter(|(id, loc)| self.dirs[loc.dir].tier == Tier::Ssd && !pinned.contains(&id.ino))
            .map(|(id, loc)| (*id, loc.last_access, loc.file_len))
            .collect()
    }

    /// Move `ids` to HDD, counting in `report`; a shard busy with other work is skipped, and a
    /// full HDD tier stops the rest. Returns how many moved.
    async fn demote(&self, ids: &[ShardId], report: &mut PassReport) -> usize {
        let mut moved = 0;
        for &id in ids {
            match self.move_if_free(id, Tier::Hdd).await {
                Some(Ok(bytes)) => {
                    report.demoted += 1;
                    report.bytes += bytes;
                    moved += 1;
                }
                Some(Err(e)) => {
                    report.failed += 1;
                    tracing::warn!(shard = %id, "demotion failed: {e}");
                    if e.kind() == ErrorKind::NoSpace {
                        break;
                    }
                }
                None => {}
            }
        }
        moved
    }

    /// Shards hot enough to be promoted and not moved yet (the mover's backlog).
    pub fn promotion_backlog(&self) -> usize {
        let now = self.clock.now_ms();
        self.index.lock().hot.hot(&self.policy, now).len()
    }

    /// Move `id` to `to` unless someone holds its claim or it is already there or gone
    /// (`None`: nothing done).
    async fn move_if_free(&self, id: ShardId, to: Tier) -> Option<Result<u64>> {
        let _claim = self.try_claim(id)?;
        let loc = self.location(&id)?;
        if self.dirs[loc.dir].tier == to {
            self.index.lock().hot.forget(&id);
            return None;
        }
        Some(self.move_claimed(id, loc, to).await)
    }

    /// Settle shards found in two directories at open (a move cut short between rename and
    /// delete): keep the indexed copy (SSD when there is one) if it verifies, else the other
    /// one if it does, and delete the loser. When neither verifies both files stay for a human.
    pub(crate) async fn settle_duplicates(&self, duplicates: Vec<(ShardId, Location)>) {
        for (id, extra) in duplicates {
            let Some(kept) = self.location(&id) else { continue };
            let (keep, drop) = if self.verify_at(&id, kept).await.is_ok() {
                (kept, extra)
            } else if self.verify_at(&id, extra).await.is_ok() {
                self.index.lock().insert(id, extra);
                (extra, kept)
            } else {
                tracing::error!(
                    shard = %id,
                    a = %self.path(kept.dir, &id).display(),
                    b = %self.path(extra.dir, &id).display(),
                    "both copies of a shard fail verification; keeping both files"
                );
                continue;
            };
            let loser = self.path(drop.dir, &id);
            match tokio::fs::remove_file(&loser).await {
                Ok(()) => {
                    tracing::info!(
                        shard = %id,
                        kept = %self.path(keep.dir, &id).display(),
                        removed = %loser.display(),
                        "settled a shard left in two tiers by an interrupted move"
                    );
                    if let Some(parent) = loser.parent() {
                        if let Err(e) = self.fsync_dir(parent).await {
                            tracing::warn!("{e}");
                        }
                    }
                }
                Err(e) => tracing::warn!(path = %loser.display(), "cannot remove a duplicate shard: {e}"),
            }
        }
    }

    async fn verify_at(&self, id: &ShardId, loc: Location) -> Result<ShardHeader> {
        let path = self.path(loc.dir, id);
        let file = self
            .open_shard(loc.dir, &path)
            .await
            .map_err(|e| CairnError::from_io(&format!("open {}", path.display()), &e))?;
        let result = verify_file(self.engine.as_ref(), file, id, None).await;
        if let Err(e) = &result {
            tracing::warn!(path = %path.display(), "shard copy fails verification: {e}");
        }
        result
    }
}

async fn remove_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "cannot remove a partial copy: {e}");
        }
    }
}

/// Run [`ShardStore::mover_pass`] every `interval` until the task is aborted.
pub fn spawn(store: Arc<ShardStore>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let report = store.mover_pass().await;
            if report != PassReport::default() {
                tracing::info!(
                    demoted = report.demoted,
                    promoted = report.promoted,
                    bytes = report.bytes,
                    failed = report.failed,
                    "mover pass"
                );
            }
        }
    })
}

#[cfg(test)]
#[path = "mover_tests.rs"]
mod tests;
