//! Namespace semantics against the in-memory store, plus a restart test on RocksDB.

use std::sync::Arc;

use cairn_common::{ErrorKind, Layout, ROOT_INO};
use cairn_proto::{SetAttrRequest, Timespec};

use super::inos::INO_BLOCK;
use super::*;
use crate::fixture::Fixture;
use crate::schema::{S_IFCHR, S_IFIFO, S_IFLNK, S_IFREG, S_ISGID};

pub(super) fn layout() -> Layout {
    Layout::new(2, 1, 4096).unwrap()
}

/// A namespace with three up chunkservers (enough for a 2+1 layout).
pub(super) fn setup() -> Fixture {
    let ns = Fixture::memory(layout());
    add_nodes(&ns, 3);
    ns
}

pub(super) fn add_nodes(ns: &Fixture, n: usize) {
    for i in 0..n {
        ns.registry()
            .register(&format!("node-{i}"), &format!("127.0.0.1:{}", 1000 + i), vec![], 1, "")
            .unwrap();
    }
}

pub(super) fn new(parent: u64, name: &str, mode: u32) -> NewEntry<'_> {
    NewEntry { parent, name: name.as_bytes(), mode, uid: 1000, gid: 1000 }
}

pub(super) fn file(ns: &Namespace, parent: u64, name: &str) -> Inode {
    ns.create(&new(parent, name, S_IFREG | 0o644), 0, true).unwrap().0
}

pub(super) fn dir(ns: &Namespace, parent: u64, name: &str) -> Inode {
    ns.mkdir(&new(parent, name, 0o755)).unwrap()
}

pub(super) fn kind(r: Result<impl std::fmt::Debug>) -> ErrorKind {
    r.expect_err("expected an error").kind()
}

fn names(ns: &Namespace, ino: u64) -> Vec<String> {
    let (entries, more) = ns.readdir(ino, b"", 1024, false).unwrap();
    assert!(!more);
    entries.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
}

#[test]
fn root_exists_on_first_open() {
    let ns = setup();
    let root = ns.getattr(ROOT_INO).unwrap();
    assert_eq!(root.mode, S_IFDIR | 0o755);
    assert_eq!((root.nlink, root.uid, root.gid), (2, 0, 0));
    assert_eq!(root.layout(), layout());
    assert_eq!(ns.stats().directories, 1);
    assert_eq!(kind(ns.getattr(999)), ErrorKind::NotFound);
}

#[test]
fn names_are_validated() {
    let ns = setup();
    let long = "x".repeat(256);
    for (name, want) in [
        ("", ErrorKind::InvalidArgument),
        (".", ErrorKind::InvalidArgument),
        ("..", ErrorKind::InvalidArgument),
        ("a/b", ErrorKind::InvalidArgument),
        ("a\0b", ErrorKind::InvalidArgument),
        (long.as_str(), ErrorKind::NameTooLong),
    ] {
        assert_eq!(kind(ns.create(&new(ROOT_INO, name, S_IFREG | 0o644), 0, false)), want, "{name:?}");
        assert_eq!(kind(ns.mkdir(&new(ROOT_INO, name, 0o755))), want);
        assert_eq!(kind(ns.lookup(ROOT_INO, name.as_bytes())), want);
    }
    file(&ns, ROOT_INO, &"y".repeat(255));
}

#[test]
fn create_lookup_and_exclusive() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "a");
    assert_eq!(f.mode, S_IFREG | 0o644);
    assert_eq!((f.nlink, f.uid, f.gid, f.size), (1, 1000, 1000, 0));
    assert_eq!(f.layout(), layout());
    assert_eq!(f.placement.len(), 3);
    assert_eq!(ns.lookup(ROOT_INO, b"a").unwrap(), f);
    assert_eq!(kind(ns.create(&new(ROOT_INO, "a", S_IFREG | 0o600), 0, true)), ErrorKind::Exists);
    let (again, created) = ns.create(&new(ROOT_INO, "a", S_IFREG | 0o600), 0, false).unwrap();
    assert!(!created);
    assert_eq!(again.ino, f.ino);
    assert_eq!(kind(ns.lookup(ROOT_INO, b"missing")), ErrorKind::NotFound);
    assert_eq!(kind(ns.lookup(f.ino, b"x")), ErrorKind::NotDir);
    assert_eq!(kind(ns.create(&new(f.ino, "x", S_IFREG), 0, false)), ErrorKind::NotDir);
    assert_eq!(kind(ns.mkdir(&new(f.ino, "x", 0o755))), ErrorKind::NotDir);
    assert_eq!(kind(ns.create(&new(ROOT_INO, "d", S_IFDIR | 0o755), 0, false)), ErrorKind::InvalidArgument);
    let root = ns.getattr(ROOT_INO).unwrap();
    assert_eq!(root.nlink, 2);
    assert_eq!(ns.stats().files, 1);

    // Special files: no placement, rdev kept; an existing one is Exists even non-exclusive.
    let (fifo, _) = ns.create(&new(ROOT_INO, "p", S_IFIFO | 0o600), 0, false).unwrap();
    assert_eq!(fifo.mode, S_IFIFO | 0o600);
    assert!(fifo.placement.is_empty());
    let (dev, _) = ns.create(&new(ROOT_INO, "c", S_IFCHR | 0o600), 0x0501, false).unwrap();
    assert_eq!(dev.rdev, 0x0501);
    assert_eq!(kind(ns.create(&new(ROOT_INO, "p", S_IFIFO | 0o600), 0, false)), ErrorKind::Exists);
    dir(&ns, ROOT_INO, "sub");
    assert_eq!(kind(ns.create(&new(ROOT_INO, "sub", S_IFREG | 0o600), 0, false)), ErrorKind::IsDir);
    assert_eq!(ns.stats().files, 1, "fifos and devices are not counted as files");
}

