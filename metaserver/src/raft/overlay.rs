//! The leader overlay: changes proposed by the leader's namespace and not yet applied, which
//! later changes read through, so an operation lets go of its inode locks when its change is
//! proposed instead of when it is applied (`docs/ARCHITECTURE.md`, "The leader overlay").
//!
//! Without it, operations on one inode — every create in one directory — wait for each
//! other's commits: a directory took one create per Raft commit however many processes
//! created in it. With it, the next operation reads the proposed state under the locks,
//! proposes its own change behind, and the group commit of `proposals.rs` takes them together.
//!
//! The rules that keep it linearizable:
//! - Only an operation inside a *change* ([`Overlay::begin`] … [`Overlay::end`], which the
//!   namespace opens around everything it does under its locks) reads the overlay; reads outside
//!   (lookups, getattr, readdir served without locks) see the applied state only, so nobody
//!   sees a change before it is committed.
//! - A change remembers the newest proposal it read or made, and [`Overlay::end`] returns only
//!   once every proposal up to that one is applied. A change that read another's proposed state
//!   answers after that state is committed, and fails (asks the client to retry) if it was not.
//! - Proposals enter the log in the order they were proposed ([`Overlay::propose`] numbers and
//!   queues them under one lock), so a change is never committed before one it read; once one
//!   change of a namespace fails, no later change of that namespace is proposed (the proposer
//!   refuses the failed generation), so none computed from a failed one is ever committed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Result};
use parking_lot::RwLock;

use crate::store::{Cf, Op};

/// A proposed change's value of one key: `None` is a delete.
struct Slot {
    seq: u64,
    value: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    /// The newest proposed value of every key some pending change writes, by column family.
    keys: [BTreeMap<Vec<u8>, Slot>; Cf::ALL.len()],
    /// The keys each pending change wrote, to drop them once it is applied.
    by_seq: BTreeMap<u64, Vec<(Cf, Vec<u8>)>>,
    /// The number the next proposal gets (the first is 1).
    next: u64,
    /// Every proposal up to this one is settled (applied or failed).
    settled_upto: u64,
    /// Settled proposals above `settled_upto` (answers may come out of order).
    settled_beyond: BTreeSet<u64>,
    /// The first proposal that failed, and why: it and every later one may be missing from
    /// the store.
    failed: Option<(u64, CairnError)>,
    /// Threads and tasks waiting, each for every proposal up to its number: woken one by one
    /// when theirs are settled (a wake-up costs tens of microseconds of CPU; waking every
    /// waiter at every answer would cost that many times more).
    waiters: Vec<(u64, Waiter)>,
}

enum Waiter {
    Thread(std::thread::Thread),
    Task(tokio::sync::oneshot::Sender<()>),
}

impl Waiter {
    fn is_thread(&self, id: std::thread::ThreadId) -> bool {
        matches!(self, Waiter::Thread(t) if t.id() == id)
    }

    fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

impl State {
    /// Whether a wait for every proposal up to `seq` is over.
    fn decided(&self, seq: u64) -> bool {
        self.settled_upto >= seq || self.failed.as_ref().is_some_and(|(failed, _)| *failed <= seq)
    }

    /// How a decided wait for every proposal up to `seq` ends.
    fn outcome(&self, seq: u64) -> Result<()> {
        match &self.failed {
            Some((failed, e)) if *failed <= seq => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

fn timed_out(timeout: Duration) -> CairnError {
    CairnError::unavailable(format!(
        "a metadata change was not committed within {timeout:?}: fewer than a majority of metaservers answer"
    ))
}

/// The overlay of one namespace's store (one generation: a new namespace gets a new one).
/// Reads take the lock shared: every read of every change consults it.
#[derive(Default)]
pub struct Overlay {
    state: RwLock<State>,
}

/// What one thread's change has read or made so far.
struct Scope {
    overlay: Arc<Overlay>,
    depth: u32,
    /// The newest proposal read or made: everything up to it must be applied before answering.
    wait_for: u64,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

impl Overlay {
    /// Open a change on this thread (nested opens count; the outermost [`Overlay::end_take`]
    /// says what to wait for).
    pub fn begin(self: &Arc<Self>) {
        SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            match s.as_mut() {
                Some(scope) if Arc::ptr_eq(&scope.overlay, self) => scope.depth += 1,
                // A scope of another store (a namespace retired while this thread used it) or
                // one left by a panic: this change starts afresh.
                _ => *s = Some(Scope { overlay: self.clone(), depth: 1, wait_for: 0 }),
            }
        });
    }

    /// Close this thread's change without waiting: for the outermost close, the proposal to
    /// wait for (with [`Overlay::wait`] or [`Overlay::wait_async`]) if there is one.
    pub fn end_take(self: &Arc<Self>) -> Option<u64> {
        SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            let scope = s.as_mut().filter(|scope| Arc::ptr_eq(&scope.overlay, self))?;
            scope.depth -= 1;
            if scope.depth > 0 {
                return None;
            }
            s.take().map(|scope| scope.wait_for).filter(|seq| *seq > 0)
        })
    }

