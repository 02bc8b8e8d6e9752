//! A claim's allocation, resolved against this node: which of our devices the scheduler gave it,
//! what the kubelet is answered and what the CDI spec says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::DRIVER_NAME;
use super::cdi::{self, CdiSpec, Granted, Requests};
use super::checkpoint::{PreparedDevice, WholeClaimDevice};
use super::devices::{gpu_device_name, hca_device_name};
use rocefabric_node_model::model::Inventory;

/// The claim the kubelet names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One allocation result of ours: the request (its top-level name) and the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub request: String,
    pub device: String,
    /// Allocated with `adminAccess` (monitoring): the device is reached, not owned, so it takes
    /// no place in the ledger and is never refused for another holder.
    pub admin_access: bool,
}

/// Why a claim cannot be prepared. The kubelet retries a failed prepare, so every one of these
/// says what would have to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PrepareError {
    #[error(
        "claim {claim}: the API server has uid {found}, the kubelet asked for {uid} (the claim was replaced)"
    )]
    UidMismatch {
        claim: String,
        uid: String,
        found: String,
    },
    #[error("claim {claim} has no allocation yet")]
    NotAllocated { claim: String },
    #[error("claim {claim}: no device of driver {DRIVER_NAME} in pool {pool} is allocated to it")]
    NothingOfOurs { claim: String, pool: String },
    #[error("claim {claim}: device {device} (request {request}) is not on this node")]
    UnknownDevice {
        claim: String,
        request: String,
        device: String,
    },
}

/// Our results in `claim`'s allocation for `pool`, checked against the uid the kubelet gave.
pub fn allocated(
    claim: &ResourceClaim,
    want: &ClaimRef,
    pool: &str,
) -> Result<Vec<Allocated>, PrepareError> {
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != want.uid {
        return Err(PrepareError::UidMismatch {
            claim: want.to_string(),
            uid: want.uid.clone(),
            found,
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated {
            claim: want.to_string(),
        })?
        .results
        .as_deref()
        .unwrap_or_default();
    let ours: Vec<Allocated> = results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME && r.pool == pool)
        .map(|r| Allocated {
            // A subrequest (`request/sub`, from firstAvailable) belongs to its request, which is
            // what a container names.
            request: r
                .request
                .split_once('/')
                .map_or(r.request.as_str(), |(top, _)| top)
                .to_string(),
            device: r.device.clone(),
            admin_access: r.admin_access == Some(true),
        })
        .collect();
    if ours.is_empty() {
        return Err(PrepareError::NothingOfOurs {
            claim: want.to_string(),
            pool: pool.to_string(),
        });
    }
    Ok(ours)
}

/// The request name of the answer's whole-claim entry. It is no DNS label, the only kind of name
/// a claim's request or a container's `resources.claims[].request` can have, so no container names
/// it and the kubelet hands its CDI device only to containers given the whole claim.
pub const WHOLE_CLAIM_REQUEST: &str = "rocefabric.io/whole-claim";

/// What a prepare records, answers and writes.
///
/// The answer has an entry per allocation result (request and device). The first entry of each
/// request carries the request's CDI device, the others none: the kubelet hands a container the
/// ids of every entry of each request it names, so the request's device is injected once. For a
/// claim of several requests, the whole-claim entry comes last with the whole-claim CDI device: a
/// container given the whole claim gets every request's device, then the claim's environment over
/// them all; a container given one request gets that request's devices and environment only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub devices: Vec<PreparedDevice>,
    pub whole_claim: Option<WholeClaimDevice>,
    pub spec: CdiSpec,
}

/// What a prepare resolves a claim against: this node.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// The pool: the node's name.
    pub pool: &'a str,
    /// Every discovered device, published or withdrawn: an allocation is final even if a link
    /// went down since.
    pub inventory: &'a Inventory,
    /// The fabric's traffic class for the workload environment.
    pub traffic_class: Option<u8>,
    /// Where the runtime finds the device nodes.
    pub host_dev_root: &'a Path,
}

