//! What `close` and `fsync` guarantee (`durability=close`, the default; docs/ARCHITECTURE.md,
//! "Durability"): chunkservers killed between a close and their flush, a power loss of every
//! chunkserver emulated with `test_power_loss`, and a chunkserver whose disk fails its fsyncs.

use super::*;

/// The flush interval of these tests: long enough that nothing is flushed by the timer while a
/// test runs, so what is on disk is exactly what an fsync (or a durable write) put there.
const NEVER: &str = "60000";

fn write_file(path: &Path, data: &[u8], fsync: bool) {
    let mut f = fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(data).unwrap();
    if fsync {
        f.sync_all().unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
    }
    let fd = f.into_raw_fd();
    assert_eq!(unsafe { libc::close(fd) }, 0, "close {}", path.display());
}

/// Kill every chunkserver with `kill -9` and start them again (with the cluster's environment),
/// waiting until all are up. Returns the guards of the restarted processes.
fn kill_and_restart_all(cluster: &Cluster, chunkservers: usize) -> Vec<KillOnDrop> {
    let nodes: Vec<_> = (1..=chunkservers).map(|n| cluster.chunk_node(n)).collect();
    for node in &nodes {
        kill9(node.pid);
    }
    // A killed process is reported dead (its leader thread a zombie) a moment before its last
    // thread has closed the listening socket: wait until each port is free again.
    for node in &nodes {
        eventually(10, "the killed chunkserver's port is free", || {
            std::net::TcpListener::bind(node.addr.as_str()).is_ok()
        });
    }
    let revived: Vec<KillOnDrop> = (1..=chunkservers)
        .map(|n| KillOnDrop(Some(restart_server(cluster, "chunk", &format!("chunk-{n}")))))
        .collect();
    // Serving again (the metaserver may not even have noticed the deaths yet, so its count of
    // nodes up says nothing until each restarted process has opened its store).
    eventually(60, "every restarted chunkserver serves", || {
        (1..=chunkservers).all(|n| {
            fs::read_to_string(cluster.data.join(format!("logs/chunk-{n}-restarted.log")))
                .is_ok_and(|log| log.contains("chunkserver serving"))
        })
    });
    eventually(60, "every chunkserver is up again", || status(cluster)["nodes_up"] == chunkservers as u64);
    revived
}

/// Files acknowledged by close alone (nothing flushed them: the flush interval is a minute)
/// survive `kill -9` of every chunkserver and of the client: the shards were in the
/// chunkservers' page cache, which outlives their processes, and the commit in the
/// metaserver's log. Read back byte for byte through a fresh client.
#[test]
fn close_survives_every_process_killed() {
    let cluster = Cluster::start_env(6, "4+2", 64, &[], &[("CAIRN_CHUNK_FLUSH_INTERVAL_MS", NEVER)]);
    let mut client = Mount::new(&cluster, "writer");
    let files: Vec<(PathBuf, Vec<u8>)> = (0..6u64)
        .map(|i| {
            (client.dir.join(format!("f{i}")), random_bytes(1 + (i as usize * 97_331) % 700_000, 300 + i))
        })
        .collect();
    for (path, data) in &files {
        write_file(path, data, false);
    }
    let unflushed: f64 = cluster
        .nodes
        .iter()
        .filter(|n| n.role == "chunk")
        .filter_map(|n| {
            support::metric(&support::scrape(n.metrics.as_deref()?), "cairn_chunk_unflushed_shards", &[])
        })
        .sum();
    assert!(unflushed > 0.0, "the closes left shards for the flusher (the test relies on it)");
    client.kill9();
    let _revived = kill_and_restart_all(&cluster, 6);
    let fresh = Mount::new(&cluster, "reader");
    for (path, data) in &files {
        let back = fs::read(fresh.dir.join(path.file_name().unwrap()))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(back == *data, "{} read back different bytes", path.display());
    }
}

