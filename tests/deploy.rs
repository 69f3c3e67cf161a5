//! Offline checks of the deployment artifacts under `deploy/`: every TOML config parses with the
//! servers' own parser and validates; the compose file and the Kubernetes manifests parse and
//! agree with the configs they carry (service names, ports, mount points, volumes); in each, the
//! metaserver replicas form one Raft group (one `replicas` list that names every replica by the
//! name and port it is reached at, distinct ids covering it, the per-pod id computed from the pod
//! ordinal), and everything that names the metaserver names exactly those replicas; the replicas'
//! start scripts and health checks are run, with a stand-in for `cairn`, to see what they do;
//! every `cairn` command line uses flags the binary has; the Grafana dashboard and the alert
//! rules only query metrics the code exports, and read the leader's gauges only from the leader;
//! the Dockerfile builds the `cairn` package and ships the binary; the servers run unprivileged
//! (systemd sandboxes, the image's user, Kubernetes security contexts and NetworkPolicies) with
//! every directory they write writable, and systemd accepts the units. Nothing here needs Docker, a
//! cluster or the network (`scripts/validate-deploy.sh` adds schema validation with tools from
//! PyPI).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_common::config::{load_with, ChunkConfig, MetaConfig, CHUNK_ENV_PREFIX, META_ENV_PREFIX};
use cairn_net::failover::Failover;
use serde::Deserialize as _;
use serde_yaml::Value;

#[path = "deploy/compose.rs"]
mod compose;
#[path = "deploy/hosts.rs"]
mod hosts;
#[path = "deploy/k8s.rs"]
mod k8s;
#[path = "deploy/monitoring.rs"]
mod monitoring;

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn files_under(rel: &str, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![repo().join(rel)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

// ------------------------------------------------------------------------------------- configs

/// `validate()` resolves the listen address, and the names of a deployment (`meta-1:9400`,
/// `cairn-meta-0.cairn-meta.cairn.svc.cluster.local:9400`) do not resolve here; peers it only
/// checks for form. Check that `addr` is HOST:PORT with a well-formed DNS name or IP address as
/// host, and give back an address that validates offline.
fn offline_addr(what: &str, addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap_or_else(|| panic!("{what}: {addr:?} has no port"));
    port.parse::<u16>().unwrap_or_else(|e| panic!("{what}: port of {addr:?}: {e}"));
    if host.parse::<IpAddr>().is_ok() {
        return addr.to_string();
    }
    let labels: Vec<&str> = host.split('.').collect();
    assert!(
        labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        }),
        "{what}: {host:?} is not a DNS name"
    );
    format!("127.0.0.1:{port}")
}

/// The metrics endpoint is bound with `SocketAddr::parse`: an IP address, never a host name.
fn check_metrics_listen(what: &str, listen: &Option<String>) {
    if let Some(m) = listen {
        m.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{what}: metrics_listen {m:?}: {e}"));
    }
}

/// The addresses of a comma-separated metaserver list, parsed as the mount, the chunkserver and
/// the CLI parse it.
fn meta_addrs(what: &str, list: &str) -> Vec<String> {
    let addrs = Failover::parse(list).unwrap_or_else(|e| panic!("{what}: {list:?}: {}", e.message())).addrs();
    for a in &addrs {
        offline_addr(what, a);
    }
    addrs
}

fn check_meta(what: &str, cfg: MetaConfig) -> MetaConfig {
    let mut offline = cfg.clone();
    offline.listen = offline_addr(what, &cfg.listen);
    offline.validate().unwrap_or_else(|e| panic!("{what}: {}", e.message()));
    for addr in cfg.replica_addrs().unwrap().values() {
        offline_addr(what, addr);
    }
    check_metrics_listen(what, &cfg.metrics_listen);
    assert!(!cfg.plaintext, "{what}: a shipped config must not turn TLS off");
    cfg
}

fn check_chunk(what: &str, cfg: ChunkConfig) -> ChunkConfig {
    let mut offline = cfg.clone();
    offline.listen = offline_addr(what, &cfg.listen);
    meta_addrs(what, &cfg.meta);
    if let Some(a) = &cfg.advertise {
        offline_addr(what, a);
    }
    offline.validate().unwrap_or_else(|e| panic!("{what}: {}", e.message()));
    check_metrics_listen(what, &cfg.metrics_listen);
    assert!(!cfg.plaintext, "{what}: a shipped config must not turn TLS off");
    cfg
}

