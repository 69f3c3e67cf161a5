//! `deploy/docker/compose.yaml`: the services agree with the configs they carry; the metaservers
//! are one Raft group with volumes and health checks of their own; every metrics port is
//! scraped.

use super::*;

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
    let mut expected: BTreeSet<String> =
        ["certs", "meta-1", "meta-2", "meta-3", "client"].map(String::from).into();
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

    // Mutual TLS: every service but `certs` waits for it and sees its own directory of the
    // `tls` volume at /etc/cairn/tls (the servers' default tls_dir, the mount's --tls).
    assert_eq!(flag_value("client", argv, "--tls"), "/etc/cairn/tls");
    for (name, svc) in &compose.services {
        if name == "certs" {
            assert_eq!(svc.argv[1..3], ["cert".to_string(), "cluster".to_string()], "{name}");
            continue;
        }
        let done = &svc.raw["depends_on"]["certs"]["condition"];
        assert_eq!(done.as_str(), Some("service_completed_successfully"), "{name}");
        let own = seq(&svc.raw["volumes"], name)
            .iter()
            .find(|v| v["target"].as_str() == Some("/etc/cairn/tls"))
            .unwrap_or_else(|| panic!("{name}: no TLS directory at /etc/cairn/tls"));
        assert_eq!(own["source"].as_str(), Some("tls"), "{name}");
        assert_eq!(own["volume"]["subpath"].as_str(), Some(name.as_str()), "{name}");
        assert_eq!(own["read_only"].as_bool(), Some(true), "{name}");
    }

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
        // A new volume holds no data: without this the replica would refuse to start on it.
        assert!(svc.argv.iter().any(|a| a == "--init-if-empty"), "{name}: {:?}", svc.argv);
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
            // The one-shot certificate maker serves nothing.
            "cert" => continue,
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

/// The servers (and `certs`) run as the image's user, not root, and every named volume they
/// write is mounted on a directory the image gives that user (a new volume takes the owner of
/// the directory it is first mounted on); the client runs as root, for mount(2) of FUSE.
#[test]
fn compose_servers_run_as_the_images_user_on_volumes_it_owns() {
    let compose = Compose::load();
    let user = super::hosts::image_user();
    for (name, svc) in &compose.services {
        let runs_as = match &svc.raw["user"] {
            Value::Null => None,
            v => Some(v.as_str().map(str::to_string).unwrap_or_else(|| format!("{}", v.as_u64().unwrap()))),
        };
        if name == "client" {
            assert_eq!(runs_as.as_deref(), Some("0"), "the client mounts FUSE: it runs as root");
            continue;
        }
        assert_eq!(runs_as, None, "{name} does not run as the image's user {}", user.name);
        for target in svc.volumes.keys() {
            assert!(
                user.owns.contains(target),
                "{name}: the volume on {target} would be root's: {:?}",
                user.owns
            );
        }
    }
}
