//! Least privilege, proven by the real API server: for each ServiceAccount of the chart, requests
//! that must be allowed and requests that must be denied, asked with SubjectAccessReview (RBAC and
//! the Node authorizer answer exactly as they would for the pod's token); and what RBAC cannot
//! narrow, denied by the chart's ValidatingAdmissionPolicies for the impersonated ServiceAccounts.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::{
    NAMESPACE, RELEASE, WORKLOAD_NAMESPACE, apply_value, cluster, create_pod, delete_pod,
    eventually, local_cluster, service_account_identity,
};

/// One request: verb, API group, resource (with `/subresource`), namespace ("" = cluster scope),
/// name ("" = any).
type Request = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

async fn allowed(client: &Client, service_account: &str, req: Request) -> bool {
    let (verb, group, resource, namespace, name) = req;
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let (user, groups) = service_account_identity(NAMESPACE, service_account);
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user),
            groups: Some(groups),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                name: (!name.is_empty()).then(|| name.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &sar)
        .await
        .expect("SubjectAccessReview");
    review.status.is_some_and(|s| s.allowed)
}

async fn check_table(client: &Client, service_account: &str, allow: &[Request], deny: &[Request]) {
    let mut wrong = Vec::new();
    for req in allow {
        if !allowed(client, service_account, *req).await {
            wrong.push(format!("denied but needed: {req:?}"));
        }
    }
    for req in deny {
        if allowed(client, service_account, *req).await {
            wrong.push(format!("allowed but must not be: {req:?}"));
        }
    }
    assert!(wrong.is_empty(), "{service_account}:\n{}", wrong.join("\n"));
}

#[test]
fn operator_service_account_has_least_privilege() {
    const TEST: &str = "operator_service_account_has_least_privilege";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let sa = format!("{RELEASE}-operator");
    let allow: &[Request] = &[
        ("list", "rocefabric.io", "rocefabrics", "", ""),
        ("watch", "rocefabric.io", "rocefabrics", "", ""),
        ("patch", "rocefabric.io", "rocefabrics/status", "", "e2e"),
        ("create", "rocefabric.io", "rocenodes", "", ""),
        ("patch", "rocefabric.io", "rocenodes", "", "any-node"),
        ("delete", "rocefabric.io", "rocenodes", "", "any-node"),
        ("list", "", "nodes", "", ""),
        ("watch", "", "pods", "", ""),
        ("patch", "", "pods", WORKLOAD_NAMESPACE, "p"),
        ("create", "", "configmaps", WORKLOAD_NAMESPACE, ""),
        ("create", "", "secrets", WORKLOAD_NAMESPACE, ""),
        ("create", "events.k8s.io", "events", WORKLOAD_NAMESPACE, ""),
        ("create", "coordination.k8s.io", "leases", NAMESPACE, ""),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            NAMESPACE,
            "rocefabric-operator",
        ),
    ];
    let deny: &[Request] = &[
        ("get", "", "secrets", NAMESPACE, ""),
        ("list", "", "secrets", "", ""),
        ("get", "", "secrets", WORKLOAD_NAMESPACE, "e2e-key"),
        ("delete", "", "secrets", WORKLOAD_NAMESPACE, "e2e-key"),
        ("create", "", "pods", WORKLOAD_NAMESPACE, ""),
        ("delete", "", "pods", WORKLOAD_NAMESPACE, "p"),
        ("create", "", "pods/exec", WORKLOAD_NAMESPACE, "p"),
        (
            "patch",
            "",
            "pods/ephemeralcontainers",
            WORKLOAD_NAMESPACE,
            "p",
        ),
        ("patch", "", "pods/status", WORKLOAD_NAMESPACE, "p"),
        ("patch", "", "nodes", "", "n"),
        ("update", "rocefabric.io", "rocefabrics", "", "e2e"),
        ("delete", "rocefabric.io", "rocefabrics", "", "e2e"),
        ("patch", "rocefabric.io", "rocenodes/status", "", "n"),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            NAMESPACE,
            "someone-elses-lease",
        ),
        ("create", "coordination.k8s.io", "leases", "kube-system", ""),
        (
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
            "",
        ),
        ("create", "apps", "deployments", NAMESPACE, ""),
        (
            "create",
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            "",
            "",
        ),
    ];
    ctx.rt.block_on(check_table(&ctx.client, &sa, allow, deny));
}

