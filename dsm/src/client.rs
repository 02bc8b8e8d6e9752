//! [`Dsm`]: this pod's view of the fabric's shared address space. It exposes the pod's own window
//! (an [`Endpoint`]) and reads, writes and updates any window of the directory with one-sided
//! RDMA, over a cached queue pair per owner.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocefabric_formats::directory::DirectoryEntry;
use rocefabric_formats::region::RegionAssignment;

use crate::auth::{FabricKey, Identity, Member};
use crate::conn_cache::ConnCache;
use crate::directory::{self, Directory};
use crate::endpoint::{self, Endpoint, Exposed, Limits, Owner};
use crate::error::{DsmError, Result};
use crate::handshake::{self, Failed};
use crate::memory::{self, Backing};
use crate::verbs::{Hca, Mapping, Qp, Registered};
use crate::wire::Offer;

mod batch;
use batch::Scratch;

/// Everything a pod already has, gathered by [`crate::config`] from its files and environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub pod: String,
    pub uid: String,
    /// The pod's namespace, as the fabric key's Secret names it.
    pub namespace: String,
    /// The fabric's key of this namespace (the mounted `<fabric>-key` Secret): what this pod proves
    /// itself with, and what it checks every peer and owner by.
    pub key: FabricKey,
    pub window: RegionAssignment,
    pub directory: PathBuf,
    pub hca: String,
    pub port: u8,
    pub gid_index: u32,
    pub traffic_class: u8,
    /// Where the rendezvous endpoint listens; its port is the fabric's rendezvous port.
    pub listen: SocketAddr,
    pub hugepages: Option<PathBuf>,
    /// How often the directory file is checked for changes (and cached peers for liveness).
    pub refresh: Duration,
    /// Back, register and serve this pod's window (`serve`, long-running programs). Without it
    /// (one-shot commands beside a running `serve`), accesses to the pod's own window go to the
    /// endpoint on this pod's rendezvous port like any peer's.
    pub expose: bool,
    /// The endpoint's bounds (connections at once, in all and per address; deadlines).
    pub limits: Limits,
}

impl Config {
    /// The conventional pod's configuration (see [`crate::config::Inputs::from_env`]).
    pub fn from_pod() -> Result<Config> {
        crate::config::Inputs::from_env()?.config()
    }

    /// Who this pod proves to be at a rendezvous.
    pub fn identity(&self) -> Identity {
        Identity {
            fabric: self.window.fabric.clone(),
            namespace: self.namespace.clone(),
            me: Member {
                pod: self.pod.clone(),
                uid: self.uid.clone(),
            },
            key: self.key.clone(),
        }
    }
}

/// One access of a batch. Results land in the access (`buf`, `prev`).
#[derive(Debug)]
pub enum Access<'a> {
    Read {
        addr: u64,
        buf: &'a mut [u8],
    },
    Write {
        addr: u64,
        data: &'a [u8],
    },
    CompareSwap {
        addr: u64,
        old: u64,
        new: u64,
        prev: u64,
    },
    FetchAdd {
        addr: u64,
        add: u64,
        prev: u64,
    },
}

impl Access<'_> {
    fn addr(&self) -> u64 {
        match self {
            Access::Read { addr, .. }
            | Access::Write { addr, .. }
            | Access::CompareSwap { addr, .. }
            | Access::FetchAdd { addr, .. } => *addr,
        }
    }
    fn len(&self) -> u64 {
        match self {
            Access::Read { buf, .. } => buf.len() as u64,
            Access::Write { data, .. } => data.len() as u64,
            _ => 8,
        }
    }
    fn atomic(&self) -> Option<&'static str> {
        match self {
            Access::CompareSwap { .. } => Some("compare_and_swap"),
            Access::FetchAdd { .. } => Some("fetch_add"),
            _ => None,
        }
    }
}

/// A connected owner.
struct Conn {
    /// The owner's uid, as it proved it.
    uid: String,
    offer: Offer,
    qp: Qp,
    stream: TcpStream,
}

impl Conn {
    /// Whether this is still the pod instance and window the directory entry `e` names (a
    /// connection to another instance is dropped, never used).
    fn serves(&self, e: &DirectoryEntry) -> bool {
        e.uid.as_ref().is_none_or(|u| *u == self.uid)
            && self.offer.base == e.base
            && self.offer.size == e.size
    }
}

