//! How the binaries print an error for a person: one line, causes included, no repeats.

/// The error and its causes on one line, skipping a cause whose text the message before it
/// already carries (library errors often quote their source in their own message).
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot load {0}: {1}")]
    struct Quoting(&'static str, #[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("plan failed")]
    struct Outer(#[source] Quoting);

    #[test]
    fn causes_follow_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Outer(Quoting("/nope", io));
        assert_eq!(one_line(&e), "plan failed: cannot load /nope: no such file");
    }
}
