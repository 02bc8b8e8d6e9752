//! Prometheus metrics of the operator, rendered in the OpenMetrics text format on `/metrics`.
//!
//! Names carry the `rocefabric_operator_` prefix:
//! - `reconciles_total`: passes run by the leader;
//! - `reconcile_failures_total{reason}`: failed passes or writes, by error category;
//! - `reconcile_duration_seconds`: histogram of pass durations (plan + writes);
//! - `writes_total{kind}`: write requests sent, by kind of write;
//! - `nodes{fabric,state}`: nodes of each fabric by state (`selected`, `configured`, `failed`,
//!   `conflicting`);
//! - `regions_allocated{fabric}` and `regions_capacity{fabric}`;
//! - `pods_waiting{fabric}`: pods the fabric selects that wait, gated, for a region (regions
//!   exhausted, a bad request, over a quota);
//! - `leader`: 1 while this replica holds the Lease.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use rocefabric_api::NodeCounts;

/// `reason` label of a failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// `kind` label of a write.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// `fabric` and `state` labels of the node gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    pub fabric: String,
    pub state: String,
}

/// `fabric` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FabricLabels {
    pub fabric: String,
}

/// Per-fabric figures of one pass, as the gauges show them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricFigures {
    pub nodes: NodeCounts,
    pub regions_allocated: u32,
    pub regions_capacity: u32,
    pub pods_waiting: u32,
}

/// All metrics of the operator and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Counter,
    pub failures: Family<ReasonLabels, Counter>,
    pub duration: Histogram,
    pub writes: Family<KindLabels, Counter>,
    pub nodes: Family<NodeStateLabels, Gauge>,
    pub regions_allocated: Family<FabricLabels, Gauge>,
    pub regions_capacity: Family<FabricLabels, Gauge>,
    pub pods_waiting: Family<FabricLabels, Gauge>,
    pub leader: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub cache_synced: Gauge<f64, AtomicU64>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rocefabric_operator");
        let reconciles = Counter::default();
        let failures = Family::<ReasonLabels, Counter>::default();
        // 1 ms .. ~33 s
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let writes = Family::<KindLabels, Counter>::default();
        let nodes = Family::<NodeStateLabels, Gauge>::default();
        let regions_allocated = Family::<FabricLabels, Gauge>::default();
        let regions_capacity = Family::<FabricLabels, Gauge>::default();
        let pods_waiting = Family::<FabricLabels, Gauge>::default();
        let leader = Gauge::default();
        let cache_synced = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "reconciles",
            "Reconcile passes run by the leader",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconcile passes and writes, by reason",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of a reconcile pass (plan and writes)",
            duration.clone(),
        );
        registry.register(
            "writes",
            "Write requests sent to the API server, by kind",
            writes.clone(),
        );
        registry.register("nodes", "Nodes of each fabric, by state", nodes.clone());
        registry.register(
            "regions_allocated",
            "Shared memory regions held by live pods",
            regions_allocated.clone(),
        );
        registry.register(
            "regions_capacity",
            "Shared memory regions a fabric can hold",
            regions_capacity.clone(),
        );
        registry.register(
            "pods_waiting",
            "Pods of a fabric left waiting, gated, for a region",
            pods_waiting.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        registry.register(
            "cache_synced",
            "1 once every watched cache has listed",
            cache_synced.clone(),
        );
        Self {
            registry,
            reconciles,
            failures,
            duration,
            writes,
            nodes,
            regions_allocated,
            regions_capacity,
            pods_waiting,
            leader,
            cache_synced,
        }
    }

    /// Count one failure of category `reason`.
    pub fn failure(&self, reason: &str) {
        self.failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Count one write of `kind`.
    pub fn write(&self, kind: &str) {
        self.writes
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Record a finished pass.
    pub fn pass(&self, took: Duration) {
        self.reconciles.inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Replace the per-fabric gauges with `figures` (fabrics not listed disappear).
    pub fn set_fabrics<'a>(&self, figures: impl IntoIterator<Item = (&'a str, &'a FabricFigures)>) {
        self.nodes.clear();
        self.regions_allocated.clear();
        self.regions_capacity.clear();
        self.pods_waiting.clear();
        for (fabric, f) in figures {
            for (state, n) in [
                ("selected", f.nodes.selected),
                ("configured", f.nodes.configured),
                ("failed", f.nodes.failed),
                ("conflicting", f.nodes.conflicting),
            ] {
                self.nodes
                    .get_or_create(&NodeStateLabels {
                        fabric: fabric.to_string(),
                        state: state.to_string(),
                    })
                    .set(i64::from(n));
            }
            let label = FabricLabels {
                fabric: fabric.to_string(),
            };
            self.regions_allocated
                .get_or_create(&label)
                .set(i64::from(f.regions_allocated));
            self.regions_capacity
                .get_or_create(&label)
                .set(i64::from(f.regions_capacity));
            self.pods_waiting
                .get_or_create(&label)
                .set(i64::from(f.pods_waiting));
        }
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histogram() {
        let m = Metrics::new();
        m.pass(Duration::from_millis(3));
        m.failure("api");
        m.write("ApplyRoceNode");
        let figures = FabricFigures {
            nodes: NodeCounts {
                selected: 4,
                configured: 3,
                failed: 1,
                conflicting: 2,
            },
            regions_allocated: 7,
            regions_capacity: 64,
            pods_waiting: 2,
        };
        m.set_fabrics([("dgx", &figures)]);
        let text = m.render().expect("encodes");
        assert!(
            text.contains("rocefabric_operator_reconciles_total 1"),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_reconcile_failures_total{reason="api"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_writes_total{kind="ApplyRoceNode"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_nodes{fabric="dgx",state="configured"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_nodes{fabric="dgx",state="conflicting"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_regions_allocated{fabric="dgx"} 7"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rocefabric_operator_pods_waiting{fabric="dgx"} 2"#),
            "{text}"
        );
        assert!(
            text.contains("rocefabric_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn fabrics_that_disappear_leave_the_gauges() {
        let m = Metrics::new();
        let f = FabricFigures::default();
        m.set_fabrics([("a", &f), ("b", &f)]);
        m.set_fabrics([("b", &f)]);
        let text = m.render().expect("encodes");
        assert!(!text.contains(r#"fabric="a""#), "{text}");
        assert!(text.contains(r#"fabric="b""#), "{text}");
    }
}
