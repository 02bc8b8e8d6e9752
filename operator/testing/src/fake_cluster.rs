//! A small in-memory API server for the tests that run the whole controller, behind a real
//! `kube::Client`: lists and watches held open (label selectors hold for both; a watch sees
//! ADDED, MODIFIED and DELETED events after writes; lists in pages with `limit` and
//! `continue`), GET, and every write with the semantics of
//! the store the scale harness serves from ([`crate::api::store`]: create, replace with a
//! resourceVersion check, server-side apply, merge and JSON patches with preconditions,
//! delete). Every request is logged.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};

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

use crate::api::failure::Failure;
use crate::api::resource::{Resource, Target, route};
use crate::api::selector::Selector;
use crate::api::store::{Key, Labels, Store, Write};
use crate::verifier::{Call, MockBody, json_response};

type Sender = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// A watch held open.
struct Watcher {
    resource: Resource,
    namespace: Option<String>,
    selector: Selector,
    tx: Sender,
}

impl Watcher {
    /// The event this watch sees of a change on `key` whose labels went from `before` (`None`:
    /// created) to `after` (`None`: deleted), as the API server sends it to a selector watch:
    /// an object that starts matching is ADDED, one that stops is DELETED.
    fn event(&self, key: &Key, before: Option<&Labels>, after: Option<&Labels>) -> Option<&str> {
        if key.0 != self.resource || self.namespace.as_ref().is_some_and(|ns| *ns != key.1) {
            return None;
        }
        let was = before.is_some_and(|l| self.selector.matches(l));
        let is = after.is_some_and(|l| self.selector.matches(l));
        match (was, is) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        }
    }
}

#[derive(Default)]
struct State {
    store: Store,
    rv: u64,
    watchers: Vec<Watcher>,
    log: Vec<Call>,
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

fn parse(json: &str) -> Result<Value, Failure> {
    serde_json::from_str(json).map_err(Failure::internal)
}

fn key_of(target: &Target, name: String) -> Key {
    (
        target.resource,
        target.namespace.clone().unwrap_or_default(),
        name,
    )
}

impl State {
    /// Tell the watches of a change on `key` (`object`: after it, or the last state deleted).
    fn notify(&mut self, key: &Key, before: Option<&Labels>, after: Option<&Labels>, obj: &Value) {
        self.watchers.retain(|w| {
            let Some(kind) = w.event(key, before, after) else {
                return !w.tx.is_closed();
            };
            let line = format!("{}\n", json!({ "type": kind, "object": obj }));
            w.tx.unbounded_send(Ok(Frame::data(Bytes::from(line))))
                .is_ok()
        });
    }

    /// A list, a page of `limit` objects at a time when asked (`continue`: the namespace and
    /// name of the last object of the page before).
    fn list(
        &self,
        target: &Target,
        selector: &Selector,
        limit: Option<u64>,
        after: Option<&str>,
    ) -> Result<Value, Failure> {
        let after = match after {
            Some(token) => Some(
                token
                    .split_once('/')
                    .map(|(ns, name)| (ns.to_string(), name.to_string()))
                    .ok_or_else(|| Failure::bad_request("malformed continue token"))?,
            ),
            None => None,
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut last: Option<&Key> = None;
        for (key, stored) in self
            .store
            .iter_from(target.resource, target.namespace.as_deref(), after)
            .filter(|(_, stored)| selector.matches(&stored.labels))
        {
            if limit.is_some_and(|l| items.len() as u64 >= l) {
                next = last.map(|k| format!("{}/{}", k.1, k.2));
                break;
            }
            items.push(parse(&stored.json)?);
            last = Some(key);
        }
        let mut metadata = json!({ "resourceVersion": self.rv.to_string() });
        if let Some(next) = next {
            metadata["continue"] = json!(next);
        }
        Ok(json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": metadata,
            "items": items,
        }))
    }

    /// Renew the Lease at `key` as the holder elsewhere, if one is set.
    fn renew_lease(&mut self, key: &Key) -> Result<(), Failure> {
        let Some(holder) = self.renewing_holder.clone() else {
            return Ok(());
        };
        let Some(stored) = self.store.get(key) else {
            return Ok(());
        };
        let mut lease = parse(&stored.json)?;
        let labels = stored.labels.clone();
        let n = self.rv;
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!(format!("2026-01-01T00:00:{:02}.{:06}Z", n % 60, n));
        self.rv += 1;
        let stored = self.store.put(key, lease, self.rv);
        self.notify(
            key,
            Some(&labels),
            Some(&stored.labels),
            &parse(&stored.json)?,
        );
        Ok(())
    }

    fn get(&mut self, key: &Key) -> Result<Value, Failure> {
        if key.0 == Resource::Leases {
            self.renew_lease(key)?;
        }
        let stored = self
            .store
            .get(key)
            .ok_or_else(|| Failure::not_found(&key.2))?;
        parse(&stored.json)
    }

