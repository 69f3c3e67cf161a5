//! The log store and state machine under openraft's own storage suite, and what the suite does
//! not cover: the effects of applied entries, snapshots between real databases, damaged or
//! hostile snapshots, and crashes in the middle of an install.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, RaftLogReader, RaftSnapshotBuilder};
use tempfile::TempDir;

use super::log::LogStore;
use super::state::{SmStore, StateMachine};
use super::{Command, Entry, LogId, Membership, StorageError, TypeConfig};
use crate::store::{Cf, MetaStore, Op};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = LogStore::open(dir.path()).expect("the log opens");
        let sm = StateMachine::open(dir.path()).expect("the state machine opens");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("openraft's storage suite passes");
}

fn id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn put(cf: Cf, key: &str, value: &str) -> Op {
    Op::Put { cf, key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec() }
}

fn effects(index: u64, ops: Vec<Op>) -> Entry {
    Entry { log_id: id(1, index), payload: EntryPayload::Normal(Command { ops }) }
}

fn membership(index: u64) -> Entry {
    let nodes: BTreeMap<u64, BasicNode> =
        (1..=3).map(|n| (n, BasicNode::new(format!("127.0.0.{n}:7000")))).collect();
    let voters: BTreeSet<u64> = nodes.keys().copied().collect();
    Entry { log_id: id(1, index), payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)) }
}

fn get(sm: &StateMachine, cf: Cf, key: &str) -> Option<String> {
    sm.store().current().get(cf, key.as_bytes()).unwrap().map(|v| String::from_utf8(v).unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Three entries applied to a fresh state machine in `dir`.
async fn applied_three(dir: &Path) -> StateMachine {
    let mut sm = StateMachine::open(dir).unwrap();
    sm.apply([
        membership(1),
        effects(2, vec![put(Cf::Inodes, "a", "1"), put(Cf::Dentries, "d", "x")]),
        effects(3, vec![put(Cf::Inodes, "a", "2"), Op::Delete { cf: Cf::Dentries, key: b"d".to_vec() }]),
    ])
    .await
    .unwrap();
    sm
}

#[test]
fn applied_effects_land_in_the_column_families_with_the_applied_id() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let mut sm = applied_three(dir.path()).await;
        assert_eq!(get(&sm, Cf::Inodes, "a").as_deref(), Some("2"), "a later op on a key wins");
        assert_eq!(get(&sm, Cf::Dentries, "d"), None);
        let (applied, members) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(id(1, 3)));
        assert_eq!(members.log_id(), &Some(id(1, 1)));

        // An entry that would overwrite the Raft state is refused, and nothing of it lands.
        let bad = effects(4, vec![put(Cf::Inodes, "b", "1"), put(Cf::Raft, "applied", "{}")]);
        assert!(sm.apply([bad]).await.is_err());
        assert_eq!(get(&sm, Cf::Inodes, "b"), None);
        assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 3)));

        // Reopened, the state machine is where it was.
        drop(sm);
        let mut sm = StateMachine::open(dir.path()).unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 3)));
        assert_eq!(get(&sm, Cf::Inodes, "a").as_deref(), Some("2"));
    });
}

#[test]
fn appended_entries_survive_a_reopen() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let entries = vec![membership(1), effects(2, vec![put(Cf::Inodes, "a", "1")])];
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            log.blocking_append(entries.clone()).await.unwrap();
        }
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(log.try_get_log_entries(0..10).await.unwrap(), entries);
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(id(1, 2)));
    });
}

fn effects_at(term: u64, index: u64, value: &str) -> Entry {
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Normal(Command { ops: vec![put(Cf::Inodes, "k", value)] }),
    }
}

async fn log_contents(log: &mut LogStore) -> (Vec<Entry>, Option<super::Vote>, Option<LogId>, Option<LogId>) {
    let state = log.get_log_state().await.unwrap();
    (
        log.try_get_log_entries(0..u64::MAX).await.unwrap(),
        log.read_vote().await.unwrap(),
        log.read_committed().await.unwrap(),
        state.last_purged_log_id,
    )
}

