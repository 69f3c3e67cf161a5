//! The error taxonomy. Each crate has its own error detail; across crate and process
//! boundaries an error is a [`CairnError`]: an [`ErrorKind`] plus a message, and in this
//! process the error it came from (an OS error, a gRPC status), as its `source()`. Exactly one
//! `match` maps a kind to an errno (for FUSE) and one maps it to a gRPC code; the kind itself
//! travels in the `cairn-kind` metadata of a `tonic::Status`, so a client sees the same kind the
//! server raised.

use std::fmt;
use std::sync::Arc;

pub type Result<T, E = CairnError> = std::result::Result<T, E>;

const KIND_HEADER: &str = "cairn-kind";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    InvalidArgument,
    NameTooLong,
    NoSpace,
    PermissionDenied,
    NotPermitted,
    NoData,
    Range,
    TooBig,
    CrossDevice,
    NotSupported,
    /// A lock is held by someone else (EAGAIN).
    WouldBlock,
    /// A waiting operation was abandoned (EINTR).
    Interrupted,
    /// A server or enough shards could not be reached.
    Unavailable,
    /// Stored data failed its checksum or could not be decoded.
    Corrupt,
    Io,
    Internal,
    /// Fewer chunkservers answer than a stripe needs (`k+1` to place or write one, `k` to
    /// read one): worth waiting for (EIO once the wait is over).
    TooFewNodes,
    /// This metaserver is not its group's leader (or has none yet): the client asks another
    /// one. Nothing of the request was done.
    NotLeader,
    /// The namespace may not be changed by this caller (EROFS): a read-only client by the
    /// metaserver's access rules.
    ReadOnly,
    /// A chunkserver refused the shard capability a request carried (none, expired, signed
    /// with a key it does not or no longer trusts, for another inode, operation or
    /// certificate): a client asks the metaserver for a new one and tries once more. EACCES
    /// when that fails too. Nothing of the request was done.
    CapabilityRefused,
    /// The request concerns namespace slots another metadata group owns (`docs/ARCHITECTURE.md`,
    /// "Several metadata groups"): the caller refreshes its group map from group 0 and asks the
    /// slot's group. Nothing of the request was done.
    WrongGroup,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 26] = [
        ErrorKind::NotFound,
        ErrorKind::Exists,
        ErrorKind::NotDir,
        ErrorKind::IsDir,
        ErrorKind::NotEmpty,
        ErrorKind::InvalidArgument,
        ErrorKind::NameTooLong,
        ErrorKind::NoSpace,
        ErrorKind::PermissionDenied,
        ErrorKind::NotPermitted,
        ErrorKind::NoData,
        ErrorKind::Range,
        ErrorKind::TooBig,
        ErrorKind::CrossDevice,
        ErrorKind::NotSupported,
        ErrorKind::WouldBlock,
        ErrorKind::Interrupted,
        ErrorKind::Unavailable,
        ErrorKind::Corrupt,
        ErrorKind::Io,
        ErrorKind::Internal,
        // Later additions go last: a kind's wire number is its place here.
        ErrorKind::TooFewNodes,
        ErrorKind::NotLeader,
        ErrorKind::ReadOnly,
        ErrorKind::CapabilityRefused,
        ErrorKind::WrongGroup,
    ];

    /// The errno a FUSE reply carries for this kind.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Exists => libc::EEXIST,
            ErrorKind::NotDir => libc::ENOTDIR,
            ErrorKind::IsDir => libc::EISDIR,
            ErrorKind::NotEmpty => libc::ENOTEMPTY,
            ErrorKind::InvalidArgument => libc::EINVAL,
            ErrorKind::NameTooLong => libc::ENAMETOOLONG,
            ErrorKind::NoSpace => libc::ENOSPC,
            ErrorKind::PermissionDenied | ErrorKind::CapabilityRefused => libc::EACCES,
            ErrorKind::NotPermitted => libc::EPERM,
            ErrorKind::NoData => libc::ENODATA,
            ErrorKind::Range => libc::ERANGE,
            ErrorKind::TooBig => libc::E2BIG,
            ErrorKind::CrossDevice => libc::EXDEV,
            ErrorKind::NotSupported => libc::EOPNOTSUPP,
            ErrorKind::WouldBlock => libc::EAGAIN,
            ErrorKind::Interrupted => libc::EINTR,
            ErrorKind::ReadOnly => libc::EROFS,
            ErrorKind::Unavailable
            | ErrorKind::Corrupt
            | ErrorKind::Io
            | ErrorKind::Internal
            | ErrorKind::TooFewNodes
            | ErrorKind::NotLeader
            | ErrorKind::WrongGroup => libc::EIO,
        }
    }

    /// The gRPC code a server answers with for this kind.
    pub fn grpc_code(self) -> tonic::Code {
        use tonic::Code;
        match self {
            ErrorKind::NotFound | ErrorKind::NoData => Code::NotFound,
            ErrorKind::Exists => Code::AlreadyExists,
            ErrorKind::NotDir
            | ErrorKind::IsDir
            | ErrorKind::NotEmpty
            | ErrorKind::CrossDevice
            | ErrorKind::WrongGroup => Code::FailedPrecondition,
            ErrorKind::InvalidArgument | ErrorKind::NameTooLong | ErrorKind::Range | ErrorKind::TooBig => {
                Code::InvalidArgument
            }
            ErrorKind::NoSpace => Code::ResourceExhausted,
            ErrorKind::PermissionDenied
            | ErrorKind::NotPermitted
            | ErrorKind::ReadOnly
            | ErrorKind::CapabilityRefused => Code::PermissionDenied,
            ErrorKind::NotSupported => Code::Unimplemented,
            ErrorKind::WouldBlock => Code::Aborted,
            ErrorKind::Interrupted => Code::Cancelled,
            ErrorKind::Unavailable | ErrorKind::TooFewNodes | ErrorKind::NotLeader => Code::Unavailable,
            ErrorKind::Corrupt => Code::DataLoss,
            ErrorKind::Io | ErrorKind::Internal => Code::Internal,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Exists => "exists",
            ErrorKind::NotDir => "not_dir",
            ErrorKind::IsDir => "is_dir",
            ErrorKind::NotEmpty => "not_empty",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NameTooLong => "name_too_long",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::NotPermitted => "not_permitted",
            ErrorKind::NoData => "no_data",
            ErrorKind::Range => "range",
            ErrorKind::TooBig => "too_big",
            ErrorKind::CrossDevice => "cross_device",
            ErrorKind::NotSupported => "not_supported",
            ErrorKind::WouldBlock => "would_block",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Io => "io",
            ErrorKind::Internal => "internal",
            ErrorKind::TooFewNodes => "too_few_nodes",
            ErrorKind::NotLeader => "not_leader",
            ErrorKind::ReadOnly => "read_only",
            ErrorKind::CapabilityRefused => "capability_refused",
            ErrorKind::WrongGroup => "wrong_group",
        }
    }

    /// The kind's number on the wire protocol (its place in [`ErrorKind::ALL`]).
    pub fn index(self) -> u8 {
        ErrorKind::ALL.iter().position(|k| *k == self).unwrap_or(0) as u8
    }

    pub fn from_index(index: u8) -> Option<ErrorKind> {
        ErrorKind::ALL.get(index as usize).copied()
    }

    fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Kind of a status that carries no `cairn-kind` (from a proxy, or tonic itself).
    fn from_code(code: tonic::Code) -> ErrorKind {
        use tonic::Code;
        match code {
            Code::NotFound => ErrorKind::NotFound,
            Code::AlreadyExists => ErrorKind::Exists,
            Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidArgument,
            Code::ResourceExhausted => ErrorKind::NoSpace,
            Code::PermissionDenied | Code::Unauthenticated => ErrorKind::PermissionDenied,
            Code::Unimplemented => ErrorKind::NotSupported,
            Code::DataLoss => ErrorKind::Corrupt,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Io,
        }
    }
}

