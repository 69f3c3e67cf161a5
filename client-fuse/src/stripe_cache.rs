//! An open file's whole stripes for sequential readers: the stripe the reader is in, those
//! read-ahead fetched before it, and a few behind it.
//!
//! What is kept follows the reader's position (the furthest stripe a reader asked for), not
//! the order stripes were fetched: the kernel's read-ahead has several requests of one file in
//! flight and they arrive in any order, so a stripe some of whose requests are still to come
//! must stay even while read-ahead fetches far past it (evicting it would fetch it again, and
//! that fetch would evict the next: a cascade). The span kept behind grows to the furthest
//! behind a request has come, within [`MAX_BEHIND`].

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::stripe::Pieces;

/// A stripe's bytes, fetched once and shared by whoever waits for them.
pub type Cell = Arc<OnceCell<Pieces>>;

/// Stripes kept behind the reader's position at first.
const MIN_BEHIND: u64 = 2;
/// The most stripes kept behind it (requests that far behind are served, just not cached).
const MAX_BEHIND: u64 = 16;

#[derive(Debug)]
pub struct StripeCache {
    entries: BTreeMap<u64, Entry>,
    /// The furthest stripe a reader asked for.
    front: u64,
    /// Stripes kept behind `front`.
    behind: u64,
}

#[derive(Debug)]
struct Entry {
    version: u64,
    cell: Cell,
    /// Started by read-ahead, and no reader has asked for it yet.
    ahead: bool,
}

impl Default for StripeCache {
    fn default() -> Self {
        StripeCache { entries: BTreeMap::new(), front: 0, behind: MIN_BEHIND }
    }
}

impl StripeCache {
    /// The cell of stripe `index` at `version`, created if missing or of another version
    /// (`ahead`: by read-ahead).
    pub fn cell(&mut self, index: u64, version: u64, ahead: bool) -> Cell {
        match self.entries.get(&index) {
            Some(e) if e.version == version => e.cell.clone(),
            _ => {
                let cell: Cell = Arc::new(OnceCell::new());
                self.entries.insert(index, Entry { version, cell: cell.clone(), ahead });
                cell
            }
        }
    }

    /// The cell a reader of stripe `index` waits on, and whether read-ahead started it and has
    /// not filled it yet (told once per stripe: the reader caught up with read-ahead). Moves
    /// the reader's position and drops what fell out of the kept span, `window` stripes ahead.
    pub fn for_reader(&mut self, index: u64, version: u64, window: u64) -> (Cell, bool) {
        if index >= self.front {
            self.front = index;
        } else if self.front - index <= MAX_BEHIND {
            self.behind = self.behind.max(self.front - index);
        } else {
            // Went back: a new stream starts here.
            self.front = index;
            self.behind = MIN_BEHIND;
        }
        let (low, high) = (self.front.saturating_sub(self.behind), self.front + window);
        self.entries.retain(|&i, _| i >= low && i <= high);
        if let Some(e) = self.entries.get_mut(&index).filter(|e| e.version == version) {
            let caught_up = e.ahead && !e.cell.initialized();
            e.ahead = false;
            return (e.cell.clone(), caught_up);
        }
        let cell = self.cell(index, version, false);
        if index < low {
            // Too far behind to keep: served from this cell, not cached.
            self.entries.remove(&index);
        }
        (cell, false)
    }

    pub fn forget(&mut self, index: u64) {
        self.entries.remove(&index);
    }

    #[cfg(test)]
    fn kept(&self) -> Vec<u64> {
        self.entries.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripe_still_being_read_stays_while_read_ahead_runs_far_past_it() {
        // Each stripe's last request comes in when the reader is already four stripes further,
        // while read-ahead keeps sixteen ahead. Only the late requests that came before the
        // span behind had grown to four (stripes 0 and 1, dropped while it was two) find their
        // stripe gone and fetch it again.
        let mut c = StripeCache::default();
        let mut fetched = std::collections::HashMap::<u64, Vec<Cell>>::new();
        for front in 0..40u64 {
            for i in [Some(front), front.checked_sub(4)].into_iter().flatten() {
                let (cell, _) = c.for_reader(i, 1, 16);
                let seen = fetched.entry(i).or_default();
                if !seen.iter().any(|s| Arc::ptr_eq(s, &cell)) {
                    seen.push(cell);
                }
            }
            for a in front + 1..=front + 16 {
                c.cell(a, 1, true);
            }
        }
        let mut refetched: Vec<u64> = fetched.iter().filter(|(_, v)| v.len() > 1).map(|(i, _)| *i).collect();
        refetched.sort();
        assert_eq!(refetched, vec![0, 1]);
    }

    #[test]
    fn the_reader_moving_on_drops_what_is_behind() {
        let mut c = StripeCache::default();
        for i in 0..40 {
            c.for_reader(i, 1, 4);
            for a in i + 1..=i + 4 {
                c.cell(a, 1, true);
            }
        }
        assert_eq!(c.kept(), (37..=43).collect::<Vec<_>>(), "2 behind, the reader's, 4 ahead");
    }

    #[test]
    fn read_ahead_is_reported_once_and_only_while_unfilled() {
        let mut c = StripeCache::default();
        let one = c.cell(1, 7, true);
        assert!(c.for_reader(1, 7, 2).1, "waiting for read-ahead");
        assert!(!c.for_reader(1, 7, 2).1, "once");
        let two = c.cell(2, 7, true);
        two.set(Pieces::default()).unwrap();
        assert!(!c.for_reader(2, 7, 2).1, "already filled: no wait");
        assert!(!c.for_reader(3, 7, 2).1, "not read ahead");
        drop(one);
    }

    #[test]
    fn a_new_version_replaces_the_old_and_a_jump_back_starts_over() {
        let mut c = StripeCache::default();
        let old = c.for_reader(5, 1, 2).0;
        let new = c.for_reader(5, 2, 2).0;
        assert!(!Arc::ptr_eq(&old, &new));
        c.for_reader(100, 1, 2);
        assert_eq!(c.kept(), vec![100], "jumped ahead");
        c.for_reader(3, 1, 2);
        assert_eq!(c.kept(), vec![3], "jumped back: a new stream");
        c.for_reader(4, 1, 2);
        assert_eq!(c.kept(), vec![3, 4]);
    }
}
