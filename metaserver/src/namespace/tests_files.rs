//! Stripe records: open, list, commit and truncate, and the shards they queue for gc.

use cairn_common::ErrorKind;
use cairn_proto::{SetAttrRequest, StripeInfo, Timespec};

use super::tests::{file, kind, layout, setup};
use super::*;

const STRIPE: u64 = 2 * 4096;

fn stripe(index: u64, version: u64, len: u64) -> StripeInfo {
    StripeInfo { index, version, len, written_len: len, missing: 0, ..Default::default() }
}

/// Every queued shard, in key order.
fn queued(ns: &Namespace) -> Vec<GcShard> {
    ns.store
        .scan(Cf::Gc, &[], &[], usize::MAX)
        .unwrap()
        .into_iter()
        .flat_map(|(_, v)| schema::decode::<GcEntry>("gc", &v).unwrap().shards)
        .collect()
}

fn truncate(ns: &Namespace, ino: u64, size: u64) -> Inode {
    ns.setattr(&SetAttrRequest { ino, size: Some(size), ..Default::default() }).unwrap()
}

#[test]
fn commit_publishes_stripes_and_grows_size() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let t = Timespec { sec: 77, nsec: 1 };
    let out = ns.commit(f.ino, STRIPE + 100, &[stripe(0, 5, STRIPE), stripe(1, 5, 100)], Some(&t)).unwrap();
    assert_eq!(out.size, STRIPE + 100);
    assert_eq!((out.mtime_sec, out.mtime_nsec), (77, 1));
    assert!(out.ctime_sec > 77);
    let (inode, stripes, more) = ns.open_file(f.ino).unwrap();
    assert_eq!(inode.size, STRIPE + 100);
    assert!(!more);
    assert_eq!(stripes, vec![stripe(0, 5, STRIPE), stripe(1, 5, 100)]);
    assert!(queued(&ns).is_empty());
    // Size never shrinks through commit.
    let out = ns.commit(f.ino, 10, &[], None).unwrap();
    assert_eq!(out.size, STRIPE + 100);
    assert_eq!(ns.stats().logical_bytes, (STRIPE + 100) as i64);
    // Same version again: nothing to collect.
    ns.commit(f.ino, 0, &[stripe(1, 5, 200)], None).unwrap();
    assert!(queued(&ns).is_empty());
}

#[test]
fn commit_queues_replaced_versions_on_their_nodes() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let l = f.layout();
    ns.commit(
        f.ino,
        100,
        &[StripeInfo {
            index: 1,
            version: 3,
            len: 100,
            written_len: 100,
            missing: 0b010,
            ..Default::default()
        }],
        None,
    )
    .unwrap();
    ns.commit(f.ino, 100, &[stripe(1, 4, 100)], None).unwrap();
    let mut shards = queued(&ns);
    shards.sort_by_key(|s| s.index);
    let want: Vec<GcShard> = [0u32, 2]
        .iter()
        .map(|&index| GcShard {
            node: f.placement[l.position(1, index)],
            ino: f.ino,
            stripe: 1,
            index,
            version: 3,
        })
        .collect();
    assert_eq!(shards, want, "shard 1 was missing, so only 0 and 2 are collected");
    assert_eq!(ns.pending_gc().unwrap(), 2);
}

#[test]
fn commit_validates_stripes() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let bad = [
        stripe(0, 0, 10),
        StripeInfo { index: 0, version: 1, len: 11, written_len: 10, missing: 0, ..Default::default() },
        stripe(0, 1, STRIPE + 1),
        StripeInfo { index: 0, version: 1, len: 1, written_len: 1, missing: 0b1000, ..Default::default() },
        StripeInfo { index: 0, version: 1, len: 1, written_len: 1, missing: 0b011, ..Default::default() },
        stripe(1 << 48, 1, 1),
    ];
    for s in bad {
        assert_eq!(
            kind(ns.commit(f.ino, 0, std::slice::from_ref(&s), None)),
            ErrorKind::InvalidArgument,
            "{s:?}"
        );
    }
    assert_eq!(
        kind(ns.commit(f.ino, 0, &[stripe(0, 1, 1), stripe(0, 2, 1)], None)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(ns.commit(f.ino, u64::MAX, &[], None)), ErrorKind::TooBig);
    let bad_time = Timespec { sec: 0, nsec: 1_000_000_000 };
    assert_eq!(kind(ns.commit(f.ino, 0, &[], Some(&bad_time))), ErrorKind::InvalidArgument);
    assert_eq!(kind(ns.commit(ROOT_INO, 0, &[], None)), ErrorKind::IsDir);
    assert_eq!(kind(ns.commit(999, 0, &[], None)), ErrorKind::NotFound);
    assert!(ns.open_file(f.ino).unwrap().1.is_empty(), "nothing was written by a rejected commit");
}

