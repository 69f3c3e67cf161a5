//! A client limited to a subtree names nothing outside it, whatever inode numbers it sends.

use super::*;

fn mkdir(parent: u64, name: &str) -> MkdirRequest {
    MkdirRequest { parent, name: name.into(), mode: S_IFDIR | 0o777, ..Default::default() }
}

fn file_in(parent: u64, name: &str) -> CreateRequest {
    CreateRequest { parent, ..create(name, S_IFREG | 0o666, 0) }
}

fn limited<T: Called>(msg: T) -> Request<T> {
    client("project-a", msg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_limited_to_a_subtree_names_nothing_outside() {
    let svc = service();
    let dir = |r: tonic::Response<AttrReply>| r.into_inner().attr.unwrap().ino;
    let made = |r: tonic::Response<CreateReply>| r.into_inner().file.unwrap().attr.unwrap().ino;
    let projects = dir(svc.mkdir(root(mkdir(ROOT_INO, "projects"))).await.unwrap());
    let a = dir(svc.mkdir(root(mkdir(projects, "a"))).await.unwrap());
    let b = dir(svc.mkdir(root(mkdir(projects, "b"))).await.unwrap());
    let inside = made(svc.create(root(file_in(a, "in"))).await.unwrap());
    let outside = made(svc.create(root(file_in(b, "out"))).await.unwrap());

    // The mount is told its root; a subtree that does not resolve refuses the mount.
    let session = svc.register_client(limited(Empty {})).await.unwrap().into_inner();
    assert_eq!(session.root, a);
    assert_eq!(svc.register_client(root(Empty {})).await.unwrap().into_inner().root, 0);
    let e = svc.register_client(client("lost", Empty {})).await.unwrap_err();
    assert_eq!(kind(e.clone()), ErrorKind::PermissionDenied);
    assert!(e.message().contains("/nowhere"), "{e:?}");

    // Inside: everything as for any client.
    let look = |parent, name: &str| LookupRequest { parent, name: name.into(), caller: None };
    assert_eq!(svc.lookup(limited(look(a, "in"))).await.unwrap().into_inner().attr.unwrap().ino, inside);
    svc.get_attr(limited(InoRequest { ino: a })).await.unwrap();
    svc.read_dir(limited(ReadDirRequest { ino: a, limit: 10, ..Default::default() })).await.unwrap();
    let open = |ino| OpenRequest { ino, client_id: session.client_id, access: 6, ..Default::default() };
    svc.open(limited(open(inside))).await.unwrap();
    let sub = dir(svc.mkdir(limited(mkdir(a, "sub"))).await.unwrap());
    svc.rename(limited(rename(a, "in", sub, "in"))).await.unwrap();

    // Outside: refused, whatever the request.
    let refused = |r: Result<_, tonic::Status>, what: &str| {
        let e = r.err().unwrap_or_else(|| panic!("{what} outside the subtree was allowed"));
        assert_eq!(kind(e.clone()), ErrorKind::PermissionDenied, "{what}: {e:?}");
    };
    refused(svc.lookup(limited(look(projects, "b"))).await.map(drop), "lookup");
    refused(svc.lookup(limited(look(ROOT_INO, "projects"))).await.map(drop), "lookup at the root");
    for ino in [outside, b, projects, ROOT_INO] {
        refused(svc.get_attr(limited(InoRequest { ino })).await.map(drop), "getattr");
    }
    refused(svc.open(limited(open(outside))).await.map(drop), "open");
    let cap = CapabilityRequest { ino: outside, access: 4, caller: None };
    refused(svc.grant_capability(limited(cap)).await.map(drop), "capability");
    refused(
        svc.read_dir(limited(ReadDirRequest { ino: b, limit: 10, ..Default::default() })).await.map(drop),
        "readdir",
    );
    refused(svc.create(limited(file_in(b, "new"))).await.map(drop), "create");
    refused(svc.set_xattr(limited(set_xattr(outside, "user.x"))).await.map(drop), "setxattr");
    refused(svc.list_xattr(limited(InoRequest { ino: outside })).await.map(drop), "listxattr");
    let attrs = SetAttrRequest { ino: outside, mode: Some(0o777), ..Default::default() };
    refused(svc.set_attr(limited(attrs)).await.map(drop), "setattr");
    let commit = CommitRequest { ino: outside, size: 1, ..Default::default() };
    refused(svc.commit(limited(commit)).await.map(drop), "commit");
    let lock =
        LockRequest { client_id: session.client_id, ino: outside, typ: 1, end: 1, ..Default::default() };
    refused(svc.lock(limited(lock)).await.map(drop), "lock");
    refused(
        svc.list_stripes(limited(ListStripesRequest { ino: outside, ..Default::default() })).await.map(drop),
        "stripes",
    );
    // Nothing moves in or out, and the subtree's own entry (in the directory above) stays.
    refused(svc.rename(limited(rename(sub, "in", b, "in"))).await.map(drop), "rename out");
    refused(svc.rename(limited(rename(b, "out", a, "out"))).await.map(drop), "rename in");
    let link = |ino, new_parent| LinkRequest { ino, new_parent, new_name: "l".into(), ..Default::default() };
    refused(svc.link(limited(link(outside, a))).await.map(drop), "link in");
    refused(svc.link(limited(link(inside, b))).await.map(drop), "link out");
    let remove = RemoveRequest { parent: projects, name: "a".into(), ..Default::default() };
    refused(svc.rmdir(limited(remove)).await.map(drop), "rmdir of the subtree");
    refused(svc.rename(limited(rename(projects, "a", a, "x"))).await.map(drop), "rename of the subtree");

    // A hard link made by someone else brings a file in; a rename of the subtree's directory
    // moves the export with it (held by inode until the rules change).
    svc.link(root(link(outside, a))).await.unwrap();
    svc.get_attr(limited(InoRequest { ino: outside })).await.unwrap();
    svc.rename(root(rename(projects, "a", ROOT_INO, "moved"))).await.unwrap();
    svc.lookup(limited(look(a, "l"))).await.unwrap();
    refused(svc.get_attr(limited(InoRequest { ino: projects })).await.map(drop), "getattr");
}
