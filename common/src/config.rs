//! Configuration files. Each server reads one TOML file into a serde struct whose fields all
//! have documented defaults; unknown keys are rejected so a typo is an error, not a silently
//! ignored setting.
//!
//! Every key can also be set without editing the file: an environment variable
//! `CAIRN_META_<KEY>` / `CAIRN_CHUNK_<KEY>` (upper case) overrides the file, and a flag
//! `--set key=value` overrides both. A value is taken as the key's type: a list key takes
//! comma-separated items (`ssd_dirs=/a,/b`) or a TOML array, a string key takes the text as
//! it is, anything else is read as a TOML value (`sync=true`, `unit=1048576`).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{CairnError, Layout, Result};

/// When the metaserver fsyncs its write-ahead log. Every change is in the log before it is
/// answered, so a killed metaserver process loses nothing in any mode; the modes differ in what
/// a power loss of the metaserver's machine can take back.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Every change is fsynced before it is answered: nothing acknowledged is lost.
    Always,
    /// What the application asked to be durable is fsynced before it is answered: the commit of
    /// written data (`close`, `fsync`), `fsync` of a file or directory, and the counters that
    /// must never repeat (inode numbers, client and node ids). Other changes (create, mkdir,
    /// rename, unlink, chmod…) are fsynced by a background group commit within about 1 ms, without
    /// holding the answer back; a power loss can take back the ones of the last moment, as on a
    /// local filesystem without `fsync`. Shards are deleted only after the change that freed
    /// them is on disk.
    Commit,
    /// Nothing is fsynced (scratch clusters and tests): a power loss can take back anything not
    /// yet written out by the kernel.
    Never,
}

