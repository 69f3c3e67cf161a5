//! Walking a tree of the Cairn namespace from the admin commands (`warmup`, `scrub`, `fsck`).
//!
//! The walk goes through the metaserver only (Lookup along the path, ReadDir pages, Open for
//! each regular file), so it works without a mount and never reads file data. Each regular
//! file comes back with its layout, placement and every stripe record, from which the shard ids
//! and the chunkserver of each follow (`placement[layout.position(stripe, index)]`, as the
//! client does). Files are opened under a client id of their own and released right away, so
//! an unlink during a walk behaves as usual.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use cairn_client::MetaConn;
use std::time::Duration;

use cairn_client::caller::this_process;
use cairn_common::{CairnError, ErrorKind, Layout, Result, ROOT_INO};
use cairn_net::channels::Channels;
use cairn_proto as p;
use cairn_proto::chunk_client::ChunkClient;
use futures::stream::{self, StreamExt};
use tonic::transport::Channel;

/// Directory entries per ReadDir page, and files opened at once.
const DIR_PAGE: u32 = 1024;
const OPEN_CONCURRENCY: usize = 32;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

/// A regular file as the walk found it.
pub struct Opened {
    pub ino: u64,
    /// Its path inside Cairn (one of them, for a file with several links).
    pub path: String,
    pub layout: Layout,
    pub placement: Vec<u32>,
    pub stripes: Vec<p::StripeInfo>,
}

impl Opened {
    /// Every stored, non-empty shard: (stripe record, shard index, node, shard bytes).
    pub fn shards(&self) -> impl Iterator<Item = (&p::StripeInfo, u32, u32, u64)> + '_ {
        self.stripes.iter().flat_map(move |s| {
            (0..self.layout.width()).filter_map(move |index| {
                let bytes = self.layout.shard_len(index, s.written_len);
                if s.missing & (1 << index) != 0 || bytes == 0 {
                    return None;
                }
                Some((s, index, self.placement[self.layout.position(s.index, index)], bytes))
            })
        })
    }
}

/// A client for the chunkserver at `addr`, for admin work (long deadline: a batch may verify or
/// move hundreds of MiB).
pub fn chunk_client(addr: &str) -> Result<ChunkClient<Channel>> {
    static ADMIN: std::sync::OnceLock<Channels> = std::sync::OnceLock::new();
    ADMIN.get_or_init(|| Channels::new(Duration::from_secs(3), Duration::from_secs(600))).chunk(addr)
}

/// How many of `items` (at least one) go into the next request: at most `max_items`, and no more
/// than `max_bytes` of them by `bytes`.
pub fn batch_len<T>(items: &[T], max_items: usize, max_bytes: u64, bytes: impl Fn(&T) -> u64) -> usize {
    let mut n = 0;
    let mut total = 0;
    while n < items.len() && n < max_items && (n == 0 || total + bytes(&items[n]) <= max_bytes) {
        total += bytes(&items[n]);
        n += 1;
    }
    n
}

/// Where PATH lives: the metaserver to ask and the path's components inside Cairn. A path
/// under a mounted Cairn filesystem is taken relative to that mount (whose metaserver is used
/// unless `--meta` says otherwise); anything else is a path inside the Cairn namespace.
pub fn resolve(path: &Path, meta: Option<String>) -> Result<(String, Vec<Vec<u8>>, String)> {
    use std::os::unix::ffi::OsStrExt;
    let local = path.canonicalize().ok().and_then(|canon| {
        cairn_mounts()
            .into_iter()
            .filter(|(mp, _)| canon.starts_with(mp))
            .max_by_key(|(mp, _)| mp.as_os_str().len())
            .map(|(mp, mount_meta)| (canon.strip_prefix(&mp).expect("prefix").to_path_buf(), mount_meta))
    });
    let (inner, meta) = match local {
        Some((inner, mount_meta)) => (inner, meta.unwrap_or(mount_meta)),
        None => (path.to_path_buf(), meta.unwrap_or_else(|| "127.0.0.1:9400".into())),
    };
    let mut components = Vec::new();
    for c in inner.components() {
        match c {
            std::path::Component::Normal(name) => components.push(name.as_bytes().to_vec()),
            std::path::Component::ParentDir if components.pop().is_none() => {
                return Err(CairnError::invalid(format!("{} goes above the root", path.display())));
            }
            _ => {}
        }
    }
    Ok((meta, components.clone(), shown(&components)))
}

