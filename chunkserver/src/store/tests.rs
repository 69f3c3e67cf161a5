//! Store tests, each run against both I/O engines (see `store_tests!` at the bottom).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::{ErrorKind, ShardId};

use super::{ReadCheck, ShardStore, StoreOptions, Tier};
use crate::engine::{IoEngine, PreadEngine, UringEngine};

type MakeEngine = fn() -> Arc<dyn IoEngine>;

fn uring() -> Arc<dyn IoEngine> {
    Arc::new(UringEngine::new(8).expect("io_uring must be available for these tests"))
}

fn pread() -> Arc<dyn IoEngine> {
    Arc::new(PreadEngine::new())
}

fn options(ssd: &[&Path], hdd: &[&Path]) -> StoreOptions {
    StoreOptions {
        ssd_dirs: ssd.iter().map(|p| p.to_path_buf()).collect(),
        hdd_dirs: hdd.iter().map(|p| p.to_path_buf()).collect(),
        sync: true,
        flush_interval: std::time::Duration::from_millis(1000),
        power_loss_log: None,
        reserve_bytes: 0,
        policy: crate::policy::TierPolicy::default(),
        ssd_direct_io: false,
        hdd_direct_io: false,
    }
}

async fn open(engine: MakeEngine, ssd: &[&Path], hdd: &[&Path]) -> ShardStore {
    ShardStore::open(options(ssd, hdd), engine()).await.unwrap()
}

fn id(n: u64) -> ShardId {
    ShardId { ino: 1000 + n, stripe: n, index: (n % 6) as u32, version: 1 }
}

fn data(len: usize, seed: u8) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed).wrapping_add((i >> 16) as u8)).collect()
}

/// Every regular file under `dir`.
pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// Flip one bit of the byte at `at` of `path`.
pub(crate) fn flip_byte(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at).unwrap();
}

async fn round_trip_sizes(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    for (n, len) in [0, 1, 65535, 65536, 65537, (1 << 20) + 3].into_iter().enumerate() {
        let d = data(len, n as u8);
        assert_eq!(store.write(id(n as u64), d.clone()).await.unwrap(), Tier::Ssd);
        let (got, shard_len) = store.read(id(n as u64), 0, 0).await.unwrap();
        assert_eq!(shard_len, len as u64);
        assert!(got == d, "size {len}");
    }
}

