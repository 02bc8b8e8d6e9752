//! `qos show` / `qos apply` against the real kernel, in network namespaces these tests create:
//! on a veth pair the MTU really changes (checked with `ip -j link`, which reads it over
//! rtnetlink), while DCB netlink answers EOPNOTSUPP, so PFC, the APP table and trust are reported
//! unsupported, as are ECN and the CNP settings (no driver files), and nothing else is claimed
//! as applied. Where namespaces cannot be created the tests say so and skip.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use rocefabric_node_testing::fixtures::FixtureNode;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rocefabric-device-plugin");

/// A network namespace with a veth pair, removed on drop (also when the test panics).
struct Netns {
    name: String,
}

impl Netns {
    /// `None` (after printing why) when namespaces cannot be created here.
    fn with_veth(test: &str, veth: &str) -> Option<Netns> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rfqos-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        match Command::new("ip").args(["netns", "add", &name]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                println!(
                    "SKIPPED {test}: cannot create a network namespace: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                return None;
            }
            Err(e) => {
                println!("SKIPPED {test}: cannot run `ip netns add`: {e}");
                return None;
            }
        }
        let ns = Netns { name };
        let out = ns.ip(&[
            "link", "add", veth, "type", "veth", "peer", "name", "rfpeer0",
        ]);
        assert!(
            out.status.success(),
            "ip link add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(ns)
    }

    fn ip(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap()
    }

