//! `rpc-latency META_ADDR [N]`: the round-trip time of one metadata request (GetAttr of the root,
//! answered from the metaserver's memtable or block cache) over each transport, one request at
//! a time and with 8 in flight, against a running metaserver (`cairn up` prints its address).
//! What a FUSE operation costs beyond this is the client's and the kernel's share. Its TLS
//! identity: `CAIRN_TLS` (a directory `cairn up` made, e.g. DATA/tls/client), or plaintext when
//! unset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_net::wire::{self, WireClient};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::InoRequest;

const ROOT: u64 = 1;

fn summary(label: &str, mut times: Vec<Duration>, wall: Duration) {
    times.sort();
    let pick = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!(
        "{label:28} {:>9.0} req/s   p50 {:>6.1} us   p99 {:>6.1} us",
        times.len() as f64 / wall.as_secs_f64(),
        pick(0.5),
        pick(0.99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(addr) = args.get(1).cloned() else {
        eprintln!("usage: rpc-latency META_ADDR [N]");
        std::process::exit(2);
    };
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let source = match std::env::var_os("CAIRN_TLS") {
        Some(dir) => cairn_net::tls::Source::Dir(dir.into()),
        None => cairn_net::tls::Source::Plaintext,
    };
    if let Err(e) = cairn_net::tls::install_from(&source, "rpc-latency", false) {
        eprintln!("rpc-latency: {}", e.message());
        std::process::exit(1);
    }
    let wire = Arc::new(WireClient::new(
        &addr,
        cairn_net::tls::Role::Meta,
        Duration::from_secs(3),
        Duration::from_secs(10),
    ));
    let channel = cairn_net::connect::grpc_channel(
        &addr,
        cairn_net::tls::Role::Meta,
        Duration::from_secs(3),
        Duration::from_secs(10),
    )
    .expect("metaserver address");
    let grpc = MetaClient::new(channel);

    for concurrency in [1usize, 8] {
        for transport in ["wire", "grpc"] {
            let started = Instant::now();
            let tasks = (0..concurrency).map(|_| {
                let (wire, mut grpc) = (wire.clone(), grpc.clone());
                tokio::spawn(async move {
                    let mut times = Vec::with_capacity(n / concurrency);
                    for _ in 0..n / concurrency {
                        let t = Instant::now();
                        if transport == "wire" {
                            wire::meta::get_attr(&wire, InoRequest { ino: ROOT }).await.expect("GetAttr");
                        } else {
                            grpc.get_attr(InoRequest { ino: ROOT }).await.expect("GetAttr");
                        }
                        times.push(t.elapsed());
                    }
                    times
                })
            });
            let mut times = Vec::new();
            for t in tasks.collect::<Vec<_>>() {
                times.extend(t.await.expect("task"));
            }
            summary(&format!("{transport}, {concurrency} in flight"), times, started.elapsed());
        }
    }
}
