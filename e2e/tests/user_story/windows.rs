//! Step 3b: windows larger than the container's 8 MiB memlock limit, from the README's pod specs
//! as the image's non-root user: 64 MiB of anonymous memory (the fabric's `regionSize`) and
//! 256 MiB of hugepages (`rocefabric.io/region-size`), each pinned whole, written whole from a file
//! by a pod on the other worker and read back by checksum. And a pod whose window cannot be pinned
//! (the README's spec without `IPC_LOCK`): its termination message says why and how, and the fabric's
//! `Degraded` condition names it. Figures: bandwidth of those transfers against perftest's
//! `ib_write_bw` / `ib_read_bw` between the same pods.

use serde_json::{Value, json};

use crate::devices::{WINDOW_MEMORY, start_pods};
use crate::kube::{APPS, FABRIC, Story, WAIT, condition, eventually};
use crate::memory::{directory_lists, ok, perftest_once, window};
use crate::readme;

const MIB: u64 = 1 << 20;
/// The fabric's `regionSize` (examples/rocefabric-soft-roce.yaml).
const WINDOW: u64 = 64 * MIB;
/// The hugepage pods' windows, of 2 MiB pages (the workers reserve 160 at boot).
const HUGE_WINDOW: u64 = 256 * MIB;
/// What the data plane pins besides the window.
const STAGING: u64 = 4 * MIB;
/// The workload image's user.
const IMAGE_UID: &str = "65532";

/// The README's hugepage pod with a window of [`HUGE_WINDOW`] (its spec asks for 4 GiB).
fn huge_pod(story: &Story, name: &str, node: &str) -> Value {
    let mut pod = readme::pod(1);
    readme::place(story, &mut pod, name, node);
    let size = format!("{}Mi", HUGE_WINDOW / MIB);
    pod["metadata"]["annotations"]["rocefabric.io/region-size"] = json!(size);
    pod["spec"]["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = json!(size);
    pod
}

/// A field of `/proc/1/status` (the container's `rocefabric-dsm session`) in bytes or as text.
fn proc_status(story: &Story, pod: &str) -> Vec<(String, String)> {
    let text = story
        .exec(pod, "cat /proc/1/status")
        .unwrap_or_else(|e| panic!("{pod}: {e}"));
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn kib(fields: &[(String, String)], key: &str) -> u64 {
    let v = fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim_end_matches(" kB").trim())
        .unwrap_or_else(|| panic!("/proc/1/status has {key}"));
    v.parse::<u64>()
        .unwrap_or_else(|e| panic!("{key} {v}: {e}"))
        * 1024
}

/// The window of `pod` is pinned whole (and in hugepages when `huge`), by the image's user.
fn assert_pinned(story: &Story, pod: &str, size: u64, huge: bool) {
    let (_, _, held, _) = window(story, pod);
    assert_eq!(held, size, "{pod}'s window size");
    let fields = proc_status(story, pod);
    let uid = fields
        .iter()
        .find(|(k, _)| k == "Uid")
        .map(|(_, v)| v.split_whitespace().nth(1).unwrap_or_default().to_string());
    assert_eq!(
        uid.as_deref(),
        Some(IMAGE_UID),
        "{pod}: the data plane runs as the image's user (effective uid)"
    );
    let pinned = kib(&fields, "VmPin");
    assert!(
        pinned >= size + STAGING,
        "{pod}: VmPin {pinned} covers the {size}-byte window and staging"
    );
    if huge {
        let hugetlb = kib(&fields, "HugetlbPages");
        assert!(
            hugetlb >= size,
            "{pod}: the window is in hugepages (HugetlbPages {hugetlb})"
        );
    }
}

/// `from` writes all of `peer`'s window from a file of random bytes, then reads it back through a
/// pipe into `sha256sum`; returns the seconds each command took (in the pod, so without kubectl;
/// timed by /proc/uptime, to 10 ms, since busybox's `date` has no nanoseconds).
fn whole_window(story: &Story, from: &str, peer: &str, size: u64) -> (f64, f64) {
    let script = format!(
        "set -e; f=/tmp/{peer}.bin; head -c {size} /dev/urandom >$f; echo sent=$(sha256sum <$f); \
         t() {{ cut -d' ' -f1 /proc/uptime; }}; \
         t0=$(t); rocefabric-dsm write --addr {peer} --file $f; t1=$(t); rm $f; \
         echo got=$(rocefabric-dsm read --addr {peer} --len {size} --out - | sha256sum); \
         t2=$(t); echo uptimes=$t0,$t1,$t2"
    );
    let out = story
        .exec(from, &script)
        .unwrap_or_else(|e| panic!("{from} writes {peer}'s window: {e}"));
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .to_string()
    };
    let (sent, got) = (field("sent="), field("got="));
    assert_eq!(
        got, sent,
        "{from} reads back the {size} bytes it wrote into {peer}'s window"
    );
    let uptimes: Vec<f64> = field("uptimes=")
        .split(',')
        .map(|t| t.parse().unwrap_or_else(|e| panic!("uptime {t}: {e}")))
        .collect();
    let [t0, t1, t2] = uptimes[..] else {
        panic!("three uptimes in {out}")
    };
    ((t1 - t0).max(0.01), (t2 - t1).max(0.01))
}

/// perftest's average bandwidth (MB/s) for `bin` between `client` and `server`, 64 MiB in
/// messages of 1 MiB over the pods' granted rxe and GID.
fn perftest_bw(story: &Story, bin: &str, client: &str, server: &str) -> Option<f64> {
    (0..3).find_map(|_| {
        let out = perftest_once(story, bin, "-s 1048576 -n 64", client, server);
        // 0.00 is perftest's clock calibration failing under TCG, as its latency's `inf`.
        average_mb_s(&out).filter(|bw| *bw > 0.0)
    })
}