fn parse_chunk(what: &str, text: &str) -> ChunkConfig {
    check_chunk(what, toml::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}")))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// The replicas of one metaserver group, each config with the host the others reach it by. They
/// list the same `replicas` and `cluster`, have distinct raft ids that cover the list, each id's
/// entry is its own host and listen port, and they differ in nothing else. Gives back the
/// replicas' addresses by id.
fn check_replica_group(what: &str, members: &[(String, MetaConfig)]) -> BTreeMap<u64, String> {
    let first = &members[0].1;
    let replicas = first.replica_addrs().unwrap();
    assert!(replicas.len() >= 3 && replicas.len() % 2 == 1, "{what}: {replicas:?}: 3 or 5 replicas");
    assert_eq!(
        members.len(),
        replicas.len(),
        "{what}: {} replicas run, the list has {replicas:?}",
        members.len()
    );
    let mut ids = BTreeSet::new();
    for (host, cfg) in members {
        assert_eq!(cfg.replicas, first.replicas, "{what}: {host} lists other replicas");
        assert_eq!(cfg.cluster, first.cluster, "{what}: {host} is in another cluster");
        assert!(ids.insert(cfg.raft_id), "{what}: raft_id {} twice", cfg.raft_id);
        let entry =
            replicas.get(&cfg.raft_id).unwrap_or_else(|| panic!("{what}: {host}'s raft_id is not listed"));
        assert_eq!(
            entry,
            &format!("{host}:{}", port_of(&cfg.listen)),
            "{what}: replica {} is {host}, listening on {}",
            cfg.raft_id,
            cfg.listen
        );
        let mut same = cfg.clone();
        same.raft_id = first.raft_id;
        assert_eq!(&same, first, "{what}: {host} differs from the other replicas in more than raft_id");
    }
    assert_eq!(ids, replicas.keys().copied().collect(), "{what}: the raft ids do not cover the list");
    replicas
}

/// A metaserver list (`--meta`, `CAIRN_META`, a chunkserver's `meta`) names every replica, once,
/// and nothing else.
fn check_meta_list(what: &str, list: &str, replicas: &BTreeMap<u64, String>) {
    let addrs = meta_addrs(what, list);
    let named: BTreeSet<&String> = addrs.iter().collect();
    assert_eq!(named.len(), addrs.len(), "{what}: {list:?} names a replica twice");
    assert_eq!(named, replicas.values().collect(), "{what}: {list:?} is not the replicas {replicas:?}");
}

#[test]
fn every_toml_under_deploy_parses_and_validates() {
    let files = files_under("deploy", "toml");
    assert!(files.len() >= 11, "{files:?}");
    for path in files {
        let what = path.display().to_string();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("meta") {
            check_meta(&what, cairn_common::config::load::<MetaConfig>(&path).unwrap());
        } else if name.starts_with("chunk") {
            check_chunk(&what, cairn_common::config::load::<ChunkConfig>(&path).unwrap());
        } else {
            panic!("{what}: neither a meta*.toml nor a chunk*.toml; add it to this test");
        }
    }
}

// ------------------------------------------------------------------------------------- YAML

fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = read(rel);
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(&text) {
        let mut v = Value::deserialize(de).unwrap_or_else(|e| panic!("{rel}: {e}"));
        v.apply_merge().unwrap_or_else(|e| panic!("{rel}: merge keys: {e}"));
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

fn s<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str().unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
}

fn seq<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_sequence().map(|s| s.as_slice()).unwrap_or_else(|| panic!("{what}: expected a list, got {v:?}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    seq(v, what).iter().map(|x| s(x, what).to_string()).collect()
}

/// Every `--flag` of a `cairn SUBCOMMAND [SUBCOMMAND] ...` command line is one the binary
/// accepts.
fn check_cairn_flags(what: &str, argv: &[String]) {
    assert_eq!(argv.first().map(String::as_str), Some("cairn"), "{what}: {argv:?}");
    let help = |path: &[String]| {
        let out = Command::new(CAIRN).args(path).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{what}: `cairn {} --help` failed: {help}", path.join(" "));
        help
    };
    let mut path = vec![argv.get(1).unwrap_or_else(|| panic!("{what}: no subcommand in {argv:?}")).clone()];
    let mut text = help(&path);
    // `cairn meta status ...`: the next word is a command the first one lists.
    if let Some(next) = argv.get(2).filter(|a| !a.starts_with('-')) {
        let commands = text.lines().skip_while(|l| l.trim() != "Commands:").skip(1);
        if commands.take_while(|l| l.starts_with("  ")).any(|l| l.split_whitespace().next() == Some(next)) {
            path.push(next.clone());
            text = help(&path);
        }
    }
    for flag in argv.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().unwrap();
        assert!(
            text.contains(&format!("{flag} ")),
            "{what}: `cairn {}` has no {flag}:\n{text}",
            path.join(" ")
        );
    }
}

/// The values of `flag` in a command line, as `--flag VALUE` or `--flag=VALUE`.
fn flag_values(argv: &[String], flag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut args = argv.iter();
    while let Some(a) = args.next() {
        if a == flag {
            out.extend(args.next().cloned());
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v.to_string());
        }
    }
    out
}

