//! Talking to a replicated metaserver: a list of addresses (`a:9400,b:9400,c:9400`), the one
//! that answered last tried first. A replica that does not lead answers `NotLeader` before
//! doing anything, so the request goes to the next one; one that cannot be reached is skipped
//! when there are others. After a round over all of them the caller pauses (jittered, growing
//! from 50 ms to 200 ms) and goes round again, until [`FAILOVER_WAIT`] has passed: long enough for
//! an election, short enough that a cluster with no majority fails (`EIO`) instead of hanging.
//! A lone metaserver (one address) that cannot be reached fails at once, as it always did.
//!
//! A replica that knows the leader names it in its `NotLeader` answer ([`not_leader`]); the next
//! try goes there, and an address the list did not have is learned (a replica added with `cairn
//! meta add` after this list was written), up to [`MAX_ADDRS`].

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use cairn_common::{CairnError, ErrorKind, Result};

/// How long a request keeps looking for a leader.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// The first pause between rounds.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between rounds: an election takes about a second, and a round costs each
/// replica one cheap refusal.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// How long one try waits for a replica that accepted the connection (a frozen or cut-off
/// leader keeps its connections open and answers nothing) before trying the next one, for
/// requests that answer in milliseconds when all is well.
pub const TRY_TIMEOUT: Duration = Duration::from_secs(5);

/// The most addresses a list grows to by learning leaders from `NotLeader` answers.
pub const MAX_ADDRS: usize = 16;

const LEADER_IS: &str = "; the leader is ";

/// The error a replica that does not lead answers with, naming the leader when it knows it
/// (the one place its wording is made: [`leader_hint`] reads it back).
pub fn not_leader(leader: Option<&str>) -> CairnError {
    CairnError::new(
        ErrorKind::NotLeader,
        match leader {
            Some(addr) => format!("this metaserver is not the leader{LEADER_IS}{addr}"),
            None => "this metaserver is not the leader and no leader is known yet".to_string(),
        },
    )
}

/// The leader's address a `NotLeader` answer names, if any.
pub fn leader_hint(e: &CairnError) -> Option<&str> {
    if e.kind() != ErrorKind::NotLeader {
        return None;
    }
    let (_, addr) = e.message().rsplit_once(LEADER_IS)?;
    let addr = addr.trim();
    (!addr.is_empty() && !addr.contains([' ', ','])).then_some(addr)
}

/// The metaservers of one cluster.
#[derive(Debug)]
pub struct Failover {
    /// Grows only (by learning leaders), so an index stays valid.
    addrs: std::sync::RwLock<Vec<String>>,
    current: AtomicUsize,
    wait: Duration,
    /// With several replicas: give up on one try after this long (see [`TRY_TIMEOUT`]).
    try_timeout: Option<Duration>,
}

impl Failover {
    /// Parse a comma-separated list of `host:port` ([`cairn_common::config::meta_addrs`]).
    pub fn parse(list: &str) -> Result<Failover> {
        let addrs = cairn_common::config::meta_addrs(list)?;
        Ok(Failover {
            addrs: std::sync::RwLock::new(addrs),
            current: AtomicUsize::new(0),
            wait: FAILOVER_WAIT,
            try_timeout: None,
        })
    }

    /// The same list with another bound on the wait for a leader.
    pub fn with_wait(mut self, wait: Duration) -> Failover {
        self.wait = wait;
        self
    }

    /// With several replicas, move on from one that has not answered a try within `timeout`.
    /// Only for requests that are safe to send again (see `Once` in `cairn.proto`) and that
    /// answer quickly when all is well.
    pub fn with_try_timeout(mut self, timeout: Duration) -> Failover {
        self.try_timeout = Some(timeout);
        self
    }

    /// Every address known now: the list given, then the leaders learned.
    pub fn addrs(&self) -> Vec<String> {
        self.addrs.read().expect("not poisoned").clone()
    }

    /// The address at `index` (indexes stay valid: the list only grows).
    pub fn addr(&self, index: usize) -> String {
        self.addrs.read().expect("not poisoned")[index].clone()
    }

    fn len(&self) -> usize {
        self.addrs.read().expect("not poisoned").len()
    }

