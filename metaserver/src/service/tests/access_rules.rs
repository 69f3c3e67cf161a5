//! Access rules and per-user checks applied to requests, on the service over an in-memory namespace.

use cairn_net::capability;
use cairn_net::tls::{Peer, Role, Roles};
use cairn_proto::meta_server::Meta;
use tonic::Request;

use super::*;
use crate::access::{Access, Rule, Squash};
use crate::fixture::Fixture;
use crate::MetaService;

const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFCHR: u32 = 0o020000;

fn from<T>(name: &str, roles: &[Role], msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.extensions_mut().insert(Peer { addr: None, roles: Roles::of(roles), name: name.into() });
    req
}

/// Requests that name the user they are made for, and those that name none.
trait Called {
    fn caller(&mut self) -> Option<&mut Option<Caller>>;
}

macro_rules! called {
    ($($t:ident),*) => { $(impl Called for $t {
        fn caller(&mut self) -> Option<&mut Option<Caller>> { Some(&mut self.caller) }
    })* };
}
called!(
    CapabilityRequest,
    LookupRequest,
    ReadDirRequest,
    OpenRequest,
    CreateRequest,
    MkdirRequest,
    SymlinkRequest,
    RemoveRequest,
    RenameRequest,
    LinkRequest,
    SetAttrRequest,
    XattrRequest,
    SetXattrRequest
);

macro_rules! uncalled {
    ($($t:ident),*) => { $(impl Called for $t {
        fn caller(&mut self) -> Option<&mut Option<Caller>> { None }
    })* };
}
uncalled!(Empty, InoRequest, CommitRequest, LockRequest, ListStripesRequest);

fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
    Caller { uid, gid, groups: groups.to_vec() }
}

/// `msg` from client certificate `name`, made for `caller` where it names none.
fn client_as<T: Called>(name: &str, caller: Caller, mut msg: T) -> Request<T> {
    if let Some(c) = msg.caller() {
        c.get_or_insert(caller);
    }
    from(name, &[Role::Client], msg)
}

/// `msg` from client certificate `name`, made for root (uid 1500 for `ranged`, whose rule
/// admits no root).
fn client<T: Called>(name: &str, msg: T) -> Request<T> {
    let caller = if name == "ranged" { user(1500, 1500, &[]) } else { user(0, 0, &[]) };
    client_as(name, caller, msg)
}

fn kind(status: tonic::Status) -> ErrorKind {
    CairnError::from(status).kind()
}

/// An in-memory namespace with three chunkservers (a 2+1 layout).
fn namespace() -> Fixture {
    let ns = Fixture::memory(cairn_common::Layout::new(2, 1, 4096).unwrap());
    for i in 0..3 {
        ns.registry()
            .register(&format!("node-{i}"), &format!("127.0.0.1:{}", 1000 + i), vec![], 1, "")
            .unwrap();
    }
    ns
}

fn service() -> MetaService {
    let rule = |clients: &[&str]| Rule {
        clients: clients.iter().map(|c| c.to_string()).collect(),
        anon_uid: 500,
        anon_gid: 600,
        ..Rule::default()
    };
    let access = Access::of(vec![
        Rule { read_only: true, ..rule(&["reader", "eval-*"]) },
        Rule { squash: Squash::All, ..rule(&["squashed"]) },
        Rule { squash: Squash::Root, ..rule(&["root-squashed"]) },
        Rule { uids: Some([1000, 1999]), gids: Some([1000, 1999]), ..rule(&["ranged"]) },
        Rule { subtree: Some("/projects/a".into()), ..rule(&["project-a"]) },
        Rule { subtree: Some("/nowhere".into()), ..rule(&["lost"]) },
    ])
    .unwrap();
    let f = namespace();
    // Anyone may make entries at the top (the per-user checks are tested on their own).
    f.ns.setattr(&SetAttrRequest { ino: ROOT_INO, mode: Some(0o777), ..Default::default() }).unwrap();
    MetaService::new(f.ns.clone(), f.cluster.clone()).with_access(access)
}

fn rename(parent: u64, name: &str, new_parent: u64, new_name: &str) -> RenameRequest {
    RenameRequest { parent, name: name.into(), new_parent, new_name: new_name.into(), ..Default::default() }
}

