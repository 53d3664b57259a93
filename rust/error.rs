//! The one error type of the core. The bindings map each variant to one Python class of the
//! `kvcore.exceptions` hierarchy (one `From<KvError> for PyErr`, in `rust/py/`).

use std::fmt;

/// A caller mistake. Every fallible call returns it *before* mutating anything (or after undoing
/// what it did), so an `Err` always means "nothing changed".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// An argument out of its allowed range (negative or too large a count, empty input, ...).
    InvalidArgument(String),
    /// A page id out of `1..num_pages`, or the null page.
    InvalidPage(String),
    /// A page freed or retained while free, or listed more times than it has references.
    DoubleFree(String),
    /// A sequence id the manager does not hold.
    UnknownSequence(String),
    /// A sequence id the manager already holds.
    DuplicateSequence(String),
}

/// Result alias for the core.
pub type KvResult<T> = Result<T, KvError>;

impl KvError {
    /// The name of the Python exception class (in `kvcore.exceptions`) this error becomes.
    pub fn python_class(&self) -> &'static str {
        match self {
            KvError::InvalidArgument(_) => "InvalidArgumentError",
            KvError::InvalidPage(_) => "InvalidPageError",
            KvError::DoubleFree(_) => "DoubleFreeError",
            KvError::UnknownSequence(_) => "UnknownSequenceError",
            KvError::DuplicateSequence(_) => "DuplicateSequenceError",
        }
    }

    /// The human-readable message, without the variant name.
    pub fn message(&self) -> &str {
        match self {
            KvError::InvalidArgument(m)
            | KvError::InvalidPage(m)
            | KvError::DoubleFree(m)
            | KvError::UnknownSequence(m)
            | KvError::DuplicateSequence(m) => m,
        }
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.python_class(), self.message())
    }
}

impl std::error::Error for KvError {}
