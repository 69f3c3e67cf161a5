//! The metaserver's access rules applied to requests (`access.rs` holds the rules): which
//! rule a caller is held to, refusing changes to read-only clients, guarding inodes a squashed
//! client may not act on, and the capabilities each may get.

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_net::capability::{Signer, READ, WRITE};
use cairn_proto::{Caller, RenameRequest, SetAttrRequest};
use tonic::{Request, Status};

use super::{check_ino, MetaService};
use crate::access::Rule;
use crate::namespace::RENAME_EXCHANGE;
use crate::permissions::{Who, MAY_EXEC, MAY_WRITE};
use crate::schema::Inode;

impl MetaService {
    /// The capability signer, after revoking what it signed under access rules that have
    /// changed since (a client made read-only must not keep writing with tokens it holds).
    pub(super) fn signer(&self) -> &Signer {
        let now = self.access.generation();
        if self.caps_generation.swap(now, std::sync::atomic::Ordering::AcqRel) != now {
            self.caps.revoke_all();
            tracing::info!("access rules changed: shard capabilities signed before are revoked");
        }
        &self.caps
    }

    /// The access rule the caller of `req` is held to, if any.
    pub(super) fn rule<T>(&self, req: &Request<T>) -> Option<Rule> {
        self.access.rule_for(req.extensions().get::<cairn_net::tls::Peer>())
    }

    /// The directory the caller of `req` is limited to by its rule's `subtree` (`None`: the
    /// whole namespace).
    pub(super) fn subtree<T>(&self, req: &Request<T>) -> Result<Option<u64>, Status> {
        let Some(path) = self.rule(req).and_then(|r| r.subtree).filter(|p| p != "/") else {
            return Ok(None);
        };
        let ns = self.ns()?;
        if ns.group() != 0 {
            // The subtree's path resolves from the root, which group 0 holds.
            return Err(CairnError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "this client is limited to the subtree {path}, and metadata group {} cannot check \
                     that yet (the path resolves in group 0): not served",
                    ns.group()
                ),
            )
            .into());
        }
        Ok(Some(self.access.subtree_root(&path, |p| ns.resolve_dir(p))?))
    }

    /// Refuse `req` where the first of `inos` (the one a client routes by) lies in a namespace
    /// slot another metadata group owns (`WrongGroup`, with this map's version: the caller asks
    /// that group), where another of them does (`CrossDevice`: rename and link, which may run
    /// across groups, leave such an inode out after asking [`Self::across`]), or where its
    /// caller is limited to a subtree and any of them lies outside (`docs/ARCHITECTURE.md`,
    /// "Subtree rules"; nothing is read for other callers).
    pub(super) fn within<T>(&self, req: &Request<T>, inos: &[u64]) -> Result<(), Status> {
        let serving = self.serving()?;
        let own = serving.ns.group();
        for (i, &ino) in inos.iter().enumerate() {
            let (group, version) = serving.cluster.groups().owner_of(ino);
            if group != own && i > 0 {
                return Err(CairnError::new(
                    ErrorKind::CrossDevice,
                    format!(
                        "inode {ino} is metadata group {group}'s and this request's first inode group {own}'s: \
                         this request does not run across metadata groups"
                    ),
                )
                .into());
            }
            if group != own {
                return Err(CairnError::wrong_group(
                    format!(
                        "inode {ino} is in namespace slot {}, which metadata group {group} owns: ask its metaservers",
                        cairn_common::ids::slot_of(ino)
                    ),
                    version,
                )
                .into());
            }
        }
        let Some(top) = self.subtree(req)? else { return Ok(()) };
        let ns = self.ns()?;
        for &ino in inos {
            if !ns.inside(check_ino(ino)?, top)? {
                return Err(CairnError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "inode {ino} is outside the subtree this client's certificate is limited to \
                         by the metaserver's access rules"
                    ),
                )
                .into());
            }
        }
        Ok(())
    }

    /// The user a request acts for, where it is checked (`permissions.rs`): a caller whose
    /// certificate has the client role only. `None` for servers, admins and plaintext callers,
    /// and for root (after its rule's squash and ranges), whom every check would let through
    /// (root may read and write anything; execute permission, which it lacks on a file with no
    /// execute bit, its own kernel checks): no inode is read for it.
    pub(super) fn who<T>(&self, req: &Request<T>, caller: Option<&Caller>) -> Result<Option<Who>> {
        let peer = req.extensions().get::<cairn_net::tls::Peer>();
        if !cairn_net::capability::required_of(peer) {
            return Ok(None);
        }
        let who = Who::of(caller, self.access.rule_for(peer).as_ref())?;
        Ok((!who.is_root()).then_some(who))
    }

    /// The caller's access rule, after refusing `what` (a namespace change) to a read-only
    /// client.
    pub(super) fn may_change<T>(&self, req: &Request<T>, what: &str) -> Result<Option<Rule>> {
        let rule = self.rule(req);
        if let Some(rule) = &rule {
            rule.change(what)?;
        }
        Ok(rule)
    }

    /// Before a client held to `rule` changes inode `ino` (its attributes, xattrs, or with
    /// `data` its bytes): refused where the rule's squash says the client cannot act as the
    /// inode's owner; before a data change, the file's setuid/setgid bits and file capabilities
    /// are dropped unless the rule allows them (first, so new bytes never run with them).
    /// Returns the inode as it was read (`None`: the rule needs no look at it), for the
    /// caller's further checks.
    pub(super) async fn guard_inode(
        &self,
        rule: &Rule,
        ino: u64,
        data: bool,
    ) -> Result<Option<Inode>, Status> {
        if !rule.limits_owners() && rule.setuid {
            return Ok(None);
        }
        let inode = self.read(|ns| ns.getattr(ino))?;
        if !rule.may_change_owned_by(inode.uid) {
            return Err(CairnError::new(
                cairn_common::ErrorKind::NotPermitted,
                format!(
                    "inode {ino} is owned by uid {}, which this client's certificate may not act as \
                     (squashed or outside its uids by the metaserver's access rules)",
                    inode.uid
                ),
            )
            .into());
        }
        if !data || !inode.is_reg() {
            return Ok(Some(inode));
        }
        if let Some(mode) = rule.mode_after_write(inode.mode & 0o7777) {
            let clear = SetAttrRequest { ino, mode: Some(mode), ..Default::default() };
            self.once_change(None, move |ns| ns.setattr(&clear), move |ns| ns.getattr(ino)).await?;
        }
        // Looked up first: a write to the log only where there is something to drop.
        let has_caps = || self.read(|ns| ns.get_xattr(ino, b"security.capability")).is_ok();
        if !rule.setuid && has_caps() {
            let dropped = self
                .once_change(None, move |ns| ns.remove_xattr(ino, b"security.capability"), |_| Ok(()))
                .await;
            match dropped.map_err(CairnError::from) {
                Err(e) if e.kind() != cairn_common::ErrorKind::NoData => return Err(e.into()),
                _ => {}
            }
        }
        Ok(Some(inode))
    }

    /// Before a client held to `rule` (if any) sets or removes xattr `name` of `ino`: the
    /// names its rule refuses, and the inodes it may not act on ([`Self::guard_inode`]).
    pub(super) async fn guard_xattr(&self, rule: Option<Rule>, ino: u64, name: &[u8]) -> Result<(), Status> {
        if let Some(rule) = rule {
            rule.xattr(name)?;
            self.guard_inode(&rule, ino, false).await?;
        }
        Ok(())
    }

    /// The shard operations a capability grants the caller: read only to a read-only client,
    /// and to a checked caller (`who`) whose open (`want`, `MAY_*` bits) asks no write.
    pub(super) fn cap_ops<T>(&self, req: &Request<T>, who: Option<&Who>, want: u32) -> u32 {
        let read_only = self.rule(req).is_some_and(|rule| rule.read_only);
        if read_only || (who.is_some() && want & MAY_WRITE == 0) {
            READ
        } else {
            READ | WRITE
        }
    }
}

