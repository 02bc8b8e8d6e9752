//! Pure allocation decisions for the three resources: which devices are advertised (IDs, health,
//! NUMA node), which IDs are preferred for a request, and what a container receives for a grant
//! (device nodes and the NCCL/UCX environment). The kubelet servers are thin adapters over this.
//!
//! Each resource lists, proposes and grants only the devices it owns in the node's
//! [`Partition`] (one device, one owner; a disabled resource owns nothing), so a GPU or HCA is
//! never handed out by two resources at once.
//!
//! # Device IDs
//! - `rdma/hca`: the HCA's ID ([`Hca::id`]): its PCI address (`0000:18:00.0`), or
//!   `virtual-<node GUID>` for a Soft-RoCE device (24 characters). With `hca.sharedReplicas: N > 1`
//!   each HCA is advertised N times as `<id>#<k>`, `k` in `0..N` (`0000:18:00.0#2`), so every ID
//!   names its HCA; at most 24 + 1 + 4 characters, far below the kubelet's 63. A virtual HCA has
//!   no PCI address, so it adds nothing to `PCIDEVICE_*`.
//! - GPUs: the GPU's PCI address.
//! - `rdma/gpu-hca`: one device per GPU that has a PIX/PXB HCA (see
//!   [`topology::closest_hca`]), `<gpu pci>_<hca pci>` (`0000:1b:00.0_0000:18:00.0`, 25
//!   characters). Its NUMA node is the GPU's (the HCA's when the GPU reports none); it is Healthy
//!   when both halves are.
//!
//! # Preferred allocation
//! Unhealthy or unknown IDs are never proposed; `must_include` is always part of the answer. The
//! remaining IDs are chosen greedily from every possible starting device and the best resulting
//! set wins, compared by, in order:
//! 1. fewest replicas of an HCA already in the set: two replicas of one HCA give a container that
//!    one HCA once, so with sharing a request for two HCAs spreads over two distinct HCAs;
//! 2. fewest distinct NUMA nodes;
//! 3. tightest PCIe grouping: the largest pairwise distance (HCAs: between the HCAs; GPUs and
//!    pairs: between the GPUs), then the sum of pairwise distances;
//! 4. with sharing, HCAs with the most free replicas first, so single-HCA pods spread over the
//!    HCAs instead of stacking on the first one;
//! 5. the sorted IDs (deterministic).
//!
//! # Environment
//! HCA grants set `NCCL_IB_HCA` (exact match `=mlx5_0:1,mlx5_3:1`), `UCX_NET_DEVICES`,
//! `NCCL_IB_GID_INDEX` when all granted HCAs agree on one RoCE v2 IPv4 GID index, `NCCL_IB_TC` and
//! `UCX_IB_TRAFFIC_CLASS` when the traffic class is known, and `PCIDEVICE_<RESOURCE>` (the SR-IOV
//! plugin's convention) with the granted PCI addresses. GPU grants set `PCIDEVICE_<RESOURCE>` and
//! `NVIDIA_VISIBLE_DEVICES` with the granted GPUs' UUIDs (from the driver), else their indexes, so
//! the NVIDIA container runtime hook, where installed, mounts the driver libraries for exactly
//! those GPUs even when an image sets `NVIDIA_VISIBLE_DEVICES=all`. A container that requests two
//! of these resources receives both sets of variables; where keys coincide (`NCCL_IB_HCA` from
//! both `rdma/hca` and `rdma/gpu-hca`) the kubelet keeps one of them, so request one kind.

use rocefabric_formats::env;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::config::Config;
pub use crate::config::ResourceKind;
use crate::model::{Distance, Gpu, Hca, Health, Inventory};
use crate::ownership::{Partition, hca_device_id, pair_device_id};
use crate::topology;

/// `/dev/infiniband/rdma_cm`: the shared RDMA connection manager device.
pub const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
/// Shared NVIDIA control devices every GPU container needs.
pub const NVIDIA_SHARED_DEVICES: [&str; 3] =
    ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];
/// Permissions of every device spec.
pub const DEVICE_PERMISSIONS: &str = "rw";

/// One device as listed to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvertisedDevice {
    pub id: String,
    pub health: Health,
    pub numa_node: Option<u32>,
}

