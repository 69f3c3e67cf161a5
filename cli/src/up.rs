//! `cairn up`: a whole cluster on one machine. It writes a config per server under
//! `--data-dir`, starts the metaserver and each chunkserver as its own child process (so any of
//! them can be killed to watch the cluster survive), waits until every chunkserver has
//! registered, mounts with a `cairn mount` child, prints the node table and waits. SIGINT or
//! SIGTERM unmounts and stops everything; run again on the same data dir and the cluster comes
//! back with its data (ports and EC layout are kept in `cluster.json`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cairn_common::config::{ChunkConfig, IoEngineKind, MetaConfig};
use cairn_common::{CairnError, Layout, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

mod ports;

use ports::{avoid_ports, free_port, PortLock, PortRegistry};

#[derive(Args)]
pub struct UpArgs {
    /// Where the cluster keeps everything: metadata, shards, configs, logs.
    #[arg(long)]
    data_dir: PathBuf,
    /// Where to mount the filesystem.
    #[arg(long)]
    mount: PathBuf,
    /// Number of chunkserver processes (at least k+m).
    #[arg(long, default_value_t = 6)]
    chunkservers: u32,
    /// Erasure coding of the root directory, k+m (fixed when the cluster is first created).
    #[arg(long, default_value = "4+2")]
    ec: String,
    /// Stripe unit in KiB (fixed when the cluster is first created).
    #[arg(long, default_value_t = 1024)]
    unit_kib: u32,
    /// Metaserver port (of the first replica); 0 picks a free one (fixed when the cluster is
    /// first created).
    #[arg(long, default_value_t = 9400)]
    meta_port: u16,
    /// Metaservers holding the namespace: 3 or 5 replicate it with Raft (a minority may fail),
    /// 1 runs a lone metaserver (fixed when the cluster is first created).
    #[arg(long, default_value_t = 3, value_parser = parse_replicas)]
    meta_replicas: u32,
    /// Metadata groups, each a Raft group of --meta-replicas metaservers (`docs/ARCHITECTURE.md`,
    /// "Several metadata groups"); groups after 0 are registered in group 0's group map. A new
    /// cluster's namespace slots are cut into as many equal ranges, and new directories spread
    /// over the groups by their slots, so the namespace is split from the first mkdir. More
    /// groups can be added on a later run, never fewer (they get slots with `cairn meta groups
    /// move`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    meta_groups: u32,
    /// With --meta-groups: keep every namespace slot in group 0 and new directories in their
    /// parent's group (the other groups serve nothing until `cairn meta groups move` and
    /// `cairn meta groups spread on`).
    #[arg(long)]
    no_spread: bool,
    /// How long a silent client keeps its locks and open files, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    client_lease_ms: u64,
    /// How long a chunkserver may be down before its shards are rebuilt elsewhere, ms.
    #[arg(long, default_value_t = 600_000)]
    rebuild_after_ms: u64,
    /// Shards no file references are deleted once older than this, ms (crashed writers'
    /// leftovers, stale copies).
    #[arg(long, default_value_t = MetaConfig::default().orphan_grace_ms)]
    orphan_grace_ms: u64,
    /// How often chunkservers' shards are reconciled with the namespace, ms (also whenever a
    /// chunkserver comes back).
    #[arg(long, default_value_t = MetaConfig::default().reconcile_interval_ms)]
    reconcile_interval_ms: u64,
    /// Pause between two background scrub passes of each chunkserver, seconds.
    #[arg(long, default_value_t = 86_400)]
    scrub_interval_secs: u64,
    /// Cap on each chunkserver's SSD tier, e.g. `64M`, `2G` (K, M, G, T are powers of 1024);
    /// unset: as much as the SSD filesystem holds. Shards beyond it destage to the HDD tier.
    #[arg(long, value_parser = parse_size)]
    ssd_capacity: Option<u64>,
    /// Most bytes per second each chunkserver's mover (and `cairn warmup`) copies between
    /// tiers, e.g. `200M` (the default); at least 1M.
    #[arg(long, value_parser = parse_size)]
    mover_rate: Option<u64>,
    /// Disk I/O engine of every chunkserver.
    #[arg(long, value_enum, default_value_t = Engine::Uring)]
    io_engine: Engine,
    /// HDD reads within the promotion window that bring a shard back to SSD (0: never).
    #[arg(long, default_value_t = ChunkConfig::default().promote_after_reads)]
    promote_after_reads: u32,
    /// Read every chunkserver's HDD tier with O_DIRECT (bypassing the page cache).
    #[arg(long)]
    hdd_direct_io: bool,
    /// The mount's write-back interval, ms: open files' changes older than this are committed
    /// in the background (0: only close and fsync commit).
    #[arg(long, env = "CAIRN_MOUNT_COMMIT_INTERVAL_MS", default_value_t = cairn_client::DEFAULT_COMMIT_INTERVAL_MS)]
    commit_interval_ms: u64,
    /// How long the mount's I/O waits for chunkservers when too few answer, ms (0: fail at
    /// once).
    #[arg(long, env = "CAIRN_MOUNT_WRITE_WAIT_MS", default_value_t = cairn_client::DEFAULT_WRITE_WAIT_MS)]
    write_wait_ms: u64,
    /// What the mount's close guarantees: `close` (on every chunkserver, on disk within the
    /// flush interval; fsync puts it on disk) or `fsync` (on disk).
    #[arg(long, env = "CAIRN_MOUNT_DURABILITY", default_value_t = cairn_client::Durability::Close)]
    durability: cairn_client::Durability,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// io_uring on dedicated threads.
    Uring,
    /// pread/pwrite on a thread pool.
    Pread,
}

impl From<Engine> for IoEngineKind {
    fn from(e: Engine) -> Self {
        match e {
            Engine::Uring => IoEngineKind::Uring,
            Engine::Pread => IoEngineKind::Pread,
        }
    }
}

/// Parse a byte size: a number with an optional K, M, G or T suffix (powers of 1024; `KiB`,
/// `MB` and the like mean the same).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a size like 512M or 2G"))?;
    let shift = match suffix.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{text:?}: unknown unit (use K, M, G or T)")),
    };
    let bytes = number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("the size must be more than 0".into());
    }
    Ok(bytes)
}

