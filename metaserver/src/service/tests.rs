//! The gRPC service end to end: a real server on 127.0.0.1:0 and a tonic client.

use std::time::Duration;

use cairn_common::config::MetaConfig;
use cairn_common::{CairnError, ErrorKind, ROOT_INO};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::*;
use tonic::transport::Channel;

async fn start(
    config: MetaConfig,
) -> (MetaClient<Channel>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<cairn_common::Result<()>>)
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::serve(config, listener, async move {
        let _ = rx.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let client = loop {
        match MetaClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) if server.is_finished() => panic!("server stopped: {:?}", server.await.unwrap()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot connect: {e}"),
        }
    };
    (client, tx, server)
}

fn config(dir: &std::path::Path) -> MetaConfig {
    MetaConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.to_path_buf(),
        ec: "2+1".into(),
        unit: 4096,
        sync_mode: cairn_common::config::SyncMode::Never,
        gc_interval_ms: 50,
        ..MetaConfig::default()
    }
}

/// Register `n` chunkservers (addresses from `port`) and mark them up.
async fn register_chunks(c: &mut MetaClient<Channel>, n: u32, port: u32) {
    for i in 0..n {
        let req = RegisterChunkRequest {
            uuid: format!("u{i}"),
            addr: format!("127.0.0.1:{}", port + i),
            tiers: vec![],
            pid: 1,
            ..Default::default()
        };
        let id = c.register_chunk(req).await.unwrap().into_inner().node_id;
        c.heartbeat(HeartbeatRequest { node_id: id, ..Default::default() }).await.unwrap();
    }
}

fn kind(status: tonic::Status) -> ErrorKind {
    CairnError::from(status).kind()
}