    /// The index of the address tried first.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.len()
    }

    /// The index of `addr`, added to the list if it is new and the list is not full.
    fn learn(&self, addr: &str) -> Option<usize> {
        let mut addrs = self.addrs.write().expect("not poisoned");
        if let Some(i) = addrs.iter().position(|a| a == addr) {
            return Some(i);
        }
        if addrs.len() >= MAX_ADDRS {
            return None;
        }
        tracing::info!(leader = addr, "learned a metaserver replica's address from a NotLeader answer");
        addrs.push(addr.to_string());
        Some(addrs.len() - 1)
    }

    /// Whether `e` means "ask another metaserver".
    fn move_on(&self, e: &CairnError) -> bool {
        match e.kind() {
            ErrorKind::NotLeader => true,
            ErrorKind::Unavailable => self.len() > 1,
            _ => false,
        }
    }

    /// Run `call` with the index of a metaserver until one answers with something other than
    /// "not me" (see the module comment).
    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut since_pause = 0;
        loop {
            let index = self.current();
            let attempt = call(index);
            let answer = match self.try_timeout.filter(|_| self.len() > 1) {
                Some(limit) => tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| {
                    Err(CairnError::unavailable(format!(
                        "no answer from {} within {limit:?}",
                        self.addr(index)
                    )))
                }),
                None => attempt.await,
            };
            let error = match answer {
                Ok(reply) => return Ok(reply),
                Err(e) if !self.move_on(&e) => return Err(e),
                Err(e) => e,
            };
            // Move on from `index` (to the leader it named, if it named another), unless
            // another request already did.
            let hinted = leader_hint(&error).and_then(|addr| self.learn(addr)).filter(|i| *i != index);
            let next = hinted.unwrap_or((index + 1) % self.len());
            let _ = self.current.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
            since_pause += 1;
            // A round is one try of each address; a leader named on the way may be tried once
            // more within it, but no round goes on past twice the list without a pause.
            if since_pause < self.len() || (hinted.is_some() && since_pause < 2 * self.len()) {
                continue;
            }
            since_pause = 0;
            if started.elapsed() >= self.wait {
                return Err(CairnError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "no metaserver of {} served the request within {:?}: {}",
                        self.addrs().join(","),
                        self.wait,
                        error.message()
                    ),
                ));
            }
            if pause == FIRST_PAUSE {
                tracing::debug!("looking for the metaserver leader: {}", error.message());
            }
            let jitter = pause.mul_f64(rand::random::<f64>() * 0.5 + 0.75);
            tokio::time::sleep(jitter.min(self.wait.saturating_sub(started.elapsed()))).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn lists_parse_and_bad_ones_are_refused() {
        let f = Failover::parse(" a:1, http://b:2 ,,c:3").unwrap();
        assert_eq!(f.addrs(), ["a:1", "b:2", "c:3"]);
        assert!(Failover::parse(" , ").is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_follow_the_leader_and_stay_with_it() {
        let f = Failover::parse("a,b,c").unwrap();
        let asked = Mutex::new(Vec::new());
        let answer = |i: usize| {
            asked.lock().unwrap().push(i);
            async move {
                match i {
                    2 => Ok(i),
                    0 => Err(CairnError::unavailable("down")),
                    _ => Err(CairnError::new(ErrorKind::NotLeader, "not me")),
                }
            }
        };
        assert_eq!(f.call(answer).await.unwrap(), 2);
        assert_eq!(f.call(answer).await.unwrap(), 2);
        assert_eq!(*asked.lock().unwrap(), [0, 1, 2, 2], "the second request goes to the leader at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_named_leader_is_asked_next_and_a_new_address_is_learned() {
        let f = Failover::parse("a,b").unwrap();
        let asked = Mutex::new(Vec::new());
        let answer = |i: usize| {
            let addr = f.addr(i);
            asked.lock().unwrap().push(addr.clone());
            async move {
                match addr.as_str() {
                    "d:4" => Ok(addr),
                    "a" => Err(not_leader(Some("d:4"))),
                    _ => Err(not_leader(None)),
                }
            }
        };
        assert_eq!(f.call(answer).await.unwrap(), "d:4");
        assert_eq!(*asked.lock().unwrap(), ["a", "d:4"]);
        assert_eq!(f.addrs(), ["a", "b", "d:4"]);
        assert_eq!(f.addr(f.current()), "d:4", "later requests go to the leader at once");
        assert_eq!(leader_hint(&not_leader(Some("x:1"))), Some("x:1"));
        assert_eq!(leader_hint(&not_leader(None)), None);
        assert_eq!(leader_hint(&CairnError::not_found("; the leader is x:1")), None);

        // The list stops growing at MAX_ADDRS; a hint beyond that is a plain "not me".
        let many: Vec<String> = (0..MAX_ADDRS).map(|i| format!("h{i}:1")).collect();
        let f = Failover::parse(&many.join(",")).unwrap();
        assert_eq!(f.learn("new:1"), None);
        assert_eq!(f.learn("h3:1"), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn replicas_naming_a_leader_that_refuses_still_fail_after_the_wait() {
        // The leader has not opened its namespace yet and names itself; the follower names it.
        let f = Failover::parse("l:1,f:2").unwrap().with_wait(Duration::from_secs(3));
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let e = f
            .call(|_| {
                tries.fetch_add(1, Ordering::Relaxed);
                async { Err::<(), _>(not_leader(Some("l:1"))) }
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        let tries = tries.load(Ordering::Relaxed);
        assert!(tries < 200, "{tries} tries in 3 s: rounds must pause");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_hangs_is_left_after_the_try_timeout() {
        let f = Failover::parse("a,b").unwrap().with_try_timeout(Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let answer = f
            .call(|i| async move {
                if i == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(i)
            })
            .await;
        assert_eq!(answer.unwrap(), 1);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_return_at_once_and_no_leader_fails_after_the_wait() {
        let f = Failover::parse("a,b").unwrap();
        let e = f.call(|_| async { Err::<(), _>(CairnError::not_found("x")) }).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);

        let f = Failover::parse("a,b").unwrap().with_wait(Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let e = f
            .call(|_| async { Err::<(), _>(CairnError::new(ErrorKind::NotLeader, "none")) })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.message().contains("within 5s"), "{}", e.message());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(7), "{waited:?}");

        // A lone metaserver that cannot be reached fails at once.
        let f = Failover::parse("a").unwrap();
        let e = f.call(|_| async { Err::<(), _>(CairnError::unavailable("down")) }).await.unwrap_err();
        assert_eq!(e.message(), "down");
    }
}
