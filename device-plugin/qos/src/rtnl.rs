//! rtnetlink for the MTU: `RTM_GETLINK` by name (`IFLA_IFNAME`) and `RTM_NEWLINK` with
//! `IFLA_MTU` on the interface index, encoded here against `struct ifinfomsg` (16 bytes).

use super::netlink::{
    self, Malformed, MessageBuilder, NLM_F_ACK, NLM_F_REQUEST, NetlinkError, Transport, find_attr,
    parse_attrs, parse_messages, read_i32,
};

/// `RTM_NEWLINK`.
pub const RTM_NEWLINK: u16 = 16;
/// `RTM_GETLINK`.
pub const RTM_GETLINK: u16 = 18;
/// `IFLA_IFNAME`.
pub const IFLA_IFNAME: u16 = 3;
/// `IFLA_MTU` (u32).
pub const IFLA_MTU: u16 = 4;
/// `IFLA_OPERSTATE` (u8, RFC 2863 state).
pub const IFLA_OPERSTATE: u16 = 16;
/// `sizeof(struct ifinfomsg)`.
pub const IFINFOMSG_LEN: usize = 16;

/// What `RTM_GETLINK` tells about one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: i32,
    pub name: String,
    pub mtu: u32,
    /// `IF_OPER_*`: 6 is up, 2 down.
    pub operstate: Option<u8>,
}

/// `struct ifinfomsg { u8 family; u8 pad; u16 type; i32 index; u32 flags; u32 change; }`.
pub fn ifinfomsg(index: i32) -> [u8; IFINFOMSG_LEN] {
    let mut b = [0u8; IFINFOMSG_LEN];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// `RTM_GETLINK` for the interface called `ifname`.
pub fn encode_get_link(ifname: &str, seq: u32) -> Vec<u8> {
    let mut name = ifname.as_bytes().to_vec();
    name.push(0);
    MessageBuilder::new(RTM_GETLINK, NLM_F_REQUEST, seq)
        .header(&ifinfomsg(0))
        .attr(IFLA_IFNAME, &name)
        .finish()
}

/// `RTM_NEWLINK` changing only the MTU of interface `index`, acknowledged.
pub fn encode_set_mtu(index: i32, mtu: u32, seq: u32) -> Vec<u8> {
    MessageBuilder::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq)
        .header(&ifinfomsg(index))
        .attr(IFLA_MTU, &mtu.to_ne_bytes())
        .finish()
}

/// Decode the `RTM_NEWLINK` answer to a `RTM_GETLINK`.
pub fn decode_link(msg: &[u8]) -> Result<LinkInfo, Malformed> {
    let messages = parse_messages(msg)?;
    let m = messages
        .iter()
        .find(|m| m.msg_type == RTM_NEWLINK)
        .ok_or_else(|| Malformed("no RTM_NEWLINK in the reply".into()))?;
    if m.payload.len() < IFINFOMSG_LEN {
        return Err(Malformed(
            "RTM_NEWLINK shorter than struct ifinfomsg".into(),
        ));
    }
    let index = read_i32(m.payload, 4).unwrap_or(0);
    let attrs = parse_attrs(&m.payload[IFINFOMSG_LEN..])?;
    let name = find_attr(&attrs, IFLA_IFNAME)
        .map(|a| a.string())
        .transpose()?
        .unwrap_or_default();
    let mtu = find_attr(&attrs, IFLA_MTU)
        .ok_or_else(|| Malformed(format!("link {name} without IFLA_MTU")))?
        .u32()?;
    let operstate = find_attr(&attrs, IFLA_OPERSTATE)
        .map(|a| a.u8())
        .transpose()?;
    Ok(LinkInfo {
        index,
        name,
        mtu,
        operstate,
    })
}

/// A failed rtnetlink request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rtnetlink {op} on {ifname}: {source}")]
pub struct LinkError {
    pub op: &'static str,
    pub ifname: String,
    #[source]
    pub source: NetlinkError,
}

/// Link operations the QoS agent uses.
pub trait LinkOps {
    fn get_link(&mut self, ifname: &str) -> Result<LinkInfo, LinkError>;
    fn set_mtu(&mut self, ifname: &str, mtu: u32) -> Result<(), LinkError>;
}

/// [`LinkOps`] over a netlink transport.
#[derive(Debug)]
pub struct Rtnl<T> {
    transport: T,
    seq: u32,
}

