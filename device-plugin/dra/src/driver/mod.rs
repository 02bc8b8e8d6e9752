//! DRA mode's loop: the [`NodeDriver`] that prepares and unprepares claims, the two sockets the
//! kubelet talks to, and the node's `ResourceSlice` kept in step with the inventory, the fabric
//! view and device plugin grants (ours in `both` mode; the GPU resource's, NVIDIA's, wherever
//! GPUs are published).

mod run;

pub use run::{DraInputs, run};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{Mutex, watch};

use super::checkpoint::{
    self, Checkpoint, CheckpointError, ClaimRecord, ClaimState, PreparedDevice,
};
use super::devices::{self, Held, Listing};
use super::ledger::Ledger;
use super::prepare::{self, ClaimRef};
use super::{CHECKPOINT_FILE_NAME, DRA_SOCKET_NAME, REGISTRATION_SOCKET_NAME, cdi, pod_resources};
use rocefabric_kubelet_api::dra::Preparer;
use rocefabric_kubelet_api::pb_dra_v1::{
    Claim, Device, NodePrepareResourceResponse, NodeUnprepareResourceResponse,
};
use rocefabric_kubelet_api::socket::SocketError;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_model::model::Inventory;

type Labels = Vec<(&'static str, String)>;

/// What the DRA driver counts, for `/metrics`.
#[derive(Debug, Default)]
pub struct DraMetrics {
    /// NodePrepareResources per claim, by result (`success`, `failed`).
    pub prepares: Family<Labels, Counter>,
    /// NodeUnprepareResources per claim, by result.
    pub unprepares: Family<Labels, Counter>,
    /// Devices in the slice (`state="published"`) and left out (`state="withdrawn"`, `reason`).
    pub devices: Family<Labels, Gauge>,
    /// ResourceSlice writes (create or replace).
    pub slice_writes: Counter,
    /// Claims in the checkpoint.
    pub prepared_claims: Gauge,
    /// 1 while device plugin grants are known (the pod resources API was read, or is not read
    /// at all), 0 while they are not and the devices a device plugin may hold are withheld.
    pub grants_known: Gauge,
}

impl DraMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rocefabric_dra_prepares",
            "NodePrepareResources calls per claim, by result",
            self.prepares.clone(),
        );
        registry.register(
            "rocefabric_dra_unprepares",
            "NodeUnprepareResources calls per claim, by result",
            self.unprepares.clone(),
        );
        registry.register(
            "rocefabric_dra_devices",
            "Devices in the node's ResourceSlice (published) and withdrawn from it, by reason",
            self.devices.clone(),
        );
        registry.register(
            "rocefabric_dra_slice_writes",
            "ResourceSlice creates and replaces",
            self.slice_writes.clone(),
        );
        registry.register(
            "rocefabric_dra_device_plugin_grants_known",
            "1 while the device plugin's grants are known; 0 while the devices it serves are withheld",
            self.grants_known.clone(),
        );
        registry.register(
            "rocefabric_dra_prepared_claims",
            "Claims prepared on this node (checkpoint records)",
            self.prepared_claims.clone(),
        );
    }

    fn result(family: &Family<Labels, Counter>, ok: bool) {
        let result = if ok { "success" } else { "failed" };
        family
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    fn listing(&self, listing: &Listing) {
        self.devices.clear();
        let published = vec![("state", "published".to_string())];
        self.devices
            .get_or_create(&published)
            .set(i64::try_from(listing.published.len()).unwrap_or(i64::MAX));
        for (_, why) in &listing.withdrawn {
            let labels = vec![
                ("state", "withdrawn".to_string()),
                ("reason", why.as_str().to_string()),
            ];
            self.devices.get_or_create(&labels).inc();
        }
    }
}

/// Where the driver finds things and what it publishes.
#[derive(Clone, Debug)]
pub struct DraOptions {
    /// The driver's directory (`dra.sock`, `checkpoint.json`), as the kubelet sees it too.
    pub plugin_dir: PathBuf,
    /// The kubelet's `plugins_registry`.
    pub registry_dir: PathBuf,
    /// Where CDI specs are written.
    pub cdi_dir: PathBuf,
    /// The kubelet's pod resources socket, to learn device plugin grants: ours in `both` mode,
    /// and the GPU resource's plugin's (NVIDIA's) whenever GPUs are published. With it, the
    /// ledger must start as [`Ledger::awaiting_grants`]: nothing a device plugin may hold is
    /// published or prepared before the first answer.
    pub pod_resources_socket: Option<PathBuf>,
    /// Whether our device plugin serves beside the driver (`both` mode).
    pub device_plugin: bool,
    /// This node: the pool's name.
    pub node_name: String,
    /// Where the runtime finds device nodes (the host path in CDI specs).
    pub host_dev_root: PathBuf,
    /// Whether GPUs are published (off where another driver serves them).
    pub publish_gpus: bool,
    /// Test hook: sleep this long after the `preparing` record is written, so a test can kill
    /// the daemon in the middle of a prepare.
    pub pause_after_checkpoint: Option<Duration>,
    pub metrics: Arc<DraMetrics>,
}

