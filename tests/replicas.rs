//! The namespace replicated over three metaservers (`cairn up --meta-replicas 3`): a frozen
//! leader is replaced and comes back as a follower, a replica whose data was lost catches up
//! from a snapshot, and with a majority gone changes fail with `EIO` and resume when it returns;
//! every replica times its commits' parts (log appends, appends to followers); clients changing
//! one directory share commits (the leader overlay) and stay consistent through failed commits.
//! The leader killed again and again under load is in `tests/faults.rs`; the in-process
//! failover, restart and refusal tests in `metaserver/tests/replicated.rs`.

mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{cli_on, eventually, fsck_clean, kill9, restart_server, Cluster, KillOnDrop, Mount};

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

/// What a commit is made of is exported: every replica times its log appends, and the leader
/// each append's round trip to each follower; appends travel over the wire protocol.
fn commits_are_timed(cluster: &Cluster, leader: u64) {
    let metrics = |id: u64| {
        let node =
            cluster.nodes.iter().find(|n| n.role == "meta" && n.id == id.to_string()).expect("replica");
        support::scrape(node.metrics.as_deref().expect("the replica serves metrics"))
    };
    for id in 1..=3u64 {
        let text = metrics(id);
        let appends = support::metric(&text, "cairn_meta_raft_log_append_seconds_count", &[]);
        assert!(appends.unwrap_or(0.0) > 0.0, "replica {id} timed no log append");
        if id != leader {
            // Appends come over the wire protocol (fewer hand-offs than gRPC), none over gRPC.
            let over = |transport: &str| {
                let labels = ["method=\"RaftAppend\"", transport];
                support::metric(&text, "cairn_rpc_requests_total", &labels).unwrap_or(0.0)
            };
            assert!(over("transport=\"wire\"") > 0.0, "replica {id} got no append over the wire");
            assert_eq!(over("transport=\"grpc\""), 0.0, "replica {id} got appends over gRPC");
        }
        if id == leader {
            for member in (1..=3u64).filter(|m| *m != leader) {
                let label = format!("member=\"{member}\"");
                let sent = support::metric(&text, "cairn_meta_raft_append_rpc_seconds_count", &[&label]);
                assert!(sent.unwrap_or(0.0) > 0.0, "the leader timed no append to replica {member}");
            }
        }
    }
}

/// `cairn meta groups`: one group, 0, with every slot, its three replicas and its leader; a
/// group whose replicas do not answer is not added.
fn groups_are_listed(cluster: &Cluster, leader: u64) {
    let (code, map) = support::cli_json(cluster, &["meta", "groups"]);
    assert_eq!(code, 0, "{map}");
    assert_eq!(map["version"], 0, "{map}");
    let groups = map["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{map}");
    assert_eq!((groups[0]["group"].as_u64(), groups[0]["slots"].as_u64()), (Some(0), Some(4096)), "{map}");
    assert_eq!(groups[0]["replicas"].as_array().unwrap().len(), 3, "{map}");
    assert_eq!(groups[0]["leader"].as_u64(), Some(leader), "{map}");
    let nowhere = format!("1={}", support::free_addr());
    let (code, out) = cli_on(cluster, &cluster.meta_addr, &["meta", "groups", "add", "1", &nowhere]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("does not answer"), "{out}");
}

