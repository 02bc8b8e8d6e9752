//! A front between a plugin socket and its gRPC server that accepts any `:authority`.
//!
//! The kubelet sends `:authority: localhost`, but grpcurl, grpcio and grpc-java send the socket
//! path, which `http::uri::Authority` refuses; h2 then resets every stream of such a client with
//! PROTOCOL_ERROR ("malformed authority"), so no debugging tool could talk to our sockets.
//!
//! Each accepted connection is relayed to the server over an in-memory pipe. Client to server,
//! the front reads HTTP/2 frames: every header block (HEADERS and its CONTINUATIONs) is decoded
//! with an HPACK decoder that mirrors the client's encoder, an authority that does not parse
//! becomes `localhost`, and the block is encoded again as literals without indexing. The server's
//! decoder table therefore stays empty and can never disagree with the client's. Every other
//! frame, and everything server to client, passes through byte for byte. A client that breaks
//! the framing or the HPACK rules loses its connection; buffering is capped per header block.
//!
//! - [`frame`]: the preface, frame headers and the flags looked at.
//! - [`rewrite`]: header blocks decoded, mended and framed again ([`HeaderRewriter`]).
//! - here: the accept loop, the two directions of a connection and the frame pump between them.

use std::convert::Infallible;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

pub mod frame;
pub mod rewrite;

pub use frame::{FRAME_HEADER_LEN, FrameHeader, MAX_FRAME_SIZE, PREFACE, write_frame};
pub use rewrite::{HeaderRewriter, MAX_HEADER_BLOCK, MAX_HEADER_LIST};

/// Capacity of the in-memory pipe between a client's front and the server, each way.
const PIPE_CAPACITY: usize = 64 * 1024;
/// Read buffer on the client side; one default-sized frame fits.
const READ_BUFFER: usize = MAX_FRAME_SIZE + FRAME_HEADER_LEN;
/// Pause after a failed `accept` (out of file descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why a client's connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error("not an HTTP/2 client: the connection preface is missing")]
    NoPreface,
    #[error("the connection ended inside a frame")]
    Truncated,
    #[error("HEADERS frame on stream 0")]
    StreamZero,
    #[error("frame of type {kind:#x} on stream {stream} inside the header block of stream {open}")]
    ContinuationExpected { kind: u8, stream: u32, open: u32 },
    #[error("CONTINUATION on stream {stream} with no header block open")]
    StrayContinuation { stream: u32 },
    #[error("header block of stream {stream} over {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("padding of the HEADERS frame on stream {stream} longer than the frame")]
    BadPadding { stream: u32 },
    #[error("HEADERS frame on stream {stream} too short for its priority fields")]
    ShortPriority { stream: u32 },
    #[error("header block of stream {stream} does not decode: {source}")]
    Hpack {
        stream: u32,
        source: loona_hpack::decoder::DecoderError,
    },
    #[error("header list of stream {stream} over {MAX_HEADER_LIST} bytes once decoded")]
    ListTooLarge { stream: u32 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl FrontError {
    /// Whether the client broke the protocol (worth a warning), rather than went away.
    fn is_protocol(&self) -> bool {
        !matches!(self, Self::Truncated | Self::Io(_))
    }
}

/// Read one frame header; `None` at a clean end of the stream between frames.
async fn read_frame_header<R: AsyncRead + Unpin>(
    client: &mut R,
) -> Result<Option<FrameHeader>, FrontError> {
    let mut bytes = [0u8; FRAME_HEADER_LEN];
    let mut filled = 0;
    while filled < bytes.len() {
        match client.read(&mut bytes[filled..]).await? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(FrontError::Truncated),
            n => filled += n,
        }
    }
    Ok(Some(FrameHeader::parse(&bytes)))
}

/// Copy client to server, rewriting header blocks. Returns at the client's clean end of stream.
pub async fn client_to_server<R, W>(client: R, server: &mut W) -> Result<(), FrontError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut client = tokio::io::BufReader::with_capacity(READ_BUFFER, client);
    let mut preface = [0u8; PREFACE.len()];
    let mut filled = 0;
    while filled < preface.len() {
        match client.read(&mut preface[filled..]).await? {
            // Connected and left without a word (a liveness probe): nothing to complain about.
            0 if filled == 0 => return Ok(()),
            0 => return Err(FrontError::NoPreface),
            n => filled += n,
        }
        if preface[..filled] != PREFACE[..filled] {
            return Err(FrontError::NoPreface);
        }
    }
    server.write_all(PREFACE).await?;

    let mut rewriter = HeaderRewriter::new();
    let mut payload = Vec::new();
    let mut out = Vec::new();
    while let Some(head) = read_frame_header(&mut client).await? {
        rewriter.check_order(&head)?;
        if head.kind == frame::HEADERS || head.kind == frame::CONTINUATION {
            if head.len > MAX_HEADER_BLOCK {
                return Err(FrontError::BlockTooLarge {
                    stream: head.stream,
                });
            }
            payload.resize(head.len, 0);
            read_payload(&mut client, &mut payload).await?;
            out.clear();
            rewriter.header_frame(&head, &payload, &mut out)?;
            server.write_all(&out).await?;
        } else {
            out.clear();
            head.write(&mut out);
            server.write_all(&out).await?;
            forward_payload(&mut client, server, head.len).await?;
        }
    }
    Ok(())
}

