//! One object as it is added to a snapshot: a List is taken apart, an object identified
//! (kind, names as the API server checks them), a second copy of one told apart from a
//! conflicting one, and the object kept, cut to what the planner reads.

use std::path::Path;

use rocefabric_api::RoceFabric;
use rocefabric_api::structural::{dns_label, dns_subdomain};
use rocefabric_api::validate::{self, FieldError};
use rocefabric_input::shown;
use rocefabric_input::yaml;
use serde_json::Value;

use crate::objects::{CompactNode, CompactPod};

use super::{InvalidFabric, Kind, MAX_NOTES, Snapshot, SnapshotError};

/// An object identified by its metadata, not yet kept.
struct Identified {
    kind: Kind,
    /// `metadata.name`, or `<unnamed>`.
    name: String,
    /// `namespace/name` of namespaced kinds, else the name: what tells two objects apart.
    key: String,
    /// The place in the file, naming the object.
    place: String,
    /// Whether `metadata.name` was given (an unnamed object is never a second copy).
    named: bool,
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
fn identify(
    value: &Value,
    kind: &str,
    path: &Path,
    place: &str,
    accept: &[Kind],
) -> Result<Identified, SnapshotError> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_string();
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_string);
    let place = format!("{place} ({} {})", shown(kind), shown(&name));
    let Some(k) = Kind::parse(kind).filter(|k| accept.contains(k)) else {
        let expected = accept
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(object_error(
            path,
            &place,
            format!("expected {expected}, found kind \"{}\"", shown(kind)),
        ));
    };
    if k != Kind::RoceFabric {
        // Fabrics are checked (name included) by their own validation, in `keep`.
        check_names(value, k).map_err(|e| object_error(path, &place, e))?;
    }
    let key = match (&namespace, k.namespaced()) {
        (Some(ns), true) => format!("{ns}/{name}"),
        _ => name.clone(),
    };
    Ok(Identified {
        kind: k,
        name,
        key,
        place,
        named: value.pointer("/metadata/name").is_some(),
    })
}

impl Snapshot {
    /// Add `value` read at `place` of `path`: a List's items one by one, or one object of a
    /// kind in `accept`.
    pub(super) fn add(
        &mut self,
        value: Value,
        path: &Path,
        place: &str,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        // An API list's items carry no `kind`: the page's kind is theirs.
        let Some(kind) = value
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| self.page.as_ref().map(|(k, _)| k.as_str().to_string()))
        else {
            return Err(object_error(path, place, "object has no `kind`".into()));
        };
        if kind.ends_with("List") {
            let Value::Object(mut map) = value else {
                unreachable!("an object has a kind")
            };
            let Some(Value::Array(items)) = map.remove("items") else {
                return Err(object_error(
                    path,
                    place,
                    format!("{} has no `items` list", shown(&kind)),
                ));
            };
            for (i, item) in items.into_iter().enumerate() {
                self.add(item, path, &format!("{place}, item {i}"), accept)?;
            }
            return Ok(());
        }
        let id = identify(&value, &kind, path, place, accept)?;
        let first = self
            .seen
            .get(&(id.kind, id.key.clone()))
            .filter(|_| id.named)
            .cloned();
        match first {
            Some((first, kept)) => self.again(&id, value, &first, kept, path),
            None => self.keep(id, value, path),
        }
    }

    /// Keep an object seen for the first time, typed and cut to what the planner reads; a
    /// fabric the API server would reject is kept as its errors.
    fn keep(&mut self, id: Identified, value: Value, path: &Path) -> Result<(), SnapshotError> {
        let Identified {
            kind: k,
            name,
            key,
            place,
            ..
        } = id;
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
        self.seen.insert(
            (k, key.clone()),
            (format!("{} {place}", path.display()), index),
        );
        let typed = |e: yaml::TypeError| object_error(path, &place, e.to_string());
        match k {
            Kind::RoceFabric => self.keep_fabric(name, value),
            Kind::Node => {
                let node: CompactNode = yaml::typed(value).map_err(typed)?;
                self.nodes.push(node);
            }
            Kind::Pod => {
                let pod: CompactPod = yaml::typed(value).map_err(typed)?;
                self.pods.push(pod);
            }
            Kind::RoceNode => self.roce_nodes.push(yaml::typed(value).map_err(typed)?),
            Kind::ConfigMap => self.config_maps.push(yaml::typed(value).map_err(typed)?),
        }
        if self.unreadable_fabrics.len() > unreadable
            && let (Some(entry), Some(raw)) = (self.seen.get_mut(&(k, key)), raw)
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

    /// An object seen before (first at `first`, kept as `kept`): the same copy is noted and
    /// counted once; a different one (another uid or content) is an error naming both places.
    fn again(
        &mut self,
        id: &Identified,
        value: Value,
        first: &str,
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
            Kind::RoceNode => same_json(self.roce_nodes.get(i), value),
            Kind::ConfigMap => same(self.config_maps.get(i), value, |_| ()),
        };
        let what = format!("{} {}", id.kind.as_str(), shown(&id.key));
        let here = format!("{} {}", path.display(), id.place);
        if !same {
            return Err(object_error(
                path,
                &id.place,
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

/// `metadata.name` (and `metadata.namespace` of namespaced kinds) as the API server requires.
fn check_names(value: &Value, kind: Kind) -> Result<(), String> {
    let field = |f: &str| {
        value
            .pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
    };
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
