//! The operator at "100,000 nodes and 1,000,000 pods": the real binary against an in-process
//! API server serving a generated cluster (see `rocefabric_operator_testing::scale`), from a cold start to a
//! converged fabric, then single events on the quiet operator. Prints every figure of the
//! issue with its target; asserts no timing (it fails only when the operator crashes or never
//! converges).
//!
//! Run: `cargo bench -p rocefabric-operator --bench scale`. Sizes and budgets from the
//! environment:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `SCALE_NODES`, `SCALE_PODS`, `SCALE_FABRIC_PODS`, `SCALE_NAMESPACES` | the cluster | 100,000, 1,000,000, 100,000, 1,000 |
//! | `SCALE_EVENTS` | pod events, and node events (half leave, half rejoin) | 200 |
//! | `SCALE_EVENT_SECONDS` | time budget of each kind of event (fewer are taken past it) | 600 |
//! | `SCALE_QUIET_PASSES` | passes with nothing to do | 20 |
//! | `SCALE_CONVERGE_SECONDS` | longest wait for convergence | 1800 |
//! | `SCALE_DEBOUNCE_MS`, `SCALE_RESYNC_SECONDS` | the operator's `--debounce-ms` and `--resync-seconds` | 50, 60 |
//! | `SCALE_RUST_LOG` | the operator's `RUST_LOG` | info |
//! | `SCALE_POD_SELECTOR` | the operator's `--pod-label-selector` (e.g. `rocefabric.io/fabric`) | none: every pod |
//! | `SCALE_OPERATOR_LOG` | a file every line the operator logs is appended to | none |
//! | `SCALE_OPERATOR_WORKERS` | the operator's tokio worker threads (`TOKIO_WORKER_THREADS`) | tokio's default: one per core |
//! | `SCALE_ROLLOUT_QPS` | last, the operator restarted with this `--write-qps` rolls an MTU edit out at `maxUnavailable: 10%` (`skip`: not) | 100 (the chart's default) |
//!
//! The operator converges with no write limit (`--write-qps 0`: 300,000 first writes at the
//! chart's 100/s would take most of an hour); the rollout runs at the limit users run.
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use rocefabric_operator_testing::scale::apiserver::Options;
use rocefabric_operator_testing::scale::cluster::{GeneratedCluster, NodeState, Sizes};
use rocefabric_operator_testing::scale::operator::{Heap, Memory, Pass};
use rocefabric_operator_testing::scale::scenario::{Convergence, Harness, Rollout, Timed, Waits};
use tokio::time::Instant;

// Counts the harness's own heap, for the per-object costs (the operator is another process).
#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

const FULL: Sizes = Sizes {
    nodes: 100_000,
    pods: 1_000_000,
    fabric_pods: 100_000,
    namespaces: 1_000,
};

