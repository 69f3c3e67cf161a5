//! Key and value encodings of everything the metaserver persists.
//!
//! Keys are big-endian integers (so they sort numerically) followed by names: a dentry key is
//! `parent ino ‖ name`, so one directory is one contiguous key range and readdir is a range scan;
//! stripe and xattr keys are prefixed by the inode the same way. Every value is one
//! format-version byte ([`FORMAT_VERSION`]) followed by a prost message, so a later release can
//! tell this release's records apart and migrate them; a value with an unknown version is a
//! `Corrupt` error, never a silent misread.

use cairn_common::{CairnError, Layout, Result};
use cairn_proto::Timespec;
use prost::Message;

/// Version byte written in front of every value.
pub const FORMAT_VERSION: u8 = 1;

// ---------------------------------------------------------------- keys

pub fn ino_key(ino: u64) -> Vec<u8> {
    ino.to_be_bytes().to_vec()
}

/// `parent ‖ name`: the key of one directory entry (or, with `name` empty, the start of the
/// directory's key range).
pub fn dentry_key(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + name.len());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// `ino ‖ name` of one extended attribute.
pub fn xattr_key(ino: u64, name: &[u8]) -> Vec<u8> {
    dentry_key(ino, name)
}

/// The name part of a dentry or xattr key.
pub fn name_of(key: &[u8]) -> &[u8] {
    key.get(8..).unwrap_or(&[])
}

/// The exclusive end of every key prefixed by `ino` (dentries, xattrs, stripes).
pub fn prefix_end(ino: u64) -> Vec<u8> {
    match ino.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => Vec::new(),
    }
}

pub fn stripe_key(ino: u64, stripe: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&ino.to_be_bytes());
    k.extend_from_slice(&stripe.to_be_bytes());
    k
}

