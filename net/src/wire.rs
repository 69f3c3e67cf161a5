//! The wire protocol: the same `Meta` and `Chunk` RPCs as gRPC, framed directly on TCP, for the
//! client's hot path (every namespace call of a mount, every shard read and write).
//!
//! Why a second transport: a tonic unary call on a cloned channel hops through a tower buffer
//! task and the HTTP/2 connection task on the client, and through the connection task and a task
//! per stream on the server; on two cores shared by a client, a metaserver and six chunkservers
//! those hops (wake-ups, HPACK, flow-control windows of 64 KiB per 1 MiB shard) were the largest
//! cost of a metadata round trip and of a shard transfer (`bench/RESULTS.md`). Here a request
//! takes an idle connection from a pool, writes one frame, reads one frame on the same task and
//! gives the connection back: no task in between on either side.
//!
//! **Connection.** A client connection opens with [`MAGIC`] (8 bytes, the protocol version in the
//! last two), then carries one request at a time; concurrency is more connections (a pool per
//! server, grown on demand, idle ones kept up to [`IDLE_PER_SERVER`]). The server listens on its
//! gRPC port and tells the protocols apart by the first bytes ([`serve`]): HTTP/2 opens with
//! `PRI * HTTP/2.0`, so gRPC clients (admin commands, servers among themselves) are unaffected.
//!
//! **Frames** (little-endian):
//! - request: `body_len u32 | bulk_len u32 | method u16 | 0u16 | body | bulk`
//! - reply: `body_len u32 | bulk_len u32 | status u8 | kind u8 | 0u16 | body | bulk`
//!
//! `body` is the prost encoding of the request or reply message; `bulk` is the shard data of
//! `WriteShardRequest.data` and `ReadShardReply.data`, sent raw after the body so that neither
//! side copies it into or out of a protobuf buffer (it arrives as a slice of the receive buffer).
//! A reply with `status` 1 is an error: `kind` indexes [`ErrorKind`] and `body` is the message,
//! so the caller gets exactly the error the server raised, as through gRPC. A frame longer than
//! [`cairn_common::MAX_MESSAGE_BYTES`] or a bad magic closes the connection; an unknown method or a body
//! that does not decode is an error reply and the connection stays usable.
//!
//! **Limits** ([`Limits`]): what a peer can make a server hold is bounded before anything is
//! allocated. A header reserves at most [`EAGER_ALLOC`] (a longer frame's buffer grows as its
//! bytes arrive); bulk bytes sent to a method without a bulk part are read past, unkept;
//! connections are counted from accept to close (wire and gRPC alike) and refused beyond a total
//! and a per-address number; a connection idle between requests, a request whose bytes stop
//! coming and a reply its peer does not take are cut off after their timeouts; keepalive probes
//! find vanished peers; a stopping server gives its connections [`SHUTDOWN_GRACE`], then cuts
//! them. gRPC connections get HTTP/2 keepalive and a stream limit ([`grpc_server`]).

use std::future::Future;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::connect::ClientConn;
use crate::tls::{Alpn, Peer, Role};
use cairn_common::{CairnError, ErrorKind, Result, MAX_MESSAGE_BYTES};

/// First bytes of every wire connection: `CAIRNW`, then the protocol version (1).
pub const MAGIC: [u8; 8] = *b"CAIRNW\x00\x01";
/// Idle connections a client keeps per server; more are closed when returned.
pub const IDLE_PER_SERVER: usize = 32;
/// Bytes of a frame header.
pub const HEADER: usize = 12;
/// A client does not reuse a connection idle this long: well before the server's idle timeout
/// ([`Limits::idle`]) closes it, so a request never races the server's close.
pub(crate) const CLIENT_IDLE: Duration = Duration::from_secs(60);
/// Bytes of a frame allocated when its header arrives; a longer frame's buffer grows as its
/// bytes arrive, so a header alone cannot make the server reserve more than this.
pub(crate) const EAGER_ALLOC: usize = 4 << 20;
/// How long a stopping server lets its connections finish the request in hand.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
pub(crate) const STATUS_OK: u8 = 0;
pub(crate) const STATUS_ERROR: u8 = 1;

