//! The planner's world in the operator's tests: a [`World`] of the objects the testing crate
//! builds ([`rocefabric_operator_testing::objects`]), a replay of a plan's writes into it (what
//! the API server holds afterwards, as the watch caches would show it), a fake node agent, and
//! what a plan wrote. These need the operator's types, so they stay here rather than in the
//! testing crate (which must not depend on the operator).
// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

pub mod writes;

use k8s_openapi::api::core::v1::{Node, Pod};
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;

use rocefabric_formats::directory::{self, DirectoryEntry};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_formats::region::RegionAssignment;
pub use rocefabric_operator::objects::{CompactNode, CompactPod, CompactRoceNode, NodeReport};
use rocefabric_operator::planner::writes::{
    region_directory_name, region_directory_object, roce_node_object,
};
use rocefabric_operator::planner::{Event, Plan, PlanOptions, World, Write, plan};
use rocefabric_operator_testing::objects::{T0, agent_status, fabric, now, ts, with_shared_memory};

/// A gibibyte.
pub const GI: u64 = 1 << 30;
/// The label that puts a pod in fabric `f` (the default pod selector).
pub const MEMBER: (&str, &str) = ("rocefabric.io/fabric", "f");

/// Fabric `f` selecting no node, with `max` regions of 1 GiB for the pods labelled [`MEMBER`].
pub fn shm(max: u32) -> RoceFabric {
    with_shared_memory(fabric("f", 0, &[]), "1Gi", max, &[])
}

/// The entries of fabric `f`'s region directory in namespace `ns`, if there is one.
pub fn directory_of(w: &World, ns: &str) -> Option<Vec<DirectoryEntry>> {
    w.config_maps
        .iter()
        .find(|cm| {
            cm.metadata.namespace.as_deref() == Some(ns)
                && cm.metadata.name.as_deref() == Some("f-regions")
        })
        .map(|cm| {
            let data = cm.data.as_ref().expect("a directory has data");
            directory::parse(&data[DIRECTORY_KEY]).expect("a directory")
        })
}

/// Edit a pod of the world as an API object (with the testing crate's helpers).
pub fn edit(p: &mut CompactPod, f: impl FnOnce(Pod) -> Pod) {
    *p = f(Pod::from(&*p)).into();
}

pub fn world(fabrics: Vec<RoceFabric>, nodes: Vec<Node>, pods: Vec<Pod>) -> World {
    World {
        fabrics,
        nodes: nodes.into_iter().map(CompactNode::from).collect(),
        pods: pods.into_iter().map(CompactPod::from).collect(),
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
                let obj =
                    CompactRoceNode::from(roce_node_object(name, fabric_name, fabric_uid, spec));
                match world.roce_nodes.iter_mut().find(|rn| rn.name == *name) {
                    Some(rn) => {
                        rn.fabric_label = obj.fabric_label;
                        rn.controller = obj.controller;
                        rn.spec = obj.spec;
                    }
                    None => world.roce_nodes.push(obj),
                }
            }
            Write::DeleteRoceNode { name } => world.roce_nodes.retain(|rn| rn.name != *name),
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
                find_pod(world, namespace, pod).region = Some(value.clone());
            }
            Write::RemovePodGate { namespace, pod, .. } => {
                let p = find_pod(world, namespace, pod);
                assert!(
                    p.region.is_some(),
                    "gate of {namespace}/{pod} removed before its region annotation"
                );
                p.gates.retain(|g| g != REGION_SCHEDULING_GATE);
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
            Write::ReclaimPodRegion { namespace, pod, .. } => {
                let p = find_pod(world, namespace, pod);
                p.region = None;
                p.region_reclaimed = true;
            }
            Write::Event(_) => {}
        }
    }
}

fn same_cm(cm: &k8s_openapi::api::core::v1::ConfigMap, namespace: &str, fabric: &str) -> bool {
    cm.metadata.namespace.as_deref() == Some(namespace)
        && cm.metadata.name.as_deref() == Some(&region_directory_name(fabric))
}

pub fn find_pod<'a>(world: &'a mut World, ns: &str, name: &str) -> &'a mut CompactPod {
    world
        .pods
        .iter_mut()
        .find(|p| p.key() == (ns, name))
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
        .filter(|rn| names.contains(&rn.name.as_str()))
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

fn report(rn: &mut CompactRoceNode, applied: bool) {
    let status = agent_status(rn.spec.fabric_generation, applied, ts(T0));
    rn.status = Some(NodeReport::from(&status));
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

pub fn pod_of<'a>(world: &'a World, ns: &str, name: &str) -> &'a CompactPod {
    world
        .pods
        .iter()
        .find(|p| p.key() == (ns, name))
        .expect("known pod")
}

pub fn region_of(world: &World, ns: &str, name: &str) -> Option<RegionAssignment> {
    pod_of(world, ns, name)
        .region
        .as_ref()
        .map(|v| RegionAssignment::parse(v).expect("valid annotation"))
}

pub fn gated(world: &World, ns: &str, name: &str) -> bool {
    pod_of(world, ns, name)
        .gates
        .iter()
        .any(|g| g == REGION_SCHEDULING_GATE)
}
