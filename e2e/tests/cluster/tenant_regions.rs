//! Issue 39, attack 1 and the doors around it: a tenant with only `edit` rights tries to take a
//! fabric's windows with pods that never run (a second scheduling gate of its own, a nodeSelector
//! no node matches), with one pod
//! asking for the whole space, with more pods than its namespace's share, from a namespace the
//! fabric does not serve, by undoing a reclaim (through the pod and through `pods/status`), and
//! with a region directory of its own planted before the operator's (attack 7: it is replaced).
//! A well-behaved tenant in another namespace is served meanwhile.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::{
    FABRIC_LABEL, REGION_ANNOTATION, REGION_RECLAIMED_ANNOTATION, REGION_SCHEDULING_GATE, reason,
};
use rocefabric_e2e::cluster::LocalCluster;
use serde_json::{Value, json};

use crate::devices::hca_pod;
use crate::regions::{assigned_window, gated_pod};
use crate::tenant::{TENANT, apply, delete_namespace, tenant_of};
use crate::{WORKLOAD_NAMESPACE, create_pod, delete_pod, eventually, local_cluster, running};

/// The fabric of this test: shared memory only (it selects no node), 8 regions, so the default
/// share of a namespace is 2.
const FABRIC: &str = "e2e-tenancy";
/// A namespace of the same tenant that the fabric does not serve.
const OUTSIDER: &str = "rocefabric-e2e-outsider";
const RECLAIM_SECS: u64 = 15;
/// The attacker's own gate, which it never removes.
const OWN_GATE: &str = "tenant.example/never";
/// The operator's grace period before a freed window is handed out again.
const GRACE: Duration = Duration::from_secs(30);

fn fabric() -> Value {
    json!({
        "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
        "metadata": {"name": FABRIC},
        "spec": {
            "nodeSelector": {"matchLabels": {"rocefabric.io/e2e-tenancy": "none"}},
            "sharedMemory": {
                "regionSize": "1Mi", "maxRegions": 8,
                "namespaces": [TENANT, WORKLOAD_NAMESPACE],
                "reclaimUnboundAfterSeconds": RECLAIM_SECS,
                "podSelector": {"matchLabels": {FABRIC_LABEL: FABRIC}}
            }
        }
    })
}

/// A gated pod of this fabric in `namespace`, asking for `size` when given; when `nowhere`, with
/// a nodeSelector no node matches (it is never bound).
fn fabric_pod(
    name: &str,
    namespace: &str,
    image: &str,
    size: Option<&str>,
    nowhere: bool,
) -> Value {
    let mut p = gated_pod(name, image);
    p["metadata"]["namespace"] = json!(namespace);
    p["metadata"]["labels"][FABRIC_LABEL] = json!(FABRIC);
    if let Some(size) = size {
        p["metadata"]["annotations"] = json!({"rocefabric.io/region-size": size});
    }
    if nowhere {
        p["spec"]["nodeSelector"] = json!({"tenant.example/nowhere": "true"});
    }
    p
}

fn gates(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

/// The pod holds a window, no gate left, and no node.
async fn window_unbound(pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name}: a window, no gate, no node"), || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let held = p.annotations().contains_key(REGION_ANNOTATION);
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        match (held, gates(&p), node) {
            (true, g, None) if g.is_empty() => Ok(()),
            (held, g, node) => Err(format!("window {held}, gates {g:?}, node {node:?}")),
        }
    })
    .await;
}

/// Whether `name` is still gated by the operator and holds no window.
async fn refused(pods: &Api<Pod>, name: &str) -> bool {
    let p = pods.get(name).await.expect("the pod");
    !p.annotations().contains_key(REGION_ANNOTATION)
        && gates(&p).iter().any(|g| g == REGION_SCHEDULING_GATE)
}