/// Metaserver settings (`cairn meta --config FILE`).
/// The namespace is cut into this many slots, each owned by one metadata group
/// (`docs/ARCHITECTURE.md`, "Several metadata groups"): so there are at most as many groups.
pub const MAX_GROUPS: u32 = 4096;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// Address the gRPC service listens on.
    pub listen: String,
    /// Directory of the RocksDB database.
    pub data_dir: PathBuf,
    /// Layout of the root directory, inherited by everything created under it: "k+m".
    pub ec: String,
    /// Stripe unit in bytes.
    pub unit: u32,
    /// When namespace changes reach the disk (see [`SyncMode`]).
    pub sync_mode: SyncMode,
    /// A chunkserver with no heartbeat for this long is reported down and gets no new stripes.
    pub node_timeout_ms: u64,
    /// How often the garbage collector deletes shards of removed files and replaced stripes.
    pub gc_interval_ms: u64,
    /// A client that stops heartbeating for this long loses its locks and its open files
    /// (unlinked files it held open are then freed).
    pub client_lease_ms: u64,
    /// A chunkserver down for this long is replaced: its shards are rebuilt on other nodes.
    pub rebuild_after_ms: u64,
    /// Most bytes per second the repair rebuilds (training reads keep the rest).
    pub repair_rate_bytes: u64,
    /// Shards no file references (crashed writers, stale copies) are deleted once older than
    /// this. Keep it well above `client_lease_ms`: a writer cut off for longer may still commit.
    pub orphan_grace_ms: u64,
    /// Shards of inodes the namespace no longer has (unlinked files whose garbage collection
    /// missed a node) are deleted only once older than this, longer than `orphan_grace_ms`:
    /// a namespace that lost recent changes (restored from a backup) must not take the data
    /// with it before an operator notices. Shards of inode numbers the namespace never handed
    /// out are never deleted on their own (`cairn fsck --repair --delete-foreign`).
    pub unknown_inode_grace_ms: u64,
    /// How often every chunkserver's shards are reconciled with the namespace (also whenever a
    /// chunkserver comes back).
    pub reconcile_interval_ms: u64,
    /// Pause between two passes of the content audit, which checks every data shard's block
    /// checksums against the content hash its stripe record holds (from the shard's header:
    /// no data is read) and has what does not match rebuilt. 0: no audit.
    pub content_audit_interval_ms: u64,
    /// Most data shards per second the content audit checks.
    pub content_audit_shards_per_sec: u64,
    /// The TLS directory (`ca.pem`, `cert.pem`, `key.pem`; `cairn cert issue` makes one): every
    /// connection, to and from this server, is mutual TLS with it. Re-read on SIGHUP and when
    /// its files change.
    pub tls_dir: PathBuf,
    /// No TLS: connections are neither authenticated nor encrypted, anyone who reaches the
    /// port can do anything (for a test bench on a closed network; logged at every start).
    pub plaintext: bool,
    /// Per-client access rules (read-only, squashed owners, no setuid bits or device nodes,
    /// by client certificate name; `docs/operations.md`, "Access rules"). Unset: none. A
    /// file missing or invalid at start is an error; re-read on SIGHUP and when it changes.
    pub access_file: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (unset: no metrics endpoint);
    /// `https://ADDR`: over TLS, to certificates with the monitor or admin role.
    pub metrics_listen: Option<String>,
    /// The metaservers of a replicated namespace, each as `ID=HOST:PORT`, this one included
    /// (3 or 5 of them; see `raft_id`). Empty: this metaserver runs alone.
    pub replicas: Vec<String>,
    /// This metaserver's id among `replicas`.
    pub raft_id: u64,
    /// The cluster's name: replicas and data directories of another cluster are refused.
    pub cluster: String,
    /// The metadata group this replica belongs to (`docs/ARCHITECTURE.md`, "Several metadata
    /// groups"): 0, the default, holds the root and the cluster state; a replica of another
    /// group needs `replicas` (its own group's) and owns the namespace slots the group map in
    /// group 0 gives it. Replicas and data directories of another group are refused.
    pub group: u32,
    /// How often the leader sends heartbeats to the other replicas.
    pub raft_heartbeat_ms: u64,
    /// The shortest election timeout (the longest is twice it). A follower refuses votes for
    /// the longest after the last heartbeat it heard, and starts an election after the longest
    /// plus one between the two; the leader answers reads for the shortest after a majority
    /// acknowledged it.
    pub raft_election_ms: u64,
    /// A change not committed by a majority within this long fails (`EIO` at the client).
    pub raft_write_timeout_ms: u64,
    /// A replica snapshots its state machine after this many log entries and then drops the
    /// older part of its log (keeping a fifth of this); a replica too far behind, or one whose
    /// data was lost, is sent the snapshot.
    pub raft_snapshot_every: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            listen: "127.0.0.1:9400".into(),
            data_dir: PathBuf::from("/var/lib/cairn/meta"),
            ec: "4+2".into(),
            unit: 1 << 20,
            sync_mode: SyncMode::Commit,
            node_timeout_ms: 10_000,
            gc_interval_ms: 2_000,
            client_lease_ms: 30_000,
            rebuild_after_ms: 600_000,
            repair_rate_bytes: 100 << 20,
            orphan_grace_ms: 3_600_000,
            unknown_inode_grace_ms: 7 * 24 * 3_600_000,
            reconcile_interval_ms: 3_600_000,
            content_audit_interval_ms: 24 * 3_600_000,
            content_audit_shards_per_sec: 2_000,
            metrics_listen: None,
            tls_dir: PathBuf::from(DEFAULT_TLS_DIR),
            plaintext: false,
            access_file: None,
            replicas: Vec::new(),
            raft_id: 0,
            cluster: "cairn".into(),
            group: 0,
            raft_heartbeat_ms: 100,
            raft_election_ms: 300,
            raft_write_timeout_ms: 10_000,
            raft_snapshot_every: 5000,
        }
    }
}

impl MetaConfig {
    /// Where this server's TLS identity comes from.
    pub fn tls_source(&self) -> TlsSource {
        if self.plaintext {
            TlsSource::Plaintext
        } else {
            TlsSource::Dir(self.tls_dir.clone())
        }
    }

    pub fn layout(&self) -> Result<Layout> {
        let ec = Layout::parse_ec(&self.ec)?;
        Layout::new(ec.k, ec.m, self.unit)
    }

