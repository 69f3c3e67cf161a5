//! Tier tests on real temp directories with a tiny SSD capacity and a manual clock, each run
//! against both I/O engines (see `mover_tests!` at the bottom): watermark demotion in LRU
//! order, promotion of hot HDD shards, writes falling through to HDD, crash recovery at open,
//! a corrupt copy aborting its move, `promote`, and reads racing moves.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_common::{ErrorKind, ShardId};

use super::{MoveOutcome, Mover, MoverOptions, PromoteOptions, PromoteSummary};
use crate::engine::{IoEngine, IoFuture, PreadEngine, UringEngine};
use crate::policy::{ManualClock, TierPolicy};
use crate::store::tests::{files_under, flip_byte};
use crate::store::{ShardStore, StoreOptions, Tier};

type MakeEngine = fn() -> Arc<dyn IoEngine>;

fn uring() -> Arc<dyn IoEngine> {
    Arc::new(UringEngine::new(8).expect("io_uring must be available for these tests"))
}

fn pread() -> Arc<dyn IoEngine> {
    Arc::new(PreadEngine::new())
}

/// 256 KiB of data: with its 4 KiB header, 260 KiB on disk.
const SHARD: usize = 256 << 10;
const FILE: u64 = SHARD as u64 + 4096;
/// 4 MiB: room for 15 such shards; the high watermark (90%) is passed at 15, the low one
/// (75%) is 12 shards.
const SSD_CAPACITY: u64 = 4 << 20;

struct Dirs {
    ssd: tempfile::TempDir,
    hdd: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs { ssd: tempfile::tempdir().unwrap(), hdd: tempfile::tempdir().unwrap() }
    }

    fn options(&self, ssd_capacity: Option<u64>) -> StoreOptions {
        StoreOptions {
            ssd_dirs: vec![self.ssd.path().to_path_buf()],
            hdd_dirs: vec![self.hdd.path().to_path_buf()],
            sync: true,
            flush_interval: std::time::Duration::from_millis(1000),
            power_loss_log: None,
            reserve_bytes: 0,
            // These tests exercise the two-read rule (the default promotes on the first read).
            policy: TierPolicy { ssd_capacity, promote_after_reads: 2, ..TierPolicy::default() },
            ssd_direct_io: false,
            hdd_direct_io: false,
        }
    }

    async fn open(&self, engine: Arc<dyn IoEngine>, clock: &Arc<ManualClock>) -> (Arc<ShardStore>, Mover) {
        let store = ShardStore::open_with_clock(self.options(Some(SSD_CAPACITY)), engine, clock.clone())
            .await
            .unwrap();
        with_mover(store)
    }
}

/// `store` and a mover of its shards (pins in memory, copies unthrottled).
fn with_mover(store: ShardStore) -> (Arc<ShardStore>, Mover) {
    let store = Arc::new(store);
    let mover = Mover::new(store.clone(), MoverOptions { rate_bytes: 1 << 30, pins_file: None }).unwrap();
    (store, mover)
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_700_000_000_000))
}

fn id(n: u64) -> ShardId {
    ShardId { ino: 500 + n, stripe: n, index: (n % 6) as u32, version: 3 }
}

fn data(n: u64) -> Bytes {
    (0..SHARD)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(n as u8).wrapping_add((i >> 12) as u8))
        .collect()
}

async fn assert_reads_exact(store: &ShardStore, n: u64) {
    let (got, len) = store.read(id(n), 0, 0).await.unwrap();
    assert_eq!(len, SHARD as u64);
    assert!(got == data(n), "shard {n} reads back different bytes");
}

/// Write shards `0..n`, one second apart.
async fn write_shards(store: &ShardStore, clock: &ManualClock, n: u64) -> Vec<Tier> {
    let mut tiers = Vec::new();
    for i in 0..n {
        clock.advance(Duration::from_secs(1));
        tiers.push(store.write(id(i), data(i)).await.unwrap());
    }
    tiers
}

