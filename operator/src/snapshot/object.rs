//! One object as it is added to a snapshot: a List is taken apart, an object identified
//! (kind, names as the API server checks them), a second copy of one told apart from a
//! conflicting one, and the object kept, cut to what the planner reads.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rocefabric_api::RoceFabric;
use rocefabric_api::structural::{dns_label, dns_subdomain};
use rocefabric_api::validate::{self, FieldError};
use rocefabric_input::shown;
use rocefabric_input::yaml;
use serde_json::{Map, Value};

use crate::objects::{CompactNode, CompactPod, CompactRoceNode};

use super::{InvalidFabric, Kind, MAX_NOTES, Snapshot, SnapshotError};

/// A place in a file: `top level`, `document 2`, `item 7`, `document 2, item 7`. Its text is
/// made only when it is shown: every object has one, few are ever named.
#[derive(Clone, Copy, Debug)]
pub(super) struct Place<'a> {
    within: &'a str,
    item: Option<usize>,
}

impl<'a> Place<'a> {
    pub(super) fn at(place: &'a str) -> Self {
        Place {
            within: place,
            item: None,
        }
    }

    /// Item `i` of the List at `within` (`""`: of the file's top-level List).
    pub(super) fn item(within: &'a str, i: usize) -> Self {
        Place {
            within,
            item: Some(i),
        }
    }

    /// The place naming the object found there.
    fn naming(self, kind: &str, name: &str) -> String {
        format!("{self} ({} {})", shown(kind), shown(name))
    }
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.within, self.item) {
            (within, None) => f.write_str(within),
            ("", Some(i)) => write!(f, "item {i}"),
            (within, Some(i)) => write!(f, "{within}, item {i}"),
        }
    }
}

/// Where an object was first seen, kept for each object to name it if a second copy comes.
#[derive(Clone, Debug)]
pub(super) struct Origin {
    path: Arc<Path>,
    /// A [`Place`], owned (`within` is empty, and allocates nothing, for a List's items).
    within: Box<str>,
    item: Option<usize>,
}

impl Origin {
    fn place(&self) -> Place<'_> {
        Place {
            within: &self.within,
            item: self.item,
        }
    }
}

/// An object identified by its metadata, not yet kept.
struct Identified<'p> {
    kind: Kind,
    /// `namespace/name` of namespaced kinds, else the name (`<unnamed>` without one): what
    /// tells two objects apart.
    key: String,
    place: Place<'p>,
    /// Whether `metadata.name` was given (an unnamed object is never a second copy).
    named: bool,
}

impl Identified<'_> {
    /// `metadata.name`, or `<unnamed>`: the key less its namespace (which names refuse, as
    /// namespaced objects need one).
    fn name(&self) -> &str {
        match (self.kind.namespaced(), self.key.split_once('/')) {
            (true, Some((_, name))) => name,
            _ => &self.key,
        }
    }

    /// The place in the file, naming the object.
    fn place(&self) -> String {
        self.place.naming(self.kind.as_str(), self.name())
    }
}

fn object_error(path: &Path, place: &str, reason: String) -> SnapshotError {
    SnapshotError::Object {
        path: path.to_path_buf(),
        place: place.to_string(),
        reason,
    }
}

/// Identify `value` read at `place` of `path`: its kind must be one of `accept`, and its names
/// as the API server requires (a fabric's are checked by its own validation).
fn identify<'p>(
    value: &Value,
    kind: &str,
    path: &Path,
    place: Place<'p>,
    accept: &[Kind],
) -> Result<Identified<'p>, SnapshotError> {
    let name = metadata(value, "name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let namespace = metadata(value, "namespace").and_then(Value::as_str);
    let Some(k) = Kind::parse(kind).filter(|k| accept.contains(k)) else {
        let expected = accept
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(object_error(
            path,
            &place.naming(kind, name),
            format!("expected {expected}, found kind \"{}\"", shown(kind)),
        ));
    };
    if k != Kind::RoceFabric {
        // Fabrics are checked (name included) by their own validation, in `keep`.
        check_names(value, k).map_err(|e| object_error(path, &place.naming(kind, name), e))?;
    }
    let key = match (namespace, k.namespaced()) {
        (Some(ns), true) => format!("{ns}/{name}"),
        _ => name.to_string(),
    };
    Ok(Identified {
        kind: k,
        key,
        place,
        named: metadata(value, "name").is_some(),
    })
}

