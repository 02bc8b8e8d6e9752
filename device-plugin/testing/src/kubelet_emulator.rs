//! A kubelet emulator: the kubelet's side of the device plugin API, over real unix sockets.
//!
//! It serves `Registration` on `<dir>/kubelet.sock` and, like the kubelet's device manager, on each
//! `Register` validates the version and resource name, dials `<dir>/<endpoint>` (refusing the
//! registration when nothing answers there), then calls `GetDevicePluginOptions` and keeps a
//! `ListAndWatch` stream open, recording the latest device list per resource. Client helpers call
//! `GetPreferredAllocation`, `Allocate` and `PreStartContainer` as the kubelet would, and
//! [`KubeletEmulator::restart`] does what a kubelet restart does to the directory: delete every
//! socket in it and create `kubelet.sock` again.
//!
//! Used by the crate's tests and benchmark, by e2e, and by the README demo.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use rocefabric_kubelet_api::pb;
use rocefabric_kubelet_api::pb::device_plugin_client::DevicePluginClient;
use rocefabric_kubelet_api::pb::registration_server::{Registration, RegistrationServer};

/// How long the emulator tries to reach a plugin's endpoint while handling `Register`.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// One `Register` call as the emulator saw it.
#[derive(Clone, Debug)]
pub struct RecordedRegistration {
    pub request: pb::RegisterRequest,
    /// Which emulator run (0, then +1 per [`KubeletEmulator::restart`]) received it.
    pub generation: u64,
    /// When it arrived.
    pub at: Instant,
    /// `None` when accepted; otherwise why it was refused (bad version or resource name, or the
    /// plugin's endpoint did not answer).
    pub rejected: Option<String>,
}

impl RecordedRegistration {
    pub fn accepted(&self) -> bool {
        self.rejected.is_none()
    }
}

/// What the emulator knows at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Current run: 0 after start, +1 per restart.
    pub generation: u64,
    /// Every `Register` call received, in order, across restarts.
    pub registrations: Vec<RecordedRegistration>,
    /// Options returned by `GetDevicePluginOptions`, per resource (current run).
    pub options: BTreeMap<String, pb::DevicePluginOptions>,
    /// Latest `ListAndWatch` device list per resource (current run).
    pub devices: BTreeMap<String, Vec<pb::Device>>,
    /// Number of `ListAndWatch` responses received per resource (current run).
    pub list_updates: BTreeMap<String, usize>,
}

impl Snapshot {
    /// Accepted registrations of the current run, per resource, the latest one.
    pub fn registered(&self) -> BTreeMap<&str, &RecordedRegistration> {
        self.registrations
            .iter()
            .filter(|r| r.generation == self.generation && r.accepted())
            .map(|r| (r.request.resource_name.as_str(), r))
            .collect()
    }

    /// The device list of `resource`, when its `ListAndWatch` has delivered one.
    pub fn devices_of(&self, resource: &str) -> Option<&[pb::Device]> {
        self.devices.get(resource).map(Vec::as_slice)
    }
}

/// Failures of the emulator or of the calls it makes for a test.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("failed to prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("socket path {path} is not valid UTF-8")]
    NonUtf8Path { path: PathBuf },
    #[error("resource {0} is not registered")]
    NotRegistered(String),
    #[error("failed to connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("call failed: {0}")]
    Rpc(#[from] Box<Status>),
    #[error("condition not met within {0:?}")]
    Timeout(Duration),
}

struct Shared {
    dir: PathBuf,
    state: watch::Sender<Snapshot>,
    /// Per resource: the plugin endpoint and the task holding its `ListAndWatch` stream.
    plugins: Mutex<BTreeMap<String, (PathBuf, JoinHandle<()>)>>,
}

impl Shared {
    fn plugins(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (PathBuf, JoinHandle<()>)>> {
        // A poisoned lock only means a test thread panicked while holding it; the map is still valid.
        self.plugins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn drop_plugins(&self) {
        for (_, (_, task)) in std::mem::take(&mut *self.plugins()) {
            task.abort();
        }
    }
}

struct RegistrationService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let request = request.into_inner();
        let at = Instant::now();
        let generation = self.shared.state.borrow().generation;
        let outcome = self.accept(&request).await;
        let rejected = outcome.as_ref().err().map(|s| s.message().to_string());
        self.shared.state.send_modify(|s| {
            s.registrations.push(RecordedRegistration {
                request,
                generation,
                at,
                rejected,
            })
        });
        outcome.map(|()| Response::new(pb::Empty {}))
    }
}

