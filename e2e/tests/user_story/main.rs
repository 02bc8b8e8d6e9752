//! The user story on worker nodes with a real RDMA device: `helm install`, a RoceFabric, pods on two
//! nodes requesting `rdma/hca` that read and write each other's memory with one-sided RDMA.
//!
//! Needs the local cluster of `e2e/cluster/up --workers 2` (qemu VMs with Soft-RoCE on their fabric
//! NIC, running containerd, the kubelet and kube-proxy): `sudo e2e/cluster/up --workers 2 &&
//! KUBECONFIG=/var/lib/rocefabric-e2e/kubeconfig cargo test -p rocefabric-e2e --test user_story`.
//! Every step goes through the user's interfaces: `helm`, `kubectl apply`, `kubectl get`,
//! `kubectl exec`, `kubectl logs` (and, for step 5, the VM's qemu monitor, which stands for the
//! cable). Without such a cluster the test prints `SKIPPED: user story (<reason>): <test>`; with
//! `ROCEFABRIC_REQUIRE_WORKERS=1` (CI, after `up --workers 2`) a skip is a failure.
//!
//! The steps depend on each other (the pods of step 2 share memory in step 3, one is replaced in
//! step 4, ...), so they run in order in one test; each failure names its step. The fabric pods are
//! the README's pod specs ("Using your window") word for word but for name, placement, command and
//! sizes (`readme.rs`), with windows of 64 MiB and 256 MiB, past the 8 MiB memlock limit. Figures
//! (pod start with and without a device and a window, fabric apply to QosApplied, the data plane's
//! read latency and whole-window bandwidth against perftest's) are printed as `FIGURE` lines, never
//! asserted.

mod devices;
mod dra;
mod fabric;
mod kube;
mod link;
mod memory;
mod readme;
mod replace;
mod rollout;
mod windows;

use std::time::Instant;

use rocefabric_e2e::cluster::LocalCluster;
use rocefabric_e2e::skip;

use kube::Story;

/// When set (to anything but `0`), a cluster without worker nodes fails the test.
const REQUIRE_ENV: &str = "ROCEFABRIC_REQUIRE_WORKERS";

fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The local cluster with at least two workers, or the reason there is none.
fn local_workers() -> Result<LocalCluster, String> {
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .filter(|v| !v.is_empty())
        .ok_or("KUBECONFIG not set")?;
    let local = LocalCluster::beside(std::path::Path::new(&kubeconfig))
        .ok_or("not the local cluster of e2e/cluster/up (no cluster.env beside KUBECONFIG)")??;
    if local.workers.len() < 2 {
        return Err(format!(
            "the cluster has {} worker VM(s), the story needs 2: run e2e/cluster/up --workers 2",
            local.workers.len()
        ));
    }
    Ok(local)
}

#[test]
fn user_story_on_vm_workers() {
    let test = "user_story_on_vm_workers";
    let local = match local_workers() {
        Ok(local) => local,
        Err(reason) if required() => {
            panic!("{test}: skipped although {REQUIRE_ENV} is set: {reason}")
        }
        Err(reason) => return skip("user story", &reason, test),
    };
    let mut story = Story::new(local);
    let started = Instant::now();
    story.step("1 install and fabric", fabric::install_and_apply);
    story.step(
        "2 devices in real containers",
        devices::pods_get_devices_and_windows,
    );
    story.step("3 memory shared across nodes", memory::share_memory);
    story.step(
        "3b windows of real size, whole by checksum",
        windows::whole_windows_by_checksum,
    );
    story.step(
        "3c a window that cannot be pinned",
        windows::unpinnable_window_is_named,
    );
    story.step(
        "figures: data plane against perftest",
        memory::latency_figure,
    );
    story.step(
        "4 a pod is replaced",
        replace::replaced_pod_gets_a_fresh_window,
    );
    story.step("5 a link goes down", link::link_down_drops_allocatable);
    story.step("6 rollout", rollout::mtu_rolls_out_within_max_unavailable);
    story.step("7 DRA mode", dra::claim_gets_rxe_through_cdi);
    println!("user story: all steps in {:.0?}", started.elapsed());
}
