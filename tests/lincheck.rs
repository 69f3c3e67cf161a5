//! A linearizability checker for the history of one register (Wing and Gong's search with
//! Lowe's memoization, the algorithm Knossos and Porcupine use), so an end-to-end test can
//! record what concurrent clients did and were told, failovers included, and ask whether one
//! register that is read and written atomically could have told them that.
//!
//! A history is a list of operations, each with the instants it was invoked and returned. It is
//! linearizable if every operation can be given a point between its invoke and its return such
//! that, taken in the order of those points, the writes and reads make sense for one register.
//! Independent registers (several keys) are checked one at a time.
//!
//! The search keeps the invokes and returns in time order in a linked list and repeatedly tries
//! to place next ("linearize") an operation whose invoke comes before the first return still in
//! the list; when it reaches a return whose operation it could not place, it undoes the last
//! placement and tries the next candidate. A configuration (the set of placed operations as a
//! bitset, and the register's value) is explored at most once: the cache of seen
//! configurations turns the exponential search into one that is close to linear in the length
//! of the history when few operations run at once.
//!
//! A write that failed or timed out ([`Outcome::Unknown`]) may have taken effect at any point
//! after its invoke, or never: it has no return in the list, so the search may place it anywhere
//! after its invoke and need not place it at all. A write whose value no read returned cannot
//! change what any read saw, so it is dropped before the search (this keeps failovers, where a
//! few writes end unknown, from doubling the configurations for the rest of the history). An
//! unknown read says nothing and is dropped too.

use std::collections::HashSet;
use std::fmt;
use std::time::Instant;

/// What an operation did to the register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Set the register to this value.
    Write(u64),
    /// Read the register and got this value.
    Read(u64),
}

/// What the client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded (for a read: the value in [`Kind::Read`] is what it returned).
    Ok,
    /// It failed or timed out: a write may or may not have taken effect.
    Unknown,
}

/// One operation of a history.
#[derive(Clone, Debug)]
pub struct Op {
    /// Which client (thread) did it; only for explanations.
    pub process: usize,
    pub kind: Kind,
    pub invoke: Instant,
    /// When the answer came back (for an unknown write: when the error did).
    pub ret: Instant,
    pub outcome: Outcome,
}

impl Op {
    /// `process 2 write 17 [1204.512 ms, 1209.003 ms]`, times after `t0`.
    pub fn describe(&self, t0: Instant) -> String {
        let (what, value) = match self.kind {
            Kind::Write(v) => ("write", v),
            Kind::Read(v) => ("read", v),
        };
        let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e3;
        let unknown = if self.outcome == Outcome::Unknown { " (failed: unknown)" } else { "" };
        format!(
            "process {} {what} {value} [{:.3} ms, {:.3} ms]{unknown}",
            self.process,
            ms(self.invoke),
            ms(self.ret)
        )
    }
}

/// A history the checker accepted.
#[derive(Debug)]
pub struct Checked {
    /// Operations searched (after dropping unknown reads and unobserved unknown writes).
    pub ops: usize,
    /// Configurations explored: a measure of the work, independent of the machine.
    pub explored: usize,
}

/// A history with no linearization, and how far the search got.
#[derive(Debug)]
pub struct NotLinearizable {
    pub explanation: String,
    pub explored: usize,
}

impl fmt::Display for NotLinearizable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explanation)
    }
}

/// Check a history of one register that held `initial` before the first operation.
pub fn check(initial: u64, history: &[Op]) -> Result<Checked, NotLinearizable> {
    let observed: HashSet<u64> = history
        .iter()
        .filter_map(|op| match (op.kind, op.outcome) {
            (Kind::Read(v), Outcome::Ok) => Some(v),
            _ => None,
        })
        .collect();
    let ops: Vec<&Op> = history
        .iter()
        .filter(|op| match (op.kind, op.outcome) {
            (_, Outcome::Ok) => true,
            (Kind::Write(v), Outcome::Unknown) => observed.contains(&v),
            (Kind::Read(_), Outcome::Unknown) => false,
        })
        .collect();
    let mut search = Search::new(initial, &ops);
    if search.run() {
        Ok(Checked { ops: ops.len(), explored: search.seen.len() })
    } else {
        Err(NotLinearizable { explanation: search.explain(history), explored: search.seen.len() })
    }
}

/// The register as a sequential object: the value after `op`, or `None` if `op` cannot happen
/// when the register holds `value`.
fn step(value: u64, op: Kind) -> Option<u64> {
    match op {
        Kind::Write(v) => Some(v),
        Kind::Read(v) => (v == value).then_some(value),
    }
}

