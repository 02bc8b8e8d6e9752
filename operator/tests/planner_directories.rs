//! The planner's region directories: one per namespace with regions, following scheduling,
//! each line bound to its pod's uid, under the size limit at the documented scale, and gone
//! with the last region or with the fabric's shared memory.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use rocefabric_api::constants::condition;
use rocefabric_formats::directory::{self, DirectoryEntry};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_operator::planner::directory::{
    DOCUMENTED_REGIONS_PER_NAMESPACE, MAX_DIRECTORY_BYTES, MAX_ENTRY_BYTES,
};
use rocefabric_operator::planner::{REGION_DIRECTORY_TOO_LARGE, Write};
use rocefabric_operator_testing::objects::*;
use support::*;

#[test]
fn the_directory_follows_scheduling_and_is_removed_with_the_last_region() {
    let mut w = world(
        vec![shm(4)],
        vec![],
        vec![pod("ns", "p", 0, &[MEMBER], true)],
    );
    step(&mut w);
    assert_eq!(directory_of(&w, "ns").unwrap()[0].node, None);
    edit(&mut w.pods[0], |p| scheduled(p, "dgx-1", "10.1.0.5"));
    let p = step(&mut w);
    assert!(
        matches!(p.writes.as_slice(), [Write::ApplyRegionDirectory { .. }]),
        "{:?}",
        p.writes
    );
    let e = &directory_of(&w, "ns").unwrap()[0];
    assert_eq!(
        (e.node.as_deref(), e.pod_ip.as_deref()),
        (Some("dgx-1"), Some("10.1.0.5"))
    );

    w.pods[0].phase = Some("Succeeded".into());
    let p = step(&mut w);
    assert!(p.writes.contains(&Write::DeleteRegionDirectory {
        namespace: "ns".into(),
        fabric: "f".into()
    }));
    assert!(directory_of(&w, "ns").is_none());
    assert_eq!(
        fabric_of(&w, "f")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        0
    );
}

#[test]
fn the_directory_stays_under_one_mebibyte_at_the_documented_scale() {
    // Worst case entries: 253-character pod and node names, an IPv6 address, the largest numbers,
    // a 36-character uid.
    let entry = |i: usize| DirectoryEntry {
        pod: format!("{i:0>253}"),
        node: Some("n".repeat(253)),
        pod_ip: Some("fd00:1234:5678:9abc:def0:1234:5678:9abc".into()),
        id: 1_048_575,
        base: u64::MAX,
        size: u64::MAX,
        uid: Some("0c4d8e21-7a3f-4b9e-8d1c-2e5f6a7b8c9d".into()),
    };
    let one = directory::render(&[entry(0)]);
    assert_eq!(
        one.len() - "[\n\n]\n".len() + ",\n".len(),
        MAX_ENTRY_BYTES,
        "MAX_ENTRY_BYTES is the worst-case entry with its separator"
    );
    let entries: Vec<DirectoryEntry> = (0..DOCUMENTED_REGIONS_PER_NAMESPACE).map(entry).collect();
    let text = directory::render(&entries);
    assert!(text.len() <= DOCUMENTED_REGIONS_PER_NAMESPACE * MAX_ENTRY_BYTES + "[\n\n]\n".len());
    assert!(
        text.len() < 700 * 1024 && text.len() < MAX_DIRECTORY_BYTES,
        "{} bytes",
        text.len()
    );
    assert_eq!(directory::parse(&text).unwrap(), entries);
}

#[test]
fn each_directory_line_carries_its_owner_pods_uid() {
    let mut without = pod("ns", "no-uid", 1, &[MEMBER], false);
    without.metadata.uid = None;
    let pods = vec![pod("ns", "with-uid", 0, &[MEMBER], false), without];
    let mut w = world(vec![shm(4)], vec![], pods);
    step(&mut w);
    let text = w
        .config_maps
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some("f-regions"))
        .and_then(|cm| cm.data.as_ref())
        .map(|d| d[DIRECTORY_KEY].clone())
        .expect("a directory");
    let line = |pod: &str| {
        text.lines()
            .find(|l| l.contains(&format!("\"pod\":\"{pod}\"")))
            .unwrap_or_else(|| panic!("{pod} not listed: {text}"))
            .to_string()
    };
    assert!(
        line("with-uid").ends_with(r#","uid":"uid-ns-with-uid"},"#),
        "the uid, last: {text}"
    );
    assert!(!line("no-uid").contains("\"uid\""), "no uid: {text}");
    let entries = directory::parse(&text).unwrap();
    assert_eq!(entries[0].uid.as_deref(), Some("uid-ns-with-uid"));
    assert_eq!(entries[1].uid, None);
}

#[test]
fn a_directory_over_the_limit_is_not_written_and_is_reported() {
    let n = 1_500;
    let pods: Vec<_> = (0..n)
        .map(|i| pod("ns", &format!("{i:0>250}"), 0, &[MEMBER], false))
        .collect();
    let mut w = world(vec![shm(2_000)], vec![], pods);
    for p in &mut w.pods {
        edit(p, |p| {
            scheduled(
                p,
                &"n".repeat(253),
                "fd00:1234:5678:9abc:def0:1234:5678:9abc",
            )
        });
    }
    let p = step(&mut w);
    assert!(
        !p.writes
            .iter()
            .any(|w| matches!(w, Write::ApplyRegionDirectory { .. }))
    );
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED).1,
        REGION_DIRECTORY_TOO_LARGE
    );
    assert_eq!(
        fabric_of(&w, "f")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        n
    );
}

#[test]
fn removing_shared_memory_removes_the_directories_but_not_the_annotations() {
    let mut w = world(
        vec![shm(4)],
        vec![],
        vec![pod("ns", "p", 0, &[MEMBER], true)],
    );
    step(&mut w);
    assert!(directory_of(&w, "ns").is_some());
    w.fabrics[0].spec.shared_memory = None;
    w.fabrics[0].metadata.generation = Some(2);
    let p = step(&mut w);
    assert!(p.writes.contains(&Write::DeleteRegionDirectory {
        namespace: "ns".into(),
        fabric: "f".into()
    }));
    assert!(
        !p.writes
            .iter()
            .any(|w| matches!(w, Write::AnnotatePodRegion { .. }))
    );
    assert_eq!(region_of(&w, "ns", "p").unwrap().id, 0);
    assert_eq!(
        fabric_of(&w, "f").status.as_ref().unwrap().regions.capacity,
        0
    );
}
