//! Cairn's metaserver: the namespace (inodes, directory entries, xattrs, stripe records) over
//! a RocksDB store, the chunkserver registry and placement, and the garbage collector of
//! orphaned shards, served as the `Meta` gRPC service.
//!
//! Module map: `store` (the `MetaStore` trait, RocksDB and in-memory backends), `schema` (key
//! and versioned value encodings), `namespace` (every FUSE-level operation, one atomic batch
//! each), `registry` (chunkservers, liveness, placement), `gc` (shard deletion), `service`
//! (the gRPC adapter).

pub mod access;
pub mod audit;
pub mod cluster;
#[cfg(test)]
mod fake_chunk;
#[cfg(test)]
mod fixture;
pub mod gc;
pub mod groups;
pub mod health;
pub mod metrics;
pub mod namespace;
pub mod permissions;
pub mod raft;
pub mod reconcile;
pub mod registry;
pub mod repair;
pub mod repair_state;
pub mod schema;
pub mod service;
pub mod sessions;
pub mod store;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::config::MetaConfig;
use cairn_common::{CairnError, Result};
use cairn_net::{server, wire};
use cairn_proto::meta_server::MetaServer;

pub use cluster::Cluster;
pub use gc::Gc;
pub use namespace::Namespace;
pub use registry::Registry;
pub use service::MetaService;

/// Open the namespace in `config.data_dir`, and the cluster state beside it.
pub fn open_namespace(config: &MetaConfig) -> Result<(Namespace, Arc<Cluster>)> {
    config.validate()?;
    let raft_dir = config.data_dir.join("raft");
    if raft_dir.exists() {
        return Err(CairnError::invalid(format!(
            "{} holds a replicated namespace ({}): start this metaserver with its replicas and raft_id",
            config.data_dir.display(),
            raft_dir.display()
        )));
    }
    Namespace::open_rocks(
        &config.data_dir,
        config.sync_mode,
        config.layout()?,
        Duration::from_millis(config.node_timeout_ms),
        Duration::from_millis(config.client_lease_ms),
    )
}

/// Whether `dir` is absent or empty (where `cairn meta init` and `restore` may make data).
pub fn is_new(dir: &std::path::Path) -> Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(CairnError::from_io(&format!("cannot read {}", dir.display()), &e)),
    }
}

/// Refuse to serve from a data directory that holds no metadata of this metaserver: a typo in
/// `data_dir` must not start a new, empty cluster (`docs/ARCHITECTURE.md`, "Cluster identity").
fn check_initialized(config: &MetaConfig) -> Result<()> {
    let dir = config.data_dir.display();
    if config.replicas.is_empty() {
        if config.data_dir.join("CURRENT").exists() || config.data_dir.join("raft").exists() {
            return Ok(());
        }
        return Err(CairnError::invalid(format!(
            "{dir} holds no namespace: for a new cluster, `cairn meta init` with this config makes \
             an empty one; for this cluster's, point data_dir at its data (or restore a backup \
             into it with `cairn meta restore`)"
        )));
    }
    if config.data_dir.join("raft").join(raft::node::CLUSTER_FILE).exists()
        || config.data_dir.join("CURRENT").exists()
    {
        return Ok(());
    }
    Err(CairnError::invalid(format!(
        "{dir} holds no replica data: `cairn meta init` with this config makes a replica of a new \
         cluster (founded with the others at their first start), `cairn meta init --join` one \
         that the running group catches up (replacing a lost replica, or for `cairn meta add`); \
         for this replica's own data, point data_dir at it"
    )))
}

/// Make the data directory of a new metaserver (`cairn meta init`), which must be empty or
/// absent: a lone metaserver's new, empty namespace (its cluster id drawn now), or a
/// replica's Raft directory stamped with its cluster — with `join`, one that waits for the
/// running group to catch it up instead of founding one. Returns what was made.
pub fn init(config: &MetaConfig, join: bool) -> Result<String> {
    config.validate()?;
    let dir = &config.data_dir;
    if !is_new(dir)? {
        return Err(CairnError::invalid(format!(
            "{} is not empty: `cairn meta init` makes only new data directories (a metaserver \
             whose data is there starts without it)",
            dir.display()
        )));
    }
    if config.replicas.is_empty() {
        if join {
            return Err(CairnError::invalid(
                "--join makes a replica of a replicated metaserver: this config has no replicas",
            ));
        }
        let (ns, _) = open_namespace(config)?;
        return Ok(format!(
            "made a new, empty namespace in {} (cluster id {})",
            dir.display(),
            ns.cluster_id()
        ));
    }
    let raft_dir = dir.join("raft");
    raft::node::stamp_dir(&raft_dir, &raft::network::GroupName::new(&config.cluster, config.group))?;
    if !join {
        return Ok(format!(
            "made replica {} of {} in {}: it founds the group with the others at their first start",
            config.raft_id,
            raft::network::GroupName::new(&config.cluster, config.group),
            dir.display()
        ));
    }
    let marker = raft_dir.join(raft::node::JOIN_FILE);
    std::fs::write(&marker, b"")
        .map_err(|e| CairnError::from_io(&format!("cannot write {}", marker.display()), &e))?;
    Ok(format!(
        "made replica {} of {} in {}: it waits for the running group to catch it up",
        config.raft_id,
        raft::network::GroupName::new(&config.cluster, config.group),
        dir.display()
    ))
}