    pub fn validate(&self) -> Result<()> {
        self.layout()?;
        check_addr("listen", &self.listen)?;
        if let Some(m) = &self.metrics_listen {
            check_metrics_addr(m)?;
        }
        let replicas = self.replica_addrs()?;
        if !replicas.is_empty() && !replicas.contains_key(&self.raft_id) {
            return Err(CairnError::invalid(format!(
                "raft_id {} is not one of the replicas' ids {:?}",
                self.raft_id,
                replicas.keys().collect::<Vec<_>>()
            )));
        }
        if self.cluster.is_empty()
            || !self.cluster.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(CairnError::invalid(format!(
                "cluster {:?}: letters, digits, '-' and '_' only",
                self.cluster
            )));
        }
        if self.group >= MAX_GROUPS {
            return Err(CairnError::invalid(format!(
                "group {} is out of range: at most {MAX_GROUPS} metadata groups (one per namespace slot)",
                self.group
            )));
        }
        if self.group != 0 && replicas.is_empty() {
            return Err(CairnError::invalid(format!(
                "group {}: a metadata group other than 0 is a Raft group: give it its replicas",
                self.group
            )));
        }
        if self.raft_snapshot_every < 10 {
            return Err(CairnError::invalid(format!(
                "raft_snapshot_every {} is below 10",
                self.raft_snapshot_every
            )));
        }
        if self.raft_heartbeat_ms == 0 || self.raft_election_ms < 3 * self.raft_heartbeat_ms {
            return Err(CairnError::invalid(format!(
                "raft_election_ms ({}) must be at least 3 × raft_heartbeat_ms ({}), which must not be 0",
                self.raft_election_ms, self.raft_heartbeat_ms
            )));
        }
        Ok(())
    }

    /// `replicas` by id (empty when this metaserver runs alone).
    pub fn replica_addrs(&self) -> Result<std::collections::BTreeMap<u64, String>> {
        parse_replicas(&self.replicas)
    }
}

/// A Raft group's replicas, each `ID=HOST:PORT`, by id: ids above 0 and each once, addresses
/// well formed (not resolved).
pub fn parse_replicas(replicas: &[String]) -> Result<std::collections::BTreeMap<u64, String>> {
    let mut out = std::collections::BTreeMap::new();
    for r in replicas {
        let bad = || CairnError::invalid(format!("replica {r:?}: expected ID=HOST:PORT with an id above 0"));
        let (id, addr) = r.split_once('=').ok_or_else(bad)?;
        let id: u64 = id.trim().parse().map_err(|_| bad())?;
        if id == 0 {
            return Err(bad());
        }
        check_peer("replicas", addr.trim())?;
        if out.insert(id, addr.trim().to_string()).is_some() {
            return Err(CairnError::invalid(format!("replica id {id} appears twice in replicas")));
        }
    }
    Ok(out)
}

/// Which disk I/O engine a chunkserver uses.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IoEngineKind {
    /// io_uring on dedicated threads (default).
    Uring,
    /// Plain pread/pwrite on tokio's blocking pool, for kernels without io_uring.
    Pread,
}

