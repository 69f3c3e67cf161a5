//! Linearizability of the replicated namespace across failovers (issue 16). Clients on two
//! mounts write and read a few registers (the `user.v` xattr of a few files: a client asks the
//! metaserver on every call, so no client cache stands between the clients and the replicas)
//! while the metaserver leader is killed with `kill -9` again and again (and once frozen with
//! SIGSTOP and thawed, so a deposed leader comes back believing it leads). Every operation is
//! recorded with the instants it was invoked and returned, and each register's history is
//! checked with the search in `lincheck.rs`, whose own tests run in this binary too.
//!
//! To show the check is not vacuous, one more reader takes a deliberately stale read path: some
//! of its reads answer from what it read before, once another client's write has been
//! acknowledged since. The same checker must reject that history.

mod lincheck;
mod support;

use std::ffi::CStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lincheck::{check, Kind, Op, Outcome};
use support::{eventually, kill9, restart_server, Cluster, KillOnDrop, Mount, Rng};

/// Registers (files) the clients share, each checked on its own.
const REGISTERS: usize = 3;
const ATTR: &CStr = c"user.v";
/// What every register holds before the history starts; no client writes it.
const INITIAL: u64 = 0;
/// The longest pause between two operations of a client, in milliseconds: it keeps each
/// register's history to a size the checker takes well under a second for (a few thousand).
const PAUSE_MS: u64 = 20;
/// Leaders stopped: killed with `kill -9` (and restarted), except the one of this round, which
/// is frozen with SIGSTOP for 3–4 s and thawed.
const KILLS: u64 = 4;
const FROZEN_ROUND: u64 = 1;
/// How long the clients run, at least.
const RUN: Duration = Duration::from_secs(30);

fn register(mount: &Path, k: usize) -> PathBuf {
    mount.join(format!("registers/r{k}"))
}

fn open_registers(mount: &Path) -> Vec<File> {
    (0..REGISTERS).map(|k| File::open(register(mount, k)).expect("open a register")).collect()
}

