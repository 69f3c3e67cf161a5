//! End-to-end tests of a chunkserver started with `cairn_chunk::serve` on 127.0.0.1, talked to
//! through the generated gRPC client, with a fake metaserver that records registrations and
//! heartbeats.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_common::config::{ChunkConfig, IoEngineKind};
use cairn_common::{CairnError, ErrorKind, MAX_MESSAGE_BYTES};
use cairn_proto::chunk_client::ChunkClient;
use cairn_proto::meta_server::{Meta, MetaServer};
use cairn_proto::*;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A metaserver that only knows RegisterChunk and Heartbeat.
#[derive(Default)]
struct FakeMeta {
    registrations: Mutex<Vec<RegisterChunkRequest>>,
    heartbeats: Mutex<Vec<HeartbeatRequest>>,
    /// Heartbeats still to answer NotFound, as a metaserver that lost its registry would.
    forget: AtomicU32,
    /// The namespace epoch heartbeat replies announce.
    fence: AtomicU64,
    /// The cluster id replies name ("" as a metaserver too old to name one).
    cluster: Mutex<String>,
    /// The group map GetGroupMap answers (its version in heartbeat replies).
    map: Mutex<cairn_proto::GroupMap>,
}

macro_rules! fake_meta {
    ($($name:ident($req:ty) -> $reply:ty;)*) => {
        #[tonic::async_trait]
        impl Meta for FakeMeta {
            async fn register_chunk(
                &self,
                request: Request<RegisterChunkRequest>,
            ) -> Result<Response<RegisterChunkReply>, Status> {
                self.registrations.lock().push(request.into_inner());
                Ok(Response::new(RegisterChunkReply {
                    node_id: 7,
                    cluster_id: self.cluster.lock().clone(),
                    cap_keys: Vec::new(),
                }))
            }

            async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatReply>, Status> {
                self.heartbeats.lock().push(request.into_inner());
                if self.forget.load(Ordering::SeqCst) > 0 {
                    self.forget.fetch_sub(1, Ordering::SeqCst);
                    return Err(CairnError::not_found("unknown node 7").into());
                }
                Ok(Response::new(HeartbeatReply {
                    fence: self.fence.load(Ordering::SeqCst),
                    cluster_id: self.cluster.lock().clone(),
                    cap_keys: Vec::new(),
                    map_version: self.map.lock().version,
                }))
            }

            async fn get_group_map(&self, _request: Request<Empty>) -> Result<Response<cairn_proto::GroupMap>, Status> {
                Ok(Response::new(self.map.lock().clone()))
            }

            type RaftBackupStream = tokio_stream::Empty<Result<cairn_proto::BackupChunk, Status>>;

            async fn raft_backup(&self, _request: Request<Empty>) -> Result<Response<Self::RaftBackupStream>, Status> {
                Err(Status::unimplemented("raft_backup"))
            }

            $(async fn $name(&self, _request: Request<$req>) -> Result<Response<$reply>, Status> {
                Err(Status::unimplemented(stringify!($name)))
            })*
        }
    };
}

