//! The `cairn` binary: parse the command line, load and validate config, call into the library
//! crates. Every failure prints one clear line to stderr and exits non-zero.

mod admin;
mod bench;
mod cert;
mod fsck;
mod info;
mod mount;
mod node;
mod replicas;
mod stats;
mod tree;
mod up;
mod warmup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: an erasure-coded distributed POSIX filesystem for training data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The TLS directory (ca.pem, cert.pem, key.pem) of a mount or an admin command: its
    /// certificate says what it may do (`cairn up` keeps a client's and an admin's in DATA/tls).
    /// Default: /etc/cairn/tls. Servers name theirs in their config (`tls_dir`).
    #[arg(long, global = true, env = "CAIRN_TLS", value_name = "DIR")]
    tls: Option<PathBuf>,
    /// No TLS: for a cluster that runs without it (`plaintext = true` on its servers,
    /// `cairn up --plaintext`); connections are neither authenticated nor encrypted.
    #[arg(long, global = true, env = "CAIRN_PLAINTEXT")]
    plaintext: bool,
}

#[derive(Subcommand)]
enum MetaAction {
    /// Each metaserver replica's view of the Raft group: state, term, leader, log and applied
    /// indexes, lag, last snapshot. Exit 0 healthy, 2 a replica missing or lagging, 3 no leader.
    Status {
        /// The metaservers, comma-separated.
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Make a new replica a voting member of the group, once it has caught up. Start it first
    /// on a data directory made with `cairn meta init --join`, with this cluster's `cluster`, a
    /// new `raft_id`, and `replicas` listing the running members and itself.
    Add {
        /// The new replica's raft_id.
        id: u64,
        /// The new replica's address, as the other replicas reach it.
        addr: String,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        /// How long to wait for the new replica to catch up, milliseconds.
        #[arg(long, default_value_t = 60_000)]
        wait_ms: u64,
    },
    /// Remove a replica from the group (it stops voting and receiving entries; stop its
    /// process afterwards). Used to replace a replica whose host or disk is gone.
    Remove {
        /// The replica's raft_id.
        id: u64,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
    /// The metadata groups (each a Raft group; `docs/ARCHITECTURE.md`, "Several metadata
    /// groups"): the group map group 0 keeps, each group's leader and how many namespace slots
    /// it owns. Exit 0 when every group has a leader, 3 when one has none.
    Groups {
        #[command(subcommand)]
        action: Option<GroupAction>,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent copy of the namespace, taken by the leader while it serves, into DIR.
    Backup {
        dir: PathBuf,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
    /// Make the data directory of a new metaserver (the config file and --set flags as for
    /// `cairn meta`), which must be empty or absent: a new, empty namespace (a new cluster), or
    /// a replica of one. A metaserver refuses to start on a data directory without its data, so
    /// a mistyped data_dir never starts an empty cluster.
    Init {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// A replica that the running group catches up (one replacing a lost replica, or for
        /// `cairn meta add`): it never founds a group.
        #[arg(long)]
        join: bool,
    },
    /// Make a backup the data of a stopped metaserver whose data directory is empty (the
    /// metaserver's config file and --set flags as for `cairn meta`). For a replicated
    /// metaserver, restore into one replica and make the others with `cairn meta init --join`.
    Restore {
        backup: PathBuf,
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
}

#[derive(Subcommand)]
enum GroupAction {
    /// Register a running Raft group of metaservers (each started with `group = GROUP` in its
    /// config) in group 0's group map. It owns no namespace slots until slots move to it.
    Add {
        /// The group's number (1 to 4095).
        group: u32,
        /// Its replicas, comma-separated, each ID=HOST:PORT as in their `replicas`.
        replicas: String,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
    /// Forget a metadata group that owns no namespace slots.
    Remove {
        group: u32,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
    /// Give namespace slots to a metadata group (0 or one in the map). Only empty slots move
    /// for now: moving a slot's records is not built, and slot 0 (the root, every inode so
    /// far) stays in group 0.
    Move {
        /// Slots, comma-separated, each N or N-M (e.g. 1-1023,2048).
        slots: String,
        group: u32,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
    /// Spread new directories over the groups by their slots (`on`), or keep each in its
    /// parent's group (`off`, the default). Experimental: rmdir and rename of a directory
    /// whose parent is in another group are not built yet.
    Spread {
        #[arg(value_parser = ["on", "off"])]
        state: String,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run a metaserver. Settings: the TOML file, then CAIRN_META_<KEY> environment variables,
    /// then --set flags (deploy/config/meta.toml lists every key with its default).
    Meta {
        #[command(subcommand)]
        action: Option<MetaAction>,
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override one setting, e.g. --set listen=0.0.0.0:9400 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Make the data directory first if it is empty or absent, as `cairn meta init` does
        /// (for orchestrators that bind a volume there; without it, a metaserver refuses a
        /// data directory that holds none of its data).
        #[arg(long)]
        init_if_empty: bool,
    },
    /// Run a chunkserver. Settings: the TOML file, then CAIRN_CHUNK_<KEY> environment
    /// variables, then --set flags (deploy/config/chunk.toml lists every key with its default).
    Chunk {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override one setting, e.g. --set ssd_dirs=/nvme0/cairn,/nvme1/cairn (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Mount a Cairn cluster. Stays in the foreground (SIGINT/SIGTERM unmount) unless
    /// --background, which returns once the mount is ready.
    Mount {
        /// The metaserver's address.
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        mountpoint: PathBuf,
        /// FUSE request threads.
        #[arg(long, env = "CAIRN_MOUNT_THREADS", default_value_t = 4)]
        threads: usize,
        /// Attribute and entry cache lifetime in the kernel, milliseconds.
        #[arg(long, env = "CAIRN_MOUNT_ATTR_TTL_MS", default_value_t = 1000)]
        attr_ttl_ms: u64,
        /// The block cache for random readers (verified 64 KiB shard blocks), MiB; 0 turns it off.
        /// Default: 1024, or a sixteenth of the memory when less.
        #[arg(long, env = "CAIRN_MOUNT_CACHE_MIB", default_value_t = cairn_client::default_block_cache_mib())]
        cache_mib: u64,
        /// Write-back: an open file's changes are committed in the background once the oldest
        /// is this many milliseconds old, so a writer that never closes, or a client that
        /// dies, loses at most about this much; 0: only close and fsync commit.
        #[arg(long, env = "CAIRN_MOUNT_COMMIT_INTERVAL_MS", default_value_t = cairn_client::DEFAULT_COMMIT_INTERVAL_MS)]
        commit_interval_ms: u64,
        /// How long a create, write or read that finds fewer chunkservers answering than a
        /// stripe needs (k+1 to write, k to read) waits for them, retrying, before it fails
        /// with EIO, milliseconds; 0: fail at once.
        #[arg(long, env = "CAIRN_MOUNT_WRITE_WAIT_MS", default_value_t = cairn_client::DEFAULT_WRITE_WAIT_MS)]
        write_wait_ms: u64,
        /// What close guarantees: `close` (default; like HDFS hflush) answers once the file's
        /// shards are on every chunkserver, which puts them on disk within its flush interval,
        /// and fsync puts them on disk; `fsync`: every close is on disk, as durable as an fsync.
        #[arg(long, env = "CAIRN_MOUNT_DURABILITY", default_value_t = cairn_client::Durability::Close)]
        durability: cairn_client::Durability,
        /// The most a sequential reader of one file may have fetched ahead, MiB: its window
        /// starts at two stripes and doubles while the reader catches up with it (the mount
        /// reads ahead at most eight times this in all); 0: two stripes only.
        #[arg(long, env = "CAIRN_MOUNT_READAHEAD_MIB", default_value_t = cairn_client::DEFAULT_READAHEAD_MIB)]
        readahead_mib: u64,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9410).
        #[arg(long, env = "CAIRN_MOUNT_METRICS")]
        metrics: Option<String>,
        /// Refuse every change (EROFS): for datasets that jobs only read.
        #[arg(long, env = "CAIRN_MOUNT_READ_ONLY")]
        read_only: bool,
        /// Honour setuid and setgid bits of the mount's files (default nosuid: a setuid-root
        /// binary planted through any client host must not run as root on this one).
        #[arg(long)]
        suid: bool,
        /// Let device nodes on the mount be opened as devices (default nodev).
        #[arg(long)]
        dev: bool,
        /// Refuse to execute the mount's files.
        #[arg(long)]
        noexec: bool,
        /// Run as a daemon and return once the mount is ready.
        #[arg(long)]
        background: bool,
        /// The daemon's log file (--background; default /var/log/cairn-mount-PATH.log as root).
        #[arg(long, requires = "background")]
        log: Option<PathBuf>,
    },
    /// Benchmark a directory through the file API: big files written and read, small files
    /// written, read and stat'ed, by several threads at once (works on any directory, for a
    /// baseline).
    Bench(bench::Options),
    /// Unmount a Cairn mount (the mount process exits by itself).
    Umount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; they keep working until closed.
        #[arg(long, short = 'l')]
        lazy: bool,
    },
    /// Where a file lives: inode, layout, stripes, and which chunkservers hold its shards (for a
    /// directory: the layout its new files get).
    Info {
        /// A path under a Cairn mount, or inside the Cairn namespace.
        path: PathBuf,
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        /// List every stripe (the default shows the first few).
        #[arg(long)]
        stripes: bool,
        #[arg(long)]
        json: bool,
    },
    /// The erasure-coding layout of a directory: what files created in it get.
    #[command(subcommand)]
    Layout(LayoutCommand),
    /// Start a whole local cluster (metaserver + chunkservers, each its own process) and mount it.
    Up(up::UpArgs),
    /// Capacity per chunkserver and tier, raw and usable after erasure-coding overhead.
    Df {
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Move every shard of a file or directory tree to the SSD tier now, before a job reads it,
    /// demoting least recently used other data to make room (with --status: show how much of
    /// it is on the SSD tier, moving nothing).
    Warmup {
        /// A path under a Cairn mount, or a path inside the Cairn namespace (`/datasets/x`).
        path: PathBuf,
        /// Report how many of the tree's shards and bytes are on SSD, on HDD and pinned; move
        /// nothing.
        #[arg(long, conflicts_with_all = ["pin", "unpin", "no_evict"])]
        status: bool,
        /// Keep the tree on SSD until `--unpin`: the mover never demotes it and later warmups
        /// never evict it (pins survive restarts).
        #[arg(long, conflicts_with = "unpin")]
        pin: bool,
        /// Undo `--pin` for the tree; moves nothing.
        #[arg(long, conflicts_with = "no_evict")]
        unpin: bool,
        /// Use free SSD space only: fail when it is full rather than demote other data.
        #[arg(long)]
        no_evict: bool,
        /// The tier to move the shards into: `ssd` (cold shards reach HDD by themselves).
        #[arg(long, default_value = "ssd", value_parser = ["ssd"])]
        tier: String,
        /// The metaserver's address (default: the one of the mount PATH is under, else
        /// 127.0.0.1:9400).
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        /// Print the summary as JSON (and no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// Live per-second view of the cluster: metadata requests, shard reads and writes, SSD hit
    /// ratio, tier moves, degraded stripes, rebuild rate.
    Stats {
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        /// Seconds between lines.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many lines (default: until interrupted).
        #[arg(long)]
        count: Option<u64>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Cluster health: a one-line summary (HEALTH_OK, HEALTH_WARN, HEALTH_ERR), nodes up/down,
    /// stripes by how many more shards they can lose, repair. Exit status: 0 HEALTH_OK,
    /// 2 HEALTH_WARN, 3 HEALTH_ERR, 1 the metaserver could not be asked.
    Status {
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Verify every shard of a file or tree (every block against its checksum) and rebuild the
    /// damaged ones now. Exit status: 0 clean, 1 all repaired, 4 problems left.
    Scrub {
        /// A path under a Cairn mount, or inside the Cairn namespace.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        path: Option<PathBuf>,
        /// The whole namespace.
        #[arg(long)]
        all: bool,
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Check the whole filesystem: namespace consistency, every shard of every stripe, shards no
    /// file references. Reports only, unless --repair. Exit status: 0 clean, 1 all repaired,
    /// 4 problems left.
    Fsck {
        /// Fix what was found: rebuild damaged shards, fix the namespace, delete unreferenced
        /// shards.
        #[arg(long)]
        repair: bool,
        /// With --repair: also delete shards of inode numbers the namespace never handed out
        /// (kept otherwise: they mean the namespace is older than the data, e.g. a metaserver
        /// restored from a backup).
        #[arg(long, requires = "repair")]
        delete_foreign: bool,
        /// Check shards are present with the right length, without reading them.
        #[arg(long)]
        no_verify: bool,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Chunkserver lifecycle: list, drain, activate, remove.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Certificates for mutual TLS: the cluster CA, and one per server, mount or admin.
    #[command(subcommand)]
    Cert(cert::CertCommand),
}

#[derive(Subcommand)]
enum LayoutCommand {
    /// Show the layout of a directory (or of a file).
    Get {
        path: PathBuf,
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Set the layout new files in a directory get (existing files keep theirs; new
    /// subdirectories inherit it).
    Set {
        path: PathBuf,
        /// Data+parity shards per stripe, e.g. 4+2 or 8+3.
        #[arg(long, value_parser = info::parse_ec, required_unless_present = "unit")]
        ec: Option<(u32, u32)>,
        /// Bytes per data shard per stripe, e.g. 256K or 1M (a multiple of 4K).
        #[arg(long, value_parser = up::parse_size)]
        unit: Option<u64>,
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Every chunkserver with its state.
    List {
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Move every shard off a chunkserver (it keeps serving meanwhile); no new files go there.
    Drain {
        id: u32,
        /// Wait, showing progress, until no file needs the node.
        #[arg(long)]
        wait: bool,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Undo a drain: the node takes new files again.
    Activate {
        id: u32,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Forget a chunkserver that no file needs (drain it first), or a dead one with --force.
    Remove {
        id: u32,
        /// Remove it even though files still place shards on it; they are rebuilt elsewhere.
        #[arg(long)]
        force: bool,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Run as mount(8)'s helper (`mount -t fuse.cairn`, `mount -t cairn`, /etc/fstab).
    let argv0 = std::env::args().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0).file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "mount.cairn" || name == "mount.fuse.cairn" {
        let args: Vec<String> = std::env::args().skip(1).collect();
        return match mount::helper(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: {}", e.message());
                // mount(8): 32 is "mount failure".
                ExitCode::from(32)
            }
        };
    }
    let cli = Cli::parse();
    cairn_common::telemetry::init_logging();
    // Reporting commands end quietly when their reader goes away (`cairn status | head`), as
    // Unix tools do, instead of panicking on the failed write. Long-running processes keep
    // SIGPIPE ignored (their sockets send with MSG_NOSIGNAL either way).
    if !matches!(
        cli.command,
        Command::Meta { action: None, .. } | Command::Chunk { .. } | Command::Mount { .. } | Command::Up(_)
    ) {
        // SAFETY: restores a signal's default action; no handler runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // Mounts and admin commands connect with the identity the command line names; servers
    // with their config's; the rest connect nowhere (or, `cairn up`, make their own).
    let connects = !matches!(
        cli.command,
        Command::Meta { action: None | Some(MetaAction::Restore { .. } | MetaAction::Init { .. }), .. }
            | Command::Chunk { .. }
            | Command::Bench(_)
            | Command::Umount { .. }
            | Command::Up(_)
            | Command::Cert(_)
    );
    if connects {
        let announce = matches!(cli.command, Command::Mount { .. });
        if let Err(e) = client_identity(cli.tls.as_deref(), cli.plaintext, announce) {
            eprintln!("cairn: {}", e.message());
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Meta { action: Some(MetaAction::Status { meta, json }), .. } => {
            return match runtime().and_then(|rt| rt.block_on(replicas::status(&meta, json))) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("cairn: {}", e.message());
                    ExitCode::FAILURE
                }
            };
        }
        Command::Meta { action: Some(MetaAction::Add { id, addr, meta, wait_ms }), .. } => runtime()
            .and_then(|rt| rt.block_on(replicas::add(&meta, id, &addr, Duration::from_millis(wait_ms))))
            .map(|_| ()),
        Command::Meta { action: Some(MetaAction::Remove { id, meta }), .. } => {
            runtime().and_then(|rt| rt.block_on(replicas::remove(&meta, id)))
        }
        Command::Meta { action: Some(MetaAction::Groups { action: None, meta, json }), .. } => {
            return match runtime().and_then(|rt| rt.block_on(replicas::groups(&meta, json))) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("cairn: {}", e.message());
                    ExitCode::FAILURE
                }
            };
        }
        Command::Meta {
            action: Some(MetaAction::Groups { action: Some(GroupAction::Add { group, replicas, meta }), .. }),
            ..
        } => runtime().and_then(|rt| rt.block_on(replicas::add_group(&meta, group, &replicas))),
        Command::Meta {
            action: Some(MetaAction::Groups { action: Some(GroupAction::Remove { group, meta }), .. }),
            ..
        } => runtime().and_then(|rt| rt.block_on(replicas::remove_group(&meta, group))),
        Command::Meta {
            action: Some(MetaAction::Groups { action: Some(GroupAction::Move { slots, group, meta }), .. }),
            ..
        } => runtime().and_then(|rt| rt.block_on(replicas::move_slots(&meta, &slots, group))),
        Command::Meta {
            action: Some(MetaAction::Groups { action: Some(GroupAction::Spread { state, meta }), .. }),
            ..
        } => runtime().and_then(|rt| rt.block_on(replicas::spread_dirs(&meta, state == "on"))),
        Command::Meta { action: Some(MetaAction::Backup { dir, meta }), .. } => {
            runtime().and_then(|rt| rt.block_on(replicas::backup(&meta, &dir))).map(|_| ())
        }
        Command::Meta { action: Some(MetaAction::Restore { backup, config, set }), .. } => load(
            config,
            cairn_common::config::META_ENV_PREFIX,
            &set,
        )
        .and_then(|c: cairn_common::config::MetaConfig| {
            let index = cairn_meta::restore(&c, &backup)?;
            println!("restored {} (applied index {index}) into {}", backup.display(), c.data_dir.display());
            Ok(())
        }),
        Command::Meta { action: Some(MetaAction::Init { config, set, join }), .. } => {
            load(config, cairn_common::config::META_ENV_PREFIX, &set)
                .and_then(|c: cairn_common::config::MetaConfig| cairn_meta::init(&c, join))
                .map(|made| println!("{made}"))
        }
        Command::Meta { action: None, config, set, init_if_empty } => {
            load(config, cairn_common::config::META_ENV_PREFIX, &set).and_then(
                |c: cairn_common::config::MetaConfig| {
                    c.validate()?;
                    if init_if_empty && cairn_meta::is_new(&c.data_dir)? {
                        eprintln!("{}", cairn_meta::init(&c, false)?);
                    }
                    cairn_net::tls::install_from(&c.tls_source(), "metaserver", true)?;
                    cairn_net::tls::watch();
                    runtime()?.block_on(cairn_meta::run(c))
                },
            )
        }
        Command::Chunk { config, set } => load(config, cairn_common::config::CHUNK_ENV_PREFIX, &set)
            .and_then(|c: cairn_common::config::ChunkConfig| {
                c.validate()?;
                cairn_net::tls::install_from(&c.tls_source(), "chunkserver", true)?;
                cairn_net::tls::watch();
                runtime()?.block_on(cairn_chunk::run(c))
            }),
        Command::Mount {
            meta,
            mountpoint,
            threads,
            attr_ttl_ms,
            cache_mib,
            commit_interval_ms,
            write_wait_ms,
            durability,
            readahead_mib,
            metrics,
            read_only,
            suid,
            dev,
            noexec,
            background,
            log,
        } => {
            let args = mount::MountArgs {
                meta,
                mountpoint,
                threads,
                attr_ttl_ms,
                cache_mib,
                commit_interval_ms,
                write_wait_ms,
                durability,
                readahead_mib,
                metrics,
                read_only,
                suid,
                dev,
                exec: !noexec,
                log,
                tls: cli.tls.clone(),
                plaintext: cli.plaintext,
            };
            if background {
                mount::background(&args)
            } else {
                cairn_net::tls::watch();
                cairn_client::mount(args.into_options())
            }
        }
        Command::Stats { meta, interval, count, json } => {
            if !(interval.is_finite() && interval >= 0.1) {
                Err(cairn_common::CairnError::invalid("--interval must be at least 0.1 seconds"))
            } else {
                let every = Duration::from_secs_f64(interval);
                runtime().and_then(|rt| rt.block_on(stats::stats(&meta, every, count, json)))
            }
        }
        Command::Bench(opts) => bench::run(opts),
        Command::Umount { mountpoint, lazy } => mount::umount(&mountpoint, lazy),
        Command::Info { path, meta, stripes, json } => runtime()
            .and_then(|rt| rt.block_on(info::info(&path, meta, stripes, json)))
            .map_err(|e| tree::explain_not_found(&path, e)),
        Command::Layout(cmd) => runtime().and_then(|rt| {
            rt.block_on(async {
                match cmd {
                    LayoutCommand::Get { path, meta, json } => info::layout_get(&path, meta, json)
                        .await
                        .map_err(|e| tree::explain_not_found(&path, e)),
                    LayoutCommand::Set { path, ec, unit, meta, json } => {
                        info::layout_set(&path, meta, ec, unit, json)
                            .await
                            .map_err(|e| tree::explain_not_found(&path, e))
                    }
                }
            })
        }),
        Command::Up(args) => up::run(args, cli.plaintext),
        Command::Cert(cmd) => cert::run(cmd),
        Command::Df { meta, json } => runtime().and_then(|rt| rt.block_on(admin::df(&meta, json))),
        Command::Warmup { path, status, pin, unpin, no_evict, tier: _, meta, json } => runtime()
            .and_then(|rt| {
                if status {
                    rt.block_on(warmup::status(&path, meta, json))
                } else if unpin {
                    rt.block_on(warmup::unpin(&path, meta, json))
                } else {
                    let opts = warmup::Options { evict: !no_evict, pin };
                    rt.block_on(warmup::warmup(&path, meta, opts, json))
                }
            })
            .map_err(|e| tree::explain_not_found(&path, e)),
        Command::Status { meta, json } => {
            return match runtime().and_then(|rt| rt.block_on(admin::status(&meta, json))) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("cairn: {}", e.message());
                    ExitCode::FAILURE
                }
            };
        }
        Command::Scrub { path, all: _, meta, json } => {
            let shown = path.clone();
            let opts = fsck::Options {
                path,
                meta,
                verify: true,
                repair: true,
                delete_foreign: false,
                fsck: false,
                json,
            };
            let result = runtime().and_then(|rt| rt.block_on(fsck::run(opts)));
            return exit_code(result.map_err(|e| match &shown {
                Some(path) => tree::explain_not_found(path, e),
                None => e,
            }));
        }
        Command::Fsck { repair, delete_foreign, no_verify, meta, json } => {
            let opts = fsck::Options {
                path: None,
                meta: Some(meta),
                verify: !no_verify,
                repair,
                delete_foreign,
                fsck: true,
                json,
            };
            return exit_code(runtime().and_then(|rt| rt.block_on(fsck::run(opts))));
        }
        Command::Node(cmd) => runtime().and_then(|rt| {
            rt.block_on(async {
                match cmd {
                    NodeCommand::List { meta, json } => node::list(&meta, json).await,
                    NodeCommand::Drain { id, wait, meta, json } => node::drain(&meta, id, wait, json).await,
                    NodeCommand::Activate { id, meta, json } => node::activate(&meta, id, json).await,
                    NodeCommand::Remove { id, force, meta, json } => {
                        node::remove(&meta, id, force, json).await
                    }
                }
            })
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {}", e.message());
            ExitCode::FAILURE
        }
    }
}

/// Install the identity of a mount or admin command: `--tls DIR`, else the default directory
/// if it exists, else plaintext if asked for; anything else is an error that says what to do.
fn client_identity(
    dir: Option<&std::path::Path>,
    plaintext: bool,
    announce: bool,
) -> cairn_common::Result<()> {
    use cairn_net::tls::{self, Source};
    // A flag beats the other's environment variable (`cairn up` prints `export CAIRN_TLS=...`;
    // `--plaintext` must still work after it).
    let tls_from_env =
        dir.is_some() && std::env::var_os("CAIRN_TLS").as_deref() == dir.map(|d| d.as_os_str());
    let plaintext_from_env = std::env::var_os("CAIRN_PLAINTEXT").is_some();
    let source = match (dir, plaintext) {
        (Some(_), true) if tls_from_env && !plaintext_from_env => Source::Plaintext,
        (Some(dir), true) if plaintext_from_env && !tls_from_env => Source::Dir(dir.to_path_buf()),
        (Some(_), true) => {
            return Err(cairn_common::CairnError::invalid("--tls and --plaintext exclude each other"));
        }
        (None, true) => Source::Plaintext,
        (Some(dir), false) => Source::Dir(dir.to_path_buf()),
        (None, false) if std::path::Path::new(tls::DEFAULT_DIR).exists() => {
            Source::Dir(tls::DEFAULT_DIR.into())
        }
        (None, false) => {
            return Err(cairn_common::CairnError::invalid(format!(
                "no TLS identity: {} does not exist; pass --tls DIR (or set CAIRN_TLS) with a \
                 directory `cairn cert issue` made (cairn up keeps an admin's in DATA/tls/admin and a \
                 client's in DATA/tls/client), or --plaintext for a cluster that runs without TLS",
                tls::DEFAULT_DIR
            )));
        }
    };
    tls::install_from(&source, "mount", announce)
}

/// A command with its own exit status (fsck, scrub): errors exit 8, as e2fsck's operational
/// errors do.
fn exit_code(result: cairn_common::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cairn: {}", e.message());
            ExitCode::from(8)
        }
    }
}

fn load<T: serde::de::DeserializeOwned + serde::Serialize + Default>(
    path: Option<PathBuf>,
    env_prefix: &str,
    set: &[String],
) -> cairn_common::Result<T> {
    cairn_common::config::load_with(path.as_deref(), env_prefix, std::env::vars(), set)
}

fn runtime() -> cairn_common::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| cairn_common::CairnError::io(format!("tokio runtime: {e}")))
}