/// The stripe index of a stripe key.
pub fn stripe_of(key: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = key
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| CairnError::corrupt(format!("stripe key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

pub fn node_key(id: u32) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

pub fn node_of(key: &[u8]) -> Result<u32> {
    let bytes: [u8; 4] =
        key.try_into().map_err(|_| CairnError::corrupt(format!("node key of {} bytes", key.len())))?;
    Ok(u32::from_be_bytes(bytes))
}

/// `epoch ‖ seq`: unique across restarts because the epoch is bumped at every open.
pub fn gc_key(epoch: u64, seq: u64) -> Vec<u8> {
    stripe_key(epoch, seq)
}

/// Keys of the counters column family.
/// The value of counter `key` (`counter::*`) in `store`, if it was ever written.
pub fn read_counter(store: &dyn crate::store::MetaStore, key: &[u8]) -> Result<Option<u64>> {
    store
        .get(crate::store::Cf::Counters, key)?
        .map(|v| decode::<Counter>("counter", &v).map(|c| c.value))
        .transpose()
}

pub mod counter {
    /// First inode number not yet reserved.
    pub const INO_RESERVED: &[u8] = b"ino_reserved";
    /// Epoch of garbage-collection keys, bumped at every open.
    pub const GC_EPOCH: &[u8] = b"gc_epoch";
    /// First client id not yet handed out.
    pub const NEXT_CLIENT: &[u8] = b"next_client";
    /// Prefix of the sharded statistics counters (`stats/NN`).
    pub const STATS_PREFIX: &[u8] = b"stats/";
    /// Next node id to assign.
    pub const NEXT_NODE: &[u8] = b"next_node";
    /// The cluster id: 32 hex digits, the bytes themselves (not a `Counter`).
    pub const CLUSTER_ID: &[u8] = b"cluster_id";
    /// Inode numbers that files lost with a restored backup may have used: pairs of big-endian
    /// `from u64 ‖ to u64` (half-open ranges), one appended by each restore (not a `Counter`).
    pub const FOREIGN_INOS: &[u8] = b"foreign_inos";
}

// ---------------------------------------------------------------- values

/// An inode: attributes, layout and (regular files) placement group.
#[derive(Clone, PartialEq, Message)]
pub struct Inode {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(uint32, tag = "2")]
    pub mode: u32,
    #[prost(uint32, tag = "3")]
    pub nlink: u32,
    #[prost(uint32, tag = "4")]
    pub uid: u32,
    #[prost(uint32, tag = "5")]
    pub gid: u32,
    #[prost(uint32, tag = "6")]
    pub rdev: u32,
    #[prost(uint64, tag = "7")]
    pub size: u64,
    #[prost(int64, tag = "8")]
    pub atime_sec: i64,
    #[prost(uint32, tag = "9")]
    pub atime_nsec: u32,
    #[prost(int64, tag = "10")]
    pub mtime_sec: i64,
    #[prost(uint32, tag = "11")]
    pub mtime_nsec: u32,
    #[prost(int64, tag = "12")]
    pub ctime_sec: i64,
    #[prost(uint32, tag = "13")]
    pub ctime_nsec: u32,
    #[prost(int64, tag = "14")]
    pub crtime_sec: i64,
    #[prost(uint32, tag = "15")]
    pub crtime_nsec: u32,
    #[prost(uint32, tag = "16")]
    pub k: u32,
    #[prost(uint32, tag = "17")]
    pub m: u32,
    #[prost(uint32, tag = "18")]
    pub unit: u32,
    /// Ordered chunkserver ids (regular files only); stripe s uses it rotated left by s.
    #[prost(uint32, repeated, tag = "19")]
    pub placement: Vec<u32>,
    /// Parent directory: of a directory, its one parent (the rename cycle check); of anything
    /// else, the directory of one of its names (of its last name once it has none), 0 where
    /// unknown (written before names were tracked). Subtree rules read it
    /// (`docs/ARCHITECTURE.md`, "Subtree rules").
    #[prost(uint64, tag = "20")]
    pub parent: u64,
    /// A non-directory's other names' directories, one element per name: with `parent`, the
    /// multiset of directories holding its `nlink` names.
    #[prost(uint64, repeated, tag = "21")]
    pub links: Vec<u64>,
    /// A directory an rmdir across metadata groups is removing: its transaction id, until
    /// decided; nothing new goes into it meanwhile (`namespace/txn.rs`).
    #[prost(bytes = "vec", tag = "22")]
    pub removing: Vec<u8>,
    /// A directory a rename across metadata groups is moving to another parent: its
    /// transaction id, until decided; `parent` is in flux meanwhile, so a loop check that meets
    /// it is refused (`namespace/txn/change.rs`).
    #[prost(bytes = "vec", tag = "23")]
    pub moving: Vec<u8>,
}

pub const S_IFMT: u32 = libc_consts::S_IFMT;
pub const S_IFDIR: u32 = libc_consts::S_IFDIR;
pub const S_IFREG: u32 = libc_consts::S_IFREG;
pub const S_IFLNK: u32 = libc_consts::S_IFLNK;
pub const S_IFIFO: u32 = libc_consts::S_IFIFO;
pub const S_IFCHR: u32 = libc_consts::S_IFCHR;
pub const S_IFBLK: u32 = libc_consts::S_IFBLK;
pub const S_IFSOCK: u32 = libc_consts::S_IFSOCK;
pub const S_ISGID: u32 = 0o2000;

/// The Linux values of the file type bits (as in stat(2); identical on every Linux arch).
mod libc_consts {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFSOCK: u32 = 0o140000;
    pub const S_IFLNK: u32 = 0o120000;
    pub const S_IFREG: u32 = 0o100000;
    pub const S_IFBLK: u32 = 0o060000;
    pub const S_IFDIR: u32 = 0o040000;
    pub const S_IFCHR: u32 = 0o020000;
    pub const S_IFIFO: u32 = 0o010000;
}

impl Inode {
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.kind() == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.kind() == S_IFLNK
    }

    pub fn layout(&self) -> Layout {
        Layout { k: self.k, m: self.m, unit: self.unit }
    }

    pub fn set_layout(&mut self, l: Layout) {
        self.k = l.k;
        self.m = l.m;
        self.unit = l.unit;
    }

    pub fn set_atime(&mut self, t: &Timespec) {
        (self.atime_sec, self.atime_nsec) = (t.sec, t.nsec);
    }
    pub fn set_mtime(&mut self, t: &Timespec) {
        (self.mtime_sec, self.mtime_nsec) = (t.sec, t.nsec);
    }
    pub fn set_ctime(&mut self, t: &Timespec) {
        (self.ctime_sec, self.ctime_nsec) = (t.sec, t.nsec);
    }

    /// Whether the directories of this non-directory's names are known (they are for every
    /// inode made since they are tracked, and after `cairn fsck --repair`).
    pub fn names_known(&self) -> bool {
        self.is_dir() || self.parent != 0
    }

    /// A new name of this non-directory in directory `dir` (a link).
    pub fn add_name(&mut self, dir: u64) {
        if !self.is_dir() && self.names_known() {
            self.links.push(dir);
        }
    }

    /// One name of this non-directory in `dir` removed (unlink, or replaced by a rename). The
    /// last name's directory stays in `parent`. A `dir` the record does not hold makes the
    /// names unknown (for fsck to report and repair) rather than wrong.
    pub fn drop_name(&mut self, dir: u64) {
        if self.is_dir() || !self.names_known() {
            return;
        }
        if self.parent == dir {
            if let Some(other) = self.links.pop() {
                self.parent = other;
            }
        } else if let Some(at) = self.links.iter().position(|d| *d == dir) {
            self.links.swap_remove(at);
        } else {
            self.forget_names();
        }
    }

    /// One name of this non-directory moved from directory `from` to `to` (a rename). A file
    /// whose names were unknown and that has one learns it.
    pub fn move_name(&mut self, from: u64, to: u64) {
        if self.is_dir() {
            return;
        }
        if !self.names_known() {
            if self.nlink == 1 {
                self.parent = to;
            }
            return;
        }
        if self.parent == from {
            self.parent = to;
        } else if let Some(at) = self.links.iter().position(|d| *d == from) {
            self.links[at] = to;
        } else {
            self.forget_names();
        }
    }

    fn forget_names(&mut self) {
        self.parent = 0;
        self.links.clear();
    }

    /// The directories of this non-directory's names (with repeats), as recorded.
    pub fn name_dirs(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.parent).chain(self.links.iter().copied())
    }

    /// A fresh inode with every time set to `now`.
    pub fn new(ino: u64, mode: u32, uid: u32, gid: u32, now: &Timespec) -> Inode {
        Inode {
            ino,
            mode,
            nlink: 1,
            uid,
            gid,
            atime_sec: now.sec,
            atime_nsec: now.nsec,
            mtime_sec: now.sec,
            mtime_nsec: now.nsec,
            ctime_sec: now.sec,
            ctime_nsec: now.nsec,
            crtime_sec: now.sec,
            crtime_nsec: now.nsec,
            ..Default::default()
        }
    }

    pub fn to_attr(&self) -> cairn_proto::Attr {
        let ts = |sec, nsec| Some(Timespec { sec, nsec });
        cairn_proto::Attr {
            ino: self.ino,
            size: self.size,
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            atime: ts(self.atime_sec, self.atime_nsec),
            mtime: ts(self.mtime_sec, self.mtime_nsec),
            ctime: ts(self.ctime_sec, self.ctime_nsec),
            crtime: ts(self.crtime_sec, self.crtime_nsec),
        }
    }
}

