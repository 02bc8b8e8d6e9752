//! `Register` with the kubelet's Registration service on `kubelet.sock`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Endpoint;

use super::pb;
use super::pb::registration_client::RegistrationClient;

/// Time allowed to connect to `kubelet.sock` and for the kubelet to answer `Register` (the kubelet
/// dials the plugin back before it answers).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why one `Register` attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("kubelet socket path {path} is not valid UTF-8")]
    NonUtf8Path { path: PathBuf },
    #[error("failed to connect to kubelet socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("kubelet rejected registration of {resource}: {status}")]
    Rejected {
        resource: String,
        status: Box<tonic::Status>,
    },
    #[error("kubelet did not answer registration of {resource} within {timeout:?}")]
    Timeout { resource: String, timeout: Duration },
}

impl RegistrationError {
    /// Short category, for metrics and log fields.
    pub fn metric_label(&self) -> &'static str {
        match self {
            RegistrationError::NonUtf8Path { .. } => "bad_path",
            RegistrationError::Connect { .. } => "unreachable",
            RegistrationError::Rejected { .. } => "rejected",
            RegistrationError::Timeout { .. } => "timeout",
        }
    }
}

/// The `RegisterRequest` of a resource served on `endpoint` (a file name relative to the plugin
/// directory).
pub fn register_request(resource_name: &str, endpoint: &str) -> pb::RegisterRequest {
    pb::RegisterRequest {
        version: super::API_VERSION.to_string(),
        endpoint: endpoint.to_string(),
        resource_name: resource_name.to_string(),
        options: Some(super::device_plugin::plugin_options()),
    }
}

/// One `Register` call. The plugin must already serve on its endpoint: the kubelet dials it back.
pub async fn register(
    kubelet_socket: &Path,
    request: pb::RegisterRequest,
) -> Result<(), RegistrationError> {
    let resource = request.resource_name.clone();
    let uri = super::uds_uri(kubelet_socket).ok_or_else(|| RegistrationError::NonUtf8Path {
        path: kubelet_socket.to_path_buf(),
    })?;
    let call = async {
        let connect = |source| RegistrationError::Connect {
            path: kubelet_socket.to_path_buf(),
            source,
        };
        let channel = Endpoint::from_shared(uri)
            .map_err(connect)?
            .connect()
            .await
            .map_err(connect)?;
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|status| RegistrationError::Rejected {
                resource: resource.clone(),
                status: Box::new(status),
            })
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, call).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => Err(RegistrationError::Timeout {
            resource,
            timeout: REGISTER_TIMEOUT,
        }),
    }
}

pub use rocefabric_runtime::Backoff;

/// The backoff between registration attempts: 100 ms doubling to 10 s.
pub const DEFAULT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

/// Register until the kubelet accepts, waiting per `backoff` between failures, telling
/// `on_attempt` each outcome. Never gives up; cancel it by dropping or aborting the future.
/// Returns the number of attempts made.
pub async fn register_with_backoff(
    kubelet_socket: &Path,
    request: pb::RegisterRequest,
    backoff: Backoff,
    on_attempt: impl Fn(Result<(), &RegistrationError>),
) -> u32 {
    let mut failures = 0u32;
    loop {
        match register(kubelet_socket, request.clone()).await {
            Ok(()) => {
                on_attempt(Ok(()));
                tracing::info!(resource = %request.resource_name, endpoint = %request.endpoint,
                    attempts = failures + 1, "registered with the kubelet");
                return failures + 1;
            }
            Err(error) => {
                on_attempt(Err(&error));
                failures = failures.saturating_add(1);
                let delay = backoff.delay(failures);
                tracing::warn!(resource = %request.resource_name, %error, retry_in = ?delay,
                    "registration failed");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn registration_backs_off_from_100ms_to_10s() {
        assert_eq!(DEFAULT_BACKOFF.delay(1), Duration::from_millis(100));
        assert_eq!(DEFAULT_BACKOFF.delay(2), Duration::from_millis(200));
        assert_eq!(DEFAULT_BACKOFF.delay(200), Duration::from_secs(10));
    }

    #[test]
    fn register_request_has_version_endpoint_resource_and_options() {
        let r = register_request("rdma/hca", "rocefabric-rdma_hca.sock");
        assert_eq!(r.version, "v1beta1");
        assert_eq!(r.endpoint, "rocefabric-rdma_hca.sock");
        assert_eq!(r.resource_name, "rdma/hca");
        let options = r.options.unwrap();
        assert!(options.get_preferred_allocation_available);
        assert!(!options.pre_start_required);
    }
}
