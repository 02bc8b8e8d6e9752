//! The Kubernetes shell around the planner: the watches, one reconcile loop, and the writer.
//!
//! Every replica watches RoceFabrics, Nodes (metadata only), RoceNodes, Pods and the region
//! directory ConfigMaps (label `rocefabric.io/fabric`) and feeds each event to the incremental
//! planner ([`crate::feed`]), whose object maps are the only cache: pods are trimmed to what the
//! planner reads, and pods it can never act on are not kept. A replica reports ready once every
//! watch has listed. Only the leader plans and writes: on any change (debounced), on the plan's
//! `requeue_after`, on a periodic resync, and when it becomes leader (a full pass, its memory
//! forgotten), it reads the plan off the planner and executes the writes in order
//! ([`execute_plan`]; [`reconcile_once`] does the same with a full pass over a given world).
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use rocefabric_api::constants::{FABRIC_LABEL, REGION_ANNOTATION};
use rocefabric_api::{NodeCounts, RoceFabric, RoceNode};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::apply::{ApplyError, Executor, Outcome};
use crate::feed::{Feed, Seen};
use crate::http::Health;
use crate::metrics::{FabricFigures, Metrics};
use crate::planner::incremental::Incremental;
use crate::planner::{self, Plan, PlanOptions, World, Write};
use crate::rate::TokenBucket;

/// Longest wait for one write. A leader steps down at most its renew deadline (10 s) after the
/// last renewal it sent, and another replica takes over no sooner than the lease duration
/// (15 s) after that renewal: a write sent while leading is given up before the gap closes.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(3);

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

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Some writes failed; the first is the source.
    #[error("{failed} of {total} writes failed; first: {first}")]
    Writes {
        failed: usize,
        total: usize,
        #[source]
        first: ApplyError,
    },
    /// Leadership was lost in the middle of the pass; the remaining writes were not sent.
    #[error("lost leadership with {remaining} writes left unsent")]
    NotLeader { remaining: usize },
    /// Shutdown began in the middle of the pass; the remaining writes were not sent.
    #[error("shutting down with {remaining} writes left unsent")]
    ShuttingDown { remaining: usize },
}

