//! The two inputs the operator gives a pod (pure): its own window (the `rocefabric.io/region`
//! annotation, read from a downward-API file) and the fabric's region directory (the
//! `<fabric>-regions` ConfigMap, key `regions.json`), and the lookup from a global address to the
//! pod that owns it, bounds-checked before anything is posted.

use rocefabric_formats::directory::{self, DirectoryEntry};
use rocefabric_formats::region::RegionAssignment;

use crate::error::{DsmError, Result};

/// Parse this pod's annotation text into its window `[base, base + size)`; `field` names where
/// it came from (a file path or variable). Refuses an empty window or one past the 64-bit space.
pub fn parse_assignment(field: &str, text: &str) -> Result<RegionAssignment> {
    if text.trim().is_empty() {
        // The downward API writes an absent annotation as an empty file.
        return Err(DsmError::input(
            field,
            "",
            format!(
                "this pod has no window: no rocefabric.io/region annotation (a pod started without \
                 the rocefabric.io/region scheduling gate, or one whose window was reclaimed: see \
                 its {} annotation)",
                rocefabric_formats::names::REGION_RECLAIMED_ANNOTATION
            ),
        ));
    }
    let a = RegionAssignment::parse(text.trim()).map_err(|e| {
        DsmError::input(
            field,
            text.trim(),
            format!("not a region annotation: {}", e.reason),
        )
    })?;
    if a.size == 0 || a.base.checked_add(a.size).is_none() {
        return Err(DsmError::input(
            field,
            text.trim(),
            "size must be positive and base + size fit in 64 bits",
        ));
    }
    Ok(a)
}

/// A namespace's windows, sorted by base, disjoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Directory {
    entries: Vec<DirectoryEntry>,
}

impl Directory {
    /// Parse `regions.json`. Overlapping windows are refused: the operator never writes them, so
    /// seeing one means the input is not the operator's directory.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        let mut entries = directory::parse(text).map_err(|e| {
            DsmError::input(field, snippet(text), format!("not a region directory: {e}"))
        })?;
        // A window past the 64-bit space would hide an overlap behind a saturated end.
        if let Some(e) = entries
            .iter()
            .find(|e| e.base.checked_add(e.size).is_none())
        {
            return Err(DsmError::input(
                field,
                snippet(text),
                format!("window of {} runs past the 64-bit address space", e.pod),
            ));
        }
        entries.sort_by_key(|e| e.base);
        for pair in entries.windows(2) {
            if pair[0].end() > pair[1].base {
                return Err(DsmError::input(
                    field,
                    snippet(text),
                    format!(
                        "windows of {} and {} overlap at {:#x}",
                        pair[0].pod, pair[1].pod, pair[1].base
                    ),
                ));
            }
        }
        if let Some(e) = entries.iter().find(|e| e.size == 0) {
            return Err(DsmError::input(
                field,
                snippet(text),
                format!("window of {} is empty", e.pod),
            ));
        }
        Ok(Directory { entries })
    }

    pub fn entries(&self) -> &[DirectoryEntry] {
        &self.entries
    }

    /// The entry of a pod by name.
    pub fn pod(&self, name: &str) -> Option<&DirectoryEntry> {
        self.entries.iter().find(|e| e.pod == name)
    }

    /// The owner of `[addr, addr + len)`, or why there is none. `len` 0 is checked as 1 byte.
    pub fn owner(&self, addr: u64, len: u64) -> Result<&DirectoryEntry> {
        Ok(&self.entries[self.owner_index(addr, len)?])
    }

    /// [`Directory::owner`] as its index in [`Directory::entries`].
    pub fn owner_index(&self, addr: u64, len: u64) -> Result<usize> {
        let Some(i) = self
            .entries
            .partition_point(|e| e.base <= addr)
            .checked_sub(1)
            .filter(|&i| addr < self.entries[i].end())
        else {
            return Err(DsmError::Unassigned { addr });
        };
        let e = &self.entries[i];
        if addr.checked_add(len.max(1)).is_none_or(|end| end > e.end()) {
            return Err(DsmError::OutOfWindow {
                addr,
                len,
                owner: e.pod.clone(),
                base: e.base,
                end: e.end(),
            });
        }
        Ok(i)
    }
}

