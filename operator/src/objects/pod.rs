//! A pod as the planner holds it, decoded straight from the API server's JSON (or `plan`'s
//! files): what the planner reads and nothing else. A full `Pod` is never built, so neither its
//! size (2,176 bytes inline before any string) nor the time to decode its containers, statuses
//! and managedFields is paid for each of a cluster's pods.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::{
    REGION_ANNOTATION, REGION_RECLAIMED_ANNOTATION, REGION_SIZE_ANNOTATION,
};
use rocefabric_formats::names::WINDOW_FAILED_MESSAGE_PREFIX;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::labels::{Labels, Sym, Text, intern};

/// The fields of a pod the planner reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactPod {
    pub namespace: Sym,
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub created: Option<Timestamp>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub labels: Labels,
    /// The `rocefabric.io/region` annotation.
    pub region: Option<String>,
    /// The `rocefabric.io/region-size` annotation.
    pub region_size: Option<String>,
    /// The pod has the `rocefabric.io/region-reclaimed` annotation: its window was taken back
    /// and it gets no other (only the fact is kept, not the text).
    pub region_reclaimed: bool,
    pub node_name: Option<String>,
    /// The names of `spec.schedulingGates`.
    pub gates: Vec<String>,
    pub phase: Option<Sym>,
    pub pod_ip: Option<String>,
    /// A container of the pod is down because `rocefabric-dsm` could not back or pin its window:
    /// its termination message (now, or the last one while it waits to restart) begins with
    /// [`WINDOW_FAILED_MESSAGE_PREFIX`]. Only the fact is kept, never the pod's text.
    pub window_failed: bool,
}

/// The longest `rocefabric.io/region-size` kept as written: a quantity (`4Gi`, `1099511627776`)
/// is far shorter. A longer value, which any tenant who creates pods can write (up to the API
/// server's 256 KiB of annotations), is kept as a short excerpt that names its length and never
/// parses, so the pod is reported invalid by name and neither the operator's memory nor the
/// fabric's status holds the text.
pub const MAX_REGION_SIZE_TEXT: usize = 64;

/// `rocefabric.io/region-size` as the planner keeps it: bounded by [`MAX_REGION_SIZE_TEXT`].
fn region_size_text(value: &str) -> String {
    if value.len() <= MAX_REGION_SIZE_TEXT {
        value.to_string()
    } else {
        rocefabric_input::shown::shown_within(value, 16)
    }
}

/// Whether a container's termination message is `rocefabric-dsm`'s window failure.
fn window_failure(message: Option<&str>) -> bool {
    message.is_some_and(|m| m.starts_with(WINDOW_FAILED_MESSAGE_PREFIX))
}

/// A container that is not running again since `rocefabric-dsm` gave up on its window.
fn container_window_failed(c: &k8s_openapi::api::core::v1::ContainerStatus) -> bool {
    fn message(s: Option<&k8s_openapi::api::core::v1::ContainerState>) -> Option<&str> {
        s.and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.as_deref())
    }
    let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
    window_failure(message(c.state.as_ref()))
        || (!running && window_failure(message(c.last_state.as_ref())))
}

impl CompactPod {
    /// `namespace/name`.
    pub fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

impl From<&Pod> for CompactPod {
    fn from(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        Self {
            namespace: intern(meta.namespace.as_deref().unwrap_or_default()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            deleting: meta.deletion_timestamp.is_some(),
            labels: Labels::from(meta.labels.as_ref()),
            region: annotation(REGION_ANNOTATION),
            region_size: annotation(REGION_SIZE_ANNOTATION).map(|v| region_size_text(&v)),
            region_reclaimed: annotation(REGION_RECLAIMED_ANNOTATION).is_some(),
            node_name: spec.and_then(|s| s.node_name.clone()),
            gates: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .map(|g| g.iter().map(|g| g.name.clone()).collect())
                .unwrap_or_default(),
            phase: status.and_then(|s| s.phase.as_deref()).map(intern),
            pod_ip: status.and_then(|s| s.pod_ip.clone()),
            window_failed: status
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().any(container_window_failed)),
        }
    }
}

impl From<Pod> for CompactPod {
    fn from(pod: Pod) -> Self {
        Self::from(&pod)
    }
}

/// The pod as the planner sees it, as an API object (tests and what-ifs edit it so).
impl From<&CompactPod> for Pod {
    fn from(p: &CompactPod) -> Self {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateTerminated, ContainerStatus, PodSchedulingGate, PodSpec,
            PodStatus,
        };
        let reclaimed = p.region_reclaimed.then(|| "reclaimed".to_string());
        let annotations: std::collections::BTreeMap<String, String> = [
            (REGION_ANNOTATION, &p.region),
            (REGION_SIZE_ANNOTATION, &p.region_size),
            (REGION_RECLAIMED_ANNOTATION, &reclaimed),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
        .collect();
        let labels: std::collections::BTreeMap<String, String> = p
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let gates = p
            .gates
            .iter()
            .map(|name| PodSchedulingGate { name: name.clone() });
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(p.namespace.to_string()),
                name: Some(p.name.clone()),
                uid: p.uid.clone(),
                resource_version: p.resource_version.clone(),
                creation_timestamp: p.created.map(Time),
                deletion_timestamp: p.deleting.then(|| Time(p.created.unwrap_or_default())),
                labels: (!labels.is_empty()).then_some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: p.node_name.clone(),
                scheduling_gates: (!p.gates.is_empty()).then(|| gates.collect()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: p.phase.as_deref().map(str::to_string),
                pod_ip: p.pod_ip.clone(),
                container_statuses: p.window_failed.then(|| {
                    vec![ContainerStatus {
                        name: "dsm".into(),
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: 1,
                                message: Some(format!("{WINDOW_FAILED_MESSAGE_PREFIX}...")),
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        }),
                        ..ContainerStatus::default()
                    }]
                }),
                ..PodStatus::default()
            }),
        }
    }
}

