//! YAML as strictly as `kubectl` and the API server read it.
//!
//! - A key given twice in one mapping is an error naming the key and line (`yaml_serde` into
//!   `serde_json::Value` would keep the last one silently, so `roceDscp: 26` then `roceDscp: 30`
//!   planned DSCP 30).
//! - Flow collections (`[`, `{`) nested deeper than [`MAX_DEPTH`] are refused by a linear scan
//!   *before* the parser runs: the parser's own recursion limit only applies after it has
//!   tokenized the document, which costs quadratic time in flow depth (40,000 levels: 31 s).
//! - Integers beyond 64 bits are kept as (inexact) floats so that the schema names the field as out
//!   of range, instead of the whole file failing as "invalid YAML".
//! - Typed reads name the field path of a bad value (`spec.nodeName: invalid type ...`).

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Deepest nesting of flow collections (`[`, `{`) accepted; block nesting is left to the parser's
/// own limit of 128, which it checks in linear time.
pub const MAX_DEPTH: usize = 100;

/// Why a YAML text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {document}: {message}")]
pub struct YamlError {
    /// 1-based document number in a multi-document stream.
    pub document: usize,
    /// The reason, with `at line L column C` where the parser knows it.
    pub message: String,
    /// 1-based line, where known.
    pub line: Option<usize>,
    /// 1-based column, where known.
    pub column: Option<usize>,
}

/// A value that does not fit the type it is read as, naming where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TypeError {
    /// Dotted path (`spec.containers[0].name`), `<root>` for the whole object.
    pub path: String,
    pub message: String,
}

/// Every document of `text` as JSON values, in order; an empty document (after a trailing `---`)
/// is `null`.
pub fn documents(text: &str) -> Result<Vec<Value>, YamlError> {
    with_alias_budget(text.len(), || documents_within_budget(text))
}

fn documents_within_budget(text: &str) -> Result<Vec<Value>, YamlError> {
    check_depth(text)?;
    let mut out = Vec::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        out.push(
            Strict
                .deserialize(doc)
                .map_err(|e| with_duplicate_line(yaml_error(i + 1, &e), text))?,
        );
    }
    Ok(out)
}

/// A single-document YAML text read as `T`, strictly; an empty text reads as `null`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let mut docs = documents(text)?;
    docs.retain(|d| !d.is_null());
    if docs.len() > 1 {
        return Err(Error::Yaml(YamlError {
            document: 2,
            message: "expected one YAML document, found more (`---`)".into(),
            line: None,
            column: None,
        }));
    }
    Ok(typed(docs.pop().unwrap_or(Value::Null))?)
}

/// Either failure of [`from_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid YAML: {0}")]
    Yaml(#[from] YamlError),
    #[error("{0}")]
    Type(#[from] TypeError),
}

/// `value` read as `T`, naming the path of the first field that does not fit.
pub fn typed<T: DeserializeOwned>(value: Value) -> Result<T, TypeError> {
    serde_path_to_error::deserialize(value).map_err(|e| TypeError {
        path: crate::shown::shown_within(&path_text(e.path()), MAX_MESSAGE_CHARS),
        message: crate::shown::shown_within(&e.into_inner().to_string(), MAX_MESSAGE_CHARS),
    })
}

/// `serde_path_to_error`'s path as `a.b[0].c`.
pub fn path_text(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => {}
        }
    }
    if out.is_empty() { "<root>".into() } else { out }
}

/// The parser's error, escaped and cut (it may quote a whole hostile value).
pub fn yaml_error(document: usize, e: &yaml_serde::Error) -> YamlError {
    YamlError {
        document,
        message: crate::shown::shown_within(&e.to_string(), MAX_MESSAGE_CHARS),
        line: e.location().map(|l| l.line()),
        column: e.location().map(|l| l.column()),
    }
}

