//! The open-file state machine without servers: six fake chunkservers (shards in memory, each
//! can be taken down) behind the real `Nodes`, and a fake metaserver that records commits.
//! Writes, background stripe writes, flush, write-back, the commit rule (nothing at or past a
//! stripe that could not be stored) and the refusal of a view older than this client's own
//! commit are checked against what the fakes hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_common::{CairnError, ErrorKind, Layout, Result, ShardId};
use cairn_proto::{self as p, Capability, StripeInfo};
use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::{Changes, FileMeta, OpenFile, Versions};
use crate::fakes::FakeChunk;
use crate::nodes::{NodeDirectory, Nodes, ShardApi};
use crate::readahead::Readahead;
use crate::stripe::Geometry;

/// 4+2 with 4 KiB units: 16 KiB stripes.
const STRIPE: usize = 4 * 4096;
const INO: u64 = 77;

/// Six fake chunkservers, node ids 1..=6.
struct Cluster {
    chunks: Vec<Arc<FakeChunk>>,
    /// Shards reported damaged, in order.
    reported: Mutex<Vec<ShardId>>,
}

impl Cluster {
    fn new() -> Arc<Cluster> {
        Arc::new(Cluster { chunks: (0..6).map(|_| Arc::default()).collect(), reported: Mutex::default() })
    }

    /// Replace shard `id`'s bytes, wherever it is stored, by other bytes of the same length
    /// (as a chunkserver serving a forged shard with valid checksums would).
    fn forge(&self, id: ShardId) {
        self.forge_at(id, 0);
    }

    /// [`Cluster::forge`], the byte at `at` changed.
    fn forge_at(&self, id: ShardId, at: usize) {
        for chunk in &self.chunks {
            if let Some(data) = chunk.shards.lock().get_mut(&id) {
                let mut forged = data.to_vec();
                forged[at] ^= 0x5a;
                *data = Bytes::from(forged);
                return;
            }
        }
        panic!("no chunkserver holds {id}");
    }

    fn set_down(&self, nodes: &[u32], down: bool) {
        for n in nodes {
            self.chunks[*n as usize - 1].down.store(down, Ordering::SeqCst);
        }
    }

    fn refuse_stripe(&self, nodes: &[u32], stripe: Option<u64>) {
        for n in nodes {
            *self.chunks[*n as usize - 1].refused_stripe.lock() = stripe;
        }
    }

    fn shards(&self) -> usize {
        self.chunks.iter().map(|c| c.shards.lock().len()).sum()
    }

    fn reads(&self) -> u64 {
        self.chunks.iter().map(|c| c.reads.load(Ordering::SeqCst)).sum()
    }
}

impl NodeDirectory for Cluster {
    fn list_nodes(&self) -> BoxFuture<'_, Result<Vec<(u32, String)>>> {
        Box::pin(async move { Ok((1..=6).map(|n| (n, format!("fake:{n}"))).collect()) })
    }

    fn grant_capability(&self, req: p::CapabilityRequest) -> BoxFuture<'_, Result<Capability>> {
        Box::pin(async move { Ok(Capability { ino: req.ino, ..Default::default() }) })
    }

    fn report_damaged(&self, ids: Vec<ShardId>) -> BoxFuture<'static, Result<()>> {
        self.reported.lock().extend(ids);
        Box::pin(async { Ok(()) })
    }

    fn connect(&self, addr: &str) -> Result<Arc<dyn ShardApi>> {
        let n: usize = addr.trim_start_matches("fake:").parse().expect("a fake address");
        Ok(self.chunks[n - 1].clone())
    }
}

/// The metaserver's side of commits: each one recorded, the stripes kept as the records.
#[derive(Default)]
struct FakeMeta {
    commits: Mutex<Vec<p::CommitRequest>>,
    records: Mutex<HashMap<u64, StripeInfo>>,
}

impl FakeMeta {
    /// (size, stripe indexes) of every commit so far.
    fn commits(&self) -> Vec<(u64, Vec<u64>)> {
        self.commits.lock().iter().map(|c| (c.size, c.stripes.iter().map(|s| s.index).collect())).collect()
    }

    fn records(&self) -> Vec<StripeInfo> {
        let mut all: Vec<StripeInfo> = self.records.lock().values().cloned().collect();
        all.sort_by_key(|s| s.index);
        all
    }
}

