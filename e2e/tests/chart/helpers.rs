//! What the chart tests share: rendering through the Helm engine, finding objects, pod specs and
//! containers in the output, and RBAC rules flattened into grants.

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};
use k8s_openapi::api::rbac::v1::PolicyRule;
use rocefabric_e2e::helm::{self, HelmEngine};
use rocefabric_e2e::manifests::{object_ref, of_kind, parse_stream};
use rocefabric_e2e::{skip, workspace_root};
use serde_json::Value;

pub const RELEASE: &str = "rf";
pub const NAMESPACE: &str = "rocefabric-system";

pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts/rocefabric")
}

/// The Helm engine, or `None` after reporting the test as skipped (a failure when required).
pub fn engine(test: &str) -> Option<HelmEngine> {
    match HelmEngine::locate() {
        Ok(engine) => Some(engine),
        Err(error) if helm::required() => panic!("{test}: {error}"),
        Err(error) => {
            skip("chart", &error.to_string(), test);
            None
        }
    }
}

pub fn render(engine: &HelmEngine, values: Value) -> Vec<Value> {
    let text = engine
        .render(&chart_dir(), &values, RELEASE, NAMESPACE)
        .unwrap_or_else(|e| panic!("rendering with {values} failed: {e}"));
    parse_stream(&text).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{text}"))
}

pub fn one<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> T {
    let found: Vec<&Value> = of_kind(objects, kind)
        .into_iter()
        .filter(|o| o["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind}/{name}, found {}",
        found.len()
    );
    serde_json::from_value(found[0].clone())
        .unwrap_or_else(|e| panic!("{kind}/{name} is not a valid {kind}: {e}"))
}

pub fn operator_deployment(objects: &[Value]) -> Deployment {
    one(
        objects,
        "Deployment",
        &format!("{RELEASE}-rocefabric-operator"),
    )
}

pub fn node_daemonset(objects: &[Value]) -> DaemonSet {
    one(objects, "DaemonSet", &format!("{RELEASE}-rocefabric-node"))
}

pub fn pod_spec_of_deployment(d: &Deployment) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("deployment has a pod spec")
}

pub fn pod_spec_of_daemonset(d: &DaemonSet) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("daemonset has a pod spec")
}

pub fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name} in {:?}", names(pod)))
}

pub fn names(pod: &PodSpec) -> Vec<&str> {
    pod.containers.iter().map(|c| c.name.as_str()).collect()
}

pub fn sc(c: &Container) -> &SecurityContext {
    c.security_context
        .as_ref()
        .unwrap_or_else(|| panic!("container {} has no securityContext", c.name))
}

pub fn added_caps(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|caps| caps.add.clone())
        .unwrap_or_default()
}

pub fn drops_all(c: &Container) -> bool {
    sc(c)
        .capabilities
        .as_ref()
        .and_then(|caps| caps.drop.as_ref())
        .is_some_and(|d| d.iter().any(|x| x == "ALL"))
}

/// The seccomp profile in force for a container: its own, else the pod's.
pub fn seccomp(pod: &PodSpec, c: &Container) -> Option<String> {
    sc(c)
        .seccomp_profile
        .as_ref()
        .or_else(|| {
            pod.security_context
                .as_ref()
                .and_then(|p| p.seccomp_profile.as_ref())
        })
        .map(|p| p.type_.clone())
}

/// Every pod spec the chart renders (Deployments and DaemonSets), with the owner for messages.
pub fn all_pod_specs(objects: &[Value]) -> Vec<(String, PodSpec)> {
    let mut pods = Vec::new();
    for o in objects {
        let spec = match o["kind"].as_str() {
            Some("Deployment") => serde_json::from_value::<Deployment>(o.clone())
                .ok()
                .map(|d| pod_spec_of_deployment(&d)),
            Some("DaemonSet") => serde_json::from_value::<DaemonSet>(o.clone())
                .ok()
                .map(|d| pod_spec_of_daemonset(&d)),
            _ => None,
        };
        if let Some(spec) = spec {
            pods.push((object_ref(o), spec));
        }
    }
    pods
}

/// `(mount path, host path, read-only)` for each hostPath volume a container mounts.
pub fn host_mounts(pod: &PodSpec, c: &Container) -> BTreeSet<(String, String, bool)> {
    let volumes = pod.volumes.clone().unwrap_or_default();
    let mut out = BTreeSet::new();
    for m in c.volume_mounts.clone().unwrap_or_default() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .expect("mount refers to a volume");
        if let Some(hp) = &v.host_path {
            out.insert((
                m.mount_path.clone(),
                hp.path.clone(),
                m.read_only.unwrap_or(false),
            ));
        }
    }
    out
}

/// A rule flattened into `(apiGroup, resource, verb, resourceName)` tuples, so two rule lists
/// compare by what they grant, whatever their grouping.
pub fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        let names = r.resource_names.clone().unwrap_or_default();
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for g in r.api_groups.clone().unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert((g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

pub fn grant(group: &str, resource: &str, verbs: &[&str]) -> Vec<(String, String, String, String)> {
    verbs
        .iter()
        .map(|v| {
            (
                group.to_string(),
                resource.to_string(),
                v.to_string(),
                String::new(),
            )
        })
        .collect()
}

pub type Grants = BTreeSet<(String, String, String, String)>;

/// The kubelet-facing `serve` container: read its node's RoceNode (QoS gate, traffic class).
pub fn device_plugin_grants() -> BTreeSet<(String, String, String, String)> {
    grant("rocefabric.io", "rocenodes", &["get", "list", "watch"])
        .into_iter()
        .collect()
}
