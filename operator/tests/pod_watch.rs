//! The pod watch against a scripted API server: its list reads a page ahead, then it watches
//! from the list's version, resumes from the last one seen, and lists again when the version
//! is gone or a page fails.

use futures::StreamExt;
use http::Method;
use kube::runtime::watcher::Event;
use rocefabric_operator::controller::{Events, pod_watch};
use rocefabric_operator::feed::Seen;
use rocefabric_operator_testing::verifier::{ApiServerVerifier, mock_client};
use serde_json::{Value, json};

mod support;
use support::writes::pod_json;

const PODS: &str = "/api/v1/pods";

/// A pod list page of `names`, with `next` as its continue token.
fn page(names: &[&str], next: Option<&str>, version: &str) -> Value {
    let mut metadata = json!({ "resourceVersion": version });
    if let Some(next) = next {
        metadata["continue"] = json!(next);
    }
    json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": metadata,
        "items": names.iter().map(|n| pod_json(n, &[], false)).collect::<Vec<_>>(),
    })
}

fn event(kind: &str, name: &str, version: &str) -> Value {
    let mut pod = pod_json(name, &[], false);
    pod["metadata"]["resourceVersion"] = json!(version);
    json!({ "type": kind, "object": pod })
}

fn bookmark(version: &str) -> Value {
    json!({ "type": "BOOKMARK", "object": {
        "kind": "Pod", "apiVersion": "v1", "metadata": { "resourceVersion": version },
    }})
}

/// The next event, as a line to compare.
async fn next(pods: &mut Events) -> String {
    match pods.next().await.expect("the pod watch never ends") {
        Ok(Seen::Pod(event)) => match event {
            Event::Init => "init".into(),
            Event::InitApply(p) => format!("listed {}", p.name),
            Event::InitDone => "listed all".into(),
            Event::Apply(p) => format!("apply {}", p.name),
            Event::Delete(p) => format!("delete {}", p.name),
        },
        Ok(_) => panic!("the pod watch sent another kind"),
        Err((resource, error)) => format!("{resource} error: {error}"),
    }
}

/// The list query of a page (`continue` after the first).
fn list<'a>(selector: Option<&'a str>, next: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut q = vec![("limit", "500")];
    q.extend(selector.map(|s| ("labelSelector", s)));
    q.extend(next.map(|t| ("continue", t)));
    q
}

fn watch(version: &str) -> Vec<(&str, &str)> {
    vec![
        ("watch", "true"),
        ("timeoutSeconds", "290"),
        ("allowWatchBookmarks", "true"),
        ("resourceVersion", version),
    ]
}

async fn answer_page(api: &mut ApiServerVerifier, query: Vec<(&str, &str)>, page: Value) {
    api.expect(Method::GET, PODS, &query).await.ok(&page);
}

/// The next event, while the page it asks for (`query`) is answered with `page`.
async fn next_answering(
    pods: &mut Events,
    api: &mut ApiServerVerifier,
    query: Vec<(&str, &str)>,
    page: Value,
) -> String {
    tokio::join!(next(pods), answer_page(api, query, page)).0
}

/// The next event, while the watch it starts (`query`) is answered with `events`.
async fn next_watching(
    pods: &mut Events,
    api: &mut ApiServerVerifier,
    query: &[(&str, &str)],
    events: &[Value],
) -> String {
    let answer = async {
        api.expect(Method::GET, PODS, query)
            .await
            .watch_events(events)
    };
    tokio::join!(next(pods), answer).0
}