/// Restore the metadata backup `file` (`cairn meta backup`) as the data of the metaserver
/// `config` describes, whose data directory must be empty or absent: a replica's data for a
/// new group of `config.replicas` (start this replica and the others, with empty data
/// directories, and they catch up from it), or a lone metaserver's. Returns the applied index
/// the backup holds. The metaserver must not be running.
pub fn restore(config: &MetaConfig, file: &std::path::Path) -> Result<u64> {
    config.validate()?;
    let dir = &config.data_dir;
    if !is_new(dir)? {
        return Err(CairnError::invalid(format!(
            "{} is not empty: a backup is restored only into an empty data directory",
            dir.display()
        )));
    }
    if config.replicas.is_empty() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| CairnError::from_io(&format!("cannot create {}", parent.display()), &e))?;
        }
        // The database is made beside and renamed into place: an empty directory there goes
        // first (one that cannot, such as a mount point, is refused rather than restored into
        // half-way).
        if let Err(e) = std::fs::remove_dir(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(CairnError::from_io(
                    &format!(
                        "cannot replace the empty {} (a mount point? restore into a directory below it and point data_dir there)",
                        dir.display()
                    ),
                    &e,
                ));
            }
        }
        return raft::state::restore(file, dir, None, 0);
    }
    let members = config.replica_addrs()?;
    let raft_dir = dir.join("raft");
    raft::node::stamp_dir(&raft_dir, &raft::network::GroupName::new(&config.cluster, config.group))?;
    let restored =
        raft::state::restore(file, &raft_dir.join("sm"), Some((config.raft_id, &members)), config.group);
    if restored.is_err() {
        let _ = std::fs::remove_dir_all(&raft_dir);
    }
    restored
}

/// Expire silent client sessions, free the unlinked files nobody holds open any more, and
/// forget old records of changes done once.
/// Orphans left from before a restart are freed once clients had a full lease to re-announce
/// their open files.
async fn reap_sessions(ns: Arc<Namespace>, cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut swept_after_grace = false;
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        ticks += 1;
        let (ns, cluster) = (ns.clone(), cluster.clone());
        let sweep = !swept_after_grace && cluster.sessions().past_grace();
        let result = tokio::task::spawn_blocking(move || -> Result<()> {
            // Once a minute: the records of changes done once that no client can still resend.
            if ticks.is_multiple_of(60) {
                ns.forget_old_once(namespace::once::KEEP)?;
            }
            for ino in cluster.sessions().expire() {
                ns.free_if_orphan(ino)?;
            }
            if sweep {
                let freed = ns.free_orphans()?;
                if freed > 0 {
                    tracing::info!(freed, "freed unlinked files no client has open");
                }
            }
            Ok(())
        })
        .await;
        match result {
            Ok(Ok(())) => swept_after_grace |= sweep,
            Ok(Err(e)) => tracing::warn!("session reaper: {e}"),
            Err(e) => tracing::warn!("session reaper: {e}"),
        }
    }
}

