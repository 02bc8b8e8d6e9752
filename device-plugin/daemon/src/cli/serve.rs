//! `rocefabric-device-plugin serve`: run the kubelet device plugin, the DRA driver, or both, for
//! this node's HCAs and GPUs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::sync::watch;

use rocefabric_dra::driver::{DraInputs, DraOptions};
use rocefabric_dra::ledger::Ledger;
use rocefabric_kubelet_api::DEFAULT_PLUGIN_DIR;
use rocefabric_node_model::config::Config;
use rocefabric_runtime::{logging, metrics_server, shutdown};

use crate::fabric_source;
use crate::mode::Mode;
use crate::serve::{self, ServeOptions};

/// Serve `rdma/hca`, the GPUs and `rdma/gpu-hca` to the kubelet (one socket per resource).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// YAML config file (at most 1 MiB); every field has a default.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Root of the sysfs tree to discover devices from.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Where the host's /dev is visible (device specs always name the host's /dev paths).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// Where the kubelet and the container runtime see the device nodes: the host path of every
    /// device spec handed to the kubelet (container paths stay `/dev/...`).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub host_dev_root: PathBuf,
    /// Where the NVIDIA driver's GPU information (`driver/nvidia/gpus/<bdf>/information`: device
    /// minor, UUID) is read.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The kubelet's device plugin directory (our sockets are created here).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket [default: <plugin-dir>/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
    /// This node's name (for logs and the node's RoceNode).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Exit when a resource stays unregistered this long (`5m`, `90s`; `0s` never exits), so the
    /// kubelet restarts the container: a plugin directory re-created on the host is only seen
    /// through a fresh mount.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = rocefabric_node_model::config::duration_text::parse)]
    pub exit_after_unregistered: Duration,
    /// Exit, naming the cause, when a resource's socket cannot be created this many times in a row
    /// (a read-only or unusable plugin directory); the attempts back off from 100 ms, so the
    /// default gives up after about 1.5 s.
    #[arg(long, value_name = "N", default_value_t = serve::DEFAULT_START_ATTEMPTS,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub start_attempts: u32,
    /// Serve `/metrics` (OpenMetrics) and `/healthz` on this address; off when not given.
    #[arg(long, value_name = "ADDR", visible_alias = "metrics-bind-address")]
    pub metrics_addr: Option<SocketAddr>,
    /// Which kubelet APIs to serve: the device plugin API, DRA (ResourceSlices, the kubelet DRA
    /// plugin, CDI specs), or both with one ledger so no device goes to two pods.
    #[arg(long, value_enum, default_value = "devicePlugin")]
    pub mode: Mode,
    /// DRA: the driver's directory in the kubelet's plugin directory (`dra.sock`,
    /// `checkpoint.json`); the kubelet must see it at the same path.
    #[arg(long, value_name = "DIR", default_value = rocefabric_dra::DEFAULT_PLUGIN_DIR)]
    pub dra_plugin_dir: PathBuf,
    /// DRA: the kubelet's plugin registration directory.
    #[arg(long, value_name = "DIR", default_value = rocefabric_dra::DEFAULT_REGISTRY_DIR)]
    pub dra_registry_dir: PathBuf,
    /// DRA: where CDI specs of prepared claims are written (the container runtime reads them).
    #[arg(long, value_name = "DIR", default_value = rocefabric_dra::DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// The kubelet's pod resources socket, to learn which devices device plugins granted to live
    /// pods (ours in `both` mode, NVIDIA's GPUs in `dra` and `both`); read in `both` mode and in
    /// `dra` mode with `--dra-gpus=true`.
    #[arg(long, value_name = "PATH", default_value = rocefabric_dra::DEFAULT_POD_RESOURCES_SOCKET)]
    pub pod_resources_socket: PathBuf,
    /// DRA: publish GPUs next to the HCAs (`false` where another DRA driver serves the GPUs).
    /// Published GPUs are withheld while a device plugin grant holds them, and all of them while
    /// the pod resources API cannot be read.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub dra_gpus: bool,
    /// Test hook: pause each DRA prepare this long after its checkpoint record is written.
    #[arg(long, value_name = "DURATION", hide = true, value_parser = rocefabric_node_model::config::duration_text::parse)]
    pub dra_pause_after_checkpoint: Option<Duration>,
}

impl ServeArgs {
    /// Load the config and turn the flags into daemon options.
    pub fn options(&self) -> anyhow::Result<ServeOptions> {
        let config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        let mut options = ServeOptions::new(
            config,
            self.sysfs_root.clone(),
            self.dev_root.clone(),
            self.plugin_dir.clone(),
        );
        if let Some(socket) = &self.kubelet_socket {
            options.kubelet_socket = socket.clone();
        }
        options.node_name = self.node_name.clone();
        options.host_dev_root = self.host_dev_root.clone();
        options.proc_root = Some(self.proc_root.clone());
        options.start_attempts = self.start_attempts;
        options.exit_after_unregistered =
            (!self.exit_after_unregistered.is_zero()).then_some(self.exit_after_unregistered);
        Ok(options)
    }

