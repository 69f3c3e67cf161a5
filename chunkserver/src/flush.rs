//! Batched shard durability (docs/ARCHITECTURE.md, "Durability"). Shard files are written and
//! renamed into place without an fsync; the flusher, one thread per store, makes them durable
//! in batches: every shard handed to it since its last batch is `fdatasync`ed in turn, then
//! every directory they were renamed into is fsynced once. A buffered write waits for nothing
//! (its batch starts at most `interval` after it); a durable write and `SyncShards` wait for
//! the next batch, so the durable writes of every client arriving together share one batch.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use crate::metrics;

/// How long a failed flush of an inode's shards is remembered: a `SyncShards` for it within
/// that time fails too, so a retried fsync cannot succeed over data that never reached the disk.
const FAILED_MEMORY: Duration = Duration::from_secs(600);

/// A batch starts as soon as this many shards wait, whatever the interval: each holds an open
/// file until it is flushed, and a burst of small files must not run out of descriptors.
const MAX_PENDING: usize = 1024;

/// Makes a file's data durable; `File::sync_data` except in tests that inject failures.
pub type SyncFile = Arc<dyn Fn(&File) -> io::Result<()> + Send + Sync>;

/// A shard file written and renamed into place, not yet on disk.
pub struct Unflushed {
    pub ino: u64,
    pub file: Arc<File>,
    /// Its final path (its parent is the directory fsynced).
    pub path: PathBuf,
    /// Its tier reads with O_DIRECT: drop its pages from the cache once on disk.
    pub direct: bool,
}

/// Someone waiting for the next batch, with the inode whose shards it needs on disk (`None`:
/// every shard, at shutdown).
struct Waiter {
    ino: Option<u64>,
    /// A `SyncShards` (fails while the inode's last failure is remembered), not a durable write
    /// (fails only when its own batch failed for the inode).
    sync: bool,
    done: oneshot::Sender<Result<()>>,
}

#[derive(Default)]
struct State {
    pending: Vec<Unflushed>,
    /// When the oldest pending shard was handed over.
    oldest: Option<Instant>,
    waiters: Vec<Waiter>,
    /// The inodes of the batch being flushed now, and its size.
    in_flight: HashSet<u64>,
    in_flight_shards: usize,
    /// Inodes whose shards failed to flush, and when.
    failed: HashMap<u64, Instant>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    interval: Duration,
    sync_file: SyncFile,
    /// `test_power_loss`: the file listing the shards not flushed yet.
    log: Option<PathBuf>,
}

/// The store's flusher; dropping it lets its thread flush what is pending and end.
pub struct Flusher {
    shared: Arc<Shared>,
}

impl Flusher {
    /// Start the flusher thread. `log`: keep the list of unflushed shards there (tests).
    pub fn start(interval: Duration, sync_file: SyncFile, log: Option<PathBuf>) -> Result<Flusher> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            interval,
            sync_file,
            log,
        });
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("cairn-flush".into())
            .spawn(move || thread.run())
            .map_err(|e| CairnError::from_io("start the shard flusher thread", &e))?;
        Ok(Flusher { shared })
    }

    /// Hand over a buffered shard: on disk within the interval.
    pub fn add(&self, shard: Unflushed) {
        let mut state = self.shared.state.lock();
        let first = state.pending.is_empty();
        self.shared.push(&mut state, shard);
        if first || state.pending.len() >= MAX_PENDING {
            self.shared.wake.notify_one();
        }
    }

    /// Hand over a shard and wait until its batch is on disk.
    pub async fn add_and_wait(&self, shard: Unflushed) -> Result<()> {
        let (done, wait) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            state.waiters.push(Waiter { ino: Some(shard.ino), sync: false, done });
            self.shared.push(&mut state, shard);
            self.shared.wake.notify_one();
        }
        self.wait(wait).await
    }

    /// Wait until every shard of `ino` handed over before this call is on disk: at once when
    /// none is waiting for a batch or in one.
    pub async fn sync_ino(&self, ino: u64) -> Result<()> {
        let (done, wait) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            let waiting = state.in_flight.contains(&ino) || state.pending.iter().any(|s| s.ino == ino);
            if !waiting {
                return failed_check(&mut state, ino);
            }
            state.waiters.push(Waiter { ino: Some(ino), sync: true, done });
            self.shared.wake.notify_one();
        }
        self.wait(wait).await
    }

    /// Put every shard handed over so far on disk (a chunkserver stopping).
    pub async fn flush_all(&self) -> Result<()> {
        let (done, wait) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            if state.pending.is_empty() && state.in_flight.is_empty() {
                return Ok(());
            }
            state.waiters.push(Waiter { ino: None, sync: false, done });
            self.shared.wake.notify_one();
        }
        self.wait(wait).await
    }

    /// Shards handed over and not yet on disk (a batch in flight included).
    pub fn unflushed(&self) -> usize {
        let state = self.shared.state.lock();
        state.pending.len() + state.in_flight_shards
    }

    async fn wait(&self, wait: oneshot::Receiver<Result<()>>) -> Result<()> {
        let started = Instant::now();
        let result = wait.await.unwrap_or_else(|_| Err(CairnError::internal("the shard flusher stopped")));
        ::metrics::histogram!(metrics::FLUSH_WAIT_SECONDS).record(started.elapsed().as_secs_f64());
        result
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
    }
}

