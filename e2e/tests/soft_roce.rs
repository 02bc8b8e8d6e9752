//! The node daemon on a real RDMA stack: Debian's kernel with Soft-RoCE (`rdma_rxe`) booted under
//! qemu (`e2e/vm/`), the project's binaries inside. One VM runs discovery, `serve` against the
//! kubelet emulator (allocation, a container-like mount namespace, link health) and `qos` on the
//! rxe parent; two VMs on one emulated wire run perftest between them and compare the counters
//! the agent exports with `rdma statistic`.
//!
//! Without qemu (or when the image cannot be built) every test prints `SKIPPED: soft_roce
//! (<reason>): <test>`; `ROCEFABRIC_REQUIRE_SOFT_ROCE=1` (set by `.ci/run`) makes that a failure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use rocefabric_e2e::node::daemon_binary;
use rocefabric_e2e::skip;
use rocefabric_e2e::vm::{self, Guest, Run, SHELL_PRELUDE};
use serde_json::Value;

/// Bound of one VM run; a healthy run takes well under a minute.
const VM_TIMEOUT: Duration = Duration::from_secs(240);
/// The MAC of the single VM's eth0, hence rxe0's node GUID and device ID.
const NODE_MAC: &str = "52:54:00:12:34:56";
const NODE_RXE_ID: &str = "virtual-505400fffe123456";

/// Shell functions this suite's scenarios add to [`SHELL_PRELUDE`].
const PRELUDE: &str = r#"
export RUST_LOG=warn
uptime_s() { cut -d' ' -f1 /proc/uptime; }
gids() {
  p=/sys/class/infiniband/rxe0/ports/1
  for i in 0 1 2 3 4 5 6 7; do
    echo "$i $(cat $p/gids/$i) $(tr ' ' _ <$p/gid_attrs/types/$i 2>/dev/null) $(cat $p/gid_attrs/ndevs/$i 2>/dev/null)"
  done
}
"#;

/// The single node: discovery, serve, a container's view of the granted devices, QoS.
const NODE_SCENARIO: &str = r#"
section boot uptime_s
section rxe rxe_up 10.0.2.15/24 || exit 10
section gids gids
section node-guid cat /sys/class/infiniband/rxe0/node_guid
section dmesg-boot dmesg
section uverbs sh -c 'for u in /sys/class/infiniband_verbs/uverbs*; do echo "${u##*/} $(cat $u/ibdev)"; done'
section discover $B/rocefabric-device-plugin discover --output json

# serve CONFIG EMULATOR-ARGS...: the daemon and the kubelet emulator on a fresh plugin dir.
serve() {
  cfg=$1; shift
  rm -rf /run/dp && mkdir -p /run/dp
  $B/rocefabric-device-plugin serve --config "$cfg" --plugin-dir /run/dp 2>/tmp/serve.log &
  pid=$!
  $B/rocefabric-kubelet-emulator --plugin-dir /run/dp --timeout-secs 60 "$@"
  rc=$?
  kill $pid; wait $pid
  [ $rc = 0 ] || cat /tmp/serve.log
  return $rc
}
printf 'pollInterval: 100ms\n' >/tmp/default.yaml
printf 'pollInterval: 100ms\nsoftRoce: include\ntrafficClass: 106\n' >/tmp/include.yaml
section serve-default serve /tmp/default.yaml
section serve-include serve /tmp/include.yaml --allocate-to /tmp/granted --flap eth0
i=0; until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; do i=$((i+1)); [ $i -gt 100 ] && break; sleep 0.1; done