/// Serve the `Meta` service on `listener` until `shutdown` completes, with the garbage
/// collector running alongside (and, with `replicas`, as one replica of a Raft group).
pub async fn serve(
    config: MetaConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    check_initialized(&config)?;
    let access = match &config.access_file {
        Some(path) => {
            if config.plaintext {
                tracing::warn!(
                    file = %path.display(),
                    "access rules do not apply on a plaintext server: callers have no certificate names"
                );
            }
            let access = access::Access::load(path)?;
            access.watch();
            access
        }
        None => access::Access::none(),
    };
    let background = Background {
        access,
        gc_interval: Duration::from_millis(config.gc_interval_ms),
        rebuild_after: Duration::from_millis(config.rebuild_after_ms),
        repair_rate_bytes: config.repair_rate_bytes,
        orphan_grace: Duration::from_millis(config.orphan_grace_ms),
        unknown_inode_grace: Duration::from_millis(config.unknown_inode_grace_ms),
        reconcile_interval: Duration::from_millis(config.reconcile_interval_ms),
        audit_interval: Duration::from_millis(config.content_audit_interval_ms),
        audit_rate: config.content_audit_shards_per_sec,
    };
    if !config.replicas.is_empty() {
        return serve_replicated(config, background, listener, shutdown).await;
    }
    let cfg = config.clone();
    let (ns, cluster) = tokio::task::spawn_blocking(move || open_namespace(&cfg))
        .await
        .map_err(|e| CairnError::internal(format!("opening the namespace: {e}")))??;
    serve_with(Arc::new(ns), cluster, background, listener, shutdown).await
}