    /// Run the binary inside the namespace (`ip netns exec` also mounts that namespace's /sys).
    fn run(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, BIN])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    }

    fn mtu(&self, dev: &str) -> u64 {
        let out = self.ip(&["-j", "link", "show", "dev", dev]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["mtu"].as_u64().unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn knob<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["knobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["knob"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

fn config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("qos.yaml");
    fs::write(&p, text).unwrap();
    p
}

#[test]
fn qos_apply_on_a_veth_changes_the_mtu_and_reports_the_rest_unsupported() {
    let Some(ns) = Netns::with_veth("qos_apply_on_a_veth", "veth0") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "mtu: 9000\n");
    assert_eq!(ns.mtu("veth0"), 1500);

    let out = ns.run(&[
        "qos",
        "apply",
        "--netdev",
        "veth0",
        "--config",
        cfg.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert!(
        !out.status.success(),
        "not everything holds: the exit status must say so"
    );
    let report = json(&out);
    assert_eq!(report["holds"], false);
    assert_eq!(report["netdev"], "veth0");

    assert_eq!(ns.mtu("veth0"), 9000, "the MTU really changed");
    let mtu = knob(&report, "mtu");
    assert_eq!(
        (&mtu["outcome"], &mtu["mechanism"], &mtu["observed"]),
        (&"Applied".into(), &"Rtnetlink".into(), &"9000".into())
    );
    assert_eq!(report["mtu"], 9000);

    for name in ["trust", "dscpMap", "pfc"] {
        let k = knob(&report, name);
        assert_eq!(k["outcome"], "Unsupported", "{k}");
        assert!(k["error"].as_str().unwrap().contains("EOPNOTSUPP"), "{k}");
    }
    for name in [
        "ecnNotificationPoint",
        "ecnReactionPoint",
        "cnpDscp",
        "cnpPriority",
        "roceTos",
        "roceMode",
    ] {
        assert_eq!(knob(&report, name)["outcome"], "Unsupported", "{name}");
    }
    let applied: Vec<&str> = report["knobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["outcome"] == "Applied" || k["outcome"] == "AlreadyCorrect")
        .map(|k| k["knob"].as_str().unwrap())
        .collect();
    assert_eq!(applied, ["mtu"], "nothing but the MTU is claimed");
    assert!(
        report.get("pfcPriorities").is_none(),
        "no PFC state is reported for a device without DCB"
    );
    assert_eq!(
        report["changes"],
        serde_json::json!(["rtnetlink mtu <- 9000"])
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not every knob holds on veth0"), "{stderr}");

    // Applying again writes nothing new: the MTU is already correct.
    let again = json(&ns.run(&[
        "qos",
        "apply",
        "--netdev",
        "veth0",
        "--config",
        cfg.to_str().unwrap(),
        "--output",
        "json",
    ]));
    assert_eq!(knob(&again, "mtu")["outcome"], "AlreadyCorrect");
    assert_eq!(again["changes"], serde_json::json!([]));
}

#[test]
fn qos_show_on_a_veth_says_dcb_is_not_supported() {
    let Some(ns) = Netns::with_veth("qos_show_on_a_veth", "veth0") else {
        return;
    };
    let out = ns.run(&["qos", "show", "--netdev", "veth0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DCB is not supported on veth0"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("mtu") && l.contains("1500")),
        "{text}"
    );

    let report = json(&ns.run(&["qos", "show", "--netdev", "veth0", "--output", "json"]));
    assert_eq!(report["dcb"]["supported"], false);
    assert!(
        report["dcb"]["error"]
            .as_str()
            .unwrap()
            .contains("EOPNOTSUPP")
    );
    assert_eq!(knob(&report, "mtu")["value"], 1500);
    assert_eq!(knob(&report, "pfc")["supported"], false);
    assert_eq!(report["pfcPauseFrames"], Value::Null);
}

#[test]
fn qos_apply_dry_run_on_a_veth_touches_nothing() {
    let Some(ns) = Netns::with_veth("qos_apply_dry_run_on_a_veth", "veth0") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "mtu: 9000\n");
    let out = ns.run(&[
        "qos",
        "apply",
        "--netdev",
        "veth0",
        "--config",
        cfg.to_str().unwrap(),
        "--dry-run",
        "--output",
        "json",
    ]);
    assert!(!out.status.success(), "something would change: non-zero");
    let report = json(&out);
    assert_eq!(report["dryRun"], true);
    assert_eq!(
        report["changes"],
        serde_json::json!(["rtnetlink mtu <- 9000"])
    );
    assert_eq!(knob(&report, "mtu")["action"], "change");
    assert_eq!(knob(&report, "pfc")["action"], "unsupported");
    assert_eq!(ns.mtu("veth0"), 1500, "dry run left the MTU alone");
}

#[test]
fn qos_errors_name_the_interface_or_the_field() {
    let Some(ns) = Netns::with_veth("qos_errors", "veth0") else {
        return;
    };
    let out = ns.run(&["qos", "show", "--netdev", "nope0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no network interface named \"nope0\""));
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "mtu: 100000\n");
    let out = ns.run(&[
        "qos",
        "apply",
        "--netdev",
        "veth0",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mtu") && err.contains("100000"), "{err}");
    assert_eq!(ns.mtu("veth0"), 1500, "an invalid config changes nothing");
}

/// Regular files under `root` (symlinks not followed) with contents and mtime.
fn snapshot(root: &Path) -> Vec<(PathBuf, String, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let meta = fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                out.push((
                    e.path(),
                    fs::read_to_string(e.path()).unwrap_or_default(),
                    meta.modified().unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// The binary end to end with the out-of-tree driver's files: a veth named like the fixture's
/// ConnectX netdev gives real netlink (MTU; DCB unsupported), the fixture gives the driver files.
#[test]
fn qos_apply_writes_fixture_driver_files_and_dry_run_does_not() {
    let Some(ns) = Netns::with_veth("qos_apply_fixture", "enp24s0np0") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys");
    let mut node = FixtureNode::dgx_h100();
    node.functions.retain(|f| f.address == "0000:18:00.0");
    node.gid_table_len = 4;
    node.write_to(&sys).unwrap();
    let net = sys.join("class/net/enp24s0np0");
    for point in ["roce_np", "roce_rp"] {
        fs::create_dir_all(net.join(format!("ecn/{point}/enable"))).unwrap();
        for p in 0..8 {
            fs::write(net.join(format!("ecn/{point}/enable/{p}")), "1\n").unwrap();
        }
    }
    fs::write(net.join("ecn/roce_np/cnp_dscp"), "0\n").unwrap();
    fs::write(net.join("ecn/roce_np/cnp_802p_prio"), "0\n").unwrap();
    let cfg = config(tmp.path(), "mtu: 4200\n");
    let roots = [
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--debugfs-root",
        "/nonexistent/debugfs",
        "--configfs-root",
        "/nonexistent/configfs",
    ];
    let apply = |extra: &[&str]| {
        let mut args = vec![
            "qos",
            "apply",
            "--netdev",
            "enp24s0np0",
            "--config",
            cfg.to_str().unwrap(),
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&roots);
        ns.run(&args)
    };

    let before = snapshot(&sys);
    let dry = json(&apply(&["--dry-run"]));
    assert_eq!(snapshot(&sys), before, "--dry-run wrote nothing");
    assert_eq!(ns.mtu("enp24s0np0"), 1500);
    let changes: Vec<&str> = dry["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        changes.contains(&"sysfs ecn/roce_np/enable/0 <- 0"),
        "{changes:?}"
    );
    assert!(
        changes.contains(&"sysfs ecn/roce_np/cnp_dscp <- 48"),
        "{changes:?}"
    );
    assert!(
        !changes.iter().any(|c| c.contains("enable/3")),
        "priority 3 already has ECN: {changes:?}"
    );

    let out = apply(&[]);
    let report = json(&out);
    assert!(
        !out.status.success(),
        "DCB is unsupported on the veth, so not everything holds"
    );
    let real = fs::canonicalize(&net).unwrap();
    for p in 0..8 {
        let want = if p == 3 { "1\n" } else { "0\n" };
        assert_eq!(
            fs::read_to_string(real.join(format!("ecn/roce_np/enable/{p}"))).unwrap(),
            want,
            "np {p}"
        );
        assert_eq!(
            fs::read_to_string(real.join(format!("ecn/roce_rp/enable/{p}"))).unwrap(),
            want,
            "rp {p}"
        );
    }
    assert_eq!(
        fs::read_to_string(real.join("ecn/roce_np/cnp_dscp")).unwrap(),
        "48\n"
    );
    assert_eq!(
        fs::read_to_string(real.join("ecn/roce_np/cnp_802p_prio")).unwrap(),
        "6\n"
    );
    for name in [
        "ecnNotificationPoint",
        "ecnReactionPoint",
        "cnpDscp",
        "cnpPriority",
    ] {
        let k = knob(&report, name);
        assert_eq!(
            (&k["outcome"], &k["mechanism"]),
            (&"Applied".into(), &"Sysfs".into()),
            "{k}"
        );
    }
    assert_eq!(knob(&report, "pfc")["outcome"], "Unsupported");
    assert_eq!(report["rdmaDevice"], "mlx5_0");
    assert_eq!(report["pciAddress"], "0000:18:00.0");
    assert_eq!(ns.mtu("enp24s0np0"), 4200);

    // Everything the files hold is correct now: a second apply rewrites none of them.
    let after = snapshot(&sys);
    let again = json(&apply(&[]));
    assert_eq!(snapshot(&sys), after, "already correct: no file written");
    assert_eq!(
        knob(&again, "ecnNotificationPoint")["outcome"],
        "AlreadyCorrect"
    );
}

/// Set in the copy of this test binary that runs inside the namespace.
const ETHTOOL_CHILD: &str = "ROCEFABRIC_ETHTOOL_NETNS_CHILD";
const ETHTOOL_CHILD_DONE: &str = "ethtool netns checks passed";

/// Driver statistics over the real `SIOCETHTOOL` ioctl. The ioctl answers for the caller's
/// network namespace, so this test re-runs itself (only this test) under `ip netns exec`, and the
/// copy inside does the reading: the veth's statistics include `peer_ifindex`, whose value is the
/// peer's ifindex; `lo` has no driver statistics; an unknown name is reported as such.
#[test]
fn driver_statistics_are_read_over_siocethtool_in_a_netns() {
    if std::env::var_os(ETHTOOL_CHILD).is_some() {
        ethtool_checks_inside_the_namespace();
        println!("{ETHTOOL_CHILD_DONE}");
        return;
    }
    let Some(ns) = Netns::with_veth("driver_statistics_over_siocethtool", "veth0") else {
        return;
    };
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "driver_statistics_are_read_over_siocethtool_in_a_netns",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ETHTOOL_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(ETHTOOL_CHILD_DONE),
        "inside the namespace:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ethtool_checks_inside_the_namespace() {
    use rocefabric_qos_agent::counters::FabricCounters;
    use rocefabric_qos_agent::driver_files::{NetdevFiles, Roots};
    use rocefabric_qos_agent::ethtool::{EthtoolError, driver_stats};

    let stats = driver_stats("veth0").unwrap();
    let peer_ifindex: u64 = fs::read_to_string("/sys/class/net/rfpeer0/ifindex")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        stats.iter().find(|(n, _)| n == "peer_ifindex"),
        Some(&("peer_ifindex".to_string(), peer_ifindex)),
        "{stats:?}"
    );
    assert!(stats.iter().all(|(n, _)| !n.is_empty() && n.len() <= 32));

    let err = driver_stats("lo").unwrap_err();
    assert!(
        matches!(&err, EthtoolError::NoDriverStats { netdev } if netdev == "lo"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("lo: no driver statistics"),
        "{err}"
    );

    let err = driver_stats("nope0").unwrap_err();
    assert!(
        matches!(&err, EthtoolError::NoSuchInterface { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"nope0\""), "{err}");

    // The scrape over the real ioctl: the veth has statistics but no pause counters, and no DCB,
    // so no pause family is exported (nothing invented).
    let tmp = tempfile::tempdir().unwrap();
    let roots = Roots {
        sysfs: tmp.path().into(),
        debugfs: tmp.path().join("debug"),
        configfs: tmp.path().join("config"),
    };
    let targets = std::sync::Arc::new(std::sync::RwLock::new(vec![NetdevFiles::known(
        &roots, "veth0", None, None,
    )]));
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(FabricCounters::new(targets, Box::new(|| None))));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(!text.contains("rocefabric_pfc_pause"), "{text}");
    assert!(!text.contains("rocefabric_pause_storm"), "{text}");
}
