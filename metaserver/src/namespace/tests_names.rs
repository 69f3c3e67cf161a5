//! Where each file is named (`Inode.parent`, `Inode.links`) and what lies inside a subtree.

use cairn_common::ROOT_INO;

use super::rename::RENAME_EXCHANGE;
use super::tests::{dir, file, kind, setup};
use super::*;
use crate::namespace::Problem;
use crate::schema::S_IFREG;

/// The directories `ino`'s names are recorded in, sorted.
fn dirs(ns: &Namespace, ino: u64) -> Vec<u64> {
    let inode = ns.getattr(ino).unwrap();
    let mut dirs: Vec<u64> = inode.name_dirs().collect();
    dirs.sort_unstable();
    dirs
}

#[test]
fn every_change_of_a_name_keeps_the_directories_of_a_files_names() {
    let ns = setup();
    let a = dir(&ns, ROOT_INO, "a");
    let b = dir(&ns, ROOT_INO, "b");
    let f = file(&ns, a.ino, "f");
    assert_eq!(dirs(&ns, f.ino), [a.ino]);
    ns.link(f.ino, b.ino, b"f1").unwrap();
    ns.link(f.ino, b.ino, b"f2").unwrap();
    assert_eq!(dirs(&ns, f.ino), [a.ino, b.ino, b.ino]);
    ns.unlink(a.ino, b"f").unwrap();
    assert_eq!(dirs(&ns, f.ino), [b.ino, b.ino]);
    ns.rename(b.ino, b"f1", ROOT_INO, b"top", 0).unwrap();
    assert_eq!(dirs(&ns, f.ino), [ROOT_INO, b.ino]);
    // A rename over another file: the replaced one loses the name, the moved one gains it.
    let g = file(&ns, a.ino, "g");
    ns.link(g.ino, b.ino, b"g").unwrap();
    ns.rename(ROOT_INO, b"top", b.ino, b"g", 0).unwrap();
    assert_eq!(dirs(&ns, f.ino), [b.ino, b.ino]);
    assert_eq!(dirs(&ns, g.ino), [a.ino]);
    // An exchange moves both.
    ns.rename(a.ino, b"g", b.ino, b"f2", RENAME_EXCHANGE).unwrap();
    assert_eq!(dirs(&ns, f.ino), [a.ino, b.ino]);
    assert_eq!(dirs(&ns, g.ino), [b.ino]);
    // The last name's directory stays (an open file unlinked still knows where it was).
    ns.unlink(b.ino, b"f2").unwrap();
    let s = ns.symlink(&super::tests::new(a.ino, "s", 0), b"target").unwrap();
    assert_eq!(dirs(&ns, s.ino), [a.ino]);
    let report = ns.check(false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn inside_follows_directories_up_and_files_through_any_of_their_names() {
    let ns = setup();
    let top = dir(&ns, ROOT_INO, "projects");
    let mine = dir(&ns, top.ino, "a");
    let deep = dir(&ns, mine.ino, "deep");
    let other = dir(&ns, top.ino, "b");
    let f = file(&ns, deep.ino, "f");
    let g = file(&ns, other.ino, "g");
    for ino in [mine.ino, deep.ino, f.ino] {
        assert!(ns.inside(ino, mine.ino).unwrap(), "{ino}");
    }
    for ino in [ROOT_INO, top.ino, other.ino, g.ino] {
        assert!(!ns.inside(ino, mine.ino).unwrap(), "{ino}");
    }
    assert!(ns.inside(g.ino, ROOT_INO).unwrap());
    // A hard link into the subtree brings the file in; its removal takes it out again.
    ns.link(g.ino, deep.ino, b"g").unwrap();
    assert!(ns.inside(g.ino, mine.ino).unwrap());
    ns.unlink(deep.ino, b"g").unwrap();
    assert!(!ns.inside(g.ino, mine.ino).unwrap());
    // A directory renamed out takes what is below it out.
    ns.rename(mine.ino, b"deep", other.ino, b"deep", 0).unwrap();
    assert!(!ns.inside(f.ino, mine.ino).unwrap());
    assert!(ns.inside(f.ino, other.ino).unwrap());
    assert_eq!(ns.resolve_dir("/projects/b/deep").unwrap(), deep.ino);
    assert_eq!(ns.resolve_dir("/").unwrap(), ROOT_INO);
    assert_eq!(kind(ns.resolve_dir("/projects/a/deep")), ErrorKind::NotFound);
    assert_eq!(kind(ns.resolve_dir("/projects/b/deep/f")), ErrorKind::NotDir);
}

#[test]
fn files_made_before_names_were_recorded_are_refused_until_fsck_records_them() {
    let ns = setup();
    let a = dir(&ns, ROOT_INO, "a");
    let b = dir(&ns, ROOT_INO, "b");
    let f = file(&ns, a.ino, "f");
    let g = file(&ns, a.ino, "g");
    ns.link(g.ino, b.ino, b"g").unwrap();
    // As an older metaserver wrote them: no directories recorded.
    let mut batch = Batch::new();
    for ino in [f.ino, g.ino] {
        let mut old = ns.inode(ino).unwrap();
        (old.parent, old.links) = (0, Vec::new());
        batch.put(Cf::Inodes, schema::ino_key(ino), schema::encode(&old));
    }
    ns.store.write(batch).unwrap();
    assert_eq!(kind(ns.inside(f.ino, a.ino)), ErrorKind::PermissionDenied);
    assert!(ns.inside(f.ino, ROOT_INO).unwrap(), "an unlimited client is not asked about it");
    // A link or unlink keeps them unknown; a rename of a file with one name learns it.
    ns.link(g.ino, b.ino, b"g2").unwrap();
    ns.unlink(b.ino, b"g2").unwrap();
    assert_eq!(kind(ns.inside(g.ino, a.ino)), ErrorKind::PermissionDenied);

    let found = ns.check(false).unwrap();
    let want = [
        Problem::NameDirs { ino: f.ino, dirs: vec![], want: vec![a.ino] },
        Problem::NameDirs { ino: g.ino, dirs: vec![], want: vec![a.ino, b.ino] },
    ];
    assert_eq!(found.problems, want, "{:?}", found.problems);
    assert_eq!(ns.check(true).unwrap().repaired, 2);
    assert!(ns.check(false).unwrap().problems.is_empty());
    assert!(ns.inside(f.ino, a.ino).unwrap());
    assert!(ns.inside(g.ino, b.ino).unwrap());

    let mut old = ns.inode(f.ino).unwrap();
    (old.parent, old.links) = (0, Vec::new());
    let mut batch = Batch::new();
    batch.put(Cf::Inodes, schema::ino_key(f.ino), schema::encode(&old));
    ns.store.write(batch).unwrap();
    ns.rename(a.ino, b"f", b.ino, b"f", 0).unwrap();
    assert_eq!(dirs(&ns, f.ino), [b.ino]);
    assert_eq!(ns.getattr(f.ino).unwrap().mode & S_IFREG, S_IFREG);
}
