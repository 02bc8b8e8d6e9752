//! A RoceNode as the watch decodes it: the whole object but its managedFields, which are skipped
//! while decoding instead of built and dropped ([`crate::trim`]). A RoceNode has two writers
//! (the operator's apply, the agent's status), each with a tree of field names that outweighs
//! the spec, and a rollout brings two events per node: the decode was most of what a RoceNode
//! event cost the operator.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rocefabric_api::{RoceNode, RoceNodeSpec, RoceNodeStatus};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

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
                "metadata" => metadata = Some(map.next_value::<Meta>()?.0),
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

/// Object metadata without its managedFields.
struct Meta(ObjectMeta);

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Map<String, Value>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("object metadata")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "managedFields" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        kept.insert(key, map.next_value()?);
                    }
                }
                Ok(kept)
            }
        }
        let kept = d.deserialize_map(Fields)?;
        ObjectMeta::deserialize(Value::Object(kept))
            .map(Meta)
            .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Wire;

    fn node() -> Value {
        let mut spec = serde_json::to_value(RoceNodeSpec::default()).expect("encodes");
        spec["fabric"] = "f".into();
        spec["fabricGeneration"] = 2.into();
        serde_json::json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNode",
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "42", "generation": 3,
                "labels": {"rocefabric.io/fabric": "f"},
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