/// `BW average[MB/sec]` from a perftest bandwidth table.
fn average_mb_s(out: &str) -> Option<f64> {
    let mut lines = out.lines().skip_while(|l| !l.contains("BW average"));
    let header = lines.next()?;
    // "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]": the fourth number.
    debug_assert!(header.contains("BW peak"));
    let row = lines.find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))?;
    row.split_whitespace().nth(3)?.parse().ok()
}

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

pub fn whole_windows_by_checksum(story: &mut Story) {
    let (a, b) = (story.workers[0].clone(), story.workers[1].clone());
    // The hugepage pods: h1 the target on b's worker, h0 the writer on a's (its 512Mi memory, the
    // README's, holds the 256 MiB file it writes from).
    start_pods(
        story,
        &[huge_pod(story, "h0", &a), huge_pod(story, "h1", &b)],
    );
    for (pod, size, huge) in [
        ("a1", WINDOW, false),
        ("b1", WINDOW, false),
        ("h0", HUGE_WINDOW, true),
        ("h1", HUGE_WINDOW, true),
    ] {
        assert_pinned(story, pod, size, huge);
    }
    directory_lists(story, "a1", &["b1", "h1"]);
    directory_lists(story, "h0", &["b1", "h1"]);

    let (write, read) = whole_window(story, "a1", "b1", WINDOW);
    // The rollout (step 6) reads back step 3's 1 MiB pattern at b1+0: put it back.
    let restore = story.session("a1", &format!("write b1+0 {MIB} 7"));
    ok(&restore, "step 3's pattern written again");
    let (hw, hr) = whole_window(story, "h0", "h1", HUGE_WINDOW);
    let (dsm_w, dsm_r) = (mb_s(WINDOW, write), mb_s(WINDOW, read));
    story.figure(format!(
        "whole window a1 -> b1, 64 MiB anonymous: write --file {dsm_w:.1} MB/s ({write:.2} s), \
         read --out - {dsm_r:.1} MB/s ({read:.2} s), each command with its start and rendezvous"
    ));
    story.figure(format!(
        "whole window h0 -> h1, 256 MiB hugepages: write --file {:.1} MB/s ({hw:.2} s), \
         read --out - {:.1} MB/s ({hr:.2} s)",
        mb_s(HUGE_WINDOW, hw),
        mb_s(HUGE_WINDOW, hr)
    ));
    let ratio = |dsm: f64, ib: Option<f64>| match ib {
        Some(ib) => format!("{ib:.1} MB/s, ratio {:.2}", dsm / ib),
        None => "no figure in 3 tries".to_string(),
    };
    let ib_w = perftest_bw(story, "ib_write_bw", "a1", "b1");
    let ib_r = perftest_bw(story, "ib_read_bw", "a1", "b1");
    story.figure(format!(
        "a1 -> b1 bandwidth: ib_write_bw (64 x 1 MiB) {}; ib_read_bw {}",
        ratio(dsm_w, ib_w),
        ratio(dsm_r, ib_r)
    ));
    for pod in ["h0", "h1"] {
        story.kubectl(&["delete", "pod", "-n", APPS, pod, "--wait=false"]);
    }
}

/// The README's first pod without `IPC_LOCK`: refused before it opens the HCA, with the message
/// as its container's termination message (State, then Last State once it restarts) and its name
/// in the fabric's status; gone, and the fabric forgets it.
pub fn unpinnable_window_is_named(story: &mut Story) {
    let b = story.workers[1].clone();
    let mut pod = readme::pod(0);
    readme::place(story, &mut pod, "nocap", &b);
    let c = &mut pod["spec"]["containers"][0];
    c["resources"]["limits"]["memory"] = json!(WINDOW_MEMORY);
    c.as_object_mut()
        .expect("a container")
        .remove("securityContext");
    story.apply(&pod);

    let expected = format!(
        "rocefabric-dsm: local window of {WINDOW} bytes: cannot be pinned: registering pins {} \
         bytes",
        WINDOW + STAGING
    );
    let described = eventually("nocap's termination message names the window", WAIT, || {
        let text = story
            .try_kubectl(&["describe", "pod", "-n", APPS, "nocap"])
            .ok()?;
        text.contains(&expected).then_some(text)
    });
    for needed in [
        "RLIMIT_MEMLOCK is 8388608 bytes without CAP_IPC_LOCK",
        "add IPC_LOCK to the container's securityContext.capabilities.add",
        "Exit Code:    1",
    ] {
        assert!(
            described.contains(needed),
            "kubectl describe pod nocap says {needed:?}:\n{described}"
        );
    }
    let named = format!("{APPS}/nocap");
    let message = eventually("the fabric names nocap (WindowFailed)", WAIT, || {
        let fabric = story.get_json(&["get", "rf", FABRIC]);
        let (status, _, message) = condition(&fabric, "Degraded")?;
        (status == "True" && message.contains("WindowFailed: 1 pod cannot back or pin its window"))
            .then_some(message)
    });
    assert!(message.contains(&named), "{message}");
    assert!(
        !message.contains("RLIMIT_MEMLOCK"),
        "the fabric's status names the pod, never copies its text: {message}"
    );
    story.kubectl(&["delete", "pod", "-n", APPS, "nocap", "--wait=true"]);
    eventually("the fabric forgets nocap", WAIT, || {
        let fabric = story.get_json(&["get", "rf", FABRIC]);
        let (_, _, message) = condition(&fabric, "Degraded")?;
        (!message.contains("WindowFailed")).then_some(())
    });
}
