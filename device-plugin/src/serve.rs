//! The `serve` daemon: keeps the node's inventory fresh, feeds one device list per resource, runs
//! one kubelet `DevicePlugin` server per resource and keeps each registered with the kubelet.
//!
//! - A poll task re-runs discovery every `pollInterval` and whenever the [`FabricView`] changes,
//!   applies the QoS gate, and publishes a [`NodeState`] plus a device list per resource on
//!   `tokio::sync::watch` channels; a channel only changes when its content does, so
//!   `ListAndWatch` sends a list exactly when something changed. A device once advertised and then
//!   gone from sysfs stays listed as Unhealthy for the life of the process.
//! - Each resource lists only the devices it owns (see [`crate::ownership`]); the first publish logs
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

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::allocation::{self, AdvertisedDevice, ContainerAllocation, ResourceKind};
use crate::config::Config;
use crate::dra::ledger::Ledger;
use crate::fabric_view::FabricView;
use crate::inventory;
use crate::kubelet::registration::{self, Backoff};
use crate::kubelet::server::{BackendError, DeviceBackend, PluginServer, ServerError};
use crate::kubelet::watcher::{DirEvent, DirWatcher, WatchError};
use crate::kubelet::{self, pb};
use crate::model::{Health, Inventory};
use crate::ownership::{self, Partition};

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
            registration_backoff: Backoff::default(),
            liveness_interval: Duration::from_secs(10),
            start_attempts: DEFAULT_START_ATTEMPTS,
            exit_after_unregistered: Some(DEFAULT_EXIT_AFTER_UNREGISTERED),
            metrics: Arc::default(),
            ledger: None,
        }
    }
}

/// How many times in a row a resource's server may fail to start before `serve` exits, by default.
pub const DEFAULT_START_ATTEMPTS: u32 = 5;

/// How long a resource may stay unregistered before `serve` exits, by default.
pub const DEFAULT_EXIT_AFTER_UNREGISTERED: Duration = Duration::from_secs(5 * 60);

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("sysfs root {path} is not a directory")]
    SysfsRoot { path: PathBuf },
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

/// What every resource's backend reads: the latest inventory with the gate applied and the
/// traffic class to hand to workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub inventory: Inventory,
    pub traffic_class: Option<u8>,
}

/// The device list of one resource as the kubelet sees it, remembering departed devices.
struct DeviceList {
    kind: ResourceKind,
    /// Every ID advertised so far with its last NUMA node.
    known: BTreeMap<String, Option<u32>>,
    tx: watch::Sender<Vec<pb::Device>>,
}

/// The current devices followed by every device advertised before and gone now, as Unhealthy.
pub fn with_departed(
    current: Vec<AdvertisedDevice>,
    known: &mut BTreeMap<String, Option<u32>>,
) -> Vec<pb::Device> {
    let present: std::collections::BTreeSet<&str> = current.iter().map(|d| d.id.as_str()).collect();
    let departed: Vec<pb::Device> = known
        .iter()
        .filter(|(id, _)| !present.contains(id.as_str()))
        .map(|(id, numa)| kubelet::device(id.clone(), Health::Unhealthy, *numa))
        .collect();
    let mut list: Vec<pb::Device> = current
        .iter()
        .map(|d| kubelet::device(d.id.clone(), d.health, d.numa_node))
        .collect();
    for d in current {
        known.insert(d.id, d.numa_node);
    }
    list.extend(departed);
    list
}

/// The publishing side: node state and per-resource lists, updated from inventory and view.
struct Publisher {
    config: Arc<Config>,
    metrics: Arc<ServeMetrics>,
    state: watch::Sender<Arc<NodeState>>,
    lists: Vec<DeviceList>,
    /// Each served device's resource at the last publish; `None` before the first.
    owners: Option<BTreeMap<String, ResourceKind>>,
    ledger: Option<Arc<Ledger>>,
}

