//! Distances: the topology matrix against `nvidia-smi topo -m`, sibling ports, GPU rails.

use rocefabric_node_model::model::Distance;
use rocefabric_node_model::topology;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{DGX_HCAS, DGX_RAILS, discover_all, written};

#[test]
fn dgx_topology_matrix_matches_nvidia_smi() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let m = topology::matrix(&inv);
    assert_eq!(m.len(), 8);
    for (gpu, rail_nic, gpu_numa) in DGX_RAILS {
        let row = &m[gpu];
        assert_eq!(row.len(), 14);
        for (hca, _, _, hca_numa, _) in DGX_HCAS {
            let want = if hca == rail_nic {
                Distance::PXB
            } else if hca_numa == gpu_numa {
                Distance::NODE
            } else {
                Distance::SYS
            };
            assert_eq!(row[hca], want, "GPU {gpu} to HCA {hca}");
        }
    }
}

#[test]
fn storage_and_irdma_ports_are_pix_to_their_sibling() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let by = |name: &str| inv.hcas.iter().find(|h| h.name == name).unwrap();
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_2")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_7"), by("mlx5_8")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("irdma0"), by("irdma1")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_0")),
        Distance::NODE
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_7")),
        Distance::SYS
    );
}

#[test]
fn every_gpu_pairs_with_its_rail_nic() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let pairs: Vec<_> = topology::gpu_hca_pairs(&inv)
        .into_iter()
        .map(|(g, h, d)| (g.pci_address.as_str(), h.id.as_str(), d))
        .collect();
    let want: Vec<_> = DGX_RAILS
        .iter()
        .map(|(g, n, _)| (*g, *n, Distance::PXB))
        .collect();
    assert_eq!(pairs, want);
}
