//! What this client remembers of the metaserver's answers for as long as the kernel may cache
//! attributes (`attr_ttl`): extended attributes found absent, and directories as this client's
//! own changes in them left them. Both save a round trip the kernel would otherwise cause on
//! nearly every write or create; a change through this client drops what it may have made
//! stale.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cairn_proto as p;
use parking_lot::Mutex;

/// Most absent-xattr answers remembered; past it the cache starts over.
const ABSENT_XATTRS_MAX: usize = 65536;
/// Most directories whose attributes are noted at once.
const DIR_ATTRS_MAX: usize = 4096;

pub(super) struct AttrCache {
    /// How long an entry holds (zero: nothing is kept).
    ttl: Duration,
    /// Extended attributes found absent, until when: the kernel asks for
    /// `security.capability` before every write, and the answer is nearly always "none". The
    /// empty name, which no xattr can have, stands for "none at all" (a file just created).
    absent_xattrs: Mutex<HashMap<(u64, Vec<u8>), Instant>>,
    /// Directories as this client's own change in them left them (from the metaserver's
    /// reply), until when. The kernel forgets a directory's attributes after every create or
    /// unlink in it and asks again before the next one, for its permission check: a round trip
    /// per file without this. A change this client cannot follow exactly (setattr, xattrs,
    /// rename, rmdir) drops entries instead.
    dirs: Mutex<HashMap<u64, (p::Attr, Instant)>>,
}

impl AttrCache {
    pub(super) fn new(ttl: Duration) -> AttrCache {
        AttrCache { ttl, absent_xattrs: Mutex::default(), dirs: Mutex::default() }
    }

    /// Directory `ino`'s attributes as this client's last change in it left them, if still
    /// fresh.
    pub(super) fn dir(&self, ino: u64) -> Option<p::Attr> {
        let dirs = self.dirs.lock();
        let (attr, until) = dirs.get(&ino)?;
        (Instant::now() < *until).then_some(*attr)
    }

    /// Note directory `ino`'s attributes after this client changed it (`None`: not known, forget
    /// them).
    pub(super) fn dir_changed(&self, ino: u64, attr: Option<p::Attr>) {
        let mut dirs = self.dirs.lock();
        match attr {
            Some(attr) if attr.ino == ino && !self.ttl.is_zero() => {
                if dirs.len() >= DIR_ATTRS_MAX {
                    let now = Instant::now();
                    dirs.retain(|_, (_, until)| now < *until);
                    if dirs.len() >= DIR_ATTRS_MAX {
                        dirs.clear();
                    }
                }
                // Replies to concurrent changes may come back in any order: keep the newest.
                let changed = |a: &p::Attr| a.ctime.map(|t| (t.sec, t.nsec));
                if dirs.get(&ino).is_some_and(|(old, _)| changed(old) > changed(&attr)) {
                    return;
                }
                dirs.insert(ino, (attr, Instant::now() + self.ttl));
            }
            _ => {
                dirs.remove(&ino);
            }
        }
    }

    /// Forget every directory's noted attributes but `keep`'s: a change moved or removed a
    /// directory this client cannot name by inode (its ctime, nlink or `..` changed).
    pub(super) fn dirs_changed_but(&self, keep: &[u64]) {
        self.dirs.lock().retain(|ino, _| keep.contains(ino));
    }

    /// `ino` is known to have no xattr `name` (or none at all), for now.
    pub(super) fn xattr_absent(&self, ino: u64, name: &[u8]) -> bool {
        let absent = self.absent_xattrs.lock();
        let fresh = |key: &(u64, Vec<u8>)| absent.get(key).is_some_and(|until| Instant::now() < *until);
        fresh(&(ino, name.to_vec())) || fresh(&(ino, Vec::new()))
    }

    /// The metaserver answered that `ino` has no xattr `name` (the empty name: none at all,
    /// for a file this client just created).
    pub(super) fn note_absent(&self, ino: u64, name: &[u8]) {
        if self.ttl.is_zero() {
            return;
        }
        let mut absent = self.absent_xattrs.lock();
        if absent.len() >= ABSENT_XATTRS_MAX {
            absent.clear();
        }
        absent.insert((ino, name.to_vec()), Instant::now() + self.ttl);
    }

    /// Forget what is cached about `ino`'s xattrs (this client changes them), and its noted
    /// attributes if it is a directory (its ctime changes).
    pub(super) fn xattrs_changed(&self, ino: u64) {
        self.absent_xattrs.lock().retain(|(i, _), _| *i != ino);
        self.dir_changed(ino, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(ino: u64, ctime: i64) -> p::Attr {
        p::Attr { ino, ctime: Some(p::Timespec { sec: ctime, nsec: 0 }), ..Default::default() }
    }

    #[test]
    fn a_directory_keeps_the_newest_of_replies_that_come_back_out_of_order() {
        let cache = AttrCache::new(Duration::from_secs(60));
        cache.dir_changed(7, Some(dir(7, 20)));
        cache.dir_changed(7, Some(dir(7, 10)));
        assert_eq!(cache.dir(7).unwrap().ctime.unwrap().sec, 20);
        cache.dir_changed(7, None);
        assert!(cache.dir(7).is_none());
    }

    #[test]
    fn nothing_is_kept_without_a_ttl_and_a_change_forgets_absent_xattrs() {
        let off = AttrCache::new(Duration::ZERO);
        off.dir_changed(7, Some(dir(7, 1)));
        off.note_absent(7, b"user.a");
        assert!(off.dir(7).is_none() && !off.xattr_absent(7, b"user.a"));

        let cache = AttrCache::new(Duration::from_secs(60));
        cache.note_absent(8, b"");
        assert!(cache.xattr_absent(8, b"security.capability"), "a new file has none at all");
        cache.note_absent(9, b"user.a");
        assert!(cache.xattr_absent(9, b"user.a") && !cache.xattr_absent(9, b"user.b"));
        cache.xattrs_changed(9);
        assert!(!cache.xattr_absent(9, b"user.a"));
    }
}
