//! The agent's pure side: conditions, drift, retries, which interfaces it touches, pending nodes.

use super::*;
use rocefabric_api::conditions::Desired as DesiredCondition;
use rocefabric_api::{Knob, KnobOutcome, KnobStatus, LossySoftRoce};

#[test]
fn conditions_name_the_reason() {
    let knob = |k: Knob, o: KnobOutcome, e: Option<&str>| KnobStatus {
        error: e.map(str::to_string),
        ..KnobStatus::new(k, o)
    };
    let iface = |name: &str, link: &str, knobs: Vec<KnobStatus>| InterfaceStatus {
        netdev: name.into(),
        link_state: Some(link.into()),
        knobs,
        ..Default::default()
    };
    let find = |c: &[DesiredCondition], t: &str| {
        c.iter().find(|d| d.type_ == t).cloned().expect("condition")
    };

    let none = node_conditions(&[], LossySoftRoce::Refuse);
    assert_eq!(
        find(&none, condition::QOS_APPLIED).reason,
        reason::NO_INTERFACES
    );
    assert!(find(&none, condition::DEGRADED).status);

    let unsupported = node_conditions(
        &[iface(
            "veth0",
            "ACTIVE",
            vec![
                knob(Knob::Pfc, KnobOutcome::Unsupported, Some("EOPNOTSUPP")),
                knob(Knob::Mtu, KnobOutcome::Applied, None),
            ],
        )],
        LossySoftRoce::Refuse,
    );
    let q = find(&unsupported, condition::QOS_APPLIED);
    assert_eq!((q.status, q.reason), (false, reason::QOS_UNSUPPORTED));
    assert_eq!(q.message, "1 knob(s) unsupported: veth0 pfc: EOPNOTSUPP");
    assert!(find(&unsupported, condition::DEGRADED).status);

    let failed = node_conditions(
        &[iface(
            "eth2",
            "ACTIVE",
            vec![
                knob(Knob::Pfc, KnobOutcome::Unsupported, Some("x")),
                knob(
                    Knob::Trust,
                    KnobOutcome::Failed,
                    Some("wrote dscp but reads back pcp"),
                ),
            ],
        )],
        LossySoftRoce::Refuse,
    );
    assert_eq!(
        find(&failed, condition::QOS_APPLIED).reason,
        reason::QOS_FAILED,
        "failures outrank unsupported"
    );

    // Upstream mlx5: no ECN enable files. Lossless holds, so QoS is applied, but degraded.
    let upstream = node_conditions(
        &[iface(
            "enp24s0np0",
            "ACTIVE",
            vec![
                knob(Knob::Pfc, KnobOutcome::AlreadyCorrect, None),
                knob(Knob::DscpMap, KnobOutcome::Applied, None),
                knob(
                    Knob::EcnNotificationPoint,
                    KnobOutcome::Unsupported,
                    Some("no ECN enable files"),
                ),
            ],
        )],
        LossySoftRoce::Refuse,
    );
    let q = find(&upstream, condition::QOS_APPLIED);
    assert_eq!((q.status, q.reason), (true, reason::QOS_APPLIED));
    let d = find(&upstream, condition::DEGRADED);
    assert_eq!((d.status, d.reason), (true, reason::QOS_UNSUPPORTED));
    assert!(d.message.contains("ecnNotificationPoint"), "{}", d.message);
    assert!(find(&upstream, condition::READY).status);

    let down = node_conditions(
        &[iface(
            "eth2",
            "DOWN",
            vec![knob(Knob::Pfc, KnobOutcome::AlreadyCorrect, None)],
        )],
        LossySoftRoce::Refuse,
    );
    assert!(find(&down, condition::QOS_APPLIED).status);
    let ready = find(&down, condition::READY);
    assert_eq!(
        (ready.status, ready.reason, ready.message.as_str()),
        (false, reason::LINK_DOWN, "eth2 is DOWN")
    );
    assert!(!find(&down, condition::DEGRADED).status);
}

#[test]
fn drift_needs_the_same_generation_and_a_knob_that_held() {
    let held = |o: KnobOutcome| InterfaceStatus {
        netdev: "eth2".into(),
        knobs: vec![KnobStatus {
            knob: Knob::Pfc,
            outcome: o,
            mechanism: None,
            desired: None,
            observed: None,
            error: None,
        }],
        ..Default::default()
    };
    let mut node = roce_node(2);
    node.status = Some(RoceNodeStatus {
        observed_generation: Some(2),
        interfaces: vec![held(KnobOutcome::AlreadyCorrect)],
        ..Default::default()
    });
    assert_eq!(
        drifted(&node, &[held(KnobOutcome::Applied)]),
        vec![("eth2".to_string(), Knob::Pfc)]
    );
    assert!(drifted(&node, &[held(KnobOutcome::AlreadyCorrect)]).is_empty());
    node.metadata.generation = Some(3);
    assert!(
        drifted(&node, &[held(KnobOutcome::Applied)]).is_empty(),
        "a new spec is not drift"
    );
    node.metadata.generation = Some(2);
    node.status = Some(RoceNodeStatus {
        observed_generation: Some(2),
        interfaces: vec![held(KnobOutcome::Failed)],
        ..Default::default()
    });
    assert!(
        drifted(&node, &[held(KnobOutcome::Applied)]).is_empty(),
        "fixing a failure is not drift"
    );
}

