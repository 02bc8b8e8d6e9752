//! A watch whose list reads ahead: the next page is asked for as soon as a page's `continue`
//! token is known, so the API server renders page N+1 while this process decodes page N.
//!
//! kube's `watcher` asks for a page only once the last one is decoded and handed out, so the
//! two sides take turns: listing 1,000,000 pods is 2,000 round trips in which one side waits.
//! Otherwise this is kube's list-then-watch, with the same events and errors, so
//! `default_backoff` and the feed take it unchanged: `Init`, an `InitApply` per object and
//! `InitDone`; then a watch from the list's resourceVersion with bookmarks, resumed from the
//! last version seen when it ends or fails, and a new list on 410 Gone (or when a page cannot
//! be read: a `continue` token too old is one).

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use tokio::sync::mpsc;

use crate::objects::{Compact, Wire};

/// Objects per page: client-go's and kube's default.
const PAGE: u32 = 500;
/// Pages read ahead of the one being decoded (each held as text, about 1 MiB for pods).
const AHEAD: usize = 2;

/// The objects of kind `T` (matching `selector` when given), listed then watched.
pub fn read_ahead_watcher<T>(
    client: Client,
    selector: Option<String>,
) -> impl Stream<Item = Result<Event<T>, watcher::Error>> + Send + 'static
where
    T: Compact + Send + 'static,
{
    async_stream::stream! {
        let api = Api::<Wire<T>>::all(client.clone());
        let mut list = ListParams::default().limit(PAGE);
        let mut watch = WatchParams::default();
        if let Some(selector) = &selector {
            list = list.labels(selector);
            watch = watch.labels(selector);
        }
        'list: loop {
            yield Ok(Event::Init);
            let mut pages = Pager::start::<T>(client.clone(), list.clone());
            let mut version = None;
            while let Some(page) = pages.next().await {
                let page = match page {
                    Ok(page) => page,
                    Err(error) => {
                        yield Err(watcher::Error::InitialListFailed(error));
                        continue 'list;
                    }
                };
                let decoded = serde_json::from_str::<Page<T>>(&page)
                    .map_err(|e| watcher::Error::InitialListFailed(kube::Error::SerdeError(e)));
                match decoded {
                    Ok(decoded) => {
                        // The list's version is the last page's: a list cut short (its pager
                        // gone) has none, and is listed again.
                        let last = decoded.metadata.continue_.as_ref().is_none_or(String::is_empty);
                        version = last
                            .then_some(decoded.metadata.resource_version)
                            .flatten()
                            .filter(|v| !v.is_empty());
                        for item in decoded.items.unwrap_or_default() {
                            yield Ok(Event::InitApply(item.object));
                        }
                    }
                    Err(error) => {
                        yield Err(error);
                        continue 'list;
                    }
                }
            }
            let Some(mut version) = version else {
                yield Err(watcher::Error::NoResourceVersion);
                continue 'list;
            };
            yield Ok(Event::InitDone);
            loop {
                let events = match api.watch(&watch, &version).await {
                    Ok(events) => events,
                    Err(error) => {
                        yield Err(watcher::Error::WatchStartFailed(error));
                        continue;
                    }
                };
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    let (object, deleted) = match event {
                        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => (o, false),
                        Ok(WatchEvent::Deleted(o)) => (o, true),
                        Ok(WatchEvent::Bookmark(b)) => {
                            version = b.metadata.resource_version;
                            continue;
                        }
                        Ok(WatchEvent::Error(status)) => {
                            let gone = status.code == 410;
                            yield Err(watcher::Error::WatchError(status));
                            if gone {
                                tracing::debug!(resource = %T::Full::plural(&()), "watch expired; listing again");
                                continue 'list;
                            }
                            continue;
                        }
                        Err(error) => {
                            yield Err(watcher::Error::WatchFailed(error));
                            continue;
                        }
                    };
                    match object.resource_version().filter(|v| !v.is_empty()) {
                        Some(v) => version = v,
                        None => {
                            yield Err(watcher::Error::NoResourceVersion);
                            continue 'list;
                        }
                    }
                    yield Ok(if deleted {
                        Event::Delete(object.object)
                    } else {
                        Event::Apply(object.object)
                    });
                }
            }
        }
    }
}

