//! Leader election on a `coordination.k8s.io/v1` Lease: only the leader runs the writer.
//!
//! The decision is a pure function ([`decide`]) over the Lease as last read and how long it has
//! stayed unchanged; [`LeaderElector`] is the thin I/O around it (GET, then POST or PUT with the
//! read `resourceVersion`, so two candidates racing for the same Lease cannot both win).
//!
//! Expiry is judged the way client-go judges it: not by comparing the holder's `renewTime` with
//! this process's clock (clocks skew), but by how long *this process* has seen the Lease record
//! unchanged, measured on the monotonic clock. A candidate that starts while another holds the
//! Lease therefore waits a full `leaseDurationSeconds` before taking over.
//!
//! Timings follow client-go's defaults: lease 15 s, renew deadline 10 s, retry every 2 s. A
//! leader that cannot renew within the renew deadline steps down *before* the Lease can expire
//! for the others, so two writers never overlap while the clocks run at the same rate.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Settings of one candidate.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This candidate's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Pause between two attempts (acquire or renew).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// A candidate with client-go's default timings (15 s, 10 s, 2 s).
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a candidate should do with the Lease as it now reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it, holding it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or the holder let it expire: claim it (counts a transition).
    TakeOver {
        /// `leaseTransitions` to write.
        transitions: i32,
    },
    /// Someone else holds a live Lease.
    Follow {
        /// The current holder.
        holder: String,
        /// How long until we may take over if the holder stops renewing.
        expires_in: Duration,
    },
}

/// Decide what to do with `current` (None: no Lease object), given that this process has seen the
/// Lease's spec unchanged for `unchanged_for`. `default_duration` applies when the Lease does not
/// state its own `leaseDurationSeconds`.
pub fn decide(
    me: &str,
    current: Option<&LeaseSpec>,
    unchanged_for: Duration,
    default_duration: Duration,
) -> Decision {
    let Some(spec) = current else {
        return Decision::Create;
    };
    let transitions = spec.lease_transitions.unwrap_or(0);
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver {
            transitions: transitions.saturating_add(1),
        };
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    if unchanged_for >= duration {
        Decision::TakeOver {
            transitions: transitions.saturating_add(1),
        }
    } else {
        Decision::Follow {
            holder: holder.to_string(),
            expires_in: duration - unchanged_for,
        }
    }
}

/// Errors of one election step.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A Lease call did not answer within the step's time budget.
    #[error("lease {namespace}/{name}: no answer within {budget:?}")]
    Timeout {
        namespace: String,
        name: String,
        budget: Duration,
    },
    /// The API server refused or failed a Lease call.
    #[error("failed to {op} lease {namespace}/{name}: {source}")]
    Api {
        op: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The outcome of one step, for logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// We hold the Lease after this step.
    Leading,
    /// Someone else holds it (or won the race for it).
    Following { holder: Option<String> },
}

/// One candidate: the Lease I/O around [`decide`].
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The Lease spec as last read, and when (monotonic) it last changed.
    observed: Option<(LeaseSpec, Instant)>,
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

