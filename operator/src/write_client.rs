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
//! [`ROCE_NODE_WRITES_IN_FLIGHT`]: crate::controller::ROCE_NODE_WRITES_IN_FLIGHT

use std::time::Duration;

use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use kube::{Client, Config};
use rustls::pki_types::ServerName;
use tower::{BoxError, ServiceBuilder};

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

/// A client for `config` whose requests go over HTTP/2 where the server speaks it. With a proxy
/// configured, kube's own client (which knows proxies) is returned instead.
pub fn build(config: &Config) -> Result<Client, WriteClientError> {
    if config.proxy_url.is_some() {
        return Ok(Client::try_from(config.clone())?);
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
    Ok(Client::new(service, config.default_namespace.clone()))
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
