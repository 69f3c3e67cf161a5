//! Mutual TLS for every connection (see `docs/ARCHITECTURE.md`, "Authentication"): the cluster
//! CA and the certificates `cairn cert` issues, the process's identity (its TLS directory),
//! the client and server halves of a handshake, and the roles a peer's certificate grants.
//!
//! A process has one identity, installed at start ([`install`]) and re-read on `SIGHUP` or
//! when its files change ([`watch`]); every connection maker and every server takes it from
//! here, so a rotated certificate is used by the next connection without a restart. Nothing
//! installed means plaintext, which the binaries only allow when asked explicitly.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use cairn_common::{CairnError, ErrorKind, Result};

/// ALPN protocol of the wire protocol inside TLS (gRPC is `h2`).
pub const ALPN_WIRE: &[u8] = b"cairn-wire/1";
/// ALPN protocol of gRPC.
pub const ALPN_H2: &[u8] = b"h2";
/// Where servers, mounts and admin commands look for their TLS directory by default.
pub use cairn_common::config::DEFAULT_TLS_DIR as DEFAULT_DIR;
/// The CA certificate, in the CA's directory and in every TLS directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key: only in the CA's directory.
pub const CA_KEY: &str = "ca.key";
/// This process's certificate.
pub const CERT: &str = "cert.pem";
/// This process's private key.
pub const KEY: &str = "key.pem";
/// Common name of a cluster CA.
const CA_NAME: &str = "Cairn cluster CA";

/// What a certificate allows its holder to do, written in it as the DNS name `<role>.cairn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Meta,
    Chunk,
    Client,
    Admin,
    /// May scrape metrics served over TLS (`https://` in `metrics_listen`), and nothing else.
    Monitor,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Meta, Role::Chunk, Role::Client, Role::Admin, Role::Monitor];

    pub fn name(self) -> &'static str {
        match self {
            Role::Meta => "meta",
            Role::Chunk => "chunk",
            Role::Client => "client",
            Role::Admin => "admin",
            Role::Monitor => "monitor",
        }
    }

    /// The DNS name that carries the role in a certificate, and the server name a client
    /// asks for when it connects to a server of this role.
    pub fn dns_name(self) -> &'static str {
        match self {
            Role::Meta => "meta.cairn",
            Role::Chunk => "chunk.cairn",
            Role::Client => "client.cairn",
            Role::Admin => "admin.cairn",
            Role::Monitor => "monitor.cairn",
        }
    }

    pub fn parse(s: &str) -> Result<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s).ok_or_else(|| {
            CairnError::invalid(format!("role {s:?}: expected one of meta, chunk, client, admin, monitor"))
        })
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of roles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Roles(u8);

impl Roles {
    /// Every role: what a peer has on a plaintext server (which checks nothing).
    pub const ALL: Roles = Roles(0b11111);
    pub const NONE: Roles = Roles(0);

    pub fn of(roles: &[Role]) -> Roles {
        Roles(roles.iter().fold(0, |bits, r| bits | r.bit()))
    }
    pub fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }
    /// Whether any role of `self` is also in `other`.
    pub fn intersects(self, other: Roles) -> bool {
        self.0 & other.0 != 0
    }
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter().map(Role::name).collect();
        f.write_str(&names.join(","))
    }
}

/// Who is on the other end of a server's connection: put in every request's extensions (both
/// transports), read by the authorization check and by anything that logs a caller.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// The roles its certificate grants; [`Roles::ALL`] on a plaintext server.
    pub roles: Roles,
    /// Its certificate's common name; empty on a plaintext server.
    pub name: String,
}

impl Peer {
    pub fn plaintext(addr: Option<SocketAddr>) -> Peer {
        Peer { addr, roles: Roles::ALL, name: String::new() }
    }
}

/// What one certificate says, as `cairn cert show` and `cairn status` print it.
#[derive(Clone, Debug)]
pub struct CertInfo {
    pub name: String,
    pub roles: Roles,
    /// Every DNS name and IP address it holds, roles included.
    pub alt_names: Vec<String>,
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
}

