//! One conversion from core errors to the Python exception hierarchy.
//!
//! The classes are defined once, in Python (`kvcore/exceptions.py`), so that they can derive from
//! both `KVCoreError` and the fitting built-in (`ValueError`, `KeyError`, `TypeError`,
//! `MemoryError`). [`init`] resolves every class once, when the native module is imported, into a
//! typed table: a missing class fails the import instead of silently becoming another exception.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::KvError;

/// The exception classes, in [`index`] order.
struct Classes([Py<PyType>; NUM_CLASSES]);

const NUM_CLASSES: usize = 8;

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// The position of `err`'s class in the table.
fn index(err: &KvError) -> usize {
    match err {
        KvError::InvalidArgument(_) => 0,
        KvError::InvalidDType(_) => 1,
        KvError::InvalidPage(_) => 2,
        KvError::DoubleFree(_) => 3,
        KvError::UnknownSequence(_) => 4,
        KvError::DuplicateSequence(_) => 5,
        KvError::OutOfMemory(_) => 6,
        KvError::Internal(_) => 7,
    }
}

/// Resolve every class of `kvcore.exceptions` the core raises (called once, at module init).
pub(crate) fn init(py: Python<'_>) -> PyResult<()> {
    CLASSES.get_or_try_init(py, || {
        let module = py.import("kvcore.exceptions")?;
        let samples = [
            KvError::InvalidArgument(String::new()),
            KvError::InvalidDType(String::new()),
            KvError::InvalidPage(String::new()),
            KvError::DoubleFree(String::new()),
            KvError::UnknownSequence(String::new()),
            KvError::DuplicateSequence(String::new()),
            KvError::OutOfMemory(String::new()),
            KvError::Internal(String::new()),
        ];
        let mut classes = Vec::with_capacity(NUM_CLASSES);
        for (i, err) in samples.iter().enumerate() {
            debug_assert_eq!(index(err), i);
            classes.push(module.getattr(err.kind())?.cast_into::<PyType>()?.unbind());
        }
        let classes: [Py<PyType>; NUM_CLASSES] = classes
            .try_into()
            .map_err(|_| pyo3::exceptions::PyImportError::new_err("kvcore.exceptions table"))?;
        Ok::<_, PyErr>(Classes(classes))
    })?;
    Ok(())
}

impl From<KvError> for PyErr {
    fn from(err: KvError) -> PyErr {
        Python::attach(|py| match CLASSES.get(py) {
            Some(classes) => PyErr::from_type(
                classes.0[index(&err)].bind(py).clone(),
                err.message().to_owned(),
            ),
            // Unreachable: the module's init fills the table before any method can run.
            None => pyo3::exceptions::PyRuntimeError::new_err(err.to_string()),
        })
    }
}