/// An Event of `reason` about pod `namespace/name`.
async fn event_about(client: &Client, namespace: &str, name: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    eventually(
        &format!("{reason} Event about {namespace}/{name}"),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await
}

/// A well-behaved tenant's gated pod gets its window and runs: seconds it took.
async fn served(good: &Api<Pod>, name: &str, image: &str) -> f64 {
    let started = Instant::now();
    create_pod(
        good,
        fabric_pod(name, WORKLOAD_NAMESPACE, image, None, false),
    )
    .await;
    assigned_window(good, name).await;
    running(good, name).await;
    started.elapsed().as_secs_f64()
}

#[test]
fn a_tenant_cannot_hold_the_fabrics_windows_with_pods_that_never_run() {
    const TEST: &str = "a_tenant_cannot_hold_the_fabrics_windows_with_pods_that_never_run";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(squat(&ctx.client, &local));
}

async fn squat(client: &Client, local: &LocalCluster) {
    let image = &local.busybox_image;
    let as_tenant = tenant_of(client, &[OUTSIDER]).await;
    crate::apply_value(client, &fabric())
        .await
        .expect("apply the tenancy fabric");
    let good: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    // The first window of a new fabric may wait for the operator's takeover hold (30 s after it
    // started): the baseline is the second. (The namespace's share is 2 windows.)
    served(&good, "tenancy-warm", image).await;
    let baseline = served(&good, "tenancy-base", image).await;
    for name in ["tenancy-warm", "tenancy-base"] {
        delete_pod(&good, name).await;
    }

    // The attack, with the tenant's rights: the whole space in one pod, then more pods than the
    // namespace's share, all behind a gate of its own; and one pod from a namespace the fabric
    // does not serve.
    let mine: Api<Pod> = Api::namespaced(as_tenant.clone(), TENANT);
    // First a directory of its own, planted under the fabric's name and label: peers it makes
    // up, and a key of its own beside them.
    let planted: Api<ConfigMap> = Api::namespaced(as_tenant.clone(), TENANT);
    let directory = format!("{FABRIC}-regions");
    planted
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": directory, "labels": {FABRIC_LABEL: FABRIC}},
                "data": {"regions.json": "[{\"pod\":\"ghost\",\"id\":0,\"base\":0,\"size\":1048576}]",
                         "peers.json": "[\"10.0.0.66\"]"}
            }))
            .expect("a configmap"),
        )
        .await
        .expect("the tenant plants a directory");
    let image_pod = |name: &str, size: Option<&str>| fabric_pod(name, TENANT, image, size, true);
    create_pod(&mine, image_pod("squat-all", Some("8Mi"))).await;
    // Behind a gate of its own: no window, no space held, while that gate stays.
    let mut behind = image_pod("squat-behind", None);
    behind["spec"]["schedulingGates"] =
        json!([{"name": OWN_GATE}, {"name": REGION_SCHEDULING_GATE}]);
    create_pod(&mine, behind).await;
    // Pods no node will take: they get windows, and never run.
    for name in ["squat-0", "squat-1"] {
        create_pod(&mine, image_pod(name, None)).await;
        window_unbound(&mine, name).await;
    }
    // The operator replaced the planted directory with its own: one key, its windows only.
    eventually("the planted directory replaced", || async {
        let cm = planted.get(&directory).await.map_err(|e| e.to_string())?;
        let data = cm.data.unwrap_or_default();
        let text = data.get("regions.json").cloned().unwrap_or_default();
        let ok = data.len() == 1
            && text.contains("squat-0")
            && text.contains("squat-1")
            && !text.contains("ghost");
        ok.then_some(()).ok_or(format!("{data:?}"))
    })
    .await;
    create_pod(&mine, image_pod("squat-2", None)).await;
    let outside: Api<Pod> = Api::namespaced(as_tenant.clone(), OUTSIDER);
    create_pod(
        &outside,
        fabric_pod("outsider", OUTSIDER, image, None, false),
    )
    .await;

    // A well-behaved tenant is served meanwhile: a gated pod and an rdma/hca pod.
    let during = served(&good, "tenancy-good", image).await;
    create_pod(&good, hca_pod("tenancy-good-hca", image, 1)).await;
    running(&good, "tenancy-good-hca").await;

    // One pod over the share, one pod over the whole space, one pod from elsewhere: no window,
    // each told why.
    event_about(client, OUTSIDER, "outsider", reason::NO_FABRIC_SELECTS_POD).await;
    assert!(refused(&outside, "outsider").await);
    let fabrics: Api<RoceFabric> = Api::all(client.clone());
    let degraded = eventually("the fabric names the refused pods", || async {
        let f = fabrics.get(FABRIC).await.map_err(|e| e.to_string())?;
        let message = f
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let all = format!("{TENANT}/squat-all");
        let over = format!("{TENANT}/squat-2");
        (message.contains(&all) && message.contains(&over))
            .then_some(message.clone())
            .ok_or(message)
    })
    .await;
    assert!(
        degraded.contains("one pod may take") && degraded.contains("of its limit 2"),
        "{degraded}"
    );
    assert!(refused(&mine, "squat-all").await && refused(&mine, "squat-2").await);
    assert!(
        refused(&mine, "squat-behind").await,
        "a pod behind its own gate holds nothing"
    );
    for name in ["squat-all", "squat-2", "squat-behind"] {
        delete_pod(&mine, name).await;
    }

    // The pods that never run lose their windows after reclaimUnboundAfterSeconds, and are told.
    let reclaim_wait = Instant::now();
    for name in ["squat-0", "squat-1"] {
        eventually(&format!("{name}: window reclaimed"), || async {
            let p = mine.get(name).await.map_err(|e| e.to_string())?;
            let a = p.annotations();
            match (a.get(REGION_ANNOTATION), a.get(REGION_RECLAIMED_ANNOTATION)) {
                (None, Some(why)) => Ok(why.clone()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        event_about(client, TENANT, name, reason::REGION_RECLAIMED).await;
    }
    let reclaimed_after = reclaim_wait.elapsed().as_secs_f64();

    // The tenant cannot undo the reclaim: not through the pod, not through pods/status (given
    // the right to write it, which `edit` does not give), and cannot write a window itself.
    let undo = json!({"metadata": {"annotations": {REGION_RECLAIMED_ANNOTATION: null}}});
    let refused_undo = mine
        .patch("squat-0", &PatchParams::default(), &Patch::Merge(&undo))
        .await
        .expect_err("the tenant removed the reclaim mark");
    assert!(
        refused_undo.to_string().contains("region-reclaimed"),
        "{refused_undo}"
    );
    let forge = json!({"metadata": {"annotations": {REGION_ANNOTATION:
        format!("{{\"fabric\":\"{FABRIC}\",\"id\":0,\"base\":0,\"size\":1048576}}")}}});
    mine.patch("squat-1", &PatchParams::default(), &Patch::Merge(&forge))
        .await
        .expect_err("the tenant wrote a window");
    grant_pod_status(client).await;
    let through_status = eventually("the tenant may write pods/status", || async {
        match mine
            .patch_status("squat-0", &PatchParams::default(), &Patch::Merge(&undo))
            .await
        {
            Err(kube::Error::Api(e))
                if e.code == 403 && e.reason == "Forbidden" && !e.message.contains("region") =>
            {
                Err(format!("not yet authorized: {}", e.message))
            }
            other => Ok(other.map(|_| ()).map_err(|e| e.to_string())),
        }
    })
    .await;
    let still = mine.get("squat-0").await.expect("squat-0");
    assert!(
        still
            .annotations()
            .contains_key(REGION_RECLAIMED_ANNOTATION)
            && !still.annotations().contains_key(REGION_ANNOTATION),
        "pods/status undid the reclaim ({through_status:?}): {:?}",
        still.annotations()
    );
    println!("pods/status as the tenant: {through_status:?}");

    // The space comes back after the grace period, and the reclaimed pods never get another.
    tokio::time::sleep(GRACE + Duration::from_secs(5)).await;
    for name in ["squat-0", "squat-1"] {
        let p = mine.get(name).await.expect("the pod");
        assert!(
            !p.annotations().contains_key(REGION_ANNOTATION),
            "{name} got a window again"
        );
    }
    let f = fabrics.get(FABRIC).await.expect("the fabric");
    let allocated = f.status.as_ref().map(|s| s.regions.allocated);
    assert_eq!(allocated, Some(1), "only the good tenant's window is held");
    let after = served(&good, "tenancy-good-2", image).await;

    println!(
        "FIGURE a well-behaved pod's window and start: {baseline:.1} s with no attack, \
         {during:.1} s while a tenant squats its share with pods that never run, {after:.1} s \
         after the reclaim; reclaimUnboundAfterSeconds {RECLAIM_SECS}: windows back {reclaimed_after:.1} s \
         after the good pod ran"
    );

    for name in ["tenancy-good", "tenancy-good-2", "tenancy-good-hca"] {
        delete_pod(&good, name).await;
    }
    let _ = fabrics.delete(FABRIC, &Default::default()).await;
    delete_namespace(client, OUTSIDER).await;
    delete_namespace(client, TENANT).await;
}

/// Give the tenant's ServiceAccount the right to write its pods' status (beyond `edit`), as a
/// careless admin might: the admission policy must hold on that door too.
async fn grant_pod_status(client: &Client) {
    let roles: Api<Role> = Api::namespaced(client.clone(), TENANT);
    apply(
        &roles,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pod-status-writer"},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]}]}),
    )
    .await;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), TENANT);
    apply(
        &bindings,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "pod-status-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-status-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT}]}),
    )
    .await;
}

/// Runs everywhere: the fabric this test applies passes the CRD's schema and CEL rules.
#[test]
fn the_tenancy_fabric_is_valid() {
    rocefabric_api::validate::fabric_value(&fabric()).unwrap_or_else(|e| panic!("{e}"));
}