/// The per-user checks of entry changes (`permissions.rs`), on what the leader reads before it
/// proposes the change.
impl MetaService {
    /// Before `who` makes entry `name` in `parent`, owned by `uid`: write and search on the
    /// directory, and a non-root caller's entries are its own. A name that exists makes nothing
    /// (the namespace answers `EEXIST`, or a create opens it and that open is checked).
    pub(super) fn check_new_entry(
        &self,
        who: &Who,
        parent: u64,
        name: &[u8],
        uid: Option<u32>,
        what: &str,
    ) -> Result<(), Status> {
        if let Some(uid) = uid {
            who.check_new_owner(uid)?;
        }
        self.read(|ns| match ns.lookup(parent, name) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                who.check(&ns.getattr(parent)?, MAY_WRITE | MAY_EXEC, what)
            }
            Err(e) => Err(e),
        })
    }

    /// Before `who` removes entry `name` of `parent`: write and search on the directory, and in
    /// a sticky one, the entry's or the directory's owner. Returns the entry's inode (`None`:
    /// there is none, the namespace answers).
    pub(super) fn check_remove(
        &self,
        who: &Who,
        parent: u64,
        name: &[u8],
        what: &str,
    ) -> Result<Option<Inode>, Status> {
        self.read(|ns| {
            let dir = ns.getattr(parent)?;
            who.check(&dir, MAY_WRITE | MAY_EXEC, what)?;
            match ns.lookup_entry(parent, name) {
                Ok(crate::namespace::Looked::Here(victim)) => {
                    who.check_sticky(&dir, &victim)?;
                    Ok(Some(victim))
                }
                // A file's owner is checked by its group (`across.rs`, the relink's owner); a
                // directory's: in a sticky directory only the directory's owner may remove it
                // until that check is sent there.
                Ok(crate::namespace::Looked::Elsewhere { kind, .. }) if kind != crate::schema::S_IFDIR => {
                    Ok(None)
                }
                Ok(crate::namespace::Looked::Elsewhere { ino, .. }) => {
                    if dir.mode & 0o1000 != 0 && !who.is_root() && who.uid != dir.uid {
                        return Err(CairnError::new(
                            ErrorKind::NotPermitted,
                            format!(
                                "{what}: inode {ino} is another metadata group's, and in a sticky \
                                 directory only the directory's owner may remove it"
                            ),
                        ));
                    }
                    Ok(None)
                }
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// Before `who` renames: each directory's entry rules as for a removal (the target's too,
    /// where one is replaced), and a directory moved to another parent needs write on itself
    /// (its `..` changes), both ways for an exchange.
    pub(super) fn check_rename(&self, who: &Who, r: &RenameRequest) -> Result<(), Status> {
        let moved = self.check_remove(who, r.parent, &r.name, "rename")?;
        let replaced = self.check_remove(who, r.new_parent, &r.new_name, "rename")?;
        if r.parent == r.new_parent {
            return Ok(());
        }
        let exchange = r.flags & RENAME_EXCHANGE != 0;
        for inode in moved.iter().chain(replaced.iter().filter(|_| exchange)) {
            if inode.is_dir() {
                who.check(inode, MAY_WRITE, "rename of a directory to another parent")?;
            }
        }
        Ok(())
    }
}
