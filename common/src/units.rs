//! Sizes and durations as people read them, for admin output and log lines.

use std::time::Duration;

/// `512 B`, `3.0 MiB`, `1.2 TiB` (binary units).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `45s`, `9m48s`, `2h05m`, rounding partial seconds up (a countdown never shows 0s early).
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs() + (d.subsec_nanos() > 0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_as_written() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_duration(Duration::from_millis(588_000)), "9m48s");
        assert_eq!(human_duration(Duration::from_millis(44_100)), "45s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2h05m");
        assert_eq!(human_duration(Duration::ZERO), "0s");
    }
}