/// Longest parser or type message passed on, in characters.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// The documents of a YAML stream as text, each with its first line's number (1-based): cut at
/// the `---` markers (a marker at column 0 ends a document wherever it stands). Text before the
/// first marker is a document only if it holds more than blank lines and comments.
pub fn split_documents(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let (mut start, mut start_line, mut at) = (0usize, 1usize, 0usize);
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let body = line.trim_end_matches(['\n', '\r']);
        if body == "---" || body.starts_with("--- ") || body.starts_with("---\t") {
            out.push((start_line, &text[start..at]));
            // The marker's line may carry content (`--- {a: 1}`): keep it, without the marker.
            start = at + 3;
            start_line = n + 1;
        }
        at += line.len();
    }
    out.push((start_line, &text[start..]));
    let blank = |d: &str| {
        d.lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    };
    if out.first().is_some_and(|(_, d)| blank(d)) {
        out.remove(0);
    }
    out
}

/// `e` with its line numbers (field and `at line N` in the message) moved down by `offset` and
/// its columns right by `columns`: for a piece of a larger text.
pub fn shift_lines(mut e: YamlError, offset: usize, columns: usize) -> YamlError {
    e.line = e.line.map(|l| l + offset);
    e.column = e.column.map(|c| c + columns);
    let mut message = String::with_capacity(e.message.len());
    let mut rest = e.message.as_str();
    // Each "line N" / "column N" in the message, in order.
    while let Some((i, word, add)) = [("line ", offset), ("column ", columns)]
        .iter()
        .filter_map(|(w, add)| rest.find(w).map(|i| (i, *w, *add)))
        .min_by_key(|(i, _, _)| *i)
    {
        let (before, after) = rest.split_at(i + word.len());
        message.push_str(before);
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        match after[..digits].parse::<usize>() {
            Ok(n) => message.push_str(&(n + add).to_string()),
            Err(_) => message.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    message.push_str(rest);
    e.message = message;
    e
}

/// A `kind: List` document as `kubectl get -o yaml` lays it out, cut into its items, so each can
/// be parsed on its own: the YAML parser holds a whole document in memory (about 25 times its
/// size), and a List of a large cluster is one document.
#[derive(Debug, PartialEq, Eq)]
pub struct ListText {
    /// The document with `items: []` in place of its items, and an empty line for each line of
    /// them, so that line numbers still count in the whole document.
    pub head: String,
    /// Each item's text, dedented, with its first line's number (1-based, in the whole text).
    pub items: Vec<(usize, String)>,
    /// How many columns the items were dedented by (their `- ` and its indentation).
    pub dedent: usize,
}

/// Cut `doc` (one document of a stream whose first line is line `first_line`) into a List's head
/// and items, when its `items:` key is at column 0 and followed by a block sequence (`- `
/// entries at one indentation, 0 as kubectl writes it, or more); `None` for any other layout
/// (parse it whole). Sound for valid YAML: inside an entry every line is indented further (or
/// blank, or a comment), so a line at the entries' indentation starts the next entry, and one
/// left of it ends the sequence.
pub fn split_list(doc: &str, first_line: usize) -> Option<ListText> {
    let lines: Vec<&str> = doc.split_inclusive('\n').collect();
    let start = lines.iter().position(|l| l.trim_end() == "items:")?;
    let blank_or_comment = |l: &str| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    };
    // The entries' indentation: that of the first line with content after `items:`.
    let first = lines[start + 1..].iter().find(|l| !blank_or_comment(l))?;
    let k = first.len() - first.trim_start_matches(' ').len();
    if !first[k..].starts_with('-') {
        return None;
    }
    let dedent = k + 2;
    let mut head = String::new();
    for l in &lines[..start] {
        head.push_str(l);
    }
    head.push_str("items: []\n");
    let mut items: Vec<(usize, String)> = Vec::new();
    let mut i = start + 1;
    while i < lines.len() {
        let body = lines[i].trim_end_matches(['\n', '\r']);
        let indent = body.len() - body.trim_start_matches(' ').len();
        let entry = &body[indent.min(body.len())..];
        if blank_or_comment(body) {
            // Kept as an empty line: block scalars keep blank lines, and lines still count.
            if let Some((_, text)) = items.last_mut() {
                text.push('\n');
            }
        } else if indent == k && (entry == "-" || entry.starts_with("- ")) {
            items.push((
                first_line + i,
                format!("{}\n", entry.get(2..).unwrap_or("")),
            ));
        } else if indent >= dedent {
            let (_, text) = items.last_mut()?;
            text.push_str(&body[dedent..]);
            text.push('\n');
        } else if indent == 0 && k == 0 || indent < k {
            break; // left of the entries: the sequence has ended
        } else {
            return None; // an indentation this cut does not know: parse whole
        }
        head.push('\n');
        i += 1;
    }
    if items.is_empty() {
        return None;
    }
    for l in &lines[i..] {
        head.push_str(l);
    }
    Some(ListText {
        head,
        items,
        dedent,
    })
}

/// The parser places a duplicate-key error at the start of its mapping; find the line of the
/// second occurrence of the key at the first one's indentation, so the message points at it.
pub fn with_duplicate_line(mut e: YamlError, text: &str) -> YamlError {
    let (Some(start), Some(column), Some(key)) = (
        e.line,
        e.column,
        e.message
            .split_once("duplicate key \"")
            .and_then(|(_, rest)| rest.split_once("\" at ").or_else(|| rest.rsplit_once('"')))
            .map(|(k, _)| k.to_string()),
    ) else {
        return e;
    };
    if key.len() > 1024 {
        return e; // a search per line for it would cost more than the answer is worth
    }
    // The keys of this mapping start at its first key's column.
    let indent = column.saturating_sub(1);
    let patterns = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ];
    let mut seen = false;
    for (n, l) in text.lines().enumerate().skip(start - 1) {
        let body = l.trim_start_matches([' ', '-']);
        let at = l.len() - body.len();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if at < indent && n + 1 > start {
            break; // left the mapping
        }
        if at != indent || !patterns.iter().any(|p| body.starts_with(p.as_str())) {
            continue;
        }
        if seen {
            e.line = Some(n + 1);
            // Keep the parser's path prefix (`metadata: `).
            let prefix = e.message.split("duplicate key").next().unwrap_or_default();
            e.message = format!(
                "{prefix}duplicate key \"{}\" at line {}",
                crate::shown(&key),
                n + 1
            );
            return e;
        }
        seen = true;
    }
    e
}

