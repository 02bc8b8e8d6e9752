//! The region allocator: unit cases and property tests (no overlap, within bounds, rebuild from
//! annotations gives the same map, duplicates resolved in favour of the older, exhaustion).
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use proptest::prelude::*;
use rocefabric_formats::region::RegionAssignment;
use rocefabric_operator::regions::{
    Geometry, Outcome, RegionError, Request, SlotMap, Slots, allocate,
};

const GI: u64 = 1 << 30;

fn new(len: u32) -> Request {
    Request {
        existing: None,
        len,
        pinned: false,
    }
}

#[test]
fn windows_are_first_fit_and_sized_in_whole_regions() {
    let g = Geometry::new(GI, 8).unwrap();
    assert_eq!(g.slots_for(None), Ok(1));
    assert_eq!(g.slots_for(Some(3 * GI)), Ok(3));
    assert_eq!(
        g.slots_for(Some(GI + 1)),
        Ok(2),
        "rounded up to whole regions"
    );
    assert_eq!(g.slots_for(Some(1)), Ok(1));
    assert_eq!(g.slots_for_annotation(Some("2Gi")), Ok(2));
    assert!(matches!(
        g.slots_for(Some(9 * GI)),
        Err(RegionError::RequestTooLarge { slots: 9, .. })
    ));
    assert!(matches!(
        g.slots_for_annotation(Some("lots")),
        Err(RegionError::SizeRequest { .. })
    ));

    let a = allocate(g, &[new(1), new(3), new(1)], &[]);
    assert_eq!(
        a.outcomes,
        [
            Outcome::Assigned(Slots { first: 0, len: 1 }),
            Outcome::Assigned(Slots { first: 1, len: 3 }),
            Outcome::Assigned(Slots { first: 4, len: 1 }),
        ]
    );
    assert_eq!(a.live_slots, 5);
    assert_eq!(
        g.assignment("f", Slots { first: 1, len: 3 }),
        RegionAssignment {
            fabric: "f".into(),
            id: 1,
            base: GI,
            size: 3 * GI,
            uid: None,
        }
    );
}

#[test]
fn a_request_skips_runs_too_short_for_it() {
    let g = Geometry::new(4096, 10).unwrap();
    let taken = [Slots { first: 1, len: 1 }, Slots { first: 4, len: 1 }];
    let reqs: Vec<Request> = taken
        .iter()
        .map(|s| Request {
            existing: Some(*s),
            len: 1,
            pinned: false,
        })
        .chain([new(3), new(1)])
        .collect();
    let a = allocate(g, &reqs, &[]);
    assert_eq!(
        a.outcomes[2],
        Outcome::Assigned(Slots { first: 5, len: 3 }),
        "slots 2-3 are too short"
    );
    assert_eq!(
        a.outcomes[3],
        Outcome::Assigned(Slots { first: 0, len: 1 }),
        "first fit for a single slot"
    );
}

#[test]
fn cooling_windows_are_not_handed_out_but_recorded_claims_over_them_stand() {
    let g = Geometry::new(4096, 4).unwrap();
    let cooling = [Slots { first: 0, len: 2 }];
    let a = allocate(
        g,
        &[
            Request {
                existing: Some(Slots { first: 1, len: 1 }),
                len: 1,
                pinned: false,
            },
            new(1),
        ],
        &cooling,
    );
    assert_eq!(a.outcomes[0], Outcome::Kept(Slots { first: 1, len: 1 }));
    assert_eq!(a.outcomes[1], Outcome::Assigned(Slots { first: 2, len: 1 }));
    assert_eq!(a.live_slots, 2, "cooling slots are not live");
}

#[test]
fn exhaustion_leaves_the_rest_waiting_but_smaller_requests_still_fit() {
    let g = Geometry::new(4096, 4).unwrap();
    let a = allocate(g, &[new(3), new(2), new(1), new(1)], &[]);
    assert_eq!(a.outcomes[1], Outcome::Waiting { lost: None });
    assert_eq!(a.outcomes[2], Outcome::Assigned(Slots { first: 3, len: 1 }));
    assert_eq!(a.outcomes[3], Outcome::Waiting { lost: None });
    assert_eq!(a.waiting(), 2);
    assert_eq!(a.live_slots, 4);
}

