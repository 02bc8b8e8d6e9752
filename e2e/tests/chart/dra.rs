//! `node.mode`: the DRA parts (DeviceClasses, rules, policies, flags, mounts) and the DRA examples.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use rocefabric_e2e::manifests::{object_ref, of_kind, parse_stream};
use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::helpers::{
    Grants, NAMESPACE, RELEASE, container, device_plugin_grants, engine, grant, grants,
    host_mounts, node_daemonset, one, pod_spec_of_daemonset, render,
};

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
/// the DRA flags and the kubelet's directories at their host paths with the pod-resources socket
/// read-only (GPUs are published by default: a GPU NVIDIA's device plugin granted must be seen),
/// and drops the device plugin directory; `both` keeps the device plugin parts.
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
                dra,
            ),
        ] {
            assert_eq!(has(flag), wanted, "{mode}: {flag} in {args:?}");
        }
        for prefix in ["--dra-", "--cdi-", "--pod-resources"] {
            assert_eq!(
                args.iter().any(|a| a.starts_with(prefix)),
                dra,
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

/// The pod-resources socket is mounted (read-only) and read wherever the daemon publishes GPUs, so
/// a GPU NVIDIA's device plugin gave to a running pod is never prepared for a claim: `dra` and
/// `both` by default. `node.dra.gpus: false` renders `--dra-gpus=false`, and in `dra` mode no
/// longer mounts the socket (no device plugin can hold a published device there); `both` still
/// needs it for its own device plugin's grants.
#[test]
fn the_pod_resources_socket_is_mounted_wherever_gpus_are_published() {
    let Some(engine) = engine("the_pod_resources_socket_is_mounted_wherever_gpus_are_published")
    else {
        return;
    };
    let socket = "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock";
    let mount = (
        "/var/lib/kubelet/pod-resources".to_string(),
        "/var/lib/kubelet/pod-resources".to_string(),
        true,
    );
    for (mode, gpus, reads, off_flag) in [
        ("dra", None, true, false),
        ("dra", Some(true), true, false),
        ("dra", Some(false), false, true),
        ("both", Some(false), true, true),
        ("devicePlugin", Some(false), false, false),
    ] {
        let mut values = json!({"node": {"mode": mode}});
        if let Some(gpus) = gpus {
            values["node"]["dra"] = json!({"gpus": gpus});
        }
        let objects = render(&engine, values);
        let pod = pod_spec_of_daemonset(&node_daemonset(&objects));
        let c = container(&pod, "device-plugin");
        let args = c.args.clone().unwrap_or_default();
        let case = format!("mode {mode}, gpus {gpus:?}");
        assert_eq!(args.iter().any(|a| a == socket), reads, "{case}: {args:?}");
        assert_eq!(
            args.iter().any(|a| a == "--dra-gpus=false"),
            off_flag,
            "{case}: {args:?}"
        );
        let mounts = host_mounts(&pod, c);
        assert_eq!(mounts.contains(&mount), reads, "{case}: {mounts:?}");
        assert!(
            mounts
                .iter()
                .all(|(m, _, ro)| *ro || !m.contains("pod-resources")),
            "{case}: pod-resources is only ever read-only: {mounts:?}"
        );
        assert_eq!(
            host_path_types(&pod)
                .get("/var/lib/kubelet/pod-resources")
                .map(String::as_str),
            reads.then_some("Directory"),
            "{case}"
        );
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
