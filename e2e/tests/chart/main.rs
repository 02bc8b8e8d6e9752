//! The Helm chart, rendered by the real Helm engine (Helm v4's Go library through
//! `helm-python-sdk`), checked for least privilege and for agreement with the binaries it runs.
//!
//! Without the engine installed these tests print `SKIPPED: chart (...)` and return;
//! `.ci/helm-check` installs it and sets `ROCEFABRIC_REQUIRE_HELM=1`, so CI never skips them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::Parser as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SecurityContext};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use rocefabric_e2e::helm::{self, HelmEngine};
use rocefabric_e2e::manifests::{object_ref, of_kind, parse_stream};
use rocefabric_e2e::{skip, workspace_root};
use serde_json::{Value, json};

const RELEASE: &str = "rf";
const NAMESPACE: &str = "rocefabric-system";

fn chart_dir() -> PathBuf {
    workspace_root().join("charts/rocefabric")
}

/// The Helm engine, or `None` after reporting the test as skipped (a failure when required).
fn engine(test: &str) -> Option<HelmEngine> {
    match HelmEngine::locate() {
        Ok(engine) => Some(engine),
        Err(error) if helm::required() => panic!("{test}: {error}"),
        Err(error) => {
            skip("chart", &error.to_string(), test);
            None
        }
    }
}

fn render(engine: &HelmEngine, values: Value) -> Vec<Value> {
    let text = engine
        .render(&chart_dir(), &values, RELEASE, NAMESPACE)
        .unwrap_or_else(|e| panic!("rendering with {values} failed: {e}"));
    parse_stream(&text).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{text}"))
}

fn one<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> T {
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

fn operator_deployment(objects: &[Value]) -> Deployment {
    one(
        objects,
        "Deployment",
        &format!("{RELEASE}-rocefabric-operator"),
    )
}

fn node_daemonset(objects: &[Value]) -> DaemonSet {
    one(objects, "DaemonSet", &format!("{RELEASE}-rocefabric-node"))
}

fn pod_spec_of_deployment(d: &Deployment) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("deployment has a pod spec")
}

fn pod_spec_of_daemonset(d: &DaemonSet) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("daemonset has a pod spec")
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name} in {:?}", names(pod)))
}

fn names(pod: &PodSpec) -> Vec<&str> {
    pod.containers.iter().map(|c| c.name.as_str()).collect()
}

fn sc(c: &Container) -> &SecurityContext {
    c.security_context
        .as_ref()
        .unwrap_or_else(|| panic!("container {} has no securityContext", c.name))
}

fn added_caps(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|caps| caps.add.clone())
        .unwrap_or_default()
}

fn drops_all(c: &Container) -> bool {
    sc(c)
        .capabilities
        .as_ref()
        .and_then(|caps| caps.drop.as_ref())
        .is_some_and(|d| d.iter().any(|x| x == "ALL"))
}