impl CertInfo {
    /// Parse a DER certificate.
    pub fn parse(der: &[u8]) -> Result<CertInfo> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| CairnError::invalid(format!("not a certificate: {e}")))?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut alt_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => alt_names.push(d.to_string()),
                    x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                        4 => alt_names.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string()),
                        16 => alt_names.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap()).to_string()),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        let roles = Roles::of(
            &Role::ALL
                .into_iter()
                .filter(|r| alt_names.iter().any(|n| n == r.dns_name()))
                .collect::<Vec<_>>(),
        );
        let validity = cert.validity();
        Ok(CertInfo {
            name,
            roles,
            alt_names,
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        })
    }

    /// Seconds until it expires (negative once it has).
    pub fn expires_in(&self) -> i64 {
        self.not_after - cairn_common::time::unix_secs()
    }
}

/// A process's TLS identity: its certificate and key, the CA it trusts, and the rustls
/// configurations made from them.
pub struct Identity {
    pub dir: PathBuf,
    pub cert: CertInfo,
    pub ca: CertInfo,
    server: Arc<rustls::ServerConfig>,
    /// The same, for scrapes of metrics served over TLS (HTTP/1.1).
    metrics: Arc<rustls::ServerConfig>,
    client_wire: Arc<rustls::ClientConfig>,
    client_h2: Arc<rustls::ClientConfig>,
    /// What the files held when read, to tell a changed directory from an unchanged one.
    stamp: Vec<(PathBuf, Option<SystemTime>, u64)>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("dir", &self.dir).field("cert", &self.cert).finish()
    }
}

/// The default `aws-lc-rs` provider with AES-128-GCM preferred: shard traffic is bulk, and on
/// CPUs with AES instructions 128-bit keys cost about a third less per byte than 256-bit ones
/// (`bench/tls.sh`).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

fn tls_error(what: &str, dir: &Path, e: impl fmt::Display) -> CairnError {
    CairnError::invalid(format!("TLS directory {}: {what}: {e}", dir.display()))
}

fn stamp(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    [CA_CERT, CERT, KEY]
        .iter()
        .map(|f| {
            let p = dir.join(f);
            let meta = std::fs::metadata(&p).ok();
            (p, meta.as_ref().and_then(|m| m.modified().ok()), meta.map_or(0, |m| m.len()))
        })
        .collect()
}

impl Identity {
    /// Read `dir`'s `ca.pem`, `cert.pem` and `key.pem`. Fails, naming the file and why, when
    /// one is missing or unreadable, when the key does not match the certificate, or when the
    /// certificate is not signed by the CA or has expired.
    pub fn load(dir: &Path) -> Result<Identity> {
        let stamp = stamp(dir);
        let read_certs = |file: &str| -> Result<Vec<CertificateDer<'static>>> {
            let path = dir.join(file);
            let certs = CertificateDer::pem_file_iter(&path)
                .map_err(|e| tls_error(file, dir, e))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| tls_error(file, dir, e))?;
            if certs.is_empty() {
                return Err(tls_error(file, dir, "no certificate in it"));
            }
            Ok(certs)
        };
        let ca_certs = read_certs(CA_CERT)?;
        let chain = read_certs(CERT)?;
        let key = PrivateKeyDer::from_pem_file(dir.join(KEY)).map_err(|e| tls_error(KEY, dir, e))?;
        let ca = CertInfo::parse(&ca_certs[0])?;
        let cert = CertInfo::parse(&chain[0])?;
        if cert.roles == Roles::NONE {
            return Err(tls_error(
                CERT,
                dir,
                "the certificate holds no Cairn role (meta.cairn, chunk.cairn, client.cairn, admin.cairn or monitor.cairn)",
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in &ca_certs {
            roots.add(c.clone()).map_err(|e| tls_error(CA_CERT, dir, e))?;
        }
        let roots = Arc::new(roots);

        // Check the chain now, so a certificate of another CA (or an expired one) is reported
        // at start, not as every peer refusing the handshake.
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| tls_error(CA_CERT, dir, e))?;
        let now = rustls::pki_types::UnixTime::now();
        verifier
            .verify_client_cert(&chain[0], &chain[1..], now)
            .map_err(|e| tls_error(CERT, dir, format!("not valid under the CA in {CA_CERT}: {e}")))?;

        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_error("server config", dir, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| tls_error(KEY, dir, e))?;
        server.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_WIRE.to_vec()];
        // No tickets and no resumption: an idle pooled connection must have nothing to read,
        // and every connection proves its certificate afresh.
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let mut metrics = server.clone();
        metrics.alpn_protocols = vec![b"http/1.1".to_vec()];

        let client = |alpn: &[u8]| -> Result<Arc<rustls::ClientConfig>> {
            let mut c = rustls::ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| tls_error("client config", dir, e))?
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| tls_error(KEY, dir, e))?;
            c.alpn_protocols = vec![alpn.to_vec()];
            c.resumption = rustls::client::Resumption::disabled();
            Ok(Arc::new(c))
        };
        Ok(Identity {
            dir: dir.to_path_buf(),
            cert,
            ca,
            server: Arc::new(server),
            metrics: Arc::new(metrics),
            client_wire: client(ALPN_WIRE)?,
            client_h2: client(ALPN_H2)?,
            stamp,
        })
    }
}