impl ReconcileError {
    /// Category for `reconcile_failures_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Writes { first, .. } => first.metric_label(),
            ReconcileError::NotLeader { .. } => "not_leader",
            ReconcileError::ShuttingDown { .. } => "shutting_down",
        }
    }
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassSummary {
    /// The plan, writes included.
    pub plan: Plan,
    /// Writes sent and accepted.
    pub done: usize,
    /// Writes that needed no request (already gone or already removed).
    pub already_done: usize,
    /// Gate removals skipped because the same pod's annotation write failed.
    pub skipped: usize,
    /// Failed writes, in order, with their kind.
    pub failures: Vec<(&'static str, ApplyError)>,
    /// Writes not sent because leadership was lost or shutdown began.
    pub unsent: usize,
    /// The pass stopped for shutdown (rather than for lost leadership).
    pub stopped: bool,
    /// Time the writes waited for the write rate limit.
    pub throttled: Duration,
    /// Region annotations written: (namespace, pod, uid, value).
    pub annotated: Vec<(String, String, Option<String>, String)>,
}

impl PassSummary {
    /// The pass as a result for the error policy.
    pub fn into_result(mut self) -> Result<Self, ReconcileError> {
        if self.unsent > 0 {
            let remaining = self.unsent;
            return Err(if self.stopped {
                ReconcileError::ShuttingDown { remaining }
            } else {
                ReconcileError::NotLeader { remaining }
            });
        }
        if self.failures.is_empty() {
            return Ok(self);
        }
        let failed = self.failures.len();
        let total = self.plan.writes.len();
        let (_, first) = self.failures.remove(0);
        Err(ReconcileError::Writes {
            failed,
            total,
            first,
        })
    }
}

/// Pod annotations the operator wrote that the watch cache may not show yet.
///
/// A pass that ran on a cache still missing a just-written region annotation would see the pod
/// without a region and could hand it another one. The overlay puts the written value back into
/// that pod (same namespace, name and uid) until the cache shows it, and forgets it when the pod
/// is replaced by another of the same name, or after a TTL (the cache is then trusted; stale
/// entries are dropped once a pass), or when this replica stops leading.
#[derive(Debug, Default)]
pub struct AnnotationOverlay {
    entries: HashMap<(String, String), OverlayEntry>,
}

#[derive(Debug)]
struct OverlayEntry {
    value: String,
    uid: Option<String>,
    at: Instant,
}

impl AnnotationOverlay {
    const TTL: Duration = Duration::from_secs(120);

    /// Remember that `value` was written on `namespace/pod` whose uid is `uid`.
    pub fn record(&mut self, namespace: &str, pod: &str, uid: Option<String>, value: &str) {
        self.entries.insert(
            (namespace.to_string(), pod.to_string()),
            OverlayEntry {
                value: value.to_string(),
                uid,
                at: Instant::now(),
            },
        );
    }

    /// Forget entries past the TTL (those of pods that sent no event since: gone, or their
    /// event was missed and the cache is trusted now).
    pub fn forget_stale(&mut self) {
        self.entries.retain(|_, e| e.at.elapsed() < Self::TTL);
    }

    /// Put a remembered value into one pod as it arrives from the watch; forget the entry once
    /// the pod shows it, is replaced by another of the same name, or the entry is past the TTL.
    pub fn patch_one(&mut self, pod: &mut Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let Some(entry) = self.entries.get(&key) else {
            return;
        };
        let stale = entry.at.elapsed() >= Self::TTL;
        let replaced = entry.uid.is_some() && entry.uid != pod.metadata.uid;
        let annotations = pod.metadata.annotations.get_or_insert_default();
        let shown = annotations.get(REGION_ANNOTATION) == Some(&entry.value);
        if stale || replaced || shown {
            self.entries.remove(&key);
            if annotations.is_empty() {
                pod.metadata.annotations = None;
            }
            return;
        }
        annotations.insert(REGION_ANNOTATION.to_string(), entry.value.clone());
    }

    /// Forget everything (on a change of leadership: another leader may have written since).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Entries still held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a pass needs: the writer, metrics, planner options, leadership.
pub struct Context {
    pub executor: Executor,
    pub metrics: Arc<Metrics>,
    pub options: PlanOptions,
    /// `true` while this replica may write.
    pub leader: watch::Receiver<bool>,
    /// Cancelled on shutdown: a pass stops before its next write.
    pub stop: CancellationToken,
    pub overlay: Mutex<AnnotationOverlay>,
    /// Paces the writes of every pass.
    pub write_limit: Mutex<TokenBucket>,
    /// Told of every finished write: a long paced pass (100,000 RoceNodes at 100 a second) is
    /// progress, not a stuck loop for `/healthz`.
    pub health: Option<Arc<Health>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context that always holds leadership (tests, single-replica use).
    pub fn always_leader(client: Client, identity: &str, metrics: Arc<Metrics>) -> Self {
        let (_tx, leader) = watch::channel(true);
        Self::new(client, identity, metrics, leader, PlanOptions::default())
    }

    /// A context gated by `leader`.
    pub fn new(
        client: Client,
        identity: &str,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
        options: PlanOptions,
    ) -> Self {
        Self {
            executor: Executor::new(client, identity),
            metrics,
            options,
            leader,
            stop: CancellationToken::new(),
            overlay: Mutex::new(AnnotationOverlay::default()),
            write_limit: Mutex::new(TokenBucket::unlimited()),
            health: None,
        }
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }
}

/// Execute `writes` in order (see the module doc for the failure policy).
pub async fn execute_all(ctx: &Context, writes: &[Write], summary: &mut PassSummary) {
    let mut failed_annotations: Vec<(&str, &str)> = Vec::new();
    for (i, write) in writes.iter().enumerate() {
        if ctx.stop.is_cancelled() || !ctx.is_leader() {
            summary.unsent = writes.len() - i;
            summary.stopped = ctx.stop.is_cancelled();
            tracing::warn!(
                unsent = summary.unsent,
                shutting_down = summary.stopped,
                "stopping the pass before its next write"
            );
            return;
        }
        if let Write::RemovePodGate { namespace, pod, .. } = write
            && failed_annotations.contains(&(namespace.as_str(), pod.as_str()))
        {
            tracing::warn!(%namespace, %pod, "keeping the scheduling gate: the region annotation was not written");
            summary.skipped += 1;
            continue;
        }
        // The paused clock of the tests moves tokio's Instant; the bucket takes it as std time.
        let wait = ctx.write_limit.lock().await.take(Instant::now().into_std());
        if !wait.is_zero() {
            summary.throttled += wait;
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = ctx.stop.cancelled() => {}
            }
            if ctx.stop.is_cancelled() || !ctx.is_leader() {
                summary.unsent = writes.len() - i;
                summary.stopped = ctx.stop.is_cancelled();
                return;
            }
        }
        // Bounded: a hung call must not keep a pass (and its stale plan) alive past the
        // leadership it was planned under.
        let outcome = tokio::time::timeout(WRITE_TIMEOUT, ctx.executor.execute(write))
            .await
            .unwrap_or_else(|_| {
                Err(ApplyError::Timeout {
                    kind: write.kind(),
                    after: WRITE_TIMEOUT,
                })
            });
        if let Some(health) = &ctx.health {
            health.progress(true);
        }
        match outcome {
            Ok(Outcome::Done) => {
                summary.done += 1;
                ctx.metrics.write(write.kind());
            }
            Ok(Outcome::Annotated { uid }) => {
                summary.done += 1;
                ctx.metrics.write(write.kind());
                if let Write::AnnotatePodRegion {
                    namespace,
                    pod,
                    value,
                    ..
                } = write
                {
                    ctx.overlay
                        .lock()
                        .await
                        .record(namespace, pod, uid.clone(), value);
                    summary
                        .annotated
                        .push((namespace.clone(), pod.clone(), uid, value.clone()));
                }
            }
            Ok(Outcome::AlreadyDone) => summary.already_done += 1,
            Err(error) => {
                tracing::warn!(kind = write.kind(), %error, "write failed");
                ctx.metrics.failure(error.metric_label());
                if let Write::AnnotatePodRegion { namespace, pod, .. } = write {
                    failed_annotations.push((namespace, pod));
                }
                summary.failures.push((write.kind(), error));
            }
        }
    }
}

fn figures(plan: &Plan) -> Vec<(String, FabricFigures)> {
    plan.report
        .fabrics
        .iter()
        .map(|f| {
            (
                f.name.clone(),
                FabricFigures {
                    nodes: NodeCounts {
                        selected: f.selected_nodes,
                        configured: f.configured_nodes,
                        failed: f.failed_nodes,
                        conflicting: f.conflicting_nodes,
                    },
                    regions_allocated: f.regions_allocated,
                    regions_capacity: f.region_capacity,
                },
            )
        })
        .collect()
}

/// One pass: plan over `world` in full, execute the writes in order, update the metrics.
#[tracing::instrument(skip_all, fields(fabrics = world.fabrics.len(), nodes = world.nodes.len(), pods = world.pods.len()))]
pub async fn reconcile_once(ctx: &Context, world: &World) -> PassSummary {
    let started = Instant::now();
    let plan = planner::plan(world, &ctx.options);
    execute_plan(ctx, plan, started, started.elapsed()).await
}

/// Execute a plan's writes in order and update the metrics; `planned` is the planner's share
/// of the pass that began at `started`.
pub async fn execute_plan(
    ctx: &Context,
    plan: Plan,
    started: Instant,
    planned: Duration,
) -> PassSummary {
    let mut summary = PassSummary::default();
    execute_all(ctx, &plan.writes, &mut summary).await;
    let figures = figures(&plan);
    ctx.metrics
        .set_fabrics(figures.iter().map(|(name, f)| (name.as_str(), f)));
    ctx.metrics.pass(started.elapsed());
    tracing::info!(
        writes = plan.writes.len(),
        done = summary.done,
        already_done = summary.already_done,
        skipped = summary.skipped,
        failed = summary.failures.len(),
        throttled_ms = u64::try_from(summary.throttled.as_millis()).unwrap_or(u64::MAX),
        plan_us = u64::try_from(planned.as_micros()).unwrap_or(u64::MAX),
        took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "reconciled"
    );
    summary.plan = plan;
    summary
}

/// Exponential backoff for failed passes.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// From `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    /// The next delay (and double the one after).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to `min` after a success.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// The planner behind a lock: the watch task feeds it, the loop plans with it.
pub type SharedFeed = Arc<std::sync::Mutex<Feed>>;

fn lock(feed: &SharedFeed) -> std::sync::MutexGuard<'_, Feed> {
    // A panic while holding it may leave the maps half-moved (a full pass lends them): the
    // loop checks for that before each pass and ends with an error (a restart relists).
    feed.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn seen<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    resource: &'static str,
    wrap: fn(watcher::Event<K>) -> Seen,
) -> stream::BoxStream<'static, Result<Seen, (&'static str, watcher::Error)>>
where
    K: Send + 'static,
{
    events
        .map(move |e| e.map(wrap).map_err(|error| (resource, error)))
        .boxed()
}

