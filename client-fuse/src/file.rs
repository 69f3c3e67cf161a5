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

mod commit;
#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
