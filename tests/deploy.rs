//! Offline checks of the deployment artifacts under `deploy/`: every TOML config parses with the
//! servers' own parser and validates; the compose file and the Kubernetes manifests parse and
//! agree with the configs they carry (service names, ports, mount points, volumes); in each, the
//! metaserver replicas form one Raft group (one `replicas` list that names every replica by the
//! name and port it is reached at, distinct ids covering it, the per-pod id computed from the pod
//! ordinal), and everything that names the metaserver names exactly those replicas; the replicas'
//! start scripts and health checks are run, with a stand-in for `cairn`, to see what they do;
//! every `cairn` command line uses flags the binary has; the Grafana dashboard and the alert
//! rules only query metrics the code exports, and read the leader's gauges only from the leader;
//! the Dockerfile builds the `cairn` package and ships the binary. Nothing here needs Docker, a
//! cluster or the network (`scripts/validate-deploy.sh` adds schema validation with tools from
//! PyPI).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_common::config::{load_with, ChunkConfig, MetaConfig, CHUNK_ENV_PREFIX, META_ENV_PREFIX};
use cairn_common::failover::Failover;
use serde::Deserialize as _;
use serde_yaml::Value;

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

// ------------------------------------------------------------------------------------- compose

/// One compose service, as these tests read it.
struct Service {
    raw: Value,
    /// Its command line.
    argv: Vec<String>,
    /// Files mounted from deploy/docker: container path -> the file here.
    files: BTreeMap<String, PathBuf>,
    /// Named volumes: container path -> volume.
    volumes: BTreeMap<String, String>,
    env: Vec<(String, String)>,
    /// Published ports (all on 127.0.0.1): container port -> host port.
    ports: BTreeMap<u16, u16>,
}

impl Service {
    /// Its server config: the file its `--config` names, then its environment and `--set` flags,
    /// as `cairn meta` / `cairn chunk` load them.
    fn config<T: serde::de::DeserializeOwned + serde::Serialize + Default>(
        &self,
        what: &str,
        env_prefix: &str,
    ) -> T {
        let file = &self.files[&flag_value(what, &self.argv, "--config")];
        let sets = flag_values(&self.argv, "--set");
        load_with(Some(file), env_prefix, self.env.clone(), &sets)
            .unwrap_or_else(|e| panic!("{what}: {}", e.message()))
    }

    fn depends_on_healthy(&self, other: &str) -> bool {
        self.raw["depends_on"][other]["condition"] == "service_healthy"
    }
}

/// `$$` in a compose string is the shell's `$`; a lone `$` would be compose's interpolation.
fn compose_literal(what: &str, text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = rest[at + 1..].strip_prefix('$');
        rest = tail.unwrap_or_else(|| panic!("{what}: compose interpolates the `$` in {text:?}: write $$"));
        out.push('$');
    }
    out + rest
}

struct Compose {
    services: BTreeMap<String, Service>,
}

impl Compose {
    fn load() -> Compose {
        let docs = yaml_docs("deploy/docker/compose.yaml");
        assert_eq!(docs.len(), 1);
        let compose = &docs[0];
        let declared_volumes: BTreeSet<String> = compose["volumes"]
            .as_mapping()
            .map(|m| m.keys().map(|k| s(k, "volume").to_string()).collect())
            .unwrap_or_default();
        let docker_dir = repo().join("deploy/docker");
        let raw = compose["services"].as_mapping().expect("services");
        let names: BTreeSet<&str> = raw.keys().map(|k| s(k, "service name")).collect();
        let mut services = BTreeMap::new();
        let mut host_ports = BTreeMap::new();
        for (name, svc) in raw {
            let name = s(name, "service");
            let what = format!("compose service {name}");
            assert!(svc["image"].is_string(), "{what}: no image");
            let build = &svc["build"];
            let context = docker_dir.join(s(&build["context"], &what));
            assert!(
                context.join(s(&build["dockerfile"], &what)).is_file(),
                "{what}: build.dockerfile not found"
            );
            assert!(context.join("Cargo.toml").is_file(), "{what}: the build context is not the workspace");
            let argv = strings(&svc["command"], &what);
            check_cairn_flags(&what, &argv);
            for dep in svc["depends_on"].as_mapping().into_iter().flat_map(|m| m.keys()) {
                assert!(names.contains(s(dep, &what)), "{what}: depends on unknown {dep:?}");
            }
            let (mut files, mut volumes) = (BTreeMap::new(), BTreeMap::new());
            for vol in svc["volumes"].as_sequence().into_iter().flatten() {
                if let Some(short) = vol.as_str() {
                    let parts: Vec<&str> = short.split(':').collect();
                    let (source, target) = (parts[0], parts[1]);
                    if source.starts_with("./") {
                        assert!(docker_dir.join(source).is_file(), "{what}: {source} does not exist");
                        files.insert(target.to_string(), docker_dir.join(source));
                    } else {
                        assert!(declared_volumes.contains(source), "{what}: volume {source} is not declared");
                        volumes.insert(target.to_string(), source.to_string());
                    }
                }
            }
            let env = match &svc["environment"] {
                Value::Mapping(m) => {
                    m.iter().map(|(k, v)| (s(k, &what).to_string(), s(v, &what).to_string())).collect()
                }
                Value::Null => Vec::new(),
                list => strings(list, &what)
                    .iter()
                    .map(|kv| {
                        kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).expect("KEY=VALUE")
                    })
                    .collect(),
            };
            // Published on the host's loopback only, and no host port twice.
            let mut ports = BTreeMap::new();
            for p in svc["ports"].as_sequence().into_iter().flatten() {
                let p = s(p, &what);
                let parts: Vec<&str> = p.split(':').collect();
                assert!(
                    parts.len() == 3 && parts[0] == "127.0.0.1",
                    "{what}: {p} is not published on 127.0.0.1"
                );
                let (host, port): (u16, u16) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
                assert!(ports.insert(port, host).is_none(), "{what}: {port} published twice");
                if let Some(other) = host_ports.insert(host, name.to_string()) {
                    panic!("{what}: host port {host} is {other}'s too");
                }
            }
            let service = Service { raw: svc.clone(), argv, files, volumes, env, ports };
            services.insert(name.to_string(), service);
        }
        Compose { services }
    }

    /// The metaserver replicas' services.
    fn metas(&self) -> Vec<&str> {
        self.services.keys().filter(|n| n.starts_with("meta")).map(String::as_str).collect()
    }

    /// The replicas' configs, checked as one group; their addresses by id.
    fn replica_group(&self) -> (Vec<(String, MetaConfig)>, BTreeMap<u64, String>) {
        let members: Vec<(String, MetaConfig)> = self
            .metas()
            .into_iter()
            .map(|name| {
                (name.to_string(), check_meta(name, self.services[name].config(name, META_ENV_PREFIX)))
            })
            .collect();
        let replicas = check_replica_group("compose", &members);
        (members, replicas)
    }
}

