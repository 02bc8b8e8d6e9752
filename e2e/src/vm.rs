//! The Soft-RoCE test VM: a Debian kernel with `rdma_rxe` booted under qemu (TCG) from
//! `e2e/vm/build`'s cached kernel and base initramfs, plus a per-run archive holding a scenario
//! script and the project's binaries. The guest contract (what `/init` does, the
//! `ROCEFABRIC-VM-EXIT <rc>` line) is in `e2e/vm/README.md`.
//!
//! A scenario reports what the test reads in sections: `=== BEGIN <name>`, the output, then
//! `=== END <name> rc=<status>` ([`Run::section`]).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::workspace_root;

/// Where the guest finds the project's binaries.
pub const GUEST_BIN: &str = "/opt/rocefabric/bin";

/// Shell functions every scenario starts with: `$B` (the project's binaries), `$IP`, `section NAME
/// CMD...` (CMD's output between the markers [`Run::section`] reads; returns CMD's status) and
/// `rxe_up ADDR/LEN` (rxe0 on eth0 with that address, waited for until ACTIVE).
pub const SHELL_PRELUDE: &str = r#"
B=/opt/rocefabric/bin
IP=/usr/sbin/ip
section() { local n=$1 r; shift; echo "=== BEGIN $n"; "$@" 2>&1; r=$?; echo "=== END $n rc=$r"; return $r; }
rxe_up() {
  local i=0
  $IP link set eth0 up && $IP addr add "$1" dev eth0 || return 1
  /usr/sbin/rdma link add rxe0 type rxe netdev eth0 || return 1
  until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; do
    i=$((i + 1)); [ $i -gt 200 ] && return 1; sleep 0.1
  done
}
"#;

/// When set (to anything but `0`), a VM that cannot run fails the suite instead of skipping it.
pub const REQUIRE_ENV: &str = "ROCEFABRIC_REQUIRE_SOFT_ROCE";

/// Whether a VM that cannot run must fail the suite (CI) rather than skip it.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Held while a set of VMs runs: TCG on two host cores has no CPU to spare, and two sets at once
/// would make guest timeouts (and RDMA retransmissions) a matter of luck.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wait until a TCP socket listens on `127.0.0.1:port` (read from `/proc/net/tcp`, without
/// connecting: qemu's socket netdev accepts one connection only).
pub fn wait_listening(port: u16, timeout: Duration) -> Result<(), String> {
    let started = Instant::now();
    let local = format!("0100007F:{port:04X}");
    while started.elapsed() < timeout {
        let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        // Fields: sl local_address rem_address st ...; st 0A is LISTEN.
        let listening = table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")
        });
        if listening {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "nothing listens on 127.0.0.1:{port} after {timeout:?}"
    ))
}

/// `e2e/vm/build`'s outputs.
#[derive(Clone, Debug)]
pub struct Image {
    pub kernel: PathBuf,
    pub base_initrd: PathBuf,
}

