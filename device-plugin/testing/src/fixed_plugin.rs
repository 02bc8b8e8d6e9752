//! A device plugin over a fixed device list: the backend of the gRPC layer's tests, and, registered
//! with a real kubelet, a stand-in for another vendor's plugin beside ours (NVIDIA's
//! `nvidia.com/gpu`), so a test can show that a GPU it gave a pod never goes to a DRA claim too.

use std::path::Path;
use std::sync::Arc;

use rocefabric_kubelet_api::device_plugin::{BackendError, DeviceBackend, PluginServer};
use rocefabric_kubelet_api::registration::{register, register_request};
use rocefabric_kubelet_api::{device, pb};
use tokio::sync::watch;

/// Serves `ids` (healthy, on NUMA node `numa`) as `resource`; `Allocate` answers the granted IDs,
/// comma-separated, in the environment variable `env` (as NVIDIA's plugin does with
/// `NVIDIA_VISIBLE_DEVICES` in its default strategy).
pub struct FixedBackend {
    resource: String,
    env: String,
    devices: watch::Sender<Vec<pb::Device>>,
}

impl FixedBackend {
    pub fn new(resource: &str, ids: &[&str], numa: Option<u32>, env: &str) -> Arc<Self> {
        let list = ids.iter().map(|id| device(*id, true, numa)).collect();
        Arc::new(Self {
            resource: resource.to_string(),
            env: env.to_string(),
            devices: watch::Sender::new(list),
        })
    }

    /// Change the device list (health, membership), as hardware would; `ListAndWatch` streams
    /// the new list.
    pub fn update(&self, change: impl FnOnce(&mut Vec<pb::Device>)) {
        self.devices.send_modify(change);
    }
}

impl DeviceBackend for FixedBackend {
    fn resource_name(&self) -> &str {
        &self.resource
    }

    fn devices(&self) -> watch::Receiver<Vec<pb::Device>> {
        self.devices.subscribe()
    }

    /// Every `must_include`, then the first of `available` up to `size`.
    fn preferred_allocation(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, BackendError> {
        let mut out = must_include.to_vec();
        out.extend(
            available
                .iter()
                .filter(|id| !must_include.contains(id))
                .cloned(),
        );
        out.truncate(size.max(must_include.len()));
        Ok(out)
    }

    fn allocate(&self, ids: &[String]) -> Result<pb::ContainerAllocateResponse, BackendError> {
        let known = self.devices.borrow();
        if let Some(id) = ids.iter().find(|id| !known.iter().any(|d| &d.id == *id)) {
            return Err(BackendError::UnknownDevice {
                resource: self.resource.clone(),
                id: id.clone(),
            });
        }
        let mut response = pb::ContainerAllocateResponse::default();
        response.envs.insert(self.env.clone(), ids.join(","));
        Ok(response)
    }
}

/// Another vendor's plugin registered with a real kubelet; stop it with [`ForeignPlugin::stop`].
pub struct ForeignPlugin {
    server: PluginServer,
}

impl ForeignPlugin {
    /// Serve `backend` on `<plugin_dir>/<socket_name>` and register it with the kubelet's
    /// `<plugin_dir>/kubelet.sock`.
    pub async fn start(
        plugin_dir: &Path,
        socket_name: &str,
        backend: Arc<FixedBackend>,
    ) -> Result<ForeignPlugin, String> {
        let resource = backend.resource.clone();
        let server = PluginServer::start(&plugin_dir.join(socket_name), backend)
            .await
            .map_err(|e| format!("{resource} plugin: {e}"))?;
        if let Err(e) = register(
            &plugin_dir.join("kubelet.sock"),
            register_request(&resource, socket_name),
        )
        .await
        {
            server.stop().await;
            return Err(format!("register {resource}: {e}"));
        }
        Ok(ForeignPlugin { server })
    }

    /// Stop serving (the kubelet then reports the resource's devices unhealthy).
    pub async fn stop(self) {
        self.server.stop().await;
    }
}
