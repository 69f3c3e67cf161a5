//! Failure handling on real processes: chunkservers that die for good are replaced and their
//! shards rebuilt, after which `m` more can die with every byte still readable.

mod support;

use std::fs;
use std::time::{Duration, Instant};

use support::{cli_json, eventually, kill9, random_bytes, sha256, Cluster, Mount};

fn status(cluster: &Cluster) -> serde_json::Value {
    let out = cluster.cli(&["status", "--json"]);
    // 0 OK, 2 WARN, 3 ERR: a status was read (1 would be a failure to ask).
    assert!(matches!(out.status.code(), Some(0 | 2 | 3)), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn lost_chunkservers_are_rebuilt_then_m_more_can_fail() {
    // 8 chunkservers, 4+2 with 256 KiB units (1 MiB stripes); rebuild 2 s after a node is down.
    let cluster =
        Cluster::start_with(std::path::Path::new("/tmp"), 8, "4+2", 256, &["--rebuild-after-ms", "2000"]);
    let mut files = Vec::new();
    for i in 0..12usize {
        let size = [1, 100_000, 262_144, 1_048_577, 3_000_000][i % 5] + i * 7_919;
        let data = random_bytes(size, 500 + i as u64);
        let path = cluster.mnt.join(format!("f{i}"));
        fs::write(&path, &data).unwrap();
        files.push((path, sha256(&data)));
    }
    let pids = cluster.chunk_pids();
    kill9(pids[0]);
    kill9(pids[1]);
    // The repair notices, rebuilds every lost shard on the six survivors, and says so.
    eventually(180, "repair finished", || {
        let st = status(&cluster);
        let r = &st["repair"];
        st["nodes_down"] == 2 && r["shards_rebuilt"].as_u64().unwrap() > 0 && r["degraded_stripes"] == 0
    });
    let st = status(&cluster);
    assert_eq!(st["repair"]["unrecoverable_stripes"], 0, "{st}");
    // Rebuilt: every stripe can lose m more again; only the dead nodes are left to say.
    assert_eq!(st["repair"]["reduced_redundancy_bytes"], 0, "{st}");
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");
    assert_eq!(st["health_checks"].as_array().unwrap().len(), 1, "{st}");
    assert!(st["health_checks"][0].as_str().unwrap().starts_with("2 chunkservers down"), "{st}");
    for (path, hash) in &files {
        assert_eq!(&sha256(&fs::read(path).unwrap()), hash, "{}", path.display());
    }
    // Two more die: without the rebuild, stripes with shards on all four dead nodes would be
    // gone; with it, every stripe lost at most two shards.
    kill9(pids[2]);
    kill9(pids[3]);
    for (path, hash) in &files {
        let back = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(&sha256(&back), hash, "{}", path.display());
    }
}

#[test]
fn health_says_at_once_what_one_more_failure_would_lose() {
    // 6 chunkservers, 4+2 with 64 KiB units: every stripe has a shard on every node. The
    // rebuild waits the default 10 minutes, as on a real cluster.
    let cluster = Cluster::start(6, "4+2", 64);
    let meta_metrics = cluster.nodes.iter().find(|n| n.role == "meta").unwrap().metrics.clone().unwrap();
    let data = random_bytes(4 << 20, 900);
    fs::write(cluster.mnt.join("data"), &data).unwrap();
    let stripes = (4 << 20) / (4 * 64 * 1024);
    let health = |code: i32, word: &str| {
        let out = cluster.cli(&["status"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code() == Some(code) && text.starts_with(word), text)
    };
    // (The count of stripes at full redundancy is as of the last repair pass, which runs when
    // nodes come and go, not after every write: only the health word is checked here.)
    eventually(30, "HEALTH_OK", || {
        let (_, st) = cli_json(&cluster, &["status"]);
        st["health"] == "HEALTH_OK" && st["repair"]["reduced_redundancy_bytes"] == 0
    });
    assert!(health(0, "HEALTH_OK\n").0, "{}", health(0, "").1);

    let pids = cluster.chunk_pids();
    kill9(pids[0]);
    kill9(pids[1]);
    // As soon as the metaserver marks them down (node timeout 10 s) and a repair pass counted,
    // long before the rebuild starts.
    let mut st = serde_json::Value::Null;
    eventually(40, "lost redundancy shows", || {
        let (code, now) = cli_json(&cluster, &["status"]);
        st = now;
        code == 2
            && st["repair"]["stripes_by_margin"]["0"] == stripes
            && st["repair"]["reduced_stripes_by_margin"]["0"] == stripes
    });
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");
    assert_eq!(st["repair"]["reduced_redundancy_bytes"], 4 << 20, "{st}");
    let checks: Vec<&str> =
        st["health_checks"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert!(checks[0].starts_with("2 chunkservers down"), "{checks:?}");
    assert!(checks.contains(&format!("{stripes} stripes can lose 0 more shards").as_str()), "{checks:?}");
    assert!(
        checks
            .iter()
            .any(|c| c.starts_with("rebuild starts in 9m") || c.starts_with("rebuild starts in 10m")),
        "{checks:?}"
    );
    let down: Vec<&serde_json::Value> =
        st["nodes"].as_array().unwrap().iter().filter(|n| n["up"] == false).collect();
    assert_eq!(down.len(), 2);
    assert!(
        down.iter().all(|n| n["rebuild_in_ms"].as_u64().is_some_and(|ms| ms > 500_000 && ms <= 600_000)),
        "{st}"
    );
    let (ok, text) = health(2, "HEALTH_WARN: 2 chunkservers down");
    assert!(ok, "{text}");
    assert!(text.contains("down, rebuild in"), "{text}");
    // df and the metrics say the same.
    let (_, df) = cli_json(&cluster, &["df"]);
    assert_eq!(df["stripes_by_margin"]["0"], stripes, "{df}");
    eventually(20, "the metrics count the stripes that can lose 0 more", || {
        let text = support::scrape(&meta_metrics);
        support::metric(&text, "cairn_repair_stripes", &["can_lose=\"0\""]) == Some(stripes as f64)
            && support::metric(&text, "cairn_repair_reduced_stripes", &["can_lose=\"0\""])
                == Some(stripes as f64)
            && support::metric(&text, "cairn_health", &[]) == Some(1.0)
    });
    // Still readable (degraded).
    assert_eq!(sha256(&fs::read(cluster.mnt.join("data")).unwrap()), sha256(&data));

    // One more: every stripe has lost more than m.
    kill9(pids[2]);
    eventually(40, "unreadable stripes are an error", || {
        let (code, now) = cli_json(&cluster, &["status"]);
        st = now;
        code == 3 && st["repair"]["unrecoverable_stripes"] == stripes
    });
    assert!(
        st["health_checks"][0].as_str().unwrap().starts_with(&format!("{stripes} stripes unreadable")),
        "{st}"
    );
    let (ok, text) = health(3, "HEALTH_ERR: ");
    assert!(ok, "{text}");
}

/// SIGSTOPs processes and SIGCONTs them when dropped (also when a test fails), so the
/// cluster can stop.
struct Stopped(Vec<u32>);

impl Stopped {
    fn new(pids: &[u32]) -> Stopped {
        for &pid in pids {
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        }
        Stopped(pids.to_vec())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.0 {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
}

/// Write `data` to `path` in another thread: close's outcome and how long it all took.
fn write_in_background(
    path: std::path::PathBuf,
    data: Vec<u8>,
) -> std::thread::JoinHandle<(std::io::Result<()>, Duration)> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let result = support::write_and_close(&path, &data);
        (result, started.elapsed())
    })
}

#[test]
fn io_waits_out_stopped_chunkservers_up_to_write_wait_ms_then_fails_cleanly() {
    // The default mount waits up to a minute for chunkservers.
    let cluster = Cluster::start(6, "4+2", 64);
    let mount_metrics = cluster.nodes.iter().find(|n| n.role == "mount").unwrap().metrics.clone().unwrap();
    let before = random_bytes(3 << 20, 910);
    fs::write(cluster.mnt.join("before"), &before).unwrap();
    let pids = cluster.chunk_pids();

    // Two of six stop answering (a network blip, a stalled host): no stripe can be stored on
    // k+1 = 5. Without waiting the write fails within a request timeout (10 s); it waits, and
    // completes once they are back 15 s later.
    let data = random_bytes((4 << 20) + 12_345, 911);
    let stopped = Stopped::new(&pids[..2]);
    let writer = write_in_background(cluster.mnt.join("during"), data.clone());
    std::thread::sleep(Duration::from_secs(15));
    drop(stopped);
    let (result, took) = writer.join().unwrap();
    result.unwrap_or_else(|e| panic!("the write failed after {took:?}: {e}"));
    assert!(took >= Duration::from_secs(14), "{took:?}");
    assert_eq!(sha256(&fs::read(cluster.mnt.join("during")).unwrap()), sha256(&data));
    let text = support::scrape(&mount_metrics);
    assert!(
        support::metric(&text, "cairn_client_node_waits_total", &["op=\"write\""]).unwrap_or(0.0) >= 1.0,
        "{text}"
    );

    // Three stop: a fresh mount (nothing cached) cannot read k = 4 shards; the read waits and
    // succeeds once they are back.
    let reader = support::Mount::new(&cluster, "reader");
    let stopped = Stopped::new(&pids[..3]);
    let path = reader.dir.join("before");
    let read = std::thread::spawn(move || {
        let started = Instant::now();
        (fs::read(path), started.elapsed())
    });
    std::thread::sleep(Duration::from_secs(12));
    drop(stopped);
    let (back, took) = read.join().unwrap();
    let back = back.unwrap_or_else(|e| panic!("the read failed after {took:?}: {e}"));
    assert_eq!(sha256(&back), sha256(&before));
    assert!(took >= Duration::from_secs(11), "{took:?}");

    // Past the bound: a mount that waits 3 s fails the write with EIO (the README's error), and
    // nothing else is touched.
    let short = support::Mount::with_args(&cluster, "short", &["--write-wait-ms", "3000"]);
    let stopped = Stopped::new(&pids[..2]);
    let writer = write_in_background(short.dir.join("late"), random_bytes(1 << 20, 912));
    let (result, took) = writer.join().unwrap();
    drop(stopped);
    let err = result.expect_err("the write must fail once the wait is over");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(40), "{took:?}");
    assert_eq!(sha256(&fs::read(cluster.mnt.join("before")).unwrap()), sha256(&before));
    assert_eq!(sha256(&fs::read(cluster.mnt.join("during")).unwrap()), sha256(&data));
    eventually(90, "fsck is clean once the stopped chunkservers are back", || {
        let (code, report) = cli_json(&cluster, &["fsck"]);
        code == 0 && report["files"].as_u64() >= Some(2)
    });
}

/// Shard files of `cluster` with their bytes.
fn shard_bytes(cluster: &Cluster) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out: Vec<_> =
        cluster.shard_files().into_iter().map(|p| (p.clone(), fs::read(&p).unwrap())).collect();
    out.sort();
    out
}

#[test]
fn scrub_finds_corruption_nobody_reads_and_repair_restores_it() {
    let cluster =
        Cluster::start_with(std::path::Path::new("/tmp"), 6, "4+2", 256, &["--scrub-interval-secs", "1"]);
    let data = random_bytes(2_500_000, 900);
    fs::write(cluster.mnt.join("cold"), &data).unwrap();
    let pristine = shard_bytes(&cluster);
    // Damage two shards of one stripe on disk (one data, one parity), flipping a data byte.
    let victims: Vec<_> = pristine
        .iter()
        .filter(|(p, _)| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let mut parts = name.split('-');
            let (_, stripe, index) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
            stripe.ends_with("000") && (index == "01" || index == "04")
        })
        .map(|(p, b)| (p.clone(), b.clone()))
        .collect();
    assert_eq!(victims.len(), 2);
    for (path, bytes) in &victims {
        let mut bad = bytes.clone();
        let at = bad.len() - 100;
        bad[at] ^= 0x55;
        fs::write(path, bad).unwrap();
    }
    // Nobody reads the file: the scrub finds both, the repair rebuilds them byte-identical.
    eventually(120, "scrub and repair restore the damaged shards", || {
        victims.iter().all(|(path, bytes)| fs::read(path).map(|b| &b == bytes).unwrap_or(false))
    });
    assert_eq!(shard_bytes(&cluster), pristine);
    eventually(30, "status shows the rebuild", || {
        let st = status(&cluster);
        st["repair"]["shards_rebuilt"].as_u64().unwrap() >= 2 && st["repair"]["degraded_stripes"] == 0
    });
    assert_eq!(sha256(&fs::read(cluster.mnt.join("cold")).unwrap()), sha256(&data));
}