/// A protobuf message that may travel with a raw bulk part (shard data).
pub trait Message: prost::Message + Default + Send + 'static {
    /// Whether the message has a bulk field (a request without one is sent no bulk bytes).
    const BULK: bool = false;
    /// Move the bulk field out before the message is encoded.
    fn take_bulk(&mut self) -> Bytes {
        Bytes::new()
    }
    /// Put the received bulk part back into the decoded message.
    fn put_bulk(&mut self, bulk: Bytes) -> Result<()> {
        if bulk.is_empty() {
            Ok(())
        } else {
            Err(CairnError::invalid("a bulk part for a message that has none"))
        }
    }
}

macro_rules! plain_messages {
    ($($t:ident),* $(,)?) => { $(impl Message for cairn_proto::$t {})* };
}

plain_messages!(
    AttrReply,
    Capability,
    CapabilityRequest,
    CheckNamespaceReply,
    CheckNamespaceRequest,
    CheckShardsReply,
    CheckShardsRequest,
    ChunkStatReply,
    ClientHeartbeatReply,
    ClientHeartbeatRequest,
    ClusterStatusReply,
    CommitRequest,
    CreateReply,
    CreateRequest,
    DeleteShardsReply,
    DeleteShardsRequest,
    Empty,
    GroupMap,
    HeartbeatReply,
    HeartbeatRequest,
    InoRequest,
    LayoutReply,
    LinkRequest,
    ListNodesReply,
    ListShardsReply,
    ListShardsRequest,
    ListStripesReply,
    ListStripesRequest,
    ListXattrReply,
    LockReply,
    LockRequest,
    LookupRequest,
    MkdirRequest,
    NodeReply,
    NodeRequest,
    OpenReply,
    OpenRequest,
    PinReply,
    PinRequest,
    SyncShardsRequest,
    PromoteReply,
    PromoteRequest,
    RaftMessage,
    ReadDirReply,
    ReadDirRequest,
    ReadShardRequest,
    ReadlinkReply,
    RebuildShardReply,
    RebuildShardRequest,
    ReconcileReply,
    ReconcileRequest,
    RegisterChunkReply,
    RegisterChunkRequest,
    RegisterClientReply,
    ReleaseRequest,
    RemoveReply,
    RemoveRequest,
    RenameReply,
    RenameRequest,
    ReportDamagedReply,
    ReportDamagedRequest,
    SetAttrRequest,
    SetLayoutRequest,
    SetXattrRequest,
    StatFsReply,
    SymlinkRequest,
    WriteShardReply,
    XattrReply,
    XattrRequest,
);

macro_rules! bulk_message {
    ($t:ident, $field:ident) => {
        impl Message for cairn_proto::$t {
            const BULK: bool = true;
            fn take_bulk(&mut self) -> Bytes {
                std::mem::take(&mut self.$field)
            }
            fn put_bulk(&mut self, bulk: Bytes) -> Result<()> {
                if !self.$field.is_empty() && !bulk.is_empty() {
                    return Err(CairnError::invalid("shard data both in the body and in the bulk part"));
                }
                if !bulk.is_empty() {
                    self.$field = bulk;
                }
                Ok(())
            }
        }
    };
}

bulk_message!(WriteShardRequest, data);
bulk_message!(ReadShardReply, data);

/// What a server's dispatch returns for one request: the reply frame's header space
/// ([`HEADER`] zero bytes, filled in when it is sent) followed by the body, and the bulk part.
pub type Answer = Result<(Vec<u8>, Bytes)>;
/// A boxed future of one request's [`Answer`].
pub type AnswerFuture<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

