//! Moving shards between tiers: the background mover that demotes least recently used shards
//! from SSD to HDD above the high watermark and promotes hot HDD shards back, the `Promote`
//! request behind `cairn warmup`, and the pins that keep files on SSD. A [`Mover`] holds the
//! store and works through its narrow API (claims, locations, directories, `record_move`);
//! the store knows nothing of the mover.
//!
//! A move never leaves a shard unreadable or present nowhere. Holding the shard's claim (so no
//! write or delete of that id interleaves), it copies the file through the [`IoEngine`] to
//! `{target bucket}/{name}.tmp-move-{random}`, fsyncs it, verifies the header and every block
//! checksum of the copy, renames it into place and fsyncs the bucket directory; only then does
//! the index switch to the new directory, and only then is the source deleted (and its
//! directory fsynced). A crash before the rename leaves a temp file, removed at open; a crash
//! between rename and delete leaves a valid copy in both tiers, settled when the store opens
//! (`store/recovery.rs`): the SSD copy is kept when it verifies, otherwise the
//! other one. Reads never wait for a move: the source file stays in place until the index
//! points at the copy, and a read that finds the source gone looks the shard up again.
//!
//! Every byte copied, by the mover or by `Promote`, passes one [`RateLimiter`].
//!
//! [`IoEngine`]: crate::engine::IoEngine

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::config::ChunkConfig;
use cairn_common::{CairnError, ErrorKind, Result, ShardId};
use parking_lot::Mutex;

use crate::pins::Pins;
use crate::store::{Location, ShardFile, ShardStore, Tier};
use crate::throttle::RateLimiter;

/// Bytes per copy step (a whole number of checksum blocks).
const COPY_CHUNK: usize = 16 * BLOCK_SIZE;

/// What the mover needs from the configuration.
#[derive(Clone, Debug)]
pub struct MoverOptions {
    /// Most bytes per second copied between tiers, by the mover and `Promote` together.
    pub rate_bytes: u64,
    /// Where the pinned files are kept (`pins.rs`); `None`: in memory only.
    pub pins_file: Option<PathBuf>,
}

impl MoverOptions {
    pub fn from_config(config: &ChunkConfig) -> MoverOptions {
        MoverOptions { rate_bytes: config.mover_rate_bytes, pins_file: Some(config.state_dir.join("pins")) }
    }
}

/// Moves shards of one [`ShardStore`] between its tiers: the background passes, `Promote`
/// and the pins that keep files on SSD.
pub struct Mover {
    store: Arc<ShardStore>,
    /// Shared by every copy between tiers (passes and `Promote`).
    limiter: RateLimiter,
    /// Files whose shards stay on SSD (`cairn warmup --pin`).
    pins: Pins,
    /// Warmup sessions: when (store clock, ms) each was first and last seen. What a session
    /// promoted, or what was used since it began, is not evicted for it.
    warmups: Mutex<HashMap<u64, (u64, u64)>>,
}

/// What [`Mover::move_shard`] did.
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

impl Mover {
    /// A mover for `store`, with the pins kept where `options` says.
    pub fn new(store: Arc<ShardStore>, options: MoverOptions) -> Result<Mover> {
        Ok(Mover {
            store,
            limiter: RateLimiter::new(options.rate_bytes),
            pins: Pins::load(options.pins_file)?,
            warmups: Mutex::new(HashMap::new()),
        })
    }

    /// The files whose shards stay on SSD.
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Move shard `id` to `to` now, waiting for any write, delete or move of it to finish.
    /// `NoSpace` when no directory of `to` has room.
    pub async fn move_shard(&self, id: ShardId, to: Tier) -> Result<MoveOutcome> {
        id.validate()?;
        let _claim = self.store.claim(id).await;
        let Some(loc) = self.store.location(&id) else { return Ok(MoveOutcome::Missing) };
        if self.store.dir_tier(loc.dir) == to {
            return Ok(MoveOutcome::Already);
        }
        self.move_claimed(id, loc, to).await.map(MoveOutcome::Moved)
    }

