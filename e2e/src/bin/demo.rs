//! The newcomer's first run: the node daemon against the bundled DGX H100 fixture with an
//! in-process kubelet emulator, then the operator's `plan` over the example cluster snapshot.
//! Needs no cluster, no RDMA hardware and no privileges.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use rocefabric_api::constants::HCA_RESOURCE;
use rocefabric_device_plugin::serve::{self, ServeOptions};
use rocefabric_device_plugin::{cli::discover, fabric_source};
use rocefabric_node_model::allocation::ResourceKind;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_testing::fixtures;
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;
use rocefabric_operator::cli::plan::{self as operator_plan, OutputFormat, PlanArgs};

const WAIT: Duration = Duration::from_secs(20);

fn section(title: &str) {
    println!("\n=== {title} ===\n");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sysfs = fixtures::tempdir().context("cannot create a temp dir for the fixture")?;
    let node = fixtures::FixtureNode::dgx_h100();
    node.write_to(sysfs.path())
        .context("cannot write the DGX H100 fixture")?;
    // The fixture node's /dev (the daemon lists a GPU whose /dev/nvidiaN is missing Unhealthy);
    // device specs still name /dev, as on the node.
    let dev = fixtures::tempdir().context("cannot create a temp dir for /dev")?;
    fixtures::write_dev_nodes(&node, dev.path()).context("cannot write the fixture's /dev")?;

    // A fabric with DSCP 26 tells workloads to use ToS 106 (NCCL_IB_TC / UCX_IB_TRAFFIC_CLASS).
    // The default resources: `rdma/hca` only, GPUs left to NVIDIA's device plugin.
    let config = Config {
        traffic_class: Some(rocefabric_api::constants::traffic_class(26)),
        ..Config::default()
    };

    section(
        "1. discovery: DGX H100 fixture (rocefabric-fixture dgx-h100 DIR; rocefabric-device-plugin discover --sysfs-root DIR)",
    );
    let inv = inventory::discover(sysfs.path(), &config.hca.selector)
        .context("discovery failed on the fixture")?;
    print!("{}", discover::table(&inv, &config));

    section("2. registration with an in-process kubelet emulator");
    let plugin_dir = fixtures::tempdir().context("cannot create the plugin dir")?;
    let kubelet = KubeletEmulator::start(plugin_dir.path()).await?;
    let options = ServeOptions::new(
        config.clone(),
        sysfs.path().to_path_buf(),
        dev.path().to_path_buf(),
        plugin_dir.path().to_path_buf(),
    );
    let (_view_tx, view_rx) = fabric_source::static_view(&config);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let inventory = options.discovery().await?;
    let daemon = tokio::spawn(serve::run(options, inventory, view_rx, async {
        let _ = stop_rx.await;
    }));
    let resources: Vec<&str> = ResourceKind::enabled_kinds(&config)
        .into_iter()
        .map(|kind| kind.resource_name(&config))
        .collect();
    let snapshot = kubelet.wait_for_resources(&resources, WAIT).await?;
    for (name, reg) in snapshot.registered() {
        let devices = snapshot.devices_of(name).unwrap_or_default();
        let healthy = devices.iter().filter(|d| d.health == "Healthy").count();
        println!(
            "{name:<16} endpoint {:<32} {:>2} devices ({healthy} healthy), preferred allocation: {}",
            reg.request.endpoint,
            devices.len(),
            reg.request
                .options
                .as_ref()
                .is_some_and(|o| o.get_preferred_allocation_available),
        );
    }

    section("3. one allocation: 2 x rdma/hca, the kubelet's choice from GetPreferredAllocation");
    let available: Vec<String> = snapshot
        .devices_of(HCA_RESOURCE)
        .unwrap_or_default()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let available: Vec<&str> = available.iter().map(String::as_str).collect();
    let chosen = kubelet
        .preferred_allocation(HCA_RESOURCE, &available, &[], 2)
        .await?;
    println!("preferred: {}", chosen.join(", "));
    let chosen: Vec<&str> = chosen.iter().map(String::as_str).collect();
    let response = kubelet.allocate(HCA_RESOURCE, &chosen).await?;
    println!("device nodes:");
    for d in &response.devices {
        println!(
            "  {} -> {} ({})",
            d.host_path, d.container_path, d.permissions
        );
    }
    println!("environment:");
    let mut envs: Vec<_> = response.envs.iter().collect();
    envs.sort();
    for (k, v) in envs {
        println!("  {k}={v}");
    }

    let _ = stop_tx.send(());
    daemon.await.context("the daemon task panicked")??;
    kubelet.stop().await;

    section("4. the operator's plan over examples/ (rocefabric-operator plan ...)");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let args = PlanArgs {
        fabrics: vec![examples.join("rocefabric-dgx.yaml")],
        nodes: vec![examples.join("cluster-snapshot/nodes.yaml")],
        pods: vec![examples.join("cluster-snapshot/pods.yaml")],
        roce_nodes: Vec::new(),
        output: OutputFormat::Table,
        writes: false,
        from_cluster: false,
        page_size: 500,
    };
    let out = operator_plan::plan_files(&args)?;
    print!("{}", operator_plan::render_table(&out));
    println!("\nNext: cargo test --workspace; then README.md \"Install on a cluster\".");
    Ok(())
}
