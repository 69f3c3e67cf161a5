//! The metaserver's access rules applied to requests (`access.rs` holds the rules): which
//! rule a caller is held to, refusing changes to read-only clients, guarding inodes a squashed
//! client may not act on, and the capabilities each may get.

use cairn_common::{CairnError, Result};
use cairn_net::capability::{Signer, READ, WRITE};
use cairn_proto::SetAttrRequest;
use tonic::{Request, Status};

use super::MetaService;
use crate::access::Rule;
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

    /// The shard operations a capability grants the caller: read only to a read-only client.
    pub(super) fn cap_ops<T>(&self, req: &Request<T>) -> u32 {
        if self.rule(req).is_some_and(|rule| rule.read_only) {
            READ
        } else {
            READ | WRITE
        }
    }
}