#[test]
fn inodes_after_pages_every_inode_in_order() {
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "d");
    let mut made = vec![ROOT_INO, d.ino];
    for i in 0..5 {
        made.push(file(&ns, d.ino, &format!("f{i}")).ino);
    }
    ns.unlink(d.ino, b"f2").unwrap();
    made.retain(|&ino| ns.getattr(ino).is_ok());
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = ns.inodes_after(after, 2).unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = last.ino;
        seen.extend(page.iter().map(|i| i.ino));
    }
    assert_eq!(seen, made);
    assert!(ns.inodes_after(u64::MAX, 10).unwrap().is_empty());
}

#[test]
fn create_needs_enough_chunkservers() {
    let ns = Fixture::memory(layout());
    add_nodes(&ns, 2);
    let err = ns.create(&new(ROOT_INO, "a", S_IFREG | 0o644), 0, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooFewNodes);
    assert_eq!(kind(ns.lookup(ROOT_INO, b"a")), ErrorKind::NotFound);
    // Special files and directories need no chunkservers.
    ns.create(&new(ROOT_INO, "p", S_IFIFO | 0o600), 0, false).unwrap();
    dir(&ns, ROOT_INO, "d");
}

#[test]
fn mkdir_counts_links_and_setgid_is_inherited() {
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "d");
    assert_eq!((d.mode, d.nlink), (S_IFDIR | 0o755, 2));
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(kind(ns.mkdir(&new(ROOT_INO, "d", 0o755))), ErrorKind::Exists);
    dir(&ns, d.ino, "e");
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 3);

    let g = ns.mkdir(&NewEntry { parent: ROOT_INO, name: b"g", mode: 0o2775, uid: 5, gid: 77 }).unwrap();
    assert_eq!(g.mode & S_ISGID, S_ISGID);
    let child = ns.mkdir(&NewEntry { parent: g.ino, name: b"c", mode: 0o755, uid: 6, gid: 6 }).unwrap();
    assert_eq!(child.gid, 77);
    assert_eq!(child.mode & S_ISGID, S_ISGID, "a child directory inherits S_ISGID");
    let f =
        ns.create(&NewEntry { parent: g.ino, name: b"f", mode: S_IFREG | 0o644, uid: 6, gid: 6 }, 0, true);
    let f = f.unwrap().0;
    assert_eq!(f.gid, 77);
    assert_eq!(f.mode & S_ISGID, 0, "a file does not get S_ISGID");
    assert_eq!(ns.stats().directories, 5);
}

#[test]
fn unlink_and_hard_links() {
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "d");
    let f = file(&ns, ROOT_INO, "f");
    assert_eq!(kind(ns.unlink(ROOT_INO, b"d")), ErrorKind::IsDir);
    assert_eq!(kind(ns.unlink(ROOT_INO, b"nope")), ErrorKind::NotFound);
    assert_eq!(kind(ns.link(d.ino, ROOT_INO, b"d2")), ErrorKind::NotPermitted);
    let linked = ns.link(f.ino, d.ino, b"g").unwrap();
    assert_eq!(linked.nlink, 2);
    assert_eq!(kind(ns.link(f.ino, d.ino, b"g")), ErrorKind::Exists);
    assert_eq!(kind(ns.link(f.ino, f.ino, b"x")), ErrorKind::NotDir);
    ns.set_xattr(f.ino, b"user.a", b"1", 0).unwrap();
    ns.unlink(ROOT_INO, b"f").unwrap();
    let still = ns.getattr(f.ino).unwrap();
    assert_eq!(still.nlink, 1);
    assert_eq!(ns.lookup(d.ino, b"g").unwrap().ino, f.ino);
    ns.unlink(d.ino, b"g").unwrap();
    assert_eq!(kind(ns.getattr(f.ino)), ErrorKind::NotFound);
    assert!(ns.store.scan(Cf::Xattrs, &[], &[], 10).unwrap().is_empty(), "xattrs go with the inode");
    assert_eq!(ns.stats().files, 0);
    assert_eq!(ns.stats().inodes, 2);
}

#[test]
fn rmdir_semantics() {
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "d");
    file(&ns, ROOT_INO, "f");
    file(&ns, d.ino, "x");
    assert_eq!(kind(ns.rmdir(ROOT_INO, b"f")), ErrorKind::NotDir);
    assert_eq!(kind(ns.rmdir(ROOT_INO, b"d")), ErrorKind::NotEmpty);
    ns.unlink(d.ino, b"x").unwrap();
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 3);
    ns.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 2);
    assert_eq!(kind(ns.getattr(d.ino)), ErrorKind::NotFound);
    assert_eq!(kind(ns.rmdir(ROOT_INO, b"d")), ErrorKind::NotFound);
    assert_eq!(ns.stats().directories, 1);
}

