//! Replays the checked-in corpus (`fuzz/corpus/<target>/*`) through every target, so each parser
//! runs over its seeds and every input a fuzzing run kept, in seconds, on stable Rust.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use rocefabric_fuzz::TARGETS;

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn every_target_has_a_corpus_and_every_corpus_a_target() {
    let targets: BTreeSet<&str> = TARGETS.iter().map(|t| t.name).collect();
    assert_eq!(targets.len(), TARGETS.len(), "two targets share a name");
    let dirs: BTreeSet<String> = fs::read_dir(corpus_root())
        .expect("fuzz/corpus exists")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for t in &targets {
        assert!(dirs.contains(*t), "target {t} has no fuzz/corpus/{t}/");
        assert!(
            !files(&corpus_root().join(t)).is_empty(),
            "fuzz/corpus/{t}/ is empty"
        );
    }
    for d in &dirs {
        assert!(
            targets.contains(d.as_str()),
            "fuzz/corpus/{d}/ has no target"
        );
    }
}

#[test]
fn the_corpus_stays_small() {
    let mut total = 0u64;
    for t in TARGETS {
        for f in files(&corpus_root().join(t.name)) {
            let len = fs::metadata(&f).map(|m| m.len()).unwrap_or_default();
            assert!(len < 64 * 1024, "{} is {len} bytes", f.display());
            total += len;
        }
    }
    assert!(total < 1024 * 1024, "the corpus is {total} bytes");
}

#[test]
fn every_corpus_input_passes_its_target() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for t in TARGETS {
        for f in files(&corpus_root().join(t.name)) {
            let data = fs::read(&f).expect("corpus file is readable");
            runs += 1;
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (t.run)(&data))) {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                failures.push(format!("target {}: {}: {msg}", t.name, f.display()));
            }
        }
    }
    assert!(runs > 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
