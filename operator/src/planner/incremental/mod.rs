//! The planner kept warm: [`Incremental`] holds the objects the planner reads and the indexes of
//! its last plan, takes one change at a time (an object added, changed or deleted) and updates
//! the indexes in time proportional to the change. [`Incremental::plan`] then reads the writes
//! off the indexes: a pass with nothing to do costs the fabrics' statuses, not the world.
//!
//! [`super::plan`] stays the reference. Changes whose outcome the indexes cannot give with
//! certainty (a fabric edited in more than its `qos`, `nicSelector` or `rollout`, a pod
//! inserted before others waiting for a window, a window freed while pods wait, a conflict)
//! make the next plan a full pass, after which the indexes are rebuilt from it. The property
//! test `operator/tests/incremental.rs` checks that both give the same plan after any sequence
//! of changes.
//!
//! Files: this one takes the changes; `build` rebuilds the indexes from a full pass and
//! `assemble` reads a plan off them; `nodes` and `regions` are the node and region indexes,
//! `keyed` the objects held, in a `Vec` with an index by key; `reclaim` times the windows of pods
//! that are never bound.

mod assemble;
mod build;
mod held;
mod keyed;
mod nodes;
mod reclaim;
mod regions;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::FABRIC_LABEL;

use super::pod::{self, PodRef};
use super::selection::{self, ParsedFabric, Route, Router};
use super::writes::{Write, region_directory_name};
use super::{Plan, PlanOptions, World};
use crate::objects::{CompactNode, CompactPod, CompactRoceNode, Matcher};
use crate::regions::{FreedRegions, Ledger};
use keyed::Keyed;
use nodes::{NodeSelectors, Owner, Rollout};
use reclaim::Unbound;
use regions::{PodKey, Regions, Step};

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
    nodes: Keyed<String, CompactNode>,
    roce_nodes: Keyed<String, CompactRoceNode>,
    pods: Keyed<PodKey, CompactPod>,
    config_maps: Keyed<PodKey, ConfigMap>,
    /// `None`: the next plan is a full pass.
    state: Option<State>,
    /// The memory for the next full pass while `state` is `None`.
    freed: FreedRegions,
    figures: Figures,
    /// The fabrics' custom pod selectors (see [`Self::wants_pod`]), parsed and as written.
    pod_selectors: Vec<Matcher>,
    pod_selector_specs: Vec<LabelSelector>,
    /// A selector came that was not there before: pods dropped by `wants_pod` may match it.
    selectors_grew: bool,
    /// The pod label keys some fabric's pod selector reads (and the fabric label): a held pod
    /// keeps only these, so a tenant's many or long labels cost the operator nothing.
    label_keys: BTreeSet<String>,
    /// Pods holding a window unbound, timed for reclaim.
    unbound: Unbound,
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
            nodes: Keyed::new(|n: &CompactNode| n.name.clone()),
            roce_nodes: Keyed::new(|n: &CompactRoceNode| n.name.clone()),
            pods: Keyed::new(|p: &CompactPod| (p.namespace.to_string(), p.name.clone())),
            config_maps: Keyed::new(|c: &ConfigMap| object_key(&c.metadata)),
            state: None,
            freed: FreedRegions::default(),
            figures: Figures::default(),
            pod_selectors: Vec::new(),
            pod_selector_specs: Vec::new(),
            selectors_grew: false,
            label_keys: BTreeSet::from([FABRIC_LABEL.to_string()]),
            unbound: Unbound::default(),
        }
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
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&CompactPod> {
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

    // --- RoceFabrics: a change is a full pass, but for an edit of what its nodes apply.

    pub fn upsert_fabric(&mut self, fabric: RoceFabric) {
        let name = fabric.metadata.name.clone();
        let step = match self.fabrics.iter().position(|f| f.metadata.name == name) {
            Some(i) => {
                let old = std::mem::replace(&mut self.fabrics[i], fabric);
                // Only its status changed (our own write, seen): the statuses are computed
                // from the objects at each plan anyway.
                if same_fabric_but_status(&old, &self.fabrics[i])
                    || self.node_config_edited(i, &old)
                {
                    Step::Done
                } else {
                    Step::Full
                }
            }
            None => {
                self.fabrics.push(fabric);
                Step::Full
            }
        };
        self.fabrics_changed();
        self.step(step);
    }

    /// Whether fabric `i` (was `old`) changed only in what its nodes apply and how fast
    /// (`qos`, `nicSelector`, `rollout`, and so its generation), staying valid: then its
    /// rollout index is rebuilt for the new spec and nothing else changes (no other index
    /// reads those fields). An MTU edit on a large fabric is then not a full pass.
    fn node_config_edited(&mut self, i: usize, old: &RoceFabric) -> bool {
        let fabric = &self.fabrics[i];
        let Some(state) = self.state.as_mut() else {
            return false;
        };
        if !same_but_node_config(old, fabric)
            || state
                .fabric_by_name
                .get(fabric.metadata.name.as_deref().unwrap_or_default())
                != Some(&i)
            || !state.validation[i].is_empty()
            || state.rollouts[i].is_none()
        {
            return false;
        }
        let parsed = ParsedFabric::checked(fabric, selection::validation_errors(fabric));
        if !parsed.active() {
            return false;
        }
        let mut rollout = Rollout::new(&parsed);
        for (node, owner) in &state.owners {
            if owner.owner == Some(i) {
                rollout.put(node, self.roce_nodes.get(node));
            }
        }
        state.rollouts[i] = Some(rollout);
        true
    }

    pub fn remove_fabric(&mut self, name: &str) {
        self.fabrics
            .retain(|f| f.metadata.name.as_deref() != Some(name));
        self.fabrics_changed();
        self.step(Step::Full);
    }

    // --- Nodes.

    pub fn upsert_node(&mut self, node: CompactNode) {
        let name = node.name.clone();
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
        self.nodes.remove(name);
        if let Some(state) = self.state.as_mut() {
            let rn = self.roce_nodes.get(name);
            state.move_node(name, Owner::default(), rn);
            state.refresh_delete(name, false, rn);
        }
        self.figures.changes += 1;
    }

    // --- RoceNodes.

    pub fn upsert_roce_node(&mut self, rn: CompactRoceNode) {
        let name = rn.name.clone();
        self.roce_nodes.insert(rn);
        self.roce_node_changed(&name);
    }

    pub fn remove_roce_node(&mut self, name: &str) {
        self.roce_nodes.remove(name);
        self.roce_node_changed(name);
    }

    fn roce_node_changed(&mut self, name: &str) {
        if let Some(state) = self.state.as_mut() {
            if let Some(owner) = state.owners.get(name).and_then(|o| o.owner)
                && let Some(r) = state.rollouts[owner].as_mut()
            {
                r.put(name, self.roce_nodes.get(name));
            }
            let exists = self.nodes.contains_key(name);
            state.refresh_delete(name, exists, self.roce_nodes.get(name));
        }
        self.figures.changes += 1;
    }

    // --- Pods.

    /// A pod added or changed; false when the planner neither holds nor wants it (nothing to
    /// plan).
    pub fn upsert_pod(&mut self, pod: CompactPod) -> bool {
        let key = (pod.namespace.to_string(), pod.name.clone());
        if !self.wants_pod(&pod) {
            return self.remove_pod(&key.0, &key.1);
        }
        let old = self.pods.insert(self.read_labels_only(pod));
        self.unbound.observe(&key, self.pods.get(&key));
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
        self.unbound.observe(&key, None);
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

    pub fn replace_nodes(&mut self, items: Vec<CompactNode>) {
        self.fall_back();
        self.nodes.replace(items);
    }

    pub fn replace_roce_nodes(&mut self, items: Vec<CompactRoceNode>) {
        self.fall_back();
        self.roce_nodes.replace(items);
    }

    pub fn replace_pods(&mut self, items: Vec<CompactPod>) {
        self.fall_back();
        let wanted: Vec<CompactPod> = items
            .into_iter()
            .filter(|p| self.wants_pod(p))
            .map(|p| self.read_labels_only(p))
            .collect();
        self.pods.replace(wanted);
        self.unbound.relisted(self.pods.values());
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
        if uid.is_some() && pod.uid.as_deref() != uid {
            return;
        }
        pod.region = Some(value.to_string());
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
    /// Move node `name` to `owner`.
    fn move_node(&mut self, name: &str, owner: Owner, rn: Option<&CompactRoceNode>) {
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
    fn refresh_delete(&mut self, name: &str, exists: bool, rn: Option<&CompactRoceNode>) {
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
        old: Option<&CompactPod>,
        new: Option<&CompactPod>,
        configs: &Keyed<PodKey, ConfigMap>,
    ) -> Step {
        let route = |pod: Option<&CompactPod>| match pod.filter(|p| pod::is_live(p)) {
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
}

/// Whether two versions of a fabric differ at most in what the planner does not decide from:
/// status, resourceVersion, managedFields.
fn same_fabric_but_status(a: &RoceFabric, b: &RoceFabric) -> bool {
    a.metadata.generation == b.metadata.generation
        && same_identity(a, b)
        && serde_json::to_value(&a.spec).ok() == serde_json::to_value(&b.spec).ok()
}

/// The same fabric, its spec the same but for `qos`, `nicSelector` and `rollout`.
fn same_but_node_config(a: &RoceFabric, b: &RoceFabric) -> bool {
    let rest = |f: &RoceFabric| {
        let mut spec = serde_json::to_value(&f.spec).ok()?;
        let fields = spec.as_object_mut()?;
        for field in ["qos", "nicSelector", "rollout"] {
            fields.remove(field);
        }
        Some(spec)
    };
    same_identity(a, b) && rest(a).is_some_and(|r| Some(r) == rest(b))
}

fn same_identity(a: &RoceFabric, b: &RoceFabric) -> bool {
    let (ma, mb) = (&a.metadata, &b.metadata);
    ma.name == mb.name
        && ma.uid == mb.uid
        && ma.creation_timestamp == mb.creation_timestamp
        && ma.deletion_timestamp == mb.deletion_timestamp
}

fn unmatched_id(p: &PodRef<'_>) -> String {
    p.pod.uid.clone().unwrap_or_else(|| p.key())
}

/// The fabric a region directory belongs to: labelled with it and named after it.
fn directory_fabric(cm: &ConfigMap) -> Option<String> {
    let fabric = cm.metadata.labels.as_ref()?.get(FABRIC_LABEL)?;
    (cm.metadata.name.as_deref() == Some(region_directory_name(fabric).as_str()))
        .then(|| fabric.clone())
}

fn object_key(meta: &ObjectMeta) -> PodKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}