#[test]
fn compose_services_match_their_configs() {
    let compose = Compose::load();
    let names: BTreeSet<&str> = compose.services.keys().map(String::as_str).collect();
    let mut expected: BTreeSet<String> = ["meta-1", "meta-2", "meta-3", "client"].map(String::from).into();
    expected.extend((1..=6).map(|i| format!("chunk-{i}")));
    assert_eq!(names, expected.iter().map(String::as_str).collect::<BTreeSet<&str>>());
    let (_, replicas) = compose.replica_group();

    // Chunkservers: each advertises its own service name, names every metaserver replica, waits
    // for them to be healthy, and differs from chunk-1 only in advertise.
    let mut first: Option<ChunkConfig> = None;
    for i in 1..=6 {
        let name = format!("chunk-{i}");
        let svc = &compose.services[&name];
        assert_eq!(svc.argv[1], "chunk");
        let cfg = check_chunk(&name, svc.config(&name, CHUNK_ENV_PREFIX));
        let advertise = cfg.advertise.clone().expect("advertise");
        assert_eq!(advertise, format!("{name}:{}", port_of(&cfg.listen)), "{name}");
        check_meta_list(&name, &cfg.meta, &replicas);
        for meta in compose.metas() {
            assert!(svc.depends_on_healthy(meta), "{name} does not wait for {meta} to be healthy");
        }
        let mut same = cfg.clone();
        same.advertise = None;
        match &first {
            None => first = Some(same),
            Some(f) => assert_eq!(&same, f, "{name} differs from chunk-1 in more than advertise"),
        }
    }

    // The client: every replica, FUSE device, SYS_ADMIN, a shared bind mount at the mount point.
    let client = &compose.services["client"];
    let argv = &client.argv;
    assert_eq!(argv[1], "mount");
    let mountpoint = argv.last().unwrap();
    check_meta_list("client --meta", &flag_value("client", argv, "--meta"), &replicas);
    for meta in compose.metas() {
        assert!(client.depends_on_healthy(meta), "the client does not wait for {meta} to be healthy");
    }
    assert!(argv.contains(&"--metrics".to_string()), "client without --metrics");
    let raw = &client.raw;
    assert!(strings(&raw["devices"], "devices").iter().any(|d| d.starts_with("/dev/fuse")));
    assert!(strings(&raw["cap_add"], "cap_add").contains(&"SYS_ADMIN".to_string()));
    let bind = seq(&raw["volumes"], "client volumes")
        .iter()
        .find(|v| v["target"].as_str() == Some(mountpoint))
        .expect("a volume at the mount point");
    assert_eq!(bind["type"], "bind");
    assert!(
        matches!(bind["bind"]["propagation"].as_str(), Some("shared" | "rshared")),
        "the mount point's bind propagation must be shared: {bind:?}"
    );

    // CAIRN_META, where a container has it (for admin commands), names the replicas too.
    for (name, svc) in &compose.services {
        if let Some((_, list)) = svc.env.iter().find(|(k, _)| k == "CAIRN_META") {
            check_meta_list(&format!("{name} CAIRN_META"), list, &replicas);
        }
    }
}

#[test]
fn compose_metaservers_are_one_raft_group_with_their_own_volumes_and_health_checks() {
    let compose = Compose::load();
    let (members, _) = compose.replica_group();
    assert_eq!(members.len(), 3, "three metaserver replicas");
    let mut data_volumes = BTreeSet::new();
    for (name, cfg) in &members {
        let svc = &compose.services[name];
        assert_eq!(svc.argv[1], "meta", "{name}");
        let data_dir = cfg.data_dir.to_str().unwrap();
        let volume =
            svc.volumes.get(data_dir).unwrap_or_else(|| panic!("{name}: no named volume at {data_dir}"));
        assert!(data_volumes.insert(volume.clone()), "{name}: volume {volume} is another replica's too");
        for port in [port_of(&cfg.listen), port_of(cfg.metrics_listen.as_ref().expect("meta metrics_listen"))]
        {
            assert!(svc.ports.contains_key(&port), "{name} does not publish {port}");
        }
        // The health check, as Docker runs it: exec form, or CMD-SHELL with /bin/sh -c.
        let test = strings(&svc.raw["healthcheck"]["test"], name);
        let argv: Vec<String> = match test.first().map(String::as_str) {
            Some("CMD") => test[1..].iter().map(|a| compose_literal(name, a)).collect(),
            Some("CMD-SHELL") => vec!["sh".into(), "-c".into(), compose_literal(name, &test[1..].join(" "))],
            other => panic!("{name}: healthcheck test {other:?}"),
        };
        check_replica_probe(&format!("{name} healthcheck"), &argv, &svc.env, port_of(&cfg.listen));
    }
}

