//! One full pass over a world, in steps: index it once (fabrics parsed and in age order, each
//! node to its owner, each live pod to its fabric, the region directories by fabric), plan each
//! fabric in name order (rollout, regions, status), then put the writes in order and finish
//! the report.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rocefabric_api::RegionCounts;
use rocefabric_api::constants::FABRIC_LABEL;

use super::pod::{self, PodRef};
use super::pods::{self, RegionsOutcome};
use super::rollout::{self, node_name};
use super::selection::{self, Ownership, ParsedFabric, Route};
use super::{
    Event, NodeAction, NodeReport, NodeState, Plan, PlanOptions, PlanReport, RegionFindings, World,
    Write, directory_order, report_active, report_start, status, write_name, writes,
};
use crate::objects::CompactRoceNode;
use crate::regions::FreedRegions;

/// [`super::plan`], also filling `keep` with each active shared-memory fabric's findings.
pub(crate) fn plan_keeping(
    world: &World,
    opts: &PlanOptions,
    mut keep: Option<&mut HashMap<String, RegionFindings>>,
) -> Plan {
    let mut pass = Pass::index(world, opts);
    let mut by_name: Vec<usize> = (0..pass.fabrics.len()).collect();
    by_name.sort_by_key(|&f| pass.fabrics[f].name);
    for fi in by_name {
        if !pass.fabrics[fi].active() {
            pass.inactive_fabric(fi);
            continue;
        }
        let findings = pass.active_fabric(fi);
        if let (Some(keep), Some((name, findings))) = (keep.as_deref_mut(), findings) {
            keep.insert(name, findings);
        }
    }
    pass.finish()
}

/// A pass under way: the world as indexed once, and what the fabrics' plans gathered.
struct Pass<'w> {
    world: &'w World,
    opts: &'w PlanOptions,
    now: Time,
    fabrics: Vec<ParsedFabric<'w>>,
    fabric_by_name: HashMap<&'w str, usize>,
    /// Node index by name.
    node_exists: HashMap<&'w str, usize>,
    roce_nodes: HashMap<&'w str, &'w CompactRoceNode>,
    own: Ownership,
    /// Per fabric: the live pods routed to it (taken when its regions are planned).
    fabric_pods: Vec<Vec<PodRef<'w>>>,
    /// Gated pods no fabric selects, by namespace and name.
    unmatched: Vec<PodRef<'w>>,
    /// Existing region directories by fabric name, then namespace.
    directories: BTreeMap<&'w str, BTreeMap<&'w str, &'w ConfigMap>>,
    gathered: Gathered,
}

/// What the fabrics' plans gathered, before the writes are put in order.
#[derive(Default)]
struct Gathered {
    roce_node_writes: Vec<Write>,
    /// Per pod, its writes, keyed by namespace and name.
    pod_writes: Vec<((String, String), Vec<Write>)>,
    directory_writes: Vec<Write>,
    status_writes: Vec<Write>,
    fabric_events: Vec<Event>,
    pod_events: Vec<Event>,
    freed: FreedRegions,
    report: PlanReport,
    node_reports: Vec<NodeReport>,
}

