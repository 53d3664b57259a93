//! Argument conversion shared by the bindings: page-id arrays in, page-id arrays out.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::error::kv_exception;
use crate::PageId;

/// Page ids borrowed from a contiguous `int32` NumPy array (no copy), or converted from a list.
pub(crate) enum PageIds<'py> {
    /// A small array, read in place while the caller stays attached to the interpreter.
    Attached(Bound<'py, PyArray1<i32>>),
    /// A large array, borrowed through rust-numpy's tracked read-only borrow so it may be read
    /// while detached.
    Tracked(PyReadonlyArray1<'py, i32>),
    Vec(Vec<i32>),
}

/// Arrays at least this long are borrowed with tracking (the caller detaches while reading them).
pub(crate) const DETACH_MIN_PAGES: usize = 4096;

impl PageIds<'_> {
    /// The ids as `PageId`s. Negative ids become huge values, which the core rejects as out of range.
    pub(crate) fn as_slice(&self) -> &[PageId] {
        let ids: &[i32] = match self {
            // SAFETY: `page_ids` checked the array is contiguous. The view is used only while the
            // caller is attached and runs no Python code, so no Python code can write to the array
            // meanwhile; the tracked borrow (rust-numpy) costs more than a whole small `free`, which
            // is why small arrays skip it.
            PageIds::Attached(a) => unsafe { a.as_slice() }.unwrap_or(&[]),
            // The array was checked contiguous in `page_ids`.
            PageIds::Tracked(a) => a.as_slice().unwrap_or(&[]),
            PageIds::Vec(v) => v,
        };
        // SAFETY: i32 and u32 have the same size and alignment and every bit pattern is valid for
        // both; the borrow keeps the source alive and read-only for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<PageId>(), ids.len()) }
    }
}

/// Accept a 1-D contiguous `int32` array (zero copy) or a list/tuple of ints; anything else raises
/// `InvalidDTypeError` naming what was given.
pub(crate) fn page_ids<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PageIds<'py>> {
    let py = obj.py();
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        if !array.is_contiguous() {
            return Err(kv_exception(
                py,
                "InvalidDTypeError",
                "page ids must be a contiguous array".into(),
            ));
        }
        if array.len() >= DETACH_MIN_PAGES {
            return Ok(PageIds::Tracked(array.readonly()));
        }
        return Ok(PageIds::Attached(array.clone()));
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        let message = format!(
            "page ids must be a 1-D int32 array, got a {}-D {} array",
            array.ndim(),
            array
                .dtype()
                .str()
                .map(|s| s.to_string())
                .unwrap_or_else(|_| "?".into())
        );
        return Err(kv_exception(py, "InvalidDTypeError", message));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj.extract::<Vec<i32>>().map(PageIds::Vec).map_err(|_| {
            kv_exception(
                py,
                "InvalidDTypeError",
                "page ids must be integers that fit int32".into(),
            )
        });
    }
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(kv_exception(
        py,
        "InvalidDTypeError",
        format!("page ids must be a 1-D int32 numpy array or a list of ints, got {type_name}"),
    ))
}

/// An integer count argument (`n`); non-integers raise `InvalidDTypeError`, negatives `InvalidArgumentError`.
pub(crate) fn count_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let py = obj.py();
    let value: i64 = obj.extract().map_err(|_| {
        kv_exception(
            py,
            "InvalidDTypeError",
            format!("{name} must be an integer"),
        )
    })?;
    usize::try_from(value).map_err(|_| {
        kv_exception(
            py,
            "InvalidArgumentError",
            format!("{name} must be >= 0, got {value}"),
        )
    })
}

