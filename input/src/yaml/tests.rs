//! Tests of the strict YAML reader: duplicate keys, nesting depth, aliases, big integers, field
//! paths, and cutting streams and kubectl lists into documents.

use super::*;
use serde::Deserialize;

#[test]
fn duplicate_keys_are_refused_with_key_and_line() {
    let e = documents("roceDscp: 26\nroceDscp: 30\n").expect_err("duplicate");
    assert!(e.message.contains("duplicate key \"roceDscp\""), "{e}");
    assert_eq!(e.line, Some(2), "{e}");
    let e = documents("spec:\n  a: 1\nspec:\n  b: 2\n").expect_err("second spec");
    assert!(e.message.contains("duplicate key \"spec\""), "{e}");
    // Same key in different mappings is fine.
    documents("a:\n  x: 1\nb:\n  x: 2\n").expect("distinct mappings");
}

#[test]
fn deep_flow_nesting_is_refused_before_parsing() {
    let n = 40_000;
    let text = format!("{}1{}", "[{\"a\": ".repeat(n), "}]".repeat(n));
    let t = std::time::Instant::now();
    let e = documents(&text).expect_err("too deep");
    assert!(e.message.contains("nested deeper than 100 levels"), "{e}");
    // Not a timing assertion on the product: a sanity bound far above the linear scan's cost
    // that the old quadratic path (31 s) could never meet.
    assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
    let ok = format!("{}1{}", "[".repeat(50), "]".repeat(50));
    documents(&ok).expect("50 levels are fine");
}

#[test]
fn brackets_that_are_not_structure_are_not_counted() {
    let text = format!(
        "a: x{}\nb: \"{}\"\n# {}\nc: '{}'\n",
        "[".repeat(200),
        "{".repeat(200),
        "[".repeat(200),
        "[".repeat(200)
    );
    documents(&text).expect("plain, quoted and comment brackets");
}

#[test]
fn multi_byte_text_and_plain_scalars_do_not_confuse_the_scan() {
    // A comment and a quoted value in Japanese and French before the document marker.
    let text = "# DGXノード用\na: 'é'\nb: \"ü\"\n---\nc: 1\n";
    assert_eq!(documents(text).expect("valid").len(), 2);
    // An apostrophe inside a plain value opens nothing: deep nesting after it is still seen.
    let deep = format!(
        "x: rock 'n roll\nspec: {}1{}\n",
        "[".repeat(500),
        "]".repeat(500)
    );
    let e = documents(&deep).expect_err("deep after an apostrophe");
    assert!(e.message.contains("nested deeper than"), "{e}");
    // Unbalanced brackets inside plain values (kubectl writes `fix [WIP` unquoted) are text.
    let wip = "note: fix [WIP\n";
    let many: String = (0..300).map(|i| format!("k{i}: fix [WIP {{x\n")).collect();
    documents(&format!("{wip}{many}")).expect("plain brackets are not nesting");
    // Brackets in block scalars are text too.
    let block = format!("a: |\n  {}\n\n  - [x\nb: 1\n", "[".repeat(300));
    documents(&block).expect("block scalar");
    let folded = format!("- >-\n    {}\n- 2\n", "{".repeat(300));
    documents(&folded).expect("folded block scalar in a sequence");
}

#[test]
fn aliases_cannot_expand_a_small_text_without_bound() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let prev = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    let e = documents(&text).expect_err("10^9 strings from 1 KB");
    assert!(e.message.contains("excessive aliasing"), "{e}");
    // A few aliases, as hand-written YAML uses them, are fine.
    documents("a: &x {k: v}\nb: *x\nc: *x\n").expect("modest aliasing");
}

#[test]
fn deep_block_nesting_is_refused_by_the_parser_quickly() {
    let text = format!("{}1\n", "- ".repeat(100_000));
    documents(&text).expect_err("recursion limit");
}

