//! Where shards go: the tiers and their directories, the room each directory has (free space
//! above the reserve, and on SSD the directory's share of `ssd_capacity`), and the choice of a
//! directory for a new file.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use cairn_common::{CairnError, Result, ShardId};

use super::ShardStore;

/// A storage tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Ssd,
    Hdd,
}

impl Tier {
    /// The name used on the wire and in `cairn df`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Ssd => "ssd",
            Tier::Hdd => "hdd",
        }
    }
}

/// One configured data directory.
#[derive(Debug)]
pub(crate) struct TierDir {
    pub(crate) tier: Tier,
    /// The directory as configured (what `statvfs` and `cairn df` look at).
    pub(crate) root: PathBuf,
    /// `{root}/shards`, parent of the 256 bucket directories.
    pub(crate) shards: PathBuf,
    /// Shard files here are read with O_DIRECT and dropped from the page cache once written.
    pub(crate) direct: bool,
}

impl ShardStore {
    pub(crate) fn has_tier(&self, tier: Tier) -> bool {
        self.dirs.iter().any(|d| d.tier == tier)
    }

    /// SSD directory `dir`'s share of `ssd_capacity` (the last one takes the remainder);
    /// `None` for HDD directories and when no capacity is configured.
    pub(crate) fn ssd_share(&self, dir: usize) -> Option<u64> {
        let capacity = self.policy.ssd_capacity?;
        if self.dirs[dir].tier != Tier::Ssd {
            return None;
        }
        let ssd: Vec<usize> = (0..self.dirs.len()).filter(|&d| self.dirs[d].tier == Tier::Ssd).collect();
        let each = capacity / ssd.len() as u64;
        Some(if ssd.last() == Some(&dir) { capacity - each * (ssd.len() as u64 - 1) } else { each })
    }

    /// Bytes free for shards in directory `dir` holding `used` bytes: free space above the
    /// reserve, and on SSD no more than what is left of the directory's capacity share.
    fn room(&self, dir: usize, used: u64) -> io::Result<u64> {
        let free = disk_space(&self.dirs[dir].root)?.available.saturating_sub(self.reserve_bytes);
        Ok(match self.ssd_share(dir) {
            Some(share) => free.min(share.saturating_sub(used)),
            None => free,
        })
    }

    /// Bytes used and the capacity the watermarks apply to, summed over the directories of
    /// `tier`. Without a configured capacity, a directory's capacity is what it holds plus its
    /// room, so other data on the filesystem counts against the tier.
    pub(crate) fn tier_fill(&self, tier: Tier) -> (u64, u64) {
        let usage = self.index.lock().usage.clone();
        let (mut used, mut capacity) = (0u64, 0u64);
        for (d, dir) in self.dirs.iter().enumerate().filter(|(_, dir)| dir.tier == tier) {
            let u = usage[d].bytes;
            used += u;
            capacity += match self.ssd_share(d) {
                Some(share) => share,
                None => {
                    u + self.room(d, u).unwrap_or_else(|e| {
                        tracing::warn!(dir = %dir.root.display(), "statvfs failed: {e}");
                        0
                    })
                }
            };
        }
        (used, capacity)
    }

    /// The directories of `tier`, starting at the next one in its rotation.
    pub(crate) fn rotation(&self, tier: Tier) -> Vec<usize> {
        let next = match tier {
            Tier::Ssd => &self.next_ssd,
            Tier::Hdd => &self.next_hdd,
        };
        let of_tier: Vec<usize> = (0..self.dirs.len()).filter(|&d| self.dirs[d].tier == tier).collect();
        if of_tier.is_empty() {
            return of_tier;
        }
        let start = next.fetch_add(1, Ordering::Relaxed) % of_tier.len();
        of_tier[start..].iter().chain(&of_tier[..start]).copied().collect()
    }

    /// Choose a directory for a new file of `need` bytes: the shard's current directory if
    /// it is being rewritten, then SSD directories in rotation, then HDD directories.
    pub(crate) fn pick_dir(&self, id: &ShardId, need: u64, current: Option<usize>) -> Result<usize> {
        let candidates: Vec<usize> =
            current.into_iter().chain(self.rotation(Tier::Ssd)).chain(self.rotation(Tier::Hdd)).collect();
        self.pick_dir_from(id, need, &candidates)
    }

    /// The first of `candidates` with room for `need` bytes, or a `NoSpace` error that says
    /// how much room each had.
    pub(crate) fn pick_dir_from(&self, id: &ShardId, need: u64, candidates: &[usize]) -> Result<usize> {
        let usage = self.index.lock().usage.clone();
        let mut report = Vec::new();
        for &dir in candidates {
            match self.room(dir, usage[dir].bytes) {
                Ok(room) if room >= need => return Ok(dir),
                Ok(room) => report.push(format!(
                    "{} {} has room for {room} bytes{}",
                    self.dirs[dir].tier.as_str(),
                    self.dirs[dir].root.display(),
                    match self.ssd_share(dir) {
                        Some(share) => format!(" (capacity share {share}, reserve kept)"),
                        None => " above the reserve".into(),
                    }
                )),
                Err(e) => {
                    tracing::warn!(dir = %self.dirs[dir].root.display(), "statvfs failed: {e}");
                    report.push(format!("{}: statvfs failed: {e}", self.dirs[dir].root.display()));
                }
            }
        }
        report.dedup();
        Err(CairnError::new(
            cairn_common::ErrorKind::NoSpace,
            format!(
                "no room for shard {id} ({need} bytes, reserve_bytes = {}): {}",
                self.reserve_bytes,
                report.join("; ")
            ),
        ))
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DiskSpace {
    pub(crate) capacity: u64,
    /// Bytes an unprivileged writer may still use (`f_bavail`).
    pub(crate) available: u64,
}

// The statvfs field types differ between platforms (u32 or u64), hence the casts.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn disk_space(path: &Path) -> io::Result<DiskSpace> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut st = MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated string and `st` points to writable memory of the
    // right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so the struct is initialised (and it was zeroed before).
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize as u64;
    Ok(DiskSpace {
        capacity: (st.f_blocks as u64).saturating_mul(frsize),
        available: (st.f_bavail as u64).saturating_mul(frsize),
    })
}

/// Refuse a tier configured for O_DIRECT on a filesystem that cannot do it (tmpfs before Linux
/// 6.6, some FUSE and network filesystems), at start rather than at the first read.
pub(crate) fn probe_direct(dir: &TierDir) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.shards.join(format!(".direct-probe-{:016x}", rand::random::<u64>()));
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    match opened {
        Ok(_) => Ok(()),
        Err(e) => Err(CairnError::invalid(format!(
            "{} {}: {}_direct_io is set but its filesystem refuses O_DIRECT ({e})",
            dir.tier.as_str(),
            dir.root.display(),
            dir.tier.as_str()
        ))),
    }
}