/// Answers wire requests for one service (see [`meta`] and [`chunk`] for the two).
pub trait Handler: Send + Sync + 'static {
    /// The `service` label of the request metrics ("meta", "chunk").
    fn service(&self) -> &'static str;
    /// The name of a method id (for metrics), or `None` when it is not one of this service's.
    fn method_name(&self, method: u16) -> Option<&'static str>;
    /// Whether the method's request has a bulk part (shard data): the server reads a frame's
    /// bulk bytes into memory only for these, and discards them unread for any other.
    fn accepts_bulk(&self, _method: u16) -> bool {
        false
    }
    /// Decode, answer and encode one request from `peer` (put in the request's extensions, as
    /// gRPC requests carry it).
    fn answer(&self, method: u16, body: Bytes, bulk: Bytes, peer: &Peer) -> AnswerFuture<'_>;
}

/// Decode a request, call the service's method with it, encode the reply.
pub async fn call_typed<Q, R, F, Fut>(body: Bytes, bulk: Bytes, peer: Peer, f: F) -> Answer
where
    Q: Message,
    R: Message,
    F: FnOnce(tonic::Request<Q>) -> Fut,
    Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
{
    let mut req = Q::decode(body).map_err(|e| CairnError::invalid(format!("malformed request: {e}")))?;
    req.put_bulk(bulk)?;
    let mut req = tonic::Request::new(req);
    req.extensions_mut().insert(peer);
    let mut reply = f(req).await.map_err(CairnError::from)?.into_inner();
    let bulk = reply.take_bulk();
    let mut frame = Vec::with_capacity(HEADER + reply.encoded_len());
    frame.extend_from_slice(&[0; HEADER]);
    reply.encode(&mut frame).map_err(|e| CairnError::internal(format!("encode reply: {e}")))?;
    Ok((frame, bulk))
}

/// Declares a service's methods once: the id enum, the typed client calls (`pub async fn
/// lookup(&WireClient, LookupRequest) -> Result<AttrReply>`) and the server's [`Handler`] over
/// the generated tonic trait, so both sides agree on every id and type.
macro_rules! service {
    ($module:ident, $label:literal, $server:path, $($id:literal $method:ident $name:literal ($req:ident) -> $reply:ident;)*) => {
        pub mod $module {
            use super::*;
            use cairn_proto as p;

            /// Method ids of this service.
            pub mod ids {
                $(#[allow(non_upper_case_globals)] pub const $method: u16 = $id;)*
            }

            $(
                pub async fn $method(client: &WireClient, req: p::$req) -> Result<p::$reply> {
                    client.call(ids::$method, req).await
                }
            )*

            /// The proto name of a method id, or `None` when it is not one of this service's.
            pub fn method_name(method: u16) -> Option<&'static str> {
                match method {
                    $($id => Some($name),)*
                    _ => None,
                }
            }

            /// Decode one request frame's parts as this service's server would, and check that the
            /// message re-encodes to itself (for the fuzz targets in `fuzz/`).
            #[doc(hidden)]
            pub fn check_request(method: u16, body: Bytes, bulk: Bytes) -> Result<()> {
                match method {
                    $($id => roundtrip::<p::$req>(body, bulk),)*
                    _ => Err(CairnError::new(ErrorKind::NotSupported, format!("no method {method}"))),
                }
            }

            /// Parse one reply frame's parts as this service's clients would (see [`check_request`]).
            #[doc(hidden)]
            pub fn check_reply(method: u16, status: u8, kind: u8, body: Bytes, bulk: Bytes) -> Result<()> {
                match method {
                    $($id => parse_reply::<p::$reply>("fuzz", status, kind, body, bulk).and_then(|r| {
                        let (body, bulk) = encode_parts(r);
                        roundtrip::<p::$reply>(body, bulk)
                    }),)*
                    _ => Err(CairnError::new(ErrorKind::NotSupported, format!("no method {method}"))),
                }
            }

            /// Answers this service's wire requests with `S`, the same implementation as gRPC.
            pub struct Service<S>(pub Arc<S>);

            impl<S: $server> Handler for Service<S> {
                fn service(&self) -> &'static str {
                    $label
                }
                fn method_name(&self, method: u16) -> Option<&'static str> {
                    method_name(method)
                }
                fn accepts_bulk(&self, method: u16) -> bool {
                    match method {
                        $($id => <p::$req as Message>::BULK,)*
                        _ => false,
                    }
                }
                fn answer(&self, method: u16, body: Bytes, bulk: Bytes, peer: &Peer) -> AnswerFuture<'_> {
                    let svc = &*self.0;
                    let peer = peer.clone();
                    Box::pin(async move {
                        match method {
                            $($id => call_typed(body, bulk, peer, |r: tonic::Request<p::$req>| async move {
                                <S as $server>::$method(svc, r).await
                            }).await,)*
                            _ => Err(CairnError::new(
                                ErrorKind::NotSupported,
                                format!("{} service has no method {method}", $label),
                            )),
                        }
                    })
                }
            }
        }
    };
}

