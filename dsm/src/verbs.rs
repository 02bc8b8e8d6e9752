//! The data plane's only module with `unsafe`: the window's memory mapping and the verbs calls (through
//! `sideway`) that hand raw addresses to the HCA. Everything above it works with offsets, lengths
//! and keys; every `unsafe` block below says why it holds.
#![allow(unsafe_code)]

use std::fs::File;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, GenericCompletionQueue, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};

use crate::error::{DsmError, Result};
use crate::wire::QpAddress;

/// `RLIMIT_MEMLOCK` in bytes, `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Page-aligned memory the HCA may read and write behind the CPU's back. All CPU access goes
/// through raw-pointer copies and atomics, never through Rust references, because a remote write
/// can change any byte at any time.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
    _file: Option<File>,
}

// SAFETY: the mapping is plain memory owned by this value until drop; every access is a raw copy
// or an atomic, which are sound from any thread (concurrent plain copies may tear, as the memory
// model documents, but never touch memory outside the mapping).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Anonymous private memory, zeroed.
    pub fn anonymous(len: usize) -> Result<Mapping> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        Self::map(len, flags, -1, None, false)
    }

    /// A file of `len` (rounded up to `page`) on the hugetlbfs mount `dir`, unlinked once mapped.
    pub fn hugepages(dir: &Path, len: usize, page: u64) -> Result<Mapping> {
        let size = (len as u64).div_ceil(page) * page;
        let path = dir.join(format!("rocefabric-dsm-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| DsmError::Memory {
                size: len as u64,
                reason: format!("cannot create {}: {e}", path.display()),
            })?;
        let _ = std::fs::remove_file(&path);
        let fd = file.as_raw_fd();
        Self::map(size as usize, libc::MAP_SHARED, fd, Some(file), true)
    }

    fn map(len: usize, flags: i32, fd: i32, file: Option<File>, huge: bool) -> Result<Mapping> {
        let len = len.max(1);
        // SAFETY: a fresh mapping at an address the kernel picks; no existing memory is touched.
        // MAP_POPULATE faults every page in now, so a hugetlbfs shortfall fails here (SIGBUS later
        // otherwise).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DsmError::Memory {
                size: len as u64,
                reason: format!("mmap: {}", std::io::Error::last_os_error()),
            });
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| DsmError::Memory {
            size: len as u64,
            reason: "mmap returned null".into(),
        })?;
        Ok(Mapping {
            ptr,
            len,
            huge,
            _file: file,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether hugepages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// The virtual address of byte 0 (what the HCA is given).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "[{offset}, +{len}) outside a mapping of {} bytes",
            self.len
        );
    }

    /// Copy `buf.len()` bytes at `offset` out. The acquire fence orders it after any flag the caller
    /// read before (see the memory model in the crate docs).
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check(offset, buf.len());
        fence(Ordering::Acquire);
        // SAFETY: the range is inside the mapping (checked above) and `buf` is a distinct Rust
        // buffer, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copy `data` in at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: the range is inside the mapping (checked above); `data` is a distinct buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
        fence(Ordering::Release);
    }

    /// Load the 8-byte word at `offset` (aligned) with acquire ordering.
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.check(offset, 8);
        assert!(offset.is_multiple_of(8), "unaligned word at {offset}");
        // SAFETY: in range and 8-byte aligned (the mapping is page aligned); the memory lives as
        // long as `self`, and AtomicU64 has the layout of u64.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) }
            .load(Ordering::Acquire)
    }

    /// Store the 8-byte word at `offset` (aligned) with release ordering.
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.check(offset, 8);
        assert!(offset.is_multiple_of(8), "unaligned word at {offset}");
        // SAFETY: as in `load_u64`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) }
            .store(value, Ordering::Release)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value created; nothing refers to it after drop
        // (memory regions registered over it hold an Arc to their owner and are dropped first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An opened HCA port with its protection domain: the granted device, port and GID index.
pub struct Hca {
    pub name: String,
    pub port: u8,
    pub gid_index: u32,
    pub gid: Ipv6Addr,
    pub traffic_class: u8,
    mtu: Mtu,
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
}

impl std::fmt::Debug for Hca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Hca({}:{} gid[{}]={})",
            self.name, self.port, self.gid_index, self.gid
        )
    }
}

fn verbs_err(device: &str, what: &'static str, e: impl std::fmt::Display) -> DsmError {
    DsmError::Verbs {
        device: device.to_string(),
        what,
        reason: e.to_string(),
    }
}

