//! The node QoS agent: the Kubernetes shell around [`apply`](super::apply).
//!
//! It watches its own `RoceNode` (named after the node). On every spec change (a new
//! `metadata.generation`), and every `--resync-interval` in between, it resolves the selected
//! interfaces (RoCE netdevs of the node's HCAs matching `spec.nicSelector`, from
//! [`inventory::discover`]), applies the QoS to each, and writes `status` with server-side apply
//! (field manager [`AGENT_FIELD_MANAGER`], status subresource): per-interface state and per-knob
//! outcomes, `QosApplied`/`Ready`/`Degraded`, `observedGeneration`, `fabricGeneration`,
//! `lastSyncTime`.
//!
//! Status is written after every pass, so `lastSyncTime` moves; the write rate is therefore
//! bounded by one per resync interval plus one per spec change (the agent's own status writes
//! do not trigger a pass: they keep the generation). A knob that held at the last pass for the
//! same generation and had to be written again is drift (a NIC reset, a reboot, a hand-run
//! `mlnx_qos`): it is corrected like any other difference, with a `DriftCorrected` Event and
//! `rocefabric_qos_drift_corrections_total`.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rocefabric_api::conditions::{self};
use rocefabric_api::constants::{AGENT_FIELD_MANAGER, condition, reason};
use rocefabric_api::{InterfaceStatus, RoceNode, RoceNodeStatus};
use rocefabric_input::shown;
use tokio::time::Instant;
use tracing::{debug, info, instrument, warn};

use rocefabric_runtime::{Backoff, Retry};

mod lossless;
mod status;
pub use lossless::*;
pub use status::*;

use super::apply::{self, Netlink, Outcome};
use super::default_route;
use super::driver_files::{NetdevFiles, RdmaPort, Roots};
use super::plan::Desired;
use rocefabric_node_model::inventory;
use rocefabric_node_model::model::PortState;

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("discovering the node's HCAs: {0}")]
    Discover(#[from] inventory::DiscoverError),
    #[error("writing RoceNode {node} status: {source}")]
    Status {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the RoceNode watch ended")]
    WatchEnded,
    #[error("a blocking task failed: {0}")]
    Task(String),
}

impl AgentError {
    /// Label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            AgentError::Discover(_) => "discover",
            AgentError::Status { .. } => "status",
            AgentError::WatchEnded => "watch",
            AgentError::Task(_) => "task",
        }
    }
}

/// Applies QoS to one interface. The real one speaks netlink; tests use in-memory devices.
pub trait NodeKernel: Send + Sync + 'static {
    fn apply(&self, files: &NetdevFiles, desired: &Desired) -> Result<Outcome, String>;

    /// Interfaces that carry a default route in the node's network namespace.
    fn default_route_netdevs(&self) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// Most bytes read from `/proc/net/route` or `/proc/net/ipv6_route`: a table, not an attribute
/// (about 128 bytes a route, so 16 KiB would cut a busy node's), but still bounded.
pub const ROUTE_TABLE_LIMIT: u64 = 64 << 20;

/// [`NodeKernel`] over fresh netlink sockets for each interface.
#[derive(Debug, Default)]
pub struct NetlinkKernel;

impl NodeKernel for NetlinkKernel {
    fn apply(&self, files: &NetdevFiles, desired: &Desired) -> Result<Outcome, String> {
        let mut netlink = Netlink::open().map_err(|e| format!("opening netlink sockets: {e}"))?;
        Ok(apply::apply(&mut netlink.kernel(), files, desired))
    }

    /// From `/proc/net`, which shows the reader's network namespace (the host's: the agent runs
    /// with `hostNetwork`).
    fn default_route_netdevs(&self) -> BTreeSet<String> {
        let read = |p: &str| {
            rocefabric_input::read::read_file(std::path::Path::new(p), ROUTE_TABLE_LIMIT)
                .unwrap_or_else(|error| {
                    warn!(%error, "cannot read the routing table; no interface is known to carry the default route");
                    String::new()
                })
        };
        default_route::default_route_netdevs(
            &read("/proc/net/route"),
            &read("/proc/net/ipv6_route"),
        )
    }
}

/// Agent metrics.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    /// Knobs found drifted and written back, per interface and knob.
    pub drift_corrections: Family<Vec<(&'static str, String)>, Counter>,
    /// Passes, by result (`success` or an error label).
    pub syncs: Family<Vec<(&'static str, String)>, Counter>,
    /// 1 when a knob holds on an interface, else 0.
    pub knob_holds: Family<Vec<(&'static str, String)>, Gauge>,
    /// 1 for the fabric of the node's RoceNode (`fabric` label): joins the node's counters to
    /// their fabric (`* on (node) group_left (fabric)`).
    pub node_fabric: Family<Vec<(&'static str, String)>, Gauge>,
}

impl AgentMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rocefabric_qos_drift_corrections",
            "QoS knobs found changed behind the agent's back and written back",
            self.drift_corrections.clone(),
        );
        registry.register(
            "rocefabric_qos_syncs",
            "QoS agent passes by result",
            self.syncs.clone(),
        );
        registry.register(
            "rocefabric_qos_knob_holds",
            "Whether a QoS knob holds on an interface (1) or not (0)",
            self.knob_holds.clone(),
        );
        registry.register(
            "rocefabric_qos_node_fabric",
            "1 for the fabric of this node's RoceNode",
            self.node_fabric.clone(),
        );
    }
}