service!(meta, "meta", cairn_proto::meta_server::Meta,
    1 lookup "Lookup" (LookupRequest) -> AttrReply;
    2 get_attr "GetAttr" (InoRequest) -> AttrReply;
    3 set_attr "SetAttr" (SetAttrRequest) -> AttrReply;
    4 create "Create" (CreateRequest) -> CreateReply;
    5 mkdir "Mkdir" (MkdirRequest) -> AttrReply;
    6 unlink "Unlink" (RemoveRequest) -> RemoveReply;
    7 rmdir "Rmdir" (RemoveRequest) -> RemoveReply;
    8 rename "Rename" (RenameRequest) -> RenameReply;
    9 link "Link" (LinkRequest) -> AttrReply;
    10 symlink "Symlink" (SymlinkRequest) -> AttrReply;
    11 readlink "Readlink" (InoRequest) -> ReadlinkReply;
    12 read_dir "ReadDir" (ReadDirRequest) -> ReadDirReply;
    13 stat_fs "StatFs" (Empty) -> StatFsReply;
    14 get_xattr "GetXattr" (XattrRequest) -> XattrReply;
    15 set_xattr "SetXattr" (SetXattrRequest) -> Empty;
    16 list_xattr "ListXattr" (InoRequest) -> ListXattrReply;
    17 remove_xattr "RemoveXattr" (XattrRequest) -> Empty;
    18 open "Open" (OpenRequest) -> OpenReply;
    19 release "Release" (ReleaseRequest) -> Empty;
    20 client_heartbeat "ClientHeartbeat" (ClientHeartbeatRequest) -> ClientHeartbeatReply;
    21 lock "Lock" (LockRequest) -> LockReply;
    22 list_stripes "ListStripes" (ListStripesRequest) -> ListStripesReply;
    23 commit "Commit" (CommitRequest) -> AttrReply;
    24 register_client "RegisterClient" (Empty) -> RegisterClientReply;
    25 register_chunk "RegisterChunk" (RegisterChunkRequest) -> RegisterChunkReply;
    26 heartbeat "Heartbeat" (HeartbeatRequest) -> HeartbeatReply;
    27 list_nodes "ListNodes" (Empty) -> ListNodesReply;
    28 cluster_status "ClusterStatus" (Empty) -> ClusterStatusReply;
    29 report_damaged "ReportDamaged" (ReportDamagedRequest) -> ReportDamagedReply;
    30 repair_now "RepairNow" (Empty) -> ClusterStatusReply;
    31 check_namespace "CheckNamespace" (CheckNamespaceRequest) -> CheckNamespaceReply;
    32 reconcile "Reconcile" (ReconcileRequest) -> ReconcileReply;
    33 drain_node "DrainNode" (NodeRequest) -> NodeReply;
    34 activate_node "ActivateNode" (NodeRequest) -> NodeReply;
    35 remove_node "RemoveNode" (NodeRequest) -> Empty;
    36 get_layout "GetLayout" (InoRequest) -> LayoutReply;
    37 set_layout "SetLayout" (SetLayoutRequest) -> LayoutReply;
    38 sync "Sync" (Empty) -> Empty;
    39 grant_capability "GrantCapability" (CapabilityRequest) -> Capability;
    40 raft_vote "RaftVote" (RaftMessage) -> RaftMessage;
    41 raft_append "RaftAppend" (RaftMessage) -> RaftMessage;
    42 get_group_map "GetGroupMap" (Empty) -> GroupMap;
);