#[test]
fn a_frozen_leader_is_replaced_and_comes_back_as_a_follower() {
    let cluster = three(&[]);
    for i in 0..20 {
        fs::write(cluster.mnt.join(format!("before-{i}")), format!("file {i}")).unwrap();
    }
    let old = wait_for_leader(&cluster);
    commits_are_timed(&cluster, old);
    groups_are_listed(&cluster, old);
    // Every chunkserver has heard the leader's namespace epoch, below which it refuses deletes.
    let fences = || -> Vec<u64> {
        (1..=6)
            .map(|i| {
                let path = cluster.data.join(format!("chunk-{i}/fence"));
                fs::read_to_string(path).map_or(0, |t| t.trim().parse().unwrap())
            })
            .collect()
    };
    eventually(10, "every chunkserver knows the leader's epoch", || fences().iter().all(|f| *f > 0));
    let before = fences();
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
    // The chunkservers now refuse the frozen leader's deletes: its epoch is below the new one's.
    let highest = *before.iter().max().unwrap();
    eventually(10, "every chunkserver knows the new leader's epoch", || {
        fences().iter().all(|f| *f > highest)
    });

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
    // The leader tells the operator which replica it no longer hears from.
    let quiet = format!("metaserver replica {lost} (");
    eventually(30, "cairn status warns of the silent replica", || {
        let (code, st) = support::cli_json(&cluster, &["status"]);
        code == 2
            && st["health"] == "HEALTH_WARN"
            && st["health_checks"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c.as_str().is_some_and(|c| c.starts_with(&quiet) && c.contains("has not answered"))
                })
            })
    });
    fs::remove_dir_all(cluster.data.join(format!("meta-{lost}/db"))).unwrap();
    // Without its data the replica refuses to start, and says what to do; told to join
    // (`cairn meta init --join`), it is caught up by the running group.
    let mut refused = restart_server(&cluster, "meta", &format!("meta-{lost}"));
    let status = refused.wait().unwrap();
    let said = fs::read_to_string(cluster.data.join(format!("logs/meta-{lost}-restarted.log"))).unwrap();
    assert!(!status.success() && said.contains("holds no replica data") && said.contains("--join"), "{said}");
    support::meta_init(&cluster, &format!("meta-{lost}"), true);
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
    eventually(30, "healthy again with the replica back", || support::cli_json(&cluster, &["status"]).0 == 0);

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

