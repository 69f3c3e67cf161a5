//! An open file's whole stripes for sequential readers: those read-ahead fetched before the
//! reader, the ones it is in, and a couple behind it.
//!
//! What is kept follows the reader's position (the furthest stripe a reader asked for), not
//! the order stripes were fetched: the kernel's read-ahead has several requests of one file in
//! flight and they arrive in any order, so a stripe some of whose bytes are still to be asked
//! for must stay even while read-ahead fetches far past it (evicting it would fetch it again,
//! and that fetch would evict the next: a cascade). So a stripe behind the reader is dropped
//! once every byte of it has been served (or it is more than [`REORDERED`] bytes behind);
//! [`MIN_BEHIND`] served ones stay for readers that go back a little.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::stripe::Pieces;

/// A stripe's bytes, fetched once and shared by whoever waits for them.
pub type Cell = Arc<OnceCell<Pieces>>;

/// Served stripes kept behind the reader's position.
const MIN_BEHIND: u64 = 2;
/// How far behind the furthest request of a sequential stream another may come and still
/// belong to it, bytes: the kernel has at most 64 FUSE requests of up to 1 MiB in flight,
/// answered in any order. Stripes further behind the reader are not kept.
pub const REORDERED: u64 = 64 << 20;

#[derive(Debug)]
pub struct StripeCache {
    entries: BTreeMap<u64, Entry>,
    /// The furthest stripe a reader asked for.
    front: u64,
    /// The most stripes kept behind `front`.
    max_behind: u64,
}

#[derive(Debug)]
struct Entry {
    version: u64,
    cell: Cell,
    /// Started by read-ahead, and no reader has asked for it yet.
    ahead: bool,
    /// Bytes readers were served from it (a byte read twice counts twice).
    served: u64,
}

impl StripeCache {
    pub fn new(stripe_bytes: u64) -> StripeCache {
        let max_behind = (REORDERED / stripe_bytes.max(1)).max(MIN_BEHIND);
        StripeCache { entries: BTreeMap::new(), front: 0, max_behind }
    }

    /// The cell of stripe `index` at `version`, created if missing or of another version
    /// (`ahead`: by read-ahead).
    fn cell(&mut self, index: u64, version: u64, ahead: bool) -> Cell {
        match self.entries.get(&index) {
            Some(e) if e.version == version => e.cell.clone(),
            _ => {
                let cell: Cell = Arc::new(OnceCell::new());
                self.entries.insert(index, Entry { version, cell: cell.clone(), ahead, served: 0 });
                cell
            }
        }
    }

    /// The cell a reader of `bytes` bytes of stripe `index` waits on, and
    /// whether read-ahead started it and has not filled it yet (told once per stripe: the
    /// reader caught up with read-ahead). Moves the reader's position and drops what is no
    /// longer needed: stripes more than `window` ahead of it, served or too far behind it.
    pub fn for_reader(&mut self, index: u64, version: u64, bytes: u64, window: u64) -> (Cell, bool) {
        if index >= self.front || self.front - index > self.max_behind {
            // Forward, or back so far that a new stream starts here.
            self.front = index;
        }
        let (front, max_behind) = (self.front, self.max_behind);
        self.entries.retain(|&i, e| {
            let served = e.cell.get().is_some_and(|p| e.served >= p.len() as u64);
            i <= front + window && i + max_behind >= front && (i + MIN_BEHIND >= front || !served)
        });
        let (cell, caught_up) = match self.entries.get_mut(&index).filter(|e| e.version == version) {
            Some(e) => {
                let caught_up = e.ahead && !e.cell.initialized();
                e.ahead = false;
                (e.cell.clone(), caught_up)
            }
            None => (self.cell(index, version, false), false),
        };
        if let Some(e) = self.entries.get_mut(&index) {
            e.served += bytes;
        }
        (cell, caught_up)
    }

    /// The cell read-ahead fills for stripe `index` at `version`, or `None` where a reader has
    /// already reached it: such a stripe is cached, being read, or served and dropped, and a
    /// read-ahead started from a late request (the kernel's come in any order) must not fetch
    /// it again.
    pub fn ahead_cell(&mut self, index: u64, version: u64) -> Option<Cell> {
        (index > self.front).then(|| self.cell(index, version, true))
    }

    /// The furthest stripe a reader asked for.
    pub fn front(&self) -> u64 {
        self.front
    }

