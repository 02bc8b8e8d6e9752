//! A JSON document taken apart into its top-level fields and list items, each parsed on its own
//! from a slice: serde_json's slice reader runs 2-3 times its `io::Read` reader's speed. The
//! input is read a chunk at a time into one buffer (or borrowed whole), so memory is a chunk
//! plus the largest value, and each value is bounded by its length before it is built.
//!
//! serde_json tells where each value ends (its stream reader's byte offset), so the bytes are
//! scanned once. What lies around the values (`{`, keys, `:`, `,`, `[`, `]`) is walked here,
//! with serde_json's messages and places: an error reads as a whole-file parse gives it, line
//! and column counted in the whole file.

use std::io::Read;

use rocefabric_input::shown;
use rocefabric_input::yaml::Strict;
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde_json::{Map, Value};

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// Why a document could not be taken apart.
#[derive(Debug, thiserror::Error)]
pub(super) enum SplitError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("line {line} column {column}: {reason}")]
    Syntax {
        line: u64,
        column: u64,
        reason: String,
    },
    /// A value longer than its limit, starting at this place (`item`: its index in the list).
    #[error("line {line} column {column}: a value over its limit")]
    TooLarge {
        item: Option<usize>,
        line: u64,
        column: u64,
    },
}

/// A walk stopped: by the document, or by what was done with one of its items.
#[derive(Debug)]
pub(super) enum Stop<E> {
    Split(SplitError),
    Item(E),
}

impl<E> From<SplitError> for Stop<E> {
    fn from(e: SplitError) -> Self {
        Stop::Split(e)
    }
}

/// The top-level value of a document, once its items were handed out.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Top {
    /// The top-level object's fields but `items` (`None` for a top-level array or `null`).
    pub(super) fields: Option<Map<String, Value>>,
    /// Whether there were items: an object's `items`, or a top-level array.
    pub(super) items: bool,
}

/// The bytes of one document, with the place in the file of what is read next.
pub(super) struct Split<'a> {
    input: Input<'a>,
    /// The next byte to read, in `data()`.
    pos: usize,
    /// The file offset of `data()[0]`.
    base: u64,
    /// Lines are counted up to here, in `data()`: `line` is the line there, which starts at
    /// file offset `line_start`.
    counted: usize,
    line: u64,
    line_start: u64,
    chunk: usize,
}

enum Input<'a> {
    Slice(&'a [u8]),
    Read {
        reader: &'a mut dyn Read,
        buf: Vec<u8>,
        eof: bool,
    },
}

impl<'a> Split<'a> {
    /// A document held whole (borrowed, not copied).
    pub(super) fn slice(bytes: &'a [u8]) -> Self {
        Self::new(Input::Slice(bytes), 1, 0, CHUNK)
    }

    /// A document read from `reader`, which is at `column` of `line` of its file.
    pub(super) fn reader(reader: &'a mut dyn Read, line: u64, column: u64) -> Self {
        Self::with_chunk(reader, line, column, CHUNK)
    }

    fn with_chunk(reader: &'a mut dyn Read, line: u64, column: u64, chunk: usize) -> Self {
        let input = Input::Read {
            reader,
            buf: Vec::new(),
            eof: false,
        };
        Self::new(input, line, column, chunk)
    }

    fn new(input: Input<'a>, line: u64, column: u64, chunk: usize) -> Self {
        // Offsets only ever tell columns apart: a base of `column` puts the line's start at 0.
        Split {
            input,
            pos: 0,
            base: column,
            counted: 0,
            line,
            line_start: 0,
            chunk,
        }
    }

    fn data(&self) -> &[u8] {
        match &self.input {
            Input::Slice(s) => s,
            Input::Read { buf, .. } => buf,
        }
    }

    fn eof(&self) -> bool {
        match &self.input {
            Input::Slice(_) => true,
            Input::Read { eof, .. } => *eof,
        }
    }

    /// Read the next chunk, first dropping what was read (its lines counted).
    fn fill(&mut self) -> std::io::Result<()> {
        if self.eof() {
            return Ok(());
        }
        self.count_lines(self.pos);
        let (pos, chunk) = (self.pos, self.chunk);
        let Input::Read { reader, buf, eof } = &mut self.input else {
            return Ok(());
        };
        buf.drain(..pos);
        buf.reserve(chunk);
        let n = (&mut **reader).take(chunk as u64).read_to_end(buf)?;
        // `read_to_end` stops short only at the end of the input.
        *eof = n < chunk;
        self.base += pos as u64;
        self.pos = 0;
        self.counted = 0;
        Ok(())
    }

    fn count_lines(&mut self, to: usize) {
        let (line, line_start) = self.place_of(to);
        (self.line, self.line_start, self.counted) = (line, line_start, to);
    }

    /// The line at `at` (in `data()`, not before `counted`), and the file offset it starts at.
    fn place_of(&self, at: usize) -> (u64, u64) {
        let seen = &self.data()[self.counted..at];
        let n = newlines(seen);
        if n == 0 {
            // No need to look for the last one: a file on one line has none to find.
            return (self.line, self.line_start);
        }
        let last = seen.iter().rposition(|&b| b == b'\n').unwrap_or(0);
        (self.line + n, self.base + (self.counted + last + 1) as u64)
    }