/// Small segments: appends roll over into new ones, a purge deletes the old ones, and after a
/// reopen the entries, the vote, the committed and the purged ids are what they were — the
/// vote and committed id written into segments since deleted included.
#[test]
fn the_log_rolls_over_segments_and_a_purge_deletes_old_ones_without_losing_the_state() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        log.save_vote(&super::Vote::new(3, 2)).await.unwrap();
        let value = "v".repeat(500);
        let entries: Vec<Entry> = (1..=40).map(|i| effects_at(3, i, &value)).collect();
        for chunk in entries.chunks(3) {
            log.blocking_append(chunk.to_vec()).await.unwrap();
        }
        log.save_committed(Some(id(3, 30))).await.unwrap();
        let before = log.segments();
        assert!(before.len() >= 5, "{before:?}");
        log.purge(id(3, 25)).await.unwrap();
        let after = log.segments();
        assert!(after.len() < before.len() && after[0] > before[0], "{before:?} -> {after:?}");
        let expect = log_contents(&mut log).await;
        assert_eq!(expect.0, entries[25..].to_vec());
        assert_eq!(expect.1, Some(super::Vote::new(3, 2)));
        assert_eq!(expect.3, Some(id(3, 25)));
        drop(log);
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        assert_eq!(log_contents(&mut log).await, expect);
        assert_eq!(log.read_committed().await.unwrap(), Some(id(3, 30)));
    });
}

/// A crash just after a new segment was made, before the state it starts with was written:
/// the empty segment is replaced at the next open, so a later purge of the older segments
/// keeps the vote, the purged id and the truncations they held.
#[test]
fn a_segment_cut_before_its_state_was_written_loses_nothing_to_a_later_purge() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        log.save_vote(&super::Vote::new(5, 1)).await.unwrap();
        let value = "v".repeat(500);
        let entries: Vec<Entry> = (1..=12).map(|i| effects_at(5, i, &value)).collect();
        log.blocking_append(entries.clone()).await.unwrap();
        log.truncate(id(5, 11)).await.unwrap();
        let last = *log.segments().last().unwrap();
        drop(log);
        fs::write(dir.path().join(format!("wal/{:016x}.seg", last + 1)), b"").unwrap();

        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        log.purge(id(5, 10)).await.unwrap();
        drop(log);
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(super::Vote::new(5, 1)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(id(5, 10)), Some(id(5, 10))));
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), vec![]);
    });
}

/// The log against a model of it, under a seeded random mix of appends, conflicting
/// appends after a truncation, purges, votes, committed ids and reopens, with 4 KiB segments
/// and entries of up to 3 KiB (so segments roll over, some sized for one entry): after every
/// step and every reopen, the entries, the vote, the committed and the purged ids are the
/// model's.
#[test]
fn the_log_matches_a_model_through_random_appends_truncations_purges_and_reopens() {
    use rand::{Rng, SeedableRng};
    runtime().block_on(async {
        for seed in 0..8u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let dir = TempDir::new().unwrap();
            let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
            let (mut entries, mut vote, mut committed, mut purged): (Vec<Entry>, _, _, Option<LogId>) =
                (Vec::new(), None, None, None);
            let mut term = 1;
            let make = |rng: &mut rand::rngs::StdRng, term: u64, index: u64| {
                effects_at(term, index, &"e".repeat(rng.gen_range(10..3000)))
            };
            for step in 0..300 {
                let last = entries.last().map(|e| e.log_id.index).or(purged.map(|p| p.index)).unwrap_or(0);
                let first = purged.map(|p| p.index + 1).unwrap_or(1);
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let new: Vec<Entry> = (last + 1..=last + rng.gen_range(1..5))
                            .map(|i| make(&mut rng, term, i))
                            .collect();
                        log.blocking_append(new.clone()).await.unwrap();
                        entries.extend(new);
                    }
                    4 if last >= first => {
                        let at = rng.gen_range(first..=last);
                        let cut = entries[(at - first) as usize].log_id;
                        log.truncate(cut).await.unwrap();
                        entries.truncate((at - first) as usize);
                        term += 1;
                        if rng.gen_bool(0.7) {
                            let new: Vec<Entry> =
                                (at..at + rng.gen_range(1..4)).map(|i| make(&mut rng, term, i)).collect();
                            log.blocking_append(new.clone()).await.unwrap();
                            entries.extend(new);
                        }
                    }
                    5 if last >= first => {
                        let upto = rng.gen_range(first..=last);
                        let id = entries[(upto - first) as usize].log_id;
                        log.purge(id).await.unwrap();
                        entries.drain(..=(upto - first) as usize);
                        purged = Some(id);
                    }
                    6 => {
                        term += 1;
                        let v = super::Vote::new(term, rng.gen_range(1..4));
                        log.save_vote(&v).await.unwrap();
                        vote = Some(v);
                    }
                    7 if !entries.is_empty() => {
                        let c = entries[rng.gen_range(0..entries.len())].log_id;
                        log.save_committed(Some(c)).await.unwrap();
                        committed = Some(c);
                    }
                    8 | 9 => {
                        drop(log);
                        log = LogStore::open_with(dir.path(), 4096).unwrap();
                    }
                    _ => {}
                }
                let got = log_contents(&mut log).await;
                assert_eq!(got.0, entries, "seed {seed} step {step}: entries");
                assert_eq!((got.1, got.2, got.3), (vote, committed, purged), "seed {seed} step {step}");
                let state = log.get_log_state().await.unwrap();
                let last_id = entries.last().map(|e| e.log_id).or(purged);
                assert_eq!(state.last_log_id, last_id, "seed {seed} step {step}: last log id");
            }
            if let Some(last) = entries.last() {
                log.purge(last.log_id).await.unwrap();
            }
            assert_eq!(log.segments().len(), 1, "a purge of everything leaves the segment written");
        }
    });
}

