//! How a process opens a connection to a server: TCP, then, when the process has a TLS
//! identity ([`crate::tls`]), the client half of a mutual-TLS handshake that checks the server
//! holds the role the caller expects. Used by the wire protocol's pool and, through
//! [`grpc_channel`], by every gRPC channel, so no connection is made any other way.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

use crate::tls::{self, Alpn, Role};
use cairn_common::{CairnError, Result};

/// A TCP connection, in TLS or not (`T`: the client's or the server's TLS stream).
pub enum Stream<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

/// A client's connection.
pub type ClientConn = Stream<tls::ClientStream>;
/// A server's connection.
pub type ServerConn = Stream<tls::ServerStream>;

impl ClientConn {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl ServerConn {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stream<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stream<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Connect to `addr` (`host:port`), expecting a server of `role`, speaking `alpn` inside TLS;
/// TLS when this process has an identity, plain TCP when it is a plaintext process. TCP
/// connect and handshake together get `timeout`.
pub async fn open(addr: &str, role: Role, alpn: Alpn, timeout: Duration) -> std::io::Result<ClientConn> {
    let connecting = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        match tls::identity() {
            Some(identity) => Ok(Stream::Tls(Box::new(tls::connect(tcp, &identity, role, alpn).await?))),
            None => Ok(Stream::Plain(tcp)),
        }
    };
    tokio::time::timeout(timeout, connecting).await.map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no connection within {timeout:?}"))
    })?
}

/// A gRPC channel to `addr`, expecting a server of `role`: connects lazily (and again after a
/// loss) through [`open`], so it is TLS exactly when the process's wire connections are.
pub fn grpc_channel(addr: &str, role: Role, connect_timeout: Duration, timeout: Duration) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| CairnError::invalid(format!("address {addr:?}: {e}")))?
        .connect_timeout(connect_timeout)
        .timeout(timeout);
    Ok(endpoint.connect_with_connector_lazy(Connector { role, timeout: connect_timeout }))
}

/// The connector of [`grpc_channel`]: opens a connection to the URI's authority.
#[derive(Clone)]
struct Connector {
    role: Role,
    timeout: Duration,
}

impl tower_service::Service<Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<ClientConn>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (role, timeout) = (self.role, self.timeout);
        Box::pin(async move {
            let addr = uri
                .authority()
                .ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no address in {uri}"))
                })?
                .to_string();
            Ok(hyper_util::rt::TokioIo::new(open(&addr, role, Alpn::Grpc, timeout).await?))
        })
    }
}