#[test]
fn open_pages_stripes() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let all: Vec<StripeInfo> = (0..5000).map(|i| stripe(i, 1, STRIPE)).collect();
    ns.commit(f.ino, 5000 * STRIPE, &all, None).unwrap();
    let (_, first, more) = ns.open_file(f.ino).unwrap();
    assert_eq!(first.len(), 4096);
    assert!(more);
    let (rest, more) = ns.list_stripes(f.ino, 4096, 0).unwrap();
    assert_eq!(rest.len(), 904);
    assert!(!more);
    assert_eq!(rest[0].index, 4096);
    let (some, more) = ns.list_stripes(f.ino, 10, 3).unwrap();
    assert_eq!(some.iter().map(|s| s.index).collect::<Vec<_>>(), vec![10, 11, 12]);
    assert!(more);
    assert_eq!(kind(ns.list_stripes(ROOT_INO, 0, 0)), ErrorKind::InvalidArgument);
}

#[test]
fn truncate_down_drops_and_clamps_stripes() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let stripes: Vec<StripeInfo> = (0..4).map(|i| stripe(i, 2, STRIPE)).collect();
    ns.commit(f.ino, 4 * STRIPE, &stripes, None).unwrap();
    // Up: only the size changes.
    assert_eq!(truncate(&ns, f.ino, 10 * STRIPE).size, 10 * STRIPE);
    assert_eq!(ns.open_file(f.ino).unwrap().1.len(), 4);
    // Down into stripe 1.
    let out = truncate(&ns, f.ino, STRIPE + 5);
    assert_eq!(out.size, STRIPE + 5);
    let (_, left, _) = ns.open_file(f.ino).unwrap();
    assert_eq!(
        left,
        vec![
            stripe(0, 2, STRIPE),
            StripeInfo {
                index: 1,
                version: 2,
                len: 5,
                written_len: STRIPE,
                missing: 0,
                ..Default::default()
            }
        ]
    );
    let q = queued(&ns);
    assert_eq!(q.len(), 2 * 3, "stripes 2 and 3, three shards each");
    assert!(q.iter().all(|s| s.stripe >= 2 && s.version == 2 && f.placement.contains(&s.node)));
    assert_eq!(ns.stats().logical_bytes, (STRIPE + 5) as i64);
    // Exactly at a stripe edge: stripe 1 goes, stripe 0 stays whole.
    truncate(&ns, f.ino, STRIPE);
    assert_eq!(ns.open_file(f.ino).unwrap().1, vec![stripe(0, 2, STRIPE)]);
    truncate(&ns, f.ino, 0);
    assert!(ns.open_file(f.ino).unwrap().1.is_empty());
    assert_eq!(queued(&ns).len(), 4 * 3);
    assert_eq!(ns.stats().logical_bytes, 0);
    let (fifo, _) = ns.create(&super::tests::new(ROOT_INO, "p", schema::S_IFIFO | 0o600), 0, false).unwrap();
    let r = ns.setattr(&SetAttrRequest { ino: fifo.ino, size: Some(0), ..Default::default() });
    assert_eq!(kind(r), ErrorKind::InvalidArgument);
}

#[test]
fn unlink_queues_every_stored_shard() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let stripes = vec![
        stripe(0, 7, STRIPE),
        StripeInfo { index: 1, version: 7, len: 10, written_len: 10, missing: 0b100, ..Default::default() },
    ];
    ns.commit(f.ino, STRIPE + 10, &stripes, None).unwrap();
    ns.unlink(ROOT_INO, b"f").unwrap();
    let q = queued(&ns);
    assert_eq!(q.len(), 5);
    let l = layout();
    for s in &q {
        assert_eq!(s.node, f.placement[l.position(s.stripe, s.index)]);
    }
    assert!(ns.store.scan(Cf::Stripes, &[], &[], 10).unwrap().is_empty());
    assert_eq!(ns.stats().logical_bytes, 0);
}