impl DraOptions {
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET_NAME)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(REGISTRATION_SOCKET_NAME)
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.plugin_dir.join(CHECKPOINT_FILE_NAME)
    }
}

/// Where a claim comes from (the API server; a map in tests).
pub trait ClaimSource: Send + Sync + 'static {
    fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;
}

impl<T: ClaimSource> ClaimSource for Arc<T> {
    fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send {
        (**self).claim(namespace, name)
    }
}

impl ClaimSource for kube::Client {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        kube::Api::<ResourceClaim>::namespaced(self.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| format!("cannot read ResourceClaim {namespace}/{name}: {e}"))
    }
}

/// Hold the checkpoint's claims in `ledger` (at start in `both` mode, before the device plugin
/// serves a single Allocate).
pub fn restore_ledger(checkpoint_path: &Path, ledger: &Ledger) -> Result<(), CheckpointError> {
    hold_claims(&checkpoint::load(checkpoint_path)?, ledger);
    Ok(())
}

/// Every claim of `checkpoint` holds its devices in `ledger`.
fn hold_claims(checkpoint: &Checkpoint, ledger: &Ledger) {
    for (uid, record) in &checkpoint.claims {
        let devices = owned_devices(&record.devices);
        ledger.restore_claim(uid, &record.claim(), devices);
        tracing::info!(claim = %record.claim(), %uid, state = ?record.state, "claim from the checkpoint");
    }
}

/// What prepares read: the discovered inventory and the traffic class for workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub inventory: Inventory,
    pub traffic_class: Option<u8>,
}

/// Why the driver cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot serve {path}: {source}")]
    PluginDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("cannot clean CDI directory {path}: {source}")]
    CdiDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Prepares and unprepares claims: the checkpoint, the CDI specs and the ledger.
pub struct NodeDriver<C> {
    claims: C,
    options: DraOptions,
    config: Arc<Config>,
    ledger: Arc<Ledger>,
    view: watch::Receiver<Arc<NodeView>>,
    /// The checkpoint as on disk; the lock serializes prepares and unprepares.
    checkpoint: Mutex<Checkpoint>,
}

impl<C: ClaimSource> NodeDriver<C> {
    /// Load the checkpoint, hold its claims' devices in the ledger and remove CDI specs no record
    /// names.
    pub fn new(
        claims: C,
        options: DraOptions,
        config: Arc<Config>,
        ledger: Arc<Ledger>,
        view: watch::Receiver<Arc<NodeView>>,
    ) -> Result<Self, DraError> {
        let checkpoint = checkpoint::load(&options.checkpoint_path())?;
        hold_claims(&checkpoint, &ledger);
        options
            .metrics
            .grants_known
            .set(i64::from(ledger.grants_known()));
        std::fs::create_dir_all(&options.plugin_dir).map_err(|source| DraError::PluginDir {
            path: options.plugin_dir.clone(),
            source,
        })?;
        let cdi_err = |source| DraError::CdiDir {
            path: options.cdi_dir.clone(),
            source,
        };
        for uid in cdi::spec_claims(&options.cdi_dir).map_err(cdi_err)? {
            if !checkpoint.claims.contains_key(&uid) {
                tracing::warn!(%uid, "removing a CDI spec no checkpoint record names");
                cdi::remove_spec(&options.cdi_dir, &uid).map_err(cdi_err)?;
            }
        }
        Ok(Self {
            claims,
            options,
            config,
            ledger,
            view,
            checkpoint: Mutex::new(checkpoint),
        })
    }

    fn save(&self, checkpoint: &Checkpoint) -> Result<(), String> {
        checkpoint::save(&self.options.checkpoint_path(), checkpoint).map_err(|e| e.to_string())?;
        self.options
            .metrics
            .prepared_claims
            .set(i64::try_from(checkpoint.claims.len()).unwrap_or(i64::MAX));
        Ok(())
    }

