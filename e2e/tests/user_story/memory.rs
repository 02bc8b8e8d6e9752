//! Step 3: memory shared across nodes with one-sided RDMA between the workers' rxe devices: 1 MiB
//! written into a window on the other node, read back, and seen by its owner in its own memory;
//! `fetch_add` from all four pods adds up exactly; an access outside every window is refused with
//! the documented message. And the figure of the data plane's read latency against perftest's
//! `ib_read_lat` between the same two VMs.

use serde_json::Value;

use crate::kube::{APPS, Story, WAIT, eventually};

/// A pod's window from its `rocefabric.io/region` annotation: (id, base, size, uid).
pub fn window(story: &Story, pod: &str) -> (u64, u64, u64, String) {
    let object = story.get_json(&["get", "pod", "-n", APPS, pod]);
    let text = object["metadata"]["annotations"]["rocefabric.io/region"]
        .as_str()
        .unwrap_or_else(|| panic!("{pod} has no window"));
    let w: Value = serde_json::from_str(text).expect("the region annotation is JSON");
    let n = |k: &str| {
        w[k].as_u64()
            .unwrap_or_else(|| panic!("{pod}'s window has no {k}: {w}"))
    };
    (
        n("id"),
        n("base"),
        n("size"),
        w["uid"].as_str().unwrap_or_default().to_string(),
    )
}

/// The answer succeeded; its JSON otherwise.
pub fn ok(answer: &Value, what: &str) {
    assert_eq!(answer["ok"], true, "{what}: {answer}");
}

const MIB: u64 = 1 << 20;

/// Wait until the directory mounted in `pod` names every one of `peers` with its pod IP (the
/// operator writes the IP once the pod runs; the kubelet syncs ConfigMap volumes within about a
/// minute).
pub fn directory_lists(story: &Story, pod: &str, peers: &[&str]) {
    eventually(
        &format!("{pod}'s mounted directory lists {peers:?} with pod IPs"),
        WAIT,
        || {
            let text = story
                .exec(pod, "cat /etc/rocefabric/directory/regions.json")
                .ok()?;
            let entries: Vec<Value> = serde_json::from_str(&text).ok()?;
            peers
                .iter()
                .all(|p| {
                    entries.iter().any(|e| {
                        e["pod"] == *p && e["podIP"].as_str().is_some_and(|ip| !ip.is_empty())
                    })
                })
                .then_some(())
        },
    );
}

pub fn share_memory(story: &mut Story) {
    let all = ["a1", "a2", "b1", "b2"];
    for pod in all {
        directory_lists(story, pod, &all);
    }
    // Every pod can reach every window before the checks (rendezvous over the pod network).
    for pod in ["a1", "a2", "b1", "b2"] {
        for peer in ["a1", "a2", "b1", "b2"] {
            if pod != peer {
                let answer = story.session(pod, &format!("reach {peer}+0 60000"));
                ok(&answer, &format!("{pod} reaches {peer}"));
            }
        }
    }
    // 1 MiB from a pod on one worker into a window on the other.
    let write = story.session("a1", &format!("write b1+0 {MIB} 7"));
    ok(&write, "a1 writes 1 MiB into b1's window");
    let read = story.session("a1", &format!("read b1+0 {MIB} 7"));
    ok(&read, "a1 reads it back");
    assert_eq!(read["match"], true, "a1 reads back what it wrote: {read}");
    let local = story.session("b1", &format!("check-local 0 {MIB} 7"));
    ok(&local, "b1 checks its own memory");
    assert_eq!(
        local["match"], true,
        "b1 sees the bytes in its own memory (CPU, no RDMA): {local}"
    );

    // fetch_add from all four pods at once, on a word of b2's window.
    ok(
        &story.session("a1", "write-word b2+64 0"),
        "a1 zeroes the counter",
    );
    let (rounds, per) = (25u64, 1u64);
    let sent: Vec<(&str, u64)> = ["a1", "a2", "b1", "b2"]
        .into_iter()
        .map(|pod| (pod, story.send(pod, &format!("add b2+64 {per} {rounds}"))))
        .collect();
    for (pod, n) in sent {
        ok(&story.answer(pod, n), &format!("{pod}'s fetch_add"));
    }
    let total = story.session("a2", "read-word b2+64");
    ok(&total, "a2 reads the counter");
    assert_eq!(
        total["value"],
        4 * rounds * per,
        "no update is lost: {total}"
    );

    // Outside every window: refused before anything is posted, with the owner named.
    let (_, base, size, _) = window(story, "b1");
    let out = story.session("a1", &format!("read b1+{} 8", size - 4));
    assert_eq!(
        out["ok"], false,
        "an access past b1's window is refused: {out}"
    );
    let expected = format!(
        "address {:#x} (+8 bytes): out of window: pod b1 holds [{base:#x}, {:#x})",
        base + size - 4,
        base + size
    );
    assert_eq!(out["error"], expected.as_str(), "the documented message");
}

