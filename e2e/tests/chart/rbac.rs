//! RBAC and admission policies: each ServiceAccount gets exactly what its code uses, and the
//! policies confine the writes RBAC cannot narrow.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use rocefabric_e2e::manifests::{object_ref, of_kind};
use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::helpers::{
    Grants, NAMESPACE, RELEASE, device_plugin_grants, engine, grant, grants, node_daemonset, one,
    operator_deployment, pod_spec_of_daemonset, pod_spec_of_deployment, render,
};

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

/// The QoS agent: watch its RoceNode, write its status, record Events.
fn qos_agent_grants() -> BTreeSet<(String, String, String, String)> {
    [
        grant("rocefabric.io", "rocenodes", &["get", "list", "watch"]),
        grant("rocefabric.io", "rocenodes/status", &["patch"]),
    ]
    .into_iter()
    .flatten()
    .collect()
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
    // Its Events only in `default`, where those about cluster-scoped RoceNodes go.
    let events: Role = one(
        &objects,
        "Role",
        &format!("{RELEASE}-rocefabric-node-qos-agent-events"),
    );
    assert_eq!(events.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        grants(&events.rules.unwrap_or_default()),
        grant("events.k8s.io", "events", &["create", "patch"])
            .into_iter()
            .collect()
    );

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
        (
            format!("{RELEASE}-rocefabric-node-qos-agent-events"),
            sa("node"),
        ),
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
        let sa = if name.ends_with("-own-rocenode") || name.ends_with("-own-events") {
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
        ("node", "events"),
        ("node", "rocenodes"),
        ("node", "rocenodes/status"),
        ("operator", "configmaps"),
        ("operator", "pods"),
        ("operator", "pods"),
        // The region annotations' policy covers the status subresource too.
        ("operator", "pods/status"),
        ("operator", "secrets"),
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
