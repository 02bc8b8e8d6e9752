//! One device, one owner, with the real kubelet deciding: a GPU that another vendor's device
//! plugin (NVIDIA's `nvidia.com/gpu`) gave a pod never goes to a claim; while the kubelet cannot
//! say what device plugins hold, everything they may hold is withheld; and the driver's reserved
//! request name can never be a claim's.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use rocefabric_dra::devices::{gpu_device_name, hca_device_name};
use rocefabric_dra::prepare::WHOLE_CLAIM_REQUEST;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::model::{Gpu, Health, Inventory};
use rocefabric_node_model::ownership::Partition;
use rocefabric_node_testing::fixed_plugin::{FixedBackend, ForeignPlugin};
use serde_json::{Value, json};

use crate::devices::{Granted, fixture_inventory, wait_allocatable};
use crate::dra::{
    DRIVER, allocated, assert_exactly, claim_pod, create_template, device_names, fabric_hca_names,
    pod_claim, slice_where,
};
use crate::regions::pod_image;
use crate::{
    NAMESPACE, WORKLOAD_NAMESPACE, container_logs_with, create_pod, delete_pod, eventually,
    local_cluster, logs_with, node_daemon_selector, running,
};

/// The daemon's metrics port (`node.devicePlugin.metricsPort`), on the node's network.
const DEVICE_PLUGIN_METRICS: &str = "127.0.0.1:9465";

/// A GPU's PCI bus ID as `nvidia-smi` and NVIDIA's tools write it (`00000000:1B:00.0`).
fn nvidia_bus_id(gpu: &Gpu) -> String {
    let (domain, rest) = gpu.pci_address.split_once(':').expect("a PCI address");
    format!("0000{domain}:{}", rest.to_ascii_uppercase())
}

/// A template of one device of `class` whose `attribute` is `value`.
fn one_device(name: &str, class: &str, attribute: &str, value: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": {
            "deviceClassName": class, "count": 1,
            "selectors": [{"cel": {"expression":
                format!("device.attributes[\"{DRIVER}\"].{attribute} == \"{value}\"")}}]
        }}]}}}
    })
}

/// The value of the daemon's `rocefabric_dra_device_plugin_grants_known` gauge.
async fn grants_known() -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(DEVICE_PLUGIN_METRICS)
        .await
        .map_err(|e| format!("{DEVICE_PLUGIN_METRICS}: {e}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    body.lines()
        .find_map(|l| l.strip_prefix("rocefabric_dra_device_plugin_grants_known "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("no grants_known gauge in the daemon's metrics: {body}"))
}

/// Every device the slice lists, under the suite's config, except what device plugins may hold
/// when their grants are unknown: every GPU and every device our device plugin serves.
fn published_while_grants_unknown(inv: &Inventory) -> BTreeSet<String> {
    let served: BTreeSet<String> = Partition::new(inv, &Config::default())
        .owners()
        .into_keys()
        .collect();
    let fabric_hcas = fabric_hca_names(inv);
    inv.hcas
        .iter()
        .filter(|h| h.health == Health::Healthy && !served.contains(&h.id))
        .map(hca_device_name)
        .filter(|d| !fabric_hcas.contains(d))
        .collect()
}

#[test]
fn dra_a_gpu_another_plugin_gave_a_pod_never_goes_to_a_claim() {
    const TEST: &str = "dra_a_gpu_another_plugin_gave_a_pod_never_goes_to_a_claim";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let node = &local.node_name;
        // NVIDIA's plugin beside ours, as the README's usual setup runs it: every healthy GPU
        // under `nvidia.com/gpu`, named by bus ID.
        let gpus: Vec<&Gpu> = inv
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .collect();
        let ids: Vec<String> = gpus.iter().map(|g| nvidia_bus_id(g)).collect();
        let plugin = {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let backend = FixedBackend::new("nvidia.com/gpu", &ids, None, "NVIDIA_VISIBLE_DEVICES");
            ForeignPlugin::start(&local.plugin_dir, "nvidia-gpu.sock", backend)
        }
        .await
        .expect("NVIDIA's stand-in registered with the kubelet");
        wait_allocatable(client, node, "nvidia.com/gpu", ids.len() as i64).await;

        // A pod gets one GPU from it.
        create_pod(
            &pods,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "nvidia-gpu-pod", "namespace": WORKLOAD_NAMESPACE},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "probe", "image": &image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "env; echo done; exec sleep 3600"],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}
                    }]
                }
            }),
        )
        .await;
        running(&pods, "nvidia-gpu-pod").await;
        let logs = logs_with(&pods, "nvidia-gpu-pod", "done").await;
        let given = Granted::parse(&logs)
            .env
            .get("NVIDIA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_else(|| panic!("the stand-in's grant: {logs}"));
        let gpu = gpus
            .iter()
            .find(|g| nvidia_bus_id(g) == given.trim_start_matches('='))
            .unwrap_or_else(|| panic!("{given} names a fixture GPU"));
        let held = gpu_device_name(gpu);

        // The slice withdraws exactly that GPU, and a claim naming it waits.
        let others: BTreeSet<String> = gpus
            .iter()
            .map(|g| gpu_device_name(g))
            .filter(|d| *d != held)
            .collect();
        slice_where(
            client,
            node,
            "the held GPU withdrawn, the others listed",
            |s| {
                let names = device_names(s);
                let listed: BTreeSet<_> = names
                    .iter()
                    .filter(|n| n.starts_with("gpu-"))
                    .cloned()
                    .collect();
                (listed == others)
                    .then_some(())
                    .ok_or(format!("{listed:?}"))
            },
        )
        .await;
        let template = create_template(
            client,
            one_device(
                "held-gpu",
                "gpu.rocefabric.io",
                "pciAddress",
                &gpu.pci_address,
            ),
        )
        .await;
        create_pod(&pods, claim_pod("dra-held-gpu", &image, &template)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let p = pods.get("dra-held-gpu").await.expect("pod");
        assert_eq!(
            p.status.and_then(|s| s.phase).as_deref(),
            Some("Pending"),
            "a claim for the GPU {held} that nvidia-gpu-pod holds must wait"
        );

        // Once the holder is gone, the GPU returns and the claim runs with it.
        delete_pod(&pods, "nvidia-gpu-pod").await;
        running(&pods, "dra-held-gpu").await;
        let logs = logs_with(&pods, "dra-held-gpu", "done").await;
        assert!(
            Granted::parse(&logs)
                .devices
                .contains(&format!("/dev/nvidia{}", gpu.index)),
            "the claim got /dev/nvidia{}: {logs}",
            gpu.index
        );
        delete_pod(&pods, "dra-held-gpu").await;
        plugin.stop().await;
    });
}

