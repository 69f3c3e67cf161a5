//! The chunkserver's gRPC clients of the metaserver: one per address of a replicated
//! metaserver (`meta = "a:9400,b:9400,c:9400"`), requests following the leader
//! (`cairn_common::failover`).

use std::future::Future;
use std::time::Duration;

use cairn_common::failover::Failover;
use cairn_common::{CairnError, Result};
use cairn_proto::meta_client::MetaClient;
use tonic::transport::{Channel, Endpoint};

pub struct MetaClients {
    failover: Failover,
    clients: Vec<MetaClient<Channel>>,
}

impl MetaClients {
    /// Clients of the metaservers in `list`, connecting lazily; fails only on an unusable
    /// address.
    pub fn new(list: &str, connect_timeout: Duration, timeout: Duration) -> Result<MetaClients> {
        let failover = Failover::parse(list)?;
        let clients = failover
            .addrs()
            .iter()
            .map(|addr| {
                let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| CairnError::invalid(format!("metaserver address {addr:?}: {e}")))?
                    .connect_timeout(connect_timeout)
                    .timeout(timeout);
                Ok(MetaClient::new(endpoint.connect_lazy()))
            })
            .collect::<Result<_>>()?;
        Ok(MetaClients { failover, clients })
    }

    /// Run `call` against the leader.
    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(MetaClient<Channel>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.failover
            .call(|i| {
                let reply = call(self.clients[i].clone());
                async move { reply.await.map(tonic::Response::into_inner).map_err(CairnError::from) }
            })
            .await
    }
}
