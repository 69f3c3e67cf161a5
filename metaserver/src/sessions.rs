//! Client sessions: which clients are alive, which files they hold open, and the byte-range
//! locks they hold. Kept in memory only; a client renews its session with a heartbeat that
//! carries its full set of open inodes, so after a metaserver restart every live client
//! re-announces what it has open within one heartbeat.
//!
//! - **Open files**: an inode whose last link goes while some client has it open becomes an
//!   orphan (nlink 0, recorded in `Cf::Orphans`) instead of being freed; it is freed when the
//!   last client releases it or its session expires.
//! - **Locks**: POSIX byte-range semantics keyed by (client, lock owner). `flock` locks arrive
//!   from the kernel as whole-file locks owned by the open file description, so they share this
//!   table (as on NFS, `flock` and `fcntl` locks on one file therefore conflict). A session that
//!   expires loses its locks; locks do not survive a metaserver restart.
//! - **Owners**: a session belongs to the certificate name that registered the client id (or,
//!   after a metaserver restart, the first that renews it): heartbeats, opens, releases and
//!   locks under that id from another certificate are refused, so one tenant cannot release
//!   another's open files or take its locks. Plaintext callers have no name and share one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, ErrorKind};
use parking_lot::Mutex;

pub const F_RDLCK: u32 = libc_consts::F_RDLCK;
pub const F_WRLCK: u32 = libc_consts::F_WRLCK;
pub const F_UNLCK: u32 = libc_consts::F_UNLCK;

mod libc_consts {
    // Linux values (asm-generic/fcntl.h).
    pub const F_RDLCK: u32 = 0;
    pub const F_WRLCK: u32 = 1;
    pub const F_UNLCK: u32 = 2;
}

/// One held lock; `end` is inclusive (as FUSE sends it; `u64::MAX` = to the end of file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    pub client: u32,
    pub owner: u64,
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub typ: u32,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

struct Session {
    last_seen: Instant,
    /// Inodes the client has open, each with the generation of its latest open.
    open: HashMap<u64, u64>,
    /// The client has told its full open set since this metaserver started.
    announced: bool,
    /// The certificate name the session belongs to ("" on a plaintext cluster).
    owner: String,
}

impl Session {
    fn new(owner: &str) -> Session {
        Session {
            last_seen: Instant::now(),
            open: HashMap::new(),
            announced: false,
            owner: owner.to_string(),
        }
    }
}

/// `client`'s session, created for `holder` if there is none; refused if it belongs to another
/// certificate.
fn owned<'a>(
    clients: &'a mut HashMap<u32, Session>,
    client: u32,
    holder: &str,
) -> Result<&'a mut Session, CairnError> {
    let s = clients.entry(client).or_insert_with(|| Session::new(holder));
    if s.owner != holder {
        return Err(not_yours(client, &s.owner, holder));
    }
    Ok(s)
}

fn not_yours(client: u32, owner: &str, holder: &str) -> CairnError {
    CairnError::new(
        ErrorKind::PermissionDenied,
        format!("client id {client} belongs to certificate {owner:?}, not to this caller's ({holder:?})"),
    )
}

pub struct Sessions {
    lease: Duration,
    started: Instant,
    clients: Mutex<HashMap<u32, Session>>,
    locks: Mutex<HashMap<u64, Vec<Lock>>>,
}

