//! Cairn's wire protocol: the generated protobuf messages and tonic clients/servers for the
//! `Meta` and `Chunk` services. Nothing but generated code lives here; conversions to domain
//! types are in `cairn-common`.
#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("cairn.v1");
}

pub use v1::*;
