//! `rocefabric-device-plugin discover`: print what discovery finds on this node (or in a sysfs
//! tree; `rocefabric-fixture` in the e2e crate writes one for a demo): the RoCE HCAs, the GPUs and the GPU x HCA PCIe distance
//! matrix in the classes `nvidia-smi topo -m` uses, and which resource `serve` would list each
//! device under with the given config (see [`rocefabric_node_model::ownership`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use rocefabric_node_model::allocation::ResourceKind;
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_model::model::{Distance, Gpu, Hca, Inventory, PortState};
use rocefabric_node_model::ownership::Partition;
use rocefabric_node_model::topology;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// HCA and GPU lists and a GPU x HCA matrix like `nvidia-smi topo -m`.
    Table,
    /// `{hcas: [...], gpus: [...], topology: {gpuPciAddress: {hcaId: "PXB"}}, gpuHcaPairs}`; each
    /// HCA, GPU and pair names the `resource` serving it under the config (`null`: none).
    Json,
}

/// Arguments of `discover`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Root of the sysfs tree to read.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Device plugin config file (at most 1 MiB); its `hca.selector` narrows the HCAs shown, and
    /// the resource column follows its `gpu`, `gpuHca` and `softRoce` settings.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Run `discover`.
pub fn run(args: Args) -> anyhow::Result<()> {
    rocefabric_runtime::logging::init(
        "RUST_LOG",
        "warn",
        rocefabric_runtime::logging::Format::Text,
    );

    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let inv = inventory::discover(&args.sysfs_root, &config.hca.selector)?;
    // After discover: a missing root is reported as such first.
    inventory::check_rdma_class(&args.sysfs_root)?;
    let text = match args.output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&Report::new(&inv, &config))?;
            s.push('\n');
            s
        }
        Output::Table => table(&inv, &config),
    };
    print!("{text}");
    Ok(())
}

/// The JSON document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub hcas: Vec<HcaView>,
    pub gpus: Vec<GpuView>,
    /// `{gpuPciAddress: {hcaId: "PXB"}}` (an HCA's ID is its PCI address unless it is virtual).
    pub topology: BTreeMap<String, BTreeMap<String, Distance>>,
    /// The `rdma/gpu-hca` rails: each GPU with its closest PIX/PXB HCA.
    pub gpu_hca_pairs: Vec<PairView>,
}

/// Which resource serves each device under a config, as `serve` would list it.
struct Served {
    /// Device (HCA ID or GPU PCI address) -> resource name.
    owners: BTreeMap<String, String>,
    pairs: Option<String>,
}

impl Served {
    fn new(inv: &Inventory, cfg: &Config) -> Served {
        // What `serve` advertises: virtual HCAs only with `softRoce: include`.
        let mut served = inv.clone();
        cfg.soft_roce.apply(&mut served);
        let owners = Partition::new(&served, cfg)
            .owners()
            .into_iter()
            .map(|(device, kind)| (device, kind.resource_name(cfg).to_string()))
            .collect();
        let pairs = ResourceKind::GpuHca
            .enabled(cfg)
            .then(|| cfg.gpu_hca.resource_name.clone());
        Served { owners, pairs }
    }

