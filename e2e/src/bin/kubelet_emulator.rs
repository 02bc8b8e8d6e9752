//! `rocefabric-kubelet-emulator`: the kubelet side of the device plugin API as a program, for a
//! node where the test cannot run in-process (the Soft-RoCE VM of the `soft_roce` suite). It
//! serves the registration socket in `--plugin-dir`, waits for `--resource` to register and list,
//! and prints what it sees as JSON lines on stdout:
//!
//! - `{"event":"listed","resource":..,"devices":[{"id","health","numaNodes"}]}`;
//! - with `--allocate-to FILE`: Allocate of every Healthy device in one container,
//!   `{"event":"allocated","ids":[..],"devices":[{"hostPath","containerPath","permissions"}],"envs":{..}}`,
//!   and the device nodes as `HOST CONTAINER PERMISSIONS` lines in FILE (for a shell to build a
//!   container's `/dev`);
//! - with `--flap NETDEV`: `ip link set NETDEV down`, then `{"event":"unhealthy","afterMs":N}` once
//!   ListAndWatch reports a device Unhealthy; `up`, then `{"event":"healthy","afterMs":N}` once all
//!   are Healthy again.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use rocefabric_kubelet_api::pb;
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "rocefabric-kubelet-emulator", about)]
struct Args {
    /// The kubelet's device plugin directory (where `kubelet.sock` is served).
    #[arg(long, value_name = "DIR")]
    plugin_dir: PathBuf,
    /// The resource to wait for.
    #[arg(long, default_value = rocefabric_api::constants::HCA_RESOURCE)]
    resource: String,
    /// Bound for every wait, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Allocate every Healthy device and write the granted device nodes to this file.
    #[arg(long, value_name = "FILE")]
    allocate_to: Option<PathBuf>,
    /// Take this netdev down and up again, timing the health changes seen in ListAndWatch.
    #[arg(long, value_name = "NETDEV")]
    flap: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let resource = args.resource.as_str();
    let kubelet = KubeletEmulator::start(&args.plugin_dir)
        .await
        .context("failed to start the kubelet emulator")?;
    kubelet
        .wait_for_resources(&[resource], timeout)
        .await
        .with_context(|| format!("{resource} was not registered and listed"))?;
    let devices = kubelet
        .snapshot()
        .devices_of(resource)
        .map(<[_]>::to_vec)
        .unwrap_or_default();
    let listed: Vec<_> = devices.iter().map(device_json).collect();
    println!(
        "{}",
        json!({"event": "listed", "resource": resource, "devices": listed})
    );

    if let Some(file) = &args.allocate_to {
        let ids: Vec<&str> = devices
            .iter()
            .filter(|d| d.health == "Healthy")
            .map(|d| d.id.as_str())
            .collect();
        let response = kubelet.allocate(resource, &ids).await?;
        let lines: String = response
            .devices
            .iter()
            .map(|d| format!("{} {} {}\n", d.host_path, d.container_path, d.permissions))
            .collect();
        std::fs::write(file, lines)
            .with_context(|| format!("failed to write {}", file.display()))?;
        let granted: Vec<_> = response
            .devices
            .iter()
            .map(|d| {
                json!({"hostPath": d.host_path, "containerPath": d.container_path,
                       "permissions": d.permissions})
            })
            .collect();
        println!(
            "{}",
            json!({"event": "allocated", "ids": ids, "devices": granted, "envs": response.envs})
        );
    }

    if let Some(netdev) = &args.flap {
        for (state, event) in [("down", "unhealthy"), ("up", "healthy")] {
            let start = Instant::now();
            set_link(netdev, state)?;
            kubelet
                .wait_for_devices(resource, timeout, |d| {
                    if state == "down" {
                        d.iter().any(|d| d.health == "Unhealthy")
                    } else {
                        !d.is_empty() && d.iter().all(|d| d.health == "Healthy")
                    }
                })
                .await
                .with_context(|| format!("no {event} report after {netdev} went {state}"))?;
            let after_ms = start.elapsed().as_millis();
            println!(
                "{}",
                json!({"event": event, "netdev": netdev, "afterMs": after_ms})
            );
        }
    }
    kubelet.stop().await;
    Ok(())
}

fn device_json(d: &pb::Device) -> serde_json::Value {
    let numa: Vec<i64> = d
        .topology
        .as_ref()
        .map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default();
    json!({"id": d.id, "health": d.health, "numaNodes": numa})
}

/// `ip link set NETDEV up|down` (iproute2 from PATH).
fn set_link(netdev: &str, state: &str) -> anyhow::Result<()> {
    let status = Command::new("ip")
        .args(["link", "set", netdev, state])
        .status()
        .context("failed to run ip")?;
    if !status.success() {
        bail!("ip link set {netdev} {state} failed: {status}");
    }
    Ok(())
}
