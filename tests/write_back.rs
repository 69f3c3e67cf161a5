//! Write-back of open files: a writer that never closes, or whose client dies, loses only what
//! it wrote within the last commit interval, and an error late in a long write keeps what was
//! committed before it. Real processes: `cairn up`, a second `cairn mount` as the writer, a
//! Python process writing through it (one that never forks, so no copy of its descriptor is
//! closed elsewhere: every FUSE flush would commit), killed with `kill -9`.

mod support;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use support::{cli_json, eventually, kill9, metric, scrape, Cluster, Mount};

const UNIT_KIB: u32 = 256;

/// A Python writer: creates `path`, writes what it is told (random bytes, also appended to the
/// reference file `reference`), reports, and keeps the file open.
/// Commands on stdin: `write N` (N bytes, then prints `written TOTAL`), `pwrite OFFSET:N` (N
/// bytes at OFFSET, the descriptor's position unchanged; prints `written END`), `close -`
/// (prints `closed 0`), `stream LIMIT` (1 MiB
/// at a time, a few ms apart, until a write fails or LIMIT bytes; prints `failed ERRNO TOTAL`
/// or `limit TOTAL`, then closes the file and prints `closed ERRNO` with 0 for success).
const WRITER: &str = r#"
import errno, os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
ref = open(sys.argv[2], 'wb')
total = 0
def put(n):
    global total
    data = os.urandom(n)
    ref.seek(total)
    ref.write(data)
    ref.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    total += n
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == 'write':
        put(int(arg))
        print('written', total, flush=True)
    elif cmd == 'pwrite':
        offset, n = (int(x) for x in arg.split(':'))
        data = os.urandom(n)
        ref.seek(offset)
        ref.write(data)
        ref.flush()
        os.pwrite(fd, data, offset)
        print('written', offset + n, flush=True)
    elif cmd == 'close':
        os.close(fd)
        print('closed 0', flush=True)
    elif cmd == 'stream':
        code = None
        while total < int(arg):
            try:
                put(1 << 20)
            except OSError as e:
                code = e.errno
                break
            time.sleep(0.01)
        print('failed %d %d' % (code, total) if code else 'limit %d' % total, flush=True)
        try:
            os.close(fd)
            print('closed 0', flush=True)
        except OSError as e:
            print('closed %d' % e.errno, flush=True)
"#;

struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    fn start(path: &Path, reference: &Path) -> Writer {
        let mut child = Command::new("python3")
            .args(["-c", WRITER])
            .arg(path)
            .arg(reference)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the python writer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Writer { child, stdin, stdout }
    }

    /// Send a command and return the words of the answer's line.
    fn ask(&mut self, command: &str) -> Vec<String> {
        writeln!(self.stdin, "{command}").expect("send to the writer");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the writer's answer");
        assert!(!line.is_empty(), "the writer exited instead of answering {command:?}");
        line.split_whitespace().map(String::from).collect()
    }

    fn line(&mut self) -> Vec<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the writer's line");
        line.split_whitespace().map(String::from).collect()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The file as the metaserver has it now, read by a new client (one whose kernel has cached
/// nothing of it): its size is the committed one, and every byte up to it must be the
/// reference's (the committed prefix of what was written), nothing torn or zeroed.
fn assert_committed_prefix(cluster: &Cluster, name: &str, reference: &[u8]) -> usize {
    let (_, info) = cli_json(cluster, &["info", cluster.mnt.join(name).to_str().unwrap()]);
    let size = info["size"].as_u64().expect("size") as usize;
    let reader = Mount::new(cluster, &format!("reader-{}", READERS.fetch_add(1, Ordering::Relaxed)));
    let got = fs::read(reader.dir.join(name)).expect("read the file back");
    assert_eq!(got.len(), size, "a new client reads as many bytes as the committed size");
    assert!(got.len() <= reference.len(), "{} bytes read, only {} written", got.len(), reference.len());
    if got != reference[..got.len()] {
        let at = got.iter().zip(reference).position(|(a, b)| a != b).unwrap_or(0);
        panic!("the committed {} bytes differ from what was written, first at byte {at}", got.len());
    }
    got.len()
}

static READERS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_writer_that_never_closes_loses_only_the_last_interval_when_its_client_dies() {
    let cluster = Cluster::start_with(Path::new("/tmp"), 6, "4+2", UNIT_KIB, &["--client-lease-ms", "2000"]);
    let metrics = support::free_addr();
    let mut client =
        Mount::with_args(&cluster, "writer", &["--commit-interval-ms", "1000", "--metrics", &metrics]);
    let reference = cluster.root.path().join("reference");
    let mut writer = Writer::start(&client.dir.join("log"), &reference);

    // 64 MiB and a partial stripe, never closed: write-back commits all of it within about
    // 1.2 intervals, and another client sees it.
    let first = (64 << 20) + 100_000;
    assert_eq!(writer.ask(&format!("write {first}")), ["written", &first.to_string()]);
    let seen = cluster.mnt.join("log");
    eventually(60, "another client sees the whole file committed", || {
        fs::metadata(&seen).map(|m| m.len()).unwrap_or(0) == first as u64
    });
    let text = scrape(&metrics);
    assert!(metric(&text, "cairn_client_write_back_commits_total", &[]).unwrap_or(0.0) >= 1.0, "{text}");
    assert!(metric(&text, "cairn_client_write_back_bytes_total", &[]).unwrap_or(0.0) >= first as f64);
    assert!(metric(&text, "cairn_client_oldest_uncommitted_seconds", &[]).is_some(), "{text}");
    assert_eq!(assert_committed_prefix(&cluster, "log", &fs::read(&reference).unwrap()), first);

    // 8 MiB more, and the client dies at once: what was committed stays, byte-exact; of the
    // rest, at most what write-back committed meanwhile, never a torn or zeroed stripe.
    let more = 8 << 20;
    assert_eq!(writer.ask(&format!("write {more}")), ["written", &(first + more).to_string()]);
    client.kill9();
    drop(writer);
    drop(client);
    let len = assert_committed_prefix(&cluster, "log", &fs::read(&reference).unwrap());
    assert!(len >= first, "the file shrank to {len} bytes after the crash");

    // Once the dead client's lease ran out and its unfinished shards were judged, fsck finds
    // the namespace and every stripe clean.
    eventually(60, "fsck is clean after the crash", || {
        let (code, report) = cli_json(&cluster, &["fsck"]);
        code == 0 && report["files"].as_u64() == Some(1)
    });
}

#[test]
fn two_chunkservers_lost_mid_write_fail_the_writer_and_keep_what_was_committed() {
    let cluster = Cluster::start(6, "4+2", UNIT_KIB);
    // The writer does not wait for chunkservers (`tests/failures.rs` covers the wait).
    let client =
        Mount::with_args(&cluster, "writer", &["--commit-interval-ms", "500", "--write-wait-ms", "0"]);
    let reference = cluster.root.path().join("reference");
    let mut writer = Writer::start(&client.dir.join("big"), &reference);
    writeln!(writer.stdin, "stream {}", 1u64 << 30).unwrap();

    // Once write-back has committed a good part of the file, two of the six chunkservers die:
    // with four left, no stripe can be stored on k+1 of them.
    let seen = cluster.mnt.join("big");
    eventually(60, "write-back commits the first 8 MiB", || {
        fs::metadata(&seen).map(|m| m.len()).unwrap_or(0) >= 8 << 20
    });
    let pids = cluster.chunk_pids();
    kill9(pids[0]);
    kill9(pids[1]);

    // The writer gets EIO (the README's failure table) from a write, and from its close.
    let outcome = writer.line();
    assert_eq!(outcome.first().map(String::as_str), Some("failed"), "the write never failed: {outcome:?}");
    assert_eq!(outcome[1], libc::EIO.to_string(), "{outcome:?}");
    let closed = writer.line();
    assert_eq!(closed, ["closed", &libc::EIO.to_string()]);

    // Everything committed before the failure reads back byte-exact (from the four survivors).
    let len = assert_committed_prefix(&cluster, "big", &fs::read(&reference).unwrap());
    assert!(len >= 8 << 20, "only {len} bytes kept");
}

#[test]
fn a_stripe_that_cannot_be_stored_is_never_committed_as_a_hole() {
    let cluster = Cluster::start(6, "4+2", UNIT_KIB);
    let metrics = support::free_addr();
    // Not waiting for chunkservers: the pass fails at once.
    let client = Mount::with_args(
        &cluster,
        "writer",
        &["--commit-interval-ms", "300", "--write-wait-ms", "0", "--metrics", &metrics],
    );
    let reference = cluster.root.path().join("reference");
    let mut writer = Writer::start(&client.dir.join("f"), &reference);
    let stripe = 1usize << 20; // 4 x 256 KiB
    let first = 8 * stripe;
    assert_eq!(writer.ask(&format!("write {first}")), ["written", &first.to_string()]);
    let seen = cluster.mnt.join("f");
    eventually(60, "write-back commits the first 8 stripes", || {
        fs::metadata(&seen).map(|m| m.len()).unwrap_or(0) == first as u64
    });

    // The chunkservers at placement positions 0 and 1 die. Shard i of stripe s lives at
    // position (s + i) mod 6, so stripe 8 filled past its first data shard (six shards) cannot
    // be stored, while a small write into stripe 10 (data shard 0 and two parity shards, at
    // positions 4, 2 and 3) can. Both writes are only buffered and succeed.
    let (_, info) = cli_json(&cluster, &["info", seen.to_str().unwrap()]);
    for position in 0..2 {
        let addr = info["placement"][position]["addr"].as_str().expect("placement address");
        let node = cluster.nodes.iter().find(|n| n.role == "chunk" && n.addr == addr).expect("node");
        kill9(node.pid);
    }
    let tail = stripe - 100_000;
    assert_eq!(writer.ask(&format!("write {tail}")), ["written", &(first + tail).to_string()]);
    let far = 10 * stripe;
    assert_eq!(writer.ask(&format!("pwrite {far}:1000")), ["written", &(far + 1000).to_string()]);
    eventually(30, "a write-back pass fails to store stripe 8", || {
        metric(&scrape(&metrics), "cairn_client_write_back_failures_total", &[]).unwrap_or(0.0) >= 1.0
    });
    // Stripe 10 is stored but not committed: the committed size still ends where the stored
    // bytes end, and stripe 8 is not published as a hole of zeros.
    let len = assert_committed_prefix(&cluster, "f", &fs::read(&reference).unwrap());
    assert_eq!(len, first, "the committed size moved past a stripe that is not stored");
}

#[test]
fn a_log_appended_between_write_backs_stays_byte_exact() {
    let cluster = Cluster::start(6, "4+2", UNIT_KIB);
    let client = Mount::with_args(&cluster, "writer", &["--commit-interval-ms", "200"]);
    let reference = cluster.root.path().join("reference");
    let mut writer = Writer::start(&client.dir.join("log"), &reference);
    let seen = cluster.mnt.join("log");
    // Each record ends inside a stripe (1 MiB); write-back stores that partial stripe and
    // commits it, and the next record continues the stripe from the bytes kept in memory.
    let mut total = 0u64;
    for record in [300_000u64, 300_000, 500_000, 1, 700_000, 123_457] {
        total += record;
        assert_eq!(writer.ask(&format!("write {record}")), ["written", &total.to_string()]);
        eventually(60, "write-back commits the record", || {
            fs::metadata(&seen).map(|m| m.len()).unwrap_or(0) == total
        });
    }
    assert_eq!(writer.ask("close -"), ["closed", "0"]);
    let len = assert_committed_prefix(&cluster, "log", &fs::read(&reference).unwrap());
    assert_eq!(len as u64, total);
}
