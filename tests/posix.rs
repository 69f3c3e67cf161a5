//! POSIX semantics that need more than one process or client: unlink while open, byte-range
//! and flock locks across two mounts, close-to-open consistency between clients, and a client
//! that dies holding locks.

mod support;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;

use support::{eventually, random_bytes, sha256, Cluster, Mount};

const UNIT: usize = 1 << 20;

fn fcntl_lock(f: &fs::File, cmd: i32, typ: i32, start: i64, len: i64) -> std::io::Result<libc::flock> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

fn flock(f: &fs::File, op: i32) -> std::io::Result<()> {
    if unsafe { libc::flock(f.as_raw_fd(), op) } == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn unlinked_open_file_stays_readable_until_last_close() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let path = cluster.mnt.join("tmpfile");
    let data = random_bytes(3 * UNIT + 11, 1);
    fs::write(&path, &data).unwrap();
    let shards_before = cluster.shard_files().len();
    let mut f = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    // Longer than a garbage-collection round: nothing may be freed while the file is open.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(sha256(&back), sha256(&data));
    f.write_all(b"appended after unlink").unwrap();
    f.seek(SeekFrom::Start(data.len() as u64)).unwrap();
    let mut tail = String::new();
    f.read_to_string(&mut tail).unwrap();
    assert_eq!(tail, "appended after unlink");
    assert!(cluster.shard_files().len() >= shards_before);
    drop(f);
    // The last close frees it: its shards are collected.
    eventually(60, "shards of the unlinked file freed", || cluster.shard_files().is_empty());
}

#[test]
fn two_clients_see_each_others_changes_and_locks() {
    let cluster = Cluster::start(6, "4+2", 1024);
    let a = cluster.mnt.clone();
    let second = Mount::new(&cluster, "mnt2");
    let b = second.dir.clone();

    // Close-to-open: what A wrote and closed, B opens and reads; and back.
    let v1 = random_bytes(2 * UNIT + 3, 2);
    fs::write(a.join("shared"), &v1).unwrap();
    assert_eq!(sha256(&fs::read(b.join("shared")).unwrap()), sha256(&v1));
    let mut v2 = v1.clone();
    v2.extend_from_slice(&random_bytes(UNIT, 3));
    fs::write(b.join("shared"), &v2).unwrap();
    assert_eq!(sha256(&fs::read(a.join("shared")).unwrap()), sha256(&v2));
    // An append from B, then A opens again: new size and bytes, without waiting for caches.
    fs::OpenOptions::new().append(true).open(b.join("shared")).unwrap().write_all(b"tail").unwrap();
    v2.extend_from_slice(b"tail");
    let mut fa = fs::File::open(a.join("shared")).unwrap();
    let mut got = Vec::new();
    fa.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), v2.len());
    assert_eq!(sha256(&got), sha256(&v2));
    drop(fa);
    // Renames and deletes are seen by the other client.
    fs::rename(a.join("shared"), a.join("renamed")).unwrap();
    eventually(5, "rename seen by B", || b.join("renamed").exists() && !b.join("shared").exists());
    fs::remove_file(b.join("renamed")).unwrap();
    eventually(5, "delete seen by A", || !a.join("renamed").exists());

    // fcntl byte-range locks hold across clients.
    fs::write(a.join("locked"), b"0123456789").unwrap();
    let fa = fs::OpenOptions::new().read(true).write(true).open(a.join("locked")).unwrap();
    let fb = fs::OpenOptions::new().read(true).write(true).open(b.join("locked")).unwrap();
    fcntl_lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 5).unwrap();
    let err = fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 2, 1).unwrap_err();
    assert!(matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)), "{err}");
    let seen = fcntl_lock(&fb, libc::F_GETLK, libc::F_RDLCK, 0, 10).unwrap();
    assert_eq!(seen.l_type, libc::F_WRLCK as i16);
    assert_eq!(seen.l_pid as u32, std::process::id());
    // The unlocked part is free for B.
    fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 5, 5).unwrap();
    // A blocking request from B waits until A unlocks.
    let waiter = std::thread::spawn(move || fcntl_lock(&fb, libc::F_SETLKW, libc::F_WRLCK, 0, 5).map(|_| fb));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!waiter.is_finished(), "F_SETLKW returned while the range was locked");
    fcntl_lock(&fa, libc::F_SETLK, libc::F_UNLCK, 0, 5).unwrap();
    let fb = waiter.join().unwrap().unwrap();
    // Closing the descriptor drops the process's locks.
    drop(fb);
    fcntl_lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 10).unwrap();
    drop(fa);

    // flock across clients.
    let fa = fs::File::open(a.join("locked")).unwrap();
    let fb = fs::File::open(b.join("locked")).unwrap();
    flock(&fa, libc::LOCK_EX).unwrap();
    let err = flock(&fb, libc::LOCK_EX | libc::LOCK_NB).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EWOULDBLOCK));
    // The kernel sends FUSE's release (which drops a flock lock) right after close returns,
    // not before: the lock is free within moments.
    drop(fa);
    eventually(5, "flock released by close", || flock(&fb, libc::LOCK_EX | libc::LOCK_NB).is_ok());
}

