//! Changes done once, however often a client sends them (`Once` in `cairn.proto`).
//!
//! A client that loses its metaserver (a leader killed, a connection cut, no answer within its
//! try timeout) sends the change again to the next one with the same (client, sequence). The
//! first try that is applied writes a record `client ‖ sequence → when` in [`Cf::Once`] in the
//! same atomic batch as its change; a later try finds the record — before it runs, or after it
//! failed because the first try, still in flight, was applied under the locks it waited for —
//! and the service answers from the state the first try left instead of doing the change
//! again (`MetaService::once_change`).
//!
//! How the record reaches the batch: the service runs the namespace call inside [`scope`],
//! which puts the (client, sequence) in a thread-local for the duration of the call; the
//! transaction's commit takes it and adds the record. A namespace operation runs on one
//! thread from its first read to its commit, and commits once.
//!
//! Records are kept for [`KEEP`] (a client gives up on a change long before: see
//! `cairn_net::failover`), then deleted by [`Namespace::forget_old_once`], which the
//! leader's session reaper runs every minute.

use std::cell::Cell;
use std::time::Duration;

use cairn_common::{CairnError, Result};

use super::Namespace;
use crate::store::{Batch, Cf};

/// How long a record stays.
pub const KEEP: Duration = Duration::from_secs(600);
const FORMAT: u8 = 1;

thread_local! {
    static PENDING: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Run `f` with `(client, seq)` to be recorded by the one commit it makes (none: nothing).
/// When `f` returns or unwinds the mark is put back as it was before — cleared at the top, so
/// it never reaches the commit of another operation on this thread; an enclosing change's
/// (a step inside a change across groups that must not record it yet) kept for its commit.
pub fn scope<T>(once: Option<(u64, u64)>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<(u64, u64)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PENDING.with(|p| p.set(self.0));
        }
    }
    let before = PENDING.with(|p| p.replace(once.filter(|(client, _)| *client != 0)));
    let _restore = Restore(before);
    f()
}

/// The (client, sequence) the change running on this thread is to record, left in place.
pub(super) fn current() -> Option<(u64, u64)> {
    PENDING.with(|p| p.get())
}

pub(super) fn key(client: u64, seq: u64) -> Vec<u8> {
    let mut k = client.to_be_bytes().to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Add the pending record, if any, to `batch` (called by the commit).
pub(super) fn record(batch: &mut Batch) {
    if let Some((client, seq)) = PENDING.with(|p| p.take()) {
        let mut value = vec![FORMAT];
        value.extend_from_slice(&cairn_common::time::now().sec.to_be_bytes());
        batch.put(Cf::Once, key(client, seq), value);
    }
}

fn recorded_at(value: &[u8]) -> Result<i64> {
    match value {
        [FORMAT, rest @ ..] if rest.len() == 8 => Ok(i64::from_be_bytes(rest.try_into().expect("8 bytes"))),
        _ => {
            Err(CairnError::corrupt(format!("a change record of {} bytes in an unknown format", value.len())))
        }
    }
}

impl Namespace {
    /// Whether the change (client, seq) was done already.
    pub fn once_done(&self, client: u64, seq: u64) -> Result<bool> {
        if client == 0 {
            return Ok(false);
        }
        Ok(self.store.get(Cf::Once, &key(client, seq))?.is_some())
    }

    /// Delete records older than `keep`; how many were deleted.
    pub fn forget_old_once(&self, keep: Duration) -> Result<usize> {
        let oldest = cairn_common::time::now().sec - keep.as_secs() as i64;
        let mut deleted = 0;
        let mut from = Vec::new();
        loop {
            let page = self.store.scan(Cf::Once, &from, &[], 1000)?;
            let Some((last, _)) = page.last() else { return Ok(deleted) };
            from = last.clone();
            from.push(0);
            let mut batch = Batch::new();
            for (k, v) in &page {
                if recorded_at(v).map_or(true, |at| at < oldest) {
                    batch.delete(Cf::Once, k.clone());
                }
            }
            deleted += batch.len();
            if !batch.is_empty() {
                self.store.write(batch)?;
            }
            if page.len() < 1000 {
                return Ok(deleted);
            }
        }
    }
}
