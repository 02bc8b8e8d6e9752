//! The kubelet's gRPC APIs, as the node daemon serves and calls them, with no device logic:
//!
//! - [`pb`] and the other `pb_*` modules: the generated protobuf types, clients and servers
//!   (compiled into `OUT_DIR` by `build.rs` from `proto/`): the device plugin API v1beta1, plugin
//!   registration, the DRA plugin API (v1, v1beta1) and pod resources;
//! - [`socket`]: ONE way to serve a gRPC router on a unix socket (through the `:authority` front,
//!   so grpcurl and every gRPC stack get in) and to tell whether the socket is still ours;
//! - [`device_plugin`]: one tonic `DevicePlugin` server per resource over the
//!   [`device_plugin::DeviceBackend`] trait;
//! - [`registration`]: `Register` with the kubelet, with backoff;
//! - [`watcher`]: inotify on the plugin directory, so a kubelet restart (a new `kubelet.sock`) or
//!   the loss of one of our sockets triggers re-registration at once;
//! - [`dra`]: the DRA service and plugin registration over the [`dra::Preparer`] trait;
//! - [`pod_resources`]: the kubelet's pod resources API (List).

pub mod device_plugin;
pub mod dra;
pub mod pod_resources;
pub mod registration;
pub mod socket;
pub mod watcher;

use std::path::{Path, PathBuf};

/// Generated code of the device plugin API `v1beta1`.
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb {
    tonic::include_proto!("v1beta1");
}

/// Generated code of the kubelet DRA API v1.
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb_dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Generated code of the kubelet DRA API v1beta1 (the same messages under another package).
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb_dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Generated code of the kubelet plugin registration API.
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb_plugin_registration {
    tonic::include_proto!("pluginregistration");
}

/// Generated code of the kubelet pod resources API (List only).
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb_pod_resources {
    tonic::include_proto!("v1");
}

/// API version sent in `RegisterRequest.version`.
pub const API_VERSION: &str = "v1beta1";
/// File name of the kubelet's registration socket in the plugin directory.
pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";
/// Default device plugin directory of the kubelet.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Prefix of every socket this daemon creates in the plugin directory; files with this prefix and
/// the `.sock` suffix are ours, and stale ones are removed at start.
pub const SOCKET_PREFIX: &str = "rocefabric-";

/// Socket file name of a resource: `rdma/hca` -> `rocefabric-rdma_hca.sock`. Every character
/// outside `[A-Za-z0-9._-]` becomes `_`.
pub fn socket_file_name(resource_name: &str) -> String {
    let safe: String = resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{SOCKET_PREFIX}{safe}.sock")
}

/// Whether a file name in the plugin directory is one of this daemon's sockets.
pub fn is_own_socket_name(file_name: &str) -> bool {
    file_name.starts_with(SOCKET_PREFIX) && file_name.ends_with(".sock")
}

/// Remove this daemon's sockets left in `plugin_dir` by an earlier run (any file named
/// `rocefabric-*.sock` that is a socket). Returns the paths removed.
pub fn remove_stale_sockets(plugin_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::FileTypeExt;
    let mut removed = Vec::new();
    let entries = match std::fs::read_dir(plugin_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_own_socket_name(name) || !entry.file_type()?.is_socket() {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed.push(entry.path()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// A unix socket path as the `unix:` URI tonic dials.
pub fn uds_uri(path: &Path) -> Option<String> {
    path.to_str().map(|p| format!("unix:{p}"))
}

/// `Device.health` of a device the kubelet may hand out.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device the kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";

/// A kubelet `Device` with NUMA topology when known.
pub fn device(id: impl Into<String>, healthy: bool, numa: Option<u32>) -> pb::Device {
    pb::Device {
        id: id.into(),
        health: if healthy { HEALTHY } else { UNHEALTHY }.to_string(),
        topology: numa.map(|n| pb::TopologyInfo {
            nodes: vec![pb::NumaNode { id: i64::from(n) }],
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn socket_names_are_flat_and_recognisable() {
        assert_eq!(socket_file_name("rdma/hca"), "rocefabric-rdma_hca.sock");
        assert_eq!(
            socket_file_name("rdma/gpu-hca"),
            "rocefabric-rdma_gpu-hca.sock"
        );
        assert_eq!(
            socket_file_name("nvidia.com/gpu"),
            "rocefabric-nvidia.com_gpu.sock"
        );
        assert!(is_own_socket_name(&socket_file_name("rdma/hca")));
        assert!(!is_own_socket_name(KUBELET_SOCKET_NAME));
        assert!(!is_own_socket_name("nvidia-gpu.sock"));
    }

    #[test]
    fn device_carries_numa_only_when_known() {
        let d = device("0000:18:00.0", true, Some(1));
        assert_eq!(d.health, "Healthy");
        assert_eq!(d.topology.map(|t| t.nodes[0].id), Some(1));
        let d = device("x", false, None);
        assert_eq!(d.health, "Unhealthy");
        assert!(d.topology.is_none());
    }

    #[test]
    fn remove_stale_sockets_removes_only_our_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join(socket_file_name("rdma/hca"));
        let theirs = dir.path().join("nvidia-gpu.sock");
        let plain = dir.path().join("rocefabric-notes.sock");
        let _a = std::os::unix::net::UnixListener::bind(&ours).unwrap();
        let _b = std::os::unix::net::UnixListener::bind(&theirs).unwrap();
        std::fs::write(&plain, b"not a socket").unwrap();
        let removed = remove_stale_sockets(dir.path()).unwrap();
        assert_eq!(removed, vec![ours.clone()]);
        assert!(!ours.exists());
        assert!(theirs.exists());
        assert!(
            plain.exists(),
            "a regular file with our prefix is not a socket of ours"
        );
    }
}
