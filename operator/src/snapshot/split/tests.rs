use super::*;
use proptest::prelude::*;
use serde::de::{MapAccess, SeqAccess};

/// A document as one parse of the whole text reads it (as the streaming reader this replaces
/// did): what the split must give, values and errors alike.
#[derive(Clone, Debug, PartialEq)]
struct Whole {
    top: Top,
    items: Vec<Value>,
}

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WholeVisitor)
    }
}

struct WholeVisitor;

impl<'de> Visitor<'de> for WholeVisitor {
    type Value = Whole;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object or List")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Whole, E> {
        Ok(Whole {
            top: Top::default(),
            items: Vec::new(),
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Whole, A::Error> {
        Ok(Whole {
            top: Top {
                fields: None,
                items: true,
            },
            items: ItemsVisitor.visit_seq(seq)?,
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Whole, A::Error> {
        let (mut fields, mut items) = (Map::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            if fields.contains_key(&key) || (key == "items" && items.is_some()) {
                return Err(de::Error::custom(format!(
                    "duplicate key {:?}",
                    shown(&key)
                )));
            }
            if key == "items" {
                items = Some(map.next_value_seed(ItemsVisitor)?);
            } else {
                fields.insert(key, map.next_value_seed(Strict)?);
            }
        }
        Ok(Whole {
            top: Top {
                fields: Some(fields),
                items: items.is_some(),
            },
            items: items.unwrap_or_default(),
        })
    }
}

struct ItemsVisitor;

impl<'de> DeserializeSeed<'de> for ItemsVisitor {
    type Value = Vec<Value>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsVisitor {
    type Value = Vec<Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of objects")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(out)
    }
}

fn whole(bytes: &[u8]) -> Result<Whole, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// A reader that gives at most `step` bytes a call.
struct Trickle<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn message(e: SplitError) -> String {
    match e {
        SplitError::Syntax {
            line,
            column,
            reason,
        } => format!("{reason} at line {line} column {column}"),
        other => format!("{other:?}"),
    }
}

fn walked(mut split: Split<'_>, limit: usize) -> Result<Whole, String> {
    let mut items = Vec::new();
    let top = walk(&mut split, limit, |i, v: Value| {
        assert_eq!(i, items.len(), "items come in order");
        items.push(v);
        Ok::<(), ()>(())
    })
    .map_err(|stop| match stop {
        Stop::Split(e) => message(e),
        Stop::Item(()) => unreachable!("no item is refused"),
    })?;
    Ok(Whole { top, items })
}

/// `bytes` split in chunks of `chunk` bytes, read `step` bytes at a time.
fn split(bytes: &[u8], chunk: usize, step: usize) -> Result<Whole, String> {
    let mut reader = Trickle { bytes, step };
    walked(Split::with_chunk(&mut reader, 1, 0, chunk), usize::MAX / 4)
}

const LIST: &str = "{\"apiVersion\": \"v1\",\n \"items\": [\n  \
    {\"kind\": \"Pod\", \"n\": 12345678},\n  [1, 2.5e3, -7],\n  \
    \"a \\\"quoted\\\" \\u00e9 string\",\n  12345678901234,\n  true, null\n ],\n \
    \"kind\": \"List\", \"metadata\": {\"continue\": \"tok\"}}\n";

#[test]
fn values_are_split_alike_across_chunks_of_every_size() {
    let expected = whole(LIST.as_bytes()).expect("valid");
    assert_eq!(expected.items.len(), 6);
    for chunk in 1..=LIST.len() + 1 {
        for step in [1, 3, 4096] {
            assert_eq!(
                split(LIST.as_bytes(), chunk, step).as_ref(),
                Ok(&expected),
                "chunk {chunk} step {step}"
            );
        }
    }
    assert_eq!(walked(Split::slice(LIST.as_bytes()), 1 << 20), Ok(expected));
}

#[test]
fn malformed_structure_is_named_with_line_and_column() {
    let cases = [
        ("", "EOF while parsing a value at line 1 column 0"),
        ("  \n", "EOF while parsing a value at line 2 column 0"),
        (
            "{\"items\": [\"abc",
            "EOF while parsing a string at line 1 column 15",
        ),
        (
            "{\"items\": [{\"a\": 1}]",
            "EOF while parsing an object at line 1 column 20",
        ),
        (
            "{\"items\": [1]}}",
            "trailing characters at line 1 column 15",
        ),
        ("[1 2]", "expected `,` or `]` at line 1 column 4"),
        ("[1x]", "expected `,` or `]` at line 1 column 3"),
        ("{\"a\": 1x}", "expected `,` or `}` at line 1 column 8"),
        ("nullx", "trailing characters at line 1 column 5"),
        ("[1,]", "trailing comma at line 1 column 4"),
        ("{\"a\" 1}", "expected `:` at line 1 column 6"),
        ("{a: 1}", "key must be a string at line 1 column 2"),
        (
            "{\"kind\": 1,\n \"kind\": 2}",
            "duplicate key \"kind\" at line 2 column 7",
        ),
        (
            "{\"items\": [], \"items\": []}",
            "duplicate key \"items\" at line 1 column 21",
        ),
        (
            "{\"items\": {}}",
            "invalid type: map, expected a list of objects at line 1 column 10",
        ),
        (
            "\"x\"",
            "invalid type: string \"x\", expected a Kubernetes object or List at line 1 column 3",
        ),
        (
            "[{},\n {\"a\": [1, 2}]",
            "expected `,` or `]` at line 2 column 13",
        ),
    ];
    for (text, error) in cases {
        assert_eq!(whole(text.as_bytes()), Err(error.to_string()), "{text:?}");
        for chunk in [1, 2, 5, 64] {
            assert_eq!(
                split(text.as_bytes(), chunk, 1),
                Err(error.to_string()),
                "{text:?} in chunks of {chunk}"
            );
        }
    }
    // `null` is an empty document.
    assert_eq!(split(b" null ", 2, 1).map(|w| w.top), Ok(Top::default()));
}

#[test]
fn places_count_from_where_the_reader_starts() {
    let mut reader = Trickle {
        bytes: b"[1,\n  2 3]",
        step: 64,
    };
    let e = walked(Split::reader(&mut reader, 3, 4), 1 << 20);
    assert_eq!(e, Err("expected `,` or `]` at line 4 column 5".to_string()));
    let mut reader = Trickle {
        bytes: b"[[1, x]]",
        step: 64,
    };
    let e = walked(Split::reader(&mut reader, 3, 4), 1 << 20);
    assert_eq!(e, Err("expected value at line 3 column 10".to_string()));
}

#[test]
fn a_value_over_its_limit_is_refused_before_it_is_parsed_whole() {
    let too_large = |text: &str, limit| {
        let mut reader = Trickle {
            bytes: text.as_bytes(),
            step: 3,
        };
        let mut split = Split::with_chunk(&mut reader, 1, 0, 4);
        walk(&mut split, limit, |_, _: Value| Ok::<(), ()>(()))
    };
    let e = too_large("[{\"a\": 1},\n {\"a\": \"0123456789\"}]", 16);
    assert!(
        matches!(
            e,
            Err(Stop::Split(SplitError::TooLarge {
                item: Some(1),
                line: 2,
                column: 1
            }))
        ),
        "{e:?}"
    );
    // A number as long as the limit may go on: refused too.
    let e = too_large("[1234567890123456789]", 8);
    assert!(
        matches!(e, Err(Stop::Split(SplitError::TooLarge { .. }))),
        "{e:?}"
    );
    // The fields before the items count together, and again after them.
    let e = too_large("{\"a\": \"0123\", \"b\": \"0123\", \"items\": []}", 24);
    assert!(
        matches!(
            e,
            Err(Stop::Split(SplitError::TooLarge {
                item: None,
                column: 19,
                ..
            }))
        ),
        "{e:?}"
    );
    let ok = too_large("{\"a\": \"01\", \"items\": [], \"b\": \"0123\"}", 20);
    assert!(ok.is_ok(), "{ok:?}");
    // A syntax error well inside the limit is that error, not a size.
    let e = too_large("[{\"a\" 1, \"b\": \"0123456789012345678901234567\"}]", 32);
    let Err(Stop::Split(e)) = e else {
        panic!("{e:?}")
    };
    assert_eq!(message(e), "expected `:` at line 1 column 7");
}

#[test]
fn a_refused_item_stops_the_walk() {
    let mut split = Split::slice(b"[1, 2, 3]");
    let mut seen = Vec::new();
    let stop = walk(&mut split, 64, |i, v: Value| {
        seen.push(v);
        if i == 1 { Err("no") } else { Ok(()) }
    });
    assert!(matches!(stop, Err(Stop::Item("no"))), "{stop:?}");
    assert_eq!(seen, [1, 2]);
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        "[a-z \\\\\"\n\u{e9}\u{1f600}]{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A document's text: a List (its items among its fields), a bare array, or an object.
fn document() -> impl Strategy<Value = String> {
    let fields = prop::collection::btree_map("[a-z]{1,5}", value(), 0..4);
    let items = prop::collection::vec(value(), 0..8);
    (
        fields,
        items,
        0..3u8,
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(fields, items, shape, at, pretty)| {
            let text = |v: &Value| {
                if pretty {
                    serde_json::to_string_pretty(v).expect("serializes")
                } else {
                    v.to_string()
                }
            };
            let sep = if pretty { ",\n  " } else { "," };
            let list = format!("[{}]", items.iter().map(text).collect::<Vec<_>>().join(sep));
            if shape == 0 {
                return list;
            }
            let mut parts: Vec<String> = fields
                .iter()
                .filter(|(k, _)| *k != "items")
                .map(|(k, v)| format!("\"{k}\": {}", text(v)))
                .collect();
            if shape == 1 {
                let at = at.index(parts.len() + 1);
                parts.insert(at, format!("\"items\": {list}"));
            }
            format!("{{{}}}\n", parts.join(sep))
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: rocefabric_operator_testing::proptest_cases(),
        ..ProptestConfig::default()
    })]

    /// Any document, whole, cut short or with a byte changed, split in chunks of any size and
    /// read a few bytes at a time, gives what one parse of the whole text gives: the same
    /// values, or the same error at the same line and column.
    #[test]
    fn the_split_reads_as_one_whole_parse(
        doc in document(),
        edit in 0..3u8,
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(b"{}[],:\"\\ 1-.extn\n".to_vec()),
        chunk in 1..48usize,
        step in 1..8usize,
    ) {
        let mut bytes = doc.into_bytes();
        match edit {
            1 => bytes.truncate(at.index(bytes.len() + 1)),
            2 if !bytes.is_empty() => {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            _ => {}
        }
        let expected = whole(&bytes);
        prop_assert_eq!(split(&bytes, chunk, step), expected.clone());
        prop_assert_eq!(walked(Split::slice(&bytes), usize::MAX / 4), expected);
    }
}
