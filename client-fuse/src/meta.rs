//! The client's connection to the metaserver: the wire protocol (`cairn_net::wire`, a pool of
//! framed TCP connections) by default, or a tonic channel when `CAIRN_TRANSPORT=grpc`, both
//! with timeouts, and one method per RPC that returns the `CairnError` the server raised. A
//! replicated metaserver is a list of addresses; requests follow its leader.

use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Result, MAX_MESSAGE_BYTES};
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
/// request goes to the one that answered last and follows the leader (`cairn_net::failover`).
#[derive(Clone)]
pub struct MetaConn {
    inner: Arc<Inner>,
}

struct Inner {
    failover: Failover,
    /// One connection (pool) per address, made on first use.
    conns: parking_lot::Mutex<std::collections::HashMap<String, Conn>>,
    transport: Transport,
    timeout: Duration,
    /// This client's id once registered (0: changes are not marked to be done once).
    client: std::sync::atomic::AtomicU64,
    /// The sequence of the last change marked to be done once.
    seq: std::sync::atomic::AtomicU64,
}

impl Inner {
    fn conn(&self, index: usize) -> Result<Conn> {
        let addr = self.failover.addr(index);
        if let Some(conn) = self.conns.lock().get(&addr) {
            return Ok(conn.clone());
        }
        let conn = match self.transport {
            Transport::Wire => {
                Conn::Wire(Arc::new(WireClient::new(&addr, Role::Meta, Duration::from_secs(3), self.timeout)))
            }
            Transport::Grpc => {
                let channel = grpc_channel(&addr, Role::Meta, Duration::from_secs(3), self.timeout)
                    .map_err(|e| CairnError::invalid(format!("metaserver address: {e}")))?;
                Conn::Grpc(
                    MetaClient::new(channel)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
        };
        Ok(self.conns.lock().entry(addr).or_insert(conn).clone())
    }

    /// Connect to the metaserver at `index` now, so one that is not there is reported at once.
    async fn check(&self, index: usize) -> Result<()> {
        let addr = self.failover.addr(index);
        let unreachable =
            |e: String| CairnError::unavailable(format!("cannot reach metaserver at {addr}: {e}"));
        match self.conn(index)? {
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
        failover,
        conns: Default::default(),
        transport: Transport::from_env()?,
        timeout,
        client: Default::default(),
        seq: Default::default(),
    });
    // Reachable is enough here: which replica leads is found by the first request.
    inner.failover.call(|i| inner.check(i)).await?;
    Ok(MetaConn { inner })
}

/// Send `req` to the leader, over the handle's transport, as the method `$name`.
macro_rules! send {
    ($self:ident, $name:ident, $req:ident) => {
        $self
            .inner
            .failover
            .call(|index| {
                let req = $req.clone();
                async move {
                    match $self.inner.conn(index)? {
                        Conn::Wire(client) => wire::meta::$name(&client, req).await,
                        Conn::Grpc(mut client) => {
                            client.$name(req).await.map(|r| r.into_inner()).map_err(CairnError::from)
                        }
                    }
                }
            })
            .await
    };
}

macro_rules! rpc {
    ($name:ident, $req:ty, $reply:ty) => {
        pub async fn $name(&self, req: $req) -> Result<$reply> {
            send!(self, $name, req)
        }
    };
}

/// A change the metaserver does once however often it is sent (`Once` in `cairn.proto`): a
/// sequence number of this client, the same on every try.
macro_rules! rpc_once {
    ($name:ident, $req:ty, $reply:ty) => {
        pub async fn $name(&self, mut req: $req) -> Result<$reply> {
            use std::sync::atomic::Ordering;
            let client = self.inner.client.load(Ordering::Relaxed);
            if client != 0 && req.once.is_none() {
                let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
                req.once = Some(p::Once { client, seq });
            }
            send!(self, $name, req)
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

    rpc!(lookup, p::LookupRequest, p::AttrReply);
    rpc!(get_attr, p::InoRequest, p::AttrReply);
    rpc_once!(set_attr, p::SetAttrRequest, p::AttrReply);
    rpc_once!(create, p::CreateRequest, p::CreateReply);
    rpc_once!(mkdir, p::MkdirRequest, p::AttrReply);
    rpc_once!(unlink, p::RemoveRequest, p::RemoveReply);
    rpc_once!(rmdir, p::RemoveRequest, p::RemoveReply);
    rpc_once!(rename, p::RenameRequest, p::RenameReply);
    rpc_once!(link, p::LinkRequest, p::AttrReply);
    rpc_once!(symlink, p::SymlinkRequest, p::AttrReply);
    rpc!(readlink, p::InoRequest, p::ReadlinkReply);
    rpc!(read_dir, p::ReadDirRequest, p::ReadDirReply);
    rpc!(stat_fs, p::Empty, p::StatFsReply);
    rpc!(get_xattr, p::XattrRequest, p::XattrReply);
    rpc_once!(set_xattr, p::SetXattrRequest, p::Empty);
    rpc!(list_xattr, p::InoRequest, p::ListXattrReply);
    rpc_once!(remove_xattr, p::XattrRequest, p::Empty);
    rpc!(open, p::OpenRequest, p::OpenReply);
    rpc!(release, p::ReleaseRequest, p::Empty);
    rpc!(client_heartbeat, p::ClientHeartbeatRequest, p::ClientHeartbeatReply);
    rpc!(lock, p::LockRequest, p::LockReply);
    rpc!(list_stripes, p::ListStripesRequest, p::ListStripesReply);
    rpc_once!(commit, p::CommitRequest, p::AttrReply);
    rpc!(sync, p::Empty, p::Empty);
    rpc!(register_client, p::Empty, p::RegisterClientReply);
    rpc!(list_nodes, p::Empty, p::ListNodesReply);
    rpc!(cluster_status, p::Empty, p::ClusterStatusReply);
    rpc!(report_damaged, p::ReportDamagedRequest, p::ReportDamagedReply);
    rpc!(repair_now, p::Empty, p::ClusterStatusReply);
    rpc!(check_namespace, p::CheckNamespaceRequest, p::CheckNamespaceReply);
    rpc!(reconcile, p::ReconcileRequest, p::ReconcileReply);
    rpc!(drain_node, p::NodeRequest, p::NodeReply);
    rpc!(activate_node, p::NodeRequest, p::NodeReply);
    rpc!(remove_node, p::NodeRequest, p::Empty);
    rpc!(get_layout, p::InoRequest, p::LayoutReply);
    rpc!(grant_capability, p::CapabilityRequest, p::Capability);
    rpc!(set_layout, p::SetLayoutRequest, p::LayoutReply);
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
