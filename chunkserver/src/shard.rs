//! The on-disk shard format, versions 1 and 2 (written: 2). A shard file is a header followed
//! by the data:
//!
//! ```text
//! offset  size  field (little-endian)
//!      0     8  magic b"CAIRNSHD"
//!      8     2  format version (1 or 2)
//!     10     2  flags (none defined; must be 0)
//!     12     4  header_len: bytes before the data, a multiple of 4096
//!     16     8  ino
//!     24     8  stripe
//!     32     4  index
//!     36     4  reserved (0)
//!     40     8  version (of the stripe)
//!     48     8  data_len
//!     56     4  block_size (64 KiB)
//!     60     4  nblocks = ceil(data_len / block_size)
//!     64    32  BLAKE3 of bytes 0..64
//!     96  32*n  one value per data block (the last block may be short):
//!               format 1: the block's BLAKE3 hash;
//!               format 2: the block's node of the shard's BLAKE3 tree (its chaining value at
//!               its offset; for a shard of one block, the shard's hash), so the values merge
//!               to the BLAKE3 hash of the whole data (`checksum::tree_root`), the content hash
//!               a stripe record holds: a reader can check any block it reads end to end
//! header_len    data_len bytes of data
//! ```
//!
//! A block costs the same to check in either format. Format 1 shards (written before) are
//! read as they are; every new shard, rebuild and tier move of a new file is format 2.
//!
//! Invariants: the fixed part is covered by its own hash and every data block by its block
//! hash, so any flipped bit is caught either when the header is parsed or when the block is
//! read; a block hash that is itself damaged shows up as a mismatch of its block. Data starts
//! on a 4096-byte boundary so a later O_DIRECT engine can read it in place. Every way a header
//! can be wrong is an `ErrorKind::Corrupt` error that says what was wrong.

use std::ops::Range;

use cairn_common::checksum::{
    hash_block, hash_blocks, tree_block, tree_blocks, BlockHash, BLOCK_SIZE, HASH_LEN,
};
use cairn_common::{CairnError, Result, ShardId};

pub const MAGIC: &[u8; 8] = b"CAIRNSHD";
/// The format this code writes; it reads this one and [`FORMAT_BLOCK_HASHES`].
pub const FORMAT_VERSION: u16 = 2;
/// The first format: a plain BLAKE3 hash per block.
pub const FORMAT_BLOCK_HASHES: u16 = 1;
/// Bytes of the fixed part, including its hash; block hashes follow.
pub const FIXED_LEN: usize = 96;
/// Header lengths are rounded up to this.
pub const HEADER_ALIGN: usize = 4096;
/// Largest shard the chunkserver accepts: the largest stripe unit (64 MiB) plus 1 KiB of slack.
pub const MAX_SHARD_BYTES: usize = (64 << 20) + 1024;

/// The fixed part of a parsed, verified header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    pub id: ShardId,
    pub header_len: u64,
    pub data_len: u64,
    pub nblocks: u32,
    /// 1: block hashes; 2: the blocks' nodes of the shard's BLAKE3 tree.
    pub format: u16,
}

/// Bytes of the header of a shard holding `data_len` bytes.
pub fn header_len_for(data_len: u64) -> u64 {
    let nblocks = data_len.div_ceil(BLOCK_SIZE as u64);
    (FIXED_LEN as u64 + nblocks * HASH_LEN as u64).div_ceil(HEADER_ALIGN as u64) * HEADER_ALIGN as u64
}

/// The complete header (fixed part, block values, padding) for `data` stored as shard `id`.
pub fn encode_header(id: &ShardId, data: &[u8]) -> Vec<u8> {
    encode_header_as(id, data, FORMAT_VERSION)
}

