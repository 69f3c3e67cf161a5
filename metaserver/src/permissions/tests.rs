use super::*;
use crate::access::{Rule, Squash};

const FILE: u32 = 0o100000;
const DIR: u32 = 0o040000;

fn inode(mode: u32, uid: u32, gid: u32) -> Inode {
    Inode { ino: 7, mode, uid, gid, ..Default::default() }
}

fn who(uid: u32, gid: u32, groups: &[u32]) -> Who {
    Who::of(Some(&Caller { uid, gid, groups: groups.to_vec() }), None).unwrap()
}

#[test]
fn the_mode_class_of_the_caller_decides() {
    let f = inode(FILE | 0o640, 1000, 100);
    assert!(who(1000, 1000, &[]).may(&f, MAY_READ | MAY_WRITE), "owner");
    assert!(!who(1000, 1000, &[]).may(&f, MAY_EXEC));
    assert!(who(2000, 100, &[]).may(&f, MAY_READ), "the primary group");
    assert!(who(2000, 5, &[100]).may(&f, MAY_READ), "a supplementary group");
    assert!(!who(2000, 100, &[]).may(&f, MAY_WRITE));
    assert!(!who(2000, 5, &[]).may(&f, MAY_READ), "others: nothing");
    // The owner's class applies even where it grants less than the group's.
    let odd = inode(FILE | 0o070, 1000, 100);
    assert!(!who(1000, 100, &[]).may(&odd, MAY_READ));
    let root = who(0, 0, &[]);
    assert!(root.may(&inode(FILE, 1000, 100), MAY_READ | MAY_WRITE), "root reads and writes anything");
    assert!(!root.may(&inode(FILE | 0o600, 1000, 100), MAY_EXEC), "but executes only what someone may");
    assert!(root.may(&inode(FILE | 0o100, 1000, 100), MAY_EXEC));
    assert!(root.may(&inode(DIR, 1000, 100), MAY_EXEC), "and searches any directory");
    let e = who(2000, 5, &[]).check(&f, MAY_READ, "open").unwrap_err();
    assert_eq!(e.kind().errno(), libc::EACCES);
    assert_eq!(e.message(), "open: uid 2000 may not r inode 7 (mode 640, owner 1000:100)");
}

#[test]
fn a_rule_bounds_the_caller() {
    let e = Who::of(None, None).unwrap_err();
    assert_eq!(e.kind().errno(), libc::EACCES);
    assert!(e.message().contains("names no caller"), "{e}");
    let ranged = Rule { uids: Some([1000, 1999]), gids: Some([100, 199]), ..Rule::default() };
    let caller = |uid, gid, groups: &[u32]| Caller { uid, gid, groups: groups.to_vec() };
    let e = Who::of(Some(&caller(0, 0, &[])), Some(&ranged)).unwrap_err();
    assert_eq!(e.kind().errno(), libc::EACCES, "root is outside the range: {e}");
    let w = Who::of(Some(&caller(1500, 0, &[100, 300])), Some(&ranged)).unwrap();
    let f = |gid| inode(FILE | 0o060, 1, gid);
    assert!(w.may(&f(100), MAY_READ), "a group in the range counts");
    assert!(!w.may(&f(0), MAY_READ) && !w.may(&f(300), MAY_READ), "groups outside do not");
    // Squashed: root acts as the anonymous owner, and is no longer root.
    let squashed = Rule { squash: Squash::Root, ..Rule::default() };
    let w = Who::of(Some(&caller(0, 0, &[])), Some(&squashed)).unwrap();
    assert!(!w.is_root() && w.uid == 65534);
    assert!(!w.may(&inode(FILE | 0o600, 0, 0), MAY_READ), "root's private file");
    assert!(w.may(&inode(FILE | 0o060, 0, 65534), MAY_READ), "the anonymous group");
}

