//! Unlink, link and rename of files across metadata groups: one transaction kind
//! ([`TXN_CHANGE`]) whose records carry each group's **effects** — an entry named or unnamed, a
//! link count changed — prepared, applied or undone by the group that holds what they touch
//! (`docs/ARCHITECTURE.md`, "Unlink, link and rename of files across groups"). The steps and
//! their order are [`super`]'s (begin, prepare, commit or abort, decide, forget); who is asked
//! when is `exchange.rs`'s.

use cairn_common::{CairnError, ErrorKind, Result};

use super::TxnId;
use crate::namespace::{check_name, once, Namespace, Tx};
use crate::permissions::{Who, MAY_EXEC, MAY_WRITE};
use crate::schema::{
    self, Dentry, TxnEffect, TxnRecord, EFFECT_DROP_DIR, EFFECT_NAME, EFFECT_RELINK, EFFECT_REPARENT,
    EFFECT_UNNAME, S_IFDIR, TXN_ABORTED, TXN_CHANGE, TXN_COMMITTED, TXN_COORDINATOR, TXN_PARTICIPANT,
    TXN_PENDING,
};
use crate::store::Cf;

/// Take the entry `name` of `parent`, which names `ino`, away.
pub fn unname(parent: u64, name: &[u8], ino: u64) -> TxnEffect {
    TxnEffect { kind: EFFECT_UNNAME, parent, name: name.to_vec(), ino, ..Default::default() }
}

/// Make the entry `name` of `parent` name `ino` (of file type `kind`, 0 until its group says),
/// replacing a non-directory there where `replace`; `caller`, where checked, must have write
/// and search on `parent` and pass the sticky rule for what it replaces.
pub fn name(parent: u64, name: &[u8], ino: u64, kind: u32, replace: bool, caller: Option<&Who>) -> TxnEffect {
    TxnEffect {
        kind: EFFECT_NAME,
        parent,
        name: name.to_vec(),
        ino,
        entry_kind: kind,
        replace,
        caller_checked: caller.is_some(),
        caller_uid: caller.map_or(0, |w| w.uid),
        caller_groups: caller.map_or(Vec::new(), |w| w.groups().to_vec()),
        ..Default::default()
    }
}

/// Change the link count of `ino` by `delta` (a name leaving `from`, going to `to`, or both);
/// `owner`, where set, is the uid that must own it (the sticky rule).
pub fn relink(ino: u64, delta: i32, (from, to): (u64, u64), owner: Option<u32>) -> TxnEffect {
    TxnEffect {
        kind: EFFECT_RELINK,
        ino,
        delta,
        from,
        to,
        owner_checked: owner.is_some(),
        owner: owner.unwrap_or(0),
        ..Default::default()
    }
}

/// Move directory `ino` from parent `from` to `to` (the same: a rename within its directory,
/// its ctime only); `caller`, where checked, must have write on it when its parent changes.
pub fn reparent(ino: u64, (from, to): (u64, u64), caller: Option<&Who>) -> TxnEffect {
    TxnEffect {
        kind: EFFECT_REPARENT,
        ino,
        from,
        to,
        entry_kind: S_IFDIR,
        caller_checked: caller.is_some(),
        caller_uid: caller.map_or(0, |w| w.uid),
        caller_groups: caller.map_or(Vec::new(), |w| w.groups().to_vec()),
        ..Default::default()
    }
}

/// Remove empty directory `ino` of parent `from`, which a directory renamed over it replaces;
/// `owner`, where set, is the uid that must own it (the sticky rule).
pub fn drop_dir(ino: u64, from: u64, owner: Option<u32>) -> TxnEffect {
    TxnEffect {
        kind: EFFECT_DROP_DIR,
        ino,
        from,
        owner_checked: owner.is_some(),
        owner: owner.unwrap_or(0),
        ..Default::default()
    }
}

/// Whether `effects` move a directory (its group's rename lock is taken to mark it).
fn moves_dir(effects: &[TxnEffect]) -> bool {
    effects.iter().any(|e| e.kind == EFFECT_REPARENT)
}

