//! Directory renames across metadata groups (`txn/change.rs`'s `reparent`, the loop check of
//! `txn/exchange.rs` and `rename.rs`): where each half lands, the loop refused across groups,
//! a move in flux stopping other moves' walks, a directory replacing an empty one, and
//! recovery after a crash at each step.

use cairn_common::{ErrorKind, ROOT_INO};

use super::tests::{dir, file, kind};
use super::tests_txn::{names, Pair, GROUP};
use super::txn::{self, change_across, mkdir_across, Changed, Peers};
use super::*;
use crate::schema::{TxnEffect, S_IFDIR};

fn owner(pair: &Pair, ino: u64) -> u32 {
    pair.peers().owner(ino)
}

fn side(pair: &Pair, group: u32) -> &Namespace {
    if group == 0 {
        &pair.g0
    } else {
        &pair.g3
    }
}

/// rename of directory `ino`, named `(parent, name)`, to `(to, to_name)`, as the service plans
/// it (the source directory's group coordinates).
fn move_plan(
    pair: &Pair,
    (parent, name): (u64, &str),
    ino: u64,
    (to, to_name): (u64, &str),
) -> Vec<(u32, TxnEffect)> {
    vec![
        (owner(pair, parent), txn::unname(parent, name.as_bytes(), ino)),
        (owner(pair, to), txn::name(to, to_name.as_bytes(), ino, S_IFDIR, true, None)),
        (owner(pair, ino), txn::reparent(ino, (parent, to), None)),
    ]
}

fn move_dir(pair: &Pair, from: (u64, &str), ino: u64, to: (u64, &str)) -> Result<Changed> {
    let coordinator = side(pair, owner(pair, from.0));
    let changed = change_across(coordinator, &pair.peers(), move_plan(pair, from, ino, to))?;
    if let Changed::Done { acknowledged: true, id, .. } = &changed {
        coordinator.txn_forget(*id)?;
    }
    Ok(changed)
}

/// The effects of `plan` that `group` takes.
fn of(plan: &[(u32, TxnEffect)], group: u32) -> Vec<TxnEffect> {
    plan.iter().filter(|(g, _)| *g == group).map(|(_, e)| e.clone()).collect()
}

/// Steps 1 and 2 of `plan` (coordinated by group 0): both groups' parts prepared, marks
/// included; nothing decided.
fn prepared(pair: &Pair, plan: &[(u32, TxnEffect)]) -> txn::TxnId {
    let (id, _) = pair.g0.change_begin(of(plan, 0), &[GROUP]).unwrap();
    pair.g3.txn_prepare_change(id, of(plan, GROUP)).unwrap();
    id
}

/// A change [`prepared`] given up on both sides, its records gone.
fn give_up(pair: &Pair, id: txn::TxnId) {
    pair.g0.change_abort(id, &[GROUP]).unwrap();
    pair.g3.txn_decide(id, false).unwrap();
    pair.g0.txn_forget(id).unwrap();
}

fn settled(pair: &Pair) {
    assert!(pair.g0.txns().unwrap().is_empty(), "group 0 holds {:?}", pair.g0.txns().unwrap());
    assert!(pair.g3.txns().unwrap().is_empty(), "group 3 holds {:?}", pair.g3.txns().unwrap());
    for ns in [&*pair.g0, &pair.g3] {
        let report = ns.check(false).unwrap();
        assert!(report.problems.is_empty(), "group {}: {:?}", ns.group(), report.problems);
    }
}

/// `d` (group 3) under the root with a file and a subdirectory `s` (group 3), and `e` (group 0)
/// under the root.
fn tree(pair: &Pair) -> (Inode, Inode, Inode) {
    let d = mkdir_across(&pair.g0, &pair.peers(), &tests::new(ROOT_INO, "d", 0o755), GROUP).unwrap().inode;
    file(&pair.g3, d.ino, "x");
    let s = dir(&pair.g3, d.ino, "s");
    let e = dir(&pair.g0, ROOT_INO, "e");
    (d, s, e)
}