/// The seccomp profile in force for a container: its own, else the pod's.
fn seccomp(pod: &PodSpec, c: &Container) -> Option<String> {
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
fn all_pod_specs(objects: &[Value]) -> Vec<(String, PodSpec)> {
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
fn host_mounts(pod: &PodSpec, c: &Container) -> BTreeSet<(String, String, bool)> {
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
fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String, String)> {
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

fn grant(group: &str, resource: &str, verbs: &[&str]) -> Vec<(String, String, String, String)> {
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

type Grants = BTreeSet<(String, String, String, String)>;

/// What the operator's code calls, read from the tables of operator/RBAC.md (written next to the
/// code): `(cluster-wide grants, grants in the Lease namespace)`. A `resourceNames: [<--lease-name>]`
/// note on a resource becomes the Lease's name.
fn documented_operator_grants(lease_name: &str) -> (Grants, Grants) {
    let path = workspace_root().join("operator/RBAC.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let (mut cluster, mut namespaced) = (Grants::new(), Grants::new());
    let mut section = "";
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = if heading.starts_with("ClusterRole") {
                "cluster"
            } else if heading.starts_with("Role") {
                "role"
            } else {
                ""
            };
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if section.is_empty() || cells.len() < 3 || !cells[0].starts_with('`') {
            continue;
        }
        let group = ticked(cells[0])
            .first()
            .cloned()
            .unwrap_or_default()
            .replace("\"\"", "");
        let resource_cell = ticked(cells[1]);
        let resource = resource_cell
            .first()
            .cloned()
            .expect("a resource in backticks");
        let name = if resource_cell.iter().any(|c| c.starts_with("resourceNames")) {
            lease_name.to_string()
        } else {
            String::new()
        };
        let target = if section == "cluster" {
            &mut cluster
        } else {
            &mut namespaced
        };
        for verb in ticked(cells[2]) {
            target.insert((group.clone(), resource.clone(), verb, name.clone()));
        }
    }
    assert!(
        !cluster.is_empty() && !namespaced.is_empty(),
        "no rules parsed from {}",
        path.display()
    );
    (cluster, namespaced)
}

/// The kubelet-facing `serve` container: read its node's RoceNode (QoS gate, traffic class).
fn device_plugin_grants() -> BTreeSet<(String, String, String, String)> {
    grant("rocefabric.io", "rocenodes", &["get", "list", "watch"])
        .into_iter()
        .collect()
}

/// The QoS agent: watch its RoceNode, write its status, record Events.
fn qos_agent_grants() -> BTreeSet<(String, String, String, String)> {
    [
        grant("rocefabric.io", "rocenodes", &["get", "list", "watch"]),
        grant("rocefabric.io", "rocenodes/status", &["patch"]),
        grant("events.k8s.io", "events", &["create", "patch"]),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[test]
fn chart_crds_are_byte_copies_of_the_generated_crds() {
    let root = workspace_root();
    let generated = rocefabric_api::crdgen::manifests();
    assert_eq!(generated.len(), 2, "two CRDs are generated");
    for (file, yaml) in generated {
        let in_crds = std::fs::read_to_string(root.join("crds").join(&file))
            .unwrap_or_else(|e| panic!("crds/{file}: {e}"));
        assert!(
            in_crds == yaml,
            "crds/{file} is stale: run `cargo run -p rocefabric-api --bin crdgen -- --write`"
        );
        let in_chart = std::fs::read_to_string(chart_dir().join("files/crds").join(&file))
            .unwrap_or_else(|e| panic!("charts/rocefabric/files/crds/{file}: {e}"));
        assert!(
            in_chart == yaml,
            "charts/rocefabric/files/crds/{file} differs from crds/{file}: \
             run `cargo run -p rocefabric-api --bin crdgen -- --write` and commit"
        );
        let template = chart_dir().join("templates/crds").join(&file);
        assert!(
            template.exists(),
            "no template renders {file}: {}",
            template.display()
        );
    }
}

#[test]
fn lint_is_clean_in_strict_mode() {
    let Some(engine) = engine("lint_is_clean_in_strict_mode") else {
        return;
    };
    for values in [
        Value::Null,
        json!({"metrics": {"serviceMonitor": {"enabled": true}}, "networkPolicy": {"enabled": true}}),
        json!({"node": {"qosAgent": {"enabled": false}}, "crds": {"install": false}}),
        json!({"node": {"mode": "dra"}}),
        json!({"node": {"mode": "both"}}),
    ] {
        let report = engine
            .lint(&chart_dir(), &values)
            .unwrap_or_else(|e| panic!("helm lint --strict with {values}: {e}"));
        assert!(report.contains("1 chart(s), ok"), "{report}");
    }
}

#[test]
fn default_render_has_every_part_and_nothing_optional() {
    let Some(engine) = engine("default_render_has_every_part_and_nothing_optional") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for o in &objects {
        *kinds
            .entry(o["kind"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = [
        ("CustomResourceDefinition", 2),
        ("Deployment", 1),
        ("DaemonSet", 1),
        ("ServiceAccount", 2),
        ("ClusterRole", 3),
        ("ClusterRoleBinding", 3),
        ("Role", 1),
        ("RoleBinding", 1),
        ("Service", 2),
        ("ConfigMap", 1),
        ("ValidatingAdmissionPolicy", 6),
        ("ValidatingAdmissionPolicyBinding", 6),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(kinds, expected, "objects rendered with default values");
    for o in &objects {
        let cluster_scoped = o["kind"].as_str().is_some_and(|k| {
            k.starts_with("Cluster") || k.starts_with("ValidatingAdmissionPolicy")
        });
        if o["kind"] != "CustomResourceDefinition" && !cluster_scoped {
            assert_eq!(
                o["metadata"]["namespace"],
                NAMESPACE,
                "{} is in the release namespace",
                object_ref(o)
            );
        }
    }
}

#[test]
fn rendered_crds_are_the_generated_crds_kept_on_uninstall() {
    let Some(engine) = engine("rendered_crds_are_the_generated_crds_kept_on_uninstall") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let crds = of_kind(&objects, "CustomResourceDefinition");
    assert_eq!(crds.len(), 2);
    for (file, yaml) in rocefabric_api::crdgen::manifests() {
        let mut generated: Value = yaml_serde::from_str(&yaml).expect("generated CRD parses");
        let name = generated["metadata"]["name"]
            .as_str()
            .expect("CRD has a name")
            .to_string();
        let rendered = crds
            .iter()
            .find(|c| c["metadata"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{file}: no rendered CRD {name}"));
        assert_eq!(
            rendered["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name} survives helm uninstall"
        );
        assert_eq!(
            rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "Helm"
        );
        // Apart from the chart's metadata, the rendered CRD is exactly what crdgen generates.
        generated["metadata"]["annotations"] = rendered["metadata"]["annotations"].clone();
        generated["metadata"]["labels"] = rendered["metadata"]["labels"].clone();
        assert!(
            **rendered == generated,
            "{name}: rendered CRD differs from crds/{file}"
        );
    }

    let without_keep = render(&engine, json!({"crds": {"keep": false}}));
    for crd in of_kind(&without_keep, "CustomResourceDefinition") {
        assert!(
            crd["metadata"]["annotations"].is_null(),
            "crds.keep=false: {}",
            object_ref(crd)
        );
    }
    let without_crds = render(&engine, json!({"crds": {"install": false}}));
    assert!(
        of_kind(&without_crds, "CustomResourceDefinition").is_empty(),
        "crds.install=false"
    );
}

#[test]
fn rbac_grants_exactly_what_the_code_uses() {
    let Some(engine) = engine("rbac_grants_exactly_what_the_code_uses") else {
        return;
    };
    let objects = render(&engine, Value::Null);

    // No wildcard anywhere, in any role.
    for o in of_kind(&objects, "ClusterRole")
        .into_iter()
        .chain(of_kind(&objects, "Role"))
    {
        let text = o["rules"].to_string();
        assert!(
            !text.contains("\"*\""),
            "{} has a wildcard: {text}",
            object_ref(o)
        );
        assert!(
            o["aggregationRule"].is_null(),
            "{} aggregates other roles",
            object_ref(o)
        );
    }

    let (documented_cluster, documented_lease) = documented_operator_grants("rocefabric-operator");
    let operator: ClusterRole = one(
        &objects,
        "ClusterRole",
        &format!("{RELEASE}-rocefabric-operator"),
    );
    assert_eq!(
        grants(&operator.rules.unwrap_or_default()),
        documented_cluster,
        "operator ClusterRole vs operator/RBAC.md"
    );
    let lease: Role = one(
        &objects,
        "Role",
        &format!("{RELEASE}-rocefabric-operator-leader-election"),
    );
    assert_eq!(lease.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        grants(&lease.rules.unwrap_or_default()),
        documented_lease,
        "leader election Role vs operator/RBAC.md"
    );
    // The Lease rule follows the configured name.
    let renamed = render(
        &engine,
        json!({"operator": {"leaderElection": {"leaseName": "rf-leader"}}}),
    );
    let lease: Role = one(
        &renamed,
        "Role",
        &format!("{RELEASE}-rocefabric-operator-leader-election"),
    );
    assert_eq!(
        grants(&lease.rules.unwrap_or_default()),
        documented_operator_grants("rf-leader").1
    );

    let dp: ClusterRole = one(
        &objects,
        "ClusterRole",
        &format!("{RELEASE}-rocefabric-node-device-plugin"),
    );
    assert_eq!(
        grants(&dp.rules.unwrap_or_default()),
        device_plugin_grants()
    );
    let agent: ClusterRole = one(
        &objects,
        "ClusterRole",
        &format!("{RELEASE}-rocefabric-node-qos-agent"),
    );
    assert_eq!(grants(&agent.rules.unwrap_or_default()), qos_agent_grants());

    // Each role is bound to the ServiceAccount of the pods that run that code, and only to it.
    let bindings: Vec<(String, String, String)> = of_kind(&objects, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&objects, "RoleBinding"))
        .flat_map(|o| {
            let kind = o["kind"].as_str().unwrap_or_default().to_string();
            let binding: (String, Vec<(String, String)>) = if kind == "RoleBinding" {
                let b: RoleBinding = serde_json::from_value(o.clone()).expect("RoleBinding");
                (b.role_ref.name, subjects(b.subjects))
            } else {
                let b: ClusterRoleBinding =
                    serde_json::from_value(o.clone()).expect("ClusterRoleBinding");
                (b.role_ref.name, subjects(b.subjects))
            };
            let (role, subjects) = binding;
            subjects
                .into_iter()
                .map(move |(ns, sa)| (role.clone(), ns, sa))
        })
        .collect();
    let sa = |n: &str| (NAMESPACE.to_string(), format!("{RELEASE}-rocefabric-{n}"));
    let mut expected = vec![
        (format!("{RELEASE}-rocefabric-operator"), sa("operator")),
        (
            format!("{RELEASE}-rocefabric-operator-leader-election"),
            sa("operator"),
        ),
        (
            format!("{RELEASE}-rocefabric-node-device-plugin"),
            sa("node"),
        ),
        (format!("{RELEASE}-rocefabric-node-qos-agent"), sa("node")),
    ]
    .into_iter()
    .map(|(role, (ns, sa))| (role, ns, sa))
    .collect::<Vec<_>>();
    let mut got = bindings;
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "role bindings");

    // The pods run as those ServiceAccounts.
    let op = pod_spec_of_deployment(&operator_deployment(&objects));
    assert_eq!(
        op.service_account_name.as_deref(),
        Some(format!("{RELEASE}-rocefabric-operator").as_str())
    );
    let node = pod_spec_of_daemonset(&node_daemonset(&objects));
    assert_eq!(
        node.service_account_name.as_deref(),
        Some(format!("{RELEASE}-rocefabric-node").as_str())
    );

    // Without the agent, its write permissions are not bound at all.
    let no_agent = render(&engine, json!({"node": {"qosAgent": {"enabled": false}}}));
    assert!(
        of_kind(&no_agent, "ClusterRole")
            .iter()
            .all(|r| !r["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .ends_with("qos-agent")),
        "qosAgent disabled: no agent ClusterRole"
    );
}

fn subjects(subjects: Option<Vec<k8s_openapi::api::rbac::v1::Subject>>) -> Vec<(String, String)> {
    subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            assert_eq!(s.kind, "ServiceAccount", "only ServiceAccounts are bound");
            (s.namespace.unwrap_or_default(), s.name)
        })
        .collect()
}

#[test]
fn operator_runs_non_root_read_only_with_no_capabilities() {
    let Some(engine) = engine("operator_runs_non_root_read_only_with_no_capabilities") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let pod = pod_spec_of_deployment(&operator_deployment(&objects));
    assert_eq!(names(&pod), ["operator"]);
    let c = container(&pod, "operator");
    let s = sc(c);
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    assert_eq!(
        s.run_as_non_root.or(pod_sc.run_as_non_root),
        Some(true),
        "runAsNonRoot"
    );
    let uid = s
        .run_as_user
        .or(pod_sc.run_as_user)
        .expect("a numeric uid, so runAsNonRoot is checkable");
    assert_ne!(uid, 0, "operator uid");
    assert_eq!(
        s.read_only_root_filesystem,
        Some(true),
        "readOnlyRootFilesystem"
    );
    assert_eq!(
        s.allow_privilege_escalation,
        Some(false),
        "allowPrivilegeEscalation"
    );
    assert_ne!(s.privileged, Some(true), "privileged");
    assert!(drops_all(c), "operator drops ALL capabilities");
    assert!(
        added_caps(c).is_empty(),
        "operator adds no capability: {:?}",
        added_caps(c)
    );
    assert_eq!(seccomp(&pod, c).as_deref(), Some("RuntimeDefault"));
    assert!(
        pod.volumes
            .clone()
            .unwrap_or_default()
            .iter()
            .all(|v| v.host_path.is_none()),
        "no hostPath"
    );
    assert_ne!(pod.host_network, Some(true));
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
}

#[test]
fn device_plugin_container_has_no_capabilities_and_only_its_host_paths() {
    let Some(engine) =
        engine("device_plugin_container_has_no_capabilities_and_only_its_host_paths")
    else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
    assert_eq!(names(&pod), ["device-plugin", "qos-agent"]);
    let c = container(&pod, "device-plugin");
    let s = sc(c);
    assert!(drops_all(c), "device-plugin drops ALL capabilities");
    assert!(
        added_caps(c).is_empty(),
        "device-plugin adds no capability: {:?}",
        added_caps(c)
    );
    assert_ne!(s.privileged, Some(true));
    assert_eq!(s.allow_privilege_escalation, Some(false));
    assert_eq!(s.read_only_root_filesystem, Some(true));
    assert_eq!(seccomp(&pod, c).as_deref(), Some("RuntimeDefault"));
    // The plugin socket directory read-write; sysfs and /dev (to check the device nodes it hands
    // out exist) read-only; nothing else from the host.
    let expected: BTreeSet<(String, String, bool)> = [
        (
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/device-plugins",
            false,
        ),
        ("/host/sys", "/sys", true),
        ("/host/dev", "/dev", true),
    ]
    .into_iter()
    .map(|(m, h, ro)| (m.to_string(), h.to_string(), ro))
    .collect();
    assert_eq!(host_mounts(&pod, c), expected, "device-plugin host paths");

    // The agent: the sysfs device tree read-write (the driver's attribute files), class and bus
    // read-only (symlinks into it), mlx5's debugfs directory and rdma_cm's configfs directory;
    // never all of /sys read-write, never all of debugfs or configfs, never the kubelet's sockets
    // or /dev.
    let agent = container(&pod, "qos-agent");
    let expected: BTreeSet<(String, String, bool)> = [
        ("/host/sys/devices", "/sys/devices", false),
        ("/host/sys/class", "/sys/class", true),
        ("/host/sys/bus", "/sys/bus", true),
        ("/host/debugfs/mlx5", "/sys/kernel/debug/mlx5", false),
        (
            "/host/configfs/rdma_cm",
            "/sys/kernel/config/rdma_cm",
            false,
        ),
    ]
    .into_iter()
    .map(|(m, h, ro)| (m.to_string(), h.to_string(), ro))
    .collect();
    assert_eq!(host_mounts(&pod, agent), expected, "qos-agent host paths");
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
}

#[test]
fn only_the_qos_agent_gets_net_admin() {
    let Some(engine) = engine("only_the_qos_agent_gets_net_admin") else {
        return;
    };
    for values in [
        Value::Null,
        json!({"metrics": {"serviceMonitor": {"enabled": true}}, "networkPolicy": {"enabled": true},
               "operator": {"replicas": 2}}),
    ] {
        let objects = render(&engine, values);
        for (owner, pod) in all_pod_specs(&objects) {
            for c in pod
                .containers
                .iter()
                .chain(pod.init_containers.iter().flatten())
            {
                let caps = added_caps(c);
                assert_ne!(
                    sc(c).privileged,
                    Some(true),
                    "{owner}/{} is privileged",
                    c.name
                );
                assert!(drops_all(c), "{owner}/{} drops ALL", c.name);
                if c.name == "qos-agent" {
                    assert_eq!(caps, ["NET_ADMIN"], "{owner}/qos-agent capabilities");
                    assert_eq!(sc(c).allow_privilege_escalation, Some(false));
                    assert_eq!(sc(c).read_only_root_filesystem, Some(true));
                    assert_eq!(seccomp(&pod, c).as_deref(), Some("RuntimeDefault"));
                } else {
                    assert!(caps.is_empty(), "{owner}/{} adds {caps:?}", c.name);
                }
            }
        }
    }
    // Without the agent, nothing in the chart holds NET_ADMIN or the host network.
    let objects = render(&engine, json!({"node": {"qosAgent": {"enabled": false}}}));
    let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
    assert_eq!(names(&pod), ["device-plugin"]);
    assert_ne!(
        pod.host_network,
        Some(true),
        "no host network without the agent"
    );
    for (owner, pod) in all_pod_specs(&objects) {
        for c in &pod.containers {
            assert!(added_caps(c).is_empty(), "{owner}/{}", c.name);
        }
    }
}

#[test]
fn daemonset_is_node_critical_and_tolerates_gpu_taints() {
    let Some(engine) = engine("daemonset_is_node_critical_and_tolerates_gpu_taints") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")
                && t.operator.as_deref() == Some("Exists")),
        "tolerates nvidia.com/gpu: {tolerations:?}"
    );

    let custom = render(
        &engine,
        json!({"node": {"tolerations": [{"key": "rdma", "operator": "Exists", "effect": "NoExecute"}],
                        "nodeSelector": {"feature.node.kubernetes.io/rdma.capable": "true"}}}),
    );
    let pod = pod_spec_of_daemonset(&node_daemonset(&custom));
    let keys: Vec<_> = pod
        .tolerations
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| t.key)
        .collect();
    assert_eq!(keys, ["rdma"], "tolerations come from values");
    assert_eq!(
        pod.node_selector
            .unwrap_or_default()
            .get("feature.node.kubernetes.io/rdma.capable")
            .map(String::as_str),
        Some("true")
    );
}

#[test]
fn container_args_are_accepted_by_the_binaries() {
    let Some(engine) = engine("container_args_are_accepted_by_the_binaries") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let argv = |binary: &str, c: &Container| {
        let mut v = vec![binary.to_string()];
        v.extend(c.command.clone().unwrap_or_default().into_iter().skip(1));
        v.extend(c.args.clone().unwrap_or_default());
        v
    };
    let op = pod_spec_of_deployment(&operator_deployment(&objects));
    let args = argv("rocefabric-operator", container(&op, "operator"));
    if let Err(e) = rocefabric_operator::cli::Cli::try_parse_from(&args) {
        panic!("rocefabric-operator rejects the chart's args {args:?}: {e}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--pod-label-selector")));
    // Watching only fabric pods passes the label filter, and the binary takes it.
    let filtered = render(
        &engine,
        serde_json::json!({"operator": {"watchOnlyFabricPods": true}}),
    );
    let op = pod_spec_of_deployment(&operator_deployment(&filtered));
    let args = argv("rocefabric-operator", container(&op, "operator"));
    assert!(
        args.iter()
            .any(|a| a == "--pod-label-selector=rocefabric.io/fabric"),
        "{args:?}"
    );
    if let Err(e) = rocefabric_operator::cli::Cli::try_parse_from(&args) {
        panic!("rocefabric-operator rejects the chart's args {args:?}: {e}");
    }
    let node = pod_spec_of_daemonset(&node_daemonset(&objects));
    for name in ["device-plugin", "qos-agent"] {
        let args = argv("rocefabric-device-plugin", container(&node, name));
        if let Err(e) = rocefabric_device_plugin::cli::Cli::try_parse_from(&args) {
            panic!("rocefabric-device-plugin rejects the {name} container's args {args:?}: {e}");
        }
    }
    // Every node.mode: the DRA flags are the daemon's too.
    for mode in ["dra", "both"] {
        let objects = render(&engine, json!({"node": {"mode": mode}}));
        let node = pod_spec_of_daemonset(&node_daemonset(&objects));
        let args = argv(
            "rocefabric-device-plugin",
            container(&node, "device-plugin"),
        );
        if let Err(e) = rocefabric_device_plugin::cli::Cli::try_parse_from(&args) {
            panic!("rocefabric-device-plugin rejects the mode={mode} args {args:?}: {e}");
        }
    }
    assert_eq!(
        container(&node, "device-plugin")
            .args
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str),
        Some("serve")
    );
    assert_eq!(
        container(&node, "qos-agent")
            .args
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str),
        Some("agent")
    );
}

fn node_config(objects: &[Value]) -> rocefabric_node_model::config::Config {
    let cm = of_kind(objects, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == format!("{RELEASE}-rocefabric-node-config").as_str())
        .expect("node ConfigMap");
    let text = cm["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml in the ConfigMap");
    rocefabric_node_model::config::Config::from_yaml(text)
        .unwrap_or_else(|e| panic!("the daemon rejects the chart's config: {e}\n{text}"))
}

#[test]
fn node_config_from_values_is_accepted_by_the_daemon() {
    let Some(engine) = engine("node_config_from_values_is_accepted_by_the_daemon") else {
        return;
    };
    let defaults = render(&engine, Value::Null);
    assert_eq!(
        node_config(&defaults),
        rocefabric_node_model::config::Config::default(),
        "the chart's defaults are the daemon's defaults"
    );

    let custom = render(
        &engine,
        json!({"node": {"config": {
            "pollInterval": "500ms",
            "hca": {"resourceName": "example.com/roce", "sharedReplicas": 4,
                    "selector": {"vendors": ["15b3"], "deviceIds": ["1021"]}},
            "gpu": {"enabled": true},
            "gpuHca": {"enabled": true, "resourceName": "example.com/rail"},
            "qosGate": "enabled"
        }}}),
    );
    let config = node_config(&custom);
    assert_eq!(config.poll_interval, std::time::Duration::from_millis(500));
    assert_eq!(config.hca.resource_name, "example.com/roce");
    assert_eq!(config.hca.shared_replicas, 4);
    assert_eq!(config.hca.selector.vendors, ["15b3"]);
    assert!(config.gpu.enabled);
    assert!(config.gpu_hca.enabled);
    assert_eq!(config.gpu_hca.resource_name, "example.com/rail");
    assert_eq!(
        config.qos_gate,
        rocefabric_node_model::config::QosGate::Enabled
    );

    // A config change restarts the daemon: the pod template carries the config's checksum.
    let checksum = |objects: &[Value]| {
        node_daemonset(objects)
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get("checksum/config").cloned())
            .expect("checksum/config annotation")
    };
    assert_ne!(checksum(&defaults), checksum(&custom));
}

#[test]
fn schema_rejects_typos_and_out_of_range_values() {
    let Some(engine) = engine("schema_rejects_typos_and_out_of_range_values") else {
        return;
    };
    let cases = [
        (json!({"operator": {"replica": 2}}), "replica"),
        (
            json!({"node": {"tolerations": "nvidia.com/gpu"}}),
            "tolerations",
        ),
        (
            json!({"node": {"config": {"hca": {"sharedReplica": 2}}}}),
            "sharedReplica",
        ),
        (
            json!({"node": {"config": {"hca": {"sharedReplicas": 0}}}}),
            "sharedReplicas",
        ),
        (
            json!({"node": {"config": {"pollInterval": "1"}}}),
            "pollInterval",
        ),
        (
            json!({"node": {"config": {"qosGate": "sometimes"}}}),
            "qosGate",
        ),
        (
            json!({"node": {"config": {"gpu": {"resourceName": "gpu"}}}}),
            "resourceName",
        ),
        (
            json!({"node": {"qosAgent": {"metricsPort": 70000}}}),
            "metricsPort",
        ),
        (json!({"operator": {"logFormat": "xml"}}), "logFormat"),
        (
            json!({"node": {"qosAgent": {"resyncInterval": "100ms"}}}),
            "resyncInterval",
        ),
        (json!({"crds": {"install": "yes"}}), "install"),
        (
            json!({"serviceMonitor": {"enabled": true}}),
            "serviceMonitor",
        ),
        (json!({"node": {"mode": "bogus"}}), "mode"),
        (
            json!({"node": {"hostPaths": {"cdi": "var/run/cdi"}}}),
            "cdi",
        ),
    ];
    for (values, field) in cases {
        match engine.render(&chart_dir(), &values, RELEASE, NAMESPACE) {
            Ok(_) => panic!("values {values} were accepted"),
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.contains("schema"),
                    "{values}: not a schema error: {message}"
                );
                assert!(
                    message.contains(field),
                    "{values}: error does not name {field}: {message}"
                );
            }
        }
    }
}

#[test]
fn optional_parts_follow_their_toggles() {
    let Some(engine) = engine("optional_parts_follow_their_toggles") else {
        return;
    };
    let defaults = render(&engine, Value::Null);
    assert!(of_kind(&defaults, "ServiceMonitor").is_empty());
    assert!(of_kind(&defaults, "NetworkPolicy").is_empty());

    let on = render(
        &engine,
        json!({"metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "prom"}}},
               "networkPolicy": {"enabled": true}}),
    );
    let monitors = of_kind(&on, "ServiceMonitor");
    assert_eq!(monitors.len(), 2, "operator and node ServiceMonitors");
    for m in &monitors {
        assert_eq!(m["metadata"]["labels"]["release"], "prom");
        // Each selects a Service the chart renders, on a port that Service has.
        let selector = m["spec"]["selector"]["matchLabels"].clone();
        let port = m["spec"]["endpoints"][0]["port"].clone();
        let service = of_kind(&on, "Service")
            .into_iter()
            .find(|s| {
                let labels = &s["metadata"]["labels"];
                selector
                    .as_object()
                    .is_some_and(|sel| sel.iter().all(|(k, v)| &labels[k] == v))
            })
            .unwrap_or_else(|| panic!("{} selects no Service", object_ref(m)));
        assert!(
            service["spec"]["ports"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == port)),
            "{} scrapes port {port} that {} lacks",
            object_ref(m),
            object_ref(service)
        );
    }
    let policies = of_kind(&on, "NetworkPolicy");
    assert_eq!(policies.len(), 1);
    let policy = policies[0];
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "operator"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"],
        json!([{"port": "http", "protocol": "TCP"}])
    );

    let off = render(
        &engine,
        json!({"operator": {"enabled": false}, "node": {"enabled": false}}),
    );
    let kinds: BTreeSet<&str> = off.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["CustomResourceDefinition"]),
        "only the CRDs remain"
    );
}

