//! The metadata store: an ordered key-value store with column families and atomic batches.
//! Everything the metaserver persists goes through [`MetaStore`], so the backend (RocksDB today;
//! a Raft-replicated or partitioned store later) is a change of this module only. Invariants every
//! backend keeps: keys sort bytewise within a column family, `scan` returns pairs in key order,
//! and `write` applies all of a [`Batch`] or none of it.

mod memory;
mod rocks;
#[cfg(test)]
mod tests;

pub use memory::MemoryStore;
pub use rocks::RocksStore;

use cairn_common::Result;
use serde::{Deserialize, Serialize};

/// Column families: one key space per kind of record (see `schema.rs` for the encodings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Cf {
    Inodes,
    Dentries,
    Xattrs,
    Symlinks,
    Stripes,
    Nodes,
    Counters,
    Gc,
    /// Regular files with no links left that some client still has open.
    Orphans,
    /// A replicated metaserver's Raft state: the last applied log id and membership, written
    /// with the effects of the entries applied (`raft/state.rs`). Never written by the
    /// namespace.
    Raft,
    /// Changes clients may send again after a failover, by (client, sequence): when each was
    /// done (`namespace/once.rs`).
    Once,
    /// Cross-group transactions not finished, by id (`namespace/txn.rs`).
    Txns,
}

impl Cf {
    pub const ALL: [Cf; 12] = [
        Cf::Inodes,
        Cf::Dentries,
        Cf::Xattrs,
        Cf::Symlinks,
        Cf::Stripes,
        Cf::Nodes,
        Cf::Counters,
        Cf::Gc,
        Cf::Orphans,
        Cf::Raft,
        Cf::Once,
        Cf::Txns,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cf::Inodes => "inodes",
            Cf::Dentries => "dentries",
            Cf::Xattrs => "xattrs",
            Cf::Symlinks => "symlinks",
            Cf::Stripes => "stripes",
            Cf::Nodes => "nodes",
            Cf::Counters => "counters",
            Cf::Gc => "gc",
            Cf::Orphans => "orphans",
            Cf::Raft => "raft",
            Cf::Once => "once",
            Cf::Txns => "txns",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The family called `name`.
    pub fn named(name: &str) -> Option<Cf> {
        Cf::ALL.into_iter().find(|cf| cf.name() == name)
    }
}

/// One change in a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Put { cf: Cf, key: Vec<u8>, value: Vec<u8> },
    Delete { cf: Cf, key: Vec<u8> },
}

impl Op {
    /// The bytes of its key and value.
    pub fn bytes(&self) -> usize {
        match self {
            Op::Put { key, value, .. } => key.len() + value.len(),
            Op::Delete { key, .. } => key.len(),
        }
    }
}

/// Changes applied atomically by [`MetaStore::write`], in order (a later op on the same key wins).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    ops: Vec<Op>,
    durable: bool,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    pub fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put { cf, key: key.into(), value: value.into() });
    }

    pub fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Delete { cf, key: key.into() });
    }

    /// Add `op` at the end.
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn into_ops(self) -> Vec<Op> {
        self.ops
    }

    /// `write` returns only once this batch (and everything written before it) is on disk,
    /// whatever the store's sync mode short of `Never`.
    pub fn set_durable(&mut self) {
        self.durable = true;
    }

    pub fn is_durable(&self) -> bool {
        self.durable
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

/// A change of a [`MetaStore`] open on this thread, abandoned if dropped before it is closed.
pub struct Change<'a> {
    store: &'a dyn MetaStore,
    open: bool,
}

impl<'a> Change<'a> {
    /// Open a change of `store` on this thread.
    pub fn open(store: &'a dyn MetaStore) -> Change<'a> {
        store.begin_change();
        Change { store, open: true }
    }

    /// Close it, waiting for what it wrote or read ([`MetaStore::end_change`]).
    pub fn close(mut self) -> Result<()> {
        self.open = false;
        self.store.end_change()
    }

    /// Close it now and return the wait as a future ([`MetaStore::end_change_async`]).
    pub fn close_async(mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>> {
        self.open = false;
        self.store.end_change_async()
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if self.open {
            self.store.abandon_change();
        }
    }
}

/// An ordered key-value store with column families.
/// Reads of one moment: whatever is written while a view is in use, its `get` and `scan` see
/// the store as it was when the view was taken (a RocksDB snapshot; a copy in memory). What a
/// whole-namespace check or a Raft snapshot reads through.
pub trait StoreView {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// As [`MetaStore::scan`].
    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

pub trait MetaStore: Send + Sync + 'static {
    /// Run `f` over a consistent view of the store (see [`StoreView`]).
    fn with_view(&self, f: &mut dyn FnMut(&dyn StoreView) -> Result<()>) -> Result<()>;

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Pairs with `start <= key < end` in key order, at most `limit` of them. An empty `end`
    /// means "to the end of the column family".
    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Apply every op of `batch` atomically; durably before returning when the batch is
    /// durable or the store syncs every write.
    fn write(&self, batch: Batch) -> Result<()>;

    /// Make every write so far durable.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Open a *change* on this thread: the reads and writes one operation makes under its
    /// locks, up to [`MetaStore::end_change`]. A store may answer a write inside a change
    /// before it is durable (a replicated store: once it is proposed), as long as the change's
    /// later reads, and every other change's, see it; `end_change` then waits until everything
    /// the change wrote or read that way is durable. Stores that answer writes when durable
    /// ignore it.
    fn begin_change(&self) {}

    /// Close this thread's change (see [`MetaStore::begin_change`]); an error if something it
    /// wrote or read was not committed (the operation may or may not have happened).
    fn end_change(&self) -> Result<()> {
        Ok(())
    }

    /// Close this thread's change without waiting (the operation unwound).
    fn abandon_change(&self) {}

    /// Whether changes may run on async threads: inside a change, writes are answered at once
    /// (a replicated store: proposed) and the wait for them is [`MetaStore::end_change_async`],
    /// so a change never holds a thread while its commit is on its way.
    fn changes_inline(&self) -> bool {
        false
    }

    /// [`MetaStore::end_change`] as a future: the change is closed now, on this thread; what it
    /// waits for is awaited later.
    fn end_change_async(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>> {
        let ended = self.end_change();
        Box::pin(std::future::ready(ended))
    }

    /// Write a consistent copy of the whole store, as a database, into `dir` (which must not
    /// exist): what a lone metaserver's backup packs. Stores that cannot say so.
    fn checkpoint_into(&self, dir: &std::path::Path) -> Result<()> {
        Err(cairn_common::CairnError::new(
            cairn_common::ErrorKind::NotSupported,
            format!("this metadata store cannot be copied into {}", dir.display()),
        ))
    }

    /// The directory the store keeps its files in, if it has one.
    fn dir(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Why the store refuses changes, once an fsync failed (it fails stop: see `rocks.rs`).
    fn durability_lost(&self) -> Option<String> {
        None
    }

    /// What leaves the store with fewer copies than it should have, one phrase each (a
    /// replica the leader does not hear from): `cairn status` warns of them.
    fn replication_problems(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether every `write` waits for the disk (then callers keep writes off async threads).
    fn syncs_every_write(&self) -> bool {
        false
    }

    /// Engine statistics worth watching, as (name, value): sizes, pending compaction, stalls.
    fn properties(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
