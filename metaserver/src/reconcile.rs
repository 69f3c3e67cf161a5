//! Reconciliation: shards that chunkservers hold but no file references are deleted. They come
//! from writers that crashed between writing shards and committing them, from copies left on a
//! node that was down while its shards were rebuilt elsewhere (when its GC entries were
//! dropped), and from deletes that never arrived. Each up chunkserver lists its shards
//! (`ListShards`, in id order, page by page) and each is judged against the namespace:
//!
//! - referenced — the stripe record has this version and the file's placement puts this index
//!   on this node — it stays;
//! - its inode is gone, or the inode is not a regular file — stale;
//! - the record has this version but the placement names another node — a stale copy;
//! - any other version (uncommitted, or replaced) — stale only when the writer (the client id
//!   in the version's high 32 bits) no longer holds a session and the metaserver is past its
//!   restart grace, since a live writer may still commit it.
//!
//! Nothing younger than `orphan_grace` is touched, whatever the verdict: that covers writes in
//! flight and clients that come back after a partition. Runs under the repair's lock, so never
//! beside a rebuild whose targets are not referenced yet.
//!
//! A namespace that is older than the data (a metaserver restored from a backup, or started on
//! the wrong copy of its data directory within the same cluster) would judge the shards of every
//! file created since as stale. So shards of inodes the namespace does not have are held to a
//! separate, much longer grace (`unknown_inode_grace_ms`, a week), and shards of inode numbers the
//! namespace never handed out (at or above its durable inode reservation) are **foreign**: never
//! deleted unless an operator asks (`cairn fsck --repair --delete-foreign`), counted, logged and
//! shown in `cairn status` until then.

use std::time::Duration;

use cairn_common::{CairnError, Result, ShardId};
use cairn_proto::{DeleteShardsRequest, ListShardsRequest};

use crate::repair::Repair;

/// Shards per ListShards page.
const PAGE: u32 = 5000;

/// What a reconciliation found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub checked: u64,
    pub stale: u64,
    pub stale_bytes: u64,
    pub deleted: u64,
    /// Shards of inode numbers this namespace never handed out, and where they are.
    pub foreign: u64,
    pub foreign_bytes: u64,
    pub foreign_nodes: Vec<u32>,
    /// Chunkservers that could not be listed or cleaned, one line each.
    pub errors: Vec<String>,
}

/// Why a shard on a node is not referenced, if it is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Referenced,
    /// Young, or its writer may still commit: left alone for now.
    Pending,
    Stale,
    /// Of an inode number this namespace never handed out: kept unless an operator asks.
    Foreign,
}

impl Repair {
    /// Judge every shard of every up chunkserver; delete the stale ones (and the foreign ones
    /// when `delete_foreign`) unless `dry_run`.
    pub async fn reconcile(&self, dry_run: bool, delete_foreign: bool) -> ReconcileReport {
        let _running = self.running.lock().await;
        let mut report = ReconcileReport::default();
        for (id, node) in self.nodes().into_iter().filter(|(_, n)| n.up) {
            let foreign_before = report.foreign;
            if let Err(e) = self.reconcile_node(id, &node.addr, dry_run, delete_foreign, &mut report).await {
                report.errors.push(format!("chunkserver {id} ({}): {}", node.addr, e.message()));
            }
            if report.foreign > foreign_before {
                report.foreign_nodes.push(id);
            }
        }
        {
            let mut state = self.cluster.repair_state().lock();
            // (Foreign shards on a chunkserver that could not be cleaned are still there.)
            let deleted_foreign = delete_foreign && !dry_run && report.errors.is_empty();
            state.foreign_shards = if deleted_foreign { 0 } else { report.foreign };
            state.foreign_nodes = if deleted_foreign { Vec::new() } else { report.foreign_nodes.clone() };
        }
        if report.foreign > 0 && !delete_foreign {
            tracing::warn!(
                shards = report.foreign,
                bytes = report.foreign_bytes,
                nodes = ?report.foreign_nodes,
                "chunkservers hold shards of inode numbers this namespace never handed out: is this \
                 metaserver running on an older backup or another copy of its data directory? They \
                 are kept; `cairn fsck --repair --delete-foreign` deletes them"
            );
        }
        if report.deleted > 0 {
            self.cluster.repair_state().lock().stale_shards_deleted += report.deleted;
            tracing::info!(
                deleted = report.deleted,
                bytes = report.stale_bytes,
                "deleted unreferenced shards"
            );
        }
        report
    }

