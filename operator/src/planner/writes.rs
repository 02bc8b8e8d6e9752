//! The exact API writes a plan asks for, already diffed against the world: an unchanged world
//! yields none. The shell executes them in order; helpers here build the objects so that the
//! shell and the tests that replay writes agree on their exact shape.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use rocefabric_api::constants::{FABRIC_LABEL, REGION_DIRECTORY_SUFFIX};
use rocefabric_api::{RoceFabric, RoceFabricStatus, RoceNode, RoceNodeSpec};
use rocefabric_formats::names::{FABRIC_KEY_KEY, FABRIC_KEY_NAMESPACE_KEY, FABRIC_KEY_SUFFIX};
use serde::Serialize;

/// One intended API write.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Write {
    /// Server-side apply of a RoceNode: `spec`, label `rocefabric.io/fabric: <fabric_name>` and a
    /// controller owner reference to the fabric. Build the body with [`roce_node_object`].
    ApplyRoceNode {
        name: String,
        fabric_name: String,
        fabric_uid: String,
        spec: RoceNodeSpec,
    },
    /// Delete a RoceNode: its node left every fabric's selection, the node is gone, or the fabric
    /// that owned it no longer exists.
    DeleteRoceNode { name: String },
    /// Server-side apply of a fabric's status subresource.
    ApplyFabricStatus {
        fabric: String,
        status: RoceFabricStatus,
    },
    /// Set the pod annotation `rocefabric.io/region` to `value` (a JSON
    /// [`RegionAssignment`](rocefabric_formats::region::RegionAssignment)), only on the pod as
    /// the plan saw it: the write carries the pod's `uid` and `resourceVersion` as preconditions,
    /// so it fails (409) on a pod re-created under the same name or changed since (another leader
    /// may have annotated it), and the next pass re-reads instead of overwriting.
    AnnotatePodRegion {
        namespace: String,
        pod: String,
        value: String,
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// Remove the scheduling gate `rocefabric.io/region` from the pod. Always listed after the
    /// same pod's [`Write::AnnotatePodRegion`] when both are present; the shell must skip it when
    /// that annotation write failed. `remaining_gates` is the pod's gate list without ours (in
    /// order), for a patch that replaces `spec.schedulingGates`.
    RemovePodGate {
        namespace: String,
        pod: String,
        remaining_gates: Vec<String>,
    },
    /// Server-side apply of the ConfigMap `<fabric>-regions` in `namespace` with `data`, label
    /// `rocefabric.io/fabric: <fabric>` and an owner reference to the fabric. Build it with
    /// [`region_directory_object`]. The shell first creates the namespace's fabric key Secret
    /// `<fabric>-key` ([`fabric_key_object`]) unless it exists: the directory's pods mount both.
    ApplyRegionDirectory {
        namespace: String,
        fabric: String,
        fabric_uid: String,
        data: BTreeMap<String, String>,
    },
    /// Delete the ConfigMap `<fabric>-regions` in `namespace`: no region of the fabric is left
    /// there, or the fabric is gone.
    DeleteRegionDirectory { namespace: String, fabric: String },
    /// Take back the window of a pod that was not bound in time (see `reclaim`): remove its
    /// `rocefabric.io/region` annotation and set `rocefabric.io/region-reclaimed` to the message
    /// of `event`, only on the pod as seen (`uid` and `resourceVersion` are preconditions: a pod
    /// bound since keeps its window, and the write counts as not needed). `event` is recorded
    /// once done.
    ReclaimPodRegion {
        namespace: String,
        pod: String,
        uid: Option<String>,
        resource_version: Option<String>,
        event: Event,
    },
    /// Record an Event.
    Event(Event),
}

