//! How the service builds its answers: attributes (here or, for an inode another metadata
//! group holds, its number only), a directory as a change left it, removals, and the small
//! conversions every handler shares.

use cairn_common::{CairnError, Result};
use cairn_proto::{Attr, AttrReply, Once, RemoveReply, RemoveRequest};
use tonic::{Request, Response, Status};

use super::MetaService;
use crate::namespace::Namespace;

impl MetaService {
    /// Unlink (or, with `dir`, rmdir) and answer with the parent as the removal left it.
    pub(super) async fn remove(&self, r: RemoveRequest, dir: bool) -> Result<Response<RemoveReply>, Status> {
        let once = once_of(&r.once);
        let parent = check_ino(r.parent)?;
        let after = self
            .once_change(
                once,
                move |ns| {
                    if dir {
                        ns.rmdir(parent, &r.name)?;
                    } else {
                        ns.unlink(parent, &r.name)?;
                    }
                    Ok(dir_after(ns, parent))
                },
                |ns| Ok(dir_after(ns, parent)),
            )
            .await?;
        Ok(Response::new(RemoveReply { parent: after }))
    }
}

pub(super) fn once_of(once: &Option<Once>) -> Option<(u64, u64)> {
    once.as_ref().map(|o| (o.client, o.seq))
}

pub(super) fn check_ino(ino: u64) -> Result<u64> {
    if ino == 0 {
        return Err(CairnError::invalid("inode 0"));
    }
    Ok(ino)
}

/// The name on the caller's TLS certificate (empty on a plaintext server), which binds a
/// chunkserver's node id to the certificate it registered with.
pub(super) fn cert_name<T>(req: &Request<T>) -> String {
    req.extensions().get::<cairn_net::tls::Peer>().map(|p| p.name.clone()).unwrap_or_default()
}

pub(super) fn attr_reply(inode: crate::schema::Inode) -> AttrReply {
    AttrReply { attr: Some(inode.to_attr()), parent: None, elsewhere: false }
}

/// What an entry names: its attributes, or the number and type of an inode another group
/// holds (`AttrReply.elsewhere`), which the caller asks that group about.
pub(super) fn looked_reply(looked: crate::namespace::Looked) -> AttrReply {
    match looked {
        crate::namespace::Looked::Here(inode) => attr_reply(inode),
        crate::namespace::Looked::Elsewhere { ino, kind } => AttrReply {
            attr: Some(Attr { ino, mode: kind, ..Default::default() }),
            parent: None,
            elsewhere: true,
        },
    }
}

/// A directory's attributes right after a change in it, for the reply; `None` if it is gone
/// again already (removed by another request since).
pub(super) fn dir_after(ns: &Namespace, ino: u64) -> Option<Attr> {
    ns.inode(ino).ok().map(|i| i.to_attr())
}
