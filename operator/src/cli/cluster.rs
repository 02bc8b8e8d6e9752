//! `plan --from-cluster`: the objects the operator watches, listed from the API server a page at
//! a time (`limit`, then `continue`) and decoded exactly as `plan` decodes files
//! ([`Snapshot::load_page`]: each object bounded, its names checked, cut to what the planner
//! reads). Read-only: list requests, nothing else.

use std::path::Path;

use anyhow::Context as _;
use futures::AsyncReadExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Resource;
use kube::api::ListParams;
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::{RoceFabric, RoceNode};
use rocefabric_input::read::human;

use crate::snapshot::{Kind, Snapshot};

/// Objects per list request (kubectl's `--chunk-size` default).
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// Largest page read: the objects are bounded one by one ([`crate::snapshot::MAX_OBJECT_BYTES`]),
/// the page as a whole by this.
pub const MAX_PAGE_BYTES: u64 = 1 << 30;

/// What is listed, as the operator's watches list it: every fabric, node, RoceNode and pod, and
/// the region directories (ConfigMaps labelled `rocefabric.io/fabric`).
fn lists() -> [(String, Option<&'static str>, Kind); 5] {
    [
        (RoceFabric::url_path(&(), None), None, Kind::RoceFabric),
        (Node::url_path(&(), None), None, Kind::Node),
        (RoceNode::url_path(&(), None), None, Kind::RoceNode),
        (Pod::url_path(&(), None), None, Kind::Pod),
        (
            ConfigMap::url_path(&(), None),
            Some(FABRIC_LABEL),
            Kind::ConfigMap,
        ),
    ]
}

/// Everything `plan` reads, from the cluster of `client`.
pub async fn snapshot(client: &kube::Client, page_size: u32) -> anyhow::Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    for (path, selector, kind) in lists() {
        list_all(client, &mut snapshot, &path, selector, kind, page_size).await?;
    }
    Ok(snapshot)
}

/// List every object at `path` into `snapshot`, a page at a time.
async fn list_all(
    client: &kube::Client,
    snapshot: &mut Snapshot,
    path: &str,
    selector: Option<&str>,
    kind: Kind,
    page_size: u32,
) -> anyhow::Result<()> {
    let mut token: Option<String> = None;
    loop {
        let params = ListParams {
            label_selector: selector.map(str::to_string),
            limit: Some(page_size),
            continue_token: token.take(),
            ..ListParams::default()
        };
        let request = kube::core::Request::new(path)
            .list(&params)
            .with_context(|| format!("cannot build the list request of {path}"))?;
        let uri = request.uri().to_string();
        let reader = client
            .request_stream(request)
            .await
            .with_context(|| format!("cannot list {uri}"))?;
        let mut bytes = Vec::new();
        reader
            .take(MAX_PAGE_BYTES + 1)
            .read_to_end(&mut bytes)
            .await
            .with_context(|| format!("cannot read the answer to {uri}"))?;
        if bytes.len() as u64 > MAX_PAGE_BYTES {
            anyhow::bail!(
                "{uri}: a page larger than {}; give a smaller --page-size",
                human(MAX_PAGE_BYTES)
            );
        }
        token = snapshot.load_page(bytes.as_slice(), Path::new(&uri), kind)?;
        if token.is_none() {
            return Ok(());
        }
    }
}
