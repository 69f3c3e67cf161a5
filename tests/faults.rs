//! Fault tests on real processes: the metaserver killed with `kill -9` in the middle of a burst
//! of namespace operations, chunkservers frozen with SIGSTOP (a partition: their connections
//! stay open and nothing answers) while clients read and write, and a chunkserver whose disk
//! fills up while the rest of the cluster has room.
//!
//! Every wait polls with a deadline. Bounds on single operations are there to tell "slow" from
//! "hung", not to measure speed.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{eventually, kill9, random_bytes, restart_server, sha256, Cluster, KillOnDrop, Mount, Rng};

fn status(cluster: &Cluster) -> serde_json::Value {
    let out = cluster.cli(&["status", "--json"]);
    // 0 OK, 2 WARN, 3 ERR: a status was read (1 would be a failure to ask).
    assert!(
        matches!(out.status.code(), Some(0 | 2 | 3)),
        "cairn status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status json")
}

/// Create `path` (a fresh name), write `data`, fsync and close, each checked: only then is the
/// file acknowledged (a plain `drop` would ignore an error of the close).
fn create_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(data)?;
    f.sync_all()?;
    let fd = f.into_raw_fd();
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 1. The metaserver killed in the middle of a burst of namespace operations.

/// The content of the file created with `seed`: 0 to ~190 KiB, so files cross 64 KiB units.
fn burst_content(seed: u64) -> Vec<u8> {
    let len = Rng(seed ^ 0xF11E).below(3 * 65_536) as usize;
    random_bytes(len, seed)
}

/// A failed operation whose effect is unknown (it may have been applied before the metaserver
/// died, or the reply was lost): at most one of `paths` exists (exactly one unless
/// `may_be_absent`), holding the content of `seed` (or nothing, if `may_be_empty`).
#[derive(Debug)]
struct Maybe {
    op: String,
    paths: Vec<String>,
    seed: u64,
    may_be_absent: bool,
    may_be_empty: bool,
}

/// What the burst knows of the namespace under its root, from the operations that returned Ok.
/// Names are never reused, so an acknowledged removal stays a removal.
#[derive(Default, Debug)]
struct Expected {
    /// Directories whose mkdir returned Ok ("" is the burst's root).
    dirs: BTreeSet<String>,
    /// Files whose create (write, fsync, close) returned Ok and that are still there: path → seed.
    files: BTreeMap<String, u64>,
    /// Paths that an acknowledged unlink or rename removed.
    gone: BTreeSet<String>,
    /// Directories whose mkdir failed: they may exist (empty, nothing is put in them).
    maybe_dirs: BTreeSet<String>,
    maybe: Vec<Maybe>,
}

/// One operation of the burst, as the application saw it.
struct Record {
    what: String,
    started: Instant,
    took: Duration,
    errno: Option<i32>,
}

impl Record {
    fn describe(&self, t0: Instant) -> String {
        let outcome = match self.errno {
            None => "ok".to_string(),
            Some(e) => format!("errno {e} ({})", std::io::Error::from_raw_os_error(e)),
        };
        format!(
            "t={:>6} ms {:<40} {outcome} in {} ms",
            (self.started - t0).as_millis(),
            self.what,
            self.took.as_millis()
        )
    }
}

/// Counters the main thread watches while the burst runs.
#[derive(Default)]
struct Progress {
    ok: AtomicUsize,
    failed: AtomicUsize,
    stop: AtomicBool,
}

