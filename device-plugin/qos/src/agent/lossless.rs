//! Which interfaces are lossless, and which the fabric admits (pure): the one rule the node's
//! conditions and the device plugin's QoS gate share.
//!
//! An interface is lossless when no knob failed and every lossless knob holds. A Soft-RoCE
//! interface (a virtual RDMA device) never is: `rdma_rxe` runs on a netdev without DCB, so trust,
//! the DSCP map and PFC are unsupported. With the fabric's `qos.lossySoftRoce: Accept` it is
//! admitted all the same once everything a soft device can hold holds (MTU; rdma_cm's RoCE ToS
//! and mode where configfs has them); a PCI NIC never gets that allowance.

use rocefabric_api::{InterfaceStatus, Knob, KnobOutcome, KnobStatus, LossySoftRoce};

/// Knobs without which the NIC is not lossless: if one of them cannot be set, RoCE traffic may
/// be dropped, so the node must not be reported as applied (and the device-plugin gate keeps its
/// HCAs unhealthy). The others (ECN, CNP, rdma_cm ToS) tune congestion control; the upstream mlx5
/// driver exposes no ECN enable files at all (the firmware enables DCQCN), so an unsupported one
/// degrades the node without blocking it.
pub fn is_lossless_knob(knob: Knob) -> bool {
    matches!(knob, Knob::Trust | Knob::DscpMap | Knob::Pfc | Knob::Mtu)
}

/// Knobs a Soft-RoCE device has no way to hold: its netdev (virtio-net, a dummy, a veth) has no
/// DCB, so no trust, DSCP map or PFC, and no driver exposes ECN or CNP files for it. What it can
/// hold (the MTU, rdma_cm's RoCE ToS and mode) is not listed: those must hold as on any NIC.
pub fn soft_roce_cannot_hold(knob: Knob) -> bool {
    matches!(
        knob,
        Knob::Trust
            | Knob::DscpMap
            | Knob::Pfc
            | Knob::EcnNotificationPoint
            | Knob::EcnReactionPoint
            | Knob::CnpDscp
            | Knob::CnpPriority
    )
}

/// Whether `policy` excuses `knob` on `iface`: `Accept`, a virtual RDMA device, the knob
/// unsupported (never failed) and one no soft device can hold.
pub fn excused_on_soft_roce(
    policy: LossySoftRoce,
    iface: &InterfaceStatus,
    knob: &KnobStatus,
) -> bool {
    policy == LossySoftRoce::Accept
        && iface.is_virtual
        && knob.outcome == KnobOutcome::Unsupported
        && soft_roce_cannot_hold(knob.knob)
}

/// Whether a knob's outcome keeps `iface` out: it failed, or it is a lossless knob, unsupported,
/// and not excused by `policy`.
pub fn blocks(policy: LossySoftRoce, iface: &InterfaceStatus, knob: &KnobStatus) -> bool {
    match knob.outcome {
        KnobOutcome::Failed => true,
        KnobOutcome::Unsupported => {
            is_lossless_knob(knob.knob) && !excused_on_soft_roce(policy, iface, knob)
        }
        KnobOutcome::Applied | KnobOutcome::AlreadyCorrect => false,
    }
}

/// Whether the device plugin's gate admits `iface` under the fabric's `policy`: it reports knobs
/// and none of them blocks ([`blocks`]).
pub fn interface_is_admitted(iface: &InterfaceStatus, policy: LossySoftRoce) -> bool {
    !iface.knobs.is_empty() && iface.knobs.iter().all(|k| !blocks(policy, iface, k))
}

/// Whether an interface's report proves it lossless: no knob failed and every lossless knob
/// holds. What the gate admits when the fabric refuses lossy Soft-RoCE (the default).
pub fn interface_is_lossless(iface: &InterfaceStatus) -> bool {
    interface_is_admitted(iface, LossySoftRoce::Refuse)
}

