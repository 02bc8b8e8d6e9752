//! An answer other than success, as the API server sends it: a `Status` object.

use serde_json::{Value, json};

/// The `Status` body the API server sends with an error code.
pub fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

/// A request refused, with the code, reason and message of its `Status`.
#[derive(Debug, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct Failure {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(code: u16, reason: &'static str, message: &str) -> Self {
        Self {
            code,
            reason,
            message: message.to_string(),
        }
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(404, "NotFound", &format!("{what} not found"))
    }

    pub fn conflict(message: &str) -> Self {
        Self::new(409, "Conflict", message)
    }

    pub fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn internal(error: impl std::fmt::Display) -> Self {
        Self::new(500, "InternalError", &error.to_string())
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        status_body(self.code, self.reason, &self.message)
    }
}
