//! `rocefabric-dsm session`: this pod serves its window and runs one command per input line,
//! answering each with one JSON line (errors included: the session goes on), for scripts and
//! tests that need one long-lived connection cache across steps.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use rocefabric_dsm::config::{address, number};
use rocefabric_dsm::{Access, Dsm};
use serde_json::{Value, json};

/// How long a session's lock may be held before a waiter breaks it (its critical sections take
/// milliseconds; a holder this late is dead).
const LOCK_LEASE: Duration = Duration::from_secs(10);

pub const HELP: &str = "Serve this pod's window and run commands from stdin, one per line; each \
answers with one JSON line {\"n\", \"cmd\", \"ok\", \"error\"?, ...}. ADDR is a number or POD+OFFSET.

  write ADDR LEN SEED          write LEN pattern bytes (seeded)
  read ADDR LEN [SEED]         read LEN bytes; with SEED, \"match\" says whether they are the pattern
  write-word ADDR VALUE | read-word ADDR
  cas ADDR OLD NEW             compare-and-swap; \"prev\"
  add ADDR N [TIMES [BATCH]]   fetch-and-add N, TIMES times, BATCH per round trip; \"prev\" of the last
  publish ADDR LEN SEED FLAG VALUE   data then flag word, in order
  check-local OFFSET LEN SEED  compare this pod's own memory (CPU, no RDMA) with the pattern
  wait-local OFFSET VALUE [MS] wait until this pod's word at OFFSET equals VALUE (CPU polling)
  locked-write LOCK REC WORDS ROUNDS ID   ROUNDS times: take the lock, write WORDS equal words
  locked-read LOCK REC WORDS ROUNDS ID    ROUNDS times: take the lock, read; \"torn\" counts mixed records
  hold-lock LOCK MS            take the lock and hold it for MS (a holder that may be killed)
  reach ADDR [MS]              retry until the owner of ADDR answers
  sleep MS | echo TEXT | stats";

/// Deterministic bytes for `seed` (xorshift64*), so writer and reader agree without sharing data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn run(dsm: &mut Dsm, input: impl BufRead, out: &mut impl Write) -> Result<()> {
    for (i, line) in input.lines().enumerate() {
        let line = line.context("reading stdin")?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(&cmd) = words.first() else { continue };
        if cmd.starts_with('#') {
            continue;
        }
        let started = Instant::now();
        let mut answer = match step(dsm, &words) {
            Ok(Value::Object(m)) => Value::Object(m),
            Ok(other) => json!({ "value": other }),
            Err(e) => json!({ "ok": false, "error": format!("{e:#}") }),
        };
        let m = answer
            .as_object_mut()
            .unwrap_or_else(|| unreachable!("an object above"));
        m.entry("ok").or_insert(Value::Bool(true));
        m.insert("n".into(), json!(i + 1));
        m.insert("cmd".into(), json!(cmd));
        m.insert("ms".into(), json!(started.elapsed().as_secs_f64() * 1e3));
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn arg<'a>(words: &[&'a str], i: usize, name: &str) -> Result<&'a str> {
    words
        .get(i)
        .copied()
        .ok_or_else(|| anyhow!("{}: missing {name}", words[0]))
}

