//! Executes one planned [`Write`] against the API server. No decisions are made here beyond
//! what the API demands (which gate index to remove, treating "already gone" as done).
//!
//! | write | request |
//! |---|---|
//! | `ApplyRoceNode` | `PATCH /apis/rocefabric.io/v1alpha1/rocenodes/{name}?fieldManager=rocefabric-operator&force=true`, server-side apply of spec, label and controller owner reference |
//! | `DeleteRoceNode` | `DELETE /apis/rocefabric.io/v1alpha1/rocenodes/{name}` (404 counts as done) |
//! | `ApplyFabricStatus` | `PATCH /apis/rocefabric.io/v1alpha1/rocefabrics/{name}/status?fieldManager=rocefabric-operator&force=true`, server-side apply of the status subresource |
//! | `AnnotatePodRegion` | `PATCH /api/v1/namespaces/{ns}/pods/{pod}?fieldManager=rocefabric-operator`, JSON merge patch of the annotation with the pod's `uid` and `resourceVersion` as preconditions (409 when the pod is not the one planned for: the write fails and the gate stays) |
//! | `RemovePodGate` | `GET` the pod, then `PATCH` (JSON patch) `test` that `metadata.uid` is the pod read and `spec.schedulingGates[i].name` is ours, and `remove` index `i`; nothing is sent when the gate is already gone, and the gate is kept when the pod does not carry its region annotation |
//! | `ApplyRegionDirectory` | `POST /api/v1/namespaces/{ns}/secrets?fieldManager=rocefabric-operator` of the fabric key Secret `{fabric}-key` with 32 fresh random bytes (409, it exists, counts as done: a key is never replaced, and the operator needs no right to read Secrets), then `PATCH /api/v1/namespaces/{ns}/configmaps/{fabric}-regions?fieldManager=rocefabric-operator&force=true` |
//! | `DeleteRegionDirectory` | `DELETE /api/v1/namespaces/{ns}/configmaps/{fabric}-regions` (404 counts as done) |
//! | `Event` | `POST` (or `PATCH` for a repeat) `/apis/events.k8s.io/v1/namespaces/{ns}/events` through `kube::runtime::events::Recorder`; cluster-scoped objects' Events go to `default` |

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use rocefabric_api::constants::{
    OPERATOR_FIELD_MANAGER, REGION_ANNOTATION, REGION_RECLAIMED_ANNOTATION, REGION_SCHEDULING_GATE,
};
use rocefabric_api::{RoceFabric, RoceFabricStatus, RoceNode};
use rocefabric_formats::names::DIRECTORY_KEY;
use serde_json::json;

use crate::planner::writes::{
    Event, EventType, Write, fabric_key_name, fabric_key_object, region_directory_name,
    region_directory_object, roce_node_object,
};
use crate::write_client::{DirectClient, WriteClient};

/// Action of every Event the operator records (events.k8s.io/v1 requires one).
pub const EVENT_ACTION: &str = "Reconcile";

/// Errors of one write.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API server refused or failed the request.
    #[error("failed to {op} {target}: {source}")]
    Api {
        op: &'static str,
        target: String,
        #[source]
        source: kube::Error,
    },
    /// The gate was not removed: the pod does not carry its region annotation (yet).
    #[error("kept scheduling gate {gate} on pod {namespace}/{pod}: the pod has no {annotation} annotation", gate = REGION_SCHEDULING_GATE, annotation = REGION_ANNOTATION)]
    AnnotationMissing { namespace: String, pod: String },
    /// The API server did not answer in time.
    #[error("{kind} write: no answer within {after:?}")]
    Timeout {
        kind: &'static str,
        after: std::time::Duration,
    },
    /// A patch body could not be built.
    #[error("failed to build the {op} patch for {target}: {source}")]
    Body {
        op: &'static str,
        target: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ApplyError {
    /// Category for the `reconcile_failures_total{reason}` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ApplyError::Api {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                422 => "invalid",
                429 => "throttled",
                500..=599 => "server_error",
                _ => "api_error",
            },
            ApplyError::Api { .. } => "transport",
            ApplyError::AnnotationMissing { .. } => "annotation_missing",
            ApplyError::Body { .. } => "body",
            ApplyError::Timeout { .. } => "timeout",
        }
    }
}

/// What one write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The request was sent and accepted.
    Done,
    /// Nothing needed sending (the object was already gone, the gate already removed).
    AlreadyDone,
    /// The region annotation was written on the pod with this uid (as the server answered).
    Annotated { uid: Option<String> },
}

