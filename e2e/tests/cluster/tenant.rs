//! The shared cluster as a hostile tenant sees it (issue 39): each attack is made from a namespace
//! of its own with only a tenant's rights (a ServiceAccount bound to the `edit` ClusterRole there,
//! impersonated), while a well-behaved tenant in another namespace is served.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rocefabric_e2e::cluster::LocalCluster;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::devices::hca_pod;
use crate::regions::{assigned_window, gated_pod};
use crate::{
    FIELD_MANAGER, NAMESPACE, WORKLOAD_NAMESPACE, create_pod, delete_pod, eventually, kubectl,
    local_cluster, node_daemon_selector, running, service_account_identity,
};

/// The hostile tenant's namespace and ServiceAccount.
pub(crate) const TENANT: &str = "rocefabric-e2e-tenant";
const TENANT_SA: &str = "tenant";

/// The chart's node metrics ports: the device plugin's (the container that also serves the
/// kubelet's sockets) and the QoS agent's (its liveness probe's).
const PLUGIN_PORT: u16 = 9464;
const AGENT_PORT: u16 = 9465;

/// Server-side apply of `value` through `api`.
pub(crate) async fn apply<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = value["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"))
}

/// The tenant's namespace, with its ServiceAccount bound to `edit` there; and a client that acts
/// as that ServiceAccount (the admin impersonating it, as its token would).
async fn tenant(client: &Client) -> Client {
    tenant_of(client, &[]).await
}

/// The tenant's namespace and `more` namespaces, its ServiceAccount (in the first) bound to
/// `edit` in each; and a client that acts as that ServiceAccount.
pub(crate) async fn tenant_of(client: &Client, more: &[&str]) -> Client {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in std::iter::once(TENANT).chain(more.iter().copied()) {
        apply(
            &namespaces,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        apply(
            &bindings,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tenant-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": TENANT_SA, "namespace": TENANT}]}),
        )
        .await;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), TENANT);
    apply(
        &accounts,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT_SA}}),
    )
    .await;
    let mut config = kube::Config::infer().await.expect("kubeconfig");
    let (user, groups) = service_account_identity(TENANT, TENANT_SA);
    config.auth_info.impersonate = Some(user);
    config.auth_info.impersonate_groups = Some(groups);
    Client::try_from(config).expect("a client as the tenant")
}

/// Delete `namespace` and wait until it is gone.
pub(crate) async fn delete_namespace(client: &Client, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
    eventually(&format!("namespace {namespace} gone"), || async {
        match namespaces
            .get_opt(namespace)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
}

/// The node daemon's pod on `node`.
async fn daemon_pod(client: &Client, node: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&node_daemon_selector()))
        .await
        .expect("daemon pods");
    list.items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .unwrap_or_else(|| panic!("no node daemon pod on {node}"))
}

/// Each container's restart count, and whether the pod is Ready.
fn restarts_and_ready(pod: &Pod) -> (Vec<(String, i32)>, bool) {
    let status = pod.status.as_ref();
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.name.clone(), c.restart_count))
        .collect();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    (restarts, ready)
}

/// Resident memory (bytes) of the node daemon's process serving `--FLAG` on this machine (the
/// local cluster's node is this machine).
fn daemon_rss(flag: &str) -> Option<u64> {
    process_rss("rocefabric-device-plugin", Some(flag))
}

/// Resident memory (bytes) of this machine's largest process of `binary` (with an argument
/// starting with `flag`, when given).
pub(crate) fn process_rss(binary: &str, flag: Option<&str>) -> Option<u64> {
    let mut largest = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = args.first().is_some_and(|a| a.ends_with(binary));
        if ours && flag.is_none_or(|flag| args.iter().any(|a| a.starts_with(flag))) {
            let rss = std::fs::read_to_string(entry.path().join("status"))
                .ok()
                .and_then(|status| {
                    let kib: u64 = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()?;
                    Some(kib << 10)
                });
            largest = largest.max(rss);
        }
    }
    largest
}

/// Established TCP connections on this machine (the node's network namespace) from `source` to
/// local `port`, from /proc/net/tcp (addresses in hex, the IPv4 one in host byte order).
fn held_from(source: std::net::Ipv4Addr, port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let endpoint = |text: &str| -> Option<(std::net::Ipv4Addr, u16)> {
        let (ip, port) = text.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        Some((ip.to_le_bytes().into(), u16::from_str_radix(port, 16).ok()?))
    };
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote)) = (
                fields.get(1).and_then(|t| endpoint(t)),
                fields.get(2).and_then(|t| endpoint(t)),
            ) else {
                return false;
            };
            fields.get(3) == Some(&"01") && local.1 == port && remote.0 == source
        })
        .count()
}