#[test]
fn every_published_metrics_port_is_in_the_readme_scrape_config() {
    let compose = Compose::load();
    let mut published = BTreeSet::new();
    for (name, svc) in &compose.services {
        let metrics = match svc.argv[1].as_str() {
            "meta" => svc.config::<MetaConfig>(name, META_ENV_PREFIX).metrics_listen,
            "chunk" => svc.config::<ChunkConfig>(name, CHUNK_ENV_PREFIX).metrics_listen,
            _ => flag_values(&svc.argv, "--metrics").pop(),
        };
        let port = port_of(&metrics.unwrap_or_else(|| panic!("{name} serves no metrics")));
        let host =
            svc.ports.get(&port).unwrap_or_else(|| panic!("{name} does not publish its metrics port {port}"));
        published.insert(format!("127.0.0.1:{host}"));
    }
    let readme = read("deploy/README.md");
    let start = readme.find("```yaml\nscrape_configs:").expect("a scrape config in deploy/README.md") + 8;
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let config: Value = serde_yaml::from_str(block).unwrap();
    let mut scraped = BTreeSet::new();
    for job in seq(&config["scrape_configs"], "scrape_configs") {
        for sc in seq(&job["static_configs"], "static_configs") {
            scraped.extend(strings(&sc["targets"], "targets"));
        }
    }
    assert_eq!(
        scraped, published,
        "deploy/README.md's scrape config is not every process's published metrics"
    );
}

// ------------------------------------------------------------------------------------- k8s

struct K8s {
    objects: Vec<Value>,
}

impl K8s {
    fn load() -> K8s {
        let mut objects = Vec::new();
        for path in files_under("deploy/k8s", "yaml") {
            let rel = path.strip_prefix(repo()).unwrap().to_string_lossy().to_string();
            objects.extend(yaml_docs(&rel));
        }
        K8s { objects }
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }

    fn config(&self, configmap: &str, key: &str) -> String {
        s(&self.get("ConfigMap", configmap)["data"][key], key).to_string()
    }

    /// The metaserver replicas' addresses by id, from the config every replica reads
    /// (`k8s_metaservers_are_one_raft_group` checks them against the pods).
    fn meta_replicas(&self) -> BTreeMap<u64, String> {
        let cfg: MetaConfig = toml::from_str(&self.config("cairn-meta-config", "meta.toml")).unwrap();
        cfg.replica_addrs().unwrap()
    }
}

fn containers(pod_spec: &Value) -> Vec<&Value> {
    let mut out: Vec<&Value> = Vec::new();
    for key in ["initContainers", "containers"] {
        out.extend(pod_spec[key].as_sequence().into_iter().flatten());
    }
    out
}

fn container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    containers(pod_spec)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn mount_path<'a>(c: &'a Value, volume: &str) -> &'a str {
    let m = seq(&c["volumeMounts"], "volumeMounts").iter().find(|m| m["name"] == volume);
    s(&m.unwrap_or_else(|| panic!("no mount of {volume}"))["mountPath"], "mountPath")
}

fn env<'a>(c: &'a Value, name: &str) -> &'a Value {
    seq(&c["env"], "env").iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no env {name}"))
}

fn container_port(c: &Value, name: &str) -> Option<u64> {
    c["ports"].as_sequence()?.iter().find(|p| p["name"] == name)?["containerPort"].as_u64()
}

/// Whether a label selector (`matchLabels`, not empty) picks pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let wanted = selector["matchLabels"].as_mapping().expect("matchLabels");
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A container's environment in the pod `pod_name` of namespace cairn: literal values and the
/// downward API's pod name and namespace.
fn pod_env(c: &Value, pod_name: &str) -> Vec<(String, String)> {
    let vars = c["env"].as_sequence().into_iter().flatten();
    vars.map(|e| {
        let name = s(&e["name"], "env").to_string();
        let value = match (e["value"].as_str(), e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => pod_name.to_string(),
            (None, Some("metadata.namespace")) => "cairn".to_string(),
            other => panic!("env {name}: {other:?} is not simulated here"),
        };
        (name, value)
    })
    .collect()
}

/// Kubernetes' expansion of a container's command and args: `$(VAR)` of a variable the
/// container defines is its value, `$$` is `$`, and anything else stays as written.
fn k8s_expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(end) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..end + 1];
            match env.iter().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push('$');
                    out.push_str(&after[..end + 2]);
                }
            }
            rest = &after[end + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out + rest
}

/// A container's command line as Kubernetes starts it, in a pod whose environment is `env`.
fn container_argv(c: &Value, env: &[(String, String)]) -> Vec<String> {
    let mut argv = strings(&c["command"], "command");
    if !c["args"].is_null() {
        argv.extend(strings(&c["args"], "args"));
    }
    argv.iter().map(|a| k8s_expand(a, env)).collect()
}