fn step(dsm: &mut Dsm, w: &[&str]) -> Result<Value> {
    // POD+OFFSET resolves against the directory as it is now (a pod may have been replaced).
    dsm.refresh_directory();
    let addr =
        |dsm: &Dsm, i: usize| -> Result<u64> { Ok(address(arg(w, i, "ADDR")?, dsm.directory())?) };
    let num = |i: usize, name: &str| -> Result<u64> { Ok(number(name, arg(w, i, name)?)?) };
    Ok(match w[0] {
        "write" => {
            let (a, len, seed) = (addr(dsm, 1)?, num(2, "LEN")?, num(3, "SEED")?);
            dsm.write(a, &pattern(seed, usize::try_from(len)?))?;
            json!({ "addr": a, "len": len })
        }
        "read" => {
            let (a, len) = (addr(dsm, 1)?, num(2, "LEN")?);
            let mut buf = vec![0u8; usize::try_from(len)?];
            dsm.read(a, &mut buf)?;
            let mut v =
                json!({ "addr": a, "len": len, "head": super::hex(&buf[..buf.len().min(16)]) });
            if w.len() > 3 {
                v["match"] = json!(buf == pattern(num(3, "SEED")?, buf.len()));
            }
            v
        }
        "write-word" => {
            let a = addr(dsm, 1)?;
            dsm.write(a, &num(2, "VALUE")?.to_ne_bytes())?;
            json!({ "addr": a })
        }
        "read-word" => {
            let a = addr(dsm, 1)?;
            let mut b = [0u8; 8];
            dsm.read(a, &mut b)?;
            json!({ "addr": a, "value": u64::from_ne_bytes(b) })
        }
        "cas" => {
            let a = addr(dsm, 1)?;
            json!({ "addr": a, "prev": dsm.compare_and_swap(a, num(2, "OLD")?, num(3, "NEW")?)? })
        }
        "add" => {
            let (a, n) = (addr(dsm, 1)?, num(2, "N")?);
            let times = if w.len() > 3 { num(3, "TIMES")? } else { 1 };
            let batch = if w.len() > 4 {
                num(4, "BATCH")?.max(1)
            } else {
                1
            };
            let mut done = 0;
            let mut prev = 0;
            while done < times {
                let k = batch.min(times - done);
                let mut ops: Vec<Access<'_>> = (0..k)
                    .map(|_| Access::FetchAdd {
                        addr: a,
                        add: n,
                        prev: 0,
                    })
                    .collect();
                dsm.batch(&mut ops)?;
                if let Some(Access::FetchAdd { prev: p, .. }) = ops.last() {
                    prev = *p;
                }
                done += k;
            }
            json!({ "addr": a, "times": times, "prev": prev })
        }
        "publish" => {
            let (a, len, seed, flag, value) = (
                addr(dsm, 1)?,
                num(2, "LEN")?,
                num(3, "SEED")?,
                addr(dsm, 4)?,
                num(5, "VALUE")?,
            );
            dsm.publish(a, &pattern(seed, usize::try_from(len)?), flag, value)?;
            json!({ "addr": a, "flag": flag })
        }
        "check-local" => {
            let (off, len, seed) = (num(1, "OFFSET")?, num(2, "LEN")?, num(3, "SEED")?);
            let local = dsm
                .local()
                .ok_or_else(|| anyhow!("this pod does not serve its window"))?;
            let mut buf = vec![0u8; usize::try_from(len)?];
            local.read(usize::try_from(off)?, &mut buf);
            json!({ "match": buf == pattern(seed, buf.len()), "head": super::hex(&buf[..buf.len().min(16)]) })
        }
        "wait-local" => {
            let (off, value) = (num(1, "OFFSET")?, num(2, "VALUE")?);
            let ms = if w.len() > 3 { num(3, "MS")? } else { 60_000 };
            let local = dsm
                .local()
                .ok_or_else(|| anyhow!("this pod does not serve its window"))?;
            let deadline = Instant::now() + Duration::from_millis(ms);
            loop {
                let v = local.load_u64(usize::try_from(off)?);
                if v == value {
                    break json!({ "value": v });
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "word at offset {off} is {v}, not {value}, after {ms} ms"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        "locked-write" | "locked-read" => {
            let (lock, rec) = (addr(dsm, 1)?, addr(dsm, 2)?);
            let (words, rounds, me) = (num(3, "WORDS")?, num(4, "ROUNDS")?, num(5, "ID")?);
            let len = usize::try_from(words)? * 8;
            let mut torn = 0u64;
            for round in 0..rounds {
                if w[0] == "locked-write" {
                    let v = (me << 32) | round;
                    let rec_bytes: Vec<u8> = (0..words).flat_map(|_| v.to_ne_bytes()).collect();
                    dsm.with_lock(lock, LOCK_LEASE, |d| d.write(rec, &rec_bytes))?;
                } else {
                    let mut buf = vec![0u8; len];
                    dsm.with_lock(lock, LOCK_LEASE, |d| d.read(rec, &mut buf))?;
                    if buf.chunks(8).any(|c| c != &buf[..8]) {
                        torn += 1;
                    }
                }
            }
            json!({ "rounds": rounds, "torn": torn })
        }
        "hold-lock" => {
            let (lock, ms) = (addr(dsm, 1)?, num(2, "MS")?);
            dsm.with_lock(lock, LOCK_LEASE, |_| {
                std::thread::sleep(Duration::from_millis(ms));
                Ok(())
            })?;
            json!({ "lock": lock, "held_ms": ms })
        }
        "reach" => {
            // Wait until the owner of ADDR answers (it may still be starting).
            let a = addr(dsm, 1)?;
            let ms = if w.len() > 2 { num(2, "MS")? } else { 120_000 };
            let deadline = Instant::now() + Duration::from_millis(ms);
            let mut b = [0u8; 8];
            let mut tries = 0;
            loop {
                tries += 1;
                match dsm.read(a, &mut b) {
                    Ok(()) => break json!({ "addr": a, "tries": tries }),
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!(error = %e, "not reachable yet");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        "sleep" => {
            std::thread::sleep(Duration::from_millis(num(1, "MS")?));
            json!({})
        }
        "echo" => json!({ "text": w[1..].join(" ") }),
        "stats" => {
            let s = dsm.stats();
            json!({ "connects": s.connects, "reconnects": s.reconnects, "posted": s.posted,
                    "directoryReloads": s.directory_reloads, "peersServed": dsm.peers_served() })
        }
        other => anyhow::bail!("unknown command {other:?} (see rocefabric-dsm session --help)"),
    })
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn patterns_are_deterministic_and_differ_by_seed() {
        assert_eq!(pattern(7, 1000), pattern(7, 1000));
        assert_eq!(&pattern(7, 1000)[..10], &pattern(7, 10)[..]);
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert!(pattern(1, 4096).iter().any(|&b| b != 0));
    }
}
