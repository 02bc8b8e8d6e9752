//! The rendezvous endpoint: a TCP listener on the pod IP that admits the fabric's pods and connects
//! a queue pair to each (see [`crate::wire`], [`crate::handshake`]). It is the only place the
//! owner's CPU takes part: once a peer is connected, its reads, writes and atomics land in the
//! window without this process seeing them.
//!
//! Bounded: at most [`Limits::max_peers`] connections (and so threads and queue pairs) at once,
//! and [`Limits::max_per_source`] from one address, so that one pod cannot hold every slot; a
//! connection over a cap is refused at once; the whole handshake has a deadline; a peer that
//! sends nothing (not even its keepalive) for the idle timeout is dropped and its queue pair freed.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::Identity;
use crate::directory::{self, Directory};
use crate::error::{DsmError, Result};
use crate::handshake::{self, Window};
use crate::verbs::{Hca, Qp, Registered};
use crate::wire::{self, Offer, QpAddress, Reply};

/// The window this endpoint serves over the HCA.
pub struct Exposed {
    pub base: u64,
    pub size: u64,
    pub hca: Arc<Hca>,
    pub window: Registered,
}

impl Window for Exposed {
    type Conn = Qp;
    fn connect(&self, peer: QpAddress) -> Result<(Qp, Offer), String> {
        let mut qp = self.hca.queue_pair(4).map_err(|e| e.to_string())?;
        qp.connect(peer).map_err(|e| e.to_string())?;
        let offer = Offer {
            qp: qp.address(),
            base: self.base,
            size: self.size,
            addr: self.window.mapping.addr(),
            rkey: self.window.rkey(),
            proof: String::new(),
        };
        Ok((qp, offer))
    }
}

/// Who the endpoint is and whom it admits: the pods of the directory at `directory` (re-read when
/// the file changes), proving `identity`'s fabric key.
pub struct Owner {
    pub identity: Identity,
    pub directory: PathBuf,
}

/// The endpoint's bounds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once (each holds a thread and a queue pair).
    pub max_peers: usize,
    /// Connections served at once from one address (a pod's processes share its IP; each
    /// initiator holds one connection per owner).
    pub max_per_source: usize,
    /// How long a peer has for the whole handshake.
    pub handshake: Duration,
    /// A connected peer that sends nothing for this long is dropped (initiators send a keepalive
    /// every [`KEEPALIVE`]).
    pub idle: Duration,
}

/// How often an initiator tells the owners it is connected to that it is alive.
pub const KEEPALIVE: Duration = Duration::from_secs(20);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_peers: 256,
            max_per_source: 32,
            handshake: Duration::from_secs(5),
            idle: KEEPALIVE * 6,
        }
    }
}

/// A running endpoint; stops (and destroys its peers' queue pairs) when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    accepted: AtomicU64,
    busy: AtomicU64,
    active: AtomicUsize,
    peak: AtomicUsize,
    /// Connections being served per source address.
    sources: Mutex<HashMap<IpAddr, usize>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({})", self.addr)
    }
}

/// The directory file, re-read when its inode, modification time or length changed.
struct DirectoryFile {
    path: PathBuf,
    last: Mutex<Option<(directory::Stamp, Directory)>>,
}

impl DirectoryFile {
    fn current(&self) -> Result<Directory> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = directory::stamp(&self.path);
        match &*last {
            Some((s, d)) if *s == stamp && stamp.is_some() => Ok(d.clone()),
            _ => {
                let (stamp, d) = directory::read_stamped(&self.path)?;
                *last = Some((stamp, d.clone()));
                Ok(d)
            }
        }
    }
}

struct Shared<W> {
    owner: Identity,
    directory: DirectoryFile,
    window: W,
    limits: Limits,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
}

