//! The server side of both transports on one port: admission (connection limits), TLS,
//! telling the protocols apart, and answering wire connections; gRPC connections are handed
//! to tonic.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_common::{CairnError, ErrorKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::connect::ServerConn;
use crate::connect::Stream;
use crate::tls::{Alpn, Peer};
use crate::wire::*;

/// What a server allows its peers, so that no peer can exhaust it: connections at once (wire
/// and gRPC alike, counted from accept to close), in total and from one IP address; how long a
/// wire connection may sit idle between requests; and how long the rest of a request may take
/// to arrive once its header did, and a reply to be taken by the peer (a slowloris, or a client
/// that stopped reading, is disconnected).
#[derive(Clone, Debug)]
pub struct Limits {
    pub connections: usize,
    pub connections_per_peer: usize,
    /// How long a new connection may take to send its first bytes (the wire magic, or a gRPC
    /// client's preface), before it is told apart and served.
    pub hello: Duration,
    pub idle: Duration,
    pub transfer: Duration,
}

impl Default for Limits {
    /// 4,096 connections, 1,024 from one address (a client's pool per server is 32 idle, more
    /// while busy; a host may run several mounts), both kept below this process's open-file
    /// limit (less [`crate::rlimit::RESERVED_FDS`]); 5 minutes idle, 60 s per transfer (a 64 MiB
    /// shard at ~1 MiB/s).
    fn default() -> Limits {
        let room = crate::rlimit::open_files().saturating_sub(crate::rlimit::RESERVED_FDS).max(64);
        let connections = 4096.min(room as usize);
        Limits {
            connections,
            connections_per_peer: 1024.min(connections),
            hello: Duration::from_secs(10),
            idle: Duration::from_secs(300),
            transfer: Duration::from_secs(60),
        }
    }
}

/// Connections open now, in total and by peer address.
#[derive(Default)]
struct Admission {
    open: Mutex<(usize, std::collections::HashMap<std::net::IpAddr, usize>)>,
}

/// One admitted connection; dropping it (when the connection closes) frees its place.
struct Permit {
    admission: Arc<Admission>,
    peer: std::net::IpAddr,
}

