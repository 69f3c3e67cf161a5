//! Raft messages between metaservers, as the `Meta` service's `RaftVote`, `RaftAppend` (over
//! the wire protocol) and `RaftSnapshot` (over gRPC). A [`RaftMessage`](cairn_proto::RaftMessage)
//! carries openraft's request or reply as JSON in `header`, log entries in the log's own format
//! ([`super::codec`]), a snapshot chunk in `data`, and the sender's cluster id and metadata
//! group, which the receiver checks: a replica of another cluster or group is refused, never
//! joined.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Result};
use cairn_net::channels::Channels;
use cairn_net::wire::WireClient;
use cairn_proto::RaftMessage;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{codec, LogId, NodeId, SnapshotMeta, TypeConfig, Vote};

/// An append-entries request without its entries.
#[derive(Serialize, Deserialize)]
struct AppendHeader {
    vote: Vote,
    prev_log_id: Option<LogId>,
    leader_commit: Option<LogId>,
}

/// A snapshot chunk's request without its bytes.
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    vote: Vote,
    meta: SnapshotMeta,
    offset: u64,
    done: bool,
}

/// Which Raft group a replica belongs to: its cluster and, within it, its metadata group
/// (`docs/ARCHITECTURE.md`, "Several metadata groups"). Every message carries the sender's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupName {
    pub cluster: Arc<str>,
    pub group: u32,
}

impl GroupName {
    pub fn new(cluster: &str, group: u32) -> GroupName {
        GroupName { cluster: cluster.into(), group }
    }
}

impl std::fmt::Display for GroupName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {} of cluster {:?}", self.group, self.cluster)
    }
}

fn json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| CairnError::internal(format!("Raft message: {e}")))
}

fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| CairnError::invalid(format!("malformed Raft message: {e}")))
}

/// Encode an append-entries request.
pub fn encode_append(req: &AppendEntriesRequest<TypeConfig>, from: &GroupName) -> Result<RaftMessage> {
    let header =
        AppendHeader { vote: req.vote, prev_log_id: req.prev_log_id, leader_commit: req.leader_commit };
    Ok(RaftMessage {
        header: json(&header)?,
        entries: req.entries.iter().map(codec::encode).collect(),
        data: Vec::new(),
        cluster: from.cluster.to_string(),
        group: from.group,
    })
}

/// Decode an append-entries request.
pub fn decode_append(msg: &RaftMessage) -> Result<AppendEntriesRequest<TypeConfig>> {
    let header: AppendHeader = from_json(&msg.header)?;
    let entries = msg
        .entries
        .iter()
        .map(|e| codec::decode(e).map_err(|e| CairnError::invalid(format!("malformed Raft entry: {e}"))))
        .collect::<Result<_>>()?;
    Ok(AppendEntriesRequest {
        vote: header.vote,
        prev_log_id: header.prev_log_id,
        leader_commit: header.leader_commit,
        entries,
    })
}

pub fn encode_snapshot(req: &InstallSnapshotRequest<TypeConfig>, from: &GroupName) -> Result<RaftMessage> {
    let header =
        SnapshotHeader { vote: req.vote, meta: req.meta.clone(), offset: req.offset, done: req.done };
    Ok(RaftMessage {
        header: json(&header)?,
        entries: Vec::new(),
        data: req.data.clone(),
        cluster: from.cluster.to_string(),
        group: from.group,
    })
}

pub fn decode_snapshot(msg: RaftMessage) -> Result<InstallSnapshotRequest<TypeConfig>> {
    let header: SnapshotHeader = from_json(&msg.header)?;
    Ok(InstallSnapshotRequest {
        vote: header.vote,
        meta: header.meta,
        offset: header.offset,
        data: msg.data,
        done: header.done,
    })
}

/// A message whose header is `value` as JSON (votes and every reply).
pub fn encode_plain<T: Serialize>(value: &T, from: &GroupName) -> Result<RaftMessage> {
    Ok(RaftMessage {
        header: json(value)?,
        entries: Vec::new(),
        data: Vec::new(),
        cluster: from.cluster.to_string(),
        group: from.group,
    })
}

