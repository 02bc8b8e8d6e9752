//! What a plan found, for metrics, logs and the `plan` command.

use serde::Serialize;

/// The plan's findings. `nodes`, `regions` and `waiting_pods` are filled only with
/// [`super::PlanOptions::detailed_report`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub fabrics: Vec<FabricReport>,
    /// Every node some fabric selects, with its owner.
    pub nodes: Vec<NodeReport>,
    /// Every live region after the plan.
    pub regions: Vec<RegionReport>,
    /// Pods that match a fabric but get no region (space full or a request that cannot fit).
    pub waiting_pods: Vec<WaitingPod>,
    /// RoceNodes the plan deletes.
    pub deleted_roce_nodes: Vec<String>,
}

/// One fabric.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FabricReport {
    pub name: String,
    pub generation: i64,
    /// The spec passes validation; otherwise `errors` says why and nothing is written for it.
    pub valid: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldErrorReport>,
    /// Being deleted: nothing is written for it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// Nodes the fabric owns.
    pub selected_nodes: u32,
    /// Nodes it selects that an older fabric owns.
    pub conflicting_nodes: u32,
    pub configured_nodes: u32,
    pub failed_nodes: u32,
    /// Nodes with the current spec written that have not reported yet, plus nodes still
    /// settling an older generation.
    pub in_progress_nodes: u32,
    /// Nodes that still need the current spec.
    pub waiting_nodes: u32,
    /// Nodes that may reconfigure at once.
    pub rollout_budget: u32,
    /// Failures exceed the budget: no node gets the new spec.
    pub rollout_blocked: bool,
    pub traffic_class: Option<u8>,
    /// Region slots held by live pods.
    pub regions_allocated: u32,
    /// Live regions (pods holding a window).
    pub region_count: u32,
    /// `maxRegions`, 0 without shared memory.
    pub region_capacity: u32,
    /// Pods that match but wait for room.
    pub pods_waiting: u32,
    /// Freed slots still in their grace period.
    pub regions_cooling: u32,
}

/// A rejected spec field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldErrorReport {
    pub field: String,
    pub message: String,
}

/// What the plan does with a node's RoceNode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeAction {
    /// The RoceNode is created now.
    Create,
    /// Its spec (or owner metadata) is updated now.
    Update,
    /// It already holds the current spec.
    Unchanged,
    /// It needs the current spec but the rollout budget is spent (or the rollout is blocked).
    Waiting,
    /// Its fabric is invalid or being deleted: left as it is.
    Untouched,
}

/// Where a node stands for the current generation of its fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeState {
    Configured,
    Failed,
    InProgress,
    /// Not yet given the current spec.
    Pending,
}

/// One selected node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    /// The fabric that owns it.
    pub fabric: String,
    /// Younger fabrics that select it too (and leave it alone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts_with: Vec<String>,
    pub action: NodeAction,
    pub state: NodeState,
}

/// How a region came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RegionChange {
    /// Recorded on the pod already.
    Kept,
    /// New for a pod that had none.
    Assigned,
    /// The pod's recorded window was taken by an older pod (or no longer fits): new window.
    Reassigned,
}

/// One live region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionReport {
    pub namespace: String,
    pub pod: String,
    pub fabric: String,
    pub id: u32,
    pub base: u64,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub change: RegionChange,
}

/// A pod left without a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingPod {
    pub namespace: String,
    pub pod: String,
    pub fabric: String,
    pub reason: String,
}
