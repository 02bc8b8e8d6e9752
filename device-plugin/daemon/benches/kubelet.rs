//! The kubelet-facing path, measured over real unix sockets against the kubelet emulator:
//! - `Allocate` (2 HCAs) round trip next to bare round trips on the same transport
//!   (`GetDevicePluginOptions`, `PreStartContainer`), and their ratio;
//! - re-registration after `kubelet.sock` is recreated (kubelet restart);
//! - resident memory of the `serve` binary on the DGX H100 fixture.
//!
//! `cargo bench -p rocefabric-device-plugin --bench kubelet`

#![allow(clippy::unwrap_used)] // a benchmark fails loudly

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocefabric_device_plugin::fabric_source;
use rocefabric_device_plugin::serve::{self, ServeOptions};
use rocefabric_kubelet_api::pb;
use rocefabric_node_model::config::Config;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;
use tokio::sync::oneshot;

/// All three resources on (`gpu` and `gpuHca` enabled): the rails and the GPUs are the pairs', so
/// `rdma/hca` keeps the six storage and irdma ports and `nvidia.com/gpu` lists none.
const RESOURCES: [&str; 3] = ["rdma/hca", "nvidia.com/gpu", "rdma/gpu-hca"];
/// Two HCAs that are no GPU's rail: mlx5_1 and mlx5_7, the storage cards' first ports.
const TWO_HCAS: [&str; 2] = ["0000:29:00.0", "0000:aa:00.0"];
const WAIT: Duration = Duration::from_secs(10);
const CALLS: usize = 3000;
const RESTARTS: usize = 30;

struct Stats {
    median: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let n = samples.len();
    Stats {
        median: samples[n / 2],
        p99: samples[(n * 99 / 100).min(n - 1)],
        mean: samples.iter().sum::<Duration>() / n as u32,
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to filter here.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        round_trips_and_reregistration().await;
        serve_binary_memory().await;
    });
}

