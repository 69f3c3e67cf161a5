//! The namespace replicated over three metaservers (`cairn up --meta-replicas 3`): a frozen
//! leader is replaced and comes back as a follower, a replica whose data was lost catches up
//! from a snapshot, and with a majority gone changes fail with `EIO` and resume when it returns.
//! The leader killed again and again under load is in `tests/faults.rs`; the in-process
//! failover, restart and refusal tests in `metaserver/tests/replicated.rs`.

mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{eventually, kill9, restart_server, Cluster, KillOnDrop, Mount};

/// `cairn meta status --json` (whatever its exit code).
fn meta_status(cluster: &Cluster) -> serde_json::Value {
    let out = cluster.cli(&["meta", "status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// The replica that leads: its id.
fn leader(cluster: &Cluster) -> Option<u64> {
    meta_status(cluster)["leader"].as_u64()
}

/// One replica's row of `cairn meta status`.
fn replica(cluster: &Cluster, id: u64) -> serde_json::Value {
    let status = meta_status(cluster);
    status["replicas"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"].as_u64() == Some(id)).cloned())
        .unwrap_or_default()
}

fn meta_pid(cluster: &Cluster, id: u64) -> u32 {
    cluster.nodes.iter().find(|n| n.role == "meta" && n.id == id.to_string()).expect("replica").pid
}

fn three(extra_env: &[(&str, &str)]) -> Cluster {
    Cluster::start_env(6, "4+2", 64, &["--meta-replicas", "3"], extra_env)
}

fn wait_for_leader(cluster: &Cluster) -> u64 {
    let mut found = None;
    eventually(30, "a leader is known", || {
        found = leader(cluster);
        found.is_some()
    });
    found.unwrap()
}

/// Every chunkserver heartbeats to the current leader (a new one hears from them within a
/// heartbeat or two; until then it counts them down).
fn healthy(cluster: &Cluster) {
    eventually(30, "cairn status says HEALTH_OK", || cluster.cli(&["status"]).status.code() == Some(0));
}

fn fsck_clean(cluster: &Cluster) {
    healthy(cluster);
    let out = cluster.cli(&["fsck", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "cairn fsck: {report}");
    assert_eq!(report["namespace"]["problems"].as_array().map(Vec::len), Some(0), "{report}");
}

/// SIGSTOP, SIGCONT when dropped (a failing test leaves no stopped process behind).
struct Frozen(Option<u32>);

impl Frozen {
    fn thaw(&mut self) {
        if let Some(pid) = self.0.take() {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.thaw();
    }
}

#[test]
fn a_frozen_leader_is_replaced_and_comes_back_as_a_follower() {
    let cluster = three(&[]);
    for i in 0..20 {
        fs::write(cluster.mnt.join(format!("before-{i}")), format!("file {i}")).unwrap();
    }
    let old = wait_for_leader(&cluster);
    let pid = meta_pid(&cluster, old);
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let mut frozen = Frozen(Some(pid));

    // The mount goes on: the next change waits for a new leader, no error reaches the writer.
    let started = Instant::now();
    fs::create_dir(cluster.mnt.join("during")).unwrap();
    for i in 0..20 {
        fs::write(cluster.mnt.join(format!("during/{i}")), format!("during {i}")).unwrap();
    }
    println!("first change with the leader frozen took {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    let new = wait_for_leader(&cluster);
    assert_ne!(new, old, "the frozen replica cannot lead");
    assert!(replica(&cluster, old)["error"].is_string(), "the frozen replica does not answer");

    // Thawed, it learns of the new term, follows, and catches up with what it missed.
    frozen.thaw();
    eventually(30, "the old leader follows the new one with everything applied", || {
        let me = replica(&cluster, old);
        let lead = replica(&cluster, new);
        let (Some(mine), Some(theirs)) = (me["applied_index"].as_u64(), lead["applied_index"].as_u64())
        else {
            return false;
        };
        me["state"] == "follower" && me["leader"].as_u64() == Some(new) && mine + 2 >= theirs
    });
    let out = cluster.cli(&["meta", "status"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));

    let fresh = Mount::new(&cluster, "fresh");
    for i in 0..20 {
        assert_eq!(fs::read_to_string(fresh.dir.join(format!("before-{i}"))).unwrap(), format!("file {i}"));
        assert_eq!(fs::read_to_string(fresh.dir.join(format!("during/{i}"))).unwrap(), format!("during {i}"));
    }
    fsck_clean(&cluster);
}

#[test]
fn a_replica_whose_data_was_lost_catches_up_from_a_snapshot() {
    // Snapshots every 50 entries: the log the lost replica would need is long gone.
    let mut cluster = three(&[("CAIRN_META_RAFT_SNAPSHOT_EVERY", "50")]);
    for i in 0..150 {
        fs::write(cluster.mnt.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    // Replica 1 founded the group: emptied, it must not found another (if it led, another
    // replica takes over first).
    let lost = 1;
    kill9(meta_pid(&cluster, lost));
    let lead = wait_for_leader(&cluster);
    assert_ne!(lead, lost);
    fs::remove_dir_all(cluster.data.join(format!("meta-{lost}/db"))).unwrap();
    let mut back = KillOnDrop(Some(restart_server(&cluster, "meta", &format!("meta-{lost}"))));
    eventually(60, "the replica with new data catches up from a snapshot", || {
        let me = replica(&cluster, lost);
        let leading = replica(&cluster, lead);
        let (Some(mine), Some(theirs)) = (me["applied_index"].as_u64(), leading["applied_index"].as_u64())
        else {
            return false;
        };
        me["state"] == "follower"
            && me["snapshot_index"].as_u64().is_some_and(|i| i > 0)
            && mine + 2 >= theirs
    });
    let log =
        fs::read_to_string(cluster.data.join(format!("logs/meta-{lost}-restarted.log"))).unwrap_or_default();
    assert!(!log.contains("founded the metadata Raft group"), "the emptied replica founded a second group");

    // With it back, another replica may go: two of three still serve.
    let other = (1..=3).find(|id| *id != lost && *id != lead).unwrap();
    kill9(meta_pid(&cluster, other));
    fs::write(cluster.mnt.join("after"), "after").unwrap();
    for i in 0..150 {
        assert_eq!(fs::read_to_string(cluster.mnt.join(format!("f{i}"))).unwrap(), format!("file {i}"));
    }

    // The whole cluster stopped and started again: nothing acknowledged is lost.
    drop(back.0.take().map(|mut c| {
        let _ = c.kill();
        c.wait()
    }));
    cluster.stop();
    cluster.restart();
    assert_eq!(fs::read_to_string(cluster.mnt.join("after")).unwrap(), "after");
    for i in 0..150 {
        assert_eq!(fs::read_to_string(cluster.mnt.join(format!("f{i}"))).unwrap(), format!("file {i}"));
    }
    fsck_clean(&cluster);
}

#[test]
fn with_a_majority_of_metaservers_gone_changes_fail_and_resume_when_it_returns() {
    let cluster = three(&[]);
    fs::write(cluster.mnt.join("kept"), "kept").unwrap();
    let lead = wait_for_leader(&cluster);
    let gone: Vec<u64> = std::iter::once(lead).chain((1..=3).filter(|id| *id != lead).take(1)).collect();
    for id in &gone {
        kill9(meta_pid(&cluster, *id));
    }
    // A change waits for a leader, bounded, then fails with EIO: never a wrong answer, never a
    // hang.
    let started = Instant::now();
    let e = fs::create_dir(cluster.mnt.join("no-majority")).unwrap_err();
    let waited = started.elapsed();
    println!("mkdir without a majority failed after {waited:?}: {e}");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(waited >= Duration::from_secs(20) && waited < Duration::from_secs(60), "{waited:?}");
    let out = cluster.cli(&["meta", "status"]);
    assert_eq!(out.status.code(), Some(3), "no leader: {}", String::from_utf8_lossy(&out.stdout));

    // The majority back: the mount goes on as before, and the failed change was not made.
    let _back: Vec<KillOnDrop> = gone
        .iter()
        .map(|id| KillOnDrop(Some(restart_server(&cluster, "meta", &format!("meta-{id}")))))
        .collect();
    wait_for_leader(&cluster);
    fs::create_dir(cluster.mnt.join("majority-back")).unwrap();
    assert_eq!(fs::read_to_string(cluster.mnt.join("kept")).unwrap(), "kept");
    assert!(!Path::new(&cluster.mnt.join("no-majority")).exists());
    fsck_clean(&cluster);
}
