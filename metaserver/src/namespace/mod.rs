//! The namespace: inodes, directory entries, symlinks, xattrs and stripe records, and every
//! FUSE-level operation on them.
//!
//! Invariants:
//! - Every operation is one atomic [`Batch`]: the entries, the inodes it touches, the statistics
//!   counters and the garbage-collection entries for shards it orphans are written together, so
//!   a crash leaves either all of an operation or none of it.
//! - Read-modify-write runs under in-memory per-inode locks (a striped table; the sorted set of
//!   involved stripes is locked in order, so two operations never deadlock). Cross-directory
//!   renames of directories also hold one global lock, which makes the cycle check (walking the
//!   new parent's ancestry through each directory's `parent` field) race-free.
//! - Inode numbers are never reused: they are handed out from blocks reserved in
//!   `Cf::Counters` before use, and a restart starts after the last reserved block.
//! - A directory's `nlink` is 2 plus its number of subdirectories.

mod attrs;
mod check;
mod entries;
mod files;
mod heal;
mod inos;
pub mod once;
mod rename;
mod subtree;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_change;
#[cfg(test)]
mod tests_files;
#[cfg(test)]
mod tests_moves;
#[cfg(test)]
mod tests_names;
#[cfg(test)]
mod tests_txn;
pub mod txn;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Layout, Result, NAME_MAX, ROOT_INO};
use cairn_proto::Timespec;
use parking_lot::{Mutex, MutexGuard};

use crate::cluster::{Cluster, Surroundings};
use crate::schema::{
    self, counter, read_counter, Counter, Dentry, GcEntry, GcShard, Inode, Stats, Stripe, S_IFDIR,
};
use crate::store::{Batch, Cf, Change, MemoryStore, MetaStore, RocksStore};

pub use attrs::{XATTR_CREATE, XATTR_REPLACE};
pub use check::{CheckReport, Problem, LOST_FOUND};
pub use entries::{Looked, NewEntry};
pub use files::{file_info, MAX_FILE_SIZE};
pub(crate) use rename::MAX_DEPTH;
pub use rename::{Climb, Renamed, RENAME_EXCHANGE, RENAME_NOREPLACE};

/// Stripes of the per-inode lock table.
const LOCK_STRIPES: usize = 1024;
/// Shards of the statistics counters (concurrent operations update different shards).
pub(super) const STATS_SHARDS: usize = 16;

/// Striped per-inode mutexes.
struct LockTable {
    stripes: Vec<Mutex<()>>,
}

impl LockTable {
    fn new() -> LockTable {
        LockTable { stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect() }
    }

    fn slot(ino: u64) -> usize {
        (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % LOCK_STRIPES
    }

    /// Lock every stripe `inos` hash to, in ascending order.
    fn lock(&self, inos: &[u64]) -> Vec<MutexGuard<'_, ()>> {
        let mut slots: Vec<usize> = inos.iter().map(|i| Self::slot(*i)).collect();
        slots.sort_unstable();
        slots.dedup();
        slots.into_iter().map(|s| self.stripes[s].lock()).collect()
    }
}

/// The metaserver's namespace over a [`MetaStore`].
pub struct Namespace {
    store: Arc<dyn MetaStore>,
    /// Placement, chunkserver capacity, open files: asked of the cluster around it.
    cluster: Arc<dyn Surroundings>,
    locks: LockTable,
    rename_lock: Mutex<()>,
    /// Slot 0's counter (group 0 numbers only there).
    inos: Arc<inos::Inos>,
    /// Where a group other than 0 numbers new inodes.
    slots: Option<inos::Slots>,
    /// Inode ranges restores skipped (`counters/foreign_inos`).
    foreign_inos: Vec<(u64, u64)>,
    stats: Vec<Mutex<Stats>>,
    stats_cursor: AtomicUsize,
    gc_epoch: u64,
    cluster_id: String,
    gc_seq: AtomicU64,
    /// The metadata group this namespace is (0: the one with the root directory).
    group: u32,
    /// Sequences of the cross-group transactions this group coordinates (`txn.rs`).
    txn_seqs: Arc<inos::Inos>,
    /// The first of them this opening hands out (`txn::recover`).
    txn_first_seq: u64,
    /// When this opening began (seconds since 1970): a participant's record written before
    /// was prepared under an earlier leader, whose decision may be waiting (`txn::recover`).
    opened_sec: i64,
    /// Coordinator records proposed and not yet known committed, whose participants may
    /// already be asked (`txn::Unsettled`): `TxnOutcome` answers them pending, not aborted.
    unsettled: Mutex<Vec<txn::TxnId>>,
}

