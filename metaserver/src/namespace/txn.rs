//! Changes across metadata groups: the two sides of a two-phase commit, each step one entry of
//! its group's log (`docs/ARCHITECTURE.md`, "The first cross-group change: mkdir into another
//! group"). mkdir is the first: the coordinator is the parent's group (it writes the entry),
//! the participant the new directory's (it numbers and keeps the inode).
//!
//! The coordinator: [`Namespace::mkdir_begin`] (a placeholder entry and a `pending` record),
//! then [`Namespace::txn_commit`] with what the participant prepared or [`Namespace::txn_abort`],
//! then, once the participant acknowledged the decision, [`Namespace::txn_forget`]. The
//! participant: [`Namespace::txn_prepare`], then [`Namespace::txn_decide`]. Who sends what, and
//! recovery after a leader's loss, is the service's (`service/txn.rs`); everything here is
//! idempotent, so any step may be sent again.

use std::sync::Arc;

use cairn_common::ids::slot_of;
use cairn_common::{CairnError, ErrorKind, Result};

use super::entries::{inherit, NewEntry};
use super::{check_name, inos, once, Namespace};
use crate::schema::{
    self, read_counter, Dentry, Inode, TxnRecord, S_IFDIR, TXN_ABORTED, TXN_CHANGE, TXN_COMMITTED,
    TXN_COORDINATOR, TXN_MKDIR, TXN_PARTICIPANT, TXN_PENDING, TXN_RMDIR,
};
use crate::store::{Batch, Cf, MetaStore};

mod change;
mod exchange;
pub use change::{drop_dir, name, relink, reparent, unname};
pub use exchange::{change_across, mkdir_across, recover, rmdir_across, Changed, Made, Peers};

/// Where a group keeps the end of the transaction sequences it reserved.
const TXN_RESERVED: &[u8] = b"txn_reserved";

/// A coordinator record not yet known committed ([`Namespace::unsettled`]).
pub(crate) struct Unsettled<'a> {
    ns: &'a Namespace,
    id: TxnId,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        self.ns.unsettled.lock().retain(|id| *id != self.id);
    }
}

/// A transaction: the coordinator's group and a sequence it never hands out twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TxnId {
    pub group: u32,
    pub seq: u64,
}

impl TxnId {
    /// Its key in `Cf::Txns` (and the mark of its placeholder entry): 12 bytes, big-endian.
    pub fn key(&self) -> Vec<u8> {
        let mut k = self.group.to_be_bytes().to_vec();
        k.extend_from_slice(&self.seq.to_be_bytes());
        k
    }

    pub fn from_key(key: &[u8]) -> Result<TxnId> {
        if key.len() != 12 {
            return Err(CairnError::corrupt(format!(
                "a transaction id of {} bytes (12 expected)",
                key.len()
            )));
        }
        Ok(TxnId {
            group: u32::from_be_bytes(key[..4].try_into().expect("4 bytes")),
            seq: u64::from_be_bytes(key[4..].try_into().expect("8 bytes")),
        })
    }

    /// The lock-table key that serializes the steps of one transaction on one side.
    fn lock(&self) -> u64 {
        self.seq.rotate_left(17) ^ u64::from(self.group) ^ 0x7478_6e00_0000_0000
    }
}

impl std::fmt::Display for TxnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.group, self.seq)
    }
}

/// What a coordinator asks the participant to prepare.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepare {
    pub id: TxnId,
    /// [`TXN_MKDIR`] or [`TXN_RMDIR`].
    pub op: u32,
    pub parent: u64,
    pub name: Vec<u8>,
    /// mkdir: the new directory as asked (mode, owner, times, layout, parent; its number 0:
    /// the participant numbers it); rmdir: the directory to remove (its number only).
    pub inode: Inode,
}

/// Refuse a new entry in `dir` while an rmdir across groups is removing it.
pub(super) fn refuse_removing(dir: &Inode) -> Result<()> {
    if dir.removing.is_empty() {
        return Ok(());
    }
    Err(CairnError::not_found(format!("directory {} is being removed", dir.ino)))
}

/// Where a transaction stands, as its coordinator says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Committed,
    Aborted,
}

