//! The planner kept warm: [`Incremental`] holds the objects the planner reads and the indexes of
//! its last plan, takes one change at a time (an object added, changed or deleted) and updates
//! the indexes in time proportional to the change. [`Incremental::plan`] then reads the writes
//! off the indexes: a pass with nothing to do costs the fabrics' statuses, not the world.
//!
//! [`super::plan`] stays the reference. Changes whose outcome the indexes cannot give with
//! certainty (a fabric edited, a pod inserted before others waiting for a window, a window freed
//! while pods wait, a conflict) make the next plan a full pass, after which the indexes are
//! rebuilt from it. The property test `operator/tests/incremental.rs` checks that both give the
//! same plan after any sequence of changes.

mod keyed;
mod nodes;
mod regions;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::{RegionCounts, RoceFabric, RoceNode};

use super::pod::{self, PodRef};
use super::pods;
use super::report::PlanReport;
use super::rollout::RolloutCounts;
use super::selection::{self, ParsedFabric, Route, Router};
use super::writes::{Write, region_directory_name};
use super::{Plan, PlanOptions, RegionFindings, World, directory_order, status};
use crate::regions::{FreedRegions, Ledger};
use keyed::Keyed;
use nodes::{NodeSelectors, Owner, Rollout};
use regions::{FullPass, PodKey, Regions, Step};

/// How the planner has been working, for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Plans computed as a full pass.
    pub full_passes: u64,
    /// Plans read off the indexes.
    pub incremental_plans: u64,
    /// Changes the indexes took.
    pub changes: u64,
    /// Changes that asked for a full pass.
    pub fallbacks: u64,
}

/// The planner with its memory and indexes. Feed it every change of the objects the planner
/// reads; call [`Self::plan`] for each pass.
pub struct Incremental {
    opts: PlanOptions,
    fabrics: Vec<RoceFabric>,
    nodes: Keyed<String, Node>,
    roce_nodes: Keyed<String, RoceNode>,
    pods: Keyed<PodKey, Pod>,
    config_maps: Keyed<PodKey, ConfigMap>,
    /// `None`: the next plan is a full pass.
    state: Option<State>,
    /// The memory for the next full pass while `state` is `None`.
    freed: FreedRegions,
    figures: Figures,
    /// The fabrics' custom pod selectors (see [`Self::wants_pod`]), parsed and as written.
    pod_selectors: Vec<kube::core::Selector>,
    pod_selector_specs: Vec<LabelSelector>,
    /// A selector came that was not there before: pods dropped by `wants_pod` may match it.
    selectors_grew: bool,
}

/// The indexes of the last plan.
struct State {
    router: Router,
    selectors: NodeSelectors,
    fabric_by_name: HashMap<String, usize>,
    active: Vec<bool>,
    owners: HashMap<String, Owner>,
    owned: Vec<usize>,
    /// Per fabric: nodes it selects that an older fabric owns -> that owner.
    conflicting: Vec<BTreeMap<String, usize>>,
    rollouts: Vec<Option<Rollout>>,
    regions: Vec<Option<Regions>>,
    deletes: BTreeSet<String>,
    /// Gated pods no fabric selects -> the id they are told by.
    unmatched: BTreeMap<PodKey, String>,
    /// Ids told at the last plan.
    told: BTreeSet<String>,
    /// Directory writes of fabrics that are gone or have no shared memory.
    other_directory_writes: Vec<Write>,
    /// Memory of inactive fabrics, kept as it was.
    kept_ledgers: BTreeMap<String, Ledger>,
    /// Per fabric: what validation found (a status change does not change it).
    validation: Vec<Vec<rocefabric_api::validate::FieldError>>,
    since: Option<Timestamp>,
}

impl Incremental {
    pub fn new(opts: PlanOptions) -> Self {
        Self {
            opts,
            fabrics: Vec::new(),
            nodes: Keyed::new(|n: &Node| name_key(&n.metadata)),
            roce_nodes: Keyed::new(|n: &RoceNode| name_key(&n.metadata)),
            pods: Keyed::new(|p: &Pod| object_key(&p.metadata)),
            config_maps: Keyed::new(|c: &ConfigMap| object_key(&c.metadata)),
            state: None,
            freed: FreedRegions::default(),
            figures: Figures::default(),
            pod_selectors: Vec::new(),
            pod_selector_specs: Vec::new(),
            selectors_grew: false,
        }
    }