async fn full_ssd_writes_to_hdd_and_demotes_lru(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    let tiers = write_shards(&store, &clock, 18).await;
    // 15 shards fill the 4 MiB SSD; the rest land on HDD instead of failing.
    assert_eq!(tiers.iter().filter(|t| **t == Tier::Ssd).count(), 15, "{tiers:?}");
    assert!(tiers[15..].iter().all(|t| *t == Tier::Hdd), "{tiers:?}");
    let usage = store.usage();
    assert_eq!((usage[0].capacity, usage[0].used, usage[0].shards), (SSD_CAPACITY, 15 * FILE, 15));
    assert_eq!(usage[0].free, SSD_CAPACITY - 15 * FILE);

    // Shard 0 is the oldest write, but a read makes it the most recently used.
    clock.advance(Duration::from_secs(5));
    assert_reads_exact(&store, 0).await;
    let report = mover.pass().await;
    assert_eq!((report.demoted, report.promoted, report.failed), (4, 0, 0), "{report:?}");
    assert_eq!(report.bytes, 4 * FILE);
    for n in 1..=4 {
        assert_eq!(store.tier_of(&id(n)), Some(Tier::Hdd), "shard {n} is among the least recently used");
    }
    for n in [0].into_iter().chain(5..15) {
        assert_eq!(store.tier_of(&id(n)), Some(Tier::Ssd), "shard {n} stays");
    }
    let usage = store.usage();
    assert_eq!((usage[0].shards, usage[1].shards), (11, 7));
    assert!(usage[0].used <= (SSD_CAPACITY as f64 * 0.75) as u64);
    assert_eq!((usage[0].demotions, usage[1].demotions), (4, 4));
    // Index, usage and files agree, with no temp files left; every shard reads byte-exact.
    let on_disk =
        |dir: &Path| files_under(dir).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum::<u64>();
    assert_eq!((on_disk(dirs.ssd.path()), on_disk(dirs.hdd.path())), (usage[0].used, usage[1].used));
    for n in 0..18 {
        assert_reads_exact(&store, n).await;
    }
    // Below the high watermark a second pass moves nothing.
    assert_eq!(mover.pass().await, super::PassReport::default());
}

async fn hdd_shards_read_twice_in_the_window_are_promoted(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    write_shards(&store, &clock, 6).await;
    for n in 0..6 {
        assert_eq!(mover.move_shard(id(n), Tier::Hdd).await.unwrap(), MoveOutcome::Moved(FILE));
    }
    assert_eq!(mover.move_shard(id(0), Tier::Hdd).await.unwrap(), MoveOutcome::Already);
    assert_eq!(mover.move_shard(id(99), Tier::Hdd).await.unwrap(), MoveOutcome::Missing);

    // Shard 1: two reads a minute apart. Shard 2: one read. Shard 3: two reads 11 minutes apart.
    // The check comes ten minutes after shard 1's last read: still within its window.
    assert_reads_exact(&store, 1).await;
    assert_reads_exact(&store, 3).await;
    clock.advance(Duration::from_secs(60));
    assert_reads_exact(&store, 1).await;
    assert_reads_exact(&store, 2).await;
    clock.advance(Duration::from_secs(600));
    assert_reads_exact(&store, 3).await;
    assert_eq!(store.promotion_backlog(), 1);
    let report = mover.pass().await;
    assert_eq!((report.promoted, report.demoted, report.bytes), (1, 0, FILE), "{report:?}");
    assert_eq!(store.tier_of(&id(1)), Some(Tier::Ssd));
    for n in [0, 2, 3, 4, 5] {
        assert_eq!(store.tier_of(&id(n)), Some(Tier::Hdd), "shard {n}");
    }
    // The next read of shard 3 is its second within ten minutes.
    assert_reads_exact(&store, 3).await;
    assert_eq!(mover.pass().await.promoted, 1);
    assert_eq!(store.tier_of(&id(3)), Some(Tier::Ssd));

    let usage = store.usage();
    assert_eq!((usage[0].promotions, usage[1].promotions), (2, 2));
    assert_eq!(usage[1].reads, 6, "six reads were served from HDD");
    assert_eq!(usage[1].read_bytes, 6 * SHARD as u64);
    assert_eq!(store.promotion_backlog(), 0);
    for n in 0..6 {
        assert_reads_exact(&store, n).await;
    }
    assert_eq!(store.usage()[0].reads, 2);
}

