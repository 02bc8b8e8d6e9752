//! An in-process Kubernetes API server for the scale harness: TLS on 127.0.0.1 with a certificate
//! made at start, HTTP/2 or HTTP/1.1 by ALPN as kube-apiserver does ([`tls`]), no auth, serving the generated cluster (see [`crate::scale::cluster`]) to the real operator binary.
//!
//! Built for size: pods and nodes are generated on read from one small record each, lists are
//! paged (`limit`/`continue`) or streamed, watches are chunked JSON lines served from a change
//! log, and `labelSelector` holds for lists and watches (an object that stops matching is
//! DELETED for that watch, one that starts is ADDED). The objects the operator writes are kept
//! as JSON text. Node agents and the scheduler are simulated: a RoceNode applied with a
//! non-pending spec reports its QoS applied shortly after, and a pod whose last gate goes is
//! bound to a node and running shortly after.
//!
//! The harness drives the cluster through [`ApiServer`] (add pods, change labels) and observes
//! it (when a write on an object arrived, a census of the rollout and regions).

mod changes;
mod generated;
mod http;
mod read;
mod simulate;
mod tls;
mod watch;

use base64::Engine as _;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use tokio::sync::{oneshot, watch as tokio_watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use crate::api::resource::Resource;
use crate::api::resource::Target;
use crate::api::store::Store;
use crate::scale::cluster::{self, GeneratedCluster, NodeState, PodState};
use changes::{Change, ChangeLog, ChangeType};
use generated::{Nodes, Pods};

/// Knobs of the server.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long a simulated agent takes to report a RoceNode, and the scheduler to bind a pod.
    pub react_after: Duration,
    /// Bytes of watch history kept (older resourceVersions answer 410 Gone).
    pub history_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            react_after: Duration::from_millis(20),
            history_bytes: 128 << 20,
        }
    }
}

/// Where the rollout and the regions stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub roce_nodes: usize,
    /// RoceNodes whose agent reported the spec's generation applied.
    pub configured: usize,
    /// Of those, the ones at the fabric's current generation (a rollout's progress).
    pub configured_current: usize,
    /// RoceNodes holding a pending (placeholder) spec.
    pub pending: usize,
    pub fabric_pods: usize,
    pub annotated: usize,
    pub gated: usize,
    /// Namespaces with a live fabric pod.
    pub fabric_namespaces: usize,
    pub region_directories: usize,
}

/// Requests by verb and resource, and when the operator's first write came.
#[derive(Debug, Default)]
struct Seen {
    first_write: Option<Instant>,
    requests: BTreeMap<(&'static str, Resource), u64>,
    waiters: HashMap<(Resource, String, String), Vec<oneshot::Sender<Instant>>>,
}

/// Everything behind the lock.
pub(crate) struct State {
    cluster: GeneratedCluster,
    rv: u64,
    pods: Pods,
    nodes: Nodes,
    objects: Store,
    log: ChangeLog,
    latest: tokio_watch::Sender<u64>,
    seen: Seen,
    sim: simulate::Queue,
    /// RoceNodes by what their status says, kept on every write (a census reads no JSON):
    /// configured ones with the fabric generation they report.
    configured: HashMap<String, i64>,
    /// The fabric's `metadata.generation`.
    fabric_generation: i64,
    pending: HashSet<String>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    latest: tokio_watch::Receiver<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere already fails the run; the state itself stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Log `change` (made at the current resourceVersion) and tell the watches.
    fn emit(&mut self, change: Change) {
        let rv = change.rv;
        self.log.push(change);
        self.latest.send_replace(rv);
    }

    /// Note a request; wake whoever waits for a write on its object.
    fn saw(&mut self, verb: &'static str, target: &Target, at: Instant) {
        *self
            .seen
            .requests
            .entry((verb, target.resource))
            .or_default() += 1;
        if matches!(verb, "get" | "list" | "watch") {
            return;
        }
        if !matches!(target.resource, Resource::Leases | Resource::Events) {
            self.seen.first_write.get_or_insert(at);
        }
        let key = (
            target.resource,
            target.namespace.clone().unwrap_or_default(),
            target.name.clone().unwrap_or_default(),
        );
        if let Some(waiters) = self.seen.waiters.remove(&key) {
            for w in waiters {
                let _ = w.send(at);
            }
        }
    }

    /// A generated pod changed from `before`: bump, log, and let the scheduler see it.
    fn pod_changed(&mut self, i: u32, before: &PodState) {
        let rv = self.next_rv();
        let st = &mut self.pods.states[i as usize];
        st.rv = rv;
        let st = st.clone();
        let labels_before = Arc::new(self.cluster.pod_labels(i, before));
        let labels = Arc::new(self.cluster.pod_labels(i, &st));
        let kind = if before.deleted {
            ChangeType::Added
        } else if st.deleted {
            ChangeType::Deleted
        } else {
            ChangeType::Modified
        };
        let object: Arc<str> = self.cluster.pod_json(i, &st).into();
        let namespace = self.cluster.namespace(i);
        self.emit(Change {
            rv,
            resource: Resource::Pods,
            kind,
            namespace: Some(namespace.into()),
            labels_before: Some(labels_before),
            labels,
            object,
        });
        if !st.gated && !st.scheduled && !st.deleted {
            self.sim.push(simulate::Job::Schedule { pod: i });
        }
    }

