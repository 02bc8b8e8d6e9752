//! Apply over fixture trees laid out like the kernel's: a DGX H100-like sysfs (from
//! [`rocefabric_node_testing::fixtures`]) with the out-of-tree driver's `ecn/` and `qos/` files, or the upstream
//! debugfs `cc_params`, or neither; plus rdma_cm configfs. DCB and MTU go to in-memory devices.
//! Every test snapshots the trees (contents and mtimes) to assert exactly what was written.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rocefabric_api::{Knob, KnobOutcome, KnobStatus, Mechanism, QosSpec};

use super::apply::tests::{FakeDcb, FakeLink, apply_fake};
use super::apply::{Kernel, dry_run};
use super::driver_files::{NetdevFiles, Roots};
use super::plan::Desired;
use rocefabric_node_testing::fixtures::FixtureNode;

const NETDEV: &str = "enp24s0np0";
const IBDEV: &str = "mlx5_0";
const BDF: &str = "0000:18:00.0";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    OutOfTree,
    Upstream,
    Neither,
}

pub(crate) struct Tree {
    _dir: tempfile::TempDir,
    pub(crate) roots: Roots,
}

fn put(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

/// The DGX H100 fixture cut down to the first compute rail's ConnectX-7 with short
/// GID tables: the same layout as the kernel's, a few hundred files instead of thousands.
/// `node` written to a temp dir, with QoS roots whose sysfs is that tree.
pub(crate) fn written_roots(node: &FixtureNode) -> (tempfile::TempDir, Roots) {
    let dir = rocefabric_node_testing::fixtures::tempdir().expect("temp dir");
    node.write_to(dir.path()).expect("fixture");
    let roots = Roots {
        sysfs: dir.path().to_path_buf(),
        ..Roots::default()
    };
    (dir, roots)
}

pub(crate) fn small_node() -> FixtureNode {
    let mut node = FixtureNode::dgx_h100();
    node.functions.retain(|f| f.address == BDF);
    node.gid_table_len = 8;
    node
}

/// A small DGX-like fixture plus the driver files of `flavour`. `rdma_cm_entry`: whether
/// `rdma_cm/mlx5_0` exists already (with its port attributes, as the kernel creates them).
pub(crate) fn tree(flavour: Flavour, rdma_cm_entry: bool) -> Tree {
    let dir = tempfile::tempdir().expect("tempdir");
    let roots = Roots {
        sysfs: dir.path().join("sys"),
        debugfs: dir.path().join("debug"),
        configfs: dir.path().join("config"),
    };
    small_node().write_to(&roots.sysfs).expect("fixture");
    let net = roots.sysfs.join("class/net").join(NETDEV);
    match flavour {
        Flavour::OutOfTree => {
            for point in ["roce_np", "roce_rp"] {
                for p in 0..8 {
                    // The driver's default: ECN on every priority.
                    put(&net.join(format!("ecn/{point}/enable/{p}")), "1\n");
                }
            }
            put(&net.join("ecn/roce_np/cnp_dscp"), "48\n");
            put(&net.join("ecn/roce_np/cnp_802p_prio"), "7\n");
            put(&net.join("ecn/roce_np/min_time_between_cnps"), "4\n");
            put(&net.join("qos/trust"), "pcp\n");
        }
        Flavour::Upstream => {
            let cc = roots.debugfs.join("mlx5").join(BDF).join("cc_params");
            put(&cc.join("np_cnp_dscp"), "0\n");
            put(&cc.join("np_cnp_prio"), "0\n");
            put(&cc.join("np_min_time_between_cnps"), "4\n");
            put(&cc.join("rp_clamp_tgt_rate"), "0\n");
        }
        Flavour::Neither => {}
    }
    if flavour != Flavour::Neither {
        fs::create_dir_all(roots.configfs.join("rdma_cm")).expect("configfs");
        if rdma_cm_entry {
            let port = roots.configfs.join("rdma_cm").join(IBDEV).join("ports/1");
            put(&port.join("default_roce_tos"), "0\n");
            put(&port.join("default_roce_mode"), "IB/RoCE v1\n");
        }
    }
    Tree { _dir: dir, roots }
}

/// Every regular file under the three roots (symlinks are not followed): contents and mtime.
pub(crate) fn snapshot(roots: &Roots) -> BTreeMap<PathBuf, (String, SystemTime)> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (String, SystemTime)>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(meta) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                walk(&e.path(), out);
            } else if meta.is_file() {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                out.insert(e.path(), (text, meta.modified().expect("mtime")));
            }
        }
    }
    let mut out = BTreeMap::new();
    for r in [&roots.sysfs, &roots.debugfs, &roots.configfs] {
        walk(r, &mut out);
    }
    out
}

/// Files whose contents or mtime changed, relative to `base`, with their new contents.
fn changed(
    before: &BTreeMap<PathBuf, (String, SystemTime)>,
    after: &BTreeMap<PathBuf, (String, SystemTime)>,
    base: &Path,
) -> BTreeMap<String, String> {
    after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, (text, _))| {
            (
                p.strip_prefix(base).unwrap_or(p).display().to_string(),
                text.clone(),
            )
        })
        .collect()
}

