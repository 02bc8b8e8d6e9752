//! The indexes rebuilt from a full pass: the fabrics parsed once, each node to its owner, each
//! live pod to its fabric, and per fabric with shared memory the region index of
//! [`super::regions`], seeded with the pass's writes and findings.

use std::collections::{BTreeMap, HashMap};

use crate::objects::{CompactPod, CompactRoceNode};
use rocefabric_api::validate::FieldError;

use super::super::pod::{self, PodRef};
use super::super::selection::{self, ParsedFabric, Route, Router};
use super::super::writes::Write;
use super::super::{Plan, RegionFindings, World};
use super::nodes::{NodeSelectors, Rollout};
use super::regions::{FullPass, PodKey, Regions};
use super::{State, unmatched_id};

/// The writes of a full pass that the region indexes take over: by pod, and by fabric then
/// namespace.
struct PassWrites {
    pods: HashMap<PodKey, Vec<Write>>,
    directories: HashMap<String, BTreeMap<String, Write>>,
}

impl State {
    /// The indexes of `plan`, the full pass over `world` (`findings`: what its region planning
    /// found per fabric; `roce_node`: a RoceNode of `world` by name).
    pub(super) fn build<'w>(
        world: &'w World,
        plan: &Plan,
        mut findings: HashMap<String, RegionFindings>,
        roce_node: &dyn Fn(&str) -> Option<&'w CompactRoceNode>,
    ) -> Self {
        let validation: Vec<_> = world
            .fabrics
            .iter()
            .map(selection::validation_errors)
            .collect();
        let parsed: Vec<ParsedFabric<'_>> = world
            .fabrics
            .iter()
            .zip(&validation)
            .map(|(f, errors)| ParsedFabric::checked(f, errors.clone()))
            .collect();
        let mut state = State::empty(&parsed, validation, plan);
        for node in &world.nodes {
            let name = node.name.clone();
            let owner = state.selectors.owner_of(node);
            state.move_node(&name, owner, roce_node(&name));
        }
        let mut routed = state.route_pods(world);
        let mut writes = state.split_writes(plan, &parsed);
        for (f, fabric) in parsed.iter().enumerate() {
            let Some(ledger) = plan.freed.fabrics.get(fabric.name) else {
                continue;
            };
            let (Some(sel), true) = (&fabric.pods, fabric.active()) else {
                state
                    .kept_ledgers
                    .insert(fabric.name.to_string(), ledger.clone());
                continue;
            };
            let report = plan
                .report
                .fabrics
                .iter()
                .find(|r| r.name == fabric.name)
                .cloned()
                .unwrap_or_default();
            let pods = std::mem::take(&mut routed[f]);
            let pod_writes = writes.of_pods(&pods);
            state.regions[f] = Some(Regions::build(FullPass {
                fabric: fabric.name,
                uid: fabric.uid,
                geometry: sel.geometry,
                per_pod: sel.per_pod,
                per_namespace: sel.per_namespace,
                pods,
                ledger: ledger.clone(),
                findings: findings.remove(fabric.name).unwrap_or_default(),
                pod_writes,
                dir_writes: writes.directories.remove(fabric.name).unwrap_or_default(),
                live_slots: report.regions_allocated,
                region_count: report.region_count,
                cooling_slots: report.regions_cooling,
            }));
        }
        state
    }

    /// The indexes of the fabrics alone (no node placed, no pod routed yet).
    fn empty(parsed: &[ParsedFabric<'_>], validation: Vec<Vec<FieldError>>, plan: &Plan) -> Self {
        let age = selection::age_order(parsed);
        let n = parsed.len();
        State {
            router: Router::new(parsed, &age),
            selectors: NodeSelectors::new(parsed, &age),
            fabric_by_name: parsed
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.to_string(), i))
                .collect(),
            active: parsed.iter().map(ParsedFabric::active).collect(),
            owners: HashMap::new(),
            owned: vec![0; n],
            conflicting: vec![BTreeMap::new(); n],
            rollouts: parsed
                .iter()
                .map(|f| f.active().then(|| Rollout::new(f)))
                .collect(),
            regions: (0..n).map(|_| None).collect(),
            deletes: plan.report.deleted_roce_nodes.iter().cloned().collect(),
            unmatched: BTreeMap::new(),
            told: plan.freed.unmatched.clone(),
            other_directory_writes: Vec::new(),
            kept_ledgers: BTreeMap::new(),
            validation,
            since: plan.freed.since,
        }
    }

    /// The live pods by fabric; gated pods no fabric selects go to `unmatched`.
    fn route_pods<'w>(&mut self, world: &'w World) -> Vec<Vec<&'w CompactPod>> {
        let mut routed: Vec<Vec<&CompactPod>> = vec![Vec::new(); self.active.len()];
        for pod in world.pods.iter().filter(|p| pod::is_live(p)) {
            let p = PodRef::new(pod);
            match self.router.route(&p) {
                Route::To(f) => routed[f].push(pod),
                Route::Unmatched => {
                    self.unmatched.insert(
                        (p.namespace.to_string(), p.name.to_string()),
                        unmatched_id(&p),
                    );
                }
                Route::Skip => {}
            }
        }
        routed
    }

    /// The pass's pod and directory writes, for the region indexes; directory writes of
    /// fabrics without regions here are kept as they are.
    fn split_writes(&mut self, plan: &Plan, parsed: &[ParsedFabric<'_>]) -> PassWrites {
        let mut writes = PassWrites {
            pods: HashMap::new(),
            directories: HashMap::new(),
        };
        for w in &plan.writes {
            match w {
                Write::AnnotatePodRegion { namespace, pod, .. }
                | Write::RemovePodGate { namespace, pod, .. } => writes
                    .pods
                    .entry((namespace.clone(), pod.clone()))
                    .or_default()
                    .push(w.clone()),
                Write::ApplyRegionDirectory {
                    namespace, fabric, ..
                }
                | Write::DeleteRegionDirectory { namespace, fabric } => {
                    let regions_here = self
                        .fabric_by_name
                        .get(fabric)
                        .is_some_and(|&f| parsed[f].active() && parsed[f].pods.is_some());
                    if regions_here {
                        writes
                            .directories
                            .entry(fabric.clone())
                            .or_default()
                            .insert(namespace.clone(), w.clone());
                    } else {
                        self.other_directory_writes.push(w.clone());
                    }
                }
                _ => {}
            }
        }
        writes
    }
}

impl PassWrites {
    /// The writes of `pods`, taken out, by namespace and name.
    fn of_pods(&mut self, pods: &[&CompactPod]) -> BTreeMap<PodKey, Vec<Write>> {
        let mut writes = BTreeMap::new();
        for pod in pods {
            let key = (pod.namespace.to_string(), pod.name.clone());
            if let Some(w) = self.pods.remove(&key) {
                writes.insert(key, w);
            }
        }
        writes
    }
}