/// [`encode_header`] in format `format` (1 only to test that older shards still read).
pub fn encode_header_as(id: &ShardId, data: &[u8], format: u16) -> Vec<u8> {
    let hashes = if format == FORMAT_BLOCK_HASHES { hash_blocks(data) } else { tree_blocks(data) };
    let header_len = header_len_for(data.len() as u64) as usize;
    let mut out = Vec::with_capacity(header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(header_len as u32).to_le_bytes());
    out.extend_from_slice(&id.ino.to_le_bytes());
    out.extend_from_slice(&id.stripe.to_le_bytes());
    out.extend_from_slice(&id.index.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&id.version.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    let fixed_hash = hash_block(&out);
    out.extend_from_slice(&fixed_hash);
    for h in &hashes {
        out.extend_from_slice(h);
    }
    out.resize(header_len, 0);
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Parse and verify the fixed part of a header read from the start of the file of shard
/// `expected`. `buf` may hold more than the fixed part.
pub fn parse_header(buf: &[u8], expected: &ShardId) -> Result<ShardHeader> {
    let bad = |what: String| CairnError::corrupt(format!("shard {expected}: {what}"));
    if buf.len() < FIXED_LEN {
        return Err(bad(format!("header truncated ({} of {FIXED_LEN} bytes)", buf.len())));
    }
    if &buf[..8] != MAGIC {
        return Err(bad("bad magic (not a Cairn shard file)".into()));
    }
    let format = u16_at(buf, 8);
    if format != FORMAT_VERSION && format != FORMAT_BLOCK_HASHES {
        return Err(bad(format!(
            "unsupported shard format version {format} (this build reads {FORMAT_BLOCK_HASHES} and {FORMAT_VERSION})"
        )));
    }
    if hash_block(&buf[..64]) != buf[64..FIXED_LEN] {
        return Err(bad("header checksum mismatch".into()));
    }
    let flags = u16_at(buf, 10);
    if flags != 0 {
        return Err(bad(format!("unknown header flags {flags:#x}")));
    }
    if u32_at(buf, 36) != 0 {
        return Err(bad("reserved header field is not zero".into()));
    }
    let id = ShardId {
        ino: u64_at(buf, 16),
        stripe: u64_at(buf, 24),
        index: u32_at(buf, 32),
        version: u64_at(buf, 40),
    };
    if id != *expected {
        return Err(bad(format!("header names shard {id}")));
    }
    let data_len = u64_at(buf, 48);
    if data_len > MAX_SHARD_BYTES as u64 {
        return Err(bad(format!("data length {data_len} is larger than {MAX_SHARD_BYTES}")));
    }
    let block_size = u32_at(buf, 56);
    if block_size as usize != BLOCK_SIZE {
        return Err(bad(format!("block size {block_size}, expected {BLOCK_SIZE}")));
    }
    let nblocks = u32_at(buf, 60);
    if nblocks as u64 != data_len.div_ceil(BLOCK_SIZE as u64) {
        return Err(bad(format!("{nblocks} blocks do not cover {data_len} bytes")));
    }
    let header_len = u32_at(buf, 12) as u64;
    if header_len != header_len_for(data_len) {
        return Err(bad(format!("header length {header_len}, expected {}", header_len_for(data_len))));
    }
    Ok(ShardHeader { id, header_len, data_len, nblocks, format })
}

impl ShardHeader {
    /// Blocks covering the data bytes `start..end` (empty when the range is).
    pub fn blocks_for(&self, start: u64, end: u64) -> Range<u32> {
        if start >= end {
            return 0..0;
        }
        let bs = BLOCK_SIZE as u64;
        (start / bs) as u32..end.div_ceil(bs) as u32
    }

    /// Byte range, in the file, of the hashes of `blocks`.
    pub fn hashes_range(&self, blocks: &Range<u32>) -> Range<u64> {
        let at = |b: u32| FIXED_LEN as u64 + b as u64 * HASH_LEN as u64;
        at(blocks.start)..at(blocks.end)
    }

    /// Byte range, in the file, of the data of `blocks` (the last block may be short).
    pub fn data_range(&self, blocks: &Range<u32>) -> Range<u64> {
        let bs = BLOCK_SIZE as u64;
        let start = blocks.start as u64 * bs;
        let end = (blocks.end as u64 * bs).min(self.data_len);
        self.header_len + start..self.header_len + end
    }

    /// Check the data of `blocks` against their hashes (`hashes` as stored for those blocks).
    /// Names the first block that does not match.
    pub fn verify(&self, blocks: &Range<u32>, hashes: &[u8], data: &[u8]) -> Result<()> {
        let range = self.data_range(blocks);
        if data.len() as u64 != range.end - range.start {
            return Err(CairnError::corrupt(format!(
                "shard {}: data truncated ({} of {} bytes of blocks {blocks:?})",
                self.id,
                data.len(),
                range.end - range.start
            )));
        }
        if hashes.len() != blocks.len() * HASH_LEN {
            return Err(CairnError::corrupt(format!("shard {}: block hashes truncated", self.id)));
        }
        for ((block, chunk), stored) in
            blocks.clone().zip(data.chunks(BLOCK_SIZE)).zip(hashes.chunks(HASH_LEN))
        {
            let actual: BlockHash = match self.format {
                FORMAT_BLOCK_HASHES => hash_block(chunk),
                _ => tree_block(chunk, block, self.data_len),
            };
            if actual != stored {
                return Err(CairnError::corrupt(format!(
                    "shard {}: block {block} (data bytes {}..{}) fails its checksum",
                    self.id,
                    block as u64 * BLOCK_SIZE as u64,
                    block as u64 * BLOCK_SIZE as u64 + chunk.len() as u64
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_common::ErrorKind;

    fn id() -> ShardId {
        ShardId { ino: 42, stripe: 7, index: 3, version: 9 }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The shard file: header then data.
    fn file(len: usize) -> Vec<u8> {
        let d = data(len);
        let mut f = encode_header(&id(), &d);
        f.extend_from_slice(&d);
        f
    }

    fn verify_all(f: &[u8]) -> Result<ShardHeader> {
        let h = parse_header(f, &id())?;
        let blocks = 0..h.nblocks;
        let hr = h.hashes_range(&blocks);
        let dr = h.data_range(&blocks);
        let data_end = (dr.end as usize).min(f.len());
        h.verify(&blocks, &f[hr.start as usize..hr.end as usize], &f[dr.start as usize..data_end])?;
        Ok(h)
    }

    #[test]
    fn round_trip() {
        for len in [0, 1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 5 * BLOCK_SIZE + 17] {
            let f = file(len);
            let h = verify_all(&f).unwrap();
            assert_eq!(h.id, id());
            assert_eq!(h.data_len, len as u64);
            assert_eq!(h.header_len % HEADER_ALIGN as u64, 0);
            assert_eq!(f.len() as u64, h.header_len + len as u64);
            assert_eq!(&f[h.header_len as usize..], &data(len)[..]);
        }
        // The largest shard's header still fits its declared length.
        assert_eq!(header_len_for(MAX_SHARD_BYTES as u64), 36 * 1024);
    }

    /// Format 1 shards (block hashes) still read and verify; format 2's block values merge to
    /// the data's BLAKE3 hash, the content hash a stripe record holds for it.
    #[test]
    fn both_formats_verify_and_format_2_merges_to_the_content_hash() {
        use cairn_common::checksum::tree_root;
        for len in [1, BLOCK_SIZE, BLOCK_SIZE + 1, 5 * BLOCK_SIZE + 17] {
            let d = data(len);
            for format in [FORMAT_BLOCK_HASHES, FORMAT_VERSION] {
                let mut f = encode_header_as(&id(), &d, format);
                f.extend_from_slice(&d);
                let h = verify_all(&f).unwrap();
                assert_eq!(h.format, format);
                let mut bad = f.clone();
                bad[h.header_len as usize + len - 1] ^= 1;
                assert_eq!(verify_all(&bad).unwrap_err().kind(), ErrorKind::Corrupt, "format {format}");
            }
            let f = file(len);
            let h = parse_header(&f, &id()).unwrap();
            let values: Vec<BlockHash> = f[h.hashes_range(&(0..h.nblocks)).start as usize..]
                .chunks(HASH_LEN)
                .take(h.nblocks as usize)
                .map(|c| c.try_into().unwrap())
                .collect();
            assert_eq!(tree_root(&values, len as u64), Some(*blake3::hash(&d).as_bytes()), "len {len}");
        }
    }

    #[test]
    fn every_header_byte_is_protected() {
        let f = file(3 * BLOCK_SIZE + 5);
        for at in 0..FIXED_LEN {
            let mut bad = f.clone();
            bad[at] ^= 0x40;
            let err = verify_all(&bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corrupt, "byte {at}: {err}");
        }
        // A damaged block hash shows up as a mismatch of its block.
        let mut bad = f.clone();
        bad[FIXED_LEN + HASH_LEN + 1] ^= 1;
        let err = verify_all(&bad).unwrap_err();
        assert!(err.message().contains("block 1"), "{err}");
    }

    #[test]
    fn a_flipped_data_byte_fails_only_its_block() {
        let mut f = file(4 * BLOCK_SIZE);
        let h = parse_header(&f, &id()).unwrap();
        f[h.header_len as usize + 2 * BLOCK_SIZE + 100] ^= 1;
        let err = verify_all(&f).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("block 2"), "{err}");
        for block in 0..4u32 {
            let blocks = block..block + 1;
            let hr = h.hashes_range(&blocks);
            let dr = h.data_range(&blocks);
            let r = h.verify(
                &blocks,
                &f[hr.start as usize..hr.end as usize],
                &f[dr.start as usize..dr.end as usize],
            );
            assert_eq!(r.is_err(), block == 2, "block {block}");
        }
    }

    #[test]
    fn unknown_version_and_wrong_id_are_rejected() {
        let mut f = file(10);
        f[8..10].copy_from_slice(&3u16.to_le_bytes());
        let h = hash_block(&f[..64]);
        f[64..96].copy_from_slice(&h);
        let err = parse_header(&f, &id()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("version 3"), "{err}");

        let other = ShardId { version: 10, ..id() };
        let err = parse_header(&file(10), &other).unwrap_err();
        assert!(err.message().contains("header names shard"), "{err}");
        let err = parse_header(&file(10)[..50], &id()).unwrap_err();
        assert!(err.message().contains("truncated"), "{err}");
    }

    #[test]
    fn truncated_data_is_corrupt() {
        let f = file(BLOCK_SIZE + 10);
        let err = verify_all(&f[..f.len() - 1]).unwrap_err();
        assert!(err.message().contains("truncated"), "{err}");
    }

    #[test]
    fn block_ranges() {
        let h = parse_header(&file(3 * BLOCK_SIZE + 1), &id()).unwrap();
        let bs = BLOCK_SIZE as u64;
        assert_eq!(h.blocks_for(0, 1), 0..1);
        assert_eq!(h.blocks_for(bs - 1, bs + 1), 0..2);
        assert_eq!(h.blocks_for(bs, 2 * bs), 1..2);
        assert_eq!(h.blocks_for(3 * bs, 3 * bs + 1), 3..4);
        assert_eq!(h.blocks_for(5, 5), 0..0);
        assert_eq!(h.data_range(&(3..4)), h.header_len + 3 * bs..h.header_len + 3 * bs + 1);
        assert_eq!(h.hashes_range(&(1..3)), 128..192);
    }
}
