//! A mock API server behind a real `kube::Client`, in the style of controller-rs's
//! `ApiServerVerifier`: each test states the exact requests it expects (method, path, query,
//! body), answers them as the API server would, and fails when a call never comes (or comes
//! when none should).
//!
//! [`ApiServerVerifier`] is the strict, one-request-at-a-time verifier;
//! [`crate::fake_cluster::FakeCluster`] answers from memory for the tests that run the whole
//! controller loop, over the same mock service and [`Call`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use kube::Client;
use kube::client::Body;
use serde_json::Value;
use tower_test::mock;

use crate::api::failure::status_body;
use crate::api::resource::Query;

/// Response body of the mock: a full body or a stream held open (watches).
pub type MockBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = mock::Handle<Request<Body>, Response<MockBody>>;
type Responder = mock::SendResponse<Response<MockBody>>;

/// How long a test waits for a request that should come (virtual time with paused clocks).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A `kube::Client` whose requests reach the returned [`ApiServerVerifier`].
pub fn mock_client() -> (Client, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<MockBody>>();
    (
        Client::new(service, "default"),
        ApiServerVerifier { handle },
    )
}

/// A full response body.
pub fn full(bytes: impl Into<Bytes>) -> MockBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &Value) -> Response<MockBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(body).expect("json encodes")))
        .expect("valid response")
}

/// One request as the API server saw it.
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
    responder: Option<Responder>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}?{:?} {}",
            self.method, self.path, self.query, self.body
        )
    }
}

impl Call {
    pub(crate) async fn read(request: Request<Body>, responder: Option<Responder>) -> Self {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body readable");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("request body is not JSON ({e}): {bytes:?}"))
        };
        let query = Query::parse(parts.uri.query()).into_map();
        Self {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query,
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
            responder,
        }
    }

    /// Whether this request changes state (anything but GET).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// A query parameter.
    pub fn q(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    /// Answer with `status` and `body`.
    pub fn respond(mut self, status: StatusCode, body: &Value) {
        if let Some(r) = self.responder.take() {
            r.send_response(json_response(status, body));
        }
    }

    /// Answer 200 with `body`.
    pub fn ok(self, body: &Value) {
        self.respond(StatusCode::OK, body);
    }

    /// Answer 200 with the request body itself (what server-side apply returns, near enough).
    pub fn echo(self) {
        let body = self.body.clone();
        self.ok(&body);
    }

    /// Answer a watch with `events`, one JSON line each, then end it (as the API server ends a
    /// watch at its timeout).
    pub fn watch_events(mut self, events: &[Value]) {
        let mut lines = String::new();
        for e in events {
            lines.push_str(&e.to_string());
            lines.push('\n');
        }
        if let Some(r) = self.responder.take() {
            let response = Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(full(lines))
                .expect("valid response");
            r.send_response(response);
        }
    }

    /// Answer with an API error.
    pub fn fail(self, code: u16, reason: &str) {
        let status = StatusCode::from_u16(code).expect("valid code");
        let body = status_body(code, reason, &format!("{reason} (mock)"));
        self.respond(status, &body);
    }
}

/// The strict verifier.
pub struct ApiServerVerifier {
    handle: Handle,
}

impl ApiServerVerifier {
    /// The next request, or a panic naming what was awaited when none comes within
    /// [`CALL_TIMEOUT`].
    pub async fn next(&mut self, awaiting: &str) -> Call {
        match tokio::time::timeout(CALL_TIMEOUT, self.handle.next_request()).await {
            Ok(Some((request, responder))) => Call::read(request, Some(responder)).await,
            Ok(None) => panic!("client gone while awaiting {awaiting}"),
            Err(_) => panic!("no request came while awaiting {awaiting}"),
        }
    }

    /// The next request, asserted to be `method path` with exactly `query`.
    pub async fn expect(&mut self, method: Method, path: &str, query: &[(&str, &str)]) -> Call {
        let call = self.next(&format!("{method} {path}")).await;
        assert_eq!(
            (&call.method, call.path.as_str()),
            (&method, path),
            "unexpected request: {call:?}"
        );
        let want: BTreeMap<String, String> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(call.query, want, "query of {method} {path}");
        call
    }

    /// The next request if one arrives within `within`.
    pub async fn try_next(&mut self, within: Duration) -> Option<Call> {
        match tokio::time::timeout(within, self.handle.next_request()).await {
            Ok(Some((request, responder))) => Some(Call::read(request, Some(responder)).await),
            _ => None,
        }
    }

    /// Assert that no request arrives within `within`.
    pub async fn assert_no_request(&mut self, within: Duration) {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(within, self.handle.next_request()).await
        {
            let call = Call::read(request, None).await;
            panic!("expected no request, got {call:?}");
        }
    }
}

/// Query of a server-side apply by the operator.
pub const SSA: &[(&str, &str)] = &[("fieldManager", "rocefabric-operator"), ("force", "true")];
/// Query of a merge or JSON patch by the operator.
pub const MANAGED: &[(&str, &str)] = &[("fieldManager", "rocefabric-operator")];