/// The process's identity: `None` until [`install`]ed, and for a plaintext process.
static CURRENT: RwLock<Option<Arc<Identity>>> = RwLock::new(None);

/// Make `identity` the process's (`None`: plaintext).
pub fn install(identity: Option<Identity>) {
    *CURRENT.write().unwrap_or_else(|e| e.into_inner()) = identity.map(Arc::new);
}

/// The process's identity, if it has one.
pub fn identity() -> Option<Arc<Identity>> {
    CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Where a process's TLS identity comes from, as its config or command line says.
pub use cairn_common::config::TlsSource as Source;

/// Install the identity `source` names. A server or mount (`announce`) logs which, plaintext
/// as a warning; an admin command says nothing. `what` names the process in the log
/// ("metaserver", "mount").
pub fn install_from(source: &Source, what: &str, announce: bool) -> Result<()> {
    match source {
        Source::Plaintext => {
            if announce {
                tracing::warn!(
                    "{what}: PLAINTEXT, no TLS: connections are neither authenticated nor encrypted; anyone \
                 who reaches this process's ports can do anything (plaintext was asked for explicitly)"
                );
            }
            install(None);
        }
        Source::Dir(dir) => {
            let id = Identity::load(dir).map_err(|e| {
                CairnError::new(
                    e.kind(),
                    format!(
                        "{}; make one with `cairn cert issue` (cairn up keeps them in DATA/tls), or run \
                         without authentication with the explicit plaintext option",
                        e.message()
                    ),
                )
            })?;
            if announce {
                tracing::info!(
                    "{what}: mutual TLS as {:?} (roles {}), certificate expires in {} days",
                    id.cert.name,
                    id.cert.roles,
                    id.cert.expires_in() / 86_400
                );
            }
            install(Some(id));
        }
    }
    Ok(())
}

/// Re-read the installed identity's directory if its files changed (`force`: even if not).
/// A directory that does not load (a half-written rotation) keeps the old identity and says so.
pub fn reload(force: bool) -> Result<bool> {
    reload_in(&CURRENT, force)
}

/// [`reload`] of the identity in `slot`.
fn reload_in(slot: &RwLock<Option<Arc<Identity>>>, force: bool) -> Result<bool> {
    let Some(current) = slot.read().unwrap_or_else(|e| e.into_inner()).clone() else { return Ok(false) };
    if !force && stamp(&current.dir) == current.stamp {
        return Ok(false);
    }
    let fresh = Identity::load(&current.dir)?;
    tracing::info!(
        "TLS identity reloaded from {}: {:?} (roles {}), expires in {} days",
        fresh.dir.display(),
        fresh.cert.name,
        fresh.cert.roles,
        fresh.cert.expires_in() / 86_400
    );
    *slot.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(fresh));
    Ok(true)
}

/// Re-read the identity on `SIGHUP` and whenever its files change (checked every minute), for
/// certificate rotation without a restart. Call once; it runs on a thread of its own. A
/// plaintext process gets it too, so that SIGHUP (`systemctl reload`) never ends a process.
pub fn watch() {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!("no TLS reloads (no runtime for them): {e}");
            return;
        }
    };
    let watching =
        std::thread::Builder::new().name("tls-reload".into()).spawn(move || runtime.block_on(reload_loop()));
    if let Err(e) = watching {
        tracing::warn!("no TLS reloads (no thread for them): {e}");
    }
}

async fn reload_loop() {
    {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("no SIGHUP handler for TLS reloads: {e}");
                None
            }
        };
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.tick().await;
        // (After the process has installed its metrics recorder.)
        tokio::time::sleep(Duration::from_secs(2)).await;
        loop {
            record_expiry();
            let force = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
            };
            if force && identity().is_none() {
                tracing::info!("SIGHUP: no TLS identity to reload (plaintext)");
            }
            if let Err(e) = reload(force) {
                tracing::warn!("TLS identity not reloaded (the old one stays in use): {e}");
            }
        }
    }
}

