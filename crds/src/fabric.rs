//! `RoceFabric`: one lossless RoCE v2 fabric, cluster-scoped.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::constants;
use crate::nic_selector::NicSelector;

/// Desired state of a lossless RoCE fabric: which nodes and NICs, what QoS, and the optional
/// shared memory address space handed out to pods.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "rocefabric.io",
    version = "v1alpha1",
    kind = "RoceFabric",
    plural = "rocefabrics",
    shortname = "rf",
    status = "RoceFabricStatus",
    cel,
    validation = Rule::new("size(self.metadata.name) <= 63")
        .message("metadata.name must be at most 63 characters: the fabric name is used as a label value")
        // No fieldPath: the API server accepts only paths inside the schema, and metadata is not
        // (it refused this CRD with "fieldPath: Invalid value: \".metadata.name\"").
        .reason(Reason::FieldValueInvalid),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Configured","type":"integer","jsonPath":".status.nodes.configured"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.nodes.selected"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.nodes.failed","priority":1}"#,
    printcolumn = r#"{"name":"Conflicting","type":"integer","jsonPath":".status.nodes.conflicting","priority":1}"#,
    printcolumn = r#"{"name":"DSCP","type":"integer","jsonPath":".spec.qos.roceDscp"}"#,
    printcolumn = r#"{"name":"Prio","type":"integer","jsonPath":".spec.qos.rocePriority"}"#,
    printcolumn = r#"{"name":"TC","type":"integer","jsonPath":".status.trafficClass","priority":1}"#,
    printcolumn = r#"{"name":"Regions","type":"integer","jsonPath":".status.regions.allocated"}"#,
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".status.regions.capacity","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(oldSelf.sharedMemory) || has(self.sharedMemory)")
        .message("sharedMemory cannot be removed: running pods keep the windows they were given; delete the fabric once its pods are gone")
        .reason(Reason::FieldValueForbidden)
)]
pub struct RoceFabricSpec {
    /// Nodes that belong to the fabric. Empty selects every node. A node selected by two
    /// fabrics belongs to the older one.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// RDMA NICs of the selected nodes that belong to the fabric. Empty selects every RoCE port.
    #[serde(default)]
    pub nic_selector: NicSelector,
    /// Lossless QoS applied to every selected NIC.
    #[serde(default)]
    pub qos: QosSpec,
    /// Optional distributed address space: each matching pod gets a non-overlapping window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory: Option<SharedMemorySpec>,
    /// How fast QoS changes roll over the nodes.
    #[serde(default)]
    pub rollout: RolloutSpec,
}

/// Which field of the packet the NIC trusts to pick the priority.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// The DSCP field of the IP header (the usual choice for routed RoCE v2).
    #[default]
    Dscp,
    /// The 802.1p priority of the VLAN tag.
    Pcp,
}

impl std::fmt::Display for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trust::Dscp => "dscp",
            Trust::Pcp => "pcp",
        })
    }
}

