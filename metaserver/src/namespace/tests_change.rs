//! Unlink, link and rename of files across metadata groups (`txn/change.rs`): what each group
//! holds after each, what is refused with nothing changed, and recovery from a crash of both
//! sides after each step.

use cairn_common::{ErrorKind, ROOT_INO};

use super::tests::{dir, file, kind, new};
use super::tests_txn::{names, Pair, GROUP};
use super::txn::{self, change_across, mkdir_across, recover, Changed, Peers};
use super::*;
use crate::schema::{TxnEffect, S_IFREG};

/// A directory `d` in group 3 under the root, and a file `f` of group 0 in the root.
fn setup(pair: &Pair) -> (u64, Inode) {
    let d = mkdir_across(&pair.g0, &pair.peers(), &new(ROOT_INO, "d", 0o755), GROUP).unwrap().inode.ino;
    let f = file(&pair.g0, ROOT_INO, "f");
    (d, f)
}

fn owner(pair: &Pair, ino: u64) -> u32 {
    pair.peers().owner(ino)
}

/// rename of `(parent, name)`, naming `ino` (a file), to `(to, to_name)`, as the service plans
/// it; coordinated by the source directory's group.
fn rename_plan(
    pair: &Pair,
    (parent, name): (u64, &str),
    ino: u64,
    (to, to_name): (u64, &str),
) -> Vec<(u32, TxnEffect)> {
    vec![
        (owner(pair, parent), txn::unname(parent, name.as_bytes(), ino)),
        (owner(pair, to), txn::name(to, to_name.as_bytes(), ino, S_IFREG, true, None)),
        (owner(pair, ino), txn::relink(ino, 0, (parent, to), None)),
    ]
}

/// A change across groups as the service runs it: the coordinator's record forgotten after the
/// answer once every participant took the decision.
fn across(ns: &Namespace, peers: &dyn Peers, plan: Vec<(u32, TxnEffect)>) -> Result<Changed> {
    let changed = change_across(ns, peers, plan)?;
    if let Changed::Done { acknowledged: true, id, .. } = &changed {
        ns.txn_forget(*id)?;
    }
    Ok(changed)
}

/// link of `ino` (a file of group 0) as `(dir, name)` in a directory of group 3, as the
/// service plans it: coordinated by the directory's group.
fn link_plan(ino: u64, (dir, name): (u64, &str)) -> Vec<(u32, TxnEffect)> {
    vec![
        (GROUP, txn::name(dir, name.as_bytes(), ino, 0, false, None)),
        (0, txn::relink(ino, 1, (0, dir), None)),
    ]
}

/// The effects of `plan` that `group` takes.
fn of(plan: &[(u32, TxnEffect)], group: u32) -> Vec<TxnEffect> {
    plan.iter().filter(|(g, _)| *g == group).map(|(_, e)| e.clone()).collect()
}

fn side(pair: &Pair, group: u32) -> &Namespace {
    if group == 0 {
        &pair.g0
    } else {
        &pair.g3
    }
}

fn rename(pair: &Pair, from: (u64, &str), ino: u64, to: (u64, &str)) -> Result<Changed> {
    let coordinator = side(pair, owner(pair, from.0));
    across(coordinator, &pair.peers(), rename_plan(pair, from, ino, to))
}

fn no_txns(pair: &Pair) {
    assert!(pair.g0.txns().unwrap().is_empty(), "group 0 holds {:?}", pair.g0.txns().unwrap());
    assert!(pair.g3.txns().unwrap().is_empty(), "group 3 holds {:?}", pair.g3.txns().unwrap());
}

/// A file renamed into another group's directory keeps its inode (and number) where it was
/// made; renamed back, it is an ordinary entry again. Each step leaves no record behind.
#[test]
fn a_file_renamed_across_groups_keeps_its_inode() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    let changed = rename(&pair, (ROOT_INO, "f"), f.ino, (d, "g")).unwrap();
    assert!(matches!(changed, Changed::Done { acknowledged: true, .. }), "{changed:?}");
    no_txns(&pair);
    assert_eq!(kind(pair.g0.lookup_entry(ROOT_INO, b"f")), ErrorKind::NotFound);
    match pair.g3.lookup_entry(d, b"g").unwrap() {
        Looked::Elsewhere { ino, kind } => assert_eq!((ino, kind), (f.ino, S_IFREG)),
        other => panic!("{other:?}"),
    }
    let moved = pair.g0.getattr(f.ino).unwrap();
    assert_eq!((moved.nlink, moved.parent), (1, d), "its one name is in d now");
    assert!((moved.ctime_sec, moved.ctime_nsec) >= (f.ctime_sec, f.ctime_nsec));

    // Back, coordinated by group 3 this time: group 0 takes the name and the inode's part.
    rename(&pair, (d, "g"), f.ino, (ROOT_INO, "h")).unwrap();
    no_txns(&pair);
    assert!(names(&pair.g3, d).is_empty());
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"h").unwrap(), Looked::Here(i) if i.ino == f.ino));
    assert_eq!(pair.g0.getattr(f.ino).unwrap().parent, ROOT_INO);
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
}

