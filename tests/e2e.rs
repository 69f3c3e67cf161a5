//! End-to-end tests on a real local cluster: `cairn up` with six chunkserver processes and
//! EC 4+2, a real FUSE mount, files written and read through the kernel.

mod support;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

use support::{kill9, random_bytes, sha256, write_and_close, Cluster};

const UNIT: usize = 1 << 20;
const K: usize = 4;

fn sizes() -> Vec<usize> {
    vec![0, 1, UNIT - 1, UNIT, K * UNIT + 1, 3 * UNIT + 12345]
}

#[test]
fn files_round_trip_byte_exact_and_cost_k_plus_m_over_k() {
    let cluster = Cluster::start(6, "4+2", 1024);
    for (i, size) in sizes().into_iter().enumerate() {
        let data = random_bytes(size, i as u64);
        let path = cluster.mnt.join(format!("file-{size}"));
        fs::write(&path, &data).unwrap();
        let back = fs::read(&path).unwrap();
        assert_eq!(back.len(), size, "size of {size}-byte file");
        assert_eq!(sha256(&back), sha256(&data), "content of {size}-byte file");
        assert_eq!(fs::metadata(&path).unwrap().len(), size as u64);
    }

    // 100 MiB of random data: the shards stored for it are ≈ (k+m)/k of it.
    let before = cluster.stored_bytes();
    let big = random_bytes(100 << 20, 99);
    let path = cluster.mnt.join("big.bin");
    let mut f = fs::File::create(&path).unwrap();
    for chunk in big.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let stored = cluster.stored_bytes() - before;
    let ratio = stored as f64 / big.len() as f64;
    assert!((1.49..1.52).contains(&ratio), "stored {stored} bytes for {} (ratio {ratio:.3})", big.len());

    let mut back = Vec::new();
    fs::File::open(&path).unwrap().read_to_end(&mut back).unwrap();
    assert_eq!(sha256(&back), sha256(&big));

    // Random reads in the middle of stripes.
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(&path).unwrap();
    for (off, len) in
        [(5 * UNIT as u64 - 3, 10usize), (17 * UNIT as u64 + 4096, 200_000), ((100 << 20) - 7, 7)]
    {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off).unwrap();
        assert_eq!(&buf[..], &big[off as usize..off as usize + len], "read at {off}");
    }
}

#[test]
fn every_file_survives_losing_m_chunkservers() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let mut files = Vec::new();
    for (i, size) in sizes().into_iter().chain([20 << 20]).enumerate() {
        let data = random_bytes(size, 100 + i as u64);
        let path = cluster.mnt.join(format!("f{i}"));
        fs::write(&path, &data).unwrap();
        files.push((path, sha256(&data), size));
    }
    let pids = cluster.chunk_pids();
    // One chunkserver dies: writes still succeed (degraded), every file reads back.
    kill9(pids[0]);
    let late = random_bytes(6 * UNIT + 77, 7);
    let late_path = cluster.mnt.join("written-degraded");
    fs::write(&late_path, &late).unwrap();
    files.push((late_path, sha256(&late), late.len()));
    // A second one dies: m = 2 shards of every stripe may be gone; all data is still there.
    kill9(pids[3]);
    for (path, hash, size) in &files {
        let back = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        assert_eq!(back.len(), *size, "{}", path.display());
        assert_eq!(&sha256(&back), hash, "{}", path.display());
    }
}

#[test]
fn corrupted_shard_is_never_returned_as_data() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let data = random_bytes(2 * UNIT + 5, 3);
    let path = cluster.mnt.join("victim");
    fs::write(&path, &data).unwrap();
    // Flip one byte in every data shard 0 on disk (the header is 4 KiB, data follows).
    let mut flipped = 0;
    for shard in cluster.shard_files() {
        let name = shard.file_name().unwrap().to_string_lossy().to_string();
        if name.split('-').nth(2) == Some("00") {
            let mut bytes = fs::read(&shard).unwrap();
            let at = bytes.len() - 1;
            bytes[at] ^= 0xff;
            fs::write(&shard, bytes).unwrap();
            flipped += 1;
        }
    }
    assert!(flipped >= 1);
    let back = fs::read(&path).unwrap();
    assert_eq!(sha256(&back), sha256(&data));
}

