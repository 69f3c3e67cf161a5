//! The `Meta` gRPC service: converts requests to namespace and registry calls and results back
//! to proto. Point reads and (unless every write is fsynced) namespace changes run inline on the
//! request's task, everything else on tokio's blocking pool; every error leaves as a `tonic::Status`
//! built from a `CairnError`, so clients see the exact kind. Inputs are validated here or in the
//! namespace before use; a panic in a handler is caught by the blocking pool and answered as an
//! internal error instead of taking the server down.

use std::sync::Arc;

use parking_lot::RwLock;

use cairn_common::{CairnError, Result};
use cairn_net::capability::{self, Signer, READ, WRITE};
use cairn_net::channels::Channels;
use cairn_proto::meta_server::Meta;
use cairn_proto::*;
use tonic::{Request, Response, Status};

use crate::access::{Access, Rule, Squash};
use crate::cluster::Cluster;
use crate::namespace::{file_info, Namespace, NewEntry, Renamed};
use crate::permissions::{open_want, MAY_EXEC, MAY_READ};
use crate::raft::node::RaftNode;
use crate::repair::Repair;
use crate::schema::{NODE_ACTIVE, NODE_DRAINING};
use crate::sessions::{Lock, F_UNLCK};

mod access_checks;
mod across;
mod backup;
mod cluster;
mod fsck;
mod groups;
mod replies;
mod serving;
mod txn;

pub(crate) use cluster::nodes_with_progress;
use cluster::{check_cluster, remove_node, status_reply};
use replies::{attr_reply, cert_name, check_ino, dir_after, looked_reply, once_of};

/// Most files one Release request may name.
pub const MAX_RELEASES: usize = 10_000;

pub struct MetaService {
    /// What answers requests: always on a lone metaserver; on a replica, only while it leads
    /// (set and cleared by the leadership task, `lib.rs` `lead`).
    serving: RwLock<Option<Arc<Serving>>>,
    /// This metaserver's Raft replica, when the namespace is replicated.
    raft: std::sync::OnceLock<Arc<RaftNode>>,
    /// A replica (its Raft node may still be starting).
    replicated: bool,
    /// Signs shard capabilities for clients; its keys go to chunkservers.
    caps: Signer,
    /// Connections to chunkservers, to confirm the damage clients report.
    channels: Channels,
    /// What each client certificate may do to the namespace (`access.rs`).
    access: Arc<Access>,
    /// The access rules' generation the capabilities signed since were granted under.
    caps_generation: std::sync::atomic::AtomicU64,
    /// On a leader of a group other than 0: the group map its group holds, as group 0's leader
    /// shared it (`ShareGroupMap`).
    held_map: RwLock<Option<Arc<crate::groups::Groups>>>,
    /// Woken by every change of group 0's map, so its leader shares it at once.
    groups_changed: tokio::sync::Notify,
}

/// Most shards one damage report from a client may name (a reader reports what one read
/// found; chunkservers' scrubs send more).
pub const MAX_CLIENT_DAMAGE_IDS: usize = 256;

/// The namespace, the cluster state and the repair that run while this metaserver serves.
pub struct Serving {
    pub ns: Arc<Namespace>,
    pub cluster: Arc<Cluster>,
    pub repair: Option<Arc<Repair>>,
}

#[tonic::async_trait]
impl Meta for MetaService {
    async fn lookup(&self, req: Request<LookupRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let r = req.into_inner();
        let looked = self.read(|ns| {
            let parent = check_ino(r.parent)?;
            if let Some(who) = &who {
                who.check(&ns.getattr(parent)?, MAY_EXEC, "lookup")?;
            }
            ns.lookup_entry(parent, &r.name)
        })?;
        Ok(Response::new(looked_reply(looked)))
    }

    async fn get_attr(&self, req: Request<InoRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let ino = req.into_inner().ino;
        let inode = self.read(|ns| ns.getattr(check_ino(ino)?))?;
        Ok(Response::new(attr_reply(inode)))
    }

