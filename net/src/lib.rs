//! How Cairn's processes talk to each other, over the vocabulary of `cairn-common`: the wire
//! protocol (framed requests over TCP, client pool and server), gRPC channels and the channel
//! cache, TLS identities and roles with the one table of which role may call which method,
//! shard capabilities, following the metaserver leader, the metrics exporter and the layer that
//! counts every request, and the file-descriptor limit a server needs for its connections.

pub mod auth;
pub mod capability;
pub mod channels;
pub mod connect;
pub mod failover;
pub mod metrics;
pub mod rlimit;
pub mod server;
pub mod tls;
pub mod wire;
