//! mkdir across metadata groups (`txn.rs`): both sides, each step's effect, and recovery from a
//! crash of either side after any step.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::ids::slot_of;
use cairn_common::{ErrorKind, ROOT_INO};

use super::tests::{dir, file, kind, layout, new};
use super::txn::{self, mkdir_across, recover, Outcome, Peers, Prepare, TxnId};
use super::*;
use crate::fixture::Fixture;
use crate::groups::Groups;
use crate::schema::{S_IFREG, S_ISGID};

pub(super) const GROUP: u32 = 3;
const SLOTS: [usize; 2] = [5, 9];

/// Group 0 (the root) and group 3 (slots 5 and 9), each over its own store, reopened as a new
/// leader would after a crash.
pub(super) struct Pair {
    store0: Arc<dyn MetaStore>,
    store3: Arc<dyn MetaStore>,
    map: Arc<Groups>,
    cluster3: Arc<Cluster>,
    pub(super) g0: Fixture,
    pub(super) g3: Namespace,
}

impl Pair {
    pub(super) fn new() -> Pair {
        Pair::over(Arc::new(MemoryStore::new()))
    }

    /// A pair whose group 0 keeps its records in `store0`.
    pub(super) fn over(store0: Arc<dyn MetaStore>) -> Pair {
        let g0 = Fixture::open(store0.clone(), layout());
        super::tests::add_nodes(&g0, 3);
        let store3: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let cluster3 = Cluster::open(store3.clone(), Duration::from_secs(60), DEFAULT_CLIENT_LEASE).unwrap();
        for i in 0..3 {
            cluster3
                .registry()
                .register(&format!("n{i}"), &format!("127.0.0.1:{}", 1000 + i), vec![], 1, "")
                .unwrap();
        }
        let map = Arc::new(Groups::open(store3.clone()).unwrap());
        let mut owners = vec![0u32; crate::groups::SLOTS];
        SLOTS.iter().for_each(|s| owners[*s] = GROUP);
        let group = cairn_proto::MetaGroup { group: GROUP, replicas: vec!["1=127.0.0.1:1".into()] };
        let shared =
            cairn_proto::GroupMap { version: 2, groups: vec![group], slots: owners, ..Default::default() };
        map.adopt(shared, g0.cluster_id()).unwrap();
        let g3 = Namespace::open_slots(store3.clone(), (GROUP, map.clone()), 77, cluster3.clone()).unwrap();
        Pair { store0, store3, map, cluster3, g0, g3 }
    }

    /// Both sides lose their leaders and open again from what their logs hold.
    pub(super) fn crash(&mut self) {
        self.g0 = Fixture::open(self.store0.clone(), layout());
        self.g3 =
            Namespace::open_slots(self.store3.clone(), (GROUP, self.map.clone()), 78, self.cluster3.clone())
                .unwrap();
    }

    /// Both new leaders' recovery, group 0 first (it aborts what its predecessor left
    /// pending, then group 3 asks), twice.
    pub(super) fn recover(&self) {
        let peers = self.peers();
        for _ in 0..2 {
            recover(&self.g0, &peers, 0).unwrap();
            recover(&self.g3, &peers, 0).unwrap();
        }
    }

    pub(super) fn peers(&self) -> Direct<'_> {
        Direct { pair: self, refuse: Cell::new(false), lose_prepare: Cell::new(false) }
    }
}

/// The other side reached in process: group 0 asks group 3, group 3 asks group 0.
pub(super) struct Direct<'a> {
    pair: &'a Pair,
    /// Every call fails as an unreachable leader's would.
    pub(super) refuse: Cell<bool>,
    /// The prepare is applied, its answer lost.
    pub(super) lose_prepare: Cell<bool>,
}

impl Direct<'_> {
    fn group(&self, group: u32) -> Result<&Namespace> {
        if self.refuse.get() {
            return Err(CairnError::unavailable(format!("group {group} has no leader")));
        }
        Ok(if group == 0 { &self.pair.g0 } else { &self.pair.g3 })
    }
}

