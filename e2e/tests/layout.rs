//! The house rules of the README's Layout section, checked on the workspace itself, so they hold
//! after every change rather than once:
//! - dependencies point one way (formats, API types, model, I/O crates, binaries, test support);
//! - no production crate depends on a test-support crate;
//! - the pure crates have no tokio, kube, gRPC or filesystem crates among their dependencies;
//! - no two source files of a crate import each other;
//! - no source file is over 700 lines, but for the exceptions listed here with their reason;
//! - `unsafe` is allowed in exactly the files the README lists.

#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Each workspace crate's layer: a crate may depend only on crates of a lower layer.
const LAYERS: &[(&str, u8)] = &[
    ("rocefabric-formats", 0),
    ("rocefabric-input", 0),
    ("rocefabric-api", 1),
    ("rocefabric-runtime", 1),
    ("rocefabric-h2-authority", 1),
    ("rocefabric-node-model", 2),
    ("rocefabric-kubelet-api", 3),
    ("rocefabric-dsm", 3),
    ("rocefabric-dra", 4),
    ("rocefabric-qos-agent", 4),
    ("rocefabric-operator", 5),
    ("rocefabric-device-plugin", 5),
    ("rocefabric-node-testing", 6),
    ("rocefabric-operator-testing", 6),
    ("rocefabric-e2e", 7),
    ("rocefabric-fuzz", 7),
];

/// Test doubles: only tests, benches, e2e and fuzz may use them.
const TEST_SUPPORT: &[&str] = &["rocefabric-node-testing", "rocefabric-operator-testing"];
/// Crates that are not shipped: they may depend on test support.
const NOT_SHIPPED: &[&str] = &["rocefabric-e2e", "rocefabric-fuzz"];
/// Crates that decide without I/O, and what they must not depend on.
const PURE: &[&str] = &["rocefabric-formats", "rocefabric-node-model"];
const NOT_PURE: &[&str] = &[
    "tokio",
    "kube",
    "k8s-openapi",
    "tonic",
    "tempfile",
    "notify",
    "netlink-sys",
    "axum",
    "libc",
];

/// Files allowed past the line limit, with why.
const LONG_FILES: &[(&str, &str)] = &[];
const MAX_LINES: usize = 700;

/// The files that may hold `unsafe` (README, Choices): the ioctl, the verbs room, the operator's heap.
const UNSAFE_FILES: &[&str] = &[
    "device-plugin/qos/src/ethtool.rs",
    "dsm/src/verbs.rs",
    "operator/src/heap.rs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each workspace crate with its workspace dependencies: `(name, kind)` where kind is `normal`,
/// `build` or `dev`.
fn workspace_deps() -> BTreeMap<String, Vec<(String, String)>> {
    let meta = metadata();
    let packages = meta["packages"].as_array().unwrap();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                    (d["name"].as_str().unwrap().to_string(), kind)
                })
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

fn layer(name: &str) -> Option<u8> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