# A container's /dev/infiniband: exactly the granted nodes (mknod'ed as a runtime does), or none.
while read host ctr perms; do
  case $ctr in /dev/infiniband/*) echo "$ctr $(/usr/bin/stat -c '%t %T' "$host")" ;; esac
done </tmp/granted >/tmp/nodes
container() {
  unshare -m sh -c '
    mount -t tmpfs tmpfs /dev/infiniband || exit 90
    while read ctr major minor; do mknod "$ctr" c $((0x$major)) $((0x$minor)) || exit 91; done <"$1"
    ls -1 /dev/infiniband
    ibv_devinfo -d rxe0' container "$1"
}
: >/tmp/nothing
section container-granted container /tmp/nodes
section container-nothing container /tmp/nothing

# QoS on the rxe parent.
section mtu-before sh -c 'cat /sys/class/net/eth0/mtu; ibv_devinfo -d rxe0 | grep active_mtu'
printf 'mtu: 4200\n' >/tmp/qos.yaml
section qos-apply $B/rocefabric-device-plugin qos apply --netdev eth0 --config /tmp/qos.yaml --output json
section qos-show $B/rocefabric-device-plugin qos show --netdev eth0 --output json
section roce-tos cat /sys/kernel/config/rdma_cm/rxe0/ports/1/default_roce_tos
section roce-mode cat /sys/kernel/config/rdma_cm/rxe0/ports/1/default_roce_mode
section mtu-after sh -c 'cat /sys/class/net/eth0/mtu; ibv_devinfo -d rxe0 | grep active_mtu'
section dmesg dmesg
exit 0
"#;

/// One end of the wire: rxe0 on 10.77.0.<n>, perftest as server (`a`) or client (`b`) on the
/// GID index discovery reports, then the counters as the agent exports them and as
/// `rdma statistic` prints them.
fn wire_scenario(server: bool) -> String {
    let (addr, perf) = if server {
        (
            "10.77.0.1/24",
            r#"ib_write_bw -d rxe0 -x "$gid" -n 500 -s 65536 -F"#,
        )
    } else {
        (
            "10.77.0.2/24",
            // The server may still be booting: retry until it answers.
            r#"i=0; until ib_write_bw -d rxe0 -x "$gid" -n 500 -s 65536 -F 10.77.0.1; do i=$((i+1)); [ $i -gt 60 ] && exit 1; sleep 1; done"#,
        )
    };
    format!(
        r#"
section rxe rxe_up {addr} || exit 10
section gids gids
$B/rocefabric-device-plugin discover --output json >/tmp/discover.json
gid=$(sed -n 's/.*"roceV2GidIndex": *\([0-9]*\).*/\1/p' /tmp/discover.json | head -1)
section gid-index echo "$gid"
[ -n "$gid" ] || exit 11
export gid
section perf timeout 180 sh -c '{perf}'
sleep 1
section counters $B/rocefabric-device-plugin qos counters --netdev eth0
section rdma-stat /usr/sbin/rdma statistic show link rxe0/1
section dmesg dmesg
exit 0
"#
    )
}

fn binaries() -> Result<Vec<PathBuf>, String> {
    Ok(vec![
        daemon_binary()?,
        PathBuf::from(env!("CARGO_BIN_EXE_rocefabric-kubelet-emulator")),
    ])
}

/// The single VM's run, booted once for every test that reads it.
fn node_run(test: &str) -> Option<&'static Run> {
    static RUN: OnceLock<Result<Run, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        let image = vm::image()?;
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let _one_set_at_a_time = vm::exclusive();
        let mut guest = Guest::new(
            "node",
            &format!("{SHELL_PRELUDE}{PRELUDE}{NODE_SCENARIO}"),
            binaries()?,
        );
        guest.mac = NODE_MAC.into();
        let run = guest.start(&image, work.path())?.wait(VM_TIMEOUT);
        eprintln!("soft_roce: node VM ran {:.1} s", run.elapsed.as_secs_f64());
        Ok(run)
    });
    available(run, test)
}

/// The two VMs on one wire (server `a`, client `b`).
fn wire_runs(test: &str) -> Option<&'static (Run, Run)> {
    static RUNS: OnceLock<Result<(Run, Run), String>> = OnceLock::new();
    let runs = RUNS.get_or_init(|| {
        let image = vm::image()?;
        let bins = binaries()?;
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let _one_set_at_a_time = vm::exclusive();
        let end = |name: &str, server: bool, mac: &str| {
            let mut g = Guest::new(
                name,
                &format!("{SHELL_PRELUDE}{PRELUDE}{}", wire_scenario(server)),
                bins.clone(),
            );
            g.mac = mac.into();
            g.cpus = 1;
            g
        };
        let (a, b) = vm::run_pair(
            end("a", true, "52:54:00:00:00:0a"),
            end("b", false, "52:54:00:00:00:0b"),
            &image,
            work.path(),
            VM_TIMEOUT,
        )?;
        eprintln!(
            "soft_roce: wire VMs ran {:.1} s / {:.1} s",
            a.elapsed.as_secs_f64(),
            b.elapsed.as_secs_f64()
        );
        Ok((a, b))
    });
    available(runs, test)
}

