//! The supervisor of the device plugin servers: one [`PluginServer`] per resource, started,
//! registered with the kubelet, and brought back (with backoff) when its socket is lost or the
//! kubelet restarts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use rocefabric_kubelet_api::device_plugin::{DeviceBackend, PluginServer};
use rocefabric_kubelet_api::registration::{self, Backoff};
use rocefabric_kubelet_api::watcher::{DirEvent, DirWatcher};

use rocefabric_kubelet_api::socket::inode;

use super::publish::{Publisher, ResourceBackend};
use super::{ServeError, ServeMetrics, ServeOptions};

/// One resource under supervision.
pub(super) struct Managed {
    pub(super) backend: Arc<ResourceBackend>,
    pub(super) socket_name: String,
    pub(super) socket_path: PathBuf,
    pub(super) server: Option<PluginServer>,
    pub(super) registration: Option<JoinHandle<u32>>,
    /// Since when this resource has been without an accepted registration (serving or not);
    /// cleared only when a registration succeeds.
    pub(super) registering_since: Option<Instant>,
    pub(super) failures: u32,
    pub(super) retry_at: Option<Instant>,
}

impl Managed {
    pub(super) fn name(&self) -> &str {
        self.backend.resource_name()
    }

    /// Whether our server runs and its socket is still the one it bound.
    pub(super) fn intact(&self) -> bool {
        self.server.as_ref().is_some_and(PluginServer::intact)
    }
}

pub(super) struct Supervisor {
    pub(super) kubelet_socket: PathBuf,
    pub(super) backoff: Backoff,
    pub(super) start_attempts: u32,
    /// Set when a resource used up its start attempts: `run` ends with it.
    pub(super) gave_up: Option<ServeError>,
    pub(super) metrics: Arc<ServeMetrics>,
    pub(super) resources: Vec<Managed>,
}

/// The kubelet's registration socket, and its inode when last seen: a new inode is a restart.
pub(super) struct KubeletSocket {
    path: PathBuf,
    ino: Option<u64>,
}

impl KubeletSocket {
    pub(super) fn new(path: &std::path::Path) -> Self {
        Self {
            path: path.to_path_buf(),
            ino: inode(path),
        }
    }

    /// Whether the socket was created again since the last look.
    fn restarted(&mut self) -> bool {
        let now = inode(&self.path);
        let restarted = now.is_some() && now != self.ino;
        self.ino = now;
        restarted
    }
}

impl Supervisor {
    /// One managed resource per device list of `publisher`, none started yet.
    pub(super) fn new(options: &ServeOptions, publisher: &Publisher) -> Self {
        let resources = publisher
            .lists
            .iter()
            .map(|list| {
                let backend = publisher.backend(list, &options.dev_root, &options.host_dev_root);
                let socket_name = rocefabric_kubelet_api::socket_file_name(backend.resource_name());
                Managed {
                    backend,
                    socket_path: options.plugin_dir.join(&socket_name),
                    socket_name,
                    server: None,
                    registration: None,
                    registering_since: None,
                    failures: 0,
                    retry_at: None,
                }
            })
            .collect();
        Self {
            kubelet_socket: options.kubelet_socket.clone(),
            backoff: options.registration_backoff,
            start_attempts: options.start_attempts,
            gave_up: None,
            metrics: Arc::clone(&options.metrics),
            resources,
        }
    }

    /// Start (and register) every resource.
    pub(super) async fn start_all(&mut self) {
        for i in 0..self.resources.len() {
            self.start(i).await;
        }
    }

    /// Handle `first` and every event already queued behind it: a kubelet restart deletes our
    /// sockets and then creates kubelet.sock, and one pass should handle it all.
    pub(super) async fn on_dir_events(
        &mut self,
        first: DirEvent,
        watcher: &mut DirWatcher,
        kubelet: &mut KubeletSocket,
    ) {
        let mut kubelet_restarted = false;
        let mut removed = Vec::new();
        for e in std::iter::once(first).chain(std::iter::from_fn(|| watcher.try_next())) {
            match e {
                DirEvent::KubeletSocketCreated => kubelet_restarted = true,
                DirEvent::OwnSocketRemoved(name) => removed.push(name),
            }
        }
        if kubelet_restarted {
            kubelet.ino = inode(&kubelet.path);
            tracing::info!(socket = %kubelet.path.display(), "kubelet socket created");
        }
        self.handle(kubelet_restarted, &removed).await;
    }

