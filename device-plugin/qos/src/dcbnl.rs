//! DCB netlink (DCBNL), spoken directly: `RTM_GETDCB`/`RTM_SETDCB` with `struct dcbmsg`, the
//! IEEE 802.1Qaz PFC (`struct ieee_pfc`, 136 bytes) and APP table (`struct dcb_app`, 4 bytes),
//! encoded and decoded here against the kernel layouts of `include/uapi/linux/dcbnl.h`.
//!
//! [`DcbOps`] is the small interface the apply step uses; [`Dcbnl`] implements it over any
//! netlink [`Transport`] (a real socket, or a fake kernel in tests).

use super::model::{DcbApp, IeeePfc, MAX_PRIORITIES};
use super::netlink::{
    self, Attr, Malformed, MessageBuilder, NLM_F_REQUEST, NetlinkError, Transport, errno,
    find_attr, parse_attrs, parse_messages, read_u16, read_u64,
};

/// `RTM_GETDCB`.
pub const RTM_GETDCB: u16 = 78;
/// `RTM_SETDCB`.
pub const RTM_SETDCB: u16 = 79;

/// `DCB_CMD_IEEE_SET`.
pub const DCB_CMD_IEEE_SET: u8 = 20;
/// `DCB_CMD_IEEE_GET`.
pub const DCB_CMD_IEEE_GET: u8 = 21;
/// `DCB_CMD_GDCBX`.
pub const DCB_CMD_GDCBX: u8 = 22;
/// `DCB_CMD_IEEE_DEL`.
pub const DCB_CMD_IEEE_DEL: u8 = 27;

/// `DCB_ATTR_IFNAME` (NUL-terminated string).
pub const DCB_ATTR_IFNAME: u16 = 1;
/// `DCB_ATTR_IEEE` (nested; a u8 errno in IEEE_SET/IEEE_DEL replies).
pub const DCB_ATTR_IEEE: u16 = 13;
/// `DCB_ATTR_DCBX` (u8 mode flags).
pub const DCB_ATTR_DCBX: u16 = 14;

/// `DCB_ATTR_IEEE_ETS`.
pub const DCB_ATTR_IEEE_ETS: u16 = 1;
/// `DCB_ATTR_IEEE_PFC`.
pub const DCB_ATTR_IEEE_PFC: u16 = 2;
/// `DCB_ATTR_IEEE_APP_TABLE` (nested).
pub const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;
/// `DCB_ATTR_IEEE_APP`, one entry inside the APP table.
pub const DCB_ATTR_IEEE_APP: u16 = 1;

/// DCBX mode flags (`DCB_CAP_DCBX_*`).
pub mod dcbx {
    pub const HOST: u8 = 0x01;
    pub const LLD_MANAGED: u8 = 0x02;
    pub const VER_CEE: u8 = 0x04;
    pub const VER_IEEE: u8 = 0x08;
    pub const STATIC: u8 = 0x10;

    /// `host,ieee` style text of a mode byte.
    pub fn describe(mode: u8) -> String {
        let names = [
            (HOST, "host"),
            (LLD_MANAGED, "lld-managed"),
            (VER_CEE, "cee"),
            (VER_IEEE, "ieee"),
            (STATIC, "static"),
        ];
        let parts: Vec<&str> = names
            .iter()
            .filter(|(b, _)| mode & b != 0)
            .map(|(_, n)| *n)
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(",")
        }
    }
}

/// `struct ieee_pfc`: 136 bytes, host byte order.
///
/// ```text
/// @0 u8 pfc_cap  @1 u8 pfc_en  @2 u8 mbc  @3 pad  @4 u16 delay  @6 pad[2]
/// @8 u64 requests[8]  @72 u64 indications[8]
/// ```
impl IeeePfc {
    /// `sizeof(struct ieee_pfc)`.
    pub const SIZE: usize = 136;
    const REQUESTS_AT: usize = 8;
    const INDICATIONS_AT: usize = 72;