#[test]
fn more_than_m_damaged_shards_read_as_eio_never_wrong_data() {
    let cluster = Cluster::start(6, "4+2", 256);
    fs::write(cluster.mnt.join("doomed"), random_bytes(1_000_000, 901)).unwrap();
    // Destroy three shards of the only stripe: more than m = 2.
    let mut destroyed = 0;
    for path in cluster.shard_files() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if ["-00-", "-01-", "-04-"].iter().any(|i| name.contains(i)) {
            fs::remove_file(&path).unwrap();
            destroyed += 1;
        }
    }
    assert_eq!(destroyed, 3);
    let err = fs::read(cluster.mnt.join("doomed")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

/// Shard files whose name says stripe `stripe` of inode `ino` (hex as in the file names).
fn shards_of(cluster: &Cluster, ino: u64, stripe: u64) -> Vec<std::path::PathBuf> {
    let prefix = format!("{ino:016x}-{stripe:012x}-");
    let mut out: Vec<_> = cluster
        .shard_files()
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .collect();
    out.sort();
    out
}

/// The file of shard `index` of stripe `stripe` of inode `ino`.
fn shard_file(cluster: &Cluster, ino: u64, stripe: u64, index: u32) -> std::path::PathBuf {
    let infix = format!("-{stripe:012x}-{index:02x}-");
    let files = shards_of(cluster, ino, stripe);
    files.into_iter().find(|p| p.file_name().unwrap().to_string_lossy().contains(&infix)).unwrap()
}

/// Replace a shard file by one holding other bytes under a valid header: its block checksums
/// are computed over the new bytes, as a chunkserver (or anyone with its disk) could write.
fn forge(path: &std::path::Path) {
    let name = path.file_name().unwrap().to_str().unwrap();
    let id = cairn_common::ShardId::parse_file_name(name).unwrap();
    let file = fs::read(path).unwrap();
    let header = cairn_chunk::shard::parse_header(&file, &id).unwrap();
    let mut data = file[header.header_len as usize..].to_vec();
    data[0] ^= 0xff;
    let mut forged = cairn_chunk::shard::encode_header(&id, &data);
    forged.extend_from_slice(&data);
    assert_eq!(forged.len(), file.len());
    fs::write(path, forged).unwrap();
}

/// A forged data shard passes every block checksum but not the content hash its writer
/// recorded in the stripe record: fsck reports it corrupt, a reader on another mount gets the
/// written bytes (from the other shards), and scrub rebuilds it byte-identical.
#[test]
fn a_forged_shard_with_valid_checksums_is_caught_by_its_content_hash() {
    use std::os::unix::fs::MetadataExt;
    let cluster = Cluster::start(6, "4+2", 256);
    let data = random_bytes(2_500_000, 920);
    fs::write(cluster.mnt.join("f"), &data).unwrap();
    let pristine = shard_bytes(&cluster);
    let ino = fs::metadata(cluster.mnt.join("f")).unwrap().ino();
    forge(&shard_file(&cluster, ino, 1, 2));

    let (code, found) = cli_json(&cluster, &["fsck"]);
    assert_eq!(code, 4, "{found}");
    assert_eq!((found["shards_corrupt"].as_u64(), found["degraded"].as_u64()), (Some(1), Some(1)), "{found}");
    let other = Mount::new(&cluster, "other");
    // A small read inside the forged shard first (checked through the shard's BLAKE3 tree),
    // then the whole file (whole shards checked against their hashes).
    let at = (1 << 20) + 2 * (256 << 10) + 70_000;
    let mut some = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(other.dir.join("f")).unwrap(),
        &mut some,
        at as u64,
    )
    .unwrap();
    assert!(some == data[at..at + 4096], "forged bytes were read");
    assert_eq!(sha256(&fs::read(other.dir.join("f")).unwrap()), sha256(&data), "forged bytes were read");

    let (code, scrubbed) = cli_json(&cluster, &["scrub", "--all"]);
    assert_eq!(code, 1, "{scrubbed}");
    assert_eq!(scrubbed["repaired"].as_u64(), Some(1), "{scrubbed}");
    assert!(shard_bytes(&cluster) == pristine, "the forged shard was not rebuilt as written");
    assert_eq!(cli_json(&cluster, &["fsck"]).0, 0);
}

