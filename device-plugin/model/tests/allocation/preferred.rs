//! Preferred allocations: one NUMA node and the tightest group, never an unhealthy device, shared
//! replicas spread; as a property, `size` distinct available IDs whatever the input order.

use std::collections::BTreeSet;

use proptest::prelude::*;
use rocefabric_node_model::allocation::{PreferredRequest, ResourceKind, advertised, preferred};
use rocefabric_node_model::config::Config;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{dgx, gpus_on, ids, inventory_of, numa_of, pairs_on, shared, shared_universe};

#[test]
fn preferred_keeps_to_one_numa_node_and_the_tightest_group() {
    let cfg = Config::default();
    let all: Vec<String> = advertised(ResourceKind::Hca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    // The tightest pair on the node: two ports of one card (PIX).
    assert_eq!(
        preferred(
            ResourceKind::Hca,
            dgx(),
            &cfg,
            PreferredRequest {
                available: &all,
                must_include: &[],
                size: 2
            }
        ),
        ["0000:29:00.0", "0000:29:00.1"]
    );
    // Growing around a NUMA 1 device stays on NUMA 1 and takes a PIX pair with it.
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &all,
            must_include: &ids(&["0000:9a:00.0"]),
            size: 3,
        },
    );
    assert_eq!(got, ["0000:9a:00.0", "0000:82:00.0", "0000:82:00.1"]);
    // Six HCAs fit on NUMA 0 only when they are NUMA 0's six.
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &all,
            must_include: &ids(&["0000:18:00.0"]),
            size: 6,
        },
    );
    assert!(
        got.iter()
            .all(|id| numa_of(dgx(), ResourceKind::Hca, &cfg, id) == Some(0)),
        "{got:?}"
    );
    // GPUs: four on one socket.
    let cfg = gpus_on();
    let gpus: Vec<String> = advertised(ResourceKind::Gpu, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(
        ResourceKind::Gpu,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &gpus,
            must_include: &ids(&["0000:d1:00.0"]),
            size: 4,
        },
    );
    assert_eq!(
        got,
        [
            "0000:d1:00.0",
            "0000:9d:00.0",
            "0000:c3:00.0",
            "0000:df:00.0"
        ]
    );
    let cfg = pairs_on();
    let pairs: Vec<String> = advertised(ResourceKind::GpuHca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(
        ResourceKind::GpuHca,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &pairs[3..],
            must_include: &[],
            size: 2,
        },
    );
    assert!(
        got.iter()
            .all(|id| numa_of(dgx(), ResourceKind::GpuHca, &cfg, id) == Some(1)),
        "GPU 3 is alone on NUMA 0 among the available: {got:?}"
    );
}

#[test]
fn preferred_never_proposes_an_unhealthy_device() {
    let inv = inventory_of(&FixtureNode::variant("dgx-h100-link-down").unwrap());
    let cfg = Config::default();
    let all: Vec<String> = advertised(ResourceKind::Hca, &inv, &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    for size in 1..=14 {
        let got = preferred(
            ResourceKind::Hca,
            &inv,
            &cfg,
            PreferredRequest {
                available: &all,
                must_include: &[],
                size,
            },
        );
        assert!(
            !got.contains(&"0000:40:00.0".to_string()),
            "size {size}: {got:?}"
        );
        assert_eq!(got.len(), size.min(13));
    }
    // ... unless the kubelet insists on it.
    let got = preferred(
        ResourceKind::Hca,
        &inv,
        &cfg,
        PreferredRequest {
            available: &all,
            must_include: &ids(&["0000:40:00.0"]),
            size: 2,
        },
    );
    assert_eq!(got[0], "0000:40:00.0");
    assert_eq!(got.len(), 2);
    // Unknown available IDs are ignored.
    let got = preferred(
        ResourceKind::Hca,
        &inv,
        &cfg,
        PreferredRequest {
            available: &ids(&["bogus", "0000:18:00.0"]),
            must_include: &[],
            size: 2,
        },
    );
    assert_eq!(got, ["0000:18:00.0"]);
}

#[test]
fn preferred_spreads_shared_replicas() {
    let cfg = shared(2);
    let all: Vec<String> = advertised(ResourceKind::Hca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &all,
            must_include: &[],
            size: 2,
        },
    );
    assert_eq!(
        got,
        ["0000:29:00.0#0", "0000:29:00.1#0"],
        "two distinct HCAs, not one twice"
    );
    // A single-HCA request goes to the HCA with the most free replicas.
    let avail = ids(&["0000:18:00.0#1", "0000:40:00.0#0", "0000:40:00.0#1"]);
    assert_eq!(
        preferred(
            ResourceKind::Hca,
            dgx(),
            &cfg,
            PreferredRequest {
                available: &avail,
                must_include: &[],
                size: 1
            }
        ),
        ["0000:40:00.0#0"]
    );
    // Two replicas of one HCA only when nothing else is left.
    let avail = ids(&["0000:18:00.0#0", "0000:18:00.0#1"]);
    assert_eq!(
        preferred(
            ResourceKind::Hca,
            dgx(),
            &cfg,
            PreferredRequest {
                available: &avail,
                must_include: &[],
                size: 2
            }
        ),
        avail
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `size` distinct IDs from available + must_include, including all of must_include, never
    /// an unhealthy one it was not told to include, and the same answer whatever the input order.
    #[test]
    fn preferred_returns_size_distinct_available_ids(
        avail_mask in proptest::collection::vec(any::<bool>(), 28),
        must_mask in proptest::collection::vec(any::<bool>(), 28),
        size in 1usize..12,
        shuffle in any::<u64>(),
    ) {
        let (cfg, all) = shared_universe();
        let available: Vec<String> =
            all.iter().zip(&avail_mask).filter(|(_, m)| **m).map(|(id, _)| id.clone()).collect();
        let must: Vec<String> = available
            .iter()
            .zip(&must_mask)
            .filter(|(_, m)| **m)
            .map(|(id, _)| id.clone())
            .take(size)
            .collect();
        let request = PreferredRequest {
            available: &available,
            must_include: &must,
            size,
        };
        let got = preferred(ResourceKind::Hca, dgx(), cfg, request);
        let set: BTreeSet<&String> = got.iter().collect();
        prop_assert_eq!(set.len(), got.len(), "distinct");
        prop_assert_eq!(got.len(), size.min(available.len()));
        for m in &must {
            prop_assert!(got.contains(m));
        }
        for id in &got {
            prop_assert!(available.contains(id));
        }
        let mut reordered = available.clone();
        let k = (shuffle % (reordered.len().max(1) as u64)) as usize;
        reordered.rotate_left(k);
        reordered.reverse();
        prop_assert_eq!(preferred(ResourceKind::Hca, dgx(), cfg, PreferredRequest { available: &reordered, must_include: &must, size }), got);
    }
}
