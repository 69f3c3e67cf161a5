//! RocksDB [`MetaStore`]: one column family per [`Cf`], one `WriteBatch` per write, every batch
//! appended to the WAL (through the kernel: a killed process loses nothing) before `write`
//! returns. When the WAL is fsynced follows [`SyncMode`]: with `Always` every write waits for
//! it; with `Commit` durable batches wait for it and the others wake the group-commit thread,
//! which fsyncs the WAL 1 ms after something became unsynced (one fsync covers every write
//! before it, so one fsync serves the changes of that millisecond) while their answers go
//! out. With `raft/log.rs` (the Raft log's own database) the only modules of Cairn that import
//! `rocksdb`.
//!
//! **Fail-stop.** Once an fsync of the WAL fails (the group-commit thread's, a synced write's or
//! an explicit [`MetaStore::sync`]), the store refuses every later write and sync with an I/O
//! error until the process is restarted: after a failed fsync the kernel may have dropped the
//! dirty pages, and a retried fsync can report success without them (PostgreSQL's "fsyncgate"),
//! so no later change, and no garbage collection that relies on one, may be built on top. Reads
//! go on. A restart replays the WAL as it is on the disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_common::config::SyncMode;
use cairn_common::{CairnError, Result};
use parking_lot::{Condvar, Mutex};
use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions, DB,
};

use super::{Batch, Cf, MetaStore, Op, StoreView};

pub struct RocksStore {
    db: Arc<DB>,
    mode: SyncMode,
    /// Whether writes go through RocksDB's WAL (all but a Raft state machine's, whose log is
    /// the Raft log: [`RocksStore::open_state_machine`]).
    wal: bool,
    /// Why durability was lost (see the module's "Fail-stop"); shared with the group-commit thread.
    lost: Arc<DurabilityLost>,
    /// The group-commit thread (`Commit` mode).
    syncer: Option<(Arc<Syncer>, std::thread::JoinHandle<()>)>,
}

/// How long the group-commit thread lets changes gather before an fsync: fewer fsyncs (each a
/// flush of the disk's cache and, on a VM, exits to the host) for a loss window on power
/// failure of this much plus one fsync. `bench/rpcs.sh` with guest halt polling, alternated:
/// creates 3,232 / 3,506 / 3,331 → 4,075 / 4,979 / 4,882 per second, unlinks 3,355 / 3,447 /
/// 3,915 → 5,266 / 4,919 / 5,816; without halt polling no difference beyond the noise.
const GROUP_COMMIT_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// Set by the first failed fsync, never cleared.
#[derive(Default)]
struct DurabilityLost {
    reason: std::sync::OnceLock<String>,
    /// Held across every WAL flush (the group-commit thread's and [`MetaStore::sync`]'s) and
    /// the recording of its failure, so no flush can run, and "succeed" without the pages a
    /// failed one dropped, between a failure and its recording.
    flushing: Mutex<()>,
    /// Tests make fsyncs fail with this (a failing disk cannot be made here: no device-mapper).
    #[cfg(test)]
    inject: std::sync::atomic::AtomicBool,
}

impl DurabilityLost {
    /// `op` (an fsync, or a write with one), unless a test injected a failure.
    fn fsync<T>(
        &self,
        op: impl FnOnce() -> std::result::Result<T, rocksdb::Error>,
    ) -> std::result::Result<T, String> {
        #[cfg(test)]
        if self.inject.load(Ordering::SeqCst) {
            return Err("IO error: injected fsync failure".to_string());
        }
        op().map_err(|e| e.to_string())
    }

    /// A flush of the WAL (`what`, for the error): refused once durability was lost, and its
    /// failure recorded before any other flush may start.
    fn flush(&self, what: &str, db: &DB) -> Result<()> {
        let _serial = self.flushing.lock();
        self.check()?;
        self.fsync(|| db.flush_wal(true)).map_err(|e| {
            self.record(what, &e);
            CairnError::io(format!("metadata store: {what}: {e}"))
        })
    }

    fn record(&self, what: &str, e: &str) {
        let reason = format!("{what} failed: {e}");
        if self.reason.set(reason.clone()).is_ok() {
            tracing::error!(
                "metadata store: {reason}; refusing every change from now on (restart the metaserver \
                 once the disk is fixed: the WAL is replayed as it is on the disk)"
            );
        }
    }

    fn check(&self) -> Result<()> {
        match self.reason.get() {
            None => Ok(()),
            Some(reason) => Err(CairnError::io(format!(
                "metadata store refuses changes since {reason}; restart the metaserver once the disk is fixed"
            ))),
        }
    }
}

/// What the group-commit thread waits on.
#[derive(Default)]
struct Syncer {
    state: Mutex<SyncState>,
    wake: Condvar,
    /// WAL fsyncs the thread has done.
    syncs: AtomicU64,
}

#[derive(Default)]
struct SyncState {
    /// Writes since the last fsync started.
    dirty: bool,
    stop: bool,
}

