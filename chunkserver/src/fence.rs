//! Who may delete this chunkserver's shards: a metaserver of the cluster this node belongs to
//! (`{state_dir}/cluster`, `docs/ARCHITECTURE.md`, "Cluster identity"), and of the newest
//! namespace epoch it has seen (`{state_dir}/fence`, "Fencing a deposed leader"), so a
//! metaserver of another cluster deletes nothing here, and a deposed leader nothing once this
//! node has heard from its successor (one heartbeat).
//!
//! The cluster is the first one a metaserver names; the epoch rises from heartbeat replies and
//! from deletes that carry a higher one, and never falls. Both are written (temporary file,
//! fsync, rename, directory fsync) before anything relies on them, so a restart cannot forget
//! them. A delete holds the epoch for reading until it is done, so a raise cannot slip between
//! the check and the delete.

use std::path::{Path, PathBuf};

use cairn_common::{CairnError, ErrorKind, Result};
use parking_lot::Mutex;
use tokio::sync::{RwLock, RwLockReadGuard};

use crate::statefile;

const FENCE_FILE: &str = "fence";
const CLUSTER_FILE: &str = "cluster";

pub struct Fence {
    path: PathBuf,
    highest: RwLock<u64>,
    cluster_path: PathBuf,
    /// The cluster this node belongs to; `None` until a metaserver first names one.
    cluster: Mutex<Option<String>>,
}