    fn node_changed(&mut self, i: u32, before: &NodeState) {
        let rv = self.next_rv();
        let st = &mut self.nodes.states[i as usize];
        st.rv = rv;
        let st = st.clone();
        let labels_before = Arc::new(self.cluster.node_labels(i, before));
        let labels = Arc::new(self.cluster.node_labels(i, &st));
        let object: Arc<str> = self.cluster.node_json(i, &st, false).into();
        self.emit(Change {
            rv,
            resource: Resource::Nodes,
            kind: ChangeType::Modified,
            namespace: None,
            labels_before: Some(labels_before),
            labels,
            object,
        });
    }

    /// Keep the RoceNode census, and hand applied specs to the simulated agent.
    fn roce_node_written(&mut self, name: &str, obj: Option<&Value>) {
        self.configured.remove(name);
        self.pending.remove(name);
        let Some(obj) = obj else { return };
        let spec = &obj["spec"];
        let generation = spec["fabricGeneration"].as_i64().unwrap_or(0);
        if spec["pending"].as_bool() == Some(true) {
            self.pending.insert(name.to_string());
        } else if simulate::reports_applied(obj, generation) {
            self.configured.insert(name.to_string(), generation);
        } else {
            self.sim.push(simulate::Job::Report {
                name: name.to_string(),
                generation,
            });
        }
    }
}

/// The running server.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// The server's self-signed certificate (PEM): the cluster CA of its kubeconfig.
    ca_pem: String,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A pod the harness made.
#[derive(Clone, Debug)]
pub struct AddedPod {
    pub index: u32,
    pub namespace: String,
    pub name: String,
}

impl ApiServer {
    /// Generate `cluster` (nodes, pods, the fabric) and serve it.
    pub async fn start(cluster: GeneratedCluster, options: Options) -> anyhow::Result<ApiServer> {
        let sizes = cluster.sizes;
        let rv = 1;
        let pods = Pods {
            states: (0..sizes.pods)
                .map(|i| cluster.initial_pod(i, rv))
                .collect(),
        };
        let nodes = Nodes {
            states: vec![NodeState { rv, labels: None }; sizes.nodes as usize],
        };
        let (sim, sim_rx) = simulate::Queue::new(options.react_after);
        let (latest_tx, latest_rx) = tokio_watch::channel(rv);
        let mut state = State {
            cluster: cluster.clone(),
            rv,
            pods,
            nodes,
            objects: Store::default(),
            log: ChangeLog::new(options.history_bytes, rv),
            latest: latest_tx,
            seen: Seen::default(),
            sim,
            configured: HashMap::new(),
            fabric_generation: 1,
            pending: HashSet::new(),
        };
        let key = (
            Resource::RoceFabrics,
            String::new(),
            cluster::FABRIC.to_string(),
        );
        state.objects.put(&key, cluster.fabric(), rv);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            latest: latest_rx,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = http::router(shared.clone());
        let tls = tls::Tls::self_signed()?;
        let ca_pem = tls.ca_pem.clone();
        let server = tokio::spawn(tls.serve(listener, app));
        let agents = tokio::spawn(simulate::run(shared.clone(), sim_rx));
        Ok(ApiServer {
            shared,
            addr,
            ca_pem,
            tasks: vec![server, agents],
        })
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Write a kubeconfig for this server into `dir`.
    pub fn write_kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: scale\n  cluster:\n    server: {}\n\
             \x20   certificate-authority-data: {}\n\
             users:\n- name: scale\n  user: {{}}\ncontexts:\n- name: scale\n  context:\n    \
             cluster: scale\n    user: scale\n    namespace: default\ncurrent-context: scale\n",
            self.url(),
            base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
        );
        std::fs::write(&path, text)?;
        Ok(path)
    }

    pub fn cluster(&self) -> GeneratedCluster {
        self.shared.lock().cluster.clone()
    }

    /// When the first write of the operator's plan (not a Lease or an Event) arrived.
    pub fn first_write(&self) -> Option<Instant> {
        self.shared.lock().seen.first_write
    }

