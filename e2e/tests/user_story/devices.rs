//! Step 2: two pods per worker request `rdma/hca: 1` and carry the fabric's label; each container
//! holds exactly its granted uverbs node and `rdma_cm`, the NCCL/UCX environment with the right GID
//! index, and a window; the region gate is gone. Also the figure of pod start with a device and a
//! window against the same pod without either, on the same kubelets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::kube::{APPS, FABRIC, Story, WAIT, WORKER_TAINT_KEY, eventually};
use crate::readme;

/// The fabric's pods: `a1`, `a2` on the first worker, `b1`, `b2` on the second.
pub fn fabric_pods(story: &Story) -> Vec<(String, String)> {
    let (a, b) = (&story.workers[0], &story.workers[1]);
    [("a1", a), ("a2", a), ("b1", b), ("b2", b)]
        .into_iter()
        .map(|(p, n)| (p.to_string(), n.to_string()))
        .collect()
}

/// The memory limit of a pod with a window of the story's fabric (64 MiB): the README's rule, the
/// window, 4 MiB of staging and the program.
pub const WINDOW_MEMORY: &str = "256Mi";

/// A workload pod as README "Using your window" writes it (its first block: no hugepages),
/// whose `rocefabric-dsm session` reads its commands from the FIFO `/tmp/cmd`.
pub fn fabric_pod(story: &Story, name: &str, node: &str) -> Value {
    let mut pod = readme::pod(0);
    readme::place(story, &mut pod, name, node);
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!(WINDOW_MEMORY);
    pod
}

/// The same pod without a device or a window.
pub fn plain_pod(story: &Story, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": WORKER_TAINT_KEY, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "dsm",
                "image": story.local.workload_image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "mkfifo /tmp/cmd && exec rocefabric-dsm session <>/tmp/cmd"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                ],
                "resources": {"limits": {"memory": "128Mi"}},
            }],
        },
    })
}

pub fn phase(story: &Story, pod: &str) -> Option<String> {
    story
        .try_kubectl(&[
            "get",
            "pod",
            "-n",
            APPS,
            pod,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .ok()
}

/// Create the pods at once; how long each took from its `kubectl apply` to Running.
pub fn start_pods(story: &Story, pods: &[Value]) -> Vec<Duration> {
    let mut created = BTreeMap::new();
    for pod in pods {
        story.apply(pod);
        created.insert(
            pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Instant::now(),
        );
    }
    let mut took = BTreeMap::new();
    eventually("pods Running", WAIT, || {
        for (name, at) in &created {
            if !took.contains_key(name) && phase(story, name).as_deref() == Some("Running") {
                took.insert(name.clone(), at.elapsed());
            }
        }
        (took.len() == created.len()).then_some(())
    });
    took.into_values().collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn pods_get_devices_and_windows(story: &mut Story) {
    story.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS}}));
    let pods = fabric_pods(story);
    // The figure: the same pods without a device or a window first, on the same nodes.
    let plain: Vec<Value> = pods
        .iter()
        .map(|(p, n)| plain_pod(story, &format!("plain-{p}"), n))
        .collect();
    let without = median(start_pods(story, &plain));
    for (p, _) in &pods {
        story.kubectl(&[
            "delete",
            "pod",
            "-n",
            APPS,
            &format!("plain-{p}"),
            "--wait=false",
        ]);
    }
    let manifests: Vec<Value> = pods.iter().map(|(p, n)| fabric_pod(story, p, n)).collect();
    let with = median(start_pods(story, &manifests));
    story.figure(format!(
        "pod start to Running (median of {}): plain {without:.1?}, with rdma/hca and a window {with:.1?}, ratio {:.2}",
        pods.len(),
        with.as_secs_f64() / without.as_secs_f64()
    ));

    let tc = story.kubectl(&["get", "rf", FABRIC, "-o", "jsonpath={.status.trafficClass}"]);
    for (pod, node) in &pods {
        let object = story.get_json(&["get", "pod", "-n", APPS, pod]);
        assert_eq!(object["spec"]["nodeName"], node.as_str(), "{pod}");
        assert!(
            object["spec"]["schedulingGates"]
                .as_array()
                .is_none_or(|g| g.is_empty()),
            "{pod}: the region gate is removed"
        );
        let region = object["metadata"]["annotations"]["rocefabric.io/region"]
            .as_str()
            .unwrap_or_else(|| panic!("{pod} has a window"));
        let seen = inside(story, pod);
        assert_eq!(
            seen["dev"], "rdma_cm uverbs0",
            "{pod}: exactly the granted uverbs node and rdma_cm"
        );
        assert_eq!(seen["ibdev"], "rxe0", "{pod}: uverbs0 is rxe0's");
        assert_eq!(seen["NCCL_IB_HCA"], "=rxe0:1", "{pod}");
        assert_eq!(seen["UCX_NET_DEVICES"], "rxe0:1", "{pod}");
        assert_eq!(
            seen["NCCL_IB_TC"],
            tc.trim(),
            "{pod}: the fabric's traffic class"
        );
        // The GID index names the port's RoCE v2 GID of the fabric NIC's IPv4 address.
        assert_eq!(seen["type"], "RoCE v2", "{pod}: {seen:?}");
        assert!(
            seen["gid"].starts_with("0000:0000:0000:0000:0000:ffff:"),
            "{pod}: GID {} at index {} is IPv4-mapped",
            seen["gid"],
            seen["NCCL_IB_GID_INDEX"]
        );
        assert_eq!(
            seen["region"], region,
            "{pod}: the window file is the annotation"
        );
    }
}

/// What a container sees: its device nodes, environment, the GID its index names, its window.
fn inside(story: &Story, pod: &str) -> BTreeMap<String, String> {
    let script = "echo dev=$(ls /dev/infiniband | tr '\\n' ' '); env | grep -E '^(NCCL|UCX)_'; \
        i=$NCCL_IB_GID_INDEX; p=/sys/class/infiniband/rxe0/ports/1; \
        echo gid=$(cat $p/gids/$i); echo type=$(cat $p/gid_attrs/types/$i); \
        echo ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev); echo region=$(cat /etc/rocefabric/region)";
    let out = story
        .exec(pod, script)
        .unwrap_or_else(|e| panic!("{pod}: {e}"));
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}
