//! The client without servers: the metaserver's own service over a namespace in memory and six
//! fake chunkservers (`crate::fakes`), one or two `Client`s on them as two mounts would be.
//! Checked here: a file's round trip, the write-back task, and the answers that come back
//! after this client changed the file meanwhile (held back with `MemoryMeta::hold`), which
//! must be asked for again rather than bring back an older file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{ErrorKind, Layout, ROOT_INO};
use cairn_proto as p;

use super::{Client, ClientOptions, Durability};
use crate::fakes::{FakeChunk, FakeChunks, MemoryMeta};
use crate::nodes::Nodes;

/// Six chunkservers for 4+2 stripes of 4 KiB units.
struct Servers {
    meta: Arc<MemoryMeta>,
    chunks: Vec<Arc<FakeChunk>>,
}

impl Servers {
    async fn new() -> Servers {
        let meta = MemoryMeta::new(Layout::new(4, 2, 4096).unwrap(), 6).await;
        Servers { meta, chunks: (0..6).map(|_| Arc::default()).collect() }
    }

    /// A client on these servers, as a mount would make it.
    async fn mount(&self, options: ClientOptions) -> Arc<Client> {
        let directory = Arc::new(FakeChunks::new(self.meta.clone(), self.chunks.clone()));
        let nodes = Nodes::with_directory(directory, 0);
        Client::start(self.meta.clone(), nodes, options).await.expect("client")
    }

    /// Shards stored, over every chunkserver.
    fn shards(&self) -> usize {
        self.chunks.iter().map(|c| c.shards.lock().len()).sum()
    }
}

