//! Which roles may call which method: one table for both transports (the wire protocol checks
//! it per request in `server::serve`, gRPC in the [`Authorize`] layer every server installs).
//! A caller's roles come from its certificate ([`crate::tls::Peer`]); on a plaintext server
//! every caller has every role.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;

use crate::tls::{Peer, Role, Roles};

/// The roles that may call `method` (its proto name, e.g. `DrainNode`) of `service` (`meta`,
/// `chunk`). A method missing here is admin-only, so a new method is never open by mistake.
pub fn required(service: &str, method: &str) -> Roles {
    use Role::*;
    let roles: &[Role] = match (service, method) {
        // Raft replication: metaservers among themselves only.
        ("meta", "RaftVote" | "RaftAppend" | "RaftSnapshot") => &[Meta],
        // Group 0's leader handing the group map to the other groups.
        ("meta", "ShareGroupMap" | "ReleaseSlots") => &[Meta],
        // Group 0's leader checking every group's namespace for `cairn fsck`.
        ("meta", "CheckNamespace") => &[Meta, Admin],
        // Changes across metadata groups, between their leaders.
        ("meta", "TxnPrepare" | "TxnDecide" | "TxnOutcome" | "TxnAncestry") => &[Meta],
        // Finding the leader: anyone of the cluster.
        ("meta", "RaftStatus") => &[Meta, Chunk, Client, Admin],
        // Which metadata group owns which part of the namespace: anyone of the cluster.
        ("meta", "GetGroupMap") => &[Meta, Chunk, Client, Admin],
        // Chunkservers' own registration.
        ("meta", "RegisterChunk" | "Heartbeat") => &[Chunk],
        // The nodes' addresses: every process that talks to chunkservers.
        ("meta", "ListNodes") => &[Meta, Chunk, Client, Admin],
        // Damage found by readers and by chunkservers' scrubs.
        ("meta", "ReportDamaged") => &[Chunk, Client, Admin, Meta],
        // The namespace and files, as a mount uses them.
        (
            "meta",
            "Lookup" | "GetAttr" | "SetAttr" | "Create" | "Mkdir" | "Unlink" | "Rmdir" | "Rename" | "Link"
            | "Symlink" | "Readlink" | "ReadDir" | "StatFs" | "GetXattr" | "SetXattr" | "ListXattr"
            | "RemoveXattr" | "Open" | "Release" | "ClientHeartbeat" | "Lock" | "ListStripes" | "Commit"
            | "Sync" | "RegisterClient" | "GetLayout" | "GrantCapability",
        ) => &[Client, Admin],
        // Everything else of the metaserver (nodes, repair, fsck, reconciliation, layouts,
        // cluster status, replica changes, backups): admin only.
        ("meta", _) => &[Admin],
        // Shard data: mounts, and servers repairing or rebuilding. A client-only caller also
        // needs a shard capability for the file (checked by the chunkserver, `capability.rs`).
        ("chunk", "ReadShard") => &[Meta, Chunk, Client, Admin],
        ("chunk", "WriteShard" | "SyncShards" | "DeleteShards") => &[Meta, Client, Admin],
        ("chunk", "Stat") => &[Meta, Chunk, Client, Admin],
        ("chunk", "RebuildShard" | "ListShards" | "CheckShards" | "Promote" | "Pin") => &[Meta, Admin],
        // Another metadata group's leader fencing chunkservers and sending its keys.
        ("chunk", "Fence") => &[Meta],
        _ => &[Admin],
    };
    Roles::of(roles)
}

/// Whether `peer` may call `method` of `service`.
pub fn allowed(service: &str, method: &str, peer: &Peer) -> bool {
    peer.roles.intersects(required(service, method))
}

/// Whether `method` is one of `service`'s (the wire protocol's methods, and the Raft ones that
/// only gRPC carries): a refusal's metric names only these, so callers cannot add labels.
fn known(service: &str, method: &str) -> bool {
    let ids = 1..=u8::MAX.into();
    match service {
        "meta" => {
            [
                "RaftVote",
                "RaftAppend",
                "RaftSnapshot",
                "RaftStatus",
                "RaftAddMember",
                "RaftRemoveMember",
                "RaftBackup",
                "GetGroupMap",
                "AddGroup",
                "RemoveGroup",
                "MoveSlots",
                "ShareGroupMap",
                "ReleaseSlots",
                "TxnPrepare",
                "TxnDecide",
                "TxnOutcome",
                "TxnAncestry",
            ]
            .contains(&method)
                || ids.filter_map(crate::wire::meta::method_name).any(|m| m == method)
        }
        "chunk" => method == "Fence" || ids.filter_map(crate::wire::chunk::method_name).any(|m| m == method),
        _ => false,
    }
}

/// The error a refused call gets, the same on both transports.
pub fn denied(service: &str, method: &str, peer: &Peer) -> cairn_common::CairnError {
    crate::metrics::record_denied(service, if known(service, method) { method } else { "unknown" });
    cairn_common::CairnError::new(
        cairn_common::ErrorKind::PermissionDenied,
        format!(
            "{service}.{method} is for {} certificates; this caller's ({:?}) has the roles {}",
            required(service, method),
            peer.name,
            peer.roles
        ),
    )
}

/// The service label and method name of a gRPC path (`/cairn.v1.Meta/DrainNode`).
fn split_path(path: &str) -> Option<(&'static str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let service = match service {
        "cairn.v1.Meta" => "meta",
        "cairn.v1.Chunk" => "chunk",
        _ => return None,
    };
    Some((service, method))
}

/// A tower layer checking every gRPC call against [`required`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthorizeLayer;

impl<S> tower_layer::Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;
    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize { inner }
    }
}

