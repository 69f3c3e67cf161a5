//! Hostile peers on the servers' ports while a mount works: thousands of idle connections,
//! slowloris senders, oversized and truncated frames, garbage, silent connections, and more
//! connections from one address than a server admits. The servers stay up, refuse what is over
//! their limits, and go on serving the legitimate mount.

use super::*;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const MAGIC: &[u8; 8] = b"CAIRNW\x00\x01";

async fn connect_from(local: &str, to: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap_or_else(|e| panic!("connect to {to} from {local}: {e}"))
}

/// A frame header: body and bulk lengths, method.
fn header(body: u32, bulk: u32, method: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&body.to_le_bytes());
    h.extend_from_slice(&bulk.to_le_bytes());
    h.extend_from_slice(&method.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h
}

/// Whether the server closed `conn` within `within`.
async fn closed(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(within, conn.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
}

#[test]
fn hostile_connections_do_not_stop_the_servers_serving_a_mount() {
    // This test holds about 2,300 sockets, and the servers must be allowed their full limits
    // (4,096 connections, 1,024 per address): both need an open-file limit well above that.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_max < 4096 + 256 {
        eprintln!("skipped: the hard open-file limit is {} (needs 4,352)", lim.rlim_max);
        return;
    }
    lim.rlim_cur = lim.rlim_max;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let cluster = Cluster::start(6, "4+2", 64);
    let meta: std::net::SocketAddr = cluster.meta_addr.parse().unwrap();
    let chunk_node = cluster.nodes.iter().find(|n| n.role == "chunk").unwrap();
    let chunk: std::net::SocketAddr = chunk_node.addr.parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut held = Vec::new();
    let refused = rt.block_on(async {
        // From 127.0.0.2: 900 idle wire connections to the metaserver, every tenth a slowloris
        // (a header promising 64 MiB, 100 bytes, then nothing); 300 idle ones to a chunkserver.
        for i in 0..900 {
            let mut c = connect_from("127.0.0.2", meta).await;
            c.write_all(MAGIC).await.unwrap();
            if i % 10 == 0 {
                c.write_all(&header(0, 64 << 20, 1)).await.unwrap();
                c.write_all(&[1; 100]).await.unwrap();
            }
            held.push(c);
        }
        for _ in 0..300 {
            let mut c = connect_from("127.0.0.2", chunk).await;
            c.write_all(MAGIC).await.unwrap();
            held.push(c);
        }
        // Garbage: a header over the frame limit, a frame cut short, bytes of no protocol, a
        // connection that never says anything. Each is closed; none takes a server down.
        let mut oversized = connect_from("127.0.0.2", meta).await;
        oversized.write_all(MAGIC).await.unwrap();
        oversized.write_all(&header(u32::MAX, u32::MAX, 1)).await.unwrap();
        assert!(closed(&mut oversized, Duration::from_secs(5)).await, "an oversized frame is refused");
        let mut cut = connect_from("127.0.0.2", chunk).await;
        cut.write_all(MAGIC).await.unwrap();
        cut.write_all(&header(10, 0, 1)[..7]).await.unwrap();
        drop(cut);
        let mut garbage = connect_from("127.0.0.2", meta).await;
        garbage.write_all(b"GET / HTTP/1.1\r\n\r\n\x00\xff\x13").await.unwrap();
        assert!(closed(&mut garbage, Duration::from_secs(2)).await, "garbage is closed at once");
        let mut silent = connect_from("127.0.0.2", meta).await;
        let mut half_preface = connect_from("127.0.0.2", chunk).await;
        half_preface.write_all(b"PRI * HTTP/2.0").await.unwrap();
        assert!(closed(&mut silent, Duration::from_secs(20)).await, "a silent connection is closed");
        assert!(closed(&mut half_preface, Duration::from_secs(5)).await, "a stalled gRPC preface is closed");
        // From 127.0.0.3: more connections than one address may hold (1,024); the rest are
        // closed as soon as they are accepted.
        let mut over = Vec::new();
        for _ in 0..1100 {
            let mut c = connect_from("127.0.0.3", meta).await;
            let _ = c.write_all(MAGIC).await;
            over.push(c);
        }
        // (A refused one has its end of file waiting by now.)
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut refused = 0;
        for c in &mut over {
            if closed(c, Duration::from_millis(1)).await {
                refused += 1;
            }
        }
        held.extend(over);
        refused
    });
    assert_eq!(refused, 1100 - 1024, "connections over the per-address limit are closed, the others kept");

    // Meanwhile the mount works: write, read back, list, stat.
    let data = random_bytes(1_500_000, 1301);
    fs::write(cluster.mnt.join("through-the-storm"), &data).unwrap();
    assert_eq!(sha256(&fs::read(cluster.mnt.join("through-the-storm")).unwrap()), sha256(&data));
    for i in 0..50 {
        fs::write(cluster.mnt.join(format!("small-{i}")), format!("{i}")).unwrap();
    }
    let names: Vec<String> =
        fs::read_dir(&cluster.mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("small-")).count(), 50, "{names:?}");
    let out = cluster.cli(&["status"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // The servers counted what they refused.
    let meta_metrics =
        cluster.nodes.iter().find(|n| n.role == "meta").and_then(|n| n.metrics.clone()).unwrap();
    let text = support::scrape(&meta_metrics);
    let counted = support::metric(&text, "cairn_rpc_connections_refused_total", &["limit=\"peer\""]);
    assert_eq!(counted, Some(76.0), "{text}");
    drop(held);
    drop(rt);
    // Every server is still there.
    for node in &cluster.nodes {
        assert_eq!(unsafe { libc::kill(node.pid as i32, 0) }, 0, "{} {} exited", node.role, node.id);
    }
}

/// `cairn` as a caller with the TLS directory `tls` (`None`: plaintext), against `cluster`.
fn cairn_as(cluster: &Cluster, tls: Option<&Path>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(support::CAIRN);
    cmd.env("CAIRN_META", &cluster.meta_addr).env_remove("CAIRN_TLS").env_remove("CAIRN_PLAINTEXT");
    match tls {
        Some(dir) => cmd.arg("--tls").arg(dir),
        None => cmd.arg("--plaintext"),
    };
    let out = cmd.args(args).output().unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn callers_without_the_right_certificate_are_refused_and_counted() {
    let cluster = Cluster::start(6, "4+2", 64);
    fs::write(cluster.mnt.join("before"), b"kept").unwrap();
    let admin = cluster.tls("admin");
    let client = cluster.tls("client");

    // No certificate at all: told why, over either transport.
    let (ok, out) = cairn_as(&cluster, None, &["status"]);
    assert!(!ok && out.contains("requires mutual TLS"), "{out}");
    let (ok, out) = cairn_as(&cluster, None, &["node", "list"]);
    assert!(!ok, "{out}");
    // A certificate of another cluster's CA: refused at the handshake.
    let other = tempfile::tempdir().unwrap();
    let ca = other.path().join("ca");
    let stranger = other.path().join("admin");
    let made = Command::new(support::CAIRN).args(["cert", "init"]).arg(&ca).output().unwrap();
    assert!(made.status.success(), "{made:?}");
    let made = Command::new(support::CAIRN)
        .args(["cert", "issue", "--role", "admin", "--name", "mallory", "--ca"])
        .arg(&ca)
        .arg(&stranger)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let (ok, out) = cairn_as(&cluster, Some(&stranger), &["status"]);
    assert!(!ok, "{out}");
    // A client's certificate: the namespace yes, the cluster's administration no.
    let (ok, out) = cairn_as(&cluster, Some(&client), &["node", "list"]);
    assert!(ok, "{out}");
    for args in [
        &["status"][..],
        &["node", "drain", "1"],
        &["node", "remove", "1", "--force"],
        &["fsck", "--repair"],
        &["layout", "set", "/", "--ec", "2+1"],
    ] {
        let (ok, out) = cairn_as(&cluster, Some(&client), args);
        // (fsck's check is also for metaservers: group 0's leader asks the other groups.)
        let refused =
            out.contains("is for admin certificates") || out.contains("is for meta,admin certificates");
        assert!(!ok && refused && out.contains("has the roles client"), "{args:?}: {out}");
    }
    // A client's certificate cannot register a chunkserver: one started with it never joins.
    let extra = cluster.root.path().join("impostor");
    fs::create_dir_all(&extra).unwrap();
    let config = extra.join("chunk.toml");
    fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nmeta = \"{}\"\nstate_dir = \"{dir}/state\"\nssd_dirs = [\"{dir}/ssd\"]\n\
             hdd_dirs = []\nheartbeat_ms = 200\ntls_dir = \"{}\"\n",
            cluster.meta_addr,
            client.display(),
            dir = extra.display(),
        ),
    )
    .unwrap();
    let log = fs::File::create(extra.join("chunk.log")).unwrap();
    let _impostor = KillOnDrop(Some(
        Command::new(support::CAIRN)
            .args(["chunk", "--config", config.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    ));
    let meta_metrics =
        cluster.nodes.iter().find(|n| n.role == "meta").and_then(|n| n.metrics.clone()).unwrap();
    eventually(30, "the impostor's registrations are refused", || {
        let text = support::scrape(&meta_metrics);
        support::metric(&text, "cairn_rpc_denied_total", &["method=\"RegisterChunk\""]).unwrap_or(0.0) >= 2.0
    });
    let (ok, out) = cairn_as(&cluster, Some(&admin), &["node", "list", "--json"]);
    assert!(ok, "{out}");
    let nodes: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(nodes.as_array().map(Vec::len), Some(6), "{nodes}");

    // Every refusal was counted, by kind.
    let text = support::scrape(&meta_metrics);
    let count = |name: &str, label: &str| support::metric(&text, name, &[label]).unwrap_or(0.0);
    assert!(count("cairn_rpc_connections_unauthenticated_total", "reason=\"plaintext\"") >= 2.0, "{text}");
    assert!(count("cairn_rpc_connections_unauthenticated_total", "reason=\"handshake\"") >= 1.0, "{text}");
    assert!(count("cairn_rpc_denied_total", "method=\"DrainNode\"") >= 1.0, "{text}");
    assert!(count("cairn_rpc_denied_total", "method=\"ClusterStatus\"") >= 1.0, "{text}");
    // Authenticated, then silent (no wire magic, no request): cut at the same deadline as a
    // silent plaintext connection (10 s), not kept.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use cairn_net::tls::{self, Alpn, Role};
        let id = tls::Identity::load(&client).unwrap();
        let tcp = TcpStream::connect(&cluster.meta_addr).await.unwrap();
        let mut conn = tls::connect(tcp, &id, Role::Meta, Alpn::Wire).await.unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a silent TLS connection was kept: {read:?}");
        assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    });

    // Nothing was changed, and the mount works on.
    let (ok, out) = cairn_as(&cluster, Some(&admin), &["status"]);
    assert!(ok && out.contains("HEALTH_OK"), "{out}");
    assert_eq!(fs::read(cluster.mnt.join("before")).unwrap(), b"kept");
    fs::write(cluster.mnt.join("after"), b"also").unwrap();
    assert_eq!(fs::read(cluster.mnt.join("after")).unwrap(), b"also");
}

