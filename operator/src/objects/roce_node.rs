//! A RoceNode as the watch decodes it: the whole object but its managedFields, which are skipped
//! while decoding instead of built and dropped ([`crate::trim`]). A RoceNode has two writers
//! (the operator's apply, the agent's status), each with a tree of field names that outweighs
//! the spec, and a rollout brings two events per node: the decode was most of what a RoceNode
//! event cost the operator.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use rocefabric_api::{RoceNode, RoceNodeSpec, RoceNodeStatus};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::wire::Compact;

impl Compact for RoceNode {
    type Full = RoceNode;
    const METADATA_ONLY: bool = false;
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<(Self, Option<String>), D::Error> {
        let node = d.deserialize_map(Trimmed)?;
        let rv = node.metadata.resource_version.clone();
        Ok((node, rv))
    }
}

/// A RoceNode's fields, its metadata without managedFields.
struct Trimmed;

impl<'de> Visitor<'de> for Trimmed {
    type Value = RoceNode;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a RoceNode")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RoceNode, A::Error> {
        let (mut metadata, mut spec, mut status) = (None, None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "metadata" => metadata = Some(ObjectMeta::from(map.next_value::<Meta>()?)),
                "spec" => spec = Some(map.next_value::<RoceNodeSpec>()?),
                "status" => status = map.next_value::<Option<RoceNodeStatus>>()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RoceNode {
            metadata: metadata.unwrap_or_default(),
            spec: spec.ok_or_else(|| de::Error::missing_field("spec"))?,
            status,
        })
    }
}

/// Object metadata without its managedFields: every field of `ObjectMeta` but that one, decoded
/// straight from the stream (unknown keys, managedFields among them, are skipped unbuilt).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        // Every field named: a field k8s-openapi adds fails the build here, not silently.
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Wire;
    use serde_json::Value;

    fn node() -> Value {
        let mut spec = serde_json::to_value(RoceNodeSpec::default()).expect("encodes");
        spec["fabric"] = "f".into();
        spec["fabricGeneration"] = 2.into();
        serde_json::json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNode",
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "42", "generation": 3,
                "labels": {"rocefabric.io/fabric": "f"}, "annotations": {"a": "b"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x/y"],
                "ownerReferences": [{"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
                    "name": "f", "uid": "fu", "controller": true}],
                "futureField": {"nested": [1, 2]},
                "managedFields": [
                    {"manager": "rocefabric-operator", "operation": "Apply", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:fabric": {}, "f:qos": {"f:mtu": {}}}}},
                    {"manager": "rocefabric-agent", "operation": "Apply", "subresource": "status",
                     "fieldsV1": {"f:status": {"f:conditions": {}}}}]},
            "spec": spec,
            "status": {"fabricGeneration": 2, "observedGeneration": 3,
                "conditions": [{"type": "QosApplied", "status": "True", "reason": "Applied",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    }

    #[test]
    fn a_watched_roce_node_is_the_object_without_its_managed_fields() {
        let text = node().to_string();
        let wire: Wire<RoceNode> = serde_json::from_str(&text).expect("decodes");
        let mut full: RoceNode = serde_json::from_str(&text).expect("decodes");
        assert!(full.metadata.managed_fields.is_some());
        full.metadata.managed_fields = None;
        assert_eq!(
            serde_json::to_value(&wire.object).expect("encodes"),
            serde_json::to_value(&full).expect("encodes")
        );
        assert_eq!(wire.object.spec.fabric_generation, 2);
        assert_eq!(
            wire.object.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(wire.object.metadata.creation_timestamp.is_some());
        assert_eq!(
            kube::Resource::meta(&wire).resource_version.as_deref(),
            Some("42")
        );
    }

    #[test]
    fn a_roce_node_without_a_spec_or_with_a_bad_field_is_refused_naming_it() {
        let mut bare = node();
        bare.as_object_mut().expect("object").remove("spec");
        let e = serde_json::from_str::<Wire<RoceNode>>(&bare.to_string()).expect_err("no spec");
        assert!(e.to_string().contains("missing field `spec`"), "{e}");
        let mut bad = node();
        bad["status"]["fabricGeneration"] = "two".into();
        let e = serde_json::from_str::<Wire<RoceNode>>(&bad.to_string()).expect_err("bad");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
