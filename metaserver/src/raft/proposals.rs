//! Group commit for the leader's proposals: changes proposed while earlier ones are still being
//! committed go into one log entry together.
//!
//! openraft 0.9 appends each client write to the log on its own, and every append is fsynced
//! before openraft goes on (`log.rs`), so N changes proposed at once cost the leader N fsyncs in
//! series. Here one task takes the proposals in the order they came, waits while an entry
//! ([`IN_FLIGHT`]) is on its way, then puts everything that queued meanwhile into one entry:
//! one fsync per replica for the lot. A lone proposer is proposed at once, as before.
//!
//! Why putting several changes in one entry is sound: an entry is applied as one `WriteBatch`,
//! so each change still lands whole or not at all, in the order proposed; two changes that touch
//! one key are proposed in the order they were made (the second read the first's proposed value
//! through the leader overlay, `overlay.rs`), so the later one's value is the one left; and an
//! entry that fails fails every change in it, each of whose callers sees the error as it would
//! have for an entry of its own, and no later change of that namespace is proposed ([`Gate`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use openraft::error::ClientWriteError;
use openraft::{BasicNode, Raft};
use tokio::sync::{mpsc, Semaphore};

use super::{Command, TypeConfig};
use crate::store::Op;

/// Entries on their way to being committed at once. One: openraft 0.9 takes an entry through
/// its leader's log fsync, the followers' and the commit one after another, so a second entry
/// in flight gains no overlap and only splits the group (measured, 3 replicas, creates by 4 and
/// 16 processes: 1,078 / 1,010 and 2,677 / 2,557 per second with one in flight, 975 / 985 and
/// 2,328 / 2,152 with two, alternated; `bench/RESULTS.md`).
pub const IN_FLIGHT: usize = 1;
/// A group stops growing at this many bytes of keys and values (the entry travels in one Raft
/// message, below the transport's message limit) or this many changes.
const GROUP_BYTES: usize = 4 << 20;
const GROUP_CHANGES: usize = 4096;

/// Which namespace may still have its changes proposed, shared by the stores and the
/// proposer. Each namespace opened as leader writes through a store of one *generation*.
#[derive(Default)]
pub struct Gate {
    /// The newest generation handed out: an older one's changes are not proposed.
    current: AtomicU64,
    /// The newest generation one of whose changes failed (0: none): its later changes may have
    /// been computed from the failed one, so none of them is proposed.
    failed: AtomicU64,
    /// Set by a failed change: the leader's namespace is opened again before serving more.
    poisoned: AtomicBool,
    /// Changes proposed and not yet answered.
    in_flight: AtomicUsize,
}

impl Gate {
    /// Whether changes of `generation` may no longer be proposed.
    pub fn refuses(&self, generation: u64) -> bool {
        generation < self.current.load(Ordering::Acquire) || self.failed.load(Ordering::Acquire) >= generation
    }

