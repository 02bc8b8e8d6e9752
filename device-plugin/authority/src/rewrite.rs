//! Header blocks from the client, decoded with the client's HPACK context, the authority mended,
//! and framed again for the server without its dynamic table.

use std::borrow::Cow;

use super::FrontError;
use super::frame::{self, FrameHeader, MAX_FRAME_SIZE, write_frame};

/// Largest header block (all its fragments) we buffer from a client.
pub const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// Largest decoded header list (RFC 7541 sizes: name + value + 32 per field) of one block.
/// Indexed fields are one byte each but may expand to a whole table entry, hence a cap of its own.
pub const MAX_HEADER_LIST: usize = 1024 * 1024;
/// The server's SETTINGS_HEADER_TABLE_SIZE: h2's default, which tonic does not change. A client
/// may not grow its table past it.
pub const HEADER_TABLE_SIZE: usize = 4096;
/// What replaces an authority that does not parse; what the kubelet itself sends.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// A header block being collected from HEADERS and CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    /// Stream dependency and weight of a HEADERS frame with the PRIORITY flag, re-emitted as sent.
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server header rewriting of one connection: the client's HPACK context and the
/// header block in progress. Fed whole frames; emits the frames to send to the server.
pub struct HeaderRewriter {
    decoder: loona_hpack::Decoder<'static>,
    open: Option<OpenBlock>,
}

impl Default for HeaderRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderRewriter {
    pub fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            decoder,
            open: None,
        }
    }

    /// Check that a frame may come now: inside a header block only its CONTINUATIONs may
    /// (RFC 9113 section 6.10); outside one, no CONTINUATION may.
    pub fn check_order(&self, head: &FrameHeader) -> Result<(), FrontError> {
        match &self.open {
            Some(open) if head.kind != frame::CONTINUATION || head.stream != open.stream => {
                Err(FrontError::ContinuationExpected {
                    kind: head.kind,
                    stream: head.stream,
                    open: open.stream,
                })
            }
            None if head.kind == frame::CONTINUATION => Err(FrontError::StrayContinuation {
                stream: head.stream,
            }),
            _ => Ok(()),
        }
    }

    /// Take a HEADERS or CONTINUATION frame; when it ends its header block, append the rewritten
    /// block's frames to `out`. Other frame types are not for this method.
    pub fn header_frame(
        &mut self,
        head: &FrameHeader,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrontError> {
        self.check_order(head)?;
        let stream = head.stream;
        match self.open.as_mut() {
            Some(open) => {
                if open.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(FrontError::BlockTooLarge { stream });
                }
                open.fragment.extend_from_slice(payload);
            }
            None => {
                if stream == 0 {
                    return Err(FrontError::StreamZero);
                }
                let (priority, fragment) = headers_fragment(head, payload)?;
                self.open = Some(OpenBlock {
                    stream,
                    end_stream: head.flags & frame::END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                });
            }
        }
        if head.flags & frame::END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.open.take() else {
            return Ok(());
        };
        let fields = self.decode(block.stream, &block.fragment)?;
        let encoded = encode_fields(&fields);
        write_header_frames(
            block.stream,
            block.end_stream,
            block.priority,
            &encoded,
            out,
        );
        Ok(())
    }

    /// The whole block is decoded even when it needs no change: the client's dynamic table must
    /// be followed for every block, and re-encoding them all keeps the server's table unused.
    fn decode(&mut self, stream: u32, block: &[u8]) -> Result<Vec<Field>, FrontError> {
        let mut fields = Vec::new();
        let mut size = 0usize;
        let mut over = false;
        self.decoder
            .decode_with_cb(block, |name, value| {
                size = size.saturating_add(name.len() + value.len() + 32);
                if size > MAX_HEADER_LIST {
                    over = true;
                    return;
                }
                fields.push(Field::new(name, value));
            })
            .map_err(|source| FrontError::Hpack { stream, source })?;
        if over {
            return Err(FrontError::ListTooLarge { stream });
        }
        for field in &mut fields {
            if field.name == b":authority"
                && http::uri::Authority::try_from(field.value.as_slice()).is_err()
            {
                tracing::debug!(stream, authority = %String::from_utf8_lossy(&field.value),
                    "authority replaced by localhost");
                field.value = REPLACEMENT_AUTHORITY.to_vec();
            }
        }
        Ok(fields)
    }
}

