//! Watches: chunked JSON lines from the change log after the asked-for resourceVersion,
//! filtered by resource, namespace and label selector; a BOOKMARK now and then (when asked
//! for) so that a watch whose objects rarely change resumes from a recent resourceVersion; the
//! stream ends after `timeoutSeconds`, and a resourceVersion older than the log holds gets a
//! 410 ERROR event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Shared;
use super::changes::{Change, ChangeType};
use super::read::Filter;

/// Longest quiet stretch before a bookmark.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// Changes read per lock.
const BATCH: usize = 2048;

impl Filter {
    /// The event line `change` makes for this watch, if any.
    fn line(&self, change: &Change) -> Option<String> {
        if change.resource != self.resource
            || self
                .namespace
                .as_deref()
                .is_some_and(|ns| change.namespace.as_deref() != Some(ns))
        {
            return None;
        }
        let now = self.selector.matches(&change.labels);
        let before = change
            .labels_before
            .as_ref()
            .map_or(now, |l| self.selector.matches(l));
        let kind = match (change.kind, before, now) {
            (ChangeType::Added, _, true) | (ChangeType::Modified, false, true) => "ADDED",
            (ChangeType::Modified, true, true) => "MODIFIED",
            (ChangeType::Modified, true, false) | (ChangeType::Deleted, true, _) => "DELETED",
            _ => return None,
        };
        Some(format!(
            "{{\"type\":\"{kind}\",\"object\":{}}}\n",
            self.form(&change.object)
        ))
    }

    fn bookmark(&self, rv: u64) -> String {
        let (api_version, kind) = self.item_type();
        format!(
            "{{\"type\":\"BOOKMARK\",\"object\":{{\"apiVersion\":\"{api_version}\",\"kind\":\"{kind}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}}}}}}\n"
        )
    }
}

const GONE: &str = "{\"type\":\"ERROR\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Status\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version\",\"reason\":\"Expired\",\"code\":410}}\n";

type Sender = mpsc::Sender<Result<Bytes, Infallible>>;

/// What one watch asks for.
pub struct Watch {
    pub filter: Filter,
    /// The resourceVersion it resumes after.
    pub from: u64,
    /// When the stream ends (`timeoutSeconds`).
    pub timeout: Duration,
    /// Send bookmarks (`allowWatchBookmarks`).
    pub bookmarks: bool,
}

/// Serve one watch into `tx` until the client goes, the timeout passes, or the history it
/// needs is gone.
pub async fn serve(shared: Arc<Shared>, watch: Watch, tx: Sender) {
    let Watch {
        filter,
        from,
        timeout,
        bookmarks,
    } = watch;
    let deadline = Instant::now() + timeout;
    let mut latest = shared.latest.clone();
    let (mut cursor, mut marked) = (from, from);
    let mut last_sent = Instant::now();
    loop {
        latest.borrow_and_update();
        let mut chunk = String::new();
        let mut more = false;
        let gone = {
            let st = shared.lock();
            match st.log.since(cursor) {
                Err(_) => true,
                Ok(changes) => {
                    for (n, change) in changes.enumerate() {
                        if n == BATCH {
                            more = true;
                            break;
                        }
                        if let Some(line) = filter.line(change) {
                            chunk.push_str(&line);
                        }
                        cursor = change.rv;
                    }
                    false
                }
            }
        };
        if gone {
            let _ = tx.send(Ok(Bytes::from_static(GONE.as_bytes()))).await;
            return;
        }
        if !chunk.is_empty() {
            if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                return;
            }
            (marked, last_sent) = (cursor, Instant::now());
        }
        if more {
            continue;
        }
        if bookmarks && cursor > marked && last_sent.elapsed() >= BOOKMARK_EVERY {
            if tx
                .send(Ok(Bytes::from(filter.bookmark(cursor))))
                .await
                .is_err()
            {
                return;
            }
            (marked, last_sent) = (cursor, Instant::now());
        }
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(BOOKMARK_EVERY), if bookmarks => {}
            () = tokio::time::sleep_until(deadline) => {
                if bookmarks && cursor > marked {
                    let _ = tx.send(Ok(Bytes::from(filter.bookmark(cursor)))).await;
                }
                return;
            }
            () = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resource::Resource;
    use crate::api::selector::Selector;
    use crate::api::store::Labels;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Arc::new(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn kind_of(filter: &Filter, change: &Change) -> Option<String> {
        let line = filter.line(change)?;
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        Some(v["type"].as_str().unwrap().to_string())
    }

    #[test]
    fn a_selector_watch_sees_objects_enter_and_leave() {
        let filter = Filter {
            resource: Resource::Pods,
            namespace: None,
            selector: Selector::parse("rocefabric.io/fabric").unwrap(),
            meta_only: false,
        };
        let change = |kind, before: Option<&[(&str, &str)]>, after: &[(&str, &str)]| Change {
            rv: 2,
            resource: Resource::Pods,
            kind,
            namespace: Some("ns".into()),
            labels_before: before.map(labels),
            labels: labels(after),
            object: "{}".into(),
        };
        let fab: &[(&str, &str)] = &[("rocefabric.io/fabric", "x")];
        let plain: &[(&str, &str)] = &[("app", "web")];
        let cases = [
            (change(ChangeType::Added, None, fab), Some("ADDED")),
            (change(ChangeType::Added, None, plain), None),
            (
                change(ChangeType::Modified, Some(fab), fab),
                Some("MODIFIED"),
            ),
            (
                change(ChangeType::Modified, Some(plain), fab),
                Some("ADDED"),
            ),
            (
                change(ChangeType::Modified, Some(fab), plain),
                Some("DELETED"),
            ),
            (change(ChangeType::Modified, Some(plain), plain), None),
            (change(ChangeType::Deleted, Some(fab), fab), Some("DELETED")),
        ];
        for (c, want) in cases {
            assert_eq!(kind_of(&filter, &c).as_deref(), want, "{c:?}");
        }
        let other = Filter {
            resource: Resource::Nodes,
            ..filter
        };
        assert_eq!(kind_of(&other, &change(ChangeType::Added, None, fab)), None);
    }
}
