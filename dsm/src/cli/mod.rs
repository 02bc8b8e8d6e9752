//! Command line: flags (each with the variable a pod already has), then one subcommand.

mod data;
mod probe;
mod session;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rocefabric_dsm::config::{self, Inputs};
use rocefabric_dsm::{Config, Dsm};
use rocefabric_formats::env;

#[derive(Debug, Parser)]
#[command(
    name = "rocefabric-dsm",
    version,
    about = "Read and write the fabric's shared memory with one-sided RDMA"
)]
struct Cli {
    /// This pod's region annotation (downward-API file).
    #[arg(long, env = env::ROCEFABRIC_REGION_FILE, default_value = config::DEFAULT_REGION_FILE, global = true)]
    region: PathBuf,
    /// The fabric's region directory (regions.json of the mounted <fabric>-regions ConfigMap).
    #[arg(long, env = env::ROCEFABRIC_DIRECTORY, default_value = config::DEFAULT_DIRECTORY, global = true)]
    directory: PathBuf,
    /// The fabric's key of this namespace: the mounted <fabric>-key Secret (files `key` and
    /// `namespace`). Peers and owners prove holding it to each other at every rendezvous.
    #[arg(long, env = env::ROCEFABRIC_KEY_DIR, default_value = config::DEFAULT_KEY_DIR, global = true)]
    key_dir: PathBuf,
    /// HCA port DEVICE[:PORT] (default: the first of NCCL_IB_HCA, which the device plugin sets).
    #[arg(long, env = env::ROCEFABRIC_HCA, global = true)]
    hca: Option<String>,
    /// RoCE v2 GID index.
    #[arg(long, env = env::NCCL_IB_GID_INDEX, global = true)]
    gid_index: Option<String>,
    /// Traffic class of the fabric's RoCE traffic.
    #[arg(long, env = env::NCCL_IB_TC, global = true)]
    traffic_class: Option<String>,
    /// This pod's name.
    #[arg(long, env = env::POD_NAME, global = true)]
    pod: Option<String>,
    /// This pod's uid.
    #[arg(long, env = env::POD_UID, global = true)]
    uid: Option<String>,
    /// Address the rendezvous endpoint listens on.
    #[arg(long, default_value = "0.0.0.0", global = true)]
    listen: IpAddr,
    /// The fabric's rendezvous port.
    #[arg(long, env = env::ROCEFABRIC_DSM_PORT, default_value_t = config::DEFAULT_PORT, global = true)]
    port: u16,
    /// Most connections this pod's endpoint serves at once (each holds a thread and a queue
    /// pair; default 256).
    #[arg(long, env = env::ROCEFABRIC_DSM_MAX_PEERS, global = true)]
    max_peers: Option<String>,
    /// Most of those from one address (a pod's processes share its IP; default 32).
    #[arg(long, env = env::ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE, global = true)]
    max_peers_per_source: Option<String>,
    /// hugetlbfs mount for the window (default: /dev/hugepages when mounted).
    #[arg(long, global = true)]
    hugepages: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Expose this pod's window until stopped (SIGTERM or SIGINT).
    Serve {
        /// On stop, write the window's bytes to this file (debugging).
        #[arg(long)]
        dump_on_exit: Option<PathBuf>,
    },
    /// Read LEN bytes at ADDR (a number or POD+OFFSET): printed as hex (up to 64 KiB), or any
    /// length raw into a file or stdout with --out.
    Read {
        #[arg(long)]
        addr: String,
        #[arg(long, default_value_t = 8)]
        len: u64,
        /// Write the bytes raw to PATH (`-`: stdout) instead of as hex. A file is replaced only
        /// once every byte is read.
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
    },
    /// Write bytes at ADDR: hex, one little-endian word, or all of a file or stdin.
    Write {
        #[arg(long)]
        addr: String,
        #[command(flatten)]
        data: WriteData,
    },
    /// Compare-and-swap the word at ADDR; prints the value it held.
    Cas {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        old: String,
        #[arg(long)]
        new: String,
    },
    /// Fetch-and-add to the word at ADDR; prints the value it held.
    Add {
        #[arg(long)]
        addr: String,
        #[arg(long, default_value = "1")]
        n: String,
    },
    /// Serve this pod's window and run commands from stdin, one JSON result line each
    /// (commands: see `session --help`).
    #[command(long_about = session::HELP)]
    Session,
    /// One-sided read (and with --write, write) latency and bandwidth to each peer's window.
    Probe(probe::Args),
}