impl Snapshot {
    /// The top-level object of a document, once its `items` (if any) were added: a List's own
    /// fields (whose `metadata.continue` ends or goes on a page, while one is loaded), or one
    /// object.
    pub(super) fn top_level(
        &mut self,
        fields: Map<String, Value>,
        items: bool,
        path: &Path,
        place: Place<'_>,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        if let Some((_, token)) = &mut self.page {
            *token = fields
                .get("metadata")
                .and_then(|m| m.get("continue"))
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        let kind = fields
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match items {
            true if !kind.ends_with("List") => Err(object_error(
                path,
                &place.to_string(),
                format!("`items` in an object of kind {:?}, not a List", shown(kind)),
            )),
            true => Ok(()),
            false => self.add(Value::Object(fields), path, place, accept),
        }
    }

    /// Add `value` read at `place` of `path`: a List's items one by one, or one object of a
    /// kind in `accept`.
    pub(super) fn add(
        &mut self,
        value: Value,
        path: &Path,
        place: Place<'_>,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        // An API list's items carry no `kind`: the page's kind is theirs.
        let page = self.page.as_ref().map(|(k, _)| k.as_str());
        let Some(kind) = value.get("kind").and_then(Value::as_str).or(page) else {
            return Err(object_error(
                path,
                &place.to_string(),
                "object has no `kind`".into(),
            ));
        };
        if kind.ends_with("List") {
            let kind = kind.to_string();
            let Value::Object(mut map) = value else {
                unreachable!("an object has a kind")
            };
            let within = place.to_string();
            let Some(Value::Array(items)) = map.remove("items") else {
                return Err(object_error(
                    path,
                    &within,
                    format!("{} has no `items` list", shown(&kind)),
                ));
            };
            for (i, item) in items.into_iter().enumerate() {
                self.add(item, path, Place::item(&within, i), accept)?;
            }
            return Ok(());
        }
        let mut id = identify(&value, kind, path, place, accept)?;
        // Looked up with the key it will be kept under, not a copy of it.
        let probe = (id.kind, std::mem::take(&mut id.key));
        let first = self.seen.get(&probe).filter(|_| id.named).cloned();
        id.key = probe.1;
        match first {
            Some((first, kept)) => self.again(&id, value, &first, kept, path),
            None => self.keep(id, value, path),
        }
    }

    /// Keep an object seen for the first time, typed and cut to what the planner reads; a
    /// fabric the API server would reject is kept as its errors.
    fn keep(&mut self, id: Identified<'_>, value: Value, path: &Path) -> Result<(), SnapshotError> {
        let k = id.kind;
        // An unreadable fabric keeps no copy to compare a second one with: a digest of it does.
        let raw = (k == Kind::RoceFabric).then(|| digest(&value));
        let index = Kept::Index(match k {
            Kind::RoceFabric => self.fabrics.len(),
            Kind::Node => self.nodes.len(),
            Kind::Pod => self.pods.len(),
            Kind::RoceNode => self.roce_nodes.len(),
            Kind::ConfigMap => self.config_maps.len(),
        });
        let unreadable = self.unreadable_fabrics.len();
        let origin = Origin {
            path: self.shared_path(path),
            within: id.place.within.into(),
            item: id.place.item,
        };
        self.seen.insert((k, id.key.clone()), (origin, index));
        let typed = |e: yaml::TypeError| object_error(path, &id.place(), e.to_string());
        match k {
            Kind::RoceFabric => self.keep_fabric(id.name().to_string(), value),
            Kind::Node => {
                let node: CompactNode = quick_typed(value).map_err(typed)?;
                self.nodes.push(node);
            }
            Kind::Pod => {
                let pod: CompactPod = quick_typed(value).map_err(typed)?;
                self.pods.push(pod);
            }
            Kind::RoceNode => {
                let rn: CompactRoceNode = quick_typed(value).map_err(typed)?;
                self.roce_nodes.push(rn);
            }
            Kind::ConfigMap => self.config_maps.push(yaml::typed(value).map_err(typed)?),
        }
        if self.unreadable_fabrics.len() > unreadable
            && let (Some(entry), Some(raw)) = (self.seen.get_mut(&(k, id.key.clone())), raw)
        {
            entry.1 = Kept::Digest(raw);
        }
        Ok(())
    }

    /// A fabric, checked as given: unknown fields, duplicates and the apiVersion would be lost
    /// by reading it as a RoceFabric first.
    fn keep_fabric(&mut self, name: String, value: Value) {
        match validate::fabric_value(&value) {
            Err(invalid) => self.unreadable_fabrics.push(InvalidFabric {
                name,
                errors: invalid.errors,
            }),
            Ok(()) => match yaml::typed::<RoceFabric>(value) {
                Ok(f) => self.fabrics.push(f),
                Err(e) => self.unreadable_fabrics.push(InvalidFabric {
                    name,
                    errors: vec![FieldError {
                        field: e.path,
                        message: e.message,
                    }],
                }),
            },
        }
    }

