//! What a store does at open to come back from a crash: partial writes (`*.tmp*` files) are
//! removed, every shard file is indexed, and a shard found in two directories (a tier move cut
//! short between its rename and its delete) is settled to one verified copy.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use cairn_common::{CairnError, Result, ShardId};

use super::index::{DirUsage, Index, Location};
use super::placement::TierDir;
use super::ShardStore;
use crate::policy::{system_ms, HotTracker};
use crate::shard::ShardHeader;

/// Create the bucket directories and index the shard files of every directory. A shard found
/// in a second directory (a move interrupted between rename and delete) is not indexed but
/// returned, for `ShardStore::settle_duplicates`; directories are scanned SSD first, so the
/// indexed copy is an SSD one when there is one.
pub(crate) fn scan(dirs: &[TierDir]) -> Result<(Index, Vec<(ShardId, Location)>)> {
    let mut index = Index {
        shards: HashMap::new(),
        usage: vec![DirUsage::default(); dirs.len()],
        hot: HotTracker::default(),
    };
    let mut duplicates = Vec::new();
    for (d, dir) in dirs.iter().enumerate() {
        for bucket in 0..=255u8 {
            let bucket_dir = dir.shards.join(format!("{bucket:02x}"));
            std::fs::create_dir_all(&bucket_dir).map_err(|e| {
                CairnError::from_io(&format!("cannot create shard directory {}", bucket_dir.display()), &e)
            })?;
            scan_bucket(&mut index, &mut duplicates, d, &bucket_dir)?;
        }
    }
    Ok((index, duplicates))
}

fn scan_bucket(
    index: &mut Index,
    duplicates: &mut Vec<(ShardId, Location)>,
    dir: usize,
    bucket_dir: &Path,
) -> Result<()> {
    let ctx = |e: io::Error| CairnError::from_io(&format!("cannot list {}", bucket_dir.display()), &e);
    for entry in std::fs::read_dir(bucket_dir).map_err(ctx)? {
        let entry = entry.map_err(ctx)?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.contains(".tmp") {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed a partial shard write"),
                Err(e) => tracing::warn!(path = %path.display(), "cannot remove partial shard write: {e}"),
            }
            continue;
        }
        let id = match ShardId::parse_file_name(&name) {
            Some(id) if bucket_dir.ends_with(id.bucket()) => id,
            _ => {
                tracing::warn!(path = %path.display(), "ignoring a file that is not a shard of this directory");
                continue;
            }
        };
        let meta = entry.metadata().map_err(ctx)?;
        if !meta.is_file() {
            tracing::warn!(path = %path.display(), "ignoring a shard name that is not a regular file");
            continue;
        }
        let last_access = meta.modified().map(system_ms).unwrap_or(0);
        let loc = Location { dir, file_len: meta.len(), last_access };
        if index.shards.contains_key(&id) {
            duplicates.push((id, loc));
            continue;
        }
        index.insert(id, loc);
    }
    Ok(())
}

impl ShardStore {
    /// Settle shards found in two directories at open (a move cut short between rename and
    /// delete): keep the indexed copy (SSD when there is one) if it verifies, else the other
    /// one if it does, and delete the loser. When neither verifies both files stay for a human.
    pub(crate) async fn settle_duplicates(&self, duplicates: Vec<(ShardId, Location)>) {
        for (id, extra) in duplicates {
            let Some(kept) = self.location(&id) else { continue };
            let (keep, drop) = if self.verify_at(&id, kept).await.is_ok() {
                (kept, extra)
            } else if self.verify_at(&id, extra).await.is_ok() {
                self.index.lock().insert(id, extra);
                (extra, kept)
            } else {
                tracing::error!(
                    shard = %id,
                    a = %self.path(kept.dir, &id).display(),
                    b = %self.path(extra.dir, &id).display(),
                    "both copies of a shard fail verification; keeping both files"
                );
                continue;
            };
            let loser = self.path(drop.dir, &id);
            match tokio::fs::remove_file(&loser).await {
                Ok(()) => {
                    tracing::info!(
                        shard = %id,
                        kept = %self.path(keep.dir, &id).display(),
                        removed = %loser.display(),
                        "settled a shard left in two tiers by an interrupted move"
                    );
                    if let Some(parent) = loser.parent() {
                        if let Err(e) = self.fsync_dir(parent).await {
                            tracing::warn!("{e}");
                        }
                    }
                }
                Err(e) => tracing::warn!(path = %loser.display(), "cannot remove a duplicate shard: {e}"),
            }
        }
    }

    async fn verify_at(&self, id: &ShardId, loc: Location) -> Result<ShardHeader> {
        let path = self.path(loc.dir, id);
        let file = self
            .open_shard(loc.dir, &path)
            .await
            .map_err(|e| CairnError::from_io(&format!("open {}", path.display()), &e))?;
        let result = file.verify(self.engine.as_ref(), id, None, None).await;
        if let Err(e) = &result {
            tracing::warn!(path = %path.display(), "shard copy fails verification: {e}");
        }
        result
    }
}