    /// Hand out the next generation (every earlier one is refused from now on).
    pub fn next_generation(&self) -> u64 {
        self.current.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// A change of `generation` failed: refuse its later ones and, if it is the namespace
    /// serving now, have it reopened.
    pub fn fail(&self, generation: u64) {
        // Only the first failure of a generation asks for a reopening: the changes refused
        // after it fail too, and must not have the namespace that replaces it reopened as well.
        let before = self.failed.fetch_max(generation, Ordering::AcqRel);
        if before < generation && generation >= self.current.load(Ordering::Acquire) {
            self.poisoned.store(true, Ordering::Release);
        }
    }

    /// Take (and clear) the mark a failed change left.
    pub fn take_poisoned(&self) -> bool {
        self.poisoned.swap(false, Ordering::AcqRel)
    }

    /// Wait (at most `timeout`) until every change proposed so far is answered; false if
    /// some still were not.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        // Rare (a change of leadership or a failed write): polled, so that answering a change
        // costs one atomic decrement rather than a lock and a wake-up.
        let deadline = std::time::Instant::now() + timeout;
        while self.in_flight.load(Ordering::Acquire) > 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

/// One change waiting to be proposed, and who is told its outcome.
pub struct Pending {
    ops: Vec<Op>,
    generation: u64,
    answer: Answer,
}

/// Called with a change's outcome exactly once: when its entry is applied here or failed, or
/// with an error when the change is dropped unanswered (the proposer stopping).
struct Answer {
    settled: Option<Box<dyn FnOnce(Result<()>) + Send>>,
    gate: Arc<Gate>,
}

impl Answer {
    fn send(mut self, result: Result<()>) {
        if let Some(settled) = self.settled.take() {
            settled(result);
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(settled) = self.settled.take() {
            settled(Err(CairnError::unavailable("this metaserver's Raft node is stopping")));
        }
        self.gate.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pending {
    /// A change of `generation`; `settled` is told its outcome (once). Counted in flight until
    /// then.
    pub fn new(
        ops: Vec<Op>,
        generation: u64,
        gate: &Arc<Gate>,
        settled: impl FnOnce(Result<()>) + Send + 'static,
    ) -> Pending {
        gate.in_flight.fetch_add(1, Ordering::AcqRel);
        Pending { ops, generation, answer: Answer { settled: Some(Box::new(settled)), gate: gate.clone() } }
    }

    fn bytes(&self) -> usize {
        self.ops.iter().map(Op::bytes).sum()
    }
}

/// Propose what arrives on `queue` through `raft`, in groups (see the module's comment); each
/// change is answered once its entry is applied here, or fails after `timeout` without a
/// majority. A change of a generation the gate refuses is answered `NotLeader` unproposed, and
/// an entry that fails makes the gate refuse its generation before the next entry is sent.
/// `not_leader` turns openraft's forward-to-leader answer into the client's error.
pub async fn run(
    raft: Raft<TypeConfig>,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    timeout: Duration,
    gate: Arc<Gate>,
    not_leader: fn(Option<&BasicNode>) -> CairnError,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    // A change whose namespace was retired, or one of whose earlier changes failed (its caller
    // may have stopped waiting and answered that it failed), is not proposed.
    let admit = |pending: Pending| -> Option<Pending> {
        if gate.refuses(pending.generation) {
            pending.answer.send(Err(CairnError::new(
                ErrorKind::NotLeader,
                "this namespace was closed (leadership changed or a write failed); ask again",
            )));
            return None;
        }
        Some(pending)
    };
    while let Some(first) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut bytes = 0;
        let mut group = Vec::new();
        if let Some(first) = admit(first) {
            bytes += first.bytes();
            group.push(first);
        }
        while bytes < GROUP_BYTES && group.len() < GROUP_CHANGES {
            match queue.try_recv() {
                Ok(next) => {
                    if let Some(next) = admit(next) {
                        bytes += next.bytes();
                        group.push(next);
                    }
                }
                Err(_) => break,
            }
        }
        if group.is_empty() {
            continue;
        }
        metrics::counter!(crate::metrics::RAFT_ENTRIES_PROPOSED).increment(1);
        metrics::counter!(crate::metrics::RAFT_CHANGES_PROPOSED).increment(group.len() as u64);
        let mut ops = Vec::with_capacity(group.iter().map(|p| p.ops.len()).sum());
        let mut answers = Vec::with_capacity(group.len());
        let mut newest = 0;
        for pending in group {
            ops.extend(pending.ops);
            newest = newest.max(pending.generation);
            answers.push(pending.answer);
        }
        let gate = gate.clone();
        // Sent here, in arrival order; waited for in a task of its own, so the next group can
        // be sent while this one commits.
        let deadline = tokio::time::Instant::now() + timeout;
        let sent = tokio::time::timeout_at(deadline, raft.client_write_ff(Command { ops })).await;
        tokio::spawn(async move {
            let result = match sent {
                Err(_) => Err(not_committed(timeout)),
                Ok(Err(fatal)) => {
                    Err(CairnError::unavailable(format!("replicating a metadata change: {fatal}")))
                }
                Ok(Ok(applied)) => match tokio::time::timeout_at(deadline, applied).await {
                    Err(_) => Err(not_committed(timeout)),
                    Ok(Err(_)) => {
                        Err(CairnError::unavailable("Raft stopped before the change was committed"))
                    }
                    Ok(Ok(Ok(_))) => Ok(()),
                    Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                        Err(not_leader(f.leader_node.as_ref()))
                    }
                    Ok(Ok(Err(e))) => {
                        Err(CairnError::unavailable(format!("replicating a metadata change: {e}")))
                    }
                },
            };
            if result.is_err() {
                // Before the next entry may be sent: changes queued behind this one may have
                // been computed from it (the leader overlay).
                gate.fail(newest);
            }
            drop(slot);
            for answer in answers {
                answer.send(result.clone());
            }
        });
    }
}

fn not_committed(timeout: Duration) -> CairnError {
    CairnError::unavailable(format!(
        "a metadata change was not committed within {timeout:?}: fewer than a majority of metaservers answer"
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Gate;

    /// A generation's first failure refuses its later changes and asks once for the namespace
    /// to be reopened; a retired generation's failures ask nothing of the one serving now.
    #[test]
    fn a_failed_generation_is_refused_and_reopened_once() {
        let gate = Gate::default();
        let first = gate.next_generation();
        assert!(!gate.refuses(first));
        gate.fail(first);
        assert!(gate.refuses(first));
        assert!(gate.take_poisoned());
        gate.fail(first);
        assert!(!gate.take_poisoned(), "the same generation's later failures reopen nothing");

        let second = gate.next_generation();
        assert!(!gate.refuses(second) && gate.refuses(first));
        gate.fail(first);
        assert!(!gate.take_poisoned(), "a retired generation's failure reopened the new namespace");
        let third = gate.next_generation();
        assert!(gate.refuses(second), "a retired generation is refused");
        gate.fail(third);
        assert!(gate.take_poisoned() && gate.refuses(third));
        assert!(gate.wait_drained(Duration::from_millis(10)), "nothing is in flight");
    }
}