impl Peers for Direct<'_> {
    fn prepare(&self, group: u32, prepare: &Prepare) -> Result<Inode> {
        assert_eq!(group, GROUP);
        if self.refuse.get() {
            return Err(CairnError::unavailable("group 3 has no leader"));
        }
        let inode = self.pair.g3.txn_prepare(prepare)?;
        if self.lose_prepare.get() {
            // And the leader is gone for a while.
            self.refuse.set(true);
            return Err(CairnError::unavailable("the answer was lost"));
        }
        Ok(inode)
    }

    fn decide(&self, group: u32, id: TxnId, commit: bool) -> Result<()> {
        self.group(group)?.txn_decide(id, commit)
    }

    fn outcome(&self, id: TxnId) -> Result<Outcome> {
        self.group(id.group)?.txn_outcome(id)
    }

    fn prepare_change(
        &self,
        group: u32,
        id: TxnId,
        effects: &[crate::schema::TxnEffect],
    ) -> Result<Vec<crate::schema::TxnEffect>> {
        let prepared = self.group(group)?.txn_prepare_change(id, effects.to_vec())?;
        if self.lose_prepare.get() {
            self.refuse.set(true);
            return Err(CairnError::unavailable("the answer was lost"));
        }
        Ok(prepared)
    }

    fn owner(&self, ino: u64) -> u32 {
        self.pair.map.owner_of(ino).0
    }

    fn ancestry(&self, group: u32, id: TxnId, ino: u64, moved: u64) -> Result<super::Climb> {
        self.group(group)?.climb(Some(id), ino, moved)
    }
}

pub(super) fn names(ns: &Namespace, ino: u64) -> Vec<(String, u64)> {
    let (entries, _) = ns.readdir(ino, b"", 1024, false).unwrap();
    entries.into_iter().map(|e| (String::from_utf8(e.name).unwrap(), e.ino)).collect()
}