impl Admission {
    /// A place for a connection from `peer`, or why there is none.
    fn admit(
        self: &Arc<Self>,
        peer: std::net::IpAddr,
        limits: &Limits,
    ) -> std::result::Result<Permit, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.0 >= limits.connections {
            return Err("total");
        }
        let from_peer = open.1.entry(peer).or_default();
        if *from_peer >= limits.connections_per_peer {
            return Err("peer");
        }
        *from_peer += 1;
        open.0 += 1;
        Ok(Permit { admission: self.clone(), peer })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = open.1.entry(self.peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// A gRPC connection handed to tonic, holding its place among the server's connections until
/// tonic drops it; its requests carry its [`Peer`] in their extensions.
pub struct Counted {
    conn: ServerConn,
    /// Bytes read off the connection before tonic took it (the HTTP/2 preface inside TLS,
    /// checked before the hand-over), given to tonic first.
    prefix: Bytes,
    peer: Peer,
    _permit: Permit,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return std::task::Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = Peer;
    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

/// Keepalive probes on a server's connection, so a peer that vanished (a powered-off host, a
/// cut cable) is noticed within a few minutes and its connection freed.
fn keepalive(conn: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
        .with_retries(6);
    let _ = socket2::SockRef::from(conn).set_tcp_keepalive(&probes);
}

/// A tonic server builder with the keepalive and per-connection limits every Cairn server
/// uses on its gRPC connections (the wire protocol's are in [`Limits`]), and the check of each
/// call against its caller's roles ([`crate::auth`]).
pub fn grpc_server(
) -> tonic::transport::Server<tower_layer::Stack<crate::auth::AuthorizeLayer, tower_layer::Identity>> {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(256))
        .http2_max_pending_accept_reset_streams(Some(64))
        .layer(crate::auth::AuthorizeLayer)
}

/// Serve `listener` until `shutdown` completes, with the default [`Limits`]: see [`serve_with`].
pub fn serve(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> (tokio_stream::wrappers::ReceiverStream<std::io::Result<Counted>>, tokio::task::JoinHandle<()>) {
    serve_with(listener, handler, shutdown, Limits::default())
}

/// Serve `listener` until `shutdown` completes: connections that open with [`MAGIC`] are
/// answered by `handler`, those that open with the HTTP/2 preface are handed to the returned
/// stream, which a tonic server takes as its incoming connections
/// (`serve_with_incoming_shutdown`), and any other is closed. A connection
/// beyond `limits` is closed as soon as it is accepted (and counted in
/// `cairn_rpc_connections_refused_total`).
///
/// The returned handle finishes once the listener is closed and every wire connection has
/// ended, that is once nothing here holds `handler` any more: a server awaits it before it
/// returns, so what the handler owns (a database lock, say) is released by then. Connections
/// get [`SHUTDOWN_GRACE`] to finish the request in hand; then they are cut (blocking work a cut
/// request started, such as a store write on the blocking pool, still runs to its end and holds
/// what it uses until then).
pub fn serve_with(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) -> (tokio_stream::wrappers::ReceiverStream<std::io::Result<Counted>>, tokio::task::JoinHandle<()>) {
    let (grpc, incoming) = tokio::sync::mpsc::channel(64);
    let admission = Arc::new(Admission::default());
    let accepting = tokio::spawn(async move {
        let mut stop = shutdown.clone();
        let mut connections = tokio::task::JoinSet::new();
        let mut last_refusal_logged: Option<Instant> = None;
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.wait_for(|s| *s) => break,
                // Reap finished connections as they end, so the set stays small.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let (conn, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let permit = match admission.admit(peer.ip(), &limits) {
                Ok(permit) => permit,
                Err(which) => {
                    crate::metrics::record_refused_connection(handler.service(), which);
                    if last_refusal_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        last_refusal_logged = Some(Instant::now());
                        tracing::warn!(
                            %peer,
                            "refusing connections: {} ({} in total, {} from one address allowed)",
                            if which == "peer" { "too many from this address" } else { "too many open" },
                            limits.connections,
                            limits.connections_per_peer
                        );
                    }
                    drop(conn);
                    continue;
                }
            };
            let _ = conn.set_nodelay(true);
            keepalive(&conn);
            let (handler, grpc, mut stop, limits) =
                (handler.clone(), grpc.clone(), shutdown.clone(), limits.clone());
            connections.spawn(async move {
                let opened = tokio::select! {
                    h = tokio::time::timeout(limits.hello, establish(conn, peer, handler.service())) => h,
                    _ = stop.wait_for(|s| *s) => return,
                };
                // Neither protocol, not authenticated, silent past `hello`, or gone: closed.
                let Ok(Some((conn, alpn, peer, prefix))) = opened else { return };
                match alpn {
                    Alpn::Wire => serve_connection(conn, peer, handler, stop, &limits).await,
                    Alpn::Grpc => {
                        let _ = grpc.send(Ok(Counted { conn, prefix, peer, _permit: permit })).await;
                    }
                }
            });
        }
        drop(listener);
        drop(handler);
        drop(grpc);
        // Each connection ends at its next frame boundary once `stop` is set; one whose peer
        // does not take its reply is cut after the grace.
        let drained =
            tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} })
                .await;
        if drained.is_err() {
            connections.abort_all();
            while connections.join_next().await.is_some() {}
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(incoming), accepting)
}

/// One shutdown future made into two: a watch for [`serve`] and a future for the tonic server,
/// which sets the watch when the server sees the shutdown.
pub fn split_shutdown(
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (tokio::sync::watch::Receiver<bool>, impl Future<Output = ()> + Send + 'static) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    (stopped, async move {
        shutdown.await;
        let _ = stop.send(true);
    })
}

/// The first byte of a TLS connection (a handshake record, the client hello).
const TLS_HANDSHAKE: u8 = 0x16;

