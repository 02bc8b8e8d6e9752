//! `plan` against hostile and careless input (issue 15): it never panics, stalls or balloons,
//! refuses what `kubectl` and the API server would refuse, and names the file, place and field.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn ex(p: &str) -> String {
    examples().join(p).to_str().unwrap().to_string()
}

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocefabric-operator"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

/// `plan` of `fabrics` over the example cluster, with extra arguments.
fn plan_example(fabrics: &str, extra: &[&str]) -> Output {
    let (nodes, pods) = (
        ex("cluster-snapshot/nodes.yaml"),
        ex("cluster-snapshot/pods.yaml"),
    );
    let mut args = vec!["--fabrics", fabrics, "--nodes", &nodes, "--pods", &pods];
    args.extend(extra);
    plan(&args)
}

/// `plan` of the example fabric over the example nodes and `pods`, with extra arguments.
fn plan_pods(pods: &str, extra: &[&str]) -> Output {
    let (fabric, nodes) = (ex("rocefabric-dgx.yaml"), ex("cluster-snapshot/nodes.yaml"));
    let mut args = vec![
        "--fabrics",
        fabric.as_str(),
        "--nodes",
        &nodes,
        "--pods",
        pods,
    ];
    args.extend(extra);
    plan(&args)
}

/// What `plan` says on stderr of a pods file `name` holding `text`.
fn pods_error(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    stderr(&plan_pods(&write(dir, name, text), &[]))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The example fabric as JSON, edited by `edit`.
fn fabric_with(dir: &tempfile::TempDir, edit: impl FnOnce(&mut Value)) -> String {
    let text = std::fs::read_to_string(examples().join("rocefabric-dgx.yaml")).unwrap();
    let mut v: Value = yaml_serde::from_str(&text).unwrap();
    edit(&mut v);
    write(dir, "fabric.json", &v.to_string())
}

/// The fabric's field errors from `plan --output json`, and the exit status.
fn fabric_errors(fabric: &str) -> (Option<i32>, Vec<(String, String)>) {
    let out = plan_example(fabric, &["--output", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON plan: {}", stderr(&out)));
    let errors = v["fabrics"][0]["errors"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["field"].as_str().unwrap().to_string(),
                e["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (out.status.code(), errors)
}

#[test]
fn a_65536_character_name_is_cut_in_the_table_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let f = fabric_with(&dir, |v| v["metadata"]["name"] = json!("x".repeat(65_536)));
    let out = plan_example(&f, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("…(65536 bytes)"), "{}", &table[..300]);
    assert!(table.lines().all(|l| l.len() < 2048));
}

#[test]
fn deep_nesting_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let n = 40_000;
    // As the issue gives it (JSON-shaped), and as YAML flow collections inside block YAML.
    let json_deep = write(
        &dir,
        "d.yaml",
        &format!("{}1{}", "[{\"a\": ".repeat(n), "}]".repeat(n)),
    );
    let yaml_deep = write(
        &dir,
        "y.yaml",
        &format!("kind: x\nspec: {}1{}\n", "{a: [".repeat(n), "]}".repeat(n)),
    );
    for (f, why) in [
        (json_deep, "recursion limit exceeded"),
        (yaml_deep, "nested deeper than 100 levels"),
    ] {
        let out = plan_example(&f, &[]);
        assert_eq!(out.status.code(), Some(1));
        let e = stderr(&out);
        assert!(e.contains(&f) && e.contains(why), "{e}");
    }
}

#[test]
fn endless_and_binary_files_are_refused_without_reading_them_whole() {
    let out = plan_example("/dev/zero", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/dev/zero: file: not text: a NUL byte at offset 0"),
        "{}",
        stderr(&out)
    );
    let out = plan_example("/dev/urandom", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn duplicate_keys_are_refused_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        &dir,
        "f.yaml",
        "apiVersion: rocefabric.io/v1alpha1\nkind: RoceFabric\nmetadata: {name: a}\nspec:\n  qos: {roceDscp: 26}\nspec:\n  qos: {roceDscp: 30}\n",
    );
    let out = plan_example(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("duplicate key \"spec\" at line 6"), "{e}");
}

#[test]
fn unknown_fields_make_the_fabric_invalid_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let f = fabric_with(&dir, |v| {
        let spec = v["spec"].as_object_mut().unwrap();
        let sel = spec.remove("nodeSelector").unwrap();
        spec.insert("nodeSelectr".into(), sel);
    });
    let (code, errors) = fabric_errors(&f);
    assert_eq!(code, Some(1));
    assert_eq!(
        errors,
        [(
            "spec.nodeSelectr".to_string(),
            "unknown field \"nodeSelectr\" (did you mean \"nodeSelector\"?)".to_string()
        )]
    );
}

/// An edit of the example fabric.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn sets_api_version_and_names_are_checked_as_the_api_server_does() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(Edit, &str, &str); 4] = [
        (
            Box::new(|v| v["spec"]["qos"]["pfcPriorities"] = json!([3, 3])),
            "spec.qos.pfcPriorities[1]",
            "Duplicate value: 3",
        ),
        (
            Box::new(|v| v["apiVersion"] = json!("rocefabric.io/v9")),
            "apiVersion",
            "Unsupported value: \"rocefabric.io/v9\"",
        ),
        (
            Box::new(|v| v["metadata"]["name"] = json!("")),
            "metadata.name",
            "must not be empty",
        ),
        (
            Box::new(|v| v["metadata"]["name"] = json!("Bad_Name")),
            "metadata.name",
            "RFC 1123",
        ),
    ];
    for (edit, field, needle) in cases {
        let f = fabric_with(&dir, edit);
        let (code, errors) = fabric_errors(&f);
        assert_eq!(code, Some(1));
        assert!(
            errors.iter().any(|(f, m)| f == field && m.contains(needle)),
            "{field}: {errors:?}"
        );
    }
    // Pods and nodes: names as the API server requires them, with the field named.
    let pods = write(
        &dir,
        "pods.yaml",
        "kind: Pod\napiVersion: v1\nmetadata: {name: \"a b\", namespace: default}\n",
    );
    let nodes = ex("cluster-snapshot/nodes.yaml");
    let out = plan(&[
        "--fabrics",
        &ex("rocefabric-dgx.yaml"),
        "--nodes",
        &nodes,
        "--pods",
        &pods,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("metadata.name: Invalid value: \"a b\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_object_given_twice_is_counted_once_and_a_differing_copy_is_refused() {
    let (fabric, nodes, pods) = (
        ex("rocefabric-dgx.yaml"),
        ex("cluster-snapshot/nodes.yaml"),
        ex("cluster-snapshot/pods.yaml"),
    );
    let once = plan(&[
        "--fabrics",
        &fabric,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--output",
        "json",
    ]);
    let twice = plan(&[
        "--fabrics",
        &fabric,
        "--fabrics",
        &fabric,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--pods",
        &pods,
        "--output",
        "json",
    ]);
    assert!(twice.status.success(), "{}", stderr(&twice));
    let (a, b): (Value, Value) = (
        serde_json::from_slice(&once.stdout).unwrap(),
        serde_json::from_slice(&twice.stdout).unwrap(),
    );
    assert_eq!(a["regions"], b["regions"], "each pod gets one region");
    assert_eq!(a["writes"], b["writes"], "and one annotation write");
    assert!(
        stderr(&twice).contains("Pod default/trainer-0 is given twice"),
        "{}",
        stderr(&twice)
    );
    assert!(
        stderr(&twice).contains("RoceFabric training is given twice"),
        "{}",
        stderr(&twice)
    );

    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&pods)
        .unwrap()
        .replace("3f0d9a61", "00000000");
    let other = write(&dir, "other.yaml", &text);
    let out = plan(&[
        "--fabrics",
        &fabric,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--pods",
        &other,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("Pod default/trainer-0 was already given, with other contents"),
        "{e}"
    );
}

#[test]
fn empty_input_and_escapes_are_not_passed_off() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(&dir, "empty.yaml", "");
    let out = plan_example(&empty, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("the --fabrics files hold no RoceFabric"),
        "{}",
        stderr(&out)
    );

    // A namespace with a newline cannot forge a row of the table.
    let pods = std::fs::read_to_string(ex("cluster-snapshot/pods.yaml"))
        .unwrap()
        .replace(
            "namespace: ml-eval",
            "namespace: \"ml-eval\\ndefault    forged  training\"",
        );
    let pods = write(&dir, "pods.yaml", &pods);
    let out = plan_pods(&pods, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the namespace is refused: {}",
        stderr(&out)
    );
    // And a fabric error message quoting the value escapes it.
    let f = fabric_with(&dir, |v| {
        v["metadata"]["name"] = json!("a\n\u{1b}[2Jforged")
    });
    let out = plan_example(&f, &[]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(!table.contains('\u{1b}'), "{table}");
    assert!(table.contains("a\\n\\u{1b}[2Jforged"), "{table}");
}

#[test]
fn messages_name_the_field_once_with_integer_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        &dir,
        "big.yaml",
        &std::fs::read_to_string(examples().join("rocefabric-dgx.yaml"))
            .unwrap()
            .replace("maxRegions: 4096", "maxRegions: 18446744073709551616")
            .replace("roceDscp: 26", "roceDscp: 99"),
    );
    let (code, errors) = fabric_errors(&f);
    assert_eq!(code, Some(1));
    assert!(
        errors.contains(&(
            "spec.sharedMemory.maxRegions".into(),
            "18446744073709551616 is greater than the maximum of 1048576".into()
        )),
        "{errors:?}"
    );
    assert!(
        errors.contains(&(
            "spec.qos.roceDscp".into(),
            "99 is greater than the maximum of 63".into()
        )),
        "{errors:?}"
    );

    let f = fabric_with(&dir, |v| {
        v["spec"]["sharedMemory"]["regionSize"] = json!("16Ei")
    });
    let (_, errors) = fabric_errors(&f);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "spec.sharedMemory.regionSize");
    assert!(
        errors[0]
            .1
            .starts_with("regionSize must be a positive quantity"),
        "{errors:?}"
    );

    // A bad field of a pod is named by its path, and the file once. (Only the fields the
    // planner reads are decoded: a bad container port is not its business.)
    let pods = write(
        &dir,
        "pods.yaml",
        "kind: Pod\napiVersion: v1\nmetadata: {name: a, namespace: default}\nspec:\n  schedulingGates: [{name: [gate]}]\n  containers: [{name: c, ports: [{containerPort: http}]}]\n",
    );
    let out = plan_pods(&pods, &[]);
    let e = stderr(&out);
    assert!(
        e.contains("spec.schedulingGates[0].name: invalid type"),
        "{e}"
    );
    assert_eq!(e.matches(pods.as_str()).count(), 1, "{e}");
}

