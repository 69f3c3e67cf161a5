//! One suite, run against both engines: each `async fn` below takes the engine under test, and
//! `engine_tests!` turns it into a `#[tokio::test]` per engine.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::sync::Arc;

use bytes::Bytes;

use super::{IoEngine, PreadEngine, UringEngine};

/// Small on purpose, so the concurrency test queues far more requests than the ring holds.
const QUEUE_DEPTH: u32 = 4;

fn uring() -> Arc<dyn IoEngine> {
    Arc::new(UringEngine::new(QUEUE_DEPTH).expect("io_uring must be available for these tests"))
}

/// io_uring with two registered buffers: the concurrency cases use both them and buffers of
/// their own.
fn uring_fixed() -> Arc<dyn IoEngine> {
    let engine =
        UringEngine::with_fixed_buffers(QUEUE_DEPTH, 2).expect("io_uring must be available for these tests");
    assert_eq!(engine.fixed_buffers(), 2, "the kernel refused two registered buffers");
    Arc::new(engine)
}

fn pread() -> Arc<dyn IoEngine> {
    Arc::new(PreadEngine::new())
}

fn rw_file(dir: &tempfile::TempDir, name: &str) -> Arc<File> {
    let file =
        OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.path().join(name));
    Arc::new(file.expect("create test file"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn round_trip_at_offsets(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = rw_file(&dir, "f");
    let big = pattern((4 << 20) + 3, 9);
    let cases: [(u64, Vec<u8>); 4] = [
        (0, b"hello".to_vec()),
        (4096, pattern(4096, 1)),
        ((1 << 20) + 3, pattern(70_000, 2)),
        (8 << 20, big),
    ];
    for (offset, data) in &cases {
        engine.write_at(file.clone(), *offset, Bytes::from(data.clone())).await.unwrap();
    }
    for (offset, data) in &cases {
        let got = engine.read_at(file.clone(), *offset, data.len()).await.unwrap();
        assert!(got == *data, "mismatch at offset {offset}");
    }
    // Unwritten space between the writes reads as zeros.
    assert_eq!(engine.read_at(file.clone(), 5, 10).await.unwrap(), vec![0u8; 10]);
    // Zero-length operations complete at once.
    engine.write_at(file.clone(), 3, Bytes::new()).await.unwrap();
    assert!(engine.read_at(file.clone(), 0, 0).await.unwrap().is_empty());
}

async fn many_concurrent_requests(engine: Arc<dyn IoEngine>) {
    const N: usize = 300;
    const LEN: usize = 5000;
    let dir = tempfile::tempdir().unwrap();
    let file = rw_file(&dir, "f");
    let writes: Vec<_> = (0..N)
        .map(|i| {
            let fut = engine.write_at(file.clone(), (i * LEN) as u64, Bytes::from(pattern(LEN, i as u8)));
            tokio::spawn(fut)
        })
        .collect();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    let reads: Vec<_> =
        (0..N).map(|i| tokio::spawn(engine.read_at(file.clone(), (i * LEN) as u64, LEN))).collect();
    for (i, r) in reads.into_iter().enumerate() {
        assert!(r.await.unwrap().unwrap() == pattern(LEN, i as u8), "request {i}");
    }
}

async fn short_read_at_eof(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = rw_file(&dir, "f");
    engine.write_at(file.clone(), 0, Bytes::from(pattern(100, 3))).await.unwrap();
    assert_eq!(engine.read_at(file.clone(), 50, 100).await.unwrap(), pattern(100, 3)[50..]);
    assert!(engine.read_at(file.clone(), 100, 10).await.unwrap().is_empty());
    assert!(engine.read_at(file.clone(), 5000, 10).await.unwrap().is_empty());
}

fn open_direct(path: &std::path::Path) -> Arc<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path);
    Arc::new(file.expect("open with O_DIRECT (the test directory's filesystem must support it)"))
}

async fn direct_reads_of_any_range(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let len = (3 << 20) + 123;
    let data = pattern(len, 5);
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let file = open_direct(&dir.path().join("f"));
    let cases = [(0, 10), (4095, 2), (4096, 4096), (5000, 70_000), (0, len), (len - 10, 100), (100, 0)];
    for (offset, want) in cases {
        let got = engine.read_at_direct(file.clone(), offset as u64, want).await.unwrap();
        let end = (offset + want).min(len);
        assert!(got == data[offset..end], "direct read of {want} at {offset}: {} bytes", got.len());
    }
    assert!(engine.read_at_direct(file.clone(), len as u64, 10).await.unwrap().is_empty());
    assert!(engine.read_at_direct(file.clone(), len as u64 + 9000, 10).await.unwrap().is_empty());
    // Many at once, more than the ring holds.
    let reads: Vec<_> =
        (0..64).map(|i| tokio::spawn(engine.read_at_direct(file.clone(), i * 40_001, 40_001))).collect();
    for (i, r) in reads.into_iter().enumerate() {
        let at = i * 40_001;
        assert!(r.await.unwrap().unwrap() == data[at..(at + 40_001).min(len)], "read {i}");
    }
    // The descriptor really is O_DIRECT: an unaligned plain read is refused by the kernel.
    let err = engine.read_at(file, 1, 10).await.unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
}

