//! `deploy/k8s/`: the objects are well formed; the metaserver StatefulSet is one Raft group; the
//! chunkservers render their config with both tiers; the client DaemonSet mounts with
//! bidirectional propagation.

use super::*;

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
        // A new (or replaced) volume holds no data: without this the pod would refuse to start.
        assert!(call.iter().any(|a| a == "--init-if-empty"), "{pod_name}: {call:?}");
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

/// Where a container writes `path`: the mount that holds it (deepest mount path), if any.
fn mount_holding<'a>(c: &'a Value, path: &Path) -> Option<&'a Value> {
    c["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|m| path.starts_with(s(&m["mountPath"], "mountPath")))
        .max_by_key(|m| s(&m["mountPath"], "mountPath").len())
}

/// The servers' pods run as a user that is not root, without privilege escalation or
/// capabilities, on a read-only root file system: so every directory their config writes is
/// on a writable volume, and the Secret holding their key is readable by their group.
#[test]
fn k8s_servers_run_unprivileged_and_write_only_to_their_volumes() {
    let k8s = K8s::load();
    let meta: MetaConfig = toml::from_str(&k8s.config("cairn-meta-config", "meta.toml")).unwrap();
    let template = k8s.config("cairn-chunk-config", "chunk.toml");
    let chunk = parse_chunk(
        "chunk.toml",
        &template.replace("__POD_NAME__", "cairn-chunk-0").replace("__POD_NAMESPACE__", "cairn"),
    );
    let mut chunk_dirs = vec![chunk.state_dir.clone()];
    chunk_dirs.extend(chunk.ssd_dirs.iter().chain(&chunk.hdd_dirs).cloned());
    for (name, server, dirs) in
        [("cairn-meta", "meta", vec![meta.data_dir.clone()]), ("cairn-chunk", "chunk", chunk_dirs)]
    {
        let pod = &k8s.get("StatefulSet", name)["spec"]["template"]["spec"];
        let psc = &pod["securityContext"];
        assert_eq!(psc["runAsNonRoot"], true, "{name}: runAsNonRoot");
        assert_eq!(
            psc["runAsUser"].as_u64(),
            Some(super::hosts::image_user().uid),
            "{name}: runAsUser, the image's user"
        );
        assert!(psc["fsGroup"].as_u64().is_some(), "{name}: no fsGroup, its volumes stay root's");
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        for c in containers(pod) {
            let cwhat = format!("{name} container {}", s(&c["name"], name));
            let sc = &c["securityContext"];
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{cwhat}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{cwhat}");
            assert_eq!(strings(&sc["capabilities"]["drop"], &cwhat), ["ALL"], "{cwhat}");
        }
        let c = container(pod, server);
        for dir in &dirs {
            let m = mount_holding(c, dir)
                .unwrap_or_else(|| panic!("{name}: {} is on the read-only root file system", dir.display()));
            assert_ne!(m["readOnly"], true, "{name}: {} is on a read-only mount", dir.display());
        }
        // The key: its Secret volume readable by the group (fsGroup) the server runs in.
        let tls = mount_holding(c, &Path::new(&meta.tls_dir).join("key")).expect("a TLS mount");
        let volume =
            seq(&pod["volumes"], name).iter().find(|v| v["name"] == tls["name"]).expect("tls volume");
        // Kubernetes reads a leading 0 as octal (YAML 1.1); serde_yaml may hand it back as
        // text or as the digits.
        let raw = &volume["secret"]["defaultMode"];
        let text = raw.as_u64().map(|n| n.to_string()).or_else(|| raw.as_str().map(str::to_string));
        let text = text.expect("a Secret with defaultMode");
        let mode = match text.strip_prefix("0o").or_else(|| text.strip_prefix('0')) {
            Some(octal) => u64::from_str_radix(octal, 8).expect("an octal mode"),
            None => text.parse().expect("a mode"),
        };
        assert!(mode & 0o040 != 0, "{name}: Secret mode {mode:o} is not readable by the pod's group");
    }
}

/// NetworkPolicies let each server port be reached by the pods that talk to it and metrics
/// ports only from the monitoring namespace, and leave no Cairn pod unselected.
#[test]
fn k8s_network_policies_let_in_only_who_talks_to_whom() {
    let k8s = K8s::load();
    let pods: Vec<(&str, &Value, &Value)> = k8s
        .objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("StatefulSet" | "DaemonSet")))
        .map(|o| {
            (
                s(&o["metadata"]["name"], "name"),
                &o["spec"]["template"]["metadata"]["labels"],
                &o["spec"]["template"]["spec"],
            )
        })
        .collect();
    let labels_of = |name: &str| pods.iter().find(|p| p.0 == name).unwrap().1;
    // Who opens connections to whose gRPC port.
    let talks_to: [(&str, &[&str]); 2] = [
        ("cairn-meta", &["cairn-meta", "cairn-chunk", "cairn-client"]),
        ("cairn-chunk", &["cairn-meta", "cairn-chunk", "cairn-client"]),
    ];
    for (name, labels, pod) in &pods {
        let policies: Vec<&Value> =
            k8s.of_kind("NetworkPolicy").filter(|p| selects(&p["spec"]["podSelector"], labels)).collect();
        assert!(!policies.is_empty(), "{name}: no NetworkPolicy selects its pods: every port is open");
        let rules: Vec<&Value> =
            policies.iter().flat_map(|p| seq(&p["spec"]["ingress"], name).iter()).collect();
        let allowed = |port: u64| -> Vec<&Value> {
            rules
                .iter()
                .filter(|r| seq(&r["ports"], name).iter().any(|p| p["port"].as_u64() == Some(port)))
                .flat_map(|r| seq(&r["from"], name).iter())
                .collect()
        };
        for c in containers(pod) {
            if let Some(port) = container_port(c, "grpc") {
                let sources = allowed(port);
                let clients = talks_to.iter().find(|t| t.0 == *name).map_or(&[][..], |t| t.1);
                for client in clients {
                    assert!(
                        sources
                            .iter()
                            .any(|f| f.get("podSelector").is_some_and(|sel| selects(sel, labels_of(client)))),
                        "{name}: {client} cannot reach its port {port}"
                    );
                }
                assert!(
                    !clients.is_empty() || sources.is_empty(),
                    "{name}: port {port} is open to {sources:?}"
                );
            }
            if let Some(port) = container_port(c, "metrics") {
                let sources = allowed(port);
                assert!(!sources.is_empty(), "{name}: Prometheus cannot reach metrics port {port}");
                for f in sources {
                    assert!(
                        f.get("podSelector").is_none() && f["namespaceSelector"]["matchLabels"].is_mapping(),
                        "{name}: metrics port {port} open to {f:?}, not only to the monitoring namespace"
                    );
                }
            }
        }
    }
}

/// The client runs as root (the image's user is not), privileged: mount(2) of FUSE.
#[test]
fn k8s_client_runs_as_root_to_mount() {
    let k8s = K8s::load();
    let pod = &k8s.get("DaemonSet", "cairn-client")["spec"]["template"]["spec"];
    let c = container(pod, "mount");
    assert_eq!(c["securityContext"]["runAsUser"].as_u64(), Some(0));
    assert_eq!(c["securityContext"]["privileged"], true);
}