#[test]
fn namespace_survives_a_restart() {
    let mut cluster = Cluster::start(6, "4+2", 1024);
    let m = cluster.mnt.clone();
    fs::create_dir_all(m.join("a/b/c")).unwrap();
    let data = random_bytes(UNIT * 5 + 3, 11);
    fs::write(m.join("a/b/c/data.bin"), &data).unwrap();
    std::os::unix::fs::symlink("b/c/data.bin", m.join("a/link")).unwrap();
    fs::hard_link(m.join("a/b/c/data.bin"), m.join("a/hard")).unwrap();
    fs::set_permissions(m.join("a/b"), std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    let ino = fs::metadata(m.join("a/hard")).unwrap().ino();

    cluster.stop();
    cluster.restart();

    assert_eq!(sha256(&fs::read(m.join("a/b/c/data.bin")).unwrap()), sha256(&data));
    assert_eq!(fs::read_link(m.join("a/link")).unwrap().to_str(), Some("b/c/data.bin"));
    assert_eq!(sha256(&fs::read(m.join("a/link")).unwrap()), sha256(&data));
    let md = fs::metadata(m.join("a/hard")).unwrap();
    assert_eq!((md.ino(), md.nlink()), (ino, 2));
    assert_eq!(fs::metadata(m.join("a/b")).unwrap().mode() & 0o7777, 0o750);
    // New inodes after the restart do not reuse old numbers.
    fs::write(m.join("new"), b"x").unwrap();
    assert_ne!(fs::metadata(m.join("new")).unwrap().ino(), ino);
}

#[test]
fn directory_operations() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let m = cluster.mnt.clone();
    fs::create_dir_all(m.join("x/y/z")).unwrap();
    fs::create_dir(m.join("other")).unwrap();
    fs::write(m.join("x/y/z/f"), b"hello").unwrap();
    fs::write(m.join("other/target"), b"old").unwrap();
    // Rename over an existing file, across directories.
    fs::rename(m.join("x/y/z/f"), m.join("other/target")).unwrap();
    assert_eq!(fs::read(m.join("other/target")).unwrap(), b"hello");
    assert!(!m.join("x/y/z/f").exists());
    // Rename a directory across parents: link counts follow.
    fs::rename(m.join("x/y"), m.join("other/y")).unwrap();
    assert!(m.join("other/y/z").is_dir());
    assert_eq!(fs::metadata(m.join("x")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.join("other")).unwrap().nlink(), 3);
    // A directory cannot move into itself; a non-empty directory is not removed.
    assert_eq!(
        fs::rename(m.join("other"), m.join("other/y/inside")).unwrap_err().raw_os_error(),
        Some(libc::EINVAL)
    );
    assert_eq!(fs::remove_dir(m.join("other")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    // Hard links share data and count.
    fs::hard_link(m.join("other/target"), m.join("x/alias")).unwrap();
    assert_eq!(fs::metadata(m.join("x/alias")).unwrap().nlink(), 2);
    fs::remove_file(m.join("other/target")).unwrap();
    assert_eq!(fs::read(m.join("x/alias")).unwrap(), b"hello");
    assert_eq!(fs::metadata(m.join("x/alias")).unwrap().nlink(), 1);
    // Symlinks.
    std::os::unix::fs::symlink("../x/alias", m.join("other/sym")).unwrap();
    assert_eq!(fs::read(m.join("other/sym")).unwrap(), b"hello");
    assert!(fs::symlink_metadata(m.join("other/sym")).unwrap().file_type().is_symlink());
    // Bad names get errno, not a hang.
    let long = "n".repeat(256);
    assert_eq!(fs::write(m.join(&long), b"").unwrap_err().raw_os_error(), Some(libc::ENAMETOOLONG));
    fs::write(m.join("n".repeat(255)), b"ok").unwrap();
    // A directory of 10,000 entries lists completely.
    let big = m.join("many");
    fs::create_dir(&big).unwrap();
    for i in 0..10_000 {
        fs::File::create(big.join(format!("entry-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> =
        fs::read_dir(&big).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 10_000);
    assert_eq!(names[0], "entry-00000");
    assert_eq!(names[9_999], "entry-09999");
    for i in (0..10_000).step_by(2) {
        fs::remove_file(big.join(format!("entry-{i:05}"))).unwrap();
    }
    assert_eq!(fs::read_dir(&big).unwrap().count(), 5_000);
}

#[test]
fn overwrite_truncate_and_append() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let path = cluster.mnt.join("f");
    let mut model = random_bytes(3 * UNIT + 100, 5);
    fs::write(&path, &model).unwrap();
    use std::os::unix::fs::FileExt;
    // Overwrite in the middle of a stripe (copy-on-write of that stripe).
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let patch = random_bytes(5000, 6);
    f.write_all_at(&patch, UNIT as u64 + 10).unwrap();
    model[UNIT + 10..UNIT + 10 + 5000].copy_from_slice(&patch);
    drop(f);
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&model));
    // Truncate down into a stripe, then up: the cut bytes read back as zeros.
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(UNIT as u64 + 7).unwrap();
    f.set_len(2 * UNIT as u64).unwrap();
    drop(f);
    model.truncate(UNIT + 7);
    model.resize(2 * UNIT, 0);
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&model));
    // Append, and a sparse write far past the end.
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"tail").unwrap();
    model.extend_from_slice(b"tail");
    drop(f);
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"far", 40 * UNIT as u64).unwrap();
    drop(f);
    model.resize(40 * UNIT, 0);
    model.extend_from_slice(b"far");
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&model));
}