/// Tell a new connection's protocol and, on a TLS server (one whose process has an identity),
/// run the handshake: the connection as it is to be served, its protocol, who is on the other
/// end, and bytes already read that belong to the protocol (see [`Counted`]); `None` for a
/// connection to close (the caller bounds how long this takes). A wire connection's magic and
/// a gRPC connection's preface are checked here, inside TLS too, so a peer that authenticated
/// and then says nothing is cut at the same deadline as one that did not. A TLS server answers
/// a plaintext wire client's first request with an error that says why.
async fn establish(
    conn: TcpStream,
    addr: std::net::SocketAddr,
    service: &'static str,
) -> Option<(ServerConn, Alpn, Peer, Bytes)> {
    let (mut conn, alpn, peer) = authenticate(conn, addr, service).await?;
    match alpn {
        Alpn::Wire => {
            let mut magic = [0u8; MAGIC.len()];
            conn.read_exact(&mut magic).await.ok()?;
            (magic == MAGIC).then_some((conn, alpn, peer, Bytes::new()))
        }
        // A plaintext gRPC connection's preface was only peeked at: tonic reads it.
        Alpn::Grpc if matches!(conn, Stream::Plain(_)) => Some((conn, alpn, peer, Bytes::new())),
        Alpn::Grpc => {
            let mut preface = [0u8; H2_PREFACE.len()];
            conn.read_exact(&mut preface).await.ok()?;
            (&preface == H2_PREFACE).then(|| (conn, alpn, peer, Bytes::copy_from_slice(&preface)))
        }
    }
}

/// The part of [`establish`] that decides who the peer is.
async fn authenticate(
    conn: TcpStream,
    addr: std::net::SocketAddr,
    service: &'static str,
) -> Option<(ServerConn, Alpn, Peer)> {
    let opened = hello(&conn).await.ok()?;
    let refused = |reason: &'static str, why: &str| {
        crate::metrics::record_unauthenticated(service, reason);
        log_unauthenticated(addr, why);
    };
    match (crate::tls::identity(), opened) {
        (_, Hello::Other) => None,
        (None, Hello::Wire) => Some((Stream::Plain(conn), Alpn::Wire, Peer::plaintext(Some(addr)))),
        (None, Hello::Grpc) => Some((Stream::Plain(conn), Alpn::Grpc, Peer::plaintext(Some(addr)))),
        (None, Hello::Tls) => {
            refused("tls", "a TLS client reached this plaintext server");
            None
        }
        (Some(identity), Hello::Tls) => match crate::tls::accept(conn, &identity).await {
            Ok((stream, alpn, peer)) => Some((Stream::Tls(Box::new(stream)), alpn, peer)),
            Err(e) => {
                refused("handshake", &format!("TLS handshake failed: {e}"));
                None
            }
        },
        (Some(_), Hello::Wire) => {
            refused("plaintext", "a plaintext wire client (no TLS, no certificate)");
            refuse_plaintext(conn).await;
            None
        }
        (Some(_), Hello::Grpc) => {
            refused("plaintext", "a plaintext gRPC client (no TLS, no certificate)");
            None
        }
    }
}

/// Log a connection refused for not authenticating, at most once every 10 s (a scan or a
/// misconfigured client must not flood the log).
fn log_unauthenticated(addr: std::net::SocketAddr, why: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
        *last = Some(Instant::now());
        tracing::warn!(peer = %addr, "connection refused: {why} (cairn_rpc_connections_unauthenticated_total counts them all)");
    }
}

/// Answer a plaintext wire client's first request with "requires mutual TLS", so it can say
/// why instead of "connection lost". Its request is read first (bounded by the caller's
/// timeout), so the reply is not lost to a reset.
async fn refuse_plaintext(mut conn: TcpStream) {
    let mut magic = [0u8; MAGIC.len()];
    let mut header = [0u8; HEADER];
    if conn.read_exact(&mut magic).await.is_err() || conn.read_exact(&mut header).await.is_err() {
        return;
    }
    let Ok((body_len, bulk_len)) = frame_lengths(&header) else { return };
    let rest = (body_len + bulk_len) as u64;
    match tokio::io::copy(&mut (&mut conn).take(rest), &mut tokio::io::sink()).await {
        Ok(n) if n == rest => {}
        _ => return,
    }
    let message = "this server requires mutual TLS and the client has no certificate (give it a TLS \
                   directory: --tls DIR or CAIRN_TLS; cairn up keeps them in DATA/tls)";
    let mut frame = vec![0; HEADER];
    frame.extend_from_slice(message.as_bytes());
    let len = frame.len() - HEADER;
    if write_header(&mut frame, len, 0, &[STATUS_ERROR, ErrorKind::PermissionDenied.index()], 0).is_ok() {
        let _ = write_frame(&mut conn, &frame, &[]).await;
    }
}