/// Refuse flow nesting deeper than [`MAX_DEPTH`] in one linear pass over the bytes (every YAML
/// indicator is ASCII, so multi-byte characters never look like one). Only a `[`, `{`, `"` or `'`
/// where a node can start opens anything: at a line start, after `- `, `: `, `? `, or inside a flow
/// collection after `[`, `{`, `,`, `:`. So brackets and apostrophes inside plain scalars
/// (`note: fix [WIP`, `rock 'n roll`), comments, quoted scalars and block scalars (`|`, `>`) are
/// not structure and not counted. Block nesting needs no scan: the parser handles it in linear
/// time.
pub fn check_depth(text: &str) -> Result<(), YamlError> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let (mut line, mut document) = (1usize, 1usize);
    // The last non-blank byte on this line, and whether blanks followed it.
    let mut last: Option<u8> = None;
    let mut spaced = false;
    // Inside a block scalar: the indentation of the line that opened it.
    let mut block: Option<usize> = None;
    let mut i = 0;
    while i < b.len() {
        if last.is_none() && !spaced && (i == 0 || b[i - 1] == b'\n') {
            // A line start: document markers, and block scalar content.
            let indent = b[i..].iter().take_while(|&&c| c == b' ').count();
            let blank = matches!(b.get(i + indent), None | Some(b'\n' | b'\r'));
            if let Some(open) = block {
                if blank || indent > open {
                    // Block scalar content: skip the line and its newline.
                    i = skip_line(b, i) + 1;
                    line += 1;
                    continue;
                }
                block = None;
            }
            if b[i..].starts_with(b"---")
                && matches!(b.get(i + 3), None | Some(b' ' | b'\t' | b'\n' | b'\r'))
            {
                document += usize::from(i > 0);
                depth = 0;
            }
        }
        let c = b[i];
        let node_start = match last {
            None => true,
            Some(b':' | b'-' | b'?') if spaced => true,
            Some(b'[' | b'{' | b',' | b':') => depth > 0,
            _ => false,
        };
        match c {
            b'\n' => {
                line += 1;
                last = None;
                spaced = false;
                i += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                spaced = true;
                i += 1;
                continue;
            }
            b'#' if last.is_none() || spaced => {
                i = skip_line(b, i);
                continue;
            }
            b'"' | b'\'' if node_start => {
                i += 1;
                while i < b.len() && b[i] != c {
                    match b[i] {
                        b'\n' => line += 1,
                        b'\\' if c == b'"' => i += 1,
                        _ => {}
                    }
                    i += 1;
                }
                // ('' inside single quotes is an escaped quote: the next round reopens it.)
            }
            b'|' | b'>' if node_start && depth == 0 => {
                let line_start = b[..i]
                    .iter()
                    .rposition(|&c| c == b'\n')
                    .map_or(0, |p| p + 1);
                block = Some(b[line_start..].iter().take_while(|&&c| c == b' ').count());
                i = skip_line(b, i);
                continue;
            }
            b'[' | b'{' if node_start => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(YamlError {
                        document,
                        message: format!("nested deeper than {MAX_DEPTH} levels at line {line}"),
                        line: Some(line),
                        column: None,
                    });
                }
            }
            b']' | b'}' if depth > 0 => depth -= 1,
            _ => {}
        }
        last = Some(c);
        spaced = false;
        i += 1;
    }
    Ok(())
}

