//! DRA's ledger on the real cluster: a daemon killed in the middle of a prepare recovers from its
//! checkpoint, and DRA and the device plugin share one ledger, so no HCA goes to two pods.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use rocefabric_dra::checkpoint;
use rocefabric_dra::devices::hca_device_name;
use rocefabric_node_model::model::Health;
use serde_json::{Value, json};

use crate::devices::{Granted, fixture_inventory, wait_allocatable};
use crate::dra::{
    DRIVER, allocated, assert_exactly, cdi_spec_path, checkpoint_claims, claim_pod,
    create_template, device_names, example, fabric_hca_names, pod_claim, slice_where,
};
use crate::regions::pod_image;
use crate::{
    NAMESPACE, WORKLOAD_NAMESPACE, create_pod, delete_pod, eventually, install_chart,
    local_cluster, logs_with, node_daemon_selector, release_ready, running,
};

#[test]
fn dra_a_daemon_killed_mid_prepare_recovers() {
    const TEST: &str = "dra_a_daemon_killed_mid_prepare_recovers";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    // Each prepare pauses between its checkpoint record and its CDI spec.
    install_chart(
        Some(&local),
        &json!({"node": {"devicePlugin": {"extraArgs": ["--dra-pause-after-checkpoint=15s"]}}}),
    )
    .expect("install with the pause");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        release_ready(client).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let template = create_template(
            client,
            example("gpu-hca-pairs.yaml", "ResourceClaimTemplate"),
        )
        .await;
        // A pair off the fabric's NICs is always available.
        create_pod(&pods, claim_pod("dra-restart", &image, &template)).await;
        let claim = pod_claim(client, "dra-restart").await;
        let uid = claim.uid().expect("uid");
        eventually("the prepare recorded, not finished", || async {
            match checkpoint_claims(&local).get(&uid).map(|r| r.state) {
                Some(checkpoint::ClaimState::Preparing) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert!(!cdi_spec_path(&local, &uid).exists());
        // Kill the daemon there (no grace: as a crash or an OOM kill would).
        let daemons: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        for p in daemons
            .list(&kube::api::ListParams::default().labels(&node_daemon_selector()))
            .await
            .expect("daemon pods")
        {
            let _ = daemons
                .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                .await;
        }
        // The new daemon finds the record and the kubelet's retry completes the prepare.
        running(&pods, "dra-restart").await;
        let records = checkpoint_claims(&local);
        assert_eq!(
            records.get(&uid).map(|r| r.state),
            Some(checkpoint::ClaimState::Prepared)
        );
        assert_eq!(
            records.len(),
            1,
            "one record, no double prepare: {records:?}"
        );
        let logs = logs_with(&pods, "dra-restart", "done").await;
        let devices: BTreeSet<String> = allocated(&claim).values().cloned().collect();
        assert_exactly(&inv, &devices, &Granted::parse(&logs), &logs);
        delete_pod(&pods, "dra-restart").await;
        eventually("unprepared", || async {
            (!checkpoint_claims(&local).contains_key(&uid))
                .then_some(())
                .ok_or("record still there".to_string())
        })
        .await;
    });
    install_chart(Some(&local), &Value::Null).expect("install without the pause");
    ctx.rt.block_on(release_ready(&ctx.client));
}

#[test]
fn dra_and_the_device_plugin_never_hand_one_hca_to_two_pods() {
    const TEST: &str = "dra_and_the_device_plugin_never_hand_one_hca_to_two_pods";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let fabric_hcas = fabric_hca_names(&inv);
        let free: Vec<_> = inv
            .hcas
            .iter()
            .filter(|h| h.health == Health::Healthy && !fabric_hcas.contains(&hca_device_name(h)))
            .collect();
        let (claimed, other) = (free[0], free[1]);
        // DRA takes one HCA by name.
        let one_hca = |name: &str, rdma: &str| {
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [{"name": "hca", "exactly": {
                    "deviceClassName": "hca.rocefabric.io", "count": 1,
                    "selectors": [{"cel": {"expression":
                        format!("device.attributes[\"{DRIVER}\"].rdmaDevice == \"{rdma}\"")}}]
                }}]}}}
            })
        };
        let template = create_template(client, one_hca("one-hca", &claimed.name)).await;
        create_pod(&pods, claim_pod("dra-one-hca", &image, &template)).await;
        running(&pods, "dra-one-hca").await;

        // The device plugin now lists it Unhealthy: a pod asking for every other healthy HCA
        // gets them, and none of them is the claimed one.
        let want_allocatable = (free.len() - 1) as i64;
        wait_allocatable(client, &local.node_name, "rdma/hca", want_allocatable).await;
        let dp_pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dp-all-hcas", "namespace": WORKLOAD_NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "probe", "image": &image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "env; echo done; exec sleep 3600"],
                    "resources": {"limits": {"rdma/hca": want_allocatable.to_string()}}
                }]
            }
        });
        create_pod(&pods, dp_pod).await;
        running(&pods, "dp-all-hcas").await;
        let logs = logs_with(&pods, "dp-all-hcas", "done").await;
        let granted: BTreeSet<String> = Granted::parse(&logs)
            .env
            .get("PCIDEVICE_RDMA_HCA")
            .map(|v| v.split(',').map(String::from).collect())
            .unwrap_or_default();
        // Every free HCA but the claimed one, by PCI address.
        let want: BTreeSet<String> = free
            .iter()
            .filter(|h| h.id != claimed.id)
            .map(|h| h.pci_address.clone().expect("pci"))
            .collect();
        assert_eq!(granted, want, "{logs}");

        // The other way round: an HCA the device plugin holds is withdrawn from the slice, so a
        // claim naming it waits.
        slice_where(
            client,
            &local.node_name,
            "the granted HCAs withdrawn",
            |s| {
                let names = device_names(s);
                (!names.contains(&hca_device_name(other)))
                    .then_some(())
                    .ok_or(format!("{names:?}"))
            },
        )
        .await;
        let template = create_template(client, one_hca("taken-hca", &other.name)).await;
        create_pod(&pods, claim_pod("dra-taken-hca", &image, &template)).await;
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let p = pods.get("dra-taken-hca").await.expect("pod");
        assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));

        // Once the device plugin's pod is gone, the claim gets the HCA.
        delete_pod(&pods, "dp-all-hcas").await;
        running(&pods, "dra-taken-hca").await;
        for name in ["dra-taken-hca", "dra-one-hca"] {
            delete_pod(&pods, name).await;
        }
    });
}
