//! A gated fabric pod gets its window: annotation written, gate removed, scheduled, the window
//! visible inside the container through the downward API, listed in `<fabric>-regions`, and freed
//! when the pod is deleted.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use rocefabric_api::constants::{
    FABRIC_LABEL, REGION_ANNOTATION, REGION_DIRECTORY_SUFFIX, REGION_SCHEDULING_GATE,
};
use rocefabric_formats::directory::{self, DirectoryEntry as Entry};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_formats::region::RegionAssignment;
use rocefabric_operator::apply::gate_removal_patch;
use serde_json::json;

use crate::{
    FABRIC, REGION_SIZE, WORKLOAD_NAMESPACE, cluster, create_pod, eventually, logs_with, running,
};

/// The image of short-lived test pods: the local cluster's busybox, else `ROCEFABRIC_E2E_POD_IMAGE`.
pub fn pod_image(local: Option<&rocefabric_e2e::cluster::LocalCluster>) -> String {
    match local {
        Some(local) => local.busybox_image.clone(),
        None => std::env::var("ROCEFABRIC_E2E_POD_IMAGE").unwrap_or_else(|_| "busybox:1.36".into()),
    }
}

/// A gated fabric pod whose container prints its window file, then sleeps.
pub fn gated_pod(name: &str, image: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE, "labels": {FABRIC_LABEL: FABRIC}},
        "spec": {
            "schedulingGates": [{"name": REGION_SCHEDULING_GATE}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo window=$(cat /etc/rocefabric/region); exec sleep 3600"],
                "volumeMounts": [{"name": "region", "mountPath": "/etc/rocefabric"}]
            }],
            "volumes": [{"name": "region", "downwardAPI": {"items": [{
                "path": "region",
                "fieldRef": {"fieldPath": format!("metadata.annotations['{REGION_ANNOTATION}']")}
            }]}}]
        }
    })
}

/// The pod's window once the annotation is written and the gate removed.
pub async fn assigned_window(pods: &Api<Pod>, name: &str) -> (String, RegionAssignment) {
    eventually(
        &format!("{name}: region annotation written and gate removed"),
        || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            let annotation = p.annotations().get(REGION_ANNOTATION).cloned();
            let gated = p
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| !g.is_empty());
            match annotation {
                Some(text) if !gated => {
                    let region = RegionAssignment::parse(&text).map_err(|e| e.to_string())?;
                    Ok((text, region))
                }
                other => Err(format!("annotation {other:?}, gated {gated}")),
            }
        },
    )
    .await
}

/// The entries of the namespace's directory (empty when the ConfigMap is absent).
pub async fn directory_entries(configmaps: &Api<ConfigMap>) -> Result<Vec<Entry>, String> {
    let name = format!("{FABRIC}{REGION_DIRECTORY_SUFFIX}");
    let Some(cm) = configmaps.get_opt(&name).await.map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(DIRECTORY_KEY))
        .cloned()
        .unwrap_or_default();
    directory::parse(&text).map_err(|e| format!("not a directory: {e}: {text}"))
}