/// A link into another group's directory counts where the file is (at once: the file cannot
/// go while its new name is undecided); unlinking that name there takes the count back, and
/// the last one frees the file.
#[test]
fn links_across_groups_count_where_the_file_is() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    let before = pair.g0.stats();
    let link = link_plan(f.ino, (d, "l"));
    match across(&pair.g3, &pair.peers(), link).unwrap() {
        Changed::Done { relinked, .. } => assert_eq!(relinked[0].nlink, 2),
        other => panic!("{other:?}"),
    }
    no_txns(&pair);
    assert!(
        matches!(pair.g3.lookup_entry(d, b"l").unwrap(), Looked::Elsewhere { ino, kind: S_IFREG } if ino == f.ino)
    );
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 2);

    // A link onto a name that exists: refused, nothing changed anywhere.
    let taken = link_plan(f.ino, (d, "l"));
    assert_eq!(kind(across(&pair.g3, &pair.peers(), taken)), ErrorKind::Exists);
    no_txns(&pair);
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 2);

    pair.g0.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 1, "its name in group 3 keeps it");
    let unlink = vec![(GROUP, txn::unname(d, b"l", f.ino)), (0, txn::relink(f.ino, -1, (d, 0), None))];
    across(&pair.g3, &pair.peers(), unlink).unwrap();
    no_txns(&pair);
    assert!(names(&pair.g3, d).is_empty());
    assert_eq!(kind(pair.g0.getattr(f.ino)), ErrorKind::NotFound, "its last name went");
    assert_eq!(pair.g0.stats().inodes, before.inodes - 1);
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
    assert!(pair.g3.check(false).unwrap().problems.is_empty());
}

/// A rename over a file: one of the destination's group goes there in the same entry, one of
/// another group loses its link in its own group; `RENAME_NOREPLACE`, a directory in the way
/// and a sticky owner's check refuse with nothing changed; two names of one file do nothing.
#[test]
fn a_rename_across_groups_replaces_files_wherever_they_are() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    // A file of group 3 in d, replaced: freed in group 3.
    let x = file(&pair.g3, d, "x");
    rename(&pair, (ROOT_INO, "f"), f.ino, (d, "x")).unwrap();
    no_txns(&pair);
    assert_eq!(kind(pair.g3.getattr(x.ino)), ErrorKind::NotFound);
    assert!(matches!(pair.g3.lookup_entry(d, b"x").unwrap(), Looked::Elsewhere { ino, .. } if ino == f.ino));

    // A file of group 0 named in d, replaced by another: it loses that link in group 0.
    let y = file(&pair.g0, ROOT_INO, "y");
    let link = link_plan(y.ino, (d, "y"));
    across(&pair.g3, &pair.peers(), link).unwrap();
    let z = file(&pair.g0, ROOT_INO, "z");
    rename(&pair, (ROOT_INO, "z"), z.ino, (d, "y")).unwrap();
    no_txns(&pair);
    let y_now = pair.g0.getattr(y.ino).unwrap();
    assert_eq!((y_now.nlink, y_now.parent), (1, ROOT_INO));
    assert!(matches!(pair.g3.lookup_entry(d, b"y").unwrap(), Looked::Elsewhere { ino, .. } if ino == z.ino));

    // Refused, nothing changed: NOREPLACE over a name, a directory in the way, an owner the
    // sticky rule asks that the file does not have.
    let w = file(&pair.g0, ROOT_INO, "w");
    let mut plan = rename_plan(&pair, (ROOT_INO, "w"), w.ino, (d, "y"));
    plan[1].1.replace = false;
    assert_eq!(kind(across(&pair.g0, &pair.peers(), plan)), ErrorKind::Exists);
    dir(&pair.g3, d, "sub");
    assert_eq!(kind(rename(&pair, (ROOT_INO, "w"), w.ino, (d, "sub"))), ErrorKind::IsDir);
    let mut plan = rename_plan(&pair, (d, "y"), z.ino, (ROOT_INO, "v"));
    plan[2].1 = txn::relink(z.ino, 0, (d, ROOT_INO), Some(4242));
    assert_eq!(kind(across(&pair.g3, &pair.peers(), plan)), ErrorKind::NotPermitted);
    no_txns(&pair);
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"w").unwrap(), Looked::Here(_)));
    assert!(matches!(pair.g3.lookup_entry(d, b"y").unwrap(), Looked::Elsewhere { ino, .. } if ino == z.ino));
    assert_eq!(kind(pair.g0.lookup_entry(ROOT_INO, b"v")), ErrorKind::NotFound);

    // y's other name is in the root: a rename of it onto d/y... names z, not y; onto the same
    // file's other name does nothing.
    let link = link_plan(w.ino, (d, "w2"));
    across(&pair.g3, &pair.peers(), link).unwrap();
    let same = rename(&pair, (ROOT_INO, "w"), w.ino, (d, "w2")).unwrap();
    assert!(matches!(same, Changed::Nothing), "{same:?}");
    no_txns(&pair);
    assert_eq!(pair.g0.getattr(w.ino).unwrap().nlink, 2);
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"w").unwrap(), Looked::Here(_)));
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
    assert!(pair.g3.check(false).unwrap().problems.is_empty());
}

