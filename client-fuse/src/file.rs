//! An open regular file on this client: its geometry, the stripe records it knows, the
//! stripes it has buffered but not yet written, and a small cache of whole stripes for
//! sequential readers.
//!
//! Invariants:
//! - `stripes` holds the newest version of every stripe this client knows: committed ones from
//!   the metaserver, plus ones this client wrote and has not committed yet (also in
//!   `uncommitted`). A stripe is written under a fresh version (copy-on-write) and becomes
//!   visible to other clients only at commit (close/fsync): close-to-open consistency.
//! - `dirty` stripes hold their bytes from the stripe start; a stripe is written out when it is
//!   full, when too many are buffered, or at flush. Bytes of a dirty stripe past its buffer
//!   read as zeros.
//! - A full stripe is written in the background (`in_flight`) while the writer fills the next
//!   one; its bytes stay readable from its buffer. Anything that touches an in-flight stripe
//!   (a write to it, flush, truncation) first waits for it; a failed background write puts the
//!   stripe back among the dirty ones and its error comes back from the next write or flush.
//! - Write-back: once the oldest change not yet committed is older than the mount's commit
//!   interval, [`OpenFile::write_back`] writes out every buffered stripe and commits the
//!   written ones, as close does, but only up to the first stripe it could not write: the
//!   committed size never covers a stripe whose new bytes are not stored, so a crash or an
//!   error later loses only what came after (see `docs/ARCHITECTURE.md`, "Write-back"). A
//!   flush that cannot store a stripe commits by the same rule before it returns the error.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_common::{CairnError, Result};
use cairn_proto::{Attr, StripeInfo};
use futures::future::{join_all, BoxFuture};
use parking_lot::Mutex as SyncMutex;
use tokio::sync::Mutex;

use crate::metrics;
use crate::nodes::Nodes;
use crate::readahead::{Readahead, Window};
use crate::stripe::{
    read_stripe_waiting as read_stripe, read_whole_stripe_waiting, write_stripe_waiting, Geometry, Pieces,
    Reader,
};
use crate::stripe_cache::{StripeCache, REORDERED};

/// What an open file asks of the metaserver: commits, and the stripe records a file giving up
/// its uncommitted stripes checks: a part of [`MetaApi`](crate::meta::MetaApi), so the open-file tests
/// (`file_tests.rs`) give a fake of just this.
pub trait FileMeta: Send + Sync {
    fn commit(&self, req: cairn_proto::CommitRequest) -> BoxFuture<'_, Result<cairn_proto::AttrReply>>;
    fn list_stripes(
        &self,
        req: cairn_proto::ListStripesRequest,
    ) -> BoxFuture<'_, Result<cairn_proto::ListStripesReply>>;
}

/// The change counters a commit or truncation advances: the client's sequence of changes
/// (`any`), and for the inode (bucketed) the number of its latest change in that sequence.
#[derive(Clone, Copy)]
pub struct Changes<'a> {
    pub inode: &'a AtomicU64,
    pub any: &'a AtomicU64,
}

impl Changes<'_> {
    pub fn bump(&self) {
        let seq = self.any.fetch_add(1, Ordering::AcqRel) + 1;
        self.inode.fetch_max(seq, Ordering::AcqRel);
    }
}

/// Stripes buffered per file before the oldest is written out even if not full.
const MAX_DIRTY_STRIPES: usize = 4;
/// Reads in a row, each starting where the previous one ended, that make a sequential stream.
const STREAM_AFTER: u32 = 2;
/// Full stripes per file written in the background at once; a writer past this waits for
/// the oldest.
const WRITES_IN_FLIGHT: usize = 2;

pub struct OpenFile {
    pub geo: Geometry,
    inner: Mutex<Inner>,
    cache: SyncMutex<StripeCache>,
    /// How far ahead of a sequential reader stripes are fetched.
    readahead: Window,
    /// When the oldest change not yet committed was made (`None`: everything is committed),
    /// and when write-back last tried this file. Changed only with `inner` locked; kept
    /// outside it so the write-back scan of every open file takes no async lock.
    pending: SyncMutex<Pending>,
}

#[derive(Clone, Copy, Default)]
struct Pending {
    since: Option<Instant>,
    tried: Option<Instant>,
}

