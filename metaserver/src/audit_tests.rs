//! The content audit against a fake chunkserver on 127.0.0.1:0 (and a node that is gone).

use std::sync::Arc;

use cairn_common::{Layout, ROOT_INO};
use cairn_proto::StripeInfo;

use super::*;
use crate::fake_chunk::{dead_addr, fake_chunkserver};
use crate::fixture::Fixture;
use crate::namespace::NewEntry;
use crate::schema::S_IFREG;

/// The record's content hashes of stripe `stripe`: two data shards of 2+1.
fn hashes(stripe: u64) -> Vec<u8> {
    (0..2 * HASH_LEN).map(|i| i as u8 ^ (stripe as u8).wrapping_mul(77)).collect()
}

#[tokio::test]
async fn the_audit_asks_about_stored_data_shards_and_marks_what_does_not_match() {
    let (addr, fake) = fake_chunkserver().await;
    let dead = dead_addr().await;
    let ns = Arc::new(Fixture::memory(Layout::new(2, 1, 4096).unwrap()));
    let reg = ns.registry().clone();
    reg.register("a", &addr, vec![], 0, "").unwrap();
    reg.register("b", &addr, vec![], 0, "").unwrap();
    let gone = reg.register("c", &dead, vec![], 0, "").unwrap();
    let new = NewEntry { parent: ROOT_INO, name: b"f", mode: S_IFREG | 0o644, uid: 0, gid: 0 };
    let f = ns.create(&new, 0, true).unwrap().0;
    // Two whole stripes and a short one, whose second data shard was never stored.
    let stripes: Vec<StripeInfo> = (0..3)
        .map(|i| {
            let len = if i < 2 { 8192 } else { 10 };
            StripeInfo { index: i, version: 9, len, written_len: len, missing: 0, hashes: hashes(i).into() }
        })
        .collect();
    ns.commit(f.ino, 2 * 8192 + 10, &stripes, None).unwrap();
    let layout = f.layout();
    let node_of = |(stripe, index): (u64, u32)| f.placement[layout.position(stripe, index)];
    let stored = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)];
    let live: Vec<(u64, u32)> = stored.into_iter().filter(|s| node_of(*s) != gone).collect();
    let (bad_stripe, bad_index) = live[0];
    fake.corrupt.lock().push(cairn_proto::ShardId {
        ino: f.ino,
        stripe: bad_stripe,
        index: bad_index,
        version: 9,
    });

    let audit = Audit::new(ns.ns.clone(), ns.cluster.clone(), 1_000_000);
    let pass = audit.pass().await.unwrap();
    let n = live.len() as u64;
    assert_eq!(pass, AuditPass { checked: n, damaged: 1, skipped: stored.len() as u64 - n });

    // Each stored data shard on a node that answers, once, with its record's hash, headers only.
    let checks = fake.checks.lock().clone();
    assert!(checks.iter().all(|r| !r.verify && r.ids.len() == r.hashes.len()), "{checks:?}");
    let mut asked: Vec<(u64, u32, Vec<u8>)> = checks
        .iter()
        .flat_map(|r| r.ids.iter().zip(&r.hashes).map(|(id, h)| (id.stripe, id.index, h.clone())))
        .collect();
    asked.sort();
    let at = |i: u32| i as usize * HASH_LEN..(i as usize + 1) * HASH_LEN;
    let want: Vec<(u64, u32, Vec<u8>)> =
        live.iter().map(|&(s, i)| (s, i, hashes(s)[at(i)].to_vec())).collect();
    assert_eq!(asked, want);

    // The shard that does not match is marked missing for the repair; nothing else is.
    let (records, _) = ns.list_stripes(f.ino, 0, 10).unwrap();
    for r in &records {
        let expect = if r.index == bad_stripe { 1 << bad_index } else { 0 };
        assert_eq!(r.missing, expect, "{r:?}");
    }
    // The next pass leaves the marked shard to the repair.
    fake.checks.lock().clear();
    let again = audit.pass().await.unwrap();
    assert_eq!((again.checked, again.damaged), (n - 1, 0));
}