impl RegistrationService {
    async fn accept(&self, request: &pb::RegisterRequest) -> Result<(), Status> {
        if request.version != rocefabric_kubelet_api::API_VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}; supported: {}",
                request.version,
                rocefabric_kubelet_api::API_VERSION
            )));
        }
        if !is_extended_resource_name(&request.resource_name) {
            return Err(Status::invalid_argument(format!(
                "resource name {:?} is not an extended resource name",
                request.resource_name
            )));
        }
        let endpoint = self.shared.dir.join(&request.endpoint);
        let channel = tokio::time::timeout(DIAL_TIMEOUT, connect(&endpoint))
            .await
            .map_err(|_| Status::unavailable(format!("no answer on {}", endpoint.display())))?
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let resource = request.resource_name.clone();
        let shared = Arc::clone(&self.shared);
        let task = tokio::spawn(watch_plugin(shared, resource.clone(), channel));
        if let Some((_, old)) = self.shared.plugins().insert(resource, (endpoint, task)) {
            old.abort();
        }
        Ok(())
    }
}

/// The kubelet's client side for one registered plugin: options, then `ListAndWatch` until it ends.
async fn watch_plugin(shared: Arc<Shared>, resource: String, channel: Channel) {
    let mut client = DevicePluginClient::new(channel);
    match client.get_device_plugin_options(pb::Empty {}).await {
        Ok(options) => {
            let options = options.into_inner();
            shared.state.send_modify(|s| {
                s.options.insert(resource.clone(), options);
            });
        }
        Err(status) => {
            tracing::warn!(%resource, %status, "emulator: GetDevicePluginOptions failed");
            return;
        }
    }
    let mut stream = match client.list_and_watch(pb::Empty {}).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => {
            tracing::warn!(%resource, %status, "emulator: ListAndWatch failed");
            return;
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(update)) => shared.state.send_modify(|s| {
                s.devices.insert(resource.clone(), update.devices);
                *s.list_updates.entry(resource.clone()).or_default() += 1;
            }),
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(%resource, %status, "emulator: ListAndWatch ended");
                break;
            }
        }
    }
}

/// A Kubernetes extended resource name (`<domain>/<name>` outside `kubernetes.io`), as the
/// kubelet requires of a registration.
pub fn is_extended_resource_name(name: &str) -> bool {
    rocefabric_api::resource_name::check_extended_resource_name(name).is_ok()
}

async fn connect(path: &Path) -> Result<Channel, EmulatorError> {
    let uri = rocefabric_kubelet_api::uds_uri(path).ok_or_else(|| EmulatorError::NonUtf8Path {
        path: path.to_path_buf(),
    })?;
    let connect_err = |source| EmulatorError::Connect {
        path: path.to_path_buf(),
        source,
    };
    Endpoint::from_shared(uri)
        .map_err(connect_err)?
        .connect()
        .await
        .map_err(connect_err)
}

struct RunningServer {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// The emulated kubelet on one plugin directory.
pub struct KubeletEmulator {
    shared: Arc<Shared>,
    socket: PathBuf,
    server: Option<RunningServer>,
}

impl KubeletEmulator {
    /// Serve `Registration` on `<dir>/kubelet.sock` (creating `dir` when missing).
    pub async fn start(dir: &Path) -> Result<Self, EmulatorError> {
        std::fs::create_dir_all(dir).map_err(|source| EmulatorError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: watch::Sender::new(Snapshot::default()),
            plugins: Mutex::new(BTreeMap::new()),
        });
        let socket = dir.join(rocefabric_kubelet_api::KUBELET_SOCKET_NAME);
        let mut emulator = Self {
            shared,
            socket,
            server: None,
        };
        emulator.serve()?;
        Ok(emulator)
    }

