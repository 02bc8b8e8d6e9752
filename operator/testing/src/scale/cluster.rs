//! The generated cluster: sizes, and what node `i` and pod `i` look like.
//!
//! Everything about a generated object follows from its index, so the API server keeps only
//! what changed (a few dozen bytes a pod) and writes each object's JSON when it is read. Pods
//! `0..pods` exist at the start, spread over the namespaces in contiguous blocks; every
//! `pods / fabric_pods`-th of them carries the fabric label and the region scheduling gate and
//! is not scheduled yet. Pods the harness adds later take the next indices, round-robin over the
//! namespaces.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rocefabric_api::constants::{FABRIC_LABEL, REGION_ANNOTATION, REGION_SCHEDULING_GATE};
use serde_json::{Value, json};

/// Name of the one fabric.
pub const FABRIC: &str = "scale";
/// Label every fabric node carries; the fabric's `nodeSelector`.
pub const MEMBER_LABEL: &str = "rocefabric.io/fabric-member";
/// An unrelated pod label the harness changes to trigger a pass with nothing to do.
pub const NOISE_LABEL: &str = "example.com/touched";

/// How big the cluster is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub nodes: u32,
    pub pods: u32,
    pub fabric_pods: u32,
    pub namespaces: u32,
}

impl Sizes {
    /// Sizes from `SCALE_NODES`, `SCALE_PODS`, `SCALE_FABRIC_PODS` and `SCALE_NAMESPACES`, with
    /// `default` for those unset.
    pub fn from_env(default: Sizes) -> anyhow::Result<Sizes> {
        let get = |name: &str, fallback: u32| -> anyhow::Result<u32> {
            match std::env::var(name) {
                Ok(v) => v
                    .replace('_', "")
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{name}={v:?} is not a count: {e}")),
                Err(_) => Ok(fallback),
            }
        };
        Sizes {
            nodes: get("SCALE_NODES", default.nodes)?,
            pods: get("SCALE_PODS", default.pods)?,
            fabric_pods: get("SCALE_FABRIC_PODS", default.fabric_pods)?,
            namespaces: get("SCALE_NAMESPACES", default.namespaces)?,
        }
        .checked()
    }

    /// Refuse sizes the layout cannot place.
    pub fn checked(self) -> anyhow::Result<Sizes> {
        anyhow::ensure!(self.nodes >= 1, "at least one node");
        anyhow::ensure!(self.namespaces >= 1, "at least one namespace");
        anyhow::ensure!(
            self.fabric_pods <= self.pods,
            "fabric pods ({}) are some of the pods ({})",
            self.fabric_pods,
            self.pods
        );
        Ok(self)
    }
}

/// The generated cluster: its nodes, pods and fabric are pure functions of an index.
#[derive(Clone, Debug)]
pub struct GeneratedCluster {
    pub sizes: Sizes,
    per_namespace: u32,
    stride: u32,
}

/// 2026-01-01T00:00:00Z and on by `seconds` (wrapping within the day).
fn timestamp(day: u32, seconds: u32) -> String {
    let s = seconds % 86_400;
    format!(
        "2026-01-{day:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// JSON string literal of `s`.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| unreachable!("a str always serializes"))
}

fn write_map<'a>(out: &mut String, map: impl IntoIterator<Item = (&'a String, &'a String)>) {
    out.push('{');
    for (n, (k, v)) in map.into_iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}:{}", quoted(k), quoted(v));
    }
    out.push('}');
}

/// Set (`Some`) or remove (`None`) each key.
pub type Overrides = Vec<(String, Option<String>)>;

/// Set (`Some`) or remove `key` in `overrides`, replacing an earlier override of it.
pub fn set_override(overrides: &mut Overrides, key: &str, value: Option<&str>) {
    overrides.retain(|(k, _)| k != key);
    overrides.push((key.to_string(), value.map(str::to_string)));
}

fn apply_overrides(map: &mut BTreeMap<String, String>, overrides: Option<&Overrides>) {
    for (k, v) in overrides.into_iter().flatten() {
        match v {
            Some(v) => map.insert(k.clone(), v.clone()),
            None => map.remove(k),
        };
    }
}

