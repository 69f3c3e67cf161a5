//! This client's session with the metaserver: the heartbeat that renews it (announcing the
//! files open here) and the batched releases of closed files.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto as p;
use parking_lot::Mutex;

use super::{Opened, EPOCH_BUCKETS};
use crate::meta::MetaApi;

/// Releases of closed files, sent late and in batches: closing a file (the last handle on it)
/// costs no round trip of its own. Every open this client registers with the metaserver gets a
/// generation (a counter), and a release names the newest one it covers, so a release that
/// arrives after a newer open of the same file changes nothing there. A file this client holds
/// locks on is released at once: other clients may be waiting for them.
pub(super) struct Releases {
    meta: Arc<dyn MetaApi>,
    client_id: u32,
    next_generation: AtomicU64,
    pub(super) pending: Mutex<Vec<p::Released>>,
    wake: tokio::sync::Notify,
    /// Per inode (hashed into [`EPOCH_BUCKETS`]), the newest generation released: an open whose
    /// answer comes back after a release covering it was released with it and asks again.
    released: Vec<AtomicU64>,
}

/// How long a closed file's release waits for others to share its request.
const RELEASE_DELAY: Duration = Duration::from_millis(10);
/// Most files one release request names.
const RELEASE_BATCH: usize = 1000;

impl Releases {
    pub(super) fn new(meta: Arc<dyn MetaApi>, client_id: u32) -> Releases {
        Releases {
            meta,
            client_id,
            next_generation: AtomicU64::new(1),
            pending: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            released: (0..EPOCH_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn next_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn released(&self, ino: u64) -> &AtomicU64 {
        &self.released[(ino % EPOCH_BUCKETS as u64) as usize]
    }

    /// Release `ino`'s opens up to `generation`: queued, or `now`.
    pub(super) async fn release(&self, ino: u64, generation: u64, now: bool) {
        let file = p::Released { ino, generation };
        if now {
            self.send(vec![file]).await;
        } else {
            self.pending.lock().push(file);
            self.wake.notify_one();
        }
    }

    async fn send(&self, files: Vec<p::Released>) {
        for batch in files.chunks(RELEASE_BATCH) {
            let req =
                p::ReleaseRequest { client_id: self.client_id, more: batch.to_vec(), ..Default::default() };
            if let Err(e) = self.meta.release(req).await {
                tracing::warn!(files = batch.len(), "release: {e} (the session lease will clean up)");
            }
        }
    }

    /// Send what is queued now.
    pub(super) async fn flush(&self) {
        let files = std::mem::take(&mut *self.pending.lock());
        if !files.is_empty() {
            self.send(files).await;
        }
    }

    /// The background sender: after the first queued release, wait [`RELEASE_DELAY`] for
    /// more, then send them all.
    pub(super) async fn run(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            tokio::time::sleep(RELEASE_DELAY).await;
            self.flush().await;
        }
    }
}

/// Renew this client's session every quarter lease, announcing every inode it has open (so a
/// restarted metaserver learns them again, and unlinked files stay readable).
pub(super) async fn session_heartbeat(
    meta: Arc<dyn MetaApi>,
    client_id: u32,
    files: Arc<Mutex<HashMap<u64, Opened>>>,
) {
    let mut every = Duration::from_secs(5);
    loop {
        tokio::time::sleep(every).await;
        let open: Vec<u64> = files.lock().keys().copied().collect();
        match meta.client_heartbeat(p::ClientHeartbeatRequest { client_id, open }).await {
            Ok(reply) => every = Duration::from_millis((reply.lease_ms / 4).clamp(100, 10_000)),
            Err(e) => tracing::warn!("session heartbeat: {e}"),
        }
    }
}
