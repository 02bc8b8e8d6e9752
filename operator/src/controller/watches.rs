//! The watches: fabrics, nodes (metadata only), RoceNodes and region directories as one
//! stream, and the pod watch (restarted when the fabrics' pod selectors grow), each event
//! wrapped for [`crate::feed::Feed::seen`].

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::FABRIC_LABEL;

use super::read_ahead::read_ahead_watcher;
use crate::feed::Seen;
use crate::objects::{CompactNode, CompactPod, CompactRoceNode, Wire};

fn seen<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    resource: &'static str,
    wrap: fn(watcher::Event<K>) -> Seen,
) -> stream::BoxStream<'static, Result<Seen, (&'static str, watcher::Error)>>
where
    K: Send + 'static,
{
    events
        .map(move |e| e.map(wrap).map_err(|error| (resource, error)))
        .boxed()
}

/// One stream of the watches' events for [`crate::feed::Feed::seen`].
pub type Events = stream::BoxStream<'static, Result<Seen, (&'static str, watcher::Error)>>;

/// Start the watches of fabrics, nodes, RoceNodes and region directories, as one stream.
pub fn watches(client: &Client) -> Events {
    let all = watcher::Config::default;
    let fabrics = watcher(Api::<RoceFabric>::all(client.clone()), all()).default_backoff();
    // Decoded straight into what the planner reads (managedFields and the agent's interface
    // reports skipped unbuilt).
    let roce_nodes =
        watcher(Api::<Wire<CompactRoceNode>>::all(client.clone()), all()).default_backoff();
    let config_maps = watcher(
        Api::<ConfigMap>::all(client.clone()),
        all().labels(FABRIC_LABEL),
    )
    .default_backoff();
    // Nodes as metadata only (the API server sends PartialObjectMetadata), decoded straight
    // into their name and labels: the planner selects by labels.
    let nodes = watcher(Api::<Wire<CompactNode>>::all(client.clone()), all()).default_backoff();
    stream::select_all([
        seen(fabrics, "rocefabrics", Seen::Fabric),
        seen(nodes, "nodes", |e| Seen::Node(unwire(e))),
        seen(roce_nodes, "rocenodes", |e| Seen::RoceNode(unwire(e))),
        seen(config_maps, "configmaps", Seen::ConfigMap),
    ])
    .boxed()
}

/// Start the pod watch (a list, then events); only pods matching `selector` when given. Started
/// again when the fabrics' pod selectors grow ([`crate::feed::Feed::take_pod_relist`]): the pods a new
/// selector picks were dropped when they were listed.
pub fn pod_watch(client: &Client, selector: Option<&str>) -> Events {
    // Decoded straight into the planner's compact pods: a full Pod is never built. The list
    // reads ahead: at a million pods, kube's watcher's turn-taking was most of the cold start.
    let pods = read_ahead_watcher::<CompactPod>(client.clone(), selector.map(str::to_owned))
        .default_backoff();
    seen(pods, "pods", Seen::Pod)
}

/// The compact objects of a watch's event.
fn unwire<T>(event: watcher::Event<Wire<T>>) -> watcher::Event<T> {
    use watcher::Event;
    match event {
        Event::Apply(w) => Event::Apply(w.object),
        Event::Delete(w) => Event::Delete(w.object),
        Event::Init => Event::Init,
        Event::InitApply(w) => Event::InitApply(w.object),
        Event::InitDone => Event::InitDone,
    }
}
