//! The rendezvous protocol (pure): lines of JSON over TCP on the pod IP, the way NCCL bootstraps,
//! with mutual authentication ([`crate::auth`]) before any queue pair exists:
//!
//! 1. initiator: [`Hello`] (who it is, whom its directory names, a fresh nonce);
//! 2. owner: [`Answer`]: a [`Challenge`] (its pod and uid, its own nonce, its proof over both) when
//!    the hello names this pod and uid and the initiator is a pod of the owner's own directory with
//!    that uid, else a refusal;
//! 3. initiator: [`Response`]: a [`Proof`] (its queue pair, and its proof bound to that queue
//!    pair) when the owner is the pod and uid its directory names and proved holding the fabric
//!    key, else a refusal;
//! 4. owner: [`Reply`]: an [`Offer`] (its queue pair and where the window is registered, with its
//!    proof over them for this exchange) when the proof holds, else a refusal.
//!
//! So nobody on the path can put its own queue pair under a member's proof, or change an offer,
//! without the key.
//!
//! Every refusal names its cause and is sent to the other side before the stream closes. The TCP
//! stream stays open for the life of the RDMA connection: when either side closes it, the other
//! destroys its queue pair. The initiator sends a keepalive newline now and then; an owner drops a
//! peer that sent nothing for its idle timeout.

use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

use crate::auth::{Identity, Member, Nonce, Side, Transcript};
use crate::directory::Directory;

/// Protocol version; a peer speaking another is refused (1: no authentication).
pub const VERSION: u32 = 3;

/// Largest line either side reads, so a stray client cannot make the owner buffer without end.
pub const MAX_LINE: usize = 4096;

/// How a queue pair is reached over RoCE v2: the port's GID (an IPv4-mapped or IPv6 address),
/// its queue pair number and first packet sequence number, and the path MTU (bytes) its side
/// can use, the port's active MTU when the queue pair was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAddress {
    pub gid: Ipv6Addr,
    pub qpn: u32,
    pub psn: u32,
    /// Absent from peers of an older version: they use their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// The path MTU both ends of a connection use: the smaller of the two sides' (an RC connection
/// whose ends disagree loses every multi-packet response, e.g. after the fabric's MTU changed
/// under a long-running owner).
pub fn path_mtu(own: u32, peer: Option<u32>) -> u32 {
    peer.map_or(own, |p| own.min(p))
}

/// Initiator to owner, first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    pub version: u32,
    pub fabric: String,
    pub namespace: String,
    /// The initiating pod and its uid.
    pub from_pod: String,
    pub from_uid: String,
    /// The window owner the initiator's directory names; the owner refuses when it is not.
    pub to_pod: String,
    /// Absent when the initiator's directory has none: refused (an owner that cannot be told
    /// from a replaced one is never connected).
    pub to_uid: Option<String>,
    /// The initiator's challenge (hex).
    pub nonce: String,
}

/// Owner to initiator, first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    Challenge(Challenge),
    Refuse(String),
}

/// The owner says who it is, proves it, and challenges the initiator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Challenge {
    pub pod: String,
    pub uid: String,
    pub nonce: String,
    /// The owner's proof over the transcript (hex).
    pub proof: String,
}

/// Initiator to owner, second.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Response {
    Prove(Proof),
    Refuse(String),
}

/// The initiator's proof, and the queue pair it made for the owner once the owner proved itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proof {
    pub proof: String,
    pub qp: QpAddress,
}

/// Owner to initiator, last (a refusal before the hello was read has this shape too: every refusal
/// is `{"refuse": why}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reply {
    Accept(Offer),
    Refuse(String),
}

/// Everything a peer needs to read, write and update the owner's window without its CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    pub qp: QpAddress,
    /// The window in the fabric's address space.
    pub base: u64,
    pub size: u64,
    /// Where the window is registered in the owner's process, and its remote key: on the wire,
    /// sealed under the exchange's one-time pad ([`Exchange::sign`]), so that watching the pod
    /// network does not give them away.
    pub addr: u64,
    pub rkey: u32,
    /// The owner's proof over the exchange and the fields above (hex; empty until signed).
    #[serde(default)]
    pub proof: String,
}

