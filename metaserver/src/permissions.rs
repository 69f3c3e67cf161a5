//! Per-user permission checks: what the process a client's request is made for may do to an
//! inode, by its mode, owner and group, as Linux decides it (`fs/namei.c`, `fs/attr.c`,
//! `fs/xattr.c`). The client host's kernel checks first; these checks hold a client host whose
//! root is not trusted to the users its certificate may claim. Pure functions over inodes, no
//! I/O: the service reads the inodes and asks. Design: `docs/ARCHITECTURE.md`, "Per-user
//! permission checks on the metaserver".

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{Caller, SetAttrRequest};

use crate::access::Rule;
use crate::schema::Inode;

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

/// Who a checked request acts for: the caller it names, after its access rule's squash, with
/// only the groups the rule lets it claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub uid: u32,
    /// The primary group and the supplementary ones.
    groups: Vec<u32>,
}

fn denied(why: String) -> CairnError {
    CairnError::new(ErrorKind::PermissionDenied, why)
}

fn not_permitted(why: String) -> CairnError {
    CairnError::new(ErrorKind::NotPermitted, why)
}

fn may_name(want: u32) -> String {
    let mut s = String::new();
    for (bit, c) in [(MAY_READ, 'r'), (MAY_WRITE, 'w'), (MAY_EXEC, 'x')] {
        if want & bit != 0 {
            s.push(c);
        }
    }
    s
}

impl Who {
    /// The caller of a request from a client held to `rule` (if any): refused without one (a
    /// mount older than the metaserver sends none) or with a uid its rule does not let it claim.
    pub fn of(caller: Option<&Caller>, rule: Option<&Rule>) -> Result<Who> {
        let Some(c) = caller else {
            return Err(denied(
                "the request names no caller, and this metaserver checks each client request's user \
                 (a mount older than the metaserver: upgrade mounts first)"
                    .into(),
            ));
        };
        let uid = match rule {
            Some(rule) => rule.claim_uid(c.uid)?,
            None => c.uid,
        };
        // A group outside what the rule lets the client claim counts as no group.
        let mut groups: Vec<u32> = std::iter::once(c.gid)
            .chain(c.groups.iter().copied())
            .map(|g| rule.map_or(g, |r| r.gid(g)))
            .filter(|&g| rule.is_none_or(|r| r.may_claim_gid(g)))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        Ok(Who { uid, groups })
    }

    /// A caller another metaserver resolved ([`Who::of`]) and sent with a change across
    /// metadata groups: its uid and groups.
    pub fn resolved(uid: u32, mut groups: Vec<u32>) -> Who {
        groups.sort_unstable();
        groups.dedup();
        Who { uid, groups }
    }

    /// Its primary and supplementary groups, sorted.
    pub fn groups(&self) -> &[u32] {
        &self.groups
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.groups.binary_search(&gid).is_ok()
    }

    /// Whether the caller may `want` (`MAY_*` bits) on `inode`, by its mode bits: root may read
    /// and write anything and search any directory, and execute what anyone may.
    pub fn may(&self, inode: &Inode, want: u32) -> bool {
        let mode = inode.mode;
        if self.is_root() {
            let exec_ok = want & MAY_EXEC == 0 || inode.is_dir() || mode & 0o111 != 0;
            return exec_ok;
        }
        let class = if self.uid == inode.uid {
            (mode >> 6) & 7
        } else if self.in_group(inode.gid) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        class & want == want
    }

    /// [`Who::may`], or `EACCES` naming what was asked.
    pub fn check(&self, inode: &Inode, want: u32, what: &str) -> Result<()> {
        if self.may(inode, want) {
            return Ok(());
        }
        Err(denied(format!(
            "{what}: uid {} may not {} inode {} (mode {:o}, owner {}:{})",
            self.uid,
            may_name(want),
            inode.ino,
            inode.mode & 0o7777,
            inode.uid,
            inode.gid
        )))
    }

    fn owns(&self, inode: &Inode) -> bool {
        self.is_root() || self.uid == inode.uid
    }

    /// The uid that must own an entry this caller removes or replaces in `dir` (`None`: any
    /// may, the directory is not sticky or is this caller's): the sticky rule, for a victim
    /// whose owner is checked elsewhere (another metadata group holds it).
    pub fn sticky_owner(&self, dir: &Inode) -> Option<u32> {
        (dir.mode & S_ISVTX != 0 && !self.owns(dir)).then_some(self.uid)
    }

    /// Removing or replacing the entry of `victim` in `dir`: in a sticky directory only the
    /// owner of the entry or of the directory (or root) may (`EPERM`, as Linux answers).
    pub fn check_sticky(&self, dir: &Inode, victim: &Inode) -> Result<()> {
        if dir.mode & S_ISVTX == 0 || self.owns(victim) || self.owns(dir) {
            return Ok(());
        }
        Err(not_permitted(format!(
            "uid {} may not remove or replace inode {} (owner {}) in the sticky directory {} (owner {})",
            self.uid, victim.ino, victim.uid, dir.ino, dir.uid
        )))
    }

