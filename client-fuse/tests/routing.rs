//! A mount's metaserver handle over two metadata groups (`docs/ARCHITECTURE.md`, "How clients
//! route"): requests go to group 0 until one is answered `WrongGroup`, then where the group map
//! says; a map gone stale is corrected the same way; heartbeats, releases and syncs reach every
//! group they concern, under the one client id group 0 handed out.

use std::path::Path;
use std::time::{Duration, Instant};

use cairn_client::{connect_meta, MetaConn};
use cairn_common::config::MetaConfig;
use cairn_common::{CairnError, ErrorKind};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::{self as p, Empty};
use tempfile::TempDir;

fn free_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

/// Start a one-replica Raft group `group` at `addr`, made first as a founding member.
async fn start(dir: &Path, group: u32, addr: &str) -> tokio::sync::oneshot::Sender<()> {
    let config = MetaConfig {
        listen: addr.to_string(),
        data_dir: dir.join(format!("group{group}")),
        replicas: vec![format!("1={addr}")],
        raft_id: 1,
        group,
        ..MetaConfig::default()
    };
    cairn_meta::init(&config, false).unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(cairn_meta::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    stop
}

async fn admin(addr: &str) -> MetaClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    MetaClient::new(endpoint.timeout(Duration::from_secs(15)).connect_lazy())
}

/// Wait until `check` holds, up to 30 s.
async fn eventually<F: std::future::Future<Output = bool>>(what: &str, check: impl Fn() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn in_slot(slot: u64, n: u64) -> u64 {
    (slot << cairn_common::ids::SLOT_SHIFT) | n
}

/// What the metaserver at `addr` answers a getattr of `ino` with, asked directly.
async fn asked_of(addr: &str, ino: u64) -> Option<ErrorKind> {
    let answer = admin(addr).await.get_attr(p::InoRequest { ino }).await;
    answer.err().map(|status| CairnError::from(status).kind())
}

async fn map_version(addr: &str) -> Option<u64> {
    admin(addr).await.raft_status(Empty {}).await.ok().map(|r| r.into_inner().map_version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_go_to_the_group_owning_their_slot() {
    let dir = TempDir::new().unwrap();
    let (zero, one) = (free_addr(), free_addr());
    let _stop0 = start(dir.path(), 0, &zero).await;
    let stop1 = start(dir.path(), 1, &one).await;
    eventually("group 0 serves", || async { asked_of(&zero, 1).await.is_none() }).await;
    eventually("group 1 elects and leads", || async {
        asked_of(&one, 1).await.is_some_and(|k| k == ErrorKind::Unavailable)
    })
    .await;

    let meta: MetaConn = connect_meta(&zero).await.unwrap();
    let client_id = meta.register_client(Empty {}).await.unwrap().client_id;
    meta.set_client(client_id.into());
    let made = p::MkdirRequest { parent: 1, name: b"d".to_vec(), mode: 0o755, ..Default::default() };
    let in_zero = meta.mkdir(made).await.unwrap().attr.unwrap().ino;

    // Group 1 takes slots 5 and 6; its leader serves them once group 0 shared the map.
    let group = p::MetaGroup { group: 1, replicas: vec![format!("1={one}")] };
    admin(&zero).await.add_group(group).await.unwrap();
    let moved = p::MoveSlotsRequest { slots: vec![5, 6], group: 1 };
    assert_eq!(admin(&zero).await.move_slots(moved).await.unwrap().into_inner().version, 2);
    eventually("group 1 serves its slots", || async {
        asked_of(&one, in_slot(5, 1)).await == Some(ErrorKind::NotFound)
    })
    .await;

    // The handle fetched no map yet: group 0 says whose slot 5 is, the map is fetched, and
    // group 1 answers (nothing is there). The root stays group 0's.
    let e = meta.get_attr(p::InoRequest { ino: in_slot(5, 1) }).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "answered by group 1: {e}");
    assert_eq!(meta.get_attr(p::InoRequest { ino: 1 }).await.unwrap().attr.unwrap().ino, 1);
    let made =
        p::MkdirRequest { parent: in_slot(6, 3), name: b"x".to_vec(), mode: 0o755, ..Default::default() };
    let e = meta.mkdir(made).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "no such parent in group 1: {e}");

    // The one client id holds sessions in both groups: heartbeats and releases reach each
    // group with its own inodes; a sync reaches both.
    let open = p::OpenRequest { ino: in_zero, client_id, generation: 1, ..Default::default() };
    meta.open(open).await.unwrap();
    let beat = p::ClientHeartbeatRequest { client_id, open: vec![in_zero, in_slot(5, 9)] };
    assert!(meta.client_heartbeat(beat).await.unwrap().lease_ms > 0);
    let release = p::ReleaseRequest {
        client_id,
        ino: in_zero,
        generation: 1,
        more: vec![p::Released { ino: in_slot(6, 2), generation: 1 }],
    };
    meta.release(release).await.unwrap();
    meta.sync(Empty {}).await.unwrap();

    // A slot moved after the map was fetched: group 0 corrects the stale map (and group 1,
    // still behind for a moment, is asked again until it holds the new one).
    let moved = p::MoveSlotsRequest { slots: vec![7], group: 1 };
    admin(&zero).await.move_slots(moved).await.unwrap();
    let e = meta.get_attr(p::InoRequest { ino: in_slot(7, 1) }).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "answered by group 1: {e}");
    // Given back: group 1, asked first by the stale map, sends the request back to group 0.
    let moved = p::MoveSlotsRequest { slots: vec![5], group: 0 };
    admin(&zero).await.move_slots(moved).await.unwrap();
    eventually("group 1 holds map version 4", || async { map_version(&one).await == Some(4) }).await;
    assert_eq!(asked_of(&one, in_slot(5, 1)).await, Some(ErrorKind::WrongGroup));
    let e = meta.get_attr(p::InoRequest { ino: in_slot(5, 1) }).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "answered by group 0: {e}");

    // With group 1 gone, what concerns it fails and what does not still passes: the heartbeat
    // and the sync did go to it above.
    stop1.send(()).unwrap();
    eventually("group 1 is gone", || async { map_version(&one).await.is_none() }).await;
    let beat = |open| p::ClientHeartbeatRequest { client_id, open };
    meta.client_heartbeat(beat(vec![in_zero])).await.unwrap();
    meta.client_heartbeat(beat(vec![in_zero, in_slot(6, 2)])).await.unwrap_err();
    meta.sync(Empty {}).await.unwrap_err();
    meta.get_attr(p::InoRequest { ino: 1 }).await.unwrap();
    // Nor do its slots leave it: only its leader's promise to create nothing more in them
    // lets them go (slot 5 went back above with that promise).
    let back = p::MoveSlotsRequest { slots: vec![6], group: 0 };
    let e = CairnError::from(admin(&zero).await.move_slots(back).await.unwrap_err());
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("only once its leader promised"), "{e}");
}
