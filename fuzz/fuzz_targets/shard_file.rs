//! A shard file as the chunkserver reads it back from disk: the header parser, and the block
//! checksum check over any block range of what follows. Also the shard id's file name: for any
//! id, the name and bucket are plain hex (no path can be built from an id) and parse back.
//!
//! Input: byte 0 holds options (bit 0: fix up the fixed part's checksum after the fuzzer
//! changed it, so the checks behind it are reached; bit 1: expect the shard the header names
//! instead of a fixed one); then the file; the last 16 bytes also pick a block range.
#![no_main]

use cairn_chunk::shard::{parse_header, FIXED_LEN, HEADER_ALIGN, MAX_SHARD_BYTES};
use cairn_common::checksum::{hash_block, HASH_LEN};
use cairn_common::ShardId;
use libfuzzer_sys::fuzz_target;

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
}

fn check_id(id: ShardId) {
    let name = id.file_name();
    let stem = name.strip_suffix(".shard").unwrap_or_else(|| panic!("{name}"));
    assert!(stem.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-'), "{name}");
    assert!(id.bucket().bytes().all(|c| c.is_ascii_hexdigit()) && id.bucket().len() == 2);
    match ShardId::parse_file_name(&name) {
        Some(parsed) => assert_eq!(parsed, id),
        None => assert!(id.validate().is_err(), "{id:?} is valid but its name does not parse"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&options, file)) = data.split_first() else { return };
    let mut file = file.to_vec();
    if options & 1 == 1 && file.len() >= FIXED_LEN {
        let fixed = hash_block(&file[..64]);
        file[64..FIXED_LEN].copy_from_slice(&fixed);
    }
    let named = ShardId {
        ino: u64_at(&file, 16),
        stripe: u64_at(&file, 24),
        index: file.get(32..36).map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap())),
        version: u64_at(&file, 40),
    };
    check_id(named);
    let expected =
        if options & 2 == 2 { named } else { ShardId { ino: 42, stripe: 7, index: 3, version: 9 } };
    let Ok(header) = parse_header(&file, &expected) else { return };
    assert_eq!(header.id, expected);
    assert!(header.data_len <= MAX_SHARD_BYTES as u64);
    assert_eq!(header.header_len % HEADER_ALIGN as u64, 0);
    assert!(header.header_len >= (FIXED_LEN + header.nblocks as usize * HASH_LEN) as u64);
    // Any range of the data, as a read asks for it: the hashes and data it names lie inside the
    // header and the data, and checking them never panics.
    let n = file.len();
    let (a, b) = (u64_at(&file, n.saturating_sub(16)), u64_at(&file, n.saturating_sub(8)));
    for (start, end) in [(0, header.data_len), (a % (header.data_len + 1), b % (header.data_len + 1))] {
        let blocks = header.blocks_for(start, end);
        assert!(blocks.end <= header.nblocks, "{blocks:?} of {}", header.nblocks);
        let hashes = header.hashes_range(&blocks);
        let bytes = header.data_range(&blocks);
        assert!(hashes.end <= header.header_len);
        assert!(bytes.start >= header.header_len && bytes.end <= header.header_len + header.data_len);
        let get =
            |r: std::ops::Range<u64>| file.get(r.start as usize..(r.end as usize).min(n)).unwrap_or(&[]);
        let _ = header.verify(&blocks, get(hashes), get(bytes));
    }
});