/// The index of the `\n` ending the line that `i` is on (or the end).
fn skip_line(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |p| i + p)
}

thread_local! {
    /// Bytes of JSON the strict reader may still build on this thread: YAML aliases (`*a`) repeat
    /// a whole node, so a small text could expand without bound ("billion laughs").
    static ALIAS_BUDGET: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Run `f` (which parses `len` bytes of YAML) with the expansion of aliases bounded, as the
/// Kubernetes YAML reader bounds it: at most 16 times the text and 64 KiB more.
pub fn with_alias_budget<T>(len: usize, f: impl FnOnce() -> T) -> T {
    let budget = (len as u64).saturating_mul(16).saturating_add(64 << 10);
    let before = ALIAS_BUDGET.with(|b| b.replace(budget));
    let out = f();
    ALIAS_BUDGET.with(|b| b.set(before));
    out
}

/// Take `bytes` from the budget, or fail.
fn spend<E: de::Error>(bytes: usize) -> Result<(), E> {
    ALIAS_BUDGET.with(|b| match b.get().checked_sub(bytes as u64 + 8) {
        Some(left) => {
            b.set(left);
            Ok(())
        }
        None => Err(E::custom(
            "excessive aliasing: the YAML expands to more than 16 times its size",
        )),
    })
}

/// Reads any YAML (or JSON) node as a `serde_json::Value`, refusing duplicate keys and bounding
/// the expansion of aliases: a seed for callers that stream a document themselves.
#[derive(Clone, Copy, Debug)]
pub struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        spend(0)?;
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict.deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        spend(0)?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        spend(0)?;
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        spend(0)?;
        Ok(Value::Number(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        big(v as f64)
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        big(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{v} is not a number JSON can hold")))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        spend(v.len())?;
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        spend(v.len())?;
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        spend(0)?;
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        spend(0)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Strict)? {
            let key = match key {
                Value::String(s) => s,
                // YAML allows any scalar as a key; Kubernetes objects use strings (`1: x` is "1").
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null => "null".into(),
                _ => return Err(de::Error::custom("a mapping key must be a scalar")),
            };
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key \"{}\"",
                    crate::shown::shown_within(&key, 1024)
                )));
            }
            let value = map.next_value_seed(Strict)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

fn big<E: de::Error>(v: f64) -> Result<Value, E> {
    Number::from_f64(v)
        .map(Value::Number)
        .ok_or_else(|| E::custom("integer out of range"))
}

/// `Deserialize` for [`Value`] through the strict reader, for callers that hold a deserializer.
pub fn strict_value<'de, D: de::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Strict.deserialize(d)
}

#[cfg(test)]
mod tests;