/// What changed on a generated pod since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodState {
    pub rv: u64,
    /// Carries the region scheduling gate.
    pub gated: bool,
    /// Bound to its node and running.
    pub scheduled: bool,
    pub deleted: bool,
    /// Fabric pods the harness added keep this even if the index says otherwise.
    pub fabric: bool,
    /// The region annotation.
    pub region: Option<Box<str>>,
    /// Labels and annotations set or removed by patches.
    pub changed: Option<Box<Changed>>,
}

/// Labels and annotations changed by patches (rare: kept boxed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub labels: Overrides,
    pub annotations: Overrides,
}

/// What changed on a generated node: its labels.
#[derive(Clone, Debug, Default)]
pub struct NodeState {
    pub rv: u64,
    pub labels: Option<Box<Overrides>>,
}

const APPS: [&str; 6] = ["web", "api", "worker", "cache", "ingest", "search"];

impl GeneratedCluster {
    pub fn new(sizes: Sizes) -> GeneratedCluster {
        GeneratedCluster {
            sizes,
            per_namespace: sizes.pods.div_ceil(sizes.namespaces).max(1),
            stride: sizes
                .pods
                .checked_div(sizes.fabric_pods)
                .unwrap_or(u32::MAX),
        }
    }

    pub fn node_name(&self, i: u32) -> String {
        format!("gpu-{:06}", i + 1)
    }

    /// The index of a generated node's name.
    pub fn node_index(&self, name: &str) -> Option<u32> {
        let i = name
            .strip_prefix("gpu-")?
            .parse::<u32>()
            .ok()?
            .checked_sub(1)?;
        (i < self.sizes.nodes && self.node_name(i) == name).then_some(i)
    }

    pub fn namespace(&self, i: u32) -> String {
        format!("team-{:04}", self.namespace_index(i))
    }

    fn namespace_index(&self, i: u32) -> u32 {
        if i < self.sizes.pods {
            i / self.per_namespace
        } else {
            (i - self.sizes.pods) % self.sizes.namespaces
        }
    }

    /// Whether initial pod `i` is a fabric pod.
    pub fn initially_fabric(&self, i: u32) -> bool {
        i < self.sizes.pods
            && i.is_multiple_of(self.stride)
            && i / self.stride < self.sizes.fabric_pods
    }

