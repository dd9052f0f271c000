//! Behaviour of links and listeners over real loopback sockets.

use redoubt_transport::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An address nothing listens on (bound once by the OS, then released).
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind(any_port()).unwrap();
    l.local_addr().unwrap()
}

fn link_cfg() -> LinkConfig {
    LinkConfig {
        frames_queued_max: 4096,
        bytes_queued_max: 64 << 20,
        frame_bytes_max: 1 << 20,
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        connect_timeout: Duration::from_secs(1),
    }
}

fn listener_cfg() -> ListenerConfig {
    ListenerConfig {
        frame_bytes_max: 1 << 20,
        per_conn_queue_max: 4096,
        per_conn_queue_bytes_max: 64 << 20,
        connections_max: 16,
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

async fn recv<T>(rx: &mut mpsc::Receiver<T>) -> T {
    timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a frame")
        .expect("channel open")
}

fn frame(i: usize) -> Vec<u8> {
    // Sizes from 0 up to ~9 KB, contents tied to the index.
    (0..(i * 37) % 9000).map(|j| (i + j) as u8).collect()
}

#[tokio::test]
async fn roundtrip_many_frames_both_ways() {
    let (srv_tx, mut srv_rx) = mpsc::channel(8192);
    let listener = Listener::bind(any_port(), listener_cfg(), srv_tx)
        .await
        .unwrap();
    let (cli_tx, mut cli_rx) = mpsc::channel(8192);
    let link = Link::spawn(listener.local_addr(), link_cfg(), cli_tx);
    const N: usize = 2000;
    for i in 0..N {
        link.send(Arc::new(frame(i))).unwrap();
    }
    let mut conn = None;
    for i in 0..N {
        let (c, f) = recv(&mut srv_rx).await;
        assert_eq!(f, frame(i), "frame {i} in order and intact");
        assert!(conn.unwrap_or(c) == c, "one connection");
        conn = Some(c);
        // Echo back on the same connection.
        listener.send(c, Arc::new(f)).unwrap();
    }
    for i in 0..N {
        assert_eq!(recv(&mut cli_rx).await, frame(i));
    }
    let ls = link.stats();
    assert!(ls.connected);
    assert_eq!((ls.frames_sent, ls.frames_received), (N as u64, N as u64));
    assert_eq!(ls.queue_len, 0);
    let ss = listener.stats();
    assert_eq!((ss.accepted, ss.connections_open), (1, 1));
    assert_eq!((ss.frames_received, ss.frames_sent), (N as u64, N as u64));
    // Frames above the maximum are refused locally, not sent.
    assert_eq!(
        link.send(Arc::new(vec![0; (1 << 20) + 1])),
        Err(LinkError::TooLarge {
            len: (1 << 20) + 1,
            max: 1 << 20
        })
    );
    link.close();
    assert_eq!(link.send(Arc::new(vec![1])), Err(LinkError::Closed));
    eventually("link disconnect", || !link.stats().connected).await;
    eventually("server side close", || {
        listener.stats().connections_open == 0
    })
    .await;
    assert_eq!(
        listener.send(conn.unwrap(), Arc::new(vec![1])),
        Err(LinkError::UnknownConn)
    );
}

#[tokio::test]
async fn oversized_length_prefix_closes_the_connection() {
    let (srv_tx, mut srv_rx) = mpsc::channel(16);
    let listener = Listener::bind(any_port(), listener_cfg(), srv_tx)
        .await
        .unwrap();
    let mut raw = TcpStream::connect(listener.local_addr()).await.unwrap();
    // Claims a 4 GiB frame, then starts sending it.
    raw.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let _ = raw.write_all(&[0xAB; 1024]).await;
    let mut buf = [0u8; 16];
    let n = timeout(WAIT, raw.read(&mut buf))
        .await
        .expect("server closes the connection");
    assert!(matches!(n, Ok(0) | Err(_)), "closed without a reply: {n:?}");
    eventually("rejection counted", || {
        let s = listener.stats();
        s.rejected_too_large == 1 && s.connections_open == 0
    })
    .await;
    assert!(srv_rx.try_recv().is_err(), "nothing delivered");

    // The listener keeps serving, and a frame of exactly the maximum still goes through.
    let (cli_tx, mut cli_rx) = mpsc::channel(16);
    let link = Link::spawn(listener.local_addr(), link_cfg(), cli_tx);
    link.send(Arc::new(vec![1u8; 1 << 20])).unwrap();
    let (conn, f) = recv(&mut srv_rx).await;
    assert_eq!(f.len(), 1 << 20);
    listener.send(conn, Arc::new(vec![2u8; 1 << 20])).unwrap();
    assert_eq!(recv(&mut cli_rx).await.len(), 1 << 20);
}

#[tokio::test]
async fn link_rejects_oversized_frames_from_the_server() {
    // A raw server that answers the first frame with a length prefix of 3 GiB.
    let server = tokio::net::TcpListener::bind(any_port()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (cli_tx, _cli_rx) = mpsc::channel(16);
    let link = Link::spawn(addr, link_cfg(), cli_tx);
    let (mut s, _) = server.accept().await.unwrap();
    s.write_all(&(3u32 << 30).to_be_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let n = timeout(WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)));
    eventually("too large counted", || link.stats().closed_too_large == 1).await;
    // It reconnects.
    let (_s2, _) = timeout(WAIT, server.accept()).await.unwrap().unwrap();
    eventually("reconnected", || link.stats().reconnects == 1).await;
}

#[tokio::test]
async fn link_reconnects_after_the_server_restarts() {
    let (srv_tx, mut srv_rx) = mpsc::channel(64);
    let listener = Listener::bind(any_port(), listener_cfg(), srv_tx.clone())
        .await
        .unwrap();
    let addr = listener.local_addr();
    let (cli_tx, mut cli_rx) = mpsc::channel(64);
    let link = Link::spawn(addr, link_cfg(), cli_tx);
    link.send(Arc::new(b"one".to_vec())).unwrap();
    let (c, f) = recv(&mut srv_rx).await;
    assert_eq!(f, b"one");
    listener.send(c, Arc::new(b"ack".to_vec())).unwrap();
    assert_eq!(recv(&mut cli_rx).await, b"ack");

    // The server goes away...
    drop(listener);
    eventually("link notices", || !link.stats().connected).await;
    // ...frames sent meanwhile wait in the queue...
    link.send(Arc::new(b"two".to_vec())).unwrap();
    sleep(Duration::from_millis(100)).await;
    // ...and the server comes back on the same port.
    let start = Instant::now();
    let listener = loop {
        match Listener::bind(addr, listener_cfg(), srv_tx.clone()).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(start.elapsed() < WAIT, "rebind failed: {e}");
                sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (c, f) = recv(&mut srv_rx).await;
    assert_eq!(f, b"two", "the queued frame arrives after reconnecting");
    listener.send(c, Arc::new(b"ack2".to_vec())).unwrap();
    assert_eq!(recv(&mut cli_rx).await, b"ack2");
    let s = link.stats();
    assert!(s.connected);
    assert_eq!(s.reconnects, 1);
    assert!(s.connect_failures >= 1, "{s:?}");
}

#[tokio::test]
async fn full_link_queue_drops_and_counts() {
    let (cli_tx, _cli_rx) = mpsc::channel(4);
    let cfg = LinkConfig {
        frames_queued_max: 8,
        ..link_cfg()
    };
    let link = Link::spawn(dead_addr(), cfg, cli_tx);
    for i in 0..8u8 {
        link.send(Arc::new(vec![i])).unwrap();
    }
    for _ in 0..5 {
        assert_eq!(link.send(Arc::new(vec![9])), Err(LinkError::Full));
    }
    let s = link.stats();
    assert!(!s.connected);
    assert_eq!(
        (s.queue_len, s.frames_dropped_full, s.frames_sent),
        (8, 5, 0)
    );
    eventually("retries", || link.stats().connect_failures >= 2).await;
}

#[tokio::test]
async fn link_queue_is_bounded_in_bytes() {
    let (cli_tx, _cli_rx) = mpsc::channel(4);
    let cfg = LinkConfig {
        bytes_queued_max: 300 << 10,
        frame_bytes_max: 100 << 10,
        ..link_cfg()
    };
    let link = Link::spawn(dead_addr(), cfg, cli_tx);
    let frame = Arc::new(vec![1u8; 100 << 10]);
    for _ in 0..3 {
        link.send(frame.clone()).unwrap();
    }
    // 4,096 frames would fit; 300 KiB do not fit a fourth frame of 100 KiB, nor one byte more.
    assert_eq!(link.send(frame.clone()), Err(LinkError::Full));
    assert_eq!(link.send(Arc::new(vec![1])), Err(LinkError::Full));
    let s = link.stats();
    assert_eq!(
        (s.queue_len, s.queue_bytes, s.frames_dropped_full),
        (3, 300 << 10, 2)
    );
}

/// Queues 256 frames of 1 MiB on the connection of a peer that sends one frame and then never
/// reads: the listener, the peer's end, and how many frames were queued and dropped.
async fn flood_a_peer_that_never_reads(cfg: ListenerConfig) -> (Listener, TcpStream, u64, u64) {
    let (srv_tx, mut srv_rx) = mpsc::channel(16);
    let listener = Listener::bind(any_port(), cfg, srv_tx).await.unwrap();
    let mut raw = TcpStream::connect(listener.local_addr()).await.unwrap();
    write_frame(&mut raw, b"hi").await.unwrap();
    let (c, _) = recv(&mut srv_rx).await;
    let big = Arc::new(vec![7u8; 1 << 20]);
    let (mut queued, mut dropped) = (0, 0);
    for _ in 0..256 {
        match listener.send(c, big.clone()) {
            Ok(()) => queued += 1,
            Err(LinkError::Full) => dropped += 1,
            Err(e) => panic!("{e}"),
        }
        tokio::task::yield_now().await;
    }
    (listener, raw, queued, dropped)
}

#[tokio::test]
async fn connection_queue_is_bounded_in_bytes() {
    let cfg = ListenerConfig {
        per_conn_queue_bytes_max: 4 << 20,
        ..listener_cfg()
    };
    let (_listener, mut raw, queued, _) = flood_a_peer_that_never_reads(cfg).await;
    // The frame bound (4,096) would take all 256 MiB; the byte bound takes 4 MiB beside what
    // the writer holds and the socket buffers absorb.
    assert!((4..64).contains(&queued), "{queued} frames of 1 MiB queued");
    tokio::time::timeout(WAIT, read_frame(&mut raw, 1 << 20))
        .await
        .expect("the queued frames are written once the peer reads")
        .unwrap();
}

#[tokio::test]
async fn full_connection_queue_drops_and_counts() {
    let cfg = ListenerConfig {
        per_conn_queue_max: 2,
        ..listener_cfg()
    };
    let (listener, mut raw, _, dropped) = flood_a_peer_that_never_reads(cfg).await;
    assert!(dropped > 0, "socket buffers cannot absorb 256 MiB");
    assert_eq!(listener.stats().frames_dropped_full, dropped);
    // The connection is still usable once the peer reads.
    let _ = read_frame(&mut raw, 1 << 20).await.unwrap();
}

#[tokio::test]
async fn garbage_does_not_panic_and_the_listener_keeps_serving() {
    let (srv_tx, mut srv_rx) = mpsc::channel(1024);
    let listener = Listener::bind(any_port(), listener_cfg(), srv_tx)
        .await
        .unwrap();
    let addr = listener.local_addr();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..50 {
        let mut raw = TcpStream::connect(addr).await.unwrap();
        let len = (next() % 4096) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 3 == 0 {
            // Small valid-looking prefixes so some junk arrives as frames.
            junk.splice(0..0, 5u32.to_be_bytes());
        }
        let _ = raw.write_all(&junk).await;
        if round % 2 == 0 {
            drop(raw); // abrupt close, often mid-frame
        } else {
            let _ = raw.shutdown().await;
        }
    }
    // Whatever arrived as "frames" is the owner's to judge: it closes those connections.
    while let Ok((c, _)) = srv_rx.try_recv() {
        listener.close_conn(c);
    }
    // Still serving.
    let (cli_tx, mut cli_rx) = mpsc::channel(4);
    let link = Link::spawn(addr, link_cfg(), cli_tx);
    link.send(Arc::new(b"ping".to_vec())).unwrap();
    let c = loop {
        let (c, f) = recv(&mut srv_rx).await;
        if f == b"ping" {
            break c;
        }
        listener.close_conn(c); // late junk
    };
    listener.send(c, Arc::new(b"pong".to_vec())).unwrap();
    assert_eq!(recv(&mut cli_rx).await, b"pong");
    let sender = listener.sender(c).expect("open");
    sender.send(Arc::new(b"pong2".to_vec())).unwrap();
    assert_eq!(recv(&mut cli_rx).await, b"pong2");
    // close_conn closes the real connection too; the link comes back on its own.
    listener.close_conn(c);
    assert!(!listener.is_open(c));
    assert!(listener.sender(c).is_none());
    eventually("sender sees the close", || {
        sender.send(Arc::new(vec![1])) == Err(LinkError::UnknownConn)
    })
    .await;
    eventually("link reconnects", || link.stats().reconnects >= 1).await;
    eventually("garbage connections cleaned up", || {
        listener.stats().connections_open == 1
    })
    .await;
    assert!(listener.stats().closed_bad_frames >= 1);
}

#[tokio::test]
async fn connections_beyond_the_maximum_are_refused() {
    let (srv_tx, mut srv_rx) = mpsc::channel(16);
    let cfg = ListenerConfig {
        connections_max: 2,
        ..listener_cfg()
    };
    let listener = Listener::bind(any_port(), cfg, srv_tx).await.unwrap();
    let addr = listener.local_addr();
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    eventually("two open", || listener.stats().connections_open == 2).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 4];
    let n = timeout(WAIT, c.read(&mut buf)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "third connection closed");
    assert_eq!(listener.stats().refused_connections_max, 1);
    // The first two still work.
    write_frame(&mut a, b"a").await.unwrap();
    write_frame(&mut b, b"b").await.unwrap();
    let mut got = vec![recv(&mut srv_rx).await.1, recv(&mut srv_rx).await.1];
    got.sort();
    assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
    // Closing one makes room again.
    drop(a);
    eventually("one open", || listener.stats().connections_open == 1).await;
    let mut d = TcpStream::connect(addr).await.unwrap();
    write_frame(&mut d, b"d").await.unwrap();
    assert_eq!(recv(&mut srv_rx).await.1, b"d");
    assert_eq!(listener.stats().accepted, 3);
}

#[tokio::test]
async fn full_inbound_channel_drops_and_counts() {
    let (srv_tx, mut srv_rx) = mpsc::channel(2);
    let listener = Listener::bind(any_port(), listener_cfg(), srv_tx)
        .await
        .unwrap();
    let mut raw = TcpStream::connect(listener.local_addr()).await.unwrap();
    for i in 0..10u8 {
        write_frame(&mut raw, &[i]).await.unwrap();
    }
    eventually("all frames read", || {
        let s = listener.stats();
        s.frames_received + s.frames_dropped_inbound == 10
    })
    .await;
    let s = listener.stats();
    assert_eq!((s.frames_received, s.frames_dropped_inbound), (2, 8));
    assert_eq!(recv(&mut srv_rx).await.1, [0]);
    assert_eq!(recv(&mut srv_rx).await.1, [1]);
}

#[tokio::test]
async fn bind_error_is_returned() {
    let (tx, _rx) = mpsc::channel(1);
    let a = Listener::bind(any_port(), listener_cfg(), tx.clone())
        .await
        .unwrap();
    let err = Listener::bind(a.local_addr(), listener_cfg(), tx)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
}
