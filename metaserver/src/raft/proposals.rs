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
//! one key are never pending together (an operation holds its inode locks, and its statistics
//! shard, until its entry is applied); and an entry that fails fails every change in it, each of
//! whose callers sees the error as it would have for an entry of its own.

use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Result};
use openraft::error::ClientWriteError;
use openraft::{BasicNode, Raft};
use tokio::sync::{mpsc, oneshot, Semaphore};

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

/// One change waiting to be proposed, and where its outcome goes.
pub struct Pending {
    ops: Vec<Op>,
    done: oneshot::Sender<Result<()>>,
}

impl Pending {
    pub fn new(ops: Vec<Op>) -> (Pending, oneshot::Receiver<Result<()>>) {
        let (done, rx) = oneshot::channel();
        (Pending { ops, done }, rx)
    }

    fn bytes(&self) -> usize {
        self.ops.iter().map(Op::bytes).sum()
    }
}

/// Propose what arrives on `queue` through `raft`, in groups (see the module's comment); each
/// change is answered once its entry is applied here, or fails after `timeout` without a
/// majority (its caller also stops waiting after `timeout`, counted from when it proposed). `not_leader` turns openraft's forward-to-leader answer into the client's error.
pub async fn run(
    raft: Raft<TypeConfig>,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    timeout: Duration,
    not_leader: fn(Option<&BasicNode>) -> CairnError,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut bytes = first.bytes();
        let mut group = vec![first];
        while bytes < GROUP_BYTES && group.len() < GROUP_CHANGES {
            match queue.try_recv() {
                Ok(next) => {
                    bytes += next.bytes();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        // A change whose caller stopped waiting (its time ran out while earlier entries could
        // not commit) is not proposed: the caller already answered that it failed.
        group.retain(|pending| !pending.done.is_closed());
        if group.is_empty() {
            continue;
        }
        metrics::counter!(crate::metrics::RAFT_ENTRIES_PROPOSED).increment(1);
        metrics::counter!(crate::metrics::RAFT_CHANGES_PROPOSED).increment(group.len() as u64);
        let mut ops = Vec::with_capacity(group.iter().map(|p| p.ops.len()).sum());
        let mut answers = Vec::with_capacity(group.len());
        for pending in group {
            ops.extend(pending.ops);
            answers.push(pending.done);
        }
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
            drop(slot);
            for answer in answers {
                let _ = answer.send(result.clone());
            }
        });
    }
}

fn not_committed(timeout: Duration) -> CairnError {
    CairnError::unavailable(format!(
        "a metadata change was not committed within {timeout:?}: fewer than a majority of metaservers answer"
    ))
}