/// The metaserver's content audit finds a forged data shard (other bytes under valid block
/// checksums) by itself, from the shards' headers, and the repair rebuilds it as written: no
/// reader, fsck or scrub asked.
#[test]
fn the_content_audit_finds_a_forged_shard_and_the_repair_rebuilds_it() {
    use std::os::unix::fs::MetadataExt;
    let env = [("CAIRN_META_CONTENT_AUDIT_INTERVAL_MS", "300")];
    let cluster = Cluster::start_env(6, "4+2", 256, &[], &env);
    let data = random_bytes(2_500_000, 930);
    fs::write(cluster.mnt.join("f"), &data).unwrap();
    let pristine = shard_bytes(&cluster);
    let ino = fs::metadata(cluster.mnt.join("f")).unwrap().ino();
    forge(&shard_file(&cluster, ino, 0, 1));
    assert!(shard_bytes(&cluster) != pristine);

    eventually(60, "the forged shard rebuilt as written", || shard_bytes(&cluster) == pristine);
    let audited = |name: &str| -> f64 {
        let metas = cluster.nodes.iter().filter(|n| n.role == "meta");
        metas.filter_map(|n| support::metric(&support::scrape(n.metrics.as_ref().unwrap()), name, &[])).sum()
    };
    assert!(audited("cairn_meta_audit_damaged_total") >= 1.0, "the audit found it");
    assert!(audited("cairn_meta_audit_shards_total") >= 8.0, "every data shard checked");
    let (code, after) = cli_json(&cluster, &["fsck"]);
    assert_eq!(code, 0, "{after}");
    assert_eq!(sha256(&fs::read(cluster.mnt.join("f")).unwrap()), sha256(&data));
}