    fn serve(&mut self) -> Result<(), EmulatorError> {
        let io_err = |source| EmulatorError::Io {
            path: self.socket.clone(),
            source,
        };
        match std::fs::remove_file(&self.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(&self.socket).map_err(io_err)?;
        let (stop, mut stopping) = watch::channel(false);
        let service = RegistrationServer::new(RegistrationService {
            shared: Arc::clone(&self.shared),
        });
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopping.wait_for(|s| *s).await.map(|_| ());
                }),
        );
        self.server = Some(RunningServer { stop, task });
        Ok(())
    }

    async fn stop_server(&mut self) {
        if let Some(RunningServer { stop, mut task }) = self.server.take() {
            let _ = stop.send(true);
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        self.shared.drop_plugins();
    }

    /// The plugin directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Path of the emulated `kubelet.sock`.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// What the emulator knows now.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.state.borrow().clone()
    }

    /// A receiver that changes on every registration and device list update.
    pub fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.shared.state.subscribe()
    }

    /// Wait until `condition` holds for the emulator's state, at most `timeout`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        condition: impl FnMut(&Snapshot) -> bool,
    ) -> Result<Snapshot, EmulatorError> {
        let mut rx = self.shared.state.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(condition)).await {
            Ok(Ok(snapshot)) => Ok(snapshot.clone()),
            // The sender lives in `self`, so the channel cannot close while we wait.
            Ok(Err(_)) | Err(_) => Err(EmulatorError::Timeout(timeout)),
        }
    }

    /// Wait until every resource in `resources` is registered in the current run and has delivered
    /// a device list.
    pub async fn wait_for_resources(
        &self,
        resources: &[&str],
        timeout: Duration,
    ) -> Result<Snapshot, EmulatorError> {
        self.wait_until(timeout, |s| {
            let registered = s.registered();
            resources
                .iter()
                .all(|r| registered.contains_key(r) && s.devices.contains_key(*r))
        })
        .await
    }

    /// Wait until the device list of `resource` satisfies `condition`.
    pub async fn wait_for_devices(
        &self,
        resource: &str,
        timeout: Duration,
        mut condition: impl FnMut(&[pb::Device]) -> bool,
    ) -> Result<Vec<pb::Device>, EmulatorError> {
        let snapshot = self
            .wait_until(timeout, |s| {
                s.devices_of(resource).is_some_and(&mut condition)
            })
            .await?;
        Ok(snapshot
            .devices_of(resource)
            .map(<[_]>::to_vec)
            .unwrap_or_default())
    }

    /// A client connected to the endpoint `resource` registered, as the kubelet uses it.
    pub async fn client(
        &self,
        resource: &str,
    ) -> Result<DevicePluginClient<Channel>, EmulatorError> {
        let endpoint = self
            .shared
            .plugins()
            .get(resource)
            .map(|(path, _)| path.clone())
            .ok_or_else(|| EmulatorError::NotRegistered(resource.to_string()))?;
        Ok(DevicePluginClient::new(connect(&endpoint).await?))
    }

    /// `Allocate` one container with `device_ids` of `resource`.
    pub async fn allocate(
        &self,
        resource: &str,
        device_ids: &[&str],
    ) -> Result<pb::ContainerAllocateResponse, EmulatorError> {
        let request = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: device_ids.iter().map(|s| (*s).to_string()).collect(),
            }],
        };
        let response = self
            .client(resource)
            .await?
            .allocate(request)
            .await
            .map_err(Box::new)?;
        response
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .ok_or_else(|| {
                Box::new(Status::internal("Allocate returned no container response")).into()
            })
    }

    /// `GetPreferredAllocation` for one container.
    pub async fn preferred_allocation(
        &self,
        resource: &str,
        available: &[&str],
        must_include: &[&str],
        size: i32,
    ) -> Result<Vec<String>, EmulatorError> {
        let owned = |ids: &[&str]| ids.iter().map(|s| (*s).to_string()).collect();
        let request = pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: owned(available),
                must_include_device_i_ds: owned(must_include),
                allocation_size: size,
            }],
        };
        let response = self
            .client(resource)
            .await?
            .get_preferred_allocation(request)
            .await
            .map_err(Box::new)?;
        Ok(response
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }

    /// What a kubelet restart does: stop serving, drop every plugin connection, delete every
    /// socket in the directory (the plugins' too), and serve a new `kubelet.sock`.
    pub async fn restart(&mut self) -> Result<(), EmulatorError> {
        use std::os::unix::fs::FileTypeExt;
        self.stop_server().await;
        let dir = self.shared.dir.clone();
        let io_err = |source| EmulatorError::Io {
            path: dir.clone(),
            source,
        };
        for entry in std::fs::read_dir(&dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            if entry.file_type().map_err(io_err)?.is_socket() {
                match std::fs::remove_file(entry.path()) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
                    _ => {}
                }
            }
        }
        self.shared.state.send_modify(|s| {
            s.generation += 1;
            s.options.clear();
            s.devices.clear();
            s.list_updates.clear();
        });
        self.serve()
    }

    /// Stop serving and remove `kubelet.sock`.
    pub async fn stop(mut self) {
        self.stop_server().await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for KubeletEmulator {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.task.abort();
        }
        self.shared.drop_plugins();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        for ok in [
            "rdma/hca",
            "rdma/gpu-hca",
            "nvidia.com/gpu",
            "example.com/foo.bar_1",
        ] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "cpu",
            "kubernetes.io/foo",
            "x.kubernetes.io/foo",
            "/hca",
            "rdma/",
            "RDMA/hca",
            "rdma/-x",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }
}
