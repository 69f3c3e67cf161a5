//! The client's connection to the metaserver: the wire protocol (`cairn_net::wire`, a pool of
//! framed TCP connections) by default, or a tonic channel when `CAIRN_TRANSPORT=grpc`, both
//! with timeouts, and one method per RPC that returns the `CairnError` the server raised. A
//! replicated metaserver is a list of addresses; requests follow its leader. With several
//! metadata groups each request goes to the group owning the slot of the inode it names, from
//! the group map fetched when a group answers `WrongGroup` (`docs/ARCHITECTURE.md`, "How
//! clients route").

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use cairn_common::{CairnError, ErrorKind, Result, MAX_MESSAGE_BYTES};
use cairn_net::connect::grpc_channel;
use cairn_net::failover::Failover;
use cairn_net::tls::Role;
use cairn_net::wire::{self, WireClient};
use cairn_proto::meta_client::MetaClient;
use futures::future::BoxFuture;
use tonic::transport::Channel;

use crate::file::FileMeta;

/// How the client talks to the servers, from `CAIRN_TRANSPORT` (`wire`, the default, or `grpc`;
/// the gRPC path is kept as a fallback and for comparison: `CAIRN_TRANSPORT=grpc bench/rpcs.sh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Wire,
    Grpc,
}

impl Transport {
    pub fn from_env() -> Result<Transport> {
        match std::env::var("CAIRN_TRANSPORT").as_deref() {
            Err(_) | Ok("") | Ok("wire") => Ok(Transport::Wire),
            Ok("grpc") => Ok(Transport::Grpc),
            Ok(other) => {
                Err(CairnError::invalid(format!("CAIRN_TRANSPORT={other:?}: expected \"wire\" or \"grpc\"")))
            }
        }
    }
}

#[derive(Clone)]
enum Conn {
    Wire(Arc<WireClient>),
    Grpc(MetaClient<Channel>),
}

/// A cheap-to-clone handle on the metaserver, or on the replicas of a replicated one: each
/// request goes to the one that answered last and follows the leader (`cairn_net::failover`),
/// in the metadata group that owns what it names.
#[derive(Clone)]
pub struct MetaConn {
    inner: Arc<Inner>,
}

struct Inner {
    /// Group 0's replicas: the addresses given.
    failover: Arc<Failover>,
    /// The group map as last fetched (none before a `WrongGroup` answer: all is group 0's).
    routes: parking_lot::RwLock<Arc<Routes>>,
    /// One fetch of the map at a time.
    refreshing: tokio::sync::Mutex<()>,
    /// One connection (pool) per address, made on first use.
    conns: parking_lot::Mutex<std::collections::HashMap<String, Conn>>,
    transport: Transport,
    timeout: Duration,
    /// The per-try limit given to every group's replica list.
    try_timeout: Option<Duration>,
    /// This client's id once registered (0: changes are not marked to be done once).
    client: std::sync::atomic::AtomicU64,
    /// The sequence of the last change marked to be done once.
    seq: std::sync::atomic::AtomicU64,
}

/// Which metadata group owns each namespace slot, and the replicas of each group other than 0.
#[derive(Default)]
struct Routes {
    version: u64,
    /// Empty: every slot is group 0's.
    slots: Vec<u32>,
    groups: std::collections::HashMap<u32, Arc<Failover>>,
}

/// How long a request waits for a group that answered `WrongGroup` under an older map than
/// this handle's to learn the newer one.
const GROUP_CATCH_UP: Duration = Duration::from_secs(10);

/// How long a lookup waits for the directory another group holds to appear there (the
/// decision of its mkdir on its way).
const ELSEWHERE_WAIT: Duration = Duration::from_secs(10);

/// What decides where a request goes: the inode it names, or the cluster (group 0).
#[derive(Clone, Copy)]
enum Route {
    Ino(u64),
    Cluster,
}

/// A call of the method `$name` with (a clone of) `$req` on a connection, over its transport.
macro_rules! method {
    ($name:ident, $req:ident) => {
        |conn: Conn| {
            let req = $req.clone();
            async move {
                match conn {
                    Conn::Wire(client) => wire::meta::$name(&client, req).await,
                    Conn::Grpc(mut client) => {
                        client.$name(req).await.map(|r| r.into_inner()).map_err(CairnError::from)
                    }
                }
            }
        }
    };
}

