//! What the node daemon reads from sysfs and procfs.

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};

use rocefabric_api::NicSelector;
use rocefabric_api::Trust;
use rocefabric_api::nic_selector::normalize_pci_address;
use rocefabric_node_model::inventory::{
    discover_with, parse_gid, parse_node_guid, parse_nvidia_information,
};
use rocefabric_node_model::topology::{self, PciChain, distance, is_bdf};
use rocefabric_node_testing::fixtures::{FixtureNode, gid_text};
use rocefabric_qos_agent::driver_files::{parse_number, parse_trust};

use crate::text;

/// The pure text parsers, each on the whole input and on its first two lines.
pub fn sysfs_values(data: &[u8]) {
    let text = text(data);
    let mut lines = text.lines();
    let (a, b) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    for t in [&*text, a, b] {
        gid(t);
        node_guid(t);
        pci_address(t);
        driver_value(t);
    }
    nvidia_information(&text);
    for (x, y) in [(a, b), (&*text, a)] {
        pci_distance(x, y);
    }
}

/// `ports/N/gids/I`: what parses renders as sysfs writes it and parses back the same.
fn gid(t: &str) {
    if let Some(g) = parse_gid(t) {
        assert_eq!(parse_gid(&gid_text(g)), Some(g), "GID {t:?}");
    }
}