/// One way to scrape: the status line, or why there is none.
type Scrape<'a> = dyn Fn() -> Result<String, String> + 'a;

/// `GET /metrics` on `addr` as Prometheus would: the status line.
fn scrape(addr: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(
        &addr.parse().map_err(|e| format!("{addr}: {e}"))?,
        Duration::from_secs(5),
    )
    .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    raw.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{addr} closed without an answer"))
}

/// The attacker's pod: `per_port` connection loops to each of the node's metrics ports, each
/// sending nothing (its `nc` reads a FIFO nobody writes) until the server closes it, then
/// connecting again. A CPU limit keeps the reconnect loops from taking the test machine's cores;
/// what is measured is memory and connections.
fn flood_pod(image: &str, node: &str, node_ip: &str, per_port: u32) -> Value {
    let script = format!(
        "mkfifo /tmp/hold && (sleep 100000 >/tmp/hold &) && \
         for port in {PLUGIN_PORT} {AGENT_PORT}; do i=0; while [ $i -lt {per_port} ]; do \
           (while true; do nc {node_ip} $port </tmp/hold >/dev/null 2>&1; sleep 1; done) & \
           i=$((i+1)); done; done; \
         echo flooding; exec sleep 100000"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "flood", "namespace": TENANT},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "flood", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"cpu": "300m", "memory": "512Mi"}}
            }]
        }
    })
}

/// The node's metrics ports are on the host network, where no NetworkPolicy applies: a tenant's
/// pod holding a thousand connections to them cannot grow the daemon's memory past its limit,
/// fail its liveness probe or get it restarted, and Prometheus, the kubelet and a well-behaved
/// tenant (a gated fabric pod gets its window and runs, an `rdma/hca` pod is admitted) are served
/// meanwhile.
#[test]
fn a_tenant_flooding_the_node_metrics_ports_starves_no_one() {
    const TEST: &str = "a_tenant_flooding_the_node_metrics_ports_starves_no_one";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(flood(&ctx.client, &local));
}

