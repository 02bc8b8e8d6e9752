//! The operator's decisions, as one pure function over a snapshot of the world.
//!
//! [`plan`] selects each fabric's nodes (the older fabric wins a node two select), paces the
//! rollout of RoceNode specs, assigns shared memory regions to pods, builds the per-namespace
//! region directories and aggregates every fabric's status. It returns the exact writes that
//! bring the cluster there, diffed against the snapshot: a world that already matches yields
//! none. The shell executes the writes in order.
//!
//! Steps, one module each: `selection` (validity, selectors, node ownership), `rollout` (RoceNode
//! specs and pacing), `pods` (regions and directories, over [`crate::regions`]), `status`
//! (counts, conditions, Events), `writes` (the write list and the objects it implies).

pub mod directory;
pub mod incremental;
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
    REGION_REQUEST_INVALID,
};
pub use world::{PlanOptions, World};
pub use writes::{Event, EventType, Write};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::{RegionCounts, RoceNode};

use crate::regions::FreedRegions;
use pod::PodRef;
use pods::RegionsOutcome;
use rollout::{count, node_name};
use selection::{ParsedFabric, Route};

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
    pub events: usize,
}

/// [`plan`], also filling `keep` with each active shared-memory fabric's findings.
pub(crate) fn plan_keeping(
    world: &World,
    opts: &PlanOptions,
    mut keep: Option<&mut HashMap<String, RegionFindings>>,
) -> Plan {
    let now = Time(world.now);
    let fabrics: Vec<ParsedFabric<'_>> = world.fabrics.iter().map(ParsedFabric::new).collect();
    let age = selection::age_order(&fabrics);
    let fabric_by_name: HashMap<&str, usize> = fabrics
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name, i))
        .collect();
    let mut nodes_by_name: Vec<usize> = (0..world.nodes.len()).collect();
    nodes_by_name.sort_by(|&a, &b| node_name(&world.nodes[a]).cmp(node_name(&world.nodes[b])));
    let node_exists: HashMap<&str, usize> = world
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (node_name(n), i))
        .collect();
    let roce_nodes: HashMap<&str, &RoceNode> = world
        .roce_nodes
        .iter()
        .map(|rn| (rn.metadata.name.as_deref().unwrap_or_default(), rn))
        .collect();
    let own = selection::assign_nodes(&fabrics, &age, &world.nodes, &nodes_by_name);

    // Route every live pod to the fabric whose region it holds or gets; gated pods no fabric
    // selects are told so (once each).
    let mut unmatched: Vec<PodRef<'_>> = Vec::new();
    let mut fabric_pods: Vec<Vec<PodRef<'_>>> = (0..fabrics.len()).map(|_| Vec::new()).collect();
    let router = selection::Router::new(&fabrics, &age);
    for pod in world.pods.iter().filter(|p| pod::is_live(p)) {
        let p = PodRef::new(pod);
        match router.route(&p) {
            Route::To(f) => fabric_pods[f].push(p),
            Route::Unmatched => unmatched.push(p),
            Route::Skip => {}
        }
    }
    unmatched.sort_by(|a, b| (a.namespace, a.name).cmp(&(b.namespace, b.name)));

    // Existing region directories by fabric name, then namespace.
    let mut directories: BTreeMap<&str, BTreeMap<&str, &ConfigMap>> = BTreeMap::new();
    for cm in &world.config_maps {
        let Some(fabric) = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(FABRIC_LABEL))
        else {
            continue;
        };
        if cm.metadata.name.as_deref() != Some(writes::region_directory_name(fabric).as_str()) {
            continue;
        }
        directories
            .entry(fabric)
            .or_default()
            .insert(cm.metadata.namespace.as_deref().unwrap_or_default(), cm);
    }

    let mut roce_node_writes = Vec::new();
    let mut pod_writes = Vec::new();
    let mut directory_writes = Vec::new();
    let mut status_writes = Vec::new();
    let mut fabric_events = Vec::new();
    let mut pod_events = Vec::new();
    let mut freed = FreedRegions::default();
    // The takeover hold: see `PlanOptions::hold_after_takeover`.
    let since = world.freed.since.unwrap_or(world.now);
    freed.since = Some(since);
    freed.hold_until = opts
        .hold_after_takeover
        .then(|| {
            since
                .checked_add(
                    SignedDuration::try_from(opts.region_grace).unwrap_or(SignedDuration::MAX),
                )
                .unwrap_or(Timestamp::MAX)
        })
        .filter(|until| *until > world.now);
    let mut report = PlanReport::default();
    let mut node_reports: Vec<NodeReport> = Vec::new();
    let no_dirs = BTreeMap::new();

    let mut by_name: Vec<usize> = (0..fabrics.len()).collect();
    by_name.sort_by_key(|&f| fabrics[f].name);
    for &fi in &by_name {
        let f = &fabrics[fi];
        let owned = &own.owned[fi];
        let mut fr = report_start(f, owned.len(), own.conflicting[fi].len());
        if !f.active() {
            if let Some(old) = world.freed.fabrics.get(f.name) {
                freed.fabrics.insert(f.name.to_string(), old.clone());
            }
            if !f.deleting {
                let (write, events) = status::invalid_status(f, &now);
                status_writes.extend(write);
                fabric_events.extend(events);
            }
            if opts.detailed_report {
                node_reports.extend(owned.iter().map(|&n| NodeReport {
                    name: node_name(&world.nodes[n]).to_string(),
                    fabric: f.name.to_string(),
                    conflicts_with: Vec::new(),
                    action: NodeAction::Untouched,
                    state: NodeState::Pending,
                }));
            }
            report.fabrics.push(fr);
            continue;
        }

        let r = rollout::plan_rollout(f, owned, &world.nodes, &roce_nodes);
        roce_node_writes.extend(r.writes);
        if opts.detailed_report {
            node_reports.extend(owned.iter().zip(&r.nodes).map(|(&n, &(action, state))| {
                NodeReport {
                    name: node_name(&world.nodes[n]).to_string(),
                    fabric: f.name.to_string(),
                    conflicts_with: Vec::new(),
                    action,
                    state,
                }
            }));
        }

        let fabric_dirs = directories.get(f.name).unwrap_or(&no_dirs);
        let regions = match &f.pods {
            Some(sel) => pods::plan_regions(
                f,
                sel.geometry,
                std::mem::take(&mut fabric_pods[fi]),
                fabric_dirs,
                world.freed.fabrics.get(f.name),
                world.now,
                opts.region_grace,
                freed.hold_until,
                opts.detailed_report,
            ),
            None => {
                // No shared memory (any more): its directories go.
                let mut out = RegionsOutcome::default();
                out.directory_writes.extend(fabric_dirs.keys().map(|ns| {
                    Write::DeleteRegionDirectory {
                        namespace: ns.to_string(),
                        fabric: f.name.to_string(),
                    }
                }));
                out
            }
        };
        let region_counts = RegionCounts {
            allocated: regions.live_slots,
            capacity: fr.region_capacity,
        };
        let conflicting: Vec<(String, String)> = own.conflicting[fi]
            .iter()
            .map(|&n| {
                let owner = own.owner[n].map(|o| fabrics[o].name).unwrap_or_default();
                (node_name(&world.nodes[n]).to_string(), owner.to_string())
            })
            .collect();
        let facts = status::Facts {
            rollout: r.counts.clone(),
            conflicting,
            regions: region_counts,
            exhausted: regions.exhausted,
            bad_requests: regions.bad_requests,
            too_large: regions.too_large,
            conflicts: regions.conflicts,
            over_quota: regions.over_quota,
        };
        let (write, events) = status::valid_status(f, &facts, &now);
        status_writes.extend(write);
        fabric_events.extend(events);

        report_active(
            &mut fr,
            f,
            &facts,
            (
                regions.live_slots,
                regions.region_count,
                regions.cooling_slots,
            ),
        );
        report.fabrics.push(fr);
        if let (Some(keep), Some(_)) = (keep.as_deref_mut(), &f.pods) {
            keep.insert(
                f.name.to_string(),
                RegionFindings {
                    exhausted: facts.exhausted.clone(),
                    bad_requests: facts.bad_requests.clone(),
                    over_quota: facts.over_quota.clone(),
                    conflicts: facts.conflicts.clone(),
                    too_large: facts.too_large.clone(),
                    events: regions.events.len(),
                },
            );
        }
        report.regions.extend(regions.regions);
        report.waiting_pods.extend(regions.waiting);
        pod_writes.extend(regions.pod_writes);
        directory_writes.extend(regions.directory_writes);
        pod_events.extend(regions.events);
        if f.pods.is_some() {
            freed.fabrics.insert(f.name.to_string(), regions.ledger);
        }
    }

    // RoceNodes no fabric keeps: the node is gone, left every selection, or its fabric is gone.
    let mut deletes = Vec::new();
    for (name, rn) in &roce_nodes {
        let node = node_exists.get(name).copied();
        if node.is_some_and(|n| own.owner[n].is_some()) {
            continue; // its owner applies (or deliberately leaves) it
        }
        let recorded = fabric_by_name
            .get(rn.spec.fabric.as_str())
            .map(|&f| &fabrics[f]);
        if node.is_some() && recorded.is_some_and(|f| !f.active()) {
            continue; // an invalid or deleting fabric's node stays as it is
        }
        deletes.push(name.to_string());
    }
    deletes.sort();

    // Directories of fabrics that no longer exist.
    for (fabric, dirs) in &directories {
        if !fabric_by_name.contains_key(fabric) {
            directory_writes.extend(dirs.keys().map(|ns| Write::DeleteRegionDirectory {
                namespace: ns.to_string(),
                fabric: fabric.to_string(),
            }));
        }
    }

    roce_node_writes.sort_by(|a, b| write_name(a).cmp(write_name(b)));
    pod_writes.sort_by(|a, b| a.0.cmp(&b.0));
    directory_writes.sort_by(|a, b| directory_order(a).cmp(&directory_order(b)));
    let mut writes: Vec<Write> = deletes
        .iter()
        .map(|name| Write::DeleteRoceNode { name: name.clone() })
        .collect();
    writes.extend(roce_node_writes);
    writes.extend(pod_writes.into_iter().flat_map(|(_, w)| w));
    writes.extend(directory_writes);
    writes.extend(status_writes);
    writes.extend(fabric_events.into_iter().map(Write::Event));
    for p in &unmatched {
        let uid = p.pod.metadata.uid.clone().unwrap_or_else(|| p.key());
        if !world.freed.unmatched.contains(&uid) {
            pod_events.push(pods::unmatched_event(p));
        }
        freed.unmatched.insert(uid);
    }
    writes.extend(pod_events.into_iter().map(Write::Event));

    if opts.detailed_report {
        for nr in &mut node_reports {
            if let Some(&n) = node_exists.get(nr.name.as_str())
                && let Some(losers) = own.losers.get(&n)
            {
                nr.conflicts_with = losers
                    .iter()
                    .map(|&f| fabrics[f].name.to_string())
                    .collect();
            }
        }
        node_reports.sort_by(|a, b| a.name.cmp(&b.name));
        report.nodes = node_reports;
        report
            .regions
            .sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
        report
            .waiting_pods
            .sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    }
    report.deleted_roce_nodes = deletes;

    let requeue_after = freed.next_expiry(world.now);
    for f in &report.fabrics {
        tracing::debug!(
            fabric = %f.name,
            valid = f.valid,
            selected = f.selected_nodes,
            configured = f.configured_nodes,
            failed = f.failed_nodes,
            in_progress = f.in_progress_nodes,
            waiting = f.waiting_nodes,
            conflicting = f.conflicting_nodes,
            regions = f.regions_allocated,
            pods_waiting = f.pods_waiting,
            "fabric planned"
        );
    }
    tracing::debug!(
        fabrics = world.fabrics.len(),
        nodes = world.nodes.len(),
        pods = world.pods.len(),
        writes = writes.len(),
        requeue_after_s = requeue_after.map(|d| d.as_secs()),
        "plan computed"
    );
    Plan {
        writes,
        report,
        freed,
        requeue_after,
    }
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
