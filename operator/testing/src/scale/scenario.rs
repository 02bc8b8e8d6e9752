//! The scenario both the bench and the test run: serve a generated cluster, start the operator,
//! wait until it has converged, then send single events (a new fabric pod, a node leaving and
//! rejoining the fabric, an unrelated label change) one at a time, each on a quiet operator,
//! and time them from the event to the write it causes.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::apiserver::{ApiServer, Census, Options, Resource};
use super::cluster::{GeneratedCluster, MEMBER_LABEL, NOISE_LABEL};
use super::operator::{Operator, Pass};

/// A generated cluster being served and the operator running against it.
pub struct Harness {
    pub server: ApiServer,
    pub operator: Operator,
    /// How long generating the cluster took.
    pub generated_in: Duration,
    /// Longest wait for any single pass.
    pass_timeout: Duration,
    /// A quiet operator passes no more than this long after its last pass with nothing to do.
    quiet: Duration,
    _dir: tempfile::TempDir,
    noise: u32,
    /// The last pass read.
    last: Option<Pass>,
    /// The shortest time from one pass's end to the next one's start: the debounce plus the
    /// world snapshot, which no log line times.
    shortest_gap: Option<Duration>,
    /// Print every pass while converging.
    pub progress: bool,
    /// How the operator was started (to start it again).
    binary: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    args: Vec<String>,
    /// The operator watches only fabric pods (`--pod-label-selector`): an unrelated change must
    /// be made on one of those for the operator to see it.
    pub watches_only_fabric_pods: bool,
}

/// How long the harness waits on the operator.
#[derive(Clone, Copy, Debug)]
pub struct Waits {
    /// Longest wait for any single pass.
    pub pass_timeout: Duration,
    /// A quiet operator passes no more than this long after its last pass with nothing to do.
    pub quiet: Duration,
}

/// How the operator reached its steady state.
#[derive(Clone, Debug)]
pub struct Convergence {
    /// Spawn to the first write of a plan received.
    pub first_write: Duration,
    /// Spawn to caches synced.
    pub synced: Option<Duration>,
    /// The first pass.
    pub first_pass: Pass,
    /// Spawn to the first pass with nothing to do on a converged cluster.
    pub converged: Duration,
    pub passes: usize,
    pub writes: u64,
    pub census: Census,
}

/// A fabric edit rolled out over every node.
#[derive(Clone, Copy, Debug)]
pub struct Rollout {
    /// The edit to the last node reporting the new generation applied.
    pub wall: Duration,
    /// The operator's CPU time (user and system) over the same span and its last passes.
    pub cpu: Duration,
    pub passes: usize,
    /// Of `passes`, those planned in full.
    pub full_passes: usize,
    pub writes: u64,
}

/// One event and the write it caused.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Event made to the write request received.
    pub latency: Duration,
    /// Event made to the start of the pass that handled it (the debounce, the watch delivery,
    /// and the world snapshot, which `plan_us` and `took_ms` leave out).
    pub to_pass: Duration,
    /// The pass that sent the write.
    pub pass: Pass,
}

impl Timed {
    fn new(made: (Instant, Timestamp), written: Instant, pass: Pass) -> Timed {
        let started = pass.logged
            - k8s_openapi::jiff::SignedDuration::from_millis(
                i64::try_from(pass.took_ms).unwrap_or(i64::MAX),
            );
        Timed {
            latency: written - made.0,
            to_pass: Duration::try_from(started.duration_since(made.1)).unwrap_or_default(),
            pass,
        }
    }
}

impl Harness {
    /// Serve `cluster` and start the operator binary with `args` (after the fixed ones).
    pub async fn start(
        cluster: GeneratedCluster,
        options: Options,
        binary: &Path,
        args: &[String],
        waits: Waits,
    ) -> anyhow::Result<Harness> {
        let Waits {
            pass_timeout,
            quiet,
        } = waits;
        let t = Instant::now();
        let server = ApiServer::start(cluster, options).await?;
        let generated_in = t.elapsed();
        let dir = tempfile::tempdir().context("failed to make a temp dir")?;
        let kubeconfig = server.write_kubeconfig(dir.path())?;
        let operator = Operator::spawn(binary, &kubeconfig, args)?;
        Ok(Harness {
            binary: binary.to_path_buf(),
            kubeconfig,
            args: args.to_vec(),
            server,
            operator,
            generated_in,
            pass_timeout,
            quiet,
            _dir: dir,
            noise: 0,
            watches_only_fabric_pods: false,
            last: None,
            shortest_gap: None,
            progress: false,
        })
    }

