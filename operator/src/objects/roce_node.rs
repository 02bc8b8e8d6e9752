//! A RoceNode as the planner holds it, decoded straight from the watch stream (or `plan`'s
//! files): its name, the fabric label and controller it carries, its spec (what the operator
//! applies and compares), and of its status only what the rollout reads. The agent's per-
//! interface report, the conditions' messages and times, and the managedFields of its two
//! writers are skipped unbuilt: a rollout brings two events per node, and building the whole
//! object for each was most of what a RoceNode event cost the operator.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::Resource;
use rocefabric_api::constants::{FABRIC_LABEL, condition};
use rocefabric_api::{RoceFabric, RoceNode, RoceNodeSpec, RoceNodeStatus};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The fields of a RoceNode the planner reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompactRoceNode {
    pub name: String,
    /// The `rocefabric.io/fabric` label.
    pub fabric_label: Option<String>,
    /// The controller owner reference (the API server allows one): (name, uid).
    pub controller: Option<(String, String)>,
    pub spec: RoceNodeSpec,
    /// What the agent reported; `None` before its first status.
    pub status: Option<NodeReport>,
}

/// What a RoceNode's status says, as far as the rollout reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// The fabric generation whose QoS the status reports.
    pub fabric_generation: Option<i64>,
    /// The status of the `QosApplied` condition (the first of that type), as written.
    pub qos_applied: Option<String>,
    /// The `Degraded` condition is `True`.
    pub degraded: bool,
}

impl CompactRoceNode {
    /// Owned by the fabric `name` (`uid`): labelled with it and controlled by it.
    pub fn owned_by(&self, name: &str, uid: &str) -> bool {
        self.fabric_label.as_deref() == Some(name)
            && self
                .controller
                .as_ref()
                .is_some_and(|(n, u)| n == name && u == uid)
    }
}

impl NodeReport {
    /// From the status's generation and its conditions' (type, status), read as
    /// `conditions::find` does: the first of a type counts.
    fn new<'c, I>(fabric_generation: Option<i64>, conditions: I) -> Self
    where
        I: Iterator<Item = (&'c str, &'c str)> + Clone,
    {
        let first = |t: &str| conditions.clone().find(|c| c.0 == t).map(|c| c.1);
        Self {
            fabric_generation,
            qos_applied: first(condition::QOS_APPLIED).map(str::to_string),
            degraded: first(condition::DEGRADED) == Some("True"),
        }
    }
}

impl From<&RoceNode> for CompactRoceNode {
    fn from(rn: &RoceNode) -> Self {
        let meta = &rn.metadata;
        Self {
            name: meta.name.clone().unwrap_or_default(),
            fabric_label: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(FABRIC_LABEL))
                .cloned(),
            controller: meta.owner_references.iter().flatten().find_map(|r| {
                (r.controller == Some(true)).then(|| (r.name.clone(), r.uid.clone()))
            }),
            spec: rn.spec.clone(),
            status: rn.status.as_ref().map(NodeReport::from),
        }
    }
}

impl From<&RoceNodeStatus> for NodeReport {
    fn from(s: &RoceNodeStatus) -> Self {
        let conditions = s.conditions.iter();
        NodeReport::new(
            s.fabric_generation,
            conditions.map(|c| (c.type_.as_str(), c.status.as_str())),
        )
    }
}

impl From<RoceNode> for CompactRoceNode {
    fn from(rn: RoceNode) -> Self {
        Self::from(&rn)
    }
}

/// The RoceNode as the planner sees it, as an API object: what it keeps, and conditions
/// standing for its report (no reason, message or time).
impl From<&CompactRoceNode> for RoceNode {
    fn from(n: &CompactRoceNode) -> Self {
        let mut rn = RoceNode::new(&n.name, n.spec.clone());
        rn.metadata.labels = n
            .fabric_label
            .as_ref()
            .map(|f| BTreeMap::from([(FABRIC_LABEL.to_string(), f.clone())]));
        rn.metadata.owner_references = n.controller.as_ref().map(|(name, uid)| {
            vec![OwnerReference {
                api_version: RoceFabric::api_version(&()).into_owned(),
                kind: RoceFabric::kind(&()).into_owned(),
                name: name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        });
        rn.status = n.status.as_ref().map(|r| {
            let condition = |type_: &str, status: &str| Condition {
                type_: type_.into(),
                status: status.into(),
                reason: String::new(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            };
            let mut conditions = Vec::new();
            if let Some(s) = &r.qos_applied {
                conditions.push(condition(condition::QOS_APPLIED, s));
            }
            if r.degraded {
                conditions.push(condition(condition::DEGRADED, "True"));
            }
            RoceNodeStatus {
                fabric_generation: r.fabric_generation,
                conditions,
                ..RoceNodeStatus::default()
            }
        });
        rn
    }
}

/// Written as the API object it stands for ([`RoceNode`] from it).
impl serde::Serialize for CompactRoceNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RoceNode::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for CompactRoceNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(decode(d)?.0)
    }
}

/// The RoceNode and its resourceVersion, from the object's JSON.
pub(super) fn decode<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<(CompactRoceNode, Option<String>), D::Error> {
    d.deserialize_map(Fields)
}

struct Fields;

impl<'de> Visitor<'de> for Fields {
    type Value = (CompactRoceNode, Option<String>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a RoceNode")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut meta, mut spec, mut status) = (None, None, None);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "metadata" => meta = Some(map.next_value::<Meta>()?),
                "spec" => spec = Some(map.next_value::<RoceNodeSpec>()?),
                "status" => status = map.next_value::<Option<Status<'de>>>()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let meta = meta.unwrap_or_default();
        let node = CompactRoceNode {
            name: meta.name.unwrap_or_default(),
            fabric_label: meta.labels.and_then(|l| l.0),
            controller: meta
                .owner_references
                .into_iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| (r.name, r.uid)),
            spec: spec.ok_or_else(|| de::Error::missing_field("spec"))?,
            status: status.map(Status::report),
        };
        Ok((node, meta.resource_version))
    }
}