impl Syncer {
    fn mark_dirty(&self) {
        let mut state = self.state.lock();
        if !state.dirty {
            state.dirty = true;
            self.wake.notify_one();
        }
    }

    fn run(&self, db: &DB, lost: &DurabilityLost) {
        loop {
            {
                let mut state = self.state.lock();
                while !state.dirty && !state.stop {
                    self.wake.wait(&mut state);
                }
                if !state.dirty {
                    return;
                }
            }
            // Let the changes of the next moment join this fsync.
            std::thread::sleep(GROUP_COMMIT_DELAY);
            self.state.lock().dirty = false;
            let result = lost.flush("the group-commit fsync of the WAL", db);
            self.syncs.fetch_add(1, Ordering::Relaxed);
            if result.is_err() {
                // Nothing more to sync: every later write is refused.
                return;
            }
        }
    }
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        if let Some((syncer, thread)) = self.syncer.take() {
            syncer.state.lock().stop = true;
            syncer.wake.notify_one();
            let _ = thread.join();
        }
    }
}

/// Read options that stop before `end` (nothing: to the end).
fn bounded(end: &[u8]) -> ReadOptions {
    let mut read = ReadOptions::default();
    if !end.is_empty() {
        read.set_iterate_upper_bound(end.to_vec());
    }
    read
}

fn collect(
    iter: impl Iterator<Item = std::result::Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for item in iter.take(limit) {
        let (k, v) = item.map_err(|e| db_error("scan", e))?;
        out.push((k.into_vec(), v.into_vec()));
    }
    Ok(out)
}

/// A RocksDB snapshot: reads see the database as of when it was taken.
struct RocksView<'a> {
    store: &'a RocksStore,
    snapshot: rocksdb::Snapshot<'a>,
}

impl StoreView for RocksView<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.snapshot.get_cf(self.store.cf(cf)?, key).map_err(|e| db_error("get", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !end.is_empty() && end <= start {
            return Ok(Vec::new());
        }
        let mode = IteratorMode::From(start, Direction::Forward);
        collect(self.snapshot.iterator_cf_opt(self.store.cf(cf)?, bounded(end), mode), limit)
    }
}

fn db_error(context: &str, e: rocksdb::Error) -> CairnError {
    CairnError::io(format!("metadata store: {context}: {e}"))
}

impl RocksStore {
    /// Open (creating if needed) the database in `path`. A database held by another process,
    /// or one that cannot be read, is a clear error.
    pub fn open(path: &Path, mode: SyncMode) -> Result<RocksStore> {
        Self::open_with(path, mode, true)
    }

    /// Open (creating if needed) a Raft state machine's database in `path`: written without
    /// RocksDB's WAL, because every write is the effect of a log entry that the Raft log holds
    /// synced (`docs/ARCHITECTURE.md`, "On disk", `sm/`). What survives a crash is the last
    /// flush, and flushes are atomic across column families, so the state and its applied log
    /// id (in the same batch) are always of one moment; openraft re-applies the rest from the
    /// log at start. Flushes happen when memtables fill, at every snapshot (a checkpoint
    /// flushes first; the log is purged only up to a snapshot) and when the database closes.
    pub fn open_state_machine(path: &Path) -> Result<RocksStore> {
        Self::open_with(path, SyncMode::Never, false)
    }

    fn open_with(path: &Path, mode: SyncMode, wal: bool) -> Result<RocksStore> {
        std::fs::create_dir_all(path).map_err(|e| {
            CairnError::from_io(&format!("cannot create metadata directory {}", path.display()), &e)
        })?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_atomic_flush(!wal);
        let cfs = Cf::ALL.iter().map(|cf| ColumnFamilyDescriptor::new(cf.name(), Options::default()));
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| {
            CairnError::io(format!("cannot open metadata database at {}: {e}", path.display()))
        })?;
        let db = Arc::new(db);
        let lost = Arc::new(DurabilityLost::default());
        let syncer = (mode == SyncMode::Commit)
            .then(|| -> Result<_> {
                let syncer = Arc::new(Syncer::default());
                let (s, d, l) = (syncer.clone(), db.clone(), lost.clone());
                let thread = std::thread::Builder::new()
                    .name("cairn-wal-sync".into())
                    .spawn(move || s.run(&d, &l))
                    .map_err(|e| CairnError::from_io("cannot start the WAL sync thread", &e))?;
                Ok((syncer, thread))
            })
            .transpose()?;
        Ok(RocksStore { db, mode, wal, lost, syncer })
    }

    /// Open the database in `path` for reading only (a checkpoint being turned into a Raft
    /// snapshot): no lock taken, nothing written, every `write` an error.
    pub fn open_read_only(path: &Path) -> Result<RocksStore> {
        let opts = Options::default();
        let names = Cf::ALL.iter().map(|cf| cf.name());
        let db = DB::open_cf_for_read_only(&opts, path, names, false).map_err(|e| {
            CairnError::io(format!("cannot open metadata database at {} to read: {e}", path.display()))
        })?;
        Ok(RocksStore {
            db: Arc::new(db),
            mode: SyncMode::Never,
            wal: true,
            lost: Default::default(),
            syncer: None,
        })
    }

    /// Write a checkpoint of the database into `dir` (which must not exist): the memtables are
    /// flushed, then every SST file is hard-linked (copied across filesystems) with a manifest
    /// of exactly those files, so `dir` opens as the database as of this moment.
    pub fn checkpoint(&self, dir: &Path) -> Result<()> {
        let checkpoint =
            rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(|e| db_error("checkpoint", e))?;
        checkpoint
            .create_checkpoint(dir)
            .map_err(|e| db_error(&format!("checkpoint into {}", dir.display()), e))
    }

    /// WAL fsyncs done by the group-commit thread so far.
    pub fn background_syncs(&self) -> u64 {
        self.syncer.as_ref().map_or(0, |(s, _)| s.syncs.load(Ordering::Relaxed))
    }

    fn cf(&self, cf: Cf) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| CairnError::internal(format!("column family {} missing", cf.name())))
    }
}