/// A follower's log truncated and appended again by a new leader: after a reopen, entries of
/// the old term past the truncation stay gone, whether or not the new ones reach as far.
#[test]
fn truncated_entries_stay_gone_after_a_reopen() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        let old: Vec<Entry> = (1..=8).map(|i| effects_at(1, i, "old")).collect();
        log.blocking_append(old.clone()).await.unwrap();
        log.truncate(id(1, 5)).await.unwrap();
        drop(log);
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), old[..4].to_vec());
        let new: Vec<Entry> = (5..=6).map(|i| effects_at(2, i, "new")).collect();
        log.blocking_append(new.clone()).await.unwrap();
        let expect: Vec<Entry> = old[..4].iter().chain(&new).cloned().collect();
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), expect);
        drop(log);
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), expect);
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(id(2, 6)));
    });
}

/// Write a log as builds before the segment files did: a RocksDB with column families `log`
/// (index big-endian -> entry) and `meta` (vote, committed, purged as JSON).
fn rocksdb_log(dir: &Path, entries: &[Entry], vote: &super::Vote, committed: LogId, purged: LogId) {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let db = rocksdb::DB::open_cf(&opts, dir.join("log"), ["log", "meta"]).unwrap();
    for entry in entries {
        db.put_cf(
            db.cf_handle("log").unwrap(),
            entry.log_id.index.to_be_bytes(),
            super::codec::encode(entry),
        )
        .unwrap();
    }
    let meta = db.cf_handle("meta").unwrap();
    db.put_cf(meta, b"vote", serde_json::to_vec(vote).unwrap()).unwrap();
    db.put_cf(meta, b"committed", serde_json::to_vec(&Some(committed)).unwrap()).unwrap();
    db.put_cf(meta, b"purged", serde_json::to_vec(&purged).unwrap()).unwrap();
}

/// A replica directory of an earlier build (the log in RocksDB) opens with its log, vote,
/// committed and purged ids converted; the old database is gone afterwards. A conversion cut
/// short (its `wal.new/` left behind) is done again, and an old database left beside a
/// finished conversion is deleted.
#[test]
fn a_rocksdb_log_of_an_earlier_build_is_converted() {
    runtime().block_on(async {
        let dir = TempDir::new().unwrap();
        let entries: Vec<Entry> = (11..=20).map(|i| effects_at(4, i, "x")).collect();
        let vote = super::Vote::new_committed(4, 1);
        rocksdb_log(dir.path(), &entries, &vote, id(4, 18), id(4, 10));
        // A conversion that was stopped half-way.
        fs::create_dir_all(dir.path().join("wal.new")).unwrap();
        fs::write(dir.path().join("wal.new/0000000000000001.seg"), b"half").unwrap();

        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        let expect = (entries.clone(), Some(vote), Some(id(4, 18)), Some(id(4, 10)));
        assert_eq!(log_contents(&mut log).await, expect);
        assert!(!dir.path().join("log").exists() && !dir.path().join("wal.new").exists());
        log.blocking_append(vec![effects_at(4, 21, "y")]).await.unwrap();
        drop(log);

        // An old database beside the converted log (deleted after the rename) is not read.
        rocksdb_log(dir.path(), &entries[..2], &super::Vote::new(9, 9), id(4, 12), id(4, 10));
        let mut log = LogStore::open_with(dir.path(), 4096).unwrap();
        let (got, got_vote, _, _) = log_contents(&mut log).await;
        assert_eq!(got.len(), 11);
        assert_eq!(got_vote, Some(vote));
        assert!(!dir.path().join("log").exists());
    });
}

