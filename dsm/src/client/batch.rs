//! [`Dsm::batch`]: the hot path. Every access is resolved against the directory, then posted
//! per owner in rounds that fill the staging buffer and queue depth, with one wait per round.
//! Its working lists are kept across batches, so a warm batch allocates nothing.

use std::time::Instant;

use super::{Access, CHUNK, COMPLETION_TIMEOUT, DEPTH, Dsm, STAGING};
use crate::error::{DsmError, Result};
use crate::transport::{Op, Work};

/// A batch's working lists, kept across batches so that a warm batch allocates nothing.
#[derive(Default)]
pub(super) struct Scratch {
    /// Per access: its owner's directory entry, then the cache slot of its connection.
    owners: Vec<usize>,
    /// Pieces of at most [`CHUNK`] bytes: (access, offset in it, length).
    pieces: Vec<(usize, u64, u64)>,
    /// This round's pieces: (piece, staging offset).
    staged: Vec<(usize, u64)>,
    /// Per cache slot: this round's requests.
    works: Vec<Vec<Work>>,
    /// The slots with requests this round, in first-use order.
    active: Vec<usize>,
    /// (slot, requests the HCA accepted, the first one's id).
    posted: Vec<(usize, usize, u64)>,
    /// Every connection that failed this round: (slot, piece, status).
    failures: Vec<(usize, u64, String)>,
}