/// One decoded header field.
struct Field {
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Field {
    fn new(name: Cow<'_, [u8]>, value: Cow<'_, [u8]>) -> Self {
        Self {
            name: name.into_owned(),
            value: value.into_owned(),
        }
    }
}

/// The block fragment of a HEADERS payload, without its padding, and its priority fields.
fn headers_fragment<'p>(
    head: &FrameHeader,
    payload: &'p [u8],
) -> Result<(Option<[u8; 5]>, &'p [u8]), FrontError> {
    let stream = head.stream;
    let mut body = payload;
    let mut pad = 0;
    if head.flags & frame::PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or(FrontError::BadPadding { stream })?;
        pad = usize::from(n);
        body = rest;
    }
    let mut priority = None;
    if head.flags & frame::PRIORITY != 0 {
        let (fields, rest) = body
            .split_first_chunk::<5>()
            .ok_or(FrontError::ShortPriority { stream })?;
        priority = Some(*fields);
        body = rest;
    }
    let end = body
        .len()
        .checked_sub(pad)
        .ok_or(FrontError::BadPadding { stream })?;
    Ok((priority, &body[..end]))
}

/// HPACK-encode `fields` as literals without indexing with literal names and no Huffman coding:
/// nothing enters or is read from the server's dynamic table. The never-indexed mark of a field is
/// not kept: the server is the last hop and does not re-encode requests.
fn encode_fields(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        fields
            .iter()
            .map(|f| f.name.len() + f.value.len() + 8)
            .sum(),
    );
    for field in fields {
        out.push(0x00);
        push_string(&mut out, &field.name);
        push_string(&mut out, &field.value);
    }
    out
}

/// A string literal without Huffman coding (RFC 7541 section 5.2).
fn push_string(out: &mut Vec<u8>, s: &[u8]) {
    push_integer(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

/// An integer with an N-bit prefix (RFC 7541 section 5.1); `first` holds the bits above it.
fn push_integer(out: &mut Vec<u8>, value: usize, prefix_bits: u8, first: u8) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Frame an encoded header block: one HEADERS frame, then CONTINUATIONs past
/// [`MAX_FRAME_SIZE`]. END_STREAM and the priority fields go on the HEADERS frame, END_HEADERS on
/// the last; padding is dropped.
fn write_header_frames(
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: &[u8],
    out: &mut Vec<u8>,
) {
    let priority_len = priority.map_or(0, |p| p.len());
    let (first, mut rest) = block.split_at(block.len().min(MAX_FRAME_SIZE - priority_len));
    let mut flags = 0;
    if end_stream {
        flags |= frame::END_STREAM;
    }
    if priority.is_some() {
        flags |= frame::PRIORITY;
    }
    if rest.is_empty() {
        flags |= frame::END_HEADERS;
    }
    FrameHeader {
        len: priority_len + first.len(),
        kind: frame::HEADERS,
        flags,
        stream,
    }
    .write(out);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_SIZE));
        let flags = if tail.is_empty() {
            frame::END_HEADERS
        } else {
            0
        };
        write_frame(out, frame::CONTINUATION, flags, stream, chunk);
        rest = tail;
    }
}

/// Clients and the server's view, for these tests and the front's.
#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
pub(super) mod tests {
    use super::*;
    use crate::frame::FRAME_HEADER_LEN;
    use httlib_hpack::{Decoder as TestDecoder, Encoder as TestEncoder};

    /// Real clients' encoding: Huffman, incremental indexing, the table searched first.
    const CLIENT_FLAGS: u8 = TestEncoder::HUFFMAN_NAME
        | TestEncoder::HUFFMAN_VALUE
        | TestEncoder::WITH_INDEXING
        | TestEncoder::BEST_FORMAT;