/// Written as the API object it stands for ([`Pod`] from it).
impl serde::Serialize for CompactPod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Pod::from(self).serialize(s)
    }
}

#[derive(serde::Deserialize)]
struct Raw {
    metadata: Option<RawMeta>,
    spec: Option<RawSpec>,
    status: Option<RawStatus>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<Labels>,
    annotations: Option<Ours>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    node_name: Option<String>,
    scheduling_gates: Option<Vec<RawGate>>,
}

#[derive(serde::Deserialize)]
struct RawGate {
    name: String,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default)]
    container_statuses: Vec<RawContainerStatus>,
}

/// Of a container's status, whether it runs and whether its termination messages are the data
/// plane's window failure; the messages themselves are read and dropped.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawContainerStatus {
    state: Option<RawState>,
    last_state: Option<RawState>,
}

#[derive(serde::Deserialize)]
struct RawState {
    running: Option<IgnoredAny>,
    terminated: Option<RawTerminated>,
}

#[derive(serde::Deserialize)]
struct RawTerminated {
    #[serde(default, deserialize_with = "is_window_failure")]
    message: bool,
}

fn is_window_failure<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let text = Option::<Text<'de>>::deserialize(d)?;
    Ok(window_failure(text.as_ref().map(|t| &*t.0)))
}

impl RawContainerStatus {
    fn window_failed(&self) -> bool {
        let failed = |s: &Option<RawState>| {
            s.as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.message)
        };
        let running = self.state.as_ref().is_some_and(|s| s.running.is_some());
        failed(&self.state) || (!running && failed(&self.last_state))
    }
}

/// The annotations the planner reads; the others (a `last-applied-configuration` may be
/// most of a pod) are skipped unread.
#[derive(Default)]
struct Ours {
    region: Option<String>,
    region_size: Option<String>,
    region_reclaimed: bool,
}

impl<'de> Deserialize<'de> for Ours {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ours;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ours, A::Error> {
                let mut ours = Ours::default();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match &*key.0 {
                        REGION_ANNOTATION => ours.region = Some(map.next_value()?),
                        REGION_SIZE_ANNOTATION => {
                            let text: Text<'de> = map.next_value()?;
                            ours.region_size = Some(region_size_text(&text.0));
                        }
                        REGION_RECLAIMED_ANNOTATION => {
                            map.next_value::<IgnoredAny>()?;
                            ours.region_reclaimed = true;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ours)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for CompactPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Raw {
            metadata,
            spec,
            status,
        } = Raw::deserialize(d)?;
        let meta = metadata.unwrap_or_default();
        let ours = meta.annotations.unwrap_or_default();
        let (node_name, gates) = spec.map_or((None, None), |s| (s.node_name, s.scheduling_gates));
        let (phase, pod_ip, window_failed) = status.map_or((None, None, false), |s| {
            let failed = s
                .container_statuses
                .iter()
                .any(RawContainerStatus::window_failed);
            (s.phase, s.pod_ip, failed)
        });
        Ok(Self {
            namespace: intern(meta.namespace.as_deref().unwrap_or_default()),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid,
            resource_version: meta.resource_version,
            created: meta.creation_timestamp.map(|t| t.0),
            deleting: meta.deletion_timestamp.is_some(),
            labels: meta.labels.unwrap_or_default(),
            region: ours.region,
            region_size: ours.region_size,
            region_reclaimed: ours.region_reclaimed,
            node_name,
            gates: gates
                .map(|g| g.into_iter().map(|g| g.name).collect())
                .unwrap_or_default(),
            phase: phase.as_deref().map(intern),
            pod_ip,
            window_failed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "deletionTimestamp": "2024-01-02T00:00:00Z",
                "labels": {"app": "x", "rocefabric.io/fabric": "f"},
                "annotations": {"rocefabric.io/region": "{}", "rocefabric.io/region-size": "2Mi",
                    "rocefabric.io/other": "o",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "a-1", "uid": "u0"}]},
            "spec": {"nodeName": "n1",
                "schedulingGates": [{"name": "rocefabric.io/region"}, {"name": "other"}],
                "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "containerStatuses": []}
        })
    }

