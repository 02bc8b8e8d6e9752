//! Who may cross a window's rendezvous (pure but for [`Nonce::fresh`]): both ends of a connection
//! prove that they hold the fabric's key of their namespace, each over a transcript that names the
//! fabric, the namespace, both pods and uids and both ends' fresh nonces, labelled with the
//! direction. The key comes from the `<fabric>-key` Secret the operator writes beside the region
//! directory; a pod mounts it read-only. Knowing a pod's name and uid (they are in a ConfigMap) is
//! not enough to be admitted, a recorded proof answers no later challenge, and an owner's proof
//! cannot be reflected as an initiator's.
//!
//! One key per fabric and namespace, not one per pod: every member may read and write every
//! window of the fabric anyway (that is what the fabric is for), so a member posing as another
//! gains nothing it did not have; the wall that matters is between members and everyone else.
//! Per-pod keys would need a Secret per pod, which a Deployment's or Job's pod template cannot name.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Fewest bytes a fabric key may have (the operator writes 32 random bytes).
pub const MIN_KEY_LEN: usize = 32;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;

/// The fabric's key of this namespace.
#[derive(Clone)]
pub struct FabricKey(hmac::Key);

impl std::fmt::Debug for FabricKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FabricKey(..)")
    }
}

impl FabricKey {
    /// The key from the Secret's bytes, or why they are not one.
    pub fn new(bytes: &[u8]) -> Result<FabricKey, String> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "{} bytes: a fabric key has at least {MIN_KEY_LEN}",
                bytes.len()
            ));
        }
        Ok(FabricKey(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }
}

/// A fresh random challenge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nonce(pub [u8; NONCE_LEN]);

impl Nonce {
    /// From the system's random source.
    pub fn fresh() -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        // getrandom(2) does not fail once the pool is initialized (always, past early boot).
        SystemRandom::new()
            .fill(&mut n)
            .unwrap_or_else(|_| panic!("the system random source failed"));
        Nonce(n)
    }

    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(text: &str) -> Result<Nonce, String> {
        unhex(text)
            .and_then(|b| <[u8; NONCE_LEN]>::try_from(b).ok())
            .map(Nonce)
            .ok_or_else(|| format!("a nonce is {NONCE_LEN} bytes of hex"))
    }
}

/// A pod of the fabric as the directory and the pod itself name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub pod: String,
    pub uid: String,
}

/// This pod as it proves itself: its fabric and namespace, its name and uid, the key.
#[derive(Clone, Debug)]
pub struct Identity {
    pub fabric: String,
    pub namespace: String,
    pub me: Member,
    pub key: FabricKey,
}

/// What a proof is: the labels keep one from standing in for another (an owner's proof for an
/// initiator's, a challenge's for an offer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The initiator's proof, bound to the queue pair it offers.
    Initiator,
    /// The owner's answer to the initiator's challenge.
    Owner,
    /// The owner's offer (its queue pair, where the window is and its rkey).
    Offer,
    /// Not a proof: the one-time pad that hides the offer's address and rkey on the wire.
    Seal,
}

/// What both ends agree on before either proves anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript<'a> {
    pub fabric: &'a str,
    pub namespace: &'a str,
    pub initiator: &'a Member,
    pub owner: &'a Member,
    pub initiator_nonce: &'a Nonce,
    pub owner_nonce: &'a Nonce,
}