/// A page as decoded: its metadata and items (`null` when none, as some servers send).
#[derive(Deserialize)]
#[serde(bound = "T: Compact")]
struct Page<T> {
    #[serde(default)]
    metadata: ListMeta,
    items: Option<Vec<Wire<T>>>,
}

/// The pages of one list, as text, fetched by a task of their own up to [`AHEAD`] pages ahead
/// of the reader. Dropping it stops the task.
struct Pager {
    pages: mpsc::Receiver<Result<String, kube::Error>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a page request is made of.
struct List {
    client: Client,
    request: kube::core::Request,
    /// Metadata only (`PartialObjectMetadataList`).
    metadata: bool,
    params: ListParams,
}

impl Pager {
    fn start<T: Compact>(client: Client, params: ListParams) -> Self {
        let (tx, pages) = mpsc::channel(AHEAD);
        let list = List {
            client,
            request: kube::core::Request::new(T::Full::url_path(&(), None)),
            metadata: T::METADATA_ONLY,
            params,
        };
        let task = tokio::spawn(fetch_pages(list, tx));
        Self { pages, task }
    }

    /// The next page; `None` after the last one (or after an error).
    async fn next(&mut self) -> Option<Result<String, kube::Error>> {
        self.pages.recv().await
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn fetch_pages(mut list: List, tx: mpsc::Sender<Result<String, kube::Error>>) {
    loop {
        let page = fetch_page(&list).await;
        let next = match &page {
            Ok((_, next)) => next.clone(),
            Err(_) => None,
        };
        if tx.send(page.map(|(text, _)| text)).await.is_err() {
            return; // the reader is gone
        }
        match next {
            Some(token) => list.params.continue_token = Some(token),
            None => return,
        }
    }
}

/// One page's text and the token of the next page, if any.
async fn fetch_page(list: &List) -> Result<(String, Option<String>), kube::Error> {
    let mut http = if list.metadata {
        list.request.list_metadata(&list.params)
    } else {
        list.request.list(&list.params)
    }
    .map_err(kube::Error::BuildRequest)?;
    http.extensions_mut().insert("list");
    let text = list.client.request_text(http).await?;
    let next = continue_token(&text)
        .map_err(kube::Error::SerdeError)?
        .filter(|t| !t.is_empty());
    Ok((text, next))
}

/// A list's `metadata.continue`, read without parsing its items: the API server writes
/// `metadata` before `items`, and reading stops at `metadata`. (A list with `items` first is
/// still read right, skipping them.)
fn continue_token(list: &str) -> Result<Option<String>, serde_json::Error> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_str(list);
    let walked = de::Deserializer::deserialize_map(&mut de, Head(&mut found));
    match found {
        Some(meta) => Ok(meta.continue_),
        // The walk stops early on purpose once `metadata` is read, which serde_json reports as
        // an error; an error before that is the list's.
        None => walked.map(|()| None),
    }
}

/// Reads top-level fields until `metadata`, which it keeps.
struct Head<'a>(&'a mut Option<ListMeta>);

impl<'de> Visitor<'de> for Head<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "metadata" {
                *self.0 = Some(map.next_value()?);
                return Ok(());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continue_token_is_read_from_metadata_before_or_after_the_items() {
        let first = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"abc"},"items":[{"x":1}]}"#;
        assert_eq!(continue_token(first).unwrap().as_deref(), Some("abc"));
        let last = r#"{"items":[{"x":"}"}],"metadata":{"continue":"d\"e"}}"#;
        assert_eq!(continue_token(last).unwrap().as_deref(), Some("d\"e"));
        let none = r#"{"metadata":{"resourceVersion":"7"},"items":[]}"#;
        assert_eq!(continue_token(none).unwrap(), None);
        assert_eq!(continue_token(r#"{"items":[]}"#).unwrap(), None);
    }

    #[test]
    fn a_list_that_is_not_json_is_an_error_not_a_last_page() {
        for bad in [
            "",
            "[1]",
            r#"{"items":[1,}"#,
            r#"{"metadata":{"continue":3}}"#,
        ] {
            assert!(continue_token(bad).is_err(), "{bad:?}");
        }
    }
}