/// RocksDB integer properties exported as metrics (summed over column families where per-CF).
const PROPERTIES: [(&str, &str); 7] = [
    ("live_data_bytes", "rocksdb.estimate-live-data-size"),
    ("sst_bytes", "rocksdb.total-sst-files-size"),
    ("memtable_bytes", "rocksdb.cur-size-all-mem-tables"),
    ("estimated_keys", "rocksdb.estimate-num-keys"),
    ("pending_compaction_bytes", "rocksdb.estimate-pending-compaction-bytes"),
    ("write_stopped", "rocksdb.is-write-stopped"),
    ("delayed_write_rate", "rocksdb.actual-delayed-write-rate"),
];

impl MetaStore for RocksStore {
    fn properties(&self) -> Vec<(&'static str, u64)> {
        let mut props: Vec<_> = PROPERTIES
            .iter()
            .map(|(name, prop)| {
                let total = Cf::ALL
                    .iter()
                    .filter_map(|cf| self.cf(*cf).ok())
                    .filter_map(|h| self.db.property_int_value_cf(h, *prop).ok().flatten())
                    .sum();
                (*name, total)
            })
            .collect();
        props.push(("background_wal_syncs", self.background_syncs()));
        props.push(("durability_lost", self.lost.reason.get().is_some() as u64));
        props
    }

    fn checkpoint_into(&self, dir: &Path) -> Result<()> {
        self.checkpoint(dir)
    }

    fn dir(&self) -> Option<std::path::PathBuf> {
        Some(self.db.path().to_path_buf())
    }

    fn durability_lost(&self) -> Option<String> {
        self.lost.reason.get().cloned()
    }

    fn sync(&self) -> Result<()> {
        self.lost.check()?;
        if self.mode == SyncMode::Never {
            return Ok(());
        }
        self.lost.flush("an fsync of the WAL", &self.db)
    }

    fn syncs_every_write(&self) -> bool {
        self.mode == SyncMode::Always
    }

    fn with_view(&self, f: &mut dyn FnMut(&dyn StoreView) -> Result<()>) -> Result<()> {
        let view = RocksView { store: self, snapshot: self.db.snapshot() };
        f(&view)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.cf(cf)?, key).map_err(|e| db_error("get", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !end.is_empty() && end <= start {
            return Ok(Vec::new());
        }
        let iter = self.db.iterator_cf_opt(
            self.cf(cf)?,
            bounded(end),
            IteratorMode::From(start, Direction::Forward),
        );
        collect(iter, limit)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.lost.check()?;
        let mut wb = WriteBatch::default();
        for op in &batch.ops {
            match op {
                Op::Put { cf, key, value } => wb.put_cf(self.cf(*cf)?, key, value),
                Op::Delete { cf, key } => wb.delete_cf(self.cf(*cf)?, key),
            }
        }
        let sync = match self.mode {
            SyncMode::Always => true,
            SyncMode::Commit => batch.durable,
            SyncMode::Never => false,
        };
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        opts.disable_wal(!self.wal);
        if sync {
            self.lost.fsync(|| self.db.write_opt(wb, &opts)).map_err(|e| {
                // Whether the batch reached the disk is unknown: nothing may build on it.
                self.lost.record("a synced write of the WAL", &e);
                CairnError::io(format!("metadata store: write: {e}"))
            })?;
            // (Synced writes run side by side, not under `flushing`: one that succeeded while
            // another flush was failing is not answered as durable.)
            self.lost.check()?;
        } else {
            self.db.write_opt(wb, &opts).map_err(|e| db_error("write", e))?;
        }
        if !sync {
            if let Some((syncer, _)) = &self.syncer {
                syncer.mark_dirty();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
impl RocksStore {
    /// Make every fsync from now on fail (tests of the fail-stop).
    pub(crate) fn fail_fsyncs(&self) {
        self.lost.inject.store(true, Ordering::SeqCst);
    }
}
