//! The client's byte stream, read one whole, checked message at a time. A message whose header
//! declares more than the server's limit is refused as soon as its length has arrived, before
//! its body is buffered (the protocol layer would buffer any message up to PostgreSQL's 1 GiB);
//! a message whose length cannot hold its header, or whose body does not have the layout its
//! type requires (strings terminated, counts and lengths matching what follows, nothing left
//! over), is refused before the protocol layer decodes it, as PostgreSQL refuses it with
//! 08P01.
//!
//! The first messages of a connection (SSLRequest, GSSENCRequest, the startup message, a
//! CancelRequest) are a length and a code; every message after the startup message is a type
//! byte and a length. The check sits on the plain byte stream, so under TLS it belongs above
//! the TLS layer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// SSLRequest and GSSENCRequest: after either, the next message is untyped too.
const NEGOTIATION_CODES: [u32; 2] = [80877103, 80877104];

/// A CancelRequest: a process id and a key (of 4 to 256 bytes, which the protocol layer checks).
const CANCEL_CODE: u32 = 80877102;

/// How much is read from the socket at a time.
const READ_BYTES: usize = 8192;

/// Why a message is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Violation {
    /// Longer than the server's limit (54000).
    TooLong { length: u64, limit: usize },
    /// Too short to hold its own header (08P01).
    TooShort { length: u64 },
    /// A body without the layout of its type (08P01).
    Malformed {
        message: &'static str,
        reason: &'static str,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::TooLong { length, limit } => write!(
                f,
                "a message of {length} bytes exceeds the limit of {limit} bytes (message_bytes_max)"
            ),
            Violation::TooShort { length } => write!(f, "invalid message length {length}"),
            Violation::Malformed { message, reason } => {
                write!(f, "invalid {message} message: {reason}")
            }
        }
    }
}

impl std::error::Error for Violation {}

/// A stream that hands its reader only whole messages that passed the checks.
pub struct Checked<S> {
    inner: S,
    limit: usize,
    /// Whether the startup message has gone by (messages are typed from then on).
    typed: bool,
    /// Bytes read from the socket and not yet handed on.
    pending: BytesMut,
    /// How many bytes at the front of `pending` are whole, checked messages.
    ready: usize,
    /// Set once a message is refused: every later read fails with it.
    refused: bool,
}