/// The whole exchange, step by step: the name is held but absent until the commit, the
/// directory is numbered in the participant's slots and kept out of sight until decided,
/// and afterwards each side holds its half and no record.
#[test]
fn a_mkdir_across_groups_lands_half_in_each() {
    let pair = Pair::new();
    let (g0, g3) = (&pair.g0, &pair.g3);
    let top = dir(g0, ROOT_INO, "top");
    let other = file(g0, ROOT_INO, "other");
    let mut asked = new(top.ino, "d", 0o2750);
    asked.mode = 0o2750;
    let prepare = g0.mkdir_begin(&asked, GROUP).unwrap();
    assert_eq!((prepare.id.group, prepare.inode.ino, prepare.inode.parent), (0, 0, top.ino));
    assert_eq!(prepare.inode.mode, S_IFDIR | S_ISGID | 0o750);

    // The placeholder: absent to lookups, listings and removals; present to whatever would
    // create the name; the parent is not empty.
    assert_eq!(kind(g0.lookup(top.ino, b"d")), ErrorKind::NotFound);
    assert!(names(g0, top.ino).is_empty());
    assert_eq!(kind(g0.mkdir(&new(top.ino, "d", 0o755))), ErrorKind::Exists);
    assert_eq!(kind(g0.create(&new(top.ino, "d", S_IFREG | 0o644), 0, false)), ErrorKind::Exists);
    assert_eq!(kind(g0.symlink(&new(top.ino, "d", 0), b"x")), ErrorKind::Exists);
    assert_eq!(kind(g0.link(other.ino, top.ino, b"d")), ErrorKind::Exists);
    assert_eq!(kind(g0.rename(ROOT_INO, b"other", top.ino, b"d", 0)), ErrorKind::Exists);
    assert_eq!(kind(g0.rename(top.ino, b"d", ROOT_INO, b"e", 0)), ErrorKind::NotFound);
    assert_eq!(kind(g0.unlink(top.ino, b"d")), ErrorKind::NotFound);
    assert_eq!(kind(g0.rmdir(top.ino, b"d")), ErrorKind::NotFound);
    assert_eq!(kind(g0.rmdir(ROOT_INO, b"top")), ErrorKind::NotEmpty);
    assert_eq!(g0.txn_outcome(prepare.id).unwrap(), Outcome::Pending);
    assert!(g0.check(false).unwrap().problems.is_empty(), "a placeholder is no problem");

    // The participant numbers it in one of its slots and keeps it in its record.
    let made = g3.txn_prepare(&prepare).unwrap();
    assert!(SLOTS.contains(&(slot_of(made.ino) as usize)), "{}", made.ino);
    assert_eq!(g3.txn_prepare(&prepare).unwrap(), made, "a prepare sent again answers the same");
    assert_eq!(kind(g3.getattr(made.ino)), ErrorKind::NotFound, "out of sight until decided");
    let slot = slot_of(made.ino);
    assert_eq!(kind(g3.release_slots(&[slot], 2)), ErrorKind::NotEmpty, "the slot holds a prepared inode");

    // The commit: the entry, the parent's link count; the mkdir has happened.
    let nlink = g0.getattr(top.ino).unwrap().nlink;
    assert_eq!(g0.txn_commit(prepare.id, &made).unwrap(), made);
    assert_eq!(g0.txn_commit(prepare.id, &made).unwrap(), made, "idempotent");
    assert_eq!(names(g0, top.ino), [("d".to_string(), made.ino)]);
    assert_eq!(g0.getattr(top.ino).unwrap().nlink, nlink + 1);
    assert_eq!(g0.txn_outcome(prepare.id).unwrap(), Outcome::Committed);
    assert!(
        g0.check(false).unwrap().remote_entries.is_empty(),
        "its other half is on its way: not matched yet"
    );
    assert_eq!(kind(g0.txn_abort(prepare.id)), ErrorKind::InvalidArgument, "committed stays committed");
    assert_eq!(kind(g0.mkdir(&new(top.ino, "d", 0o755))), ErrorKind::Exists);

    // The participant applies it; every step is idempotent.
    let before = g3.stats();
    g3.txn_decide(prepare.id, true).unwrap();
    g3.txn_decide(prepare.id, true).unwrap();
    assert_eq!(g3.getattr(made.ino).unwrap(), made);
    assert_eq!((g3.stats().directories, g3.stats().inodes), (before.directories + 1, before.inodes + 1));
    assert!(g3.txns().unwrap().is_empty());
    g0.txn_forget(prepare.id).unwrap();
    assert!(g0.txns().unwrap().is_empty());
    assert_eq!(g0.check(false).unwrap().remote_entries, [(top.ino, b"d".to_vec(), made.ino, S_IFDIR)]);
    assert_eq!(g3.check(false).unwrap().away_dirs, [(made.ino, top.ino)]);
    assert_eq!(
        g0.txn_outcome(prepare.id).unwrap(),
        Outcome::Aborted,
        "no record: not committed for anyone asking"
    );

    // The parent's group knows only its number and type; rmdir and rename of it are not
    // built yet, and say so (EXDEV: `mv` copies).
    match g0.lookup_entry(top.ino, b"d").unwrap() {
        Looked::Elsewhere { ino, kind } => assert_eq!((ino, kind), (made.ino, S_IFDIR)),
        other => panic!("{other:?}"),
    }
    assert_eq!(kind(g0.lookup(top.ino, b"d")), ErrorKind::NotFound);
    assert_eq!(kind(g0.rmdir(top.ino, b"d")), ErrorKind::CrossDevice);
    assert_eq!(kind(g0.rename(top.ino, b"d", top.ino, b"e", 0)), ErrorKind::CrossDevice);
    let emptied = dir(g0, ROOT_INO, "empty");
    assert_eq!(kind(g0.rename(ROOT_INO, b"empty", top.ino, b"d", 0)), ErrorKind::CrossDevice);
    assert_eq!(g0.getattr(emptied.ino).unwrap().parent, ROOT_INO, "nothing moved");

    // The new directory is the participant's: files go in it there, in its slot.
    let f = file(g3, made.ino, "f");
    assert_eq!(slot_of(f.ino), slot);
    assert_eq!(kind(g0.txn_outcome(TxnId { group: GROUP, seq: 1 })), ErrorKind::InvalidArgument);
}