/// While a change is prepared, its entries are held: the name it takes away is still there
/// but no other change may take it, the name it makes is absent but taken; a try of the same
/// change sent again is told to try later.
#[test]
fn a_change_holds_its_names_until_decided() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    let plan = rename_plan(&pair, (ROOT_INO, "f"), f.ino, (d, "g"));
    let (own, theirs) = (of(&plan, 0), of(&plan, GROUP));
    let (id, _) = once::scope(Some((9, 1)), || pair.g0.change_begin(own.clone(), &[GROUP])).unwrap();
    pair.g3.txn_prepare_change(id, theirs.clone()).unwrap();
    assert!(matches!(pair.g0.lookup_entry(ROOT_INO, b"f").unwrap(), Looked::Here(_)));
    assert_eq!(kind(pair.g0.unlink(ROOT_INO, b"f")), ErrorKind::Unavailable);
    assert_eq!(kind(pair.g0.rename(ROOT_INO, b"f", ROOT_INO, b"f2", 0)), ErrorKind::Unavailable);
    // Onto itself: nothing to do, held or not; with RENAME_NOREPLACE the name exists.
    pair.g0.rename(ROOT_INO, b"f", ROOT_INO, b"f", 0).unwrap();
    assert_eq!(kind(pair.g0.rename(ROOT_INO, b"f", ROOT_INO, b"f", RENAME_NOREPLACE)), ErrorKind::Exists);
    let again = once::scope(Some((9, 1)), || pair.g0.change_begin(own.clone(), &[GROUP]));
    assert_eq!(kind(again), ErrorKind::Unavailable);
    assert_eq!(kind(pair.g3.lookup_entry(d, b"g")), ErrorKind::NotFound);
    assert_eq!(kind(pair.g3.create(&new(d, "g", S_IFREG | 0o644), 0, true)), ErrorKind::Exists);
    // Another change naming it meanwhile is told to try again (the name is free if this one
    // aborts).
    let (other, _) = pair.g0.change_begin(vec![txn::unname(ROOT_INO, b"d", d)], &[GROUP]).unwrap();
    let taken = pair.g3.txn_prepare_change(other, vec![txn::name(d, b"g", d, S_IFREG, true, None)]);
    assert_eq!(kind(taken), ErrorKind::Unavailable);
    pair.g0.change_abort(other, &[]).unwrap();
    pair.g0.txn_forget(other).unwrap();
    // A prepare sent again answers the same.
    assert_eq!(pair.g3.txn_prepare_change(id, theirs).unwrap()[0].replaced, 0);

    pair.g0.change_commit(id, 0, Vec::new(), vec![GROUP]).unwrap();
    assert!(pair.g0.txn_forget(id).is_ok());
    assert_eq!(kind(pair.g0.lookup_entry(ROOT_INO, b"f")), ErrorKind::NotFound);
    pair.g3.txn_decide(id, true).unwrap();
    assert!(matches!(pair.g3.lookup_entry(d, b"g").unwrap(), Looked::Elsewhere { .. }));
    no_txns(&pair);
}