    /// `path`, shared by the objects read from it: the same file's path is made once.
    fn shared_path(&mut self, path: &Path) -> Arc<Path> {
        match &self.last_path {
            Some(shared) if **shared == *path => shared.clone(),
            _ => self.last_path.insert(Arc::from(path)).clone(),
        }
    }

    /// An object seen before (first at `first`, kept as `kept`): the same copy is noted and
    /// counted once; a different one (another uid or content) is an error naming both places.
    fn again(
        &mut self,
        id: &Identified<'_>,
        value: Value,
        first: &Origin,
        kept: Kept,
        path: &Path,
    ) -> Result<(), SnapshotError> {
        fn same<T: serde::de::DeserializeOwned + PartialEq>(
            kept: Option<&T>,
            value: Value,
            trim: impl FnOnce(&mut T),
        ) -> bool {
            yaml::typed::<T>(value).ok().is_some_and(|mut t| {
                trim(&mut t);
                kept == Some(&t)
            })
        }
        /// For types without `PartialEq` (the derived custom resources).
        fn same_json<T: serde::de::DeserializeOwned + serde::Serialize>(
            kept: Option<&T>,
            value: Value,
        ) -> bool {
            let kept = kept.and_then(|k| serde_json::to_value(k).ok());
            yaml::typed::<T>(value)
                .ok()
                .and_then(|t| serde_json::to_value(t).ok())
                .is_some_and(|t| kept == Some(t))
        }
        let i = match kept {
            Kept::Index(i) => i,
            Kept::Digest(_) => usize::MAX,
        };
        let same = match id.kind {
            _ if matches!(kept, Kept::Digest(_)) => kept == Kept::Digest(digest(&value)),
            Kind::RoceFabric => same_json(self.fabrics.get(i), value),
            Kind::Pod => same(self.pods.get(i), value, |_| ()),
            Kind::Node => same(self.nodes.get(i), value, |_| ()),
            Kind::RoceNode => same(self.roce_nodes.get(i), value, |_| ()),
            Kind::ConfigMap => same(self.config_maps.get(i), value, |_| ()),
        };
        let what = format!("{} {}", id.kind.as_str(), shown(&id.key));
        let place = id.place();
        let here = format!("{} {place}", path.display());
        let first = format!(
            "{} {}",
            first.path.display(),
            first.place().naming(id.kind.as_str(), id.name())
        );
        if !same {
            return Err(object_error(
                path,
                &place,
                format!("{what} was already given, with other contents, at {first}: give one copy"),
            ));
        }
        if self.notes.len() < MAX_NOTES {
            self.notes.push(format!(
                "{what} is given twice ({first}; {here}): counted once"
            ));
        } else {
            self.notes_left_out += 1;
        }
        Ok(())
    }
}

/// `value` as a `T`, read from a borrow first: tracking the path of each field (for an error to
/// name it) is most of a typed read's cost, so only a value that does not read is read again,
/// with its path.
fn quick_typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, yaml::TypeError> {
    match T::deserialize(&value) {
        Ok(t) => Ok(t),
        Err(_) => yaml::typed(value),
    }
}

/// What is kept of an object seen once, to tell a second copy apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kept {
    /// Its index in the list of its kind.
    Index(usize),
    /// A digest of its text (a fabric that could not be read, kept only as errors).
    Digest(u64),
}

fn digest(value: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut h);
    h.finish()
}

/// `metadata.<field>` of `value` (not `Value::pointer`, which allocates each step of its path).
fn metadata<'a>(value: &'a Value, field: &str) -> Option<&'a Value> {
    value.get("metadata")?.get(field)
}

/// `metadata.name` (and `metadata.namespace` of namespaced kinds) as the API server requires.
fn check_names(value: &Value, kind: Kind) -> Result<(), String> {
    let field = |f: &str| metadata(value, f).and_then(Value::as_str);
    let name = field("name").ok_or("metadata.name: Required value: name is required")?;
    dns_subdomain(name)
        .map_err(|why| format!("metadata.name: Invalid value: \"{}\": {why}", shown(name)))?;
    if kind.namespaced() {
        let ns = field("namespace")
            .ok_or("metadata.namespace: Required value: a namespaced object needs one")?;
        dns_label(ns).map_err(|why| {
            format!(
                "metadata.namespace: Invalid value: \"{}\": {why}",
                shown(ns)
            )
        })?;
    }
    Ok(())
}