/// Whether `iface` is admitted only because `policy` accepts a lossy Soft-RoCE device.
pub fn is_accepted_soft_roce(iface: &InterfaceStatus, policy: LossySoftRoce) -> bool {
    interface_is_admitted(iface, policy) && !interface_is_lossless(iface)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knob(knob: Knob, outcome: KnobOutcome) -> KnobStatus {
        KnobStatus::new(knob, outcome)
    }

    /// What Soft-RoCE on virtio-net reports (measured in the VM suite): no DCB, no ECN or CNP
    /// files; MTU and the rdma_cm defaults applied.
    fn soft(netdev: &str, mtu: KnobOutcome) -> InterfaceStatus {
        let mut knobs: Vec<KnobStatus> = [
            Knob::Trust,
            Knob::DscpMap,
            Knob::Pfc,
            Knob::EcnNotificationPoint,
            Knob::EcnReactionPoint,
            Knob::CnpDscp,
            Knob::CnpPriority,
        ]
        .into_iter()
        .map(|k| knob(k, KnobOutcome::Unsupported))
        .collect();
        knobs.push(knob(Knob::RoceTos, KnobOutcome::Applied));
        knobs.push(knob(Knob::RoceMode, KnobOutcome::Applied));
        knobs.push(knob(Knob::Mtu, mtu));
        InterfaceStatus {
            netdev: netdev.into(),
            rdma_device: Some("rxe0".into()),
            is_virtual: true,
            knobs,
            ..Default::default()
        }
    }

    #[test]
    fn a_soft_device_is_admitted_only_when_the_fabric_accepts_it() {
        let s = soft("eth0", KnobOutcome::Applied);
        assert!(!interface_is_lossless(&s));
        assert!(!interface_is_admitted(&s, LossySoftRoce::Refuse));
        assert!(interface_is_admitted(&s, LossySoftRoce::Accept));
        assert!(is_accepted_soft_roce(&s, LossySoftRoce::Accept));
        assert!(!is_accepted_soft_roce(&s, LossySoftRoce::Refuse));
    }

    #[test]
    fn what_a_soft_device_can_hold_still_blocks_when_it_does_not() {
        for mtu in [KnobOutcome::Failed, KnobOutcome::Unsupported] {
            let s = soft("eth0", mtu);
            assert!(!interface_is_admitted(&s, LossySoftRoce::Accept), "{mtu:?}");
        }
        let mut tos_failed = soft("eth0", KnobOutcome::Applied);
        tos_failed.knobs[7].outcome = KnobOutcome::Failed;
        assert_eq!(tos_failed.knobs[7].knob, Knob::RoceTos);
        assert!(!interface_is_admitted(&tos_failed, LossySoftRoce::Accept));
        // A failed PFC is a failure, not "a soft device cannot": never excused.
        let mut pfc_failed = soft("eth0", KnobOutcome::Applied);
        pfc_failed.knobs[2].outcome = KnobOutcome::Failed;
        assert!(!interface_is_admitted(&pfc_failed, LossySoftRoce::Accept));
    }

    #[test]
    fn a_pci_nic_gets_no_soft_roce_allowance() {
        let mut connectx = soft("enp24s0np0", KnobOutcome::Applied);
        connectx.is_virtual = false;
        connectx.rdma_device = Some("mlx5_0".into());
        connectx.pci_address = Some("0000:18:00.0".into());
        assert!(!interface_is_admitted(&connectx, LossySoftRoce::Accept));
        assert!(!is_accepted_soft_roce(&connectx, LossySoftRoce::Accept));
    }

    #[test]
    fn only_the_knobs_a_soft_device_lacks_are_excused() {
        let held = [Knob::Mtu, Knob::RoceTos, Knob::RoceMode];
        for k in held {
            assert!(!soft_roce_cannot_hold(k), "{k:?}");
        }
        let s = soft("eth0", KnobOutcome::Applied);
        let excused: Vec<Knob> = s
            .knobs
            .iter()
            .filter(|k| excused_on_soft_roce(LossySoftRoce::Accept, &s, k))
            .map(|k| k.knob)
            .collect();
        assert_eq!(
            excused,
            [
                Knob::Trust,
                Knob::DscpMap,
                Knob::Pfc,
                Knob::EcnNotificationPoint,
                Knob::EcnReactionPoint,
                Knob::CnpDscp,
                Knob::CnpPriority
            ]
        );
    }
}
