//! How far ahead of a sequential reader an open file's stripes are fetched.
//!
//! Each open file starts [`BASE_STRIPES`] stripes ahead of its reader. Whenever the reader
//! reaches a stripe whose read-ahead fetch is still running (the fetches are not keeping up
//! with it), the file's window doubles, up to the mount's per-file limit and as far as the
//! mount-wide budget allows. So a window grows to about the reader's rate times the time a
//! stripe takes to fetch — the stripes needed to keep the reader fed — and no further; a slow
//! reader, or one whose chunkservers answer fast, stays at the base window. What a file was
//! granted beyond the base goes back to the budget when the file is dropped (last close).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics;
use crate::stripe_cache::REORDERED;

/// Stripes fetched ahead of every sequential reader, before any growth.
pub const BASE_STRIPES: u64 = 2;

/// The most a reader of one file may have fetched ahead unless told otherwise, MiB.
pub const DEFAULT_READAHEAD_MIB: u64 = 64;

/// The mount-wide read-ahead budget is this many times the per-file limit: a few readers at
/// full window at once (e.g. the threads of a data loader), not one per open file.
const BUDGET_FILES: u64 = 8;

/// The mount's read-ahead limits, shared by its open files.
#[derive(Debug)]
pub struct Readahead {
    /// The most one file may have fetched ahead, bytes.
    per_file: u64,
    /// Bytes the windows of all open files may still grow by (beyond their base).
    left: AtomicI64,
}

impl Readahead {
    /// Limits of `per_file` bytes per file (0: no read-ahead beyond the base window) and
    /// [`BUDGET_FILES`] times that for the mount.
    pub fn new(per_file: u64) -> Arc<Readahead> {
        let budget = per_file.saturating_mul(BUDGET_FILES).min(i64::MAX as u64) as i64;
        Arc::new(Readahead { per_file, left: AtomicI64::new(budget) })
    }

    /// Take up to `want` bytes from the budget; returns what was taken (a multiple of `unit`).
    fn take(&self, want: u64, unit: u64) -> u64 {
        let mut left = self.left.load(Ordering::Acquire);
        loop {
            let can = (left.max(0) as u64).min(want) / unit * unit;
            if can == 0 {
                return 0;
            }
            match self.left.compare_exchange(left, left - can as i64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    ::metrics::gauge!(metrics::READAHEAD_BYTES).increment(can as f64);
                    return can;
                }
                Err(now) => left = now,
            }
        }
    }

    fn give(&self, bytes: u64) {
        if bytes > 0 {
            self.left.fetch_add(bytes as i64, Ordering::AcqRel);
            ::metrics::gauge!(metrics::READAHEAD_BYTES).decrement(bytes as f64);
        }
    }
}

/// One open file's read-ahead window.
#[derive(Debug)]
pub struct Window {
    pool: Arc<Readahead>,
    stripe_bytes: u64,
    /// Stripes fetched ahead of the reader.
    stripes: AtomicU64,
    /// The last stripe read-ahead has been started for (so each stripe is asked for once).
    started_to: AtomicU64,
}

impl Window {
    pub fn new(pool: Arc<Readahead>, stripe_bytes: u64) -> Window {
        Window { pool, stripe_bytes, stripes: AtomicU64::new(BASE_STRIPES), started_to: AtomicU64::new(0) }
    }

    /// Stripes to keep fetched ahead of the reader now.
    pub fn stripes(&self) -> u64 {
        self.stripes.load(Ordering::Acquire)
    }

    /// The stripes after `last` (which the reader just read) that read-ahead has not started
    /// yet, up to the window; they count as started from now on. A late request for an
    /// earlier stripe (the kernel's requests come in any order) starts nothing again; a reader
    /// that went back further than requests come out of order starts a new stream.
    pub fn next_range(&self, last: u64) -> std::ops::RangeInclusive<u64> {
        let to = last + self.stripes();
        let max_behind = (REORDERED / self.stripe_bytes.max(1)).max(BASE_STRIPES);
        if self.started_to.load(Ordering::Acquire) > to + max_behind {
            self.started_to.store(to, Ordering::Release);
            return last + 1..=to;
        }
        let before = self.started_to.fetch_max(to, Ordering::AcqRel);
        before.max(last) + 1..=to
    }