fn available<T>(result: &'static Result<T, String>, test: &str) -> Option<&'static T> {
    match result {
        Ok(run) => Some(run),
        Err(reason) if vm::required() => {
            panic!(
                "{} is set but the Soft-RoCE VM cannot run: {reason}",
                vm::REQUIRE_ENV
            )
        }
        Err(reason) => {
            skip("soft_roce", reason, test);
            None
        }
    }
}

/// `gids` section lines: index -> (GID, type, netdev).
fn gid_table(run: &Run) -> BTreeMap<u32, (String, String, String)> {
    run.section("gids")
        .output
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [i, gid, kind, ndev] => Some((
                    i.parse().ok()?,
                    (gid.to_string(), kind.to_string(), ndev.to_string()),
                )),
                _ => None,
            }
        })
        .collect()
}

/// The index whose GID is the IPv4-mapped `hex` (`0a00:020f`) RoCE v2 entry on eth0.
fn ipv4_gid_index(run: &Run, hex: &str) -> u32 {
    let table = gid_table(run);
    let want = format!("0000:0000:0000:0000:0000:ffff:{hex}");
    table
        .iter()
        .find(|(_, (gid, kind, ndev))| *gid == want && kind == "RoCE_v2" && ndev == "eth0")
        .map(|(i, _)| *i)
        .unwrap_or_else(|| panic!("no RoCE v2 GID {want} in {table:?}"))
}

fn ok(run: &Run, name: &str) -> String {
    let s = run.section(name);
    assert_eq!(
        s.rc, 0,
        "VM {}: section {name} failed:\n{}",
        run.name, s.output
    );
    s.output
}

#[test]
fn discovery_reports_the_rxe_device_with_its_real_gid_index() {
    let Some(run) = node_run("discovery_reports_the_rxe_device_with_its_real_gid_index") else {
        return;
    };
    let boot: f64 = ok(run, "boot").trim().parse().unwrap();
    eprintln!("soft_roce: guest uptime at the scenario's start {boot:.2} s");
    ok(run, "rxe");
    let report = json_document(&ok(run, "discover"));
    let hcas = report["hcas"].as_array().expect("hcas");
    assert_eq!(hcas.len(), 1, "{report:#}");
    let h = &hcas[0];
    let guid = ok(run, "node-guid").trim().replace(':', "");
    assert_eq!(h["id"], format!("virtual-{guid}"));
    assert_eq!(
        h["id"], NODE_RXE_ID,
        "node GUID is eth0's MAC in EUI-64 form"
    );
    assert_eq!(h["name"], "rxe0");
    assert_eq!(h["virtual"], true);
    assert_eq!(h["netdev"], "eth0");
    assert_eq!(h["state"], "ACTIVE");
    assert_eq!(h["health"], "Healthy");
    assert!(h["pciAddress"].is_null() && h["numaNode"].is_null(), "{h}");
    assert_eq!(h["devicePath"], "/devices/virtual/infiniband/rxe0");
    assert_eq!(h["roceV2GidIndex"], ipv4_gid_index(run, "0a00:020f"));
    let uverbs = ok(run, "uverbs");
    assert!(
        uverbs
            .lines()
            .any(|l| l.trim() == format!("{} rxe0", h["uverbs"].as_str().unwrap())),
        "{uverbs}"
    );
}

#[test]
fn serve_advertises_the_soft_device_only_when_included() {
    let Some(run) = node_run("serve_advertises_the_soft_device_only_when_included") else {
        return;
    };
    let listed = |section: &str| -> Vec<Value> {
        let lines = run.json_lines(section);
        let l = lines
            .iter()
            .find(|l| l["event"] == "listed")
            .unwrap_or_else(|| panic!("{section}: {lines:?}"));
        l["devices"].as_array().unwrap().clone()
    };
    ok(run, "serve-default");
    assert!(
        listed("serve-default").is_empty(),
        "softRoce defaults to exclude"
    );
    ok(run, "serve-include");
    let devices = listed("serve-include");
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["id"], NODE_RXE_ID);
    assert_eq!(devices[0]["health"], "Healthy");
    assert_eq!(
        devices[0]["numaNodes"],
        serde_json::json!([]),
        "NUMA unknown: no topology"
    );
}