#[test]
fn notes_tell_the_user_what_to_apply_next() {
    let Some(engine) = engine("notes_tell_the_user_what_to_apply_next") else {
        return;
    };
    let notes = engine
        .notes(&chart_dir(), &Value::Null)
        .expect("NOTES.txt renders");
    for needle in [
        "kubectl apply -f examples/rocefabric-dgx.yaml",
        "rocefabric-operator plan",
        "kubectl apply -f examples/pod-rdma.yaml",
        "rdma/hca",
        "IPC_LOCK",
        "rocefabric.io/region",
        "-regions",
    ] {
        assert!(
            notes.contains(needle),
            "NOTES.txt lacks {needle:?}:\n{notes}"
        );
    }
    // The example files the notes point at exist.
    for file in ["examples/rocefabric-dgx.yaml", "examples/pod-rdma.yaml"] {
        assert!(workspace_root().join(file).exists(), "{file}");
    }
    // DRA mode points at its example; the default mode does not.
    assert!(!notes.contains("examples/dra/"), "{notes}");
    let dra = engine
        .notes(&chart_dir(), &json!({"node": {"mode": "dra"}}))
        .expect("NOTES.txt renders");
    for needle in [
        "kubectl apply -f examples/dra/gpu-hca-pairs.yaml",
        "hca.rocefabric.io",
        "gpu.rocefabric.io",
    ] {
        assert!(
            dra.contains(needle),
            "NOTES.txt (dra) lacks {needle:?}:\n{dra}"
        );
    }
    assert!(
        workspace_root()
            .join("examples/dra/gpu-hca-pairs.yaml")
            .exists()
    );
}