#[test]
fn gated_pod_gets_its_window_in_the_container_and_the_directory() {
    const TEST: &str = "gated_pod_gets_its_window_in_the_container_and_the_directory";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let image = pod_image(ctx.setup.local.as_ref());
    ctx.rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), WORKLOAD_NAMESPACE);
        let name = "region-probe";
        create_pod(&pods, gated_pod(name, &image)).await;

        // The operator writes the annotation, then removes the gate; the pod is scheduled.
        let (text, region) = assigned_window(&pods, name).await;
        assert_eq!(region.fabric, FABRIC);
        assert_eq!(region.size, REGION_SIZE, "one region of regionSize");
        assert_eq!(region.base % REGION_SIZE, 0, "windows are region-aligned");
        let pod = running(&pods, name).await;
        assert!(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
        );

        // Inside the container, the downward-API file holds exactly the annotation.
        let logs = logs_with(&pods, name, "window=").await;
        assert!(
            logs.lines().any(|l| l == format!("window={text}")),
            "the container sees its window: {logs:?} vs {text:?}"
        );

        // The namespace's directory lists it.
        let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), WORKLOAD_NAMESPACE);
        let entry = eventually("directory entry", || async {
            directory_entries(&configmaps)
                .await?
                .into_iter()
                .find(|e| e.pod == name)
                .ok_or(format!("{name} not listed"))
        })
        .await;
        assert_eq!(
            (entry.id, entry.base, entry.size),
            (region.id, region.base, region.size)
        );
        assert_eq!(
            entry.uid, pod.metadata.uid,
            "the directory names the owner pod's uid"
        );

        // Beside it, the namespace's fabric key (what the pods' data plane proves membership
        // with): immutable, owned by the fabric, 32 bytes and the namespace.
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), WORKLOAD_NAMESPACE);
        let key = eventually("fabric key secret", || async {
            secrets
                .get_opt(&format!("{FABRIC}-key"))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no fabric key yet".to_string())
        })
        .await;
        assert_eq!(key.immutable, Some(true));
        let data = key.data.clone().unwrap_or_default();
        assert_eq!(data.get("key").map(|k| k.0.len()), Some(32));
        assert_eq!(
            data.get("namespace").map(|n| n.0.as_slice()),
            Some(WORKLOAD_NAMESPACE.as_bytes())
        );
        let owners = key.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(
            owners.first().map(|o| o.kind.as_str()),
            Some("RoceFabric"),
            "{owners:?}"
        );

        // While it holds the window, its fabric label stays as it is (the operator may watch
        // only labelled pods): removing or changing it is refused, other labels are not.
        let params = kube::api::PatchParams {
            dry_run: true,
            ..Default::default()
        };
        for (what, patch) in [
            (
                "removed",
                json!({"metadata": {"labels": {FABRIC_LABEL: null}}}),
            ),
            (
                "changed",
                json!({"metadata": {"labels": {FABRIC_LABEL: "other"}}}),
            ),
        ] {
            let refused = pods
                .patch(name, &params, &kube::api::Patch::Merge(&patch))
                .await
                .expect_err("the fabric label of a pod holding a window is kept");
            assert!(
                refused
                    .to_string()
                    .contains("keeps its rocefabric.io/fabric label"),
                "label {what}: {refused}"
            );
        }
        let other = json!({"metadata": {"labels": {"team": "a"}}});
        pods.patch(name, &params, &kube::api::Patch::Merge(&other))
            .await
            .expect("another label may change");

        // Deleting the pod frees it: the directory drops it.
        crate::delete_pod(&pods, name).await;
        eventually("directory entry removed", || async {
            let entries = directory_entries(&configmaps).await?;
            if entries.iter().all(|e| e.pod != name) {
                Ok(())
            } else {
                Err(format!("{entries:?}"))
            }
        })
        .await;
    });
}

/// A fabric with a single region slot: a deleted pod's window is not handed to the next pod before
/// the grace period (30 s) has passed since it terminated, and is handed over after it.
#[test]
fn a_freed_window_is_reused_only_after_the_grace_period() {
    const TEST: &str = "a_freed_window_is_reused_only_after_the_grace_period";
    const GRACE_FABRIC: &str = "e2e-grace";
    const GRACE: std::time::Duration = std::time::Duration::from_secs(30);
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let image = pod_image(ctx.setup.local.as_ref());
    let pod = |name: &str| {
        let mut p = gated_pod(name, &image);
        p["metadata"]["labels"][FABRIC_LABEL] = json!(GRACE_FABRIC);
        p
    };
    ctx.rt.block_on(async {
        let client = &ctx.client;
        crate::apply_value(
            client,
            &json!({
                "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
                "metadata": {"name": GRACE_FABRIC},
                "spec": {
                    // Shared memory only: it selects no node.
                    "nodeSelector": {"matchLabels": {"rocefabric.io/e2e-grace": "none"}},
                    "sharedMemory": {
                        "regionSize": "1Mi", "maxRegions": 1,
                        "podSelector": {"matchLabels": {FABRIC_LABEL: GRACE_FABRIC}}
                    }
                }
            }),
        )
        .await
        .expect("apply the one-slot fabric");
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        for name in ["grace-a", "grace-b"] {
            crate::delete_pod(&pods, name).await;
        }
        create_pod(&pods, pod("grace-a")).await;
        let (_, first) = assigned_window(&pods, "grace-a").await;
        assert_eq!((first.fabric.as_str(), first.id), (GRACE_FABRIC, 0));

        // Measured from before the delete, so the operator's grace (from when it saw the pod
        // end) can only be shorter than `freed.elapsed()` if it is wrong.
        let freed = tokio::time::Instant::now();
        crate::delete_pod(&pods, "grace-a").await;
        create_pod(&pods, pod("grace-b")).await;
        // Within the grace period the only slot stays out of use: grace-b waits, gated.
        tokio::time::sleep(GRACE / 2).await;
        let waiting = pods.get("grace-b").await.expect("grace-b");
        let gated = waiting
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty());
        assert!(
            gated && !waiting.annotations().contains_key(REGION_ANNOTATION),
            "grace-b got the freed window within the grace period: {:?}",
            waiting.annotations()
        );
        // After it, grace-b gets the same window.
        let (_, second) = assigned_window(&pods, "grace-b").await;
        assert!(
            freed.elapsed() >= GRACE,
            "reused after {:?}, before the grace period",
            freed.elapsed()
        );
        assert_eq!(
            (second.id, second.base, second.size),
            (first.id, first.base, first.size)
        );
        crate::delete_pod(&pods, "grace-b").await;
        let fabrics: Api<rocefabric_api::RoceFabric> = Api::all(client.clone());
        let _ = fabrics
            .delete(GRACE_FABRIC, &kube::api::DeleteParams::default())
            .await;
    });
}

