//! Prometheus metrics shared by every process: the exporter (`/metrics` over HTTP) and the gRPC
//! layer that counts and times every request a server answers (the wire protocol records the
//! same metrics through [`record_wire_rpc`]). Each crate names its own
//! metrics in its `metrics.rs`; every name starts with `cairn_` (see `docs/metrics.md`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusBuilder;

use cairn_common::{CairnError, Result};

/// Requests answered, by `service`, `method`, `code` (the gRPC status name) and `transport`
/// (`grpc` or `wire`) (counter).
pub const RPC_REQUESTS: &str = "cairn_rpc_requests_total";
/// Time to answer a gRPC request, by `service` and `method` (histogram, seconds).
pub const RPC_SECONDS: &str = "cairn_rpc_request_seconds";

/// Connections a server closed as soon as it accepted them, by `service` and `limit` (`total`:
/// the server had as many open as it allows; `peer`: that address had) (counter).
pub const CONNECTIONS_REFUSED: &str = "cairn_rpc_connections_refused_total";
/// When this process's TLS certificate (`which="cert"`) and its cluster CA (`which="ca"`)
/// expire, seconds since the epoch (gauge; absent on a plaintext process).
pub const CERT_EXPIRY: &str = "cairn_tls_certificate_expiry_timestamp_seconds";
/// Calls refused because the caller's certificate lacks the role the method needs, by
/// `service` and `method` (counter).
pub const RPC_DENIED: &str = "cairn_rpc_denied_total";
/// Connections closed before a request because they did not authenticate, by `service` and
/// `reason` (`handshake`: no certificate, another CA's, or a failed TLS handshake; `plaintext`:
/// no TLS on a TLS server; `tls`: TLS on a plaintext server) (counter).
pub const UNAUTHENTICATED: &str = "cairn_rpc_connections_unauthenticated_total";
/// Shard reads, writes and deletes a chunkserver refused for their capability, by `reason`
/// (`missing`, `unknown_key`, `bad_mac`, `expired`, `wrong_inode`, `wrong_operation`,
/// `wrong_holder`) (counter).
pub const CAPABILITY_REFUSED: &str = "cairn_chunk_capability_refused_total";

/// Latency buckets, seconds: 50 µs to 30 s.
const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Serve every metric of this process at `http://LISTEN/metrics` (Prometheus text format), or
/// with `https://ADDR`, over TLS with this process's certificate to callers whose certificate
/// of the cluster CA has the `monitor` or `admin` role (others get 403, callers without one
/// fail the handshake). Must run inside a tokio runtime (the listener is a task on it).
pub fn serve(listen: &str) -> Result<SocketAddr> {
    let (tls, addr) = match listen.strip_prefix("https://") {
        Some(addr) => (true, addr),
        None => (false, listen.strip_prefix("http://").unwrap_or(listen)),
    };
    let addr: SocketAddr =
        addr.parse().map_err(|e| CairnError::invalid(format!("metrics listen address {listen:?}: {e}")))?;
    // Bind first, so a taken port is a clear error here and port 0 can be reported.
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| CairnError::from_io(&format!("cannot serve metrics on {listen}"), &e))?;
    let bound = listener.local_addr().map_err(|e| CairnError::from_io("metrics address", &e))?;
    let builder = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .map_err(|e| CairnError::internal(format!("metrics buckets: {e}")))?;
    if !tls {
        drop(listener);
        builder
            .with_http_listener(bound)
            .install()
            .map_err(|e| CairnError::io(format!("cannot serve metrics on {bound}: {e}")))?;
        tracing::info!(addr = %bound, "serving Prometheus metrics at /metrics");
        return Ok(bound);
    }
    if crate::tls::identity().is_none() {
        return Err(CairnError::invalid(format!(
            "metrics on {listen}: serving them over TLS needs this process's certificate, and it runs plaintext"
        )));
    }
    let handle = builder
        .install_recorder()
        .map_err(|e| CairnError::io(format!("cannot serve metrics on {bound}: {e}")))?;
    listener.set_nonblocking(true).map_err(|e| CairnError::from_io("metrics listener", &e))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| CairnError::from_io("metrics listener", &e))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    // A scraper needs one connection at a time: a few dozen at once are plenty, and whoever
    // opens more (handshakes cost CPU) has the excess closed at once.
    let scrapes = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    tokio::spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(_) => {
                    // Out of descriptors, say: wait rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = scrapes.clone().try_acquire_owned() else { continue };
            let handle = handle.clone();
            tokio::spawn(async move {
                let scrape = scrape_over_tls(conn, &handle);
                let _ = tokio::time::timeout(std::time::Duration::from_secs(30), scrape).await;
                drop(permit);
            });
        }
    });
    tracing::info!(addr = %bound, "serving Prometheus metrics at /metrics over TLS (monitor and admin certificates)");
    Ok(bound)
}