/// The admission policies bind to the chart's own ServiceAccounts, deny (never only warn), fail
/// closed, and cover exactly the writes RBAC cannot narrow; `admissionPolicies.enabled: false`
/// renders none.
#[test]
fn admission_policies_confine_the_service_accounts() {
    let Some(engine) = engine("admission_policies_confine_the_service_accounts") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let policies = of_kind(&objects, "ValidatingAdmissionPolicy");
    let bindings = of_kind(&objects, "ValidatingAdmissionPolicyBinding");
    let binding_of = |name: &str| {
        bindings
            .iter()
            .find(|b| b["spec"]["policyName"] == name)
            .unwrap_or_else(|| panic!("{name} is bound"))
    };
    let user =
        |sa: &str| format!("\"system:serviceaccount:{NAMESPACE}:{RELEASE}-rocefabric-{sa}\"");
    let mut covered = Vec::new();
    for p in &policies {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        if name.ends_with("-selected-pod-gate") {
            // Every ungated pod against every fabric's custom podSelector: fails open, as it
            // stands between the whole cluster and pod creation.
            assert_eq!(p["spec"]["failurePolicy"], "Ignore", "{name}");
            assert_eq!(p["spec"]["paramKind"]["kind"], "RoceFabric", "{name}");
            assert_eq!(
                p["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
                json!(["CREATE"])
            );
            let binding = binding_of(name);
            assert_eq!(
                binding["spec"]["validationActions"],
                json!(["Deny"]),
                "{name}"
            );
            assert_eq!(
                binding["spec"]["paramRef"],
                json!({"selector": {}, "parameterNotFoundAction": "Allow"}),
                "{name}: every fabric is a param, none is no denial"
            );
            continue;
        }
        assert_eq!(p["spec"]["failurePolicy"], "Fail", "{name} fails closed");
        let condition = p["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        if name.ends_with("-region-gate") {
            // Everyone's pods: one labelled for a fabric is created behind the region gate.
            assert!(condition.contains("'rocefabric.io/fabric'"), "{condition}");
            let rule = &p["spec"]["validations"][0]["expression"];
            assert!(
                rule.as_str().unwrap().contains("'rocefabric.io/region'"),
                "{rule}"
            );
            assert_eq!(
                p["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
                json!(["CREATE"])
            );
            continue;
        }
        let sa = if name.ends_with("-own-rocenode") {
            "node"
        } else {
            "operator"
        };
        assert!(
            condition.contains(&user(sa)),
            "{name} matches the {sa} ServiceAccount: {condition}"
        );
        for rule in p["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap()
        {
            for r in rule["resources"].as_array().unwrap() {
                covered.push((sa, r.as_str().unwrap().to_string()));
            }
        }
        let binding = binding_of(name);
        assert_eq!(
            binding["spec"]["validationActions"],
            json!(["Deny"]),
            "{name}"
        );
    }
    covered.sort();
    let want: Vec<(&str, String)> = [
        ("node", "rocenodes"),
        ("node", "rocenodes/status"),
        ("operator", "configmaps"),
        ("operator", "pods"),
        ("operator", "pods"),
    ]
    .into_iter()
    .map(|(a, r)| (a, r.to_string()))
    .collect();
    assert_eq!(covered, want);
    assert!(
        policies.iter().any(|p| p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .ends_with("-region-gate")),
        "the region gate is required"
    );
    assert!(
        policies.iter().any(|p| p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .ends_with("-selected-pod-gate")),
        "the gate for custom pod selectors is required"
    );
    let off = render(&engine, json!({"admissionPolicies": {"enabled": false}}));
    assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());
}

/// A kernel without configfs (or debugfs): an empty host path leaves that mount out, so the
/// DaemonSet still starts (a `Directory` hostPath that does not exist keeps the pod pending).
#[test]
fn empty_debugfs_or_configfs_paths_are_not_mounted() {
    let Some(engine) = engine("empty_debugfs_or_configfs_paths_are_not_mounted") else {
        return;
    };
    let objects = render(
        &engine,
        json!({"node": {"hostPaths": {"configfs": "", "debugfs": ""}}}),
    );
    let ds = of_kind(&objects, "DaemonSet");
    let text = serde_json::to_string(&ds).unwrap();
    for gone in [
        "/host/configfs",
        "/host/debugfs",
        "/sys/kernel/config",
        "/sys/kernel/debug",
    ] {
        assert!(!text.contains(gone), "{gone} still rendered");
    }
    let defaults =
        serde_json::to_string(&of_kind(&render(&engine, Value::Null), "DaemonSet")).unwrap();
    for kept in [
        "--configfs-root=/host/configfs",
        "/sys/kernel/config",
        "/sys/kernel/debug",
    ] {
        assert!(defaults.contains(kept), "{kept} rendered by default");
    }
}

/// The DRA driver name: the daemon publishes its ResourceSlices under it, the DeviceClasses and
/// the admission policy select on it.
const DRA_DRIVER: &str = "rocefabric.io";

/// The daemon as a DRA driver: publish its node's ResourceSlices, read the claims the kubelet asks
/// it to prepare.
fn dra_grants() -> Grants {
    [
        grant(
            "resource.k8s.io",
            "resourceslices",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
        grant("resource.k8s.io", "resourceclaims", &["get"]),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `host path -> hostPath type` of each hostPath volume of a pod.
fn host_path_types(pod: &PodSpec) -> BTreeMap<String, String> {
    pod.volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.host_path)
        .map(|hp| (hp.path, hp.type_.unwrap_or_default()))
        .collect()
}

/// `node.mode` adds the DRA parts, and only those: `devicePlugin` (the default) renders no
/// DeviceClass, no resource.k8s.io rule or policy and no DRA flag or mount; `dra` renders both
/// DeviceClasses, the ResourceSlice and ResourceClaim rules, the own-node ResourceSlice policy,
/// the DRA flags and the kubelet's directories at their host paths, and drops the device plugin
/// directory; `both` keeps the device plugin parts and adds the pod-resources socket, read-only.
#[test]
fn node_mode_selects_the_dra_parts() {
    let Some(engine) = engine("node_mode_selects_the_dra_parts") else {
        return;
    };
    let policy_name = format!("{RELEASE}-rocefabric-node-own-resourceslices");
    for (values, mode) in [
        (Value::Null, "devicePlugin"),
        (json!({"node": {"mode": "devicePlugin"}}), "devicePlugin"),
        (json!({"node": {"mode": "dra"}}), "dra"),
        (json!({"node": {"mode": "both"}}), "both"),
    ] {
        let objects = render(&engine, values);
        let dra = mode != "devicePlugin";

        // Flags.
        let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
        let c = container(&pod, "device-plugin");
        let args = c.args.clone().unwrap_or_default();
        let has = |a: &str| args.iter().any(|x| x == a);
        assert!(has(&format!("--mode={mode}")), "{mode}: {args:?}");
        for (flag, wanted) in [
            (
                "--plugin-dir=/var/lib/kubelet/device-plugins",
                mode != "dra",
            ),
            (
                "--dra-plugin-dir=/var/lib/kubelet/plugins/rocefabric.io",
                dra,
            ),
            ("--dra-registry-dir=/var/lib/kubelet/plugins_registry", dra),
            ("--cdi-dir=/var/run/cdi", dra),
            (
                "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
                mode == "both",
            ),
        ] {
            assert_eq!(has(flag), wanted, "{mode}: {flag} in {args:?}");
        }
        for prefix in ["--dra-", "--cdi-", "--pod-resources"] {
            assert_eq!(
                args.iter().any(|a| a.starts_with(prefix)),
                prefix == "--pod-resources" && mode == "both" || prefix != "--pod-resources" && dra,
                "{mode}: {prefix}* in {args:?}"
            );
        }

        // Host paths: the kubelet's directories at the same path inside, pod-resources read-only.
        let mut expected: BTreeSet<(String, String, bool)> =
            [("/host/sys", "/sys", true), ("/host/dev", "/dev", true)]
                .into_iter()
                .map(|(m, h, ro)| (m.to_string(), h.to_string(), ro))
                .collect();
        let same = |p: &str, ro: bool| (p.to_string(), p.to_string(), ro);
        if mode != "dra" {
            expected.insert(same("/var/lib/kubelet/device-plugins", false));
        }
        if dra {
            expected.insert(same("/var/lib/kubelet/plugins/rocefabric.io", false));
            expected.insert(same("/var/lib/kubelet/plugins_registry", false));
            expected.insert(same("/var/run/cdi", false));
        }
        if mode == "both" {
            expected.insert(same("/var/lib/kubelet/pod-resources", true));
        }
        assert_eq!(
            host_mounts(&pod, c),
            expected,
            "{mode}: device-plugin host paths"
        );
        let types = host_path_types(&pod);
        let want_types: &[(&str, &str)] = match mode {
            "devicePlugin" => &[],
            "dra" => &[
                (
                    "/var/lib/kubelet/plugins/rocefabric.io",
                    "DirectoryOrCreate",
                ),
                ("/var/lib/kubelet/plugins_registry", "Directory"),
                ("/var/run/cdi", "DirectoryOrCreate"),
            ],
            _ => &[
                (
                    "/var/lib/kubelet/plugins/rocefabric.io",
                    "DirectoryOrCreate",
                ),
                ("/var/lib/kubelet/plugins_registry", "Directory"),
                ("/var/run/cdi", "DirectoryOrCreate"),
                ("/var/lib/kubelet/pod-resources", "Directory"),
            ],
        };
        for (path, kind) in want_types {
            assert_eq!(
                types.get(*path).map(String::as_str),
                Some(*kind),
                "{mode}: hostPath type of {path}"
            );
        }
        // The agent gets none of the kubelet's or CDI's directories.
        let agent = container(&pod, "qos-agent");
        assert!(
            host_mounts(&pod, agent)
                .iter()
                .all(|(_, host, _)| !host.starts_with("/var/")),
            "{mode}: qos-agent mounts {:?}",
            host_mounts(&pod, agent)
        );

        // RBAC: the device plugin's role gains the DRA rules, nothing else changes.
        let dp: ClusterRole = one(
            &objects,
            "ClusterRole",
            &format!("{RELEASE}-rocefabric-node-device-plugin"),
        );
        let mut want = device_plugin_grants();
        if dra {
            want.extend(dra_grants());
        }
        assert_eq!(grants(&dp.rules.unwrap_or_default()), want, "{mode}");
        for o in of_kind(&objects, "ClusterRole")
            .into_iter()
            .chain(of_kind(&objects, "Role"))
        {
            if o["metadata"]["name"] != format!("{RELEASE}-rocefabric-node-device-plugin").as_str()
            {
                assert!(
                    !o["rules"].to_string().contains("resource.k8s.io"),
                    "{mode}: {} grants resource.k8s.io",
                    object_ref(o)
                );
            }
        }

        // DeviceClasses.
        let classes = of_kind(&objects, "DeviceClass");
        if !dra {
            assert!(
                classes.is_empty(),
                "{mode}: {} DeviceClasses",
                classes.len()
            );
            let text = serde_json::to_string(&objects).unwrap();
            assert!(
                !text.contains("resource.k8s.io"),
                "{mode}: resource.k8s.io rendered"
            );
        } else {
            let mut names: Vec<&str> = classes
                .iter()
                .filter_map(|c| c["metadata"]["name"].as_str())
                .collect();
            names.sort_unstable();
            assert_eq!(names, ["gpu.rocefabric.io", "hca.rocefabric.io"], "{mode}");
            for kind in ["hca", "gpu"] {
                let raw = classes
                    .iter()
                    .find(|c| c["metadata"]["name"] == format!("{kind}.{DRA_DRIVER}").as_str())
                    .expect("rendered");
                assert_eq!(raw["apiVersion"], "resource.k8s.io/v1");
                assert!(raw["metadata"]["namespace"].is_null(), "cluster scoped");
                let class: DeviceClass =
                    one(&objects, "DeviceClass", &format!("{kind}.{DRA_DRIVER}"));
                let labels = class.metadata.labels.clone().unwrap_or_default();
                assert_eq!(
                    labels
                        .get("app.kubernetes.io/managed-by")
                        .map(String::as_str),
                    Some("Helm")
                );
                assert_eq!(
                    labels.get("app.kubernetes.io/instance").map(String::as_str),
                    Some(RELEASE)
                );
                let expressions: Vec<String> = class
                    .spec
                    .selectors
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|s| s.cel.map(|c| c.expression))
                    .collect();
                assert_eq!(
                    expressions,
                    [format!(
                        r#"device.driver == "{DRA_DRIVER}" && device.attributes["{DRA_DRIVER}"].type == "{kind}""#
                    )],
                    "{mode}: {kind} selector"
                );
            }
        }

        // The own-node ResourceSlice policy.
        let policies: Vec<&Value> = of_kind(&objects, "ValidatingAdmissionPolicy")
            .into_iter()
            .filter(|p| p["metadata"]["name"] == policy_name.as_str())
            .collect();
        let bindings: Vec<&Value> = of_kind(&objects, "ValidatingAdmissionPolicyBinding")
            .into_iter()
            .filter(|b| b["spec"]["policyName"] == policy_name.as_str())
            .collect();
        if !dra {
            assert!(policies.is_empty() && bindings.is_empty(), "{mode}");
            continue;
        }
        assert_eq!((policies.len(), bindings.len()), (1, 1), "{mode}");
        let (policy, binding) = (policies[0], bindings[0]);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(policy["spec"]["failurePolicy"], "Fail", "fails closed");
        assert_eq!(
            policy["spec"]["matchConstraints"]["resourceRules"],
            json!([{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}])
        );
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            format!(
                "request.userInfo.username == \"system:serviceaccount:{NAMESPACE}:{RELEASE}-rocefabric-node\""
            )
            .as_str()
        );
        let variables = policy["spec"]["variables"].to_string();
        assert!(
            variables.contains(
                "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
            ),
            "the requester's node comes from its node-bound token: {variables}"
        );
        assert!(
            variables.contains("request.operation == 'DELETE' ? oldObject : object"),
            "a DELETE is checked against the slice it deletes: {variables}"
        );
        let validations = policy["spec"]["validations"]
            .as_array()
            .expect("validations");
        let expressions: Vec<&str> = validations
            .iter()
            .filter_map(|v| v["expression"].as_str())
            .collect();
        assert_eq!(
            expressions,
            [
                "variables.requesterNode != ''",
                "variables.sliceNode == variables.requesterNode",
                &format!("variables.slice.spec.driver == \"{DRA_DRIVER}\""),
            ]
        );
        for v in validations {
            assert_eq!(v["reason"], "Forbidden");
        }
        let node_message = validations[1]["messageExpression"]
            .as_str()
            .unwrap_or_default();
        assert!(
            node_message.contains("variables.requesterNode")
                && node_message.contains("variables.sliceNode"),
            "the denial names both nodes: {node_message}"
        );

        // Without admission policies, not this one either.
        let off = render(
            &engine,
            json!({"node": {"mode": mode}, "admissionPolicies": {"enabled": false}}),
        );
        assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());
    }
}

/// Custom kubelet and CDI locations: the flags name them and each is mounted at its host path.
#[test]
fn dra_host_paths_follow_values_at_the_same_path() {
    let Some(engine) = engine("dra_host_paths_follow_values_at_the_same_path") else {
        return;
    };
    let objects = render(
        &engine,
        json!({"node": {"mode": "both", "hostPaths": {
            "kubeletPlugins": "/data/kubelet/plugins",
            "kubeletPluginsRegistry": "/data/kubelet/plugins_registry",
            "cdi": "/etc/cdi",
            "podResources": "/data/kubelet/pod-resources"}}}),
    );
    let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
    let c = container(&pod, "device-plugin");
    let args = c.args.clone().unwrap_or_default();
    for flag in [
        "--dra-plugin-dir=/data/kubelet/plugins/rocefabric.io",
        "--dra-registry-dir=/data/kubelet/plugins_registry",
        "--cdi-dir=/etc/cdi",
        "--pod-resources-socket=/data/kubelet/pod-resources/kubelet.sock",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    let mounts = host_mounts(&pod, c);
    for path in [
        "/data/kubelet/plugins/rocefabric.io",
        "/data/kubelet/plugins_registry",
        "/etc/cdi",
        "/data/kubelet/pod-resources",
    ] {
        assert!(
            mounts.iter().any(|(m, h, _)| m == path && h == path),
            "{path} mounted at its host path: {mounts:?}"
        );
    }
    // Every kubelet or CDI mount is at its host path (only sysfs and /dev are relocated).
    for (mount, host, _) in &mounts {
        if !mount.starts_with("/host/") {
            assert_eq!(mount, host, "{mount} is not the host's {host}");
        }
    }
}

/// The DRA examples ask the chart's DeviceClasses for GPU/HCA pairs: one constraint on
/// `resource.kubernetes.io/pcieRoot` per pair (a single one over all devices could never be met
/// on a DGX H100), and a pod that uses the claim.
#[test]
fn dra_examples_pair_each_gpu_with_an_hca() {
    for (file, template, pairs) in [
        ("examples/dra/gpu-hca-pairs.yaml", "gpu-hca-pairs", 2),
        ("examples/dra/rail-set.yaml", "rail-set", 8),
    ] {
        let path = workspace_root().join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let objects = parse_stream(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let raw = of_kind(&objects, "ResourceClaimTemplate");
        assert_eq!(raw.len(), 1, "{file}");
        assert_eq!(raw[0]["apiVersion"], "resource.k8s.io/v1", "{file}");
        let claim: ResourceClaimTemplate = one(&objects, "ResourceClaimTemplate", template);
        let devices = claim.spec.spec.devices.expect("spec.spec.devices");

        let requests = devices.requests.unwrap_or_default();
        let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
        let want: Vec<String> = (0..pairs)
            .flat_map(|i| [format!("gpu-{i}"), format!("hca-{i}")])
            .collect();
        assert_eq!(names, want, "{file}: requests");
        for r in &requests {
            let exactly = r
                .exactly
                .as_ref()
                .unwrap_or_else(|| panic!("{file}: {} has no `exactly`", r.name));
            let kind = r.name.split('-').next().unwrap_or_default();
            assert_eq!(
                exactly.device_class_name,
                format!("{kind}.{DRA_DRIVER}"),
                "{file}: {}",
                r.name
            );
            assert_eq!(exactly.count, Some(1), "{file}: {}", r.name);
        }

        let constraints: Vec<(Option<String>, Vec<String>)> = devices
            .constraints
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.match_attribute, c.requests.unwrap_or_default()))
            .collect();
        let want: Vec<(Option<String>, Vec<String>)> = (0..pairs)
            .map(|i| {
                (
                    Some("resource.kubernetes.io/pcieRoot".to_string()),
                    vec![format!("gpu-{i}"), format!("hca-{i}")],
                )
            })
            .collect();
        assert_eq!(
            constraints, want,
            "{file}: one pcieRoot constraint per pair"
        );

        let pods = of_kind(&objects, "Pod");
        assert_eq!(pods.len(), 1, "{file}: one Pod");
        let pod: Pod = serde_json::from_value(pods[0].clone())
            .unwrap_or_else(|e| panic!("{file}: not a Pod: {e}"));
        let spec = pod.spec.expect("pod spec");
        let claims = spec.resource_claims.unwrap_or_default();
        let claim_name = claims
            .iter()
            .find(|c| c.resource_claim_template_name.as_deref() == Some(template))
            .map(|c| c.name.clone())
            .unwrap_or_else(|| panic!("{file}: the pod does not claim {template}"));
        assert!(
            spec.containers.iter().any(|c| c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|cs| cs.iter().any(|x| x.name == claim_name))),
            "{file}: no container uses claim {claim_name}"
        );
    }
}