async fn promotion_stays_under_the_high_watermark(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    write_shards(&store, &clock, 16).await;
    for n in 0..16 {
        mover.move_shard(id(n), Tier::Hdd).await.unwrap();
    }
    for _ in 0..2 {
        for n in 0..16 {
            store.read(id(n), 0, 1).await.unwrap();
        }
    }
    let report = mover.pass().await;
    // 14 shards (3.6 MiB) stay under 90% of 4 MiB; the 15th would pass it.
    assert_eq!((report.promoted, report.demoted), (14, 0), "{report:?}");
    assert_eq!(mover.pass().await, super::PassReport::default(), "no demotion follows");
}

async fn hot_shards_displace_cold_ones_on_a_full_ssd(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    // 14 shards fill the SSD tier to just under its high watermark: no room for a 15th.
    assert!(write_shards(&store, &clock, 14).await.iter().all(|t| *t == Tier::Ssd));
    for n in [20, 21] {
        store.write(id(n), data(n)).await.unwrap();
        mover.move_shard(id(n), Tier::Hdd).await.unwrap();
    }
    // Eleven minutes later the SSD shards are cold; shard 20 is read twice from HDD: hot.
    clock.advance(Duration::from_secs(660));
    assert_reads_exact(&store, 20).await;
    assert_reads_exact(&store, 20).await;
    let report = mover.pass().await;
    assert_eq!((report.promoted, report.demoted), (1, 1), "{report:?}");
    assert_eq!(store.tier_of(&id(20)), Some(Tier::Ssd));
    assert_eq!(store.tier_of(&id(0)), Some(Tier::Hdd), "the least recently used shard made room");
    // Every SSD shard read just now: a hot shard 21 displaces none of them and waits on HDD.
    for n in 1..14 {
        assert_reads_exact(&store, n).await;
    }
    assert_reads_exact(&store, 21).await;
    assert_reads_exact(&store, 21).await;
    let report = mover.pass().await;
    assert_eq!((report.promoted, report.demoted), (0, 0), "{report:?}");
    assert_eq!(store.tier_of(&id(21)), Some(Tier::Hdd));
    for n in (0..14).chain([20, 21]) {
        assert_reads_exact(&store, n).await;
    }
}

async fn an_interrupted_move_is_settled_at_open(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (ssd_path, hdd_path) = {
        let (store, mover) = dirs.open(engine(), &clock).await;
        write_shards(&store, &clock, 3).await;
        mover.move_shard(id(1), Tier::Hdd).await.unwrap();
        (store.shard_path(&id(0)).unwrap(), store.shard_path(&id(1)).unwrap())
    };
    let twin = |path: &Path, from: &Path, to: &Path| to.join(path.strip_prefix(from).unwrap());
    // Shard 0: a crash between rename and delete of a demotion left a valid copy on both tiers.
    let hdd_copy = twin(&ssd_path, dirs.ssd.path(), dirs.hdd.path());
    std::fs::copy(&ssd_path, &hdd_copy).unwrap();
    // Shard 1: the same after a promotion, but the SSD copy is damaged: the HDD one must win.
    let ssd_copy = twin(&hdd_path, dirs.hdd.path(), dirs.ssd.path());
    std::fs::copy(&hdd_path, &ssd_copy).unwrap();
    flip_byte(&ssd_copy, 4096 + 70_000);
    // A move cut short before its rename.
    let tmp = hdd_copy.with_file_name(format!("{}.tmp-move-00000000000000ab", id(2).file_name()));
    std::fs::write(&tmp, b"part of a copy").unwrap();

    let (store, _mover) = dirs.open(engine(), &clock).await;
    assert!(ssd_path.exists() && !hdd_copy.exists(), "the valid SSD copy is kept");
    assert!(hdd_path.exists() && !ssd_copy.exists(), "the corrupt SSD copy is removed");
    assert!(!tmp.exists());
    assert_eq!(store.tier_of(&id(0)), Some(Tier::Ssd));
    assert_eq!(store.tier_of(&id(1)), Some(Tier::Hdd));
    let files = files_under(dirs.ssd.path()).len() + files_under(dirs.hdd.path()).len();
    assert_eq!(files, 3, "exactly one file per shard");
    let usage = store.usage();
    assert_eq!((usage[0].shards, usage[1].shards), (2, 1));
    assert_eq!(usage[0].used + usage[1].used, 3 * FILE);
    for n in 0..3 {
        assert_reads_exact(&store, n).await;
    }
}

