use super::*;

const MIB: u64 = 1 << 20;
/// The data plane's staging buffer, which is pinned beside every window.
const STAGING: u64 = 4 * MIB;

fn huge(room: u64) -> Limits {
    Limits {
        hugepages: Some("/dev/hugepages".into()),
        hugepage_size: 2 * MIB,
        hugepages_room: Some(room),
        memory_max: Some(256 * MIB),
        ..Limits::default()
    }
}

#[test]
fn hugepages_when_the_pod_has_room_in_them_else_anonymous_saying_why() {
    let plan63 = plan(Some(63 * MIB), STAGING, &huge(64 * MIB)).unwrap();
    assert_eq!(
        plan63.backing,
        Backing::Hugepages {
            dir: "/dev/hugepages".into(),
            page: 2 * MIB
        }
    );
    assert_eq!(plan63.pinned, 64 * MIB + STAGING, "rounded to hugepages");
    assert_eq!(plan63.note, None);
    // 65 MiB rounds to 66 MiB of hugepages: more than the pod may take; memory takes it.
    let plan65 = plan(Some(65 * MIB), STAGING, &huge(64 * MIB)).unwrap();
    assert_eq!(plan65.backing, Backing::Anonymous);
    let note = plan65.note.unwrap();
    assert!(
        note.contains("hold only 67108864 bytes of the 69206016"),
        "{note}"
    );
    // No room at all (a pod without hugepages, or a node's pool taken by others).
    let none = plan(Some(MIB), STAGING, &huge(0)).unwrap();
    assert_eq!(none.backing, Backing::Anonymous);
    // Room unknown (no hugetlb controller, no pool counters): the mount is trusted.
    let unknown = Limits {
        hugepages_room: None,
        ..huge(0)
    };
    assert!(matches!(
        plan(Some(GIB), STAGING, &unknown).unwrap().backing,
        Backing::Hugepages { .. }
    ));
}

const GIB: u64 = 1 << 30;

#[test]
fn a_window_over_the_memory_limit_is_refused_naming_the_limit_and_the_fix() {
    let l = Limits {
        memory_max: Some(128 * MIB),
        memory_current: 10 * MIB,
        ..Limits::default()
    };
    assert_eq!(
        plan(Some(64 * MIB), STAGING, &l).unwrap().backing,
        Backing::Anonymous
    );
    let e = plan(Some(100 * MIB), STAGING, &l).unwrap_err().to_string();
    assert!(
        e.starts_with("local window of 104857600 bytes: does not fit"),
        "{e}"
    );
    assert!(e.contains("memory limit of 134217728 bytes"), "{e}");
    let need = 100 * MIB + STAGING + 10 * MIB + HEADROOM;
    assert!(
        e.contains(&format!("raise resources.limits.memory to at least {need}")),
        "{e}"
    );
    // Hugepages that were too few are named too.
    let e = plan(Some(300 * MIB), STAGING, &huge(64 * MIB))
        .unwrap_err()
        .to_string();
    assert!(e.contains("hugepages on /dev/hugepages hold only"), "{e}");
    assert!(
        plan(Some(1 << 40), STAGING, &Limits::default()).is_ok(),
        "no limit known: not refused"
    );
}

/// The pod: 8 MiB window, the default 8 MiB memlock, IPC_LOCK added but not held by the
/// image's non-root user. The old check compared the window alone with the limit and let it
/// through to an `ENOMEM` from the registration; the staging buffer is pinned too.
#[test]
fn a_window_memlock_cannot_hold_with_its_staging_is_refused_before_registration() {
    let l = Limits {
        memlock: Some(8 * MIB),
        ipc_lock: IpcLock::NotHeld {
            uid: 65532,
            no_new_privs: false,
        },
        ..Limits::default()
    };
    assert!(
        plan(Some(4 * MIB), STAGING, &l).is_ok(),
        "4 MiB + 4 MiB of staging fit 8 MiB"
    );
    let e = plan(Some(8 * MIB), STAGING, &l).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "local window of 8388608 bytes: cannot be pinned: registering pins 12582912 bytes"
        ),
        "{e}"
    );
    assert!(e.contains("RLIMIT_MEMLOCK is 8388608 bytes"), "{e}");
    assert!(e.contains("uid 65532 is not root"), "{e}");
    assert!(e.contains("setcap cap_ipc_lock=p"), "{e}");
    // Held: only the memory limit counts.
    let held = Limits {
        ipc_lock: IpcLock::Effective,
        ..l.clone()
    };
    assert!(plan(Some(GIB), STAGING, &held).is_ok());
}