/// The counter of transaction sequences over `store`.
/// Move the transaction sequences of a group restored from a backup `gap` on (put in
/// `batch`): ids the lost changes handed out are never handed out again.
pub(super) fn prepare_restored(store: &dyn MetaStore, batch: &mut Batch, gap: u64) -> Result<()> {
    let next = read_counter(store, TXN_RESERVED)?.unwrap_or(1).max(1).saturating_add(gap);
    batch.put(Cf::Counters, TXN_RESERVED, schema::encode(&schema::Counter { value: next }));
    Ok(())
}

/// The counter of transaction sequences over `store`, and the first it hands out: a pending
/// transaction below it was begun by an earlier opening, whose leader nobody waits on.
pub(super) fn sequences(store: &dyn MetaStore) -> Result<(Arc<inos::Inos>, u64)> {
    let next = read_counter(store, TXN_RESERVED)?.unwrap_or(1).max(1);
    Ok((inos::Inos::counter(TXN_RESERVED.to_vec(), next), next))
}

impl Namespace {
    /// The record of transaction `id` on this side, if any.
    pub fn txn_record(&self, id: TxnId) -> Result<Option<TxnRecord>> {
        match self.store.get(Cf::Txns, &id.key())? {
            Some(v) => {
                let record: TxnRecord = schema::decode("transaction", &v)?;
                if ![TXN_MKDIR, TXN_RMDIR, TXN_CHANGE].contains(&record.op) {
                    return Err(CairnError::corrupt(format!(
                        "transaction {id} records operation {}, which this build does not know: it must \
                         not be skipped (run the build that wrote it)",
                        record.op
                    )));
                }
                Ok(Some(record))
            }
            None => Ok(None),
        }
    }

    /// Every transaction this side has not finished, in id order (what recovery walks).
    pub fn txns(&self) -> Result<Vec<(TxnId, TxnRecord)>> {
        let mut out = Vec::new();
        for (key, _) in self.store.scan(Cf::Txns, &[], &[], usize::MAX)? {
            let id = TxnId::from_key(&key)?;
            if let Some(record) = self.txn_record(id)? {
                out.push((id, record));
            }
        }
        Ok(out)
    }

    /// Whether the placeholder marked `txn` belongs to the change running on this thread (a
    /// client's try sent again).
    pub(super) fn is_own_txn(&self, txn: &[u8]) -> Result<bool> {
        let Some((client, seq)) = once::current() else { return Ok(false) };
        let Ok(id) = TxnId::from_key(txn) else { return Ok(false) };
        Ok(self.txn_record(id)?.is_some_and(|r| (r.client, r.seq) == (client, seq)))
    }

    fn put_record(batch: &mut Batch, id: TxnId, record: &TxnRecord) {
        batch.put(Cf::Txns, id.key(), schema::encode(record));
    }

    // ------------------------------------------------------------ the coordinator's side

    /// Step 1 of a mkdir whose directory goes to metadata group `group` (another than this
    /// one): check the parent and the name, and write the `pending` record and the name's
    /// placeholder in one durable entry. Answers what to ask `group` to prepare.
    pub fn mkdir_begin(&self, new: &NewEntry<'_>, group: u32) -> Result<Prepare> {
        check_name(new.name)?;
        if group == self.group {
            return Err(CairnError::invalid(format!(
                "mkdir in metadata group {group} is this group's own, not a change across groups"
            )));
        }
        self.locked(
            || vec![new.parent],
            || {
                let parent = self.dir(new.parent)?;
                refuse_removing(&parent)?;
                self.check_free(new.parent, new.name)?;
                if parent.nlink == u32::MAX {
                    return Err(CairnError::new(ErrorKind::TooBig, "too many subdirectories"));
                }
                let now = cairn_common::time::now();
                let mut inode = Inode::new(0, S_IFDIR | (new.mode & 0o7777), new.uid, new.gid, &now);
                inode.nlink = 2;
                inherit(&mut inode, &parent);
                let id = TxnId { group: self.group, seq: self.txn_seqs.next(&self.store)? };
                let (client, seq) = once::current().unwrap_or((0, 0));
                let record = TxnRecord {
                    role: TXN_COORDINATOR,
                    state: TXN_PENDING,
                    peer_group: group,
                    written_sec: now.sec,
                    op: TXN_MKDIR,
                    parent: new.parent,
                    name: new.name.to_vec(),
                    inode: Some(inode.clone()),
                    client,
                    seq,
                    ..Default::default()
                };
                let mut batch = Batch::new();
                Self::put_record(&mut batch, id, &record);
                let placeholder = schema::Dentry { ino: 0, kind: S_IFDIR, txn: id.key() };
                batch.put(
                    Cf::Dentries,
                    schema::dentry_key(new.parent, new.name),
                    schema::encode(&placeholder),
                );
                batch.set_durable();
                self.store.write(batch)?;
                Ok(Prepare { id, op: TXN_MKDIR, parent: new.parent, name: new.name.to_vec(), inode })
            },
        )
    }

