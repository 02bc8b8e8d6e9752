//! A raw HTTP/2 gRPC client over a unix socket, framing and HPACK-encoding by hand what grpcurl and
//! grpcio put on the wire (Huffman strings, dynamic-table indexing, any `:authority`), so tests can
//! send exactly those bytes and read back every frame.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use httlib_hpack::{Decoder, Encoder};
use rocefabric_h2_authority::{FRAME_HEADER_LEN, FrameHeader, PREFACE, frame, write_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub const OPTIONS_PATH: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
/// Upper bound for one answer; only reached when a test fails.
const WAIT: Duration = Duration::from_secs(5);
/// The encoding of grpc-go and grpcio: Huffman, incremental indexing, the table searched first.
const CLIENT_FLAGS: u8 =
    Encoder::HUFFMAN_NAME | Encoder::HUFFMAN_VALUE | Encoder::WITH_INDEXING | Encoder::BEST_FORMAT;

/// One unary call's answer.
#[derive(Debug, Default)]
pub struct Response {
    pub headers: BTreeMap<String, String>,
    /// The DATA payloads joined (gRPC length-prefixed messages).
    pub data: Vec<u8>,
    pub trailers: BTreeMap<String, String>,
}

pub struct Client {
    stream: UnixStream,
    encoder: Encoder<'static>,
    decoder: Decoder<'static>,
}

impl Client {
    /// Connect and send the preface and an empty SETTINGS frame, as every client does first.
    pub async fn connect(socket: &Path) -> Self {
        let mut stream = UnixStream::connect(socket).await.expect("connect");
        let mut hello = PREFACE.to_vec();
        hello.extend(frame_bytes(SETTINGS, 0, 0, &[]));
        stream.write_all(&hello).await.expect("preface");
        Self {
            stream,
            encoder: Encoder::default(),
            decoder: Decoder::default(),
        }
    }

    /// The header block of a unary gRPC request, in grpcio's field order.
    pub fn request_block(&mut self, path: &str, authority: &str) -> Vec<u8> {
        let fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        let mut block = Vec::new();
        for (name, value) in fields {
            self.encoder
                .encode(
                    (
                        name.as_bytes().to_vec(),
                        value.as_bytes().to_vec(),
                        CLIENT_FLAGS,
                    ),
                    &mut block,
                )
                .expect("encode");
        }
        block
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// HEADERS with `block` on `stream`, then a DATA frame with one empty gRPC message and
    /// END_STREAM.
    pub async fn unary(&mut self, stream: u32, block: &[u8]) -> Response {
        let mut bytes = frame_bytes(frame::HEADERS, frame::END_HEADERS, stream, block);
        bytes.extend(empty_message(stream));
        self.send(&bytes).await;
        self.response(stream).await
    }

    /// Read frames until `stream` ends, answering SETTINGS; panics on a reset or GOAWAY.
    pub async fn response(&mut self, stream: u32) -> Response {
        let mut response = Response::default();
        loop {
            let (head, payload) = tokio::time::timeout(WAIT, self.read_frame())
                .await
                .expect("a frame in time")
                .expect("connection open");
            match head.kind {
                SETTINGS if head.flags & ACK == 0 => {
                    self.send(&frame_bytes(SETTINGS, ACK, 0, &[])).await;
                }
                RST_STREAM => panic!(
                    "stream {} reset, error code {:?}",
                    head.stream,
                    u32::from_be_bytes(payload[..4].try_into().expect("4 bytes"))
                ),
                GOAWAY => panic!("GOAWAY: {payload:?}"),
                frame::HEADERS if head.stream == stream => {
                    assert_ne!(
                        head.flags & frame::END_HEADERS,
                        0,
                        "one-frame header blocks"
                    );
                    let fields = self.decode(&payload);
                    if response.headers.is_empty() {
                        response.headers = fields;
                    } else {
                        response.trailers = fields;
                    }
                }
                DATA if head.stream == stream => response.data.extend(&payload),
                _ => {}
            }
            if head.stream == stream && head.flags & frame::END_STREAM != 0 {
                return response;
            }
        }
    }

    /// Read whatever comes until the server closes the connection; panics if it stays open.
    pub async fn expect_closed(&mut self) {
        let mut sink = [0u8; 4096];
        let closed = tokio::time::timeout(WAIT, async {
            loop {
                match self.stream.read(&mut sink).await {
                    Ok(0) => return,
                    Ok(_) => {}
                    // Closed with our bytes unread: a reset rather than an end of stream.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                    Err(e) => panic!("read: {e}"),
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection stays open");
    }

    /// One frame; `None` at the end of the stream.
    async fn read_frame(&mut self) -> Option<(FrameHeader, Vec<u8>)> {
        let mut head = [0u8; FRAME_HEADER_LEN];
        match self.stream.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) => panic!("read: {e}"),
        }
        let head = FrameHeader::parse(&head);
        let mut payload = vec![0; head.len];
        self.stream.read_exact(&mut payload).await.expect("payload");
        Some((head, payload))
    }

    fn decode(&mut self, block: &[u8]) -> BTreeMap<String, String> {
        let mut block = block.to_vec();
        let mut fields = Vec::new();
        self.decoder
            .decode(&mut block, &mut fields)
            .expect("server's HPACK");
        fields
            .into_iter()
            .map(|(n, v, _)| {
                (
                    String::from_utf8(n).expect("UTF-8"),
                    String::from_utf8(v).expect("UTF-8"),
                )
            })
            .collect()
    }
}

pub fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, kind, flags, stream, payload);
    out
}

/// A DATA frame carrying one empty gRPC message (uncompressed, length 0), ending the stream.
pub fn empty_message(stream: u32) -> Vec<u8> {
    frame_bytes(DATA, frame::END_STREAM, stream, &[0, 0, 0, 0, 0])
}

/// `message` as a gRPC length-prefixed message.
pub fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}