/// Chunkserver settings (`cairn chunk --config FILE`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkConfig {
    /// Address the gRPC service listens on (port 0 picks a free one).
    pub listen: String,
    /// Address clients use to reach this chunkserver; defaults to the bound listen address.
    pub advertise: Option<String>,
    /// The metaserver's address, or the addresses of a replicated metaserver's replicas
    /// separated by commas.
    pub meta: String,
    /// Directory for identity and state files (node id).
    pub state_dir: PathBuf,
    /// SSD tier directories: new shards land here.
    pub ssd_dirs: Vec<PathBuf>,
    /// HDD tier directories: cold shards destage here.
    pub hdd_dirs: Vec<PathBuf>,
    pub io_engine: IoEngineKind,
    /// io_uring submission queue depth.
    pub queue_depth: u32,
    /// Make shards durable at all (false: nothing is ever fsynced, for throwaway test data).
    pub sync: bool,
    /// A buffered shard write (a mount's `durability=close`) is made durable within this many
    /// milliseconds by the flusher (default 1000): the window in which a power loss of this
    /// machine can take it back.
    pub flush_interval_ms: u64,
    /// For Cairn's crash tests only: remember the shards not yet flushed, and delete them at the
    /// next start, as a power loss would have (docs/ARCHITECTURE.md).
    pub test_power_loss: bool,
    /// Bytes kept free on each tier's filesystem; a write that would go below fails with ENOSPC.
    pub reserve_bytes: u64,
    pub heartbeat_ms: u64,
    /// Most bytes per second the background scrub reads to verify checksums.
    pub scrub_rate_bytes: u64,
    /// Pause between two full scrub passes (the first starts after this, at most a minute).
    pub scrub_interval_secs: u64,
    /// Most bytes of shard files Cairn keeps on the SSD tier, summed over `ssd_dirs` (split
    /// evenly between them). Unset (the default): as much as the SSD filesystems hold above
    /// `reserve_bytes`. When the SSD tier is full, new shards go to the HDD tier.
    pub ssd_capacity: Option<u64>,
    /// The mover destages least recently used shards to HDD once SSD use passes this fraction
    /// of the SSD capacity (default 0.90)...
    pub ssd_high_watermark: f64,
    /// ...until SSD use is back under this fraction (default 0.75). Promotions never fill the
    /// SSD tier past the high watermark.
    pub ssd_low_watermark: f64,
    /// A shard read this many times from the HDD tier within `promote_window_secs` is promoted
    /// back to SSD; 0 turns promotion off. Default 1: what an epoch reads from HDD is promoted
    /// behind it, so the next epoch reads from SSD (bench/RESULTS.md: with 2, the speed-up only
    /// comes in the third epoch). 2 or more resists one-off scans instead.
    pub promote_after_reads: u32,
    /// The window of `promote_after_reads`, in seconds (default 600).
    pub promote_window_secs: u64,
    /// How often the mover checks the watermarks and the promotion candidates (default 1000).
    pub mover_interval_ms: u64,
    /// Most bytes per second the mover (and `cairn warmup`) copies between tiers (default
    /// 200 MiB/s), so moves never starve client I/O.
    pub mover_rate_bytes: u64,
    /// Read the SSD tier's shard files with O_DIRECT, bypassing the page cache (default false).
    pub ssd_direct_io: bool,
    /// Read the HDD tier's shard files with O_DIRECT (default false): whole-shard reads of cold
    /// data then leave the page cache to hot data. Shards written or moved to such a tier are
    /// dropped from the page cache once on disk. The chunkserver refuses to start if the
    /// directory's filesystem cannot do O_DIRECT.
    pub hdd_direct_io: bool,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (unset: no metrics endpoint);
    /// `https://ADDR`: over TLS, to certificates with the monitor or admin role.
    pub metrics_listen: Option<String>,
    /// The TLS directory (`ca.pem`, `cert.pem`, `key.pem`; `cairn cert issue` makes one): every
    /// connection, to and from this server, is mutual TLS with it. Re-read on SIGHUP and when
    /// its files change.
    pub tls_dir: PathBuf,
    /// No TLS: connections are neither authenticated nor encrypted, anyone who reaches the
    /// port can do anything (for a test bench on a closed network; logged at every start).
    pub plaintext: bool,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            meta: "127.0.0.1:9400".into(),
            state_dir: PathBuf::from("/var/lib/cairn/chunk"),
            ssd_dirs: vec![PathBuf::from("/var/lib/cairn/chunk/ssd")],
            hdd_dirs: vec![PathBuf::from("/var/lib/cairn/chunk/hdd")],
            io_engine: IoEngineKind::Uring,
            queue_depth: 64,
            sync: true,
            flush_interval_ms: 1_000,
            test_power_loss: false,
            reserve_bytes: 64 << 20,
            heartbeat_ms: 1_000,
            scrub_rate_bytes: 20 << 20,
            scrub_interval_secs: 86_400,
            ssd_capacity: None,
            ssd_high_watermark: 0.90,
            ssd_low_watermark: 0.75,
            promote_after_reads: 1,
            promote_window_secs: 600,
            mover_interval_ms: 1_000,
            mover_rate_bytes: 200 << 20,
            ssd_direct_io: false,
            hdd_direct_io: false,
            metrics_listen: None,
            tls_dir: PathBuf::from(DEFAULT_TLS_DIR),
            plaintext: false,
        }
    }
}

impl ChunkConfig {
    /// Where this server's TLS identity comes from.
    pub fn tls_source(&self) -> TlsSource {
        if self.plaintext {
            TlsSource::Plaintext
        } else {
            TlsSource::Dir(self.tls_dir.clone())
        }
    }