/// A directory entry: the child's inode and file type (so plain readdir needs no inode reads).
#[derive(Clone, PartialEq, Message)]
pub struct Dentry {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(uint32, tag = "2")]
    pub kind: u32,
    /// Not empty: the entry is a placeholder of a cross-group change not decided yet (its
    /// transaction id, `namespace/txn.rs`), absent to lookups and present to creations.
    #[prost(bytes = "vec", tag = "3")]
    pub txn: Vec<u8>,
}

impl Dentry {
    /// An ordinary entry.
    pub fn new(ino: u64, kind: u32) -> Dentry {
        Dentry { ino, kind, txn: Vec::new() }
    }

    /// Whether the entry is the placeholder of a mkdir across groups not decided yet (absent
    /// to lookups until committed).
    pub fn is_pending(&self) -> bool {
        !self.txn.is_empty() && self.ino == 0
    }

    /// Whether a change across groups not decided yet holds the entry (an rmdir removing it,
    /// an unlink or rename taking it away or replacing it): present until committed, and no
    /// other change may take it meanwhile.
    pub fn is_removing(&self) -> bool {
        !self.txn.is_empty() && self.ino != 0
    }
}

/// One side of a cross-group transaction (`namespace/txn.rs`), in `Cf::Txns` under its id.
#[derive(Clone, PartialEq, Message)]
pub struct TxnRecord {
    /// [`TXN_COORDINATOR`] or [`TXN_PARTICIPANT`].
    #[prost(uint32, tag = "1")]
    pub role: u32,
    /// [`TXN_PENDING`], [`TXN_COMMITTED`] or [`TXN_ABORTED`].
    #[prost(uint32, tag = "2")]
    pub state: u32,
    /// The other side's metadata group.
    #[prost(uint32, tag = "3")]
    pub peer_group: u32,
    /// When the record was last written (seconds since 1970).
    #[prost(int64, tag = "4")]
    pub written_sec: i64,
    /// The operation: [`TXN_MKDIR`], [`TXN_RMDIR`] or [`TXN_CHANGE`] (whose parent, name and
    /// inode are unused: its effects say what it does).
    #[prost(uint32, tag = "5")]
    pub op: u32,
    #[prost(uint64, tag = "6")]
    pub parent: u64,
    #[prost(bytes = "vec", tag = "7")]
    pub name: Vec<u8>,
    /// mkdir: the new directory, as asked (number 0) until the participant numbered it;
    /// rmdir: the directory removed (the coordinator knows only its number).
    #[prost(message, optional, tag = "8")]
    pub inode: Option<Inode>,
    /// The client change it does (`once.rs`), recorded with the commit: (client, sequence).
    #[prost(uint64, tag = "9")]
    pub client: u64,
    #[prost(uint64, tag = "10")]
    pub seq: u64,
    /// [`TXN_CHANGE`]: this side's effects (as prepared: what a name replaces filled in).
    #[prost(message, repeated, tag = "11")]
    pub effects: Vec<TxnEffect>,
    /// [`TXN_CHANGE`], the coordinator's: the participants' groups (all of them once
    /// committed; those asked once aborted).
    #[prost(uint32, repeated, tag = "12")]
    pub groups: Vec<u32>,
}

