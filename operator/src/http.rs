//! The operator's HTTP endpoints: `/healthz` (the process serves, and while it leads, its
//! reconcile loop has finished a pass recently: a loop stuck in a hung call or a deadlock gets the
//! pod restarted by its liveness probe), `/readyz` (every watched
//! cache has listed once; true on followers too, which keep warm caches to take over fast) and
//! `/metrics` (OpenMetrics text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rocefabric_runtime::http_server::{self, Limits};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Readiness shared between the controller (which sets it) and the server (which reports it).
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    progress: std::sync::Mutex<Progress>,
}

/// The leader's reconcile loop, as `/healthz` judges it.
#[derive(Debug, Default)]
struct Progress {
    /// While leading: when the loop last finished a pass (or began leading).
    last: Option<tokio::time::Instant>,
    /// How long without a pass counts as stuck; zero never does.
    stall_after: std::time::Duration,
}

impl Health {
    /// How long the leader's loop may go without finishing a pass before `/healthz` fails.
    pub fn set_stall_after(&self, after: std::time::Duration) {
        self.lock_progress().stall_after = after;
    }

    /// The loop made progress now (`leading`), or is not leading (nothing to judge).
    pub fn progress(&self, leading: bool) {
        self.lock_progress().last = leading.then(tokio::time::Instant::now);
    }

    /// How long the leading loop has gone without a pass, when that is longer than allowed.
    pub fn stalled_for(&self) -> Option<std::time::Duration> {
        let p = self.lock_progress();
        let idle = p.last?.elapsed();
        (!p.stall_after.is_zero() && idle > p.stall_after).then_some(idle)
    }

    fn lock_progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Mark the caches synced (or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the caches have synced.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

/// State of the HTTP handlers.
#[derive(Clone, Debug)]
pub struct AppState {
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
}

/// Errors of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("http server on {addr} failed: {source}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The router with the three endpoints.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.health.stalled_for() {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(idle) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "leading, but the reconcile loop finished no pass for {}s\n",
                idle.as_secs()
            ),
        )
            .into_response(),
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.health.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n").into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics.render() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "failed to encode metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to encode metrics\n",
            )
                .into_response()
        }
    }
}

/// Bind `addr` (port 0 picks a free one); returns the listener and the address it got.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), HttpError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| HttpError::Bind { addr, source })?;
    Ok((listener, local))
}

/// Serve on `listener` until `shutdown` is cancelled, then finish in-flight requests (a few
/// seconds at most).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> Result<(), HttpError> {
    let addr = listener.local_addr().map_err(|source| HttpError::Bind {
        addr: ([0, 0, 0, 0], 0).into(),
        source,
    })?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    // On the host network (any pod can connect): header timeout, connection caps, small buffers.
    http_server::serve(
        listener,
        router(state),
        Limits::default(),
        shutdown.cancelled_owned(),
    )
    .await
    .map_err(|source| HttpError::Serve { addr, source })
}
