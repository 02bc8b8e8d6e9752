//! The publishing side of the device plugin: the node state and one device list per resource,
//! recomputed from the inventory, the fabric view and (in `both` mode) the ledger; and each
//! resource's [`DeviceBackend`] over them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use rocefabric_dra::ledger::Ledger;
use rocefabric_kubelet_api::device_plugin::{BackendError, DeviceBackend};
use rocefabric_kubelet_api::{self as kubelet, pb};
use rocefabric_node_model::allocation::{
    self, AdvertisedDevice, ContainerAllocation, ResourceKind,
};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_model::model::{Health, Inventory};
use rocefabric_node_model::ownership::{self, Partition};

use super::ServeMetrics;

/// What every resource's backend reads: the latest inventory with the gate applied and the
/// traffic class to hand to workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub inventory: Inventory,
    pub traffic_class: Option<u8>,
}

/// The device list of one resource as the kubelet sees it, remembering departed devices.
pub(super) struct DeviceList {
    kind: ResourceKind,
    /// Every ID advertised so far with its last NUMA node.
    known: BTreeMap<String, Option<u32>>,
    tx: watch::Sender<Vec<pb::Device>>,
}

/// The current devices followed by every device advertised before and gone now, as Unhealthy.
pub fn with_departed(
    current: Vec<AdvertisedDevice>,
    known: &mut BTreeMap<String, Option<u32>>,
) -> Vec<pb::Device> {
    let present: std::collections::BTreeSet<&str> = current.iter().map(|d| d.id.as_str()).collect();
    let departed: Vec<pb::Device> = known
        .iter()
        .filter(|(id, _)| !present.contains(id.as_str()))
        .map(|(id, numa)| kubelet::device(id.clone(), false, *numa))
        .collect();
    let mut list: Vec<pb::Device> = current
        .iter()
        .map(|d| kubelet::device(d.id.clone(), d.health == Health::Healthy, d.numa_node))
        .collect();
    for d in current {
        known.insert(d.id, d.numa_node);
    }
    list.extend(departed);
    list
}

/// The publishing side: node state and per-resource lists, updated from inventory and view.
pub(super) struct Publisher {
    config: Arc<Config>,
    metrics: Arc<ServeMetrics>,
    state: watch::Sender<Arc<NodeState>>,
    pub(super) lists: Vec<DeviceList>,
    /// Each served device's resource at the last publish; `None` before the first.
    owners: Option<BTreeMap<String, ResourceKind>>,
    ledger: Option<Arc<Ledger>>,
}

impl Publisher {
    pub(super) fn new(
        config: Arc<Config>,
        metrics: Arc<ServeMetrics>,
        ledger: Option<Arc<Ledger>>,
    ) -> Self {
        let lists = ResourceKind::enabled_kinds(&config)
            .into_iter()
            .map(|kind| DeviceList {
                kind,
                known: BTreeMap::new(),
                tx: watch::Sender::new(Vec::new()),
            })
            .collect();
        Self {
            config,
            metrics,
            state: watch::Sender::new(Arc::new(NodeState::default())),
            lists,
            owners: None,
            ledger,
        }
    }

    /// At the first publish, which devices each resource owns when pairs took some away from
    /// `rdma/hca` or the GPU resource (fewer HCAs than discovered would otherwise puzzle); later,
    /// every device that changes owner.
    fn log_ownership(&mut self, inventory: &Inventory) {
        let cfg = &self.config;
        let name = |kind: ResourceKind| kind.resource_name(cfg).to_string();
        let part = Partition::new(inventory, cfg);
        let owners = part.owners();
        match &self.owners {
            None if part.moved_any() => {
                let [(_, hcas), (_, gpus), (_, pairs)] = part.summary();
                tracing::info!(
                    hca_resource = %name(ResourceKind::Hca), ?hcas,
                    gpu_resource = %name(ResourceKind::Gpu), gpu_enabled = cfg.gpu.enabled, ?gpus,
                    pair_resource = %name(ResourceKind::GpuHca), ?pairs,
                    "device ownership: each GPU's rail HCA and the GPU are served only as a pair"
                );
            }
            None => {}
            Some(before) => {
                for (device, from, to) in ownership::moves(before, &owners) {
                    tracing::warn!(%device, from = %name(from), to = %name(to),
                        "device changed owner (a rail HCA appeared or vanished); containers \
                         granted it through the old resource still hold it");
                }
            }
        }
        self.owners = Some(owners);
    }