    /// The move itself (see the module doc); the caller holds the claim on `id`, which is at
    /// `loc`. Returns the bytes moved.
    async fn move_claimed(&self, id: ShardId, loc: Location, to: Tier) -> Result<u64> {
        let target = self.store.pick_dir_from(&id, loc.file_len, &self.store.rotation(to))?;
        let source = self.store.path(loc.dir, &id);
        let dest = self.store.path(target, &id);
        let tmp = dest.with_file_name(format!("{}.tmp-move-{:016x}", id.file_name(), rand::random::<u64>()));
        if let Err(e) = self.copy_verified(&id, &source, &tmp, loc, target).await {
            remove_quietly(&tmp).await;
            tracing::warn!(shard = %id, from = %source.display(), "move to {} aborted: {e}", to.as_str());
            return Err(e);
        }
        let bucket = self.store.bucket(target, &id);
        let placed = match tokio::fs::rename(&tmp, &dest).await {
            Ok(()) => self.store.fsync_dir(&bucket).await,
            Err(e) => Err(CairnError::from_io(&format!("rename {} into place", tmp.display()), &e)),
        };
        if let Err(e) = placed {
            // The index still names the source, which is intact; drop the copy.
            remove_quietly(&tmp).await;
            remove_quietly(&dest).await;
            return Err(e);
        }

        self.store.record_move(id, loc, target, to);

        match tokio::fs::remove_file(&source).await {
            Ok(()) => {
                if let Some(parent) = source.parent() {
                    if let Err(e) = self.store.fsync_dir(parent).await {
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
        let src = self.store.open_shard(loc.dir, source).await.map_err(|e| io("open", source, e))?;
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
        let read_back = self.store.take_read_back(id, loc.file_len);
        if let Some(bytes) = read_back {
            self.limiter.take(bytes.len() as u64).await;
            self.store.engine().write_at(dst.clone(), 0, bytes).await.map_err(|e| io("write", tmp, e))?;
            at = loc.file_len;
        }
        while at < loc.file_len {
            let n = COPY_CHUNK.min((loc.file_len - at) as usize);
            self.limiter.take(n as u64).await;
            let data = src.read_at(self.store.engine(), at, n).await.map_err(|e| io("read", source, e))?;
            if data.len() != n {
                return Err(CairnError::corrupt(format!(
                    "shard {id}: {} is shorter than the {} bytes indexed",
                    source.display(),
                    loc.file_len
                )));
            }
            self.store
                .engine()
                .write_at(dst.clone(), at, Bytes::from(data))
                .await
                .map_err(|e| io("write", tmp, e))?;
            at += n as u64;
        }
        let mtime = std::time::UNIX_EPOCH + Duration::from_millis(loc.last_access);
        if let Err(e) = dst.set_modified(mtime) {
            tracing::debug!(path = %tmp.display(), "cannot set the copy's mtime: {e}");
        }
        self.store.engine().fsync(dst.clone()).await.map_err(|e| io("fsync", tmp, e))?;
        let copy = ShardFile { file: dst, direct: false };
        copy.verify(self.store.engine(), id, Some(loc.file_len), None).await?;
        self.store.written_to(target, &copy.file);
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
        if !self.store.has_tier(Tier::Ssd) {
            return Err(CairnError::new(
                ErrorKind::NoSpace,
                "this chunkserver has no SSD tier to promote to",
            ));
        }
        let spared_since = self.warmup_started(opts.session);
        let named: HashSet<ShardId> = ids.iter().copied().collect();
        let mut done = PromoteSummary::default();
        for (n, id) in ids.iter().enumerate() {
            let _claim = self.store.claim(*id).await;
            let Some(loc) = self.store.location(id) else {
                done.missing += 1;
                continue;
            };
            if self.store.dir_tier(loc.dir) == Tier::Ssd {
                // Part of this warmup now: spared by its later evictions, like a promoted one.
                self.store.touch(id);
                done.already += 1;
                continue;
            }
            let room = self.ssd_room_for(loc.file_len)
                || (opts.evict && self.evict(loc.file_len, &named, spared_since, &mut done).await);
            let moved = if room {
                self.move_claimed(*id, loc, Tier::Ssd).await
            } else {
                let (used, capacity) = self.store.tier_fill(Tier::Ssd);
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

    /// When (store clock) warmup `session` began on this chunkserver: shards used since are
    /// spared by its evictions. Without a session, now.
    fn warmup_started(&self, session: u64) -> u64 {
        let now = self.store.now_ms();
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
        let (used, capacity) = self.store.tier_fill(Tier::Ssd);
        used + len <= capacity
    }

    /// Demote least recently used SSD shards, none of them pinned, in `named` or used since
    /// `spared_since`, until a shard of `len` bytes fits; nothing when they cannot free that
    /// much. True when the room is there.
    async fn evict(
        &self,
        len: u64,
        named: &HashSet<ShardId>,
        spared_since: u64,
        done: &mut PromoteSummary,
    ) -> bool {
        // A victim another move holds (the mover demoting the same least recently used
        // shards) is skipped: look again, a few times, before calling the tier full.
        for _ in 0..EVICT_ROUNDS {
            if self.ssd_room_for(len) {
                return true;
            }
            let (used, capacity) = self.store.tier_fill(Tier::Ssd);
            let need = (used + len).saturating_sub(capacity);
            let candidates: Vec<(ShardId, u64, u64)> = self
                .demotable_ssd_shards()
                .into_iter()
                .filter(|(id, at, _)| *at < spared_since && !named.contains(id))
                .collect();
            let sizes: HashMap<ShardId, u64> = candidates.iter().map(|&(id, _, len)| (id, len)).collect();
            let victims = self.store.policy().pick_demotions(candidates, need);
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
    pub async fn pass(&self) -> PassReport {
        let mut report = PassReport::default();
        if !self.store.has_tier(Tier::Ssd) || !self.store.has_tier(Tier::Hdd) {
            return report;
        }
        let (used, capacity) = self.store.tier_fill(Tier::Ssd);
        let goal = self.store.policy().demotion_goal(used, capacity);
        if goal > 0 {
            tracing::info!(used, capacity, goal, "SSD tier above its high watermark: demoting");
            let picked = self.store.policy().pick_demotions(self.demotable_ssd_shards(), goal);
            self.demote(&picked, &mut report).await;
        }

        let now = self.store.now_ms();
        let hot = self.store.hot_shards(now);
        for id in hot {
            let Some(loc) = self.store.location(&id) else { continue };
            let (used, capacity) = self.store.tier_fill(Tier::Ssd);
            let room = self.store.policy().promotion_room(used, capacity);
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
        let Some(victims) = self.store.policy().pick_displacements(self.demotable_ssd_shards(), need, now)
        else {
            return false;
        };
        tracing::debug!(need, shards = victims.len(), "SSD tier full: demoting cold shards for a hot one");
        self.demote(&victims, report).await == victims.len()
    }

    /// `(id, last access, file bytes)` of every shard on the SSD tier that may be demoted:
    /// all but those of pinned files.
    fn demotable_ssd_shards(&self) -> Vec<(ShardId, u64, u64)> {
        let pinned = self.pins.snapshot();
        let mut shards = self.store.shards_on(Tier::Ssd);
        shards.retain(|(id, _, _)| !pinned.contains(&id.ino));
        shards
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

    /// Move `id` to `to` unless someone holds its claim or it is already there or gone
    /// (`None`: nothing done).
    async fn move_if_free(&self, id: ShardId, to: Tier) -> Option<Result<u64>> {
        let _claim = self.store.try_claim(id)?;
        let loc = self.store.location(&id)?;
        if self.store.dir_tier(loc.dir) == to {
            self.store.forget_hot(&id);
            return None;
        }
        Some(self.move_claimed(id, loc, to).await)
    }
}

async fn remove_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "cannot remove a partial copy: {e}");
        }
    }
}

/// Run [`Mover::pass`] every `interval` until the task is aborted.
pub fn spawn(mover: Arc<Mover>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let report = mover.pass().await;
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
