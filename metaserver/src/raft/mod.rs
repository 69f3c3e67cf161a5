//! Replication of the metaserver's store with Raft (openraft 0.9, pinned): the storage half.
//!
//! What a log entry carries is the effect of one namespace operation, a [`Batch`] of puts and
//! deletes the leader produced under its locks ([`Command`]); applying it copies those bytes
//! into the state machine's RocksDB together with the applied log id, so applying never reads a
//! clock or a random source (`docs/ARCHITECTURE.md`, "Metadata replication").
//!
//! - [`log::LogStore`]: the Raft log, vote and committed index in segment files of their own
//!   ([`wal`], `{dir}/wal`), every append synced before openraft is told it is flushed.
//! - [`state::StateMachine`]: today's column families plus [`Cf::Raft`] in `{dir}/sm`;
//!   snapshots are RocksDB checkpoints packed into one file (`{dir}/snapshots`), installed by
//!   swapping directories.
//! - [`codec`]: the entry format on disk.
//!
//! Only this module imports `openraft`.

// openraft's `StorageError` (over 200 bytes) is what its storage traits return; the helpers
// here return it too rather than convert twice.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod log;
pub mod network;
pub mod node;
mod overlay;
mod proposals;
pub mod state;
#[cfg(test)]
mod tests;
pub mod wal;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::store::{Batch, Op};

openraft::declare_raft_types!(
    /// Cairn's Raft types: node ids are `u64`, a node is its address.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Membership = openraft::Membership<NodeId, openraft::BasicNode>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type StorageError = openraft::StorageError<NodeId>;

/// The effect of one namespace operation (or several, applied together): puts and deletes in
/// order, never touching [`Cf::Raft`](crate::store::Cf::Raft).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub ops: Vec<Op>,
}

impl From<Batch> for Command {
    fn from(batch: Batch) -> Command {
        Command { ops: batch.ops().to_vec() }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ops", self.ops.len())
    }
}

/// What applying an entry answers: nothing beyond "applied" (the leader's namespace already
/// knows the operation's result).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied;

/// A storage error for openraft from any displayable cause.
pub(crate) fn io_error(
    make: fn(openraft::AnyError) -> openraft::StorageIOError<NodeId>,
    cause: impl fmt::Display,
) -> StorageError {
    make(openraft::AnyError::error(cause.to_string())).into()
}
