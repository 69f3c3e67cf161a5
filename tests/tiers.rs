//! Tiering end to end, on a real local cluster whose chunkservers have an 8 MiB SSD tier each:
//! writing more than the SSD tiers hold destages shards to HDD and every file still reads
//! byte-exact; a file read twice comes back to SSD; `cairn warmup DIR` brings all of DIR's
//! shards to SSD, demoting other data to make room, and fails clearly when an SSD tier cannot
//! hold it even then; a pinned dataset stays on SSD across warmups, the mover and restarts;
//! `kill -9` of a chunkserver while
//! its mover is copying a shard loses nothing and leaves every shard in exactly one place.
//!
//! Reads go around the kernel page cache (`posix_fadvise(DONTNEED)` before each), so every
//! read of a file reaches the chunkservers.

mod support;

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::ShardId;
use serde_json::Value;
use support::{eventually, kill9, random_bytes, sha256, Cluster, CAIRN};

const UNIT_KIB: u32 = 256;
const UNIT: usize = (UNIT_KIB as usize) << 10;
const K: u32 = 4;
const SSD_CAP: u64 = 8 << 20;

/// One shard file on disk.
#[derive(Clone, Debug)]
struct ShardFile {
    /// `chunk-N`, the chunkserver's directory.
    chunk: String,
    /// `ssd` or `hdd`.
    tier: String,
    id: ShardId,
}

/// Every shard file of the cluster, and every other file found among them (temp files).
fn scan(c: &Cluster) -> (Vec<ShardFile>, Vec<PathBuf>) {
    let mut shards = Vec::new();
    let mut others = Vec::new();
    for chunk in fs::read_dir(&c.data).unwrap().filter_map(Result::ok) {
        let chunk_name = chunk.file_name().to_string_lossy().into_owned();
        if !chunk_name.starts_with("chunk-") {
            continue;
        }
        for tier in ["ssd", "hdd"] {
            let Ok(buckets) = fs::read_dir(chunk.path().join(tier).join("shards")) else { continue };
            for bucket in buckets.filter_map(Result::ok) {
                let Ok(files) = fs::read_dir(bucket.path()) else { continue };
                for f in files.filter_map(Result::ok) {
                    let name = f.file_name().to_string_lossy().into_owned();
                    match ShardId::parse_file_name(&name) {
                        Some(id) => {
                            shards.push(ShardFile { chunk: chunk_name.clone(), tier: tier.into(), id })
                        }
                        None => others.push(f.path()),
                    }
                }
            }
        }
    }
    (shards, others)
}

/// The tiers the shards of inode `ino` are in (data shards only with `data_only`).
fn tiers_of(c: &Cluster, ino: u64, data_only: bool) -> Vec<String> {
    let (shards, _) = scan(c);
    shards.into_iter().filter(|s| s.id.ino == ino && (!data_only || s.id.index < K)).map(|s| s.tier).collect()
}

fn all_in(tiers: &[String], tier: &str) -> bool {
    !tiers.is_empty() && tiers.iter().all(|t| t == tier)
}

fn df(c: &Cluster) -> Value {
    let out = c.cli(&["df", "--json"]);
    assert!(out.status.success(), "cairn df: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("df json")
}

/// Per node: (ssd row, hdd row) of `cairn df --json`.
fn df_nodes(c: &Cluster) -> Vec<(Value, Value)> {
    let df = df(c);
    let rows = df["tiers"].as_array().expect("tiers").clone();
    let mut nodes: HashMap<u64, (Value, Value)> = HashMap::new();
    for r in rows {
        let e = nodes.entry(r["node"].as_u64().unwrap()).or_insert((Value::Null, Value::Null));
        if r["tier"] == "ssd" {
            e.0 = r;
        } else {
            e.1 = r;
        }
    }
    nodes.into_values().collect()
}

/// Read a file around the page cache, so the read reaches the chunkservers.
fn read_uncached(path: &Path) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut out = Vec::new();
    f.read_to_end(&mut out).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    out
}

