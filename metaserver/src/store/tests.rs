//! One test suite run against every [`MetaStore`] backend.

use super::*;

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
}

#[test]
fn memory_store_passes_the_suite() {
    suite(&MemoryStore::new());
}

#[test]
fn rocks_store_passes_the_suite_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path(), false).unwrap();
        suite(&store);
    }
    let store = RocksStore::open(dir.path(), true).unwrap();
    assert_eq!(store.get(Cf::Dentries, b"a").unwrap(), Some(b"y".to_vec()));
    assert_eq!(store.scan(Cf::Stripes, &[7], &[8], 100).unwrap().len(), 6);
}

#[test]
fn rocks_store_refuses_a_second_open() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RocksStore::open(dir.path(), false).unwrap();
    let err = RocksStore::open(dir.path(), false).err().expect("second open must fail");
    assert!(err.message().contains("cannot open metadata database"), "{err}");
}
