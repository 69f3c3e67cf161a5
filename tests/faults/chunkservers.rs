//! Chunkservers frozen with SIGSTOP, one on a small disk that fills up, and chunkservers killed
//! and revived under a write-verify workload.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1. Chunkservers frozen with SIGSTOP.

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
// 2. One chunkserver on a small disk that fills up.

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