/// The metadata the planner reads; every other field (managedFields among them) is skipped.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<FabricLabel>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerRef>>,
}

/// An owner reference's fields the planner reads.
#[derive(Deserialize)]
struct OwnerRef {
    #[serde(default)]
    controller: Option<bool>,
    name: String,
    uid: String,
}

/// Of the labels, the value of `rocefabric.io/fabric`.
struct FabricLabel(Option<String>);

impl<'de> Deserialize<'de> for FabricLabel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Labels;
        impl<'de> Visitor<'de> for Labels {
            type Value = FabricLabel;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FabricLabel, A::Error> {
                let mut fabric = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == FABRIC_LABEL {
                        fabric = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(FabricLabel(fabric))
            }
        }
        d.deserialize_map(Labels)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status<'a> {
    #[serde(default)]
    fabric_generation: Option<i64>,
    #[serde(default, borrow)]
    conditions: Vec<ConditionHead<'a>>,
}

/// A condition's type and status (its reason, message and time are not read).
#[derive(Deserialize)]
struct ConditionHead<'a> {
    #[serde(rename = "type", borrow)]
    type_: Cow<'a, str>,
    #[serde(borrow)]
    status: Cow<'a, str>,
}

impl Status<'_> {
    fn report(self) -> NodeReport {
        let conditions = self.conditions.iter();
        NodeReport::new(
            self.fabric_generation,
            conditions.map(|c| (&*c.type_, &*c.status)),
        )
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
                "labels": {"rocefabric.io/fabric": "f", "other": "x"}, "annotations": {"a": "b"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x/y"],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "nu"},
                    {"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
                    "name": "f", "uid": "fu", "controller": true}],
                "futureField": {"nested": [1, 2]},
                "managedFields": [
                    {"manager": "rocefabric-operator", "operation": "Apply", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:fabric": {}, "f:qos": {"f:mtu": {}}}}},
                    {"manager": "rocefabric-agent", "operation": "Apply", "subresource": "status",
                     "fieldsV1": {"f:status": {"f:conditions": {}}}}]},
            "spec": spec,
            "status": {"fabricGeneration": 2, "observedGeneration": 3,
                "conditions": [
                    {"type": "QosApplied", "status": "False", "reason": "Failed",
                     "message": "pfc: \"write\" refused", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Degraded", "status": "True", "reason": "Failed", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "QosApplied", "status": "True", "reason": "Later", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "interfaces": [{"netdev": "eth0", "rdmaDevice": "mlx5_0", "mtu": 4200,
                    "knobs": [{"knob": "pfc", "outcome": "Failed", "message": "refused"}]}],
                "lastSyncTime": "2026-01-01T00:00:00Z"}})
    }

    #[test]
    fn a_watched_roce_node_keeps_what_the_planner_reads_as_the_full_object_gives_it() {
        let text = node().to_string();
        let wire: Wire<CompactRoceNode> = serde_json::from_str(&text).expect("decodes");
        let n = &wire.object;
        assert_eq!(n.name, "n1");
        assert_eq!(n.fabric_label.as_deref(), Some("f"));
        assert_eq!(n.controller, Some(("f".into(), "fu".into())));
        assert_eq!(n.spec.fabric_generation, 2);
        assert_eq!(
            n.status,
            Some(NodeReport {
                fabric_generation: Some(2),
                qos_applied: Some("False".into()),
                degraded: true,
            })
        );
        assert!(n.owned_by("f", "fu"));
        assert!(!n.owned_by("f", "other-uid") && !n.owned_by("g", "fu"));
        assert_eq!(
            kube::Resource::meta(&wire).resource_version.as_deref(),
            Some("42")
        );
        // The same as the full object, read by the API type, gives.
        let full: RoceNode = serde_json::from_str(&text).expect("decodes");
        assert_eq!(CompactRoceNode::from(&full), *n);
        // And the object it stands for reads back the same.
        assert_eq!(CompactRoceNode::from(&RoceNode::from(n)), *n, "round trip");
        let written = serde_json::to_value(n).expect("encodes");
        assert_eq!(
            serde_json::from_value::<CompactRoceNode>(written).expect("decodes"),
            *n
        );
    }

    #[test]
    fn a_roce_node_without_status_labels_or_controller_holds_none() {
        let mut bare = node();
        let o = bare.as_object_mut().expect("object");
        o.remove("status");
        o["metadata"] = serde_json::json!({"name": "n2",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": "u"}]});
        let n: CompactRoceNode = serde_json::from_value(bare).expect("decodes");
        assert_eq!((n.status, n.fabric_label, n.controller), (None, None, None));
    }

    #[test]
    fn a_roce_node_without_a_spec_or_with_a_bad_field_is_refused_naming_it() {
        let mut bare = node();
        bare.as_object_mut().expect("object").remove("spec");
        let e =
            serde_json::from_str::<Wire<CompactRoceNode>>(&bare.to_string()).expect_err("no spec");
        assert!(e.to_string().contains("missing field `spec`"), "{e}");
        let mut bad = node();
        bad["status"]["fabricGeneration"] = "two".into();
        let e = serde_json::from_str::<Wire<CompactRoceNode>>(&bad.to_string()).expect_err("bad");
        assert!(e.to_string().contains("invalid type"), "{e}");
        let mut bad = node();
        bad["metadata"]["labels"]["rocefabric.io/fabric"] = 3.into();
        let e = serde_json::from_str::<Wire<CompactRoceNode>>(&bad.to_string()).expect_err("bad");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