/// A device node handed to the container (always the host's real `/dev` path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNode {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// A bind mount handed to the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountSpec {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// What one container receives for its granted devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    pub devices: Vec<DeviceNode>,
    pub mounts: Vec<MountSpec>,
    pub envs: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl ContainerAllocation {
    /// The same allocation with every device node's host path under `host_dev_root` instead of
    /// `/dev` (the container path stays `/dev/...`): for nodes whose device nodes live elsewhere
    /// (a containerized driver root, or the test cluster's fixture `/dev`).
    pub fn with_host_dev_root(mut self, host_dev_root: &std::path::Path) -> Self {
        if host_dev_root == std::path::Path::new("/dev") {
            return self;
        }
        for device in &mut self.devices {
            if let Some(relative) = device.host_path.strip_prefix("/dev/") {
                device.host_path = host_dev_root.join(relative).to_string_lossy().into_owned();
            }
        }
        self
    }
}

/// Why an Allocate request cannot be answered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocateError {
    #[error("unknown {resource} device id {id:?}")]
    UnknownDevice { resource: String, id: String },
    /// The ID names a device that another resource owns (see [`crate::ownership`]).
    #[error("{resource} device id {id:?}: the device is served by {owner}, not {resource}")]
    NotOwned {
        resource: String,
        id: String,
        owner: String,
    },
    #[error("{resource} device {id:?}: HCA {hca} has no uverbs device")]
    NoUverbs {
        resource: String,
        id: String,
        hca: String,
    },
}

/// What an ID stands for.
#[derive(Clone, Copy, Debug)]
enum Unit<'a> {
    Hca(&'a Hca),
    Gpu(&'a Gpu),
    Pair(&'a Gpu, &'a Hca),
}

impl Unit<'_> {
    fn health(&self) -> Health {
        let both = |a: Health, b: Health| {
            if a == Health::Healthy && b == Health::Healthy {
                Health::Healthy
            } else {
                Health::Unhealthy
            }
        };
        match self {
            Unit::Hca(h) => h.health,
            Unit::Gpu(g) => g.health,
            Unit::Pair(g, h) => both(g.health, h.health),
        }
    }

    fn numa_node(&self) -> Option<u32> {
        match self {
            Unit::Hca(h) => h.numa_node,
            Unit::Gpu(g) => g.numa_node,
            Unit::Pair(g, h) => g.numa_node.or(h.numa_node),
        }
    }

    /// The physical device a replica belongs to (device ID of the HCA, PCI address of the GPU).
    fn key(&self) -> &str {
        match self {
            Unit::Hca(h) => &h.id,
            Unit::Gpu(g) | Unit::Pair(g, _) => &g.pci_address,
        }
    }

    fn distance(&self, other: &Unit<'_>) -> Distance {
        match (self, other) {
            (Unit::Hca(a), Unit::Hca(b)) => topology::hca_distance(a, b),
            (Unit::Gpu(a), Unit::Gpu(b)) | (Unit::Pair(a, _), Unit::Pair(b, _)) => {
                topology::gpu_distance(a, b)
            }
            // Units of one kind never mix; keep the function total.
            _ => Distance::SYS,
        }
    }
}

/// Every advertised ID of `kind` with what it stands for, in advertisement order: the devices
/// `kind` owns in `part`.
fn entries<'a>(kind: ResourceKind, part: &Partition<'a>, cfg: &Config) -> Vec<(String, Unit<'a>)> {
    match kind {
        ResourceKind::Hca => {
            let n = cfg.hca.shared_replicas.max(1);
            part.hcas
                .iter()
                .flat_map(|&h| (0..n).map(move |k| (hca_device_id(h, k, n), Unit::Hca(h))))
                .collect()
        }
        ResourceKind::Gpu => part
            .gpus
            .iter()
            .map(|&g| (g.pci_address.clone(), Unit::Gpu(g)))
            .collect(),
        ResourceKind::GpuHca => part
            .pairs
            .iter()
            .map(|&(g, h, _)| (pair_device_id(g, h), Unit::Pair(g, h)))
            .collect(),
    }
}

/// The devices of `kind` to list to the kubelet (none when `cfg` disables `kind`).
pub fn advertised(kind: ResourceKind, inv: &Inventory, cfg: &Config) -> Vec<AdvertisedDevice> {
    entries(kind, &Partition::new(inv, cfg), cfg)
        .into_iter()
        .map(|(id, u)| AdvertisedDevice {
            id,
            health: u.health(),
            numa_node: u.numa_node(),
        })
        .collect()
}

fn rank(d: Distance) -> u32 {
    match d {
        Distance::PIX => 1,
        Distance::PXB => 2,
        Distance::PHB => 3,
        Distance::NODE => 4,
        Distance::SYS => 5,
    }
}

/// Ordering key of a candidate set (smaller is better); see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SetCost {
    duplicates: usize,
    numa_nodes: usize,
    max_distance: u32,
    sum_distance: u32,
    free_replicas: Reverse<usize>,
    ids: Vec<String>,
}

