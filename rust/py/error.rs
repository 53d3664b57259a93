//! One conversion from core errors to the Python exception hierarchy.
//!
//! The classes are defined once, in Python (`kvcore/exceptions.py`), so that they can derive from
//! both `KVCoreError` and the fitting built-in (`ValueError`, `KeyError`, `TypeError`); the core
//! looks them up by name, once per process.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::KvError;

static EXCEPTIONS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `kvcore.exceptions.<class_name>` carrying `message`.
pub(crate) fn kv_exception(py: Python<'_>, class_name: &str, message: String) -> PyErr {
    let module =
        EXCEPTIONS.get_or_try_init(py, || py.import("kvcore.exceptions").map(Bound::unbind));
    let class = module
        .and_then(|m| m.bind(py).getattr(class_name))
        .and_then(|c| Ok(c.cast_into::<PyType>()?));
    match class {
        Ok(class) => PyErr::from_type(class, message),
        // Only reachable if the Python half of the package is broken; still never a panic.
        Err(_) => PyValueError::new_err(message),
    }
}

impl From<KvError> for PyErr {
    fn from(err: KvError) -> PyErr {
        Python::attach(|py| kv_exception(py, err.python_class(), err.message().to_owned()))
    }
}