/// A participant that refuses or cannot be reached: the name is free again at once, nothing is
/// left on either side once recovery told it, and a commit after the abort is refused.
#[test]
fn a_mkdir_across_groups_that_cannot_prepare_leaves_nothing() {
    let pair = Pair::new();
    let top = dir(&pair.g0, ROOT_INO, "top");
    let peers = pair.peers();

    // Refused: a name the participant cannot take (here: its slots promised away).
    pair.g3.release_slots(&SLOTS.map(|s| s as u32), 2).unwrap();
    let e = mkdir_across(&pair.g0, &peers, &new(top.ino, "d", 0o755), GROUP).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(pair.g0.txns().unwrap().is_empty(), "refused: told and forgotten");
    assert!(names(&pair.g0, top.ino).is_empty());
    dir(&pair.g0, top.ino, "d");
    pair.g0.rmdir(top.ino, b"d").unwrap();
    pair.map
        .adopt(cairn_proto::GroupMap { version: 3, ..pair.map.map().unwrap() }, pair.g0.cluster_id())
        .unwrap();

    // Prepared, but its answer lost, and the participant unreachable for the abort.
    peers.lose_prepare.set(true);
    let e = mkdir_across(&pair.g0, &peers, &new(top.ino, "d", 0o755), GROUP).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    peers.lose_prepare.set(false);
    peers.refuse.set(false);
    let (id, record) = pair.g0.txns().unwrap().pop().unwrap();
    assert_eq!(record.state, crate::schema::TXN_ABORTED);
    assert_eq!(
        kind(pair.g0.txn_commit(id, &pair.g3.txns().unwrap()[0].1.inode.clone().unwrap())),
        ErrorKind::Interrupted
    );
    assert!(names(&pair.g0, top.ino).is_empty(), "the name is free again at once");
    assert_eq!(pair.g3.txns().unwrap().len(), 1, "the participant still holds its prepared inode");

    // Recovery sends the abort; both sides end with nothing.
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 0);
    assert!(pair.g0.txns().unwrap().is_empty() && pair.g3.txns().unwrap().is_empty());
    for slot in SLOTS {
        assert!(!crate::groups::slot_holds_records(&*pair.store3, slot as u32).unwrap());
    }
    let made = mkdir_across(&pair.g0, &peers, &new(top.ino, "d", 0o755), GROUP).unwrap();
    assert!(made.acknowledged);
    assert_eq!(pair.g3.getattr(made.inode.ino).unwrap().parent, top.ino);
}

/// The steps of a mkdir across groups, in order, as `mkdir_across` runs them.
const STEPS: usize = 5;

fn run_steps(pair: &Pair, top: u64, steps: usize) -> Option<TxnId> {
    if steps == 0 {
        return None;
    }
    let prepare = pair.g0.mkdir_begin(&new(top, "d", 0o755), GROUP).unwrap();
    let id = prepare.id;
    let mut made = None;
    for step in 1..steps {
        match step {
            1 => made = Some(pair.g3.txn_prepare(&prepare).unwrap()),
            2 => drop(pair.g0.txn_commit(id, made.as_ref().unwrap()).unwrap()),
            3 => pair.g3.txn_decide(id, true).unwrap(),
            4 => pair.g0.txn_forget(id).unwrap(),
            _ => unreachable!(),
        }
    }
    Some(id)
}

