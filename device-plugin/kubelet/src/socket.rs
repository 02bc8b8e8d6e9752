//! One way to serve gRPC on a unix socket, for every socket the node daemon serves to the kubelet
//! (a device plugin resource, the DRA service, plugin registration), and one way to tell whether
//! the socket file is still ours.
//!
//! Clients reach the server through the `:authority` front (`rocefabric-h2-authority`), over
//! in-memory pipes, so grpcurl, grpcio and grpc-java get in as well as the kubelet.
//!
//! Who may cross: whoever can open the socket file, which the host directory (the kubelet's,
//! root-owned) decides; the daemon serves nothing else there.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

/// How long [`SocketServer::stop`] waits for in-flight calls before aborting the server task.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Accepted connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 16;

/// Failure to bind a socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot remove old socket {path}: {source}")]
    RemoveSocket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A gRPC server on one unix socket, with its own stop switch.
pub struct SocketServer {
    socket: PathBuf,
    /// Inode of the socket file we bound, to tell our socket from a replacement.
    ino: Option<u64>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl std::fmt::Debug for SocketServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketServer")
            .field("socket", &self.socket)
            .field("ino", &self.ino)
            .finish_non_exhaustive()
    }
}

/// Bind `socket` (replacing a file already there, creating its directory) and serve the router
/// that `router` builds on it until [`SocketServer::stop`]. `router` receives the stop signal, for
/// services whose streams must end with the server (`ListAndWatch`).
pub fn serve(
    socket: &Path,
    span: tracing::Span,
    router: impl FnOnce(watch::Receiver<bool>) -> tonic::transport::server::Router,
) -> Result<SocketServer, SocketError> {
    remove_socket_file(socket).map_err(|source| SocketError::RemoveSocket {
        path: socket.to_path_buf(),
        source,
    })?;
    let bind = |source| SocketError::Bind {
        path: socket.to_path_buf(),
        source,
    };
    if let Some(dir) = socket.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        std::fs::create_dir_all(dir).map_err(bind)?;
    }
    let listener = UnixListener::bind(socket).map_err(bind)?;
    let (stop, stopping) = watch::channel(false);
    let mut signal = stopping.clone();
    let (conns, incoming) = mpsc::channel(ACCEPT_QUEUE);
    let incoming = ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    let serve = router(stopping).serve_with_incoming_shutdown(incoming, async move {
        // An error means the sender is gone: stop as well.
        let _ = signal.wait_for(|stop| *stop).await;
    });
    let task = tokio::spawn(
        async move {
            // The accept loop never ends by itself; it drives the fronts until the server is
            // done (graceful shutdown included), and dropping it ends any left.
            tokio::select! {
                result = serve => result,
                never = rocefabric_h2_authority::accept(listener, conns) => match never {},
            }
        }
        .instrument(span),
    );
    Ok(SocketServer {
        ino: inode(socket),
        socket: socket.to_path_buf(),
        stop,
        task,
    })
}

impl SocketServer {
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the server task is still running.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Whether the server runs and the file at its path is still the socket it bound (a kubelet
    /// restart or a cleanup may have removed or replaced it).
    pub fn intact(&self) -> bool {
        self.is_running() && self.ino.is_some() && inode(&self.socket) == self.ino
    }

    /// Stop serving: end open streams, wait briefly for in-flight calls, remove the socket file.
    pub async fn stop(self) {
        let Self {
            socket,
            stop,
            mut task,
            ..
        } = self;
        // Receivers may all be gone already when the server task ended; nothing to signal then.
        let _ = stop.send(true);
        let shown = socket.display();
        match tokio::time::timeout(STOP_TIMEOUT, &mut task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => {
                tracing::warn!(socket = %shown, %error, "server ended with an error")
            }
            Ok(Err(error)) => tracing::warn!(socket = %shown, %error, "server task failed"),
            Err(_) => {
                tracing::warn!(socket = %shown, "server did not stop in time; aborting it");
                task.abort();
            }
        }
        if let Err(error) = remove_socket_file(&socket) {
            tracing::warn!(socket = %shown, %error, "failed to remove socket");
        }
    }
}

/// The inode of the file at `path`, if there is one.
pub fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Remove a file if it exists. Look first: on a read-only file system `unlink` fails (EROFS) even
/// when there is nothing to remove, which would hide the real problem; when nothing can be seen
/// there, creating the socket reports it.
pub fn remove_socket_file(path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    /// A router with the registration service: something to serve.
    fn router(_stop: watch::Receiver<bool>) -> tonic::transport::server::Router {
        let (tx, _rx) = watch::channel(None);
        let service = crate::dra::RegistrationService::new("test", Path::new("/nowhere"), tx);
        tonic::transport::Server::builder().add_service(
            crate::pb_plugin_registration::registration_server::RegistrationServer::new(service),
        )
    }

    #[tokio::test]
    async fn a_replaced_or_removed_socket_is_no_longer_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/s.sock");
        let server = serve(&path, tracing::Span::none(), router).unwrap();
        assert!(server.intact(), "freshly bound");
        std::fs::remove_file(&path).unwrap();
        assert!(!server.intact(), "removed");
        let _other = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(!server.intact(), "replaced by someone else's socket");
        server.stop().await;
        assert!(!path.exists(), "stop removes the socket file");
    }
}