/// How long a client that stopped heartbeating keeps its open files and locks.
pub const DEFAULT_CLIENT_LEASE: Duration = Duration::from_secs(30);

pub(crate) fn stats_key(shard: usize) -> Vec<u8> {
    let mut k = counter::STATS_PREFIX.to_vec();
    k.extend_from_slice(format!("{shard:02}").as_bytes());
    k
}

/// Inode numbers a restore skips: more than a namespace ever hands out between a backup and the
/// restore of it, so no number a lost file had is handed out again.
pub const RESTORE_INO_GAP: u64 = 1 << 32;
/// Client ids a restore skips (stripe versions carry the writer's id: none may repeat).
pub const RESTORE_CLIENT_GAP: u64 = 1 << 20;

/// Prepare a namespace just restored from a backup (in `store`, not serving) for the data that
/// is newer than it: inode numbers and client ids jump past any the lost changes may have
/// handed out, and the skipped inode range is recorded as foreign (`counters/foreign_inos`), so
/// reconciliation keeps those shards until an operator deletes them.
pub fn prepare_restored(store: &dyn MetaStore, batch: &mut Batch) -> Result<()> {
    let from = read_counter(store, counter::INO_RESERVED)?.unwrap_or(ROOT_INO + 1).max(ROOT_INO + 1);
    let to = from
        .checked_add(RESTORE_INO_GAP)
        .ok_or_else(|| CairnError::new(ErrorKind::NoSpace, "no inode numbers left to restore into"))?;
    batch.put(Cf::Counters, counter::INO_RESERVED, schema::encode(&Counter { value: to }));
    let client = read_counter(store, counter::NEXT_CLIENT)?.unwrap_or(1);
    batch.put(
        Cf::Counters,
        counter::NEXT_CLIENT,
        schema::encode(&Counter { value: client + RESTORE_CLIENT_GAP }),
    );
    let mut ranges = store.get(Cf::Counters, counter::FOREIGN_INOS)?.unwrap_or_default();
    ranges.extend_from_slice(&from.to_be_bytes());
    ranges.extend_from_slice(&to.to_be_bytes());
    // A group other than 0 numbers in other slots: each slot's counter moves on the same way.
    for (from, to) in inos::prepare_restored(store, batch, RESTORE_INO_GAP)? {
        ranges.extend_from_slice(&from.to_be_bytes());
        ranges.extend_from_slice(&to.to_be_bytes());
    }
    batch.put(Cf::Counters, counter::FOREIGN_INOS, ranges);
    // Transaction ids the lost changes may have used never come back either.
    txn::prepare_restored(store, batch, RESTORE_INO_GAP)?;
    Ok(())
}

/// The namespace epoch of a leadership (or lone metaserver) starting over `store`, put in
/// `batch`: above the last one, and above the epochs a group lost after a backup handed out
/// (`docs/ARCHITECTURE.md`, "Fencing a deposed leader"). Chunkservers refuse deletes (and
/// another group's fences) from below the highest epoch they have seen of the group.
pub fn next_epoch(store: &dyn MetaStore, batch: &mut Batch) -> Result<u64> {
    let since_1970 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let epoch = (read_counter(store, counter::GC_EPOCH)?.unwrap_or(0) + 1).max(since_1970);
    batch.put(Cf::Counters, counter::GC_EPOCH, schema::encode(&Counter { value: epoch }));
    Ok(epoch)
}

