//! Labels as the planner holds them: a sorted slice of interned key and value pairs, so a label
//! every node carries (`kubernetes.io/os: linux`) is one string shared by all, and an object's
//! labels are one allocation instead of a `BTreeMap` of two heap strings per entry.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use kube::core::{Expression, Selector};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// An interned string.
pub type Sym = Arc<str>;

/// The strings interned so far; entries nobody else holds are dropped when the set has doubled
/// since the last sweep, so deleted objects' strings go too.
struct Interner {
    set: HashSet<Sym>,
    sweep_at: usize,
}

static INTERNER: Mutex<Option<Interner>> = Mutex::new(None);

/// The shared copy of `s`.
pub fn intern(s: &str) -> Sym {
    with_interner(|interner| interner.get(s))
}

/// The shared copies of each key and value: the lock taken once for them all (an object's
/// labels come a few dozen at a time, a large cluster's objects by the hundred thousand).
fn intern_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<(Sym, Sym)> {
    with_interner(|interner| {
        pairs
            .map(|(k, v)| (interner.get(k), interner.get(v)))
            .collect()
    })
}

fn with_interner<T>(f: impl FnOnce(&mut Interner) -> T) -> T {
    let mut guard = INTERNER.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(|| Interner {
        set: HashSet::new(),
        sweep_at: 1024,
    }))
}

impl Interner {
    fn get(&mut self, s: &str) -> Sym {
        if let Some(sym) = self.set.get(s) {
            return sym.clone();
        }
        if self.set.len() >= self.sweep_at {
            self.set.retain(|s| Arc::strong_count(s) > 1);
            self.set.shrink_to_fit();
            self.sweep_at = (self.set.len() * 2).max(1024);
        }
        let sym: Sym = Arc::from(s);
        self.set.insert(sym.clone());
        sym
    }
}

/// An object's labels, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Sym, Sym)]>);

impl Labels {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keep only the labels whose key `keep` accepts (the rest of a tenant's labels are not the
    /// planner's to hold).
    pub fn retain_keys(&mut self, keep: impl Fn(&str) -> bool) {
        if self.0.iter().all(|(k, _)| keep(k)) {
            return;
        }
        let mut pairs = std::mem::take(&mut self.0).into_vec();
        pairs.retain(|(k, _)| keep(k));
        self.0 = pairs.into_boxed_slice();
    }

    /// Set label `key` (tests and what-ifs).
    pub fn insert(&mut self, key: &str, value: &str) {
        let mut pairs = std::mem::take(&mut self.0).into_vec();
        pairs.retain(|(k, _)| &**k != key);
        pairs.push((intern(key), intern(value)));
        *self = Self::from_pairs(pairs);
    }

    fn from_pairs(mut pairs: Vec<(Sym, Sym)>) -> Self {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        // A key given twice: the last one wins, as in a map.
        pairs.reverse();
        pairs.dedup_by(|a, b| a.0 == b.0);
        pairs.reverse();
        Self(pairs.into_boxed_slice())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let pairs: Vec<(K, V)> = iter.into_iter().collect();
        Self::from_pairs(intern_pairs(
            pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())),
        ))
    }
}

impl From<Option<&BTreeMap<String, String>>> for Labels {
    fn from(map: Option<&BTreeMap<String, String>>) -> Self {
        map.map(|m| m.iter().collect()).unwrap_or_default()
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label keys to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
                let mut texts = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(pair) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    texts.push(pair);
                }
                let pairs = intern_pairs(texts.iter().map(|(k, v)| (&*k.0, &*v.0)));
                Ok(Labels::from_pairs(pairs))
            }
        }
        d.deserialize_map(V)
    }
}

/// A string read borrowed where the input allows it (no copy before interning).
pub(crate) struct Text<'de>(pub std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(v.to_string().into()))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(v.into()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A parsed label selector that matches [`Labels`] (kube's `Selector` matches only a
/// `BTreeMap`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matcher(Vec<Expression>);

impl From<Selector> for Matcher {
    fn from(s: Selector) -> Self {
        Self(s.into_iter().collect())
    }
}

impl Matcher {
    /// Whether every expression holds for `labels`.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|e| match e {
            Expression::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Expression::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Expression::Exists(key) => labels.contains_key(key),
            Expression::DoesNotExist(key) => !labels.contains_key(key),
            Expression::Equal(key, value) => labels.get(key) == Some(value.as_str()),
            Expression::NotEqual(key, value) => labels.get(key) != Some(value.as_str()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::core::SelectorExt;

    #[test]
    fn labels_decode_sorted_and_interned() {
        let a: Labels = serde_json::from_str(r#"{"b": "x", "a": "linux"}"#).expect("labels");
        let b: Labels = serde_json::from_str(r#"{"a": "linux"}"#).expect("labels");
        assert_eq!(a.iter().collect::<Vec<_>>(), [("a", "linux"), ("b", "x")]);
        assert_eq!(a.get("b"), Some("x"));
        assert_eq!(a.get("c"), None);
        assert!(Arc::ptr_eq(&a.0[0].1, &b.0[0].1), "one shared copy");
    }

    #[test]
    fn a_matcher_agrees_with_kube_selectors() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "train"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "gone", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["z"]}]
        }))
        .expect("selector");
        let selector = Selector::try_from(sel).expect("parses");
        let matcher = Matcher::from(selector.clone());
        for labels in [
            vec![("app", "train"), ("tier", "a")],
            vec![("app", "train"), ("tier", "c")],
            vec![("app", "train"), ("tier", "b"), ("gone", "1")],
            vec![("app", "train"), ("tier", "b"), ("zone", "z")],
            vec![("app", "serve"), ("tier", "a")],
        ] {
            let map: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let compact: Labels = labels.iter().copied().collect();
            assert_eq!(
                matcher.matches(&compact),
                selector.matches(&map),
                "{labels:?}"
            );
        }
    }
}