/// Only close and fsync commit, unless a test says otherwise.
fn options() -> ClientOptions {
    ClientOptions {
        attr_ttl: Duration::from_secs(1),
        block_cache_bytes: 0,
        commit_interval: Duration::ZERO,
        write_wait: Duration::ZERO,
        durability: Durability::Close,
        readahead_bytes: 1 << 20,
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Create `name` in the root and open it: (inode, handle).
async fn create(client: &Client, name: &str) -> (u64, u64) {
    let req = p::CreateRequest {
        parent: ROOT_INO,
        name: name.as_bytes().to_vec(),
        mode: libc::S_IFREG | 0o644,
        exclusive: true,
        ..Default::default()
    };
    let (attr, fh) = client.create(req, true, false, 6).await.expect("create");
    (attr.ino, fh)
}

async fn read_all(client: &Client, fh: u64, len: usize) -> Vec<u8> {
    client.read(fh, 0, len as u32 + 1).await.expect("read").to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_through_one_client_reads_back_through_another() {
    let servers = Servers::new().await;
    let (a, b) = (servers.mount(options()).await, servers.mount(options()).await);
    let data = bytes(100_000, 1); // six stripes and a part
    let (ino, fh) = create(&a, "f").await;
    a.write(fh, 0, &data).await.unwrap();
    a.release(fh).await.unwrap();
    // Six whole stripes, and the short last one: its one data shard and two parity shards.
    assert_eq!(servers.shards(), 6 * 6 + 3);

    let attr = b.lookup(ROOT_INO, b"f", &root()).await.unwrap();
    assert_eq!((attr.ino, attr.size), (ino, data.len() as u64));
    let opened = b.open(ino, false, 6, &root()).await.unwrap();
    assert_eq!(read_all(&b, opened.fh, data.len()).await, data);
    b.release(opened.fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_back_task_commits_a_file_left_open() {
    let servers = Servers::new().await;
    let writer =
        servers.mount(ClientOptions { commit_interval: Duration::from_millis(100), ..options() }).await;
    let reader = servers.mount(options()).await;
    let data = bytes(40_000, 2);
    let (ino, fh) = create(&writer, "open").await;
    writer.write(fh, 0, &data).await.unwrap();

    // Never closed, never synced: the other client sees it committed within a few intervals.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.getattr(ino).await.unwrap().size != data.len() as u64 {
        assert!(Instant::now() < deadline, "the open file was not written back in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = reader.open(ino, false, 6, &root()).await.unwrap();
    assert_eq!(read_all(&reader, opened.fh, data.len()).await, data);
    writer.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_answered_before_this_clients_commit_are_asked_again() {
    let servers = Servers::new().await;
    let client = servers.mount(options()).await;
    let data = bytes(20_000, 3);
    let (ino, fh) = create(&client, "stat").await;
    client.write(fh, 0, &data).await.unwrap();

    // A stat whose answer (size 0: nothing committed yet) is delivered only after the close.
    let hold = servers.meta.hold("get_attr");
    let stat = tokio::spawn({
        let client = client.clone();
        async move { client.getattr(ino).await }
    });
    hold.reached().await;
    client.release(fh).await.unwrap();
    hold.release();
    let attr = stat.await.unwrap().unwrap();
    assert_eq!(attr.size, data.len() as u64, "a size older than this client's own close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_answered_before_this_clients_commit_is_asked_again() {
    let servers = Servers::new().await;
    let client = servers.mount(options()).await;
    let data = bytes(50_000, 4);
    let (ino, fh) = create(&client, "open").await;
    client.write(fh, 0, &data).await.unwrap();

    // A second open of the file whose answer (no stripes, size 0) comes back after the first
    // handle's close committed the data and forgot the open file.
    let hold = servers.meta.hold("open");
    let open = tokio::spawn({
        let client = client.clone();
        async move { client.open(ino, false, 6, &root()).await }
    });
    hold.reached().await;
    client.release(fh).await.unwrap();
    hold.release();
    let opened = open.await.unwrap().unwrap();
    assert_eq!(read_all(&client, opened.fh, data.len()).await, data, "the open brought back an older file");
    client.release(opened.fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_answered_after_a_release_that_covers_it_is_asked_again() {
    let servers = Servers::new().await;
    let client = servers.mount(options()).await;
    let (ino, first) = create(&client, "gen").await;

    // Open B is counted by the metaserver, but its answer is held; open C registers meanwhile,
    // and the close of the first handle and C releases the file up to C's generation, which
    // is newer than B's: the metaserver no longer counts B.
    let hold = servers.meta.hold("open");
    let b = tokio::spawn({
        let client = client.clone();
        async move { client.open(ino, false, 6, &root()).await }
    });
    hold.reached().await;
    let c = client.open(ino, false, 6, &root()).await.unwrap();
    client.release(first).await.unwrap();
    client.release(c.fh).await.unwrap();
    client.flush_releases().await;
    hold.release();
    let b = b.await.unwrap().unwrap();

    // B must have asked again, so the metaserver counts it: unlinked, the file stays.
    client.unlink(ROOT_INO, b"gen", &root()).await.unwrap();
    let stat = servers.meta.get_attr_of(ino).await;
    assert!(stat.is_ok(), "an unlinked file open on this client was freed: {stat:?}");
    client.release(b.fh).await.unwrap();
    client.flush_releases().await;
    let stat = servers.meta.get_attr_of(ino).await;
    assert_eq!(stat.map(|_| ()).map_err(|e| e.kind()), Err(ErrorKind::NotFound), "freed at the last close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_keeps_its_pages_only_while_the_file_is_unchanged() {
    let servers = Servers::new().await;
    let (a, b) = (servers.mount(options()).await, servers.mount(options()).await);
    let (ino, fh) = create(&a, "cache").await;
    a.write(fh, 0, &bytes(5000, 5)).await.unwrap();
    a.release(fh).await.unwrap();

    let first = b.open(ino, false, 6, &root()).await.unwrap();
    b.release(first.fh).await.unwrap();
    let again = b.open(ino, false, 6, &root()).await.unwrap();
    assert!(again.keep_cache && !again.changed, "unchanged since the last open");
    b.release(again.fh).await.unwrap();

    // Another client rewrites it: the pages and attributes the kernel holds are stale.
    tokio::time::sleep(Duration::from_millis(5)).await; // a later mtime
    let opened = a.open(ino, false, 6, &root()).await.unwrap();
    a.write(opened.fh, 0, &bytes(7000, 6)).await.unwrap();
    a.release(opened.fh).await.unwrap();
    let after = b.open(ino, false, 6, &root()).await.unwrap();
    assert!(!after.keep_cache && after.changed, "changed by another client");
    assert_eq!(read_all(&b, after.fh, 7000).await, bytes(7000, 6));
    b.release(after.fh).await.unwrap();
}

/// Requests made for root (the fake metaserver has no certificates, so it checks no caller).
fn root() -> p::Caller {
    p::Caller::default()
}