/// An engine that damages the data it writes while `armed`.
struct Corrupting {
    inner: Arc<dyn IoEngine>,
    armed: AtomicBool,
}

impl IoEngine for Corrupting {
    fn name(&self) -> &'static str {
        "corrupting"
    }

    fn read_at(&self, file: Arc<std::fs::File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        self.inner.read_at(file, offset, len)
    }

    fn read_at_direct(&self, file: Arc<std::fs::File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        self.inner.read_at_direct(file, offset, len)
    }

    fn write_at(&self, file: Arc<std::fs::File>, offset: u64, data: Bytes) -> IoFuture<()> {
        if !self.armed.load(Ordering::SeqCst) || data.len() < 8192 {
            return self.inner.write_at(file, offset, data);
        }
        let mut bad = data.to_vec();
        bad[5000] ^= 0x80;
        self.inner.write_at(file, offset, Bytes::from(bad))
    }

    fn fsync(&self, file: Arc<std::fs::File>) -> IoFuture<()> {
        self.inner.fsync(file)
    }
}

async fn a_corrupt_copy_aborts_the_move(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let corrupting = Arc::new(Corrupting { inner: engine(), armed: AtomicBool::new(false) });
    let (store, mover) = dirs.open(corrupting.clone(), &clock).await;
    write_shards(&store, &clock, 2).await;
    let source = store.shard_path(&id(1)).unwrap();

    corrupting.armed.store(true, Ordering::SeqCst);
    let err = mover.move_shard(id(1), Tier::Hdd).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.message().contains("checksum"), "{err}");
    assert_eq!(store.shard_path(&id(1)).unwrap(), source, "the source stays the shard's copy");
    assert!(files_under(dirs.hdd.path()).is_empty(), "the bad copy is removed");
    assert_reads_exact(&store, 1).await;
    assert_eq!(store.usage()[1].demotions, 0);

    corrupting.armed.store(false, Ordering::SeqCst);
    assert_eq!(mover.move_shard(id(1), Tier::Hdd).await.unwrap(), MoveOutcome::Moved(FILE));
    assert!(!source.exists());
    assert_reads_exact(&store, 1).await;
}

async fn promote_moves_named_shards_until_ssd_is_full(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    write_shards(&store, &clock, 20).await;
    for n in 0..20 {
        mover.move_shard(id(n), Tier::Hdd).await.unwrap();
    }
    mover.move_shard(id(0), Tier::Ssd).await.unwrap();
    let done = mover.promote(&[id(0), id(1), id(2), id(77)]).await.unwrap();
    assert_eq!(
        done,
        PromoteSummary { promoted: 2, already: 1, missing: 1, bytes: 2 * FILE, ..Default::default() }
    );
    assert_eq!(store.tier_of(&id(2)), Some(Tier::Ssd));

    // 15 shards fit the SSD capacity: 12 more, then it is full.
    let all: Vec<ShardId> = (0..20).map(id).collect();
    let done = mover.promote(&all).await.unwrap();
    let err = done.stopped.clone().expect("the SSD tier fills");
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    assert!(err.message().contains("SSD tier is full"), "{err}");
    assert_eq!((done.promoted, done.already, done.not_looked_at), (12, 3, 5), "{done:?}");
    assert_eq!(store.usage()[0].shards, 15);
    for n in 0..20 {
        assert_reads_exact(&store, n).await;
    }
    let bad = ShardId { ino: 0, stripe: 0, index: 0, version: 0 };
    assert_eq!(mover.promote(&[bad]).await.unwrap_err().kind(), ErrorKind::InvalidArgument);
}