#[test]
fn scrub_and_fsck_find_repair_and_name_what_is_lost() {
    use std::os::unix::fs::MetadataExt;
    let cluster = Cluster::start(6, "4+2", 256);
    let a = random_bytes(2_500_000, 910);
    let b = random_bytes(600_000, 911);
    let c = random_bytes(1_200_000, 912);
    fs::write(cluster.mnt.join("a"), &a).unwrap();
    fs::write(cluster.mnt.join("b"), &b).unwrap();
    fs::create_dir(cluster.mnt.join("d")).unwrap();
    fs::write(cluster.mnt.join("d/c"), &c).unwrap();
    let (code, clean) = cli_json(&cluster, &["fsck"]);
    assert_eq!(code, 0, "{clean}");
    assert_eq!((clean["files"].as_u64(), clean["stripes"].as_u64()), (Some(3), Some(6)), "{clean}");
    assert_eq!(clean["healthy"], clean["stripes"]);
    let pristine = shard_bytes(&cluster);

    // One shard with a flipped byte, one truncated, one deleted, in three different stripes.
    let ino = |name: &str| fs::metadata(cluster.mnt.join(name)).unwrap().ino();
    let flipped = shards_of(&cluster, ino("a"), 1)[0].clone();
    let mut bytes = fs::read(&flipped).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x01;
    fs::write(&flipped, bytes).unwrap();
    let truncated = shards_of(&cluster, ino("a"), 2)[1].clone();
    fs::OpenOptions::new().write(true).open(&truncated).unwrap().set_len(4096).unwrap();
    let deleted = shards_of(&cluster, ino("d/c"), 0)[2].clone();
    fs::remove_file(&deleted).unwrap();

    // fsck reports without repairing.
    let (code, found) = cli_json(&cluster, &["fsck"]);
    assert_eq!(code, 4, "{found}");
    assert_eq!(
        (found["shards_corrupt"].as_u64(), found["shards_missing"].as_u64()),
        (Some(2), Some(1)),
        "{found}"
    );
    assert_eq!((found["degraded"].as_u64(), found["repaired"].as_u64()), (Some(3), Some(0)), "{found}");
    assert!(!deleted.exists(), "fsck without --repair changed nothing");

    // scrub repairs all three, byte-identical, and says so.
    let (code, scrubbed) = cli_json(&cluster, &["scrub", "--all"]);
    assert_eq!(code, 1, "{scrubbed}");
    assert_eq!((scrubbed["degraded_found"].as_u64(), scrubbed["repaired"].as_u64()), (Some(3), Some(3)));
    assert_eq!(scrubbed["degraded"], 0);
    assert_eq!(shard_bytes(&cluster), pristine);
    let (code, after) = cli_json(&cluster, &["fsck"]);
    assert_eq!(code, 0, "{after}");

    // More than m shards of one stripe of b gone: unrecoverable, and fsck names the file.
    for path in shards_of(&cluster, ino("b"), 0).into_iter().take(3) {
        fs::remove_file(path).unwrap();
    }
    let (code, lost) = cli_json(&cluster, &["fsck", "--repair"]);
    assert_eq!(code, 4, "{lost}");
    assert_eq!(lost["unrecoverable_files"], serde_json::json!(["/b"]), "{lost}");
    let (code, lost) = cli_json(&cluster, &["scrub", cluster.mnt.join("b").to_str().unwrap()]);
    assert_eq!((code, lost["unrecoverable"].as_u64()), (4, Some(1)), "{lost}");
    assert_eq!(fs::read(cluster.mnt.join("b")).unwrap_err().raw_os_error(), Some(libc::EIO));
    // The others are untouched by b's loss.
    assert_eq!(sha256(&fs::read(cluster.mnt.join("a")).unwrap()), sha256(&a));
    assert_eq!(sha256(&fs::read(cluster.mnt.join("d/c")).unwrap()), sha256(&c));
}