/// Either the mkdir happened entirely (the entry in group 0, the directory in group 3, the
/// parent's link count) or not at all (the name free, nothing numbered in group 3's slots);
/// no record is left.
fn assert_all_or_nothing(pair: &Pair, top: u64, nlink_before: u32) -> bool {
    assert!(pair.g0.txns().unwrap().is_empty() && pair.g3.txns().unwrap().is_empty(), "records left");
    let entries = names(&pair.g0, top);
    let parent = pair.g0.getattr(top).unwrap();
    match entries.as_slice() {
        [] => {
            assert_eq!(parent.nlink, nlink_before);
            for slot in SLOTS {
                assert!(!crate::groups::slot_holds_records(&*pair.store3, slot as u32).unwrap());
            }
            false
        }
        [(name, ino)] if name == "d" => {
            assert_eq!(parent.nlink, nlink_before + 1);
            let inode = pair.g3.getattr(*ino).unwrap();
            assert!(inode.is_dir() && inode.parent == top, "{inode:?}");
            true
        }
        other => panic!("unexpected entries {other:?}"),
    }
}

/// Both leaders lost after each step (and the other side unreachable for a while): recovery
/// finishes every transaction one way or the other, never half.
#[test]
fn a_crash_after_any_step_ends_all_or_nothing() {
    for steps in 0..=STEPS {
        for crash_side in ["both", "coordinator", "participant"] {
            let mut pair = Pair::new();
            let top = dir(&pair.g0, ROOT_INO, "top").ino;
            let nlink = pair.g0.getattr(top).unwrap().nlink;
            run_steps(&pair, top, steps);
            match crash_side {
                "both" => pair.crash(),
                "coordinator" => pair.g0 = Fixture::open(pair.store0.clone(), layout()),
                _ => {
                    pair.g3 = Namespace::open_slots(
                        pair.store3.clone(),
                        (GROUP, pair.map.clone()),
                        79,
                        pair.cluster3.clone(),
                    )
                    .unwrap()
                }
            }
            // The other group unreachable at first: nothing is lost, records wait.
            let peers = pair.peers();
            peers.refuse.set(true);
            recover(&pair.g0, &peers, 0).unwrap();
            recover(&pair.g3, &peers, 0).unwrap();
            peers.refuse.set(false);
            // Participant first (it may ask about a pending coordinator record), then both until
            // nothing is left.
            for _ in 0..3 {
                recover(&pair.g3, &peers, 0).unwrap();
                recover(&pair.g0, &peers, 0).unwrap();
            }
            let happened = assert_all_or_nothing(&pair, top, nlink);
            assert_eq!(happened, steps >= 3, "after {steps} steps, crash of {crash_side}");
            let problems = pair.g0.check(false).unwrap().problems;
            assert!(problems.is_empty(), "the entry is counted, its inode is group 3's: {problems:?}");
            let problems = pair.g3.check(false).unwrap().problems;
            assert!(problems.is_empty(), "{problems:?}");
            // And the name can be used again either way.
            if !happened {
                drop(txn::mkdir_across(&pair.g0, &peers, &new(top, "d", 0o755), GROUP).unwrap());
            }
        }
    }
}

/// A client's try sent again while its first try's transaction is undecided is told to try
/// later, not that the name exists; another client is told it exists.
#[test]
fn a_try_sent_again_while_its_first_is_undecided_waits() {
    let pair = Pair::new();
    let top = dir(&pair.g0, ROOT_INO, "top").ino;
    once::scope(Some((7, 1)), || pair.g0.mkdir_begin(&new(top, "d", 0o755), GROUP)).unwrap();
    let again = once::scope(Some((7, 1)), || pair.g0.mkdir(&new(top, "d", 0o755)));
    assert_eq!(kind(again), ErrorKind::Unavailable);
    let other = once::scope(Some((8, 1)), || pair.g0.mkdir(&new(top, "d", 0o755)));
    assert_eq!(kind(other), ErrorKind::Exists);
}