/// `e` for PATH, explained when PATH names nothing in Cairn but exists on a local filesystem
/// that is not a Cairn mount: [`resolve`] took it as a path inside the namespace, and the user
/// most likely meant a file of that other filesystem.
pub fn explain_not_found(path: &Path, e: CairnError) -> CairnError {
    if e.kind() != ErrorKind::NotFound {
        return e;
    }
    let Ok(canon) = path.canonicalize() else { return e };
    if cairn_mounts().iter().any(|(mp, _)| canon.starts_with(mp)) {
        return e;
    }
    let on = mounts()
        .into_iter()
        .filter(|m| canon.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .map(|m| format!(" (it is on {} mounted at {})", m.fstype, m.mount_point.display()))
        .unwrap_or_default();
    CairnError::not_found(format!(
        "{} is not on a Cairn mount{on}; as a path inside the Cairn namespace: {}",
        path.display(),
        e.message()
    ))
}

pub fn shown(components: &[Vec<u8>]) -> String {
    format!("/{}", components.iter().map(|c| String::from_utf8_lossy(c)).collect::<Vec<_>>().join("/"))
}

/// Mounted Cairn filesystems: (mount point, metaserver address), from `/proc/self/mountinfo`
/// (a `cairn mount` is a FUSE filesystem with source `cairn:HOST:PORT`).
fn cairn_mounts() -> Vec<(PathBuf, String)> {
    mounts()
        .into_iter()
        .filter_map(|m| {
            let meta = m.source.strip_prefix("cairn:")?;
            let fuse = m.fstype == "fuse" || m.fstype.starts_with("fuse.");
            fuse.then(|| (m.mount_point, meta.to_string()))
        })
        .collect()
}

/// One line of `/proc/self/mountinfo`.
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// Every mount this process sees, in mount order.
pub fn mounts() -> Vec<MountEntry> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = PathBuf::from(unescape(left.split(' ').nth(4)?));
            let mut right = right.split(' ');
            let (fstype, source) = (right.next()?.to_string(), right.next()?.to_string());
            Some(MountEntry { mount_point, fstype, source })
        })
        .collect()
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The attributes of the entry at `components` (the root for none), looked up one component
/// at a time; an error names the whole path.
pub async fn lookup(conn: &MetaConn, components: &[Vec<u8>]) -> Result<p::Attr> {
    let mut attr = conn.get_attr(p::InoRequest { ino: ROOT_INO }).await?.attr;
    for name in components {
        let parent = attr.as_ref().map_or(ROOT_INO, |a| a.ino);
        attr = conn
            .lookup(p::LookupRequest { parent, name: name.clone(), caller: Some(this_process()) })
            .await
            .map_err(|e| CairnError::new(e.kind(), format!("{}: {}", shown(components), e.message())))?
            .attr;
    }
    attr.ok_or_else(|| CairnError::internal("lookup: no attributes"))
}