pub fn decode_plain<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T> {
    from_json(&msg.header)
}

/// Refuse a message from another cluster or another group of this one.
pub fn check_group(msg: &RaftMessage, ours: &GroupName) -> Result<()> {
    if *msg.cluster != *ours.cluster || msg.group != ours.group {
        return Err(CairnError::new(
            cairn_common::ErrorKind::PermissionDenied,
            format!(
                "Raft message from {}; this metaserver is a replica of {ours}",
                GroupName::new(&msg.cluster, msg.group)
            ),
        ));
    }
    Ok(())
}

/// Makes the connections to the other replicas. Votes and appends (every commit's round trip)
/// go over the framed wire protocol, whose caller writes and reads its connection itself, with
/// no task between it and the socket (gRPC hands each call to a buffer task and a connection
/// task: two more thread wake-ups a message on each side, `bench/RESULTS.md`); snapshots,
/// rare and long, over gRPC. One wire client (a pool of connections) and one gRPC channel per
/// address, shared by every leadership's replication streams.
#[derive(Clone)]
pub struct Network {
    channels: Arc<Channels>,
    links: Arc<parking_lot::Mutex<HashMap<String, Arc<Link>>>>,
    name: GroupName,
    heard: Arc<Heard>,
}

/// When each other replica last answered this one's appends (heartbeats included) in the
/// newest term this one sent them in, so the leader can tell an operator which replica has gone
/// quiet ([`Heard::silent`]): an idle follower that is down lags by no entry, and nothing else
/// on the leader shows it.
#[derive(Default)]
pub struct Heard {
    state: parking_lot::Mutex<HeardState>,
}

#[derive(Default)]
struct HeardState {
    term: u64,
    /// When this replica first sent an append in `term`.
    since: Option<std::time::Instant>,
    answered: HashMap<NodeId, std::time::Instant>,
}

impl Heard {
    fn sent(&self, term: u64) {
        let mut s = self.state.lock();
        if term > s.term {
            *s = HeardState { term, since: Some(std::time::Instant::now()), answered: HashMap::new() };
        }
    }

    fn answered(&self, term: u64, from: NodeId) {
        let mut s = self.state.lock();
        if term == s.term {
            s.answered.insert(from, std::time::Instant::now());
        }
    }

    /// Which of `members` have not answered an append of `term` for `after` or longer, and for
    /// how long (at most since this replica began sending in `term`). None before it has sent
    /// in `term` for `after`.
    pub fn silent(
        &self,
        term: u64,
        members: impl Iterator<Item = NodeId>,
        after: Duration,
    ) -> Vec<(NodeId, Duration)> {
        let s = self.state.lock();
        let Some(since) = s.since.filter(|_| s.term == term) else { return Vec::new() };
        members
            .filter_map(|m| {
                let quiet = s.answered.get(&m).map_or(since, |at| (*at).max(since)).elapsed();
                (quiet >= after).then_some((m, quiet))
            })
            .collect()
    }
}

/// The wire connections to one replica, and whether it answered that it has no wire Raft
/// methods (a metaserver of an earlier version, during a rolling upgrade): from then on its
/// votes and appends go over gRPC.
struct Link {
    wire: WireClient,
    grpc_only: AtomicBool,
}

/// How long a wire connection to another replica may take to open (as its gRPC channel).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

impl Network {
    pub fn new(channels: Arc<Channels>, name: GroupName) -> Network {
        Network { channels, links: Default::default(), name, heard: Default::default() }
    }

    /// Who answered this replica's appends, and when.
    pub fn heard(&self) -> Arc<Heard> {
        self.heard.clone()
    }
}