async fn promote_evicts_lru_shards_but_never_pinned_ones_or_its_own(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    write_shards(&store, &clock, 20).await;
    for n in 0..20 {
        mover.move_shard(id(n), Tier::Hdd).await.unwrap();
    }
    // The SSD tier full (15 shards), least recently used first; shard 0's file pinned.
    for n in 0..15 {
        clock.advance(Duration::from_secs(1));
        mover.move_shard(id(n), Tier::Ssd).await.unwrap();
    }
    assert_eq!(mover.pins().add([id(0).ino]).await.unwrap(), 1);
    clock.advance(Duration::from_secs(1));

    // Two more make room by demoting the two least recently used unpinned shards (1 and 2).
    let warmup = PromoteOptions { evict: true, session: 7 };
    let done = mover.promote_with(&[id(15), id(16)], warmup).await.unwrap();
    assert_eq!((done.promoted, done.evicted, done.evicted_bytes), (2, 2, 2 * FILE), "{done:?}");
    let tier = |n: u64| store.tier_of(&id(n)).unwrap();
    assert_eq!(
        [tier(0), tier(1), tier(2), tier(3), tier(15), tier(16)],
        [Tier::Ssd, Tier::Hdd, Tier::Hdd, Tier::Ssd, Tier::Ssd, Tier::Ssd]
    );

    // Later in the same warmup: what it promoted is spared, the next oldest (3) goes.
    clock.advance(Duration::from_secs(1));
    let done = mover.promote_with(&[id(17)], warmup).await.unwrap();
    assert_eq!((done.promoted, done.evicted), (1, 1));
    assert_eq!([tier(3), tier(15), tier(16), tier(17)], [Tier::Hdd, Tier::Ssd, Tier::Ssd, Tier::Ssd]);

    // More than fits beside the pinned shard and the request's own: full, and it says why.
    let all: Vec<ShardId> = (0..20).map(id).collect();
    let done = mover.promote_with(&all, warmup).await.unwrap();
    let err = done.stopped.expect("full");
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    assert!(err.message().contains("pinned or part of this warmup"), "{err}");
    assert_eq!(tier(0), Tier::Ssd);

    // A shard already on SSD when the warmup names it is part of it too: spared.
    clock.advance(Duration::from_secs(1));
    let session = PromoteOptions { evict: true, session: 8 };
    let oldest_unpinned = (1..20).filter(|&n| tier(n) == Tier::Ssd).min().unwrap();
    mover.promote_with(&[id(oldest_unpinned)], session).await.unwrap();
    let cold = (0..20).find(|&n| tier(n) == Tier::Hdd).unwrap();
    mover.promote_with(&[id(cold)], session).await.unwrap();
    assert_eq!(tier(oldest_unpinned), Tier::Ssd, "a shard the warmup named was evicted for it");

    // Above its high watermark, the mover demotes down to the low one, never the pinned shard.
    let report = mover.pass().await;
    assert!(report.demoted > 0, "{report:?}");
    assert_eq!(tier(0), Tier::Ssd);
    assert!(store.usage()[0].shards <= 12);

    for n in 0..20 {
        assert_reads_exact(&store, n).await;
    }
}

async fn reads_racing_moves_never_fail(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) = dirs.open(engine(), &clock).await;
    write_shards(&store, &clock, 4).await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4u64)
        .map(|n| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut reads = 0;
                while !stop.load(Ordering::SeqCst) || reads < 10 {
                    assert_reads_exact(&store, n).await;
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for round in 0..10 {
        let to = if round % 2 == 0 { Tier::Hdd } else { Tier::Ssd };
        for n in 0..4 {
            mover.move_shard(id(n), to).await.unwrap();
        }
    }
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        assert!(r.await.unwrap() >= 10);
    }
    assert_eq!(store.usage()[1].promotions, 20);
}

/// With `hdd_direct_io`, a shard demoted to HDD is not left in the page cache, reads back
/// exact (through O_DIRECT), and promotes back to SSD from an O_DIRECT source intact.
async fn moves_to_and_from_a_direct_io_hdd_tier(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let mut options = dirs.options(Some(SSD_CAPACITY));
    options.hdd_direct_io = true;
    let (store, mover) =
        with_mover(ShardStore::open_with_clock(options, engine(), clock.clone()).await.unwrap());
    write_shards(&store, &clock, 2).await;
    mover.move_shard(id(1), Tier::Hdd).await.unwrap();
    assert_eq!(store.tier_of(&id(1)), Some(Tier::Hdd));
    let on_hdd = store.shard_path(&id(1)).unwrap();
    assert!(on_hdd.starts_with(dirs.hdd.path()));
    assert_eq!(crate::store::tests::cached_pages(&on_hdd), 0, "the demoted copy stayed in the page cache");
    assert_reads_exact(&store, 1).await;
    assert_eq!(crate::store::tests::cached_pages(&on_hdd), 0, "an O_DIRECT read filled the page cache");
    mover.move_shard(id(1), Tier::Ssd).await.unwrap();
    assert_eq!(store.tier_of(&id(1)), Some(Tier::Ssd));
    assert_reads_exact(&store, 1).await;
    assert_reads_exact(&store, 0).await;
}

