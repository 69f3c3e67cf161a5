//! One test suite run against every [`MetaStore`] backend.

use super::*;
use cairn_common::config::SyncMode;

fn suite(store: &dyn MetaStore) {
    // get / put / delete, and column families are separate key spaces.
    assert_eq!(store.get(Cf::Inodes, b"a").unwrap(), None);
    let mut b = Batch::new();
    b.put(Cf::Inodes, b"a".to_vec(), b"1".to_vec());
    b.put(Cf::Dentries, b"a".to_vec(), b"2".to_vec());
    store.write(b).unwrap();
    assert_eq!(store.get(Cf::Inodes, b"a").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(Cf::Dentries, b"a").unwrap(), Some(b"2".to_vec()));
    assert_eq!(store.get(Cf::Xattrs, b"a").unwrap(), None);

    // Later ops in a batch win; deletes apply.
    let mut b = Batch::new();
    b.put(Cf::Inodes, b"a".to_vec(), b"x".to_vec());
    b.delete(Cf::Inodes, b"a".to_vec());
    b.delete(Cf::Dentries, b"a".to_vec());
    b.put(Cf::Dentries, b"a".to_vec(), b"y".to_vec());
    store.write(b).unwrap();
    assert_eq!(store.get(Cf::Inodes, b"a").unwrap(), None);
    assert_eq!(store.get(Cf::Dentries, b"a").unwrap(), Some(b"y".to_vec()));

    // Scans are ordered, bounded, limited.
    let mut b = Batch::new();
    for i in [5u8, 1, 3, 2, 4, 0xff] {
        b.put(Cf::Stripes, vec![7, i], vec![i]);
    }
    b.put(Cf::Stripes, vec![8, 0], vec![0]);
    b.put(Cf::Stripes, vec![6, 9], vec![0]);
    store.write(b).unwrap();
    let all = store.scan(Cf::Stripes, &[7], &[8], 100).unwrap();
    let keys: Vec<u8> = all.iter().map(|(k, _)| k[1]).collect();
    assert_eq!(keys, vec![1, 2, 3, 4, 5, 0xff]);
    assert_eq!(all[0].1, vec![1]);
    let some = store.scan(Cf::Stripes, &[7, 3], &[8], 2).unwrap();
    assert_eq!(some.iter().map(|(k, _)| k[1]).collect::<Vec<_>>(), vec![3, 4]);
    let to_end = store.scan(Cf::Stripes, &[7, 0xff], &[], 100).unwrap();
    assert_eq!(to_end.len(), 2);
    assert!(store.scan(Cf::Stripes, &[8], &[7], 100).unwrap().is_empty());
    assert!(store.scan(Cf::Stripes, &[7], &[8], 0).unwrap().is_empty());
    assert_eq!(store.scan(Cf::Stripes, &[], &[], 100).unwrap().len(), 8);
    // An empty batch is fine.
    store.write(Batch::new()).unwrap();

    // A view reads one moment: writes made while it is in use do not show through it.
    store
        .with_view(&mut |view| {
            let before = view.scan(Cf::Stripes, &[7], &[8], 100)?;
            let mut b = Batch::new();
            b.delete(Cf::Stripes, vec![7, 1]);
            b.put(Cf::Stripes, vec![7, 6], vec![6]);
            b.put(Cf::Inodes, b"new".to_vec(), b"1".to_vec());
            store.write(b)?;
            assert_eq!(view.scan(Cf::Stripes, &[7], &[8], 100)?, before);
            assert_eq!(view.get(Cf::Inodes, b"new")?, None);
            assert_eq!(view.get(Cf::Stripes, &[7, 1])?, Some(vec![1]));
            assert_eq!(view.scan(Cf::Stripes, &[7, 3], &[8], 2)?.len(), 2);
            assert!(view.scan(Cf::Stripes, &[8], &[7], 100)?.is_empty());
            Ok(())
        })
        .unwrap();
    // ... and the store itself has them.
    assert_eq!(store.get(Cf::Inodes, b"new").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(Cf::Stripes, &[7, 1]).unwrap(), None);
}

#[test]
fn memory_store_passes_the_suite() {
    suite(&MemoryStore::new());
}

#[test]
fn rocks_store_passes_the_suite_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path(), SyncMode::Never).unwrap();
        suite(&store);
    }
    let store = RocksStore::open(dir.path(), SyncMode::Always).unwrap();
    assert_eq!(store.get(Cf::Dentries, b"a").unwrap(), Some(b"y".to_vec()));
    assert_eq!(store.scan(Cf::Stripes, &[7], &[8], 100).unwrap().len(), 6);
}