    /// Whether the planner can ever act on `pod`: labelled for a fabric, holding a region,
    /// gated by us, or picked by a fabric's custom pod selector. Other pods (most of a large
    /// cluster) are not held at all; when a new custom selector comes, the pods are listed
    /// again ([`Self::take_selectors_grew`]).
    pub fn wants_pod(&self, pod: &Pod) -> bool {
        let meta = &pod.metadata;
        let labels = selection::labels_of(meta.labels.as_ref());
        labels.contains_key(FABRIC_LABEL)
            || meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(rocefabric_api::constants::REGION_ANNOTATION))
            || PodRef::new(pod).gated()
            || self
                .pod_selectors
                .iter()
                .any(|s| kube::core::SelectorExt::matches(s, labels))
    }

    /// Whether a custom pod selector came since last asked (the pods must be listed again).
    pub fn take_selectors_grew(&mut self) -> bool {
        std::mem::take(&mut self.selectors_grew)
    }

    fn fabrics_changed(&mut self) {
        let specs: Vec<LabelSelector> = self
            .fabrics
            .iter()
            .filter_map(|f| f.spec.shared_memory.as_ref())
            .filter(|sm| !selection::is_empty_selector(&sm.pod_selector))
            .map(|sm| sm.pod_selector.clone())
            .collect();
        if specs.iter().any(|s| !self.pod_selector_specs.contains(s)) {
            self.selectors_grew = true;
        }
        self.pod_selectors = specs
            .iter()
            .filter_map(|s| selection::parse_selector(s).ok())
            .collect();
        self.pod_selector_specs = specs;
    }

    pub fn figures(&self) -> Figures {
        self.figures
    }

    /// Objects held: (fabrics, nodes, RoceNodes, pods, region directories).
    pub fn sizes(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.fabrics.len(),
            self.nodes.len(),
            self.roce_nodes.len(),
            self.pods.len(),
            self.config_maps.len(),
        )
    }

    /// A pod as held.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.get(&(namespace.to_string(), name.to_string()))
    }

    /// A fabric as held.
    pub fn fabric(&self, name: &str) -> Option<&RoceFabric> {
        self.fabrics
            .iter()
            .find(|f| f.metadata.name.as_deref() == Some(name))
    }

    /// The world as held now (for the reference planner and `plan`'s snapshots).
    pub fn world(&self, now: Timestamp) -> World {
        World {
            fabrics: self.fabrics.clone(),
            nodes: self.nodes.values().cloned().collect(),
            roce_nodes: self.roce_nodes.values().cloned().collect(),
            pods: self.pods.values().cloned().collect(),
            config_maps: self.config_maps.values().cloned().collect(),
            now,
            freed: self.memory(),
        }
    }

    /// The allocator memory as of the last plan (what [`Plan::freed`] of a full pass holds).
    pub fn memory(&self) -> FreedRegions {
        let Some(state) = &self.state else {
            return self.freed.clone();
        };
        let mut fabrics = state.kept_ledgers.clone();
        for r in state.regions.iter().flatten() {
            fabrics.insert(r.fabric.clone(), r.ledger());
        }
        FreedRegions {
            fabrics,
            since: state.since,
            hold_until: None,
            unmatched: state.told.clone(),
        }
    }

    fn fall_back(&mut self) {
        if self.state.is_some() {
            self.freed = self.memory();
            self.state = None;
            self.figures.fallbacks += 1;
        }
    }

    fn step(&mut self, step: Step) {
        self.figures.changes += 1;
        if step == Step::Full {
            self.fall_back();
        }
    }

    // --- RoceFabrics: any change is a full pass.

    pub fn upsert_fabric(&mut self, fabric: RoceFabric) {
        let name = fabric.metadata.name.clone();
        let step = match self.fabrics.iter_mut().find(|f| f.metadata.name == name) {
            Some(f) => {
                // Only its status changed (our own write, seen): the statuses are computed
                // from the objects at each plan anyway.
                let same = same_fabric_but_status(f, &fabric);
                *f = fabric;
                if same { Step::Done } else { Step::Full }
            }
            None => {
                self.fabrics.push(fabric);
                Step::Full
            }
        };
        self.fabrics_changed();
        self.step(step);
    }

    pub fn remove_fabric(&mut self, name: &str) {
        self.fabrics
            .retain(|f| f.metadata.name.as_deref() != Some(name));
        self.fabrics_changed();
        self.step(Step::Full);
    }

    // --- Nodes.

    pub fn upsert_node(&mut self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let owner = self.state.as_ref().map(|s| s.selectors.owner_of(&node));
        self.nodes.insert(node);
        if let (Some(owner), Some(state)) = (owner, self.state.as_mut()) {
            let rn = self.roce_nodes.get(&name);
            state.move_node(&name, owner, rn);
            state.refresh_delete(&name, true, rn);
        }
        self.figures.changes += 1;
    }

    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(&name.to_string());
        if let Some(state) = self.state.as_mut() {
            let rn = self.roce_nodes.get(&name.to_string());
            state.move_node(name, Owner::default(), rn);
            state.refresh_delete(name, false, rn);
        }
        self.figures.changes += 1;
    }

    // --- RoceNodes.

    pub fn upsert_roce_node(&mut self, rn: RoceNode) {
        let name = rn.metadata.name.clone().unwrap_or_default();
        self.roce_nodes.insert(rn);
        self.roce_node_changed(&name);
    }

    pub fn remove_roce_node(&mut self, name: &str) {
        self.roce_nodes.remove(&name.to_string());
        self.roce_node_changed(name);
    }

    fn roce_node_changed(&mut self, name: &str) {
        if let Some(state) = self.state.as_mut() {
            if let Some(owner) = state.owners.get(name).and_then(|o| o.owner)
                && let Some(r) = state.rollouts[owner].as_mut()
            {
                r.put(name, self.roce_nodes.get(&name.to_string()));
            }
            let exists = self.nodes.contains_key(&name.to_string());
            state.refresh_delete(name, exists, self.roce_nodes.get(&name.to_string()));
        }
        self.figures.changes += 1;
    }

    // --- Pods.

    /// A pod added or changed; false when the planner neither holds nor wants it (nothing to
    /// plan).
    pub fn upsert_pod(&mut self, pod: Pod) -> bool {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        if !self.wants_pod(&pod) {
            return self.remove_pod(&key.0, &key.1);
        }
        let old = self.pods.insert(pod);
        let step = match self.state.as_mut() {
            Some(state) => {
                state.pod_changed(&key, old.as_ref(), self.pods.get(&key), &self.config_maps)
            }
            None => Step::Done,
        };
        self.step(step);
        true
    }

    /// A pod deleted (or no longer wanted); false when the planner did not hold it.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let Some(old) = self.pods.remove(&key) else {
            return false;
        };
        let step = match self.state.as_mut() {
            Some(state) => state.pod_changed(&key, Some(&old), None, &self.config_maps),
            None => Step::Done,
        };
        self.step(step);
        true
    }

    // --- Region directories (ConfigMaps labelled with their fabric).

    /// A ConfigMap added or changed; false when it is not a region directory and was not one.
    pub fn upsert_config_map(&mut self, cm: ConfigMap) -> bool {
        let key = (
            cm.metadata.namespace.clone().unwrap_or_default(),
            cm.metadata.name.clone().unwrap_or_default(),
        );
        let fabric = directory_fabric(&cm);
        let had = if fabric.is_some() {
            self.config_maps.insert(cm).is_some()
        } else {
            self.config_maps.remove(&key).is_some()
        };
        let relevant = fabric.is_some() || had;
        if relevant {
            self.directory_changed(&key, fabric);
        }
        relevant
    }

    /// A ConfigMap deleted; false when it was not held.
    pub fn remove_config_map(&mut self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let Some(cm) = self.config_maps.remove(&key) else {
            return false;
        };
        let fabric = directory_fabric(&cm);
        self.directory_changed(&key, fabric);
        true
    }

    fn directory_changed(&mut self, key: &(String, String), fabric: Option<String>) {
        let step = match (self.state.as_mut(), fabric) {
            (Some(state), Some(fabric)) => match state.fabric_by_name.get(&fabric) {
                Some(&f) if !state.active[f] => Step::Done,
                Some(&f) => match state.regions[f].as_mut() {
                    Some(r) if r.simple => {
                        r.refresh_directory(&key.0, &self.config_maps);
                        Step::Done
                    }
                    _ => Step::Full,
                },
                None => Step::Full,
            },
            (Some(_), None) => Step::Full,
            (None, _) => Step::Done,
        };
        self.step(step);
    }

    /// Replace every object of the world at once: the next plan is a full pass.
    pub fn replace(&mut self, world: World) {
        self.replace_fabrics(world.fabrics);
        self.replace_nodes(world.nodes);
        self.replace_roce_nodes(world.roce_nodes);
        self.replace_pods(world.pods);
        self.replace_config_maps(world.config_maps);
    }

    /// All fabrics, as a watch (re)listed them: the next plan is a full pass.
    pub fn replace_fabrics(&mut self, items: Vec<RoceFabric>) {
        self.fall_back();
        self.fabrics = items;
        self.fabrics_changed();
    }

    pub fn replace_nodes(&mut self, items: Vec<Node>) {
        self.fall_back();
        self.nodes.replace(items);
    }

    pub fn replace_roce_nodes(&mut self, items: Vec<RoceNode>) {
        self.fall_back();
        self.roce_nodes.replace(items);
    }

    pub fn replace_pods(&mut self, items: Vec<Pod>) {
        self.fall_back();
        let wanted: Vec<Pod> = items.into_iter().filter(|p| self.wants_pod(p)).collect();
        self.pods.replace(wanted);
    }

    pub fn replace_config_maps(&mut self, items: Vec<ConfigMap>) {
        self.fall_back();
        self.config_maps.replace(
            items
                .into_iter()
                .filter(|cm| directory_fabric(cm).is_some())
                .collect(),
        );
    }

    /// Our annotation write on `namespace/name` succeeded: hold the pod as the watch will show
    /// it (when it is still the pod of `uid`).
    pub fn annotated(&mut self, namespace: &str, name: &str, uid: Option<&str>, value: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(mut pod) = self.pods.get(&key).cloned() else {
            return;
        };
        if uid.is_some() && pod.metadata.uid.as_deref() != uid {
            return;
        }
        pod.metadata.annotations.get_or_insert_default().insert(
            rocefabric_api::constants::REGION_ANNOTATION.to_string(),
            value.to_string(),
        );
        self.upsert_pod(pod);
    }

    /// Forget the allocator memory (a new term of leadership: another leader may have freed or
    /// reassigned windows since): the next plan is a full pass from the objects alone.
    pub fn forget_memory(&mut self) {
        self.fall_back();
        self.freed = FreedRegions::default();
    }

    /// Plan a pass at `now`. [`Plan::freed`] is left empty unless the pass was a full one: the
    /// memory stays here ([`Self::memory`]).
    pub fn plan(&mut self, now: Timestamp) -> Plan {
        let ready = self
            .state
            .as_ref()
            .is_some_and(|s| s.regions.iter().flatten().all(|r| r.can_commit(now)));
        // The per-node and per-region lists of a detailed report come from the full pass only.
        if !ready || self.opts.detailed_report {
            return self.full(now);
        }
        self.figures.incremental_plans += 1;
        let grace = self.opts.region_grace;
        let mut state = self.state.take().expect("checked above");
        for r in state.regions.iter_mut().flatten() {
            r.commit(now, grace);
        }
        let plan = state.assemble(self, now);
        self.state = Some(state);
        plan
    }

    fn full(&mut self, now: Timestamp) -> Plan {
        self.fall_back();
        self.figures.full_passes += 1;
        // The objects are lent to the full pass, not copied.
        let world = World {
            fabrics: std::mem::take(&mut self.fabrics),
            nodes: self.nodes.lend(),
            roce_nodes: self.roce_nodes.lend(),
            pods: self.pods.lend(),
            config_maps: self.config_maps.lend(),
            now,
            freed: std::mem::take(&mut self.freed),
        };
        let mut findings = HashMap::new();
        let plan = super::plan_keeping(&world, &self.opts, Some(&mut findings));
        if plan.freed.hold_until.is_some() {
            // Right after a takeover every new window waits: plan in full until it ends.
            self.freed = plan.freed.clone();
        } else {
            let index = &self.roce_nodes;
            let roce_node = |name: &str| {
                index
                    .position(&name.to_string())
                    .map(|i| &world.roce_nodes[i])
            };
            self.state = Some(State::build(&world, &plan, findings, &roce_node));
        }
        self.fabrics = world.fabrics;
        self.nodes.put_back(world.nodes);
        self.roce_nodes.put_back(world.roce_nodes);
        self.pods.put_back(world.pods);
        self.config_maps.put_back(world.config_maps);
        plan
    }
}

