//! The Kubernetes shell around the planner: the watches, one reconcile loop, and the writer.
//!
//! Every replica watches RoceFabrics, Nodes (metadata only), RoceNodes, Pods and the region
//! directory ConfigMaps (label `rocefabric.io/fabric`) and feeds each event to the incremental
//! planner ([`crate::feed`]), whose object maps are the only cache: pods are decoded straight into
//! what the planner reads ([`crate::objects`]), and pods it can never act on are not kept; their
//! list asks for each page while the last one decodes (`read_ahead`). A replica reports ready
//! once every watch has listed. Only the leader plans and writes: on any change (debounced), on the plan's
//! `requeue_after`, on a periodic resync, and when it becomes leader (a full pass, its memory
//! forgotten), it reads the plan off the planner and executes the writes in order, consecutive
//! RoceNode writes in batches ([`execute_plan`]; [`reconcile_once`] does the same with a full pass
//! over a given world).
//!
//! Failure policy: a failed write does not stop the pass (the writes are independent) except
//! that a pod's gate removal is skipped when the same pod's annotation write failed. A pass with
//! any failure counts in `reconcile_failures_total{reason}` and schedules a retry with
//! exponential backoff (1 s doubling to 5 min); watch events still trigger passes meanwhile.
//! Losing the Lease, or shutdown, stops the pass before its next write; `run` releases the Lease
//! only after the controller has stopped, so no write of ours is in flight once another replica
//! can take over.
//!
//! Fabric deletion: RoceNodes and region ConfigMaps carry a controller owner reference to their
//! fabric, so the garbage collector removes them when the fabric goes. The planner also lists
//! deletes for RoceNodes whose fabric is gone, and the executor sends them (404 counts as done),
//! so cleanup does not depend on the garbage collector's timing.
//!
//! One file per step: `watches` (the watch streams), `read_ahead` (the pod watch's list and
//! watch), `pass` (a pass's writes) and
//! `reconcile_loop` (when passes run); the annotation overlay is [`crate::overlay`].

mod pass;
mod read_ahead;
mod reconcile_loop;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

use crate::feed::Feed;
use crate::http::Health;
use crate::metrics::Metrics;
use crate::planner::PlanOptions;
use crate::planner::incremental::Incremental;
use crate::rate::TokenBucket;
use crate::write_client::WriteClient;

pub use pass::{
    Context, PassSummary, ROCE_NODE_WRITES_IN_FLIGHT, ReconcileError, WRITE_TIMEOUT, execute_all,
    execute_plan, reconcile_once,
};
pub use reconcile_loop::{LoopInputs, SharedFeed, reconcile_loop};
pub use watches::{Events, pod_watch, watches};

/// Settings of the reconcile loop.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Reporting instance of Events (the replica's identity).
    pub identity: String,
    /// Quiet time after a change before a pass.
    pub debounce: Duration,
    /// A pass runs at least this often.
    pub resync: Duration,
    /// First retry delay after a failed pass.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Planner knobs.
    pub plan: PlanOptions,
    /// Pacing of writes toward the API server (`--write-qps`, `--write-burst`).
    pub write_limit: TokenBucket,
    /// Watch only pods matching this label selector (`--pod-label-selector`).
    pub pod_label_selector: Option<String>,
}

impl ControllerConfig {
    /// Defaults: 500 ms debounce, 5 min resync, backoff 1 s .. 5 min.
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            debounce: Duration::from_millis(500),
            resync: Duration::from_secs(300),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            plan: PlanOptions::default(),
            write_limit: TokenBucket::unlimited(),
            pod_label_selector: None,
        }
    }
}

/// Errors that end the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A watch cache's writer went away before it listed (the watch task ended).
    #[error("the {resource} watch ended before its cache synced")]
    CacheNeverSynced { resource: &'static str },
    /// The watch task ended (it panicked): nothing feeds the planner any more.
    #[error("the watches ended; the operator must restart to see the cluster again")]
    WatchesEnded,
    /// A panic while the planner was locked: its maps may be half-moved.
    #[error("the planner panicked; its state is unknown, so the operator must restart")]
    PlannerPoisoned,
}

/// What the controller shares with the rest of the process.
pub struct Handles {
    pub metrics: Arc<Metrics>,
    /// Readiness and progress, reported by the HTTP server.
    pub health: Arc<Health>,
    /// `true` while this replica holds the Lease.
    pub leader: watch::Receiver<bool>,
    /// Cancelled on shutdown.
    pub shutdown: CancellationToken,
}

/// The clients the controller talks through: one for its watches and reads, one for its writes.
#[derive(Clone)]
pub struct Clients {
    pub watch: Client,
    pub write: WriteClient,
}

impl From<Client> for Clients {
    /// Both through the same client.
    fn from(client: Client) -> Self {
        Self {
            watch: client.clone(),
            write: client.into(),
        }
    }
}

/// Run the controller until `shutdown`: watch, and while `leader` is true, reconcile.
pub async fn run(
    clients: Clients,
    config: ControllerConfig,
    handles: Handles,
) -> Result<(), ControllerError> {
    let Handles {
        metrics,
        health,
        leader,
        shutdown,
    } = handles;
    let Clients {
        watch: client,
        write: writer,
    } = clients;
    let mut events = watches(&client);
    let pod_selector = config.pod_label_selector.clone();
    let mut pods = pod_watch(&client, pod_selector.as_deref());
    let watch_client = client.clone();
    let feed: SharedFeed = Arc::new(std::sync::Mutex::new(Feed::new(Incremental::new(
        config.plan.clone(),
    ))));
    let (changed_tx, changed_rx) = watch::channel(0u64);
    let mut ctx = Context::new(
        writer,
        &config.identity,
        metrics.clone(),
        leader,
        config.plan.clone(),
    );
    ctx.stop = shutdown.clone();
    ctx.write_limit = Mutex::new(config.write_limit.clone());
    ctx.health = Some(health.clone());
    let ctx = Arc::new(ctx);
    let watch_metrics = metrics.clone();
    let watch_shutdown = shutdown.clone();
    let (watch_feed, watch_ctx) = (feed.clone(), ctx.clone());
    let driver = tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                () = watch_shutdown.cancelled() => break,
                event = events.next() => event,
                event = pods.next() => event,
            };
            match event {
                Some(Ok(seen)) => {
                    let mut overlay = watch_ctx.overlay.lock().await;
                    let (changed, relist) = {
                        let mut feed = reconcile_loop::lock(&watch_feed);
                        let changed = feed.seen(seen, &mut overlay);
                        (changed, feed.take_pod_relist())
                    };
                    // Filtered by the API server, the pods a custom selector picks never come.
                    if relist && pod_selector.is_none() {
                        tracing::info!(
                            "a fabric's pod selector picks pods not held; listing pods again"
                        );
                        pods = pod_watch(&watch_client, pod_selector.as_deref());
                    }
                    if changed {
                        changed_tx.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                Some(Err((resource, error))) => {
                    tracing::warn!(resource, %error, "watch failed; retrying with backoff");
                    watch_metrics.failure("watch");
                }
                None => break,
            }
        }
    });
    let result = reconcile_loop(LoopInputs {
        ctx: &ctx,
        feed: &feed,
        config: &config,
        health: &health,
        changed: changed_rx,
        shutdown: shutdown.clone(),
    })
    .await;
    shutdown.cancel();
    if let Err(error) = driver.await {
        tracing::warn!(%error, "watch task ended abnormally");
    }
    result
}
