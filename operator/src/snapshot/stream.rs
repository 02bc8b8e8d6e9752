//! Each YAML document: the top-level value is read field by field and a List's `items` (of a
//! flow-style List, which `yaml::split_list` leaves whole) one at a time, each added to the
//! snapshot as soon as it is parsed. (JSON is taken apart by `split`.)

use std::path::Path;

use rocefabric_input::shown;
use rocefabric_input::yaml::Strict;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Map;

use super::object::Place;
use super::prune::Keep;
use super::{Kind, Snapshot, SnapshotError};

/// A document's top-level value: an object whose `items` (if any) are added one by one as they are
/// parsed, so a List is never held whole.
pub(super) struct Top<'a> {
    pub(super) snapshot: &'a mut Snapshot,
    pub(super) path: &'a Path,
    /// `document N`.
    pub(super) place: &'a str,
    pub(super) accept: &'a [Kind],
    pub(super) failure: &'a mut Option<SnapshotError>,
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
            } else {
                rest.insert(key, map.next_value_seed(Strict)?);
            }
        }
        self.snapshot
            .top_level(
                rest,
                items.is_some(),
                self.path,
                Place::at(self.place),
                self.accept,
            )
            .map_err(|e| {
                *self.failure = Some(e);
                de::Error::custom("refused")
            })
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
        while let Some(item) = seq.next_element_seed(Keep::items_of(self.0.accept))? {
            if let Err(e) = self.0.snapshot.add(
                item,
                self.0.path,
                Place::item(self.0.place, i),
                self.0.accept,
            ) {
                *self.0.failure = Some(e);
                return Err(de::Error::custom("refused"));
            }
            i += 1;
        }
        Ok(())
    }
}