struct Chooser {
    /// Candidate IDs (sorted) and their physical unit index.
    ids: Vec<String>,
    unit_of: Vec<usize>,
    /// Per physical unit: NUMA node, free replicas among the candidates.
    numa: Vec<Option<u32>>,
    free: Vec<usize>,
    /// Pairwise distance ranks between units (0 on the diagonal).
    dist: Vec<Vec<u32>>,
}

impl Chooser {
    fn new(members: Vec<(String, Unit<'_>)>) -> Self {
        let mut units: Vec<Unit<'_>> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        let mut ids = Vec::with_capacity(members.len());
        let mut unit_of = Vec::with_capacity(members.len());
        for (id, u) in members {
            let idx = *by_key.entry(u.key().to_string()).or_insert_with(|| {
                units.push(u);
                units.len() - 1
            });
            ids.push(id);
            unit_of.push(idx);
        }
        let mut free = vec![0; units.len()];
        for &u in &unit_of {
            free[u] += 1;
        }
        let dist = units
            .iter()
            .enumerate()
            .map(|(i, a)| {
                units
                    .iter()
                    .enumerate()
                    .map(|(j, b)| if i == j { 0 } else { rank(a.distance(b)) })
                    .collect()
            })
            .collect();
        let numa = units.iter().map(|u| u.numa_node()).collect();
        Chooser {
            ids,
            unit_of,
            numa,
            free,
            dist,
        }
    }

    fn cost(&self, set: &[usize]) -> SetCost {
        let units: Vec<usize> = set.iter().map(|&m| self.unit_of[m]).collect();
        let distinct: BTreeSet<usize> = units.iter().copied().collect();
        let numa: BTreeSet<Option<u32>> = units.iter().map(|&u| self.numa[u]).collect();
        let (mut max_d, mut sum_d) = (0, 0);
        for (i, &a) in units.iter().enumerate() {
            for &b in &units[i + 1..] {
                max_d = max_d.max(self.dist[a][b]);
                sum_d += self.dist[a][b];
            }
        }
        let mut ids: Vec<String> = set.iter().map(|&m| self.ids[m].clone()).collect();
        ids.sort();
        SetCost {
            duplicates: units.len() - distinct.len(),
            numa_nodes: numa.len(),
            max_distance: max_d,
            sum_distance: sum_d,
            free_replicas: Reverse(distinct.iter().map(|&u| self.free[u]).sum()),
            ids,
        }
    }

    /// Grow `set` (member indexes) to `size` members greedily.
    fn grow(&self, mut set: Vec<usize>, size: usize) -> Vec<usize> {
        let mut used = vec![false; self.ids.len()];
        for &m in &set {
            used[m] = true;
        }
        while set.len() < size {
            let in_set: BTreeSet<usize> = set.iter().map(|&m| self.unit_of[m]).collect();
            let numa_in: BTreeSet<Option<u32>> = in_set.iter().map(|&u| self.numa[u]).collect();
            let best = (0..self.ids.len()).filter(|&c| !used[c]).min_by_key(|&c| {
                let u = self.unit_of[c];
                let max_d = in_set.iter().map(|&s| self.dist[u][s]).max().unwrap_or(0);
                let sum_d: u32 = in_set.iter().map(|&s| self.dist[u][s]).sum();
                (
                    in_set.contains(&u),
                    !numa_in.is_empty() && !numa_in.contains(&self.numa[u]),
                    max_d,
                    sum_d,
                    Reverse(self.free[u]),
                    &self.ids[c],
                )
            });
            let Some(c) = best else { break };
            used[c] = true;
            set.push(c);
        }
        set
    }
}

/// The kubelet's `GetPreferredAllocation` request for one container.
#[derive(Clone, Copy, Debug)]
pub struct PreferredRequest<'a> {
    /// The IDs the kubelet may hand out.
    pub available: &'a [String],
    /// The IDs that must be part of the answer.
    pub must_include: &'a [String],
    /// How many IDs the container asks for.
    pub size: usize,
}

