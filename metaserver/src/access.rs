//! Per-client access rules: what one client certificate may do to the namespace, beyond what
//! its role allows (read-only, ownership squashed, no setuid bits, no device nodes). The rules
//! live in the file the config's `access_file` names and are re-read on `SIGHUP` and when the
//! file changes. Design: `docs/ARCHITECTURE.md`, "Per-client access rules".

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::Deserialize;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_net::tls::Peer;

use crate::metrics::{ACCESS_RELOAD_FAILURES, ACCESS_RULES};

/// The owner `squash` maps to unless a rule says otherwise (`nobody` on most systems).
const NOBODY: u32 = 65534;

/// How often the file's modification time is looked at.
const WATCH_EVERY: Duration = Duration::from_secs(5);

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IFMT: u32 = 0o170000;
const S_IFCHR: u32 = 0o020000;
const S_IFBLK: u32 = 0o060000;
const S_IFDIR: u32 = 0o040000;

/// Which owners a client's changes are mapped to `anon_uid`/`anon_gid`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Squash {
    #[default]
    None,
    /// uid 0 and gid 0.
    Root,
    /// Every uid and gid.
    All,
}

/// One `[[rule]]` of the file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Certificate names: exact, or a prefix ending in `*` (`*` alone: every client).
    pub clients: Vec<String>,
    /// Every namespace change is refused (`EROFS`); shard capabilities are read-only.
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub squash: Squash,
    #[serde(default = "nobody")]
    pub anon_uid: u32,
    #[serde(default = "nobody")]
    pub anon_gid: u32,
    /// Modes may carry S_ISUID (and S_ISGID on non-directories).
    #[serde(default)]
    pub setuid: bool,
    /// Character and block device nodes may be made.
    #[serde(default)]
    pub devices: bool,
    /// The owners this client may claim, `[first, last]` inclusive (after its squash): entries
    /// it makes and chowns to owners outside are refused (`EACCES`), and it may not act as the
    /// owner of an inode owned outside (`EPERM`). None: any.
    #[serde(default)]
    pub uids: Option<[u32; 2]>,
    #[serde(default)]
    pub gids: Option<[u32; 2]>,
    /// The directory (an absolute path) the client is limited to: its mount shows it as `/`,
    /// and every request naming an inode outside is refused (`EACCES`). None: the whole
    /// namespace.
    #[serde(default)]
    pub subtree: Option<String>,
}

fn nobody() -> u32 {
    NOBODY
}

/// What a `[[rule]]` with only `clients` means (the serde defaults above), naming every client.
impl Default for Rule {
    fn default() -> Rule {
        Rule {
            clients: vec!["*".into()],
            read_only: false,
            squash: Squash::None,
            anon_uid: NOBODY,
            anon_gid: NOBODY,
            setuid: false,
            devices: false,
            uids: None,
            gids: None,
            subtree: None,
        }
    }
}

fn in_range(range: Option<[u32; 2]>, id: u32) -> bool {
    range.is_none_or(|[first, last]| (first..=last).contains(&id))
}

