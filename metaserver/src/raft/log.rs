//! The Raft log in a RocksDB of its own (`{raft dir}/log`): column family `log` maps the index
//! (8 bytes big-endian, so keys sort by index) to the entry ([`super::codec`]); `meta` holds the
//! vote, the committed log id and the last purged log id as JSON of openraft's types.
//!
//! Durability: an append, a vote, a truncation and a purge are written with `sync = true`
//! before they are answered (an append's `LogFlushed` callback fires only after the fsync),
//! so nothing openraft was told is on disk can be lost to a power cut. The committed log id is
//! written without sync: it only saves re-deciding what is committed after a restart.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, StorageIOError};
use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{codec, io_error, Entry, LogId, StorageError, TypeConfig, Vote};

const LOG: &str = "log";
const META: &str = "meta";
const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// The Raft log, vote and committed index. Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn read_error(e: impl std::fmt::Display) -> StorageError {
    io_error(StorageIOError::read_logs, e)
}

fn write_error(e: impl std::fmt::Display) -> StorageError {
    io_error(StorageIOError::write_logs, e)
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

impl LogStore {
    /// Open (creating if needed) the log database in `path`.
    pub fn open(path: &Path) -> cairn_common::Result<LogStore> {
        std::fs::create_dir_all(path).map_err(|e| {
            cairn_common::CairnError::from_io(
                &format!("cannot create the Raft log directory {}", path.display()),
                &e,
            )
        })?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs = [LOG, META].map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| {
            cairn_common::CairnError::io(format!("cannot open the Raft log at {}: {e}", path.display()))
        })?;
        Ok(LogStore { db: Arc::new(db) })
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("the log's column families are created at open")
    }

    fn get_meta<T: DeserializeOwned>(&self, name: &[u8]) -> Result<Option<T>, StorageError> {
        let Some(bytes) = self.db.get_cf(self.cf(META), name).map_err(read_error)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| read_error(format!("Raft log record {}: {e}", String::from_utf8_lossy(name))))
    }

    fn put_meta(
        &self,
        batch: &mut WriteBatch,
        name: &[u8],
        value: &impl Serialize,
    ) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(value).map_err(write_error)?;
        batch.put_cf(self.cf(META), name, bytes);
        Ok(())
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        let mut iter = self.db.iterator_cf(self.cf(LOG), IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(read_error)?;
                codec::decode_log_id(&value).map(Some).map_err(read_error)
            }
        }
    }

    /// A synced write of `batch`, off the async threads (the fsync takes a while).
    async fn write_synced(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.write_opt(batch, &synced()))
            .await
            .map_err(write_error)?
            .map_err(write_error)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        let mode = IteratorMode::From(&key(start), Direction::Forward);
        for item in self.db.iterator_cf(self.cf(LOG), mode) {
            let (k, value) = item.map_err(read_error)?;
            let index = u64::from_be_bytes(
                k.as_ref().try_into().map_err(|_| read_error("a log key of the wrong size"))?,
            );
            if !range.contains(&index) {
                break;
            }
            out.push(codec::decode(&value).map_err(|e| read_error(format!("log entry {index}: {e}")))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.get_meta(PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        self.put_meta(&mut batch, VOTE, vote)?;
        self.write_synced(batch).await.map_err(|e| io_error(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        self.put_meta(&mut batch, COMMITTED, &committed)?;
        self.db.write(batch).map_err(write_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        for entry in entries {
            batch.put_cf(self.cf(LOG), key(entry.log_id.index), codec::encode(&entry));
        }
        let db = self.db.clone();
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || db.write_opt(batch, &synced()))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r.map_err(std::io::Error::other));
        metrics::histogram!(crate::metrics::RAFT_LOG_APPEND_SECONDS).record(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let error = write_error(&e);
                callback.log_io_completed(Err(e));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(LOG), key(log_id.index), key(u64::MAX));
        // An entry at u64::MAX is out of reach of any log, but delete it too for completeness.
        batch.delete_cf(self.cf(LOG), key(u64::MAX));
        self.write_synced(batch).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        self.put_meta(&mut batch, PURGED, &log_id)?;
        batch.delete_range_cf(self.cf(LOG), key(0), key(log_id.index.saturating_add(1)));
        self.write_synced(batch).await
    }
}
