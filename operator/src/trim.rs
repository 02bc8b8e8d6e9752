//! Objects cut to what the planner reads, so the watch caches and `plan`'s snapshots hold
//! tens of bytes per field the operator uses instead of whole objects (a pod's containers,
//! statuses, managedFields and `last-applied-configuration` are most of its size; a RoceNode's
//! managedFields, one entry per writer, outweigh its spec).

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, PodSpec, PodStatus};
use rocefabric_api::RoceNode;
use rocefabric_api::constants::GROUP;

/// Strip a pod to its metadata (without managedFields and owner references, and with only the
/// `rocefabric.io/` annotations), node name, scheduling gates, phase and IPs.
pub fn pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.owner_references = None;
    if let Some(annotations) = &mut pod.metadata.annotations {
        annotations.retain(|k, _| ours(k));
    }
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            scheduling_gates: spec.scheduling_gates,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            ..PodStatus::default()
        });
    }
}

/// Strip a node to its metadata (the operator watches nodes as `PartialObjectMeta`), without
/// managedFields and annotations.
pub fn node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.spec = None;
    node.status = None;
}

/// Strip a RoceNode of its managedFields (the operator's apply and the agent's status write
/// each leave an entry, larger than the spec itself).
pub fn roce_node(rn: &mut RoceNode) {
    rn.metadata.managed_fields = None;
}

/// Strip a region directory of its managedFields.
pub fn config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
}

/// An annotation of ours: `rocefabric.io/...`.
fn ours(key: &str) -> bool {
    key.strip_prefix(GROUP)
        .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trimmed_pod_keeps_what_the_planner_reads() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x"},
                "annotations": {"rocefabric.io/region": "{}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "a-1", "uid": "u1"}]},
            "spec": {"nodeName": "n1", "schedulingGates": [{"name": "rocefabric.io/region"}],
                "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "containerStatuses": []}
        }))
        .expect("valid pod");
        pod(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        assert!(p.metadata.owner_references.is_none());
        assert_eq!(p.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        let annotations = p.metadata.annotations.as_ref().expect("ours kept");
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["rocefabric.io/region"]
        );
        let spec = p.spec.as_ref().expect("spec kept");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.scheduling_gates.as_ref().map(|g| g.len()), Some(1));
        assert!(spec.containers.is_empty());
        let status = p.status.as_ref().expect("status kept");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert!(status.container_statuses.is_none());
    }

    #[test]
    fn roce_nodes_and_directories_lose_only_their_managed_fields() {
        let meta = serde_json::json!({"name": "n1", "labels": {"rocefabric.io/fabric": "f"},
            "managedFields": [{"manager": "rocefabric-operator", "operation": "Apply"}]});
        let mut rn: RoceNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNode", "metadata": meta,
            "spec": {"fabric": "f", "fabricGeneration": 1, "qos": {}}
        }))
        .expect("valid RoceNode");
        let before = rn.spec.clone();
        roce_node(&mut rn);
        assert!(rn.metadata.managed_fields.is_none());
        assert_eq!(rn.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        assert_eq!(
            serde_json::to_value(&rn.spec).ok(),
            serde_json::to_value(&before).ok()
        );
        let mut cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": meta, "data": {"directory": "x"}
        }))
        .expect("valid ConfigMap");
        config_map(&mut cm);
        assert!(cm.metadata.managed_fields.is_none());
        assert_eq!(cm.data.as_ref().map(|d| d.len()), Some(1));
    }

    #[test]
    fn only_our_annotations_count_as_ours() {
        assert!(ours("rocefabric.io/region"));
        assert!(!ours("rocefabric.iox/region"));
        assert!(!ours("example.com/rocefabric.io"));
    }
}