/// Lossless RoCE QoS. Defaults follow the standard scheme: DSCP 26 on priority 3 with PFC,
/// ECN on priority 3, CNPs on DSCP 48 / priority 6, MTU 4200.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.pfcPriorities.exists(p, p == self.rocePriority)")
        .message("rocePriority must be one of pfcPriorities: RoCE traffic must be lossless")
        .reason(Reason::FieldValueInvalid)
        .field_path(".rocePriority"),
    validation = Rule::new("self.cnp.dscp != self.roceDscp")
        .message("cnp.dscp must differ from roceDscp: congestion notifications need their own queue")
        .reason(Reason::FieldValueInvalid)
        .field_path(".cnp.dscp")
)]
pub struct QosSpec {
    /// `dscp` (default) or `pcp`.
    #[serde(default)]
    pub trust: Trust,
    /// DSCP of RoCE data traffic, 0..63.
    #[serde(default = "default_roce_dscp")]
    #[schemars(range(min = 0, max = 63))]
    pub roce_dscp: u8,
    /// Priority RoCE data traffic maps to, 0..7. Must be PFC-enabled.
    #[serde(default = "default_roce_priority")]
    #[schemars(range(min = 0, max = 7))]
    pub roce_priority: u8,
    /// Priorities with PFC enabled (a set of 0..7).
    #[serde(default = "default_pfc_priorities")]
    #[schemars(extend("x-kubernetes-list-type" = "set"), length(max = 8), inner(range(min = 0, max = 7)))]
    pub pfc_priorities: Vec<u8>,
    /// ECN (DCQCN) settings.
    #[serde(default)]
    pub ecn: EcnSpec,
    /// Congestion notification packet settings.
    #[serde(default)]
    pub cnp: CnpSpec,
    /// Netdev MTU, 1280..9216. 4200 gives RoCE active MTU 4096.
    #[serde(default = "default_mtu")]
    #[schemars(range(min = 1280, max = 9216))]
    pub mtu: u16,
    /// Whether a Soft-RoCE interface (a virtual RDMA device, the kernel's `rdma_rxe`, no PCI
    /// function; selected only when `nicSelector` names it) may count as configured. It has no
    /// DCB, so it cannot hold trust, the DSCP map or PFC, nor ECN or CNP settings: it is never
    /// lossless. `Refuse` (default): as for any NIC that is not lossless, its node reports
    /// `QosApplied` False (`QosUnsupported`) and the device plugin's QoS gate keeps its HCA
    /// unhealthy. `Accept` (test clusters): on a virtual device only, those knobs being
    /// unsupported does not block; the MTU and the rdma_cm RoCE ToS and mode must still hold.
    /// The node then reports `QosApplied` True with reason `SoftRoceAccepted` and `Degraded`
    /// True naming the knobs that are not lossless. A PCI NIC (ConnectX) in the same fabric is
    /// gated as under `Refuse`.
    #[serde(default)]
    pub lossy_soft_roce: LossySoftRoce,
}

/// Whether a Soft-RoCE interface, which cannot be lossless, may count as configured
/// (`spec.qos.lossySoftRoce`).
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
)]
pub enum LossySoftRoce {
    /// Not lossless, so not configured: the node's QoS is unsupported, as for any such NIC.
    #[default]
    Refuse,
    /// Configured once what a soft device can hold holds (MTU, rdma_cm RoCE ToS and mode),
    /// reported as not lossless.
    Accept,
}

impl Default for QosSpec {
    fn default() -> Self {
        Self {
            trust: Trust::Dscp,
            roce_dscp: default_roce_dscp(),
            roce_priority: default_roce_priority(),
            pfc_priorities: default_pfc_priorities(),
            ecn: EcnSpec::default(),
            cnp: CnpSpec::default(),
            mtu: default_mtu(),
            lossy_soft_roce: LossySoftRoce::default(),
        }
    }
}

impl QosSpec {
    /// The ToS byte workloads must use (`roceDscp << 2 | 2`).
    pub fn traffic_class(&self) -> u8 {
        constants::traffic_class(self.roce_dscp)
    }

    /// Priorities with ECN enabled: the explicit list, or the RoCE priority when unset;
    /// empty when ECN is disabled. Sorted and deduplicated.
    pub fn ecn_priorities(&self) -> Vec<u8> {
        if !self.ecn.enabled {
            return Vec::new();
        }
        let mut prios: Vec<u8> = match &self.ecn.priorities {
            Some(list) => list
                .iter()
                .filter_map(|p| u8::try_from(*p).ok())
                .filter(|p| *p < 8)
                .collect(),
            None => vec![self.roce_priority],
        };
        prios.sort_unstable();
        prios.dedup();
        prios
    }

    /// PFC priorities as the IEEE `pfc_en` bitmap (bit i = priority i).
    pub fn pfc_enable_bits(&self) -> u8 {
        self.pfc_priorities
            .iter()
            .filter(|p| **p < 8)
            .fold(0u8, |bits, p| bits | (1 << p))
    }