    /// Step 1 of an rmdir of `name` in `parent` naming directory `ino`, which metadata group
    /// `group` (another than this one) holds: the entry is marked with the transaction (it
    /// stays visible until the commit) and the `pending` record written, in one durable entry.
    pub fn rmdir_begin(&self, parent: u64, name: &[u8], ino: u64, group: u32) -> Result<Prepare> {
        check_name(name)?;
        if group == self.group || self.holds_ino(ino) {
            return Err(CairnError::invalid(format!(
                "inode {ino} is this group's: its rmdir is this group's own"
            )));
        }
        self.locked(
            || vec![parent],
            || {
                self.dir(parent)?;
                let entry = self.dentry(parent, name)?.ok_or_else(|| {
                    CairnError::not_found(format!("no entry {:?}", String::from_utf8_lossy(name)))
                })?;
                if entry.is_removing() {
                    if self.is_own_txn(&entry.txn)? {
                        return Err(CairnError::unavailable(
                            "an earlier try of this rmdir, across metadata groups, is not decided yet: try again later",
                        ));
                    }
                    return Err(CairnError::not_found(format!(
                        "{:?} is being removed",
                        String::from_utf8_lossy(name)
                    )));
                }
                if entry.kind != S_IFDIR {
                    return Err(CairnError::new(ErrorKind::NotDir, "rmdir of a non-directory"));
                }
                if entry.ino != ino {
                    return Err(CairnError::unavailable(format!(
                        "{:?} was replaced meanwhile: try again",
                        String::from_utf8_lossy(name)
                    )));
                }
                let now = cairn_common::time::now();
                let id = TxnId { group: self.group, seq: self.txn_seqs.next(&self.store)? };
                let (client, seq) = once::current().unwrap_or((0, 0));
                let asked = Inode { ino, mode: S_IFDIR, ..Default::default() };
                let record = TxnRecord {
                    role: TXN_COORDINATOR,
                    state: TXN_PENDING,
                    peer_group: group,
                    written_sec: now.sec,
                    op: TXN_RMDIR,
                    parent,
                    name: name.to_vec(),
                    inode: Some(asked.clone()),
                    client,
                    seq,
                    ..Default::default()
                };
                let mut batch = Batch::new();
                Self::put_record(&mut batch, id, &record);
                let marked = Dentry { ino, kind: S_IFDIR, txn: id.key() };
                batch.put(Cf::Dentries, schema::dentry_key(parent, name), schema::encode(&marked));
                batch.set_durable();
                self.store.write(batch)?;
                Ok(Prepare { id, op: TXN_RMDIR, parent, name: name.to_vec(), inode: asked })
            },
        )
    }

    /// The coordinator's record of `id`, refused if it is not one.
    fn coordinated(&self, id: TxnId) -> Result<Option<TxnRecord>> {
        match self.txn_record(id)? {
            Some(r) if r.role != TXN_COORDINATOR => Err(CairnError::invalid(format!(
                "this group takes part in transaction {id}; it does not lead it"
            ))),
            found => Ok(found),
        }
    }

