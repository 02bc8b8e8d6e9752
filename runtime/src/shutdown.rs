//! Shutdown on SIGTERM (the kubelet stopping a container) or SIGINT (ctrl-c).

use std::future::Future;

/// Install the SIGTERM and SIGINT handlers now, so a signal that arrives during start-up is not
/// lost; the returned future completes on either. Needs a tokio runtime.
pub fn signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
    })
}
