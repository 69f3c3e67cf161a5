//! Attribute operations: getattr, setattr (mode, owner, times, size), extended attributes and
//! statfs. Every change sets ctime; a size change of a regular file truncates its stripes (see
//! `files.rs`).

use cairn_common::{CairnError, ErrorKind, Layout, Result, XATTR_NAME_MAX, XATTR_SIZE_MAX};
use cairn_proto::{SetAttrRequest, StatFsReply};

use super::{check_time, Namespace};
use crate::schema::{self, Inode, XattrValue, S_IFMT};
use crate::store::Cf;

pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// Largest number of xattrs listed (their names together stay far below the message limit).
const XATTR_LIST_MAX: usize = 65536;
/// What one inode's xattrs may hold, so no client can grow an inode without bound: their names
/// (each with its NUL) fit in one `listxattr` buffer of Linux's XATTR_LIST_MAX (64 KiB), and
/// names and values together in 4 MiB. A new xattr beyond either is `ENOSPC`, as on ext4.
const XATTR_NAMES_BYTES_MAX: usize = 65536;
const XATTR_TOTAL_BYTES_MAX: usize = 4 << 20;

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(CairnError::invalid("empty xattr name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(CairnError::new(ErrorKind::Range, format!("xattr name of {} bytes", name.len())));
    }
    if name.contains(&0) {
        return Err(CairnError::invalid("xattr name contains NUL"));
    }
    Ok(())
}

