//! The `cairn` binary: parse the command line, load and validate config, call into the library
//! crates. Every failure prints one clear line to stderr and exits non-zero.

mod admin;
mod fsck;
mod node;
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
}

#[derive(Subcommand)]
enum Command {
    /// Run a metaserver.
    Meta {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a chunkserver.
    Chunk {
        #[arg(long)]
        config: PathBuf,
    },
    /// Mount a Cairn cluster (stays in the foreground; SIGINT/SIGTERM unmount).
    Mount {
        /// The metaserver's address.
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        mountpoint: PathBuf,
        /// FUSE request threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Attribute and entry cache lifetime in the kernel, milliseconds.
        #[arg(long, default_value_t = 1000)]
        attr_ttl_ms: u64,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9410).
        #[arg(long)]
        metrics: Option<String>,
    },
    /// Start a whole local cluster (metaserver + chunkservers, each its own process) and mount it.
    Up(up::UpArgs),
    /// Capacity per chunkserver and tier, raw and usable after erasure-coding overhead.
    Df {
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Move every shard of a file or directory tree to the SSD tier now, before a job reads it.
    Warmup {
        /// A path under a Cairn mount, or a path inside the Cairn namespace (`/datasets/x`).
        path: PathBuf,
        /// The metaserver's address (default: the one of the mount PATH is under, else
        /// 127.0.0.1:9400).
        #[arg(long, env = "CAIRN_META")]
        meta: Option<String>,
        /// Print the summary as JSON (and no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// Cluster health: nodes up/down, last heartbeat, files and bytes.
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
    },
    /// Forget a chunkserver that no file needs (drain it first), or a dead one with --force.
    Remove {
        id: u32,
        /// Remove it even though files still place shards on it; they are rebuilt elsewhere.
        #[arg(long)]
        force: bool,
        #[arg(long, env = "CAIRN_META", default_value = "127.0.0.1:9400")]
        meta: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cairn_common::telemetry::init_logging();
    let result = match cli.command {
        Command::Meta { config } => load(&config).and_then(|c: cairn_common::config::MetaConfig| {
            c.validate()?;
            runtime()?.block_on(cairn_meta::run(c))
        }),
        Command::Chunk { config } => load(&config).and_then(|c: cairn_common::config::ChunkConfig| {
            c.validate()?;
            runtime()?.block_on(cairn_chunk::run(c))
        }),
        Command::Mount { meta, mountpoint, threads, attr_ttl_ms, metrics } => {
            cairn_client::mount(cairn_client::MountOptions {
                meta,
                mountpoint,
                threads,
                attr_ttl: Duration::from_millis(attr_ttl_ms),
                allow_other: unsafe { libc::geteuid() } == 0,
                metrics,
            })
        }
        Command::Up(args) => up::run(args),
        Command::Df { meta, json } => runtime().and_then(|rt| rt.block_on(admin::df(&meta, json))),
        Command::Warmup { path, meta, json } => {
            runtime().and_then(|rt| rt.block_on(warmup::warmup(&path, meta, json)))
        }
        Command::Status { meta, json } => runtime().and_then(|rt| rt.block_on(admin::status(&meta, json))),
        Command::Scrub { path, all: _, meta, json } => {
            let opts = fsck::Options { path, meta, verify: true, repair: true, fsck: false, json };
            return exit_code(runtime().and_then(|rt| rt.block_on(fsck::run(opts))));
        }
        Command::Fsck { repair, no_verify, meta, json } => {
            let opts =
                fsck::Options { path: None, meta: Some(meta), verify: !no_verify, repair, fsck: true, json };
            return exit_code(runtime().and_then(|rt| rt.block_on(fsck::run(opts))));
        }
        Command::Node(cmd) => runtime().and_then(|rt| {
            rt.block_on(async {
                match cmd {
                    NodeCommand::List { meta, json } => node::list(&meta, json).await,
                    NodeCommand::Drain { id, wait, meta, json } => node::drain(&meta, id, wait, json).await,
                    NodeCommand::Activate { id, meta } => node::activate(&meta, id).await,
                    NodeCommand::Remove { id, force, meta } => node::remove(&meta, id, force).await,
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

fn load<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> cairn_common::Result<T> {
    cairn_common::config::load(path)
}

fn runtime() -> cairn_common::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| cairn_common::CairnError::io(format!("tokio runtime: {e}")))
}