#[test]
fn every_crate_has_a_layer_and_depends_only_downwards() {
    let deps = workspace_deps();
    let mut wrong = Vec::new();
    for (name, list) in &deps {
        let Some(own) = layer(name) else {
            wrong.push(format!("{name} has no layer in LAYERS"));
            continue;
        };
        for (dep, kind) in list {
            if kind == "dev" {
                continue;
            }
            if let Some(theirs) = layer(dep)
                && theirs >= own
            {
                wrong.push(format!("{name} (layer {own}) -> {dep} (layer {theirs})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn no_shipped_crate_depends_on_test_support() {
    let deps = workspace_deps();
    let mut wrong = Vec::new();
    for (name, list) in &deps {
        if NOT_SHIPPED.contains(&name.as_str()) || TEST_SUPPORT.contains(&name.as_str()) {
            continue;
        }
        for (dep, kind) in list {
            if kind != "dev" && TEST_SUPPORT.contains(&dep.as_str()) {
                wrong.push(format!("{name} -> {dep} ({kind})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The rule has teeth: every test-support crate exists and is used by some test.
    for support in TEST_SUPPORT {
        assert!(
            deps.contains_key(*support),
            "{support} is not in the workspace"
        );
    }
}

/// Crates that do I/O, which no pure crate may pull in, however deep.
const IO_CRATES: &[&str] = &[
    "tokio",
    "kube-client",
    "kube-runtime",
    "tonic",
    "hyper",
    "tempfile",
    "notify",
    "netlink-sys",
    "axum",
];

#[test]
fn pure_crates_pull_in_no_io_crate_at_any_depth() {
    for pure in PURE {
        let out = Command::new(env!("CARGO"))
            .args([
                "tree",
                "--offline",
                "-q",
                "-e",
                "normal,build",
                "--prefix",
                "none",
                "-p",
                pure,
            ])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tree = String::from_utf8_lossy(&out.stdout);
        let io: BTreeSet<&str> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| IO_CRATES.contains(name))
            .collect();
        assert!(io.is_empty(), "{pure} pulls in {io:?}");
        assert!(tree.lines().count() > 1, "{pure}: no tree printed");
    }
}

#[test]
fn pure_crates_have_no_io_dependencies() {
    let deps = workspace_deps();
    for pure in PURE {
        let list = deps.get(*pure).unwrap_or_else(|| panic!("{pure} missing"));
        let io: Vec<&String> = list
            .iter()
            .filter(|(d, kind)| kind != "dev" && NOT_PURE.contains(&d.as_str()))
            .map(|(d, _)| d)
            .collect();
        assert!(io.is_empty(), "{pure} depends on {io:?}");
    }
}

/// The `.rs` files of the workspace that are ours (not generated, not under `target/`).
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if !matches!(name.as_ref(), "target" | ".git" | "corpus" | ".state") {
                    walk(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let mut long = Vec::new();
    for path in sources() {
        let rel = relative(&path);
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        let excepted = LONG_FILES.iter().any(|(f, _)| *f == rel);
        if lines > MAX_LINES && !excepted {
            long.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(long.is_empty(), "split these at what they do: {long:#?}");
}

/// Code without comments and without its `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    before_tests
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !t.starts_with("//")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A crate's `src` files as module paths (`serve::publish`), with the modules each refers to.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    for path in sources() {
        if path.starts_with(src) {
            files.push(path);
        }
    }
    let module = |path: &Path| -> String {
        let rel = path.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts.join("::")
    };
    let names: BTreeSet<String> = files.iter().map(|p| module(p)).collect();
    let resolve = |path: &str| -> Option<String> {
        let mut parts: Vec<&str> = path.split("::").collect();
        while !parts.is_empty() {
            let candidate = parts.join("::");
            if names.contains(&candidate) {
                return Some(candidate);
            }
            parts.pop();
        }
        None
    };
    let mut graph = BTreeMap::new();
    for path in &files {
        let me = module(path);
        let code = code_of(&std::fs::read_to_string(path).unwrap());
        let mut refs = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if let Some(m) = resolve(rest.trim_end_matches(':')) {
                refs.insert(m);
            }
        }
        for (i, _) in code.match_indices("super::") {
            let rest: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `super` of a file module is its parent module.
            let parent = me.rsplit_once("::").map(|(p, _)| p).unwrap_or("");
            let full = if parent.is_empty() {
                rest
            } else {
                format!("{parent}::{rest}")
            };
            if let Some(m) = resolve(&full) {
                refs.insert(m);
            }
        }
        refs.remove(&me);
        graph.insert(me, refs);
    }
    graph
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut cycles = Vec::new();
    let mut crates = 0;
    for path in sources() {
        if path
            .file_name()
            .is_some_and(|n| n == "lib.rs" || n == "main.rs")
            && path.parent().is_some_and(|p| p.ends_with("src"))
        {
            let src = path.parent().unwrap().to_path_buf();
            if path.file_name().is_some_and(|n| n == "main.rs") && src.join("lib.rs").exists() {
                continue;
            }
            crates += 1;
            let graph = module_graph(&src);
            for (a, refs) in &graph {
                for b in refs {
                    // A parent module declares its children; only siblings and cousins count.
                    let nested =
                        b.starts_with(&format!("{a}::")) || a.starts_with(&format!("{b}::"));
                    if a < b && !nested && graph.get(b).is_some_and(|r| r.contains(a)) {
                        cycles.push(format!("{}: {a} <-> {b}", relative(&src)));
                    }
                }
            }
        }
    }
    assert!(
        crates >= 12,
        "found only {crates} crates: the walk is broken"
    );
    assert!(cycles.is_empty(), "move the shared type down: {cycles:#?}");
}

#[test]
fn unsafe_is_allowed_in_exactly_the_listed_files() {
    let mut found = BTreeSet::new();
    for path in sources() {
        let rel = relative(&path);
        if rel.starts_with("e2e/tests/layout.rs") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        if code.contains("allow(unsafe_code)") {
            found.insert(rel);
        }
    }
    let listed: BTreeSet<String> = UNSAFE_FILES.iter().map(|s| s.to_string()).collect();
    assert_eq!(found, listed, "update UNSAFE_FILES and the README together");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for file in UNSAFE_FILES {
        assert!(
            readme.contains(file),
            "the README's unsafe list misses {file}"
        );
    }
}
