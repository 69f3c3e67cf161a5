//! Who sends what in a transaction across groups, and recovery: the steps of
//! [`super`] run in order by the coordinator ([`mkdir_across`], [`rmdir_across`]), and the
//! pass every leadership runs over what its predecessors left unfinished ([`recover`]).

use cairn_common::{CairnError, ErrorKind, Result};

use super::{Outcome, Prepare, TxnId};
use crate::namespace::{Climb, Namespace, NewEntry};
use crate::schema::{
    Inode, TxnEffect, TxnRecord, EFFECT_NAME, EFFECT_REPARENT, TXN_CHANGE, TXN_COMMITTED, TXN_COORDINATOR,
    TXN_PARTICIPANT, TXN_PENDING,
};
use crate::store::Change;

/// The other groups' leaders, as one side of a transaction reaches them (the service's over
/// gRPC, `service/txn.rs`; tests' in process). Each call may fail or time out: the caller
/// keeps its record and asks again.
pub trait Peers {
    /// `TxnPrepare` to `group`'s leader: the directory it numbered.
    fn prepare(&self, group: u32, prepare: &Prepare) -> Result<Inode>;
    /// `TxnDecide` to `group`'s leader.
    fn decide(&self, group: u32, id: TxnId, commit: bool) -> Result<()>;
    /// `TxnOutcome` to the leader of the group that leads `id`.
    fn outcome(&self, id: TxnId) -> Result<Outcome>;
    /// `TxnPrepare` of a change to `group`'s leader: its effects as prepared.
    fn prepare_change(&self, group: u32, id: TxnId, effects: &[TxnEffect]) -> Result<Vec<TxnEffect>>;
    /// The group holding inode `ino`, as the map says.
    fn owner(&self, ino: u64) -> u32;
    /// `TxnAncestry` to `group`'s leader: its part of the walk up from directory `ino` looking
    /// for `moved` ([`Namespace::climb`]).
    fn ancestry(&self, group: u32, id: TxnId, ino: u64, moved: u64) -> Result<Climb>;
}

/// What a change across groups did.
#[derive(Debug)]
pub enum Changed {
    /// It happened; the inodes whose link counts it changed, as their groups answered, and
    /// whether every participant took the commit before the answer. Once they did, the
    /// coordinator's record is left for the caller to forget after answering
    /// ([`Namespace::txn_forget`] of `id`; recovery forgets it otherwise).
    Done { relinked: Vec<Inode>, acknowledged: bool, id: TxnId },
    /// Nothing to do: a rename onto another name of the same file.
    Nothing,
}

