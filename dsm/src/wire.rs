//! The rendezvous protocol (pure): one JSON line each way over TCP on the pod IP, the way NCCL
//! bootstraps. The initiator says who it is and whom it expects; the owner checks that it is that
//! pod (same uid) and answers with what a one-sided peer needs: the GID of its granted HCA port,
//! the queue pair it created for this peer, and where its window is registered (address, rkey).
//! The TCP stream stays open for the life of the RDMA connection: when either side closes it, the
//! other destroys its queue pair.

use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

/// Protocol version; a peer speaking another is refused.
pub const VERSION: u32 = 1;

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

/// Initiator to owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    pub version: u32,
    pub fabric: String,
    /// The initiating pod and its uid (for the owner's logs and metrics).
    pub from_pod: String,
    pub from_uid: String,
    /// The window owner the initiator's directory names; the owner refuses when it is not.
    pub to_pod: String,
    pub to_uid: Option<String>,
    pub qp: QpAddress,
}

/// Owner to initiator.
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
    pub pod: String,
    pub uid: String,
    pub qp: QpAddress,
    /// The window in the fabric's address space.
    pub base: u64,
    pub size: u64,
    /// Where the window is registered in the owner's process, and its remote key.
    pub addr: u64,
    pub rkey: u32,
}

/// Why the owner turns a hello down, or `None` to accept. `me` is the owner's (pod, uid, fabric).
pub fn check_hello(hello: &Hello, pod: &str, uid: &str, fabric: &str) -> Option<String> {
    if hello.version != VERSION {
        return Some(format!(
            "protocol version {} (this pod speaks {VERSION})",
            hello.version
        ));
    }
    if hello.fabric != fabric {
        return Some(format!(
            "fabric {:?} (this pod is in {fabric:?})",
            hello.fabric
        ));
    }
    if hello.to_pod != pod {
        return Some(format!("asked for pod {:?}, this is {pod:?}", hello.to_pod));
    }
    match hello.to_uid.as_deref() {
        Some(u) if u != uid => Some(format!(
            "the directory names uid {u}, pod {pod} is now uid {uid} (the window's pod was replaced)"
        )),
        _ => None,
    }
}

/// One line of JSON, newline-terminated.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut line =
        serde_json::to_vec(msg).unwrap_or_else(|_| unreachable!("plain structs serialize"));
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(to_uid: Option<&str>) -> Hello {
        Hello {
            version: VERSION,
            fabric: "f".into(),
            from_pod: "a".into(),
            from_uid: "ua".into(),
            to_pod: "b".into(),
            to_uid: to_uid.map(String::from),
            qp: QpAddress {
                gid: "::ffff:10.0.0.1".parse().unwrap(),
                qpn: 17,
                psn: 5,
                mtu: Some(1024),
            },
        }
    }

    #[test]
    fn both_ends_use_the_smaller_path_mtu() {
        assert_eq!(path_mtu(4096, Some(1024)), 1024);
        assert_eq!(path_mtu(1024, Some(4096)), 1024);
        assert_eq!(path_mtu(2048, None), 2048, "an older peer: our own");
        let json = serde_json::to_string(&hello(None).qp).unwrap();
        assert!(json.contains("\"mtu\":1024"), "{json}");
        let old: QpAddress =
            serde_json::from_str(r#"{"gid":"::ffff:10.0.0.1","qpn":1,"psn":2}"#).unwrap();
        assert_eq!(old.mtu, None);
    }

    #[test]
    fn the_owner_refuses_a_peer_whose_directory_names_another_pod_or_uid() {
        assert_eq!(check_hello(&hello(Some("ub")), "b", "ub", "f"), None);
        assert_eq!(check_hello(&hello(None), "b", "ub", "f"), None);
        let why = check_hello(&hello(Some("old")), "b", "new", "f").unwrap();
        assert!(
            why.contains("uid old") && why.contains("now uid new"),
            "{why}"
        );
        assert!(
            check_hello(&hello(Some("ub")), "c", "ub", "f")
                .unwrap()
                .contains("asked for pod")
        );
        assert!(
            check_hello(&hello(Some("ub")), "b", "ub", "g")
                .unwrap()
                .contains("fabric")
        );
        let mut h = hello(None);
        h.version = 9;
        assert!(
            check_hello(&h, "b", "ub", "f")
                .unwrap()
                .contains("version 9")
        );
    }

    #[test]
    fn messages_are_one_json_line_each() {
        let line = encode(&hello(Some("ub")));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let back: Hello = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, hello(Some("ub")));
        let r = Reply::Refuse("no".into());
        assert_eq!(
            String::from_utf8(encode(&r)).unwrap(),
            "{\"refuse\":\"no\"}\n"
        );
    }
}