#[test]
fn k8s_objects_are_well_formed() {
    let k8s = K8s::load();
    assert!(k8s.objects.len() >= 10, "{} objects", k8s.objects.len());
    let pod_labels: Vec<(&Value, &Value)> = k8s
        .objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("StatefulSet" | "DaemonSet" | "Deployment")))
        .map(|o| (&o["spec"]["template"]["metadata"]["labels"], &o["spec"]["template"]["spec"]))
        .collect();
    for o in &k8s.objects {
        let kind = s(&o["kind"], "kind");
        let name = s(&o["metadata"]["name"], "metadata.name");
        let what = format!("{kind} {name}");
        assert!(!s(&o["apiVersion"], &what).is_empty(), "{what}: no apiVersion");
        assert!(!name.is_empty());
        if kind != "Namespace" {
            assert_eq!(o["metadata"]["namespace"], "cairn", "{what}: not in namespace cairn");
        }
        let spec = &o["spec"];
        if let Some(template) = spec.get("template") {
            let labels = template["metadata"]["labels"].as_mapping().expect("pod labels");
            for (k, v) in spec["selector"]["matchLabels"].as_mapping().expect("selector") {
                assert_eq!(labels.get(k), Some(v), "{what}: the selector does not match the pod labels");
            }
            let pod = &template["spec"];
            let mut volumes: BTreeSet<&str> =
                seq(&pod["volumes"], &what).iter().map(|v| s(&v["name"], &what)).collect();
            for t in spec["volumeClaimTemplates"].as_sequence().into_iter().flatten() {
                volumes.insert(s(&t["metadata"]["name"], &what));
            }
            let mut metrics_port = None;
            for c in containers(pod) {
                let cwhat = format!("{what} container {}", s(&c["name"], &what));
                assert!(!s(&c["image"], &cwhat).is_empty(), "{cwhat}: no image");
                let command = strings(&c["command"], &cwhat);
                assert!(!command.is_empty(), "{cwhat}: no command");
                let args = c["args"].as_sequence().map(|_| strings(&c["args"], &cwhat)).unwrap_or_default();
                if command[0] == "cairn" || args.iter().any(|a| a.contains("exec cairn ")) {
                    let argv = cairn_argv(&cwhat, &command, &args);
                    check_cairn_flags(&cwhat, &argv);
                    // The servers take every CAIRN_META_<KEY> / CAIRN_CHUNK_<KEY> variable as a
                    // setting and refuse unknown keys: no Service variables
                    // (CAIRN_META_SERVICE_HOST, ...) in their pods.
                    if matches!(argv[1].as_str(), "meta" | "chunk") {
                        assert_eq!(pod["enableServiceLinks"], false, "{cwhat}: enableServiceLinks");
                    }
                }
                for m in c["volumeMounts"].as_sequence().into_iter().flatten() {
                    assert!(volumes.contains(s(&m["name"], &cwhat)), "{cwhat}: mounts unknown {m:?}");
                }
                assert!(c["resources"]["requests"].is_mapping(), "{cwhat}: no resource requests");
                metrics_port = metrics_port.or(container_port(c, "metrics"));
            }
            // Prometheus finds every pod that serves metrics, on the right port.
            if let Some(port) = metrics_port {
                let ann = &template["metadata"]["annotations"];
                assert_eq!(ann["prometheus.io/scrape"], "true", "{what}");
                assert_eq!(ann["prometheus.io/port"], port.to_string().as_str(), "{what}");
                assert_eq!(ann["prometheus.io/path"], "/metrics", "{what}");
            } else {
                panic!("{what}: no container port named metrics");
            }
        }
        if kind == "StatefulSet" {
            k8s.get("Service", s(&spec["serviceName"], &what));
        }
        if kind == "Service" {
            // The selector picks pods that have every port the Service targets.
            let selector = spec["selector"].as_mapping().expect("service selector");
            let (_, pod) = pod_labels
                .iter()
                .find(|(labels, _)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
                .unwrap_or_else(|| panic!("{what}: the selector matches no pod template"));
            for p in seq(&spec["ports"], &what) {
                let target = s(&p["targetPort"], &what);
                assert!(
                    containers(pod).iter().any(|c| container_port(c, target).is_some()),
                    "{what}: no container port named {target}"
                );
            }
        }
        if kind == "PodDisruptionBudget" {
            let picked = pod_labels.iter().filter(|(labels, _)| selects(&spec["selector"], labels)).count();
            assert_eq!(picked, 1, "{what}: selects {picked} pod templates, not one");
        }
    }
    // An eviction is refused for a pod that two budgets select.
    for (labels, _) in &pod_labels {
        let budgets =
            k8s.of_kind("PodDisruptionBudget").filter(|p| selects(&p["spec"]["selector"], labels)).count();
        assert!(budgets <= 1, "pods labelled {labels:?} are under {budgets} PodDisruptionBudgets");
    }
}

