//! Which fabric owns which node: fabrics in age order (creation time, then name), each node to
//! the oldest fabric that selects it; younger fabrics that select it too count it as conflicting.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::core::Selector;
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::validate::{self, FieldError};

use super::pod::PodRef;
use crate::objects::{CompactNode, CompactPod, Matcher};
use crate::regions::Geometry;

/// A RoceFabric parsed for planning: identity, age, validity and its selectors parsed.
pub(crate) struct ParsedFabric<'w> {
    pub obj: &'w RoceFabric,
    pub name: &'w str,
    pub uid: &'w str,
    pub generation: i64,
    pub created: Option<Timestamp>,
    pub deleting: bool,
    /// Empty when the spec is valid.
    pub errors: Vec<FieldError>,
    /// `None` when `spec.nodeSelector` cannot be parsed (the fabric then selects no node).
    pub node_selector: Option<Matcher>,
    /// `None` without `sharedMemory` or when its selector or geometry is invalid.
    pub pods: Option<PodSelection>,
}

/// How a fabric picks the pods that get a region.
pub(crate) struct PodSelection {
    pub selector: PodSelector,
    pub geometry: Geometry,
    /// `sharedMemory.maxRegionsPerPod` or its default; `None` when it is the whole space.
    pub per_pod: Option<u32>,
    /// `sharedMemory.maxRegionsPerNamespace` or its default; `None` when it is the whole space.
    pub per_namespace: Option<u32>,
}

impl<'w> ParsedFabric<'w> {
    pub fn new(obj: &'w RoceFabric) -> Self {
        Self::checked(obj, validation_errors(obj))
    }

    /// `obj` parsed, its schema and CEL validation having found `errors` (the incremental
    /// planner validates once per spec, not once per pass).
    pub fn checked(obj: &'w RoceFabric, mut errors: Vec<FieldError>) -> Self {
        let meta = &obj.metadata;
        let node_selector = match parse_selector(&obj.spec.node_selector) {
            Ok(s) => Some(s),
            Err(message) => {
                push_unique(&mut errors, "spec.nodeSelector", message);
                None
            }
        };
        let pods = obj.spec.shared_memory.as_ref().and_then(|sm| {
            let labels = if is_empty_selector(&sm.pod_selector) {
                Some(PodLabels::FabricLabel)
            } else {
                match parse_selector(&sm.pod_selector) {
                    Ok(s) => Some(PodLabels::Labels(s)),
                    Err(message) => {
                        push_unique(&mut errors, "spec.sharedMemory.podSelector", message);
                        None
                    }
                }
            };
            let geometry = match Geometry::from_spec(sm) {
                Ok(g) => Some(g),
                Err(e) => {
                    let field = match e {
                        crate::regions::RegionError::MaxRegions { .. }
                        | crate::regions::RegionError::SpaceTooLarge { .. } => {
                            "spec.sharedMemory.maxRegions"
                        }
                        _ => "spec.sharedMemory.regionSize",
                    };
                    push_unique(&mut errors, field, e.to_string());
                    None
                }
            };
            Some(PodSelection {
                selector: PodSelector {
                    labels: labels?,
                    namespaces: sm.namespaces.clone(),
                },
                geometry: geometry?,
                // A limit of the whole space is none: a larger request is too large for the
                // space, a namespace holding all of it leaves the others waiting for room.
                per_pod: Some(sm.pod_limit()).filter(|&l| l < sm.max_regions),
                per_namespace: Some(sm.namespace_limit()).filter(|&l| l < sm.max_regions),
            })
        });
        Self {
            obj,
            name: meta.name.as_deref().unwrap_or_default(),
            uid: meta.uid.as_deref().unwrap_or_default(),
            generation: meta.generation.unwrap_or(1),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            deleting: meta.deletion_timestamp.is_some(),
            errors,
            node_selector,
            pods,
        }
    }

    /// Valid and not being deleted: the planner writes for it.
    pub fn active(&self) -> bool {
        self.errors.is_empty() && !self.deleting
    }
}

/// Which pods a fabric's windows are for: its pod selector, within its namespaces.
#[derive(Clone)]
pub(crate) struct PodSelector {
    labels: PodLabels,
    /// `sharedMemory.namespaces`: empty admits every namespace.
    namespaces: Vec<String>,
}

#[derive(Clone)]
enum PodLabels {
    /// An empty `podSelector`: pods labelled `rocefabric.io/fabric: <fabric>`.
    FabricLabel,
    Labels(Matcher),
}

impl PodSelector {
    /// Whether fabric `fabric` gives `pod` a window: its namespace is admitted and its
    /// selector picks it.
    pub fn selects(&self, fabric: &str, pod: &CompactPod) -> bool {
        let admitted =
            self.namespaces.is_empty() || self.namespaces.iter().any(|n| **n == *pod.namespace);
        admitted
            && match &self.labels {
                PodLabels::FabricLabel => pod.labels.get(FABRIC_LABEL) == Some(fabric),
                PodLabels::Labels(s) => s.matches(&pod.labels),
            }
    }
}