impl<S> Checked<S> {
    pub fn new(inner: S, limit: usize) -> Checked<S> {
        Checked {
            inner,
            limit,
            typed: false,
            pending: BytesMut::new(),
            ready: 0,
            refused: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The stream, once every byte read from it has been handed on; `None` if some is still
    /// held (a client that sent more after an SSLRequest, before TLS began).
    pub fn into_inner(self) -> Option<S> {
        self.pending.is_empty().then_some(self.inner)
    }

    /// The length of the whole message at the front of what is not yet ready, once it has
    /// arrived and passed the checks.
    fn next_message(&mut self) -> Result<Option<usize>, Violation> {
        let rest = &self.pending[self.ready..];
        let at = usize::from(self.typed);
        let header = if self.typed { 5 } else { 8 };
        let Some(field) = rest.get(at..at + 4) else {
            return Ok(None);
        };
        // The length counts itself (and, untyped, the code).
        let length = u64::from(u32::from_be_bytes([field[0], field[1], field[2], field[3]]));
        if length > self.limit as u64 {
            return Err(Violation::TooLong {
                length,
                limit: self.limit,
            });
        }
        if length < (header - at) as u64 {
            return Err(Violation::TooShort { length });
        }
        let total = at + length as usize;
        let Some(message) = rest.get(..total) else {
            return Ok(None);
        };
        if self.typed {
            check_layout(message[0], &message[header..])?;
        } else {
            let code = u32::from_be_bytes([message[4], message[5], message[6], message[7]]);
            let negotiation = NEGOTIATION_CODES.contains(&code);
            if negotiation && length != 8 {
                return Err(Violation::Malformed {
                    message: "SSLRequest or GSSENCRequest",
                    reason: "unexpected data at the end of the message",
                });
            }
            if code != CANCEL_CODE && !negotiation {
                check_startup(&message[header..])?;
            }
            self.typed = !negotiation;
        }
        Ok(Some(total))
    }
}

/// Reads a message body field by field.
struct Fields<'a> {
    message: &'static str,
    body: &'a [u8],
}

impl<'a> Fields<'a> {
    fn malformed(&self, reason: &'static str) -> Violation {
        Violation::Malformed {
            message: self.message,
            reason,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Violation> {
        if self.body.len() < n {
            return Err(self.malformed("insufficient data left in message"));
        }
        let (head, tail) = self.body.split_at(n);
        self.body = tail;
        Ok(head)
    }

    fn string(&mut self) -> Result<(), Violation> {
        match self.body.iter().position(|b| *b == 0) {
            Some(end) => {
                self.body = &self.body[end + 1..];
                Ok(())
            }
            None => Err(self.malformed("a string is not terminated")),
        }
    }

    fn count(&mut self) -> Result<usize, Violation> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn int32(&mut self) -> Result<i32, Violation> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A count of 16-bit or 32-bit items and the items.
    fn array(&mut self, item_bytes: usize) -> Result<(), Violation> {
        let n = self.count()?;
        self.take(n * item_bytes).map(|_| ())
    }

    /// A count of values, each a length (-1 for NULL) and that many bytes.
    fn values(&mut self) -> Result<(), Violation> {
        for _ in 0..self.count()? {
            match self.int32()? {
                -1 => {}
                n if n < 0 => return Err(self.malformed("invalid value length")),
                n => {
                    self.take(n as usize)?;
                }
            }
        }
        Ok(())
    }

    fn end(&self) -> Result<(), Violation> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(self.malformed("unexpected data at the end of the message"))
        }
    }
}

/// Checks that `body` has the layout a message of type `kind` requires (PostgreSQL's
/// "Message Formats"); types not listed are left to the protocol layer.
fn check_layout(kind: u8, body: &[u8]) -> Result<(), Violation> {
    let message = match kind {
        b'Q' => "Query",
        b'f' => "CopyFail",
        b'P' => "Parse",
        b'B' => "Bind",
        b'E' => "Execute",
        b'D' => "Describe",
        b'C' => "Close",
        b'F' => "FunctionCall",
        b'S' => "Sync",
        b'H' => "Flush",
        b'X' => "Terminate",
        b'c' => "CopyDone",
        _ => "",
    };
    let mut f = Fields { message, body };
    match kind {
        // Query, CopyFail.
        b'Q' | b'f' => f.string()?,
        // Parse: name, query, parameter types.
        b'P' => {
            f.string()?;
            f.string()?;
            f.array(4)?;
        }
        // Bind: portal, statement, parameter formats, values, result formats.
        b'B' => {
            f.string()?;
            f.string()?;
            f.array(2)?;
            f.values()?;
            f.array(2)?;
        }
        // Execute: portal, row limit.
        b'E' => {
            f.string()?;
            f.int32()?;
        }
        // Describe, Close: 'S' or 'P', and a name.
        b'D' | b'C' => {
            if !matches!(f.take(1)?, b"S" | b"P") {
                return Err(f.malformed("neither a statement ('S') nor a portal ('P')"));
            }
            f.string()?;
        }
        // FunctionCall: function, argument formats, arguments, result format.
        b'F' => {
            f.int32()?;
            f.array(2)?;
            f.values()?;
            f.take(2)?;
        }
        // Sync, Flush, Terminate, CopyDone.
        b'S' | b'H' | b'X' | b'c' => {}
        _ => return Ok(()),
    }
    f.end()
}

/// Checks a startup message's parameters (after its length and protocol version): pairs of
/// strings, then an empty string, and nothing after it.
fn check_startup(body: &[u8]) -> Result<(), Violation> {
    let mut f = Fields {
        message: "startup",
        body,
    };
    while f.body.first() != Some(&0) {
        f.string()?;
        f.string()?;
    }
    f.take(1)?;
    f.end()
}

impl<S: AsyncRead + Unpin> AsyncRead for Checked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.refused {
                return Poll::Ready(Err(io::Error::other("the connection refused a message")));
            }
            if this.ready > 0 {
                let n = this.ready.min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                this.ready -= n;
                return Poll::Ready(Ok(()));
            }
            match this.next_message() {
                Ok(Some(n)) => {
                    this.ready = n;
                    continue;
                }
                Ok(None) => {}
                Err(v) => {
                    this.refused = true;
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, v)));
                }
            }
            let mut chunk = [0u8; READ_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The client closed its side; a partial message is dropped with it.
                return Poll::Ready(Ok(()));
            }
            this.pending.extend_from_slice(read.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Checked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A message of `length` bytes with this code and zeros after it (an empty startup
    /// message's parameters end at its last byte).
    fn untyped(length: u32, code: u32) -> Vec<u8> {
        let mut m = length.to_be_bytes().to_vec();
        m.extend(code.to_be_bytes());
        m.resize(length as usize, 0);
        m
    }

    fn startup(parameters: &[u8]) -> Vec<u8> {
        let mut m = (parameters.len() as u32 + 8).to_be_bytes().to_vec();
        m.extend(196608u32.to_be_bytes());
        m.extend(parameters);
        m
    }

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend((body.len() as u32 + 4).to_be_bytes());
        m.extend(body);
        m
    }

    /// What a reader of `stream`, sent in pieces of `piece` bytes, gets before the first
    /// refusal, and the refusal.
    async fn read(stream: &[u8], piece: usize, limit: usize) -> (Vec<u8>, Option<Violation>) {
        let (mut client, server) = tokio::io::duplex(64);
        let pieces: Vec<Vec<u8>> = stream.chunks(piece).map(<[u8]>::to_vec).collect();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for p in pieces {
                if client.write_all(&p).await.is_err() {
                    break;
                }
            }
        });
        let mut checked = Checked::new(server, limit);
        let mut out = Vec::new();
        let mut buf = [0u8; 100];
        let refusal = loop {
            match checked.read(&mut buf).await {
                Ok(0) => break None,
                Ok(n) => out.extend(&buf[..n]),
                Err(e) => {
                    let v = e.into_inner().and_then(|e| e.downcast::<Violation>().ok());
                    break Some(*v.expect("a violation"));
                }
            }
        };
        writer.abort();
        (out, refusal)
    }

    fn good_stream() -> Vec<u8> {
        let mut stream = untyped(8, 80877103); // SSLRequest
        stream.extend(startup(b"user\0weir\0\0")); // startup
        stream.extend(typed(b'Q', b"SELECT 1\0"));
        stream.extend(typed(b'P', b"s\0SELECT $1\0\x00\x01\x00\x00\x00\x17"));
        let mut bind = b"\0s\0\x00\x01\x00\x01\x00\x02".to_vec();
        bind.extend(b"\x00\x00\x00\x04\x00\x00\x00\x2a\xff\xff\xff\xff\x00\x00");
        stream.extend(typed(b'B', &bind));
        stream.extend(typed(b'D', b"P\0"));
        stream.extend(typed(b'E', b"\0\x00\x00\x00\x00"));
        stream.extend(typed(b'S', b""));
        stream.extend(typed(b'X', b""));
        stream
    }

    #[tokio::test]
    async fn whole_messages_pass_unchanged_in_any_pieces() {
        let stream = good_stream();
        for piece in [1, 2, 3, 5, 7, 64, stream.len()] {
            assert_eq!(read(&stream, piece, 1000).await, (stream.clone(), None));
        }
    }

    #[tokio::test]
    async fn a_long_message_is_refused_at_its_header() {
        let mut stream = startup(b"user\0weir\0\0");
        stream.extend(typed(b'Q', b"SELECT 1\0"));
        let before = stream.len();
        // Only the header of the long one: its body never needs to arrive.
        stream.extend([b'Q', 0x40, 0, 0, 0]);
        let too_long = Violation::TooLong {
            length: 0x4000_0000,
            limit: 1000,
        };
        for piece in [1, 3, stream.len()] {
            let (out, refusal) = read(&stream, piece, 1000).await;
            assert_eq!((out.len(), refusal.as_ref()), (before, Some(&too_long)));
        }
    }

    #[tokio::test]
    async fn a_length_that_cannot_hold_its_header_is_refused_when_it_arrives() {
        let (_, refusal) = read(&[0, 0, 0, 7], 1, 1000).await;
        assert_eq!(refusal, Some(Violation::TooShort { length: 7 }));
        let mut stream = startup(b"user\0weir\0\0");
        stream.extend([b'Q', 0, 0, 0, 3]);
        let (_, refusal) = read(&stream, 1, 1000).await;
        assert_eq!(refusal, Some(Violation::TooShort { length: 3 }));
    }

    #[test]
    fn bodies_without_their_layout_are_refused() {
        let malformed = |kind: u8, body: &[u8]| match check_layout(kind, body) {
            Err(Violation::Malformed { .. }) => {}
            other => panic!("{} {body:?}: {other:?}", kind as char),
        };
        malformed(b'Q', b"SELECT 1");
        malformed(b'Q', b"SELECT 1\0x");
        malformed(b'P', b"s\0SELECT 1\0\x00\x02\x00\x00\x00\x17");
        malformed(b'B', b"\0s\0\x00\x00\x00\x01\x00\x00\x00\x09ab\x00\x00");
        malformed(b'B', b"\0s\0\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x00");
        malformed(b'B', b"\0s\0\xff\xff");
        malformed(b'E', b"\0\x00\x00");
        malformed(b'D', b"X\0");
        malformed(b'C', b"S");
        malformed(b'S', b"x");
        assert_eq!(check_layout(b'B', b"\0s\0\x00\x00\x00\x00\x00\x00"), Ok(()));
        assert_eq!(check_layout(b'd', b"any bytes"), Ok(()));
        assert_eq!(check_startup(b"user\0weir\0\0"), Ok(()));
        for bad in [&b""[..], b"user\0weir\0", b"user\0weir\0\0\0", b"user\0\0"] {
            assert!(check_startup(bad).is_err(), "{bad:?}");
        }
    }
}
