//! The planner benchmarks' world: the generated cluster of
//! [`rocefabric_operator_testing::bench_cluster`] as the planner sees it.

use std::time::Duration;

use rocefabric_operator::planner::World;
use rocefabric_operator_testing::bench_cluster::{fabric, node, pod, t0};

/// The whole world, thirty days after `t0`.
pub fn world(
    nodes: usize,
    pods: usize,
    namespaces: usize,
    region_size: &str,
    max_regions: u32,
) -> World {
    World {
        fabrics: vec![fabric(region_size, max_regions)],
        nodes: (0..nodes).map(|i| node(i).into()).collect(),
        pods: (0..pods)
            .map(|i| pod(i, namespaces, nodes).into())
            .collect(),
        ..World::empty(t0() + Duration::from_secs(86_400 * 30))
    }
}