fn check(path: &Path, digest: &str) {
    assert_eq!(sha256(&read_uncached(path)), *digest, "content of {}", path.display());
}

fn warmup_json(c: &Cluster, path: &str) -> (bool, Value, String) {
    let out = c.cli(&["warmup", path, "--json"]);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        panic!("warmup {path}: no json ({e}): {stdout}\n{stderr}")
    });
    (out.status.success(), json, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn shards_destage_come_back_when_read_twice_and_warm_up() {
    // The HDD tier reads with O_DIRECT: every HDD read below goes through the aligned path.
    let c = Cluster::start_with(
        Path::new("/tmp"),
        6,
        "4+2",
        UNIT_KIB,
        &["--ssd-capacity", "8M", "--hdd-direct-io"],
    );
    let toml = fs::read_to_string(c.data.join("chunk-1/chunk.toml")).unwrap();
    assert!(toml.contains(&format!("ssd_capacity = {SSD_CAP}")), "{toml}");
    assert!(toml.contains("hdd_direct_io = true"), "{toml}");

    // Oldest first: a directory to warm up, a file to read twice, then filler. 55 MiB of data
    // is 82 MiB of shards, against 48 MiB of SSD over the six chunkservers.
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    let mut write = |path: PathBuf, size: usize, seed: u64| {
        let data = random_bytes(size, seed);
        fs::write(&path, &data).unwrap();
        files.push((path, sha256(&data)));
    };
    fs::create_dir(c.mnt.join("warm")).unwrap();
    fs::create_dir(c.mnt.join("warm/sub")).unwrap();
    write(c.mnt.join("warm/a"), 2 * UNIT * 4 + 1234, 1);
    write(c.mnt.join("warm/sub/b"), 3 * UNIT + 5, 2);
    write(c.mnt.join("warm/sub/c"), 7, 3);
    write(c.mnt.join("warm/empty"), 0, 4);
    write(c.mnt.join("hot"), 4 * UNIT, 5);
    fs::create_dir(c.mnt.join("filler")).unwrap();
    for i in 0..24 {
        write(c.mnt.join(format!("filler/f{i:02}")), 2 << 20, 100 + i);
    }
    let ino = |p: &str| fs::metadata(c.mnt.join(p)).unwrap().ino();
    let warm: Vec<u64> = ["warm/a", "warm/sub/b", "warm/sub/c"].into_iter().map(ino).collect();
    let hot = ino("hot");

    // The least recently written shards go to HDD; the SSD tiers stay within their cap.
    eventually(90, "oldest shards destaged to HDD", || {
        let nodes = df_nodes(&c);
        nodes
            .iter()
            .all(|(ssd, hdd)| hdd["shards"].as_u64().unwrap() > 0 && ssd["used"].as_u64().unwrap() <= SSD_CAP)
            && warm.iter().chain([&hot]).all(|&i| all_in(&tiers_of(&c, i, false), "hdd"))
    });
    // (df counts come with heartbeats, a second behind the files.)
    eventually(10, "df counts the demotions", || df(&c)["demotions"].as_u64().unwrap() > 0);
    for (path, digest) in &files {
        check(path, digest);
    }

    // Free SSD room: remove the newest filler and wait for its shards to be collected.
    let removed: Vec<u64> = (12..24).map(|i| ino(&format!("filler/f{i:02}"))).collect();
    for i in 12..24 {
        fs::remove_file(c.mnt.join(format!("filler/f{i:02}"))).unwrap();
    }
    files.retain(|(p, _)| p.exists());
    // (A chunkserver reported down, as a heavily loaded one can be for a while, keeps its
    // shards until it is back: hence the long deadline.)
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (shards, _) = scan(&c);
        let left: Vec<_> = shards.iter().filter(|s| removed.contains(&s.id.ino)).collect();
        if left.is_empty() {
            break;
        }
        let status = String::from_utf8_lossy(&c.cli(&["status"]).stdout).into_owned();
        assert!(Instant::now() < deadline, "shards of removed files left: {left:?}\n{status}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A file read twice from HDD is promoted back to SSD (its data shards: parity is not read).
    let hot_digest = files.iter().find(|(p, _)| p.ends_with("hot")).unwrap().1.clone();
    check(&c.mnt.join("hot"), &hot_digest);
    check(&c.mnt.join("hot"), &hot_digest);
    eventually(30, "data shards of a file read twice back on SSD", || {
        all_in(&tiers_of(&c, hot, true), "ssd")
    });

    // `warmup --status` counts where the tree's shards are, from the chunkservers, and moves
    // nothing: it agrees with the shard files on disk.
    let status = |c: &Cluster| -> Value {
        let out = c.cli(&["warmup", "--status", "/warm", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let on_disk = |c: &Cluster| -> (u64, u64) {
        let tiers: Vec<String> = warm.iter().flat_map(|&i| tiers_of(c, i, false)).collect();
        let ssd = tiers.iter().filter(|t| *t == "ssd").count() as u64;
        (ssd, tiers.len() as u64 - ssd)
    };
    // (The mover may still be at work: compare until the two views agree.)
    let mut before = Value::Null;
    eventually(30, "warmup --status agrees with the shard files on disk", || {
        before = status(&c);
        let counted = (before["ssd"].as_u64().unwrap(), before["hdd"].as_u64().unwrap());
        counted == on_disk(&c) && counted.1 > 0
    });
    assert_eq!((before["missing"].as_u64(), before["unknown"].as_u64()), (Some(0), Some(0)), "{before}");

    // Warmup through the mount path: every shard of the tree, parity included, on SSD.
    let (ok, summary, stderr) = warmup_json(&c, c.mnt.join("warm").to_str().unwrap());
    assert!(ok, "warmup failed: {stderr}\n{summary}");
    assert_eq!(summary["files"], 4, "{summary}");
    assert_eq!(summary["directories"], 2, "{summary}");
    let shards = summary["shards"].as_u64().unwrap();
    // a: 2 full stripes + 1234 bytes (1 data + 2 parity); b: 4 data (the last one 5 bytes)
    // + 2 parity; c: 1 + 2; empty: none.
    assert_eq!(shards, 2 * 6 + 3 + 6 + 3, "{summary}");
    assert!(summary["promoted"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["promoted"].as_u64().unwrap() + summary["already"].as_u64().unwrap(), shards);
    assert_eq!(summary["missing"], 0, "{summary}");
    for &i in &warm {
        assert!(all_in(&tiers_of(&c, i, false), "ssd"), "inode {i} not all on SSD");
    }
    let after = status(&c);
    assert_eq!((after["ssd"].as_u64(), after["hdd"].as_u64()), (Some(shards), Some(0)), "{after}");
    assert_eq!(after["ssd_share"].as_f64(), Some(1.0), "{after}");
    // Again, by its path inside Cairn: nothing left to do.
    let (ok, again, stderr) = warmup_json(&c, "/warm");
    assert!(ok, "{stderr}");
    assert_eq!(again["already"].as_u64().unwrap(), shards, "{again}");
    assert_eq!(again["promoted"], 0, "{again}");
    // The human form has the summary line.
    let out = c.cli(&["warmup", c.mnt.join("warm/sub/b").to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("warmup /warm/sub/b: 1 files") && text.contains("already on SSD"), "{text}");

    for (path, digest) in &files {
        check(path, digest);
    }

    // df shows per-tier reads, hit ratios, promotions and demotions (its counts come with
    // heartbeats, a second behind the moves).
    eventually(10, "df counts the promotions", || df(&c)["promotions"].as_u64().unwrap() > 0);
    let df_json = df(&c);
    assert!(df_json["reads"].as_u64().unwrap() > 0, "{df_json}");
    let hit = df_json["ssd_hit_ratio"].as_f64().expect("hit ratio");
    assert!((0.0..=1.0).contains(&hit));
    for (ssd, hdd) in df_nodes(&c) {
        let reads = ssd["reads"].as_u64().unwrap() + hdd["reads"].as_u64().unwrap();
        if reads > 0 {
            let sum = ssd["hit_ratio"].as_f64().unwrap() + hdd["hit_ratio"].as_f64().unwrap();
            assert!((sum - 1.0).abs() < 1e-9, "{ssd} {hdd}");
        }
    }
    let out = c.cli(&["df"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("HIT") && text.contains("PROMO") && text.contains("served from SSD"), "{text}");

    // A tree larger than the SSD tiers: warmup stops on the full SSD, says so, exits non-zero.
    fs::create_dir(c.mnt.join("big")).unwrap();
    for i in 0..30 {
        fs::write(c.mnt.join(format!("big/g{i:02}")), random_bytes(2 << 20, 300 + i)).unwrap();
    }
    let (ok, summary, stderr) = warmup_json(&c, "/big");
    assert!(!ok, "warming 90 MiB of shards into 48 MiB of SSD succeeded: {summary}");
    assert_eq!(summary["ssd_full"], true, "{summary}");
    assert!(summary["not_promoted"].as_u64().unwrap() > 0, "{summary}");
    assert!(stderr.contains("SSD tier") && stderr.contains("full"), "{stderr}");

    // Nonsense paths fail with the path in the message.
    let out = c.cli(&["warmup", "/no/such/tree"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/tree"));
}

/// `cairn warmup ARGS --json`: whether it succeeded, and its summary.
fn warmup_with(c: &Cluster, args: &[&str]) -> (bool, Value) {
    let mut all = vec!["warmup"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = c.cli(&all);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        panic!("warmup {args:?}: no json ({e}): {stdout}\n{stderr}")
    });
    (out.status.success(), json)
}

#[test]
fn warmup_makes_room_by_demoting_other_data_and_pins_keep_a_dataset_on_ssd() {
    // Six chunkservers with 8 MiB of SSD each (48 MiB), as an operator tried it: a 20 MiB
    // dataset (30 MiB of shards, 5 MiB per chunkserver) written first, then 96 MiB of other
    // files, written over some seconds so the mover (every second) keeps demoting the least
    // recently used shards: the dataset goes to HDD and the SSD tiers stay full of the others.
    // 5 MiB is more than the free space of a tier (at most 2 MiB: the mover demotes down to its
    // low watermark, 6 MiB) plus what the mover frees after a warmup fills it (2 MiB again), so
    // the warmup below must evict however its passes interleave with the mover's.
    let mut c = Cluster::start_with(Path::new("/tmp"), 6, "4+2", UNIT_KIB, &["--ssd-capacity", "8M"]);
    fs::create_dir(c.mnt.join("set")).unwrap();
    let set = random_bytes(20 << 20, 40);
    fs::write(c.mnt.join("set/data"), &set).unwrap();
    let set_ino = fs::metadata(c.mnt.join("set/data")).unwrap().ino();
    fs::create_dir(c.mnt.join("other")).unwrap();
    let mut others = Vec::new();
    for i in 0..48u64 {
        let data = random_bytes(2 << 20, 41 + i);
        fs::write(c.mnt.join(format!("other/f{i:02}")), &data).unwrap();
        others.push(sha256(&data));
        std::thread::sleep(Duration::from_millis(250));
    }
    eventually(60, "the dataset is pushed to HDD by the newer files", || {
        all_in(&tiers_of(&c, set_ino, false), "hdd")
    });

    // Free space alone does not hold it (the SSD tiers stay above their low watermark).
    let (ok, summary) = warmup_with(&c, &["--no-evict", "/set"]);
    assert!(!ok && summary["ssd_full"] == true, "{summary}");
    assert_eq!(summary["evicted"], 0, "{summary}");

    // Asked for, it gets the room: least recently used other shards go to HDD. Pinned.
    let (ok, summary) = warmup_with(&c, &["--pin", "/set"]);
    assert!(ok, "{summary}");
    assert!(summary["evicted"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["not_promoted"], 0, "{summary}");
    assert!(all_in(&tiers_of(&c, set_ino, false), "ssd"));
    let status = |c: &Cluster| -> Value {
        let out = c.cli(&["warmup", "--status", "/set", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let st = status(&c);
    assert_eq!(
        (st["pinned"].clone(), st["pinned_bytes"].clone()),
        (st["shards"].clone(), st["bytes"].clone()),
        "{st}"
    );
    assert_eq!(st["ssd_share"].as_f64(), Some(1.0), "{st}");

    // A warmup that cannot fit (144 MiB of shards into the 18 MiB left beside the pinned
    // dataset) fills what it can, says how much did, and never evicts the pinned dataset. The
    // mover, back under its watermark, does not demote it either.
    let (ok, summary) = warmup_with(&c, &["/other"]);
    assert!(!ok && summary["ssd_full"] == true, "{summary}");
    assert!(summary["promoted"].as_u64().unwrap() > 0, "{summary}");
    assert!(summary["not_promoted"].as_u64().unwrap() > 0, "{summary}");
    eventually(60, "the mover brings every SSD tier under its high watermark", || {
        df_nodes(&c).iter().all(|(ssd, _)| ssd["used"].as_u64().unwrap() <= SSD_CAP * 9 / 10)
    });
    assert!(all_in(&tiers_of(&c, set_ino, false), "ssd"), "a pinned shard was demoted");

    // Pins survive a restart of every process.
    c.stop();
    c.restart();
    let st = status(&c);
    assert_eq!(st["pinned_bytes"], st["bytes"], "{st}");
    let (ok, summary) = warmup_with(&c, &["/other"]);
    assert!(!ok, "{summary}");
    assert!(all_in(&tiers_of(&c, set_ino, false), "ssd"), "a pinned shard was evicted after the restart");

    // Unpinned, it is ordinary data again.
    let out = c.cli(&["warmup", "--unpin", "/set", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let unpinned: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(unpinned["unpinned"], 6, "one pin per chunkserver: {unpinned}");
    assert_eq!(status(&c)["pinned"], 0);

    check(&c.mnt.join("set/data"), &sha256(&set));
    for (i, digest) in others.iter().enumerate() {
        check(&c.mnt.join(format!("other/f{i:02}")), digest);
    }
}

/// A chunkserver started by the test; killed when dropped.
struct ChunkProc(Child);

impl Drop for ChunkProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_chunk(c: &Cluster, n: u32) -> ChunkProc {
    let log = fs::File::create(c.data.join(format!("logs/chunk-{n}-restarted.log"))).unwrap();
    let config = c.data.join(format!("chunk-{n}/chunk.toml"));
    let child = Command::new(CAIRN)
        .args(["chunk", "--config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start cairn chunk");
    ChunkProc(child)
}

fn chunk_addr(c: &Cluster, n: u32) -> String {
    let toml = fs::read_to_string(c.data.join(format!("chunk-{n}/chunk.toml"))).unwrap();
    let listen = toml.lines().find(|l| l.starts_with("listen")).expect("listen");
    listen.split('"').nth(1).unwrap().to_string()
}

/// Every shard is in exactly one place and no temp file is left.
fn exactly_once(c: &Cluster) -> Result<usize, String> {
    let (shards, others) = scan(c);
    if let Some(tmp) = others.first() {
        return Err(format!("left-over file {}", tmp.display()));
    }
    let mut seen: HashMap<ShardId, Vec<String>> = HashMap::new();
    for s in &shards {
        seen.entry(s.id).or_default().push(format!("{}/{}", s.chunk, s.tier));
    }
    match seen.iter().find(|(_, at)| at.len() > 1) {
        Some((id, at)) => Err(format!("shard {id:?} is in {at:?}")),
        None => Ok(seen.len()),
    }
}

#[test]
fn kill_9_during_a_move_loses_nothing_and_duplicates_nothing() {
    // A slow mover (2 MiB/s) makes each move of a 256 KiB shard take ~0.1 s: long enough to
    // kill the chunkserver in the middle of one.
    let c = Cluster::start_with(
        Path::new("/tmp"),
        6,
        "4+2",
        UNIT_KIB,
        &["--ssd-capacity", "8M", "--mover-rate", "2M"],
    );
    let addr = chunk_addr(&c, 1);
    let pid = c.nodes.iter().find(|n| n.role == "chunk" && n.addr == addr).expect("chunk-1").pid;
    let chunk1 = c.data.join("chunk-1");
    let moving = |dir: &Path| -> bool {
        ["ssd", "hdd"].iter().any(|t| {
            fs::read_dir(dir.join(t).join("shards")).into_iter().flatten().filter_map(Result::ok).any(|b| {
                fs::read_dir(b.path())
                    .into_iter()
                    .flatten()
                    .filter_map(Result::ok)
                    .any(|f| f.file_name().to_string_lossy().contains(".tmp-move-"))
            })
        })
    };

    // Write 60 MiB (90 MiB of shards against 48 MiB of SSD) while watching chunk-1 for a move
    // in flight; kill it there.
    let files: Vec<(PathBuf, Vec<u8>)> =
        (0..30).map(|i| (c.mnt.join(format!("f{i:02}")), random_bytes(2 << 20, 500 + i))).collect();
    let done = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let files = files.clone();
        let (done, written) = (done.clone(), written.clone());
        std::thread::spawn(move || {
            for (path, data) in &files {
                fs::write(path, data).unwrap();
                written.fetch_add(1, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut caught = false;
    while Instant::now() < deadline {
        if moving(&chunk1) {
            caught = true;
            break;
        }
        // Once the writes are over, the mover still has a backlog for a while.
        if done.load(Ordering::SeqCst) && Instant::now() + Duration::from_secs(100) > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let complete_before_kill = written.load(Ordering::SeqCst);
    kill9(pid);
    eprintln!(
        "chunk-1 killed {} a move; {complete_before_kill} files complete",
        if caught { "during" } else { "outside" }
    );
    assert!(caught, "never saw chunk-1 move a shard");
    writer.join().unwrap();

    // Also leave what a crash at other points of a move leaves: a partial copy, and a
    // complete copy in the other tier (renamed into place, source not yet deleted).
    let (shards, _) = scan(&c);
    let one = shards.iter().find(|s| s.chunk == "chunk-1").expect("chunk-1 has shards").clone();
    let src = chunk1.join(&one.tier).join("shards").join(one.id.bucket()).join(one.id.file_name());
    let other = if one.tier == "ssd" { "hdd" } else { "ssd" };
    let bucket = chunk1.join(other).join("shards").join(one.id.bucket());
    fs::create_dir_all(&bucket).unwrap();
    fs::copy(&src, bucket.join(one.id.file_name())).unwrap();
    let bytes = fs::read(&src).unwrap();
    fs::write(
        bucket.join(format!("{}.tmp-move-00000000deadbeef", one.id.file_name())),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();

    // Restart it by hand; once it is serving, every shard is in exactly one place.
    let restarted = start_chunk(&c, 1);
    let new_pid = restarted.0.id();
    eventually(60, "restarted chunk-1 heartbeats", || {
        let out = c.cli(&["status", "--json"]);
        let status: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        status["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| n["addr"] == addr.as_str() && n["pid"] == new_pid && n["up"] == true)
        })
    });
    // The other chunkservers' movers may be mid-move for a little while (a temp file).
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = exactly_once(&c) {
        assert!(Instant::now() < deadline, "after the restart: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }

    for (path, data) in &files {
        assert_eq!(sha256(&read_uncached(path)), sha256(data), "content of {}", path.display());
    }
    // Nothing of chunk-1 was lost: with two other chunkservers gone, every stripe written
    // before the kill needs chunk-1's shard to be read.
    let others: Vec<u32> =
        c.nodes.iter().filter(|n| n.role == "chunk" && n.addr != addr).take(2).map(|n| n.pid).collect();
    for p in others {
        kill9(p);
    }
    for (path, data) in &files[..complete_before_kill] {
        assert_eq!(
            sha256(&read_uncached(path)),
            sha256(data),
            "content of {} without 2 nodes",
            path.display()
        );
    }
    drop(restarted);
}
