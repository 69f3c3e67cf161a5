//! Mounting the usual ways: `cairn mount --background` (returns once the mount is ready),
//! `cairn umount`, and the `mount.cairn` / `mount.fuse.cairn` helper that `mount -t fuse.cairn`
//! and `/etc/fstab` run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Result};

/// How long `--background` waits for the mount to appear.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a mount needs, from flags or from `-o` options.
#[derive(Clone, Debug, PartialEq)]
pub struct MountArgs {
    pub meta: String,
    pub mountpoint: PathBuf,
    pub threads: usize,
    pub attr_ttl_ms: u64,
    pub cache_mib: u64,
    /// Write-back interval, milliseconds (0: only close and fsync commit).
    pub commit_interval_ms: u64,
    /// How long I/O waits for chunkservers when too few answer, milliseconds (0: fail at once).
    pub write_wait_ms: u64,
    /// What a close guarantees (`-o durability=close|fsync`).
    pub durability: cairn_client::Durability,
    /// The most one file's sequential reader has fetched ahead, MiB.
    pub readahead_mib: u64,
    pub metrics: Option<String>,
    pub read_only: bool,
    /// `suid`, `dev`, `exec` as mount(8) has them (defaults: nosuid, nodev, exec).
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    /// Where a background mount writes its log.
    pub log: Option<PathBuf>,
    /// The mount's TLS directory (unset: `CAIRN_TLS` or the default), or no TLS.
    pub tls: Option<PathBuf>,
    pub plaintext: bool,
}

impl MountArgs {
    /// What the client is mounted with in the foreground (as root, open to other users).
    pub fn into_options(self) -> cairn_client::MountOptions {
        cairn_client::MountOptions {
            meta: self.meta,
            mountpoint: self.mountpoint,
            threads: self.threads,
            attr_ttl: Duration::from_millis(self.attr_ttl_ms),
            block_cache_bytes: usize::try_from(self.cache_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            // SAFETY: geteuid has no preconditions and cannot fail.
            allow_other: unsafe { libc::geteuid() } == 0,
            metrics: self.metrics,
            read_only: self.read_only,
            suid: self.suid,
            dev: self.dev,
            exec: self.exec,
            commit_interval: Duration::from_millis(self.commit_interval_ms),
            write_wait: Duration::from_millis(self.write_wait_ms),
            durability: self.durability,
            readahead_bytes: self.readahead_mib.saturating_mul(1 << 20),
        }
    }

    /// The foreground `cairn mount` command line that serves this mount.
    fn foreground_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "mount".into(),
            "--meta".into(),
            self.meta.clone().into(),
            "--threads".into(),
            self.threads.to_string().into(),
            "--attr-ttl-ms".into(),
            self.attr_ttl_ms.to_string().into(),
            "--cache-mib".into(),
            self.cache_mib.to_string().into(),
            "--commit-interval-ms".into(),
            self.commit_interval_ms.to_string().into(),
            "--write-wait-ms".into(),
            self.write_wait_ms.to_string().into(),
            "--durability".into(),
            self.durability.to_string().into(),
            "--readahead-mib".into(),
            self.readahead_mib.to_string().into(),
        ];
        if let Some(m) = &self.metrics {
            args.extend(["--metrics".into(), m.into()]);
        }
        if self.read_only {
            args.push("--read-only".into());
        }
        if self.suid {
            args.push("--suid".into());
        }
        if self.dev {
            args.push("--dev".into());
        }
        if !self.exec {
            args.push("--noexec".into());
        }
        if let Some(dir) = &self.tls {
            args.extend(["--tls".into(), dir.clone().into_os_string()]);
        }
        if self.plaintext {
            args.push("--plaintext".into());
        }
        args.push(self.mountpoint.clone().into_os_string());
        args
    }
}