fake_meta! {
    lookup(LookupRequest) -> AttrReply;
    get_attr(InoRequest) -> AttrReply;
    set_attr(SetAttrRequest) -> AttrReply;
    create(CreateRequest) -> CreateReply;
    mkdir(MkdirRequest) -> AttrReply;
    unlink(RemoveRequest) -> RemoveReply;
    rmdir(RemoveRequest) -> RemoveReply;
    rename(RenameRequest) -> RenameReply;
    link(LinkRequest) -> AttrReply;
    symlink(SymlinkRequest) -> AttrReply;
    readlink(InoRequest) -> ReadlinkReply;
    read_dir(ReadDirRequest) -> ReadDirReply;
    stat_fs(Empty) -> StatFsReply;
    get_xattr(XattrRequest) -> XattrReply;
    set_xattr(SetXattrRequest) -> Empty;
    list_xattr(InoRequest) -> ListXattrReply;
    remove_xattr(XattrRequest) -> Empty;
    open(OpenRequest) -> OpenReply;
    release(ReleaseRequest) -> Empty;
    client_heartbeat(ClientHeartbeatRequest) -> ClientHeartbeatReply;
    lock(LockRequest) -> LockReply;
    report_damaged(ReportDamagedRequest) -> ReportDamagedReply;
    list_stripes(ListStripesRequest) -> ListStripesReply;
    commit(CommitRequest) -> AttrReply;
    register_client(Empty) -> RegisterClientReply;
    list_nodes(Empty) -> ListNodesReply;
    cluster_status(Empty) -> ClusterStatusReply;
    repair_now(Empty) -> ClusterStatusReply;
    check_namespace(CheckNamespaceRequest) -> CheckNamespaceReply;
    reconcile(ReconcileRequest) -> ReconcileReply;
    drain_node(NodeRequest) -> NodeReply;
    activate_node(NodeRequest) -> NodeReply;
    remove_node(NodeRequest) -> Empty;
    get_layout(InoRequest) -> LayoutReply;
    set_layout(SetLayoutRequest) -> LayoutReply;
    grant_capability(CapabilityRequest) -> Capability;
    sync(Empty) -> Empty;
    raft_vote(RaftMessage) -> RaftMessage;
    raft_append(RaftMessage) -> RaftMessage;
    raft_snapshot(RaftMessage) -> RaftMessage;
    raft_status(Empty) -> RaftStatusReply;
    raft_add_member(cairn_proto::RaftMemberRequest) -> RaftStatusReply;
    raft_remove_member(cairn_proto::RaftMemberRequest) -> RaftStatusReply;
    add_group(cairn_proto::MetaGroup) -> cairn_proto::GroupMap;
    remove_group(cairn_proto::GroupRequest) -> cairn_proto::GroupMap;
    move_slots(cairn_proto::MoveSlotsRequest) -> cairn_proto::GroupMap;
    share_group_map(cairn_proto::SharedGroupMap) -> cairn_proto::GroupMap;
    release_slots(cairn_proto::ReleaseSlotsRequest) -> cairn_proto::ReleaseSlotsReply;
    txn_prepare(cairn_proto::TxnPrepareRequest) -> cairn_proto::TxnPrepareReply;
    txn_decide(cairn_proto::TxnDecideRequest) -> cairn_proto::Empty;
    txn_outcome(cairn_proto::TxnId) -> cairn_proto::TxnOutcomeReply;
    txn_ancestry(cairn_proto::TxnAncestryRequest) -> cairn_proto::TxnAncestryReply;
    spread_dirs(cairn_proto::SpreadDirsRequest) -> cairn_proto::GroupMap;
}

/// An inode number in namespace slot 5.
const IN_SLOT_5: u64 = (5 << cairn_common::ids::SLOT_SHIFT) | 8;

/// A group map giving slot 5 to metadata group 1.
fn slot_5_of_group_1() -> cairn_proto::GroupMap {
    let mut slots = vec![0; 4096];
    slots[5] = 1;
    cairn_proto::GroupMap { version: 1, slots, ..Default::default() }
}

/// Serve the fake metaserver on `listener` in the background.
fn start_meta(listener: tokio::net::TcpListener) -> Arc<FakeMeta> {
    let meta = Arc::new(FakeMeta::default());
    let service = MetaServer::from_arc(meta.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    meta
}

async fn fake_meta() -> (Arc<FakeMeta>, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (start_meta(listener), addr)
}

fn config(root: &Path, meta: SocketAddr, engine: IoEngineKind) -> ChunkConfig {
    ChunkConfig {
        listen: "127.0.0.1:0".into(),
        advertise: None,
        meta: meta.to_string(),
        state_dir: root.join("state"),
        ssd_dirs: vec![root.join("ssd")],
        hdd_dirs: vec![root.join("hdd")],
        io_engine: engine,
        queue_depth: 16,
        sync: true,
        reserve_bytes: 0,
        heartbeat_ms: 50,
        mover_interval_ms: 50,
        mover_rate_bytes: 1 << 30,
        ..ChunkConfig::default()
    }
}

/// A running chunkserver; dropping `stop` shuts it down.
struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<cairn_common::Result<()>>,
}

