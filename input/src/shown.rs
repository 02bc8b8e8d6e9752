//! Values made safe to print: control characters escaped (a crafted name cannot forge a table row
//! or a log line, nor send terminal escapes) and long values cut, saying how long they were.

use std::fmt::Write as _;

/// Longest value quoted in a log line or table cell, in characters.
pub const MAX_SHOWN_CHARS: usize = 64;

/// `value` escaped and cut to [`MAX_SHOWN_CHARS`].
pub fn shown(value: &str) -> String {
    shown_within(value, MAX_SHOWN_CHARS)
}

/// `value` with control characters escaped (`\n`, `\u{1b}`), cut to `max` characters of output
/// with `…(N bytes)` when longer.
pub fn shown_within(value: &str, max: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for (i, c) in value.char_indices() {
        let piece: String = if c.is_control() || invisible(c) {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        let n = piece.chars().count();
        if chars + n > max {
            let _ = write!(out, "…({} bytes)", value.len());
            debug_assert!(i < value.len());
            return out;
        }
        chars += n;
        out.push_str(&piece);
    }
    out
}

/// Characters that change how a line reads without showing: bidirectional overrides and
/// isolates, zero-width characters, line and paragraph separators, the byte order mark.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(shown("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
        assert_eq!(shown("plain-name"), "plain-name");
        assert_eq!(
            shown("a\u{202e}b"),
            "a\\u{202e}b",
            "a bidi override cannot reorder the line"
        );
        assert_eq!(shown("ノード"), "ノード");
    }

    #[test]
    fn long_values_are_cut_saying_their_length() {
        let long = "x".repeat(100_000);
        let s = shown(&long);
        assert!(s.chars().count() < MAX_SHOWN_CHARS + 20, "{s}");
        assert!(s.ends_with("…(100000 bytes)"), "{s}");
        assert_eq!(shown_within("abcdef", 6), "abcdef");
        assert_eq!(shown_within("abcdefg", 6), "abcdef…(7 bytes)");
    }

    #[test]
    fn escapes_count_toward_the_cut() {
        let s = shown_within(&"\n".repeat(10), 4);
        assert_eq!(s, "\\n\\n…(10 bytes)");
    }
}