/// A client certificate reaches shards only with a capability the metaserver signed for that
/// file and that certificate: none, another file's, a forged or widened one, another holder's,
/// and a delete of another file's shards are all refused and counted; the real one works.
#[test]
fn shard_access_needs_the_metaservers_capability_for_that_file() {
    use cairn_net::tls::{self, Role};
    use cairn_net::wire::{self, WireClient};
    use cairn_proto as p;

    let cluster = Cluster::start(6, "4+2", 64);
    let data = random_bytes(200_000, 17);
    fs::write(cluster.mnt.join("secret"), &data).unwrap();
    fs::write(cluster.mnt.join("mine"), b"a file the client may open").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(cluster.mnt.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let secret = fs::metadata(cluster.mnt.join("secret")).unwrap().ino();
    let mine = fs::metadata(cluster.mnt.join("mine")).unwrap().ino();
    // This test process acts as a client with the cluster's client certificate (nothing
    // else in this binary connects in-process).
    tls::install(Some(tls::Identity::load(&cluster.tls("client")).unwrap()));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let timeout = Duration::from_secs(10);
        let meta = WireClient::new(&cluster.meta_addr, Role::Meta, timeout, timeout);
        let chunks: Vec<WireClient> = cluster
            .nodes
            .iter()
            .filter(|n| n.role == "chunk")
            .map(|n| WireClient::new(&n.addr, Role::Chunk, timeout, timeout))
            .collect();
        let stripes =
            wire::meta::list_stripes(&meta, p::ListStripesRequest { ino: secret, from: 0, limit: 1 })
                .await
                .unwrap()
                .stripes;
        let shard = |ino| p::ShardId { ino, stripe: 0, index: 0, version: stripes[0].version };
        let read = |id: p::ShardId, cap: Option<p::Capability>| p::ReadShardRequest {
            id: Some(id),
            offset: 0,
            len: 0,
            cap,
            ..Default::default()
        };
        let refused = |r: cairn_common::Result<p::ReadShardReply>, why: &str| {
            let e = r.expect_err(why);
            assert_eq!(e.kind(), cairn_common::ErrorKind::CapabilityRefused, "{why}: {e}");
            assert!(e.message().contains(why), "{why}: {e}");
        };

        // No capability.
        refused(wire::chunk::read_shard(&chunks[0], read(shard(secret), None)).await, "no capability");
        // A capability for another file (one this client may open) does not open this one.
        let for_mine = wire::meta::grant_capability(&meta, as_root(mine)).await.unwrap();
        assert_eq!(for_mine.holder, "client");
        refused(
            wire::chunk::read_shard(&chunks[0], read(shard(secret), Some(for_mine.clone()))).await,
            "another inode",
        );
        // Rewritten to name this file, to another holder, or to last longer: the signature fails.
        for forge in [
            p::Capability { ino: secret, ..for_mine.clone() },
            p::Capability { holder: "admin".into(), ..for_mine.clone() },
            p::Capability { expires: for_mine.expires + 86_400, ..for_mine.clone() },
            p::Capability { mac: vec![0; 32], ..for_mine.clone() },
        ] {
            let id = shard(forge.ino);
            refused(wire::chunk::read_shard(&chunks[0], read(id, Some(forge))).await, "signature");
        }
        // A signature by a key no metaserver of this cluster has.
        let stranger = cairn_net::capability::Signer::new().grant(secret, 3, "client");
        refused(
            wire::chunk::read_shard(&chunks[0], read(shard(secret), Some(stranger))).await,
            "does not know",
        );
        // Writes and deletes: without a capability, or of another file's shards, refused.
        let write = wire::chunk::write_shard(
            &chunks[0],
            p::WriteShardRequest {
                id: Some(shard(secret)),
                data: b"evil".to_vec().into(),
                cap: None,
                buffered: false,
            },
        )
        .await
        .expect_err("a write without a capability");
        assert!(write.message().contains("no capability"), "{write}");
        let sync = wire::chunk::sync_shards(&chunks[0], p::SyncShardsRequest { ino: secret, cap: None })
            .await
            .expect_err("a shard sync without a capability");
        assert!(sync.message().contains("no capability"), "{sync}");
        let sync = wire::chunk::sync_shards(
            &chunks[0],
            p::SyncShardsRequest { ino: secret, cap: Some(for_mine.clone()) },
        )
        .await
        .expect_err("a shard sync of another file");
        assert!(sync.kind() == cairn_common::ErrorKind::CapabilityRefused, "{sync}");
        let delete = wire::chunk::delete_shards(
            &chunks[0],
            p::DeleteShardsRequest {
                ids: vec![shard(secret)],
                cap: Some(for_mine.clone()),
                ..Default::default()
            },
        )
        .await
        .expect_err("deleting another file's shards");
        assert!(delete.message().contains("another inode"), "{delete}");

        // Each request is checked as the user it names (a mount's own kernel checks first;
        // this client sends what it likes): uid 1000 may neither open root's private file nor
        // get a capability for it; it opens a world-readable one for reading only, with a
        // token that only reads; a request naming no user is refused.
        let session = wire::meta::register_client(&meta, p::Empty {}).await.unwrap().client_id;
        let alice = Some(p::Caller { uid: 1000, gid: 1000, groups: vec![] });
        let open = |ino, access| p::OpenRequest {
            ino,
            client_id: session,
            generation: 1,
            access,
            caller: alice.clone(),
        };
        let denied = |r: Result<(), cairn_common::CairnError>, what: &str| {
            let e = r.expect_err(what);
            assert_eq!(e.kind(), cairn_common::ErrorKind::PermissionDenied, "{what}: {e}");
        };
        denied(wire::meta::open(&meta, open(secret, 4)).await.map(|_| ()), "open of a private file");
        let renew = p::CapabilityRequest { ino: secret, access: 4, caller: alice.clone() };
        denied(wire::meta::grant_capability(&meta, renew).await.map(|_| ()), "its capability");
        denied(wire::meta::open(&meta, open(mine, 6)).await.map(|_| ()), "a write open of root's file");
        let reading = wire::meta::open(&meta, open(mine, 4)).await.unwrap().cap.unwrap();
        assert_eq!(reading.ops, cairn_net::capability::READ);
        let overwrite = p::WriteShardRequest {
            id: Some(shard(mine)),
            data: b"evil".to_vec().into(),
            cap: Some(reading),
            buffered: false,
        };
        let e = wire::chunk::write_shard(&chunks[0], overwrite).await.expect_err("a write with a read token");
        assert_eq!(e.kind(), cairn_common::ErrorKind::CapabilityRefused, "{e}");
        let nobody = p::LookupRequest { parent: 1, name: b"mine".to_vec(), caller: None };
        let e = wire::meta::lookup(&meta, nobody).await.expect_err("a lookup naming no user");
        assert!(e.message().contains("names no caller"), "{e}");

        // The capability the metaserver grants for the file itself reads its shard.
        let cap = wire::meta::grant_capability(&meta, as_root(secret)).await.unwrap();
        let mut found = 0;
        for c in &chunks {
            match wire::chunk::read_shard(c, read(shard(secret), Some(cap.clone()))).await {
                Ok(r) => {
                    assert!(!r.data.is_empty());
                    found += 1;
                }
                Err(e) => assert_eq!(e.kind(), cairn_common::ErrorKind::NotFound, "{e}"),
            }
        }
        assert_eq!(found, 1, "the one chunkserver holding shard 0 of stripe 0 serves it");

        // A client's damage report of a healthy shard is checked with its chunkserver and
        // marks nothing missing.
        let report = p::ReportDamagedRequest { ids: vec![shard(secret), shard(mine)], confirm: false };
        let reply = wire::meta::report_damaged(&meta, report).await.unwrap();
        assert!(reply.missing.is_empty(), "{reply:?}");
        let after = wire::meta::list_stripes(&meta, p::ListStripesRequest { ino: secret, from: 0, limit: 1 })
            .await
            .unwrap()
            .stripes;
        assert_eq!(after[0].missing, 0, "a healthy shard was marked missing on a client's word");
        let flood = p::ReportDamagedRequest { ids: vec![shard(secret); 257], confirm: false };
        assert!(wire::meta::report_damaged(&meta, flood).await.is_err(), "a client's report is bounded");
        // Real damage is confirmed and marked.
        let prefix = format!("{secret:016x}-{:012x}-00-", 0);
        let file = cluster
            .shard_files()
            .into_iter()
            .find(|f| f.file_name().unwrap().to_string_lossy().starts_with(&prefix))
            .expect("shard 0 of stripe 0 on disk");
        let mut bytes = fs::read(&file).unwrap();
        let at = bytes.len() - 10;
        bytes[at] ^= 0x01;
        fs::write(&file, bytes).unwrap();
        let reply = wire::meta::report_damaged(
            &meta,
            p::ReportDamagedRequest { ids: vec![shard(secret)], confirm: false },
        )
        .await
        .unwrap();
        assert_eq!(reply.missing, vec![shard(secret)], "a corrupt shard reported by a client is marked");
    });

    // Another client certificate cannot pose as the mount's client id: its renewals,
    // releases and locks under the mount's id are refused (the mount registered first in this
    // fresh cluster, so its id is among the first few).
    let intruder = client_cert(&cluster, "intruder");
    tls::install(Some(tls::Identity::load(&intruder).unwrap()));
    rt.block_on(async {
        let timeout = Duration::from_secs(10);
        let meta = WireClient::new(&cluster.meta_addr, Role::Meta, timeout, timeout);
        let mut refused = 0;
        for client_id in 1..=4 {
            let release = p::ReleaseRequest { client_id, ino: secret, generation: u64::MAX, more: vec![] };
            let lock = p::LockRequest {
                ino: secret,
                client_id,
                owner: 1,
                typ: 1,
                end: u64::MAX,
                ..Default::default()
            };
            let beat = p::ClientHeartbeatRequest { client_id, open: vec![] };
            let results = [
                wire::meta::release(&meta, release).await.err(),
                wire::meta::lock(&meta, lock).await.err(),
                wire::meta::client_heartbeat(&meta, beat).await.err(),
            ];
            if results
                .iter()
                .all(|e| e.as_ref().is_some_and(|e| e.message().contains("belongs to certificate")))
            {
                refused += 1;
            }
        }
        assert!(refused >= 1, "no client id of the mount's was refused to another certificate");
    });

    // Each refusal was counted on the chunkserver that refused it.
    let first = cluster.nodes.iter().find(|n| n.role == "chunk").and_then(|n| n.metrics.clone()).unwrap();
    let text = support::scrape(&first);
    let count = |reason: &str| {
        support::metric(&text, "cairn_chunk_capability_refused_total", &[&format!("reason=\"{reason}\"")])
            .unwrap_or(0.0)
    };
    assert!(count("missing") >= 2.0, "{text}");
    assert!(count("wrong_inode") >= 2.0, "{text}");
    assert!(count("bad_mac") >= 4.0, "{text}");
    assert!(count("unknown_key") >= 1.0, "{text}");
    assert!(count("wrong_operation") >= 1.0, "{text}");

    // The file reads back whole (the corrupt shard reconstructed); the mount writes on.
    assert_eq!(sha256(&fs::read(cluster.mnt.join("secret")).unwrap()), sha256(&data));
    fs::write(cluster.mnt.join("after"), b"also").unwrap();
    assert_eq!(fs::read(cluster.mnt.join("after")).unwrap(), b"also");
}