fn parse_replicas(text: &str) -> std::result::Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!(
            "{text:?}: 1, 3 or 5 metaservers (an even number tolerates no more failures than one less)"
        )),
    }
}

/// What must stay the same across runs on one data dir.
#[derive(Serialize, Deserialize)]
struct ClusterFile {
    ec: String,
    unit: u32,
    meta_port: u16,
    chunk_ports: Vec<u16>,
    /// Metaservers: 1 (a lone one, and every cluster made before replication) or 3 or 5.
    #[serde(default = "one")]
    meta_replicas: u32,
    /// Ports of the replicas after the first (`meta_port`).
    #[serde(default)]
    meta_ports: Vec<u16>,
    /// Ports of the replicas of each metadata group after 0 (group 1 first).
    #[serde(default)]
    group_ports: Vec<Vec<u16>>,
    /// Made by this run (not read from `cluster.json`): its slots are split over its groups.
    #[serde(skip)]
    fresh: bool,
}

fn one() -> u32 {
    1
}

impl ClusterFile {
    /// Every metaserver's address of group 0, the first replica first.
    fn meta_addrs(&self) -> Vec<String> {
        std::iter::once(self.meta_port)
            .chain(self.meta_ports.iter().copied())
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Every port the cluster's servers listen on.
    fn ports(&self) -> Vec<u16> {
        std::iter::once(self.meta_port)
            .chain(self.meta_ports.iter().copied())
            .chain(self.chunk_ports.iter().copied())
            .chain(self.group_ports.iter().flatten().copied())
            .collect()
    }

    /// Each metadata group's replicas' addresses, group 0 first.
    fn group_addrs(&self) -> Vec<Vec<String>> {
        std::iter::once(self.meta_addrs())
            .chain(
                self.group_ports.iter().map(|ports| ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()),
            )
            .collect()
    }
}

struct Proc {
    role: String,
    id: String,
    addr: String,
    /// Where its Prometheus metrics are served.
    metrics: Option<String>,
    data: String,
    child: Child,
}

pub fn run(args: UpArgs, plaintext: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CairnError::io(format!("tokio runtime: {e}")))?;
    rt.block_on(up(args, plaintext))
}