#[test]
fn a_lost_replica_is_replaced_and_a_backup_restores_the_namespace_into_a_new_group() {
    let mut cluster = three(&[]);
    for i in 0..20 {
        fs::write(cluster.mnt.join(format!("before-{i}")), format!("file {i}")).unwrap();
    }
    // A backup while serving.
    let backups = cluster.root.path().join("backups");
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "backup", backups.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let backup = fs::read_dir(&backups).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
    assert_eq!(backup.len(), 1, "one file, no part left: {backup:?}");
    let backup = backup[0].clone();
    assert!(backup.extension().is_some_and(|e| e == "backup"), "{backup:?}");
    for i in 0..5 {
        fs::write(cluster.mnt.join(format!("after-backup-{i}")), "later").unwrap();
    }

    // A follower's disk dies: it is removed and a new replica takes its place.
    let lead = wait_for_leader(&cluster);
    let lost = (1..=3).find(|id| *id != lead).unwrap();
    kill9(meta_pid(&cluster, lost));
    fs::remove_dir_all(cluster.data.join(format!("meta-{lost}/db"))).unwrap();
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "remove", &lost.to_string()]);
    assert_eq!(code, 0, "{out}");
    // Sent again (an answer lost on the way): nothing more to do, no error.
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "remove", &lost.to_string()]);
    assert_eq!(code, 0, "{out}");
    let mut config: toml::Table =
        toml::from_str(&fs::read_to_string(cluster.data.join(format!("meta-{lost}/meta.toml"))).unwrap())
            .unwrap();
    let addr = support::free_addr();
    let dir = cluster.data.join("meta-4");
    fs::create_dir_all(&dir).unwrap();
    let mut replicas: Vec<toml::Value> = config["replicas"].as_array().unwrap().clone();
    replicas.push(toml::Value::String(format!("4={addr}")));
    config.insert("replicas".into(), toml::Value::Array(replicas));
    config.insert("raft_id".into(), toml::Value::Integer(4));
    config.insert("listen".into(), toml::Value::String(addr.clone()));
    config.insert("metrics_listen".into(), toml::Value::String(support::free_addr()));
    config.insert("data_dir".into(), toml::Value::String(dir.join("db").to_str().unwrap().into()));
    fs::write(dir.join("meta.toml"), toml::to_string(&config).unwrap()).unwrap();
    // Adding a replica that does not answer fails clearly and changes nothing.
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "add", "4", &addr]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("does not answer") || out.contains(&addr), "{out}");
    // A replica with other Raft timing is refused (the leader's read lease assumes it alike).
    let mut odd = config.clone();
    odd.insert("raft_election_ms".into(), toml::Value::Integer(900));
    fs::write(dir.join("meta.toml"), toml::to_string(&odd).unwrap()).unwrap();
    support::meta_init(&cluster, "meta-4", true);
    let mut fourth = KillOnDrop(Some(restart_server(&cluster, "meta", "meta-4")));
    eventually(30, "the new replica listens", || std::net::TcpStream::connect(&addr).is_ok());
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "add", "4", &addr]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("raft_election_ms = 900"), "{out}");
    if let Some(mut odd) = fourth.0.take() {
        odd.kill().unwrap();
        odd.wait().unwrap();
    }
    fs::write(dir.join("meta.toml"), toml::to_string(&config).unwrap()).unwrap();
    fourth.0 = Some(restart_server(&cluster, "meta", "meta-4"));
    eventually(30, "the new replica listens", || std::net::TcpStream::connect(&addr).is_ok());
    // A wrong id for it is refused.
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "add", "5", &addr]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("not replica 5"), "{out}");
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "add", "4", &addr]);
    assert_eq!(code, 0, "{out}");
    let status = meta_status(&cluster);
    let members = status["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_u64() == Some(lead))
        .map(|r| r["members"].clone())
        .unwrap();
    let mut voters: Vec<u64> = members
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["voter"] == true)
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    voters.sort();
    let mut expected: Vec<u64> = [1, 2, 3, 4].into_iter().filter(|id| *id != lost).collect();
    expected.sort();
    assert_eq!(voters, expected, "{status}");
    // `meta status` finds the new replica through the members, and it has caught up.
    eventually(30, "replica 4 has applied what the leader has", || {
        let me = replica(&cluster, 4);
        let leading = replica(&cluster, lead);
        me["state"] == "follower"
            && me["applied_index"].as_u64().unwrap_or(0) + 2
                >= leading["applied_index"].as_u64().unwrap_or(u64::MAX)
    });
    // A client given only the new replica (a follower) is told who leads and goes there.
    let (code, out) = cli_on(&cluster, &addr, &["status"]);
    assert!(out.contains("HEALTH_OK"), "exit {code}: {out}");
    // With the third original replica gone too, the leader and the new one are a majority.
    let third = (1..=3).find(|id| *id != lead && *id != lost).unwrap();
    kill9(meta_pid(&cluster, third));
    fs::write(cluster.mnt.join("with-the-new-replica"), "new").unwrap();
    assert_eq!(fs::read_to_string(cluster.mnt.join("before-7")).unwrap(), "file 7");

    // Every metaserver lost: the backup is restored into replica 1 of a new group; the others
    // start empty and catch up from it.
    drop(fourth.0.take().map(|mut c| {
        let _ = c.kill();
        c.wait()
    }));
    cluster.stop();
    for id in 1..=4 {
        let _ = fs::remove_dir_all(cluster.data.join(format!("meta-{id}/db")));
    }
    let meta1 = cluster.data.join("meta-1/meta.toml");
    let restore = |file: &Path| {
        let out =
            cluster.cli(&["meta", "restore", file.to_str().unwrap(), "--config", meta1.to_str().unwrap()]);
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    // A damaged backup is refused and leaves nothing behind.
    let damaged = cluster.root.path().join("damaged.backup");
    let bytes = fs::read(&backup).unwrap();
    fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let (code, out) = restore(&damaged);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("not a whole Cairn metadata backup"), "{out}");
    assert!(fs::read_dir(cluster.data.join("meta-1/db")).map_or(true, |mut d| d.next().is_none()));
    let (code, out) = restore(&backup);
    assert_eq!(code, Some(0), "{out}");
    // Never over existing data.
    let (code, out) = restore(&backup);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("not empty"), "{out}");
    cluster.restart();
    wait_for_leader(&cluster);
    for i in 0..20 {
        assert_eq!(fs::read_to_string(cluster.mnt.join(format!("before-{i}"))).unwrap(), format!("file {i}"));
    }
    assert!(
        !cluster.mnt.join("after-backup-0").exists(),
        "the backup holds what was there when it was taken"
    );
    fs::write(cluster.mnt.join("after-restore"), "restored").unwrap();
    eventually(60, "all three replicas of the new group have applied the same", || {
        let status = meta_status(&cluster);
        let applied: Vec<u64> = status["replicas"]
            .as_array()
            .map(|r| r.iter().filter_map(|r| r["applied_index"].as_u64()).collect())
            .unwrap_or_default();
        applied.len() == 3 && applied.iter().max().unwrap() - applied.iter().min().unwrap() <= 2
    });
    let out = cluster.cli(&["meta", "status"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    fsck_clean(&cluster);
}

/// Several clients creating, renaming and unlinking in one directory (three mounts: the kernel
/// serializes one mount's creates in a directory, so several clients need several mounts).
/// The leader overlay lets each change go of the directory's lock once it is proposed, so the
/// clients' changes are committed together in shared log entries (with the lock held until
/// each was applied, every change waited for the one before and took an entry of its own); and
/// nothing is lost or doubled: a fresh mount lists exactly what the clients were told they
/// made, and fsck (entries, link counts, statistics) is clean.
#[test]
fn clients_changing_one_directory_share_commits_and_lose_nothing() {
    let cluster = three(&[]);
    let leader = wait_for_leader(&cluster);
    let others = [Mount::new(&cluster, "second"), Mount::new(&cluster, "third")];
    let roots = [cluster.mnt.clone(), others[0].dir.clone(), others[1].dir.clone()];
    fs::create_dir(cluster.mnt.join("shared")).unwrap();
    let proposed = || {
        let node =
            cluster.nodes.iter().find(|n| n.role == "meta" && n.id == leader.to_string()).expect("leader");
        let text = support::scrape(node.metrics.as_deref().expect("the leader serves metrics"));
        let count = |name| support::metric(&text, name, &[]).unwrap_or(0.0);
        (count("cairn_meta_raft_changes_proposed_total"), count("cairn_meta_raft_entries_proposed_total"))
    };
    let before = proposed();
    let (threads_per_mount, each) = (2, 60);
    let expected: Vec<Vec<String>> = std::thread::scope(|s| {
        let workers: Vec<_> = roots
            .iter()
            .enumerate()
            .flat_map(|(m, root)| (0..threads_per_mount).map(move |t| (m, t, root.join("shared"))))
            .map(|(m, t, dir)| {
                s.spawn(move || {
                    let mut kept = Vec::new();
                    for i in 0..each {
                        let name = format!("f{m}.{t}.{i}");
                        fs::write(dir.join(&name), name.as_bytes()).unwrap();
                        if i % 5 == 4 {
                            fs::remove_file(dir.join(&name)).unwrap();
                        } else if i % 3 == 2 {
                            let moved = format!("r{m}.{t}.{i}");
                            fs::rename(dir.join(&name), dir.join(&moved)).unwrap();
                            kept.push(moved);
                        } else {
                            kept.push(name);
                        }
                    }
                    kept
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let after = proposed();
    assert_eq!(leader, wait_for_leader(&cluster), "the leader changed during the test");
    let (changes, entries) = (after.0 - before.0, after.1 - before.1);
    println!("{changes} changes in {entries} log entries");
    assert!(
        changes >= entries * 1.3,
        "{changes} changes in {entries} log entries: clients in one directory waited for each other's commits"
    );

    let fresh = Mount::new(&cluster, "fresh");
    let mut want: Vec<String> = expected.into_iter().flatten().collect();
    want.sort();
    let mut listed: Vec<String> = fs::read_dir(fresh.dir.join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, want, "the directory lists something else than what was made");
    for name in &want {
        let content = fs::read(fresh.dir.join("shared").join(name)).unwrap();
        let made_as = name.replacen('r', "f", 1);
        assert_eq!(content, made_as.as_bytes(), "{name} holds another file's bytes");
    }
    fsck_clean(&cluster);
}

/// Clients changing one directory while both followers are frozen for longer than a change may
/// wait to be committed (`raft_write_timeout_ms`): changes queued behind one that failed —
/// some computed from it through the leader overlay — are refused, the namespace is reopened
/// from what was applied, and the clients retry. Afterwards everything the clients were told
/// they made is there once, with its bytes; nothing else but what failed ambiguously; and fsck
/// (entries, link counts, statistics) is clean.
#[test]
fn a_directory_changed_by_several_clients_through_failed_commits_stays_consistent() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = three(&[("CAIRN_META_RAFT_WRITE_TIMEOUT_MS", "1500")]);
    let leader = wait_for_leader(&cluster);
    let others = [Mount::new(&cluster, "second"), Mount::new(&cluster, "third")];
    let roots = [cluster.mnt.clone(), others[0].dir.clone(), others[1].dir.clone()];
    fs::create_dir(cluster.mnt.join("shared")).unwrap();
    let stop = AtomicBool::new(false);
    let failures = || {
        let node =
            cluster.nodes.iter().find(|n| n.role == "meta" && n.id == leader.to_string()).expect("leader");
        let text = support::scrape(node.metrics.as_deref().expect("the leader serves metrics"));
        support::metric(&text, "cairn_meta_raft_commit_failures_total", &[]).unwrap_or(0.0)
    };
    let failed_before = failures();
    let (made, unsure): (Vec<String>, Vec<String>) = std::thread::scope(|s| {
        let workers: Vec<_> = roots
            .iter()
            .enumerate()
            .flat_map(|(m, root)| (0..2).map(move |t| (m, t, root.join("shared"))))
            .map(|(m, t, dir)| {
                let stop = &stop;
                s.spawn(move || {
                    let (mut made, mut unsure) = (Vec::new(), Vec::new());
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let name = format!("f{m}.{t}.{i}");
                        match fs::write(dir.join(&name), name.as_bytes()) {
                            Ok(()) => made.push(name),
                            Err(_) => unsure.push(name),
                        }
                        i += 1;
                    }
                    (made, unsure)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        let mut frozen: Vec<Frozen> = (1..=3u64)
            .filter(|id| *id != leader)
            .map(|id| {
                let pid = meta_pid(&cluster, id);
                assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
                Frozen(Some(pid))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(4));
        frozen.iter_mut().for_each(Frozen::thaw);
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::SeqCst);
        let mut all = (Vec::new(), Vec::new());
        for w in workers {
            let (made, unsure) = w.join().expect("worker");
            all.0.extend(made);
            all.1.extend(unsure);
        }
        all
    });
    println!("{} files made, {} failed", made.len(), unsure.len());
    // The old leader (if it still leads) counted the changes that could not be committed.
    if wait_for_leader(&cluster) == leader {
        let failed = failures() - failed_before;
        println!("{failed} changes failed to commit on the leader");
        assert!(failed > 0.0, "no change failed: the followers were not frozen long enough");
    }

    let fresh = Mount::new(&cluster, "fresh");
    let dir = fresh.dir.join("shared");
    let listed: std::collections::BTreeSet<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    for name in &made {
        assert!(listed.contains(name), "{name} was made but is gone");
        assert_eq!(fs::read(dir.join(name)).unwrap(), name.as_bytes(), "{name}");
    }
    let unsure: std::collections::BTreeSet<&String> = unsure.iter().collect();
    for name in &listed {
        assert!(made.contains(name) || unsure.contains(name), "{name} was never made");
    }
    fsck_clean(&cluster);
}

/// `cairn up --meta-groups 2`: a second Raft group of three metaservers starts beside group 0
/// and is registered in its group map; it elects its own leader and sends requests for the
/// cluster's state to group 0; the mount serves as with one group; after a restart the same
/// map, not a new version. Then directories spread over both groups, the first mkdir across
/// groups killing group 0's leader right after its commit (`CAIRN_CRASH_AT`): the next leader
/// finishes it and the mount's retry is answered from it.
#[test]
fn cairn_up_starts_and_registers_a_second_metadata_group() {
    let crash = tempfile::tempdir().unwrap();
    let crashed = crash.path().join("crashed");
    let env = [("CAIRN_CRASH_AT", "txn-committed"), ("CAIRN_CRASH_ONCE", crashed.to_str().unwrap())];
    // --no-spread: the slots stay group 0's, moved by hand below.
    let args = ["--meta-replicas", "3", "--meta-groups", "2", "--no-spread"];
    let mut cluster = Cluster::start_env(6, "4+2", 64, &args, &env);
    let group1: Vec<&support::Node> = cluster.nodes.iter().filter(|n| n.id.starts_with("g1-")).collect();
    assert_eq!(group1.len(), 3, "{:?}", cluster.nodes.iter().map(|n| &n.id).collect::<Vec<_>>());
    let group1_addrs = group1.iter().map(|n| n.addr.clone()).collect::<Vec<_>>().join(",");
    let listed = |cluster: &Cluster| {
        let (code, map) = support::cli_json(cluster, &["meta", "groups"]);
        assert_eq!(code, 0, "every group has a leader: {map}");
        map
    };
    let map = listed(&cluster);
    assert_eq!(map["version"], 1, "{map}");
    let groups = map["groups"].as_array().unwrap();
    assert_eq!(groups.iter().map(|g| g["group"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1], "{map}");
    assert_eq!(groups[1]["slots"], 0, "{map}");
    assert_eq!(groups[1]["replicas"].as_array().unwrap().len(), 3, "{map}");
    let (code, status) = cli_on(&cluster, &group1_addrs, &["meta", "status"]);
    assert_eq!(code, 0, "{status}");
    assert!(status.contains("(metadata group 1)"), "{status}");
    let (code, out) = cli_on(&cluster, &group1_addrs, &["status"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("replica of metadata group 1") && out.contains("ask group 0"), "{out}");

    // Group 1's leader fences every chunkserver with its own epoch (`fence-g1`), beside group
    // 0's (`fence`); a later leadership of it raises it.
    let fences = |cluster: &Cluster| -> Vec<u64> {
        (1..=6)
            .map(|i| {
                let path = cluster.data.join(format!("chunk-{i}/fence-g1"));
                fs::read_to_string(path).map_or(0, |t| t.trim().parse().unwrap())
            })
            .collect()
    };
    support::eventually(15, "every chunkserver is fenced by group 1", || {
        fences(&cluster).iter().all(|f| *f > 0)
    });
    let first = fences(&cluster);
    fs::write(cluster.mnt.join("with-two-groups"), "two").unwrap();
    // Empty slots move to group 1; the mount's files (all in slot 0) are unaffected.
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "groups", "move", "1-99,4095", "1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("100 namespace slots are metadata group 1's (group map version 2)"), "{out}");
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "groups", "move", "0", "1"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("slot 0 holds the root directory"), "{out}");
    cluster.stop();
    cluster.restart();
    let again = listed(&cluster);
    assert_eq!(again["version"], 2, "registered once, slots moved once: {again}");
    let slots: Vec<u64> =
        again["groups"].as_array().unwrap().iter().map(|g| g["slots"].as_u64().unwrap()).collect();
    assert_eq!(slots, [3996, 100], "{again}");
    support::eventually(15, "group 1's next leadership raises its fence", || {
        fences(&cluster).iter().zip(&first).all(|(now, before)| now > before)
    });
    // Group 0's leader shares the map with group 1's, which keeps it through the restart.
    support::eventually(15, "group 1's leader holds map version 2", || {
        let (_, map) = support::cli_json(&cluster, &["meta", "groups"]);
        map["groups"].as_array().unwrap().iter().all(|g| g["map_version"] == 2)
    });
    assert_eq!(fs::read_to_string(cluster.mnt.join("with-two-groups")).unwrap(), "two");
    // Group 1's slots go back to group 0 with its leader's promise to create nothing more in
    // them (they hold nothing).
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "groups", "move", "1-99,4095", "0"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("group map version 3"), "{out}");

    // New directories spread over the groups: with half the slots group 1's, about half of
    // them are made there (a mkdir across groups: the entry in group 0, the directory in
    // group 1), and the mount uses them as any other.
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "groups", "move", "1-2047", "1"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli_on(&cluster, &cluster.meta_addr, &["meta", "groups", "spread", "on"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("spread over the groups by their slots (group map version 5)"), "{out}");
    assert_eq!(listed(&cluster)["spread_dirs"], true);
    let top = cluster.mnt.join("spread");
    fs::create_dir(&top).unwrap();
    let mut elsewhere = Vec::new();
    for i in 0..24 {
        let dir = top.join(format!("d{i}"));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("f"), format!("file {i}")).unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&dir).unwrap());
        if ino >> 52 != 0 {
            elsewhere.push(i);
        }
    }
    println!("directories made in group 1: {elsewhere:?}");
    assert!(crashed.exists(), "group 0's leader was killed in its first mkdir across groups");
    // The replica killed comes back (as an operator would restart it).
    let alive =
        |pid: u32| fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.contains("State:\tZ"));
    let dead: Vec<String> =
        cluster.nodes.iter().filter(|n| n.role == "meta" && !alive(n.pid)).map(|n| n.id.clone()).collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let _back = KillOnDrop(Some(restart_server(&cluster, "meta", &format!("meta-{}", dead[0]))));
    // fsck checks every group and matches each directory's two halves: it counts both
    // groups' inodes (the root, `spread`, 24 directories, their files and subdirectories).
    fsck_clean(&cluster);
    let out = cluster.cli(&["fsck", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(report["namespace"]["inodes"].as_u64().is_some_and(|n| n >= 2 + 3 * 24), "{report}");
    assert!(!elsewhere.is_empty() && elsewhere.len() < 24, "{elsewhere:?}");
    let fresh = Mount::new(&cluster, "spread");
    let listed: Vec<String> = {
        let mut names: Vec<String> = fs::read_dir(fresh.dir.join("spread"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listed.len(), 24, "{listed:?}");
    for i in 0..24 {
        let dir = fresh.dir.join(format!("spread/d{i}"));
        assert_eq!(fs::read_to_string(dir.join("f")).unwrap(), format!("file {i}"));
        assert!(fs::metadata(dir.join("sub")).unwrap().is_dir());
        assert_eq!(std::os::unix::fs::MetadataExt::nlink(&fs::metadata(&dir).unwrap()), 3, "d{i}");
    }
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&fs::metadata(&top).unwrap()), 26);
    // One that another group holds is renamed within its directory (its name changes in
    // group 0, its ctime in group 1) and back.
    let there = fresh.dir.join(format!("spread/d{}", elsewhere[0]));
    fs::rename(&there, fresh.dir.join("spread/moved")).unwrap();
    assert_eq!(
        fs::read_to_string(fresh.dir.join("spread/moved/f")).unwrap(),
        format!("file {}", elsewhere[0])
    );
    fs::rename(fresh.dir.join("spread/moved"), &there).unwrap();
    // Files move, link and go across groups (a change across groups): the inode stays where
    // it was made, with its number, and its links are counted there.
    let here = fresh.dir.join(format!("spread/d{}", (0..24).find(|i| !elsewhere.contains(i)).unwrap()));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let nlink = |p: &Path| std::os::unix::fs::MetadataExt::nlink(&fs::metadata(p).unwrap());
    let before = ino(&here.join("f"));
    let text = fs::read_to_string(here.join("f")).unwrap();
    fs::rename(here.join("f"), there.join("moved")).unwrap();
    assert!(!here.join("f").exists());
    assert_eq!(
        (ino(&there.join("moved")), fs::read_to_string(there.join("moved")).unwrap()),
        (before, text.clone())
    );
    fs::hard_link(there.join("moved"), here.join("link")).unwrap();
    assert_eq!((nlink(&here.join("link")), nlink(&there.join("moved"))), (2, 2));
    fs::rename(there.join("moved"), there.join("moved2")).unwrap();
    fs::write(here.join("g"), "replaces").unwrap();
    fs::rename(here.join("g"), there.join("f")).unwrap();
    assert_eq!(fs::read_to_string(there.join("f")).unwrap(), "replaces");
    fs::remove_file(there.join("moved2")).unwrap();
    assert_eq!((nlink(&here.join("link")), fs::read_to_string(here.join("link")).unwrap()), (1, text));
    fsck_clean(&cluster);
    // A non-empty one is not removed; the whole tree goes, each directory from its own group
    // (an rmdir across groups where the parent's group is another).
    let e = fs::remove_dir(&there).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    fs::remove_dir_all(fresh.dir.join("spread")).unwrap();
    assert!(!fresh.dir.join("spread").exists());
    drop(fresh);
    fsck_clean(&cluster);
}