fn knob(knobs: &[KnobStatus], k: Knob) -> &KnobStatus {
    knobs.iter().find(|s| s.knob == k).expect("knob reported")
}

fn files(t: &Tree) -> NetdevFiles {
    let f = NetdevFiles::resolve(&t.roots, NETDEV);
    assert_eq!(f.pci_address.as_deref(), Some(BDF));
    assert_eq!(
        f.rdma.as_ref().map(|r| (r.device.as_str(), r.port)),
        Some((IBDEV, 1))
    );
    f
}

/// The real sysfs `device` link is below `devices/`: the path a write lands on.
fn real_net_dir(t: &Tree) -> PathBuf {
    fs::canonicalize(t.roots.sysfs.join("class/net").join(NETDEV)).expect("netdev dir")
}

#[test]
fn out_of_tree_flavour_writes_exactly_what_differs_then_nothing() {
    let t = tree(Flavour::OutOfTree, true);
    let f = files(&t);
    let desired = Desired::from_spec(&QosSpec::default());
    let mut dcb = FakeDcb::mlx5();
    let mut link = FakeLink::with_mtu(1500);
    let before = snapshot(&t.roots);
    let out = apply_fake(&mut dcb, &mut link, &f, &desired);
    let after = snapshot(&t.roots);

    let net = real_net_dir(&t);
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for point in ["roce_np", "roce_rp"] {
        for p in [0, 1, 2, 4, 5, 6, 7] {
            expected.insert(
                net.join(format!("ecn/{point}/enable/{p}"))
                    .display()
                    .to_string(),
                "0\n".into(),
            );
        }
    }
    expected.insert(
        net.join("ecn/roce_np/cnp_802p_prio").display().to_string(),
        "6\n".into(),
    );
    expected.insert(net.join("qos/trust").display().to_string(), "dscp\n".into());
    let cm = t.roots.configfs.join("rdma_cm").join(IBDEV).join("ports/1");
    expected.insert(
        cm.join("default_roce_tos").display().to_string(),
        "106\n".into(),
    );
    expected.insert(
        cm.join("default_roce_mode").display().to_string(),
        "RoCE v2\n".into(),
    );
    assert_eq!(
        changed(&before, &after, Path::new("")),
        expected,
        "exactly the differing files are written"
    );

    for k in [
        Knob::EcnNotificationPoint,
        Knob::EcnReactionPoint,
        Knob::CnpPriority,
        Knob::Trust,
    ] {
        let s = knob(&out.knobs, k);
        assert_eq!(
            (s.outcome, s.mechanism),
            (KnobOutcome::Applied, Some(Mechanism::Sysfs)),
            "{k:?}: {s:?}"
        );
    }
    let cnp = knob(&out.knobs, Knob::CnpDscp);
    assert_eq!(
        (cnp.outcome, cnp.mechanism),
        (KnobOutcome::AlreadyCorrect, Some(Mechanism::Sysfs))
    );
    for k in [Knob::RoceTos, Knob::RoceMode] {
        assert_eq!(knob(&out.knobs, k).mechanism, Some(Mechanism::Configfs));
        assert_eq!(knob(&out.knobs, k).outcome, KnobOutcome::Applied);
    }
    assert_eq!(knob(&out.knobs, Knob::Pfc).outcome, KnobOutcome::Applied);
    assert!(out.holds(), "{:#?}", out.knobs);
    let status = out.interface_status(&f, Some("ACTIVE".into()));
    assert_eq!(status.ecn_priorities, Some(vec![3]));
    assert_eq!(status.roce_tos, Some(106));
    assert_eq!(status.rdma_device.as_deref(), Some(IBDEV));

    // Second pass: everything holds, nothing is written anywhere.
    let (pfc_writes, app_writes) = (dcb.pfc_writes, dcb.app_writes);
    let out = apply_fake(&mut dcb, &mut link, &f, &desired);
    assert_eq!(
        snapshot(&t.roots),
        after,
        "already correct: no file touched"
    );
    assert_eq!(
        (dcb.pfc_writes, dcb.app_writes, link.writes),
        (pfc_writes, app_writes, 1)
    );
    assert!(
        out.knobs
            .iter()
            .all(|k| k.outcome == KnobOutcome::AlreadyCorrect),
        "{:#?}",
        out.knobs
    );
}

