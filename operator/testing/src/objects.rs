//! Builders of the cluster objects the operator's tests plan over (fabrics, nodes, pods), on a
//! test clock that starts at [`T0`], and what a fake node agent reports.

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
use rocefabric_api::{RoceFabric, RoceFabricSpec, RoceNodeStatus, RolloutSpec, SharedMemorySpec};

/// Seconds since the epoch of the test clock's start (2026-01-01T00:00:00Z).
pub const T0: i64 = 1_767_225_600;

pub fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid timestamp")
}

/// "Now" of the tests' worlds: an hour after [`T0`].
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
/// `rocefabric.io/fabric: <name>`), any namespace's pods together holding all of them.
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
        // Every region to one namespace (the fabric's admin lifts the default quarter): these
        // fixtures are about the allocation, `with_caps` about the limits.
        max_regions_per_namespace: Some(max),
        namespaces: Vec::new(),
        reclaim_unbound_after_seconds: None,
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

/// What a node agent reports once it applied (`applied`) or failed to apply the spec of
/// `generation`, with the condition's transition at `at`.
pub fn agent_status(generation: i64, applied: bool, at: Timestamp) -> RoceNodeStatus {
    RoceNodeStatus {
        fabric_generation: Some(generation),
        conditions: vec![Condition {
            type_: condition::QOS_APPLIED.into(),
            status: if applied { "True" } else { "False" }.into(),
            reason: if applied { "QosApplied" } else { "QosFailed" }.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(at),
        }],
        ..RoceNodeStatus::default()
    }
}