impl Hca {
    /// Open `name`, port `port`, sending from GID `gid_index` with traffic class `tc`.
    pub fn open(name: &str, port: u8, gid_index: u32, traffic_class: u8) -> Result<Hca> {
        let list = DeviceList::new().map_err(|e| {
            verbs_err(
                name,
                "listing devices (is rdma-core's libibverbs.so.1 installed?)",
                e,
            )
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        let device = list.iter().find(|d| d.name() == name).ok_or_else(|| {
            DsmError::input(
                "HCA",
                name,
                format!("no such RDMA device (this container sees {names:?})"),
            )
        })?;
        let ctx = device.open().map_err(|e| verbs_err(name, "opening", e))?;
        let attr = ctx
            .query_port(port)
            .map_err(|e| verbs_err(name, "querying the port", e))?;
        let gid = ctx
            .query_gid(port, gid_index)
            .map_err(|e| verbs_err(name, "reading the GID", e))?;
        if gid.is_zero() {
            return Err(DsmError::input(
                "GID index",
                gid_index.to_string(),
                format!("GID {gid_index} of {name} port {port} is empty"),
            ));
        }
        let pd = ctx
            .alloc_pd()
            .map_err(|e| verbs_err(name, "allocating a protection domain", e))?;
        Ok(Hca {
            name: name.to_string(),
            port,
            gid_index,
            gid: Ipv6Addr::from(gid),
            traffic_class,
            mtu: attr.active_mtu(),
            ctx,
            pd,
        })
    }

    /// Register `[offset, offset + len)` of `mapping`; `remote` grants peers read, write and
    /// atomics on it (the exposed window), otherwise only the local HCA writes it (staging).
    pub fn register(&self, mapping: &Arc<Mapping>, remote: bool) -> Result<Registered> {
        let mut access = AccessFlags::LocalWrite;
        if remote {
            access = access
                | AccessFlags::RemoteWrite
                | AccessFlags::RemoteRead
                | AccessFlags::RemoteAtomic;
        }
        // SAFETY: the range is the whole live mapping; `Registered` keeps an Arc of the mapping, so
        // the memory outlives the registration (the MR is dropped first, see field order).
        let mr = unsafe {
            self.pd
                .reg_mr(mapping.addr() as usize, mapping.len(), access)
        }
        .map_err(|e| DsmError::Memory {
            size: mapping.len() as u64,
            reason: format!("registering with {}: {e}", self.name),
        })?;
        Ok(Registered {
            mr,
            mapping: Arc::clone(mapping),
        })
    }

    /// A reliable-connected queue pair with its own completion queue, `depth` requests deep. It
    /// offers the port's active MTU as it is now (the fabric's MTU may have changed since open).
    pub fn queue_pair(&self, depth: u32) -> Result<Qp> {
        let mtu = self
            .ctx
            .query_port(self.port)
            .map(|a| a.active_mtu())
            .unwrap_or(self.mtu);
        let cq = self
            .ctx
            .create_cq_builder()
            .setup_cqe(depth)
            .build()
            .map_err(|e| verbs_err(&self.name, "creating a completion queue", e))?;
        let generic = GenericCompletionQueue::from(Arc::clone(&cq));
        let qp = self
            .pd
            .create_qp_builder()
            .setup_send_cq(generic.clone())
            .setup_recv_cq(generic)
            .setup_max_send_wr(depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .build()
            .map_err(|e| verbs_err(&self.name, "creating a queue pair", e))?;
        let psn = (std::process::id() ^ qp.qp_number().rotate_left(8)) & 0x00ff_ffff;
        Ok(Qp {
            qp,
            cq,
            psn,
            device: self.name.clone(),
            port: self.port,
            gid_index: self.gid_index,
            gid: self.gid,
            mtu,
            tc: self.traffic_class,
        })
    }
}

/// A registered mapping. Field order matters: the MR deregisters before the mapping unmaps.
pub struct Registered {
    mr: Arc<MemoryRegion>,
    pub mapping: Arc<Mapping>,
}

impl Registered {
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

/// One-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

/// One work request: `len` bytes between local `offset` of a registered staging buffer and the
/// remote virtual address `remote` under `rkey`.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    pub id: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u32,
    pub remote: u64,
    pub rkey: u32,
}

/// A reliable-connected queue pair. Every request is signalled; [`Qp::complete`] waits for them.
pub struct Qp {
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
    psn: u32,
    device: String,
    port: u8,
    gid_index: u32,
    gid: Ipv6Addr,
    mtu: Mtu,
    tc: u8,
}

/// Ack timeout exponent (4.096 us x 2^16 = 268 ms) and retries: a dead peer is reported within
/// about two seconds (7 x 268 ms), also under emulation, where round trips take milliseconds.
const ACK_TIMEOUT: u8 = 16;
const RETRIES: u8 = 7;
/// Outstanding RDMA reads and atomics per queue pair, each way.
const READ_ATOMIC_DEPTH: u8 = 8;

/// An MTU in bytes (IBV_MTU_256 is 1, each step doubles).
fn mtu_bytes(mtu: Mtu) -> u32 {
    128 << (mtu as u32)
}

/// The largest verbs MTU not above `bytes` (256 at least).
fn mtu_of(bytes: u32) -> Mtu {
    match bytes {
        4096.. => Mtu::Mtu4096,
        2048..4096 => Mtu::Mtu2048,
        1024..2048 => Mtu::Mtu1024,
        512..1024 => Mtu::Mtu512,
        _ => Mtu::Mtu256,
    }
}

impl Qp {
    /// How a peer reaches this queue pair.
    pub fn address(&self) -> QpAddress {
        QpAddress {
            gid: self.gid,
            qpn: self.qp.qp_number(),
            psn: self.psn,
            mtu: Some(mtu_bytes(self.mtu)),
        }
    }

    /// Connect to `peer`: INIT (peers may read, write and do atomics on what this side registered
    /// remotely), RTR with the peer's GID as global route and the fabric's traffic class, RTS.
    pub fn connect(&mut self, peer: QpAddress) -> Result<()> {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port)
            .setup_access_flags(
                AccessFlags::RemoteWrite | AccessFlags::RemoteRead | AccessFlags::RemoteAtomic,
            );
        let device = self.device.clone();
        let err = |what: &'static str| {
            let device = device.clone();
            move |x: sideway::ibverbs::queue_pair::ModifyQueuePairError| verbs_err(&device, what, x)
        };
        self.qp.modify(&attr).map_err(err("queue pair to INIT"))?;
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(0)
            .setup_port(self.port)
            .setup_service_level(0)
            .setup_grh(&Gid::from(peer.gid), 0, self.gid_index as u8, 64, self.tc);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu_of(crate::wire::path_mtu(mtu_bytes(self.mtu), peer.mtu)))
            .setup_dest_qp_num(peer.qpn)
            .setup_rq_psn(peer.psn)
            .setup_max_dest_read_atomic(READ_ATOMIC_DEPTH)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&ah);
        self.qp
            .modify(&attr)
            .map_err(err("queue pair to RTR (is the peer's GID reachable?)"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(ACK_TIMEOUT)
            .setup_retry_cnt(RETRIES)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(READ_ATOMIC_DEPTH);
        self.qp.modify(&attr).map_err(err("queue pair to RTS"))?;
        Ok(())
    }

    /// Post `works` in one call (one doorbell), all signalled, local buffers in `staging`.
    pub fn post(&mut self, staging: &Registered, works: &[Work]) -> Result<(), String> {
        let base = staging.mapping.addr();
        let lkey = staging.lkey();
        let mut guard = self.qp.start_post_send();
        for w in works {
            assert!(
                w.offset + u64::from(w.len) <= staging.mapping.len() as u64,
                "staging overflow"
            );
            let h = guard.construct_wr(w.id, WorkRequestFlags::Signaled);
            let local = match w.op {
                Op::Write => h.setup_write(w.rkey, w.remote),
                Op::Read => h.setup_read(w.rkey, w.remote),
                Op::CompareSwap { compare, swap } => {
                    h.setup_atomic_compare_swap(w.rkey, w.remote, compare, swap)
                }
                Op::FetchAdd { add } => h.setup_atomic_fetch_add(w.rkey, w.remote, add),
            };
            // SAFETY: the local range lies inside the registered staging mapping (asserted above),
            // which outlives the request: callers wait for every completion before reusing it.
            unsafe { local.setup_sge(lkey, base + w.offset, w.len) };
        }
        guard.post().map_err(|e| e.to_string())
    }

    /// Wait for `n` completions, or until `timeout` passes. Returns the failed ones as
    /// (work id, status). A timeout is reported as work id `u64::MAX`.
    pub fn complete(&mut self, n: usize, timeout: Duration) -> Vec<(u64, String)> {
        let deadline = Instant::now() + timeout;
        let mut failed = Vec::new();
        let mut done = 0;
        let mut idle = 0u32;
        while done < n {
            let mut got = 0;
            if let Ok(poller) = self.cq.start_poll() {
                for wc in poller {
                    got += 1;
                    if wc.status() != WorkCompletionStatus::Success as u32 {
                        failed.push((
                            wc.wr_id(),
                            format!("{:?}", WorkCompletionStatus::from(wc.status())),
                        ));
                    }
                }
            }
            done += got;
            if got == 0 {
                idle += 1;
                // Spin briefly for low latency, then yield so a one-CPU node's kernel (and a
                // software RDMA device) gets to run.
                if idle > 64 {
                    std::thread::yield_now();
                }
                if idle.is_multiple_of(1024) && Instant::now() > deadline {
                    failed.push((u64::MAX, format!("no completion within {timeout:?}")));
                    break;
                }
            } else {
                idle = 0;
            }
        }
        failed
    }
}
