//! The data plane's only module with `unsafe`: the window's memory mapping, and the verbs calls
//! that hand raw addresses to the HCA, made through function pointers into `libibverbs.so.1`,
//! which is loaded at run time (so the build needs no rdma-core headers, bindgen or cmake; the
//! module `ibv` declares the ABI). Everything above it works with offsets, lengths and keys; every
//! `unsafe` block below says why it holds.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};
use std::fs::File;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{DsmError, Result};
use crate::ibv;
use crate::transport::{self, Local, PostError, Work};
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
    /// Its name is random and it is created exclusively, never through a symlink, owner-only: a
    /// file or link someone else put on the mount is never opened as the window.
    pub fn hugepages(dir: &Path, len: usize, page: u64) -> Result<Mapping> {
        use std::os::unix::fs::OpenOptionsExt;
        let size = (len as u64).div_ceil(page) * page;
        let tag: String = crate::auth::Nonce::fresh().0[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = dir.join(format!("rocefabric-dsm-{}-{tag}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
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

/// Declares `Verbs`, libibverbs' entry points resolved once per process, and their resolution.
/// The library stays loaded for the life of the process (it lives in a static), so the pointers
/// never dangle.
macro_rules! entry_points {
    ($($field:ident: $prototype:ident = $symbol:literal,)*) => {
        struct Verbs {
            $($field: ibv::$prototype,)*
            _library: libloading::Library,
        }

        impl Verbs {
            fn resolve(lib: libloading::Library) -> Result<Verbs, String> {
                $(
                    // SAFETY: the type is the prototype verbs.h declares for the symbol (see
                    // `ibv`); dlsym finds its default version, IBVERBS_1.1. The pointer is copied
                    // out and stays valid while the library is loaded.
                    let $field = *unsafe { lib.get::<ibv::$prototype>($symbol.as_bytes()) }
                        .map_err(|e| format!("{}: {e}", $symbol))?;
                )*
                Ok(Verbs { $($field,)* _library: lib })
            }
        }
    };
}

entry_points! {
    get_device_list: GetDeviceList = "ibv_get_device_list",
    free_device_list: FreeDeviceList = "ibv_free_device_list",
    get_device_name: GetDeviceName = "ibv_get_device_name",
    open_device: OpenDevice = "ibv_open_device",
    close_device: CloseDevice = "ibv_close_device",
    query_port: QueryPort = "ibv_query_port",
    query_gid: QueryGid = "ibv_query_gid",
    alloc_pd: AllocPd = "ibv_alloc_pd",
    dealloc_pd: DeallocPd = "ibv_dealloc_pd",
    reg_mr: RegMr = "ibv_reg_mr",
    dereg_mr: DeregMr = "ibv_dereg_mr",
    create_cq: CreateCq = "ibv_create_cq",
    destroy_cq: DestroyCq = "ibv_destroy_cq",
    create_qp: CreateQp = "ibv_create_qp",
    modify_qp: ModifyQp = "ibv_modify_qp",
    destroy_qp: DestroyQp = "ibv_destroy_qp",
}

impl Verbs {
    /// Load `soname` and resolve every entry point, or say why not.
    fn load(soname: &str) -> Result<Verbs, String> {
        // SAFETY: loading runs libibverbs' initialisers, which set up only its own state; it reads
        // its provider configuration lazily, at the first `ibv_get_device_list`.
        let lib = unsafe { libloading::Library::new(soname) }.map_err(|e| {
            format!(
                "cannot load {soname} (rdma-core's user space: install libibverbs1 and \
                 ibverbs-providers, or rdma-core): {e}"
            )
        })?;
        Verbs::resolve(lib)
    }
}

/// The process's libibverbs, loaded at the first use.
fn verbs() -> Result<&'static Verbs, String> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    VERBS
        .get_or_init(|| Verbs::load(ibv::LIBRARY))
        .as_ref()
        .map_err(Clone::clone)
}

/// What a verbs call that returns a new object gave: the object, or the errno it set.
fn created<T>(ptr: *mut T, device: &str, what: &'static str) -> Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(|| verbs_err(device, what, std::io::Error::last_os_error()))
}

/// A verbs call's failure: `rc` is the errno value the call returned (or -1: see errno).
fn rc_error(rc: c_int) -> std::io::Error {
    if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    }
}

/// A libibverbs object this process made, released with `release` when dropped; `made_from`
/// (what it was made from: a PD's context, an MR's PD, ...) outlives it, since fields drop after
/// `drop` runs.
struct Handle<T, P> {
    ptr: NonNull<T>,
    release: unsafe extern "C" fn(*mut T) -> c_int,
    made_from: P,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core's verbs are thread safe); the
// pointer is only handed to libibverbs.
unsafe impl<T, P: Send> Send for Handle<T, P> {}
// SAFETY: as above.
unsafe impl<T, P: Sync> Sync for Handle<T, P> {}

impl<T, P> Drop for Handle<T, P> {
    fn drop(&mut self) {
        // SAFETY: the object this value made, released once, before what it was made from.
        unsafe { (self.release)(self.ptr.as_ptr()) };
    }
}

/// An open device's provider: libibverbs' entry points and the provider's post and poll
/// (`ibv_post_send` and `ibv_poll_cq` are inline in verbs.h: calls through the context's ops).
struct Provider {
    verbs: &'static Verbs,
    post_send: ibv::PostSend,
    poll_cq: ibv::PollCq,
}

type Context = Handle<ibv::Context, Provider>;
type Pd = Handle<ibv::Pd, Arc<Context>>;
type Mr = Handle<ibv::Mr, Arc<Pd>>;
type Cq = Handle<ibv::Cq, Arc<Context>>;

/// An open HCA port with its protection domain: the granted device, port and GID index.
pub struct Hca {
    pub name: String,
    pub port: u8,
    pub gid_index: u32,
    pub gid: Ipv6Addr,
    pub traffic_class: u8,
    sgid_index: u8,
    mtu: u32,
    pd: Arc<Pd>,
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

/// Open the device called `name`, or say which devices there are.
fn open_device(verbs: &'static Verbs, name: &str) -> Result<Context> {
    let mut n: c_int = 0;
    // SAFETY: writes the count into `n`; the list is freed below, after the device is opened
    // (an open context keeps its device).
    let list = unsafe { (verbs.get_device_list)(&mut n) };
    if list.is_null() {
        let e = std::io::Error::last_os_error();
        let what = "listing RDMA devices (is there a /sys/class/infiniband?)";
        return Err(verbs_err(name, what, e));
    }
    let mut names = Vec::new();
    let mut opened = None;
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` device pointers, each with a NUL-terminated name that lives
        // as long as the list.
        let (device, found) = unsafe {
            let device = *list.add(i);
            let found = CStr::from_ptr((verbs.get_device_name)(device));
            (device, found.to_string_lossy().into_owned())
        };
        if found == name && opened.is_none() {
            // SAFETY: a device of the live list.
            let ctx = unsafe { (verbs.open_device)(device) };
            opened = Some(NonNull::new(ctx).ok_or_else(std::io::Error::last_os_error));
        }
        names.push(found);
    }
    // SAFETY: the list from ibv_get_device_list above, freed once.
    unsafe { (verbs.free_device_list)(list) };
    match opened {
        Some(Ok(ptr)) => {
            // SAFETY: a live context; its ops are the provider's, fixed while it is open.
            let ops = unsafe { &(*ptr.as_ptr()).ops };
            let (Some(post_send), Some(poll_cq)) = (ops.post_send, ops.poll_cq) else {
                // SAFETY: the context opened above, closed once (no `Context` owns it).
                unsafe { (verbs.close_device)(ptr.as_ptr()) };
                return Err(verbs_err(
                    name,
                    "opening",
                    "its provider cannot post or poll",
                ));
            };
            let provider = Provider {
                verbs,
                post_send,
                poll_cq,
            };
            Ok(Context {
                ptr,
                release: verbs.close_device,
                made_from: provider,
            })
        }
        Some(Err(e)) => Err(verbs_err(name, "opening", e)),
        None => Err(DsmError::input(
            "HCA",
            name,
            format!("no such RDMA device (this container sees {names:?})"),
        )),
    }
}

impl Hca {
    /// Open `name`, port `port`, sending from GID `gid_index` with traffic class `tc`.
    pub fn open(name: &str, port: u8, gid_index: u32, traffic_class: u8) -> Result<Hca> {
        let verbs = verbs().map_err(|e| verbs_err(name, "loading libibverbs", e))?;
        let ctx = Arc::new(open_device(verbs, name)?);
        let mut attr = ibv::PortAttr::default();
        // SAFETY: fills at most a `struct ibv_port_attr`, which `attr` is.
        let rc = unsafe { (verbs.query_port)(ctx.ptr.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(verbs_err(name, "querying the port", rc_error(rc)));
        }
        let sgid_index = u8::try_from(gid_index)
            .map_err(|_| DsmError::input("GID index", gid_index.to_string(), "above 255"))?;
        let mut gid = ibv::Gid::default();
        // SAFETY: fills the 16-byte GID.
        let rc = unsafe { (verbs.query_gid)(ctx.ptr.as_ptr(), port, sgid_index.into(), &mut gid) };
        if rc != 0 {
            return Err(verbs_err(name, "reading the GID", rc_error(rc)));
        }
        if gid.raw == [0; 16] {
            return Err(DsmError::input(
                "GID index",
                gid_index.to_string(),
                format!("GID {gid_index} of {name} port {port} is empty"),
            ));
        }
        // SAFETY: a live context.
        let pd = unsafe { (verbs.alloc_pd)(ctx.ptr.as_ptr()) };
        let pd = created(pd, name, "allocating a protection domain")?;
        Ok(Hca {
            name: name.to_string(),
            port,
            gid_index,
            gid: Ipv6Addr::from(gid.raw),
            traffic_class,
            sgid_index,
            mtu: attr.active_mtu,
            pd: Arc::new(Pd {
                ptr: pd,
                release: verbs.dealloc_pd,
                made_from: ctx,
            }),
        })
    }

    fn verbs(&self) -> &'static Verbs {
        self.pd.made_from.made_from.verbs
    }

    /// Register the whole of `mapping`; `remote` grants peers read, write and atomics on it (the
    /// exposed window), otherwise only the local HCA writes it (staging).
    pub fn register(&self, mapping: &Arc<Mapping>, remote: bool) -> Result<Registered> {
        let mut access = ibv::ACCESS_LOCAL_WRITE;
        if remote {
            access |=
                ibv::ACCESS_REMOTE_WRITE | ibv::ACCESS_REMOTE_READ | ibv::ACCESS_REMOTE_ATOMIC;
        }
        // SAFETY: the range is the whole live mapping; `Registered` keeps an Arc of the mapping,
        // so the memory outlives the registration (the MR is dropped first, see field order).
        let mr = unsafe {
            (self.verbs().reg_mr)(
                self.pd.ptr.as_ptr(),
                mapping.ptr.as_ptr().cast(),
                mapping.len(),
                access,
            )
        };
        let mr = NonNull::new(mr).ok_or_else(|| DsmError::Memory {
            size: mapping.len() as u64,
            reason: format!(
                "registering with {}: {}",
                self.name,
                std::io::Error::last_os_error()
            ),
        })?;
        // SAFETY: a live MR; its keys never change.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(Registered {
            _mr: Mr {
                ptr: mr,
                release: self.verbs().dereg_mr,
                made_from: Arc::clone(&self.pd),
            },
            lkey,
            rkey,
            mapping: Arc::clone(mapping),
        })
    }

    /// A reliable-connected queue pair with its own completion queue, `depth` requests deep. It
    /// offers the port's active MTU as it is now (the fabric's MTU may have changed since open).
    pub fn queue_pair(&self, depth: u32) -> Result<Qp> {
        let verbs = self.verbs();
        let ctx = self.pd.made_from.ptr.as_ptr();
        let mut attr = ibv::PortAttr::default();
        // SAFETY: fills at most a `struct ibv_port_attr`, which `attr` is.
        let mtu = match unsafe { (verbs.query_port)(ctx, self.port, &mut attr) } {
            0 => attr.active_mtu,
            _ => self.mtu,
        };
        let cqe = c_int::try_from(depth).unwrap_or(c_int::MAX);
        // SAFETY: a live context; no completion channel, no user context.
        let cq = unsafe { (verbs.create_cq)(ctx, cqe, null_mut(), null_mut(), 0) };
        let cq = created(cq, &self.name, "creating a completion queue")?;
        let cq = Cq {
            ptr: cq,
            release: verbs.destroy_cq,
            made_from: Arc::clone(&self.pd.made_from),
        };
        let mut init = transport::rc_init(cq.ptr.as_ptr(), depth);
        // SAFETY: a live PD and CQ; the attributes are read during the call only.
        let qp = unsafe { (verbs.create_qp)(self.pd.ptr.as_ptr(), &mut init) };
        let qp = created(qp, &self.name, "creating a queue pair")?;
        // SAFETY: a live QP; its number is fixed for its life.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let psn = (std::process::id() ^ qpn.rotate_left(8)) & 0x00ff_ffff;
        Ok(Qp {
            qp: Handle {
                ptr: qp,
                release: verbs.destroy_qp,
                made_from: (cq, Arc::clone(&self.pd)),
            },
            qpn,
            psn,
            device: self.name.clone(),
            port: self.port,
            gid_index: self.sgid_index,
            gid: self.gid,
            mtu,
            tc: self.traffic_class,
            requests: transport::Requests::default(),
        })
    }
}

/// A registered mapping. Field order matters: the MR deregisters before the mapping unmaps.
pub struct Registered {
    _mr: Mr,
    lkey: u32,
    rkey: u32,
    pub mapping: Arc<Mapping>,
}

impl Registered {
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

/// A reliable-connected queue pair. Every request is signalled; [`Qp::complete`] waits for them.
pub struct Qp {
    qp: Handle<ibv::Qp, (Cq, Arc<Pd>)>,
    qpn: u32,
    psn: u32,
    device: String,
    port: u8,
    gid_index: u8,
    gid: Ipv6Addr,
    mtu: u32,
    tc: u8,
    /// The work request list, refilled per post (no allocation once grown).
    requests: transport::Requests,
}

// SAFETY: the request list's raw pointers point only into its own heap buffers, which every
// post rebuilds before handing them to libibverbs; nothing else holds them between posts.
unsafe impl Send for transport::Requests {}

impl Qp {
    fn provider(&self) -> &Provider {
        &self.qp.made_from.0.made_from.made_from
    }

    /// How a peer reaches this queue pair.
    pub fn address(&self) -> QpAddress {
        QpAddress {
            gid: self.gid,
            qpn: self.qpn,
            psn: self.psn,
            mtu: Some(transport::mtu_bytes(self.mtu)),
        }
    }

    /// Connect to `peer`: INIT (peers may read, write and do atomics on what this side registered
    /// remotely), RTR with the peer's GID as global route and the fabric's traffic class, RTS.
    pub fn connect(&mut self, peer: QpAddress) -> Result<()> {
        let local = Local {
            port: self.port,
            gid_index: self.gid_index,
            mtu: self.mtu,
            tc: self.tc,
            psn: self.psn,
        };
        for (mut attr, mask, what) in transport::transitions(local, peer) {
            // SAFETY: a live QP; the attributes are read during the call only.
            let modify_qp = self.provider().verbs.modify_qp;
            let rc = unsafe { modify_qp(self.qp.ptr.as_ptr(), &mut attr, mask) };
            if rc != 0 {
                return Err(verbs_err(&self.device, what, rc_error(rc)));
            }
        }
        Ok(())
    }

    /// Post `works` in one call (one doorbell), all signalled, local buffers in `staging`. On a
    /// refusal, the requests before the refused one were posted (`PostError::accepted`).
    pub fn post(&mut self, staging: &Registered, works: &[Work]) -> Result<(), PostError> {
        if works.is_empty() {
            return Ok(());
        }
        let room = staging.mapping.len() as u64;
        assert!(
            works.iter().all(|w| w.offset + u64::from(w.len) <= room),
            "staging overflow"
        );
        let list = &mut self.requests;
        list.fill(works, staging.mapping.addr(), staging.lkey());
        let mut bad: *mut ibv::SendWr = null_mut();
        // SAFETY: a live QP; the list and its entries stay alive and unmoved during the call
        // (the provider copies them into the send queue). Each local range lies inside the
        // registered staging mapping (asserted above), which outlives the requests: callers wait
        // for every completion before reusing it.
        let first = list.first();
        let post_send = self.provider().post_send;
        let rc = unsafe { post_send(self.qp.ptr.as_ptr(), first, &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        Err(PostError {
            accepted: self.requests.accepted_before(bad),
            reason: rc_error(rc).to_string(),
        })
    }

    /// Wait for `n` completions, or until `timeout` has passed since `started` (the caller's
    /// clock reading: one read per access on the hot path). Returns the failed ones as (work
    /// id, status). A timeout is reported as work id `u64::MAX`.
    pub fn complete(
        &mut self,
        n: usize,
        timeout: Duration,
        started: Instant,
    ) -> Vec<(u64, String)> {
        let mut failed = Vec::new();
        let deadline = started + timeout;
        let mut wcs = [ibv::Wc::default(); 16];
        let mut done = 0;
        let mut idle = 0u32;
        while done < n {
            let want = c_int::try_from((n - done).min(wcs.len())).unwrap_or(1);
            // SAFETY: a live CQ; the provider writes at most `want` entries into `wcs`.
            let (poll_cq, cq) = (self.provider().poll_cq, self.qp.made_from.0.ptr.as_ptr());
            let got = unsafe { poll_cq(cq, want, wcs.as_mut_ptr()) };
            if got < 0 {
                failed.push((u64::MAX, format!("polling the completion queue: {got}")));
                break;
            }
            let got = got as usize;
            for wc in &wcs[..got] {
                if wc.status != ibv::WC_SUCCESS {
                    failed.push((wc.wr_id, ibv::wc_status_name(wc.status)));
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

#[cfg(test)]
mod tests;