impl<'w> Pass<'w> {
    /// Read `world` once: fabrics, node ownership, pod routes and directories.
    fn index(world: &'w World, opts: &'w PlanOptions) -> Self {
        let fabrics: Vec<ParsedFabric<'w>> = world.fabrics.iter().map(ParsedFabric::new).collect();
        let age = selection::age_order(&fabrics);
        let fabric_by_name = fabrics
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name, i))
            .collect();
        let mut nodes_by_name: Vec<usize> = (0..world.nodes.len()).collect();
        nodes_by_name.sort_by(|&a, &b| node_name(&world.nodes[a]).cmp(node_name(&world.nodes[b])));
        let node_exists = world
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (node_name(n), i))
            .collect();
        let roce_nodes = world
            .roce_nodes
            .iter()
            .map(|rn| (rn.name.as_str(), rn))
            .collect();
        let own = selection::assign_nodes(&fabrics, &age, &world.nodes, &nodes_by_name);
        let (fabric_pods, unmatched) = route_pods(world, &fabrics, &age);
        Self {
            world,
            opts,
            now: Time(world.now),
            fabrics,
            fabric_by_name,
            node_exists,
            roce_nodes,
            own,
            fabric_pods,
            unmatched,
            directories: directories_by_fabric(world),
            gathered: Gathered {
                freed: takeover_hold(world, opts),
                ..Gathered::default()
            },
        }
    }

    /// A fabric that is invalid or being deleted: its memory is kept, its nodes untouched, and
    /// an invalid one's status says why.
    fn inactive_fabric(&mut self, fi: usize) {
        let f = &self.fabrics[fi];
        let owned = &self.own.owned[fi];
        let fr = report_start(f, owned.len(), self.own.conflicting[fi].len());
        let g = &mut self.gathered;
        if let Some(old) = self.world.freed.fabrics.get(f.name) {
            g.freed.fabrics.insert(f.name.to_string(), old.clone());
        }
        if !f.deleting {
            let (write, events) = status::invalid_status(f, &self.now);
            g.status_writes.extend(write);
            g.fabric_events.extend(events);
        }
        if self.opts.detailed_report {
            g.node_reports.extend(owned.iter().map(|&n| NodeReport {
                name: node_name(&self.world.nodes[n]).to_string(),
                fabric: f.name.to_string(),
                conflicts_with: Vec::new(),
                action: NodeAction::Untouched,
                state: NodeState::Pending,
            }));
        }
        g.report.fabrics.push(fr);
    }

    /// An active fabric: its rollout, its regions and its status. Returns the region findings
    /// of a fabric with shared memory, by its name.
    fn active_fabric(&mut self, fi: usize) -> Option<(String, RegionFindings)> {
        let f = &self.fabrics[fi];
        let owned = &self.own.owned[fi];
        let mut fr = report_start(f, owned.len(), self.own.conflicting[fi].len());
        let r = rollout::plan_rollout(f, owned, &self.world.nodes, &self.roce_nodes);
        let pods = std::mem::take(&mut self.fabric_pods[fi]);
        let regions = self.regions(f, pods);
        let facts = status::Facts {
            rollout: r.counts.clone(),
            conflicting: self.conflicting(fi),
            regions: RegionCounts {
                allocated: regions.live_slots,
                capacity: fr.region_capacity,
            },
            exhausted: regions.exhausted,
            bad_requests: regions.bad_requests,
            too_large: regions.too_large,
            conflicts: regions.conflicts,
            over_quota: regions.over_quota,
            window_failed: regions.window_failed,
        };
        let (write, events) = status::valid_status(f, &facts, &self.now);
        let figures = (
            regions.live_slots,
            regions.region_count,
            regions.cooling_slots,
        );
        report_active(&mut fr, f, &facts, figures);
        let findings = f.pods.as_ref().map(|_| {
            let findings = RegionFindings {
                exhausted: facts.exhausted.clone(),
                bad_requests: facts.bad_requests.clone(),
                over_quota: facts.over_quota.clone(),
                conflicts: facts.conflicts.clone(),
                too_large: facts.too_large.clone(),
                window_failed: facts.window_failed.clone(),
                events: regions.events.len(),
            };
            (f.name.to_string(), findings)
        });

        let g = &mut self.gathered;
        g.roce_node_writes.extend(r.writes);
        if self.opts.detailed_report {
            let rows = owned
                .iter()
                .zip(&r.nodes)
                .map(|(&n, &(action, state))| NodeReport {
                    name: node_name(&self.world.nodes[n]).to_string(),
                    fabric: f.name.to_string(),
                    conflicts_with: Vec::new(),
                    action,
                    state,
                });
            g.node_reports.extend(rows);
        }
        g.status_writes.extend(write);
        g.fabric_events.extend(events);
        g.report.fabrics.push(fr);
        g.report.regions.extend(regions.regions);
        g.report.waiting_pods.extend(regions.waiting);
        g.pod_writes.extend(regions.pod_writes);
        g.directory_writes.extend(regions.directory_writes);
        g.pod_events.extend(regions.events);
        if f.pods.is_some() {
            g.freed.fabrics.insert(f.name.to_string(), regions.ledger);
        }
        findings
    }

    /// The regions of active fabric `f` over its routed `pods`; without shared memory (any
    /// more) its directories go.
    fn regions(&self, f: &ParsedFabric<'w>, pods: Vec<PodRef<'w>>) -> RegionsOutcome {
        let no_dirs = BTreeMap::new();
        let fabric_dirs = self.directories.get(f.name).unwrap_or(&no_dirs);
        let Some(sel) = &f.pods else {
            let mut out = RegionsOutcome::default();
            out.directory_writes.extend(fabric_dirs.keys().map(|ns| {
                Write::DeleteRegionDirectory {
                    namespace: ns.to_string(),
                    fabric: f.name.to_string(),
                }
            }));
            return out;
        };
        pods::plan_regions(pods::RegionInputs {
            fabric: f,
            geometry: sel.geometry,
            pods,
            directories: fabric_dirs,
            old: self.world.freed.fabrics.get(f.name),
            now: self.world.now,
            grace: self.opts.region_grace,
            hold_until: self.gathered.freed.hold_until,
            detailed: self.opts.detailed_report,
        })
    }

    /// Nodes fabric `fi` selects that an older fabric owns: (node, owning fabric).
    fn conflicting(&self, fi: usize) -> Vec<(String, String)> {
        self.own.conflicting[fi]
            .iter()
            .map(|&n| {
                let owner = self.own.owner[n]
                    .map(|o| self.fabrics[o].name)
                    .unwrap_or_default();
                (
                    node_name(&self.world.nodes[n]).to_string(),
                    owner.to_string(),
                )
            })
            .collect()
    }

    /// RoceNodes no fabric keeps, by name: the node is gone, left every selection, or its
    /// fabric is gone.
    fn orphaned_roce_nodes(&self) -> Vec<String> {
        let mut deletes = Vec::new();
        for (name, rn) in &self.roce_nodes {
            let node = self.node_exists.get(name).copied();
            if node.is_some_and(|n| self.own.owner[n].is_some()) {
                continue; // its owner applies (or deliberately leaves) it
            }
            let recorded = self
                .fabric_by_name
                .get(rn.spec.fabric.as_str())
                .map(|&f| &self.fabrics[f]);
            if node.is_some() && recorded.is_some_and(|f| !f.active()) {
                continue; // an invalid or deleting fabric's node stays as it is
            }
            deletes.push(name.to_string());
        }
        deletes.sort();
        deletes
    }

    /// The writes in order, the report finished, and the memory for the next pass.
    fn finish(self) -> Plan {
        let deletes = self.orphaned_roce_nodes();
        let mut g = self.gathered;
        // Directories of fabrics that no longer exist.
        for (fabric, dirs) in &self.directories {
            if !self.fabric_by_name.contains_key(fabric) {
                g.directory_writes
                    .extend(dirs.keys().map(|ns| Write::DeleteRegionDirectory {
                        namespace: ns.to_string(),
                        fabric: fabric.to_string(),
                    }));
            }
        }
        // Gated pods no fabric selects are told so, once each.
        for p in &self.unmatched {
            let uid = p.pod.uid.clone().unwrap_or_else(|| p.key());
            if !self.world.freed.unmatched.contains(&uid) {
                g.pod_events.push(pods::unmatched_event(p));
            }
            g.freed.unmatched.insert(uid);
        }
        if self.opts.detailed_report {
            let mut node_reports = std::mem::take(&mut g.node_reports);
            for nr in &mut node_reports {
                if let Some(&n) = self.node_exists.get(nr.name.as_str())
                    && let Some(losers) = self.own.losers.get(&n)
                {
                    nr.conflicts_with = losers
                        .iter()
                        .map(|&f| self.fabrics[f].name.to_string())
                        .collect();
                }
            }
            sort_report(&mut g.report, node_reports);
        }
        let writes = ordered_writes(&deletes, &mut g);
        g.report.deleted_roce_nodes = deletes;
        let requeue_after = g.freed.next_expiry(self.world.now);
        log_plan(self.world, &g.report, writes.len(), requeue_after);
        Plan {
            writes,
            report: g.report,
            freed: g.freed,
            requeue_after,
        }
    }
}