#[tokio::test(start_paused = true)]
async fn the_next_page_is_asked_for_before_this_one_is_handed_out_then_the_watch_resumes_from_the_last_version()
 {
    let (client, mut api) = mock_client();
    let mut pods = pod_watch(&client, None);
    assert_eq!(next(&mut pods).await, "init");
    let first = next_answering(
        &mut pods,
        &mut api,
        list(None, None),
        page(&["a", "b"], Some("t1"), "10"),
    )
    .await;
    assert_eq!(first, "listed a");
    // Page 1 is not yet handed out (b is still to come), and page 2 is already asked for.
    answer_page(&mut api, list(None, Some("t1")), page(&["c"], None, "11")).await;
    for want in ["listed b", "listed c", "listed all"] {
        assert_eq!(next(&mut pods).await, want);
    }

    // The watch starts at the last page's version; a bookmark moves it on.
    let seen = next_watching(
        &mut pods,
        &mut api,
        &watch("11"),
        &[event("ADDED", "d", "12"), bookmark("15")],
    )
    .await;
    assert_eq!(seen, "apply d");
    // The server ended the watch: it is resumed from the bookmark's version.
    let seen = next_watching(
        &mut pods,
        &mut api,
        &watch("15"),
        &[event("DELETED", "c", "16")],
    )
    .await;
    assert_eq!(seen, "delete c");

    // 410 Gone: the version is too old to watch from, so everything is listed again.
    let gone = json!({
        "type": "ERROR",
        "object": { "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": 410, "reason": "Expired", "message": "too old resource version: 16 (90)" },
    });
    let seen = next_watching(&mut pods, &mut api, &watch("16"), &[gone]).await;
    assert!(
        seen.contains("pods error") && seen.contains("too old resource version"),
        "{seen}"
    );
    assert_eq!(next(&mut pods).await, "init");
    let seen = next_answering(
        &mut pods,
        &mut api,
        list(None, None),
        page(&["a"], None, "90"),
    )
    .await;
    assert_eq!(seen, "listed a");
    assert_eq!(next(&mut pods).await, "listed all");
}

#[tokio::test(start_paused = true)]
async fn a_page_that_fails_lists_again_from_the_first_page_with_the_selector() {
    let selector = Some("rocefabric.io/fabric");
    let (client, mut api) = mock_client();
    let mut pods = pod_watch(&client, selector);
    assert_eq!(next(&mut pods).await, "init");
    let seen = next_answering(
        &mut pods,
        &mut api,
        list(selector, None),
        page(&["a"], Some("t1"), "10"),
    )
    .await;
    assert_eq!(seen, "listed a");
    // The continue token expired between pages.
    api.expect(Method::GET, PODS, &list(selector, Some("t1")))
        .await
        .fail(410, "Expired");
    let failed = next(&mut pods).await;
    assert!(
        failed.contains("pods error") && failed.contains("Expired"),
        "{failed}"
    );
    assert_eq!(next(&mut pods).await, "init");
    let seen = next_answering(
        &mut pods,
        &mut api,
        list(selector, None),
        page(&["a", "b"], None, "20"),
    )
    .await;
    assert_eq!(seen, "listed a");
    assert_eq!(next(&mut pods).await, "listed b");
    assert_eq!(next(&mut pods).await, "listed all");
    let query = [
        ("watch", "true"),
        ("timeoutSeconds", "290"),
        ("labelSelector", "rocefabric.io/fabric"),
        ("allowWatchBookmarks", "true"),
        ("resourceVersion", "20"),
    ];
    let seen = next_watching(&mut pods, &mut api, &query, &[event("MODIFIED", "b", "21")]).await;
    assert_eq!(seen, "apply b");
}

#[tokio::test(start_paused = true)]
async fn a_page_that_is_not_a_list_is_an_error_and_the_list_starts_again() {
    let (client, mut api) = mock_client();
    let mut pods = pod_watch(&client, None);
    assert_eq!(next(&mut pods).await, "init");
    let not_a_list = json!({ "metadata": { "continue": 7 } });
    let seen = next_answering(&mut pods, &mut api, list(None, None), not_a_list).await;
    assert!(seen.starts_with("pods error"), "{seen}");
    assert_eq!(next(&mut pods).await, "init");
    let seen = next_answering(&mut pods, &mut api, list(None, None), page(&[], None, "3")).await;
    assert_eq!(seen, "listed all");
}