/// See [`AuthorizeLayer`].
#[derive(Clone, Debug)]
pub struct Authorize<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for Authorize<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // A connection that did not come through `server::serve` (a test's bare listener) has no
        // peer: it is trusted only by a plaintext process.
        let peer = match req.extensions().get::<Peer>() {
            Some(p) => p.clone(),
            None if crate::tls::identity().is_none() => Peer::plaintext(None),
            None => Peer { addr: None, roles: Roles::NONE, name: String::new() },
        };
        let refusal = match split_path(req.uri().path()) {
            Some((service, method)) if !allowed(service, method, &peer) => {
                Some(denied(service, method, &peer))
            }
            Some(_) => None,
            None if peer.roles.contains(Role::Admin) || peer.roles == Roles::ALL => None,
            None => Some(cairn_common::CairnError::new(
                cairn_common::ErrorKind::PermissionDenied,
                format!("{} is not a Cairn method", req.uri().path()),
            )),
        };
        match refusal {
            Some(e) => {
                let status = tonic::Status::from(e);
                Box::pin(async move { Ok(status.into_http()) })
            }
            None => Box::pin(self.inner.call(req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(roles: &[Role]) -> Peer {
        Peer { addr: None, roles: Roles::of(roles), name: "t".into() }
    }

    #[test]
    fn each_role_gets_what_its_job_needs_and_no_more() {
        let (client, chunk, meta, admin) =
            (peer(&[Role::Client]), peer(&[Role::Chunk]), peer(&[Role::Meta]), peer(&[Role::Admin]));
        // Every wire method of the metaserver has an entry; a mount's own are open to clients.
        for m in ["Lookup", "Create", "Open", "Commit", "ListStripes", "ReportDamaged", "ListNodes", "Sync"] {
            assert!(allowed("meta", m, &client), "{m}");
        }
        for m in ["RegisterChunk", "Heartbeat"] {
            assert!(!allowed("meta", m, &client), "{m}");
            assert!(!allowed("meta", m, &admin), "{m}");
            assert!(allowed("meta", m, &chunk), "{m}");
        }
        for m in [
            "DrainNode",
            "RemoveNode",
            "ActivateNode",
            "SetLayout",
            "RepairNow",
            "Reconcile",
            "ClusterStatus",
            "AddGroup",
            "RemoveGroup",
            "MoveSlots",
        ] {
            assert!(!allowed("meta", m, &client), "{m}");
            assert!(!allowed("meta", m, &chunk), "{m}");
            assert!(allowed("meta", m, &admin), "{m}");
        }
        for role in [&client, &chunk, &meta, &admin] {
            assert!(allowed("meta", "GetGroupMap", role), "every process of the cluster routes by the map");
        }
        assert!(allowed("meta", "ShareGroupMap", &meta));
        assert!(allowed("meta", "ReleaseSlots", &meta));
        for role in [&client, &chunk, &admin] {
            assert!(!allowed("meta", "ShareGroupMap", role), "only metaservers hand the map on");
            assert!(!allowed("meta", "ReleaseSlots", role), "only group 0's leader asks for slots");
            for m in ["TxnPrepare", "TxnDecide", "TxnOutcome", "TxnAncestry"] {
                assert!(!allowed("meta", m, role), "only metadata groups' leaders take part: {m}");
                assert!(allowed("meta", m, &meta), "{m}");
            }
        }
        assert!(allowed("meta", "RaftAppend", &meta));
        assert!(!allowed("meta", "RaftAppend", &admin));
        assert!(allowed("meta", "RaftAddMember", &admin));
        assert!(!allowed("meta", "RaftAddMember", &meta));
        assert!(allowed("chunk", "Fence", &meta));
        for role in [&client, &chunk, &admin] {
            assert!(!allowed("chunk", "Fence", role), "only metaservers fence chunkservers");
        }
        assert!(!allowed("chunk", "DeleteShards", &chunk));
        assert!(allowed("chunk", "DeleteShards", &meta));
        assert!(!allowed("chunk", "ListShards", &client));
        assert!(!allowed("meta", "SomethingNew", &client), "unlisted methods are admin-only");
        assert!(allowed("meta", "SomethingNew", &admin));
        assert!(allowed("meta", "DrainNode", &Peer::plaintext(None)));
    }

    #[test]
    fn every_wire_method_is_in_the_table_on_purpose() {
        // The wire protocol's methods, by name: none may fall to the admin-only default
        // unless it is an admin method.
        let admin_only = [
            "ClusterStatus",
            "RepairNow",
            "Reconcile",
            "DrainNode",
            "ActivateNode",
            "RemoveNode",
            "SetLayout",
        ];
        let names: Vec<&str> = (1..=u8::MAX.into()).filter_map(crate::wire::meta::method_name).collect();
        assert!(names.len() >= 38, "{names:?}");
        for name in names {
            let roles = required("meta", name);
            assert_eq!(roles == Roles::of(&[Role::Admin]), admin_only.contains(&name), "{name}");
        }
    }

    #[test]
    fn refusals_are_counted_under_known_method_names_only() {
        assert!(known("meta", "DrainNode"));
        assert!(known("meta", "RaftAppend"));
        assert!(known("chunk", "ReadShard"));
        assert!(!known("meta", "ReadShard"));
        assert!(!known("meta", "Raft-anything"));
        assert!(!known("chunk", "x".repeat(100).as_str()));
    }

    #[test]
    fn grpc_paths_name_the_service_and_method() {
        assert_eq!(split_path("/cairn.v1.Meta/DrainNode"), Some(("meta", "DrainNode")));
        assert_eq!(split_path("/cairn.v1.Chunk/ReadShard"), Some(("chunk", "ReadShard")));
        assert_eq!(split_path("/grpc.health.v1.Health/Check"), None);
        assert_eq!(split_path("nonsense"), None);
    }
}
