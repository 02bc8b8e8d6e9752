//! A claim's allocation, resolved against this node: which of our devices the scheduler gave it,
//! what the kubelet is answered and what the CDI spec says.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::DRIVER_NAME;
use super::cdi::{self, CdiSpec, Granted};
use super::checkpoint::PreparedDevice;
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

/// What a prepare records, answers and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub devices: Vec<PreparedDevice>,
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
    // Device name -> (request names, device, admin access only), merging a device listed for
    // several requests: it is owned when any of them owns it.
    let mut granted: BTreeMap<&str, (Vec<String>, String, Granted<'_>, bool)> = BTreeMap::new();
    for a in allocated {
        if let Some((requests, _, _, admin)) = granted.get_mut(a.device.as_str()) {
            if !requests.contains(&a.request) {
                requests.push(a.request.clone());
            }
            *admin &= a.admin_access;
            continue;
        }
        let found = inventory
            .hcas
            .iter()
            .find(|h| hca_device_name(h) == a.device)
            .map(|h| (h.id.clone(), Granted::Hca(h)))
            .or_else(|| {
                inventory
                    .gpus
                    .iter()
                    .find(|g| gpu_device_name(g) == a.device)
                    .map(|g| (g.pci_address.clone(), Granted::Gpu(g)))
            });
        let Some((physical, device)) = found else {
            return Err(PrepareError::UnknownDevice {
                claim: claim.to_string(),
                request: a.request.clone(),
                device: a.device.clone(),
            });
        };
        granted.insert(
            &a.device,
            (vec![a.request.clone()], physical, device, a.admin_access),
        );
    }
    let for_spec: Vec<(String, Granted<'_>)> = granted
        .iter()
        .map(|(name, (_, _, device, _))| (name.to_string(), *device))
        .collect();
    let spec = cdi::claim_spec(&claim.uid, &for_spec, traffic_class, host_dev_root);
    let devices = granted
        .into_iter()
        .map(
            |(name, (request_names, physical, _, admin_access))| PreparedDevice {
                request_names,
                pool: pool.to_string(),
                device: name.to_string(),
                physical,
                cdi_device_ids: vec![cdi::device_id(&claim.uid, name)],
                admin_access,
            },
        )
        .collect();
    Ok(Plan { devices, spec })
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

    #[test]
    fn a_pair_claim_gets_its_nodes_per_device_and_one_environment() {
        let inv = dgx();
        let (gpu, hca, _) = rocefabric_node_model::topology::gpu_hca_pairs(&inv)[0];
        let allocated = vec![
            Allocated {
                request: "gpu-0".into(),
                device: gpu_device_name(gpu),
                admin_access: false,
            },
            Allocated {
                request: "hca-0".into(),
                device: hca_device_name(hca),
                admin_access: false,
            },
        ];
        let plan = plan(
            &claim_ref(),
            &allocated,
            &Node {
                pool: "node-a",
                inventory: &inv,
                traffic_class: Some(106),
                host_dev_root: Path::new("/dev"),
            },
        )
        .unwrap();
        assert_eq!(plan.devices.len(), 2);
        let hca_dev = plan.devices.iter().find(|d| d.physical == hca.id).unwrap();
        assert_eq!(hca_dev.request_names, vec!["hca-0".to_string()]);
        assert_eq!(
            hca_dev.cdi_device_ids,
            vec![format!("rocefabric.io/claim=u-1-{}", hca_device_name(hca))]
        );
        let spec = serde_json::to_value(&plan.spec).unwrap();
        assert_eq!(spec["kind"], "rocefabric.io/claim");
        let env: Vec<&str> = spec["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            env.contains(&format!("NCCL_IB_HCA=={}:{}", hca.name, hca.port).as_str()),
            "{env:?}"
        );
        assert!(env.contains(&"NCCL_IB_TC=106"), "{env:?}");
        let shared: Vec<&str> = spec["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert!(shared.contains(&"/dev/infiniband/rdma_cm") && shared.contains(&"/dev/nvidiactl"));
        let uverbs = format!("/dev/infiniband/{}", hca.uverbs.as_deref().unwrap());
        let per_device: Vec<&str> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["containerEdits"]["deviceNodes"][0]["path"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert!(per_device.contains(&uverbs.as_str()), "{per_device:?}");
        assert!(per_device.contains(&format!("/dev/nvidia{}", gpu.index).as_str()));

        let err = super::plan(
            &claim_ref(),
            &[Allocated {
                request: "x".into(),
                device: "hca-nope".into(),
                admin_access: false,
            }],
            &Node {
                pool: "node-a",
                inventory: &inv,
                traffic_class: None,
                host_dev_root: Path::new("/dev"),
            },
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "claim ns/pairs: device hca-nope (request x) is not on this node"
        );
    }

    #[test]
    fn the_same_environment_as_the_device_plugin_gives() {
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
            .map(|h| Allocated {
                request: "hca".into(),
                device: hca_device_name(h),
                admin_access: false,
            })
            .collect();
        let plan = plan(
            &claim_ref(),
            &allocated,
            &Node {
                pool: "n",
                inventory: &inv,
                traffic_class: Some(106),
                host_dev_root: Path::new("/dev"),
            },
        )
        .unwrap();
        let mut dra_env: BTreeMap<String, String> = plan
            .spec
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
        let mut dra_nodes: Vec<String> = plan
            .spec
            .devices
            .iter()
            .flat_map(|d| d.container_edits.device_nodes.iter())
            .chain(plan.spec.container_edits.device_nodes.iter())
            .map(|n| n.host_path.clone())
            .collect();
        dp_nodes.sort();
        dra_nodes.sort();
        assert_eq!(dp_nodes, dra_nodes);
    }
}