#[test]
fn the_fix_named_is_the_one_this_container_needs() {
    let refusal = |ipc_lock| {
        let l = Limits {
            memlock: Some(8 * MIB),
            ipc_lock,
            ..Limits::default()
        };
        plan(Some(64 * MIB), STAGING, &l).unwrap_err().to_string()
    };
    let e = refusal(IpcLock::NotGranted);
    assert!(
        e.contains("add IPC_LOCK to the container's securityContext.capabilities.add"),
        "{e}"
    );
    let e = refusal(IpcLock::NotHeld {
        uid: 1000,
        no_new_privs: true,
    });
    assert!(e.contains("allowPrivilegeEscalation: false"), "{e}");
    for e in [refusal(IpcLock::NotGranted), e] {
        assert!(e.contains("LimitMEMLOCK"), "the node-wide alternative: {e}");
    }
}

#[test]
fn hugepages_and_what_is_pinned_already_count_against_memlock() {
    let l = Limits {
        memlock: Some(64 * MIB),
        ..huge(GIB)
    };
    // 58 MiB + 4 MiB of staging fit 64 MiB ...
    assert!(plan(Some(58 * MIB), STAGING, &l).is_ok());
    // ... 61 MiB rounds to 62 MiB of hugepages, and does not.
    let e = plan(Some(61 * MIB), STAGING, &l).unwrap_err().to_string();
    assert!(e.contains("registering pins 69206016 bytes"), "{e}");
    let pinned = Limits {
        pinned: 8 * MIB,
        ..l
    };
    let e = plan(Some(56 * MIB), STAGING, &pinned)
        .unwrap_err()
        .to_string();
    assert!(e.contains("8388608 pinned already"), "{e}");
}

#[test]
fn a_process_without_a_window_checks_its_staging_buffer() {
    let l = Limits {
        memlock: Some(MIB),
        ..Limits::default()
    };
    let e = plan(None, STAGING, &l).unwrap_err().to_string();
    assert!(
        e.starts_with("staging buffer of 4194304 bytes: cannot be pinned"),
        "{e}"
    );
    assert_eq!(
        plan(None, STAGING, &Limits::default()).unwrap().pinned,
        STAGING
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
    // A non-root container that added IPC_LOCK: in the bounding set only.
    let status = "Name:\trocefabric-dsm\nUid:\t65532\t65532\t65532\t65532\nVmPin:\t    2048 kB\n\
        NoNewPrivs:\t0\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
        CapEff:\t0000000000000000\nCapBnd:\t00000000a80c75fb\n";
    assert_eq!(
        ipc_lock(status),
        IpcLock::NotHeld {
            uid: 65532,
            no_new_privs: false
        }
    );
    assert_eq!(status_kib(status, "VmPin:"), Some(2048));
    let raised = status.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000004000");
    assert_eq!(ipc_lock(&raised), IpcLock::Effective);
    let default_bounding = status.replace("a80c75fb", "a80425fb");
    assert_eq!(ipc_lock(&default_bounding), IpcLock::NotGranted);
    let nnp = status.replace("NoNewPrivs:\t0", "NoNewPrivs:\t1");
    assert!(matches!(
        ipc_lock(&nnp),
        IpcLock::NotHeld {
            no_new_privs: true,
            ..
        }
    ));
}

/// This test process's own limits are read without failing, whatever the machine.
#[test]
fn this_process_limits_are_read() {
    let l = read_limits(None);
    assert!(l.hugepage_size >= 4096);
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    if own.contains("VmPin:") {
        assert_eq!(l.pinned, status_kib(&own, "VmPin:").unwrap() << 10);
    }
}
