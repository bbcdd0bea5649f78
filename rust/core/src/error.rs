//! The one error type of the core. The binding maps each variant to a named
//! Python exception (`impl From<CoreError> for PyErr` in `rust/python`).

use std::fmt;

/// Every failure the core reports on purpose. A call that returns an error
/// has left the scheduler's state exactly as it was before the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreError {
    /// A configuration field, or a combination of fields, is invalid.
    InvalidConfig { field: &'static str, value: String, reason: String },
    /// An argument of a request-level call is invalid.
    InvalidRequest { field: String, value: String, reason: String },
    /// `add_request` with the id of a request that is still live.
    DuplicateRequest { request_id: String },
    /// A request id that is not live.
    UnknownRequest { request_id: String },
    /// A runner output that does not match the step it answers, or a step
    /// applied twice or out of order.
    OutputMismatch { reason: String },
    /// `check_invariants` found a broken invariant.
    Invariant { reason: String },
}

impl CoreError {
    pub(crate) fn config(field: &'static str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        Self::InvalidConfig { field, value: value.to_string(), reason: reason.into() }
    }

    pub(crate) fn request(field: impl Into<String>, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        Self::InvalidRequest { field: field.into(), value: value.to_string(), reason: reason.into() }
    }

    pub(crate) fn mismatch(reason: impl Into<String>) -> Self {
        Self::OutputMismatch { reason: reason.into() }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig { field, value, reason } => write!(f, "{field}={value}: {reason}"),
            Self::InvalidRequest { field, value, reason } => write!(f, "{field}={value}: {reason}"),
            Self::DuplicateRequest { request_id } => {
                write!(f, "request_id={request_id:?}: a live request already has this id")
            }
            Self::UnknownRequest { request_id } => {
                write!(f, "request_id={request_id:?}: no live request has this id")
            }
            Self::OutputMismatch { reason } => f.write_str(reason),
            Self::Invariant { reason } => write!(f, "invariant broken: {reason}"),
        }
    }
}

impl std::error::Error for CoreError {}

pub type CoreResult<T> = Result<T, CoreError>;