/// What a pass needs.
pub struct AgentContext {
    pub client: Client,
    pub node_name: String,
    pub roots: Roots,
    pub kernel: Arc<dyn NodeKernel>,
    pub metrics: Arc<AgentMetrics>,
    pub recorder: Recorder,
    /// The interfaces the fabric counters are read from; replaced after each pass.
    pub counter_targets: Arc<RwLock<Vec<NetdevFiles>>>,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl AgentContext {
    pub fn new(
        client: Client,
        node_name: String,
        roots: Roots,
        kernel: Arc<dyn NodeKernel>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: AGENT_FIELD_MANAGER.to_string(),
                instance: Some(node_name.clone()),
            },
        );
        Self {
            client,
            node_name,
            roots,
            kernel,
            metrics: Arc::default(),
            recorder,
            counter_targets: Arc::default(),
        }
    }
}

/// One selected interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub files: NetdevFiles,
    /// RDMA port state (`ACTIVE`, `DOWN`).
    pub link_state: Option<String>,
}

fn port_state_text(state: PortState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{state:?}"))
}

/// The RoCE netdevs of the node's HCAs that `node.spec.nicSelector` selects, less those carrying
/// a default route (`default_route`) and virtual (Soft-RoCE) devices, unless the selector names
/// them: an rxe device left on a management or storage NIC must not get the fabric's QoS (nor turn
/// the node's QosApplied false) because an empty or vendor-wide selector caught it.
pub fn select_interfaces(
    roots: &Roots,
    node: &RoceNode,
    default_route: &BTreeSet<String>,
) -> Result<Vec<Selected>, inventory::DiscoverError> {
    let selector = &node.spec.nic_selector;
    let inv = inventory::discover(&roots.sysfs, selector)?;
    Ok(inv
        .hcas
        .into_iter()
        .filter_map(|h| {
            let Some(netdev) = h.netdev.clone() else {
                warn!(rdma_device = %shown(&h.name), "selected HCA has no netdev; no QoS to apply");
                return None;
            };
            let named =
                default_route::named_explicitly(selector, &netdev, &h.name, h.pci_address.as_deref());
            if default_route.contains(&netdev) && !named {
                warn!(netdev = %shown(&netdev), rdma_device = %shown(&h.name),
                    "not touching the node's default-route interface; name it in nicSelector to configure it");
                return None;
            }
            if h.is_virtual() && !named {
                debug!(%netdev, rdma_device = %h.name,
                    "not touching a virtual RDMA device's netdev; name it in nicSelector to configure it");
                return None;
            }
            let files = NetdevFiles::known(
                roots,
                &netdev,
                h.pci_address.clone(),
                Some(RdmaPort {
                    device: h.name.clone(),
                    port: h.port,
                    is_virtual: h.is_virtual(),
                }),
            );
            Some(Selected {
                files,
                link_state: Some(port_state_text(h.state)),
            })
        })
        .collect())
}

/// One pass: select, apply, report drift, write status. Returns the status written.
#[instrument(skip_all, fields(node = %ctx.node_name, generation = ?node.metadata.generation))]
pub async fn reconcile(
    ctx: &AgentContext,
    node: &RoceNode,
    now: Time,
) -> Result<RoceNodeStatus, AgentError> {
    ctx.metrics.node_fabric.clear();
    ctx.metrics
        .node_fabric
        .get_or_create(&vec![("fabric", node.spec.fabric.clone())])
        .set(1);
    if node.spec.pending {
        let status = pending_status(node, &now);
        write_status(ctx, &status).await?;
        info!("rollout pending: nothing applied");
        return Ok(status);
    }
    let desired = Desired::from_spec(&node.spec.qos);
    let roots = ctx.roots.clone();
    let kernel = ctx.kernel.clone();
    let target = node.clone();
    let wanted = desired.clone();
    let results: Vec<(Selected, Result<Outcome, String>)> =
        tokio::task::spawn_blocking(move || {
            let selected = select_interfaces(&roots, &target, &kernel.default_route_netdevs())?;
            Ok::<_, AgentError>(
                selected
                    .into_iter()
                    .map(|s| {
                        let outcome = kernel.apply(&s.files, &wanted);
                        (s, outcome)
                    })
                    .collect(),
            )
        })
        .await
        .map_err(|e| AgentError::Task(e.to_string()))??;

    let mut interfaces = Vec::with_capacity(results.len());
    for (sel, outcome) in &results {
        let status = match outcome {
            Ok(o) => o.interface_status(&sel.files, sel.link_state.clone()),
            Err(e) => InterfaceStatus {
                netdev: sel.files.netdev.clone(),
                rdma_device: sel.files.rdma.as_ref().map(|r| r.device.clone()),
                pci_address: sel.files.pci_address.clone(),
                is_virtual: sel.files.is_virtual(),
                link_state: sel.link_state.clone(),
                knobs: failed_knobs(&desired, e),
                ..Default::default()
            },
        };
        for k in &status.knobs {
            let labels = vec![
                ("interface", status.netdev.clone()),
                ("knob", knob_name(k.knob)),
            ];
            ctx.metrics
                .knob_holds
                .get_or_create(&labels)
                .set(i64::from(k.outcome.holds()));
        }
        interfaces.push(status);
    }
    interfaces.sort_by(|a, b| a.netdev.cmp(&b.netdev));
    if let Ok(mut t) = ctx.counter_targets.write() {
        *t = results.iter().map(|(s, _)| s.files.clone()).collect();
    }

    let drift = drifted(node, &interfaces);
    if !drift.is_empty() {
        for (netdev, knob) in &drift {
            let labels = vec![("interface", netdev.clone()), ("knob", knob_name(*knob))];
            ctx.metrics.drift_corrections.get_or_create(&labels).inc();
        }
        let note = drift
            .iter()
            .map(|(n, k)| format!("{n} {}", knob_name(*k)))
            .collect::<Vec<_>>()
            .join(", ");
        info!(drift = %note, "corrected QoS drift");
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: reason::DRIFT_CORRECTED.to_string(),
            note: Some(format!("QoS had drifted and was written back: {note}")),
            action: "ApplyQos".to_string(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &node.object_ref(&())).await {
            warn!(%error, "failed to publish the DriftCorrected event");
        }
    }

    let status = node_status(node, interfaces, &now);
    write_status(ctx, &status).await?;
    info!(
        interfaces = status.interfaces.len(),
        qos_applied = conditions::is_true(&status.conditions, condition::QOS_APPLIED, None),
        "status written"
    );
    Ok(status)
}