/// A fresh, uninitialised `int32` array of `len` elements and a mutable view of it as `PageId`s.
pub(crate) fn new_page_array<'py>(
    py: Python<'py>,
    len: usize,
) -> (Bound<'py, PyArray1<i32>>, &'py mut [PageId]) {
    // SAFETY: the array is created here and not yet shared with Python, so no other view of its
    // memory exists; the caller writes every element before returning it.
    let array = unsafe { PyArray1::<i32>::new(py, len, false) };
    // SAFETY: a fresh 1-D array is contiguous; i32 -> u32 reinterpretation is valid (same layout,
    // all bit patterns valid). The slice lives as long as the array object ('py).
    let slice = unsafe {
        let data = array.data();
        std::slice::from_raw_parts_mut(data.cast::<PageId>(), len)
    };
    (array, slice)
}

/// Token ids borrowed from a contiguous 1-D `int32`/`uint32` array (no copy), or converted from an
/// `int64` array or a list of ints (checked to fit `0..2**32`).
pub(crate) enum Tokens<'py> {
    Attached(Bound<'py, PyArray1<i32>>),
    AttachedU32(Bound<'py, PyArray1<u32>>),
    Vec(Vec<u32>),
}

impl Tokens<'_> {
    pub(crate) fn as_slice(&self) -> &[u32] {
        match self {
            // SAFETY: checked contiguous and non-negative in `tokens`; read only while the caller is
            // attached and runs no Python code (as for `PageIds::Attached`). i32 -> u32 is a valid
            // reinterpretation (same layout).
            Tokens::Attached(a) => unsafe {
                let ids = a.as_slice().unwrap_or(&[]);
                std::slice::from_raw_parts(ids.as_ptr().cast::<u32>(), ids.len())
            },
            // SAFETY: as above.
            Tokens::AttachedU32(a) => unsafe { a.as_slice() }.unwrap_or(&[]),
            Tokens::Vec(v) => v,
        }
    }
}

fn bad_tokens(py: Python<'_>, what: &str) -> PyErr {
    kv_exception(
        py,
        "InvalidDTypeError",
        format!("token ids must be a 1-D int32/uint32/int64 array or a list of ints in 0..2**32; got {what}"),
    )
}

/// Accept token ids; anything else raises `InvalidDTypeError`, negative ids `InvalidArgumentError`.
pub(crate) fn tokens<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Tokens<'py>> {
    let py = obj.py();
    let negative = || {
        kv_exception(
            py,
            "InvalidArgumentError",
            "token ids must be non-negative".into(),
        )
    };
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        if !array.is_contiguous() {
            return Err(bad_tokens(py, "a non-contiguous array"));
        }
        // SAFETY: contiguous (checked), read while attached.
        if unsafe { array.as_slice() }
            .unwrap_or(&[])
            .iter()
            .any(|&t| t < 0)
        {
            return Err(negative());
        }
        return Ok(Tokens::Attached(array.clone()));
    }
    if let Ok(array) = obj.cast::<PyArray1<u32>>() {
        if !array.is_contiguous() {
            return Err(bad_tokens(py, "a non-contiguous array"));
        }
        return Ok(Tokens::AttachedU32(array.clone()));
    }
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        let view = array.readonly();
        let mut out = Vec::with_capacity(view.len());
        for &t in view.as_array().iter() {
            out.push(u32::try_from(t).map_err(|_| {
                if t < 0 {
                    negative()
                } else {
                    bad_tokens(py, "an id >= 2**32")
                }
            })?);
        }
        return Ok(Tokens::Vec(out));
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        let dtype = array
            .dtype()
            .str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(bad_tokens(
            py,
            &format!("a {}-D {dtype} array", array.ndim()),
        ));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let ids: Vec<i64> = obj
            .extract()
            .map_err(|_| bad_tokens(py, "a sequence with non-integers"))?;
        let mut out = Vec::with_capacity(ids.len());
        for t in ids {
            out.push(u32::try_from(t).map_err(|_| {
                if t < 0 {
                    negative()
                } else {
                    bad_tokens(py, "an id >= 2**32")
                }
            })?);
        }
        return Ok(Tokens::Vec(out));
    }
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(bad_tokens(py, &type_name))
}