/// The statistics counters' shards as `store` keeps them.
fn read_stats(store: &dyn MetaStore) -> Result<Vec<Mutex<Stats>>> {
    (0..STATS_SHARDS)
        .map(|shard| match store.get(Cf::Counters, &stats_key(shard))? {
            Some(v) => Ok(Mutex::new(schema::decode::<Stats>("stats", &v)?)),
            None => Ok(Mutex::new(Stats::default())),
        })
        .collect()
}

/// The ranges `prepare_restored` recorded.
fn read_foreign_inos(store: &dyn MetaStore) -> Result<Vec<(u64, u64)>> {
    let raw = store.get(Cf::Counters, counter::FOREIGN_INOS)?.unwrap_or_default();
    if raw.len() % 16 != 0 {
        return Err(CairnError::corrupt(
            "counters/foreign_inos is not a list of ranges: the metadata is damaged",
        ));
    }
    Ok(raw
        .chunks(16)
        .map(|c| {
            (u64::from_be_bytes(c[..8].try_into().unwrap()), u64::from_be_bytes(c[8..].try_into().unwrap()))
        })
        .collect())
}

/// Check a directory entry name: not empty, not `.` or `..`, no `/` or NUL, at most NAME_MAX.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(CairnError::invalid(format!("invalid name {:?}", String::from_utf8_lossy(name))));
    }
    if name.len() > NAME_MAX {
        return Err(CairnError::new(ErrorKind::NameTooLong, format!("name of {} bytes", name.len())));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(CairnError::invalid("name contains '/' or NUL"));
    }
    Ok(())
}

/// Check a client-supplied timestamp.
pub fn check_time(t: &Timespec) -> Result<()> {
    if t.nsec >= 1_000_000_000 {
        return Err(CairnError::invalid(format!("timestamp nanoseconds {} out of range", t.nsec)));
    }
    Ok(())
}

impl Namespace {
    /// Open the namespace over `store`, creating the root directory (with `root_layout`) on
    /// first open; `cluster` places new files and says which are open.
    pub fn open(
        store: Arc<dyn MetaStore>,
        root_layout: Layout,
        cluster: Arc<dyn Surroundings>,
    ) -> Result<Namespace> {
        root_layout.validate()?;
        let stats = read_stats(&*store)?;
        let mut batch = Batch::new();
        let gc_epoch = next_epoch(&*store, &mut batch)?;
        // The cluster's identity, drawn by the first opening (`docs/ARCHITECTURE.md`, "Cluster
        // identity"); chunkservers of another cluster are refused.
        let cluster_id = match store.get(Cf::Counters, counter::CLUSTER_ID)? {
            Some(id) => {
                String::from_utf8(id).ok().filter(|id| cairn_common::ids::is_id(id)).ok_or_else(|| {
                    CairnError::corrupt(
                        "the namespace's cluster id (counters/cluster_id) is not 32 hex digits: the \
                         metadata is damaged; restore it from a backup",
                    )
                })?
            }
            None => {
                let id = format!("{:032x}", rand::random::<u128>());
                batch.put(Cf::Counters, counter::CLUSTER_ID, id.clone().into_bytes());
                // On disk before any chunkserver keeps it: a power loss must not draw another.
                batch.set_durable();
                id
            }
        };
        let reserved = read_counter(&*store, counter::INO_RESERVED)?;
        let root_exists = store.get(Cf::Inodes, &schema::ino_key(ROOT_INO))?.is_some();
        let next_ino = reserved.unwrap_or(ROOT_INO + 1).max(ROOT_INO + 1);
        if !root_exists {
            let now = cairn_common::time::now();
            let mut root = Inode::new(ROOT_INO, S_IFDIR | 0o755, 0, 0, &now);
            root.nlink = 2;
            root.parent = ROOT_INO;
            root.set_layout(root_layout);
            batch.put(Cf::Inodes, schema::ino_key(ROOT_INO), schema::encode(&root));
            let mut s0 = *stats[0].lock();
            s0.add(&Stats { directories: 1, inodes: 1, ..Default::default() });
            batch.put(Cf::Counters, stats_key(0), schema::encode(&s0));
            *stats[0].lock() = s0;
        }
        // The first block of this opening, reserved with it (durable: see `inos.rs`).
        let reserved_end = next_ino
            .checked_add(inos::INO_BLOCK)
            .ok_or_else(|| CairnError::new(ErrorKind::NoSpace, "no inode numbers left"))?;
        batch.put(Cf::Counters, counter::INO_RESERVED, schema::encode(&Counter { value: reserved_end }));
        batch.set_durable();
        store.write(batch)?;
        let foreign_inos = read_foreign_inos(&*store)?;
        let (txn_seqs, txn_first_seq) = txn::sequences(&*store)?;
        Ok(Namespace {
            store,
            cluster,
            locks: LockTable::new(),
            rename_lock: Mutex::new(()),
            inos: inos::Inos::slot_zero(next_ino, reserved_end),
            slots: None,
            foreign_inos,
            stats,
            stats_cursor: AtomicUsize::new(0),
            gc_epoch,
            cluster_id,
            gc_seq: AtomicU64::new(0),
            group: 0,
            txn_seqs,
            txn_first_seq,
            opened_sec: cairn_common::time::now().sec,
            unsettled: Mutex::new(Vec::new()),
        })
    }