/// What one write-back pass of a file did.
#[derive(Debug, Default)]
pub struct WrittenBack {
    /// The attributes a commit returned (`None`: nothing needed committing).
    pub attr: Option<Attr>,
    /// Stripes committed.
    pub stripes: usize,
    /// Valid bytes in them.
    pub bytes: u64,
    /// The size committed with them (when `stripes` is not 0).
    pub size: u64,
    /// Why some buffered stripe could not be stored: it and everything past it stay
    /// uncommitted.
    pub error: Option<CairnError>,
}

struct Inner {
    size: u64,
    stripes: BTreeMap<u64, StripeInfo>,
    uncommitted: BTreeMap<u64, StripeInfo>,
    dirty: BTreeMap<u64, Vec<u8>>,
    in_flight: BTreeMap<u64, InFlight>,
    size_dirty: bool,
    /// The end of the last read, or of the furthest one while a sequential stream goes on.
    last_read_end: u64,
    /// Reads in a row that started where the previous one ended (reads near the stream, in
    /// stripes it fetched, keep the count); [`STREAM_AFTER`] of them make a stream.
    run: u32,
    /// The bytes of the partial stripe write-back last stored (stripe, version, bytes), so an
    /// appending writer continues it from memory instead of reading it back.
    written_tail: Option<(u64, u64, Vec<u8>)>,
}

/// A full stripe being written in the background.
struct InFlight {
    /// The stripe's bytes, shared with the write (its shards are slices of it).
    buf: Bytes,
    task: tokio::task::JoinHandle<Result<StripeInfo>>,
}

impl OpenFile {
    pub fn new(geo: Geometry, size: u64, stripes: Vec<StripeInfo>, readahead: &Arc<Readahead>) -> OpenFile {
        let readahead = Window::new(readahead.clone(), geo.layout.stripe_bytes());
        let cache = SyncMutex::new(StripeCache::new(geo.layout.stripe_bytes()));
        OpenFile {
            cache,
            readahead,
            geo,
            inner: Mutex::new(Inner {
                size,
                stripes: stripes.into_iter().map(|s| (s.index, s)).collect(),
                uncommitted: BTreeMap::new(),
                dirty: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                size_dirty: false,
                last_read_end: 0,
                run: 0,
                written_tail: None,
            }),
            pending: SyncMutex::new(Pending::default()),
        }
    }

    /// When the oldest change not yet committed was made, if there is one.
    pub fn uncommitted_since(&self) -> Option<Instant> {
        self.pending.lock().since
    }

    /// Note a change (with `inner` locked): the first since the last full commit starts the
    /// write-back clock.
    fn changed(&self) {
        self.pending.lock().since.get_or_insert_with(Instant::now);
    }

    /// Everything is committed (with `inner` locked).
    fn all_committed(&self) {
        self.pending.lock().since = None;
    }

    /// Take the metaserver's newest view (a new open), unless this client has unflushed writes.
    /// Take the metaserver's view of the file from an open, unless this client holds changes
    /// it has not committed. Refused (false) when this client committed to the file, or
    /// truncated it, since `epoch_then` was read before the open was sent: the view predates
    /// that change and would bring back the old stripes.
    pub async fn refresh(
        &self,
        size: u64,
        stripes: Vec<StripeInfo>,
        epoch: &AtomicU64,
        epoch_then: u64,
    ) -> bool {
        let mut inner = self.inner.lock().await;
        if epoch.load(Ordering::Acquire) != epoch_then {
            return false;
        }
        if inner.dirty.is_empty()
            && inner.in_flight.is_empty()
            && inner.uncommitted.is_empty()
            && !inner.size_dirty
        {
            inner.size = size;
            inner.stripes = stripes.into_iter().map(|s| (s.index, s)).collect();
            inner.written_tail = None;
        }
        true
    }

    /// The size this client sees, including writes not yet committed.
    pub async fn size(&self) -> u64 {
        self.inner.lock().await.size
    }

    pub async fn has_unflushed(&self) -> bool {
        let inner = self.inner.lock().await;
        !inner.dirty.is_empty()
            || !inner.in_flight.is_empty()
            || !inner.uncommitted.is_empty()
            || inner.size_dirty
    }

