//! One source of truth for names that cross component boundaries.

/// API group of every rocefabric custom resource.
pub const GROUP: &str = "rocefabric.io";
/// API version served by this crate.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` field value of rocefabric objects.
pub const API_VERSION: &str = "rocefabric.io/v1alpha1";

// Annotation, gate and label names are defined with the other cross-process formats in
// `rocefabric-formats` (which the data plane uses without this crate); re-exported here.
pub use rocefabric_formats::names::{
    FABRIC_LABEL, REGION_ANNOTATION, REGION_DIRECTORY_SUFFIX, REGION_RECLAIMED_ANNOTATION,
    REGION_SCHEDULING_GATE, REGION_SIZE_ANNOTATION,
};

/// Extended resource of one RDMA HCA (RoCE port).
pub const HCA_RESOURCE: &str = "rdma/hca";
/// Extended resource of one GPU paired with its closest HCA (PIX or PXB).
pub const GPU_HCA_RESOURCE: &str = "rdma/gpu-hca";
/// Default extended resource name for GPUs advertised by the node daemon.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Server-side apply field manager of the operator.
pub const OPERATOR_FIELD_MANAGER: &str = "rocefabric-operator";
/// Server-side apply field manager of the node QoS agent.
pub const AGENT_FIELD_MANAGER: &str = "rocefabric-agent";

/// Condition types (Kubernetes conventions: CamelCase, positive polarity where possible).
pub mod condition {
    /// Fabric: every selected node reports QoS applied for the current generation.
    /// RoceNode: QoS applied and every selected interface is up.
    pub const READY: &str = "Ready";
    /// Fabric: a rollout is in flight.
    pub const PROGRESSING: &str = "Progressing";
    /// Fabric or node: something is wrong that needs a human (failures, conflicts, exhaustion).
    pub const DEGRADED: &str = "Degraded";
    /// RoceNode: every knob of the spec holds on every selected interface.
    pub const QOS_APPLIED: &str = "QosApplied";
}

/// Condition and Event reasons.
pub mod reason {
    pub const ALL_NODES_CONFIGURED: &str = "AllNodesConfigured";
    pub const ROLLOUT_IN_PROGRESS: &str = "RolloutInProgress";
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    pub const ROLLOUT_BLOCKED: &str = "RolloutBlocked";
    pub const NODES_FAILED: &str = "NodesFailed";
    pub const NODES_CONFLICTING: &str = "NodesConflicting";
    pub const NO_NODES_SELECTED: &str = "NoNodesSelected";
    pub const REGIONS_EXHAUSTED: &str = "RegionsExhausted";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const AS_EXPECTED: &str = "AsExpected";
    pub const QOS_APPLIED: &str = "QosApplied";
    pub const QOS_FAILED: &str = "QosFailed";
    pub const QOS_UNSUPPORTED: &str = "QosUnsupported";
    /// A Soft-RoCE interface counts as configured without lossless QoS, as the fabric's
    /// `qos.lossySoftRoce: Accept` allows (`QosApplied` True, `Degraded` True).
    pub const SOFT_ROCE_ACCEPTED: &str = "SoftRoceAccepted";
    pub const NO_INTERFACES: &str = "NoInterfaces";
    pub const LINK_DOWN: &str = "LinkDown";
    pub const DRIFT_CORRECTED: &str = "DriftCorrected";
    pub const REGION_REASSIGNED: &str = "RegionReassigned";
    /// A pod's window was taken back: the pod was not bound to a node in time.
    pub const REGION_RECLAIMED: &str = "RegionReclaimed";
    /// A selected node waits for its rollout slot (RoceNode `spec.pending`).
    pub const ROLLOUT_PENDING: &str = "RolloutPending";
    /// A pod carries the region scheduling gate but no fabric's `podSelector` selects it.
    pub const NO_FABRIC_SELECTS_POD: &str = "NoFabricSelectsPod";
}

/// The ToS byte RoCE v2 traffic of a fabric carries: DSCP in the upper six bits, ECT(0) in the two
/// ECN bits, as UCX computes its automatic traffic class (DSCP 26 gives 106).
pub const fn traffic_class(roce_dscp: u8) -> u8 {
    (roce_dscp << 2) | 0b10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_class_matches_the_standard_scheme() {
        assert_eq!(traffic_class(26), 106);
        assert_eq!(traffic_class(0), 2);
        assert_eq!(traffic_class(63), 254);
        assert_eq!(traffic_class(46), 186);
    }
}