/// Read and parse the directory file at `path`, with the [`Stamp`] it had just before: a file
/// swapped after the stamp (the kubelet renames a ConfigMap volume's new version in at any moment)
/// is re-read at the next check. A stamp taken after the read could name the new version while
/// the old one is kept, and the new one would never be read.
pub(crate) fn read_stamped(path: &std::path::Path) -> Result<(Stamp, Directory)> {
    let stamp = stamp(path);
    Ok((stamp, read(path)?))
}

/// Read and parse the directory file at `path`.
fn read(path: &std::path::Path) -> Result<Directory> {
    let field = path.display().to_string();
    // The directory is a ConfigMap's data (etcd keeps objects under 1.5 MiB); 16 MiB is ample.
    let text = rocefabric_input::read::read_file(path, 16 << 20).map_err(|e| {
        DsmError::input(&field, "", format!("cannot read the region directory: {e}"))
    })?;
    Directory::parse(&field, &text)
}

/// What tells a changed directory file: its inode, modification time and length (none when
/// unreadable). The kubelet writes each version of a ConfigMap volume as a new file, so the inode
/// tells a swap even where the clock's granularity and the length would not.
pub(crate) type Stamp = Option<(u64, std::time::SystemTime, u64)>;

/// The [`Stamp`] of the file at `path` now (through the volume's symlinks).
pub(crate) fn stamp(path: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.modified().ok()?, m.len()))
}

