use super::*;

fn subject(name: &str, roles: &[Role]) -> Subject {
    Subject { name: name.into(), roles: roles.to_vec(), alt_names: vec!["127.0.0.1".into()], days: 30 }
}

/// A CA in `root/ca` and one identity per role under `root/<role>`.
fn cluster(root: &Path) -> PathBuf {
    let ca = root.join("ca");
    make_ca(&ca, 365).unwrap();
    for role in Role::ALL {
        issue(&ca, &root.join(role.name()), &subject(&format!("{role}-1"), &[role])).unwrap();
    }
    ca
}

#[test]
fn issued_certificates_carry_their_name_roles_and_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let ca = cluster(dir.path());
    let info = describe(&dir.path().join("chunk")).unwrap();
    assert_eq!(info.name, "chunk-1");
    assert_eq!(info.roles, Roles::of(&[Role::Chunk]));
    assert!(info.alt_names.contains(&"127.0.0.1".to_string()), "{:?}", info.alt_names);
    assert!((29 * 86_400..=30 * 86_400).contains(&info.expires_in()), "{}", info.expires_in());
    let id = Identity::load(&dir.path().join("admin")).unwrap();
    assert_eq!(id.cert.roles, Roles::of(&[Role::Admin]));
    assert_eq!(id.ca.name, "Cairn cluster CA");
    // The CA is never replaced; its key, and every process's key, are their owner's only.
    let err = make_ca(&ca, 365).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Exists, "{err}");
    use std::os::unix::fs::PermissionsExt;
    for key in [ca.join(CA_KEY), dir.path().join("admin").join(KEY)] {
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600, "{}", key.display());
    }
}

#[test]
fn identities_that_cannot_work_are_refused_when_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let ca = cluster(dir.path());
    // Another cluster's CA: the certificate does not chain to it.
    let other = dir.path().join("other");
    make_ca(&other, 365).unwrap();
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    std::fs::copy(other.join(CA_CERT), mixed.join(CA_CERT)).unwrap();
    std::fs::copy(dir.path().join("meta").join(CERT), mixed.join(CERT)).unwrap();
    std::fs::copy(dir.path().join("meta").join(KEY), mixed.join(KEY)).unwrap();
    let err = Identity::load(&mixed).unwrap_err();
    assert!(err.message().contains("not valid under the CA"), "{err}");
    // A key that is not the certificate's.
    std::fs::copy(ca.join(CA_CERT), mixed.join(CA_CERT)).unwrap();
    std::fs::copy(dir.path().join("chunk").join(KEY), mixed.join(KEY)).unwrap();
    let err = Identity::load(&mixed).unwrap_err();
    assert!(err.message().contains(KEY), "{err}");
    // A missing file is named.
    let err = Identity::load(&dir.path().join("nowhere")).unwrap_err();
    assert!(err.message().contains(CA_CERT), "{err}");
    // Subjects without a role or a name, or with a role hidden among the extra names.
    assert!(issue(&ca, &mixed, &subject("x", &[])).is_err());
    let mut sneaky = subject("x", &[Role::Client]);
    sneaky.alt_names.push("Admin.Cairn".into());
    assert!(issue(&ca, &mixed, &sneaky).is_err());
    assert!(issue(&ca, &mixed, &subject("", &[Role::Client])).is_err());
}

/// One handshake between `server` and `client`, the client expecting a `role` server: who the
/// server saw, or the client's error (or the server's, when the client's side succeeded).
async fn handshake(server: Arc<Identity>, client: &Identity, role: Role) -> std::io::Result<Peer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        accept(tcp, &server).await.map(|(_, alpn, peer)| (alpn, peer))
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connected = connect(tcp, client, role, Alpn::Wire).await;
    let accepted = accepted.await.unwrap();
    connected?;
    let (alpn, peer) = accepted?;
    assert_eq!(alpn, Alpn::Wire);
    Ok(peer)
}

#[tokio::test]
async fn handshakes_check_both_certificates_and_the_servers_role() {
    let dir = tempfile::tempdir().unwrap();
    cluster(dir.path());
    let load = |role: &str| Arc::new(Identity::load(&dir.path().join(role)).unwrap());
    let (meta, chunk, client) = (load("meta"), load("chunk"), load("client"));
    // A client reaching a metaserver: the server learns who it is.
    let peer = handshake(meta.clone(), &client, Role::Meta).await.unwrap();
    assert_eq!(peer.roles, Roles::of(&[Role::Client]));
    assert_eq!(peer.name, "client-1");
    // A chunkserver's certificate cannot pose as a metaserver.
    let err = handshake(chunk, &client, Role::Meta).await.unwrap_err();
    assert!(err.to_string().contains("expecting a meta server"), "{err}");
    // Another cluster's client is refused by the server (and it by the client).
    let other = tempfile::tempdir().unwrap();
    cluster(other.path());
    let stranger = Identity::load(&other.path().join("admin")).unwrap();
    assert!(handshake(meta, &stranger, Role::Meta).await.is_err());
}

#[test]
fn a_changed_directory_is_reloaded_and_a_broken_one_keeps_the_old_identity() {
    let dir = tempfile::tempdir().unwrap();
    let ca = cluster(dir.path());
    let admin = dir.path().join("admin");
    // A slot of its own: the process's identity would turn other tests' servers to TLS.
    let slot = RwLock::new(Some(Arc::new(Identity::load(&admin).unwrap())));
    let name = || slot.read().unwrap().as_ref().unwrap().cert.name.clone();
    assert!(!reload_in(&slot, false).unwrap(), "nothing changed");
    std::thread::sleep(Duration::from_millis(20));
    issue(&ca, &admin, &subject("admin-2", &[Role::Admin])).unwrap();
    assert!(reload_in(&slot, false).unwrap());
    assert_eq!(name(), "admin-2");
    std::fs::write(admin.join(CERT), "garbage").unwrap();
    assert!(reload_in(&slot, false).is_err());
    assert_eq!(name(), "admin-2", "the old identity stays");
    assert!(!reload_in(&RwLock::new(None), true).unwrap(), "plaintext: nothing to reload");
}