    /// Open the namespace of a metadata group other than 0 over `store` (its replicated
    /// state): the slots the group map gives it, without a root directory, with the epoch its
    /// leadership raised for its fences (`groups::Groups::open_leadership`). It needs the
    /// cluster's identity, which group 0's leader shares with it (`Unavailable` before); it
    /// writes nothing. It numbers new inodes in its own slots (`inos.rs`).
    pub fn open_slots(
        store: Arc<dyn MetaStore>,
        (group, map): (u32, Arc<crate::groups::Groups>),
        epoch: u64,
        cluster: Arc<dyn Surroundings>,
    ) -> Result<Namespace> {
        if group == 0 {
            return Err(CairnError::invalid("group 0's namespace opens with its root (Namespace::open)"));
        }
        let cluster_id = match store.get(Cf::Counters, counter::CLUSTER_ID)? {
            Some(id) => {
                String::from_utf8(id).ok().filter(|id| cairn_common::ids::is_id(id)).ok_or_else(|| {
                    CairnError::corrupt(format!(
                    "metadata group {group}'s copy of the cluster id (counters/cluster_id) is not 32 hex \
                     digits: the metadata is damaged"
                ))
                })?
            }
            None => {
                return Err(CairnError::unavailable(format!(
                    "metadata group {group} does not hold the cluster's identity yet: group 0's leader \
                     shares it (with the group map) within seconds of the group being added"
                )))
            }
        };
        if map.version() == 0 {
            return Err(CairnError::unavailable(format!(
                "metadata group {group} holds no group map yet (a new group, or one restored from a \
                 backup): group 0's leader shares it within seconds"
            )));
        }
        let stats = read_stats(&*store)?;
        let (txn_seqs, txn_first_seq) = txn::sequences(&*store)?;
        Ok(Namespace {
            foreign_inos: read_foreign_inos(&*store)?,
            slots: Some(inos::Slots::open(&*store, group, map)?),
            store,
            cluster,
            locks: LockTable::new(),
            rename_lock: Mutex::new(()),
            inos: inos::Inos::slot_zero(0, 0),
            stats,
            stats_cursor: AtomicUsize::new(0),
            gc_epoch: epoch,
            cluster_id,
            gc_seq: AtomicU64::new(0),
            group,
            txn_seqs,
            txn_first_seq,
            opened_sec: cairn_common::time::now().sec,
            unsettled: Mutex::new(Vec::new()),
        })
    }

