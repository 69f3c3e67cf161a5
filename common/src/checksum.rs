//! Block checksums: BLAKE3 over fixed-size blocks of a shard. BLAKE3 rather than CRC32C
//! because it also catches deliberate or systematic corruption and runs at ≈ 2–3 GB/s per core
//! here (see shared/DEPENDENCIES.md), above the disk's ≈ 0.5 GB/s.

/// Bytes covered by one checksum.
pub const BLOCK_SIZE: usize = 64 << 10;
/// Bytes of one checksum.
pub const HASH_LEN: usize = 32;

pub type BlockHash = [u8; HASH_LEN];

pub fn hash_block(data: &[u8]) -> BlockHash {
    *blake3::hash(data).as_bytes()
}

/// Checksums of every `BLOCK_SIZE` block of `data` (the last block may be short).
pub fn hash_blocks(data: &[u8]) -> Vec<BlockHash> {
    data.chunks(BLOCK_SIZE).map(hash_block).collect()
}

pub fn blocks_for(len: u64) -> usize {
    (len as usize).div_ceil(BLOCK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_data_and_detect_a_flip() {
        let mut data = vec![7u8; BLOCK_SIZE * 2 + 5];
        let hashes = hash_blocks(&data);
        assert_eq!(hashes.len(), 3);
        assert_eq!(blocks_for(data.len() as u64), 3);
        data[BLOCK_SIZE + 1] ^= 1;
        let again = hash_blocks(&data);
        assert_eq!(hashes[0], again[0]);
        assert_ne!(hashes[1], again[1]);
        assert!(hash_blocks(&[]).is_empty());
    }
}
