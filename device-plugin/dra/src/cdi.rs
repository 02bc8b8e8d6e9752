//! CDI specs of prepared claims (Container Device Interface, the spec version containerd 1.7+ and
//! CRI-O read from `/var/run/cdi`).
//!
//! One spec file per claim, kind `rocefabric.io/claim`, with **one CDI device per request** of
//! the claim (`<claim uid>-<request>`): the request's device nodes (`/dev/infiniband/uverbsN`,
//! `/dev/nvidiaN`), the shared nodes they need (`rdma_cm`, the NVIDIA control devices) and the
//! workload environment over exactly the request's devices (`NCCL_IB_HCA`, `UCX_NET_DEVICES`,
//! `NCCL_IB_GID_INDEX`, `NCCL_IB_TC`, `NVIDIA_VISIBLE_DEVICES`, `PCIDEVICE_ROCEFABRIC_IO`). A
//! claim with several requests has one more, the **whole-claim** device (`<claim uid>`): the
//! environment over all of the claim's devices, and no device node. The spec itself carries no
//! edits: the runtime would apply them to every container given any of the claim's devices.
//!
//! Why per request, and why the whole-claim device: the kubelet hands a container the CDI ids of
//! the devices of each request it names (all of the claim's when it names the claim), and the
//! runtime applies their edits in that order, a later variable replacing an earlier one of the
//! same name. A CDI device per physical device, or spec-wide variables, would give a container
//! named for one request the other requests' devices in `NCCL_IB_HCA`, or keep only the last
//! device's. So each request's device sets the request's whole value, and the whole-claim device,
//! answered last (see [`crate::prepare`]), sets the claim's. These are the same device nodes and
//! variables the device plugin's Allocate gives (both come from
//! [`rocefabric_node_model::allocation`]).

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

/// A claim's spec. No spec-wide edits: the runtime would apply them to every container given any
/// device of the spec, whichever request it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<CdiDevice>,
}

/// A claim's device as the spec needs it.
#[derive(Clone, Copy, Debug)]
pub enum Granted<'a> {
    Hca(&'a Hca),
    Gpu(&'a Gpu),
}

/// A claim's devices by request (the request's top-level name: what a container names).
pub type Requests<'a> = BTreeMap<String, Vec<Granted<'a>>>;

/// A claim's spec and the qualified CDI ids it defines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimCdi {
    pub spec: CdiSpec,
    /// Request -> the id of its CDI device.
    pub requests: BTreeMap<String, String>,
    /// The whole-claim device's id: only for a claim with several requests (with one, that
    /// request's device is the whole claim).
    pub whole_claim: Option<String>,
}

/// The CDI device name of one request of a claim.
pub fn request_device_name(claim_uid: &str, request: &str) -> String {
    format!("{claim_uid}-{request}")
}

/// The CDI device name of a claim's whole-claim device: the uid alone, which no request's device
/// can be named (a request name is never empty).
pub fn whole_claim_device_name(claim_uid: &str) -> String {
    claim_uid.to_string()
}

/// The fully qualified CDI id of our device `name`, as the kubelet hands it to the runtime.
pub fn qualified(name: &str) -> String {
    format!("{CDI_KIND}={name}")
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

/// `devices` once each: HCAs in ID order, GPUs in index order (the order the device plugin
/// lists them in).
fn by_kind<'a>(devices: &[Granted<'a>]) -> (Vec<&'a Hca>, Vec<&'a Gpu>) {
    let mut hcas: BTreeMap<&str, &Hca> = BTreeMap::new();
    let mut gpus: BTreeMap<u32, &Gpu> = BTreeMap::new();
    for device in devices {
        match *device {
            Granted::Hca(h) => {
                hcas.insert(&h.id, h);
            }
            Granted::Gpu(g) => {
                gpus.insert(g.index, g);
            }
        }
    }
    (hcas.into_values().collect(), gpus.into_values().collect())
}