/// A change across groups of `effects`, each with the group that takes it (`ns`'s own among
/// them), coordinated by `ns`: its own effects begun, then the group of a new name asked
/// first (it says what the name replaces; a file replaced in a third group adds that group),
/// then every other group, then the commit and the decisions.
pub fn change_across(ns: &Namespace, peers: &dyn Peers, effects: Vec<(u32, TxnEffect)>) -> Result<Changed> {
    let own_group = ns.group();
    // A directory moving to another parent: the loop check, once every group prepared.
    let walk =
        effects.iter().find(|(_, e)| e.kind == EFFECT_REPARENT && e.from != e.to).map(|(_, e)| (e.ino, e.to));
    let mut own = Vec::new();
    let mut others: Vec<(u32, Vec<TxnEffect>)> = Vec::new();
    for (group, effect) in effects {
        if group == own_group {
            own.push(effect);
        } else {
            add_to(&mut others, group, effect);
        }
    }
    // The group making a name goes first.
    others.sort_by_key(|(_, effects)| !effects.iter().any(|e| e.kind == EFFECT_NAME));
    let planned: Vec<u32> = others.iter().map(|(g, _)| *g).collect();
    // The first participant is asked while this group's record is on its way to the log, one
    // commit's wait less, unless this group makes the name: then what it replaces decides what
    // the others are asked, and the record comes first. A participant that asks how it ended
    // meanwhile hears "pending" (`unsettled`); a record not known committed when the wait ends
    // is never committed by this leadership, so the participant is told to abort.
    let overlap = !others.is_empty() && !own.iter().any(|e| e.kind == EFFECT_NAME);
    let change = Change::open(&**ns.store());
    let (id, own) = match ns.change_begin(own, &planned) {
        Ok(begun) => begun,
        // A refusal read from another change's proposed state holds only once that commits.
        Err(e) => {
            change.close()?;
            return Err(match e.kind() {
                // An entry replaced since the request looked it up: the client tries again.
                ErrorKind::Interrupted => CairnError::unavailable(e.message().to_string()),
                _ => e,
            });
        }
    };
    let unsettled = ns.unsettled(id);
    let first = overlap.then(|| {
        crash_point("change-begun");
        let answer = peers.prepare_change(others[0].0, id, &others[0].1);
        crash_point("change-asked");
        answer
    });
    let settled = change.close();
    drop(unsettled);
    if let Err(e) = settled {
        if overlap {
            tell_groups(peers, id, &planned[..1], false);
        }
        return Err(CairnError::unavailable(format!("transaction {id} could not be begun: try again ({e})")));
    }
    let mut more = Vec::new();
    if let Some(named) = own.iter().find(|e| e.kind == EFFECT_NAME) {
        if named.replaced == named.ino {
            return nothing(ns, peers, id, &[]);
        }
        replaced_elsewhere(ns, peers, named, &mut others, &mut more);
    }
    if !overlap {
        crash_point("change-begun");
    }
    let mut asked = Vec::new();
    let mut relinked = Vec::new();
    let mut named_kind = 0;
    let mut next = 0;
    let mut first = first;
    while next < others.len() {
        let (group, effects) = others[next].clone();
        next += 1;
        asked.push(group);
        let answer = match first.take() {
            Some(answer) => answer,
            None => peers.prepare_change(group, id, &effects),
        };
        let prepared = match answer {
            Ok(prepared) => prepared,
            Err(e) => return Err(abort_change(ns, peers, id, &asked, answer_of(e))),
        };
        for e in &prepared {
            if e.kind == EFFECT_NAME {
                if e.replaced == e.ino {
                    return nothing(ns, peers, id, &asked);
                }
                replaced_elsewhere(ns, peers, e, &mut others, &mut more);
            }
            if let Some(inode) = &e.inode {
                if e.delta > 0 {
                    named_kind = inode.kind();
                }
                relinked.push(inode.clone());
            }
        }
    }
    if let Some((moved, to)) = walk {
        if let Err(e) = climb_across(ns, peers, id, to, moved) {
            return Err(abort_change(ns, peers, id, &asked, e));
        }
    }
    crash_point("change-prepared");
    if let Err(e) = ns.change_commit(id, named_kind, more, asked.clone()) {
        // Its entry landed though its answer did not: the change happened.
        let committed = matches!(ns.txn_record(id), Ok(Some(TxnRecord { state: TXN_COMMITTED, .. })));
        if !committed {
            // Aborted (and maybe forgotten) under it by recovery: the client may try again.
            let e = match e.kind() {
                ErrorKind::NotFound | ErrorKind::Interrupted => CairnError::unavailable(format!(
                    "transaction {id} was given up while it was being committed: try again ({e})"
                )),
                _ => e,
            };
            return Err(abort_change(ns, peers, id, &asked, e));
        }
    }
    crash_point("change-committed");
    // The answer waits for every participant to take the decision (the caller's next request
    // there finds the change), not for the record's deletion: one write less on its path.
    let acknowledged = (0..3).any(|attempt| {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        tell_groups(peers, id, &asked, true).is_empty()
    });
    Ok(Changed::Done { relinked, acknowledged, id })
}

