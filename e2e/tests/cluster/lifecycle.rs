//! The release's life: `helm upgrade` with a changed value rolls the DaemonSet and upgrades the
//! CRDs in place (same object, the chart's schema restored); `helm uninstall` keeps the CRDs and the
//! fabrics and leaves nothing else of the release; installing again brings everything back.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rocefabric_api::RoceFabric;
use serde_json::{Value, json};

use crate::{
    FABRIC, NAMESPACE, RELEASE, cluster, crd_file, eventually, install_chart, kubectl,
    node_daemon_selector, release_ready, uninstall_chart,
};

const CRDS: [&str; 2] = ["rocefabrics.rocefabric.io", "rocenodes.rocefabric.io"];

fn generated_printer_columns(name: &str) -> Value {
    let text = std::fs::read_to_string(crd_file(name)).expect("generated CRD");
    let crd: Value = yaml_serde::from_str(&text).expect("YAML");
    crd["spec"]["versions"][0]["additionalPrinterColumns"].clone()
}

async fn live_printer_columns(client: &Client, name: &str) -> Value {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(name).await.expect("CRD");
    let v = serde_json::to_value(crd).expect("JSON");
    v["spec"]["versions"][0]["additionalPrinterColumns"].clone()
}

async fn daemon_log_level(client: &Client) -> Option<String> {
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let d = ds.get(&format!("{RELEASE}-node")).await.ok()?;
    let env = d.spec?.template.spec?.containers.first()?.env.clone()?;
    env.into_iter()
        .find(|e| e.name == "RUST_LOG")
        .and_then(|e| e.value)
}

async fn daemon_pod_uids(pods: &Api<Pod>) -> Vec<String> {
    let list = pods
        .list(&ListParams::default().labels(&node_daemon_selector()))
        .await
        .expect("daemon pods");
    list.items.iter().filter_map(|p| p.uid()).collect()
}

#[test]
fn helm_upgrade_rolls_the_daemonset_and_upgrades_the_crds() {
    const TEST: &str = "helm_upgrade_rolls_the_daemonset_and_upgrades_the_crds";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let local = ctx.setup.local.clone();
    ctx.rt.block_on(async {
        let client = &ctx.client;
        release_ready(client).await;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let uid_before = crds.get(CRDS[0]).await.expect("CRD").uid();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let before = daemon_pod_uids(&pods).await;
        // An older chart's CRD, as Helm itself applied it (field manager `helm`): no printer
        // columns. The upgrade must bring it to this chart's version.
        let mut older = serde_json::to_value(crds.get(CRDS[0]).await.expect("CRD")).expect("JSON");
        older["metadata"] = json!({"name": CRDS[0]});
        older.as_object_mut().expect("object").remove("status");
        older["spec"]["versions"][0]
            .as_object_mut()
            .expect("version")
            .remove("additionalPrinterColumns");
        crds.patch(
            CRDS[0],
            &PatchParams::apply("helm").force(),
            &Patch::Apply(&older),
        )
        .await
        .expect("apply an older CRD as helm");
        assert_eq!(
            live_printer_columns(client, CRDS[0]).await,
            Value::Null,
            "columns gone before the upgrade"
        );

        install_chart(local.as_ref(), &json!({"node": {"logLevel": "debug"}}))
            .expect("helm upgrade");
        release_ready(client).await;
        assert_eq!(daemon_log_level(client).await.as_deref(), Some("debug"));
        let after = daemon_pod_uids(&pods).await;
        assert!(
            after.iter().all(|uid| !before.contains(uid)),
            "every daemon pod was replaced: before {before:?}, after {after:?}"
        );
        let crd = crds.get(CRDS[0]).await.expect("CRD");
        assert_eq!(
            crd.uid(),
            uid_before,
            "the CRD is upgraded in place, never recreated"
        );
        assert_eq!(
            live_printer_columns(client, CRDS[0]).await,
            generated_printer_columns(CRDS[0]),
            "helm upgrade brings the CRD to the chart's version"
        );

        // Back to the suite's values.
        install_chart(local.as_ref(), &Value::Null).expect("helm upgrade back");
        release_ready(client).await;
        assert_eq!(daemon_log_level(client).await.as_deref(), Some("info"));
    });
}

#[test]
fn helm_uninstall_keeps_crds_and_fabrics_and_nothing_else() {
    const TEST: &str = "helm_uninstall_keeps_crds_and_fabrics_and_nothing_else";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let local = ctx.setup.local.clone();
    uninstall_chart(local.as_ref()).expect("helm uninstall");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in CRDS {
            crds.get(name)
                .await
                .unwrap_or_else(|e| panic!("CRD {name} kept: {e}"));
        }
        let fabrics: Api<RoceFabric> = Api::all(client.clone());
        fabrics.get(FABRIC).await.expect("the fabric is kept");
        // Nothing else of the release, in any namespace or at cluster scope.
        let selector = format!("app.kubernetes.io/instance={RELEASE}");
        eventually("no object of the release left", || async {
            // Every kind the chart renders (ServiceMonitors need their CRD, absent here).
            let kinds = "deployments,daemonsets,pods,services,serviceaccounts,configmaps,roles,\
                rolebindings,clusterroles,clusterrolebindings,networkpolicies,\
                validatingadmissionpolicies,validatingadmissionpolicybindings";
            let out = kubectl(
                local.as_ref(),
                &["get", kinds, "-A", "-l", &selector, "-o", "name"],
            )?;
            let left: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(left.join(", "))
            }
        })
        .await;
    });
    // Installed again, the suite's other tests find it as before.
    install_chart(local.as_ref(), &Value::Null).expect("helm install again");
    ctx.rt.block_on(release_ready(&ctx.client));
}