/// The installed certificate's and CA's expiry, as gauges Prometheus alerts on.
fn record_expiry() {
    if let Some(id) = identity() {
        metrics::gauge!(crate::metrics::CERT_EXPIRY, "which" => "cert").set(id.cert.not_after as f64);
        metrics::gauge!(crate::metrics::CERT_EXPIRY, "which" => "ca").set(id.ca.not_after as f64);
    }
}

/// A client-side TLS connection.
pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;
/// A server-side TLS connection.
pub type ServerStream = tokio_rustls::server::TlsStream<TcpStream>;

/// Which protocol a client speaks inside TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    Wire,
    Grpc,
}

/// Run the client half of a handshake on `tcp` with `identity`, checking that the server holds
/// `role`. The error says what failed (the server's certificate, or ours refused).
pub async fn connect(
    tcp: TcpStream,
    identity: &Identity,
    role: Role,
    alpn: Alpn,
) -> std::io::Result<ClientStream> {
    let config = match alpn {
        Alpn::Wire => identity.client_wire.clone(),
        Alpn::Grpc => identity.client_h2.clone(),
    };
    let name = ServerName::try_from(role.dns_name()).expect("role names are DNS names");
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| {
        // A certificate either side refused is no passing failure: say so, not "unreachable".
        let kind = if is_tls_refusal(&e) { std::io::ErrorKind::PermissionDenied } else { e.kind() };
        std::io::Error::new(kind, format!("TLS handshake (expecting a {} server): {e}", role.name()))
    })
}

/// Whether an I/O error is TLS refusing a certificate or the peer's alert (its refusal of
/// ours: with TLS 1.3 a client learns that only at its first read after the handshake).
pub fn is_tls_refusal(e: &std::io::Error) -> bool {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).is_some_and(|e| {
        matches!(
            e,
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::AlertReceived(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::InvalidCertRevocationList(_)
        )
    })
}

/// Run the server half of a handshake: the connection, the protocol its client chose and who
/// the client is.
pub async fn accept(tcp: TcpStream, identity: &Identity) -> std::io::Result<(ServerStream, Alpn, Peer)> {
    let addr = tcp.peer_addr().ok();
    let stream = tokio_rustls::TlsAcceptor::from(identity.server.clone()).accept(tcp).await?;
    let (_, session) = stream.get_ref();
    let alpn = match session.alpn_protocol() {
        Some(p) if p == ALPN_WIRE => Alpn::Wire,
        Some(p) if p == ALPN_H2 => Alpn::Grpc,
        _ => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "no ALPN protocol agreed")),
    };
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no client certificate"))?;
    let info = CertInfo::parse(leaf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    Ok((stream, alpn, Peer { addr, roles: info.roles, name: info.name }))
}

/// Accept a metrics scrape over TLS: the peer must show a certificate of the cluster CA (its
/// roles are returned; the caller decides whether they may scrape).
pub async fn accept_metrics(tcp: TcpStream, identity: &Identity) -> std::io::Result<(ServerStream, Peer)> {
    let addr = tcp.peer_addr().ok();
    let stream = tokio_rustls::TlsAcceptor::from(identity.metrics.clone()).accept(tcp).await?;
    let leaf =
        stream.get_ref().1.peer_certificates().and_then(|c| c.first()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no client certificate")
        })?;
    let info = CertInfo::parse(leaf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    Ok((stream, Peer { addr, roles: info.roles, name: info.name }))
}

/// What a new certificate is for.
#[derive(Clone, Debug)]
pub struct Subject {
    pub name: String,
    pub roles: Vec<Role>,
    /// Extra DNS names and IP addresses.
    pub alt_names: Vec<String>,
    pub days: u32,
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| CairnError::from_io(&format!("write {}", tmp.display()), &e))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| CairnError::from_io(&format!("write {}", tmp.display()), &e))?;
    std::fs::rename(&tmp, path).map_err(|e| CairnError::from_io(&format!("rename to {}", path.display()), &e))
}

fn write_public(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| CairnError::from_io(&format!("write {}", path.display()), &e))
}

fn validity(params: &mut rcgen::CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A little slack for clocks a few minutes apart.
    params.not_before = now - time::Duration::minutes(10);
    params.not_after = now + time::Duration::days(days.into());
}

fn serial(params: &mut rcgen::CertificateParams) {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&bytes));
}

fn rcgen_error(what: &str) -> impl Fn(rcgen::Error) -> CairnError + '_ {
    move |e| CairnError::internal(format!("{what}: {e}"))
}