/// The loop check of change `id`, moving directory `moved` under `to`: the walk up from `to`,
/// each group walking the part of the ancestry it holds, must reach the root without meeting
/// `moved` (`InvalidArgument` where it does). Run once every mark is in place.
fn climb_across(ns: &Namespace, peers: &dyn Peers, id: TxnId, to: u64, moved: u64) -> Result<()> {
    let mut cur = to;
    for _ in 0..crate::namespace::MAX_DEPTH {
        let group = peers.owner(cur);
        let climbed = if group == ns.group() {
            ns.climb(Some(id), cur, moved)
        } else {
            peers.ancestry(group, id, cur, moved).map_err(answer_of)
        };
        // A directory on the way removed or moved meanwhile: the walk is tried again.
        let climbed = climbed.map_err(|e| match e.kind() {
            ErrorKind::NotFound => {
                CairnError::unavailable(format!("the loop check met a change: try again ({e})"))
            }
            _ => e,
        });
        match climbed? {
            Climb::Found => return Err(CairnError::invalid("rename: cannot move a directory into itself")),
            Climb::Root => return Ok(()),
            Climb::Leaves(next) if next != cur => cur = next,
            Climb::Leaves(_) => {
                return Err(CairnError::unavailable(format!(
                    "metadata group {group} does not hold directory {cur}, which the map gives it: try again"
                )))
            }
        }
    }
    Err(CairnError::corrupt(format!(
        "directory {to} is more than {} levels deep",
        crate::namespace::MAX_DEPTH
    )))
}

fn add_to(others: &mut Vec<(u32, Vec<TxnEffect>)>, group: u32, effect: TxnEffect) {
    match others.iter_mut().find(|(g, _)| *g == group) {
        Some((_, effects)) => effects.push(effect),
        None => others.push((group, vec![effect])),
    }
}

/// A name prepared as `named` replaces a file or directory its group does not hold: that
/// file loses a link, that (empty) directory goes, in its own group (this one's: `more`,
/// checked at the commit), with the sticky rule's owner where the name's group asked it.
fn replaced_elsewhere(
    ns: &Namespace,
    peers: &dyn Peers,
    named: &TxnEffect,
    others: &mut Vec<(u32, Vec<TxnEffect>)>,
    more: &mut Vec<TxnEffect>,
) {
    let replaced = named.replaced;
    if replaced == 0 || peers.owner(replaced) == peers.owner(named.parent) {
        return;
    }
    let owner = named.replaced_owner_checked.then_some(named.replaced_owner);
    // A directory replaces only a directory, which goes whole; a file loses one link.
    let effect = if named.entry_kind == crate::schema::S_IFDIR {
        super::drop_dir(replaced, named.parent, owner)
    } else {
        super::relink(replaced, -1, (named.parent, 0), owner)
    };
    match peers.owner(replaced) {
        g if g == ns.group() => more.push(effect),
        g => add_to(others, g, effect),
    }
}

/// Abort change `id` after `error`, telling the groups `asked`; answers the error to give the
/// client (committed meanwhile by recovery: the change happened, and `Unavailable` lets the
/// client's retry find it done).
fn abort_change(
    ns: &Namespace,
    peers: &dyn Peers,
    id: TxnId,
    asked: &[u32],
    error: CairnError,
) -> CairnError {
    if let Err(abort) = ns.change_abort(id, asked) {
        return abort;
    }
    tell_all(ns, peers, id, asked, false);
    if error.kind() == ErrorKind::Interrupted {
        return CairnError::unavailable(error.message().to_string());
    }
    error
}

/// What a participant's failed prepare answers the client: the namespace's refusal as it is
/// (the name exists, the caller may not, ...); anything else — no leader, a lost connection, a
/// leader that died while answering — `Unavailable`, which the mount tries again.
fn answer_of(e: CairnError) -> CairnError {
    use ErrorKind::*;
    match e.kind() {
        NotLeader | Interrupted | Io | Internal | TooFewNodes | WrongGroup => {
            CairnError::unavailable(format!("another metadata group did not prepare its part: {e}"))
        }
        _ => e,
    }
}

/// The change turned out to do nothing: undone everywhere it was prepared.
fn nothing(ns: &Namespace, peers: &dyn Peers, id: TxnId, asked: &[u32]) -> Result<Changed> {
    ns.change_abort(id, asked)?;
    tell_all(ns, peers, id, asked, false);
    Ok(Changed::Nothing)
}

/// Send the decision of `id` to each of `groups`: those that did not take it.
fn tell_groups(peers: &dyn Peers, id: TxnId, groups: &[u32], commit: bool) -> Vec<u32> {
    let failed = |group: &&u32| {
        peers.decide(**group, id, commit).map_err(|e| {
            tracing::info!("transaction {id}: metadata group {group} has not taken the decision yet ({e}); recovery sends it again");
        }).is_err()
    };
    groups.iter().filter(failed).copied().collect()
}