#[test]
fn node_service_account_has_least_privilege() {
    const TEST: &str = "node_service_account_has_least_privilege";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let sa = format!("{RELEASE}-node");
    let allow: &[Request] = &[
        ("get", "rocefabric.io", "rocenodes", "", "n"),
        ("watch", "rocefabric.io", "rocenodes", "", ""),
        ("patch", "rocefabric.io", "rocenodes/status", "", "n"),
        ("create", "events.k8s.io", "events", "default", ""),
        // DRA mode (the suite runs `both`): its node's slice, the claims it prepares.
        ("create", "resource.k8s.io", "resourceslices", "", ""),
        ("update", "resource.k8s.io", "resourceslices", "", "s"),
        (
            "get",
            "resource.k8s.io",
            "resourceclaims",
            WORKLOAD_NAMESPACE,
            "c",
        ),
    ];
    let deny: &[Request] = &[
        (
            "update",
            "resource.k8s.io",
            "resourceclaims",
            WORKLOAD_NAMESPACE,
            "c",
        ),
        (
            "patch",
            "resource.k8s.io",
            "resourceclaims/status",
            WORKLOAD_NAMESPACE,
            "c",
        ),
        ("create", "resource.k8s.io", "deviceclasses", "", ""),
        ("create", "rocefabric.io", "rocenodes", "", ""),
        ("patch", "rocefabric.io", "rocenodes", "", "n"),
        ("delete", "rocefabric.io", "rocenodes", "", "n"),
        ("list", "rocefabric.io", "rocefabrics", "", ""),
        ("get", "", "secrets", NAMESPACE, ""),
        ("list", "", "pods", "", ""),
        ("patch", "", "nodes", "", "n"),
        ("patch", "", "nodes/status", "", "n"),
        ("create", "", "configmaps", NAMESPACE, ""),
        ("patch", "", "pods", WORKLOAD_NAMESPACE, "p"),
        // Events only in `default`, where those about cluster-scoped RoceNodes go.
        ("create", "events.k8s.io", "events", WORKLOAD_NAMESPACE, ""),
        ("create", "events.k8s.io", "events", NAMESPACE, ""),
    ];
    ctx.rt.block_on(check_table(&ctx.client, &sa, allow, deny));
}

/// A request made as `service_account` of the release would make it with its pod's token: the
/// admin impersonating it, with `node` as the node the token is bound to when given. Dry run, so
/// nothing changes; `Err` carries the API server's refusal.
async fn request_as(
    client: &Client,
    service_account: &str,
    node: Option<&str>,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<String, String> {
    let (user, groups) = service_account_identity(NAMESPACE, service_account);
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("{path}?dryRun=All"))
        .header("Content-Type", content_type)
        .header("Impersonate-User", user);
    for group in groups {
        request = request.header("Impersonate-Group", group);
    }
    if let Some(node) = node {
        request = request.header(
            "Impersonate-Extra-authentication.kubernetes.io%2fnode-name",
            node,
        );
    }
    let request = request
        .body(body.as_bytes().to_vec())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())
}

fn denied_with(result: Result<String, String>, message: &str, what: &str) {
    match result {
        Ok(out) => panic!("{what} was allowed: {out}"),
        Err(err) => assert!(
            err.contains(message),
            "{what}: denied with {message:?}: {err}"
        ),
    }
}

