//! DRA mode's loop: the slice kept in step with the inventory, the fabric view and the ledger,
//! and the kubelet-facing sockets served again when lost.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rocefabric_kubelet_api::dra::{self as dra_service, RegistrationService};
use rocefabric_kubelet_api::socket::SocketServer;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_model::model::Inventory;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{ClaimSource, DraError, DraMetrics, DraOptions, Ledger, NodeDriver, NodeView};
use crate::DRIVER_NAME;
use crate::devices::Listing;
use crate::publish::SlicePublisher;

/// How often the slice is read back from the API server even when nothing changed here (someone
/// may have deleted it: the kubelet wipes a driver's slices when the driver goes away).
const SLICE_RECHECK: Duration = Duration::from_secs(30);
/// How often the sockets are checked and the pod resources API is asked (when it is read).
const HOUSEKEEPING: Duration = Duration::from_secs(5);

fn serve_dra<C: ClaimSource>(
    driver: &Arc<NodeDriver<C>>,
    socket: &Path,
) -> Result<SocketServer, DraError> {
    Ok(dra_service::serve_dra(socket, Arc::clone(driver))?)
}

fn serve_registration(
    socket: &Path,
    endpoint: &Path,
    registered: &watch::Sender<Option<Result<(), String>>>,
) -> Result<SocketServer, DraError> {
    let service = RegistrationService::new(DRIVER_NAME, endpoint, registered.clone());
    Ok(dra_service::serve_registration(socket, service)?)
}

/// Log what changed in the withdrawn set.
fn log_withdrawn(before: &BTreeMap<String, String>, listing: &Listing) -> BTreeMap<String, String> {
    let now: BTreeMap<String, String> = listing
        .withdrawn
        .iter()
        .map(|(d, why)| (d.name.clone(), why.as_str().to_string()))
        .collect();
    for (device, why) in &now {
        if before.get(device) != Some(why) {
            tracing::info!(%device, reason = %why, "device withdrawn from the ResourceSlice");
        }
    }
    for device in before.keys().filter(|d| !now.contains_key(*d)) {
        tracing::info!(%device, "device back in the ResourceSlice");
    }
    now
}

/// What DRA mode follows: the daemon's config, the API server, the inventory from the daemon's
/// one discovery loop, the fabric view (as for the device plugin) and the ledger shared with it.
pub struct DraInputs {
    pub config: Arc<Config>,
    pub client: kube::Client,
    pub inventory: watch::Receiver<Inventory>,
    pub fabric_view: watch::Receiver<FabricView>,
    pub ledger: Arc<Ledger>,
}

/// Run DRA mode until `shutdown`: the slice follows every inventory, view and ledger change; the
/// sockets are served again when lost.
pub async fn run(
    options: DraOptions,
    inputs: DraInputs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DraError> {
    let DraInputs {
        config,
        client,
        inventory: mut inventory_rx,
        mut fabric_view,
        ledger,
    } = inputs;
    let mut inventory = inventory_rx.borrow_and_update().clone();
    let mut inventory_open = true;
    let mut view = fabric_view.borrow_and_update().clone();
    let node_view = |inventory: &Inventory, view: &FabricView| {
        Arc::new(NodeView {
            inventory: inventory.clone(),
            traffic_class: view.effective_traffic_class(&config),
        })
    };
    let (view_tx, view_rx) = watch::channel(node_view(&inventory, &view));
    let driver = Arc::new(NodeDriver::new(
        client.clone(),
        options.clone(),
        Arc::clone(&config),
        Arc::clone(&ledger),
        view_rx,
    )?);
    driver.refresh_grants().await;

    let (mut sockets, mut registered_rx) = Sockets::serve(&options, &driver)?;
    let mut slice = Slice::new(SlicePublisher::new(client, &options.node_name));
    let mut ledger_changes = ledger.changes();
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
    housekeeping.reset();
    let mut view_open = true;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            changed = inventory_rx.changed(), if inventory_open => match changed {
                Ok(()) => inventory = inventory_rx.borrow_and_update().clone(),
                Err(_) => inventory_open = false,
            },
            changed = fabric_view.changed(), if view_open => match changed {
                Ok(()) => view = fabric_view.borrow_and_update().clone(),
                Err(_) => view_open = false,
            },
            _ = ledger_changes.changed() => {}
            _ = registered_rx.changed() => {
                // A (re)registration: the kubelet may have restarted and wiped our slice.
                slice.publisher.invalidate();
            }
            _ = housekeeping.tick() => {
                driver.refresh_grants().await;
                sockets.heal(&driver).await?;
            }
            () = &mut shutdown => break,
        }
        // Compared in place: the inventory is cloned only when it changed.
        view_tx.send_if_modified(|current| {
            let traffic_class = view.effective_traffic_class(&config);
            if current.inventory == inventory && current.traffic_class == traffic_class {
                return false;
            }
            *current = node_view(&inventory, &view);
            true
        });
        let listing = driver.listing(&inventory, &view);
        slice.publish(&listing, &options.metrics).await;
    }
    tracing::info!("DRA driver shutting down");
    sockets.stop().await;
    Ok(())
}