    /// The spec with every implied default written out (ECN priorities resolved, lists sorted),
    /// as the operator renders it into a `RoceNode`.
    pub fn rendered(&self) -> QosSpec {
        let mut out = self.clone();
        out.pfc_priorities.sort_unstable();
        out.pfc_priorities.dedup();
        out.ecn.priorities = Some(self.ecn_priorities().into_iter().map(i64::from).collect());
        out
    }
}

fn default_roce_dscp() -> u8 {
    26
}
fn default_roce_priority() -> u8 {
    3
}
fn default_pfc_priorities() -> Vec<u8> {
    vec![3]
}
fn default_mtu() -> u16 {
    4200
}
fn default_true() -> bool {
    true
}
fn default_cnp_dscp() -> u8 {
    48
}
fn default_cnp_priority() -> u8 {
    6
}

/// ECN (DCQCN) on the notification and reaction points.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.priorities) || self.priorities.all(p, p >= 0 && p <= 7)")
    .message("every ECN priority must be within 0..7")
    .reason(Reason::FieldValueInvalid)
    .field_path(".priorities"))]
pub struct EcnSpec {
    /// Enable ECN marking and reaction (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Priorities with ECN enabled; defaults to the RoCE priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "set"), length(max = 8))]
    pub priorities: Option<Vec<i64>>,
}

impl Default for EcnSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            priorities: None,
        }
    }
}

/// Congestion notification packets (CNPs) sent by the notification point.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CnpSpec {
    /// DSCP of CNPs, 0..63 (default 48).
    #[serde(default = "default_cnp_dscp")]
    #[schemars(range(min = 0, max = 63))]
    pub dscp: u8,
    /// Priority of CNPs, 0..7 (default 6).
    #[serde(default = "default_cnp_priority")]
    #[schemars(range(min = 0, max = 7))]
    pub priority: u8,
}

impl Default for CnpSpec {
    fn default() -> Self {
        Self {
            dscp: default_cnp_dscp(),
            priority: default_cnp_priority(),
        }
    }
}

/// The fabric's distributed address space, carved into regions handed to pods.
///
/// Its geometry is fixed while the fabric exists (`regionSize` never changes, `maxRegions` only
/// grows): running pods read their windows at start and keep using them, and a window of one
/// geometry is not a window of another.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("string(self.regionSize) == string(oldSelf.regionSize) && self.maxRegions >= oldSelf.maxRegions")
        .message("regionSize cannot change and maxRegions cannot shrink: running pods keep the windows they were given; create a new fabric for a new geometry")
        .reason(Reason::FieldValueForbidden)
)]
pub struct SharedMemorySpec {
    /// Size of one region, a positive multiple of 4096 bytes (for example `1Gi`).
    // The bound and the ternary keep `asInteger()` from running on a quantity beyond 63 bits
    // (`16Ei`), whose evaluation error would replace the rule's message.
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).isLessThan(quantity('8Ei')) ? quantity(string(self)).isGreaterThan(quantity('0')) && quantity(string(self)).asInteger() % 4096 == 0 : false")
        .message("regionSize must be a positive quantity of whole 4096-byte pages below 8Ei, such as 1Gi")
        .reason(Reason::FieldValueInvalid))]
    pub region_size: Quantity,
    /// Most regions the space holds, 1..1048576.
    #[schemars(range(min = 1, max = 1048576))]
    pub max_regions: u32,
    /// Most regions one pod may take (its `rocefabric.io/region-size` rounded up to whole
    /// regions); a larger request keeps the pod gated and is reported. Unset: the namespace's
    /// limit (`maxRegionsPerNamespace` or its default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_regions_per_pod: Option<u32>,
    /// Most regions the pods of one namespace may hold together; a pod that would exceed it
    /// waits, gated, and is reported. Unset: a quarter of `maxRegions` (rounded up), so that no
    /// one namespace can take the whole space; set it to `maxRegions` to lift the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_regions_per_namespace: Option<u32>,
    /// Namespaces whose pods may get a window (at most 256). Empty: every namespace. A pod of
    /// another namespace is never given one (a window it already holds is kept: its containers
    /// may use it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"), length(max = 256), inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")))]
    pub namespaces: Vec<String>,
    /// Seconds a pod may stay unbound to a node after its window was assigned (and its gate
    /// removed) before the window is reclaimed, 10..604800 (default 600): a pod that never runs
    /// (another gate of its own, an impossible nodeSelector) cannot hold space. A reclaimed pod
    /// gets no other window; its annotation `rocefabric.io/region-reclaimed` says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 604800))]
    pub reclaim_unbound_after_seconds: Option<u32>,
    /// Pods that get a region. Empty selects the pods labelled `rocefabric.io/fabric: <fabric name>`.
    #[serde(default)]
    pub pod_selector: LabelSelector,
}