    async fn set_attr(&self, req: Request<SetAttrRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let rule = self.may_change(&req, "setattr")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let mut r = req.into_inner();
        let ino = check_ino(r.ino)?;
        if let Some(rule) = rule {
            let read = self.guard_inode(&rule, ino, r.size.is_some()).await?;
            let inode = || match &read {
                Some(inode) => Ok::<_, Status>(inode.clone()),
                None => self.read(|ns| ns.getattr(ino)),
            };
            // Giving a file away takes privilege (CAP_CHOWN) that a squashed root does not
            // have, as an NFS server answers a squashed root's chown; a group change by the
            // owner stays allowed.
            if let Some(uid) = r.uid.filter(|_| rule.squash != Squash::None) {
                let owner = inode()?.uid;
                if rule.uid(uid) != owner {
                    return Err(CairnError::new(
                        cairn_common::ErrorKind::NotPermitted,
                        format!(
                            "chown of inode {ino} to uid {uid}: a client squashed by the metaserver's \
                             access rules gives no file away"
                        ),
                    )
                    .into());
                }
            }
            r.uid = r.uid.map(|uid| rule.claim_uid(uid)).transpose()?;
            r.gid = r.gid.map(|gid| rule.claim_gid(gid)).transpose()?;
            if let Some(mode) = r.mode {
                // Whether a directory's setgid may stay (looked up only where it matters). The
                // kernel sends the file type too: only the permission bits change.
                let dir = mode & 0o2000 != 0 && !rule.setuid && inode()?.is_dir();
                r.mode = Some(rule.mode(mode & 0o7777, dir)?);
            }
        }
        if let Some(who) = who {
            self.read(|ns| who.check_setattr(&ns.getattr(ino)?, &mut r))?;
        }
        let once = once_of(&r.once);
        let inode = self.once_change(once, move |ns| ns.setattr(&r), |ns| ns.getattr(ino)).await?;
        Ok(Response::new(attr_reply(inode)))
    }

