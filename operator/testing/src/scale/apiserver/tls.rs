//! TLS for the scale API server, as a real one serves: a self-signed certificate for 127.0.0.1
//! made at start (its PEM goes into the kubeconfig as the cluster's CA), and HTTP/2 or HTTP/1.1
//! chosen by ALPN.

use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The server's side of TLS, and the certificate clients must trust.
pub struct Tls {
    acceptor: TlsAcceptor,
    /// The self-signed certificate, PEM.
    pub ca_pem: String,
}

impl Tls {
    /// A fresh key and certificate for `127.0.0.1` and `localhost`.
    pub fn self_signed() -> anyhow::Result<Tls> {
        let key = rcgen::KeyPair::generate().context("generating the server key")?;
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .context("certificate parameters")?;
        let cert = params.self_signed(&key).context("self-signing")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .context("the server certificate")?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca_pem: cert.pem(),
        })
    }

    /// Serve `app` on every connection `listener` accepts, until the task is dropped.
    pub async fn serve(self, listener: TcpListener, app: Router) {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            // As Go's server does: small answers go out at once.
            let _ = tcp.set_nodelay(true);
            let (acceptor, app) = (self.acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = TowerToHyperService::new(app);
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await;
            });
        }
    }
}
