//! The JSON stream (and each YAML document): the top-level value is read field by field and a
//! List's `items` one at a time, each added to the snapshot as soon as it is parsed, so a List
//! is never held whole; a [`Meter`] bounds each object's bytes.

use std::io::Read;
use std::path::Path;

use rocefabric_input::read::human;
use rocefabric_input::shown;
use rocefabric_input::yaml::Strict;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::prune::Keep;
use super::{Kind, MAX_OBJECT_BYTES, Snapshot, SnapshotError};

/// The top-level JSON value: an object whose `items` (if any) are added one by one as they are
/// parsed, so a List is never held whole.
pub(super) struct Top<'a> {
    pub(super) snapshot: &'a mut Snapshot,
    pub(super) path: &'a Path,
    /// `document N` (YAML) or `top level` (JSON).
    pub(super) place: &'a str,
    pub(super) accept: &'a [Kind],
    pub(super) failure: &'a mut Option<SnapshotError>,
    /// The JSON reader's byte count, to bound each object.
    pub(super) meter: Option<&'a Meter>,
}

impl Top<'_> {
    /// The same sink, borrowed for a nested value.
    fn reborrow(&mut self) -> Top<'_> {
        Top {
            snapshot: &mut *self.snapshot,
            path: self.path,
            place: self.place,
            accept: self.accept,
            failure: &mut *self.failure,
            meter: self.meter,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object or List")
    }

    /// An empty document (after a trailing `---`).
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    /// A bare JSON array of objects, read like a List's items.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Items(self).visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        if let Some(m) = self.meter {
            m.start_object();
        }
        let mut rest = Map::new();
        let mut items = None;
        while let Some(key) = map.next_key::<String>()? {
            if rest.contains_key(&key) || (key == "items" && items.is_some()) {
                return Err(de::Error::custom(format!(
                    "duplicate key {:?}",
                    shown(&key)
                )));
            }
            if key == "items" {
                items = Some(map.next_value_seed(Items(self.reborrow()))?);
                // The fields after the items count as one more object.
                if let Some(m) = self.meter {
                    m.start_object();
                }
            } else {
                rest.insert(key, map.next_value_seed(Strict)?);
            }
        }
        if let Some((_, token)) = &mut self.snapshot.page {
            *token = rest
                .get("metadata")
                .and_then(|m| m.get("continue"))
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        let kind = rest.get("kind").and_then(Value::as_str).unwrap_or_default();
        match items {
            Some(_) if !kind.ends_with("List") => {
                *self.failure = Some(SnapshotError::Object {
                    path: self.path.to_path_buf(),
                    place: self.place.to_string(),
                    reason: format!("`items` in an object of kind {:?}, not a List", shown(kind)),
                });
                Err(de::Error::custom("not a List"))
            }
            Some(_) => Ok(()),
            None => self
                .snapshot
                .add(Value::Object(rest), self.path, self.place, self.accept)
                .map_err(|e| {
                    *self.failure = Some(e);
                    de::Error::custom("refused")
                }),
        }
    }
}

/// A List's `items`, each added as soon as it is parsed (into the same snapshot, at the same
/// place, as its List).
struct Items<'a>(Top<'a>);

impl<'de> DeserializeSeed<'de> for Items<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            if let Some(m) = self.0.meter {
                m.start_object();
            }
            let Some(item) = seq.next_element_seed(Keep::items_of(self.0.accept))? else {
                break;
            };
            let place = if self.0.place == "top level" {
                format!("item {i}")
            } else {
                format!("{}, item {i}", self.0.place)
            };
            if let Err(e) = self
                .0
                .snapshot
                .add(item, self.0.path, &place, self.0.accept)
            {
                *self.0.failure = Some(e);
                return Err(de::Error::custom("refused"));
            }
            i += 1;
        }
        Ok(())
    }
}

/// Bytes read so far, and where the current object must end: a JSON object larger than
/// [`MAX_OBJECT_BYTES`] fails while it is being read, before it is held whole.
#[derive(Default)]
pub(super) struct Meter {
    read: std::cell::Cell<u64>,
    end: std::cell::Cell<u64>,
}

impl Meter {
    pub(super) fn start_object(&self) {
        self.end.set(self.read.get() + MAX_OBJECT_BYTES);
    }
}

/// A reader that counts its bytes on a [`Meter`] and fails past the current object's end.
pub(super) struct Metered<'a, R> {
    pub(super) inner: R,
    pub(super) meter: &'a Meter,
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let read = self.meter.read.get() + n as u64;
        self.meter.read.set(read);
        if read > self.meter.end.get() {
            return Err(std::io::Error::other(format!(
                "an object larger than {} (the API server refuses anything over 3 MiB)",
                human(MAX_OBJECT_BYTES)
            )));
        }
        Ok(n)
    }
}