/// What `write` writes: exactly one of these.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct WriteData {
    /// Bytes as hex.
    #[arg(long)]
    hex: Option<String>,
    /// One 8-byte word.
    #[arg(long)]
    word: Option<String>,
    /// All bytes of PATH (`-`: stdin); nothing is written unless they fit in the window.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
}

pub fn main() -> ExitCode {
    rocefabric_runtime::logging::init(
        "ROCEFABRIC_LOG",
        // Who reached this pod's memory is an audit trail, shown unless turned off.
        "warn,rocefabric_dsm::endpoint=info",
        rocefabric_runtime::logging::Format::Text,
    );
    let cli = Cli::parse();
    let serves = matches!(cli.command, Command::Serve { .. } | Command::Session);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let message = format!("rocefabric-dsm: {e:#}");
            eprintln!("{message}");
            if serves {
                termination_message(&message);
            }
            ExitCode::FAILURE
        }
    }
}

/// Where the kubelet reads a container's last words (`terminationMessagePath`'s default; another
/// path through `ROCEFABRIC_TERMINATION_LOG`): `kubectl describe pod` shows them as the container's
/// State (Last State once restarted), and the operator's fabric status names the pods whose window
/// could not be set up from them. Written only by `serve` and `session`, which are the container's main process; a
/// one-shot command's failure belongs to whoever ran it.
const TERMINATION_LOG: &str = "/dev/termination-log";
/// The kubelet keeps at most this much of it.
const TERMINATION_MESSAGE_MAX: usize = 4096;

fn termination_message(message: &str) {
    let path = std::env::var_os(env::ROCEFABRIC_TERMINATION_LOG)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(TERMINATION_LOG), PathBuf::from);
    // Only the file the kubelet mounted: never created where there is none.
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
    {
        let mut end = message.len().min(TERMINATION_MESSAGE_MAX);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let _ = std::io::Write::write_all(&mut file, &message.as_bytes()[..end]);
    }
}

fn config(cli: &Cli, expose: bool) -> Result<Config> {
    let env = Inputs::from_env()?;
    let inputs = Inputs {
        region_file: cli.region.clone(),
        directory: cli.directory.clone(),
        key_dir: cli.key_dir.clone(),
        hca: cli.hca.clone(),
        nccl_ib_hca: env.nccl_ib_hca,
        gid_index: cli.gid_index.clone(),
        traffic_class: cli.traffic_class.clone(),
        pod: cli.pod.clone(),
        uid: cli.uid.clone(),
        listen: cli.listen,
        port: cli.port,
        hugepages: cli.hugepages.clone(),
        expose,
        max_peers: cli.max_peers.clone(),
        max_peers_per_source: cli.max_peers_per_source.clone(),
    };
    Ok(inputs.config()?)
}

