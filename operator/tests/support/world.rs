//! Builders of cluster objects for the planner and shell tests, a replay of a plan's writes
//! into the world (what the API server holds afterwards, as the watch caches would show it)
//! and a fake node agent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, PodSchedulingGate, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement, ObjectMeta, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::{
    REGION_ANNOTATION, REGION_SCHEDULING_GATE, REGION_SIZE_ANNOTATION, condition,
};
use rocefabric_api::{
    RoceFabric, RoceFabricSpec, RoceNode, RoceNodeStatus, RolloutSpec, SharedMemorySpec,
};
use rocefabric_operator::planner::writes::{
    region_directory_name, region_directory_object, roce_node_object,
};
use rocefabric_operator::planner::{Event, Plan, PlanOptions, World, Write, plan};
use rocefabric_operator::regions::RegionAssignment;

/// Seconds since the epoch of the test clock's start (2026-01-01T00:00:00Z).
pub const T0: i64 = 1_767_225_600;

pub fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid timestamp")
}

/// "Now" of every world built by [`world`]: an hour after [`T0`].
pub fn now() -> Timestamp {
    ts(T0 + 3600)
}

pub fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// A fabric created at `T0 + created` selecting nodes with the labels `selector`.
pub fn fabric(name: &str, created: i64, selector: &[(&str, &str)]) -> RoceFabric {
    let mut f = RoceFabric::new(
        name,
        RoceFabricSpec {
            node_selector: LabelSelector {
                match_labels: labels(selector),
                ..LabelSelector::default()
            },
            ..RoceFabricSpec::default()
        },
    );
    f.metadata.uid = Some(format!("uid-{name}"));
    f.metadata.generation = Some(1);
    f.metadata.resource_version = Some("1".into());
    f.metadata.creation_timestamp = Some(Time(ts(T0 + created)));
    f
}

pub fn with_expressions(mut f: RoceFabric, exprs: &[(&str, &str, &[&str])]) -> RoceFabric {
    f.spec.node_selector.match_expressions = Some(
        exprs
            .iter()
            .map(|(key, op, values)| LabelSelectorRequirement {
                key: key.to_string(),
                operator: op.to_string(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            })
            .collect(),
    );
    f
}

pub fn with_budget(mut f: RoceFabric, budget: IntOrString) -> RoceFabric {
    f.spec.rollout = RolloutSpec {
        max_unavailable: budget,
    };
    f
}

/// Give `f` `max` regions of `size` for pods labelled `pod_selector` (empty: pods labelled
/// `rocefabric.io/fabric: <name>`).
pub fn with_shared_memory(
    mut f: RoceFabric,
    size: &str,
    max: u32,
    pod_selector: &[(&str, &str)],
) -> RoceFabric {
    f.spec.shared_memory = Some(SharedMemorySpec {
        region_size: Quantity(size.into()),
        max_regions: max,
        max_regions_per_pod: None,
        max_regions_per_namespace: None,
        pod_selector: LabelSelector {
            match_labels: (!pod_selector.is_empty())
                .then(|| labels(pod_selector))
                .flatten(),
            ..LabelSelector::default()
        },
    });
    f
}

/// Change the QoS and bump the generation, as the API server does on a spec change.
pub fn bump_dscp(f: &mut RoceFabric, dscp: u8) {
    f.spec.qos.roce_dscp = dscp;
    f.metadata.generation = Some(f.metadata.generation.unwrap_or(1) + 1);
}

pub fn node(name: &str, pairs: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: labels(pairs),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// `count` nodes `prefix-000`.. labelled `pairs`.
pub fn nodes(prefix: &str, count: usize, pairs: &[(&str, &str)]) -> Vec<Node> {
    (0..count)
        .map(|i| node(&format!("{prefix}-{i:03}"), pairs))
        .collect()
}

/// A pending pod created at `T0 + created`, labelled `pairs`, gated when `gated`.
pub fn pod(ns: &str, name: &str, created: i64, pairs: &[(&str, &str)], gated: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            labels: labels(pairs),
            creation_timestamp: Some(Time(ts(T0 + created))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: gated.then(|| {
                vec![PodSchedulingGate {
                    name: REGION_SCHEDULING_GATE.into(),
                }]
            }),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        }),
    }
}

/// A pending pod created at `T0 + created`, labelled `pairs`, gated by `other_gate` and then by
/// `rocefabric.io/region`.
pub fn gated_behind(
    ns: &str,
    name: &str,
    created: i64,
    pairs: &[(&str, &str)],
    other_gate: &str,
) -> Pod {
    let mut p = pod(ns, name, created, pairs, true);
    p.spec
        .get_or_insert_default()
        .scheduling_gates
        .get_or_insert_default()
        .insert(
            0,
            PodSchedulingGate {
                name: other_gate.into(),
            },
        );
    p
}

