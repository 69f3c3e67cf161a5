//! rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE, in one batch. A directory moving to
//! another parent takes the global rename lock so that the cycle check (is the destination
//! inside the moved directory?) cannot race with another directory move.

use cairn_common::{CairnError, ErrorKind, Result, ROOT_INO};

use super::txn::TxnId;
use super::{check_name, Namespace};

pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// Longest ancestry walked by the cycle check before the tree is declared corrupt.
pub(crate) const MAX_DEPTH: usize = 1 << 16;

/// What renaming did.
#[derive(Debug, PartialEq, Eq)]
pub enum Renamed {
    Done,
    /// Nothing: a directory moves to a parent whose ancestry continues in another metadata
    /// group, so the loop check walks across groups — a change across groups does it
    /// (`docs/ARCHITECTURE.md`, "Directory renames across groups").
    AcrossGroups,
}

/// What a walk up an ancestry makes of directories marked as moving across groups.
#[derive(Clone, Copy)]
enum Marks {
    /// Read as they are (the parent before the move).
    Ignored,
    /// Refused (`Unavailable`), but those of this transaction's.
    Refused(Option<TxnId>),
}

/// Where a walk up a directory's ancestry ended in one group ([`Namespace::climb`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Climb {
    /// At the directory looked for: the move would make a loop.
    Found,
    /// At the root.
    Root,
    /// At this inode, another group's: the walk goes on there.
    Leaves(u64),
}

impl Namespace {
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<Renamed> {
        check_name(name)?;
        check_name(new_name)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
            return Err(CairnError::invalid(format!("rename: invalid flags {flags:#x}")));
        }
        loop {
            // Decide unlocked whether a directory changes parent; verified again under the locks.
            let moves_dir = |ns: &Namespace| -> bool {
                parent != new_parent
                    && [ns.peek(parent, name), ns.peek(new_parent, new_name)]
                        .into_iter()
                        .flatten()
                        .any(|ino| ns.try_inode(ino).ok().flatten().is_some_and(|i| i.is_dir()))
            };
            let global = moves_dir(self);
            let guard = global.then(|| self.rename_lock.lock());
            let result = self.locked(
                || {
                    [Some(parent), Some(new_parent), self.peek(parent, name), self.peek(new_parent, new_name)]
                        .into_iter()
                        .flatten()
                        .collect()
                },
                || {
                    if !global && moves_dir(self) {
                        return Ok(None);
                    }
                    self.rename_locked(parent, name, new_parent, new_name, flags).map(Some)
                },
            );
            drop(guard);
            match result {
                Ok(Some(renamed)) => return Ok(renamed),
                Ok(None) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Walk up from directory `dir`, as far as this group holds its ancestry, looking for
    /// `moved` (a directory moving to a new parent under `dir`, which must not be it or one of
    /// its ancestors), under this group's rename lock: marks of moves across groups are written
    /// under it. `id`: the move asking, whose own mark does not stop it; a directory another
    /// move is moving answers `Unavailable` (its parent is in flux).
    pub fn climb(&self, id: Option<TxnId>, dir: u64, moved: u64) -> Result<Climb> {
        if !self.holds_ino(dir) {
            return Err(CairnError::new(
                ErrorKind::WrongGroup,
                format!("directory {dir} is not metadata group {}'s", self.group),
            ));
        }
        let _serial = self.rename_lock.lock();
        self.climb_locked(Marks::Refused(id), dir, moved)
    }

    /// [`Namespace::climb`], its rename lock held by the caller where `marks` are refused.
    fn climb_locked(&self, marks: Marks, dir: u64, moved: u64) -> Result<Climb> {
        let mut cur = dir;
        for _ in 0..MAX_DEPTH {
            if cur == moved {
                return Ok(Climb::Found);
            }
            if cur == ROOT_INO {
                // Never moved, never marked: wherever it is held.
                return Ok(Climb::Root);
            }
            if !self.holds_ino(cur) {
                return Ok(Climb::Leaves(cur));
            }
            let inode = self.inode(cur)?;
            let refused = match marks {
                Marks::Ignored => false,
                Marks::Refused(id) => id.is_none_or(|id| inode.moving != id.key()),
            };
            if !inode.moving.is_empty() && refused {
                return Err(CairnError::unavailable(format!(
                    "directory {cur} is being moved by a rename across metadata groups: try again"
                )));
            }
            cur = inode.parent;
        }
        Err(CairnError::corrupt(format!("directory {dir} is more than {MAX_DEPTH} levels deep")))
    }

    /// Is `ino` equal to `dir` or one of its ancestors, for a move here (its rename lock held)?
    /// `None`: the ancestry continues in another group (the move runs across groups).
    fn is_ancestor(&self, ino: u64, dir: u64) -> Result<Option<bool>> {
        Ok(match self.climb_locked(Marks::Refused(None), dir, ino)? {
            Climb::Found => Some(true),
            Climb::Root => Some(false),
            Climb::Leaves(_) => None,
        })
    }

    /// Is `ino` equal to `dir` or one of its ancestors, as this group's records say now (a
    /// subtree check: moves in flux are not waited for)? `CrossDevice` where the ancestry
    /// continues in another group.
    pub(super) fn is_ancestor_here(&self, ino: u64, dir: u64) -> Result<bool> {
        match self.climb_locked(Marks::Ignored, dir, ino)? {
            Climb::Found => Ok(true),
            Climb::Root => Ok(false),
            Climb::Leaves(cur) => Err(CairnError::new(
                ErrorKind::CrossDevice,
                format!("directory {dir}'s ancestry continues in another metadata group (inode {cur})"),
            )),
        }
    }

    fn rename_locked(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<Renamed> {
        let now = cairn_common::time::now();
        self.dir(parent)?;
        super::txn::refuse_removing(&self.dir(new_parent)?)?;
        let src = self.dentry(parent, name)?.ok_or_else(|| {
            CairnError::not_found(format!("rename: no entry {:?}", String::from_utf8_lossy(name)))
        })?;
        if self.stored_dentry(new_parent, new_name)?.is_some_and(|d| d.is_pending()) {
            return Err(CairnError::new(
                ErrorKind::Exists,
                "rename: the target is being created by a change across metadata groups",
            ));
        }
        let dst = self.dentry(new_parent, new_name)?;
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(CairnError::new(ErrorKind::Exists, "rename: the target exists"));
        }
        if parent == new_parent && name == new_name {
            return Ok(Renamed::Done);
        }
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) && flags & RENAME_NOREPLACE == 0 {
            // Two names of one file (or itself): nothing to do, whatever holds them.
            return Ok(Renamed::Done);
        }
        self.refuse_held(&src, name)?;
        if let Some(dst) = &dst {
            self.refuse_held(dst, new_name)?;
        }
        for entry in [Some(&src), dst.as_ref()].into_iter().flatten() {
            self.refuse_elsewhere(entry.ino, "renaming")?;
        }
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(CairnError::new(ErrorKind::Exists, "rename: the target exists"));
        }
        if flags & RENAME_EXCHANGE != 0 && dst.is_none() {
            return Err(CairnError::not_found("rename exchange: the target does not exist"));
        }
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
            return Ok(Renamed::Done);
        }
        let mut tx = self.tx();
        let src_dir = tx.get(src.ino)?.is_dir();
        let dst_dir = match &dst {
            Some(d) => tx.get(d.ino)?.is_dir(),
            None => false,
        };
        if src_dir && parent != new_parent {
            match self.is_ancestor(src.ino, new_parent)? {
                Some(true) => return Err(CairnError::invalid("rename: cannot move a directory into itself")),
                Some(false) => {}
                None if flags & RENAME_EXCHANGE != 0 => return Err(exchange_across()),
                None => return Ok(Renamed::AcrossGroups),
            }
        }

