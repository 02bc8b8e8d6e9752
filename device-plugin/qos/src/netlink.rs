//! Netlink framing shared by DCB netlink and rtnetlink: `struct nlmsghdr`, `struct nlattr`
//! (4-byte aligned, nested), `NLMSG_ERROR` decoding, and a byte-level [`Transport`] so the
//! message code is tested against an in-process fake kernel while production speaks to a real
//! `NETLINK_ROUTE` socket (opened with `netlink-sys`, no `unsafe` here).

use std::io;

/// `sizeof(struct nlmsghdr)`.
pub const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct nlattr)`.
pub const NLA_HDRLEN: usize = 4;
/// `NLMSG_ERROR`: an error or an acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: end of a multipart dump.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x01;
/// `NLM_F_MULTI`.
pub const NLM_F_MULTI: u16 = 0x02;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x04;
/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 1 << 15;
/// `NLA_F_NET_BYTEORDER`.
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
/// `NLA_TYPE_MASK`: the attribute type without its flags.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// Errno values the QoS code tells apart.
pub mod errno {
    /// `EPERM`: missing CAP_NET_ADMIN.
    pub const EPERM: i32 = 1;
    /// `ENOENT`.
    pub const ENOENT: i32 = 2;
    /// `ENODEV`: no such interface.
    pub const ENODEV: i32 = 19;
    /// `EINVAL`.
    pub const EINVAL: i32 = 22;
    /// `ERANGE`.
    pub const ERANGE: i32 = 34;
    /// `EOPNOTSUPP`: the device has no such operation (DCB on a veth).
    pub const EOPNOTSUPP: i32 = 95;
}

/// `NLMSG_ALIGN` / `NLA_ALIGN`: round up to a multiple of 4.
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Malformed bytes from the kernel (or from a test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink data: {0}")]
pub struct Malformed(pub String);

/// Builds one netlink message: header, fixed family header, then attributes.
#[derive(Debug, Clone)]
pub struct MessageBuilder {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl MessageBuilder {
    /// Start a message of `msg_type` with `flags` and sequence number `seq` (port id 0: the kernel).
    pub fn new(msg_type: u16, flags: u16, seq: u32) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set by finish()
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
        Self {
            buf,
            nests: Vec::new(),
        }
    }

    /// Append the family header (`struct dcbmsg`, `struct ifinfomsg`), padded to 4 bytes.
    pub fn header(mut self, bytes: &[u8]) -> Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    /// Append one attribute with `payload`, padded to 4 bytes.
    pub fn attr(mut self, kind: u16, payload: &[u8]) -> Self {
        let len = NLA_HDRLEN + payload.len();
        self.buf.extend_from_slice(&attr_len(len).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    /// Open a nested attribute; close it with [`MessageBuilder::end_nest`]. The type is sent
    /// without `NLA_F_NESTED`, as iproute2's `dcb` does (DCB netlink parses either way).
    pub fn begin_nest(mut self, kind: u16) -> Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self
    }

    /// Close the innermost open nest, writing its length.
    pub fn end_nest(mut self) -> Self {
        if let Some(start) = self.nests.pop() {
            let len = attr_len(self.buf.len() - start).to_ne_bytes();
            self.buf[start..start + 2].copy_from_slice(&len);
        }
        self
    }

    /// The finished message with `nlmsg_len` filled in (open nests are closed).
    pub fn finish(mut self) -> Vec<u8> {
        while !self.nests.is_empty() {
            self = self.end_nest();
        }
        let len = u32::try_from(self.buf.len())
            .unwrap_or(u32::MAX)
            .to_ne_bytes();
        self.buf[0..4].copy_from_slice(&len);
        self.buf
    }

    fn pad(&mut self) {
        let aligned = align4(self.buf.len());
        self.buf.resize(aligned, 0);
    }
}

fn attr_len(len: usize) -> u16 {
    // Attributes built here are a few hundred bytes at most; saturate rather than wrap.
    u16::try_from(len).unwrap_or(u16::MAX)
}

/// One decoded netlink message, borrowing its payload (family header and attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    pub payload: &'a [u8],
}

impl<'a> Message<'a> {
    /// For an `NLMSG_ERROR` message: the errno as a positive number (0 is an acknowledgement).
    pub fn error_code(&self) -> Result<Option<i32>, Malformed> {
        if self.msg_type != NLMSG_ERROR {
            return Ok(None);
        }
        let code = read_i32(self.payload, 0)
            .ok_or_else(|| Malformed("NLMSG_ERROR shorter than its error code".into()))?;
        code.checked_neg()
            .map(Some)
            .ok_or_else(|| Malformed(format!("NLMSG_ERROR code {code} is no errno")))
    }
}

/// Split a datagram into messages.
pub fn parse_messages(mut buf: &[u8]) -> Result<Vec<Message<'_>>, Malformed> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = read_u32(buf, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(Malformed(format!(
                "message length {len} with {} bytes left",
                buf.len()
            )));
        }
        out.push(Message {
            msg_type: read_u16(buf, 4).unwrap_or(0),
            flags: read_u16(buf, 6).unwrap_or(0),
            seq: read_u32(buf, 8).unwrap_or(0),
            pid: read_u32(buf, 12).unwrap_or(0),
            payload: &buf[NLMSG_HDRLEN..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    if !buf.is_empty() {
        return Err(Malformed(format!(
            "{} trailing bytes after the last message",
            buf.len()
        )));
    }
    Ok(out)
}

/// One attribute: its type (flags masked off), whether it was flagged nested, and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    pub kind: u16,
    pub nested_flag: bool,
    pub payload: &'a [u8],
}

impl<'a> Attr<'a> {
    /// The payload as a `u8`.
    pub fn u8(&self) -> Result<u8, Malformed> {
        self.payload
            .first()
            .copied()
            .ok_or_else(|| Malformed(format!("attribute {} has no u8 payload", self.kind)))
    }

    /// The payload as a host-order `u32`.
    pub fn u32(&self) -> Result<u32, Malformed> {
        read_u32(self.payload, 0)
            .ok_or_else(|| Malformed(format!("attribute {} has no u32 payload", self.kind)))
    }

    /// The payload as a NUL-terminated string.
    pub fn string(&self) -> Result<String, Malformed> {
        let end = self
            .payload
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.payload.len());
        String::from_utf8(self.payload[..end].to_vec())
            .map_err(|_| Malformed(format!("attribute {} is not UTF-8", self.kind)))
    }

    /// The attributes nested in this one.
    pub fn nested(&self) -> Result<Vec<Attr<'a>>, Malformed> {
        parse_attrs(self.payload)
    }
}

/// Split an attribute stream (each attribute padded to 4 bytes).
pub fn parse_attrs(mut buf: &[u8]) -> Result<Vec<Attr<'_>>, Malformed> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HDRLEN {
        let len = read_u16(buf, 0).unwrap_or(0) as usize;
        if len < NLA_HDRLEN || len > buf.len() {
            return Err(Malformed(format!(
                "attribute length {len} with {} bytes left",
                buf.len()
            )));
        }
        let raw = read_u16(buf, 2).unwrap_or(0);
        out.push(Attr {
            kind: raw & NLA_TYPE_MASK,
            nested_flag: raw & NLA_F_NESTED != 0,
            payload: &buf[NLA_HDRLEN..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// The first attribute of `kind`.
pub fn find_attr<'a, 'b>(attrs: &'b [Attr<'a>], kind: u16) -> Option<&'b Attr<'a>> {
    attrs.iter().find(|a| a.kind == kind)
}

pub(crate) fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    buf.get(at..at + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
}

pub(crate) fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

pub(crate) fn read_i32(buf: &[u8], at: usize) -> Option<i32> {
    read_u32(buf, at).map(|v| v as i32)
}

pub(crate) fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at + 8).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_ne_bytes(a)
    })
}

/// Sends one request and returns every datagram of the answer that carries its sequence number.
pub trait Transport {
    /// Send `request` (one message with sequence number `seq`) and collect the reply messages,
    /// each as the raw bytes of one message, until the answer is complete: a single
    /// non-multipart message, `NLMSG_DONE`, or `NLMSG_ERROR`.
    fn request(&mut self, seq: u32, request: &[u8]) -> io::Result<Vec<Vec<u8>>>;
}

/// A `NETLINK_ROUTE` socket, connected to the kernel.
pub struct RouteSocket {
    socket: netlink_sys::Socket,
}

impl std::fmt::Debug for RouteSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteSocket").finish_non_exhaustive()
    }
}

impl RouteSocket {
    /// Open and connect a `NETLINK_ROUTE` socket in the caller's network namespace.
    pub fn open() -> io::Result<Self> {
        let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(Self { socket })
    }
}

impl Transport for RouteSocket {
    fn request(&mut self, seq: u32, request: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.socket.send(request, 0)?;
        let mut out = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full()?;
            let messages = parse_messages(&datagram)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut complete = false;
            let mut offset = 0usize;
            for m in &messages {
                let len = NLMSG_HDRLEN + m.payload.len();
                let raw = datagram[offset..offset + len].to_vec();
                offset = align4(offset + len).min(datagram.len());
                if m.seq != seq {
                    // A stale answer to an earlier request on this socket; skip it.
                    continue;
                }
                out.push(raw);
                if m.msg_type == NLMSG_ERROR
                    || m.msg_type == NLMSG_DONE
                    || m.flags & NLM_F_MULTI == 0
                {
                    complete = true;
                }
            }
            if complete {
                return Ok(out);
            }
        }
    }
}

/// Where a request failed: an errno from the kernel, or the bytes made no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetlinkError {
    /// The socket itself failed (open, send, receive).
    #[error("netlink socket: {0}")]
    Io(String),
    /// The kernel answered with `NLMSG_ERROR` and this errno (positive).
    #[error("kernel returned {}", errno_name(*.0))]
    Errno(i32),
    /// The answer was malformed.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl NetlinkError {
    /// The errno, when the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Errno(e) => Some(*e),
            _ => None,
        }
    }
}

impl From<io::Error> for NetlinkError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(code) => NetlinkError::Errno(code),
            None => NetlinkError::Io(e.to_string()),
        }
    }
}

/// `EOPNOTSUPP (95): Operation not supported`.
pub fn errno_name(code: i32) -> String {
    let name = match code {
        errno::EPERM => "EPERM",
        errno::ENOENT => "ENOENT",
        errno::ENODEV => "ENODEV",
        errno::EINVAL => "EINVAL",
        errno::ERANGE => "ERANGE",
        errno::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "errno",
    };
    format!("{name} ({code}): {}", io::Error::from_raw_os_error(code))
        .replace(&format!(" (os error {code})"), "")
}

/// Send `request` and return the reply messages (raw bytes), turning an `NLMSG_ERROR` with a
/// non-zero code into [`NetlinkError::Errno`]. An acknowledgement (code 0) is dropped.
pub fn exchange(
    transport: &mut dyn Transport,
    seq: u32,
    request: &[u8],
) -> Result<Vec<Vec<u8>>, NetlinkError> {
    let replies = transport.request(seq, request)?;
    let mut out = Vec::new();
    for raw in replies {
        let messages = parse_messages(&raw)?;
        for m in &messages {
            match m.error_code()? {
                Some(0) => {}
                Some(code) => return Err(NetlinkError::Errno(code)),
                None if m.msg_type == NLMSG_DONE => {}
                None => out.push(raw.clone()),
            }
        }
    }
    Ok(out)
}

/// Build the `NLMSG_ERROR` answer the kernel sends for `request` with `errno` (0 = ack):
/// the negative error code followed by the request's header. Used by tests' fake kernels.
pub fn error_reply(request: &[u8], errno: i32) -> Vec<u8> {
    let seq = read_u32(request, 8).unwrap_or(0);
    let mut payload = (-errno).to_ne_bytes().to_vec();
    payload.extend_from_slice(request.get(..NLMSG_HDRLEN).unwrap_or(&[0u8; NLMSG_HDRLEN]));
    MessageBuilder::new(NLMSG_ERROR, 0, seq)
        .header(&payload)
        .finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn header_is_sixteen_bytes_with_length_type_flags_seq_pid() {
        let msg = MessageBuilder::new(78, NLM_F_REQUEST, 7)
            .header(&[0, 21, 0, 0])
            .finish();
        assert_eq!(msg.len(), 20);
        assert_eq!(&msg[0..4], &20u32.to_ne_bytes());
        assert_eq!(&msg[4..6], &78u16.to_ne_bytes());
        assert_eq!(&msg[6..8], &1u16.to_ne_bytes());
        assert_eq!(&msg[8..12], &7u32.to_ne_bytes());
        assert_eq!(&msg[12..16], &[0, 0, 0, 0]);
    }

    #[test]
    fn attributes_are_padded_to_four_bytes_and_length_excludes_padding() {
        let msg = MessageBuilder::new(1, 0, 0)
            .attr(1, b"veth0\0")
            .attr(2, &[9])
            .finish();
        // attr 1: 4 + 6 = 10 bytes, padded to 12; attr 2: 4 + 1 = 5, padded to 8.
        assert_eq!(msg.len(), 16 + 12 + 8);
        assert_eq!(&msg[16..18], &10u16.to_ne_bytes());
        assert_eq!(&msg[26..28], &[0, 0], "padding is zeroed");
        assert_eq!(&msg[28..30], &5u16.to_ne_bytes());
        let attrs = parse_attrs(&msg[16..]).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].string().unwrap(), "veth0");
        assert_eq!(attrs[1].u8().unwrap(), 9);
    }

    #[test]
    fn nested_attribute_length_covers_its_children() {
        let msg = MessageBuilder::new(1, 0, 0)
            .begin_nest(13)
            .attr(2, &[1, 2, 3])
            .begin_nest(3)
            .attr(1, &[5, 3, 26, 0])
            .end_nest()
            .end_nest()
            .finish();
        let top = parse_attrs(&msg[16..]).unwrap();
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].kind, 13);
        assert_eq!(top[0].payload.len(), 8 + 12);
        let inner = top[0].nested().unwrap();
        assert_eq!(inner[0].payload, &[1, 2, 3]);
        assert_eq!(inner[1].nested().unwrap()[0].payload, &[5, 3, 26, 0]);
    }

    #[test]
    fn nested_flag_is_masked_from_the_type() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&8u16.to_ne_bytes());
        raw.extend_from_slice(&(13u16 | NLA_F_NESTED).to_ne_bytes());
        raw.extend_from_slice(&[0, 0, 0, 0]);
        let a = parse_attrs(&raw).unwrap();
        assert_eq!(a[0].kind, 13);
        assert!(a[0].nested_flag);
    }

    #[test]
    fn error_reply_round_trips_to_errno() {
        let req = MessageBuilder::new(78, NLM_F_REQUEST, 42)
            .header(&[0, 21, 0, 0])
            .finish();
        let reply = error_reply(&req, errno::EOPNOTSUPP);
        let msgs = parse_messages(&reply).unwrap();
        assert_eq!(msgs[0].msg_type, NLMSG_ERROR);
        assert_eq!(msgs[0].seq, 42);
        assert_eq!(msgs[0].error_code().unwrap(), Some(95));
        assert_eq!(&msgs[0].payload[0..4], &(-95i32).to_ne_bytes());
        assert_eq!(&msgs[0].payload[4..20], &req[0..16]);
    }

    #[test]
    fn truncated_messages_are_rejected() {
        let msg = MessageBuilder::new(1, 0, 0).attr(1, &[1, 2, 3, 4]).finish();
        assert!(parse_messages(&msg[..msg.len() - 2]).is_err());
        assert!(parse_attrs(&[8, 0, 1, 0, 0]).is_err());
        // Found by fuzz/ (dcbnl, rtnl): an error code that has no positive errno.
        let min = MessageBuilder::new(NLMSG_ERROR, 0, 1)
            .header(&i32::MIN.to_ne_bytes())
            .finish();
        assert!(parse_messages(&min).unwrap()[0].error_code().is_err());
    }

    #[test]
    fn errno_names_are_readable() {
        let s = errno_name(errno::EOPNOTSUPP);
        assert!(s.starts_with("EOPNOTSUPP (95): "), "{s}");
        assert!(!s.contains("os error"), "{s}");
    }
}
