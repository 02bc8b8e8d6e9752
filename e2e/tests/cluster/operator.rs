//! The operator against the real API server: a RoceNode per selected node with the agent's status,
//! fabric conditions with observedGeneration and Events, the rollout budget over three extra Node
//! objects, leader election with two replicas while pods are being assigned windows, and the
//! operator's writes over HTTP/2.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rocefabric_api::constants::{REGION_ANNOTATION, condition};
use rocefabric_api::{RoceFabric, RoceNode};
use serde_json::json;

use crate::regions::{assigned_window, directory_entries, gated_pod, pod_image};
use crate::{
    FABRIC, NAMESPACE, WORKLOAD_NAMESPACE, apply_value, cluster, delete_pod, eventually,
    operator_selector, roce_node,
};

#[test]
fn fabric_creates_rocenodes_and_reports_status() {
    const TEST: &str = "fabric_creates_rocenodes_and_reports_status";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let fabrics: Api<RoceFabric> = Api::all(client.clone());
        let fabric = fabrics.get(FABRIC).await.expect("the test fabric");
        let uid = fabric.uid().expect("fabric uid");
        let roce_nodes: Api<RoceNode> = Api::all(client.clone());
        for node in &ctx.setup.nodes {
            let rn = roce_node(client, node).await;
            assert_eq!(rn.spec.fabric, FABRIC, "RoceNode {node} spec.fabric");
            assert_eq!(
                rn.spec.qos.mtu, 4200,
                "RoceNode {node} carries the rendered QoS"
            );
            assert!(
                rn.owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.kind == "RoceFabric"),
                "RoceNode {node} is owned by the fabric"
            );
            // The node agent reports, for the spec's generation.
            let status = eventually(
                &format!("RoceNode {node} status from the agent"),
                || async {
                    let rn = roce_nodes.get(node).await.map_err(|e| e.to_string())?;
                    let status = rn.status.clone().unwrap_or_default();
                    let current = status.fabric_generation == Some(rn.spec.fabric_generation);
                    if current
                        && status
                            .conditions
                            .iter()
                            .any(|c| c.type_ == condition::QOS_APPLIED)
                    {
                        Ok(status)
                    } else {
                        Err(format!("{status:?}"))
                    }
                },
            )
            .await;
            if ctx.setup.local.is_some() {
                // On the local node the fabric's NICs are veths: MTU applied (and read back by
                // the kernel), DCB refused, so lossless QoS is not applied.
                for (_, netdev) in rocefabric_e2e::cluster::FABRIC_NETDEVS {
                    let iface = status
                        .interfaces
                        .iter()
                        .find(|i| i.netdev == netdev)
                        .unwrap_or_else(|| panic!("{netdev} in the RoceNode status: {status:?}"));
                    assert_eq!(
                        iface.mtu,
                        Some(4200),
                        "{netdev}: the agent reports the MTU it read back"
                    );
                    assert_eq!(
                        rocefabric_e2e::cluster::host_mtu(netdev),
                        Ok(4200),
                        "{netdev} MTU"
                    );
                }
                let qos = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == condition::QOS_APPLIED)
                    .expect("QosApplied");
                assert_eq!(qos.status, "False", "a veth cannot do PFC: {qos:?}");
            }
        }
        let expected = ctx.setup.nodes.len() as u32;
        let status = eventually("fabric status", || async {
            let f = fabrics.get(FABRIC).await.map_err(|e| e.to_string())?;
            let status = f.status.clone().unwrap_or_default();
            let current = status.observed_generation == f.metadata.generation;
            if current && status.nodes.selected == expected && !status.conditions.is_empty() {
                Ok((f.metadata.generation, status))
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await;
        let (generation, status) = status;
        assert_eq!(status.traffic_class, Some(106), "DSCP 26 -> ToS 106");
        assert_eq!(status.regions.capacity, 64, "regions capacity = maxRegions");
        for c in &status.conditions {
            assert_eq!(
                c.observed_generation, generation,
                "condition {} carries observedGeneration",
                c.type_
            );
        }
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        for t in [
            condition::READY,
            condition::PROGRESSING,
            condition::DEGRADED,
        ] {
            assert!(types.contains(&t), "standard condition {t} in {types:?}");
        }
    });
}