/// rmdir of a directory group 3 holds: the entry stays visible until the commit, nothing new
/// goes into the directory meanwhile, a non-empty one is refused with nothing changed, and
/// afterwards neither side holds anything of it.
#[test]
fn an_rmdir_across_groups_removes_both_halves() {
    let pair = Pair::new();
    let peers = pair.peers();
    let top = dir(&pair.g0, ROOT_INO, "top").ino;
    let nlink = pair.g0.getattr(top).unwrap().nlink;
    let made = mkdir_across(&pair.g0, &peers, &new(top, "d", 0o755), GROUP).unwrap().inode;
    let before = pair.g3.stats();

    // Not empty: refused, the entry as it was.
    let f = file(&pair.g3, made.ino, "f");
    let e = txn::rmdir_across(&pair.g0, &peers, (top, b"d"), made.ino, GROUP).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
    assert!(pair.g0.txns().unwrap().is_empty() && pair.g3.txns().unwrap().is_empty());
    assert_eq!(names(&pair.g0, top), [("d".to_string(), made.ino)]);
    pair.g3.unlink(made.ino, b"f").unwrap();
    assert_eq!(kind(pair.g3.getattr(f.ino)), ErrorKind::NotFound);

    // Prepared, not decided: visible, closed to new entries, and a second rmdir is told it is
    // being removed (its own try sent again: to try later).
    let prepare = once::scope(Some((7, 1)), || pair.g0.rmdir_begin(top, b"d", made.ino, GROUP)).unwrap();
    pair.g3.txn_prepare(&prepare).unwrap();
    assert!(matches!(pair.g0.lookup_entry(top, b"d").unwrap(), Looked::Elsewhere { .. }));
    assert!(pair.g0.check(false).unwrap().remote_entries.is_empty(), "being removed: not matched");
    assert!(pair.g3.check(false).unwrap().away_dirs.is_empty(), "being removed: not matched");
    assert_eq!(names(&pair.g0, top).len(), 1);
    assert_eq!(kind(pair.g3.mkdir(&new(made.ino, "late", 0o755))), ErrorKind::NotFound);
    assert_eq!(kind(pair.g3.create(&new(made.ino, "late", S_IFREG | 0o644), 0, true)), ErrorKind::NotFound);
    assert_eq!(kind(pair.g0.rmdir_begin(top, b"d", made.ino, GROUP)), ErrorKind::NotFound);
    let again = once::scope(Some((7, 1)), || pair.g0.rmdir_begin(top, b"d", made.ino, GROUP));
    assert_eq!(kind(again), ErrorKind::Unavailable);
    assert_eq!(kind(pair.g0.mkdir(&new(top, "d", 0o755))), ErrorKind::Exists);

    // Decided: the entry, the parent's count and the directory are gone.
    assert_eq!(recover(&pair.g0, &peers, 0).unwrap(), 0, "aborted: nobody waits on it any more");
    assert_eq!(pair.g3.getattr(made.ino).unwrap().removing, Vec::<u8>::new(), "the mark is cleared");
    let gone = txn::rmdir_across(&pair.g0, &peers, (top, b"d"), made.ino, GROUP).unwrap();
    assert!(gone.acknowledged);
    assert!(names(&pair.g0, top).is_empty());
    assert_eq!(pair.g0.getattr(top).unwrap().nlink, nlink);
    assert_eq!(kind(pair.g3.getattr(made.ino)), ErrorKind::NotFound);
    assert_eq!(pair.g3.stats().directories, before.directories - 1);
    assert!(pair.g0.txns().unwrap().is_empty() && pair.g3.txns().unwrap().is_empty());
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
    assert!(pair.g3.check(false).unwrap().problems.is_empty());
    dir(&pair.g0, top, "d");
}