fn quoted(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

impl Namespace {
    /// The locks a change of `effects` takes: the transaction's, each entry's directory and
    /// each inode concerned (a file an entry replaces here included).
    fn effect_locks(&self, id: TxnId, effects: &[TxnEffect]) -> Vec<u64> {
        let mut locks = vec![id.lock()];
        for e in effects {
            match e.kind {
                EFFECT_RELINK | EFFECT_REPARENT | EFFECT_DROP_DIR => locks.push(e.ino),
                _ => {
                    locks.push(e.parent);
                    locks.extend(self.peek(e.parent, &e.name));
                }
            }
        }
        locks
    }

    /// Check `effects` (well formed, of this group) before anything is locked.
    fn check_effects(&self, effects: &[TxnEffect]) -> Result<()> {
        if effects.is_empty() {
            return Err(CairnError::invalid("a change across metadata groups with nothing to do here"));
        }
        for e in effects {
            let ok = match e.kind {
                EFFECT_UNNAME | EFFECT_NAME => {
                    check_name(&e.name)?;
                    self.holds_ino(e.parent) && e.ino != 0
                }
                EFFECT_RELINK => self.holds_ino(e.ino) && (-1..=1).contains(&e.delta),
                EFFECT_REPARENT => self.holds_ino(e.ino) && e.from != 0 && e.to != 0,
                EFFECT_DROP_DIR => self.holds_ino(e.ino) && e.from != 0,
                _ => false,
            };
            if !ok {
                return Err(CairnError::invalid(format!(
                    "a change across metadata groups asks this group (metadata group {}) for an effect \
                     it cannot take: kind {}, directory {}, inode {}",
                    self.group, e.kind, e.parent, e.ino
                )));
            }
        }
        Ok(())
    }

    /// Prepare `effects` in `tx` for transaction `id`: mark the entries taken away or replaced,
    /// write placeholders for new names, raise the link count of an inode getting a new name;
    /// each effect is filled in with what it found (the file a name replaces, an inode as it
    /// is now). Refused as the same change done here would be.
    fn prepare_effects(&self, id: TxnId, effects: &mut [TxnEffect], tx: &mut Tx<'_>) -> Result<()> {
        let now = cairn_common::time::now();
        for e in effects.iter_mut() {
            match e.kind {
                EFFECT_UNNAME => {
                    self.dir(e.parent)?;
                    let entry = self.stored_dentry(e.parent, &e.name)?.filter(|d| !d.is_pending());
                    let Some(entry) = entry else {
                        return Err(CairnError::not_found(format!("no entry {}", quoted(&e.name))));
                    };
                    self.refuse_held(&entry, &e.name)?;
                    if entry.ino != e.ino {
                        return Err(CairnError::new(
                            ErrorKind::Interrupted,
                            format!("{} was replaced meanwhile: try again", quoted(&e.name)),
                        ));
                    }
                    e.entry_kind = entry.kind;
                    let marked = Dentry { ino: entry.ino, kind: entry.kind, txn: id.key() };
                    tx.batch.put(
                        Cf::Dentries,
                        schema::dentry_key(e.parent, &e.name),
                        schema::encode(&marked),
                    );
                }
                EFFECT_NAME => self.prepare_name(id, e, tx)?,
                EFFECT_REPARENT => self.prepare_reparent(id, e, tx)?,
                EFFECT_DROP_DIR => {
                    let dir = self.inode(e.ino)?;
                    if !dir.is_dir() || dir.parent != e.from {
                        return Err(CairnError::new(
                            ErrorKind::Interrupted,
                            format!("directory {} was replaced or moved meanwhile: try again", e.ino),
                        ));
                    }
                    if e.owner_checked && dir.uid != e.owner {
                        return Err(CairnError::new(
                            ErrorKind::NotPermitted,
                            format!(
                                "uid {} may not replace directory {} (owner {}) in a sticky directory it does \
                                 not own",
                                e.owner, e.ino, dir.uid
                            ),
                        ));
                    }
                    self.prepare_replaced_dir(id, e.ino, tx)?;
                }
                _ => {
                    let inode = tx.get(e.ino)?;
                    if inode.is_dir() {
                        return Err(if e.delta > 0 {
                            CairnError::new(ErrorKind::NotPermitted, "cannot hard-link a directory")
                        } else {
                            CairnError::new(
                                ErrorKind::CrossDevice,
                                "a directory moves across metadata groups only by mkdir and rmdir",
                            )
                        });
                    }
                    if e.owner_checked && inode.uid != e.owner {
                        return Err(CairnError::new(
                            ErrorKind::NotPermitted,
                            format!(
                                "uid {} may not remove or replace inode {} (owner {}) in a sticky directory \
                                 it does not own",
                                e.owner, inode.ino, inode.uid
                            ),
                        ));
                    }
                    if e.delta >= 0 && !inode.names_known() {
                        // Its names' directories are not listed (a file from before they were), so
                        // a name in another group could not be counted where fsck finds it.
                        return Err(CairnError::new(
                            ErrorKind::CrossDevice,
                            format!(
                                "inode {} does not list the directories of its names: it is not named across metadata \
                                 groups",
                                inode.ino
                            ),
                        ));
                    }
                    if e.delta > 0 {
                        if inode.nlink == u32::MAX {
                            return Err(CairnError::new(ErrorKind::TooBig, "too many links"));
                        }
                        // Applied now: the inode cannot be freed while its new name is undecided.
                        inode.nlink += 1;
                        inode.add_name(e.to);
                        inode.set_ctime(&now);
                    }
                    e.inode = Some(inode.clone());
                }
            }
        }
        Ok(())
    }

    /// Prepare a directory's move: it is a directory under `from`, neither removed nor moved by
    /// another change, the caller may change its `..`; marked (`Inode.moving`) until decided.
    fn prepare_reparent(&self, id: TxnId, e: &mut TxnEffect, tx: &mut Tx<'_>) -> Result<()> {
        let dir = tx.get(e.ino)?;
        if !dir.is_dir() {
            return Err(CairnError::new(ErrorKind::NotDir, format!("inode {} is not a directory", e.ino)));
        }
        if !dir.removing.is_empty() {
            return Err(CairnError::not_found(format!("directory {} is being removed", e.ino)));
        }
        if !dir.moving.is_empty() && dir.moving != id.key() {
            return Err(CairnError::unavailable(format!(
                "directory {} is being moved by another change across metadata groups: try again",
                e.ino
            )));
        }
        if dir.parent != e.from {
            return Err(CairnError::new(
                ErrorKind::Interrupted,
                format!("directory {} has moved meanwhile: try again", e.ino),
            ));
        }
        e.inode = Some(dir.clone());
        if e.from == e.to {
            // Renamed within its directory: its parent stays, nothing to mark (its ctime
            // changes at the commit).
            return Ok(());
        }
        if e.caller_checked {
            let who = Who::resolved(e.caller_uid, e.caller_groups.clone());
            who.check(dir, MAY_WRITE, "rename of a directory to another parent")?;
        }
        dir.moving = id.key();
        Ok(())
    }

    /// Prepare a new name: a placeholder where it is free, a mark on the file it replaces.
    fn prepare_name(&self, id: TxnId, e: &mut TxnEffect, tx: &mut Tx<'_>) -> Result<()> {
        let dir = self.dir(e.parent)?;
        super::refuse_removing(&dir)?;
        let who = e.caller_checked.then(|| Who::resolved(e.caller_uid, e.caller_groups.clone()));
        if let Some(who) = &who {
            who.check(&dir, MAY_WRITE | MAY_EXEC, "rename")?;
        }
        let key = schema::dentry_key(e.parent, &e.name);
        e.replaced = 0;
        match self.stored_dentry(e.parent, &e.name)? {
            None => {
                let placeholder = Dentry { ino: 0, kind: e.entry_kind, txn: id.key() };
                tx.batch.put(Cf::Dentries, key, schema::encode(&placeholder));
            }
            Some(there) if there.is_pending() => {
                // Another change's new name, not decided: free again if it aborts.
                self.check_free(e.parent, &e.name).map_err(|_| {
                    CairnError::unavailable(format!(
                        "{} is being made by another change across metadata groups: try again",
                        quoted(&e.name)
                    ))
                })?;
            }
            Some(there) => {
                self.refuse_held(&there, &e.name)?;
                if !e.replace {
                    return Err(CairnError::new(ErrorKind::Exists, format!("{} exists", quoted(&e.name))));
                }
                if there.ino == e.ino {
                    // Two names of one file: the rename does nothing (POSIX).
                    e.replaced = there.ino;
                    return Ok(());
                }
                match (e.entry_kind == S_IFDIR, there.kind == S_IFDIR) {
                    (false, true) => {
                        return Err(CairnError::new(
                            ErrorKind::IsDir,
                            "rename: a non-directory over a directory",
                        ))
                    }
                    (true, false) => {
                        return Err(CairnError::new(
                            ErrorKind::NotDir,
                            "rename: a directory over a non-directory",
                        ))
                    }
                    // One of another group is asked there (a drop-dir effect).
                    (true, true) if self.holds_ino(there.ino) => {
                        self.prepare_replaced_dir(id, there.ino, tx)?
                    }
                    (true, true) => {}
                    (false, false) => {}
                }
                e.replaced = there.ino;
                if let Some((who, owner)) = who.as_ref().and_then(|w| Some((w, w.sticky_owner(&dir)?))) {
                    if self.holds_ino(there.ino) {
                        who.check_sticky(&dir, &self.inode(there.ino)?)?;
                    } else {
                        // Its owner is known where it is: asked there.
                        e.replaced_owner_checked = true;
                        e.replaced_owner = owner;
                    }
                }
                let marked = Dentry { ino: there.ino, kind: there.kind, txn: id.key() };
                tx.batch.put(Cf::Dentries, key, schema::encode(&marked));
            }
        }
        Ok(())
    }

    /// Prepare the removal of directory `ino` (this group's), which a directory renamed over
    /// it replaces: it must be empty; marked `removing` so nothing goes into it until decided.
    fn prepare_replaced_dir(&self, id: TxnId, ino: u64, tx: &mut Tx<'_>) -> Result<()> {
        if !self.dir_is_empty(ino)? {
            return Err(CairnError::new(ErrorKind::NotEmpty, "rename: the target directory is not empty"));
        }
        let dir = tx.get(ino)?;
        if !dir.removing.is_empty() || !dir.moving.is_empty() {
            return Err(CairnError::unavailable(format!(
                "directory {ino} is being changed across metadata groups: try again"
            )));
        }
        dir.removing = id.key();
        Ok(())
    }

    /// Refuse to take an entry another change across groups holds (`NotFound`: it is going;
    /// to a try of this same change sent again, `Unavailable`: its first try is not decided).
    pub(in crate::namespace) fn refuse_held(&self, entry: &Dentry, name: &[u8]) -> Result<()> {
        if entry.txn.is_empty() {
            return Ok(());
        }
        if self.is_own_txn(&entry.txn)? {
            return Err(CairnError::unavailable(format!(
                "{} is held by an earlier try of this change, across metadata groups, not decided yet: \
                 try again later",
                quoted(name)
            )));
        }
        Err(CairnError::new(
            ErrorKind::Unavailable,
            format!("{} is being changed across metadata groups: try again", quoted(name)),
        ))
    }

    /// Apply (`commit`) or undo prepared `effects` of transaction `id` in `tx`. What another
    /// step already settled (an entry no longer marked by `id`) is left alone.
    fn settle_effects(&self, id: TxnId, effects: &[TxnEffect], commit: bool, tx: &mut Tx<'_>) -> Result<()> {
        let now = cairn_common::time::now();
        let ours = |e: &TxnEffect| -> Result<Option<Dentry>> {
            Ok(self.stored_dentry(e.parent, &e.name)?.filter(|d| d.txn == id.key()))
        };
        for e in effects {
            match (e.kind, commit) {
                (EFFECT_UNNAME | EFFECT_NAME, _) => {
                    let Some(held) = ours(e)? else { continue };
                    if !commit {
                        if held.ino == 0 {
                            tx.delete_dentry(e.parent, &e.name);
                        } else {
                            tx.put_dentry(e.parent, &e.name, held.ino, held.kind);
                        }
                        if e.kind == EFFECT_NAME && e.replaced != 0 && e.replaced != e.ino {
                            self.unmark_replaced_dir(id, e.replaced, tx)?;
                        }
                        continue;
                    }
                    if e.kind == EFFECT_UNNAME {
                        tx.delete_dentry(e.parent, &e.name);
                        if held.kind == S_IFDIR {
                            let dir = tx.get(e.parent)?;
                            dir.nlink = dir.nlink.saturating_sub(1).max(2);
                        }
                    } else if e.entry_kind == S_IFDIR {
                        tx.put_dentry(e.parent, &e.name, e.ino, e.entry_kind);
                        if e.replaced == 0 {
                            let dir = tx.get(e.parent)?;
                            dir.nlink = dir.nlink.saturating_add(1);
                        } else if self.try_inode(e.replaced)?.is_some_and(|d| d.removing == id.key()) {
                            // One subdirectory for another: the count stays. (One of another
                            // group goes there, by its drop-dir effect.)
                            tx.destroy(e.replaced)?;
                        }
                    } else {
                        if e.entry_kind == 0 {
                            return Err(CairnError::invalid(format!(
                                "transaction {id} names {} without its file type",
                                quoted(&e.name)
                            )));
                        }
                        tx.put_dentry(e.parent, &e.name, e.ino, e.entry_kind);
                        if e.replaced != 0
                            && self.holds_ino(e.replaced)
                            && self.try_inode(e.replaced)?.is_some()
                        {
                            tx.drop_link(e.replaced, e.parent, &now)?;
                        }
                    }
                    let dir = tx.get(e.parent)?;
                    dir.set_mtime(&now);
                    dir.set_ctime(&now);
                }
                (EFFECT_DROP_DIR, _) => {
                    // Read through `tx`: one of the coordinator's own group is prepared in the
                    // same write as its commit (`change_commit`'s `more`).
                    if self.try_inode(e.ino)?.is_none() || tx.get(e.ino)?.removing != id.key() {
                        continue;
                    }
                    if commit {
                        tx.destroy(e.ino)?;
                    } else {
                        tx.get(e.ino)?.removing.clear();
                    }
                }
                (EFFECT_REPARENT, _) => {
                    let Some(dir) = self.try_inode(e.ino)? else { continue };
                    if e.from == e.to {
                        if commit {
                            tx.get(e.ino)?.set_ctime(&now);
                        }
                        continue;
                    }
                    if dir.moving != id.key() {
                        continue;
                    }
                    let dir = tx.get(e.ino)?;
                    dir.moving.clear();
                    if commit {
                        dir.parent = e.to;
                        dir.set_ctime(&now);
                    }
                }
                (_, _) => {
                    if self.try_inode(e.ino)?.is_none() {
                        continue;
                    }
                    match (e.delta, commit) {
                        (1, true) => {}
                        (1, false) => tx.drop_link(e.ino, e.to, &now)?,
                        (0, true) => {
                            let moved = tx.get(e.ino)?;
                            moved.move_name(e.from, e.to);
                            moved.set_ctime(&now);
                        }
                        (_, true) => tx.drop_link(e.ino, e.from, &now)?,
                        (_, false) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// An aborted rename over directory `ino` leaves it as it was: its `removing` mark cleared.
    fn unmark_replaced_dir(&self, id: TxnId, ino: u64, tx: &mut Tx<'_>) -> Result<()> {
        if self.holds_ino(ino) && self.try_inode(ino)?.is_some_and(|d| d.removing == id.key()) {
            tx.get(ino)?.removing.clear();
        }
        Ok(())
    }

    // ------------------------------------------------------------ the coordinator's side

    /// Step 1 of a change across groups: prepare this group's `effects` and write the
    /// `pending` record, naming the `planned` participants (told at once should the change be
    /// aborted, even by a later leader), in one durable entry. Answers the transaction and the
    /// effects as prepared (what a name here replaces).
    pub fn change_begin(
        &self,
        mut effects: Vec<TxnEffect>,
        planned: &[u32],
    ) -> Result<(TxnId, Vec<TxnEffect>)> {
        self.check_effects(&effects)?;
        let id = TxnId { group: self.group, seq: self.txn_seqs.next(&self.store)? };
        let (client, seq) = once::current().unwrap_or((0, 0));
        let locks = self.effect_locks(id, &effects);
        // A directory's move is marked under the rename lock (a walk up its ancestry takes it).
        let _serial = moves_dir(&effects).then(|| self.rename_lock.lock());
        self.locked(
            || locks.clone(),
            || {
                let mut tx = self.tx();
                self.prepare_effects(id, &mut effects, &mut tx)?;
                let record = TxnRecord {
                    role: TXN_COORDINATOR,
                    state: TXN_PENDING,
                    written_sec: cairn_common::time::now().sec,
                    op: TXN_CHANGE,
                    effects: effects.clone(),
                    client,
                    seq,
                    groups: planned.to_vec(),
                    ..Default::default()
                };
                Self::put_record(&mut tx.batch, id, &record);
                tx.batch.set_durable();
                // Not the client's change yet: its once-record goes with the commit.
                once::scope(None, || tx.commit())?;
                Ok((id, effects.clone()))
            },
        )
    }

    /// Step 3, yes: every participant prepared. This group's effects are applied — those
    /// begun, `named_kind` filling in the file type of a name made here (a link: its inode's
    /// group said it), and `more`, learned since (a file of this group that a name elsewhere
    /// replaces), checked now — and the record says `committed` with the participants'
    /// `groups`, in one entry with the client's once-record: from here the change has happened.
    pub fn change_commit(
        &self,
        id: TxnId,
        named_kind: u32,
        mut more: Vec<TxnEffect>,
        groups: Vec<u32>,
    ) -> Result<()> {
        let Some(record) = self.coordinated(id)? else {
            return Err(CairnError::not_found(format!("no transaction {id} to commit")));
        };
        if !more.is_empty() {
            self.check_effects(&more)?;
        }
        let locks: Vec<u64> =
            self.effect_locks(id, &record.effects).into_iter().chain(self.effect_locks(id, &more)).collect();
        self.locked(
            || locks.clone(),
            || {
                let Some(mut record) = self.coordinated(id)? else {
                    return Err(CairnError::not_found(format!("no transaction {id} to commit")));
                };
                match record.state {
                    TXN_COMMITTED => return Ok(()),
                    TXN_ABORTED => {
                        return Err(CairnError::new(
                            ErrorKind::Interrupted,
                            format!("transaction {id} was aborted (a participant did not answer in time)"),
                        ))
                    }
                    _ => {}
                }
                let mut tx = self.tx();
                self.prepare_effects(id, &mut more, &mut tx)?;
                for e in record.effects.iter_mut().filter(|e| e.kind == EFFECT_NAME && e.entry_kind == 0) {
                    e.entry_kind = named_kind;
                }
                record.effects.append(&mut more);
                self.settle_effects(id, &record.effects, true, &mut tx)?;
                record.state = TXN_COMMITTED;
                record.written_sec = cairn_common::time::now().sec;
                record.groups = groups;
                Self::put_record(&mut tx.batch, id, &record);
                tx.commit()
            },
        )
    }

    /// Step 3, no, for a change: this group's effects are undone and the record says `aborted`,
    /// listing the groups planned and `asked` to prepare (told until they acknowledge). Refused
    /// for a committed transaction; nothing to do for one not here.
    pub fn change_abort(&self, id: TxnId, asked: &[u32]) -> Result<()> {
        let Some(record) = self.coordinated(id)? else { return Ok(()) };
        let locks = self.effect_locks(id, &record.effects);
        self.locked(
            || locks.clone(),
            || {
                let Some(mut record) = self.coordinated(id)? else { return Ok(()) };
                let mut tx = self.tx();
                match record.state {
                    // Aborted by recovery meanwhile: the groups asked since are told too.
                    TXN_ABORTED if asked.iter().all(|g| record.groups.contains(g)) => return Ok(()),
                    TXN_ABORTED => {}
                    TXN_COMMITTED => {
                        return Err(CairnError::invalid(format!(
                            "transaction {id} is committed: it cannot abort"
                        )))
                    }
                    _ => self.settle_effects(id, &record.effects, false, &mut tx)?,
                }
                record.state = TXN_ABORTED;
                record.written_sec = cairn_common::time::now().sec;
                for group in asked {
                    if !record.groups.contains(group) {
                        record.groups.push(*group);
                    }
                }
                Self::put_record(&mut tx.batch, id, &record);
                once::scope(None, || tx.commit())
            },
        )
    }

    // ------------------------------------------------------------ the participant's side

    /// Step 2 of a change: prepare this group's `effects` in one durable entry with its
    /// `pending` record, answering them as prepared; a prepare sent again answers the same.
    pub fn txn_prepare_change(&self, id: TxnId, mut effects: Vec<TxnEffect>) -> Result<Vec<TxnEffect>> {
        if id.group == self.group {
            return Err(CairnError::invalid(format!("transaction {id} is this group's own")));
        }
        self.check_effects(&effects)?;
        let locks = self.effect_locks(id, &effects);
        let _serial = moves_dir(&effects).then(|| self.rename_lock.lock());
        self.locked(
            || locks.clone(),
            || {
                if let Some(record) = self.txn_record(id)? {
                    return match (record.role, record.state, record.op) {
                        (TXN_PARTICIPANT, TXN_PENDING, TXN_CHANGE) => Ok(record.effects),
                        _ => Err(CairnError::invalid(format!(
                            "transaction {id} is already recorded here in another state"
                        ))),
                    };
                }
                let mut tx = self.tx();
                self.prepare_effects(id, &mut effects, &mut tx)?;
                let record = TxnRecord {
                    role: TXN_PARTICIPANT,
                    state: TXN_PENDING,
                    peer_group: id.group,
                    written_sec: cairn_common::time::now().sec,
                    op: TXN_CHANGE,
                    effects: effects.clone(),
                    ..Default::default()
                };
                Self::put_record(&mut tx.batch, id, &record);
                tx.batch.set_durable();
                once::scope(None, || tx.commit())?;
                Ok(effects.clone())
            },
        )
        .inspect(|_| super::exchange::crash_point("change-participant-prepared"))
    }

    /// Step 4 of a change, on a participant holding `record`: apply or undo its effects and
    /// forget the record, in one entry.
    pub(super) fn decide_change(&self, id: TxnId, record: &TxnRecord, commit: bool) -> Result<()> {
        let mut tx = self.tx();
        self.settle_effects(id, &record.effects, commit, &mut tx)?;
        tx.batch.delete(Cf::Txns, id.key());
        once::scope(None, || tx.commit())
    }

    /// The locks a decision on `id` takes (its record's effects), read before locking.
    pub(super) fn decide_locks(&self, id: TxnId) -> Vec<u64> {
        match self.txn_record(id) {
            Ok(Some(record)) if record.op == TXN_CHANGE => self.effect_locks(id, &record.effects),
            _ => Vec::new(),
        }
    }
}