/// The operator's writes go over HTTP/2 to the real API server (one connection for a batch of
/// RoceNode applies): each replica says at start which version its write client got.
#[test]
fn operator_writes_over_http2() {
    const TEST: &str = "operator_writes_over_http2";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), NAMESPACE);
        // Any running replica will do; the failover test may be replacing one meanwhile.
        let line = eventually("an operator replica's write client connected", || async {
            let list = pods
                .list(&ListParams::default().labels(&operator_selector()))
                .await
                .map_err(|e| e.to_string())?;
            let mut seen = Vec::new();
            for pod in &list.items {
                let Ok(logs) = pods.logs(&pod.name_any(), &Default::default()).await else {
                    continue;
                };
                if let Some(line) = logs.lines().find(|l| l.contains("write client connected")) {
                    return Ok(line.to_string());
                }
                seen.push(pod.name_any());
            }
            Err(format!("no such line yet in the logs of {seen:?}"))
        })
        .await;
        assert!(
            line.contains("\"http_version\":\"HTTP/2.0\""),
            "the write client negotiated HTTP/2 with kube-apiserver: {line}"
        );
    });
}

/// Three Node objects with no kubelet behind them (tainted so no pod goes there), selected by their
/// own fabric with `maxUnavailable: 1`; the test plays the node agent by writing RoceNode status.
#[test]
fn rollout_budget_is_honoured_over_three_nodes() {
    const TEST: &str = "rollout_budget_is_honoured_over_three_nodes";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    const LABEL: &str = "rocefabric.io/e2e-rollout";
    const ROLLOUT_FABRIC: &str = "e2e-rollout";
    let names: Vec<String> = (0..3).map(|i| format!("rfe2e-fake-{i}")).collect();
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let nodes: Api<Node> = Api::all(client.clone());
        let fabrics: Api<RoceFabric> = Api::all(client.clone());
        let roce_nodes: Api<RoceNode> = Api::all(client.clone());
        let _ = fabrics.delete(ROLLOUT_FABRIC, &DeleteParams::default()).await;
        for name in &names {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
            let _ = roce_nodes.delete(name, &DeleteParams::default()).await;
        }
        for name in &names {
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {LABEL: "true"}},
                "spec": {"taints": [{"key": "rocefabric.io/e2e-fake", "value": "true", "effect": "NoSchedule"}]}
            }))
            .expect("node");
            eventually(&format!("create node {name}"), || async {
                nodes.create(&PostParams::default(), &node).await.map(drop).map_err(|e| e.to_string())
            })
            .await;
        }
        apply_value(client, &json!({
            "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
            "metadata": {"name": ROLLOUT_FABRIC},
            "spec": {"nodeSelector": {"matchLabels": {LABEL: "true"}}, "rollout": {"maxUnavailable": 1}}
        }))
        .await
        .expect("apply the rollout fabric");

        let owned = || async {
            let all = roce_nodes.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            Ok::<Vec<RoceNode>, String>(
                all.items.into_iter().filter(|rn| rn.spec.fabric == ROLLOUT_FABRIC).collect(),
            )
        };
        // Every selected node has its RoceNode at once; those waiting for a slot hold a pending
        // placeholder (their QoS gate holds their HCAs), the others the spec to apply.
        let started = |list: &[RoceNode]| list.iter().filter(|rn| !rn.spec.pending).count();
        for wave in 1..=3usize {
            let pending = eventually(&format!("wave {wave}: one more node started"), || async {
                let list = owned().await?;
                if list.len() == 3 && started(&list) == wave {
                    Ok(list)
                } else {
                    Err(format!("{} RoceNodes, {} started", list.len(), started(&list)))
                }
            })
            .await;
            // The budget holds for a while: no second node is started before this one reports.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let list = owned().await.expect("list");
            assert_eq!(started(&list), wave, "maxUnavailable 1: one node in progress at a time");
            assert_eq!(list.len(), 3, "the waiting nodes keep their pending RoceNodes");
            let fresh: Vec<&RoceNode> = pending
                .iter()
                .filter(|rn| !rn.spec.pending && rn.status.is_none())
                .collect();
            assert_eq!(fresh.len(), 1, "exactly one node waits for its agent");
            let rn = fresh[0];
            let status = json!({"status": {
                "observedGeneration": rn.metadata.generation,
                "fabricGeneration": rn.spec.fabric_generation,
                "conditions": [{
                    "type": condition::QOS_APPLIED, "status": "True", "reason": "QosApplied",
                    "message": "written by the e2e suite", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": rn.metadata.generation
                }]
            }});
            roce_nodes
                .patch_status(&rn.name_any(), &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("write RoceNode status");
        }
        let status = eventually("rollout complete", || async {
            let f = fabrics.get(ROLLOUT_FABRIC).await.map_err(|e| e.to_string())?;
            let s = f.status.clone().unwrap_or_default();
            if s.nodes.configured == 3 && s.observed_generation == f.metadata.generation {
                Ok(s)
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
        assert_eq!(status.nodes.selected, 3);
        let ready = status.conditions.iter().find(|c| c.type_ == condition::READY).expect("Ready");
        assert_eq!(ready.status, "True", "{ready:?}");

        // Transitions were announced as Events on the fabric.
        let events: Api<Event> = Api::all(client.clone());
        let list = eventually("Events on the fabric", || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={ROLLOUT_FABRIC}")))
                .await
                .map_err(|e| e.to_string())?;
            if list.items.is_empty() { Err("none".into()) } else { Ok(list.items) }
        })
        .await;
        assert!(
            list.iter().all(|e| e.involved_object.kind.as_deref() == Some("RoceFabric")),
            "{list:?}"
        );

        fabrics.delete(ROLLOUT_FABRIC, &DeleteParams::default()).await.expect("delete fabric");
        for name in &names {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    });
}

async fn leader(client: &Client) -> Result<String, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases
        .get("rocefabric-operator")
        .await
        .map_err(|e| e.to_string())?;
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or("no holder".into())
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Two operator replicas; the leader pod is deleted while gated pods are waiting for windows. The
/// other replica takes the Lease and finishes the job: every pod gets a window, no two overlap, and
/// no window already written changes.
#[test]
fn leader_failover_while_assigning_windows_keeps_windows_disjoint() {
    const TEST: &str = "leader_failover_while_assigning_windows_keeps_windows_disjoint";
    let Some(ctx) = cluster(TEST) else {
        return;
    };
    let image = pod_image(ctx.setup.local.as_ref());
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let operator_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let running_replicas = || async {
            let list = operator_pods
                .list(&ListParams::default().labels(&operator_selector()))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<Vec<String>, String>(
                list.items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| p.name_any())
                    .collect(),
            )
        };
        // A Lease left by an earlier install names a pod that is gone until it expires: wait for
        // one of the two running replicas to hold it.
        let first_leader = eventually("one of two running replicas leads", || async {
            let replicas = running_replicas().await?;
            let holder = leader(client).await?;
            if replicas.len() >= 2 && replicas.contains(&holder) {
                Ok(holder)
            } else {
                Err(format!("holder {holder}, running {replicas:?}"))
            }
        })
        .await;

        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let names: Vec<String> = (0..12).map(|i| format!("failover-{i}")).collect();
        for name in &names {
            delete_pod(&pods, name).await;
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for name in &names[..6] {
            let pod: Pod = serde_json::from_value(gated_pod(name, &image)).expect("pod");
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create");
        }
        // Kill the leader while the first batch is being handled, then add the second batch.
        tokio::time::sleep(Duration::from_millis(500)).await;
        operator_pods
            .delete(&first_leader, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the leader pod");
        for name in &names[6..] {
            let pod: Pod = serde_json::from_value(gated_pod(name, &image)).expect("pod");
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create");
        }
        let new_leader = eventually("another running replica leads", || async {
            let l = leader(client).await?;
            let replicas = running_replicas().await?;
            if l != first_leader && replicas.contains(&l) {
                Ok(l)
            } else {
                Err(format!("{l} of {replicas:?}"))
            }
        })
        .await;
        assert_ne!(new_leader, first_leader);

        for name in &names {
            let (text, _) = assigned_window(&pods, name).await;
            seen.insert(name.clone(), text);
        }
        let windows: Vec<(String, (u64, u64))> = names
            .iter()
            .map(|n| {
                let r =
                    rocefabric_formats::region::RegionAssignment::parse(&seen[n]).expect("window");
                (n.clone(), (r.base, r.size))
            })
            .collect();
        for (i, (a, wa)) in windows.iter().enumerate() {
            for (b, wb) in &windows[i + 1..] {
                assert!(!overlap(*wa, *wb), "{a} {wa:?} overlaps {b} {wb:?}");
            }
        }
        // No window lost or rewritten: after the dust settles every annotation is what was first
        // seen, and the directory lists each pod with it.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut uids = std::collections::HashMap::new();
        for name in &names {
            let p = pods.get(name).await.expect("pod");
            assert_eq!(
                p.annotations().get(REGION_ANNOTATION),
                Some(&seen[name]),
                "{name}'s window changed"
            );
            uids.insert(name.clone(), p.metadata.uid.clone());
        }
        let configmaps = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let entries = eventually("every pod in the directory", || async {
            let entries = directory_entries(&configmaps).await?;
            if names.iter().all(|n| entries.iter().any(|e| &e.pod == n)) {
                Ok(entries)
            } else {
                Err(format!("{entries:?}"))
            }
        })
        .await;
        for (name, (base, size)) in &windows {
            let e = entries.iter().find(|e| &e.pod == name).expect("listed");
            assert_eq!((e.base, e.size), (*base, *size), "{name} in the directory");
            assert_eq!(e.uid, uids[name], "{name}'s uid in the directory");
        }
        for name in &names {
            let _ = pods
                .delete(name, &DeleteParams::default().grace_period(0))
                .await;
        }
    });
}