fn flag_value(what: &str, argv: &[String], flag: &str) -> String {
    match flag_values(argv, flag).as_slice() {
        [one] => one.clone(),
        other => panic!("{what}: {flag} {other:?} in {argv:?}"),
    }
}

/// The `cairn ...` invocation in a container command: the command itself, or the line of a
/// `sh -c` script that execs it (split on white space: good for its flags).
fn cairn_argv(what: &str, command: &[String], args: &[String]) -> Vec<String> {
    if command.first().map(String::as_str) == Some("cairn") {
        return command.iter().chain(args).cloned().collect();
    }
    assert_eq!(command, ["sh", "-c"], "{what}: neither `cairn ...` nor `sh -c SCRIPT`");
    let script = args.first().unwrap_or_else(|| panic!("{what}: sh -c without a script"));
    let line = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("exec cairn "))
        .unwrap_or_else(|| panic!("{what}: the script never execs cairn:\n{script}"));
    std::iter::once("cairn").chain(line.split_whitespace()).map(|a| a.trim_matches('"').to_string()).collect()
}

// ------------------------------------------------------------------------------------- scripts

/// Run a container's command line (`sh -c SCRIPT`, a health check) here with `env` as its whole
/// environment and a stand-in for `cairn` first on the PATH, which records its arguments and
/// exits with `rc`. Gives back whether the command succeeded and the `cairn` command lines it
/// ran.
fn run_with_fake_cairn(argv: &[String], env: &[(String, String)], rc: i32) -> (bool, Vec<Vec<String>>) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let (fake, log) = (dir.path().join("cairn"), dir.path().join("calls"));
    // One line per call, each argument followed by a unit separator.
    let script = format!(
        "#!/bin/sh\n{{ for a in cairn \"$@\"; do printf '%s\\037' \"$a\"; done; echo; }} >> '{}'\nexit {rc}\n",
        log.display()
    );
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().cloned())
        .env("PATH", path)
        .output()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    let calls = calls
        .lines()
        .map(|l| l.strip_suffix('\x1f').unwrap_or(l).split('\x1f').map(str::to_string).collect())
        .collect();
    (out.status.success(), calls)
}

/// A metaserver replica's health check (compose healthcheck, Kubernetes readiness probe): it
/// asks this replica alone (`cairn meta status --meta` a loopback address and the listen port,
/// so a replica that does not answer is unhealthy whatever the others do), and counts exit 0
/// (all replicas answer) and 2 (a leader serves, a replica is down or behind) as healthy, 3 (no
/// leader) and 1 (an error) as not: a follower is healthy, one replica down does not make the
/// others unhealthy, and healthy replicas mean a leader for whoever waits on them.
fn check_replica_probe(what: &str, argv: &[String], env: &[(String, String)], listen_port: u16) {
    for (rc, healthy) in [(0, true), (1, false), (2, true), (3, false)] {
        let (ok, calls) = run_with_fake_cairn(argv, env, rc);
        assert_eq!(ok, healthy, "{what}: {argv:?} with `cairn meta status` exiting {rc}");
        let [call] = calls.as_slice() else { panic!("{what}: {argv:?} ran cairn {calls:?}, not once") };
        check_cairn_flags(what, call);
        assert_eq!(call[1..3], ["meta", "status"], "{what}: {call:?}");
        let meta = meta_addrs(what, &flag_value(what, call, "--meta"));
        let [own] = meta.as_slice() else { panic!("{what}: asks {meta:?}, not this replica alone") };
        let (host, port) = own.rsplit_once(':').unwrap();
        assert!(
            host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
            "{what}: asks {own}, not this replica"
        );
        assert_eq!(port, listen_port.to_string(), "{what}: asks {own}, not the listen port");
    }
}