    /// Step 3, yes: the participant prepared `prepared` (the new directory, numbered in its
    /// slots). The real entry replaces the placeholder, the parent counts the new
    /// subdirectory and the record says `committed`, in one entry (with the client's
    /// once-record): from here the mkdir has happened. Answers the directory.
    pub fn txn_commit(&self, id: TxnId, prepared: &Inode) -> Result<Inode> {
        let Some(record) = self.coordinated(id)? else {
            return Err(CairnError::not_found(format!("no transaction {id} to commit")));
        };
        if record.op == TXN_CHANGE {
            return Err(CairnError::invalid(format!(
                "transaction {id} is a change: it commits with its effects"
            )));
        }
        let asked = record.inode.clone().unwrap_or_default();
        let as_asked = match record.op {
            TXN_MKDIR => {
                prepared.ino != 0
                    && prepared.is_dir()
                    && prepared.parent == record.parent
                    && (prepared.mode, prepared.uid, prepared.gid) == (asked.mode, asked.uid, asked.gid)
            }
            _ => prepared.ino == asked.ino && prepared.is_dir(),
        };
        if !as_asked {
            return Err(CairnError::invalid(format!(
                "metadata group {} prepared transaction {id} with a directory other than the one asked",
                record.peer_group
            )));
        }
        if let Some(map) = self.slots_map() {
            if map.owner_of(prepared.ino).0 != record.peer_group {
                return Err(CairnError::invalid(format!(
                    "metadata group {} numbered the directory of transaction {id} in namespace slot {}, \
                     which it does not own",
                    record.peer_group,
                    slot_of(prepared.ino)
                )));
            }
        }
        self.locked(
            || vec![record.parent, id.lock()],
            || {
                let Some(mut record) = self.coordinated(id)? else {
                    return Err(CairnError::not_found(format!("no transaction {id} to commit")));
                };
                match record.state {
                    TXN_COMMITTED => return Ok(record.inode.unwrap_or_default()),
                    TXN_ABORTED => {
                        return Err(CairnError::new(
                            ErrorKind::Interrupted,
                            format!("transaction {id} was aborted (its participant did not answer in time)"),
                        ))
                    }
                    _ => {}
                }
                let now = cairn_common::time::now();
                let mut tx = self.tx();
                let parent = tx.get(record.parent)?;
                if record.op == TXN_MKDIR {
                    parent.nlink = parent.nlink.saturating_add(1);
                } else {
                    parent.nlink = parent.nlink.saturating_sub(1).max(2);
                }
                parent.set_mtime(&now);
                parent.set_ctime(&now);
                if record.op == TXN_MKDIR {
                    tx.put_dentry(record.parent, &record.name, prepared.ino, S_IFDIR);
                } else if self.stored_dentry(record.parent, &record.name)?.is_some_and(|d| d.txn == id.key())
                {
                    tx.delete_dentry(record.parent, &record.name);
                }
                record.state = TXN_COMMITTED;
                record.written_sec = now.sec;
                record.inode = Some(prepared.clone());
                Self::put_record(&mut tx.batch, id, &record);
                tx.commit()?;
                Ok(prepared.clone())
            },
        )
    }

    /// Step 3, no (the participant refused, did not answer in time, or the leader that waited
    /// is gone): the placeholder goes and the record says `aborted` until the participant
    /// acknowledged. Refused for a committed transaction; nothing to do for one not here.
    pub fn txn_abort(&self, id: TxnId) -> Result<()> {
        let Some(record) = self.coordinated(id)? else { return Ok(()) };
        if record.op == TXN_CHANGE {
            // Those it planned to ask are told; one it learned of later asks how it ended.
            return self.change_abort(id, &record.groups);
        }
        self.locked(
            || vec![record.parent, id.lock()],
            || {
                let Some(mut record) = self.coordinated(id)? else { return Ok(()) };
                match record.state {
                    TXN_ABORTED => return Ok(()),
                    TXN_COMMITTED => {
                        return Err(CairnError::invalid(format!(
                            "transaction {id} is committed: it cannot abort"
                        )))
                    }
                    _ => {}
                }
                let mut batch = Batch::new();
                let key = schema::dentry_key(record.parent, &record.name);
                match self.stored_dentry(record.parent, &record.name)? {
                    Some(d) if d.txn == id.key() && record.op == TXN_MKDIR => batch.delete(Cf::Dentries, key),
                    Some(d) if d.txn == id.key() => {
                        batch.put(Cf::Dentries, key, schema::encode(&Dentry::new(d.ino, d.kind)))
                    }
                    _ => {}
                }
                record.state = TXN_ABORTED;
                record.written_sec = cairn_common::time::now().sec;
                Self::put_record(&mut batch, id, &record);
                self.store.write(batch)
            },
        )
    }

    /// Step 5: the participant acknowledged the decision; the record goes. A pending record
    /// stays (it is decided first).
    pub fn txn_forget(&self, id: TxnId) -> Result<()> {
        self.locked(
            || vec![id.lock()],
            || match self.coordinated(id)? {
                Some(r) if r.state == TXN_PENDING => {
                    Err(CairnError::invalid(format!("transaction {id} is not decided yet")))
                }
                Some(_) => {
                    let mut batch = Batch::new();
                    batch.delete(Cf::Txns, id.key());
                    self.store.write(batch)
                }
                None => Ok(()),
            },
        )
    }

