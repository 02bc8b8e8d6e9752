//! The node daemon's one discovery loop: sysfs is scanned every `pollInterval` and the inventory
//! is handed, on one `watch` channel, to everything that serves it (the device plugin's publisher
//! and the DRA driver's slice), so `both` mode scans once.

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_model::model::{Health, Inventory};

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

impl Sources {
    /// Check the roots, run the first discovery (an empty inventory when it fails, so the
    /// servers still start and pick devices up later), then rediscover every `poll_interval` in
    /// the background. Every pass is sent, changed or not, so time-based decisions downstream
    /// (a device plugin grant that ages out of the ledger) are re-evaluated each interval. The loop
    /// ends when every receiver is gone; a failed pass keeps the last inventory and counts in
    /// `failures`.
    pub async fn watch(
        self,
        config: Arc<Config>,
        failures: Counter,
    ) -> Result<watch::Receiver<Inventory>, DiscoveryError> {
        if !self.sysfs.is_dir() {
            return Err(DiscoveryError::SysfsRoot { path: self.sysfs });
        }
        let first = discover(&self, &config).await.unwrap_or_else(|error| {
            failures.inc();
            tracing::warn!(%error, "initial discovery failed; starting with no devices");
            Inventory::default()
        });
        let (tx, rx) = watch::channel(first);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(config.poll_interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.reset(); // the first discovery already ran
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    () = tx.closed() => break,
                }
                match discover(&self, &config).await {
                    Ok(found) => {
                        tx.send_replace(found);
                    }
                    Err(error) => {
                        failures.inc();
                        tracing::warn!(%error, "discovery failed; keeping the last inventory");
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// Why discovery cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("sysfs root {path} is not a directory")]
    SysfsRoot { path: PathBuf },
}
