//! What the fabric tells the device plugin about this node: the traffic class workloads should use
//! and, when the QoS gate is on, which netdevs have their lossless RoCE QoS applied.
//!
//! The daemon follows a stream of these: one that never changes when there is no cluster
//! ([`FabricView::from_config`]: the config's traffic class, no gate), or one that follows the
//! node's `RoceNode` (the QoS agent crate's `gate`).

use std::collections::BTreeSet;

use rocefabric_api::{NicIdentity, NicSelector};

use crate::config::Config;
use crate::model::{Hca, Health, Inventory};

/// The fabric's view of this node, as far as device health and workload environment go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricView {
    /// The fabric's RoCE traffic class (ToS byte); `None` falls back to the config's.
    pub traffic_class: Option<u8>,
    /// `None`: no gate. `Some(netdevs)`: the netdevs whose QoS the agent reports applied; HCAs
    /// (and GPU+HCA pairs) on any other netdev are advertised Unhealthy.
    pub qos_ready: Option<BTreeSet<String>>,
    /// The fabric's NICs (the RoceNode's `spec.nicSelector`): only these are gated. HCAs outside
    /// the fabric (storage rails, other vendors) keep their own health. `None`: every HCA.
    pub fabric_nics: Option<NicSelector>,
    /// The RoceFabric the node belongs to (the RoceNode's `spec.fabric`), when it has one.
    pub fabric: Option<String>,
}

impl FabricView {
    /// The view the config alone gives: its traffic class, no gate.
    pub fn from_config(config: &Config) -> Self {
        Self {
            traffic_class: config.traffic_class,
            qos_ready: None,
            fabric_nics: None,
            fabric: None,
        }
    }

    /// The traffic class handed to workloads: the fabric's when it says one, else the config's.
    pub fn effective_traffic_class(&self, config: &Config) -> Option<u8> {
        self.traffic_class.or(config.traffic_class)
    }

    /// Whether an HCA on `netdev` passes the gate.
    pub fn admits(&self, netdev: Option<&str>) -> bool {
        match &self.qos_ready {
            None => true,
            Some(ready) => netdev.is_some_and(|n| ready.contains(n)),
        }
    }

    /// Whether the gate governs `hca`: it belongs to the fabric's NICs.
    pub fn governs(&self, hca: &Hca) -> bool {
        self.fabric_nics.as_ref().is_none_or(|sel| {
            sel.matches(&NicIdentity {
                vendor: hca.vendor,
                device_id: hca.device_id,
                pci_address: hca.pci_address.as_deref(),
                rdma_device: &hca.name,
                netdev: hca.netdev.as_deref(),
            })
        })
    }

    /// The inventory with the gate applied: every fabric HCA the gate does not admit is
    /// Unhealthy. Everything else, GPUs and HCAs outside the fabric included, is unchanged.
    pub fn gate(&self, inventory: &Inventory) -> Inventory {
        let mut gated = inventory.clone();
        if self.qos_ready.is_some() {
            for hca in &mut gated.hcas {
                if self.governs(hca) && !self.admits(hca.netdev.as_deref()) {
                    hca.health = Health::Unhealthy;
                }
            }
        }
        gated
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use crate::model::{Hca, PortState};

    fn hca(name: &str, netdev: Option<&str>) -> Hca {
        Hca {
            id: format!("0000:{name}"),
            name: name.into(),
            pci_address: Some(format!("0000:{name}")),
            vendor: Some(0x15b3),
            device_id: Some(0x1021),
            port: 1,
            netdev: netdev.map(Into::into),
            numa_node: Some(0),
            state: PortState::Active,
            uverbs: Some("uverbs0".into()),
            roce_v2_gid_index: Some(3),
            rate_mbps: None,
            health: Health::Healthy,
            device_path: String::new(),
        }
    }

    #[test]
    fn no_gate_admits_everything() {
        let view = FabricView::default();
        assert!(view.admits(Some("eth0")));
        assert!(view.admits(None));
        let inv = Inventory {
            hcas: vec![hca("a", None)],
            gpus: vec![],
        };
        assert_eq!(view.gate(&inv), inv);
    }

    #[test]
    fn gate_marks_hcas_without_applied_qos_unhealthy() {
        let view = FabricView {
            fabric: None,
            traffic_class: None,
            qos_ready: Some(["enp24s0np0".to_string()].into_iter().collect()),
            fabric_nics: None,
        };
        let inv = Inventory {
            hcas: vec![
                hca("a", Some("enp24s0np0")),
                hca("b", Some("enp64s0np0")),
                hca("c", None),
            ],
            gpus: vec![],
        };
        let health: Vec<_> = view.gate(&inv).hcas.iter().map(|h| h.health).collect();
        assert_eq!(
            health,
            [Health::Healthy, Health::Unhealthy, Health::Unhealthy]
        );
    }

    #[test]
    fn fabric_traffic_class_wins_over_config() {
        let config = Config {
            traffic_class: Some(106),
            ..Config::default()
        };
        assert_eq!(
            FabricView::from_config(&config).effective_traffic_class(&config),
            Some(106)
        );
        let view = FabricView {
            fabric: None,
            traffic_class: Some(98),
            qos_ready: None,
            fabric_nics: None,
        };
        assert_eq!(view.effective_traffic_class(&config), Some(98));
        assert_eq!(
            FabricView::default().effective_traffic_class(&Config::default()),
            None
        );
    }

    #[test]
    fn gate_leaves_hcas_outside_the_fabric_alone() {
        let view = FabricView {
            fabric: None,
            traffic_class: None,
            qos_ready: Some(["enp24s0np0".to_string()].into_iter().collect()),
            fabric_nics: Some(NicSelector {
                netdevs: vec!["enp24s0np0".into(), "enp64s0np0".into()],
                ..NicSelector::default()
            }),
        };
        let inv = Inventory {
            hcas: vec![
                hca("a", Some("enp24s0np0")),
                hca("b", Some("enp64s0np0")),
                hca("storage", Some("enp41s0f0np0")),
            ],
            gpus: vec![],
        };
        let health: Vec<_> = view.gate(&inv).hcas.iter().map(|h| h.health).collect();
        assert_eq!(
            health,
            [Health::Healthy, Health::Unhealthy, Health::Healthy],
            "the fabric HCA without QoS is gated; the storage HCA is not the fabric's"
        );
    }
}