impl Endpoint {
    /// Listen on `listen` and serve `window` to the peers `owner` admits, from background threads.
    pub fn start<W: Window>(
        listen: SocketAddr,
        owner: Owner,
        window: W,
        limits: Limits,
    ) -> Result<Endpoint> {
        let listener = TcpListener::bind(listen)
            .map_err(|e| DsmError::input("listen address", listen.to_string(), e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| DsmError::input("listen address", listen.to_string(), e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| DsmError::input("listen address", addr.to_string(), e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            owner: owner.identity,
            directory: DirectoryFile {
                path: owner.directory,
                last: Mutex::new(None),
            },
            window,
            limits,
            stop: Arc::clone(&stop),
            counts: Arc::clone(&counts),
        });
        let thread = std::thread::Builder::new()
            .name("dsm-endpoint".into())
            .spawn(move || accept_loop(listener, shared))
            .map_err(|e| DsmError::input("endpoint thread", "", e.to_string()))?;
        Ok(Endpoint {
            addr,
            stop,
            counts,
            thread: Some(thread),
        })
    }

    /// The bound address (the port is the rendezvous port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TCP connections taken from the listener so far.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::Relaxed)
    }

    /// Peers connected so far.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::Relaxed)
    }

    /// Connections refused because the endpoint served its cap already.
    pub fn refused_busy(&self) -> u64 {
        self.counts.busy.load(Ordering::Relaxed)
    }

    /// Connections being served now (handshaking or connected).
    pub fn active(&self) -> usize {
        self.counts.active.load(Ordering::Relaxed)
    }

    /// The most connections served at once so far (never above the cap).
    pub fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::Relaxed)
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

/// One slot of the cap (and of its source's), given back when the connection's thread ends (or
/// never started).
struct Slot(Arc<Counts>, IpAddr);

impl Slot {
    /// Take a slot for a connection from `ip`; with it, how many the endpoint and that source
    /// now serve.
    fn take(counts: &Arc<Counts>, ip: IpAddr) -> (Slot, usize, usize) {
        let active = counts.active.fetch_add(1, Ordering::Relaxed) + 1;
        let mut sources = counts.sources.lock().unwrap_or_else(|p| p.into_inner());
        let from = sources.entry(ip).or_default();
        *from += 1;
        (Slot(Arc::clone(counts), ip), active, *from)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
        let mut sources = self.0.sources.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = sources.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                sources.remove(&self.1);
            }
        }
    }
}

fn accept_loop<W: Window>(listener: TcpListener, shared: Arc<Shared<W>>) {
    let counts = &shared.counts;
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                counts.connections.fetch_add(1, Ordering::Relaxed);
                let (slot, active, from_source) = Slot::take(counts, peer.ip());
                let limits = &shared.limits;
                if active > limits.max_peers || from_source > limits.max_per_source {
                    counts.busy.fetch_add(1, Ordering::Relaxed);
                    let why = if active > limits.max_peers {
                        format!(
                            "this pod serves {} connections already (its cap)",
                            limits.max_peers
                        )
                    } else {
                        format!(
                            "this pod serves {} connections from {} already (its cap per source)",
                            limits.max_per_source,
                            peer.ip()
                        )
                    };
                    tracing::warn!(%peer, "refused: {why}");
                    refuse_busy(&stream, why);
                    continue;
                }
                counts.peak.fetch_max(active, Ordering::Relaxed);
                let shared = Arc::clone(&shared);
                let spawned =
                    std::thread::Builder::new()
                        .name("dsm-peer".into())
                        .spawn(move || {
                            let _slot = slot;
                            let span = tracing::info_span!("peer", %peer);
                            let _e = span.enter();
                            match serve_peer(stream, peer, &shared) {
                                Ok(()) => tracing::debug!("peer disconnected"),
                                // The address too: at WARN the info span is off.
                                Err(e) => {
                                    tracing::warn!(%peer, error = %e, "peer refused or failed")
                                }
                            }
                        });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "no thread for a peer");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Tell a connection over a cap why it is closed, without waiting on it.
fn refuse_busy(mut stream: &TcpStream, why: String) {
    let _ = stream.set_nonblocking(true);
    let why = format!("{why}: try again later");
    let _ = stream.write_all(&wire::encode(&Reply::Refuse(why)));
}