fn env_u64(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// A duration the way a reader scans it: µs, ms or s.
fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1e3 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// The `q` quantile (nearest rank) of `values`; zero when empty.
fn quantile(values: &[Duration], q: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied().unwrap_or_default()
}

fn p50_p99(values: &[Duration]) -> String {
    format!(
        "{} / {}",
        human(quantile(values, 0.5)),
        human(quantile(values, 0.99))
    )
}

fn planner(passes: &[Pass]) -> Vec<Duration> {
    passes
        .iter()
        .map(|p| Duration::from_micros(p.plan_us))
        .collect()
}

/// What the operator keeps of one generated node and one fabric pod, in heap bytes as
/// requested (the allocator adds about 16 bytes per block): decoded as its watches decode them
/// (compact objects). The profile behind the memory figure.
fn object_costs(cluster: &GeneratedCluster) -> anyhow::Result<(usize, usize)> {
    use rocefabric_operator::objects::{CompactNode, CompactPod, Wire};
    const SAMPLE: u32 = 1000;
    let node_json: Vec<String> = (0..SAMPLE)
        .map(|i| {
            cluster.node_json(
                i,
                &NodeState {
                    rv: 1,
                    labels: None,
                },
                true,
            )
        })
        .collect();
    let pod_json: Vec<String> = (0..)
        .filter(|i| cluster.initially_fabric(*i))
        .take(SAMPLE as usize)
        .map(|i| cluster.pod_json(i, &cluster.initial_pod(i, 1)))
        .collect();
    let before = HEAP.current_usage();
    let mut nodes = Vec::with_capacity(node_json.len());
    for j in &node_json {
        // As the node watch decodes it.
        let node: Wire<CompactNode> = serde_json::from_str(j)?;
        nodes.push(node.object);
    }
    let node_bytes = (HEAP.current_usage() - before) / nodes.len();
    let before = HEAP.current_usage();
    let mut pods = Vec::with_capacity(pod_json.len());
    for j in &pod_json {
        // As the pod watch decodes it.
        let pod: Wire<CompactPod> = serde_json::from_str(j)?;
        pods.push(pod.object);
    }
    let pod_bytes = (HEAP.current_usage() - before) / pods.len().max(1);
    Ok((node_bytes, pod_bytes))
}

/// Events of one kind, as many as fit `budget` (at least one).
async fn collect<F>(n: u64, budget: Duration, mut one: F) -> anyhow::Result<Vec<Timed>>
where
    F: AsyncFnMut(u64) -> anyhow::Result<Timed>,
{
    let start = Instant::now();
    let mut out = Vec::new();
    for k in 0..n {
        if k > 0 && start.elapsed() > budget {
            eprintln!("  time budget spent after {k} of {n} events");
            break;
        }
        if k > 0 && k % 20 == 0 {
            eprintln!("  {k} of {n}");
        }
        out.push(one(k).await?);
    }
    Ok(out)
}

/// Planner work, latency and its share before the pass, of one kind of event.
fn event_rows(row: &impl Fn(&str, String, &str), kind: &str, write: &str, events: &[Timed]) {
    let passes: Vec<Pass> = events.iter().map(|t| t.pass).collect();
    row(
        &format!("{kind}: planner work p50 / p99 (n={})", events.len()),
        p50_p99(&planner(&passes)),
        "p99 < 1 ms",
    );
    row(
        &format!("{kind}: {write} received, p50 / p99"),
        p50_p99(&events.iter().map(|t| t.latency).collect::<Vec<_>>()),
        "",
    );
    row(
        "  of which before the pass starts (debounce, watch, world snapshot)",
        p50_p99(&events.iter().map(|t| t.to_pass).collect::<Vec<_>>()),
        "",
    );
}

struct Figures {
    sizes: Sizes,
    generated_in: Duration,
    convergence: Convergence,
    converged_memory: Memory,
    converged_heap: Option<Heap>,
    /// Heap bytes the operator keeps per node and per fabric pod ([`object_costs`]).
    object_costs: (usize, usize),
    end_memory: Memory,
    harness_memory: Memory,
    pod_events: Vec<Timed>,
    node_events: Vec<Timed>,
    quiet: Vec<Pass>,
    requests: Vec<(String, u64)>,
    warnings: u64,
    /// The MTU rollout and its `--write-qps`.
    rollout: Option<(Rollout, String)>,
}

fn print(f: &Figures) {
    let s = f.sizes;
    let c = &f.convergence;
    let row = |figure: &str, measured: String, target: &str| {
        println!("| {figure} | {measured} | {target} |");
    };
    println!();
    println!(
        "## rocefabric-operator at scale: {} nodes, {} pods ({} fabric pods) in {} namespaces",
        s.nodes, s.pods, s.fabric_pods, s.namespaces
    );
    println!();
    println!("| figure | measured | target |");
    println!("|---|---|---|");
    row(
        "operator memory: peak (VmHWM) / after convergence (VmRSS)",
        format!(
            "{} / {}",
            gib(f.converged_memory.peak),
            gib(f.converged_memory.now)
        ),
        "< 1 GiB",
    );
    if let Some(heap) = f.converged_heap {
        row(
            "  resident once the allocator gave freed pages back, after the last full pass",
            gib(heap.resident),
            "",
        );
    }
    row(
        "  the operator's copy of one node / one fabric pod (compact objects), heap bytes",
        format!("{} / {}", f.object_costs.0, f.object_costs.1),
        "",
    );
    row(
        "operator memory at the end: VmHWM / VmRSS",
        format!("{} / {}", gib(f.end_memory.peak), gib(f.end_memory.now)),
        "< 1 GiB",
    );
    row(
        "cold start: spawn to first write received",
        human(c.first_write),
        "< 10 s",
    );
    row(
        "  spawn to caches synced",
        c.synced.map_or("-".into(), human),
        "",
    );
    row(
        "  first pass: planner / whole pass / writes",
        format!(
            "{} / {} / {}",
            human(Duration::from_micros(c.first_pass.plan_us)),
            human(Duration::from_millis(c.first_pass.took_ms)),
            c.first_pass.writes
        ),
        "",
    );
    event_rows(
        &row,
        "pod event",
        "new fabric pod to annotation PATCH",
        &f.pod_events,
    );
    event_rows(
        &row,
        "node label change",
        "to RoceNode DELETE / apply",
        &f.node_events,
    );
    let most_writes = f.quiet.iter().map(|p| p.writes).max().unwrap_or(0);
    row(
        &format!(
            "nothing-to-do pass: most writes, planner p50 / p99 (n={})",
            f.quiet.len()
        ),
        format!("{most_writes} writes, {}", p50_p99(&planner(&f.quiet))),
        "0 writes, < 5 ms",
    );
    row(
        "  whole pass p50 / p99",
        p50_p99(
            &f.quiet
                .iter()
                .map(|p| Duration::from_millis(p.took_ms))
                .collect::<Vec<_>>(),
        ),
        "",
    );
    if let Some((r, qps)) = &f.rollout {
        row(
            &format!(
                "MTU edit rolled out at maxUnavailable 10%, --write-qps {qps}: operator CPU / rollout wall ({} passes, {} of them full, {} writes)",
                r.passes, r.full_passes, r.writes
            ),
            format!(
                "{} / {} = {:.2}%",
                human(r.cpu),
                human(r.wall),
                100.0 * r.cpu.as_secs_f64() / r.wall.as_secs_f64().max(1e-9)
            ),
            "< 1%",
        );
    }
    println!();
    println!(
        "Harness: cluster generated in {}; converged {} after spawn in {} passes, {} writes; \
         harness RSS peak {} (now {}); operator warnings: {}.",
        human(f.generated_in),
        human(c.converged),
        c.passes,
        c.writes,
        gib(f.harness_memory.peak),
        gib(f.harness_memory.now),
        f.warnings
    );
    println!("Census at convergence: {:?}", c.census);
    let requests: Vec<String> = f.requests.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("Requests served: {}", requests.join(", "));
}

async fn run() -> anyhow::Result<()> {
    let sizes = Sizes::from_env(FULL)?;
    let events = env_u64("SCALE_EVENTS", 200)?;
    let budget = Duration::from_secs(env_u64("SCALE_EVENT_SECONDS", 600)?);
    let quiet_passes = env_u64("SCALE_QUIET_PASSES", 20)?;
    let converge_timeout = Duration::from_secs(env_u64("SCALE_CONVERGE_SECONDS", 1800)?);
    let debounce = env_u64("SCALE_DEBOUNCE_MS", 50)?;
    let resync = env_u64("SCALE_RESYNC_SECONDS", 60)?;
    let mut args: Vec<String> = vec![
        "--debounce-ms".into(),
        debounce.to_string(),
        "--resync-seconds".into(),
        resync.to_string(),
    ];
    if let Ok(selector) = std::env::var("SCALE_POD_SELECTOR") {
        args.extend(["--pod-label-selector".into(), selector]);
    }
    eprintln!("scale: {sizes:?}, {events} events of each kind, operator {args:?}");

    let mut h = Harness::start(
        GeneratedCluster::new(sizes),
        Options::default(),
        Path::new(env!("CARGO_BIN_EXE_rocefabric-operator")),
        &args,
        Waits {
            // A pass at full size can take minutes; the resync bounds a quiet wait.
            pass_timeout: converge_timeout.min(Duration::from_secs(600)),
            quiet: Duration::from_millis(debounce * 4).max(Duration::from_millis(300)),
        },
    )
    .await?;
    h.progress = true;
    h.watches_only_fabric_pods = std::env::var("SCALE_POD_SELECTOR").is_ok();
    eprintln!("cluster generated in {}", human(h.generated_in));
    let convergence = h
        .converge(sizes.nodes as usize, converge_timeout)
        .await
        .with_context(|| {
            let memory = h.operator.memory().unwrap_or_default();
            format!(
                "the operator did not converge (operator VmHWM {}, VmRSS {})",
                gib(memory.peak),
                gib(memory.now)
            )
        })?;
    let converged_memory = h.operator.memory()?;
    eprintln!(
        "converged after {}; memory {}",
        human(convergence.converged),
        gib(converged_memory.now)
    );

    eprintln!("pod events...");
    let pod_events = collect(events, budget, async |_| Ok(h.new_fabric_pod().await?.0)).await?;
    eprintln!("node events...");
    let step = (sizes.nodes / u32::try_from(events.max(1)).unwrap_or(1)).max(1);
    let node_events = collect(events, budget, async |k| {
        let i = u32::try_from(k / 2).unwrap_or(0) * step % sizes.nodes;
        h.node_membership(i, k % 2 == 1).await
    })
    .await?;
    eprintln!("passes with nothing to do...");
    let mut quiet = Vec::new();
    for _ in 0..quiet_passes {
        quiet.push(h.unrelated_change().await?);
    }
    // What the first operator ended with, before it is replaced for the rollout.
    let (end_memory, warnings, converged_heap) = (
        h.operator.memory()?,
        h.operator.warnings().0,
        h.operator.heap,
    );
    let rollout_qps = std::env::var("SCALE_ROLLOUT_QPS").unwrap_or_else(|_| "100".into());
    let rollout = if rollout_qps == "skip" {
        None
    } else {
        eprintln!("MTU rollout at --write-qps {rollout_qps}...");
        h.restart_operator(&["--write-qps".into(), rollout_qps.clone()])
            .await?;
        let r = h
            .fabric_rollout(sizes.nodes as usize, |spec| {
                let mtu = if spec["qos"]["mtu"] == 9000 {
                    4200
                } else {
                    9000
                };
                spec["qos"]["mtu"] = mtu.into();
                spec["rollout"]["maxUnavailable"] = "10%".into();
            })
            .await?;
        Some((r, rollout_qps))
    };
    let figures = Figures {
        rollout,
        sizes,
        generated_in: h.generated_in,
        convergence,
        converged_memory,
        converged_heap,
        object_costs: object_costs(&GeneratedCluster::new(sizes))?,
        end_memory,
        harness_memory: Memory::of("self")?,
        pod_events,
        node_events,
        quiet,
        requests: h.server.requests(),
        warnings,
    };
    print(&figures);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a filter that does not name this bench skips it.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.iter().any(|a| !"scale".contains(a.as_str())) {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}
