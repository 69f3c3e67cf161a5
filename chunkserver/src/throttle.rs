//! The one throttle of the chunkserver's background copies and reads: tier moves (the mover
//! and `Promote` share one) and the scrub each pace their bytes through a [`RateLimiter`].

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Spreads work over time so that it averages at most `rate` bytes per second. A caller takes
/// its bytes before doing the work; callers sharing one limiter share its rate.
#[derive(Debug)]
pub struct RateLimiter {
    rate: u64,
    /// When the bytes granted so far will have been "paid for".
    next: Mutex<Option<Instant>>,
}

impl RateLimiter {
    pub fn new(bytes_per_sec: u64) -> RateLimiter {
        RateLimiter { rate: bytes_per_sec.max(1), next: Mutex::new(None) }
    }

    /// Wait until `bytes` more may be used. Bytes granted while idle are not saved up: a
    /// limiter left alone for a minute does not then allow a minute's worth at once.
    pub async fn take(&self, bytes: u64) {
        let start = {
            let mut next = self.next.lock();
            let now = Instant::now();
            let start = next.map_or(now, |n| n.max(now));
            *next = Some(start + Duration::from_secs_f64(bytes as f64 / self.rate as f64));
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn takers_share_the_rate_and_idle_time_is_not_saved_up() {
        let limiter = RateLimiter::new(1000);
        let t0 = Instant::now();
        limiter.take(500).await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "the first take starts at once");
        limiter.take(500).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(500));
        limiter.take(1000).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(1000));
        // Idle for ten seconds: the next take waits for nothing, the one after it pays for it.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t1 = Instant::now();
        limiter.take(2000).await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
        limiter.take(1).await;
        assert_eq!(t1.elapsed(), Duration::from_secs(2));
    }
}