fn claim(what: &str, range: Option<[u32; 2]>, id: u32) -> Result<u32> {
    match range {
        Some([first, last]) if !(first..=last).contains(&id) => Err(CairnError::new(
            ErrorKind::PermissionDenied,
            format!(
                "{what} {id} is outside the {what}s {first}-{last} this client's certificate may claim \
                 (the metaserver's access rules)"
            ),
        )),
        _ => Ok(id),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<Rule>,
}

impl Rule {
    fn matches(&self, name: &str) -> bool {
        self.clients.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }

    fn validate(&self, at: usize) -> Result<()> {
        let bad = |why: String| Err(CairnError::invalid(format!("rule {}: {why}", at + 1)));
        if self.clients.is_empty() {
            return bad("`clients` is empty: name certificates, a prefix ending in `*`, or `*`".into());
        }
        if let Some(p) = self.clients.iter().find(|p| p.is_empty() || p.trim_end_matches('*').contains('*')) {
            return bad(format!("client pattern {p:?}: a name, or a prefix ending in one `*`"));
        }
        if self.squash != Squash::None && (self.anon_uid == 0 || self.anon_gid == 0) {
            return bad("squashing to uid or gid 0 squashes nothing: set anon_uid and anon_gid".into());
        }
        for (what, range) in [("uids", self.uids), ("gids", self.gids)] {
            if let Some([first, last]) = range {
                if first > last {
                    return bad(format!("`{what} = [{first}, {last}]`: the first is above the last"));
                }
            }
        }
        if let Some(path) = self.subtree.as_deref().filter(|p| *p != "/") {
            let plain = |c: &str| !c.is_empty() && c != "." && c != "..";
            if !path.strip_prefix('/').is_some_and(|rest| rest.split('/').all(plain)) {
                return bad(format!(
                    "`subtree = {path:?}`: an absolute path of a directory (`/projects/a`), without \
                     `.`, `..`, empty or trailing components"
                ));
            }
        }
        if self.squash != Squash::None {
            let (uid, gid) = (self.anon_uid, self.anon_gid);
            if !in_range(self.uids, uid) || !in_range(self.gids, gid) {
                return bad(format!(
                    "the squash maps to {uid}:{gid}, outside the uids or gids this rule allows: \
                     every change would be refused"
                ));
            }
        }
        Ok(())
    }

    /// One line for `cairn status`: `reader-*, eval: read-only, squash root to 65534:65534`.
    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if self.read_only {
            what.push("read-only".to_string());
        }
        match self.squash {
            Squash::None => {}
            Squash::Root => what.push(format!("squash root to {}:{}", self.anon_uid, self.anon_gid)),
            Squash::All => what.push(format!("squash all to {}:{}", self.anon_uid, self.anon_gid)),
        }
        what.push(if self.setuid { "setuid allowed" } else { "no setuid" }.into());
        what.push(if self.devices { "devices allowed" } else { "no devices" }.into());
        if let Some([first, last]) = self.uids {
            what.push(format!("uids {first}-{last}"));
        }
        if let Some([first, last]) = self.gids {
            what.push(format!("gids {first}-{last}"));
        }
        if let Some(path) = &self.subtree {
            what.push(format!("subtree {path}"));
        }
        format!("{}: {}", self.clients.join(", "), what.join(", "))
    }

    /// Refuse `what` (a namespace change) to a read-only client.
    pub fn change(&self, what: &str) -> Result<()> {
        if self.read_only {
            return Err(CairnError::new(
                ErrorKind::ReadOnly,
                format!("{what}: this client's certificate is read-only by the metaserver's access rules"),
            ));
        }
        Ok(())
    }

    /// Whether this client may change an inode owned by `uid`: a squashed client acts as an
    /// owner it could have set (under root squash anyone but root; under all squash only
    /// `anon_uid`), as an NFS client whose root is squashed cannot change root's files.
    pub fn may_change_owned_by(&self, uid: u32) -> bool {
        let squash = match self.squash {
            Squash::None => true,
            Squash::Root => uid != 0,
            Squash::All => uid == self.anon_uid,
        };
        squash && in_range(self.uids, uid)
    }

    /// Whether [`Rule::may_change_owned_by`] may refuse anything (else the inode need not be
    /// read).
    pub fn limits_owners(&self) -> bool {
        self.squash != Squash::None || self.uids.is_some()
    }

    /// The owner uid an entry this client makes (or chowns to) gets: squashed, and refused
    /// outside the uids it may claim.
    pub fn claim_uid(&self, uid: u32) -> Result<u32> {
        let uid = self.uid(uid);
        claim("uid", self.uids, uid)
    }

    /// Whether a caller of this client may count group `gid` (after the squash) as its own.
    pub fn may_claim_gid(&self, gid: u32) -> bool {
        in_range(self.gids, gid)
    }

    /// As [`Rule::claim_uid`], for the group.
    pub fn claim_gid(&self, gid: u32) -> Result<u32> {
        let gid = self.gid(gid);
        claim("gid", self.gids, gid)
    }

    /// Whether an extended attribute may be set or removed: without `setuid`, none that
    /// grant privileges or that the client host's kernel guards for its root
    /// (`security.*`: file capabilities, labels; `trusted.*`); when squashed, no POSIX ACL
    /// (its entries name uids and gids the squash would not let the client set).
    pub fn xattr(&self, name: &[u8]) -> Result<()> {
        let privileged = name.starts_with(b"security.") || name.starts_with(b"trusted.");
        let acl = name == b"system.posix_acl_access" || name == b"system.posix_acl_default";
        if (!self.setuid && privileged) || (self.squash != Squash::None && acl) {
            return Err(CairnError::new(
                ErrorKind::NotPermitted,
                format!(
                    "the extended attribute {:?} is not allowed to this client's certificate by the metaserver's access rules",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        Ok(())
    }

    /// The mode a write by this client leaves on a file of `mode`: without `setuid`, its
    /// setuid bit, and its setgid bit where group execute makes it one, are cleared (as a
    /// kernel clears them when someone other than root writes), so new bytes never run with
    /// old privileges. `None`: unchanged.
    pub fn mode_after_write(&self, mode: u32) -> Option<u32> {
        if self.setuid {
            return None;
        }
        let sgid = S_ISGID | 0o010;
        let cleared = mode & !S_ISUID & if mode & sgid == sgid { !S_ISGID } else { !0 };
        (cleared != mode).then_some(cleared)
    }

    pub fn uid(&self, uid: u32) -> u32 {
        match self.squash {
            Squash::All => self.anon_uid,
            Squash::Root if uid == 0 => self.anon_uid,
            _ => uid,
        }
    }

    pub fn gid(&self, gid: u32) -> u32 {
        match self.squash {
            Squash::All => self.anon_gid,
            Squash::Root if gid == 0 => self.anon_gid,
            _ => gid,
        }
    }

    /// A mode the client sets on an entry (`dir`: a directory): setuid and setgid bits cleared
    /// unless allowed (a directory's setgid stays: it only passes the group on); a device node
    /// refused unless allowed.
    pub fn mode(&self, mode: u32, dir: bool) -> Result<u32> {
        let kind = mode & S_IFMT;
        if !self.devices && (kind == S_IFCHR || kind == S_IFBLK) {
            return Err(CairnError::new(
                ErrorKind::NotPermitted,
                "device nodes are not allowed to this client's certificate by the metaserver's access rules",
            ));
        }
        if self.setuid {
            return Ok(mode);
        }
        let dir = dir || kind == S_IFDIR;
        Ok(mode & !S_ISUID & if dir { !0 } else { !S_ISGID })
    }
}

/// The rules in force, and where they come from.
#[derive(Debug)]
pub struct Access {
    path: Option<PathBuf>,
    rules: RwLock<Arc<Vec<Rule>>>,
    /// The file's version when last read.
    seen: Mutex<Option<Stamp>>,
    /// Counts the reloads that changed the rules (shard capabilities signed before one are
    /// revoked: what they grant may have changed).
    generation: AtomicU64,
    /// Subtree paths resolved to their directories since the rules last changed.
    roots: Mutex<(u64, std::collections::HashMap<String, u64>)>,
}

impl Access {
    /// No rules: every client may do what its role allows.
    pub fn none() -> Arc<Access> {
        Arc::new(Access::new(None, Vec::new()))
    }

    fn new(path: Option<PathBuf>, rules: Vec<Rule>) -> Access {
        Access {
            path,
            rules: RwLock::new(Arc::new(rules)),
            seen: Mutex::new(None),
            generation: AtomicU64::new(0),
            roots: Mutex::new((0, std::collections::HashMap::new())),
        }
    }

    /// Rules given directly (tests).
    pub fn of(rules: Vec<Rule>) -> Result<Arc<Access>> {
        for (i, r) in rules.iter().enumerate() {
            r.validate(i)?;
        }
        Ok(Arc::new(Access::new(None, rules)))
    }

    /// The rules of `path`; a file that is missing or invalid is an error.
    pub fn load(path: &Path) -> Result<Arc<Access>> {
        let access = Access::new(Some(path.to_path_buf()), Vec::new());
        access.reload()?;
        Ok(Arc::new(access))
    }

    /// Changes whenever the rules in force change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Vec<Rule>> {
        self.rules.read().clone()
    }

    /// Read the file again; on an error the rules in force stay.
    pub fn reload(&self) -> Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let stamp = file_stamp(path);
        // A file that fails is not looked at again until it changes (or SIGHUP).
        *self.seen.lock() = stamp;
        let text = std::fs::read_to_string(path)
            .map_err(|e| CairnError::from_io(&format!("access rules {}", path.display()), &e))?;
        let file: RulesFile = toml::from_str(&text)
            .map_err(|e| CairnError::invalid(format!("access rules {}: {e}", path.display())))?;
        for (i, r) in file.rule.iter().enumerate() {
            r.validate(i)
                .map_err(|e| CairnError::invalid(format!("access rules {}: {e}", path.display())))?;
        }
        // Applied only if the file did not change while it was read (an editor writing it in
        // place may leave a valid but partial file for a moment): the next look reads it again.
        if file_stamp(path) != stamp {
            return Err(CairnError::unavailable(format!(
                "access rules {}: changed while read",
                path.display()
            )));
        }
        tracing::info!(file = %path.display(), rules = file.rule.len(), "access rules in force");
        ::metrics::gauge!(ACCESS_RULES).set(file.rule.len() as f64);
        let mut rules = self.rules.write();
        if **rules != file.rule {
            *rules = Arc::new(file.rule);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Re-read the file on `SIGHUP` and whenever it changes, for as long as the process runs.
    pub fn watch(self: &Arc<Self>) {
        if self.path.is_none() {
            return;
        }
        let access = self.clone();
        tokio::spawn(async move {
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|e| tracing::warn!("no SIGHUP handler for access rule reloads: {e}"))
                .ok();
            let mut tick = tokio::time::interval(WATCH_EVERY);
            loop {
                let forced = tokio::select! {
                    _ = tick.tick() => false,
                    Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
                };
                let path = access.path.as_deref().expect("watched with a path");
                if !forced && file_stamp(path) == *access.seen.lock() {
                    continue;
                }
                if let Err(e) = access.reload() {
                    ::metrics::counter!(ACCESS_RELOAD_FAILURES).increment(1);
                    tracing::error!("access rules not reloaded, the rules in force stay: {e}");
                }
            }
        });
    }

    /// The directory subtree `path` names: resolved by `resolve` at its first use since the
    /// rules last changed, then held by inode number (a rename of the directory moves the
    /// export with it until the rules change). A path that does not resolve is not kept.
    pub fn subtree_root(&self, path: &str, resolve: impl FnOnce(&str) -> Result<u64>) -> Result<u64> {
        let generation = self.generation();
        {
            let roots = self.roots.lock();
            if roots.0 == generation {
                if let Some(ino) = roots.1.get(path) {
                    return Ok(*ino);
                }
            }
        }
        let ino = resolve(path).map_err(|e| {
            CairnError::new(
                ErrorKind::PermissionDenied,
                format!("this client is limited to the subtree {path}, which does not resolve: {e}"),
            )
        })?;
        let mut roots = self.roots.lock();
        if roots.0 != generation {
            *roots = (generation, Default::default());
        }
        roots.1.insert(path.to_string(), ino);
        Ok(ino)
    }

    /// The rule `peer` is held to: the first that matches its certificate's name, for a
    /// caller with the client role only; `None` for servers, admins, plaintext callers and
    /// clients no rule matches.
    pub fn rule_for(&self, peer: Option<&Peer>) -> Option<Rule> {
        if !cairn_net::capability::required_of(peer) {
            return None;
        }
        let name = &peer?.name;
        self.rules.read().iter().find(|r| r.matches(name)).cloned()
    }
}

/// What tells one version of the file from another: a file replaced by rename has another
/// inode; one written in place another change time.
fn file_stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec(), meta.len()))
}