    pub async fn read(&self, nodes: &Arc<Nodes>, offset: u64, len: u32) -> Result<Bytes> {
        let layout = self.geo.layout;
        let stripe_bytes = layout.stripe_bytes();
        let (len, plan, how) = {
            let mut inner = self.inner.lock().await;
            if offset >= inner.size {
                return Ok(Bytes::new());
            }
            let len = (len as u64).min(inner.size - offset);
            // Reads that start where the previous one ended make a stream. The kernel's
            // read-ahead sends several requests at once and they may be served out of order, so
            // a read near the stream's furthest end, in a stripe the stream has fetched or is
            // fetching, keeps it; anything else ends it. A random reader that happens to read
            // two adjacent ranges (or whose kernel read ahead once) must not fetch whole
            // stripes and read ahead. A read at 0 fetches its stripe whole and reads ahead, but
            // starts no stream on its own: a random reader that reads a header first stays
            // random. Any read in a stripe already cached is served from it.
            let continues = offset != 0 && offset == inner.last_read_end;
            let held = self.cache.lock().holds(layout.stripe_of(offset));
            let near = held
                && offset + REORDERED >= inner.last_read_end
                && offset <= inner.last_read_end + REORDERED;
            inner.run = if continues {
                inner.run.saturating_add(1)
            } else if near {
                inner.run
            } else {
                0
            };
            let streaming = inner.run >= STREAM_AFTER;
            let how =
                How { whole: offset == 0 || streaming || held, ahead: offset == 0 || streaming, streaming };
            inner.last_read_end =
                if streaming { inner.last_read_end.max(offset + len) } else { offset + len };
            let mut plan = Vec::new();
            let mut pos = offset;
            while pos < offset + len {
                let stripe = layout.stripe_of(pos);
                let in_stripe = pos - layout.stripe_start(stripe);
                let take = (stripe_bytes - in_stripe).min(offset + len - pos);
                let pending = inner
                    .dirty
                    .get(&stripe)
                    .map(|b| &b[..])
                    .or_else(|| inner.in_flight.get(&stripe).map(|f| &f.buf[..]));
                let source = if let Some(buf) = pending {
                    let from = (in_stripe as usize).min(buf.len());
                    let to = ((in_stripe + take) as usize).min(buf.len());
                    Source::Bytes(buf[from..to].to_vec())
                } else if let Some(info) = inner.stripes.get(&stripe) {
                    Source::Stripe(info.clone())
                } else {
                    Source::Hole
                };
                plan.push((pos - offset, in_stripe, take, source));
                pos += take;
            }
            (len, plan, how)
        };
        // A sequential read inside one cached stripe (the usual 1 MiB read of a big file) is a
        // slice of the stripe's bytes: no buffer to zero and fill.
        if let [(_, in_stripe, take, Source::Stripe(info))] = plan.as_slice() {
            if how.whole {
                let whole = self.cached_stripe(nodes, info, *take, how.streaming).await?;
                let from = *in_stripe as usize;
                if from + *take as usize <= whole.len() {
                    if how.ahead {
                        let last = info.clone();
                        self.read_ahead(nodes, &last).await;
                    }
                    return Ok(whole.slice(from, *take as usize));
                }
            }
        }
        let mut out = vec![0u8; len as usize];
        let mut chunks: Vec<&mut [u8]> = Vec::new();
        let mut rest = out.as_mut_slice();
        for (_, _, take, _) in &plan {
            let (head, tail) = rest.split_at_mut(*take as usize);
            chunks.push(head);
            rest = tail;
        }
        let reads = plan.iter().zip(chunks).map(|((_, in_stripe, _, source), buf)| async move {
            match source {
                Source::Hole => Ok(()),
                Source::Bytes(b) => {
                    buf[..b.len()].copy_from_slice(b);
                    Ok(())
                }
                Source::Stripe(info) if how.whole => {
                    let whole = self.cached_stripe(nodes, info, buf.len() as u64, how.streaming).await?;
                    whole.copy_to(*in_stripe as usize, buf);
                    Ok(())
                }
                Source::Stripe(info) => {
                    read_stripe(nodes, &self.geo, info, *in_stripe, buf, Reader::Random).await
                }
            }
        });
        for r in join_all(reads).await {
            r?;
        }
        if how.ahead {
            if let Some((_, _, _, Source::Stripe(last))) = plan.last() {
                self.read_ahead(nodes, last).await;
            }
        }
        Ok(Bytes::from(out))
    }