/// A directory of group 3 moved under a directory of group 0: its entry goes, the new one
/// names it, its parent is the new one, the link counts of both parents follow, its contents
/// stay where they are; moved back by group 0 as the coordinator of its new parent.
#[test]
fn a_directory_moves_across_groups() {
    let pair = Pair::new();
    let (d, s, e) = tree(&pair);
    let root_links = pair.g0.getattr(ROOT_INO).unwrap().nlink;
    let before = cairn_common::time::now();
    let changed = move_dir(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "d2")).unwrap();
    assert!(matches!(changed, Changed::Done { acknowledged: true, .. }), "{changed:?}");
    assert_eq!(kind(pair.g0.lookup_entry(ROOT_INO, b"d")), ErrorKind::NotFound);
    match pair.g0.lookup_entry(e.ino, b"d2").unwrap() {
        Looked::Elsewhere { ino, kind } => assert_eq!((ino, kind), (d.ino, S_IFDIR)),
        other => panic!("{other:?}"),
    }
    let moved = pair.g3.getattr(d.ino).unwrap();
    assert_eq!(moved.parent, e.ino);
    assert!(moved.moving.is_empty(), "the mark is cleared");
    assert!((moved.ctime_sec, moved.ctime_nsec) >= (before.sec, before.nsec), "its ctime changed");
    assert_eq!(pair.g0.getattr(ROOT_INO).unwrap().nlink, root_links - 1);
    assert_eq!(pair.g0.getattr(e.ino).unwrap().nlink, 3);
    assert_eq!(names(&pair.g3, d.ino).len(), 2, "its contents stay");
    assert_eq!(pair.g3.getattr(s.ino).unwrap().parent, d.ino);
    settled(&pair);

    // Within its new directory (its ctime only, no mark), then back to the root.
    let before = cairn_common::time::now();
    move_dir(&pair, (e.ino, "d2"), d.ino, (e.ino, "d3")).unwrap();
    assert_eq!(pair.g0.getattr(e.ino).unwrap().nlink, 3);
    let renamed = pair.g3.getattr(d.ino).unwrap();
    assert!((renamed.ctime_sec, renamed.ctime_nsec) >= (before.sec, before.nsec), "its ctime changed");
    assert_eq!(renamed.parent, e.ino);
    move_dir(&pair, (e.ino, "d3"), d.ino, (ROOT_INO, "d")).unwrap();
    assert_eq!(pair.g3.getattr(d.ino).unwrap().parent, ROOT_INO);
    assert_eq!(pair.g0.getattr(ROOT_INO).unwrap().nlink, root_links);
    assert_eq!(pair.g0.getattr(e.ino).unwrap().nlink, 2);
    settled(&pair);
}

/// A directory moved under one of its own descendants, the loop found across groups: `e`
/// (group 0) holds `d` (group 3), which holds `s`; moving `e` into `s` walks from `s` up
/// through group 3 to `e` in group 0 and is refused, every mark and placeholder undone. A
/// directory of group 0 moved into `s` is no loop; a move within group 0 under it then walks
/// across groups too.
#[test]
fn a_loop_across_groups_is_refused() {
    let pair = Pair::new();
    let (d, s, e) = tree(&pair);
    move_dir(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "d")).unwrap();
    let looped = move_dir(&pair, (ROOT_INO, "e"), e.ino, (s.ino, "e"));
    assert_eq!(kind(looped), ErrorKind::InvalidArgument);
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"e").unwrap(), Looked::Here(_)));
    assert_eq!(kind(pair.g3.lookup_entry(s.ino, b"e")), ErrorKind::NotFound);
    assert!(pair.g0.getattr(e.ino).unwrap().moving.is_empty());
    assert_eq!(pair.g0.getattr(e.ino).unwrap().parent, ROOT_INO);
    settled(&pair);
    // Into itself within its own group, across groups: refused the same way.
    assert_eq!(kind(move_dir(&pair, (e.ino, "d"), d.ino, (s.ino, "d"))), ErrorKind::InvalidArgument);
    settled(&pair);

    let f = dir(&pair.g0, ROOT_INO, "f");
    move_dir(&pair, (ROOT_INO, "f"), f.ino, (s.ino, "f")).unwrap();
    assert_eq!(pair.g0.getattr(f.ino).unwrap().parent, s.ino);
    let g = dir(&pair.g0, ROOT_INO, "g");
    // Both parents and the directory are group 0's, but `f`'s ancestry continues in group 3.
    assert_eq!(pair.g0.rename(ROOT_INO, b"g", f.ino, b"g", 0).unwrap(), Renamed::AcrossGroups);
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"g").unwrap(), Looked::Here(_)), "nothing done");
    move_dir(&pair, (ROOT_INO, "g"), g.ino, (f.ino, "g")).unwrap();
    assert_eq!(pair.g0.getattr(g.ino).unwrap().parent, f.ino);
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 3);
    // And `e` into `g`: `g` lies under `e` (through d, s, f), found across both groups.
    assert_eq!(pair.g0.rename(ROOT_INO, b"e", g.ino, b"e", 0).unwrap(), Renamed::AcrossGroups);
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "e"), e.ino, (g.ino, "e"))), ErrorKind::InvalidArgument);
    settled(&pair);
}