/// The cluster's access rules file, `DATA/access.toml`, written with no rules (an explanation in
/// comments) unless it is there already.
fn access_template(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("access.toml");
    if !path.exists() {
        std::fs::write(&path, ACCESS_TEMPLATE).map_err(io_err("write", &path))?;
    }
    Ok(path)
}

const ACCESS_TEMPLATE: &str = r#"# Per-client access rules (docs/operations.md, "Access rules"), re-read by the metaservers on
# SIGHUP and when this file changes. The first rule whose `clients` matches a client
# certificate's name applies; a client no rule matches may do whatever its role allows.
#
# [[rule]]
# clients = ["trainer-*"]  # certificate names, a prefix ending in `*`, or "*" for every client
# read_only = true         # no namespace changes; the mount becomes read-only
# squash = "root"          # owners set by the client: "none", "root" (0 -> anon) or "all"
# anon_uid = 65534
# anon_gid = 65534
# setuid = false           # setuid/setgid bits cleared, file capabilities refused
# devices = false          # no device nodes
# uids = [1000, 1999]       # owners it may give entries (EACCES outside) and act as (EPERM)
# gids = [1000, 1999]
# subtree = "/projects/a"  # the only directory it reaches, mounted as its root (EACCES outside)
"#;

/// The cluster's certificates under `DATA/tls` (see [`crate::cert::cluster`]), and the admin
/// identity installed in this process (which asks the metaserver for the nodes). `None`:
/// plaintext, as asked.
fn tls_setup(dir: &Path, plaintext: bool, metas: usize, chunks: usize) -> Result<Option<PathBuf>> {
    use cairn_net::tls::{self, Source};
    if plaintext {
        tls::install_from(&Source::Plaintext, "cairn up", false)?;
        eprintln!("cairn up: PLAINTEXT as asked: no TLS, anyone who reaches the ports can do anything");
        return Ok(None);
    }
    let root = dir.join("tls");
    crate::cert::cluster(&root, metas, chunks, &["127.0.0.1".to_string()])?;
    tls::install_from(&Source::Dir(root.join("admin")), "cairn up", false)?;
    Ok(Some(root))
}

fn io_err(what: &str, path: &Path) -> impl Fn(std::io::Error) -> CairnError {
    let context = format!("{what} {}", path.display());
    move |e| CairnError::from_io(&context, &e)
}

fn cluster_file(args: &UpArgs) -> Result<ClusterFile> {
    let path = args.data_dir.join("cluster.json");
    if path.exists() {
        let text = std::fs::read_to_string(&path).map_err(io_err("read", &path))?;
        let mut file: ClusterFile = serde_json::from_str(&text)
            .map_err(|e| CairnError::invalid(format!("{} is damaged: {e}", path.display())))?;
        if file.ec != args.ec {
            eprintln!("cairn up: keeping EC {} of the existing cluster (--ec {} ignored)", file.ec, args.ec);
        }
        while file.chunk_ports.len() < args.chunkservers as usize {
            file.chunk_ports.push(free_port()?);
        }
        file.chunk_ports.truncate(args.chunkservers as usize);
        if file.meta_replicas != args.meta_replicas {
            eprintln!(
                "cairn up: keeping the {} metaserver(s) of the existing cluster (--meta-replicas {} ignored)",
                file.meta_replicas, args.meta_replicas
            );
        }
        let groups = file.group_ports.len() as u32 + 1;
        if args.meta_groups < groups {
            eprintln!(
                "cairn up: keeping the {groups} metadata groups of the existing cluster (--meta-groups {} ignored: groups are added, never dropped)",
                args.meta_groups
            );
        }
        if args.meta_groups > groups {
            check_groups(file.meta_replicas, args.meta_groups)?;
        }
        while (file.group_ports.len() as u32) + 1 < args.meta_groups {
            file.group_ports.push((0..file.meta_replicas).map(|_| free_port()).collect::<Result<_>>()?);
        }
        return Ok(file);
    }
    let layout = Layout::parse_ec(&args.ec)?;
    Layout::new(layout.k, layout.m, args.unit_kib.saturating_mul(1024))?;
    let meta_port = if args.meta_port == 0 { free_port()? } else { args.meta_port };
    let chunk_ports = (0..args.chunkservers).map(|_| free_port()).collect::<Result<_>>()?;
    let meta_ports = (1..args.meta_replicas).map(|_| free_port()).collect::<Result<_>>()?;
    check_groups(args.meta_replicas, args.meta_groups)?;
    let group_ports = (1..args.meta_groups)
        .map(|_| (0..args.meta_replicas).map(|_| free_port()).collect::<Result<_>>())
        .collect::<Result<_>>()?;
    Ok(ClusterFile {
        ec: args.ec.clone(),
        unit: args.unit_kib * 1024,
        meta_port,
        chunk_ports,
        meta_replicas: args.meta_replicas,
        meta_ports,
        group_ports,
        fresh: true,
    })
}

