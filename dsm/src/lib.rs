//! rocefabric's data plane: a pod reads, writes and updates its peers' windows of the fabric's
//! shared address space with one-sided RDMA over RoCE v2, bounds-checked against the operator's
//! region directory, with no CPU on the target.
//!
//! ```no_run
//! # fn main() -> Result<(), rocefabric_dsm::DsmError> {
//! use rocefabric_dsm::{Config, Dsm};
//! let mut dsm = Dsm::open(Config::from_pod()?)?;      // the pod's files and environment
//! let peer = dsm.directory().pod("trainer-1").expect("in the directory").base;
//! dsm.write(peer, b"hello")?;                          // lands in trainer-1's memory
//! let old = dsm.fetch_add(peer + 64, 1)?;              // a counter no update of which is lost
//! # let _ = old; Ok(()) }
//! ```
//!
//! Rooms: [`directory`] (who holds which window; the bounds check), [`wire`] (the rendezvous
//! protocol and its checks), [`auth`] (the fabric key, nonces and proofs), [`memory`] (hugepages
//! or anonymous, limits), [`config`] (the pod's inputs) are pure; so are [`transport`] (the work
//! requests and queue pair transitions, as rdma-core's structs) and `ibv` (libibverbs' ABI,
//! declared); [`verbs`] is the only module with `unsafe` (the mapping, and the calls into
//! libibverbs, loaded at run time); [`handshake`] runs the rendezvous over a TCP stream, before any
//! verbs resource exists; [`endpoint`] serves this pod's window, bounded; [`client`] is [`Dsm`]
//! (its lock is in `lock`).
//!
//! # Memory model
//!
//! What a CPU reader on the target may rely on, over reliable-connected (RC) queue pairs:
//!
//! 1. **Within one request, no byte order.** The bytes of one RDMA write land in no specified
//!    order, and a reader polling the window may see part of it. Never poll the last byte of the
//!    data as a "done" flag.
//! 2. **Between requests on one connection, program order.** Requests one pod posts to one owner
//!    execute at the owner in the order posted (RC); [`Dsm::batch`] keeps the caller's order per
//!    owner. So the publish primitive is **data, then flag** ([`Dsm::publish`]): write the data,
//!    then write a flag word (or bump a sequence number) in a later request on the same
//!    connection. A reader that loads the flag with acquire ordering
//!    ([`verbs::Mapping::load_u64`]) and sees the new value sees all the data written before it.
//!    Across connections (two writers) there is no order: agree on who writes what, or use (3).
//! 3. **Atomics are atomic against each other, not against the CPU.** `compare_and_swap` and
//!    `fetch_add` on an aligned 8-byte word are atomic with respect to every other RDMA atomic on
//!    the owner's HCA (`IBV_ATOMIC_HCA`); "no lost update" for concurrent writers rests on them. The
//!    owner's CPU may read such a word (aligned 8-byte loads are never torn) but must not write it:
//!    the owner updates its own window through [`Dsm`] too (it connects to itself), so every
//!    update of a shared word goes through the HCA.
//! 4. **Multi-word records** are guarded by a lock word ([`Dsm::with_lock`]: acquire with
//!    `compare_and_swap(0 -> me)`, access, release with `compare_and_swap(me -> 0)` on the same
//!    connection): a reader that holds the lock never sees a record torn by a writer that takes it.
//!    `me` ([`lock_word`]) names the holder (its uid's hash and an epoch per acquisition); a lock
//!    whose word stays the same past the caller's lease is presumed held by a dead pod and broken.
//! 5. **Completion means placed.** When [`Dsm::write`] returns, the data is in the owner's memory
//!    (the owner's HCA acknowledged it; Soft-RoCE and ConnectX place before acknowledging).

pub mod auth;
pub mod client;
pub mod config;
mod conn_cache;
pub mod directory;
pub mod endpoint;
pub mod error;
pub mod handshake;
mod ibv;
mod lock;
pub mod memory;
pub mod transport;
pub mod verbs;
pub mod wire;

pub use client::{Access, Config, Dsm, Stats};
pub use directory::Directory;
pub use error::DsmError;
pub use lock::lock_word;
// The shared formats of `Config::window` and `Directory::entries`.
pub use rocefabric_formats::{directory::DirectoryEntry, region::RegionAssignment};
