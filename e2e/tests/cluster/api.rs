//! The CRDs on the real API server: every CEL rule and every numeric range of the RoceFabric spec
//! rejects a violating object with a message naming the field and the rule (server-side dry run),
//! the defaults the server fills in are the ones `rocefabric_api` documents, and `kubectl get`
//! prints the declared columns.

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use rocefabric_api::RoceFabricSpec;
use serde_json::{Value, json};

use crate::{FABRIC, cluster, crd_file, eventually, kubectl};

fn fabric_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("rocefabric.io", "v1alpha1", "RoceFabric");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "rocefabrics"),
    )
}

fn fabric(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric", "metadata": {"name": name}, "spec": spec})
}

/// Create with `dryRun=All`: the server validates and defaults, and stores nothing.
async fn dry_run(client: &Client, object: &Value) -> Result<Value, String> {
    let obj: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    fabric_api(client)
        .create(&params, &obj)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| e.to_string())
}

fn crd_yaml(name: &str) -> Value {
    let text = std::fs::read_to_string(crd_file(name)).expect("generated CRD");
    yaml_serde::from_str(&text).expect("CRD YAML")
}

/// Update to `object` with `dryRun=All` (a JSON merge patch of the stored fabric).
async fn dry_run_update(client: &Client, object: &Value) -> Result<Value, String> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let params = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    fabric_api(client)
        .patch(name, &params, &Patch::Merge(object))
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| e.to_string())
}

/// Create `before` for real, try updating it to `after` (dry run), delete it again.
async fn update_of(client: &Client, before: &Value, after: &Value) -> Result<Value, String> {
    let obj: DynamicObject = serde_json::from_value(before.clone()).map_err(|e| e.to_string())?;
    let name = obj.metadata.name.clone().unwrap_or_default();
    let api = fabric_api(client);
    api.create(&PostParams::default(), &obj)
        .await
        .map_err(|e| format!("creating {name}: {e}"))?;
    let result = dry_run_update(client, after).await;
    let _ = api.delete(&name, &DeleteParams::default()).await;
    result
}

/// A CEL rule of the CRD and an object that breaks it.
struct CelCase {
    /// A part of the rule's message, which the server returns.
    message: &'static str,
    object: Value,
    /// For a transition rule: the stored fabric `object` updates.
    before: Option<Value>,
}

/// A fabric selecting no node (the operator rolls nothing out for it).
fn idle_fabric(name: &str, shared_memory: Value) -> Value {
    fabric(
        name,
        json!({"nodeSelector": {"matchLabels": {"rocefabric.io/e2e-none": "x"}},
               "sharedMemory": shared_memory}),
    )
}