#[test]
fn unlinked_open_file_is_kept_until_released() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "open");
    ns.commit(f.ino, 100, &[stripe(0, 3, 100)], None).unwrap();
    ns.sessions().opened(9, "", f.ino, 0).unwrap();
    ns.unlink(ROOT_INO, b"open").unwrap();
    assert_eq!(kind(ns.lookup(ROOT_INO, b"open")), ErrorKind::NotFound);
    // Still there for its opener: attributes (nlink 0) and stripes, nothing queued.
    assert_eq!(ns.getattr(f.ino).unwrap().nlink, 0);
    assert_eq!(ns.open_file(f.ino).unwrap().1.len(), 1);
    assert!(queued(&ns).is_empty());
    // Not freed while open; freed at release.
    assert!(!ns.free_if_orphan(f.ino).unwrap());
    ns.sessions().released(9, f.ino, 0);
    assert!(ns.free_if_orphan(f.ino).unwrap());
    assert_eq!(kind(ns.getattr(f.ino)), ErrorKind::NotFound);
    assert!(!queued(&ns).is_empty(), "its shards go to gc");
    assert!(ns.store.scan(Cf::Orphans, &[], &[], usize::MAX).unwrap().is_empty());
}

#[test]
fn orphans_without_openers_are_freed_in_a_sweep() {
    let ns = setup();
    let a = file(&ns, ROOT_INO, "a");
    let b = file(&ns, ROOT_INO, "b");
    ns.sessions().opened(1, "", a.ino, 0).unwrap();
    ns.sessions().opened(2, "", b.ino, 0).unwrap();
    ns.unlink(ROOT_INO, b"a").unwrap();
    ns.unlink(ROOT_INO, b"b").unwrap();
    // Client 1 goes away (e.g. its session expired); client 2 still has b open.
    ns.sessions().released(1, a.ino, 0);
    assert_eq!(ns.free_orphans().unwrap(), 1);
    assert_eq!(kind(ns.getattr(a.ino)), ErrorKind::NotFound);
    assert_eq!(ns.getattr(b.ino).unwrap().nlink, 0);
}

#[test]
fn damage_reports_never_take_a_stripe_past_m_missing_shards() {
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    ns.commit(f.ino, STRIPE, &[stripe(0, 5, STRIPE)], None).unwrap();
    let id = |index| cairn_common::ShardId { ino: f.ino, stripe: 0, index, version: 5 };
    // m = 1: the first report is taken, a second shard of the same stripe is refused.
    assert_eq!(ns.mark_damaged(&[id(0)]).unwrap(), (1, vec![id(0)]));
    // The refused ones are not among those the reporter may delete.
    assert_eq!(ns.mark_damaged(&[id(1), id(2)]).unwrap(), (0, vec![]));
    assert_eq!(ns.stripe_record(f.ino, 0).unwrap().unwrap().missing, 0b001);
    // A report of another version, or of a shard already missing, changes nothing either.
    // (A shard already missing is reported back as missing: its reporter may delete it.)
    assert_eq!(
        ns.mark_damaged(&[cairn_common::ShardId { version: 4, ..id(1) }, id(0)]).unwrap(),
        (0, vec![id(0)])
    );
    assert_eq!(ns.stripe_record(f.ino, 0).unwrap().unwrap().missing, 0b001);
}

/// A stripe record keeps the content hashes its writer sent, through a truncation (which
/// leaves the shards as they are); a new version brings its own; hashes of any length but
/// none or `k` × 32 bytes are refused and change nothing.
#[test]
fn stripe_records_keep_their_writers_content_hashes() {
    use cairn_common::content::HASH_LEN;
    let ns = setup();
    let f = file(&ns, ROOT_INO, "f");
    let hashes = |seed: u8| vec![seed; 2 * HASH_LEN];
    let with = |version, len, seed| StripeInfo { hashes: hashes(seed).into(), ..stripe(0, version, len) };
    ns.commit(f.ino, STRIPE, &[with(1, STRIPE, 7)], None).unwrap();
    assert_eq!(ns.open_file(f.ino).unwrap().1[0].hashes.to_vec(), hashes(7));
    truncate(&ns, f.ino, 100);
    let (_, stripes, _) = ns.open_file(f.ino).unwrap();
    assert_eq!((stripes[0].len, stripes[0].hashes.to_vec()), (100, hashes(7)));
    ns.commit(f.ino, STRIPE, &[with(2, STRIPE, 9)], None).unwrap();
    assert_eq!(ns.open_file(f.ino).unwrap().1[0].hashes.to_vec(), hashes(9));
    for len in [1, HASH_LEN, 3 * HASH_LEN] {
        let bad = StripeInfo { hashes: vec![0; len].into(), ..stripe(0, 3, STRIPE) };
        assert_eq!(kind(ns.commit(f.ino, STRIPE, &[bad], None)), ErrorKind::InvalidArgument, "{len}");
    }
    assert_eq!(ns.open_file(f.ino).unwrap().1[0].version, 2, "a refused commit changes nothing");
}