/// Both leaders crash after each step of a rename across groups; the new leaders' recovery
/// either finishes it (committed) or undoes it everywhere (not), and nothing is left held.
#[test]
fn a_change_recovers_from_a_crash_after_any_step() {
    for step in 1..=4 {
        let mut pair = Pair::new();
        let (d, f) = setup(&pair);
        let plan = rename_plan(&pair, (ROOT_INO, "f"), f.ino, (d, "g"));
        let (own, theirs) = (of(&plan, 0), of(&plan, GROUP));
        let (id, _) = pair.g0.change_begin(own, &[GROUP]).unwrap();
        if step >= 2 {
            pair.g3.txn_prepare_change(id, theirs).unwrap();
        }
        if step >= 3 {
            pair.g0.change_commit(id, 0, Vec::new(), vec![GROUP]).unwrap();
        }
        if step >= 4 {
            pair.g3.txn_decide(id, true).unwrap();
        }
        pair.crash();
        pair.recover();
        no_txns(&pair);
        let moved = step >= 3;
        assert_eq!(pair.g0.lookup_entry(ROOT_INO, b"f").is_ok(), !moved, "step {step}");
        assert_eq!(pair.g3.lookup_entry(d, b"g").is_ok(), moved, "step {step}");
        assert_eq!(pair.g0.getattr(f.ino).unwrap().parent, if moved { d } else { ROOT_INO }, "step {step}");
        assert!(pair.g0.check(false).unwrap().problems.is_empty(), "step {step}");
        assert!(pair.g3.check(false).unwrap().problems.is_empty(), "step {step}");
    }
}

/// A link whose prepare answer is lost: the coordinator aborts at once, and the participant,
/// which raised the link count, takes it back once it asks how the change ended.
#[test]
fn a_lost_prepare_of_a_link_gives_the_count_back() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    let peers = pair.peers();
    peers.lose_prepare.set(true);
    let link = link_plan(f.ino, (d, "l"));
    assert_eq!(kind(across(&pair.g3, &peers, link)), ErrorKind::Unavailable);
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 2, "raised at prepare, not decided");
    assert_eq!(kind(pair.g3.lookup_entry(d, b"l")), ErrorKind::NotFound);
    let peers = pair.peers();
    for _ in 0..2 {
        recover(&pair.g3, &peers, 0).unwrap();
        recover(&pair.g0, &peers, 0).unwrap();
    }
    no_txns(&pair);
    assert_eq!(pair.g0.getattr(f.ino).unwrap().nlink, 1);
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
}

/// The client's once-record goes with the coordinator's commit (so a try sent again after it
/// is answered from it), not with the begin nor with a change that aborted.
#[test]
fn a_change_records_its_client_try_with_its_commit() {
    let pair = Pair::new();
    let (d, f) = setup(&pair);
    let plan = rename_plan(&pair, (ROOT_INO, "f"), f.ino, (d, "g"));
    let own = of(&plan, 0);
    let (id, _) = once::scope(Some((5, 1)), || pair.g0.change_begin(own, &[GROUP])).unwrap();
    assert!(!pair.g0.once_done(5, 1).unwrap(), "begun, not done");
    pair.g0.change_abort(id, &[]).unwrap();
    pair.g0.txn_forget(id).unwrap();
    let refused = once::scope(Some((5, 2)), || rename(&pair, (ROOT_INO, "nothing"), f.ino, (d, "g")));
    assert_eq!(kind(refused), ErrorKind::NotFound);
    assert!(!pair.g0.once_done(5, 2).unwrap());
    once::scope(Some((5, 3)), || rename(&pair, (ROOT_INO, "f"), f.ino, (d, "g"))).unwrap();
    assert!(pair.g0.once_done(5, 3).unwrap(), "recorded with the commit");
    assert!(!pair.g3.once_done(5, 3).unwrap(), "a participant records none");
}

/// A participant asked before the coordinator's record reached the log (the first prepare
/// overlaps that commit) that asks how the change ended meanwhile hears "pending", not the
/// "aborted" an unknown id answers; once the record settles, the record answers.
#[test]
fn a_record_on_its_way_to_the_log_is_pending() {
    let pair = Pair::new();
    let id = txn::TxnId { group: 0, seq: 1 << 40 };
    assert_eq!(pair.g0.txn_outcome(id).unwrap(), txn::Outcome::Aborted, "no record");
    let on_its_way = pair.g0.unsettled(id);
    let other = pair.g0.unsettled(txn::TxnId { group: 0, seq: 7 });
    assert_eq!(pair.g0.txn_outcome(id).unwrap(), txn::Outcome::Pending);
    drop(on_its_way);
    assert_eq!(pair.g0.txn_outcome(id).unwrap(), txn::Outcome::Aborted, "never written");
    drop(other);
}

