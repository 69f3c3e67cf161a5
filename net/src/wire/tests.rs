use super::*;
use crate::server::{serve, serve_with, Counted, Limits};
use cairn_proto as p;
use tokio::net::TcpListener;

/// A handler for tests: method 1 echoes a shard read (offset bytes of `b'x'`, length `len`),
/// method 2 stores a written shard's data length in the reply's tier string, method 3 fails with
/// the error kind numbered `offset`, method 4 never answers.
struct Fake;

impl Handler for Fake {
    fn service(&self) -> &'static str {
        "test"
    }
    fn method_name(&self, method: u16) -> Option<&'static str> {
        (1..=4).contains(&method).then_some("Fake")
    }
    fn accepts_bulk(&self, method: u16) -> bool {
        method == 2
    }
    fn answer(&self, method: u16, body: Bytes, bulk: Bytes, peer: &Peer) -> AnswerFuture<'_> {
        let peer = peer.clone();
        Box::pin(async move {
            match method {
                1 => {
                    call_typed(body, bulk, peer, |r: tonic::Request<p::ReadShardRequest>| async move {
                        let r = r.into_inner();
                        Ok(tonic::Response::new(p::ReadShardReply {
                            data: Bytes::from(vec![b'x'; r.len as usize]),
                            shard_len: r.offset,
                            ..Default::default()
                        }))
                    })
                    .await
                }
                2 => {
                    call_typed(body, bulk, peer, |r: tonic::Request<p::WriteShardRequest>| async move {
                        let r = r.into_inner();
                        let sum: u64 = r.data.iter().map(|b| *b as u64).sum();
                        Ok(tonic::Response::new(p::WriteShardReply {
                            tier: format!("{} {sum}", r.data.len()),
                        }))
                    })
                    .await
                }
                3 => {
                    call_typed(body, bulk, peer, |r: tonic::Request<p::ReadShardRequest>| async move {
                        let kind = ErrorKind::from_index(r.into_inner().offset as u8).unwrap();
                        Err::<tonic::Response<p::ReadShardReply>, _>(
                            CairnError::new(kind, "told to fail").into(),
                        )
                    })
                    .await
                }
                _ => std::future::pending().await,
            }
        })
    }
}

type Others = tokio_stream::wrappers::ReceiverStream<std::io::Result<Counted>>;

async fn start() -> (String, tokio::sync::watch::Sender<bool>, Others) {
    let (addr, stop, others, _) = start_with(Limits::default()).await;
    (addr, stop, others)
}

async fn start_with(
    limits: Limits,
) -> (String, tokio::sync::watch::Sender<bool>, Others, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (others, accepting) = serve_with(listener, Arc::new(Fake), stopped, limits);
    (addr, stop, others, accepting)
}

/// A raw wire connection to `addr` from `local` (any 127.x address), magic sent.
async fn raw(addr: &str, local: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let mut conn = socket.connect(addr.parse().unwrap()).await.unwrap();
    conn.write_all(&MAGIC).await.unwrap();
    conn
}

/// Whether the server closed `conn` within `within` (it reads end of file, or is reset).
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

fn short(connections: usize, per_peer: usize) -> Limits {
    Limits {
        connections,
        connections_per_peer: per_peer,
        hello: Duration::from_millis(400),
        idle: Duration::from_millis(600),
        transfer: Duration::from_millis(300),
    }
}

fn client(addr: &str) -> WireClient {
    WireClient::new(addr, Role::Chunk, Duration::from_secs(2), Duration::from_secs(2))
}

