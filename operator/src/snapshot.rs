//! Loading Kubernetes objects from YAML files as `kubectl get -o yaml` writes them: a `List`
//! (`kind: List` or any `*List` with `items`), multi-document YAML, or a single object.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use rocefabric_api::validate::{self, FieldError};
use rocefabric_api::{RoceFabric, RoceNode};
use serde::Deserialize;
use serde_json::Value;

/// A file that cannot be loaded, naming the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {document}: invalid YAML: {reason}")]
    Yaml {
        path: PathBuf,
        document: usize,
        reason: String,
    },
    #[error("{path}: {place}: {reason}")]
    Object {
        path: PathBuf,
        place: String,
        reason: String,
    },
}

/// The kinds a snapshot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    RoceFabric,
    Node,
    Pod,
    RoceNode,
    ConfigMap,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RoceFabric => "RoceFabric",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::RoceNode => "RoceNode",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    fn parse(kind: &str) -> Option<Self> {
        [
            Kind::RoceFabric,
            Kind::Node,
            Kind::Pod,
            Kind::RoceNode,
            Kind::ConfigMap,
        ]
        .into_iter()
        .find(|k| k.as_str() == kind)
    }
}

/// A fabric the API server would reject, with every reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidFabric {
    pub name: String,
    pub errors: Vec<FieldError>,
}

/// Objects loaded from files.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Fabrics that deserialize (valid or not: the planner reports invalid ones).
    pub fabrics: Vec<RoceFabric>,
    /// Fabrics too malformed to read as a RoceFabric at all.
    pub unreadable_fabrics: Vec<InvalidFabric>,
    pub nodes: Vec<Node>,
    pub roce_nodes: Vec<RoceNode>,
    pub pods: Vec<Pod>,
    pub config_maps: Vec<ConfigMap>,
}

impl Snapshot {
    /// Load every object of `path`, accepting only the kinds in `accept`.
    pub fn load_file(&mut self, path: &Path, accept: &[Kind]) -> Result<(), SnapshotError> {
        let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_str(&text, path, accept)
    }

    /// Load every object of `text` (read from `path`, named in errors).
    pub fn load_str(
        &mut self,
        text: &str,
        path: &Path,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
            let document = i + 1;
            let value = Value::deserialize(doc).map_err(|e| SnapshotError::Yaml {
                path: path.to_path_buf(),
                document,
                reason: e.to_string(),
            })?;
            if value.is_null() {
                continue; // an empty document, e.g. after a trailing `---`
            }
            self.add(value, path, &format!("document {document}"), accept)?;
        }
        Ok(())
    }

    fn add(
        &mut self,
        value: Value,
        path: &Path,
        place: &str,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        let err = |place: &str, reason: String| SnapshotError::Object {
            path: path.to_path_buf(),
            place: place.to_string(),
            reason,
        };
        let Some(kind) = value
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(err(place, "object has no `kind`".into()));
        };
        if kind.ends_with("List") {
            let Some(Value::Array(items)) = value.get("items").cloned() else {
                return Err(err(place, format!("{kind} has no `items` list")));
            };
            for (i, item) in items.into_iter().enumerate() {
                self.add(item, path, &format!("{place}, item {i}"), accept)?;
            }
            return Ok(());
        }
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>")
            .to_string();
        let place = format!("{place} ({kind} {name})");
        let expected = || {
            accept
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let Some(k) = Kind::parse(&kind).filter(|k| accept.contains(k)) else {
            return Err(err(
                &place,
                format!("expected {}, found kind {kind:?}", expected()),
            ));
        };
        let typed = |e: serde_json::Error| err(&place, e.to_string());
        match k {
            Kind::RoceFabric => {
                let checked = validate::fabric_value(&value);
                match serde_json::from_value::<RoceFabric>(value) {
                    Ok(f) => self.fabrics.push(f),
                    Err(e) => self.unreadable_fabrics.push(InvalidFabric {
                        name,
                        errors: match checked {
                            Err(invalid) => invalid.errors,
                            Ok(()) => vec![FieldError {
                                field: "<root>".into(),
                                message: e.to_string(),
                            }],
                        },
                    }),
                }
            }
            Kind::Node => self
                .nodes
                .push(serde_json::from_value(value).map_err(typed)?),
            Kind::Pod => self
                .pods
                .push(serde_json::from_value(value).map_err(typed)?),
            Kind::RoceNode => self
                .roce_nodes
                .push(serde_json::from_value(value).map_err(typed)?),
            Kind::ConfigMap => self
                .config_maps
                .push(serde_json::from_value(value).map_err(typed)?),
        }
        Ok(())
    }
}
