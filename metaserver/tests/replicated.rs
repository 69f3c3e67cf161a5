//! Three metaserver replicas in one process on loopback: one leads and serves, the others
//! answer `NotLeader`; when the leader stops, another takes over with every acknowledged
//! change; a stopped replica catches up when it comes back; a replica of another cluster is
//! refused.

use std::path::Path;
use std::time::{Duration, Instant};

use cairn_common::config::MetaConfig;
use cairn_common::{CairnError, ErrorKind};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::{
    CheckNamespaceRequest, Empty, GroupMap, GroupRequest, InoRequest, LookupRequest, MetaGroup, MkdirRequest,
    MoveSlotsRequest, RaftStatusReply, SharedGroupMap,
};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Replica {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<cairn_common::Result<()>>>,
}

fn config(dir: &Path, id: u64, addrs: &[String]) -> MetaConfig {
    MetaConfig {
        listen: addrs[id as usize - 1].clone(),
        data_dir: dir.join(format!("meta{id}")),
        replicas: addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect(),
        raft_id: id,
        ..MetaConfig::default()
    }
}

/// Start a replica; a new one is made first (`cairn meta init`), as a founding member. A
/// replica stopped in this process a moment ago may still hold its database open (the last
/// connection that holds its service goes away shortly after): started again, it is retried
/// until the database is free; any other failure to start fails the test at once.
async fn start(config: MetaConfig) -> Replica {
    if cairn_meta::is_new(&config.data_dir).unwrap() {
        cairn_meta::init(&config, false).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listener = tokio::net::TcpListener::bind(&config.listen).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cairn_meta::serve(config.clone(), listener, async move {
            let _ = stopped.await;
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !task.is_finished() {
            return Replica { stop: Some(stop), task: Some(task) };
        }
        let ended = task.await.expect("the replica's task");
        match ended {
            Err(e) if e.message().contains("lock hold by current process") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the replica at {} did not start: {other:?}", config.listen),
        }
    }
}

impl Replica {
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await.expect("the replica stops");
        }
    }
}

async fn client(addr: &str) -> MetaClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(15))
        .connect_lazy();
    MetaClient::new(channel)
}

async fn status(addr: &str) -> Option<RaftStatusReply> {
    client(addr).await.raft_status(Empty {}).await.ok().map(|r| r.into_inner())
}