#[tokio::test]
async fn bulk_data_travels_both_ways_byte_exact() {
    let (addr, _stop, _others) = start().await;
    let c = client(&addr);
    let reply: p::ReadShardReply = c
        .call(1, p::ReadShardRequest { id: None, offset: 7, len: 3 << 20, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(reply.shard_len, 7);
    assert_eq!(reply.data.len(), 3 << 20);
    assert!(reply.data.iter().all(|b| *b == b'x'));

    let data: Vec<u8> = (0..(1 << 20) + 13).map(|i| (i % 251) as u8).collect();
    let sum: u64 = data.iter().map(|b| *b as u64).sum();
    let reply: p::WriteShardReply = c
        .call(2, p::WriteShardRequest { id: None, data: Bytes::from(data.clone()), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(reply.tier, format!("{} {sum}", data.len()));
    // An empty bulk part is an empty field, not an error.
    let reply: p::ReadShardReply =
        c.call(1, p::ReadShardRequest { id: None, offset: 0, len: 0, ..Default::default() }).await.unwrap();
    assert!(reply.data.is_empty());
}

#[tokio::test]
async fn every_error_kind_arrives_as_raised_and_the_connection_stays_usable() {
    let (addr, _stop, _others) = start().await;
    let c = client(&addr);
    for kind in ErrorKind::ALL {
        let req = p::ReadShardRequest { id: None, offset: kind.index() as u64, len: 0, ..Default::default() };
        let e = c.call::<_, p::ReadShardReply>(3, req).await.unwrap_err();
        assert_eq!(e.kind(), kind);
        assert_eq!(e.message(), "told to fail");
    }
    let e = c.call::<_, p::Empty>(99, p::Empty {}).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    // Every call above went over the one pooled connection.
    assert_eq!(c.idle.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_malformed_body_is_a_clear_error() {
    let (addr, _stop, _others) = start().await;
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    conn.write_all(&MAGIC).await.unwrap();
    // Field 1 as a length-delimited value running past the end of the body.
    let body = [0x0a, 0x7f, 0x01];
    let mut head = vec![0; HEADER];
    write_header(&mut head, body.len(), 0, &1u16.to_le_bytes(), 0).unwrap();
    head.extend_from_slice(&body);
    write_frame(&mut conn, &head, &[]).await.unwrap();
    let (status, kind, message, _) = read_reply(&mut conn).await.unwrap();
    assert_eq!(status, STATUS_ERROR);
    assert_eq!(ErrorKind::from_index(kind), Some(ErrorKind::InvalidArgument));
    assert!(String::from_utf8_lossy(&message).contains("malformed request"));
    // Bulk data for a message without a bulk field is refused too.
    let mut head = vec![0; HEADER];
    write_header(&mut head, 0, 5, &1u16.to_le_bytes(), 0).unwrap();
    write_frame(&mut conn, &head, b"extra").await.unwrap();
    let (status, kind, _, _) = read_reply(&mut conn).await.unwrap();
    assert_eq!((status, ErrorKind::from_index(kind)), (STATUS_ERROR, Some(ErrorKind::InvalidArgument)));
}

#[tokio::test]
async fn an_oversized_frame_or_a_bad_magic_closes_the_connection() {
    let (addr, _stop, mut others) = start().await;
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    conn.write_all(&MAGIC).await.unwrap();
    let mut head = [0u8; HEADER];
    head[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    conn.write_all(&head).await.unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(conn.read(&mut buf).await.unwrap(), 0, "the server closes the connection");

    // The HTTP/2 preface is gRPC's: handed on, not answered.
    let mut other = TcpStream::connect(&addr).await.unwrap();
    other.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    other.write_all(b"\r\nSM\r\n\r\n").await.unwrap();
    use tokio_stream::StreamExt;
    let handed = tokio::time::timeout(Duration::from_secs(5), others.next()).await.unwrap().unwrap().unwrap();
    let mut preface = [0u8; 3];
    let mut handed = handed;
    handed.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface, b"PRI", "the other protocol's bytes are left unread for it");

    // Bytes of neither protocol are closed at once, not handed on nor waited on.
    let mut garbage = TcpStream::connect(&addr).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    assert_eq!(garbage.read(&mut buf).await.unwrap_or(0), 0, "the server closes the connection");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_restarted_server_is_reached_on_a_new_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (_others, _accepting) = serve(listener, Arc::new(Fake), stopped);
    let c = client(&addr.to_string());
    let req = || p::ReadShardRequest { id: None, offset: 1, len: 1, ..Default::default() };
    c.call::<_, p::ReadShardReply>(1, req()).await.unwrap();
    stop.send(true).unwrap();
    // The server closes its connections; once its pooled connection reads as closed, a call to
    // the restarted server goes over a fresh one.
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.idle.lock().unwrap().iter().any(|(conn, _)| still_open(conn.tcp())) {
        assert!(Instant::now() < deadline, "the pooled connection never saw the close");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("rebind {addr}: {e}"),
        }
    };
    let (_stop2, stopped) = tokio::sync::watch::channel(false);
    let (_others2, _accepting2) = serve(listener, Arc::new(Fake), stopped);
    assert_eq!(c.call::<_, p::ReadShardReply>(1, req()).await.unwrap().data.len(), 1);
}

#[tokio::test]
async fn no_answer_in_time_or_no_server_is_unavailable() {
    let (addr, _stop, _others) = start().await;
    let c = WireClient::new(&addr, Role::Chunk, Duration::from_secs(1), Duration::from_millis(200));
    let e = c.call::<_, p::Empty>(4, p::Empty {}).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(c.idle.lock().unwrap().is_empty(), "a timed-out connection is not reused");

    let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let e = client(&free).check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test]
async fn concurrent_calls_each_get_their_own_answer() {
    let (addr, _stop, _others) = start().await;
    let c = Arc::new(client(&addr));
    let calls = (0..64u64).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            let reply: p::ReadShardReply = c
                .call(1, p::ReadShardRequest { id: None, offset: i, len: i * 1000, ..Default::default() })
                .await
                .unwrap();
            assert_eq!((reply.shard_len, reply.data.len() as u64), (i, i * 1000));
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
    assert!(c.idle.lock().unwrap().len() <= IDLE_PER_SERVER);
}

#[tokio::test]
async fn a_frame_longer_than_the_eager_allocation_arrives_whole() {
    let (addr, _stop, _others) = start().await;
    let c = client(&addr);
    let data: Vec<u8> = (0..(2 * EAGER_ALLOC) + 4097).map(|i| (i % 253) as u8).collect();
    let sum: u64 = data.iter().map(|b| *b as u64).sum();
    let reply: p::WriteShardReply = c
        .call(2, p::WriteShardRequest { id: None, data: Bytes::from(data.clone()), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(reply.tier, format!("{} {sum}", data.len()));
}

#[tokio::test]
async fn bulk_bytes_for_a_method_without_them_are_read_past_unkept() {
    let (addr, _stop, _others) = start().await;
    let mut conn = raw(&addr, "127.0.0.1").await;
    // Method 1 takes no bulk part: 8 MiB of it are skipped, not buffered, and refused.
    let mut head = vec![0; HEADER];
    write_header(&mut head, 0, 8 << 20, &1u16.to_le_bytes(), 0).unwrap();
    write_frame(&mut conn, &head, &vec![7u8; 8 << 20]).await.unwrap();
    let (status, kind, message, _) = read_reply(&mut conn).await.unwrap();
    assert_eq!((status, ErrorKind::from_index(kind)), (STATUS_ERROR, Some(ErrorKind::InvalidArgument)));
    assert!(String::from_utf8_lossy(&message).contains("bulk part"));
    // The connection is still in step.
    let req = p::ReadShardRequest { id: None, offset: 3, len: 2, ..Default::default() };
    let mut head = vec![0; HEADER];
    prost::Message::encode(&req, &mut head).unwrap();
    let body_len = head.len() - HEADER;
    write_header(&mut head, body_len, 0, &1u16.to_le_bytes(), 0).unwrap();
    write_frame(&mut conn, &head, &[]).await.unwrap();
    let (status, _, _, bulk) = read_reply(&mut conn).await.unwrap();
    assert_eq!((status, &bulk[..]), (STATUS_OK, &b"xx"[..]));
}

#[tokio::test]
async fn a_slow_or_stalled_request_and_an_idle_connection_are_closed() {
    let (addr, _stop, _others, _) = start_with(short(100, 100)).await;
    // A header promising 1 MiB, then a trickle that stops: cut after `transfer`.
    let mut slow = raw(&addr, "127.0.0.1").await;
    let mut head = vec![0; HEADER];
    write_header(&mut head, 0, 1 << 20, &2u16.to_le_bytes(), 0).unwrap();
    slow.write_all(&head).await.unwrap();
    slow.write_all(&[1; 100]).await.unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await, "a stalled request is cut off");
    assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
    // One that sends nothing at all, or half the magic: closed after `hello`.
    for first in [&b""[..], &MAGIC[..3]] {
        let mut silent = TcpStream::connect(&addr).await.unwrap();
        silent.write_all(first).await.unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut silent, Duration::from_secs(5)).await, "a silent connection is closed");
        assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
    }
    // A connection that sends nothing after the magic: closed after `idle`.
    let mut idle = raw(&addr, "127.0.0.1").await;
    let started = Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await, "an idle connection is closed");
    assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", started.elapsed());
    // Meanwhile and after, a real client is served.
    let c = client(&addr);
    c.call::<_, p::ReadShardReply>(
        1,
        p::ReadShardRequest { id: None, offset: 0, len: 5, ..Default::default() },
    )
    .await
    .unwrap();
}

/// A raw request for a 32 MiB shard read: more than the socket buffers hold.
fn big_read() -> Vec<u8> {
    let req = p::ReadShardRequest { id: None, offset: 0, len: 32 << 20, ..Default::default() };
    let mut head = vec![0; HEADER];
    prost::Message::encode(&req, &mut head).unwrap();
    let body_len = head.len() - HEADER;
    write_header(&mut head, body_len, 0, &1u16.to_le_bytes(), 0).unwrap();
    head
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off() {
    let (addr, _stop, _others, _) = start_with(short(100, 100)).await;
    let mut greedy = raw(&addr, "127.0.0.1").await;
    greedy.write_all(&big_read()).await.unwrap();
    // Its reply is not taken: the server cuts it once `transfer` passes, so what can be read
    // afterwards is only what the kernel buffered, not the whole reply.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), greedy.read(&mut buf)).await {
            Err(_) => panic!("the connection was neither cut nor finished"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got += n,
        }
    }
    assert!(got < 32 << 20, "the whole reply arrived ({got} bytes): the server waited for the reader");
}

#[tokio::test]
async fn a_stopping_server_does_not_wait_long_for_a_client_that_stopped_reading() {
    let limits = Limits { transfer: Duration::from_secs(120), ..Limits::default() };
    let (addr, stop, _others, accepting) = start_with(limits).await;
    let mut stuck = raw(&addr, "127.0.0.1").await;
    stuck.write_all(&big_read()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).unwrap();
    let started = Instant::now();
    tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(5), accepting).await.unwrap().unwrap();
    let took = started.elapsed();
    assert!(took >= SHUTDOWN_GRACE - Duration::from_millis(100), "the grace was not given: {took:?}");
    assert!(took < SHUTDOWN_GRACE + Duration::from_secs(2), "{took:?}");
    drop(stuck);
}

#[tokio::test]
async fn connections_beyond_the_limits_are_closed_and_others_still_served() {
    let (addr, _stop, _others, _) =
        start_with(Limits { connections_per_peer: 3, connections: 5, ..Limits::default() }).await;
    // Three from 127.0.0.1 are admitted and served; the fourth is closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(raw(&addr, "127.0.0.1").await);
    }
    let mut fourth = raw(&addr, "127.0.0.1").await;
    assert!(closed_within(&mut fourth, Duration::from_secs(5)).await, "the fourth from one address");
    // Another address still gets in, up to the total of 5.
    let mut second = [raw(&addr, "127.0.0.2").await, raw(&addr, "127.0.0.2").await];
    let mut sixth = raw(&addr, "127.0.0.3").await;
    assert!(closed_within(&mut sixth, Duration::from_secs(5)).await, "the sixth in total");
    for conn in &mut second {
        assert!(!closed_within(conn, Duration::from_millis(200)).await, "admitted ones stay open");
    }
    // Once some close, new ones are admitted and served again.
    held.clear();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match client(&addr)
            .call::<_, p::ReadShardReply>(
                1,
                p::ReadShardRequest { id: None, offset: 0, len: 1, ..Default::default() },
            )
            .await
        {
            Ok(r) => break assert_eq!(r.data.len(), 1),
            Err(e) => assert!(Instant::now() < deadline, "never admitted again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn frames_are_checked_as_the_fuzz_target_reads_them() {
    let frame = |method: u16, body: &[u8], bulk: &[u8]| {
        let mut f = vec![0; HEADER];
        write_header(&mut f, body.len(), bulk.len(), &method.to_le_bytes(), 0).unwrap();
        f.extend_from_slice(body);
        f.extend_from_slice(bulk);
        f
    };
    let lookup =
        prost::Message::encode_to_vec(&p::LookupRequest { parent: 1, name: b"a".to_vec(), caller: None });
    let write = prost::Message::encode_to_vec(&p::WriteShardRequest {
        id: None,
        data: Bytes::from_static(b"in body"),
        ..Default::default()
    });
    assert!(meta::check_request(meta::ids::lookup, lookup.clone().into(), Bytes::new()).is_ok());
    assert!(chunk::check_request(chunk::ids::write_shard, write.clone().into(), Bytes::new()).is_ok());
    // Shard data both in the body and in the bulk part is refused, as the server refuses it.
    let e = chunk::check_request(chunk::ids::write_shard, write.clone().into(), Bytes::from_static(b"x"));
    assert_eq!(e.unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert!(meta::check_request(999, Bytes::new(), Bytes::new()).is_err());
    // Two whole frames, then one cut short: two are read.
    let mut stream = frame(meta::ids::lookup, &lookup, &[]);
    stream.extend(frame(chunk::ids::write_shard, &[], b"bulk"));
    stream.extend(&frame(meta::ids::lookup, &lookup, &[])[..HEADER + 1]);
    assert_eq!(check_frames(&stream, false).await, 2);
    // A reply: its type chosen by the header's last two bytes; an error reply is the server's error.
    let mut reply = frame(0, b"gone", &[]);
    reply[8] = STATUS_ERROR;
    reply[9] = ErrorKind::NotFound.index();
    assert_eq!(check_frames(&reply, true).await, 1);
    let e = meta::check_reply(
        meta::ids::lookup,
        STATUS_ERROR,
        ErrorKind::NotFound.index(),
        "gone".into(),
        Bytes::new(),
    );
    assert_eq!(e.unwrap_err().kind(), ErrorKind::NotFound);
}