/// Send the decision of `id` to each of `groups`; forget the record once all acknowledged.
fn tell_all(ns: &Namespace, peers: &dyn Peers, id: TxnId, groups: &[u32], commit: bool) -> bool {
    forget_if(ns, id, tell_groups(peers, id, groups, commit).is_empty())
}

/// Forget the coordinator's record of `id` when every participant `acknowledged`.
fn forget_if(ns: &Namespace, id: TxnId, acknowledged: bool) -> bool {
    match acknowledged.then(|| ns.txn_forget(id)) {
        Some(Ok(())) => true,
        Some(Err(e)) => {
            tracing::info!("transaction {id}: its record stays ({e})");
            false
        }
        None => false,
    }
}

/// What a mkdir across groups did.
#[derive(Debug)]
pub struct Made {
    pub inode: Inode,
    /// Whether the participant acknowledged the commit before the answer (else recovery
    /// delivers it: the directory appears in its group within seconds).
    pub acknowledged: bool,
}

/// mkdir of `new` with the directory in metadata group `group` (`ns` holds the parent).
pub fn mkdir_across(ns: &Namespace, peers: &dyn Peers, new: &NewEntry<'_>, group: u32) -> Result<Made> {
    run(ns, peers, group, || ns.mkdir_begin(new, group))
}

/// rmdir of `name` in `parent` (`ns`'s), naming directory `ino`, which metadata group `group`
/// holds.
pub fn rmdir_across(
    ns: &Namespace,
    peers: &dyn Peers,
    (parent, name): (u64, &[u8]),
    ino: u64,
    group: u32,
) -> Result<Made> {
    run(ns, peers, group, || ns.rmdir_begin(parent, name, ino, group))
}

/// The steps: `begin`, and the prepare sent while the record it proposed is on its way to the
/// log (as a change's first prepare, [`change_across`]), then decide, tell, forget. A record
/// not known committed when the wait ends tells the participant to abort; a participant that
/// refuses or does not answer aborts it (its error is the answer; `Unavailable` when it did
/// not answer); once committed, the change has happened whatever the later steps meet.
fn run(
    ns: &Namespace,
    peers: &dyn Peers,
    group: u32,
    begin: impl FnOnce() -> Result<Prepare>,
) -> Result<Made> {
    let change = Change::open(&**ns.store());
    let prepare = match begin() {
        Ok(prepare) => prepare,
        // A refusal read from another change's proposed state holds only once that commits.
        Err(e) => {
            change.close()?;
            return Err(e);
        }
    };
    let id = prepare.id;
    let unsettled = ns.unsettled(id);
    crash_point("txn-begun");
    let prepared = peers.prepare(group, &prepare);
    let settled = change.close();
    drop(unsettled);
    if let Err(e) = settled {
        if let Err(e) = peers.decide(group, id, false) {
            tracing::info!(
                "transaction {id}: metadata group {group} has not taken the abort yet ({e}); it asks later"
            );
        }
        return Err(CairnError::unavailable(format!("transaction {id} could not be begun: try again ({e})")));
    }
    let committed = prepared.and_then(|inode| {
        crash_point("txn-prepared");
        ns.txn_commit(id, &inode)
    });
    let inode = match committed {
        Ok(inode) => inode,
        Err(e) => {
            // Aborted here first: the name is as it was at once, whatever the participant does.
            if let Err(abort) = ns.txn_abort(id) {
                // Committed meanwhile by another step? Then the change happened.
                if let Some(TxnRecord { state: TXN_COMMITTED, inode: Some(inode), .. }) = ns.txn_record(id)? {
                    return Ok(Made { acknowledged: tell(ns, peers, id, group, true), inode });
                }
                return Err(abort);
            }
            tell(ns, peers, id, group, false);
            // Aborted under it (recovery took it for abandoned): the client may try again.
            if e.kind() == ErrorKind::Interrupted {
                return Err(CairnError::unavailable(e.message().to_string()));
            }
            return Err(e);
        }
    };
    crash_point("txn-committed");
    // The answer waits a little for the participant to apply it, so the caller's next
    // request there finds it; recovery delivers it otherwise.
    let acknowledged = (0..3).any(|attempt| {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        tell(ns, peers, id, group, true)
    });
    Ok(Made { acknowledged, inode })
}

