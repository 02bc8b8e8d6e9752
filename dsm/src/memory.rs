//! Where the local window lives and whether it can be pinned (a pure decision over the container's
//! limits, plus small readers of those limits).
//!
//! Hugepages when the pod has them (a hugetlbfs mount, `/dev/hugepages` by default, with room in
//! its hugetlb limit and in the node's free pool), else anonymous memory. Registering pins the
//! window and the staging buffer, so both must fit the container's memory limit and, unless
//! `CAP_IPC_LOCK` is effective, `RLIMIT_MEMLOCK` (hugepages count against it too). A window that
//! cannot is refused before the HCA is opened, in one message naming the window, the limit and
//! the fix, instead of an out-of-memory kill or an `ENOMEM` from the registration.
//!
//! `CAP_IPC_LOCK` for a non-root user: a capability the container adds lands only in the bounding
//! set of a non-root process (Kubernetes sets no ambient capabilities), so the workload image
//! gives the binary a file capability, `cap_ipc_lock=p` (permitted, not effective: a container
//! that does not add IPC_LOCK still runs the binary, and gets this module's message instead of
//! `EPERM` from exec). [`raise_ipc_lock`] moves it into the effective set.

use std::path::{Path, PathBuf};

use crate::error::{DsmError, Result};

/// Room left for the process itself next to an anonymous window.
pub const HEADROOM: u64 = 32 << 20;
/// The base page: an anonymous window is pinned in whole pages.
const PAGE: u64 = 4096;
/// `CAP_IPC_LOCK`'s bit in the capability sets of /proc/self/status.
const CAP_IPC_LOCK_BIT: u64 = 1 << 14;

/// Whether this process may pin past `RLIMIT_MEMLOCK`, and if not, why not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpcLock {
    /// `CAP_IPC_LOCK` is effective: pinning is held only to the memory limit.
    Effective,
    /// The container grants it (it is in the bounding set) but this process does not hold it:
    /// a non-root user whose binary has no file capability, or `no_new_privs`, under which exec
    /// grants a file capability only to a process that held it before.
    NotHeld { uid: u32, no_new_privs: bool },
    /// The container does not grant it.
    #[default]
    NotGranted,
}

/// What the container may use, as read from cgroup v2, /proc, sysfs and getrlimit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `memory.max` (None: unlimited) and `memory.current`.
    pub memory_max: Option<u64>,
    pub memory_current: u64,
    /// A hugetlbfs mount to create the window file in, and its page size.
    pub hugepages: Option<PathBuf>,
    pub hugepage_size: u64,
    /// Bytes of hugepages this container may still take: the smaller of its hugetlb cgroup's room
    /// and the node's free, unreserved pool (None: neither is known).
    pub hugepages_room: Option<u64>,
    /// `RLIMIT_MEMLOCK` (None: unlimited).
    pub memlock: Option<u64>,
    /// Bytes this process has pinned already (`VmPin`).
    pub pinned: u64,
    pub ipc_lock: IpcLock,
}

/// The backing the window gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A file on this hugetlbfs mount, `len` rounded up to whole hugepages.
    Hugepages {
        dir: PathBuf,
        page: u64,
    },
    Anonymous,
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The window's backing (`Anonymous` when there is no window).
    pub backing: Backing,
    /// Bytes pinned once the window and the staging buffer are registered.
    pub pinned: u64,
    /// Why a pod with hugepages gets anonymous memory, when it does.
    pub note: Option<String>,
}