    pub fn validate(&self) -> Result<()> {
        check_addr("listen", &self.listen)?;
        for addr in meta_addrs(&self.meta)? {
            check_peer("meta", &addr)?;
        }
        if let Some(m) = &self.metrics_listen {
            check_metrics_addr(m)?;
        }
        if self.ssd_dirs.is_empty() && self.hdd_dirs.is_empty() {
            return Err(CairnError::invalid("config: at least one of ssd_dirs or hdd_dirs is needed"));
        }
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return Err(CairnError::invalid("config: queue_depth must be 1..=4096"));
        }
        if self.flush_interval_ms == 0 || self.flush_interval_ms > 60_000 {
            return Err(CairnError::invalid("config: flush_interval_ms must be 1..=60000"));
        }
        if self.heartbeat_ms == 0 {
            return Err(CairnError::invalid("config: heartbeat_ms must be > 0"));
        }
        let (low, high) = (self.ssd_low_watermark, self.ssd_high_watermark);
        if !(low > 0.0 && low < high && high <= 1.0) {
            return Err(CairnError::invalid(format!(
                "config: the SSD watermarks need 0 < ssd_low_watermark < ssd_high_watermark <= 1 \
                 (got {low} and {high})"
            )));
        }
        if self.ssd_capacity == Some(0) {
            return Err(CairnError::invalid(
                "config: ssd_capacity must be > 0 (leave it unset for the whole SSD)",
            ));
        }
        if self.promote_after_reads > 0 && self.promote_window_secs == 0 {
            return Err(CairnError::invalid("config: promote_window_secs must be > 0"));
        }
        if self.promote_after_reads > 64 {
            return Err(CairnError::invalid("config: promote_after_reads must be at most 64"));
        }
        if self.mover_interval_ms == 0 {
            return Err(CairnError::invalid("config: mover_interval_ms must be > 0"));
        }
        if self.mover_rate_bytes < 1 << 20 {
            return Err(CairnError::invalid("config: mover_rate_bytes must be at least 1048576 (1 MiB/s)"));
        }
        Ok(())
    }
}

/// An address of another process: `host:port` with a port number. The host is not resolved
/// here: a peer's name may not resolve yet when this one starts (a StatefulSet's other pods, a
/// compose service not started); connections resolve it, and retry, when they are made.
fn check_peer(field: &str, addr: &str) -> Result<()> {
    let bad = |why: &str| {
        CairnError::invalid(format!("config: {field} = {addr:?} is not a host:port address ({why})"))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    port.parse::<u16>().map_err(|_| bad("the port is not a number up to 65535"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/' || c == ',') {
        return Err(bad("no host"));
    }
    Ok(())
}

/// A metrics address: `host:port`, `http://host:port`, or `https://host:port` (served over TLS
/// to monitor and admin certificates).
fn check_metrics_addr(addr: &str) -> Result<()> {
    let bare = addr.strip_prefix("https://").or_else(|| addr.strip_prefix("http://")).unwrap_or(addr);
    check_addr("metrics_listen", bare)
}

fn check_addr(field: &str, addr: &str) -> Result<()> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs().map(|_| ()).map_err(|e| {
        CairnError::invalid(format!("config: {field} = {addr:?} is not a host:port address ({e})"))
    })
}

/// Read and parse a TOML config file, with the file name in every error.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CairnError::invalid(format!("cannot read config {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| CairnError::invalid(format!("config {}: {e}", path.display())))
}

/// Environment variable prefixes of the two server configs.
pub const META_ENV_PREFIX: &str = "CAIRN_META_";

/// Where servers, mounts and admin commands look for their TLS directory by default.
pub const DEFAULT_TLS_DIR: &str = "/etc/cairn/tls";

/// Where a process's TLS identity comes from, as its config or command line says.
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// No TLS: only when asked for explicitly.
    Plaintext,
    /// The TLS directory.
    Dir(PathBuf),
}

/// The metaserver addresses in a comma-separated list of `host:port` (an `http://` prefix is
/// dropped): the one parser of `--meta` and `meta =` for every process.
pub fn meta_addrs(list: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> = list
        .split(',')
        .map(|a| a.trim())
        .filter(|a| !a.is_empty())
        .map(|a| a.strip_prefix("http://").unwrap_or(a).to_string())
        .collect();
    if addrs.is_empty() {
        return Err(CairnError::invalid(format!("metaserver addresses {list:?}: none given")));
    }
    Ok(addrs)
}
pub const CHUNK_ENV_PREFIX: &str = "CAIRN_CHUNK_";