async fn flood(client: &Client, local: &LocalCluster) {
    let node = local.node_name.clone();
    let as_tenant = tenant(client).await;
    let daemon = daemon_pod(client, &node).await;
    let node_ip = daemon
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("the daemon's (host network) address");
    let (restarts_before, ready) = restarts_and_ready(&daemon);
    assert!(ready, "the daemon is Ready before the flood");
    let idle = (
        daemon_rss("--metrics-addr").expect("the device plugin's process"),
        daemon_rss("--metrics-bind-address").expect("the QoS agent's process"),
    );

    // The attack, created with the tenant's rights.
    let tenant_pods: Api<Pod> = Api::namespaced(as_tenant, TENANT);
    let per_port = 250;
    create_pod(
        &tenant_pods,
        flood_pod(&local.busybox_image, &node, &node_ip, per_port),
    )
    .await;
    let flood = running(&tenant_pods, "flood").await;
    let attacker: std::net::Ipv4Addr = flood
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("the attacker's pod IP");

    // Meanwhile, for three liveness periods of the agent (20 s each) and more: the daemon's
    // memory, Prometheus's scrapes, and a well-behaved tenant's pods.
    let started = Instant::now();
    let mut peak = idle;
    let mut scrapes = (0, 0);
    // Connections the daemon holds from the attacker, per sample: (plugin port, agent port).
    let mut held = Vec::new();
    let good: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    let image = &local.busybox_image;
    create_pod(&good, gated_pod("tenant-good", image)).await;
    create_pod(&good, hca_pod("tenant-good-hca", image, 1)).await;
    let window_wait = Instant::now();
    assigned_window(&good, "tenant-good").await;
    running(&good, "tenant-good").await;
    let window_secs = window_wait.elapsed().as_secs_f64();
    running(&good, "tenant-good-hca").await;
    while started.elapsed() < Duration::from_secs(75) {
        let rss = (
            daemon_rss("--metrics-addr").unwrap_or(0),
            daemon_rss("--metrics-bind-address").unwrap_or(0),
        );
        peak = (peak.0.max(rss.0), peak.1.max(rss.1));
        held.push((
            held_from(attacker, PLUGIN_PORT),
            held_from(attacker, AGENT_PORT),
        ));
        for port in [PLUGIN_PORT, AGENT_PORT] {
            // From this machine (the kubelet's address) and from a pod (Prometheus's place).
            // busybox's `nc` (its static `wget` needs NSS modules the image lacks).
            let request = format!(
                "printf 'GET /metrics HTTP/1.1\\r\\nHost: node\\r\\nConnection: close\\r\\n\\r\\n' | timeout 10 nc {node_ip} {port} 2>&1 | head -n 1"
            );
            let from_pod = || {
                let args = [
                    "exec",
                    "-n",
                    WORKLOAD_NAMESPACE,
                    "tenant-good",
                    "--",
                    "sh",
                    "-c",
                    &request,
                ];
                kubectl(Some(local), &args)
            };
            let answered = |r: &Result<String, String>| {
                r.as_ref().is_ok_and(|l| l.starts_with("HTTP/1.1 200"))
            };
            let attempts: [(&str, &Scrape<'_>); 2] = [
                ("this machine", &|| scrape(&format!("{node_ip}:{port}"))),
                ("a pod", &from_pod),
            ];
            for (from, attempt) in attempts {
                // A scrape may miss once while the node's two cores are busy (a Prometheus
                // scrape is retried at its next interval); two misses in a row are a failure.
                let first = attempt();
                if answered(&first) {
                    scrapes.0 += 1;
                    continue;
                }
                eprintln!("scrape of port {port} from {from} during the flood missed: {first:?}");
                let again = attempt();
                if answered(&again) {
                    scrapes.0 += 1;
                } else {
                    scrapes.1 += 1;
                    eprintln!("and again: {again:?}");
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let flood_log = tenant_pods
        .logs("flood", &Default::default())
        .await
        .unwrap_or_default();
    assert!(
        flood_log.contains("flooding"),
        "the attack ran: {flood_log:?}"
    );

    let after = daemon_pod(client, &node).await;
    let (restarts_after, ready) = restarts_and_ready(&after);
    assert_eq!(after.uid(), daemon.uid(), "the same daemon pod");
    assert_eq!(
        restarts_after, restarts_before,
        "no container of the daemon restarted"
    );
    assert!(ready, "the daemon stayed Ready");
    // The attacker's 250 loops per port get the per-source cap (8) and no more: the rest are
    // closed as they are accepted. The median sample allows for those in flight.
    let median = |pick: fn(&(usize, usize)) -> usize| {
        let mut v: Vec<usize> = held.iter().map(pick).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (plugin, agent) = (median(|h| h.0), median(|h| h.1));
    assert!(
        plugin <= 16 && agent <= 16,
        "connections held from the attacker (median of {} samples): {plugin} on {PLUGIN_PORT}, \
         {agent} on {AGENT_PORT}: {held:?}",
        held.len()
    );
    assert!(
        plugin > 0 && agent > 0,
        "the attacker did reach both ports: {held:?}"
    );
    assert_eq!(
        scrapes.1, 0,
        "every scrape answered ({} did); held {held:?}",
        scrapes.0
    );
    // The chart's memory limit of each node container is 256 MiB; the flood must not come near.
    for (what, bytes) in [("device plugin", peak.0), ("QoS agent", peak.1)] {
        assert!(
            bytes < 128 << 20,
            "{what}: {bytes} bytes resident under the flood"
        );
    }
    println!(
        "FIGURE node daemon resident memory, idle vs under {per_port} connection loops per port \
         from one tenant pod: device plugin {:.1} MiB vs {:.1} MiB, QoS agent {:.1} MiB vs {:.1} MiB; \
         a well-behaved gated pod got its window and ran in {window_secs:.1} s; connections held \
         from the attacker (median) {plugin} and {agent} of 250 each",
        idle.0 as f64 / 1048576.0,
        peak.0 as f64 / 1048576.0,
        idle.1 as f64 / 1048576.0,
        peak.1 as f64 / 1048576.0,
    );

    delete_pod(&tenant_pods, "flood").await;
    delete_pod(&good, "tenant-good").await;
    delete_pod(&good, "tenant-good-hca").await;
    delete_namespace(client, TENANT).await;
}