    /// The metadata group this namespace is.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// An in-memory namespace and its cluster (tests): nodes time out after a minute, clients
    /// after [`DEFAULT_CLIENT_LEASE`].
    pub fn open_memory(root_layout: Layout) -> Result<(Namespace, Arc<Cluster>)> {
        Namespace::open_with_cluster(
            Arc::new(MemoryStore::new()),
            root_layout,
            Duration::from_secs(60),
            DEFAULT_CLIENT_LEASE,
        )
    }

    /// A namespace and its cluster in a RocksDB database at `path`.
    pub fn open_rocks(
        path: &Path,
        sync: cairn_common::config::SyncMode,
        root_layout: Layout,
        node_timeout: Duration,
        client_lease: Duration,
    ) -> Result<(Namespace, Arc<Cluster>)> {
        Namespace::open_with_cluster(
            Arc::new(RocksStore::open(path, sync)?),
            root_layout,
            node_timeout,
            client_lease,
        )
    }

    /// The cluster (see [`Cluster::open`]) and the namespace over `store`.
    pub fn open_with_cluster(
        store: Arc<dyn MetaStore>,
        root_layout: Layout,
        node_timeout: Duration,
        client_lease: Duration,
    ) -> Result<(Namespace, Arc<Cluster>)> {
        let cluster = Cluster::open(store.clone(), node_timeout, client_lease)?;
        let ns = Namespace::open(store, root_layout, cluster.clone())?;
        Ok((ns, cluster))
    }

    /// This namespace's epoch, raised by every opening (a new leader's, a restart's): the fence
    /// on its shard deletes, which chunkservers refuse once they have seen a higher one.
    pub fn fence(&self) -> u64 {
        self.gc_epoch
    }

    /// The cluster this namespace is (32 hex digits, drawn by its first opening).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The store under the namespace, for the metaserver's own housekeeping (sync, the GC
    /// queue, statistics). Walks over files go through [`Namespace::inodes_after`].
    pub(crate) fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// Up to `limit` inodes numbered above `after` (0: from the first), in inode order: how the
    /// repair and the admin views walk every file without reading raw records.
    pub fn inodes_after(&self, after: u64, limit: usize) -> Result<Vec<Inode>> {
        let Some(first) = after.checked_add(1) else { return Ok(Vec::new()) };
        self.store
            .scan(Cf::Inodes, &schema::ino_key(first), &[], limit)?
            .into_iter()
            .map(|(_, value)| schema::decode("inode", &value))
            .collect()
    }

    /// Inode numbers from here on were never handed out by this namespace (the durable end of
    /// the reserved block): a shard of such an inode was written against another namespace, or a
    /// later state of this one (this one restored from a backup).
    pub fn inos_reserved_end(&self) -> u64 {
        self.inos.reserved_end()
    }

    /// Whether files of this namespace can never have had inode number `ino`: at or past the
    /// reserved end, or in a range a restore skipped (see [`prepare_restored`]).
    pub fn is_foreign_ino(&self, ino: u64) -> bool {
        ino >= self.inos_reserved_end()
            || self.foreign_inos.iter().any(|&(from, to)| (from..to).contains(&ino))
    }

