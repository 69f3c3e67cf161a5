//! One cache of gRPC channels by address, for the servers' and tools' calls to each other
//! (repair and GC to chunkservers, rebuild to its peers, admin commands). A channel connects
//! lazily and reconnects by itself; a tonic channel multiplexes calls over one HTTP/2
//! connection, so one per address is enough. The wire-protocol clients have their own pool.
//! Channels connect through [`crate::connect`]: in mutual TLS when the process has an identity.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use cairn_proto::chunk_client::ChunkClient;
use cairn_proto::meta_client::MetaClient;
use tonic::transport::Channel;

use crate::tls::Role;

use cairn_common::{Result, MAX_MESSAGE_BYTES};

pub struct Channels {
    connect_timeout: Duration,
    timeout: Duration,
    map: Mutex<HashMap<(Role, String), Channel>>,
}

impl Channels {
    /// Channels whose connects give up after `connect_timeout` and whose calls after `timeout`.
    pub fn new(connect_timeout: Duration, timeout: Duration) -> Channels {
        Channels { connect_timeout, timeout, map: Mutex::new(HashMap::new()) }
    }

    /// The channel to `addr` (`host:port`), a server of `role`, made on first use.
    pub fn get(&self, addr: &str, role: Role) -> Result<Channel> {
        let mut map = self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (role, addr.to_string());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let channel = crate::connect::grpc_channel(addr, role, self.connect_timeout, self.timeout)?;
        map.insert(key, channel.clone());
        Ok(channel)
    }

    /// A chunkserver client over the channel to `addr`, taking messages of any allowed size.
    pub fn chunk(&self, addr: &str) -> Result<ChunkClient<Channel>> {
        Ok(ChunkClient::new(self.get(addr, Role::Chunk)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A metaserver client over the channel to `addr`.
    pub fn meta(&self, addr: &str) -> Result<MetaClient<Channel>> {
        Ok(MetaClient::new(self.get(addr, Role::Meta)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_channel_per_address_and_bad_addresses_are_refused() {
        let channels = Channels::new(Duration::from_millis(100), Duration::from_secs(1));
        channels.get("127.0.0.1:1", Role::Chunk).unwrap();
        channels.get("127.0.0.1:1", Role::Chunk).unwrap();
        channels.get("127.0.0.1:2", Role::Chunk).unwrap();
        assert_eq!(channels.map.lock().unwrap().len(), 2);
        let err = channels.get("not an address", Role::Meta).unwrap_err();
        assert_eq!(err.kind(), cairn_common::ErrorKind::InvalidArgument, "{err}");
        // Lazy: nothing listens there, and the call says so within the connect timeout.
        let mut client = channels.chunk("127.0.0.1:1").unwrap();
        let e = client.stat(cairn_proto::Empty {}).await.unwrap_err();
        assert_eq!(cairn_common::CairnError::from(e).kind(), cairn_common::ErrorKind::Unavailable);
    }
}