#[test]
fn sticky_directories_keep_others_entries() {
    let tmp = inode(DIR | 0o1777, 0, 0);
    let theirs = inode(FILE | 0o666, 2000, 100);
    assert_eq!(who(1000, 100, &[]).check_sticky(&tmp, &theirs).unwrap_err().kind().errno(), libc::EPERM);
    assert!(who(2000, 100, &[]).check_sticky(&tmp, &theirs).is_ok(), "the entry's owner");
    assert!(who(0, 0, &[]).check_sticky(&tmp, &theirs).is_ok(), "root");
    assert!(
        who(1000, 100, &[]).check_sticky(&inode(DIR | 0o1777, 1000, 0), &theirs).is_ok(),
        "the dir's owner"
    );
    assert!(who(1000, 100, &[]).check_sticky(&inode(DIR | 0o777, 0, 0), &theirs).is_ok(), "not sticky");
    assert!(who(1000, 1, &[]).check_new_owner(1000).is_ok());
    assert_eq!(who(1000, 1, &[]).check_new_owner(0).unwrap_err().kind().errno(), libc::EACCES);
    assert!(who(0, 0, &[]).check_new_owner(1000).is_ok());
}

#[test]
fn setattr_follows_the_kernels_rules() {
    let f = inode(FILE | 0o664, 1000, 100);
    let set = |w: &Who, r: SetAttrRequest| {
        let mut r = r;
        w.check_setattr(&f, &mut r).map(|()| r)
    };
    let owner = who(1000, 100, &[200]);
    let other = who(2000, 100, &[]);
    let root = who(0, 0, &[]);
    let req = SetAttrRequest { ino: 7, ..Default::default() };
    let errno = |r: Result<SetAttrRequest>| r.unwrap_err().kind().errno();

    // Owners: only root gives a file away; the owner may chown to itself and chgrp to its groups.
    assert_eq!(errno(set(&owner, SetAttrRequest { uid: Some(2000), ..req.clone() })), libc::EPERM);
    assert!(set(&owner, SetAttrRequest { uid: Some(1000), ..req.clone() }).is_ok(), "a no-op chown");
    assert!(set(&root, SetAttrRequest { uid: Some(2000), ..req.clone() }).is_ok());
    assert!(set(&owner, SetAttrRequest { gid: Some(200), ..req.clone() }).is_ok(), "a group it is in");
    assert_eq!(errno(set(&owner, SetAttrRequest { gid: Some(300), ..req.clone() })), libc::EPERM);
    assert_eq!(errno(set(&other, SetAttrRequest { gid: Some(100), ..req.clone() })), libc::EPERM);

    // Modes: the owner's; setgid dropped outside the group; clearing setuid/setgid by anyone.
    assert_eq!(errno(set(&other, SetAttrRequest { mode: Some(0o777), ..req.clone() })), libc::EPERM);
    let r = set(&owner, SetAttrRequest { mode: Some(FILE | 0o2755), ..req.clone() }).unwrap();
    assert_eq!(r.mode, Some(FILE | 0o2755), "in the file's group: kept");
    let elsewhere = who(1000, 5, &[]);
    let r = set(&elsewhere, SetAttrRequest { mode: Some(FILE | 0o2755), ..req.clone() }).unwrap();
    assert_eq!(r.mode, Some(FILE | 0o755), "outside it: cleared, as the kernel clears it");
    let suid = inode(FILE | 0o6775, 1000, 100);
    let mut drop = SetAttrRequest { mode: Some(FILE | 0o775), size: Some(0), ..req.clone() };
    assert!(other.check_setattr(&suid, &mut drop).is_ok(), "a non-owner's truncate drops the bits");
    let mut widen = SetAttrRequest { mode: Some(FILE | 0o777), ..req.clone() };
    assert!(other.check_setattr(&suid, &mut widen).is_err(), "but adds none");

    // Times: explicit ones the owner's; "now" also by a writer.
    let t = Some(cairn_proto::Timespec { sec: 1, nsec: 0 });
    assert_eq!(errno(set(&other, SetAttrRequest { mtime: t, ..req.clone() })), libc::EPERM);
    assert!(set(&owner, SetAttrRequest { mtime: t, ..req.clone() }).is_ok());
    let now = SetAttrRequest { atime: t, mtime: t, atime_now: true, mtime_now: true, ..req.clone() };
    assert!(set(&other, now.clone()).is_ok(), "group write");
    assert_eq!(errno(set(&who(3000, 5, &[]), now)), libc::EACCES, "no write permission");

    // Size: write permission, or the owner through an open handle (ftruncate of a 0444 file
    // it created for writing).
    assert!(set(&other, SetAttrRequest { size: Some(0), ..req.clone() }).is_ok());
    let ro = inode(FILE | 0o444, 1000, 100);
    let trunc = |w: &Who, by_handle| {
        w.check_setattr(&ro, &mut SetAttrRequest { size: Some(0), by_handle, ..req.clone() })
    };
    assert_eq!(trunc(&owner, false).unwrap_err().kind().errno(), libc::EACCES);
    assert!(trunc(&owner, true).is_ok());
    assert_eq!(trunc(&other, true).unwrap_err().kind().errno(), libc::EACCES);
    assert!(trunc(&root, false).is_ok());
}

