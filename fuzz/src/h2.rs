//! The device plugin's `:authority` front: HTTP/2 frames from any client, header blocks decoded
//! with the client's HPACK table and encoded again. Raw bytes in (what follows the preface).

use rocefabric_h2_authority::frame::{self, FRAME_HEADER_LEN, FrameHeader};
use rocefabric_h2_authority::{HeaderRewriter, MAX_FRAME_SIZE};

/// Split `bytes` into frames (the last may be cut short and is dropped).
fn frames(bytes: &[u8]) -> Vec<(FrameHeader, &[u8])> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= FRAME_HEADER_LEN {
        let (head, tail) = rest.split_at(FRAME_HEADER_LEN);
        let head = FrameHeader::parse(head.try_into().unwrap_or_else(|_| unreachable!()));
        if tail.len() < head.len {
            break;
        }
        let (payload, tail) = tail.split_at(head.len);
        out.push((head, payload));
        rest = tail;
    }
    out
}

/// Whatever the client sends, what goes to the server is well framed (no frame over the default
/// maximum size, each block HEADERS then CONTINUATIONs of its stream, END_HEADERS on the last),
/// decodes with an empty HPACK table (the rewriter never indexes), and carries only authorities
/// the server's parser accepts. Refused input stops the connection; nothing panics.
pub fn h2_front(data: &[u8]) {
    let mut rewriter = HeaderRewriter::new();
    let mut sent = Vec::new();
    for (head, payload) in frames(data) {
        if head.kind != frame::HEADERS && head.kind != frame::CONTINUATION {
            continue;
        }
        if rewriter.header_frame(&head, payload, &mut sent).is_err() {
            break;
        }
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut block = Vec::new();
    let mut open: Option<u32> = None;
    let out = frames(&sent);
    let framed: usize = out.iter().map(|(_, p)| FRAME_HEADER_LEN + p.len()).sum();
    assert_eq!(framed, sent.len(), "bytes outside whole frames");
    for (head, payload) in out {
        assert!(head.len <= MAX_FRAME_SIZE, "frame of {} bytes", head.len);
        match open {
            None => {
                assert_eq!(head.kind, frame::HEADERS, "a block starts with HEADERS");
                assert_eq!(head.flags & frame::PADDED, 0, "padding is dropped");
                assert_ne!(head.stream, 0);
                let skip = if head.flags & frame::PRIORITY != 0 {
                    5
                } else {
                    0
                };
                block.extend_from_slice(&payload[skip..]);
            }
            Some(stream) => {
                assert_eq!(head.kind, frame::CONTINUATION);
                assert_eq!(head.stream, stream);
                block.extend_from_slice(payload);
            }
        }
        open = Some(head.stream);
        if head.flags & frame::END_HEADERS != 0 {
            let fields = decoder
                .decode(&block)
                .unwrap_or_else(|e| panic!("the rewritten block does not decode: {e:?}"));
            for (name, value) in fields {
                if name == b":authority" {
                    assert!(http::uri::Authority::try_from(value.as_slice()).is_ok());
                }
            }
            block.clear();
            open = None;
        }
    }
    assert!(open.is_none(), "a block left without END_HEADERS");
}
