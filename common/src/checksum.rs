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

/// Block `index` of a shard of `shard_len` bytes, as a node of the shard's BLAKE3 tree: its
/// chaining value at its offset, or, for a shard of one block, the shard's hash itself. Every
/// block of a longer shard starts at a multiple of 64 KiB and is a whole subtree of BLAKE3's
/// tree (a left subtree is the largest power of two of 1 KiB chunks below the input's length),
/// so the blocks' chaining values merge to the shard's BLAKE3 hash ([`tree_root`]): a reader
/// that knows that hash can check any block it reads, given the chaining values of the others.
pub fn tree_block(block: &[u8], index: u32, shard_len: u64) -> BlockHash {
    use blake3::hazmat::HasherExt;
    if shard_len <= BLOCK_SIZE as u64 {
        return hash_block(block);
    }
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(index as u64 * BLOCK_SIZE as u64);
    hasher.update(block);
    hasher.finalize_non_root()
}

/// [`tree_block`] of every block of `data` (a whole shard).
pub fn tree_blocks(data: &[u8]) -> Vec<BlockHash> {
    data.chunks(BLOCK_SIZE).enumerate().map(|(i, b)| tree_block(b, i as u32, data.len() as u64)).collect()
}

/// The BLAKE3 hash of a shard of `shard_len` bytes from its blocks' [`tree_block`] values;
/// `None` when there are not as many as it has blocks.
pub fn tree_root(blocks: &[BlockHash], shard_len: u64) -> Option<BlockHash> {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, Mode};
    if blocks.len() != blocks_for(shard_len) {
        return None;
    }
    if shard_len <= BLOCK_SIZE as u64 {
        return Some(blocks.first().copied().unwrap_or_else(|| hash_block(&[])));
    }
    // The chaining value of the subtree over bytes `at..at + len` (a multiple of the block
    // size apart from the shard's end).
    fn subtree(blocks: &[BlockHash], at: u64, len: u64) -> BlockHash {
        if len <= BLOCK_SIZE as u64 {
            return blocks[(at / BLOCK_SIZE as u64) as usize];
        }
        let left = left_subtree_len(len);
        merge_subtrees_non_root(
            &subtree(blocks, at, left),
            &subtree(blocks, at + left, len - left),
            Mode::Hash,
        )
    }
    let left = left_subtree_len(shard_len);
    let root =
        merge_subtrees_root(&subtree(blocks, 0, left), &subtree(blocks, left, shard_len - left), Mode::Hash);
    Some(*root.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocks' tree values merge to the shard's plain BLAKE3 hash, at every length that
    /// matters (one chunk, one block, a block and a byte, powers of two and between); a block
    /// changed or a value missing does not.
    #[test]
    fn tree_blocks_merge_to_the_shards_hash() {
        let bs = BLOCK_SIZE;
        for len in
            [0, 1, 1024, bs - 1, bs, bs + 1, 2 * bs, 3 * bs + 5, 4 * bs, 5 * bs + 777, 16 * bs, 17 * bs - 3]
        {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 1000) as u8).collect();
            let blocks = tree_blocks(&data);
            assert_eq!(blocks.len(), blocks_for(len as u64), "{len}");
            let root = tree_root(&blocks, len as u64).unwrap();
            assert_eq!(root, *blake3::hash(&data).as_bytes(), "len {len}");
            if len > 0 {
                let mut other = data.clone();
                other[len / 2] ^= 1;
                assert_ne!(tree_root(&tree_blocks(&other), len as u64).unwrap(), root, "len {len}");
                assert_eq!(tree_root(&blocks[1..], len as u64), None);
            }
        }
    }

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