#[test]
fn a_dead_client_loses_its_locks_and_open_files() {
    let parent = std::path::Path::new("/tmp");
    let cluster = Cluster::start_with(parent, 6, "4+2", 1024, &["--client-lease-ms", "3000"]);
    let mut second = Mount::new(&cluster, "mnt2");
    fs::write(cluster.mnt.join("f"), random_bytes(UNIT, 4)).unwrap();
    let shards_without_doomed = cluster.shard_files().len();
    // B locks the file and holds an unlinked file open, then dies without closing anything.
    let locker = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 8<>{0}/f; exec 9<{0}/doomed; flock -x 8; echo locked; sleep 600",
            second.dir.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn();
    fs::write(cluster.mnt.join("doomed"), random_bytes(2 * UNIT, 5)).unwrap();
    let mut locker = locker.unwrap();
    let mut line = String::new();
    std::io::BufReader::new(locker.stdout.take().unwrap()).read_line_compat(&mut line);
    assert_eq!(line.trim(), "locked");
    fs::remove_file(cluster.mnt.join("doomed")).unwrap();
    let fa = fs::File::open(cluster.mnt.join("f")).unwrap();
    assert!(flock(&fa, libc::LOCK_EX | libc::LOCK_NB).is_err(), "B holds the lock");
    assert!(cluster.shard_files().len() > shards_without_doomed, "the unlinked file is kept while B lives");
    second.kill9();
    let _ = locker.kill();
    let _ = locker.wait();
    // After B's lease runs out, its lock is gone and the unlinked file is freed.
    eventually(60, "lock of the dead client released", || flock(&fa, libc::LOCK_EX | libc::LOCK_NB).is_ok());
    eventually(60, "unlinked file freed", || cluster.shard_files().len() == shards_without_doomed);
}

trait ReadLine {
    fn read_line_compat(&mut self, line: &mut String);
}

impl<R: Read> ReadLine for std::io::BufReader<R> {
    fn read_line_compat(&mut self, line: &mut String) {
        use std::io::BufRead;
        self.read_line(line).unwrap();
    }
}

/// What `stat` says of `path` that a directory change moves.
fn dir_stat(path: &std::path::Path) -> (i64, i64, i64, i64, u64, u64, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap();
    (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), m.nlink(), m.size(), m.mode())
}

#[test]
fn a_directory_after_this_clients_changes_reads_as_the_metaserver_has_it() {
    let cluster = Cluster::start(6, "4+2", 1024);
    // A client that caches nothing: what it sees is the metaserver's view.
    let truth = Mount::with_args(&cluster, "truth", &["--attr-ttl-ms", "0"]);
    let meta_metrics = cluster.nodes.iter().find(|n| n.role == "meta").unwrap().metrics.clone().unwrap();
    let getattrs = || {
        let text = support::scrape(&meta_metrics);
        support::metric(&text, "cairn_rpc_requests_total", &["method=\"GetAttr\""]).unwrap_or(0.0)
    };
    let d = cluster.mnt.join("d");
    fs::create_dir(&d).unwrap();
    let same = |step: &str| assert_eq!(dir_stat(&d), dir_stat(&truth.dir.join("d")), "after {step}");
    same("mkdir");

    let before = getattrs();
    for i in 0..50 {
        fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    // The kernel asks for the directory's attributes again after each create in it; this
    // client answers from the metaserver's reply to the create instead of asking.
    let asked = getattrs() - before;
    assert!(asked <= 5.0, "{asked} GetAttr requests for 50 creates");
    same("creates");

    fs::remove_file(d.join("f0")).unwrap();
    same("unlink");
    fs::create_dir(d.join("sub")).unwrap();
    same("mkdir inside");
    fs::rename(d.join("f1"), d.join("g1")).unwrap();
    same("rename inside");
    fs::rename(d.join("sub"), cluster.mnt.join("moved")).unwrap();
    same("rename out");
    fs::rename(cluster.mnt.join("moved"), d.join("back")).unwrap();
    same("rename in");
    fs::remove_dir(d.join("back")).unwrap();
    same("rmdir");
    std::os::unix::fs::symlink("g1", d.join("s")).unwrap();
    same("symlink");
    fs::hard_link(d.join("g1"), d.join("h")).unwrap();
    same("link");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&d, fs::Permissions::from_mode(0o751)).unwrap();
    same("chmod");
    let name = std::ffi::CString::new("user.k").unwrap();
    let path = std::ffi::CString::new(d.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) }, 0);
    same("setxattr");
    fs::write(d.join("after"), b"y").unwrap();
    same("create after setxattr");
}

#[test]
fn a_file_reopened_right_after_close_survives_an_unlink_by_another_client() {
    // The close's release goes out late; it must not end the registration of the reopen
    // that follows it, or the other client's unlink would free a file still open here.
    let cluster = Cluster::start(6, "4+2", 1024);
    let other = Mount::new(&cluster, "other");
    let data = random_bytes(UNIT + 3, 9);
    for i in 0..20 {
        let name = format!("f{i}");
        fs::write(cluster.mnt.join(&name), &data).unwrap();
        drop(fs::File::open(cluster.mnt.join(&name)).unwrap());
        let mut f = fs::File::open(cluster.mnt.join(&name)).unwrap();
        fs::remove_file(other.dir.join(&name)).unwrap();
        // Past the release delay and a garbage-collection round.
        std::thread::sleep(std::time::Duration::from_millis(if i == 0 { 3000 } else { 50 }));
        // From the chunkservers, not the kernel's page cache.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert_eq!(sha256(&back), sha256(&data), "file {i}");
    }
    eventually(60, "shards of the unlinked files freed", || cluster.shard_files().is_empty());
}