async fn start_chunk(config: ChunkConfig) -> Running {
    let listener = tokio::net::TcpListener::bind(&config.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(cairn_chunk::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    Running { addr, stop, done }
}

impl Running {
    async fn client(&self) -> ChunkClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match ChunkClient::connect(format!("http://{}", self.addr)).await {
                Ok(c) => {
                    return c
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES)
                }
                Err(e) if Instant::now() > deadline => panic!("chunkserver never answered: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.done.await.unwrap().unwrap();
    }
}

/// Poll `check` until it holds or 20 s pass.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sid(ino: u64, index: u32) -> cairn_proto::ShardId {
    cairn_proto::ShardId { ino, stripe: 3, index, version: 1 }
}

fn kind<T: std::fmt::Debug>(r: Result<T, Status>) -> ErrorKind {
    CairnError::from(r.unwrap_err()).kind()
}

async fn shards_over_grpc(engine: IoEngineKind) {
    let root = tempfile::tempdir().unwrap();
    let (_meta, meta_addr) = fake_meta().await;
    let chunk = start_chunk(config(root.path(), meta_addr, engine)).await;
    let mut client = chunk.client().await;

    let data: Bytes = (0..(1 << 20) + 3).map(|i: u32| (i % 251) as u8).collect();
    let reply = client
        .write_shard(WriteShardRequest {
            id: Some(sid(5, 1)),
            data: data.clone(),
            cap: None,
            buffered: false,
        })
        .await
        .unwrap();
    assert_eq!(reply.into_inner().tier, "ssd");
    let read = client
        .read_shard(ReadShardRequest { id: Some(sid(5, 1)), offset: 0, len: 0, ..Default::default() })
        .await
        .unwrap();
    let read = read.into_inner();
    assert_eq!(read.shard_len, data.len() as u64);
    assert!(read.data == data);
    let read = client
        .read_shard(ReadShardRequest { id: Some(sid(5, 1)), offset: 65530, len: 20, ..Default::default() })
        .await
        .unwrap();
    assert!(read.into_inner().data == data.slice(65530..65550));

    // Errors keep their kind across the wire.
    let missing = client
        .read_shard(ReadShardRequest { id: Some(sid(6, 0)), offset: 0, len: 0, ..Default::default() })
        .await;
    assert_eq!(kind(missing), ErrorKind::NotFound);
    let past_end = client
        .read_shard(ReadShardRequest { id: Some(sid(5, 1)), offset: 1 << 21, len: 1, ..Default::default() })
        .await;
    assert_eq!(kind(past_end), ErrorKind::InvalidArgument);
    let hostile = cairn_proto::ShardId { ino: 0, stripe: 1, index: 200, version: 1 };
    let r = client
        .write_shard(WriteShardRequest {
            id: Some(hostile),
            data: Bytes::from_static(b"x"),
            cap: None,
            buffered: false,
        })
        .await;
    assert_eq!(kind(r), ErrorKind::InvalidArgument);
    let r = client
        .write_shard(WriteShardRequest {
            id: None,
            data: Bytes::from_static(b"x"),
            cap: None,
            buffered: false,
        })
        .await;
    assert_eq!(kind(r), ErrorKind::InvalidArgument);
    let r = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(5, 1), hostile], fence: 0, ..Default::default() })
        .await;
    assert_eq!(kind(r), ErrorKind::InvalidArgument);
    let too_big = Bytes::from(vec![0u8; (64 << 20) + 2048]);
    let r = client
        .write_shard(WriteShardRequest { id: Some(sid(5, 2)), data: too_big, cap: None, buffered: false })
        .await;
    assert_eq!(kind(r), ErrorKind::InvalidArgument);

    let stat = client.stat(Empty {}).await.unwrap().into_inner();
    assert_eq!(stat.tiers.len(), 2);
    assert_eq!((stat.tiers[0].name.as_str(), stat.tiers[0].shards), ("ssd", 1));
    assert!(stat.tiers[0].used > data.len() as u64);

    let deleted = client
        .delete_shards(DeleteShardsRequest {
            ids: vec![sid(5, 1), sid(6, 0)],
            fence: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(deleted.into_inner().deleted, 1);
    let gone = client
        .read_shard(ReadShardRequest { id: Some(sid(5, 1)), offset: 0, len: 0, ..Default::default() })
        .await;
    assert_eq!(kind(gone), ErrorKind::NotFound);
    chunk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_over_grpc_uring() {
    shards_over_grpc(IoEngineKind::Uring).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_over_grpc_pread() {
    shards_over_grpc(IoEngineKind::Pread).await;
}

/// Deletes from a metaserver whose namespace epoch is below the one the leader's heartbeat
/// replies announced are refused and delete nothing, also after a restart of the chunkserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_from_a_deposed_metaserver_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let (meta, meta_addr) = fake_meta().await;
    meta.fence.store(1_000, Ordering::SeqCst);
    *meta.map.lock() = slot_5_of_group_1();
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Pread)).await;
    let mut client = chunk.client().await;
    for ino in [5, 6, 7] {
        client
            .write_shard(WriteShardRequest {
                id: Some(sid(ino, 0)),
                data: Bytes::from_static(b"kept"),
                cap: None,
                buffered: false,
            })
            .await
            .unwrap();
    }
    // Heartbeats go one after another: a second one means the first reply was handled.
    eventually("a heartbeat answered", || meta.heartbeats.lock().len() >= 2).await;

    let stale = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(5, 0)], fence: 999, ..Default::default() })
        .await;
    assert_eq!(kind(stale), ErrorKind::NotLeader);
    let read = client
        .read_shard(ReadShardRequest { id: Some(sid(5, 0)), offset: 0, len: 0, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(&read.into_inner().data[..], b"kept", "a refused delete deleted nothing");
    // The leader's own epoch, a newer leader's (which raises the fence) and a client's (0) pass.
    let ok = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(5, 0)], fence: 1_000, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(ok.into_inner().deleted, 1);
    let ok = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(6, 0)], fence: 1_001, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(ok.into_inner().deleted, 1);
    let stale = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(7, 0)], fence: 1_000, ..Default::default() })
        .await;
    assert_eq!(kind(stale), ErrorKind::NotLeader);
    // Another metadata group's epochs are its own: its leader at epoch 5 passes (group 0's
    // fence is far above), a deposed one of it does not.
    let of_group_1 =
        |fence| DeleteShardsRequest { ids: vec![sid(IN_SLOT_5, 0)], fence, group: 1, ..Default::default() };
    client.delete_shards(of_group_1(5)).await.unwrap();
    assert_eq!(kind(client.delete_shards(of_group_1(4)).await), ErrorKind::NotLeader);
    assert_eq!(kind(client.delete_shards(of_group_1(0)).await), ErrorKind::InvalidArgument, "no fence");
    // Each group deletes only in its own slots, whatever its epoch.
    let outside = DeleteShardsRequest {
        ids: vec![sid(IN_SLOT_5, 0), sid(5, 0)],
        fence: 5,
        group: 1,
        ..Default::default()
    };
    assert_eq!(kind(client.delete_shards(outside).await), ErrorKind::PermissionDenied);
    let of_group_0 = DeleteShardsRequest { ids: vec![sid(IN_SLOT_5, 0)], fence: 1_001, ..Default::default() };
    assert_eq!(kind(client.delete_shards(of_group_0).await), ErrorKind::PermissionDenied);
    drop(client);
    chunk.stop().await;

    // Restarted while no metaserver announces anything: the fence was kept.
    meta.fence.store(0, Ordering::SeqCst);
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Pread)).await;
    let mut client = chunk.client().await;
    let stale = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(7, 0)], fence: 1_000, ..Default::default() })
        .await;
    assert_eq!(kind(stale), ErrorKind::NotLeader);
    // Once the group map is fetched again (a heartbeat), group 1's fence is what refuses.
    let beats = meta.heartbeats.lock().len();
    eventually("the map fetched again", || meta.heartbeats.lock().len() >= beats + 2).await;
    assert_eq!(kind(client.delete_shards(of_group_1(4)).await), ErrorKind::NotLeader, "group 1's fence kept");
    let ok = client
        .delete_shards(DeleteShardsRequest { ids: vec![sid(7, 0)], fence: 0, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(ok.into_inner().deleted, 1);
    chunk.stop().await;
}

/// The first metaserver names the cluster the chunkserver joins; one that names another (a
/// metaserver started on the wrong data directory) is not joined, and the right one coming back
/// is joined again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metaserver_of_another_cluster_is_not_joined() {
    let ours = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let root = tempfile::tempdir().unwrap();
    let (meta, meta_addr) = fake_meta().await;
    *meta.cluster.lock() = ours.into();
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Pread)).await;
    eventually("heartbeats", || meta.heartbeats.lock().len() >= 2).await;
    let kept = std::fs::read_to_string(root.path().join("state/cluster")).unwrap();
    assert_eq!(kept.trim(), ours);
    assert_eq!(meta.registrations.lock()[0].cluster_id, "", "it belonged to no cluster before");

    // The metaserver comes back with another namespace: it forgot the node and names another id.
    *meta.cluster.lock() = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb".into();
    meta.forget.store(1, Ordering::SeqCst);
    let registered = meta.registrations.lock().len();
    eventually("registrations tried again", || meta.registrations.lock().len() >= registered + 2).await;
    let beats = meta.heartbeats.lock().len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(meta.heartbeats.lock().len(), beats, "no heartbeats to a metaserver of another cluster");
    assert!(meta.registrations.lock()[registered..].iter().all(|r| r.cluster_id == ours));
    let kept = std::fs::read_to_string(root.path().join("state/cluster")).unwrap();
    assert_eq!(kept.trim(), ours, "still in its own cluster");

    // Nor may a metaserver of another cluster delete anything here.
    let mut client = chunk.client().await;
    client
        .write_shard(WriteShardRequest {
            id: Some(sid(5, 0)),
            data: Bytes::from_static(b"kept"),
            cap: None,
            buffered: false,
        })
        .await
        .unwrap();
    let delete = |cluster_id: &str| DeleteShardsRequest {
        ids: vec![sid(5, 0)],
        fence: 1,
        cluster_id: cluster_id.into(),
        ..Default::default()
    };
    let refused = client.delete_shards(delete("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")).await;
    assert_eq!(kind(refused), ErrorKind::InvalidArgument);
    assert_eq!(client.delete_shards(delete(ours)).await.unwrap().into_inner().deleted, 1);

    // The right namespace again: joined without a restart.
    *meta.cluster.lock() = ours.into();
    eventually("heartbeats again", || meta.heartbeats.lock().len() > beats + 1).await;
    assert!(
        meta.heartbeats.lock()[beats..].iter().all(|h| h.cluster_id == ours),
        "heartbeats name the cluster"
    );
    chunk.stop().await;
}

