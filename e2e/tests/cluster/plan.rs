//! `rocefabric-operator plan --from-cluster` on the cluster the operator runs: once the test
//! fabric has rolled out, the plan is the operator's own (no RoceNode left to write, the node and
//! region figures its metrics show), and a proposed fabric file shows what applying it would
//! change.

use rocefabric_operator::cli::plan::{self, PlanArgs};
use serde_json::{Value, json};

use crate::monitoring::{OPERATOR_PORT, scrape};
use crate::{FABRIC, cluster, eventually, operator_selector, test_fabric_value};

fn args(extra: &[&str]) -> PlanArgs {
    let mut argv = vec!["--from-cluster", "--page-size", "3", "--writes"];
    argv.extend(extra);
    PlanArgs::from_argv(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

fn fabric(out: &Value) -> Value {
    out["fabrics"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["name"] == FABRIC))
        .cloned()
        .unwrap_or(Value::Null)
}

/// A gauge of the operator's leader (`name{fabric="e2e"...}`), from its /metrics.
fn gauge(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn plan_from_cluster_is_the_plan_the_operator_carries_out() {
    let test = "plan_from_cluster_is_the_plan_the_operator_carries_out";
    let Some(ctx) = cluster(test) else {
        return;
    };
    let client = ctx.client.clone();
    let nodes = ctx.setup.nodes.len();
    ctx.rt.block_on(eventually(
        "plan --from-cluster matches the operator",
        || async {
            let out = plan::plan_cluster(&client, &args(&[]))
                .await
                .map_err(|e| format!("{e:#}"))?;
            let out = serde_json::to_value(&out).map_err(|e| e.to_string())?;
            let f = fabric(&out);
            if f["valid"] != true || f["selectedNodes"] != nodes {
                return Err(format!("fabric {f}"));
            }
            // Nothing left to do on the fabric's RoceNodes: the operator has written them all.
            let pending: Vec<&Value> = out["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["fabric"] == FABRIC && n["action"] != "unchanged")
                .collect();
            if !pending.is_empty() {
                return Err(format!("RoceNodes still to write: {pending:?}"));
            }
            let roce_node_writes = out["writes"]["ApplyRoceNode"].as_u64().unwrap_or(0)
                + out["writes"]["DeleteRoceNode"].as_u64().unwrap_or(0);
            if roce_node_writes != 0 {
                return Err(format!("writes {}", out["writes"]));
            }
            // The leader's figures of its last pass are the plan's.
            let text = scrape(&client, &operator_selector(), OPERATOR_PORT).await?;
            let leader = text
                .split("\n# EOF")
                // The sample line, not the HELP text (which reads "... leader 1 while ...").
                .find(|t| t.lines().any(|l| l == "rocefabric_operator_leader 1"))
                .ok_or("no leader scraped")?;
            for (metric, field) in [
                (
                    format!("rocefabric_operator_nodes{{fabric=\"{FABRIC}\",state=\"selected\"}}"),
                    "selectedNodes",
                ),
                (
                    format!(
                        "rocefabric_operator_nodes{{fabric=\"{FABRIC}\",state=\"configured\"}}"
                    ),
                    "configuredNodes",
                ),
                (
                    format!("rocefabric_operator_regions_allocated{{fabric=\"{FABRIC}\"}}"),
                    "regionsAllocated",
                ),
                (
                    format!("rocefabric_operator_regions_capacity{{fabric=\"{FABRIC}\"}}"),
                    "regionCapacity",
                ),
                (
                    format!("rocefabric_operator_pods_waiting{{fabric=\"{FABRIC}\"}}"),
                    "podsWaiting",
                ),
            ] {
                let shown = gauge(leader, &metric);
                if shown != f[field].as_f64() {
                    return Err(format!("{metric} = {shown:?}, plan {field} = {}", f[field]));
                }
            }
            Ok(())
        },
    ));

    // A proposed edit: fewer regions and another MTU. Planned, not applied.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edit = test_fabric_value(ctx.setup.local.is_some());
    edit["spec"]["sharedMemory"]["maxRegions"] = json!(2);
    edit["spec"]["qos"]["mtu"] = json!(4000);
    let file = dir.path().join("new.yaml");
    std::fs::write(&file, yaml_serde::to_string(&edit).expect("YAML")).expect("write");
    let file = file.display().to_string();
    let out = ctx
        .rt
        .block_on(plan::plan_cluster(&client, &args(&["--fabrics", &file])))
        .unwrap_or_else(|e| panic!("{test}: {e:#}"));
    let out = serde_json::to_value(&out).expect("serializes");
    let f = fabric(&out);
    assert_eq!(f["regionCapacity"], 2, "{out}");
    let updated = out["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["fabric"] == FABRIC && n["action"] == "update")
        .count();
    assert_eq!(updated, nodes, "every RoceNode gets the new MTU: {out}");
    assert!(
        out.get("notes").is_none(),
        "the file replaces the cluster's fabric: {out}"
    );
}