/// One stream of the watches' events for [`Feed::seen`].
pub type Events = stream::BoxStream<'static, Result<Seen, (&'static str, watcher::Error)>>;

/// Start the watches of fabrics, nodes, RoceNodes and region directories, as one stream.
pub fn watches(client: &Client) -> Events {
    let all = watcher::Config::default;
    let fabrics = watcher(Api::<RoceFabric>::all(client.clone()), all()).default_backoff();
    let roce_nodes = watcher(Api::<RoceNode>::all(client.clone()), all()).default_backoff();
    let config_maps = watcher(
        Api::<ConfigMap>::all(client.clone()),
        all().labels(FABRIC_LABEL),
    )
    .default_backoff();
    // Nodes as metadata only: the planner selects by labels, and full Nodes (images,
    // conditions) would dominate the operator's memory.
    let nodes = watcher(
        Api::<kube::api::PartialObjectMeta<Node>>::all(client.clone()),
        all(),
    )
    .default_backoff();
    stream::select_all([
        seen(fabrics, "rocefabrics", Seen::Fabric),
        seen(nodes, "nodes", Seen::Node),
        seen(roce_nodes, "rocenodes", Seen::RoceNode),
        seen(config_maps, "configmaps", Seen::ConfigMap),
    ])
    .boxed()
}

