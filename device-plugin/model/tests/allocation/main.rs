//! Advertised devices, preferred allocations and Allocate responses over discovered fixtures.

#![allow(clippy::unwrap_used)]

mod advertise;
mod allocate;
mod preferred;

use std::sync::OnceLock;

use rocefabric_api::NicSelector;
use rocefabric_node_model::allocation::{DeviceNode, ResourceKind, advertised};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory::discover;
use rocefabric_node_model::model::Inventory;
use rocefabric_node_testing::fixtures::{self, FixtureNode};

pub(crate) fn inventory_of(node: &FixtureNode) -> Inventory {
    let dir = fixtures::tempdir().unwrap();
    node.write_to(dir.path()).unwrap();
    discover(dir.path(), &NicSelector::default()).unwrap()
}

pub(crate) fn dgx() -> &'static Inventory {
    static INV: OnceLock<Inventory> = OnceLock::new();
    INV.get_or_init(|| inventory_of(&FixtureNode::dgx_h100()))
}

/// GPUs served by this plugin: every GPU under the GPU resource, every HCA under `rdma/hca`.
pub(crate) fn gpus_on() -> Config {
    let mut c = Config::default();
    c.gpu.enabled = true;
    c
}

/// GPU + rail pairs served: the rails and their GPUs are the pair resource's.
pub(crate) fn pairs_on() -> Config {
    let mut c = Config::default();
    c.gpu_hca.enabled = true;
    c
}

pub(crate) fn shared(n: u32) -> Config {
    let mut c = Config::default();
    c.hca.shared_replicas = n;
    c
}

pub(crate) fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn dev(path: &str) -> DeviceNode {
    DeviceNode {
        container_path: path.into(),
        host_path: path.into(),
        permissions: "rw".into(),
    }
}

pub(crate) fn numa_of(inv: &Inventory, kind: ResourceKind, cfg: &Config, id: &str) -> Option<u32> {
    advertised(kind, inv, cfg)
        .into_iter()
        .find(|d| d.id == id)
        .unwrap()
        .numa_node
}

/// The DGX fixture's HCAs with two replicas each, and every replica ID: what the property tests
/// pick from.
pub(crate) fn shared_universe() -> &'static (Config, Vec<String>) {
    static U: OnceLock<(Config, Vec<String>)> = OnceLock::new();
    U.get_or_init(|| {
        let cfg = shared(2);
        let all = advertised(ResourceKind::Hca, dgx(), &cfg)
            .into_iter()
            .map(|d| d.id)
            .collect();
        (cfg, all)
    })
}