    /// Ask the kubelet which device plugin grants live pods hold (when a pod resources socket is
    /// given). Fails closed: while the answer is unknown, every device a device plugin may have
    /// granted counts as held.
    pub async fn refresh_grants(&self) {
        let Some(socket) = &self.options.pod_resources_socket else {
            return;
        };
        match rocefabric_kubelet_api::pod_resources::list(socket).await {
            Ok(grants) => {
                if !self.ledger.grants_known() {
                    tracing::info!("device plugin grants known again");
                }
                let inventory = Arc::clone(&self.view.borrow());
                self.ledger.set_live(
                    pod_resources::held_devices(&self.config, &inventory.inventory, &grants),
                    std::time::Instant::now(),
                );
                self.options.metrics.grants_known.set(1);
            }
            Err(error) => {
                tracing::warn!(%error,
                    "device plugin grants unknown: withholding every device a device plugin may hold");
                self.ledger.grants_lost();
                self.options.metrics.grants_known.set(0);
            }
        }
    }

    /// The devices withheld because a device plugin may have granted them without our knowing:
    /// while grants are unknown, every GPU and (in `both` mode) what our device plugin serves;
    /// none otherwise.
    pub fn withheld(&self, inventory: &Inventory) -> BTreeSet<String> {
        if self.ledger.grants_known() {
            BTreeSet::new()
        } else {
            pod_resources::may_be_granted(inventory, &self.config, self.options.device_plugin)
        }
    }

    /// What device plugins hold or may hold now: the ledger's live and pending grants, and what
    /// is withheld while grants are unknown.
    pub fn held(&self, inventory: &Inventory) -> Held {
        Held {
            granted: self.ledger.granted(std::time::Instant::now()),
            unknown: self.withheld(inventory),
        }
    }

    /// The node's devices as the slice lists them: published, or withdrawn with the reason.
    pub fn listing(&self, inventory: &Inventory, view: &FabricView) -> Listing {
        let held = self.held(inventory);
        devices::listing(inventory, view, self.options.publish_gpus, &held)
    }

    /// The answer of a claim already prepared (its record says so and its spec is on disk).
    fn prepared(&self, checkpoint: &Checkpoint, claim: &ClaimRef) -> Option<Vec<Device>> {
        let spec_path = self.options.cdi_dir.join(cdi::spec_file_name(&claim.uid));
        checkpoint
            .claims
            .get(&claim.uid)
            .filter(|record| record.state == ClaimState::Prepared && spec_path.exists())
            .map(answer)
    }