/// The client and Event recorder writes go through.
#[derive(Clone)]
pub struct Executor {
    client: Client,
    /// The RoceNode applies, where the write client has a direct stack.
    direct: Option<DirectClient>,
    recorder: Recorder,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

/// 32 bytes from the system's random source (getrandom(2); it does not fail once the pool is
/// initialized, which it is long before an operator runs).
fn fresh_key() -> [u8; 32] {
    use ring::rand::SecureRandom;
    let mut key = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .unwrap_or_else(|_| panic!("the system random source failed"));
    key
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// The JSON patch that removes from a region directory every key but its one, as it was
/// applied (its `resourceVersion` tested), or `None` when it holds no other.
fn foreign_keys_patch(cm: &ConfigMap) -> Option<json_patch::Patch> {
    let escape = |k: &str| k.replace('~', "~0").replace('/', "~1");
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion",
                              "value": cm.metadata.resource_version})];
    for k in cm.data.iter().flat_map(|d| d.keys()) {
        if k != DIRECTORY_KEY {
            ops.push(json!({"op": "remove", "path": format!("/data/{}", escape(k))}));
        }
    }
    if cm.binary_data.is_some() {
        ops.push(json!({"op": "remove", "path": "/binaryData"}));
    }
    (ops.len() > 1).then(|| serde_json::from_value(json!(ops)).ok())?
}

