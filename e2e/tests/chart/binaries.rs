//! Agreement with the binaries: the container args and the node config the chart renders are
//! accepted by the operator and the daemon.

use clap::Parser as _;
use k8s_openapi::api::core::v1::Container;
use rocefabric_e2e::manifests::of_kind;
use serde_json::{Value, json};

use crate::helpers::{
    RELEASE, container, engine, node_daemonset, operator_deployment, pod_spec_of_daemonset,
    pod_spec_of_deployment, render,
};

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
    // Every node.mode, GPUs published or not: the DRA flags are the daemon's too.
    for (mode, gpus) in [("dra", true), ("dra", false), ("both", false)] {
        let objects = render(
            &engine,
            json!({"node": {"mode": mode, "dra": {"gpus": gpus}}}),
        );
        let node = pod_spec_of_daemonset(&node_daemonset(&objects));
        let args = argv(
            "rocefabric-device-plugin",
            container(&node, "device-plugin"),
        );
        if let Err(e) = rocefabric_device_plugin::cli::Cli::try_parse_from(&args) {
            panic!(
                "rocefabric-device-plugin rejects the mode={mode} gpus={gpus} args {args:?}: {e}"
            );
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
