//! The admin CLI and the ways of mounting, against a live local cluster: `cairn info`,
//! `layout get|set`, `stats`, `bench`, the `mount.cairn` helper, `mount --background`,
//! `umount`, and server settings from environment variables and `--set` flags.

mod support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{cli_json, eventually, is_mounted, random_bytes, sha256, Cluster, CAIRN};

/// Shard files under chunkserver `addr`'s data dir (`data/chunk-N`, N from `cluster.json`).
fn shard_files_on(cluster: &Cluster, addr: &str) -> usize {
    let text = fs::read_to_string(cluster.data.join("cluster.json")).unwrap();
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ports: Vec<u64> =
        file["chunk_ports"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
    let port: u64 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let n = ports.iter().position(|&p| p == port).expect("a chunkserver of this cluster") + 1;
    let dir = cluster.data.join(format!("chunk-{n}"));
    cluster.shard_files().iter().filter(|p| p.starts_with(&dir)).count()
}

#[test]
fn info_and_layout_answer_where_a_file_lives_and_how_new_ones_are_coded() {
    let cluster = Cluster::start(6, "4+2", 256);
    let data = random_bytes(3 << 20, 700);
    fs::write(cluster.mnt.join("f"), &data).unwrap();

    // info: the inode the kernel shows, the layout, 3 stripes of 1 MiB, 18 shards, and for each
    // chunkserver named, exactly the shard files found on its disk.
    let (code, info) = cli_json(&cluster, &["info", cluster.mnt.join("f").to_str().unwrap()]);
    assert_eq!(code, 0, "{info}");
    assert_eq!(info["ino"].as_u64().unwrap(), fs::metadata(cluster.mnt.join("f")).unwrap().ino());
    assert_eq!((info["type"].as_str(), info["size"].as_u64()), (Some("file"), Some(3 << 20)));
    assert_eq!((info["layout"]["k"].as_u64(), info["layout"]["m"].as_u64()), (Some(4), Some(2)));
    assert_eq!(info["layout"]["unit"].as_u64(), Some(256 << 10));
    assert_eq!((info["stripes"].as_u64(), info["degraded_stripes"].as_u64()), (Some(3), Some(0)));
    let nodes = info["nodes"].as_array().unwrap();
    let shards: u64 = nodes.iter().map(|n| n["shards"].as_u64().unwrap()).sum();
    let bytes: u64 = nodes.iter().map(|n| n["bytes"].as_u64().unwrap()).sum();
    assert_eq!((shards, bytes), (18, (3 << 20) / 4 * 6));
    for n in nodes {
        let addr = n["addr"].as_str().unwrap();
        assert_eq!(shard_files_on(&cluster, addr) as u64, n["shards"].as_u64().unwrap(), "{n}");
        assert_eq!(n["up"], true);
    }
    assert_eq!(info["stripe_list"].as_array().unwrap().len(), 3);
    // The same through a path inside the namespace (no mount needed), and in human form.
    let (code, by_name) = cli_json(&cluster, &["info", "/f"]);
    assert_eq!((code, &by_name["ino"]), (0, &info["ino"]));
    let out = cluster.cli(&["info", cluster.mnt.join("f").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shards by chunkserver") && text.contains("d0@"), "{text}");

    // layout: a directory's layout is inherited by what is created in it from then on.
    let dir = cluster.mnt.join("small");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("before"), b"old layout").unwrap();
    let (code, got) = cli_json(&cluster, &["layout", "get", dir.to_str().unwrap()]);
    assert_eq!((code, got["k"].as_u64(), got["m"].as_u64()), (0, Some(4), Some(2)));
    let (code, set) =
        cli_json(&cluster, &["layout", "set", dir.to_str().unwrap(), "--ec", "2+1", "--unit", "64K"]);
    assert_eq!(code, 0, "{set}");
    assert_eq!((set["k"].as_u64(), set["m"].as_u64(), set["unit"].as_u64()), (Some(2), Some(1), Some(65536)));
    let small = random_bytes(300_000, 701);
    fs::write(dir.join("after"), &small).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    let layout_of = |p: &Path| {
        let (code, v) = cli_json(&cluster, &["info", p.to_str().unwrap()]);
        assert_eq!(code, 0, "{v}");
        (v["layout"]["k"].as_u64().unwrap(), v["layout"]["m"].as_u64().unwrap())
    };
    assert_eq!(layout_of(&dir.join("after")), (2, 1));
    assert_eq!(layout_of(&dir.join("sub")), (2, 1), "a new subdirectory inherits");
    assert_eq!(layout_of(&dir.join("before")), (4, 2), "files already there keep theirs");
    assert_eq!(layout_of(&cluster.mnt.join("f")), (4, 2));
    assert_eq!(sha256(&fs::read(dir.join("after")).unwrap()), sha256(&small));
    // Only the unit changes: k+m stay.
    let (_, set) = cli_json(&cluster, &["layout", "set", "/small", "--unit", "128K"]);
    assert_eq!((set["k"].as_u64(), set["unit"].as_u64()), (Some(2), Some(131072)));

    // Refused, with the reason, and nothing changes.
    let out = cluster.cli(&["layout", "set", dir.to_str().unwrap(), "--ec", "8+2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("needs 10 chunkservers"), "{err}");
    let out = cluster.cli(&["layout", "set", cluster.mnt.join("f").to_str().unwrap(), "--ec", "2+1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not a directory"), "{err}");
    let out = cluster.cli(&["layout", "set", "/small", "--unit", "1000"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("multiple of"));
    let out = cluster.cli(&["info", "/nope"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("/nope"));
    // A local file that is not on a Cairn mount: said so, not "no entry \"etc\" in 1".
    let local = cluster.root.path().join("local-file");
    fs::write(&local, b"x").unwrap();
    for args in [vec!["info", local.to_str().unwrap()], vec!["warmup", "--status", local.to_str().unwrap()]] {
        let out = cluster.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("is not on a Cairn mount (it is on "),
            "{args:?}: {err}"
        );
    }
    assert_eq!(layout_of(&dir), (2, 1));
}

#[test]
fn stats_shows_io_while_it_happens() {
    let cluster = Cluster::start(6, "4+2", 256);
    let mut stats = cluster
        .cairn()
        .args(["stats", "--meta", &cluster.meta_addr, "--interval", "1", "--count", "10", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The I/O starts once the first interval was printed: its first sample was taken before,
    // so every request falls in the intervals measured (a busy machine may take seconds to
    // start the command and connect).
    let mut printed = std::io::BufReader::new(stats.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut printed, &mut first).unwrap();
    let data = random_bytes(8 << 20, 710);
    fs::write(cluster.mnt.join("s"), &data).unwrap();
    for i in 0..20 {
        fs::write(cluster.mnt.join(format!("m{i}")), b"x").unwrap();
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut printed, &mut rest).unwrap();
    let out = stats.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        first.lines().chain(rest.lines()).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 10);
    let total = |key: &str| -> f64 {
        lines.iter().map(|l| l[key].as_f64().unwrap() * l["interval_secs"].as_f64().unwrap()).sum()
    };
    // 8 MiB of data is 12 MiB of shards with 4+2 (plus the small files).
    assert!(total("write_bytes_per_sec") >= 0.95 * (12 << 20) as f64, "{lines:?}");
    assert!(total("writes_per_sec") >= 48.0, "{lines:?}");
    assert!(total("meta_requests_per_sec") >= 40.0, "20 creates and their commits: {lines:?}");
    assert!(lines.iter().all(|l| l["nodes_up"] == 6 && l["degraded_stripes"] == 0), "{lines:?}");
    let out = cluster.cli(&["stats", "--count", "1", "--interval", "0.2"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("meta req/s"));
}

#[test]
fn bench_measures_every_phase_and_cleans_up() {
    let cluster = Cluster::start(6, "4+2", 256);
    let (code, report) = cli_json(
        &cluster,
        &[
            "bench",
            cluster.mnt.to_str().unwrap(),
            "--big-file-size",
            "8M",
            "--small-files",
            "20",
            "--small-file-size",
            "16K",
            "-p",
            "2",
        ],
    );
    assert_eq!(code, 0, "{report}");
    let phases = report["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["write big file", "read big file", "write small files", "read small files", "stat files"]
    );
    assert_eq!(phases[0]["bytes"].as_u64(), Some(16 << 20));
    assert_eq!(phases[1]["bytes"].as_u64(), Some(16 << 20));
    assert_eq!((phases[3]["ops"].as_u64(), phases[3]["bytes"].as_u64()), (Some(40), Some(40 * 16384)));
    assert!(phases.iter().all(|p| p["seconds"].as_f64().unwrap() > 0.0));
    assert_eq!(fs::read_dir(&cluster.mnt).unwrap().count(), 0, "bench leaves nothing behind");
    // A directory that is not there: a clear error.
    let out = cluster.cli(&["bench", "/nonexistent/dir/x", "--small-files", "1"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("/nonexistent"));
}

/// The pid in `mounted ... (pid N, log ...)`.
fn daemon_pid(stdout: &[u8]) -> u32 {
    let text = String::from_utf8_lossy(stdout);
    let at = text.find("(pid ").unwrap_or_else(|| panic!("no pid in {text:?}")) + 5;
    text[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn wait_gone(pid: u32) {
    eventually(20, "the mount daemon exits after the unmount", || {
        fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| s.contains("State:\tZ"))
    });
}

#[test]
fn mount_helper_background_mount_and_umount() {
    let cluster = Cluster::start(6, "4+2", 256);
    let bin = cluster.root.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("mount.fuse.cairn");
    std::os::unix::fs::symlink(CAIRN, &helper).unwrap();
    let dir = cluster.root.path().join("helper-mnt");
    fs::create_dir_all(&dir).unwrap();
    let log = cluster.root.path().join("helper.log");

    // As mount(8) runs it for `mount -t fuse.cairn` or an fstab line.
    let out = Command::new(&helper)
        .arg(format!("cairn:{}", cluster.meta_addr))
        .arg(&dir)
        .args([
            "-o",
            &format!(
                "rw,_netdev,noauto,x-systemd.automount,threads=2,log={},tls={}",
                log.display(),
                cluster.tls("client").display()
            ),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&dir), "mounted when the helper returns");
    let pid = daemon_pid(&out.stdout);
    let data = random_bytes(1_500_000, 720);
    fs::write(dir.join("via-helper"), &data).unwrap();
    assert_eq!(sha256(&fs::read(cluster.mnt.join("via-helper")).unwrap()), sha256(&data));
    // Mounting over a mount is refused; umount unmounts and the daemon exits.
    let again = Command::new(&helper).arg(&cluster.meta_addr).arg(&dir).output().unwrap();
    assert_eq!(again.status.code(), Some(32));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already mounted"));
    let out = cluster.cli(&["umount", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&dir));
    wait_gone(pid);
    let out = cluster.cli(&["umount", dir.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nothing is mounted"));

    // Bad options are named; an unreachable metaserver fails with the daemon's reason, promptly.
    let out = Command::new(&helper)
        .arg(&cluster.meta_addr)
        .arg(&dir)
        .args(["-o", "threads=2,bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(32));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
    let started = Instant::now();
    let out = Command::new(CAIRN)
        .args(["mount", "--plaintext", "--background", "--meta", "127.0.0.1:1", "--log"])
        .arg(&log)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("metaserver"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!is_mounted(&dir));

    // A background mount of the cluster at `dir` with `flags`; the daemon's pid.
    let mount_with = |flags: &[&str]| {
        let out = Command::new(CAIRN)
            .args(["mount", "--background", "--meta", &cluster.meta_addr, "--log"])
            .env("CAIRN_TLS", cluster.tls("client"))
            .arg(&log)
            .args(flags)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        daemon_pid(&out.stdout)
    };
    // Read-only: reads work, every change is EROFS.
    let pid = mount_with(&["--read-only"]);
    assert_eq!(sha256(&fs::read(dir.join("via-helper")).unwrap()), sha256(&data));
    let e = fs::write(dir.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    // Mounts ignore setuid bits and device nodes unless asked (a setuid-root binary planted
    // through another client host must not run as root here).
    let flags = mount_flags(&dir);
    assert!(["ro", "nosuid", "nodev"].iter().all(|f| flags.iter().any(|g| g == f)), "{flags:?}");
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    assert!(cluster.cli(&["umount", "--lazy", dir.to_str().unwrap()]).status.success());
    wait_gone(pid);

    // Asked for: setuid bits and devices honoured, nothing executed. (Only root may mount
    // with them: fusermount forces nosuid,nodev for everyone else.)
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let pid = mount_with(&["--suid", "--dev", "--noexec"]);
    let flags = mount_flags(&dir);
    assert!(flags.contains(&"noexec".to_string()), "{flags:?}");
    assert!(!flags.iter().any(|f| f == "nosuid" || f == "nodev" || f == "ro"), "{flags:?}");
    assert!(cluster.cli(&["umount", "--lazy", dir.to_str().unwrap()]).status.success());
    wait_gone(pid);

    // The real mount(8), when this test may install the helper where mount(8) looks for it.
    let system_helper = Path::new("/usr/sbin/mount.fuse.cairn");
    if unsafe { libc::geteuid() } == 0
        && !system_helper.exists()
        && std::os::unix::fs::symlink(CAIRN, system_helper).is_ok()
    {
        let out = Command::new("mount")
            .args(["-t", "fuse.cairn", "-o"])
            .arg(format!("threads=2,log={},tls={}", log.display(), cluster.tls("client").display()))
            .arg(&cluster.meta_addr)
            .arg(&dir)
            .output()
            .unwrap();
        let _ = fs::remove_file(system_helper);
        assert!(out.status.success(), "mount -t fuse.cairn: {}", String::from_utf8_lossy(&out.stderr));
        assert!(is_mounted(&dir));
        let pid = daemon_pid(&out.stdout);
        assert_eq!(sha256(&fs::read(dir.join("via-helper")).unwrap()), sha256(&data));
        assert!(Command::new("umount").arg(&dir).status().unwrap().success());
        wait_gone(pid);
    }
}

#[test]
fn servers_take_every_setting_from_env_and_flags_and_name_bad_ones() {
    let out = Command::new(CAIRN).args(["meta", "--set", "listn=127.0.0.1:1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--set listn") && err.contains("unknown field"), "{err}");
    let out = Command::new(CAIRN).args(["chunk"]).env("CAIRN_CHUNK_QUEUE_DEPTH", "deep").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("CAIRN_CHUNK_QUEUE_DEPTH=deep"), "{err}");

    // A metaserver with no config file at all: address and data dir from flags, the layout
    // from the environment. It refuses a data directory without its data until `cairn meta
    // init` made one; then it serves, with that layout.
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let meta_cmd = |args: &[&str]| {
        let mut cmd = Command::new(CAIRN);
        cmd.args(["meta"])
            .args(args)
            .args(["--set", &format!("listen={addr}"), "--set"])
            .arg(format!("data_dir={}", dir.path().join("meta").display()))
            .env("CAIRN_META_EC", "2+1")
            .env("CAIRN_META_UNIT", "65536")
            .env("CAIRN_META_PLAINTEXT", "true");
        cmd
    };
    let out = meta_cmd(&[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds no namespace") && err.contains("cairn meta init"),
        "{err}"
    );
    assert!(!dir.path().join("meta").exists(), "nothing was made");
    let out = meta_cmd(&["init"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("made a new, empty namespace"), "{said} {out:?}");
    let out = meta_cmd(&["init"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not empty"), "init twice: {err}");
    let meta =
        meta_cmd(&[]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap();
    let _guard = support::KillOnDrop(Some(meta));
    let mut status = serde_json::Value::Null;
    eventually(30, "the metaserver answers", || {
        let out =
            Command::new(CAIRN).args(["df", "--plaintext", "--json", "--meta", &addr]).output().unwrap();
        status = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.success()
    });
    assert_eq!(status["ec"], "2+1", "{status}");
    assert!(dir.path().join("meta").is_dir());
}

/// The mount options the kernel shows for the mount at `dir` (`/proc/self/mounts`).
fn mount_flags(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not mounted:\n{mounts}", dir.display()));
    line.split(' ').nth(3).unwrap().split(',').map(str::to_string).collect()
}