/// The state of one search. Nodes of the event list are `1..=events`; node 0 is its head and
/// node `events + 1` its tail.
struct Search<'a> {
    ops: &'a [&'a Op],
    initial: u64,
    /// The operation of each node, and whether the node is its return (else its invoke).
    node_op: Vec<(usize, bool)>,
    next: Vec<usize>,
    prev: Vec<usize>,
    call_node: Vec<usize>,
    /// `None` for an unknown write: it never returns.
    ret_node: Vec<Option<usize>>,
    /// The operations placed so far, as a bitset.
    placed: Vec<u64>,
    value: u64,
    /// Placed operations in order, with the value the register held before each.
    stack: Vec<(usize, u64)>,
    seen: HashSet<(Vec<u64>, u64)>,
    /// The longest order found, and the operation that could not follow it (with the value).
    best: Vec<usize>,
    stuck: Option<(usize, u64)>,
}

impl<'a> Search<'a> {
    fn new(initial: u64, ops: &'a [&'a Op]) -> Search<'a> {
        // Invokes before returns at the same instant: such operations count as overlapping.
        let mut events: Vec<(Instant, bool, usize)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            events.push((op.invoke, false, i));
            if op.outcome == Outcome::Ok {
                events.push((op.ret, true, i));
            }
        }
        events.sort();
        let tail = events.len() + 1;
        let mut node_op = vec![(usize::MAX, false); tail + 1];
        let mut call_node = vec![0; ops.len()];
        let mut ret_node = vec![None; ops.len()];
        for (n, &(_, is_return, op)) in events.iter().enumerate() {
            let node = n + 1;
            node_op[node] = (op, is_return);
            if is_return {
                ret_node[op] = Some(node);
            } else {
                call_node[op] = node;
            }
        }
        Search {
            ops,
            initial,
            node_op,
            next: (1..=tail + 1).collect(),
            prev: (0..=tail).map(|n| n.saturating_sub(1)).collect(),
            call_node,
            ret_node,
            placed: vec![0; ops.len().div_ceil(64)],
            value: initial,
            stack: Vec::new(),
            seen: HashSet::new(),
            best: Vec::new(),
            stuck: None,
        }
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    /// Put back a node unlinked last (dancing links: in the reverse order of unlinking).
    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        self.prev[n] = node;
    }

    fn flip(&mut self, op: usize) {
        self.placed[op / 64] ^= 1 << (op % 64);
    }

    fn run(&mut self) -> bool {
        let tail = self.node_op.len() - 1;
        let mut returns_left = self.ret_node.iter().filter(|r| r.is_some()).count();
        let mut node = self.next[0];
        loop {
            // What is left unplaced are unknown writes, free to never take effect.
            if returns_left == 0 {
                return true;
            }
            assert!(node != tail, "a return is left in the list, so the scan meets it first");
            let (op, is_return) = self.node_op[node];
            if !is_return {
                if let Some(after) = step(self.value, self.ops[op].kind) {
                    self.flip(op);
                    if self.seen.insert((self.placed.clone(), after)) {
                        self.stack.push((op, self.value));
                        self.value = after;
                        self.unlink(self.call_node[op]);
                        if let Some(r) = self.ret_node[op] {
                            self.unlink(r);
                            returns_left -= 1;
                        }
                        if self.stack.len() > self.best.len() {
                            self.best = self.stack.iter().map(|&(op, _)| op).collect();
                            self.stuck = None;
                        }
                        node = self.next[0];
                        continue;
                    }
                    self.flip(op);
                }
                node = self.next[node];
                continue;
            }
            // The return of an operation that could not be placed: undo the last placement.
            if self.stack.len() == self.best.len() && self.stuck.is_none() {
                self.stuck = Some((op, self.value));
            }
            let Some((last, before)) = self.stack.pop() else { return false };
            self.value = before;
            self.flip(last);
            if let Some(r) = self.ret_node[last] {
                self.relink(r);
                returns_left += 1;
            }
            self.relink(self.call_node[last]);
            node = self.next[self.call_node[last]];
        }
    }

    /// Why the history failed: the longest order found, and the operation that could not
    /// follow it.
    fn explain(&self, history: &[Op]) -> String {
        let t0 = history.iter().map(|op| op.invoke).min().expect("a failed history has operations");
        let reads = self.ops.iter().filter(|op| matches!(op.kind, Kind::Read(_))).count();
        let unknown = self.ops.iter().filter(|op| op.outcome == Outcome::Unknown).count();
        let mut out = format!(
            "not linearizable: of {} operations ({reads} reads, {} writes, {unknown} of them unknown), at \
             most {} can be put in an order that respects real time and the register (initial value {})",
            self.ops.len(),
            self.ops.len() - reads,
            self.best.len(),
            self.initial
        );
        let mut value = self.initial;
        // The order's last few operations (the ones before them are not in question).
        let skipped = self.best.len().saturating_sub(8);
        if !self.best.is_empty() {
            out.push_str("; that order");
            if skipped > 0 {
                out.push_str(&format!(", after {skipped} more,"));
            }
            out.push_str(" ends with");
        }
        for (i, &op) in self.best.iter().enumerate() {
            value = step(value, self.ops[op].kind).expect("the best order is a valid one");
            if i >= skipped {
                out.push_str(&format!("\n  {}", self.ops[op].describe(t0)));
            }
        }
        let Some((op, at)) = self.stuck else { return out };
        debug_assert_eq!(at, value);
        let stuck = self.ops[op];
        out.push_str(&format!(
            "\nthe register then holds {value}, and next must come\n  {}",
            stuck.describe(t0)
        ));
        if let Kind::Read(v) = stuck.kind {
            let writers: Vec<String> = history
                .iter()
                .filter(|w| w.kind == Kind::Write(v))
                .map(|w| format!("\n  {}", w.describe(t0)))
                .collect();
            if writers.is_empty() && v != self.initial {
                out.push_str(&format!("\nwhich reads {v}: no write wrote that value"));
            } else if writers.is_empty() {
                out.push_str(&format!("\nwhich reads {v}, the initial value, after a write replaced it"));
            } else {
                out.push_str(&format!("\nwhich reads {v}, written by{}", writers.concat()));
            }
        } else {
            out.push_str("\nand every way to place it leads to an order already found dead");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::support::Rng;
    use Kind::{Read, Write};

    /// An operation of a hand-written history, times in milliseconds after `t0`.
    fn op(t0: Instant, process: usize, kind: Kind, invoke: u64, ret: u64) -> Op {
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        Op { process, kind, invoke: at(invoke), ret: at(ret), outcome: Outcome::Ok }
    }

    fn unknown(mut op: Op) -> Op {
        op.outcome = Outcome::Unknown;
        op
    }

    #[test]
    fn sequential_operations_pass() {
        let t = Instant::now();
        let history = [
            op(t, 0, Read(0), 0, 1),
            op(t, 0, Write(1), 2, 3),
            op(t, 1, Read(1), 4, 5),
            op(t, 1, Write(2), 6, 7),
            op(t, 0, Read(2), 8, 9),
        ];
        check(0, &history).unwrap();
        check(0, &[]).unwrap();
    }

    #[test]
    fn overlapping_writes_may_be_read_in_either_order() {
        let t = Instant::now();
        // Writes of 1 and 2 overlap, and so do two reads of 1 and 2 while they run: either
        // write may have come last, and two later reads agree on which.
        for last in [1, 2] {
            let history = [
                op(t, 0, Write(1), 0, 10),
                op(t, 1, Write(2), 2, 12),
                op(t, 2, Read(1), 3, 9),
                op(t, 3, Read(2), 5, 11),
                op(t, 2, Read(last), 20, 21),
                op(t, 3, Read(last), 22, 23),
            ];
            check(0, &history).unwrap();
        }
        // But not both: once 2 was read after 1, no later read sees 1 again.
        let history = [
            op(t, 0, Write(1), 0, 10),
            op(t, 1, Write(2), 2, 12),
            op(t, 2, Read(2), 20, 21),
            op(t, 3, Read(1), 22, 23),
        ];
        check(0, &history).unwrap_err();
    }

    #[test]
    fn a_stale_read_fails() {
        let t = Instant::now();
        let history = [op(t, 0, Write(1), 0, 1), op(t, 0, Write(2), 2, 3), op(t, 1, Read(1), 4, 5)];
        let e = check(0, &history).unwrap_err();
        println!("{e}");
        assert!(e.explanation.contains("process 1 read 1 [4.000 ms, 5.000 ms]"), "{e}");
        assert!(e.explanation.contains("written by\n  process 0 write 1"), "{e}");
    }

    #[test]
    fn a_read_of_a_value_never_written_fails() {
        let t = Instant::now();
        let history = [op(t, 0, Write(1), 0, 10), op(t, 1, Read(7), 2, 8)];
        let e = check(0, &history).unwrap_err();
        assert!(e.explanation.contains("no write wrote that value"), "{e}");
        // Nor the initial value once it was replaced.
        let history = [op(t, 0, Write(1), 0, 1), op(t, 1, Read(0), 2, 3)];
        let e = check(0, &history).unwrap_err();
        assert!(e.explanation.contains("the initial value"), "{e}");
    }

    #[test]
    fn an_unknown_write_may_have_taken_effect_late_or_not_at_all() {
        let t = Instant::now();
        // It failed at 2 ms, but a read long after sees it: it took effect after all.
        let took_effect = [
            unknown(op(t, 0, Write(1), 0, 2)),
            op(t, 1, Read(0), 10, 11),
            op(t, 1, Read(1), 20, 21),
            op(t, 1, Read(1), 30, 31),
        ];
        check(0, &took_effect).unwrap();
        // Never seen: it never took effect.
        let never = [unknown(op(t, 0, Write(1), 0, 2)), op(t, 1, Read(0), 10, 11), op(t, 1, Read(0), 20, 21)];
        check(0, &never).unwrap();
        // Still not before its invoke, and not twice.
        let early = [op(t, 1, Read(1), 0, 1), unknown(op(t, 0, Write(1), 2, 3))];
        check(0, &early).unwrap_err();
        let twice = [
            unknown(op(t, 0, Write(1), 0, 2)),
            op(t, 1, Read(1), 10, 11),
            op(t, 1, Write(2), 12, 13),
            op(t, 1, Read(1), 14, 15),
        ];
        check(0, &twice).unwrap_err();
        // An unknown read says nothing.
        let read = [op(t, 0, Write(1), 0, 1), unknown(op(t, 1, Read(5), 2, 3))];
        check(0, &read).unwrap();
    }

    /// A linearizable history of `processes` clients doing `ops` operations in all: each
    /// operation takes effect at a random point between its invoke and its return, and reads
    /// return what the register held at theirs. A few writes fail (unknown), half of them
    /// having taken effect.
    fn random_history(seed: u64, processes: usize, ops: usize) -> (Instant, Vec<Op>) {
        let t0 = Instant::now();
        let mut rng = Rng(seed);
        // (effect point, process, is write, invoke, return, unknown), times in microseconds.
        let mut planned = Vec::new();
        let mut clock = vec![0u64; processes];
        for i in 0..ops {
            let p = i % processes;
            let invoke = clock[p] + rng.below(300);
            let ret = invoke + 1 + rng.below(1_000);
            clock[p] = ret;
            let effect = invoke + rng.below(ret - invoke + 1);
            let fails = rng.below(50) == 0;
            planned.push((effect, p, rng.below(2) == 0 || fails, invoke, ret, fails));
        }
        planned.sort();
        let mut value = 0;
        let mut next = 1;
        let at = |us: u64| t0 + Duration::from_micros(us);
        let history = planned
            .into_iter()
            .map(|(_, process, write, invoke, ret, fails)| {
                let kind = if write {
                    // A failed write took effect or not, at random.
                    next += 1;
                    if !fails || rng.below(2) == 0 {
                        value = next;
                    }
                    Write(next)
                } else {
                    Read(value)
                };
                let outcome = if fails { Outcome::Unknown } else { Outcome::Ok };
                Op { process, kind, invoke: at(invoke), ret: at(ret), outcome }
            })
            .collect();
        (t0, history)
    }

    #[test]
    fn a_thousand_operations_of_four_processes_check_quickly() {
        for seed in 0..5 {
            let (_, history) = random_history(seed, 4, 1_000);
            let started = Instant::now();
            let checked = check(0, &history).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            println!("seed {seed}: {checked:?} in {:?}", started.elapsed());
            // The work, not the time: a few configurations per operation.
            assert!(checked.explored < 20 * history.len(), "seed {seed}: {checked:?}");
        }
    }

    #[test]
    fn one_stale_read_in_a_thousand_operations_is_found() {
        let (t0, mut history) = random_history(7, 4, 1_000);
        // A read late in the history returns the value of an early completed write.
        let (old, at) = history
            .iter()
            .filter(|op| op.outcome == Outcome::Ok && op.ret > t0 + Duration::from_millis(5))
            .find_map(|op| match op.kind {
                Write(v) => Some((v, op.ret)),
                Read(_) => None,
            })
            .expect("an early write");
        let later_write = history
            .iter()
            .filter(|op| op.outcome == Outcome::Ok && op.invoke > at)
            .find(|op| matches!(op.kind, Write(_)))
            .map(|op| op.ret)
            .expect("a later write");
        let stale = history
            .iter_mut()
            .rev()
            .find(|op| matches!(op.kind, Read(_)) && op.invoke > later_write)
            .expect("a late read");
        stale.kind = Read(old);
        let started = Instant::now();
        let e = check(0, &history).unwrap_err();
        println!("found in {:?}, {} configurations:\n{e}", started.elapsed(), e.explored);
        assert!(e.explored < 20 * history.len(), "{}", e.explored);
        assert!(e.explanation.contains(&format!("read {old} [")), "{e}");
    }
}
