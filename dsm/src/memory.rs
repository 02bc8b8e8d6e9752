//! Where the local window lives (pure decision plus a small reader of the container's limits).
//!
//! Hugepages when the pod has them (a hugetlbfs mount, `/dev/hugepages` by default, with room under
//! its hugetlb limit), else anonymous memory. Registering the window pins it, so it must fit the
//! container's memory limit and, without `CAP_IPC_LOCK`, `RLIMIT_MEMLOCK`: a window that cannot is
//! refused at start with the limit named, instead of an out-of-memory kill or an `ENOMEM` later.

use std::path::{Path, PathBuf};

use crate::error::{DsmError, Result};

/// Room left for the process itself next to an anonymous window.
pub const HEADROOM: u64 = 32 << 20;

/// What the container may use, as read from cgroup v2, /proc and getrlimit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `memory.max` (None: unlimited) and `memory.current`.
    pub memory_max: Option<u64>,
    pub memory_current: u64,
    /// A hugetlbfs mount to create the window file in, its page size, and the hugetlb cgroup limit
    /// for that size (None: unlimited, Some(0): the pod has no hugepages).
    pub hugepages: Option<PathBuf>,
    pub hugepage_size: u64,
    pub hugetlb_max: Option<u64>,
    /// `RLIMIT_MEMLOCK` (None: unlimited) and whether `CAP_IPC_LOCK` lifts it.
    pub memlock: Option<u64>,
    pub ipc_lock: bool,
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

/// Choose the backing of a `size`-byte window, or say which limit it breaks.
pub fn plan(size: u64, limits: &Limits) -> Result<Backing> {
    let too_big = |reason: String| DsmError::Memory { size, reason };
    if let Some(l) = limits.memlock.filter(|&l| l < size && !limits.ipc_lock) {
        return Err(too_big(format!(
            "registering pins it, and RLIMIT_MEMLOCK is {l} bytes without CAP_IPC_LOCK: \
             add IPC_LOCK to the container's capabilities or raise the limit"
        )));
    }
    if let Some(dir) = &limits.hugepages {
        let page = limits.hugepage_size.max(1);
        let rounded = size.div_ceil(page).saturating_mul(page);
        if limits.hugetlb_max.is_none_or(|max| max >= rounded) {
            return Ok(Backing::Hugepages {
                dir: dir.clone(),
                page,
            });
        }
    }
    if let Some(max) = limits.memory_max {
        let need = size
            .saturating_add(limits.memory_current)
            .saturating_add(HEADROOM);
        if need > max {
            let huge = match (&limits.hugepages, limits.hugetlb_max) {
                (Some(_), Some(h)) => format!("; hugepages hold only {h} bytes"),
                _ => String::new(),
            };
            return Err(too_big(format!(
                "does not fit the container's memory limit of {max} bytes \
                 ({} in use, {HEADROOM} kept for the process){huge}",
                limits.memory_current
            )));
        }
    }
    Ok(Backing::Anonymous)
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
    let hugetlb_name = format!("hugetlb.{}.max", hugetlb_suffix(hugepage_size));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Limits {
        memory_max: num("memory.max").flatten(),
        memory_current: num("memory.current").flatten().unwrap_or(0),
        hugepages,
        hugepage_size,
        hugetlb_max: num(&hugetlb_name).flatten(),
        memlock: crate::verbs::memlock_limit(),
        ipc_lock: has_ipc_lock(&status),
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

/// `CAP_IPC_LOCK` (bit 14) in the effective set.
fn has_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn hugepages_when_the_pod_has_room_in_them_else_anonymous() {
        let huge = Limits {
            hugepages: Some("/dev/hugepages".into()),
            hugepage_size: 2 * MIB,
            hugetlb_max: Some(64 * MIB),
            memory_max: Some(256 * MIB),
            ..Limits::default()
        };
        assert_eq!(
            plan(63 * MIB, &huge).unwrap(),
            Backing::Hugepages {
                dir: "/dev/hugepages".into(),
                page: 2 * MIB
            }
        );
        // 65 MiB rounds to 66 MiB of hugepages: more than the pod has; memory takes it.
        assert_eq!(plan(65 * MIB, &huge).unwrap(), Backing::Anonymous);
        let none = Limits {
            hugetlb_max: Some(0),
            ..huge.clone()
        };
        assert_eq!(plan(MIB, &none).unwrap(), Backing::Anonymous);
    }

    #[test]
    fn a_window_over_the_memory_limit_is_refused_naming_it() {
        let l = Limits {
            memory_max: Some(128 * MIB),
            memory_current: 10 * MIB,
            ..Limits::default()
        };
        assert_eq!(plan(64 * MIB, &l).unwrap(), Backing::Anonymous);
        let e = plan(100 * MIB, &l).unwrap_err().to_string();
        assert!(
            e.starts_with("local window of 104857600 bytes: does not fit"),
            "{e}"
        );
        assert!(e.contains("memory limit of 134217728 bytes"), "{e}");
        assert_eq!(
            plan(1 << 40, &Limits::default()).unwrap(),
            Backing::Anonymous
        );
    }

    #[test]
    fn a_window_over_memlock_needs_ipc_lock() {
        let l = Limits {
            memlock: Some(64 * 1024),
            ..Limits::default()
        };
        let e = plan(MIB, &l).unwrap_err().to_string();
        assert!(
            e.contains("RLIMIT_MEMLOCK is 65536 bytes") && e.contains("IPC_LOCK"),
            "{e}"
        );
        assert!(
            plan(
                MIB,
                &Limits {
                    ipc_lock: true,
                    ..l
                }
            )
            .is_ok()
        );
    }

    #[test]
    fn proc_and_cgroup_texts_are_read() {
        assert_eq!(
            parse_hugepage_size("MemTotal: 1 kB\nHugepagesize:    2048 kB\n"),
            Some(2 * MIB)
        );
        assert_eq!(hugetlb_suffix(2 * MIB), "2MB");
        assert_eq!(hugetlb_suffix(1 << 30), "1GB");
        let mounts =
            "none /dev/hugepages2M hugetlbfs rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw 0 0\n";
        assert_eq!(hugetlbfs_mount(mounts), Some("/dev/hugepages".into()));
        assert_eq!(hugetlbfs_mount("proc /proc proc rw 0 0\n"), None);
        assert!(has_ipc_lock("CapEff:\t00000000a80c75fb\n"));
        assert!(!has_ipc_lock("CapEff:\t00000000a80425fb\n"));
    }
}