    /// Whether the census shows everything done: every node configured, every fabric pod
    /// annotated and ungated, a region directory per namespace with fabric pods.
    pub fn done(&self, c: &Census, nodes: usize) -> bool {
        c.roce_nodes == nodes
            && c.configured == nodes
            && c.annotated == c.fabric_pods
            && c.gated == 0
            && c.region_directories == c.fabric_namespaces
    }

    /// Wait for the first pass with nothing to do on a cluster that is done, within `timeout`.
    pub async fn converge(
        &mut self,
        nodes: usize,
        timeout: Duration,
    ) -> anyhow::Result<Convergence> {
        let deadline = Instant::now() + timeout;
        let mut first_pass = None;
        let (mut passes, mut writes) = (0, 0);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let pass = self
                .operator
                .next_pass(left.min(self.pass_timeout))
                .await
                .with_context(|| {
                    format!(
                        "not converged after {passes} passes; census {:?}",
                        self.server.census()
                    )
                })?;
            passes += 1;
            writes += pass.writes;
            first_pass.get_or_insert(pass);
            let census = self.server.census();
            if self.progress {
                eprintln!(
                    "[{:7.1} s] pass {passes}: {} writes ({} failed), planner {:.3} s, pass {:.1} s; \
                     rocenodes {}/{nodes} configured, fabric pods {}/{} annotated ({} gated), \
                     directories {}/{}",
                    (pass.at - self.operator.spawned).as_secs_f64(),
                    pass.writes,
                    pass.failed,
                    pass.plan_us as f64 / 1e6,
                    pass.took_ms as f64 / 1e3,
                    census.configured,
                    census.annotated,
                    census.fabric_pods,
                    census.gated,
                    census.region_directories,
                    census.fabric_namespaces,
                );
            }
            if pass.writes == 0 && self.done(&census, nodes) {
                let spawned = self.operator.spawned;
                let first_write = self
                    .server
                    .first_write()
                    .context("converged without a single write")?;
                return Ok(Convergence {
                    first_write: first_write - spawned,
                    synced: self.operator.synced.map(|s| s - spawned),
                    first_pass: first_pass.unwrap_or(pass),
                    converged: pass.at - spawned,
                    passes,
                    writes,
                    census,
                });
            }
        }
    }

    /// The next pass; keeps the shortest gap between passes.
    async fn next_pass(&mut self, timeout: Duration) -> anyhow::Result<Pass> {
        let pass = self.operator.next_pass(timeout).await?;
        if let Some(last) = self.last {
            let gap =
                Duration::try_from(pass.started().duration_since(last.logged)).unwrap_or_default();
            self.shortest_gap = Some(self.shortest_gap.map_or(gap, |g| g.min(gap)));
        }
        self.last = Some(pass);
        Ok(pass)
    }

    /// How long after a change the operator's next pass surely ends: `quiet`, plus twice the
    /// debounce and snapshot and twice the last pass.
    fn reaction(&self) -> Duration {
        let took = self.last.map_or(0, |p| p.took_ms);
        self.quiet + self.shortest_gap.unwrap_or_default() * 2 + Duration::from_millis(took * 2)
    }

    /// Wait until a pass had nothing to do and no other followed within the operator's
    /// reaction time (the last event's consequences have played out: a change its snapshot
    /// missed would have brought another pass), or two passes in a row had nothing to do (the
    /// second saw the first's world: with a short resync and only resyncs since a restart, the
    /// reaction time, twice the shortest gap, outlasts the resync).
    pub async fn settle(&mut self) -> anyhow::Result<()> {
        loop {
            let idle = self.last.is_some_and(|p| p.writes == 0);
            let wait = if idle {
                self.reaction()
            } else {
                self.pass_timeout
            };
            match self.next_pass(wait).await {
                Ok(pass) if idle && pass.writes == 0 => return Ok(()),
                Ok(_) => {}
                Err(_) if idle && self.operator.running() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// The first pass with writes after `at` (the one that sent the write seen at `at`).
    async fn pass_after(&mut self, at: Instant) -> anyhow::Result<Pass> {
        loop {
            let pass = self.next_pass(self.pass_timeout).await?;
            if pass.at >= at && pass.writes > 0 {
                return Ok(pass);
            }
        }
    }

    async fn write_seen(
        &self,
        rx: tokio::sync::oneshot::Receiver<Instant>,
        what: &str,
    ) -> anyhow::Result<Instant> {
        tokio::time::timeout(self.pass_timeout, rx)
            .await
            .with_context(|| format!("no write for {what} within {:?}", self.pass_timeout))?
            .context("the server went away")
    }

    /// Stop the operator and start it again with `extra` arguments after the first ones (e.g.
    /// another write rate); returns once the new one has settled.
    pub async fn restart_operator(&mut self, extra: &[String]) -> anyhow::Result<()> {
        let args: Vec<String> = self.args.iter().chain(extra).cloned().collect();
        self.operator = Operator::spawn(&self.binary, &self.kubeconfig, &args)?;
        self.last = None;
        self.shortest_gap = None;
        self.next_pass(self.pass_timeout).await?;
        self.settle().await
    }

    /// Edit the fabric with `edit` (its spec) and wait until all `nodes` report the new
    /// generation applied and the operator is quiet again. The edit comes once the operator
    /// plans off its indexes, as a long-running one does: for `region_grace` after a start
    /// (the takeover hold) every pass is a full one.
    pub async fn fabric_rollout(
        &mut self,
        nodes: usize,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> anyhow::Result<Rollout> {
        while self.next_pass(self.pass_timeout).await?.full {}
        self.settle().await?;
        let cpu = self.operator.cpu()?;
        let t = Instant::now();
        self.server.edit_fabric(edit)?;
        let (mut passes, mut full_passes, mut writes, mut wall) = (0, 0, 0, None);
        loop {
            let pass = self
                .next_pass(self.pass_timeout)
                .await
                .with_context(|| format!("rollout not done; census {:?}", self.server.census()))?;
            passes += 1;
            full_passes += usize::from(pass.full);
            writes += pass.writes;
            let census = self.server.census();
            if self.progress {
                eprintln!(
                    "[{:7.1} s] rollout pass {passes}: {} writes, planner {:.3} s{}; {}/{nodes} at the new generation; operator CPU {:.2} s",
                    t.elapsed().as_secs_f64(),
                    pass.writes,
                    pass.plan_us as f64 / 1e6,
                    if pass.full { " (full)" } else { "" },
                    census.configured_current,
                    (self.operator.cpu()? - cpu).as_secs_f64()
                );
            }
            if census.configured_current == nodes {
                let done = *wall.get_or_insert_with(|| t.elapsed());
                if pass.writes == 0 {
                    return Ok(Rollout {
                        wall: done,
                        cpu: self.operator.cpu()? - cpu,
                        passes,
                        full_passes,
                        writes,
                    });
                }
            }
        }
    }

    /// A new gated fabric pod, timed to its annotation PATCH.
    pub async fn new_fabric_pod(&mut self) -> anyhow::Result<(Timed, String, String)> {
        self.settle().await?;
        let made = (Instant::now(), Timestamp::now());
        let (pod, rx) = self.server.add_pod(true);
        let at = self
            .write_seen(rx, &format!("pod {}/{}", pod.namespace, pod.name))
            .await?;
        let pass = self.pass_after(at).await?;
        Ok((Timed::new(made, at, pass), pod.namespace, pod.name))
    }

    /// Node `i` leaves the fabric (its member label removed, `join` false) or joins it again,
    /// timed to the RoceNode DELETE or apply.
    pub async fn node_membership(&mut self, i: u32, join: bool) -> anyhow::Result<Timed> {
        self.settle().await?;
        let name = self.server.cluster().node_name(i);
        let rx = self.server.next_write(Resource::RoceNodes, None, &name);
        let made = (Instant::now(), Timestamp::now());
        self.server
            .set_node_label(i, MEMBER_LABEL, join.then_some("true"));
        let at = self.write_seen(rx, &format!("rocenode {name}")).await?;
        let pass = self.pass_after(at).await?;
        Ok(Timed::new(made, at, pass))
    }

    /// An unrelated label change on a plain pod (a fabric pod when the operator watches only
    /// those): the pass it triggers.
    pub async fn unrelated_change(&mut self) -> anyhow::Result<Pass> {
        self.settle().await?;
        self.noise += 1;
        let cluster = self.server.cluster();
        let fabric = self.watches_only_fabric_pods;
        let i = (self.noise % 64..)
            .find(|&i| cluster.initially_fabric(i) == fabric)
            .context("no pod to touch")?;
        self.server
            .set_pod_label(i, NOISE_LABEL, Some(&self.noise.to_string()));
        let t = Instant::now();
        loop {
            let pass = self.next_pass(self.pass_timeout).await?;
            if pass.at > t {
                return Ok(pass);
            }
        }
    }
}
