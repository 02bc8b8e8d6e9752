//! Label selectors as the API server parses them from `labelSelector`: `key`, `!key`,
//! `key=value` (or `==`), `key!=value`, `key in (a,b)`, `key notin (a,b)`; a comma is AND.

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// Why a selector was refused (answered 400, as the API server does).
#[derive(Debug, thiserror::Error)]
#[error("invalid label selector {text:?}: {why}")]
pub struct SelectorError {
    text: String,
    why: &'static str,
}

impl Selector {
    /// Parse `text` (already URL-decoded).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let err = |why| SelectorError {
            text: text.to_string(),
            why,
        };
        let mut out = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::Absent(key.trim().to_string())
            } else if let Some((key, values)) = set_term(term, " notin ") {
                Requirement::NotIn(key, values.ok_or_else(|| err("notin needs (values)"))?)
            } else if let Some((key, values)) = set_term(term, " in ") {
                Requirement::In(key, values.ok_or_else(|| err("in needs (values)"))?)
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotIn(key.trim().to_string(), vec![value.trim().to_string()])
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                Requirement::In(key.trim().to_string(), vec![value.trim().to_string()])
            } else {
                Requirement::Exists(term.to_string())
            };
            let key = match &req {
                Requirement::Exists(k)
                | Requirement::Absent(k)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _) => k,
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(err("a requirement needs one key"));
            }
            out.push(req);
        }
        Ok(Self(out))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|req| match req {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            // As in Kubernetes: a missing key satisfies `!=` and `notin`.
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Split at the commas that are not inside `( )`.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

/// `key <op> (a,b)`: the key, and the values when the parenthesised list is well formed.
fn set_term(term: &str, op: &str) -> Option<(String, Option<Vec<String>>)> {
    let (key, rest) = term.split_once(op)?;
    let values = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .map(|list| list.split(',').map(|v| v.trim().to_string()).collect());
    Some((key.trim().to_string(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_and_conjunction() {
        let l = labels(&[("rocefabric.io/fabric", "scale"), ("tier", "web")]);
        let yes = [
            "",
            "rocefabric.io/fabric",
            "!missing",
            "tier=web",
            "tier==web",
            "tier!=db",
            "missing!=x",
            "tier in (db, web)",
            "tier notin (db,cache)",
            "rocefabric.io/fabric=scale,tier in (web)",
        ];
        for s in yes {
            assert!(
                Selector::parse(s).unwrap().matches(&l),
                "{s:?} should match"
            );
        }
        let no = [
            "missing",
            "!tier",
            "tier=db",
            "tier!=web",
            "tier in (db)",
            "tier notin (web)",
            "rocefabric.io/fabric=scale,tier=db",
        ];
        for s in no {
            assert!(
                !Selector::parse(s).unwrap().matches(&l),
                "{s:?} should not match"
            );
        }
    }

    #[test]
    fn malformed_sets_are_refused() {
        assert!(Selector::parse("tier in db").is_err());
        assert!(Selector::parse("a b").is_err());
    }
}
