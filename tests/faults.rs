//! Fault tests on real processes: the metaserver killed with `kill -9` in the middle of a burst
//! of namespace operations, chunkservers frozen with SIGSTOP (a partition: their connections
//! stay open and nothing answers) while clients read and write, and a chunkserver whose disk
//! fills up while the rest of the cluster has room.
//!
//! Every wait polls with a deadline. Bounds on single operations are there to tell "slow" from
//! "hung", not to measure speed.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{eventually, kill9, random_bytes, restart_server, sha256, Cluster, KillOnDrop, Mount, Rng};

#[path = "faults/chunkservers.rs"]
mod chunkservers;
#[path = "faults/durability.rs"]
mod durability;
#[path = "faults/hostile.rs"]
mod hostile;
#[path = "faults/metaserver.rs"]
mod metaserver;

fn status(cluster: &Cluster) -> serde_json::Value {
    let out = cluster.cli(&["status", "--json"]);
    // 0 OK, 2 WARN, 3 ERR: a status was read (1 would be a failure to ask).
    assert!(
        matches!(out.status.code(), Some(0 | 2 | 3)),
        "cairn status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status json")
}

/// Create `path` (a fresh name), write `data`, fsync and close, each checked: only then is the
/// file acknowledged (a plain `drop` would ignore an error of the close).
fn create_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(data)?;
    f.sync_all()?;
    let fd = f.into_raw_fd();
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