#[test]
fn dra_withholds_what_a_device_plugin_may_hold_while_the_kubelet_is_down() {
    const TEST: &str = "dra_withholds_what_a_device_plugin_may_hold_while_the_kubelet_is_down";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let node = &local.node_name;
        eventually("grants known", || async {
            let v = grants_known().await?;
            (v == "1").then_some(()).ok_or(v)
        })
        .await;
        let before = slice_where(client, node, "GPUs published", |s| {
            device_names(s)
                .iter()
                .any(|d| d.starts_with("gpu-"))
                .then_some(())
                .ok_or("no GPU listed".to_string())
        })
        .await;

        // The kubelet stops: its pod resources API cannot say what device plugins hold.
        local.stop("kubelet").expect("stop the kubelet");
        let want = published_while_grants_unknown(&inv);
        let withheld = slice_where(client, node, "only what no device plugin may hold", |s| {
            let names = device_names(s);
            (names == want).then_some(()).ok_or(format!("{names:?}"))
        })
        .await;
        let known = grants_known().await;
        // Bring the kubelet back before asserting, so a failure leaves the cluster whole.
        local.restart("kubelet").expect("restart the kubelet");
        assert_eq!(
            known.as_deref(),
            Ok("0"),
            "the gauge says grants are unknown"
        );
        assert!(
            withheld.spec.pool.generation > before.spec.pool.generation,
            "the withdrawal is a new generation"
        );
        let daemons: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let daemon = daemons
            .list(&kube::api::ListParams::default().labels(&node_daemon_selector()))
            .await
            .expect("daemon pods")
            .items
            .into_iter()
            .next()
            .expect("a daemon pod");
        // Once the kubelet serves logs again.
        container_logs_with(
            &daemons,
            &daemon.name_any(),
            Some("device-plugin"),
            "device plugin grants unknown: withholding every device",
        )
        .await;

        // Grants known again: every device is back.
        let all = before
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect::<BTreeSet<_>>();
        slice_where(client, node, "everything published again", |s| {
            let names = device_names(s);
            (names == all).then_some(()).ok_or(format!("{names:?}"))
        })
        .await;
        eventually("grants known again", || async {
            let v = grants_known().await?;
            (v == "1").then_some(()).ok_or(v)
        })
        .await;
    });
}

#[test]
fn dra_the_whole_claim_request_name_can_never_be_a_claims() {
    const TEST: &str = "dra_the_whole_claim_request_name_can_never_be_a_claims";
    let Some((ctx, _local)) = local_cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let api: Api<ResourceClaimTemplate> =
            Api::namespaced(ctx.client.clone(), WORKLOAD_NAMESPACE);
        let mut template = one_device("reserved-name", "hca.rocefabric.io", "type", "hca");
        template["spec"]["spec"]["devices"]["requests"][0]["name"] = json!(WHOLE_CLAIM_REQUEST);
        let template: ResourceClaimTemplate = serde_json::from_value(template).expect("template");
        let err = api
            .create(&PostParams::default(), &template)
            .await
            .expect_err("the API server refuses a request named like the driver's whole claim");
        let message = err.to_string();
        assert!(
            message.contains("Invalid") && message.contains(WHOLE_CLAIM_REQUEST),
            "a validation error naming the request: {message}"
        );
    });
}