async fn round_trips_and_reregistration() {
    let dir = fixtures::tempdir().unwrap();
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).unwrap();
    fixtures::write_dev_nodes(&FixtureNode::dgx_h100(), &dir.path().join("dev")).unwrap();
    let plugin_dir = dir.path().join("plugins");
    let mut kubelet = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let mut config = Config {
        traffic_class: Some(106),
        ..Config::default()
    };
    config.gpu.enabled = true;
    config.gpu_hca.enabled = true;
    let mut options = ServeOptions::new(config, sysfs, dir.path().join("dev"), plugin_dir);
    options.liveness_interval = Duration::from_secs(3600);
    let (_view_tx, view_rx) = fabric_source::static_view(&options.config);
    let (stop, stopped) = oneshot::channel::<()>();
    let inventory = options.discovery().await.unwrap();
    let daemon = tokio::spawn(serve::run(options, inventory, view_rx, async move {
        let _ = stopped.await;
    }));
    kubelet.wait_for_resources(&RESOURCES, WAIT).await.unwrap();

    // Round trips on one connection, as the kubelet keeps one per plugin.
    let mut client = kubelet.client("rdma/hca").await.unwrap();
    let allocate = pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: TWO_HCAS.map(String::from).to_vec(),
        }],
    };
    let pre_start = pb::PreStartContainerRequest {
        devices_ids: vec![TWO_HCAS[0].into()],
    };
    let first = client
        .allocate(allocate.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        first.container_responses[0].envs["NCCL_IB_HCA"],
        "=mlx5_1:1,mlx5_7:1"
    );
    for _ in 0..300 {
        client.allocate(allocate.clone()).await.unwrap();
        client
            .get_device_plugin_options(pb::Empty {})
            .await
            .unwrap();
    }
    let (mut alloc, mut options_rt, mut pre_rt) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so drift in machine load hits all three alike.
    for _ in 0..CALLS {
        let t = Instant::now();
        client.allocate(allocate.clone()).await.unwrap();
        alloc.push(t.elapsed());
        let t = Instant::now();
        client
            .get_device_plugin_options(pb::Empty {})
            .await
            .unwrap();
        options_rt.push(t.elapsed());
        let t = Instant::now();
        client.pre_start_container(pre_start.clone()).await.unwrap();
        pre_rt.push(t.elapsed());
    }
    let (a, o, p) = (stats(alloc), stats(options_rt), stats(pre_rt));
    println!("round trips over the unix socket ({CALLS} calls each, interleaved):");
    println!("  {:<34} {:>10} {:>10} {:>10}", "", "median", "p99", "mean");
    for (name, s) in [
        ("Allocate (2 HCAs)", &a),
        ("GetDevicePluginOptions (bare)", &o),
        ("PreStartContainer (bare)", &p),
    ] {
        println!(
            "  {name:<34} {:>10} {:>10} {:>10}",
            us(s.median),
            us(s.p99),
            us(s.mean)
        );
    }
    println!(
        "  ratio Allocate / bare (median): {:.2} vs GetDevicePluginOptions, {:.2} vs PreStartContainer",
        a.median.as_secs_f64() / o.median.as_secs_f64(),
        a.median.as_secs_f64() / p.median.as_secs_f64()
    );

    // Kubelet restarts: delete every socket, recreate kubelet.sock, time until every resource
    // registered again, and until every resource's first device list arrived.
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    for _ in 0..RESTARTS {
        let t = Instant::now();
        kubelet.restart().await.unwrap();
        let restart_took = t.elapsed();
        let snapshot = kubelet.wait_for_resources(&RESOURCES, WAIT).await.unwrap();
        listed.push(t.elapsed());
        let last = snapshot.registered().values().map(|r| r.at).max().unwrap();
        registered.push(last.duration_since(t));
        if t.elapsed() > Duration::from_millis(20) {
            let refused: Vec<_> = snapshot
                .registrations
                .iter()
                .filter(|r| r.generation == snapshot.generation && !r.accepted())
                .map(|r| {
                    (
                        r.request.resource_name.clone(),
                        r.rejected.clone(),
                        r.at.duration_since(t),
                    )
                })
                .collect();
            eprintln!(
                "slow restart: restart() {restart_took:?}, total {:?}, refused {refused:?}",
                t.elapsed()
            );
            for r in snapshot
                .registrations
                .iter()
                .filter(|r| r.generation == snapshot.generation)
            {
                eprintln!(
                    "   {} at {:?}",
                    r.request.resource_name,
                    r.at.duration_since(t)
                );
            }
        }
    }
    let (r, l) = (stats(registered), stats(listed));
    println!(
        "kubelet restart (sockets deleted, kubelet.sock recreated) -> re-registration ({RESTARTS} restarts):"
    );
    println!(
        "  all 3 registered again:  median {}  p99 {}",
        ms(r.median),
        ms(r.p99)
    );
    println!(
        "  all 3 lists received:    median {}  p99 {}",
        ms(l.median),
        ms(l.p99)
    );

    let _ = stop.send(());
    daemon.await.unwrap().unwrap();
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn serve_binary_memory() {
    let dir = fixtures::tempdir().unwrap();
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).unwrap();
    fixtures::write_dev_nodes(&FixtureNode::dgx_h100(), &dir.path().join("dev")).unwrap();
    let plugin_dir = dir.path().join("plugins");
    let kubelet = KubeletEmulator::start(&plugin_dir).await.unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "pollInterval: 100ms\ntrafficClass: 106\ngpu:\n  enabled: true\ngpuHca:\n  enabled: true\n",
    )
    .unwrap();
    let binary = env!("CARGO_BIN_EXE_rocefabric-device-plugin");
    let mut child = Command::new(binary)
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--sysfs-root")
        .arg(&sysfs)
        .arg("--dev-root")
        .arg(dir.path().join("dev"))
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kubelet.wait_for_resources(&RESOURCES, WAIT).await.unwrap();
    let pid = child.id();
    let after_start = status_kib(pid, "VmRSS:");

    // Some work: allocations on every resource with devices (every GPU has a rail here, so
    // nvidia.com/gpu lists none), a link flap seen through ListAndWatch, and 20 poll intervals of
    // steady state.
    for _ in 0..200 {
        kubelet.allocate("rdma/hca", &TWO_HCAS).await.unwrap();
        kubelet
            .allocate("rdma/gpu-hca", &["0000:1b:00.0_0000:18:00.0"])
            .await
            .unwrap();
    }
    fixtures::set_port_state(&sysfs, "mlx5_3", 1, false).unwrap();
    let down = |d: &[pb::Device]| {
        d.iter()
            .any(|d| d.id == "0000:43:00.0_0000:40:00.0" && d.health == "Unhealthy")
    };
    kubelet
        .wait_for_devices("rdma/gpu-hca", WAIT, down)
        .await
        .unwrap();
    fixtures::set_port_state(&sysfs, "mlx5_3", 1, true).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    let status = child.wait().unwrap();
    let mib = |k: Option<u64>| {
        k.map_or("n/a".to_string(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!("serve binary on the DGX H100 fixture (14 HCAs, 8 GPUs, 8 pairs; poll 100 ms):");
    println!("  VmRSS after registration: {}", mib(after_start));
    println!(
        "  VmRSS after 600 Allocates, a link flap, 2 s steady: {}",
        mib(rss)
    );
    println!("  VmHWM (peak): {}", mib(hwm));
    println!("  exit on SIGTERM: {status}");
    assert!(status.success());
}