impl Transcript<'_> {
    /// The bytes a proof covers: a label, then every field length-prefixed (no two transcripts
    /// encode alike), last what else it vouches for (`bound`: a queue pair, an offer).
    fn bytes(&self, side: Side, bound: &[u8]) -> Vec<u8> {
        let label: &[u8] = match side {
            Side::Initiator => b"rocefabric-dsm/2 initiator proof",
            Side::Owner => b"rocefabric-dsm/2 owner proof",
            Side::Offer => b"rocefabric-dsm/2 owner offer",
            Side::Seal => b"rocefabric-dsm/3 offer seal",
        };
        let mut out = Vec::with_capacity(256);
        for field in [
            label,
            self.fabric.as_bytes(),
            self.namespace.as_bytes(),
            self.initiator.pod.as_bytes(),
            self.initiator.uid.as_bytes(),
            self.owner.pod.as_bytes(),
            self.owner.uid.as_bytes(),
            &self.initiator_nonce.0,
            &self.owner_nonce.0,
            bound,
        ] {
            out.extend_from_slice(&(field.len() as u64).to_be_bytes());
            out.extend_from_slice(field);
        }
        out
    }

    /// `side`'s proof (hex) of this transcript and `bound`: HMAC-SHA256 under the fabric key.
    pub fn prove(&self, key: &FabricKey, side: Side, bound: &[u8]) -> String {
        hex(hmac::sign(&key.0, &self.bytes(side, bound)).as_ref())
    }

    /// 32 bytes that only holders of the key who saw this exchange can compute (fresh nonces on
    /// both sides make them new for every exchange): a one-time pad for the offer's secrets.
    pub fn pad(&self, key: &FabricKey) -> [u8; 32] {
        let tag = hmac::sign(&key.0, &self.bytes(Side::Seal, &[]));
        let mut pad = [0u8; 32];
        pad.copy_from_slice(&tag.as_ref()[..32]);
        pad
    }

    /// Whether `proof` is `side`'s proof of this transcript and `bound` (compared in constant
    /// time).
    pub fn verify(&self, key: &FabricKey, side: Side, bound: &[u8], proof: &str) -> bool {
        unhex(proof).is_some_and(|tag| hmac::verify(&key.0, &self.bytes(side, bound), &tag).is_ok())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn key(byte: u8) -> FabricKey {
        FabricKey::new(&[byte; 32]).unwrap()
    }

    fn member(pod: &str, uid: &str) -> Member {
        Member {
            pod: pod.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_proof_verifies_only_for_its_side_key_and_transcript() {
        let (a, b) = (member("a", "ua"), member("b", "ub"));
        let (ni, no) = (Nonce([1; 32]), Nonce([2; 32]));
        let t = Transcript {
            fabric: "f",
            namespace: "ns",
            initiator: &a,
            owner: &b,
            initiator_nonce: &ni,
            owner_nonce: &no,
        };
        let proof = t.prove(&key(7), Side::Initiator, b"qp");
        assert_eq!(proof.len(), 64);
        assert!(t.verify(&key(7), Side::Initiator, b"qp", &proof));
        assert!(
            !t.verify(&key(8), Side::Initiator, b"qp", &proof),
            "another key"
        );
        assert!(!t.verify(&key(7), Side::Owner, b"qp", &proof), "reflected");
        assert!(
            !t.verify(&key(7), Side::Offer, b"qp", &proof),
            "as an offer's"
        );
        assert!(
            !t.verify(&key(7), Side::Initiator, b"qq", &proof),
            "for another queue pair"
        );
        let fresh = Nonce([3; 32]);
        let replayed = Transcript {
            owner_nonce: &fresh,
            ..t.clone()
        };
        assert!(
            !replayed.verify(&key(7), Side::Initiator, b"qp", &proof),
            "replayed"
        );
        let other_ns = Transcript {
            namespace: "ns2",
            ..t.clone()
        };
        assert!(!other_ns.verify(&key(7), Side::Initiator, b"qp", &proof));
        // Length prefixes: moving a byte from one field to the next changes the transcript.
        let (a2, b2) = (member("a", "uab"), member("", "ub"));
        let shifted = Transcript {
            initiator: &a2,
            owner: &b2,
            ..t.clone()
        };
        assert!(!shifted.verify(&key(7), Side::Initiator, b"qp", &proof));
        assert!(!t.verify(&key(7), Side::Initiator, b"qp", "zz"));
        assert!(!t.verify(&key(7), Side::Initiator, b"qp", ""));
    }

    #[test]
    fn keys_are_long_enough_and_nonces_fresh_hex() {
        assert!(FabricKey::new(&[0; 31]).unwrap_err().contains("31 bytes"));
        assert!(format!("{:?}", key(1)).contains(".."), "no key in logs");
        let (n1, n2) = (Nonce::fresh(), Nonce::fresh());
        assert_ne!(n1, n2);
        assert_eq!(Nonce::from_hex(&n1.to_hex()).unwrap(), n1);
        assert!(Nonce::from_hex("abcd").is_err());
        assert!(Nonce::from_hex(&"é".repeat(32)).is_err());
    }
}