fn snippet(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = r#"[
{"pod":"a","node":"n0","podIP":"10.1.0.2","id":0,"base":0,"size":4096,"uid":"u-a"},
{"pod":"b","id":2,"base":8192,"size":8192}
]
"#;

    #[test]
    fn an_address_maps_to_its_owner_and_every_miss_says_why() {
        let d = Directory::parse("regions.json", DIR).unwrap();
        assert_eq!(d.owner(0, 4096).unwrap().pod, "a");
        assert_eq!(d.owner(4095, 1).unwrap().uid.as_deref(), Some("u-a"));
        assert_eq!(d.owner(16383, 1).unwrap().pod, "b");
        assert!(matches!(
            d.owner(4096, 8),
            Err(DsmError::Unassigned { addr: 4096 })
        ));
        assert!(matches!(
            d.owner(16384, 1),
            Err(DsmError::Unassigned { .. })
        ));
        let e = d.owner(4000, 200).unwrap_err();
        assert!(
            matches!(e, DsmError::OutOfWindow { ref owner, end: 4096, .. } if owner == "a"),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "address 0xfa0 (+200 bytes): out of window: pod a holds [0x0, 0x1000)"
        );
        assert!(matches!(
            d.owner(u64::MAX, 2),
            Err(DsmError::Unassigned { .. })
        ));
        assert!(matches!(
            d.owner(8192, u64::MAX),
            Err(DsmError::OutOfWindow { .. })
        ));
    }

    #[test]
    fn overlapping_or_malformed_directories_are_refused_naming_the_file() {
        let bad =
            r#"[{"pod":"a","id":0,"base":0,"size":4096},{"pod":"b","id":1,"base":4095,"size":1}]"#;
        let e = Directory::parse("/etc/dir/regions.json", bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/dir/regions.json ") && e.contains("a and b overlap at 0xfff"),
            "{e}"
        );
        let e = Directory::parse("regions.json", "{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a region directory"), "{e}");
        // Found by fuzz/ (region_directory): a saturated end hid this overlap at the top byte.
        let top = r#"[{"pod":"a","id":0,"base":18446744073709547520,"size":4096},{"pod":"b","id":1,"base":18446744073709551615,"size":1}]"#;
        let e = Directory::parse("regions.json", top)
            .unwrap_err()
            .to_string();
        assert!(e.contains("window of a runs past the 64-bit"), "{e}");
    }

    #[test]
    fn the_annotation_is_read_with_or_without_uid() {
        let a = parse_assignment(
            "region",
            r#"{"fabric":"f","id":3,"base":12288,"size":4096,"uid":"u1"}"#,
        )
        .unwrap();
        assert_eq!(
            (a.base, a.end(), a.uid.as_deref()),
            (12288, 16384, Some("u1"))
        );
        let a = parse_assignment("region", r#"{"fabric":"f","id":0,"base":0,"size":1}"#).unwrap();
        assert_eq!(a.uid, None);
        let e = parse_assignment("/etc/podinfo/region", "")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/podinfo/region \"\": this pod has no window")
                && e.contains("rocefabric.io/region-reclaimed"),
            "{e}"
        );
        let e = parse_assignment("r", r#"{"fabric":"f","id":0,"base":0,"size":0}"#).unwrap_err();
        assert!(e.to_string().contains("size must be positive"));
    }

    /// A ConfigMap volume as the kubelet writes it: `regions.json -> ..data/regions.json`,
    /// `..data -> <version dir>`, a new version swapped in by renaming a new `..data` link over it.
    fn kubelet_swap(volume: &std::path::Path, version: &str, text: &str) {
        let dir = volume.join(format!("..{version}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("regions.json"), text).unwrap();
        let tmp = volume.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
        std::fs::rename(&tmp, volume.join("..data")).unwrap();
        let link = volume.join("regions.json");
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink("..data/regions.json", link).unwrap();
        }
    }

    #[test]
    fn a_volume_swapped_by_the_kubelet_changes_the_stamp_even_at_the_same_length() {
        let volume = tempfile::tempdir().unwrap();
        let path = volume.path().join("regions.json");
        let without_ip = r#"[{"pod":"a","id":0,"base":0,"size":4096}]"#;
        // Same length, so only the inode (or the clock) tells them apart.
        let other_pod = r#"[{"pod":"b","id":0,"base":0,"size":4096}]"#;
        kubelet_swap(volume.path(), "v1", without_ip);
        let (first, d) = read_stamped(&path).unwrap();
        assert_eq!(d.entries()[0].pod, "a");
        assert_eq!(first, stamp(&path), "nothing changed since the read");
        kubelet_swap(volume.path(), "v2", other_pod);
        assert_ne!(stamp(&path), first, "a same-length swap is seen");
        let (second, d) = read_stamped(&path).unwrap();
        assert_eq!((d.entries()[0].pod.as_str(), second), ("b", stamp(&path)));
        let with_ip = r#"[{"pod":"b","podIP":"10.1.0.2","id":0,"base":0,"size":4096}]"#;
        kubelet_swap(volume.path(), "v3", with_ip);
        assert_ne!(stamp(&path), second);
        assert_eq!(stamp(&volume.path().join("gone")), None);
    }

    proptest::proptest! {
        #[test]
        fn owner_agrees_with_a_linear_scan(
            sizes in proptest::collection::vec((0u64..3, 1u64..5), 1..8),
            addr in 0u64..64, len in 0u64..12,
        ) {
            let mut base = 0;
            let mut entries = Vec::new();
            for (i, (gap, size)) in sizes.iter().enumerate() {
                base += gap;
                entries.push(format!(r#"{{"pod":"p{i}","id":{i},"base":{base},"size":{size}}}"#));
                base += size;
            }
            let d = Directory::parse("d", &format!("[{}]", entries.join(","))).unwrap();
            let expect = d.entries().iter().find(|e| e.base <= addr && addr < e.end());
            match (d.owner(addr, len), expect) {
                (Ok(got), Some(e)) => {
                    proptest::prop_assert_eq!(&got.pod, &e.pod);
                    proptest::prop_assert!(addr + len.max(1) <= e.end());
                }
                (Err(DsmError::OutOfWindow { owner, .. }), Some(e)) => {
                    proptest::prop_assert_eq!(owner, e.pod.clone());
                    proptest::prop_assert!(addr + len.max(1) > e.end());
                }
                (Err(DsmError::Unassigned { .. }), None) => {}
                (got, expect) => proptest::prop_assert!(false, "{:?} vs {:?}", got, expect),
            }
        }
    }
}
