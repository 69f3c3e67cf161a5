//! `cairn stats`: a live, per-interval view of what the cluster is doing (like `juicefs stats`
//! or `vmstat`): metadata requests, shard reads and writes with their bytes, the SSD tier's share
//! of reads, tier moves, degraded stripes and rebuild. Counters come from the metaserver's
//! ClusterStatus (chunkservers report theirs with every heartbeat, so a rate is as fresh as the
//! heartbeat interval); each line is the difference between two polls.

use std::time::{Duration, Instant};

use cairn_common::Result;
use cairn_proto as p;
use serde_json::json;

use crate::admin::human;

/// Cluster-wide counters at one poll.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub ssd_reads: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub moves: u64,
    pub bytes_rebuilt: u64,
}

impl Totals {
    pub fn of(status: &p::ClusterStatusReply) -> Totals {
        let mut t =
            Totals { requests: status.requests, bytes_rebuilt: status.bytes_rebuilt, ..Totals::default() };
        for tier in status.nodes.iter().flat_map(|n| &n.tiers) {
            t.reads += tier.reads;
            t.read_bytes += tier.read_bytes;
            t.writes += tier.writes;
            t.write_bytes += tier.write_bytes;
            if tier.name == "ssd" {
                t.ssd_reads += tier.reads;
                // A move counts in both its directories; count it once, on the SSD side.
                t.moves += tier.promotions + tier.demotions;
            }
        }
        t
    }

    /// Per-second rates from `before` to `self` over `secs`. A counter that went down (a
    /// server restarted) counts from zero.
    pub fn rates(&self, before: &Totals, secs: f64) -> Rates {
        let d = |now: u64, then: u64| if now >= then { now - then } else { now } as f64 / secs.max(1e-3);
        let reads = d(self.reads, before.reads);
        let ssd = d(self.ssd_reads, before.ssd_reads);
        Rates {
            requests: d(self.requests, before.requests),
            reads,
            read_bytes: d(self.read_bytes, before.read_bytes),
            writes: d(self.writes, before.writes),
            write_bytes: d(self.write_bytes, before.write_bytes),
            moves: d(self.moves, before.moves),
            rebuild_bytes: d(self.bytes_rebuilt, before.bytes_rebuilt),
            ssd_hit: (reads > 0.0).then(|| (ssd / reads).min(1.0)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub requests: f64,
    pub reads: f64,
    pub read_bytes: f64,
    pub writes: f64,
    pub write_bytes: f64,
    pub moves: f64,
    pub rebuild_bytes: f64,
    pub ssd_hit: Option<f64>,
}

const HEADER: &str =
    "time      meta req/s  reads/s   read/s      writes/s  write/s     ssd hit  moves/s  degraded  rebuild/s  nodes up  lose0  health";

pub async fn stats(meta: &str, interval: Duration, count: Option<u64>, as_json: bool) -> Result<()> {
    let conn = cairn_client::connect_meta(meta).await?;
    let mut before = conn.cluster_status(p::Empty {}).await?;
    let mut at = Instant::now();
    if !as_json {
        println!("{HEADER}");
    }
    let mut shown = 0;
    while count.is_none_or(|c| shown < c) {
        tokio::time::sleep(interval.saturating_sub(at.elapsed())).await;
        let now = conn.cluster_status(p::Empty {}).await?;
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        let r = Totals::of(&now).rates(&Totals::of(&before), secs);
        let up = now.nodes.iter().filter(|n| n.up).count();
        let clock = chrono_like_now();
        // Stripes that lost all their parity: one more failure would make them unreadable.
        let lose0 = now.reduced_stripes_by_margin.first().copied().unwrap_or(0);
        if as_json {
            let line = json!({
                "time": clock, "interval_secs": secs, "meta_requests_per_sec": r.requests,
                "reads_per_sec": r.reads, "read_bytes_per_sec": r.read_bytes,
                "writes_per_sec": r.writes, "write_bytes_per_sec": r.write_bytes,
                "ssd_hit_ratio": r.ssd_hit, "tier_moves_per_sec": r.moves,
                "degraded_stripes": now.degraded_stripes, "rebuild_bytes_per_sec": r.rebuild_bytes,
                "nodes_up": up, "nodes": now.nodes.len(),
                "stripes_that_can_lose_0": lose0, "health": now.health,
            });
            println!("{line}");
        } else {
            println!(
                "{clock:<9} {:<11.0} {:<9.0} {:<11} {:<9.0} {:<11} {:<8} {:<8.1} {:<9} {:<10} {:<9} {lose0:<6} {}",
                r.requests,
                r.reads,
                format!("{}/s", human(r.read_bytes as u64)),
                r.writes,
                format!("{}/s", human(r.write_bytes as u64)),
                r.ssd_hit.map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
                r.moves,
                now.degraded_stripes,
                format!("{}/s", human(r.rebuild_bytes as u64)),
                format!("{up}/{}", now.nodes.len()),
                now.health.strip_prefix("HEALTH_").unwrap_or(&now.health),
            );
        }
        before = now;
        shown += 1;
    }
    Ok(())
}

/// HH:MM:SS in UTC (enough to line up with logs; no time-zone database needed).
fn chrono_like_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(name: &str, reads: u64, read_bytes: u64, writes: u64, write_bytes: u64) -> p::TierUsage {
        p::TierUsage { name: name.into(), reads, read_bytes, writes, write_bytes, ..Default::default() }
    }

    #[test]
    fn rates_are_differences_over_time_and_restarts_count_from_zero() {
        let status = |reads: u64, requests: u64| p::ClusterStatusReply {
            requests,
            nodes: vec![
                p::NodeInfo {
                    tiers: vec![tier("ssd", reads, reads * 10, 4, 400), tier("hdd", 1, 10, 0, 0)],
                    ..Default::default()
                },
                p::NodeInfo { tiers: vec![tier("ssd", reads, reads * 10, 2, 200)], ..Default::default() },
            ],
            ..Default::default()
        };
        let a = Totals::of(&status(10, 100));
        assert_eq!((a.reads, a.ssd_reads, a.writes, a.write_bytes), (21, 20, 6, 600));
        let b = Totals::of(&status(20, 300));
        let r = b.rates(&a, 2.0);
        assert_eq!((r.requests, r.reads, r.read_bytes, r.writes), (100.0, 10.0, 100.0, 0.0));
        assert_eq!(r.ssd_hit, Some(1.0));
        // The metaserver restarted: its counter starts again from zero.
        let c = Totals::of(&status(20, 50));
        assert_eq!(c.rates(&b, 1.0).requests, 50.0);
        assert_eq!(b.rates(&b, 1.0).ssd_hit, None);
    }
}