/// Staging buffer for local sides of requests (registered once).
const STAGING: usize = 4 << 20;
/// Largest single work request.
const CHUNK: u64 = 1 << 20;
/// Requests in flight per queue pair per round.
const DEPTH: usize = 64;
/// How long the owner has to answer a hello, in all.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a round waits for its completions (retry exhaustion reports well within it).
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(15);

/// What a registration the kernel refused had to work with, for its error message.
fn pin_context(plan: &memory::Plan, limits: &memory::Limits, ipc_lock: bool) -> String {
    let memlock = limits
        .memlock
        .map_or("unlimited".to_string(), |l| format!("{l} bytes"));
    format!(
        "{} bytes pinned in all, RLIMIT_MEMLOCK {memlock}, CAP_IPC_LOCK {}",
        plan.pinned,
        if ipc_lock {
            "effective"
        } else {
            "not effective"
        }
    )
}

/// Counters a caller (or `probe`) may read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub connects: u64,
    pub reconnects: u64,
    /// Requests the HCA accepted (a refused post is not counted).
    pub posted: u64,
    pub directory_reloads: u64,
}

/// This pod's handle on the fabric's distributed shared memory.
pub struct Dsm {
    cfg: Config,
    identity: Identity,
    /// When the owners were last told this pod is alive.
    kept_alive: Instant,
    /// The epoch of this handle's last lock acquisition (random start: a restarted container,
    /// same uid, does not reuse its predecessor's lock words).
    pub(crate) lock_epoch: u32,
    hca: Arc<Hca>,
    local: Option<Arc<Mapping>>,
    staging: Registered,
    directory: Directory,
    stamp: directory::Stamp,
    checked: Instant,
    conns: ConnCache<Conn>,
    /// Per directory entry (as last read): the slot of its owner's connection, if one was made.
    entry_slots: Vec<Option<usize>>,
    scratch: Scratch,
    /// Pods whose connection failed, by uid: reconnecting is the next access's job.
    dropped: HashMap<String, String>,
    endpoint: Option<Endpoint>,
    stats: Stats,
}

impl std::fmt::Debug for Dsm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Dsm({} [{:#x}, {:#x}) on {:?})",
            self.cfg.pod,
            self.cfg.window.base,
            self.cfg.window.end(),
            self.hca
        )
    }
}

impl Dsm {
    /// Back and register the window, read the directory, start the endpoint.
    pub fn open(cfg: Config) -> Result<Dsm> {
        let size = cfg.window.size;
        let len = usize::try_from(size).map_err(|_| DsmError::Memory {
            size,
            reason: "larger than this machine's address space".into(),
        })?;
        // Stamped before it is read, not once the window is registered (seconds on Soft-RoCE): a
        // directory the kubelet swapped in meanwhile is read at the first access.
        let (stamp, directory) = directory::read_stamped(&cfg.directory)?;
        // What pinning needs is checked before the HCA is touched: the image's file capability
        // first made effective, then the window and the staging buffer against the limits.
        let ipc_lock = memory::raise_ipc_lock();
        let limits = memory::read_limits(cfg.hugepages.as_deref());
        let plan = memory::plan(cfg.expose.then_some(size), STAGING as u64, &limits)?;
        let pinning = |e: DsmError| match e {
            DsmError::Memory { size, reason } => DsmError::Memory {
                size,
                reason: format!("{reason} ({})", pin_context(&plan, &limits, ipc_lock)),
            },
            other => other,
        };
        let hca = Arc::new(Hca::open(
            &cfg.hca,
            cfg.port,
            cfg.gid_index,
            cfg.traffic_class,
        )?);
        let staging = hca
            .register(&Arc::new(Mapping::anonymous(STAGING)?), false)
            .map_err(|e| match pinning(e) {
                DsmError::Memory { reason, .. } if !cfg.expose => DsmError::Staging {
                    size: STAGING as u64,
                    reason,
                },
                e => e,
            })?;
        let (local, endpoint) = if cfg.expose {
            let local = Arc::new(match &plan.backing {
                Backing::Hugepages { dir, page } => Mapping::hugepages(dir, len, *page)?,
                Backing::Anonymous => Mapping::anonymous(len)?,
            });
            if let Some(note) = &plan.note {
                tracing::warn!(pod = %cfg.pod, size, "{note}: the window is anonymous memory");
            }
            let window = hca.register(&local, true).map_err(pinning)?;
            let endpoint = Endpoint::start(
                cfg.listen,
                Owner {
                    identity: cfg.identity(),
                    directory: cfg.directory.clone(),
                },
                Exposed {
                    base: cfg.window.base,
                    size,
                    hca: Arc::clone(&hca),
                    window,
                },
                cfg.limits,
            )?;
            tracing::info!(pod = %cfg.pod, base = cfg.window.base, size, huge = local.is_huge(), pinned = plan.pinned, ipc_lock, hca = ?hca, listen = %endpoint.addr(), "window exposed");
            (Some(local), Some(endpoint))
        } else {
            (None, None)
        };
        Ok(Dsm {
            identity: cfg.identity(),
            kept_alive: Instant::now(),
            lock_epoch: {
                let n = crate::auth::Nonce::fresh().0;
                u32::from_ne_bytes([n[0], n[1], n[2], n[3]])
            },
            stamp,
            cfg,
            hca,
            local,
            staging,
            directory,
            checked: Instant::now(),
            conns: ConnCache::default(),
            entry_slots: Vec::new(),
            scratch: Scratch::default(),
            dropped: HashMap::new(),
            endpoint,
            stats: Stats::default(),
        })
    }