/// The first bytes of an HTTP/2 connection (a gRPC client's).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a new connection opened with.
#[derive(Debug, PartialEq, Eq)]
enum Hello {
    /// A TLS handshake record.
    Tls,
    /// [`MAGIC`]: the wire protocol.
    Wire,
    /// The whole HTTP/2 preface: gRPC.
    Grpc,
    /// Neither.
    Other,
}

/// Tell a connection's protocol from its first bytes, without taking them: decided as soon as
/// they can only be one or neither, so a gRPC client (which writes its preface at once) is
/// never kept waiting. A connection whose first bytes are neither protocol's is not handed to
/// anyone (nor kept open waiting for more). (The caller bounds how long this may take.)
async fn hello(conn: &TcpStream) -> std::io::Result<Hello> {
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut pause = Duration::from_millis(1);
    loop {
        let n = conn.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let seen = &buf[..n];
        if seen[0] == TLS_HANDSHAKE {
            return Ok(Hello::Tls);
        }
        let wire = seen[..n.min(MAGIC.len())] == MAGIC[..n.min(MAGIC.len())];
        let grpc = H2_PREFACE.starts_with(seen);
        if wire && n >= MAGIC.len() {
            return Ok(Hello::Wire);
        }
        if grpc && n == H2_PREFACE.len() {
            return Ok(Hello::Grpc);
        }
        if !wire && !grpc {
            return Ok(Hello::Other);
        }
        // A beginning of one of them so far: wait for the rest (peek does not consume, so
        // poll, less often the longer it takes).
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

async fn serve_connection(
    mut conn: ServerConn,
    peer: Peer,
    handler: Arc<dyn Handler>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    limits: &Limits,
) {
    loop {
        // Between requests: idle at most `limits.idle`.
        let mut header = [0u8; HEADER];
        let started = tokio::select! {
            r = tokio::time::timeout(limits.idle, conn.read_exact(&mut header)) => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let Ok(Ok(_)) = started else { return };
        let Ok((body_len, bulk_len)) = frame_lengths(&header) else { return };
        let method = u16::from_le_bytes([header[8], header[9]]);
        // The rest of the request within `limits.transfer`; bulk bytes only for a method that
        // takes them (others are read past, unkept, and answered with an error).
        let keep_bulk = handler.accepts_bulk(method);
        let received = tokio::time::timeout(limits.transfer, async {
            let kept = if keep_bulk { body_len + bulk_len } else { body_len };
            let mut body = read_exact_bytes(&mut conn, kept).await?.freeze();
            let bulk = body.split_off(body_len);
            if !keep_bulk && bulk_len > 0 {
                let skipped =
                    tokio::io::copy(&mut (&mut conn).take(bulk_len as u64), &mut tokio::io::sink()).await?;
                if skipped < bulk_len as u64 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            Ok::<_, std::io::Error>((body, bulk))
        })
        .await;
        let Ok(Ok((body, bulk))) = received else { return };
        let started = Instant::now();
        let answer = match handler.method_name(method) {
            Some(name) if !crate::auth::allowed(handler.service(), name, &peer) => {
                Err(crate::auth::denied(handler.service(), name, &peer))
            }
            Some(_) if bulk_len > 0 && !keep_bulk => {
                Err(CairnError::invalid("a bulk part for a message that has none"))
            }
            Some(_) => handler.answer(method, body, bulk, &peer).await,
            None => Err(CairnError::new(
                ErrorKind::NotSupported,
                format!("{} service has no method {method}", handler.service()),
            )),
        };
        let name = handler.method_name(method).unwrap_or("unknown");
        let code = match &answer {
            Ok(_) => tonic::Code::Ok,
            Err(e) => e.kind().grpc_code(),
        };
        crate::metrics::record_wire_rpc(handler.service(), name, code, started.elapsed());
        let (mut head, bulk, status, kind) = match answer {
            Ok((frame, bulk)) => (frame, bulk, STATUS_OK, 0),
            Err(e) => {
                let mut frame = vec![0; HEADER];
                frame.extend_from_slice(e.message().as_bytes());
                (frame, Bytes::new(), STATUS_ERROR, e.kind().index())
            }
        };
        let body_len = head.len() - HEADER;
        if write_header(&mut head, body_len, bulk.len(), &[status, kind], 0).is_err() {
            return;
        }
        // A peer that does not take its reply within `limits.transfer` is cut off.
        match tokio::time::timeout(limits.transfer, write_frame(&mut conn, &head, &bulk)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}
