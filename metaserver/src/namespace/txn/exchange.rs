//! Who sends what in a transaction across groups, and recovery: the steps of
//! [`super`] run in order by the coordinator ([`mkdir_across`], [`rmdir_across`]), and the
//! pass every leadership runs over what its predecessors left unfinished ([`recover`]).

use cairn_common::{CairnError, ErrorKind, Result};

use super::{Outcome, Prepare, TxnId};
use crate::namespace::{Namespace, NewEntry};
use crate::schema::{Inode, TxnRecord, TXN_COMMITTED, TXN_COORDINATOR, TXN_PARTICIPANT, TXN_PENDING};

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
    let prepare = ns.mkdir_begin(new, group)?;
    run(ns, peers, &prepare, group)
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
    let prepare = ns.rmdir_begin(parent, name, ino, group)?;
    run(ns, peers, &prepare, group)
}

/// The steps after the first: prepare, decide, tell, forget. A participant that refuses or does
/// not answer aborts it (its error is the answer; `Unavailable` when it did not answer); once
/// committed, the change has happened whatever the later steps meet.
fn run(ns: &Namespace, peers: &dyn Peers, prepare: &Prepare, group: u32) -> Result<Made> {
    let id = prepare.id;
    crash_point("txn-begun");
    let committed = peers.prepare(group, prepare).and_then(|inode| {
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

/// Kill this process at `step` of a transaction it coordinates, once, when the crash tests ask
/// for it: `CAIRN_CRASH_AT` names the step (`txn-begun`, `txn-prepared`, `txn-committed`) and
/// `CAIRN_CRASH_ONCE` a file that must not exist yet (made here, so only one process of a
/// cluster started with both dies, and only once).
fn crash_point(step: &str) {
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

/// One pass of recovery over the transactions this side has not finished (run by every
/// leadership at its start and every few seconds): as coordinator, abort what is still
/// pending when an earlier leadership began it (nobody waits on it any more) or it is older
/// than `stale_secs`, and send every decision not acknowledged; as participant, ask the
/// coordinator about pending records older than `stale_secs` and apply what it says. A group
/// that did not answer is not asked again in the same pass; a record that fails is logged and
/// left for the next. Answers how many transactions remain.
pub fn recover(ns: &Namespace, peers: &dyn Peers, stale_secs: i64) -> Result<usize> {
    let now = cairn_common::time::now().sec;
    let mut left = 0;
    let mut silent = std::collections::BTreeSet::new();
    for (id, record) in ns.txns()? {
        let stale = now.saturating_sub(record.written_sec) >= stale_secs;
        let peer = if record.role == TXN_PARTICIPANT { id.group } else { record.peer_group };
        // A coordinator's pending transaction of an earlier leadership: nobody waits on it.
        let earlier = record.role == TXN_COORDINATOR && id.seq < ns.txn_first_seq;
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