/// Build (or find cached) the kernel and base initramfs, once per process. `Err` says why the
/// VM cannot run here (no qemu, the build failed): the suite reports it as a skip or a failure.
pub fn image() -> Result<Image, String> {
    static IMAGE: OnceLock<Result<Image, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if which("qemu-system-x86_64").is_none() && which("apt-get").is_none() {
                return Err("qemu-system-x86_64 is not installed".into());
            }
            let root = workspace_root();
            let out = Command::new("bash")
                .arg(root.join("e2e/vm/build"))
                .output()
                .map_err(|e| format!("failed to run e2e/vm/build: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "e2e/vm/build failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let dir = root.join("target/vm");
            Ok(Image {
                kernel: dir.join("vmlinuz"),
                base_initrd: dir.join("base.cpio"),
            })
        })
        .clone()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// The guest's network card.
#[derive(Clone, Debug)]
pub enum Nic {
    /// qemu's user-mode network (eth0 alone on its wire).
    User,
    /// One end of an emulated wire: a TCP socket on 127.0.0.1 that the other VM connects to.
    Listen(u16),
    Connect(u16),
}

/// A free TCP port on 127.0.0.1 for a [`Nic::Listen`] wire.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One VM to boot.
#[derive(Clone, Debug)]
pub struct Guest {
    pub name: String,
    pub scenario: String,
    /// Host files copied to `GUEST_BIN/<name>`, stripped of debug information.
    pub binaries: Vec<PathBuf>,
    pub nic: Nic,
    pub mac: String,
    pub cpus: u32,
    pub memory_mib: u32,
}

impl Guest {
    pub fn new(name: &str, scenario: &str, binaries: Vec<PathBuf>) -> Guest {
        Guest {
            name: name.to_string(),
            scenario: scenario.to_string(),
            binaries,
            nic: Nic::User,
            mac: "52:54:00:12:34:56".into(),
            cpus: 2,
            memory_mib: 1024,
        }
    }

    /// Write the per-run archive and start qemu.
    pub fn start(&self, image: &Image, work: &Path) -> Result<Running, String> {
        let stage = work.join(format!("{}-root", self.name));
        let bin = stage.join(GUEST_BIN.trim_start_matches('/'));
        fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
        fs::write(stage.join("scenario"), &self.scenario).map_err(|e| e.to_string())?;
        let base = fs::read(&image.base_initrd)
            .map_err(|e| format!("{}: {e}", image.base_initrd.display()))?;
        for b in &self.binaries {
            let name = b.file_name().ok_or("a binary without a file name")?;
            check_libraries(b, &base)?;
            strip_copy(b, &bin.join(name))?;
        }
        let initrd = work.join(format!("{}.initrd", self.name));
        fs::write(&initrd, &base).map_err(|e| format!("{}: {e}", initrd.display()))?;
        let lib = workspace_root().join("e2e/vm/lib.sh");
        let appended = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$1" && newc "$2" >>"$3""#)
            .args([
                "newc",
                &path_str(&lib),
                &path_str(&stage),
                &path_str(&initrd),
            ])
            .status()
            .map_err(|e| format!("failed to run bash: {e}"))?;
        if !appended.success() {
            return Err(format!("packing {} failed", stage.display()));
        }
        let netdev = match self.nic {
            Nic::User => "user,id=n0".to_string(),
            Nic::Listen(port) => format!("socket,id=n0,listen=127.0.0.1:{port}"),
            Nic::Connect(port) => format!("socket,id=n0,connect=127.0.0.1:{port}"),
        };
        let console = work.join(format!("{}.console", self.name));
        let out = fs::File::create(&console).map_err(|e| e.to_string())?;
        let child = crate::child_of_this_test("qemu-system-x86_64")
            .args(["-accel", "tcg", "-cpu", "max", "-nographic", "-no-reboot"])
            .args([
                "-smp",
                &self.cpus.to_string(),
                "-m",
                &self.memory_mib.to_string(),
            ])
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&initrd)
            // loglevel=1: kernel messages would split the scenario's lines; scenarios print
            // `dmesg` in a section of their own instead.
            .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=1"])
            .args(["-netdev", &netdev])
            .args([
                "-device",
                &format!("virtio-net-pci,netdev=n0,mac={}", self.mac),
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("failed to start qemu-system-x86_64: {e}"))?;
        Ok(Running {
            name: self.name.clone(),
            child,
            console,
            started: Instant::now(),
        })
    }
}

/// Fail early, naming the library, when a binary needs a shared library the base image lacks
/// (the guest's loader would only say "not found"). The base holds what `ldd` lists for its
/// programs, glibc and libgcc_s among them.
fn check_libraries(binary: &Path, base_names: &[u8]) -> Result<(), String> {
    let Ok(out) = Command::new("ldd").arg(binary).output() else {
        return Ok(());
    };
    let listing = String::from_utf8_lossy(&out.stdout);
    for lib in listing.lines().filter_map(|l| l.split_whitespace().next()) {
        let name = lib.rsplit('/').next().unwrap_or(lib);
        if name.starts_with("linux-vdso") || name.is_empty() {
            continue;
        }
        let needle = format!("/{name}");
        if !base_names
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            return Err(format!(
                "{} needs {name}, which the VM image does not hold (add it to EXTRA_LIBS in e2e/vm/build)",
                binary.display()
            ));
        }
    }
    Ok(())
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `strip -o dst src` (a debug build is 100+ MB, a third of that stripped); a plain copy where
/// binutils is missing.
fn strip_copy(src: &Path, dst: &Path) -> Result<(), String> {
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(dst)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(src, dst).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    Ok(())
}

/// A booted VM.
#[derive(Debug)]
pub struct Running {
    name: String,
    child: Child,
    console: PathBuf,
    started: Instant,
}

impl Running {
    /// Wait for the guest to power off (killed after `timeout`) and read what it printed.
    pub fn wait(mut self, timeout: Duration) -> Run {
        let mut timed_out = false;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if self.started.elapsed() > timeout => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    timed_out = true;
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let raw = fs::read(&self.console).unwrap_or_default();
        let console = String::from_utf8_lossy(&raw).replace('\r', "");
        let rc = console
            .lines()
            .filter_map(|l| l.split("ROCEFABRIC-VM-EXIT ").nth(1))
            .filter_map(leading_number)
            .next_back();
        Run {
            name: self.name.clone(),
            console,
            rc,
            timed_out,
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a VM printed, and how its scenario ended.
#[derive(Clone, Debug)]
pub struct Run {
    pub name: String,
    pub console: String,
    /// The scenario's exit status; `None` when the guest died or timed out.
    pub rc: Option<i32>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

/// The number at the start of `text` (a kernel message may follow it on the same line).
fn leading_number(text: &str) -> Option<i32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// One `=== BEGIN`/`=== END` section of a scenario's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Section {
    pub output: String,
    pub rc: i32,
}

impl Run {
    /// Every section by name (a repeated name keeps the last).
    pub fn sections(&self) -> BTreeMap<String, Section> {
        let mut out = BTreeMap::new();
        let mut current: Option<(String, String)> = None;
        for line in self.console.lines() {
            // The first console line starts with the firmware's terminal escapes.
            if let Some((_, name)) = line.split_once("=== BEGIN ") {
                current = Some((name.trim().to_string(), String::new()));
            } else if let Some((_, rest)) = line.split_once("=== END ") {
                let rc = rest
                    .rsplit_once("rc=")
                    .and_then(|(_, rc)| leading_number(rc))
                    .unwrap_or(-1);
                if let Some((name, output)) = current.take() {
                    out.insert(name, Section { output, rc });
                }
            } else if let Some((_, output)) = current.as_mut() {
                output.push_str(line);
                output.push('\n');
            }
        }
        out
    }

    /// Section `name`, or a panic showing the whole console (the guest's story).
    pub fn section(&self, name: &str) -> Section {
        self.sections().remove(name).unwrap_or_else(|| {
            panic!(
                "VM {}: no section {name:?} (scenario rc {:?}, timed out {}); console:\n{}",
                self.name, self.rc, self.timed_out, self.console
            )
        })
    }

    /// The JSON lines of a section (kernel messages between them are skipped).
    pub fn json_lines(&self, name: &str) -> Vec<serde_json::Value> {
        self.section(name)
            .output
            .lines()
            .filter_map(|l| serde_json::from_str(l.trim()).ok())
            .collect()
    }
}

/// Boot `a` (listening) and `b` (connecting) on one emulated wire and wait for both: `a`'s NIC
/// listens on a free port and `b`'s connects to it, whatever `nic` they were given.
pub fn run_pair(
    mut a: Guest,
    mut b: Guest,
    image: &Image,
    work: &Path,
    timeout: Duration,
) -> Result<(Run, Run), String> {
    let port = free_port().map_err(|e| e.to_string())?;
    a.nic = Nic::Listen(port);
    b.nic = Nic::Connect(port);
    let a = a.start(image, work)?;
    // qemu's listening socket must exist before the other end connects.
    wait_listening(port, Duration::from_secs(30))?;
    let b = b.start(image, work)?;
    let b = b.wait(timeout);
    let a = a.wait(timeout);
    Ok((a, b))
}