/// `node_guid`: never zero, and its four-group form reads back the same.
fn node_guid(t: &str) {
    if let Some(g) = parse_node_guid(t) {
        assert_ne!(g, 0, "a zero GUID from {t:?}");
        let b = g.to_be_bytes();
        let shown = (0..4)
            .map(|i| format!("{:02x}{:02x}", b[2 * i], b[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(
            parse_node_guid(&shown),
            Some(g),
            "GUID {t:?} shown as {shown}"
        );
    }
}

/// PCI addresses: the selector's normal form is a sysfs BDF and a fixed point.
fn pci_address(t: &str) {
    if is_bdf(t) {
        assert!(t.len() == 12 && t.is_ascii(), "is_bdf({t:?})");
    }
    if let Some(n) = normalize_pci_address(t) {
        assert!(is_bdf(&n), "{t:?} normalized to {n:?}, not dddd:bb:dd.f");
        assert_eq!(normalize_pci_address(&n).as_deref(), Some(n.as_str()));
    }
}

/// `driver_files`: the number found is in the text and reads back alone; trust names one mode.
fn driver_value(t: &str) {
    if let Some(n) = parse_number(t) {
        assert!(t.contains(&n.to_string()), "{n} is not in {t:?}");
        assert_eq!(parse_number(&n.to_string()), Some(n));
    }
    let lower = t.to_ascii_lowercase();
    match parse_trust(t) {
        Some(Trust::Dscp) => assert!(lower.contains("dscp") && !lower.contains("pcp")),
        Some(Trust::Pcp) => assert!(lower.contains("pcp") && !lower.contains("dscp")),
        None => {}
    }
}

/// `/proc/driver/nvidia/gpus/<bdf>/information`: what is found is in the text.
fn nvidia_information(t: &str) {
    let info = parse_nvidia_information(t);
    if let Some(uuid) = &info.uuid {
        assert!(
            uuid.starts_with("GPU-") && t.contains(uuid.as_str()),
            "{uuid:?}"
        );
    }
    if let Some(minor) = info.minor {
        assert!(
            t.contains(&minor.to_string()),
            "minor {minor} not in the text"
        );
    }
}

/// Realpaths: a parsed chain is made of the path's own parts, a path is `PIX` from itself,
/// distance is symmetric.
fn pci_distance(a: &str, b: &str) {
    if let Some(c) = PciChain::parse(a) {
        assert!(c.root.starts_with("pci") && a.contains(c.root));
        assert!(!c.chain.is_empty());
        for f in &c.chain {
            assert!(is_bdf(f) && a.contains(f), "{f:?} in the chain of {a:?}");
        }
        assert_eq!(
            distance(a, None, a, None),
            rocefabric_node_model::model::Distance::PIX
        );
    }
    for (na, nb) in [(None, None), (Some(0), Some(0)), (Some(0), Some(1))] {
        assert_eq!(
            distance(a, na, b, nb),
            distance(b, nb, a, na),
            "distance({a:?}, {b:?}) is not symmetric"
        );
    }
}

/// One attribute of the fixture tree the input may set: its key and its path under the sysfs
/// root (or, for `gpu.information`, the proc root).
const ATTRS: &[(&str, &str)] = &[
    ("nic.numa_node", "bus/pci/devices/0000:18:00.0/numa_node"),
    ("nic.vendor", "bus/pci/devices/0000:18:00.0/vendor"),
    ("nic.device", "bus/pci/devices/0000:18:00.0/device"),
    ("nic.class", "bus/pci/devices/0000:18:00.0/class"),
    ("ib.node_guid", "class/infiniband/mlx5_0/node_guid"),
    ("ib.node_type", "class/infiniband/mlx5_0/node_type"),
    (
        "port.link_layer",
        "class/infiniband/mlx5_0/ports/1/link_layer",
    ),
    ("port.state", "class/infiniband/mlx5_0/ports/1/state"),
    ("gid.0", "class/infiniband/mlx5_0/ports/1/gids/0"),
    ("gid.1", "class/infiniband/mlx5_0/ports/1/gids/1"),
    ("gid.2", "class/infiniband/mlx5_0/ports/1/gids/2"),
    ("gid.3", "class/infiniband/mlx5_0/ports/1/gids/3"),
    (
        "type.1",
        "class/infiniband/mlx5_0/ports/1/gid_attrs/types/1",
    ),
    (
        "type.3",
        "class/infiniband/mlx5_0/ports/1/gid_attrs/types/3",
    ),
    (
        "ndev.1",
        "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/1",
    ),
    (
        "ndev.3",
        "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3",
    ),
    ("netdev.dev_port", "class/net/enp24s0np0/dev_port"),
    ("gpu.numa_node", "bus/pci/devices/0000:1b:00.0/numa_node"),
    ("gpu.vendor", "bus/pci/devices/0000:1b:00.0/vendor"),
    ("gpu.device", "bus/pci/devices/0000:1b:00.0/device"),
    ("gpu.class", "bus/pci/devices/0000:1b:00.0/class"),
    (
        "gpu.information",
        "driver/nvidia/gpus/0000:1b:00.0/information",
    ),
];

/// The one-NIC, one-GPU tree of a DGX H100 rail (mlx5_0 and the GPU at 1b:00.0), written once
/// per thread; each input changes some attributes and the next one puts them back.
struct Tree {
    _dir: tempfile::TempDir,
    sysfs: PathBuf,
    proc: PathBuf,
    /// Per [`ATTRS`] entry: its path and original content.
    files: Vec<(PathBuf, Vec<u8>)>,
    /// Entries the last input changed.
    dirty: Vec<usize>,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let sysfs = dir.path().join("sys");
        let proc = dir.path().join("proc");
        let mut node = FixtureNode::dgx_h100();
        node.functions
            .retain(|f| f.address == "0000:18:00.0" || f.address == "0000:1b:00.0");
        node.gid_table_len = 6;
        node.write_to(&sysfs)
            .unwrap_or_else(|e| panic!("fixture tree: {e}"));
        let info = proc.join(ATTRS[ATTRS.len() - 1].1);
        let parent = info.parent().unwrap_or(Path::new("/nonexistent"));
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("proc tree: {e}"));
        fs::write(
            &info,
            "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-6f3a2c1e-0b1d-4c55-9e2a-8d7f00000000\nDevice Minor: \t 0\n",
        )
        .unwrap_or_else(|e| panic!("proc tree: {e}"));
        let files = ATTRS
            .iter()
            .map(|(key, rel)| {
                let path = if *key == "gpu.information" {
                    proc.join(rel)
                } else {
                    sysfs.join(rel)
                };
                let original =
                    fs::read(&path).unwrap_or_else(|e| panic!("fixture lacks {rel}: {e}"));
                (path, original)
            })
            .collect();
        Tree {
            _dir: dir,
            sysfs,
            proc,
            files,
            dirty: Vec::new(),
        }
    }

    fn restore(&mut self) {
        for i in self.dirty.drain(..) {
            let (path, original) = &self.files[i];
            fs::write(path, original).unwrap_or_else(|e| panic!("restore {}: {e}", path.display()));
        }
    }
}

thread_local! {
    static TREE: RefCell<Option<Tree>> = const { RefCell::new(None) };
}

/// Discovery over a fixture tree whose attributes the input sets, one `key=value` per line
/// (`\n` in a value is a newline; a key alone removes the file). Keys: see [`ATTRS`].
pub fn sysfs_tree(data: &[u8]) {
    let text = text(data);
    TREE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let tree = slot.get_or_insert_with(Tree::new);
        tree.restore();
        for line in text.lines() {
            let (key, value) = match line.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (line, None),
            };
            let Some(i) = ATTRS.iter().position(|(k, _)| *k == key) else {
                continue;
            };
            let path = &tree.files[i].0;
            match value {
                Some(v) => {
                    let v = format!("{}\n", v.replace("\\n", "\n"));
                    fs::write(path, v).unwrap_or_else(|e| panic!("write {key}: {e}"));
                }
                None => {
                    let _ = fs::remove_file(path);
                }
            }
            tree.dirty.push(i);
        }
        let result = discover_with(&tree.sysfs, Some(&tree.proc), &NicSelector::default());
        let inv = match result {
            Ok(inv) => inv,
            Err(e) => panic!("discovery of an existing root failed: {e}"),
        };
        assert!(inv.hcas.len() <= 1 && inv.gpus.len() <= 1, "{inv:?}");
        if tree.dirty.is_empty() {
            // The untouched tree: the rail's NIC with its RoCE v2 IPv4 GID, and its GPU.
            assert!(
                inv.hcas.len() == 1
                    && inv.hcas[0].roce_v2_gid_index == Some(3)
                    && inv.gpus.len() == 1,
                "the fixture tree is not discovered: {inv:?}"
            );
        }
        for h in &inv.hcas {
            assert!(!h.id.is_empty() && h.name == "mlx5_0", "{h:?}");
            if let Some(i) = h.roce_v2_gid_index {
                assert!(i < 6, "GID index {i} beyond the table");
            }
        }
        for g in &inv.gpus {
            assert_eq!(g.pci_address, "0000:1b:00.0");
        }
        // What serving computes from an inventory: the topology.
        let _ = topology::matrix(&inv);
        let _ = topology::gpu_hca_pairs(&inv);
    });
}