/// Serve as one replica of the namespace's Raft group: answer the other replicas at once, and
/// clients while this replica leads (`lead`); the others are told `NotLeader`.
async fn serve_replicated(
    config: MetaConfig,
    background: Background,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    config.validate()?;
    if config.data_dir.join("CURRENT").exists() {
        return Err(CairnError::invalid(format!(
            "{} holds the namespace of a metaserver that ran alone: a replicated metaserver keeps \
             its data in {}/raft; start it without replicas, or give the replica an empty data_dir",
            config.data_dir.display(),
            config.data_dir.display()
        )));
    }
    let settings = raft::node::RaftSettings {
        id: config.raft_id,
        members: config.replica_addrs()?,
        name: raft::network::GroupName::new(&config.cluster, config.group),
        dir: config.data_dir.join("raft"),
        heartbeat: Duration::from_millis(config.raft_heartbeat_ms),
        election: Duration::from_millis(config.raft_election_ms),
        write_timeout: Duration::from_millis(config.raft_write_timeout_ms),
        snapshot_every: config.raft_snapshot_every,
    };
    let service = Arc::new(MetaService::replicated_pending().with_access(background.access.clone()));
    // The listener answers from the start: the other replicas need this one to elect a leader.
    let (stopped, shutdown) = server::split_shutdown(shutdown);
    let (incoming, accepting) =
        server::serve(listener, Arc::new(wire::meta::Service(service.clone())), stopped);
    let grpc = MetaServer::from_arc(service.clone())
        .max_decoding_message_size(cairn_common::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(cairn_common::MAX_MESSAGE_BYTES);
    let server = tokio::spawn(
        server::grpc_server()
            .layer(cairn_net::metrics::RpcMetricsLayer::new("meta"))
            .add_service(grpc)
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    let node = match raft::node::RaftNode::start(settings).await {
        Ok(node) => node,
        Err(e) => {
            server.abort();
            return Err(e);
        }
    };
    service.set_raft(node.clone());
    tracing::info!(
        id = node.id(),
        cluster = node.cluster(),
        group = node.group(),
        "metaserver replica started"
    );
    let open = {
        let layout = config.layout()?;
        let node_timeout = Duration::from_millis(config.node_timeout_ms);
        let lease = Duration::from_millis(config.client_lease_ms);
        move |store: Arc<raft::node::RaftStore>| {
            Namespace::open_with_cluster(store, layout, node_timeout, lease)
        }
    };
    // A group other than 0 has no root directory: its leader holds the group map group 0's
    // leader shares with it, fences the chunkservers and serves the namespace of its slots.
    let leading = if node.group() == 0 {
        tokio::spawn(lead(node.clone(), ServeNamespace { service: service.clone(), open, background }))
    } else {
        let slots = ServeSlots {
            service: service.clone(),
            group: node.group(),
            node_timeout: Duration::from_millis(config.node_timeout_ms),
            client_lease: Duration::from_millis(config.client_lease_ms),
            background,
        };
        tokio::spawn(lead(node.clone(), slots))
    };
    let result = match server.await {
        Ok(r) => r.map_err(|e| CairnError::io(format!("metaserver: {e}"))),
        Err(e) => Err(CairnError::internal(format!("metaserver: {e}"))),
    };
    leading.abort();
    let _ = leading.await;
    service.serve(None);
    node.shutdown().await;
    let _ = accepting.await;
    result
}

/// The background work of a serving namespace, stopped when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Tasks {
    async fn stop(mut self) {
        for task in &self.0 {
            task.abort();
        }
        for task in self.0.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Start the garbage collector, the session reaper, the repair, the content audit and the
/// metrics beside `ns`.
fn start_background(
    ns: Arc<Namespace>,
    cluster: Arc<Cluster>,
    background: Background,
) -> (service::Serving, Tasks) {
    let gc = tokio::spawn(Gc::new(ns.clone(), cluster.clone()).run(background.gc_interval));
    let reaper = tokio::spawn(reap_sessions(ns.clone(), cluster.clone()));
    let repair = repair_of(&ns, &cluster, &background);
    let repairing = tokio::spawn(repair.clone().run(Duration::from_secs(2), background.reconcile_interval));
    let published = tokio::spawn(metrics::publish(ns.clone(), cluster.clone(), Duration::from_secs(5)));
    let mut tasks = vec![gc, reaper, repairing, published];
    if !background.audit_interval.is_zero() {
        let audit = audit::Audit::new(ns.clone(), cluster.clone(), background.audit_rate);
        tasks.push(tokio::spawn(audit.run(background.audit_interval)));
    }
    (service::Serving { ns, cluster, repair: Some(repair) }, Tasks(tasks))
}

/// How often the leader of group 0 asks the other metadata groups how they are.
const GROUP_HEALTH_EVERY: Duration = Duration::from_secs(5);

/// What one leadership of a replica runs: opened over the replicated store once the replica
/// leads and has applied everything committed, stopped when the leadership ends ([`lead`]).
trait Leadership: Send + 'static {
    type Opened: Send + 'static;
    /// What it serves, for the log.
    const WHAT: &'static str;
    /// Open over the store (on the blocking pool).
    fn open(&self) -> impl Fn(Arc<raft::node::RaftStore>) -> Result<Self::Opened> + Send + 'static;
    /// Start serving what was opened; the tasks returned stop with the leadership.
    fn start(&self, opened: Self::Opened) -> Tasks;
    /// Stop answering clients (before the tasks stop).
    fn stop(&self);
}

/// Group 0's leadership: the namespace, its background work and the watch over other groups.
struct ServeNamespace<F> {
    service: Arc<MetaService>,
    open: F,
    background: Background,
}

impl<F> Leadership for ServeNamespace<F>
where
    F: Fn(Arc<raft::node::RaftStore>) -> Result<(Namespace, Arc<Cluster>)> + Clone + Send + 'static,
{
    type Opened = (Namespace, Arc<Cluster>);
    const WHAT: &'static str = "the namespace";

    fn open(&self) -> impl Fn(Arc<raft::node::RaftStore>) -> Result<Self::Opened> + Send + 'static {
        self.open.clone()
    }

    fn start(&self, (ns, cluster): Self::Opened) -> Tasks {
        let ns = Arc::new(ns);
        let (serving, mut tasks) = start_background(ns.clone(), cluster.clone(), self.background.clone());
        tasks.0.push(tokio::spawn(self.service.clone().finish_txns(ns.clone())));
        tasks.0.push(tokio::spawn(self.service.clone().watch_groups(ns, cluster, GROUP_HEALTH_EVERY)));
        self.service.serve(Some(serving));
        tasks
    }

    fn stop(&self) {
        self.service.serve(None);
    }
}

/// The leadership of a group other than 0: the group map group 0's leader shares with it, the
/// fence (its namespace epoch and capability keys) it sends chunkservers every second, and the
/// namespace of its slots, opened once it holds the cluster's identity.
struct ServeSlots {
    service: Arc<MetaService>,
    group: u32,
    node_timeout: Duration,
    client_lease: Duration,
    background: Background,
}

/// How often a leader of a group other than 0 fences the chunkservers.
const FENCE_EVERY: Duration = Duration::from_secs(1);

impl Leadership for ServeSlots {
    type Opened = (Arc<groups::Groups>, u64);
    const WHAT: &'static str = "the group map and its slots";

    fn open(&self) -> impl Fn(Arc<raft::node::RaftStore>) -> Result<Self::Opened> + Send + 'static {
        |store: Arc<raft::node::RaftStore>| {
            let (held, epoch) = groups::Groups::open_leadership(store)?;
            Ok((Arc::new(held), epoch))
        }
    }

    fn start(&self, (held, epoch): Self::Opened) -> Tasks {
        self.service.hold_map(Some(held.clone()));
        let fence = self.service.clone().fence_chunkservers(held.clone(), epoch, FENCE_EVERY);
        let slots = serve_slots(
            (self.service.clone(), self.group),
            held,
            epoch,
            (self.node_timeout, self.client_lease, self.background.clone()),
        );
        Tasks(vec![tokio::spawn(fence), tokio::spawn(slots)])
    }

    fn stop(&self) {
        // The map first: `serve_slots` serves only while its leadership's map is held.
        self.service.hold_map(None);
        self.service.serve(None);
    }
}

