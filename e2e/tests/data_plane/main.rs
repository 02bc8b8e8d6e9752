//! The data plane on a real RDMA stack: two Soft-RoCE VMs on one emulated wire, two "pods" on
//! each (a process in its own network namespace, reached over a veth for the rendezvous, while
//! rxe0 stays in the VM's initial namespace as a shared HCA does on a node). Their windows and the
//! directory come from the real planner (`rocefabric-operator plan --writes` over a snapshot of
//! the four pods, gated, then running). What the tests check:
//! - a 1 MiB write lands in the owner's memory with the owner posting nothing; read back by RDMA;
//! - out-of-window and unassigned addresses are refused before anything is posted;
//! - 4 x 10,000 `fetch_add` from both VMs give exactly 40,000; a CAS lock keeps a record untorn;
//! - the owner restarts as a new pod (new uid): the stale connection is never used, the next
//!   access after the directory names the new pod reconnects;
//! - `probe` figures are non-zero and within 3x of perftest's in the same run, and a connected
//!   access allocates nothing;
//! - a process without the namespace's key is refused (both sides say why, the owner logs who
//!   came), a killed lock holder's lock is broken after the lease and not before, and an owner
//!   frees the queue pair of every peer that left;
//! - a hello naming another fabric or no uid, a slow loris, 1,000 silent connects from 12
//!   addresses and 40 member connections from one are refused or capped, the owner keeps serving,
//!   its threads and queue pairs stay under the caps, and its window is unchanged.
//!
//! Skips like the Soft-RoCE suite (`SKIPPED: data_plane (<reason>): <test>`);
//! `ROCEFABRIC_REQUIRE_SOFT_ROCE=1` makes a skip a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser as _;
use rocefabric_e2e::node::{dsm_binary, dsm_crossing_binary};
use rocefabric_e2e::vm::{self, Guest, Run};
use rocefabric_operator::cli::{Cli, Command, plan};
use serde_json::{Value, json};

mod crossing;
mod pinning;
mod scenario;
use scenario::scenario;

const VM_TIMEOUT: Duration = Duration::from_secs(420);

/// Rounds of probe, ib_read_lat and ib_write_bw, interleaved. Under TCG on a shared host one
/// round can land on a stall of a few host-scheduler quanta; each side's best round is compared.
const PERF_ROUNDS: usize = 5;

/// The pods: name, VM, pod IP, uid.
const PODS: [(&str, &str, &str, &str); 4] = [
    (
        "a1",
        "vm-a",
        "10.88.1.2",
        "00000000-0000-4000-8000-0000000000a1",
    ),
    (
        "a2",
        "vm-a",
        "10.88.1.3",
        "00000000-0000-4000-8000-0000000000a2",
    ),
    (
        "b1",
        "vm-b",
        "10.88.2.2",
        "00000000-0000-4000-8000-0000000000b1",
    ),
    (
        "b2",
        "vm-b",
        "10.88.2.3",
        "00000000-0000-4000-8000-0000000000b2",
    ),
];
/// b1 restarted: the same name, a new uid and address.
const B1_NEW: (&str, &str, &str, &str) = (
    "b1",
    "vm-b",
    "10.88.2.4",
    "00000000-0000-4000-8000-0000000b1b1b",
);

fn fabric() -> Value {
    json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
        "metadata": {"name": "dsm", "uid": "fabric-uid", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"rocefabric.io/test": "dsm"}},
                 "sharedMemory": {"regionSize": "2Mi", "maxRegions": 16,
                                  "podSelector": {"matchLabels": {"app": "dsm"}}}}})
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"rocefabric.io/test": "dsm"}}})
}