/// What RBAC cannot narrow, the chart's admission policies do: the operator, which may patch any
/// pod, can move only the region annotation and the region gate, and write only `*-regions`
/// ConfigMaps.
#[test]
fn operator_writes_are_confined_by_admission_policy() {
    const TEST: &str = "operator_writes_are_confined_by_admission_policy";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let operator = format!("{RELEASE}-operator");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        create_pod(
            &pods,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "vap-target", "namespace": WORKLOAD_NAMESPACE, "labels": {"app": "vap"}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "c", "image": local.busybox_image, "command": ["sleep", "3600"]
                }]}
            }),
        )
        .await;
        let pod = format!("/api/v1/namespaces/{WORKLOAD_NAMESPACE}/pods/vap-target");
        let patch = |body: &'static str| {
            request_as(client, &operator, None, "PATCH", &pod, "application/strategic-merge-patch+json", body)
        };
        patch(r#"{"metadata":{"annotations":{"rocefabric.io/region":"{\"fabric\":\"e2e\"}"}}}"#)
            .await
            .expect("the region annotation is the operator's to write");
        denied_with(
            patch(r#"{"spec":{"containers":[{"name":"c","image":"evil:latest"}]}}"#).await,
            "may not change a pod's containers",
            "operator changes a container image",
        );
        denied_with(
            patch(r#"{"metadata":{"labels":{"app":"other"}}}"#).await,
            "may not change a pod's containers, scheduling, labels",
            "operator relabels a pod",
        );
        denied_with(
            patch(r#"{"metadata":{"annotations":{"other.io/x":"y"}}}"#).await,
            "only the rocefabric.io/region and rocefabric.io/region-reclaimed annotations",
            "operator writes another annotation",
        );
        let configmaps = format!("/api/v1/namespaces/{WORKLOAD_NAMESPACE}/configmaps");
        let create_cm = |name: &str| {
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
            let configmaps = configmaps.clone();
            let operator = operator.clone();
            async move {
                request_as(client, &operator, None, "POST", &configmaps, "application/json", &body.to_string()).await
            }
        };
        create_cm("e2e-regions").await.expect("a region directory is the operator's to write");
        denied_with(
            create_cm("kube-root-ca-copy").await,
            "may write only <fabric>-regions ConfigMaps",
            "operator writes another ConfigMap",
        );
        // Secrets: only the fabric keys, immutable and labelled.
        let secrets = format!("/api/v1/namespaces/{WORKLOAD_NAMESPACE}/secrets");
        let create_secret = |name: &str, immutable: bool| {
            let body = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "immutable": immutable,
                "metadata": {"name": name, "labels": {"rocefabric.io/fabric": "vap"}},
                "data": {"key": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}});
            let secrets = secrets.clone();
            let operator = operator.clone();
            async move {
                request_as(client, &operator, None, "POST", &secrets, "application/json", &body.to_string()).await
            }
        };
        create_secret("vap-key", true).await.expect("a fabric key is the operator's to create");
        denied_with(
            create_secret("vap-token", true).await,
            "may only create immutable <fabric>-key Secrets",
            "operator creates another Secret",
        );
        denied_with(
            create_secret("vap2-key", false).await,
            "may only create immutable <fabric>-key Secrets",
            "operator creates a mutable key",
        );
        delete_pod(&pods, "vap-target").await;
    });
}

/// Every node's agent holds RBAC `patch` on all RoceNode statuses; the admission policy ties its
/// writes to the node its token is bound to.
#[test]
fn node_agent_writes_only_its_own_rocenode() {
    const TEST: &str = "node_agent_writes_only_its_own_rocenode";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let node = local.node_name.clone();
    let other = "rfe2e-other";
    let sa = format!("{RELEASE}-node");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        crate::roce_node(client, &node).await;
        // Another node's RoceNode that the operator keeps: a Node object (tainted, no kubelet)
        // selected by a fabric of its own. A RoceNode without one would be deleted under the test.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let fabrics: Api<rocefabric_api::RoceFabric> = Api::all(client.clone());
        let _ = nodes.delete(other, &Default::default()).await;
        let fake: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": other, "labels": {"rocefabric.io/e2e-other": "true"}},
            "spec": {"taints": [{"key": "rocefabric.io/e2e-fake", "value": "true", "effect": "NoSchedule"}]}
        }))
        .expect("node");
        crate::eventually("create the other node", || async {
            nodes.create(&PostParams::default(), &fake).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
        crate::apply_value(
            client,
            &json!({
                "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
                "metadata": {"name": "e2e-other"},
                "spec": {"nodeSelector": {"matchLabels": {"rocefabric.io/e2e-other": "true"}}}
            }),
        )
        .await
        .expect("apply the other node's fabric");
        crate::roce_node(client, other).await;
        let body = r#"{"status":{"lastSyncTime":"2026-01-01T00:00:00Z"}}"#;
        let patch_status = |bound: Option<&'static str>, name: &str| {
            let path = format!("/apis/rocefabric.io/v1alpha1/rocenodes/{name}/status");
            let sa = sa.clone();
            let bound = bound.map(|_| node.clone());
            async move {
                request_as(
                    client,
                    &sa,
                    bound.as_deref(),
                    "PATCH",
                    &path,
                    "application/merge-patch+json",
                    body,
                )
                .await
            }
        };
        patch_status(Some("own"), &node)
            .await
            .expect("the agent writes its own node's status");
        denied_with(
            patch_status(Some("own"), other).await,
            "may write only the RoceNode of its own node",
            "an agent writes another node's RoceNode status",
        );
        denied_with(
            patch_status(None, &node).await,
            "may write only the RoceNode of its own node",
            "a token bound to no node writes a RoceNode status",
        );
        // Its Events: only about its own node's RoceNode (the agent records drift so).
        let event_about = |name: &str| {
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": format!("rfe2e-probe-{name}"), "namespace": "default"},
                "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "rocefabric-agent",
                "reportingInstance": "probe", "action": "Reconcile", "reason": "Probe", "type": "Normal",
                "regarding": {"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNode", "name": name}})
            .to_string()
        };
        let post_event = |body: String| {
            let sa = sa.clone();
            let node = node.clone();
            async move {
                request_as(
                    client,
                    &sa,
                    Some(&node),
                    "POST",
                    "/apis/events.k8s.io/v1/namespaces/default/events",
                    "application/json",
                    &body,
                )
                .await
            }
        };
        post_event(event_about(&node))
            .await
            .expect("the agent records an Event about its own RoceNode");
        denied_with(
            post_event(event_about(other)).await,
            "Events only about the RoceNode of its own node",
            "an agent records an Event about another node's RoceNode",
        );
        let _ = fabrics.delete("e2e-other", &Default::default()).await;
        let _ = nodes.delete(other, &Default::default()).await;
    });
}

