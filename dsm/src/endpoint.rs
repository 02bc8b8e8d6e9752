//! The rendezvous endpoint: a TCP listener on the pod IP that connects a queue pair to each peer
//! that asks (see [`crate::wire`]). It is the only place the owner's CPU takes part: once a peer is
//! connected, its reads, writes and atomics land in the window without this process seeing them.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// How long a peer has to send its whole hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Read one newline-terminated line of at most `max` bytes from `stream`, all of it before
/// `deadline`: a peer that sends a byte now and then cannot hold the reader past it. Each side of
/// the rendezvous sends exactly one line, so what a read brings after the newline is dropped.
pub(crate) fn read_line_by(
    mut stream: &TcpStream,
    deadline: Instant,
    max: usize,
) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timed_out = || {
            std::io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "no full line within the deadline ({} bytes came)",
                    line.len()
                ),
            )
        };
        if left.is_zero() {
            return Err(timed_out());
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out());
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end + 1);
            return String::from_utf8(line)
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e));
        }
        if line.len() > max {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("no newline in the first {max} bytes"),
            ));
        }
    }
}

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
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let line = read_line_by(&stream, deadline, wire::MAX_LINE)
        .map_err(|e| format!("reading hello: {e}"))?;
    let mut out = &stream;
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
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        match (&stream).read(&mut byte) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair over loopback: (what the test writes to, what `read_line_by` reads).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn a_line_is_read_whole_and_only_up_to_its_newline() {
        let (mut peer, me) = pair();
        peer.write_all(b"{\"hello\":1}\nrest").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(read_line_by(&me, deadline, 64).unwrap(), "{\"hello\":1}\n");
    }

    #[test]
    fn a_peer_that_trickles_bytes_is_cut_off_at_the_deadline_not_per_read() {
        let (mut peer, me) = pair();
        let trickle = std::thread::spawn(move || {
            // One byte every 50 ms for 3 s: each read returns well within any per-read timeout.
            for _ in 0..60 {
                if peer.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let e = read_line_by(&me, started + Duration::from_millis(400), 4096).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(
            e.to_string().contains("no full line within the deadline"),
            "{e}"
        );
        assert!(took < Duration::from_millis(1500), "took {took:?}");
        drop(me);
        trickle.join().unwrap();
    }

    #[test]
    fn a_line_without_newline_is_refused_past_the_limit_and_a_close_is_an_error() {
        let (mut peer, me) = pair();
        peer.write_all(&[b'x'; 600]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = read_line_by(&me, deadline, 100).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        let (peer, me) = pair();
        drop(peer);
        let e = read_line_by(&me, deadline, 100).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{e}");
    }
}