    /// Forget this thread's change without waiting (it unwound).
    pub fn abandon(self: &Arc<Self>) {
        SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            if s.as_ref().is_some_and(|scope| Arc::ptr_eq(&scope.overlay, self)) {
                *s = None;
            }
        });
    }

    /// Whether this thread is inside a change of this overlay.
    pub fn in_change(self: &Arc<Self>) -> bool {
        SCOPE.with(|s| s.borrow().as_ref().is_some_and(|scope| Arc::ptr_eq(&scope.overlay, self)))
    }

    /// This thread's change (if it is one of this overlay's) must wait for proposal `seq`.
    fn note(&self, seq: u64) {
        SCOPE.with(|s| {
            if let Some(scope) =
                s.borrow_mut().as_mut().filter(|scope| std::ptr::eq(Arc::as_ptr(&scope.overlay), self))
            {
                scope.wait_for = scope.wait_for.max(seq);
            }
        });
    }

    /// Number `ops` as the next proposal, make them visible to changes, and hand them with
    /// their number to `send` while still holding the lock, so proposals are queued in the order
    /// they are numbered (`send` must only queue: what it gives back on failure is dropped after
    /// the lock is let go). Inside a change, the change will wait for this proposal.
    pub fn propose<T>(
        &self,
        ops: Vec<Op>,
        send: impl FnOnce(u64, Vec<Op>) -> std::result::Result<(), T>,
    ) -> Result<std::result::Result<u64, T>> {
        let mut st = self.state.write();
        if let Some((_, e)) = &st.failed {
            return Err(e.clone());
        }
        st.next += 1;
        let seq = st.next;
        let mut written = Vec::with_capacity(ops.len());
        for op in &ops {
            let (cf, key, value) = match op {
                Op::Put { cf, key, value } => (*cf, key, Some(value.clone())),
                Op::Delete { cf, key } => (*cf, key, None),
            };
            st.keys[cf.index()].insert(key.clone(), Slot { seq, value });
            written.push((cf, key.clone()));
        }
        st.by_seq.insert(seq, written);
        let sent = send(seq, ops);
        drop(st);
        self.note(seq);
        Ok(sent.map(|()| seq))
    }

    /// Proposal `seq` is applied (`Ok`) or failed: drop its keys (where no later proposal wrote
    /// them again) and wake whoever waits.
    pub fn settle(&self, seq: u64, result: Result<()>) {
        let mut st = self.state.write();
        if let Some(keys) = st.by_seq.remove(&seq) {
            for (cf, key) in keys {
                let map = &mut st.keys[cf.index()];
                if map.get(&key).is_some_and(|slot| slot.seq == seq) {
                    map.remove(&key);
                }
            }
        }
        if let Err(e) = result {
            if st.failed.as_ref().is_none_or(|(first, _)| seq < *first) {
                st.failed = Some((seq, e));
            }
        }
        st.settled_beyond.insert(seq);
        while st.settled_beyond.first() == Some(&(st.settled_upto + 1)) {
            st.settled_beyond.pop_first();
            st.settled_upto += 1;
        }
        let mut wake = Vec::new();
        let mut i = 0;
        while i < st.waiters.len() {
            if st.decided(st.waiters[i].0) {
                wake.push(st.waiters.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        drop(st);
        wake.into_iter().for_each(Waiter::wake);
    }

    /// Wait until every proposal up to `seq` is applied; an error as soon as one of them
    /// failed, or when `timeout` passed first.
    pub fn wait(&self, seq: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let me = std::thread::current();
        loop {
            {
                let mut st = self.state.write();
                if st.decided(seq) {
                    st.waiters.retain(|(_, w)| !w.is_thread(me.id()));
                    return st.outcome(seq);
                }
                if Instant::now() >= deadline {
                    st.waiters.retain(|(_, w)| !w.is_thread(me.id()));
                    return Err(timed_out(timeout));
                }
                if !st.waiters.iter().any(|(_, w)| w.is_thread(me.id())) {
                    st.waiters.push((seq, Waiter::Thread(me.clone())));
                }
            }
            // Woken by `settle` (or spuriously: the loop checks again).
            std::thread::park_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }

    /// [`Overlay::wait`] for a task: the thread is not held meanwhile.
    pub async fn wait_async(self: Arc<Self>, seq: u64, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let woken = {
                let mut st = self.state.write();
                if st.decided(seq) {
                    return st.outcome(seq);
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                st.waiters.push((seq, Waiter::Task(tx)));
                rx
            };
            // Woken (or its sender dropped): check again.
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                let st = self.state.read();
                return if st.decided(seq) { st.outcome(seq) } else { Err(timed_out(timeout)) };
            }
        }
    }

    /// The proposed value of `key`, if a pending change wrote it and this thread is in a
    /// change (`Some(None)`: proposed deleted).
    pub fn get(self: &Arc<Self>, cf: Cf, key: &[u8]) -> Result<Option<Option<Vec<u8>>>> {
        if !self.in_change() {
            return Ok(None);
        }
        let st = self.state.read();
        if let Some((_, e)) = &st.failed {
            return Err(e.clone());
        }
        let Some(slot) = st.keys[cf.index()].get(key) else { return Ok(None) };
        let (seq, value) = (slot.seq, slot.value.clone());
        drop(st);
        self.note(seq);
        Ok(Some(value))
    }

    /// `applied` (the store's pairs with `start <= key < end`, in key order, read with a limit
    /// of `limit` plus [`Overlay::pending_in`]'s count) with the proposed changes of that range
    /// laid over it, at most `limit` pairs. Outside a change: `applied` as it is.
    pub fn scan(
        self: &Arc<Self>,
        cf: Cf,
        start: &[u8],
        end: &[u8],
        limit: usize,
        applied: impl FnOnce(usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !self.in_change() || (!end.is_empty() && start > end) {
            return applied(limit);
        }
        let pending: Vec<(Vec<u8>, u64, Option<Vec<u8>>)> = {
            let st = self.state.read();
            if let Some((_, e)) = &st.failed {
                return Err(e.clone());
            }
            let upper = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(end) };
            st.keys[cf.index()]
                .range::<[u8], _>((Bound::Included(start), upper))
                .map(|(k, slot)| (k.clone(), slot.seq, slot.value.clone()))
                .collect()
        };
        if pending.is_empty() {
            return applied(limit);
        }
        self.note(pending.iter().map(|(_, seq, _)| *seq).max().unwrap_or(0));
        // Each proposed delete can hide one applied pair: read that many more.
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> =
            applied(limit.saturating_add(pending.len()))?.into_iter().collect();
        for (key, _, value) in pending {
            match value {
                Some(v) => merged.insert(key, v),
                None => merged.remove(&key),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use cairn_common::CairnError;

    use super::Overlay;
    use crate::store::{Cf, Op};

    fn put(key: &str, value: &str) -> Op {
        Op::Put { cf: Cf::Dentries, key: key.into(), value: value.into() }
    }

    fn delete(key: &str) -> Op {
        Op::Delete { cf: Cf::Dentries, key: key.into() }
    }

    /// Close this thread's change and wait for what it read or made.
    fn end(overlay: &Arc<Overlay>, timeout: Duration) -> cairn_common::Result<()> {
        overlay.end_take().map_or(Ok(()), |seq| overlay.wait(seq, timeout))
    }

    /// Propose `ops` as the proposer would receive them (queued at once).
    fn propose(overlay: &Overlay, ops: Vec<Op>) -> u64 {
        overlay.propose(ops, |_, _| Ok::<(), ()>(())).unwrap().unwrap()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        list.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn changes_read_proposed_values_and_other_reads_do_not() {
        let overlay = Arc::new(Overlay::default());
        let applied = pairs(&[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")]);
        let store = |limit: usize| Ok(applied.iter().take(limit).cloned().collect());
        propose(&overlay, vec![put("b", "2"), delete("c"), put("bb", "2")]);
        propose(&overlay, vec![put("e", "3"), delete("a"), put("b", "3")]);

        // Outside a change: nothing proposed is seen.
        assert_eq!(overlay.get(Cf::Dentries, b"b").unwrap(), None);
        assert_eq!(overlay.scan(Cf::Dentries, b"", b"", 10, store).unwrap(), applied);

        overlay.begin();
        assert_eq!(
            overlay.get(Cf::Dentries, b"b").unwrap(),
            Some(Some(b"3".to_vec())),
            "the newest proposal wins"
        );
        assert_eq!(overlay.get(Cf::Dentries, b"c").unwrap(), Some(None), "proposed deleted");
        assert_eq!(overlay.get(Cf::Dentries, b"d").unwrap(), None, "not proposed: the store's");
        assert_eq!(overlay.get(Cf::Inodes, b"b").unwrap(), None, "another column family");
        let all = pairs(&[("b", "3"), ("bb", "2"), ("d", "1"), ("e", "3")]);
        assert_eq!(overlay.scan(Cf::Dentries, b"", b"", 10, store).unwrap(), all);
        // Limits count what is left after the deletes; ranges bound the proposals too.
        for limit in 0..=all.len() {
            assert_eq!(
                overlay.scan(Cf::Dentries, b"", b"", limit, store).unwrap(),
                all[..limit],
                "limit {limit}"
            );
        }
        let in_b_to_d = |limit: usize| Ok(applied[1..3].iter().take(limit).cloned().collect());
        assert_eq!(
            overlay.scan(Cf::Dentries, b"b", b"d", 10, in_b_to_d).unwrap(),
            pairs(&[("b", "3"), ("bb", "2")])
        );
        assert_eq!(overlay.scan(Cf::Inodes, b"", b"", 10, |_| Ok(Vec::new())).unwrap(), Vec::new());
        overlay.abandon();
        assert!(!overlay.in_change());

        // Once applied, a proposal's keys leave the overlay, except those a later one wrote.
        overlay.settle(1, Ok(()));
        overlay.begin();
        assert_eq!(overlay.get(Cf::Dentries, b"c").unwrap(), None);
        assert_eq!(overlay.get(Cf::Dentries, b"b").unwrap(), Some(Some(b"3".to_vec())));
        overlay.settle(2, Ok(()));
        assert_eq!(overlay.get(Cf::Dentries, b"b").unwrap(), None);
        end(&overlay, Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn a_change_answers_once_what_it_read_is_applied_and_fails_if_that_failed() {
        let overlay = Arc::new(Overlay::default());
        let first = propose(&overlay, vec![put("x", "1")]);
        // Another thread's change reads the proposal, then waits for it at its end.
        let reader = {
            let overlay = overlay.clone();
            std::thread::spawn(move || {
                overlay.begin();
                assert_eq!(overlay.get(Cf::Dentries, b"x").unwrap(), Some(Some(b"1".to_vec())));
                end(&overlay, Duration::from_secs(10))
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!reader.is_finished(), "a change answered before what it read was applied");
        overlay.settle(first, Ok(()));
        reader.join().unwrap().unwrap();

        // A change that read a proposal that then failed fails too, as does every later read
        // or proposal of this namespace; one that read only what was applied before does not.
        let second = propose(&overlay, vec![put("y", "1")]);
        overlay.begin();
        assert_eq!(overlay.get(Cf::Dentries, b"y").unwrap(), Some(Some(b"1".to_vec())));
        overlay.settle(second, Err(CairnError::unavailable("no quorum")));
        let e = end(&overlay, Duration::from_secs(1)).unwrap_err();
        assert!(e.message().contains("no quorum"), "{e}");
        overlay.wait(first, Duration::from_secs(1)).unwrap();
        overlay.begin();
        assert!(overlay.get(Cf::Dentries, b"z").is_err());
        overlay.abandon();
        assert!(overlay.propose(vec![put("z", "1")], |_, _| Ok::<(), ()>(())).is_err());

        // Waiting for a proposal nobody answers times out.
        let other = Arc::new(Overlay::default());
        let seq = propose(&other, vec![put("q", "1")]);
        let e = other.wait(seq, Duration::from_millis(50)).unwrap_err();
        assert!(e.message().contains("not committed within"), "{e}");
    }

    #[test]
    fn nested_changes_wait_at_the_outermost_end() {
        let overlay = Arc::new(Overlay::default());
        overlay.begin();
        overlay.begin();
        let seq = propose(&overlay, vec![put("n", "1")]);
        // The inner end returns at once; the outer one waits for the proposal.
        end(&overlay, Duration::from_millis(10)).unwrap();
        assert!(overlay.in_change());
        assert!(end(&overlay, Duration::from_millis(50)).is_err(), "the outer end waits for the proposal");
        overlay.settle(seq, Ok(()));
        overlay.begin();
        propose(&overlay, vec![put("m", "1")]);
        overlay.settle(seq + 1, Ok(()));
        end(&overlay, Duration::from_millis(50)).unwrap();
    }
}
