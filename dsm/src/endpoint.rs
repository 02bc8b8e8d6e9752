//! The rendezvous endpoint: a TCP listener on the pod IP that connects a queue pair to each peer
//! that asks (see [`crate::wire`]). It is the only place the owner's CPU takes part: once a peer is
//! connected, its reads, writes and atomics land in the window without this process seeing them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{DsmError, Result};
use crate::verbs::{Hca, Registered};
use crate::wire::{self, Hello, Offer, Reply};

/// Who this endpoint exposes.
pub struct Exposed {
    pub fabric: String,
    pub pod: String,
    pub uid: String,
    pub base: u64,
    pub size: u64,
    pub hca: Arc<Hca>,
    pub window: Registered,
}

/// A running endpoint; stops (and destroys its peers' queue pairs) when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({})", self.addr)
    }
}

/// How long a peer has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

impl Endpoint {
    /// Listen on `listen` and serve `exposed` from a background thread.
    pub fn start(listen: SocketAddr, exposed: Exposed) -> Result<Endpoint> {
        let listener = TcpListener::bind(listen)
            .map_err(|e| DsmError::input("listen address", listen.to_string(), e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| DsmError::input("listen address", listen.to_string(), e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| DsmError::input("listen address", addr.to_string(), e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let exposed = Arc::new(exposed);
        let thread = {
            let (stop, accepted) = (Arc::clone(&stop), Arc::clone(&accepted));
            std::thread::Builder::new()
                .name("dsm-endpoint".into())
                .spawn(move || accept_loop(listener, exposed, stop, accepted))
                .map_err(|e| DsmError::input("endpoint thread", "", e.to_string()))?
        };
        Ok(Endpoint {
            addr,
            stop,
            accepted,
            thread: Some(thread),
        })
    }

    /// The bound address (the port is the rendezvous port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Peers connected so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    exposed: Arc<Exposed>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let (exposed, stop, accepted) = (
                    Arc::clone(&exposed),
                    Arc::clone(&stop),
                    Arc::clone(&accepted),
                );
                let _ = std::thread::Builder::new()
                    .name("dsm-peer".into())
                    .spawn(move || {
                        let span = tracing::info_span!("peer", %peer);
                        let _e = span.enter();
                        match serve_peer(stream, &exposed, &stop, &accepted) {
                            Ok(()) => tracing::debug!("peer disconnected"),
                            Err(e) => tracing::warn!(error = %e, "peer refused or failed"),
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One peer: read its hello, refuse it or connect a queue pair to it and answer, then hold the
/// queue pair until the peer closes the stream (or the endpoint stops).
fn serve_peer(
    stream: TcpStream,
    me: &Exposed,
    stop: &AtomicBool,
    accepted: &AtomicU64,
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut reader =
        BufReader::new(stream.try_clone().map_err(|e| e.to_string())?).take(wire::MAX_LINE as u64);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("reading hello: {e}"))?;
    let mut out = stream;
    let hello: Hello = match serde_json::from_str(&line) {
        Ok(h) => h,
        Err(e) => {
            let _ = out.write_all(&wire::encode(&Reply::Refuse(format!("not a hello: {e}"))));
            return Err(format!("not a hello: {e}"));
        }
    };
    if let Some(why) = wire::check_hello(&hello, &me.pod, &me.uid, &me.fabric) {
        let _ = out.write_all(&wire::encode(&Reply::Refuse(why.clone())));
        return Err(format!(
            "refused {} ({}): {why}",
            hello.from_pod, hello.from_uid
        ));
    }
    let mut qp = me.hca.queue_pair(4).map_err(|e| e.to_string())?;
    qp.connect(hello.qp).map_err(|e| e.to_string())?;
    let offer = Offer {
        pod: me.pod.clone(),
        uid: me.uid.clone(),
        qp: qp.address(),
        base: me.base,
        size: me.size,
        addr: me.window.mapping.addr(),
        rkey: me.window.rkey(),
    };
    out.write_all(&wire::encode(&Reply::Accept(offer)))
        .map_err(|e| format!("answering: {e}"))?;
    accepted.fetch_add(1, Ordering::Relaxed);
    tracing::info!(from = %hello.from_pod, qpn = hello.qp.qpn, "peer connected");
    // Hold the queue pair while the peer holds the stream; the peer never sends more.
    let mut inner = reader.into_inner();
    inner
        .get_mut()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        match inner.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    drop(qp);
    Ok(())
}