/// The namespace's cluster id is drawn once and kept; a chunkserver that belongs to another
/// cluster is refused, with both ids named, and is not registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunkserver_of_another_cluster_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, stop, server) = start(config(dir.path())).await;
    let request = |cluster_id: &str| RegisterChunkRequest {
        uuid: "u1".into(),
        addr: "127.0.0.1:7001".into(),
        cluster_id: cluster_id.into(),
        ..Default::default()
    };
    let first = c.register_chunk(request("")).await.unwrap().into_inner();
    assert_eq!(first.cluster_id.len(), 32, "{first:?}");
    let beat = c.heartbeat(HeartbeatRequest { node_id: first.node_id, ..Default::default() }).await.unwrap();
    assert_eq!(beat.into_inner().cluster_id, first.cluster_id);
    let again = c.register_chunk(request(&first.cluster_id)).await.unwrap().into_inner();
    assert_eq!(again.node_id, first.node_id);

    let other = "0123456789abcdef0123456789abcdef";
    let mut stranger = request(other);
    stranger.uuid = "u2".into();
    let err = c.register_chunk(stranger).await.unwrap_err();
    assert_eq!(kind(err.clone()), ErrorKind::InvalidArgument);
    assert!(err.message().contains(other) && err.message().contains(&first.cluster_id), "{err:?}");
    let nodes = c.list_nodes(Empty {}).await.unwrap().into_inner().nodes;
    assert_eq!(nodes.len(), 1, "the stranger was not registered: {nodes:?}");
    // Node ids are small numbers every cluster hands out: another cluster's chunkserver with
    // the same id cannot heartbeat its address into this registry.
    let beat = HeartbeatRequest {
        node_id: first.node_id,
        addr: "10.9.9.9:1".into(),
        cluster_id: other.into(),
        ..Default::default()
    };
    assert_eq!(kind(c.heartbeat(beat).await.unwrap_err()), ErrorKind::InvalidArgument);
    let nodes = c.list_nodes(Empty {}).await.unwrap().into_inner().nodes;
    assert_eq!(nodes[0].addr, "127.0.0.1:7001", "{nodes:?}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();

    // Restarted on the same data: the same cluster.
    let (mut c, stop, server) = start(config(dir.path())).await;
    let back = c.register_chunk(request(&first.cluster_id)).await.unwrap().into_inner();
    assert_eq!(back.cluster_id, first.cluster_id);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    // A new data directory is a new cluster.
    let fresh = tempfile::tempdir().unwrap();
    let (mut c, stop, server) = start(config(fresh.path())).await;
    let err = c.register_chunk(request(&first.cluster_id)).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::InvalidArgument);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_namespace_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, stop, server) = start(config(dir.path())).await;

    register_chunks(&mut c, 3, 7000).await;
    let err = c.heartbeat(HeartbeatRequest { node_id: 99, ..Default::default() }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NotFound);

    let d = c
        .mkdir(MkdirRequest {
            parent: ROOT_INO,
            name: b"d".to_vec(),
            mode: 0o755,
            uid: 1,
            gid: 1,
            once: None,
        })
        .await
        .unwrap()
        .into_inner()
        .attr
        .unwrap();
    let created = c
        .create(CreateRequest {
            parent: d.ino,
            name: b"f".to_vec(),
            mode: 0o100644,
            exclusive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    let file = created.file.unwrap();
    assert_eq!(file.placement.len(), 3);
    assert_eq!(file.layout.unwrap(), Layout { k: 2, m: 1, unit: 4096 });
    let ino = file.attr.unwrap().ino;

    let stripe =
        StripeInfo { index: 0, version: 1, len: 100, written_len: 100, missing: 0, ..Default::default() };
    let attr = c
        .commit(CommitRequest {
            ino,
            size: 100,
            stripes: vec![stripe.clone()],
            mtime: None,
            once: None,
            buffered: false,
        })
        .await
        .unwrap()
        .into_inner()
        .attr
        .unwrap();
    assert_eq!(attr.size, 100);
    let open = c.open(OpenRequest { ino, client_id: 1, generation: 0 }).await.unwrap().into_inner();
    assert_eq!(open.stripes, vec![stripe]);

    let page = c.read_dir(ReadDirRequest { ino: d.ino, after: vec![], limit: 10, plus: true }).await.unwrap();
    let page = page.into_inner();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].attr.as_ref().unwrap().size, 100);

    // Bad input is a clear error, never a crash.
    let err = c.get_attr(InoRequest { ino: 0 }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::InvalidArgument);
    let err = c.lookup(LookupRequest { parent: ROOT_INO, name: vec![b'a'; 300] }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NameTooLong);
    let err = c.lookup(LookupRequest { parent: ROOT_INO, name: b"nope".to_vec() }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NotFound);
    let err = c.rmdir(RemoveRequest { parent: ROOT_INO, name: b"d".to_vec(), once: None }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NotEmpty);
    let err = c.get_xattr(XattrRequest { ino, name: b"user.x".to_vec(), once: None }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NoData);
    let bad = SetAttrRequest { ino, atime: Some(Timespec { sec: 1, nsec: u32::MAX }), ..Default::default() };
    assert_eq!(kind(c.set_attr(bad).await.unwrap_err()), ErrorKind::InvalidArgument);
    let huge = StripeInfo {
        index: u64::MAX,
        version: u64::MAX,
        len: u64::MAX,
        written_len: u64::MAX,
        missing: u32::MAX,
        ..Default::default()
    };
    let err = c
        .commit(CommitRequest {
            ino,
            size: u64::MAX,
            stripes: vec![huge],
            mtime: None,
            once: None,
            buffered: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(kind(err), ErrorKind::InvalidArgument | ErrorKind::TooBig));

    let status = c.cluster_status(Empty {}).await.unwrap().into_inner();
    assert_eq!((status.files, status.directories, status.logical_bytes), (1, 2, 100));
    assert_eq!(status.nodes.len(), 3);
    assert!(status.nodes.iter().all(|n| n.up));
    let fs = c.stat_fs(Empty {}).await.unwrap().into_inner();
    assert_eq!(fs.files, 3);
    let a = c.register_client(Empty {}).await.unwrap().into_inner().client_id;
    let b = c.register_client(Empty {}).await.unwrap().into_inner().client_id;
    assert_ne!(a, b);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    // Once serve returns nothing holds the database, even with a client still connected.
    drop(crate::store::RocksStore::open(dir.path(), cairn_common::config::SyncMode::Never).unwrap());

    // A restarted server has it all.
    let (mut c, stop, server) = start(config(dir.path())).await;
    let f = c.lookup(LookupRequest { parent: d.ino, name: b"f".to_vec() }).await.unwrap().into_inner();
    assert_eq!(f.attr.unwrap().size, 100);
    let nodes = c.list_nodes(Empty {}).await.unwrap().into_inner().nodes;
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| !n.up), "down until they heartbeat");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let _held = crate::store::RocksStore::open(dir.path(), cairn_common::config::SyncMode::Never).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = crate::serve(config(dir.path()), listener, std::future::pending()).await.unwrap_err();
    assert!(err.message().contains("cannot open metadata database"), "{err}");

    let mut bad = config(dir.path());
    bad.ec = "9+9".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    assert!(crate::serve(bad, listener, std::future::pending()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_releases_free_unlinked_files_and_late_ones_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, stop, server) = start(config(dir.path())).await;
    register_chunks(&mut c, 3, 7100).await;
    let mut inos = Vec::new();
    for i in 0..3u64 {
        let req = CreateRequest {
            parent: ROOT_INO,
            name: format!("f{i}").into_bytes(),
            mode: 0o100644,
            client_id: 5,
            open: true,
            generation: i + 1,
            ..Default::default()
        };
        let reply = c.create(req).await.unwrap().into_inner();
        // The reply carries the directory as the create left it.
        let root = c.get_attr(InoRequest { ino: ROOT_INO }).await.unwrap().into_inner().attr.unwrap();
        assert_eq!(reply.parent, Some(root));
        inos.push(reply.file.unwrap().attr.unwrap().ino);
    }
    for i in 0..3 {
        let reply = c
            .unlink(RemoveRequest { parent: ROOT_INO, name: format!("f{i}").into_bytes(), once: None })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().parent.unwrap().ino, ROOT_INO);
    }
    // Open and unlinked: kept. The third is opened again (generation 10) before the batch of
    // releases arrives.
    c.open(OpenRequest { ino: inos[2], client_id: 5, generation: 10 }).await.unwrap();
    let batch: Vec<Released> =
        inos.iter().enumerate().map(|(i, &ino)| Released { ino, generation: i as u64 + 1 }).collect();
    c.release(ReleaseRequest { client_id: 5, more: batch, ..Default::default() }).await.unwrap();
    for &ino in &inos[..2] {
        assert_eq!(
            kind(c.get_attr(InoRequest { ino }).await.unwrap_err()),
            ErrorKind::NotFound,
            "{ino} freed"
        );
    }
    assert!(c.get_attr(InoRequest { ino: inos[2] }).await.is_ok(), "a late release freed a file open again");
    c.release(ReleaseRequest { client_id: 5, ino: inos[2], generation: 10, more: vec![] }).await.unwrap();
    assert_eq!(kind(c.get_attr(InoRequest { ino: inos[2] }).await.unwrap_err()), ErrorKind::NotFound);

    // Bad batches are refused whole.
    let too_many = vec![Released { ino: inos[0], generation: 1 }; crate::service::MAX_RELEASES + 1];
    let err =
        c.release(ReleaseRequest { client_id: 5, more: too_many, ..Default::default() }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::InvalidArgument);
    let zero = vec![Released { ino: 0, generation: 1 }];
    let err = c.release(ReleaseRequest { client_id: 5, more: zero, ..Default::default() }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::InvalidArgument);

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// A change sent again with the same (client, sequence) — as a client does after a failover
/// when it cannot know whether its first try was applied — is done once: the repeat answers as
/// the first try did, never EEXIST or ENOENT; a new sequence is a new change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_sent_again_is_done_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, stop, server) = start(config(dir.path())).await;
    register_chunks(&mut c, 3, 7100).await;
    let once = |seq| Some(Once { client: 7, seq });

    let create = CreateRequest {
        parent: ROOT_INO,
        name: b"f".to_vec(),
        mode: 0o100644,
        exclusive: true,
        once: once(1),
        ..Default::default()
    };
    let first = c.create(create.clone()).await.unwrap().into_inner();
    let again = c.create(create.clone()).await.unwrap().into_inner();
    assert!(again.created);
    assert_eq!(again.file.unwrap().attr.unwrap().ino, first.file.unwrap().attr.unwrap().ino);
    // Without the mark (or with a new sequence) it is another change: EEXIST.
    let fresh = CreateRequest { once: once(2), ..create.clone() };
    assert_eq!(kind(c.create(fresh).await.unwrap_err()), ErrorKind::Exists);
    assert_eq!(kind(c.create(CreateRequest { once: None, ..create }).await.unwrap_err()), ErrorKind::Exists);

    let mkdir =
        MkdirRequest { parent: ROOT_INO, name: b"d".to_vec(), mode: 0o755, uid: 0, gid: 0, once: once(3) };
    let d = c.mkdir(mkdir.clone()).await.unwrap().into_inner().attr.unwrap().ino;
    assert_eq!(c.mkdir(mkdir).await.unwrap().into_inner().attr.unwrap().ino, d);

    let rename = RenameRequest {
        parent: ROOT_INO,
        name: b"f".to_vec(),
        new_parent: d,
        new_name: b"g".to_vec(),
        flags: 0,
        once: once(4),
    };
    c.rename(rename.clone()).await.unwrap();
    c.rename(rename).await.unwrap();

    let unlink = RemoveRequest { parent: d, name: b"g".to_vec(), once: once(5) };
    c.unlink(unlink.clone()).await.unwrap();
    c.unlink(unlink.clone()).await.unwrap();
    let unlink_new = RemoveRequest { once: once(6), ..unlink };
    assert_eq!(kind(c.unlink(unlink_new).await.unwrap_err()), ErrorKind::NotFound);

    // Xattrs and attributes: XATTR_CREATE sent again is not EEXIST.
    let d_attr =
        SetXattrRequest { ino: d, name: b"user.k".to_vec(), value: b"v".to_vec(), flags: 1, once: once(8) };
    c.set_xattr(d_attr.clone()).await.unwrap();
    c.set_xattr(d_attr.clone()).await.unwrap();
    assert_eq!(
        kind(c.set_xattr(SetXattrRequest { once: once(9), ..d_attr }).await.unwrap_err()),
        ErrorKind::Exists
    );
    let rm = XattrRequest { ino: d, name: b"user.k".to_vec(), once: once(10) };
    c.remove_xattr(rm.clone()).await.unwrap();
    c.remove_xattr(rm).await.unwrap();

    // A failed try records nothing: sent again, it fails again the same way.
    let rmdir = RemoveRequest { parent: ROOT_INO, name: b"missing".to_vec(), once: once(7) };
    assert_eq!(kind(c.rmdir(rmdir.clone()).await.unwrap_err()), ErrorKind::NotFound);
    assert_eq!(kind(c.rmdir(rmdir).await.unwrap_err()), ErrorKind::NotFound);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// Access rules, called in process with the caller's certificate in the request as both
