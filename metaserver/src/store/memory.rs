//! In-memory [`MetaStore`]: one `BTreeMap` per column family under one lock. Used by unit tests
//! and as the reference the RocksDB store is checked against (both run `store::tests`).

use std::collections::BTreeMap;
use std::ops::Bound;

use cairn_common::Result;
use parking_lot::RwLock;

use super::{Batch, Cf, MetaStore, Op, StoreView};

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

/// A copy of every column family: the memory store's consistent view.
struct Copy([Map; Cf::ALL.len()]);

impl StoreView for Copy {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.0[cf.index()].get(key).cloned())
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(scan_map(&self.0[cf.index()], start, end, limit))
    }
}

fn scan_map(map: &Map, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    if !end.is_empty() && end <= start {
        return Vec::new();
    }
    let upper = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(end) };
    map.range::<[u8], _>((Bound::Included(start), upper))
        .take(limit)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl MetaStore for MemoryStore {
    fn with_view(&self, f: &mut dyn FnMut(&dyn StoreView) -> Result<()>) -> Result<()> {
        let copy = Copy(self.cfs.read().clone());
        f(&copy)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.cfs.read()[cf.index()].get(key).cloned())
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(scan_map(&self.cfs.read()[cf.index()], start, end, limit))
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
