//! CDI specs of prepared claims (Container Device Interface, the spec version containerd 1.7+ and
//! CRI-O read from `/var/run/cdi`).
//!
//! One spec file per claim, kind `rocefabric.io/claim`. Each allocated device is a CDI device
//! `<claim uid>-<device>` carrying its own device node (`/dev/infiniband/uverbsN`,
//! `/dev/nvidiaN`); the spec-wide edits carry what the claim's devices need once: `rdma_cm`, the
//! NVIDIA control devices and the workload environment over all of the claim's devices
//! (`NCCL_IB_HCA`, `UCX_NET_DEVICES`, `NCCL_IB_GID_INDEX`, `NCCL_IB_TC`, `NVIDIA_VISIBLE_DEVICES`,
//! `PCIDEVICE_ROCEFABRIC_IO`). The runtime applies spec-wide edits once per container however many
//! of the spec's devices it injects, so a rail set of 16 devices gets one `rdma_cm` and one
//! `NCCL_IB_HCA` naming all eight HCAs. These are the same device nodes and variables the device
//! plugin's Allocate gives (both come from [`rocefabric_node_model::allocation`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use rocefabric_node_model::allocation::{self, DEVICE_PERMISSIONS};
use rocefabric_node_model::model::{Gpu, Hca};

/// The CDI spec version written: the oldest that has everything used here, so older runtimes
/// read it too.
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI kind of claim specs.
pub const CDI_KIND: &str = "rocefabric.io/claim";
/// Prefix of our spec files in the CDI directory.
pub const SPEC_PREFIX: &str = "rocefabric.io-claim_";

/// `PCIDEVICE_*` variable of DRA grants (the SR-IOV plugin's convention, named after the driver).
pub fn pcidevice_env() -> String {
    rocefabric_formats::env::pcidevice(super::DRIVER_NAME)
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<CdiDeviceNode>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (under the host device root).
    pub host_path: String,
    pub permissions: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<CdiDevice>,
    pub container_edits: ContainerEdits,
}

/// A claim's device as the spec needs it.
#[derive(Clone, Copy, Debug)]
pub enum Granted<'a> {
    Hca(&'a Hca),
    Gpu(&'a Gpu),
}

/// The CDI device name of one device of a claim.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device id handed to the kubelet.
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{CDI_KIND}={}", device_name(claim_uid, device))
}

/// File name of a claim's spec.
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{SPEC_PREFIX}{claim_uid}.json")
}

fn node(path: String, host_dev_root: &Path) -> CdiDeviceNode {
    let host_path = match path.strip_prefix("/dev/") {
        Some(rel) if host_dev_root != Path::new("/dev") => {
            host_dev_root.join(rel).to_string_lossy().into_owned()
        }
        _ => path.clone(),
    };
    CdiDeviceNode {
        path,
        host_path,
        permissions: DEVICE_PERMISSIONS.to_string(),
    }
}

/// The spec of a claim's devices (`(pool device name, device)`, in any order).
pub fn claim_spec(
    claim_uid: &str,
    devices: &[(String, Granted<'_>)],
    traffic_class: Option<u8>,
    host_dev_root: &Path,
) -> CdiSpec {
    let mut hcas: BTreeMap<&str, &Hca> = BTreeMap::new();
    let mut gpus: BTreeMap<u32, &Gpu> = BTreeMap::new();
    let mut cdi_devices = Vec::new();
    for (name, device) in devices {
        let path = match device {
            Granted::Hca(h) => {
                hcas.insert(&h.id, h);
                allocation::hca_device_node(h)
            }
            Granted::Gpu(g) => {
                gpus.insert(g.index, g);
                Some(allocation::gpu_device_node(g))
            }
        };
        cdi_devices.push(CdiDevice {
            name: device_name(claim_uid, name),
            container_edits: ContainerEdits {
                env: Vec::new(),
                device_nodes: path.map(|p| node(p, host_dev_root)).into_iter().collect(),
            },
        });
    }
    cdi_devices.sort_by(|a, b| a.name.cmp(&b.name));
    let hcas: Vec<&Hca> = hcas.into_values().collect();
    let gpus: Vec<&Gpu> = gpus.into_values().collect();
    let mut env = allocation::workload_env(&hcas, &gpus, traffic_class);
    let pci: Vec<&str> = gpus
        .iter()
        .map(|g| g.pci_address.as_str())
        .chain(hcas.iter().filter_map(|h| h.pci_address.as_deref()))
        .collect();
    if !pci.is_empty() {
        env.insert(pcidevice_env(), pci.join(","));
    }
    CdiSpec {
        cdi_version: CDI_VERSION.to_string(),
        kind: CDI_KIND.to_string(),
        devices: cdi_devices,
        container_edits: ContainerEdits {
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            device_nodes: allocation::shared_device_nodes(!hcas.is_empty(), !gpus.is_empty())
                .into_iter()
                .map(|p| node(p, host_dev_root))
                .collect(),
        },
    }
}

/// Write a claim's spec atomically (a temporary file renamed over the final name, so the runtime
/// never reads half a spec), readable by the runtime.
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &CdiSpec) -> std::io::Result<PathBuf> {
    let path = dir.join(spec_file_name(claim_uid));
    let mut text = serde_json::to_vec_pretty(spec)?;
    text.push(b'\n');
    rocefabric_runtime::file::write_atomic(&path, &text, 0o644)?;
    Ok(path)
}

/// Remove a claim's spec; one already gone is fine.
pub fn remove_spec(dir: &Path, claim_uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(spec_file_name(claim_uid))) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The claim UIDs of our spec files in `dir`.
pub fn spec_claims(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        if let Some(uid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SPEC_PREFIX))
            .and_then(|n| n.strip_suffix(".json"))
        {
            out.push(uid.to_string());
        }
    }
    out.sort();
    Ok(out)
}