/// One peer: the handshake, then hold the queue pair until the peer closes the stream, goes idle
/// past the limit, or the endpoint stops.
fn serve_peer<W: Window>(
    stream: TcpStream,
    from: SocketAddr,
    shared: &Shared<W>,
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + shared.limits.handshake;
    let directory = shared.directory.current().map_err(|e| {
        let why = format!("this pod cannot read its directory: {e}");
        let _ = (&stream).write_all(&wire::encode(&Reply::Refuse(why.clone())));
        why
    })?;
    let me = &shared.owner;
    let (conn, peer, offer) =
        handshake::respond(&stream, deadline, me, &directory, &shared.window)?;
    shared.counts.accepted.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        namespace = %me.namespace,
        pod = %peer.pod,
        uid = %peer.uid,
        %from,
        window = %me.me.pod,
        base = %format_args!("{:#x}", offer.base),
        size = offer.size,
        qpn = offer.qp.qpn,
        "peer admitted"
    );
    let idle = shared.limits.idle;
    stream
        .set_read_timeout(Some(Duration::from_millis(200).min(idle)))
        .map_err(|e| e.to_string())?;
    let mut heard = Instant::now();
    let mut buf = [0u8; 64];
    let why = loop {
        if shared.stop.load(Ordering::Relaxed) {
            break "the endpoint stops".to_string();
        }
        match (&stream).read(&mut buf) {
            Ok(0) => break "the peer closed the connection".into(),
            Ok(_) => heard = Instant::now(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => break format!("the connection failed: {e}"),
        }
        if heard.elapsed() >= idle {
            break format!("nothing heard for {idle:?}: dropping the peer");
        }
    };
    drop(conn);
    tracing::info!(pod = %peer.pod, uid = %peer.uid, %from, "{why}; queue pair destroyed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tests::key;
    use crate::handshake::tests::{FakeWindow, qp};
    use crate::handshake::{Failed, initiate};
    use crate::wire::tests::{DIR, identity};

    fn start(dir: &tempfile::TempDir, limits: Limits) -> Endpoint {
        let path = dir.path().join("regions.json");
        std::fs::write(&path, DIR).unwrap();
        let owner = Owner {
            identity: identity("b", "ub", key(1)),
            directory: path,
        };
        Endpoint::start("127.0.0.1:0".parse().unwrap(), owner, FakeWindow, limits).unwrap()
    }

    /// A member's handshake with the endpoint; the stream stays open (the connection) on success.
    fn connect(e: &Endpoint, pod: &str, uid: &str) -> Result<TcpStream, String> {
        let s = TcpStream::connect(e.addr()).map_err(|x| x.to_string())?;
        handshake_on(s, pod, uid)
    }

    /// A TCP connection to `e` from the loopback address `ip` (another pod, as the endpoint sees it).
    fn connect_from(e: &Endpoint, ip: &str) -> TcpStream {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())
            .unwrap();
        s.connect(&e.addr().into()).unwrap();
        s.into()
    }

    fn handshake_on(s: TcpStream, pod: &str, uid: &str) -> Result<TcpStream, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        initiate(
            &s,
            deadline,
            &identity(pod, uid, key(1)),
            "b",
            Some("ub"),
            || Ok::<_, String>(((), qp(1))),
        )
        .map_err(|f| match f {
            Failed::Owner(w) | Failed::Local(w) => w,
        })?;
        Ok(s)
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn members_are_admitted_strangers_refused_and_a_new_directory_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let e = start(&dir, Limits::default());
        let _a = connect(&e, "a", "ua").unwrap();
        wait_until("a is counted", || e.accepted() == 1);
        let why = connect(&e, "d", "ud").unwrap_err();
        assert!(
            why.contains("pod \"d\" is not in this pod's directory"),
            "{why}"
        );
        // d joins: the endpoint reads the changed directory at the next hello.
        let joined = DIR.replace(
            "\n]",
            ",\n{\"pod\":\"d\",\"id\":3,\"base\":12288,\"size\":4096,\"uid\":\"ud\"}\n]",
        );
        std::fs::write(dir.path().join("regions.json"), joined).unwrap();
        let _d = connect(&e, "d", "ud").unwrap();
        wait_until("d is counted", || e.accepted() == 2);
    }

    #[test]
    fn a_slow_loris_client_does_not_hold_up_others() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_peers: 4,
            handshake: Duration::from_millis(1500),
            ..Limits::default()
        };
        let e = start(&dir, limits);
        let mut loris = TcpStream::connect(e.addr()).unwrap();
        loris.write_all(b"{\"vers").unwrap();
        let started = Instant::now();
        let _a = connect(&e, "a", "ua").unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        // The loris is cut off at the handshake deadline, told why, and its slot comes back.
        let mut answer = String::new();
        loris
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = loris.read_to_string(&mut answer);
        assert!(
            answer.contains("no full line within the deadline"),
            "{answer:?}"
        );
        wait_until("the loris' slot is free", || e.active() == 1);
    }

    #[test]
    fn a_thousand_connects_never_take_more_than_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_peers: 8,
            handshake: Duration::from_millis(1500),
            ..Limits::default()
        };
        let e = start(&dir, limits);
        let held: Vec<TcpStream> = (0..1000)
            .map(|_| TcpStream::connect(e.addr()).unwrap())
            .collect();
        wait_until("every connect is taken", || e.connections() == 1000);
        assert!(e.peak() <= 8, "peak {}", e.peak());
        // Slots come back as the silent ones time out while the connects still arrive: most, not
        // all but 8, are refused.
        assert!(e.refused_busy() >= 900, "{}", e.refused_busy());
        // Those over the cap were told why.
        let mut last = held.into_iter().last().unwrap();
        let mut answer = String::new();
        last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = last.read_to_string(&mut answer);
        assert!(
            answer.contains("connections already (its cap)"),
            "{answer:?}"
        );
        // Once the silent ones time out, a member gets in.
        wait_until("the silent connections time out", || e.active() == 0);
        let _a = connect(&e, "a", "ua").unwrap();
        assert!(e.peak() <= 8);
    }

    #[test]
    fn one_source_cannot_take_every_slot() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_peers: 8,
            max_per_source: 2,
            handshake: Duration::from_millis(1500),
            ..Limits::default()
        };
        let e = start(&dir, limits);
        // One address opens silent connections: two are served, the others refused, told why.
        let held: Vec<TcpStream> = (0..6).map(|_| connect_from(&e, "127.0.0.1")).collect();
        wait_until("every connect is taken", || e.connections() == 6);
        assert_eq!((e.refused_busy(), e.peak()), (4, 2));
        let mut last = held.into_iter().last().unwrap();
        let mut answer = String::new();
        last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = last.read_to_string(&mut answer);
        assert!(
            answer.contains("2 connections from 127.0.0.1 already (its cap per source)"),
            "{answer:?}"
        );
        // Meanwhile a member at another address gets in.
        let _a = handshake_on(connect_from(&e, "127.0.0.2"), "a", "ua").unwrap();
        wait_until("a is counted", || e.accepted() == 1);
    }

    #[test]
    fn an_idle_peer_is_dropped_and_a_live_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            idle: Duration::from_millis(600),
            ..Limits::default()
        };
        let e = start(&dir, limits);
        let mut live = connect(&e, "a", "ua").unwrap();
        let mut silent = connect(&e, "a", "ua").unwrap();
        assert_eq!(e.active(), 2);
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(200));
            live.write_all(b"\n").unwrap();
        }
        assert_eq!(
            e.active(),
            1,
            "the silent peer was dropped, the live one kept"
        );
        let mut b = [0u8; 1];
        silent
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(silent.read(&mut b).unwrap(), 0, "closed");
    }
}
