//! Who may delete this chunkserver's shards: a metaserver of the cluster this node belongs to
//! (`{state_dir}/cluster`, `docs/ARCHITECTURE.md`, "Cluster identity"), and of the newest
//! namespace epoch it has seen from that metaserver's metadata group (`{state_dir}/fence` for
//! group 0, `fence-g{N}` for group N; "Fencing a deposed leader" and "Several metadata
//! groups"), so a metaserver of another cluster deletes nothing here, and a deposed leader
//! nothing once this node has heard from its successor (one heartbeat). Each group's epochs are
//! its own: a newer leader of one group fences nobody of another, and a deposed leader cannot
//! pass with another group's newer epoch.
//!
//! The cluster is the first one a metaserver names; an epoch rises from heartbeat replies (group
//! 0's) and from deletes that carry a higher one, and never falls. Both are written (temporary
//! file, fsync, rename, directory fsync) before anything relies on them, so a restart cannot
//! forget them. A delete holds its group's epoch for reading until it is done, so a raise cannot
//! slip between the check and the delete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_common::config::MAX_GROUPS;
use cairn_common::{CairnError, ErrorKind, Result};
use parking_lot::Mutex;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::statefile;

const FENCE_FILE: &str = "fence";
/// Group N's fence is `fence-g{N}` (a dash, not a dot: the temporary file of each is then
/// `{name}.tmp`, one per group).
const GROUP_FENCE_PREFIX: &str = "fence-g";
const CLUSTER_FILE: &str = "cluster";

pub struct Fence {
    state_dir: PathBuf,
    /// The highest epoch seen from each metadata group; a group never heard from is at 0.
    groups: Mutex<BTreeMap<u32, Arc<RwLock<u64>>>>,
    cluster_path: PathBuf,
    /// The cluster this node belongs to; `None` until a metaserver first names one.
    cluster: Mutex<Option<String>>,
    /// Which group owns each namespace slot: a group's deletes and capabilities count only
    /// for its own.
    slots: crate::slots::Slots,
}

pub use cairn_common::ids::is_id;

/// The epoch kept in `path` (0 when there is none); damage is an error, not a fresh start,
/// which would open the fence.
fn read_epoch(path: &Path) -> Result<u64> {
    match statefile::read(path)? {
        Some(text) => text.parse::<u64>().map_err(|_| {
            CairnError::corrupt(format!(
                "{} does not hold a namespace epoch (a decimal number); write 0 into it (the \
                 metaserver's next heartbeat reply or delete raises it again)",
                path.display()
            ))
        }),
        None => Ok(0),
    }
}

impl Fence {
    /// Read the cluster and every group's epoch kept in `state_dir` (none and 0 before the
    /// first metaserver answered); a damaged file is an error, not a fresh start, which would
    /// open the fence.
    pub fn open(state_dir: &Path) -> Result<Fence> {
        let mut groups = BTreeMap::new();
        groups.insert(0, Arc::new(RwLock::new(read_epoch(&state_dir.join(FENCE_FILE))?)));
        let listed = std::fs::read_dir(state_dir);
        let entries = match listed {
            Ok(entries) => entries.collect::<std::io::Result<Vec<_>>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
        .map_err(|e| CairnError::from_io(&format!("cannot list {}", state_dir.display()), &e))?;
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(number) = name.strip_prefix(GROUP_FENCE_PREFIX) else { continue };
            if number.ends_with(".tmp") {
                continue;
            }
            let group =
                number.parse::<u32>().ok().filter(|g| *g > 0 && *g < MAX_GROUPS).ok_or_else(|| {
                    CairnError::corrupt(format!(
                        "{} is not a metadata group's fence (fence-g1 … fence-g{}): remove or rename it",
                        entry.path().display(),
                        MAX_GROUPS - 1
                    ))
                })?;
            groups.insert(group, Arc::new(RwLock::new(read_epoch(&entry.path())?)));
        }
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
        Ok(Fence {
            state_dir: state_dir.to_path_buf(),
            groups: Mutex::new(groups),
            cluster_path,
            cluster: Mutex::new(cluster),
            slots: Default::default(),
        })
    }

