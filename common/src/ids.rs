//! Identifier newtypes. A [`ShardId`] is numbers only, so a chunkserver builds every path from
//! validated integers and no request can name a path outside its data directories.

use std::fmt;

/// The root directory's inode number (as in most Unix filesystems' FUSE view).
pub const ROOT_INO: u64 = 1;

/// An inode number is `slot (12 bits) ‖ counter (52 bits)`: the namespace slot (one of
/// [`crate::config::MAX_GROUPS`]) says which metadata group holds every record of the inode
/// (`docs/ARCHITECTURE.md`, "Several metadata groups"). Numbers handed out before groups are
/// slot 0's.
pub const SLOT_SHIFT: u32 = 52;

// One slot per possible group: the slot bits and the group numbers agree.
const _: () = assert!(crate::config::MAX_GROUPS as u64 == 1 << (64 - SLOT_SHIFT));

/// 32 hex digits: a cluster id or a chunkserver's node identity.
pub fn is_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The namespace slot of inode `ino`.
pub fn slot_of(ino: u64) -> u32 {
    (ino >> SLOT_SHIFT) as u32
}

/// An inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId(pub u64);

/// A chunkserver's id, assigned by the metaserver at first registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One shard of one version of one stripe of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId {
    pub ino: u64,
    pub stripe: u64,
    pub index: u32,
    pub version: u64,
}

/// Largest shard index accepted anywhere (k+m is at most this many).
pub const MAX_SHARDS: u32 = 32;

impl ShardId {
    /// The file name of this shard: fixed-width hex, so names sort by inode, stripe, index.
    pub fn file_name(&self) -> String {
        format!("{:016x}-{:012x}-{:02x}-{:016x}.shard", self.ino, self.stripe, self.index, self.version)
    }

    /// Parse a name produced by [`ShardId::file_name`]; anything else is `None`.
    pub fn parse_file_name(name: &str) -> Option<ShardId> {
        let stem = name.strip_suffix(".shard")?;
        let mut parts = stem.split('-');
        let (ino, stripe, index, version) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some()
            || ino.len() != 16
            || stripe.len() != 12
            || index.len() != 2
            || version.len() != 16
        {
            return None;
        }
        let id = ShardId {
            ino: u64::from_str_radix(ino, 16).ok()?,
            stripe: u64::from_str_radix(stripe, 16).ok()?,
            index: u32::from_str_radix(index, 16).ok()?,
            version: u64::from_str_radix(version, 16).ok()?,
        };
        id.validate().ok()?;
        Some(id)
    }

    /// The subdirectory that spreads shard files (256 buckets by inode).
    pub fn bucket(&self) -> String {
        format!("{:02x}", (self.ino ^ (self.ino >> 8)) & 0xff)
    }

    /// Reject ids no writer can produce.
    pub fn validate(&self) -> crate::Result<()> {
        if self.ino == 0 || self.index >= MAX_SHARDS || self.stripe >= (1u64 << 48) {
            return Err(crate::CairnError::invalid(format!("invalid shard id {self:?}")));
        }
        Ok(())
    }
}

impl From<&cairn_proto::ShardId> for ShardId {
    fn from(p: &cairn_proto::ShardId) -> Self {
        ShardId { ino: p.ino, stripe: p.stripe, index: p.index, version: p.version }
    }
}

impl From<ShardId> for cairn_proto::ShardId {
    fn from(s: ShardId) -> Self {
        cairn_proto::ShardId { ino: s.ino, stripe: s.stripe, index: s.index, version: s.version }
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}@{}", self.ino, self.stripe, self.index, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_name_round_trips() {
        let id = ShardId { ino: 42, stripe: 7, index: 5, version: (3 << 32) | 9 };
        assert_eq!(ShardId::parse_file_name(&id.file_name()), Some(id));
    }

    #[test]
    fn hostile_names_are_rejected() {
        for name in [
            "../../etc/passwd",
            "000000000000002a-000000000007-05-0000000300000009.shard/..",
            "000000000000002a-000000000007-05-0000000300000009",
            "000000000000002a-000000000007-ff-0000000300000009.shard",
            "0000000000000000-000000000007-01-0000000300000009.shard",
            "zz00000000000000-000000000007-01-0000000300000009.shard",
        ] {
            assert_eq!(ShardId::parse_file_name(name), None, "{name}");
        }
    }
}
