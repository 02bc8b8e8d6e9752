//! `rocefabric-operator run`: the controller, leader-elected, with its HTTP endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::controller::{self, ControllerConfig};
use crate::http::{self, AppState, Health};
use rocefabric_runtime::{logging, shutdown};

use crate::leader::{LeaderElector, LeaseConfig};
use crate::metrics::Metrics;
use crate::planner::PlanOptions;

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    Json,
    /// Human-readable lines.
    #[default]
    Text,
}

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Name of the coordination.k8s.io Lease used for leader election.
    #[arg(long, default_value = "rocefabric-operator")]
    pub lease_name: String,
    /// Namespace of the Lease (defaults to the namespace of the kubeconfig context, or the
    /// service account's namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease (defaults to the hostname).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Quiet time after a change before a reconcile pass, in milliseconds (changes that arrive
    /// meanwhile join the same pass).
    #[arg(long, default_value_t = 500)]
    pub debounce_ms: u64,
    /// Reconcile at least this often, in seconds, even when nothing changed.
    #[arg(long, default_value_t = 300)]
    pub resync_seconds: u64,
    /// Sustained writes a second toward the API server (0: no limit). RoceNode writes go in
    /// batches of a second of this rate (no more than `--write-burst`), at most 128 in flight.
    #[arg(long, default_value_t = crate::rate::DEFAULT_QPS, value_parser = qps)]
    pub write_qps: f64,
    /// List and watch only pods matching this label selector (e.g. `rocefabric.io/fabric`)
    /// instead of every pod: every pod a fabric plans must then match it.
    #[arg(long, value_parser = label_selector)]
    pub pod_label_selector: Option<String>,
    /// Writes that may go at once before `--write-qps` paces them.
    #[arg(long, default_value_t = crate::rate::DEFAULT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub write_burst: u32,
}

/// A label selector as the API server takes it (`key`, `key=value`, `key in (a,b)`, ...): not
/// empty, and only the characters of one (the API server checks the grammar).
fn label_selector(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/=!(), ".contains(c);
    if text.trim().is_empty() || !text.chars().all(allowed) {
        return Err(format!(
            "{text:?} is not a label selector such as rocefabric.io/fabric or app in (a,b)"
        ));
    }
    Ok(text.to_string())
}

/// A rate: a finite number, zero or more.
fn qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "{text:?} is not a rate: writes a second, 0 or more (0: no limit)"
        )),
    }
}

/// Set up the global `tracing` subscriber (`RUST_LOG` filters, default `info`), logging to stderr.
pub fn init_tracing(format: LogFormat) {
    let format = match format {
        LogFormat::Json => logging::Format::Json,
        LogFormat::Text => logging::Format::Text,
    };
    logging::init("RUST_LOG", "info", format);
}

fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// Run the operator until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Installed first, so a signal during startup is not lost.
    let signals = shutdown::signal().context("failed to install the signal handlers")?;
    // kube's message already carries its causes; chaining them again would repeat them.
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!(
            "no Kubernetes configuration found: set KUBECONFIG (or create ~/.kube/config), \
             or run inside a cluster with a service account ({e})"
        )
    })?;
    let writer = crate::write_client::build(&config)
        .context("failed to build the write client (HTTP/2) from the configuration")?;
    let client = Client::try_from(config)
        .context("failed to build a Kubernetes client from the configuration")?;
    let namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity =
        args.identity.clone().or_else(hostname).context(
            "no identity: pass --identity or set POD_NAME (the hostname could not be read)",
        )?;
    tracing::info!(lease = %args.lease_name, %namespace, %identity, "starting rocefabric-operator");
    // Said once: whether the writes go over one HTTP/2 connection or fell back to HTTP/1.1.
    let probe = writer.client.clone();
    tokio::spawn(async move {
        match crate::write_client::negotiated_version(&probe).await {
            Ok(version) => tracing::info!(http_version = ?version, "write client connected"),
            Err(error) => tracing::warn!(%error, "write client could not reach the API server"),
        }
    });

    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let (listener, addr) = http::bind(args.http_addr).await?;
    tracing::info!(%addr, "http listening");
    let http_task = tokio::spawn(http::serve(
        listener,
        AppState {
            health: health.clone(),
            metrics: metrics.clone(),
        },
        shutdown.clone(),
    ));

    let (leader_tx, leader_rx) = watch::channel(false);
    let elector = LeaderElector::new(
        client.clone(),
        LeaseConfig::new(&args.lease_name, &namespace, &identity),
    );
    // The elector stops only after the controller has stopped writing, so the Lease is released
    // (and another replica may take over) only once no write of ours is in flight.
    let election = CancellationToken::new();
    let elector_task = tokio::spawn(elector.run(leader_tx, election.clone()));

    let controller_config = ControllerConfig {
        debounce: Duration::from_millis(args.debounce_ms),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        write_limit: crate::rate::TokenBucket::new(args.write_qps, args.write_burst),
        pod_label_selector: args.pod_label_selector.clone(),
        // A new leader cannot know which windows its predecessor freed in the last grace period.
        plan: PlanOptions {
            hold_after_takeover: true,
            ..PlanOptions::default()
        },
        ..ControllerConfig::new(identity.clone())
    };
    let controller_task = tokio::spawn(controller::run(
        controller::Clients {
            watch: client,
            write: writer,
        },
        controller_config,
        controller::Handles {
            metrics,
            health,
            leader: leader_rx,
            shutdown: shutdown.clone(),
        },
    ));

    let mut controller_task = controller_task;
    let mut http_task = http_task;
    // Run until a signal, or until the controller or the HTTP server stops on its own (an error).
    let (controller_result, http_result) = tokio::select! {
        () = signals => {
            shutdown.cancel();
            (None, None)
        }
        result = &mut controller_task => {
            shutdown.cancel();
            (Some(result.context("controller task panicked")?), None)
        }
        result = &mut http_task => {
            shutdown.cancel();
            (None, Some(result.context("http task panicked")?))
        }
    };
    // The controller finishes the write in flight and stops; then the elector releases the Lease.
    let controller_result = match controller_result {
        Some(r) => Ok(r),
        None => controller_task.await,
    };
    election.cancel();
    elector_task
        .await
        .context("leader election task panicked")?;
    let controller_result = controller_result.context("controller task panicked")?;
    let http_result = match http_result {
        Some(r) => r,
        None => http_task.await.context("http task panicked")?,
    };
    controller_result.context("controller failed")?;
    http_result.context("http server failed")?;
    tracing::info!("stopped");
    Ok(())
}