    /// Which group owns each namespace slot, as this node last heard.
    pub fn slots(&self) -> &crate::slots::Slots {
        &self.slots
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

    /// Metadata group `group`'s epoch (0 for one never heard from); a number no group can have
    /// is refused.
    fn epoch_of(&self, group: u32) -> Result<Arc<RwLock<u64>>> {
        if group >= MAX_GROUPS {
            return Err(CairnError::invalid(format!(
                "metadata group {group} is out of range (at most {MAX_GROUPS} groups)"
            )));
        }
        Ok(self.groups.lock().entry(group).or_default().clone())
    }

    fn path_of(&self, group: u32) -> PathBuf {
        match group {
            0 => self.state_dir.join(FENCE_FILE),
            g => self.state_dir.join(format!("{GROUP_FENCE_PREFIX}{g}")),
        }
    }

    /// The highest epoch seen from metadata group `group`.
    pub async fn highest(&self, group: u32) -> Result<u64> {
        Ok(*self.epoch_of(group)?.read().await)
    }

    /// Note an epoch a leader of metadata group `group` announced (a heartbeat reply): raise
    /// that group's fence to it, durably.
    pub async fn raise(&self, group: u32, epoch: u64) -> Result<()> {
        let lock = self.epoch_of(group)?;
        if epoch <= *lock.read().await {
            return Ok(());
        }
        let mut highest = lock.write().await;
        if epoch > *highest {
            let path = self.path_of(group);
            tokio::task::spawn_blocking(move || statefile::write(&path, &format!("{epoch}\n")))
                .await
                .map_err(|e| CairnError::internal(format!("writing the fence: {e}")))??;
            tracing::info!(
                group,
                from = *highest,
                to = epoch,
                "a newer metaserver leader: deletes from older ones of its group refused"
            );
            *highest = epoch;
        }
        Ok(())
    }

    /// Admit a delete from a metaserver of cluster `cluster`, metadata group `group` and
    /// namespace epoch `epoch`: refused when the cluster is not this node's (`InvalidArgument`)
    /// or the epoch is below the highest seen from that group (`NotLeader`), raising it when
    /// above. Epoch 0 with no cluster is a client's delete of its own abandoned shards, not a
    /// metaserver's order, and is not fenced. Hold the guard until the delete is done.
    pub async fn admit(&self, group: u32, epoch: u64, cluster: &str) -> Result<OwnedRwLockReadGuard<u64>> {
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
        let lock = self.epoch_of(group)?;
        loop {
            let highest = lock.clone().read_owned().await;
            if epoch == 0 || epoch == *highest {
                return Ok(highest);
            }
            if epoch < *highest {
                return Err(CairnError::new(
                    ErrorKind::NotLeader,
                    format!(
                        "delete refused: it comes from a metaserver of metadata group {group} at namespace \
                         epoch {epoch}, and a newer leader of that group (epoch {}) has taken over",
                        *highest
                    ),
                ));
            }
            drop(highest);
            self.raise(group, epoch).await?;
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
        assert_eq!(fence.highest(0).await.unwrap(), 0);
        drop(fence.admit(0, 5, "").await.unwrap());
        assert_eq!(fence.highest(0).await.unwrap(), 5, "a delete from a newer leader raises the fence");
        fence.raise(0, 9).await.unwrap();
        fence.raise(0, 7).await.unwrap();
        assert_eq!(fence.highest(0).await.unwrap(), 9, "never lowered");
        let err = fence.admit(0, 5, "").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotLeader);
        assert!(err.message().contains("epoch 5") && err.message().contains("epoch 9"), "{err}");
        drop(fence.admit(0, 9, "").await.unwrap());
        drop(fence.admit(0, 0, "").await.unwrap());
        assert_eq!(fence.highest(0).await.unwrap(), 9, "a client's delete (0) changes nothing");

        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!(reopened.highest(0).await.unwrap(), 9);
        assert_eq!(reopened.admit(0, 8, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
    }

    #[tokio::test]
    async fn a_raise_waits_for_a_delete_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let fence = std::sync::Arc::new(Fence::open(dir.path()).unwrap());
        let guard = fence.admit(0, 3, "").await.unwrap();
        let raiser = tokio::spawn({
            let fence = fence.clone();
            async move { fence.raise(0, 4).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!raiser.is_finished(), "the raise waits while a delete of epoch 3 runs");
        drop(guard);
        raiser.await.unwrap().unwrap();
        assert_eq!(fence.highest(0).await.unwrap(), 4);
        assert_eq!(fence.admit(0, 3, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
    }

    #[tokio::test]
    async fn the_first_cluster_named_is_joined_and_deletes_from_another_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = ("0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff");
        let fence = Fence::open(dir.path()).unwrap();
        assert_eq!(fence.cluster(), None);
        assert_eq!(
            fence.admit(0, 5, ours).await.unwrap_err().kind(),
            ErrorKind::InvalidArgument,
            "joined none yet"
        );
        fence.join("").await.unwrap();
        assert_eq!(fence.cluster(), None, "a metaserver naming none joins nobody");
        fence.join(ours).await.unwrap();
        fence.join(ours).await.unwrap();
        let err = fence.join(theirs).await.unwrap_err();
        assert!(err.message().contains(ours) && err.message().contains(theirs), "{err}");
        let err = fence.admit(0, 7, theirs).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert_eq!(fence.highest(0).await.unwrap(), 0, "another cluster's delete raised nothing");
        drop(fence.admit(0, 7, ours).await.unwrap());
        assert_eq!(fence.highest(0).await.unwrap(), 7);

        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!(reopened.cluster().as_deref(), Some(ours));
        assert!(reopened.join(theirs).await.is_err());
        std::fs::write(dir.path().join(CLUSTER_FILE), "short").unwrap();
        let err = Fence::open(dir.path()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("cluster"), "{err}");
    }

    #[tokio::test]
    async fn each_metadata_group_has_its_own_fence_and_each_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path()).unwrap();
        fence.raise(0, 9).await.unwrap();
        // Group 1's leaders count their own epochs: group 0's 9 fences none of them.
        drop(fence.admit(1, 3, "").await.unwrap());
        assert_eq!((fence.highest(0).await.unwrap(), fence.highest(1).await.unwrap()), (9, 3));
        fence.raise(1, 12).await.unwrap();
        let err = fence.admit(1, 9, "").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotLeader);
        assert!(err.message().contains("metadata group 1") && err.message().contains("epoch 12"), "{err}");
        // A deposed leader of group 0 does not pass with group 1's newer epoch, nor the reverse.
        assert_eq!(fence.admit(0, 8, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
        drop(fence.admit(0, 12, "").await.unwrap());
        assert_eq!(fence.highest(0).await.unwrap(), 12);
        assert_eq!(fence.highest(2).await.unwrap(), 0, "a group never heard from");
        let err = fence.admit(MAX_GROUPS, 1, "").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("out of range"), "{err}");
        assert!(fence.raise(MAX_GROUPS, 1).await.is_err());

        assert_eq!(std::fs::read_to_string(dir.path().join("fence")).unwrap().trim(), "12");
        assert_eq!(std::fs::read_to_string(dir.path().join("fence-g1")).unwrap().trim(), "12");
        assert!(!dir.path().join("fence-g2").exists(), "nothing written for a group not heard from");
        std::fs::write(dir.path().join("fence-g3.tmp"), "half").unwrap();
        let reopened = Fence::open(dir.path()).unwrap();
        assert_eq!((reopened.highest(0).await.unwrap(), reopened.highest(1).await.unwrap()), (12, 12));
        assert_eq!(reopened.admit(1, 11, "").await.unwrap_err().kind(), ErrorKind::NotLeader);
        assert_eq!(reopened.highest(3).await.unwrap(), 0, "a write's leftover is not a fence");

        // Damage is an error, never a fence opened by a fresh start.
        std::fs::write(dir.path().join("fence-g1"), "x").unwrap();
        let err = Fence::open(dir.path()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("fence-g1"), "{err}");
        std::fs::write(dir.path().join("fence-g1"), "12").unwrap();
        std::fs::write(dir.path().join("fence-gx"), "1").unwrap();
        let err = Fence::open(dir.path()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("not a metadata group's fence"), "{err}");
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