    /// Recompute everything; each channel is notified only when its content changed.
    pub(super) fn publish(&mut self, inventory: &Inventory, view: &FabricView) {
        self.log_ownership(inventory);
        let mut gated = view.gate(inventory);
        if let Some(ledger) = &self.ledger {
            // Devices a DRA claim holds: Unhealthy here, so the kubelet grants them to no pod.
            let claimed = ledger.claimed();
            for hca in gated.hcas.iter_mut().filter(|h| claimed.contains(&h.id)) {
                hca.health = Health::Unhealthy;
            }
            for gpu in gated
                .gpus
                .iter_mut()
                .filter(|g| claimed.contains(&g.pci_address))
            {
                gpu.health = Health::Unhealthy;
            }
        }
        for list in &mut self.lists {
            let devices = with_departed(
                allocation::advertised(list.kind, &gated, &self.config),
                &mut list.known,
            );
            let resource = list.kind.resource_name(&self.config).to_string();
            let unhealthy = devices
                .iter()
                .filter(|d| d.health != Health::Healthy.as_str())
                .count();
            let healthy = devices.len() - unhealthy;
            for (health, n) in [(Health::Healthy, healthy), (Health::Unhealthy, unhealthy)] {
                let labels = ServeMetrics::labels(&resource, "health", health.as_str());
                self.metrics
                    .devices
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            list.tx.send_if_modified(|current| {
                if *current == devices {
                    return false;
                }
                tracing::info!(%resource, devices = devices.len(), unhealthy, "device list changed");
                *current = devices;
                true
            });
        }
        let state = NodeState {
            inventory: gated,
            traffic_class: view.effective_traffic_class(&self.config),
        };
        self.state.send_if_modified(|current| {
            if **current == state {
                return false;
            }
            *current = Arc::new(state);
            true
        });
    }

    pub(super) fn backend(
        &self,
        list: &DeviceList,
        dev_root: &Path,
        host_dev_root: &Path,
    ) -> Arc<ResourceBackend> {
        Arc::new(ResourceBackend {
            kind: list.kind,
            name: list.kind.resource_name(&self.config).to_string(),
            config: Arc::clone(&self.config),
            dev_root: dev_root.to_path_buf(),
            host_dev_root: host_dev_root.to_path_buf(),
            metrics: Arc::clone(&self.metrics),
            state: self.state.subscribe(),
            devices: list.tx.subscribe(),
            ledger: self.ledger.clone(),
        })
    }
}

/// One resource's [`DeviceBackend`] over the published state and the pure allocation module.
pub struct ResourceBackend {
    kind: ResourceKind,
    name: String,
    config: Arc<Config>,
    dev_root: PathBuf,
    host_dev_root: PathBuf,
    metrics: Arc<ServeMetrics>,
    state: watch::Receiver<Arc<NodeState>>,
    devices: watch::Receiver<Vec<pb::Device>>,
    ledger: Option<Arc<Ledger>>,
}

impl ResourceBackend {
    fn node_state(&self) -> Arc<NodeState> {
        Arc::clone(&self.state.borrow())
    }

    /// Device nodes of `alloc` that do not exist under the dev root (`/dev/x` -> `<dev root>/x`).
    fn missing_device_nodes(&self, alloc: &ContainerAllocation) -> Vec<String> {
        alloc
            .devices
            .iter()
            .filter(|d| {
                let relative = d.host_path.strip_prefix("/dev/").unwrap_or(&d.host_path);
                !self.dev_root.join(relative).exists()
            })
            .map(|d| d.host_path.clone())
            .collect()
    }
}

impl DeviceBackend for ResourceBackend {
    fn resource_name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> watch::Receiver<Vec<pb::Device>> {
        self.devices.clone()
    }

