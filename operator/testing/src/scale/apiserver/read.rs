//! Reads: one object, or a page of a list, as JSON text; metadata-only when the client asks
//! for `PartialObjectMetadata` (the operator's node watch).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::State;
use crate::api::failure::Failure;
use crate::api::resource::Resource;
use crate::api::selector::Selector;

/// Which objects a list or watch wants, and in which form.
#[derive(Clone, Debug)]
pub struct Filter {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub selector: Selector,
    pub meta_only: bool,
}

impl Filter {
    fn wants_namespace(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }

    /// `apiVersion` and `kind` of one item.
    pub fn item_type(&self) -> (&'static str, &'static str) {
        if self.meta_only {
            ("meta.k8s.io/v1", "PartialObjectMetadata")
        } else {
            (self.resource.api_version(), self.resource.kind())
        }
    }

    /// The list's opening, up to the first item.
    pub fn list_open(&self, rv: u64, next: Option<&str>) -> String {
        let (api_version, kind) = self.item_type();
        let mut o = format!(
            r#"{{"apiVersion":"{api_version}","kind":"{kind}List","metadata":{{"resourceVersion":"{rv}""#
        );
        if let Some(next) = next {
            let _ = write!(o, r#","continue":{}"#, json!(next));
        }
        o.push_str(r#"},"items":["#);
        o
    }

    /// An object's JSON in the form asked for.
    pub fn form(&self, json: &str) -> String {
        if self.meta_only {
            meta_form(json)
        } else {
            json.to_string()
        }
    }
}

/// The list's closing.
pub const LIST_CLOSE: &str = "]}";

/// `json` as a `PartialObjectMetadata`.
pub fn meta_form(json: &str) -> String {
    let metadata = serde_json::from_str::<Value>(json)
        .map(|mut v| v["metadata"].take())
        .unwrap_or_default();
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata})
        .to_string()
}

/// Where the next page starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// At this generated object's index.
    Index(u32),
    /// After this stored object's (namespace, name).
    After(String, String),
}

impl Cursor {
    /// The `continue` token: the list's resourceVersion and the cursor.
    pub fn encode(&self, rv: u64) -> String {
        match self {
            Cursor::Index(i) => format!("{rv}:i:{i}"),
            Cursor::After(ns, name) => format!("{rv}:k:{ns}/{name}"),
        }
    }

    pub fn decode(token: &str) -> Option<(u64, Cursor)> {
        let (rv, rest) = token.split_once(':')?;
        let cursor = match rest.split_once(':')? {
            ("i", i) => Cursor::Index(i.parse().ok()?),
            ("k", key) => {
                let (ns, name) = key.split_once('/')?;
                Cursor::After(ns.to_string(), name.to_string())
            }
            _ => return None,
        };
        Some((rv.parse().ok()?, cursor))
    }
}

/// A page of items, comma-separated, and where the next one starts.
#[derive(Debug, Default)]
pub struct Page {
    pub items: String,
    pub count: usize,
    pub next: Option<Cursor>,
}

impl Page {
    fn push(&mut self, item: &str) {
        if self.count > 0 {
            self.items.push(',');
        }
        self.items.push_str(item);
        self.count += 1;
    }
}

impl State {
    /// Up to `limit` items of `filter` from `from`.
    pub fn page(&self, filter: &Filter, from: Option<Cursor>, limit: usize) -> Page {
        let mut page = Page::default();
        match filter.resource {
            Resource::Pods | Resource::Nodes => {
                let start = match from {
                    Some(Cursor::Index(i)) => i as usize,
                    _ => 0,
                };
                let len = match filter.resource {
                    Resource::Pods => self.pods.states.len(),
                    _ => self.nodes.states.len(),
                };
                for i in start..len {
                    let i32 = u32::try_from(i).unwrap_or(u32::MAX);
                    let Some(item) = self.generated(filter, i32) else {
                        continue;
                    };
                    if page.count == limit {
                        page.next = Some(Cursor::Index(i32));
                        break;
                    }
                    page.push(&item);
                }
            }
            resource => {
                let after = match from {
                    Some(Cursor::After(ns, name)) => Some((ns, name)),
                    _ => None,
                };
                let mut items = self
                    .objects
                    .iter_from(resource, filter.namespace.as_deref(), after)
                    .filter(|(_, s)| filter.selector.matches(&s.labels))
                    .peekable();
                while let Some((key, stored)) = items.next() {
                    page.push(&filter.form(&stored.json));
                    if page.count == limit && items.peek().is_some() {
                        page.next = Some(Cursor::After(key.1.clone(), key.2.clone()));
                        break;
                    }
                }
            }
        }
        page
    }

    /// Generated pod or node `i` if `filter` wants it.
    fn generated(&self, filter: &Filter, i: u32) -> Option<String> {
        match filter.resource {
            Resource::Pods => {
                let st = &self.pods.states[i as usize];
                if st.deleted
                    || (filter.namespace.is_some()
                        && !filter.wants_namespace(&self.cluster.namespace(i)))
                    || (!filter.selector.is_empty()
                        && !filter.selector.matches(&self.cluster.pod_labels(i, st)))
                {
                    return None;
                }
                Some(filter.form(&self.cluster.pod_json(i, st)))
            }
            _ => {
                let st = &self.nodes.states[i as usize];
                if !filter.selector.is_empty()
                    && !filter.selector.matches(&self.cluster.node_labels(i, st))
                {
                    return None;
                }
                Some(self.cluster.node_json(i, st, filter.meta_only))
            }
        }
    }

    /// One object.
    pub fn get_one(
        &self,
        filter: &Filter,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, Failure> {
        let missing = || Failure::not_found(&format!("{} {name}", filter.resource.plural()));
        match filter.resource {
            Resource::Pods => {
                let i = self
                    .pods
                    .find(&self.cluster, namespace.unwrap_or_default(), name)
                    .ok_or_else(missing)?;
                Ok(filter.form(&self.cluster.pod_json(i, &self.pods.states[i as usize])))
            }
            Resource::Nodes => {
                let i = self.cluster.node_index(name).ok_or_else(missing)?;
                Ok(self
                    .cluster
                    .node_json(i, &self.nodes.states[i as usize], filter.meta_only))
            }
            resource => {
                let key = (
                    resource,
                    namespace.unwrap_or_default().to_string(),
                    name.to_string(),
                );
                let stored = self.objects.get(&key).ok_or_else(missing)?;
                Ok(filter.form(&stored.json))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        for c in [
            Cursor::Index(500),
            Cursor::After("team-0001".into(), "scale-regions".into()),
            Cursor::After(String::new(), "gpu-000001".into()),
        ] {
            assert_eq!(Cursor::decode(&c.encode(42)), Some((42, c)));
        }
        assert_eq!(Cursor::decode("nonsense"), None);
    }

    #[test]
    fn metadata_form_keeps_only_metadata() {
        let m: Value = serde_json::from_str(&meta_form(
            r#"{"kind":"Node","metadata":{"name":"a"},"status":{}}"#,
        ))
        .unwrap();
        assert_eq!(
            m,
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": "a"}})
        );
    }
}
