//! The value of the pod annotation `rocefabric.io/region`: compact JSON with the fields in the
//! order fabric, id, base, size, then `uid` when the annotation is bound to its pod:
//!
//! ```text
//! {"fabric":"training","id":3,"base":3221225472,"size":1073741824,"uid":"9f3c2a7e-5b1d-4e8a-b6c0-1d2e3f4a5b6c"}
//! ```
//!
//! The operator writes it; the pod's data plane reads it from a downward-API file. Unknown fields
//! are ignored, so a newer writer may add fields after `uid`.

use serde::{Deserialize, Serialize};

use crate::names::REGION_ANNOTATION;

/// A pod's window `[base, base + size)` in its fabric's address space.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionAssignment {
    /// The fabric whose address space this is.
    pub fabric: String,
    /// The region id: the index of its first slot.
    pub id: u32,
    /// First byte of the window.
    pub base: u64,
    /// Bytes in the window (a whole number of regions).
    pub size: u64,
    /// The owner pod's `metadata.uid`, so that a copy of the annotation on another pod (an
    /// exported manifest) is recognised and never honoured. Absent in annotations written before
    /// the uid binding, and in a window not yet bound to a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// An annotation value that is not a [`RegionAssignment`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid annotation {REGION_ANNOTATION} {value:?}: {reason}")]
pub struct AnnotationError {
    /// The value as found.
    pub value: String,
    /// What the JSON parser said.
    pub reason: String,
}

impl RegionAssignment {
    /// The annotation text (compact JSON, fields in the order fabric, id, base, size, uid; no
    /// `uid` when it is `None`).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|_| unreachable!("a struct of strings and integers serializes"))
    }

    /// The annotation text of this window bound to the pod `uid` (`None`: unbound), whatever
    /// `self.uid` is.
    pub fn to_annotation_of(&self, uid: Option<&str>) -> String {
        Self {
            uid: uid.map(str::to_owned),
            ..self.clone()
        }
        .to_annotation()
    }

    /// Parse an annotation value. Only the JSON shape is checked: whether the window is usable
    /// (non-empty, inside the 64-bit space, aligned to a fabric's geometry) is the reader's call.
    pub fn parse(value: &str) -> Result<Self, AnnotationError> {
        serde_json::from_str(value).map_err(|e| AnnotationError {
            value: value.to_string(),
            reason: e.to_string(),
        })
    }

    /// One past the last byte (saturating at `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

    use super::*;

    const GI: u64 = 1 << 30;

    fn window() -> RegionAssignment {
        RegionAssignment {
            fabric: "training".into(),
            id: 3,
            base: 3 * GI,
            size: GI,
            uid: None,
        }
    }

    #[test]
    fn the_annotation_is_compact_json_with_fabric_id_base_size_then_uid() {
        let a = window();
        assert_eq!(
            a.to_annotation(),
            r#"{"fabric":"training","id":3,"base":3221225472,"size":1073741824}"#
        );
        assert_eq!(
            a.to_annotation_of(Some("u-1")),
            r#"{"fabric":"training","id":3,"base":3221225472,"size":1073741824,"uid":"u-1"}"#
        );
        let bound = RegionAssignment {
            uid: Some("u-1".into()),
            ..a.clone()
        };
        assert_eq!(bound.to_annotation(), a.to_annotation_of(Some("u-1")));
        assert_eq!(bound.to_annotation_of(None), a.to_annotation());
        assert_eq!(bound.end(), 4 * GI);
    }

    /// The uid binding as the operator wrote it before this type had a `uid` field: the unbound
    /// text with `,"uid":<JSON string>` spliced in before the closing brace.
    #[test]
    fn binding_a_uid_writes_what_the_operator_wrote_before() {
        let spliced = |a: &RegionAssignment, uid: &str| {
            let mut text = a.to_annotation();
            text.pop();
            text.push_str(",\"uid\":");
            text.push_str(&serde_json::Value::from(uid).to_string());
            text.push('}');
            text
        };
        for uid in [
            "9f3c2a7e-5b1d-4e8a-b6c0-1d2e3f4a5b6c",
            "",
            "quote\" back\\slash",
            "ctl\u{1}\n\t\u{7f}",
            "ünï\u{2028}😀",
        ] {
            assert_eq!(
                window().to_annotation_of(Some(uid)),
                spliced(&window(), uid)
            );
        }
    }

    #[test]
    fn the_annotation_reads_back_with_or_without_uid_and_ignores_unknown_fields() {
        let a = window();
        assert_eq!(RegionAssignment::parse(&a.to_annotation()), Ok(a.clone()));
        let bound = a.to_annotation_of(Some("u-1"));
        assert_eq!(
            RegionAssignment::parse(&bound),
            Ok(RegionAssignment {
                uid: Some("u-1".into()),
                ..a.clone()
            })
        );
        let newer = r#"{"fabric":"training","id":3,"base":3221225472,"size":1073741824,"uid":null,"x":[1]}"#;
        assert_eq!(RegionAssignment::parse(newer), Ok(a));
    }

    #[test]
    fn a_malformed_annotation_is_refused_quoting_it() {
        let err = RegionAssignment::parse("{oops").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"invalid annotation rocefabric.io/region "{oops": "#),
            "{err}"
        );
        for bad in [
            r#"{"id":0,"base":0,"size":1}"#,
            r#"{"fabric":"f","id":-1,"base":0,"size":1}"#,
            r#"{"fabric":"f","id":0,"base":0,"size":18446744073709551616}"#,
            r#"{"fabric":"f","id":0,"base":0,"size":1,"uid":7}"#,
            r#"{"fabric":"f","id":0,"id":1,"base":0,"size":1}"#,
            "[]",
            "",
        ] {
            assert!(RegionAssignment::parse(bad).is_err(), "{bad}");
        }
    }
}