/// The kubelet's registration verdicts (`None` before the first).
type Verdicts = watch::Receiver<Option<Result<(), String>>>;

/// The kubelet-facing sockets: the DRA service and its plugin registration.
struct Sockets {
    dra_socket: PathBuf,
    reg_socket: PathBuf,
    registered: watch::Sender<Option<Result<(), String>>>,
    dra: Option<SocketServer>,
    reg: Option<SocketServer>,
}

impl Sockets {
    /// Serve both; the receiver follows the kubelet's registration verdicts.
    fn serve<C: ClaimSource>(
        options: &DraOptions,
        driver: &Arc<NodeDriver<C>>,
    ) -> Result<(Self, Verdicts), DraError> {
        let (registered, registered_rx) = watch::channel(None);
        let dra_socket = options.dra_socket();
        let reg_socket = options.registration_socket();
        // The DRA service first: the kubelet dials it as soon as it sees the registration socket.
        let dra = Some(serve_dra(driver, &dra_socket)?);
        let reg = Some(serve_registration(&reg_socket, &dra_socket, &registered)?);
        tracing::info!(node = %options.node_name, dra_socket = %dra_socket.display(),
            registration_socket = %reg_socket.display(), cdi_dir = %options.cdi_dir.display(),
            reads_grants = options.pod_resources_socket.is_some(), "DRA driver serving");
        let sockets = Self {
            dra_socket,
            reg_socket,
            registered,
            dra,
            reg,
        };
        Ok((sockets, registered_rx))
    }

    /// Serve again each socket that was lost (removed, replaced, or its server ended).
    async fn heal<C: ClaimSource>(&mut self, driver: &Arc<NodeDriver<C>>) -> Result<(), DraError> {
        if !self.dra.as_ref().is_some_and(SocketServer::intact) {
            tracing::warn!(socket = %self.dra_socket.display(), "DRA socket lost; serving it again");
            if let Some(old) = self.dra.take() {
                old.stop().await;
            }
            self.dra = Some(serve_dra(driver, &self.dra_socket)?);
        }
        if !self.reg.as_ref().is_some_and(SocketServer::intact) {
            tracing::warn!(socket = %self.reg_socket.display(), "registration socket lost; serving it again");
            if let Some(old) = self.reg.take() {
                old.stop().await;
            }
            self.reg = Some(serve_registration(
                &self.reg_socket,
                &self.dra_socket,
                &self.registered,
            )?);
        }
        Ok(())
    }

    async fn stop(self) {
        for served in [self.dra, self.reg].into_iter().flatten() {
            served.stop().await;
        }
    }
}

/// The node's slice as last written, and what was logged about it.
struct Slice {
    publisher: SlicePublisher,
    withdrawn: BTreeMap<String, String>,
    too_many_logged: bool,
    recheck: Instant,
}

impl Slice {
    fn new(publisher: SlicePublisher) -> Self {
        Self {
            publisher,
            withdrawn: BTreeMap::new(),
            too_many_logged: false,
            recheck: Instant::now() + SLICE_RECHECK,
        }
    }

    /// Log what changed in `listing`, count it, and write the slice when it differs from the
    /// last one written (or the last write is older than [`SLICE_RECHECK`]).
    async fn publish(&mut self, listing: &Listing, metrics: &DraMetrics) {
        self.withdrawn = log_withdrawn(&self.withdrawn, listing);
        if listing.published.len() > crate::slice::MAX_DEVICES_PER_SLICE && !self.too_many_logged {
            tracing::warn!(
                devices = listing.published.len(),
                max = crate::slice::MAX_DEVICES_PER_SLICE,
                "more devices than one ResourceSlice holds; the rest are not published"
            );
            self.too_many_logged = true;
        }
        metrics.listing(listing);
        if Instant::now() >= self.recheck {
            self.publisher.invalidate();
            self.recheck = Instant::now() + SLICE_RECHECK;
        }
        match self.publisher.publish(&listing.published).await {
            Ok(Some(generation)) => tracing::info!(
                generation,
                devices = listing.published.len(),
                withdrawn = listing.withdrawn.len(),
                "ResourceSlice written"
            ),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot write the ResourceSlice; retrying");
                self.publisher.invalidate();
            }
        }
    }
}