#[test]
fn a_snapshot_carries_the_whole_state_to_another_replica() {
    runtime().block_on(async {
        let (leader_dir, follower_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
        let mut leader = applied_three(leader_dir.path()).await;
        // Enough keys that the checkpoint holds real SST files.
        let many: Vec<Op> =
            (0..5000).map(|i| put(Cf::Stripes, &format!("k{i:05}"), &"v".repeat(100))).collect();
        leader.apply([effects(4, many)]).await.unwrap();
        let snapshot = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(id(1, 4)));
        // Applying goes on after the snapshot; the snapshot does not see it.
        leader.apply([effects(5, vec![put(Cf::Inodes, "late", "1")])]).await.unwrap();

        let mut follower = StateMachine::open(follower_dir.path()).unwrap();
        follower.apply([effects(1, vec![put(Cf::Inodes, "stale", "1")])]).await.unwrap();
        let current = leader.get_current_snapshot().await.unwrap().unwrap();
        follower.install_snapshot(&current.meta, current.snapshot).await.unwrap();
        assert_eq!(follower.applied_state().await.unwrap().0, Some(id(1, 4)));
        assert_eq!(get(&follower, Cf::Inodes, "a").as_deref(), Some("2"));
        assert_eq!(get(&follower, Cf::Stripes, "k04999").map(|v| v.len()), Some(100));
        assert_eq!(get(&follower, Cf::Inodes, "stale"), None, "the old state is gone");
        assert_eq!(get(&follower, Cf::Inodes, "late"), None);
        assert_eq!(follower.get_current_snapshot().await.unwrap().unwrap().meta, current.meta);

        // After a restart the follower has the installed state and the snapshot.
        drop(follower);
        let mut follower = StateMachine::open(follower_dir.path()).unwrap();
        assert_eq!(follower.applied_state().await.unwrap().0, Some(id(1, 4)));
        assert_eq!(follower.get_current_snapshot().await.unwrap().unwrap().meta, current.meta);
        let leftovers: Vec<_> =
            fs::read_dir(follower_dir.path().join("snapshots")).unwrap().flatten().collect();
        assert_eq!(leftovers.len(), 1, "one snapshot file and nothing else: {leftovers:?}");
    });
}

/// The state machine is written without RocksDB's WAL (the Raft log is its log): what a crash
/// leaves is the state of its last flush — a snapshot's, here — whole, with that state's
/// applied id, never part of a later entry; openraft re-applies the rest from the log.
#[test]
fn a_crash_leaves_the_state_machine_at_its_last_flush_whole() {
    runtime().block_on(async {
        let (dir, crashed) = (TempDir::new().unwrap(), TempDir::new().unwrap());
        let mut sm = applied_three(dir.path()).await;
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(id(1, 3)));
        sm.apply([
            effects(4, vec![put(Cf::Inodes, "a", "4"), put(Cf::Dentries, "d", "4")]),
            effects(5, vec![put(Cf::Inodes, "b", "5"), Op::Delete { cf: Cf::Inodes, key: b"a".to_vec() }]),
        ])
        .await
        .unwrap();
        assert_eq!(get(&sm, Cf::Inodes, "b").as_deref(), Some("5"));
        // What a killed process leaves on disk: the files as they are now.
        copy_dir(&dir.path().join("sm"), &crashed.path().join("sm"));
        drop(sm);
        let mut after = StateMachine::open(crashed.path()).unwrap();
        assert_eq!(after.applied_state().await.unwrap().0, Some(id(1, 3)), "the snapshot's flush");
        assert_eq!(get(&after, Cf::Inodes, "a").as_deref(), Some("2"));
        assert_eq!(get(&after, Cf::Dentries, "d"), None);
        assert_eq!(get(&after, Cf::Inodes, "b"), None);

        // A clean close flushes: reopened, everything applied is there.
        let mut sm = StateMachine::open(dir.path()).unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 5)));
        assert_eq!(get(&sm, Cf::Inodes, "b").as_deref(), Some("5"));
    });
}

