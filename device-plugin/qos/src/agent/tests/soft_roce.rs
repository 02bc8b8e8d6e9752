//! QoS on a Soft-RoCE device, reported honestly: every knob it cannot hold is `Unsupported`
//! with its cause, and the fabric's `qos.lossySoftRoce` decides whether that blocks the node
//! (`Refuse`, the default) or is accepted on virtual devices only (`Accept`).

use std::fs;

use super::*;
use rocefabric_api::conditions::Desired as DesiredCondition;
use rocefabric_api::{Knob, KnobOutcome, KnobStatus, LossySoftRoce};
use rocefabric_node_testing::fixtures::FixtureNode;

fn knob(knob: Knob, outcome: KnobOutcome, error: Option<&str>) -> KnobStatus {
    KnobStatus {
        error: error.map(str::to_string),
        ..KnobStatus::new(knob, outcome)
    }
}

/// `eth0` with Soft-RoCE `rxe0`, as the VM suite measures it: no DCB, no ECN or CNP files; the
/// rdma_cm defaults applied; the MTU as given.
fn soft_roce(mtu: KnobOutcome, mtu_error: Option<&str>) -> InterfaceStatus {
    let no_dcb = Some("DCB is not supported on eth0: EOPNOTSUPP");
    let no_files = Some("no driver file");
    InterfaceStatus {
        netdev: "eth0".into(),
        rdma_device: Some("rxe0".into()),
        is_virtual: true,
        link_state: Some("ACTIVE".into()),
        knobs: vec![
            knob(Knob::Trust, KnobOutcome::Unsupported, no_dcb),
            knob(Knob::DscpMap, KnobOutcome::Unsupported, no_dcb),
            knob(Knob::Pfc, KnobOutcome::Unsupported, no_dcb),
            knob(
                Knob::EcnNotificationPoint,
                KnobOutcome::Unsupported,
                no_files,
            ),
            knob(Knob::EcnReactionPoint, KnobOutcome::Unsupported, no_files),
            knob(Knob::CnpDscp, KnobOutcome::Unsupported, no_files),
            knob(Knob::CnpPriority, KnobOutcome::Unsupported, no_files),
            knob(Knob::RoceTos, KnobOutcome::Applied, None),
            knob(Knob::RoceMode, KnobOutcome::AlreadyCorrect, None),
            knob(Knob::Mtu, mtu, mtu_error),
        ],
        ..Default::default()
    }
}

/// A ConnectX port whose PFC has the given outcome; every other knob holds.
fn connectx(pfc: KnobOutcome) -> InterfaceStatus {
    InterfaceStatus {
        netdev: "enp24s0np0".into(),
        rdma_device: Some("mlx5_0".into()),
        pci_address: Some("0000:18:00.0".into()),
        link_state: Some("ACTIVE".into()),
        knobs: vec![
            knob(Knob::Trust, KnobOutcome::AlreadyCorrect, None),
            knob(Knob::Pfc, pfc, Some("EOPNOTSUPP")),
            knob(Knob::Mtu, KnobOutcome::AlreadyCorrect, None),
        ],
        ..Default::default()
    }
}

/// `(status, reason, message)` of condition `type_`.
fn find(conditions: &[DesiredCondition], type_: &str) -> (bool, &'static str, String) {
    let c = conditions
        .iter()
        .find(|d| d.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status, c.reason, c.message.clone())
}

const SOFT_KNOBS: &str =
    "trust, dscpMap, pfc, ecnNotificationPoint, ecnReactionPoint, cnpDscp, cnpPriority";

#[test]
fn soft_roce_alone_with_accept_is_applied_with_reason_soft_roce_accepted() {
    let c = node_conditions(
        &[soft_roce(KnobOutcome::Applied, None)],
        LossySoftRoce::Accept,
    );
    let message = format!(
        "1 interface(s) configured, not lossless: 1 Soft-RoCE interface(s) accepted by \
         spec.qos.lossySoftRoce: Accept: eth0 (rxe0): {SOFT_KNOBS} unsupported"
    );
    assert_eq!(
        find(&c, condition::QOS_APPLIED),
        (true, reason::SOFT_ROCE_ACCEPTED, message.clone())
    );
    assert_eq!(
        find(&c, condition::READY),
        (true, reason::AS_EXPECTED, message)
    );
    let (degraded, why, said) = find(&c, condition::DEGRADED);
    assert_eq!((degraded, why), (true, reason::SOFT_ROCE_ACCEPTED));
    assert!(
        said.starts_with(
            "not lossless, Soft-RoCE accepted by spec.qos.lossySoftRoce: Accept: 7 knob(s) \
             unsupported: eth0 trust: DCB is not supported on eth0: EOPNOTSUPP; eth0 dscpMap: "
        ),
        "{said}"
    );
    assert!(said.ends_with("; and 2 more"), "{said}");
}