impl FileMeta for FakeMeta {
    fn commit(&self, req: p::CommitRequest) -> BoxFuture<'_, Result<p::AttrReply>> {
        Box::pin(async move {
            self.records.lock().extend(req.stripes.iter().map(|s| (s.index, s.clone())));
            let attr = p::Attr { ino: req.ino, size: req.size, ..Default::default() };
            self.commits.lock().push(req);
            Ok(p::AttrReply { attr: Some(attr), parent: None, elsewhere: false })
        })
    }

    fn list_stripes(&self, req: p::ListStripesRequest) -> BoxFuture<'_, Result<p::ListStripesReply>> {
        Box::pin(async move {
            let stripes = self.records().into_iter().filter(|s| s.index >= req.from).collect();
            Ok(p::ListStripesReply { stripes, more: false })
        })
    }
}

/// One client's view: the fakes, its `Nodes` over them, and its change counters.
struct Setup {
    cluster: Arc<Cluster>,
    nodes: Arc<Nodes>,
    meta: FakeMeta,
    versions: Versions,
    readahead: Arc<Readahead>,
    epoch: AtomicU64,
    any: AtomicU64,
}

impl Setup {
    async fn new() -> Setup {
        let cluster = Cluster::new();
        let nodes = Arc::new(Nodes::with_directory(cluster.clone(), 0));
        nodes.refresh().await.unwrap();
        Setup {
            cluster,
            nodes,
            meta: FakeMeta::default(),
            versions: Versions::new(5),
            readahead: Readahead::new(64 << 20),
            epoch: AtomicU64::new(0),
            any: AtomicU64::new(0),
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry { ino: INO, layout: Layout::new(4, 2, 4096).unwrap(), placement: (1..=6).collect() }
    }

    /// A new, empty file.
    fn create(&self) -> OpenFile {
        OpenFile::new(self.geometry(), 0, Vec::new(), &self.readahead)
    }

    /// The file as another client opening it now would see it: the committed records.
    fn reopen(&self, size: u64) -> OpenFile {
        OpenFile::new(self.geometry(), size, self.meta.records(), &self.readahead)
    }

    fn changes(&self) -> Changes<'_> {
        Changes { inode: &self.epoch, any: &self.any }
    }

    async fn write(&self, file: &OpenFile, offset: u64, data: &[u8]) -> Result<()> {
        // In pieces, as the kernel sends them.
        for (n, piece) in data.chunks(3000).enumerate() {
            file.write(&self.nodes, &self.versions, offset + (n * 3000) as u64, piece).await?;
        }
        Ok(())
    }

    async fn flush(&self, file: &OpenFile) -> Result<Option<p::Attr>> {
        file.flush(&self.nodes, &self.meta, &self.versions, self.changes(), false).await
    }

    async fn read_all(&self, file: &OpenFile, size: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let chunk = file.read(&self.nodes, out.len() as u64, 5000).await.unwrap();
            assert!(!chunk.is_empty(), "a read at {} of {size} returned nothing", out.len());
            out.extend_from_slice(&chunk);
        }
        out
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed).wrapping_add((i >> 9) as u8)).collect()
}

#[tokio::test]
async fn a_flush_stores_every_stripe_and_commits_them_with_the_size() {
    let s = Setup::new().await;
    let file = s.create();
    let data = pattern(2 * STRIPE + STRIPE / 2, 1);
    s.write(&file, 0, &data).await.unwrap();
    assert!(file.uncommitted_since().is_some());
    let attr = s.flush(&file).await.unwrap().expect("something to commit");
    assert_eq!(attr.size, data.len() as u64);
    assert_eq!(s.meta.commits(), vec![(data.len() as u64, vec![0, 1, 2])], "one commit of every stripe");
    assert!(file.uncommitted_since().is_none());
    assert!(s.meta.records().iter().all(|r| r.missing == 0), "{:?}", s.meta.records());
    // The full stripes are on all six nodes (4 data shards and 2 parity each); the half stripe
    // has two data shards with bytes (empty ones are not stored) and its two parity shards.
    assert_eq!(s.cluster.shards(), 2 * 6 + 4);
    // Another client sees the bytes, also with two chunkservers gone (reconstructed).
    assert!(s.read_all(&s.reopen(attr.size), attr.size).await == data);
    s.cluster.set_down(&[2, 5], true);
    assert!(s.read_all(&s.reopen(attr.size), attr.size).await == data, "a degraded read differs");
    // Nothing more to commit: a second flush sends nothing.
    assert!(s.flush(&file).await.unwrap().is_none());
    assert_eq!(s.meta.commits().len(), 1);
}