/// Start the pod watch (a list, then events); only pods matching `selector` when given. Started
/// again when the fabrics' pod selectors grow ([`Feed::take_pod_relist`]): the pods a new
/// selector picks were dropped when they were listed.
pub fn pod_watch(client: &Client, selector: Option<&str>) -> Events {
    let config = match selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    };
    let pods = watcher(Api::<Pod>::all(client.clone()), config).default_backoff();
    seen(pods, "pods", Seen::Pod)
}

/// Run the controller until `shutdown`: watch, and while `leader` is true, reconcile.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leader: watch::Receiver<bool>,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let mut events = watches(&client);
    let pod_selector = config.pod_label_selector.clone();
    let mut pods = pod_watch(&client, pod_selector.as_deref());
    let watch_client = client.clone();
    let feed: SharedFeed = Arc::new(std::sync::Mutex::new(Feed::new(Incremental::new(
        config.plan.clone(),
    ))));
    let (changed_tx, changed_rx) = watch::channel(0u64);
    let mut ctx = Context::new(
        client,
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
                        let mut feed = lock(&watch_feed);
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
    let result = reconcile_loop(&ctx, &feed, &config, &health, changed_rx, shutdown.clone()).await;
    shutdown.cancel();
    if let Err(error) = driver.await {
        tracing::warn!(%error, "watch task ended abnormally");
    }
    result
}