/// A config from an optional file (else every default), then environment variables named
/// `env_prefix` + KEY, then `sets` (`key=value` from `--set` flags), each override checked on
/// its own so an error names the variable or flag it came from.
pub fn load_with<T: DeserializeOwned + Serialize + Default>(
    path: Option<&Path>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
    sets: &[String],
) -> Result<T> {
    let mut table = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CairnError::invalid(format!("cannot read config {}: {e}", path.display())))?;
            // Parse as T first, for its precise errors (unknown key, wrong type) with the file name.
            toml::from_str::<T>(&text)
                .map_err(|e| CairnError::invalid(format!("config {}: {e}", path.display())))?;
            text.parse::<toml::Table>()
                .map_err(|e| CairnError::invalid(format!("config {}: {e}", path.display())))?
        }
        None => toml::Table::new(),
    };
    let defaults = toml::Table::try_from(T::default())
        .map_err(|e| CairnError::internal(format!("default config: {e}")))?;
    let mut overrides: Vec<(String, String, String)> = Vec::new();
    let mut env: Vec<(String, String)> = env.into_iter().filter(|(k, _)| k.starts_with(env_prefix)).collect();
    env.sort();
    for (name, value) in env {
        let key = name[env_prefix.len()..].to_ascii_lowercase();
        overrides.push((name, key, value));
    }
    for set in sets {
        let (key, value) = set
            .split_once('=')
            .ok_or_else(|| CairnError::invalid(format!("--set {set:?}: expected key=value")))?;
        overrides.push((format!("--set {key}"), key.trim().to_string(), value.to_string()));
    }
    for (source, key, text) in overrides {
        let value = override_value(defaults.get(&key), &text);
        // Alone over the defaults: an unknown key or a value of the wrong type is named here.
        let single = toml::Table::from_iter([(key.clone(), value.clone())]);
        toml::Value::Table(single)
            .try_into::<T>()
            .map_err(|e| CairnError::invalid(format!("{source}={text}: {}", e.to_string().trim())))?;
        table.insert(key, value);
    }
    toml::Value::Table(table).try_into().map_err(|e| CairnError::invalid(format!("config: {e}")))
}