/// Start the mount as a daemon (its own session, stdio on a log file) and return once the
/// kernel shows it mounted, or with the daemon's own error if it exits first.
pub fn background(args: &MountArgs) -> Result<()> {
    let mountpoint = args
        .mountpoint
        .canonicalize()
        .map_err(|e| CairnError::from_io(&format!("mount point {}", args.mountpoint.display()), &e))?;
    if !mountpoint.is_dir() {
        return Err(CairnError::invalid(format!("mount point {} is not a directory", mountpoint.display())));
    }
    if mounted_at(&mountpoint).is_some() {
        return Err(CairnError::new(
            cairn_common::ErrorKind::Exists,
            format!("something is already mounted at {}", mountpoint.display()),
        ));
    }
    let log = args.log.clone().unwrap_or_else(|| default_log(&mountpoint));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| CairnError::from_io(&format!("mount log {}", log.display()), &e))?;
    let exe = std::env::current_exe().map_err(|e| CairnError::from_io("the cairn binary", &e))?;
    let mut fg = args.clone();
    fg.mountpoint = mountpoint.clone();
    let mut cmd = Command::new(exe);
    cmd.args(fg.foreground_args())
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| CairnError::from_io("mount log", &e))?)
        .stderr(file);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal and
    // process group so that the shell (or mount(8)) returning does not take it along.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| CairnError::from_io("start the mount daemon", &e))?;
    let start = Instant::now();
    loop {
        if mounted_at(&mountpoint).is_some() {
            println!(
                "mounted {} at {} (pid {}, log {})",
                args.meta,
                mountpoint.display(),
                child.id(),
                log.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| CairnError::from_io("mount daemon", &e))? {
            return Err(CairnError::io(format!(
                "the mount daemon exited ({status}) before the mount was ready: {}",
                last_error_line(&log)
            )));
        }
        if start.elapsed() > READY_TIMEOUT {
            let _ = child.kill();
            return Err(CairnError::unavailable(format!(
                "{} was not mounted within {}s: {}",
                mountpoint.display(),
                READY_TIMEOUT.as_secs(),
                last_error_line(&log)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn default_log(mountpoint: &Path) -> PathBuf {
    let name: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c == '/' { '-' } else { c })
        .collect();
    let dir = if unsafe { libc::geteuid() } == 0 { "/var/log" } else { "/tmp" };
    PathBuf::from(dir).join(format!("cairn-mount-{}.log", if name.is_empty() { "root" } else { &name }))
}

fn last_error_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .find(|l| l.starts_with("cairn:") || l.contains("ERROR"))
        .or_else(|| text.lines().last())
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|| format!("see {}", log.display()))
}

/// The filesystem type and source mounted exactly at `mountpoint`, from /proc/self/mountinfo.
pub fn mounted_at(mountpoint: &Path) -> Option<(String, String)> {
    crate::tree::mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == mountpoint)
        .map(|m| (m.fstype, m.source))
}

/// Unmount a Cairn mount: the daemon sees the unmount and exits. `lazy` detaches it even while
/// files are open (they keep working until closed).
pub fn umount(mountpoint: &Path, lazy: bool) -> Result<()> {
    let mp = mountpoint
        .canonicalize()
        .map_err(|e| CairnError::from_io(&format!("mount point {}", mountpoint.display()), &e))?;
    match mounted_at(&mp) {
        Some((fstype, source)) if source.starts_with("cairn:") && fstype.starts_with("fuse") => {}
        Some((fstype, _)) => {
            return Err(CairnError::invalid(format!("{} is a {fstype} mount, not Cairn", mp.display())))
        }
        None => return Err(CairnError::invalid(format!("nothing is mounted at {}", mp.display()))),
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(&mp).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        // Without fusermount3 (or as root, where the syscall is allowed) unmount directly.
        _ if unsafe { libc::geteuid() } == 0 => {
            use std::os::unix::ffi::OsStrExt;
            let c = std::ffi::CString::new(mp.as_os_str().as_bytes())
                .map_err(|_| CairnError::invalid("mount point contains NUL"))?;
            let flags = if lazy { libc::MNT_DETACH } else { 0 };
            // SAFETY: c is a valid NUL-terminated path.
            if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(CairnError::from_io(&format!("umount {}", mp.display()), &e));
            }
            Ok(())
        }
        Ok(o) => Err(CairnError::io(format!(
            "fusermount3 -u {}: {}",
            mp.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Err(e) => Err(CairnError::from_io("fusermount3", &e)),
    }
}

/// Parse what mount(8) hands a helper: `SOURCE DIR [-o OPTS] [-n] [-s] [-f] [-v] [-r|-w]`.
/// SOURCE is the metaserver address (`host:port`, optionally prefixed `cairn:`). Options Cairn
/// knows: `threads=N`, `attr_ttl_ms=N`, `cache_mib=N`, `commit_interval_ms=N`, `write_wait_ms=N`,
/// `durability=close|fsync`, `readahead_mib=N`, `metrics=ADDR`,
/// `log=FILE`, `ro`/`rw`; the generic ones
/// mount(8), fstab and systemd use (`defaults`, `_netdev`, `noauto`, `nofail`, `x-*`, ...) are
/// accepted and ignored. Anything else is refused by name.
pub fn parse_helper_args(args: &[String]) -> Result<MountArgs> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.iter();
    let mut read_only = false;
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().ok_or_else(|| CairnError::invalid("-o needs options"))?.clone()),
            o if o.starts_with("-o") => options.push(o[2..].to_string()),
            "-r" => read_only = true,
            "-w" | "-n" | "-s" | "-f" | "-v" => {}
            o if o.starts_with('-') => return Err(CairnError::invalid(format!("unknown flag {o}"))),
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Err(CairnError::invalid("usage: mount.cairn META_ADDR MOUNTPOINT [-o OPTIONS]"));
    };
    let meta = source.strip_prefix("cairn:").unwrap_or(source).to_string();
    if !meta.contains(':') {
        return Err(CairnError::invalid(format!(
            "{source:?} is not a metaserver address like 10.0.0.1:9400"
        )));
    }
    let mut parsed = MountArgs {
        meta,
        mountpoint: PathBuf::from(mountpoint),
        threads: 4,
        attr_ttl_ms: 1000,
        cache_mib: cairn_client::default_block_cache_mib(),
        commit_interval_ms: cairn_client::DEFAULT_COMMIT_INTERVAL_MS,
        write_wait_ms: cairn_client::DEFAULT_WRITE_WAIT_MS,
        durability: cairn_client::Durability::default(),
        readahead_mib: cairn_client::DEFAULT_READAHEAD_MIB,
        metrics: None,
        read_only,
        suid: false,
        dev: false,
        exec: true,
        log: None,
        tls: None,
        plaintext: false,
    };
    for opt in options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let number = |v: Option<&str>| -> Result<u64> {
            v.and_then(|v| v.parse().ok())
                .ok_or_else(|| CairnError::invalid(format!("mount option {opt}: needs a number")))
        };
        match key {
            "threads" => parsed.threads = number(value)?.clamp(1, 256) as usize,
            "attr_ttl_ms" => parsed.attr_ttl_ms = number(value)?,
            "cache_mib" => parsed.cache_mib = number(value)?,
            "commit_interval_ms" => parsed.commit_interval_ms = number(value)?,
            "write_wait_ms" => parsed.write_wait_ms = number(value)?,
            "readahead_mib" => parsed.readahead_mib = number(value)?,
            "durability" => {
                parsed.durability = value.unwrap_or_default().parse().map_err(|e: CairnError| {
                    CairnError::invalid(format!("mount option {opt}: {}", e.message()))
                })?
            }
            "metrics" => parsed.metrics = Some(value.unwrap_or_default().to_string()),
            "log" => parsed.log = value.map(PathBuf::from),
            "tls" => parsed.tls = value.map(PathBuf::from),
            "plaintext" => parsed.plaintext = true,
            "ro" => parsed.read_only = true,
            "rw" => parsed.read_only = false,
            "suid" => parsed.suid = true,
            "nosuid" => parsed.suid = false,
            "dev" => parsed.dev = true,
            "nodev" => parsed.dev = false,
            "exec" => parsed.exec = true,
            "noexec" => parsed.exec = false,
            "defaults" | "_netdev" | "auto" | "noauto" | "nofail" | "user" | "nouser" | "users" | "owner"
            | "atime" | "noatime" | "relatime" | "async" | "sync" => {}
            k if k.starts_with("x-") || k == "comment" => {}
            _ => return Err(CairnError::invalid(format!("unknown mount option {opt:?}"))),
        }
    }
    Ok(parsed)
}