/// The connection to one replica.
pub struct Peer {
    target: NodeId,
    addr: String,
    channels: Arc<Channels>,
    link: Arc<Link>,
    name: GroupName,
    heard: Arc<Heard>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let link = self
            .links
            .lock()
            .entry(node.addr.clone())
            .or_insert_with(|| {
                // Each message is bounded by openraft's own time (`RPCOption`), below this.
                let wire = WireClient::new(
                    &node.addr,
                    cairn_net::tls::Role::Meta,
                    CONNECT_TIMEOUT,
                    Duration::from_secs(60),
                );
                Arc::new(Link { wire, grpc_only: AtomicBool::new(false) })
            })
            .clone();
        Peer {
            target,
            addr: node.addr.clone(),
            channels: self.channels.clone(),
            link,
            name: self.name.clone(),
            heard: self.heard.clone(),
        }
    }
}

type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The most entry bytes one append message carries (the transport refuses messages over
/// `cairn_common::MAX_MESSAGE_BYTES`, 80 MiB): a single larger entry still goes alone.
const APPEND_BUDGET: usize = 32 << 20;

/// How many of `entries`, from the first, fit in `budget` bytes of keys and values (at least
/// one, whatever its size, so a large change is never stuck).
fn entries_within(entries: &[super::Entry], budget: usize) -> usize {
    let mut used = 0usize;
    for (i, entry) in entries.iter().enumerate() {
        let bytes = match &entry.payload {
            // Each op's bytes and its framing (kind, family, lengths).
            openraft::EntryPayload::Normal(command) => command.ops.iter().map(|op| op.bytes() + 16).sum(),
            _ => 1024,
        };
        used += bytes;
        if used > budget && i > 0 {
            return i;
        }
    }
    entries.len()
}

/// The Raft methods a message goes by: over the wire protocol where the replica has them,
/// else over gRPC.
#[derive(Clone, Copy)]
enum Method {
    Vote,
    Append,
    Snapshot,
}

impl Peer {
    /// Send `msg` as `method` and decode the reply, a `Result` of openraft's as JSON.
    async fn send<T, E>(
        &self,
        msg: Result<RaftMessage>,
        option: &RPCOption,
        method: Method,
    ) -> Result<T, RpcError<E>>
    where
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let msg = msg.map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = match tokio::time::timeout(option.hard_ttl(), self.exchange(msg, method)).await {
            Err(elapsed) => return Err(RPCError::Unreachable(Unreachable::new(&elapsed))),
            Ok(Err(e)) => {
                return Err(match e.kind() {
                    cairn_common::ErrorKind::Unavailable => RPCError::Unreachable(Unreachable::new(&e)),
                    _ => RPCError::Network(NetworkError::new(&e)),
                });
            }
            Ok(Ok(reply)) => reply,
        };
        let result: std::result::Result<T, RaftError<NodeId, E>> =
            decode_plain(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// `msg` over the wire protocol where it can go there, else over gRPC.
    async fn exchange(&self, msg: RaftMessage, method: Method) -> Result<RaftMessage> {
        use cairn_net::wire::meta;
        let wire = &self.link.wire;
        let answer = match method {
            Method::Snapshot => return self.over_grpc(msg, method).await,
            _ if self.link.grpc_only.load(Ordering::Relaxed) => return self.over_grpc(msg, method).await,
            Method::Vote => meta::raft_vote(wire, msg).await,
            Method::Append => meta::raft_append(wire, msg).await,
        };
        match answer {
            // A replica of an earlier version (or one not replicated, which gRPC will refuse
            // alike): this message is lost, openraft sends it again, and the next go over gRPC.
            Err(e) if e.kind() == cairn_common::ErrorKind::NotSupported => {
                tracing::warn!(replica = %self.addr, "{}: sending it Raft messages over gRPC", e.message());
                self.link.grpc_only.store(true, Ordering::Relaxed);
                Err(CairnError::unavailable(format!("{}: {}", self.addr, e.message())))
            }
            answer => answer,
        }
    }

    async fn over_grpc(&self, msg: RaftMessage, method: Method) -> Result<RaftMessage> {
        let mut client = self
            .channels
            .meta(&self.addr)
            .map_err(|e| CairnError::unavailable(format!("{}: {}", self.addr, e.message())))?;
        let reply = match method {
            Method::Vote => client.raft_vote(msg).await,
            Method::Append => client.raft_append(msg).await,
            Method::Snapshot => client.raft_snapshot(msg).await,
        };
        reply.map(tonic::Response::into_inner).map_err(CairnError::from)
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> std::result::Result<AppendEntriesResponse<NodeId>, RpcError> {
        // openraft sends up to `max_payload_entries` entries at once to a lagging follower, and
        // group commit makes entries of up to 4 MiB: ask it for fewer where they would not fit
        // one message.
        let fit = entries_within(&rpc.entries, APPEND_BUDGET);
        if fit < rpc.entries.len() {
            return Err(openraft::error::PayloadTooLarge::new_entries_hint(fit.max(1) as u64).into());
        }
        let carries_entries = !rpc.entries.is_empty();
        let started = std::time::Instant::now();
        let term = rpc.vote.leader_id().get_term();
        self.heard.sent(term);
        let msg = encode_append(&rpc, &self.name);
        let answer = self.send(msg, &option, Method::Append).await;
        if answer.is_ok() {
            self.heard.answered(term, self.target);
        }
        // Heartbeats and commit notices (no entries) would hide the appends' time among theirs.
        if carries_entries && answer.is_ok() {
            metrics::histogram!(crate::metrics::RAFT_APPEND_RPC_SECONDS, "member" => self.target.to_string())
                .record(started.elapsed().as_secs_f64());
        }
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> std::result::Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        let msg = encode_snapshot(&rpc, &self.name);
        self.send(msg, &option, Method::Snapshot).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> std::result::Result<VoteResponse<NodeId>, RpcError> {
        let msg = encode_plain(&rpc, &self.name);
        self.send(msg, &option, Method::Vote).await
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::raft::{Command, Entry};
    use crate::store::{Cf, Op};

    #[test]
    fn an_append_request_round_trips_and_checks_its_cluster_and_group() {
        let id = |i| LogId::new(CommittedLeaderId::new(3, 1), i);
        let ops = vec![Op::Put { cf: Cf::Inodes, key: vec![1], value: vec![2; 300] }];
        let req = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(id(4)),
            leader_commit: Some(id(4)),
            entries: vec![Entry { log_id: id(5), payload: EntryPayload::Normal(Command { ops }) }],
        };
        let msg = encode_append(&req, &GroupName::new("c1", 2)).unwrap();
        assert!(check_group(&msg, &GroupName::new("c1", 2)).is_ok());
        let other_cluster = check_group(&msg, &GroupName::new("c2", 2)).unwrap_err();
        assert_eq!(other_cluster.kind(), cairn_common::ErrorKind::PermissionDenied);
        assert!(other_cluster.message().contains("group 2 of cluster \"c1\""), "{other_cluster}");
        let other_group = check_group(&msg, &GroupName::new("c1", 0)).unwrap_err();
        assert!(other_group.message().contains("replica of group 0 of cluster \"c1\""), "{other_group}");
        // A message of a build before groups carries none: it is group 0's.
        let older = RaftMessage { group: 0, ..msg.clone() };
        assert!(check_group(&older, &GroupName::new("c1", 0)).is_ok());
        assert!(check_group(&older, &GroupName::new("c1", 2)).is_err());
        let back = decode_append(&msg).unwrap();
        assert_eq!(back.entries, req.entries);
        assert_eq!(
            (back.vote, back.prev_log_id, back.leader_commit),
            (req.vote, req.prev_log_id, req.leader_commit)
        );

        let mut bad = msg.clone();
        bad.entries[0].truncate(10);
        assert!(decode_append(&bad).unwrap_err().message().contains("malformed Raft entry"));
        bad.header = b"{".to_vec();
        assert!(decode_append(&bad).unwrap_err().message().contains("malformed Raft message"));
    }

    /// A wire server that knows no Raft methods (a metaserver of an earlier version).
    struct Older;

    impl cairn_net::wire::Handler for Older {
        fn service(&self) -> &'static str {
            "meta"
        }
        fn method_name(&self, _method: u16) -> Option<&'static str> {
            None
        }
        fn answer(
            &self,
            _method: u16,
            _body: bytes::Bytes,
            _bulk: bytes::Bytes,
            _peer: &cairn_net::tls::Peer,
        ) -> cairn_net::wire::AnswerFuture<'_> {
            unreachable!("the server answers unknown methods itself")
        }
    }

    /// A replica without the wire protocol's Raft methods is sent the next messages over gRPC.
    #[tokio::test]
    async fn a_replica_without_wire_raft_methods_gets_grpc() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let (_grpc, _accepting) = cairn_net::server::serve(listener, Arc::new(Older), stopped);
        let mut network = Network::new(
            Arc::new(Channels::new(Duration::from_secs(1), Duration::from_secs(1))),
            GroupName::new("c1", 0),
        );
        let mut peer = network.new_client(2, &BasicNode::new(&addr)).await;
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        };
        let option = RPCOption::new(Duration::from_millis(500));
        assert!(!peer.link.grpc_only.load(Ordering::Relaxed));
        let first = peer.append_entries(append.clone(), option.clone()).await;
        assert!(matches!(first, Err(RPCError::Unreachable(_))), "{first:?}");
        assert!(peer.link.grpc_only.load(Ordering::Relaxed), "the next messages go over gRPC");
        // Every stream to that address from now on: the link is shared.
        let again = network.new_client(2, &BasicNode::new(&addr)).await;
        assert!(again.link.grpc_only.load(Ordering::Relaxed));
    }

    /// A replica that stops answering the leader's appends is named once it has been quiet for
    /// the threshold; one that answers is not; a new term starts the count afresh.
    #[test]
    fn replicas_quiet_for_long_enough_are_named() {
        let heard = Heard::default();
        let after = Duration::from_millis(50);
        assert!(heard.silent(3, [2, 3].into_iter(), after).is_empty(), "nothing sent yet");
        heard.sent(3);
        heard.answered(3, 2);
        heard.answered(3, 3);
        assert!(heard.silent(3, [2, 3].into_iter(), after).is_empty(), "too early to tell");
        std::thread::sleep(Duration::from_millis(60));
        heard.answered(3, 2);
        heard.answered(2, 3); // an answer to an older term's append counts for nothing
        let quiet = heard.silent(3, [2, 3].into_iter(), after);
        assert_eq!(quiet.iter().map(|(m, _)| *m).collect::<Vec<_>>(), [3]);
        assert!(quiet[0].1 >= after);
        assert!(heard.silent(4, [2, 3].into_iter(), after).is_empty(), "another term: not this one's view");
        heard.sent(4);
        assert!(heard.silent(4, [2, 3].into_iter(), after).is_empty(), "a new term starts afresh");
    }

    /// Entries for a lagging follower are sent in messages the transport takes: as many as fit
    /// the budget, and a single large one alone.
    #[test]
    fn appends_stay_within_the_message_budget() {
        let entry = |i, bytes: usize| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(Command {
                ops: vec![Op::Put { cf: Cf::Inodes, key: vec![1], value: vec![0; bytes] }],
            }),
        };
        let small: Vec<Entry> = (1..=300).map(|i| entry(i, 1000)).collect();
        assert_eq!(entries_within(&small, APPEND_BUDGET), 300, "small entries all go");
        let big: Vec<Entry> = (1..=300).map(|i| entry(i, 4 << 20)).collect();
        let fit = entries_within(&big, APPEND_BUDGET);
        assert_eq!(fit, 7, "4 MiB entries: as many as 32 MiB takes");
        assert_eq!(
            entries_within(&[entry(1, 100 << 20), entry(2, 10)], APPEND_BUDGET),
            1,
            "a huge one alone"
        );
        assert_eq!(entries_within(&[], APPEND_BUDGET), 0);
    }
}
