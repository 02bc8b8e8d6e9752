//! Objects cut to what the planner reads, so the watch caches and `plan`'s snapshots hold
//! tens of bytes per field the operator uses instead of whole objects (a RoceNode's
//! managedFields, one entry per writer, outweigh its spec). Pods and nodes are not trimmed but
//! decoded compact ([`crate::objects`]).

use k8s_openapi::api::core::v1::ConfigMap;
use rocefabric_api::RoceNode;

/// Strip a RoceNode of its managedFields (the operator's apply and the agent's status write
/// each leave an entry, larger than the spec itself).
pub fn roce_node(rn: &mut RoceNode) {
    rn.metadata.managed_fields = None;
}

/// Strip a region directory of its managedFields.
pub fn config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