/// Run seeded creates, renames, unlinks and mkdirs under `root` until `progress.stop`.
fn burst(root: PathBuf, seed: u64, progress: Arc<Progress>) -> (Expected, Vec<Record>) {
    let mut rng = Rng(seed);
    let mut exp = Expected::default();
    exp.dirs.insert(String::new());
    let mut records = Vec::new();
    let mut next = 0u64;
    let abs = |rel: &str| if rel.is_empty() { root.clone() } else { root.join(rel) };
    let join =
        |dir: &str, name: &str| if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
    while !progress.stop.load(Ordering::SeqCst) {
        next += 1;
        let roll = rng.below(100);
        let started = Instant::now();
        let (what, result): (String, std::io::Result<()>) = if roll < 15 && exp.dirs.len() < 24 {
            let parent = rng.pick_from(exp.dirs.iter()).clone();
            let path = join(&parent, &format!("d{next}"));
            let result = fs::create_dir(abs(&path));
            match &result {
                Ok(()) => {
                    exp.dirs.insert(path.clone());
                }
                Err(_) => {
                    exp.maybe_dirs.insert(path.clone());
                }
            }
            (format!("mkdir {path}"), result)
        } else if roll < 60 || exp.files.is_empty() {
            let dir = rng.pick_from(exp.dirs.iter()).clone();
            let path = join(&dir, &format!("f{next}"));
            let result = create_file(&abs(&path), &burst_content(next));
            match &result {
                Ok(()) => {
                    exp.files.insert(path.clone(), next);
                }
                Err(_) => exp.maybe.push(Maybe {
                    op: format!("create {path}"),
                    paths: vec![path.clone()],
                    seed: next,
                    may_be_absent: true,
                    may_be_empty: true,
                }),
            }
            (format!("create {path}"), result)
        } else if roll < 85 {
            let (from, seed) = {
                let (p, s) = rng.pick_from(exp.files.iter());
                (p.clone(), *s)
            };
            let dir = rng.pick_from(exp.dirs.iter()).clone();
            let to = join(&dir, &format!("r{next}"));
            let result = fs::rename(abs(&from), abs(&to));
            exp.files.remove(&from);
            match &result {
                Ok(()) => {
                    exp.gone.insert(from.clone());
                    exp.files.insert(to.clone(), seed);
                }
                Err(_) => exp.maybe.push(Maybe {
                    op: format!("rename {from} {to}"),
                    paths: vec![from.clone(), to.clone()],
                    seed,
                    may_be_absent: false,
                    may_be_empty: false,
                }),
            }
            (format!("rename {from} -> {to}"), result)
        } else {
            let (path, seed) = {
                let (p, s) = rng.pick_from(exp.files.iter());
                (p.clone(), *s)
            };
            let result = fs::remove_file(abs(&path));
            exp.files.remove(&path);
            match &result {
                Ok(()) => {
                    exp.gone.insert(path.clone());
                }
                Err(_) => exp.maybe.push(Maybe {
                    op: format!("unlink {path}"),
                    paths: vec![path.clone()],
                    seed,
                    may_be_absent: true,
                    may_be_empty: false,
                }),
            }
            (format!("unlink {path}"), result)
        };
        let took = started.elapsed();
        let errno = result.err().map(|e| e.raw_os_error().unwrap_or(-1));
        if errno.is_some() {
            progress.failed.fetch_add(1, Ordering::SeqCst);
            // While the metaserver is away, do not spin through thousands of failures.
            std::thread::sleep(Duration::from_millis(20));
        } else {
            progress.ok.fetch_add(1, Ordering::SeqCst);
        }
        records.push(Record { what, started, took, errno });
    }
    (exp, records)
}

/// What a walk found at a path.
#[derive(Debug, PartialEq)]
enum Found {
    Dir,
    File { len: u64, sha: String },
    Other,
}

/// Walk the tree under `root`: list every directory, stat every entry, read every file, and
/// check each directory's link count (2 + subdirectories). Problems are collected, not panicked
/// on, so one run reports them all.
fn walk(root: &Path) -> (BTreeMap<String, Found>, Vec<String>) {
    fn visit(root: &Path, rel: &str, out: &mut BTreeMap<String, Found>, problems: &mut Vec<String>) {
        let dir = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
        let entries = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => return problems.push(format!("readdir {rel:?}: {e}")),
        };
        let mut subdirs = 0u64;
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    problems.push(format!("readdir {rel:?}: entry: {e}"));
                    continue;
                }
            };
            let name = entry.file_name().to_string_lossy().to_string();
            let path = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            // A dangling entry (a dentry whose inode is gone) fails here.
            let md = match fs::symlink_metadata(entry.path()) {
                Ok(md) => md,
                Err(e) => {
                    problems.push(format!("stat {path}: {e}"));
                    continue;
                }
            };
            if md.is_dir() {
                subdirs += 1;
                out.insert(path.clone(), Found::Dir);
                visit(root, &path, out, problems);
            } else if md.is_file() {
                match fs::read(entry.path()) {
                    Ok(data) => {
                        if data.len() as u64 != md.len() {
                            problems.push(format!(
                                "{path}: stat says {} bytes, read {}",
                                md.len(),
                                data.len()
                            ));
                        }
                        if md.nlink() != 1 {
                            problems.push(format!("{path}: nlink {} (no hard links are made)", md.nlink()));
                        }
                        out.insert(path, Found::File { len: data.len() as u64, sha: sha256(&data) });
                    }
                    Err(e) => problems.push(format!("read {path}: {e}")),
                }
            } else {
                out.insert(path, Found::Other);
            }
        }
        match fs::metadata(&dir) {
            Ok(md) if md.nlink() != 2 + subdirs => {
                problems.push(format!("dir {rel:?}: nlink {} but {subdirs} subdirectories", md.nlink()))
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("stat dir {rel:?}: {e}")),
        }
    }
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    visit(root, "", &mut out, &mut problems);
    (out, problems)
}