    pub(crate) fn encode(encoder: &mut TestEncoder<'_>, fields: &[(&str, String)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in fields {
            let field = (
                name.as_bytes().to_vec(),
                value.as_bytes().to_vec(),
                CLIENT_FLAGS,
            );
            encoder.encode(field, &mut out).unwrap();
        }
        out
    }

    pub(crate) fn request(authority: &str) -> Vec<(&'static str, String)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1beta1.DevicePlugin/GetDevicePluginOptions"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .into_iter()
        .map(|(n, v)| (n, v.to_string()))
        .collect()
    }

    pub(crate) fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, kind, flags, stream, payload);
        out
    }

    /// Split emitted bytes into (header, payload) frames.
    pub(crate) fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let head = FrameHeader::parse(bytes[..FRAME_HEADER_LEN].try_into().unwrap());
            let end = FRAME_HEADER_LEN + head.len;
            out.push((head, bytes[FRAME_HEADER_LEN..end].to_vec()));
            bytes = &bytes[end..];
        }
        out
    }

    /// The server's view: decode the joined fragments of emitted frames with a decoder whose
    /// table is empty and must stay so.
    pub(crate) fn server_decode(frames: &[(FrameHeader, Vec<u8>)]) -> Vec<(String, String)> {
        let mut block = Vec::new();
        for (head, payload) in frames {
            let mut body = payload.as_slice();
            if head.kind == frame::HEADERS && head.flags & frame::PRIORITY != 0 {
                body = &body[5..];
            }
            block.extend_from_slice(body);
        }
        let mut decoder = TestDecoder::with_dynamic_size(0);
        let mut fields = Vec::new();
        decoder.decode(&mut block, &mut fields).unwrap();
        fields
            .into_iter()
            .map(|(n, v, flags)| {
                assert_eq!(flags & TestDecoder::WITH_INDEXING, 0, "never indexed");
                (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
            })
            .collect()
    }

    pub(crate) fn authority_of(fields: &[(String, String)]) -> &str {
        &fields.iter().find(|(n, _)| n == ":authority").unwrap().1
    }

    fn rewrite(rewriter: &mut HeaderRewriter, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (head, payload) in frames(input) {
            rewriter.header_frame(&head, &payload, &mut out).unwrap();
        }
        out
    }

    fn head(kind: u8, flags: u8, stream: u32, len: usize) -> FrameHeader {
        FrameHeader {
            len,
            kind,
            flags,
            stream,
        }
    }

    /// The error a fresh rewriter gives for one frame.
    fn refusal(head: FrameHeader, payload: &[u8]) -> FrontError {
        let mut out = Vec::new();
        let err = HeaderRewriter::new()
            .header_frame(&head, payload, &mut out)
            .unwrap_err();
        assert!(out.is_empty());
        err
    }

    #[test]
    fn integers_follow_rfc_7541_c1() {
        let mut out = Vec::new();
        push_integer(&mut out, 10, 5, 0);
        push_integer(&mut out, 1337, 5, 0);
        push_integer(&mut out, 42, 8, 0);
        push_integer(&mut out, 127, 7, 0x80);
        assert_eq!(out, [10, 31, 154, 10, 42, 0xff, 0]);
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_table_is_mirrored() {
        let mut encoder = TestEncoder::default();
        let mut rewriter = HeaderRewriter::new();
        let fields = request("/var/lib/kubelet/device-plugins/rocefabric-rdma_hca.sock");
        for stream in [1, 3, 5] {
            let block = encode(&mut encoder, &fields);
            if stream > 1 {
                // Every field now comes from the client's dynamic or static table.
                assert!(block.iter().all(|b| b & 0x80 != 0), "{block:?}");
            }
            let input = frame_bytes(frame::HEADERS, frame::END_HEADERS, stream, &block);
            let emitted = frames(&rewrite(&mut rewriter, &input));
            assert_eq!(emitted.len(), 1);
            assert_eq!(emitted[0].0.stream, stream);
            assert_eq!(emitted[0].0.flags, frame::END_HEADERS);
            let decoded = server_decode(&emitted);
            assert_eq!(authority_of(&decoded), "localhost");
            assert_eq!(decoded.len(), 6);
            assert_eq!(decoded[2].1, fields[2].1);
        }
    }

    #[test]
    fn a_valid_authority_and_other_fields_are_kept() {
        let mut encoder = TestEncoder::default();
        let mut rewriter = HeaderRewriter::new();
        for authority in ["localhost", "example.com:8443", "[::1]:50051"] {
            let fields = request(authority);
            let input = frame_bytes(
                frame::HEADERS,
                frame::END_HEADERS | frame::END_STREAM,
                1,
                &encode(&mut encoder, &fields),
            );
            let emitted = frames(&rewrite(&mut rewriter, &input));
            assert_eq!(emitted[0].0.flags, frame::END_HEADERS | frame::END_STREAM);
            let expected: Vec<(String, String)> = fields
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect();
            assert_eq!(server_decode(&emitted), expected);
        }
    }

    #[test]
    fn continuations_are_joined_and_padding_and_priority_handled() {
        let mut encoder = TestEncoder::default();
        let mut rewriter = HeaderRewriter::new();
        let block = encode(&mut encoder, &request("/tmp/plugin.sock"));
        let (a, rest) = block.split_at(3);
        let (b, c) = rest.split_at(rest.len() / 2);
        let priority = [0x80, 0, 0, 0, 0x10];
        let mut headers = vec![4]; // pad length
        headers.extend_from_slice(&priority);
        headers.extend_from_slice(a);
        headers.extend_from_slice(&[0; 4]);
        let flags = frame::PADDED | frame::PRIORITY | frame::END_STREAM;
        let mut input = frame_bytes(frame::HEADERS, flags, 9, &headers);
        input.extend(frame_bytes(frame::CONTINUATION, 0, 9, b));
        input.extend(frame_bytes(frame::CONTINUATION, frame::END_HEADERS, 9, c));

        let mut out = Vec::new();
        for (i, (head, payload)) in frames(&input).iter().enumerate() {
            assert!(out.is_empty(), "nothing is sent before END_HEADERS ({i})");
            rewriter.header_frame(head, payload, &mut out).unwrap();
        }
        let emitted = frames(&out);
        assert_eq!(emitted.len(), 1);
        let (head, payload) = &emitted[0];
        assert_eq!(
            head.flags,
            frame::PRIORITY | frame::END_STREAM | frame::END_HEADERS,
            "padding dropped, priority and END_STREAM kept"
        );
        assert_eq!(payload[..5], priority);
        assert_eq!(authority_of(&server_decode(&emitted)), "localhost");
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let mut encoder = TestEncoder::default();
        let mut rewriter = HeaderRewriter::new();
        let big = "x".repeat(40_000);
        let mut fields = request("/tmp/plugin.sock");
        fields.push(("x-big", big.clone()));
        let block = encode(&mut encoder, &fields);
        // Sent in 10000-byte pieces, with the PRIORITY flag on the HEADERS frame.
        let mut first = vec![0, 0, 0, 0, 16];
        first.extend_from_slice(&block[..10_000]);
        let mut input = frame_bytes(frame::HEADERS, frame::PRIORITY, 1, &first);
        let mut pieces = block[10_000..].chunks(10_000).peekable();
        while let Some(piece) = pieces.next() {
            let flags = if pieces.peek().is_none() {
                frame::END_HEADERS
            } else {
                0
            };
            input.extend(frame_bytes(frame::CONTINUATION, flags, 1, piece));
        }
        let emitted = frames(&rewrite(&mut rewriter, &input));
        assert_eq!(emitted.len(), 3, "40 KB of literals in 16 KiB frames");
        assert_eq!(emitted[0].0.kind, frame::HEADERS);
        assert_eq!(emitted[0].0.flags, frame::PRIORITY);
        assert_eq!(emitted[0].0.len, MAX_FRAME_SIZE);
        for (head, _) in &emitted[1..] {
            assert_eq!(head.kind, frame::CONTINUATION);
            assert_eq!(head.stream, 1);
        }
        assert_eq!(emitted[1].0.flags, 0);
        assert_eq!(emitted[2].0.flags, frame::END_HEADERS);
        let decoded = server_decode(&emitted);
        assert_eq!(decoded.last().unwrap().1, big);
        assert_eq!(authority_of(&decoded), "localhost");
    }

    #[test]
    fn a_table_size_update_is_honoured_and_not_forwarded() {
        let mut encoder = TestEncoder::default();
        let mut rewriter = HeaderRewriter::new();
        let fields = request("/tmp/plugin.sock");
        let block = encode(&mut encoder, &fields);
        let input = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block);
        rewrite(&mut rewriter, &input);
        // Shrink to 0 (evicting everything), then grow back: the fields are literals again.
        let mut block = Vec::new();
        encoder.update_max_dynamic_size(0, &mut block).unwrap();
        encoder.update_max_dynamic_size(4096, &mut block).unwrap();
        block.extend(encode(&mut encoder, &fields));
        let input = frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &block);
        let decoded = server_decode(&frames(&rewrite(&mut rewriter, &input)));
        assert_eq!(authority_of(&decoded), "localhost");
        // An index past the (now empty) table cannot be resolved.
        let block = [0x20, 0x80 | 62];
        let err = rewriter
            .header_frame(
                &head(frame::HEADERS, frame::END_HEADERS, 5, block.len()),
                &block,
                &mut Vec::new(),
            )
            .unwrap_err();
        assert!(matches!(err, FrontError::Hpack { stream: 5, .. }), "{err}");
    }

    #[test]
    fn broken_framing_and_hpack_are_refused() {
        let err = refusal(head(frame::CONTINUATION, frame::END_HEADERS, 1, 1), &[0x82]);
        assert!(matches!(err, FrontError::StrayContinuation { stream: 1 }));
        let err = refusal(head(frame::HEADERS, frame::END_HEADERS, 0, 1), &[0x82]);
        assert!(matches!(err, FrontError::StreamZero));
        let err = refusal(head(frame::HEADERS, frame::PADDED, 1, 2), &[5, 0x82]);
        assert!(matches!(err, FrontError::BadPadding { stream: 1 }));
        let err = refusal(head(frame::HEADERS, frame::PRIORITY, 1, 2), &[0, 0]);
        assert!(matches!(err, FrontError::ShortPriority { stream: 1 }));
        // Index 0 is no field; a size update over the server's table size is refused.
        for block in [vec![0x80], vec![0x3f, 0xe1, 0x3f]] {
            let err = refusal(
                head(frame::HEADERS, frame::END_HEADERS, 1, block.len()),
                &block,
            );
            assert!(matches!(err, FrontError::Hpack { .. }), "{err}");
        }

        let mut r = HeaderRewriter::new();
        let mut out = Vec::new();
        r.header_frame(&head(frame::HEADERS, 0, 1, 1), &[0x82], &mut out)
            .unwrap();
        // Inside a header block only its own CONTINUATION may come.
        let err = r.check_order(&head(0x0, 0, 1, 0)).unwrap_err();
        assert!(matches!(
            err,
            FrontError::ContinuationExpected { kind: 0, .. }
        ));
        let err = r
            .check_order(&head(frame::CONTINUATION, 0, 3, 0))
            .unwrap_err();
        assert!(matches!(
            err,
            FrontError::ContinuationExpected { open: 1, .. }
        ));
        let piece = vec![0x82; MAX_HEADER_BLOCK];
        let err = r
            .header_frame(
                &head(frame::CONTINUATION, 0, 1, piece.len()),
                &piece,
                &mut out,
            )
            .unwrap_err();
        assert!(matches!(err, FrontError::BlockTooLarge { stream: 1 }));
        assert!(out.is_empty());
    }

    #[test]
    fn a_header_list_that_expands_past_the_cap_is_refused() {
        // One 4000-byte entry in the table, then referenced again and again.
        let mut block = vec![0x40, 1, b'x'];
        push_integer(&mut block, 4000, 7, 0);
        block.extend(std::iter::repeat_n(b'v', 4000));
        block.extend(std::iter::repeat_n(0x80 | 62, 300));
        let err = refusal(
            head(frame::HEADERS, frame::END_HEADERS, 1, block.len()),
            &block,
        );
        assert!(
            matches!(err, FrontError::ListTooLarge { stream: 1 }),
            "{err}"
        );
    }
}