/// A snapshot file of `leader`, changed by `damage`, installed on a follower: refused, and the
/// follower's state is untouched.
async fn refused(damage: impl Fn(&mut Vec<u8>)) -> String {
    let (leader_dir, follower_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let mut leader = applied_three(leader_dir.path()).await;
    let snapshot = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let path = fs::read_dir(leader_dir.path().join("snapshots")).unwrap().flatten().next().unwrap().path();
    let mut bytes = fs::read(&path).unwrap();
    damage(&mut bytes);
    let mut follower = StateMachine::open(follower_dir.path()).unwrap();
    follower.apply([effects(1, vec![put(Cf::Inodes, "mine", "1")])]).await.unwrap();
    let mut incoming = follower.begin_receiving_snapshot().await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut *incoming, &bytes).await.unwrap();
    let error = follower.install_snapshot(&snapshot.meta, incoming).await.unwrap_err().to_string();
    assert_eq!(get(&follower, Cf::Inodes, "mine").as_deref(), Some("1"), "{error}");
    assert_eq!(follower.applied_state().await.unwrap().0, Some(id(1, 1)));
    assert!(!follower_dir.path().join("sm.install").exists());
    error
}

#[test]
fn damaged_or_hostile_snapshots_are_refused_and_change_nothing() {
    runtime().block_on(async {
        let error = refused(|b| b[0] = b'X').await;
        assert!(error.contains("magic"), "{error}");
        let error = refused(|b| b.truncate(b.len() - 10)).await;
        assert!(error.contains("truncated") || error.contains("fill whole buffer"), "{error}");
        let error = refused(|b| b.push(0)).await;
        assert!(error.contains("after the snapshot"), "{error}");
        // The first file's name made to climb out of the directory.
        let error = refused(|b| {
            let meta_len = u32::from_be_bytes(b[9..13].try_into().unwrap()) as usize;
            let name_at = 13 + meta_len + 4 + 2;
            b[name_at..name_at + 3].copy_from_slice(b"../");
        })
        .await;
        assert!(error.contains("not a plain file name"), "{error}");
    });
}

#[test]
fn an_install_interrupted_by_a_crash_is_finished_or_dropped_at_the_next_open() {
    runtime().block_on(async {
        // Crash before the marker: sm.new is dropped, the old state stays.
        let dir = TempDir::new().unwrap();
        drop(applied_three(dir.path()).await);
        fs::create_dir(dir.path().join("sm.new")).unwrap();
        fs::write(dir.path().join("sm.new/junk"), b"half a snapshot").unwrap();
        let mut sm = StateMachine::open(dir.path()).unwrap();
        assert!(!dir.path().join("sm.new").exists());
        assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 3)));
        drop(sm);

        // Crash after the marker, at each step of the swap: the new state wins every time.
        for step in 0..3 {
            let (dir, other) = (TempDir::new().unwrap(), TempDir::new().unwrap());
            drop(applied_three(dir.path()).await);
            let mut newer = StateMachine::open(other.path()).unwrap();
            newer.apply([effects(9, vec![put(Cf::Inodes, "new", "1")])]).await.unwrap();
            let sm_path = other.path().join("sm");
            drop(newer);
            copy_dir(&sm_path, &dir.path().join("sm.new"));
            fs::write(dir.path().join("sm.install"), b"{}").unwrap();
            if step >= 1 {
                fs::rename(dir.path().join("sm"), dir.path().join("sm.old")).unwrap();
            }
            if step >= 2 {
                fs::rename(dir.path().join("sm.new"), dir.path().join("sm")).unwrap();
            }
            let mut sm = StateMachine::open(dir.path()).unwrap();
            assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 9)), "step {step}");
            assert_eq!(get(&sm, Cf::Inodes, "new").as_deref(), Some("1"), "step {step}");
            for gone in ["sm.new", "sm.old", "sm.install"] {
                assert!(!dir.path().join(gone).exists(), "step {step}: {gone} left");
            }
        }
    });
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for item in fs::read_dir(from).unwrap().flatten() {
        fs::copy(item.path(), to.join(item.file_name())).unwrap();
    }
}