/// `Err` when `ino`'s shards failed to flush lately (forgotten after [`FAILED_MEMORY`]).
fn failed_check(state: &mut State, ino: u64) -> Result<()> {
    match state.failed.get(&ino) {
        Some(at) if at.elapsed() < FAILED_MEMORY => Err(CairnError::new(
            ErrorKind::Io,
            format!("shards of inode {ino} could not be made durable (a flush failed on this chunkserver)"),
        )),
        Some(_) => {
            state.failed.remove(&ino);
            Ok(())
        }
        None => Ok(()),
    }
}

impl Shared {
    /// Add `shard` to the next batch (listed first under `test_power_loss`).
    fn push(&self, state: &mut State, shard: Unflushed) {
        self.note(&shard);
        state.oldest.get_or_insert_with(Instant::now);
        state.pending.push(shard);
        metrics::unflushed(state.pending.len());
    }

    /// The thread: wait for a batch to be due (a waiter, or the oldest shard `interval` old),
    /// flush it, answer its waiters; after a stop, flush what is left and end.
    fn run(self: Arc<Self>) {
        loop {
            let (batch, waiters) = {
                let mut state = self.state.lock();
                loop {
                    let full = state.pending.len() >= MAX_PENDING;
                    if full || !state.waiters.is_empty() || (state.stop && !state.pending.is_empty()) {
                        break;
                    }
                    if state.stop {
                        return;
                    }
                    match state.oldest {
                        Some(oldest) if oldest.elapsed() >= self.interval => break,
                        Some(oldest) => {
                            let left = self.interval.saturating_sub(oldest.elapsed());
                            self.wake.wait_for(&mut state, left);
                        }
                        None => self.wake.wait(&mut state),
                    }
                }
                let batch = std::mem::take(&mut state.pending);
                state.oldest = None;
                state.in_flight = batch.iter().map(|s| s.ino).collect();
                state.in_flight_shards = batch.len();
                (batch, std::mem::take(&mut state.waiters))
            };
            let started = Instant::now();
            let failed = self.flush(&batch);
            ::metrics::counter!(metrics::FLUSH_BATCHES).increment(1);
            ::metrics::counter!(metrics::FLUSHED_SHARDS).increment(batch.len() as u64);
            ::metrics::histogram!(metrics::FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
            let mut state = self.state.lock();
            state.in_flight.clear();
            state.in_flight_shards = 0;
            let now = Instant::now();
            state.failed.retain(|_, at| now.duration_since(*at) < FAILED_MEMORY);
            for ino in &failed {
                state.failed.insert(*ino, now);
            }
            self.rewrite_log(&state.pending);
            metrics::unflushed(state.pending.len());
            for waiter in waiters {
                let answer = match waiter.ino {
                    Some(ino) if waiter.sync || failed.contains(&ino) => failed_check(&mut state, ino),
                    None if !failed.is_empty() => Err(CairnError::new(
                        ErrorKind::Io,
                        format!("shards of {} inodes could not be made durable", failed.len()),
                    )),
                    _ => Ok(()),
                };
                let _ = waiter.done.send(answer);
            }
        }
    }

    /// Make `batch` durable; returns the inodes of the shards that could not be.
    fn flush(&self, batch: &[Unflushed]) -> HashSet<u64> {
        let mut failed = HashSet::new();
        let mut dirs: BTreeSet<&Path> = BTreeSet::new();
        for shard in batch {
            if let Err(e) = (self.sync_file)(&shard.file) {
                tracing::error!(path = %shard.path.display(), "fdatasync of a shard failed: {e}");
                failed.insert(shard.ino);
                continue;
            }
            if shard.direct {
                crate::engine::drop_cached(&shard.file);
            }
            if let Some(dir) = shard.path.parent() {
                dirs.insert(dir);
            }
        }
        for dir in dirs {
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                tracing::error!(dir = %dir.display(), "fsync of a shard directory failed: {e}");
                failed.extend(batch.iter().filter(|s| s.path.parent() == Some(dir)).map(|s| s.ino));
            }
        }
        if !failed.is_empty() {
            ::metrics::counter!(metrics::FLUSH_FAILURES).increment(1);
        }
        failed
    }