fn set_xattr(ino: u64, name: &str) -> SetXattrRequest {
    SetXattrRequest { ino, name: name.into(), value: vec![1], ..Default::default() }
}

fn create(name: &str, mode: u32, uid: u32) -> CreateRequest {
    CreateRequest { parent: ROOT_INO, name: name.into(), mode, uid, gid: uid, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_client_reads_and_changes_nothing() {
    let svc = service();
    let made = svc.create(client("writer", create("f", S_IFREG | 0o644, 1000))).await.unwrap().into_inner();
    let ino = made.file.unwrap().attr.unwrap().ino;
    let writer = svc.register_client(client("writer", Empty {})).await.unwrap().into_inner();
    let open = OpenRequest { caller: None, access: 6, ino, client_id: writer.client_id, generation: 1 };
    let opened = svc.open(client("writer", open)).await.unwrap().into_inner();
    assert_eq!(opened.cap.unwrap().ops, capability::READ | capability::WRITE);
    assert!(svc.register_client(client("eval-3", Empty {})).await.unwrap().into_inner().read_only);
    let registered = svc.register_client(client("reader", Empty {})).await.unwrap().into_inner();
    assert!(registered.read_only, "told to mount read-only");
    assert!(!svc.register_client(client("writer", Empty {})).await.unwrap().into_inner().read_only);

    // Every change is refused with EROFS, and none happened.
    let reader = "reader";
    let refused = [
        svc.create(client(reader, create("g", S_IFREG | 0o644, 1000))).await.err(),
        svc.mkdir(client(
            reader,
            MkdirRequest { parent: ROOT_INO, name: "d".into(), mode: 0o755, ..Default::default() },
        ))
        .await
        .err(),
        svc.unlink(client(
            reader,
            RemoveRequest { caller: None, parent: ROOT_INO, name: "f".into(), once: None },
        ))
        .await
        .err(),
        svc.rmdir(client(
            reader,
            RemoveRequest { caller: None, parent: ROOT_INO, name: "f".into(), once: None },
        ))
        .await
        .err(),
        svc.rename(client(
            reader,
            RenameRequest {
                parent: ROOT_INO,
                name: "f".into(),
                new_parent: ROOT_INO,
                new_name: "h".into(),
                ..Default::default()
            },
        ))
        .await
        .err(),
        svc.link(client(
            reader,
            LinkRequest { caller: None, ino, new_parent: ROOT_INO, new_name: "l".into(), once: None },
        ))
        .await
        .err(),
        svc.symlink(client(
            reader,
            SymlinkRequest { parent: ROOT_INO, name: "s".into(), target: "f".into(), ..Default::default() },
        ))
        .await
        .err(),
        svc.set_attr(client(reader, SetAttrRequest { ino, size: Some(0), ..Default::default() })).await.err(),
        svc.set_xattr(client(
            reader,
            SetXattrRequest { ino, name: "user.a".into(), value: "1".into(), ..Default::default() },
        ))
        .await
        .err(),
        svc.remove_xattr(client(reader, XattrRequest { ino, name: "user.a".into(), ..Default::default() }))
            .await
            .err(),
        svc.commit(client(reader, CommitRequest { ino, size: 1 << 20, ..Default::default() })).await.err(),
    ];
    for (i, e) in refused.into_iter().enumerate() {
        let e = e.unwrap_or_else(|| panic!("change {i} was not refused"));
        assert_eq!(kind(e), ErrorKind::ReadOnly, "change {i}");
    }
    let names = svc
        .read_dir(client(reader, ReadDirRequest { ino: ROOT_INO, limit: 100, ..Default::default() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names.entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), vec![b"f".to_vec()]);
    let attr = svc.get_attr(client(reader, InoRequest { ino })).await.unwrap().into_inner().attr.unwrap();
    assert_eq!((attr.size, attr.mode), (0, S_IFREG | 0o644), "nothing changed");

    // Reads are served, with capabilities that only read.
    let open = OpenRequest { caller: None, access: 6, ino, client_id: registered.client_id, generation: 1 };
    let opened = svc.open(client(reader, open)).await.unwrap().into_inner();
    assert_eq!(opened.cap.unwrap().ops, capability::READ);
    let renewed = svc
        .grant_capability(client(reader, CapabilityRequest { ino, access: 6, caller: None }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.ops, capability::READ);
    // Locks are no change.
    let lock =
        LockRequest { ino, client_id: registered.client_id, owner: 1, typ: 0, end: 10, ..Default::default() };
    svc.lock(client(reader, lock)).await.unwrap();

    // An admin's certificate of the same name is not held to the rule; neither is a
    // client certificate no rule names.
    let admin = from(reader, &[Role::Admin], create("by-admin", S_IFREG | 0o644, 0));
    svc.create(admin).await.unwrap();
    svc.create(client("someone", create("by-someone", S_IFREG | 0o644, 0))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squashed_client_gets_no_root_files_setuid_bits_or_devices() {
    let svc = service();
    let who = "squashed";
    let made = svc.create(client(who, create("suid", S_IFREG | 0o6755, 0))).await.unwrap().into_inner();
    let attr = made.file.unwrap().attr.unwrap();
    assert_eq!((attr.uid, attr.gid, attr.mode), (500, 600, S_IFREG | 0o755));
    let dir = svc
        .mkdir(client(
            who,
            MkdirRequest {
                caller: None,
                parent: ROOT_INO,
                name: "d".into(),
                mode: 0o2775,
                uid: 7,
                gid: 8,
                once: None,
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .attr
        .unwrap();
    assert_eq!((dir.uid, dir.gid, dir.mode), (500, 600, S_IFDIR | 0o2775), "a directory's setgid stays");
    let e = svc.create(client(who, create("tty", S_IFCHR | 0o666, 0))).await.unwrap_err();
    assert_eq!(kind(e), ErrorKind::NotPermitted);
    let link = SymlinkRequest {
        caller: None,
        parent: ROOT_INO,
        name: "s".into(),
        target: "suid".into(),
        uid: 0,
        gid: 0,
        once: None,
    };
    let s = svc.symlink(client(who, link)).await.unwrap().into_inner().attr.unwrap();
    assert_eq!((s.uid, s.gid), (500, 600));
    // chown to root and chmod u+s: mapped and cleared.
    let set = SetAttrRequest {
        ino: attr.ino,
        uid: Some(0),
        gid: Some(0),
        mode: Some(0o4711),
        ..Default::default()
    };
    let after = svc.set_attr(client(who, set)).await.unwrap().into_inner().attr.unwrap();
    assert_eq!((after.uid, after.gid, after.mode), (500, 600, S_IFREG | 0o711));
    let set = SetAttrRequest { ino: dir.ino, mode: Some(0o6770), ..Default::default() };
    let after = svc.set_attr(client(who, set)).await.unwrap().into_inner().attr.unwrap();
    assert_eq!(after.mode, S_IFDIR | 0o2770, "chmod of a directory: setgid stays, setuid goes");
    let cap = set_xattr(attr.ino, "security.capability");
    assert_eq!(kind(svc.set_xattr(client(who, cap)).await.unwrap_err()), ErrorKind::NotPermitted);
    let acl = set_xattr(attr.ino, "system.posix_acl_access");
    assert_eq!(kind(svc.set_xattr(client(who, acl)).await.unwrap_err()), ErrorKind::NotPermitted);
    // Another client, no rule: what it sends is stored.
    let made =
        svc.create(client("writer", create("root-suid", S_IFREG | 0o4755, 0))).await.unwrap().into_inner();
    let attr = made.file.unwrap().attr.unwrap();
    assert_eq!((attr.uid, attr.gid, attr.mode), (0, 0, S_IFREG | 0o4755));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_claims_only_the_owners_its_rule_allows() {
    let svc = service();
    let who = "ranged";
    let made = svc.create(client(who, create("in", S_IFREG | 0o644, 1500))).await.unwrap().into_inner();
    let mine = made.file.unwrap().attr.unwrap();
    assert_eq!((mine.uid, mine.gid), (1500, 1500));
    // Entries owned outside its ranges: EACCES, and nothing made.
    let mkdir = MkdirRequest {
        caller: None,
        parent: ROOT_INO,
        name: "d".into(),
        mode: 0o755,
        uid: 0,
        gid: 1500,
        once: None,
    };
    let symlink = SymlinkRequest {
        caller: None,
        parent: ROOT_INO,
        name: "s".into(),
        target: "in".into(),
        uid: 1500,
        gid: 2000,
        once: None,
    };
    let refused = [
        svc.create(client(who, create("root-owned", S_IFREG | 0o644, 0))).await.err(),
        svc.mkdir(client(who, mkdir)).await.err(),
        svc.symlink(client(who, symlink)).await.err(),
        svc.set_attr(client(who, SetAttrRequest { ino: mine.ino, uid: Some(0), ..Default::default() }))
            .await
            .err(),
        svc.set_attr(client(who, SetAttrRequest { ino: mine.ino, gid: Some(999), ..Default::default() }))
            .await
            .err(),
    ];
    for (i, e) in refused.into_iter().enumerate() {
        let e = e.unwrap_or_else(|| panic!("change {i} was not refused"));
        assert_eq!(kind(e), ErrorKind::PermissionDenied, "{i}");
    }
    for name in ["root-owned", "d", "s"] {
        let e = svc
            .lookup(client(who, LookupRequest { caller: None, parent: ROOT_INO, name: name.into() }))
            .await;
        assert_eq!(kind(e.unwrap_err()), ErrorKind::NotFound, "{name}");
    }
    let attr = svc.get_attr(client(who, InoRequest { ino: mine.ino })).await.unwrap().into_inner();
    assert_eq!(attr.attr.unwrap().uid, 1500, "unchanged");
    // A chgrp to a group in the range that the caller is in goes through; root's files it may
    // not act on.
    let chgrp = SetAttrRequest { ino: mine.ino, gid: Some(1000), ..Default::default() };
    let after = svc.set_attr(client_as(who, user(1500, 1500, &[1000]), chgrp)).await.unwrap();
    let after = after.into_inner().attr.unwrap();
    assert_eq!((after.uid, after.gid), (1500, 1000));
    let made = svc.create(client("writer", create("roots", S_IFREG | 0o666, 0))).await.unwrap();
    let roots = made.into_inner().file.unwrap().attr.unwrap().ino;
    let touch = SetAttrRequest { ino: roots, mode: Some(0o600), ..Default::default() };
    assert_eq!(kind(svc.set_attr(client(who, touch)).await.unwrap_err()), ErrorKind::NotPermitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squashed_root_cannot_change_roots_files_nor_keep_privileges_through_a_write() {
    let svc = service();
    let who = "root-squashed";
    // Root's setuid binary, and a user's setgid program with file capabilities.
    let made = svc.create(client("writer", create("su", S_IFREG | 0o4755, 0))).await.unwrap().into_inner();
    let su = made.file.unwrap().attr.unwrap().ino;
    let made =
        svc.create(client("writer", create("prog", S_IFREG | 0o6755, 1000))).await.unwrap().into_inner();
    let prog = made.file.unwrap().attr.unwrap().ino;
    svc.set_xattr(client("writer", set_xattr(prog, "security.capability"))).await.unwrap();
    let tty = svc.create(client("writer", create("tty", S_IFCHR | 0o600, 0))).await.unwrap().into_inner();
    let tty = tty.file.unwrap().attr.unwrap().ino;

    // Root's files: no write, truncate, chmod, touch or xattr from a squashed root.
    let refused = [
        svc.commit(client(who, CommitRequest { ino: su, ..Default::default() })).await.err(),
        svc.set_attr(client(who, SetAttrRequest { ino: su, size: Some(0), ..Default::default() }))
            .await
            .err(),
        svc.set_attr(client(who, SetAttrRequest { ino: su, mode: Some(0o777), ..Default::default() }))
            .await
            .err(),
        svc.set_attr(client(who, SetAttrRequest { ino: su, atime_now: true, ..Default::default() }))
            .await
            .err(),
        svc.set_xattr(client(who, set_xattr(su, "user.a"))).await.err(),
        svc.set_attr(client(
            who,
            SetAttrRequest { ino: tty, mode: Some(S_IFCHR | 0o666), ..Default::default() },
        ))
        .await
        .err(),
    ];
    for (i, e) in refused.into_iter().enumerate() {
        assert_eq!(
            kind(e.unwrap_or_else(|| panic!("change {i} was not refused"))),
            ErrorKind::NotPermitted,
            "{i}"
        );
    }
    let attr = svc.get_attr(client(who, InoRequest { ino: su })).await.unwrap().into_inner().attr.unwrap();
    assert_eq!(attr.mode, S_IFREG | 0o4755, "unchanged");

    // Its own files it may not give away; a group change stays.
    let mine = svc.create(client(who, create("mine", S_IFREG | 0o644, 0))).await.unwrap().into_inner();
    let mine = mine.file.unwrap().attr.unwrap().ino;
    let give = SetAttrRequest { ino: mine, uid: Some(1000), ..Default::default() };
    assert_eq!(kind(svc.set_attr(client(who, give)).await.unwrap_err()), ErrorKind::NotPermitted);
    let chgrp = SetAttrRequest { ino: mine, gid: Some(1000), ..Default::default() };
    let after = svc.set_attr(client_as(who, user(0, 0, &[1000]), chgrp)).await.unwrap();
    let after = after.into_inner().attr.unwrap();
    assert_eq!((after.uid, after.gid), (500, 1000));

    // The user's program: a write drops its setuid and setgid bits and its capabilities.
    svc.commit(client(who, CommitRequest { ino: prog, ..Default::default() })).await.unwrap();
    let attr = svc.get_attr(client(who, InoRequest { ino: prog })).await.unwrap().into_inner().attr.unwrap();
    assert_eq!(attr.mode, S_IFREG | 0o755);
    let caps = svc
        .get_xattr(client(
            who,
            XattrRequest { caller: None, ino: prog, name: "security.capability".into(), once: None },
        ))
        .await;
    assert_eq!(kind(caps.unwrap_err()), ErrorKind::NoData, "capabilities dropped");
    for name in ["security.capability", "security.selinux", "trusted.overlay.opaque"] {
        let e = svc.set_xattr(client(who, set_xattr(prog, name))).await.unwrap_err();
        assert_eq!(kind(e), ErrorKind::NotPermitted, "{name}");
    }
    // As the file's owner, a user attribute; and a chmod of a device node it may change (the
    // kernel sends the file type too).
    let owner = user(1000, 1000, &[]);
    svc.set_xattr(client_as(who, owner.clone(), set_xattr(prog, "user.note"))).await.unwrap();
    let made =
        svc.create(client("writer", create("tty2", S_IFCHR | 0o600, 1000))).await.unwrap().into_inner();
    let tty2 = made.file.unwrap().attr.unwrap().ino;
    let set = SetAttrRequest { ino: tty2, mode: Some(S_IFCHR | 0o660), ..Default::default() };
    let after = svc.set_attr(client_as(who, owner, set)).await.unwrap().into_inner().attr.unwrap();
    assert_eq!(after.mode, S_IFCHR | 0o660);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_the_rules_revokes_the_capabilities_signed_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.toml");
    std::fs::write(&path, "").unwrap();
    let access = Access::load(&path).unwrap();
    let f = namespace();
    let svc = MetaService::new(f.ns.clone(), f.cluster.clone()).with_access(access.clone());
    let made = svc.create(client("job", create("f", S_IFREG | 0o644, 1000))).await.unwrap().into_inner();
    let ino = made.file.unwrap().attr.unwrap().ino;
    let before = svc
        .grant_capability(client("job", CapabilityRequest { ino, access: 6, caller: None }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.ops, capability::READ | capability::WRITE);
    let chunkserver = capability::Verifier::default();
    chunkserver.learn(&svc.signer().keys());
    assert_eq!(chunkserver.check(Some(&before), ino, capability::WRITE, "job"), Ok(()));

    // Rules that change nothing for this client change nothing for its tokens.
    access.reload().unwrap();
    let same = svc
        .grant_capability(client("job", CapabilityRequest { ino, access: 6, caller: None }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.key_id, before.key_id);

    std::fs::write(&path, "[[rule]]\nclients = [\"job\"]\nread_only = true\n").unwrap();
    access.reload().unwrap();
    let after = svc
        .grant_capability(client("job", CapabilityRequest { ino, access: 6, caller: None }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.ops, capability::READ);
    assert_ne!(after.key_id, before.key_id, "signed with a new key");
    let keys = svc.signer().keys();
    let old = keys.iter().find(|k| k.id == before.key_id).expect("the revoked key is announced");
    assert!(old.retire <= cairn_common::time::unix_secs(), "retired at the revocation");
    chunkserver.learn(&keys);
    assert_eq!(chunkserver.check(Some(&after), ino, capability::READ, "job"), Ok(()));
}

/// Every client certificate's requests are checked against the user they name, whatever its
/// rules: what that user may not do is refused though the client host's kernel let it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_acts_only_as_the_user_it_names_may() {
    let svc = service();
    let mkdir = |parent, name: &str, mode, uid| MkdirRequest {
        parent,
        name: name.into(),
        mode: S_IFDIR | mode,
        uid,
        gid: uid,
        ..Default::default()
    };
    let private = svc.mkdir(root(mkdir(ROOT_INO, "private", 0o700, 0))).await.unwrap().into_inner();
    let private = private.attr.unwrap().ino;
    let mut secret = create("secret", S_IFREG | 0o600, 0);
    secret.parent = private;
    svc.create(root(secret)).await.unwrap();
    let public = svc.create(root(create("public", S_IFREG | 0o644, 0))).await.unwrap().into_inner();
    let public = public.file.unwrap().attr.unwrap().ino;
    let tmp =
        svc.mkdir(root(mkdir(ROOT_INO, "tmp", 0o1777, 0))).await.unwrap().into_inner().attr.unwrap().ino;

    let errno = |e: tonic::Status| CairnError::from(e).kind().errno();

    // No caller named: refused, with the reason.
    let e =
        svc.lookup(client_as_nobody(LookupRequest { parent: ROOT_INO, name: "public".into(), caller: None }));
    let e = e.await.unwrap_err();
    assert_eq!(errno(e.clone()), libc::EACCES);
    assert!(e.message().contains("names no caller"), "{e:?}");

    // A private directory: no lookup, no listing.
    let look = LookupRequest { parent: private, name: "secret".into(), caller: None };
    assert_eq!(errno(svc.lookup(alice(look.clone())).await.unwrap_err()), libc::EACCES);
    assert!(svc.lookup(root(look)).await.is_ok());
    let list = ReadDirRequest { ino: private, limit: 10, ..Default::default() };
    assert_eq!(errno(svc.read_dir(alice(list.clone())).await.unwrap_err()), libc::EACCES);
    let later = ReadDirRequest { after: "a".into(), ..list };
    assert!(svc.read_dir(alice(later)).await.is_ok(), "later pages belong to an open directory");

    // Root's world-readable file: opened for reading with a capability, not for writing.
    let session = svc.register_client(client("someone", Empty {})).await.unwrap().into_inner();
    let open =
        |access| OpenRequest { ino: public, client_id: session.client_id, access, ..Default::default() };
    let opened = svc.open(alice(open(4))).await.unwrap().into_inner();
    assert_eq!(opened.cap.unwrap().ops, capability::READ, "a token that only reads");
    let renew = |access| CapabilityRequest { ino: public, access, caller: None };
    assert_eq!(svc.grant_capability(alice(renew(4))).await.unwrap().into_inner().ops, capability::READ);
    let e = svc.grant_capability(alice(renew(6))).await.unwrap_err();
    assert_eq!(errno(e), libc::EACCES, "a renewal is checked as the open was");
    let writer = svc.open(root(open(6))).await.unwrap().into_inner();
    assert_eq!(writer.cap.unwrap().ops, capability::READ | capability::WRITE);
    for access in [2, 6, 0] {
        assert_eq!(errno(svc.open(alice(open(access))).await.unwrap_err()), libc::EACCES, "access {access}");
    }
    let truncate = SetAttrRequest { ino: public, size: Some(0), ..Default::default() };
    assert_eq!(errno(svc.set_attr(alice(truncate)).await.unwrap_err()), libc::EACCES);
    let chmod = SetAttrRequest { ino: public, mode: Some(0o666), ..Default::default() };
    assert_eq!(errno(svc.set_attr(alice(chmod)).await.unwrap_err()), libc::EPERM);
    // A create that finds it neither opens it nor grants a capability: the open that follows
    // is checked.
    let again =
        CreateRequest { open: true, client_id: session.client_id, ..create("public", S_IFREG | 0o644, 1000) };
    let again = svc.create(alice(again)).await.unwrap().into_inner();
    assert!(!again.created && again.cap.is_none(), "{again:?}");

    // Entries: a user's own only, in directories it may write.
    let e = svc.create(alice(create("as-root", S_IFREG | 0o644, 0))).await.unwrap_err();
    assert_eq!(errno(e), libc::EACCES, "owned by someone else");
    let mut in_private = create("mine", S_IFREG | 0o644, 1000);
    in_private.parent = private;
    assert_eq!(errno(svc.create(alice(in_private)).await.unwrap_err()), libc::EACCES);
    let in_tmp = |name: &str, uid| CreateRequest { parent: tmp, ..create(name, S_IFREG | 0o644, uid) };
    svc.create(alice(in_tmp("alices", 1000))).await.unwrap();
    // A sticky directory keeps others' entries.
    let remove = |name: &str| RemoveRequest { parent: tmp, name: name.into(), ..Default::default() };
    assert_eq!(errno(svc.unlink(bob(remove("alices"))).await.unwrap_err()), libc::EPERM);
    let steal = rename(tmp, "alices", tmp, "bobs");
    assert_eq!(errno(svc.rename(bob(steal.clone())).await.unwrap_err()), libc::EPERM);
    svc.rename(alice(steal)).await.unwrap();
    svc.unlink(alice(remove("bobs"))).await.unwrap();

    // A directory moved to another parent needs write on itself (its `..` changes).
    svc.mkdir(bob(mkdir(ROOT_INO, "bobs-dir", 0o755, 2000))).await.unwrap();
    let move_out = rename(ROOT_INO, "bobs-dir", tmp, "moved");
    assert_eq!(errno(svc.rename(alice(move_out.clone())).await.unwrap_err()), libc::EACCES);
    svc.rename(bob(move_out)).await.unwrap();

    // Extended attributes: a user's by permission, root's trusted ones hidden.
    let note = |ino| XattrRequest { ino, name: "user.note".into(), ..Default::default() };
    svc.set_xattr(root(set_xattr(public, "user.note"))).await.unwrap();
    svc.set_xattr(root(set_xattr(public, "trusted.t"))).await.unwrap();
    assert!(svc.get_xattr(alice(note(public))).await.is_ok(), "readable by all");
    let trusted = XattrRequest { ino: public, name: "trusted.t".into(), ..Default::default() };
    assert_eq!(errno(svc.get_xattr(alice(trusted)).await.unwrap_err()), libc::ENODATA);
    assert_eq!(errno(svc.set_xattr(alice(set_xattr(public, "user.x"))).await.unwrap_err()), libc::EACCES);
    assert_eq!(errno(svc.remove_xattr(alice(note(public))).await.unwrap_err()), libc::EACCES);

    // Servers and admins are not checked.
    let admin =
        from("ops", &[Role::Admin], LookupRequest { parent: private, name: "secret".into(), caller: None });
    assert!(svc.lookup(admin).await.is_ok());
}

/// Requests of client certificate `someone`, which no rule names, for root, alice and bob.
fn root<T: Called>(msg: T) -> Request<T> {
    client("someone", msg)
}

fn alice<T: Called>(msg: T) -> Request<T> {
    client_as("someone", user(1000, 1000, &[]), msg)
}

fn bob<T: Called>(msg: T) -> Request<T> {
    client_as("someone", user(2000, 2000, &[]), msg)
}

/// A client certificate's request that names no caller (a mount older than the metaserver).
fn client_as_nobody<T>(msg: T) -> Request<T> {
    from("someone", &[Role::Client], msg)
}

mod subtree;