/// Where a live pod goes: the fabric whose region it holds or gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// To this fabric (an index of the fabrics the router was built from), which is active.
    To(usize),
    /// Gated, and no fabric selects it: it is told so.
    Unmatched,
    /// Not planned now (no fabric, or its fabric cannot be planned: the status says why).
    Skip,
}

/// The pod routing of a set of fabrics, owned, so the incremental planner can keep it.
#[derive(Clone)]
pub(crate) struct Router {
    fabrics: Vec<RouteEntry>,
    by_name: HashMap<String, usize>,
    age: Vec<usize>,
}

#[derive(Clone)]
struct RouteEntry {
    name: String,
    active: bool,
    pods: Option<PodSelector>,
}

impl Router {
    pub fn new(fabrics: &[ParsedFabric<'_>], age: &[usize]) -> Self {
        Self {
            fabrics: fabrics
                .iter()
                .map(|f| RouteEntry {
                    name: f.name.to_string(),
                    active: f.active(),
                    pods: f.pods.as_ref().map(|p| p.selector.clone()),
                })
                .collect(),
            by_name: fabrics
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.to_string(), i))
                .collect(),
            age: age.to_vec(),
        }
    }

    /// Route a live pod. A pod belongs to the fabric its annotation names, whatever the selector
    /// says now (its container read that window at start: a removed label frees nothing);
    /// otherwise to the oldest fabric that selects it.
    pub fn route(&self, p: &PodRef<'_>) -> Route {
        let recorded = match &p.annotation {
            Some(Ok(a)) => self.by_name.get(a.fabric.as_ref()).copied(),
            _ => None,
        };
        let target = match recorded {
            // A fabric that cannot be planned now keeps its pods as they are.
            Some(f) if !self.fabrics[f].active => return Route::Skip,
            Some(f) if self.fabrics[f].pods.is_some() => Some(f),
            _ => self.age.iter().copied().find(|&f| {
                let e = &self.fabrics[f];
                e.pods.as_ref().is_some_and(|s| s.selects(&e.name, p.pod))
            }),
        };
        match target {
            Some(f) if self.fabrics[f].active => Route::To(f),
            Some(_) => Route::Skip,
            None if p.gated() => Route::Unmatched,
            None => Route::Skip,
        }
    }
}

/// What schema and CEL validation find wrong with a fabric.
pub(crate) fn validation_errors(obj: &RoceFabric) -> Vec<FieldError> {
    match validate::fabric(obj) {
        Ok(()) => Vec::new(),
        Err(invalid) => invalid.errors,
    }
}

fn push_unique(errors: &mut Vec<FieldError>, field: &str, message: String) {
    if !errors.iter().any(|e| e.field == field) {
        errors.push(FieldError {
            field: field.to_string(),
            message,
        });
    }
}

pub(crate) fn is_empty_selector(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// Parse a label selector (operators `In`, `NotIn`, `Exists`, `DoesNotExist`).
pub(crate) fn parse_selector(sel: &LabelSelector) -> Result<Matcher, String> {
    Selector::try_from(sel.clone())
        .map(Matcher::from)
        .map_err(|e| e.0)
}

/// Fabric indices in age order: creation time (unknown last), then name.
pub(crate) fn age_order(fabrics: &[ParsedFabric<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..fabrics.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (&fabrics[a], &fabrics[b]);
        (fa.created.is_none(), fa.created, fa.name).cmp(&(
            fb.created.is_none(),
            fb.created,
            fb.name,
        ))
    });
    order
}

/// Who owns each node, and who else selects it.
pub(crate) struct Ownership {
    /// Per node index: the owning fabric index.
    pub owner: Vec<Option<usize>>,
    /// Per fabric index: owned node indices, by node name.
    pub owned: Vec<Vec<usize>>,
    /// Per fabric index: node indices it selects that an older fabric owns, by node name.
    pub conflicting: Vec<Vec<usize>>,
    /// Per node index: the younger fabrics that select it too (only nodes that have any).
    pub losers: HashMap<usize, Vec<usize>>,
}

/// Assign every node to the oldest fabric that selects it. `nodes_by_name` lists node indices
/// sorted by name.
pub(crate) fn assign_nodes(
    fabrics: &[ParsedFabric<'_>],
    age: &[usize],
    nodes: &[CompactNode],
    nodes_by_name: &[usize],
) -> Ownership {
    let mut own = Ownership {
        owner: vec![None; nodes.len()],
        owned: vec![Vec::new(); fabrics.len()],
        conflicting: vec![Vec::new(); fabrics.len()],
        losers: HashMap::new(),
    };
    let selectors: Vec<(usize, &Matcher)> = age
        .iter()
        .filter_map(|&f| fabrics[f].node_selector.as_ref().map(|s| (f, s)))
        .collect();
    for &n in nodes_by_name {
        for &(f, sel) in &selectors {
            if !sel.matches(&nodes[n].labels) {
                continue;
            }
            match own.owner[n] {
                None => {
                    own.owner[n] = Some(f);
                    own.owned[f].push(n);
                }
                Some(_) => {
                    own.conflicting[f].push(n);
                    own.losers.entry(n).or_default().push(f);
                }
            }
        }
    }
    own
}
