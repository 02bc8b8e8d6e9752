//! Region directories cut to what the planner reads, so the watch cache and `plan`'s snapshots
//! do not hold their managedFields. Pods, nodes and RoceNodes are not trimmed but decoded
//! compact ([`crate::objects`]).

use k8s_openapi::api::core::v1::ConfigMap;

/// Strip a region directory of its managedFields.
pub fn config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_lose_only_their_managed_fields() {
        let meta = serde_json::json!({"name": "f-regions", "labels": {"rocefabric.io/fabric": "f"},
            "managedFields": [{"manager": "rocefabric-operator", "operation": "Apply"}]});
        let mut cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": meta, "data": {"directory": "x"}
        }))
        .expect("valid ConfigMap");
        config_map(&mut cm);
        assert!(cm.metadata.managed_fields.is_none());
        assert_eq!(cm.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        assert_eq!(cm.data.as_ref().map(|d| d.len()), Some(1));
    }
}