    /// Where transaction `id`, which this group leads, stands (`TxnOutcome`). No record: it was
    /// aborted — a committed one is forgotten only after its participant acknowledged, so a
    /// participant still asking cannot be one whose transaction committed. Read outside any
    /// change, from applied state only: inside one it could answer "committed" from a proposed
    /// commit that then fails (and the next leader aborts).
    pub fn txn_outcome(&self, id: TxnId) -> Result<Outcome> {
        if id.group != self.group {
            return Err(CairnError::invalid(format!(
                "transaction {id} is led by metadata group {}, not this one ({})",
                id.group, self.group
            )));
        }
        if self.unsettled.lock().contains(&id) {
            // Its record is on its way to the log: no outcome yet.
            return Ok(Outcome::Pending);
        }
        Ok(match self.coordinated(id)?.map(|r| r.state) {
            Some(TXN_PENDING) => Outcome::Pending,
            Some(TXN_COMMITTED) => Outcome::Committed,
            _ => Outcome::Aborted,
        })
    }

    /// Mark coordinator record `id` as proposed and not yet known committed until the guard
    /// is dropped: its participants may be asked before its commit ([`exchange`]), and one
    /// that asks how it ended meanwhile must hear `Pending` — "no record" would read as an
    /// abort the coordinator has not decided.
    pub(crate) fn unsettled(&self, id: TxnId) -> Unsettled<'_> {
        self.unsettled.lock().push(id);
        Unsettled { ns: self, id }
    }

    // ------------------------------------------------------------ the participant's side

    /// Step 2: prepare this group's part in one durable entry with its `pending` record, and
    /// answer the directory concerned; a prepare sent again answers the same. mkdir: number
    /// the directory asked for in this group's slots and keep it in the record (nothing can
    /// reach it until the coordinator's entry names it). rmdir: check the directory is empty
    /// and mark it (`Inode.removing`: nothing new goes into it until decided).
    pub fn txn_prepare(&self, prepare: &Prepare) -> Result<Inode> {
        let id = prepare.id;
        if id.group == self.group {
            return Err(CairnError::invalid(format!("transaction {id} is this group's own")));
        }
        check_name(&prepare.name)?;
        let asked = &prepare.inode;
        match prepare.op {
            TXN_MKDIR => {
                if asked.ino != 0 || !asked.is_dir() || asked.nlink != 2 || asked.parent != prepare.parent {
                    return Err(CairnError::invalid(format!(
                        "transaction {id} asks for a malformed directory"
                    )));
                }
                asked.layout().validate()?;
            }
            TXN_RMDIR if asked.ino != 0 && self.holds_ino(asked.ino) => {}
            TXN_RMDIR => {
                return Err(CairnError::invalid(format!(
                    "transaction {id} removes inode {}, which is not this group's",
                    asked.ino
                )))
            }
            op => {
                return Err(CairnError::invalid(format!(
                    "transaction {id}: operation {op} is not known here"
                )))
            }
        }
        self.locked(
            || [id.lock()].into_iter().chain((prepare.op == TXN_RMDIR).then_some(asked.ino)).collect(),
            || {
                if let Some(record) = self.txn_record(id)? {
                    let same = record.op == prepare.op
                        && record.parent == prepare.parent
                        && record.name == prepare.name;
                    return match (record.role, record.state, record.inode) {
                        (TXN_PARTICIPANT, TXN_PENDING, Some(inode)) if same => Ok(inode),
                        _ => Err(CairnError::invalid(format!(
                            "transaction {id} is already recorded here in another state"
                        ))),
                    };
                }
                let mut batch = Batch::new();
                let (inode, numbered) = if prepare.op == TXN_MKDIR {
                    // Held until the record is proposed: the slot cannot be promised away
                    // meanwhile.
                    let numbered = self.number(prepare.parent, &prepare.name, true)?;
                    (Inode { ino: numbered.ino, ..asked.clone() }, Some(numbered))
                } else {
                    let mut dir = self.inode(asked.ino)?;
                    if !dir.is_dir() {
                        return Err(CairnError::new(ErrorKind::NotDir, "rmdir of a non-directory"));
                    }
                    if dir.parent != prepare.parent {
                        return Err(CairnError::new(
                            ErrorKind::Interrupted,
                            format!("directory {} has moved meanwhile: try again", dir.ino),
                        ));
                    }
                    if !dir.removing.is_empty() {
                        return Err(CairnError::not_found(format!("directory {} is being removed", dir.ino)));
                    }
                    if !dir.moving.is_empty() {
                        return Err(CairnError::unavailable(format!(
                            "directory {} is being moved across metadata groups: try again",
                            dir.ino
                        )));
                    }
                    if !self.dir_is_empty(dir.ino)? {
                        return Err(CairnError::new(ErrorKind::NotEmpty, "directory not empty"));
                    }
                    dir.removing = id.key();
                    batch.put(Cf::Inodes, schema::ino_key(dir.ino), schema::encode(&dir));
                    (dir, None)
                };
                let record = TxnRecord {
                    role: TXN_PARTICIPANT,
                    state: TXN_PENDING,
                    peer_group: id.group,
                    written_sec: cairn_common::time::now().sec,
                    op: prepare.op,
                    parent: prepare.parent,
                    name: prepare.name.clone(),
                    inode: Some(inode.clone()),
                    client: 0,
                    seq: 0,
                    ..Default::default()
                };
                Self::put_record(&mut batch, id, &record);
                batch.set_durable();
                self.store.write(batch)?;
                drop(numbered);
                Ok(inode)
            },
        )
    }

    /// Step 4: apply or drop the prepared change, and forget the record, in one entry — mkdir:
    /// the directory written (or dropped with the record); rmdir: the directory deleted (or its
    /// mark cleared). A decision for a record this side no longer has was applied before:
    /// acknowledged.
    pub fn txn_decide(&self, id: TxnId, commit: bool) -> Result<()> {
        // The directory's lock too, read again under the locks (a prepare may land meanwhile).
        let ino = || self.txn_record(id).ok().flatten().and_then(|r| r.inode).map_or(0, |i| i.ino);
        // A change's: each entry's directory and inode its effects touch. Answers whether it
        // decided a change (the crash tests' point after it is taken).
        let decided = self.locked(
            || [id.lock(), ino()].into_iter().chain(self.decide_locks(id)).collect(),
            || {
                let Some(record) = self.txn_record(id)? else { return Ok(false) };
                if record.role != TXN_PARTICIPANT {
                    return Err(CairnError::invalid(format!("this group leads transaction {id}")));
                }
                if record.op == TXN_CHANGE {
                    self.decide_change(id, &record, commit)?;
                    return Ok(true);
                }
                let inode = record.inode.ok_or_else(|| {
                    CairnError::corrupt(format!("prepared transaction {id} holds no directory"))
                })?;
                let mut tx = self.tx();
                match (record.op, commit) {
                    (TXN_MKDIR, true) => {
                        tx.stats.inodes += 1;
                        tx.stats.directories += 1;
                        tx.insert(inode);
                    }
                    (TXN_MKDIR, false) => {}
                    (_, true) => {
                        if self.try_inode(inode.ino)?.is_some_and(|d| d.removing == id.key()) {
                            tx.destroy(inode.ino)?;
                        }
                    }
                    (_, false) => {
                        if self.try_inode(inode.ino)?.is_some_and(|d| d.removing == id.key()) {
                            tx.get(inode.ino)?.removing.clear();
                        }
                    }
                }
                tx.batch.delete(Cf::Txns, id.key());
                tx.commit().map(|()| false)
            },
        )?;
        if decided {
            exchange::crash_point("change-participant-decided");
        }
        Ok(())
    }

    /// Whether inode `ino` would be this group's: group 0 numbers only in slot 0 (and only
    /// empty slots ever move to it), another group in the slots its map gives it.
    pub(super) fn holds_ino(&self, ino: u64) -> bool {
        match self.slots_map() {
            Some(map) => map.owner_of(ino).0 == self.group,
            None => slot_of(ino) == 0,
        }
    }

    /// Refuse `doing` something to an entry naming `ino` when another group holds it (a
    /// directory a mkdir across groups made): rmdir and rename of one are not built yet
    /// (`CrossDevice`, so `mv` copies).
    pub(super) fn refuse_elsewhere(&self, ino: u64, doing: &str) -> Result<()> {
        if self.holds_ino(ino) {
            return Ok(());
        }
        Err(CairnError::new(
            ErrorKind::CrossDevice,
            format!(
                "{doing} a directory another metadata group holds (inode {ino}) is not built yet \
                 (docs/ARCHITECTURE.md, \"Several metadata groups\")"
            ),
        ))
    }

    /// The group map this namespace numbers by (a group other than 0's).
    fn slots_map(&self) -> Option<&Arc<crate::groups::Groups>> {
        self.slots.as_ref().map(|s| s.map())
    }
}