/// Total shards a chunkserver reports holding, by node id, from `cairn status`.
fn shards_by_node(cluster: &Cluster) -> std::collections::BTreeMap<u64, u64> {
    let (_, st) = cli_json(cluster, &["status"]);
    st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_u64().unwrap(), n["shards"].as_u64().unwrap()))
        .collect()
}

#[test]
fn drained_node_is_emptied_removed_and_a_new_node_takes_files() {
    let cluster = Cluster::start(7, "4+2", 256);
    let mut files = Vec::new();
    for i in 0..8usize {
        let data = random_bytes(300_000 + i * 250_000, 920 + i as u64);
        let path = cluster.mnt.join(format!("f{i}"));
        fs::write(&path, &data).unwrap();
        files.push((path, sha256(&data)));
    }
    let stored = cluster.shard_files().len() as u64;
    eventually(30, "heartbeats report every shard", || {
        shards_by_node(&cluster).values().sum::<u64>() == stored
    });
    let (victim, _) = shards_by_node(&cluster).into_iter().max_by_key(|(_, n)| *n).unwrap();
    let victim = victim.to_string();
    // Not drained yet: remove refuses and says why.
    let out = cluster.cli(&["node", "remove", &victim]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("drain it first"), "{out:?}");

    let (code, drained) = cli_json(&cluster, &["node", "drain", &victim, "--wait"]);
    assert_eq!((code, drained["shards_left"].as_u64()), (0, Some(0)), "{drained}");
    // The garbage collector empties the node; every file still reads, fsck is clean.
    eventually(60, "drained node holds no shards", || {
        shards_by_node(&cluster)[&victim.parse().unwrap()] == 0
    });
    for (path, hash) in &files {
        assert_eq!(&sha256(&fs::read(path).unwrap()), hash, "{}", path.display());
    }
    assert_eq!(cli_json(&cluster, &["fsck"]).0, 0);
    let out = cluster.cli(&["node", "remove", &victim]);
    assert!(out.status.success(), "{out:?}");
    let (_, st) = cli_json(&cluster, &["status"]);
    assert_eq!(st["nodes"].as_array().unwrap().len(), 6, "{st}");

    // A chunkserver added to the running cluster gets shards of new files.
    let extra = cluster.root.path().join("extra");
    let config = extra.join("chunk.toml");
    fs::create_dir_all(&extra).unwrap();
    fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nmeta = \"{meta}\"\nstate_dir = \"{dir}/state\"\n\
             ssd_dirs = [\"{dir}/ssd\"]\nhdd_dirs = []\nheartbeat_ms = 200\ntls_dir = \"{tls}\"\n",
            meta = cluster.meta_addr,
            dir = extra.display(),
            tls = cluster.tls("chunk-1").display(),
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(support::CAIRN)
        .args(["chunk", "--config", config.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(extra.join("chunk.log")).unwrap())
        .spawn()
        .unwrap();
    struct KillOnDrop<'a>(&'a mut std::process::Child);
    impl Drop for KillOnDrop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _guard = KillOnDrop(&mut child);
    eventually(30, "the new chunkserver registers", || {
        let (_, st) = cli_json(&cluster, &["status"]);
        st["nodes_up"] == 7
    });
    // Node ids only grow: the newest is the largest.
    let newest = *shards_by_node(&cluster).keys().max().unwrap();
    for i in 0..7u64 {
        fs::write(cluster.mnt.join(format!("new{i}")), random_bytes(800_000, 940 + i)).unwrap();
    }
    eventually(30, "the new chunkserver holds shards", || shards_by_node(&cluster)[&newest] > 0);
}