/// Nobody but the operator writes a pod's region annotation: a pod created with one (hand-written,
/// or a manifest exported from a running pod) and an edit of it are refused, even for the admin.
#[test]
fn only_the_operator_writes_region_annotations() {
    const TEST: &str = "only_the_operator_writes_region_annotations";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    const REFUSED: &str = "only the rocefabric operator writes the rocefabric.io/region annotation";
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let claimed = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "vap-claimer", "namespace": WORKLOAD_NAMESPACE,
                "annotations": {"rocefabric.io/region": "{\"fabric\":\"e2e\",\"id\":0,\"base\":0,\"size\":1048576}"}
            },
            "spec": {"containers": [{"name": "c", "image": local.busybox_image}]}
        });
        let pod: Pod = serde_json::from_value(claimed).expect("pod");
        let dry = PostParams { dry_run: true, ..Default::default() };
        denied_with(
            pods.create(&dry, &pod).await.map(|_| String::new()).map_err(|e| e.to_string()),
            REFUSED,
            "a pod created with a region annotation",
        );
        create_pod(
            &pods,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "vap-plain", "namespace": WORKLOAD_NAMESPACE},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "c", "image": local.busybox_image, "command": ["sleep", "3600"]
                }]}
            }),
        )
        .await;
        let patch = json!({"metadata": {"annotations": {"rocefabric.io/region": "{}"}}});
        let params = kube::api::PatchParams { dry_run: true, ..Default::default() };
        denied_with(
            pods.patch("vap-plain", &params, &kube::api::Patch::Merge(&patch))
                .await
                .map(|_| String::new())
                .map_err(|e| e.to_string()),
            REFUSED,
            "the admin adds a region annotation",
        );
        // A pod labelled for a fabric must be created behind the region gate.
        let ungated: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vap-ungated", "namespace": WORKLOAD_NAMESPACE,
                         "labels": {"rocefabric.io/fabric": "e2e"}},
            "spec": {"containers": [{"name": "c", "image": local.busybox_image}]}
        }))
        .expect("pod");
        denied_with(
            pods.create(&dry, &ungated).await.map(|_| String::new()).map_err(|e| e.to_string()),
            "must be created with the rocefabric.io/region scheduling gate",
            "a fabric pod created without the gate",
        );
        let mut gated = ungated.clone();
        gated.spec.get_or_insert_default().scheduling_gates =
            Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: "rocefabric.io/region".into(),
            }]);
        pods.create(&dry, &gated).await.expect("the same pod with the gate is admitted");
        // Other edits of pods are none of its business.
        let label = json!({"metadata": {"labels": {"edited": "yes"}}});
        pods.patch("vap-plain", &params, &kube::api::Patch::Merge(&label))
            .await
            .expect("an unrelated edit passes");
        delete_pod(&pods, "vap-plain").await;
    });
}