#[test]
fn rocks_store_refuses_a_second_open() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RocksStore::open(dir.path(), SyncMode::Never).unwrap();
    let err = RocksStore::open(dir.path(), SyncMode::Never).err().expect("second open must fail");
    assert!(err.message().contains("cannot open metadata database"), "{err}");
}

#[test]
fn commit_mode_group_commits_in_the_background_and_closes_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path(), SyncMode::Commit).unwrap();
        suite(&store);
        assert!(!store.syncs_every_write());
        // A plain write is answered before its fsync; the group-commit thread does it after.
        let before = store.background_syncs();
        let mut b = Batch::new();
        b.put(Cf::Inodes, b"later".to_vec(), b"1".to_vec());
        store.write(b).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.background_syncs() == before {
            assert!(std::time::Instant::now() < deadline, "no background fsync after a write");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A durable write and an explicit sync succeed; the reported property counts the thread's fsyncs.
        let mut b = Batch::new();
        b.put(Cf::Inodes, b"now".to_vec(), b"2".to_vec());
        b.set_durable();
        store.write(b).unwrap();
        store.sync().unwrap();
        let props = store.properties();
        let syncs = props.iter().find(|(n, _)| *n == "background_wal_syncs").unwrap().1;
        assert!(syncs >= 1);
    }
    // Dropping the store stops its thread and releases the database.
    let store = RocksStore::open(dir.path(), SyncMode::Always).unwrap();
    assert!(store.syncs_every_write());
    assert_eq!(store.get(Cf::Inodes, b"later").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(Cf::Inodes, b"now").unwrap(), Some(b"2".to_vec()));
    assert_eq!(store.background_syncs(), 0, "no group-commit thread when every write syncs");
}

fn put(store: &RocksStore, key: &[u8], durable: bool) -> Result<()> {
    let mut b = Batch::new();
    b.put(Cf::Inodes, key.to_vec(), b"v".to_vec());
    if durable {
        b.set_durable();
    }
    store.write(b)
}

fn lost(store: &RocksStore) -> u64 {
    store.properties().iter().find(|(n, _)| *n == "durability_lost").unwrap().1
}

#[test]
fn a_failed_group_commit_fsync_stops_every_later_change_until_reopened() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path(), SyncMode::Commit).unwrap();
        put(&store, b"before", false).unwrap();
        store.sync().unwrap();
        assert_eq!((lost(&store), store.durability_lost()), (0, None));
        store.fail_fsyncs();
        // Answered before its fsync (Commit mode); the thread's fsync then fails.
        put(&store, b"unsynced", false).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.durability_lost().is_none() {
            assert!(std::time::Instant::now() < deadline, "the failed background fsync was not noticed");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let reason = store.durability_lost().unwrap();
        assert!(reason.contains("group-commit fsync"), "{reason}");
        assert_eq!(lost(&store), 1);
        // Every later change and sync is refused with an I/O error naming why; reads go on.
        for durable in [false, true] {
            let e = put(&store, b"after", durable).unwrap_err();
            assert_eq!(e.kind(), cairn_common::ErrorKind::Io, "{e}");
            assert!(e.message().contains("refuses changes since the group-commit fsync"), "{e}");
        }
        assert!(store.sync().is_err());
        assert_eq!(store.get(Cf::Inodes, b"before").unwrap(), Some(b"v".to_vec()));
        assert_eq!(store.get(Cf::Inodes, b"after").unwrap(), None);
    }
    // A reopened store (a restarted metaserver) writes again.
    let store = RocksStore::open(dir.path(), SyncMode::Commit).unwrap();
    assert_eq!(store.durability_lost(), None);
    put(&store, b"after", true).unwrap();
    assert_eq!(store.get(Cf::Inodes, b"before").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn a_failed_synced_write_or_sync_stops_later_changes_in_every_mode() {
    for mode in [SyncMode::Always, SyncMode::Commit] {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), mode).unwrap();
        store.fail_fsyncs();
        let e = put(&store, b"durable", true).unwrap_err();
        assert_eq!(e.kind(), cairn_common::ErrorKind::Io, "{mode:?}: {e}");
        assert!(store.durability_lost().unwrap().contains("synced write"), "{mode:?}");
        assert!(put(&store, b"plain", false).is_err(), "{mode:?}: a change after the failure");
    }
    // An explicit sync (what GC does before deleting shards) that fails stops the store too.
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path(), SyncMode::Commit).unwrap();
    put(&store, b"queued", false).unwrap();
    store.fail_fsyncs();
    let e = store.sync().unwrap_err();
    assert_eq!(e.kind(), cairn_common::ErrorKind::Io, "{e}");
    assert!(put(&store, b"next", false).is_err());
}