#[test]
fn the_state_machine_store_is_usable_while_open() {
    let dir = TempDir::new().unwrap();
    let store = SmStore::open(dir.path()).unwrap();
    assert_eq!(store.current().get(Cf::Inodes, b"x").unwrap(), None);
}

#[test]
fn a_backup_restores_as_a_new_group_or_a_lone_namespace_and_nothing_is_overwritten() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let sm = rt.block_on(applied_three(&dir.path().join("source")));
    let (meta, mut file, size) = super::state::pack_copy(sm.store()).unwrap();
    assert_eq!(meta.last_log_id.map(|id| id.index), Some(3));
    assert!(
        fs::read_dir(dir.path().join("source/snapshots")).unwrap().next().is_none(),
        "nothing left behind"
    );
    let backup = dir.path().join("meta.backup");
    let copied = std::io::copy(&mut file, &mut fs::File::create(&backup).unwrap()).unwrap();
    assert_eq!(copied, size);

    // As the state machine of a new group of two: its data, the backup's index, the new members.
    let members: BTreeMap<u64, String> =
        [(4, "10.0.0.4:9400".to_string()), (5, "10.0.0.5:9400".to_string())].into();
    let group = dir.path().join("group");
    fs::create_dir_all(&group).unwrap();
    assert_eq!(super::state::restore(&backup, &group.join("sm"), Some((4, &members)), 0).unwrap(), 3);
    let restored = StateMachine::open(&group).unwrap();
    assert_eq!(get(&restored, Cf::Inodes, "a"), get(&sm, Cf::Inodes, "a"));
    assert_eq!(get(&restored, Cf::Inodes, "a").as_deref(), Some("2"));
    let (applied, membership) = rt.block_on(async {
        let mut restored = restored;
        restored.applied_state().await.unwrap()
    });
    assert_eq!(applied, Some(LogId::new(CommittedLeaderId::new(0, 4), 3)));
    assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), vec![4, 5]);
    assert_eq!(membership.membership().get_node(&5).unwrap().addr, "10.0.0.5:9400");

    // As a lone metaserver's database: the data without the Raft state.
    let lone = dir.path().join("lone");
    assert_eq!(super::state::restore(&backup, &lone, None, 0).unwrap(), 3);
    let db = crate::store::RocksStore::open(&lone, cairn_common::config::SyncMode::Never).unwrap();
    assert!(db.get(Cf::Inodes, b"a").unwrap().is_some());
    assert!(db.get(Cf::Raft, b"applied").unwrap().is_none());
    drop(db);

    // Never over an existing database; a truncated backup is refused and leaves nothing.
    let e = super::state::restore(&backup, &lone, None, 0).unwrap_err();
    assert!(e.message().contains("exists"), "{e}");
    let bytes = fs::read(&backup).unwrap();
    fs::write(&backup, &bytes[..bytes.len() - 10]).unwrap();
    let other = dir.path().join("other");
    let e = super::state::restore(&backup, &other, None, 0).unwrap_err();
    assert!(e.message().contains("not a whole Cairn metadata backup"), "{e}");
    assert!(!other.exists() && !other.with_extension("restoring").exists());
}