/// transports put it there.
mod access_rules {
    use cairn_net::capability;
    use cairn_net::tls::{Peer, Role, Roles};
    use cairn_proto::meta_server::Meta;
    use tonic::Request;

    use super::*;
    use crate::access::{Access, Rule, Squash};
    use crate::fixture::Fixture;
    use crate::MetaService;

    const S_IFREG: u32 = 0o100000;
    const S_IFDIR: u32 = 0o040000;
    const S_IFCHR: u32 = 0o020000;

    fn from<T>(name: &str, roles: &[Role], msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        req.extensions_mut().insert(Peer { addr: None, roles: Roles::of(roles), name: name.into() });
        req
    }

    fn client<T>(name: &str, msg: T) -> Request<T> {
        from(name, &[Role::Client], msg)
    }

    fn kind(status: tonic::Status) -> ErrorKind {
        CairnError::from(status).kind()
    }

    /// An in-memory namespace with three chunkservers (a 2+1 layout).
    fn namespace() -> Fixture {
        let ns = Fixture::memory(cairn_common::Layout::new(2, 1, 4096).unwrap());
        for i in 0..3 {
            ns.registry()
                .register(&format!("node-{i}"), &format!("127.0.0.1:{}", 1000 + i), vec![], 1, "")
                .unwrap();
        }
        ns
    }