    /// Prepare one claim. The network calls (the ResourceClaim GET, the pod resources List) run
    /// before the checkpoint lock is taken, so a hung call never stalls another claim's prepare or
    /// any unprepare; what they learned is checked again under the lock.
    async fn prepare_one(&self, claim: &ClaimRef) -> Result<Vec<Device>, String> {
        if let Some(devices) = self.prepared(&*self.checkpoint.lock().await, claim) {
            tracing::debug!(%claim, "already prepared");
            return Ok(devices);
        }
        let object = self.claims.claim(&claim.namespace, &claim.name).await?;
        let pool = &self.options.node_name;
        let allocated = prepare::allocated(&object, claim, pool).map_err(|e| e.to_string())?;
        let view = Arc::clone(&self.view.borrow());
        let node = prepare::Node {
            pool,
            inventory: &view.inventory,
            traffic_class: view.traffic_class,
            host_dev_root: &self.options.host_dev_root,
        };
        let plan = prepare::plan(claim, &allocated, &node).map_err(|e| e.to_string())?;
        self.refresh_grants().await;

        let mut checkpoint = self.checkpoint.lock().await;
        if let Some(devices) = self.prepared(&checkpoint, claim) {
            tracing::debug!(%claim, "prepared meanwhile");
            return Ok(devices);
        }
        let physical = owned_devices(&plan.devices);
        if let Some(device) = self
            .withheld(&view.inventory)
            .intersection(&physical)
            .next()
        {
            return Err(format!(
                "claim {claim}: device {device} may be held by a device plugin grant: the \
                 kubelet's pod resources API cannot be read; retry once it can"
            ));
        }
        self.ledger
            .take_for_claim(
                &claim.uid,
                &claim.to_string(),
                &physical,
                std::time::Instant::now(),
            )
            .map_err(|e| format!("claim {claim}: {e}"))?;
        let mut record = ClaimRecord {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: ClaimState::Preparing,
            devices: plan.devices,
            whole_claim: plan.whole_claim,
        };
        let had_record = checkpoint.claims.contains_key(&claim.uid);
        if let Err(error) = self.commit(&mut checkpoint, &claim.uid, Some(record.clone())) {
            if !had_record {
                self.ledger.release_claim(&claim.uid);
            }
            return Err(error);
        }
        if let Some(pause) = self.options.pause_after_checkpoint {
            tracing::warn!(%claim, ?pause, "test hook: pausing mid-prepare");
            tokio::time::sleep(pause).await;
        }
        let spec_path = self.options.cdi_dir.join(cdi::spec_file_name(&claim.uid));
        cdi::write_spec(&self.options.cdi_dir, &claim.uid, &plan.spec)
            .map_err(|e| format!("cannot write CDI spec {}: {e}", spec_path.display()))?;
        record.state = ClaimState::Prepared;
        // On failure the record stays `preparing`, on disk and here: the kubelet's retry
        // completes it.
        self.commit(&mut checkpoint, &claim.uid, Some(record.clone()))?;
        tracing::info!(%claim, uid = %claim.uid,
            devices = ?record.devices.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), "prepared");
        Ok(answer(&record))
    }

    /// Set claim `uid`'s record (`None`: remove it) on disk first, then in memory: memory never
    /// says what the disk does not. On a failed save both keep the previous state.
    fn commit(
        &self,
        checkpoint: &mut Checkpoint,
        uid: &str,
        record: Option<ClaimRecord>,
    ) -> Result<(), String> {
        let mut next = checkpoint.clone();
        match record {
            Some(record) => next.claims.insert(uid.to_string(), record),
            None => next.claims.remove(uid),
        };
        self.save(&next)?;
        *checkpoint = next;
        Ok(())
    }

    /// Unprepare one claim: the spec, then the record, then the ledger. Needs no API call; a
    /// failed checkpoint save keeps the claim (and its devices) everywhere, and the kubelet
    /// retries.
    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), String> {
        let mut checkpoint = self.checkpoint.lock().await;
        cdi::remove_spec(&self.options.cdi_dir, &claim.uid)
            .map_err(|e| format!("cannot remove the CDI spec of claim {claim}: {e}"))?;
        if checkpoint.claims.contains_key(&claim.uid) {
            self.commit(&mut checkpoint, &claim.uid, None)
                .map_err(|e| format!("claim {claim} stays prepared: {e}"))?;
            tracing::info!(%claim, uid = %claim.uid, "unprepared");
        }
        self.ledger.release_claim(&claim.uid);
        Ok(())
    }
}

/// The physical devices a claim owns: all but those it reaches with `adminAccess`.
fn owned_devices(devices: &[PreparedDevice]) -> BTreeSet<String> {
    devices
        .iter()
        .filter(|d| d.owned())
        .map(|d| d.physical.clone())
        .collect()
}

/// The kubelet's answer for a record: its devices, then the whole-claim entry (last, so its
/// environment is the one a container given the whole claim keeps).
pub fn answer(record: &ClaimRecord) -> Vec<Device> {
    let devices = record.devices.iter().map(|d| Device {
        request_names: d.request_names.clone(),
        pool_name: d.pool.clone(),
        device_name: d.device.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
    });
    let whole_claim = record.whole_claim.iter().map(|w| Device {
        request_names: w.request_names.clone(),
        pool_name: w.pool.clone(),
        device_name: w.device.clone(),
        cdi_device_ids: w.cdi_device_ids.clone(),
    });
    devices.chain(whole_claim).collect()
}

fn claim_ref(claim: Claim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace,
        name: claim.name,
        uid: claim.uid,
    }
}

impl<C: ClaimSource> Preparer for NodeDriver<C> {
    async fn prepare(&self, claims: Vec<Claim>) -> BTreeMap<String, NodePrepareResourceResponse> {
        let mut out = BTreeMap::new();
        for claim in claims.into_iter().map(claim_ref) {
            let span = tracing::info_span!("prepare", claim = %claim, uid = %claim.uid);
            let _enter = span.enter();
            let result = self.prepare_one(&claim).await;
            DraMetrics::result(&self.options.metrics.prepares, result.is_ok());
            let response = match result {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(%error, "prepare failed");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.insert(claim.uid, response);
        }
        out
    }

    async fn unprepare(
        &self,
        claims: Vec<Claim>,
    ) -> BTreeMap<String, NodeUnprepareResourceResponse> {
        let mut out = BTreeMap::new();
        for claim in claims.into_iter().map(claim_ref) {
            let result = self.unprepare_one(&claim).await;
            DraMetrics::result(&self.options.metrics.unprepares, result.is_ok());
            let error = result.err().unwrap_or_default();
            if !error.is_empty() {
                tracing::warn!(%claim, %error, "unprepare failed");
            }
            out.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        out
    }
}
