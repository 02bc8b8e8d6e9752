//! The HTTP endpoints over a real loopback socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rocefabric_api::NodeCounts;
use rocefabric_operator::http::{self, AppState, Health};
use rocefabric_operator::metrics::{FabricFigures, Metrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    (status, head.to_string(), body.to_string())
}

async fn start() -> (
    SocketAddr,
    Arc<Health>,
    Arc<Metrics>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let health = Arc::new(Health::default());
    let metrics = Arc::new(Metrics::new());
    let (listener, addr) = http::bind(([127, 0, 0, 1], 0).into())
        .await
        .expect("bind loopback");
    let shutdown = CancellationToken::new();
    let state = AppState {
        health: health.clone(),
        metrics: metrics.clone(),
    };
    let stop = shutdown.clone();
    let task =
        tokio::spawn(async move { http::serve(listener, state, stop).await.expect("serves") });
    (addr, health, metrics, shutdown, task)
}

#[tokio::test]
async fn healthz_always_readyz_only_after_sync() {
    let (addr, health, _metrics, shutdown, task) = start().await;
    assert_eq!(get(addr, "/healthz").await.0, 200);
    let (status, _, body) = get(addr, "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "caches not synced\n"));
    health.set_ready(true);
    assert_eq!(get(addr, "/readyz").await.0, 200);
    assert_eq!(get(addr, "/nope").await.0, 404);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops on shutdown")
        .expect("no panic");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener closed after shutdown"
    );
}

#[tokio::test]
async fn metrics_are_served_as_openmetrics() {
    let (addr, _health, metrics, shutdown, _task) = start().await;
    metrics.pass(Duration::from_millis(12));
    metrics.failure("conflict");
    let figures = FabricFigures {
        nodes: NodeCounts {
            selected: 3,
            configured: 2,
            failed: 1,
            conflicting: 0,
        },
        regions_allocated: 5,
        regions_capacity: 16,
        pods_waiting: 0,
    };
    metrics.set_fabrics([("dgx", &figures)]);
    let (status, head, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    for line in [
        "rocefabric_operator_reconciles_total 1",
        r#"rocefabric_operator_reconcile_failures_total{reason="conflict"} 1"#,
        r#"rocefabric_operator_nodes{fabric="dgx",state="selected"} 3"#,
        r#"rocefabric_operator_nodes{fabric="dgx",state="failed"} 1"#,
        r#"rocefabric_operator_regions_allocated{fabric="dgx"} 5"#,
        "rocefabric_operator_reconcile_duration_seconds_bucket",
        "rocefabric_operator_leader 0",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    shutdown.cancel();
}

/// `/healthz` fails while this replica leads and its reconcile loop has finished no pass for
/// longer than allowed (a loop stuck in a hung call): the liveness probe restarts the pod and
/// another replica takes over. A follower is never judged.
#[tokio::test]
async fn healthz_fails_when_the_leading_loop_stops_making_progress() {
    let (addr, health, _metrics, shutdown, task) = start().await;
    health.set_stall_after(Duration::from_secs(1));
    health.progress(true);
    assert_eq!(get(addr, "/healthz").await.0, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, _, body) = get(addr, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("finished no pass"), "{body}");
    health.progress(true);
    assert_eq!(get(addr, "/healthz").await.0, 200, "a pass again");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    health.progress(false);
    assert_eq!(
        get(addr, "/healthz").await.0,
        200,
        "followers are not judged"
    );
    shutdown.cancel();
    task.await.expect("server stops");
}
