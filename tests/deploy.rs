//! Offline checks of the deployment artifacts under `deploy/`: every TOML config parses with the
//! servers' own parser and validates; the compose file and the Kubernetes manifests parse and
//! agree with the configs they carry (service names, ports, mount points, volumes); every
//! `cairn` command line in them uses flags the binary has; the Grafana dashboard only queries
//! metrics the code exports; the Dockerfile builds the `cairn` package and ships the binary.
//! Nothing here needs Docker, a cluster or the network (`scripts/validate-deploy.sh` adds schema
//! validation with tools from PyPI).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_common::config::{ChunkConfig, MetaConfig};
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

/// `validate()` resolves host names, and the names of a deployment (`meta:9400`,
/// `cairn-meta:9400`) do not resolve here. Check that `addr` is HOST:PORT with a well-formed
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

fn check_meta(what: &str, cfg: MetaConfig) -> MetaConfig {
    let mut offline = cfg.clone();
    offline.listen = offline_addr(what, &cfg.listen);
    offline.validate().unwrap_or_else(|e| panic!("{what}: {}", e.message()));
    check_metrics_listen(what, &cfg.metrics_listen);
    cfg
}

fn check_chunk(what: &str, cfg: ChunkConfig) -> ChunkConfig {
    let mut offline = cfg.clone();
    offline.listen = offline_addr(what, &cfg.listen);
    offline.meta = offline_addr(what, &cfg.meta);
    if let Some(a) = &cfg.advertise {
        offline_addr(what, a);
    }
    offline.validate().unwrap_or_else(|e| panic!("{what}: {}", e.message()));
    check_metrics_listen(what, &cfg.metrics_listen);
    cfg
}

fn parse_meta(what: &str, text: &str) -> MetaConfig {
    check_meta(what, toml::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}")))
}

fn parse_chunk(what: &str, text: &str) -> ChunkConfig {
    check_chunk(what, toml::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}")))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("no port in {addr:?}"))
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr)
}

