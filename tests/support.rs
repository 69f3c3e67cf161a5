//! Test harness: a real local cluster started with `cairn up` (metaserver and chunkservers as
//! separate processes on 127.0.0.1, a real FUSE mount in a temp dir). Every wait polls with a
//! deadline; nothing sleeps as synchronisation.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

#[derive(Clone, Debug)]
pub struct Node {
    pub role: String,
    pub id: String,
    pub addr: String,
    pub pid: u32,
    /// Where its Prometheus metrics are served (`host:port`).
    pub metrics: Option<String>,
}

pub struct Cluster {
    pub root: tempfile::TempDir,
    pub data: PathBuf,
    pub mnt: PathBuf,
    pub nodes: Vec<Node>,
    pub meta_addr: String,
    up: Option<Child>,
    args: Vec<String>,
    /// Environment of `cairn up` (and so of every server it starts).
    env: Vec<(String, String)>,
}

impl Cluster {
    /// Start `cairn up` with `chunkservers` nodes and the given EC spec, and wait until ready.
    pub fn start(chunkservers: u32, ec: &str, unit_kib: u32) -> Cluster {
        Cluster::start_in(Path::new("/tmp"), chunkservers, ec, unit_kib)
    }

    /// Like [`Cluster::start`], with the cluster's directories under `parent`.
    pub fn start_in(parent: &Path, chunkservers: u32, ec: &str, unit_kib: u32) -> Cluster {
        Cluster::start_with(parent, chunkservers, ec, unit_kib, &[])
    }

    /// Like [`Cluster::start_in`], with extra `cairn up` arguments.
    pub fn start_with(parent: &Path, chunkservers: u32, ec: &str, unit_kib: u32, extra: &[&str]) -> Cluster {
        let root = tempfile::Builder::new().prefix("cairn-test-").tempdir_in(parent).expect("tempdir");
        Cluster::start_prepared(root, chunkservers, ec, unit_kib, extra)
    }

    /// (Re)start `cairn up` on this cluster's data dir.
    pub fn restart(&mut self) {
        assert!(self.up.is_none(), "cluster already running");
        let mut child = Command::new(CAIRN)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cairn up");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut nodes = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    panic!("cairn up did not get ready; logs in {}", self.data.join("logs").display());
                }
            };
            if line.starts_with("ready:") {
                self.meta_addr = line
                    .split("metaserver ")
                    .nth(1)
                    .and_then(|s| s.split([';', ' ']).next())
                    .unwrap()
                    .to_string();
                break;
            }
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() >= 4 && ["meta", "chunk", "mount"].contains(&cols[0]) {
                nodes.push(Node {
                    role: cols[0].into(),
                    id: cols[1].into(),
                    addr: cols[2].into(),
                    pid: cols[3].parse().expect("pid"),
                    metrics: cols.get(4).filter(|m| m.contains(':')).map(|m| m.to_string()),
                });
            }
        }
        self.nodes = nodes;
        self.up = Some(child);
    }

    /// Stop `cairn up` with SIGTERM and wait until it has unmounted and exited.
    pub fn stop(&mut self) {
        let Some(mut child) = self.up.take() else { return };
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "cairn up exited with {status}");
                break;
            }
            assert!(Instant::now() < deadline, "cairn up did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!is_mounted(&self.mnt), "mount left behind");
    }

    pub fn chunk_pids(&self) -> Vec<u32> {
        self.nodes.iter().filter(|n| n.role == "chunk").map(|n| n.pid).collect()
    }

    pub fn pid_of(&self, role: &str) -> u32 {
        self.nodes.iter().find(|n| n.role == role).expect("role").pid
    }

    /// Run `cairn <args>` against this cluster's metaserver, as an admin.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cairn().args(args).output().expect("run cairn")
    }

    /// `cairn` with this cluster's metaserver and an admin's identity in its environment.
    pub fn cairn(&self) -> Command {
        let mut cmd = Command::new(CAIRN);
        cmd.env("CAIRN_META", &self.meta_addr).env("CAIRN_TLS", self.tls("admin"));
        cmd
    }

    /// The TLS directory `cairn up` made for `name` (`admin`, `client`, `meta-1`, `chunk-2`).
    pub fn tls(&self, name: &str) -> PathBuf {
        self.data.join("tls").join(name)
    }

    /// Bytes of all shard files (headers included) under the chunkservers' data dirs.
    pub fn stored_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(rd) = std::fs::read_dir(p) else { return 0 };
            rd.filter_map(Result::ok)
                .map(|e| {
                    let md = e.metadata().expect("metadata");
                    if md.is_dir() {
                        walk(&e.path())
                    } else if e.file_name().to_string_lossy().ends_with(".shard") {
                        md.len()
                    } else {
                        0
                    }
                })
                .sum()
        }
        walk(&self.data)
    }

    /// Paths of every shard file.
    pub fn shard_files(&self) -> Vec<PathBuf> {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            let Ok(rd) = std::fs::read_dir(p) else { return };
            for e in rd.filter_map(Result::ok) {
                if e.path().is_dir() {
                    walk(&e.path(), out);
                } else if e.file_name().to_string_lossy().ends_with(".shard") {
                    out.push(e.path());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.data, &mut out);
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Keep the logs of a failed test (the temp dir goes away with the cluster).
            let keep = std::env::temp_dir().join(format!(
                "cairn-failed-{}-{}",
                std::process::id(),
                self.root.path().file_name().and_then(|n| n.to_str()).unwrap_or("cluster")
            ));
            let _ = Command::new("cp").arg("-r").arg(self.data.join("logs")).arg(&keep).status();
            eprintln!("logs of the failed test's cluster kept in {}", keep.display());
        }
        if let Some(mut child) = self.up.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let Ok(canon) = p.canonicalize() else { return false };
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| info.lines().any(|l| l.split(' ').nth(4) == canon.to_str()))
        .unwrap_or(false)
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a whole file and returns close's error too. `std::fs::write` drops the file, which
/// ignores what close(2) says; on Cairn that is where a buffered write's failure (ENOSPC, EIO)
/// is reported, so a test that wants to know whether a write was acknowledged uses this.
pub fn write_and_close(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::IntoRawFd;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    let fd = f.into_raw_fd();
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}

