//! Hostile requests against the metaserver's handlers: a fresh in-memory namespace with three
//! chunkservers registered, then a sequence of requests of any namespace method, each decoded
//! from bytes the fuzzer chose (any field values: inode numbers, names with slashes or NULs,
//! modes, sizes, stripe records, xattrs, layouts, lock ranges). Nothing may panic, and after the
//! sequence the namespace must pass its own consistency check (`cairn fsck`'s), whatever was
//! refused or done.
//!
//! Input: records of one byte choosing the method, two bytes (little endian) of length, then
//! that many bytes of the request's protobuf encoding (undecodable ones are skipped). Seeds:
//! `fuzz/seeds/make.py`.
#![no_main]

use std::sync::{Arc, OnceLock};

use cairn_common::{Layout, ROOT_INO};
use cairn_meta::{MetaService, Namespace};
use cairn_proto::meta_server::Meta;
use cairn_proto::*;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::Request;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"))
}

/// Decode `bytes` as `T` and call `$method` with it; errors are answers too. With
/// `CAIRN_FUZZ_TRACE` set (reproducing a crash), each request and its answer is printed.
macro_rules! call {
    ($svc:expr, $method:ident, $ty:ty, $bytes:expr) => {
        if let Ok(req) = <$ty>::decode($bytes) {
            let trace = std::env::var_os("CAIRN_FUZZ_TRACE").is_some();
            if trace {
                eprintln!("{} {:?}", stringify!($method), req);
            }
            let answer = $svc.$method(Request::new(req)).await;
            if trace {
                eprintln!("  -> {:?}", answer.map(|r| r.into_inner()).map_err(|s| s.message().to_string()));
            }
        }
    };
}

async fn run(data: &[u8]) {
    let (ns, cluster) = Namespace::open_memory(Layout::new(2, 1, 4096).expect("layout")).expect("namespace");
    let ns = Arc::new(ns);
    let svc = MetaService::new(ns.clone(), cluster);
    for i in 0..3u32 {
        let req = RegisterChunkRequest {
            uuid: format!("u{i}"),
            addr: format!("127.0.0.1:{}", 7000 + i),
            pid: 1,
            ..Default::default()
        };
        let id = svc.register_chunk(Request::new(req)).await.expect("register").into_inner().node_id;
        svc.heartbeat(Request::new(HeartbeatRequest { node_id: id, ..Default::default() }))
            .await
            .expect("heartbeat");
    }
    let mut rest = data;
    while rest.len() >= 3 {
        let method = rest[0];
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let bytes = &rest[3..3 + len];
        rest = &rest[3 + len..];
        match method % 25 {
            0 => call!(svc, lookup, LookupRequest, bytes),
            1 => call!(svc, get_attr, InoRequest, bytes),
            2 => call!(svc, set_attr, SetAttrRequest, bytes),
            3 => call!(svc, create, CreateRequest, bytes),
            4 => call!(svc, mkdir, MkdirRequest, bytes),
            5 => call!(svc, unlink, RemoveRequest, bytes),
            6 => call!(svc, rmdir, RemoveRequest, bytes),
            7 => call!(svc, rename, RenameRequest, bytes),
            8 => call!(svc, link, LinkRequest, bytes),
            9 => call!(svc, symlink, SymlinkRequest, bytes),
            10 => call!(svc, readlink, InoRequest, bytes),
            11 => call!(svc, read_dir, ReadDirRequest, bytes),
            12 => call!(svc, get_xattr, XattrRequest, bytes),
            13 => call!(svc, set_xattr, SetXattrRequest, bytes),
            14 => call!(svc, list_xattr, InoRequest, bytes),
            15 => call!(svc, remove_xattr, XattrRequest, bytes),
            16 => call!(svc, open, OpenRequest, bytes),
            17 => call!(svc, release, ReleaseRequest, bytes),
            18 => call!(svc, commit, CommitRequest, bytes),
            19 => call!(svc, list_stripes, ListStripesRequest, bytes),
            20 => call!(svc, lock, LockRequest, bytes),
            21 => call!(svc, set_layout, SetLayoutRequest, bytes),
            22 => call!(svc, get_layout, InoRequest, bytes),
            23 => call!(svc, client_heartbeat, ClientHeartbeatRequest, bytes),
            _ => call!(svc, register_client, Empty, bytes),
        }
    }
    let report = ns.check(false).expect("the check runs");
    assert!(report.problems.is_empty(), "the namespace is inconsistent after hostile requests: {:?}", report.problems);
    let root = svc.get_attr(Request::new(InoRequest { ino: ROOT_INO })).await.expect("the root is there");
    assert!(root.into_inner().attr.is_some());
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(run(data));
});