#[tokio::test]
async fn a_stripe_that_cannot_be_stored_stays_buffered_and_nothing_past_it_is_committed() {
    let s = Setup::new().await;
    let file = s.create();
    let first = pattern(STRIPE, 2);
    s.write(&file, 0, &first).await.unwrap();
    // Stripe 0 is full and written in the background: wait until its six shards are stored.
    for _ in 0..500 {
        if s.cluster.shards() == 6 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert_eq!(s.cluster.shards(), 6);
    // Three of six chunkservers gone: a 4+2 stripe cannot be stored.
    s.cluster.set_down(&[1, 3, 4], true);
    let rest = pattern(STRIPE + 5000, 3);
    s.write(&file, STRIPE as u64, &rest).await.unwrap();
    let err = s.flush(&file).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooFewNodes, "{err}");
    // Stripe 0 (written in the background before the nodes went) is committed, with the size
    // up to where the unstored stripes start: never covering bytes that are not stored.
    assert_eq!(s.meta.commits(), vec![(STRIPE as u64, vec![0])]);
    assert!(file.has_unflushed().await, "the unstored stripes stay buffered");
    assert_eq!(file.size().await, (2 * STRIPE + 5000) as u64, "this client still sees its writes");
    // The nodes come back: the next flush stores and commits the rest.
    s.cluster.set_down(&[1, 3, 4], false);
    let attr = s.flush(&file).await.unwrap().expect("the rest committed");
    let size = (2 * STRIPE + 5000) as u64;
    assert_eq!(attr.size, size);
    assert_eq!(s.meta.commits()[1], (size, vec![1, 2]));
    let all = [first, rest].concat();
    assert!(s.read_all(&s.reopen(size), size).await == all);
}

#[tokio::test]
async fn write_back_commits_nothing_at_or_past_a_stripe_it_could_not_store() {
    let s = Setup::new().await;
    let file = s.create();
    // Stripe 1 cannot be stored (three chunkservers refuse it); stripes 0 and 2 can.
    s.cluster.refuse_stripe(&[2, 4, 6], Some(1));
    let data = pattern(3 * STRIPE, 10);
    s.write(&file, 0, &data).await.ok();
    let done = file
        .write_back(&s.nodes, &s.meta, &s.versions, s.changes(), Instant::now())
        .await
        .unwrap()
        .expect("the file was due");
    assert!(done.error.is_some(), "the unstored stripe is reported");
    // Stripe 2 is stored, but committing it (or a size past stripe 1) would publish a file
    // whose stripe 1 holds old bytes: only stripe 0 and the size up to it are committed.
    assert_eq!(s.meta.commits(), vec![(STRIPE as u64, vec![0])]);
    assert!(file.uncommitted_since().is_some(), "the rest is still to be committed");
    s.cluster.refuse_stripe(&[2, 4, 6], None);
    let attr = s.flush(&file).await.unwrap().unwrap();
    assert_eq!(attr.size, data.len() as u64);
    assert_eq!(s.meta.commits()[1], (data.len() as u64, vec![1, 2]));
    assert!(s.read_all(&s.reopen(attr.size), attr.size).await == data);
}

#[tokio::test]
async fn write_back_commits_a_partial_stripe_and_an_append_continues_it_from_memory() {
    let s = Setup::new().await;
    let file = s.create();
    let head = pattern(10_000, 4);
    s.write(&file, 0, &head).await.unwrap();
    let due = Instant::now();
    let done = file
        .write_back(&s.nodes, &s.meta, &s.versions, s.changes(), due)
        .await
        .unwrap()
        .expect("the file was due");
    assert_eq!((done.stripes, done.size, done.error.is_none()), (1, 10_000, true));
    assert!(file.uncommitted_since().is_none(), "everything committed");
    // Not due again until something changes.
    assert!(file
        .write_back(&s.nodes, &s.meta, &s.versions, s.changes(), Instant::now())
        .await
        .unwrap()
        .is_none());
    // Appending to the partial stripe starts from the bytes write-back kept, not from a read of
    // the shards it just stored.
    let tail = pattern(10_000, 5);
    s.write(&file, 10_000, &tail).await.unwrap();
    assert_eq!(s.cluster.reads(), 0, "the append read the stored stripe back");
    let attr = s.flush(&file).await.unwrap().unwrap();
    assert_eq!(attr.size, 20_000);
    assert!(s.read_all(&s.reopen(20_000), 20_000).await == [head, tail].concat());
}