    /// The entry a non-root caller makes is owned by itself.
    pub fn check_new_owner(&self, uid: u32) -> Result<()> {
        if self.is_root() || uid == self.uid {
            return Ok(());
        }
        Err(denied(format!("uid {} may not make an entry owned by uid {uid}", self.uid)))
    }

    /// A setattr of `inode` by this caller: refused where Linux refuses it; a mode change by a
    /// caller outside the file's group loses its setgid bit, as the kernel clears it.
    pub fn check_setattr(&self, inode: &Inode, r: &mut SetAttrRequest) -> Result<()> {
        let ino = inode.ino;
        let refuse = |what: &str| {
            Err(not_permitted(format!(
                "{what} of inode {ino} (owner {}:{}) by uid {}",
                inode.uid, inode.gid, self.uid
            )))
        };
        if let Some(uid) = r.uid {
            // A chown to the owner it has, by that owner, changes nothing.
            let no_op = uid == inode.uid && self.uid == inode.uid;
            if !(self.is_root() || no_op) {
                return refuse(&format!("chown to uid {uid}"));
            }
        }
        if let Some(gid) = r.gid {
            let to_own_group = self.uid == inode.uid && (gid == inode.gid || self.in_group(gid));
            if !self.is_root() && !to_own_group {
                return refuse(&format!("chgrp to gid {gid}"));
            }
        }
        if let Some(mode) = r.mode {
            let perms = mode & 0o7777;
            let old = inode.mode & 0o7777;
            // Only setuid and setgid bits cleared: the kernel does that for a non-owner's write
            // or truncate, and dropping privileges harms no one.
            let only_drops = perms & !(S_ISUID | S_ISGID) == old & !(S_ISUID | S_ISGID) && perms & !old == 0;
            if !only_drops {
                if !self.owns(inode) {
                    return refuse("chmod");
                }
                let group = r.gid.unwrap_or(inode.gid);
                if !self.is_root() && perms & S_ISGID != 0 && !self.in_group(group) {
                    r.mode = Some(mode & !S_ISGID);
                }
            }
        }
        let explicit = (r.atime.is_some() && !r.atime_now) || (r.mtime.is_some() && !r.mtime_now);
        let now = r.atime_now || r.mtime_now;
        if explicit && !self.owns(inode) {
            return refuse("setting explicit times");
        }
        if now && !explicit && !self.owns(inode) {
            self.check(inode, MAY_WRITE, "setting times to now")?;
        }
        if r.size.is_some() && !(r.by_handle && self.owns(inode)) {
            self.check(inode, MAY_WRITE, "truncate")?;
        }
        Ok(())
    }

    /// Reading extended attribute `name` of `inode`: `user.*` needs read permission,
    /// `trusted.*` is root's (others are told there is none, as Linux tells them).
    pub fn check_get_xattr(&self, inode: &Inode, name: &[u8]) -> Result<()> {
        if name.starts_with(b"trusted.") && !self.is_root() {
            return Err(CairnError::new(ErrorKind::NoData, "no such extended attribute"));
        }
        if name.starts_with(b"user.") {
            self.check(inode, MAY_READ, "getxattr")?;
        }
        Ok(())
    }

    /// Setting (or with `remove`, removing) extended attribute `name` of `inode`.
    pub fn check_set_xattr(&self, inode: &Inode, name: &[u8], remove: bool) -> Result<()> {
        let shown = String::from_utf8_lossy(name);
        let refuse = |why: &str| Err(not_permitted(format!("{shown} of inode {}: {why}", inode.ino)));
        if name.starts_with(b"trusted.") {
            return if self.is_root() { Ok(()) } else { refuse("root's only") };
        }
        if name == b"security.capability" {
            // The kernel removes a file's capabilities when a non-root user writes to it.
            if remove && (self.owns(inode) || self.may(inode, MAY_WRITE)) {
                return Ok(());
            }
            return if self.is_root() { Ok(()) } else { refuse("set by root only") };
        }
        if name.starts_with(b"security.") || name.starts_with(b"system.") {
            return if self.owns(inode) { Ok(()) } else { refuse("the owner's or root's only") };
        }
        if name.starts_with(b"user.") {
            if !inode.is_reg() && !inode.is_dir() {
                return refuse("user attributes are for files and directories only");
            }
            if inode.is_dir() && inode.mode & S_ISVTX != 0 && !self.owns(inode) {
                return refuse("a sticky directory's user attributes are its owner's");
            }
            return self.check(inode, MAY_WRITE, if remove { "removexattr" } else { "setxattr" });
        }
        Ok(())
    }
}

/// What an open with `flags` asks of the file (`OpenRequest.access`); 0 (not said) is checked as
/// read and write.
pub fn open_want(access: u32) -> u32 {
    match access & (MAY_READ | MAY_WRITE | MAY_EXEC) {
        0 => MAY_READ | MAY_WRITE,
        want => want,
    }
}

#[cfg(test)]
mod tests;