/// The IDs to propose for a request of `size` devices among `available`, always including
/// `must_include`; see the module docs for the order of preference. Returns fewer than `size`
/// IDs when not enough healthy devices are available (the kubelet fills up the rest itself).
pub fn preferred(
    kind: ResourceKind,
    inv: &Inventory,
    cfg: &Config,
    request: PreferredRequest<'_>,
) -> Vec<String> {
    let PreferredRequest {
        available,
        must_include,
        size,
    } = request;
    let known: HashMap<String, Unit<'_>> = entries(kind, &Partition::new(inv, cfg), cfg)
        .into_iter()
        .collect();
    let mut must: Vec<String> = Vec::new();
    for id in must_include {
        if !must.contains(id) {
            must.push(id.clone());
        }
    }
    if must.len() >= size {
        return must;
    }
    // The chooser ranks members: the must-include IDs the inventory knows, then the healthy
    // available candidates, each group sorted so the result does not depend on input order.
    let mut candidates: Vec<&String> = available
        .iter()
        .filter(|id| !must.contains(id))
        .filter(|id| {
            known
                .get(*id)
                .is_some_and(|u| u.health() == Health::Healthy)
        })
        .collect();
    candidates.sort();
    candidates.dedup();
    let known_must: Vec<&String> = must.iter().filter(|id| known.contains_key(*id)).collect();
    let members: Vec<(String, Unit<'_>)> = known_must
        .iter()
        .chain(candidates.iter())
        .map(|id| ((*id).clone(), known[*id]))
        .collect();
    let chooser = Chooser::new(members);
    let fixed: Vec<usize> = (0..known_must.len()).collect();
    let target = size - (must.len() - known_must.len());

    let best = if fixed.is_empty() {
        // Try every distinct physical unit as the starting point.
        let mut seeds: Vec<usize> = Vec::new();
        let mut seen = BTreeSet::new();
        for m in 0..chooser.ids.len() {
            if seen.insert(chooser.unit_of[m]) {
                seeds.push(m);
            }
        }
        seeds
            .into_iter()
            .map(|s| chooser.grow(vec![s], target))
            .min_by_key(|set| chooser.cost(set))
            .unwrap_or_default()
    } else {
        chooser.grow(fixed.clone(), target)
    };
    let mut picked: Vec<String> = best
        .into_iter()
        .filter(|m| !fixed.contains(m))
        .map(|m| chooser.ids[m].clone())
        .collect();
    picked.sort();
    must.extend(picked);
    must
}

impl DeviceNode {
    /// The host's device node at the same path in the container.
    pub fn host(path: String) -> Self {
        DeviceNode {
            container_path: path.clone(),
            host_path: path,
            permissions: DEVICE_PERMISSIONS.to_string(),
        }
    }
}

/// The device node of one GPU (`/dev/nvidia<N>`).
pub fn gpu_device_node(gpu: &Gpu) -> String {
    format!("/dev/nvidia{}", gpu.index)
}

/// The device node of one HCA (`/dev/infiniband/uverbs<N>`); `None` without a uverbs device.
pub fn hca_device_node(hca: &Hca) -> Option<String> {
    hca.uverbs
        .as_ref()
        .map(|uverbs| format!("/dev/infiniband/{uverbs}"))
}

/// Device nodes every container with any HCA (`rdma_cm`) or any GPU (the NVIDIA control devices)
/// needs once, whatever the count.
pub fn shared_device_nodes(any_hca: bool, any_gpu: bool) -> Vec<String> {
    let mut out = Vec::new();
    if any_gpu {
        out.extend(NVIDIA_SHARED_DEVICES.iter().map(|p| p.to_string()));
    }
    if any_hca {
        out.push(RDMA_CM.to_string());
    }
    out
}

/// The workload environment for a set of HCAs and GPUs (see the module docs), the part both the
/// device plugin's Allocate and DRA's CDI specs hand out; `hcas` and `gpus` in the order they
/// are listed (HCA ID order, GPU index order).
pub fn workload_env(
    hcas: &[&Hca],
    gpus: &[&Gpu],
    traffic_class: Option<u8>,
) -> BTreeMap<String, String> {
    let mut envs = BTreeMap::new();
    if !hcas.is_empty() {
        let ports: Vec<String> = hcas
            .iter()
            .map(|h| format!("{}:{}", h.name, h.port))
            .collect();
        let ports = ports.join(",");
        envs.insert(env::NCCL_IB_HCA.into(), format!("={ports}"));
        envs.insert(env::UCX_NET_DEVICES.into(), ports);
        let gid_indexes: BTreeSet<Option<u32>> = hcas.iter().map(|h| h.roce_v2_gid_index).collect();
        if let [Some(gid)] = gid_indexes.into_iter().collect::<Vec<_>>().as_slice() {
            envs.insert(env::NCCL_IB_GID_INDEX.into(), gid.to_string());
        }
        if let Some(tc) = traffic_class {
            envs.insert(env::NCCL_IB_TC.into(), tc.to_string());
            envs.insert(env::UCX_IB_TRAFFIC_CLASS.into(), tc.to_string());
        }
    }
    if !gpus.is_empty() {
        // UUIDs when the driver gave every one (stable whatever the runtime's enumeration),
        // else the indexes.
        let uuids: Option<Vec<&str>> = gpus.iter().map(|g| g.uuid.as_deref()).collect();
        let visible = match uuids {
            Some(uuids) => uuids.join(","),
            None => gpus
                .iter()
                .map(|g| g.index.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        envs.insert(env::NVIDIA_VISIBLE_DEVICES.into(), visible);
    }
    envs
}

/// Resolve one granted ID of `kind`; an ID of a device another resource owns names that owner.
fn resolve<'a>(
    kind: ResourceKind,
    known: &HashMap<String, Unit<'a>>,
    part: &Partition<'_>,
    cfg: &Config,
    id: &str,
) -> Result<Unit<'a>, AllocateError> {
    if let Some(unit) = known.get(id) {
        return Ok(*unit);
    }
    let resource = kind.resource_name(cfg).to_string();
    let id = id.to_string();
    Err(match part.owned_elsewhere(kind, &id) {
        Some(owner) => AllocateError::NotOwned {
            resource,
            id,
            owner: owner.resource_name(cfg).to_string(),
        },
        None => AllocateError::UnknownDevice { resource, id },
    })
}

/// What a container receives for the granted `ids` of `kind`. `traffic_class` is the fabric's
/// RoCE ToS byte when known (config or RoceNode).
pub fn allocate(
    kind: ResourceKind,
    inv: &Inventory,
    cfg: &Config,
    traffic_class: Option<u8>,
    ids: &[String],
) -> Result<ContainerAllocation, AllocateError> {
    let resource = kind.resource_name(cfg);
    let part = Partition::new(inv, cfg);
    let known: HashMap<String, Unit<'_>> = entries(kind, &part, cfg).into_iter().collect();
    let mut hcas: BTreeMap<&str, &Hca> = BTreeMap::new();
    let mut gpus: BTreeMap<u32, &Gpu> = BTreeMap::new();
    // The HCA of each granted ID, for the error message naming the ID.
    let mut hca_ids: Vec<(&str, &Hca)> = Vec::new();
    let mut granted_pci: Vec<&str> = Vec::new();
    // Sorted: ID order for HCAs (PCI order, then virtual), GPU order for GPUs and pairs;
    // duplicates collapse.
    let ids: BTreeSet<&String> = ids.iter().collect();
    for id in ids {
        match resolve(kind, &known, &part, cfg, id)? {
            Unit::Hca(h) => {
                hcas.insert(&h.id, h);
                hca_ids.push((id, h));
                granted_pci.extend(h.pci_address.as_deref());
            }
            Unit::Gpu(g) => {
                gpus.insert(g.index, g);
                granted_pci.push(&g.pci_address);
            }
            Unit::Pair(g, h) => {
                gpus.insert(g.index, g);
                hcas.insert(&h.id, h);
                hca_ids.push((id, h));
                granted_pci.push(&g.pci_address);
                granted_pci.extend(h.pci_address.as_deref());
            }
        }
    }
    let mut seen = BTreeSet::new();
    granted_pci.retain(|p| seen.insert(*p));

    for (id, h) in &hca_ids {
        if h.uverbs.is_none() {
            return Err(AllocateError::NoUverbs {
                resource: resource.to_string(),
                id: id.to_string(),
                hca: h.name.clone(),
            });
        }
    }
    let hcas: Vec<&Hca> = hcas.into_values().collect();
    let gpus: Vec<&Gpu> = gpus.into_values().collect();
    let mut out = ContainerAllocation::default();
    // GPUs and their control devices, then the HCAs in grant order and rdma_cm.
    let [gpu_shared, hca_shared] = [(false, !gpus.is_empty()), (!hcas.is_empty(), false)]
        .map(|(h, g)| shared_device_nodes(h, g));
    let nodes = gpus
        .iter()
        .map(|g| gpu_device_node(g))
        .chain(gpu_shared)
        .chain(hca_ids.iter().filter_map(|(_, h)| hca_device_node(h)))
        .chain(hca_shared);
    for path in nodes {
        if !out.devices.iter().any(|d| d.host_path == path) {
            out.devices.push(DeviceNode::host(path));
        }
    }
    out.envs = workload_env(&hcas, &gpus, traffic_class);
    let envs = &mut out.envs;
    if !granted_pci.is_empty() {
        envs.insert(env::pcidevice(resource), granted_pci.join(","));
    }
    Ok(out)
}
