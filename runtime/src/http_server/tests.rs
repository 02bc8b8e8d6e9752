//! The limits, tried over loopback as a hostile client would, from `127.0.0.2` and up, while a
//! well-behaved client on `127.0.0.1`, the server's own address (as the kubelet is to a
//! host-network pod), is served.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

use super::*;

const SHORT: Limits = Limits {
    header_timeout: Duration::from_millis(300),
    lifetime: Duration::from_secs(3),
    max_connections: 6,
    max_per_source: 3,
    max_buf: 8 << 10,
};

async fn start(limits: Limits) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("its address");
    let app = axum::Router::new().route("/healthz", get(|| async { "ok" }));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(listener, app, limits, async {
            let _ = stopped.await;
        })
        .await
        .expect("serves");
    });
    (addr, stop, task)
}

/// A connection to `addr` from `source` (any 127/8 address is this machine's).
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.bind((source, 0).into()).expect("bind the source");
    socket.connect(addr).await.expect("connect")
}

/// `GET /healthz` from 127.0.0.1: the status line, or why there is none.
async fn healthz(addr: SocketAddr) -> Result<String, String> {
    let mut stream = connect_from(Ipv4Addr::LOCALHOST, addr).await;
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut raw))
        .await
        .map_err(|_| "no answer in 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    raw.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "closed without an answer".to_string())
}

/// Whether the server closed `stream` within `within` (end of file or a reset).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_closed_and_others_are_served() {
    let (addr, stop, task) = start(SHORT).await;
    let mut slow = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("half a request");
    let began = Instant::now();
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    assert!(
        closed_within(&mut slow, Duration::from_secs(3)).await,
        "a slow-header connection is closed at the header timeout"
    );
    assert!(began.elapsed() >= SHORT.header_timeout, "not before it");
    // Idle after a request counts too: a keep-alive connection must send its next headers in time.
    let mut idle = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("a request");
    assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
    stop.send(()).expect("the server runs");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops")
        .expect("no panic");
}

#[tokio::test]
async fn one_source_cannot_take_every_connection() {
    let limits = Limits {
        header_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(30),
        ..SHORT
    };
    let (addr, stop, _task) = start(limits).await;
    let hostile = Ipv4Addr::new(127, 0, 0, 2);
    let mut held = Vec::new();
    for _ in 0..limits.max_per_source {
        held.push(connect_from(hostile, addr).await);
    }
    // Let the server accept them before the next one is judged.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut over = connect_from(hostile, addr).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(2)).await,
        "the source's next connection is closed at once"
    );
    for held in &mut held {
        assert!(
            !closed_within(held, Duration::from_millis(50)).await,
            "those under the cap stay open"
        );
    }
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = connect_from(hostile, addr).await;
    assert!(
        !closed_within(&mut again, Duration::from_millis(300)).await,
        "closed connections give their slots back"
    );
    let _ = stop.send(());
}

#[tokio::test]
async fn the_total_cap_holds_across_sources_and_frees_at_the_lifetime() {
    let limits = Limits {
        header_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(2),
        max_connections: 4,
        max_per_source: 2,
        ..SHORT
    };
    let (addr, stop, _task) = start(limits).await;
    let mut held = Vec::new();
    for host in [2, 3] {
        for _ in 0..2 {
            held.push(connect_from(Ipv4Addr::new(127, 0, 0, host), addr).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut over = connect_from(Ipv4Addr::new(127, 0, 0, 4), addr).await;
    assert!(closed_within(&mut over, Duration::from_secs(1)).await);
    assert_eq!(
        healthz(addr).await.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "a client on the server's own address (the kubelet, for a host-network pod) is outside the caps"
    );
    for held in &mut held {
        assert!(
            closed_within(held, Duration::from_secs(5)).await,
            "closed at the lifetime, whatever it does"
        );
    }
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    let _ = stop.send(());
}

#[tokio::test]
async fn headers_larger_than_the_buffer_are_refused() {
    let (addr, stop, _task) = start(SHORT).await;
    let mut big = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await;
    let filler = "x".repeat(64 << 10);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n");
    // The server may close before all of it is written.
    let _ = big.write_all(request.as_bytes()).await;
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), big.read_to_string(&mut answer)).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "refused, not served: {answer:?}"
    );
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    let _ = stop.send(());
}