#[test]
fn allocate_hands_out_the_real_uverbs_node_and_gid_index() {
    let Some(run) = node_run("allocate_hands_out_the_real_uverbs_node_and_gid_index") else {
        return;
    };
    ok(run, "serve-include");
    let lines = run.json_lines("serve-include");
    let a = lines
        .iter()
        .find(|l| l["event"] == "allocated")
        .expect("allocated");
    let uverbs = ok(run, "uverbs");
    let node = uverbs
        .lines()
        .find_map(|l| l.trim().strip_suffix(" rxe0"))
        .expect("rxe0's uverbs");
    let hosts: Vec<&str> = a["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["hostPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        hosts,
        [
            format!("/dev/infiniband/{node}").as_str(),
            "/dev/infiniband/rdma_cm"
        ]
    );
    let gid = ipv4_gid_index(run, "0a00:020f").to_string();
    assert_eq!(a["envs"]["NCCL_IB_HCA"], "=rxe0:1");
    assert_eq!(a["envs"]["NCCL_IB_GID_INDEX"], gid.as_str());
    assert_eq!(a["envs"]["NCCL_IB_TC"], "106");
    assert!(a["envs"].get("PCIDEVICE_RDMA_HCA").is_none(), "{a}");
}

#[test]
fn only_a_container_granted_the_device_can_open_it() {
    let Some(run) = node_run("only_a_container_granted_the_device_can_open_it") else {
        return;
    };
    let granted = ok(run, "container-granted");
    assert!(granted.contains("PORT_ACTIVE"), "{granted}");
    let listed: Vec<&str> = granted
        .lines()
        .take_while(|l| !l.contains("hca_id"))
        .map(str::trim)
        .collect();
    assert!(
        listed.contains(&"rdma_cm") && listed.iter().any(|l| l.starts_with("uverbs")),
        "{granted}"
    );
    let nothing = run.section("container-nothing");
    assert_ne!(
        nothing.rc, 0,
        "opened rxe0 without its device node:\n{}",
        nothing.output
    );
    assert!(
        ![90, 91].contains(&nothing.rc),
        "the namespace was not set up:\n{}",
        nothing.output
    );
    assert!(
        !nothing.output.contains("uverbs"),
        "an empty /dev/infiniband: {}",
        nothing.output
    );
    // libibverbs lists only the devices whose uverbs node it finds under /dev/infiniband.
    assert!(
        nothing.output.contains("IB device 'rxe0' wasn't found"),
        "{}",
        nothing.output
    );
    assert!(
        !nothing.output.contains("PORT_ACTIVE"),
        "{}",
        nothing.output
    );
}

#[test]
fn link_down_and_up_of_the_parent_reach_list_and_watch() {
    let Some(run) = node_run("link_down_and_up_of_the_parent_reach_list_and_watch") else {
        return;
    };
    ok(run, "serve-include");
    let lines = run.json_lines("serve-include");
    for event in ["unhealthy", "healthy"] {
        let e = lines
            .iter()
            .find(|l| l["event"] == event)
            .unwrap_or_else(|| panic!("no {event}: {lines:?}"));
        eprintln!(
            "soft_roce: {event} seen {} ms after ip link set",
            e["afterMs"]
        );
    }
}

/// The JSON document in a section's output (stderr's lines around it are not JSON).
fn json_document(output: &str) -> Value {
    let start = output.find('{').unwrap_or(0);
    let end = output.rfind('}').map_or(output.len(), |e| e + 1);
    serde_json::from_str(&output[start..end]).unwrap_or_else(|e| panic!("{e}: {output}"))
}

fn knob<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["knobs"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["knob"] == name))
        .unwrap_or_else(|| panic!("no knob {name} in {report:#}"))
}