impl State {
    fn build<'w>(
        world: &'w World,
        plan: &Plan,
        mut findings: HashMap<String, RegionFindings>,
        roce_node: &dyn Fn(&str) -> Option<&'w RoceNode>,
    ) -> Self {
        let validation: Vec<_> = world
            .fabrics
            .iter()
            .map(selection::validation_errors)
            .collect();
        let views: Vec<ParsedFabric<'_>> = world
            .fabrics
            .iter()
            .zip(&validation)
            .map(|(f, errors)| ParsedFabric::checked(f, errors.clone()))
            .collect();
        let age = selection::age_order(&views);
        let router = Router::new(&views, &age);
        let selectors = NodeSelectors::new(&views, &age);
        let n = views.len();
        let mut state = State {
            router,
            selectors,
            fabric_by_name: views
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.to_string(), i))
                .collect(),
            active: views.iter().map(ParsedFabric::active).collect(),
            owners: HashMap::new(),
            owned: vec![0; n],
            conflicting: vec![BTreeMap::new(); n],
            rollouts: views
                .iter()
                .map(|f| f.active().then(|| Rollout::new(f)))
                .collect(),
            regions: (0..n).map(|_| None).collect(),
            deletes: plan.report.deleted_roce_nodes.iter().cloned().collect(),
            unmatched: BTreeMap::new(),
            told: plan.freed.unmatched.clone(),
            other_directory_writes: Vec::new(),
            kept_ledgers: BTreeMap::new(),
            validation: validation.clone(),
            since: plan.freed.since,
        };
        for node in &world.nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let owner = state.selectors.owner_of(node);
            state.move_node(&name, owner, roce_node(&name));
        }

        // Pods by fabric, and the writes of the pass by pod and by directory.
        let mut routed: Vec<Vec<&Pod>> = vec![Vec::new(); n];
        for pod in world.pods.iter().filter(|p| pod::is_live(p)) {
            let p = PodRef::new(pod);
            match state.router.route(&p) {
                Route::To(f) => routed[f].push(pod),
                Route::Unmatched => {
                    state.unmatched.insert(
                        (p.namespace.to_string(), p.name.to_string()),
                        unmatched_id(&p),
                    );
                }
                Route::Skip => {}
            }
        }
        let mut pod_writes: HashMap<PodKey, Vec<Write>> = HashMap::new();
        let mut dir_writes: HashMap<String, BTreeMap<String, Write>> = HashMap::new();
        for w in &plan.writes {
            match w {
                Write::AnnotatePodRegion { namespace, pod, .. }
                | Write::RemovePodGate { namespace, pod, .. } => pod_writes
                    .entry((namespace.clone(), pod.clone()))
                    .or_default()
                    .push(w.clone()),
                Write::ApplyRegionDirectory {
                    namespace, fabric, ..
                }
                | Write::DeleteRegionDirectory { namespace, fabric } => {
                    let regions_here = state
                        .fabric_by_name
                        .get(fabric)
                        .is_some_and(|&f| views[f].active() && views[f].pods.is_some());
                    if regions_here {
                        dir_writes
                            .entry(fabric.clone())
                            .or_default()
                            .insert(namespace.clone(), w.clone());
                    } else {
                        state.other_directory_writes.push(w.clone());
                    }
                }
                _ => {}
            }
        }
        let report_of = |name: &str| plan.report.fabrics.iter().find(|r| r.name == name);
        for (f, view) in views.iter().enumerate() {
            let Some(ledger) = plan.freed.fabrics.get(view.name) else {
                continue;
            };
            let (Some(sel), true) = (&view.pods, view.active()) else {
                state
                    .kept_ledgers
                    .insert(view.name.to_string(), ledger.clone());
                continue;
            };
            let report = report_of(view.name).cloned().unwrap_or_default();
            let mut writes = BTreeMap::new();
            for pod in &routed[f] {
                let key = (
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone().unwrap_or_default(),
                );
                if let Some(w) = pod_writes.remove(&key) {
                    writes.insert(key, w);
                }
            }
            state.regions[f] = Some(Regions::build(FullPass {
                fabric: view.name,
                uid: view.uid,
                geometry: sel.geometry,
                per_pod: sel.per_pod,
                per_namespace: sel.per_namespace,
                pods: std::mem::take(&mut routed[f]),
                ledger: ledger.clone(),
                findings: findings.remove(view.name).unwrap_or_default(),
                pod_writes: writes,
                dir_writes: dir_writes.remove(view.name).unwrap_or_default(),
                live_slots: report.regions_allocated,
                region_count: report.region_count,
                cooling_slots: report.regions_cooling,
            }));
        }
        state
    }

    /// Move node `name` to `owner`.
    fn move_node(&mut self, name: &str, owner: Owner, rn: Option<&RoceNode>) {
        let old = self.owners.get(name).cloned().unwrap_or_default();
        if old == owner {
            return;
        }
        for &l in &old.losers {
            self.conflicting[l].remove(name);
        }
        if let Some(o) = owner.owner {
            for &l in &owner.losers {
                self.conflicting[l].insert(name.to_string(), o);
            }
        }
        if old.owner != owner.owner {
            if let Some(o) = old.owner {
                self.owned[o] -= 1;
                if let Some(r) = self.rollouts[o].as_mut() {
                    r.remove(name);
                }
            }
            if let Some(o) = owner.owner {
                self.owned[o] += 1;
                if let Some(r) = self.rollouts[o].as_mut() {
                    r.put(name, rn);
                }
            }
        }
        if owner == Owner::default() {
            self.owners.remove(name);
        } else {
            self.owners.insert(name.to_string(), owner);
        }
    }

    /// Whether the RoceNode `name` is to be deleted: its node is gone or no fabric owns it, and
    /// it is not kept for an invalid or deleting fabric.
    fn refresh_delete(&mut self, name: &str, exists: bool, rn: Option<&RoceNode>) {
        let Some(rn) = rn else {
            self.deletes.remove(name);
            return;
        };
        let owned = self.owners.get(name).is_some_and(|o| o.owner.is_some());
        let kept_for_inactive = self
            .fabric_by_name
            .get(rn.spec.fabric.as_str())
            .is_some_and(|&f| !self.active[f]);
        if exists && (owned || kept_for_inactive) {
            self.deletes.remove(name);
        } else {
            self.deletes.insert(name.to_string());
        }
    }

    fn pod_changed(
        &mut self,
        key: &PodKey,
        old: Option<&Pod>,
        new: Option<&Pod>,
        configs: &Keyed<PodKey, ConfigMap>,
    ) -> Step {
        let route = |pod: Option<&Pod>| match pod.filter(|p| pod::is_live(p)) {
            Some(p) => self.router.route(&PodRef::new(p)),
            None => Route::Skip,
        };
        let (before, after) = (route(old), route(new));
        if before == Route::Unmatched || after == Route::Unmatched {
            self.unmatched.remove(key);
            if let (Route::Unmatched, Some(p)) = (after, new) {
                self.unmatched
                    .insert(key.clone(), unmatched_id(&PodRef::new(p)));
            }
        }
        match (before, after) {
            (Route::To(f), Route::To(g)) if f == g => match (self.regions[f].as_mut(), new) {
                (Some(r), Some(p)) => r.update(p, configs),
                _ => Step::Full,
            },
            (Route::To(_), Route::To(_)) => Step::Full,
            (Route::To(f), _) => match self.regions[f].as_mut() {
                Some(r) => r.remove(key, configs),
                None => Step::Full,
            },
            (_, Route::To(g)) => match (self.regions[g].as_mut(), new) {
                (Some(r), Some(p)) => r.add(p, configs),
                _ => Step::Full,
            },
            _ => Step::Done,
        }
    }

    /// The plan now, read off the indexes.
    fn assemble(&mut self, world: &Incremental, now: Timestamp) -> Plan {
        let time = Time(now);
        let views: Vec<ParsedFabric<'_>> = world
            .fabrics
            .iter()
            .zip(&self.validation)
            .map(|(f, errors)| ParsedFabric::checked(f, errors.clone()))
            .collect();
        let mut by_name: Vec<usize> = (0..views.len()).collect();
        by_name.sort_by_key(|&f| views[f].name);

        let mut writes: Vec<Write> = self
            .deletes
            .iter()
            .map(|name| Write::DeleteRoceNode { name: name.clone() })
            .collect();
        let mut roce_node_writes = Vec::new();
        let mut counts: Vec<Option<RolloutCounts>> = vec![None; views.len()];
        for (f, r) in self.rollouts.iter().enumerate() {
            if let Some(r) = r {
                counts[f] =
                    Some(r.plan(&world.fabrics[f], &world.roce_nodes, &mut roce_node_writes));
            }
        }
        roce_node_writes.sort_by(|a, b| super::write_name(a).cmp(super::write_name(b)));
        writes.extend(roce_node_writes);

        let mut pod_writes: Vec<(&PodKey, &Vec<Write>)> = self
            .regions
            .iter()
            .flatten()
            .flat_map(Regions::pod_writes)
            .collect();
        pod_writes.sort_by(|a, b| a.0.cmp(b.0));
        writes.extend(pod_writes.into_iter().flat_map(|(_, w)| w.iter().cloned()));

        let mut dir_writes: Vec<Write> = self
            .regions
            .iter()
            .flatten()
            .flat_map(Regions::directory_writes)
            .chain(&self.other_directory_writes)
            .cloned()
            .collect();
        dir_writes.sort_by(|a, b| directory_order(a).cmp(&directory_order(b)));
        writes.extend(dir_writes);

        let mut report = PlanReport::default();
        let mut fabric_events = Vec::new();
        for &f in &by_name {
            let view = &views[f];
            let mut fr = super::report_start(view, self.owned[f], self.conflicting[f].len());
            let Some(rollout) = counts[f].take() else {
                if !view.deleting {
                    let (write, events) = status::invalid_status(view, &time);
                    writes.extend(write);
                    fabric_events.extend(events);
                }
                report.fabrics.push(fr);
                continue;
            };
            let (findings, (live_slots, region_count, cooling_slots)) = match &self.regions[f] {
                Some(r) => (r.findings(), r.figures()),
                None => (RegionFindings::default(), (0, 0, 0)),
            };
            let conflicting: Vec<(String, String)> = self.conflicting[f]
                .iter()
                .map(|(n, &o)| (n.clone(), views[o].name.to_string()))
                .collect();
            let facts = status::Facts {
                rollout,
                conflicting,
                regions: RegionCounts {
                    allocated: live_slots,
                    capacity: fr.region_capacity,
                },
                exhausted: findings.exhausted,
                bad_requests: findings.bad_requests,
                too_large: findings.too_large,
                conflicts: findings.conflicts,
                over_quota: findings.over_quota,
            };
            let (write, events) = status::valid_status(view, &facts, &time);
            writes.extend(write);
            fabric_events.extend(events);
            super::report_active(
                &mut fr,
                view,
                &facts,
                (live_slots, region_count, cooling_slots),
            );
            report.fabrics.push(fr);
        }
        writes.extend(fabric_events.into_iter().map(Write::Event));
        let mut told = BTreeSet::new();
        for (key, id) in &self.unmatched {
            if !self.told.contains(id)
                && let Some(pod) = world.pods.get(key)
            {
                writes.push(Write::Event(pods::unmatched_event(&PodRef::new(pod))));
            }
            told.insert(id.clone());
        }
        self.told = told;
        report.deleted_roce_nodes = self.deletes.iter().cloned().collect();
        let requeue_after = self
            .regions
            .iter()
            .flatten()
            .filter_map(|r| r.next_expiry(now))
            .chain(
                self.kept_ledgers
                    .values()
                    .flat_map(|l| l.cooling.iter().map(|c| c.until).filter(|u| *u > now)),
            )
            .min()
            .map(|until| until.duration_since(now).unsigned_abs());
        Plan {
            writes,
            report,
            freed: FreedRegions::default(),
            requeue_after,
        }
    }
}

/// Whether two versions of a fabric differ at most in what the planner does not decide from:
/// status, resourceVersion, managedFields.
fn same_fabric_but_status(a: &RoceFabric, b: &RoceFabric) -> bool {
    let (ma, mb) = (&a.metadata, &b.metadata);
    ma.name == mb.name
        && ma.uid == mb.uid
        && ma.generation == mb.generation
        && ma.creation_timestamp == mb.creation_timestamp
        && ma.deletion_timestamp == mb.deletion_timestamp
        && serde_json::to_value(&a.spec).ok() == serde_json::to_value(&b.spec).ok()
}

fn unmatched_id(p: &PodRef<'_>) -> String {
    p.pod.metadata.uid.clone().unwrap_or_else(|| p.key())
}

/// The fabric a region directory belongs to: labelled with it and named after it.
fn directory_fabric(cm: &ConfigMap) -> Option<String> {
    let fabric = cm.metadata.labels.as_ref()?.get(FABRIC_LABEL)?;
    (cm.metadata.name.as_deref() == Some(region_directory_name(fabric).as_str()))
        .then(|| fabric.clone())
}

fn name_key(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn object_key(meta: &ObjectMeta) -> PodKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}