async fn read_payload<R: AsyncRead + Unpin>(
    client: &mut R,
    payload: &mut [u8],
) -> Result<(), FrontError> {
    match client.read_exact(payload).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrontError::Truncated),
        Err(e) => Err(e.into()),
    }
}

/// Stream a payload through without holding it (DATA frames may be up to 16 MiB).
async fn forward_payload<R, W>(client: &mut R, server: &mut W, len: usize) -> Result<(), FrontError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let len = len as u64;
    let copied = tokio::io::copy_buf(&mut client.take(len), server).await?;
    if copied < len {
        return Err(FrontError::Truncated);
    }
    Ok(())
}

/// Relay one client connection to the server's end of a pipe until either side is done. A
/// client that breaks the protocol is cut off; the server then sees its end of the pipe close.
pub async fn relay(client: UnixStream, server: DuplexStream) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let upstream = async {
        let result = client_to_server(client_read, &mut server_write).await;
        // Pass the client's end of stream on; the server may still answer.
        let _ = server_write.shutdown().await;
        result
    };
    let downstream = async {
        let result = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
        result
    };
    tokio::pin!(upstream, downstream);
    tokio::select! {
        result = &mut upstream => {
            match result {
                Ok(()) => {
                    if let Err(error) = downstream.await {
                        tracing::debug!(%error, "client connection ended");
                    }
                }
                Err(error) if error.is_protocol() => {
                    tracing::warn!(%error, "closing a client connection that broke HTTP/2");
                }
                Err(error) => tracing::debug!(%error, "client connection ended"),
            }
        }
        // The server closed: so does the client's connection, whatever it still sends.
        result = &mut downstream => {
            if let Err(error) = result {
                tracing::debug!(%error, "server side of a client connection ended");
            }
        }
    }
}

/// Accept clients on `listener`, relay each through a front and hand the server's end of its pipe
/// to `conns`. Stops accepting when `conns` closes (the server stopped taking connections) but
/// keeps driving the open fronts, so it never returns: drop it when the server is done, which
/// ends the fronts still running.
pub async fn accept(listener: UnixListener, conns: mpsc::Sender<DuplexStream>) -> Infallible {
    let mut fronts = JoinSet::new();
    let mut next_id: u64 = 0;
    loop {
        tokio::select! {
            () = conns.closed() => break,
            Some(_) = fronts.join_next(), if !fronts.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let (front_end, server_end) = tokio::io::duplex(PIPE_CAPACITY);
                    if conns.send(server_end).await.is_err() {
                        break;
                    }
                    next_id += 1;
                    let span = tracing::debug_span!("client", id = next_id);
                    fronts.spawn(relay(client, front_end).instrument(span));
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a client connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    drop(listener);
    while fronts.join_next().await.is_some() {}
    std::future::pending().await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::rewrite::tests::{
        authority_of, encode, frame_bytes, frames, request, server_decode,
    };
    use super::*;

    /// Run `client_to_server` with `input` as everything the client sends.
    async fn pump(input: &[u8]) -> (Result<(), FrontError>, Vec<u8>) {
        let mut server = Vec::new();
        let result = client_to_server(input, &mut server).await;
        (result, server)
    }

    #[tokio::test]
    async fn the_pump_forwards_other_frames_verbatim_and_rewrites_headers() {
        let mut encoder = httlib_hpack::Encoder::default();
        let settings = frame_bytes(0x4, 0, 0, &[0, 2, 0, 0, 0, 0]);
        let data = frame_bytes(0x0, frame::END_STREAM, 1, &[0, 0, 0, 0, 0]);
        let block = encode(&mut encoder, &request("/tmp/plugin.sock"));
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block));
        input.extend(&data);
        let (result, sent) = pump(&input).await;
        result.unwrap();
        let (preface, rest) = sent.split_at(PREFACE.len());
        assert_eq!(preface, PREFACE);
        let emitted = frames(rest);
        assert_eq!(emitted.len(), 3);
        assert_eq!(frame_bytes(0x4, 0, 0, &emitted[0].1), settings);
        assert_eq!(authority_of(&server_decode(&emitted[1..2])), "localhost");
        assert_eq!(frame_bytes(0x0, emitted[2].0.flags, 1, &emitted[2].1), data);
    }

    #[tokio::test]
    async fn the_pump_refuses_what_is_not_http2_and_cut_frames() {
        let (result, sent) = pump(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(matches!(result, Err(FrontError::NoPreface)));
        assert!(sent.is_empty());
        let (result, _) = pump(b"").await;
        result.unwrap();
        let mut cut = PREFACE.to_vec();
        cut.extend(frame_bytes(0x0, 0, 1, &[1, 2, 3, 4]));
        cut.truncate(cut.len() - 2);
        let (result, _) = pump(&cut).await;
        assert!(matches!(result, Err(FrontError::Truncated)));
        let mut big = PREFACE.to_vec();
        FrameHeader {
            len: MAX_HEADER_BLOCK + 1,
            kind: frame::HEADERS,
            flags: 0,
            stream: 1,
        }
        .write(&mut big);
        let (result, _) = pump(&big).await;
        assert!(matches!(result, Err(FrontError::BlockTooLarge { .. })));
    }
}