#[test]
fn a_crashed_writer_leaves_no_shards_behind_and_acknowledged_files_survive() {
    // Short lease and grace, so the leftovers of the killed client are judged within seconds.
    let cluster = Cluster::start_with(
        std::path::Path::new("/tmp"),
        6,
        "4+2",
        256,
        &["--client-lease-ms", "2000", "--orphan-grace-ms", "1000"],
    );
    // Write-back off: this test is about shards that were never committed.
    let mut writer = support::Mount::with_args(&cluster, "writer", &["--commit-interval-ms", "0"]);
    let done = random_bytes(3_000_000, 950);
    {
        let mut f = fs::File::create(writer.dir.join("done")).unwrap();
        std::io::Write::write_all(&mut f, &done).unwrap();
        f.sync_all().unwrap();
    }
    let committed = cluster.shard_files().len();
    // Six stripes written out, never committed: the client dies first. The file is written by
    // a process of its own that never forks: FUSE sends FLUSH (which commits) at every close
    // of a copy of the descriptor, and a process spawned meanwhile by this test binary (other
    // tests run in parallel) would inherit a copy of it and close it at exec.
    let mut partial = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys, time\n\
             fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
             data = os.urandom(6 << 20)\n\
             while data: data = data[os.write(fd, data):]\n\
             print('written', flush=True)\n\
             time.sleep(600)\n",
        ])
        .arg(writer.dir.join("partial"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(partial.stdout.take().unwrap()), &mut line)
        .unwrap();
    assert_eq!(line.trim(), "written");
    eventually(30, "the unfinished file's stripes reach the chunkservers", || {
        cluster.shard_files().len() >= committed + 12
    });
    writer.kill9();
    let _ = partial.kill();
    let _ = partial.wait();
    drop(writer);

    // Once the writer's lease ran out, fsck sees its shards as unreferenced (not as data: the
    // filesystem is clean), and --repair deletes them. Shard writes the client had sent may
    // still land after it died, and a shard counts as stale only once older than the grace
    // period: wait until every shard beyond the committed ones is reported stale.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let on_disk = cluster.shard_files().len() as u64;
        let (code, r) = cli_json(&cluster, &["fsck"]);
        let stale = r["unreferenced_shards"]["stale"].as_u64().unwrap_or(0);
        if code == 0 && stale >= 12 && stale == on_disk - committed as u64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fsck never reported all {} leftovers: {r}",
            on_disk - committed as u64
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (code, repaired) = cli_json(&cluster, &["fsck", "--repair"]);
    assert_eq!(code, 0, "{repaired}");
    let deleted = repaired["unreferenced_shards"]["deleted"].as_u64().unwrap();
    assert!(deleted >= 12, "{repaired}");
    assert_eq!(cluster.shard_files().len(), committed, "only committed shards are left");
    let (code, clean) = cli_json(&cluster, &["fsck"]);
    assert_eq!((code, clean["unreferenced_shards"]["stale"].as_u64()), (0, Some(0)), "{clean}");
    assert_eq!(sha256(&fs::read(cluster.mnt.join("done")).unwrap()), sha256(&done));
    assert_eq!(fs::metadata(cluster.mnt.join("partial")).unwrap().len(), 0);
}