/// A pod as the API server shows it: gated (no annotation yet), or running with `annotation`.
fn pod((name, node, ip, uid): (&str, &str, &str, &str), annotation: Option<&str>, t: u32) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1",
                     "creationTimestamp": format!("2026-12-03T00:00:0{t}Z"), "labels": {"app": "dsm"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    match annotation {
        None => p["spec"]["schedulingGates"] = json!([{"name": "rocefabric.io/region"}]),
        Some(a) => {
            p["metadata"]["annotations"] = json!({"rocefabric.io/region": a});
            p["spec"]["nodeName"] = json!(node);
            p["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
        }
    }
    p
}

/// Run the real planner over `pods`; its annotation values by pod, and the directory text.
fn plan_writes(dir: &Path, pods: &[Value]) -> (BTreeMap<String, String>, Option<String>) {
    let list =
        |items: Vec<Value>| json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("temp file");
        p.display().to_string()
    };
    let argv = [
        "rocefabric-operator".to_string(),
        "plan".into(),
        "--fabrics".into(),
        write("fabrics.yaml", list(vec![fabric()])),
        "--nodes".into(),
        write("nodes.yaml", list(vec![node("vm-a"), node("vm-b")])),
        "--pods".into(),
        write("pods.yaml", list(pods.to_vec())),
        "--output".into(),
        "json".into(),
        "--writes".into(),
    ];
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Command::Plan(args) = cli.command else {
        panic!("not plan")
    };
    let out = serde_json::to_value(plan::plan_files(&args).expect("plan")).expect("serializes");
    let mut annotations = BTreeMap::new();
    let mut directory = None;
    for w in out["writeList"].as_array().expect("--writes lists writes") {
        match w["kind"].as_str() {
            Some("annotatePodRegion") => {
                annotations.insert(
                    w["pod"].as_str().expect("pod").to_string(),
                    w["value"].as_str().expect("value").to_string(),
                );
            }
            Some("applyRegionDirectory") => {
                directory = w["data"]["regions.json"].as_str().map(String::from)
            }
            _ => {}
        }
    }
    (annotations, directory)
}

/// What the planner gives: each pod's annotation, the directory before and after b1's restart,
/// and the restarted b1's annotation.
struct Planned {
    annotations: BTreeMap<String, String>,
    directory: String,
    b1_new: String,
    directory_after: String,
}

fn planned() -> Planned {
    let dir = tempfile::tempdir().expect("tempdir");
    let gated: Vec<Value> = PODS
        .iter()
        .enumerate()
        .map(|(i, p)| pod(*p, None, i as u32))
        .collect();
    let (annotations, _) = plan_writes(dir.path(), &gated);
    assert_eq!(
        annotations.len(),
        4,
        "every gated pod gets a window: {annotations:?}"
    );
    let running: Vec<Value> = PODS
        .iter()
        .enumerate()
        .map(|(i, p)| pod(*p, Some(&annotations[p.0]), i as u32))
        .collect();
    let (_, directory) = plan_writes(dir.path(), &running);
    let directory = directory.expect("a directory for the running pods");
    // b1 is replaced by a new pod of the same name: gated, then running.
    let mut after: Vec<Value> = running
        .iter()
        .filter(|p| p["metadata"]["uid"] != PODS[2].3)
        .cloned()
        .collect();
    after.push(pod(B1_NEW, None, 5));
    let (new, _) = plan_writes(dir.path(), &after);
    let b1_new = new.get("b1").expect("the new b1 gets a window").clone();
    after.pop();
    after.push(pod(B1_NEW, Some(&b1_new), 5));
    let (_, directory_after) = plan_writes(dir.path(), &after);
    Planned {
        annotations,
        directory,
        b1_new,
        directory_after: directory_after.expect("directory"),
    }
}

fn runs(test: &str) -> Option<&'static (Run, Run)> {
    static RUNS: OnceLock<Result<(Run, Run), String>> = OnceLock::new();
    let runs = RUNS.get_or_init(|| {
        let image = vm::image()?;
        let bins: Vec<PathBuf> = vec![dsm_binary()?, dsm_crossing_binary()?];
        let p = planned();
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let _one_set_at_a_time = vm::exclusive();
        let end = |name: &str, a: bool, mac: &str| {
            let mut g = Guest::new(name, &scenario(a, &p), bins.clone());
            g.mac = mac.into();
            g
        };
        let (a, b) = vm::run_pair(
            end("a", true, "52:54:00:00:01:0a"),
            end("b", false, "52:54:00:00:01:0b"),
            &image,
            work.path(),
            VM_TIMEOUT,
        )?;
        eprintln!(
            "data_plane: VMs ran {:.1} s / {:.1} s",
            a.elapsed.as_secs_f64(),
            b.elapsed.as_secs_f64()
        );
        Ok((a, b))
    });
    match runs {
        Ok(r) => Some(r),
        Err(reason) if vm::required() => {
            panic!(
                "{} is set but the Soft-RoCE VMs cannot run: {reason}",
                vm::REQUIRE_ENV
            )
        }
        Err(reason) => {
            rocefabric_e2e::skip("data_plane", reason, test);
            None
        }
    }
}