/// Scrapes over TLS served at once; connections beyond are closed as they are accepted.
const MAX_SCRAPES: usize = 32;

/// Answer one scrape over TLS: the request head (at most 8 KiB) is read, `GET /metrics` is
/// answered with the metrics to a monitor or admin certificate, and the connection closed.
async fn scrape_over_tls(
    conn: tokio::net::TcpStream,
    handle: &metrics_exporter_prometheus::PrometheusHandle,
) -> std::io::Result<()> {
    use crate::tls::Role;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The identity in force now: a rotated certificate is served from the next scrape on.
    let Some(identity) = crate::tls::identity() else { return Ok(()) };
    let (mut stream, peer) = crate::tls::accept_metrics(conn, &identity).await?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() + n > 8192 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let may = peer.roles.contains(Role::Monitor) || peer.roles.contains(Role::Admin);
    let (status, body) = if !may {
        (
            "403 Forbidden",
            format!(
                "certificate {:?} ({}) may not read metrics: monitor or admin only\n",
                peer.name, peer.roles
            ),
        )
    } else if method != b"GET" || path != b"/metrics" {
        ("404 Not Found", "GET /metrics\n".to_string())
    } else {
        ("200 OK", handle.render())
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Requests this process answered, leaving out [`BACKGROUND_METHODS`].
static FOREGROUND_REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Methods servers call on a timer, not on behalf of a user.
const BACKGROUND_METHODS: [&str; 5] = ["Heartbeat", "ClientHeartbeat", "ClusterStatus", "ListNodes", "Stat"];

/// Requests this process answered since start, heartbeats and status polls left out.
pub fn foreground_requests() -> u64 {
    FOREGROUND_REQUESTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A tower layer for a tonic server: counts and times every request by method and outcome.
#[derive(Clone, Copy)]
pub struct RpcMetricsLayer {
    service: &'static str,
}

impl RpcMetricsLayer {
    pub fn new(service: &'static str) -> RpcMetricsLayer {
        RpcMetricsLayer { service }
    }
}

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics { inner, service: self.service }
    }
}

#[derive(Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    service: &'static str,
}

type Http<B> = tonic::codegen::http::Request<B>;
type HttpReply<B> = tonic::codegen::http::Response<B>;

impl<S, B, RB> tower_service::Service<Http<B>> for RpcMetrics<S>
where
    S: tower_service::Service<Http<B>, Response = HttpReply<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Http<B>) -> Self::Future {
        let method = req.uri().path().rsplit('/').next().unwrap_or("").to_string();
        let service = self.service;
        let started = Instant::now();
        let future = self.inner.call(req);
        Box::pin(async move {
            let reply = future.await;
            // An error answer carries its status in the headers ("trailers only"); a success
            // carries it in the trailers, after the body.
            let code = match &reply {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or("Ok", |c| code_name(tonic::Code::from_i32(c))),
                Err(_) => "TransportError",
            };
            record(service, "grpc", method, code, started.elapsed());
            reply
        })
    }
}

/// Count a connection refused for being over a server's limits (see [`crate::server::Limits`]).
pub fn record_refused_connection(service: &'static str, limit: &'static str) {
    metrics::counter!(CONNECTIONS_REFUSED, "service" => service, "limit" => limit).increment(1);
}

/// Count one call refused for its caller's roles.
pub fn record_denied(service: &str, method: &str) {
    metrics::counter!(RPC_DENIED, "service" => service.to_string(), "method" => method.to_string())
        .increment(1);
}

/// Count one shard access refused for its capability.
pub fn record_capability_refused(reason: &'static str) {
    metrics::counter!(CAPABILITY_REFUSED, "reason" => reason).increment(1);
}

/// Count one connection closed because it did not authenticate.
pub fn record_unauthenticated(service: &'static str, reason: &'static str) {
    metrics::counter!(UNAUTHENTICATED, "service" => service, "reason" => reason).increment(1);
}

/// Count and time one request answered over the wire protocol, under the same names as gRPC's.
pub fn record_wire_rpc(
    service: &'static str,
    method: &'static str,
    code: tonic::Code,
    elapsed: std::time::Duration,
) {
    record(service, "wire", method.to_string(), code_name(code), elapsed);
}

fn record(
    service: &'static str,
    transport: &'static str,
    method: String,
    code: &'static str,
    elapsed: std::time::Duration,
) {
    if !BACKGROUND_METHODS.contains(&method.as_str()) {
        FOREGROUND_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    metrics::counter!(RPC_REQUESTS, "service" => service, "method" => method.clone(), "code" => code,
        "transport" => transport)
    .increment(1);
    metrics::histogram!(RPC_SECONDS, "service" => service, "method" => method).record(elapsed.as_secs_f64());
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "Ok",
        Cancelled => "Cancelled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}