    /// `test_power_loss`: list a shard about to be handed over (appended; no fsync, the list
    /// only has to outlive the process).
    fn note(&self, shard: &Unflushed) {
        let Some(log) = &self.log else { return };
        let line = format!("{}\n", shard.path.display());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            tracing::error!(path = %log.display(), "test_power_loss: cannot list an unflushed shard: {e}");
        }
    }

    /// `test_power_loss`: the list becomes what is still pending.
    fn rewrite_log(&self, pending: &[Unflushed]) {
        let Some(log) = &self.log else { return };
        let text: String = pending.iter().map(|s| format!("{}\n", s.path.display())).collect();
        let tmp = log.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, log)) {
            tracing::error!(path = %log.display(), "test_power_loss: cannot rewrite the unflushed list: {e}");
        }
    }
}

/// `test_power_loss` at start: delete every shard file the list still names (a power loss would
/// have taken it back), then the list. Returns how many were deleted.
pub fn drop_unflushed(log: &Path) -> Result<usize> {
    let text = match std::fs::read_to_string(log) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(CairnError::from_io(&format!("read {}", log.display()), &e)),
    };
    let mut dropped = 0;
    for path in text.lines().filter(|l| !l.is_empty()).collect::<BTreeSet<_>>() {
        match std::fs::remove_file(path) {
            Ok(()) => dropped += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(CairnError::from_io(&format!("remove {path}"), &e)),
        }
    }
    std::fs::remove_file(log).map_err(|e| CairnError::from_io(&format!("remove {}", log.display()), &e))?;
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    fn shard(dir: &Path, ino: u64, n: u32) -> Unflushed {
        let path = dir.join(format!("{ino}-{n}"));
        std::fs::write(&path, b"data").unwrap();
        Unflushed { ino, file: Arc::new(File::open(&path).unwrap()), path, direct: false }
    }

    /// Poll `done` until it holds, failing after `secs`.
    async fn until(secs: u64, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn counting() -> (SyncFile, Arc<AtomicUsize>, Arc<AtomicBool>) {
        let count = Arc::new(AtomicUsize::new(0));
        let fail = Arc::new(AtomicBool::new(false));
        let (c, f) = (count.clone(), fail.clone());
        let sync: SyncFile = Arc::new(move |file: &File| {
            c.fetch_add(1, Ordering::SeqCst);
            if f.load(Ordering::SeqCst) {
                Err(io::Error::from_raw_os_error(libc::EIO))
            } else {
                file.sync_data()
            }
        });
        (sync, count, fail)
    }

    #[tokio::test]
    async fn buffered_shards_are_flushed_within_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, count, _) = counting();
        let flusher = Flusher::start(Duration::from_millis(100), sync, None).unwrap();
        flusher.add(shard(dir.path(), 1, 0));
        flusher.add(shard(dir.path(), 1, 1));
        assert_eq!(flusher.unflushed(), 2);
        assert_eq!(count.load(Ordering::SeqCst), 0, "nothing is flushed before the interval");
        until(5, "flushed within the interval", || flusher.unflushed() == 0).await;
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_full_batch_is_flushed_before_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, count, _) = counting();
        let flusher = Flusher::start(Duration::from_secs(60), sync, None).unwrap();
        for n in 0..MAX_PENDING as u32 {
            flusher.add(shard(dir.path(), 1, n));
        }
        until(10, "a full batch flushed before the interval", || count.load(Ordering::SeqCst) == MAX_PENDING)
            .await;
    }

    #[tokio::test]
    async fn a_durable_write_takes_the_buffered_ones_along_in_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, count, _) = counting();
        let flusher = Flusher::start(Duration::from_secs(60), sync, None).unwrap();
        flusher.add(shard(dir.path(), 1, 0));
        flusher.add(shard(dir.path(), 2, 0));
        flusher.add_and_wait(shard(dir.path(), 3, 0)).await.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 3);
        assert_eq!(flusher.unflushed(), 0);
    }

    #[tokio::test]
    async fn sync_ino_waits_only_when_that_inode_has_shards_pending() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, count, _) = counting();
        let flusher = Flusher::start(Duration::from_secs(60), sync, None).unwrap();
        flusher.sync_ino(7).await.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 0, "nothing pending: no flush");
        flusher.add(shard(dir.path(), 7, 0));
        tokio::time::timeout(Duration::from_secs(5), flusher.sync_ino(7)).await.unwrap().unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(flusher.unflushed(), 0);
        // At a stop: everything pending, whatever its inode.
        flusher.add(shard(dir.path(), 8, 0));
        flusher.add(shard(dir.path(), 9, 0));
        flusher.flush_all().await.unwrap();
        assert_eq!((count.load(Ordering::SeqCst), flusher.unflushed()), (3, 0));
        flusher.flush_all().await.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 3, "nothing pending: no batch");
    }

    #[tokio::test]
    async fn a_failed_flush_fails_the_waiters_and_later_syncs_of_that_inode() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, _, fail) = counting();
        let flusher = Flusher::start(Duration::from_secs(60), sync, None).unwrap();
        fail.store(true, Ordering::SeqCst);
        flusher.add(shard(dir.path(), 5, 0));
        let e = flusher.add_and_wait(shard(dir.path(), 6, 0)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        fail.store(false, Ordering::SeqCst);
        // Inode 5's shard was in the failed batch: an fsync of it after the failure still fails.
        let e = flusher.sync_ino(5).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        // Other inodes are not affected.
        flusher.add_and_wait(shard(dir.path(), 8, 0)).await.unwrap();
        flusher.sync_ino(9).await.unwrap();
    }

    #[tokio::test]
    async fn the_power_loss_list_names_exactly_the_unflushed_shards() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("unflushed");
        let (sync, _, _) = counting();
        let flusher = Flusher::start(Duration::from_secs(60), sync, Some(log.clone())).unwrap();
        let flushed = shard(dir.path(), 1, 0);
        let flushed_path = flushed.path.clone();
        flusher.add_and_wait(flushed).await.unwrap();
        let lost = shard(dir.path(), 2, 0);
        let lost_path = lost.path.clone();
        flusher.add(lost);
        let listed = std::fs::read_to_string(&log).unwrap();
        assert_eq!(listed, format!("{}\n", lost_path.display()));
        // What a restart after a power loss does.
        assert_eq!(drop_unflushed(&log).unwrap(), 1);
        assert!(!lost_path.exists() && !log.exists());
        assert!(flushed_path.exists(), "a flushed shard is never dropped");
    }

    #[test]
    fn drop_unflushed_removes_the_listed_files_and_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let log = dir.path().join("unflushed");
        std::fs::write(&log, format!("{}\n{}\n", a.display(), dir.path().join("gone").display())).unwrap();
        assert_eq!(drop_unflushed(&log).unwrap(), 1);
        assert!(!a.exists() && b.exists() && !log.exists());
        assert_eq!(drop_unflushed(&log).unwrap(), 0, "no list: nothing to drop");
    }
}
