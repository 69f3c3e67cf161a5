//! Unlink, link and rename across metadata groups as the service runs them
//! (`namespace/txn/change.rs` holds the effects, `exchange.rs` the steps): which requests
//! need another group, the effects each group takes, the permission checks the coordinator
//! makes itself and those it sends, and the answers.

use cairn_common::{CairnError, ErrorKind};
use cairn_proto::{AttrReply, LinkRequest, RemoveReply, RemoveRequest, RenameReply, RenameRequest};
use tonic::{Request, Status};

use super::{attr_reply, check_ino, dir_after, looked_reply, once_of, MetaService};
use crate::namespace::txn::{self, Changed};
use crate::namespace::{once, Looked, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::permissions::Who;
use crate::schema::{TxnEffect, S_IFDIR};

impl MetaService {
    /// Whether `ino`, an inode a request names besides the one it is routed by (a link's
    /// inode, a rename's destination directory), is another group's: then the change runs
    /// across groups. A client limited to a subtree is refused that (`CrossDevice`): where the
    /// other inode lies is checked from the root, which only group 0 holds.
    pub(super) fn across<T>(&self, req: &Request<T>, ino: u64) -> Result<bool, Status> {
        let serving = self.serving()?;
        let (group, _) = serving.cluster.groups().owner_of(ino);
        if group == serving.ns.group() {
            return Ok(false);
        }
        if self.limited(req) {
            return Err(limited_across(ino).into());
        }
        Ok(true)
    }

    /// Whether the caller of `req` is limited to a subtree (not the root).
    pub(super) fn limited<T>(&self, req: &Request<T>) -> bool {
        self.rule(req).and_then(|r| r.subtree).is_some_and(|p| p != "/")
    }

    /// The uid that must own a file removed from or replaced in directory `dir` by `who`
    /// (`None`: nobody is checked, or the directory is not sticky, or `who` owns it): the
    /// sticky rule, checked by the group holding the file.
    fn sticky_owner(&self, who: Option<&Who>, dir: u64) -> Result<Option<u32>, Status> {
        let Some(who) = who else { return Ok(None) };
        Ok(who.sticky_owner(&self.read(|ns| ns.getattr(dir))?))
    }

    /// Run the change of `effects` across groups for `once`: `None` when an earlier try of
    /// it was done (the caller answers from what it left).
    async fn change_across(
        &self,
        once: Option<(u64, u64)>,
        effects: Vec<(u32, TxnEffect)>,
    ) -> Result<Option<Changed>, Status> {
        if self.done_before(once)? {
            return Ok(None);
        }
        let peers = self.peers()?;
        let changed = self.run(move |ns| once::scope(once, || txn::change_across(ns, &peers, effects))).await;
        match changed {
            Ok(changed) => {
                if let Changed::Done { acknowledged: true, id, .. } = &changed {
                    // Every participant took it: the record goes after the answer.
                    let (ns, id) = (self.ns()?, *id);
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = ns.txn_forget(id) {
                            tracing::info!("transaction {id}: its record stays for recovery ({e})");
                        }
                    });
                }
                Ok(Some(changed))
            }
            Err(_) if once.is_some() && self.done_before(once)? => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// unlink of `r` when its entry names a file another group holds (`None`: it does not;
    /// the caller removes it here): the entry goes here, the link there.
    pub(super) async fn unlink_elsewhere(
        &self,
        r: &RemoveRequest,
        who: Option<&Who>,
    ) -> Result<Option<RemoveReply>, Status> {
        let parent = check_ino(r.parent)?;
        let Ok(Looked::Elsewhere { ino, kind }) = self.read(|ns| ns.lookup_entry(parent, &r.name)) else {
            return Ok(None);
        };
        if kind == S_IFDIR {
            return Err(CairnError::new(ErrorKind::IsDir, "unlink of a directory").into());
        }
        let owner = self.sticky_owner(who, parent)?;
        let effects = vec![
            (self.ns()?.group(), txn::unname(parent, &r.name, ino)),
            (self.group_of(ino)?, txn::relink(ino, -1, (parent, 0), owner)),
        ];
        self.change_across(once_of(&r.once), effects).await?;
        Ok(Some(RemoveReply { parent: self.read(|ns| Ok(dir_after(ns, parent)))? }))
    }

    /// link of `r`, whose inode another group holds (`r` checked): the name is made here, the
    /// link counted there. Answers the file as its group left it.
    pub(super) async fn link_elsewhere(&self, r: LinkRequest) -> Result<AttrReply, Status> {
        let (ino, parent) = (check_ino(r.ino)?, check_ino(r.new_parent)?);
        let effects = vec![
            (self.ns()?.group(), txn::name(parent, &r.new_name, ino, 0, false, None)),
            (self.group_of(ino)?, txn::relink(ino, 1, (0, parent), None)),
        ];
        let after = || self.read(|ns| Ok(dir_after(ns, parent)));
        match self.change_across(once_of(&r.once), effects).await? {
            Some(Changed::Done { relinked, .. }) => {
                let inode = relinked.into_iter().find(|i| i.ino == ino).ok_or_else(|| {
                    CairnError::internal(format!("the link of inode {ino} came back without it"))
                })?;
                Ok(AttrReply { parent: after()?, ..attr_reply(inode) })
            }
            // Done by an earlier try: the entry names the file, which its group describes.
            _ => {
                let looked = self.read(|ns| ns.lookup_entry(parent, &r.new_name))?;
                Ok(AttrReply { parent: after()?, ..looked_reply(looked) })
            }
        }
    }

    /// rename of `r` when it needs another group (`None`: it does not; the caller renames
    /// here): its destination directory is another group's (`dst_across`), or the file or
    /// directory it moves or replaces is, or (`walk_across`: the rename here said so) the
    /// directory it moves goes under a parent whose ancestry continues in another group.
    /// Exchanges are refused across groups (`CrossDevice`: `mv` copies).
    pub(super) async fn rename_across(
        &self,
        r: &RenameRequest,
        (who, limited): (Option<&Who>, bool),
        (dst_across, walk_across): (bool, bool),
    ) -> Result<Option<RenameReply>, Status> {
        let (parent, new_parent) = (check_ino(r.parent)?, check_ino(r.new_parent)?);
        let reply = || {
            let own_dst = !dst_across;
            self.read(|ns| {
                Ok(RenameReply {
                    parent: dir_after(ns, parent),
                    new_parent: own_dst.then(|| dir_after(ns, new_parent)).flatten(),
                })
            })
        };
        // A try sent again after its first was done (the source is gone by now); a rename
        // within this group is answered so by the local path.
        if dst_across && self.done_before(once_of(&r.once))? {
            return Ok(Some(reply()?));
        }
        let looked = match self.read(|ns| ns.lookup_entry(parent, &r.name)) {
            Ok(looked) => looked,
            // Its first try, still running, may have just taken the source away.
            Err(_) if self.done_before(once_of(&r.once))? => return Ok(Some(reply()?)),
            Err(e) if dst_across || walk_across => return Err(e),
            // The local rename answers it.
            Err(_) => return Ok(None),
        };
        let (ino, kind, here) = match looked {
            Looked::Here(inode) => (inode.ino, inode.kind(), true),
            Looked::Elsewhere { ino, kind } => (ino, kind, false),
        };
        let replaced =
            if dst_across { None } else { self.read(|ns| ns.lookup_entry(new_parent, &r.new_name)).ok() };
        let replaces_elsewhere = match replaced {
            Some(Looked::Elsewhere { kind: there, .. }) => {
                if kind == S_IFDIR && there != S_IFDIR && r.flags & RENAME_EXCHANGE == 0 {
                    return Err(CairnError::new(
                        ErrorKind::NotDir,
                        "rename: a directory over a non-directory",
                    )
                    .into());
                }
                true
            }
            _ => false,
        };
        if !dst_across && here && !replaces_elsewhere && !walk_across {
            return Ok(None);
        }
        if parent == new_parent && r.name == r.new_name {
            if r.flags & RENAME_NOREPLACE != 0 {
                return Err(CairnError::new(ErrorKind::Exists, "rename: the target exists").into());
            }
            return Ok(Some(reply()?));
        }
        if r.flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || r.flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(CairnError::invalid(format!("rename: invalid flags {:#x}", r.flags)).into());
        }
        // A client limited to a subtree is refused any change across groups (see `across`).
        if limited {
            return Err(limited_across(ino).into());
        }
        if r.flags & RENAME_EXCHANGE != 0 {
            return Err(CairnError::new(
                ErrorKind::CrossDevice,
                "rename exchange across metadata groups is not built yet (docs/ARCHITECTURE.md, \"Directory \
                 renames across groups\")",
            )
            .into());
        }
        if let Some(who) = who {
            // The source directory is this group's: checked here (the sticky rule too, for a
            // file of this group); the destination's group checks its own.
            self.check_remove(who, parent, &r.name, "rename")?;
        }
        // A directory's own group changes its parent (and checks the caller may, and the loop
        // check walks); a file's counts the name's move.
        let moved = if kind == S_IFDIR {
            txn::reparent(ino, (parent, new_parent), who)
        } else {
            txn::relink(
                ino,
                0,
                (parent, new_parent),
                if here { None } else { self.sticky_owner(who, parent)? },
            )
        };
        let effects = vec![
            (self.ns()?.group(), txn::unname(parent, &r.name, ino)),
            (
                self.group_of(new_parent)?,
                txn::name(new_parent, &r.new_name, ino, kind, r.flags & RENAME_NOREPLACE == 0, who),
            ),
            (self.group_of(ino)?, moved),
        ];
        self.change_across(once_of(&r.once), effects).await?;
        Ok(Some(reply()?))
    }
}

/// What a client limited to a subtree is answered for a change across groups naming `ino`:
/// where the other inodes lie is checked from the root, which only group 0 holds.
fn limited_across(ino: u64) -> CairnError {
    CairnError::new(
        ErrorKind::CrossDevice,
        format!(
            "inode {ino}: a change across metadata groups is not served to a client limited to a subtree"
        ),
    )
}
