//! The one HTTP/1 server every rocefabric listener runs on (the node daemon's and the operator's
//! `/metrics` and health endpoints), hardened for the host network, where any pod on the node can
//! connect and no NetworkPolicy applies.
//!
//! Who may cross: anyone who can reach the port (Prometheus, the kubelet's probes, and any pod).
//! What no one may do: hold memory or connections without sending a request. Each connection
//! must send its request headers within [`Limits::header_timeout`] (also while idle between
//! keep-alive requests), buffers at most [`Limits::max_buf`] bytes, and lives at most
//! [`Limits::lifetime`]. At most [`Limits::max_connections`] are open at once, and at most
//! [`Limits::max_per_source`] from one address, so one pod that opens hundreds cannot crowd out the
//! kubelet's probes or Prometheus, which come from other addresses. A connection over a cap is
//! closed at once, before anything is read from it. Connections from this machine itself (the
//! peer's address is the one it connected to: the kubelet probing a host-network pod) are outside
//! the caps, so pods that open many connections from many addresses still cannot fail the
//! kubelet's probes and get the daemon restarted.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What one listener allows its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A request's headers must arrive within this (the first, and each keep-alive one).
    pub header_timeout: Duration,
    /// A connection is closed this long after it was accepted, whatever it is doing.
    pub lifetime: Duration,
    /// Connections open at once, from everyone.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_per_source: usize,
    /// The most a connection buffers (hyper's minimum is 8 KiB); requests here are small GETs.
    pub max_buf: usize,
}

impl Default for Limits {
    /// Room for a Prometheus or two, the kubelet's probes and a person with curl; a scrape of
    /// these endpoints takes milliseconds, so the timeouts cost a well-behaved client nothing.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(60),
            max_connections: 64,
            max_per_source: 8,
            max_buf: 16 << 10,
        }
    }
}

/// How long shutdown waits for the requests in flight.
const DRAIN: Duration = Duration::from_secs(5);
/// How long accepting pauses after an error such as `EMFILE` (a tight loop would spin).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serve `app` on `listener` within `limits` until `shutdown` completes, then let the requests in
/// flight finish (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_buf.max(8 << 10));
    let builder = Arc::new(builder);
    let slots = Slots::new(limits);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let local = stream.local_addr().ok().map(|a| a.ip());
        let slot = if local == Some(peer.ip()) {
            None
        } else {
            match slots.take(peer) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(%peer, "connection refused: over the connection cap");
                    continue;
                }
            }
        };
        let builder = Arc::clone(&builder);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            // The watch's guard is not Send: dropped here, never held across an await.
            let stopping = async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            };
            let _slot = slot;
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let served = tokio::time::timeout(limits.lifetime, async {
                tokio::select! {
                    result = conn.as_mut() => result,
                    () = stopping => {
                        conn.as_mut().graceful_shutdown();
                        conn.as_mut().await
                    }
                }
            })
            .await;
            match served {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%peer, %error, "connection ended"),
                Err(_) => tracing::debug!(%peer, "connection closed at its lifetime"),
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    if tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        connections.abort_all();
    }
    Ok(())
}

/// Open connections, in all and per source address.
#[derive(Clone)]
struct Slots {
    limits: Limits,
    open: Arc<Mutex<Open>>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Slots {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `peer`, if both caps leave room.
    fn take(&self, peer: SocketAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let from = open.by_source.get(&peer.ip()).copied().unwrap_or(0);
        if open.total >= self.limits.max_connections || from >= self.limits.max_per_source {
            return None;
        }
        open.total += 1;
        open.by_source.insert(peer.ip(), from + 1);
        Some(Slot {
            slots: self.clone(),
            source: peer.ip(),
        })
    }
}

/// A connection's place under the caps, given back when it is dropped.
struct Slot {
    slots: Slots,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests;