    /// A sequential reader just read stripe `last`: fetch the next ones, as many as its window.
    async fn read_ahead(&self, nodes: &Arc<Nodes>, last: &StripeInfo) {
        // From the reader's furthest position: a late request (the kernel's come in any
        // order) would otherwise start stripes the reader has already passed.
        let from = last.index.max(self.cache.lock().front());
        let range = self.readahead.next_range(from);
        if range.is_empty() {
            return;
        }
        let infos: Vec<StripeInfo> = {
            let inner = self.inner.lock().await;
            inner.stripes.range(range).map(|(_, info)| info.clone()).collect()
        };
        for info in infos {
            let Some(cell) = self.cache.lock().ahead_cell(info.index, info.version) else {
                continue;
            };
            if cell.initialized() {
                continue;
            }
            let (nodes, geo) = (nodes.clone(), self.geo.clone());
            tokio::spawn(async move {
                let _ = cell.get_or_try_init(|| fetch_stripe(&nodes, &geo, &info)).await;
            });
        }
    }

    /// A whole stripe's valid bytes, fetched once and shared by concurrent readers. A
    /// stream that finds it still being fetched by read-ahead widens its window.
    async fn cached_stripe(
        &self,
        nodes: &Arc<Nodes>,
        info: &StripeInfo,
        bytes: u64,
        streaming: bool,
    ) -> Result<Pieces> {
        let window = self.readahead.stripes();
        let (cell, caught_up) = self.cache.lock().for_reader(info.index, info.version, bytes, window);
        if caught_up && streaming {
            self.readahead.stalled();
        }
        let name = if cell.initialized() { metrics::STRIPE_CACHE_HITS } else { metrics::STRIPE_CACHE_MISSES };
        ::metrics::counter!(name).increment(1);
        let data = cell.get_or_try_init(|| fetch_stripe(nodes, &self.geo, info)).await?;
        Ok(data.clone())
    }

    /// Buffer a write; a stripe that becomes full is encoded and written in the background.
    pub async fn write(
        &self,
        nodes: &Arc<Nodes>,
        versions: &Versions,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let layout = self.geo.layout;
        let stripe_bytes = layout.stripe_bytes();
        let mut inner = self.inner.lock().await;
        let mut pos = offset;
        let end = offset + data.len() as u64;
        while pos < end {
            let stripe = layout.stripe_of(pos);
            let in_stripe = (pos - layout.stripe_start(stripe)) as usize;
            let take = ((stripe_bytes as usize) - in_stripe).min((end - pos) as usize);
            if inner.in_flight.contains_key(&stripe) {
                self.settle(&mut inner, Some(stripe)).await?;
            }
            if !inner.dirty.contains_key(&stripe) {
                let tail = inner.written_tail.take();
                let base = match inner.stripes.get(&stripe) {
                    // Copy-on-write: the new version starts from the old bytes unless this
                    // write replaces all of them; the stripe write-back just stored is still
                    // in memory.
                    Some(info) if !(in_stripe == 0 && take as u64 >= info.len) => match tail {
                        Some((s, version, buf)) if s == stripe && version == info.version => buf,
                        _ => {
                            let mut buf = vec![0u8; info.len as usize];
                            read_stripe(nodes, &self.geo, info, 0, &mut buf, Reader::Whole).await?;
                            buf
                        }
                    },
                    _ => Vec::with_capacity(stripe_bytes as usize),
                };
                inner.dirty.insert(stripe, base);
            }
            self.cache.lock().forget(stripe);
            let buf = inner.dirty.get_mut(&stripe).expect("inserted above");
            if buf.len() < in_stripe + take {
                buf.resize(in_stripe + take, 0);
            }
            let from = (pos - offset) as usize;
            buf[in_stripe..in_stripe + take].copy_from_slice(&data[from..from + take]);
            let full = buf.len() as u64 == stripe_bytes;
            pos += take as u64;
            if pos > inner.size {
                inner.size = pos;
            }
            inner.size_dirty = true;
            self.changed();
            if full {
                self.start_write(&mut inner, nodes, versions, stripe);
                if inner.in_flight.len() > WRITES_IN_FLIGHT {
                    let oldest = *inner.in_flight.keys().next().expect("not empty");
                    self.settle(&mut inner, Some(oldest)).await?;
                }
            }
        }
        if inner.dirty.len() > MAX_DIRTY_STRIPES {
            let oldest: Vec<u64> =
                inner.dirty.keys().take(inner.dirty.len() - MAX_DIRTY_STRIPES).copied().collect();
            self.write_out(&mut inner, nodes, versions, &oldest).await?;
        }
        Ok(())
    }

