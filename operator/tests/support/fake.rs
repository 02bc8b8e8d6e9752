//! A small in-memory API server for tests that run the whole controller: lists, watches held
//! open (with ADDED/MODIFIED/DELETED events after writes), GET, server-side apply (a shallow
//! merge of the applied fields), JSON merge and JSON patches, DELETE, POST and PUT with
//! `resourceVersion` checks. Every request is logged.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock;

use super::{Call, MockBody, json_response, status_body};

type Sender = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// (plural, namespace, name)
type Key = (String, Option<String>, String);

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    watchers: Vec<(String, Sender)>,
    log: Vec<Call>,
    rv: u64,
    /// While set, every GET of a Lease first renews it as this holder (a live leader elsewhere).
    renewing_holder: Option<String>,
}

/// A request as logged (no responder).
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Value,
}

/// The fake API server.
pub struct FakeCluster {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

struct Route {
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn route(path: &str) -> Option<Route> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["api", _v, rest @ ..] => rest,
        ["apis", _g, _v, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    match rest {
        [plural] => Some(Route {
            plural: plural.to_string(),
            namespace,
            name: None,
            status: false,
        }),
        [plural, name] => Some(Route {
            plural: plural.to_string(),
            namespace,
            name: Some(name.to_string()),
            status: false,
        }),
        [plural, name, "status"] => Some(Route {
            plural: plural.to_string(),
            namespace,
            name: Some(name.to_string()),
            status: true,
        }),
        _ => None,
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl State {
    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    fn notify(&mut self, plural: &str, kind: &str, obj: &Value) {
        let line = format!("{}\n", json!({ "type": kind, "object": obj }));
        self.watchers.retain(|(p, tx)| {
            p != plural
                || tx
                    .unbounded_send(Ok(Frame::data(Bytes::from(line.clone()))))
                    .is_ok()
        });
    }

    fn insert(&mut self, key: Key, mut obj: Value, created: bool) -> Value {
        if created {
            obj["metadata"]["uid"] = json!(format!("uid-{}-{}", key.0, key.2));
            obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
            obj["metadata"]["generation"] = json!(1);
        }
        self.bump(&mut obj);
        self.objects.insert(key.clone(), obj.clone());
        self.notify(&key.0, if created { "ADDED" } else { "MODIFIED" }, &obj);
        obj
    }

    fn list(&self, plural: &str, namespace: Option<&str>, label: Option<&str>) -> Value {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, ns, _), _)| {
                p == plural && (namespace.is_none() || ns.as_deref() == namespace)
            })
            .filter(|(_, obj)| label.is_none_or(|l| obj["metadata"]["labels"].get(l).is_some()))
            .map(|(_, obj)| obj.clone())
            .collect();
        json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": self.rv.to_string() }, "items": items })
    }