/// A leader of metadata group 1 fences the chunkserver with `Fence`: its epoch becomes group
/// 1's fence (kept in `fence-g1`), after which group 1's deletes and fences from an older
/// leadership are refused; a fence of another cluster, of group 0, or without an epoch is
/// refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_groups_leader_fences_the_chunkserver() {
    let ours = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let root = tempfile::tempdir().unwrap();
    let (meta, meta_addr) = fake_meta().await;
    *meta.cluster.lock() = ours.into();
    meta.fence.store(1_000, Ordering::SeqCst);
    *meta.map.lock() = slot_5_of_group_1();
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Pread)).await;
    eventually("heartbeats", || meta.heartbeats.lock().len() >= 2).await;
    let mut client = chunk.client().await;
    let fence = |group, epoch, cluster_id: &str| cairn_proto::FenceRequest {
        group,
        epoch,
        cluster_id: cluster_id.into(),
        cap_keys: Vec::new(),
    };
    let path = root.path().join("state/fence-g1");
    for (bad, want) in [
        (fence(1, 7, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"), ErrorKind::InvalidArgument),
        (fence(0, 7, ours), ErrorKind::InvalidArgument),
        (fence(1, 0, ours), ErrorKind::InvalidArgument),
        (fence(1, 7, ""), ErrorKind::InvalidArgument),
    ] {
        assert_eq!(kind(client.fence(bad.clone()).await), want, "{bad:?}");
        assert!(!path.exists(), "{bad:?} changed nothing");
    }
    client.fence(fence(1, 7, ours)).await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), "7");
    client.fence(fence(1, 7, ours)).await.unwrap();
    assert_eq!(kind(client.fence(fence(1, 6, ours)).await), ErrorKind::NotLeader);
    let of_group_1 = |fence| DeleteShardsRequest {
        ids: vec![sid(IN_SLOT_5, 0)],
        fence,
        group: 1,
        cluster_id: ours.into(),
        ..Default::default()
    };
    assert_eq!(kind(client.delete_shards(of_group_1(6)).await), ErrorKind::NotLeader);
    client.delete_shards(of_group_1(7)).await.unwrap();
    // Group 0's fence is its own.
    assert_eq!(std::fs::read_to_string(root.path().join("state/fence")).unwrap().trim(), "1000");
    chunk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_heartbeats_and_reregisters() {
    let root = tempfile::tempdir().unwrap();
    let (meta, meta_addr) = fake_meta().await;
    meta.forget.store(1, Ordering::SeqCst);
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Uring)).await;
    let chunk_addr = chunk.addr.to_string();
    let mut client = chunk.client().await;

    // The first heartbeat is answered NotFound, so the node registers a second time.
    eventually("a re-registration and heartbeats", || {
        meta.registrations.lock().len() >= 2 && meta.heartbeats.lock().len() >= 3
    })
    .await;
    assert_eq!(client.stat(Empty {}).await.unwrap().into_inner().node_id, 7);
    let uuid = {
        let regs = meta.registrations.lock();
        assert_eq!(regs[0].addr, chunk_addr);
        assert_eq!(regs[0].tiers.len(), 2);
        assert_eq!(regs[0].pid, std::process::id());
        assert_eq!(regs[0].uuid, regs[1].uuid);
        regs[0].uuid.clone()
    };
    {
        let beats = meta.heartbeats.lock();
        let last = beats.last().unwrap();
        assert_eq!((last.node_id, last.addr.as_str(), last.tiers.len()), (7, chunk_addr.as_str(), 2));
    }
    chunk.stop().await;

    // A restart keeps the identity.
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Uring)).await;
    let before = meta.registrations.lock().len();
    eventually("registration after restart", || meta.registrations.lock().len() > before).await;
    assert_eq!(meta.registrations.lock().last().unwrap().uuid, uuid);
    chunk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_while_the_metaserver_is_down_and_registers_when_it_comes() {
    let root = tempfile::tempdir().unwrap();
    let meta_addr = {
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        probe.local_addr().unwrap()
    };
    let chunk = start_chunk(config(root.path(), meta_addr, IoEngineKind::Pread)).await;
    let mut client = chunk.client().await;
    client
        .write_shard(WriteShardRequest {
            id: Some(sid(9, 0)),
            data: Bytes::from_static(b"hi"),
            cap: None,
            buffered: false,
        })
        .await
        .unwrap();
    assert_eq!(client.stat(Empty {}).await.unwrap().into_inner().node_id, 0);

    let meta = start_meta(tokio::net::TcpListener::bind(meta_addr).await.unwrap());
    eventually("registration once the metaserver is up", || !meta.registrations.lock().is_empty()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stat(Empty {}).await.unwrap().into_inner().node_id != 7 {
        assert!(Instant::now() < deadline, "node id never set");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    chunk.stop().await;
}

/// A chunkserver with a 2 MiB SSD tier: writes past it land on HDD, the background mover
/// demotes below the low watermark, `Promote` brings named shards back until SSD is full, and
/// `Stat` shows the moves and the reads per tier.
async fn tiers_over_grpc(engine: IoEngineKind) {
    let root = tempfile::tempdir().unwrap();
    let (_meta, meta_addr) = fake_meta().await;
    let mut cfg = config(root.path(), meta_addr, engine);
    cfg.ssd_capacity = Some(2 << 20);
    // Counts below assume reads alone do not promote (the default promotes on the first read).
    cfg.promote_after_reads = 2;
    let chunk = start_chunk(cfg).await;
    let mut client = chunk.client().await;

    // 252 KiB + a 4 KiB header: 256 KiB files, 8 fit in 2 MiB.
    let shard = |n: u32| -> Bytes { (0..252 << 10).map(|i: u32| (i % 241) as u8 ^ n as u8).collect() };
    let mut tiers = Vec::new();
    for n in 0..10 {
        let reply = client
            .write_shard(WriteShardRequest {
                id: Some(sid(20, n)),
                data: shard(n),
                cap: None,
                buffered: false,
            })
            .await;
        tiers.push(reply.unwrap().into_inner().tier);
    }
    // The first 8 fill the SSD tier; the mover may already have made room for the last two.
    assert!(tiers[..8].iter().all(|t| t == "ssd"), "{tiers:?}");

    // Full SSD is above 90%: the mover demotes down to 75% (6 shards) on its own, least
    // recently written first. If it ran between the writes (made room, then the last two landed
    // on SSD or one on HDD), the SSD may stay at 7 shards, 87.5%: under the 90% mark, where it
    // has nothing to do.
    let deadline = Instant::now() + Duration::from_secs(20);
    let stat = loop {
        let stat = client.stat(Empty {}).await.unwrap().into_inner();
        let ssd = &stat.tiers[0];
        if ssd.demotions >= 2 && ssd.used * 10 <= ssd.capacity * 9 {
            break stat;
        }
        assert!(Instant::now() < deadline, "the mover never demoted: {:?}", stat.tiers);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((stat.tiers[0].capacity, stat.tiers[0].shards + stat.tiers[1].shards), (2 << 20, 10));
    assert!(stat.tiers[0].demotions >= 2, "{:?}", stat.tiers);
    assert_eq!(stat.tiers[0].demotions, stat.tiers[1].demotions);
    for n in 0..10 {
        let read = client
            .read_shard(ReadShardRequest { id: Some(sid(20, n)), offset: 0, len: 0, ..Default::default() })
            .await;
        assert!(read.unwrap().into_inner().data == shard(n), "shard {n}");
    }
    let stat = client.stat(Empty {}).await.unwrap().into_inner();
    assert_eq!(stat.tiers[0].reads + stat.tiers[1].reads, 10);
    assert_eq!(stat.tiers[1].read_bytes, stat.tiers[1].reads * (252 << 10));

    // Warmup: one HDD shard comes back; asking for all of them fills SSD and says so (a
    // request never evicts its own shards to make room).
    let reply = client
        .promote(PromoteRequest { ids: vec![sid(20, 0), sid(20, 0), sid(99, 0)], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((reply.promoted, reply.already, reply.missing, reply.bytes), (1, 1, 1, 256 << 10));
    let all = PromoteRequest { ids: (0..10).map(|n| sid(20, n)).collect(), ..Default::default() };
    let r = client.promote(all).await.unwrap().into_inner();
    assert!(r.no_space && r.error.contains("SSD tier is full"), "{r:?}");
    assert!(r.not_looked_at > 0 && r.promoted + r.already + r.not_looked_at <= 10, "{r:?}");
    let hostile = cairn_proto::ShardId { ino: 0, stripe: 1, index: 200, version: 1 };
    assert_eq!(
        kind(client.promote(PromoteRequest { ids: vec![hostile], ..Default::default() }).await),
        ErrorKind::InvalidArgument
    );
    chunk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_over_grpc_uring() {
    tiers_over_grpc(IoEngineKind::Uring).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_over_grpc_pread() {
    tiers_over_grpc(IoEngineKind::Pread).await;
}

#[tokio::test]
async fn bad_configs_are_clear_errors() {
    let root = tempfile::tempdir().unwrap();
    let meta: SocketAddr = "127.0.0.1:9".parse().unwrap();

    let mut bad = config(root.path(), meta, IoEngineKind::Pread);
    bad.listen = "not an address".into();
    let err = cairn_chunk::run(bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("listen"), "{err}");

    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut busy = config(root.path(), meta, IoEngineKind::Pread);
    busy.listen = taken.local_addr().unwrap().to_string();
    let err = cairn_chunk::run(busy).await.unwrap_err();
    assert!(err.message().contains("cannot listen"), "{err}");

    let mut no_dirs = config(root.path(), meta, IoEngineKind::Pread);
    no_dirs.ssd_dirs.clear();
    no_dirs.hdd_dirs.clear();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = cairn_chunk::serve(no_dirs, listener, std::future::pending()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    let mut watermarks = config(root.path(), meta, IoEngineKind::Pread);
    watermarks.ssd_low_watermark = 0.95;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = cairn_chunk::serve(watermarks, listener, std::future::pending()).await.unwrap_err();
    assert!(err.message().contains("watermark"), "{err}");

    // A data directory that cannot be created (a file is in the way).
    std::fs::write(root.path().join("file"), b"").unwrap();
    let mut blocked = config(root.path(), meta, IoEngineKind::Pread);
    blocked.ssd_dirs = vec![root.path().join("file").join("ssd")];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = cairn_chunk::serve(blocked, listener, std::future::pending()).await.unwrap_err();
    assert!(err.message().contains("cannot create shard directory"), "{err}");
}
