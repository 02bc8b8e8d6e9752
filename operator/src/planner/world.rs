//! The snapshot of the cluster a plan is computed from.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::RoceFabric;

use crate::objects::{CompactNode, CompactPod, CompactRoceNode};
use crate::regions::FreedRegions;

/// Everything the planner looks at. The shell fills it from its watch caches; the `plan`
/// command from YAML files.
#[derive(Clone, Debug)]
pub struct World {
    pub fabrics: Vec<RoceFabric>,
    pub nodes: Vec<CompactNode>,
    pub roce_nodes: Vec<CompactRoceNode>,
    pub pods: Vec<CompactPod>,
    /// The region directories (`<fabric>-regions`, labelled `rocefabric.io/fabric`); other
    /// ConfigMaps are ignored.
    pub config_maps: Vec<ConfigMap>,
    pub now: Timestamp,
    /// The allocator memory returned by the previous plan ([`super::Plan::freed`]); empty
    /// after a restart.
    pub freed: FreedRegions,
}

impl World {
    /// An empty world at `now`.
    pub fn empty(now: Timestamp) -> Self {
        Self {
            fabrics: Vec::new(),
            nodes: Vec::new(),
            roce_nodes: Vec::new(),
            pods: Vec::new(),
            config_maps: Vec::new(),
            now,
            freed: FreedRegions::default(),
        }
    }
}

/// Knobs of the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// How long a freed region id (and its window) stays out of use.
    pub region_grace: Duration,
    /// Fill the per-node and per-region lists of the report (the `plan` command); the operator
    /// needs only the counts.
    pub detailed_report: bool,
    /// After a takeover (empty memory: a restart or a new leader), hand out no new window for
    /// one `region_grace`: a window the previous leader freed just before may still be cooling,
    /// and only its memory knew. Recorded windows are kept as always. The operator sets it; the
    /// `plan` command (a what-if over a snapshot) does not.
    pub hold_after_takeover: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            region_grace: Duration::from_secs(30),
            detailed_report: false,
            hold_after_takeover: false,
        }
    }
}
