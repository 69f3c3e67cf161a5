//! The client's block cache for random readers: verified 64 KiB blocks of shards, shared by
//! every open file of the mount and bounded in bytes.
//!
//! A chunkserver reads and verifies a whole checksum block to answer any range inside it, so a
//! random read asks for the whole blocks around its range and keeps them; the next read that
//! falls into one of them is answered without a round trip. Sequential readers do not use it
//! (they have the per-file stripe cache and would only push random readers' blocks out).
//!
//! Coherence needs nothing: a shard id names immutable bytes. Every write goes to a fresh
//! version (the writer's client id, never handed out twice, and its own counter), so a key is
//! never reused for other data; a reader that still has an old stripe record reads the old
//! version's bytes, as it would from the chunkservers. Truncation only shortens the valid
//! length of a stripe, which the reader applies on top.
//!
//! Eviction is CLOCK (second chance): blocks sit in insertion order, a hit sets the block's
//! referenced bit, and the sweep skips (and clears) referenced blocks once before evicting.

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};
use cairn_common::checksum::BLOCK_SIZE;
use cairn_common::ShardId;
use parking_lot::Mutex;

/// Bytes of one cached block: the chunkservers' checksum block.
pub const BLOCK: u64 = BLOCK_SIZE as u64;

type Key = (ShardId, u64);

struct Entry {
    data: Bytes,
    referenced: bool,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    ring: VecDeque<Key>,
    bytes: usize,
}

pub struct BlockCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

/// The block-aligned span around `[offset, offset + len)`: the first block and the bytes to ask
/// a chunkserver for.
pub fn aligned(offset: u64, len: u64) -> (u64, u64) {
    let first = offset / BLOCK;
    let end = (offset + len).div_ceil(BLOCK);
    (first, (end - first) * BLOCK)
}

impl BlockCache {
    /// A cache of at most `capacity` bytes; 0 disables it.
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache { capacity, inner: Mutex::new(Inner::default()) }
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes cached now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    /// `len` bytes at `offset` of shard `id`, if every block they touch is cached. A range that
    /// runs past the shard's end (its last block is short) comes back short, as the chunkserver
    /// would answer; `None` when any block is missing.
    pub fn get(&self, id: ShardId, offset: u64, len: u64) -> Option<Bytes> {
        if len == 0 {
            return None;
        }
        let (first, span) = aligned(offset, len);
        let blocks = span / BLOCK;
        let mut inner = self.inner.lock();
        let mut parts = Vec::with_capacity(blocks as usize);
        for b in first..first + blocks {
            let entry = inner.map.get_mut(&(id, b))?;
            entry.referenced = true;
            let data = entry.data.clone();
            let short = (data.len() as u64) < BLOCK;
            parts.push(data);
            if short {
                break; // the shard ends in this block
            }
        }
        drop(inner);
        let skip = (offset - first * BLOCK) as usize;
        if let [one] = parts.as_slice() {
            let from = skip.min(one.len());
            let to = (skip + len as usize).min(one.len());
            return Some(one.slice(from..to));
        }
        let mut out = BytesMut::with_capacity(len as usize);
        let mut at = 0usize;
        for part in &parts {
            let from = skip.saturating_sub(at).min(part.len());
            let want = len as usize - out.len();
            let to = (from + want).min(part.len());
            out.extend_from_slice(&part[from..to]);
            at += part.len();
        }
        Some(out.freeze())
    }

    /// Keep the blocks that `data`, read at `offset` of shard `id`, holds whole; with
    /// `shard_ends` (the chunkserver returned less than asked) the short last block too.
    pub fn insert(&self, id: ShardId, offset: u64, data: &Bytes, shard_ends: bool) {
        if !self.enabled() {
            return;
        }
        let end = offset + data.len() as u64;
        let mut inner = self.inner.lock();
        let mut b = offset.div_ceil(BLOCK);
        while b * BLOCK < end {
            let (start, stop) = (b * BLOCK, ((b + 1) * BLOCK).min(end));
            if stop - start < BLOCK && !shard_ends {
                break;
            }
            // A copy, not a slice: a slice would keep the whole receive buffer it came in
            // alive, and the cache's byte count would no longer bound its memory.
            let block = Bytes::copy_from_slice(&data[(start - offset) as usize..(stop - offset) as usize]);
            let key = (id, b);
            b += 1;
            let len = block.len();
            match inner.map.insert(key, Entry { data: block, referenced: false }) {
                Some(old) => inner.bytes -= old.data.len(),
                None => inner.ring.push_back(key),
            }
            inner.bytes += len;
        }
        self.evict(&mut inner);
    }

    /// Drop every cached block of shard `id` (found not to be what its writer wrote).
    pub fn forget(&self, id: ShardId) {
        let mut inner = self.inner.lock();
        let keys: Vec<Key> = inner.map.keys().filter(|(shard, _)| *shard == id).copied().collect();
        for key in keys {
            let gone = inner.map.remove(&key).expect("present");
            inner.bytes -= gone.data.len();
        }
    }