    /// A number for a new inode under `parent` named `name`, never handed out before (also
    /// across restarts): group 0's in slot 0; another group's in its slots (`inos.rs`), with
    /// the gate its caller holds until the inode's change is proposed.
    fn number(&self, parent: u64, name: &[u8], is_dir: bool) -> Result<inos::Numbered<'_>> {
        match &self.slots {
            None => Ok(inos::Numbered::ungated(self.inos.next(&self.store)?)),
            Some(slots) => slots.number(&self.store, parent, name, is_dir),
        }
    }

    /// Promise group 0, whose group map is at `version`, to number nothing more in `slots`
    /// before it moves them away from this group (one other than 0): refused `NotEmpty` when
    /// one holds a record; answers where each was numbered up to (`inos.rs`,
    /// [`inos::Slots::release`]).
    pub fn release_slots(&self, slots: &[u32], version: u64) -> Result<Vec<u64>> {
        match &self.slots {
            Some(held) => held.release(&*self.store, slots, version),
            None => Err(CairnError::invalid("group 0's slots move by its own map changes, not by a promise")),
        }
    }

    /// Free an unlinked file once nobody has it open: `ino` if it is an orphan, else nothing.
    /// Whether `ino` is unlinked but was kept for its openers (a cheap read; see
    /// [`Namespace::free_if_orphan`]).
    pub fn is_orphan(&self, ino: u64) -> Result<bool> {
        Ok(self.store.get(Cf::Orphans, &schema::ino_key(ino))?.is_some())
    }

    pub fn free_if_orphan(&self, ino: u64) -> Result<bool> {
        self.locked(
            || vec![ino],
            || {
                if self.store.get(Cf::Orphans, &schema::ino_key(ino))?.is_none() || self.cluster.is_open(ino)
                {
                    return Ok(false);
                }
                let mut tx = self.tx();
                if self.try_inode(ino)?.is_some_and(|i| i.nlink == 0) {
                    tx.destroy(ino)?;
                }
                tx.batch.delete(Cf::Orphans, schema::ino_key(ino));
                tx.commit()?;
                Ok(true)
            },
        )
    }

    /// Free every orphan nobody has open (after a restart's grace period, or a session expiry).
    pub fn free_orphans(&self) -> Result<u64> {
        let rows = self.store.scan(Cf::Orphans, &[], &[], usize::MAX)?;
        let mut freed = 0;
        for (key, _) in rows {
            let ino =
                u64::from_be_bytes(key.as_slice().try_into().map_err(|_| CairnError::corrupt("orphan key"))?);
            if self.free_if_orphan(ino)? {
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Totals of the statistics counters.
    pub fn stats(&self) -> Stats {
        let mut total = Stats::default();
        for s in &self.stats {
            total.add(&s.lock());
        }
        total
    }

    /// Number of shards waiting for garbage collection.
    pub fn pending_gc(&self) -> Result<u64> {
        let mut n = 0u64;
        for (_, v) in self.store.scan(Cf::Gc, &[], &[], usize::MAX)? {
            n += schema::decode::<GcEntry>("gc entry", &v)?.shards.len() as u64;
        }
        Ok(n)
    }

    /// The inode `ino`, or NotFound.
    pub fn inode(&self, ino: u64) -> Result<Inode> {
        self.try_inode(ino)?.ok_or_else(|| CairnError::not_found(format!("no inode {ino}")))
    }

    fn try_inode(&self, ino: u64) -> Result<Option<Inode>> {
        match self.store.get(Cf::Inodes, &schema::ino_key(ino))? {
            Some(v) => Ok(Some(schema::decode("inode", &v)?)),
            None => Ok(None),
        }
    }

    /// The directory `ino`, or NotFound / NotDir.
    fn dir(&self, ino: u64) -> Result<Inode> {
        let inode = self.inode(ino)?;
        if !inode.is_dir() {
            return Err(CairnError::new(ErrorKind::NotDir, format!("inode {ino} is not a directory")));
        }
        Ok(inode)
    }

    /// The entry `name` in `parent`, absent while it is a cross-group change's placeholder
    /// (`txn.rs`): the name exists once that change commits.
    fn dentry(&self, parent: u64, name: &[u8]) -> Result<Option<Dentry>> {
        Ok(self.stored_dentry(parent, name)?.filter(|d| !d.is_pending()))
    }

    /// The entry as stored, placeholders included.
    fn stored_dentry(&self, parent: u64, name: &[u8]) -> Result<Option<Dentry>> {
        match self.store.get(Cf::Dentries, &schema::dentry_key(parent, name))? {
            Some(v) => Ok(Some(schema::decode("dentry", &v)?)),
            None => Ok(None),
        }
    }

    /// Refuse to create `name` in `parent` where it exists, or where a cross-group change
    /// creating it is under way (`Exists`; to a try of that same change sent again,
    /// `Unavailable`: its first try is not decided yet).
    fn check_free(&self, parent: u64, name: &[u8]) -> Result<()> {
        let Some(entry) = self.stored_dentry(parent, name)? else { return Ok(()) };
        if entry.is_pending() && self.is_own_txn(&entry.txn)? {
            return Err(CairnError::unavailable(format!(
                "{:?} is being created by an earlier try of this change, in another metadata group: \
                 try again later",
                String::from_utf8_lossy(name)
            )));
        }
        Err(CairnError::new(ErrorKind::Exists, format!("{:?} exists", String::from_utf8_lossy(name))))
    }

    /// Unlocked peek at a child's inode number (only to decide what to lock).
    fn peek(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.dentry(parent, name).ok().flatten().map(|d| d.ino)
    }

    /// Run `body` holding the locks of every inode `involved` names. `involved` is evaluated
    /// without locks, then again under them; if the set grew (a concurrent change), the locks
    /// are retaken for the larger set.
    ///
    /// All of it is one *change* of the store ([`MetaStore::begin_change`]): a replicated store
    /// answers the body's writes once they are proposed, so the locks are let go then, and its
    /// reads see what earlier changes proposed; the answer waits, after the locks, until
    /// everything the change wrote or read is committed.
    fn locked<R>(&self, involved: impl Fn() -> Vec<u64>, body: impl FnOnce() -> Result<R>) -> Result<R> {
        let change = Change::open(&*self.store);
        let mut set = involved();
        let out = loop {
            let guards = self.locks.lock(&set);
            let again = involved();
            if again.iter().all(|i| set.contains(i)) {
                let out = body();
                drop(guards);
                break out;
            }
            drop(guards);
            set.extend(again);
            set.sort_unstable();
            set.dedup();
        };
        // What the body answered holds only if what it wrote and read is committed.
        change.close()?;
        out
    }

    fn tx(&self) -> Tx<'_> {
        Tx { ns: self, inodes: BTreeMap::new(), batch: Batch::new(), stats: Stats::default(), gc: Vec::new() }
    }
}

/// One operation's pending changes: the inodes it modifies (loaded once, so aliases such as
/// `parent == new_parent` see each other's changes), the batch, the statistics delta and the
/// shards it orphans. Nothing is visible until [`Tx::commit`].
struct Tx<'a> {
    ns: &'a Namespace,
    inodes: BTreeMap<u64, Option<Inode>>,
    batch: Batch,
    stats: Stats,
    gc: Vec<GcShard>,
}

