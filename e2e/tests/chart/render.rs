//! Rendering with the values: lint, the default set of objects, the schema, the optional parts
//! and the notes.

use std::collections::{BTreeMap, BTreeSet};

use rocefabric_e2e::manifests::{object_ref, of_kind};
use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::helpers::{NAMESPACE, RELEASE, chart_dir, engine, render};

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
        ("Role", 2),
        ("RoleBinding", 2),
        ("Service", 2),
        ("ConfigMap", 1),
        ("ValidatingAdmissionPolicy", 8),
        ("ValidatingAdmissionPolicyBinding", 8),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(kinds, expected, "objects rendered with default values");
    for o in &objects {
        let cluster_scoped = o["kind"].as_str().is_some_and(|k| {
            k.starts_with("Cluster") || k.starts_with("ValidatingAdmissionPolicy")
        });
        // The agent's Events Role lives where Events about cluster-scoped objects go.
        let events_role = o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-node-qos-agent-events"));
        if o["kind"] != "CustomResourceDefinition" && !cluster_scoped && !events_role {
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
        (json!({"node": {"dra": {"gpus": "no"}}}), "gpus"),
        (json!({"node": {"dra": {"gpu": false}}}), "gpu"),
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
        let service = of_kind(&on, "Service")
            .into_iter()
            .find(|s| {
                let labels = &s["metadata"]["labels"];
                selector
                    .as_object()
                    .is_some_and(|sel| sel.iter().all(|(k, v)| &labels[k] == v))
            })
            .unwrap_or_else(|| panic!("{} selects no Service", object_ref(m)));
        // The pods behind the Service, and the names of their containers' ports.
        let workload = ["Deployment", "DaemonSet"]
            .into_iter()
            .flat_map(|k| of_kind(&on, k))
            .find(|w| {
                let labels = &w["spec"]["template"]["metadata"]["labels"];
                selector
                    .as_object()
                    .is_some_and(|sel| sel.iter().all(|(k, v)| &labels[k] == v))
            })
            .unwrap_or_else(|| panic!("{} selects no workload", object_ref(m)));
        let container_ports: Vec<&Value> = workload["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .map(|p| &p["name"])
            .collect();
        let endpoints = m["spec"]["endpoints"].as_array().expect("endpoints");
        for port in endpoints.iter().map(|e| &e["port"]) {
            let service_port = service["spec"]["ports"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == *port))
                .unwrap_or_else(|| {
                    panic!(
                        "{} scrapes port {port} that {} lacks",
                        object_ref(m),
                        object_ref(service)
                    )
                });
            assert!(
                container_ports.contains(&&service_port["targetPort"]),
                "{} targets {} that no container of {} names",
                object_ref(service),
                service_port["targetPort"],
                object_ref(workload)
            );
        }
        if workload["kind"] == "DaemonSet" {
            // Both containers' metrics: the device plugin's and the QoS agent's.
            let ports: std::collections::BTreeSet<&str> = endpoints
                .iter()
                .filter_map(|e| e["port"].as_str())
                .collect();
            assert_eq!(ports, ["device-metrics", "metrics"].into());
        }
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

    // The data plane's rendezvous port, per fabric and namespace: only from the fabric's pods,
    // every other port left open.
    let dsm = render(
        &engine,
        json!({"dataPlanePolicy": {"fabrics": [{"fabric": "training", "namespace": "ml"}]}}),
    );
    let policies = of_kind(&dsm, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "only the data plane's");
    let p = policies[0];
    assert_eq!(p["metadata"]["namespace"], "ml");
    let fabric_pods = json!({"matchLabels": {"rocefabric.io/fabric": "training"}});
    assert_eq!(p["spec"]["podSelector"], fabric_pods);
    // By default every port only from the fabric's own pods: nothing opened to other sources
    // (it would override the namespace's default-deny).
    let ingress = &p["spec"]["ingress"];
    assert_eq!(
        ingress,
        &json!([{"from": [{"podSelector": fabric_pods}]}]),
        "every port, from the fabric's pods only"
    );
    let open = render(
        &engine,
        json!({"dataPlanePolicy": {"otherPorts": true, "fabrics": [{"fabric": "training", "namespace": "ml"}]}}),
    );
    let ingress = &of_kind(&open, "NetworkPolicy")[0]["spec"]["ingress"];
    assert_eq!(ingress[0]["from"], json!([{"podSelector": fabric_pods}]));
    assert_eq!(
        ingress[0]["ports"],
        json!([{"protocol": "TCP", "port": 18516}])
    );
    assert!(ingress[1]["from"].is_null(), "other ports from anywhere");
    assert_eq!(
        ingress[1]["ports"],
        json!([{"protocol": "TCP", "port": 1, "endPort": 18515},
               {"protocol": "TCP", "port": 18517, "endPort": 65535},
               {"protocol": "UDP"}, {"protocol": "SCTP"}])
    );
    let closed = render(
        &engine,
        json!({"dataPlanePolicy": {"otherPorts": false, "fabrics": [{"fabric": "t", "namespace": "ml",
               "podSelector": {"matchLabels": {"app": "trainer"}}}]}}),
    );
    let p = of_kind(&closed, "NetworkPolicy")[0];
    assert_eq!(
        p["spec"]["podSelector"],
        json!({"matchLabels": {"app": "trainer"}})
    );
    assert_eq!(
        p["spec"]["ingress"],
        json!([{"from": [{"podSelector": {"matchLabels": {"app": "trainer"}}}],
                "ports": [{"protocol": "TCP", "port": 18516}]}])
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

#[test]
fn the_vm_workers_values_file_puts_the_daemon_on_the_workers_only() {
    let Some(engine) = engine("the_vm_workers_values_file_puts_the_daemon_on_the_workers_only")
    else {
        return;
    };
    // The README's values for `e2e/cluster/up --workers N` pass the schema and say what they mean.
    let file = workspace_root().join("examples/values/vm-workers.yaml");
    let text = std::fs::read_to_string(&file).expect("the values file");
    let values: Value = yaml_serde::from_str(&text).expect("YAML");
    let objects = render(&engine, values);
    let pod = crate::helpers::pod_spec_of_daemonset(&crate::helpers::node_daemonset(&objects));
    let selector = pod.node_selector.clone().unwrap_or_default();
    assert_eq!(
        selector.get("rocefabric.io/vm-worker").map(String::as_str),
        Some("true")
    );
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("rocefabric.io/vm-worker")
                && t.effect.as_deref() == Some("NoSchedule")),
        "{tolerations:?}"
    );
    let config = of_kind(&objects, "ConfigMap")
        .into_iter()
        .map(|c| c.to_string())
        .find(|c| c.contains("softRoce"))
        .expect("the node config");
    assert!(config.contains("softRoce: include"), "{config}");
}