#[test]
fn dra_each_container_gets_the_environment_of_the_requests_it_names() {
    const TEST: &str = "dra_each_container_gets_the_environment_of_the_requests_it_names";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        // One claim, a GPU request and an HCA request; one container names each, one the claim.
        let template = create_template(
            client,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu-and-hca", "namespace": WORKLOAD_NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.rocefabric.io", "count": 1}},
                    {"name": "hca", "exactly": {"deviceClassName": "hca.rocefabric.io", "count": 1}}
                ]}}}
            }),
        )
        .await;
        let mut pod = claim_pod("dra-per-container", &image, &template);
        let probe = pod["spec"]["containers"][0].clone();
        let container = |name: &str, claim: Value| {
            let mut c = probe.clone();
            c["name"] = json!(name);
            c["resources"]["claims"] = json!([claim]);
            c
        };
        pod["spec"]["containers"] = json!([
            container("gpu-only", json!({"name": "devices", "request": "gpu"})),
            container("hca-only", json!({"name": "devices", "request": "hca"})),
            container("whole", json!({"name": "devices"})),
        ]);
        create_pod(&pods, pod).await;
        running(&pods, "dra-per-container").await;
        let claim = pod_claim(client, "dra-per-container").await;
        let picked = allocated(&claim);
        for (container, requests) in [
            ("gpu-only", &["gpu"][..]),
            ("hca-only", &["hca"]),
            ("whole", &["gpu", "hca"]),
        ] {
            let devices: BTreeSet<String> = requests.iter().map(|r| picked[*r].clone()).collect();
            let logs =
                container_logs_with(&pods, "dra-per-container", Some(container), "done").await;
            assert_exactly(&inv, &devices, &Granted::parse(&logs), &logs);
        }
        delete_pod(&pods, "dra-per-container").await;
    });
}

/// A namespace whose claims may ask for admin access (the API server allows it only there).
const ADMIN_NAMESPACE: &str = "rocefabric-e2e-admin";

#[test]
fn dra_an_admin_access_claim_neither_blocks_nor_is_blocked_by_the_workloads() {
    const TEST: &str = "dra_an_admin_access_claim_neither_blocks_nor_is_blocked_by_the_workloads";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": ADMIN_NAMESPACE, "labels": {"resource.kubernetes.io/admin-access": "true"}}});
        let _ = namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(ns).expect("namespace"),
            )
            .await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let admin_pods: Api<Pod> = Api::namespaced(client.clone(), ADMIN_NAMESPACE);
        let fabric_hcas = fabric_hca_names(&inv);
        let hca = inv
            .hcas
            .iter()
            .find(|h| h.health == Health::Healthy && !fabric_hcas.contains(&hca_device_name(h)))
            .expect("a free HCA");
        let workload = one_device("one-hca", "hca.rocefabric.io", "rdmaDevice", &hca.name);
        let mut monitor = one_device("monitor-hca", "hca.rocefabric.io", "rdmaDevice", &hca.name);
        monitor["metadata"]["namespace"] = json!(ADMIN_NAMESPACE);
        monitor["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = json!(true);
        let monitor_pod = |template: &str| {
            let mut p = claim_pod("dra-monitor", &image, template);
            p["metadata"]["namespace"] = json!(ADMIN_NAMESPACE);
            p
        };

        // The workload first, then the monitor on the same HCA: both run.
        let template = create_template(client, workload).await;
        create_pod(&pods, claim_pod("dra-workload", &image, &template)).await;
        running(&pods, "dra-workload").await;
        let admin_templates: Api<ResourceClaimTemplate> =
            Api::namespaced(client.clone(), ADMIN_NAMESPACE);
        let monitor: ResourceClaimTemplate = serde_json::from_value(monitor).expect("template");
        let _ = admin_templates
            .delete("monitor-hca", &Default::default())
            .await;
        admin_templates
            .create(&PostParams::default(), &monitor)
            .await
            .expect("an admin-access template in the admin namespace");
        create_pod(&admin_pods, monitor_pod("monitor-hca")).await;
        running(&admin_pods, "dra-monitor").await;
        let logs = logs_with(&admin_pods, "dra-monitor", "done").await;
        let uverbs = format!("/dev/infiniband/{}", hca.uverbs.as_deref().expect("uverbs"));
        assert!(
            Granted::parse(&logs).devices.contains(&uverbs),
            "the monitor sees {uverbs}: {logs}"
        );

        // The monitor going away leaves the workload's claim prepared.
        let workload_claim = pod_claim(client, "dra-workload").await;
        let uid = workload_claim.uid().expect("uid");
        delete_pod(&admin_pods, "dra-monitor").await;
        assert!(
            crate::dra::checkpoint_claims(&local).contains_key(&uid),
            "the workload's claim is still prepared"
        );

        // The monitor first, then a new workload: both run.
        delete_pod(&pods, "dra-workload").await;
        create_pod(&admin_pods, monitor_pod("monitor-hca")).await;
        running(&admin_pods, "dra-monitor").await;
        create_pod(&pods, claim_pod("dra-workload", &image, &template)).await;
        running(&pods, "dra-workload").await;
        delete_pod(&pods, "dra-workload").await;
        delete_pod(&admin_pods, "dra-monitor").await;
    });
}