/// The hello an initiator `us` sends to the owner `to` (`to_uid`: what its directory names).
pub fn hello(us: &Identity, to_pod: &str, to_uid: Option<&str>, nonce: &Nonce) -> Hello {
    Hello {
        version: VERSION,
        fabric: us.fabric.clone(),
        namespace: us.namespace.clone(),
        from_pod: us.me.pod.clone(),
        from_uid: us.me.uid.clone(),
        to_pod: to_pod.to_string(),
        to_uid: to_uid.map(String::from),
        nonce: nonce.to_hex(),
    }
}

/// One rendezvous as both ends see it once the owner has answered: the hello, both pods, both
/// nonces. Every proof is over its transcript, each bound to what it vouches for.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub hello: Hello,
    pub initiator: Member,
    pub owner: Member,
    nonces: (Nonce, Nonce),
}

/// What a proof vouches for besides the exchange: a queue pair, or an offer without its proof.
fn bound<T: Serialize>(what: &T) -> Vec<u8> {
    encode(what)
}

impl Exchange {
    fn transcript(&self) -> Transcript<'_> {
        Transcript {
            fabric: &self.hello.fabric,
            namespace: &self.hello.namespace,
            initiator: &self.initiator,
            owner: &self.owner,
            initiator_nonce: &self.nonces.0,
            owner_nonce: &self.nonces.1,
        }
    }

    fn refused(&self, who: &Member, us: &Identity) -> String {
        format!(
            "pod {} ({}) did not prove holding the fabric key of {:?} in namespace {:?}",
            who.pod, who.uid, us.fabric, us.namespace
        )
    }

    /// The initiator's proof, bound to the queue pair `qp` it made for the owner.
    pub fn prove(&self, us: &Identity, qp: QpAddress) -> Proof {
        let proof = self
            .transcript()
            .prove(&us.key, Side::Initiator, &bound(&qp));
        Proof { proof, qp }
    }

    /// The owner checks the initiator's proof (for this exchange and the queue pair it names).
    pub fn check_proof(&self, us: &Identity, proof: &Proof) -> Result<(), String> {
        let t = self.transcript();
        if t.verify(&us.key, Side::Initiator, &bound(&proof.qp), &proof.proof) {
            Ok(())
        } else {
            Err(self.refused(&self.initiator, us))
        }
    }

    /// The owner's offer, signed for this exchange, its address and rkey sealed (the proof covers
    /// them in the clear, so a changed sealed value fails the check).
    pub fn sign(&self, us: &Identity, mut offer: Offer) -> Offer {
        offer.proof = String::new();
        offer.proof = self
            .transcript()
            .prove(&us.key, Side::Offer, &bound(&offer));
        self.seal(us, offer)
    }

    /// XOR the offer's address and rkey with this exchange's pad (sealing and opening alike).
    fn seal(&self, us: &Identity, mut offer: Offer) -> Offer {
        let pad = self.transcript().pad(&us.key);
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&pad[at..at + 8]);
            u64::from_le_bytes(w)
        };
        offer.addr ^= word(0);
        offer.rkey ^= word(8) as u32;
        offer
    }

    /// The initiator opens the offer and checks that it comes from the owner it authenticated,
    /// unchanged; `Ok` holds the opened offer.
    pub fn check_offer(&self, us: &Identity, sealed: &Offer) -> Result<Offer, String> {
        let opened = self.seal(us, sealed.clone());
        let unsigned = Offer {
            proof: String::new(),
            ..opened.clone()
        };
        let t = self.transcript();
        if t.verify(&us.key, Side::Offer, &bound(&unsigned), &opened.proof) {
            Ok(opened)
        } else {
            Err(format!(
                "the offer of pod {} ({}) does not carry its proof for this exchange",
                self.owner.pod, self.owner.uid
            ))
        }
    }
}