/// Walk the tree at `components` and hand every regular file in it to `on_file` (once per
/// inode). Returns the number of directories walked. `progress` is called after each page.
pub async fn walk(
    conn: &MetaConn,
    components: &[Vec<u8>],
    mut on_file: impl FnMut(Opened),
    mut progress: impl FnMut(),
) -> Result<usize> {
    let top = shown(components);
    let attr = lookup(conn, components).await?;
    let (ino, mode) = (attr.ino, attr.mode);
    let client_id = conn.register_client(p::Empty {}).await?.client_id;
    let mut seen = HashSet::new();
    let mut directories = 0;
    match mode & S_IFMT {
        S_IFREG => {
            seen.insert(ino);
            on_file(open_file(conn, client_id, ino, top).await?);
        }
        S_IFDIR => {
            let mut dirs = vec![(ino, if top == "/" { String::new() } else { top })];
            while let Some((dir, dir_path)) = dirs.pop() {
                directories += 1;
                let mut after = Vec::new();
                loop {
                    let page = conn
                        .read_dir(p::ReadDirRequest {
                            ino: dir,
                            after: after.clone(),
                            limit: DIR_PAGE,
                            plus: false,
                            caller: Some(this_process()),
                        })
                        .await?;
                    let mut files = Vec::new();
                    for e in &page.entries {
                        let path = format!("{dir_path}/{}", String::from_utf8_lossy(&e.name));
                        match e.mode & S_IFMT {
                            S_IFDIR if e.name != b"." && e.name != b".." => dirs.push((e.ino, path)),
                            S_IFREG if seen.insert(e.ino) => files.push((e.ino, path)),
                            _ => {}
                        }
                    }
                    let opened: Vec<Result<Option<Opened>>> = stream::iter(files)
                        .map(|(f, path)| async move {
                            match open_file(conn, client_id, f, path).await {
                                Ok(o) => Ok(Some(o)),
                                // Removed since the listing.
                                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                                Err(e) => Err(e),
                            }
                        })
                        .buffer_unordered(OPEN_CONCURRENCY)
                        .collect()
                        .await;
                    for o in opened {
                        if let Some(o) = o? {
                            on_file(o);
                        }
                    }
                    progress();
                    match page.entries.last() {
                        Some(last) if page.more => after = last.name.clone(),
                        _ => break,
                    }
                }
            }
        }
        _ => return Err(CairnError::invalid(format!("{top} is neither a regular file nor a directory"))),
    }
    Ok(directories)
}

/// Open `ino` for its layout, placement and stripe records, and release it again.
pub async fn open_file(conn: &MetaConn, client_id: u32, ino: u64, path: String) -> Result<Opened> {
    let reply = conn
        .open(p::OpenRequest { ino, client_id, generation: 0, access: 4, caller: Some(this_process()) })
        .await?;
    let listed = async {
        let info = reply.file.ok_or_else(|| CairnError::internal("open: no file info"))?;
        let layout = Layout::try_from(&info.layout.ok_or_else(|| CairnError::internal("open: no layout"))?)?;
        if info.placement.len() != layout.width() as usize {
            return Err(CairnError::corrupt(format!(
                "inode {ino}: placement has {} nodes for {layout}",
                info.placement.len()
            )));
        }
        let mut stripes = reply.stripes;
        let mut more = reply.more;
        while more {
            let from = stripes.last().map_or(0, |s| s.index + 1);
            let page = conn.list_stripes(p::ListStripesRequest { ino, from, limit: 4096 }).await?;
            stripes.extend(page.stripes);
            more = page.more;
        }
        Ok(Opened { ino, path, layout, placement: info.placement, stripes })
    }
    .await;
    if let Err(e) = conn.release(p::ReleaseRequest { client_id, ino, ..Default::default() }).await {
        tracing::debug!(ino, "release after open: {e}");
    }
    listed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_count_and_bytes_but_take_at_least_one() {
        let sizes = [10u64, 10, 10, 100, 5];
        assert_eq!(batch_len(&sizes, 2, 1000, |b| *b), 2);
        assert_eq!(batch_len(&sizes, 10, 30, |b| *b), 3);
        assert_eq!(batch_len(&sizes[3..], 10, 50, |b| *b), 1);
        assert_eq!(batch_len::<u64>(&[], 10, 50, |b| *b), 0);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }

    #[test]
    fn paths_outside_a_mount_are_namespace_paths() {
        let (meta, parts, shown) =
            resolve(Path::new("/no-such-dir-here/data/../train"), Some("h:1".into())).unwrap();
        assert_eq!(meta, "h:1");
        assert_eq!(parts, vec![b"no-such-dir-here".to_vec(), b"train".to_vec()]);
        assert_eq!(shown, "/no-such-dir-here/train");
        assert!(resolve(Path::new("/.."), None).is_err());
    }
}
