//! Real tools on a Cairn mount, the way training jobs and data tools use it: git (init, commit,
//! a local clone that hard-links objects, fsck), SQLite with its journal and its WAL on the
//! mount, a Python venv with a wheel installed offline, mmap reads and shared writes seen by a
//! second client, and O_APPEND from several processes at once.
//!
//! Nothing here touches the network: the wheel is built by hand and pip runs with `--no-index`.

mod support;

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};

use support::{random_bytes, sha256, Cluster, Mount};

const UNIT: usize = 64 << 10;
const STRIPE: usize = 4 * UNIT;

/// Run a command to success and return its stdout; on failure show everything it printed.
fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed with {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout.into_owned()
}

/// git with a fixed identity and no user or system configuration.
fn git(dir: &Path, home: &Path, args: &[&str]) -> String {
    run(Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Cairn Test")
        .env("GIT_AUTHOR_EMAIL", "test@cairn.invalid")
        .env("GIT_COMMITTER_NAME", "Cairn Test")
        .env("GIT_COMMITTER_EMAIL", "test@cairn.invalid"))
}

#[test]
fn git_init_commit_clone_and_fsck() {
    let cluster = Cluster::start(6, "4+2", 64);
    let home = tempfile::tempdir().unwrap();
    let repo = cluster.mnt.join("repo");
    fs::create_dir(&repo).unwrap();
    git(&repo, home.path(), &["init", "-q", "-b", "main"]);
    fs::create_dir_all(repo.join("src/nested")).unwrap();
    fs::write(repo.join("README"), "a repository on cairn\n").unwrap();
    fs::write(repo.join("src/lib.rs"), "pub fn f() -> u32 { 42 }\n").unwrap();
    // A binary blob larger than a stripe, so objects span stripes.
    let blob = random_bytes(3 * STRIPE + 17, 1);
    fs::write(repo.join("src/nested/data.bin"), &blob).unwrap();
    git(&repo, home.path(), &["add", "-A"]);
    git(&repo, home.path(), &["commit", "-q", "-m", "first"]);
    fs::write(repo.join("README"), "a repository on cairn, edited\n").unwrap();
    fs::remove_file(repo.join("src/lib.rs")).unwrap();
    fs::write(repo.join("src/main.rs"), "fn main() {}\n").unwrap();
    git(&repo, home.path(), &["add", "-A"]);
    git(&repo, home.path(), &["commit", "-q", "-m", "second"]);
    // Packing rewrites every object into a pack file and deletes the loose ones.
    git(&repo, home.path(), &["gc", "-q"]);
    assert_eq!(git(&repo, home.path(), &["status", "--porcelain"]), "");

    // A local clone hard-links the source's objects.
    git(&cluster.mnt, home.path(), &["clone", "-q", "repo", "clone"]);
    let clone = cluster.mnt.join("clone");
    let log = git(&clone, home.path(), &["log", "--format=%s"]);
    assert_eq!(log, "second\nfirst\n");
    git(&clone, home.path(), &["fsck", "--full", "--strict"]);
    git(&repo, home.path(), &["fsck", "--full", "--strict"]);
    assert_eq!(fs::read_to_string(clone.join("README")).unwrap(), "a repository on cairn, edited\n");
    assert_eq!(sha256(&fs::read(clone.join("src/nested/data.bin")).unwrap()), sha256(&blob));
    assert!(!clone.join("src/lib.rs").exists());
    // The first commit checks out too.
    git(&clone, home.path(), &["checkout", "-q", "HEAD~1"]);
    assert_eq!(fs::read_to_string(clone.join("src/lib.rs")).unwrap(), "pub fn f() -> u32 { 42 }\n");
    git(&clone, home.path(), &["fsck", "--full", "--strict"]);
}

fn sqlite(db: &Path, sql: &str) -> String {
    let mut child = Command::new("sqlite3")
        .args(["-batch", "-bail"])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sqlite3");
    child.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "sqlite3 {} failed\nstdout:\n{stdout}\nstderr:\n{stderr}", db.display());
    stdout.into_owned()
}

