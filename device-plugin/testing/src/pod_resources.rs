//! The kubelet's pod resources API (`List`) over a real unix socket, listing the device plugin
//! grants a test sets: what the node daemon reads to learn which devices live pods hold, whichever
//! plugin granted them (ours, or NVIDIA's GPU plugin beside it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use rocefabric_kubelet_api::pb_pod_resources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use rocefabric_kubelet_api::pb_pod_resources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};

use crate::kubelet_emulator::EmulatorError;

/// One container's grant of a device plugin resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// `namespace/name` of the pod.
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

impl Grant {
    /// `resource` devices `ids` granted to container `main` of pod `pod` (`namespace/name`).
    pub fn new(pod: &str, resource: &str, ids: &[&str]) -> Self {
        Self {
            pod: pod.to_string(),
            container: "main".to_string(),
            resource: resource.to_string(),
            device_ids: ids.iter().map(|id| id.to_string()).collect(),
        }
    }
}

#[derive(Clone, Default)]
struct Lister {
    grants: Arc<Mutex<Vec<Grant>>>,
}

impl Lister {
    fn response(&self) -> ListPodResourcesResponse {
        // A poisoned lock only means a test thread panicked while holding it; the list is whole.
        let grants = self
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let pod_resources = grants
            .into_iter()
            .map(|g| {
                let (namespace, name) = g.pod.split_once('/').unwrap_or(("default", &g.pod));
                PodResources {
                    name: name.to_string(),
                    namespace: namespace.to_string(),
                    containers: vec![ContainerResources {
                        name: g.container.clone(),
                        devices: vec![ContainerDevices {
                            resource_name: g.resource.clone(),
                            device_ids: g.device_ids.clone(),
                        }],
                    }],
                }
            })
            .collect();
        ListPodResourcesResponse { pod_resources }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.response()))
    }
}

/// The emulated pod resources socket; it lists no grant until [`PodResourcesEmulator::set`].
pub struct PodResourcesEmulator {
    socket: PathBuf,
    lister: Lister,
    task: JoinHandle<()>,
}

impl PodResourcesEmulator {
    /// Serve `List` on `socket` (creating its directory when missing).
    pub async fn start(socket: &Path) -> Result<Self, EmulatorError> {
        let io_err = |source| EmulatorError::Io {
            path: socket.to_path_buf(),
            source,
        };
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(socket).map_err(io_err)?;
        let lister = Lister::default();
        let server = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(lister.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener));
        let task = tokio::spawn(async move {
            if let Err(error) = server.await {
                tracing::warn!(%error, "emulator: pod resources server ended");
            }
        });
        Ok(Self {
            socket: socket.to_path_buf(),
            lister,
            task,
        })
    }

    /// The socket served.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// List `grants` from now on (live pods' grants; a pod gone is a grant left out).
    pub fn set(&self, grants: Vec<Grant>) {
        *self
            .lister
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = grants;
    }

    /// Stop serving and remove the socket (as a kubelet restart does, for a moment): a `List`
    /// from now on fails.
    pub fn stop(self) {
        // Drop does the rest.
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for PodResourcesEmulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_what_was_set_until_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("pod-resources/kubelet.sock");
        let emulator = PodResourcesEmulator::start(&socket).await.unwrap();
        assert!(
            rocefabric_kubelet_api::pod_resources::list(&socket)
                .await
                .unwrap()
                .is_empty()
        );
        emulator.set(vec![Grant::new(
            "ns/train",
            "nvidia.com/gpu",
            &["GPU-a", "GPU-b"],
        )]);
        assert_eq!(
            rocefabric_kubelet_api::pod_resources::list(&socket)
                .await
                .unwrap(),
            vec![
                ("nvidia.com/gpu".to_string(), "GPU-a".to_string()),
                ("nvidia.com/gpu".to_string(), "GPU-b".to_string()),
            ]
        );
        emulator.stop();
        assert!(!socket.exists());
        assert!(
            rocefabric_kubelet_api::pod_resources::list(&socket)
                .await
                .is_err()
        );
    }
}
