//! Choosing ports for `cairn up`'s servers: free ones below the kernel's ephemeral range, one
//! `cairn up` at a time on a machine ([`PortLock`]), and never one that another cluster on the
//! machine recorded ([`PortRegistry`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Result};

/// Ports this process chose, or must not choose (other clusters' recorded ones).
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A port free now, for a server started a moment later. Taken below the kernel's ephemeral
/// range: a port the kernel handed out for `:0` is also what it hands out as the source port of
/// outgoing connections (the chunkservers' own, to the metaserver), so one of those could take
/// it before the server binds it ("Address already in use" at start-up).
pub(super) fn free_port() -> Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let port = probe_port()?;
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return Ok(port);
        }
    }
    Err(CairnError::unavailable("no free port found"))
}

/// Serialises the start-up of `cairn up` processes on one machine (an flock on a file in the
/// temp dir): a port found free stays unbound until the child binds it, and another `cairn up`
/// starting meanwhile could pick the same one. Held from choosing ports until every child has
/// bound them. Given up after a minute (a stuck holder does not block forever).
pub(super) struct PortLock {
    /// The locked file; the lock goes with it when dropped.
    _file: Option<std::fs::File>,
}

impl PortLock {
    pub(super) async fn acquire() -> PortLock {
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join("cairn-up-ports.lock");
        let Ok(file) = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path)
        else {
            return PortLock { _file: None };
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        // SAFETY: flock on a descriptor this function owns.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if Instant::now() > deadline {
                eprintln!("cairn up: {} stayed locked; choosing ports without it", path.display());
                return PortLock { _file: None };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        PortLock { _file: Some(file) }
    }
}

/// The ports every cluster on this machine recorded (`cairn-up-ports` in the temp dir, beside
/// the lock): one line per cluster, its `cluster.json` and the ports it holds, so a cluster
/// stopped for a while finds its ports free when it starts again (another `cairn up` choosing
/// ports meanwhile — first start or metrics endpoint — avoids them). A line whose
/// `cluster.json` is gone (the cluster was deleted) is dropped. Read and written under
/// [`PortLock`]; a registry that cannot be read or written only loses this protection.
pub(super) struct PortRegistry {
    path: PathBuf,
    /// (cluster.json, its ports)
    clusters: Vec<(PathBuf, Vec<u16>)>,
}

impl PortRegistry {
    pub(super) fn load(path: PathBuf) -> PortRegistry {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let clusters = text
            .lines()
            .filter_map(|line| {
                let (file, ports) = line.rsplit_once('\t')?;
                let ports = ports.split(',').map(|p| p.parse::<u16>().ok()).collect::<Option<Vec<_>>>()?;
                Some((PathBuf::from(file), ports))
            })
            .filter(|(file, _)| file.exists())
            .collect();
        PortRegistry { path, clusters }
    }

    /// Every port recorded by a cluster other than the one at `own` (its `cluster.json`).
    pub(super) fn others(&self, own: &Path) -> Vec<u16> {
        self.clusters
            .iter()
            .filter(|(file, _)| file != own)
            .flat_map(|(_, ports)| ports.iter().copied())
            .collect()
    }

    /// Record `ports` as the cluster at `own`'s, replacing what it had.
    pub(super) fn record(&mut self, own: &Path, ports: Vec<u16>) {
        self.clusters.retain(|(file, _)| file != own);
        self.clusters.push((own.to_path_buf(), ports));
        let text: String = self
            .clusters
            .iter()
            .map(|(file, ports)| {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                format!("{}\t{}\n", file.display(), ports.join(","))
            })
            .collect();
        let tmp = self.path.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path)) {
            eprintln!("cairn up: cannot record this cluster's ports in {}: {e}", self.path.display());
        }
    }
}

/// Keep [`free_port`] off `ports` from now on (another cluster's).
pub(super) fn avoid_ports(ports: &[u16]) {
    HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(ports);
}

/// One candidate port (see [`free_port`] for why below the ephemeral range).
fn probe_port() -> Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    const LOWEST: u16 = 10000;
    if ephemeral_low > LOWEST + 1000 {
        for _ in 0..200 {
            let port = LOWEST + (rand::random::<u16>() % (ephemeral_low - LOWEST));
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| CairnError::from_io("bind", &e))?;
    Ok(l.local_addr().map_err(|e| CairnError::from_io("bind", &e))?.port())
}

#[cfg(test)]
mod tests {
    use super::PortRegistry;

    #[test]
    fn the_port_registry_keeps_other_clusters_ports_and_forgets_deleted_clusters() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
        std::fs::write(&a, "{}").unwrap();
        std::fs::write(&b, "{}").unwrap();
        let path = dir.path().join("ports");
        let mut registry = PortRegistry::load(path.clone());
        assert!(registry.others(&a).is_empty());
        registry.record(&a, vec![10001, 10002]);
        registry.record(&b, vec![20001]);
        let registry = PortRegistry::load(path.clone());
        assert_eq!(registry.others(&a), vec![20001]);
        assert_eq!(registry.others(&b), vec![10001, 10002]);
        // A cluster records its ports again (a chunkserver added): its line is replaced.
        let mut registry = PortRegistry::load(path.clone());
        registry.record(&a, vec![10001, 10002, 10003]);
        assert_eq!(PortRegistry::load(path.clone()).others(&b), vec![10001, 10002, 10003]);
        // A deleted cluster's ports are free again; a damaged line is skipped.
        std::fs::remove_file(&b).unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("garbage line\n/x\tnot,ports\n");
        std::fs::write(&path, text).unwrap();
        assert!(PortRegistry::load(path).others(&a).is_empty());
    }
}