#[test]
fn a_backup_says_which_group_it_holds_and_restores_only_into_that_group() {
    use super::node::GROUP_FILE;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let pack = |sm: &StateMachine, name: &str| {
        let (_, mut file, _) = super::state::pack_copy(sm.store()).unwrap();
        let backup = dir.path().join(name);
        std::io::copy(&mut file, &mut fs::File::create(&backup).unwrap()).unwrap();
        backup
    };
    let replica_dir = |name: &str, group: u32| {
        let raft = dir.path().join(name);
        fs::create_dir_all(&raft).unwrap();
        fs::write(raft.join(GROUP_FILE), format!("{group}\n")).unwrap();
        raft
    };
    let members: BTreeMap<u64, String> = [(1, "10.0.0.1:9400".to_string())].into();
    let one = rt.block_on(applied_three(&replica_dir("source-1", 1)));
    let zero = rt.block_on(applied_three(&dir.path().join("source-0")));
    let (of_one, of_zero) = (pack(&one, "g1.backup"), pack(&zero, "g0.backup"));

    // Group 1's backup goes neither into a replica of group 0 nor into a lone metaserver.
    let wrong = replica_dir("wrong", 0);
    let e = super::state::restore(&of_one, &wrong.join("sm"), Some((1, &members)), 0).unwrap_err();
    assert!(
        e.message().contains("is a backup of metadata group 1: restore it into a replica of group 1"),
        "{e}"
    );
    assert!(!wrong.join("sm").exists() && !wrong.join("sm.restoring").exists());
    let e = super::state::restore(&of_one, &dir.path().join("lone"), None, 0).unwrap_err();
    assert!(e.message().contains("backup of metadata group 1"), "{e}");
    // Nor group 0's (made before groups had numbers, as this one's state machine) into group 2's.
    let e = super::state::restore(&of_zero, &replica_dir("two", 2).join("sm"), Some((1, &members)), 2)
        .unwrap_err();
    assert!(e.message().contains("backup of metadata group 0"), "{e}");

    // Into group 1's replica it restores, and says so in turn.
    let right = replica_dir("right", 1);
    assert_eq!(super::state::restore(&of_one, &right.join("sm"), Some((1, &members)), 1).unwrap(), 3);
    let restored = StateMachine::open(&right).unwrap();
    assert_eq!(get(&restored, Cf::Inodes, "a").as_deref(), Some("2"));
    let again = pack(&restored, "again.backup");
    let e = super::state::restore(&again, &wrong.join("sm"), Some((1, &members)), 0).unwrap_err();
    assert!(e.message().contains("backup of metadata group 1"), "{e}");
    drop(restored);

    // A state machine whose group disagrees with its directory's stamp is damage.
    fs::write(right.join(GROUP_FILE), "0\n").unwrap();
    let e = StateMachine::open(&right).err().expect("refused");
    assert!(
        e.message().contains("holds metadata group 1's data, but the directory is stamped group 0"),
        "{e}"
    );
}

/// A one-replica group in `dir`, leading and caught up.
fn lone_leader(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> std::sync::Arc<super::node::RaftNode> {
    use super::node::{RaftNode, RaftSettings};
    let settings = RaftSettings {
        id: 1,
        members: BTreeMap::from([(1, "127.0.0.1:9".to_string())]),
        name: super::network::GroupName::new("test", 0),
        dir: dir.join("raft"),
        heartbeat: std::time::Duration::from_millis(50),
        election: std::time::Duration::from_millis(300),
        write_timeout: std::time::Duration::from_secs(10),
        snapshot_every: 100_000,
    };
    rt.block_on(async {
        let node = RaftNode::start(settings).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !node.is_leader() {
            assert!(std::time::Instant::now() < deadline, "a one-replica group elects itself");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        node.caught_up().await.unwrap();
        node
    })
}

/// Changes written at once by many threads through a one-replica group: every one lands whole,
/// and they share log entries (group commit, `proposals.rs`) instead of one entry each.
#[test]
fn concurrent_changes_share_entries_and_each_lands_whole() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let node = lone_leader(&rt, dir.path());
    let before = node.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let store = node.store();
    let (threads, each) = (16, 25);
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = store.clone();
            s.spawn(move || {
                for i in 0..each {
                    let mut batch = crate::store::Batch::new();
                    batch.put(Cf::Inodes, format!("{t}/{i}/a"), format!("{t}.{i}"));
                    batch.put(Cf::Dentries, format!("{t}/{i}/b"), format!("{t}.{i}"));
                    store.write(batch).unwrap();
                }
            });
        }
    });
    for t in 0..threads {
        for i in 0..each {
            let want = Some(format!("{t}.{i}").into_bytes());
            assert_eq!(store.get(Cf::Inodes, format!("{t}/{i}/a").as_bytes()).unwrap(), want);
            assert_eq!(store.get(Cf::Dentries, format!("{t}/{i}/b").as_bytes()).unwrap(), want);
        }
    }
    let entries = node.raft.metrics().borrow().last_log_index.unwrap_or(0) - before;
    assert!(
        entries < (threads * each) as u64,
        "{} changes took {entries} log entries: none were grouped",
        threads * each
    );
    rt.block_on(node.shutdown());
}

