//! Windows larger than the default memlock limit, as the workload image's non-root user: a copy
//! of `rocefabric-dsm` with the image's file capability (`cap_ipc_lock=p`) serves a 64 MiB window
//! on rxe0 under an 8 MiB `RLIMIT_MEMLOCK`, from anonymous memory and from hugepages (and from
//! anonymous memory, saying why, when the node's pool is too small); one without it, or in a
//! container that does not add IPC_LOCK, or under `no_new_privs`, is refused before the HCA is
//! opened with the one message that names the window, the limit and the fix, which also lands in
//! the termination log the kubelet shows (the a-side's `pin-*` sections).

use rocefabric_formats::names::WINDOW_FAILED_MESSAGE_PREFIX;

use super::runs;

/// The a-side's shell functions and sections, run once everything else there is done.
pub(super) const SCENARIO: &str = r#"
# pin NAME BINARY SIZE [SETPRIV-ARGS...]: serve a SIZE-byte window as uid 65532 (the workload
# image's user) under an 8 MiB memlock limit, through setpriv (IPC_LOCK stays in the bounding set,
# as a container that adds it has it, unless the arguments drop it). Prints the process's VmPin once
# it serves, then what it printed and its termination log.
pin() {
  n=$1 bin=$2 size=$3; shift 3
  w='"fabric":"dsm","id":9,"base":1099511627776,"size":'$size',"uid":"u-'$n'"'
  printf '{%s}' "$w" >/tmp/pin/$n.region
  printf '[{"pod":"%s","podIP":"10.77.0.1",%s}]' $n "$w" >/tmp/pin/$n.dir
  : >/tmp/pin/$n.term && chown 65532 /tmp/pin/$n.term
  ( ulimit -l 8192
    exec env POD_NAME=$n POD_UID=u-$n ROCEFABRIC_REGION_FILE=/tmp/pin/$n.region \
      ROCEFABRIC_DIRECTORY=/tmp/pin/$n.dir ROCEFABRIC_TERMINATION_LOG=/tmp/pin/$n.term \
      ROCEFABRIC_LOG=info /usr/bin/setpriv --reuid 65532 --regid 65532 --clear-groups "$@" \
      -- $WRAP $bin --port 18600 ${HUGE:+--hugepages $HUGE} serve ) >/tmp/pin/$n.out 2>&1 &
  p=$!
  i=0
  until grep -q '"serving"' /tmp/pin/$n.out || ! kill -0 $p 2>/dev/null; do
    i=$((i+1)); [ $i -gt 900 ] && break; sleep 0.1
  done
  grep VmPin /proc/$p/status 2>/dev/null
  kill $p 2>/dev/null; wait $p
  echo "exit $?"
  cat /tmp/pin/$n.out
  echo "termination log: $(cat /tmp/pin/$n.term)"
}
WRAP=
mkdir -p /tmp/pin && chmod 755 /tmp/pin
cp $D /tmp/pin/dsm-plain && cp $D /tmp/pin/dsm-cap && setcap cap_ipc_lock=p /tmp/pin/dsm-cap
section pin-getcap /usr/sbin/getcap /tmp/pin/dsm-cap
section pin-cap pin cap /tmp/pin/dsm-cap 67108864
section pin-plain pin plain /tmp/pin/dsm-plain 67108864
section pin-not-added pin not-added /tmp/pin/dsm-cap 67108864 --bounding-set -ipc_lock
# no_new_privs: exec grants a file capability only to a process that held it before (the kernel
# intersects the permitted sets). setpriv keeps root's, so a non-root setpriv sets no_new_privs
# instead, as a runtime that gives a non-root container's process no permitted capabilities does.
WRAP="/usr/bin/setpriv --no-new-privs --"
section pin-nnp pin nnp /tmp/pin/dsm-cap 67108864
WRAP=
# Hugepages: a pool of 80 MiB holds the window; one of 32 MiB does not, and the window is
# anonymous memory, with a warning saying why.
mkdir -p /tmp/huge && mount -t hugetlbfs -o uid=65532,gid=65532,mode=0700 none /tmp/huge
HUGE=/tmp/huge
echo 40 >/proc/sys/vm/nr_hugepages
section pin-huge pin huge /tmp/pin/dsm-cap 67108864
echo 16 >/proc/sys/vm/nr_hugepages
section pin-huge-short pin huge-short /tmp/pin/dsm-cap 67108864
HUGE=
echo 0 >/proc/sys/vm/nr_hugepages
"#;

