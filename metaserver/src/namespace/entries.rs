//! Operations that add, remove or list directory entries: lookup, create (regular files and
//! special files), mkdir, symlink, link, unlink, rmdir and readdir.

use cairn_common::{CairnError, ErrorKind, Result, SYMLINK_MAX};
use cairn_proto::DirEntry;

use super::{check_name, Namespace};
use crate::schema::{
    self, Dentry, Inode, SymlinkTarget, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG,
    S_IFSOCK, S_ISGID,
};
use crate::store::Cf;

/// Most entries one readdir page returns.
pub const READDIR_MAX: usize = 1024;

/// What a new inode takes from its parent directory: the parent's number, its layout, and
/// (setgid directories) its group, which a new directory also passes on.
pub(super) fn inherit(inode: &mut Inode, parent: &Inode) {
    inode.parent = parent.ino;
    inode.set_layout(parent.layout());
    if parent.mode & S_ISGID != 0 {
        inode.gid = parent.gid;
        if inode.is_dir() {
            inode.mode |= S_ISGID;
        }
    }
}

/// What an entry names.
#[derive(Debug)]
pub enum Looked {
    Here(Inode),
    /// An inode of another metadata group: its number and file type.
    Elsewhere {
        ino: u64,
        kind: u32,
    },
}