    /// Start writing the full dirty stripe `stripe` in the background.
    fn start_write(&self, inner: &mut Inner, nodes: &Arc<Nodes>, versions: &Versions, stripe: u64) {
        let Some(buf) = inner.dirty.remove(&stripe) else { return };
        let buf = Bytes::from(buf);
        let (nodes, geo, versions, data) = (nodes.clone(), self.geo.clone(), versions.clone(), buf.clone());
        let task = tokio::spawn(async move {
            write_stripe_waiting(&nodes, &geo, stripe, || versions.next(), &data).await
        });
        inner.in_flight.insert(stripe, InFlight { buf, task });
    }

    /// Wait for background stripe writes (`only` one, or all) and take their outcome: a
    /// written stripe becomes the file's (uncommitted) version, a failed one dirty again. The
    /// first error is returned.
    async fn settle(&self, inner: &mut Inner, only: Option<u64>) -> Result<()> {
        let which: Vec<u64> = match only {
            Some(stripe) => vec![stripe],
            None => inner.in_flight.keys().copied().collect(),
        };
        let mut first_error = None;
        for stripe in which {
            let Some(f) = inner.in_flight.remove(&stripe) else { continue };
            let result = f
                .task
                .await
                .unwrap_or_else(|e| Err(CairnError::internal(format!("stripe {stripe} write task: {e}"))));
            match result {
                Ok(info) => {
                    inner.stripes.insert(stripe, info.clone());
                    inner.uncommitted.insert(stripe, info);
                }
                Err(e) => {
                    inner.dirty.insert(stripe, Vec::from(f.buf));
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Encode and store the given dirty stripes in parallel. A stripe whose write fails stays
    /// buffered, so a later flush can retry it; the first error is returned.
    async fn write_out(
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

    /// Apply a truncate the metaserver has done: drop stripes past the end and clamp the last.
    pub async fn truncated(&self, size: u64) {
        let layout = self.geo.layout;
        let mut inner = self.inner.lock().await;
        // A failed background write is dirty again and cut like the others.
        let _ = self.settle(&mut inner, None).await;
        inner.size = size;
        inner.written_tail = None;
        let keep = layout.stripes_for(size);
        inner.stripes.retain(|i, _| *i < keep);
        inner.uncommitted.retain(|i, _| *i < keep);
        inner.dirty.retain(|i, _| *i < keep);
        if keep > 0 {
            let last = keep - 1;
            let valid = size - layout.stripe_start(last);
            if let Some(info) = inner.stripes.get_mut(&last) {
                info.len = info.len.min(valid);
            }
            if let Some(buf) = inner.dirty.get_mut(&last) {
                buf.truncate(valid as usize);
            }
        }
        *self.cache.lock() = StripeCache::new(self.geo.layout.stripe_bytes());
    }
}

/// Stripe versions no other writer can produce: the client id the metaserver handed out at
/// mount in the high 32 bits, a counter in the low 32. Clones share the counter.
#[derive(Clone)]
pub struct Versions {
    client_id: u32,
    counter: Arc<std::sync::atomic::AtomicU32>,
}

impl Versions {
    pub fn new(client_id: u32) -> Versions {
        Versions { client_id, counter: Arc::new(std::sync::atomic::AtomicU32::new(0)) }
    }

    pub fn next(&self) -> u64 {
        let n = self.counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u64 + 1;
        ((self.client_id as u64) << 32) | n
    }
}

/// How a read is served: from whole stripes in the stripe cache (`whole`), with read-ahead
/// after it (`ahead`), as part of an established stream (`streaming`: may widen the window).
#[derive(Clone, Copy)]
struct How {
    whole: bool,
    ahead: bool,
    streaming: bool,
}

enum Source {
    Hole,
    Bytes(Vec<u8>),
    Stripe(StripeInfo),
}

/// A whole stripe's valid bytes, read from the chunkservers (what the stripe cache holds).
async fn fetch_stripe(nodes: &Arc<Nodes>, geo: &Geometry, info: &StripeInfo) -> Result<Pieces> {
    let pieces = read_whole_stripe_waiting(nodes, geo, info).await?;
    ::metrics::counter!(metrics::STRIPE_FETCHED_BYTES).increment(pieces.len() as u64);
    Ok(pieces)
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