    fn service() -> MetaService {
        let rule = |clients: &[&str]| Rule {
            clients: clients.iter().map(|c| c.to_string()).collect(),
            read_only: false,
            squash: Squash::None,
            anon_uid: 500,
            anon_gid: 600,
            setuid: false,
            devices: false,
            uids: None,
            gids: None,
        };
        let access = Access::of(vec![
            Rule { read_only: true, ..rule(&["reader", "eval-*"]) },
            Rule { squash: Squash::All, ..rule(&["squashed"]) },
            Rule { squash: Squash::Root, ..rule(&["root-squashed"]) },
            Rule { uids: Some([1000, 1999]), gids: Some([1000, 1999]), ..rule(&["ranged"]) },
        ])
        .unwrap();
        let f = namespace();
        MetaService::new(f.ns.clone(), f.cluster.clone()).with_access(access)
    }

    fn set_xattr(ino: u64, name: &str) -> SetXattrRequest {
        SetXattrRequest { ino, name: name.into(), value: vec![1], ..Default::default() }
    }

    fn create(name: &str, mode: u32, uid: u32) -> CreateRequest {
        CreateRequest { parent: ROOT_INO, name: name.into(), mode, uid, gid: uid, ..Default::default() }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_client_reads_and_changes_nothing() {
        let svc = service();
        let made =
            svc.create(client("writer", create("f", S_IFREG | 0o644, 1000))).await.unwrap().into_inner();
        let ino = made.file.unwrap().attr.unwrap().ino;
        let writer = svc.register_client(client("writer", Empty {})).await.unwrap().into_inner();
        let open = OpenRequest { ino, client_id: writer.client_id, generation: 1 };
        let opened = svc.open(client("writer", open)).await.unwrap().into_inner();
        assert_eq!(opened.cap.unwrap().ops, capability::READ | capability::WRITE);
        assert!(svc.register_client(client("eval-3", Empty {})).await.unwrap().into_inner().read_only);
        let registered = svc.register_client(client("reader", Empty {})).await.unwrap().into_inner();
        assert!(registered.read_only, "told to mount read-only");
        assert!(!svc.register_client(client("writer", Empty {})).await.unwrap().into_inner().read_only);

        // Every change is refused with EROFS, and none happened.
        let reader = "reader";
        let refused = [
            svc.create(client(reader, create("g", S_IFREG | 0o644, 1000))).await.err(),
            svc.mkdir(client(
                reader,
                MkdirRequest { parent: ROOT_INO, name: "d".into(), mode: 0o755, ..Default::default() },
            ))
            .await
            .err(),
            svc.unlink(client(reader, RemoveRequest { parent: ROOT_INO, name: "f".into(), once: None }))
                .await
                .err(),
            svc.rmdir(client(reader, RemoveRequest { parent: ROOT_INO, name: "f".into(), once: None }))
                .await
                .err(),
            svc.rename(client(
                reader,
                RenameRequest {
                    parent: ROOT_INO,
                    name: "f".into(),
                    new_parent: ROOT_INO,
                    new_name: "h".into(),
                    ..Default::default()
                },
            ))
            .await
            .err(),
            svc.link(client(
                reader,
                LinkRequest { ino, new_parent: ROOT_INO, new_name: "l".into(), once: None },
            ))
            .await
            .err(),
            svc.symlink(client(
                reader,
                SymlinkRequest {
                    parent: ROOT_INO,
                    name: "s".into(),
                    target: "f".into(),
                    ..Default::default()
                },
            ))
            .await
            .err(),
            svc.set_attr(client(reader, SetAttrRequest { ino, size: Some(0), ..Default::default() }))
                .await
                .err(),
            svc.set_xattr(client(
                reader,
                SetXattrRequest { ino, name: "user.a".into(), value: "1".into(), ..Default::default() },
            ))
            .await
            .err(),
            svc.remove_xattr(client(
                reader,
                XattrRequest { ino, name: "user.a".into(), ..Default::default() },
            ))
            .await
            .err(),
            svc.commit(client(reader, CommitRequest { ino, size: 1 << 20, ..Default::default() }))
                .await
                .err(),
        ];
        for (i, e) in refused.into_iter().enumerate() {
            let e = e.unwrap_or_else(|| panic!("change {i} was not refused"));
            assert_eq!(kind(e), ErrorKind::ReadOnly, "change {i}");
        }
        let names = svc
            .read_dir(client(reader, ReadDirRequest { ino: ROOT_INO, limit: 100, ..Default::default() }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(names.entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), vec![b"f".to_vec()]);
        let attr = svc.get_attr(client(reader, InoRequest { ino })).await.unwrap().into_inner().attr.unwrap();
        assert_eq!((attr.size, attr.mode), (0, S_IFREG | 0o644), "nothing changed");

        // Reads are served, with capabilities that only read.
        let open = OpenRequest { ino, client_id: registered.client_id, generation: 1 };
        let opened = svc.open(client(reader, open)).await.unwrap().into_inner();
        assert_eq!(opened.cap.unwrap().ops, capability::READ);
        let renewed = svc.grant_capability(client(reader, InoRequest { ino })).await.unwrap().into_inner();
        assert_eq!(renewed.ops, capability::READ);
        // Locks are no change.
        let lock = LockRequest {
            ino,
            client_id: registered.client_id,
            owner: 1,
            typ: 0,
            end: 10,
            ..Default::default()
        };
        svc.lock(client(reader, lock)).await.unwrap();

        // An admin's certificate of the same name is not held to the rule; neither is a
        // client certificate no rule names.
        let admin = from(reader, &[Role::Admin], create("by-admin", S_IFREG | 0o644, 0));
        svc.create(admin).await.unwrap();
        svc.create(client("someone", create("by-someone", S_IFREG | 0o644, 0))).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_squashed_client_gets_no_root_files_setuid_bits_or_devices() {
        let svc = service();
        let who = "squashed";
        let made = svc.create(client(who, create("suid", S_IFREG | 0o6755, 0))).await.unwrap().into_inner();
        let attr = made.file.unwrap().attr.unwrap();
        assert_eq!((attr.uid, attr.gid, attr.mode), (500, 600, S_IFREG | 0o755));
        let dir = svc
            .mkdir(client(
                who,
                MkdirRequest { parent: ROOT_INO, name: "d".into(), mode: 0o2775, uid: 7, gid: 8, once: None },
            ))
            .await
            .unwrap()
            .into_inner()
            .attr
            .unwrap();
        assert_eq!((dir.uid, dir.gid, dir.mode), (500, 600, S_IFDIR | 0o2775), "a directory's setgid stays");
        let e = svc.create(client(who, create("tty", S_IFCHR | 0o666, 0))).await.unwrap_err();
        assert_eq!(kind(e), ErrorKind::NotPermitted);
        let link = SymlinkRequest {
            parent: ROOT_INO,
            name: "s".into(),
            target: "suid".into(),
            uid: 0,
            gid: 0,
            once: None,
        };
        let s = svc.symlink(client(who, link)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!((s.uid, s.gid), (500, 600));
        // chown to root and chmod u+s: mapped and cleared.
        let set = SetAttrRequest {
            ino: attr.ino,
            uid: Some(0),
            gid: Some(0),
            mode: Some(0o4711),
            ..Default::default()
        };
        let after = svc.set_attr(client(who, set)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!((after.uid, after.gid, after.mode), (500, 600, S_IFREG | 0o711));
        let set = SetAttrRequest { ino: dir.ino, mode: Some(0o6770), ..Default::default() };
        let after = svc.set_attr(client(who, set)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!(after.mode, S_IFDIR | 0o2770, "chmod of a directory: setgid stays, setuid goes");
        let cap = set_xattr(attr.ino, "security.capability");
        assert_eq!(kind(svc.set_xattr(client(who, cap)).await.unwrap_err()), ErrorKind::NotPermitted);
        let acl = set_xattr(attr.ino, "system.posix_acl_access");
        assert_eq!(kind(svc.set_xattr(client(who, acl)).await.unwrap_err()), ErrorKind::NotPermitted);
        // Another client, no rule: what it sends is stored.
        let made = svc
            .create(client("writer", create("root-suid", S_IFREG | 0o4755, 0)))
            .await
            .unwrap()
            .into_inner();
        let attr = made.file.unwrap().attr.unwrap();
        assert_eq!((attr.uid, attr.gid, attr.mode), (0, 0, S_IFREG | 0o4755));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_claims_only_the_owners_its_rule_allows() {
        let svc = service();
        let who = "ranged";
        let made = svc.create(client(who, create("in", S_IFREG | 0o644, 1500))).await.unwrap().into_inner();
        let mine = made.file.unwrap().attr.unwrap();
        assert_eq!((mine.uid, mine.gid), (1500, 1500));
        // Entries owned outside its ranges: EACCES, and nothing made.
        let mkdir =
            MkdirRequest { parent: ROOT_INO, name: "d".into(), mode: 0o755, uid: 0, gid: 1500, once: None };
        let symlink = SymlinkRequest {
            parent: ROOT_INO,
            name: "s".into(),
            target: "in".into(),
            uid: 1500,
            gid: 2000,
            once: None,
        };
        let refused = [
            svc.create(client(who, create("root-owned", S_IFREG | 0o644, 0))).await.err(),
            svc.mkdir(client(who, mkdir)).await.err(),
            svc.symlink(client(who, symlink)).await.err(),
            svc.set_attr(client(who, SetAttrRequest { ino: mine.ino, uid: Some(0), ..Default::default() }))
                .await
                .err(),
            svc.set_attr(client(who, SetAttrRequest { ino: mine.ino, gid: Some(999), ..Default::default() }))
                .await
                .err(),
        ];
        for (i, e) in refused.into_iter().enumerate() {
            let e = e.unwrap_or_else(|| panic!("change {i} was not refused"));
            assert_eq!(kind(e), ErrorKind::PermissionDenied, "{i}");
        }
        for name in ["root-owned", "d", "s"] {
            let e = svc.lookup(client(who, LookupRequest { parent: ROOT_INO, name: name.into() })).await;
            assert_eq!(kind(e.unwrap_err()), ErrorKind::NotFound, "{name}");
        }
        let attr = svc.get_attr(client(who, InoRequest { ino: mine.ino })).await.unwrap().into_inner();
        assert_eq!(attr.attr.unwrap().uid, 1500, "unchanged");
        // A chown inside the range goes through; root's files it may not act on.
        let chown = SetAttrRequest { ino: mine.ino, uid: Some(1999), gid: Some(1000), ..Default::default() };
        let after = svc.set_attr(client(who, chown)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!((after.uid, after.gid), (1999, 1000));
        let made = svc.create(client("writer", create("roots", S_IFREG | 0o666, 0))).await.unwrap();
        let roots = made.into_inner().file.unwrap().attr.unwrap().ino;
        let touch = SetAttrRequest { ino: roots, mode: Some(0o600), ..Default::default() };
        assert_eq!(kind(svc.set_attr(client(who, touch)).await.unwrap_err()), ErrorKind::NotPermitted);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_squashed_root_cannot_change_roots_files_nor_keep_privileges_through_a_write() {
        let svc = service();
        let who = "root-squashed";
        // Root's setuid binary, and a user's setgid program with file capabilities.
        let made =
            svc.create(client("writer", create("su", S_IFREG | 0o4755, 0))).await.unwrap().into_inner();
        let su = made.file.unwrap().attr.unwrap().ino;
        let made =
            svc.create(client("writer", create("prog", S_IFREG | 0o6755, 1000))).await.unwrap().into_inner();
        let prog = made.file.unwrap().attr.unwrap().ino;
        svc.set_xattr(client("writer", set_xattr(prog, "security.capability"))).await.unwrap();
        let tty = svc.create(client("writer", create("tty", S_IFCHR | 0o600, 0))).await.unwrap().into_inner();
        let tty = tty.file.unwrap().attr.unwrap().ino;

        // Root's files: no write, truncate, chmod, touch or xattr from a squashed root.
        let refused = [
            svc.commit(client(who, CommitRequest { ino: su, ..Default::default() })).await.err(),
            svc.set_attr(client(who, SetAttrRequest { ino: su, size: Some(0), ..Default::default() }))
                .await
                .err(),
            svc.set_attr(client(who, SetAttrRequest { ino: su, mode: Some(0o777), ..Default::default() }))
                .await
                .err(),
            svc.set_attr(client(who, SetAttrRequest { ino: su, atime_now: true, ..Default::default() }))
                .await
                .err(),
            svc.set_xattr(client(who, set_xattr(su, "user.a"))).await.err(),
            svc.set_attr(client(
                who,
                SetAttrRequest { ino: tty, mode: Some(S_IFCHR | 0o666), ..Default::default() },
            ))
            .await
            .err(),
        ];
        for (i, e) in refused.into_iter().enumerate() {
            assert_eq!(
                kind(e.unwrap_or_else(|| panic!("change {i} was not refused"))),
                ErrorKind::NotPermitted,
                "{i}"
            );
        }
        let attr =
            svc.get_attr(client(who, InoRequest { ino: su })).await.unwrap().into_inner().attr.unwrap();
        assert_eq!(attr.mode, S_IFREG | 0o4755, "unchanged");

        // Its own files it may not give away; a group change stays.
        let mine = svc.create(client(who, create("mine", S_IFREG | 0o644, 0))).await.unwrap().into_inner();
        let mine = mine.file.unwrap().attr.unwrap().ino;
        let give = SetAttrRequest { ino: mine, uid: Some(1000), ..Default::default() };
        assert_eq!(kind(svc.set_attr(client(who, give)).await.unwrap_err()), ErrorKind::NotPermitted);
        let chgrp = SetAttrRequest { ino: mine, gid: Some(1000), ..Default::default() };
        let after = svc.set_attr(client(who, chgrp)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!((after.uid, after.gid), (500, 1000));

        // The user's program: a write drops its setuid and setgid bits and its capabilities.
        svc.commit(client(who, CommitRequest { ino: prog, ..Default::default() })).await.unwrap();
        let attr =
            svc.get_attr(client(who, InoRequest { ino: prog })).await.unwrap().into_inner().attr.unwrap();
        assert_eq!(attr.mode, S_IFREG | 0o755);
        let caps = svc
            .get_xattr(client(
                who,
                XattrRequest { ino: prog, name: "security.capability".into(), once: None },
            ))
            .await;
        assert_eq!(kind(caps.unwrap_err()), ErrorKind::NoData, "capabilities dropped");
        for name in ["security.capability", "security.selinux", "trusted.overlay.opaque"] {
            let e = svc.set_xattr(client(who, set_xattr(prog, name))).await.unwrap_err();
            assert_eq!(kind(e), ErrorKind::NotPermitted, "{name}");
        }
        svc.set_xattr(client(who, set_xattr(prog, "user.note"))).await.unwrap();
        // A chmod of a device node it may change (the kernel sends the file type too).
        let made =
            svc.create(client("writer", create("tty2", S_IFCHR | 0o600, 1000))).await.unwrap().into_inner();
        let tty2 = made.file.unwrap().attr.unwrap().ino;
        let set = SetAttrRequest { ino: tty2, mode: Some(S_IFCHR | 0o660), ..Default::default() };
        let after = svc.set_attr(client(who, set)).await.unwrap().into_inner().attr.unwrap();
        assert_eq!(after.mode, S_IFCHR | 0o660);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_of_the_rules_revokes_the_capabilities_signed_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.toml");
        std::fs::write(&path, "").unwrap();
        let access = Access::load(&path).unwrap();
        let f = namespace();
        let svc = MetaService::new(f.ns.clone(), f.cluster.clone()).with_access(access.clone());
        let made = svc.create(client("job", create("f", S_IFREG | 0o644, 1000))).await.unwrap().into_inner();
        let ino = made.file.unwrap().attr.unwrap().ino;
        let before = svc.grant_capability(client("job", InoRequest { ino })).await.unwrap().into_inner();
        assert_eq!(before.ops, capability::READ | capability::WRITE);
        let chunkserver = capability::Verifier::default();
        chunkserver.learn(&svc.signer().keys());
        assert_eq!(chunkserver.check(Some(&before), ino, capability::WRITE, "job"), Ok(()));

        // Rules that change nothing for this client change nothing for its tokens.
        access.reload().unwrap();
        let same = svc.grant_capability(client("job", InoRequest { ino })).await.unwrap().into_inner();
        assert_eq!(same.key_id, before.key_id);

        std::fs::write(&path, "[[rule]]\nclients = [\"job\"]\nread_only = true\n").unwrap();
        access.reload().unwrap();
        let after = svc.grant_capability(client("job", InoRequest { ino })).await.unwrap().into_inner();
        assert_eq!(after.ops, capability::READ);
        assert_ne!(after.key_id, before.key_id, "signed with a new key");
        let keys = svc.signer().keys();
        let old = keys.iter().find(|k| k.id == before.key_id).expect("the revoked key is announced");
        assert!(old.retire <= cairn_common::time::unix_secs(), "retired at the revocation");
        chunkserver.learn(&keys);
        assert_eq!(chunkserver.check(Some(&after), ino, capability::READ, "job"), Ok(()));
    }
}