    /// The slow check behind inotify: a kubelet restart or a lost socket it did not report, and
    /// a resource unregistered for longer than `exit_after` (the error to exit with).
    pub(super) async fn liveness_check(
        &mut self,
        kubelet: &mut KubeletSocket,
        exit_after: Option<Duration>,
    ) -> Option<ServeError> {
        let kubelet_restarted = kubelet.restarted();
        let broken: Vec<String> = self
            .resources
            .iter()
            .filter(|m| m.retry_at.is_none() && !m.intact())
            .map(|m| m.socket_name.clone())
            .collect();
        if kubelet_restarted || !broken.is_empty() {
            tracing::warn!(
                kubelet_restarted,
                ?broken,
                "liveness check found a change inotify did not report"
            );
            self.handle(kubelet_restarted, &broken).await;
        }
        let (resource, waited) =
            exit_after.and_then(|limit| self.unregistered_longer_than(limit))?;
        Some(ServeError::Unregistered {
            resource,
            kubelet_socket: self.kubelet_socket.clone(),
            waited,
        })
    }
    /// (Re)start a resource's server and, once it serves, register it.
    pub(super) async fn start(&mut self, i: usize) {
        let m = &mut self.resources[i];
        if let Some(task) = m.registration.take() {
            if task.is_finished() {
                m.registering_since = None;
            }
            task.abort();
        }
        if let Some(server) = m.server.take() {
            server.stop().await;
        }
        match PluginServer::start(&m.socket_path, Arc::clone(&m.backend)).await {
            Ok(server) => {
                m.server = Some(server);
                m.failures = 0;
                m.retry_at = None;
                self.register(i);
            }
            Err(error) => {
                // A socket that cannot be bound (the plugin directory is gone) is unregistered too.
                m.registering_since.get_or_insert_with(Instant::now);
                m.failures = m.failures.saturating_add(1);
                if m.failures >= self.start_attempts {
                    self.gave_up.get_or_insert(ServeError::Start {
                        resource: m.name().to_string(),
                        attempts: m.failures,
                        source: error,
                    });
                    m.retry_at = None;
                    return;
                }
                let delay = self.backoff.delay(m.failures);
                tracing::error!(resource = %m.name(), %error, retry_in = ?delay,
                    "failed to start device plugin server");
                m.retry_at = Some(Instant::now() + delay);
            }
        }
    }

    /// (Re)register a serving resource in the background, retrying with backoff.
    pub(super) fn register(&mut self, i: usize) {
        let m = &mut self.resources[i];
        if m.server.is_none() {
            return;
        }
        if let Some(task) = m.registration.take() {
            if task.is_finished() {
                // It succeeded (registration retries until it does): a new one starts the clock.
                m.registering_since = None;
            }
            task.abort();
        }
        // A registration still trying (or a server that failed to start) keeps its start: churn
        // must not postpone the exit.
        m.registering_since.get_or_insert_with(Instant::now);
        let request = registration::register_request(m.name(), &m.socket_name);
        let kubelet_socket = self.kubelet_socket.clone();
        let backoff = self.backoff;
        let metrics = Arc::clone(&self.metrics);
        m.registration = Some(tokio::spawn(async move {
            let resource = request.resource_name.clone();
            registration::register_with_backoff(&kubelet_socket, request, backoff, |outcome| {
                let result = outcome.map_or_else(|e| e.metric_label(), |()| "success");
                let labels = ServeMetrics::labels(&resource, "result", result);
                metrics.registrations.get_or_create(&labels).inc();
            })
            .await
        }));
    }

    /// React to directory events (already merged).
    pub(super) async fn handle(&mut self, kubelet_restarted: bool, removed: &[String]) {
        if kubelet_restarted {
            self.metrics.kubelet_restarts.inc();
        }
        for i in 0..self.resources.len() {
            let m = &self.resources[i];
            let hit = removed.contains(&m.socket_name);
            if (kubelet_restarted || hit) && !m.intact() {
                tracing::info!(resource = %m.name(), kubelet_restarted, "socket gone; restarting server");
                self.start(i).await;
            } else if kubelet_restarted {
                tracing::info!(resource = %m.name(), "kubelet restarted; registering again");
                self.register(i);
            }
        }
    }

    /// A resource whose registration has been trying for longer than `limit`, and for how long.
    pub(super) fn unregistered_longer_than(
        &mut self,
        limit: Duration,
    ) -> Option<(String, Duration)> {
        let now = Instant::now();
        for m in &mut self.resources {
            if m.registration.as_ref().is_some_and(JoinHandle::is_finished) {
                m.registering_since = None;
            }
            if let Some(since) = m.registering_since
                && now.duration_since(since) >= limit
            {
                return Some((m.name().to_string(), now.duration_since(since)));
            }
        }
        None
    }

    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.resources.iter().filter_map(|m| m.retry_at).min()
    }

    pub(super) async fn retry_due(&mut self) {
        let now = Instant::now();
        for i in 0..self.resources.len() {
            if self.resources[i].retry_at.is_some_and(|t| t <= now) {
                self.start(i).await;
            }
        }
    }

    pub(super) async fn shutdown(&mut self) {
        for m in &mut self.resources {
            if let Some(task) = m.registration.take() {
                task.abort();
            }
            if let Some(server) = m.server.take() {
                server.stop().await;
            }
        }
    }
}

/// The watcher's next event; never completes without a watcher.
pub(super) async fn next_event(watcher: &mut Option<DirWatcher>) -> Option<DirEvent> {
    match watcher {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// Sleep until `deadline`; never completes without one.
pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