/// A store whose outermost change, once armed, fails to close (what it wrote stays), as a
/// replicated store's does when its leader is lost with the change's proposal in flight.
#[derive(Default)]
struct LosesLeader {
    inner: MemoryStore,
    depth: AtomicUsize,
    armed: std::sync::atomic::AtomicBool,
}

impl MetaStore for LosesLeader {
    fn with_view(&self, f: &mut dyn FnMut(&dyn crate::store::StoreView) -> Result<()>) -> Result<()> {
        self.inner.with_view(f)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(cf, key)
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(cf, start, end, limit)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.inner.write(batch)
    }

    fn begin_change(&self) {
        self.depth.fetch_add(1, Ordering::SeqCst);
    }

    fn end_change(&self) -> Result<()> {
        if self.depth.fetch_sub(1, Ordering::SeqCst) == 1 && self.armed.swap(false, Ordering::SeqCst) {
            return Err(CairnError::new(ErrorKind::NotLeader, "the leader was lost"));
        }
        Ok(())
    }

    fn abandon_change(&self) {
        self.depth.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Direct peers that count the prepares of changes sent.
struct Counted<'a> {
    inner: super::tests_txn::Direct<'a>,
    prepares: std::cell::Cell<u32>,
}

impl Peers for Counted<'_> {
    fn prepare(&self, group: u32, prepare: &txn::Prepare) -> Result<Inode> {
        self.inner.prepare(group, prepare)
    }

    fn decide(&self, group: u32, id: txn::TxnId, commit: bool) -> Result<()> {
        self.inner.decide(group, id, commit)
    }

    fn outcome(&self, id: txn::TxnId) -> Result<txn::Outcome> {
        self.inner.outcome(id)
    }

    fn prepare_change(&self, group: u32, id: txn::TxnId, effects: &[TxnEffect]) -> Result<Vec<TxnEffect>> {
        self.prepares.set(self.prepares.get() + 1);
        self.inner.prepare_change(group, id, effects)
    }

    fn owner(&self, ino: u64) -> u32 {
        self.inner.owner(ino)
    }

    fn ancestry(&self, group: u32, id: txn::TxnId, ino: u64, moved: u64) -> Result<Climb> {
        self.inner.ancestry(group, id, ino, moved)
    }
}

/// The coordinator's record not known committed when the first participant answered (its
/// leader lost meanwhile): the participant, asked before the wait, is told to abort at once,
/// the client hears `Unavailable`, and the next leader aborts the record; then the rename goes
/// through. A begin refused while the leader is lost answers the loss, not the refusal read
/// from what may not have committed.
#[test]
fn a_record_not_known_committed_aborts_the_first_participant() {
    let store0 = Arc::new(LosesLeader::default());
    let mut pair = Pair::over(store0.clone());
    let (d, f) = setup(&pair);
    let peers = Counted { inner: pair.peers(), prepares: std::cell::Cell::new(0) };
    store0.armed.store(true, Ordering::SeqCst);
    let refused = across(&pair.g0, &peers, rename_plan(&pair, (ROOT_INO, "nothing"), f.ino, (d, "g")));
    assert_eq!(kind(refused), ErrorKind::NotLeader);
    assert_eq!(peers.prepares.get(), 0, "nobody asked");
    store0.armed.store(true, Ordering::SeqCst);
    let lost = across(&pair.g0, &peers, rename_plan(&pair, (ROOT_INO, "f"), f.ino, (d, "g")));
    assert_eq!(kind(lost), ErrorKind::Unavailable);
    assert_eq!(peers.prepares.get(), 1, "the first participant was asked before the wait");
    assert!(pair.g3.txns().unwrap().is_empty(), "the participant was told to abort");
    assert!(names(&pair.g3, d).is_empty(), "no placeholder left");
    pair.crash();
    let peers = pair.peers();
    recover(&pair.g0, &peers, 0).unwrap();
    no_txns(&pair);
    rename(&pair, (ROOT_INO, "f"), f.ino, (d, "g")).unwrap();
    assert_eq!(names(&pair.g3, d), vec![("g".to_string(), f.ino)]);
    assert!(pair.g0.check(false).unwrap().problems.is_empty());
}
