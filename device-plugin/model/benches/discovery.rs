//! Discovery on the DGX H100 fixture, and the pure allocation decisions over its inventory.
//!
//! `cargo bench -p rocefabric-device-plugin --bench discovery`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rocefabric_api::NicSelector;
use rocefabric_node_model::allocation::{self, ResourceKind};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::{inventory, topology};
use rocefabric_node_testing::fixtures::{self, FixtureNode};

fn benches(c: &mut Criterion) {
    let dir = fixtures::tempdir().expect("temp dir");
    FixtureNode::dgx_h100()
        .write_to(dir.path())
        .expect("write fixture");
    let selector = NicSelector::default();
    c.bench_function("write dgx-h100 fixture", |b| {
        b.iter(|| {
            let d = fixtures::tempdir().expect("temp dir");
            FixtureNode::dgx_h100()
                .write_to(d.path())
                .expect("write fixture");
        })
    });
    c.bench_function("discover dgx-h100", |b| {
        b.iter(|| inventory::discover(black_box(dir.path()), &selector).expect("discover"))
    });
    let inv = inventory::discover(dir.path(), &selector).expect("discover");
    c.bench_function("topology matrix dgx-h100", |b| {
        b.iter(|| topology::matrix(black_box(&inv)))
    });

    let cfg = Config::default();
    let grant = vec!["0000:18:00.0".to_string(), "0000:40:00.0".to_string()];
    c.bench_function("allocate 2 HCAs", |b| {
        b.iter(|| allocation::allocate(ResourceKind::Hca, &inv, &cfg, Some(106), black_box(&grant)))
    });
    let mut pair_cfg = Config::default();
    pair_cfg.gpu_hca.enabled = true;
    let pairs: Vec<String> = allocation::advertised(ResourceKind::GpuHca, &inv, &pair_cfg)
        .into_iter()
        .take(4)
        .map(|d| d.id)
        .collect();
    assert_eq!(pairs.len(), 4);
    c.bench_function("allocate 4 GPU-HCA pairs", |b| {
        b.iter(|| {
            allocation::allocate(
                ResourceKind::GpuHca,
                &inv,
                &pair_cfg,
                None,
                black_box(&pairs),
            )
        })
    });

    let all: Vec<String> = allocation::advertised(ResourceKind::Hca, &inv, &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    c.bench_function("preferred 4 of 14 HCAs", |b| {
        b.iter(|| {
            allocation::preferred(
                ResourceKind::Hca,
                &inv,
                &cfg,
                allocation::PreferredRequest {
                    available: black_box(&all),
                    must_include: &[],
                    size: 4,
                },
            )
        })
    });
    let mut shared = Config::default();
    shared.hca.shared_replicas = 16;
    let all_shared: Vec<String> = allocation::advertised(ResourceKind::Hca, &inv, &shared)
        .into_iter()
        .map(|d| d.id)
        .collect();
    c.bench_function("preferred 4 of 224 HCA replicas", |b| {
        b.iter(|| {
            allocation::preferred(
                ResourceKind::Hca,
                &inv,
                &shared,
                allocation::PreferredRequest {
                    available: black_box(&all_shared),
                    must_include: &[],
                    size: 4,
                },
            )
        })
    });
}

criterion_group!(discovery, benches);
criterion_main!(discovery);