/// Groups after 0 are Raft groups registered with group 0's replicated map.
fn check_groups(replicas: u32, groups: u32) -> Result<()> {
    if groups > 1 && replicas < 3 {
        return Err(CairnError::invalid(format!(
            "--meta-groups {groups} needs replicated metaservers (--meta-replicas 3 or 5): the group map lives in group 0's Raft state"
        )));
    }
    Ok(())
}

fn write_toml<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = toml::to_string(value).map_err(|e| CairnError::internal(format!("toml: {e}")))?;
    std::fs::write(path, text).map_err(io_err("write", path))
}

fn spawn(args: &[&str], log: &Path) -> Result<Child> {
    let exe = std::env::current_exe().map_err(|e| CairnError::from_io("current exe", &e))?;
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(io_err("open", log))?;
    let err = out.try_clone().map_err(io_err("open", log))?;
    let mut cmd = Command::new(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err).kill_on_drop(true);
    // A child must not outlive `cairn up`, even if `cairn up` itself is killed.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| CairnError::from_io(&format!("start cairn {}", args[0]), &e))
}

/// Something is mounted exactly at `mountpoint` (a path with spaces too: mountinfo escapes them).
fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(canon) = mountpoint.canonicalize() else { return false };
    crate::tree::mounts().iter().any(|m| m.mount_point == canon)
}

/// A free port on 127.0.0.1 for a child's metrics endpoint (Prometheus scrapes
/// `http://ADDR/metrics`).
fn free_local_addr() -> Result<String> {
    Ok(format!("127.0.0.1:{}", free_port()?))
}