#[test]
fn every_process_serves_metrics_that_move_with_io_and_repair() {
    use support::{metric, scrape};
    let cluster = Cluster::start(6, "4+2", 256);
    let addr_of =
        |role: &str| cluster.nodes.iter().find(|n| n.role == role).unwrap().metrics.clone().unwrap();
    let (meta, mount) = (addr_of("meta"), addr_of("mount"));
    let chunks: Vec<String> =
        cluster.nodes.iter().filter(|n| n.role == "chunk").map(|n| n.metrics.clone().unwrap()).collect();
    let data = random_bytes(3_000_000, 960);
    fs::write(cluster.mnt.join("m"), &data).unwrap();
    assert_eq!(fs::read(cluster.mnt.join("m")).unwrap().len(), data.len());

    // The client counts FUSE operations, with latency histograms, and the bytes moved.
    let text = scrape(&mount);
    assert!(metric(&text, "cairn_client_fuse_ops_total", &["op=\"write\""]).unwrap() > 0.0, "{text}");
    assert!(metric(&text, "cairn_client_fuse_op_seconds_count", &["op=\"read\""]).unwrap() > 0.0);
    assert!(metric(&text, "cairn_client_written_bytes_total", &[]).unwrap() >= data.len() as f64);
    // Chunkservers: RPCs by method, and per-tier bytes once a heartbeat published them.
    let written: f64 = chunks
        .iter()
        .map(|c| {
            metric(&scrape(c), "cairn_rpc_requests_total", &["method=\"WriteShard\"", "code=\"Ok\""])
                .unwrap_or(0.0)
        })
        .sum();
    assert!(written >= 18.0, "3 stripes x 6 shards written, counted {written}");
    eventually(10, "chunkservers publish tier usage", || {
        chunks
            .iter()
            .map(|c| metric(&scrape(c), "cairn_chunk_tier_used_bytes", &["tier=\"ssd\""]).unwrap_or(0.0))
            .sum::<f64>()
            > data.len() as f64
    });
    // Metaserver: RPCs, namespace gauges; then a damaged shard shows up in the repair counters.
    let text = scrape(&meta);
    assert!(
        metric(&text, "cairn_rpc_requests_total", &["service=\"meta\"", "method=\"Commit\""]).unwrap() > 0.0
    );
    eventually(10, "the metaserver publishes its gauges", || {
        let t = scrape(&meta);
        metric(&t, "cairn_meta_files", &[]) == Some(1.0)
            && metric(&t, "cairn_meta_nodes", &["state=\"up\""]) == Some(6.0)
    });
    assert!(metric(&scrape(&meta), "cairn_meta_rocksdb", &["property=\"live_data_bytes\""]).is_some());
    let victim = cluster.shard_files()[0].clone();
    fs::remove_file(&victim).unwrap();
    let (code, _) = cli_json(&cluster, &["scrub", "--all"]);
    assert_eq!(code, 1);
    eventually(15, "the rebuild is counted", || {
        metric(&scrape(&meta), "cairn_repair_shards_rebuilt_total", &[]).unwrap_or(0.0) >= 1.0
    });
}

