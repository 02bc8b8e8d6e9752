//! One rejected field of an object, as both the structural checks ([`crate::structural`]) and
//! the full validation ([`crate::validate`]) report it.

/// One rejected field: where, and why (the rule's message or the schema violation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `spec.qos.rocePriority`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}
