//! `rocefabric-dsm-crossing`: someone trying to cross a window owner's rendezvous (port 18516) who
//! may not, or more often than the owner allows, for the `data_plane` VM suite. Each command
//! prints one JSON line of what the owner answered:
//!
//! - `hello`: a hand-made hello (another fabric, no uid, ...) and the owner's answer;
//! - `loris`: a hello cut short, held until the owner cuts it off (`{"answer","ms"}`);
//! - `flood`: many silent connections from several source addresses at once, each one's answer
//!   sorted by cause (`{"capped","cappedPerSource","cutOff","other"}`);
//! - `members`: many real member connections (the pod's own identity, from the environment as
//!   `rocefabric-dsm` reads it), all held at once (`{"admitted","refused":[..]}`).

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rocefabric_dsm::config::{self, Inputs};
use rocefabric_dsm::wire::{self, Hello};
use rocefabric_dsm::{Dsm, DsmError};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "rocefabric-dsm-crossing", about)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Send one hello and print the owner's answer.
    Hello(HelloArgs),
    /// Send the start of a hello and nothing more; print what the owner says and when.
    Loris {
        #[arg(long)]
        to: SocketAddr,
    },
    /// Open COUNT silent connections, round robin over SOURCES (comma-separated local addresses).
    Flood {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long)]
        count: usize,
        #[arg(long, value_delimiter = ',')]
        sources: Vec<IpAddr>,
    },
    /// Open COUNT member connections to ADDR's owner (one `Dsm` each), hold them all for MS.
    Members {
        /// `POD+0xOFFSET`, as `rocefabric-dsm` takes it.
        #[arg(long)]
        addr: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        hold_ms: u64,
    },
}

#[derive(Debug, clap::Args)]
struct HelloArgs {
    #[arg(long)]
    to: SocketAddr,
    #[arg(long)]
    fabric: String,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    from_pod: String,
    #[arg(long)]
    from_uid: String,
    #[arg(long)]
    to_pod: String,
    /// Left out: a hello without the owner's uid.
    #[arg(long)]
    to_uid: Option<String>,
}

const ANSWER_WAIT: Duration = Duration::from_secs(15);

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Cmd::Hello(h) => {
            let to = h.to;
            let hello = Hello {
                version: wire::VERSION,
                fabric: h.fabric,
                namespace: h.namespace,
                from_pod: h.from_pod,
                from_uid: h.from_uid,
                to_pod: h.to_pod,
                to_uid: h.to_uid,
                nonce: "00".repeat(32),
            };
            let mut s = TcpStream::connect(to).with_context(|| format!("connect {to}"))?;
            s.write_all(&wire::encode(&hello))?;
            println!("{}", json!({"answer": answer(&mut s)?}));
        }
        Cmd::Loris { to } => {
            let mut s = TcpStream::connect(to).with_context(|| format!("connect {to}"))?;
            s.write_all(b"{\"version\":3,\"fab")?;
            let started = Instant::now();
            let answer = answer(&mut s)?;
            println!(
                "{}",
                json!({"answer": answer, "ms": started.elapsed().as_millis() as u64})
            );
        }
        Cmd::Flood { to, count, sources } => flood(to, count, &sources)?,
        Cmd::Members {
            addr,
            count,
            hold_ms,
        } => members(&addr, count, hold_ms)?,
    }
    Ok(())
}

/// Everything the owner sends until it closes (or [`ANSWER_WAIT`] passes).
fn answer(s: &mut TcpStream) -> anyhow::Result<String> {
    s.set_read_timeout(Some(ANSWER_WAIT))?;
    let mut text = String::new();
    match s.read_to_string(&mut text) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => text += "(no answer in time)",
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => text += "(reset)",
        Err(e) => return Err(e.into()),
    }
    Ok(text.trim().to_string())
}

fn flood(to: SocketAddr, count: usize, sources: &[IpAddr]) -> anyhow::Result<()> {
    use socket2::{Domain, Socket, Type};
    anyhow::ensure!(!sources.is_empty(), "--sources: none given");
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let source = sources[i % sources.len()];
        let s = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
        s.bind(&SocketAddr::new(source, 0).into())
            .with_context(|| format!("bind {source}"))?;
        s.connect(&to.into())
            .with_context(|| format!("connect {to} from {source}"))?;
        held.push(TcpStream::from(s));
    }
    let (mut capped, mut per_source, mut cut_off) = (0, 0, 0);
    let mut other = Vec::new();
    for mut s in held {
        let a = answer(&mut s)?;
        if a.contains("(its cap per source)") {
            per_source += 1;
        } else if a.contains("(its cap)") {
            capped += 1;
        } else if a.contains("no full line within the deadline") {
            cut_off += 1;
        } else if other.len() < 5 {
            other.push(a);
        }
    }
    println!(
        "{}",
        json!({"capped": capped, "cappedPerSource": per_source, "cutOff": cut_off, "other": other})
    );
    Ok(())
}

fn members(addr: &str, count: usize, hold_ms: u64) -> anyhow::Result<()> {
    let mut inputs = Inputs::from_env()?;
    inputs.expose = false;
    let cfg = inputs.config()?;
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..count {
        let mut dsm = Dsm::open(cfg.clone())?;
        let at = config::address(addr, dsm.directory())?;
        let mut word = [0u8; 8];
        match dsm.read(at, &mut word) {
            Ok(()) => admitted.push(dsm),
            Err(e @ DsmError::OwnerGone { .. }) => refused.push(e.to_string()),
            Err(e) => refused.push(format!("(not a refusal) {e}")),
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    println!(
        "{}",
        json!({"admitted": admitted.len(), "refused": refused})
    );
    Ok(())
}