impl Publisher {
    fn new(config: Arc<Config>, metrics: Arc<ServeMetrics>, ledger: Option<Arc<Ledger>>) -> Self {
        let lists = ResourceKind::enabled_kinds(&config)
            .into_iter()
            .map(|kind| DeviceList {
                kind,
                known: BTreeMap::new(),
                tx: watch::Sender::new(Vec::new()),
            })
            .collect();
        Self {
            config,
            metrics,
            state: watch::Sender::new(Arc::new(NodeState::default())),
            lists,
            owners: None,
            ledger,
        }
    }

    /// At the first publish, which devices each resource owns when pairs took some away from
    /// `rdma/hca` or the GPU resource (fewer HCAs than discovered would otherwise puzzle); later,
    /// every device that changes owner.
    fn log_ownership(&mut self, inventory: &Inventory) {
        let cfg = &self.config;
        let name = |kind: ResourceKind| kind.resource_name(cfg).to_string();
        let part = Partition::new(inventory, cfg);
        let owners = part.owners();
        match &self.owners {
            None if part.moved_any() => {
                let [(_, hcas), (_, gpus), (_, pairs)] = part.summary();
                tracing::info!(
                    hca_resource = %name(ResourceKind::Hca), ?hcas,
                    gpu_resource = %name(ResourceKind::Gpu), gpu_enabled = cfg.gpu.enabled, ?gpus,
                    pair_resource = %name(ResourceKind::GpuHca), ?pairs,
                    "device ownership: each GPU's rail HCA and the GPU are served only as a pair"
                );
            }
            None => {}
            Some(before) => {
                for (device, from, to) in ownership::moves(before, &owners) {
                    tracing::warn!(%device, from = %name(from), to = %name(to),
                        "device changed owner (a rail HCA appeared or vanished); containers \
                         granted it through the old resource still hold it");
                }
            }
        }
        self.owners = Some(owners);
    }

    /// Recompute everything; each channel is notified only when its content changed.
    fn publish(&mut self, inventory: &Inventory, view: &FabricView) {
        self.log_ownership(inventory);
        let mut gated = view.gate(inventory);
        if let Some(ledger) = &self.ledger {
            // Devices a DRA claim holds: Unhealthy here, so the kubelet grants them to no pod.
            let claimed = ledger.claimed();
            for hca in gated.hcas.iter_mut().filter(|h| claimed.contains(&h.id)) {
                hca.health = Health::Unhealthy;
            }
            for gpu in gated
                .gpus
                .iter_mut()
                .filter(|g| claimed.contains(&g.pci_address))
            {
                gpu.health = Health::Unhealthy;
            }
        }
        for list in &mut self.lists {
            let devices = with_departed(
                allocation::advertised(list.kind, &gated, &self.config),
                &mut list.known,
            );
            let resource = list.kind.resource_name(&self.config).to_string();
            let unhealthy = devices
                .iter()
                .filter(|d| d.health != Health::Healthy.as_str())
                .count();
            let healthy = devices.len() - unhealthy;
            for (health, n) in [(Health::Healthy, healthy), (Health::Unhealthy, unhealthy)] {
                let labels = ServeMetrics::labels(&resource, "health", health.as_str());
                self.metrics
                    .devices
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            list.tx.send_if_modified(|current| {
                if *current == devices {
                    return false;
                }
                tracing::info!(%resource, devices = devices.len(), unhealthy, "device list changed");
                *current = devices;
                true
            });
        }
        let state = NodeState {
            inventory: gated,
            traffic_class: view.effective_traffic_class(&self.config),
        };
        self.state.send_if_modified(|current| {
            if **current == state {
                return false;
            }
            *current = Arc::new(state);
            true
        });
    }

    fn backend(
        &self,
        list: &DeviceList,
        dev_root: &Path,
        host_dev_root: &Path,
    ) -> Arc<ResourceBackend> {
        Arc::new(ResourceBackend {
            kind: list.kind,
            name: list.kind.resource_name(&self.config).to_string(),
            config: Arc::clone(&self.config),
            dev_root: dev_root.to_path_buf(),
            host_dev_root: host_dev_root.to_path_buf(),
            metrics: Arc::clone(&self.metrics),
            state: self.state.subscribe(),
            devices: list.tx.subscribe(),
            ledger: self.ledger.clone(),
        })
    }
}

/// One resource's [`DeviceBackend`] over the published state and the pure allocation module.
pub struct ResourceBackend {
    kind: ResourceKind,
    name: String,
    config: Arc<Config>,
    dev_root: PathBuf,
    host_dev_root: PathBuf,
    metrics: Arc<ServeMetrics>,
    state: watch::Receiver<Arc<NodeState>>,
    devices: watch::Receiver<Vec<pb::Device>>,
    ledger: Option<Arc<Ledger>>,
}

impl ResourceBackend {
    fn node_state(&self) -> Arc<NodeState> {
        Arc::clone(&self.state.borrow())
    }