#[test]
fn upstream_flavour_sets_cnp_through_debugfs_and_has_no_ecn_enable() {
    let t = tree(Flavour::Upstream, true);
    let f = files(&t);
    let desired = Desired::from_spec(&QosSpec::default());
    let mut dcb = FakeDcb::mlx5();
    let mut link = FakeLink::with_mtu(4200);
    let before = snapshot(&t.roots);
    let out = apply_fake(&mut dcb, &mut link, &f, &desired);
    let diff = changed(&before, &snapshot(&t.roots), &t.roots.debugfs);
    let cc = format!("mlx5/{BDF}/cc_params");
    let debug_changes: BTreeMap<String, String> = diff
        .into_iter()
        .filter(|(p, _)| p.starts_with("mlx5"))
        .collect();
    assert_eq!(
        debug_changes,
        BTreeMap::from([
            (format!("{cc}/np_cnp_dscp"), "48\n".to_string()),
            (format!("{cc}/np_cnp_prio"), "6\n".to_string())
        ]),
        "only the two CNP parameters, other cc_params untouched"
    );
    for k in [Knob::CnpDscp, Knob::CnpPriority] {
        let s = knob(&out.knobs, k);
        assert_eq!(
            (s.outcome, s.mechanism),
            (KnobOutcome::Applied, Some(Mechanism::Debugfs)),
            "{k:?}"
        );
    }
    for k in [Knob::EcnNotificationPoint, Knob::EcnReactionPoint] {
        let s = knob(&out.knobs, k);
        assert_eq!(s.outcome, KnobOutcome::Unsupported);
        assert!(
            s.error
                .as_deref()
                .unwrap_or_default()
                .contains("out-of-tree"),
            "{s:?}"
        );
    }
    // No qos/trust file: trust comes from the DCB APP table (mlx5 upstream semantics).
    let trust = knob(&out.knobs, Knob::Trust);
    assert_eq!(
        (trust.outcome, trust.mechanism),
        (KnobOutcome::Applied, Some(Mechanism::DcbNetlink))
    );
    assert_eq!(
        knob(&out.knobs, Knob::Mtu).outcome,
        KnobOutcome::AlreadyCorrect
    );
    assert!(!out.holds(), "ECN cannot be verified upstream");
}

#[test]
fn neither_flavour_reports_unsupported_and_writes_no_file() {
    let t = tree(Flavour::Neither, false);
    let f = files(&t);
    let desired = Desired::from_spec(&QosSpec::default());
    let mut dcb = FakeDcb::mlx5();
    let mut link = FakeLink::with_mtu(1500);
    let before = snapshot(&t.roots);
    let out = apply_fake(&mut dcb, &mut link, &f, &desired);
    assert_eq!(snapshot(&t.roots), before);
    for k in [
        Knob::EcnNotificationPoint,
        Knob::EcnReactionPoint,
        Knob::CnpDscp,
        Knob::CnpPriority,
        Knob::RoceTos,
        Knob::RoceMode,
    ] {
        let s = knob(&out.knobs, k);
        assert_eq!(s.outcome, KnobOutcome::Unsupported, "{k:?}");
        assert_eq!(s.mechanism, None);
        assert!(s.error.is_some());
    }
    assert!(
        knob(&out.knobs, Knob::CnpDscp)
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("cc_params/np_cnp_dscp")
    );
    assert!(
        knob(&out.knobs, Knob::RoceTos)
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("rdma_cm does not exist")
    );
    assert_eq!(knob(&out.knobs, Knob::Pfc).outcome, KnobOutcome::Applied);
    assert!(!out.applied().contains(&Knob::EcnNotificationPoint));
}

#[test]
fn dry_run_writes_nothing_in_any_flavour() {
    for flavour in [Flavour::OutOfTree, Flavour::Upstream, Flavour::Neither] {
        let t = tree(flavour, false);
        let f = files(&t);
        let desired = Desired::from_spec(&QosSpec {
            mtu: 9000,
            ..QosSpec::default()
        });
        let mut dcb = FakeDcb::mlx5();
        let mut link = FakeLink::with_mtu(1500);
        let before = snapshot(&t.roots);
        let (_, p) = dry_run(
            &mut Kernel {
                dcb: &mut dcb,
                link: &mut link,
            },
            &f,
            &desired,
        );
        assert_eq!(
            snapshot(&t.roots),
            before,
            "{flavour:?}: dry run touched a file"
        );
        assert!(
            !t.roots.configfs.join("rdma_cm").join(IBDEV).exists(),
            "{flavour:?}: dry run made the rdma_cm entry"
        );
        assert_eq!((dcb.pfc_writes, dcb.app_writes, link.writes), (0, 0, 0));
        assert!(
            !p.writes.is_empty(),
            "{flavour:?}: there was something to change"
        );
    }
}

#[test]
fn rdma_cm_entry_is_created_when_missing() {
    let t = tree(Flavour::Upstream, false);
    let f = files(&t);
    let desired = Desired::from_spec(&QosSpec::default());
    let mut dcb = FakeDcb::mlx5();
    let mut link = FakeLink::with_mtu(4200);
    let out = apply_fake(&mut dcb, &mut link, &f, &desired);
    let entry = t.roots.configfs.join("rdma_cm").join(IBDEV);
    assert!(entry.is_dir(), "mkdir rdma_cm/{IBDEV}");
    // A plain directory is not configfs: the kernel would have created ports/1/*; here the
    // attribute is missing, and the knob says so instead of claiming success.
    let tos = knob(&out.knobs, Knob::RoceTos);
    assert_eq!(tos.outcome, KnobOutcome::Failed);
    assert!(
        tos.error
            .as_deref()
            .unwrap_or_default()
            .contains("ports/1/default_roce_tos"),
        "{tos:?}"
    );
}