pub fn with_size_request(mut p: Pod, size: &str) -> Pod {
    p.metadata
        .annotations
        .get_or_insert_default()
        .insert(REGION_SIZE_ANNOTATION.into(), size.into());
    p
}

pub fn with_annotation(mut p: Pod, value: &str) -> Pod {
    p.metadata
        .annotations
        .get_or_insert_default()
        .insert(REGION_ANNOTATION.into(), value.into());
    p
}

pub fn scheduled(mut p: Pod, node: &str, ip: &str) -> Pod {
    p.spec.get_or_insert_default().node_name = Some(node.into());
    let st = p.status.get_or_insert_default();
    st.pod_ip = Some(ip.into());
    st.phase = Some("Running".into());
    p
}

pub fn world(fabrics: Vec<RoceFabric>, nodes: Vec<Node>, pods: Vec<Pod>) -> World {
    World {
        fabrics,
        nodes,
        pods,
        ..World::empty(now())
    }
}

pub fn opts() -> PlanOptions {
    PlanOptions {
        detailed_report: true,
        ..PlanOptions::default()
    }
}

/// Apply `plan`'s writes to `world` as the API server would, and carry the allocator memory.
pub fn apply(world: &mut World, plan: &Plan) {
    apply_writes(world, &plan.writes);
    world.freed = plan.freed.clone();
}

/// What the API server holds after `writes` succeed, as the watch caches would show it:
/// server-side apply of a RoceNode sets its labels, owner reference and spec, keeps the rest of
/// its metadata and its status, and bumps `metadata.generation` when the spec changes; a status
/// write leaves the fabric's generation alone; removing our gate keeps the others. A write to a
/// fabric or pod the world does not hold, or a gate removed before the region annotation (the
/// shell refuses that), fails the test.
pub fn apply_writes(world: &mut World, writes: &[Write]) {
    for w in writes {
        match w {
            Write::ApplyRoceNode {
                name,
                fabric_name,
                fabric_uid,
                spec,
            } => {
                let mut obj = roce_node_object(name, fabric_name, fabric_uid, spec);
                match world
                    .roce_nodes
                    .iter_mut()
                    .find(|rn| rn.metadata.name.as_deref() == Some(name))
                {
                    Some(rn) => {
                        if rn.spec != obj.spec {
                            rn.metadata.generation = Some(rn.metadata.generation.unwrap_or(1) + 1);
                        }
                        rn.metadata
                            .labels
                            .get_or_insert_default()
                            .extend(obj.metadata.labels.take().unwrap_or_default());
                        rn.metadata.owner_references = obj.metadata.owner_references.take();
                        rn.spec = obj.spec;
                    }
                    None => {
                        obj.metadata.uid = Some(format!("uid-rn-{name}"));
                        obj.metadata.generation = Some(1);
                        obj.metadata.creation_timestamp = Some(Time(world.now));
                        world.roce_nodes.push(obj);
                    }
                }
            }
            Write::DeleteRoceNode { name } => world
                .roce_nodes
                .retain(|rn| rn.metadata.name.as_deref() != Some(name)),
            Write::ApplyFabricStatus { fabric, status } => {
                let f = world
                    .fabrics
                    .iter_mut()
                    .find(|f| f.metadata.name.as_deref() == Some(fabric))
                    .expect("status of a known fabric");
                f.status = Some(status.clone());
            }
            Write::AnnotatePodRegion {
                namespace,
                pod,
                value,
                ..
            } => {
                let p = find_pod(world, namespace, pod);
                p.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(REGION_ANNOTATION.into(), value.clone());
            }
            Write::RemovePodGate { namespace, pod, .. } => {
                let p = find_pod(world, namespace, pod);
                assert!(
                    p.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(REGION_ANNOTATION)),
                    "gate of {namespace}/{pod} removed before its region annotation"
                );
                remove_region_gate(p);
            }
            Write::ApplyRegionDirectory {
                namespace,
                fabric,
                fabric_uid,
                data,
            } => {
                let obj = region_directory_object(namespace, fabric, fabric_uid, data);
                world
                    .config_maps
                    .retain(|cm| !same_cm(cm, namespace, fabric));
                world.config_maps.push(obj);
            }
            Write::DeleteRegionDirectory { namespace, fabric } => {
                world
                    .config_maps
                    .retain(|cm| !same_cm(cm, namespace, fabric));
            }
            Write::Event(_) => {}
        }
    }
}