#[test]
fn sqlite_with_rollback_journal_and_wal() {
    let cluster = Cluster::start(6, "4+2", 64);
    let second = Mount::new(&cluster, "mnt2");
    for mode in ["delete", "wal"] {
        let db = cluster.mnt.join(format!("labels-{mode}.db"));
        let mut sql = format!(
            "PRAGMA journal_mode={mode};\n\
             CREATE TABLE labels(id INTEGER PRIMARY KEY, path TEXT NOT NULL, label INTEGER NOT NULL);\n\
             CREATE INDEX by_label ON labels(label);\nBEGIN;\n"
        );
        for i in 1..=10_000 {
            sql.push_str(&format!(
                "INSERT INTO labels(path, label) VALUES ('shard-{:05}/img-{i:07}.jpg', {});\n",
                i % 97,
                i % 10
            ));
        }
        sql.push_str("COMMIT;\n");
        let out = sqlite(&db, &sql);
        assert_eq!(out.trim(), mode, "journal mode");
        let query = "SELECT count(*), sum(label), sum(id) FROM labels;\nPRAGMA integrity_check;\n";
        let expected =
            format!("10000|{}|{}\nok\n", (1..=10_000).map(|i| i % 10).sum::<u64>(), 10_000 * 10_001 / 2);
        assert_eq!(sqlite(&db, query), expected, "{mode}: the writer's client");
        // An update in a second transaction, then a rollback that must leave no trace.
        sqlite(&db, "BEGIN; UPDATE labels SET label = label + 1 WHERE id % 2 = 0; COMMIT;");
        sqlite(&db, "BEGIN; DELETE FROM labels; ROLLBACK;");
        let expected = format!(
            "10000|{}|{}\nok\n",
            (1..=10_000).map(|i| i % 10 + (1 - i % 2)).sum::<u64>(),
            10_000 * 10_001 / 2
        );
        assert_eq!(sqlite(&db, query), expected, "{mode}: after update and rollback");
        // The other client opens the same database after the writer closed it.
        let other = second.dir.join(db.file_name().unwrap());
        assert_eq!(sqlite(&other, query), expected, "{mode}: the second client");
        // No journal is left behind in rollback mode; in WAL mode the last close checkpoints.
        let names: Vec<String> = fs::read_dir(&cluster.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with("-journal") || n.ends_with("-wal")), "{names:?}");
    }
}

/// A wheel built by hand (a zip with the package, METADATA, WHEEL and RECORD), so nothing has
/// to come from the network or from build tools. Returns the wheel's path.
fn build_wheel(python: &Path, dir: &Path) -> std::path::PathBuf {
    let script = r#"
import base64, hashlib, sys, zipfile
out = sys.argv[1]
files = {
    "cairn_probe/__init__.py": "VALUE = 'served from cairn'\nfrom .calc import double\n",
    "cairn_probe/calc.py": "def double(x):\n    return 2 * x\n",
    "cairn_probe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: cairn-probe\nVersion: 0.1\n",
    "cairn_probe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("cairn_probe-0.1.dist-info/RECORD,,")
    z.writestr("cairn_probe-0.1.dist-info/RECORD", "\n".join(record) + "\n")
"#;
    let wheel = dir.join("cairn_probe-0.1-py3-none-any.whl");
    run(Command::new(python).arg("-c").arg(script).arg(&wheel));
    wheel
}

#[test]
fn python_venv_installs_a_wheel_offline() {
    let cluster = Cluster::start(6, "4+2", 64);
    let venv = cluster.mnt.join("venv");
    // `ensurepip` installs pip from the wheel bundled with Python: no network.
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let python = venv.join("bin/python");
    let wheels = cluster.mnt.join("wheels");
    fs::create_dir(&wheels).unwrap();
    let wheel = build_wheel(&python, &wheels);
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-cache-dir",
        ])
        .arg(&wheel)
        .env("PIP_NO_INDEX", "1"));
    let out = run(Command::new(&python).args([
        "-c",
        "import cairn_probe, sys; print(cairn_probe.VALUE, cairn_probe.double(21), cairn_probe.__file__.startswith(sys.prefix))",
    ]));
    assert_eq!(out, "served from cairn 42 True\n");
    let listed = run(Command::new(&python).args(["-m", "pip", "list", "--disable-pip-version-check"]));
    assert!(listed.contains("cairn-probe") && listed.contains("0.1"), "{listed}");
    // Bytecode compiled by the install lives on the mount and imports cleanly from it.
    run(Command::new(&python).args(["-m", "compileall", "-q"]).arg(venv.join("lib")));
    run(Command::new(&python).args(["-m", "pip", "uninstall", "-y", "cairn-probe"]));
    let gone = Command::new(&python).args(["-c", "import cairn_probe"]).output().unwrap();
    assert!(!gone.status.success(), "the package is still importable after uninstall");
}

struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(f: &fs::File, len: usize, prot: i32) -> Map {
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Map { ptr: ptr.cast(), len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn sync(&self) {
        let rc = unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) };
        assert_eq!(rc, 0, "msync: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[test]
fn mmap_read_and_shared_write_seen_by_another_client() {
    let cluster = Cluster::start(6, "4+2", 64);
    let second = Mount::new(&cluster, "mnt2");
    let path = cluster.mnt.join("mapped.bin");
    let mut data = random_bytes(5 * STRIPE + 12345, 7);
    fs::write(&path, &data).unwrap();

    // Read through a read-only mapping.
    let f = fs::File::open(&path).unwrap();
    let mut map = Map::new(&f, data.len(), libc::PROT_READ);
    assert_eq!(sha256(map.bytes()), sha256(&data), "mmap read");
    drop(map);
    drop(f);

    // Write through a shared mapping, across unit and stripe edges and in the last page, then
    // msync.
    let f = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut map = Map::new(&f, data.len(), libc::PROT_READ | libc::PROT_WRITE);
    let edits = [
        (0usize, 10usize),
        (UNIT - 5, 10),
        (STRIPE - 3000, 6000),
        (3 * STRIPE + 1, 1),
        (data.len() - 100, 100),
    ];
    for (i, (at, len)) in edits.into_iter().enumerate() {
        let patch = random_bytes(len, 100 + i as u64);
        map.bytes()[at..at + len].copy_from_slice(&patch);
        data[at..at + len].copy_from_slice(&patch);
    }
    map.sync();
    // A fresh open on this client, while the mapping is still there.
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&data), "after msync, same client");
    drop(map);
    drop(f);
    assert_eq!(fs::metadata(&path).unwrap().len(), data.len() as u64);
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&data), "after munmap and close, same client");
    // The other client opens it after the writer closed it.
    let other = second.dir.join("mapped.bin");
    assert_eq!(fs::metadata(&other).unwrap().len(), data.len() as u64);
    assert_eq!(sha256(&fs::read(&other).unwrap()), sha256(&data), "second client");
    // And the second client's own read-only mapping sees the same bytes.
    let f = fs::File::open(&other).unwrap();
    let mut map = Map::new(&f, data.len(), libc::PROT_READ);
    assert_eq!(sha256(map.bytes()), sha256(&data), "second client's mmap");
}

const RECORD: usize = 64;
const WRITERS: usize = 4;
const RECORDS_EACH: usize = 200;

fn record(writer: usize, seq: usize) -> Vec<u8> {
    let head = format!("writer {writer} record {seq:04} ");
    let mut r = head.into_bytes();
    let fill = b'a' + ((writer * 7 + seq) % 26) as u8;
    r.resize(RECORD - 1, fill);
    r.push(b'\n');
    r
}

#[test]
fn o_append_from_concurrent_processes_loses_nothing() {
    appenders_lose_nothing(false);
}

/// The same with every record its own open, write and close: one process's close (a commit)
/// races with another's open through the same client, which must not bring back the stripes
/// the commit replaced.
#[test]
fn o_append_with_an_open_and_close_per_record_loses_nothing() {
    appenders_lose_nothing(true);
}

/// WRITERS processes append RECORDS_EACH records each to one file, one write(2) per record;
/// every record must be there once, whole, in each writer's order.
fn appenders_lose_nothing(reopen_per_record: bool) {
    let cluster = Cluster::start(6, "4+2", 64);
    let path = cluster.mnt.join("log");
    fs::write(&path, b"").unwrap();
    let go = cluster.root.path().join("go");
    // Each writer waits for `go`, then appends its records, one write(2) each.
    let script = format!(
        r#"
import os, sys, time
w = int(sys.argv[1])
while not os.path.exists({go:?}):
    time.sleep(0.001)
reopen = {reopen}
fd = os.open({path:?}, os.O_WRONLY | os.O_APPEND)
for i in range({RECORDS_EACH}):
    head = f"writer {{w}} record {{i:04}} ".encode()
    fill = bytes([ord("a") + (w * 7 + i) % 26])
    rec = head + fill * ({RECORD} - 1 - len(head)) + b"\n"
    assert os.write(fd, rec) == len(rec)
    if reopen:
        os.close(fd)
        fd = os.open({path:?}, os.O_WRONLY | os.O_APPEND)
os.close(fd)
"#,
        go = go.display().to_string(),
        path = path.display().to_string(),
        reopen = if reopen_per_record { "True" } else { "False" },
    );
    let children: Vec<_> = (0..WRITERS)
        .map(|w| {
            Command::new("python3").arg("-c").arg(&script).arg(w.to_string()).spawn().expect("spawn writer")
        })
        .collect();
    fs::write(&go, b"").unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a writer failed");
    }
    let log = fs::read(&path).unwrap();
    assert_eq!(log.len(), WRITERS * RECORDS_EACH * RECORD, "size of the log");
    let mut next = [0usize; WRITERS];
    for (n, rec) in log.chunks(RECORD).enumerate() {
        let text = String::from_utf8_lossy(rec);
        let mut words = text.split(' ');
        let writer: usize = match (words.next(), words.next().and_then(|w| w.parse().ok())) {
            (Some("writer"), Some(w)) if w < WRITERS => w,
            _ => panic!("record {n} at byte {} is torn: {text:?}", n * RECORD),
        };
        let seq = next[writer];
        assert_eq!(rec, record(writer, seq), "record {n}: expected writer {writer}'s record {seq}");
        next[writer] += 1;
    }
    assert_eq!(next, [RECORDS_EACH; WRITERS], "records per writer");
}