service!(chunk, "chunk", cairn_proto::chunk_server::Chunk,
    1 write_shard "WriteShard" (WriteShardRequest) -> WriteShardReply;
    2 read_shard "ReadShard" (ReadShardRequest) -> ReadShardReply;
    3 delete_shards "DeleteShards" (DeleteShardsRequest) -> DeleteShardsReply;
    4 stat "Stat" (Empty) -> ChunkStatReply;
    5 promote "Promote" (PromoteRequest) -> PromoteReply;
    6 rebuild_shard "RebuildShard" (RebuildShardRequest) -> RebuildShardReply;
    7 list_shards "ListShards" (ListShardsRequest) -> ListShardsReply;
    8 check_shards "CheckShards" (CheckShardsRequest) -> CheckShardsReply;
    9 pin "Pin" (PinRequest) -> PinReply;
    10 sync_shards "SyncShards" (SyncShardsRequest) -> Empty;
);

/// A client's connections to one server: a pool of idle wire connections, each carrying one
/// request at a time.
pub struct WireClient {
    addr: String,
    /// The role the server's certificate must hold.
    role: Role,
    connect_timeout: Duration,
    timeout: Duration,
    /// Idle connections with when each was last used.
    idle: Mutex<Vec<(ClientConn, Instant)>>,
}

impl WireClient {
    /// Connections to `addr` (`host:port`), a server of `role`, made on demand (in TLS when
    /// the process has an identity, see [`crate::connect`]); a request that has no answer
    /// within `timeout` (connecting included) fails as `Unavailable` and its connection is
    /// closed.
    pub fn new(addr: &str, role: Role, connect_timeout: Duration, timeout: Duration) -> WireClient {
        WireClient { addr: addr.to_string(), role, connect_timeout, timeout, idle: Mutex::new(Vec::new()) }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Open one connection now, so a server that is not there is reported at once.
    pub async fn check(&self) -> Result<()> {
        let conn = self.connect().await?;
        self.put_back(conn);
        Ok(())
    }

    /// Send `req` as `method` and wait for its reply.
    pub async fn call<Q: Message, R: Message>(&self, method: u16, mut req: Q) -> Result<R> {
        let bulk = req.take_bulk();
        let mut head = Vec::with_capacity(HEADER + req.encoded_len());
        head.extend_from_slice(&[0; HEADER]);
        req.encode(&mut head).map_err(|e| CairnError::internal(format!("encode request: {e}")))?;
        let body_len = head.len() - HEADER;
        write_header(&mut head, body_len, bulk.len(), &method.to_le_bytes(), 0)?;
        let exchange = async {
            let mut conn = match self.take_idle() {
                Some(c) => c,
                None => self.connect().await?,
            };
            write_frame(&mut conn, &head, &bulk).await.map_err(|e| self.lost(&e))?;
            let (status, kind, body, bulk) = read_reply(&mut conn).await.map_err(|e| self.lost(&e))?;
            self.put_back(conn);
            Ok::<_, CairnError>((status, kind, body, bulk))
        };
        let (status, kind, body, bulk) =
            tokio::time::timeout(self.timeout, exchange).await.map_err(|_| {
                CairnError::unavailable(format!("{}: no answer within {:?}", self.addr, self.timeout))
            })??;
        parse_reply(&self.addr, status, kind, body, bulk)
    }

    fn lost(&self, e: &std::io::Error) -> CairnError {
        if crate::tls::is_tls_refusal(e) {
            return CairnError::new(
                ErrorKind::PermissionDenied,
                format!("{} refused this process's TLS certificate: {e}", self.addr),
            );
        }
        CairnError::unavailable(format!("connection to {} lost: {e}", self.addr))
    }

    async fn connect(&self) -> Result<ClientConn> {
        let unreachable = |e: String| CairnError::unavailable(format!("cannot reach {}: {e}", self.addr));
        let mut conn = crate::connect::open(&self.addr, self.role, Alpn::Wire, self.connect_timeout)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    CairnError::new(ErrorKind::PermissionDenied, format!("{}: {e}", self.addr))
                }
                _ => unreachable(e.to_string()),
            })?;
        conn.write_all(&MAGIC).await.map_err(|e| unreachable(e.to_string()))?;
        Ok(conn)
    }

    /// An idle connection the server has not closed meanwhile (a restarted server closed all of
    /// them; reusing one would fail the request), nor is about to close for being idle.
    fn take_idle(&self) -> Option<ClientConn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((conn, used)) = idle.pop() {
            if used.elapsed() < CLIENT_IDLE && still_open(conn.tcp()) {
                return Some(conn);
            }
        }
        None
    }

    fn put_back(&self, conn: ClientConn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_PER_SERVER {
            idle.push((conn, Instant::now()));
        }
    }
}