/// Choose the backing of a `window`-byte window (None: this process exposes none) next to a
/// `staging`-byte buffer, or say which limit it breaks and how to lift it.
pub fn plan(window: Option<u64>, staging: u64, limits: &Limits) -> Result<Plan> {
    let size = window.unwrap_or(0);
    let refuse = |reason: String| match window {
        Some(size) => DsmError::Memory { size, reason },
        None => DsmError::Staging {
            size: staging,
            reason,
        },
    };
    let (backing, window_pin, note) = backing(size, limits);
    let pinned = window_pin
        .saturating_add(staging)
        .saturating_add(limits.pinned);
    if let Some(limit) = limits.memlock.filter(|&l| l < pinned)
        && limits.ipc_lock != IpcLock::Effective
    {
        return Err(refuse(memlock_refusal(
            window, staging, pinned, limit, limits,
        )));
    }
    if backing == Backing::Anonymous
        && let Some(max) = limits.memory_max
    {
        let need = size
            .saturating_add(staging)
            .saturating_add(limits.memory_current)
            .saturating_add(HEADROOM);
        if need > max {
            let huge = note.as_ref().map(|n| format!("; {n}")).unwrap_or_default();
            return Err(refuse(format!(
                "does not fit the container's memory limit of {max} bytes ({staging} for staging, \
                 {} in use, {HEADROOM} kept for the process){huge}: raise \
                 resources.limits.memory to at least {need}",
                limits.memory_current
            )));
        }
    }
    Ok(Plan {
        backing,
        pinned,
        note,
    })
}

/// Hugepages if they hold the window, else anonymous memory; the bytes the window pins; and why
/// hugepages the pod has were not used.
fn backing(size: u64, limits: &Limits) -> (Backing, u64, Option<String>) {
    let anonymous = size.div_ceil(PAGE).saturating_mul(PAGE);
    let Some(dir) = &limits.hugepages else {
        return (Backing::Anonymous, anonymous, None);
    };
    if size == 0 {
        return (Backing::Anonymous, 0, None);
    }
    let page = limits.hugepage_size.max(1);
    let rounded = size.div_ceil(page).saturating_mul(page);
    match limits.hugepages_room {
        Some(room) if room < rounded => {
            let note = format!(
                "hugepages on {} hold only {room} bytes of the {rounded} the window needs",
                dir.display()
            );
            (Backing::Anonymous, anonymous, Some(note))
        }
        _ => {
            let backing = Backing::Hugepages {
                dir: dir.clone(),
                page,
            };
            (backing, rounded, None)
        }
    }
}

/// The one message for a registration `RLIMIT_MEMLOCK` would refuse: what it pins, the limit, and
/// the fix for this container.
fn memlock_refusal(
    window: Option<u64>,
    staging: u64,
    pinned: u64,
    limit: u64,
    limits: &Limits,
) -> String {
    let what = match window {
        Some(_) => format!("the window and {staging} bytes of staging"),
        None => "the staging buffer".to_string(),
    };
    let already = match limits.pinned {
        0 => String::new(),
        n => format!(", {n} pinned already"),
    };
    let fix = match limits.ipc_lock {
        IpcLock::NotGranted | IpcLock::Effective => {
            "add IPC_LOCK to the container's securityContext.capabilities.add".to_string()
        }
        IpcLock::NotHeld {
            no_new_privs: true, ..
        } => "the container adds IPC_LOCK but runs with no_new_privs \
              (securityContext.allowPrivilegeEscalation: false), under which exec grants the \
              binary's file capability only to a process its runtime gave the capability already, \
              and this one's did not: drop allowPrivilegeEscalation: false from this container"
            .to_string(),
        IpcLock::NotHeld { uid, .. } => {
            let exe = std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "the binary".into());
            format!(
                "the container adds IPC_LOCK, but uid {uid} is not root, so it holds the \
                 capability only through a file capability on the binary, which {exe} lacks: \
                 run `setcap cap_ipc_lock=p {exe}` in the image (docker/workload.Dockerfile does)"
            )
        }
    };
    format!(
        "cannot be pinned: registering pins {pinned} bytes ({what}{already}) and RLIMIT_MEMLOCK \
         is {limit} bytes without CAP_IPC_LOCK: {fix}, or raise the node's memlock limit for \
         containers (containerd's LimitMEMLOCK=infinity)"
    )
}

/// Make `CAP_IPC_LOCK` effective for the calling thread (and the threads it starts later) when
/// it is permitted, as the binary's file capability `cap_ipc_lock=p` makes it. True when it is
/// effective afterwards.
pub fn raise_ipc_lock() -> bool {
    use caps::{CapSet, Capability};
    let has = |set| caps::has_cap(None, set, Capability::CAP_IPC_LOCK).unwrap_or(false);
    if has(CapSet::Effective) {
        return true;
    }
    has(CapSet::Permitted) && caps::raise(None, CapSet::Effective, Capability::CAP_IPC_LOCK).is_ok()
}

