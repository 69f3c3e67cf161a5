//! The tiering policy, as pure decisions over numbers the store hands in: when the SSD tier is
//! too full and how many bytes must leave it (watermarks), which shards leave first (least
//! recently used), and which HDD shards are hot enough to come back (read `promote_after_reads`
//! times within `promote_window`). Keeping it free of I/O lets the unit tests below drive it
//! with a [`ManualClock`].
//!
//! Times are milliseconds since the Unix epoch from an injected [`Clock`], so a shard's last
//! access can start from its file's mtime when the store opens.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_common::config::ChunkConfig;
use cairn_common::ShardId;

/// Where the store gets the time of accesses from.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_ms(SystemTime::now())
    }
}

/// Milliseconds since the Unix epoch of `t` (0 for times before it).
pub fn system_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `ms` milliseconds since the epoch.
    pub fn new(ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(ms))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The tiering settings of [`ChunkConfig`], validated there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierPolicy {
    /// Cap on SSD bytes over all SSD directories; `None`: what the filesystems hold.
    pub ssd_capacity: Option<u64>,
    pub high_watermark: f64,
    pub low_watermark: f64,
    /// HDD reads within the window that make a shard hot; 0 turns promotion off.
    pub promote_after_reads: u32,
    pub promote_window_ms: u64,
}

impl Default for TierPolicy {
    fn default() -> Self {
        TierPolicy::from_config(&ChunkConfig::default())
    }
}

impl TierPolicy {
    pub fn from_config(config: &ChunkConfig) -> TierPolicy {
        TierPolicy {
            ssd_capacity: config.ssd_capacity,
            high_watermark: config.ssd_high_watermark,
            low_watermark: config.ssd_low_watermark,
            promote_after_reads: config.promote_after_reads,
            promote_window_ms: config.promote_window_secs.saturating_mul(1000),
        }
    }

    fn fraction(capacity: u64, f: f64) -> u64 {
        (capacity as f64 * f) as u64
    }

    /// Bytes that must leave an SSD tier holding `used` of `capacity` bytes: none until use
    /// passes the high watermark, then enough to get back to the low watermark.
    pub fn demotion_goal(&self, used: u64, capacity: u64) -> u64 {
        if used <= Self::fraction(capacity, self.high_watermark) {
            return 0;
        }
        used - Self::fraction(capacity, self.low_watermark)
    }

    /// Bytes that may still be promoted into an SSD tier holding `used` of `capacity` bytes
    /// without passing the high watermark (so a promotion never causes a demotion).
    pub fn promotion_room(&self, used: u64, capacity: u64) -> u64 {
        Self::fraction(capacity, self.high_watermark).saturating_sub(used)
    }

    /// The shards to demote to free `goal` bytes: least recently accessed first (ties by id,
    /// so the order is stable), as few as cover the goal. `shards` are `(id, last access,
    /// file bytes)` of the SSD tier.
    pub fn pick_demotions(
        &self,
        shards: impl IntoIterator<Item = (ShardId, u64, u64)>,
        goal: u64,
    ) -> Vec<ShardId> {
        if goal == 0 {
            return Vec::new();
        }
        let mut shards: Vec<_> = shards.into_iter().collect();
        shards.sort_unstable_by_key(|&(id, at, _)| (at, id.ino, id.stripe, id.index, id.version));
        let mut freed = 0u64;
        let mut out = Vec::new();
        for (id, _, len) in shards {
            if freed >= goal {
                break;
            }
            freed += len;
            out.push(id);
        }
        out
    }

    /// The SSD shards to demote so that a hot HDD shard fits (`need` more bytes) on an SSD tier
    /// at its high watermark: only shards not read within `promote_window` (cold), least
    /// recently used first, as few as free `need`. `None` when the cold shards cannot free
    /// enough: then nothing is displaced, so a hot working set larger than the SSD tier does
    /// not thrash it. `shards` as for [`TierPolicy::pick_demotions`].
    pub fn pick_displacements(
        &self,
        shards: impl IntoIterator<Item = (ShardId, u64, u64)>,
        need: u64,
        now: u64,
    ) -> Option<Vec<ShardId>> {
        let cold: Vec<_> = shards
            .into_iter()
            .filter(|&(_, at, _)| now.saturating_sub(at) > self.promote_window_ms)
            .collect();
        let bytes: std::collections::HashMap<ShardId, u64> =
            cold.iter().map(|&(id, _, len)| (id, len)).collect();
        let picked = self.pick_demotions(cold, need);
        let freed: u64 = picked.iter().map(|id| bytes[id]).sum();
        (freed >= need && !picked.is_empty()).then_some(picked)
    }
}

