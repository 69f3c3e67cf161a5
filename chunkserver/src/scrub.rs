//! Background scrub: re-reads every shard at a bounded rate and verifies its header and every
//! block checksum, so corruption of data nobody reads is found before a second failure makes
//! it unrecoverable. A damaged shard is reported to the metaserver (which marks it missing in
//! its stripe record, so the repair rebuilds it from the other shards) and only then removed;
//! if the report cannot be delivered the shard stays and the next pass tries again.

use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result, ShardId};
use cairn_proto::ReportDamagedRequest;

use crate::meta::MetaClients;
use crate::store::ShardStore;
use crate::throttle::RateLimiter;

pub struct Scrub {
    store: Arc<ShardStore>,
    meta: MetaClients,
    /// Paces the bytes read, at `scrub_rate_bytes`.
    limiter: RateLimiter,
    interval: Duration,
}

/// What one pass found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScrubPass {
    pub checked: u64,
    pub bytes: u64,
    pub damaged: Vec<ShardId>,
}

impl Scrub {
    pub fn new(store: Arc<ShardStore>, meta: &str, rate_bytes: u64, interval: Duration) -> Result<Scrub> {
        Ok(Scrub {
            store,
            meta: MetaClients::new(meta, Duration::from_secs(2), Duration::from_secs(10))?,
            limiter: RateLimiter::new(rate_bytes.max(1 << 20)),
            interval,
        })
    }

    pub async fn run(mut self) {
        tokio::time::sleep(self.interval.min(Duration::from_secs(60))).await;
        loop {
            match self.pass().await {
                Ok(p) if !p.damaged.is_empty() => {
                    tracing::warn!(
                        checked = p.checked,
                        damaged = p.damaged.len(),
                        "scrub pass found damaged shards"
                    )
                }
                Ok(p) => tracing::debug!(checked = p.checked, bytes = p.bytes, "scrub pass clean"),
                Err(e) => tracing::warn!("scrub pass: {e}"),
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Verify every shard once; report and remove the damaged ones.
    pub async fn pass(&mut self) -> Result<ScrubPass> {
        let mut out = ScrubPass::default();
        for id in self.store.shard_ids() {
            let Some(loc) = self.store.location(&id) else { continue };
            let path = self.store.path(loc.dir, &id);
            let file = match self.store.open_shard(loc.dir, &path).await {
                Ok(f) => f,
                // Deleted or moved since the listing: nothing to check.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(CairnError::from_io(&format!("scrub open {}", path.display()), &e)),
            };
            let len = file.file.metadata().map(|m| m.len()).unwrap_or(0);
            out.checked += 1;
            out.bytes += len;
            metrics::counter!(crate::metrics::SCRUB_SHARDS).increment(1);
            metrics::counter!(crate::metrics::SCRUB_BYTES).increment(len);
            self.limiter.take(len).await;
            match file.verify(self.store.engine(), &id, None, None).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Corrupt => {
                    tracing::warn!(%id, path = %path.display(), "scrub: {e}");
                    out.damaged.push(id);
                    metrics::counter!(crate::metrics::SCRUB_DAMAGED).increment(1);
                }
                Err(e) => tracing::warn!(%id, "scrub could not read the shard: {e}"),
            }
        }
        if !out.damaged.is_empty() {
            let req = ReportDamagedRequest {
                ids: out.damaged.iter().map(|id| (*id).into()).collect(),
                confirm: false,
            };
            let reply = self
                .meta
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.report_damaged(req).await }
                })
                .await?;
            // Only what the records now count as missing goes: a refused report (the stripe
            // would be past m missing) keeps the shard, whose other blocks may still be read.
            let missing: Vec<ShardId> = reply.missing.iter().map(ShardId::from).collect();
            let kept = out.damaged.len() - missing.len();
            if kept > 0 {
                tracing::warn!(
                    kept,
                    "scrub: damaged shards kept: the metaserver did not record them as missing"
                );
            }
            self.store.delete(&missing).await?;
        }
        Ok(out)
    }
}