/// Read the limits of this process's container. `hugepages` overrides the hugetlbfs mount
/// (default: `/dev/hugepages` when it is one, else the first hugetlbfs mount).
pub fn read_limits(hugepages: Option<&Path>) -> Limits {
    let cg = Path::new("/sys/fs/cgroup");
    let num = |name: &str| -> Option<Option<u64>> {
        let text = std::fs::read_to_string(cg.join(name)).ok()?;
        let t = text.trim();
        Some(if t == "max" { None } else { t.parse().ok() })
    };
    let hugepage_size = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| parse_hugepage_size(&m))
        .unwrap_or(2 << 20);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let hugepages = match hugepages {
        Some(p) => Some(p.to_path_buf()),
        None => hugetlbfs_mount(&mounts),
    };
    let suffix = hugetlb_suffix(hugepage_size);
    let cgroup_room = num(&format!("hugetlb.{suffix}.max")).flatten().map(|max| {
        let current = num(&format!("hugetlb.{suffix}.current")).flatten();
        max.saturating_sub(current.unwrap_or(0))
    });
    let pool =
        Path::new("/sys/kernel/mm/hugepages").join(format!("hugepages-{}kB", hugepage_size >> 10));
    let pages = |name: &str| -> Option<u64> {
        std::fs::read_to_string(pool.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let pool_room = pages("free_hugepages")
        .map(|free| free.saturating_sub(pages("resv_hugepages").unwrap_or(0)) * hugepage_size);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Limits {
        memory_max: num("memory.max").flatten(),
        memory_current: num("memory.current").flatten().unwrap_or(0),
        hugepages,
        hugepage_size,
        hugepages_room: [cgroup_room, pool_room].into_iter().flatten().min(),
        memlock: crate::verbs::memlock_limit(),
        pinned: status_kib(&status, "VmPin:").unwrap_or(0) << 10,
        ipc_lock: ipc_lock(&status),
    }
}

fn parse_hugepage_size(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("Hugepagesize:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The cgroup file suffix of a hugepage size: `2MB`, `1GB`.
fn hugetlb_suffix(size: u64) -> String {
    if size >= 1 << 30 {
        format!("{}GB", size >> 30)
    } else if size >= 1 << 20 {
        format!("{}MB", size >> 20)
    } else {
        format!("{}KB", size >> 10)
    }
}

fn hugetlbfs_mount(mounts: &str) -> Option<PathBuf> {
    let points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "hugetlbfs").then_some(point)
        })
        .collect();
    let pick = points
        .iter()
        .find(|p| **p == "/dev/hugepages")
        .or(points.first())?;
    Some(PathBuf::from(pick))
}

/// The first field of a /proc/self/status line, e.g. `VmPin:  1024 kB`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status_field(status, key)?.parse().ok()
}

/// Whether `CAP_IPC_LOCK` is in the capability set `key` (`CapEff:`, `CapBnd:`, ...).
fn cap_set_has_ipc_lock(status: &str, key: &str) -> bool {
    status_field(status, key)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .is_some_and(|caps| caps & CAP_IPC_LOCK_BIT != 0)
}

/// `CAP_IPC_LOCK` as /proc/self/status shows it.
fn ipc_lock(status: &str) -> IpcLock {
    if cap_set_has_ipc_lock(status, "CapEff:") {
        IpcLock::Effective
    } else if cap_set_has_ipc_lock(status, "CapBnd:") {
        // Uid: real, effective, saved, filesystem; exec grants capabilities by the effective one.
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1)?.parse().ok());
        IpcLock::NotHeld {
            uid: euid.unwrap_or(u32::MAX),
            no_new_privs: status_field(status, "NoNewPrivs:") == Some("1"),
        }
    } else {
        IpcLock::NotGranted
    }
}

#[cfg(test)]
mod tests;
