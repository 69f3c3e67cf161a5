//! Wall-clock timestamps as stored in inodes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_proto::Timespec;

pub fn now() -> Timespec {
    from_system(SystemTime::now())
}

pub fn from_system(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Timespec { sec: -(d.as_secs() as i64), nsec: 0 }
            } else {
                Timespec { sec: -(d.as_secs() as i64) - 1, nsec: 1_000_000_000 - d.subsec_nanos() }
            }
        }
    }
}

pub fn to_system(t: &Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

/// Seconds since the epoch, now.
pub fn unix_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_before_and_after_epoch() {
        for t in [Timespec { sec: 5, nsec: 7 }, Timespec { sec: -5, nsec: 7 }, Timespec { sec: 0, nsec: 0 }] {
            assert_eq!(from_system(to_system(&t)), t);
        }
    }
}