    /// Device nodes of `alloc` that do not exist under the dev root (`/dev/x` -> `<dev root>/x`).
    fn missing_device_nodes(&self, alloc: &ContainerAllocation) -> Vec<String> {
        alloc
            .devices
            .iter()
            .filter(|d| {
                let relative = d.host_path.strip_prefix("/dev/").unwrap_or(&d.host_path);
                !self.dev_root.join(relative).exists()
            })
            .map(|d| d.host_path.clone())
            .collect()
    }
}

impl DeviceBackend for ResourceBackend {
    fn resource_name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> watch::Receiver<Vec<pb::Device>> {
        self.devices.clone()
    }

    fn preferred_allocation(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, BackendError> {
        let state = self.node_state();
        Ok(allocation::preferred(
            self.kind,
            &state.inventory,
            &self.config,
            available,
            must_include,
            size,
        ))
    }

    fn allocate(
        &self,
        device_ids: &[String],
    ) -> Result<pb::ContainerAllocateResponse, BackendError> {
        let state = self.node_state();
        let result = allocation::allocate(
            self.kind,
            &state.inventory,
            &self.config,
            state.traffic_class,
            device_ids,
        );
        // `both` mode: the grant is recorded in the ledger, unless a DRA claim holds a device.
        let claimed = match (&result, &self.ledger) {
            (Ok(_), Some(ledger)) => {
                let devices = device_ids
                    .iter()
                    .flat_map(|id| ownership::devices_behind(self.kind, id))
                    .map(str::to_string)
                    .collect();
                ledger
                    .grant(&self.name, &devices, std::time::Instant::now())
                    .err()
            }
            _ => None,
        };
        if let Some(conflict) = claimed {
            let labels = ServeMetrics::labels(&self.name, "result", "claimed_by_dra");
            self.metrics.allocations.get_or_create(&labels).inc();
            return Err(BackendError::InvalidRequest(format!(
                "{}: {conflict}",
                self.name
            )));
        }
        let outcome = match &result {
            Ok(_) => "success",
            Err(allocation::AllocateError::UnknownDevice { .. }) => "unknown_device",
            Err(allocation::AllocateError::NotOwned { .. }) => "not_owned",
            Err(_) => "failed",
        };
        let labels = ServeMetrics::labels(&self.name, "result", outcome);
        self.metrics.allocations.get_or_create(&labels).inc();
        let alloc = result.map_err(|e| match e {
            allocation::AllocateError::UnknownDevice { resource, id } => {
                BackendError::UnknownDevice { resource, id }
            }
            e @ allocation::AllocateError::NotOwned { .. } => {
                BackendError::InvalidRequest(e.to_string())
            }
            other => BackendError::Failed(other.to_string()),
        })?;
        let missing = self.missing_device_nodes(&alloc);
        if !missing.is_empty() {
            tracing::warn!(resource = %self.name, ?missing, dev_root = %self.dev_root.display(),
                "granted device nodes are missing on this host; the container may fail to start");
        }
        Ok(to_proto(alloc.with_host_dev_root(&self.host_dev_root)))
    }
}

/// The kubelet form of a container's allocation.
pub fn to_proto(alloc: ContainerAllocation) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: alloc.envs,
        mounts: alloc
            .mounts
            .into_iter()
            .map(|m| pb::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: alloc
            .devices
            .into_iter()
            .map(|d| pb::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: alloc.annotations,
        cdi_devices: Vec::new(),
    }
}

/// Where discovery reads from.
#[derive(Clone, Debug)]
pub struct Sources {
    pub sysfs: PathBuf,
    pub proc: Option<PathBuf>,
    pub dev: PathBuf,
}

/// Discovery on the blocking pool. A GPU whose `/dev/nvidiaN` is missing is Unhealthy: the
/// container it would be granted to could not start.
pub async fn discover(sources: &Sources, config: &Config) -> Result<Inventory, String> {
    let sources = sources.clone();
    let selector = config.hca.selector.clone();
    let soft_roce = config.soft_roce;
    let found = tokio::task::spawn_blocking(move || {
        let mut inv = inventory::discover_with(&sources.sysfs, sources.proc.as_deref(), &selector)?;
        soft_roce.apply(&mut inv);
        for gpu in &mut inv.gpus {
            let node = sources.dev.join(format!("nvidia{}", gpu.index));
            if gpu.health == Health::Healthy && !node.exists() {
                tracing::debug!(pci_address = %gpu.pci_address, node = %node.display(),
                    "GPU device node missing: listed Unhealthy");
                gpu.health = Health::Unhealthy;
            }
        }
        Ok::<_, inventory::DiscoverError>(inv)
    });
    match found.await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(join) => Err(format!("discovery task failed: {join}")),
    }
}

/// Completes once `stopping` is `true` (or its sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// The poll task: rediscover every interval and on every view change, then publish.
async fn poll_loop(
    mut publisher: Publisher,
    sources: Sources,
    mut inventory: Inventory,
    mut view_rx: watch::Receiver<FabricView>,
    mut stopping: watch::Receiver<bool>,
) {
    let config = Arc::clone(&publisher.config);
    let mut ticks = tokio::time::interval(config.poll_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.reset(); // the first discovery already ran
    let mut view = view_rx.borrow_and_update().clone();
    let mut view_open = true;
    let mut ledger_changes = publisher.ledger.as_ref().map(|l| l.changes());
    loop {
        tokio::select! {
            // `both` mode: a claim prepared or unprepared changes which devices are listed.
            Some(()) = async {
                match ledger_changes.as_mut() {
                    Some(rx) => rx.changed().await.ok(),
                    None => std::future::pending().await,
                }
            } => {}
            _ = ticks.tick() => match discover(&sources, &config).await {
                Ok(found) => inventory = found,
                Err(error) => {
                    publisher.metrics.discovery_failures.inc();
                    tracing::warn!(%error, "discovery failed; keeping the last inventory");
                }
            },
            changed = view_rx.changed(), if view_open => match changed {
                Ok(()) => {
                    view = view_rx.borrow_and_update().clone();
                    tracing::info!(?view, "fabric view changed");
                }
                Err(_) => {
                    tracing::debug!("fabric view producer ended; keeping the last view");
                    view_open = false;
                }
            },
            () = stopped(&mut stopping) => break,
        }
        publisher.publish(&inventory, &view);
    }
}

/// One resource under supervision.
struct Managed {
    backend: Arc<ResourceBackend>,
    socket_name: String,
    socket_path: PathBuf,
    server: Option<PluginServer>,
    /// Inode of the socket our server bound, to tell our socket from a replacement.
    socket_ino: Option<u64>,
    registration: Option<JoinHandle<u32>>,
    /// Since when this resource has been without an accepted registration (serving or not);
    /// cleared only when a registration succeeds.
    registering_since: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
}

impl Managed {
    fn name(&self) -> &str {
        self.backend.resource_name()
    }

    /// Whether our server runs and its socket is still the one it bound.
    fn intact(&self) -> bool {
        let on_disk = std::fs::metadata(&self.socket_path).ok().map(|m| m.ino());
        self.server.as_ref().is_some_and(PluginServer::is_running)
            && on_disk.is_some()
            && on_disk == self.socket_ino
    }
}

struct Supervisor {
    kubelet_socket: PathBuf,
    backoff: Backoff,
    start_attempts: u32,
    /// Set when a resource used up its start attempts: `run` ends with it.
    gave_up: Option<ServeError>,
    metrics: Arc<ServeMetrics>,
    resources: Vec<Managed>,
}

impl Supervisor {
    /// (Re)start a resource's server and, once it serves, register it.
    async fn start(&mut self, i: usize) {
        let m = &mut self.resources[i];
        if let Some(task) = m.registration.take() {
            if task.is_finished() {
                m.registering_since = None;
            }
            task.abort();
        }
        if let Some(server) = m.server.take() {
            server.stop().await;
        }
        m.socket_ino = None;
        match PluginServer::start(&m.socket_path, Arc::clone(&m.backend)).await {
            Ok(server) => {
                m.socket_ino = std::fs::metadata(&m.socket_path).ok().map(|md| md.ino());
                m.server = Some(server);
                m.failures = 0;
                m.retry_at = None;
                self.register(i);
            }
            Err(error) => {
                // A socket that cannot be bound (the plugin directory is gone) is unregistered too.
                m.registering_since.get_or_insert_with(Instant::now);
                m.failures = m.failures.saturating_add(1);
                if m.failures >= self.start_attempts {
                    self.gave_up.get_or_insert(ServeError::Start {
                        resource: m.name().to_string(),
                        attempts: m.failures,
                        source: error,
                    });
                    m.retry_at = None;
                    return;
                }
                let delay = self.backoff.delay(m.failures);
                tracing::error!(resource = %m.name(), %error, retry_in = ?delay,
                    "failed to start device plugin server");
                m.retry_at = Some(Instant::now() + delay);
            }
        }
    }

    /// (Re)register a serving resource in the background, retrying with backoff.
    fn register(&mut self, i: usize) {
        let m = &mut self.resources[i];
        if m.server.is_none() {
            return;
        }
        if let Some(task) = m.registration.take() {
            if task.is_finished() {
                // It succeeded (registration retries until it does): a new one starts the clock.
                m.registering_since = None;
            }
            task.abort();
        }
        // A registration still trying (or a server that failed to start) keeps its start: churn
        // must not postpone the exit.
        m.registering_since.get_or_insert_with(Instant::now);
        let request = registration::register_request(m.name(), &m.socket_name);
        let kubelet_socket = self.kubelet_socket.clone();
        let backoff = self.backoff;
        let metrics = Arc::clone(&self.metrics);
        m.registration = Some(tokio::spawn(async move {
            let resource = request.resource_name.clone();
            registration::register_with_backoff(&kubelet_socket, request, backoff, |outcome| {
                let result = outcome.map_or_else(|e| e.metric_label(), |()| "success");
                let labels = ServeMetrics::labels(&resource, "result", result);
                metrics.registrations.get_or_create(&labels).inc();
            })
            .await
        }));
    }

    /// React to directory events (already merged).
    async fn handle(&mut self, kubelet_restarted: bool, removed: &[String]) {
        if kubelet_restarted {
            self.metrics.kubelet_restarts.inc();
        }
        for i in 0..self.resources.len() {
            let m = &self.resources[i];
            let hit = removed.contains(&m.socket_name);
            if (kubelet_restarted || hit) && !m.intact() {
                tracing::info!(resource = %m.name(), kubelet_restarted, "socket gone; restarting server");
                self.start(i).await;
            } else if kubelet_restarted {
                tracing::info!(resource = %m.name(), "kubelet restarted; registering again");
                self.register(i);
            }
        }
    }

    /// A resource whose registration has been trying for longer than `limit`, and for how long.
    fn unregistered_longer_than(&mut self, limit: Duration) -> Option<(String, Duration)> {
        let now = Instant::now();
        for m in &mut self.resources {
            if m.registration.as_ref().is_some_and(JoinHandle::is_finished) {
                m.registering_since = None;
            }
            if let Some(since) = m.registering_since
                && now.duration_since(since) >= limit
            {
                return Some((m.name().to_string(), now.duration_since(since)));
            }
        }
        None
    }

    fn next_retry(&self) -> Option<Instant> {
        self.resources.iter().filter_map(|m| m.retry_at).min()
    }

    async fn retry_due(&mut self) {
        let now = Instant::now();
        for i in 0..self.resources.len() {
            if self.resources[i].retry_at.is_some_and(|t| t <= now) {
                self.start(i).await;
            }
        }
    }

    async fn shutdown(&mut self) {
        for m in &mut self.resources {
            if let Some(task) = m.registration.take() {
                task.abort();
            }
            if let Some(server) = m.server.take() {
                server.stop().await;
            }
        }
    }
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The watcher's next event; never completes without a watcher.
async fn next_event(watcher: &mut Option<DirWatcher>) -> Option<DirEvent> {
    match watcher {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// Sleep until `deadline`; never completes without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Run the daemon until `shutdown` completes. `fabric_view` drives the QoS gate and the traffic
/// class (see [`crate::fabric_view`]); pass [`crate::fabric_view::static_view`]'s receiver when no
/// agent is plugged in. Returns an error only for problems found before serving starts.
pub async fn run(
    options: ServeOptions,
    fabric_view: watch::Receiver<FabricView>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let ServeOptions {
        config,
        sysfs_root,
        dev_root,
        host_dev_root,
        proc_root,
        plugin_dir,
        kubelet_socket,
        node_name,
        ..
    } = options.clone();
    if !sysfs_root.is_dir() {
        return Err(ServeError::SysfsRoot { path: sysfs_root });
    }
    std::fs::create_dir_all(&plugin_dir).map_err(|source| ServeError::PluginDir {
        path: plugin_dir.clone(),
        source,
    })?;
    let stale =
        kubelet::remove_stale_sockets(&plugin_dir).map_err(|source| ServeError::PluginDir {
            path: plugin_dir.clone(),
            source,
        })?;
    for path in &stale {
        tracing::info!(socket = %path.display(), "removed stale socket of an earlier run");
    }
    // Watch before serving, so a kubelet restart during start-up is not missed.
    let mut watcher = Some(DirWatcher::start(&plugin_dir, &kubelet_socket)?);

    let config = Arc::new(config);
    let sources = Sources {
        sysfs: sysfs_root.clone(),
        proc: proc_root,
        dev: dev_root.clone(),
    };
    let inventory = match discover(&sources, &config).await {
        Ok(inventory) => inventory,
        Err(error) => {
            tracing::warn!(%error, "initial discovery failed; starting with no devices");
            Inventory::default()
        }
    };
    tracing::info!(node = node_name.as_deref().unwrap_or(""), hcas = inventory.hcas.len(),
        gpus = inventory.gpus.len(), plugin_dir = %plugin_dir.display(), "starting device plugin");
    let mut publisher = Publisher::new(
        Arc::clone(&config),
        Arc::clone(&options.metrics),
        options.ledger.clone(),
    );
    let mut view_rx = fabric_view;
    let view = view_rx.borrow_and_update().clone();
    publisher.publish(&inventory, &view);

    let mut supervisor = Supervisor {
        kubelet_socket: kubelet_socket.clone(),
        backoff: options.registration_backoff,
        start_attempts: options.start_attempts,
        gave_up: None,
        metrics: Arc::clone(&options.metrics),
        resources: publisher
            .lists
            .iter()
            .map(|list| {
                let backend = publisher.backend(list, &dev_root, &host_dev_root);
                let socket_name = kubelet::socket_file_name(backend.resource_name());
                Managed {
                    backend,
                    socket_path: plugin_dir.join(&socket_name),
                    socket_name,
                    server: None,
                    socket_ino: None,
                    registration: None,
                    registering_since: None,
                    failures: 0,
                    retry_at: None,
                }
            })
            .collect(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = tokio::spawn(poll_loop(publisher, sources, inventory, view_rx, stop_rx));

    for i in 0..supervisor.resources.len() {
        supervisor.start(i).await;
    }

    let mut kubelet_ino = inode(&kubelet_socket);
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
                // Merge everything already queued: a kubelet restart deletes our sockets and
                // then creates kubelet.sock, and one pass should handle it all.
                let mut kubelet_restarted = false;
                let mut removed = Vec::new();
                for e in std::iter::once(event).chain(std::iter::from_fn(|| w.try_next())) {
                    match e {
                        DirEvent::KubeletSocketCreated => kubelet_restarted = true,
                        DirEvent::OwnSocketRemoved(name) => removed.push(name),
                    }
                }
                if kubelet_restarted {
                    kubelet_ino = inode(&kubelet_socket);
                    tracing::info!(socket = %kubelet_socket.display(), "kubelet socket created");
                }
                supervisor.handle(kubelet_restarted, &removed).await;
            }
            () = sleep_until(retry_at) => supervisor.retry_due().await,
            _ = liveness.tick() => {
                if watcher.is_none() {
                    match DirWatcher::start(&plugin_dir, &kubelet_socket) {
                        Ok(w) => watcher = Some(w),
                        Err(error) => tracing::error!(%error, "cannot watch the plugin directory again"),
                    }
                }
                let now_ino = inode(&kubelet_socket);
                let kubelet_restarted = now_ino.is_some() && now_ino != kubelet_ino;
                kubelet_ino = now_ino;
                let broken: Vec<String> = supervisor
                    .resources
                    .iter()
                    .filter(|m| m.retry_at.is_none() && !m.intact())
                    .map(|m| m.socket_name.clone())
                    .collect();
                if kubelet_restarted || !broken.is_empty() {
                    tracing::warn!(kubelet_restarted, ?broken, "liveness check found a change inotify did not report");
                    supervisor.handle(kubelet_restarted, &broken).await;
                }
                if let Some((resource, waited)) = options
                    .exit_after_unregistered
                    .and_then(|limit| supervisor.unregistered_longer_than(limit))
                {
                    exit = Some(ServeError::Unregistered {
                        resource,
                        kubelet_socket: kubelet_socket.clone(),
                        waited,
                    });
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    fn adv(id: &str, health: Health, numa: Option<u32>) -> AdvertisedDevice {
        AdvertisedDevice {
            id: id.into(),
            health,
            numa_node: numa,
        }
    }

    #[test]
    fn departed_devices_stay_listed_unhealthy_until_they_return() {
        let mut known = BTreeMap::new();
        let first = with_departed(
            vec![
                adv("a", Health::Healthy, Some(0)),
                adv("b", Health::Healthy, Some(1)),
            ],
            &mut known,
        );
        assert_eq!(first.len(), 2);
        let second = with_departed(vec![adv("a", Health::Healthy, Some(0))], &mut known);
        assert_eq!(
            second,
            vec![
                kubelet::device("a", Health::Healthy, Some(0)),
                kubelet::device("b", Health::Unhealthy, Some(1)),
            ]
        );
        let third = with_departed(
            vec![
                adv("a", Health::Healthy, Some(0)),
                adv("b", Health::Healthy, Some(1)),
            ],
            &mut known,
        );
        assert_eq!(third, first);
    }
}