/// Direct reads that fit take a registered buffer (and give it back: more reads than buffers,
/// one after another, all use one); a larger read uses its own; the bytes are right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_buffers_serve_direct_reads_that_fit() {
    use super::uring::FIXED_BUFFER_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let len = FIXED_BUFFER_BYTES + 10_000;
    let data = pattern(len, 11);
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let file = open_direct(&dir.path().join("f"));
    let engine = UringEngine::with_fixed_buffers(QUEUE_DEPTH, 2).unwrap();
    assert_eq!(engine.fixed_buffers(), 2);
    for i in 0..10u64 {
        let got = engine.read_at_direct(file.clone(), i * 1000, 70_000).await.unwrap();
        assert!(got == data[(i * 1000) as usize..(i * 1000) as usize + 70_000], "read {i}");
    }
    assert_eq!(engine.fixed_reads(), 10);
    let whole = engine.read_at_direct(file.clone(), 0, len).await.unwrap();
    assert!(whole == data, "a read larger than a registered buffer");
    assert_eq!(engine.fixed_reads(), 10, "a read larger than the buffers took one");
}

async fn fsync_files_and_directories(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = rw_file(&dir, "f");
    engine.write_at(file.clone(), 0, Bytes::from_static(b"durable")).await.unwrap();
    engine.fsync(file.clone()).await.unwrap();
    let dir_fd = Arc::new(File::open(dir.path()).unwrap());
    engine.fsync(dir_fd).await.unwrap();
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"durable");
}

async fn errors_on_a_read_only_fd(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ro"), b"data").unwrap();
    let file = Arc::new(File::open(dir.path().join("ro")).unwrap());
    let err = engine.write_at(file.clone(), 0, Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
    // The failure leaves the engine usable.
    assert_eq!(engine.read_at(file, 0, 4).await.unwrap(), b"data");
    let wo = Arc::new(OpenOptions::new().write(true).open(dir.path().join("ro")).unwrap());
    let err = engine.read_at(wo, 0, 4).await.unwrap_err();
    assert_ne!(err.kind(), ErrorKind::Other, "{err}");
}

async fn dropping_the_engine_finishes_accepted_requests(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let file = rw_file(&dir, "f");
    let pending: Vec<_> =
        (0..50u64).map(|i| engine.write_at(file.clone(), i * 1000, Bytes::from(pattern(1000, 7)))).collect();
    drop(engine);
    for p in pending {
        p.await.unwrap();
    }
    assert_eq!(std::fs::metadata(dir.path().join("f")).unwrap().len(), 50_000);
}

async fn create_file_puts_whole_files_in_place(engine: Arc<dyn IoEngine>) {
    let dir = tempfile::tempdir().unwrap();
    let (tmp, path) = (dir.path().join("f.tmp"), dir.path().join("f"));
    std::fs::write(&path, b"the old copy").unwrap();
    let parts = vec![Bytes::from_static(b"header|"), Bytes::from(pattern(70_000, 3))];
    let file = engine.create_file(tmp.clone(), path.clone(), parts.clone()).await.unwrap();
    assert!(!tmp.exists(), "the temporary name is gone once renamed");
    assert_eq!(std::fs::read(&path).unwrap(), parts.concat(), "the parts in order, the old copy replaced");
    // The returned file is the one in place, usable with the engine (the flusher syncs it).
    engine.fsync(file.clone()).await.unwrap();
    let reread = Arc::new(File::open(&path).unwrap());
    assert_eq!(engine.read_at(reread, 0, 7).await.unwrap(), b"header|");

    // A temporary name that exists already: refused, both files untouched.
    std::fs::write(&tmp, b"someone else's").unwrap();
    let err = engine.create_file(tmp.clone(), path.clone(), parts.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), parts.concat());
    std::fs::remove_file(&tmp).unwrap();

    // The rename fails (the target is a non-empty directory): the partial file is removed and
    // the target left as it was.
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("inside"), b"x").unwrap();
    let err = engine.create_file(tmp.clone(), busy.clone(), parts).await.unwrap_err();
    assert!(err.raw_os_error().is_some(), "the OS error is kept: {err}");
    assert!(!tmp.exists(), "a failed create leaves no temporary file");
    assert!(busy.join("inside").exists());
}

macro_rules! engine_tests {
    ($($case:ident),* $(,)?) => {
        mod uring_engine {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(super::uring()).await
            })*
        }
        mod uring_fixed_engine {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(super::uring_fixed()).await
            })*
        }
        mod pread_engine {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(super::pread()).await
            })*
        }
    };
}

engine_tests!(
    round_trip_at_offsets,
    many_concurrent_requests,
    short_read_at_eof,
    direct_reads_of_any_range,
    fsync_files_and_directories,
    errors_on_a_read_only_fd,
    dropping_the_engine_finishes_accepted_requests,
    create_file_puts_whole_files_in_place,
);
