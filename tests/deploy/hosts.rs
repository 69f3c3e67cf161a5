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