/// Kill this process at `step` of a transaction, once, when the crash tests ask for it:
/// `CAIRN_CRASH_AT` names the step — of a mkdir or rmdir's coordinator `txn-begun`,
/// `txn-prepared`, `txn-committed`; of a change's `change-begun`, `change-asked` (the first
/// participant prepared, the coordinator's record maybe not yet committed), `change-prepared`,
/// `change-committed`, and of its participant `change-participant-prepared` (its record
/// written, not answered) and `change-participant-decided` (applied, not answered) — and
/// `CAIRN_CRASH_ONCE` a file that must not exist yet (made here, so only one process of a
/// cluster started with both dies, and only once).
pub(super) fn crash_point(step: &str) {
    if std::env::var("CAIRN_CRASH_AT").ok().as_deref() != Some(step) {
        return;
    }
    let Some(once) = std::env::var_os("CAIRN_CRASH_ONCE") else { return };
    if std::fs::OpenOptions::new().write(true).create_new(true).open(&once).is_ok() {
        tracing::error!("crash test: killing this metaserver at {step}");
        std::process::abort();
    }
}

/// Send the decision of `id` to `group` once; forget the record when acknowledged.
fn tell(ns: &Namespace, peers: &dyn Peers, id: TxnId, group: u32, commit: bool) -> bool {
    match peers.decide(group, id, commit).and_then(|()| ns.txn_forget(id)) {
        Ok(()) => true,
        Err(e) => {
            tracing::info!("transaction {id}: metadata group {group} has not taken the decision yet ({e}); recovery sends it again");
            false
        }
    }
}

/// A participant's record this old asks its coordinator how it ended, whatever `stale_secs`
/// says (a coordinator still at it answers "pending", and nothing changes): so what was
/// prepared for a coordinator whose record never reached its log — lost with its leader, the
/// first prepare having overlapped that record's commit — is given back within a pass or two,
/// while the mount still retries, not only once `stale_secs` old.
const ASK_AFTER_SECS: i64 = 2;

/// One pass of recovery over the transactions this side has not finished (run by every
/// leadership at its start and every few seconds): as coordinator, abort what is still
/// pending when an earlier leadership began it (nobody waits on it any more) or it is older
/// than `stale_secs`, and send every decision not acknowledged; as participant, ask the
/// coordinator about pending records older than `ASK_AFTER_SECS` and apply what it says. A group
/// that did not answer is not asked again in the same pass; a record that fails is logged and
/// left for the next. Answers how many transactions remain.
pub fn recover(ns: &Namespace, peers: &dyn Peers, stale_secs: i64) -> Result<usize> {
    let now = cairn_common::time::now().sec;
    let mut left = 0;
    let mut silent = std::collections::BTreeSet::new();
    for (id, record) in ns.txns()? {
        let stale = now.saturating_sub(record.written_sec)
            >= match record.role {
                TXN_PARTICIPANT => stale_secs.min(ASK_AFTER_SECS),
                _ => stale_secs,
            };
        let peer = if record.role == TXN_PARTICIPANT { id.group } else { record.peer_group };
        // A coordinator's pending transaction of an earlier leadership: nobody waits on it; a
        // participant's prepared under an earlier leader: its decision may be waiting (asked at
        // once, not only once it is old).
        let earlier = match record.role {
            TXN_COORDINATOR => id.seq < ns.txn_first_seq,
            _ => record.written_sec <= ns.opened_sec,
        };
        if record.role == TXN_COORDINATOR && record.op == TXN_CHANGE {
            match recover_change(ns, peers, id, &record, stale || earlier, &mut silent) {
                Ok(true) => {}
                Ok(false) => left += 1,
                Err(e) => {
                    left += 1;
                    tracing::warn!("transaction {id} across metadata groups: {e}");
                }
            }
            continue;
        }
        let done = if silent.contains(&peer) {
            // Aborting needs no answer: the name is given back now, the telling waits.
            if record.role == TXN_COORDINATOR && record.state == TXN_PENDING && (stale || earlier) {
                ns.txn_abort(id).map(|()| Finished::Silent)
            } else {
                Ok(Finished::Silent)
            }
        } else {
            finish_one(ns, peers, id, &record, stale || earlier)
        };
        match done {
            Ok(Finished::Done) => {}
            Ok(Finished::Waiting) => left += 1,
            Ok(Finished::Silent) => {
                left += 1;
                silent.insert(peer);
            }
            Err(e) => {
                left += 1;
                tracing::warn!("transaction {id} across metadata groups: {e}");
            }
        }
    }
    Ok(left)
}

