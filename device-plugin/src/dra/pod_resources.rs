//! The kubelet's pod resources API, read in `both` mode: which device plugin devices live pods
//! hold, so the ledger learns when a grant ends (the device plugin API has no Deallocate).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Endpoint;

use super::pb_pod_resources::ListPodResourcesRequest;
use super::pb_pod_resources::pod_resources_lister_client::PodResourcesListerClient;
use crate::config::{Config, ResourceKind};
use crate::ownership::devices_behind;

/// How long one List may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("pod resources socket {path}: {reason}")]
    Call { path: PathBuf, reason: String },
    #[error("pod resources socket {path}: no answer within {LIST_TIMEOUT:?}")]
    Timeout { path: PathBuf },
}

/// Every `(resource, device id)` the kubelet lists for live pods' containers.
pub async fn list(socket: &Path) -> Result<Vec<(String, String)>, PodResourcesError> {
    let failed = |reason: String| PodResourcesError::Call {
        path: socket.to_path_buf(),
        reason,
    };
    let uri = crate::kubelet::uds_uri(socket).ok_or_else(|| failed("not UTF-8".into()))?;
    let call = async {
        let channel = Endpoint::from_shared(uri)
            .map_err(|e| failed(e.to_string()))?
            .connect()
            .await
            .map_err(|e| failed(e.to_string()))?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|status| failed(status.message().to_string()))
    };
    let response = tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .map_err(|_| PodResourcesError::Timeout {
            path: socket.to_path_buf(),
        })??
        .into_inner();
    Ok(response
        .pod_resources
        .into_iter()
        .flat_map(|pod| pod.containers)
        .flat_map(|container| container.devices)
        .flat_map(|devices| {
            let resource = devices.resource_name;
            devices
                .device_ids
                .into_iter()
                .map(move |id| (resource.clone(), id))
        })
        .collect())
}

/// The physical devices (HCA ID, GPU PCI address) behind listed grants of our resources, each
/// with its resource; grants of other resources are ignored.
pub fn held_devices(cfg: &Config, grants: &[(String, String)]) -> BTreeMap<String, String> {
    let kinds: BTreeMap<&str, ResourceKind> = ResourceKind::enabled_kinds(cfg)
        .into_iter()
        .map(|k| (k.resource_name(cfg), k))
        .collect();
    let mut out = BTreeMap::new();
    for (resource, id) in grants {
        if let Some(kind) = kinds.get(resource.as_str()) {
            for device in devices_behind(*kind, id) {
                out.insert(device.to_string(), resource.clone());
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn grants_of_our_resources_map_to_physical_devices() {
        let mut cfg = Config::default();
        cfg.gpu_hca.enabled = true;
        let grants = vec![
            ("rdma/hca".to_string(), "0000:18:00.0#1".to_string()),
            (
                "rdma/gpu-hca".to_string(),
                "0000:1b:00.0_0000:19:00.0".to_string(),
            ),
            ("nvidia.com/gpu".to_string(), "0000:2b:00.0".to_string()),
        ];
        let held = held_devices(&cfg, &grants);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            vec![
                ("0000:18:00.0".to_string(), "rdma/hca".to_string()),
                ("0000:19:00.0".to_string(), "rdma/gpu-hca".to_string()),
                ("0000:1b:00.0".to_string(), "rdma/gpu-hca".to_string()),
            ],
            "the GPU resource is off, so nvidia.com/gpu is another plugin's"
        );
    }
}
