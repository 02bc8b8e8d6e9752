//! The shared memory address space: the region annotation, the region directory, quantities.

use rocefabric_api::quantity::parse_bytes;
use rocefabric_dsm::directory::{Directory, parse_assignment};
use rocefabric_formats::directory::{self as formats_directory, DirectoryEntry};
use rocefabric_formats::region::RegionAssignment;

use crate::text;

/// The `rocefabric.io/region` annotation as the operator and the data plane read it. What the
/// operator accepts renders back to itself; what it writes for a usable window (bound to a pod
/// uid) the data plane reads as the same window and uid.
pub fn region_annotation(data: &[u8]) {
    let text = text(data);
    match RegionAssignment::parse(&text) {
        Err(e) => assert!(e.to_string().contains("rocefabric.io/region"), "{e}"),
        Ok(a) => {
            assert_eq!(
                RegionAssignment::parse(&a.to_annotation()).as_ref(),
                Ok(&a),
                "annotation round trip"
            );
            // A uid taken from the input, to exercise escaping.
            let uid = text.rsplit('"').next().unwrap_or_default();
            let bound = a.to_annotation_of(Some(uid));
            let bound_a = RegionAssignment {
                uid: Some(uid.to_string()),
                ..a.clone()
            };
            assert_eq!(RegionAssignment::parse(&bound).as_ref(), Ok(&bound_a));
            let usable = a.size > 0 && a.base.checked_add(a.size).is_some();
            match parse_assignment("annotation", &bound) {
                Ok(d) => {
                    assert!(usable, "data plane took an unusable window: {bound}");
                    assert_eq!(
                        (d.fabric.as_str(), d.id, d.base, d.size, d.uid.as_deref()),
                        (a.fabric.as_str(), a.id, a.base, a.size, Some(uid)),
                        "data plane reads another window than the operator wrote"
                    );
                }
                Err(e) => assert!(
                    !usable,
                    "data plane refused the operator's annotation {bound}: {e}"
                ),
            }
        }
    }
    match parse_assignment("annotation", &text) {
        Ok(a) => {
            assert!(a.size > 0 && a.end() > a.base, "{a:?}");
        }
        Err(e) => assert!(e.to_string().starts_with("annotation "), "{e}"),
    }
}

/// `regions.json` as the planner renders it and the data plane reads it: the planner's entries
/// render back to themselves; the data plane keeps only sorted, disjoint, non-empty windows and
/// finds the owner of every window's first and last byte; a directory of such windows written by
/// the planner is accepted by the data plane.
pub fn region_directory(data: &[u8]) {
    let text = text(data);
    if let Ok(entries) = formats_directory::parse(&text) {
        let rendered = formats_directory::render(&entries);
        assert_eq!(
            formats_directory::parse(&rendered).ok().as_ref(),
            Some(&entries),
            "directory round trip"
        );
        // What the planner writes: non-empty windows inside the 64-bit space, disjoint.
        let mut sorted: Vec<&DirectoryEntry> = entries.iter().collect();
        sorted.sort_by_key(|e| e.base);
        let fits = entries
            .iter()
            .all(|e| e.size > 0 && e.base.checked_add(e.size).is_some());
        let disjoint = sorted
            .windows(2)
            .all(|p| p[0].base.saturating_add(p[0].size) <= p[1].base);
        if fits
            && disjoint
            && let Err(e) = Directory::parse("regions.json", &rendered)
        {
            panic!("data plane refused the planner's directory: {e}\n{rendered}");
        }
    }
    match Directory::parse("regions.json", &text) {
        Err(e) => assert!(e.to_string().starts_with("regions.json "), "{e}"),
        Ok(d) => {
            let entries = d.entries();
            for p in entries.windows(2) {
                assert!(p[0].base <= p[1].base && p[0].end() <= p[1].base, "{p:?}");
            }
            for e in entries {
                assert!(e.size > 0 && e.base.checked_add(e.size).is_some(), "{e:?}");
                let first = d
                    .owner(e.base, 1)
                    .unwrap_or_else(|err| panic!("no owner of {e:?}'s first byte: {err}"));
                assert_eq!(first, e);
                let last = e.end() - 1;
                let owner = d
                    .owner(last, 1)
                    .unwrap_or_else(|err| panic!("no owner of {e:?}'s last byte: {err}"));
                assert_eq!(owner, e);
                let _ = d.owner(e.base, e.size);
                let _ = d.owner(last, u64::MAX);
            }
            let _ = d.owner(0, 0);
            let _ = d.owner(u64::MAX, 1);
        }
    }
}

/// `parse_bytes`: an accepted quantity's byte count, written as a plain integer, parses to the
/// same count; an error quotes the value it refused.
pub fn quantity(data: &[u8]) {
    let text = text(data);
    match parse_bytes(&text) {
        Ok(n) => {
            assert_eq!(parse_bytes(&n.to_string()), Ok(n), "{text:?} = {n}");
            assert_eq!(parse_bytes(&format!("+{n}")), Ok(n));
            if n % 1024 == 0 {
                assert_eq!(parse_bytes(&format!("{}Ki", n / 1024)), Ok(n));
            }
            if n % 1000 == 0 {
                assert_eq!(parse_bytes(&format!("{}k", n / 1000)), Ok(n));
            }
        }
        Err(e) => {
            assert_eq!(e.value, text, "the error quotes another value");
            assert!(!e.reason.is_empty());
        }
    }
}
