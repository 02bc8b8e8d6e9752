//! The operator under test: the real binary, run against the harness's kubeconfig, its JSON log
//! read line by line (the `reconciled` line of every pass, `caches synced`, warnings), and its
//! memory read from `/proc/<pid>/status`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One pass, from its `reconciled` line.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    /// When the line was read.
    pub at: Instant,
    /// When the operator logged it (its wall clock, comparable with the server's).
    pub logged: Timestamp,
    pub writes: u64,
    pub done: u64,
    pub failed: u64,
    pub plan_us: u64,
    pub took_ms: u64,
    pub throttled_ms: u64,
    /// Planned in full (not off the incremental planner's indexes).
    pub full: bool,
}

impl Pass {
    /// When the pass began (after its world snapshot), on the operator's clock.
    pub fn started(&self) -> Timestamp {
        self.logged
            - k8s_openapi::jiff::SignedDuration::from_millis(
                i64::try_from(self.took_ms).unwrap_or(i64::MAX),
            )
    }
}

/// The operator's resident set once its allocator gave freed pages back, from its last `heap
/// given back` line (after a list or a full pass).
#[derive(Clone, Copy, Debug, Default)]
pub struct Heap {
    pub resident: u64,
}

/// Resident memory of a process, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Peak resident set (`VmHWM`).
    pub peak: u64,
    /// Resident set now (`VmRSS`).
    pub now: u64,
}

impl Memory {
    /// Of process `pid` (`"self"` for this one).
    pub fn of(pid: &str) -> anyhow::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("failed to read /proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok(Memory {
            peak: field("VmHWM:")?,
            now: field("VmRSS:")?,
        })
    }
}

/// What the log said, as far as the harness cares.
#[derive(Debug)]
enum Line {
    Pass(Pass),
    /// The pass being logged was planned in full.
    Full,
    Synced(Instant),
    Heap(Heap),
}

/// The running operator.
pub struct Operator {
    child: Child,
    lines: mpsc::UnboundedReceiver<Line>,
    /// When the process was spawned.
    pub spawned: Instant,
    /// When its caches synced.
    pub synced: Option<Instant>,
    /// Its allocator after the last list or full pass.
    pub heap: Option<Heap>,
    /// The pass being logged was planned in full.
    full: bool,
    /// The last lines of its log, and every warning count, for failure reports.
    log: Arc<Mutex<LogTail>>,
}

#[derive(Debug, Default)]
struct LogTail {
    last: VecDeque<String>,
    warnings: u64,
    first_warnings: Vec<String>,
}

const TAIL: usize = 40;

impl Drop for Operator {
    fn drop(&mut self) {
        // Our own child, by its id.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn number(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or(0)
}

impl Operator {
    /// Start `rocefabric-operator run` against `kubeconfig` with `args` after the fixed ones
    /// (and no write limit unless `args` set one).
    pub fn spawn(binary: &Path, kubeconfig: &Path, args: &[String]) -> anyhow::Result<Operator> {
        let spawned = Instant::now();
        let unlimited: &[&str] = if args.iter().any(|a| a == "--write-qps") {
            &[]
        } else {
            &["--write-qps", "0"]
        };
        let mut child = Command::new(binary)
            .arg("run")
            .args(unlimited)
            .args([
                "--log-format",
                "json",
                "--http-addr",
                "127.0.0.1:0",
                "--lease-namespace",
                "default",
                "--identity",
                "scale",
            ])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .envs(std::env::var("SCALE_OPERATOR_WORKERS").map(|w| ("TOKIO_WORKER_THREADS", w)))
            .env(
                "RUST_LOG",
                std::env::var("SCALE_RUST_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", binary.display()))?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let (tx, lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(LogTail::default()));
        let tail = log.clone();
        // Every line kept in a file as well, when asked (SCALE_OPERATOR_LOG), appended across
        // restarts.
        let mut copy = match std::env::var_os("SCALE_OPERATOR_LOG") {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("SCALE_OPERATOR_LOG={}", path.display()))?,
            ),
            None => None,
        };
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(file) = &mut copy
                    && writeln!(file, "{line}").is_err()
                {
                    copy = None;
                }
                let at = Instant::now();
                let parsed = read_line(&line, at);
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if line.contains("\"level\":\"WARN\"") || line.contains("\"level\":\"ERROR\"") {
                    t.warnings += 1;
                    if t.first_warnings.len() < 5 {
                        t.first_warnings.push(line.clone());
                    }
                }
                if t.last.len() == TAIL {
                    t.last.pop_front();
                }
                t.last.push_back(line);
                drop(t);
                if let Some(parsed) = parsed
                    && tx.send(parsed).is_err()
                {
                    break;
                }
            }
        });
        Ok(Operator {
            child,
            lines,
            spawned,
            synced: None,
            heap: None,
            full: false,
            log,
        })
    }

    /// The next pass, or an error (with the log's tail) when none comes within `timeout` or
    /// the process ends.
    pub async fn next_pass(&mut self, timeout: Duration) -> anyhow::Result<Pass> {
        let deadline = Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(Line::Pass(mut p))) => {
                    p.full = std::mem::take(&mut self.full);
                    return Ok(p);
                }
                Ok(Some(Line::Full)) => self.full = true,
                Ok(Some(Line::Synced(at))) => self.synced = Some(at),
                Ok(Some(Line::Heap(heap))) => self.heap = Some(heap),
                Ok(None) => {
                    let status = self.child.wait().ok();
                    anyhow::bail!(
                        "the operator exited ({status:?}); its last lines:\n{}",
                        self.tail()
                    );
                }
                Err(_) => anyhow::bail!(
                    "no reconcile pass within {timeout:?}; the operator's last lines:\n{}",
                    self.tail()
                ),
            }
        }
    }

    /// The last lines of the log.
    pub fn tail(&self) -> String {
        let t = self.log.lock().unwrap_or_else(|e| e.into_inner());
        t.last.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Warnings and errors logged so far, and the first few of them.
    pub fn warnings(&self) -> (u64, Vec<String>) {
        let t = self.log.lock().unwrap_or_else(|e| e.into_inner());
        (t.warnings, t.first_warnings.clone())
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn memory(&self) -> anyhow::Result<Memory> {
        Memory::of(&self.child.id().to_string())
    }

    /// CPU time the process has used so far (user and system).
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("failed to read /proc/{pid}/stat"))?;
        // After the command name (in parentheses, which may hold spaces): state is field 3,
        // utime 14 and stime 15, in clock ticks (USER_HZ, 100 on every Linux ABI).
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> anyhow::Result<u64> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .with_context(|| format!("no field {} in /proc/{pid}/stat", i + 3))
        };
        Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
    }
}