fn set(file: &File, value: u64) -> io::Result<()> {
    let text = value.to_string();
    let rc = unsafe { libc::fsetxattr(file.as_raw_fd(), ATTR.as_ptr(), text.as_ptr().cast(), text.len(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The register's value. A value that is not a number no client wrote: the test fails here.
fn get(file: &File) -> io::Result<u64> {
    let mut buf = [0u8; 64];
    let n = unsafe { libc::fgetxattr(file.as_raw_fd(), ATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let text = &buf[..n as usize];
    let value = std::str::from_utf8(text).ok().and_then(|t| t.parse().ok());
    Ok(value.unwrap_or_else(|| {
        panic!("a register holds {:?}, which no client wrote", String::from_utf8_lossy(text))
    }))
}

/// One operation on a register; `stale` if the stale reader answered it from memory.
struct Record {
    register: usize,
    op: Op,
    stale: bool,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Operations that succeeded, to pace the kills.
    ok: AtomicUsize,
    /// Per register, the latest invoke of a write that succeeded (published once it returned).
    written: Mutex<[Option<Instant>; REGISTERS]>,
}

impl Shared {
    fn wrote(&self, k: usize, invoke: Instant) {
        let mut written = self.written.lock().unwrap();
        written[k] = written[k].max(Some(invoke));
    }
}

fn pause(rng: &mut Rng) {
    std::thread::sleep(Duration::from_millis(rng.below(PAUSE_MS)));
}

/// A client: reads and writes of random registers, through `mount`, until told to stop. Its
/// writes write values unique to it (never [`INITIAL`]); a failed write is recorded as unknown,
/// a failed read as an unknown read (which the checker drops).
fn client(process: usize, mount: PathBuf, seed: u64, shared: Arc<Shared>) -> Vec<Record> {
    let files = open_registers(&mount);
    let mut rng = Rng(seed);
    let mut records = Vec::new();
    let mut written = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let k = rng.below(REGISTERS as u64) as usize;
        let invoke = Instant::now();
        let (kind, result) = if rng.below(2) == 0 {
            written += 1;
            let value = ((process as u64 + 1) << 32) | written;
            (Kind::Write(value), set(&files[k], value))
        } else {
            match get(&files[k]) {
                Ok(v) => (Kind::Read(v), Ok(())),
                Err(e) => (Kind::Read(INITIAL), Err(e)),
            }
        };
        let ret = Instant::now();
        let outcome = match result {
            Ok(()) => Outcome::Ok,
            Err(e) => {
                eprintln!("process {process}: {kind:?} of register {k} failed: {e}");
                Outcome::Unknown
            }
        };
        if outcome == Outcome::Ok {
            shared.ok.fetch_add(1, Ordering::SeqCst);
            if matches!(kind, Kind::Write(_)) {
                shared.wrote(k, invoke);
            }
        }
        records.push(Record { register: k, op: Op { process, kind, invoke, ret, outcome }, stale: false });
        pause(&mut rng);
    }
    records
}

/// A reader with a deliberately stale read path: it remembers the last value it read of each
/// register and, every other read, answers from memory when a write that another client invoked
/// after that read has been acknowledged since. It writes nothing. Such an answer is certainly
/// stale: the write it misses comes after the remembered read and before the answer in real
/// time, and values are never written twice, so no order of the operations has it.
fn stale_reader(process: usize, mounts: [PathBuf; 2], seed: u64, shared: Arc<Shared>) -> Vec<Record> {
    let files = mounts.map(|m| open_registers(&m));
    let mut rng = Rng(seed);
    let mut records = Vec::new();
    // Per register: the value read, and when that read returned.
    let mut remembered: [Option<(u64, Instant)>; REGISTERS] = [None; REGISTERS];
    let mut from_memory = false;
    while !shared.stop.load(Ordering::SeqCst) {
        let k = rng.below(REGISTERS as u64) as usize;
        let last_write = shared.written.lock().unwrap()[k];
        let stale = remembered[k].filter(|&(_, read)| last_write.is_some_and(|w| w > read));
        match stale {
            Some((value, _)) if from_memory => {
                let invoke = Instant::now();
                let op = Op {
                    process,
                    kind: Kind::Read(value),
                    invoke,
                    ret: Instant::now(),
                    outcome: Outcome::Ok,
                };
                records.push(Record { register: k, op, stale: true });
                from_memory = false;
            }
            _ => {
                let invoke = Instant::now();
                let result = get(&files[rng.below(2) as usize][k]);
                let ret = Instant::now();
                let (kind, outcome) = match result {
                    Ok(v) => {
                        remembered[k] = Some((v, ret));
                        from_memory = true;
                        (Kind::Read(v), Outcome::Ok)
                    }
                    Err(_) => (Kind::Read(INITIAL), Outcome::Unknown),
                };
                records.push(Record {
                    register: k,
                    op: Op { process, kind, invoke, ret, outcome },
                    stale: false,
                });
            }
        }
        pause(&mut rng);
    }
    records
}

/// The id of the replica that leads, as `cairn meta status` reports it.
fn leader_id(cluster: &Cluster) -> Option<u64> {
    let out = cluster.cli(&["meta", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    status["leader"].as_u64()
}

/// Let time pass until `at` (pacing the kills, not waiting for anything).
fn pace_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// Four clients (two per mount) write and read three registers for ~30 s while the
/// metaserver leader of three replicas is killed with `kill -9` three times and started again
/// a moment later, and frozen (SIGSTOP) once for 3–4 s and thawed, after which it must follow the
/// new leader. Every register's history is linearizable; with the stale reader's answers
/// from memory added, it is not.
#[test]
fn history_across_leader_kills_is_linearizable() {
    let seed: u64 = std::env::var("CAIRN_LIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x11_7EA5);
    println!("seed {seed} (CAIRN_LIN_SEED)");
    let mut restarted: Vec<(KillOnDrop, u64)> = Vec::new();
    let cluster = Cluster::start_with(Path::new("/tmp"), 6, "4+2", 64, &["--meta-replicas", "3"]);
    let second = Mount::new(&cluster, "second");
    fs::create_dir(cluster.mnt.join("registers")).unwrap();
    for k in 0..REGISTERS {
        File::create(register(&cluster.mnt, k)).unwrap();
        set(&File::open(register(&cluster.mnt, k)).unwrap(), INITIAL).unwrap();
        assert_eq!(get(&File::open(register(&second.dir, k)).unwrap()).unwrap(), INITIAL);
    }

    let shared = Arc::new(Shared::default());
    let mounts = [cluster.mnt.clone(), second.dir.clone()];
    let t0 = Instant::now();
    let mut workers: Vec<_> = (0..4)
        .map(|process| {
            let (mount, shared) = (mounts[process / 2].clone(), shared.clone());
            std::thread::spawn(move || client(process, mount, seed + process as u64, shared))
        })
        .collect();
    workers.push({
        let (mounts, shared) = (mounts.clone(), shared.clone());
        std::thread::spawn(move || stale_reader(4, mounts, seed + 4, shared))
    });

    let acked = || shared.ok.load(Ordering::SeqCst);
    let mut timing = Rng(seed ^ 0x1EAD);
    let mut kills = Vec::new();
    for round in 0..KILLS {
        let wanted = acked() + 100;
        eventually(60, &format!("clients got {wanted} answers (round {round})"), || acked() >= wanted);
        pace_until(t0 + Duration::from_secs(4 + 6 * round));
        let mut leader = None;
        eventually(30, "a leader is known", || {
            leader = leader_id(&cluster);
            leader.is_some()
        });
        let id = leader.unwrap();
        let running = restarted.iter().position(|r| r.1 == id);
        let pid = match running {
            Some(i) => restarted[i].0 .0.as_ref().expect("running").id(),
            None => {
                cluster
                    .nodes
                    .iter()
                    .find(|n| n.role == "meta" && n.id == id.to_string())
                    .expect("replica")
                    .pid
            }
        };
        if round == FROZEN_ROUND {
            // Frozen, not killed: the deposed leader comes back believing it leads, and must
            // not answer from its old state (its lease ran out while it was stopped).
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
            kills.push((Instant::now(), id));
            std::thread::sleep(Duration::from_millis(3000 + timing.below(1000)));
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
            // Thawed, it learns it was deposed and follows the new leader.
            eventually(30, &format!("the thawed replica {id} follows a new leader"), || {
                let out = cluster.cli(&["meta", "status", "--json"]);
                let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                let me = status["replicas"]
                    .as_array()
                    .and_then(|r| r.iter().find(|r| r["id"].as_u64() == Some(id)).cloned())
                    .unwrap_or_default();
                me["state"] == "follower" && me["leader"].as_u64().is_some_and(|l| l != id)
            });
            continue;
        }
        if let Some(i) = running {
            drop(restarted.remove(i).0 .0.take());
        }
        kill9(pid);
        kills.push((Instant::now(), id));
        std::thread::sleep(Duration::from_millis(1000 + timing.below(1000)));
        restarted.push((KillOnDrop(Some(restart_server(&cluster, "meta", &format!("meta-{id}")))), id));
    }
    let at_last = acked();
    eventually(60, "clients got 100 answers after the last kill", || acked() >= at_last + 100);
    pace_until(t0 + RUN);
    shared.stop.store(true, Ordering::SeqCst);
    let records: Vec<Record> = workers.into_iter().flat_map(|w| w.join().expect("client")).collect();
    let end = Instant::now();

    let ms = |t: Instant| t.saturating_duration_since(t0).as_millis();
    let kill_list: Vec<String> =
        kills.iter().map(|(at, id)| format!("replica {id} at {} ms", ms(*at))).collect();
    println!(
        "leaders stopped (killed, the one of round {FROZEN_ROUND} frozen): {kill_list:?}; clients ran {} ms",
        ms(end)
    );
    let real: Vec<&Record> = records.iter().filter(|r| !r.stale).collect();
    let ok = |r: &&Record, write: bool| {
        r.op.outcome == Outcome::Ok && matches!(r.op.kind, Kind::Write(_)) == write
    };
    let slowest = real.iter().filter(|r| r.op.outcome == Outcome::Ok).max_by_key(|r| r.op.ret - r.op.invoke);
    println!(
        "{} operations: {} reads and {} writes succeeded, {} writes unknown, {} reads failed; slowest {}",
        real.len(),
        real.iter().filter(|r| ok(r, false)).count(),
        real.iter().filter(|r| ok(r, true)).count(),
        real.iter()
            .filter(|r| r.op.outcome == Outcome::Unknown && matches!(r.op.kind, Kind::Write(_)))
            .count(),
        real.iter()
            .filter(|r| r.op.outcome == Outcome::Unknown && matches!(r.op.kind, Kind::Read(_)))
            .count(),
        slowest.map(|r| r.op.describe(t0)).unwrap_or_default(),
    );

    // Not vacuous: many operations, and reads and writes answered between each kill and the next.
    let succeeded = real.iter().filter(|r| r.op.outcome == Outcome::Ok).count();
    assert!(succeeded > 200, "only {succeeded} operations succeeded");
    for (i, (at, id)) in kills.iter().enumerate() {
        let until = kills.get(i + 1).map_or(end, |k| k.0);
        let after =
            |write| real.iter().filter(|r| ok(r, write) && r.op.invoke > *at && r.op.ret < until).count();
        println!("after killing replica {id}: {} reads, {} writes", after(false), after(true));
        assert!(
            after(false) > 0 && after(true) > 0,
            "no reads or no writes answered after killing replica {id}"
        );
    }

    // Every register's history is linearizable.
    let history = |k: usize, stale: bool| -> Vec<Op> {
        records.iter().filter(|r| r.register == k && (stale || !r.stale)).map(|r| r.op.clone()).collect()
    };
    let mut problems = Vec::new();
    for k in 0..REGISTERS {
        let ops = history(k, false);
        let started = Instant::now();
        match check(INITIAL, &ops) {
            Ok(checked) => println!(
                "register {k}: {} operations linearizable, {} configurations explored in {:?}",
                checked.ops,
                checked.explored,
                started.elapsed()
            ),
            Err(e) => problems.push(format!("register {k}: {e}")),
        }
    }
    assert!(problems.is_empty(), "seed {seed}, leaders stopped {kill_list:?}:\n{}", problems.join("\n"));

    // The same histories with the stale reader's answers from memory are not.
    let stale = records.iter().filter(|r| r.stale).count();
    println!("the stale reader answered {stale} reads from memory");
    assert!(stale > 0, "the stale reader never answered from memory");
    for k in 0..REGISTERS {
        if !records.iter().any(|r| r.register == k && r.stale) {
            continue;
        }
        let started = Instant::now();
        match check(INITIAL, &history(k, true)) {
            Ok(checked) => problems.push(format!("register {k} with stale reads passed: {checked:?}")),
            Err(e) => println!("register {k} with stale reads rejected in {:?}: {e}", started.elapsed()),
        }
    }
    assert!(problems.is_empty(), "seed {seed}: the checker missed stale reads:\n{}", problems.join("\n"));
}