    /// The kernel struct's bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.pfc_cap;
        b[1] = self.pfc_en;
        b[2] = self.mbc;
        b[4..6].copy_from_slice(&self.delay.to_ne_bytes());
        for i in 0..MAX_PRIORITIES {
            let r = Self::REQUESTS_AT + 8 * i;
            b[r..r + 8].copy_from_slice(&self.requests[i].to_ne_bytes());
            let d = Self::INDICATIONS_AT + 8 * i;
            b[d..d + 8].copy_from_slice(&self.indications[i].to_ne_bytes());
        }
        b
    }

    /// Parse the kernel struct (extra trailing bytes from a newer kernel are ignored).
    pub fn decode(b: &[u8]) -> Result<Self, Malformed> {
        if b.len() < Self::SIZE {
            return Err(Malformed(format!(
                "ieee_pfc is {} bytes, expected {}",
                b.len(),
                Self::SIZE
            )));
        }
        let mut pfc = IeeePfc {
            pfc_cap: b[0],
            pfc_en: b[1],
            mbc: b[2],
            delay: read_u16(b, 4).unwrap_or(0),
            ..Default::default()
        };
        for i in 0..MAX_PRIORITIES {
            pfc.requests[i] = read_u64(b, Self::REQUESTS_AT + 8 * i).unwrap_or(0);
            pfc.indications[i] = read_u64(b, Self::INDICATIONS_AT + 8 * i).unwrap_or(0);
        }
        Ok(pfc)
    }
}

/// `struct dcb_app`: selector u8, priority u8, protocol u16 (host order). 4 bytes.
impl DcbApp {
    /// `sizeof(struct dcb_app)`.
    pub const SIZE: usize = 4;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let p = self.protocol.to_ne_bytes();
        [self.selector, self.priority, p[0], p[1]]
    }

    pub fn decode(b: &[u8]) -> Result<Self, Malformed> {
        if b.len() < Self::SIZE {
            return Err(Malformed(format!(
                "dcb_app is {} bytes, expected {}",
                b.len(),
                Self::SIZE
            )));
        }
        Ok(Self {
            selector: b[0],
            priority: b[1],
            protocol: read_u16(b, 2).unwrap_or(0),
        })
    }
}

/// What `DCB_CMD_IEEE_GET` reports for a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IeeeState {
    /// `None` when the driver has no `ieee_getpfc`.
    pub pfc: Option<IeeePfc>,
    /// The APP table (every selector).
    pub app: Vec<DcbApp>,
    /// DCBX mode flags, when the driver reports them.
    pub dcbx: Option<u8>,
}

/// `struct dcbmsg { u8 dcb_family; u8 cmd; u16 dcb_pad; }` with `AF_UNSPEC`.
pub fn dcbmsg(cmd: u8) -> [u8; 4] {
    [0, cmd, 0, 0]
}

fn ifname_attr(ifname: &str) -> Vec<u8> {
    let mut v = ifname.as_bytes().to_vec();
    v.push(0);
    v
}

/// `RTM_GETDCB` / `DCB_CMD_IEEE_GET` for `ifname`.
pub fn encode_ieee_get(ifname: &str, seq: u32) -> Vec<u8> {
    MessageBuilder::new(RTM_GETDCB, NLM_F_REQUEST, seq)
        .header(&dcbmsg(DCB_CMD_IEEE_GET))
        .attr(DCB_ATTR_IFNAME, &ifname_attr(ifname))
        .finish()
}

