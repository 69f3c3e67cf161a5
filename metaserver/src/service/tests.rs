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
    // A new data directory is made first, as `cairn meta init` makes it.
    if crate::is_new(&config.data_dir).unwrap() {
        crate::init(&config, false).unwrap();
    }
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
            caller: None,
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
    let open = c
        .open(OpenRequest { caller: None, access: 6, ino, client_id: 1, generation: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(open.stripes, vec![stripe]);

    let page = c
        .read_dir(ReadDirRequest { caller: None, ino: d.ino, after: vec![], limit: 10, plus: true })
        .await
        .unwrap();
    let page = page.into_inner();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].attr.as_ref().unwrap().size, 100);

    // Bad input is a clear error, never a crash.
    let err = c.get_attr(InoRequest { ino: 0 }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::InvalidArgument);
    let err =
        c.lookup(LookupRequest { caller: None, parent: ROOT_INO, name: vec![b'a'; 300] }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NameTooLong);
    let err =
        c.lookup(LookupRequest { caller: None, parent: ROOT_INO, name: b"nope".to_vec() }).await.unwrap_err();
    assert_eq!(kind(err), ErrorKind::NotFound);
    let err = c
        .rmdir(RemoveRequest { caller: None, parent: ROOT_INO, name: b"d".to_vec(), once: None })
        .await
        .unwrap_err();
    assert_eq!(kind(err), ErrorKind::NotEmpty);
    let err = c
        .get_xattr(XattrRequest { caller: None, ino, name: b"user.x".to_vec(), once: None })
        .await
        .unwrap_err();
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
    let f = c
        .lookup(LookupRequest { caller: None, parent: d.ino, name: b"f".to_vec() })
        .await
        .unwrap()
        .into_inner();
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
            .unlink(RemoveRequest {
                caller: None,
                parent: ROOT_INO,
                name: format!("f{i}").into_bytes(),
                once: None,
            })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().parent.unwrap().ino, ROOT_INO);
    }
    // Open and unlinked: kept. The third is opened again (generation 10) before the batch of
    // releases arrives.
    c.open(OpenRequest { caller: None, access: 6, ino: inos[2], client_id: 5, generation: 10 })
        .await
        .unwrap();
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

    let mkdir = MkdirRequest {
        caller: None,
        parent: ROOT_INO,
        name: b"d".to_vec(),
        mode: 0o755,
        uid: 0,
        gid: 0,
        once: once(3),
    };
    let d = c.mkdir(mkdir.clone()).await.unwrap().into_inner().attr.unwrap().ino;
    assert_eq!(c.mkdir(mkdir).await.unwrap().into_inner().attr.unwrap().ino, d);

    let rename = RenameRequest {
        caller: None,
        parent: ROOT_INO,
        name: b"f".to_vec(),
        new_parent: d,
        new_name: b"g".to_vec(),
        flags: 0,
        once: once(4),
    };
    c.rename(rename.clone()).await.unwrap();
    c.rename(rename).await.unwrap();

    let unlink = RemoveRequest { caller: None, parent: d, name: b"g".to_vec(), once: once(5) };
    c.unlink(unlink.clone()).await.unwrap();
    c.unlink(unlink.clone()).await.unwrap();
    let unlink_new = RemoveRequest { once: once(6), ..unlink };
    assert_eq!(kind(c.unlink(unlink_new).await.unwrap_err()), ErrorKind::NotFound);

    // Xattrs and attributes: XATTR_CREATE sent again is not EEXIST.
    let d_attr = SetXattrRequest {
        caller: None,
        ino: d,
        name: b"user.k".to_vec(),
        value: b"v".to_vec(),
        flags: 1,
        once: once(8),
    };
    c.set_xattr(d_attr.clone()).await.unwrap();
    c.set_xattr(d_attr.clone()).await.unwrap();
    assert_eq!(
        kind(c.set_xattr(SetXattrRequest { once: once(9), ..d_attr }).await.unwrap_err()),
        ErrorKind::Exists
    );
    let rm = XattrRequest { caller: None, ino: d, name: b"user.k".to_vec(), once: once(10) };
    c.remove_xattr(rm.clone()).await.unwrap();
    c.remove_xattr(rm).await.unwrap();

    // A failed try records nothing: sent again, it fails again the same way.
    let rmdir = RemoveRequest { caller: None, parent: ROOT_INO, name: b"missing".to_vec(), once: once(7) };
    assert_eq!(kind(c.rmdir(rmdir.clone()).await.unwrap_err()), ErrorKind::NotFound);
    assert_eq!(kind(c.rmdir(rmdir).await.unwrap_err()), ErrorKind::NotFound);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// Access rules, called in process with the caller's certificate in the request as both
/// transports put it there.
mod access_rules;