fn cel_cases() -> Vec<CelCase> {
    vec![
        CelCase {
            message: "rocePriority must be one of pfcPriorities",
            object: fabric(
                "e2e-bad",
                json!({"qos": {"rocePriority": 4, "pfcPriorities": [3]}}),
            ),
            before: None,
        },
        CelCase {
            message: "cnp.dscp must differ from roceDscp",
            object: fabric(
                "e2e-bad",
                json!({"qos": {"roceDscp": 48, "cnp": {"dscp": 48}}}),
            ),
            before: None,
        },
        CelCase {
            message: "every ECN priority must be within 0..7",
            object: fabric("e2e-bad", json!({"qos": {"ecn": {"priorities": [9]}}})),
            before: None,
        },
        CelCase {
            message: "maxUnavailable must be an integer of at least 1 or a percentage",
            object: fabric("e2e-bad", json!({"rollout": {"maxUnavailable": "0%"}})),
            before: None,
        },
        CelCase {
            message: "regionSize must be a positive quantity of whole 4096-byte pages",
            object: fabric(
                "e2e-bad",
                json!({"sharedMemory": {"regionSize": "5000", "maxRegions": 4}}),
            ),
            before: None,
        },
        // Past 63 bits: the rule's own message, on the API server as in `validate`.
        CelCase {
            message: "regionSize must be a positive quantity of whole 4096-byte pages",
            object: fabric(
                "e2e-bad",
                json!({"sharedMemory": {"regionSize": "16Ei", "maxRegions": 4}}),
            ),
            before: None,
        },
        CelCase {
            message: "metadata.name must be at most 63 characters",
            object: fabric(&"x".repeat(64), json!({})),
            before: None,
        },
        CelCase {
            message: "regionSize cannot change and maxRegions cannot shrink",
            object: idle_fabric(
                "e2e-geometry",
                json!({"regionSize": "2Gi", "maxRegions": 8}),
            ),
            before: Some(idle_fabric(
                "e2e-geometry",
                json!({"regionSize": "1Gi", "maxRegions": 8}),
            )),
        },
        CelCase {
            message: "sharedMemory cannot be removed",
            object: fabric(
                "e2e-geometry-4",
                json!({"nodeSelector": {"matchLabels": {"rocefabric.io/e2e-none": "x"}},
                       "sharedMemory": null}),
            ),
            before: Some(idle_fabric(
                "e2e-geometry-4",
                json!({"regionSize": "1Gi", "maxRegions": 8}),
            )),
        },
        CelCase {
            message: "regionSize cannot change and maxRegions cannot shrink",
            object: idle_fabric(
                "e2e-geometry-2",
                json!({"regionSize": "1Gi", "maxRegions": 4}),
            ),
            before: Some(idle_fabric(
                "e2e-geometry-2",
                json!({"regionSize": "1Gi", "maxRegions": 8}),
            )),
        },
    ]
}

/// Every `x-kubernetes-validations` message in the CRD.
fn crd_rule_messages(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
                for r in rules {
                    if let Some(m) = r.get("message").and_then(Value::as_str) {
                        out.push(m.to_string());
                    }
                }
            }
            for v in map.values() {
                crd_rule_messages(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| crd_rule_messages(v, out)),
        _ => {}
    }
}