#[tokio::test]
async fn a_view_older_than_this_clients_commit_is_refused() {
    let s = Setup::new().await;
    let file = s.create();
    s.write(&file, 0, &pattern(STRIPE, 6)).await.unwrap();
    s.flush(&file).await.unwrap();
    let committed = s.meta.records();
    // An open sent before that commit (it read the counter then) answers with the old,
    // empty file: refused, the file keeps what this client wrote.
    let before = s.epoch.load(Ordering::Acquire) - 1;
    assert!(!file.refresh(0, Vec::new(), &s.epoch, before).await);
    assert_eq!(file.size().await, STRIPE as u64);
    // The same view read after the commit is taken (nothing is buffered).
    let now = s.epoch.load(Ordering::Acquire);
    assert!(file.refresh(STRIPE as u64, committed.clone(), &s.epoch, now).await);
    // While this client holds changes of its own, a fresh view does not replace them.
    s.write(&file, STRIPE as u64, &pattern(100, 7)).await.unwrap();
    assert!(file.refresh(STRIPE as u64, committed, &s.epoch, now).await);
    assert_eq!(file.size().await, STRIPE as u64 + 100, "a refresh dropped buffered writes");
}

#[tokio::test]
async fn giving_up_deletes_the_shards_of_stripes_never_committed() {
    let s = Setup::new().await;
    let file = s.create();
    s.write(&file, 0, &pattern(STRIPE, 8)).await.unwrap();
    s.flush(&file).await.unwrap();
    assert_eq!(s.cluster.shards(), 6);
    // A second stripe stored but never committed (the close failed later), then given up.
    s.write(&file, STRIPE as u64, &pattern(STRIPE, 9)).await.unwrap();
    file.write_back(&s.nodes, &FailingCommits, &s.versions, s.changes(), Instant::now()).await.unwrap_err();
    assert_eq!(s.cluster.shards(), 12, "both stripes are stored");
    file.abandon(&s.meta, &s.nodes).await;
    assert_eq!(s.cluster.shards(), 6, "only the committed stripe's shards are left");
    assert!(!file.has_unflushed().await);
}

/// A metaserver whose commits fail (and were not applied).
struct FailingCommits;

impl FileMeta for FailingCommits {
    fn commit(&self, _req: p::CommitRequest) -> BoxFuture<'_, Result<p::AttrReply>> {
        Box::pin(async { Err(CairnError::unavailable("no metaserver leader")) })
    }

    fn list_stripes(&self, _req: p::ListStripesRequest) -> BoxFuture<'_, Result<p::ListStripesReply>> {
        Box::pin(async { Err(CairnError::unavailable("no metaserver leader")) })
    }
}

/// A data shard whose bytes are not what its writer wrote (a forged shard: the chunkserver's
/// own checksums would pass) is caught by the content hash the writer committed: the reader
/// gets the written bytes from the other shards and reports the shard. More forged shards than
/// the stripe can do without: the read fails with EIO, never returns the forged bytes.
#[tokio::test]
async fn a_forged_data_shard_is_caught_by_its_content_hash() {
    let s = Setup::new().await;
    let file = s.create();
    let data = pattern(2 * STRIPE + 3000, 21);
    s.write(&file, 0, &data).await.unwrap();
    let size = s.flush(&file).await.unwrap().expect("committed").size;
    for r in s.meta.records() {
        assert_eq!(
            r.hashes.len(),
            4 * cairn_common::content::HASH_LEN,
            "stripe {}: one hash per data shard",
            r.index
        );
    }
    let shard = |stripe, index| ShardId {
        ino: INO,
        stripe,
        index,
        version: s.meta.records()[stripe as usize].version,
    };

    s.cluster.forge(shard(0, 1));
    s.cluster.forge(shard(2, 0)); // the short last stripe: its one data shard
    assert!(s.read_all(&s.reopen(size), size).await == data, "forged bytes were read");
    let reported = s.cluster.reported.lock().clone();
    assert!(reported.contains(&shard(0, 1)) && reported.contains(&shard(2, 0)), "{reported:?}");

    // Stripe 0 again, now with a forged parity shard besides its forged data shard: decoding
    // with it gives data that does not match, so the reader decodes with the other parity
    // shard and reports the forged one.
    s.cluster.forge(shard(0, 4));
    assert!(s.read_all(&s.reopen(size), size).await == data, "forged parity decoded into the read");
    assert!(s.cluster.reported.lock().contains(&shard(0, 4)), "the forged parity shard is reported");

    // Stripe 1 with three forged data shards: only three good shards are left of the four
    // needed.
    for index in 0..3 {
        s.cluster.forge(shard(1, index));
    }
    let reader = s.reopen(size);
    let e = reader.read(&s.nodes, STRIPE as u64, 5000).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    // Stripe 0 still reads right beside it.
    assert!(reader.read(&s.nodes, 0, 5000).await.unwrap() == data[..5000]);
}