#[test]
fn qos_on_the_rxe_parent_sets_roce_tos_mode_and_mtu_and_says_what_is_unsupported() {
    let Some(run) =
        node_run("qos_on_the_rxe_parent_sets_roce_tos_mode_and_mtu_and_says_what_is_unsupported")
    else {
        return;
    };
    let before = ok(run, "mtu-before");
    assert!(
        before.contains("1500") && before.contains("1024"),
        "{before}"
    );
    let apply = run.section("qos-apply");
    assert_ne!(
        apply.rc, 0,
        "virtio-net has no DCB, so not everything holds"
    );
    let report = json_document(&apply.output);
    assert_eq!(report["rdmaDevice"], "rxe0", "{report:#}");
    for name in ["roceTos", "roceMode", "mtu"] {
        let k = knob(&report, name);
        assert!(
            k["outcome"] == "Applied" || k["outcome"] == "AlreadyCorrect",
            "{k}"
        );
    }
    assert_eq!(knob(&report, "roceTos")["mechanism"], "Configfs");
    for name in ["trust", "pfc", "dscpMap"] {
        assert_eq!(knob(&report, name)["outcome"], "Unsupported", "{report:#}");
    }
    let tos = ok(run, "roce-tos");
    assert_eq!(
        Some(tos.trim()),
        knob(&report, "roceTos")["desired"].as_str(),
        "{report:#}"
    );
    assert_eq!(ok(run, "roce-mode").trim(), "RoCE v2");
    let after = ok(run, "mtu-after");
    assert!(
        after.contains("4200") && after.contains("4096"),
        "RoCE active MTU follows: {after}"
    );
    let show = json_document(&ok(run, "qos-show"));
    assert_eq!(show["rdmaDevice"], "rxe0", "{show:#}");
}

/// `rdma statistic show link rxe0/1` as `{name: value}`.
fn rdma_statistic(run: &Run) -> BTreeMap<String, u64> {
    let text = ok(run, "rdma-stat");
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter_map(|w| Some((w[0].to_string(), w[1].parse().ok()?)))
        .collect()
}

/// A metric of `qos counters` (labels ignored: one interface).
fn metric(run: &Run, name: &str) -> u64 {
    let text = ok(run, "counters");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn counters_after_traffic_between_two_vms_match_rdma_statistic() {
    let Some((a, b)) = wire_runs("counters_after_traffic_between_two_vms_match_rdma_statistic")
    else {
        return;
    };
    for (run, ip) in [(a, "0a4d:0001"), (b, "0a4d:0002")] {
        let gid: u32 = ok(run, "gid-index").trim().parse().unwrap();
        assert_eq!(
            gid,
            ipv4_gid_index(run, ip),
            "perftest ran on the index discovery chose"
        );
        let perf = ok(run, "perf");
        assert!(perf.contains("BW average"), "{perf}");
        let stat = rdma_statistic(run);
        let sent = metric(run, "rocefabric_rdma_sent_packets_total");
        let received = metric(run, "rocefabric_rdma_received_packets_total");
        assert!(
            sent > 0 && received > 0,
            "VM {}: {sent} / {received}",
            run.name
        );
        assert_eq!(
            Some(&sent),
            stat.get("sent_pkts"),
            "VM {}: {stat:?}",
            run.name
        );
        assert_eq!(
            Some(&received),
            stat.get("rcvd_pkts"),
            "VM {}: {stat:?}",
            run.name
        );
        for (m, s) in [
            (
                "rocefabric_rdma_duplicate_requests_total",
                "duplicate_request",
            ),
            (
                "rocefabric_rdma_completer_retries_total",
                "completer_retry_err",
            ),
        ] {
            assert_eq!(Some(&metric(run, m)), stat.get(s), "VM {}: {m}", run.name);
        }
    }
    // The wire is lossless: what one side sent, the other received.
    assert_eq!(
        metric(a, "rocefabric_rdma_sent_packets_total"),
        metric(b, "rocefabric_rdma_received_packets_total")
    );
    assert_eq!(
        metric(b, "rocefabric_rdma_sent_packets_total"),
        metric(a, "rocefabric_rdma_received_packets_total")
    );
}