#[test]
fn soft_roce_by_default_is_unsupported_as_before_and_says_how_to_accept_it() {
    let c = node_conditions(
        &[soft_roce(KnobOutcome::Applied, None)],
        LossySoftRoce::Refuse,
    );
    let (applied, why, said) = find(&c, condition::QOS_APPLIED);
    assert_eq!((applied, why), (false, reason::QOS_UNSUPPORTED));
    assert_eq!(
        said,
        "3 knob(s) unsupported: eth0 trust: DCB is not supported on eth0: EOPNOTSUPP; eth0 \
         dscpMap: DCB is not supported on eth0: EOPNOTSUPP; eth0 pfc: DCB is not supported on \
         eth0: EOPNOTSUPP; eth0 (rxe0) is Soft-RoCE, which has no DCB and is never lossless: a \
         test fabric may accept it with spec.qos.lossySoftRoce: Accept"
    );
    assert_eq!(
        find(&c, condition::READY),
        (false, reason::QOS_UNSUPPORTED, said.clone())
    );
    assert_eq!(
        find(&c, condition::DEGRADED),
        (true, reason::QOS_UNSUPPORTED, said)
    );
}

/// Accepting Soft-RoCE is no allowance for a ConnectX in the same fabric: its unsupported PFC
/// keeps the node's QoS unapplied, and only that knob is named.
#[test]
fn mixed_soft_roce_and_connectx_with_unsupported_pfc_is_not_applied_even_with_accept() {
    let c = node_conditions(
        &[
            soft_roce(KnobOutcome::Applied, None),
            connectx(KnobOutcome::Unsupported),
        ],
        LossySoftRoce::Accept,
    );
    assert_eq!(
        find(&c, condition::QOS_APPLIED),
        (
            false,
            reason::QOS_UNSUPPORTED,
            "1 knob(s) unsupported: enp24s0np0 pfc: EOPNOTSUPP".to_string()
        )
    );
    // With the ConnectX lossless, the node counts, and says which interface is not.
    let c = node_conditions(
        &[
            soft_roce(KnobOutcome::Applied, None),
            connectx(KnobOutcome::AlreadyCorrect),
        ],
        LossySoftRoce::Accept,
    );
    let (applied, why, said) = find(&c, condition::QOS_APPLIED);
    assert_eq!((applied, why), (true, reason::SOFT_ROCE_ACCEPTED));
    assert!(
        said.starts_with("2 interface(s) configured, not lossless: 1 Soft-RoCE interface(s)"),
        "{said}"
    );
    assert!(!said.contains("enp24s0np0"), "{said}");
    // A ConnectX alone is unaffected by the policy.
    for policy in [LossySoftRoce::Refuse, LossySoftRoce::Accept] {
        let c = node_conditions(&[connectx(KnobOutcome::AlreadyCorrect)], policy);
        assert_eq!(
            find(&c, condition::QOS_APPLIED),
            (
                true,
                reason::QOS_APPLIED,
                "QoS holds on 1 interface(s)".to_string()
            )
        );
    }
}

/// What a soft device can hold must hold: a failed (or unsupported) MTU blocks under `Accept`.
#[test]
fn soft_roce_with_a_failed_mtu_is_not_applied_even_with_accept() {
    let failed = soft_roce(KnobOutcome::Failed, Some("wrote 4200 but reads back 1500"));
    let c = node_conditions(&[failed], LossySoftRoce::Accept);
    assert_eq!(
        find(&c, condition::QOS_APPLIED),
        (
            false,
            reason::QOS_FAILED,
            "1 knob(s) failed: eth0 mtu: wrote 4200 but reads back 1500".to_string()
        )
    );
    let unsupported = soft_roce(KnobOutcome::Unsupported, Some("EOPNOTSUPP"));
    let c = node_conditions(&[unsupported], LossySoftRoce::Accept);
    assert_eq!(
        find(&c, condition::QOS_APPLIED),
        (
            false,
            reason::QOS_UNSUPPORTED,
            "1 knob(s) unsupported: eth0 mtu: EOPNOTSUPP".to_string()
        )
    );
}

