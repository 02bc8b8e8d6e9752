//! The HTTP face: one fallback handler that routes by path, method, query and content type.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State as AxumState};
use axum::response::Response;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::changes::{Change, ChangeType};
use super::generated;
use super::read::{Cursor, Filter, LIST_CLOSE};
use super::{Shared, State, watch};
use crate::api::failure::Failure;
use crate::api::resource::{Query, Resource, Target, route};
use crate::api::selector::Selector;
use crate::api::store::{self, Write};

/// Items rendered per lock when a list is streamed whole (no `limit`).
const STREAM_PAGE: usize = 1000;
/// Largest request body read.
const MAX_BODY: usize = 64 << 20;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

fn respond(status: u16, body: impl Into<Body>) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap_or_default()
}

/// What `GET /version` answers (the release this server stands in for).
const VERSION: &str =
    r#"{"major":"1","minor":"34","gitVersion":"v1.34.0","platform":"linux/amd64"}"#;

fn failed(f: &Failure) -> Response {
    respond(f.code, f.status().to_string())
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    if parts.uri.path() == "/version" {
        return respond(200, VERSION);
    }
    let Some(target) = route(parts.uri.path()) else {
        return failed(&Failure::not_found(parts.uri.path()));
    };
    let query = Query::parse(parts.uri.query());
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let meta_only = header(header::ACCEPT).contains("as=PartialObjectMetadata");
    let content_type = header(header::CONTENT_TYPE).to_string();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return failed(&Failure::bad_request(&e.to_string())),
    };
    let filter = match Selector::parse(query.get("labelSelector").unwrap_or_default()) {
        Ok(selector) => Filter {
            resource: target.resource,
            namespace: target.namespace.clone(),
            selector,
            meta_only,
        },
        Err(e) => return failed(&Failure::bad_request(&e.to_string())),
    };
    let result = match (&parts.method, target.name.as_deref()) {
        (&Method::GET, None) if query.is_true("watch") => {
            shared.lock().saw("watch", &target, at);
            return start_watch(shared, filter, &query);
        }
        (&Method::GET, None) => {
            shared.lock().saw("list", &target, at);
            return list(shared, filter, &query);
        }
        (&Method::GET, Some(name)) => {
            let mut st = shared.lock();
            st.saw("get", &target, at);
            st.get_one(&filter, target.namespace.as_deref(), name)
                .map(|json| (200, json))
        }
        (method, _) => {
            let mut st = shared.lock();
            st.saw(verb(method), &target, at);
            write(&mut st, &target, method, &content_type, &body)
        }
    };
    match result {
        Ok((status, json)) => respond(status, json),
        Err(f) => failed(&f),
    }
}

fn start_watch(shared: Arc<Shared>, filter: Filter, query: &Query) -> Response {
    let from = {
        let st = shared.lock();
        // "0" or none: from now (this server sends no synthetic ADDED events).
        query
            .number("resourceVersion")
            .filter(|rv| *rv > 0)
            .unwrap_or(st.rv)
    };
    let timeout = Duration::from_secs(query.number("timeoutSeconds").unwrap_or(1800));
    let (tx, rx) = mpsc::channel(16);
    let watch = watch::Watch {
        filter,
        from,
        timeout,
        bookmarks: query.is_true("allowWatchBookmarks"),
    };
    tokio::spawn(watch::serve(shared, watch, tx));
    respond(200, Body::from_stream(stream_of(rx)))
}

fn stream_of<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
}

fn list(shared: Arc<Shared>, filter: Filter, query: &Query) -> Response {
    let token = query.get("continue").filter(|c| !c.is_empty());
    let from = match token.map(Cursor::decode) {
        Some(None) => {
            return failed(&Failure::bad_request("invalid continue token"));
        }
        Some(Some(pair)) => Some(pair),
        None => None,
    };
    if let Some(limit) = query.number("limit").filter(|n| *n > 0) {
        let st = shared.lock();
        let (rv, cursor) = from.map_or((st.rv, None), |(rv, c)| (rv, Some(c)));
        let page = st.page(
            &filter,
            cursor,
            usize::try_from(limit).unwrap_or(usize::MAX),
        );
        drop(st);
        let next = page.next.map(|c| c.encode(rv));
        let mut body = filter.list_open(rv, next.as_deref());
        body.push_str(&page.items);
        body.push_str(LIST_CLOSE);
        return respond(200, body);
    }
    // No limit: the whole list, rendered a page per lock as the client reads it.
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let rv = shared.lock().rv;
        if tx
            .send(Ok(filter.list_open(rv, None).into()))
            .await
            .is_err()
        {
            return;
        }
        let mut cursor = None;
        let mut first = true;
        loop {
            let page = shared.lock().page(&filter, cursor, STREAM_PAGE);
            if page.count > 0 {
                let sep = if first { "" } else { "," };
                first = false;
                if tx
                    .send(Ok(format!("{sep}{}", page.items).into()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(LIST_CLOSE.as_bytes()))).await;
    });
    respond(200, Body::from_stream(stream_of(rx)))
}

fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// A write: to a generated pod, or to a stored object.
fn write(
    st: &mut State,
    target: &Target,
    method: &Method,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, String), Failure> {
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body).map_err(|e| Failure::bad_request(&e.to_string()))?
    };
    match target.resource {
        Resource::Pods => st.write_pod(target, method, content_type, &body),
        Resource::Nodes => Err(Failure::new(
            405,
            "MethodNotAllowed",
            "nodes are read-only here",
        )),
        _ => st.write_object(target, method, content_type, body),
    }
}

impl State {
    fn write_pod(
        &mut self,
        target: &Target,
        method: &Method,
        content_type: &str,
        body: &Value,
    ) -> Result<(u16, String), Failure> {
        let name = target.name.as_deref().unwrap_or_default();
        let namespace = target.namespace.as_deref().unwrap_or_default();
        let i = self
            .pods
            .find(&self.cluster, namespace, name)
            .ok_or_else(|| Failure::not_found(&format!("pod {namespace}/{name}")))?;
        let before = self.pods.states[i as usize].clone();
        let mut after = before.clone();
        match (method, content_type) {
            (&Method::PATCH, ct) if ct.contains("merge-patch") => {
                generated::merge_patch(&mut after, &self.cluster.pod_uid(i), body)?;
            }
            (&Method::PATCH, ct) if ct.contains("json-patch") => {
                generated::json_patch(&mut after, &self.cluster.pod_uid(i), body)?;
            }
            (&Method::DELETE, _) => after.deleted = true,
            _ => {
                return Err(Failure::new(
                    415,
                    "UnsupportedMediaType",
                    &format!("{method} {content_type} of a generated pod"),
                ));
            }
        }
        if after != before {
            self.pods.states[i as usize] = after;
            self.pod_changed(i, &before);
        }
        Ok((200, self.cluster.pod_json(i, &self.pods.states[i as usize])))
    }

    fn write_object(
        &mut self,
        target: &Target,
        method: &Method,
        content_type: &str,
        body: Value,
    ) -> Result<(u16, String), Failure> {
        let name = target
            .name
            .clone()
            .or_else(|| body["metadata"]["name"].as_str().map(str::to_string))
            .ok_or_else(|| Failure::bad_request("no name"))?;
        let key = (
            target.resource,
            target.namespace.clone().unwrap_or_default(),
            name,
        );
        if method == Method::DELETE {
            return self.delete_object(&key);
        }
        let write = Write::of_request(method, content_type, target.status, body)?;
        let created_status = if matches!(method, &Method::POST) {
            201
        } else {
            200
        };
        let Some(outcome) = self.objects.write(&key, write, self.rv + 1)? else {
            let stored = self
                .objects
                .get(&key)
                .ok_or_else(|| Failure::not_found(&key.2))?;
            return Ok((200, stored.json.to_string()));
        };
        self.next_rv();
        let stored = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| Failure::internal("written object missing"))?;
        let kind = if outcome.created {
            ChangeType::Added
        } else {
            ChangeType::Modified
        };
        let namespace = (!key.1.is_empty()).then_some(key.1.as_str());
        let before = outcome.before.map(|b| b.labels);
        self.emit(Change {
            rv: self.rv,
            resource: key.0,
            kind,
            namespace: namespace.map(Arc::from),
            labels_before: before,
            labels: stored.labels,
            object: stored.json.clone(),
        });
        if key.0 == Resource::RoceNodes {
            self.roce_node_written(&key.2, Some(&outcome.after));
        }
        let status = if outcome.created { created_status } else { 200 };
        Ok((status, stored.json.to_string()))
    }

    fn delete_object(&mut self, key: &store::Key) -> Result<(u16, String), Failure> {
        let stored = self
            .objects
            .remove(key)
            .ok_or_else(|| Failure::not_found(&format!("{} {}", key.0.plural(), key.2)))?;
        // The DELETED event carries the deletion's resourceVersion, which watchers resume from.
        let rv = self.next_rv();
        let mut last: Value = serde_json::from_str(&stored.json).map_err(Failure::internal)?;
        last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let json: Arc<str> = last.to_string().into();
        let namespace = (!key.1.is_empty()).then_some(key.1.as_str());
        self.emit(Change {
            rv,
            resource: key.0,
            kind: ChangeType::Deleted,
            namespace: namespace.map(Arc::from),
            labels_before: Some(stored.labels.clone()),
            labels: stored.labels,
            object: json.clone(),
        });
        if key.0 == Resource::RoceNodes {
            self.roce_node_written(&key.2, None);
        }
        Ok((200, json.to_string()))
    }
}