/// Read-modify-writes of one key under one lock, as creates in one directory are (the
/// directory's inode lock): inside a change (`MetaStore::begin_change`, which the namespace
/// opens under its locks) each is answered once proposed, so the lock is let go before the
/// commit and the next reads the proposed value through the leader overlay. None is lost, and
/// they share log entries — with the lock held until each was applied, every one took an entry
/// of its own.
#[test]
fn changes_under_one_lock_read_each_others_proposals_and_share_entries() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let node = lone_leader(&rt, dir.path());
    let before = node.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let store = node.store();
    let lock = parking_lot::Mutex::new(());
    let (threads, each) = (16, 25);
    let count = |store: &dyn MetaStore| -> u64 {
        store.get(Cf::Counters, b"n").unwrap().map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()))
    };
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, lock) = (store.clone(), &lock);
            s.spawn(move || {
                for i in 0..each {
                    store.begin_change();
                    {
                        let _held = lock.lock();
                        let mut batch = crate::store::Batch::new();
                        batch.put(Cf::Counters, &b"n"[..], (count(&*store) + 1).to_be_bytes());
                        batch.put(Cf::Inodes, format!("{t}/{i}"), "x");
                        store.write(batch).unwrap();
                    }
                    store.end_change().unwrap();
                    // Answered: applied here, so a read outside any change sees it.
                    assert!(store.get(Cf::Inodes, format!("{t}/{i}").as_bytes()).unwrap().is_some());
                }
            });
        }
    });
    assert_eq!(count(&*store), (threads * each) as u64, "an update was lost");
    let entries = node.raft.metrics().borrow().last_log_index.unwrap_or(0) - before;
    assert!(
        entries < (threads * each) as u64 / 2,
        "{} changes under one lock took {entries} log entries: each waited for the one before",
        threads * each
    );
    rt.block_on(node.shutdown());
}

/// A replica's data directory names its cluster and group: another group's (or another
/// cluster's) is refused, one stamped before groups had numbers holds group 0, and a damaged
/// stamp is reported as damage.
#[test]
fn a_data_directory_is_refused_to_another_group_and_one_from_before_groups_is_group_0s() {
    use super::network::GroupName;
    use super::node::{stamp_dir, CLUSTER_FILE, GROUP_FILE};
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join("fresh");
    stamp_dir(&fresh, &GroupName::new("c1", 3)).unwrap();
    assert_eq!(std::fs::read_to_string(fresh.join(GROUP_FILE)).unwrap().trim(), "3");
    stamp_dir(&fresh, &GroupName::new("c1", 3)).unwrap();
    let err = stamp_dir(&fresh, &GroupName::new("c1", 0)).unwrap_err();
    assert!(err.message().contains("holds metadata group 3, not 0"), "{err}");
    let err = stamp_dir(&fresh, &GroupName::new("c2", 3)).unwrap_err();
    assert!(err.message().contains("belongs to cluster \"c1\""), "{err}");

    // Made by a build before groups: a cluster stamp only.
    let older = tmp.path().join("older");
    std::fs::create_dir_all(&older).unwrap();
    std::fs::write(older.join(CLUSTER_FILE), "c1\n").unwrap();
    let err = stamp_dir(&older, &GroupName::new("c1", 2)).unwrap_err();
    assert!(err.message().contains("holds metadata group 0, not 2"), "{err}");
    assert!(!older.join(GROUP_FILE).exists(), "a refused start stamps nothing");
    stamp_dir(&older, &GroupName::new("c1", 0)).unwrap();
    assert_eq!(std::fs::read_to_string(older.join(GROUP_FILE)).unwrap().trim(), "0");

    std::fs::write(fresh.join(GROUP_FILE), "three\n").unwrap();
    let err = stamp_dir(&fresh, &GroupName::new("c1", 3)).unwrap_err();
    assert_eq!(err.kind(), cairn_common::ErrorKind::Corrupt, "{err}");
}