/// Run as `mount.cairn` / `mount.fuse.cairn`: mount in the background and return when ready.
pub fn helper(args: &[String]) -> Result<()> {
    background(&parse_helper_args(args)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fstab_style_options_parse_and_unknown_ones_are_named() {
        let a = parse_helper_args(&strings(&[
            "cairn:10.0.0.1:9400",
            "/mnt/data",
            "-o",
            "rw,_netdev,noauto,x-systemd.automount,tls=/etc/cairn/client,threads=8,attr_ttl_ms=5000,cache_mib=64,metrics=127.0.0.1:9410,commit_interval_ms=250,write_wait_ms=0,durability=fsync,readahead_mib=256",
        ]))
        .unwrap();
        assert_eq!(a.commit_interval_ms, 250);
        assert_eq!(a.tls, Some(PathBuf::from("/etc/cairn/client")));
        assert_eq!(a.write_wait_ms, 0);
        assert_eq!(a.durability, cairn_client::Durability::Fsync);
        assert_eq!(a.readahead_mib, 256);
        let e =
            parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-o", "durability=maybe"])).unwrap_err();
        assert!(e.message().contains("durability=maybe"), "{}", e.message());
        assert_eq!(a.meta, "10.0.0.1:9400");
        assert_eq!(a.mountpoint, PathBuf::from("/mnt/data"));
        assert_eq!((a.threads, a.attr_ttl_ms, a.cache_mib, a.read_only), (8, 5000, 64, false));
        assert_eq!(a.metrics.as_deref(), Some("127.0.0.1:9410"));
        let ro = parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-oro"])).unwrap();
        assert!(ro.read_only);
        let e = parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-o", "bogus=1"])).unwrap_err();
        assert!(e.message().contains("bogus=1"), "{}", e.message());
        let e = parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-o", "threads=many"])).unwrap_err();
        assert!(e.message().contains("threads=many"), "{}", e.message());
        assert!(parse_helper_args(&strings(&["/mnt"])).is_err());
        assert!(parse_helper_args(&strings(&["nohost", "/mnt"])).is_err());
    }

    #[test]
    fn foreground_command_carries_every_option() {
        let a = MountArgs {
            meta: "h:1".into(),
            mountpoint: "/m".into(),
            threads: 3,
            attr_ttl_ms: 7,
            cache_mib: 9,
            commit_interval_ms: 11,
            write_wait_ms: 12,
            durability: cairn_client::Durability::Fsync,
            readahead_mib: 13,
            metrics: Some("h:2".into()),
            read_only: true,
            suid: true,
            dev: true,
            exec: false,
            log: None,
            tls: Some("/t".into()),
            plaintext: false,
        };
        let args: Vec<String> = a.foreground_args().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert_eq!(
            args,
            strings(&[
                "mount",
                "--meta",
                "h:1",
                "--threads",
                "3",
                "--attr-ttl-ms",
                "7",
                "--cache-mib",
                "9",
                "--commit-interval-ms",
                "11",
                "--write-wait-ms",
                "12",
                "--durability",
                "fsync",
                "--readahead-mib",
                "13",
                "--metrics",
                "h:2",
                "--read-only",
                "--suid",
                "--dev",
                "--noexec",
                "--tls",
                "/t",
                "/m"
            ])
        );
    }

    #[test]
    fn mounts_are_nosuid_and_nodev_unless_asked() {
        let a = parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-o", "rw,_netdev"])).unwrap();
        assert_eq!((a.suid, a.dev, a.exec), (false, false, true));
        let o = a.clone().into_options();
        assert_eq!((o.suid, o.dev, o.exec), (false, false, true));
        // `defaults` (rw,suid,dev,exec,auto,nouser,async in mount(8)) does not turn them on:
        // only naming them does, and the last of a pair wins.
        let a = parse_helper_args(&strings(&["10.0.0.1:9400", "/mnt", "-o", "defaults,suid,dev,noexec"]))
            .unwrap();
        assert_eq!((a.suid, a.dev, a.exec), (true, true, false));
        let a = parse_helper_args(&strings(&[
            "10.0.0.1:9400",
            "/mnt",
            "-o",
            "suid,nosuid,dev,nodev,noexec,exec",
        ]))
        .unwrap();
        assert_eq!((a.suid, a.dev, a.exec), (false, false, true));
        // The daemon a background mount starts gets the same.
        let fg: Vec<String> = a.foreground_args().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert!(!fg.iter().any(|f| ["--suid", "--dev", "--noexec"].contains(&f.as_str())), "{fg:?}");
    }
}