#[test]
fn rename_files_and_targets() {
    let ns = setup();
    let a = file(&ns, ROOT_INO, "a");
    let b = file(&ns, ROOT_INO, "b");
    let d = dir(&ns, ROOT_INO, "d");
    let e = dir(&ns, ROOT_INO, "e");
    file(&ns, e.ino, "inside");

    assert_eq!(kind(ns.rename(ROOT_INO, b"nope", ROOT_INO, b"x", 0)), ErrorKind::NotFound);
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_NOREPLACE)), ErrorKind::Exists);
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", ROOT_INO, b"zz", RENAME_EXCHANGE)), ErrorKind::NotFound);
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", ROOT_INO, b"zz", 3)), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", ROOT_INO, b"d", 0)), ErrorKind::IsDir);
    assert_eq!(kind(ns.rename(ROOT_INO, b"d", ROOT_INO, b"a", 0)), ErrorKind::NotDir);
    assert_eq!(kind(ns.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0)), ErrorKind::NotEmpty);
    assert_eq!(kind(ns.rename(ROOT_INO, b"d", d.ino, b"self", 0)), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.rename(a.ino, b"x", ROOT_INO, b"y", 0)), ErrorKind::NotDir);

    // Over an existing file: the target is unlinked.
    ns.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(ns.lookup(ROOT_INO, b"b").unwrap().ino, a.ino);
    assert_eq!(kind(ns.lookup(ROOT_INO, b"a")), ErrorKind::NotFound);
    assert_eq!(kind(ns.getattr(b.ino)), ErrorKind::NotFound);
    assert_eq!(ns.stats().files, 2);

    // Same inode (hard links): success, nothing changes.
    ns.link(a.ino, ROOT_INO, b"hard").unwrap();
    ns.rename(ROOT_INO, b"b", ROOT_INO, b"hard", 0).unwrap();
    assert_eq!(names(&ns, ROOT_INO), vec!["b", "d", "e", "hard"]);
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 2);
    // Rename onto itself.
    ns.rename(ROOT_INO, b"b", ROOT_INO, b"b", 0).unwrap();

    // A file into a directory; parents' times move.
    let before = ns.getattr(d.ino).unwrap();
    ns.rename(ROOT_INO, b"b", d.ino, b"moved", 0).unwrap();
    let after = ns.getattr(d.ino).unwrap();
    assert!((after.mtime_sec, after.mtime_nsec) >= (before.mtime_sec, before.mtime_nsec));
    assert_eq!(ns.lookup(d.ino, b"moved").unwrap().ino, a.ino);

    // Directory over an empty directory.
    let empty = dir(&ns, ROOT_INO, "empty");
    ns.rename(ROOT_INO, b"e", ROOT_INO, b"empty", 0).unwrap();
    assert_eq!(kind(ns.getattr(empty.ino)), ErrorKind::NotFound);
    assert_eq!(ns.lookup(ROOT_INO, b"empty").unwrap().ino, e.ino);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 4, "root has d and empty(=e)");
    assert_eq!(ns.stats().directories, 3);
}

#[test]
fn rename_directories_across_parents_fixes_links() {
    let ns = setup();
    let a = dir(&ns, ROOT_INO, "a");
    let b = dir(&ns, ROOT_INO, "b");
    let c = dir(&ns, a.ino, "c");
    dir(&ns, c.ino, "deep");
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 3);
    // Into its own subtree.
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", c.ino, b"x", 0)), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.rename(ROOT_INO, b"a", a.ino, b"x", 0)), ErrorKind::InvalidArgument);
    ns.rename(a.ino, b"c", b.ino, b"c2", 0).unwrap();
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(ns.getattr(b.ino).unwrap().nlink, 3);
    assert_eq!(ns.getattr(c.ino).unwrap().parent, b.ino);
    // Now a may move under c (no longer its ancestor), and then c under a fails.
    ns.rename(ROOT_INO, b"a", c.ino, b"a", 0).unwrap();
    assert_eq!(kind(ns.rename(b.ino, b"c2", a.ino, b"c", 0)), ErrorKind::InvalidArgument);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(ns.getattr(c.ino).unwrap().nlink, 4);
}