/// Server-side apply of this node's RoceNode status.
async fn write_status(ctx: &AgentContext, status: &RoceNodeStatus) -> Result<(), AgentError> {
    let api: Api<RoceNode> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
    api.patch_status(&ctx.node_name, &params, &Patch::Apply(status_patch(status)))
        .await
        .map_err(|source| AgentError::Status {
            node: ctx.node_name.clone(),
            source,
        })?;
    Ok(())
}

/// `(uid, generation)`: a pass is due when it changes.
fn spec_key(node: &RoceNode) -> (Option<String>, Option<i64>) {
    (node.metadata.uid.clone(), node.metadata.generation)
}

/// The delays between failed passes: 1s, 2s, 4s, ... capped at the resync interval.
pub fn retry_backoff(resync: Duration) -> Backoff {
    Backoff::new(Duration::from_secs(1), resync)
}

/// Watch the node's RoceNode and run passes until `shutdown` completes.
pub async fn run(
    ctx: Arc<AgentContext>,
    resync: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let api: Api<RoceNode> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={}", ctx.node_name));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut node: Option<RoceNode> = None;
    let mut listing: Option<Option<RoceNode>> = None;
    // The spec last passed over (successfully or not): a new one is applied at once, the same
    // one again only at the next resync or retry.
    let mut attempted: Option<(Option<String>, Option<i64>)> = None;
    let mut due: Option<Instant> = None;
    let mut retry = Retry::new(retry_backoff(resync));
    tokio::pin!(shutdown);
    info!(node = %ctx.node_name, resync = ?resync, "QoS agent started");
    loop {
        let wait = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            event = stream.try_next() => {
                match event {
                    Ok(Some(Event::Init)) => listing = Some(None),
                    Ok(Some(Event::InitApply(n))) => listing = Some(Some(n)),
                    Ok(Some(Event::InitDone)) => node = listing.take().flatten(),
                    Ok(Some(Event::Apply(n))) => node = Some(n),
                    Ok(Some(Event::Delete(_))) => node = None,
                    Ok(None) => return Err(AgentError::WatchEnded),
                    Err(error) => warn!(%error, "watching the RoceNode failed; retrying"),
                }
                if listing.is_some() {
                    continue;
                }
                match &node {
                    Some(n) if Some(spec_key(n)) != attempted => due = Some(Instant::now()),
                    Some(_) => {}
                    None => {
                        if attempted.take().is_some() {
                            info!("RoceNode gone; idle until it returns");
                        }
                        due = None;
                        if let Ok(mut t) = ctx.counter_targets.write() {
                            t.clear();
                        }
                    }
                }
            }
            () = wait => {
                let Some(n) = node.clone() else { due = None; continue };
                attempted = Some(spec_key(&n));
                match reconcile(&ctx, &n, Time(Timestamp::now())).await {
                    Ok(_) => {
                        retry.reset();
                        ctx.metrics.syncs.get_or_create(&vec![("result", "success".to_string())]).inc();
                        due = Some(Instant::now() + resync);
                    }
                    Err(error) => {
                        let delay = retry.next_delay();
                        warn!(%error, retry_in = ?delay, "QoS pass failed");
                        ctx.metrics.syncs.get_or_create(&vec![("result", error.metric_label().to_string())]).inc();
                        due = Some(Instant::now() + delay);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