impl Dsm {
    /// Run every access: all are resolved and bounds-checked against the directory first (nothing
    /// is posted if one fails), then posted per owner in rounds of up to [`DEPTH`] requests,
    /// waiting once per round. Requests to one owner execute in the order given. Once the
    /// connections are up and the scratch buffers have grown, a batch allocates nothing.
    pub fn batch(&mut self, accesses: &mut [Access<'_>]) -> Result<()> {
        // One clock read serves the refresh check and the first round's completion deadline.
        let now = Instant::now();
        self.refresh_if_due(now);
        let mut scratch = std::mem::take(&mut self.scratch);
        let out = self.run_batch(&mut scratch, accesses, now);
        self.scratch = scratch;
        out
    }

    fn run_batch(
        &mut self,
        s: &mut Scratch,
        accesses: &mut [Access<'_>],
        now: Instant,
    ) -> Result<()> {
        // Resolve and check every access first (re-reading the directory once on a miss: the
        // pod may be new, and a re-read moves the entries, so all are resolved again).
        let mut reloaded = false;
        'resolve: loop {
            s.owners.clear();
            for a in accesses.iter() {
                let i = match self.directory.owner_index(a.addr(), a.len()) {
                    Ok(i) => i,
                    Err(_) if !reloaded => {
                        reloaded = true;
                        self.reload_directory();
                        continue 'resolve;
                    }
                    Err(e) => return Err(e),
                };
                if let Some(op) = a.atomic().filter(|_| !a.addr().is_multiple_of(8)) {
                    return Err(DsmError::Misaligned {
                        addr: a.addr(),
                        op,
                        owner: self.directory.entries()[i].pod.clone(),
                    });
                }
                s.owners.push(i);
            }
            break;
        }
        // Directory entries to connection slots.
        let connects = self.stats.connects;
        for (owner, a) in s.owners.iter_mut().zip(accesses.iter()) {
            *owner = self.entry_slot(*owner, a.addr())?;
        }
        // Connecting may have taken seconds: the first round's deadline counts from now.
        let mut round_started = if self.stats.connects == connects {
            now
        } else {
            Instant::now()
        };
        s.pieces.clear();
        for (i, a) in accesses.iter().enumerate() {
            let len = a.len();
            let mut off = 0;
            loop {
                let n = (len - off).min(CHUNK);
                s.pieces.push((i, off, n));
                off += n;
                if off >= len {
                    break;
                }
            }
        }
        if s.works.len() < self.conns.slots() {
            s.works.resize_with(self.conns.slots(), Vec::new);
        }
        let mut next = 0;
        while next < s.pieces.len() {
            if next > 0 {
                round_started = Instant::now();
            }
            next = self.fill_round(s, accesses, next);
            self.post_round(s, accesses, round_started)?;
            // Copy results out.
            for &(p, staged) in &s.staged {
                let (i, off, n) = s.pieces[p];
                match &mut accesses[i] {
                    Access::Read { buf, .. } => {
                        let (b, e) = (off as usize, (off + n) as usize);
                        self.staging.mapping.read(staged as usize, &mut buf[b..e]);
                    }
                    Access::CompareSwap { prev, .. } | Access::FetchAdd { prev, .. } => {
                        let mut w = [0u8; 8];
                        self.staging.mapping.read(staged as usize, &mut w);
                        *prev = u64::from_ne_bytes(w);
                    }
                    Access::Write { .. } => {}
                }
            }
        }
        Ok(())
    }

    /// Stage pieces from `next` on into one round (staging space and queue depth permitting) as
    /// per-owner work requests; returns the first piece left for the next round.
    fn fill_round(&mut self, s: &mut Scratch, accesses: &[Access<'_>], mut next: usize) -> usize {
        for &slot in &s.active {
            s.works[slot].clear();
        }
        s.active.clear();
        s.staged.clear();
        let mut used = 0u64;
        while next < s.pieces.len() {
            let (i, off, n) = s.pieces[next];
            let room = n.div_ceil(8) * 8;
            let slot = s.owners[i];
            if used + room > STAGING as u64 || s.works[slot].len() >= DEPTH {
                break;
            }
            let a = &accesses[i];
            if let Access::Write { data, .. } = a {
                let (b, e) = (off as usize, (off + n) as usize);
                self.staging.mapping.write(used as usize, &data[b..e]);
            }
            let conn = self
                .conns
                .get(slot)
                .unwrap_or_else(|| unreachable!("connected"));
            let op = match a {
                Access::Read { .. } => Op::Read,
                Access::Write { .. } => Op::Write,
                Access::CompareSwap { old, new, .. } => Op::CompareSwap {
                    compare: *old,
                    swap: *new,
                },
                Access::FetchAdd { add, .. } => Op::FetchAdd { add: *add },
            };
            if s.works[slot].is_empty() {
                s.active.push(slot);
            }
            s.works[slot].push(Work {
                id: next as u64,
                op,
                offset: used,
                len: n as u32,
                remote: conn.offer.addr + (a.addr() + off - conn.offer.base),
                rkey: conn.offer.rkey,
            });
            s.staged.push((next, used));
            used += room;
            next += 1;
        }
        next
    }

    /// Post the round's requests, each owner's as one list, and wait for them. A failed queue
    /// pair is in the error state: every one that failed (or timed out) in the round is dropped,
    /// not only the first; the next access to each reconnects. The error names the earliest
    /// failed piece.
    fn post_round(
        &mut self,
        s: &mut Scratch,
        accesses: &[Access<'_>],
        started: Instant,
    ) -> Result<()> {
        s.posted.clear();
        s.failures.clear();
        for &slot in &s.active {
            let ws = &s.works[slot];
            let conn = self.conns.get_mut(slot).unwrap_or_else(|| unreachable!());
            let accepted = match conn.qp.post(&self.staging, ws) {
                Ok(()) => ws.len(),
                Err(e) => {
                    let refused = ws[e.accepted.min(ws.len() - 1)].id;
                    s.failures
                        .push((slot, refused, format!("post failed: {}", e.reason)));
                    e.accepted
                }
            };
            // Only what the HCA took counts, and is waited for before staging is reused.
            self.stats.posted += accepted as u64;
            if accepted > 0 {
                s.posted.push((slot, accepted, ws[0].id));
            }
        }
        for &(slot, n, first) in &s.posted {
            let conn = self.conns.get_mut(slot).unwrap_or_else(|| unreachable!());
            if let Some((id, status)) = conn
                .qp
                .complete(n, COMPLETION_TIMEOUT, started)
                .into_iter()
                .next()
            {
                s.failures
                    .push((slot, if id == u64::MAX { first } else { id }, status));
            }
        }
        if s.failures.is_empty() {
            return Ok(());
        }
        s.failures.sort_by_key(|f| f.1);
        let mut first = None;
        for (slot, piece, status) in s.failures.drain(..) {
            if let Some((pod, c)) = self.conns.remove(slot) {
                if first.is_none() {
                    first = Some((pod.clone(), piece, status));
                }
                self.dropped.insert(pod, c.uid);
            }
        }
        let (owner, piece, status) = first.unwrap_or_else(|| unreachable!("a failure"));
        let (i, off, _) = s.pieces[piece as usize];
        Err(DsmError::Transport {
            addr: accesses[i].addr() + off,
            owner,
            status,
        })
    }

    /// The slot of a live connection to the owner at `entry` of the directory (for the access
    /// at `addr`): the cached one when it is still the pod the entry names, else a new one.
    /// Looked up by entry index, not by name: no hashing, no allocation once connected.
    fn entry_slot(&mut self, entry: usize, addr: u64) -> Result<usize> {
        let e = &self.directory.entries()[entry];
        if let Some(slot) = self
            .entry_slots
            .get(entry)
            .copied()
            .flatten()
            .filter(|&slot| {
                self.conns
                    .get_named(slot)
                    .is_some_and(|(pod, c)| pod == e.pod && c.serves(e))
            })
        {
            return Ok(slot);
        }
        let e = e.clone();
        let slot = self.connect(&e, addr)?;
        let n = self.directory.entries().len();
        if self.entry_slots.len() < n {
            self.entry_slots.resize(n, None);
        }
        self.entry_slots[entry] = Some(slot);
        Ok(slot)
    }
}