    /// Resolves with the arrival time of the next write request on `resource` `namespace/name`.
    pub fn next_write(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        let key = (
            resource,
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        self.shared
            .lock()
            .seen
            .waiters
            .entry(key)
            .or_default()
            .push(tx);
        rx
    }

    /// Requests so far, as `verb resource: count`.
    pub fn requests(&self) -> Vec<(String, u64)> {
        self.shared
            .lock()
            .seen
            .requests
            .iter()
            .map(|((verb, r), n)| (format!("{verb} {}", r.plural()), *n))
            .collect()
    }

    /// Add a pod (a gated fabric pod, or a plain one), and [`Self::next_write`] on it.
    pub fn add_pod(&self, fabric: bool) -> (AddedPod, oneshot::Receiver<Instant>) {
        let mut st = self.shared.lock();
        let i = u32::try_from(st.pods.states.len()).unwrap_or(u32::MAX);
        let (tx, rx) = oneshot::channel();
        let key = (
            Resource::Pods,
            st.cluster.namespace(i),
            st.cluster.pod_name(i, fabric),
        );
        st.seen.waiters.entry(key).or_default().push(tx);
        let before = PodState {
            deleted: true,
            fabric,
            ..PodState::default()
        };
        st.pods.states.push(PodState {
            deleted: false,
            gated: fabric,
            scheduled: !fabric,
            ..before.clone()
        });
        st.pod_changed(i, &before);
        let pod = AddedPod {
            index: i,
            namespace: st.cluster.namespace(i),
            name: st.cluster.pod_name(i, fabric),
        };
        (pod, rx)
    }

    /// Set (`Some`) or remove a label of pod `i`.
    pub fn set_pod_label(&self, i: u32, key: &str, value: Option<&str>) {
        let mut st = self.shared.lock();
        let Some(pod) = st.pods.states.get_mut(i as usize) else {
            return;
        };
        let before = pod.clone();
        let changed = pod.changed.get_or_insert_with(Default::default);
        cluster::set_override(&mut changed.labels, key, value);
        st.pod_changed(i, &before);
    }

    /// Set (`Some`) or remove a label of node `i`.
    pub fn set_node_label(&self, i: u32, key: &str, value: Option<&str>) {
        let mut st = self.shared.lock();
        let Some(node) = st.nodes.states.get_mut(i as usize) else {
            return;
        };
        let before = node.clone();
        cluster::set_override(node.labels.get_or_insert_with(Default::default), key, value);
        st.node_changed(i, &before);
    }

    /// Change the fabric's spec as `kubectl edit` would (its generation goes up): returns the
    /// new generation.
    pub fn edit_fabric(&self, edit: impl FnOnce(&mut Value)) -> anyhow::Result<i64> {
        let mut st = self.shared.lock();
        let key = (
            Resource::RoceFabrics,
            String::new(),
            cluster::FABRIC.to_string(),
        );
        let stored = st.objects.get(&key).context("no fabric stored")?;
        let labels_before = stored.labels.clone();
        let mut fabric: Value = serde_json::from_str(&stored.json)?;
        edit(&mut fabric["spec"]);
        let generation = fabric["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
        fabric["metadata"]["generation"] = generation.into();
        let rv = st.next_rv();
        let stored = st.objects.put(&key, fabric, rv);
        st.fabric_generation = generation;
        st.emit(Change {
            rv,
            resource: Resource::RoceFabrics,
            kind: ChangeType::Modified,
            namespace: None,
            labels_before: Some(labels_before),
            labels: stored.labels,
            object: stored.json,
        });
        Ok(generation)
    }

    /// Where the rollout and the regions stand.
    pub fn census(&self) -> Census {
        let st = self.shared.lock();
        let mut c = Census {
            roce_nodes: st.objects.count(Resource::RoceNodes),
            configured: st.configured.len(),
            configured_current: st
                .configured
                .values()
                .filter(|&&g| g == st.fabric_generation)
                .count(),
            pending: st.pending.len(),
            region_directories: st.objects.count(Resource::ConfigMaps),
            ..Census::default()
        };
        let mut namespaces = HashSet::new();
        for (i, p) in st.pods.states.iter().enumerate() {
            if p.deleted || !p.fabric {
                continue;
            }
            c.fabric_pods += 1;
            c.annotated += usize::from(p.region.is_some());
            c.gated += usize::from(p.gated);
            namespaces.insert(st.cluster.namespace(u32::try_from(i).unwrap_or(u32::MAX)));
        }
        c.fabric_namespaces = namespaces.len();
        c
    }

    /// Every live fabric pod's `(namespace, name, region annotation)`.
    pub fn regions(&self) -> Vec<(String, String, Option<String>)> {
        let st = self.shared.lock();
        st.pods
            .states
            .iter()
            .enumerate()
            .filter(|(_, p)| p.fabric && !p.deleted)
            .map(|(i, p)| {
                let i = u32::try_from(i).unwrap_or(u32::MAX);
                (
                    st.cluster.namespace(i),
                    st.cluster.pod_name(i, true),
                    p.region.as_deref().map(str::to_string),
                )
            })
            .collect()
    }

    /// A stored object the operator wrote (RoceNodes, ConfigMaps, the fabric), as JSON.
    pub fn object(&self, resource: Resource, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.shared.lock();
        let key = (
            resource,
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        serde_json::from_str(&st.objects.get(&key)?.json).ok()
    }
}

/// The PEM of a fresh self-signed certificate like the server's, which no server here holds the
/// key of: a CA that must not be trusted for this server.
pub fn self_signed_pem() -> anyhow::Result<String> {
    Ok(tls::Tls::self_signed()?.ca_pem)
}