    /// The DRA driver's options; DRA needs the node name (the pool is named after the node).
    pub fn dra_options(&self, options: &ServeOptions) -> anyhow::Result<DraOptions> {
        let Some(node_name) = options.node_name.clone() else {
            bail!(
                "--mode {:?} needs the node name (--node-name or NODE_NAME): the ResourceSlice pool is named after the node",
                self.mode
            );
        };
        Ok(DraOptions {
            plugin_dir: self.dra_plugin_dir.clone(),
            registry_dir: self.dra_registry_dir.clone(),
            cdi_dir: self.cdi_dir.clone(),
            pod_resources_socket: self
                .mode
                .reads_grants(self.dra_gpus)
                .then(|| self.pod_resources_socket.clone()),
            device_plugin: self.mode == Mode::Both,
            node_name,
            host_dev_root: self.host_dev_root.clone(),
            publish_gpus: self.dra_gpus,
            pause_after_checkpoint: self.dra_pause_after_checkpoint,
            metrics: Arc::default(),
        })
    }
}

/// Run the daemon until SIGTERM or ctrl-c.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    logging::init("RUST_LOG", "info", logging::Format::Text);
    let mut options = args.options()?;
    let mode = args.mode;
    let dra_options = mode.dra().then(|| args.dra_options(&options)).transpose()?;
    // One ledger, filled from the DRA checkpoint before either side serves (`both`). Where the
    // daemon reads grants, they are unknown until the kubelet's pod resources API answers.
    let ledger = Arc::new(if mode.reads_grants(args.dra_gpus) {
        Ledger::awaiting_grants()
    } else {
        Ledger::default()
    });
    if let Some(dra) = &dra_options
        && mode == Mode::Both
    {
        rocefabric_dra::driver::restore_ledger(&dra.checkpoint_path(), &ledger)?;
        options.ledger = Some(Arc::clone(&ledger));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(async {
        let signal = shutdown::signal().context("failed to install the signal handlers")?;
        // Holds the static view's sender for as long as the daemon runs.
        let (_static_tx, view_rx) =
            fabric_source::fabric_view(&options.config, options.node_name.as_deref()).await?;
        // One discovery loop feeds the device plugin and the DRA driver.
        let inventory = options.discovery().await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        if let Some(addr) = args.metrics_addr {
            let mut registry = prometheus_client::registry::Registry::default();
            options.metrics.register(&mut registry);
            if let Some(dra) = &dra_options {
                dra.metrics.register(&mut registry);
            }
            let server = metrics_server::serve(addr, Arc::new(registry), stopped(stop_rx.clone()));
            tokio::spawn(async move {
                // The kubelet side matters more than metrics: keep serving devices regardless.
                if let Err(error) = server.await {
                    tracing::error!(%addr, %error, "metrics server failed");
                }
            });
        }
        tokio::spawn(async move {
            signal.await;
            let _ = stop_tx.send(true);
        });
        let device_plugin = async {
            if mode.device_plugin() {
                serve::run(
                    options.clone(),
                    inventory.clone(),
                    view_rx.clone(),
                    stopped(stop_rx.clone()),
                )
                .await?;
            }
            anyhow::Ok(())
        };
        let dra = async {
            let Some(dra_options) = dra_options.clone() else {
                return anyhow::Ok(());
            };
            let client = kube::Client::try_default()
                .await
                .context("DRA mode needs the Kubernetes API (ResourceSlices, ResourceClaims)")?;
            let inputs = DraInputs {
                config: Arc::new(options.config.clone()),
                client,
                inventory: inventory.clone(),
                fabric_view: view_rx.clone(),
                ledger: Arc::clone(&ledger),
            };
            rocefabric_dra::driver::run(dra_options, inputs, stopped(stop_rx.clone())).await?;
            anyhow::Ok(())
        };
        // Either side failing ends the daemon, so the container restarts with the cause logged.
        tokio::try_join!(device_plugin, dra)?;
        anyhow::Ok(())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn dra_options(args: &[&str]) -> rocefabric_dra::driver::DraOptions {
        let argv = ["rocefabric-device-plugin", "serve", "--node-name", "n"];
        let cli = Cli::try_parse_from(argv.iter().chain(args)).unwrap();
        let Command::Serve(serve) = cli.command else {
            panic!("not serve");
        };
        serve.dra_options(&serve.options().unwrap()).unwrap()
    }

    #[test]
    fn dra_mode_reads_grants_while_it_publishes_gpus() {
        let socket = Some(std::path::PathBuf::from(
            rocefabric_dra::DEFAULT_POD_RESOURCES_SOCKET,
        ));
        let dra = dra_options(&["--mode", "dra"]);
        assert_eq!(dra.pod_resources_socket, socket);
        assert!(dra.publish_gpus && !dra.device_plugin);
        let no_gpus = dra_options(&["--mode", "dra", "--dra-gpus=false"]);
        assert_eq!(no_gpus.pod_resources_socket, None);
        assert!(!no_gpus.publish_gpus);
        let both = dra_options(&["--mode", "both", "--dra-gpus=false"]);
        assert_eq!(both.pod_resources_socket, socket);
        assert!(both.device_plugin);
        let custom = dra_options(&["--mode", "dra", "--pod-resources-socket", "/pr/k.sock"]);
        assert_eq!(
            custom.pod_resources_socket.as_deref(),
            Some(std::path::Path::new("/pr/k.sock"))
        );
    }
}