#[test]
fn a_json_pod_list_is_streamed_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let pod = |i: usize| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("u{i}"),
                "labels": {"rocefabric.io/fabric": "training"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(1000)}},
            "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "y".repeat(1000)}]}],
                "schedulingGates": [{"name": "rocefabric.io/region"}]}})
    };
    // kubectl's order: apiVersion, items, kind, metadata (the kind comes after the items).
    let list = format!(
        "{{\"apiVersion\": \"v1\", \"items\": [{}], \"kind\": \"List\", \"metadata\": {{}}}}",
        (0..3)
            .map(|i| pod(i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let pods = write(&dir, "pods.json", &list);
    let out = plan_pods(&pods, &["--output", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["regions"].as_array().unwrap().len(), 3, "{v}");
    // A bad item is named by its index.
    let bad = list
        .replacen("\"kind\": \"Pod\"", "\"kind\": \"Node\"", 1)
        .replace("\"kind\":\"Pod\"", "\"kind\":\"Node\"");
    let pods = write(&dir, "bad.json", &bad);
    let out = plan_pods(&pods, &[]);
    assert!(
        stderr(&out).contains("bad.json: item 0 (Node p0): expected Pod"),
        "{}",
        stderr(&out)
    );
}

/// Valid files that strictness must not refuse: non-ASCII comments and values, unbalanced
/// brackets in plain values, flow-style YAML, a byte order mark, status fields of a newer version.
#[test]
fn valid_input_stays_valid() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(examples().join("rocefabric-dgx.yaml")).unwrap();
    let ja = write(
        &dir,
        "ja.yaml",
        &format!("# DGXノード用のファブリック\n{example}"),
    );
    let bom = write(&dir, "bom.yaml", &format!("\u{feff}{example}"));
    let newer = write(
        &dir,
        "newer.yaml",
        &format!("{example}status:\n  newCounter: 3\n"),
    );
    for f in [&ja, &bom, &newer] {
        let out = plan_example(f, &[]);
        assert!(out.status.success(), "{f}: {}", stderr(&out));
    }
    // 150 pods whose annotation kubectl writes as a plain `fix [WIP`, in a kubectl List.
    let items: String = (0..150)
        .map(|i| {
            format!(
                "- apiVersion: v1\n  kind: Pod\n  metadata:\n    annotations:\n      note: fix [WIP {{x\n      owner: rock 'n roll\n    name: p{i}\n    namespace: default\n"
            )
        })
        .collect();
    let pods = write(
        &dir,
        "wip.yaml",
        &format!("apiVersion: v1\nitems:\n{items}kind: List\nmetadata:\n  resourceVersion: \"\"\n"),
    );
    let out = plan_pods(&pods, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Flow-style YAML starts like JSON.
    let flow = write(
        &dir,
        "flow.yaml",
        "{apiVersion: v1, kind: Pod, metadata: {name: a, namespace: b}}\n",
    );
    let out = plan_pods(&flow, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn lines_count_in_the_whole_file_and_messages_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    // A duplicate after the items of a List, and one inside an item after a column-0 comment.
    let e = pods_error(
        &dir,
        "after.yaml",
        "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a, namespace: b}\nkind: List\nkind: List\n",
    );
    assert!(e.contains("duplicate key \"kind\" at line 7"), "{e}");
    let e = pods_error(
        &dir,
        "inside.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n# c\n  metadata:\n    name: a\n    name: b\n",
    );
    assert!(e.contains("duplicate key \"name\" at line 9"), "{e}");
    // A label key with a terminal escape and a newline reaches stderr escaped.
    let e = pods_error(
        &dir,
        "forged.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: b\n  labels:\n    \"\\e[31mFORGED\\nline\": 1\n",
    );
    assert!(!e.contains('\u{1b}') && e.lines().count() == 1, "{e:?}");
    // A megabyte-long value is cut in the message.
    let e = pods_error(&dir, "long.yaml", &format!("{}\n", "x".repeat(1_000_000)));
    assert!(e.len() < 4096, "{} bytes", e.len());
}

#[test]
fn an_object_over_8_mib_is_refused_while_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = vec!["0"; 5_000_000].join(",");
    let e = pods_error(
        &dir,
        "big.json",
        &format!(
            "{{\"apiVersion\": \"v1\", \"items\": [{{\"kind\": \"Pod\", \"x\": [{zeros}]}}], \"kind\": \"List\"}}"
        ),
    );
    assert!(e.contains("an object larger than 8 MiB"), "{e}");
    let e = pods_error(
        &dir,
        "big.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, namespace: b}}\nx:\n{}",
            "- 0\n".repeat(3_000_000)
        ),
    );
    assert!(e.contains("an object larger than 8 MiB"), "{e}");
}

#[test]
fn a_differing_copy_of_an_invalid_fabric_is_not_merged() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(examples().join("rocefabric-dgx.yaml")).unwrap();
    let bad = write(
        &dir,
        "bad.yaml",
        &example.replace("roceDscp: 26", "roceDscp: 99"),
    );
    let out = plan_example(&bad, &["--fabrics", &ex("rocefabric-dgx.yaml")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("RoceFabric training was already given, with other contents"),
        "{}",
        stderr(&out)
    );
    let out = plan_example(&bad, &["--fabrics", &bad]);
    assert!(
        stderr(&out).contains("RoceFabric training is given twice"),
        "{}",
        stderr(&out)
    );
}