/// A power loss of every chunkserver (emulated: `test_power_loss` deletes at restart every shard
/// the flusher had not put on disk): files fsynced before it are whole, a file reopened and
/// fsynced after an unsynced close too (the fsync flushes what the earlier close left), and a
/// file only closed after them is lost as the documented window says: reads fail with EIO,
/// never return other bytes.
#[test]
fn power_loss_takes_back_only_what_was_not_fsynced() {
    let env = [("CAIRN_CHUNK_FLUSH_INTERVAL_MS", NEVER), ("CAIRN_CHUNK_TEST_POWER_LOSS", "true")];
    let cluster = Cluster::start_env(6, "4+2", 64, &[], &env);
    let mnt = &cluster.mnt;
    let synced = random_bytes(600_000, 1);
    write_file(&mnt.join("synced"), &synced, true);
    let reopened = random_bytes(333_333, 2);
    write_file(&mnt.join("reopened"), &reopened, false);
    let f = fs::OpenOptions::new().read(true).open(mnt.join("reopened")).unwrap();
    f.sync_all().expect("fsync of a file closed earlier");
    drop(f);
    let small = random_bytes(3_000, 3);
    write_file(&mnt.join("small-synced"), &small, true);
    // Only closed, after every fsync: nothing has flushed its shards.
    let closed = random_bytes(400_000, 4);
    write_file(&mnt.join("closed"), &closed, false);

    let _revived = kill_and_restart_all(&cluster, 6);
    let logs = fs::read_to_string(cluster.data.join("logs/chunk-1-restarted.log")).unwrap_or_default();
    assert!(logs.contains("test_power_loss"), "the restart emulated a power loss:\n{logs}");
    let fresh = Mount::new(&cluster, "reader");
    for (name, data) in [("synced", &synced), ("reopened", &reopened), ("small-synced", &small)] {
        let back =
            fs::read(fresh.dir.join(name)).unwrap_or_else(|e| panic!("{name} after the power loss: {e}"));
        assert!(back == *data, "{name} read back different bytes after the power loss");
    }
    let lost = fs::read(fresh.dir.join("closed"));
    match lost {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "closed: {e}"),
        Ok(back) => panic!(
            "a file only closed read back {} bytes after every chunkserver lost power (equal: {})",
            back.len(),
            back == closed
        ),
    }
}

/// A tmpfs holding an ext4 image, loop-mounted as one chunkserver's disk: undone when dropped
/// (after the cluster, which is declared later and so dropped first), then the test's root is
/// removed.
struct FailingDisk {
    backing: PathBuf,
    disk: PathBuf,
    dev: Option<String>,
    root: PathBuf,
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.disk).status();
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.backing).status();
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Chunkserver 1 keeps its data on an ext4 image whose backing file lives on a small tmpfs;
/// once the tmpfs is full, the chunkserver's shard writes still land in its page cache but
/// their writeback fails. An fsync of a file with shards there fails with EIO, the failed
/// flush is counted, and a file fsynced before still reads back.
#[test]
fn a_failed_flush_on_a_chunkserver_fails_fsync_with_eio() {
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if !succeeds(Command::new(tool).arg("-V")) {
            println!("skipped: {tool} is not available");
            return;
        }
    }
    let root = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/tmp").unwrap();
    let mut guard = FailingDisk {
        backing: root.path().join("backing"),
        disk: root.path().join("data/chunk-1"),
        dev: None,
        root: root.path().to_path_buf(),
    };
    fs::create_dir_all(&guard.backing).unwrap();
    fs::create_dir_all(&guard.disk).unwrap();
    if !succeeds(Command::new("mount").args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"]).arg(&guard.backing)) {
        println!("skipped: cannot mount a tmpfs");
        return;
    }
    let image = guard.backing.join("disk.img");
    assert!(succeeds(Command::new("truncate").args(["-s", "1G"]).arg(&image)));
    assert!(
        succeeds(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"])
                .arg(&image)
        ),
        "mkfs.ext4 on the tmpfs"
    );
    let out = Command::new("losetup").args(["--find", "--show"]).arg(&image).output().unwrap();
    if !out.status.success() {
        println!("skipped: no loop device: {}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    guard.dev = Some(dev.clone());
    assert!(succeeds(Command::new("mount").args(["-o", "errors=continue"]).arg(&dev).arg(&guard.disk)));

    let cluster = Cluster::start_prepared(root, 6, "4+2", 64, &["--write-wait-ms", "5000"]);
    let before = random_bytes(500_000, 11);
    write_file(&cluster.mnt.join("before"), &before, true);
    // Fill the tmpfs: the image cannot grow any more, so writeback to chunkserver 1's disk fails.
    let filled = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "status=none"])
        .arg(format!("of={}", guard.backing.join("ballast").display()))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!filled.success(), "dd stops when the tmpfs is full");
    let data = random_bytes(1 << 20, 12);
    let mut f = fs::File::create(cluster.mnt.join("after")).unwrap();
    f.write_all(&data).unwrap();
    let e = f.sync_all().expect_err("fsync while a chunkserver cannot flush");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(f);
    let back = fs::read(cluster.mnt.join("before")).unwrap();
    assert!(back == before, "a file fsynced before the disk failed reads back");
    let failures = support::metric(
        &support::scrape(cluster.chunk_node(1).metrics.as_deref().unwrap()),
        "cairn_chunk_flush_failures_total",
        &[],
    );
    assert!(failures.is_some_and(|n| n >= 1.0), "the failed flush is counted: {failures:?}");
    drop(cluster);
    drop(guard);
}