/// The owner `us` checks a hello against its own directory; `Ok` holds its challenge (with the
/// fresh `nonce`), `Err` why it refuses. Admitted for a challenge are only pods this directory
/// names with the uid the hello claims, asking for this pod and uid, in this fabric and namespace.
pub fn check_hello(
    hello: &Hello,
    us: &Identity,
    directory: &Directory,
    nonce: Nonce,
) -> Result<(Exchange, Challenge), String> {
    if hello.version != VERSION {
        return Err(format!(
            "protocol version {} (this pod speaks {VERSION})",
            hello.version
        ));
    }
    if hello.fabric != us.fabric {
        return Err(format!(
            "fabric {:?} (this pod is in {:?})",
            hello.fabric, us.fabric
        ));
    }
    if hello.namespace != us.namespace {
        return Err(format!(
            "namespace {:?} (this pod is in {:?})",
            hello.namespace, us.namespace
        ));
    }
    let me = &us.me;
    if hello.to_pod != me.pod {
        return Err(format!(
            "asked for pod {:?}, this is {:?}",
            hello.to_pod, me.pod
        ));
    }
    // An empty uid is no uid: it names no pod.
    match hello.to_uid.as_deref().filter(|u| !u.is_empty()) {
        None => {
            return Err(format!(
                "the hello names no uid for pod {}: an owner is only reached by its uid",
                me.pod
            ));
        }
        Some(u) if u != me.uid => {
            return Err(format!(
                "the directory names uid {u}, pod {} is now uid {} (the window's pod was replaced)",
                me.pod, me.uid
            ));
        }
        Some(_) => {}
    }
    let from = &hello.from_pod;
    let Some(entry) = directory.pod(from) else {
        return Err(format!(
            "pod {from:?} is not in this pod's directory of fabric {:?} in namespace {:?}",
            us.fabric, us.namespace
        ));
    };
    match entry.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(u) if u == hello.from_uid => {}
        Some(u) => {
            return Err(format!(
                "pod {from} claims uid {:?}, this pod's directory names uid {u}",
                hello.from_uid
            ));
        }
        None => {
            return Err(format!(
                "this pod's directory names no uid for pod {from} yet"
            ));
        }
    }
    let initiator_nonce = Nonce::from_hex(&hello.nonce).map_err(|e| format!("hello: {e}"))?;
    let exchange = Exchange {
        hello: hello.clone(),
        initiator: Member {
            pod: from.clone(),
            uid: hello.from_uid.clone(),
        },
        owner: me.clone(),
        nonces: (initiator_nonce, nonce),
    };
    let proof = exchange.transcript().prove(&us.key, Side::Owner, &[]);
    let challenge = Challenge {
        pod: me.pod.clone(),
        uid: me.uid.clone(),
        nonce: nonce.to_hex(),
        proof,
    };
    Ok((exchange, challenge))
}

/// The initiator `us` checks the owner's challenge to the hello it sent with `nonce`: the owner
/// must be the pod and uid its directory names and prove holding the fabric key over this very
/// exchange. `Ok` holds the exchange, for the initiator's proof and the offer's check.
pub fn check_challenge(
    us: &Identity,
    hello: &Hello,
    nonce: &Nonce,
    challenge: &Challenge,
) -> Result<Exchange, String> {
    if challenge.pod != hello.to_pod {
        return Err(format!(
            "pod {:?} answered for {:?}",
            challenge.pod, hello.to_pod
        ));
    }
    let expected = hello.to_uid.as_deref().unwrap_or_default();
    if challenge.uid != expected {
        return Err(format!(
            "the owner at this address is uid {}, the directory names {expected} for pod {} \
             (its address was reused by another pod instance)",
            challenge.uid, hello.to_pod
        ));
    }
    let owner_nonce = Nonce::from_hex(&challenge.nonce).map_err(|e| format!("challenge: {e}"))?;
    let exchange = Exchange {
        hello: hello.clone(),
        initiator: us.me.clone(),
        owner: Member {
            pod: challenge.pod.clone(),
            uid: challenge.uid.clone(),
        },
        nonces: (*nonce, owner_nonce),
    };
    if !exchange
        .transcript()
        .verify(&us.key, Side::Owner, &[], &challenge.proof)
    {
        return Err(exchange.refused(&exchange.owner, us));
    }
    Ok(exchange)
}

/// One line of JSON, newline-terminated.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut line =
        serde_json::to_vec(msg).unwrap_or_else(|_| unreachable!("plain structs serialize"));
    line.push(b'\n');
    line
}

#[cfg(test)]
pub(crate) mod tests;
