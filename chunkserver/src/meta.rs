//! The chunkserver's gRPC clients of the metaserver: one per address of a replicated
//! metaserver (`meta = "a:9400,b:9400,c:9400"`), requests following the leader
//! (`cairn_net::failover`).

use std::future::Future;
use std::time::Duration;

use cairn_common::{CairnError, Result};
use cairn_net::connect::grpc_channel;
use cairn_net::failover::Failover;
use cairn_net::tls::Role;
use cairn_proto::meta_client::MetaClient;
use tonic::transport::Channel;

pub struct MetaClients {
    failover: Failover,
    /// One client per address, made on first use (the list grows when a leader is learned).
    clients: parking_lot::Mutex<std::collections::HashMap<String, MetaClient<Channel>>>,
    connect_timeout: Duration,
    timeout: Duration,
}

impl MetaClients {
    /// Clients of the metaservers in `list`, connecting lazily; fails only on an unusable
    /// address.
    pub fn new(list: &str, connect_timeout: Duration, timeout: Duration) -> Result<MetaClients> {
        let clients = MetaClients {
            failover: Failover::parse(list)?,
            clients: Default::default(),
            connect_timeout,
            timeout,
        };
        for i in 0..clients.failover.addrs().len() {
            clients.client(i)?;
        }
        Ok(clients)
    }

    fn client(&self, index: usize) -> Result<MetaClient<Channel>> {
        let addr = self.failover.addr(index);
        let mut clients = self.clients.lock();
        if let Some(client) = clients.get(&addr) {
            return Ok(client.clone());
        }
        let channel = grpc_channel(&addr, Role::Meta, self.connect_timeout, self.timeout)
            .map_err(|e| CairnError::invalid(format!("metaserver address: {e}")))?;
        Ok(clients.entry(addr).or_insert_with(|| MetaClient::new(channel)).clone())
    }

    /// Run `call` against the leader.
    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(MetaClient<Channel>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.failover
            .call(|i| {
                let reply = self.client(i).map(&mut call);
                async move { reply?.await.map(tonic::Response::into_inner).map_err(CairnError::from) }
            })
            .await
    }
}