    fn app(&self, i: u32, fabric: bool) -> &'static str {
        if fabric {
            "train"
        } else {
            APPS[(i % APPS.len() as u32) as usize]
        }
    }

    pub fn pod_name(&self, i: u32, fabric: bool) -> String {
        format!("{}-{i:07}", self.app(i, fabric))
    }

    /// The index a pod name encodes (checked against the namespace by the caller).
    pub fn pod_index(name: &str) -> Option<u32> {
        name.rsplit_once('-')?.1.parse().ok()
    }

    /// The state pod `i` starts in.
    pub fn initial_pod(&self, i: u32, rv: u64) -> PodState {
        let fabric = self.initially_fabric(i);
        PodState {
            rv,
            gated: fabric,
            scheduled: !fabric,
            fabric,
            ..PodState::default()
        }
    }

    pub fn pod_uid(&self, i: u32) -> String {
        Self::uid(1, i)
    }

    fn uid(kind: u32, i: u32) -> String {
        format!("{kind:08x}-0000-4000-8000-{i:012x}")
    }

    fn pod_ip(i: u32) -> String {
        let n = i + 1;
        format!("10.{}.{}.{}", 64 + (n >> 16 & 63), n >> 8 & 255, n & 255)
    }

    pub fn pod_labels(&self, i: u32, st: &PodState) -> BTreeMap<String, String> {
        let app = self.app(i, st.fabric);
        let ns = self.namespace_index(i);
        let mut labels: BTreeMap<String, String> = [
            ("app.kubernetes.io/name", app.to_string()),
            ("app.kubernetes.io/part-of", format!("team-{ns:04}")),
            (
                "pod-template-hash",
                format!("{:010x}", (ns * 7 + i % 3) & 0xff_ffff),
            ),
            (
                "tier",
                if st.fabric { "training" } else { "serving" }.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if st.fabric {
            labels.insert(FABRIC_LABEL.to_string(), FABRIC.to_string());
            labels.insert(
                "batch.kubernetes.io/job-name".into(),
                format!("train-{}", i / 64),
            );
        }
        apply_overrides(&mut labels, st.changed.as_ref().map(|c| &c.labels));
        labels
    }

    fn pod_annotations(&self, st: &PodState) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::from([(
            "kubectl.kubernetes.io/default-container".to_string(),
            "main".to_string(),
        )]);
        if let Some(region) = &st.region {
            annotations.insert(REGION_ANNOTATION.to_string(), region.to_string());
        }
        apply_overrides(
            &mut annotations,
            st.changed.as_ref().map(|c| &c.annotations),
        );
        annotations
    }

    /// Pod `i` as the API server returns it (about 2 KiB): metadata with managedFields, one
    /// container with env, resources and mounts, and a status.
    pub fn pod_json(&self, i: u32, st: &PodState) -> String {
        let mut o = String::with_capacity(2400);
        let name = self.pod_name(i, st.fabric);
        let ns = self.namespace(i);
        let app = self.app(i, st.fabric);
        let day = if i < self.sizes.pods { 1 } else { 2 };
        let created = timestamp(day, i);
        let _ = write!(
            o,
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{ns}","uid":"{}","resourceVersion":"{}","creationTimestamp":"{created}","labels":"#,
            Self::uid(1, i),
            st.rv
        );
        write_map(&mut o, &self.pod_labels(i, st));
        o.push_str(r#","annotations":"#);
        write_map(&mut o, &self.pod_annotations(st));
        let _ = write!(
            o,
            r#","ownerReferences":[{{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"{app}-{:010x}","uid":"{}","controller":true,"blockOwnerDeletion":true}}],"managedFields":[{{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"{created}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:labels":{{".":{{}},"f:app.kubernetes.io/name":{{}},"f:pod-template-hash":{{}}}},"f:ownerReferences":{{".":{{}}}}}},"f:spec":{{"f:containers":{{"k:{{\"name\":\"main\"}}":{{".":{{}},"f:image":{{}},"f:resources":{{}}}}}}}}}}}}]}},"#,
            i / 16,
            Self::uid(3, i / 16)
        );
        let _ = write!(
            o,
            r#""spec":{{"containers":[{{"name":"main","image":"registry.example.com/{app}:1.{}.0","command":["/bin/{app}","--config=/etc/{app}/config.yaml"],"ports":[{{"name":"http","containerPort":8080,"protocol":"TCP"}}],"env":[{{"name":"POD_NAME","valueFrom":{{"fieldRef":{{"apiVersion":"v1","fieldPath":"metadata.name"}}}}}},{{"name":"LOG_LEVEL","value":"info"}},{{"name":"GOMAXPROCS","value":"8"}}],"resources":{{"requests":{{"cpu":"2","memory":"4Gi"}},"limits":{{"memory":"8Gi"}}}},"volumeMounts":[{{"name":"config","mountPath":"/etc/{app}"}},{{"name":"kube-api-access","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true}}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}}],"volumes":[{{"name":"config","configMap":{{"name":"{app}-config","defaultMode":420}}}},{{"name":"kube-api-access","projected":{{"sources":[{{"serviceAccountToken":{{"expirationSeconds":3607,"path":"token"}}}}],"defaultMode":420}}}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","schedulerName":"default-scheduler","tolerations":[{{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}}],"priority":0,"enableServiceLinks":true"#,
            i % 40
        );
        if st.scheduled {
            let _ = write!(
                o,
                r#","nodeName":"{}""#,
                self.node_name(i % self.sizes.nodes)
            );
        }
        if st.gated {
            let _ = write!(
                o,
                r#","schedulingGates":[{{"name":"{REGION_SCHEDULING_GATE}"}}]"#
            );
        }
        o.push_str(r#"},"status":"#);
        if st.scheduled {
            let ip = Self::pod_ip(i);
            let _ = write!(
                o,
                r#"{{"phase":"Running","conditions":[{{"type":"Ready","status":"True","lastTransitionTime":"{created}"}},{{"type":"PodScheduled","status":"True","lastTransitionTime":"{created}"}}],"hostIP":"172.16.{}.{}","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"startTime":"{created}","qosClass":"Burstable"}}}}"#,
                (i % self.sizes.nodes) >> 8 & 255,
                (i % self.sizes.nodes) & 255
            );
        } else {
            o.push_str(
                r#"{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"False","reason":"SchedulingGated"}],"qosClass":"Burstable"}}"#,
            );
        }
        o
    }

    pub fn node_labels(&self, i: u32, st: &NodeState) -> BTreeMap<String, String> {
        let zone = ["a", "b", "c", "d"][(i % 4) as usize];
        let name = self.node_name(i);
        let mut labels: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", name.clone()),
            ("kubernetes.io/os", "linux".into()),
            ("kubernetes.io/arch", "amd64".into()),
            ("beta.kubernetes.io/os", "linux".into()),
            ("beta.kubernetes.io/arch", "amd64".into()),
            ("beta.kubernetes.io/instance-type", "gpu-h100x8".into()),
            ("node.kubernetes.io/instance-type", "gpu-h100x8".into()),
            ("topology.kubernetes.io/region", "eu-west-1".into()),
            ("topology.kubernetes.io/zone", format!("eu-west-1{zone}")),
            ("nvidia.com/gpu.present", "true".into()),
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3".into()),
            ("nvidia.com/gpu.count", "8".into()),
            ("nvidia.com/gpu.memory", "81559".into()),
            ("nvidia.com/cuda.driver.major", "570".into()),
            ("feature.node.kubernetes.io/rdma.available", "true".into()),
            ("feature.node.kubernetes.io/pci-15b3.present", "true".into()),
            ("network.example.com/rack", format!("rack-{:04}", i / 32)),
            (
                "network.example.com/spine",
                format!("spine-{:02}", i / 2048),
            ),
            ("node-role.kubernetes.io/worker", String::new()),
            (MEMBER_LABEL, "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        apply_overrides(&mut labels, st.labels.as_deref());
        labels
    }

    /// Node `i`'s metadata object (what a metadata-only read returns inside `metadata`), with
    /// the annotations and managedFields a kubelet-registered node carries.
    fn node_metadata(&self, i: u32, st: &NodeState, out: &mut String) {
        let name = self.node_name(i);
        let created = timestamp(1, i);
        let _ = write!(
            out,
            r#"{{"name":"{name}","uid":"{}","resourceVersion":"{}","creationTimestamp":"{created}","labels":"#,
            Self::uid(2, i),
            st.rv
        );
        write_map(out, &self.node_labels(i, st));
        let _ = write!(
            out,
            r#","annotations":{{"node.alpha.kubernetes.io/ttl":"0","volumes.kubernetes.io/controller-managed-attach-detach":"true","csi.volume.kubernetes.io/nodeid":"{{\"ebs.csi.aws.com\":\"i-{i:017x}\"}}","projectcalico.org/IPv4Address":"172.16.{}.{}/16"}},"managedFields":[{{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"{created}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:annotations":{{".":{{}},"f:node.alpha.kubernetes.io/ttl":{{}},"f:volumes.kubernetes.io/controller-managed-attach-detach":{{}}}},"f:labels":{{".":{{}},"f:kubernetes.io/hostname":{{}},"f:kubernetes.io/os":{{}},"f:kubernetes.io/arch":{{}},"f:node.kubernetes.io/instance-type":{{}},"f:topology.kubernetes.io/zone":{{}}}}}}}}}},{{"manager":"nfd-master","operation":"Update","apiVersion":"v1","time":"{created}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:labels":{{"f:feature.node.kubernetes.io/rdma.available":{{}},"f:nvidia.com/gpu.product":{{}},"f:nvidia.com/gpu.count":{{}}}}}}}}}}]}}"#,
            i >> 8 & 255,
            i & 255
        );
    }

    /// Node `i` as a `PartialObjectMetadata` (what the operator's metadata-only watch reads), or
    /// as a Node with a short status.
    pub fn node_json(&self, i: u32, st: &NodeState, meta_only: bool) -> String {
        let mut o = String::with_capacity(2400);
        if meta_only {
            o.push_str(
                r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":"#,
            );
            self.node_metadata(i, st, &mut o);
            o.push('}');
        } else {
            o.push_str(r#"{"apiVersion":"v1","kind":"Node","metadata":"#);
            self.node_metadata(i, st, &mut o);
            let _ = write!(
                o,
                r#","spec":{{"providerID":"aws:///eu-west-1a/i-{i:017x}"}},"status":{{"capacity":{{"cpu":"192","memory":"2063937Mi","nvidia.com/gpu":"8","rdma/hca":"8"}},"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady"}}],"nodeInfo":{{"kubeletVersion":"v1.33.2","containerRuntimeVersion":"containerd://2.0.5"}}}}}}"#
            );
        }
        o
    }

    /// The fabric: every member node, QoS defaults, all nodes at once, and a shared memory
    /// space with room for every fabric pod (and the ones the harness adds).
    pub fn fabric(&self) -> Value {
        json!({
            "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
            "metadata": {"name": FABRIC, "uid": "00000004-0000-4000-8000-000000000001", "generation": 1,
                         "creationTimestamp": "2025-12-01T00:00:00Z"},
            "spec": {
                "nodeSelector": {"matchLabels": {MEMBER_LABEL: "true"}},
                "qos": {},
                // All at once: one node at a time would take 100,000 round trips to roll out.
                "rollout": {"maxUnavailable": "100%"},
                "sharedMemory": {"regionSize": "1Mi", "maxRegions": 1_048_576, "podSelector": {}},
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> GeneratedCluster {
        GeneratedCluster::new(Sizes {
            nodes: 50,
            pods: 1000,
            fabric_pods: 100,
            namespaces: 10,
        })
    }

    #[test]
    fn exactly_the_fabric_pods_asked_for_spread_over_every_namespace() {
        let w = cluster();
        let fabric: Vec<u32> = (0..1000).filter(|&i| w.initially_fabric(i)).collect();
        assert_eq!(fabric.len(), 100);
        let namespaces: std::collections::BTreeSet<String> =
            fabric.iter().map(|&i| w.namespace(i)).collect();
        assert_eq!(namespaces.len(), 10);
    }

    #[test]
    fn generated_objects_are_json_of_a_realistic_size_and_names_round_trip() {
        let w = cluster();
        for i in [0, 7, 999] {
            let st = w.initial_pod(i, 5);
            let text = w.pod_json(i, &st);
            let pod: Value = serde_json::from_str(&text).expect("pod json");
            assert!((1024..=3072).contains(&text.len()), "{} bytes", text.len());
            let name = pod["metadata"]["name"].as_str().unwrap();
            assert_eq!(GeneratedCluster::pod_index(name), Some(i));
            assert_eq!(pod["metadata"]["resourceVersion"], "5");
        }
        let node: Value =
            serde_json::from_str(&w.node_json(3, &NodeState::default(), true)).unwrap();
        assert_eq!(node["metadata"]["labels"].as_object().unwrap().len(), 20);
        assert_eq!(
            w.node_index(node["metadata"]["name"].as_str().unwrap()),
            Some(3)
        );
        let full: Value =
            serde_json::from_str(&w.node_json(3, &NodeState::default(), false)).unwrap();
        assert_eq!(full["kind"], "Node");
    }

    #[test]
    fn the_fabric_is_valid() {
        let fabric: rocefabric_api::RoceFabric =
            serde_json::from_value(cluster().fabric()).expect("a RoceFabric");
        rocefabric_api::validate::fabric(&fabric).expect("valid");
    }
}