/// An error with a kind that survives the trip over gRPC. Two errors are equal when kind and
/// message are; the source (which does not travel) is not compared.
#[derive(Clone, Debug)]
pub struct CairnError {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for CairnError {
    fn eq(&self, other: &CairnError) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for CairnError {}

impl CairnError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> CairnError {
        CairnError { kind, message: message.into(), source: None }
    }

    /// The same error, caused by `source` (kept for logs and callers in this process).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> CairnError {
        self.source = Some(Arc::new(source));
        self
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, m)
    }

    /// A `WrongGroup` answer from a metaserver whose group map has `version`: its message ends
    /// with the version, which [`CairnError::map_version`] reads back, so a caller knows
    /// whether its own map is older (then it refreshes it from group 0) or not.
    pub fn wrong_group(m: impl Into<String>, version: u64) -> Self {
        Self::new(ErrorKind::WrongGroup, format!("{} (group map version {version})", m.into()))
    }

    /// The group map version a `WrongGroup` answer was given under (see
    /// [`CairnError::wrong_group`]); `None` for other errors and for a message without one.
    pub fn map_version(&self) -> Option<u64> {
        if self.kind != ErrorKind::WrongGroup {
            return None;
        }
        let (_, tail) = self.message.rsplit_once("(group map version ")?;
        tail.strip_suffix(')')?.parse().ok()
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, m)
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, m)
    }
    pub fn corrupt(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, m)
    }
    pub fn io(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, m)
    }

    /// Classify an OS error (ENOSPC stays NoSpace, so a full disk reaches the application).
    pub fn from_io(context: &str, e: &std::io::Error) -> CairnError {
        let kind = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorKind::NoSpace,
            Some(libc::ENOENT) => ErrorKind::NotFound,
            Some(libc::EACCES) => ErrorKind::PermissionDenied,
            _ => match e.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                _ => ErrorKind::Io,
            },
        };
        // `io::Error` is not `Clone`: the source is an equal one (same OS error, or same kind
        // and text).
        let source = match e.raw_os_error() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(e.kind(), e.to_string()),
        };
        CairnError::new(kind, format!("{context}: {e}")).with_source(source)
    }
}