#[test]
fn rename_exchange_swaps() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let d = dir(&ns, ROOT_INO, "d");
    let sub = dir(&ns, d.ino, "sub");
    let g = file(&ns, sub.ino, "g");
    ns.rename(ROOT_INO, b"f", sub.ino, b"g", RENAME_EXCHANGE).unwrap();
    assert_eq!(ns.lookup(ROOT_INO, b"f").unwrap().ino, g.ino);
    assert_eq!(ns.lookup(sub.ino, b"g").unwrap().ino, f.ino);
    // A directory and a file across parents: link counts follow the directory.
    ns.rename(ROOT_INO, b"f", d.ino, b"sub", RENAME_EXCHANGE).unwrap();
    assert_eq!(ns.lookup(ROOT_INO, b"f").unwrap().ino, sub.ino);
    assert_eq!(ns.lookup(d.ino, b"sub").unwrap().ino, g.ino);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(ns.getattr(sub.ino).unwrap().parent, ROOT_INO);
    // Exchanging a directory with its own descendant is a cycle.
    let inner = dir(&ns, sub.ino, "inner");
    assert_eq!(
        kind(ns.rename(ROOT_INO, b"f", sub.ino, b"inner", RENAME_EXCHANGE)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(ns.getattr(inner.ino).unwrap().parent, sub.ino);
}

#[test]
fn symlinks() {
    let ns = setup();
    let s = ns.symlink(&new(ROOT_INO, "l", 0), b"../target").unwrap();
    assert_eq!(s.mode, S_IFLNK | 0o777);
    assert_eq!(s.size, 9);
    assert_eq!(ns.readlink(s.ino).unwrap(), b"../target");
    let f = file(&ns, ROOT_INO, "f");
    assert_eq!(kind(ns.readlink(f.ino)), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.symlink(&new(ROOT_INO, "big", 0), &vec![b'a'; 4096])), ErrorKind::NameTooLong);
    ns.symlink(&new(ROOT_INO, "max", 0), &vec![b'a'; 4095]).unwrap();
    assert_eq!(kind(ns.symlink(&new(ROOT_INO, "l", 0), b"x")), ErrorKind::Exists);
    ns.unlink(ROOT_INO, b"l").unwrap();
    assert!(ns.store.get(Cf::Symlinks, &schema::ino_key(s.ino)).unwrap().is_none());
}

#[test]
fn setattr_changes_what_was_asked() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let t = Timespec { sec: 1000, nsec: 5 };
    let set = |req: SetAttrRequest| ns.setattr(&SetAttrRequest { ino: f.ino, ..req });
    let out = set(SetAttrRequest { mode: Some(S_IFDIR | 0o4711), ..Default::default() }).unwrap();
    assert_eq!(out.mode, S_IFREG | 0o4711, "the file type bits stay");
    let out = set(SetAttrRequest {
        uid: Some(7),
        gid: Some(8),
        atime: Some(t),
        mtime: Some(t),
        ..Default::default()
    });
    let out = out.unwrap();
    assert_eq!((out.uid, out.gid, out.atime_sec, out.mtime_sec, out.mtime_nsec), (7, 8, 1000, 1000, 5));
    assert!(out.ctime_sec > 1000, "ctime is now");
    let out = set(SetAttrRequest { mtime_now: true, ctime: Some(t), ..Default::default() }).unwrap();
    assert!(out.mtime_sec > 1000);
    assert_eq!(out.ctime_sec, 1000);
    let bad = SetAttrRequest { atime: Some(Timespec { sec: 0, nsec: 2_000_000_000 }), ..Default::default() };
    assert_eq!(kind(set(bad)), ErrorKind::InvalidArgument);
    let d = dir(&ns, ROOT_INO, "d");
    let r = ns.setattr(&SetAttrRequest { ino: d.ino, size: Some(0), ..Default::default() });
    assert_eq!(kind(r), ErrorKind::IsDir);
    assert_eq!(kind(ns.setattr(&SetAttrRequest { ino: 999, ..Default::default() })), ErrorKind::NotFound);
}

#[test]
fn xattrs() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    assert_eq!(kind(ns.get_xattr(f.ino, b"user.a")), ErrorKind::NoData);
    assert_eq!(kind(ns.set_xattr(f.ino, b"user.a", b"1", XATTR_REPLACE)), ErrorKind::NoData);
    ns.set_xattr(f.ino, b"user.a", b"1", XATTR_CREATE).unwrap();
    assert_eq!(kind(ns.set_xattr(f.ino, b"user.a", b"2", XATTR_CREATE)), ErrorKind::Exists);
    ns.set_xattr(f.ino, b"user.a", b"2", XATTR_REPLACE).unwrap();
    ns.set_xattr(f.ino, b"user.b", b"", 0).unwrap();
    assert_eq!(ns.get_xattr(f.ino, b"user.a").unwrap(), b"2");
    assert_eq!(ns.get_xattr(f.ino, b"user.b").unwrap(), b"");
    assert_eq!(ns.list_xattr(f.ino).unwrap(), vec![b"user.a".to_vec(), b"user.b".to_vec()]);
    assert_eq!(kind(ns.set_xattr(f.ino, b"user.c", &vec![0; 65537], 0)), ErrorKind::TooBig);
    ns.set_xattr(f.ino, b"user.c", &vec![0; 65536], 0).unwrap();
    assert_eq!(kind(ns.set_xattr(f.ino, b"", b"x", 0)), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.set_xattr(f.ino, &vec![b'n'; 256], b"x", 0)), ErrorKind::Range);
    assert_eq!(kind(ns.get_xattr(f.ino, &vec![b'n'; 256])), ErrorKind::Range);
    ns.remove_xattr(f.ino, b"user.a").unwrap();
    assert_eq!(kind(ns.remove_xattr(f.ino, b"user.a")), ErrorKind::NoData);
    assert_eq!(ns.list_xattr(f.ino).unwrap().len(), 2);
    assert_eq!(kind(ns.set_xattr(999, b"user.a", b"1", 0)), ErrorKind::NotFound);
    // Other inodes' xattrs are separate.
    let g = file(&ns, ROOT_INO, "g");
    assert!(ns.list_xattr(g.ino).unwrap().is_empty());
}