    fn preferred_allocation(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, BackendError> {
        let state = self.node_state();
        Ok(allocation::preferred(
            self.kind,
            &state.inventory,
            &self.config,
            allocation::PreferredRequest {
                available,
                must_include,
                size,
            },
        ))
    }

    fn allocate(
        &self,
        device_ids: &[String],
    ) -> Result<pb::ContainerAllocateResponse, BackendError> {
        let state = self.node_state();
        let result = allocation::allocate(
            self.kind,
            &state.inventory,
            &self.config,
            state.traffic_class,
            device_ids,
        );
        // `both` mode: the grant is recorded in the ledger, unless a DRA claim holds a device.
        let claimed = match (&result, &self.ledger) {
            (Ok(_), Some(ledger)) => {
                let devices = device_ids
                    .iter()
                    .flat_map(|id| ownership::devices_behind(self.kind, id))
                    .map(str::to_string)
                    .collect();
                ledger
                    .grant(&self.name, &devices, std::time::Instant::now())
                    .err()
            }
            _ => None,
        };
        if let Some(conflict) = claimed {
            let labels = ServeMetrics::labels(&self.name, "result", "claimed_by_dra");
            self.metrics.allocations.get_or_create(&labels).inc();
            return Err(BackendError::InvalidRequest(format!(
                "{}: {conflict}",
                self.name
            )));
        }
        let outcome = match &result {
            Ok(_) => "success",
            Err(allocation::AllocateError::UnknownDevice { .. }) => "unknown_device",
            Err(allocation::AllocateError::NotOwned { .. }) => "not_owned",
            Err(_) => "failed",
        };
        let labels = ServeMetrics::labels(&self.name, "result", outcome);
        self.metrics.allocations.get_or_create(&labels).inc();
        let alloc = result.map_err(|e| match e {
            allocation::AllocateError::UnknownDevice { resource, id } => {
                BackendError::UnknownDevice { resource, id }
            }
            e @ allocation::AllocateError::NotOwned { .. } => {
                BackendError::InvalidRequest(e.to_string())
            }
            other => BackendError::Failed(other.to_string()),
        })?;
        let missing = self.missing_device_nodes(&alloc);
        if !missing.is_empty() {
            tracing::warn!(resource = %self.name, ?missing, dev_root = %self.dev_root.display(),
                "granted device nodes are missing on this host; the container may fail to start");
        }
        Ok(to_proto(alloc.with_host_dev_root(&self.host_dev_root)))
    }
}

/// The kubelet form of a container's allocation.
pub fn to_proto(alloc: ContainerAllocation) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: alloc.envs,
        mounts: alloc
            .mounts
            .into_iter()
            .map(|m| pb::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: alloc
            .devices
            .into_iter()
            .map(|d| pb::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: alloc.annotations,
        cdi_devices: Vec::new(),
    }
}

/// Completes once `stopping` is `true` (or its sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// The publish task: publish on every inventory from the discovery loop, every fabric view change
/// and (`both` mode) every ledger change.
pub(super) async fn publish_loop(
    mut publisher: Publisher,
    mut inventory_rx: watch::Receiver<Inventory>,
    mut view_rx: watch::Receiver<FabricView>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut inventory = inventory_rx.borrow_and_update().clone();
    let mut inventory_open = true;
    let mut view = view_rx.borrow_and_update().clone();
    let mut view_open = true;
    let mut ledger_changes = publisher.ledger.as_ref().map(|l| l.changes());
    loop {
        tokio::select! {
            // `both` mode: a claim prepared or unprepared changes which devices are listed.
            Some(()) = async {
                match ledger_changes.as_mut() {
                    Some(rx) => rx.changed().await.ok(),
                    None => std::future::pending().await,
                }
            } => {}
            changed = inventory_rx.changed(), if inventory_open => match changed {
                Ok(()) => inventory = inventory_rx.borrow_and_update().clone(),
                Err(_) => inventory_open = false,
            },
            changed = view_rx.changed(), if view_open => match changed {
                Ok(()) => {
                    view = view_rx.borrow_and_update().clone();
                    tracing::info!(?view, "fabric view changed");
                }
                Err(_) => {
                    tracing::debug!("fabric view producer ended; keeping the last view");
                    view_open = false;
                }
            },
            () = stopped(&mut stopping) => break,
        }
        publisher.publish(&inventory, &view);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    fn adv(id: &str, health: Health, numa: Option<u32>) -> AdvertisedDevice {
        AdvertisedDevice {
            id: id.into(),
            health,
            numa_node: numa,
        }
    }

    #[test]
    fn departed_devices_stay_listed_unhealthy_until_they_return() {
        let mut known = BTreeMap::new();
        let first = with_departed(
            vec![
                adv("a", Health::Healthy, Some(0)),
                adv("b", Health::Healthy, Some(1)),
            ],
            &mut known,
        );
        assert_eq!(first.len(), 2);
        let second = with_departed(vec![adv("a", Health::Healthy, Some(0))], &mut known);
        assert_eq!(
            second,
            vec![
                kubelet::device("a", true, Some(0)),
                kubelet::device("b", false, Some(1)),
            ]
        );
        let third = with_departed(
            vec![
                adv("a", Health::Healthy, Some(0)),
                adv("b", Health::Healthy, Some(1)),
            ],
            &mut known,
        );
        assert_eq!(third, first);
    }
}