/// Route every live pod to the fabric whose region it holds or gets (per fabric index), and
/// list the gated pods no fabric selects (by namespace and name).
#[allow(clippy::type_complexity)]
fn route_pods<'w>(
    world: &'w World,
    fabrics: &[ParsedFabric<'w>],
    age: &[usize],
) -> (Vec<Vec<PodRef<'w>>>, Vec<PodRef<'w>>) {
    let mut unmatched: Vec<PodRef<'w>> = Vec::new();
    let mut fabric_pods: Vec<Vec<PodRef<'w>>> = (0..fabrics.len()).map(|_| Vec::new()).collect();
    let router = selection::Router::new(fabrics, age);
    for pod in world.pods.iter().filter(|p| pod::is_live(p)) {
        let p = PodRef::new(pod);
        match router.route(&p) {
            Route::To(f) => fabric_pods[f].push(p),
            Route::Unmatched => unmatched.push(p),
            Route::Skip => {}
        }
    }
    unmatched.sort_by(|a, b| (a.namespace, a.name).cmp(&(b.namespace, b.name)));
    (fabric_pods, unmatched)
}

/// Existing region directories by fabric name, then namespace.
fn directories_by_fabric(world: &World) -> BTreeMap<&str, BTreeMap<&str, &ConfigMap>> {
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
    directories
}