    /// Line and column (bytes into the line, as serde_json counts) of `at`, in `data()`.
    fn position(&self, at: usize) -> (u64, u64) {
        let (line, start) = self.place_of(at);
        (line, self.base + at as u64 - start)
    }

    /// The next byte that is not whitespace, not consumed; `None` at the end.
    fn peek(&mut self) -> Result<Option<u8>, SplitError> {
        loop {
            let data = self.data();
            match data[self.pos..]
                .iter()
                .position(|b| !matches!(b, b' ' | b'\n' | b'\t' | b'\r'))
            {
                Some(i) => {
                    self.pos += i;
                    return Ok(Some(self.data()[self.pos]));
                }
                None if self.eof() => {
                    self.pos = data.len();
                    return Ok(None);
                }
                None => {
                    self.pos = data.len();
                    self.fill()?;
                }
            }
        }
    }

    fn bump(&mut self) {
        self.pos += 1;
    }

    /// An error at the byte just peeked, placed as serde_json places it.
    fn peek_error(&self, reason: &str) -> SplitError {
        let (line, column) = self.position((self.pos + 1).min(self.data().len()));
        SplitError::Syntax {
            line,
            column,
            reason: reason.to_string(),
        }
    }

    /// An error after the last byte read.
    fn error(&self, reason: String) -> SplitError {
        let (line, column) = self.position(self.pos);
        SplitError::Syntax {
            line,
            column,
            reason,
        }
    }

    /// Parse the value that starts here, of at most `limit` bytes. `after` is what serde_json
    /// says of a stray byte right after a number or literal here (its stream reader says
    /// "trailing characters" instead).
    fn value<T: DeserializeOwned>(
        &mut self,
        limit: usize,
        after: &str,
        item: Option<usize>,
    ) -> Result<T, SplitError> {
        // Only a number can go on past what was read so far.
        let delimited = matches!(self.data().get(self.pos), Some(b'{' | b'[' | b'"'));
        loop {
            let data = self.data();
            let end = data.len().min(self.pos.saturating_add(limit));
            let window = &data[self.pos..end];
            // Nothing more can come into the window: what serde_json says of it is final.
            let whole = end == data.len() && self.eof();
            let mut values = serde_json::Deserializer::from_slice(window).into_iter::<T>();
            let outcome = values.next();
            let used = values.byte_offset();
            let capped = window.len() >= limit;
            match outcome {
                Some(Ok(v)) if delimited || used < window.len() || whole => {
                    self.pos += used;
                    return Ok(v);
                }
                Some(Err(e)) if whole => return Err(self.located(&e, after)),
                // Capped by the limit: too large, unless serde_json stopped well before the end.
                Some(Err(e)) if capped && !near_end(&e, window) => {
                    return Err(self.located(&e, after));
                }
                None if whole => return Err(self.peek_error("EOF while parsing a value")),
                _ if capped => {
                    let (line, column) = self.position(self.pos);
                    return Err(SplitError::TooLarge { item, line, column });
                }
                // Any other error may be the window's end cutting the value: read on.
                _ => self.fill()?,
            }
        }
    }

    /// serde_json's error `e` of the value that starts here, placed in the file.
    fn located(&self, e: &serde_json::Error, after: &str) -> SplitError {
        let (line, column) = self.position(self.pos);
        let (line, column) = match (e.line() as u64, e.column() as u64) {
            (0, _) => (line, column),
            (1, c) => (line, column + c),
            (l, c) => (line + l - 1, c),
        };
        let message = e.to_string();
        let reason = match message.rfind(" at line ") {
            Some(i) => &message[..i],
            None => &message,
        };
        let reason = if reason == "trailing characters" {
            after
        } else {
            reason
        };
        SplitError::Syntax {
            line,
            column,
            reason: reason.to_string(),
        }
    }
}

/// How many `\n` `bytes` holds: summed in bytes, 64 at a time, which the compiler vectorizes
/// (a count straight into a `usize` widens each byte and runs several times slower).
fn newlines(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(64);
    let mut n = 0;
    for chunk in &mut chunks {
        n += u64::from(chunk.iter().map(|&b| u8::from(b == b'\n')).sum::<u8>());
    }
    n + chunks.remainder().iter().filter(|&&b| b == b'\n').count() as u64
}

/// Whether serde_json's error `e` is at the end of `window` (as when the value went on past it).
fn near_end(e: &serde_json::Error, window: &[u8]) -> bool {
    let line_start = match e.line() {
        0 => return true,
        1 => 0,
        l => match window
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(l - 2)
        {
            Some((i, _)) => i + 1,
            None => return true,
        },
    };
    line_start + e.column() + 8 >= window.len()
}

