//! Per fabric: render the RoceNode spec, classify its nodes and pace the rollout.
//!
//! A RoceNode spec carries the fabric's generation at the last change of what the node applies
//! (rendered QoS, NIC selection): other edits of the fabric re-roll nothing. A node is in progress
//! from when its spec is written until its status reports that generation applied (`QosApplied`
//! True) or failed (`QosApplied` False or `Degraded` True). New nodes (no RoceNode yet) and nodes
//! holding an older spec wait for a slot: at most `RolloutSpec::budget(selected)` nodes are in
//! progress at once. Once failures for the current generation exceed the budget the rollout stops:
//! no waiting node gets the new spec.

use std::collections::HashMap;

use rocefabric_api::RoceNodeSpec;

use super::report::{NodeAction, NodeState};
use super::selection::ParsedFabric;
use super::writes::Write;
use crate::objects::{CompactNode, CompactRoceNode};

/// Where a fabric's rollout stands: the numbers its status and report are made of.
#[derive(Clone, Default)]
pub(crate) struct RolloutCounts {
    pub selected: u32,
    pub configured: u32,
    pub failed: u32,
    /// After this plan's writes.
    pub in_progress: u32,
    /// After this plan's writes.
    pub waiting: u32,
    pub budget: u32,
    pub blocked: bool,
    /// Names of nodes failing the current generation, by name.
    pub failed_names: Vec<String>,
}

/// A fabric's nodes after pacing.
#[derive(Default)]
pub(crate) struct Rollout {
    pub counts: RolloutCounts,
    /// Per owned node (same order as the owned list): what happens and where it stands.
    pub nodes: Vec<(NodeAction, NodeState)>,
    pub writes: Vec<Write>,
}

/// The spec every node of `fabric` must hold.
pub(crate) fn desired_spec(fabric: &ParsedFabric<'_>) -> RoceNodeSpec {
    RoceNodeSpec {
        fabric: fabric.name.to_string(),
        fabric_generation: fabric.generation,
        qos: fabric.obj.spec.qos.rendered(),
        nic_selector: fabric.obj.spec.nic_selector.clone(),
        pending: false,
    }
}

/// Whether a RoceNode already holds what `desired` asks the node to apply: the same fabric,
/// rendered QoS and NIC selection, whatever fabric generation it was written at.
pub(crate) fn same_node_config(held: &RoceNodeSpec, desired: &RoceNodeSpec) -> bool {
    held.fabric == desired.fabric
        && held.qos == desired.qos
        && held.nic_selector == desired.nic_selector
        && held.pending == desired.pending
}

/// What a RoceNode's status says about the generation its spec carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    Applied,
    Failed,
    /// Not reported yet (or the agent is still working on it).
    Pending,
}

fn report_for(rn: &CompactRoceNode, generation: i64) -> Report {
    let Some(status) = &rn.status else {
        return Report::Pending;
    };
    if status.fabric_generation != Some(generation) {
        return Report::Pending;
    }
    match status.qos_applied.as_deref() {
        Some("True") => Report::Applied,
        Some("False") => Report::Failed,
        _ if status.degraded => Report::Failed,
        _ => Report::Pending,
    }
}

/// Where one owned node stands before pacing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Missing,
    Current { report: Report, fix_metadata: bool },
    Stale { settling: bool },
}

/// Classify one owned node by the RoceNode it holds.
pub(crate) fn classify(
    rn: Option<&CompactRoceNode>,
    desired: &RoceNodeSpec,
    fabric_name: &str,
    fabric_uid: &str,
) -> Class {
    match rn {
        // A pending RoceNode only holds the node's place: it waits like a new node.
        None => Class::Missing,
        Some(rn) if rn.spec.pending => Class::Missing,
        // Only what the node applies counts: an edit of the fabric that leaves the rendered QoS
        // and NIC selection as they are (rollout pacing, shared memory) must not re-roll QoS
        // over every node.
        Some(rn) if same_node_config(&rn.spec, desired) => Class::Current {
            report: report_for(rn, rn.spec.fabric_generation),
            // The RoceNode carries the fabric label and a controller owner reference to it.
            fix_metadata: !rn.owned_by(fabric_name, fabric_uid),
        },
        Some(rn) => Class::Stale {
            settling: report_for(rn, rn.spec.fabric_generation) == Report::Pending,
        },
    }
}

/// The placeholder a new node holds while it waits for its turn.
pub(crate) fn placeholder(desired: &RoceNodeSpec) -> RoceNodeSpec {
    RoceNodeSpec {
        pending: true,
        ..desired.clone()
    }
}

