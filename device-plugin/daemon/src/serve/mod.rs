//! The `serve` daemon: keeps the node's inventory fresh, feeds one device list per resource, runs
//! one kubelet `DevicePlugin` server per resource and keeps each registered with the kubelet.
//!
//! - A poll task re-runs discovery every `pollInterval` and whenever the [`FabricView`] changes,
//!   applies the QoS gate, and publishes a [`NodeState`] plus a device list per resource on
//!   `tokio::sync::watch` channels; a channel only changes when its content does, so
//!   `ListAndWatch` sends a list exactly when something changed. A device once advertised and then
//!   gone from sysfs stays listed as Unhealthy for the life of the process.
//! - Each resource lists only the devices it owns (see [`rocefabric_node_model::ownership`]); the first publish logs
//!   the split when pairs took rail HCAs or GPUs from `rdma/hca` or the GPU resource, and a device
//!   that later changes owner (its rail appeared or vanished) is logged as a warning.
//! - A supervisor owns the servers: at start it removes its stale sockets, serves every enabled
//!   resource (also one with no devices on this node: capacity 0, and devices that appear later,
//!   such as RDMA devices after a late driver load, are listed without a restart), and registers
//!   each only once its server answers. An inotify watch on the plugin directory makes it
//!   re-register everything when `kubelet.sock` is recreated and bring back a server whose socket
//!   was deleted; a slow liveness check covers lost inotify events. Failures are logged and
//!   retried with backoff, never fatal once running, with one exception: a server that fails to
//!   start [`ServeOptions::start_attempts`] times in a row (its socket cannot be created: a
//!   read-only or vanished plugin directory) ends `serve` with that cause, so the container is
//!   restarted and the user sees why.

mod publish;
mod supervisor;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use rocefabric_dra::ledger::Ledger;
use rocefabric_kubelet_api::device_plugin::ServerError;
use rocefabric_kubelet_api::registration::{self, Backoff};
use rocefabric_kubelet_api::watcher::{DirWatcher, WatchError};
use rocefabric_kubelet_api::{self as kubelet};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_model::model::Inventory;

use crate::discovery::{DiscoveryError, Sources};

pub use publish::{NodeState, ResourceBackend, to_proto, with_departed};
use publish::{Publisher, publish_loop};
use supervisor::{KubeletSocket, Supervisor, next_event, sleep_until};

/// Everything `serve` needs; every host path is explicit.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub config: Config,
    pub sysfs_root: PathBuf,
    /// Where the host's device nodes are visible to this process; only used to check that granted
    /// nodes exist (the specs handed to the kubelet name them under `host_dev_root`).
    pub dev_root: PathBuf,
    /// Where the kubelet and the container runtime find the device nodes (`/dev` on a node; a
    /// containerized driver root or a fixture elsewhere): the host path of every device spec.
    pub host_dev_root: PathBuf,
    /// Where the NVIDIA driver's `driver/nvidia/gpus/<bdf>/information` is read (`/proc`; not
    /// namespaced, so a container's own `/proc` shows it). `None`: GPUs are numbered in PCI order.
    pub proc_root: Option<PathBuf>,
    pub plugin_dir: PathBuf,
    pub kubelet_socket: PathBuf,
    pub node_name: Option<String>,
    pub registration_backoff: Backoff,
    /// Interval of the fallback check of our sockets and `kubelet.sock` (inotify is the primary
    /// signal; this only catches lost events).
    pub liveness_interval: Duration,
    /// Consecutive failures to start one resource's server (remove its old socket, create the new
    /// one, answer on it) after which `serve` exits with the last cause. The attempts are spaced by
    /// `registration_backoff`: [`DEFAULT_START_ATTEMPTS`] take about 1.5 s with the defaults.
    pub start_attempts: u32,
    /// Exit (so the kubelet restarts the container) when a resource has not been registered for
    /// this long. A plugin directory deleted and re-created on the host is a new inode that a
    /// running container's bind mount never shows: the kubelet's socket never appears in the old
    /// directory, and only a restart with a fresh mount recovers. `None`: retry forever.
    pub exit_after_unregistered: Option<Duration>,
    /// Where the daemon counts what it does; register it with a [`Registry`] to export it.
    pub metrics: Arc<ServeMetrics>,
    /// `both` mode: the ledger shared with the DRA driver. Devices a claim holds are listed
    /// Unhealthy and refused by Allocate; every grant is recorded.
    pub ledger: Option<Arc<Ledger>>,
}

