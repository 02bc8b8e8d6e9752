//! Least privilege, proven by the real authorizer: for each ServiceAccount of the chart, requests
//! that must be allowed and requests that must be denied, asked with SubjectAccessReview (RBAC and
//! the Node authorizer answer exactly as they would for the pod's token).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::{NAMESPACE, RELEASE, WORKLOAD_NAMESPACE, cluster};

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
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!(
                "system:serviceaccount:{NAMESPACE}:{service_account}"
            )),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".into(),
            ]),
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
    ];
    let deny: &[Request] = &[
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
    ];
    ctx.rt.block_on(check_table(&ctx.client, &sa, allow, deny));
}