/// Walk the document: each item of a top-level array, or of the top-level object's `items`, is
/// parsed (at most `item_limit` bytes) and handed to `item` with its index; the object's other
/// fields are read strictly, all of them together at most `item_limit` bytes before the items
/// and as many after, and returned.
pub(super) fn walk<T: DeserializeOwned, E>(
    split: &mut Split<'_>,
    item_limit: usize,
    mut item: impl FnMut(usize, T) -> Result<(), E>,
) -> Result<Top, Stop<E>> {
    let top = match split.peek()? {
        None => return Err(split.peek_error("EOF while parsing a value").into()),
        Some(b'{') => {
            split.bump();
            object(split, item_limit, &mut item)?
        }
        Some(b'[') => {
            split.bump();
            list(split, item_limit, &mut item)?;
            Top {
                fields: None,
                items: true,
            }
        }
        Some(_) => {
            split.value::<NotAnObject>(item_limit, "trailing characters", None)?;
            Top::default()
        }
    };
    match split.peek()? {
        None => Ok(top),
        Some(_) => Err(split.peek_error("trailing characters").into()),
    }
}

/// The top-level object, after its `{`.
fn object<T: DeserializeOwned, E>(
    split: &mut Split<'_>,
    item_limit: usize,
    item: &mut impl FnMut(usize, T) -> Result<(), E>,
) -> Result<Top, Stop<E>> {
    const AFTER: &str = "expected `,` or `}`";
    let mut fields = Map::new();
    let mut items = false;
    // Where the bytes counted against the limit began: the `{`, then the end of the items.
    let mut start = split.base + split.pos as u64 - 1;
    let mut first = true;
    loop {
        let budget = |split: &Split<'_>| {
            let used = split.base + split.pos as u64 - start;
            item_limit.saturating_sub(usize::try_from(used).unwrap_or(usize::MAX))
        };
        let Some(peek) = split.peek()? else {
            return Err(split.peek_error("EOF while parsing an object").into());
        };
        if peek == b'}' {
            split.bump();
            return Ok(Top {
                fields: Some(fields),
                items,
            });
        }
        if first {
            first = false;
            if peek != b'"' {
                return Err(split.peek_error("key must be a string").into());
            }
        } else if peek == b',' {
            split.bump();
            match split.peek()? {
                Some(b'"') => {}
                Some(b'}') => return Err(split.peek_error("trailing comma").into()),
                Some(_) => return Err(split.peek_error("key must be a string").into()),
                None => return Err(split.peek_error("EOF while parsing a value").into()),
            }
        } else {
            return Err(split.peek_error(AFTER).into());
        }
        let key: String = split.value(budget(split), AFTER, None)?;
        if fields.contains_key(&key) || (key == "items" && items) {
            return Err(split
                .error(format!("duplicate key {:?}", shown(&key)))
                .into());
        }
        match split.peek()? {
            Some(b':') => split.bump(),
            Some(_) => return Err(split.peek_error("expected `:`").into()),
            None => return Err(split.peek_error("EOF while parsing an object").into()),
        }
        match split.peek()? {
            None => return Err(split.peek_error("EOF while parsing a value").into()),
            Some(b'[') if key == "items" => {
                split.bump();
                list(split, item_limit, item)?;
                items = true;
                start = split.base + split.pos as u64;
            }
            Some(_) if key == "items" => {
                split.value::<NotAList>(budget(split), AFTER, None)?;
            }
            Some(_) => {
                let StrictValue(value) = split.value(budget(split), AFTER, None)?;
                fields.insert(key, value);
            }
        }
    }
}

/// A list of items, after its `[`.
fn list<T: DeserializeOwned, E>(
    split: &mut Split<'_>,
    item_limit: usize,
    item: &mut impl FnMut(usize, T) -> Result<(), E>,
) -> Result<(), Stop<E>> {
    const AFTER: &str = "expected `,` or `]`";
    let mut i = 0;
    loop {
        let Some(peek) = split.peek()? else {
            return Err(split.peek_error("EOF while parsing a list").into());
        };
        if peek == b']' {
            split.bump();
            return Ok(());
        }
        if i > 0 {
            if peek != b',' {
                return Err(split.peek_error(AFTER).into());
            }
            split.bump();
            match split.peek()? {
                Some(b']') => return Err(split.peek_error("trailing comma").into()),
                Some(_) => {}
                None => return Err(split.peek_error("EOF while parsing a value").into()),
            }
        }
        let value = split.value(item_limit, AFTER, Some(i))?;
        item(i, value).map_err(Stop::Item)?;
        i += 1;
    }
}

/// A value read strictly (duplicate keys refused), as every object.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Strict.deserialize(d).map(StrictValue)
    }
}

/// What a top-level value other than an object or array may be: `null` (nothing), else the
/// error naming what it is.
struct NotAnObject;

impl<'de> Deserialize<'de> for NotAnObject {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NotAnObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Kubernetes object or List")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NotAnObject, E> {
                Ok(NotAnObject)
            }
        }
        d.deserialize_any(V)
    }
}

/// `items` that are not an array: always the error naming what they are.
struct NotAList;

impl<'de> Deserialize<'de> for NotAList {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NotAList;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of objects")
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests;