impl fmt::Display for CairnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.name())
    }
}

impl std::error::Error for CairnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<CairnError> for tonic::Status {
    fn from(e: CairnError) -> tonic::Status {
        let mut status = tonic::Status::new(e.kind.grpc_code(), e.message);
        status.metadata_mut().insert(KIND_HEADER, tonic::metadata::MetadataValue::from_static(e.kind.name()));
        status
    }
}

impl From<tonic::Status> for CairnError {
    fn from(s: tonic::Status) -> CairnError {
        let kind = s
            .metadata()
            .get(KIND_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorKind::from_name)
            .unwrap_or_else(|| ErrorKind::from_code(s.code()));
        CairnError::new(kind, s.message().to_string()).with_source(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_group_answer_carries_its_map_version_over_grpc() {
        let e = CairnError::wrong_group("inode 5 is in slot 1 (of group 2)", 17);
        assert_eq!(e.map_version(), Some(17));
        let back = CairnError::from(tonic::Status::from(e.clone()));
        assert_eq!((back.kind(), back.map_version()), (ErrorKind::WrongGroup, Some(17)));
        assert_eq!(CairnError::new(ErrorKind::WrongGroup, "no version").map_version(), None);
        assert_eq!(CairnError::not_found("(group map version 3)").map_version(), None);
    }

    #[test]
    fn kinds_survive_grpc() {
        for kind in ErrorKind::ALL {
            let status: tonic::Status = CairnError::new(kind, "boom").into();
            let back: CairnError = status.into();
            assert_eq!(back.kind(), kind);
            assert_eq!(back.message(), "boom");
        }
    }

    #[test]
    fn kinds_survive_the_wire_index() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_index(kind.index()), Some(kind));
        }
        assert_eq!(ErrorKind::from_index(ErrorKind::ALL.len() as u8), None);
    }

    #[test]
    fn plain_status_maps_by_code() {
        let e: CairnError = tonic::Status::unavailable("connection refused").into();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.errno(), libc::EIO);
    }

    #[test]
    fn enospc_is_no_space() {
        let e = CairnError::from_io("write", &std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(e.errno(), libc::ENOSPC);
    }

    #[test]
    fn the_cause_stays_the_source() {
        use std::error::Error;
        let e = CairnError::from_io("write shard", &std::io::Error::from_raw_os_error(libc::EIO));
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("an io::Error source");
        assert_eq!(io.raw_os_error(), Some(libc::EIO));
        let status = tonic::Status::unavailable("connection refused");
        let e = CairnError::from(status);
        let status = e.source().and_then(|s| s.downcast_ref::<tonic::Status>()).expect("a Status source");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        // Equality is kind and message: a retried error equals the first whatever its cause.
        assert_eq!(e, CairnError::unavailable("connection refused"));
        assert!(CairnError::unavailable("x").source().is_none());
    }
}
