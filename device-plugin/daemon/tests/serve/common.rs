//! Shared set-up of the `serve` tests: a fixture node in a temp dir, the daemon in-process, and the
//! kubelet emulator on the same plugin directory.

use std::path::PathBuf;
use std::time::Duration;

use rocefabric_device_plugin::serve::{self, ServeError, ServeOptions};
use rocefabric_kubelet_api::pb;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_testing::kubelet_emulator::{EmulatorError, KubeletEmulator};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Upper bound for waiting on something that should happen within milliseconds; only reached
/// when a test fails.
pub const WAIT: Duration = Duration::from_secs(5);

pub const HCA: &str = "rdma/hca";
pub const GPU: &str = "nvidia.com/gpu";
pub const GPU_HCA: &str = "rdma/gpu-hca";

/// A node: sysfs fixture, /dev root and plugin directory under one temp dir.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub sysfs: PathBuf,
    pub dev: PathBuf,
    pub plugin_dir: PathBuf,
}

impl Node {
    pub fn new(fixture: &FixtureNode) -> Self {
        let dir = fixtures::tempdir().expect("temp dir");
        let sysfs = dir.path().join("sys");
        let dev = dir.path().join("dev");
        let plugin_dir = dir.path().join("device-plugins");
        fixture.write_to(&sysfs).expect("write fixture");
        fixtures::write_dev_nodes(fixture, &dev).expect("dev nodes");
        Self {
            dir,
            sysfs,
            dev,
            plugin_dir,
        }
    }

    pub fn dgx() -> Self {
        Self::new(&FixtureNode::dgx_h100())
    }

    /// Options for this node with a fast poll, the given config otherwise.
    pub fn options(&self, config: Config) -> ServeOptions {
        let mut options = ServeOptions::new(
            config,
            self.sysfs.clone(),
            self.dev.clone(),
            self.plugin_dir.clone(),
        );
        // Only inotify may trigger re-registration within a test's time frame.
        options.liveness_interval = Duration::from_secs(3600);
        options
    }
}

/// A config polling sysfs every 20 ms; the default resources (`rdma/hca` only).
pub fn fast_config() -> Config {
    Config {
        poll_interval: Duration::from_millis(20),
        ..Config::default()
    }
}

/// [`fast_config`] serving GPUs as well (every GPU, every HCA under `rdma/hca`).
pub fn gpu_config() -> Config {
    let mut c = fast_config();
    c.gpu.enabled = true;
    c
}

/// [`fast_config`] serving GPU + rail pairs: the rails leave `rdma/hca`.
pub fn pair_config() -> Config {
    let mut c = fast_config();
    c.gpu_hca.enabled = true;
    c
}

/// All three resources.
pub fn all_config() -> Config {
    let mut c = gpu_config();
    c.gpu_hca.enabled = true;
    c
}

/// The daemon running in-process.
pub struct Daemon {
    pub view: watch::Sender<FabricView>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Daemon {
    pub fn start(options: ServeOptions) -> Self {
        let view = FabricView::from_config(&options.config);
        Self::start_with_view(options, view)
    }

    pub fn start_with_view(options: ServeOptions, view: FabricView) -> Self {
        let (view_tx, view_rx) = watch::channel(view);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let inventory = options.discovery().await?;
            serve::run(options, inventory, view_rx, async move {
                let _ = stopped.await;
            })
            .await
        });
        Self {
            view: view_tx,
            stop: Some(stop),
            task,
        }
    }

    /// Wait for `run` to return by itself (no shutdown asked).
    pub async fn stop_when_done(mut self) -> Result<(), ServeError> {
        let _keep_running = self.stop.take();
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("daemon returns by itself")
            .expect("daemon task")
    }

    /// Ask for shutdown and wait for `run` to return.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("daemon stops")
            .expect("daemon task")
    }
}

/// Start the emulator and the daemon on `node`, and wait until `resources` are registered and
/// listed.
pub async fn start(node: &Node, config: Config, resources: &[&str]) -> (KubeletEmulator, Daemon) {
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let daemon = Daemon::start(node.options(config));
    kubelet
        .wait_for_resources(resources, WAIT)
        .await
        .expect("resources registered and listed");
    (kubelet, daemon)
}

/// The health of device `id` in `devices`.
pub fn health_of<'a>(devices: &'a [pb::Device], id: &str) -> Option<&'a str> {
    devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.as_str())
}

/// The host paths of an Allocate response's device nodes, in order.
pub fn host_paths(response: &pb::ContainerAllocateResponse) -> Vec<&str> {
    response
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect()
}

/// IDs in a device list.
pub fn ids(devices: &[pb::Device]) -> Vec<&str> {
    devices.iter().map(|d| d.id.as_str()).collect()
}

/// The message of a call the plugin refused as `InvalidArgument`; panics on any other outcome.
pub fn invalid_argument(err: EmulatorError) -> String {
    let EmulatorError::Rpc(status) = err else {
        panic!("expected a gRPC error, got {err}")
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    status.message().to_string()
}
