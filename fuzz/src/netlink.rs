//! Netlink replies from the kernel: framing, DCB netlink, rtnetlink. Raw bytes in.

use std::io;

use rocefabric_qos_agent::dcbnl::{
    self, DCB_CMD_IEEE_DEL, DCB_CMD_IEEE_GET, DCB_CMD_IEEE_SET, DcbOps, Dcbnl,
    decode_ieee_get_reply, decode_set_reply,
};
use rocefabric_qos_agent::model::{DcbApp, IeeePfc};
use rocefabric_qos_agent::netlink::{
    Attr, MessageBuilder, NLA_F_NESTED, NLA_HDRLEN, NLMSG_HDRLEN, Transport, align4, errno_name,
    exchange, parse_attrs, parse_messages,
};
use rocefabric_qos_agent::rtnl::{
    IFLA_IFNAME, IFLA_MTU, IFLA_OPERSTATE, LinkOps, RTM_NEWLINK, Rtnl, decode_link, ifinfomsg,
};

/// A kernel that answers every request with the input: one datagram, or several where the input
/// holds `NLMSG_DONE`-free concatenations (the framing splits them again).
struct Replay<'a>(&'a [u8]);

impl Transport for Replay<'_> {
    fn request(&mut self, _seq: u32, _request: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        Ok(vec![self.0.to_vec()])
    }
}

/// Each message's header and payload are the bytes they were read from, in order, with only
/// alignment padding between them, up to the end of the datagram.
fn check_messages(buf: &[u8]) {
    let Ok(messages) = parse_messages(buf) else {
        return;
    };
    assert!(messages.len() <= buf.len() / NLMSG_HDRLEN);
    let mut at = 0usize;
    for m in &messages {
        let len = NLMSG_HDRLEN + m.payload.len();
        let raw = &buf[at..at + len];
        assert_eq!(raw[0..4], (len as u32).to_ne_bytes(), "nlmsg_len");
        assert_eq!(raw[4..6], m.msg_type.to_ne_bytes());
        assert_eq!(raw[6..8], m.flags.to_ne_bytes());
        assert_eq!(raw[8..12], m.seq.to_ne_bytes());
        assert_eq!(raw[12..16], m.pid.to_ne_bytes());
        assert_eq!(&raw[16..], m.payload);
        let _ = m.error_code();
        at = align4(at + len).min(buf.len());
    }
    assert_eq!(at, buf.len(), "bytes left over after a successful parse");
}

/// Attributes (nested up to `depth`) rebuild to bytes that parse to the same attributes.
fn check_attrs(buf: &[u8], depth: u32) {
    let Ok(attrs) = parse_attrs(buf) else {
        return;
    };
    assert!(attrs.len() <= buf.len() / NLA_HDRLEN);
    let mut b = MessageBuilder::new(0, 0, 0);
    for a in &attrs {
        let kind = a.kind | if a.nested_flag { NLA_F_NESTED } else { 0 };
        b = b.attr(kind, a.payload);
        let _ = (a.u8(), a.u32(), a.string());
        if let Ok(s) = a.string() {
            assert!(!s.contains('\0'));
        }
        if depth > 0 {
            check_attrs(a.payload, depth - 1);
        }
    }
    let msg = b.finish();
    let messages = parse_messages(&msg).unwrap_or_else(|e| panic!("own message: {e}"));
    let again: Vec<Attr<'_>> =
        parse_attrs(messages[0].payload).unwrap_or_else(|e| panic!("own attributes: {e}"));
    assert_eq!(again, attrs, "attributes changed by a rebuild");
}

/// Framing: `parse_messages`, `parse_attrs` (nested), the attribute accessors, `exchange`.
pub fn netlink(data: &[u8]) {
    check_messages(data);
    check_attrs(data, 4);
    if let Ok(messages) = parse_messages(data) {
        for m in &messages {
            check_attrs(m.payload, 4);
            // Family headers are 4 (dcbmsg) or 16 (ifinfomsg) bytes.
            for skip in [4, 16] {
                if let Some(rest) = m.payload.get(skip..) {
                    check_attrs(rest, 4);
                }
            }
        }
    }
    let mut kernel = Replay(data);
    if let Ok(replies) = exchange(&mut kernel, 1, &[]) {
        for r in &replies {
            assert!(
                parse_messages(r).is_ok(),
                "exchange kept an unparsable reply"
            );
        }
    }
    if let Some(code) = data.get(..4) {
        let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
        assert!(!errno_name(code).is_empty());
    }
}

/// DCB netlink replies, and the DCB operations over a kernel that answers with the input.
pub fn dcbnl(data: &[u8]) {
    if let Ok(state) = decode_ieee_get_reply(data) {
        assert!(
            state.app.len() <= data.len() / 8,
            "{} APP entries",
            state.app.len()
        );
    }
    for cmd in [DCB_CMD_IEEE_SET, DCB_CMD_IEEE_DEL, DCB_CMD_IEEE_GET] {
        if let Ok(code) = decode_set_reply(data, cmd) {
            assert!((-127..=128).contains(&code), "errno {code} from one byte");
        }
    }
    if let Ok(pfc) = IeeePfc::decode(data) {
        let mut expected = [0u8; IeeePfc::SIZE];
        expected.copy_from_slice(&data[..IeeePfc::SIZE]);
        for pad in [3, 6, 7] {
            expected[pad] = 0;
        }
        assert_eq!(pfc.encode(), expected, "ieee_pfc round trip");
        assert!(pfc.enabled_priorities().iter().all(|p| *p < 8));
    }
    if let Ok(app) = DcbApp::decode(data) {
        assert_eq!(app.encode()[..], data[..DcbApp::SIZE], "dcb_app round trip");
    }
    if let Some(b) = data.first() {
        assert!(!dcbnl::dcbx::describe(*b).is_empty());
    }
    let ifname = "eth0";
    let mut dcb = Dcbnl::new(Replay(data));
    let names = |e: &dyn std::fmt::Display| {
        let s = e.to_string();
        assert!(s.contains(ifname), "error does not name the interface: {s}");
    };
    if let Err(e) = dcb.ieee_get(ifname) {
        names(&e);
    }
    if let Err(e) = dcb.set_pfc(ifname, &IeeePfc::default()) {
        names(&e);
    }
    if let Err(e) = dcb.add_apps(ifname, &[DcbApp::dscp(26, 3)]) {
        names(&e);
    }
    if let Err(e) = dcb.del_apps(ifname, &[DcbApp::dscp(26, 3)]) {
        names(&e);
    }
}

/// `RTM_NEWLINK` replies: what decodes re-encodes to a reply that decodes the same.
pub fn rtnl(data: &[u8]) {
    if let Ok(link) = decode_link(data) {
        let mut name = link.name.as_bytes().to_vec();
        name.push(0);
        let mut b = MessageBuilder::new(RTM_NEWLINK, 0, 1)
            .header(&ifinfomsg(link.index))
            .attr(IFLA_IFNAME, &name)
            .attr(IFLA_MTU, &link.mtu.to_ne_bytes());
        if let Some(state) = link.operstate {
            b = b.attr(IFLA_OPERSTATE, &[state]);
        }
        let again = decode_link(&b.finish());
        assert_eq!(again.as_ref(), Ok(&link), "link reply round trip");
    }
    let mut rtnl = Rtnl::new(Replay(data));
    for result in [rtnl.get_link("eth0").map(drop), rtnl.set_mtu("eth0", 4200)] {
        if let Err(e) = result {
            assert!(e.to_string().contains("eth0"), "{e}");
        }
    }
}
