//! The garbage collector against a fake chunkserver on 127.0.0.1:0.

use std::sync::Arc;

use cairn_common::{Layout, ROOT_INO};
use cairn_proto::*;

use super::*;
use crate::fake_chunk::{dead_addr, fake_chunkserver};
use crate::namespace::NewEntry;
use crate::schema::S_IFREG;

/// Each opening of a namespace (a new leader's, a restart's) has a higher epoch than the last,
/// also when the clock says otherwise.
#[test]
fn every_opening_raises_the_namespace_epoch() {
    let store: Arc<dyn crate::store::MetaStore> = Arc::new(crate::store::MemoryStore::new());
    let layout = Layout::new(2, 1, 4096).unwrap();
    let open = || crate::fixture::Fixture::open(store.clone(), layout).fence();
    let first = open();
    let since_1970 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!(first >= since_1970.as_millis() as u64 - 1_000, "{first}");
    let second = open();
    assert!(second > first);
    // A group whose epochs ran ahead of the clock (a replica's clock jumped) still goes up.
    let mut batch = crate::store::Batch::new();
    let ahead = second + 10_000_000_000;
    batch.put(Cf::Counters, schema::counter::GC_EPOCH, schema::encode(&schema::Counter { value: ahead }));
    store.write(batch).unwrap();
    assert_eq!(open(), ahead + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_on_up_nodes_and_keeps_the_rest() {
    let (addr, fake) = fake_chunkserver().await;
    let dead = dead_addr().await;
    let ns = Arc::new(crate::fixture::Fixture::memory(Layout::new(2, 1, 4096).unwrap()));
    let reg = ns.registry().clone();
    let a = reg.register("a", &addr, vec![], 0, "").unwrap();
    let b = reg.register("b", &addr, vec![], 0, "").unwrap();
    let c = reg.register("c", &dead, vec![], 0, "").unwrap();
    let new = NewEntry { parent: ROOT_INO, name: b"f", mode: S_IFREG | 0o644, uid: 0, gid: 0 };
    let f = ns.create(&new, 0, true).unwrap().0;
    let stripes: Vec<StripeInfo> = (0..3)
        .map(|i| StripeInfo {
            index: i,
            version: 9,
            len: 10,
            written_len: 10,
            missing: 0,
            ..Default::default()
        })
        .collect();
    ns.commit(f.ino, 3 * 8192, &stripes, None).unwrap();
    ns.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(ns.pending_gc().unwrap(), 9);

    let gc = Gc::new(ns.ns.clone(), ns.cluster.clone());
    let round = gc.run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 6, dropped: 0, pending: 3 });
    let mut deleted = fake.deleted.lock().clone();
    deleted.sort_by_key(|s| (s.stripe, s.index));
    assert_eq!(deleted.len(), 6);
    let layout = f.layout();
    for s in &deleted {
        assert_eq!(s.ino, f.ino);
        assert_eq!(s.version, 9);
        let node = f.placement[layout.position(s.stripe, s.index)];
        assert!(node == a || node == b);
    }
    // The failing node's shards stay queued, round after round.
    assert_eq!(ns.pending_gc().unwrap(), 3);
    assert_eq!(gc.run_once().await.unwrap().pending, 3);
    assert_eq!(ns.pending_gc().unwrap(), 3);

    // Once the node comes back at a working address, they are deleted.
    reg.heartbeat(c, &addr, vec![], 0, "").unwrap();
    let round = gc.run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 3, dropped: 0, pending: 0 });
    assert_eq!(ns.pending_gc().unwrap(), 0);
    assert_eq!(fake.deleted.lock().len(), 9);
    assert_eq!(gc.run_once().await.unwrap(), GcRound::default());
    // Every delete carried the namespace's epoch, so a chunkserver can refuse a deposed one's.
    assert!(ns.fence() > 0);
    assert!(fake.fences.lock().iter().all(|f| *f == ns.fence()), "{:?}", fake.fences.lock());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_of_unknown_nodes_are_dropped() {
    let ns = Arc::new(crate::fixture::Fixture::memory(Layout::new(2, 1, 4096).unwrap()));
    let mut batch = Batch::new();
    let entry = GcEntry { shards: vec![GcShard { node: 42, ino: 5, stripe: 0, index: 0, version: 1 }] };
    batch.put(Cf::Gc, schema::gc_key(0, 0), schema::encode(&entry));
    ns.store().write(batch).unwrap();
    let round = Gc::new(ns.ns.clone(), ns.cluster.clone()).run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 0, dropped: 1, pending: 0 });
    assert_eq!(ns.pending_gc().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_deletes_only_unreferenced_old_shards() {
    let (addr, fake) = fake_chunkserver().await;
    let ns = Arc::new(crate::fixture::Fixture::memory_with_lease(
        Layout::new(2, 1, 4096).unwrap(),
        std::time::Duration::from_millis(1),
    ));
    let reg = ns.registry().clone();
    // One real node (the fake) and two others; the file is placed on all three.
    let a = reg.register("a", &addr, vec![], 0, "").unwrap();
    reg.register("b", "127.0.0.1:1", vec![], 0, "").unwrap();
    reg.register("c", "127.0.0.1:2", vec![], 0, "").unwrap();
    let new = NewEntry { parent: ROOT_INO, name: b"f", mode: S_IFREG | 0o644, uid: 0, gid: 0 };
    let (inode, _) = ns.create(&new, 0, false).unwrap();
    let version = (3u64 << 32) | 1;
    let info = StripeInfo { index: 0, version, len: 100, written_len: 100, missing: 0, ..Default::default() };
    ns.commit(inode.ino, 100, &[info], None).unwrap();
    let layout = inode.layout();
    let here = (0..3).find(|&i| inode.placement[layout.position(0, i)] == a).unwrap();
    let not_here = (here + 1) % 3;
    let entry = |index: u32, version: u64, age_ms: u64| ShardEntry {
        id: Some(cairn_proto::ShardId { ino: inode.ino, stripe: 0, index, version }),
        bytes: 100,
        age_ms,
    };
    let old = 60_000;
    *fake.held.lock() = vec![
        entry(here, version, old),          // referenced
        entry(not_here, version, old),      // a copy the placement puts elsewhere
        entry(here, (9u64 << 32) | 5, old), // uncommitted, writer 9 has no session
        entry(here, (9u64 << 32) | 6, 10),  // the same, but too young
        // An inode number handed out before and gone: stale past the unknown-inode grace.
        ShardEntry {
            id: Some(cairn_proto::ShardId { ino: 999, stripe: 0, index: 0, version }),
            bytes: 7,
            age_ms: old,
        },
        // One this namespace never handed out: foreign, kept unless asked.
        ShardEntry {
            id: Some(cairn_proto::ShardId { ino: ns.inos_reserved_end() + 10, stripe: 0, index: 0, version }),
            bytes: 11,
            age_ms: old,
        },
    ];
    assert!(999 < ns.inos_reserved_end());
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let repair = crate::repair::Repair::new(
        ns.ns.clone(),
        ns.cluster.clone(),
        std::time::Duration::from_secs(60),
        1 << 20,
    )
    .with_orphan_grace(std::time::Duration::from_secs(30))
    .with_unknown_inode_grace(std::time::Duration::from_secs(50));
    let dry = repair.reconcile(true, false).await;
    assert_eq!((dry.checked, dry.stale, dry.deleted, dry.foreign), (6, 3, 0, 1), "{dry:?}");
    assert!(fake.deleted.lock().is_empty());
    let done = repair.reconcile(false, false).await;
    assert_eq!((done.stale, done.deleted, done.stale_bytes), (3, 3, 207), "{done:?}");
    assert_eq!((done.foreign, done.foreign_bytes, done.foreign_nodes.clone()), (1, 11, vec![a]), "{done:?}");
    let mut deleted: Vec<(u64, u32, u64)> =
        fake.deleted.lock().iter().map(|d| (d.ino, d.index, d.version)).collect();
    deleted.sort();
    let mut want =
        vec![(inode.ino, not_here, version), (inode.ino, here, (9u64 << 32) | 5), (999, 0, version)];
    want.sort();
    assert_eq!(deleted, want, "the foreign shard is kept");
    assert_eq!(ns.repair_state().lock().stale_shards_deleted, 3);
    assert_eq!(ns.repair_state().lock().foreign_shards, 1);
    // Asked to, it goes too (the fake still lists everything it was given).
    let asked = repair.reconcile(false, true).await;
    assert_eq!((asked.foreign, asked.deleted), (1, 4), "{asked:?}");
    assert!(fake.deleted.lock().iter().any(|d| d.ino == ns.inos_reserved_end() + 10));
    // Two of the chunkservers could not be asked (nothing listens there): they may still hold
    // foreign shards, so the count (and the warning) stays until a run reaches every one.
    assert_eq!(asked.errors.len(), 2, "{asked:?}");
    assert_eq!(ns.repair_state().lock().foreign_shards, 1);
}

/// A group other than 0 deletes its unlinked files' shards on group 0's chunkservers (as its
/// registry mirrors them), naming itself and its own epoch, which chunkservers check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_group_deletes_its_own_shards_under_its_own_fence() {
    let (addr, fake) = fake_chunkserver().await;
    let store: Arc<dyn crate::store::MetaStore> = Arc::new(crate::store::MemoryStore::new());
    let cluster = crate::cluster::Cluster::open(
        store.clone(),
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(30),
    )
    .unwrap();
    let map = Arc::new(crate::groups::Groups::open(store.clone()).unwrap());
    let mut owners = vec![0u32; crate::groups::SLOTS];
    owners[5] = 3;
    let group = MetaGroup { group: 3, replicas: vec!["1=127.0.0.1:1".into()] };
    map.adopt(
        GroupMap { version: 2, groups: vec![group], slots: owners, ..Default::default() },
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    let nodes: Vec<NodeInfo> = (1..=3)
        .map(|id| NodeInfo { id, addr: addr.clone(), up: true, state: "active".into(), ..Default::default() })
        .collect();
    cluster.registry().mirror(&nodes);
    let ns = Arc::new(Namespace::open_slots(store.clone(), (3, map), 77, cluster.clone()).unwrap());

    // A directory in slot 5 (as a cross-group mkdir will make one; planted above the numbers
    // the slot's counter hands out here), a file in it, unlinked.
    let top = (5u64 << cairn_common::ids::SLOT_SHIFT) | (1 << 40);
    let mut dir = schema::Inode::new(top, schema::S_IFDIR | 0o755, 0, 0, &cairn_common::time::now());
    dir.nlink = 2;
    dir.set_layout(Layout::new(2, 1, 4096).unwrap());
    let mut batch = Batch::new();
    batch.put(Cf::Inodes, schema::ino_key(top), schema::encode(&dir));
    store.write(batch).unwrap();
    let new = NewEntry { parent: top, name: b"f", mode: S_IFREG | 0o644, uid: 0, gid: 0 };
    let f = ns.create(&new, 0, true).unwrap().0;
    let stripe = StripeInfo { index: 0, version: 4, len: 10, written_len: 10, ..Default::default() };
    ns.commit(f.ino, 8192, &[stripe], None).unwrap();
    ns.unlink(top, b"f").unwrap();

    let round = Gc::new(ns.clone(), cluster).run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 3, dropped: 0, pending: 0 });
    assert!(fake.deleted.lock().iter().all(|s| s.ino == f.ino && cairn_common::ids::slot_of(s.ino) == 5));
    assert_eq!(*fake.groups.lock(), [3; 3], "one delete per node, each naming the group");
    assert_eq!(*fake.fences.lock(), [77; 3]);
}