/// Remove our scheduling gate from `p`, keeping the others (an empty list reads back as absent).
pub fn remove_region_gate(p: &mut Pod) {
    let spec = p.spec.get_or_insert_default();
    let gates: Vec<PodSchedulingGate> = spec
        .scheduling_gates
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|g| g.name != REGION_SCHEDULING_GATE)
        .collect();
    spec.scheduling_gates = (!gates.is_empty()).then_some(gates);
}

fn same_cm(cm: &k8s_openapi::api::core::v1::ConfigMap, namespace: &str, fabric: &str) -> bool {
    cm.metadata.namespace.as_deref() == Some(namespace)
        && cm.metadata.name.as_deref() == Some(&region_directory_name(fabric))
}

fn find_pod<'a>(world: &'a mut World, ns: &str, name: &str) -> &'a mut Pod {
    world
        .pods
        .iter_mut()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        })
        .expect("write to a known pod")
}

/// Plan, apply, and return the plan.
pub fn step(world: &mut World) -> Plan {
    let p = plan(world, &opts());
    apply(world, &p);
    p
}

/// The fake node agent: every RoceNode in `names` reports its spec's generation, applied or failed.
pub fn agent_reports(world: &mut World, names: &[&str], applied: bool) {
    for rn in world
        .roce_nodes
        .iter_mut()
        .filter(|rn| names.contains(&rn.metadata.name.as_deref().unwrap_or_default()))
    {
        report(rn, applied);
    }
}

/// The fake node agent on every RoceNode.
pub fn agent_reports_all(world: &mut World, applied: bool) {
    for rn in &mut world.roce_nodes {
        report(rn, applied);
    }
}

fn report(rn: &mut RoceNode, applied: bool) {
    rn.status = Some(RoceNodeStatus {
        fabric_generation: Some(rn.spec.fabric_generation),
        conditions: vec![Condition {
            type_: condition::QOS_APPLIED.into(),
            status: if applied { "True" } else { "False" }.into(),
            reason: if applied { "QosApplied" } else { "QosFailed" }.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(ts(T0)),
        }],
        ..RoceNodeStatus::default()
    });
}

/// Nodes given a spec to apply (pending placeholders excluded).
pub fn applied_nodes(p: &Plan) -> Vec<String> {
    roce_node_writes(p, false)
}

/// Nodes given a pending placeholder RoceNode (selected, waiting for their rollout slot).
pub fn pending_nodes(p: &Plan) -> Vec<String> {
    roce_node_writes(p, true)
}

fn roce_node_writes(p: &Plan, pending: bool) -> Vec<String> {
    p.writes
        .iter()
        .filter_map(|w| match w {
            Write::ApplyRoceNode { name, spec, .. } if spec.pending == pending => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect()
}

pub fn deleted_nodes(p: &Plan) -> Vec<String> {
    p.writes
        .iter()
        .filter_map(|w| match w {
            Write::DeleteRoceNode { name } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

pub fn events(p: &Plan) -> Vec<&Event> {
    p.writes
        .iter()
        .filter_map(|w| match w {
            Write::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

pub fn event_reasons(p: &Plan) -> Vec<String> {
    events(p).iter().map(|e| e.reason.clone()).collect()
}

pub fn fabric_of<'a>(world: &'a World, name: &str) -> &'a RoceFabric {
    world
        .fabrics
        .iter()
        .find(|f| f.metadata.name.as_deref() == Some(name))
        .expect("known fabric")
}

/// The status condition `type_` of fabric `name`: (status, reason).
pub fn condition_of(world: &World, name: &str, type_: &str) -> (String, String) {
    let st = fabric_of(world, name)
        .status
        .as_ref()
        .expect("fabric has a status");
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status.clone(), c.reason.clone())
}

/// The message of condition `type_` of fabric `name`.
pub fn condition_message(world: &World, name: &str, type_: &str) -> String {
    let st = fabric_of(world, name)
        .status
        .as_ref()
        .expect("fabric has a status");
    st.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
        .message
        .clone()
}

pub fn pod_of<'a>(world: &'a World, ns: &str, name: &str) -> &'a Pod {
    world
        .pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        })
        .expect("known pod")
}

pub fn region_of(world: &World, ns: &str, name: &str) -> Option<RegionAssignment> {
    pod_of(world, ns, name)
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REGION_ANNOTATION))
        .map(|v| RegionAssignment::parse(v).expect("valid annotation"))
}

pub fn gated(world: &World, ns: &str, name: &str) -> bool {
    pod_of(world, ns, name)
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == REGION_SCHEDULING_GATE))
}
