//! The cluster's other actors, reduced to what the operator waits for: each node's agent
//! reports the RoceNode spec it was given as applied, and the scheduler binds a pod whose last
//! gate went. Both act `react_after` a write, in order, from one task.

use std::sync::Arc;
use std::time::Duration;

use rocefabric_api::constants::{condition, reason};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::changes::{Change, ChangeType};
use super::{Shared, State};
use crate::api::resource::Resource;

/// What an actor will do.
#[derive(Debug)]
pub enum Job {
    /// The agent of node `name` reports `generation` applied.
    Report { name: String, generation: i64 },
    /// The scheduler binds pod `pod` and it starts.
    Schedule { pod: u32 },
}

/// Jobs due in order (one fixed delay keeps the queue sorted).
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::UnboundedSender<(Instant, Job)>,
    delay: Duration,
}

impl Queue {
    pub fn new(delay: Duration) -> (Queue, mpsc::UnboundedReceiver<(Instant, Job)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Queue { tx, delay }, rx)
    }

    pub fn push(&self, job: Job) {
        // Only fails once the actor task is gone (the server is stopping).
        let _ = self.tx.send((Instant::now() + self.delay, job));
    }
}

/// Whether `obj`'s status reports `generation` applied.
pub fn reports_applied(obj: &Value, generation: i64) -> bool {
    let status = &obj["status"];
    status["fabricGeneration"].as_i64() == Some(generation)
        && status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == condition::QOS_APPLIED && c["status"] == "True")
}

/// Run the jobs as they come due, a batch per lock.
pub async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<(Instant, Job)>) {
    let mut next = rx.recv().await;
    while let Some((due, job)) = next.take() {
        tokio::time::sleep_until(due).await;
        let now = Instant::now();
        {
            let mut st = shared.lock();
            st.perform(job);
            while next.is_none() {
                match rx.try_recv() {
                    Ok((due, job)) if due <= now => st.perform(job),
                    Ok(later) => next = Some(later),
                    Err(_) => break,
                }
            }
        }
        if next.is_none() {
            next = rx.recv().await;
        }
    }
}

impl State {
    fn perform(&mut self, job: Job) {
        match job {
            Job::Report { name, generation } => self.agent_reports(&name, generation),
            Job::Schedule { pod } => self.schedule(pod),
        }
    }

    fn agent_reports(&mut self, name: &str, generation: i64) {
        let key = (Resource::RoceNodes, String::new(), name.to_string());
        let Some(stored) = self.objects.get(&key) else {
            return;
        };
        let Ok(mut obj) = serde_json::from_str::<Value>(&stored.json) else {
            return;
        };
        // The spec moved on (or went pending) meanwhile: the agent reports what it holds next.
        if obj["spec"]["fabricGeneration"].as_i64() != Some(generation)
            || obj["spec"]["pending"].as_bool() == Some(true)
            || reports_applied(&obj, generation)
        {
            return;
        }
        let now = "2026-01-03T00:00:00Z";
        let observed = obj["metadata"]["generation"].clone();
        let true_condition = |type_: &str, reason: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": "",
                   "lastTransitionTime": now, "observedGeneration": observed})
        };
        obj["status"] = json!({
            "observedGeneration": observed,
            "fabricGeneration": generation,
            "conditions": [
                true_condition(condition::QOS_APPLIED, reason::QOS_APPLIED),
                true_condition(condition::READY, reason::AS_EXPECTED),
            ],
            "lastSyncTime": now,
        });
        let labels_before = stored.labels.clone();
        let rv = self.next_rv();
        let stored = self.objects.put(&key, obj, rv);
        self.configured.insert(name.to_string(), generation);
        self.emit(Change {
            rv,
            resource: Resource::RoceNodes,
            kind: ChangeType::Modified,
            namespace: None,
            labels_before: Some(labels_before),
            labels: stored.labels,
            object: stored.json,
        });
    }

    fn schedule(&mut self, i: u32) {
        let Some(st) = self.pods.states.get_mut(i as usize) else {
            return;
        };
        if st.deleted || st.gated || st.scheduled {
            return;
        }
        let before = st.clone();
        st.scheduled = true;
        self.pod_changed(i, &before);
    }
}
