//! The reconcile loop: wait until every watch has listed, then, while this replica leads, pass
//! on a change (debounced), on the plan's `requeue_after`, on a periodic resync and when it
//! becomes leader; back off after a failed pass.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::pass::{Context, PassSummary, ReconcileError, execute_plan};
use super::{ControllerConfig, ControllerError};
use rocefabric_runtime::{Backoff, Retry};

use crate::feed::Feed;
use crate::http::Health;

/// The planner behind a lock: the watch task feeds it, the loop plans with it.
pub type SharedFeed = Arc<std::sync::Mutex<Feed>>;

pub(super) fn lock(feed: &SharedFeed) -> std::sync::MutexGuard<'_, Feed> {
    // A panic while holding it may leave the maps half-moved (a full pass lends them): the
    // loop checks for that before each pass and ends with an error (a restart relists).
    feed.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wait for the next change of leadership; never returns once the elector is gone (leadership
/// then stays as it last was).
async fn leadership_change(leader: &mut watch::Receiver<bool>) {
    if leader.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What the loop runs with: the pass's context, the feed some other task keeps filled, and how
/// it is told of changes and of shutdown.
pub struct LoopInputs<'a> {
    pub ctx: &'a Context,
    pub feed: &'a SharedFeed,
    pub config: &'a ControllerConfig,
    pub health: &'a Health,
    /// Bumped by the watch task on every change of the world.
    pub changed: watch::Receiver<u64>,
    pub shutdown: CancellationToken,
}

/// The loop proper, over a feed that some other task keeps filled.
pub async fn reconcile_loop(inputs: LoopInputs<'_>) -> Result<(), ControllerError> {
    let LoopInputs {
        ctx,
        feed,
        config,
        health,
        changed,
        shutdown,
    } = inputs;
    let mut looper = Looper {
        ctx,
        feed,
        config,
        health,
        changed,
        shutdown,
        leader: ctx.leader.clone(),
        backoff: Retry::new(Backoff::new(config.backoff_min, config.backoff_max)),
        next_pass: Instant::now(),
        was_leader: false,
        last_full_passes: 0,
    };
    if !looper.wait_for_sync().await? {
        return Ok(());
    }
    looper.synced();
    looper.run().await
}

/// What ends a wait of the loop.
enum Wake {
    /// Time for a pass.
    Pass,
    /// Leadership changed: look again.
    Recheck,
    /// The loop ends.
    Stop(Result<(), ControllerError>),
}

/// The loop's inputs and what it keeps from one pass to the next.
struct Looper<'a> {
    ctx: &'a Context,
    feed: &'a SharedFeed,
    config: &'a ControllerConfig,
    health: &'a Health,
    changed: watch::Receiver<u64>,
    shutdown: CancellationToken,
    leader: watch::Receiver<bool>,
    backoff: Retry,
    next_pass: Instant,
    /// Led during the last turn of the loop.
    was_leader: bool,
    /// The planner's full passes so far, as last seen.
    last_full_passes: u64,
}

