//! The Cairn chunkserver: stores erasure-coded shards as checksummed files on SSD and HDD tier
//! directories and serves them over the `Chunk` gRPC service.
//!
//! The pieces, bottom up: [`engine`] does positional disk I/O (io_uring, or pread/pwrite);
//! [`shard`] is the versioned on-disk format with per-block BLAKE3 hashes; [`store`] places,
//! indexes, reads and verifies shard files; [`policy`] decides which shards change tier and
//! [`mover`] moves them, crash-safely, at the pace of one [`throttle`]; [`service`] is the gRPC layer; [`heartbeat`] keeps the
//! node registered with the metaserver; [`fence`] refuses deletes from a deposed metaserver
//! leader; [`metrics`] names the exported metrics. [`serve`]
//! wires them together on a listener and [`run`] is what `cairn chunk` calls.

use std::future::Future;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::config::ChunkConfig;
use cairn_common::{CairnError, Result, MAX_MESSAGE_BYTES};
use cairn_net::{server, wire};
use cairn_proto::chunk_server::ChunkServer;

pub mod engine;
pub mod fence;
pub mod flush;
pub mod heartbeat;
pub mod meta;
pub mod metrics;
pub mod mover;
pub mod pins;
pub mod policy;
pub mod rebuild;
pub mod scrub;
pub mod service;
pub mod shard;
pub mod slots;
pub mod statefile;
pub mod store;
pub mod throttle;

pub use engine::{IoEngine, PreadEngine, UringEngine};
pub use mover::{MoveOutcome, Mover, MoverOptions, PassReport, PromoteOptions, PromoteSummary};
pub use policy::{Clock, ManualClock, SystemClock, TierPolicy};
pub use service::ChunkService;
pub use store::{ReadCheck, ShardStore, StoreOptions, Tier};

/// Serve the chunkserver on `listener` until `shutdown` completes: open the store with the
/// configured engine, start the tier mover, register and heartbeat with the metaserver, answer
/// `Chunk` RPCs.
pub async fn serve(
    config: ChunkConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    config.validate()?;
    let local =
        listener.local_addr().map_err(|e| CairnError::from_io("cannot read the listener's address", &e))?;
    let advertise = config.advertise.clone().unwrap_or_else(|| local.to_string());
    if config.advertise.is_none() && local.ip().is_unspecified() {
        tracing::warn!(
            "advertising {advertise}, which other hosts cannot reach; set `advertise` in the config"
        );
    }

    // Registered buffers serve O_DIRECT reads only; 16 of ≈ 1 MiB each is ≈ 17 MiB locked.
    let fixed =
        if config.ssd_direct_io || config.hdd_direct_io { config.queue_depth.min(16) as usize } else { 0 };
    let engine = engine::open(config.io_engine, config.queue_depth, fixed);
    let store = Arc::new(ShardStore::open(StoreOptions::from_config(&config), engine).await?);
    let fence = Arc::new(fence::Fence::open(&config.state_dir)?);
    let node_id = Arc::new(AtomicU32::new(0));
    let caps = Arc::new(cairn_net::capability::Verifier::default());
    let heartbeat = heartbeat::Heartbeat::new(
        &config.meta,
        advertise.clone(),
        store.clone(),
        node_id.clone(),
        fence.clone(),
        &config.state_dir,
        Duration::from_millis(config.heartbeat_ms),
    )?
    .with_capability_keys(caps.clone());
    tracing::info!(
        addr = %local,
        advertise,
        uuid = heartbeat.uuid(),
        engine = store.engine_name(),
        "chunkserver serving"
    );
    let heartbeat = tokio::spawn(heartbeat.run());
    let mover = Arc::new(Mover::new(store.clone(), MoverOptions::from_config(&config))?);
    let moving = mover::spawn(mover.clone(), Duration::from_millis(config.mover_interval_ms));
    let scrub = scrub::Scrub::new(
        store.clone(),
        &config.meta,
        config.scrub_rate_bytes,
        Duration::from_secs(config.scrub_interval_secs),
    )?;
    let scrub = tokio::spawn(scrub.run());

    let service = Arc::new(ChunkService::new(store.clone(), mover, node_id, fence, caps));
    let (stopped, shutdown) = server::split_shutdown(shutdown);
    let (incoming, accepting) =
        server::serve(listener, Arc::new(wire::chunk::Service(service.clone())), stopped);
    let service = ChunkServer::from_arc(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let served = server::grpc_server()
        .layer(cairn_net::metrics::RpcMetricsLayer::new("chunk"))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    heartbeat.abort();
    scrub.abort();
    // A move cut short here leaves a temp file or two copies; the next open settles both.
    moving.abort();
    let _ = accepting.await;
    // What mounts closed is in the page cache: on disk before the process ends.
    if let Err(e) = store.flush_all().await {
        tracing::error!("shards written before the stop could not be made durable: {e}");
    }
    served.map_err(|e| CairnError::io(format!("chunk gRPC server on {local}: {e}")))?;
    tracing::info!("chunkserver stopped");
    Ok(())
}

/// Validate `config`, bind its listen address and serve until SIGINT or SIGTERM.
pub async fn run(config: ChunkConfig) -> Result<()> {
    config.validate()?;
    let open_files = cairn_net::rlimit::raise_open_files();
    if open_files < 4096 + cairn_net::rlimit::RESERVED_FDS {
        tracing::warn!(
            open_files,
            "a low open-file limit: fewer connections can be served (raise LimitNOFILE)"
        );
    }
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| CairnError::from_io(&format!("cannot listen on {}", config.listen), &e))?;
    let addr =
        listener.local_addr().map_err(|e| CairnError::from_io("cannot read the listener's address", &e))?;
    tracing::info!(%addr, "chunkserver listening");
    if let Some(listen) = &config.metrics_listen {
        cairn_net::metrics::serve(listen)?;
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CairnError::from_io("cannot install the SIGTERM handler", &e))?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        }
    };
    serve(config, listener, shutdown).await
}
