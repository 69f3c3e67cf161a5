//! The Raft log, vote, committed and purged log ids, over the segment files of [`super::wal`]
//! (`{raft dir}/wal/`; `docs/ARCHITECTURE.md`, "On disk"). Record kinds: an entry (the body is
//! [`super::codec`]'s format), the vote, the committed log id, the purged log id (JSON of
//! openraft's types), a truncation (u64 LE). Replaying the records in order rebuilds the
//! state: an entry or a truncation at index `i` drops every entry from `i` on, a purge every
//! entry up to its index.
//!
//! Durability: an append, a vote, a truncation and a purge are written and synced before they
//! are answered (an append's `LogFlushed` callback fires only after the sync), so nothing
//! openraft was told is on disk can be lost to a power cut. The committed log id is written
//! without a sync of its own: it only saves re-deciding what is committed after a restart.
//!
//! Directories of earlier builds kept the log in a RocksDB database (`{raft dir}/log/`); the
//! first open converts it ([`migrate`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use cairn_common::{CairnError, Result};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, StorageIOError};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::wal::{self, Loc, Wal};
use super::{codec, io_error, Entry, LogId, StorageError, TypeConfig, Vote};

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const PURGED: u8 = 4;
const TRUNCATED: u8 = 5;

/// The log's directory under a replica's Raft directory, and the one a conversion fills.
const WAL_DIR: &str = "wal";
const WAL_NEW_DIR: &str = "wal.new";
/// Where earlier builds kept the log (RocksDB).
const ROCKSDB_DIR: &str = "log";

/// The Raft log, vote and committed index. Cheap to clone: clones share the files.
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// The files; held across a write and its sync. Taken before `state` when both are.
    wal: Mutex<Wal>,
    /// What the records say, for readers (never held across I/O).
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<u64, (LogId, Loc)>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

impl State {
    /// The records a new segment starts with, so that older segments can go: the vote, the
    /// committed and purged ids, and a truncation past the last entry (which restates every
    /// truncation written before).
    fn records(&self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let last = self.entries.keys().next_back().copied().or(self.purged.map(|p| p.index));
        if let Some(last) = last {
            out.push((TRUNCATED, last.saturating_add(1).to_le_bytes().to_vec()));
        }
        if let Some(vote) = &self.vote {
            out.push((VOTE, json(vote)));
        }
        if self.committed.is_some() {
            out.push((COMMITTED, json(&self.committed)));
        }
        if let Some(purged) = &self.purged {
            out.push((PURGED, json(purged)));
        }
        out
    }

    fn apply(&mut self, kind: u8, body: &[u8], loc: Loc) -> std::result::Result<(), String> {
        match kind {
            ENTRY => {
                let id = codec::decode_log_id(body)?;
                self.entries.split_off(&id.index);
                self.entries.insert(id.index, (id, loc));
            }
            VOTE => self.vote = Some(unjson(body)?),
            COMMITTED => self.committed = unjson(body)?,
            PURGED => {
                let id: LogId = unjson(body)?;
                self.entries = self.entries.split_off(&(id.index.saturating_add(1)));
                self.purged = Some(id);
            }
            TRUNCATED => {
                let index =
                    u64::from_le_bytes(body.try_into().map_err(|_| "a truncation of the wrong size")?);
                self.entries.split_off(&index);
            }
            other => return Err(format!("a record of kind {other}, unknown to this build")),
        }
        Ok(())
    }
}

fn json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("openraft's ids and votes serialize")
}

fn unjson<T: DeserializeOwned>(body: &[u8]) -> std::result::Result<T, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

fn read_error(e: impl std::fmt::Display) -> StorageError {
    io_error(StorageIOError::read_logs, e)
}

fn write_error(e: impl std::fmt::Display) -> StorageError {
    io_error(StorageIOError::write_logs, e)
}

impl LogStore {
    /// Open (creating if needed) the log of the replica whose Raft directory is `dir`.
    pub fn open(dir: &Path) -> Result<LogStore> {
        LogStore::open_with(dir, wal::SEGMENT_BYTES)
    }

