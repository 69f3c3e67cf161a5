//! `deploy/systemd/` and `deploy/docker/Dockerfile`: units run `cairn` with flags it has; the
//! image builds the `cairn` package and ships the binary.

use super::*;

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

/// `Key=value` lines of a unit file, every value of each key in order (comments dropped).
fn unit_keys(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.starts_with('[')) {
        if let Some((k, v)) = line.split_once('=') {
            out.entry(k.to_string()).or_default().push(v.to_string());
        }
    }
    out
}

/// The servers run as a user of their own in a sandbox (the rest of the file system read-only,
/// no capabilities), and every directory their sample config writes is writable in it; the
/// mount keeps only the capability to mount and no mount namespace of its own (its mount would
/// be invisible outside); systemd knows every directive (`systemd-analyze verify`, where it is
/// installed).
#[test]
fn systemd_units_sandbox_the_servers_and_leave_their_directories_writable() {
    let meta: MetaConfig = toml::from_str(&read("deploy/config/meta.toml")).unwrap();
    let chunk: ChunkConfig = toml::from_str(&read("deploy/config/chunk.toml")).unwrap();
    let mut chunk_dirs = vec![chunk.state_dir.clone()];
    chunk_dirs.extend(chunk.ssd_dirs.iter().chain(&chunk.hdd_dirs).cloned());
    for (unit, dirs) in
        [("cairn-meta.service", vec![meta.data_dir.clone()]), ("cairn-chunk.service", chunk_dirs)]
    {
        let keys = unit_keys(&read(&format!("deploy/systemd/{unit}")));
        let one = |k: &str| keys.get(k).and_then(|v| v.last()).map(String::as_str).unwrap_or("");
        assert!(!matches!(one("User"), "" | "root" | "0"), "{unit} runs as root");
        for (k, v) in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("CapabilityBoundingSet", "")]
        {
            assert_eq!(keys.get(k).and_then(|v| v.last()).map(String::as_str), Some(v), "{unit}: {k}");
        }
        let mut writable: Vec<PathBuf> =
            one("StateDirectory").split_whitespace().map(|d| Path::new("/var/lib").join(d)).collect();
        writable.extend(one("ReadWritePaths").split_whitespace().map(PathBuf::from));
        for dir in dirs {
            assert!(
                writable.iter().any(|w| dir.starts_with(w)),
                "{unit}: {} (from its sample config) is not writable under ProtectSystem=strict: {writable:?}",
                dir.display()
            );
        }
    }
    let mount = unit_keys(&read("deploy/systemd/cairn-mount@.service"));
    assert_eq!(mount["CapabilityBoundingSet"], ["CAP_SYS_ADMIN"]);
    for namespacing in [
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "ReadOnlyPaths",
        "TemporaryFileSystem",
        "PrivateMounts",
    ] {
        assert!(
            !mount.contains_key(namespacing),
            "cairn-mount@.service: {namespacing}= would hide the mount"
        );
    }

    // systemd's own parser, on copies whose ExecStart is a binary that exists here.
    let dir = tempfile::tempdir().unwrap();
    for unit in files_under("deploy/systemd", "service") {
        let name = unit.file_name().unwrap().to_string_lossy().replace("@.", "@test.");
        let copy = dir.path().join(&name);
        std::fs::write(
            &copy,
            std::fs::read_to_string(&unit)
                .unwrap()
                .replace("ExecStart=/usr/local/bin/cairn ", "ExecStart=/bin/true "),
        )
        .unwrap();
        match Command::new("systemd-analyze").arg("verify").arg(&copy).output() {
            Ok(out) => {
                let text =
                    String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
                let complaints: Vec<&str> = text.lines().filter(|l| l.contains(&name)).collect();
                assert!(out.status.success() && complaints.is_empty(), "{name}: {text}");
            }
            Err(_) => eprintln!("systemd-analyze is not installed: {name} not verified by systemd"),
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

/// The runtime image's user: its name, its uid (`useradd --uid`), and the directories the image
/// hands to it (`chown NAME:NAME DIR...`).
pub(super) struct ImageUser {
    pub name: String,
    pub uid: u64,
    pub owns: BTreeSet<String>,
}

pub(super) fn image_user() -> ImageUser {
    let lines = dockerfile();
    let runtime_at = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    let runtime = &lines[runtime_at..];
    let commands: Vec<Vec<&str>> = runtime
        .iter()
        .filter_map(|l| l.strip_prefix("RUN "))
        .flat_map(|l| l.split("&&"))
        .map(|c| c.split_whitespace().collect())
        .collect();
    let useradd = commands.iter().find(|c| c.first() == Some(&"useradd")).expect("the image makes its user");
    let name = useradd.last().unwrap().to_string();
    let uid: u64 =
        useradd[useradd.iter().position(|w| *w == "--uid").expect("useradd --uid") + 1].parse().unwrap();
    // The image runs as it: USER by name or number.
    let user =
        runtime.iter().rev().find_map(|l| l.strip_prefix("USER ")).expect("the runtime stage sets a USER");
    let runs_as = user.split(':').next().unwrap();
    assert!(
        runs_as == name || runs_as == uid.to_string(),
        "USER {user} is not the image's user {name} ({uid})"
    );
    let owner_tags = [format!("{name}:{name}"), format!("{uid}:{uid}")];
    let owns = commands
        .iter()
        .filter(|c| {
            c.first() == Some(&"chown") && c.get(1).is_some_and(|o| owner_tags.iter().any(|t| t == o))
        })
        .flat_map(|c| c[2..].iter().map(|d| d.to_string()))
        .collect();
    ImageUser { name, uid, owns }
}

#[test]
fn dockerfile_runs_as_a_user_that_is_not_root() {
    let user = image_user();
    assert!(!matches!(user.name.as_str(), "root" | "0"), "the image runs as root");
    assert_ne!(user.uid, 0);
    assert!(user.owns.contains("/tls"), "`cairn cert cluster` could not write /tls: {:?}", user.owns);
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
