//! Failure handling on real processes: chunkservers that die for good are replaced and their
//! shards rebuilt, after which `m` more can die with every byte still readable.

mod support;

use std::fs;

use support::{eventually, kill9, random_bytes, sha256, Cluster};

fn status(cluster: &Cluster) -> serde_json::Value {
    let out = cluster.cli(&["status", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
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