/// One group's part of a [`TXN_CHANGE`] transaction (`namespace/txn/change.rs`).
#[derive(Clone, PartialEq, Message)]
pub struct TxnEffect {
    /// [`EFFECT_UNNAME`], [`EFFECT_NAME`], [`EFFECT_RELINK`], [`EFFECT_REPARENT`] or
    /// [`EFFECT_DROP_DIR`].
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    /// unname, name: the entry's directory and name.
    #[prost(uint64, tag = "2")]
    pub parent: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub name: Vec<u8>,
    /// The inode the entry names (unname, name) or whose link count changes (relink).
    #[prost(uint64, tag = "4")]
    pub ino: u64,
    /// name: the entry's file type (`S_IF*`; 0 until the inode's group said it).
    #[prost(uint32, tag = "5")]
    pub entry_kind: u32,
    /// name: a non-directory there may be replaced (a rename without RENAME_NOREPLACE).
    #[prost(bool, tag = "6")]
    pub replace: bool,
    /// relink: -1, 0 or +1.
    #[prost(int32, tag = "7")]
    pub delta: i32,
    /// relink: the directory a name leaves (unlink, rename) and the one it goes to (link,
    /// rename); 0 where none. reparent: the directory's parent before and after. drop dir:
    /// `from`, the directory's parent.
    #[prost(uint64, tag = "8")]
    pub from: u64,
    #[prost(uint64, tag = "9")]
    pub to: u64,
    /// relink, drop dir: the uid that must own the inode (the sticky rule), where
    /// `owner_checked`.
    #[prost(bool, tag = "10")]
    pub owner_checked: bool,
    #[prost(uint32, tag = "11")]
    pub owner: u32,
    /// name: the caller whose write and search on the directory are checked, where
    /// `caller_checked` (its uid, then its groups, sorted); reparent: whose write on the moved
    /// directory is checked.
    #[prost(bool, tag = "12")]
    pub caller_checked: bool,
    #[prost(uint32, tag = "13")]
    pub caller_uid: u32,
    #[prost(uint32, repeated, tag = "14")]
    pub caller_groups: Vec<u32>,
    /// name, as prepared: the inode of the entry it replaces (0: the name was free) and, where
    /// that inode is another group's and the sticky rule asks it, the uid that must own it.
    #[prost(uint64, tag = "15")]
    pub replaced: u64,
    #[prost(bool, tag = "16")]
    pub replaced_owner_checked: bool,
    #[prost(uint32, tag = "17")]
    pub replaced_owner: u32,
    /// relink, as prepared: the inode (after a new name's link).
    #[prost(message, optional, tag = "18")]
    pub inode: Option<Inode>,
}

