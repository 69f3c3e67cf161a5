//! Disk space summed over tiers, each filesystem once. Several chunkservers (or the SSD and HDD
//! directories of one) often share a filesystem: on one test machine, or two data directories on
//! one disk. Each tier reports the filesystem behind its numbers as `fs_id` (machine id and
//! device); tiers with the same non-empty `fs_id` are one filesystem, counted at the first of
//! them with the most free space any of them reports (their reserves may differ).

use std::collections::HashMap;

use cairn_proto::TierUsage;

/// Raw (capacity, free) of `tiers`, each filesystem once (with the largest capacity and free
/// space any of its tiers reports: one whose statvfs failed reports zeros).
pub fn raw_space<'a>(tiers: impl IntoIterator<Item = &'a TierUsage>) -> (u64, u64) {
    let mut capacity = 0u64;
    let mut free = 0u64;
    let mut shared: HashMap<&str, (u64, u64)> = HashMap::new();
    for t in tiers {
        if t.fs_id.is_empty() {
            capacity = capacity.saturating_add(t.capacity);
            free = free.saturating_add(t.free);
        } else {
            let most = shared.entry(&t.fs_id).or_default();
            *most = (most.0.max(t.capacity), most.1.max(t.free));
        }
    }
    for (c, f) in shared.into_values() {
        capacity = capacity.saturating_add(c);
        free = free.saturating_add(f);
    }
    (capacity, free)
}

/// For each of `tiers`, the index of an earlier tier on the same filesystem, if any (its space
/// is already counted there).
pub fn shared_with(tiers: &[&TierUsage]) -> Vec<Option<usize>> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    tiers
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.fs_id.is_empty() {
                return None;
            }
            match first.get(t.fs_id.as_str()) {
                Some(&j) => Some(j),
                None => {
                    first.insert(&t.fs_id, i);
                    None
                }
            }
        })
        .collect()
}

/// This machine's identity for `fs_id`: the running kernel's boot id, which every process
/// and container on one machine shares (so their tier directories on one disk count once)
/// and VMs cloned from one image do not (unlike `/etc/machine-id`); else the machine id, else
/// the host name.
pub fn machine_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        [
            "/proc/sys/kernel/random/boot_id",
            "/etc/machine-id",
            "/var/lib/dbus/machine-id",
            "/proc/sys/kernel/hostname",
        ]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_string())
        .find(|id| !id.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
    })
}

/// `fs_id` of the filesystem holding `path`: this machine and the device number.
pub fn fs_id(path: &std::path::Path) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    Ok(format!("{}:{}:{}", machine_id(), libc::major(dev), libc::minor(dev)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(fs_id: &str, capacity: u64, free: u64) -> TierUsage {
        TierUsage { fs_id: fs_id.into(), capacity, free, ..Default::default() }
    }

    #[test]
    fn a_shared_filesystem_counts_once_with_its_largest_free() {
        let tiers = [
            tier("m:8:1", 100, 40),
            tier("m:8:1", 100, 45),
            tier("m:8:2", 50, 10),
            tier("", 20, 5),
            tier("", 20, 5),
            tier("other:8:1", 100, 40),
        ];
        assert_eq!(raw_space(&tiers), (100 + 50 + 20 + 20 + 100, 45 + 10 + 5 + 5 + 40));
        // A tier whose statvfs failed (zeros) does not hide its filesystem.
        assert_eq!(raw_space(&[tier("m:8:1", 0, 0), tier("m:8:1", 100, 40)]), (100, 40));
        let refs: Vec<&TierUsage> = tiers.iter().collect();
        assert_eq!(shared_with(&refs), vec![None, Some(0), None, None, None, None]);
        assert_eq!(raw_space(&[]), (0, 0));
    }
}