/// `rocefabric-dsm probe` from a1 to b1 against `ib_read_lat` between the same pods (so the same
/// VMs, rxe devices and GIDs), and `ib_write_lat` of 2-byte messages beside it: when perftest
/// prints `inf`, the figure says what perftest said about its clock (issue 46: the calibration
/// under TCG, not the pods' traffic class or MTU, which both programs share).
pub fn latency_figure(story: &mut Story) {
    let probe = story
        .exec("a1", "rocefabric-dsm probe --peers b1 --output json")
        .unwrap_or_else(|e| panic!("probe: {e}"));
    let rows: Value =
        serde_json::from_str(&probe).unwrap_or_else(|e| panic!("probe json: {e}: {probe}"));
    let dsm = rows[0]["readP50Us"]
        .as_f64()
        .unwrap_or_else(|| panic!("no readP50Us: {probe}"));
    let read = perftest_lat(story, "ib_read_lat", "");
    match read.typical {
        Some(ib) => story.figure(format!(
            "cross-node read p50: rocefabric-dsm probe {dsm:.1} us, ib_read_lat t_typical {ib:.1} us, ratio {:.2}",
            dsm / ib
        )),
        None => story.figure(format!(
            "cross-node read p50: rocefabric-dsm probe {dsm:.1} us; ib_read_lat gave no figure in {TRIES} tries"
        )),
    }
    let write = perftest_lat(story, "ib_write_lat", "-s 2");
    let mhz = story
        .exec(
            "a1",
            "grep -m1 'cpu MHz' /proc/cpuinfo || echo 'cpu MHz: none'",
        )
        .unwrap_or_default();
    for (bin, run) in [("ib_read_lat", &read), ("ib_write_lat -s 2", &write)] {
        story.figure(format!(
            "{bin}: t_typical {}; {} of {} tries printed inf{}; a1's /proc/cpuinfo {}",
            run.typical
                .map_or("none".to_string(), |v| format!("{v:.1} us")),
            run.inf,
            run.tries,
            match run.clock.as_slice() {
                [] => String::new(),
                lines => format!(", perftest said: {}", lines.join(" | ")),
            },
            mhz.trim()
        ));
    }
}

/// Most perftest runs a figure takes.
const TRIES: usize = 3;

/// What [`perftest_lat`] saw.
struct Latency {
    /// `t_typical[usec]` of the first run that printed a finite one.
    typical: Option<f64>,
    tries: usize,
    /// Runs whose table said `inf`.
    inf: usize,
    /// perftest's lines about its clock in those runs (its calibration's complaints).
    clock: Vec<String>,
}

/// perftest's latency program `bin` (with `args`) from a1 to b1 over their granted rxe and GID,
/// tried until it prints a finite figure.
fn perftest_lat(story: &Story, bin: &str, args: &str) -> Latency {
    let common = format!("-n 200 {args}");
    let mut seen = Latency {
        typical: None,
        tries: 0,
        inf: 0,
        clock: Vec::new(),
    };
    while seen.tries < TRIES && seen.typical.is_none() {
        seen.tries += 1;
        let out = perftest_once(story, bin, &common, "a1", "b1");
        let typical = typical_us(&out);
        if typical.is_some_and(f64::is_infinite) {
            seen.inf += 1;
            seen.clock.extend(
                out.lines()
                    .filter(|l| {
                        let l = l.to_ascii_lowercase();
                        l.contains("correlation") || l.contains("mhz") || l.contains("frequency")
                    })
                    .map(|l| l.trim().to_string()),
            );
        }
        seen.typical = typical.filter(|v| v.is_finite());
    }
    seen
}

/// One run of perftest's `bin` (with `args`) from `client` to `server` over the pods' granted rxe
/// and GID: its server started in `server`, its client's output (stdout and stderr) returned.
pub fn perftest_once(story: &Story, bin: &str, args: &str, client: &str, server: &str) -> String {
    let ip = story.kubectl(&[
        "get",
        "pod",
        "-n",
        APPS,
        server,
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    let args = format!("-d rxe0 -x $NCCL_IB_GID_INDEX -F {args}");
    story
        .exec(
            server,
            &format!("timeout 120 {bin} {args} >/tmp/{bin}.log 2>&1 &"),
        )
        .unwrap_or_else(|e| panic!("start {bin}'s server in {server}: {e}"));
    std::thread::sleep(std::time::Duration::from_secs(2));
    story
        .exec(
            client,
            &format!("timeout 120 {bin} {args} {} 2>&1", ip.trim()),
        )
        .unwrap_or_default()
}

/// perftest's `t_typical[usec]` from its result table.
fn typical_us(out: &str) -> Option<f64> {
    let mut lines = out.lines().skip_while(|l| !l.contains("t_typical"));
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let col = header.iter().position(|h| h.starts_with("t_typical"))?;
    let row = lines.find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))?;
    // Header words and row fields line up except "99% percentile" and "99.9% percentile",
    // which come after t_typical.
    row.split_whitespace().nth(col)?.parse().ok()
}