/// The workload environment over exactly `devices`: what the device plugin's Allocate gives for
/// them, with the `PCIDEVICE_*` variable named after the driver.
fn environment(devices: &[Granted<'_>], traffic_class: Option<u8>) -> Vec<String> {
    let (hcas, gpus) = by_kind(devices);
    let mut env = allocation::workload_env(&hcas, &gpus, traffic_class);
    let pci: Vec<&str> = gpus
        .iter()
        .map(|g| g.pci_address.as_str())
        .chain(hcas.iter().filter_map(|h| h.pci_address.as_deref()))
        .collect();
    if !pci.is_empty() {
        env.insert(pcidevice_env(), pci.join(","));
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The device nodes of `devices` and the shared ones they need (`rdma_cm`, the NVIDIA control
/// devices).
fn device_nodes(devices: &[Granted<'_>], host_dev_root: &Path) -> Vec<CdiDeviceNode> {
    let (hcas, gpus) = by_kind(devices);
    gpus.iter()
        .map(|g| allocation::gpu_device_node(g))
        .chain(hcas.iter().filter_map(|h| allocation::hca_device_node(h)))
        .chain(allocation::shared_device_nodes(
            !hcas.is_empty(),
            !gpus.is_empty(),
        ))
        .map(|p| node(p, host_dev_root))
        .collect()
}

/// The spec of a claim whose devices are `requests`: a CDI device per request with its device
/// nodes and its environment, and for several requests the whole-claim device with the
/// environment over them all.
pub fn claim_spec(
    claim_uid: &str,
    requests: &Requests<'_>,
    traffic_class: Option<u8>,
    host_dev_root: &Path,
) -> ClaimCdi {
    let mut devices = Vec::new();
    let mut ids = BTreeMap::new();
    for (request, granted) in requests {
        let name = request_device_name(claim_uid, request);
        ids.insert(request.clone(), qualified(&name));
        devices.push(CdiDevice {
            name,
            container_edits: ContainerEdits {
                env: environment(granted, traffic_class),
                device_nodes: device_nodes(granted, host_dev_root),
            },
        });
    }
    let whole_claim = (requests.len() > 1).then(|| {
        let all: Vec<Granted<'_>> = requests.values().flatten().copied().collect();
        let name = whole_claim_device_name(claim_uid);
        let id = qualified(&name);
        devices.push(CdiDevice {
            name,
            container_edits: ContainerEdits {
                env: environment(&all, traffic_class),
                device_nodes: Vec::new(),
            },
        });
        id
    });
    ClaimCdi {
        spec: CdiSpec {
            cdi_version: CDI_VERSION.to_string(),
            kind: CDI_KIND.to_string(),
            devices,
        },
        requests: ids,
        whole_claim,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use rocefabric_node_model::model::Inventory;
    use rocefabric_node_testing::fixtures::FixtureNode;

    fn dgx() -> Inventory {
        let dir = rocefabric_node_testing::fixtures::tempdir().unwrap();
        FixtureNode::dgx_h100().write_to(dir.path()).unwrap();
        rocefabric_node_model::inventory::discover(
            dir.path(),
            &rocefabric_api::NicSelector::default(),
        )
        .unwrap()
    }

    fn env_of(device: &CdiDevice) -> BTreeMap<&str, &str> {
        device
            .container_edits
            .env
            .iter()
            .map(|kv| kv.split_once('=').unwrap())
            .collect()
    }

    /// How `NVIDIA_VISIBLE_DEVICES` names a GPU: its UUID, else its index.
    fn visible(g: &Gpu) -> String {
        g.uuid.clone().unwrap_or_else(|| g.index.to_string())
    }

    fn port(h: &Hca) -> String {
        format!("{}:{}", h.name, h.port)
    }

    #[test]
    fn each_request_carries_its_own_devices_environment_and_the_claim_all_of_them() {
        let inv = dgx();
        let (h0, h1, g0) = (&inv.hcas[0], &inv.hcas[1], &inv.gpus[0]);
        let requests: Requests<'_> = BTreeMap::from([
            ("nic".to_string(), vec![Granted::Hca(h0)]),
            ("pair".to_string(), vec![Granted::Hca(h1), Granted::Gpu(g0)]),
        ]);
        let cdi = claim_spec("uid", &requests, Some(106), Path::new("/dev"));
        assert_eq!(
            cdi.requests,
            BTreeMap::from([
                ("nic".to_string(), "rocefabric.io/claim=uid-nic".to_string()),
                (
                    "pair".to_string(),
                    "rocefabric.io/claim=uid-pair".to_string()
                ),
            ])
        );
        assert_eq!(cdi.whole_claim.as_deref(), Some("rocefabric.io/claim=uid"));
        let [nic, pair, whole] = cdi.spec.devices.as_slice() else {
            panic!("{:?}", cdi.spec.devices);
        };

        let env = env_of(nic);
        assert_eq!(env["NCCL_IB_HCA"], format!("={}", port(h0)));
        assert_eq!(env["UCX_NET_DEVICES"], port(h0));
        assert_eq!(env["NCCL_IB_TC"], "106");
        assert_eq!(
            env["PCIDEVICE_ROCEFABRIC_IO"],
            h0.pci_address.as_deref().unwrap()
        );
        assert!(!env.contains_key("NVIDIA_VISIBLE_DEVICES"), "{env:?}");
        let nodes: Vec<&str> = nic
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            nodes,
            [
                format!("/dev/infiniband/{}", h0.uverbs.as_deref().unwrap()).as_str(),
                "/dev/infiniband/rdma_cm"
            ]
        );

        let env = env_of(pair);
        assert_eq!(env["NCCL_IB_HCA"], format!("={}", port(h1)));
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], visible(g0));
        assert_eq!(
            env["PCIDEVICE_ROCEFABRIC_IO"],
            format!("{},{}", g0.pci_address, h1.pci_address.as_deref().unwrap())
        );
        let nodes: Vec<&str> = pair
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert!(nodes.contains(&"/dev/nvidiactl") && nodes.contains(&"/dev/infiniband/rdma_cm"));

        // The whole claim: the environment over every device of the claim, and no node (the
        // requests' devices bring them).
        let env = env_of(whole);
        let mut by_id = [h0, h1];
        by_id.sort_by_key(|h| &h.id);
        assert_eq!(
            env["NCCL_IB_HCA"],
            format!("={},{}", port(by_id[0]), port(by_id[1]))
        );
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], visible(g0));
        assert_eq!(env["PCIDEVICE_ROCEFABRIC_IO"].split(',').count(), 3);
        assert!(whole.container_edits.device_nodes.is_empty());

        // No spec-wide edits: they would reach every container given any of the claim's devices.
        let json = serde_json::to_value(&cdi.spec).unwrap();
        assert!(json.get("containerEdits").is_none(), "{json}");
        assert!(
            json["devices"][2]["containerEdits"]
                .get("deviceNodes")
                .is_none()
        );
    }

    #[test]
    fn a_claim_of_one_request_has_no_whole_claim_device_and_host_paths_follow_the_root() {
        let inv = dgx();
        let h0 = &inv.hcas[0];
        let requests: Requests<'_> = BTreeMap::from([(
            "rail".to_string(),
            vec![
                Granted::Hca(h0),
                Granted::Hca(&inv.hcas[1]),
                Granted::Hca(h0),
            ],
        )]);
        let cdi = claim_spec("uid", &requests, None, Path::new("/host/dev"));
        assert_eq!(cdi.whole_claim, None);
        let [rail] = cdi.spec.devices.as_slice() else {
            panic!("{:?}", cdi.spec.devices);
        };
        let env = env_of(rail);
        let mut by_id = [h0, &inv.hcas[1]];
        by_id.sort_by_key(|h| &h.id);
        assert_eq!(
            env["NCCL_IB_HCA"],
            format!("={},{}", port(by_id[0]), port(by_id[1])),
            "a device twice is listed once"
        );
        assert!(!env.contains_key("NCCL_IB_TC"), "no traffic class: {env:?}");
        let hosts: Vec<&str> = rail
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.host_path.as_str())
            .collect();
        assert_eq!(hosts.len(), 3, "{hosts:?}");
        assert!(
            hosts.iter().all(|h| h.starts_with("/host/dev/infiniband/")),
            "{hosts:?}"
        );
    }

    #[test]
    fn two_claims_name_their_devices_apart() {
        let inv = dgx();
        let requests: Requests<'_> = BTreeMap::from([
            ("gpu".to_string(), vec![Granted::Gpu(&inv.gpus[0])]),
            ("hca".to_string(), vec![Granted::Hca(&inv.hcas[0])]),
        ]);
        let a = claim_spec("uid-a", &requests, None, Path::new("/dev"));
        let b = claim_spec("uid-b", &requests, None, Path::new("/dev"));
        let names = |c: &ClaimCdi| -> Vec<String> {
            c.spec.devices.iter().map(|d| d.name.clone()).collect()
        };
        assert_eq!(names(&a), ["uid-a-gpu", "uid-a-hca", "uid-a"]);
        assert!(names(&a).iter().all(|n| !names(&b).contains(n)));
        // Same devices, same environment: only the names differ.
        let edits = |c: &ClaimCdi| -> Vec<ContainerEdits> {
            c.spec
                .devices
                .iter()
                .map(|d| d.container_edits.clone())
                .collect()
        };
        assert_eq!(edits(&a), edits(&b));
    }
}
