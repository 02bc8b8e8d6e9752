//! One tonic `DevicePlugin` server per resource, each on its own unix socket.
//!
//! The gRPC layer is a thin adapter over [`DeviceBackend`]: the backend owns the device list (a
//! `tokio::sync::watch` channel that feeds `ListAndWatch`) and the allocation decisions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};

use super::pb;
use super::pb::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::socket::{self, SocketError, SocketServer};

/// How long [`PluginServer::start`] waits for its own socket to answer before giving up.
const SELF_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The options this plugin advertises: `GetPreferredAllocation` is implemented, `PreStartContainer`
/// is not needed.
pub fn plugin_options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A request the backend refused or could not answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    /// The kubelet named a device this resource does not advertise.
    #[error("unknown device ID {id:?} for resource {resource}")]
    UnknownDevice { resource: String, id: String },
    /// The request itself is malformed (for example a negative allocation size).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The backend could not compute an answer.
    #[error("{0}")]
    Failed(String),
}

impl From<BackendError> for Status {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::UnknownDevice { .. } | BackendError::InvalidRequest(_) => {
                Status::invalid_argument(e.to_string())
            }
            BackendError::Failed(_) => Status::internal(e.to_string()),
        }
    }
}

/// What a resource's server needs from the daemon. Implemented by the daemon over inventory and
/// allocation; tests may implement it with fixed data.
pub trait DeviceBackend: Send + Sync + 'static {
    /// The extended resource name (`rdma/hca`).
    fn resource_name(&self) -> &str;
    /// The advertised devices. `ListAndWatch` sends the current list at once and again every time
    /// the channel changes.
    fn devices(&self) -> watch::Receiver<Vec<pb::Device>>;
    /// The preferred `size` devices out of `available`, including every `must_include`.
    fn preferred_allocation(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, BackendError>;
    /// Device nodes, mounts, environment and annotations for one container granted `device_ids`.
    fn allocate(
        &self,
        device_ids: &[String],
    ) -> Result<pb::ContainerAllocateResponse, BackendError>;
}

/// The tonic service of one resource.
pub struct PluginService<B> {
    backend: Arc<B>,
    /// Becomes `true` when the server stops; open `ListAndWatch` streams end then, so the
    /// server's graceful shutdown does not wait on them forever.
    stopping: watch::Receiver<bool>,
}

impl<B> PluginService<B> {
    pub fn new(backend: Arc<B>, stopping: watch::Receiver<bool>) -> Self {
        Self { backend, stopping }
    }
}

#[tonic::async_trait]
impl<B: DeviceBackend> DevicePlugin for PluginService<B> {
    type ListAndWatchStream = ReceiverStream<Result<pb::ListAndWatchResponse, Status>>;

    async fn get_device_plugin_options(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    async fn list_and_watch(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let resource = self.backend.resource_name().to_string();
        let mut devices = self.backend.devices();
        let mut stopping = self.stopping.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            tracing::info!(%resource, "ListAndWatch opened");
            loop {
                let list = devices.borrow_and_update().clone();
                tracing::debug!(%resource, devices = list.len(), "sending device list");
                if tx
                    .send(Ok(pb::ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { break },
                    _ = stopping.wait_for(|stop| *stop) => break,
                    () = tx.closed() => break,
                }
            }
            tracing::info!(%resource, "ListAndWatch closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let resource = self.backend.resource_name();
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let size = usize::try_from(req.allocation_size).map_err(|_| {
                Status::from(BackendError::InvalidRequest(format!(
                    "allocation_size {} is negative",
                    req.allocation_size
                )))
            })?;
            let chosen = self.backend.preferred_allocation(
                &req.available_device_i_ds,
                &req.must_include_device_i_ds,
                size,
            )?;
            tracing::info!(%resource, size, available = req.available_device_i_ds.len(),
                preferred = ?chosen, "GetPreferredAllocation");
            container_responses.push(pb::ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let resource = self.backend.resource_name();
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            match self.backend.allocate(&req.devices_ids) {
                Ok(response) => {
                    tracing::info!(%resource, devices = ?req.devices_ids, "Allocate");
                    container_responses.push(response);
                }
                Err(error) => {
                    tracing::warn!(%resource, devices = ?req.devices_ids, %error, "Allocate refused");
                    return Err(error.into());
                }
            }
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// Failure to bring a resource's server up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("socket path {path} is not valid UTF-8")]
    NonUtf8Path { path: PathBuf },
    #[error("server on {path} does not answer GetDevicePluginOptions: {reason}")]
    NotServing { path: PathBuf, reason: String },
}

/// A running `DevicePlugin` server on one unix socket.
#[derive(Debug)]
pub struct PluginServer {
    resource: String,
    server: SocketServer,
}

impl PluginServer {
    /// Bind `socket` (replacing a file already there), serve `backend` on it, and return once the
    /// server answers a `GetDevicePluginOptions` call on that socket, so the caller may register.
    pub async fn start<B: DeviceBackend>(
        socket: &Path,
        backend: Arc<B>,
    ) -> Result<Self, ServerError> {
        let resource = backend.resource_name().to_string();
        let span = tracing::info_span!("plugin server", %resource);
        let server = socket::serve(socket, span, |stopping| {
            tonic::transport::Server::builder().add_service(DevicePluginServer::new(
                PluginService::new(backend, stopping),
            ))
        })?;
        let server = Self { resource, server };
        if let Err(e) = server.self_check().await {
            server.stop().await;
            return Err(e);
        }
        tracing::info!(resource = %server.resource, socket = %socket.display(), "serving");
        Ok(server)
    }

    /// Dial our own socket as the kubelet will and call `GetDevicePluginOptions`.
    async fn self_check(&self) -> Result<(), ServerError> {
        let path = self.server.socket();
        let not_serving = |reason: String| ServerError::NotServing {
            path: path.to_path_buf(),
            reason,
        };
        let uri = super::uds_uri(path).ok_or_else(|| ServerError::NonUtf8Path {
            path: path.to_path_buf(),
        })?;
        let check = async {
            let channel = Endpoint::from_shared(uri)
                .map_err(|e| not_serving(e.to_string()))?
                .connect()
                .await
                .map_err(|e| not_serving(e.to_string()))?;
            pb::device_plugin_client::DevicePluginClient::new(channel)
                .get_device_plugin_options(pb::Empty {})
                .await
                .map_err(|e| not_serving(e.to_string()))
        };
        match tokio::time::timeout(SELF_CHECK_TIMEOUT, check).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(not_serving(format!(
                "no answer within {SELF_CHECK_TIMEOUT:?}"
            ))),
        }
    }

    pub fn resource_name(&self) -> &str {
        &self.resource
    }

    pub fn socket_path(&self) -> &Path {
        self.server.socket()
    }

    /// Whether the server task is still running.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// Whether the server runs and its socket file is still the one it bound.
    pub fn intact(&self) -> bool {
        self.server.intact()
    }

    /// Stop serving: end open streams, wait briefly for in-flight calls, remove the socket file.
    pub async fn stop(self) {
        let Self { resource, server } = self;
        let socket = server.socket().to_path_buf();
        server.stop().await;
        tracing::info!(%resource, socket = %socket.display(), "stopped serving");
    }
}