/// Compare a walk with what the burst knows; return the disagreements.
fn compare(exp: &Expected, found: &BTreeMap<String, Found>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut accounted = BTreeSet::new();
    for dir in exp.dirs.iter().filter(|d| !d.is_empty()) {
        accounted.insert(dir.clone());
        if found.get(dir) != Some(&Found::Dir) {
            problems.push(format!("acknowledged mkdir {dir}: found {:?}", found.get(dir)));
        }
    }
    for dir in &exp.maybe_dirs {
        accounted.insert(dir.clone());
        if let Some(f) = found.get(dir).filter(|f| **f != Found::Dir) {
            problems.push(format!("failed mkdir {dir}: found {f:?}"));
        }
    }
    let content = |seed: u64| {
        let data = burst_content(seed);
        Found::File { len: data.len() as u64, sha: sha256(&data) }
    };
    for (path, seed) in &exp.files {
        accounted.insert(path.clone());
        match found.get(path) {
            Some(f) if *f == content(*seed) => {}
            other => problems.push(format!("acknowledged file {path} (seed {seed}): found {other:?}")),
        }
    }
    for path in &exp.gone {
        if let Some(f) = found.get(path) {
            problems.push(format!("{path} was removed (acknowledged) but is there: {f:?}"));
        }
    }
    let empty = Found::File { len: 0, sha: sha256(&[]) };
    for m in &exp.maybe {
        let present: Vec<&String> = m.paths.iter().filter(|p| found.contains_key(*p)).collect();
        accounted.extend(m.paths.iter().cloned());
        if present.len() > 1 || (present.is_empty() && !m.may_be_absent) {
            problems.push(format!("failed {}: present {present:?}", m.op));
        }
        for p in present {
            let f = &found[p];
            if *f != content(m.seed) && !(m.may_be_empty && *f == empty) {
                problems.push(format!("failed {}: {p} holds {f:?}, neither the data nor empty", m.op));
            }
        }
    }
    for (path, f) in found {
        if !accounted.contains(path) {
            problems.push(format!("unexpected entry {path}: {f:?}"));
        }
    }
    problems
}

