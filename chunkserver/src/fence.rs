//! Fencing of shard deletes: the highest namespace epoch this chunkserver has seen from a
//! metaserver leader, kept in `{state_dir}/fence`, below which deletes are refused, so a deposed
//! leader that has not yet learnt of its successor deletes nothing (`docs/ARCHITECTURE.md`,
//! "Fencing a deposed leader").
//!
//! The epoch rises from heartbeat replies and from deletes that carry a higher one; it never
//! falls. It is written (temporary file, fsync, rename, directory fsync) before anything relies
//! on it, so a restart cannot forget it. A delete holds the fence for reading until it is done,
//! so a raise cannot slip between the check and the delete.

use std::path::{Path, PathBuf};

use cairn_common::{CairnError, ErrorKind, Result};
use tokio::sync::{RwLock, RwLockReadGuard};

use crate::statefile;

const FENCE_FILE: &str = "fence";

pub struct Fence {
    path: PathBuf,
    highest: RwLock<u64>,
}

impl Fence {
    /// Read the fence kept in `state_dir` (0 when there is none yet); a file that does not hold
    /// a number is an error, not a fresh start: starting over at 0 would open the fence.
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
        Ok(Fence { path, highest: RwLock::new(highest) })
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

    /// Admit a delete carrying `epoch`: refused (`NotLeader`) below the highest seen, raising
    /// it when above. 0 is a client's delete, not a leader's, and is not fenced. Hold the guard
    /// until the delete is done.
    pub async fn admit(&self, epoch: u64) -> Result<RwLockReadGuard<'_, u64>> {
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
        drop(fence.admit(5).await.unwrap());
        assert_eq!(fence.highest().await, 5, "a delete from a newer leader raises the fence");
        fence.raise(9).await.unwrap();
        fence.raise(7).await.unwrap();
        assert_eq!(fence.highest().await, 9, "never lowered");
        let err = fence.admit(5).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotLeader);
        assert!(err.message().contains("epoch 5") && err.message().contains("epoch 9"), "{err}");
        drop(fence.admit(9).await.unwrap());
        drop(fence.admit(0).await.unwrap());
        assert_eq!(fence.highest().await, 9, "a client's delete (0) changes nothing");

        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!(reopened.highest().await, 9);
        assert_eq!(reopened.admit(8).await.unwrap_err().kind(), ErrorKind::NotLeader);
    }

    #[tokio::test]
    async fn a_raise_waits_for_a_delete_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let fence = std::sync::Arc::new(Fence::open(dir.path()).unwrap());
        let guard = fence.admit(3).await.unwrap();
        let raiser = tokio::spawn({
            let fence = fence.clone();
            async move { fence.raise(4).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!raiser.is_finished(), "the raise waits while a delete of epoch 3 runs");
        drop(guard);
        raiser.await.unwrap().unwrap();
        assert_eq!(fence.highest().await, 4);
        assert_eq!(fence.admit(3).await.unwrap_err().kind(), ErrorKind::NotLeader);
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