#[test]
fn an_inodes_xattrs_are_bounded_with_enospc() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    // Names: 256 of 255 bytes (each with its NUL) fill one 64 KiB listxattr buffer.
    let name = |i: usize| format!("user.{i:0>250}").into_bytes();
    for i in 0..256 {
        ns.set_xattr(f.ino, &name(i), b"v", 0).unwrap();
    }
    let e = ns.set_xattr(f.ino, &name(256), b"v", 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    // Replacing one that is there still works; so does adding one after another goes.
    ns.set_xattr(f.ino, &name(3), b"new value", XATTR_REPLACE).unwrap();
    ns.remove_xattr(f.ino, &name(0)).unwrap();
    ns.set_xattr(f.ino, &name(256), b"v", 0).unwrap();
    assert_eq!(ns.list_xattr(f.ino).unwrap().len(), 256);
    // Values: 4 MiB in all per inode.
    let g = file(&ns, ROOT_INO, "g");
    let big = vec![7u8; 65536];
    let mut stored = 0;
    while ns.set_xattr(g.ino, format!("user.big{stored}").as_bytes(), &big, 0).is_ok() {
        stored += 1;
        assert!(stored <= 64, "more than 4 MiB of xattrs on one inode");
    }
    assert_eq!(stored, 63, "63 values of 64 KiB with their names fit in 4 MiB");
    // A small one still fits; replacing a value with one as large keeps the total; more does not fit.
    ns.set_xattr(g.ino, b"user.small", b"x", 0).unwrap();
    ns.set_xattr(g.ino, b"user.big0", &vec![1u8; 65536], XATTR_REPLACE).unwrap();
    assert_eq!(kind(ns.set_xattr(g.ino, b"user.more", &big, 0)), ErrorKind::NoSpace);
}

#[test]
fn readdir_pages_through_ten_thousand_entries() {
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "big");
    for i in 0..10_000 {
        ns.mkdir(&new(d.ino, &format!("e{i:05}"), 0o755)).unwrap();
    }
    let mut seen = Vec::new();
    let mut after = Vec::new();
    let mut pages = 0;
    loop {
        let (entries, more) = ns.readdir(d.ino, &after, 5000, pages % 2 == 0).unwrap();
        assert!(entries.len() <= 1024);
        pages += 1;
        if let Some(last) = entries.last() {
            after = last.name.clone();
        }
        for e in entries {
            assert_eq!(e.mode, S_IFDIR);
            assert_eq!(e.attr.is_some(), pages % 2 == 1);
            seen.push(String::from_utf8(e.name).unwrap());
        }
        if !more {
            break;
        }
    }
    assert_eq!(seen.len(), 10_000);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(pages, 10);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 10_002);
    let (e, more) = ns.readdir(d.ino, b"e09998", 0, false).unwrap();
    assert_eq!((e.len(), more), (1, false));
    let f = file(&ns, ROOT_INO, "f");
    assert_eq!(kind(ns.readdir(f.ino, b"", 10, false)), ErrorKind::NotDir);
}

#[test]
fn statfs_scales_by_root_layout() {
    let ns = Fixture::memory(layout());
    let tier =
        cairn_proto::TierUsage { name: "ssd".into(), capacity: 3 << 30, free: 3 << 29, ..Default::default() };
    for i in 0..3 {
        ns.registry().register(&format!("n{i}"), "127.0.0.1:1", vec![tier.clone()], 0, "").unwrap();
    }
    file(&ns, ROOT_INO, "f");
    let s = ns.statfs().unwrap();
    assert_eq!((s.raw_capacity, s.raw_free), (9 << 30, 9 << 29));
    assert_eq!((s.usable_capacity, s.usable_free), (6 << 30, 3 << 30));
    assert_eq!((s.files, s.name_max, s.block_size), (2, 255, 4096));
}

