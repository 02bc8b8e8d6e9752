//! HTTP/2 framing as far as the authority front needs it (RFC 9113 sections 3.4, 4.1 and 6).

/// What every HTTP/2 client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
pub const FRAME_HEADER_LEN: usize = 9;
/// Largest frame payload we emit: the default SETTINGS_MAX_FRAME_SIZE, which no peer may lower.
pub const MAX_FRAME_SIZE: usize = 16_384;

pub const HEADERS: u8 = 0x1;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// The 9-byte header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length (24 bits).
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    /// Stream identifier, the reserved bit cleared.
    pub stream: u32,
}

impl FrameHeader {
    pub fn parse(bytes: &[u8; FRAME_HEADER_LEN]) -> Self {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = *bytes;
        Self {
            len: usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2),
            kind,
            flags,
            stream: u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff,
        }
    }

    /// Append the header to `out`; `len` must fit 24 bits (every caller emits at most
    /// [`MAX_FRAME_SIZE`] or a length it parsed).
    pub fn write(&self, out: &mut Vec<u8>) {
        let len = (self.len as u32).to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
    }
}

/// Append a whole frame; `payload` must fit 24 bits.
pub fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    FrameHeader {
        len: payload.len(),
        kind,
        flags,
        stream,
    }
    .write(out);
    out.extend_from_slice(payload);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn frame_header_round_trips_and_clears_the_reserved_bit() {
        let mut out = Vec::new();
        let head = FrameHeader {
            len: 0x12_3456,
            kind: CONTINUATION,
            flags: END_HEADERS,
            stream: 7,
        };
        head.write(&mut out);
        assert_eq!(out, [0x12, 0x34, 0x56, 9, 4, 0, 0, 0, 7]);
        assert_eq!(FrameHeader::parse(out.as_slice().try_into().unwrap()), head);
        let reserved = [0, 0, 0, 1, 0, 0x80, 0, 0, 3];
        assert_eq!(FrameHeader::parse(&reserved).stream, 3);
    }
}