/// A merge patch of a pod's `annotations`, only on the pod as seen: its `uid` and
/// `resourceVersion`, when known, are preconditions (409 on a pod changed or re-created since).
fn pod_annotations_patch(
    annotations: serde_json::Value,
    (uid, resource_version): (Option<&str>, Option<&str>),
) -> serde_json::Value {
    let mut metadata = json!({ "annotations": annotations });
    if let Some(uid) = uid {
        metadata["uid"] = json!(uid);
    }
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

fn ssa() -> PatchParams {
    PatchParams::apply(OPERATOR_FIELD_MANAGER).force()
}

fn managed_patch() -> PatchParams {
    PatchParams {
        field_manager: Some(OPERATOR_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

impl Executor {
    /// An executor whose Events are reported by `rocefabric-operator` / `instance`.
    pub fn new(writer: impl Into<WriteClient>, instance: impl Into<String>) -> Self {
        let WriteClient { client, direct } = writer.into();
        let reporter = Reporter {
            controller: OPERATOR_FIELD_MANAGER.to_string(),
            instance: Some(instance.into()),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            direct,
            recorder,
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Execute `write`.
    // A debug span: at info, a rollout would build one span per node for nothing.
    #[tracing::instrument(level = "debug", skip_all, fields(kind = write.kind()))]
    pub async fn execute(&self, write: &Write) -> Result<Outcome, ApplyError> {
        match write {
            Write::ApplyRoceNode {
                name,
                fabric_name,
                fabric_uid,
                spec,
            } => {
                let body = roce_node_object(name, fabric_name, fabric_uid, spec);
                self.apply_roce_node(name, fabric_name, &body).await
            }
            Write::DeleteRoceNode { name } => self.delete_roce_node(name).await,
            Write::ApplyFabricStatus { fabric, status } => {
                self.apply_fabric_status(fabric, status).await
            }
            Write::AnnotatePodRegion {
                namespace,
                pod,
                value,
                uid,
                resource_version,
            } => {
                let preconditions = (uid.as_deref(), resource_version.as_deref());
                self.annotate_pod(namespace, pod, value, preconditions)
                    .await
            }
            Write::RemovePodGate { namespace, pod, .. } => self.remove_gate(namespace, pod).await,
            Write::ApplyRegionDirectory {
                namespace,
                fabric,
                fabric_uid,
                data,
            } => {
                self.ensure_fabric_key(namespace, fabric, fabric_uid)
                    .await?;
                let body = region_directory_object(namespace, fabric, fabric_uid, data);
                self.apply_directory(namespace, fabric, &body).await
            }
            Write::DeleteRegionDirectory { namespace, fabric } => {
                self.delete_directory(namespace, fabric).await
            }
            Write::ReclaimPodRegion {
                namespace,
                pod,
                uid,
                resource_version,
                event,
            } => {
                let preconditions = (uid.as_deref(), resource_version.as_deref());
                let outcome = self
                    .reclaim_region(namespace, pod, &event.message, preconditions)
                    .await?;
                if outcome == Outcome::Done {
                    self.record_event(event).await?;
                }
                Ok(outcome)
            }
            Write::Event(event) => self.record_event(event).await,
        }
    }

    async fn apply_roce_node(
        &self,
        name: &str,
        fabric_name: &str,
        body: &RoceNode,
    ) -> Result<Outcome, ApplyError> {
        // The API server answers with the whole object, which nothing here reads: a rollout
        // sends one apply per node, and decoding each answer cost more CPU than sending it.
        let sent = async {
            let request = kube::core::Request::new(RoceNode::url_path(&(), None))
                .patch(name, &ssa(), &Patch::Apply(body))
                .map_err(kube::Error::BuildRequest)?;
            match &self.direct {
                Some(direct) => direct.send(request).await.map(drop),
                None => self.client.request_text(request).await.map(drop),
            }
        };
        sent.await.map_err(|source| ApplyError::Api {
            op: "apply",
            target: format!("rocenode {name}"),
            source,
        })?;
        tracing::debug!(rocenode = %name, fabric = %fabric_name, "applied rocenode");
        Ok(Outcome::Done)
    }

    async fn delete_roce_node(&self, name: &str) -> Result<Outcome, ApplyError> {
        let api: Api<RoceNode> = Api::all(self.client.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(Outcome::Done),
            Err(e) if is_not_found(&e) => Ok(Outcome::AlreadyDone),
            Err(source) => Err(ApplyError::Api {
                op: "delete",
                target: format!("rocenode {name}"),
                source,
            }),
        }
    }

    async fn apply_fabric_status(
        &self,
        fabric: &str,
        status: &RoceFabricStatus,
    ) -> Result<Outcome, ApplyError> {
        let api: Api<RoceFabric> = Api::all(self.client.clone());
        let body = json!({
            "apiVersion": RoceFabric::api_version(&()),
            "kind": RoceFabric::kind(&()),
            "status": status,
        });
        match api.patch_status(fabric, &ssa(), &Patch::Apply(&body)).await {
            Ok(_) => Ok(Outcome::Done),
            // The fabric was deleted since the world was read: nothing to report on.
            Err(e) if is_not_found(&e) => Ok(Outcome::AlreadyDone),
            Err(source) => Err(ApplyError::Api {
                op: "apply status of",
                target: format!("rocefabric {fabric}"),
                source,
            }),
        }
    }

    /// Record `value` as the pod's region, on the condition (`uid`, `resourceVersion`) that the
    /// pod is still the one planned for: the API server refuses (409) a patch whose uid or
    /// resourceVersion differs from the stored pod's.
    async fn annotate_pod(
        &self,
        namespace: &str,
        pod: &str,
        value: &str,
        (uid, resource_version): (Option<&str>, Option<&str>),
    ) -> Result<Outcome, ApplyError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let body =
            pod_annotations_patch(json!({ REGION_ANNOTATION: value }), (uid, resource_version));
        let patched = api
            .patch(pod, &managed_patch(), &Patch::Merge(&body))
            .await
            .map_err(|source| ApplyError::Api {
                op: "annotate",
                target: format!("pod {namespace}/{pod}"),
                source,
            })?;
        tracing::info!(%namespace, %pod, region = %value, "recorded region on pod");
        Ok(Outcome::Annotated {
            uid: patched.metadata.uid,
        })
    }

    /// Remove the pod's region annotation and say why in `rocefabric.io/region-reclaimed`, as
    /// the pod was seen: a pod changed since (bound, re-created) is left alone.
    async fn reclaim_region(
        &self,
        namespace: &str,
        pod: &str,
        message: &str,
        (uid, resource_version): (Option<&str>, Option<&str>),
    ) -> Result<Outcome, ApplyError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let body = pod_annotations_patch(
            json!({ REGION_ANNOTATION: null, REGION_RECLAIMED_ANNOTATION: message }),
            (uid, resource_version),
        );
        match api.patch(pod, &managed_patch(), &Patch::Merge(&body)).await {
            Ok(_) => {
                tracing::warn!(%namespace, %pod, "reclaimed the window of a pod not bound in time");
                Ok(Outcome::Done)
            }
            // Changed since (bound, most likely) or gone: the next pass reads it again.
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(Outcome::AlreadyDone),
            Err(source) => Err(ApplyError::Api {
                op: "reclaim the region of",
                target: format!("pod {namespace}/{pod}"),
                source,
            }),
        }
    }

    async fn apply_directory(
        &self,
        namespace: &str,
        fabric: &str,
        body: &ConfigMap,
    ) -> Result<Outcome, ApplyError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let name = region_directory_name(fabric);
        let err = |op: &'static str| {
            let target = format!("configmap {namespace}/{name}");
            move |source| ApplyError::Api { op, target, source }
        };
        let applied = api
            .patch(&name, &ssa(), &Patch::Apply(body))
            .await
            .map_err(err("apply"))?;
        // A ConfigMap of this name that someone else wrote first keeps the keys the apply does
        // not own: the directory is replaced, so they go (as the directory was when applied).
        if let Some(strip) = foreign_keys_patch(&applied) {
            tracing::warn!(%namespace, configmap = %name, "removed keys someone else wrote into the region directory");
            api.patch(&name, &managed_patch(), &Patch::<()>::Json(strip))
                .await
                .map_err(err("replace"))?;
        }
        Ok(Outcome::Done)
    }

    /// Create the namespace's fabric key Secret unless it exists (never read nor replaced).
    async fn ensure_fabric_key(
        &self,
        namespace: &str,
        fabric: &str,
        fabric_uid: &str,
    ) -> Result<Outcome, ApplyError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let body = fabric_key_object(namespace, fabric, fabric_uid, fresh_key());
        let params = PostParams {
            field_manager: Some(OPERATOR_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match api.create(&params, &body).await {
            Ok(_) => {
                tracing::info!(%namespace, %fabric, "created the fabric key secret");
                Ok(Outcome::Done)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Outcome::AlreadyDone),
            Err(source) => Err(ApplyError::Api {
                op: "create",
                target: format!("secret {namespace}/{}", fabric_key_name(fabric)),
                source,
            }),
        }
    }

    async fn delete_directory(&self, namespace: &str, fabric: &str) -> Result<Outcome, ApplyError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let name = region_directory_name(fabric);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(Outcome::Done),
            Err(e) if is_not_found(&e) => Ok(Outcome::AlreadyDone),
            Err(source) => Err(ApplyError::Api {
                op: "delete",
                target: format!("configmap {namespace}/{name}"),
                source,
            }),
        }
    }

    async fn record_event(&self, event: &Event) -> Result<Outcome, ApplyError> {
        let ev = KubeEvent {
            type_: match event.type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: event.reason.clone(),
            note: Some(event.message.clone()),
            action: EVENT_ACTION.to_string(),
            secondary: None,
        };
        self.recorder
            .publish(&ev, &event.regarding)
            .await
            .map_err(|source| ApplyError::Api {
                op: "record event on",
                target: format!(
                    "{} {}",
                    event.regarding.kind.as_deref().unwrap_or("object"),
                    event.regarding.name.as_deref().unwrap_or("")
                ),
                source,
            })?;
        Ok(Outcome::Done)
    }

    /// Remove our scheduling gate with a JSON patch that first tests the pod's uid and the gate's
    /// index, so a pod replaced under the same name, or a concurrent change of the gate list,
    /// makes the patch fail instead of removing another pod's or another gate.
    async fn remove_gate(&self, namespace: &str, pod: &str) -> Result<Outcome, ApplyError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let target = || format!("pod {namespace}/{pod}");
        let Some(current) = api.get_opt(pod).await.map_err(|source| ApplyError::Api {
            op: "get",
            target: target(),
            source,
        })?
        else {
            return Ok(Outcome::AlreadyDone);
        };
        let gates = current
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_deref())
            .unwrap_or_default();
        let Some(index) = gates.iter().position(|g| g.name == REGION_SCHEDULING_GATE) else {
            return Ok(Outcome::AlreadyDone);
        };
        let annotated = current
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(REGION_ANNOTATION));
        if !annotated {
            return Err(ApplyError::AnnotationMissing {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
            });
        }
        // Bound to the pod just read: see `gate_removal_patch`.
        let uid = current.metadata.uid.clone().unwrap_or_default();
        let patch = gate_removal_patch(&uid, index).map_err(|source| ApplyError::Body {
            op: "gate removal",
            target: target(),
            source,
        })?;
        api.patch(pod, &managed_patch(), &Patch::<()>::Json(patch))
            .await
            .map_err(|source| ApplyError::Api {
                op: "remove scheduling gate from",
                target: target(),
                source,
            })?;
        tracing::info!(%namespace, %pod, gate = REGION_SCHEDULING_GATE, "removed scheduling gate");
        Ok(Outcome::Done)
    }
}

/// The JSON patch that removes our scheduling gate at `index` from the pod whose uid is `uid`.
/// Its `test` operations make the API server refuse it (422) when the pod named is no longer that
/// pod (deleted and created again under the same name, with no window yet) or the gate moved, so
/// the removal never lands on another pod or another gate.
pub fn gate_removal_patch(uid: &str, index: usize) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/uid", "value": uid },
        { "op": "test", "path": format!("/spec/schedulingGates/{index}/name"), "value": REGION_SCHEDULING_GATE },
        { "op": "remove", "path": format!("/spec/schedulingGates/{index}") },
    ]))
}