pub fn kill9(pid: u32) {
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}/status")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| !s.contains("State:\tZ"))
            .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "process {pid} did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second client: `cairn mount` of the same cluster at another mount point.
pub struct Mount {
    pub dir: PathBuf,
    pub child: Option<Child>,
}

impl Mount {
    pub fn new(cluster: &Cluster, name: &str) -> Mount {
        Mount::with_args(cluster, name, &[])
    }

    /// [`Mount::new`] with extra `cairn mount` flags.
    pub fn with_args(cluster: &Cluster, name: &str, extra: &[&str]) -> Mount {
        Mount::with_env(cluster, name, extra, &[])
    }

    /// [`Mount::with_args`] with extra environment variables for the client.
    pub fn with_env(cluster: &Cluster, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        let dir = cluster.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("mount dir");
        let child = Command::new(CAIRN)
            .args(["mount", "--meta", &cluster.meta_addr])
            .env("CAIRN_TLS", cluster.tls("client"))
            .args(extra)
            .envs(env.iter().copied())
            .arg(dir.to_str().expect("utf8"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cairn mount");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&dir) {
            assert!(Instant::now() < deadline, "second mount did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mount { dir, child: Some(child) }
    }

    /// Kill the client process without unmounting (a crashed client).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// The text of `http://ADDR/metrics` (Prometheus exposition format).
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("metrics at {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.") && text.contains(" 200 "), "metrics at {addr}: {text}");
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The sum of every sample of metric `name` whose labels contain all of `labels`
/// (`key="value"` strings), or `None` if there is none.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        if metric == name && labels.iter().all(|l| rest.contains(l)) {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    found
}

/// Poll `f` until it returns true, failing with `what` after `secs` seconds.
pub fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Cluster {
    /// Like [`Cluster::start_with`], in a root dir the test prepared: the cluster keeps its data
    /// under `root/data` (chunkserver `N` under `root/data/chunk-N`) and mounts at `root/mnt`,
    /// so a test can put something there first, e.g. a small filesystem as one chunkserver's
    /// disk.
    pub fn start_prepared(
        root: tempfile::TempDir,
        chunkservers: u32,
        ec: &str,
        unit_kib: u32,
        extra: &[&str],
    ) -> Cluster {
        let mut cluster = Cluster::start_prepared_stopped(root, chunkservers, ec, unit_kib, extra);
        cluster.restart();
        cluster
    }

    /// The cluster [`Cluster::start_prepared`] starts, not started yet.
    fn start_prepared_stopped(
        root: tempfile::TempDir,
        chunkservers: u32,
        ec: &str,
        unit_kib: u32,
        extra: &[&str],
    ) -> Cluster {
        let data = root.path().join("data");
        let mnt = root.path().join("mnt");
        let mut args: Vec<String> = vec![
            "up".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--mount".into(),
            mnt.display().to_string(),
            "--chunkservers".into(),
            chunkservers.to_string(),
            "--ec".into(),
            ec.into(),
            "--unit-kib".into(),
            unit_kib.to_string(),
            "--meta-port".into(),
            "0".into(),
        ];
        // Tests of other features run one metaserver (faster, and some kill and restart "the"
        // metaserver); the replicated path is `cairn up`'s default and tested where a test asks
        // for it (`tests/replicas.rs`, the model test, pjdfstest).
        if !extra.contains(&"--meta-replicas") {
            args.extend(["--meta-replicas".to_string(), "1".to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Cluster {
            root,
            data,
            mnt,
            nodes: Vec::new(),
            meta_addr: String::new(),
            up: None,
            args,
            env: Vec::new(),
        }
    }

    /// Like [`Cluster::start_with`], with environment variables for `cairn up` and the servers
    /// it starts (`CAIRN_META_<KEY>` sets a metaserver setting).
    pub fn start_env(
        chunkservers: u32,
        ec: &str,
        unit_kib: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Cluster {
        let root = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/tmp").expect("tempdir");
        let mut cluster = Cluster::start_prepared_stopped(root, chunkservers, ec, unit_kib, extra);
        cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        cluster.restart();
        cluster
    }

    /// The `cairn up` node of chunkserver `n` (1-based: the one keeping its data under
    /// `data/chunk-n`), found by its port in `cluster.json`.
    pub fn chunk_node(&self, n: usize) -> Node {
        let text = std::fs::read_to_string(self.data.join("cluster.json")).expect("cluster.json");
        let file: serde_json::Value = serde_json::from_str(&text).expect("cluster.json is json");
        let port = file["chunk_ports"][n - 1].as_u64().expect("chunk port");
        let addr = format!("127.0.0.1:{port}");
        self.nodes.iter().find(|node| node.role == "chunk" && node.addr == addr).expect("chunk node").clone()
    }
}

/// A child process (one a test started itself, e.g. a restarted server) killed and reaped when
/// the guard is dropped, so a failing test leaves nothing running.
pub struct KillOnDrop(pub Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A seeded pseudo-random sequence (splitmix64), so a failing run can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }

    pub fn pick_from<I: ExactSizeIterator>(&mut self, mut items: I) -> I::Item {
        let n = items.len() as u64;
        items.nth(self.below(n) as usize).expect("non-empty")
    }
}

/// Run `cairn <args> --json`: the exit status and the parsed report.
pub fn cli_json(cluster: &Cluster, args: &[&str]) -> (i32, serde_json::Value) {
    let mut all = args.to_vec();
    all.push("--json");
    let out = cluster.cli(&all);
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "cairn {args:?} (exit {code}): {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

/// Start a server of the cluster again with the config `cairn up` wrote for it (`meta`, `meta-N` or
/// `chunk-N`: same port, same identity and data) and the environment `cairn up` got, as an
/// operator would after a crash; `cairn up` does not restart a child that died. Logs go next to
/// the others.
pub fn restart_server(cluster: &Cluster, role: &str, dir: &str) -> std::process::Child {
    let config = cluster.data.join(format!("{dir}/{role}.toml"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(cluster.data.join(format!("logs/{dir}-restarted.log")))
        .expect("server log");
    Command::new(CAIRN)
        .args([role, "--config", config.to_str().expect("utf8")])
        .envs(cluster.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn a cairn server")
}

/// `cairn meta init` for the metaserver whose config is `DATA/{dir}/meta.toml` (with `--join`:
/// a replica the running group catches up), asserting it made the data directory.
pub fn meta_init(cluster: &Cluster, dir: &str, join: bool) {
    let config = cluster.data.join(format!("{dir}/meta.toml"));
    let out = Command::new(CAIRN)
        .args(["meta", "init", "--config", config.to_str().expect("utf8")])
        .args(join.then_some("--join"))
        .envs(cluster.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run cairn meta init");
    assert!(out.status.success(), "cairn meta init for {dir}: {out:?}");
}

/// A free port below the kernel's ephemeral range, as `cairn up` picks them: a port from the
/// range (what binding port 0 gives) can be taken meanwhile by the local end of any outgoing
/// connection, and the test's connections are many.
pub fn free_addr() -> String {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32768);
    let mut rng = Rng(std::process::id() as u64 ^ std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64);
    for _ in 0..1000 {
        let port = 10_000 + rng.below(u64::from(ephemeral_low.saturating_sub(10_000)).max(1)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Every chunkserver heartbeats to the current leader (a new one hears from them within a
/// heartbeat or two; until then it counts them down).
pub fn healthy(cluster: &Cluster) {
    eventually(30, "cairn status says HEALTH_OK", || cluster.cli(&["status"]).status.code() == Some(0));
}

/// `cairn fsck` finds nothing wrong (once the cluster is healthy).
pub fn fsck_clean(cluster: &Cluster) {
    healthy(cluster);
    let out = cluster.cli(&["fsck", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "cairn fsck: {report}");
    assert_eq!(report["namespace"]["problems"].as_array().map(Vec::len), Some(0), "{report}");
}

/// `cairn <args>` with `--meta` set to `meta`: exit code and output.
pub fn cli_on(cluster: &Cluster, meta: &str, args: &[&str]) -> (i32, String) {
    let mut all = args.to_vec();
    all.extend(["--meta", meta]);
    let out = cluster.cli(&all);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}