type Labels = Vec<(&'static str, String)>;

/// What the daemon counts, for `/metrics`.
#[derive(Debug, Default)]
pub struct ServeMetrics {
    /// Devices listed to the kubelet, per resource and health.
    pub devices: Family<Labels, Gauge>,
    /// `Register` attempts, per resource and result (`success` or an error label).
    pub registrations: Family<Labels, Counter>,
    /// `Allocate` calls, per resource and result (`success`, `unknown_device`, `not_owned`,
    /// `failed`).
    pub allocations: Family<Labels, Counter>,
    /// Kubelet restarts noticed (a new `kubelet.sock`).
    pub kubelet_restarts: Counter,
    /// Discovery passes that failed as a whole (the last inventory was kept).
    pub discovery_failures: Counter,
}

impl ServeMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rocefabric_device_plugin_devices",
            "Devices listed to the kubelet, per resource and health",
            self.devices.clone(),
        );
        registry.register(
            "rocefabric_device_plugin_registrations",
            "Register calls to the kubelet, per resource and result",
            self.registrations.clone(),
        );
        registry.register(
            "rocefabric_device_plugin_allocations",
            "Allocate calls from the kubelet, per resource and result",
            self.allocations.clone(),
        );
        registry.register(
            "rocefabric_device_plugin_kubelet_restarts",
            "Kubelet restarts noticed (kubelet.sock created again)",
            self.kubelet_restarts.clone(),
        );
        registry.register(
            "rocefabric_device_plugin_discovery_failures",
            "Discovery passes that failed as a whole",
            self.discovery_failures.clone(),
        );
    }

    fn labels(resource: &str, key: &'static str, value: &str) -> Labels {
        vec![("resource", resource.to_string()), (key, value.to_string())]
    }
}

impl ServeOptions {
    /// Options with the default plugin directory layout under `plugin_dir`.
    pub fn new(
        config: Config,
        sysfs_root: PathBuf,
        dev_root: PathBuf,
        plugin_dir: PathBuf,
    ) -> Self {
        let kubelet_socket = plugin_dir.join(kubelet::KUBELET_SOCKET_NAME);
        Self {
            config,
            sysfs_root,
            dev_root,
            host_dev_root: PathBuf::from("/dev"),
            proc_root: None,
            plugin_dir,
            kubelet_socket,
            node_name: None,
            registration_backoff: registration::DEFAULT_BACKOFF,
            liveness_interval: Duration::from_secs(10),
            start_attempts: DEFAULT_START_ATTEMPTS,
            exit_after_unregistered: Some(DEFAULT_EXIT_AFTER_UNREGISTERED),
            metrics: Arc::default(),
            ledger: None,
        }
    }
}

impl ServeOptions {
    /// Where discovery reads from.
    pub fn sources(&self) -> Sources {
        Sources {
            sysfs: self.sysfs_root.clone(),
            proc: self.proc_root.clone(),
            dev: self.dev_root.clone(),
        }
    }

    /// Start the discovery loop over these options' roots and config, counting failures in
    /// these options' metrics: the inventory [`run`] serves.
    pub async fn discovery(&self) -> Result<watch::Receiver<Inventory>, DiscoveryError> {
        self.sources()
            .watch(
                Arc::new(self.config.clone()),
                self.metrics.discovery_failures.clone(),
            )
            .await
    }
}

/// How many times in a row a resource's server may fail to start before `serve` exits, by default.
pub const DEFAULT_START_ATTEMPTS: u32 = 5;

/// How long a resource may stay unregistered before `serve` exits, by default.
pub const DEFAULT_EXIT_AFTER_UNREGISTERED: Duration = Duration::from_secs(5 * 60);

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("failed to prepare plugin directory {path}: {source}")]
    PluginDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("cannot serve {resource} after {attempts} attempts: {source}")]
    Start {
        resource: String,
        attempts: u32,
        #[source]
        source: ServerError,
    },
    #[error(
        "{resource} not registered with the kubelet for {waited:?}: {kubelet_socket} never \
         accepted it. If the kubelet runs, the plugin directory was probably replaced on the host \
         (this container's mount still shows the old one); exiting so the container restarts"
    )]
    Unregistered {
        resource: String,
        kubelet_socket: PathBuf,
        waited: Duration,
    },
}