/// The address of the replica that leads and serves, waiting up to `secs`.
async fn serving_leader(addrs: &[String], secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        for addr in addrs {
            if let Some(s) = status(addr).await {
                if s.state == "leader" {
                    // Serving once the namespace is open: a lookup of the root's "." fails
                    // with NotFound, not NotLeader.
                    let probe = client(addr)
                        .await
                        .lookup(LookupRequest { parent: 1, name: b"probe".to_vec(), caller: None })
                        .await;
                    if let Err(status) = probe {
                        if CairnError::from(status).kind() == ErrorKind::NotFound {
                            return addr.clone();
                        }
                    }
                }
            }
        }
        assert!(Instant::now() < deadline, "no serving leader within {secs} s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The address of the replica of `group` among `addrs` that leads it, other than `not`,
/// waiting up to 30 s.
async fn group_leader(addrs: &[String], group: u32, not: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for addr in addrs.iter().filter(|a| Some(a.as_str()) != not) {
            // A replica still starting knows no group yet.
            if let Some(s) = status(addr).await.filter(|s| s.state != "starting") {
                assert_eq!(s.group, group, "{s:?}");
                if s.state == "leader" {
                    return addr.clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "group {group} elects a leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replica `id` of metadata group 1, whose replicas are at `ones`, under `dir`.
fn group1_config(dir: &Path, id: u64, ones: &[String]) -> MetaConfig {
    MetaConfig { group: 1, ..config(&dir.join("group1"), id, ones) }
}

/// Metadata group 1 (three replicas) beside a one-replica group 0, started under a directory.
struct TwoGroups {
    /// Group 1's addresses and replicas, in id order.
    ones: Vec<String>,
    replicas: Vec<Replica>,
    /// Group 0's address, its replica serving.
    zero: Vec<String>,
    group0: Replica,
    /// Group 1's leader.
    leader: String,
}

async fn two_groups(dir: &Path) -> TwoGroups {
    let ones = free_addrs(3);
    let mut replicas = Vec::new();
    for id in 1..=3 {
        replicas.push(start(group1_config(dir, id, &ones)).await);
    }
    let zero = free_addrs(1);
    let group0 = start(config(&dir.join("group0"), 1, &zero)).await;
    serving_leader(&zero, 30).await;
    let leader = group_leader(&ones, 1, None).await;
    TwoGroups { ones, replicas, zero, group0, leader }
}

fn free_addrs(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

async fn mkdir(addr: &str, name: &str) -> Result<u64, CairnError> {
    let req = MkdirRequest {
        parent: 1,
        name: name.as_bytes().to_vec(),
        mode: 0o755,
        uid: 0,
        gid: 0,
        caller: None,
        once: None,
    };
    client(addr).await.mkdir(req).await.map(|r| r.into_inner().attr.unwrap().ino).map_err(CairnError::from)
}

async fn lookup(addr: &str, name: &str) -> Result<u64, CairnError> {
    let req = LookupRequest { parent: 1, name: name.as_bytes().to_vec(), caller: None };
    client(addr).await.lookup(req).await.map(|r| r.into_inner().attr.unwrap().ino).map_err(CairnError::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_serves_followers_redirect_and_a_new_leader_keeps_every_acknowledged_change() {
    let dir = TempDir::new().unwrap();
    let addrs = free_addrs(3);
    let mut replicas = Vec::new();
    for id in 1..=3 {
        replicas.push(start(config(dir.path(), id, &addrs)).await);
    }
    let leader = serving_leader(&addrs, 30).await;
    let mut made = Vec::new();
    for i in 0..20 {
        let name = format!("d{i}");
        made.push((name.clone(), mkdir(&leader, &name).await.unwrap()));
    }
    for addr in addrs.iter().filter(|a| **a != leader) {
        let e = mkdir(addr, "elsewhere").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotLeader, "{e:?}");
        assert!(e.message().contains(&leader), "the follower names the leader: {}", e.message());
    }

    // Stop the leader: another takes over and has every acknowledged directory.
    let index = addrs.iter().position(|a| *a == leader).unwrap();
    replicas[index].stop().await;
    let survivors: Vec<String> = addrs.iter().filter(|a| **a != leader).cloned().collect();
    let started = Instant::now();
    let second = serving_leader(&survivors, 30).await;
    eprintln!("failover took {:?}", started.elapsed());
    for (name, ino) in &made {
        assert_eq!(lookup(&second, name).await.unwrap(), *ino, "{name} after the failover");
    }
    // Inode numbers are never handed out twice across leaders.
    let next = mkdir(&second, "after").await.unwrap();
    assert!(made.iter().all(|(_, ino)| *ino != next));

    // The old leader comes back as a follower and catches up.
    replicas[index] = start(config(dir.path(), index as u64 + 1, &addrs)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(&leader).await;
        let leading = status(&second).await.unwrap();
        if let Some(s) = s {
            if s.state == "follower" && s.applied_index >= leading.applied_index && s.leader != 0 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the old leader did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in &mut replicas {
        r.stop().await;
    }

    // All three restarted: nothing acknowledged is lost.
    let mut replicas = Vec::new();
    for id in 1..=3 {
        replicas.push(start(config(dir.path(), id, &addrs)).await);
    }
    let third = serving_leader(&addrs, 30).await;
    for (name, ino) in made.iter().chain([("after".to_string(), next)].iter()) {
        assert_eq!(lookup(&third, name).await.unwrap(), *ino, "{name} after restarting all three");
    }
    for r in &mut replicas {
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_another_cluster_or_a_lone_metaserver_is_refused() {
    let dir = TempDir::new().unwrap();
    let addrs = free_addrs(1);
    let mut one = config(dir.path(), 1, &addrs);
    let mut replica = start(one.clone()).await;
    serving_leader(&addrs, 30).await;
    replica.stop().await;

    one.cluster = "other".into();
    let listener = tokio::net::TcpListener::bind(&one.listen).await.unwrap();
    let e = cairn_meta::serve(one.clone(), listener, async {}).await.unwrap_err();
    assert!(e.message().contains("belongs to cluster \"cairn\""), "{}", e.message());

    // The same directory opened by a metaserver without replicas.
    let mut alone = one.clone();
    alone.replicas.clear();
    let e = cairn_meta::open_namespace(&alone).err().expect("refused");
    assert!(e.message().contains("replicated namespace"), "{}", e.message());
}

/// A replica starts only on data `cairn meta init` made; one made to join waits to be caught
/// up and never founds a group, even as the only (lowest) member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_needs_its_data_made_and_one_made_to_join_never_founds() {
    let dir = TempDir::new().unwrap();
    let addrs = free_addrs(1);
    let one = config(dir.path(), 1, &addrs);
    let listener = tokio::net::TcpListener::bind(&one.listen).await.unwrap();
    let e = cairn_meta::serve(one.clone(), listener, async {}).await.unwrap_err();
    assert!(e.message().contains("holds no replica data"), "{}", e.message());
    assert!(!one.data_dir.exists(), "nothing was made");

    let made = cairn_meta::init(&one, true).unwrap();
    assert!(made.contains("waits for the running group"), "{made}");
    let again = cairn_meta::init(&one, true).unwrap_err();
    assert!(again.message().contains("not empty"), "{}", again.message());
    let mut replica = start(one.clone()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = status(&addrs[0]).await.expect("the replica answers");
    assert_eq!((s.leader, s.term, s.members.len()), (0, 0, 0), "no group was founded: {s:?}");
    replica.stop().await;

    // The same member made to found: it leads its one-replica group.
    std::fs::remove_dir_all(&one.data_dir).unwrap();
    let mut replica = start(one.clone()).await;
    serving_leader(&addrs, 30).await;
    replica.stop().await;
}

/// A Raft group of metadata group 1 beside group 0: it elects its own leader, serves the
/// namespace of its slots once group 0 shared the cluster's identity (and sends the cluster's
/// requests to group 0), group 0 will not take one of its replicas as a
/// member, group 0's group map takes it only as the replicas it is (and keeps it, and the empty
/// slots moved to it, through a restart; group 0 then answers requests in those slots
/// `WrongGroup` with the map's version), group 0's status warns when it loses its majority, and its data directory is
/// refused to a replica of group 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_metadata_group_elects_apart_and_refuses_what_is_not_its() {
    let dir = TempDir::new().unwrap();
    let TwoGroups { ones, mut replicas, zero, mut group0, leader } = two_groups(dir.path()).await;
    let group1 = |id| group1_config(dir.path(), id, &ones);
    // Before group 0 shares the cluster's identity, group 1's leader serves nothing yet and
    // its followers send clients to it.
    for addr in &ones {
        let e = lookup(addr, "anything").await.unwrap_err();
        if *addr == leader {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            assert!(e.message().contains("leads metadata group 1 but does not serve"), "{e}");
        } else {
            assert_eq!(e.kind(), ErrorKind::NotLeader, "{e}");
        }
    }
    let e = CairnError::from(client(&leader).await.list_nodes(Empty {}).await.unwrap_err());
    assert_eq!(e.kind(), ErrorKind::WrongGroup, "{e}");
    assert!(e.message().contains("the cluster's state"), "{e}");
    assert_eq!(status(&zero[0]).await.unwrap().group, 0);
    mkdir(&zero[0], "in-group-0").await.unwrap();

    // Group 0 takes no replica of group 1 as a member.
    let add = cairn_proto::RaftMemberRequest { id: 2, addr: ones[1].clone(), wait_ms: 2000 };
    let e = CairnError::from(client(&zero[0]).await.raft_add_member(add).await.unwrap_err());
    assert!(e.message().contains("group 1 of cluster \"cairn\""), "{e}");
    assert_eq!(status(&zero[0]).await.unwrap().members.len(), 1, "nothing was added");

    // Group 0's map: group 1 is added once each of its replicas answers as itself.
    let map = client(&zero[0]).await.get_group_map(Empty {}).await.unwrap().into_inner();
    assert_eq!(map.version, 0);
    assert_eq!(map.groups, vec![MetaGroup { group: 0, replicas: vec![format!("1={}", zero[0])] }]);
    assert!(map.slots.is_empty(), "every slot is group 0's");
    let named = |group, ids: &[usize]| MetaGroup {
        group,
        replicas: ids.iter().zip(&ones).map(|(id, addr)| format!("{id}={addr}")).collect(),
    };
    let group0_addr = zero[0].clone();
    let add = |group: MetaGroup| {
        let addr = group0_addr.clone();
        async move { client(&addr).await.add_group(group).await.map(|r| r.into_inner()).map_err(CairnError::from) }
    };
    let e = add(named(1, &[2, 1, 3])).await.unwrap_err();
    assert!(e.message().contains("is replica 2 of group 1 of cluster \"cairn\", not replica 1"), "{e}");
    let e = add(named(2, &[1, 2, 3])).await.unwrap_err();
    assert!(e.message().contains("not replica 1 of group 2"), "{e}");
    let e = add(MetaGroup { group: 1, replicas: vec![format!("1={}", free_addrs(1)[0])] }).await.unwrap_err();
    assert!(e.message().contains("does not answer"), "{e}");
    let e = add(MetaGroup { group: 4, replicas: vec![format!("1={}", zero[0])] }).await.unwrap_err();
    assert!(e.message().contains("not replica 1 of group 4"), "{e}");
    assert_eq!(client(&zero[0]).await.get_group_map(Empty {}).await.unwrap().into_inner().version, 0);
    let map = add(named(1, &[1, 2, 3])).await.unwrap();
    assert_eq!(map.version, 1);
    assert_eq!(map.groups.iter().map(|g| g.group).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(add(named(1, &[1, 2, 3])).await.unwrap().version, 1, "added again: no change");

    // Empty slots move to group 1 (slot 0, the root's, never; nor to a group not in the map);
    // group 0 then answers a request about an inode in one of them `WrongGroup`, with the
    // map's version, so a caller knows to refresh its map.
    let move_slots = |slots: Vec<u32>, group| {
        let addr = group0_addr.clone();
        async move {
            let req = MoveSlotsRequest { slots, group };
            client(&addr).await.move_slots(req).await.map(|r| r.into_inner()).map_err(CairnError::from)
        }
    };
    let e = move_slots(vec![0], 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = move_slots(vec![5], 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let map = move_slots((1..=9).collect(), 1).await.unwrap();
    assert_eq!(map.version, 2);
    assert_eq!(cairn_meta::groups::slot_counts(&map)[&1], 9);
    assert_eq!(map.groups[0].group, 0, "answered as GetGroupMap answers");
    let get_attr = |ino| {
        let addr = group0_addr.clone();
        async move { client(&addr).await.get_attr(InoRequest { ino }).await.map_err(CairnError::from) }
    };
    let in_slot_5 = (5u64 << cairn_common::ids::SLOT_SHIFT) | 2;
    let wrong = |e: CairnError| {
        assert_eq!(e.kind(), ErrorKind::WrongGroup, "{e}");
        assert_eq!(e.map_version(), Some(2), "{e}");
        assert!(e.message().contains("slot 5, which metadata group 1 owns"), "{e}");
    };
    wrong(get_attr(in_slot_5).await.unwrap_err());
    get_attr(1).await.unwrap();
    let remove =
        CairnError::from(client(&zero[0]).await.remove_group(GroupRequest { group: 1 }).await.unwrap_err());
    assert_eq!(remove.kind(), ErrorKind::NotEmpty, "{remove}");

    // Group 0's leader shares its map, with the cluster's identity, with group 1's leader (at
    // once after a change), which keeps it in its own replicated state; followers hold none.
    let held = |addr: String| async move { status(&addr).await.map_or(0, |s| s.map_version) };
    let holds = |addr: String, version: u64| async move {
        let deadline = Instant::now() + Duration::from_secs(15);
        while held(addr.clone()).await != version {
            assert!(
                Instant::now() < deadline,
                "{addr} holds group map version {version}: {:?}",
                status(&addr).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    holds(leader.clone(), 2).await;
    assert_eq!(held(zero[0].clone()).await, 2, "group 0's leader reports its own");
    // Holding the cluster's identity, group 1's leader serves the namespace of its slots:
    // nothing is in them (nothing allocates there yet); the root is group 0's; the cluster's
    // state (chunkservers, the map's changes, fsck) stays group 0's.
    let get_attr_at = |addr: String, ino| async move {
        client(&addr).await.get_attr(InoRequest { ino }).await.map_err(CairnError::from)
    };
    let served = |addr: String| async move {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match get_attr_at(addr.clone(), in_slot_5).await {
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    assert!(Instant::now() < deadline, "{addr} serves its slots: {e}")
                }
                other => return other.unwrap_err(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let e = served(leader.clone()).await;
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = get_attr_at(leader.clone(), 1).await.unwrap_err();
    assert_eq!((e.kind(), e.map_version()), (ErrorKind::WrongGroup, Some(2)), "{e}");
    assert!(e.message().contains("slot 0, which metadata group 0 owns"), "{e}");
    let e = mkdir(&leader, "d").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongGroup, "the parent, the root, is group 0's: {e}");
    let in_5 = MkdirRequest { parent: in_slot_5, name: b"d".to_vec(), mode: 0o755, ..Default::default() };
    let e = CairnError::from(client(&leader).await.mkdir(in_5).await.unwrap_err());
    assert_eq!(e.kind(), ErrorKind::NotFound, "no such parent in group 1's slots: {e}");
    for e in [
        client(&leader).await.check_namespace(CheckNamespaceRequest::default()).await.unwrap_err(),
        client(&leader).await.stat_fs(Empty {}).await.unwrap_err(),
        // Client ids are the cluster's, handed out by group 0.
        client(&leader).await.register_client(Empty {}).await.unwrap_err(),
    ] {
        assert_eq!(CairnError::from(e).kind(), ErrorKind::WrongGroup);
    }
    let follower = ones.iter().find(|a| **a != leader).unwrap().clone();
    assert_eq!(held(follower.clone()).await, 0);
    let share = |addr: String, map: GroupMap, cluster_id: &str| {
        let req = SharedGroupMap { map: Some(map), cluster_id: cluster_id.to_string() };
        async move {
            client(&addr).await.share_group_map(req).await.map(|r| r.into_inner()).map_err(CairnError::from)
        }
    };
    let other_cluster = "ffffffffffffffffffffffffffffffff";
    let e = share(zero[0].clone(), map.clone(), other_cluster).await.unwrap_err();
    assert!(e.message().contains("group 0 keeps the group map"), "{e}");
    let e = share(follower.clone(), map.clone(), other_cluster).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotLeader, "{e}");
    let e = share(leader.clone(), GroupMap { version: 99, ..map.clone() }, other_cluster).await.unwrap_err();
    let ours = e.message().split("belongs to cluster ").nth(1).and_then(|t| t.split(',').next()).unwrap();
    assert_eq!(ours.len(), 32, "{e}");
    let older = GroupMap { version: 1, slots: Vec::new(), ..map.clone() };
    assert_eq!(share(leader.clone(), older, ours).await.unwrap().version, 2, "an older map changes nothing");
    assert_eq!(held(leader.clone()).await, 2);

    // Kept in group 0's replicated state: the same after its leader restarts.
    group0.stop().await;
    group0 = start(config(&dir.path().join("group0"), 1, &zero)).await;
    serving_leader(&zero, 30).await;
    let again = client(&zero[0]).await.get_group_map(Empty {}).await.unwrap().into_inner();
    assert_eq!(again, map);
    wrong(get_attr(in_slot_5).await.unwrap_err());
    // Given back, so the group can be removed below.
    let map = move_slots((1..=9).collect(), 0).await.unwrap();
    assert_eq!((map.version, map.slots.len()), (3, 0));
    assert_eq!(get_attr(in_slot_5).await.unwrap_err().kind(), ErrorKind::NotFound);
    holds(leader.clone(), 3).await;
    let e = get_attr_at(leader.clone(), in_slot_5).await.unwrap_err();
    assert_eq!((e.kind(), e.map_version()), (ErrorKind::WrongGroup, Some(3)), "given back: {e}");
    // Group 1's next leader holds it too: it is in the group's log, not in one process; and it
    // serves the group's slots (none now) as soon as it leads, the identity already held.
    let at = ones.iter().position(|a| *a == leader).unwrap();
    replicas[at].stop().await;
    let next = group_leader(&ones, 1, Some(&leader)).await;
    holds(next.clone(), 3).await;
    let e = served(next).await;
    assert_eq!((e.kind(), e.map_version()), (ErrorKind::WrongGroup, Some(3)), "{e}");
    replicas[at] = start(group1(at as u64 + 1)).await;
    // Only group 0 keeps the map.
    let e = CairnError::from(client(&leader).await.get_group_map(Empty {}).await.unwrap_err());
    assert_eq!(e.kind(), ErrorKind::WrongGroup, "{e}");
    // A registered group that loses its majority is a health warning on group 0's status.
    let checks = || async {
        client(&zero[0]).await.cluster_status(Empty {}).await.unwrap().into_inner().health_checks
    };
    assert!(!checks().await.iter().any(|c| c.contains("metadata group")), "{:?}", checks().await);
    replicas[0].stop().await;
    replicas[1].stop().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client(&zero[0]).await.cluster_status(Empty {}).await.unwrap().into_inner();
        if status
            .health_checks
            .iter()
            .any(|c| c == "metadata group 1 has lost its majority: 1 of 3 replicas answer")
        {
            assert_ne!(status.health, "HEALTH_OK");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no warning of group 1's lost majority: {:?}",
            status.health_checks
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let removed = client(&zero[0]).await.remove_group(GroupRequest { group: 1 }).await.unwrap().into_inner();
    assert_eq!((removed.version, removed.groups.len()), (4, 1));
    assert!(
        !checks().await.iter().any(|c| c.contains("metadata group")),
        "a removed group is no longer reported: {:?}",
        checks().await
    );

    // A replica of group 0 started on a group 1 replica's data is refused.
    replicas[2].stop().await;
    let mut other = config(&dir.path().join("group1"), 3, &ones);
    other.group = 0;
    let listener = tokio::net::TcpListener::bind(&other.listen).await.unwrap();
    let e = cairn_meta::serve(other, listener, async {}).await.unwrap_err();
    assert!(e.message().contains("holds metadata group 1, not 0"), "{e}");

    for mut replica in replicas.into_iter().take(2) {
        replica.stop().await;
    }
    group0.stop().await;
}

/// A group that holds another cluster's identity (its replicas once served another cluster of
/// the same name) is registered — the Raft group answers as itself — but refuses group 0's map,
/// and group 0's status says so instead of reporting health.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_that_refuses_the_map_is_a_health_warning() {
    let dir = TempDir::new().unwrap();
    let TwoGroups { ones, replicas, zero, group0, leader } = two_groups(dir.path()).await;
    let other = SharedGroupMap {
        map: Some(GroupMap { version: 1, ..Default::default() }),
        cluster_id: "f".repeat(32),
    };
    client(&leader).await.share_group_map(other).await.unwrap();

    let group = MetaGroup {
        group: 1,
        replicas: ones.iter().enumerate().map(|(i, addr)| format!("{}={addr}", i + 1)).collect(),
    };
    client(&zero[0]).await.add_group(group).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = client(&zero[0]).await.cluster_status(Empty {}).await.unwrap().into_inner();
        let warned = status.health_checks.iter().any(|c| {
            c.starts_with("metadata group 1's leader was not given the group map")
                && c.contains(&format!("belongs to cluster {}", "f".repeat(32)))
        });
        if warned {
            assert_ne!(status.health, "HEALTH_OK");
            break;
        }
        assert!(Instant::now() < deadline, "no warning: {:?}", status.health_checks);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for mut replica in replicas.into_iter().chain([group0]) {
        replica.stop().await;
    }
}
