//! The chunkserver's membership in the cluster: a stable identity, registration with the
//! metaserver and periodic heartbeats carrying address, tier usage and pid, whose replies
//! raise the delete [`Fence`] to the leader's namespace epoch.
//!
//! Identity is a random 128-bit hex string kept in `{state_dir}/node.uuid`, created once and
//! reused on every restart, so the metaserver gives a restarted chunkserver its old node id.
//! The loop never gives up and never panics: while the metaserver is unreachable it logs and
//! retries (registration with exponential backoff, heartbeats at their interval); a heartbeat
//! answered `NotFound` (the metaserver forgot this node) triggers a new registration. The node
//! id is shared with the service through an `Arc<AtomicU32>`; 0 means "not registered yet".
//!
//! The node belongs to one cluster: the first metaserver that registers it names its cluster id,
//! which the [`Fence`] keeps in `{state_dir}/cluster` and every registration and heartbeat
//! sends; a metaserver of another cluster (one started on the wrong data directory) is not
//! joined (`docs/ARCHITECTURE.md`, "Cluster identity").

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_net::capability::Verifier;
use cairn_proto::{HeartbeatRequest, RegisterChunkRequest};

use crate::fence::Fence;
use crate::meta::MetaClients;
use crate::statefile;
use crate::store::ShardStore;

const UUID_FILE: &str = "node.uuid";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Read this node's identity from `state_dir`, creating it on first start.
pub fn load_or_create_uuid(state_dir: &Path) -> Result<String> {
    let path = state_dir.join(UUID_FILE);
    if let Some(uuid) = statefile::read(&path)? {
        if !crate::fence::is_id(&uuid) {
            return Err(CairnError::corrupt(format!(
                "{} does not hold a node identity (32 hex digits); move it away to start as a new node",
                path.display()
            )));
        }
        return Ok(uuid.to_ascii_lowercase());
    }
    let uuid = format!("{:032x}", rand::random::<u128>());
    statefile::write(&path, &format!("{uuid}\n"))?;
    tracing::info!(uuid, path = %path.display(), "created a new node identity");
    Ok(uuid)
}

/// Everything the heartbeat loop needs.
pub struct Heartbeat {
    meta: MetaClients,
    uuid: String,
    advertise: String,
    store: Arc<ShardStore>,
    node_id: Arc<AtomicU32>,
    fence: Arc<Fence>,
    /// Learns the keys of shard capabilities from the metaserver's replies.
    caps: Arc<Verifier>,
    interval: Duration,
}

/// Least time between two heartbeats sent early for a capability key.
const EARLY_MIN_GAP: Duration = Duration::from_secs(1);

impl Heartbeat {
    /// Prepare the loop with the node's identity from `state_dir` (created on first start);
    /// fails on an unusable metaserver address or identity file (nothing is contacted yet).
    pub fn new(
        meta: &str,
        advertise: String,
        store: Arc<ShardStore>,
        node_id: Arc<AtomicU32>,
        fence: Arc<Fence>,
        state_dir: &Path,
        interval: Duration,
    ) -> Result<Heartbeat> {
        let meta = MetaClients::new(meta, CONNECT_TIMEOUT, REQUEST_TIMEOUT)?;
        let uuid = load_or_create_uuid(state_dir)?;
        let caps = Arc::new(Verifier::default());
        Ok(Heartbeat { meta, uuid, advertise, store, node_id, fence, caps, interval })
    }

    /// Put the capability keys the metaserver sends into `caps` (the service's), and heartbeat
    /// early when it asks for a key it lacks.
    pub fn with_capability_keys(mut self, caps: Arc<Verifier>) -> Heartbeat {
        self.caps = caps;
        self
    }

    /// This node's identity.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// Register, then heartbeat forever (the caller aborts the task at shutdown).
    pub async fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
        let mut last = tokio::time::Instant::now();
        loop {
            if self.node_id.load(Ordering::Relaxed) == 0 {
                match self.register().await {
                    Ok(id) => {
                        self.node_id.store(id, Ordering::Relaxed);
                        backoff = FIRST_BACKOFF;
                        tracing::info!(node_id = id, addr = %self.advertise, "registered with the metaserver");
                    }
                    Err(e) => {
                        tracing::warn!("cannot register with the metaserver (retrying in {backoff:?}): {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                continue;
            }
            // At the interval, or early (at most once a second) when a client showed a
            // capability signed with a key this chunkserver does not know yet.
            tokio::select! {
                _ = tokio::time::sleep_until(last + self.interval) => {}
                _ = self.caps.wanted() => tokio::time::sleep_until(last + EARLY_MIN_GAP.min(self.interval)).await,
            }
            last = tokio::time::Instant::now();
            if let Err(e) = self.heartbeat().await {
                if e.kind() == ErrorKind::NotFound {
                    tracing::warn!("the metaserver does not know this node any more; registering again: {e}");
                    self.node_id.store(0, Ordering::Relaxed);
                } else {
                    tracing::warn!("heartbeat failed: {e}");
                }
            }
        }
    }

    async fn register(&mut self) -> Result<u32> {
        let request = RegisterChunkRequest {
            uuid: self.uuid.clone(),
            addr: self.advertise.clone(),
            tiers: self.store.usage(),
            pid: std::process::id(),
            cluster_id: self.fence.cluster().unwrap_or_default(),
        };
        let reply = self
            .meta
            .call(|mut c| {
                let request = request.clone();
                async move { c.register_chunk(request).await }
            })
            .await?;
        if reply.node_id == 0 {
            return Err(CairnError::internal("the metaserver answered node id 0"));
        }
        self.fence.join(&reply.cluster_id).await?;
        self.caps.learn(&reply.cap_keys);
        Ok(reply.node_id)
    }

    async fn heartbeat(&mut self) -> Result<()> {
        let tiers = self.store.usage();
        crate::metrics::publish(&tiers, self.store.promotion_backlog());
        let request = HeartbeatRequest {
            node_id: self.node_id.load(Ordering::Relaxed),
            addr: self.advertise.clone(),
            tiers,
            pid: std::process::id(),
            cluster_id: self.fence.cluster().unwrap_or_default(),
            cert_not_after: cairn_net::tls::identity().map_or(0, |id| id.cert.not_after),
        };
        let reply = self
            .meta
            .call(|mut c| {
                let request = request.clone();
                async move { c.heartbeat(request).await }
            })
            .await?;
        if let Err(e) = self.fence.join(&reply.cluster_id).await {
            // Registered with a metaserver of another cluster: leave it, and keep asking.
            self.node_id.store(0, Ordering::Relaxed);
            return Err(e);
        }
        self.caps.learn_from_leader(0, &reply.cap_keys, reply.fence);
        self.fence.raise(0, reply.fence).await?;
        if reply.map_version > self.fence.slots().version() {
            let map =
                self.meta.call(|mut c| async move { c.get_group_map(cairn_proto::Empty {}).await }).await?;
            self.fence.slots().update(&map);
        }
        self.fence.slots().confirm();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = load_or_create_uuid(&state).unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(load_or_create_uuid(&state).unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create_uuid(other.path()).unwrap(), first);
    }

    #[test]
    fn a_damaged_uuid_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(UUID_FILE), "not-a-uuid").unwrap();
        let err = load_or_create_uuid(dir.path()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("node.uuid"), "{err}");
    }
}