/// Recent HDD reads of HDD shards, for the promotion rule. Only shards read from HDD have an
/// entry, each with at most `promote_after_reads` read times, so memory follows the HDD
/// working set, not the number of shards.
#[derive(Debug, Default)]
pub struct HotTracker {
    reads: HashMap<ShardId, VecDeque<u64>>,
}

impl HotTracker {
    /// Note a read of HDD shard `id` at `now`.
    pub fn record(&mut self, policy: &TierPolicy, id: ShardId, now: u64) {
        let keep = policy.promote_after_reads as usize;
        if keep == 0 {
            return;
        }
        let times = self.reads.entry(id).or_default();
        times.push_back(now);
        while times.len() > keep {
            times.pop_front();
        }
    }

    /// Whether `id`'s last `promote_after_reads` reads all fall within one window, the last
    /// of them no longer than a window before `now`.
    pub fn is_hot(&self, policy: &TierPolicy, id: &ShardId, now: u64) -> bool {
        let need = policy.promote_after_reads as usize;
        match self.reads.get(id) {
            Some(times) if need > 0 && times.len() >= need => {
                let (first, last) = (times[times.len() - need], times[times.len() - 1]);
                last - first <= policy.promote_window_ms
                    && now.saturating_sub(last) <= policy.promote_window_ms
            }
            _ => false,
        }
    }

    /// The hot shards at `now`, most recently read first.
    pub fn hot(&self, policy: &TierPolicy, now: u64) -> Vec<ShardId> {
        let mut hot: Vec<(u64, ShardId)> = self
            .reads
            .iter()
            .filter(|(id, _)| self.is_hot(policy, id, now))
            .map(|(id, times)| (times.back().copied().unwrap_or(0), *id))
            .collect();
        hot.sort_unstable_by_key(|&(at, _)| std::cmp::Reverse(at));
        hot.into_iter().map(|(_, id)| id).collect()
    }

    /// Drop the history of `id` (promoted, deleted or rewritten).
    pub fn forget(&mut self, id: &ShardId) {
        self.reads.remove(id);
    }

    /// Drop histories whose last read left the window: they can no longer make a shard hot.
    pub fn prune(&mut self, policy: &TierPolicy, now: u64) {
        self.reads.retain(|_, times| {
            times.back().is_some_and(|&last| now.saturating_sub(last) <= policy.promote_window_ms)
        });
    }