impl<T: Transport> Rtnl<T> {
    pub fn new(transport: T) -> Self {
        // Start far from Dcbnl's sequence numbers so a shared socket never confuses answers.
        Self {
            transport,
            seq: 0x4000_0000,
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }
}

impl<T: Transport> LinkOps for Rtnl<T> {
    fn get_link(&mut self, ifname: &str) -> Result<LinkInfo, LinkError> {
        let seq = self.next_seq();
        let err = |source| LinkError {
            op: "GETLINK",
            ifname: ifname.to_string(),
            source,
        };
        let replies = netlink::exchange(&mut self.transport, seq, &encode_get_link(ifname, seq))
            .map_err(err)?;
        let reply = replies.first().ok_or_else(|| {
            err(NetlinkError::Malformed(Malformed(
                "no reply to GETLINK".into(),
            )))
        })?;
        decode_link(reply).map_err(|e| err(e.into()))
    }

    fn set_mtu(&mut self, ifname: &str, mtu: u32) -> Result<(), LinkError> {
        let link = self.get_link(ifname)?;
        let seq = self.next_seq();
        netlink::exchange(
            &mut self.transport,
            seq,
            &encode_set_mtu(link.index, mtu, seq),
        )
        .map(|_| ())
        .map_err(|source| LinkError {
            op: "NEWLINK mtu",
            ifname: ifname.to_string(),
            source,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use crate::netlink::{errno, error_reply};
    use std::collections::VecDeque;
    use std::io;

    fn newlink_reply(seq: u32, index: i32, name: &str, mtu: u32) -> Vec<u8> {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        MessageBuilder::new(RTM_NEWLINK, 0, seq)
            .header(&ifinfomsg(index))
            .attr(IFLA_IFNAME, &n)
            .attr(IFLA_MTU, &mtu.to_ne_bytes())
            .attr(IFLA_OPERSTATE, &[6])
            .finish()
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn get_link_request_bytes_are_exact() {
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            44, 0, 0, 0,  18, 0,  1, 0,  3, 0, 0, 0,  0, 0, 0, 0,       // nlmsghdr: RTM_GETLINK, REQUEST, seq 3
            0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,          // ifinfomsg, index 0
            10, 0, 3, 0,  b'v', b'e', b't', b'h', b'0', 0, 0, 0,        // IFLA_IFNAME
        ];
        assert_eq!(encode_get_link("veth0", 3), expected);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn set_mtu_request_bytes_are_exact() {
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            40, 0, 0, 0,  16, 0,  5, 0,  4, 0, 0, 0,  0, 0, 0, 0,       // RTM_NEWLINK, REQUEST|ACK, seq 4
            0, 0, 0, 0,  7, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,          // ifinfomsg, index 7
            8, 0, 4, 0,  0x68, 0x10, 0, 0,                              // IFLA_MTU 4200
        ];
        assert_eq!(encode_set_mtu(7, 4200, 4), expected);
    }

    #[test]
    fn link_reply_decodes() {
        let link = decode_link(&newlink_reply(1, 7, "veth0", 1500)).unwrap();
        assert_eq!(
            link,
            LinkInfo {
                index: 7,
                name: "veth0".into(),
                mtu: 1500,
                operstate: Some(6)
            }
        );
    }

    struct FakeLinks {
        mtu: u32,
        script: VecDeque<&'static str>,
    }

    impl Transport for FakeLinks {
        fn request(&mut self, seq: u32, request: &[u8]) -> io::Result<Vec<Vec<u8>>> {
            let step = self.script.pop_front().expect("an expected request");
            let m = parse_messages(request).unwrap();
            match step {
                "get" => {
                    assert_eq!(m[0].msg_type, RTM_GETLINK);
                    Ok(vec![newlink_reply(seq, 7, "eth2", self.mtu)])
                }
                "set" => {
                    assert_eq!(m[0].msg_type, RTM_NEWLINK);
                    assert_eq!(read_i32(m[0].payload, 4), Some(7), "set by index");
                    let attrs = parse_attrs(&m[0].payload[IFINFOMSG_LEN..]).unwrap();
                    self.mtu = find_attr(&attrs, IFLA_MTU).unwrap().u32().unwrap();
                    Ok(vec![error_reply(request, 0)])
                }
                "enodev" => Ok(vec![error_reply(request, errno::ENODEV)]),
                other => panic!("unknown step {other}"),
            }
        }
    }

    #[test]
    fn set_mtu_looks_up_the_index_then_sets_and_acks() {
        let mut rtnl = Rtnl::new(FakeLinks {
            mtu: 1500,
            script: VecDeque::from(["get", "set", "get"]),
        });
        rtnl.set_mtu("eth2", 4200).unwrap();
        assert_eq!(rtnl.get_link("eth2").unwrap().mtu, 4200);
    }

    #[test]
    fn missing_interface_is_enodev() {
        let mut rtnl = Rtnl::new(FakeLinks {
            mtu: 0,
            script: VecDeque::from(["enodev"]),
        });
        let err = rtnl.get_link("nope0").unwrap_err();
        assert_eq!(err.source, NetlinkError::Errno(errno::ENODEV));
        assert!(err.to_string().contains("GETLINK on nope0"), "{err}");
    }
}