#[test]
fn concurrent_operations_keep_counts_consistent() {
    let ns = Arc::new(setup());
    let d1 = dir(&ns, ROOT_INO, "d1").ino;
    let d2 = dir(&ns, ROOT_INO, "d2").ino;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let ns = ns.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let name = format!("t{t}-{i}");
                    file(&ns, d1, &name);
                    let (from, to) = if i % 2 == 0 { (d1, d2) } else { (d1, d1) };
                    ns.rename(from, name.as_bytes(), to, format!("r{name}").as_bytes(), 0).unwrap();
                    // Directories ping-pong between the two parents.
                    let dn = format!("dir{t}-{i}");
                    dir(&ns, d2, &dn);
                    ns.rename(d2, dn.as_bytes(), d1, dn.as_bytes(), 0).unwrap();
                    if i % 3 == 0 {
                        ns.rmdir(d1, dn.as_bytes()).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let dirs_left = 8 * (100 - 34);
    assert_eq!(ns.getattr(d1).unwrap().nlink as usize, 2 + dirs_left);
    assert_eq!(ns.getattr(d2).unwrap().nlink, 2);
    let s = ns.stats();
    assert_eq!(s.files, 800);
    assert_eq!(s.directories as usize, 3 + dirs_left);
    assert_eq!(s.inodes as usize, 3 + 800 + dirs_left);
}

#[test]
fn restart_on_rocksdb_keeps_everything_and_never_reuses_inodes() {
    let dir_path = tempfile::tempdir().unwrap();
    let open = || Fixture::rocks(dir_path.path(), layout());
    let (d, f, l, max_ino) = {
        let ns = open();
        add_nodes(&ns, 3);
        let d = dir(&ns, ROOT_INO, "d");
        let f = file(&ns, d.ino, "f");
        ns.set_xattr(f.ino, b"user.k", b"v", 0).unwrap();
        let l = ns.symlink(&new(d.ino, "l", 0), b"f").unwrap();
        let stripe = cairn_proto::StripeInfo {
            index: 0,
            version: 1,
            len: 10,
            written_len: 10,
            missing: 0,
            ..Default::default()
        };
        ns.commit(f.ino, 10, &[stripe], None).unwrap();
        let max = l.ino;
        (d, f, l, max)
    };
    let ns = open();
    assert_eq!(ns.lookup(ROOT_INO, b"d").unwrap().ino, d.ino);
    assert_eq!(ns.lookup(d.ino, b"f").unwrap().size, 10);
    assert_eq!(ns.get_xattr(f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(ns.readlink(l.ino).unwrap(), b"f");
    assert_eq!(ns.open_file(f.ino).unwrap().1.len(), 1);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 3);
    let s = ns.stats();
    assert_eq!((s.files, s.directories, s.logical_bytes, s.inodes), (1, 2, 10, 4));
    assert_eq!(ns.registry().nodes().len(), 3);
    assert!(ns.registry().nodes().iter().all(|n| !n.up));
    add_nodes(&ns, 3);
    let g = file(&ns, d.ino, "g");
    assert!(g.ino > max_ino, "inode {} reused (max before restart {max_ino})", g.ino);
    let e = dir(&ns, ROOT_INO, "e");
    assert!(e.ino > g.ino);
}

#[test]
fn check_finds_and_repairs_inconsistencies_and_keeps_data() {
    use crate::namespace::Problem;
    let ns = setup();
    let d = dir(&ns, ROOT_INO, "d");
    let f = file(&ns, d.ino, "f");
    let g = file(&ns, ROOT_INO, "g");
    let clean = ns.check(false).unwrap();
    assert!(clean.problems.is_empty(), "{:?}", clean.problems);
    assert_eq!(clean.inodes, 4);

    // Damage the store behind the namespace's back: drop the entry of f (f unreachable), add
    // an entry naming a missing inode, give g a wrong link count and d a wrong one.
    let mut batch = Batch::new();
    batch.delete(Cf::Dentries, schema::dentry_key(d.ino, b"f"));
    batch.put(
        Cf::Dentries,
        schema::dentry_key(ROOT_INO, b"ghost"),
        schema::encode(&Dentry::new(4242, S_IFREG)),
    );
    let mut g2 = ns.inode(g.ino).unwrap();
    g2.nlink = 3;
    batch.put(Cf::Inodes, schema::ino_key(g.ino), schema::encode(&g2));
    let mut d2 = ns.inode(d.ino).unwrap();
    d2.nlink = 7;
    batch.put(Cf::Inodes, schema::ino_key(d.ino), schema::encode(&d2));
    ns.store.write(batch).unwrap();

    let found = ns.check(false).unwrap();
    let want = [
        Problem::DanglingEntry { parent: ROOT_INO, name: b"ghost".to_vec(), ino: 4242 },
        Problem::LinkCount { ino: g.ino, nlink: 3, want: 1 },
        Problem::LinkCount { ino: d.ino, nlink: 7, want: 2 },
        Problem::Unreachable { ino: f.ino },
    ];
    for p in &want {
        assert!(found.problems.contains(p), "{p} not in {:?}", found.problems);
    }
    assert_eq!(found.problems.len(), want.len(), "{:?}", found.problems);
    assert_eq!(found.repaired, 0);

    let fixed = ns.check(true).unwrap();
    assert_eq!(fixed.repaired, 4);
    let after = ns.check(false).unwrap();
    assert!(after.problems.is_empty(), "{:?}", after.problems);
    // f is back, in /lost+found, with its stripes untouched.
    let lost = ns.lookup(ROOT_INO, crate::namespace::LOST_FOUND).unwrap();
    let back = ns.lookup(lost.ino, format!("#{}", f.ino).as_bytes()).unwrap();
    assert_eq!((back.ino, back.nlink), (f.ino, 1));
    assert_eq!(ns.getattr(g.ino).unwrap().nlink, 1);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(kind(ns.lookup(ROOT_INO, b"ghost")), ErrorKind::NotFound);
}

#[test]
fn a_restored_namespace_skips_the_inode_numbers_and_client_ids_lost_changes_may_have_used() {
    let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
    let (end, client) = {
        let ns = Fixture::open(store.clone(), layout());
        dir(&ns, ROOT_INO, "kept");
        (ns.inos_reserved_end(), ns.register_client().unwrap())
    };
    // What files created after the backup had: numbers from `end` on, clients from `client + 1`.
    let mut batch = Batch::new();
    prepare_restored(&*store, &mut batch).unwrap();
    store.write(batch).unwrap();
    let ns = Fixture::open(store.clone(), layout());
    assert!(ns.is_foreign_ino(end) && ns.is_foreign_ino(end + 5000), "the skipped numbers are foreign");
    assert!(!ns.is_foreign_ino(end - 1), "numbers the namespace had are not");
    let new = dir(&ns, ROOT_INO, "new");
    assert!(new.ino >= end + RESTORE_INO_GAP, "a new file gets a number no lost file had: {}", new.ino);
    assert!(!ns.is_foreign_ino(new.ino));
    assert!(ns.register_client().unwrap() as u64 > client as u64 + RESTORE_CLIENT_GAP - 1);
    // A second restore adds its range; the first one stays.
    let end2 = ns.inos_reserved_end();
    drop(ns);
    let mut batch = Batch::new();
    prepare_restored(&*store, &mut batch).unwrap();
    store.write(batch).unwrap();
    let ns = Fixture::open(store, layout());
    assert!(ns.is_foreign_ino(end) && ns.is_foreign_ino(end2));
}

/// Each opening reserves a block of inode numbers, and the next block is reserved in the
/// background once half of the current one is handed out, so no create waits for that write
/// while it holds its locks; numbers stay below what is reserved and never repeat.
#[test]
fn the_next_inode_block_is_reserved_before_the_current_one_runs_out() {
    let ns = setup();
    let reserved = |ns: &Fixture| read_counter(&**ns.store(), counter::INO_RESERVED).unwrap().unwrap();
    let first = reserved(&ns);
    assert_eq!(first, ns.inos_reserved_end(), "the opening reserved a block");
    let mut last = 0;
    for i in 0..=INO_BLOCK / 2 {
        last = dir(&ns, ROOT_INO, &format!("d{i}")).ino;
        assert!(last < reserved(&ns), "inode {last} handed out before it was reserved");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while reserved(&ns) == first {
        assert!(std::time::Instant::now() < deadline, "the next block was never reserved");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(reserved(&ns), first + INO_BLOCK);
    while ns.inos_reserved_end() != first + INO_BLOCK {
        assert!(std::time::Instant::now() < deadline, "the reservation was never taken into use");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Past the first block without a wait, and on into a third.
    for i in 0..INO_BLOCK {
        let ino = dir(&ns, ROOT_INO, &format!("e{i}")).ino;
        assert!(ino > last && ino < reserved(&ns), "inode {ino} handed out before it was reserved");
        last = ino;
    }
    assert!(last >= first, "numbers went past the first block");
}

/// Inode numbers stay in namespace slot 0 (the top 12 bits name a slot, which another
/// metadata group may own): its last number is handed out, the next create fails with ENOSPC
/// and changes nothing.
#[test]
fn inode_numbers_end_at_the_last_of_slot_0() {
    let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
    let last = (1u64 << cairn_common::ids::SLOT_SHIFT) - 1;
    let mut batch = crate::store::Batch::new();
    batch.put(Cf::Counters, counter::INO_RESERVED, crate::schema::encode(&Counter { value: last }));
    store.write(batch).unwrap();
    let ns = Fixture::open(store, layout());
    assert_eq!(dir(&ns, ROOT_INO, "last").ino, last);
    let e = ns.mkdir(&new(ROOT_INO, "past", 0o755)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(ns.lookup(ROOT_INO, b"past").is_err(), "nothing was made");
}

/// A group other than 0 opens the namespace of its slots only with the cluster's identity
/// (shared by group 0), makes no root and writes nothing, keeps the epoch its leadership
/// raised, and numbers new inodes in its own slots: a file in its parent's, a directory in one
/// chosen by hash, never in a slot it promised to give up while that promise holds.
#[test]
fn a_group_other_than_0_numbers_inodes_in_its_own_slots() {
    let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
    let cluster = Cluster::open(store.clone(), Duration::from_secs(60), DEFAULT_CLIENT_LEASE).unwrap();
    for i in 0..3 {
        // Placement (group 0's chunkservers, as another group will read them).
        cluster
            .registry()
            .register(&format!("n{i}"), &format!("127.0.0.1:{}", 1000 + i), vec![], 1, "")
            .unwrap();
    }
    let map = Arc::new(crate::groups::Groups::open(store.clone()).unwrap());
    let open = |group| Namespace::open_slots(store.clone(), (group, map.clone()), 77, cluster.clone());
    assert_eq!(open(0).err().unwrap().kind(), ErrorKind::InvalidArgument);
    let e = open(3).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("does not hold the cluster's identity"), "{e}");

    let id = "0123456789abcdef0123456789abcdef";
    let owning = |version, slots: &[usize]| {
        let mut owners = vec![0u32; crate::groups::SLOTS];
        slots.iter().for_each(|s| owners[*s] = 3);
        let group = cairn_proto::MetaGroup { group: 3, replicas: vec!["1=127.0.0.1:1".into()] };
        cairn_proto::GroupMap { version, groups: vec![group], slots: owners, ..Default::default() }
    };
    map.adopt(owning(2, &[5, 9, 11]), id).unwrap();
    let before = store.scan(Cf::Counters, &[], &[], usize::MAX).unwrap();
    let ns = open(3).unwrap();
    assert_eq!((ns.group(), ns.fence(), ns.cluster_id()), (3, 77, id));
    assert_eq!(store.scan(Cf::Counters, &[], &[], usize::MAX).unwrap(), before, "nothing written");
    assert_eq!(ns.getattr(ROOT_INO).unwrap_err().kind(), ErrorKind::NotFound, "no root");

    // A directory in slot 5, as a cross-group mkdir will put one there (planted above the
    // numbers the slot's counter hands out here).
    let top = in_slot(5, 1 << 40);
    let mut d = Inode::new(top, S_IFDIR | 0o755, 0, 0, &cairn_common::time::now());
    d.nlink = 2;
    d.parent = ROOT_INO;
    d.set_layout(layout());
    let mut batch = Batch::new();
    batch.put(Cf::Inodes, schema::ino_key(top), schema::encode(&d));
    store.write(batch).unwrap();

    // Slot 11 promised away (empty): nothing is numbered there while the promise holds.
    assert_eq!(ns.release_slots(&[11], 2).unwrap(), [in_slot(11, 1)], "never numbered there");
    let slot = |ino: u64| cairn_common::ids::slot_of(ino);
    let dirs = |ns: &Namespace, prefix: &str| -> Vec<u32> {
        (0..24).map(|i| slot(ns.mkdir(&new(top, &format!("{prefix}{i}"), 0o755)).unwrap().ino)).collect()
    };
    let made = dirs(&ns, "a");
    assert!(made.contains(&5) && made.contains(&9) && !made.contains(&11), "{made:?}");
    let file = ns.create(&new(top, "f", S_IFREG | 0o644), 0, true).unwrap().0;
    assert_eq!(slot(file.ino), 5, "a file takes its parent's slot");
    assert!(file.ino < top && file.ino > in_slot(5, 0));
    let e = ns.release_slots(&[9], 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
    assert_eq!(ns.release_slots(&[11], 1).unwrap_err().kind(), ErrorKind::Interrupted, "an older map");
    assert_eq!(ns.release_slots(&[11], u64::MAX).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(ns.release_slots(&[4096], 2).unwrap_err().kind(), ErrorKind::InvalidArgument);

    // The promise is kept across a reopening; a newer map ends it (it moved the slot, or was
    // made without this promise).
    drop(ns);
    let ns = open(3).unwrap();
    assert!(!dirs(&ns, "b").contains(&11));
    let again = ns.create(&new(top, "g", S_IFREG | 0o644), 0, true).unwrap().0;
    assert!(again.ino > file.ino, "numbers never repeat across openings");
    map.adopt(owning(3, &[5, 9, 11]), id).unwrap();
    assert!(dirs(&ns, "c").contains(&11));
    map.adopt(owning(4, &[9, 11]), id).unwrap();
    let e = ns.create(&new(top, "h", S_IFREG | 0o644), 0, true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongGroup, "slot 5 is not this group's any more: {e}");

    // A restore moves every slot's numbers on, also of a slot not numbered in yet: what the
    // changes lost after the backup handed out is never handed out again.
    let before = ns.mkdir(&new(top, "r", 0o755)).unwrap().ino;
    drop(ns);
    let mut batch = Batch::new();
    prepare_restored(&*store, &mut batch).unwrap();
    store.write(batch).unwrap();
    map.adopt(owning(5, &[9, 11, 13]), id).unwrap();
    let ns = open(3).unwrap();
    let made: Vec<u64> = (0..24).map(|i| ns.mkdir(&new(top, &format!("d{i}"), 0o755)).unwrap().ino).collect();
    assert!(
        made.iter().filter(|i| slot(**i) == slot(before)).all(|i| *i >= before + RESTORE_INO_GAP),
        "{made:?}"
    );
    let fresh = made.iter().find(|i| slot(**i) == 13).expect("some in slot 13");
    assert!(*fresh > in_slot(13, RESTORE_INO_GAP), "{fresh}");

    // A slot that left another group comes with the floor that group had reserved it up to.
    let floor = in_slot(15, 3 << 40);
    let from_elsewhere = cairn_proto::GroupMap { floors: [(15, floor)].into(), ..owning(6, &[15]) };
    map.adopt(from_elsewhere, id).unwrap();
    let first = ns.mkdir(&new(top, "after-move", 0o755)).unwrap().ino;
    assert!(slot(first) == 15 && first >= floor, "{first}");
    // Given away (its end reported: past what was handed out) and back with a higher floor
    // another group left: numbering goes on from that floor, not from the counter it had.
    ns.rmdir(top, b"after-move").unwrap();
    let ends = ns.release_slots(&[15], 6).unwrap();
    assert!(ends[0] > first, "{ends:?}");
    let higher = in_slot(15, 5 << 40);
    map.adopt(cairn_proto::GroupMap { floors: [(15, higher)].into(), ..owning(8, &[15]) }, id).unwrap();
    let again = ns.mkdir(&new(top, "back-again", 0o755)).unwrap().ino;
    assert!(again >= higher, "{again}");

    // Restored from a backup, the group forgets the map it held (slots may have moved since)
    // and serves again only once group 0 shares the current one.
    drop(ns);
    let mut batch = Batch::new();
    crate::groups::forget_on_restore(&mut batch);
    store.write(batch).unwrap();
    let forgot = Arc::new(crate::groups::Groups::open(store.clone()).unwrap());
    let e = Namespace::open_slots(store.clone(), (3, forgot.clone()), 78, cluster.clone()).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("holds no group map yet"), "{e}");
    forgot.adopt(owning(9, &[15]), id).unwrap();
    Namespace::open_slots(store.clone(), (3, forgot), 78, cluster.clone()).unwrap();
}

fn in_slot(slot: u64, n: u64) -> u64 {
    (slot << cairn_common::ids::SLOT_SHIFT) | n
}