    pub fn len(&self) -> usize {
        self.reads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> ShardId {
        ShardId { ino: 10 + n, stripe: 0, index: 0, version: 1 }
    }

    fn policy() -> TierPolicy {
        TierPolicy {
            ssd_capacity: Some(1000),
            high_watermark: 0.9,
            low_watermark: 0.75,
            promote_after_reads: 2,
            promote_window_ms: 600_000,
        }
    }

    #[test]
    fn hot_shards_displace_only_cold_ones_lru_first() {
        let p = TierPolicy { promote_window_ms: 600_000, ..TierPolicy::default() };
        let id = |n: u64| ShardId { ino: n, stripe: 0, index: 0, version: 1 };
        let now = 2_000_000;
        // Shards 1 and 2 last read long ago (2 before 1), shard 3 a minute ago.
        let shards = [(id(1), 500_000, 100), (id(2), 100_000, 100), (id(3), now - 60_000, 100)];
        assert_eq!(p.pick_displacements(shards, 50, now), Some(vec![id(2)]));
        assert_eq!(p.pick_displacements(shards, 150, now), Some(vec![id(2), id(1)]));
        // The recently read shard is never taken: not enough cold bytes, nothing displaced.
        assert_eq!(p.pick_displacements(shards, 250, now), None);
        assert_eq!(p.pick_displacements([(id(3), now - 60_000, 100)], 10, now), None);
    }

    #[test]
    fn defaults_follow_the_config() {
        let p = TierPolicy::default();
        assert_eq!((p.high_watermark, p.low_watermark, p.promote_after_reads), (0.9, 0.75, 1));
        assert_eq!((p.ssd_capacity, p.promote_window_ms), (None, 600_000));
    }

    #[test]
    fn watermarks() {
        let p = policy();
        assert_eq!(p.demotion_goal(0, 1000), 0);
        assert_eq!(p.demotion_goal(900, 1000), 0, "at the high watermark nothing moves");
        assert_eq!(p.demotion_goal(901, 1000), 151, "above it, back down to the low one");
        assert_eq!(p.demotion_goal(1200, 1000), 450);
        assert_eq!(p.promotion_room(0, 1000), 900);
        assert_eq!(p.promotion_room(850, 1000), 50);
        assert_eq!(p.promotion_room(950, 1000), 0);
        assert_eq!(p.demotion_goal(5, 0), 5, "no capacity at all: everything leaves");
    }

    #[test]
    fn least_recently_used_leave_first() {
        let p = policy();
        let shards = [(id(1), 500, 100), (id(2), 100, 100), (id(3), 300, 100), (id(4), 100, 50)];
        assert_eq!(p.pick_demotions(shards, 0), vec![]);
        assert_eq!(p.pick_demotions(shards, 1), vec![id(2)]);
        assert_eq!(p.pick_demotions(shards, 100), vec![id(2)]);
        assert_eq!(p.pick_demotions(shards, 101), vec![id(2), id(4)]);
        assert_eq!(p.pick_demotions(shards, 151), vec![id(2), id(4), id(3)]);
        assert_eq!(p.pick_demotions(shards, 10_000), vec![id(2), id(4), id(3), id(1)]);
    }

    #[test]
    fn promotion_needs_enough_reads_within_the_window() {
        let p = policy();
        let clock = ManualClock::new(1_000_000);
        let mut hot = HotTracker::default();
        hot.record(&p, id(1), clock.now_ms());
        assert!(!hot.is_hot(&p, &id(1), clock.now_ms()), "one read is not enough");
        clock.advance(Duration::from_secs(599));
        hot.record(&p, id(1), clock.now_ms());
        assert!(hot.is_hot(&p, &id(1), clock.now_ms()), "second read within the window");
        assert_eq!(hot.hot(&p, clock.now_ms()), vec![id(1)]);

        // Two reads further apart than the window do not count.
        hot.record(&p, id(2), clock.now_ms());
        clock.advance(Duration::from_secs(601));
        assert!(!hot.is_hot(&p, &id(1), clock.now_ms()), "a window has passed since the last read");
        hot.record(&p, id(2), clock.now_ms());
        assert!(!hot.is_hot(&p, &id(2), clock.now_ms()));
        // ...but a third soon after makes it hot.
        clock.advance(Duration::from_secs(10));
        hot.record(&p, id(2), clock.now_ms());
        assert!(hot.is_hot(&p, &id(2), clock.now_ms()));

        // Pruning drops histories whose last read is out of the window.
        hot.record(&p, id(3), clock.now_ms());
        assert_eq!(hot.len(), 3);
        hot.prune(&p, clock.now_ms());
        assert_eq!(hot.len(), 2, "id 1 was last read more than a window ago");
        hot.forget(&id(2));
        assert_eq!(hot.hot(&p, clock.now_ms()), vec![]);
    }

    #[test]
    fn hottest_first_and_promotion_off() {
        let p = TierPolicy { promote_after_reads: 1, ..policy() };
        let mut hot = HotTracker::default();
        hot.record(&p, id(1), 10);
        hot.record(&p, id(2), 30);
        hot.record(&p, id(3), 20);
        assert_eq!(hot.hot(&p, 40), vec![id(2), id(3), id(1)]);

        let off = TierPolicy { promote_after_reads: 0, ..policy() };
        let mut hot = HotTracker::default();
        hot.record(&off, id(1), 10);
        hot.record(&off, id(1), 11);
        assert!(hot.is_empty() && !hot.is_hot(&off, &id(1), 12));
    }
}