#[test]
fn recorded_claims_must_fit_the_geometry() {
    let g = Geometry::new(GI, 4).unwrap();
    let ok = RegionAssignment {
        fabric: "f".into(),
        id: 2,
        base: 2 * GI,
        size: 2 * GI,
        uid: None,
    };
    assert_eq!(g.slots_of(&ok), Ok(Slots { first: 2, len: 2 }));
    for bad in [
        RegionAssignment {
            base: 2 * GI + 1,
            ..ok.clone()
        },
        RegionAssignment {
            id: 1,
            ..ok.clone()
        },
        RegionAssignment {
            size: 0,
            ..ok.clone()
        },
        RegionAssignment {
            size: GI / 2,
            ..ok.clone()
        },
        RegionAssignment {
            id: 3,
            base: 3 * GI,
            ..ok.clone()
        },
    ] {
        assert!(g.slots_of(&bad).is_err(), "{bad:?}");
    }
}

#[test]
fn geometry_rejects_empty_and_unaddressable_spaces() {
    assert!(Geometry::new(0, 4).is_err());
    assert!(Geometry::new(4096, 0).is_err());
    assert!(matches!(
        Geometry::new(1 << 50, 1 << 20),
        Err(RegionError::SpaceTooLarge { .. })
    ));
    assert!(Geometry::new(1 << 43, 1 << 20).is_ok());
}

#[test]
fn the_annotation_is_compact_json_with_fabric_id_base_size() {
    let a = RegionAssignment {
        fabric: "training".into(),
        id: 3,
        base: 3 * GI,
        size: GI,
        uid: None,
    };
    assert_eq!(
        a.to_annotation(),
        r#"{"fabric":"training","id":3,"base":3221225472,"size":1073741824}"#
    );
    assert_eq!(RegionAssignment::parse(&a.to_annotation()), Ok(a));
    let err = RegionAssignment::parse("{oops").unwrap_err();
    assert!(err.to_string().contains("{oops"), "{err}");
}

#[test]
fn slot_map_finds_runs_across_word_boundaries() {
    let mut m = SlotMap::new(200);
    assert!(m.try_claim(Slots { first: 0, len: 60 }));
    assert!(m.try_claim(Slots { first: 70, len: 60 }));
    assert_eq!(
        m.allocate(20),
        Some(Slots {
            first: 130,
            len: 20
        }),
        "60..70 is too short"
    );
    assert_eq!(m.allocate(10), Some(Slots { first: 60, len: 10 }));
    assert!(!m.try_claim(Slots { first: 199, len: 2 }), "out of bounds");
    assert_eq!(m.allocate(51), None);
    assert_eq!(
        m.allocate(50),
        Some(Slots {
            first: 150,
            len: 50
        })
    );
    assert_eq!(m.taken(), 200);
    assert_eq!(m.allocate(1), None);
}

/// A random batch: each request optionally carries a (possibly overlapping, possibly out of
/// range) recorded window.
fn requests(max: u32) -> impl Strategy<Value = Vec<Request>> {
    let req = (
        proptest::option::weighted(0.4, (0..max + 2, 1..4u32)),
        1..5u32,
    )
        .prop_map(|(existing, len)| Request {
            existing: existing.map(|(first, len)| Slots { first, len }),
            len,
            pinned: false,
        });
    proptest::collection::vec(req, 0..60)
}

