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

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{HeartbeatRequest, RegisterChunkRequest};

use crate::fence::Fence;
use crate::meta::MetaClients;
use crate::store::ShardStore;

const UUID_FILE: &str = "node.uuid";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Read this node's identity from `state_dir`, creating it on first start.
pub fn load_or_create_uuid(state_dir: &Path) -> Result<String> {
    let path = state_dir.join(UUID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let uuid = text.trim();
            if uuid.len() != 32 || !uuid.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(CairnError::corrupt(format!(
                    "{} does not hold a node identity (32 hex digits); move it away to start as a new node",
                    path.display()
                )));
            }
            return Ok(uuid.to_ascii_lowercase());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CairnError::from_io(&format!("cannot read {}", path.display()), &e)),
    }
    let uuid = format!("{:032x}", rand::random::<u128>());
    let ctx = |e: std::io::Error| CairnError::from_io(&format!("cannot write {}", path.display()), &e);
    std::fs::create_dir_all(state_dir).map_err(ctx)?;
    let tmp = state_dir.join(format!("{UUID_FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp).map_err(ctx)?;
    file.write_all(format!("{uuid}\n").as_bytes()).map_err(ctx)?;
    file.sync_all().map_err(ctx)?;
    std::fs::rename(&tmp, &path).map_err(ctx)?;
    std::fs::File::open(state_dir).and_then(|d| d.sync_all()).map_err(ctx)?;
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
    interval: Duration,
}

impl Heartbeat {
    /// Prepare the loop; fails only on an unusable metaserver address (nothing is contacted yet).
    pub fn new(
        meta: &str,
        uuid: String,
        advertise: String,
        store: Arc<ShardStore>,
        node_id: Arc<AtomicU32>,
        fence: Arc<Fence>,
        interval: Duration,
    ) -> Result<Heartbeat> {
        let meta = MetaClients::new(meta, CONNECT_TIMEOUT, REQUEST_TIMEOUT)?;
        Ok(Heartbeat { meta, uuid, advertise, store, node_id, fence, interval })
    }

    /// Register, then heartbeat forever (the caller aborts the task at shutdown).
    pub async fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
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
            tokio::time::sleep(self.interval).await;
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
        };
        let reply = self
            .meta
            .call(|mut c| {
                let request = request.clone();
                async move { c.heartbeat(request).await }
            })
            .await?;
        self.fence.raise(reply.fence).await
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