#[test]
fn k8s_metaservers_are_one_raft_group() {
    let k8s = K8s::load();
    let sts = k8s.get("StatefulSet", "cairn-meta");
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 3, "three metaserver replicas");
    // OrderedReady would start cairn-meta-1 only once cairn-meta-0 is ready, which it cannot be
    // without a leader, which needs a second replica.
    assert_eq!(spec["podManagementPolicy"], "Parallel", "the replicas must start together");
    let service = s(&spec["serviceName"], "serviceName");
    let headless = &k8s.get("Service", service)["spec"];
    assert_eq!(
        headless["clusterIP"], "None",
        "the metaservers' Service must be headless (a DNS name per pod)"
    );
    assert_eq!(
        headless["publishNotReadyAddresses"], true,
        "replicas must reach each other before they are ready"
    );
    let vct = seq(&spec["volumeClaimTemplates"], "volumeClaimTemplates");
    assert_eq!(vct.len(), 1);
    let labels = &spec["template"]["metadata"]["labels"];
    let pod = &spec["template"]["spec"];
    let c = container(pod, "meta");

    // Without its pod's raft_id the shared file is no replica, so a pod whose start command lost
    // the override stops instead of posing as another replica.
    let text = k8s.config("cairn-meta-config", "meta.toml");
    let file: MetaConfig = toml::from_str(&text).unwrap();
    let refused = file.validate().expect_err("meta.toml is a replica without a per-pod raft_id");
    assert!(refused.message().contains("raft_id"), "{}", refused.message());

    // Start each pod's command as Kubernetes would, with a stand-in for cairn, and load the
    // config it is given as `cairn meta` loads it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meta.toml"), &text).unwrap();
    let config_dir = mount_path(c, "config");
    let name = s(&sts["metadata"]["name"], "name");
    let mut members = Vec::new();
    for ordinal in 0..3 {
        let pod_name = format!("{name}-{ordinal}");
        let env = pod_env(c, &pod_name);
        let (ok, calls) = run_with_fake_cairn(&container_argv(c, &env), &env, 0);
        let [call] = calls.as_slice() else { panic!("{pod_name}: ran cairn {calls:?}, not once") };
        assert!(ok, "{pod_name}: the start command failed");
        check_cairn_flags(&pod_name, call);
        assert_eq!(call[1], "meta", "{pod_name}: {call:?}");
        let config = flag_value(&pod_name, call, "--config");
        let file =
            Path::new(&config).strip_prefix(config_dir).expect("--config outside the ConfigMap's mount");
        let loaded = load_with(
            Some(&dir.path().join(file)),
            META_ENV_PREFIX,
            env.clone(),
            &flag_values(call, "--set"),
        );
        let cfg = check_meta(&pod_name, loaded.unwrap_or_else(|e| panic!("{pod_name}: {}", e.message())));
        members.push((format!("{pod_name}.{service}.cairn.svc.cluster.local"), cfg));
    }
    let replicas = check_replica_group("StatefulSet cairn-meta", &members);
    // A pod name without an ordinal stops the pod instead of guessing an id.
    let env = pod_env(c, name);
    let (ok, calls) = run_with_fake_cairn(&container_argv(c, &env), &env, 0);
    assert!(!ok && calls.is_empty(), "a pod named {name} started cairn {calls:?}");

    // Data, ports, the Service, health.
    let meta = &members[0].1;
    assert_eq!(Path::new(mount_path(c, s(&vct[0]["metadata"]["name"], "vct"))), meta.data_dir);
    assert_eq!(container_port(c, "grpc"), Some(port_of(&meta.listen) as u64));
    assert_eq!(container_port(c, "metrics"), Some(port_of(meta.metrics_listen.as_deref().unwrap()) as u64));
    assert!(seq(&headless["ports"], "ports").iter().any(|p| p["port"] == port_of(&meta.listen) as u64));
    let probe = strings(&c["readinessProbe"]["exec"]["command"], "readinessProbe");
    check_replica_probe(
        "cairn-meta readinessProbe",
        &probe,
        &pod_env(c, &format!("{name}-0")),
        port_of(&meta.listen),
    );
    // Liveness restarts the container: it must not hang on the other replicas.
    assert!(
        c["livenessProbe"]["exec"].is_null(),
        "the liveness probe runs a command: {:?}",
        c["livenessProbe"]
    );
    if let Some((_, list)) = pod_env(c, name).iter().find(|(k, _)| k == "CAIRN_META") {
        check_meta_list("cairn-meta CAIRN_META", list, &replicas);
    }

    // One replica per node: a node's loss must not take the majority.
    let required = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert!(
        required.as_sequence().into_iter().flatten().any(|t| {
            t["topologyKey"] == "kubernetes.io/hostname" && selects(&t["labelSelector"], labels)
        }),
        "no required anti-affinity of the metaserver pods per node: {required:?}"
    );

    // Voluntary disruptions take one replica at a time: two of three keep a majority.
    let budgets: Vec<&Value> =
        k8s.of_kind("PodDisruptionBudget").filter(|p| selects(&p["spec"]["selector"], labels)).collect();
    let [budget] = budgets.as_slice() else {
        panic!("{} PodDisruptionBudgets for the metaservers", budgets.len())
    };
    assert_eq!(budget["apiVersion"], "policy/v1");
    let n = replicas.len() as u64;
    let allowed = match (budget["spec"]["maxUnavailable"].as_u64(), budget["spec"]["minAvailable"].as_u64()) {
        (Some(max), None) => max,
        (None, Some(min)) => n.saturating_sub(min),
        other => panic!("the metaservers' budget: maxUnavailable or minAvailable, a number: {other:?}"),
    };
    assert_eq!(allowed, 1, "the metaservers' budget allows {allowed} disruptions, not one");
}