/// Make a cluster CA in `dir` (`ca.pem`, and `ca.key` readable by its owner only). Refuses to
/// replace an existing one: every certificate of the cluster hangs on it.
pub fn make_ca(dir: &Path, days: u32) -> Result<CertInfo> {
    if dir.join(CA_KEY).exists() || dir.join(CA_CERT).exists() {
        return Err(CairnError::new(
            ErrorKind::Exists,
            format!("{} already holds a CA; every certificate of its cluster depends on it", dir.display()),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CairnError::from_io(&format!("create {}", dir.display()), &e))?;
    let key = rcgen::KeyPair::generate().map_err(rcgen_error("generate the CA key"))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("CA"))?;
    params.distinguished_name.push(rcgen::DnType::CommonName, CA_NAME);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    serial(&mut params);
    let cert = params.self_signed(&key).map_err(rcgen_error("sign the CA"))?;
    write_private(&dir.join(CA_KEY), &key.serialize_pem())?;
    write_public(&dir.join(CA_CERT), &cert.pem())?;
    CertInfo::parse(cert.der())
}

/// Issue a certificate for `subject` with the CA in `ca_dir`, into the TLS directory `out`
/// (`ca.pem`, `cert.pem`, `key.pem`; replaced if there, which is how a certificate is
/// rotated: the key is written before the certificate, and a process that reads them between
/// the two keeps its old identity until the next reload).
pub fn issue(ca_dir: &Path, out: &Path, subject: &Subject) -> Result<CertInfo> {
    if subject.roles.is_empty() {
        return Err(CairnError::invalid("a certificate needs at least one role"));
    }
    if subject.name.is_empty() || subject.name.len() > 64 {
        return Err(CairnError::invalid("a certificate's name is 1 to 64 characters"));
    }
    if let Some(n) =
        subject.alt_names.iter().find(|n| Role::ALL.iter().any(|r| n.eq_ignore_ascii_case(r.dns_name())))
    {
        return Err(CairnError::invalid(format!("{n:?} is a role, not a name: give roles with --role")));
    }
    let read = |f: &str| {
        std::fs::read_to_string(ca_dir.join(f))
            .map_err(|e| CairnError::from_io(&format!("read {}", ca_dir.join(f).display()), &e))
    };
    let (ca_pem, ca_key) = (read(CA_CERT)?, read(CA_KEY)?);
    let ca_key = rcgen::KeyPair::from_pem(&ca_key).map_err(rcgen_error("the CA key"))?;
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(rcgen_error("the CA certificate"))?;

    let mut sans: Vec<rcgen::SanType> = Vec::new();
    for role in &subject.roles {
        sans.push(rcgen::SanType::DnsName(role.dns_name().try_into().map_err(rcgen_error("role name"))?));
    }
    for n in &subject.alt_names {
        match n.parse::<IpAddr>() {
            Ok(ip) => sans.push(rcgen::SanType::IpAddress(ip)),
            Err(_) => sans.push(rcgen::SanType::DnsName(
                n.as_str().try_into().map_err(|e| CairnError::invalid(format!("name {n:?}: {e}")))?,
            )),
        }
    }
    let key = rcgen::KeyPair::generate().map_err(rcgen_error("generate a key"))?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("certificate"))?;
    params.distinguished_name.push(rcgen::DnType::CommonName, subject.name.as_str());
    params.subject_alt_names = sans;
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, subject.days);
    serial(&mut params);
    let cert = params.signed_by(&key, &issuer).map_err(rcgen_error("sign the certificate"))?;
    std::fs::create_dir_all(out)
        .map_err(|e| CairnError::from_io(&format!("create {}", out.display()), &e))?;
    write_public(&out.join(CA_CERT), &ca_pem)?;
    write_private(&out.join(KEY), &key.serialize_pem())?;
    write_public(&out.join(CERT), &cert.pem())?;
    CertInfo::parse(cert.der())
}

/// The certificate in a TLS directory (or a CA directory's CA certificate).
pub fn describe(dir: &Path) -> Result<CertInfo> {
    let file = if dir.join(CERT).exists() { CERT } else { CA_CERT };
    let der = CertificateDer::from_pem_file(dir.join(file)).map_err(|e| tls_error(file, dir, e))?;
    CertInfo::parse(&der)
}

/// Seconds since the epoch as a date, `YYYY-MM-DD HH:MM UTC`.
pub fn format_time(secs: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    let dt = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute()
    )
}

#[cfg(test)]
mod tests;