#[test]
fn admin_commands_report_the_cluster() {
    let cluster = Cluster::start(6, "4+2", 1024);
    fs::write(cluster.mnt.join("f"), random_bytes(4 * UNIT, 1)).unwrap();
    // Usage reaches the metaserver with the next heartbeats: poll with a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let df = loop {
        let out = cluster.cli(&["df", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let df: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ssd_used: u64 = df["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["tier"] == "ssd")
            .map(|t| t["used"].as_u64().unwrap())
            .sum();
        if ssd_used >= 6 * UNIT as u64 {
            break df;
        }
        assert!(std::time::Instant::now() < deadline, "new shards never showed on the ssd tier: {df}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(df["ec"], "4+2");
    let tiers = df["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 12, "an ssd and an hdd tier per chunkserver");
    let hdd_used: u64 =
        tiers.iter().filter(|t| t["tier"] == "hdd").map(|t| t["used"].as_u64().unwrap()).sum();
    assert_eq!(hdd_used, 0, "nothing destages to hdd yet");
    assert_eq!(df["usable_capacity"].as_u64().unwrap(), df["raw_capacity"].as_u64().unwrap() / 6 * 4);
    // Every tier directory of this cluster is on one filesystem (under /tmp): counted once, and
    // every row after the first says it shares the first one's.
    assert_eq!(df["raw_capacity"], tiers[0]["capacity"], "{df}");
    assert!(tiers[0]["shared_with_row"].is_null(), "{df}");
    assert!(tiers[1..].iter().all(|t| t["shared_with_row"] == 1 && t["fs_id"] == tiers[0]["fs_id"]), "{df}");
    let text = String::from_utf8_lossy(&cluster.cli(&["df"]).stdout).into_owned();
    assert!(text.contains("=1 ") && text.contains("counted once in the totals"), "{text}");

    let out = cluster.cli(&["status", "--json"]);
    assert!(out.status.success());
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["nodes_up"], 6);
    assert_eq!(st["files"], 1);
    assert_eq!(st["logical_bytes"], 4 * UNIT as u64);

    // Human-readable output too.
    let out = cluster.cli(&["df"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("usable"));
}

#[test]
fn bad_input_gets_clear_errors() {
    // No metaserver: a clear message and a non-zero exit, quickly.
    let out = std::process::Command::new(support::CAIRN)
        .args(["status", "--plaintext", "--meta", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach metaserver"));
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = std::process::Command::new(support::CAIRN)
        .args(["mount", "--plaintext", "--meta", "127.0.0.1:1", mnt.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!support::is_mounted(&mnt));
    // A malformed config names the file and the problem.
    let cfg = dir.path().join("meta.toml");
    fs::write(&cfg, "listen = 7\n").unwrap();
    let out = std::process::Command::new(support::CAIRN)
        .args(["meta", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("meta.toml") && err.contains("listen"), "{err}");
    fs::write(&cfg, "typo = 1\n").unwrap();
    let out = std::process::Command::new(support::CAIRN)
        .args(["meta", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("typo"));
    // Too few chunkservers for the layout.
    let out = std::process::Command::new(support::CAIRN)
        .args(["up", "--data-dir", dir.path().join("d").to_str().unwrap(), "--mount", mnt.to_str().unwrap()])
        .args(["--chunkservers", "3", "--meta-port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs at least 6 chunkservers"));
}

#[test]
fn metaserver_killed_and_restarted_under_a_live_mount() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let m = cluster.mnt.clone();
    let data = random_bytes(3 * UNIT + 9, 21);
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/before"), &data).unwrap();
    kill9(cluster.pid_of("meta"));
    // The mount answers with an error while the metaserver is gone: it does not hang.
    assert!(fs::metadata(m.join("d/absent")).is_err());
    let config = cluster.data.join("meta/meta.toml");
    let mut meta = std::process::Command::new(support::CAIRN)
        .args(["meta", "--config", config.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // Poll until the same mount, without remounting, sees the namespace again.
    let back = loop {
        if let Ok(back) = fs::read(m.join("d/before")) {
            break back;
        }
        assert!(std::time::Instant::now() < deadline, "mount did not recover after metaserver restart");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(sha256(&back), sha256(&data));
    // Writes work again once the chunkservers have heartbeated to the new metaserver.
    let after = random_bytes(UNIT + 1, 22);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fs::write(m.join("d/after"), &after).is_err() {
        assert!(std::time::Instant::now() < deadline, "writes did not recover");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(sha256(&fs::read(m.join("d/after")).unwrap()), sha256(&after));
    let _ = meta.kill();
    let _ = meta.wait();
}

#[test]
fn full_disk_is_enospc_and_loses_nothing_acknowledged() {
    // The whole cluster lives on a 400 MiB tmpfs; chunkservers keep 64 MiB free by default.
    let dir = tempfile::Builder::new().prefix("cairn-full-").tempdir_in("/tmp").unwrap();
    let fsdir = dir.path().join("fs");
    fs::create_dir(&fsdir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=400m", "tmpfs", fsdir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs (tests run as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(fsdir.clone());
    let cluster = Cluster::start_in(&fsdir, 6, "4+2", 1024);
    let m = cluster.mnt.clone();
    let keep = random_bytes(2 * UNIT, 31);
    fs::write(m.join("keep"), &keep).unwrap();

    let mut f = fs::File::create(m.join("too-big")).unwrap();
    let chunk = random_bytes(UNIT, 32);
    let mut error = None;
    for _ in 0..1024 {
        if let Err(e) = f.write_all(&chunk) {
            error = Some(e);
            break;
        }
    }
    let error = error.or_else(|| f.sync_all().err()).expect("writing 1 GiB to 400 MiB must fail");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    drop(f);
    // What was acknowledged before is intact.
    assert_eq!(sha256(&fs::read(m.join("keep")).unwrap()), sha256(&keep));
    // Removing the partial file frees its shards (garbage collection), and writes work again.
    fs::remove_file(m.join("too-big")).unwrap();
    let small = random_bytes(UNIT, 33);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // close's error counts: a write whose close failed was never acknowledged.
        match write_and_close(&m.join("after"), &small) {
            Ok(()) => break,
            Err(e) => {
                eprintln!("writing after the removal: {e}; retrying");
                assert!(std::time::Instant::now() < deadline, "space never came back: {e}");
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!(sha256(&fs::read(m.join("after")).unwrap()), sha256(&small));
}

fn sh(dir: &std::path::Path, script: &str) -> String {
    let out = std::process::Command::new("bash").arg("-ec").arg(script).current_dir(dir).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "script failed:\n{script}\n{text}");
    text
}

#[test]
fn real_tools_work_on_the_mount() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let m = cluster.mnt.clone();
    let src = cluster.root.path().join("src");
    fs::create_dir_all(src.join("tree/deep/er")).unwrap();
    for i in 0..50 {
        fs::write(src.join(format!("tree/deep/f{i}")), random_bytes(i * 37_000, i as u64)).unwrap();
    }
    fs::write(src.join("tree/deep/er/big"), random_bytes(9 * UNIT + 5, 77)).unwrap();
    std::os::unix::fs::symlink("deep/f3", src.join("tree/link")).unwrap();
    fs::hard_link(src.join("tree/deep/f4"), src.join("tree/hard")).unwrap();
    let (s, d) = (src.display(), m.display());
    // cp -r, then tar c | tar x (symlinks and hard links preserved), compared with diff -r.
    sh(&m, &format!("cp -a {s}/tree {d}/copied && diff -r {s}/tree {d}/copied"));
    sh(&m, &format!("mkdir {d}/untarred && tar -C {s} -cf - tree | tar -C {d}/untarred -xf - && diff -r {s}/tree {d}/untarred/tree"));
    sh(&m, &format!("test -L {d}/untarred/tree/link && test $(stat -c %h {d}/untarred/tree/hard) = 2"));
    // fio writes with checksums and verifies them on read-back.
    let fio = sh(&m, "fio --name=verify --directory=. --rw=randwrite --bs=64k --size=24m --verify=crc32c --do_verify=1 --iodepth=1 --output-format=normal");
    assert!(fio.contains("verify"), "{fio}");
    // Python: write, read, seek, append.
    sh(
        &m,
        r#"python3 - <<'PY'
import os, hashlib
data = os.urandom(3_000_001)
with open("py.bin", "wb") as f:
    f.write(data)
with open("py.bin", "rb") as f:
    assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    f.seek(1_048_570)
    assert f.read(20) == data[1_048_570:1_048_590]
with open("py.bin", "ab") as f:
    f.write(b"more")
assert os.path.getsize("py.bin") == len(data) + 4
os.makedirs("a/b", exist_ok=True)
os.rename("py.bin", "a/b/moved.bin")
assert sorted(os.listdir("a/b")) == ["moved.bin"]
PY"#,
    );
}

/// Random 4 KiB reads at fixed offsets; each checked against `model`.
fn random_reads(path: &std::path::Path, offsets: &[u64], model: &[u8]) {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = fs::File::open(path).unwrap();
    // Out of the kernel's page cache, so every read reaches the client.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let mut buf = vec![0u8; 4096];
    for &at in offsets {
        let n = f.read_at(&mut buf, at).unwrap();
        let want = &model[at as usize..(at as usize + 4096).min(model.len())];
        assert_eq!(&buf[..n], want, "4 KiB at {at}");
    }
}

#[test]
fn random_reads_come_from_the_block_cache_and_never_stale() {
    let mut cluster = Cluster::start(6, "4+2", 256);
    let mount_metrics = cluster.nodes.iter().find(|n| n.role == "mount").unwrap().metrics.clone().unwrap();
    let hits =
        || support::metric(&support::scrape(&mount_metrics), "cairn_client_block_cache_hits_total", &[]);
    let path = cluster.mnt.join("random");
    let mut model = random_bytes(2 * UNIT + 1000, 21);
    fs::write(&path, &model).unwrap();
    // 200 distinct pages in random order (never page 0: a read at 0 counts as sequential),
    // so no read of a pass finds its page in the kernel's cache because of another one.
    let mut rng = support::Rng(5);
    let mut pages: Vec<u64> = (1..model.len() as u64 / 4096).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let offsets: Vec<u64> = pages[..200].iter().map(|p| p * 4096).collect();
    random_reads(&path, &offsets, &model);
    let after_first = hits().unwrap_or(0.0);
    random_reads(&path, &offsets, &model);
    let after_second = hits().expect("block cache hits counted");
    // Kernel readahead may merge a few reads; most must be answered from the cache.
    assert!(after_second - after_first >= 100.0, "second pass: {after_first} -> {after_second} hits");

    // Another client rewrites part of the file; this one reopens (close-to-open) and must see
    // the new bytes, not the blocks it cached of the old version.
    let other = support::Mount::new(&cluster, "other");
    let patch = random_bytes(UNIT, 22);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(other.dir.join("random")).unwrap();
        f.write_all_at(&patch, 300_000).unwrap();
    }
    model[300_000..300_000 + UNIT].copy_from_slice(&patch);
    random_reads(&path, &offsets, &model);
    // And a rewrite through this client, then with one chunkserver gone (cached blocks and
    // reconstruction together).
    let patch = random_bytes(5000, 23);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&patch, UNIT as u64 + 77).unwrap();
    }
    model[UNIT + 77..UNIT + 77 + 5000].copy_from_slice(&patch);
    random_reads(&path, &offsets, &model);
    kill9(cluster.chunk_pids()[0]);
    random_reads(&path, &offsets, &model);
    drop(other);
    cluster.stop();
}

#[test]
fn stripes_written_in_the_background_read_back_and_take_overwrites() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    // 64 KiB units: 256 KiB stripes, so a few MiB keep several stripe writes in flight.
    let cluster = Cluster::start(6, "4+2", 64);
    let stripe = 4 * 64 * 1024;
    let path = cluster.mnt.join("behind");
    let mut model = random_bytes(10 * stripe + 123, 31);
    let mut f =
        fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    for chunk in model.chunks(100_000) {
        f.write_all(chunk).unwrap();
    }
    // Before any flush: overwrite an early stripe and the last full one (likely still being
    // written), then read everything back through the client (not the kernel's cache).
    for (at, seed) in [(5usize, 32u64), (9 * stripe + 7, 33)] {
        let patch = random_bytes(70_000, seed);
        f.write_all_at(&patch, at as u64).unwrap();
        model[at..at + patch.len()].copy_from_slice(&patch);
    }
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let mut back = vec![0u8; model.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(sha256(&back), sha256(&model), "read back before close");
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&model), "after close");
    let other = support::Mount::new(&cluster, "other");
    assert_eq!(sha256(&fs::read(other.dir.join("behind")).unwrap()), sha256(&model), "another client");
}

#[test]
fn grpc_and_wire_clients_share_one_port_and_one_namespace() {
    // The `cairn up` mount talks the wire protocol (the default); a second client talks gRPC to
    // the same ports. Each reads what the other wrote, big files and small, byte-exact.
    let cluster = Cluster::start(6, "4+2", 64);
    let grpc = support::Mount::with_env(&cluster, "grpc", &[], &[("CAIRN_TRANSPORT", "grpc")]);
    for (i, size) in [0usize, 1, 5000, 2 << 20].into_iter().enumerate() {
        let data = random_bytes(size, 40 + i as u64);
        fs::write(cluster.mnt.join(format!("wire-{size}")), &data).unwrap();
        fs::write(grpc.dir.join(format!("grpc-{size}")), &data).unwrap();
        for path in [grpc.dir.join(format!("wire-{size}")), cluster.mnt.join(format!("grpc-{size}"))] {
            assert_eq!(sha256(&fs::read(&path).unwrap()), sha256(&data), "{}", path.display());
        }
    }
    let mut names: Vec<_> = fs::read_dir(&grpc.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names.len(), 8);
    // Each client's requests arrived over its own transport.
    let meta = cluster.nodes.iter().find(|n| n.role == "meta").unwrap().metrics.clone().unwrap();
    let text = support::scrape(&meta);
    for transport in ["wire", "grpc"] {
        let label = format!("transport=\"{transport}\"");
        let creates = support::metric(&text, "cairn_rpc_requests_total", &["method=\"Create\"", &label]);
        assert!(creates.unwrap_or(0.0) >= 4.0, "creates over {transport}: {creates:?}");
    }
    let grpc_writes: f64 = cluster
        .nodes
        .iter()
        .filter(|n| n.role == "chunk")
        .filter_map(|n| {
            let text = support::scrape(n.metrics.as_ref().unwrap());
            support::metric(
                &text,
                "cairn_rpc_requests_total",
                &["method=\"WriteShard\"", "transport=\"grpc\""],
            )
        })
        .sum();
    assert!(grpc_writes >= 3.0, "shard writes over gRPC: {grpc_writes}");

    // Admin commands work over either transport; a transport name that is neither is refused.
    for transport in ["wire", "grpc"] {
        let out =
            cluster.cairn().args(["status", "--json"]).env("CAIRN_TRANSPORT", transport).output().unwrap();
        assert!(out.status.success(), "{transport}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = cluster.cairn().args(["status"]).env("CAIRN_TRANSPORT", "carrier-pigeon").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CAIRN_TRANSPORT"), "{out:?}");
}

#[test]
fn fsync_of_a_clean_file_or_a_directory_makes_the_namespace_durable() {
    // Under the default `sync_mode = "commit"` a create is answered before its WAL fsync; an
    // fsync(2) with nothing to commit, and an fsync of a directory, ask the metaserver to sync.
    // An fsync that commits written data needs no extra request (the commit is durable).
    let cluster = Cluster::start(6, "4+2", 64);
    let meta = cluster.nodes.iter().find(|n| n.role == "meta").unwrap().metrics.clone().unwrap();
    let syncs = || {
        support::metric(
            &support::scrape(&meta),
            "cairn_rpc_requests_total",
            &["method=\"Sync\"", "code=\"Ok\""],
        )
        .unwrap_or(0.0)
    };
    let dir = cluster.mnt.join("d");
    fs::create_dir(&dir).unwrap();
    let f = fs::File::create(dir.join("empty")).unwrap();
    let before = syncs();
    f.sync_all().unwrap();
    assert_eq!(syncs(), before + 1.0, "fsync of a clean file");
    fs::File::open(&dir).unwrap().sync_all().unwrap();
    assert_eq!(syncs(), before + 2.0, "fsync of a directory");
    let mut g = fs::File::create(dir.join("data")).unwrap();
    g.write_all(b"bytes").unwrap();
    g.sync_all().unwrap();
    assert_eq!(syncs(), before + 2.0, "an fsync that commits data needs no sync request");
    drop((f, g));
    assert_eq!(fs::read(dir.join("data")).unwrap(), b"bytes");
}

/// The FUSE bdi of the mount at `dir` (`MAJOR:MINOR`), whose `read_ahead_kb` is the kernel's
/// read-ahead for it.
fn bdi_of(dir: &std::path::Path) -> String {
    let dev = fs::metadata(dir).unwrap().dev();
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

#[test]
fn sequential_readers_fetch_each_stripe_once_whatever_the_kernels_read_ahead() {
    // Stripes of 256 KiB: a 24 MiB file is 96 of them, so the read-ahead window (starting at
    // two stripes, up to 64 MiB) grows and the kernel's 16 MiB read-ahead spans 64 stripes,
    // its requests answered in any order by the mount's threads.
    let mut cluster = Cluster::start(6, "4+2", 64);
    let data = random_bytes(24 << 20, 41);
    write_and_close(&cluster.mnt.join("big"), &data).unwrap();
    // With the kernel's default read-ahead every request continues the last one; with 16 MiB,
    // requests race each other from the start and some are served as random reads (from the
    // block cache, not fetched whole) until two in a row continue each other.
    for (name, read_ahead_kb, least) in [("ra-small", 128, 0.95), ("ra-large", 16384, 0.5)] {
        // A mount of its own: nothing of the file in its page cache, every byte through FUSE.
        let metrics = support::free_addr();
        let mount = support::Mount::with_args(&cluster, name, &["--metrics", &metrics, "--threads", "8"]);
        fs::write(format!("/sys/class/bdi/{}/read_ahead_kb", bdi_of(&mount.dir)), read_ahead_kb.to_string())
            .unwrap();
        let mut back = Vec::with_capacity(data.len());
        let mut f = fs::File::open(mount.dir.join("big")).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            back.extend_from_slice(&buf[..n]);
        }
        assert!(back == data, "{name}: the file read back differs");
        let text = support::scrape(&metrics);
        let fetched = support::metric(&text, "cairn_client_stripe_fetched_bytes_total", &[]).unwrap_or(0.0);
        let ratio = fetched / data.len() as f64;
        // Every stripe is needed once (and by read-ahead, not fetched again for a request that
        // came late). Below 1: requests served as random reads.
        assert!((least..1.07).contains(&ratio), "{name}: fetched {ratio:.2}x the file's bytes");
        let stalls = support::metric(&text, "cairn_client_readahead_stalls_total", &[]);
        eprintln!("{name}: fetched {ratio:.3}x, read-ahead caught up with {stalls:?} times");
    }
    cluster.stop();
}