/// Collect the garbage of a group other than 0 (its unlinked files' shards) and repair its
/// files (rebuild, drain, relocation, reconciliation of its slots' shards), once its registry
/// holds group 0's chunkservers: the GC drops what is queued for nodes it does not know, and
/// the repair would find every node gone.
async fn collect_and_repair(
    ns: Arc<Namespace>,
    cluster: Arc<Cluster>,
    repair: Arc<repair::Repair>,
    background: Background,
) {
    while !cluster.registry().mirrored() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::join!(
        Gc::new(ns, cluster).run(background.gc_interval),
        repair.run(Duration::from_secs(2), background.reconcile_interval)
    );
}

/// The repair of `ns`'s files, as `background` sets it.
fn repair_of(ns: &Arc<Namespace>, cluster: &Arc<Cluster>, background: &Background) -> Arc<repair::Repair> {
    Arc::new(
        repair::Repair::new(
            ns.clone(),
            cluster.clone(),
            background.rebuild_after,
            background.repair_rate_bytes,
        )
        .with_orphan_grace(background.orphan_grace)
        .with_unknown_inode_grace(background.unknown_inode_grace),
    )
}

/// Open the namespace of this group's slots (one other than 0) once it holds the cluster's
/// identity — group 0's leader shares it with the map, within seconds of the group's adding —
/// serve it, and reap its clients' sessions while it serves.
async fn serve_slots(
    (service, group): (Arc<MetaService>, u32),
    held: Arc<groups::Groups>,
    epoch: u64,
    (node_timeout, client_lease, background): (Duration, Duration, Background),
) {
    let mut said = String::new();
    loop {
        // The map's store, not a new one: taking a new store retires the earlier ones.
        let (store, groups, held_for_ns) = (held.store().clone(), held.clone(), held.clone());
        let opened = tokio::task::spawn_blocking(move || {
            let cluster = Cluster::open_with_groups(store.clone(), groups, node_timeout, client_lease)?;
            let ns = Namespace::open_slots(store, (group, held_for_ns), epoch, cluster.clone())?;
            Ok::<_, CairnError>((Arc::new(ns), cluster))
        })
        .await;
        match opened {
            Ok(Ok((ns, cluster))) => {
                let repair = repair_of(&ns, &cluster, &background);
                let serving = service::Serving {
                    ns: ns.clone(),
                    cluster: cluster.clone(),
                    repair: Some(repair.clone()),
                };
                if service.serve_slots(&held, serving) {
                    tracing::info!(group, epoch, "serving the namespace slots of this group");
                    let collect = collect_and_repair(ns.clone(), cluster.clone(), repair, background);
                    let finish = service.clone().finish_txns(ns.clone());
                    tokio::join!(reap_sessions(ns, cluster), collect, finish);
                }
                return;
            }
            // Said once, not at every try: a new group waits here until group 0 shares.
            Ok(Err(e)) if e.to_string() != said => {
                tracing::info!("not serving this group's namespace slots yet: {e}");
                said = e.to_string();
            }
            Ok(Err(_)) => {}
            Err(e) => tracing::warn!("opening this group's namespace slots: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Serve while this replica leads: once it leads and has applied everything committed, open
/// what `leadership` serves over the replicated store (which reads the leader's in-memory
/// state from what was applied) and start it; stop it when the replica stops leading, its term
/// changes, or a write failed (what was opened may then disagree with the store).
async fn lead<L: Leadership>(node: Arc<raft::node::RaftNode>, leadership: L) {
    let what = L::WHAT;
    let mut metrics = node.raft.metrics();
    let mut current: Option<(u64, Tasks)> = None;
    loop {
        let leads = node.is_leader();
        let term = node.term();
        let poisoned = node.take_poisoned();
        if let Some((served, _)) = &current {
            if !leads || *served != term || poisoned {
                leadership.stop();
                let (served, tasks) = current.take().expect("checked above");
                tasks.stop().await;
                metrics::clear();
                // Requests already inside what was served finish (or fail) before a new one
                // may open: see `RaftNode::retire_stores`.
                let retiring = node.clone();
                let _ = tokio::task::spawn_blocking(move || retiring.retire_stores()).await;
                tracing::info!(term = served, leads, poisoned, "stopped serving {what}");
            }
        }
        if leads && current.is_none() {
            match node.caught_up().await {
                Ok(()) => {
                    let (open, opener) = (leadership.open(), node.clone());
                    match tokio::task::spawn_blocking(move || open(opener.store())).await {
                        Ok(Ok(opened)) => {
                            current = Some((term, leadership.start(opened)));
                            tracing::info!(term, id = node.id(), "leading: serving {what}");
                        }
                        Ok(Err(e)) => tracing::warn!("opening {what} as leader: {e}"),
                        Err(e) => tracing::warn!("opening {what} as leader: {e}"),
                    }
                }
                Err(e) => tracing::info!("not serving yet: {e}"),
            }
            if current.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        tokio::select! {
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Timing of the background tasks that run beside the service.
#[derive(Clone, Debug)]
pub struct Background {
    /// The access rules clients are held to (served beside the background work).
    pub access: Arc<access::Access>,
    pub gc_interval: Duration,
    pub rebuild_after: Duration,
    pub repair_rate_bytes: u64,
    pub orphan_grace: Duration,
    pub unknown_inode_grace: Duration,
    pub reconcile_interval: Duration,
    /// Pause between content audit passes (zero: none), and their rate in shards per second.
    pub audit_interval: Duration,
    pub audit_rate: u64,
}

impl Default for Background {
    fn default() -> Self {
        let c = MetaConfig::default();
        Background {
            access: access::Access::none(),
            gc_interval: Duration::from_millis(c.gc_interval_ms),
            rebuild_after: Duration::from_millis(c.rebuild_after_ms),
            repair_rate_bytes: c.repair_rate_bytes,
            orphan_grace: Duration::from_millis(c.orphan_grace_ms),
            unknown_inode_grace: Duration::from_millis(c.unknown_inode_grace_ms),
            reconcile_interval: Duration::from_millis(c.reconcile_interval_ms),
            audit_interval: Duration::from_millis(c.content_audit_interval_ms),
            audit_rate: c.content_audit_shards_per_sec,
        }
    }
}

/// Serve an already opened namespace (tests use this with an in-memory store).
pub async fn serve_namespace(
    ns: Arc<Namespace>,
    cluster: Arc<Cluster>,
    gc_interval: Duration,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_with(ns, cluster, Background { gc_interval, ..Background::default() }, listener, shutdown).await
}

/// Serve `ns` with the garbage collector, the session reaper and the repair running beside.
pub async fn serve_with(
    ns: Arc<Namespace>,
    cluster: Arc<Cluster>,
    background: Background,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let background_access = background.access.clone();
    let (serving, tasks) = start_background(ns.clone(), cluster.clone(), background);
    let service = Arc::new(
        MetaService::new(ns, cluster)
            .with_repair(serving.repair.clone().expect("started with a repair"))
            .with_access(background_access),
    );
    drop(serving);
    let (stopped, shutdown) = server::split_shutdown(shutdown);
    let (incoming, accepting) =
        server::serve(listener, Arc::new(wire::meta::Service(service.clone())), stopped);
    let grpc = MetaServer::from_arc(service.clone())
        .max_decoding_message_size(cairn_common::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(cairn_common::MAX_MESSAGE_BYTES);
    let result = server::grpc_server()
        .layer(cairn_net::metrics::RpcMetricsLayer::new("meta"))
        .add_service(grpc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| CairnError::io(format!("metaserver: {e}")));
    // Wait for every task that holds the namespace to go, so the namespace (and the database
    // lock) is released when this returns and a restart in the same process can open it.
    tasks.stop().await;
    service.serve(None);
    let _ = accepting.await;
    result
}

/// Validate the config, bind `config.listen` and serve until SIGINT or SIGTERM.
pub async fn run(config: MetaConfig) -> Result<()> {
    config.validate()?;
    let open_files = cairn_net::rlimit::raise_open_files();
    if open_files < 4096 + cairn_net::rlimit::RESERVED_FDS {
        tracing::warn!(
            open_files,
            "a low open-file limit: fewer connections can be served (raise LimitNOFILE)"
        );
    }
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| CairnError::from_io(&format!("cannot listen on {}", config.listen), &e))?;
    let addr = listener.local_addr().map_err(|e| CairnError::from_io("local address", &e))?;
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "metaserver listening");
    if let Some(listen) = &config.metrics_listen {
        cairn_net::metrics::serve(listen)?;
    }
    serve(config, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("metaserver shutting down");
}
