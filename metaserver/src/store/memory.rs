//! In-memory [`MetaStore`]: one `BTreeMap` per column family under one lock. Used by unit tests
//! and as the reference the RocksDB store is checked against (both run `store::tests`).

use std::collections::BTreeMap;
use std::ops::Bound;

use cairn_common::Result;
use parking_lot::RwLock;

use super::{Batch, Cf, MetaStore, Op};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
pub struct MemoryStore {
    cfs: RwLock<[Map; Cf::ALL.len()]>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl MetaStore for MemoryStore {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.cfs.read()[cf.index()].get(key).cloned())
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let cfs = self.cfs.read();
        let upper = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(end) };
        if !end.is_empty() && end <= start {
            return Ok(Vec::new());
        }
        Ok(cfs[cf.index()]
            .range::<[u8], _>((Bound::Included(start), upper))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&self, batch: Batch) -> Result<()> {
        let mut cfs = self.cfs.write();
        for op in batch.ops {
            match op {
                Op::Put { cf, key, value } => {
                    cfs[cf.index()].insert(key, value);
                }
                Op::Delete { cf, key } => {
                    cfs[cf.index()].remove(&key);
                }
            }
        }
        Ok(())
    }
}