    async fn reconcile_node(
        &self,
        node: u32,
        addr: &str,
        dry_run: bool,
        delete_foreign: bool,
        report: &mut ReconcileReport,
    ) -> Result<()> {
        let mut client = self.chunk_client(addr)?;
        let mut after = None;
        loop {
            let page = client
                .list_shards(ListShardsRequest { after, limit: PAGE })
                .await
                .map_err(CairnError::from)?
                .into_inner();
            let mut stale = Vec::new();
            for entry in &page.shards {
                let Some(id) = entry.id.as_ref() else { continue };
                let id = ShardId::from(id);
                report.checked += 1;
                match self.verdict(node, &id, Duration::from_millis(entry.age_ms))? {
                    Verdict::Stale => {
                        report.stale += 1;
                        report.stale_bytes += entry.bytes;
                        stale.push(cairn_proto::ShardId::from(id));
                    }
                    Verdict::Foreign => {
                        report.foreign += 1;
                        report.foreign_bytes += entry.bytes;
                        if delete_foreign {
                            stale.push(cairn_proto::ShardId::from(id));
                        }
                    }
                    Verdict::Referenced | Verdict::Pending => {}
                }
            }
            if !dry_run && !stale.is_empty() {
                // The namespace the verdicts came from is on disk before anything goes (an
                // unlink a power loss could take back must not have lost its shards).
                let ns = self.ns.clone();
                tokio::task::spawn_blocking(move || ns.store().sync())
                    .await
                    .map_err(|e| CairnError::internal(format!("reconcile sync: {e}")))??;
                let n = stale.len() as u64;
                client
                    .delete_shards(DeleteShardsRequest {
                        ids: stale,
                        fence: self.ns.fence(),
                        cluster_id: self.ns.cluster_id().to_string(),
                        cap: None,
                        // This group's fence: it judges only the shards of its own slots.
                        group: self.ns.group(),
                    })
                    .await
                    .map_err(CairnError::from)?;
                report.deleted += n;
            }
            match page.shards.last() {
                Some(last) if page.more => after = last.id,
                _ => return Ok(()),
            }
        }
    }

