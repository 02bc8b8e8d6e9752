//! A JSON document loaded: taken apart (`split`), each item built as the kinds accepted need it
//! (`prune`) and added to the snapshot as soon as it is parsed.
//!
//! On one thread: parsing on a second one while this one adds was measured slower on two cores
//! (the items' memory crossing between the threads cost more CPU than the overlap saved), even
//! with each item freed on the thread that allocated it.

use std::path::Path;

use rocefabric_input::read::{ReadError, human};
use rocefabric_input::shown::shown_within;
use rocefabric_input::yaml;

use super::object::Place;
use super::prune::{Built, Items, Nodes, Pods, Whole};
use super::split::{self, Split, SplitError, Stop};
use super::{Kind, MAX_OBJECT_BYTES, Snapshot, SnapshotError};

impl Snapshot {
    /// Load one JSON document: a List's items are added one at a time, each built as the kinds
    /// accepted need it.
    pub(super) fn load_json(
        &mut self,
        split: Split<'_>,
        path: &Path,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        match accept {
            [Kind::Pod] => self.walk_json::<Pods>(split, path, accept),
            [Kind::Node] => self.walk_json::<Nodes>(split, path, accept),
            _ => self.walk_json::<Whole>(split, path, accept),
        }
    }

    fn walk_json<K: Items>(
        &mut self,
        mut split: Split<'_>,
        path: &Path,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        let limit = usize::try_from(MAX_OBJECT_BYTES).unwrap_or(usize::MAX);
        let top = split::walk(&mut split, limit, |i, item: Built<K>| {
            self.add(item.0, path, Place::item("", i), accept)
        })
        .map_err(|stop| match stop {
            Stop::Item(e) => e,
            Stop::Split(e) => json_error(path, e),
        })?;
        match top.fields {
            Some(fields) => self.top_level(fields, top.items, path, Place::at("top level"), accept),
            // A top-level array (its items are added) or `null`.
            None => Ok(()),
        }
    }
}

/// A JSON document that could not be taken apart, as the snapshot's error.
fn json_error(path: &Path, e: SplitError) -> SnapshotError {
    match e {
        SplitError::Io(source) => SnapshotError::Read(ReadError::Io {
            path: path.to_path_buf(),
            source,
        }),
        SplitError::Syntax {
            line,
            column,
            reason,
        } => SnapshotError::Syntax {
            path: path.to_path_buf(),
            place: format!("line {line} column {column}"),
            format: "JSON",
            reason: shown_within(&reason, yaml::MAX_MESSAGE_CHARS),
        },
        SplitError::TooLarge { item, line, column } => SnapshotError::Object {
            path: path.to_path_buf(),
            place: match item {
                Some(i) => format!("item {i} (line {line} column {column})"),
                None => format!("top level (line {line} column {column})"),
            },
            reason: format!(
                "an object larger than {} (the API server refuses anything over 3 MiB)",
                human(MAX_OBJECT_BYTES)
            ),
        },
    }
}
