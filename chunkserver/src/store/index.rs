//! The in-memory index: where each shard lives, how many bytes each directory holds and what
//! was done there since start, and the recent HDD reads the mover promotes from.

use std::collections::HashMap;

use cairn_common::ShardId;

use crate::policy::HotTracker;

/// What the index knows about one directory: usage (the sum over its shards) and counters
/// since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirUsage {
    pub(crate) bytes: u64,
    pub(crate) shards: u64,
    pub(crate) reads: u64,
    pub(crate) read_bytes: u64,
    pub(crate) promotions: u64,
    pub(crate) demotions: u64,
    pub(crate) writes: u64,
    pub(crate) write_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) dir: usize,
    /// Bytes of the whole file, header included.
    pub(crate) file_len: u64,
    /// Last read or write, in [`Clock`] milliseconds.
    pub(crate) last_access: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) shards: HashMap<ShardId, Location>,
    pub(crate) usage: Vec<DirUsage>,
    /// Recent HDD reads of HDD shards.
    pub(crate) hot: HotTracker,
}

impl Index {
    pub(crate) fn insert(&mut self, id: ShardId, loc: Location) -> Option<Location> {
        let old = self.shards.insert(id, loc);
        if let Some(old) = old {
            self.forget(old);
        }
        let u = &mut self.usage[loc.dir];
        u.bytes += loc.file_len;
        u.shards += 1;
        old
    }

    pub(crate) fn remove(&mut self, id: &ShardId) -> Option<Location> {
        let old = self.shards.remove(id)?;
        self.forget(old);
        Some(old)
    }

    fn forget(&mut self, loc: Location) {
        let u = &mut self.usage[loc.dir];
        u.bytes = u.bytes.saturating_sub(loc.file_len);
        u.shards = u.shards.saturating_sub(1);
    }
}
