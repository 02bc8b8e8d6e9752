//! The client the operator's writes go through: kube's request stack (cluster URL, credentials,
//! impersonation headers) over HTTP/2 when the API server offers it (ALPN, as every
//! kube-apiserver does over TLS), HTTP/1.1 otherwise.
//!
//! Why a second client: kube's own speaks HTTP/1.1 only, so a batch of RoceNode applies in
//! flight (a paced rollout sends up to [`ROCE_NODE_WRITES_IN_FLIGHT`] at once) holds as many TCP
//! connections, each answer waking the operator on its own. Over one HTTP/2 connection the
//! batch shares one socket (what client-go does by default): in the scale harness's
//! 10,000-node rollout (TLS both ways) the operator's reads fell by a quarter and its CPU by
//! 13%. The watches stay on kube's client.
//!
//! kube's `Client` queues every request through a `Buffer` (a task that hands each request on
//! to the stack: one more task wake a request). The RoceNode applies of a rollout skip it
//! through [`DirectClient`], a clone of the same stack (same connection, same credentials).
//!
//! [`ROCE_NODE_WRITES_IN_FLIGHT`]: crate::controller::ROCE_NODE_WRITES_IN_FLIGHT

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::Body;
use kube::client::ConfigExt as _;
use kube::core::Status;
use kube::{Client, Config};
use rustls::pki_types::ServerName;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _};

/// Why the write client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WriteClientError {
    /// TLS settings, credentials or headers of the configuration kube refused.
    #[error(transparent)]
    Config(#[from] kube::Error),
    /// `tls-server-name` is not a DNS name or IP address.
    #[error("tls-server-name {value:?} is not a DNS name or IP address")]
    TlsServerName { value: String },
}

/// How often an idle HTTP/2 connection is pinged, and how long an answer may take before the
/// connection counts as dead (client-go's `ReadIdleTimeout` and `PingTimeout`).
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// What the operator writes through.
#[derive(Clone)]
pub struct WriteClient {
    /// Every write but the RoceNode applies.
    pub client: Client,
    /// The RoceNode applies; `None`: they go through `client` too.
    pub direct: Option<DirectClient>,
}

impl From<Client> for WriteClient {
    /// Every write through kube's client.
    fn from(client: Client) -> Self {
        Self {
            client,
            direct: None,
        }
    }
}

/// A request stack called directly, without kube's request queue; answers are read in full.
#[derive(Clone)]
pub struct DirectClient {
    stack: BoxCloneSyncService<Request<Body>, Response<Bytes>, BoxError>,
}

impl std::fmt::Debug for DirectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectClient").finish_non_exhaustive()
    }
}

impl DirectClient {
    /// Requests through `stack` (base URI, credentials and headers already layered on).
    pub fn new<S, B>(stack: S) -> Self
    where
        S: Service<Request<Body>, Response = Response<B>> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let stack = stack
            .map_err(Into::into)
            .and_then(|response: Response<B>| async {
                let (parts, body) = response.into_parts();
                let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
                Ok(Response::from_parts(parts, bytes))
            });
        Self {
            stack: BoxCloneSyncService::new(stack),
        }
    }

    /// Send `request`. An answer of 4xx or 5xx is `kube::Error::Api` as kube's own client makes
    /// it (the `Status` the server sent, or one built from the code and text).
    pub async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, kube::Error> {
        let response = self
            .stack
            .clone()
            .oneshot(request.map(Body::from))
            .await
            .map_err(|error| match error.downcast::<kube::Error>() {
                // The credentials layer's own errors (a token that could not be refreshed).
                Ok(error) => *error,
                Err(error) => kube::Error::Service(error),
            })?;
        let code = response.status();
        if !code.is_client_error() && !code.is_server_error() {
            return Ok(response);
        }
        let body = response.into_body();
        let status = serde_json::from_slice::<Status>(&body).unwrap_or_else(|_| {
            let text = String::from_utf8_lossy(&body);
            Status::failure(text.trim(), "Failed to parse error data").with_code(code.as_u16())
        });
        Err(kube::Error::Api(status.boxed()))
    }
}

/// A client for `config` whose requests go over HTTP/2 where the server speaks it. With a proxy
/// configured, kube's own client (which knows proxies) does every write instead.
pub fn build(config: &Config) -> Result<WriteClient, WriteClientError> {
    if config.proxy_url.is_some() {
        return Ok(Client::try_from(config.clone())?.into());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    // The kubeconfig's `tls-server-name`: the name the certificate is checked against.
    if let Some(name) = &config.tls_server_name {
        let server_name =
            ServerName::try_from(name.clone()).map_err(|_| WriteClientError::TlsServerName {
                value: name.clone(),
            })?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(server_name));
    }
    let https = tls.enable_all_versions().wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_EVERY)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(WriteClient {
        client: Client::new(service.clone(), config.default_namespace.clone()),
        direct: Some(DirectClient::new(service)),
    })
}

/// The HTTP version the API server answers `client` in, from a `GET /version` (readable by
/// every caller, `system:public-info-viewer`). The operator logs it at start, so `kubectl logs`
/// tells whether its writes share one HTTP/2 connection.
pub async fn negotiated_version(client: &Client) -> Result<http::Version, kube::Error> {
    let request = http::Request::get("/version")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    Ok(client.send(request.map(Into::into)).await?.version())
}