    fn of(&self, device: &str) -> Option<String> {
        self.owners.get(device).cloned()
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HcaView {
    /// The kubelet device ID: the PCI address, or `virtual-<node GUID>`.
    pub id: String,
    pub name: String,
    /// A software RDMA device (Soft-RoCE) without a PCI function: no PCI fields, no NUMA node.
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
    pub pci_address: Option<String>,
    /// `"0x15b3"`.
    pub vendor: Option<String>,
    /// `"0x1021"`.
    pub device_id: Option<String>,
    pub port: u32,
    pub netdev: Option<String>,
    pub numa_node: Option<u32>,
    pub state: PortState,
    pub uverbs: Option<String>,
    pub roce_v2_gid_index: Option<u32>,
    pub health: &'static str,
    /// The PCI function's realpath under the sysfs root; `None` for a virtual device.
    pub pci_path: Option<String>,
    /// The device's realpath under the sysfs root (its PCI function, or `/devices/virtual/...`).
    pub device_path: String,
    /// The resource `serve` lists it under with this config; `None`: not served.
    pub resource: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    pub pci_address: String,
    pub index: u32,
    pub device_id: String,
    pub numa_node: Option<u32>,
    pub health: &'static str,
    pub pci_path: String,
    /// The resource `serve` lists it under with this config; `None`: not served (GPUs are left
    /// to NVIDIA's device plugin unless `gpu` or `gpuHca` is enabled).
    pub resource: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairView {
    pub gpu_pci_address: String,
    pub gpu_index: u32,
    pub hca_pci_address: String,
    pub rdma_device: String,
    pub distance: Distance,
    /// The pair resource when `gpuHca` is enabled; `None`: the pair is not served.
    pub resource: Option<String>,
}

impl Report {
    pub fn new(inv: &Inventory, cfg: &Config) -> Report {
        let served = Served::new(inv, cfg);
        Report {
            hcas: inv.hcas.iter().map(|h| hca_view(h, &served)).collect(),
            gpus: inv.gpus.iter().map(|g| gpu_view(g, &served)).collect(),
            topology: topology::matrix(inv),
            gpu_hca_pairs: topology::gpu_hca_pairs(inv)
                .into_iter()
                .map(|(g, h, d)| PairView {
                    gpu_pci_address: g.pci_address.clone(),
                    gpu_index: g.index,
                    // A rail is PIX/PXB: never a virtual device, so the ID is the PCI address.
                    hca_pci_address: h.id.clone(),
                    rdma_device: h.name.clone(),
                    distance: d,
                    resource: served.pairs.clone(),
                })
                .collect(),
        }
    }
}

fn hca_view(h: &Hca, served: &Served) -> HcaView {
    HcaView {
        id: h.id.clone(),
        name: h.name.clone(),
        is_virtual: h.is_virtual(),
        pci_address: h.pci_address.clone(),
        vendor: h.vendor.map(|v| format!("0x{v:04x}")),
        device_id: h.device_id.map(|d| format!("0x{d:04x}")),
        port: h.port,
        netdev: h.netdev.clone(),
        numa_node: h.numa_node,
        state: h.state,
        uverbs: h.uverbs.clone(),
        roce_v2_gid_index: h.roce_v2_gid_index,
        health: h.health.as_str(),
        pci_path: h.pci_address.as_ref().map(|_| h.device_path.clone()),
        device_path: h.device_path.clone(),
        resource: served.of(&h.id),
    }
}

fn gpu_view(g: &Gpu, served: &Served) -> GpuView {
    GpuView {
        pci_address: g.pci_address.clone(),
        index: g.index,
        device_id: format!("0x{:04x}", g.device_id),
        numa_node: g.numa_node,
        health: g.health.as_str(),
        pci_path: g.pci_path.clone(),
        resource: served.of(&g.pci_address),
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string)
}

fn state_text(s: PortState) -> &'static str {
    s.as_str()
}

fn distance_text(d: Distance) -> &'static str {
    match d {
        Distance::PIX => "PIX",
        Distance::PXB => "PXB",
        Distance::PHB => "PHB",
        Distance::NODE => "NODE",
        Distance::SYS => "SYS",
    }
}

/// Left-aligned columns separated by two spaces.
fn columns(rows: &[Vec<String>]) -> String {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..width)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The human-readable report; the RESOURCE columns say what `serve` lists each device under with
/// `cfg` (`-`: not served).
pub fn table(inv: &Inventory, cfg: &Config) -> String {
    let served = Served::new(inv, cfg);
    let resource = |device: &str| served.of(device).unwrap_or_else(|| "-".to_string());
    let mut out = String::new();
    out.push_str("RoCE HCAs\n");
    if inv.hcas.is_empty() {
        out.push_str("  (none)\n");
    } else {
        let mut rows = vec![
            [
                "NAME",
                "DEVICE ID",
                "VENDOR:DEVICE",
                "PORT",
                "NETDEV",
                "STATE",
                "NUMA",
                "GID",
                "UVERBS",
                "HEALTH",
                "RESOURCE",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for h in &inv.hcas {
            rows.push(vec![
                h.name.clone(),
                h.id.clone(),
                match (h.vendor, h.device_id) {
                    (Some(v), Some(d)) => format!("{v:04x}:{d:04x}"),
                    _ => "virtual".to_string(),
                },
                h.port.to_string(),
                opt(&h.netdev),
                state_text(h.state).to_string(),
                opt(&h.numa_node),
                opt(&h.roce_v2_gid_index),
                opt(&h.uverbs),
                h.health.as_str().to_string(),
                resource(&h.id),
            ]);
        }
        out.push_str(&columns(&rows));
    }
    out.push_str("\nGPUs\n");
    if inv.gpus.is_empty() {
        out.push_str("  (none)\n");
    } else {
        let mut rows = vec![
            ["GPU", "PCI ADDRESS", "DEVICE", "NUMA", "RAIL", "RESOURCE"]
                .map(String::from)
                .to_vec(),
        ];
        for g in &inv.gpus {
            let rail = topology::closest_hca(inv, g).map_or_else(
                || "-".to_string(),
                |(h, d)| format!("{} ({})", h.name, distance_text(d)),
            );
            rows.push(vec![
                format!("GPU{}", g.index),
                g.pci_address.clone(),
                format!("{:04x}", g.device_id),
                opt(&g.numa_node),
                rail,
                resource(&g.pci_address),
            ]);
        }
        out.push_str(&columns(&rows));
        if inv.gpus.iter().any(|g| served.of(&g.pci_address).is_none()) {
            out.push_str(
                "  (RESOURCE -: not served with this config: GPUs are left to NVIDIA's device plugin \
                 unless gpu or gpuHca is enabled)\n",
            );
        }
    }
    if !inv.gpus.is_empty() && !inv.hcas.is_empty() {
        out.push_str("\nTopology (GPU x HCA)\n");
        let mut header = vec![String::new()];
        header.extend(inv.hcas.iter().map(|h| h.name.clone()));
        header.push("NUMA".into());
        let mut rows = vec![header];
        for g in &inv.gpus {
            let mut row = vec![format!("GPU{}", g.index)];
            row.extend(
                inv.hcas
                    .iter()
                    .map(|h| distance_text(topology::gpu_hca_distance(g, h)).to_string()),
            );
            row.push(opt(&g.numa_node));
            rows.push(row);
        }
        out.push_str(&columns(&rows));
        let _ = write!(
            out,
            "\nLegend:\n  PIX  = at most one PCIe switch\n  PXB  = several PCIe bridges, no host bridge\n  \
             PHB  = a PCIe host bridge (the CPU)\n  NODE = between host bridges within one NUMA node\n  \
             SYS  = across NUMA nodes (or NUMA unknown)\n"
        );
    }
    out
}
