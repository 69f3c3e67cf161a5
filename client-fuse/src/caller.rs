//! Who a request is made for: the uid, gid and supplementary groups of the process behind a
//! FUSE request, which the metaserver checks each namespace request against (docs/
//! ARCHITECTURE.md, "Per-user permission checks on the metaserver"). The kernel's request
//! header carries the uid, gid and pid but no groups, so they are read from
//! `/proc/<pid>/status` and remembered per pid for a second: a busy process costs one read a
//! second, and a process that drops a group keeps it here for at most that second (the client
//! kernel's own check, which comes first, uses its exact credentials). Also what an open asks
//! of its file, from its flags.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cairn_proto as p;
use parking_lot::Mutex;

/// How long a process's groups are remembered.
const KEEP: Duration = Duration::from_secs(1);
/// At most this many processes remembered; when full, the expired ones go (all of them if none
/// has expired).
const MAX_PROCESSES: usize = 4096;

/// The groups of recent callers, by pid.
#[derive(Default)]
pub struct Callers {
    groups: Mutex<HashMap<u32, (Instant, Vec<u32>)>>,
}

impl Callers {
    /// The caller of a request from process `pid` running as `uid`:`gid`. Root's groups are not
    /// looked up: root may do what any group may.
    pub fn of(&self, uid: u32, gid: u32, pid: u32) -> p::Caller {
        if uid == 0 || pid == 0 {
            return p::Caller { uid, gid, groups: Vec::new() };
        }
        let now = Instant::now();
        if let Some((at, groups)) = self.groups.lock().get(&pid) {
            if now.duration_since(*at) < KEEP {
                return p::Caller { uid, gid, groups: groups.clone() };
            }
        }
        // A process gone already has no groups to tell: the request is checked with its gid.
        let groups = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|status| groups_of(&status))
            .unwrap_or_default();
        let mut known = self.groups.lock();
        if known.len() >= MAX_PROCESSES {
            known.retain(|_, (at, _)| now.duration_since(*at) < KEEP);
            if known.len() >= MAX_PROCESSES {
                known.clear();
            }
        }
        known.insert(pid, (now, groups.clone()));
        p::Caller { uid, gid, groups }
    }
}

/// The kernel marks the open an `execve` makes with this flag (`__FMODE_EXEC`).
const FMODE_EXEC: i32 = 0x20;

/// What an open with `flags` asks of the file (`OpenRequest.access`): read 4, write 2 (also for
/// `O_TRUNC`), and for an `execve`'s open, execute 1 instead of read.
pub fn access_of(flags: i32) -> u32 {
    let mut access = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => 2,
        libc::O_RDWR => 6,
        _ => 4,
    };
    if flags & libc::O_TRUNC != 0 {
        access |= 2;
    }
    if flags & FMODE_EXEC != 0 {
        access = (access & !4) | 1;
    }
    access
}

/// The supplementary groups on the `Groups:` line of a `/proc/<pid>/status`.
fn groups_of(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

/// This process as a caller (the `cairn` commands that use the client library).
pub fn this_process() -> p::Caller {
    // SAFETY: these calls only read the calling process's credentials.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let groups = std::fs::read_to_string("/proc/self/status").map(|s| groups_of(&s)).unwrap_or_default();
    p::Caller { uid, gid, groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_asks_what_its_flags_say() {
        assert_eq!(access_of(libc::O_RDONLY), 4);
        assert_eq!(access_of(libc::O_WRONLY), 2);
        assert_eq!(access_of(libc::O_RDWR | libc::O_APPEND), 6);
        assert_eq!(access_of(libc::O_RDONLY | libc::O_TRUNC), 6, "truncating writes");
        assert_eq!(access_of(libc::O_RDONLY | FMODE_EXEC), 1, "an execve: execute, not read");
    }

    #[test]
    fn groups_come_from_the_status_file() {
        let status = "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nVmPeak:\t1 kB\n";
        assert_eq!(groups_of(status), vec![4, 24, 1000]);
        assert_eq!(groups_of("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(groups_of("Name:\tx\n"), Vec::<u32>::new());
    }

    #[test]
    fn a_live_process_is_read_and_remembered() {
        let callers = Callers::default();
        let me = std::process::id();
        let mine = this_process();
        let c = callers.of(1000, 1000, me);
        assert_eq!((c.uid, c.gid, &c.groups), (1000, 1000, &mine.groups), "this process's groups");
        assert!(callers.groups.lock().contains_key(&me));
        assert!(callers.of(0, 0, me).groups.is_empty(), "root's are not looked up");
        let gone = callers.of(1000, 1000, u32::MAX - 1);
        assert!(gone.groups.is_empty(), "a process gone: no groups");
    }
}