#[test]
fn every_toml_under_deploy_parses_and_validates() {
    let files = files_under("deploy", "toml");
    assert!(files.len() >= 9, "{files:?}");
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

/// Every `--flag` of a `cairn SUBCOMMAND ...` command line is one the binary accepts.
fn check_cairn_flags(what: &str, argv: &[String]) {
    assert_eq!(argv.first().map(String::as_str), Some("cairn"), "{what}: {argv:?}");
    let sub = argv.get(1).unwrap_or_else(|| panic!("{what}: no subcommand in {argv:?}"));
    let out = Command::new(CAIRN).args([sub.as_str(), "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what}: `cairn {sub} --help` failed: {help}");
    for flag in argv.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().unwrap();
        assert!(help.contains(&format!("{flag} ")), "{what}: `cairn {sub}` has no {flag}:\n{help}");
    }
}

/// The `cairn ...` invocation in a container command: the command itself, or the line of a
/// `sh -c` script that execs it.
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

// ------------------------------------------------------------------------------------- compose

#[test]
fn compose_services_match_their_configs() {
    let docs = yaml_docs("deploy/docker/compose.yaml");
    assert_eq!(docs.len(), 1);
    let compose = &docs[0];
    let services = compose["services"].as_mapping().expect("services");
    let names: BTreeSet<String> = services.keys().map(|k| s(k, "service name").to_string()).collect();
    let mut expected: BTreeSet<String> = ["meta", "client"].iter().map(|s| s.to_string()).collect();
    expected.extend((1..=6).map(|i| format!("chunk-{i}")));
    assert_eq!(names, expected);
    let declared_volumes: BTreeSet<String> = compose["volumes"]
        .as_mapping()
        .map(|m| m.keys().map(|k| s(k, "volume").to_string()).collect())
        .unwrap_or_default();

    let docker_dir = repo().join("deploy/docker");
    let mut configs = BTreeMap::new(); // container path -> host file, per service
    for (name, svc) in services {
        let name = s(name, "service");
        let what = format!("compose service {name}");
        assert!(svc["image"].is_string(), "{what}: no image");
        let build = &svc["build"];
        let context = docker_dir.join(s(&build["context"], &what));
        assert!(context.join(s(&build["dockerfile"], &what)).is_file(), "{what}: build.dockerfile not found");
        assert!(context.join("Cargo.toml").is_file(), "{what}: the build context is not the workspace");
        let argv = strings(&svc["command"], &what);
        check_cairn_flags(&what, &argv);
        if svc["healthcheck"]["test"].is_sequence() {
            let test = strings(&svc["healthcheck"]["test"], &what);
            if test.get(1).map(String::as_str) == Some("cairn") {
                check_cairn_flags(&format!("{what} healthcheck"), &test[1..]);
            }
        }
        for dep in svc["depends_on"].as_mapping().into_iter().flat_map(|m| m.keys()) {
            assert!(names.contains(s(dep, &what)), "{what}: depends on unknown {dep:?}");
        }
        let mut mounts = BTreeMap::new();
        for vol in svc["volumes"].as_sequence().into_iter().flatten() {
            if let Some(short) = vol.as_str() {
                let parts: Vec<&str> = short.split(':').collect();
                let (source, target) = (parts[0], parts[1]);
                if source.starts_with("./") {
                    assert!(docker_dir.join(source).is_file(), "{what}: {source} does not exist");
                    mounts.insert(target.to_string(), docker_dir.join(source));
                } else {
                    assert!(declared_volumes.contains(source), "{what}: volume {source} is not declared");
                }
            }
        }
        configs.insert(name.to_string(), (argv, mounts));
    }

    // The metaserver: its config, its published ports.
    let (argv, mounts) = &configs["meta"];
    let meta_path = &mounts[&argv[3]];
    let meta = check_meta("meta.toml", cairn_common::config::load(meta_path).unwrap());
    let ports = strings(&services["meta"]["ports"], "meta ports");
    for port in [port_of(&meta.listen), port_of(meta.metrics_listen.as_ref().expect("meta metrics_listen"))] {
        assert!(ports.iter().any(|p| p.ends_with(&format!(":{port}"))), "meta does not publish {port}");
    }

    // Chunkservers: each advertises its own service name, reaches the metaserver by its name,
    // and differs from chunk-1 only in that.
    let mut first: Option<ChunkConfig> = None;
    for i in 1..=6 {
        let name = format!("chunk-{i}");
        let (argv, mounts) = &configs[&name];
        assert_eq!(argv[1], "chunk");
        let cfg = check_chunk(&name, cairn_common::config::load(&mounts[&argv[3]]).unwrap());
        let advertise = cfg.advertise.clone().expect("advertise");
        assert_eq!(advertise, format!("{name}:{}", port_of(&cfg.listen)), "{name}");
        assert_eq!(host_of(&cfg.meta), "meta");
        assert_eq!(port_of(&cfg.meta), port_of(&meta.listen));
        let metrics = port_of(cfg.metrics_listen.as_ref().expect("chunk metrics_listen"));
        let ports = strings(&services[name.as_str()]["ports"], &name);
        assert!(ports.iter().any(|p| p.ends_with(&format!(":{metrics}"))), "{name} does not publish metrics");
        let mut same = cfg.clone();
        same.advertise = None;
        match &first {
            None => first = Some(same),
            Some(f) => assert_eq!(&same, f, "{name} differs from chunk-1 in more than advertise"),
        }
    }

    // The client: FUSE device, SYS_ADMIN, a shared bind mount at the mount point.
    let client = &services["client"];
    let (argv, _) = &configs["client"];
    assert_eq!(argv[1], "mount");
    let mountpoint = argv.last().unwrap();
    let meta_flag = argv.iter().position(|a| a == "--meta").map(|i| &argv[i + 1]).expect("--meta");
    assert_eq!(meta_flag, &format!("meta:{}", port_of(&meta.listen)));
    assert!(argv.contains(&"--metrics".to_string()), "client without --metrics");
    assert!(strings(&client["devices"], "devices").iter().any(|d| d.starts_with("/dev/fuse")));
    assert!(strings(&client["cap_add"], "cap_add").contains(&"SYS_ADMIN".to_string()));
    let bind = seq(&client["volumes"], "client volumes")
        .iter()
        .find(|v| v["target"].as_str() == Some(mountpoint))
        .expect("a volume at the mount point");
    assert_eq!(bind["type"], "bind");
    assert!(
        matches!(bind["bind"]["propagation"].as_str(), Some("shared" | "rshared")),
        "the mount point's bind propagation must be shared: {bind:?}"
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

#[test]
fn k8s_objects_are_well_formed() {
    let k8s = K8s::load();
    assert!(k8s.objects.len() >= 9, "{} objects", k8s.objects.len());
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
                    check_cairn_flags(&cwhat, &cairn_argv(&cwhat, &command, &args));
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
    }
}

#[test]
fn k8s_metaserver_and_its_config_agree() {
    let k8s = K8s::load();
    let meta = parse_meta("cairn-meta-config meta.toml", &k8s.config("cairn-meta-config", "meta.toml"));
    let sts = k8s.get("StatefulSet", "cairn-meta");
    assert_eq!(sts["spec"]["replicas"], 1, "one metaserver");
    let vct = seq(&sts["spec"]["volumeClaimTemplates"], "volumeClaimTemplates");
    assert_eq!(vct.len(), 1);
    let pod = &sts["spec"]["template"]["spec"];
    let c = container(pod, "meta");
    assert_eq!(Path::new(mount_path(c, s(&vct[0]["metadata"]["name"], "vct"))), meta.data_dir);
    assert_eq!(strings(&c["command"], "meta")[3], format!("{}/meta.toml", mount_path(c, "config")));
    assert_eq!(container_port(c, "grpc"), Some(port_of(&meta.listen) as u64));
    assert_eq!(container_port(c, "metrics"), Some(port_of(meta.metrics_listen.as_deref().unwrap()) as u64));
    let svc = k8s.get("Service", "cairn-meta");
    assert!(seq(&svc["spec"]["ports"], "ports").iter().any(|p| p["port"] == port_of(&meta.listen) as u64));
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
    assert_eq!(host_of(&cfg.meta), "cairn-meta");
    let meta = parse_meta("meta.toml", &k8s.config("cairn-meta-config", "meta.toml"));
    assert_eq!(port_of(&cfg.meta), port_of(&meta.listen));
    k8s.get("Service", "cairn-meta");

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
    let meta = argv.iter().position(|a| a == "--meta").map(|i| argv[i + 1].clone()).expect("--meta");
    let meta = if meta == "$CAIRN_META" {
        s(&env(c, "CAIRN_META")["value"], "CAIRN_META").to_string()
    } else {
        meta
    };
    assert_eq!(host_of(&meta), "cairn-meta");
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

/// Names `cairn_[a-z_]+` in `text`, each starting at a word boundary.
fn cairn_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("cairn_").map(|p| p + i) {
        let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let end = at + text[at..].bytes().take_while(|b| b.is_ascii_lowercase() || *b == b'_').count();
        if boundary {
            out.insert(text[at..end].trim_end_matches('_').to_string());
        }
        i = end.max(at + 1);
    }
    out
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
    }
    // What an operator looks at first is there.
    for must in [
        "histogram_quantile(0.99, sum by (op, le) (rate(cairn_client_fuse_op_seconds_bucket",
        "cairn_rpc_requests_total{code!=\"Ok\"}",
        "cairn_chunk_shard_reads_total{tier=\"ssd\"}",
        "cairn_repair_unrecoverable_stripes",
        "cairn_meta_rocksdb{property=\"write_stopped\"}",
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