#[test]
fn retries_back_off_from_1s_up_to_the_resync_interval() {
    let backoff = retry_backoff(Duration::from_secs(60));
    let d: Vec<u64> = (1..=8).map(|f| backoff.delay(f).as_secs()).collect();
    assert_eq!(d, [1, 2, 4, 8, 16, 32, 60, 60]);
}

/// The NIC carrying the node's default route is left alone unless the selector names it: an
/// empty or vendor-wide selector must not put PFC or a new MTU on the node's own uplink.
#[test]
fn the_default_route_interface_is_touched_only_when_named() {
    let t = tree(Flavour::Upstream, true);
    let default_route = BTreeSet::from(["enp24s0np0".to_string()]);
    let with_selector = |selector: NicSelector| {
        let mut node = roce_node(1);
        node.spec.nic_selector = selector;
        let selected = select_interfaces(&t.roots, &node, &default_route).expect("discovery");
        selected
            .into_iter()
            .map(|s| s.files.netdev)
            .collect::<Vec<_>>()
    };
    assert!(
        with_selector(NicSelector::default()).is_empty(),
        "empty selector"
    );
    let vendor = NicSelector {
        vendors: vec!["15b3".into()],
        ..Default::default()
    };
    assert!(with_selector(vendor).is_empty(), "vendor-wide selector");
    let named = NicSelector {
        netdevs: vec!["enp24s0np0".into()],
        ..Default::default()
    };
    assert_eq!(with_selector(named), ["enp24s0np0"]);
    // Without a default route on it, the empty selector takes it as before.
    let mut node = roce_node(1);
    node.spec.nic_selector = NicSelector::default();
    let selected = select_interfaces(&t.roots, &node, &BTreeSet::new()).expect("discovery");
    assert_eq!(selected.len(), 1);
}

/// A Soft-RoCE device left on a non-fabric NIC is not the fabric's: an empty or vendor-wide
/// selector leaves it alone (no QoS written to its netdev, no QosUnsupported for the node), a
/// selector naming it configures it (a Soft-RoCE test cluster).
#[test]
fn a_virtual_rdma_device_is_configured_only_when_named() {
    let (_dir, roots) = crate::fixture_tests::written_roots(
        &rocefabric_node_testing::fixtures::FixtureNode::dgx_h100().with_soft_roce(
            "rxe0",
            "eno3",
            Some(14),
        ),
    );
    let netdevs = |selector: NicSelector| {
        let mut node = roce_node(1);
        node.spec.nic_selector = selector;
        select_interfaces(&roots, &node, &BTreeSet::new())
            .expect("discovery")
            .into_iter()
            .map(|s| s.files.netdev)
            .collect::<Vec<_>>()
    };
    let all = netdevs(NicSelector::default());
    assert_eq!(all.len(), 14, "every ConnectX and irdma port: {all:?}");
    assert!(!all.contains(&"eno3".to_string()), "{all:?}");
    let by_name = NicSelector {
        rdma_devices: vec!["rxe0".into()],
        ..Default::default()
    };
    assert_eq!(netdevs(by_name), ["eno3"]);
    let by_netdev = NicSelector {
        netdevs: vec!["eno3".into()],
        ..Default::default()
    };
    assert_eq!(netdevs(by_netdev), ["eno3"]);
}

/// A RoceNode waiting for its rollout slot: nothing is applied, `QosApplied` and `Ready` say
/// `RolloutPending` (so the device plugin's gate holds the HCAs), and no fabric generation is
/// reported as if its QoS had been tried.
#[test]
fn a_pending_roce_node_reports_rollout_pending_without_a_fabric_generation() {
    let mut node = roce_node(1);
    node.spec.pending = true;
    let status = pending_status(&node, &t(1_800_000_000));
    assert_eq!(status.fabric_generation, None);
    assert!(status.interfaces.is_empty());
    for type_ in [condition::QOS_APPLIED, condition::READY] {
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("{type_}"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::ROLLOUT_PENDING)
        );
        assert!(c.message.contains("fabric-a"), "{}", c.message);
    }
    assert!(!conditions::is_true(
        &status.conditions,
        condition::DEGRADED,
        None
    ));
}