/// `RTM_SETDCB` / `DCB_CMD_IEEE_SET` with `DCB_ATTR_IEEE { DCB_ATTR_IEEE_PFC }`.
pub fn encode_set_pfc(ifname: &str, pfc: &IeeePfc, seq: u32) -> Vec<u8> {
    MessageBuilder::new(RTM_SETDCB, NLM_F_REQUEST, seq)
        .header(&dcbmsg(DCB_CMD_IEEE_SET))
        .attr(DCB_ATTR_IFNAME, &ifname_attr(ifname))
        .begin_nest(DCB_ATTR_IEEE)
        .attr(DCB_ATTR_IEEE_PFC, &pfc.encode())
        .end_nest()
        .finish()
}

/// `RTM_SETDCB` / `DCB_CMD_IEEE_SET` (add) or `DCB_CMD_IEEE_DEL` (delete) of APP entries, as
/// `DCB_ATTR_IEEE { DCB_ATTR_IEEE_APP_TABLE { DCB_ATTR_IEEE_APP, ... } }`.
pub fn encode_app(cmd: u8, ifname: &str, apps: &[DcbApp], seq: u32) -> Vec<u8> {
    let mut b = MessageBuilder::new(RTM_SETDCB, NLM_F_REQUEST, seq)
        .header(&dcbmsg(cmd))
        .attr(DCB_ATTR_IFNAME, &ifname_attr(ifname))
        .begin_nest(DCB_ATTR_IEEE)
        .begin_nest(DCB_ATTR_IEEE_APP_TABLE);
    for app in apps {
        b = b.attr(DCB_ATTR_IEEE_APP, &app.encode());
    }
    b.end_nest().end_nest().finish()
}

/// The attributes after `struct dcbmsg` in one DCB message, with the command it carries.
fn dcb_payload<'a>(msg: &'a [u8], want_type: u16) -> Result<(u8, Vec<Attr<'a>>), Malformed> {
    let messages = parse_messages(msg)?;
    let m = messages
        .into_iter()
        .find(|m| m.msg_type == want_type)
        .ok_or_else(|| Malformed(format!("no message of type {want_type} in the reply")))?;
    if m.payload.len() < 4 {
        return Err(Malformed("DCB message shorter than struct dcbmsg".into()));
    }
    Ok((m.payload[1], parse_attrs(&m.payload[4..])?))
}