fn valid_claims(g: Geometry, reqs: &[Request]) -> Vec<Request> {
    // Recorded windows beyond the space would not survive `Geometry::slots_of`.
    reqs.iter()
        .map(|r| Request {
            existing: r.existing.filter(|s| s.end() <= u64::from(g.max_regions)),
            len: r.len,
            pinned: false,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_overlap_and_within_bounds(max in 1..80u32, reqs in requests(80), cool in proptest::collection::vec((0..80u32, 1..3u32), 0..5)) {
        let g = Geometry::new(4096, max).unwrap();
        let reqs = valid_claims(g, &reqs);
        let cooling: Vec<Slots> = cool.into_iter().map(|(first, len)| Slots { first, len }).collect();
        let a = allocate(g, &reqs, &cooling);
        prop_assert_eq!(a.outcomes.len(), reqs.len());
        let held: Vec<Slots> = a.outcomes.iter().filter_map(Outcome::slots).collect();
        for (i, s) in held.iter().enumerate() {
            prop_assert!(s.len >= 1 && s.end() <= u64::from(max), "{:?} outside {}", s, max);
            for t in &held[i + 1..] {
                prop_assert!(!s.overlaps(*t), "{:?} overlaps {:?}", s, t);
            }
        }
        // New windows never take a cooling slot and have the size asked for.
        for (o, r) in a.outcomes.iter().zip(&reqs) {
            if let Outcome::Assigned(s) | Outcome::Reassigned { new: s, .. } = o {
                prop_assert!(cooling.iter().all(|c| !c.overlaps(*s)), "{:?} in cooling", s);
                prop_assert_eq!(s.len, r.len);
            }
        }
        prop_assert_eq!(a.live_slots, held.iter().map(|s| s.len).sum::<u32>());
        prop_assert!(a.live_slots <= max);
    }

    #[test]
    fn rebuilding_from_the_annotations_gives_the_same_map(max in 1..80u32, reqs in requests(80)) {
        let g = Geometry::new(4096, max).unwrap();
        let reqs = valid_claims(g, &reqs);
        let first = allocate(g, &reqs, &[]);
        // What the pods now record, in the same age order.
        let recorded: Vec<Request> = reqs
            .iter()
            .zip(&first.outcomes)
            .map(|(r, o)| Request { existing: o.slots(), len: r.len, pinned: false })
            .collect();
        let again = allocate(g, &recorded, &[]);
        for (o, a) in first.outcomes.iter().zip(&again.outcomes) {
            match o.slots() {
                Some(s) => prop_assert_eq!(*a, Outcome::Kept(s)),
                // Still no room for the ones that waited (nothing was freed).
                None => prop_assert!(matches!(a, Outcome::Waiting { .. }), "{:?}", a),
            }
        }
        prop_assert_eq!(first.live_slots, again.live_slots);
    }

    #[test]
    fn duplicate_claims_go_to_the_older_pod(max in 2..40u32, first in 0..40u32, len in 1..3u32, extra in 0..5usize) {
        let g = Geometry::new(4096, max).unwrap();
        prop_assume!(u64::from(first) + u64::from(len) <= u64::from(max));
        let window = Slots { first, len };
        // The older pod (first) and the younger (second) record the same window.
        let mut reqs = vec![Request { existing: Some(window), len, pinned: false }, Request { existing: Some(window), len, pinned: false }];
        reqs.extend((0..extra).map(|_| new(1)));
        let a = allocate(g, &reqs, &[]);
        prop_assert_eq!(a.outcomes[0], Outcome::Kept(window));
        match a.outcomes[1] {
            Outcome::Reassigned { lost, new } => {
                prop_assert_eq!(lost, window);
                prop_assert!(!new.overlaps(window));
                prop_assert_eq!(new.len, len);
            }
            Outcome::Waiting { lost } => {
                prop_assert_eq!(lost, Some(window));
                // Only the kept window is taken when the younger pod is served (extras come
                // after it), so it waits exactly when no run of `len` lies outside the window.
                prop_assert!(first < len && max - (first + len) < len, "waits though room is left");
            }
            other => prop_assert!(false, "younger duplicate kept: {:?}", other),
        }
    }

    #[test]
    fn exhaustion_is_reported_exactly_when_no_run_is_left(max in 1..64u32, lens in proptest::collection::vec(1..4u32, 0..40)) {
        let g = Geometry::new(4096, max).unwrap();
        let reqs: Vec<Request> = lens.iter().map(|&l| new(l)).collect();
        let a = allocate(g, &reqs, &[]);
        // Rebuild the map and check that every waiting request truly has no free run.
        let mut m = SlotMap::new(max);
        for o in &a.outcomes {
            if let Some(s) = o.slots() {
                prop_assert!(m.try_claim(s));
            }
        }
        for (r, o) in reqs.iter().zip(&a.outcomes) {
            if matches!(o, Outcome::Waiting { .. }) {
                let free_run = (0..max).any(|f| m.is_free(Slots { first: f, len: r.len }));
                prop_assert!(!free_run, "request of {} waits though a run is free", r.len);
            }
        }
        let total: u32 = lens.iter().sum();
        if total <= max {
            prop_assert_eq!(a.waiting(), 0, "first fit of requests in order never fragments a space that fits all");
        }
    }
}
