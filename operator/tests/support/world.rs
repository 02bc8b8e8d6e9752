//! Builders of cluster objects for the shell tests, and a simulation of what the API server
//! holds after a plan's writes (to check that a converged world plans no writes).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, PodSchedulingGate, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::{REGION_ANNOTATION, REGION_SCHEDULING_GATE};
use rocefabric_api::{RoceFabric, RoceFabricSpec, SharedMemorySpec};
use rocefabric_operator::planner::World;
use rocefabric_operator::planner::writes::{Write, region_directory_object, roce_node_object};

pub fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid timestamp")
}

/// "Now" of every test world: 2026-01-01T00:00:00Z.
pub fn now() -> Timestamp {
    ts(1_767_225_600)
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// A fabric selecting nodes by `selector` labels, created `age_secs` before [`now`].
pub fn fabric(name: &str, uid: &str, selector: &[(&str, &str)], age_secs: i64) -> RoceFabric {
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
    f.metadata.uid = Some(uid.to_string());
    f.metadata.generation = Some(1);
    f.metadata.resource_version = Some("1".into());
    f.metadata.creation_timestamp = Some(Time(ts(now().as_second() - age_secs)));
    f
}

/// Give `f` a shared memory space of `max` regions of 1 GiB for pods labelled `pod_selector`.
pub fn with_shared_memory(
    mut f: RoceFabric,
    max: u32,
    pod_selector: &[(&str, &str)],
) -> RoceFabric {
    f.spec.shared_memory = Some(SharedMemorySpec {
        region_size: Quantity("1Gi".into()),
        max_regions: max,
        pod_selector: LabelSelector {
            match_labels: labels(pod_selector),
            ..LabelSelector::default()
        },
    });
    f
}

/// A node as a metadata-only watch delivers it.
pub fn node(name: &str, pairs: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: labels(pairs),
            ..ObjectMeta::default()
        },
        spec: None,
        status: None,
    }
}

/// A pending pod, gated by `rocefabric.io/region` (after `other_gate` when given).
pub fn gated_pod(
    namespace: &str,
    name: &str,
    pairs: &[(&str, &str)],
    other_gate: Option<&str>,
    age_secs: i64,
) -> Pod {
    let mut gates = Vec::new();
    if let Some(g) = other_gate {
        gates.push(PodSchedulingGate { name: g.into() });
    }
    gates.push(PodSchedulingGate {
        name: REGION_SCHEDULING_GATE.into(),
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(format!("uid-{namespace}-{name}")),
            labels: labels(pairs),
            creation_timestamp: Some(Time(ts(now().as_second() - age_secs))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(gates),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        }),
    }
}

/// A world at [`now`].
pub fn world(fabrics: Vec<RoceFabric>, nodes: Vec<Node>, pods: Vec<Pod>) -> World {
    let mut w = World::empty(now());
    w.fabrics = fabrics;
    w.nodes = nodes;
    w.pods = pods;
    w
}

/// What the API server holds after `writes` succeed, as the watch caches would show it.
pub fn apply_writes(world: &mut World, writes: &[Write]) {
    for write in writes {
        match write {
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
                    .find(|r| r.metadata.name.as_deref() == Some(name))
                {
                    Some(existing) => {
                        let generation = existing.metadata.generation.unwrap_or(1);
                        let changed = existing.spec != obj.spec;
                        existing.metadata.labels = obj.metadata.labels.take();
                        existing.metadata.owner_references = obj.metadata.owner_references.take();
                        existing.spec = obj.spec;
                        if changed {
                            existing.metadata.generation = Some(generation + 1);
                        }
                    }
                    None => {
                        obj.metadata.uid = Some(format!("uid-rn-{name}"));
                        obj.metadata.generation = Some(1);
                        obj.metadata.creation_timestamp = Some(Time(now()));
                        world.roce_nodes.push(obj);
                    }
                }
            }
            Write::DeleteRoceNode { name } => world
                .roce_nodes
                .retain(|r| r.metadata.name.as_deref() != Some(name)),
            Write::ApplyFabricStatus { fabric, status } => {
                if let Some(f) = world
                    .fabrics
                    .iter_mut()
                    .find(|f| f.metadata.name.as_deref() == Some(fabric))
                {
                    f.status = Some(status.clone());
                }
            }
            Write::AnnotatePodRegion {
                namespace,
                pod,
                value,
            } => {
                if let Some(p) = find_pod(world, namespace, pod) {
                    p.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(REGION_ANNOTATION.into(), value.clone());
                }
            }
            Write::RemovePodGate { namespace, pod, .. } => {
                if let Some(gates) = find_pod(world, namespace, pod)
                    .and_then(|p| p.spec.as_mut())
                    .and_then(|s| s.scheduling_gates.as_mut())
                {
                    gates.retain(|g| g.name != REGION_SCHEDULING_GATE);
                }
            }
            Write::ApplyRegionDirectory {
                namespace,
                fabric,
                fabric_uid,
                data,
            } => {
                let obj = region_directory_object(namespace, fabric, fabric_uid, data);
                world.config_maps.retain(|c| {
                    !(c.metadata.namespace == obj.metadata.namespace
                        && c.metadata.name == obj.metadata.name)
                });
                world.config_maps.push(obj);
            }
            Write::DeleteRegionDirectory { namespace, fabric } => {
                let name = rocefabric_operator::planner::writes::region_directory_name(fabric);
                world.config_maps.retain(|c| {
                    !(c.metadata.namespace.as_deref() == Some(namespace)
                        && c.metadata.name.as_deref() == Some(&name))
                });
            }
            Write::Event(_) => {}
        }
    }
}

fn find_pod<'a>(world: &'a mut World, namespace: &str, name: &str) -> Option<&'a mut Pod> {
    world.pods.iter_mut().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.metadata.name.as_deref() == Some(name)
    })
}