/// An engine that counts O_DIRECT reads.
struct CountingDirect {
    inner: Arc<dyn IoEngine>,
    direct_reads: std::sync::atomic::AtomicU64,
}

impl IoEngine for CountingDirect {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn read_at(&self, file: Arc<std::fs::File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        self.inner.read_at(file, offset, len)
    }

    fn read_at_direct(&self, file: Arc<std::fs::File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        self.direct_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_at_direct(file, offset, len)
    }

    fn write_at(&self, file: Arc<std::fs::File>, offset: u64, data: Bytes) -> IoFuture<()> {
        self.inner.write_at(file, offset, data)
    }

    fn fsync(&self, file: Arc<std::fs::File>) -> IoFuture<()> {
        self.inner.fsync(file)
    }
}

/// A shard a client just read whole from an O_DIRECT HDD tier is promoted from those bytes,
/// without reading the HDD again; one nobody read is copied from the HDD as usual.
async fn promotion_after_a_whole_direct_read_does_not_read_the_hdd_again(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let mut options = dirs.options(Some(SSD_CAPACITY));
    options.hdd_direct_io = true;
    let counting = Arc::new(CountingDirect { inner: engine(), direct_reads: Default::default() });
    let (store, mover) =
        with_mover(ShardStore::open_with_clock(options, counting.clone(), clock.clone()).await.unwrap());
    let reads = || counting.direct_reads.load(Ordering::SeqCst);
    write_shards(&store, &clock, 2).await;
    for n in 0..2 {
        mover.move_shard(id(n), Tier::Hdd).await.unwrap();
    }
    assert_reads_exact(&store, 1).await;
    let after_read = reads();
    assert!(after_read > 0, "the HDD read did not go through O_DIRECT");
    mover.move_shard(id(1), Tier::Ssd).await.unwrap();
    assert_eq!(reads(), after_read, "the promotion read the HDD again");
    assert_eq!(store.tier_of(&id(1)), Some(Tier::Ssd));
    assert_reads_exact(&store, 1).await;
    // Shard 0 was not read: its promotion copies from the HDD.
    mover.move_shard(id(0), Tier::Ssd).await.unwrap();
    assert!(reads() > after_read, "a promotion without a prior read copied from nowhere");
    assert_reads_exact(&store, 0).await;
}

async fn no_capacity_set_means_the_filesystem(engine: MakeEngine) {
    let dirs = Dirs::new();
    let clock = clock();
    let (store, mover) =
        with_mover(ShardStore::open_with_clock(dirs.options(None), engine(), clock.clone()).await.unwrap());
    assert_eq!(write_shards(&store, &clock, 3).await, vec![Tier::Ssd; 3]);
    assert_eq!(mover.pass().await, super::PassReport::default());
    let usage = store.usage();
    assert!(usage[0].capacity > SSD_CAPACITY && usage[0].free > 0);
}

macro_rules! mover_tests {
    ($($case:ident),* $(,)?) => {
        mod uring_engine {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(super::uring).await
            })*
        }
        mod pread_engine {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(super::pread).await
            })*
        }
    };
}

mover_tests!(
    promotion_after_a_whole_direct_read_does_not_read_the_hdd_again,
    moves_to_and_from_a_direct_io_hdd_tier,
    full_ssd_writes_to_hdd_and_demotes_lru,
    hdd_shards_read_twice_in_the_window_are_promoted,
    promotion_stays_under_the_high_watermark,
    hot_shards_displace_cold_ones_on_a_full_ssd,
    an_interrupted_move_is_settled_at_open,
    a_corrupt_copy_aborts_the_move,
    promote_moves_named_shards_until_ssd_is_full,
    promote_evicts_lru_shards_but_never_pinned_ones_or_its_own,
    reads_racing_moves_never_fail,
    no_capacity_set_means_the_filesystem,
);
