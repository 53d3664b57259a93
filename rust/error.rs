//! The one error type of the core. The bindings map each variant to one Python class of the
//! `kvcore.exceptions` hierarchy (one `From<KvError> for PyErr`, in `rust/py/`).

use std::fmt;

/// Why a call failed. Every fallible call returns it *before* mutating anything (or after undoing
/// what it did), so an `Err` always means "nothing changed". All variants but [`KvError::Internal`]
/// are caller mistakes or resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// An argument out of its allowed range (negative or too large a count, empty input, ...).
    InvalidArgument(String),
    /// An argument of the wrong type, dtype, shape or memory layout.
    InvalidDType(String),
    /// A page id out of `1..num_pages`, or the null page.
    InvalidPage(String),
    /// A page freed or retained while free, or listed more times than it has references.
    DoubleFree(String),
    /// A sequence id the manager does not hold.
    UnknownSequence(String),
    /// A sequence id the manager already holds.
    DuplicateSequence(String),
    /// A construction whose memory the process cannot get (fallible allocation failed).
    OutOfMemory(String),
    /// One of kvcore's own invariants is broken: a bug in kvcore, never the caller's mistake.
    Internal(String),
}

/// Result alias for the core.
pub type KvResult<T> = Result<T, KvError>;

impl KvError {
    /// The variant's name, as the Python class it becomes is named (`kvcore.exceptions`).
    pub fn kind(&self) -> &'static str {
        match self {
            KvError::InvalidArgument(_) => "InvalidArgumentError",
            KvError::InvalidDType(_) => "InvalidDTypeError",
            KvError::InvalidPage(_) => "InvalidPageError",
            KvError::DoubleFree(_) => "DoubleFreeError",
            KvError::UnknownSequence(_) => "UnknownSequenceError",
            KvError::DuplicateSequence(_) => "DuplicateSequenceError",
            KvError::OutOfMemory(_) => "OutOfMemoryError",
            KvError::Internal(_) => "InternalError",
        }
    }

    /// The human-readable message, without the variant name.
    pub fn message(&self) -> &str {
        match self {
            KvError::InvalidArgument(m)
            | KvError::InvalidDType(m)
            | KvError::InvalidPage(m)
            | KvError::DoubleFree(m)
            | KvError::UnknownSequence(m)
            | KvError::DuplicateSequence(m)
            | KvError::OutOfMemory(m)
            | KvError::Internal(m) => m,
        }
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for KvError {}

/// A boxed slice of `len` elements made by `init`, or [`KvError::OutOfMemory`] (naming `what`) when
/// the memory cannot be had: large constructions must never abort the process.
pub fn try_boxed_slice<T>(
    len: usize,
    what: &str,
    mut init: impl FnMut(usize) -> T,
) -> KvResult<Box<[T]>> {
    let mut v = try_with_capacity(len, what)?;
    v.extend((0..len).map(&mut init));
    Ok(v.into_boxed_slice())
}

/// An empty vector with room for `len` elements, or [`KvError::OutOfMemory`] (naming `what`): an
/// output a caller sizes (a batch that repeats a long sequence's id) must never abort the process.
pub fn try_with_capacity<T>(len: usize, what: &str) -> KvResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        KvError::OutOfMemory(format!(
            "cannot allocate {what}: {len} elements of {} bytes",
            std::mem::size_of::<T>()
        ))
    })?;
    Ok(v)
}

/// `len` copies of `value`, or [`KvError::OutOfMemory`] as [`try_with_capacity`].
pub fn try_filled<T: Clone>(len: usize, value: T, what: &str) -> KvResult<Vec<T>> {
    let mut v = try_with_capacity(len, what)?;
    v.resize(len, value);
    Ok(v)
}
