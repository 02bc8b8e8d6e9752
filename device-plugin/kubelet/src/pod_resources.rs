//! The kubelet's pod resources API (List): which device plugin devices live pods hold.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::pb_pod_resources::ListPodResourcesRequest;
use crate::pb_pod_resources::pod_resources_lister_client::PodResourcesListerClient;

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
    let uri = crate::uds_uri(socket).ok_or_else(|| failed("not UTF-8".into()))?;
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