/// `(path, violating value)` for every `minimum`/`maximum` under the spec's schema; array items
/// are given as a one-element array.
fn range_cases(schema: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    let integer = schema.get("type").and_then(Value::as_str) == Some("integer");
    if integer {
        if let Some(min) = bound("minimum") {
            out.push((path.to_string(), json!(min as i64 - 1)));
        }
        if let Some(max) = bound("maximum") {
            out.push((path.to_string(), json!(max as i64 + 1)));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            range_cases(sub, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        let mut inner = Vec::new();
        range_cases(items, path, &mut inner);
        out.extend(inner.into_iter().map(|(p, v)| (p, json!([v]))));
    }
}

/// Put `value` at dotted `path` (below `spec`) of an empty spec.
fn spec_with(path: &str, value: Value) -> Value {
    let mut spec = json!({});
    let keys: Vec<&str> = path.trim_start_matches("spec.").split('.').collect();
    let mut slot = &mut spec;
    for key in &keys[..keys.len() - 1] {
        slot = slot
            .as_object_mut()
            .expect("object")
            .entry(key.to_string())
            .or_insert(json!({}));
    }
    slot.as_object_mut()
        .expect("object")
        .insert(keys[keys.len() - 1].to_string(), value);
    // Shared memory needs its required fields to reach the range check.
    if let Some(sm) = spec.get_mut("sharedMemory").and_then(Value::as_object_mut) {
        sm.entry("regionSize").or_insert(json!("1Mi"));
        sm.entry("maxRegions").or_insert(json!(4));
    }
    spec
}

#[test]
fn the_api_server_enforces_every_rule_and_range() {
    const TEST: &str = "the_api_server_enforces_every_rule_and_range";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let crd = crd_yaml("rocefabrics.rocefabric.io");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    ctx.rt.block_on(async {
        // Every rule of the CRD has a case here, so a new rule without a test fails.
        let mut messages = Vec::new();
        crd_rule_messages(schema, &mut messages);
        let cases = cel_cases();
        for m in &messages {
            assert!(
                cases.iter().any(|c| m.contains(c.message)),
                "no case for the CRD rule {m:?}"
            );
        }
        for case in &cases {
            let err = match &case.before {
                None => dry_run(&ctx.client, &case.object).await,
                Some(before) => update_of(&ctx.client, before, &case.object).await,
            }
            .expect_err(case.message);
            assert!(
                err.contains(case.message),
                "rejected with the rule's message: {err}"
            );
            assert!(
                err.contains("Invalid value") || err.contains("Invalid"),
                "{err}"
            );
        }
        // The item patterns of the NIC selector.
        for (field, bad) in [
            ("vendors", "mellanox"),
            ("deviceIds", "0x12345"),
            ("pciAddresses", "0000:18:00"),
        ] {
            let object = fabric("e2e-bad", json!({"nicSelector": {field: [bad]}}));
            let err = dry_run(&ctx.client, &object)
                .await
                .expect_err(&format!("nicSelector.{field} {bad:?} must be rejected"));
            assert!(
                err.contains(&format!("spec.nicSelector.{field}[0]"))
                    && err.contains("should match"),
                "{field} = {bad}: the message names the field and the pattern: {err}"
            );
        }
        // Every numeric range of the spec.
        let mut ranges = Vec::new();
        range_cases(&schema["properties"]["spec"], "spec", &mut ranges);
        assert!(ranges.len() >= 10, "ranges found in the schema: {ranges:?}");
        for (path, value) in ranges {
            let object = fabric("e2e-bad", spec_with(&path, value.clone()));
            let err = dry_run(&ctx.client, &object)
                .await
                .expect_err(&format!("{path} = {value} must be rejected"));
            assert!(
                err.contains(&path),
                "{path} = {value}: the message names the field: {err}"
            );
            assert!(
                err.contains("should be"),
                "{path} = {value}: the message names the bound: {err}"
            );
        }
        // And a valid fabric passes the same dry run.
        dry_run(
            &ctx.client,
            &fabric("e2e-good", json!({"qos": {"mtu": 9000}})),
        )
        .await
        .expect("a valid fabric is accepted");
        // maxRegions may grow and podSelector may change.
        update_of(
            &ctx.client,
            &idle_fabric(
                "e2e-geometry-3",
                json!({"regionSize": "1Gi", "maxRegions": 8}),
            ),
            &idle_fabric(
                "e2e-geometry-3",
                json!({"regionSize": "1Gi", "maxRegions": 16,
                       "podSelector": {"matchLabels": {"app": "x"}}}),
            ),
        )
        .await
        .expect("a growing space is accepted");
    });
}

#[test]
fn server_defaults_match_the_documented_defaults() {
    const TEST: &str = "server_defaults_match_the_documented_defaults";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let created = dry_run(&ctx.client, &fabric("e2e-defaults", json!({})))
            .await
            .expect("accepted");
        let documented = serde_json::to_value(
            serde_json::from_value::<RoceFabricSpec>(json!({})).expect("serde defaults"),
        )
        .expect("to JSON");
        for key in ["qos", "rollout"] {
            assert_eq!(
                created["spec"][key], documented[key],
                "spec.{key} defaulted by the server vs rocefabric_api"
            );
        }
        assert_eq!(created["spec"]["qos"]["roceDscp"], 26);
        assert_eq!(created["spec"]["qos"]["mtu"], 4200);
    });
}