#[test]
fn extended_attributes_by_namespace() {
    let f = inode(FILE | 0o644, 1000, 100);
    let (owner, other, root) = (who(1000, 100, &[]), who(2000, 200, &[]), who(0, 0, &[]));
    assert!(other.check_get_xattr(&f, b"user.a").is_ok(), "readable");
    assert!(who(2000, 200, &[]).check_get_xattr(&inode(FILE | 0o600, 1000, 100), b"user.a").is_err());
    assert_eq!(other.check_get_xattr(&f, b"trusted.a").unwrap_err().kind().errno(), libc::ENODATA);
    assert!(root.check_get_xattr(&f, b"trusted.a").is_ok());
    assert!(other.check_get_xattr(&f, b"security.capability").is_ok());

    assert!(owner.check_set_xattr(&f, b"user.a", false).is_ok());
    assert_eq!(other.check_set_xattr(&f, b"user.a", false).unwrap_err().kind().errno(), libc::EACCES);
    assert_eq!(owner.check_set_xattr(&f, b"trusted.a", false).unwrap_err().kind().errno(), libc::EPERM);
    assert!(root.check_set_xattr(&f, b"trusted.a", true).is_ok());
    assert!(owner.check_set_xattr(&f, b"system.posix_acl_access", false).is_ok());
    assert!(other.check_set_xattr(&f, b"system.posix_acl_access", false).is_err());
    assert!(owner.check_set_xattr(&f, b"security.capability", false).is_err(), "file capabilities: root's");
    assert!(owner.check_set_xattr(&f, b"security.capability", true).is_ok(), "dropped by a writer");
    assert!(other.check_set_xattr(&f, b"security.capability", true).is_err());
    let link = inode(0o120777, 1000, 100);
    assert!(owner.check_set_xattr(&link, b"user.a", false).is_err(), "no user attributes on symlinks");
    let tmp = inode(DIR | 0o1777, 0, 0);
    assert!(other.check_set_xattr(&tmp, b"user.a", false).is_err(), "a sticky directory's are its owner's");
    assert!(other.check_set_xattr(&inode(DIR | 0o777, 0, 0), b"user.a", false).is_ok());
}

#[test]
fn an_open_asks_what_its_access_says() {
    assert_eq!(open_want(MAY_READ), MAY_READ);
    assert_eq!(open_want(MAY_READ | MAY_WRITE), MAY_READ | MAY_WRITE);
    assert_eq!(open_want(MAY_EXEC), MAY_EXEC);
    assert_eq!(open_want(0), MAY_READ | MAY_WRITE, "not said: the most");
    assert_eq!(open_want(0o100 | MAY_WRITE), MAY_WRITE, "unknown bits ignored");
}