/// 32 hex digits: a node identity or a cluster id.
pub fn is_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Fence {
    /// Read the cluster and the epoch kept in `state_dir` (none and 0 before the first
    /// metaserver answered); a damaged file is an error, not a fresh start, which would open the
    /// fence.
    pub fn open(state_dir: &Path) -> Result<Fence> {
        let path = state_dir.join(FENCE_FILE);
        let highest = match statefile::read(&path)? {
            Some(text) => text.parse::<u64>().map_err(|_| {
                CairnError::corrupt(format!(
                    "{} does not hold a namespace epoch (a decimal number); write 0 into it (the \
                     first heartbeat reply raises it again)",
                    path.display()
                ))
            })?,
            None => 0,
        };
        let cluster_path = state_dir.join(CLUSTER_FILE);
        let cluster = match statefile::read(&cluster_path)? {
            None => None,
            Some(id) if is_id(&id) => Some(id.to_ascii_lowercase()),
            Some(_) => {
                return Err(CairnError::corrupt(format!(
                "{} does not hold a cluster id (32 hex digits); write the id `cairn status` shows into it",
                cluster_path.display()
            )))
            }
        };
        Ok(Fence { path, highest: RwLock::new(highest), cluster_path, cluster: Mutex::new(cluster) })
    }

    /// The cluster this node belongs to, if it joined one.
    pub fn cluster(&self) -> Option<String> {
        self.cluster.lock().clone()
    }

    /// A metaserver names its cluster `theirs` (a registration or heartbeat reply): join it the
    /// first time, refuse another one after that. "" is a metaserver too old to name one.
    pub async fn join(&self, theirs: &str) -> Result<()> {
        if theirs.is_empty() {
            return Ok(());
        }
        if let Some(ours) = self.cluster() {
            return self.check_cluster(&ours, theirs);
        }
        if !is_id(theirs) {
            return Err(CairnError::invalid(format!(
                "the metaserver names a malformed cluster id {theirs:?}"
            )));
        }
        let (path, id) = (self.cluster_path.clone(), theirs.to_ascii_lowercase());
        let written = id.clone();
        tokio::task::spawn_blocking(move || statefile::write(&path, &format!("{written}\n")))
            .await
            .map_err(|e| CairnError::internal(format!("writing the cluster id: {e}")))??;
        tracing::info!(cluster = id, "joined the cluster");
        *self.cluster.lock() = Some(id);
        Ok(())
    }

    fn check_cluster(&self, ours: &str, theirs: &str) -> Result<()> {
        if ours == theirs {
            return Ok(());
        }
        Err(CairnError::invalid(format!(
            "the metaserver serves cluster {theirs}, and this chunkserver belongs to cluster {ours} ({}): \
             refused (a metaserver on the wrong data directory? if its namespace is the right one, e.g. \
             restored from a backup older than cluster ids, remove that file and restart this chunkserver)",
            self.cluster_path.display()
        )))
    }

    /// The highest epoch seen.
    pub async fn highest(&self) -> u64 {
        *self.highest.read().await
    }

    /// Note an epoch a leader announced (a heartbeat reply): raise the fence to it, durably.
    pub async fn raise(&self, epoch: u64) -> Result<()> {
        if epoch <= *self.highest.read().await {
            return Ok(());
        }
        let mut highest = self.highest.write().await;
        if epoch > *highest {
            let path = self.path.clone();
            tokio::task::spawn_blocking(move || statefile::write(&path, &format!("{epoch}\n")))
                .await
                .map_err(|e| CairnError::internal(format!("writing the fence: {e}")))??;
            tracing::info!(
                from = *highest,
                to = epoch,
                "a newer metaserver leader: deletes from older ones refused"
            );
            *highest = epoch;
        }
        Ok(())
    }

    /// Admit a delete from a metaserver of cluster `cluster` and namespace epoch `epoch`: refused
    /// when the cluster is not this node's (`InvalidArgument`) or the epoch is below the highest
    /// seen (`NotLeader`), raising it when above. Epoch 0 with no cluster is a client's delete
    /// of its own abandoned shards, not a metaserver's order, and is not fenced. Hold the guard
    /// until the delete is done.
    pub async fn admit(&self, epoch: u64, cluster: &str) -> Result<RwLockReadGuard<'_, u64>> {
        if !cluster.is_empty() {
            match self.cluster() {
                Some(ours) => self.check_cluster(&ours, cluster)?,
                None => {
                    return Err(CairnError::invalid(format!(
                        "delete refused: a metaserver of cluster {cluster} asks, and this chunkserver \
                         has joined no cluster yet"
                    )))
                }
            }
        }
        loop {
            let highest = self.highest.read().await;
            if epoch == 0 || epoch == *highest {
                return Ok(highest);
            }
            if epoch < *highest {
                return Err(CairnError::new(
                    ErrorKind::NotLeader,
                    format!(
                        "delete refused: it comes from a metaserver of namespace epoch {epoch}, and a newer \
                         leader (epoch {}) has taken over",
                        *highest
                    ),
                ));
            }
            drop(highest);
            self.raise(epoch).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deletes_below_the_highest_epoch_are_refused_and_the_fence_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path()).unwrap();
        assert_eq!(fence.highest().await, 0);
        drop(fence.admit(5, "").await.unwrap());
        assert_eq!(fence.highest().await, 5, "a delete from a newer leader raises the fence");
        fence.raise(9).await.unwrap();
        fence.raise(7).await.unwrap();
        assert_eq!(fence.highest().await, 9, "never lowered");
        let err = fence.admit(5, "").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotLeader);
        assert!(err.message().contains("epoch 5") && err.message().contains("epoch 9"), "{err}");
        drop(fence.admit(9, "").await.unwrap());
        drop(fence.admit(0, "").await.unwrap());
        assert_eq!(fence.highest().await, 9, "a client's delete (0) changes nothing");

        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!(reopened.highest().await, 9);
        assert_eq!(reopened.admit(8, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
    }

    #[tokio::test]
    async fn a_raise_waits_for_a_delete_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let fence = std::sync::Arc::new(Fence::open(dir.path()).unwrap());
        let guard = fence.admit(3, "").await.unwrap();
        let raiser = tokio::spawn({
            let fence = fence.clone();
            async move { fence.raise(4).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!raiser.is_finished(), "the raise waits while a delete of epoch 3 runs");
        drop(guard);
        raiser.await.unwrap().unwrap();
        assert_eq!(fence.highest().await, 4);
        assert_eq!(fence.admit(3, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
    }

    #[tokio::test]
    async fn the_first_cluster_named_is_joined_and_deletes_from_another_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = ("0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff");
        let fence = Fence::open(dir.path()).unwrap();
        assert_eq!(fence.cluster(), None);
        assert_eq!(
            fence.admit(5, ours).await.unwrap_err().kind(),
            ErrorKind::InvalidArgument,
            "joined none yet"
        );
        fence.join("").await.unwrap();
        assert_eq!(fence.cluster(), None, "a metaserver naming none joins nobody");
        fence.join(ours).await.unwrap();
        fence.join(ours).await.unwrap();
        let err = fence.join(theirs).await.unwrap_err();
        assert!(err.message().contains(ours) && err.message().contains(theirs), "{err}");
        let err = fence.admit(7, theirs).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert_eq!(fence.highest().await, 0, "another cluster's delete raised nothing");
        drop(fence.admit(7, ours).await.unwrap());
        assert_eq!(fence.highest().await, 7);

        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!(reopened.cluster().as_deref(), Some(ours));
        assert!(reopened.join(theirs).await.is_err());
        std::fs::write(dir.path().join(CLUSTER_FILE), "short").unwrap();
        let err = Fence::open(dir.path()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("cluster"), "{err}");
    }

    #[test]
    fn a_damaged_fence_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FENCE_FILE), "garbage").unwrap();
        let err = Fence::open(dir.path()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("fence"), "{err}");
    }
}