/// Pool device `name` on this node: its physical identity (the ledger's key) and the device.
fn resolve<'a>(inventory: &'a Inventory, name: &str) -> Option<(String, Granted<'a>)> {
    inventory
        .hcas
        .iter()
        .find(|h| hca_device_name(h) == name)
        .map(|h| (h.id.clone(), Granted::Hca(h)))
        .or_else(|| {
            inventory
                .gpus
                .iter()
                .find(|g| gpu_device_name(g) == name)
                .map(|g| (g.pci_address.clone(), Granted::Gpu(g)))
        })
}

/// Resolve `allocated` against `node`.
pub fn plan(
    claim: &ClaimRef,
    allocated: &[Allocated],
    node: &Node<'_>,
) -> Result<Plan, PrepareError> {
    let Node {
        pool,
        inventory,
        traffic_class,
        host_dev_root,
    } = *node;
    // Each allocation result once, in the allocation's order.
    let mut seen = BTreeSet::new();
    let mut resolved = Vec::new();
    for a in allocated {
        if !seen.insert((&a.request, &a.device)) {
            continue;
        }
        let (physical, device) =
            resolve(inventory, &a.device).ok_or_else(|| PrepareError::UnknownDevice {
                claim: claim.to_string(),
                request: a.request.clone(),
                device: a.device.clone(),
            })?;
        resolved.push((a, physical, device));
    }
    let mut requests: Requests<'_> = BTreeMap::new();
    for (a, _, device) in &resolved {
        requests.entry(a.request.clone()).or_default().push(*device);
    }
    let cdi = cdi::claim_spec(&claim.uid, &requests, traffic_class, host_dev_root);
    let mut given = BTreeSet::new();
    let devices: Vec<PreparedDevice> = resolved
        .into_iter()
        .map(|(a, physical, _)| PreparedDevice {
            request_names: vec![a.request.clone()],
            pool: pool.to_string(),
            device: a.device.clone(),
            physical,
            cdi_device_ids: match cdi.requests.get(&a.request) {
                Some(id) if given.insert(&a.request) => vec![id.clone()],
                _ => Vec::new(),
            },
            admin_access: a.admin_access,
        })
        .collect();
    let whole_claim = cdi.whole_claim.map(|id| WholeClaimDevice {
        request_names: vec![WHOLE_CLAIM_REQUEST.to_string()],
        pool: pool.to_string(),
        device: devices.last().map(|d| d.device.clone()).unwrap_or_default(),
        cdi_device_ids: vec![id],
    });
    Ok(Plan {
        devices,
        whole_claim,
        spec: cdi.spec,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
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

    fn claim_ref() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "pairs".into(),
            uid: "u-1".into(),
        }
    }

    fn result(
        request: &str,
        driver: &str,
        pool: &str,
        device: &str,
    ) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: request.into(),
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            ..Default::default()
        }
    }

    fn claim(uid: &str, results: Vec<DeviceRequestAllocationResult>) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.uid = Some(uid.into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    #[test]
    fn only_our_driver_and_pool_count_and_subrequests_map_to_their_request() {
        let c = claim(
            "u-1",
            vec![
                result("gpu-0", "rocefabric.io", "node-a", "gpu-0"),
                result("nic/fast", "rocefabric.io", "node-a", "hca-mlx5-0"),
                result("other", "gpu.nvidia.com", "node-a", "gpu-0"),
                result("elsewhere", "rocefabric.io", "node-b", "gpu-1"),
            ],
        );
        let ours = allocated(&c, &claim_ref(), "node-a").unwrap();
        assert_eq!(
            ours,
            vec![
                Allocated {
                    request: "gpu-0".into(),
                    device: "gpu-0".into(),
                    admin_access: false,
                },
                Allocated {
                    request: "nic".into(),
                    device: "hca-mlx5-0".into(),
                    admin_access: false,
                },
            ]
        );
        let err = allocated(
            &c,
            &ClaimRef {
                uid: "u-2".into(),
                ..claim_ref()
            },
            "node-a",
        )
        .unwrap_err();
        assert!(err.to_string().contains("uid u-1"), "{err}");
        let err = allocated(&c, &claim_ref(), "node-c").unwrap_err();
        assert!(matches!(err, PrepareError::NothingOfOurs { .. }), "{err}");
        let mut unallocated = c.clone();
        unallocated.status = None;
        assert!(matches!(
            allocated(&unallocated, &claim_ref(), "node-a").unwrap_err(),
            PrepareError::NotAllocated { .. }
        ));
    }

    fn node(inv: &Inventory) -> Node<'_> {
        Node {
            pool: "node-a",
            inventory: inv,
            traffic_class: Some(106),
            host_dev_root: Path::new("/dev"),
        }
    }

    fn owned(request: &str, device: String) -> Allocated {
        Allocated {
            request: request.into(),
            device,
            admin_access: false,
        }
    }

    /// Pairs 0 and 1 of a DGX H100 as four requests, as `examples/dra/gpu-hca-pairs.yaml` asks.
    fn two_pairs(inv: &Inventory) -> Vec<Allocated> {
        let pairs = rocefabric_node_model::topology::gpu_hca_pairs(inv);
        (0..2)
            .flat_map(|i| {
                let (gpu, hca, _) = pairs[i];
                [
                    owned(&format!("gpu-{i}"), gpu_device_name(gpu)),
                    owned(&format!("hca-{i}"), hca_device_name(hca)),
                ]
            })
            .collect()
    }

    /// The kubelet's answer for `plan`, as the driver gives it.
    fn answer(plan: &Plan) -> Vec<rocefabric_kubelet_api::pb_dra_v1::Device> {
        crate::driver::answer(&crate::checkpoint::ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            state: crate::checkpoint::ClaimState::Prepared,
            devices: plan.devices.clone(),
            whole_claim: plan.whole_claim.clone(),
        })
    }

    #[test]
    fn one_cdi_device_per_request_and_the_whole_claim_answered_last() {
        let inv = dgx();
        let plan = plan(&claim_ref(), &two_pairs(&inv), &node(&inv)).unwrap();
        let names: Vec<&str> = plan.spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["u-1-gpu-0", "u-1-gpu-1", "u-1-hca-0", "u-1-hca-1", "u-1"]
        );
        let answer = answer(&plan);
        let entries: Vec<(Vec<String>, Vec<String>)> = answer
            .iter()
            .map(|d| (d.request_names.clone(), d.cdi_device_ids.clone()))
            .collect();
        let id = |name: &str| vec![format!("rocefabric.io/claim={name}")];
        let one = |r: &str| vec![r.to_string()];
        assert_eq!(
            entries,
            [
                (one("gpu-0"), id("u-1-gpu-0")),
                (one("hca-0"), id("u-1-hca-0")),
                (one("gpu-1"), id("u-1-gpu-1")),
                (one("hca-1"), id("u-1-hca-1")),
                (one(WHOLE_CLAIM_REQUEST), id("u-1")),
            ]
        );
        assert!(answer.iter().all(|d| d.pool_name == "node-a"));
        assert_eq!(
            answer[4].device_name, answer[3].device_name,
            "the whole-claim entry sits on the claim's last device"
        );
        let physical: Vec<&str> = plan.devices.iter().map(|d| d.physical.as_str()).collect();
        let pairs = rocefabric_node_model::topology::gpu_hca_pairs(&inv);
        assert_eq!(
            physical,
            [
                pairs[0].0.pci_address.as_str(),
                &pairs[0].1.id,
                &pairs[1].0.pci_address,
                &pairs[1].1.id
            ]
        );

        // One request: it is the whole claim, no whole-claim entry.
        let (_, hca, _) = pairs[0];
        let plan = super::plan(
            &claim_ref(),
            &[owned("nic", hca_device_name(hca))],
            &node(&inv),
        )
        .unwrap();
        assert_eq!(plan.whole_claim, None);
        assert_eq!(plan.spec.devices.len(), 1);
        assert_eq!(answer_ids(&plan), [id("u-1-nic")]);
    }

    fn answer_ids(plan: &Plan) -> Vec<Vec<String>> {
        answer(plan).into_iter().map(|d| d.cdi_device_ids).collect()
    }

    #[test]
    fn a_request_of_several_devices_is_injected_once_and_a_device_of_two_requests_twice() {
        let inv = dgx();
        let hcas: Vec<String> = inv.hcas.iter().take(3).map(hca_device_name).collect();
        let allocated = vec![
            owned("rail", hcas[0].clone()),
            owned("rail", hcas[1].clone()),
            owned("rail", hcas[1].clone()),
            Allocated {
                request: "watch".into(),
                device: hcas[1].clone(),
                admin_access: true,
            },
            owned("spare", hcas[2].clone()),
        ];
        let plan = plan(&claim_ref(), &allocated, &node(&inv)).unwrap();
        let entries: Vec<(&str, &str, usize, bool)> = plan
            .devices
            .iter()
            .map(|d| {
                (
                    d.request_names[0].as_str(),
                    d.device.as_str(),
                    d.cdi_device_ids.len(),
                    d.admin_access,
                )
            })
            .collect();
        assert_eq!(
            entries,
            [
                ("rail", hcas[0].as_str(), 1, false),
                ("rail", hcas[1].as_str(), 0, false),
                ("watch", hcas[1].as_str(), 1, true),
                ("spare", hcas[2].as_str(), 1, false),
            ],
            "a result repeated is one entry; the request's CDI device on its first entry only"
        );
        let rail = &plan
            .spec
            .devices
            .iter()
            .find(|d| d.name == "u-1-rail")
            .unwrap();
        let nodes: Vec<&str> = rail
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes.len(), 3, "two uverbs and rdma_cm: {nodes:?}");
    }

    #[test]
    fn each_container_gets_exactly_its_requests_environment() {
        use rocefabric_node_testing::cdi_runtime::{ClaimEntry, cdi_ids, inject};
        let inv = dgx();
        let plan = plan(&claim_ref(), &two_pairs(&inv), &node(&inv)).unwrap();
        let answer = answer(&plan);
        let specs = [serde_json::to_value(&plan.spec).unwrap()];
        let container = |requests: &[Option<&str>]| {
            let entries: Vec<ClaimEntry<'_>> = requests
                .iter()
                .map(|&request| ClaimEntry {
                    devices: &answer,
                    request,
                })
                .collect();
            inject(&specs, &cdi_ids(&entries)).unwrap()
        };
        let pairs = rocefabric_node_model::topology::gpu_hca_pairs(&inv);
        let port = |i: usize| format!("{}:{}", pairs[i].1.name, pairs[i].1.port);
        let uverbs =
            |i: usize| format!("/dev/infiniband/{}", pairs[i].1.uverbs.as_deref().unwrap());
        let set = |items: &[String]| items.iter().cloned().collect::<BTreeSet<String>>();

        // The whole claim: every device, one environment over them all.
        let whole = container(&[None]);
        assert_eq!(whole.list("NCCL_IB_HCA"), set(&[port(0), port(1)]));
        assert_eq!(whole.list("UCX_NET_DEVICES"), set(&[port(0), port(1)]));
        assert_eq!(whole.list("NVIDIA_VISIBLE_DEVICES").len(), 2);
        assert_eq!(whole.list("PCIDEVICE_ROCEFABRIC_IO").len(), 4);
        assert_eq!(whole.env["NCCL_IB_TC"], "106");
        for path in [
            uverbs(0),
            uverbs(1),
            "/dev/infiniband/rdma_cm".into(),
            "/dev/nvidiactl".into(),
        ] {
            assert!(whole.device_nodes.contains_key(&path), "{path}: {whole:?}");
        }

        // One request: its own device and environment, nothing of the others'.
        let hca0 = container(&[Some("hca-0")]);
        assert_eq!(hca0.list("NCCL_IB_HCA"), set(&[port(0)]));
        assert_eq!(
            hca0.list("PCIDEVICE_ROCEFABRIC_IO"),
            set(&[pairs[0].1.pci_address.clone().unwrap()])
        );
        assert!(!hca0.env.contains_key("NVIDIA_VISIBLE_DEVICES"), "{hca0:?}");
        let nodes: Vec<&String> = hca0.device_nodes.keys().collect();
        assert_eq!(nodes, [&"/dev/infiniband/rdma_cm".to_string(), &uverbs(0)]);
        let gpu1 = container(&[Some("gpu-1")]);
        assert!(!gpu1.env.contains_key("NCCL_IB_HCA"), "{gpu1:?}");
        assert_eq!(gpu1.list("NVIDIA_VISIBLE_DEVICES").len(), 1);
        assert!(
            gpu1.device_nodes
                .keys()
                .all(|p| p.starts_with("/dev/nvidia"))
        );

        // Two requests named one by one: both requests' nodes, but the runtime keeps the last
        // request's variables (the limit the README states: name the whole claim instead).
        let both = container(&[Some("hca-0"), Some("hca-1")]);
        assert!(
            both.device_nodes.contains_key(&uverbs(0))
                && both.device_nodes.contains_key(&uverbs(1))
        );
        assert_eq!(both.list("NCCL_IB_HCA"), set(&[port(1)]));
    }

    #[test]
    fn a_container_with_two_claims_keeps_the_later_claims_environment() {
        use rocefabric_node_testing::cdi_runtime::{ClaimEntry, cdi_ids, inject};
        let inv = dgx();
        let pairs = rocefabric_node_model::topology::gpu_hca_pairs(&inv);
        let pair = |uid: &str, i: usize| {
            let (gpu, hca, _) = pairs[i];
            let claim = ClaimRef {
                uid: uid.into(),
                ..claim_ref()
            };
            let allocated = [
                owned("gpu", gpu_device_name(gpu)),
                owned("hca", hca_device_name(hca)),
            ];
            super::plan(&claim, &allocated, &node(&inv)).unwrap()
        };
        let (a, b) = (pair("u-a", 0), pair("u-b", 1));
        let specs = [
            serde_json::to_value(&a.spec).unwrap(),
            serde_json::to_value(&b.spec).unwrap(),
        ];
        let (answer_a, answer_b) = (answer(&a), answer(&b));
        let ids = cdi_ids(&[
            ClaimEntry {
                devices: &answer_a,
                request: None,
            },
            ClaimEntry {
                devices: &answer_b,
                request: None,
            },
        ]);
        let got = inject(&specs, &ids).unwrap();
        // Every device node of both claims...
        for (_, hca, _) in &pairs[..2] {
            let uverbs = format!("/dev/infiniband/{}", hca.uverbs.as_deref().unwrap());
            assert!(got.device_nodes.contains_key(&uverbs), "{got:?}");
        }
        // ... and the second claim's environment, whole: a variable is replaced, never appended.
        let port = format!("{}:{}", pairs[1].1.name, pairs[1].1.port);
        assert_eq!(got.list("NCCL_IB_HCA"), BTreeSet::from([port]));
        assert_eq!(got.list("NVIDIA_VISIBLE_DEVICES").len(), 1);
        assert_eq!(got.list("PCIDEVICE_ROCEFABRIC_IO").len(), 2);
    }

    #[test]
    fn an_unknown_device_names_the_claim_and_the_request() {
        let inv = dgx();
        let err =
            super::plan(&claim_ref(), &[owned("x", "hca-nope".into())], &node(&inv)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "claim ns/pairs: device hca-nope (request x) is not on this node"
        );
    }

    #[test]
    fn a_request_gets_the_same_environment_and_nodes_as_the_device_plugin_gives() {
        let inv = dgx();
        let cfg = rocefabric_node_model::config::Config::default();
        let hcas: Vec<&rocefabric_node_model::model::Hca> = inv.hcas.iter().take(2).collect();
        let ids: Vec<String> = hcas.iter().map(|h| h.id.clone()).collect();
        let dp = rocefabric_node_model::allocation::allocate(
            rocefabric_node_model::config::ResourceKind::Hca,
            &inv,
            &cfg,
            Some(106),
            &ids,
        )
        .unwrap();
        let allocated: Vec<Allocated> = hcas
            .iter()
            .map(|h| owned("hca", hca_device_name(h)))
            .collect();
        let plan = plan(&claim_ref(), &allocated, &node(&inv)).unwrap();
        let [request] = plan.spec.devices.as_slice() else {
            panic!("one request, one CDI device: {:?}", plan.spec.devices);
        };
        let mut dra_env: BTreeMap<String, String> = request
            .container_edits
            .env
            .iter()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let mut dp_env = dp.envs.clone();
        // Only the PCIDEVICE variable's name differs (it names the resource or the driver).
        assert_eq!(
            dp_env.remove("PCIDEVICE_RDMA_HCA"),
            dra_env.remove("PCIDEVICE_ROCEFABRIC_IO")
        );
        assert_eq!(dp_env, dra_env);
        let mut dp_nodes: Vec<String> = dp.devices.iter().map(|d| d.host_path.clone()).collect();
        let mut dra_nodes: Vec<String> = request
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.host_path.clone())
            .collect();
        dp_nodes.sort();
        dra_nodes.sort();
        assert_eq!(dp_nodes, dra_nodes);
    }
}