    fn handle(&mut self, call: &Call) -> (StatusCode, Value) {
        let Some(r) = route(&call.path) else {
            return (
                StatusCode::NOT_FOUND,
                status_body(404, "NotFound", "no route"),
            );
        };
        let key = |name: &str| (r.plural.clone(), r.namespace.clone(), name.to_string());
        let not_found = || {
            (
                StatusCode::NOT_FOUND,
                status_body(404, "NotFound", "not found"),
            )
        };
        match (&call.method, r.name.as_deref()) {
            (&Method::GET, None) => (
                StatusCode::OK,
                self.list(&r.plural, r.namespace.as_deref(), call.q("labelSelector")),
            ),
            (&Method::GET, Some(name)) => {
                if r.plural == "leases"
                    && let Some(holder) = self.renewing_holder.clone()
                    && let Some(mut lease) = self.objects.get(&key(name)).cloned()
                {
                    let n = self.rv;
                    lease["spec"]["holderIdentity"] = json!(holder);
                    lease["spec"]["renewTime"] =
                        json!(format!("2026-01-01T00:00:{:02}.{:06}Z", n % 60, n));
                    self.insert(key(name), lease, false);
                }
                match self.objects.get(&key(name)) {
                    Some(obj) => (StatusCode::OK, obj.clone()),
                    None => not_found(),
                }
            }
            (&Method::POST, None) => {
                let name = call.body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if self.objects.contains_key(&key(&name)) {
                    return (
                        StatusCode::CONFLICT,
                        status_body(409, "AlreadyExists", "exists"),
                    );
                }
                (
                    StatusCode::CREATED,
                    self.insert(key(&name), call.body.clone(), true),
                )
            }
            (&Method::PUT, Some(name)) => {
                let Some(current) = self.objects.get(&key(name)) else {
                    return not_found();
                };
                if call.body["metadata"]["resourceVersion"]
                    != current["metadata"]["resourceVersion"]
                {
                    return (
                        StatusCode::CONFLICT,
                        status_body(409, "Conflict", "the object has been modified"),
                    );
                }
                (
                    StatusCode::OK,
                    self.insert(key(name), call.body.clone(), false),
                )
            }
            (&Method::DELETE, Some(name)) => match self.objects.remove(&key(name)) {
                Some(obj) => {
                    self.notify(&r.plural, "DELETED", &obj);
                    (StatusCode::OK, obj)
                }
                None => not_found(),
            },
            (&Method::PATCH, Some(name)) => {
                let content_type = call.content_type.as_deref().unwrap_or_default();
                let existing = self.objects.get(&key(name)).cloned();
                let created = existing.is_none();
                let mut obj = match existing {
                    Some(obj) => obj,
                    None if content_type.contains("apply-patch") && !r.status => {
                        json!({ "metadata": {} })
                    }
                    None => return not_found(),
                };
                if content_type.contains("json-patch") {
                    let ops: json_patch::Patch = match serde_json::from_value(call.body.clone()) {
                        Ok(p) => p,
                        Err(e) => {
                            return (
                                StatusCode::BAD_REQUEST,
                                status_body(400, "BadRequest", &e.to_string()),
                            );
                        }
                    };
                    if let Err(e) = json_patch::patch(&mut obj, &ops) {
                        return (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            status_body(422, "Invalid", &e.to_string()),
                        );
                    }
                } else if r.status {
                    obj["status"] = call.body["status"].clone();
                } else {
                    let mut body = call.body.clone();
                    if content_type.contains("apply-patch") {
                        // Applied fields replace what the manager owned (close enough for tests).
                        if let Some(spec) = body.get("spec").cloned() {
                            obj["spec"] = spec;
                            body.as_object_mut().map(|m| m.remove("spec"));
                        }
                        if let Some(data) = body.get("data").cloned() {
                            obj["data"] = data;
                            body.as_object_mut().map(|m| m.remove("data"));
                        }
                    }
                    merge(&mut obj, &body);
                }
                (StatusCode::OK, self.insert(key(name), obj, created))
            }
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                status_body(405, "MethodNotAllowed", "unsupported"),
            ),
        }
    }
}

impl FakeCluster {
    /// Serve `client`'s requests from `objects` (full objects with `apiVersion`, `kind`, `metadata`).
    pub fn start(objects: Vec<Value>) -> (Client, FakeCluster) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<MockBody>>();
        let client = Client::new(service, "default");
        let mut state = State {
            rv: 100,
            ..State::default()
        };
        for obj in objects {
            let kind = obj["kind"].as_str().unwrap_or_default();
            let plural = match kind {
                "RoceFabric" => "rocefabrics".to_string(),
                "RoceNode" => "rocenodes".to_string(),
                "Lease" => "leases".to_string(),
                k => format!("{}s", k.to_lowercase()),
            };
            let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
            let name = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            state.objects.insert((plural, ns, name), obj);
        }
        let state = Arc::new(Mutex::new(state));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Some((request, responder)) = handle.next_request().await {
                let call = Call::read(request, None).await;
                let watch = call.q("watch") == Some("true");
                let mut st = shared.lock().expect("fake state lock");
                if watch {
                    let plural = route(&call.path).map(|r| r.plural).unwrap_or_default();
                    let (tx, rx) = mpsc::unbounded();
                    st.watchers.push((plural, tx));
                    let body = StreamBody::new(rx).boxed_unsync();
                    responder.send_response(
                        Response::builder()
                            .status(200)
                            .body(body)
                            .expect("valid response"),
                    );
                } else {
                    let (status, body) = st.handle(&call);
                    responder.send_response(json_response(status, &body));
                }
                st.log.push(call);
            }
        });
        (client, FakeCluster { state, task })
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        let st = self.state.lock().expect("fake state lock");
        st.log
            .iter()
            .map(|c| Logged {
                method: c.method.clone(),
                path: c.path.clone(),
                query: c.query.clone(),
                body: c.body.clone(),
            })
            .collect()
    }

    /// Requests that change state, in order.
    pub fn writes(&self) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|c| c.method != Method::GET)
            .collect()
    }

    /// Forget the log.
    pub fn clear_log(&self) {
        self.state.lock().expect("fake state lock").log.clear();
    }

    /// The stored object, if any.
    pub fn get(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.state.lock().expect("fake state lock");
        st.objects
            .get(&(
                plural.to_string(),
                namespace.map(str::to_string),
                name.to_string(),
            ))
            .cloned()
    }

    /// Keep renewing every Lease as `holder` on each read (None: that holder is gone).
    pub fn set_renewing_holder(&self, holder: Option<&str>) {
        self.state.lock().expect("fake state lock").renewing_holder = holder.map(str::to_string);
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}
