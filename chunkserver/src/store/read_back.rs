//! Whole shard files just read from HDD with O_DIRECT, kept for the mover to promote from.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use cairn_common::ShardId;

/// Most bytes of whole shard files kept after an O_DIRECT read from HDD, for the mover to
/// promote from (see [`ReadBack`]).
const READ_BACK_BYTES: usize = 64 << 20;

/// Whole shard files just read, verified, with O_DIRECT from an HDD directory, kept for the
/// mover: promoting one of them copies these bytes instead of reading the HDD a second time
/// (through the page cache that second read would be free; with O_DIRECT it is not). Bounded
/// by [`READ_BACK_BYTES`], oldest out first; an entry is used only if the shard's file length
/// still matches, and the copy is verified like any other.
#[derive(Default)]
pub(crate) struct ReadBack {
    entries: HashMap<ShardId, Bytes>,
    order: VecDeque<ShardId>,
    bytes: usize,
}

impl ReadBack {
    pub(crate) fn put(&mut self, id: ShardId, file: Bytes) {
        if file.len() > READ_BACK_BYTES {
            return;
        }
        if let Some(old) = self.entries.insert(id, file.clone()) {
            self.bytes -= old.len();
        } else {
            self.order.push_back(id);
        }
        self.bytes += file.len();
        while self.bytes > READ_BACK_BYTES {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(gone) = self.entries.remove(&oldest) {
                self.bytes -= gone.len();
            }
        }
    }

    /// Drop what is kept of `id` (deleted).
    pub(crate) fn forget(&mut self, id: &ShardId) {
        if let Some(file) = self.entries.remove(id) {
            self.bytes -= file.len();
            self.order.retain(|k| k != id);
        }
    }

    /// The kept bytes of `id`'s file if they are `file_len` long; the entry is used up.
    pub(crate) fn take(&mut self, id: &ShardId, file_len: u64) -> Option<Bytes> {
        let file = self.entries.get(id)?.clone();
        self.forget(id);
        (file.len() as u64 == file_len).then_some(file)
    }
}