/// Run the daemon until `shutdown` completes, serving the inventory the discovery loop sends
/// ([`ServeOptions::discovery`]). `fabric_view` drives the QoS gate and the traffic class (see
/// [`rocefabric_node_model::fabric_view`]); pass [`crate::fabric_source::static_view`]'s
/// receiver when no agent is plugged in. Returns an error only for problems found before serving
/// starts, or for the two reasons to exit while serving (a socket that cannot be created, a
/// resource unregistered for too long).
pub async fn run(
    options: ServeOptions,
    inventory: watch::Receiver<Inventory>,
    fabric_view: watch::Receiver<FabricView>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let mut watcher = Some(prepare_plugin_dir(
        &options.plugin_dir,
        &options.kubelet_socket,
    )?);

    let mut inventory_rx = inventory;
    let inventory = inventory_rx.borrow_and_update().clone();
    tracing::info!(node = options.node_name.as_deref().unwrap_or(""), hcas = inventory.hcas.len(),
        gpus = inventory.gpus.len(), plugin_dir = %options.plugin_dir.display(), "starting device plugin");
    let mut publisher = Publisher::new(
        Arc::new(options.config.clone()),
        Arc::clone(&options.metrics),
        options.ledger.clone(),
    );
    let mut view_rx = fabric_view;
    let view = view_rx.borrow_and_update().clone();
    publisher.publish(&inventory, &view);

    let mut supervisor = Supervisor::new(&options, &publisher);
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = tokio::spawn(publish_loop(publisher, inventory_rx, view_rx, stop_rx));
    supervisor.start_all().await;

    let mut kubelet = KubeletSocket::new(&options.kubelet_socket);
    let mut exit = None;
    let mut liveness = tokio::time::interval(options.liveness_interval);
    liveness.reset();
    tokio::pin!(shutdown);
    loop {
        if let Some(error) = supervisor.gave_up.take() {
            exit = Some(error);
            break;
        }
        let retry_at = supervisor.next_retry();
        tokio::select! {
            event = next_event(&mut watcher) => {
                let (Some(event), Some(w)) = (event, watcher.as_mut()) else {
                    tracing::error!("plugin directory watch ended; relying on the liveness check");
                    watcher = None;
                    continue;
                };
                supervisor.on_dir_events(event, w, &mut kubelet).await;
            }
            () = sleep_until(retry_at) => supervisor.retry_due().await,
            _ = liveness.tick() => {
                if watcher.is_none() {
                    match DirWatcher::start(&options.plugin_dir, &options.kubelet_socket) {
                        Ok(w) => watcher = Some(w),
                        Err(error) => tracing::error!(%error, "cannot watch the plugin directory again"),
                    }
                }
                if let Some(error) = supervisor.liveness_check(&mut kubelet, options.exit_after_unregistered).await {
                    exit = Some(error);
                    break;
                }
            }
            () = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    supervisor.shutdown().await;
    if let Err(error) = poller.await {
        tracing::warn!(%error, "poll task failed");
    }
    match exit {
        Some(error) => {
            tracing::error!(%error, "exiting");
            Err(error)
        }
        None => Ok(()),
    }
}

/// Create the plugin directory, remove our sockets of an earlier run, and start watching it:
/// before serving, so a kubelet restart during start-up is not missed.
fn prepare_plugin_dir(
    plugin_dir: &std::path::Path,
    kubelet_socket: &std::path::Path,
) -> Result<DirWatcher, ServeError> {
    let failed = |source| ServeError::PluginDir {
        path: plugin_dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(plugin_dir).map_err(failed)?;
    let stale = kubelet::remove_stale_sockets(plugin_dir).map_err(failed)?;
    for path in &stale {
        tracing::info!(socket = %path.display(), "removed stale socket of an earlier run");
    }
    Ok(DirWatcher::start(plugin_dir, kubelet_socket)?)
}