/// Decode a `DCB_CMD_IEEE_GET` reply.
pub fn decode_ieee_get_reply(msg: &[u8]) -> Result<IeeeState, Malformed> {
    let (cmd, attrs) = dcb_payload(msg, RTM_GETDCB)?;
    if cmd != DCB_CMD_IEEE_GET {
        return Err(Malformed(format!(
            "expected an IEEE_GET reply, got DCB command {cmd}"
        )));
    }
    let mut state = IeeeState {
        dcbx: find_attr(&attrs, DCB_ATTR_DCBX).map(Attr::u8).transpose()?,
        ..Default::default()
    };
    if let Some(ieee) = find_attr(&attrs, DCB_ATTR_IEEE) {
        for a in ieee.nested()? {
            match a.kind {
                DCB_ATTR_IEEE_PFC => state.pfc = Some(IeeePfc::decode(a.payload)?),
                DCB_ATTR_IEEE_APP_TABLE => {
                    for entry in a.nested()? {
                        // DCB_ATTR_IEEE_APP and (kernel >= 6.5) DCB_ATTR_DCB_APP share the layout.
                        state.app.push(DcbApp::decode(entry.payload)?);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(state)
}

/// Decode an `IEEE_SET`/`IEEE_DEL` reply: `DCB_ATTR_IEEE` is a u8 holding a negative errno as
/// `i8`; returns the errno as a positive number, 0 for success.
pub fn decode_set_reply(msg: &[u8], cmd: u8) -> Result<i32, Malformed> {
    let (got, attrs) = dcb_payload(msg, RTM_SETDCB)?;
    if got != cmd {
        return Err(Malformed(format!(
            "expected a reply to DCB command {cmd}, got {got}"
        )));
    }
    let status = find_attr(&attrs, DCB_ATTR_IEEE)
        .ok_or_else(|| Malformed("set reply without DCB_ATTR_IEEE status".into()))?
        .u8()?;
    Ok(-i32::from(status as i8))
}

/// A failed DCB request, naming the operation and the interface.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DCB netlink {op} on {ifname}: {source}")]
pub struct DcbError {
    pub op: &'static str,
    pub ifname: String,
    #[source]
    pub source: NetlinkError,
}

impl DcbError {
    /// The device or driver has no such DCB operation (`EOPNOTSUPP`).
    pub fn is_unsupported(&self) -> bool {
        self.source.errno() == Some(errno::EOPNOTSUPP)
    }
}

/// DCB operations the QoS agent uses.
pub trait DcbOps {
    /// `DCB_CMD_IEEE_GET`: PFC, APP table, DCBX mode.
    fn ieee_get(&mut self, ifname: &str) -> Result<IeeeState, DcbError>;
    /// `DCB_CMD_IEEE_SET` of the PFC struct.
    fn set_pfc(&mut self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError>;
    /// `DCB_CMD_IEEE_SET` of APP entries (adds).
    fn add_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError>;
    /// `DCB_CMD_IEEE_DEL` of APP entries.
    fn del_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError>;
}

/// [`DcbOps`] over a netlink transport.
#[derive(Debug)]
pub struct Dcbnl<T> {
    transport: T,
    seq: u32,
}

impl<T: Transport> Dcbnl<T> {
    pub fn new(transport: T) -> Self {
        Self { transport, seq: 0 }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn set(
        &mut self,
        op: &'static str,
        ifname: &str,
        cmd: u8,
        msg: Vec<u8>,
        seq: u32,
    ) -> Result<(), DcbError> {
        let err = |source| DcbError {
            op,
            ifname: ifname.to_string(),
            source,
        };
        let replies = netlink::exchange(&mut self.transport, seq, &msg).map_err(err)?;
        let reply = replies.first().ok_or_else(|| {
            err(NetlinkError::Malformed(Malformed(
                "no reply to a DCB set".into(),
            )))
        })?;
        match decode_set_reply(reply, cmd).map_err(|e| err(e.into()))? {
            0 => Ok(()),
            code => Err(err(NetlinkError::Errno(code))),
        }
    }
}

impl<T: Transport> DcbOps for Dcbnl<T> {
    fn ieee_get(&mut self, ifname: &str) -> Result<IeeeState, DcbError> {
        let seq = self.next_seq();
        let err = |source| DcbError {
            op: "IEEE_GET",
            ifname: ifname.to_string(),
            source,
        };
        let replies = netlink::exchange(&mut self.transport, seq, &encode_ieee_get(ifname, seq))
            .map_err(err)?;
        let reply = replies.first().ok_or_else(|| {
            err(NetlinkError::Malformed(Malformed(
                "no reply to IEEE_GET".into(),
            )))
        })?;
        decode_ieee_get_reply(reply).map_err(|e| err(e.into()))
    }

    fn set_pfc(&mut self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
        let seq = self.next_seq();
        let msg = encode_set_pfc(ifname, pfc, seq);
        self.set("IEEE_SET pfc", ifname, DCB_CMD_IEEE_SET, msg, seq)
    }

    fn add_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        let seq = self.next_seq();
        let msg = encode_app(DCB_CMD_IEEE_SET, ifname, apps, seq);
        self.set("IEEE_SET app", ifname, DCB_CMD_IEEE_SET, msg, seq)
    }

    fn del_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        let seq = self.next_seq();
        let msg = encode_app(DCB_CMD_IEEE_DEL, ifname, apps, seq);
        self.set("IEEE_DEL app", ifname, DCB_CMD_IEEE_DEL, msg, seq)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
pub(crate) mod tests {
    use super::*;
    use crate::netlink::{NLMSG_HDRLEN, error_reply, read_u32};
    use std::collections::VecDeque;
    use std::io;

    /// The IEEE_GET reply the kernel's `dcbnl_ieee_fill` builds: IFNAME, IEEE { PFC, APP_TABLE },
    /// DCBX.
    pub(crate) fn ieee_get_reply(
        seq: u32,
        ifname: &str,
        pfc: Option<&IeeePfc>,
        apps: &[DcbApp],
        dcbx: u8,
    ) -> Vec<u8> {
        let mut b = MessageBuilder::new(RTM_GETDCB, 0, seq)
            .header(&dcbmsg(DCB_CMD_IEEE_GET))
            .attr(DCB_ATTR_IFNAME, &ifname_attr(ifname))
            .begin_nest(DCB_ATTR_IEEE);
        if let Some(p) = pfc {
            b = b.attr(DCB_ATTR_IEEE_PFC, &p.encode());
        }
        b = b.begin_nest(DCB_ATTR_IEEE_APP_TABLE);
        for a in apps {
            b = b.attr(DCB_ATTR_IEEE_APP, &a.encode());
        }
        b.end_nest()
            .end_nest()
            .attr(DCB_ATTR_DCBX, &[dcbx])
            .finish()
    }

    /// The reply `dcbnl_ieee_set`/`dcbnl_ieee_del` builds: `DCB_ATTR_IEEE` as a u8 errno.
    pub(crate) fn set_reply(seq: u32, cmd: u8, errno: i32) -> Vec<u8> {
        let status = (-errno) as i8 as u8;
        MessageBuilder::new(RTM_SETDCB, 0, seq)
            .header(&dcbmsg(cmd))
            .attr(DCB_ATTR_IEEE, &[status])
            .finish()
    }

    #[test]
    fn ieee_pfc_is_136_bytes_with_pfc_en_at_1_requests_at_8_indications_at_72() {
        let mut pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0x08,
            mbc: 0,
            delay: 0x1234,
            ..Default::default()
        };
        pfc.requests[0] = 0x0102_0304_0506_0708;
        pfc.requests[7] = 7;
        pfc.indications[0] = 0x1111;
        pfc.indications[3] = 3;
        let b = pfc.encode();
        assert_eq!(b.len(), 136);
        assert_eq!(b[0], 8, "pfc_cap @0");
        assert_eq!(b[1], 0x08, "pfc_en @1");
        assert_eq!(b[2], 0, "mbc @2");
        assert_eq!(b[3], 0, "padding @3");
        assert_eq!(&b[4..6], &0x1234u16.to_ne_bytes(), "delay @4");
        assert_eq!(&b[6..8], &[0, 0], "padding @6");
        assert_eq!(
            &b[8..16],
            &0x0102_0304_0506_0708u64.to_ne_bytes(),
            "requests[0] @8"
        );
        assert_eq!(&b[64..72], &7u64.to_ne_bytes(), "requests[7] @64");
        assert_eq!(&b[72..80], &0x1111u64.to_ne_bytes(), "indications[0] @72");
        assert_eq!(&b[96..104], &3u64.to_ne_bytes(), "indications[3] @96");
        assert_eq!(IeeePfc::decode(&b).unwrap(), pfc);
        assert_eq!(pfc.enabled_priorities(), vec![3]);
        assert!(IeeePfc::decode(&b[..135]).is_err());
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn ieee_pfc_little_endian_bytes_are_exact() {
        let pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0x28,
            mbc: 1,
            delay: 7,
            ..Default::default()
        };
        let b = pfc.encode();
        assert_eq!(&b[..8], &[8, 0x28, 1, 0, 7, 0, 0, 0]);
        assert!(b[8..].iter().all(|x| *x == 0));
    }

    #[test]
    fn dcb_app_is_selector_priority_protocol() {
        let app = DcbApp::dscp(26, 3);
        let b = app.encode();
        assert_eq!(b.len(), 4);
        assert_eq!(b[0], 5, "selector DSCP");
        assert_eq!(b[1], 3, "priority");
        assert_eq!(&b[2..4], &26u16.to_ne_bytes(), "protocol in host order");
        assert_eq!(DcbApp::decode(&b).unwrap(), app);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn ieee_get_request_bytes_are_exact() {
        let msg = encode_ieee_get("veth0", 5);
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            32, 0, 0, 0,   78, 0,   1, 0,   5, 0, 0, 0,   0, 0, 0, 0, // nlmsghdr: len 32, RTM_GETDCB, REQUEST, seq 5
            0, 21, 0, 0,                                                // dcbmsg: AF_UNSPEC, IEEE_GET
            10, 0, 1, 0,   b'v', b'e', b't', b'h', b'0', 0,   0, 0,     // DCB_ATTR_IFNAME "veth0\0" + pad
        ];
        assert_eq!(msg, expected);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn set_pfc_request_nests_ieee_pfc_in_dcb_attr_ieee() {
        let pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0x08,
            ..Default::default()
        };
        let msg = encode_set_pfc("eth2", &pfc, 9);
        // 16 hdr + 4 dcbmsg + 12 ifname ("eth2\0" = 4 + 5 -> 12) + 4 nest + 4 + 136
        assert_eq!(msg.len(), 16 + 4 + 12 + 4 + 140);
        assert_eq!(&msg[0..4], &176u32.to_le_bytes());
        assert_eq!(&msg[4..6], &79u16.to_le_bytes(), "RTM_SETDCB");
        assert_eq!(&msg[16..20], &[0, 20, 0, 0], "dcbmsg IEEE_SET");
        assert_eq!(&msg[20..24], &[9, 0, 1, 0], "IFNAME len 9");
        assert_eq!(&msg[24..29], b"eth2\0");
        assert_eq!(
            &msg[32..36],
            &[144, 0, 13, 0],
            "DCB_ATTR_IEEE nest, len 4 + 140"
        );
        assert_eq!(
            &msg[36..40],
            &[140, 0, 2, 0],
            "DCB_ATTR_IEEE_PFC len 4 + 136"
        );
        assert_eq!(&msg[40..176], &pfc.encode()[..]);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn app_requests_nest_entries_in_the_app_table() {
        let msg = encode_app(
            DCB_CMD_IEEE_DEL,
            "eth2",
            &[DcbApp::dscp(26, 3), DcbApp::dscp(48, 6)],
            1,
        );
        assert_eq!(&msg[16..20], &[0, 27, 0, 0], "dcbmsg IEEE_DEL");
        #[rustfmt::skip]
        let ieee: [u8; 24] = [
            24, 0, 13, 0,          // DCB_ATTR_IEEE
            20, 0, 3, 0,           // DCB_ATTR_IEEE_APP_TABLE
            8, 0, 1, 0, 5, 3, 26, 0, // DCB_ATTR_IEEE_APP dscp 26 -> 3
            8, 0, 1, 0, 5, 6, 48, 0, // DCB_ATTR_IEEE_APP dscp 48 -> 6
        ];
        assert_eq!(&msg[32..], &ieee[..]);
        assert_eq!(read_u32(&msg, 0), Some(56));
    }

    #[test]
    fn ieee_get_reply_decodes_pfc_apps_and_dcbx() {
        let mut pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0x08,
            ..Default::default()
        };
        pfc.requests[3] = 100;
        pfc.indications[3] = 200;
        let apps = [
            DcbApp::dscp(26, 3),
            DcbApp::dscp(48, 6),
            DcbApp {
                selector: 1,
                priority: 4,
                protocol: 0x8915,
            },
        ];
        let reply = ieee_get_reply(3, "eth2", Some(&pfc), &apps, dcbx::HOST | dcbx::VER_IEEE);
        let state = decode_ieee_get_reply(&reply).unwrap();
        assert_eq!(state.pfc, Some(pfc));
        assert_eq!(state.app, apps.to_vec());
        assert_eq!(state.dcbx, Some(0x09));
        assert_eq!(dcbx::describe(0x09), "host,ieee");
    }

    #[test]
    fn ieee_get_reply_without_pfc_means_no_ieee_getpfc() {
        let reply = ieee_get_reply(3, "eth2", None, &[], 0);
        let state = decode_ieee_get_reply(&reply).unwrap();
        assert_eq!(state.pfc, None);
        assert!(state.app.is_empty());
    }

    #[test]
    fn set_reply_errno_byte_is_a_negative_i8() {
        assert_eq!(
            decode_set_reply(&set_reply(1, DCB_CMD_IEEE_SET, 0), DCB_CMD_IEEE_SET).unwrap(),
            0
        );
        let r = set_reply(1, DCB_CMD_IEEE_SET, errno::EOPNOTSUPP);
        let m = parse_messages(&r).unwrap();
        // dcbmsg, then DCB_ATTR_IEEE (len 5) holding -95 as a byte: 0xa1.
        assert_eq!(&m[0].payload[4..9], &[5, 0, 13, 0, 0xa1]);
        assert_eq!(decode_set_reply(&r, DCB_CMD_IEEE_SET).unwrap(), 95);
        assert!(
            decode_set_reply(&r, DCB_CMD_IEEE_DEL).is_err(),
            "command must match"
        );
    }

    /// Builds the kernel's answer to a request.
    pub(crate) type Answer = Box<dyn Fn(&[u8]) -> Vec<u8>>;

    /// A fake kernel: checks each request against what the test expects and answers it.
    pub(crate) struct FakeKernel {
        pub script: VecDeque<(Vec<u8>, Answer)>,
    }

    impl Transport for FakeKernel {
        fn request(&mut self, seq: u32, request: &[u8]) -> io::Result<Vec<Vec<u8>>> {
            let (expected, answer) = self.script.pop_front().expect("an expected request");
            assert_eq!(request, &expected[..], "request bytes");
            assert_eq!(read_u32(request, 8), Some(seq));
            Ok(vec![answer(request)])
        }
    }

    #[test]
    fn dcbnl_reports_eopnotsupp_as_unsupported() {
        let kernel = FakeKernel {
            script: VecDeque::from([(
                encode_ieee_get("veth0", 1),
                Box::new(|req: &[u8]| error_reply(req, errno::EOPNOTSUPP)) as Answer,
            )]),
        };
        let mut dcb = Dcbnl::new(kernel);
        let err = dcb.ieee_get("veth0").unwrap_err();
        assert!(err.is_unsupported(), "{err}");
        assert!(err.to_string().contains("IEEE_GET on veth0"), "{err}");
        assert!(err.to_string().contains("EOPNOTSUPP"), "{err}");
    }

    #[test]
    fn dcbnl_set_pfc_reads_the_status_byte() {
        let pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0x08,
            ..Default::default()
        };
        let kernel = FakeKernel {
            script: VecDeque::from([
                (
                    encode_set_pfc("eth2", &pfc, 1),
                    Box::new(|req: &[u8]| set_reply(read_u32(req, 8).unwrap(), DCB_CMD_IEEE_SET, 0))
                        as Answer,
                ),
                (
                    encode_set_pfc("eth2", &pfc, 2),
                    Box::new(|req: &[u8]| {
                        set_reply(read_u32(req, 8).unwrap(), DCB_CMD_IEEE_SET, errno::EINVAL)
                    }),
                ),
            ]),
        };
        let mut dcb = Dcbnl::new(kernel);
        dcb.set_pfc("eth2", &pfc).unwrap();
        let err = dcb.set_pfc("eth2", &pfc).unwrap_err();
        assert_eq!(err.source, NetlinkError::Errno(errno::EINVAL));
        assert!(!err.is_unsupported());
        assert_eq!(NLMSG_HDRLEN, 16);
    }
}
