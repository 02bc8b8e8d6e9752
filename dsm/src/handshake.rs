//! The rendezvous handshake over a TCP stream, both sides (thin I/O shells around the pure checks
//! of [`crate::wire`]): nothing here touches the HCA; the owner's queue pair is made by a
//! [`Window`] once the initiator has proved itself, the initiator's by a closure once the owner has.
//! So the handshake runs, and is tested, over plain loopback TCP.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::auth::{Identity, Member, Nonce};
use crate::directory::Directory;
use crate::wire::{self, Answer, Hello, Offer, Proof, QpAddress, Reply, Response};

/// What an owner serves: it connects a queue pair to an admitted peer and says where the window is.
pub trait Window: Send + Sync + 'static {
    /// Held for the life of the connection (the queue pair).
    type Conn: Send + 'static;
    /// A queue pair connected to `peer`, and the offer that lets the peer reach the window.
    fn connect(&self, peer: QpAddress) -> Result<(Self::Conn, Offer), String>;
}

fn send<T: Serialize>(mut stream: &TcpStream, msg: &T) -> Result<(), String> {
    stream
        .write_all(&wire::encode(msg))
        .map_err(|e| format!("sending: {e}"))
}

fn recv<T: DeserializeOwned>(
    stream: &TcpStream,
    deadline: Instant,
    what: &str,
) -> Result<T, String> {
    let line = read_line_by(stream, deadline, wire::MAX_LINE)
        .map_err(|e| format!("reading the {what}: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("not a {what}: {e}"))
}

/// The owner's side: read the hello, challenge or refuse it, check the initiator's proof, connect
/// a queue pair to it through `window`; `Ok` holds the queue pair, the peer and the offer it got.
/// Every refusal is sent before the error returns; `Err` is
/// the cause, for the log. The whole exchange ends by `deadline`.
pub fn respond<W: Window>(
    stream: &TcpStream,
    deadline: Instant,
    us: &Identity,
    directory: &Directory,
    window: &W,
) -> Result<(W::Conn, Member, Offer), String> {
    let refuse = |why: String| {
        let _ = send(stream, &Reply::Refuse(why.clone()));
        why
    };
    let hello: Hello = recv(stream, deadline, "hello").map_err(refuse)?;
    let (exchange, challenge) =
        wire::check_hello(&hello, us, directory, Nonce::fresh()).map_err(|why| {
            // Quoted: the names come from an unauthenticated peer (a newline must not forge a
            // log line).
            refuse(format!(
                "refused {:?} ({:?}): {}",
                hello.from_pod, hello.from_uid, why
            ))
        })?;
    send(stream, &Answer::Challenge(challenge))?;
    let peer = &exchange.initiator;
    let who = format!("{} ({})", peer.pod, peer.uid);
    let proof: Proof = match recv(stream, deadline, "proof").map_err(refuse)? {
        Response::Prove(p) => p,
        Response::Refuse(why) => return Err(format!("{who} turned this pod down: {why}")),
    };
    exchange
        .check_proof(us, &proof)
        .map_err(|why| refuse(format!("refused {who}: {why}")))?;
    let (conn, offer) = window.connect(proof.qp).map_err(|e| {
        refuse(format!(
            "this pod could not connect a queue pair to {who}: {e}"
        ))
    })?;
    let offer = exchange.sign(us, offer);
    send(stream, &Reply::Accept(offer.clone()))?;
    Ok((conn, exchange.initiator, offer))
}

/// Why an initiator's handshake failed: the owner (or the way to it) is not what the directory
/// says, or making this side's queue pair failed.
#[derive(Debug)]
pub enum Failed<E> {
    Owner(String),
    Local(E),
}

/// The initiator's side, toward the owner `to_pod` whose uid the directory names (`to_uid`):
/// hello, check the owner's challenge (refusing it to the owner when it fails), make a queue pair
/// with `make_qp` only then, prove (for that queue pair), and take the offer once it carries the
/// owner's proof for this exchange. Returns the queue pair, the offer and the
/// owner's uid. Without a uid there is no handshake: an owner that cannot be told from a replaced
/// one is never connected.
pub fn initiate<Q, E>(
    stream: &TcpStream,
    deadline: Instant,
    us: &Identity,
    to_pod: &str,
    to_uid: Option<&str>,
    make_qp: impl FnOnce() -> Result<(Q, QpAddress), E>,
) -> Result<(Q, Offer, String), Failed<E>> {
    let gone = Failed::Owner;
    let to_uid = to_uid.filter(|u| !u.is_empty());
    if to_uid.is_none() {
        return Err(gone(format!(
            "the directory names no uid for pod {to_pod} yet: not connecting to an owner it cannot identify"
        )));
    }
    let nonce = Nonce::fresh();
    let hello = wire::hello(us, to_pod, to_uid, &nonce);
    send(stream, &hello).map_err(gone)?;
    let challenge = match recv(stream, deadline, "challenge").map_err(gone)? {
        Answer::Challenge(c) => c,
        Answer::Refuse(why) => return Err(gone(format!("refused: {why}"))),
    };
    let exchange = wire::check_challenge(us, &hello, &nonce, &challenge).map_err(|why| {
        let _ = send(stream, &Response::Refuse(why.clone()));
        gone(why)
    })?;
    let (qp, address) = make_qp().map_err(Failed::Local)?;
    send(stream, &Response::Prove(exchange.prove(us, address))).map_err(gone)?;
    match recv(stream, deadline, "offer").map_err(gone)? {
        Reply::Accept(sealed) => {
            let offer = exchange.check_offer(us, &sealed).map_err(gone)?;
            Ok((qp, offer, challenge.uid))
        }
        Reply::Refuse(why) => Err(gone(format!("refused: {why}"))),
    }
}

/// Read one newline-terminated line of at most `max` bytes from `stream`, all of it before
/// `deadline`: a peer that sends a byte now and then cannot hold the reader past it. Each side of
/// the rendezvous sends its next line only once it has the other's answer, so what a read brings
/// after the newline is dropped.
pub(crate) fn read_line_by(
    mut stream: &TcpStream,
    deadline: Instant,
    max: usize,
) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timed_out = || {
            std::io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "no full line within the deadline ({} bytes came)",
                    line.len()
                ),
            )
        };
        if left.is_zero() {
            return Err(timed_out());
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out());
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end + 1);
            return String::from_utf8(line)
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e));
        }
        if line.len() > max {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("no newline in the first {max} bytes"),
            ));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::auth::tests::key;
    use crate::wire::tests::identity;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A connected pair over loopback: (what the test writes to, what `read_line_by` reads).
    pub(crate) fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// A window without an HCA: the "queue pair" is the peer's address, the offer fixed.
    pub(crate) struct FakeWindow;

    pub(crate) fn offer() -> Offer {
        Offer {
            qp: qp(9),
            base: 4096,
            size: 4096,
            addr: 0x7000,
            rkey: 42,
            proof: String::new(),
        }
    }

    pub(crate) fn qp(qpn: u32) -> QpAddress {
        QpAddress {
            gid: "::ffff:127.0.0.1".parse().unwrap(),
            qpn,
            psn: 1,
            mtu: Some(1024),
        }
    }

    impl Window for FakeWindow {
        type Conn = QpAddress;
        fn connect(&self, peer: QpAddress) -> Result<(QpAddress, Offer), String> {
            Ok((peer, offer()))
        }
    }

    /// What the initiator `i` and the owner `o` each end a handshake with, over loopback TCP.
    #[allow(clippy::type_complexity)]
    fn over_tcp(
        i: Identity,
        o: Identity,
        to_uid: Option<&str>,
    ) -> (
        Result<(u32, Offer, String), Failed<String>>,
        Option<Result<(QpAddress, Member, Offer), String>>,
    ) {
        let (client, server) = pair();
        let deadline = Instant::now() + Duration::from_secs(5);
        let owner = std::thread::spawn(move || {
            let directory = Directory::parse("d", crate::wire::tests::DIR).unwrap();
            respond(&server, deadline, &o, &directory, &FakeWindow)
        });
        let made = std::cell::Cell::new(false);
        let got = initiate(&client, deadline, &i, "b", to_uid, || {
            made.set(true);
            Ok::<_, String>((7u32, qp(7)))
        });
        if got.is_err() {
            assert!(!made.get(), "no queue pair before the owner proved itself");
        }
        drop(client);
        let owner = if to_uid.is_some() {
            Some(owner.join().unwrap())
        } else {
            None
        };
        (got, owner)
    }

    #[test]
    fn over_tcp_a_member_is_admitted_and_gets_the_offer() {
        let (got, owner) = over_tcp(
            identity("a", "ua", key(1)),
            identity("b", "ub", key(1)),
            Some("ub"),
        );
        let (q, o, uid) = got.unwrap();
        assert_eq!(o.proof.len(), 64, "signed for this exchange");
        let o = Offer {
            proof: String::new(),
            ..o
        };
        assert_eq!((q, o, uid.as_str()), (7, offer(), "ub"));
        let (conn, peer, _) = owner.unwrap().unwrap();
        assert_eq!(
            (conn.qpn, peer.pod.as_str(), peer.uid.as_str()),
            (7, "a", "ua")
        );
    }

    #[test]
    fn over_tcp_both_sides_are_told_why_a_handshake_fails() {
        // A stranger with a copied directory: refuses the owner, and the owner hears why.
        let (got, owner) = over_tcp(
            identity("a", "ua", key(9)),
            identity("b", "ub", key(1)),
            Some("ub"),
        );
        let Err(Failed::Owner(why)) = got else {
            panic!("{got:?}")
        };
        assert!(
            why.contains("did not prove holding the fabric key"),
            "{why}"
        );
        let why = owner.unwrap().unwrap_err();
        assert!(
            why.starts_with("a (ua) turned this pod down: pod b (ub) did not prove"),
            "{why}"
        );
        // An unknown pod: the owner refuses, the initiator hears why.
        let (got, owner) = over_tcp(
            identity("z", "uz", key(1)),
            identity("b", "ub", key(1)),
            Some("ub"),
        );
        let Err(Failed::Owner(why)) = got else {
            panic!("{got:?}")
        };
        assert!(
            why.contains(
                "refused: refused \"z\" (\"uz\"): pod \"z\" is not in this pod's directory"
            ),
            "{why}"
        );
        assert!(
            owner
                .unwrap()
                .unwrap_err()
                .contains("not in this pod's directory")
        );
        // The owner was replaced: same name and address, another uid.
        let (got, owner) = over_tcp(
            identity("a", "ua", key(1)),
            identity("b", "ub2", key(1)),
            Some("ub"),
        );
        let Err(Failed::Owner(why)) = got else {
            panic!("{got:?}")
        };
        assert!(why.contains("names uid ub, pod b is now uid ub2"), "{why}");
        assert!(owner.unwrap().is_err());
        // No uid in the initiator's directory: no handshake at all.
        let (got, _) = over_tcp(
            identity("a", "ua", key(1)),
            identity("b", "ub", key(1)),
            None,
        );
        let Err(Failed::Owner(why)) = got else {
            panic!("{got:?}")
        };
        assert!(why.contains("names no uid for pod b"), "{why}");
    }

    #[test]
    fn a_line_is_read_whole_and_only_up_to_its_newline() {
        let (mut peer, me) = pair();
        peer.write_all(b"{\"hello\":1}\nrest").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(read_line_by(&me, deadline, 64).unwrap(), "{\"hello\":1}\n");
    }

    #[test]
    fn a_peer_that_trickles_bytes_is_cut_off_at_the_deadline_not_per_read() {
        let (mut peer, me) = pair();
        let trickle = std::thread::spawn(move || {
            // One byte every 50 ms for 3 s: each read returns well within any per-read timeout.
            for _ in 0..60 {
                if peer.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let e = read_line_by(&me, started + Duration::from_millis(400), 4096).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(
            e.to_string().contains("no full line within the deadline"),
            "{e}"
        );
        assert!(took < Duration::from_millis(1500), "took {took:?}");
        drop(me);
        trickle.join().unwrap();
    }

    #[test]
    fn a_line_without_newline_is_refused_past_the_limit_and_a_close_is_an_error() {
        let (mut peer, me) = pair();
        peer.write_all(&[b'x'; 600]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = read_line_by(&me, deadline, 100).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        let (peer, me) = pair();
        drop(peer);
        let e = read_line_by(&me, deadline, 100).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{e}");
    }
}