/// While a move is prepared (its directory marked), another move's walk through that
/// directory, across groups or within one, is told to try again; the move's own walk passes;
/// once it aborts, the mark is gone and the others go through.
#[test]
fn a_move_in_flux_stops_the_walks_through_it() {
    let pair = Pair::new();
    let (d, s, e) = tree(&pair);
    let plan = move_plan(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "d"));
    let id = prepared(&pair, &plan);
    assert_eq!(pair.g3.getattr(d.ino).unwrap().moving, id.key());
    assert_eq!(pair.g3.climb(Some(id), s.ino, e.ino).unwrap(), Climb::Root);
    assert_eq!(kind(pair.g3.climb(None, s.ino, e.ino)), ErrorKind::Unavailable);
    // Another directory moving into `s` meets the mark on its walk.
    let f = dir(&pair.g0, ROOT_INO, "f");
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "f"), f.ino, (s.ino, "f"))), ErrorKind::Unavailable);
    // A second move of `d` itself: its entry is held.
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "d"), d.ino, (f.ino, "d"))), ErrorKind::Unavailable);

    // A move within group 0 whose walk passes a directory group 0 is moving: `x` (group 0,
    // with `z` in it) marked by a move into `s`, and `y` moved into `z` locally.
    let x = dir(&pair.g0, ROOT_INO, "x");
    let z = dir(&pair.g0, x.ino, "z");
    dir(&pair.g0, ROOT_INO, "y");
    let plan = move_plan(&pair, (ROOT_INO, "x"), x.ino, (s.ino, "x"));
    let x_id = prepared(&pair, &plan);
    assert_eq!(kind(pair.g0.rename(ROOT_INO, b"y", z.ino, b"y", 0)), ErrorKind::Unavailable);
    give_up(&pair, x_id);
    assert_eq!(pair.g0.rename(ROOT_INO, b"y", z.ino, b"y", 0).unwrap(), Renamed::Done);

    give_up(&pair, id);
    assert!(pair.g3.getattr(d.ino).unwrap().moving.is_empty());
    assert_eq!(pair.g3.getattr(d.ino).unwrap().parent, ROOT_INO);
    settled(&pair);
    move_dir(&pair, (ROOT_INO, "f"), f.ino, (s.ino, "f")).unwrap();
    settled(&pair);
}

/// Two moves each fine alone that together would close a loop — `a` (group 3) into `b`
/// (group 0) and `b` into `a` — both prepared (both directories marked) before either walks,
/// in either order: each walk meets the other's mark and is told to try again; once one is
/// given up, the other goes through, and the loop is never made.
#[test]
fn two_moves_that_would_close_a_loop_cannot_both_pass() {
    for a_first in [true, false] {
        let pair = Pair::new();
        let a =
            mkdir_across(&pair.g0, &pair.peers(), &tests::new(ROOT_INO, "a", 0o755), GROUP).unwrap().inode;
        let b = dir(&pair.g0, ROOT_INO, "b");
        let a_into_b = move_plan(&pair, (ROOT_INO, "a"), a.ino, (b.ino, "a"));
        let b_into_a = move_plan(&pair, (ROOT_INO, "b"), b.ino, (a.ino, "b"));
        let mut begun = Vec::new();
        for plan in if a_first { [&a_into_b, &b_into_a] } else { [&b_into_a, &a_into_b] } {
            begun.push(prepared(&pair, plan));
        }
        let (ab, ba) = if a_first { (begun[0], begun[1]) } else { (begun[1], begun[0]) };
        // a into b walks up from b (group 0), b into a from a (group 3): each meets a mark.
        assert_eq!(kind(pair.g0.climb(Some(ab), b.ino, a.ino)), ErrorKind::Unavailable);
        assert_eq!(kind(pair.g3.climb(Some(ba), a.ino, b.ino)), ErrorKind::Unavailable);
        // b into a is given up; a into b then walks to the root and commits.
        give_up(&pair, ba);
        assert_eq!(pair.g0.climb(Some(ab), b.ino, a.ino).unwrap(), Climb::Root);
        pair.g0.change_commit(ab, 0, Vec::new(), vec![GROUP]).unwrap();
        pair.g3.txn_decide(ab, true).unwrap();
        pair.g0.txn_forget(ab).unwrap();
        assert_eq!(pair.g3.getattr(a.ino).unwrap().parent, b.ino);
        // And b into a now is the loop itself.
        assert_eq!(kind(move_dir(&pair, (ROOT_INO, "b"), b.ino, (a.ino, "b"))), ErrorKind::InvalidArgument);
        settled(&pair);
    }
}