fn header(output: &str) -> Vec<String> {
    output
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Column names of a CRD, upper-cased as kubectl prints them; `wide` adds priority > 0.
fn columns(crd: &str, wide: bool) -> Vec<String> {
    let crd = crd_yaml(crd);
    let mut out = vec!["NAME".to_string()];
    for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
    {
        if wide || c.get("priority").and_then(Value::as_i64).unwrap_or(0) == 0 {
            out.push(c["name"].as_str().expect("name").to_uppercase());
        }
    }
    out
}

#[test]
fn kubectl_get_prints_the_declared_columns() {
    const TEST: &str = "kubectl_get_prints_the_declared_columns";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let local = ctx.setup.local.as_ref();
    ctx.rt.block_on(async {
        eventually("fabric status written", || async {
            let out = kubectl(
                local,
                &["get", "rf", FABRIC, "-o", "jsonpath={.status.trafficClass}"],
            )?;
            if out.trim().is_empty() {
                Err("no status yet".into())
            } else {
                Ok(())
            }
        })
        .await;
    });
    let out = kubectl(local, &["get", "rf", FABRIC]).expect("kubectl get rf");
    assert_eq!(
        header(&out),
        columns("rocefabrics.rocefabric.io", false),
        "{out}"
    );
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .expect("a row")
        .split_whitespace()
        .collect();
    assert_eq!(row[0], FABRIC);
    let col = |name: &str| header(&out).iter().position(|h| h == name).expect(name);
    assert_eq!(row[col("DSCP")], "26", "{out}");
    assert_eq!(row[col("PRIO")], "3", "{out}");
    let wide =
        kubectl(local, &["get", "rocefabrics", FABRIC, "-o", "wide"]).expect("kubectl get -o wide");
    assert_eq!(
        header(&wide),
        columns("rocefabrics.rocefabric.io", true),
        "{wide}"
    );
    let row: Vec<&str> = wide
        .lines()
        .nth(1)
        .expect("a row")
        .split_whitespace()
        .collect();
    let col = |name: &str| header(&wide).iter().position(|h| h == name).expect(name);
    assert_eq!(row[col("TC")], "106", "{wide}");
    assert_eq!(row[col("CAPACITY")], "64", "{wide}");

    let node = &ctx.setup.nodes[0];
    let out = kubectl(local, &["get", "rocenodes", node]).expect("kubectl get rocenodes");
    assert_eq!(
        header(&out),
        columns("rocenodes.rocefabric.io", false),
        "{out}"
    );
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|r| r.starts_with(node.as_str())),
        "{out}"
    );
}

/// What `plan` and `qos apply` refuse as the API server does (strict field validation, set lists,
/// names), the server refuses too, naming the same field: `kubectl create --dry-run=server
/// --validate=strict` against `rocefabric_api::validate`.
#[test]
fn strict_validation_matches_the_api_server() {
    const TEST: &str = "strict_validation_matches_the_api_server";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let local = ctx.setup.local.as_ref();
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            fabric(
                "e2e-strict",
                json!({"nodeSelectr": {"matchLabels": {"a": "b"}}}),
            ),
            "spec.nodeSelectr",
            "unknown field",
        ),
        (
            fabric("e2e-strict", json!({"qos": {"pfcPriorities": [3, 3]}})),
            "spec.qos.pfcPriorities[1]",
            "Duplicate value: 3",
        ),
        (fabric("Bad_Name", json!({})), "metadata.name", "RFC 1123"),
    ];
    for (i, (object, field, needle)) in cases.iter().enumerate() {
        let ours = rocefabric_api::validate::fabric_value(object).expect_err("refused here");
        assert!(
            ours.errors
                .iter()
                .any(|e| e.field == *field && e.message.contains(needle)),
            "{field}: {ours}"
        );
        let file = dir.path().join(format!("f{i}.json"));
        std::fs::write(&file, object.to_string()).expect("write");
        let path = file.to_str().expect("utf-8 path");
        let err = kubectl(
            local,
            &[
                "create",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                path,
            ],
        )
        .expect_err("refused by the API server");
        assert!(
            err.contains(field) && err.contains(needle),
            "the API server names {field} with {needle:?}: {err}"
        );
    }
}