const WINDOW: u64 = 64 << 20;

/// `VmPin` in bytes from a `pin` section.
fn vm_pin(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib << 10)
        .unwrap_or_else(|| panic!("no VmPin line:\n{out}"))
}

#[test]
fn a_non_root_window_over_the_memlock_limit_is_pinned_with_the_images_file_capability() {
    let Some((a, _)) =
        runs("a_non_root_window_over_the_memlock_limit_is_pinned_with_the_images_file_capability")
    else {
        return;
    };
    let getcap = a.section("pin-getcap").output;
    assert!(getcap.contains("cap_ipc_lock=p"), "{getcap}");
    for name in ["pin-cap", "pin-huge", "pin-huge-short"] {
        let out = a.section(name).output;
        assert!(
            out.contains(r#""serving""#),
            "{name} serves its window:\n{out}"
        );
        // Window and staging buffer both pinned, eight times the memlock limit and more.
        assert!(
            vm_pin(&out) >= WINDOW + (4 << 20),
            "{name}: the 64 MiB window and the staging buffer are pinned:\n{out}"
        );
        assert!(out.contains("ipc_lock=true"), "{name}:\n{out}");
    }
    let huge = a.section("pin-huge").output;
    assert!(huge.contains("huge=true"), "hugepages back it:\n{huge}");
    assert!(
        a.section("pin-cap").output.contains("huge=false"),
        "no hugepages mounted: anonymous"
    );
    let short = a.section("pin-huge-short").output;
    assert!(short.contains(r#""serving""#), "{short}");
    assert!(
        short.contains("huge=false")
            && short.contains("hugepages on /tmp/huge hold only 33554432 bytes of the 67108864"),
        "a pool too small for the window: anonymous memory, saying why:\n{short}"
    );
}

#[test]
fn a_window_that_cannot_be_pinned_is_refused_before_the_hca_with_the_fix_for_its_container() {
    let Some((a, _)) = runs(
        "a_window_that_cannot_be_pinned_is_refused_before_the_hca_with_the_fix_for_its_container",
    ) else {
        return;
    };
    let cases = [
        (
            "pin-plain",
            "uid 65532 is not root",
            "setcap cap_ipc_lock=p",
        ),
        (
            "pin-not-added",
            "add IPC_LOCK to the container's securityContext.capabilities.add",
            "LimitMEMLOCK",
        ),
        ("pin-nnp", "no_new_privs", "allowPrivilegeEscalation: false"),
    ];
    let first = format!(
        "{WINDOW_FAILED_MESSAGE_PREFIX}{WINDOW} bytes: cannot be pinned: registering pins {} bytes",
        WINDOW + (4 << 20)
    );
    for (name, cause, fix) in cases {
        let out = a.section(name).output;
        let line = out
            .lines()
            .find(|l| l.starts_with("rocefabric-dsm: "))
            .unwrap_or_else(|| panic!("{name}: no error line:\n{out}"));
        assert!(line.starts_with(&first), "{name}: {line}");
        assert!(
            line.contains("RLIMIT_MEMLOCK is 8388608 bytes"),
            "{name}: {line}"
        );
        assert!(line.contains(cause) && line.contains(fix), "{name}: {line}");
        assert!(
            !out.contains("rxe0") && !out.contains("serving"),
            "{name}: refused before the HCA was opened:\n{out}"
        );
        assert!(out.contains("exit 1"), "{name}:\n{out}");
        assert!(
            out.contains(&format!("termination log: {line}")),
            "{name}: the kubelet's termination message is the same line:\n{out}"
        );
    }
}