    #[test]
    fn an_oversize_region_size_is_kept_as_a_short_excerpt_that_never_parses() {
        let mut p = full();
        let hostile = "1".repeat(250 << 10);
        p["metadata"]["annotations"]["rocefabric.io/region-size"] = serde_json::json!(hostile);
        let decoded: CompactPod = serde_json::from_value(p.clone()).expect("valid pod");
        let full_pod: Pod = serde_json::from_value(p).expect("valid pod");
        assert_eq!(CompactPod::from(&full_pod), decoded, "both decoders agree");
        let kept = decoded.region_size.expect("kept as an excerpt");
        assert!(kept.len() < 40, "{} bytes kept", kept.len());
        assert!(kept.ends_with("…(256000 bytes)"), "{kept}");
        // At the bound it is kept whole (and parsed as usual).
        let mut p = full();
        let long = format!("{}Mi", "0".repeat(MAX_REGION_SIZE_TEXT - 3) + "2");
        p["metadata"]["annotations"]["rocefabric.io/region-size"] = serde_json::json!(long);
        let decoded: CompactPod = serde_json::from_value(p).expect("valid pod");
        assert_eq!(decoded.region_size.as_deref(), Some(long.as_str()));
    }

    #[test]
    fn a_pod_decodes_to_what_the_planner_reads() {
        let p: CompactPod = serde_json::from_value(full()).expect("valid pod");
        assert_eq!(p.key(), ("ns", "a"));
        assert_eq!(p.uid.as_deref(), Some("u1"));
        assert_eq!(p.resource_version.as_deref(), Some("7"));
        assert!(p.created.is_some() && p.deleting);
        assert_eq!(p.labels.get("app"), Some("x"));
        assert_eq!(p.region.as_deref(), Some("{}"));
        assert_eq!(p.region_size.as_deref(), Some("2Mi"));
        assert_eq!(p.node_name.as_deref(), Some("n1"));
        assert_eq!(p.gates, ["rocefabric.io/region", "other"]);
        assert_eq!(p.phase.as_deref(), Some("Running"));
        assert_eq!(p.pod_ip.as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn a_container_down_for_its_window_is_kept_as_a_fact_not_as_its_text() {
        let with = |state: serde_json::Value, message: &str| {
            let mut p = full();
            p["status"]["containerStatuses"] = serde_json::json!([
                {"name": "other", "state": {"running": {}}},
                {"name": "dsm", "state": state,
                 "lastState": {"terminated": {"exitCode": 1, "message": message}}}]);
            let decoded: CompactPod = serde_json::from_value(p.clone()).expect("valid pod");
            let full_pod: Pod = serde_json::from_value(p).expect("valid pod");
            assert_eq!(CompactPod::from(&full_pod), decoded, "both decoders agree");
            decoded.window_failed
        };
        let failure = "rocefabric-dsm: local window of 8388608 bytes: cannot be pinned: ...";
        let waiting = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        assert!(with(waiting.clone(), failure));
        let terminated = serde_json::json!({"terminated": {"exitCode": 1, "message": failure}});
        assert!(with(terminated, "earlier"));
        assert!(
            !with(serde_json::json!({"running": {}}), failure),
            "running again"
        );
        assert!(
            !with(waiting, "rocefabric-dsm: HCA rxe0: ..."),
            "another failure"
        );
        let bare: CompactPod = serde_json::from_value(full()).expect("valid pod");
        assert!(!bare.window_failed);
    }

    #[test]
    fn decoding_and_converting_a_full_pod_agree() {
        let full_pod: Pod = serde_json::from_value(full()).expect("valid pod");
        let decoded: CompactPod = serde_json::from_value(full()).expect("valid pod");
        assert_eq!(CompactPod::from(&full_pod), decoded);
        assert_eq!(
            CompactPod::from(&Pod::from(&decoded)),
            decoded,
            "a round trip"
        );
        let bare: CompactPod =
            serde_json::from_value(serde_json::json!({"metadata": null})).expect("bare");
        assert_eq!(CompactPod::from(&Pod::default()), bare);
    }
}
