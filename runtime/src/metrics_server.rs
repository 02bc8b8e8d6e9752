//! The node processes' HTTP endpoint: `/metrics` (OpenMetrics text of a registry) and `/healthz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::http_server::{self, Limits};

/// The content type of the OpenMetrics text format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encode `registry` as OpenMetrics text; `None` when encoding fails.
pub fn encode(registry: &Registry) -> Option<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).ok()?;
    Some(text)
}

/// Serve `/metrics` and `/healthz` on `addr` until `shutdown` completes, within the default
/// [`Limits`] (the node's port is on the host network: any pod can reach it).
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                async move {
                    match encode(&registry) {
                        Some(text) => (StatusCode::OK, [(CONTENT_TYPE, OPENMETRICS)], text),
                        None => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(CONTENT_TYPE, "text/plain")],
                            "metrics encoding failed".to_string(),
                        ),
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving metrics");
    http_server::serve(listener, app, Limits::default(), shutdown).await
}