/// The steps of an rmdir across groups, crashed after each on either side, end all or nothing.
#[test]
fn an_rmdir_crashed_after_any_step_ends_all_or_nothing() {
    for steps in 0..=STEPS {
        for crash_coordinator in [true, false] {
            let mut pair = Pair::new();
            let top = dir(&pair.g0, ROOT_INO, "top").ino;
            let nlink = pair.g0.getattr(top).unwrap().nlink;
            let made = mkdir_across(&pair.g0, &pair.peers(), &new(top, "d", 0o755), GROUP).unwrap().inode;
            if steps > 0 {
                let prepare = pair.g0.rmdir_begin(top, b"d", made.ino, GROUP).unwrap();
                let mut prepared = None;
                for step in 1..steps {
                    match step {
                        1 => prepared = Some(pair.g3.txn_prepare(&prepare).unwrap()),
                        2 => drop(pair.g0.txn_commit(prepare.id, prepared.as_ref().unwrap()).unwrap()),
                        3 => pair.g3.txn_decide(prepare.id, true).unwrap(),
                        4 => pair.g0.txn_forget(prepare.id).unwrap(),
                        _ => unreachable!(),
                    }
                }
            }
            if crash_coordinator {
                pair.g0 = Fixture::open(pair.store0.clone(), layout());
            } else {
                pair.crash();
            }
            let peers = pair.peers();
            for _ in 0..3 {
                recover(&pair.g3, &peers, 0).unwrap();
                recover(&pair.g0, &peers, 0).unwrap();
            }
            let kept = assert_all_or_nothing(&pair, top, nlink);
            assert_eq!(kept, steps < 3, "after {steps} steps");
            if kept {
                assert!(pair.g3.getattr(made.ino).unwrap().removing.is_empty(), "the mark is cleared");
            } else {
                assert_eq!(kind(pair.g3.getattr(made.ino)), ErrorKind::NotFound);
            }
            assert!(pair.g0.check(false).unwrap().problems.is_empty());
            assert!(pair.g3.check(false).unwrap().problems.is_empty());
        }
    }
}

/// Recovery leaves alone what this leadership is still preparing, and aborts at once what an
/// earlier one left pending; listings skip placeholders without ever handing back an empty
/// page while entries follow.
#[test]
fn recovery_spares_live_transactions_and_listings_skip_placeholders() {
    let mut pair = Pair::new();
    let top = dir(&pair.g0, ROOT_INO, "top").ino;
    let peers = pair.peers();
    let live = pair.g0.mkdir_begin(&new(top, "live", 0o755), GROUP).unwrap();
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 1, "still being prepared");
    assert_eq!(pair.g0.txn_outcome(live.id).unwrap(), Outcome::Pending);
    let made = pair.g3.txn_prepare(&live).unwrap();
    pair.g0.txn_commit(live.id, &made).unwrap();
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 0, "its decision delivered");
    assert_eq!(pair.g3.getattr(made.ino).unwrap().ino, made.ino);

    for name in ["a", "b", "c"] {
        pair.g0.mkdir_begin(&new(top, name, 0o755), GROUP).unwrap();
    }
    dir(&pair.g0, top, "z");
    let mut listed = Vec::new();
    let mut after = Vec::new();
    loop {
        let (page, more) = pair.g0.readdir(top, &after, 1, false).unwrap();
        assert!(!page.is_empty() || !more, "an empty page while more follow");
        listed.extend(page.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()));
        match page.last() {
            Some(last) if more => after = last.name.clone(),
            _ => break,
        }
    }
    assert_eq!(listed, ["live", "z"]);
    pair.g0 = Fixture::open(pair.store0.clone(), layout());
    let peers = pair.peers();
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 0, "an earlier leadership's: aborted at once");
    assert_eq!(names(&pair.g0, top).len(), 2);
}

/// A coordinator that lost its leader while the other group is down gives every name back at
/// once; the decisions wait for the other group.
#[test]
fn names_come_back_while_the_other_group_is_down() {
    let mut pair = Pair::new();
    let top = dir(&pair.g0, ROOT_INO, "top").ino;
    for name in ["a", "b"] {
        pair.g0.mkdir_begin(&new(top, name, 0o755), GROUP).unwrap();
    }
    pair.g0 = Fixture::open(pair.store0.clone(), layout());
    let peers = pair.peers();
    peers.refuse.set(true);
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 2, "told nobody yet");
    dir(&pair.g0, top, "a");
    dir(&pair.g0, top, "b");
    peers.refuse.set(false);
    assert_eq!(recover(&pair.g0, &peers, 60).unwrap(), 0);
}
