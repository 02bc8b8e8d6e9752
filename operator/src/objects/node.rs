//! A node as the planner holds it: its name and labels (what fabrics select by), decoded
//! straight from the metadata-only watch or `plan`'s files. A full `Node` (1,496 bytes inline,
//! its images and conditions) is never built.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{Deserialize, Deserializer};

use super::labels::Labels;

/// The fields of a node the planner reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactNode {
    pub name: String,
    pub labels: Labels,
}

impl From<&Node> for CompactNode {
    fn from(node: &Node) -> Self {
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: Labels::from(node.metadata.labels.as_ref()),
        }
    }
}

impl From<Node> for CompactNode {
    fn from(node: Node) -> Self {
        Self::from(&node)
    }
}

/// The node as the planner sees it, as an API object (tests and what-ifs edit it so).
impl From<&CompactNode> for Node {
    fn from(n: &CompactNode) -> Self {
        let labels: std::collections::BTreeMap<String, String> = n
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Node {
            metadata: ObjectMeta {
                name: Some(n.name.clone()),
                labels: (!labels.is_empty()).then_some(labels),
                ..ObjectMeta::default()
            },
            spec: None,
            status: None,
        }
    }
}

/// Written as the API object it stands for ([`Node`] from it).
impl serde::Serialize for CompactNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Node::from(self).serialize(s)
    }
}

#[derive(serde::Deserialize)]
pub(super) struct Raw {
    metadata: Option<RawMeta>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    resource_version: Option<String>,
    labels: Option<Labels>,
}

impl Raw {
    /// The node and its resourceVersion.
    pub(super) fn split(self) -> (CompactNode, Option<String>) {
        let meta = self.metadata.unwrap_or_default();
        let node = CompactNode {
            name: meta.name.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
        };
        (node, meta.resource_version)
    }
}

impl<'de> Deserialize<'de> for CompactNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Raw::deserialize(d)?.split().0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_decodes_to_its_name_and_labels() {
        let full = serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "3",
                "labels": {"gpu": "h100", "kubernetes.io/os": "linux"},
                "annotations": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
            "status": {"images": [{"names": ["x"], "sizeBytes": 1}]}});
        let (node, rv) = serde_json::from_value::<Raw>(full.clone())
            .expect("a node")
            .split();
        assert_eq!(node.name, "n1");
        assert_eq!(rv.as_deref(), Some("3"));
        assert_eq!(node.labels.get("gpu"), Some("h100"));
        let full: Node = serde_json::from_value(full).expect("a node");
        assert_eq!(CompactNode::from(&full), node);
        assert_eq!(CompactNode::from(&Node::from(&node)), node, "a round trip");
    }
}