#[test]
fn k8s_chunkservers_render_their_config_and_have_both_tiers() {
    let k8s = K8s::load();
    let template = k8s.config("cairn-chunk-config", "chunk.toml");
    let sts = k8s.get("StatefulSet", "cairn-chunk");
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 6);
    let headless = k8s.get("Service", s(&spec["serviceName"], "serviceName"));
    assert_eq!(headless["spec"]["clusterIP"], "None", "the chunkservers' Service must be headless");
    let claims: BTreeMap<&str, &Value> = seq(&spec["volumeClaimTemplates"], "volumeClaimTemplates")
        .iter()
        .map(|t| (s(&t["metadata"]["name"], "vct"), t))
        .collect();
    assert_eq!(claims.keys().copied().collect::<Vec<_>>(), ["hdd", "ssd"]);
    for (name, claim) in &claims {
        assert!(claim["spec"]["storageClassName"].is_string(), "{name}: no storageClassName");
        assert!(claim["spec"]["resources"]["requests"]["storage"].is_string(), "{name}: no size");
    }

    // Run the init container's script, as the pod would, on a copy of the template.
    let pod = &spec["template"]["spec"];
    let init = container(pod, "render-config");
    assert_eq!(strings(&init["command"], "render-config"), ["sh", "-c"]);
    let script = strings(&init["args"], "render-config").remove(0);
    let (template_dir, config_dir) = (mount_path(init, "config-template"), mount_path(init, "config"));
    for placeholder in ["__POD_NAME__", "__POD_NAMESPACE__"] {
        assert!(template.contains(placeholder), "the template has no {placeholder}");
    }
    assert_eq!(env(init, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(env(init, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace");
    let tmp = tempfile::tempdir().unwrap();
    let (tdir, cdir) = (tmp.path().join("template"), tmp.path().join("config"));
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(tdir.join("chunk.toml"), &template).unwrap();
    let local = script
        .replace(&format!("{template_dir}/"), &format!("{}/", tdir.display()))
        .replace(&format!("{config_dir}/"), &format!("{}/", cdir.display()));
    let pod_name = format!("{}-3", s(&sts["metadata"]["name"], "name"));
    let out = Command::new("sh")
        .args(["-c", &local])
        .env("POD_NAME", &pod_name)
        .env("POD_NAMESPACE", "cairn")
        .output()
        .unwrap();
    assert!(out.status.success(), "render-config failed: {}", String::from_utf8_lossy(&out.stderr));
    let rendered = std::fs::read_to_string(cdir.join("chunk.toml")).unwrap();
    assert!(!rendered.contains("__"), "a placeholder is left:\n{rendered}");
    let cfg = parse_chunk("rendered chunk.toml", &rendered);
    let headless_name = s(&headless["metadata"]["name"], "name");
    assert_eq!(
        cfg.advertise.as_deref(),
        Some(format!("{pod_name}.{headless_name}.cairn.svc.cluster.local:{}", port_of(&cfg.listen)).as_str())
    );
    check_meta_list("rendered chunk.toml", &cfg.meta, &k8s.meta_replicas());

    // The main container reads what the init container wrote, and its tiers are on the claims.
    let c = container(pod, "chunk");
    assert_eq!(mount_path(c, "config"), config_dir);
    assert_eq!(strings(&c["command"], "chunk")[3], format!("{config_dir}/chunk.toml"));
    let (ssd, hdd) = (Path::new(mount_path(c, "ssd")), Path::new(mount_path(c, "hdd")));
    assert!(cfg.ssd_dirs.iter().all(|d| d.starts_with(ssd)), "ssd_dirs not on the ssd claim");
    assert!(cfg.hdd_dirs.iter().all(|d| d.starts_with(hdd)), "hdd_dirs not on the hdd claim");
    assert!(cfg.state_dir.starts_with(ssd) || cfg.state_dir.starts_with(hdd), "state_dir on no claim");
    assert_eq!(container_port(c, "grpc"), Some(port_of(&cfg.listen) as u64));
    assert_eq!(container_port(c, "metrics"), Some(port_of(cfg.metrics_listen.as_deref().unwrap()) as u64));
}

#[test]
fn k8s_client_daemonset_mounts_with_bidirectional_propagation() {
    let k8s = K8s::load();
    let ds = k8s.of_kind("DaemonSet").next().expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = container(pod, "mount");
    assert_eq!(c["securityContext"]["privileged"], true);
    let volumes = seq(&pod["volumes"], "volumes");
    let host_path = |name: &str| {
        let v = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
        s(&v["hostPath"]["path"], name).to_string()
    };
    let mounts = seq(&c["volumeMounts"], "volumeMounts");
    assert!(mounts.iter().any(|m| host_path(s(&m["name"], "name")) == "/dev/fuse"), "no /dev/fuse");
    let shared = mounts
        .iter()
        .find(|m| m["mountPropagation"] == "Bidirectional")
        .expect("a volumeMount with mountPropagation: Bidirectional");
    let in_container = s(&shared["mountPath"], "mountPath");
    let on_host = host_path(s(&shared["name"], "name"));

    let argv = cairn_argv("client", &strings(&c["command"], "command"), &strings(&c["args"], "args"));
    assert_eq!(argv[1], "mount");
    let meta = flag_value("client", &argv, "--meta");
    let meta = if meta == "$CAIRN_META" {
        s(&env(c, "CAIRN_META")["value"], "CAIRN_META").to_string()
    } else {
        meta
    };
    check_meta_list("client --meta", &meta, &k8s.meta_replicas());
    // The FUSE mount lands in the Bidirectional volume, so the node sees it at /mnt/cairn.
    let mountpoint = Path::new(argv.last().unwrap());
    let rel = mountpoint.strip_prefix(in_container).expect("the mount point is outside the shared volume");
    assert_eq!(Path::new(&on_host).join(rel), Path::new("/mnt/cairn"));
    let metrics = argv.iter().position(|a| a == "--metrics").map(|i| argv[i + 1].clone()).expect("--metrics");
    assert_eq!(container_port(c, "metrics"), Some(port_of(&metrics) as u64));

    let pre_stop = strings(&c["lifecycle"]["preStop"]["exec"]["command"], "preStop").join(" ");
    assert!(pre_stop.contains(&format!("umount {}", mountpoint.display())), "preStop: {pre_stop}");
}

// ------------------------------------------------------------------------------------- grafana

/// Every name `cairn_[a-z_]+` in `text` that starts at a word boundary, in order.
fn cairn_refs(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("cairn_").map(|p| p + i) {
        let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let end = at + text[at..].bytes().take_while(|b| b.is_ascii_lowercase() || *b == b'_').count();
        if boundary {
            out.push(text[at..end].trim_end_matches('_').to_string());
        }
        i = end.max(at + 1);
    }
    out
}

/// Names `cairn_[a-z_]+` in `text`, each starting at a word boundary.
fn cairn_names(text: &str) -> BTreeSet<String> {
    cairn_refs(text).into_iter().collect()
}

/// How a query keeps the series of the leader (or of a lone metaserver, which has no Raft
/// metrics) and drops the other replicas'.
const FROM_THE_LEADER: &str = "unless on(instance) (cairn_meta_raft_is_leader == 0)";

/// The metaserver's cluster gauges (docs/metrics.md: all of `cairn_meta_*` but its Raft metrics,
/// `cairn_repair_*`, `cairn_health`) come from the leader only, and a replica that led before
/// goes on exporting the last values it set: every read of one in `expr` must be followed by
/// [`FROM_THE_LEADER`], or a former leader's stale value shows (and pages) for ever.
fn check_reads_the_leader(what: &str, expr: &str) {
    let leader_only = |name: &String| {
        let meta = name.starts_with("cairn_meta_") && !name.starts_with("cairn_meta_raft_");
        (meta || name.starts_with("cairn_repair_") || name == "cairn_health") && !name.ends_with("_total")
    };
    let reads = cairn_refs(expr).iter().filter(|n| leader_only(n)).count();
    let filtered = expr.matches(FROM_THE_LEADER).count();
    assert!(
        filtered >= reads,
        "{what}: {expr}\nreads {reads} leader-only gauges, {filtered} of them with `{FROM_THE_LEADER}`"
    );
}

fn exprs(panels: &[serde_json::Value], out: &mut Vec<String>) {
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("target expr").to_string());
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {}", p["title"]);
        }
        if let Some(inner) = p["panels"].as_array() {
            exprs(inner, out);
        }
    }
}