/// An idle connection has nothing to read: a readable one was closed by the server (or broke
/// the protocol), either way not to be used again. (In TLS too: servers send no session
/// tickets, so an idle TLS connection has nothing to read either.)
pub(crate) fn still_open(conn: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a local buffer on a socket this process owns.
    let n = unsafe {
        libc::recv(conn.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

pub(crate) fn write_header(
    head: &mut [u8],
    body_len: usize,
    bulk_len: usize,
    tag: &[u8; 2],
    extra: u16,
) -> Result<()> {
    if body_len > MAX_MESSAGE_BYTES || bulk_len > MAX_MESSAGE_BYTES {
        return Err(CairnError::invalid(format!(
            "message of {} bytes, more than the {MAX_MESSAGE_BYTES} allowed",
            body_len + bulk_len
        )));
    }
    head[0..4].copy_from_slice(&(body_len as u32).to_le_bytes());
    head[4..8].copy_from_slice(&(bulk_len as u32).to_le_bytes());
    head[8..10].copy_from_slice(tag);
    head[10..12].copy_from_slice(&extra.to_le_bytes());
    Ok(())
}

/// Write `head` then `bulk` without copying them together, and flush (TLS buffers records).
pub(crate) async fn write_frame<S: AsyncWrite + Unpin>(
    conn: &mut S,
    head: &[u8],
    bulk: &[u8],
) -> std::io::Result<()> {
    let (mut head, mut bulk) = (head, bulk);
    while !head.is_empty() {
        let n = conn.write_vectored(&[IoSlice::new(head), IoSlice::new(bulk)]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        bulk = &bulk[n - from_head..];
    }
    conn.write_all(bulk).await?;
    conn.flush().await
}

/// A reply frame's parts as the caller's result: the server's error, or the decoded message
/// with its bulk part put back. `from` names the server in errors.
pub(crate) fn parse_reply<R: Message>(
    from: &str,
    status: u8,
    kind: u8,
    body: Bytes,
    bulk: Bytes,
) -> Result<R> {
    if status != STATUS_OK {
        let kind = ErrorKind::from_index(kind).unwrap_or(ErrorKind::Internal);
        return Err(CairnError::new(kind, String::from_utf8_lossy(&body).into_owned()));
    }
    let mut reply =
        R::decode(body).map_err(|e| CairnError::internal(format!("{from}: reply does not decode: {e}")))?;
    reply.put_bulk(bulk)?;
    Ok(reply)
}

/// A message as the body and bulk parts a frame carries.
pub(crate) fn encode_parts<M: Message>(mut m: M) -> (Bytes, Bytes) {
    let bulk = m.take_bulk();
    (Bytes::from(m.encode_to_vec()), bulk)
}

/// Decode `M` from a frame's parts; a message that decodes must encode back into parts that
/// decode to the same message (a difference is a bug: it panics, for the fuzzer to find).
fn roundtrip<M: Message + Clone + PartialEq + std::fmt::Debug>(body: Bytes, bulk: Bytes) -> Result<()> {
    let mut first = M::decode(body).map_err(|e| CairnError::invalid(format!("malformed: {e}")))?;
    first.put_bulk(bulk)?;
    let (body, bulk) = encode_parts(first.clone());
    let mut again = M::decode(body).expect("a re-encoded message decodes");
    again.put_bulk(bulk).expect("a re-encoded bulk part is accepted");
    assert_eq!(first, again, "a message changed through encode and decode");
    Ok(())
}

/// Read frames from `input` as a server (or, with `replies`, a client) reads them off a
/// connection, and decode each for both services: what the fuzz target `wire_frames` runs.
/// Stops at the first frame the connection would be closed for. A reply frame does not name
/// its method (the caller knows it), so here the reply type is chosen by the header's last two
/// bytes (zero on the wire).
#[doc(hidden)]
pub async fn check_frames(mut input: &[u8], replies: bool) -> usize {
    let mut frames = 0;
    while let Ok((header, body, bulk)) = read_frame(&mut input).await {
        frames += 1;
        if replies {
            let method = u16::from_le_bytes([header[10], header[11]]);
            let _ = meta::check_reply(method, header[8], header[9], body.clone(), bulk.clone());
            let _ = chunk::check_reply(method, header[8], header[9], body, bulk);
        } else {
            let method = u16::from_le_bytes([header[8], header[9]]);
            let _ = meta::check_request(method, body.clone(), bulk.clone());
            let _ = chunk::check_request(method, body, bulk);
        }
    }
    frames
}

/// A frame header's two lengths, refused above [`MAX_MESSAGE_BYTES`] each.
pub(crate) fn frame_lengths(header: &[u8; HEADER]) -> std::io::Result<(usize, usize)> {
    let body_len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
    let bulk_len = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
    if body_len > MAX_MESSAGE_BYTES || bulk_len > MAX_MESSAGE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {} bytes, more than the {MAX_MESSAGE_BYTES} allowed", body_len + bulk_len),
        ));
    }
    Ok((body_len, bulk_len))
}

/// Read `total` bytes into one buffer (no zeroing, no copy after for frames up to
/// [`EAGER_ALLOC`]; a longer one's buffer doubles as its bytes arrive).
pub(crate) async fn read_exact_bytes<S: AsyncRead + Unpin>(
    conn: &mut S,
    total: usize,
) -> std::io::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(total.min(EAGER_ALLOC));
    while buf.len() < total {
        if buf.len() == buf.capacity() {
            buf.reserve((total - buf.len()).min(buf.len()));
        }
        let room = (buf.capacity() - buf.len()).min(total - buf.len());
        let mut limited = (&mut *conn).take(room as u64);
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

/// Read a frame's header and its body and bulk into one buffer.
pub(crate) async fn read_frame<S: AsyncRead + Unpin>(
    conn: &mut S,
) -> std::io::Result<([u8; HEADER], Bytes, Bytes)> {
    let mut header = [0u8; HEADER];
    conn.read_exact(&mut header).await?;
    let (body_len, bulk_len) = frame_lengths(&header)?;
    let mut body = read_exact_bytes(conn, body_len + bulk_len).await?.freeze();
    let bulk = body.split_off(body_len);
    Ok((header, body, bulk))
}

async fn read_reply<S: AsyncRead + Unpin>(conn: &mut S) -> std::io::Result<(u8, u8, Bytes, Bytes)> {
    let (header, body, bulk) = read_frame(conn).await?;
    Ok((header[8], header[9], body, bulk))
}

#[cfg(test)]
mod tests;
