//! The metaserver killed with `kill -9` in the middle of a burst of namespace operations: a lone
//! one, and the leader of three replicas again and again.

use super::*;

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
// 2. The metaserver leader of a replicated namespace killed again and again.

/// The id of the replica that leads, as `cairn meta status` reports it.
/// Seeds of the files the shared client makes (apart from the bursts' seeds).
const SHARED_SEED: u64 = 1 << 40;

/// The shared client's files made (name, number) and creates failed (name, number, error).
type SharedFiles = (Vec<(String, u64)>, Vec<(String, u64, String)>);

/// Create `s1`, `s2`, ... in `dir` until `progress.stop`: another client's files in a directory
/// a burst changes too. The names made (with their number) and those whose create failed.
fn shared_creates(dir: PathBuf, progress: Arc<Progress>) -> SharedFiles {
    let (mut made, mut failed) = (Vec::new(), Vec::new());
    let mut n = 0;
    while !progress.stop.load(Ordering::SeqCst) {
        n += 1;
        let name = format!("s{n}");
        match create_file(&dir.join(&name), &burst_content(SHARED_SEED + n)) {
            Ok(()) => {
                made.push((name, n));
                progress.ok.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                failed.push((name, n, e.to_string()));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    (made, failed)
}

/// Take the shared client's files out of what a walk found, and check them: each made is
/// there with its bytes; any other is one whose create failed, with its bytes or empty.
fn check_shared(
    found: &mut BTreeMap<String, Found>,
    made: &[(String, u64)],
    failed: &[(String, u64, String)],
) -> Vec<String> {
    let shared: Vec<String> =
        found.keys().filter(|k| k.starts_with('s') && !k.contains('/')).cloned().collect();
    let mut seen: BTreeMap<String, Found> =
        shared.into_iter().map(|k| (k.clone(), found.remove(&k).unwrap())).collect();
    let content = |n: u64| {
        let data = burst_content(SHARED_SEED + n);
        Found::File { len: data.len() as u64, sha: sha256(&data) }
    };
    let mut problems = Vec::new();
    for (name, n) in made {
        match seen.remove(name) {
            Some(f) if f == content(*n) => {}
            other => problems.push(format!("the shared client's file {name}: found {other:?}")),
        }
    }
    let empty = Found::File { len: 0, sha: sha256(&[]) };
    for (name, f) in seen {
        match failed.iter().find(|(failed, _, _)| *failed == name) {
            Some((_, n, _)) if f == content(*n) || f == empty => {}
            other => {
                problems.push(format!("unexpected shared entry {name}: {f:?} (failed create: {other:?})"))
            }
        }
    }
    problems
}

fn leader_id(cluster: &Cluster) -> Option<u64> {
    let out = cluster.cli(&["meta", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    status["leader"].as_u64()
}

/// Bursts of creates, renames, unlinks and mkdirs from two mounts while the metaserver leader
/// of three replicas is killed with `kill -9` four times (each time started again a moment
/// later, as a supervisor would); a third client creates through the second mount in the
/// first burst's root directory, so two mounts change one directory throughout. The mounts
/// ride through every failover: no operation fails and none takes longer than the wait for a
/// new leader. Afterwards every acknowledged change is there exactly once on both mounts and on
/// a fresh one, and `cairn fsck` is clean.
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
    // A third client, through the second mount, creates in the first burst's root directory
    // too: two mounts change one directory (their changes commit together through the leader
    // overlay) while leaders are killed.
    let shared_progress = Arc::new(Progress::default());
    let shared = {
        let (dir, progress) = (second.dir.join("burst"), shared_progress.clone());
        std::thread::spawn(move || shared_creates(dir, progress))
    };
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
    for p in progress.iter().chain([&shared_progress]) {
        p.stop.store(true, Ordering::SeqCst);
    }
    let results: Vec<(Expected, Vec<Record>)> =
        workers.into_iter().map(|w| w.join().expect("burst")).collect();
    let (shared_made, shared_failed) = shared.join().expect("shared client");
    println!("shared client: {} files made, {} creates failed", shared_made.len(), shared_failed.len());

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
            let (mut found, walk_problems) = walk(&root);
            problems.extend(walk_problems.into_iter().map(|p| format!("burst {i}, {label} mount: {p}")));
            if i == 0 {
                let shared = check_shared(&mut found, &shared_made, &shared_failed);
                problems.extend(shared.into_iter().map(|p| format!("{label} mount: {p}")));
            }
            problems
                .extend(compare(exp, &found).into_iter().map(|p| format!("burst {i}, {label} mount: {p}")));
        }
    }
    if !shared_failed.is_empty() {
        problems.push(format!("the shared client's creates failed across failovers: {shared_failed:?}"));
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