impl Tx<'_> {
    /// The inode `ino` for modification (NotFound if it does not exist or was destroyed).
    fn get(&mut self, ino: u64) -> Result<&mut Inode> {
        if !self.inodes.contains_key(&ino) {
            let inode = self.ns.inode(ino)?;
            self.inodes.insert(ino, Some(inode));
        }
        self.inodes
            .get_mut(&ino)
            .and_then(|i| i.as_mut())
            .ok_or_else(|| CairnError::not_found(format!("inode {ino} was removed")))
    }

    /// Add a new inode.
    fn insert(&mut self, inode: Inode) {
        self.inodes.insert(inode.ino, Some(inode));
    }

    fn put_dentry(&mut self, parent: u64, name: &[u8], ino: u64, kind: u32) {
        self.batch.put(
            Cf::Dentries,
            schema::dentry_key(parent, name),
            schema::encode(&Dentry::new(ino, kind)),
        );
    }

    fn delete_dentry(&mut self, parent: u64, name: &[u8]) {
        self.batch.delete(Cf::Dentries, schema::dentry_key(parent, name));
    }

    /// Queue the shards of one stripe version of `inode` for deletion.
    fn gc_stripe(&mut self, inode: &Inode, stripe: u64, record: &Stripe) {
        self.gc.extend(stripe_shards(inode, stripe, record));
    }

    /// Drop `ino`'s name in directory `dir` (ctime = `now`); at zero links the inode goes with
    /// everything it owns.
    fn drop_link(&mut self, ino: u64, dir: u64, now: &Timespec) -> Result<()> {
        let inode = self.get(ino)?;
        if inode.is_dir() {
            return self.destroy(ino);
        }
        inode.drop_name(dir);
        inode.nlink = inode.nlink.saturating_sub(1);
        inode.set_ctime(now);
        if inode.nlink == 0 {
            if inode.is_reg() && self.ns.cluster.is_open(ino) {
                // Unlinked while open: kept (nlink 0) until the last client closes it.
                self.batch.put(Cf::Orphans, schema::ino_key(ino), Vec::new());
            } else {
                self.destroy(ino)?;
            }
        }
        Ok(())
    }

    /// Delete an inode, its stripes (shards queued for gc), xattrs and symlink target.
    fn destroy(&mut self, ino: u64) -> Result<()> {
        let inode = self.get(ino)?.clone();
        let store = &self.ns.store;
        if inode.is_reg() {
            for (key, value) in
                store.scan(Cf::Stripes, &schema::ino_key(ino), &schema::prefix_end(ino), usize::MAX)?
            {
                let stripe = schema::stripe_of(&key)?;
                let record: Stripe = schema::decode("stripe", &value)?;
                self.gc_stripe(&inode, stripe, &record);
                self.batch.delete(Cf::Stripes, key);
            }
            self.stats.files -= 1;
            self.stats.logical_bytes -= inode.size as i64;
        }
        if inode.is_dir() {
            self.stats.directories -= 1;
        }
        if inode.is_symlink() {
            self.batch.delete(Cf::Symlinks, schema::ino_key(ino));
        }
        for (key, _) in store.scan(Cf::Xattrs, &schema::ino_key(ino), &schema::prefix_end(ino), usize::MAX)? {
            self.batch.delete(Cf::Xattrs, key);
        }
        self.stats.inodes -= 1;
        self.inodes.insert(ino, None);
        Ok(())
    }

    /// Write everything atomically.
    fn commit(mut self) -> Result<()> {
        once::record(&mut self.batch);
        for (ino, inode) in std::mem::take(&mut self.inodes) {
            match inode {
                Some(i) => self.batch.put(Cf::Inodes, schema::ino_key(ino), schema::encode(&i)),
                None => self.batch.delete(Cf::Inodes, schema::ino_key(ino)),
            }
        }
        if !self.gc.is_empty() {
            let seq = self.ns.gc_seq.fetch_add(1, Ordering::Relaxed);
            let entry = GcEntry { shards: std::mem::take(&mut self.gc) };
            self.batch.put(Cf::Gc, schema::gc_key(self.ns.gc_epoch, seq), schema::encode(&entry));
        }
        if self.stats.is_zero() {
            return self.ns.store.write(self.batch);
        }
        // Take any free stats shard (they are summed), so concurrent commits rarely wait.
        let start = self.ns.stats_cursor.fetch_add(1, Ordering::Relaxed);
        let n = self.ns.stats.len();
        let mut guard = (0..n)
            .find_map(|i| self.ns.stats[(start + i) % n].try_lock().map(|g| ((start + i) % n, g)))
            .unwrap_or_else(|| (start % n, self.ns.stats[start % n].lock()));
        let mut updated = *guard.1;
        updated.add(&self.stats);
        self.batch.put(Cf::Counters, stats_key(guard.0), schema::encode(&updated));
        self.ns.store.write(self.batch)?;
        *guard.1 = updated;
        Ok(())
    }
}

/// The shards of one stripe version that were stored: each index not in `missing`, on the node
/// at its rotated position in the placement group.
pub fn stripe_shards(inode: &Inode, stripe: u64, record: &Stripe) -> Vec<GcShard> {
    let layout = inode.layout();
    if layout.validate().is_err() {
        return Vec::new();
    }
    (0..layout.width())
        .filter(|i| record.missing & (1u32 << i) == 0)
        .filter_map(|index| {
            let node = *inode.placement.get(layout.position(stripe, index))?;
            Some(GcShard { node, ino: inode.ino, stripe, index, version: record.version })
        })
        .collect()
}