/// What a new entry's creator asks for.
pub struct NewEntry<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Namespace {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        match self.lookup_entry(parent, name)? {
            Looked::Here(inode) => Ok(inode),
            Looked::Elsewhere { ino, .. } => Err(CairnError::not_found(format!(
                "{:?} in {parent} is inode {ino}, which another metadata group holds",
                String::from_utf8_lossy(name)
            ))),
        }
    }

    /// The inode `name` in `parent` names: this group's, or only its number and type when
    /// another group holds it (a directory made by a mkdir across groups).
    pub fn lookup_entry(&self, parent: u64, name: &[u8]) -> Result<Looked> {
        check_name(name)?;
        self.dir(parent)?;
        let d = self.dentry(parent, name)?.ok_or_else(|| {
            CairnError::not_found(format!("no entry {:?} in {parent}", String::from_utf8_lossy(name)))
        })?;
        if !self.holds_ino(d.ino) {
            return Ok(Looked::Elsewhere { ino: d.ino, kind: d.kind });
        }
        self.inode(d.ino).map(Looked::Here)
    }

    /// The common part of every creation: check the parent, apply setgid inheritance, insert
    /// the inode and its entry, update the parent. Runs under the parent's lock.
    fn add_entry(
        &self,
        new: &NewEntry<'_>,
        configure: impl FnOnce(&mut Inode, &Inode),
        extra: impl FnOnce(&mut super::Tx<'_>, &Inode),
    ) -> Result<Inode> {
        let now = cairn_common::time::now();
        let mut tx = self.tx();
        let parent = tx.get(new.parent)?;
        if !parent.is_dir() {
            return Err(CairnError::new(
                ErrorKind::NotDir,
                format!("inode {} is not a directory", new.parent),
            ));
        }
        super::txn::refuse_removing(parent)?;
        let parent_copy = parent.clone();
        self.check_free(new.parent, new.name)?;
        // Held to the end: until this change is proposed, its number's slot cannot be promised
        // away (`inos.rs`).
        let numbered = self.number(new.parent, new.name, new.mode & S_IFMT == S_IFDIR)?;
        let ino = numbered.ino;
        let mut inode = Inode::new(ino, new.mode, new.uid, new.gid, &now);
        inherit(&mut inode, &parent_copy);
        configure(&mut inode, &parent_copy);
        tx.stats.inodes += 1;
        let parent = tx.get(new.parent)?;
        parent.set_mtime(&now);
        parent.set_ctime(&now);
        if inode.is_dir() {
            parent.nlink = parent.nlink.saturating_add(1);
            tx.stats.directories += 1;
        }
        if inode.is_reg() {
            tx.stats.files += 1;
        }
        tx.put_dentry(new.parent, new.name, ino, inode.kind());
        extra(&mut tx, &inode);
        tx.insert(inode.clone());
        tx.commit()?;
        Ok(inode)
    }

    /// Create a regular file or a special file (type from `S_IFMT` of the mode). Returns the
    /// inode and whether it was created: a non-exclusive create of an existing regular file
    /// returns that file.
    pub fn create(&self, new: &NewEntry<'_>, rdev: u32, exclusive: bool) -> Result<(Inode, bool)> {
        self.create_avoiding(new, rdev, exclusive, &[])
    }

    /// [`Namespace::create`], placing a new regular file away from the nodes in `avoid` when
    /// enough others are up.
    pub fn create_avoiding(
        &self,
        new: &NewEntry<'_>,
        rdev: u32,
        exclusive: bool,
        avoid: &[u32],
    ) -> Result<(Inode, bool)> {
        check_name(new.name)?;
        let kind = match new.mode & S_IFMT {
            0 => S_IFREG,
            k @ (S_IFREG | S_IFIFO | S_IFCHR | S_IFBLK | S_IFSOCK) => k,
            k => return Err(CairnError::invalid(format!("create: file type {k:o} not allowed"))),
        };
        let mode = kind | (new.mode & 0o7777);
        self.locked(
            || vec![new.parent],
            || {
                if let Some(existing) = self.dentry(new.parent, new.name)? {
                    if exclusive || kind != S_IFREG {
                        return Err(CairnError::new(
                            ErrorKind::Exists,
                            format!("{:?} exists", String::from_utf8_lossy(new.name)),
                        ));
                    }
                    if !self.holds_ino(existing.ino) {
                        // Race only: the kernel looks the name up first, and opens what it finds.
                        return Err(CairnError::new(
                            ErrorKind::Exists,
                            format!(
                                "{:?} exists, naming inode {} of another metadata group: open it there",
                                String::from_utf8_lossy(new.name),
                                existing.ino
                            ),
                        ));
                    }
                    let inode = self.inode(existing.ino)?;
                    if inode.is_dir() {
                        return Err(CairnError::new(ErrorKind::IsDir, "create: the name is a directory"));
                    }
                    if !inode.is_reg() {
                        return Err(CairnError::new(
                            ErrorKind::Exists,
                            "create: the name is not a regular file",
                        ));
                    }
                    return Ok((inode, false));
                }
                let placement = if kind == S_IFREG {
                    Some(self.cluster.place(&self.dir(new.parent)?.layout(), avoid)?)
                } else {
                    None
                };
                let entry = NewEntry { mode, ..*new };
                let inode = self.add_entry(
                    &entry,
                    |inode, _| {
                        if let Some(p) = placement {
                            inode.placement = p;
                        } else {
                            inode.rdev = rdev;
                        }
                    },
                    |_, _| {},
                )?;
                Ok((inode, true))
            },
        )
    }

    pub fn mkdir(&self, new: &NewEntry<'_>) -> Result<Inode> {
        check_name(new.name)?;
        let entry = NewEntry { mode: S_IFDIR | (new.mode & 0o7777), ..*new };
        self.locked(|| vec![new.parent], || self.add_entry(&entry, |inode, _| inode.nlink = 2, |_, _| {}))
    }

    pub fn symlink(&self, new: &NewEntry<'_>, target: &[u8]) -> Result<Inode> {
        check_name(new.name)?;
        if target.is_empty() {
            return Err(CairnError::invalid("symlink: empty target"));
        }
        if target.len() > SYMLINK_MAX {
            return Err(CairnError::new(
                ErrorKind::NameTooLong,
                format!("symlink target of {} bytes (at most {SYMLINK_MAX})", target.len()),
            ));
        }
        if target.contains(&0) {
            return Err(CairnError::invalid("symlink target contains NUL"));
        }
        let entry = NewEntry { mode: S_IFLNK | 0o777, ..*new };
        self.locked(
            || vec![new.parent],
            || {
                self.add_entry(
                    &entry,
                    |inode, _| inode.size = target.len() as u64,
                    |tx, inode| {
                        let value = schema::encode(&SymlinkTarget { target: target.to_vec() });
                        tx.batch.put(Cf::Symlinks, schema::ino_key(inode.ino), value);
                    },
                )
            },
        )
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if !inode.is_symlink() {
            return Err(CairnError::invalid(format!("inode {ino} is not a symlink")));
        }
        let v = self
            .store
            .get(Cf::Symlinks, &schema::ino_key(ino))?
            .ok_or_else(|| CairnError::corrupt(format!("symlink {ino} has no target")))?;
        Ok(schema::decode::<SymlinkTarget>("symlink", &v)?.target)
    }

    /// A new hard link `new_parent/new_name` to `ino`.
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Inode> {
        check_name(new_name)?;
        self.locked(
            || vec![ino, new_parent],
            || {
                let now = cairn_common::time::now();
                let mut tx = self.tx();
                let inode = tx.get(ino)?;
                if inode.is_dir() {
                    return Err(CairnError::new(ErrorKind::NotPermitted, "cannot hard-link a directory"));
                }
                if inode.nlink == u32::MAX {
                    return Err(CairnError::new(ErrorKind::TooBig, "too many links"));
                }
                inode.nlink += 1;
                inode.add_name(new_parent);
                inode.set_ctime(&now);
                let kind = inode.kind();
                let parent = tx.get(new_parent)?;
                if !parent.is_dir() {
                    return Err(CairnError::new(
                        ErrorKind::NotDir,
                        format!("inode {new_parent} is not a directory"),
                    ));
                }
                super::txn::refuse_removing(parent)?;
                parent.set_mtime(&now);
                parent.set_ctime(&now);
                self.check_free(new_parent, new_name)?;
                tx.put_dentry(new_parent, new_name, ino, kind);
                let out = tx.get(ino)?.clone();
                tx.commit()?;
                Ok(out)
            },
        )
    }

    /// Remove a non-directory entry.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        check_name(name)?;
        self.locked(
            || [Some(parent), self.peek(parent, name)].into_iter().flatten().collect(),
            || {
                let now = cairn_common::time::now();
                self.dir(parent)?;
                let d = self.dentry(parent, name)?.ok_or_else(|| {
                    CairnError::not_found(format!("no entry {:?}", String::from_utf8_lossy(name)))
                })?;
                if !dir && d.kind == S_IFDIR {
                    return Err(CairnError::new(ErrorKind::IsDir, "unlink of a directory"));
                }
                self.refuse_held(&d, name)?;
                self.refuse_elsewhere(d.ino, "removing")?;
                let mut tx = self.tx();
                let child = tx.get(d.ino)?;
                match (dir, child.is_dir()) {
                    (false, true) => return Err(CairnError::new(ErrorKind::IsDir, "unlink of a directory")),
                    (true, false) => {
                        return Err(CairnError::new(ErrorKind::NotDir, "rmdir of a non-directory"))
                    }
                    (true, true) if !self.dir_is_empty(d.ino)? => {
                        return Err(CairnError::new(ErrorKind::NotEmpty, "directory not empty"))
                    }
                    _ => {}
                }
                tx.delete_dentry(parent, name);
                tx.drop_link(d.ino, parent, &now)?;
                let p = tx.get(parent)?;
                if dir {
                    p.nlink = p.nlink.saturating_sub(1).max(2);
                }
                p.set_mtime(&now);
                p.set_ctime(&now);
                tx.commit()
            },
        )
    }

    /// Whether directory `ino` has an entry to list at or after key `start` (placeholders of
    /// mkdirs not decided yet are not listed).
    fn lists_more(&self, ino: u64, start: &[u8]) -> Result<bool> {
        let mut start = start.to_vec();
        loop {
            let rows = self.store.scan(Cf::Dentries, &start, &schema::prefix_end(ino), 64)?;
            let Some((last, _)) = rows.last() else { return Ok(false) };
            for (_, value) in &rows {
                if !schema::decode::<Dentry>("dentry", value)?.is_pending() {
                    return Ok(true);
                }
            }
            if rows.len() < 64 {
                return Ok(false);
            }
            start = last.clone();
            start.push(0);
        }
    }

    pub(super) fn dir_is_empty(&self, ino: u64) -> Result<bool> {
        let start = schema::ino_key(ino);
        Ok(self.store.scan(Cf::Dentries, &start, &schema::prefix_end(ino), 1)?.is_empty())
    }

    /// One page of a directory, in name order, strictly after `after` (`.` and `..` are not
    /// listed; the client adds them). Returns the entries and whether more follow.
    pub fn readdir(&self, ino: u64, after: &[u8], limit: u32, plus: bool) -> Result<(Vec<DirEntry>, bool)> {
        if after.len() > 4096 {
            return Err(CairnError::invalid("readdir: resume name too long"));
        }
        self.dir(ino)?;
        let limit = match limit as usize {
            0 => READDIR_MAX,
            n => n.min(READDIR_MAX),
        };
        let mut start = schema::dentry_key(ino, after);
        if !after.is_empty() {
            start.push(0);
        }
        // Placeholders of mkdirs across groups not decided yet are not listed: scan on until
        // the page holds `limit` entries, so a page is never empty while more follow.
        let mut entries = Vec::with_capacity(limit.min(64));
        let more = loop {
            let rows = self.store.scan(Cf::Dentries, &start, &schema::prefix_end(ino), limit + 1)?;
            let scanned = rows.len();
            let mut rows = rows.into_iter().peekable();
            while let Some((key, value)) = rows.next_if(|_| entries.len() < limit) {
                let d: Dentry = schema::decode("dentry", &value)?;
                start = key.clone();
                start.push(0);
                if d.is_pending() {
                    continue;
                }
                let attr = if plus { self.try_inode(d.ino)?.map(|i| i.to_attr()) } else { None };
                entries.push(DirEntry {
                    name: schema::name_of(&key).to_vec(),
                    ino: d.ino,
                    mode: d.kind,
                    attr,
                });
            }
            if entries.len() == limit {
                // Whether an entry to list follows the last one listed.
                break self.lists_more(ino, &start)?;
            }
            if scanned <= limit {
                break false;
            }
        };
        Ok((entries, more))
    }
}