#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let dash: serde_json::Value = serde_json::from_str(&read("deploy/grafana/cairn-dashboard.json")).unwrap();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(dash["__inputs"].as_array().unwrap().iter().any(|i| i["name"] == "DS_PROMETHEUS"));
    let panels = dash["panels"].as_array().unwrap();
    let mut all = Vec::new();
    exprs(panels, &mut all);
    assert!(all.len() >= 20, "{} expressions", all.len());

    let mut exported = BTreeSet::new();
    for rel in ["common", "metaserver", "chunkserver", "client-fuse"] {
        exported.extend(cairn_names(&read(&format!("{rel}/src/metrics.rs"))));
    }
    assert!(exported.contains("cairn_client_fuse_op_seconds"), "{exported:?}");
    let mut used = BTreeSet::new();
    for e in &all {
        for name in cairn_names(e) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|b| exported.contains(*b)))
                .unwrap_or(&name);
            assert!(
                exported.contains(base),
                "the dashboard queries {name}, which no metrics.rs exports:\n{e}"
            );
            used.insert(base.to_string());
        }
        assert_eq!(e.matches('(').count(), e.matches(')').count(), "unbalanced parentheses: {e}");
        check_reads_the_leader("the dashboard", e);
    }
    // What an operator looks at first is there.
    for must in [
        "histogram_quantile(0.99, sum by (op, le) (rate(cairn_client_fuse_op_seconds_bucket",
        "cairn_rpc_requests_total{code!=\"Ok\"}",
        "cairn_chunk_shard_reads_total{tier=\"ssd\"}",
        "cairn_repair_unrecoverable_stripes",
        "cairn_meta_rocksdb{property=\"write_stopped\"}",
        "max by (instance) (cairn_meta_raft_is_leader)",
        "rate(cairn_meta_raft_commit_seconds_bucket",
    ] {
        assert!(all.iter().any(|e| e.contains(must)), "no panel queries {must}");
    }
    assert!(used.len() >= 30, "{used:?}");

    // Panels have distinct ids and do not overlap on the 24-column grid.
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id {}", p["id"]);
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "panel {} is wider than the grid", p["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "panel {} overlaps another", p["title"]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------- prometheus

#[test]
fn alert_rules_use_exported_metrics_and_page_on_stripes_that_can_lose_nothing() {
    let rules = yaml_docs("deploy/prometheus/cairn-alerts.yml");
    assert_eq!(rules.len(), 1);
    let mut exported = BTreeSet::new();
    for rel in ["common", "metaserver", "chunkserver", "client-fuse"] {
        exported.extend(cairn_names(&read(&format!("{rel}/src/metrics.rs"))));
    }
    let mut critical = Vec::new();
    let groups = rules[0]["groups"].as_sequence().expect("groups");
    for rule in groups.iter().flat_map(|g| g["rules"].as_sequence().expect("rules")) {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
        for metric in cairn_names(expr) {
            assert!(exported.contains(&metric), "{name} uses {metric}, which no metrics.rs exports");
        }
        assert_eq!(expr.matches('(').count(), expr.matches(')').count(), "{name}: {expr}");
        check_reads_the_leader(name, expr);
        let severity = rule["labels"]["severity"].as_str().unwrap_or_else(|| panic!("{name}: severity"));
        assert!(["warning", "critical"].contains(&severity), "{name}: {severity}");
        assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: summary");
        if severity == "critical" {
            critical.push(expr.to_string());
        }
    }
    assert!(
        critical.iter().any(|e| e.contains("cairn_repair_reduced_stripes{can_lose=\"0\"}")),
        "no critical alert on stripes that can lose 0 more shards: {critical:?}"
    );
}

// ------------------------------------------------------------------------------------- systemd

#[test]
fn systemd_units_run_cairn_with_flags_it_has() {
    for unit in files_under("deploy/systemd", "service") {
        let what = unit.display().to_string();
        let text = std::fs::read_to_string(&unit).unwrap();
        for line in text.lines().map(str::trim) {
            if let Some(exec) = line.strip_prefix("ExecStart=/usr/local/bin/cairn ") {
                let argv: Vec<String> =
                    std::iter::once("cairn").chain(exec.split_whitespace()).map(String::from).collect();
                check_cairn_flags(&what, &argv);
            }
            // The mount's metaservers: every replica, comma-separated.
            if let Some(list) = line.strip_prefix("Environment=CAIRN_META=") {
                assert!(
                    meta_addrs(&what, list).len() >= 3,
                    "{what}: CAIRN_META={list} is not a replica group"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------------------- docker

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn dockerfile() -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in read("deploy/docker/Dockerfile").lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                if !cur.trim().is_empty() {
                    out.push(cur.split_whitespace().collect::<Vec<_>>().join(" "));
                }
                cur.clear();
            }
        }
    }
    out
}

#[test]
fn dockerfile_builds_the_cairn_package_and_ships_the_binary() {
    let lines = dockerfile();
    let froms: Vec<&String> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage: {froms:?}");
    assert!(froms[0].contains("-bookworm AS build"), "{}", froms[0]);
    assert!(froms[1].starts_with("FROM debian:bookworm-slim"), "{}", froms[1]);
    let split = lines.iter().position(|l| l == froms[1]).unwrap();
    let (build, runtime) = lines.split_at(split);

    let build_run = build.iter().find(|l| l.contains("cargo build")).expect("a cargo build");
    assert!(build_run.contains("--release") && build_run.contains("-p cairn"), "{build_run}");
    // .cargo/config.toml links Debian's librocksdb from a fixed directory; the image sets it.
    assert!(read(".cargo/config.toml").contains("ROCKSDB_LIB_DIR"));
    assert!(build_run.contains("ROCKSDB_LIB_DIR="), "{build_run}");
    let installed = |stage: &[String]| -> BTreeSet<String> {
        stage
            .iter()
            .filter(|l| l.contains("apt-get install"))
            .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    let build_pkgs = installed(build);
    for p in ["librocksdb-dev", "libclang-dev", "clang", "protobuf-compiler", "pkg-config", "libfuse3-dev"] {
        assert!(build_pkgs.contains(p), "the build stage does not install {p}");
        assert!(read("scripts/deps.sh").contains(p), "{p} is not in scripts/deps.sh either");
    }
    let runtime_pkgs = installed(runtime);
    for p in ["fuse3", "librocksdb7.8", "ca-certificates"] {
        assert!(runtime_pkgs.contains(p), "the runtime stage does not install {p}");
    }
    // The binary is built where it is copied from, and lands in /usr/local/bin, as the systemd
    // units expect.
    let copy = runtime.iter().find(|l| l.starts_with("COPY --from=build ")).expect("COPY --from=build");
    let parts: Vec<&str> = copy.split_whitespace().collect();
    assert_eq!(parts.last(), Some(&"/usr/local/bin/cairn"), "{copy}");
    assert!(build_run.contains(parts[2]), "{copy} copies what the build did not write");
    for unit in files_under("deploy/systemd", "service") {
        let text = std::fs::read_to_string(&unit).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/cairn "), "{}", unit.display());
    }
    let ignore = read("deploy/docker/Dockerfile.dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target"), "target/ is sent to the builder");

    // The runtime package is the RocksDB the binary really links (Debian names the library
    // package after its soname: librocksdb.so.7.8 is in librocksdb7.8).
    match Command::new("ldd").arg(CAIRN).output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let soname = text
                .split_whitespace()
                .find(|w| w.starts_with("librocksdb.so."))
                .unwrap_or_else(|| panic!("cairn does not link a shared librocksdb:\n{text}"));
            let package = format!("librocksdb{}", soname.trim_start_matches("librocksdb.so."));
            assert!(runtime_pkgs.contains(&package), "cairn links {soname}: the runtime needs {package}");
        }
        _ => eprintln!("ldd is not available: the librocksdb soname was not checked"),
    }
}