/// Recovery of a change this group coordinates (see [`recover`]): aborted when `abandoned`
/// and still pending, its decision sent to each participant not in `silent` (those that do not
/// answer join it). Answers whether it is finished.
fn recover_change(
    ns: &Namespace,
    peers: &dyn Peers,
    id: TxnId,
    record: &TxnRecord,
    abandoned: bool,
    silent: &mut std::collections::BTreeSet<u32>,
) -> Result<bool> {
    if record.state == TXN_PENDING {
        if !abandoned {
            return Ok(false);
        }
        // Aborting needs no answer: the names are given back now. An error is fine where the
        // change committed meanwhile (its coordinator was still running): that is delivered.
        if let Err(e) = ns.txn_abort(id) {
            if !matches!(ns.txn_record(id)?, Some(TxnRecord { state: TXN_COMMITTED, .. })) {
                return Err(e);
            }
        }
    }
    let Some(record) = ns.txn_record(id)? else { return Ok(true) };
    let (reachable, skipped): (Vec<u32>, Vec<u32>) = record.groups.iter().partition(|g| !silent.contains(*g));
    let failed = tell_groups(peers, id, &reachable, record.state == TXN_COMMITTED);
    let acknowledged = failed.is_empty() && skipped.is_empty();
    silent.extend(failed);
    Ok(forget_if(ns, id, acknowledged))
}

/// How one transaction's recovery went.
enum Finished {
    Done,
    /// Not yet to be finished (a coordinator still waiting on it, or one still deciding).
    Waiting,
    /// Its other side did not answer.
    Silent,
}

fn told(acknowledged: bool) -> Finished {
    if acknowledged {
        Finished::Done
    } else {
        Finished::Silent
    }
}

/// Recovery of one transaction (see [`recover`]); `abandoned`: a coordinator's pending one
/// nobody waits on, or a participant's old enough to ask about.
fn finish_one(
    ns: &Namespace,
    peers: &dyn Peers,
    id: TxnId,
    record: &TxnRecord,
    abandoned: bool,
) -> Result<Finished> {
    let group = record.peer_group;
    match (record.role, record.state) {
        (TXN_COORDINATOR, TXN_PENDING) if abandoned => {
            if let Err(e) = ns.txn_abort(id) {
                // Committed meanwhile (its mkdir was still running): deliver that instead.
                return match ns.txn_record(id)? {
                    Some(TxnRecord { state: TXN_COMMITTED, .. }) => {
                        Ok(told(tell(ns, peers, id, group, true)))
                    }
                    _ => Err(e),
                };
            }
            Ok(told(tell(ns, peers, id, group, false)))
        }
        (TXN_COORDINATOR, TXN_PENDING) => Ok(Finished::Waiting),
        (TXN_COORDINATOR, state) => Ok(told(tell(ns, peers, id, group, state == TXN_COMMITTED))),
        (TXN_PARTICIPANT, _) if !abandoned => Ok(Finished::Waiting),
        (TXN_PARTICIPANT, _) => {
            match peers.outcome(id) {
                Ok(Outcome::Pending) => Ok(Finished::Waiting),
                Ok(outcome) => ns.txn_decide(id, outcome == Outcome::Committed).map(|()| Finished::Done),
                Err(e) => {
                    tracing::info!("transaction {id}: its coordinator, metadata group {}, did not say how it ended ({e})", id.group);
                    Ok(Finished::Silent)
                }
            }
        }
        (role, _) => Err(CairnError::corrupt(format!("transaction {id} has role {role}"))),
    }
}