impl Namespace {
    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        self.inode(ino)
    }

    pub fn setattr(&self, req: &SetAttrRequest) -> Result<Inode> {
        for t in [&req.atime, &req.mtime, &req.ctime].into_iter().flatten() {
            check_time(t)?;
        }
        let ino = req.ino;
        self.locked(
            || vec![ino],
            || {
                let now = cairn_common::time::now();
                let mut tx = self.tx();
                let inode = tx.get(ino)?;
                let mut changed = false;
                if let Some(mode) = req.mode {
                    inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777);
                    changed = true;
                }
                if let Some(uid) = req.uid {
                    inode.uid = uid;
                    changed = true;
                }
                if let Some(gid) = req.gid {
                    inode.gid = gid;
                    changed = true;
                }
                if req.atime_now {
                    inode.set_atime(&now);
                    changed = true;
                } else if let Some(t) = &req.atime {
                    inode.set_atime(t);
                    changed = true;
                }
                if req.mtime_now {
                    inode.set_mtime(&now);
                    changed = true;
                } else if let Some(t) = &req.mtime {
                    inode.set_mtime(t);
                    changed = true;
                }
                if let Some(size) = req.size {
                    if inode.is_dir() {
                        return Err(CairnError::new(ErrorKind::IsDir, "truncate of a directory"));
                    }
                    if !inode.is_reg() {
                        return Err(CairnError::invalid("truncate of a non-regular file"));
                    }
                    if size > super::MAX_FILE_SIZE {
                        return Err(CairnError::new(ErrorKind::TooBig, format!("size {size} too large")));
                    }
                    if size != inode.size {
                        if !req.mtime_now && req.mtime.is_none() {
                            inode.set_mtime(&now);
                        }
                        self.truncate(&mut tx, ino, size)?;
                    }
                    changed = true;
                }
                let inode = tx.get(ino)?;
                if let Some(t) = &req.ctime {
                    inode.set_ctime(t);
                } else if changed {
                    inode.set_ctime(&now);
                }
                let out = inode.clone();
                tx.commit()?;
                Ok(out)
            },
        )
    }

    pub fn get_xattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        self.inode(ino)?;
        let v = self
            .store
            .get(Cf::Xattrs, &schema::xattr_key(ino, name))?
            .ok_or_else(|| CairnError::new(ErrorKind::NoData, "no such xattr"))?;
        Ok(schema::decode::<XattrValue>("xattr", &v)?.value)
    }

    pub fn set_xattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(CairnError::new(ErrorKind::TooBig, format!("xattr value of {} bytes", value.len())));
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(CairnError::invalid(format!("setxattr: invalid flags {flags:#x}")));
        }
        self.locked(
            || vec![ino],
            || {
                let key = schema::xattr_key(ino, name);
                let mut tx = self.tx();
                tx.get(ino)?.set_ctime(&cairn_common::time::now());
                let exists = self.store.get(Cf::Xattrs, &key)?.is_some();
                if flags & XATTR_CREATE != 0 && exists {
                    return Err(CairnError::new(ErrorKind::Exists, "xattr exists"));
                }
                if flags & XATTR_REPLACE != 0 && !exists {
                    return Err(CairnError::new(ErrorKind::NoData, "no such xattr"));
                }
                self.check_xattr_room(ino, name, value, exists)?;
                tx.batch.put(Cf::Xattrs, key, schema::encode(&XattrValue { value: value.to_vec() }));
                tx.commit()
            },
        )
    }

    /// `ENOSPC` when setting `name` to `value` would take the inode's xattrs past
    /// [`XATTR_NAMES_BYTES_MAX`] or [`XATTR_TOTAL_BYTES_MAX`] (a replaced value's old bytes do
    /// not count).
    fn check_xattr_room(&self, ino: u64, name: &[u8], value: &[u8], exists: bool) -> Result<()> {
        let rows =
            self.store.scan(Cf::Xattrs, &schema::ino_key(ino), &schema::prefix_end(ino), XATTR_LIST_MAX)?;
        let (mut names, mut total) = (0usize, 0usize);
        for (k, v) in &rows {
            let other = schema::name_of(k);
            if other == name {
                continue;
            }
            names += other.len() + 1;
            total += other.len() + v.len();
        }
        names += name.len() + 1;
        total += name.len() + value.len();
        if names > XATTR_NAMES_BYTES_MAX
            || total > XATTR_TOTAL_BYTES_MAX
            || (!exists && rows.len() >= XATTR_LIST_MAX)
        {
            return Err(CairnError::new(
                ErrorKind::NoSpace,
                format!(
                    "no room for another extended attribute on inode {ino} ({} names, {total} bytes with this one)",
                    rows.len() + usize::from(!exists)
                ),
            ));
        }
        Ok(())
    }

    pub fn list_xattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.inode(ino)?;
        let rows =
            self.store.scan(Cf::Xattrs, &schema::ino_key(ino), &schema::prefix_end(ino), XATTR_LIST_MAX)?;
        Ok(rows.into_iter().map(|(k, _)| schema::name_of(&k).to_vec()).collect())
    }

    pub fn remove_xattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        self.locked(
            || vec![ino],
            || {
                let key = schema::xattr_key(ino, name);
                let mut tx = self.tx();
                tx.get(ino)?.set_ctime(&cairn_common::time::now());
                if self.store.get(Cf::Xattrs, &key)?.is_none() {
                    return Err(CairnError::new(ErrorKind::NoData, "no such xattr"));
                }
                tx.batch.delete(Cf::Xattrs, key);
                tx.commit()
            },
        )
    }

    /// The layout of `ino`: a file's own, or the one a directory gives files created in it.
    pub fn get_layout(&self, ino: u64) -> Result<Layout> {
        let inode = self.inode(ino)?;
        if !inode.is_dir() && !inode.is_reg() {
            return Err(CairnError::invalid(format!(
                "inode {ino} is neither a directory nor a regular file"
            )));
        }
        Ok(inode.layout())
    }

    /// Give directory `ino` a new layout for the files (and subdirectories) created in it from
    /// now on; files already there keep theirs (their shards are not re-encoded). Refused when
    /// the cluster has fewer chunkservers than the layout is wide: nothing could be created.
    pub fn set_layout(&self, ino: u64, layout: Layout) -> Result<Inode> {
        layout.validate()?;
        let nodes = self.cluster.active_chunkservers();
        if (layout.width() as usize) > nodes {
            return Err(CairnError::invalid(format!(
                "a {}+{} layout needs {} chunkservers, the cluster has {nodes} active",
                layout.k,
                layout.m,
                layout.width()
            )));
        }
        self.locked(
            || vec![ino],
            || {
                let mut tx = self.tx();
                let inode = tx.get(ino)?;
                if !inode.is_dir() {
                    return Err(CairnError::new(
                        ErrorKind::NotDir,
                        format!("inode {ino} is not a directory; a file's layout is fixed at create"),
                    ));
                }
                inode.set_layout(layout);
                inode.set_ctime(&cairn_common::time::now());
                let out = inode.clone();
                tx.commit()?;
                Ok(out)
            },
        )
    }

    /// Capacity over the up chunkservers; usable space scaled by the root layout's k/(k+m).
    pub fn statfs(&self) -> Result<StatFsReply> {
        let root = self.inode(cairn_common::ROOT_INO)?.layout();
        let (raw_capacity, raw_free) = self.cluster.capacity();
        let usable = |raw: u64| (raw as u128 * root.k as u128 / root.width().max(1) as u128) as u64;
        Ok(StatFsReply {
            raw_capacity,
            raw_free,
            usable_capacity: usable(raw_capacity),
            usable_free: usable(raw_free),
            files: self.stats().inodes.max(0) as u64,
            name_max: cairn_common::NAME_MAX as u32,
            block_size: 4096,
        })
    }
}
