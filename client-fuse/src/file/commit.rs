//! Writing an open file's buffered stripes out and committing them: close and fsync
//! ([`OpenFile::flush`]), the write-back of a file left open ([`OpenFile::write_back`]), both
//! committing only up to the first stripe that could not be stored, and giving up what could
//! not be committed ([`OpenFile::abandon`]), which deletes only shards no record refers to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_common::{CairnError, Result};
use cairn_proto::{Attr, StripeInfo};
use futures::future::join_all;

use super::{Changes, FileMeta, Inner, OpenFile, Pending, Versions, WrittenBack};
use crate::nodes::Nodes;
use crate::stripe::write_stripe_waiting;

impl OpenFile {
    /// Encode and store the given dirty stripes in parallel. A stripe whose write fails stays
    /// buffered, so a later flush can retry it; the first error is returned.
    pub(super) async fn write_out(
        &self,
        inner: &mut Inner,
        nodes: &Arc<Nodes>,
        versions: &Versions,
        which: &[u64],
    ) -> Result<()> {
        let bufs: Vec<(u64, Bytes)> =
            which.iter().filter_map(|s| inner.dirty.remove(s).map(|b| (*s, Bytes::from(b)))).collect();
        let writes = bufs
            .iter()
            .map(|(stripe, buf)| write_stripe_waiting(nodes, &self.geo, *stripe, || versions.next(), buf));
        let results = join_all(writes).await;
        let mut first_error = None;
        for ((stripe, buf), result) in bufs.into_iter().zip(results) {
            match result {
                Ok(info) => {
                    inner.stripes.insert(stripe, info.clone());
                    inner.uncommitted.insert(stripe, info);
                }
                Err(e) => {
                    inner.dirty.insert(stripe, Vec::from(buf));
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Write out every buffered stripe and commit size and stripe versions to the metaserver;
    /// with `sync` (fsync), have the chunkservers put the file's shards on disk before the
    /// commit. Returns the committed attributes, or `None` when there was nothing to commit.
    /// `changes` (the client's change counters) are advanced when a commit goes out, while
    /// this file's lock is still held, so an open or getattr racing with the commit sees them
    /// moved. When a stripe cannot be stored, what was stored below it is still committed (as
    /// write-back would) before the error is returned, so a failed close loses only what it
    /// could not store; the file is then not written back again until another interval passed.
    pub async fn flush(
        &self,
        nodes: &Arc<Nodes>,
        meta: &dyn FileMeta,
        versions: &Versions,
        changes: Changes<'_>,
        sync: bool,
    ) -> Result<Option<Attr>> {
        // Under `durability=close` a close's commit need only be in the metaserver's log.
        let durable = sync || !nodes.buffered();
        let mut inner = self.inner.lock().await;
        // A background write that failed is dirty again: written once more just below.
        if let Err(e) = self.settle(&mut inner, None).await {
            tracing::warn!(ino = self.geo.ino, "background stripe write failed ({e}); trying again");
        }
        let all: Vec<u64> = inner.dirty.keys().copied().collect();
        if let Err(e) = self.write_out(&mut inner, nodes, versions, &all).await {
            self.pending.lock().tried = Some(Instant::now());
            match self.commit_stored(&mut inner, meta, changes, durable).await {
                Ok(done) if done.stripes > 0 => tracing::warn!(
                    ino = self.geo.ino,
                    stripes = done.stripes,
                    size = done.size,
                    "a stripe could not be stored ({e}); committed what was stored before it"
                ),
                Ok(_) => {}
                Err(c) => tracing::warn!(ino = self.geo.ino, "committing what was stored: {c}"),
            }
            return Err(e);
        }
        if sync && nodes.buffered() {
            // Before the commit: a committed stripe must not name shards a power loss could
            // still take back once fsync returned.
            crate::stripe::sync_shards(nodes, &self.geo).await?;
        }
        // Nothing is buffered any more: everything written is committed, with the size.
        Ok(self.commit_stored(&mut inner, meta, changes, durable).await?.attr)
    }

    /// Write-back: if the oldest uncommitted change was made before `due` and this file was
    /// not tried since `due`, write out every buffered stripe (partial ones too) and commit
    /// the stripes written below the first one that could not be, with the size up to there.
    /// Stripes past a failed one stay uncommitted, and the failed one stays buffered, for the
    /// next pass or the close, which reports the error. Returns what was done; `None` when
    /// the file was not due. An `Err` is a failed commit.
    pub async fn write_back(
        &self,
        nodes: &Arc<Nodes>,
        meta: &dyn FileMeta,
        versions: &Versions,
        changes: Changes<'_>,
        due: Instant,
    ) -> Result<Option<WrittenBack>> {
        let is_due = |p: Pending| p.since.is_some_and(|t| t <= due) && p.tried.is_none_or(|t| t <= due);
        if !is_due(*self.pending.lock()) {
            return Ok(None);
        }
        let mut inner = self.inner.lock().await;
        {
            // A close or another pass may have committed (or failed) while this one waited for
            // the lock.
            let mut pending = self.pending.lock();
            if !is_due(*pending) {
                return Ok(None);
            }
            pending.tried = Some(Instant::now());
        }
        let mut failure = self.settle(&mut inner, None).await.err();
        // An appending writer continues the partial last stripe: keep its bytes for it.
        let tail = match inner.dirty.last_key_value() {
            Some((s, buf)) if (buf.len() as u64) < self.geo.layout.stripe_bytes() => Some((*s, buf.clone())),
            _ => None,
        };
        let all: Vec<u64> = inner.dirty.keys().copied().collect();
        if let Err(e) = self.write_out(&mut inner, nodes, versions, &all).await {
            failure.get_or_insert(e);
        }
        if let Some((stripe, buf)) = tail {
            if let (false, Some(info)) = (inner.dirty.contains_key(&stripe), inner.uncommitted.get(&stripe)) {
                inner.written_tail = Some((stripe, info.version, buf));
            }
        }
        if inner.dirty.is_empty() {
            // A background write that had failed was stored on the second try.
            failure = None;
        }
        let done = self.commit_stored(&mut inner, meta, changes, !nodes.buffered()).await?;
        Ok((done.attr.is_some() || failure.is_some()).then_some(WrittenBack { error: failure, ..done }))
    }

    /// Commit (on the metaserver's disk before the answer when `durable`) the stripes written
    /// and not yet committed that lie below the first stripe still
    /// buffered (one that could not be stored), with the size up to there; with none buffered,
    /// all of them and the file's size. Nothing at or past a buffered stripe is committed: the
    /// committed size must never cover bytes that are not stored. `Commit` grows a size,
    /// never shrinks it.
    async fn commit_stored(
        &self,
        inner: &mut Inner,
        meta: &dyn FileMeta,
        changes: Changes<'_>,
        durable: bool,
    ) -> Result<WrittenBack> {
        let first_unwritten = inner.dirty.keys().next().copied();
        let (size, stripes): (u64, Vec<StripeInfo>) = match first_unwritten {
            None => (inner.size, inner.uncommitted.values().cloned().collect()),
            Some(stripe) => (
                inner.size.min(self.geo.layout.stripe_start(stripe)),
                inner.uncommitted.range(..stripe).map(|(_, info)| info.clone()).collect(),
            ),
        };
        if stripes.is_empty() && (first_unwritten.is_some() || !inner.size_dirty) {
            if first_unwritten.is_none() {
                self.all_committed();
            }
            return Ok(WrittenBack::default());
        }
        let req = cairn_proto::CommitRequest {
            ino: self.geo.ino,
            size,
            stripes: stripes.clone(),
            mtime: Some(cairn_common::time::now()),
            buffered: !durable,
            once: None,
        };
        let committed = meta.commit(req).await;
        // Even a failed commit may have been applied (the answer was lost): count it as a change.
        changes.bump();
        let attr = committed?.attr.ok_or_else(|| CairnError::internal("commit: no attr"))?;
        for info in &stripes {
            inner.uncommitted.remove(&info.index);
        }
        if first_unwritten.is_none() {
            inner.size_dirty = false;
            self.all_committed();
        }
        Ok(WrittenBack {
            attr: Some(attr),
            stripes: stripes.len(),
            bytes: stripes.iter().map(|s| s.len).sum(),
            size,
            error: None,
        })
    }

    /// Give up on what could not be committed (the last handle closed after a failed flush):
    /// drop the buffers and delete the shards of stripes written but never committed. A failed
    /// commit may still have been applied (the metaserver died after writing it, before
    /// answering), so only shards the metaserver confirms it does not reference are deleted;
    /// when it cannot be asked, they stay, and its reconciliation deletes them once this
    /// client's session is gone. Best effort: a chunkserver that cannot be reached keeps them.
    pub async fn abandon(&self, meta: &dyn FileMeta, nodes: &Arc<Nodes>) {
        let mut inner = self.inner.lock().await;
        // Written stripes become uncommitted ones, deleted below like the others.
        let _ = self.settle(&mut inner, None).await;
        inner.dirty.clear();
        inner.size_dirty = false;
        inner.written_tail = None;
        self.all_committed();
        let uncommitted: Vec<StripeInfo> = std::mem::take(&mut inner.uncommitted).into_values().collect();
        for info in &uncommitted {
            inner.stripes.remove(&info.index);
        }
        drop(inner);
        let committed = match self.committed_versions(meta, &uncommitted).await {
            Ok(versions) => versions,
            Err(e) => {
                tracing::warn!(
                    ino = self.geo.ino,
                    "cannot tell which stripes were committed ({e}); leaving their shards to the \
                     metaserver's reconciliation"
                );
                return;
            }
        };
        let mut by_node: BTreeMap<u32, Vec<cairn_common::ShardId>> = BTreeMap::new();
        for info in uncommitted.iter().filter(|i| committed.get(&i.index) != Some(&i.version)) {
            for index in 0..self.geo.layout.width() {
                if info.missing & (1 << index) == 0 && self.geo.layout.shard_len(index, info.written_len) > 0
                {
                    let id = self.geo.shard(info.index, index, info.version);
                    by_node.entry(self.geo.node(info.index, index)).or_default().push(id);
                }
            }
        }
        let deletes = by_node.into_iter().map(|(node, ids)| nodes.delete_shards(node, ids));
        for result in join_all(deletes).await {
            if let Err(e) = result {
                tracing::warn!(ino = self.geo.ino, "could not delete uncommitted shards: {e}");
            }
        }
    }

    /// The committed version of each stripe of `stripes` that has a record, from the metaserver.
    async fn committed_versions(
        &self,
        meta: &dyn FileMeta,
        stripes: &[StripeInfo],
    ) -> Result<BTreeMap<u64, u64>> {
        let mut out = BTreeMap::new();
        let (Some(first), Some(last)) =
            (stripes.iter().map(|s| s.index).min(), stripes.iter().map(|s| s.index).max())
        else {
            return Ok(out);
        };
        let mut from = first;
        loop {
            let req = cairn_proto::ListStripesRequest { ino: self.geo.ino, from, limit: 4096 };
            let page = match meta.list_stripes(req).await {
                Ok(page) => page,
                // The file is gone: nothing references its shards.
                Err(e) if e.kind() == cairn_common::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(e),
            };
            out.extend(page.stripes.iter().map(|s| (s.index, s.version)));
            match page.stripes.last() {
                Some(s) if page.more && s.index < last => from = s.index + 1,
                _ => return Ok(out),
            }
        }
    }
}
