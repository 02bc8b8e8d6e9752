//! Watch the plugin directory with inotify (through `notify`): a new `kubelet.sock` means the
//! kubelet restarted and every resource must re-register; one of our sockets disappearing means
//! someone (usually a restarting kubelet) removed it and that server must be brought back.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Something that happened in the watched directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirEvent {
    /// `kubelet.sock` was created (or moved into place): the kubelet (re)started.
    KubeletSocketCreated,
    /// A socket of ours (file name `rocefabric-*.sock`) was removed or moved away.
    OwnSocketRemoved(String),
}

/// Failure to set up the directory watch.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("failed to create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to watch {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// An inotify watch on the plugin directory (and on the kubelet socket's directory when that is
/// elsewhere). Dropping it stops watching.
pub struct DirWatcher {
    _watcher: RecommendedWatcher,
    events: mpsc::UnboundedReceiver<DirEvent>,
}

impl DirWatcher {
    /// Watch `plugin_dir` for removal of our sockets and the kubelet socket's directory for the
    /// creation of `kubelet_socket`. Creates `plugin_dir` when missing.
    pub fn start(plugin_dir: &Path, kubelet_socket: &Path) -> Result<Self, WatchError> {
        std::fs::create_dir_all(plugin_dir).map_err(|source| WatchError::CreateDir {
            path: plugin_dir.to_path_buf(),
            source,
        })?;
        let kubelet_dir = kubelet_socket.parent().unwrap_or(plugin_dir).to_path_buf();
        let kubelet_name = kubelet_socket.file_name().map(|n| n.to_os_string());
        let plugin_dir_owned = plugin_dir.to_path_buf();
        let (tx, events) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |result: notify::Result<Event>| {
            match result {
                Ok(event) => {
                    for e in classify(
                        &event,
                        &plugin_dir_owned,
                        &kubelet_dir,
                        kubelet_name.as_deref(),
                    ) {
                        // The receiver is gone only when the watcher is being dropped.
                        let _ = tx.send(e);
                    }
                }
                Err(error) => tracing::warn!(%error, "plugin directory watch error"),
            }
        })
        .map_err(|source| WatchError::Watch {
            path: plugin_dir.to_path_buf(),
            source,
        })?;
        let mut dirs = BTreeSet::new();
        dirs.insert(plugin_dir.to_path_buf());
        if let Some(parent) = kubelet_socket.parent() {
            dirs.insert(parent.to_path_buf());
        }
        for dir in dirs {
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|source| WatchError::Watch {
                    path: dir.clone(),
                    source,
                })?;
        }
        Ok(Self {
            _watcher: watcher,
            events,
        })
    }

    /// The next event; `None` only if the watch ended.
    pub async fn next(&mut self) -> Option<DirEvent> {
        self.events.recv().await
    }

    /// An event already queued, without waiting.
    pub fn try_next(&mut self) -> Option<DirEvent> {
        self.events.try_recv().ok()
    }
}

/// Turn one notify event into the events we act on.
fn classify(
    event: &Event,
    plugin_dir: &Path,
    kubelet_dir: &Path,
    kubelet_name: Option<&std::ffi::OsStr>,
) -> Vec<DirEvent> {
    let created = matches!(
        event.kind,
        EventKind::Create(CreateKind::File | CreateKind::Any | CreateKind::Other)
            | EventKind::Modify(ModifyKind::Name(RenameMode::To))
    );
    let removed = matches!(
        event.kind,
        EventKind::Remove(RemoveKind::File | RemoveKind::Any | RemoveKind::Other)
            | EventKind::Modify(ModifyKind::Name(RenameMode::From))
    );
    let mut out = Vec::new();
    for path in &event.paths {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            continue;
        };
        if created && parent == kubelet_dir && Some(name) == kubelet_name {
            out.push(DirEvent::KubeletSocketCreated);
        } else if removed
            && parent == plugin_dir
            && let Some(name) = name.to_str().filter(|n| super::is_own_socket_name(n))
        {
            out.push(DirEvent::OwnSocketRemoved(name.to_string()));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn classifies_kubelet_socket_creation_and_own_socket_removal() {
        let dir = Path::new("/p");
        let name = Some(std::ffi::OsStr::new("kubelet.sock"));
        let c = |kind, path| classify(&event(kind, path), dir, dir, name);
        assert_eq!(
            c(EventKind::Create(CreateKind::File), "/p/kubelet.sock"),
            vec![DirEvent::KubeletSocketCreated]
        );
        assert_eq!(
            c(
                EventKind::Remove(RemoveKind::File),
                "/p/rocefabric-rdma_hca.sock"
            ),
            vec![DirEvent::OwnSocketRemoved(
                "rocefabric-rdma_hca.sock".into()
            )]
        );
        assert!(c(EventKind::Remove(RemoveKind::File), "/p/kubelet.sock").is_empty());
        assert!(
            c(
                EventKind::Create(CreateKind::File),
                "/p/rocefabric-rdma_hca.sock"
            )
            .is_empty()
        );
        assert!(c(EventKind::Remove(RemoveKind::File), "/p/nvidia-gpu.sock").is_empty());
        assert!(
            c(
                EventKind::Create(CreateKind::File),
                "/elsewhere/kubelet.sock"
            )
            .is_empty()
        );
    }

    #[tokio::test]
    async fn reports_kubelet_socket_creation_from_inotify() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet.sock");
        let mut watcher = DirWatcher::start(dir.path(), &kubelet).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&kubelet).unwrap();
        let event = tokio::time::timeout(std::time::Duration::from_secs(5), watcher.next())
            .await
            .unwrap();
        assert_eq!(event, Some(DirEvent::KubeletSocketCreated));
    }
}