    async fn create(&self, req: Request<CreateRequest>) -> Result<Response<CreateReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        let holder = cert_name(&req);
        let rule = self.may_change(&req, "create")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let mut r = req.into_inner();
        if let Some(rule) = rule {
            (r.mode, r.uid, r.gid) =
                (rule.mode(r.mode, false)?, rule.claim_uid(r.uid)?, rule.claim_gid(r.gid)?);
        }
        if let Some(who) = &who {
            self.check_new_entry(who, check_ino(r.parent)?, &r.name, Some(r.uid), "create")?;
        }
        // A checked caller's create that finds the name taken neither opens the file nor gets
        // a capability: the client opens it next, and that open is checked.
        let checked = who.is_some();
        let once = once_of(&r.once);
        let (parent, name, client, generation, open) =
            (check_ino(r.parent)?, r.name.clone(), r.client_id, r.generation, r.open);
        // The session's owner is checked before anything is created; recording the open after
        // the create cannot then fail but for a race with another certificate's claim, logged.
        let cluster = self.cluster()?;
        if open {
            cluster.sessions().check_owner(client, &holder)?;
        }
        let (owner, owner_again) = (holder.clone(), holder.clone());
        let (sessions, sessions_again) = (cluster.sessions().clone(), cluster.sessions().clone());
        let record_open = move |sessions: &crate::sessions::Sessions, owner: &str, ino: u64| {
            if let Err(e) = sessions.opened(client, owner, ino, generation) {
                tracing::warn!(ino, "a created file's open was not recorded: {e}");
            }
        };
        let (inode, created, parent) = self
            .once_change(
                once,
                move |ns| {
                    let new = NewEntry { parent, name: &r.name, mode: r.mode, uid: r.uid, gid: r.gid };
                    let (inode, created) = ns.create_avoiding(&new, r.rdev, r.exclusive, &r.avoid_nodes)?;
                    if r.open && (created || !checked) {
                        record_open(&sessions, &owner, inode.ino);
                    }
                    let parent = if created { dir_after(ns, new.parent) } else { None };
                    Ok((inode, created, parent))
                },
                |ns| {
                    let inode = ns.lookup(parent, &name)?;
                    if open {
                        record_open(&sessions_again, &owner_again, inode.ino);
                    }
                    Ok((inode, true, dir_after(ns, parent)))
                },
            )
            .await?;
        let cap = (open && inode.is_reg() && (created || !checked))
            .then(|| self.signer().grant(inode.ino, READ | WRITE, &holder));
        Ok(Response::new(CreateReply { file: Some(file_info(&inode)), created, parent, cap }))
    }

    async fn mkdir(&self, req: Request<MkdirRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        let rule = self.may_change(&req, "mkdir")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let mut r = req.into_inner();
        if let Some(rule) = rule {
            (r.mode, r.uid, r.gid) =
                (rule.mode(r.mode, true)?, rule.claim_uid(r.uid)?, rule.claim_gid(r.gid)?);
        }
        if let Some(who) = &who {
            self.check_new_entry(who, check_ino(r.parent)?, &r.name, Some(r.uid), "mkdir")?;
        }
        let (parent, group) = (check_ino(r.parent)?, self.dir_group(r.parent, &r.name)?);
        if self.raft.get().is_some_and(|raft| raft.group() != group) {
            return Ok(Response::new(self.mkdir_in(group, r).await?));
        }
        let once = once_of(&r.once);
        let name = r.name.clone();
        let replay = |ns: &Namespace| Ok((ns.lookup_entry(parent, &name)?, dir_after(ns, parent)));
        let (looked, parent) = self
            .once_change(
                once,
                move |ns| {
                    let inode =
                        ns.mkdir(&NewEntry { parent, name: &r.name, mode: r.mode, uid: r.uid, gid: r.gid })?;
                    Ok((crate::namespace::Looked::Here(inode), dir_after(ns, parent)))
                },
                replay,
            )
            .await?;
        Ok(Response::new(AttrReply { parent, ..looked_reply(looked) }))
    }

    async fn unlink(&self, req: Request<RemoveRequest>) -> Result<Response<RemoveReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        self.may_change(&req, "unlink")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        if let Some(who) = &who {
            self.check_remove(who, check_ino(req.get_ref().parent)?, &req.get_ref().name, "unlink")?;
        }
        let r = req.into_inner();
        if let Some(reply) = self.unlink_elsewhere(&r, who.as_ref()).await? {
            return Ok(Response::new(reply));
        }
        self.remove(r, false).await
    }

    async fn rmdir(&self, req: Request<RemoveRequest>) -> Result<Response<RemoveReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        self.may_change(&req, "rmdir")?;
        if let Some(who) = self.who(&req, req.get_ref().caller.as_ref())? {
            self.check_remove(&who, check_ino(req.get_ref().parent)?, &req.get_ref().name, "rmdir")?;
        }
        let r = req.into_inner();
        if let Some(reply) = self.rmdir_elsewhere(&r).await? {
            return Ok(Response::new(reply));
        }
        self.remove(r, true).await
    }

    async fn rename(&self, req: Request<RenameRequest>) -> Result<Response<RenameReply>, Status> {
        let (parent, new_parent) = (req.get_ref().parent, req.get_ref().new_parent);
        let dst_across = self.across(&req, new_parent)?;
        let inos = [parent, new_parent];
        self.within(&req, &inos[..if dst_across { 1 } else { 2 }])?;
        self.may_change(&req, "rename")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let limited = self.limited(&req);
        let r = req.into_inner();
        if let Some(reply) = self.rename_across(&r, (who.as_ref(), limited), (dst_across, false)).await? {
            return Ok(Response::new(reply));
        }
        let (parent, new_parent) = (check_ino(r.parent)?, check_ino(r.new_parent)?);
        if let Some(who) = &who {
            self.check_rename(who, &r)?;
        }
        let once = once_of(&r.once);
        let local = r.clone();
        let renamed = self
            .once_change(
                once,
                move |ns| {
                    Ok(match ns.rename(parent, &local.name, new_parent, &local.new_name, local.flags)? {
                        Renamed::Done => Some((dir_after(ns, parent), dir_after(ns, new_parent))),
                        Renamed::AcrossGroups => None,
                    })
                },
                |ns| Ok(Some((dir_after(ns, parent), dir_after(ns, new_parent)))),
            )
            .await?;
        if let Some((parent, new_parent)) = renamed {
            return Ok(Response::new(RenameReply { parent, new_parent }));
        }
        // A directory moving under a parent whose ancestry leaves this group: the loop check
        // walks across groups, in a change of this group's.
        match self.rename_across(&r, (who.as_ref(), limited), (false, true)).await? {
            Some(reply) => Ok(Response::new(reply)),
            None => Err(CairnError::internal("a rename across groups answered that it was not one").into()),
        }
    }

    async fn link(&self, req: Request<LinkRequest>) -> Result<Response<AttrReply>, Status> {
        let (new_parent, ino) = (req.get_ref().new_parent, req.get_ref().ino);
        let elsewhere = self.across(&req, ino)?;
        let inos = [new_parent, ino];
        self.within(&req, &inos[..if elsewhere { 1 } else { 2 }])?;
        self.may_change(&req, "link")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let r = req.into_inner();
        if let Some(who) = who {
            self.check_new_entry(&who, check_ino(r.new_parent)?, &r.new_name, None, "link")?;
        }
        if elsewhere {
            return Ok(Response::new(self.link_elsewhere(r).await?));
        }
        let once = once_of(&r.once);
        let (ino, new_parent, name) = (check_ino(r.ino)?, check_ino(r.new_parent)?, r.new_name.clone());
        let (inode, parent) = self
            .once_change(
                once,
                move |ns| {
                    let inode = ns.link(ino, new_parent, &r.new_name)?;
                    Ok((inode, dir_after(ns, new_parent)))
                },
                |ns| Ok((ns.lookup(new_parent, &name)?, dir_after(ns, new_parent))),
            )
            .await?;
        Ok(Response::new(AttrReply { parent, ..attr_reply(inode) }))
    }

    async fn symlink(&self, req: Request<SymlinkRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().parent])?;
        let rule = self.may_change(&req, "symlink")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let mut r = req.into_inner();
        if let Some(rule) = rule {
            (r.uid, r.gid) = (rule.claim_uid(r.uid)?, rule.claim_gid(r.gid)?);
        }
        if let Some(who) = &who {
            self.check_new_entry(who, check_ino(r.parent)?, &r.name, Some(r.uid), "symlink")?;
        }
        let once = once_of(&r.once);
        let (parent, name) = (check_ino(r.parent)?, r.name.clone());
        let (inode, parent) = self
            .once_change(
                once,
                move |ns| {
                    let new = NewEntry { parent, name: &r.name, mode: 0, uid: r.uid, gid: r.gid };
                    let inode = ns.symlink(&new, &r.target)?;
                    Ok((inode, dir_after(ns, parent)))
                },
                |ns| Ok((ns.lookup(parent, &name)?, dir_after(ns, parent))),
            )
            .await?;
        Ok(Response::new(AttrReply { parent, ..attr_reply(inode) }))
    }

    async fn readlink(&self, req: Request<InoRequest>) -> Result<Response<ReadlinkReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let ino = req.into_inner().ino;
        let target = self.run(move |ns| ns.readlink(check_ino(ino)?)).await?;
        Ok(Response::new(ReadlinkReply { target }))
    }

    async fn read_dir(&self, req: Request<ReadDirRequest>) -> Result<Response<ReadDirReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        // Checked at the first page (an opendir); later pages belong to the open directory.
        let who = self.who(&req, req.get_ref().caller.as_ref())?.filter(|_| req.get_ref().after.is_empty());
        let r = req.into_inner();
        let (entries, more) = self
            .run(move |ns| {
                let ino = check_ino(r.ino)?;
                if let Some(who) = who {
                    who.check(&ns.getattr(ino)?, MAY_READ, "readdir")?;
                }
                ns.readdir(ino, &r.after, r.limit, r.plus)
            })
            .await?;
        Ok(Response::new(ReadDirReply { entries, more }))
    }

    async fn stat_fs(&self, _req: Request<Empty>) -> Result<Response<StatFsReply>, Status> {
        self.zero()?;
        Ok(Response::new(self.run(|ns| ns.statfs()).await?))
    }

    async fn get_xattr(&self, req: Request<XattrRequest>) -> Result<Response<XattrReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let r = req.into_inner();
        let value = self.read(|ns| {
            let ino = check_ino(r.ino)?;
            if let Some(who) = who {
                who.check_get_xattr(&ns.getattr(ino)?, &r.name)?;
            }
            ns.get_xattr(ino, &r.name)
        })?;
        Ok(Response::new(XattrReply { value }))
    }

    async fn set_xattr(&self, req: Request<SetXattrRequest>) -> Result<Response<Empty>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let rule = self.may_change(&req, "setxattr")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let r = req.into_inner();
        self.guard_xattr(rule, check_ino(r.ino)?, &r.name).await?;
        if let Some(who) = who {
            self.read(|ns| who.check_set_xattr(&ns.getattr(check_ino(r.ino)?)?, &r.name, false))?;
        }
        let once = once_of(&r.once);
        let ino = check_ino(r.ino)?;
        self.once_change(once, move |ns| ns.set_xattr(ino, &r.name, &r.value, r.flags), |_| Ok(())).await?;
        Ok(Response::new(Empty {}))
    }

    async fn list_xattr(&self, req: Request<InoRequest>) -> Result<Response<ListXattrReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let ino = req.into_inner().ino;
        let names = self.run(move |ns| ns.list_xattr(check_ino(ino)?)).await?;
        Ok(Response::new(ListXattrReply { names }))
    }

    async fn remove_xattr(&self, req: Request<XattrRequest>) -> Result<Response<Empty>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let rule = self.may_change(&req, "removexattr")?;
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let r = req.into_inner();
        self.guard_xattr(rule, check_ino(r.ino)?, &r.name).await?;
        if let Some(who) = who {
            self.read(|ns| who.check_set_xattr(&ns.getattr(check_ino(r.ino)?)?, &r.name, true))?;
        }
        let once = once_of(&r.once);
        let ino = check_ino(r.ino)?;
        self.once_change(once, move |ns| ns.remove_xattr(ino, &r.name), |_| Ok(())).await?;
        Ok(Response::new(Empty {}))
    }

    async fn open(&self, req: Request<OpenRequest>) -> Result<Response<OpenReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let holder = cert_name(&req);
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let ops = self.cap_ops(&req, who.as_ref(), open_want(req.get_ref().access));
        let r = req.into_inner();
        // Reads only (the inode, its stripe records), so inline like the point reads.
        let sessions = self.cluster()?.sessions().clone();
        let (inode, stripes, more) = self.read(|ns| {
            let ino = check_ino(r.ino)?;
            if let Some(who) = who {
                who.check(&ns.getattr(ino)?, open_want(r.access), "open")?;
            }
            // Count the open before looking: an unlink from now on keeps the file for us.
            sessions.opened(r.client_id, &holder, ino, r.generation)?;
            let opened = ns.open_file(ino);
            if opened.is_err() {
                sessions.released(r.client_id, ino, r.generation);
            }
            opened
        })?;
        let cap = Some(self.signer().grant(inode.ino, ops, &holder));
        Ok(Response::new(OpenReply { file: Some(file_info(&inode)), stripes, more, cap }))
    }

    async fn release(&self, req: Request<ReleaseRequest>) -> Result<Response<Empty>, Status> {
        let holder = cert_name(&req);
        let r = req.into_inner();
        let cluster = self.cluster()?;
        cluster.sessions().check_owner(r.client_id, &holder)?;
        if r.more.len() > MAX_RELEASES {
            return Err(CairnError::invalid(format!(
                "{} files in one release, at most {MAX_RELEASES}",
                r.more.len()
            ))
            .into());
        }
        let first = (r.ino != 0).then_some(Released { ino: r.ino, generation: r.generation });
        let files = first.into_iter().chain(r.more).map(|f| Ok((check_ino(f.ino)?, f.generation)));
        let files = files.collect::<Result<Vec<_>>>()?;
        let mut orphans = Vec::new();
        for (ino, generation) in files {
            // Nearly every file closed is linked: one inline read says so.
            if cluster.sessions().released(r.client_id, ino, generation)
                && self.read(|ns| ns.is_orphan(ino))?
            {
                orphans.push(ino);
            }
        }
        // Freeing an unlinked one writes, on the blocking pool.
        if !orphans.is_empty() {
            self.run(move |ns| orphans.iter().try_for_each(|&ino| ns.free_if_orphan(ino).map(|_| ())))
                .await?;
        }
        Ok(Response::new(Empty {}))
    }

    async fn client_heartbeat(
        &self,
        req: Request<ClientHeartbeatRequest>,
    ) -> Result<Response<ClientHeartbeatReply>, Status> {
        let holder = cert_name(&req);
        let r = req.into_inner();
        let cluster = self.cluster()?;
        let sessions = cluster.sessions();
        sessions.heartbeat(r.client_id, &holder, Some(r.open))?;
        Ok(Response::new(ClientHeartbeatReply { lease_ms: sessions.lease().as_millis() as u64 }))
    }

    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let holder = cert_name(&req);
        let r = req.into_inner();
        check_ino(r.ino)?;
        if r.typ > F_UNLCK || r.start > r.end {
            return Err(
                CairnError::invalid(format!("lock: type {} range {}..={}", r.typ, r.start, r.end)).into()
            );
        }
        let want =
            Lock { client: r.client_id, owner: r.owner, pid: r.pid, start: r.start, end: r.end, typ: r.typ };
        let cluster = self.cluster()?;
        let sessions = cluster.sessions();
        sessions.heartbeat(r.client_id, &holder, None)?;
        let outcome = if r.test {
            sessions.conflict(r.ino, &want).map_or(Ok(()), Err)
        } else {
            sessions.set_lock(r.ino, want)
        };
        Ok(Response::new(match outcome {
            Ok(()) => LockReply { granted: true, typ: F_UNLCK, ..Default::default() },
            Err(c) => LockReply { granted: false, typ: c.typ, start: c.start, end: c.end, pid: c.pid },
        }))
    }

    async fn list_stripes(
        &self,
        req: Request<ListStripesRequest>,
    ) -> Result<Response<ListStripesReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let r = req.into_inner();
        let (stripes, more) = self.run(move |ns| ns.list_stripes(check_ino(r.ino)?, r.from, r.limit)).await?;
        Ok(Response::new(ListStripesReply { stripes, more }))
    }

    async fn commit(&self, req: Request<CommitRequest>) -> Result<Response<AttrReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let rule = self.may_change(&req, "commit")?;
        let r = req.into_inner();
        if let Some(rule) = rule {
            self.guard_inode(&rule, check_ino(r.ino)?, true).await?;
        }
        let once = once_of(&r.once);
        let ino = check_ino(r.ino)?;
        // A durable commit waits for the disk (a lone metaserver fsyncs it): on the blocking
        // pool; a buffered one only appends to the WAL, inline.
        let durable = !r.buffered;
        let inode = self
            .once_change_on(
                once,
                durable,
                move |ns| ns.commit_as(ino, r.size, &r.stripes, r.mtime.as_ref(), durable),
                |ns| ns.getattr(ino),
            )
            .await?;
        Ok(Response::new(attr_reply(inode)))
    }

    async fn sync(&self, _req: Request<Empty>) -> Result<Response<Empty>, Status> {
        self.run(|ns| ns.store().sync()).await?;
        Ok(Response::new(Empty {}))
    }

    async fn register_client(&self, req: Request<Empty>) -> Result<Response<RegisterClientReply>, Status> {
        // Client ids are the cluster's: group 0 hands them out, and every group knows a client
        // by the one id (`docs/ARCHITECTURE.md`, "How clients route").
        self.zero()?;
        let holder = cert_name(&req);
        let read_only = self.rule(&req).is_some_and(|rule| rule.read_only);
        // Before a session is made: a subtree that does not resolve refuses the mount.
        let root = self.subtree(&req)?.unwrap_or(0);
        let client_id = self.run_zero(|s| s.cluster.register_client()).await?;
        self.cluster()?.sessions().bind(client_id, &holder);
        Ok(Response::new(RegisterClientReply { client_id, read_only, root }))
    }

    async fn register_chunk(
        &self,
        req: Request<RegisterChunkRequest>,
    ) -> Result<Response<RegisterChunkReply>, Status> {
        let cert = cert_name(&req);
        let r = req.into_inner();
        let (node_id, cluster_id) = self
            .run_zero(move |s| {
                check_cluster(s, &r.cluster_id, &r.addr)?;
                let node_id = s.cluster.registry().register(&r.uuid, &r.addr, r.tiers, r.pid, &cert)?;
                Ok((node_id, s.ns.cluster_id().to_string()))
            })
            .await?;
        tracing::info!(node_id, "chunkserver registered");
        Ok(Response::new(RegisterChunkReply { node_id, cluster_id, cap_keys: self.signer().keys() }))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Result<Response<HeartbeatReply>, Status> {
        let cert = cert_name(&req);
        let r = req.into_inner();
        let fence = self
            .run_zero(move |s| {
                check_cluster(s, &r.cluster_id, &r.addr)?;
                s.cluster.registry().heartbeat(r.node_id, &r.addr, r.tiers, r.pid, &cert)?;
                s.cluster.registry().set_cert_expiry(r.node_id, r.cert_not_after);
                Ok((s.ns.fence(), s.ns.cluster_id().to_string(), s.cluster.groups().version()))
            })
            .await?;
        Ok(Response::new(HeartbeatReply {
            fence: fence.0,
            cluster_id: fence.1,
            cap_keys: self.signer().keys(),
            map_version: fence.2,
        }))
    }

    async fn list_nodes(&self, _req: Request<Empty>) -> Result<Response<ListNodesReply>, Status> {
        Ok(Response::new(ListNodesReply { nodes: nodes_with_progress(&self.zero()?.cluster) }))
    }

    async fn report_damaged(
        &self,
        req: Request<ReportDamagedRequest>,
    ) -> Result<Response<cairn_proto::ReportDamagedReply>, Status> {
        let from_client = capability::required_of(req.extensions().get::<cairn_net::tls::Peer>());
        let r = req.into_inner();
        // Handed on by group 0 for a client: confirmed here, where the stripe records are.
        let confirm = from_client || r.confirm;
        let ids: Vec<cairn_common::ShardId> = r.ids.iter().map(Into::into).collect();
        if ids.len() > 100_000 || (from_client && ids.len() > MAX_CLIENT_DAMAGE_IDS) {
            return Err(CairnError::invalid("too many shard ids in one report").into());
        }
        let (ids, elsewhere) = self.damage_by_group(ids)?;
        // A chunkserver reports its own shards; a client's word is checked with the chunkserver
        // that holds each one, so no client can mark healthy shards missing.
        let ids = if confirm { self.confirmed_damage(ids).await? } else { ids };
        let (_, missing) = self.run(move |ns| ns.mark_damaged(&ids)).await?;
        let mut missing: Vec<cairn_proto::ShardId> = missing.into_iter().map(Into::into).collect();
        // Each group on its own: one without a leader leaves the others' reports standing
        // (the reporter's shards there are not counted missing, so it keeps them; a scrub
        // reports them again on its next pass).
        for (group, ids) in elsewhere {
            match self.damage_elsewhere(group, ids, confirm).await {
                Ok(theirs) => missing.extend(theirs),
                Err(e) => tracing::warn!(
                    group,
                    "a damage report for metadata group {group} was not taken: {}",
                    e.message()
                ),
            }
        }
        Ok(Response::new(cairn_proto::ReportDamagedReply { missing }))
    }

    async fn cluster_status(&self, _req: Request<Empty>) -> Result<Response<ClusterStatusReply>, Status> {
        let mut reply = self.run_zero(status_reply).await?;
        reply.access_rules = self.access.rules().iter().map(Rule::describe).collect();
        Ok(Response::new(reply))
    }

    async fn repair_now(&self, _req: Request<Empty>) -> Result<Response<ClusterStatusReply>, Status> {
        self.zero()?;
        self.repair()?.pass_now().await?;
        let reply = self.run_zero(status_reply).await?;
        Ok(Response::new(reply))
    }

    async fn check_namespace(
        &self,
        req: Request<CheckNamespaceRequest>,
    ) -> Result<Response<CheckNamespaceReply>, Status> {
        Ok(Response::new(self.check_namespace(req.into_inner()).await?))
    }

    async fn reconcile(&self, req: Request<ReconcileRequest>) -> Result<Response<ReconcileReply>, Status> {
        let req = req.into_inner();
        self.zero()?;
        let report = self.repair()?.reconcile(req.dry_run, req.delete_foreign).await;
        Ok(Response::new(ReconcileReply {
            checked: report.checked,
            stale: report.stale,
            stale_bytes: report.stale_bytes,
            deleted: report.deleted,
            errors: report.errors,
            foreign: report.foreign,
            foreign_bytes: report.foreign_bytes,
            foreign_nodes: report.foreign_nodes,
        }))
    }

    async fn drain_node(&self, req: Request<NodeRequest>) -> Result<Response<NodeReply>, Status> {
        let node = req.into_inner().node;
        let info = self.run_zero(move |s| s.cluster.registry().set_state(node, NODE_DRAINING)).await?;
        Ok(Response::new(NodeReply { node: Some(info) }))
    }

    async fn activate_node(&self, req: Request<NodeRequest>) -> Result<Response<NodeReply>, Status> {
        let node = req.into_inner().node;
        let info = self.run_zero(move |s| s.cluster.registry().set_state(node, NODE_ACTIVE)).await?;
        Ok(Response::new(NodeReply { node: Some(info) }))
    }

    async fn get_layout(&self, req: Request<InoRequest>) -> Result<Response<LayoutReply>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let ino = req.into_inner().ino;
        let layout = self.run(move |ns| ns.get_layout(check_ino(ino)?)).await?;
        Ok(Response::new(LayoutReply { layout: Some(layout.into()) }))
    }

    async fn grant_capability(
        &self,
        req: Request<CapabilityRequest>,
    ) -> Result<Response<Capability>, Status> {
        self.within(&req, &[req.get_ref().ino])?;
        let holder = cert_name(&req);
        let who = self.who(&req, req.get_ref().caller.as_ref())?;
        let want = open_want(req.get_ref().access);
        let ops = self.cap_ops(&req, who.as_ref(), want);
        let ino = check_ino(req.into_inner().ino)?;
        let inode = self.read(|ns| ns.getattr(ino))?;
        if !inode.is_reg() {
            return Err(CairnError::invalid(format!("inode {ino} is not a regular file: no shards")).into());
        }
        // Checked as the open it renews was; a file's owner may renew what it got (the token
        // of a file it created with a mode that grants it no write: it could chmod anyway).
        if let Some(who) = who.as_ref().filter(|w| w.uid != inode.uid) {
            who.check(&inode, want, "capability")?;
        }
        Ok(Response::new(self.signer().grant(ino, ops, &holder)))
    }

    async fn set_layout(&self, req: Request<SetLayoutRequest>) -> Result<Response<LayoutReply>, Status> {
        let r = req.into_inner();
        let layout = cairn_common::Layout::try_from(
            r.layout.as_ref().ok_or_else(|| Status::invalid_argument("SetLayout without a layout"))?,
        )?;
        let inode = self.run(move |ns| ns.set_layout(check_ino(r.ino)?, layout)).await?;
        Ok(Response::new(LayoutReply { layout: Some(inode.layout().into()) }))
    }

    async fn remove_node(&self, req: Request<NodeRequest>) -> Result<Response<Empty>, Status> {
        let NodeRequest { node, force } = req.into_inner();
        self.run_zero(move |s| remove_node(s, node, force)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn raft_vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        Ok(Response::new(self.raft()?.handle_vote(req.into_inner()).await?))
    }

    async fn raft_append(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        Ok(Response::new(self.raft()?.handle_append(req.into_inner()).await?))
    }

    async fn raft_snapshot(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        Ok(Response::new(self.raft()?.handle_snapshot(req.into_inner()).await?))
    }

    async fn raft_add_member(
        &self,
        req: Request<cairn_proto::RaftMemberRequest>,
    ) -> Result<Response<RaftStatusReply>, Status> {
        let req = req.into_inner();
        let raft = self.raft()?;
        let wait = std::time::Duration::from_millis(if req.wait_ms == 0 { 60_000 } else { req.wait_ms });
        raft.add_member(req.id, &req.addr, wait).await?;
        Ok(Response::new(raft.status()))
    }

    async fn raft_remove_member(
        &self,
        req: Request<cairn_proto::RaftMemberRequest>,
    ) -> Result<Response<RaftStatusReply>, Status> {
        let raft = self.raft()?;
        raft.remove_member(req.into_inner().id).await?;
        Ok(Response::new(raft.status()))
    }

    type RaftBackupStream = backup::BackupStream;

    async fn raft_backup(&self, _req: Request<Empty>) -> Result<Response<Self::RaftBackupStream>, Status> {
        Ok(Response::new(self.backup_stream().await?))
    }

    async fn get_group_map(&self, _req: Request<Empty>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.group_map()?))
    }

    async fn add_group(&self, req: Request<MetaGroup>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.add_group(req.into_inner()).await?))
    }

    async fn remove_group(&self, req: Request<GroupRequest>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.remove_group(req.into_inner().group).await?))
    }

    async fn move_slots(&self, req: Request<MoveSlotsRequest>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.move_slots(req.into_inner()).await?))
    }

    async fn share_group_map(&self, req: Request<SharedGroupMap>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.share_group_map(req.into_inner()).await?))
    }

    async fn release_slots(
        &self,
        req: Request<cairn_proto::ReleaseSlotsRequest>,
    ) -> Result<Response<cairn_proto::ReleaseSlotsReply>, Status> {
        Ok(Response::new(self.release_slots(req.into_inner()).await?))
    }

    async fn txn_prepare(
        &self,
        req: Request<TxnPrepareRequest>,
    ) -> Result<Response<TxnPrepareReply>, Status> {
        Ok(Response::new(self.txn_prepare(req.into_inner()).await?))
    }

    async fn txn_decide(&self, req: Request<TxnDecideRequest>) -> Result<Response<Empty>, Status> {
        self.txn_decide(req.into_inner()).await?;
        Ok(Response::new(Empty {}))
    }

    async fn txn_outcome(&self, req: Request<TxnId>) -> Result<Response<TxnOutcomeReply>, Status> {
        Ok(Response::new(self.txn_outcome(req.into_inner())?))
    }

    async fn txn_ancestry(
        &self,
        req: Request<cairn_proto::TxnAncestryRequest>,
    ) -> Result<Response<cairn_proto::TxnAncestryReply>, Status> {
        Ok(Response::new(self.txn_ancestry(req.into_inner()).await?))
    }

    async fn spread_dirs(&self, req: Request<SpreadDirsRequest>) -> Result<Response<GroupMap>, Status> {
        Ok(Response::new(self.spread_dirs(req.into_inner().on).await?))
    }

    async fn raft_status(&self, _req: Request<Empty>) -> Result<Response<RaftStatusReply>, Status> {
        Ok(Response::new(match self.raft.get() {
            Some(raft) => RaftStatusReply {
                map_version: self.map_version(),
                repair: self.group_repair(),
                ..raft.status()
            },
            None if self.replicated => RaftStatusReply { state: "starting".into(), ..Default::default() },
            None => RaftStatusReply { state: "single".into(), ..Default::default() },
        }))
    }
}

#[cfg(test)]
mod tests;