/// A metaserver started on the wrong (empty) data directory refuses to start. Made to serve
/// there anyway (`cairn meta init`), it has a new, empty namespace of another cluster: with an
/// orphan grace of 0 its reconciliation would delete every shard of a chunkserver that joined
/// it at once; the chunkservers refuse to join it instead. Started again on its own data
/// directory, the metaserver finds every chunkserver and every byte.
#[test]
fn a_metaserver_on_the_wrong_data_directory_is_not_joined() {
    let cluster = Cluster::start(6, "4+2", 64);
    let data = random_bytes(300 * 1024 + 5, 31);
    fs::write(cluster.mnt.join("kept"), &data).unwrap();
    // Every chunkserver keeps the id of the cluster it joined, the one `cairn status` names.
    let (_, st) = cli_json(&cluster, &["status"]);
    let id = st["cluster_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "{st}");
    for i in 1..=6 {
        let kept = fs::read_to_string(cluster.data.join(format!("chunk-{i}/cluster"))).unwrap();
        assert_eq!(kept.trim(), id, "chunkserver {i}");
    }
    let config = cluster.data.join("meta/meta.toml");
    let mut cfg: toml::Table = toml::from_str(&fs::read_to_string(&config).unwrap()).unwrap();
    cfg.insert("data_dir".into(), toml::Value::String(cluster.data.join("meta/typo").display().to_string()));
    cfg.insert("orphan_grace_ms".into(), toml::Value::Integer(0));
    cfg.insert("reconcile_interval_ms".into(), toml::Value::Integer(200));
    let wrong_config = cluster.data.join("meta/wrong.toml");
    fs::write(&wrong_config, toml::to_string(&cfg).unwrap()).unwrap();
    kill9(cluster.pid_of("meta"));

    // A data directory without the namespace: the metaserver refuses to start, naming it and
    // what to do, and makes nothing there.
    let out = std::process::Command::new(support::CAIRN)
        .args(["meta", "--config", wrong_config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a metaserver started on the mistyped data_dir: {err}");
    assert!(err.contains("meta/typo holds no namespace") && err.contains("cairn meta init"), "{err}");
    assert!(!cluster.data.join("meta/typo").exists(), "nothing was made");
    // Made anyway (`cairn meta init`): a new cluster, which the chunkservers do not join.
    let out = cluster.cli(&["meta", "init", "--config", wrong_config.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    let log = cluster.data.join("logs/meta-wrong.log");
    // Killed when dropped, also when an assertion below fails.
    let mut wrong = support::KillOnDrop(Some(
        std::process::Command::new(support::CAIRN)
            .args(["meta", "--config", wrong_config.to_str().unwrap()])
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(cluster.data.join("logs/meta-wrong.err")).unwrap())
            .spawn()
            .unwrap(),
    ));
    let refused = || {
        let text = fs::read_to_string(&log).unwrap_or_default()
            + &fs::read_to_string(cluster.data.join("logs/meta-wrong.err")).unwrap_or_default();
        text.matches("refused a chunkserver of another cluster").count()
    };
    // Heartbeats every second, answered "unknown node", then registrations: several rounds, and
    // reconciliation every 200 ms had anyone joined.
    std::thread::sleep(Duration::from_secs(6));
    let out = cluster.cli(&["status", "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(st["nodes_up"], 0, "no chunkserver joined the new namespace: {st}");
    assert_ne!(st["cluster_id"].as_str(), Some(id.as_str()), "a new namespace is another cluster");
    assert!(refused() >= 6, "each chunkserver was refused, and told why");
    if let Some(mut wrong) = wrong.0.take() {
        let _ = wrong.kill();
        let _ = wrong.wait();
    }

    let _right = support::KillOnDrop(Some(support::restart_server(&cluster, "meta", "meta")));
    eventually(60, "the chunkservers are back", || {
        let out = cluster.cli(&["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|st| st["nodes_up"] == 6)
    });
    let started = Instant::now();
    let back = loop {
        match fs::read(cluster.mnt.join("kept")) {
            Ok(back) => break back,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(30), "kept: {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(sha256(&back), sha256(&data), "every byte is still there");
}

/// A metaserver restored from a backup older than some files: their shards are foreign to the
/// restored namespace (inode numbers it never handed out). With an orphan grace of 0 the old
/// reconciliation would have deleted them at once; now they are kept, reported, and deleted
/// only when an operator asks.
#[test]
fn a_namespace_restored_from_an_older_backup_keeps_the_newer_files_shards() {
    let mut cluster = Cluster::start_with(
        std::path::Path::new("/tmp"),
        6,
        "4+2",
        64,
        &["--orphan-grace-ms", "0", "--client-lease-ms", "2000"],
    );
    let before = random_bytes(300_000, 1210);
    fs::write(cluster.mnt.join("before"), &before).unwrap();
    let backups = cluster.root.path().join("backups");
    let out = cluster.cli(&["meta", "backup", backups.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let backup = fs::read_dir(&backups).unwrap().next().unwrap().unwrap().path();
    let shards_before = cluster.shard_files().len();
    // After a restart the namespace hands out inode numbers from a block the backup never had.
    cluster.stop();
    cluster.restart();
    let after = random_bytes(300_000, 1211);
    fs::write(cluster.mnt.join("after"), &after).unwrap();
    let shards_after = cluster.shard_files().len();
    assert!(shards_after >= shards_before + 6, "{shards_before} → {shards_after}");

    // Every metaserver lost; the backup restored.
    cluster.stop();
    fs::remove_dir_all(cluster.data.join("meta/db")).unwrap();
    let config = cluster.data.join("meta/meta.toml");
    let out =
        cluster.cli(&["meta", "restore", backup.to_str().unwrap(), "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cluster.restart();
    assert_eq!(sha256(&fs::read(cluster.mnt.join("before")).unwrap()), sha256(&before));
    assert!(!cluster.mnt.join("after").exists(), "the backup is older than the file");
    // A file created now gets an inode number none of the lost files had.
    let fresh = random_bytes(300_000, 1212);
    fs::write(cluster.mnt.join("fresh"), &fresh).unwrap();
    let lost = shards_after - shards_before;
    let total = cluster.shard_files().len();
    assert!(total >= shards_after + 6, "{shards_after} → {total}");

    // Reconciliation with --repair judges them foreign and keeps them.
    let (_, r) = cli_json(&cluster, &["fsck", "--repair"]);
    let leftover = &r["unreferenced_shards"];
    let foreign = lost as u64;
    assert_eq!(leftover["foreign"].as_u64(), Some(foreign), "{r}");
    assert_eq!(leftover["deleted"].as_u64(), Some(0), "{r}");
    assert_eq!(cluster.shard_files().len(), total, "no shard was deleted");
    // (Right after the restart the repair's first pass may still count the chunkservers down.)
    eventually(60, "status warns of the foreign shards", || {
        let status = String::from_utf8_lossy(&cluster.cli(&["status"]).stdout).into_owned();
        status.starts_with("HEALTH_WARN") && status.contains("never created")
    });
    let out = cluster.cli(&["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FOREIGN shards") && text.contains("--delete-foreign"), "{text}");

    // Asked to, fsck deletes them; the rest is untouched and the warning goes.
    let (_, r) = cli_json(&cluster, &["fsck", "--repair", "--delete-foreign"]);
    assert_eq!(r["unreferenced_shards"]["deleted"].as_u64(), Some(foreign), "{r}");
    assert_eq!(cluster.shard_files().len(), total - lost);
    assert_eq!(sha256(&fs::read(cluster.mnt.join("before")).unwrap()), sha256(&before));
    assert_eq!(sha256(&fs::read(cluster.mnt.join("fresh")).unwrap()), sha256(&fresh));
    let status = String::from_utf8_lossy(&cluster.cli(&["status"]).stdout).into_owned();
    assert!(!status.contains("never created"), "{status}");
}