impl Looper<'_> {
    /// Wait until every watch has listed once; `false` when shutdown came first.
    async fn wait_for_sync(&mut self) -> Result<bool, ControllerError> {
        while !lock(self.feed).synced() {
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(false),
                res = self.changed.changed() => {
                    if res.is_err() {
                        if self.shutdown.is_cancelled() {
                            return Ok(false);
                        }
                        return Err(ControllerError::CacheNeverSynced { resource: "watches" });
                    }
                }
            }
        }
        Ok(true)
    }

    /// Report ready, and from now on stuck when no pass comes for three resyncs.
    fn synced(&self) {
        self.health.set_ready(true);
        self.ctx.metrics.cache_synced.set(1.0);
        let (fabrics, nodes, roce_nodes, pods, config_maps) = lock(self.feed).planner.sizes();
        tracing::info!(
            fabrics,
            nodes,
            roce_nodes,
            pods,
            config_maps,
            "caches synced"
        );
        // A leader passes at least every resync; three resyncs (at least a minute) without one is stuck.
        self.health
            .set_stall_after((self.config.resync * 3).max(Duration::from_secs(60)));
    }

    async fn run(mut self) -> Result<(), ControllerError> {
        loop {
            let is_leader = *self.leader.borrow_and_update();
            self.ctx.metrics.leader.set(i64::from(is_leader));
            let wake = if is_leader {
                self.lead().await
            } else {
                self.follow().await
            };
            match wake {
                Wake::Stop(result) => return result,
                Wake::Recheck => continue,
                Wake::Pass => {}
            }
            if !*self.leader.borrow() {
                continue;
            }
            if self.feed.is_poisoned() {
                return Err(ControllerError::PlannerPoisoned);
            }
            let summary = self.pass().await;
            self.schedule(summary);
        }
    }

    /// Not leading: keep the caches warm and wait for leadership.
    async fn follow(&mut self) -> Wake {
        if self.was_leader {
            // The next leader's writes must not be covered by ours.
            self.ctx.overlay.lock().await.clear();
        }
        self.was_leader = false;
        self.health.progress(false);
        tokio::select! {
            () = self.shutdown.cancelled() => Wake::Stop(Ok(())),
            () = leadership_change(&mut self.leader) => Wake::Recheck,
        }
    }

    /// Leading: take over when just elected, then wait for a change (debounced) or the time of
    /// the next pass.
    async fn lead(&mut self) -> Wake {
        if !self.was_leader {
            self.take_over().await;
        }
        tokio::select! {
            () = self.shutdown.cancelled() => Wake::Stop(Ok(())),
            () = leadership_change(&mut self.leader) => Wake::Recheck,
            res = self.changed.changed() => {
                if res.is_err() {
                    let result = if self.shutdown.is_cancelled() {
                        Ok(())
                    } else {
                        Err(ControllerError::WatchesEnded)
                    };
                    return Wake::Stop(result);
                }
                tokio::select! {
                    () = self.shutdown.cancelled() => return Wake::Stop(Ok(())),
                    () = tokio::time::sleep(self.config.debounce) => {}
                }
                self.changed.borrow_and_update();
                Wake::Pass
            }
            () = tokio::time::sleep_until(self.next_pass) => Wake::Pass,
        }
    }

    /// Just became leader: a pass now, over whatever changed meanwhile. Memory from an earlier
    /// term is stale (another leader may have freed or reassigned windows since), so the
    /// allocator rebuilds from the pods' annotations and the region directories, and the
    /// annotation overlay starts empty.
    async fn take_over(&mut self) {
        self.was_leader = true;
        self.health.progress(true);
        self.next_pass = Instant::now();
        lock(self.feed).planner.forget_memory();
        self.ctx.overlay.lock().await.clear();
    }

    /// One pass: plan off the planner, execute the writes, and tell the planner which region
    /// annotations were written.
    async fn pass(&mut self) -> PassSummary {
        let started = Instant::now();
        let (plan, figures) = {
            let mut feed = lock(self.feed);
            let now = Timestamp::now();
            let mut plan = feed.planner.plan(now);
            // Last: windows of pods not bound in time (the planner's memory, not the world's).
            let (reclaims, next) = feed.planner.reclaims(now);
            plan.writes.extend(reclaims);
            if let Some(next) = next {
                plan.requeue_after = Some(plan.requeue_after.map_or(next, |r| r.min(next)));
            }
            (plan, feed.planner.figures())
        };
        let planned = started.elapsed();
        if figures.full_passes != self.last_full_passes {
            // Rare, and seconds at scale: said at info (after a takeover, a relist, or a
            // change the indexes cannot take).
            tracing::info!(
                full_passes = figures.full_passes,
                incremental_plans = figures.incremental_plans,
                fallbacks = figures.fallbacks,
                plan_us = u64::try_from(planned.as_micros()).unwrap_or(u64::MAX),
                "planned in full"
            );
            // A full pass (and the list before it) freed most of what it allocated.
            self.last_full_passes = figures.full_passes;
            crate::heap::give_back();
        }
        tracing::debug!(
            full_passes = figures.full_passes,
            incremental_plans = figures.incremental_plans,
            changes = figures.changes,
            fallbacks = figures.fallbacks,
            "planner"
        );
        let summary = execute_plan(self.ctx, plan, started, planned).await;
        self.health.progress(true);
        self.ctx.overlay.lock().await.forget_stale();
        {
            let mut feed = lock(self.feed);
            for (namespace, pod, uid, value) in &summary.annotated {
                feed.planner
                    .annotated(namespace, pod, uid.as_deref(), value);
            }
        }
        summary
    }

    /// When the next pass runs: after the plan's `requeue_after` (at most a resync), or after a
    /// backoff when the pass failed.
    fn schedule(&mut self, summary: PassSummary) {
        let resync = self.config.resync;
        let requeue = summary.plan.requeue_after.map_or(resync, |r| r.min(resync));
        match summary.into_result() {
            Ok(_) => {
                self.backoff.reset();
                self.next_pass = Instant::now() + requeue;
            }
            Err(error) => {
                let delay = self.backoff.next_delay().min(requeue);
                tracing::warn!(%error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "reconcile failed");
                if matches!(
                    error,
                    ReconcileError::NotLeader { .. } | ReconcileError::ShuttingDown { .. }
                ) {
                    self.ctx.metrics.failure(error.metric_label());
                }
                self.next_pass = Instant::now() + delay;
            }
        }
    }
}
