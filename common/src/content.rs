//! Content hashes of data shards (docs/ARCHITECTURE.md, "Content hashes"): the BLAKE3 hash of
//! each data shard's stored bytes, computed by the writing client and kept in the stripe
//! record, so bytes a chunkserver serves are checked against what the writer wrote, not only
//! against the block checksums the chunkserver computed itself.

use crate::{CairnError, Result};

/// Bytes of one content hash (a whole BLAKE3 hash).
pub const HASH_LEN: usize = 32;

/// The content hashes of a stripe's data shards, in index order: one per data shard, or none
/// at all (a record written before they existed, or by an older client).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentHashes(Vec<[u8; HASH_LEN]>);

impl ContentHashes {
    /// The hashes of `data_shards` as stored (unpadded; an empty shard hashes the empty input).
    pub fn of<T: AsRef<[u8]>>(data_shards: &[T]) -> ContentHashes {
        ContentHashes(data_shards.iter().map(|s| *blake3::hash(s.as_ref()).as_bytes()).collect())
    }

    /// From a record's or a request's bytes: empty (no hashes) or `k` hashes end to end.
    pub fn from_bytes(bytes: &[u8], k: u32) -> Result<ContentHashes> {
        if bytes.is_empty() {
            return Ok(ContentHashes::default());
        }
        if bytes.len() != k as usize * HASH_LEN {
            return Err(CairnError::invalid(format!(
                "content hashes: {} bytes, expected none or {} ({k} data shards × {HASH_LEN})",
                bytes.len(),
                k as usize * HASH_LEN
            )));
        }
        Ok(ContentHashes(
            bytes.chunks_exact(HASH_LEN).map(|c| c.try_into().expect("chunk of HASH_LEN")).collect(),
        ))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.concat()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether shard `index` has a hash to be checked against (a data shard of a record that
    /// has them).
    pub fn covers(&self, index: u32) -> bool {
        (index as usize) < self.0.len()
    }

    /// The content hash of data shard `index`, if there is one.
    pub fn get(&self, index: u32) -> Option<&[u8; HASH_LEN]> {
        self.0.get(index as usize)
    }

    /// Check shard `index`'s stored bytes. A mismatch is `Corrupt` (damage, as a failed block
    /// checksum is); a shard without a hash (parity, or no hashes) passes.
    pub fn check(&self, index: u32, data: &[u8]) -> Result<()> {
        match self.0.get(index as usize) {
            Some(expected) if blake3::hash(data).as_bytes() != expected => Err(CairnError::corrupt(format!(
                "data shard {index}: its {} bytes do not match the content hash its writer recorded",
                data.len()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn hashes_round_trip_and_check_each_data_shard() {
        let shards = [b"first shard".to_vec(), b"second".to_vec(), Vec::new()];
        let hashes = ContentHashes::of(&shards);
        let again = ContentHashes::from_bytes(&hashes.to_bytes(), 3).unwrap();
        assert_eq!(again, hashes);
        for (i, s) in shards.iter().enumerate() {
            again.check(i as u32, s).unwrap();
        }
        let e = again.check(1, b"secon!").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("data shard 1"), "{e}");
        // Parity (index k and up) and records without hashes are not checked here.
        again.check(3, b"anything").unwrap();
        ContentHashes::default().check(0, b"anything").unwrap();
        assert!(again.covers(2) && !again.covers(3));
    }

    #[test]
    fn hashes_of_the_wrong_length_are_refused() {
        assert!(ContentHashes::from_bytes(&[], 4).unwrap().is_empty());
        for len in [1, 31, 3 * HASH_LEN, 5 * HASH_LEN] {
            let e = ContentHashes::from_bytes(&vec![0; len], 4).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{len}");
        }
    }
}