/// With `operator.watchOnlyFabricPods`, the operator lists and watches only pods labelled
/// `rocefabric.io/fabric` (the API server filters them) and still gives a gated fabric pod its
/// window.
#[test]
fn an_operator_watching_only_fabric_pods_still_assigns_windows() {
    const TEST: &str = "an_operator_watching_only_fabric_pods_still_assigns_windows";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let local = ctx.setup.local.clone();
    let image = pod_image(local.as_ref());
    crate::install_chart(
        local.as_ref(),
        &json!({"operator": {"watchOnlyFabricPods": true}}),
    )
    .expect("helm upgrade with watchOnlyFabricPods");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        rolled_out(client, Some("--pod-label-selector=rocefabric.io/fabric")).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let name = "region-filtered";
        create_pod(&pods, gated_pod(name, &image)).await;
        let (_, region) = assigned_window(&pods, name).await;
        assert_eq!(region.fabric, FABRIC);
        crate::delete_pod(&pods, name).await;
    });
    crate::install_chart(local.as_ref(), &serde_json::Value::Null).expect("helm upgrade back");
    ctx.rt.block_on(rolled_out(&ctx.client, None));
}

/// The operator Deployment has rolled out, its container's args holding `flag` (or no pod label
/// selector at all).
async fn rolled_out(client: &kube::Client, flag: Option<&str>) {
    use k8s_openapi::api::apps::v1::Deployment;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), crate::NAMESPACE);
    let name = format!("{}-operator", crate::RELEASE);
    eventually("operator Deployment rolled out", || async {
        let d = deployments.get(&name).await.map_err(|e| e.to_string())?;
        let args = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        let has_flag = match flag {
            Some(f) => args.iter().any(|a| a == f),
            None => !args.iter().any(|a| a.starts_with("--pod-label-selector")),
        };
        let s = d.status.clone().unwrap_or_default();
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let done = has_flag
            && s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(replicas)
            && s.available_replicas == Some(replicas)
            && s.replicas == Some(replicas);
        if done {
            Ok(())
        } else {
            Err(format!("args {args:?}, status {s:?}"))
        }
    })
    .await;
}

/// The operator's gate removal is bound to the pod it read: the API server refuses the patch
/// planned for a pod that was deleted and created again under the same name, and the new pod
/// keeps its gate (it has no window yet).
#[test]
fn a_gate_removal_planned_for_one_pod_never_lands_on_its_successor_of_the_same_name() {
    const TEST: &str =
        "a_gate_removal_planned_for_one_pod_never_lands_on_its_successor_of_the_same_name";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), WORKLOAD_NAMESPACE);
        // No fabric label: the operator leaves this pod's gate alone, so only the test patches it.
        let mut pod = gated_pod("gate-successor", "pause");
        pod["metadata"]["labels"] = json!({});
        let first = create_pod(&pods, pod.clone()).await;
        let planned_for = first.uid().expect("uid");
        let successor = create_pod(&pods, pod).await;
        assert_ne!(successor.uid().as_deref(), Some(planned_for.as_str()));
        let gates = |p: &Pod| -> Vec<String> {
            p.spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .into_iter()
                .flatten()
                .map(|g| g.name.clone())
                .collect()
        };
        let patch = |uid: &str| {
            Patch::<()>::Json(gate_removal_patch(uid, 0).expect("the operator's patch"))
        };
        let refused = pods
            .patch(
                "gate-successor",
                &PatchParams::default(),
                &patch(&planned_for),
            )
            .await
            .expect_err("a removal planned for the old pod");
        assert!(
            matches!(&refused, kube::Error::Api(e) if e.code == 422),
            "the API server refuses the failed test: {refused}"
        );
        let now = pods.get("gate-successor").await.expect("pod");
        assert_eq!(
            gates(&now),
            [REGION_SCHEDULING_GATE],
            "the successor keeps its gate"
        );

        // Planned for the pod as it is, the same patch removes the gate.
        let uid = successor.uid().expect("uid");
        let patched = pods
            .patch("gate-successor", &PatchParams::default(), &patch(&uid))
            .await
            .expect("the removal planned for this pod");
        assert!(gates(&patched).is_empty(), "{:?}", gates(&patched));
        crate::delete_pod(&pods, "gate-successor").await;
    });
}