/// A random read inside a data shard is checked end to end through the shard's BLAKE3 tree:
/// a chunkserver serving a forged block (and the tree of the bytes it holds) is caught even
/// though the read touches one block of the shard, the read is served by reconstruction, and
/// the shard is reported.
#[tokio::test]
async fn a_forged_block_inside_a_shard_is_caught_through_its_tree() {
    let s = Setup::new().await;
    let unit = 256 << 10;
    let geo = Geometry { ino: INO, layout: Layout::new(4, 2, unit).unwrap(), placement: (1..=6).collect() };
    let file = OpenFile::new(geo.clone(), 0, Vec::new(), &s.readahead);
    let data = pattern(4 * unit as usize, 33);
    s.write(&file, 0, &data).await.unwrap();
    let size = s.flush(&file).await.unwrap().expect("committed").size;
    let version = s.meta.records()[0].version;
    let shard = ShardId { ino: INO, stripe: 0, index: 1, version };
    let block = 64 << 10;
    s.cluster.forge_at(shard, 2 * block + 10);

    let reader = OpenFile::new(geo, size, s.meta.records(), &s.readahead);
    // 100 bytes of data shard 1's third block, the forged byte among them.
    let at = unit as usize + 2 * block;
    let got = reader.read(&s.nodes, at as u64, 100).await.unwrap();
    assert!(got == data[at..at + 100], "forged bytes were read");
    assert!(s.cluster.reported.lock().contains(&shard), "the forged shard is reported");
    // Any other read of that shard is refused too (the tree it comes with no longer merges to
    // the content hash) and served around it.
    let at = unit as usize + 500;
    assert!(reader.read(&s.nodes, at as u64, 100).await.unwrap() == data[at..at + 100]);

    // A chunkserver that withholds the tree gains nothing: the shard is read whole and checked
    // against its hash.
    let other = ShardId { index: 2, ..shard };
    s.cluster.forge_at(other, block + 3);
    for chunk in &s.cluster.chunks {
        chunk.no_tree.store(true, Ordering::SeqCst);
    }
    let reader = OpenFile::new(reader_geometry(unit), size, s.meta.records(), &s.readahead);
    let at = 2 * unit as usize + block;
    assert!(
        reader.read(&s.nodes, at as u64, 100).await.unwrap() == data[at..at + 100],
        "forged bytes were read"
    );
    assert!(s.cluster.reported.lock().contains(&other), "the shard sent without its tree is reported");
}

fn reader_geometry(unit: u32) -> Geometry {
    Geometry { ino: INO, layout: Layout::new(4, 2, unit).unwrap(), placement: (1..=6).collect() }
}

/// A whole-stripe reader that reads part of a data shard (the stripe was truncated inside it)
/// checks those bytes through the shard's tree too: a forged block is caught.
#[tokio::test]
async fn a_truncated_stripe_read_whole_checks_its_partial_shard() {
    let s = Setup::new().await;
    let unit = 256 << 10;
    let file = OpenFile::new(reader_geometry(unit), 0, Vec::new(), &s.readahead);
    let data = pattern(4 * unit as usize, 44);
    s.write(&file, 0, &data).await.unwrap();
    s.flush(&file).await.unwrap().expect("committed");
    // Truncated to a unit and 1000 bytes: data shard 1 holds 1000 valid bytes of its unit.
    let size = unit as u64 + 1000;
    let mut records = s.meta.records();
    records[0].len = size;
    let shard = ShardId { ino: INO, stripe: 0, index: 1, version: records[0].version };
    s.cluster.forge_at(shard, 10);
    let reader = OpenFile::new(reader_geometry(unit), size, records, &s.readahead);
    let got = reader.read(&s.nodes, 0, size as u32).await.unwrap();
    assert!(got == data[..size as usize], "forged bytes were read");
    assert!(s.cluster.reported.lock().contains(&shard), "the forged shard is reported");
}
