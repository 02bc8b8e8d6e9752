//! `rocefabric-device-plugin serve`: run the kubelet device plugin for this node's HCAs and GPUs.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::Config;
use crate::fabric_view;
use crate::kubelet::DEFAULT_PLUGIN_DIR;
use crate::serve::{self, ServeOptions};

/// Serve `rdma/hca`, the GPUs and `rdma/gpu-hca` to the kubelet (one socket per resource).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// YAML config file; every field has a default.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Root of the sysfs tree to discover devices from.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Where the host's /dev is visible (device specs always name the host's /dev paths).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// The kubelet's device plugin directory (our sockets are created here).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket [default: <plugin-dir>/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
    /// This node's name (for logs and the node's RoceNode).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
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
        Ok(options)
    }
}

/// Run the daemon until SIGTERM or ctrl-c.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    let options = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(async {
        // No RoceNode producer is plugged in here: the config's traffic class, no QoS gate.
        let (_view_tx, view_rx) = fabric_view::static_view(&options.config);
        serve::run(options, view_rx, shutdown_signal()).await
    })?;
    Ok(())
}

/// Completes on SIGTERM or SIGINT (ctrl-c).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; stopping on ctrl-c only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Log to stderr, filtered by `RUST_LOG` (default `info`). A subscriber installed earlier wins.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
