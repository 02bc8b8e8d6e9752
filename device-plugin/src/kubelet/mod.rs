//! The kubelet-facing I/O shell: the device plugin API v1beta1 over gRPC on unix sockets.
//!
//! - [`pb`]: the generated protobuf types, clients and servers (compiled into `OUT_DIR` by
//!   `build.rs` from `proto/deviceplugin/v1beta1/api.proto`).
//! - [`server`]: one tonic `DevicePlugin` server per resource, each on its own socket, over the
//!   [`server::DeviceBackend`] trait (no device logic lives here).
//! - [`authority`]: the front between each socket and its server that lets clients which send the
//!   socket path as `:authority` (grpcurl, grpcio, grpc-java) through.
//! - [`registration`]: `Register` with the kubelet, with backoff.
//! - [`watcher`]: inotify on the plugin directory, so a kubelet restart (a new `kubelet.sock`) or the
//!   loss of one of our sockets triggers re-registration at once.
//! - [`emulator`]: a kubelet emulator (Registration server plus the kubelet's client side), used by
//!   the tests, the benchmark, e2e and the README demo.

pub mod authority;
pub mod emulator;
pub mod registration;
pub mod server;
pub mod watcher;

use std::path::{Path, PathBuf};

/// Generated code of the `v1beta1` protobuf package.
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb {
    tonic::include_proto!("v1beta1");
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

/// A kubelet `Device` with NUMA topology when known.
pub fn device(
    id: impl Into<String>,
    health: crate::model::Health,
    numa: Option<u32>,
) -> pb::Device {
    pb::Device {
        id: id.into(),
        health: health.as_str().to_string(),
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
        let d = device("0000:18:00.0", crate::model::Health::Healthy, Some(1));
        assert_eq!(d.health, "Healthy");
        assert_eq!(d.topology.map(|t| t.nodes[0].id), Some(1));
        let d = device("x", crate::model::Health::Unhealthy, None);
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