impl LeaderElector {
    /// A candidate for `config`'s Lease.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self {
            api,
            config,
            observed: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn err(&self, op: &'static str, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            op,
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source: Box::new(source),
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    fn held_spec(&self, acquire_time: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(acquire_time.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Read the Lease, decide, and act once.
    #[tracing::instrument(skip(self), fields(lease = %self.config.name, identity = %self.config.identity))]
    pub async fn try_acquire_or_renew(&mut self) -> Result<Step, LeaderError> {
        let current = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.err("get", e))?;
        let now = Instant::now();
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        match (&self.observed, &spec) {
            (Some((seen, _)), Some(spec)) if seen == spec => {}
            (_, Some(spec)) => self.observed = Some((spec.clone(), now)),
            (_, None) => self.observed = None,
        }
        let unchanged_for = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |(_, at)| now.duration_since(*at));
        let decision = decide(
            &self.config.identity,
            spec.as_ref(),
            unchanged_for,
            self.config.lease_duration,
        );
        tracing::debug!(?decision, "lease decision");
        match decision {
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.held_spec(None, 0)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => self.leading(created, now),
                    Err(e) if is_status(&e, 409) => Ok(Step::Following { holder: None }),
                    Err(e) => Err(self.err("create", e)),
                }
            }
            Decision::Renew | Decision::TakeOver { .. } => {
                let Some(mut lease) = current else {
                    // decide() returns Create whenever no Lease was read.
                    return Ok(Step::Following { holder: None });
                };
                let old = lease.spec.clone().unwrap_or_default();
                lease.spec = Some(match decision {
                    Decision::TakeOver { transitions } => {
                        tracing::info!(
                            previous = old.holder_identity.as_deref().unwrap_or(""),
                            "taking over lease"
                        );
                        self.held_spec(None, transitions)
                    }
                    _ => {
                        self.held_spec(old.acquire_time.clone(), old.lease_transitions.unwrap_or(0))
                    }
                });
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(updated) => self.leading(updated, now),
                    Err(e) if is_status(&e, 409) => Ok(Step::Following {
                        holder: old.holder_identity,
                    }),
                    Err(e) => Err(self.err("update", e)),
                }
            }
            Decision::Follow { holder, .. } => Ok(Step::Following {
                holder: Some(holder),
            }),
        }
    }

    fn leading(&mut self, lease: Lease, now: Instant) -> Result<Step, LeaderError> {
        self.observed = Some((lease.spec.unwrap_or_default(), now));
        Ok(Step::Leading)
    }

    /// Give the Lease up (on shutdown) so a follower takes over at once instead of after
    /// `leaseDurationSeconds`: the holder is cleared and the duration set to one second, as
    /// client-go's `ReleaseOnCancel` does. Does nothing when we do not hold it.
    pub async fn release(&mut self) -> Result<bool, LeaderError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.err("get", e))?
        else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: spec.lease_transitions,
            ..LeaseSpec::default()
        });
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| self.err("release", e))?;
        self.observed = None;
        tracing::info!(lease = %self.config.name, "released lease");
        Ok(true)
    }

    /// The time budget of one step: a leader's ends at its renew deadline (a call that hangs
    /// must not keep it leading while a follower's view of the Lease expires, as client-go
    /// bounds renewals); a follower's is the renew deadline.
    fn step_budget(&self, last_renewed: Option<Instant>) -> Duration {
        match last_renewed {
            Some(at) => self.config.renew_deadline.saturating_sub(at.elapsed()),
            None => self.config.renew_deadline,
        }
    }

    /// Run the election until `shutdown`: publish leadership on `leader` (true while we may
    /// write), renew every `retry_period`, step down when renewal has failed (or not answered)
    /// for `renew_deadline`, and release the Lease on shutdown if we hold it.
    pub async fn run(mut self, leader: watch::Sender<bool>, shutdown: CancellationToken) {
        let mut last_renewed: Option<Instant> = None;
        loop {
            // A renewal counts from when it was sent: the API server may have applied it at any
            // moment after that, so that is when the others' view of the Lease restarts.
            let sent = Instant::now();
            let budget = self.step_budget(last_renewed);
            let result = tokio::select! {
                () = shutdown.cancelled() => break,
                result = tokio::time::timeout(budget, self.try_acquire_or_renew()) => {
                    result.unwrap_or_else(|_| Err(LeaderError::Timeout {
                        namespace: self.config.namespace.clone(),
                        name: self.config.name.clone(),
                        budget,
                    }))
                }
            };
            let now = Instant::now();
            match result {
                Ok(Step::Leading) => {
                    last_renewed = Some(sent);
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.config.identity, "became leader");
                    }
                    leader.send_replace(true);
                }
                Ok(Step::Following { holder }) => {
                    if *leader.borrow() {
                        tracing::warn!(holder = holder.as_deref().unwrap_or(""), "lost leadership");
                    }
                    last_renewed = None;
                    leader.send_replace(false);
                }
                Err(error) => {
                    tracing::warn!(%error, "lease step failed");
                    if let Some(at) = last_renewed
                        && now.duration_since(at) >= self.config.renew_deadline
                    {
                        tracing::warn!(deadline = ?self.config.renew_deadline, "could not renew lease in time; stepping down");
                        last_renewed = None;
                        leader.send_replace(false);
                    }
                }
            }
            // A leader whose renewals fail wakes up at its deadline at the latest (the next
            // step's budget is then zero, and it steps down), never a retry period after it.
            let pause = match last_renewed {
                Some(at) => self
                    .config
                    .retry_period
                    .min(self.config.renew_deadline.saturating_sub(at.elapsed())),
                None => self.config.retry_period,
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let was_leader = leader.send_replace(false);
        if (was_leader || last_renewed.is_some())
            && let Err(error) = self.release().await
        {
            tracing::warn!(%error, "failed to release lease on shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, duration: Option<i32>, transitions: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: duration,
            lease_transitions: transitions,
            ..LeaseSpec::default()
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn no_lease_is_created() {
        assert_eq!(decide("a", None, Duration::ZERO, D), Decision::Create);
    }

    #[test]
    fn own_lease_is_renewed_even_when_old() {
        let s = spec(Some("a"), Some(15), Some(3));
        assert_eq!(
            decide("a", Some(&s), Duration::from_secs(100), D),
            Decision::Renew
        );
    }

    #[test]
    fn live_lease_of_another_is_followed_with_time_left() {
        let s = spec(Some("b"), Some(15), Some(1));
        assert_eq!(
            decide("a", Some(&s), Duration::from_secs(4), D),
            Decision::Follow {
                holder: "b".into(),
                expires_in: Duration::from_secs(11)
            }
        );
    }

    #[test]
    fn expired_lease_is_taken_over_and_counts_a_transition() {
        let s = spec(Some("b"), Some(15), Some(1));
        assert_eq!(
            decide("a", Some(&s), Duration::from_secs(15), D),
            Decision::TakeOver { transitions: 2 }
        );
    }

    #[test]
    fn released_lease_is_taken_at_once() {
        let s = spec(None, Some(1), Some(4));
        assert_eq!(
            decide("a", Some(&s), Duration::ZERO, D),
            Decision::TakeOver { transitions: 5 }
        );
        let empty = spec(Some(""), None, None);
        assert_eq!(
            decide("a", Some(&empty), Duration::ZERO, D),
            Decision::TakeOver { transitions: 1 }
        );
    }

    #[test]
    fn lease_without_duration_uses_the_default() {
        let s = spec(Some("b"), None, None);
        assert!(matches!(
            decide("a", Some(&s), Duration::from_secs(14), D),
            Decision::Follow { .. }
        ));
        assert!(matches!(
            decide("a", Some(&s), Duration::from_secs(15), D),
            Decision::TakeOver { .. }
        ));
        let bogus = spec(Some("b"), Some(-3), None);
        assert!(matches!(
            decide("a", Some(&bogus), Duration::from_secs(14), D),
            Decision::Follow { .. }
        ));
    }
}