/// Wait for the next change of leadership; never returns once the elector is gone (leadership
/// then stays as it last was).
async fn leadership_change(leader: &mut watch::Receiver<bool>) {
    if leader.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The loop proper, over a feed that some other task keeps filled.
pub async fn reconcile_loop(
    ctx: &Context,
    feed: &SharedFeed,
    config: &ControllerConfig,
    health: &Health,
    mut changed: watch::Receiver<u64>,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    while !lock(feed).synced() {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            res = changed.changed() => {
                if res.is_err() {
                    if shutdown.is_cancelled() {
                        return Ok(());
                    }
                    return Err(ControllerError::CacheNeverSynced { resource: "watches" });
                }
            }
        }
    }
    health.set_ready(true);
    ctx.metrics.cache_synced.set(1.0);
    let (fabrics, nodes, roce_nodes, pods, config_maps) = lock(feed).planner.sizes();
    tracing::info!(
        fabrics,
        nodes,
        roce_nodes,
        pods,
        config_maps,
        "caches synced"
    );

    // A leader passes at least every resync; three resyncs (at least a minute) without one is stuck.
    health.set_stall_after((config.resync * 3).max(Duration::from_secs(60)));
    let mut leader = ctx.leader.clone();
    let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
    let mut next_pass = Instant::now();
    let mut was_leader = false;
    let mut last_full_passes = 0;
    loop {
        let is_leader = *leader.borrow_and_update();
        ctx.metrics.leader.set(i64::from(is_leader));
        if !is_leader {
            if was_leader {
                // The next leader's writes must not be covered by ours.
                ctx.overlay.lock().await.clear();
            }
            was_leader = false;
            health.progress(false);
            // Followers keep their caches warm and wait.
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = leadership_change(&mut leader) => {}
            }
            continue;
        }
        if !was_leader {
            // Just became leader: a pass now, over whatever changed meanwhile. Memory from an
            // earlier term is stale (another leader may have freed or reassigned windows since),
            // so the allocator rebuilds from the pods' annotations and the region directories,
            // and the annotation overlay starts empty.
            was_leader = true;
            health.progress(true);
            next_pass = Instant::now();
            lock(feed).planner.forget_memory();
            ctx.overlay.lock().await.clear();
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = leadership_change(&mut leader) => continue,
            res = changed.changed() => {
                if res.is_err() {
                    return if shutdown.is_cancelled() { Ok(()) } else { Err(ControllerError::WatchesEnded) };
                }
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(config.debounce) => {}
                }
                changed.borrow_and_update();
            }
            () = tokio::time::sleep_until(next_pass) => {}
        }
        if !*leader.borrow() {
            continue;
        }
        if feed.is_poisoned() {
            return Err(ControllerError::PlannerPoisoned);
        }
        let started = Instant::now();
        let (plan, figures) = {
            let mut feed = lock(feed);
            let plan = feed.planner.plan(Timestamp::now());
            (plan, feed.planner.figures())
        };
        let planned = started.elapsed();
        if figures.full_passes != last_full_passes {
            // A full pass (and the list before it) freed most of what it allocated.
            last_full_passes = figures.full_passes;
            crate::heap::give_back();
        }
        tracing::debug!(
            full_passes = figures.full_passes,
            incremental_plans = figures.incremental_plans,
            changes = figures.changes,
            fallbacks = figures.fallbacks,
            "planner"
        );
        let summary = execute_plan(ctx, plan, started, planned).await;
        health.progress(true);
        ctx.overlay.lock().await.forget_stale();
        {
            let mut feed = lock(feed);
            for (namespace, pod, uid, value) in &summary.annotated {
                feed.planner
                    .annotated(namespace, pod, uid.as_deref(), value);
            }
        }
        let requeue = summary
            .plan
            .requeue_after
            .map_or(config.resync, |r| r.min(config.resync));
        match summary.into_result() {
            Ok(_) => {
                backoff.reset();
                next_pass = Instant::now() + requeue;
            }
            Err(error) => {
                let delay = backoff.next_delay().min(requeue);
                tracing::warn!(%error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "reconcile failed");
                if matches!(
                    error,
                    ReconcileError::NotLeader { .. } | ReconcileError::ShuttingDown { .. }
                ) {
                    ctx.metrics.failure(error.metric_label());
                }
                next_pass = Instant::now() + delay;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    fn pod(ns: &str, name: &str, annotation: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        if let Some(v) = annotation {
            p.metadata.annotations = Some([(REGION_ANNOTATION.to_string(), v.to_string())].into());
        }
        p
    }

    fn region_of(p: &Pod) -> Option<&str> {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REGION_ANNOTATION))
            .map(String::as_str)
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_fills_a_stale_cache_until_it_catches_up() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "a", Some("uid-a".into()), "{\"id\":1}");
        let (mut a, mut b) = (pod("ns", "a", None), pod("ns", "b", None));
        o.patch_one(&mut a);
        o.patch_one(&mut b);
        assert_eq!(region_of(&a), Some("{\"id\":1}"));
        assert!(b.metadata.annotations.is_none());
        assert_eq!(o.len(), 1, "kept until the cache shows it");
        o.patch_one(&mut pod("ns", "a", Some("{\"id\":1}")));
        assert!(o.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_forgets_old_entries() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "gone", None, "x");
        o.record("ns", "a", None, "x");
        tokio::time::advance(AnnotationOverlay::TTL / 2).await;
        o.record("ns", "young", None, "x");
        tokio::time::advance(AnnotationOverlay::TTL / 2).await;
        let mut a = pod("ns", "a", None);
        o.patch_one(&mut a);
        assert!(
            a.metadata.annotations.is_none(),
            "after the TTL the cache is trusted"
        );
        o.forget_stale();
        assert_eq!(
            o.len(),
            1,
            "the gone pod's entry is dropped, the young one kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_does_not_leak_onto_a_recreated_pod_of_the_same_name() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "a", Some("uid-old".into()), "x");
        let mut a = pod("ns", "a", None); // uid-a: a new pod named a
        o.patch_one(&mut a);
        assert!(a.metadata.annotations.is_none());
        assert!(o.is_empty());
    }
}