    /// [`LogStore::open`] with segments of `segment_bytes` (tests use small ones).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<LogStore> {
        let wal_dir = dir.join(WAL_DIR);
        let old = dir.join(ROCKSDB_DIR);
        if !wal_dir.exists() && old.exists() {
            migrate(&old, dir, segment_bytes)?;
        }
        if old.exists() {
            // A conversion that renamed its result but was stopped before deleting the old log.
            std::fs::remove_dir_all(&old)
                .map_err(|e| CairnError::from_io(&format!("cannot delete {}", old.display()), &e))?;
        }
        let mut state = State::default();
        let mut with_entries = BTreeSet::new();
        let mut wal = Wal::open(&wal_dir, segment_bytes, |r| {
            if r.kind == ENTRY {
                with_entries.insert(r.loc.seg);
            }
            state
                .apply(r.kind, r.body, r.loc)
                .map_err(|e| CairnError::corrupt(format!("Raft log in {}: {e}", wal_dir.display())))
        })?;
        // A segment's first records restate the state when it was made, and it holds entries
        // only once they are synced. The last segment without entries after older ones may
        // lack them (made by a crash's last moments); a purge could then delete the older
        // ones that hold them. So it is replaced: a new segment restating everything, then
        // every segment after the last one holding entries deleted (all they said is
        // restated).
        let segments = wal.segments();
        if segments.len() > 1 && !with_entries.contains(&wal.current()) {
            wal.roll(&wal::borrowed(&state.records()))?;
            let last_with_entries = with_entries.last().copied().unwrap_or(0);
            let restated: Vec<u64> = segments.into_iter().filter(|s| *s > last_with_entries).collect();
            wal.remove(&restated)?;
        }
        Ok(LogStore { shared: Arc::new(Shared { wal: Mutex::new(wal), state: RwLock::new(state) }) })
    }

    /// Write `records` (synced when `sync`), then let `update` note them.
    ///
    /// On the calling thread, the Raft runtime's: openraft's core awaits every log write before
    /// it does anything else, so handing the write to the blocking pool and back only added
    /// two thread wake-ups to every commit (a commit 5-9% longer, `bench/RESULTS.md`). While
    /// the write waits for the disk, the runtime's other worker takes the tasks queued here
    /// (replication, connections); `block_in_place`, which would start a worker to replace
    /// this one, cost as much as the pool.
    fn write(
        &self,
        records: Vec<(u8, Vec<u8>)>,
        sync: bool,
        update: impl FnOnce(&mut State, Vec<Loc>),
    ) -> Result<()> {
        let mut wal = self.shared.wal.lock();
        let locs = wal.append(&wal::borrowed(&records), sync, || self.shared.state.read().records())?;
        update(&mut self.shared.state.write(), locs);
        Ok(())
    }

    /// The segment files kept (tests).
    #[cfg(test)]
    pub fn segments(&self) -> Vec<u64> {
        self.shared.wal.lock().segments()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> std::result::Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        if start >= end {
            return Ok(Vec::new());
        }
        let locs: Vec<(u64, Loc)> = self
            .shared
            .state
            .read()
            .entries
            .range(start..end)
            .map(|(i, (_, loc))| (*i, loc.clone()))
            .collect();
        let mut out = Vec::with_capacity(locs.len());
        for (index, loc) in locs {
            let body = loc.read().map_err(|e| read_error(format!("log entry {index}: {e}")))?;
            out.push(codec::decode(&body).map_err(|e| read_error(format!("log entry {index}: {e}")))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> std::result::Result<LogState<TypeConfig>, StorageError> {
        let state = self.shared.state.read();
        let last_log_id = state.entries.values().next_back().map(|(id, _)| *id).or(state.purged);
        Ok(LogState { last_purged_log_id: state.purged, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> std::result::Result<(), StorageError> {
        let saved = *vote;
        self.write(vec![(VOTE, json(vote))], true, move |state, _| state.vote = Some(saved))
            .map_err(|e| io_error(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> std::result::Result<Option<Vote>, StorageError> {
        Ok(self.shared.state.read().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> std::result::Result<(), StorageError> {
        // A small write into the page cache, synced with the next append: done in place.
        let mut wal = self.shared.wal.lock();
        let body = json(&committed);
        wal.append(&[(COMMITTED, &body)], false, || self.shared.state.read().records())
            .map_err(write_error)?;
        self.shared.state.write().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> std::result::Result<Option<LogId>, StorageError> {
        Ok(self.shared.state.read().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> std::result::Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut ids = Vec::new();
        let records: Vec<(u8, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| {
                ids.push(entry.log_id);
                (ENTRY, codec::encode(&entry))
            })
            .collect();
        let started = std::time::Instant::now();
        let result = self.write(records, true, move |state, locs| {
            for (id, loc) in ids.into_iter().zip(locs) {
                state.entries.split_off(&id.index);
                state.entries.insert(id.index, (id, loc));
            }
        });
        metrics::histogram!(crate::metrics::RAFT_LOG_APPEND_SECONDS).record(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let error = write_error(&e);
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> std::result::Result<(), StorageError> {
        let index = log_id.index;
        self.write(vec![(TRUNCATED, index.to_le_bytes().to_vec())], true, move |state, _| {
            state.entries.split_off(&index);
        })
        .map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> std::result::Result<(), StorageError> {
        self.write(vec![(PURGED, json(&log_id))], true, move |state, _| {
            state.entries = state.entries.split_off(&(log_id.index.saturating_add(1)));
            state.purged = Some(log_id);
        })
        .map_err(write_error)?;
        // Segments before the one holding the first entry kept hold nothing live (entries are
        // in the files in index order) and nothing a later record does not restate: delete
        // them, off the async threads.
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let mut wal = shared.wal.lock();
            let first = shared.state.read().entries.values().next().map(|(_, loc)| loc.seg);
            wal.remove_before(first.unwrap_or(u64::MAX))
        })
        .await
        .map_err(write_error)?
        .map_err(write_error)
    }
}

/// Convert the RocksDB log of an earlier build (`old`) into segment files: written to
/// `wal.new/` and synced, renamed to `wal/`; the caller then deletes `old`.
fn migrate(old: &Path, dir: &Path, segment_bytes: u64) -> Result<()> {
    use rocksdb::{IteratorMode, Options, DB};
    let failed = |e: rocksdb::Error| {
        CairnError::io(format!("cannot read the earlier Raft log at {} to convert it: {e}", old.display()))
    };
    let db = DB::open_cf_for_read_only(&Options::default(), old, ["log", "meta"], false).map_err(failed)?;
    let (log_cf, meta_cf) = (db.cf_handle("log").expect("opened"), db.cf_handle("meta").expect("opened"));
    let mut records: Vec<(u8, Vec<u8>)> = Vec::new();
    for (name, kind) in [(&b"vote"[..], VOTE), (b"committed", COMMITTED), (b"purged", PURGED)] {
        if let Some(body) = db.get_cf(meta_cf, name).map_err(failed)? {
            records.push((kind, body));
        }
    }
    for item in db.iterator_cf(log_cf, IteratorMode::Start) {
        let (_, value) = item.map_err(failed)?;
        codec::decode_log_id(&value)
            .map_err(|e| CairnError::corrupt(format!("the earlier Raft log at {}: {e}", old.display())))?;
        records.push((ENTRY, value.to_vec()));
    }
    drop(db);
    let new = dir.join(WAL_NEW_DIR);
    if new.exists() {
        std::fs::remove_dir_all(&new)
            .map_err(|e| CairnError::from_io(&format!("cannot delete {}", new.display()), &e))?;
    }
    let mut state = State::default();
    let mut wal = Wal::open(&new, segment_bytes, |_| Ok(()))?;
    for (kind, body) in &records {
        let locs = wal.append(&[(*kind, body)], false, || state.records())?;
        state
            .apply(*kind, body, locs.into_iter().next().expect("one record"))
            .map_err(|e| CairnError::corrupt(format!("the earlier Raft log at {}: {e}", old.display())))?;
    }
    wal.sync()?;
    drop(wal);
    let to = dir.join(WAL_DIR);
    std::fs::rename(&new, &to).map_err(|e| {
        CairnError::from_io(&format!("cannot rename {} to {}", new.display(), to.display()), &e)
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CairnError::from_io(&format!("cannot sync {}", dir.display()), &e))?;
    tracing::info!(
        "converted the Raft log in {} to segment files ({} records)",
        old.display(),
        records.len()
    );
    Ok(())
}