/// The VM fixture end to end: discovery finds `rxe0` on `eth0` (named by the selector), apply
/// over a netdev without DCB reports every knob a soft device lacks as `Unsupported` with its
/// cause and nothing of it as applied, MTU and the rdma_cm defaults are written and read back,
/// and the status says `virtual` and counts the node only under `Accept`.
#[test]
fn a_soft_roce_vm_reports_each_knob_honestly_and_counts_only_with_accept() {
    let (_sys, mut roots) = crate::fixture_tests::written_roots(&FixtureNode::vm_soft_roce());
    let other = tempfile::tempdir().expect("tempdir");
    roots.debugfs = other.path().join("debug");
    roots.configfs = other.path().join("config");
    let port = roots.configfs.join("rdma_cm/rxe0/ports/1");
    fs::create_dir_all(&port).expect("configfs");
    fs::write(port.join("default_roce_tos"), "0\n").expect("tos");
    fs::write(port.join("default_roce_mode"), "IB/RoCE v1\n").expect("mode");

    let mut node = roce_node(1);
    node.spec.nic_selector = NicSelector {
        rdma_devices: vec!["rxe0".into()],
        ..Default::default()
    };
    let selected = select_interfaces(&roots, &node, &BTreeSet::new()).expect("discovery");
    let [sel] = selected.as_slice() else {
        panic!("one interface: {selected:?}")
    };
    assert!(sel.files.is_virtual(), "{sel:?}");
    let kernel = FakeNode {
        dcb: Mutex::new(FakeDcb::default()),
        link: Mutex::new(FakeLink::with_mtu(1500)),
    };
    let desired = Desired::from_spec(&node.spec.qos);
    let outcome = kernel.apply(&sel.files, &desired).expect("apply");
    let iface = outcome.interface_status(&sel.files, sel.link_state.clone());
    assert_eq!(
        (iface.netdev.as_str(), iface.rdma_device.as_deref()),
        ("eth0", Some("rxe0"))
    );
    assert!(iface.is_virtual && iface.pci_address.is_none(), "{iface:?}");
    let outcome_of = |k: Knob| {
        let s = iface.knobs.iter().find(|s| s.knob == k).expect("reported");
        (s.outcome, s.error.clone().unwrap_or_default())
    };
    for (k, cause) in [
        (Knob::Trust, "DCB is not supported on eth0"),
        (Knob::DscpMap, "DCB is not supported on eth0"),
        (Knob::Pfc, "DCB is not supported on eth0"),
        (Knob::EcnNotificationPoint, "no ECN files at"),
        (Knob::EcnReactionPoint, "no ECN files at"),
        (Knob::CnpDscp, "eth0 has no PCI device"),
        (Knob::CnpPriority, "eth0 has no PCI device"),
    ] {
        let (o, error) = outcome_of(k);
        assert_eq!(o, KnobOutcome::Unsupported, "{k:?}: {error}");
        assert!(error.contains(cause), "{k:?}: {error}");
    }
    assert_eq!(
        outcome.applied(),
        [Knob::RoceTos, Knob::RoceMode, Knob::Mtu]
    );
    assert_eq!(iface.mtu, Some(4200));
    let json = serde_json::to_value(&iface).expect("json");
    assert_eq!(json["virtual"], true);

    let now = t(1_800_000_000);
    let refused = node_status(&node, vec![iface.clone()], &now);
    let qos = |s: &RoceNodeStatus| {
        let c = conditions::find(&s.conditions, condition::QOS_APPLIED).expect("QosApplied");
        (c.status.clone(), c.reason.clone())
    };
    assert_eq!(
        qos(&refused),
        ("False".to_string(), reason::QOS_UNSUPPORTED.to_string())
    );
    node.spec.qos.lossy_soft_roce = LossySoftRoce::Accept;
    let accepted = node_status(&node, vec![iface], &now);
    assert_eq!(
        qos(&accepted),
        ("True".to_string(), reason::SOFT_ROCE_ACCEPTED.to_string())
    );
    assert!(conditions::is_true(
        &accepted.conditions,
        condition::DEGRADED,
        None
    ));
}
