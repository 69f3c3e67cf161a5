//! The open-file limit of a server process. A server holds a descriptor per connection (and a
//! chunkserver one per open shard file); the soft limit many systems start processes with
//! (1,024) is below what the connection limits allow (`server::Limits`), and a process out of
//! descriptors cannot accept its legitimate clients either. So servers raise the soft limit to
//! the hard one at start, and the connection limits stay below whatever they got.

/// Descriptors kept for everything but connections (files, the database, listeners, pipes).
pub const RESERVED_FDS: u64 = 256;

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit; the soft limit in force after.
pub fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// This process's soft `RLIMIT_NOFILE` now.
pub fn open_files() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid pointer to a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let now = raise_open_files();
        assert_eq!(now, open_files());
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }
}