/// `text` as a TOML value of the kind `default` has (see the module comment).
fn override_value(default: Option<&toml::Value>, text: &str) -> toml::Value {
    let parsed = || format!("v = {text}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v"));
    match default {
        Some(toml::Value::String(_)) => toml::Value::String(text.to_string()),
        Some(toml::Value::Array(_)) if !text.trim_start().starts_with('[') => toml::Value::Array(
            text.split(',').filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.trim().into())).collect(),
        ),
        _ => parsed().unwrap_or_else(|| toml::Value::String(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        MetaConfig::default().validate().unwrap();
        ChunkConfig::default().validate().unwrap();
        assert_eq!(MetaConfig::default().layout().unwrap(), Layout::default());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let err = toml::from_str::<MetaConfig>("listn = \"x\"").unwrap_err().to_string();
        assert!(err.contains("listn"), "{err}");
        let cfg: MetaConfig = toml::from_str("ec = \"4+9\"").unwrap();
        assert!(cfg.validate().is_err());
        let cfg: ChunkConfig = toml::from_str("meta = \"nowhere\"").unwrap();
        assert!(cfg.validate().is_err());
        let cfg: ChunkConfig = toml::from_str("io_engine = \"pread\"\nqueue_depth = 8").unwrap();
        assert_eq!(cfg.io_engine, IoEngineKind::Pread);
        for bad in [
            "ssd_low_watermark = 0.95",
            "ssd_high_watermark = 1.5",
            "ssd_low_watermark = 0.0",
            "ssd_capacity = 0",
            "mover_interval_ms = 0",
            "mover_rate_bytes = 10",
            "promote_window_secs = 0",
        ] {
            let cfg: ChunkConfig = toml::from_str(bad).unwrap();
            assert!(cfg.validate().is_err(), "{bad}");
        }
        let cfg: ChunkConfig = toml::from_str("ssd_capacity = 8388608\npromote_after_reads = 0").unwrap();
        cfg.validate().unwrap();
        // An unset capacity survives a round trip through TOML (as `cairn up` writes configs).
        let text = toml::to_string(&ChunkConfig::default()).unwrap();
        assert_eq!(toml::from_str::<ChunkConfig>(&text).unwrap(), ChunkConfig::default());
    }

    #[test]
    fn a_group_other_than_0_is_a_raft_group_within_range() {
        let replicas = vec!["1=127.0.0.1:9401".to_string()];
        let with = |group, replicas: &Vec<String>| MetaConfig {
            group,
            raft_id: 1,
            replicas: replicas.clone(),
            ..MetaConfig::default()
        };
        with(3, &replicas).validate().unwrap();
        with(MAX_GROUPS - 1, &replicas).validate().unwrap();
        let err = with(MAX_GROUPS, &replicas).validate().unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
        let lone = MetaConfig { group: 3, ..MetaConfig::default() };
        let err = lone.validate().unwrap_err().to_string();
        assert!(err.contains("give it its replicas"), "{err}");
        // Absent in a config of a build before groups: group 0.
        let cfg: MetaConfig = toml::from_str("cluster = \"c\"").unwrap();
        assert_eq!(cfg.group, 0);
    }

    #[test]
    fn peer_addresses_are_checked_for_form_but_not_resolved() {
        let with = |replicas: &[&str]| MetaConfig {
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            raft_id: 1,
            ..MetaConfig::default()
        };
        // A peer that does not resolve yet (another pod, a service not started) is fine.
        with(&["1=127.0.0.1:9400", "2=cairn-meta-1.cairn-meta.invalid:9400", "3=[::1]:9400"])
            .validate()
            .unwrap();
        for bad in ["2=nohost", "2=:9400", "2=host:99999", "2=host:port", "2=a b:9400"] {
            let e = with(&["1=127.0.0.1:9400", bad]).validate().unwrap_err();
            assert!(e.message().contains("is not a host:port address"), "{bad}: {e}");
        }
        let chunk = ChunkConfig {
            meta: "meta-0.cairn.invalid:9400,meta-1.cairn.invalid:9400".into(),
            ..ChunkConfig::default()
        };
        chunk.validate().unwrap();
        let chunk = ChunkConfig { meta: "meta:nine".into(), ..ChunkConfig::default() };
        assert!(chunk.validate().is_err());
    }

    #[test]
    fn deploy_examples_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config");
        load::<MetaConfig>(&dir.join("meta.toml")).unwrap().validate().unwrap();
        let chunk = load::<ChunkConfig>(&dir.join("chunk.toml")).unwrap();
        assert_eq!(chunk.hdd_dirs.len(), 2);
    }

    #[test]
    fn env_and_set_override_the_file_and_name_their_source() {
        let dir = std::env::temp_dir().join(format!("cairn-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("chunk.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:1\"\nqueue_depth = 8\nsync = false\n").unwrap();
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let cfg: ChunkConfig = load_with(
            Some(&file),
            CHUNK_ENV_PREFIX,
            env(&[
                ("CAIRN_CHUNK_QUEUE_DEPTH", "16"),
                ("CAIRN_CHUNK_SSD_DIRS", "/a,/b"),
                ("CAIRN_META", "ignored: the CLI's metaserver address"),
                ("PATH", "/bin"),
            ]),
            &["queue_depth=32".into(), "sync=true".into(), "ssd_capacity=1048576".into()],
        )
        .unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:1", "from the file");
        assert_eq!(cfg.queue_depth, 32, "--set beats env beats file");
        assert!(cfg.sync);
        assert_eq!(cfg.ssd_dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(cfg.ssd_capacity, Some(1 << 20));
        // No file: defaults, and a string key keeps text that looks like a number.
        let meta: MetaConfig =
            load_with(None, META_ENV_PREFIX, env(&[("CAIRN_META_EC", "8+3")]), &["unit=65536".into()])
                .unwrap();
        assert_eq!((meta.ec.as_str(), meta.unit), ("8+3", 65536));
        let e = load_with::<MetaConfig>(None, META_ENV_PREFIX, env(&[("CAIRN_META_LISTN", "x")]), &[])
            .unwrap_err();
        assert!(e.message().contains("CAIRN_META_LISTN") && e.message().contains("listn"), "{}", e.message());
        let e = load_with::<MetaConfig>(None, META_ENV_PREFIX, [], &["unit=lots".into()]).unwrap_err();
        assert!(e.message().contains("--set unit=lots"), "{}", e.message());
        let e = load_with::<MetaConfig>(None, META_ENV_PREFIX, [], &["unit".into()]).unwrap_err();
        assert!(e.message().contains("key=value"), "{}", e.message());
        let e =
            load_with::<ChunkConfig>(Some(&dir.join("none.toml")), CHUNK_ENV_PREFIX, [], &[]).unwrap_err();
        assert!(e.message().contains("none.toml"), "{}", e.message());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_names_the_file() {
        let err = load::<MetaConfig>(Path::new("/nonexistent/cairn.toml")).unwrap_err();
        assert!(err.message().contains("/nonexistent/cairn.toml"));
    }
}
