//! Logging setup: `tracing` to stderr, filtered by an environment variable.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, the current span's fields flattened in.
    Json,
}

/// Install the global subscriber: stderr, filtered by `env_var` (`RUST_LOG` for the daemons), or
/// by `default_directive` (`info`, `warn`) when it is unset or invalid; coloured only when stderr
/// is a terminal. A subscriber installed earlier (a test, a second call) is kept.
pub fn init(env_var: &str, default_directive: &str, format: Format) {
    let filter =
        EnvFilter::try_from_env(env_var).unwrap_or_else(|_| EnvFilter::new(default_directive));
    // Colours only on a terminal: `kubectl logs` and log collectors get plain `key=value`.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        Format::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        Format::Text => builder.try_init(),
    };
}