/// A directory renamed over an empty directory replaces it (the parent's count unchanged);
/// over a directory with entries, or a file, it is refused and nothing changes.
#[test]
fn a_directory_replaces_an_empty_one_across_groups() {
    let pair = Pair::new();
    let (d, _, e) = tree(&pair);
    let full = dir(&pair.g0, e.ino, "full");
    file(&pair.g0, full.ino, "y");
    file(&pair.g0, e.ino, "plain");
    let empty = dir(&pair.g0, e.ino, "empty");
    let counted = pair.g0.getattr(e.ino).unwrap().nlink;
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "full"))), ErrorKind::NotEmpty);
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "plain"))), ErrorKind::NotDir);
    settled(&pair);
    move_dir(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "empty")).unwrap();
    assert_eq!(kind(pair.g0.getattr(empty.ino)), ErrorKind::NotFound);
    assert!(
        matches!(pair.g0.lookup_entry(e.ino, b"empty").unwrap(), Looked::Elsewhere { ino, .. } if ino == d.ino)
    );
    assert_eq!(pair.g0.getattr(e.ino).unwrap().nlink, counted);
    settled(&pair);

    // Over an empty directory of the other group (its name in group 0, the directory in group
    // 3, which removes it), and not over one with entries there.
    let other =
        mkdir_across(&pair.g0, &pair.peers(), &tests::new(ROOT_INO, "other", 0o755), GROUP).unwrap().inode;
    let busy =
        mkdir_across(&pair.g0, &pair.peers(), &tests::new(ROOT_INO, "busy", 0o755), GROUP).unwrap().inode;
    file(&pair.g3, busy.ino, "y");
    let w = dir(&pair.g0, ROOT_INO, "w");
    let root_links = pair.g0.getattr(ROOT_INO).unwrap().nlink;
    assert_eq!(kind(move_dir(&pair, (ROOT_INO, "w"), w.ino, (ROOT_INO, "busy"))), ErrorKind::NotEmpty);
    assert_eq!(pair.g3.getattr(busy.ino).unwrap().removing, Vec::<u8>::new(), "nothing left marked");
    settled(&pair);
    move_dir(&pair, (ROOT_INO, "w"), w.ino, (ROOT_INO, "other")).unwrap();
    assert_eq!(kind(pair.g3.getattr(other.ino)), ErrorKind::NotFound);
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"other").unwrap(), Looked::Here(i) if i.ino == w.ino));
    assert_eq!(pair.g0.getattr(ROOT_INO).unwrap().nlink, root_links - 1, "w's entry went, other's was taken");
    settled(&pair);

    // Over an empty directory of the coordinator's own group named in the other group: `x`
    // (group 0) moved into `b` (group 3), then `v` (group 0) renamed over it from the root.
    let b = mkdir_across(&pair.g0, &pair.peers(), &tests::new(ROOT_INO, "b", 0o755), GROUP).unwrap().inode;
    let x = dir(&pair.g0, ROOT_INO, "x");
    move_dir(&pair, (ROOT_INO, "x"), x.ino, (b.ino, "x")).unwrap();
    let v = dir(&pair.g0, ROOT_INO, "v");
    move_dir(&pair, (ROOT_INO, "v"), v.ino, (b.ino, "x")).unwrap();
    assert_eq!(kind(pair.g0.getattr(x.ino)), ErrorKind::NotFound, "the replaced directory is gone");
    assert_eq!(pair.g0.getattr(v.ino).unwrap().parent, b.ino);
    assert_eq!(pair.g3.getattr(b.ino).unwrap().nlink, 3);
    settled(&pair);
}

/// Both leaders crash after each step of a directory's move across groups; recovery finishes
/// it (committed) or undoes it (not), the mark cleared either way.
#[test]
fn a_directory_move_recovers_from_a_crash_after_any_step() {
    for step in 1..=4 {
        let mut pair = Pair::new();
        let (d, _, e) = tree(&pair);
        let plan = move_plan(&pair, (ROOT_INO, "d"), d.ino, (e.ino, "d"));
        let (id, _) = pair.g0.change_begin(of(&plan, 0), &[GROUP]).unwrap();
        if step >= 2 {
            pair.g3.txn_prepare_change(id, of(&plan, GROUP)).unwrap();
        }
        if step >= 3 {
            pair.g0.change_commit(id, 0, Vec::new(), vec![GROUP]).unwrap();
        }
        if step >= 4 {
            pair.g3.txn_decide(id, true).unwrap();
        }
        pair.crash();
        pair.recover();
        let moved = step >= 3;
        let inode = pair.g3.getattr(d.ino).unwrap();
        assert_eq!(inode.parent, if moved { e.ino } else { ROOT_INO }, "step {step}");
        assert!(inode.moving.is_empty(), "step {step}");
        assert_eq!(pair.g0.lookup_entry(e.ino, b"d").is_ok(), moved, "step {step}");
        assert_eq!(pair.g0.lookup_entry(ROOT_INO, b"d").is_ok(), !moved, "step {step}");
        assert_eq!(pair.g0.getattr(e.ino).unwrap().nlink, if moved { 3 } else { 2 }, "step {step}");
        settled(&pair);
    }
}