    /// The configuration this handle was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// This pod's window.
    pub fn window(&self) -> &RegionAssignment {
        &self.cfg.window
    }

    /// The CPU's view of this pod's own window (offsets from the window's base), when exposed.
    pub fn local(&self) -> Option<&Mapping> {
        self.local.as_deref()
    }

    /// The directory as last read.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Re-read the directory when its file changed (at most once per `refresh`), as every access
    /// does: call it before resolving `POD+OFFSET` against [`Dsm::directory`], or a replaced pod
    /// resolves to its old window.
    pub fn refresh_directory(&mut self) {
        self.refresh_if_due(Instant::now());
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The rendezvous port peers are reached on (the bound one when this pod serves).
    fn rendezvous_port(&self) -> u16 {
        self.endpoint
            .as_ref()
            .map_or(self.cfg.listen.port(), |e| e.addr().port())
    }

    /// The rendezvous endpoint's address, when this pod serves its window.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(Endpoint::addr)
    }

    /// Peers that connected to this window.
    pub fn peers_served(&self) -> u64 {
        self.endpoint.as_ref().map_or(0, Endpoint::accepted)
    }

    /// Copy `buf.len()` bytes from global address `addr`.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.batch(&mut [Access::Read { addr, buf }])
    }

    /// Copy `data` to global address `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<()> {
        self.batch(&mut [Access::Write { addr, data }])
    }

    /// Atomically replace the word at `addr` with `new` if it equals `old`; returns what it held.
    pub fn compare_and_swap(&mut self, addr: u64, old: u64, new: u64) -> Result<u64> {
        let mut a = [Access::CompareSwap {
            addr,
            old,
            new,
            prev: 0,
        }];
        self.batch(&mut a)?;
        let [Access::CompareSwap { prev, .. }] = a else {
            unreachable!()
        };
        Ok(prev)
    }

    /// Atomically add `add` to the word at `addr`; returns what it held before.
    pub fn fetch_add(&mut self, addr: u64, add: u64) -> Result<u64> {
        let mut a = [Access::FetchAdd { addr, add, prev: 0 }];
        self.batch(&mut a)?;
        let [Access::FetchAdd { prev, .. }] = a else {
            unreachable!()
        };
        Ok(prev)
    }

    /// Publish `data` at `addr`, then `flag` into the word at `flag_addr`, on one connection in
    /// that order: a reader that sees the flag (acquire) sees the data. Both must have one owner.
    pub fn publish(&mut self, addr: u64, data: &[u8], flag_addr: u64, flag: u64) -> Result<()> {
        let f = flag.to_ne_bytes();
        self.batch(&mut [
            Access::Write { addr, data },
            Access::Write {
                addr: flag_addr,
                data: &f,
            },
        ])
    }

    /// Ensure a live connection to the owner `e`, checking its uid against the directory: a cached
    /// connection to another pod instance is dropped, never used. `addr` is the address accessed,
    /// which any error names.
    fn connect(&mut self, e: &DirectoryEntry, addr: u64) -> Result<usize> {
        if let Some(slot) = self.conns.slot(&e.pod) {
            if let Some(c) = self.conns.get(slot) {
                if c.serves(e) {
                    return Ok(slot);
                }
                tracing::info!(pod = %e.pod, old = %c.uid, new = ?e.uid, "owner replaced: dropping its connection");
            }
            self.conns.remove(slot);
            self.stats.reconnects += 1;
        } else if self.dropped.remove(&e.pod).is_some() {
            self.stats.reconnects += 1;
        }
        let gone = |reason: String| DsmError::OwnerGone {
            addr,
            owner: e.pod.clone(),
            reason,
        };
        let local = |source: DsmError| DsmError::Connect {
            addr,
            owner: e.pod.clone(),
            source: Box::new(source),
        };
        let target = if e.pod == self.cfg.pod {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.rendezvous_port())
        } else {
            let ip: IpAddr = e
                .pod_ip
                .as_deref()
                .ok_or_else(|| gone("the directory has no pod IP for it yet".into()))?
                .parse()
                .map_err(|x| gone(format!("pod IP in the directory: {x}")))?;
            SocketAddr::new(ip, self.rendezvous_port())
        };
        let stream = TcpStream::connect_timeout(&target, Duration::from_secs(5))
            .map_err(|x| gone(format!("rendezvous at {target}: {x}")))?;
        let _ = stream.set_nodelay(true);
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let hca = &self.hca;
        let (mut qp, offer, uid) = handshake::initiate(
            &stream,
            deadline,
            &self.identity,
            &e.pod,
            e.uid.as_deref(),
            || {
                let qp = hca.queue_pair(DEPTH as u32 * 2)?;
                let address = qp.address();
                Ok((qp, address))
            },
        )
        .map_err(|f| match f {
            Failed::Owner(why) => gone(format!("rendezvous at {target}: {why}")),
            Failed::Local(x) => local(x),
        })?;
        if offer.base != e.base || offer.size != e.size {
            return Err(gone(format!(
                "it exposes [{:#x}, +{:#x}), the directory says [{:#x}, +{:#x})",
                offer.base, offer.size, e.base, e.size
            )));
        }
        qp.connect(offer.qp).map_err(local)?;
        tracing::debug!(pod = %e.pod, %uid, qpn = offer.qp.qpn, "connected");
        self.stats.connects += 1;
        Ok(self.conns.insert(
            &e.pod,
            Conn {
                uid,
                offer,
                qp,
                stream,
            },
        ))
    }

    fn refresh_if_due(&mut self, now: Instant) {
        if now.duration_since(self.checked) < self.cfg.refresh {
            return;
        }
        self.checked = now;
        if directory::stamp(&self.cfg.directory) != self.stamp {
            self.reload_directory();
        }
        // Tell the owners this pod is alive (an owner drops a peer it has not heard from).
        if self.kept_alive.elapsed() >= endpoint::KEEPALIVE {
            self.kept_alive = Instant::now();
            for c in self.conns.values() {
                let _ = (&c.stream).write_all(b"\n");
            }
        }
        // A cached owner whose endpoint closed its stream has gone away: drop it now rather than
        // wait for a transport timeout.
        for slot in 0..self.conns.slots() {
            if self.conns.get(slot).is_some_and(|c| peer_closed(&c.stream))
                && let Some((pod, c)) = self.conns.remove(slot)
            {
                tracing::info!(%pod, "owner closed its endpoint: dropping the connection");
                self.dropped.insert(pod, c.uid);
            }
        }
    }

    fn reload_directory(&mut self) {
        match directory::read_stamped(&self.cfg.directory) {
            Ok((stamp, d)) => {
                self.directory = d;
                // The entries moved: their slots are found anew (by name) on next use.
                self.entry_slots.clear();
                self.stamp = stamp;
                self.stats.directory_reloads += 1;
            }
            // Keep the last good directory; the next refresh tries again.
            Err(e) => tracing::warn!(error = %e, "directory unreadable, keeping the last one"),
        }
    }

    /// Drop every cached connection (the next access to each owner reconnects).
    pub fn disconnect_all(&mut self) {
        self.conns.clear();
    }
}

/// Whether the peer closed the stream (EOF on a non-blocking peek).
fn peer_closed(stream: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let r = stream.peek(&mut b);
    let _ = stream.set_nonblocking(false);
    matches!(r, Ok(0)) || matches!(r, Err(ref e) if e.kind() != std::io::ErrorKind::WouldBlock)
}