/// The session's answers by command line number.
fn answers(run: &Run, pod: &str) -> Vec<Value> {
    run.json_lines(pod)
        .into_iter()
        .filter(|v| v.get("n").is_some())
        .collect()
}

fn answer(lines: &[Value], n: u64) -> &Value {
    lines
        .iter()
        .find(|v| v["n"] == n)
        .unwrap_or_else(|| panic!("no answer {n} in {lines:#?}"))
}

fn ok(v: &Value) -> &Value {
    assert_eq!(v["ok"], true, "{v}");
    v
}

/// A perftest result row: the first line whose first field is `bytes`, as numbers.
fn perftest_row(run: &Run, section: &str, bytes: &str) -> Vec<f64> {
    let out = run.section(section).output;
    out.lines()
        .map(str::split_whitespace)
        .find_map(|mut f| {
            (f.next() == Some(bytes)).then(|| f.filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_else(|| panic!("no {bytes}-byte row in {section}:\n{out}"))
}

#[test]
fn a_one_mib_write_lands_in_the_owners_memory_without_its_cpu_and_reads_back() {
    let Some((a, b)) =
        runs("a_one_mib_write_lands_in_the_owners_memory_without_its_cpu_and_reads_back")
    else {
        return;
    };
    let a1 = answers(a, "a1");
    assert_eq!(ok(answer(&a1, 8))["len"], 1 << 20);
    assert_eq!(
        ok(answer(&a1, 9))["match"],
        true,
        "RDMA read returns the pattern"
    );
    let b1 = answers(b, "b1");
    // The owner saw the flag, had posted nothing (no receive, no request), and finds the data in
    // its own memory with the CPU.
    let stats = ok(answer(&b1, 2));
    assert_eq!(stats["posted"], 0, "{stats}");
    assert!(stats["peersServed"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(ok(answer(&b1, 3))["match"], true);
}

#[test]
fn out_of_window_unassigned_and_misaligned_accesses_are_refused_before_posting() {
    let Some((a, _)) =
        runs("out_of_window_unassigned_and_misaligned_accesses_are_refused_before_posting")
    else {
        return;
    };
    let a1 = answers(a, "a1");
    let err = |n| {
        let v = answer(&a1, n);
        assert_eq!(v["ok"], false, "{v}");
        v["error"].as_str().unwrap().to_string()
    };
    assert!(err(3).contains("out of window: pod b1 holds"), "{}", err(3));
    assert_eq!(
        err(4),
        "address 0x7fff000000: not assigned to any pod in the directory"
    );
    assert!(
        err(5).contains("(+2 bytes): out of window: pod b1"),
        "{}",
        err(5)
    );
    assert!(
        err(6).contains("compare_and_swap needs an 8-byte aligned address (owner b1)"),
        "{}",
        err(6)
    );
    assert_eq!(
        answer(&a1, 2)["posted"],
        answer(&a1, 7)["posted"],
        "nothing was posted for them"
    );
}

#[test]
fn four_writers_on_two_vms_lose_no_fetch_add_and_a_cas_lock_keeps_records_whole() {
    let Some((a, b)) =
        runs("four_writers_on_two_vms_lose_no_fetch_add_and_a_cas_lock_keeps_records_whole")
    else {
        return;
    };
    let (a1, a2, b1, b2) = (
        answers(a, "a1"),
        answers(a, "a2"),
        answers(b, "b1"),
        answers(b, "b2"),
    );
    for (lines, n) in [(&a1, 11), (&a2, 2), (&b1, 4), (&b2, 2)] {
        assert_eq!(ok(answer(lines, n))["times"], 10_000);
    }
    // The owner's CPU sees exactly 40,000, and so does an RDMA read.
    assert_eq!(ok(answer(&b1, 7))["value"], 40_000);
    assert_eq!(ok(answer(&b1, 8))["value"], 40_000);
    eprintln!(
        "data_plane: 10,000 fetch_add took {:.0} / {:.0} / {:.0} / {:.0} ms (a1 a2 b1 b2)",
        answer(&a1, 11)["ms"].as_f64().unwrap_or(0.0),
        answer(&a2, 2)["ms"].as_f64().unwrap_or(0.0),
        answer(&b1, 4)["ms"].as_f64().unwrap_or(0.0),
        answer(&b2, 2)["ms"].as_f64().unwrap_or(0.0)
    );
    for (lines, n) in [(&a2, 4), (&b1, 9)] {
        let r = ok(answer(lines, n));
        assert_eq!(
            (r["rounds"].as_u64(), r["torn"].as_u64()),
            (Some(200), Some(0)),
            "{r}"
        );
    }
    for (lines, n) in [(&a1, 13), (&b2, 4)] {
        ok(answer(lines, n));
    }
}

#[test]
fn a_restarted_owner_is_reached_anew_and_never_through_the_old_connection() {
    let Some((a, b)) =
        runs("a_restarted_owner_is_reached_anew_and_never_through_the_old_connection")
    else {
        return;
    };
    let a1 = answers(a, "a1");
    // b2 told a1 once the old b1 had exited (the new b1 could not: a1's directory still names
    // the old b1, and a1 admits only the pods its directory names).
    ok(answer(&a1, 15));
    // With the directory still naming the old b1, the access fails (its queue pair and its
    // rendezvous are gone); nothing reaches the new pod.
    let stale = answer(&a1, 16);
    assert_eq!(stale["ok"], false, "{stale}");
    // The cause, not just the name: the old b1 is gone (its rendezvous refuses) or the transport
    // to it failed; never a success through the old connection.
    let error = stale["error"].as_str().unwrap();
    assert!(
        error.contains("owner b1 is gone") || error.contains("transport to owner b1"),
        "{stale}"
    );
    // The address accessed (b1+0x1000), not the window's base.
    let shown = error.split(':').next().unwrap();
    assert!(
        shown.starts_with("address 0x") && shown.ends_with("1000"),
        "{stale}"
    );
    eprintln!("data_plane: stale access: {}", stale["error"]);
    // Once the directory names the new b1, the next access connects to it.
    ok(answer(&a1, 19));
    ok(answer(&a1, 20));
    let stats = ok(answer(&a1, 22));
    assert!(stats["reconnects"].as_u64().unwrap() >= 1, "{stats}");
    let fresh = answers(b, "b1-new");
    assert_eq!(
        ok(answer(&fresh, 2))["match"],
        true,
        "the new b1 holds the write"
    );
    assert_eq!(
        ok(answer(&fresh, 3))["posted"],
        0,
        "the new b1 posted nothing: a1's write reached it with no verb of its own"
    );
}

#[test]
fn a_process_without_the_namespaces_key_is_refused_and_the_owner_logs_who_came() {
    let Some((a, b)) =
        runs("a_process_without_the_namespaces_key_is_refused_and_the_owner_logs_who_came")
    else {
        return;
    };
    // It knows a1's name, uid and window (all in the directory ConfigMap) and reaches the port.
    let out = a.section("intruder").output;
    assert!(
        out.contains("intruder with the other key: exit 1")
            && out.contains(r#"namespace "other" (this pod is in "default")"#),
        "another namespace's pod is refused on its namespace:\n{out}"
    );
    assert!(
        out.contains("intruder with the forged key: exit 1")
            && out.contains(
                r#"did not prove holding the fabric key of "dsm" in namespace "default""#
            ),
        "a forged key is caught before the intruder learns any rkey:\n{out}"
    );
    assert!(!out.contains("\"head\""), "{out}");
    // The owner says why on its side, naming where the attempt came from.
    let b2 = b.section("b2").output;
    let refusals: Vec<&str> = b2
        .lines()
        .filter(|l| l.contains("10.88.1.9") && l.contains("peer refused or failed"))
        .collect();
    // The intruder's two attempts come first (the crossing test's follow from the same address).
    assert!(refusals.len() >= 2, "{b2}");
    assert!(refusals[0].contains(r#"namespace "other""#), "{b2}");
    assert!(refusals[1].contains("turned this pod down"), "{b2}");
    // At its default log level, an owner records every peer it admitted: who, from where, which
    // window (the new b1 ran without ROCEFABRIC_LOG).
    let b1 = b.section("b1-new").output;
    let admitted = b1
        .lines()
        .find(|l| l.contains("peer admitted"))
        .unwrap_or_else(|| panic!("no admission logged:\n{b1}"));
    for field in [
        "namespace=default",
        "pod=a1",
        "uid=00000000-0000-4000-8000-0000000000a1",
        "from=10.88.1.2:",
        "window=b1",
    ] {
        assert!(admitted.contains(field), "{field} in {admitted}");
    }
}

#[test]
fn a_lock_whose_holder_was_killed_is_broken_after_the_lease_and_not_before() {
    let Some((a, _)) =
        runs("a_lock_whose_holder_was_killed_is_broken_after_the_lease_and_not_before")
    else {
        return;
    };
    let s = a.section("dead-holder");
    let out = &s.output;
    assert_eq!(s.rc, 0, "{out}");
    // The word the killed holder left (little-endian hex): its pod's uid hash over its epoch.
    let held = out
        .lines()
        .find_map(|l| l.strip_prefix("held: "))
        .unwrap_or_else(|| panic!("the holder never took the lock:\n{out}"));
    let bytes: Vec<u8> = (0..held.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&held[i..i + 2], 16).unwrap())
        .collect();
    let word = u64::from_le_bytes(bytes.try_into().unwrap());
    let broke = out
        .lines()
        .find(|l| l.contains("broke a lock held past its lease"))
        .unwrap_or_else(|| panic!("no lock broken:\n{out}"));
    assert!(
        broke.contains(&format!("holder={}", word >> 32))
            && broke.contains(&format!("epoch={}", word & 0xffff_ffff)),
        "the lock broken is the dead holder's: {held} vs {broke}"
    );
    let answer: Value = out
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v.get("n").is_some())
        })
        .unwrap_or_else(|| panic!("no answer:\n{out}"));
    ok(&answer);
    assert_eq!(answer["torn"], 0, "{answer}");
    // Never before the lease: a live holder's lock is never broken early.
    assert!(answer["ms"].as_f64().unwrap() >= 10_000.0, "{answer}");
}

#[test]
fn an_owner_frees_the_queue_pair_of_every_peer_that_left_a_killed_one_too() {
    let Some((_, b)) =
        runs("an_owner_frees_the_queue_pair_of_every_peer_that_left_a_killed_one_too")
    else {
        return;
    };
    // b2 ran at its default log level, which traces each peer's admission and departure.
    let log = b.section("b2").output;
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let (admitted, freed) = (count("peer admitted"), count("queue pair destroyed"));
    // a1, a2 and b1 in the session phase, then a1's probe and one-shot commands, the holder.
    assert!(admitted >= 5, "{admitted} admitted:\n{log}");
    // Every peer but the last (whose release ends b2's session) was freed while b2 ran.
    assert!(
        freed + 1 >= admitted,
        "{admitted} admitted, {freed} freed:\n{log}"
    );
    // The holder killed with -9 sent no goodbye: its closed stream freed its queue pair.
    assert!(
        log.lines()
            .any(|l| l.contains("queue pair destroyed") && l.contains("pod=a2")),
        "the killed holder's queue pair was not freed:\n{log}"
    );
}

#[test]
fn the_cli_moves_files_and_pipes_of_any_length_and_refuses_what_does_not_fit() {
    let Some((a, _)) =
        runs("the_cli_moves_files_and_pipes_of_any_length_and_refuses_what_does_not_fit")
    else {
        return;
    };
    let s = a.section("cli-data");
    assert_eq!(s.rc, 0, "{}", s.output);
    let out = &s.output;
    assert!(out.contains("file round trip: same"), "{out}");
    assert!(out.contains("stdin and stdout round trip: same"), "{out}");
    assert!(out.contains("too long: exit 1"), "{out}");
    assert!(
        out.contains("(+2093057 bytes): out of window: pod b2")
            && out.contains("longer than the 2093056 bytes"),
        "{out}"
    );
    // The start of `seq 1 70000`, as hex: "1\n2\n3\n".
    assert!(out.contains("310a320a330a"), "{out}");
}

#[test]
fn probe_figures_are_non_zero_and_within_3x_of_perftest() {
    let Some((a, _)) = runs("probe_figures_are_non_zero_and_within_3x_of_perftest") else {
        return;
    };
    // Per round: probe read p50 (us), probe write MiB/s, ib_read_lat typical (us), ib_write_bw
    // average MiB/s.
    let mut rounds = Vec::new();
    for r in 1..=PERF_ROUNDS {
        let probe = a.section(&format!("probe-{r}"));
        assert_eq!(probe.rc, 0, "{}", probe.output);
        let start = probe.output.find('[').expect("probe JSON");
        let rows: Value = serde_json::from_str(probe.output[start..].trim())
            .unwrap_or_else(|e| panic!("{e}: {}", probe.output));
        let row = &rows[0];
        assert_eq!(row["pod"], "b2");
        let f = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
        for k in [
            "readP50Us",
            "readP99Us",
            "readMibS",
            "writeP50Us",
            "writeP99Us",
            "writeMibS",
        ] {
            assert!(f(k) > 0.0, "{k} in {row}");
        }
        // A connected 8-byte access makes no heap allocation (the binary's allocator counts).
        assert_eq!(
            (f("readAllocsPerOp"), f("writeAllocsPerOp")),
            (0.0, 0.0),
            "{row}"
        );
        assert!(f("readP99Us") >= f("readP50Us"), "{row}");
        assert!(f("writeP99Us") >= f("writeP50Us"), "{row}");
        // ib_read_lat: #bytes #iterations t_min t_max t_typical ...; ib_write_bw: #bytes
        // #iterations BW peak BW average (MB/s = 10^6 bytes) MsgRate; the row holds what follows #bytes.
        let lat = perftest_row(a, &format!("read-lat-{r}"), "2");
        let bw = perftest_row(a, &format!("write-bw-{r}"), "65536");
        rounds.push([
            f("readP50Us"),
            f("writeMibS"),
            lat[3],
            bw[2] * 1e6 / (1 << 20) as f64,
        ]);
    }
    for (r, [p50, w, typical, perf_w]) in rounds.iter().enumerate() {
        eprintln!(
            "data_plane: round {}: probe read p50 {p50:.1} us vs ib_read_lat typical {typical:.1} us; \
             write {w:.1} MiB/s vs ib_write_bw {perf_w:.1} MiB/s",
            r + 1
        );
    }
    let best = |i: usize, lower_is_better: bool| {
        let it = rounds.iter().map(|x| x[i]);
        if lower_is_better {
            it.fold(f64::INFINITY, f64::min)
        } else {
            it.fold(0.0, f64::max)
        }
    };
    let (p50, w, typical, perf_w) = (best(0, true), best(1, false), best(2, true), best(3, false));
    let within = |x: f64, y: f64| x <= 3.0 * y && y <= 3.0 * x;
    assert!(
        within(p50, typical),
        "best read p50 {p50:.1} us vs best ib_read_lat typical {typical:.1} us, rounds {rounds:?}"
    );
    assert!(
        within(w, perf_w),
        "best write {w:.1} MiB/s vs best ib_write_bw {perf_w:.1} MiB/s, rounds {rounds:?}"
    );
}
