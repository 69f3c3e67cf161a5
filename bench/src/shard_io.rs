//! Shard I/O through the chunkserver's own store (`ShardStore`: header, BLAKE3 block checksums,
//! temp file + rename, fsync when `sync`), with each I/O engine, through the page cache and
//! with O_DIRECT reads (`hdd_direct_io`; with io_uring also into registered buffers), on a directory of this machine's disk: shard writes
//! per second and MB/s, whole-shard reads from a cold cache, and 4 KiB reads at random offsets
//! from many tasks at once (each verifies its 64 KiB checksum block), right after the whole
//! reads (warm for buffered reads) and from a cold cache. "Cold": every shard file's pages
//! dropped with posix_fadvise(DONTNEED) first. Run:
//! `cargo run --release -p cairn-bench --bin shard-io [DIR]` (default: a temp dir under
//! /var/tmp). Regressions in the store show here before they show in fio through FUSE.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_chunk::{engine, ShardStore, StoreOptions, TierPolicy};
use cairn_common::config::IoEngineKind;
use cairn_common::ShardId;

const SHARD: usize = 1 << 20;
const SHARDS: u64 = 256;
const SMALL_READS: u64 = 20_000;
const CONCURRENCY: usize = 32;

fn id(n: u64) -> ShardId {
    ShardId { ino: 1_000 + n, stripe: 0, index: 0, version: 1 }
}

async fn run(
    dir: &std::path::Path,
    kind: IoEngineKind,
    sync: bool,
    direct: bool,
    registered: bool,
) -> cairn_common::Result<()> {
    let root = dir.join(format!("{kind:?}-{sync}-{direct}-{registered}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| cairn_common::CairnError::from_io("mkdir", &e))?;
    let options = StoreOptions {
        ssd_dirs: if direct { vec![] } else { vec![root.join("ssd")] },
        hdd_dirs: if direct { vec![root.join("hdd")] } else { vec![] },
        sync,
        flush_interval: std::time::Duration::from_millis(1000),
        power_loss_log: None,
        reserve_bytes: 0,
        policy: TierPolicy::default(),
        ssd_direct_io: false,
        hdd_direct_io: direct,
    };
    let fixed = if direct && registered { 16 } else { 0 };
    let store = Arc::new(ShardStore::open(options, engine::open(kind, 64, fixed)).await?);
    let data =
        Bytes::from((0..SHARD).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>());

    let start = Instant::now();
    let writes = (0..SHARDS).map(|n| {
        let (store, data) = (store.clone(), data.clone());
        async move { store.write(id(n), data).await }
    });
    for r in futures_join(writes, CONCURRENCY).await {
        r?;
    }
    let secs = start.elapsed().as_secs_f64();
    let label = format!(
        "{kind:?} sync={sync}{}",
        match (direct, registered) {
            (false, _) => "",
            (true, false) => " O_DIRECT",
            (true, true) => " O_DIRECT fixed",
        }
    );
    println!(
        "{label:31} write 1 MiB shards   {:7.0} shards/s {:8.1} MB/s",
        SHARDS as f64 / secs,
        (SHARDS as usize * SHARD) as f64 / secs / 1e6
    );

    drop_cached_under(&root);
    let start = Instant::now();
    let reads = (0..SHARDS).map(|n| {
        let store = store.clone();
        async move { store.read(id(n), 0, 0).await.map(|(b, _)| b.len()) }
    });
    let mut bytes = 0;
    for r in futures_join(reads, CONCURRENCY).await {
        bytes += r?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{label:31} read whole, cold     {:7.0} shards/s {:8.1} MB/s",
        SHARDS as f64 / secs,
        bytes as f64 / secs / 1e6
    );
    let warm = small_reads(&store).await?;
    drop_cached_under(&root);
    let cold = small_reads(&store).await?;
    println!("{label:31} read 4 KiB random    {warm:7.0} IOPS after the whole reads, {cold:7.0} IOPS cold");
    drop(store);
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// 4 KiB reads at scattered offsets of every shard, `CONCURRENCY` at once; reads per second.
async fn small_reads(store: &Arc<ShardStore>) -> cairn_common::Result<f64> {
    let start = Instant::now();
    let small = (0..SMALL_READS).map(|i| {
        let store = store.clone();
        let n = i.wrapping_mul(2_654_435_761) % SHARDS;
        let offset = (i.wrapping_mul(40_503) % (SHARD as u64 / 4096)) * 4096;
        async move { store.read(id(n), offset, 4096).await.map(|(b, _)| b.len()) }
    });
    for r in futures_join(small, CONCURRENCY).await {
        r?;
    }
    Ok(SMALL_READS as f64 / start.elapsed().as_secs_f64())
}

/// Drop every file under `dir` from the page cache.
fn drop_cached_under(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            drop_cached_under(&path);
        } else if let Ok(file) = std::fs::File::open(&path) {
            engine::drop_cached(&file);
        }
    }
}

/// Run `futures` with at most `limit` in flight; results in order.
async fn futures_join<T>(
    futures: impl Iterator<Item = impl std::future::Future<Output = T>>,
    limit: usize,
) -> Vec<T> {
    use futures::stream::{self, StreamExt};
    stream::iter(futures).buffered(limit).collect().await
}

fn main() {
    let dir = std::env::args().nth(1).map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(format!("/var/tmp/cairn-shard-io-{}", std::process::id()))
    });
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!(
        "shard store on {} ({} shards of 1 MiB, {CONCURRENCY} requests in flight)",
        dir.display(),
        SHARDS
    );
    for kind in [IoEngineKind::Uring, IoEngineKind::Pread] {
        let mut cases = vec![(true, false, false), (false, false, false), (true, true, false)];
        if kind == IoEngineKind::Uring {
            cases.push((true, true, true)); // registered buffers: io_uring only
        }
        for (sync, direct, registered) in cases {
            if let Err(e) = rt.block_on(run(&dir, kind, sync, direct, registered)) {
                eprintln!("shard-io: {kind:?} sync={sync} direct={direct}: {}", e.message());
                std::process::exit(1);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
