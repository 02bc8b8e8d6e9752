//! The kubelet-facing side of DRA mode: the DRA gRPC service (v1, and v1beta1 for kubelets that
//! still speak it) on the driver's socket, and the plugin registration service on a socket in the
//! kubelet's `plugins_registry`, which the kubelet watches and dials (after a kubelet restart it
//! dials every socket found there again, so no re-registration is needed from our side).
//!
//! No claim logic lives here: the services hand each call to a [`Preparer`]. v1beta1 has the same
//! messages as v1 field for field, so its calls are re-encoded into v1 and back.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use prost::Message;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::pb_dra_v1::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::pb_plugin_registration::registration_server::{Registration, RegistrationServer};
use crate::pb_plugin_registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::socket::{self, SocketError, SocketServer};
use crate::{pb_dra_v1 as pb_v1, pb_dra_v1beta1 as pb_v1beta1};

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

/// `type` of the kubelet's plugin registration for a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// DRA services served, newest first, as registration names them.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// The registration service: tells the kubelet who we are and where the DRA service listens.
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    registered: watch::Sender<Option<Result<(), String>>>,
}

impl RegistrationService {
    /// Register DRA driver `driver` whose service listens on `endpoint` (the socket as the
    /// kubelet sees it); `registered` receives the kubelet's verdict.
    pub fn new(
        driver: &str,
        endpoint: &Path,
        registered: watch::Sender<Option<Result<(), String>>>,
    ) -> Self {
        Self {
            driver: driver.to_string(),
            endpoint: endpoint.to_string_lossy().into_owned(),
            registered,
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
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
            tracing::info!(driver = %self.driver, "registered with the kubelet");
            self.registered.send_replace(Some(Ok(())));
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the registration");
            self.registered.send_replace(Some(Err(status.error)));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Serve the DRA service (v1 and v1beta1) on `socket` until the returned server is stopped.
pub fn serve_dra<P: Preparer>(
    socket: &Path,
    preparer: Arc<P>,
) -> Result<SocketServer, SocketError> {
    let span = tracing::info_span!("dra socket", socket = %socket.display());
    socket::serve(socket, span, |_| {
        let service = DraService { preparer };
        tonic::transport::Server::builder()
            .add_service(pb_v1::dra_plugin_server::DraPluginServer::new(
                service.clone(),
            ))
            .add_service(pb_v1beta1::dra_plugin_server::DraPluginServer::new(service))
    })
}

/// Serve plugin registration on `socket` for `service`.
pub fn serve_registration(
    socket: &Path,
    service: RegistrationService,
) -> Result<SocketServer, SocketError> {
    let span = tracing::info_span!("registration socket", socket = %socket.display());
    socket::serve(socket, span, |_| {
        tonic::transport::Server::builder().add_service(RegistrationServer::new(service))
    })
}
