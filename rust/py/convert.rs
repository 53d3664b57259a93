//! Argument conversion shared by the bindings: page-id arrays in, page-id arrays out.

use numpy::{PyArray1, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::error::kv_exception;
use crate::PageId;

/// Page ids: a view of a small contiguous `int32` NumPy array (no copy), or an owned copy (large
/// arrays, which the caller reads while detached from the interpreter, and lists).
pub(crate) enum PageIds<'py> {
    /// A view of `len` ids at `ptr`, valid while `_array` lives and the caller stays attached.
    Attached {
        _array: Bound<'py, PyArray1<i32>>,
        ptr: *const PageId,
        len: usize,
    },
    Owned(Vec<PageId>),
}

/// Batches at least this long are copied and processed detached from the interpreter. The copy
/// (about 1 ns per id) is what makes reading them without the interpreter safe: Python threads may
/// write to the array meanwhile.
pub(crate) const DETACH_MIN_PAGES: usize = 4096;

impl PageIds<'_> {
    /// The ids as `PageId`s. Negative ids become huge values, which the core rejects as out of range.
    pub(crate) fn as_slice(&self) -> &[PageId] {
        match self {
            // SAFETY: `page_ids` checked that the array is 1-D, contiguous and aligned, and took
            // `ptr`/`len` from it; the array is kept alive by `_array`. The view is only used while
            // the caller is attached and runs no Python code, so nothing can write to or resize the
            // array meanwhile. i32 -> u32 is a valid reinterpretation (same layout).
            PageIds::Attached { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            PageIds::Owned(v) => v,
        }
    }
}

/// A contiguous, aligned view of a 1-D NumPy array, or None.
fn view<T: numpy::Element>(array: &Bound<'_, PyArray1<T>>) -> Option<(*const T, usize)> {
    let ptr = array.data() as *const T;
    (array.is_contiguous() && ptr.is_aligned()).then(|| (ptr, array.len()))
}

fn not_contiguous(py: Python<'_>, what: &str) -> PyErr {
    kv_exception(
        py,
        "InvalidDTypeError",
        format!("{what} must be a contiguous, aligned array"),
    )
}

/// Accept a 1-D contiguous `int32` array (zero copy) or a list/tuple of ints; anything else raises
/// `InvalidDTypeError` naming what was given.
pub(crate) fn page_ids<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PageIds<'py>> {
    let py = obj.py();
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        let (ptr, len) = view(array).ok_or_else(|| not_contiguous(py, "page ids"))?;
        let ptr = ptr.cast::<PageId>();
        if len >= DETACH_MIN_PAGES {
            // SAFETY: as in `as_slice` (checked, attached, no Python runs during the copy).
            return Ok(PageIds::Owned(
                unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec(),
            ));
        }
        return Ok(PageIds::Attached {
            _array: array.clone(),
            ptr,
            len,
        });
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
        return obj
            .extract::<Vec<i32>>()
            .map(|v| PageIds::Owned(v.into_iter().map(|p| p as PageId).collect()))
            .map_err(|_| {
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
///
/// # Safety
/// The caller must write every element through the returned slice before the array is exposed to
/// Python, and must not use the slice after that.
pub(crate) unsafe fn new_page_array<'py>(
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

/// Token ids: a view of a contiguous 1-D `int32`/`uint32` array (no copy), or an owned copy
/// (`int64` arrays, lists).
pub(crate) enum Tokens<'py> {
    /// A view of `len` ids at `ptr`, valid while `_array` lives and the caller stays attached.
    Attached {
        _array: Bound<'py, PyAny>,
        ptr: *const u32,
        len: usize,
    },
    Owned(Vec<u32>),
}

impl Tokens<'_> {
    pub(crate) fn as_slice(&self) -> &[u32] {
        match self {
            // SAFETY: as for `PageIds::Attached`: checked contiguous and aligned, kept alive by
            // `_array`, read only while attached with no Python code running.
            Tokens::Attached { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Tokens::Owned(v) => v,
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

fn negative_tokens(py: Python<'_>) -> PyErr {
    kv_exception(
        py,
        "InvalidArgumentError",
        "token ids must be non-negative".into(),
    )
}

/// Checked conversion of 64-bit token ids to `u32`.
fn token_ids(py: Python<'_>, ids: impl ExactSizeIterator<Item = i64>) -> PyResult<Vec<u32>> {
    let mut out = Vec::with_capacity(ids.len());
    for t in ids {
        out.push(u32::try_from(t).map_err(|_| {
            if t < 0 {
                negative_tokens(py)
            } else {
                bad_tokens(py, "an id >= 2**32")
            }
        })?);
    }
    Ok(out)
}

/// Accept token ids; anything else raises `InvalidDTypeError`, negative ids `InvalidArgumentError`.
pub(crate) fn tokens<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Tokens<'py>> {
    let py = obj.py();
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        let (ptr, len) = view(array).ok_or_else(|| not_contiguous(py, "token ids"))?;
        // SAFETY: checked contiguous and aligned; read while attached.
        let ids = unsafe { std::slice::from_raw_parts(ptr, len) };
        // OR-ing every id and testing the sign bit vectorises (no early exit): this check runs on
        // every prompt, and `any(t < 0)` costs more than matching the prompt in the tree.
        if ids.iter().fold(0, |acc, &t| acc | t) < 0 {
            return Err(negative_tokens(py));
        }
        return Ok(Tokens::Attached {
            _array: obj.clone(),
            ptr: ptr.cast::<u32>(),
            len,
        });
    }
    if let Ok(array) = obj.cast::<PyArray1<u32>>() {
        let (ptr, len) = view(array).ok_or_else(|| not_contiguous(py, "token ids"))?;
        return Ok(Tokens::Attached {
            _array: obj.clone(),
            ptr,
            len,
        });
    }
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        let view = array.readonly();
        return token_ids(py, view.as_array().iter().copied()).map(Tokens::Owned);
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
        return token_ids(py, ids.into_iter()).map(Tokens::Owned);
    }
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(bad_tokens(py, &type_name))
}