/// A fabric with a custom `sharedMemory.podSelector` (labels and expressions): a pod it selects is
/// refused unless created behind the region gate, naming the fabric; a pod it does not select,
/// and the selected pod with the gate, are admitted. The fabrics are the policy's params.
#[test]
fn pods_a_custom_selector_picks_need_the_region_gate() {
    const TEST: &str = "pods_a_custom_selector_picks_need_the_region_gate";
    const NAME: &str = "vap-selector";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let client = &ctx.client;
        // No node has the label: this fabric configures nothing and conflicts with nobody.
        let fabric = json!({
            "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
            "metadata": {"name": NAME},
            "spec": {
                "nodeSelector": {"matchLabels": {"rocefabric.io/e2e-none": "true"}},
                "sharedMemory": {
                    "regionSize": "1Mi", "maxRegions": 4,
                    "podSelector": {
                        "matchLabels": {"app": "dsm-custom"},
                        "matchExpressions": [
                            {"key": "tier", "operator": "In", "values": ["train"]},
                            {"key": "debug", "operator": "DoesNotExist"}
                        ]
                    }
                }
            }
        });
        apply_value(client, &fabric)
            .await
            .expect("apply the fabric");
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let pod = |name: &str, labels: serde_json::Value, gated: bool| -> Pod {
            let gates = if gated {
                json!([{"name": "rocefabric.io/region"}])
            } else {
                json!([])
            };
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE, "labels": labels},
                "spec": {"schedulingGates": gates,
                         "containers": [{"name": "c", "image": local.busybox_image}]}
            }))
            .expect("pod")
        };
        let selected = json!({"app": "dsm-custom", "tier": "train"});
        // The API server reads its params through an informer: the new fabric takes a moment.
        let refused = eventually("the selected ungated pod refused", || async {
            match pods
                .create(&dry, &pod("vap-selected", selected.clone(), false))
                .await
            {
                Err(e) => Ok(e.to_string()),
                Ok(_) => Err("admitted".to_string()),
            }
        })
        .await;
        assert!(
            refused.contains("sharedMemory.podSelector of RoceFabric vap-selector")
                && refused.contains("rocefabric.io/region scheduling gate"),
            "{refused}"
        );
        pods.create(&dry, &pod("vap-selected", selected.clone(), true))
            .await
            .expect("the selected pod behind the gate is admitted");
        for (name, labels) in [
            ("vap-eval", json!({"app": "dsm-custom", "tier": "eval"})),
            (
                "vap-debug",
                json!({"app": "dsm-custom", "tier": "train", "debug": "1"}),
            ),
            ("vap-other", json!({"app": "web"})),
        ] {
            pods.create(&dry, &pod(name, labels, false))
                .await
                .unwrap_or_else(|e| panic!("{name}, not selected, is admitted: {e}"));
        }
        let fabrics: Api<rocefabric_api::RoceFabric> = Api::all(client.clone());
        fabrics
            .delete(NAME, &Default::default())
            .await
            .expect("delete the fabric");
    });
}

/// RBAC lets the node daemon write ResourceSlices; the chart's admission policy narrows that to
/// its own node's slices of its own driver (as upstream DRA drivers do).
#[test]
fn node_daemon_writes_only_its_own_nodes_resource_slices() {
    const TEST: &str = "node_daemon_writes_only_its_own_nodes_resource_slices";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let node = local.node_name.clone();
    let sa = format!("{RELEASE}-node");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let create = |bound: Option<String>, slice_node: &str, driver: &str| {
            let body = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{slice_node}-e2e-check")},
                "spec": {"driver": driver, "nodeName": slice_node,
                    "pool": {"name": slice_node, "generation": 1, "resourceSliceCount": 1},
                    "devices": []}
            })
            .to_string();
            let sa = sa.clone();
            async move {
                request_as(
                    client,
                    &sa,
                    bound.as_deref(),
                    "POST",
                    "/apis/resource.k8s.io/v1/resourceslices",
                    "application/json",
                    &body,
                )
                .await
            }
        };
        create(Some(node.clone()), &node, "rocefabric.io")
            .await
            .expect("the daemon writes its own node's slice");
        denied_with(
            create(Some(node.clone()), "rfe2e-other", "rocefabric.io").await,
            "may write only ResourceSlices of its own node",
            "a daemon writes another node's slice",
        );
        denied_with(
            create(Some(node.clone()), &node, "gpu.nvidia.com").await,
            "may write only ResourceSlices of driver rocefabric.io",
            "a daemon writes another driver's slice",
        );
        denied_with(
            create(None, &node, "rocefabric.io").await,
            "bound to no node",
            "a token bound to no node writes a slice",
        );
    });
}
