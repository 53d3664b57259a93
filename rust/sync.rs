//! Atomics through one shim, so that `--cfg loom` swaps in loom's model-checked versions.
//!
//! Every lock-free structure in the crate imports its atomics from here and nowhere else.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