    fn delete(&mut self, key: &Key) -> Result<Value, Failure> {
        let stored = self
            .store
            .remove(key)
            .ok_or_else(|| Failure::not_found(&key.2))?;
        self.rv += 1;
        let mut last = parse(&stored.json)?;
        last["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.notify(key, Some(&stored.labels), None, &last);
        Ok(last)
    }

    fn write(&mut self, target: &Target, call: &Call) -> Result<(StatusCode, Value), Failure> {
        let name = target
            .name
            .clone()
            .or_else(|| call.body["metadata"]["name"].as_str().map(str::to_string))
            .ok_or_else(|| Failure::bad_request("no name"))?;
        let key = key_of(target, name);
        let content_type = call.content_type.as_deref().unwrap_or_default();
        let write =
            Write::of_request(&call.method, content_type, target.status, call.body.clone())?;
        let Some(outcome) = self.store.write(&key, write, self.rv + 1)? else {
            // Nothing changed: no new resourceVersion, no event.
            let stored = self
                .store
                .get(&key)
                .ok_or_else(|| Failure::not_found(&key.2))?;
            return Ok((StatusCode::OK, parse(&stored.json)?));
        };
        self.rv += 1;
        let after = self.store.get(&key).map(|s| s.labels.clone());
        let before = outcome.before.map(|b| b.labels);
        self.notify(&key, before.as_ref(), after.as_ref(), &outcome.after);
        let status = if outcome.created && call.method == Method::POST {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok((status, outcome.after))
    }

    fn handle(&mut self, call: &Call) -> Result<(StatusCode, Value), Failure> {
        let target = route(&call.path).ok_or_else(|| Failure::not_found(&call.path))?;
        match (&call.method, target.name.clone()) {
            (&Method::GET, None) => {
                let selector = Selector::parse(call.q("labelSelector").unwrap_or_default())
                    .map_err(|e| Failure::bad_request(&e.to_string()))?;
                let limit = call
                    .q("limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|l| *l > 0);
                let page = self.list(&target, &selector, limit, call.q("continue"))?;
                Ok((StatusCode::OK, page))
            }
            (&Method::GET, Some(name)) => Ok((StatusCode::OK, self.get(&key_of(&target, name))?)),
            (&Method::DELETE, Some(name)) => {
                Ok((StatusCode::OK, self.delete(&key_of(&target, name))?))
            }
            (&Method::DELETE, None) => Err(Failure::new(405, "MethodNotAllowed", "DELETE")),
            _ => self.write(&target, call),
        }
    }

    /// Hold a watch open; its events come after later writes.
    fn watch(&mut self, call: &Call) -> Result<Response<MockBody>, Failure> {
        let target = route(&call.path).ok_or_else(|| Failure::not_found(&call.path))?;
        let selector = Selector::parse(call.q("labelSelector").unwrap_or_default())
            .map_err(|e| Failure::bad_request(&e.to_string()))?;
        let (tx, rx) = mpsc::unbounded();
        self.watchers.push(Watcher {
            resource: target.resource,
            namespace: target.namespace,
            selector,
            tx,
        });
        Ok(Response::builder()
            .status(200)
            .body(StreamBody::new(rx).boxed_unsync())
            .expect("valid response"))
    }

    fn answer(&mut self, call: &Call) -> Response<MockBody> {
        let answer = if call.q("watch") == Some("true") {
            self.watch(call)
        } else {
            self.handle(call)
                .map(|(status, body)| json_response(status, &body))
        };
        answer.unwrap_or_else(|f| {
            let status = StatusCode::from_u16(f.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, &f.status())
        })
    }
}

impl FakeCluster {
    /// Serve `client`'s requests from `objects` (full objects with `apiVersion`, `kind`,
    /// `metadata`; their resourceVersion is kept, "1" when they have none).
    pub fn start(objects: Vec<Value>) -> (Client, FakeCluster) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<MockBody>>();
        let client = Client::new(service, "default");
        let mut state = State {
            rv: 100,
            ..State::default()
        };
        for obj in objects {
            let kind = obj["kind"].as_str().unwrap_or_default();
            let resource =
                Resource::of_kind(kind).unwrap_or_else(|| panic!("the fake serves no {kind}"));
            let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            let key = (resource, namespace.to_string(), name.to_string());
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(1);
            state.store.put(&key, obj, rv);
        }
        let state = Arc::new(Mutex::new(state));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Some((request, responder)) = handle.next_request().await {
                let call = Call::read(request, None).await;
                let mut st = lock(&shared);
                responder.send_response(st.answer(&call));
                st.log.push(call);
            }
        });
        (client, FakeCluster { state, task })
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state)
            .log
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
        lock(&self.state).log.clear();
    }

    /// The stored object of resource `plural`, if any.
    pub fn get(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let resource = Resource::ALL.into_iter().find(|r| r.plural() == plural)?;
        let key = (
            resource,
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        serde_json::from_str(&lock(&self.state).store.get(&key)?.json).ok()
    }

    /// Keep renewing every Lease as `holder` on each read (None: that holder is gone).
    pub fn set_renewing_holder(&self, holder: Option<&str>) {
        lock(&self.state).renewing_holder = holder.map(str::to_string);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().expect("fake state lock")
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}