#[test]
fn integers_beyond_64_bits_reach_the_schema_as_numbers() {
    let docs = documents("maxRegions: 18446744073709551616\n").expect("parses");
    let v = docs[0]["maxRegions"].as_f64().expect("a number");
    assert!(v > u64::MAX as f64 * 0.99);
}

#[test]
fn typed_errors_name_the_path() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct T {
        spec: S,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct S {
        ports: Vec<u16>,
    }
    let e = from_str::<T>("spec:\n  ports: [1, x]\n").expect_err("x is no port");
    assert!(
        e.to_string().starts_with("spec.ports[1]: invalid type"),
        "{e}"
    );
}

#[test]
fn streams_are_cut_at_document_markers() {
    let docs = split_documents("# c\n---\na: 1\n---\n---\nb: |\n  x\n--- {c: 1}\n");
    let lines: Vec<usize> = docs.iter().map(|d| d.0).collect();
    assert_eq!(lines, [2, 4, 5, 8]);
    assert_eq!(docs[0].1, "\na: 1\n");
    assert_eq!(docs[3].1, " {c: 1}\n");
    assert_eq!(split_documents("a: 1\n").len(), 1);
    let e = shift_lines(
        YamlError {
            document: 1,
            message: "bad at line 2 column 3".into(),
            line: Some(2),
            column: Some(3),
        },
        10,
        2,
    );
    assert_eq!(
        (e.message.as_str(), e.line),
        ("bad at line 12 column 5", Some(12))
    );
}

#[test]
fn kubectl_lists_are_cut_into_items_that_parse_alone() {
    let doc = "apiVersion: v1\nitems:\n- kind: Pod\n  metadata:\n    name: a\n  data: |\n    x\n\n    y\n# note\n-\n  kind: Pod\nkind: List\nmetadata: {}\n";
    let list = split_list(doc, 1).expect("kubectl layout");
    assert_eq!(
        list.head,
        format!(
            "apiVersion: v1\nitems: []\n{}kind: List\nmetadata: {{}}\n",
            "\n".repeat(10)
        )
    );
    assert_eq!(
        list.head.lines().count(),
        doc.lines().count(),
        "lines still count"
    );
    assert_eq!(list.items.len(), 2);
    assert_eq!(list.items[0].0, 3);
    assert_eq!(list.items[1], (11, "\nkind: Pod\n".to_string()));
    let whole = &documents(doc).expect("valid")[0]["items"];
    for (i, (_, text)) in list.items.iter().enumerate() {
        assert_eq!(&documents(text).expect("item parses")[0], &whole[i]);
    }
    // Indented entries (yq, hand-written) are cut as well.
    let indented = "items:\n  - kind: A\n    x: 1\n  - kind: B\nkind: List\n";
    let list = split_list(indented, 1).expect("indented entries");
    assert_eq!((list.items.len(), list.dedent), (2, 4));
    assert_eq!(list.items[0].1, "kind: A\nx: 1\n");
    assert!(split_list("kind: Pod\n", 1).is_none());
    assert!(
        split_list("items:\n  a: 1\n", 1).is_none(),
        "not a sequence"
    );
}

#[test]
fn duplicate_keys_are_found_in_their_own_mapping() {
    let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    name: x\n  annotations:\n    name: y\n  name: a\n  namespace: b\n  name: b\n";
    let e = documents(text).expect_err("metadata.name twice");
    assert_eq!(e.line, Some(10), "{e}");
    assert!(
        e.message
            .starts_with("metadata: duplicate key \"name\" at line 10"),
        "{e}"
    );
}

#[test]
fn multi_document_streams_keep_their_numbering() {
    let docs = documents("a: 1\n---\n---\nb: 2\n").expect("three docs");
    assert_eq!(docs.len(), 3);
    assert!(docs[1].is_null());
    let e = documents("a: 1\n---\nb: [\n").expect_err("bad second doc");
    assert_eq!(e.document, 2, "{e}");
    let deep = format!("a: 1\n---\nb: {}\n", "[".repeat(200));
    assert_eq!(documents(&deep).expect_err("deep").document, 2);
}
