//! `RoceNode`: per-node desired (operator) and observed (node agent) QoS state, one per node,
//! named after the node, the same pattern as the SR-IOV operator's node state.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::fabric::{QosSpec, Trust};
use crate::nic_selector::NicSelector;

/// What the node must hold: written by the operator with server-side apply.
#[derive(
    CustomResource, Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq,
)]
#[kube(
    group = "rocefabric.io",
    version = "v1alpha1",
    kind = "RoceNode",
    plural = "rocenodes",
    shortname = "rn",
    status = "RoceNodeStatus",
    printcolumn = r#"{"name":"Fabric","type":"string","jsonPath":".spec.fabric"}"#,
    printcolumn = r#"{"name":"QoS","type":"string","jsonPath":".status.conditions[?(@.type==\"QosApplied\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Applied","type":"integer","jsonPath":".status.fabricGeneration","priority":1}"#,
    printcolumn = r#"{"name":"Synced","type":"date","jsonPath":".status.lastSyncTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RoceNodeSpec {
    /// Name of the RoceFabric that owns this node.
    pub fabric: String,
    /// `metadata.generation` of the fabric this spec was rendered from.
    pub fabric_generation: i64,
    /// The fabric's QoS with every default written out.
    pub qos: QosSpec,
    /// The fabric's NIC selector.
    #[serde(default)]
    pub nic_selector: NicSelector,
    /// Selected, but waiting for a rollout slot: the agent applies nothing and reports
    /// `QosApplied` False (`RolloutPending`), so the device plugin's QoS gate holds the node's
    /// HCAs until the fabric's QoS is proven on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// What the node holds: written by the node agent with server-side apply.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoceNodeStatus {
    /// The RoceNode `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The fabric generation whose QoS this status reports (`spec.fabricGeneration` when observed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_generation: Option<i64>,
    /// `QosApplied`, `Ready` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One entry per selected RoCE interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["netdev"]))]
    pub interfaces: Vec<InterfaceStatus>,
    /// When the agent last compared the node against the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
}

/// Observed QoS of one RoCE interface, with the outcome of every knob.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// Network interface name (`enp24s0np0`).
    pub netdev: String,
    /// RDMA device name (`mlx5_0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// PCI address of the function (`0000:18:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// The RDMA device is virtual (Soft-RoCE `rxe`, no PCI function): it has no DCB, so it is
    /// never lossless (the fabric's `qos.lossySoftRoce` says whether it may count as configured).
    #[serde(
        rename = "virtual",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub is_virtual: bool,
    /// RDMA port state (`ACTIVE`, `DOWN`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<String>,
    /// Trust mode read back from the NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<Trust>,
    /// Priorities with PFC enabled, read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfc_priorities: Option<Vec<u8>>,
    /// Priorities with ECN enabled, read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn_priorities: Option<Vec<u8>>,
    /// Default RoCE ToS for rdma_cm users, read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_tos: Option<u8>,
    /// Netdev MTU, read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Outcome of every knob on this interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["knob"]))]
    pub knobs: Vec<KnobStatus>,
}

/// One QoS setting of an interface.
#[derive(
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum Knob {
    /// DSCP or PCP trust.
    Trust,
    /// DSCP to priority map entries for the RoCE and CNP DSCPs (DCB APP table).
    DscpMap,
    /// PFC enable bitmap.
    Pfc,
    /// ECN enable per priority, notification point.
    EcnNotificationPoint,
    /// ECN enable per priority, reaction point.
    EcnReactionPoint,
    /// CNP DSCP.
    CnpDscp,
    /// CNP priority.
    CnpPriority,
    /// rdma_cm default RoCE ToS.
    RoceTos,
    /// rdma_cm default RoCE mode (RoCE v2).
    RoceMode,
    /// Netdev MTU.
    Mtu,
}

/// What happened to one knob.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KnobOutcome {
    /// Written and read back equal.
    Applied,
    /// Already held; nothing was written.
    AlreadyCorrect,
    /// This NIC or driver has no way to set it (EOPNOTSUPP, no driver file).
    Unsupported,
    /// Writing failed, or the value read back differs.
    Failed,
}

/// Kernel interface used to read or set a knob.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// DCB netlink (IEEE PFC, APP table).
    DcbNetlink,
    /// rtnetlink (MTU).
    Rtnetlink,
    /// Driver files under /sys (out-of-tree driver `ecn/`, `qos/`).
    Sysfs,
    /// Upstream mlx5 debugfs `cc_params`.
    Debugfs,
    /// rdma_cm configfs.
    Configfs,
}

/// The outcome of one knob on one interface.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KnobStatus {
    /// Which knob.
    pub knob: Knob,
    /// What happened.
    pub outcome: KnobOutcome,
    /// Which interface set (or read) it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Mechanism>,
    /// Desired value, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<String>,
    /// Value read back, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// Why it is unsupported or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl KnobStatus {
    /// A knob's outcome with nothing else said (no mechanism, values or error).
    pub fn new(knob: Knob, outcome: KnobOutcome) -> KnobStatus {
        KnobStatus {
            knob,
            outcome,
            mechanism: None,
            desired: None,
            observed: None,
            error: None,
        }
    }
}

impl KnobOutcome {
    /// The knob holds now (applied or already correct).
    pub fn holds(self) -> bool {
        matches!(self, KnobOutcome::Applied | KnobOutcome::AlreadyCorrect)
    }
}