/// The effects of a [`TXN_CHANGE`] as one group prepares them (`TxnPrepareRequest.effects`).
#[derive(Clone, PartialEq, Message)]
pub struct TxnEffects {
    #[prost(message, repeated, tag = "1")]
    pub effects: Vec<TxnEffect>,
}

pub const EFFECT_UNNAME: u32 = 1;
pub const EFFECT_NAME: u32 = 2;
pub const EFFECT_RELINK: u32 = 3;
/// A directory's parent changes (a rename of a directory to another parent, in its group).
pub const EFFECT_REPARENT: u32 = 4;
/// An empty directory goes (a directory renamed over it, in its group).
pub const EFFECT_DROP_DIR: u32 = 5;

pub const TXN_COORDINATOR: u32 = 1;
pub const TXN_PARTICIPANT: u32 = 2;
pub const TXN_PENDING: u32 = 1;
pub const TXN_COMMITTED: u32 = 2;
pub const TXN_ABORTED: u32 = 3;
pub const TXN_MKDIR: u32 = 1;
pub const TXN_RMDIR: u32 = 2;
pub const TXN_CHANGE: u32 = 3;

/// One committed stripe of a file.
#[derive(Clone, PartialEq, Message)]
pub struct Stripe {
    #[prost(uint64, tag = "1")]
    pub version: u64,
    #[prost(uint64, tag = "2")]
    pub len: u64,
    #[prost(uint64, tag = "3")]
    pub written_len: u64,
    #[prost(uint32, tag = "4")]
    pub missing: u32,
    /// BLAKE3 of each data shard's stored bytes, `k` × 32 bytes (empty: written before content
    /// hashes existed). docs/ARCHITECTURE.md, "Content hashes".
    #[prost(bytes = "vec", tag = "5")]
    pub hashes: Vec<u8>,
}

/// A registered chunkserver.
#[derive(Clone, PartialEq, Message)]
pub struct Node {
    #[prost(string, tag = "1")]
    pub uuid: String,
    #[prost(string, tag = "2")]
    pub addr: String,
    /// [`NODE_ACTIVE`], [`NODE_DRAINING`] or [`NODE_REMOVED`].
    #[prost(uint32, tag = "3")]
    pub state: u32,
    /// The name of the TLS certificate the node registered with: only a chunkserver with a
    /// certificate of that name may heartbeat for the node or register as it again (empty:
    /// registered without TLS, or before certificates existed; bound at its next registration).
    #[prost(string, tag = "4")]
    pub cert: String,
}

/// Takes new files.
pub const NODE_ACTIVE: u32 = 0;
/// Gets no new files; the repair moves its shards to other nodes while it keeps serving.
pub const NODE_DRAINING: u32 = 1;
/// Forgotten: kept only so its uuid cannot register again by accident.
pub const NODE_REMOVED: u32 = 2;

/// One shard to delete from one chunkserver.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct GcShard {
    #[prost(uint32, tag = "1")]
    pub node: u32,
    #[prost(uint64, tag = "2")]
    pub ino: u64,
    #[prost(uint64, tag = "3")]
    pub stripe: u64,
    #[prost(uint32, tag = "4")]
    pub index: u32,
    #[prost(uint64, tag = "5")]
    pub version: u64,
}