    /// Whether shard `id`, found on `node` with a file `age` old, is referenced.
    pub fn verdict(&self, node: u32, id: &ShardId, age: Duration) -> Result<Verdict> {
        if age < self.orphan_grace {
            return Ok(Verdict::Pending);
        }
        // A shard of another group's slot is that group's to judge, not this one's.
        if self.cluster.groups().owner_of(id.ino).0 != self.ns.group() {
            return Ok(Verdict::Pending);
        }
        let Some(inode) = self.ns.find_inode(id.ino)? else {
            if self.ns.is_foreign_ino(id.ino) {
                return Ok(Verdict::Foreign);
            }
            return Ok(if age < self.unknown_grace.max(self.orphan_grace) {
                Verdict::Pending
            } else {
                Verdict::Stale
            });
        };
        let layout = inode.layout();
        if !inode.is_reg() || layout.validate().is_err() || id.index >= layout.width() {
            return Ok(Verdict::Stale);
        }
        match self.ns.stripe_record(id.ino, id.stripe)? {
            Some(record) if record.version == id.version => {
                let home = inode.placement.get(layout.position(id.stripe, id.index)).copied();
                Ok(if home == Some(node) { Verdict::Referenced } else { Verdict::Stale })
            }
            _ => {
                let writer = (id.version >> 32) as u32;
                let sessions = self.cluster.sessions();
                if sessions.is_live(writer) || !sessions.past_grace() {
                    Ok(Verdict::Pending)
                } else {
                    Ok(Verdict::Stale)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use cairn_common::Layout;
    use cairn_proto::{StripeInfo, Timespec};

    use super::*;
    use crate::namespace::NewEntry;

    #[test]
    fn verdicts_follow_the_namespace() {
        let ns = crate::fixture::Fixture::memory_with_lease(
            Layout::new(2, 1, 4096).unwrap(),
            Duration::from_millis(1),
        );
        for i in 0..3 {
            ns.registry()
                .register(&format!("n{i}"), &format!("127.0.0.1:{}", 10 + i), vec![], 0, "")
                .unwrap();
        }
        let new = NewEntry { parent: cairn_common::ROOT_INO, name: b"f", mode: 0o644, uid: 0, gid: 0 };
        let (inode, _) = ns.create(&new, 0, false).unwrap();
        let (ino, placement) = (inode.ino, inode.placement.clone());
        let version = (7u64 << 32) | 1;
        let stripe =
            StripeInfo { index: 0, version, len: 10, written_len: 10, missing: 0, ..Default::default() };
        ns.commit(ino, 10, &[stripe], Some(&Timespec { sec: 1, nsec: 0 })).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let repair = Repair::new(ns.ns.clone(), ns.cluster.clone(), Duration::from_secs(60), 1 << 20)
            .with_orphan_grace(Duration::ZERO)
            .with_unknown_inode_grace(Duration::from_secs(100));
        let old = Duration::from_secs(10);
        let layout = Layout::new(2, 1, 4096).unwrap();
        let home = |i: u32| placement[layout.position(0, i)];
        let id = |index: u32, version: u64| ShardId { ino, stripe: 0, index, version };
        assert_eq!(repair.verdict(home(1), &id(1, version), old).unwrap(), Verdict::Referenced);
        // The same shard on a node the placement does not name: a stale copy.
        let other = (1..=3).find(|n| *n != home(1)).unwrap();
        assert_eq!(repair.verdict(other, &id(1, version), old).unwrap(), Verdict::Stale);
        // An uncommitted version of a writer that has no session: stale once past the grace.
        let uncommitted = (9u64 << 32) | 4;
        assert_eq!(repair.verdict(home(0), &id(0, uncommitted), old).unwrap(), Verdict::Stale);
        // ... but kept while that writer is alive.
        ns.sessions().heartbeat(9, "", None).unwrap();
        assert_eq!(repair.verdict(home(0), &id(0, uncommitted), old).unwrap(), Verdict::Pending);
        // A file that is gone (an inode number handed out before, no longer in the namespace):
        // stale only past the longer grace for unknown inodes.
        let new = NewEntry { parent: cairn_common::ROOT_INO, name: b"g", mode: 0o644, uid: 0, gid: 0 };
        let (removed, _) = ns.create(&new, 0, false).unwrap();
        ns.unlink(cairn_common::ROOT_INO, b"g").unwrap();
        assert!(ns.find_inode(removed.ino).unwrap().is_none());
        let gone = ShardId { ino: removed.ino, stripe: 0, index: 0, version };
        assert_eq!(repair.verdict(home(0), &gone, old).unwrap(), Verdict::Pending);
        assert_eq!(repair.verdict(home(0), &gone, Duration::from_secs(101)).unwrap(), Verdict::Stale);
        // An inode number this namespace never handed out: foreign, whatever its age.
        let foreign = ShardId { ino: ns.inos_reserved_end(), stripe: 0, index: 0, version };
        assert_eq!(
            repair.verdict(home(0), &foreign, Duration::from_secs(1 << 30)).unwrap(),
            Verdict::Foreign
        );
        let far = ShardId { ino: ns.inos_reserved_end() + 5000, ..foreign };
        assert_eq!(repair.verdict(home(0), &far, old).unwrap(), Verdict::Foreign);
        // A shard of a slot another group owns is that group's: never judged here.
        let zero = vec![format!("1=127.0.0.1:1")];
        let group1 = cairn_proto::MetaGroup { group: 1, replicas: vec!["1=127.0.0.1:2".into()] };
        ns.cluster.groups().add(&group1, &zero).unwrap();
        ns.cluster.groups().move_empty_slots(&[5], 1, None, |_| Ok(false)).unwrap();
        let elsewhere = ShardId { ino: (5 << cairn_common::ids::SLOT_SHIFT) | 3, ..foreign };
        assert_eq!(
            repair.verdict(home(0), &elsewhere, Duration::from_secs(1 << 30)).unwrap(),
            Verdict::Pending
        );
        // Young shards are never judged.
        let strict = Repair::new(ns.ns.clone(), ns.cluster.clone(), Duration::from_secs(60), 1 << 20)
            .with_orphan_grace(Duration::from_secs(60));
        assert_eq!(strict.verdict(home(0), &gone, old).unwrap(), Verdict::Pending);
    }
}