/// Classify and pace the owned nodes of an active fabric (`owned` sorted by node name).
pub(crate) fn plan_rollout(
    fabric: &ParsedFabric<'_>,
    owned: &[usize],
    nodes: &[CompactNode],
    roce_nodes: &HashMap<&str, &CompactRoceNode>,
) -> Rollout {
    let desired = desired_spec(fabric);
    let names: Vec<&str> = owned.iter().map(|&n| node_name(&nodes[n])).collect();
    let classes: Vec<Class> = names
        .iter()
        .map(|&name| {
            let rn = roce_nodes.get(name).copied();
            classify(rn, &desired, fabric.name, fabric.uid)
        })
        .collect();
    let budget = fabric.obj.spec.rollout.budget(owned.len());
    let mut r = Rollout {
        counts: tally(&names, &classes, budget),
        ..Rollout::default()
    };
    let mut slots = if r.counts.blocked {
        0
    } else {
        r.counts.budget.saturating_sub(r.counts.in_progress)
    };
    let pacer = Pacer {
        fabric,
        roce_nodes,
        desired: &desired,
    };
    for (name, class) in names.iter().zip(&classes) {
        let entry = pacer.pace(name, class, &mut r, &mut slots);
        r.nodes.push(entry);
    }
    r
}

/// Count the owned nodes (`names`, classed as `classes`) by where they stand, before pacing;
/// at most `budget` may be in progress.
fn tally(names: &[&str], classes: &[Class], budget: usize) -> RolloutCounts {
    let mut counts = RolloutCounts {
        selected: count(names.len()),
        budget: count(budget),
        ..RolloutCounts::default()
    };
    for (name, c) in names.iter().zip(classes) {
        match c {
            Class::Current {
                report: Report::Applied,
                ..
            } => counts.configured += 1,
            Class::Current {
                report: Report::Failed,
                ..
            } => {
                counts.failed += 1;
                counts.failed_names.push(name.to_string());
            }
            Class::Current {
                report: Report::Pending,
                ..
            }
            | Class::Stale { settling: true } => counts.in_progress += 1,
            Class::Stale { settling: false } | Class::Missing => {}
        }
        if matches!(c, Class::Missing | Class::Stale { settling: false }) {
            counts.waiting += 1;
        }
    }
    counts.blocked = counts.failed > counts.budget && counts.waiting > 0;
    counts
}

/// What pacing reads: the fabric, the RoceNodes by name and the spec its nodes must hold.
struct Pacer<'a, 'w> {
    fabric: &'a ParsedFabric<'w>,
    roce_nodes: &'a HashMap<&'a str, &'a CompactRoceNode>,
    desired: &'a RoceNodeSpec,
}

impl Pacer<'_, '_> {
    /// Where node `name` (classed `c`) goes: its action and state, its write pushed onto `r`;
    /// a node that starts takes one of the `slots` left.
    fn pace(
        &self,
        name: &str,
        c: &Class,
        r: &mut Rollout,
        slots: &mut u32,
    ) -> (NodeAction, NodeState) {
        let fabric = self.fabric;
        // A node holding the current configuration keeps its spec (and generation) when only
        // its metadata is repaired.
        let spec = match self.roce_nodes.get(name) {
            Some(rn) if same_node_config(&rn.spec, self.desired) => rn.spec.clone(),
            _ => self.desired.clone(),
        };
        let apply = || Write::ApplyRoceNode {
            name: name.to_string(),
            fabric_name: fabric.name.to_string(),
            fabric_uid: fabric.uid.to_string(),
            spec: spec.clone(),
        };
        match c {
            Class::Current {
                report,
                fix_metadata,
            } => {
                let state = match report {
                    Report::Applied => NodeState::Configured,
                    Report::Failed => NodeState::Failed,
                    Report::Pending => NodeState::InProgress,
                };
                if *fix_metadata {
                    r.writes.push(apply());
                    (NodeAction::Update, state)
                } else {
                    (NodeAction::Unchanged, state)
                }
            }
            // Still settling an older spec: it is in progress already (and counted so), so it
            // takes the current spec without a new slot.
            Class::Stale { settling: true } if !r.counts.blocked => {
                r.writes.push(apply());
                (NodeAction::Update, NodeState::InProgress)
            }
            Class::Stale { settling: true } => (NodeAction::Waiting, NodeState::InProgress),
            Class::Missing | Class::Stale { settling: false } if *slots > 0 => {
                *slots -= 1;
                r.writes.push(apply());
                r.counts.in_progress += 1;
                r.counts.waiting -= 1;
                let action = if matches!(c, Class::Missing) {
                    NodeAction::Create
                } else {
                    NodeAction::Update
                };
                (action, NodeState::Pending)
            }
            Class::Missing => {
                // Its RoceNode exists at once, pending, so the node's QoS gate holds its HCAs
                // until its turn comes and the QoS is proven.
                let placeholder = placeholder(self.desired);
                let held = self.roce_nodes.get(name).map(|rn| &rn.spec);
                if held != Some(&placeholder) {
                    r.writes.push(Write::ApplyRoceNode {
                        name: name.to_string(),
                        fabric_name: fabric.name.to_string(),
                        fabric_uid: fabric.uid.to_string(),
                        spec: placeholder,
                    });
                }
                (NodeAction::Waiting, NodeState::Pending)
            }
            Class::Stale { settling: false } => (NodeAction::Waiting, NodeState::Pending),
        }
    }
}

pub(crate) fn node_name(node: &CompactNode) -> &str {
    &node.name
}

/// A count for status fields (which are `u32`); saturates, as no cluster gets near it.
pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