impl Inner {
    fn conn(&self, addr: &str) -> Result<Conn> {
        if let Some(conn) = self.conns.lock().get(addr) {
            return Ok(conn.clone());
        }
        let conn = match self.transport {
            Transport::Wire => {
                Conn::Wire(Arc::new(WireClient::new(addr, Role::Meta, Duration::from_secs(3), self.timeout)))
            }
            Transport::Grpc => {
                let channel = grpc_channel(addr, Role::Meta, Duration::from_secs(3), self.timeout)
                    .map_err(|e| CairnError::invalid(format!("metaserver address: {e}")))?;
                Conn::Grpc(
                    MetaClient::new(channel)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
        };
        Ok(self.conns.lock().entry(addr.to_string()).or_insert(conn).clone())
    }

    /// The group `route` goes to, and its replicas.
    fn group_of(&self, route: Route) -> (u32, Arc<Failover>) {
        let Route::Ino(ino) = route else { return (0, self.failover.clone()) };
        let routes = self.routes.read();
        let group = routes.slots.get(cairn_common::ids::slot_of(ino) as usize).copied().unwrap_or(0);
        match routes.groups.get(&group) {
            Some(replicas) => (group, replicas.clone()),
            None => (0, self.failover.clone()),
        }
    }

    /// Send `call` to the leader among `replicas` (one group's).
    async fn on<T, F, Fut>(&self, replicas: &Failover, call: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        replicas
            .call(|index| {
                let conn = self.conn(&replicas.addr(index));
                let call = &call;
                async move { call(conn?).await }
            })
            .await
    }

    /// Send `call` to the leader of the group `route` goes to. On `WrongGroup`: from a group
    /// whose map is older than this handle's, ask it again shortly (group 0 hands every group
    /// each new map at once, and again every 5 s); otherwise fetch the map and send it where
    /// the map says, at most twice, giving up when the map names the group that refused.
    async fn routed<T, F, Fut>(&self, route: Route, call: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = tokio::time::Instant::now();
        let mut fetched = 0;
        loop {
            let (group, replicas) = self.group_of(route);
            let e = match self.on(&replicas, &call).await {
                Err(e) if e.kind() == ErrorKind::WrongGroup => e,
                answer => return answer,
            };
            let held = self.routes.read().version;
            if e.map_version().is_some_and(|theirs| theirs < held) && started.elapsed() < GROUP_CATCH_UP {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            if fetched == 2 {
                return Err(e);
            }
            fetched += 1;
            self.refresh(held).await?;
            if self.group_of(route).0 == group {
                return Err(e);
            }
        }
    }

    /// Fetch the group map from group 0, unless another request did since the map at version
    /// `held` was read.
    async fn refresh(&self, held: u64) -> Result<()> {
        let _one = self.refreshing.lock().await;
        if self.routes.read().version != held {
            return Ok(());
        }
        let empty = p::Empty {};
        let map = self.on(&self.failover, method!(get_group_map, empty)).await?;
        let old = self.routes.read().clone();
        let mut groups = std::collections::HashMap::new();
        for group in map.groups.iter().filter(|g| g.group != 0) {
            let addrs: Vec<String> = group
                .replicas
                .iter()
                .map(|r| r.split_once('=').map_or(r.as_str(), |(_, addr)| addr).trim().to_string())
                .collect();
            // A group whose replicas did not change keeps its list (and the leader it found).
            let replicas = match old.groups.get(&group.group) {
                // (Its list may have grown by leaders learned from answers.)
                Some(known) if known.addrs().get(..addrs.len()) == Some(&addrs[..]) => known.clone(),
                _ => {
                    let mut failover = Failover::parse(&addrs.join(","))?;
                    if let Some(limit) = self.try_timeout {
                        failover = failover.with_try_timeout(limit);
                    }
                    Arc::new(failover)
                }
            };
            groups.insert(group.group, replicas);
        }
        tracing::debug!(version = map.version, "fetched the metadata group map");
        *self.routes.write() = Arc::new(Routes { version: map.version, slots: map.slots, groups });
        Ok(())
    }

    /// Every group other than 0 the map names.
    fn other_groups(&self) -> Vec<Arc<Failover>> {
        self.routes.read().groups.values().cloned().collect()
    }

    /// Connect to the metaserver at `index` now, so one that is not there is reported at once.
    async fn check(&self, index: usize) -> Result<()> {
        let addr = self.failover.addr(index);
        let unreachable =
            |e: String| CairnError::unavailable(format!("cannot reach metaserver at {addr}: {e}"));
        match self.conn(&addr)? {
            Conn::Wire(client) => client.check().await.map_err(|e| unreachable(e.message().to_string())),
            Conn::Grpc(client) => {
                let mut client = client.clone();
                match client.raft_status(cairn_proto::Empty {}).await {
                    Ok(_) => Ok(()),
                    Err(status) => match CairnError::from(status) {
                        e if e.kind() == cairn_common::ErrorKind::Unavailable => {
                            Err(unreachable(e.to_string()))
                        }
                        // An older metaserver without RaftStatus answered: it is there.
                        _ => Ok(()),
                    },
                }
            }
        }
    }
}

/// Connect to the metaserver at `addr` (`host:port`, or a comma-separated list of the replicas
/// of a replicated one), failing within a few seconds with a clear error if it does not answer.
pub async fn connect_meta(addr: &str) -> Result<MetaConn> {
    connect(addr, Duration::from_secs(30), Some(cairn_net::failover::TRY_TIMEOUT)).await
}

/// [`connect_meta`] with another per-request deadline (admin commands that wait for a repair
/// pass or a reconciliation need hours, not seconds).
pub async fn connect_meta_with_timeout(addr: &str, timeout: Duration) -> Result<MetaConn> {
    connect(addr, timeout, None).await
}

async fn connect(addr: &str, timeout: Duration, try_timeout: Option<Duration>) -> Result<MetaConn> {
    let mut failover = Failover::parse(addr)?;
    if let Some(limit) = try_timeout {
        failover = failover.with_try_timeout(limit);
    }
    let inner = Arc::new(Inner {
        failover: Arc::new(failover),
        routes: Default::default(),
        refreshing: Default::default(),
        conns: Default::default(),
        transport: Transport::from_env()?,
        timeout,
        try_timeout,
        client: Default::default(),
        seq: Default::default(),
    });
    // Reachable is enough here: which replica leads is found by the first request.
    inner.failover.call(|i| inner.check(i)).await?;
    Ok(MetaConn { inner })
}

/// Send `req` to the leader of the group `$route` goes to, as the method `$name`.
macro_rules! send {
    ($self:ident, $name:ident, $req:ident, $route:expr) => {
        $self.inner.routed($route, method!($name, $req)).await
    };
}

/// A method sent to the group of the inode `$route` reads from the request (`|r| r.ino`), or
/// to group 0 (`cluster`).
macro_rules! rpc {
    ($name:ident, $req:ty, $reply:ty, cluster) => {
        pub async fn $name(&self, req: $req) -> Result<$reply> {
            send!(self, $name, req, Route::Cluster)
        }
    };
    ($name:ident, $req:ty, $reply:ty, $route:expr) => {
        pub async fn $name(&self, req: $req) -> Result<$reply> {
            let route = Route::Ino(($route)(&req));
            send!(self, $name, req, route)
        }
    };
}

/// A change the metaserver does once however often it is sent (`Once` in `cairn.proto`): a
/// sequence number of this client, the same on every try.
macro_rules! rpc_once {
    ($name:ident, $req:ty, $reply:ty, $route:expr) => {
        rpc_once!($name, $name, $req, $reply, $route);
    };
    ($fn_name:ident, $name:ident, $req:ty, $reply:ty, $route:expr) => {
        pub async fn $fn_name(&self, mut req: $req) -> Result<$reply> {
            use std::sync::atomic::Ordering;
            let client = self.inner.client.load(Ordering::Relaxed);
            if client != 0 && req.once.is_none() {
                let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
                req.once = Some(p::Once { client, seq });
            }
            let route = Route::Ino(($route)(&req));
            send!(self, $name, req, route)
        }
    };
}

use cairn_proto as p;

impl MetaConn {
    /// The address requests go to first (the leader, once one answered).
    pub fn addr(&self) -> String {
        self.inner.failover.addr(self.inner.failover.current())
    }

    /// Mark changes sent from now on with this client's id and a sequence, so a metaserver
    /// that gets one again (after a failover) does it once.
    pub fn set_client(&self, client: u64) {
        self.inner.client.store(client, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every metaserver address this handle knows (the list given, then leaders learned).
    pub fn addrs(&self) -> Vec<String> {
        self.inner.failover.addrs()
    }

    /// The inode `name` in `parent` names: asked of the parent's group, and, when that group
    /// answers that another holds it (a directory made by a mkdir across groups), of the
    /// inode's group — asked again, both, while the entry is there and its directory not yet
    /// (the decision of its mkdir on its way), and answered `NotFound` at once when the entry
    /// went meanwhile (an rmdir).
    pub async fn lookup(&self, req: p::LookupRequest) -> Result<p::AttrReply> {
        let started = tokio::time::Instant::now();
        loop {
            let (route, again) = (Route::Ino(req.parent), req.clone());
            let reply = send!(self, lookup, again, route)?;
            match self.follow(reply).await {
                Err(e) if e.kind() == ErrorKind::NotFound && started.elapsed() < ELSEWHERE_WAIT => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                answer => return answer,
            }
        }
    }

    /// `reply` as is, or, when it names an inode another group holds (`elsewhere`), with that
    /// inode's attributes from its group.
    async fn follow(&self, reply: p::AttrReply) -> Result<p::AttrReply> {
        if !reply.elsewhere {
            return Ok(reply);
        }
        let ino = reply.attr.as_ref().map_or(0, |a| a.ino);
        let there = self.get_attr(p::InoRequest { ino }).await?;
        Ok(p::AttrReply { attr: there.attr, parent: reply.parent, elsewhere: false })
    }

    /// mkdir: the new directory may be in another group than its parent; a try sent again
    /// after the first was done may be answered with only its number ([`MetaConn::follow`]).
    pub async fn mkdir(&self, req: p::MkdirRequest) -> Result<p::AttrReply> {
        let reply = self.mkdir_here(req).await?;
        let started = tokio::time::Instant::now();
        loop {
            // Done by an earlier try: its directory's group may take the decision a moment later.
            match self.follow(reply).await {
                Err(e) if e.kind() == ErrorKind::NotFound && started.elapsed() < ELSEWHERE_WAIT => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                answer => return answer,
            }
        }
    }
    /// link: a try sent again after the first was done into a directory of another group than
    /// the file's may be answered with only the file's number ([`MetaConn::follow`]).
    pub async fn link(&self, req: p::LinkRequest) -> Result<p::AttrReply> {
        let reply = self.link_here(req).await?;
        self.follow(reply).await
    }
    rpc!(get_attr, p::InoRequest, p::AttrReply, |r: &p::InoRequest| r.ino);
    rpc_once!(set_attr, p::SetAttrRequest, p::AttrReply, |r: &p::SetAttrRequest| r.ino);
    rpc_once!(create, p::CreateRequest, p::CreateReply, |r: &p::CreateRequest| r.parent);
    rpc_once!(mkdir_here, mkdir, p::MkdirRequest, p::AttrReply, |r: &p::MkdirRequest| r.parent);
    rpc_once!(unlink, p::RemoveRequest, p::RemoveReply, |r: &p::RemoveRequest| r.parent);
    rpc_once!(rmdir, p::RemoveRequest, p::RemoveReply, |r: &p::RemoveRequest| r.parent);
    rpc_once!(rename, p::RenameRequest, p::RenameReply, |r: &p::RenameRequest| r.parent);
    rpc_once!(link_here, link, p::LinkRequest, p::AttrReply, |r: &p::LinkRequest| r.new_parent);
    rpc_once!(symlink, p::SymlinkRequest, p::AttrReply, |r: &p::SymlinkRequest| r.parent);
    rpc!(readlink, p::InoRequest, p::ReadlinkReply, |r: &p::InoRequest| r.ino);
    rpc!(read_dir, p::ReadDirRequest, p::ReadDirReply, |r: &p::ReadDirRequest| r.ino);
    rpc!(stat_fs, p::Empty, p::StatFsReply, cluster);
    rpc!(get_xattr, p::XattrRequest, p::XattrReply, |r: &p::XattrRequest| r.ino);
    rpc_once!(set_xattr, p::SetXattrRequest, p::Empty, |r: &p::SetXattrRequest| r.ino);
    rpc!(list_xattr, p::InoRequest, p::ListXattrReply, |r: &p::InoRequest| r.ino);
    rpc_once!(remove_xattr, p::XattrRequest, p::Empty, |r: &p::XattrRequest| r.ino);
    rpc!(open, p::OpenRequest, p::OpenReply, |r: &p::OpenRequest| r.ino);
    rpc!(lock, p::LockRequest, p::LockReply, |r: &p::LockRequest| r.ino);
    rpc!(list_stripes, p::ListStripesRequest, p::ListStripesReply, |r: &p::ListStripesRequest| r.ino);
    rpc_once!(commit, p::CommitRequest, p::AttrReply, |r: &p::CommitRequest| r.ino);
    rpc!(register_client, p::Empty, p::RegisterClientReply, cluster);
    rpc!(list_nodes, p::Empty, p::ListNodesReply, cluster);
    rpc!(cluster_status, p::Empty, p::ClusterStatusReply, cluster);
    rpc!(report_damaged, p::ReportDamagedRequest, p::ReportDamagedReply, cluster);
    rpc!(repair_now, p::Empty, p::ClusterStatusReply, cluster);
    rpc!(check_namespace, p::CheckNamespaceRequest, p::CheckNamespaceReply, cluster);
    rpc!(reconcile, p::ReconcileRequest, p::ReconcileReply, cluster);
    rpc!(drain_node, p::NodeRequest, p::NodeReply, cluster);
    rpc!(activate_node, p::NodeRequest, p::NodeReply, cluster);
    rpc!(remove_node, p::NodeRequest, p::Empty, cluster);
    rpc!(get_layout, p::InoRequest, p::LayoutReply, |r: &p::InoRequest| r.ino);
    rpc!(grant_capability, p::CapabilityRequest, p::Capability, |r: &p::CapabilityRequest| r.ino);
    rpc!(set_layout, p::SetLayoutRequest, p::LayoutReply, |r: &p::SetLayoutRequest| r.ino);

    /// Renew the session with group 0 (which registered the client), with the open inodes in
    /// its slots, and with each other group holding some of the open inodes, with those: every
    /// group is tried; the first failure is answered.
    pub async fn client_heartbeat(&self, req: p::ClientHeartbeatRequest) -> Result<p::ClientHeartbeatReply> {
        let client_id = req.client_id;
        let mut parts = self.by_group(req.open);
        let mine = parts.remove(&0).unwrap_or_default();
        let first = p::ClientHeartbeatRequest { client_id, open: mine };
        let answer = send!(self, client_heartbeat, first, Route::Cluster);
        let mut failed = None;
        for (_, open) in parts {
            let route = Route::Ino(open[0]);
            let part = p::ClientHeartbeatRequest { client_id, open };
            if let Err(e) = send!(self, client_heartbeat, part, route) {
                failed.get_or_insert(e);
            }
        }
        let reply = answer?;
        failed.map_or(Ok(reply), Err)
    }

    /// Release files, each to the group holding it.
    pub async fn release(&self, req: p::ReleaseRequest) -> Result<p::Empty> {
        let first = (req.ino != 0).then_some(p::Released { ino: req.ino, generation: req.generation });
        let mut parts = std::collections::BTreeMap::<u32, Vec<p::Released>>::new();
        for file in first.into_iter().chain(req.more) {
            parts.entry(self.inner.group_of(Route::Ino(file.ino)).0).or_default().push(file);
        }
        let mut failed = None;
        for (_, more) in parts {
            let route = Route::Ino(more[0].ino);
            let part = p::ReleaseRequest { client_id: req.client_id, more, ..Default::default() };
            if let Err(e) = send!(self, release, part, route) {
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(p::Empty {}), Err)
    }

    /// Make every group's acknowledged changes durable (syncfs).
    pub async fn sync(&self, req: p::Empty) -> Result<p::Empty> {
        send!(self, sync, req, Route::Cluster)?;
        for replicas in self.inner.other_groups() {
            self.inner.on(&replicas, method!(sync, req)).await?;
        }
        Ok(p::Empty {})
    }

    /// `inos` by the group the map gives their slots (group 0's only while no map is held).
    fn by_group(&self, inos: Vec<u64>) -> std::collections::BTreeMap<u32, Vec<u64>> {
        let mut parts = std::collections::BTreeMap::<u32, Vec<u64>>::new();
        for ino in inos {
            parts.entry(self.inner.group_of(Route::Ino(ino)).0).or_default().push(ino);
        }
        parts
    }
}

impl FileMeta for MetaConn {
    fn commit(&self, req: p::CommitRequest) -> BoxFuture<'_, Result<p::AttrReply>> {
        Box::pin(MetaConn::commit(self, req))
    }

    fn list_stripes(&self, req: p::ListStripesRequest) -> BoxFuture<'_, Result<p::ListStripesReply>> {
        Box::pin(MetaConn::list_stripes(self, req))
    }
}

/// Declare [`MetaApi`], one method per RPC the client sends, and implement it for [`MetaConn`].
macro_rules! meta_api {
    ($($name:ident($req:ty) -> $reply:ty;)*) => {
        /// What the client asks of the metaserver (besides an open file's commits and stripe
        /// listings, [`FileMeta`]). [`MetaConn`] is the real one, over the network and following
        /// the leader; the client's unit tests give the metaserver's own service over a store in
        /// memory (`client_tests.rs`), so the client is tested without servers.
        pub trait MetaApi: FileMeta {
            $(fn $name(&self, req: $req) -> BoxFuture<'_, Result<$reply>>;)*
            /// Mark changes sent from now on as this client's, to be done once.
            fn set_client(&self, client: u64);
        }

        impl MetaApi for MetaConn {
            $(fn $name(&self, req: $req) -> BoxFuture<'_, Result<$reply>> {
                Box::pin(MetaConn::$name(self, req))
            })*

            fn set_client(&self, client: u64) {
                MetaConn::set_client(self, client)
            }
        }
    };
}

/// Hand the list of the RPCs the client sends (`name(request) -> reply;`) to macro `$m`.
macro_rules! with_meta_rpcs {
    ($m:ident) => {
        $m! {
            lookup(p::LookupRequest) -> p::AttrReply;
            get_attr(p::InoRequest) -> p::AttrReply;
            set_attr(p::SetAttrRequest) -> p::AttrReply;
            create(p::CreateRequest) -> p::CreateReply;
            mkdir(p::MkdirRequest) -> p::AttrReply;
            unlink(p::RemoveRequest) -> p::RemoveReply;
            rmdir(p::RemoveRequest) -> p::RemoveReply;
            rename(p::RenameRequest) -> p::RenameReply;
            link(p::LinkRequest) -> p::AttrReply;
            symlink(p::SymlinkRequest) -> p::AttrReply;
            readlink(p::InoRequest) -> p::ReadlinkReply;
            read_dir(p::ReadDirRequest) -> p::ReadDirReply;
            stat_fs(p::Empty) -> p::StatFsReply;
            get_xattr(p::XattrRequest) -> p::XattrReply;
            set_xattr(p::SetXattrRequest) -> p::Empty;
            list_xattr(p::InoRequest) -> p::ListXattrReply;
            remove_xattr(p::XattrRequest) -> p::Empty;
            open(p::OpenRequest) -> p::OpenReply;
            release(p::ReleaseRequest) -> p::Empty;
            client_heartbeat(p::ClientHeartbeatRequest) -> p::ClientHeartbeatReply;
            lock(p::LockRequest) -> p::LockReply;
            sync(p::Empty) -> p::Empty;
            register_client(p::Empty) -> p::RegisterClientReply;
            list_nodes(p::Empty) -> p::ListNodesReply;
            report_damaged(p::ReportDamagedRequest) -> p::ReportDamagedReply;
            grant_capability(p::CapabilityRequest) -> p::Capability;
        }
    };
}
#[cfg(test)]
pub(crate) use with_meta_rpcs;

with_meta_rpcs!(meta_api);