/// A renewal of the capability for `ino`, read and write, for root.
fn as_root(ino: u64) -> cairn_proto::CapabilityRequest {
    cairn_proto::CapabilityRequest { ino, access: 6, caller: Some(cairn_proto::Caller::default()) }
}

/// A client certificate `name` of `cluster`'s CA, in a TLS directory of its own.
fn client_cert(cluster: &Cluster, name: &str) -> PathBuf {
    certificate(cluster, "client", name)
}

/// A certificate `name` with `role` of `cluster`'s CA, in a TLS directory of its own.
fn certificate(cluster: &Cluster, role: &str, name: &str) -> PathBuf {
    let dir = cluster.root.path().join(format!("tls-{name}"));
    let made = Command::new(support::CAIRN)
        .args(["cert", "issue", "--role", role, "--name", name, "--ca"])
        .arg(cluster.tls("ca"))
        .arg(&dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    dir
}

/// The metrics addresses of `cluster`'s metaservers.
fn meta_metrics(cluster: &Cluster) -> Vec<String> {
    let metas: Vec<String> =
        cluster.nodes.iter().filter(|n| n.role == "meta").map(|n| n.metrics.clone().unwrap()).collect();
    assert!(!metas.is_empty());
    metas
}

/// Replace the cluster's access rules, SIGHUP every metaserver and wait until each has
/// reloaded (`rules` in force) or, with `None`, refused the file.
fn set_access_rules(cluster: &Cluster, text: &str, rules: Option<usize>) {
    let metric = |addr: &str, name: &str| support::metric(&support::scrape(addr), name, &[]).unwrap_or(0.0);
    let failures: Vec<f64> =
        meta_metrics(cluster).iter().map(|m| metric(m, "cairn_meta_access_reload_failures_total")).collect();
    fs::write(cluster.data.join("access.toml"), text).unwrap();
    for pid in cluster.nodes.iter().filter(|n| n.role == "meta").map(|n| n.pid) {
        unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    }
    eventually(20, "every metaserver re-read its access rules", || {
        meta_metrics(cluster).iter().zip(&failures).all(|(m, before)| match rules {
            Some(n) => metric(m, "cairn_meta_access_rules") == n as f64,
            None => metric(m, "cairn_meta_access_reload_failures_total") > *before,
        })
    });
}

#[test]
fn access_rules_make_a_client_read_only_and_squash_its_root() {
    let mut cluster = Cluster::start(6, "4+2", 64);
    fs::write(cluster.mnt.join("data"), b"training bytes").unwrap();
    assert!(
        fs::read_to_string(cluster.data.join("access.toml")).unwrap().contains("# [[rule]]"),
        "cairn up writes a file with no rules"
    );
    let (reader, squashed) = (client_cert(&cluster, "reader-1"), client_cert(&cluster, "squashed"));
    let (ranged, project) = (client_cert(&cluster, "ranged"), client_cert(&cluster, "project-a"));
    fs::create_dir_all(cluster.mnt.join("projects/a/sub")).unwrap();
    fs::create_dir_all(cluster.mnt.join("projects/b")).unwrap();
    fs::write(cluster.mnt.join("projects/a/sub/sample"), b"inside").unwrap();
    fs::write(cluster.mnt.join("projects/b/secret"), b"outside").unwrap();
    set_access_rules(
        &cluster,
        "[[rule]]\nclients = [\"reader-*\"]\nread_only = true\n\n\
         [[rule]]\nclients = [\"squashed\"]\nsquash = \"root\"\n\n\
         [[rule]]\nclients = [\"ranged\"]\nuids = [1000, 1999]\ngids = [1000, 1999]\n\n\
         [[rule]]\nclients = [\"project-a\"]\nsubtree = \"/projects/a\"\n",
        Some(4),
    );

    let status = cluster.cairn().arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("  reader-*: read-only, no setuid, no devices"), "{text}");
    assert!(text.contains("  squashed: squash root to 65534:65534, no setuid, no devices"), "{text}");
    assert!(text.contains("  ranged: no setuid, no devices, uids 1000-1999, gids 1000-1999"), "{text}");
    assert!(text.contains("  project-a: no setuid, no devices, subtree /projects/a"), "{text}");

    // A client limited to a subtree mounts it as its root, and reaches nothing above it.
    let pa = Mount::with_env(&cluster, "pa", &[], &[("CAIRN_TLS", project.to_str().unwrap())]);
    let names: Vec<_> = fs::read_dir(&pa.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["sub"]);
    assert_eq!(fs::metadata(&pa.dir).unwrap().ino(), 1, "the subtree is the mount's root");
    assert_eq!(fs::read(pa.dir.join("sub/sample")).unwrap(), b"inside");
    fs::write(pa.dir.join("made-by-project"), b"new").unwrap();
    assert_eq!(fs::read(cluster.mnt.join("projects/a/made-by-project")).unwrap(), b"new");
    assert!(!pa.dir.join("projects").exists() && !pa.dir.join("secret").exists());

    // A read-only client reads, and its mount is read-only: the kernel refuses every change.
    let ro = Mount::with_env(&cluster, "ro", &[], &[("CAIRN_TLS", reader.to_str().unwrap())]);
    assert_eq!(fs::read(ro.dir.join("data")).unwrap(), b"training bytes");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts.lines().find(|l| l.contains(ro.dir.to_str().unwrap())).unwrap();
    assert!(line.split(' ').nth(3).unwrap().split(',').any(|o| o == "ro"), "{line}");
    for e in [
        fs::write(ro.dir.join("new"), b"x").unwrap_err(),
        fs::remove_file(ro.dir.join("data")).unwrap_err(),
        fs::OpenOptions::new().append(true).open(ro.dir.join("data")).unwrap_err(),
    ] {
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    }

    // A squashed client's root makes files owned by nobody, without setuid bits, where
    // nobody may (as an NFS client's squashed root, it may not write root's directories).
    use std::os::unix::fs::PermissionsExt;
    let sq = Mount::with_env(&cluster, "sq", &[], &[("CAIRN_TLS", squashed.to_str().unwrap())]);
    let e = fs::write(sq.dir.join("in-roots-dir"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    fs::create_dir(cluster.mnt.join("open")).unwrap();
    fs::set_permissions(cluster.mnt.join("open"), fs::Permissions::from_mode(0o777)).unwrap();
    let mine = sq.dir.join("open/mine");
    fs::write(&mine, b"x").unwrap();
    let meta = fs::metadata(&mine).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    fs::set_permissions(&mine, fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(fs::metadata(&mine).unwrap().mode() & 0o7777, 0o755);

    // A client held to uid and gid ranges: root on its host makes no root-owned file (EACCES),
    // a user in the range does.
    fs::create_dir(cluster.mnt.join("shared")).unwrap();
    std::os::unix::fs::chown(cluster.mnt.join("shared"), Some(1500), Some(1500)).unwrap();
    let rg = Mount::with_env(&cluster, "rg", &[], &[("CAIRN_TLS", ranged.to_str().unwrap())]);
    let e = fs::write(rg.dir.join("shared/by-root"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert!(!cluster.mnt.join("shared/by-root").exists(), "nothing was made");
    let by_user = rg.dir.join("shared/by-user");
    let made = std::process::Command::new("setpriv")
        .args(["--reuid=1500", "--regid=1500", "--clear-groups", "sh", "-c"])
        .arg(format!("echo x > {}", by_user.display()))
        .status()
        .unwrap();
    assert!(made.success(), "a user in the range writes a file");
    let meta = fs::metadata(&by_user).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1500, 1500));

    // The cluster's own client certificate, which no rule names, is not held to them.
    fs::write(cluster.mnt.join("by-client"), b"x").unwrap();
    assert_eq!(fs::metadata(cluster.mnt.join("by-client")).unwrap().uid(), 0);

    // A broken file at a reload keeps the rules in force.
    set_access_rules(&cluster, "[[rule]]\nclients = [\"reader-*\"\n", None);
    drop(ro);
    let ro = Mount::with_env(&cluster, "ro2", &[], &[("CAIRN_TLS", reader.to_str().unwrap())]);
    assert_eq!(fs::write(ro.dir.join("new"), b"x").unwrap_err().raw_os_error(), Some(libc::EROFS));
    drop((ro, sq, rg, pa));
    cluster.stop();
}

/// A mount names the user of each request, with the groups the kernel does not send, so the
/// metaserver's own checks agree with the kernel's: a member of a file's group through a
/// supplementary group reads and appends to it, an execute-only program runs, an owner gives
/// a file to a group it is in.
#[test]
fn a_mount_names_each_requests_user_and_groups() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start(6, "4+2", 64);
    let team = cluster.mnt.join("team");
    fs::create_dir(&team).unwrap();
    std::os::unix::fs::chown(&team, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&team, fs::Permissions::from_mode(0o770)).unwrap();
    fs::write(team.join("notes"), b"for the team\n").unwrap();
    std::os::unix::fs::chown(team.join("notes"), Some(0), Some(4242)).unwrap();
    fs::set_permissions(team.join("notes"), fs::Permissions::from_mode(0o660)).unwrap();
    fs::copy("/bin/true", cluster.mnt.join("tool")).unwrap();
    fs::set_permissions(cluster.mnt.join("tool"), fs::Permissions::from_mode(0o711)).unwrap();
    let notes = team.join("notes");
    let script = format!(
        "set -e; cat {notes}; echo more >> {notes}; touch {team}/own; chgrp 4242 {team}/own; {tool}",
        notes = notes.display(),
        team = team.display(),
        tool = cluster.mnt.join("tool").display()
    );
    let as_user = |groups: &str| {
        Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", groups, "sh", "-c", &script])
            .output()
            .unwrap()
    };
    let member = as_user("--groups=4242");
    assert!(member.status.success(), "{member:?}");
    assert_eq!(String::from_utf8_lossy(&member.stdout), "for the team\n");
    assert_eq!(fs::read(&notes).unwrap(), b"for the team\nmore\n");
    let own = fs::metadata(team.join("own")).unwrap();
    assert_eq!((own.uid(), own.gid()), (1000, 4242));
    let stranger = as_user("--clear-groups");
    assert!(!stranger.status.success(), "not in the group: {stranger:?}");
    assert!(String::from_utf8_lossy(&stranger.stderr).contains("Permission denied"), "{stranger:?}");
}

/// Metrics served over TLS (`https://` in the listen address) answer monitor and admin
/// certificates of the cluster's CA; a client certificate is refused with 403, a caller
/// without a certificate at the handshake, a plaintext scrape gets nothing.
#[test]
fn metrics_over_tls_are_for_monitor_and_admin_certificates() {
    let cluster = Cluster::start(6, "4+2", 64);
    let port = support::free_addr().rsplit(':').next().unwrap().to_string();
    let listen = format!("https://127.0.0.1:{port}");
    let _mount = Mount::with_env(&cluster, "scraped", &["--metrics", &listen], &[]);
    let monitor = certificate(&cluster, "monitor", "prometheus");
    // The mount's certificate names its role, not an address: reach it by that name.
    let resolve = format!("client.cairn:{port}:127.0.0.1");
    let url = format!("https://client.cairn:{port}/metrics");
    let scrape = |cert: Option<&Path>| {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--resolve", &resolve, "--cacert"])
            .arg(cluster.tls("client").join("ca.pem"));
        if let Some(dir) = cert {
            curl.arg("--cert").arg(dir.join("cert.pem")).arg("--key").arg(dir.join("key.pem"));
        }
        let out = curl.arg(&url).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let eventually_up = Instant::now() + Duration::from_secs(20);
    let (ok, body) = loop {
        // Up, and past the first recording of the certificate's expiry (2 s after start).
        let (ok, body) = scrape(Some(&monitor));
        let recorded = body.contains("cairn_tls_certificate_expiry_timestamp_seconds");
        if (ok && recorded) || Instant::now() > eventually_up {
            break (ok, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ok && body.ends_with("\n200"), "{body}");
    assert!(body.contains("cairn_tls_certificate_expiry_timestamp_seconds"), "{body}");
    let (ok, body) = scrape(Some(&cluster.tls("admin")));
    assert!(ok && body.ends_with("\n200"), "an admin certificate: {body}");
    let (ok, body) = scrape(Some(&cluster.tls("client")));
    assert!(ok && body.ends_with("\n403") && body.contains("monitor or admin only"), "{body}");
    let (ok, body) = scrape(None);
    assert!(!ok, "no certificate: refused at the handshake: {body}");
    let plain = Command::new("curl")
        .args(["-sS", "--max-time", "10", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("cairn_"), "{plain:?}");
}
