//! The kubelet-facing side of DRA mode: the DRA gRPC service (v1, and v1beta1 for kubelets that
//! still speak it) on the driver's socket, and the plugin registration service on a socket in the
//! kubelet's `plugins_registry`, which the kubelet watches and dials (after a kubelet restart it
//! dials every socket found there again, so no re-registration is needed from our side).
//!
//! No claim logic lives here: the services hand each call to a [`Preparer`]. v1beta1 has the same
//! messages as v1 field for field, so its calls are re-encoded into v1 and back.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::pb_registration::registration_server::{Registration, RegistrationServer};
use super::pb_registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::pb_v1::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use super::{DRIVER_NAME, PLUGIN_TYPE, SUPPORTED_VERSIONS, pb_v1, pb_v1beta1};

/// Connections waiting for the server.
const ACCEPT_QUEUE: usize = 16;

/// What answers the kubelet's DRA calls, per claim (keyed by claim UID).
pub trait Preparer: Send + Sync + 'static {
    fn prepare(
        &self,
        claims: Vec<Claim>,
    ) -> impl Future<Output = BTreeMap<String, NodePrepareResourceResponse>> + Send;
    fn unprepare(
        &self,
        claims: Vec<Claim>,
    ) -> impl Future<Output = BTreeMap<String, NodeUnprepareResourceResponse>> + Send;
}

/// The DRA service over a [`Preparer`].
pub struct DraService<P> {
    preparer: Arc<P>,
}

impl<P> Clone for DraService<P> {
    fn clone(&self) -> Self {
        Self {
            preparer: Arc::clone(&self.preparer),
        }
    }
}

#[tonic::async_trait]
impl<P: Preparer> pb_v1::dra_plugin_server::DraPlugin for DraService<P> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = self.preparer.prepare(request.into_inner().claims).await;
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = self.preparer.unprepare(request.into_inner().claims).await;
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// One message re-encoded as its twin of the other API version (same fields, same numbers).
fn convert<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("message conversion failed: {e}")))
}

#[tonic::async_trait]
impl<P: Preparer> pb_v1beta1::dra_plugin_server::DraPlugin for DraService<P> {
    async fn node_prepare_resources(
        &self,
        request: Request<pb_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<pb_v1beta1::NodePrepareResourcesResponse>, Status> {
        let request: NodePrepareResourcesRequest = convert(request.get_ref())?;
        let claims = self.preparer.prepare(request.claims).await;
        Ok(Response::new(convert(&NodePrepareResourcesResponse {
            claims,
        })?))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<pb_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<pb_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let request: NodeUnprepareResourcesRequest = convert(request.get_ref())?;
        let claims = self.preparer.unprepare(request.claims).await;
        Ok(Response::new(convert(&NodeUnprepareResourcesResponse {
            claims,
        })?))
    }
}

/// The registration service: tells the kubelet who we are and where the DRA service listens.
pub struct RegistrationService {
    endpoint: String,
    registered: watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, "registered with the kubelet");
            self.registered.send_replace(Some(Ok(())));
        } else {
            tracing::error!(driver = DRIVER_NAME, error = %status.error, "the kubelet refused the registration");
            self.registered.send_replace(Some(Err(status.error)));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A gRPC server on a unix socket until `stop`.
pub struct SocketServer {
    pub socket: PathBuf,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl SocketServer {
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Wait for the server to end (after `stop` was signalled) and remove its socket.
    pub async fn join(self) {
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(socket = %self.socket.display(), %error, "server ended with an error")
            }
            Err(error) => {
                tracing::warn!(socket = %self.socket.display(), %error, "server task failed")
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    if std::fs::symlink_metadata(socket).is_ok() {
        std::fs::remove_file(socket)?;
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    UnixListener::bind(socket)
}

fn spawn(
    socket: &Path,
    listener: UnixListener,
    router: tonic::transport::server::Router,
    mut stop: watch::Receiver<bool>,
) -> SocketServer {
    // Through the authority front, as the device plugin sockets: any client may debug us.
    let (conns, incoming) = mpsc::channel(ACCEPT_QUEUE);
    let incoming = ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    let serve = router.serve_with_incoming_shutdown(incoming, async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    let span = tracing::info_span!("dra socket", socket = %socket.display());
    let task = tokio::spawn(
        async move {
            tokio::select! {
                result = serve => result,
                never = crate::kubelet::authority::accept(listener, conns) => match never {},
            }
        }
        .instrument(span),
    );
    SocketServer {
        socket: socket.to_path_buf(),
        task,
    }
}

/// Serve the DRA service (v1 and v1beta1) on `socket`.
pub fn serve_dra<P: Preparer>(
    socket: &Path,
    preparer: Arc<P>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<SocketServer> {
    let listener = bind(socket)?;
    let service = DraService { preparer };
    let router = tonic::transport::Server::builder()
        .add_service(pb_v1::dra_plugin_server::DraPluginServer::new(
            service.clone(),
        ))
        .add_service(pb_v1beta1::dra_plugin_server::DraPluginServer::new(service));
    Ok(spawn(socket, listener, router, stop))
}

/// Serve plugin registration on `socket`, naming `endpoint` (the DRA socket as the kubelet sees
/// it). `registered` receives the kubelet's verdict.
pub fn serve_registration(
    socket: &Path,
    endpoint: &Path,
    registered: watch::Sender<Option<Result<(), String>>>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<SocketServer> {
    let listener = bind(socket)?;
    let service = RegistrationService {
        endpoint: endpoint.to_string_lossy().into_owned(),
        registered,
    };
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(service));
    Ok(spawn(socket, listener, router, stop))
}