async fn up(args: UpArgs, plaintext: bool) -> Result<()> {
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    std::fs::create_dir_all(&args.mount).map_err(io_err("create", &args.mount))?;
    let dir = dir.canonicalize().map_err(io_err("resolve", dir))?;
    let mountpoint = args.mount.canonicalize().map_err(io_err("resolve", &args.mount))?;
    if is_mounted(&mountpoint) {
        return Err(CairnError::invalid(format!("{} is already a mount point", mountpoint.display())));
    }
    // Held until every child has bound its ports (the mount is up): see `PortLock`.
    let port_lock = PortLock::acquire().await;
    let cluster_path = dir.join("cluster.json");
    let mut registry = PortRegistry::load(std::env::temp_dir().join("cairn-up-ports"));
    avoid_ports(&registry.others(&cluster_path));
    let cluster = cluster_file(&args)?;
    let layout = Layout::parse_ec(&cluster.ec)?;
    if args.chunkservers < layout.width() {
        return Err(CairnError::invalid(format!(
            "EC {} needs at least {} chunkservers, --chunkservers is {}",
            cluster.ec,
            layout.width(),
            args.chunkservers
        )));
    }
    std::fs::write(&cluster_path, serde_json::to_string_pretty(&cluster).expect("json"))
        .map_err(io_err("write", &cluster_path))?;
    registry.record(&cluster_path, cluster.ports());
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(io_err("create", &logs))?;
    let groups = cluster.group_addrs();
    let metas = cluster.meta_replicas as usize * groups.len();
    let tls_root = tls_setup(&dir, plaintext, metas, cluster.chunk_ports.len())?;
    let tls_dir = |name: &str| tls_root.as_ref().map(|r| r.join(name)).unwrap_or_default();

    let access_file = match &tls_root {
        Some(_) => Some(access_template(&dir)?),
        None => None,
    };
    let meta_addrs = cluster.meta_addrs();
    let meta_addr = meta_addrs.join(",");
    let mut procs = Vec::new();
    for (group, addrs) in groups.iter().enumerate() {
        let replicas: Vec<String> = if cluster.meta_replicas > 1 {
            addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect()
        } else {
            Vec::new()
        };
        for (i, listen) in addrs.iter().enumerate() {
            // A lone metaserver keeps the directory every earlier cluster has; group 0's replicas
            // theirs from before groups.
            let name = match (replicas.is_empty(), group) {
                (true, _) => "meta".to_string(),
                (false, 0) => format!("meta-{}", i + 1),
                (false, g) => format!("meta-g{g}-{}", i + 1),
            };
            let meta_dir = dir.join(&name);
            std::fs::create_dir_all(&meta_dir).map_err(io_err("create", &meta_dir))?;
            let meta_cfg = MetaConfig {
                listen: listen.clone(),
                data_dir: meta_dir.join("db"),
                ec: cluster.ec.clone(),
                unit: cluster.unit,
                client_lease_ms: args.client_lease_ms,
                rebuild_after_ms: args.rebuild_after_ms,
                orphan_grace_ms: args.orphan_grace_ms,
                reconcile_interval_ms: args.reconcile_interval_ms,
                metrics_listen: Some(free_local_addr()?),
                replicas: replicas.clone(),
                raft_id: if replicas.is_empty() { 0 } else { i as u64 + 1 },
                group: group as u32,
                tls_dir: tls_dir(&format!("meta-{}", group * addrs.len() + i + 1)),
                plaintext: tls_root.is_none(),
                access_file: access_file.clone(),
                ..MetaConfig::default()
            };
            meta_cfg.validate()?;
            let meta_toml = meta_dir.join("meta.toml");
            write_toml(&meta_toml, &meta_cfg)?;
            let log = logs.join(format!("{name}.log"));
            // A new data directory is made by the metaserver itself (`cairn up` is the init).
            let child = spawn(
                &["meta", "--config", meta_toml.to_str().unwrap_or_default(), "--init-if-empty"],
                &log,
            )?;
            procs.push(Proc {
                role: "meta".into(),
                id: match (replicas.is_empty(), group) {
                    (true, _) => "-".into(),
                    (false, 0) => (i + 1).to_string(),
                    (false, g) => format!("g{g}-{}", i + 1),
                },
                addr: listen.clone(),
                metrics: meta_cfg.metrics_listen.clone(),
                data: meta_cfg.data_dir.display().to_string(),
                child,
            });
        }
    }

    for (i, port) in cluster.chunk_ports.iter().enumerate() {
        let state = dir.join(format!("chunk-{}", i + 1));
        let cfg = ChunkConfig {
            listen: format!("127.0.0.1:{port}"),
            meta: meta_addr.clone(),
            state_dir: state.clone(),
            ssd_dirs: vec![state.join("ssd")],
            hdd_dirs: vec![state.join("hdd")],
            ssd_capacity: args.ssd_capacity,
            io_engine: args.io_engine.into(),
            promote_after_reads: args.promote_after_reads,
            hdd_direct_io: args.hdd_direct_io,
            mover_rate_bytes: args.mover_rate.unwrap_or(ChunkConfig::default().mover_rate_bytes),
            scrub_interval_secs: args.scrub_interval_secs,
            metrics_listen: Some(free_local_addr()?),
            tls_dir: tls_dir(&format!("chunk-{}", i + 1)),
            plaintext: tls_root.is_none(),
            ..ChunkConfig::default()
        };
        cfg.validate()?;
        std::fs::create_dir_all(&state).map_err(io_err("create", &state))?;
        let toml_path = state.join("chunk.toml");
        write_toml(&toml_path, &cfg)?;
        let log = logs.join(format!("chunk-{}.log", i + 1));
        let child = spawn(&["chunk", "--config", toml_path.to_str().unwrap_or_default()], &log)?;
        procs.push(Proc {
            role: "chunk".into(),
            id: "?".into(),
            addr: cfg.listen.clone(),
            metrics: cfg.metrics_listen.clone(),
            data: format!("{},{}", cfg.ssd_dirs[0].display(), cfg.hdd_dirs[0].display()),
            child,
        });
    }

    let result = async {
        wait_healthy(&meta_addr, &mut procs, args.chunkservers as usize).await?;
        for (group, addrs) in groups.iter().enumerate().skip(1) {
            register_group(&meta_addr, group as u32, &replica_names(addrs), &mut procs).await?;
        }
        if cluster.fresh && groups.len() > 1 && !args.no_spread {
            split_slots(&meta_addr, &groups, &mut procs).await?;
        }
        let mount_log = logs.join("mount.log");
        let metrics = free_local_addr()?;
        let commit_interval = args.commit_interval_ms.to_string();
        let write_wait = args.write_wait_ms.to_string();
        let durability = args.durability.to_string();
        let client_tls = tls_dir("client");
        let security = match &tls_root {
            Some(_) => vec!["--tls", client_tls.to_str().unwrap_or_default()],
            None => vec!["--plaintext"],
        };
        let mut mount_args = vec![
            "mount",
            "--meta",
            &meta_addr,
            "--metrics",
            &metrics,
            "--commit-interval-ms",
            &commit_interval,
            "--write-wait-ms",
            &write_wait,
            "--durability",
            &durability,
        ];
        mount_args.extend(security);
        mount_args.push(mountpoint.to_str().unwrap_or_default());
        let child = spawn(&mount_args, &mount_log)?;
        procs.push(Proc {
            role: "mount".into(),
            id: "-".into(),
            addr: mountpoint.display().to_string(),
            metrics: Some(metrics),
            data: mount_log.display().to_string(),
            child,
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&mountpoint) {
            if let Ok(Some(status)) = procs.last_mut().expect("mount").child.try_wait() {
                return Err(CairnError::unavailable(format!(
                    "cairn mount exited ({status}); see {}",
                    mount_log.display()
                )));
            }
            if Instant::now() > deadline {
                return Err(CairnError::unavailable(format!(
                    "mount did not appear; see {}",
                    mount_log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
    .await;
    drop(port_lock);
    if let Err(e) = result {
        shutdown(&mut procs, &mountpoint).await;
        return Err(e);
    }

    println!("{:<6} {:>5}  {:<22} {:>8}  {:<16}  DATA", "ROLE", "ID", "ADDRESS", "PID", "METRICS");
    for p in &procs {
        println!(
            "{:<6} {:>5}  {:<22} {:>8}  {:<16}  {}",
            p.role,
            p.id,
            p.addr,
            p.child.id().unwrap_or(0),
            p.metrics.as_deref().unwrap_or("-"),
            p.data
        );
    }
    match &tls_root {
        Some(root) => println!(
            "tls: mutual TLS with the CA in {}; admin commands: export CAIRN_TLS={}",
            root.join("ca").display(),
            root.join("admin").display()
        ),
        None => println!("tls: none (plaintext, as asked); admin commands: export CAIRN_PLAINTEXT=1"),
    }
    let ssd = args.ssd_capacity.map(|b| format!(", SSD tier capped at {b} bytes each")).unwrap_or_default();
    let replicated = match (cluster.meta_replicas > 1, groups.len()) {
        (false, _) => String::new(),
        (true, 1) => " (replicated with Raft)".to_string(),
        (true, n) if args.no_spread || !cluster.fresh => {
            format!(" (replicated with Raft; {n} metadata groups, slots as the group map says)")
        }
        (true, n) => format!(" (replicated with Raft; {n} metadata groups, the namespace split over them)"),
    };
    println!(
        "ready: {} mounted from metaserver {meta_addr}{replicated}; EC {} over {} chunkservers{ssd} (logs in {}; Ctrl-C stops)",
        mountpoint.display(),
        cluster.ec,
        args.chunkservers,
        logs.display()
    );
    wait_for_stop(&mut procs).await;
    eprintln!("cairn up: stopping");
    shutdown(&mut procs, &mountpoint).await;
    Ok(())
}

/// Register metadata group `group` (its replicas `ID=HOST:PORT`) in group 0's map, once its
/// replicas answer (they start alongside), then wait until the group has a leader holding
/// that map (group 0's leader shares it), so the cluster is whole when `cairn up` says so.
async fn register_group(meta_addr: &str, group: u32, replicas: &[String], procs: &mut [Proc]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let version = loop {
        match crate::replicas::register_group(meta_addr, group, replicas).await {
            Ok(map) => break map.version,
            Err(e) if Instant::now() > deadline => {
                return Err(CairnError::unavailable(format!(
                    "metadata group {group} was not registered: {e}"
                )))
            }
            Err(_) => {}
        }
        none_exited(procs)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    leader_holds(group, replicas, version, deadline, procs).await
}

/// Wait until metadata group `group`'s leader (among `replicas`) holds group map `version`.
async fn leader_holds(
    group: u32,
    replicas: &[String],
    version: u64,
    deadline: Instant,
    procs: &mut [Proc],
) -> Result<()> {
    while !crate::replicas::leader_holds(replicas, version).await {
        if Instant::now() > deadline {
            return Err(CairnError::unavailable(format!(
                "metadata group {group} has no leader holding group map version {version}: see its replicas' logs"
            )));
        }
        none_exited(procs)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The replicas of a group started at `addrs`, as the group map names them (`ID=HOST:PORT`).
fn replica_names(addrs: &[String]) -> Vec<String> {
    addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect()
}

/// A new cluster's namespace slots cut into one equal range per group (group 0 keeps the first,
/// with slot 0: the root) and new directories spread over them, then a wait until every
/// group's leader holds that map.
async fn split_slots(meta_addr: &str, groups: &[Vec<String>], procs: &mut [Proc]) -> Result<()> {
    let n = groups.len() as u32;
    let slots = cairn_meta::groups::SLOTS as u32;
    for group in 1..n {
        let (from, to) = (group * slots / n, (group + 1) * slots / n - 1);
        crate::replicas::give_slots(meta_addr, (from..=to).collect(), group).await?;
    }
    let version = crate::replicas::set_spread(meta_addr, true).await?.version;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (group, addrs) in groups.iter().enumerate().skip(1) {
        leader_holds(group as u32, &replica_names(addrs), version, deadline, procs).await?;
    }
    Ok(())
}

/// An error naming the first of `procs` that has exited (during start-up, where none may).
fn none_exited(procs: &mut [Proc]) -> Result<()> {
    for p in procs.iter_mut() {
        if let Ok(Some(status)) = p.child.try_wait() {
            return Err(CairnError::unavailable(format!(
                "{} {} exited during start-up ({status})",
                p.role, p.addr
            )));
        }
    }
    Ok(())
}

/// Wait for the metaserver to answer and every chunkserver to heartbeat; fill in node ids.
async fn wait_healthy(meta_addr: &str, procs: &mut [Proc], expected: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_error;
    loop {
        none_exited(procs)?;
        match cairn_client::connect_meta(meta_addr).await {
            Ok(meta) => match meta.list_nodes(cairn_proto::Empty {}).await {
                Ok(reply) => {
                    for p in procs.iter_mut() {
                        if let Some(n) = reply.nodes.iter().find(|n| n.addr == p.addr) {
                            p.id = n.id.to_string();
                        }
                    }
                    let up =
                        reply.nodes.iter().filter(|n| n.up && procs.iter().any(|p| p.addr == n.addr)).count();
                    if up >= expected {
                        return Ok(());
                    }
                    last_error = format!("{up} of {expected} chunkservers up");
                }
                Err(e) => last_error = e.to_string(),
            },
            Err(e) => last_error = e.to_string(),
        }
        if Instant::now() > deadline {
            return Err(CairnError::unavailable(format!("cluster did not become healthy: {last_error}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_stop(procs: &mut [Proc]) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return;
    };
    let mut reported = vec![false; procs.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = tick.tick() => {
                for (p, seen) in procs.iter_mut().zip(reported.iter_mut()) {
                    if !*seen {
                        if let Ok(Some(status)) = p.child.try_wait() {
                            eprintln!("cairn up: {} {} exited ({status})", p.role, p.addr);
                            *seen = true;
                        }
                    }
                }
            }
        }
    }
}

/// Unmount first (so no application sees a half-stopped cluster), then chunkservers, then the
/// metaserver. Each gets SIGTERM and 10 s before SIGKILL.
async fn shutdown(procs: &mut [Proc], mountpoint: &Path) {
    let order = ["mount", "chunk", "meta"];
    for role in order {
        for p in procs.iter_mut().filter(|p| p.role == role) {
            stop(&mut p.child).await;
        }
        if role == "mount" && is_mounted(mountpoint) {
            eprintln!("cairn up: {} still mounted (busy?), detaching it", mountpoint.display());
            let _ = std::process::Command::new("umount").arg("-l").arg(mountpoint).status();
        }
    }
}

async fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = child.id() {
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("8 KB"), Ok(8 << 10));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        for bad in ["", "M", "0", "0M", "12Q", "1.5G", "-1", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