    /// Whether stripe `index` (any version) is cached or being fetched.
    pub fn holds(&self, index: u64) -> bool {
        self.entries.contains_key(&index)
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
    use bytes::Bytes;

    const STRIPE: u64 = 4 << 20;

    /// A reader's request for `bytes` of stripe `index`, as the file does it: the stripe is
    /// fetched if the cell is new (counted in `fetches`).
    fn read(c: &mut StripeCache, index: u64, bytes: u64, window: u64, fetches: &mut u64) -> bool {
        let (cell, caught_up) = c.for_reader(index, 1, bytes, window);
        if !cell.initialized() {
            *fetches += 1;
            cell.set(Pieces::from(Bytes::from(vec![0u8; STRIPE as usize]))).unwrap();
        }
        caught_up
    }

    /// Read-ahead as the file does it: cells for the `window` stripes after `last`, filled.
    fn read_ahead(c: &mut StripeCache, last: u64, window: u64) {
        for a in last + 1..=last + window {
            if let Some(cell) = c.ahead_cell(a, 1) {
                let _ = cell.set(Pieces::from(Bytes::from(vec![0u8; STRIPE as usize])));
            }
        }
    }

    #[test]
    fn a_stripe_still_being_read_stays_while_read_ahead_runs_far_past_it() {
        // Each stripe is read in four requests; the last of them comes when the reader is
        // already eight stripes further, while read-ahead keeps sixteen ahead.
        let mut c = StripeCache::new(STRIPE);
        let mut fetches = 0;
        let quarter = STRIPE / 4;
        for front in 0..60u64 {
            for _ in 0..3 {
                read(&mut c, front, quarter, 16, &mut fetches);
            }
            if let Some(late) = front.checked_sub(8) {
                read(&mut c, late, quarter, 16, &mut fetches);
            }
            read_ahead(&mut c, front, 16);
        }
        assert_eq!(fetches, 1, "only the first stripe is fetched by a reader, every other by read-ahead");
        assert!(c.kept().len() <= 8 + 1 + 16 + 2, "kept {:?}", c.kept());
    }

    #[test]
    fn served_stripes_behind_the_reader_are_dropped() {
        let mut c = StripeCache::new(STRIPE);
        let mut fetches = 0;
        for i in 0..40 {
            read(&mut c, i, STRIPE, 4, &mut fetches);
            read_ahead(&mut c, i, 4);
        }
        read(&mut c, 40, 1, 4, &mut fetches);
        read_ahead(&mut c, 40, 4);
        assert_eq!(c.kept(), (38..=44).collect::<Vec<_>>(), "2 behind, the reader's, 4 ahead");
        assert_eq!(fetches, 1);
    }

    #[test]
    fn read_ahead_from_a_late_request_fetches_nothing_the_reader_has_passed() {
        // The reader is at stripe 50 and has been served stripes 30..=49 whole (they are
        // dropped); a request for stripe 30 that came late starts read-ahead from there.
        let mut c = StripeCache::new(STRIPE);
        let mut fetches = 0;
        for i in 30..=50 {
            read(&mut c, i, STRIPE, 4, &mut fetches);
        }
        assert!(c.ahead_cell(31, 1).is_none(), "served and dropped: not fetched again");
        assert!(c.ahead_cell(49, 1).is_none(), "kept behind the reader: not started again");
        assert!(c.ahead_cell(50, 1).is_none(), "the reader's own stripe");
        assert!(c.ahead_cell(51, 1).is_some(), "ahead of the reader");
        assert_eq!(c.front(), 50);
    }

    #[test]
    fn read_ahead_is_reported_once_and_only_while_unfilled() {
        let mut c = StripeCache::new(STRIPE);
        let _one = c.cell(1, 7, true);
        assert!(c.for_reader(1, 7, 10, 2).1, "waiting for read-ahead");
        assert!(!c.for_reader(1, 7, 10, 2).1, "once");
        let two = c.cell(2, 7, true);
        two.set(Pieces::default()).unwrap();
        assert!(!c.for_reader(2, 7, 10, 2).1, "already filled: no wait");
        assert!(!c.for_reader(3, 7, 10, 2).1, "not read ahead");
    }

    #[test]
    fn a_new_version_replaces_the_old_and_a_jump_back_starts_over() {
        let mut c = StripeCache::new(STRIPE);
        let old = c.for_reader(5, 1, 10, 2).0;
        let new = c.for_reader(5, 2, 10, 2).0;
        assert!(!Arc::ptr_eq(&old, &new));
        c.for_reader(100, 1, 10, 2);
        assert_eq!(c.kept(), vec![100], "jumped ahead: what is 95 behind is dropped");
        c.for_reader(3, 1, 10, 2);
        assert_eq!(c.kept(), vec![3], "jumped back: a new stream");
        c.for_reader(4, 1, 10, 2);
        assert_eq!(c.kept(), vec![3, 4]);
    }
}