/// A seeded burst of creates (write + fsync + close), renames, unlinks and mkdirs runs on the
/// mount while the metaserver is killed with `kill -9` and started again, three times (`cairn
/// up` does not restart it; the test does, as an operator would). Operations during an
/// outage fail with an error (none hangs), the burst then goes on, and afterwards: every
/// acknowledged create that was not later renamed or unlinked is there with its bytes, every
/// acknowledged unlink and rename is reflected, each failed operation either happened
/// completely or not at all, and a full walk (readdir, stat and read of every entry, through the
/// live mount and a fresh one) finds no error, no dangling or unknown entry, and directory link
/// counts of 2 + subdirectories.
#[test]
fn metaserver_killed_mid_burst_keeps_a_consistent_namespace() {
    let seed: u64 = std::env::var("CAIRN_FAULTS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xFA_0175);
    println!("seed {seed} (CAIRN_FAULTS_SEED)");
    // Declared before the cluster so it is dropped after it: a restarted metaserver outlives
    // the mount's shutdown.
    let mut meta = KillOnDrop(None);
    let cluster = Cluster::start(6, "4+2", 64);
    let root = cluster.mnt.join("burst");
    fs::create_dir(&root).unwrap();
    let progress = Arc::new(Progress::default());
    let t0 = Instant::now();
    let worker = {
        let (root, progress) = (root.clone(), progress.clone());
        std::thread::spawn(move || burst(root, seed, progress))
    };

    // Three outages, each after a seeded number of acknowledged operations, so the kill lands
    // in different phases of different operations.
    let mut timing = Rng(seed ^ 0xDEAD);
    let mut outages = Vec::new();
    for round in 0..3 {
        let ok_before = progress.ok.load(Ordering::SeqCst);
        let wanted = ok_before + 30 + timing.below(60) as usize;
        eventually(120, &format!("the burst acknowledged {wanted} operations (round {round})"), || {
            progress.ok.load(Ordering::SeqCst) >= wanted
        });
        let killed_at = Instant::now();
        match meta.0.take() {
            None => kill9(cluster.pid_of("meta")),
            Some(mut child) => {
                kill9(child.id());
                let _ = child.wait();
            }
        }
        let failed_before = progress.failed.load(Ordering::SeqCst);
        eventually(60, "operations fail (not hang) while the metaserver is down", || {
            progress.failed.load(Ordering::SeqCst) >= failed_before + 20
        });
        let restarted_at = Instant::now();
        meta.0 = Some(restart_server(&cluster, "meta", "meta"));
        outages.push((killed_at, restarted_at));
    }
    let ok_at_restart = progress.ok.load(Ordering::SeqCst);
    eventually(120, "the burst acknowledged 60 more operations after the last restart", || {
        progress.ok.load(Ordering::SeqCst) >= ok_at_restart + 60
    });
    progress.stop.store(true, Ordering::SeqCst);
    eventually(60, "the burst stopped", || worker.is_finished());
    let (exp, records) = worker.join().expect("burst thread");

    let failures: Vec<&Record> = records.iter().filter(|r| r.errno.is_some()).collect();
    let mut errnos = BTreeMap::new();
    for r in &failures {
        *errnos.entry(r.errno.unwrap()).or_insert(0) += 1;
    }
    let slowest = records.iter().max_by_key(|r| r.took).expect("records");
    let outage_times: Vec<String> = outages
        .iter()
        .map(|(k, r)| format!("{}..{} ms", (*k - t0).as_millis(), (*r - t0).as_millis()))
        .collect();
    println!(
        "{} operations, {} failed (errno: count {errnos:?}); metaserver down {outage_times:?}; slowest: {}",
        records.len(),
        failures.len(),
        slowest.describe(t0)
    );
    for r in failures.iter().take(6) {
        println!("  failed: {}", r.describe(t0));
    }
    let history = || records.iter().rev().take(30).map(|r| r.describe(t0)).collect::<Vec<_>>().join("\n");
    // Before the kill everything worked; once the metaserver is back, everything works again.
    let first_kill = outages[0].0;
    let early: Vec<String> =
        failures.iter().filter(|r| r.started + r.took < first_kill).map(|r| r.describe(t0)).collect();
    assert!(early.is_empty(), "operations failed before the metaserver was killed:\n{}", early.join("\n"));
    let tail = &records[records.len() - 20..];
    assert!(
        tail.iter().all(|r| r.errno.is_none()),
        "operations still fail long after the metaserver came back:\n{}",
        history()
    );
    // An outage is an error, not a hang: 30 s is the client's RPC timeout.
    assert!(slowest.took < Duration::from_secs(45), "an operation hung: {}", slowest.describe(t0));

    let (found, mut problems) = walk(&root);
    problems.extend(compare(&exp, &found));
    // A fresh client (no kernel or client caches) sees the same tree.
    let fresh = Mount::new(&cluster, "fresh");
    let (found_fresh, fresh_problems) = walk(&fresh.dir.join("burst"));
    problems.extend(fresh_problems.into_iter().map(|p| format!("fresh mount: {p}")));
    if found_fresh != found {
        problems.push("the fresh mount walks a different tree than the live one".into());
    }
    // fsck agrees: no namespace problem (dangling entries, unreachable inodes, link counts,
    // statistics), every stripe healthy, nothing unreferenced.
    let out = cluster.cli(&["fsck", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if out.status.code() != Some(0)
        || report["namespace"]["problems"].as_array().is_none_or(|p| !p.is_empty())
        || report["healthy"] != report["stripes"]
        || report["unreferenced_shards"]["stale"] != 0
    {
        problems.push(format!("cairn fsck is not clean ({:?}): {report}", out.status.code()));
    }
    assert!(
        problems.is_empty(),
        "seed {seed}: namespace inconsistent after the metaserver restart:\n{}\nlast operations:\n{}",
        problems.join("\n"),
        history()
    );
    println!(
        "checked {} dirs, {} files, {} removals, {} unknown outcomes",
        exp.dirs.len(),
        exp.files.len(),
        exp.gone.len(),
        exp.maybe.len() + exp.maybe_dirs.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Chunkservers frozen with SIGSTOP.

/// Processes stopped with SIGSTOP, continued with SIGCONT when dropped (so a failing test does
/// not leave stopped processes behind).
struct Frozen(Vec<u32>);

impl Frozen {
    fn stop(pids: &[u32]) -> Frozen {
        for &pid in pids {
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        }
        Frozen(pids.to_vec())
    }

    fn thaw(&mut self) {
        for pid in self.0.drain(..) {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// Chunkserver numbers (the `N` of `data/chunk-N`) ordered by how many data shards (index
/// below `k`) each holds, most first.
fn chunks_by_data_shards(cluster: &Cluster, chunkservers: usize, k: u32) -> Vec<usize> {
    let shards = cluster.shard_files();
    let mut counts: Vec<(usize, usize)> = (1..=chunkservers)
        .map(|n| {
            let prefix = cluster.data.join(format!("chunk-{n}"));
            let count = shards
                .iter()
                .filter(|p| p.starts_with(&prefix))
                .filter(|p| {
                    let name = p.file_name().unwrap().to_string_lossy().to_string();
                    name.split('-').nth(2).and_then(|i| i.parse::<u32>().ok()).is_some_and(|i| i < k)
                })
                .count();
            (n, count)
        })
        .collect();
    counts.sort_by_key(|&(n, count)| (std::cmp::Reverse(count), n));
    counts.into_iter().map(|(n, _)| n).collect()
}

/// Bound on one read with m chunkservers frozen: a client that waits out one request timeout
/// on a frozen node and then goes around it stays well under it. (At f976da4 the client waited
/// 30 s on the frozen node, then again while reconstructing: 60 s per stripe, 120 s for a file
/// of two stripes, even after the metaserver reported the node down.)
const FROZEN_READ_BOUND: Duration = Duration::from_secs(30);

/// Two chunkservers (m = 2 of 8, EC 4+2) are frozen with SIGSTOP: their sockets accept and
/// nothing answers, as in a network partition. The two stopped are the ones holding the most
/// data shards, so reads must go around them. Meanwhile a fresh client reads every file written
/// before (each read right and within a bound) and, once the metaserver reports the two nodes
/// down (after its 10 s node timeout), new files are written (placement avoids the down nodes,
/// so every write succeeds). After SIGCONT the two report up again and every file, old and new,
/// reads back byte-exact through another fresh client.
#[test]
fn stopped_chunkserver_is_survived_and_rejoins() {
    const CHUNKSERVERS: usize = 8;
    let cluster = Cluster::start(CHUNKSERVERS as u32, "4+2", 256);
    let sizes = [1usize, 100_000, 262_144, 1_048_577, 700_000, 500_000];
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let data = random_bytes(*size, 7_000 + i as u64);
        let name = format!("old{i}");
        create_file(&cluster.mnt.join(&name), &data).unwrap();
        files.push((PathBuf::from(name), sha256(&data)));
    }
    // A client with no cache of those files, so its reads reach the chunkservers.
    let reader = Mount::new(&cluster, "reader");
    let victims: Vec<_> = chunks_by_data_shards(&cluster, CHUNKSERVERS, 4)[..2].to_vec();
    let pids: Vec<u32> = victims.iter().map(|&n| cluster.chunk_node(n).pid).collect();
    println!("freezing chunk-{} and chunk-{} (pids {pids:?})", victims[0], victims[1]);
    let t0 = Instant::now();
    let mut frozen = Frozen::stop(&pids);

    // One reader thread per file, all at once, as a training job's loaders would.
    let reads: Vec<_> = files
        .iter()
        .map(|(name, hash)| {
            let (path, name, hash) = (reader.dir.join(name), name.clone(), hash.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                let result = fs::read(path).map(|d| sha256(&d));
                (name, hash, started.elapsed(), result)
            })
        })
        .collect();

    // Writes: once the metaserver reports both frozen nodes down, new files avoid them.
    let frozen_down = |st: &serde_json::Value| {
        let nodes = st["nodes"].as_array().expect("nodes");
        pids.iter().all(|pid| nodes.iter().any(|n| n["pid"] == *pid && n["up"] == false))
    };
    eventually(60, "the metaserver reports the frozen chunkservers down", || frozen_down(&status(&cluster)));
    println!("frozen nodes reported down after {} ms", t0.elapsed().as_millis());
    for i in 0..8usize {
        let data = random_bytes(300_000 * i + 1, 7_100 + i as u64);
        let name = format!("new{i}");
        let started = Instant::now();
        create_file(&cluster.mnt.join(&name), &data)
            .unwrap_or_else(|e| panic!("writing {name} with two chunkservers frozen: {e}"));
        println!("wrote {name} ({} bytes) in {} ms", data.len(), started.elapsed().as_millis());
        files.push((PathBuf::from(name), sha256(&data)));
    }

    eventually(FROZEN_READ_BOUND.as_secs() + 30, "the reads finished", || {
        reads.iter().all(|r| r.is_finished())
    });
    for (name, hash, took, result) in reads.into_iter().map(|r| r.join().expect("reader thread")) {
        println!("read {} with two chunkservers frozen in {} ms", name.display(), took.as_millis());
        let got =
            result.unwrap_or_else(|e| panic!("reading {} with two chunkservers frozen: {e}", name.display()));
        assert_eq!(got, hash, "{} read wrong bytes", name.display());
        assert!(took < FROZEN_READ_BOUND, "reading {} took {} ms", name.display(), took.as_millis());
    }

    frozen.thaw();
    eventually(60, "the thawed chunkservers report up again", || {
        let st = status(&cluster);
        st["nodes_down"] == 0 && st["nodes_up"] == CHUNKSERVERS
    });
    let check = Mount::new(&cluster, "check");
    for (name, hash) in &files {
        let data = fs::read(check.dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", name.display()));
        assert_eq!(&sha256(&data), hash, "{} after the thaw", name.display());
    }
}

// ---------------------------------------------------------------------------------------------
// 3. One chunkserver on a small disk that fills up.

/// A loop-mounted filesystem, unmounted and detached when dropped (after the cluster, which
/// is declared later and so dropped first); it then removes what is left of the test's root.
struct LoopFs {
    dev: String,
    mountpoint: PathBuf,
    image: PathBuf,
    root: PathBuf,
    mounted: bool,
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = fs::remove_file(&self.image);
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn run_quiet(cmd: &mut Command) -> Result<String, String> {
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Ok(out) => Err(format!("{cmd:?}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => Err(format!("{cmd:?}: {e}")),
    }
}

/// Bytes available to unprivileged writers on the filesystem holding `path` (what `df` shows).
fn available(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.to_str().expect("utf8")).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    st.f_bavail as u64 * st.f_frsize as u64
}

/// The chunkservers' default `reserve_bytes`: a chunkserver never fills its disk past this.
const RESERVE: u64 = 64 << 20;
/// Room for shards left on the small disk above the reserve: twice what the metaserver keeps
/// free on a node before it counts it as full (`FULL_BELOW_BYTES`, 16 MiB), so the node takes
/// shards first and then stops.
const SMALL_ROOM: u64 = 32 << 20;
/// The metaserver's `FULL_BELOW_BYTES`.
const FULL_BELOW: u64 = 16 << 20;

/// Chunkserver 3 of 7 (EC 4+2, 1 MiB units) keeps its shards on a small loop-mounted ext4
/// with room for 32 MiB of shards; 40 files of 3 MiB would put ~29 MiB on it, more than it
/// may take before the metaserver counts it full (16 MiB left), while the other six have
/// plenty. Every write succeeds (the cluster as a whole has room), every file reads back
/// byte-exact (also through a fresh client), and the small disk is filled to the threshold.
#[test]
fn chunkserver_on_a_full_small_disk_does_not_fail_the_cluster() {
    const SMALL: usize = 3;
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if run_quiet(Command::new(tool).arg("-V")).is_err() {
            println!("skipped: {tool} is not available");
            return;
        }
    }
    let root = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/tmp").unwrap();
    let mountpoint = root.path().join(format!("data/chunk-{SMALL}"));
    fs::create_dir_all(&mountpoint).unwrap();
    let image = root.path().join("small-disk.img");
    let made = run_quiet(Command::new("truncate").args(["-s", "192M"]).arg(&image))
        .and_then(|_| run_quiet(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image)));
    if let Err(e) = made {
        println!("skipped: cannot make an ext4 image: {e}");
        return;
    }
    let dev = match run_quiet(Command::new("losetup").args(["--find", "--show"]).arg(&image)) {
        Ok(dev) => dev,
        Err(e) => {
            println!("skipped: no loop device: {e}");
            return;
        }
    };
    let mut guard = LoopFs {
        dev,
        mountpoint: mountpoint.clone(),
        image,
        root: root.path().to_path_buf(),
        mounted: false,
    };
    if let Err(e) = run_quiet(Command::new("mount").arg(&guard.dev).arg(&mountpoint)) {
        println!("skipped: cannot mount a loop device: {e}");
        return;
    }
    guard.mounted = true;
    // Ballast, so exactly SMALL_ROOM is left above the chunkserver's reserve.
    let ballast = available(&mountpoint) - RESERVE - SMALL_ROOM;
    let f = fs::File::create(mountpoint.join("ballast")).unwrap();
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, ballast as libc::off_t) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    f.sync_all().unwrap();
    drop(f);
    let room = available(&mountpoint) - RESERVE;
    println!("small disk {}: {} MiB above the reserve", guard.dev, room >> 20);

    let cluster = Cluster::start_prepared(root, 7, "4+2", 1024, &[]);
    let mut files = Vec::new();
    let mut failures = Vec::new();
    for i in 0..40usize {
        let data = random_bytes(3 << 20, 9_000 + i as u64);
        let path = cluster.mnt.join(format!("f{i:02}"));
        match create_file(&path, &data) {
            Ok(()) => files.push((path, sha256(&data))),
            Err(e) => failures.push(format!(
                "file {i} ({} written before it, small disk {} KiB above the reserve): errno {:?}: {e}",
                files.len(),
                available(&mountpoint).saturating_sub(RESERVE) >> 10,
                e.raw_os_error()
            )),
        }
    }
    let left = available(&mountpoint).saturating_sub(RESERVE);
    let shards_on_small = cluster.shard_files().iter().filter(|p| p.starts_with(&mountpoint)).count();
    let st = status(&cluster);
    println!(
        "{} of 40 files written; small disk: {shards_on_small} shards, {} KiB left above the reserve; \
         degraded stripes {}",
        files.len(),
        left >> 10,
        st["repair"]["degraded_stripes"]
    );
    assert!(failures.is_empty(), "writes failed while the cluster had room:\n{}", failures.join("\n"));
    for (path, hash) in &files {
        let data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(&sha256(&data), hash, "{}", path.display());
    }
    // The small disk took shards until the metaserver counted it full (a heartbeat may report
    // the last ones late, so it can end a few shards below the threshold, never above it by
    // more than the shards then in flight).
    assert!(shards_on_small >= 8, "only {shards_on_small} shards landed on the small disk");
    assert!(
        left < FULL_BELOW + (3 << 20),
        "the small disk still has {} KiB of {} KiB",
        left >> 10,
        room >> 10
    );
    // A fresh client (no caches) reads every file right too. (Reads check the data shards on
    // the small disk; a parity shard there is only checked by a verify pass, `cairn fsck`.)
    let fresh = Mount::new(&cluster, "fresh");
    for (path, hash) in &files {
        let data = fs::read(fresh.dir.join(path.file_name().unwrap())).unwrap();
        assert_eq!(&sha256(&data), hash, "{} through a fresh client", path.display());
    }
    drop(fresh);
    drop(cluster);
    drop(guard);
}

/// A writer-and-checker runs on the mount (each file written, fsynced and closed, then a
/// random earlier one read back and compared), while two chunkservers (m) are killed with
/// `kill -9`, the workload goes on, and they are started again. Reads never fail; every write
/// acknowledged by `close` is there afterwards byte for byte; the stripes written while the
/// nodes were down are healed once they are back, and `cairn fsck` ends clean. (A write may
/// fail in the first seconds after the kill, while the dead nodes still get new files; it is
/// then not acknowledged, and counted; the mount waits 5 s for chunkservers, not the default
/// minute, so such a write fails soon.)
#[test]
fn chunkservers_killed_and_revived_under_a_write_verify_workload() {
    let mut revived = (KillOnDrop(None), KillOnDrop(None));
    let cluster = Cluster::start_with(Path::new("/tmp"), 7, "4+2", 64, &["--write-wait-ms", "5000"]);
    let dir = cluster.mnt.join("load");
    fs::create_dir(&dir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(std::sync::Mutex::new(Vec::<(PathBuf, String)>::new()));
    let failed_writes = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (stop, written, failed_writes, dir) =
            (stop.clone(), written.clone(), failed_writes.clone(), dir.clone());
        std::thread::spawn(move || -> Result<usize, String> {
            let mut reads = 0;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let size = (i as usize * 7_919 * 13) % 700_000 + 1;
                let data = random_bytes(size, 7_000 + i);
                let path = dir.join(format!("w{i:05}"));
                let ok = (|| -> std::io::Result<()> {
                    let mut f = fs::File::create(&path)?;
                    f.write_all(&data)?;
                    f.sync_all()?;
                    let fd = f.into_raw_fd();
                    // close(2) itself must succeed for the write to count as acknowledged.
                    if unsafe { libc::close(fd) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })();
                match ok {
                    Ok(()) => written.lock().unwrap().push((path, sha256(&data))),
                    Err(e) => {
                        if failed_writes.fetch_add(1, Ordering::Relaxed) < 3 {
                            println!("write {} failed: {e}", path.display());
                        }
                    }
                }
                let pick = {
                    let w = written.lock().unwrap();
                    (!w.is_empty()).then(|| w[(i as usize * 31) % w.len()].clone())
                };
                if let Some((p, hash)) = pick {
                    let back = fs::read(&p).map_err(|e| format!("read {} failed: {e}", p.display()))?;
                    if sha256(&back) != hash {
                        return Err(format!("{} read back different bytes", p.display()));
                    }
                    reads += 1;
                }
            }
            Ok(reads)
        })
    };
    let acknowledged = || written.lock().unwrap().len();
    eventually(60, "the workload gets going", || acknowledged() >= 10);

    let (a, b) = (cluster.chunk_node(1), cluster.chunk_node(2));
    kill9(a.pid);
    kill9(b.pid);
    let at_kill = acknowledged();
    // Until the metaserver marks them down, and after.
    eventually(90, "the dead chunkservers are marked down", || {
        let out = cluster.cli(&["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).map(|s| s["nodes_up"] == 5).unwrap_or(false)
    });
    eventually(90, "writes go on with two chunkservers dead", || acknowledged() >= at_kill + 40);
    revived.0 .0 = Some(restart_server(&cluster, "chunk", "chunk-1"));
    revived.1 .0 = Some(restart_server(&cluster, "chunk", "chunk-2"));
    eventually(60, "the revived chunkservers are up", || {
        let out = cluster.cli(&["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).map(|s| s["nodes_up"] == 7).unwrap_or(false)
    });
    let at_revive = acknowledged();
    eventually(60, "writes go on after the revival", || acknowledged() >= at_revive + 10);
    stop.store(true, Ordering::Relaxed);
    let reads = worker.join().unwrap().unwrap_or_else(|e| panic!("workload: {e}"));
    let failed = failed_writes.load(Ordering::Relaxed);
    let files = written.lock().unwrap().clone();
    println!("{} files acknowledged, {failed} writes failed, {reads} reads checked", files.len());
    assert!(failed * 5 <= files.len(), "{failed} writes failed against {} acknowledged", files.len());

    // The stripes written while two nodes were dead are healed now that they are back; fsck
    // sees every stripe whole.
    let out = cluster.cli(&["scrub", "--all", "--json"]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&out.stdout));
    eventually(60, "fsck is clean", || {
        let out = cluster.cli(&["fsck", "--json"]);
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.code() == Some(0) && r["healthy"] == r["stripes"]
    });
    for (path, hash) in &files {
        let back = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(&sha256(&back), hash, "{}", path.display());
    }
}

// ---------------------------------------------------------------------------------------------
// 5. The metaserver leader of a replicated namespace killed again and again.

/// The id of the replica that leads, as `cairn meta status` reports it.
fn leader_id(cluster: &Cluster) -> Option<u64> {
    let out = cluster.cli(&["meta", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    status["leader"].as_u64()
}

/// Bursts of creates, renames, unlinks and mkdirs from two mounts while the metaserver leader
/// of three replicas is killed with `kill -9` four times (each time started again a moment
/// later, as a supervisor would). The mounts ride through every failover: no operation fails
/// and none takes longer than the wait for a new leader. Afterwards every acknowledged change
/// is there exactly once on both mounts and on a fresh one, and `cairn fsck` is clean.
#[test]
fn metaserver_leader_killed_again_and_again_mid_burst_loses_nothing() {
    let seed: u64 = std::env::var("CAIRN_FAULTS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xFA_0175);
    println!("seed {seed} (CAIRN_FAULTS_SEED)");
    let mut restarted: Vec<(KillOnDrop, u64)> = Vec::new();
    let cluster = Cluster::start_with(Path::new("/tmp"), 6, "4+2", 64, &["--meta-replicas", "3"]);
    let second = Mount::new(&cluster, "second");
    let roots = [cluster.mnt.join("burst"), second.dir.join("burst2")];
    let progress: Vec<Arc<Progress>> = roots.iter().map(|_| Arc::new(Progress::default())).collect();
    let t0 = Instant::now();
    let workers: Vec<_> = roots
        .iter()
        .zip(&progress)
        .enumerate()
        .map(|(i, (root, progress))| {
            fs::create_dir(root).unwrap();
            let (root, progress) = (root.clone(), progress.clone());
            std::thread::spawn(move || burst(root, seed + i as u64, progress))
        })
        .collect();
    let acked = || progress.iter().map(|p| p.ok.load(Ordering::SeqCst)).sum::<usize>();
    let mut timing = Rng(seed ^ 0x1EAD);
    let mut kills = Vec::new();
    for round in 0..4 {
        let wanted = acked() + 40 + timing.below(60) as usize;
        eventually(120, &format!("the bursts acknowledged {wanted} operations (round {round})"), || {
            acked() >= wanted
        });
        let mut leader = None;
        eventually(30, "a leader is known", || {
            leader = leader_id(&cluster);
            leader.is_some()
        });
        let id = leader.unwrap();
        let pid = match restarted.iter().position(|r| r.1 == id) {
            Some(i) => {
                let mut child = restarted.remove(i).0;
                child.0.take().expect("running").id()
            }
            None => {
                cluster
                    .nodes
                    .iter()
                    .find(|n| n.role == "meta" && n.id == id.to_string())
                    .expect("replica")
                    .pid
            }
        };
        kill9(pid);
        kills.push((Instant::now(), id));
        std::thread::sleep(Duration::from_millis(1000 + timing.below(1000)));
        restarted.push((KillOnDrop(Some(restart_server(&cluster, "meta", &format!("meta-{id}")))), id));
    }
    let at_last = acked();
    eventually(120, "the bursts acknowledged 60 more operations after the last kill", || {
        acked() >= at_last + 60
    });
    for p in &progress {
        p.stop.store(true, Ordering::SeqCst);
    }
    let results: Vec<(Expected, Vec<Record>)> =
        workers.into_iter().map(|w| w.join().expect("burst")).collect();

    let mut problems = Vec::new();
    let fresh = Mount::new(&cluster, "fresh");
    for (i, (exp, records)) in results.iter().enumerate() {
        let failures: Vec<String> =
            records.iter().filter(|r| r.errno.is_some()).map(|r| r.describe(t0)).collect();
        let slowest = records.iter().max_by_key(|r| r.took).expect("records");
        println!(
            "burst {i}: {} operations, {} failed, slowest {}",
            records.len(),
            failures.len(),
            slowest.describe(t0)
        );
        if !failures.is_empty() {
            problems.push(format!("burst {i}: operations failed across failovers:\n{}", failures.join("\n")));
        }
        if slowest.took > Duration::from_secs(15) {
            problems.push(format!("burst {i}: an operation waited too long: {}", slowest.describe(t0)));
        }
        let name = roots[i].file_name().unwrap().to_owned();
        for (label, root) in [
            ("live", roots[i].clone()),
            ("other", [&second.dir, &cluster.mnt][i].join(&name)),
            ("fresh", fresh.dir.join(&name)),
        ] {
            let (found, walk_problems) = walk(&root);
            problems.extend(walk_problems.into_iter().map(|p| format!("burst {i}, {label} mount: {p}")));
            problems
                .extend(compare(exp, &found).into_iter().map(|p| format!("burst {i}, {label} mount: {p}")));
        }
    }
    let out = cluster.cli(&["fsck", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if out.status.code() != Some(0)
        || report["namespace"]["problems"].as_array().is_none_or(|p| !p.is_empty())
        || report["healthy"] != report["stripes"]
    {
        problems.push(format!("cairn fsck is not clean ({:?}): {report}", out.status.code()));
    }
    let kills: Vec<String> =
        kills.iter().map(|(at, id)| format!("replica {id} at {} ms", (*at - t0).as_millis())).collect();
    println!("leaders killed: {kills:?}");
    assert!(problems.is_empty(), "seed {seed}:\n{}", problems.join("\n"));
}