fn run(cli: Cli) -> Result<()> {
    // What can be checked without the HCA is checked first.
    let mut input = None;
    match &cli.command {
        Command::Read { len, out: None, .. } => anyhow::ensure!(
            *len <= data::HEX_MAX,
            "--len {len}: more than {} bytes print only with --out (--out PATH, or --out - for \
             raw bytes on stdout)",
            data::HEX_MAX
        ),
        Command::Write { data: d, .. } => {
            input = d.file.as_deref().map(data::Input::open).transpose()?;
        }
        _ => {}
    }
    let expose = matches!(cli.command, Command::Serve { .. } | Command::Session);
    let mut dsm = Dsm::open(config(&cli, expose)?)?;
    let addr = |dsm: &Dsm, a: &str| config::address(a, dsm.directory());
    let num = |f: &str, v: &str| config::number(f, v);
    match &cli.command {
        Command::Serve { dump_on_exit } => {
            let w = dsm.window().clone();
            println!(
                "{}",
                serde_json::json!({"serving": dsm.endpoint().map(|a| a.to_string()), "fabric": w.fabric, "pod": dsm.directory().owner(w.base, 1).map(|e| e.pod.clone()).ok(), "base": w.base, "size": w.size})
            );
            wait_for_signal()?;
            if let (Some(path), Some(local)) = (dump_on_exit, dsm.local()) {
                let mut bytes = vec![0u8; local.len().min(w.size as usize)];
                local.read(0, &mut bytes);
                std::fs::write(path, bytes)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Command::Read { addr: a, len, out } => {
            let at = addr(&dsm, a)?;
            match out {
                Some(path) => data::read_to_file(&mut dsm, at, *len, path)?,
                None => {
                    let mut buf = vec![0u8; usize::try_from(*len)?];
                    dsm.read(at, &mut buf)?;
                    println!("{}", hex(&buf));
                }
            }
        }
        Command::Write { addr: a, data: d } => {
            let at = addr(&dsm, a)?;
            let bytes = match (&d.hex, &d.word, input) {
                (Some(h), _, _) => unhex(h)?,
                (_, Some(w), _) => num("--word", w)?.to_le_bytes().to_vec(),
                (_, _, Some(input)) => {
                    data::write_input(&mut dsm, at, input)?;
                    return Ok(());
                }
                (None, None, None) => unreachable!("clap requires one"),
            };
            dsm.write(at, &bytes)?;
        }
        Command::Cas { addr: a, old, new } => {
            let at = addr(&dsm, a)?;
            println!(
                "{}",
                dsm.compare_and_swap(at, num("--old", old)?, num("--new", new)?)?
            );
        }
        Command::Add { addr: a, n } => {
            let at = addr(&dsm, a)?;
            println!("{}", dsm.fetch_add(at, num("--n", n)?)?);
        }
        Command::Session => {
            session::run(&mut dsm, std::io::stdin().lock(), &mut std::io::stdout())?
        }
        Command::Probe(args) => probe::run(&mut dsm, args, &mut std::io::stdout())?,
    }
    Ok(())
}

/// Block until SIGTERM or SIGINT.
fn wait_for_signal() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the signal handler")?;
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Result<Vec<u8>> {
    let t = text.trim().trim_start_matches("0x");
    anyhow::ensure!(
        t.len().is_multiple_of(2),
        "--hex {text:?}: odd number of digits"
    );
    (0..t.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&t[i..i + 2], 16).with_context(|| format!("--hex {text:?}: not hex"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rocefabric-dsm").chain(args.iter().copied()))
    }

    #[test]
    fn write_takes_exactly_one_of_hex_word_and_file() {
        let cli = parse(&["write", "--addr", "a", "--file", "-"]).unwrap();
        let Command::Write { data, .. } = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(data.file.as_deref(), Some(std::path::Path::new("-")));
        assert!(parse(&["write", "--addr", "a", "--hex", "01"]).is_ok());
        assert!(parse(&["write", "--addr", "a", "--word", "1"]).is_ok());
        for bad in [
            &["write", "--addr", "a"][..],
            &["write", "--addr", "a", "--hex", "01", "--file", "x"],
            &["write", "--addr", "a", "--word", "1", "--hex", "01"],
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    clap::error::ErrorKind::ArgumentConflict
                        | clap::error::ErrorKind::MissingRequiredArgument
                ),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn read_prints_hex_by_default_and_writes_raw_bytes_with_out() {
        let cli = parse(&["read", "--addr", "a+8", "--len", "1048576", "--out", "-"]).unwrap();
        let Command::Read { len, out, .. } = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (len, out.as_deref()),
            (1 << 20, Some(std::path::Path::new("-")))
        );
        let cli = parse(&["read", "--addr", "a"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Read {
                len: 8,
                out: None,
                ..
            }
        ));
    }
}
