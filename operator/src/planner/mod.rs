//! The operator's decisions, as one pure function over a snapshot of the world.
//!
//! [`plan`] selects each fabric's nodes (the older fabric wins a node two select), paces the
//! rollout of RoceNode specs, assigns shared memory regions to pods, builds the per-namespace
//! region directories and aggregates every fabric's status. It returns the exact writes that
//! bring the cluster there, diffed against the snapshot: a world that already matches yields
//! none. The shell executes the writes in order.
//!
//! Steps, one module each: `pass` (one pass over the world, calling the others in order),
//! `selection` (validity, selectors, node ownership), `pod` (a pod as the planner reads it),
//! `rollout` (RoceNode specs and pacing), `pods` (regions and directories, over
//! [`crate::regions`]), `status` (counts, conditions, Events), `writes` (the write list and the
//! objects it implies).

pub mod directory;
pub mod incremental;
mod pass;
mod pod;
mod pods;
mod report;
mod rollout;
mod selection;
mod status;
mod world;
pub mod writes;

pub use report::{
    FabricReport, FieldErrorReport, NodeAction, NodeReport, NodeState, PlanReport, RegionChange,
    RegionReport, WaitingPod,
};
pub use status::{
    MAX_CONFLICTING_LISTED, REGION_CONFLICT, REGION_DIRECTORY_TOO_LARGE, REGION_QUOTA_EXCEEDED,
    REGION_REQUEST_INVALID, WINDOW_FAILED,
};
pub use world::{PlanOptions, World};
pub use writes::{Event, EventType, Write};

use std::time::Duration;

use crate::regions::FreedRegions;
pub(crate) use pass::plan_keeping;
use rollout::count;
use selection::ParsedFabric;

/// The outcome of one planning pass.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The writes to execute, in order: RoceNode deletions, RoceNode applies (by node name), pod
    /// writes (by namespace and name; each pod's annotation before its gate removal), region
    /// directories, fabric statuses (by name), then Events.
    pub writes: Vec<Write>,
    pub report: PlanReport,
    /// The allocator memory to put into the next pass's [`World::freed`].
    pub freed: FreedRegions,
    /// Plan again after this long even if nothing changes (a freed window leaves its grace
    /// period).
    pub requeue_after: Option<Duration>,
}

/// Plan one pass over `world`.
pub fn plan(world: &World, opts: &PlanOptions) -> Plan {
    plan_keeping(world, opts, None)
}

/// What the region planning of one fabric found, kept for the incremental planner (which
/// cannot read it back from the writes).
#[derive(Clone, Debug, Default)]
pub(crate) struct RegionFindings {
    pub exhausted: Vec<String>,
    pub bad_requests: Vec<(String, String)>,
    pub over_quota: Vec<(String, String)>,
    pub conflicts: Vec<(String, String)>,
    pub too_large: Vec<(String, usize, usize)>,
    /// Pods whose data plane could not back or pin its window: `namespace/name`.
    pub window_failed: Vec<String>,
    pub events: usize,
}

/// The report of a fabric before its rollout and regions are planned.
fn report_start(f: &ParsedFabric<'_>, owned: usize, conflicting: usize) -> FabricReport {
    FabricReport {
        name: f.name.to_string(),
        generation: f.generation,
        valid: f.errors.is_empty(),
        errors: f
            .errors
            .iter()
            .map(|e| FieldErrorReport {
                field: e.field.clone(),
                message: e.message.clone(),
            })
            .collect(),
        deleting: f.deleting,
        selected_nodes: count(owned),
        conflicting_nodes: count(conflicting),
        region_capacity: f.pods.as_ref().map_or(0, |p| p.geometry.max_regions),
        ..FabricReport::default()
    }
}

/// Fill the report of an active fabric from its status facts and region figures (live slots,
/// live regions, cooling slots).
fn report_active(
    fr: &mut FabricReport,
    f: &ParsedFabric<'_>,
    facts: &status::Facts,
    (live_slots, region_count, cooling_slots): (u32, u32, u32),
) {
    fr.configured_nodes = facts.rollout.configured;
    fr.failed_nodes = facts.rollout.failed;
    fr.in_progress_nodes = facts.rollout.in_progress;
    fr.waiting_nodes = facts.rollout.waiting;
    fr.rollout_budget = facts.rollout.budget;
    fr.rollout_blocked = facts.rollout.blocked;
    fr.traffic_class = Some(f.obj.spec.qos.traffic_class());
    fr.regions_allocated = live_slots;
    fr.region_count = region_count;
    fr.pods_waiting =
        count(facts.exhausted.len() + facts.bad_requests.len() + facts.over_quota.len());
    fr.regions_cooling = cooling_slots;
}

fn write_name(w: &Write) -> &str {
    match w {
        Write::ApplyRoceNode { name, .. } | Write::DeleteRoceNode { name } => name,
        _ => "",
    }
}

fn directory_order(w: &Write) -> (&str, &str) {
    match w {
        Write::ApplyRegionDirectory {
            namespace, fabric, ..
        }
        | Write::DeleteRegionDirectory { namespace, fabric } => (namespace, fabric),
        _ => ("", ""),
    }
}
