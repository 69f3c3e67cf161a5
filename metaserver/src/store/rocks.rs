//! RocksDB [`MetaStore`]: one column family per [`Cf`], one `WriteBatch` per write. With
//! `sync_writes` every batch is fsynced through the WAL before `write` returns, so an
//! acknowledged change survives power loss. This is the only module of Cairn that imports
//! `rocksdb`.

use std::path::Path;

use cairn_common::{CairnError, Result};
use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions, DB,
};

use super::{Batch, Cf, MetaStore, Op};

pub struct RocksStore {
    db: DB,
    sync: bool,
}

fn db_error(context: &str, e: rocksdb::Error) -> CairnError {
    CairnError::io(format!("metadata store: {context}: {e}"))
}

impl RocksStore {
    /// Open (creating if needed) the database in `path`. A database held by another process,
    /// or one that cannot be read, is a clear error.
    pub fn open(path: &Path, sync: bool) -> Result<RocksStore> {
        std::fs::create_dir_all(path).map_err(|e| {
            CairnError::from_io(&format!("cannot create metadata directory {}", path.display()), &e)
        })?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs = Cf::ALL.iter().map(|cf| ColumnFamilyDescriptor::new(cf.name(), Options::default()));
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| {
            CairnError::io(format!("cannot open metadata database at {}: {e}", path.display()))
        })?;
        Ok(RocksStore { db, sync })
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
        PROPERTIES
            .iter()
            .map(|(name, prop)| {
                let total = Cf::ALL
                    .iter()
                    .filter_map(|cf| self.cf(*cf).ok())
                    .filter_map(|h| self.db.property_int_value_cf(h, *prop).ok().flatten())
                    .sum();
                (*name, total)
            })
            .collect()
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.cf(cf)?, key).map_err(|e| db_error("get", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !end.is_empty() && end <= start {
            return Ok(Vec::new());
        }
        let mut read = ReadOptions::default();
        if !end.is_empty() {
            read.set_iterate_upper_bound(end.to_vec());
        }
        let iter = self.db.iterator_cf_opt(self.cf(cf)?, read, IteratorMode::From(start, Direction::Forward));
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (k, v) = item.map_err(|e| db_error("scan", e))?;
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        let mut wb = WriteBatch::default();
        for op in &batch.ops {
            match op {
                Op::Put { cf, key, value } => wb.put_cf(self.cf(*cf)?, key, value),
                Op::Delete { cf, key } => wb.delete_cf(self.cf(*cf)?, key),
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(self.sync);
        self.db.write_opt(wb, &opts).map_err(|e| db_error("write", e))
    }
}