type Stamp = (u64, u64, i64, i64, u64);

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_net::tls::{Role, Roles};

    fn peer(name: &str, roles: &[Role]) -> Peer {
        Peer { addr: None, roles: Roles::of(roles), name: name.into() }
    }

    fn parse(text: &str) -> Result<Arc<Access>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.toml");
        std::fs::write(&path, text).unwrap();
        Access::load(&path)
    }

    #[test]
    fn the_first_matching_rule_applies_to_client_certificates_only() {
        let access = parse(
            r#"
            [[rule]]
            clients = ["eval-1", "job-*"]
            read_only = true
            [[rule]]
            clients = ["*"]
            squash = "root"
            "#,
        )
        .unwrap();
        let client = |name| access.rule_for(Some(&peer(name, &[Role::Client])));
        assert!(client("eval-1").unwrap().read_only);
        assert!(client("job-17").unwrap().read_only);
        assert!(!client("eval-10").unwrap().read_only, "a name, not a prefix: the catch-all");
        assert_eq!(client("eval-10").unwrap().squash, Squash::Root);
        for roles in [&[Role::Admin][..], &[Role::Meta], &[Role::Chunk], &[Role::Client, Role::Admin]] {
            assert_eq!(access.rule_for(Some(&peer("job-1", roles))), None, "{roles:?}: not held to rules");
        }
        assert_eq!(access.rule_for(Some(&Peer::plaintext(None))), None, "plaintext: no identities");
        assert_eq!(access.rule_for(None), None);
        let none = parse("").unwrap();
        assert_eq!(none.rule_for(Some(&peer("job-1", &[Role::Client]))), None, "no rules: as before");
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        for (text, says) in [
            ("[[rule]]\nclients = []\n", "`clients` is empty"),
            ("[[rule]]\nclients = [\"a*b\"]\n", "a prefix ending in one `*`"),
            ("[[rule]]\nclients = [\"\"]\n", "a prefix ending in one `*`"),
            ("[[rule]]\nclients = [\"a\"]\nreadonly = true\n", "unknown field"),
            ("[[rule]]\nclients = [\"a\"]\nsquash = \"some\"\n", "unknown variant"),
            ("[[rule]]\nclients = [\"a\"]\nsquash = \"all\"\nanon_uid = 0\n", "squashes nothing"),
            ("[rules]\n", "unknown field"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let e = Access::load(Path::new("/nonexistent/access.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/access.toml"), "{e}");
    }

    #[test]
    fn a_bad_reload_keeps_the_rules_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.toml");
        std::fs::write(&path, "[[rule]]\nclients = [\"*\"]\nread_only = true\n").unwrap();
        let access = Access::load(&path).unwrap();
        std::fs::write(&path, "[[rule]]\nclients = [\"*\"\n").unwrap();
        assert!(access.reload().is_err());
        assert!(access.rules()[0].read_only, "kept");
        let first = access.generation();
        std::fs::write(&path, "").unwrap();
        access.reload().unwrap();
        assert!(access.rules().is_empty(), "a good file replaces them");
        assert_eq!(access.generation(), first + 1);
        access.reload().unwrap();
        assert_eq!(access.generation(), first + 1, "the same rules again: no change");
    }

    #[test]
    fn squash_maps_owners() {
        let rule = |squash| Rule { squash, anon_uid: 500, anon_gid: 600, ..Rule::default() };
        let none = rule(Squash::None);
        assert_eq!((none.uid(0), none.gid(0), none.uid(7)), (0, 0, 7));
        let root = rule(Squash::Root);
        assert_eq!((root.uid(0), root.gid(0), root.uid(7), root.gid(8)), (500, 600, 7, 8));
        let all = rule(Squash::All);
        assert_eq!((all.uid(0), all.gid(0), all.uid(7), all.gid(8)), (500, 600, 500, 600));
        assert!(none.change("create").is_ok());
        assert_eq!(all.describe(), "*: squash all to 500:600, no setuid, no devices");
        let ro = Rule { read_only: true, ..none.clone() };
        let e = ro.change("create").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ReadOnly);
        assert_eq!(e.kind().errno(), libc::EROFS);
    }

    #[test]
    fn setuid_bits_and_devices_only_where_allowed() {
        let strict = Rule::default();
        assert_eq!(strict.mode(0o100000 | 0o6755, false).unwrap(), 0o100000 | 0o755, "file: both cleared");
        assert_eq!(strict.mode(0o6755, false).unwrap(), 0o755, "a chmod of a file");
        assert_eq!(
            strict.mode(0o040000 | 0o2775, true).unwrap(),
            0o040000 | 0o2775,
            "a directory's setgid stays"
        );
        assert_eq!(strict.mode(0o6775, true).unwrap(), 0o2775, "a chmod of a directory");
        for dev in [0o020000 | 0o644, 0o060000 | 0o644] {
            assert_eq!(strict.mode(dev, false).unwrap_err().kind(), ErrorKind::NotPermitted);
        }
        assert!(strict.mode(0o010000 | 0o644, false).is_ok(), "a FIFO is no device");
        assert_eq!(strict.mode_after_write(0o4755), Some(0o755));
        assert_eq!(strict.mode_after_write(0o2755), Some(0o755), "setgid with group execute");
        assert_eq!(strict.mode_after_write(0o2645), None, "setgid without group execute: a lock mark");
        assert_eq!(strict.mode_after_write(0o644), None);
        assert!(strict.xattr(b"security.capability").is_err());
        assert!(strict.xattr(b"trusted.x").is_err());
        assert!(strict.xattr(b"user.x").is_ok());
        assert!(strict.xattr(b"system.posix_acl_access").is_ok(), "not squashed");
        let squashed = Rule { squash: Squash::All, ..strict.clone() };
        assert!(squashed.xattr(b"system.posix_acl_default").is_err());
        assert!(squashed.may_change_owned_by(NOBODY) && !squashed.may_change_owned_by(1000));
        let root = Rule { squash: Squash::Root, ..strict.clone() };
        assert!(root.may_change_owned_by(1000) && !root.may_change_owned_by(0));
        let open = Rule { setuid: true, devices: true, ..strict };
        assert_eq!(open.mode_after_write(0o4755), None);
        assert_eq!(open.mode(0o100000 | 0o6755, false).unwrap(), 0o100000 | 0o6755);
        assert!(open.mode(0o020000 | 0o644, false).is_ok());
    }

    #[test]
    fn a_client_claims_only_the_owners_in_its_ranges() {
        let access = parse(
            r#"
            [[rule]]
            clients = ["job-*"]
            uids = [1000, 1999]
            gids = [100, 100]
            [[rule]]
            clients = ["squashed"]
            squash = "root"
            anon_uid = 1500
            anon_gid = 100
            uids = [1000, 1999]
            "#,
        )
        .unwrap();
        let rule = access.rule_for(Some(&peer("job-1", &[Role::Client]))).unwrap();
        assert_eq!((rule.claim_uid(1000).unwrap(), rule.claim_uid(1999).unwrap()), (1000, 1999));
        for uid in [0, 999, 2000] {
            let e = rule.claim_uid(uid).unwrap_err();
            assert_eq!(e.kind().errno(), libc::EACCES, "{e}");
            assert!(e.message().contains(&format!("uid {uid} is outside the uids 1000-1999")), "{e}");
        }
        assert_eq!(rule.claim_gid(100).unwrap(), 100);
        assert_eq!(rule.claim_gid(0).unwrap_err().kind(), ErrorKind::PermissionDenied);
        assert!(
            rule.may_change_owned_by(1500) && !rule.may_change_owned_by(0) && !rule.may_change_owned_by(2000)
        );
        assert!(rule.limits_owners());
        assert_eq!(rule.describe(), "job-*: no setuid, no devices, uids 1000-1999, gids 100-100");
        // Squashed first, then checked: root becomes the anonymous owner, inside the range.
        let squashed = access.rule_for(Some(&peer("squashed", &[Role::Client]))).unwrap();
        assert_eq!(squashed.claim_uid(0).unwrap(), 1500);
        assert!(squashed.claim_uid(7).is_err());
        assert!(squashed.claim_gid(7).is_ok(), "no gid range: any group");
        for (text, says) in [
            ("[[rule]]\nclients = [\"a\"]\nuids = [2000, 1000]\n", "the first is above the last"),
            ("[[rule]]\nclients = [\"a\"]\nuids = [1000]\n", "uids"),
            (
                "[[rule]]\nclients = [\"a\"]\nsquash = \"all\"\nuids = [1000, 1999]\n",
                "outside the uids or gids this rule allows",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_subtree_is_an_absolute_path_and_is_resolved_once_per_change_of_the_rules() {
        for bad in ["projects/a", "/projects/", "/projects//a", "/projects/./a", "/projects/../etc", ""] {
            let e = parse(&format!("[[rule]]\nclients = [\"a\"]\nsubtree = {bad:?}\n")).unwrap_err();
            assert!(e.to_string().contains("an absolute path of a directory"), "{bad:?}: {e}");
        }
        let access = parse("[[rule]]\nclients = [\"a\"]\nsubtree = \"/projects/a\"\n").unwrap();
        let rule = access.rule_for(Some(&peer("a", &[Role::Client]))).unwrap();
        assert_eq!(rule.describe(), "a: no setuid, no devices, subtree /projects/a");
        assert!(parse("[[rule]]\nclients = [\"a\"]\nsubtree = \"/\"\n").is_ok());
        // Resolved at the first use, then held (a rename does not move it); a path that does
        // not resolve is refused, and asked again next time.
        let resolved = std::cell::Cell::new(0);
        let resolve = |path: &str| {
            resolved.set(resolved.get() + 1);
            assert_eq!(path, "/projects/a");
            Ok(42)
        };
        assert_eq!(access.subtree_root("/projects/a", resolve).unwrap(), 42);
        assert_eq!(access.subtree_root("/projects/a", resolve).unwrap(), 42);
        assert_eq!(resolved.get(), 1);
        let missing = |_: &str| Err(CairnError::not_found("no entry"));
        let e = access.subtree_root("/elsewhere", missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.message().contains("/elsewhere, which does not resolve"), "{e}");
        assert!(access.subtree_root("/elsewhere", |_| Ok(7)).is_ok_and(|ino| ino == 7));
    }
}