impl Write {
    /// A short label for logs and the `writes_total{kind}` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Write::ApplyRoceNode { .. } => "apply_roce_node",
            Write::DeleteRoceNode { .. } => "delete_roce_node",
            Write::ApplyFabricStatus { .. } => "apply_fabric_status",
            Write::AnnotatePodRegion { .. } => "annotate_pod_region",
            Write::RemovePodGate { .. } => "remove_pod_gate",
            Write::ApplyRegionDirectory { .. } => "apply_region_directory",
            Write::DeleteRegionDirectory { .. } => "delete_region_directory",
            Write::ReclaimPodRegion { .. } => "reclaim_pod_region",
            Write::Event(_) => "event",
        }
    }
}

/// `Normal` or `Warning`, as Kubernetes Events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// An Event about an object (a fabric or a pod).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The object the Event is about (`apiVersion`, `kind`, `name`, `namespace`, `uid`).
    pub regarding: ObjectReference,
    #[serde(rename = "type")]
    pub type_: EventType,
    /// CamelCase reason (`NodesConflicting`, `RegionReassigned`, ...).
    pub reason: String,
    pub message: String,
}

/// Name of a fabric's region directory ConfigMap (`<fabric>-regions`).
pub fn region_directory_name(fabric: &str) -> String {
    format!("{fabric}{REGION_DIRECTORY_SUFFIX}")
}

/// The controller owner reference every object the operator writes for a fabric carries.
pub fn fabric_owner_reference(fabric_name: &str, fabric_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: RoceFabric::api_version(&()).into_owned(),
        kind: RoceFabric::kind(&()).into_owned(),
        name: fabric_name.to_string(),
        uid: fabric_uid.to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The RoceNode body of a [`Write::ApplyRoceNode`] (what server-side apply sends).
pub fn roce_node_object(
    name: &str,
    fabric_name: &str,
    fabric_uid: &str,
    spec: &RoceNodeSpec,
) -> RoceNode {
    let mut node = RoceNode::new(name, spec.clone());
    node.metadata.labels = Some(BTreeMap::from([(
        FABRIC_LABEL.to_string(),
        fabric_name.to_string(),
    )]));
    node.metadata.owner_references = Some(vec![fabric_owner_reference(fabric_name, fabric_uid)]);
    node
}

/// Name of a fabric's key Secret in a namespace (`<fabric>-key`).
pub fn fabric_key_name(fabric: &str) -> String {
    format!("{fabric}{FABRIC_KEY_SUFFIX}")
}

/// The fabric key Secret of `namespace`: `key` (the 32 random bytes `key` the shell drew; the
/// data plane's rendezvous proves membership with it), `namespace` (what the pods prove being in),
/// label and owner reference as the directory's. Immutable: a key is never rotated in place (a
/// pod would hold the old one until the kubelet refreshed its volume); deleting the fabric deletes
/// it.
pub fn fabric_key_object(namespace: &str, fabric: &str, fabric_uid: &str, key: [u8; 32]) -> Secret {
    Secret {
        metadata: fabric_owned(fabric_key_name(fabric), namespace, fabric, fabric_uid),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([
            (FABRIC_KEY_KEY.to_string(), ByteString(key.to_vec())),
            (
                FABRIC_KEY_NAMESPACE_KEY.to_string(),
                ByteString(namespace.as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    }
}

/// The metadata of an object a fabric owns in `namespace`: its label and owner reference, so it
/// is listed with the fabric and deleted with it.
fn fabric_owned(name: String, namespace: &str, fabric: &str, fabric_uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([(
            FABRIC_LABEL.to_string(),
            fabric.to_string(),
        )])),
        owner_references: Some(vec![fabric_owner_reference(fabric, fabric_uid)]),
        ..ObjectMeta::default()
    }
}

/// The ConfigMap body of a [`Write::ApplyRegionDirectory`].
pub fn region_directory_object(
    namespace: &str,
    fabric: &str,
    fabric_uid: &str,
    data: &BTreeMap<String, String>,
) -> ConfigMap {
    ConfigMap {
        metadata: fabric_owned(region_directory_name(fabric), namespace, fabric, fabric_uid),
        data: Some(data.clone()),
        ..ConfigMap::default()
    }
}