impl Sessions {
    pub fn new(lease: Duration) -> Sessions {
        Sessions {
            lease,
            started: Instant::now(),
            clients: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// True once every client that was alive before a restart has had a full lease to
    /// re-announce its open files: only then may orphans with no known opener be freed.
    pub fn past_grace(&self) -> bool {
        self.started.elapsed() > self.lease
    }

    /// Start `client`'s session, just registered, for certificate `holder`: whatever an earlier
    /// caller left under that id (none may have held it) goes.
    pub fn bind(&self, client: u32, holder: &str) {
        self.clients.lock().insert(client, Session::new(holder));
        self.unlock_where(|l, _| l.client == client);
    }

    /// Fail unless `client`'s session, if there is one, belongs to `holder`.
    pub fn check_owner(&self, client: u32, holder: &str) -> Result<(), CairnError> {
        match self.clients.lock().get(&client) {
            Some(s) if s.owner != holder => Err(not_yours(client, &s.owner, holder)),
            _ => Ok(()),
        }
    }

    /// Renew `client`'s session (for `holder`). `open` is the client's full set of open
    /// inodes; it is taken only the first time this metaserver hears from the client (after a
    /// restart), and then added to what open calls already told, never replacing it: a
    /// heartbeat may have been composed before an open that reached us first.
    pub fn heartbeat(&self, client: u32, holder: &str, open: Option<Vec<u64>>) -> Result<(), CairnError> {
        let mut clients = self.clients.lock();
        let s = owned(&mut clients, client, holder)?;
        s.last_seen = Instant::now();
        if let Some(open) = open {
            if !s.announced {
                for ino in open {
                    s.open.entry(ino).or_insert(0);
                }
                s.announced = true;
            }
        }
        Ok(())
    }

    /// `client` (for `holder`) opened `ino`; `generation` numbers this open among the client's
    /// opens.
    pub fn opened(&self, client: u32, holder: &str, ino: u64, generation: u64) -> Result<(), CairnError> {
        let mut clients = self.clients.lock();
        let s = owned(&mut clients, client, holder)?;
        s.last_seen = Instant::now();
        let latest = s.open.entry(ino).or_insert(generation);
        *latest = (*latest).max(generation);
        Ok(())
    }

    /// `client` closed its last handle on `ino`, opened as `generation` or before; its locks on
    /// it go too. A release older than the client's latest open of the file (sent late) changes
    /// nothing; returns whether it released.
    pub fn released(&self, client: u32, ino: u64, generation: u64) -> bool {
        if let Some(s) = self.clients.lock().get_mut(&client) {
            match s.open.get(&ino) {
                Some(&latest) if latest > generation => return false,
                Some(_) => {
                    s.open.remove(&ino);
                }
                None => {}
            }
        }
        self.unlock_where(|l, i| i == ino && l.client == client);
        true
    }

    /// `client` has a session whose lease has not run out: it may still commit what it wrote.
    pub fn is_live(&self, client: u32) -> bool {
        self.clients.lock().get(&client).is_some_and(|s| s.last_seen.elapsed() <= self.lease)
    }

    /// Clients whose lease has not run out.
    pub fn live_count(&self) -> usize {
        self.clients.lock().values().filter(|s| s.last_seen.elapsed() <= self.lease).count()
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.clients.lock().values().any(|s| s.open.contains_key(&ino))
    }

    /// Drop sessions whose lease ran out; returns the inodes they had open (candidates to free).
    pub fn expire(&self) -> Vec<u64> {
        let mut gone = Vec::new();
        let mut dead = Vec::new();
        self.clients.lock().retain(|id, s| {
            if s.last_seen.elapsed() > self.lease {
                gone.extend(s.open.keys().copied());
                dead.push(*id);
                false
            } else {
                true
            }
        });
        if !dead.is_empty() {
            tracing::info!(clients = ?dead, "client sessions expired; their open files and locks are released");
            self.unlock_where(|l, _| dead.contains(&l.client));
        }
        gone
    }

    fn unlock_where(&self, drop: impl Fn(&Lock, u64) -> bool) {
        let mut locks = self.locks.lock();
        for (ino, held) in locks.iter_mut() {
            held.retain(|l| !drop(l, *ino));
        }
        locks.retain(|_, held| !held.is_empty());
    }

    /// The first lock of another owner that conflicts with `want`, if any.
    pub fn conflict(&self, ino: u64, want: &Lock) -> Option<Lock> {
        let locks = self.locks.lock();
        conflict_in(locks.get(&ino).map(Vec::as_slice).unwrap_or(&[]), want)
    }

    /// Take, change or release (`typ == F_UNLCK`) a lock. Returns the conflicting lock instead
    /// if another owner holds one.
    pub fn set_lock(&self, ino: u64, want: Lock) -> Result<(), Lock> {
        let mut locks = self.locks.lock();
        let held = locks.entry(ino).or_default();
        if want.typ != F_UNLCK {
            if let Some(c) = conflict_in(held, &want) {
                return Err(c);
            }
        }
        // Cut the owner's own locks out of the range, keeping the parts outside it.
        let mut kept = Vec::with_capacity(held.len() + 2);
        for l in held.drain(..) {
            if l.client != want.client || l.owner != want.owner || !l.overlaps(want.start, want.end) {
                kept.push(l);
                continue;
            }
            if l.start < want.start {
                kept.push(Lock { end: want.start - 1, ..l });
            }
            if l.end > want.end {
                kept.push(Lock { start: want.end + 1, ..l });
            }
        }
        if want.typ != F_UNLCK {
            kept.push(want);
        }
        *held = kept;
        if held.is_empty() {
            locks.remove(&ino);
        }
        Ok(())
    }

    /// Release every lock of one owner on `ino` (close of a descriptor: POSIX semantics).
    pub fn unlock_owner(&self, client: u32, ino: u64, owner: u64) {
        self.unlock_where(|l, i| i == ino && l.client == client && l.owner == owner);
    }
}

fn conflict_in(held: &[Lock], want: &Lock) -> Option<Lock> {
    held.iter()
        .find(|l| {
            (l.client != want.client || l.owner != want.owner)
                && l.overlaps(want.start, want.end)
                && (l.typ == F_WRLCK || want.typ == F_WRLCK)
        })
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(client: u32, owner: u64, start: u64, end: u64, typ: u32) -> Lock {
        Lock { client, owner, pid: 1, start, end, typ }
    }

    #[test]
    fn a_session_belongs_to_the_certificate_that_registered_it() {
        let s = Sessions::new(Duration::from_secs(30));
        s.bind(4, "alice");
        s.opened(4, "alice", 100, 1).unwrap();
        s.set_lock(100, lock(4, 1, 0, 9, F_WRLCK)).unwrap();
        // Another certificate cannot renew, open under, release or lock as client 4.
        let e = s.heartbeat(4, "mallory", Some(vec![])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.message().contains("belongs to certificate \"alice\""), "{e}");
        assert!(s.opened(4, "mallory", 101, 2).is_err());
        assert!(s.check_owner(4, "mallory").is_err());
        assert!(s.check_owner(4, "alice").is_ok());
        assert!(s.is_open(100) && !s.is_open(101));
        // A client id nobody holds (after a restart) goes to the first that renews it.
        s.heartbeat(5, "bob", None).unwrap();
        assert!(s.heartbeat(5, "mallory", None).is_err());
        assert!(s.check_owner(6, "anyone").is_ok());
        // Registration gives the id a fresh session: a squatter's opens and locks are gone.
        s.heartbeat(7, "mallory", None).unwrap();
        s.opened(7, "mallory", 200, 1).unwrap();
        s.set_lock(200, lock(7, 1, 0, 9, F_WRLCK)).unwrap();
        s.bind(7, "carol");
        assert!(!s.is_open(200));
        assert_eq!(s.conflict(200, &lock(8, 1, 0, 9, F_WRLCK)), None);
        s.heartbeat(7, "carol", None).unwrap();
    }

    #[test]
    fn readers_share_writers_exclude() {
        let s = Sessions::new(Duration::from_secs(30));
        s.set_lock(1, lock(1, 1, 0, 99, F_RDLCK)).unwrap();
        s.set_lock(1, lock(2, 1, 50, 60, F_RDLCK)).unwrap();
        assert_eq!(s.set_lock(1, lock(2, 1, 0, 10, F_WRLCK)).unwrap_err().client, 1);
        // Same client, other owner (another process on that mount): conflicts too.
        assert!(s.set_lock(1, lock(1, 2, 0, 10, F_WRLCK)).is_err());
        // No overlap: fine. Another inode: fine.
        s.set_lock(1, lock(2, 1, 100, u64::MAX, F_WRLCK)).unwrap();
        s.set_lock(2, lock(2, 1, 0, 10, F_WRLCK)).unwrap();
    }

    #[test]
    fn unlock_splits_and_upgrade_replaces() {
        let s = Sessions::new(Duration::from_secs(30));
        s.set_lock(1, lock(1, 1, 0, 99, F_WRLCK)).unwrap();
        s.set_lock(1, lock(1, 1, 40, 59, F_UNLCK)).unwrap();
        assert!(s.conflict(1, &lock(2, 1, 40, 59, F_WRLCK)).is_none());
        assert!(s.conflict(1, &lock(2, 1, 30, 39, F_RDLCK)).is_some());
        assert!(s.conflict(1, &lock(2, 1, 60, 60, F_RDLCK)).is_some());
        // Downgrade part of it to a read lock: others may read there now.
        s.set_lock(1, lock(1, 1, 0, 9, F_RDLCK)).unwrap();
        assert!(s.conflict(1, &lock(2, 1, 0, 9, F_RDLCK)).is_none());
        assert!(s.conflict(1, &lock(2, 1, 0, 9, F_WRLCK)).is_some());
        s.unlock_owner(1, 1, 1);
        assert!(s.conflict(1, &lock(2, 1, 0, u64::MAX, F_WRLCK)).is_none());
    }

    #[test]
    fn release_and_expiry_drop_locks_and_opens() {
        let s = Sessions::new(Duration::from_millis(1));
        s.opened(7, "", 100, 0).unwrap();
        s.set_lock(100, lock(7, 1, 0, u64::MAX, F_WRLCK)).unwrap();
        assert!(s.is_open(100));
        s.released(7, 100, 0);
        assert!(!s.is_open(100));
        assert!(s.conflict(100, &lock(8, 1, 0, 0, F_WRLCK)).is_none());
        s.opened(7, "", 101, 0).unwrap();
        s.set_lock(101, lock(7, 1, 0, 0, F_WRLCK)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.expire(), vec![101]);
        assert!(!s.is_open(101));
        assert!(s.conflict(101, &lock(8, 1, 0, 0, F_WRLCK)).is_none());
    }

    #[test]
    fn first_heartbeat_announces_the_open_set_later_ones_renew() {
        let s = Sessions::new(Duration::from_secs(30));
        // After a restart an open call can arrive before the client's first heartbeat.
        s.opened(1, "", 5, 0).unwrap();
        s.heartbeat(1, "", Some(vec![6, 7])).unwrap();
        assert!(s.is_open(5) && s.is_open(6) && s.is_open(7));
        // A later heartbeat composed before an open must not undo it.
        s.opened(1, "", 8, 0).unwrap();
        s.heartbeat(1, "", Some(vec![5, 6, 7])).unwrap();
        assert!(s.is_open(8));
        s.released(1, 5, 0);
        s.heartbeat(1, "", Some(vec![5, 6, 7, 8])).unwrap();
        assert!(!s.is_open(5));
    }

    #[test]
    fn a_late_release_does_not_undo_a_newer_open() {
        let s = Sessions::new(Duration::from_secs(30));
        s.opened(3, "", 40, 1).unwrap();
        s.opened(3, "", 40, 2).unwrap(); // reopened before the release of open 1 arrived
        s.set_lock(40, lock(3, 1, 0, 0, F_WRLCK)).unwrap();
        assert!(!s.released(3, 40, 1));
        assert!(s.is_open(40));
        assert!(s.conflict(40, &lock(4, 1, 0, 0, F_WRLCK)).is_some(), "the newer open's lock went");
        // Out of order the other way: the newer open reaching us first is kept too.
        s.opened(3, "", 41, 5).unwrap();
        s.opened(3, "", 41, 4).unwrap();
        assert!(!s.released(3, 41, 4));
        assert!(s.released(3, 41, 5));
        assert!(!s.is_open(41));
        assert!(s.released(3, 40, 2));
        assert!(!s.is_open(40));
        assert!(s.conflict(40, &lock(4, 1, 0, 0, F_WRLCK)).is_none());
        // An announced open (after a metaserver restart) has generation 0: any release ends it.
        s.heartbeat(9, "", Some(vec![50])).unwrap();
        assert!(s.released(9, 50, 7));
        assert!(!s.is_open(50));
    }
}
