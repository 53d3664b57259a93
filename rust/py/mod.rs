//! PyO3 bindings: convert arguments, call the core, convert back. Nothing else lives here.
//!
//! No panic may cross into Python: `unwrap`/`expect` are denied, and every core error becomes an
//! exception of the `kvcore.exceptions` hierarchy through one `From<KvError> for PyErr` (`error`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod allocator;
mod convert;
mod error;
mod manager;
mod remote;
mod tiers;

use pyo3::prelude::*;

/// The private native module `kvcore._kvcore`; the public API is re-exported by `kvcore/__init__.py`.
#[pymodule(gil_used = false)]
fn _kvcore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::init(m.py())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<crate::manager::CacheStats>()?;
    m.add_class::<allocator::PyPageAllocator>()?;
    m.add_class::<manager::PyKVCacheManager>()?;
    m.add_class::<remote::PyRespClient>()?;
    m.add_function(wrap_pyfunction!(manager::py_page_keys, m)?)?;
    m.add_function(wrap_pyfunction!(manager::py_payload_checksum, m)?)?;
    Ok(())
}