        if flags & RENAME_EXCHANGE != 0 {
            let dst = dst.expect("checked above");
            if dst_dir && parent != new_parent {
                match self.is_ancestor(dst.ino, parent)? {
                    Some(true) => {
                        return Err(CairnError::invalid(
                            "rename exchange: cannot move a directory into itself",
                        ))
                    }
                    Some(false) => {}
                    None => return Err(exchange_across()),
                }
            }
            tx.put_dentry(parent, name, dst.ino, dst.kind);
            tx.put_dentry(new_parent, new_name, src.ino, src.kind);
            if parent != new_parent {
                if src_dir {
                    tx.get(src.ino)?.parent = new_parent;
                    let p = tx.get(parent)?;
                    p.nlink = p.nlink.saturating_sub(1).max(2);
                    let np = tx.get(new_parent)?;
                    np.nlink = np.nlink.saturating_add(1);
                }
                if dst_dir {
                    tx.get(dst.ino)?.parent = parent;
                    let np = tx.get(new_parent)?;
                    np.nlink = np.nlink.saturating_sub(1).max(2);
                    let p = tx.get(parent)?;
                    p.nlink = p.nlink.saturating_add(1);
                }
            }
            tx.get(dst.ino)?.move_name(new_parent, parent);
            tx.get(dst.ino)?.set_ctime(&now);
        } else {
            if let Some(dst) = &dst {
                match (src_dir, dst_dir) {
                    (true, false) => {
                        return Err(CairnError::new(
                            ErrorKind::NotDir,
                            "rename: a directory over a non-directory",
                        ))
                    }
                    (false, true) => {
                        return Err(CairnError::new(
                            ErrorKind::IsDir,
                            "rename: a non-directory over a directory",
                        ))
                    }
                    (true, true) if !self.dir_is_empty(dst.ino)? => {
                        return Err(CairnError::new(
                            ErrorKind::NotEmpty,
                            "rename: the target directory is not empty",
                        ))
                    }
                    _ => {}
                }
                tx.drop_link(dst.ino, new_parent, &now)?;
                if dst_dir {
                    let np = tx.get(new_parent)?;
                    np.nlink = np.nlink.saturating_sub(1).max(2);
                }
            }
            tx.delete_dentry(parent, name);
            tx.put_dentry(new_parent, new_name, src.ino, src.kind);
            if src_dir && parent != new_parent {
                tx.get(src.ino)?.parent = new_parent;
                let p = tx.get(parent)?;
                p.nlink = p.nlink.saturating_sub(1).max(2);
                let np = tx.get(new_parent)?;
                np.nlink = np.nlink.saturating_add(1);
            }
        }
        let moved = tx.get(src.ino)?;
        moved.move_name(parent, new_parent);
        moved.set_ctime(&now);
        for dir in [parent, new_parent] {
            let d = tx.get(dir)?;
            d.set_mtime(&now);
            d.set_ctime(&now);
        }
        tx.commit().map(|()| Renamed::Done)
    }
}

/// An exchange of directories whose ancestry continues in another group: not built.
fn exchange_across() -> CairnError {
    CairnError::new(
        ErrorKind::CrossDevice,
        "rename exchange of directories whose ancestry continues in another metadata group is not built",
    )
}