/// The memory this pass starts: since when this leader plans, and the takeover hold (see
/// `PlanOptions::hold_after_takeover`).
fn takeover_hold(world: &World, opts: &PlanOptions) -> FreedRegions {
    let mut freed = FreedRegions::default();
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
    freed
}

/// The writes in the order of [`Plan::writes`], taken from `g`.
fn ordered_writes(deletes: &[String], g: &mut Gathered) -> Vec<Write> {
    g.roce_node_writes
        .sort_by(|a, b| write_name(a).cmp(write_name(b)));
    g.pod_writes.sort_by(|a, b| a.0.cmp(&b.0));
    g.directory_writes
        .sort_by(|a, b| directory_order(a).cmp(&directory_order(b)));
    let mut writes: Vec<Write> = deletes
        .iter()
        .map(|name| Write::DeleteRoceNode { name: name.clone() })
        .collect();
    writes.append(&mut g.roce_node_writes);
    writes.extend(
        std::mem::take(&mut g.pod_writes)
            .into_iter()
            .flat_map(|(_, w)| w),
    );
    writes.append(&mut g.directory_writes);
    writes.append(&mut g.status_writes);
    writes.extend(
        std::mem::take(&mut g.fabric_events)
            .into_iter()
            .map(Write::Event),
    );
    writes.extend(
        std::mem::take(&mut g.pod_events)
            .into_iter()
            .map(Write::Event),
    );
    writes
}

/// The detailed report's rows in order: nodes by name, regions and waiting pods by namespace
/// and name.
fn sort_report(report: &mut PlanReport, mut node_reports: Vec<NodeReport>) {
    node_reports.sort_by(|a, b| a.name.cmp(&b.name));
    report.nodes = node_reports;
    report
        .regions
        .sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    report
        .waiting_pods
        .sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
}

fn log_plan(
    world: &World,
    report: &PlanReport,
    writes: usize,
    requeue_after: Option<std::time::Duration>,
) {
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
        writes,
        requeue_after_s = requeue_after.map(|d| d.as_secs()),
        "plan computed"
    );
}
