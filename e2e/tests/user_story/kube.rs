//! The story's hands: the cluster's `kubectl` and `helm`, pods' `rocefabric-dsm session`s driven
//! through `kubectl exec` and read back through `kubectl logs`, and polling.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::time::{Duration, Instant};

use rocefabric_e2e::bounded::{CALL_LIMIT, output_within};
use rocefabric_e2e::cluster::LocalCluster;
use serde_json::Value;

/// Where the chart goes, as the README installs it.
pub const RELEASE: &str = "rocefabric";
pub const NAMESPACE: &str = "rocefabric-system";
/// The workload's namespace and the fabric of `examples/rocefabric-soft-roce.yaml`.
pub const APPS: &str = "story";
pub const FABRIC: &str = "soft";
/// The taint and label `up` gives worker VMs.
pub const WORKER_TAINT_KEY: &str = "rocefabric.io/vm-worker";
/// Pods per rxe (`node.config.hca.sharedReplicas` of `examples/values/vm-workers.yaml`): the
/// fabric's two pods per worker, a hugepage-window pod and a pod that cannot pin its window.
pub const HCA_SHARES: &str = "4";
/// How long a reconcile, a rollout or a pod start may take on TCG-emulated workers.
pub const WAIT: Duration = Duration::from_secs(240);

pub struct Story {
    pub local: LocalCluster,
    /// The worker nodes, in order (`rfe2e-w1`, `rfe2e-w2`).
    pub workers: Vec<String>,
    /// Commands sent to each pod's session so far (its answers are numbered from 1).
    sent: BTreeMap<String, u64>,
    figures: Vec<String>,
}

impl Story {
    pub fn new(local: LocalCluster) -> Story {
        let workers = local.workers.clone();
        Story {
            local,
            workers,
            sent: BTreeMap::new(),
            figures: Vec::new(),
        }
    }

    /// Run one step; a failure is reported with the step's name and the cluster's state.
    pub fn step(&mut self, name: &str, run: fn(&mut Story)) {
        println!("== step {name}");
        let started = Instant::now();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(self))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            self.diagnostics();
            panic!("step {name} failed: {message}");
        }
        println!("   step {name}: {:.1?}", started.elapsed());
        for figure in self.figures.drain(..) {
            println!("FIGURE {figure}");
        }
    }

    pub fn figure(&mut self, text: String) {
        self.figures.push(text);
    }

    fn diagnostics(&self) {
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["get", "pods", "-A", "-o", "wide"],
            &["get", "rf,rocenodes", "-o", "wide"],
            &["get", "events", "-n", APPS, "--sort-by=.lastTimestamp"],
        ] {
            match self.try_kubectl(args) {
                Ok(out) => eprintln!("$ kubectl {}\n{out}", args.join(" ")),
                Err(e) => eprintln!("$ kubectl {}: {e}", args.join(" ")),
            }
        }
    }

    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        run(self.local.kubectl().args(args), None)
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }

    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).expect("kubectl -o json prints JSON")
    }

    /// `kubectl apply -f -` of one object.
    pub fn apply(&self, object: &Value) {
        run(
            self.local.kubectl().args(["apply", "-f", "-"]),
            Some(&object.to_string()),
        )
        .unwrap_or_else(|e| panic!("kubectl apply {}: {e}", object["metadata"]["name"]));
    }

    pub fn helm(&self, args: &[&str]) -> String {
        run(self.local.helm().args(args), None)
            .unwrap_or_else(|e| panic!("helm {}: {e}", args.join(" ")))
    }

    /// `kubectl exec` of a shell command in a workload pod.
    pub fn exec(&self, pod: &str, script: &str) -> Result<String, String> {
        self.try_kubectl(&["exec", "-n", APPS, pod, "--", "sh", "-c", script])
    }

    /// Send one command line to the pod's `rocefabric-dsm session` (its stdin is the FIFO
    /// `/tmp/cmd`); returns the number its answer will carry.
    pub fn send(&mut self, pod: &str, line: &str) -> u64 {
        assert!(
            !line.contains(['\'', '"']),
            "session lines are quoted twice, so they hold no quotes: {line}"
        );
        // Bounded in the pod too: opening the FIFO blocks when the session reading it is gone.
        self.exec(
            pod,
            &format!("timeout 30 sh -c \"echo '{line}' >/tmp/cmd\""),
        )
        .unwrap_or_else(|e| panic!("sending {line:?} to {pod}: {e}"));
        let n = self.sent.entry(pod.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    /// The session's answer number `n`, from the pod's log.
    pub fn answer(&self, pod: &str, n: u64) -> Value {
        eventually(&format!("answer {n} in {pod}'s log"), WAIT, || {
            let logs = self.try_kubectl(&["logs", "-n", APPS, pod]).ok()?;
            logs.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["n"].as_u64() == Some(n))
        })
    }

    /// Send a command and wait for its answer.
    pub fn session(&mut self, pod: &str, line: &str) -> Value {
        let n = self.send(pod, line);
        self.answer(pod, n)
    }

    /// A new pod of this name: its session starts counting again.
    pub fn forget(&mut self, pod: &str) {
        self.sent.remove(pod);
    }
}

fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<String, String> {
    let out = output_within(cmd, stdin.map(str::as_bytes), CALL_LIMIT)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// Poll `probe` every half second until it gives a value; panic naming `what` after `timeout`.
pub fn eventually<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The condition `kind` of an object's status, as (status, reason, message).
pub fn condition(object: &Value, kind: &str) -> Option<(String, String, String)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("status"), s("reason"), s("message"))
        })
}