    fn evict(&self, inner: &mut Inner) {
        while inner.bytes > self.capacity {
            let Some(key) = inner.ring.pop_front() else { break };
            let Some(entry) = inner.map.get_mut(&key) else { continue };
            if entry.referenced {
                entry.referenced = false;
                inner.ring.push_back(key);
            } else {
                let gone = inner.map.remove(&key).expect("present");
                inner.bytes -= gone.data.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(stripe: u64) -> ShardId {
        ShardId { ino: 7, stripe, index: 1, version: 3 }
    }

    fn bytes(len: usize, seed: u8) -> Bytes {
        Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>())
    }

    #[test]
    fn aligned_span_covers_the_range_in_whole_blocks() {
        assert_eq!(aligned(0, 1), (0, BLOCK));
        assert_eq!(aligned(BLOCK - 1, 2), (0, 2 * BLOCK));
        assert_eq!(aligned(3 * BLOCK + 5, 4096), (3, BLOCK));
        assert_eq!(aligned(2 * BLOCK, BLOCK), (2, BLOCK));
    }

    #[test]
    fn ranges_inside_and_across_cached_blocks_read_back_exactly() {
        let cache = BlockCache::new(1 << 20);
        let shard = bytes(3 * BLOCK as usize + 1000, 9); // three whole blocks and a short one
        cache.insert(id(0), 0, &shard, true);
        for (offset, len) in [(0, 4096), (BLOCK - 10, 20), (100, 3 * BLOCK), (3 * BLOCK, 1000), (5, 1)] {
            let got = cache.get(id(0), offset, len).expect("cached");
            assert_eq!(&got[..], &shard[offset as usize..(offset + len) as usize], "{offset}+{len}");
        }
        // Past the end: short, like the chunkserver's answer.
        let tail = cache.get(id(0), 3 * BLOCK + 900, 4096).unwrap();
        assert_eq!(&tail[..], &shard[3 * BLOCK as usize + 900..]);
        // Another version or shard is another key.
        assert!(cache.get(ShardId { version: 4, ..id(0) }, 0, 10).is_none());
        assert!(cache.get(id(1), 0, 10).is_none());
    }

    #[test]
    fn an_unaligned_read_keeps_only_the_blocks_it_holds_whole() {
        let cache = BlockCache::new(1 << 20);
        let shard = bytes(4 * BLOCK as usize, 4);
        // Bytes 100 .. 3 blocks + 100: block 0 and 3 partly, 1 and 2 whole.
        let (from, to) = (100usize, 3 * BLOCK as usize + 100);
        cache.insert(id(0), from as u64, &Bytes::copy_from_slice(&shard[from..to]), false);
        assert_eq!(cache.bytes(), 2 * BLOCK as usize);
        assert!(cache.get(id(0), 0, 10).is_none() && cache.get(id(0), 3 * BLOCK, 10).is_none());
        assert_eq!(
            &cache.get(id(0), BLOCK + 5, BLOCK).unwrap()[..],
            &shard[BLOCK as usize + 5..2 * BLOCK as usize + 5]
        );
        // Where the shard ends, its short last block is whole.
        let (from, end) = (2 * BLOCK as usize + 7, 3 * BLOCK as usize + 500);
        cache.insert(id(1), from as u64, &Bytes::copy_from_slice(&shard[from..end]), true);
        assert_eq!(&cache.get(id(1), 3 * BLOCK, 4096).unwrap()[..], &shard[3 * BLOCK as usize..end]);
        assert!(cache.get(id(1), 2 * BLOCK, 10).is_none());
    }

    #[test]
    fn a_range_with_one_block_missing_is_a_miss() {
        let cache = BlockCache::new(1 << 20);
        let two = bytes(2 * BLOCK as usize, 1);
        cache.insert(id(0), 4 * BLOCK, &two, false); // blocks 4 and 5
        assert!(cache.get(id(0), 4 * BLOCK, 2 * BLOCK).is_some());
        assert!(cache.get(id(0), 5 * BLOCK, 2 * BLOCK).is_none());
        assert!(cache.get(id(0), 3 * BLOCK + 1, 10).is_none());
    }

    #[test]
    fn the_cache_stays_within_its_capacity_and_keeps_blocks_in_use() {
        let cache = BlockCache::new(4 * BLOCK as usize);
        for s in 0..4 {
            cache.insert(id(s), 0, &bytes(BLOCK as usize, s as u8), false);
        }
        assert_eq!(cache.bytes(), 4 * BLOCK as usize);
        assert!(cache.get(id(0), 0, 1).is_some()); // referenced: survives one sweep
        for s in 4..6 {
            cache.insert(id(s), 0, &bytes(BLOCK as usize, s as u8), false);
        }
        assert_eq!(cache.bytes(), 4 * BLOCK as usize);
        assert!(cache.get(id(0), 0, 1).is_some(), "a block in use was evicted");
        assert!(cache.get(id(1), 0, 1).is_none() && cache.get(id(2), 0, 1).is_none());
        assert!(cache.get(id(5), 0, 1).is_some());
        // Inserting the same block again does not count it twice.
        cache.insert(id(5), 0, &bytes(BLOCK as usize, 5), false);
        assert_eq!(cache.bytes(), 4 * BLOCK as usize);
    }

    #[test]
    fn a_disabled_cache_keeps_nothing() {
        let cache = BlockCache::new(0);
        cache.insert(id(0), 0, &bytes(BLOCK as usize, 0), false);
        assert_eq!(cache.bytes(), 0);
        assert!(cache.get(id(0), 0, 1).is_none());
    }
}