/// Default of `sharedMemory.reclaimUnboundAfterSeconds`.
pub const DEFAULT_RECLAIM_UNBOUND_AFTER_SECONDS: u32 = 600;

impl SharedMemorySpec {
    /// The regions the pods of one namespace may hold together: `maxRegionsPerNamespace`, or a
    /// quarter of `maxRegions` rounded up.
    pub fn namespace_limit(&self) -> u32 {
        self.max_regions_per_namespace
            .unwrap_or_else(|| self.max_regions.div_ceil(4).max(1))
    }

    /// The regions one pod may take: `maxRegionsPerPod`, or the namespace's limit.
    pub fn pod_limit(&self) -> u32 {
        self.max_regions_per_pod
            .unwrap_or_else(|| self.namespace_limit())
    }

    /// `reclaimUnboundAfterSeconds` or its default.
    pub fn reclaim_unbound_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.reclaim_unbound_after_seconds
                .unwrap_or(DEFAULT_RECLAIM_UNBOUND_AFTER_SECONDS),
        ))
    }
}

/// Rollout pacing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Nodes reconfiguring at once: an integer >= 1 or a percentage of selected nodes (rounded up,
    /// at least one). Default 1. Changing PFC flaps the link on ConnectX NICs.
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = Rule::new("string(self).matches('^([1-9][0-9]*|[1-9][0-9]?%|100%)$')")
        .message("maxUnavailable must be an integer of at least 1 or a percentage from 1% to 100%")
        .reason(Reason::FieldValueInvalid))]
    pub max_unavailable: IntOrString,
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

impl RolloutSpec {
    /// How many of `selected` nodes may reconfigure at once (at least 1).
    pub fn budget(&self, selected: usize) -> usize {
        let n = match &self.max_unavailable {
            IntOrString::Int(n) => usize::try_from(*n).unwrap_or(0),
            IntOrString::String(s) => {
                let pct: usize = s.trim_end_matches('%').trim().parse().unwrap_or(0);
                (selected * pct).div_ceil(100)
            }
        };
        n.max(1)
    }
}

/// Observed state of a fabric.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoceFabricStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Progressing` and `Degraded`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Node counts.
    #[serde(default)]
    pub nodes: NodeCounts,
    /// Shared memory region counts.
    #[serde(default)]
    pub regions: RegionCounts,
    /// ToS byte workloads must use (`roceDscp << 2 | 2`), for `NCCL_IB_TC` / `UCX_IB_TRAFFIC_CLASS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<u8>,
    /// Names of nodes this fabric selects but an older fabric owns (at most 100 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicting_nodes: Vec<String>,
}

/// Node counts of a fabric.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes the fabric owns (selected and not owned by an older fabric).
    pub selected: u32,
    /// Nodes reporting QoS applied for the current generation.
    pub configured: u32,
    /// Nodes reporting a failure for the current generation.
    pub failed: u32,
    /// Nodes selected but owned by an older fabric.
    pub conflicting: u32,
}

/// Region counts of a fabric.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RegionCounts {
    /// Region slots in use by live pods.
    pub allocated: u32,
    /// `maxRegions`, or 0 without shared memory.
    pub capacity: u32,
}