/// Shards waiting for deletion, written in the same batch that made them garbage.
#[derive(Clone, PartialEq, Message)]
pub struct GcEntry {
    #[prost(message, repeated, tag = "1")]
    pub shards: Vec<GcShard>,
}

/// A symlink target.
#[derive(Clone, PartialEq, Message)]
pub struct SymlinkTarget {
    #[prost(bytes = "vec", tag = "1")]
    pub target: Vec<u8>,
}

/// An extended attribute value.
#[derive(Clone, PartialEq, Message)]
pub struct XattrValue {
    #[prost(bytes = "vec", tag = "1")]
    pub value: Vec<u8>,
}

/// A single counter (inode reservation, epochs, ids).
#[derive(Clone, PartialEq, Message)]
pub struct Counter {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// One shard of the statistics counters; the totals are the sums over all shards (a shard may
/// be negative on its own).
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Stats {
    #[prost(sint64, tag = "1")]
    pub files: i64,
    #[prost(sint64, tag = "2")]
    pub directories: i64,
    #[prost(sint64, tag = "3")]
    pub logical_bytes: i64,
    #[prost(sint64, tag = "4")]
    pub inodes: i64,
}

impl Stats {
    pub fn add(&mut self, d: &Stats) {
        self.files += d.files;
        self.directories += d.directories;
        self.logical_bytes += d.logical_bytes;
        self.inodes += d.inodes;
    }
    pub fn is_zero(&self) -> bool {
        *self == Stats::default()
    }
}

/// Encode a value: version byte then the message.
pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + m.encoded_len());
    out.push(FORMAT_VERSION);
    m.encode(&mut out).expect("a Vec grows as needed");
    out
}

/// Decode a value written by [`encode`]; `what` names the record in errors.
pub fn decode<M: Message + Default>(what: &str, bytes: &[u8]) -> Result<M> {
    match bytes.first() {
        None => Err(CairnError::corrupt(format!("empty {what} record"))),
        Some(&FORMAT_VERSION) => M::decode(&bytes[1..])
            .map_err(|e| CairnError::corrupt(format!("cannot decode {what} record: {e}"))),
        Some(v) => Err(CairnError::corrupt(format!(
            "{what} record has format version {v}; this metaserver reads version {FORMAT_VERSION} \
             (written by a newer release?)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_unknown_versions_are_corrupt() {
        let mut inode = Inode::new(42, S_IFREG | 0o644, 1, 2, &Timespec { sec: -5, nsec: 7 });
        inode.placement = vec![3, 1, 2];
        inode.set_layout(Layout::default());
        let bytes = encode(&inode);
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<Inode>("inode", &bytes).unwrap(), inode);
        let mut future = bytes.clone();
        future[0] = 2;
        let err = decode::<Inode>("inode", &future).unwrap_err();
        assert_eq!(err.kind(), cairn_common::ErrorKind::Corrupt);
        assert!(err.message().contains("format version 2"), "{err}");
        assert!(decode::<Inode>("inode", &[]).is_err());
        assert!(decode::<Inode>("inode", &[1, 0xff, 0xff]).is_err());
        let gc = GcEntry { shards: vec![GcShard { node: 1, ino: 2, stripe: 3, index: 4, version: 5 }] };
        assert_eq!(decode::<GcEntry>("gc", &encode(&gc)).unwrap(), gc);
        let s = Stats { files: -3, directories: 1, logical_bytes: -100, inodes: 0 };
        assert_eq!(decode::<Stats>("stats", &encode(&s)).unwrap(), s);
    }

    #[test]
    fn keys_sort_by_number_then_name() {
        assert!(dentry_key(1, b"zzz") < dentry_key(2, b""));
        assert!(dentry_key(256, b"a") > dentry_key(255, b"zz"));
        assert!(dentry_key(5, b"a") < dentry_key(5, b"a\0"));
        assert!(stripe_key(1, 255) < stripe_key(1, 256));
        assert_eq!(stripe_of(&stripe_key(9, 77)).unwrap(), 77);
        assert_eq!(name_of(&dentry_key(9, b"hello")), b"hello");
        assert_eq!(prefix_end(u64::MAX), Vec::<u8>::new());
        assert_eq!(node_of(&node_key(7)).unwrap(), 7);
    }
}