    /// The reader had to wait for a stripe read-ahead was still fetching: double the window, as
    /// far as the per-file limit and the mount's budget allow.
    pub fn stalled(&self) {
        ::metrics::counter!(metrics::READAHEAD_STALLS).increment(1);
        let now = self.stripes();
        let limit = (self.pool.per_file / self.stripe_bytes).max(BASE_STRIPES);
        let want = (now * 2).min(limit);
        if want <= now {
            return;
        }
        let got = self.pool.take((want - now) * self.stripe_bytes, self.stripe_bytes);
        // Two readers that stall at once grow it once: the second gives its share back.
        if got > 0
            && self
                .stripes
                .compare_exchange(now, now + got / self.stripe_bytes, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            self.pool.give(got);
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        let grown = self.stripes.load(Ordering::Acquire).saturating_sub(BASE_STRIPES);
        self.pool.give(grown * self.stripe_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_stalled_reader_doubles_its_window_up_to_the_per_file_limit() {
        let pool = Readahead::new(64 * MIB);
        let w = Window::new(pool.clone(), 4 * MIB);
        assert_eq!(w.stripes(), 2);
        let seen: Vec<u64> = (0..6)
            .map(|_| {
                w.stalled();
                w.stripes()
            })
            .collect();
        assert_eq!(seen, [4, 8, 16, 16, 16, 16]);
        assert_eq!(pool.left.load(Ordering::Acquire), (8 * 64 - 56) as i64 * MIB as i64);
        drop(w);
        assert_eq!(pool.left.load(Ordering::Acquire), 8 * 64 * MIB as i64, "given back at drop");
    }

    #[test]
    fn readers_stalling_at_once_never_grow_it_past_the_limit_nor_lose_budget() {
        let pool = Readahead::new(64 * MIB);
        let w = Window::new(pool.clone(), 4 * MIB);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| (0..100).for_each(|_| w.stalled()));
            }
        });
        assert_eq!(w.stripes(), 16);
        assert_eq!(pool.left.load(Ordering::Acquire), (8 * 64 - 56) as i64 * MIB as i64);
    }

    #[test]
    fn windows_share_the_mount_budget() {
        // 8 MiB per file and 64 MiB for the mount, stripes of 2 MiB: each window may grow by
        // 4 MiB (2 → 4 stripes), so sixteen files spend the budget and the seventeenth stays
        // at its base until some of them are closed.
        let pool = Readahead::new(8 * MIB);
        let windows: Vec<Window> = (0..16).map(|_| Window::new(pool.clone(), 2 * MIB)).collect();
        for w in &windows {
            w.stalled();
            w.stalled();
        }
        assert!(windows.iter().all(|w| w.stripes() == 4));
        let late = Window::new(pool.clone(), 2 * MIB);
        late.stalled();
        assert_eq!(late.stripes(), 2, "budget spent");
        drop(windows);
        late.stalled();
        assert_eq!(late.stripes(), 4, "budget given back by the closed files");
    }

    #[test]
    fn a_budget_of_zero_keeps_the_base_window() {
        let pool = Readahead::new(0);
        let w = Window::new(pool, 4 * MIB);
        w.stalled();
        assert_eq!(w.stripes(), BASE_STRIPES);
    }

    #[test]
    fn each_stripe_is_started_once_and_a_reader_that_jumps_starts_over() {
        let w = Window::new(Readahead::new(64 * MIB), 4 * MIB);
        assert_eq!(w.next_range(0), 1..=2);
        assert!(w.next_range(0).is_empty(), "nothing new within the same stripe");
        assert_eq!(w.next_range(1), 3..=3);
        w.stalled();
        assert_eq!(w.next_range(2), 4..=6, "the window grew to 4");
        assert!(w.next_range(1).is_empty(), "a late request for an earlier stripe");
        assert_eq!(w.next_range(40), 41..=44, "jumped ahead");
        assert!(w.next_range(30).is_empty(), "ten stripes behind: out of order, not back");
        assert_eq!(w.next_range(10), 11..=14, "went back thirty: a new stream");
    }
}
