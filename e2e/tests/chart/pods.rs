//! The pods: security contexts, capabilities, host paths and scheduling of the operator and the
//! node DaemonSet.

use std::collections::BTreeSet;

use rocefabric_e2e::manifests::of_kind;
use serde_json::{Value, json};

use crate::helpers::{
    added_caps, all_pod_specs, container, drops_all, engine, host_mounts, names, node_daemonset,
    operator_deployment, pod_spec_of_daemonset, pod_spec_of_deployment, render, sc, seccomp,
};

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
