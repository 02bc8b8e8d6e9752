//! The generated cluster the operator's planner benchmarks run on: one fabric over every node
//! labelled `gpu: h100`, with shared memory for pods labelled `app: train`; node `i` and pod `i`
//! follow from their index.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodSchedulingGate, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;
use rocefabric_api::{RoceFabric, RoceFabricSpec, RolloutSpec, SharedMemorySpec};

use crate::objects::labels;

/// The clock of the generated world: pods are created from here on, one a second.
pub fn t0() -> Timestamp {
    Timestamp::from_second(crate::objects::T0).expect("valid timestamp")
}

/// The fabric: `max_regions` regions of `region_size`, 10% of the nodes at a time.
pub fn fabric(region_size: &str, max_regions: u32) -> RoceFabric {
    let mut fabric = RoceFabric::new(
        "training",
        RoceFabricSpec {
            node_selector: LabelSelector {
                match_labels: labels(&[("gpu", "h100")]),
                ..LabelSelector::default()
            },
            shared_memory: Some(SharedMemorySpec {
                region_size: Quantity(region_size.into()),
                max_regions,
                max_regions_per_pod: None,
                max_regions_per_namespace: None,
                namespaces: Vec::new(),
                reclaim_unbound_after_seconds: None,
                pod_selector: LabelSelector {
                    match_labels: labels(&[("app", "train")]),
                    ..LabelSelector::default()
                },
            }),
            rollout: RolloutSpec {
                max_unavailable: IntOrString::String("10%".into()),
            },
            ..RoceFabricSpec::default()
        },
    );
    fabric.metadata.uid = Some("uid-training".into());
    fabric.metadata.generation = Some(1);
    fabric.metadata.creation_timestamp = Some(Time(t0()));
    fabric
}

/// Node `i`: `dgx-00042`, in the fabric, with the labels a GPU node carries.
pub fn node(i: usize) -> Node {
    let name = format!("dgx-{i:06}");
    Node {
        metadata: ObjectMeta {
            labels: labels(&[
                ("gpu", "h100"),
                ("kubernetes.io/hostname", &name),
                ("kubernetes.io/arch", "amd64"),
                ("kubernetes.io/os", "linux"),
                ("node.kubernetes.io/instance-type", "dgx-h100"),
                ("topology.kubernetes.io/zone", &format!("zone-{}", i % 4)),
                ("rack", &format!("r{}", i / 32)),
            ]),
            name: Some(name),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// Training pod `i`, created at `t0 + i` seconds in one of `namespaces`, gated, bound to a node
/// of `nodes`.
pub fn pod(i: usize, namespaces: usize, nodes: usize) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("worker-{i:07}")),
            namespace: Some(format!("team-{:04}", i % namespaces)),
            uid: Some(format!("uid-{i}")),
            resource_version: Some("1".into()),
            labels: labels(&[("app", "train"), ("job", &format!("job-{}", i / 64))]),
            creation_timestamp: Some(Time(t0() + Duration::from_secs(i as u64))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: REGION_SCHEDULING_GATE.into(),
            }]),
            node_name: Some(format!("dgx-{:06}", i % nodes)),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            pod_ip: Some(format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)),
            ..PodStatus::default()
        }),
    }
}