async fn range_reads_across_block_edges(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    let bs = BLOCK_SIZE as u64;
    let len = 3 * bs + 100;
    let d = data(len as usize, 5);
    store.write(id(1), d.clone()).await.unwrap();
    for (offset, want) in
        [(0, 1), (bs - 1, 2), (bs, bs), (bs - 10, bs + 20), (3 * bs, 0), (3 * bs + 99, 1000), (7, 0)]
    {
        let (got, shard_len) = store.read(id(1), offset, want).await.unwrap();
        assert_eq!(shard_len, len);
        let end = if want == 0 { len } else { (offset + want).min(len) };
        assert!(got == d.slice(offset as usize..end as usize), "offset {offset} len {want}");
    }
    let (at_end, _) = store.read(id(1), len, 10).await.unwrap();
    assert!(at_end.is_empty());
    let err = store.read(id(1), len + 1, 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

async fn corrupt_data_is_never_returned(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    let bs = BLOCK_SIZE as u64;
    store.write(id(1), data(3 * BLOCK_SIZE, 1)).await.unwrap();
    let path = store.shard_path(&id(1)).unwrap();
    let header_len = crate::shard::header_len_for(3 * bs);
    flip_byte(&path, header_len + bs + 10);
    let err = store.read(id(1), 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.message().contains("block 1"), "{err}");
    let err = store.read(id(1), bs + 5, 10).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // Blocks that are intact still read.
    let (got, _) = store.read(id(1), 0, bs).await.unwrap();
    assert!(got == data(3 * BLOCK_SIZE, 1).slice(..BLOCK_SIZE));
    store.read(id(1), 2 * bs, 0).await.unwrap();
    // A read whose reader checks the bytes itself (against its content hash) gets them as
    // stored: the flipped byte shows, for the reader to catch.
    let read = store.read_as(id(1), 0, 0, ReadCheck::Reader).await.unwrap();
    let got = read.data;
    assert_eq!((got.len() as u64, read.data_len, read.tree.is_none()), (3 * bs, 3 * bs, true));
    assert!(got != data(3 * BLOCK_SIZE, 1), "the store did not send the bytes as stored");
    // A reader that checks through the tree gets the block as stored and every block's value,
    // with which the flipped block does not agree.
    let read = store.read_as(id(1), bs, bs, ReadCheck::Tree).await.unwrap();
    let tree = read.tree.expect("a format 2 shard sends its tree");
    assert_eq!((tree.len(), read.data.len()), (3 * 32, BLOCK_SIZE));
    let value = cairn_common::checksum::tree_block(&read.data, 1, 3 * bs);
    assert_ne!(&tree[32..64], &value[..], "the flipped block agrees with its value");
    let intact = store.read_as(id(1), 0, bs, ReadCheck::Tree).await.unwrap();
    assert_eq!(&tree[..32], &cairn_common::checksum::tree_block(&intact.data, 0, 3 * bs)[..]);
}

async fn corrupt_header_is_detected(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    store.write(id(1), data(1000, 1)).await.unwrap();
    store.write(id(2), data(1000, 2)).await.unwrap();
    flip_byte(&store.shard_path(&id(1)).unwrap(), 20);
    let err = store.read(id(1), 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // A truncated file is corrupt too, not a short answer.
    let path = store.shard_path(&id(2)).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(std::fs::metadata(&path).unwrap().len() - 1).unwrap();
    let err = store.read(id(2), 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

async fn missing_shards(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    let err = store.read(id(9), 0, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.message().contains(&id(9).to_string()), "{err}");
    store.write(id(1), data(10, 1)).await.unwrap();
    assert_eq!(store.delete(&[id(9), id(1), id(1)]).await.unwrap(), 1);
    assert_eq!(store.read(id(1), 0, 0).await.unwrap_err().kind(), ErrorKind::NotFound);
    assert!(files_under(ssd.path()).is_empty());
}

async fn hostile_ids_are_rejected(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    for bad in [
        ShardId { ino: 0, stripe: 1, index: 0, version: 1 },
        ShardId { ino: 5, stripe: 1, index: 200, version: 1 },
        ShardId { ino: 0, stripe: u64::MAX, index: 200, version: 1 },
    ] {
        let err = store.write(bad, data(10, 1)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(store.read(bad, 0, 0).await.unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(store.delete(&[id(1), bad]).await.unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
    assert!(files_under(ssd.path()).is_empty());
}

async fn reopen_rebuilds_index_and_usage(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let hdd = tempfile::tempdir().unwrap();
    let before = {
        let store = open(engine, &[ssd.path()], &[hdd.path()]).await;
        for n in 0..4 {
            store.write(id(n), data(70_000 + n as usize, n as u8)).await.unwrap();
        }
        // An idempotent retry, a rewrite with another length, a delete.
        store.write(id(0), data(70_000, 0)).await.unwrap();
        store.write(id(1), data(10, 1)).await.unwrap();
        assert_eq!(store.delete(&[id(3)]).await.unwrap(), 1);
        let usage = store.usage();
        assert_eq!(usage[0].shards, 3);
        let on_disk: u64 = files_under(ssd.path()).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert_eq!(usage[0].used, on_disk);
        assert_eq!((usage[1].shards, usage[1].used), (0, 0));
        usage
    };
    let store = open(engine, &[ssd.path()], &[hdd.path()]).await;
    let after = store.usage();
    assert_eq!(
        before.iter().map(|u| (&u.name, &u.path, u.used, u.shards)).collect::<Vec<_>>(),
        after.iter().map(|u| (&u.name, &u.path, u.used, u.shards)).collect::<Vec<_>>()
    );
    assert_eq!(after[0].name, "ssd");
    assert_eq!(after[1].name, "hdd");
    assert!(after[0].capacity > 0 && after[0].free <= after[0].capacity);
    assert!(store.read(id(1), 0, 0).await.unwrap().0 == data(10, 1));
    assert!(store.read(id(2), 0, 0).await.unwrap().0 == data(70_002, 2));
    assert_eq!(store.read(id(3), 0, 0).await.unwrap_err().kind(), ErrorKind::NotFound);
}

async fn a_full_disk_is_no_space(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let hdd = tempfile::tempdir().unwrap();
    let mut opts = options(&[ssd.path()], &[hdd.path()]);
    opts.reserve_bytes = u64::MAX / 2;
    let store = ShardStore::open(opts, engine()).await.unwrap();
    let err = store.write(id(1), data(100, 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    assert!(err.message().contains("reserve"), "{err}");
    assert!(files_under(ssd.path()).is_empty() && files_under(hdd.path()).is_empty());
    assert_eq!(store.usage()[0].free, 0);
}

async fn partial_writes_are_removed_at_open(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let bucket = ssd.path().join("shards").join(id(1).bucket());
    std::fs::create_dir_all(&bucket).unwrap();
    let tmp = bucket.join(format!("{}.tmp-0123", id(1).file_name()));
    std::fs::write(&tmp, b"half a shard").unwrap();
    let stray = bucket.join("notes.txt");
    std::fs::write(&stray, b"not a shard").unwrap();
    // A valid name in the wrong bucket is not indexed either.
    let wrong = ssd.path().join("shards").join("zz");
    std::fs::create_dir_all(&wrong).unwrap();
    let store = open(engine, &[ssd.path()], &[]).await;
    assert!(!tmp.exists());
    assert!(stray.exists());
    assert_eq!(store.usage()[0].shards, 0);
    assert_eq!(store.read(id(1), 0, 0).await.unwrap_err().kind(), ErrorKind::NotFound);
}

async fn ssd_is_preferred_and_hdd_serves_alone(engine: MakeEngine) {
    let ssd_a = tempfile::tempdir().unwrap();
    let ssd_b = tempfile::tempdir().unwrap();
    let hdd = tempfile::tempdir().unwrap();
    let store = open(engine, &[ssd_a.path(), ssd_b.path()], &[hdd.path()]).await;
    for n in 0..4 {
        assert_eq!(store.write(id(n), data(10, 0)).await.unwrap(), Tier::Ssd);
    }
    let usage = store.usage();
    assert_eq!((usage[0].shards, usage[1].shards, usage[2].shards), (2, 2, 0), "SSD dirs take turns");
    drop(store);

    let store = open(engine, &[], &[hdd.path()]).await;
    assert_eq!(store.write(id(7), data(10, 0)).await.unwrap(), Tier::Hdd);
    assert!(store.shard_path(&id(7)).unwrap().starts_with(hdd.path()));
}

async fn concurrent_writes_and_reads(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let store = Arc::new(open(engine, &[ssd.path()], &[]).await);
    let tasks: Vec<_> = (0..40u64)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store.write(id(n), data(BLOCK_SIZE + n as usize, n as u8)).await.unwrap();
                let (got, _) = store.read(id(n), 0, 0).await.unwrap();
                assert!(got == data(BLOCK_SIZE + n as usize, n as u8));
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(store.usage()[0].shards, 40);
}

async fn listing_pages_in_id_order_and_check_finds_damage(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let hdd = tempfile::tempdir().unwrap();
    // Shard 4 on the HDD directory (written while it was the only one), the rest on SSD.
    let only_hdd = open(engine, &[], &[hdd.path()]).await;
    only_hdd.write(id(4), data(3 * BLOCK_SIZE, 4)).await.unwrap();
    drop(only_hdd);
    let store = open(engine, &[ssd.path()], &[hdd.path()]).await;
    for n in [5, 1, 3, 2] {
        store.write(id(n), data(3 * BLOCK_SIZE, n as u8)).await.unwrap();
    }
    assert_eq!(store.tier_of(&id(4)), Some(Tier::Hdd));
    let (first, more) = store.list(None, 2);
    assert!(more);
    assert_eq!(first.iter().map(|e| e.0).collect::<Vec<_>>(), vec![id(1), id(2)]);
    assert!(first.iter().all(|e| e.1 > 3 * BLOCK_SIZE as u64 && e.2 < 60_000), "{first:?}");
    let (rest, more) = store.list(Some(id(2)), 10);
    assert!(!more);
    assert_eq!(rest.iter().map(|e| e.0).collect::<Vec<_>>(), vec![id(3), id(4), id(5)]);

    for n in 1..=5 {
        store.check(id(n), true, None).await.unwrap();
        let content = *blake3::hash(&data(3 * BLOCK_SIZE, n as u8)).as_bytes();
        store.check(id(n), true, Some(content)).await.unwrap();
    }
    // A shard rewritten with other bytes (valid block checksums: the store wrote them) passes
    // its checksums but not the content hash its writer recorded.
    let other = data(3 * BLOCK_SIZE, 99);
    store.write(id(5), other.clone()).await.unwrap();
    store.check(id(5), true, None).await.unwrap();
    let recorded = *blake3::hash(&data(3 * BLOCK_SIZE, 5)).as_bytes();
    let e = store.check(id(5), true, Some(recorded)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.message().contains("content hash"), "{e}");
    // Without reading the data: the block values alone no longer chain to the recorded hash.
    let e = store.check(id(5), false, Some(recorded)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.message().contains("do not chain"), "{e}");
    store.check(id(5), false, Some(*blake3::hash(&other).as_bytes())).await.unwrap();
    for n in 1..=4 {
        let content = *blake3::hash(&data(3 * BLOCK_SIZE, n as u8)).as_bytes();
        store.check(id(n), false, Some(content)).await.unwrap();
    }
    // A flipped data byte is found only by a verifying check; a truncation by either.
    let header_len = crate::shard::header_len_for(3 * BLOCK_SIZE as u64);
    flip_byte(&store.shard_path(&id(4)).unwrap(), header_len + 7);
    store.check(id(4), false, None).await.unwrap();
    assert_eq!(store.check(id(4), true, None).await.unwrap_err().kind(), ErrorKind::Corrupt);
    let path = store.shard_path(&id(2)).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(100).unwrap();
    assert_eq!(store.check(id(2), false, None).await.unwrap_err().kind(), ErrorKind::Corrupt);
    std::fs::remove_file(store.shard_path(&id(3)).unwrap()).unwrap();
    assert_eq!(store.check(id(3), true, None).await.unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(store.check(id(9), false, None).await.unwrap_err().kind(), ErrorKind::NotFound);
}

/// Pages of `path` in the page cache (mmap + mincore).
pub(crate) fn cached_pages(path: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore writes
    // one byte per page into a vector of exactly that many bytes.
    unsafe {
        let map =
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED, "mmap {}", path.display());
        let mut pages = vec![0u8; len.div_ceil(page)];
        let rc = libc::mincore(map, len, pages.as_mut_ptr());
        libc::munmap(map, len);
        assert_eq!(rc, 0, "mincore");
        pages.iter().filter(|p| **p & 1 != 0).count()
    }
}

/// A tier with O_DIRECT reads returns the same verified bytes for any range, and neither its
/// writes nor its reads leave the shard in the page cache; the same store without O_DIRECT does
/// (so the measurement can tell). Damage is still caught.
async fn direct_io_tier_reads_bypass_the_page_cache(engine: MakeEngine) {
    let len = 3 * BLOCK_SIZE + 4321;
    let expect = data(len, 7);
    for direct in [false, true] {
        let hdd = tempfile::tempdir().unwrap();
        let mut options = options(&[], &[hdd.path()]);
        options.hdd_direct_io = direct;
        let store = ShardStore::open(options, engine()).await.unwrap();
        store.write(id(1), expect.clone()).await.unwrap();
        let path = store.shard_path(&id(1)).unwrap();
        if direct {
            assert_eq!(cached_pages(&path), 0, "a shard written to an O_DIRECT tier stays cached");
        }
        for (offset, n) in [(0, 0), (1, 10), (BLOCK_SIZE - 3, 7), (2 * BLOCK_SIZE + 100, 9999), (len - 5, 5)]
        {
            let (got, data_len) = store.read(id(1), offset as u64, n as u64).await.unwrap();
            let end = if n == 0 { len } else { (offset + n).min(len) };
            assert!(got == expect.slice(offset..end), "read of {n} at {offset} (direct {direct})");
            assert_eq!(data_len, len as u64);
        }
        store.check(id(1), true, None).await.unwrap();
        let cached = cached_pages(&path);
        if direct {
            assert_eq!(cached, 0, "O_DIRECT reads filled the page cache");
        } else {
            assert!(cached > 0, "buffered reads should leave pages cached (mincore sees none)");
        }
        let header_len = crate::shard::header_len_for(len as u64);
        flip_byte(&path, header_len + BLOCK_SIZE as u64 + 1);
        let err = store.read(id(1), BLOCK_SIZE as u64, 10).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    }
}

/// An engine that counts the buffered reads it is asked for.
struct CountingReads {
    inner: Arc<dyn IoEngine>,
    reads: std::sync::atomic::AtomicUsize,
}

impl IoEngine for CountingReads {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn read_at(&self, file: Arc<std::fs::File>, offset: u64, len: usize) -> crate::engine::IoFuture<Vec<u8>> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.read_at(file, offset, len)
    }
    fn read_at_direct(
        &self,
        file: Arc<std::fs::File>,
        offset: u64,
        len: usize,
    ) -> crate::engine::IoFuture<Vec<u8>> {
        self.inner.read_at_direct(file, offset, len)
    }
    fn write_at(&self, file: Arc<std::fs::File>, offset: u64, data: Bytes) -> crate::engine::IoFuture<()> {
        self.inner.write_at(file, offset, data)
    }
    fn fsync(&self, file: Arc<std::fs::File>) -> crate::engine::IoFuture<()> {
        self.inner.fsync(file)
    }
}

/// A read the page cache holds is served without the engine; once the pages are dropped the
/// same read goes through the engine; both return the same verified bytes, and damage is
/// caught on either path.
async fn cached_reads_skip_the_engine_and_cold_reads_use_it(engine: MakeEngine) {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let counting = Arc::new(CountingReads { inner: engine(), reads: Default::default() });
    let store = ShardStore::open(options(&[dir.path()], &[]), counting.clone()).await.unwrap();
    let len = 2 * BLOCK_SIZE + 777;
    let expect = data(len, 9);
    store.write(id(1), expect.clone()).await.unwrap();
    let path = store.shard_path(&id(1)).unwrap();
    let drop_pages = || {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: advice on a descriptor we hold; it only drops clean cached pages.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    };
    for (offset, n) in [(0usize, 0usize), (5, 100), (BLOCK_SIZE + 3, BLOCK_SIZE)] {
        let end = if n == 0 { len } else { offset + n };
        store.read(id(1), offset as u64, n as u64).await.unwrap();
        let before = counting.reads.load(SeqCst);
        let (warm, _) = store.read(id(1), offset as u64, n as u64).await.unwrap();
        assert_eq!(counting.reads.load(SeqCst), before, "a cached read of {n} at {offset} used the engine");
        assert!(warm == expect.slice(offset..end));
        drop_pages();
        assert_eq!(cached_pages(&path), 0, "the shard's pages were not dropped");
        let (cold, _) = store.read(id(1), offset as u64, n as u64).await.unwrap();
        assert!(counting.reads.load(SeqCst) > before, "a cold read of {n} at {offset} skipped the engine");
        assert!(cold == expect.slice(offset..end));
    }
    flip_byte(&path, crate::shard::header_len_for(len as u64) + 10);
    drop_pages();
    assert_eq!(store.read(id(1), 0, 100).await.unwrap_err().kind(), ErrorKind::Corrupt);
    store.read(id(1), 0, 0).await.unwrap_err();
    assert_eq!(store.read(id(1), 0, 100).await.unwrap_err().kind(), ErrorKind::Corrupt, "from the cache");
}

async fn buffered_writes_are_readable_at_once_and_on_disk_after_sync(engine: MakeEngine) {
    let ssd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let log = state.path().join("unflushed");
    let mut opts = options(&[ssd.path()], &[]);
    opts.flush_interval = std::time::Duration::from_secs(60);
    opts.power_loss_log = Some(log.clone());
    let store = ShardStore::open(opts.clone(), engine()).await.unwrap();
    // Two shards of one file buffered, one of another written durably.
    let (a, b, c) = (id(1), ShardId { stripe: 2, ..id(1) }, id(3));
    store.write_buffered(a, data(5000, 1)).await.unwrap();
    store.write_buffered(b, data(10, 2)).await.unwrap();
    store.write(c, data(700, 3)).await.unwrap();
    // The durable write's batch took the buffered ones along.
    assert_eq!(store.unflushed(), 0);
    let d = ShardId { ino: 2000, ..id(4) };
    store.write_buffered(d, data(64, 4)).await.unwrap();
    assert_eq!(store.unflushed(), 1);
    assert_eq!(store.read(d, 0, 0).await.unwrap().0, data(64, 4), "readable before it is on disk");
    // A sync of another inode waits for nothing; one of this inode flushes it.
    store.sync_ino(a.ino).await.unwrap();
    assert_eq!(store.unflushed(), 1);
    store.sync_ino(d.ino).await.unwrap();
    assert_eq!(store.unflushed(), 0);
    let e = ShardId { ino: 3000, ..id(5) };
    store.write_buffered(e, data(64, 5)).await.unwrap();
    // A restart after a power loss, the old process never flushing again (its interval is a
    // minute): what the list names is gone, everything flushed is there.
    let _dead = store;
    let store = ShardStore::open(opts, engine()).await.unwrap();
    assert_eq!(store.read(e, 0, 0).await.unwrap_err().kind(), ErrorKind::NotFound, "lost as in a power loss");
    for (shard, want) in [(a, data(5000, 1)), (b, data(10, 2)), (c, data(700, 3)), (d, data(64, 4))] {
        assert_eq!(store.read(shard, 0, 0).await.unwrap().0, want, "{shard}");
    }
}

macro_rules! store_tests {
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

store_tests!(
    round_trip_sizes,
    range_reads_across_block_edges,
    corrupt_data_is_never_returned,
    corrupt_header_is_detected,
    missing_shards,
    hostile_ids_are_rejected,
    reopen_rebuilds_index_and_usage,
    a_full_disk_is_no_space,
    partial_writes_are_removed_at_open,
    ssd_is_preferred_and_hdd_serves_alone,
    concurrent_writes_and_reads,
    listing_pages_in_id_order_and_check_finds_damage,
    direct_io_tier_reads_bypass_the_page_cache,
    cached_reads_skip_the_engine_and_cold_reads_use_it,
    buffered_writes_are_readable_at_once_and_on_disk_after_sync,
);