/// The lines the harness acts on; cheap checks first (a pass at scale logs a line per pod).
fn read_line(line: &str, at: Instant) -> Option<Line> {
    if !line.contains("\"reconciled\"")
        && !line.contains("planned in full")
        && !line.contains("caches synced")
        && !line.contains("heap given back")
    {
        return None;
    }
    let v: Value = serde_json::from_str(line).ok()?;
    match v["message"].as_str()? {
        "reconciled" => Some(Line::Pass(Pass {
            at,
            logged: v["timestamp"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(Timestamp::now),
            writes: number(&v, "writes"),
            done: number(&v, "done"),
            failed: number(&v, "failed"),
            plan_us: number(&v, "plan_us"),
            took_ms: number(&v, "took_ms"),
            throttled_ms: number(&v, "throttled_ms"),
            full: false,
        })),
        "planned in full" => Some(Line::Full),
        "caches synced" => Some(Line::Synced(at)),
        "heap given back" => Some(Line::Heap(Heap {
            resident: number(&v, "resident_bytes"),
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconciled_line_is_read() {
        let line = r#"{"timestamp":"2026-01-01T00:00:01.500000Z","level":"INFO","message":"reconciled","writes":3,"done":3,"already_done":0,"skipped":0,"failed":0,"throttled_ms":0,"plan_us":1234,"took_ms":5,"target":"rocefabric_operator::controller"}"#;
        let Some(Line::Pass(p)) = read_line(line, Instant::now()) else {
            panic!("a pass")
        };
        assert_eq!((p.writes, p.plan_us, p.took_ms), (3, 1234, 5));
        assert!(!p.full, "set from the line before, not this one");
        let full = r#"{"timestamp":"2026-01-01T00:00:01.400000Z","level":"INFO","message":"planned in full","full_passes":2,"incremental_plans":9,"fallbacks":1,"plan_us":900,"target":"rocefabric_operator::controller::reconcile_loop"}"#;
        assert!(matches!(read_line(full, Instant::now()), Some(Line::Full)));
        assert_eq!(p.logged.as_millisecond(), 1_767_225_601_500);
        assert!(read_line(r#"{"message":"recorded region on pod"}"#, Instant::now()).is_none());
    }

    #[test]
    fn the_heap_line_is_read() {
        let line = r#"{"level":"INFO","message":"heap given back","resident_bytes":5}"#;
        let Some(Line::Heap(h)) = read_line(line, Instant::now()) else {
            panic!("a heap line")
        };
        assert_eq!(h.resident, 5);
    }

    #[test]
    fn memory_of_this_process_is_read() {
        let m = Memory::of("self").unwrap();
        assert!(m.peak >= m.now && m.now > 0);
    }
}
