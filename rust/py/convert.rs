//! Argument conversion shared by the bindings: every argument a caller passes is checked here and
//! refused with a `kvcore.exceptions` class naming it (never a bare `TypeError` or `OverflowError`).
//!
//! # Arrays are copied, then validated
//! Page ids and token ids are copied out of the caller's NumPy array (or list) before anything looks
//! at them, and only the copy is validated and used. A view held across the call would not be safe:
//! the manager may call back into Python (its `clock`), and on free-threaded Python another thread may
//! write or resize the array at any moment, so what was validated would not be what is used. The copy
//! (`crate::shared_copy`) runs at `memcpy`'s speed on x86-64: about 0.1 ns per id.

use std::sync::atomic::{AtomicU32, Ordering};

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyFloat, PyInt, PyList, PyRange, PyString, PyTuple,
};

use crate::error::KvError;
use crate::PageId;

/// Batches at least this long are processed detached from the interpreter.
pub(crate) const DETACH_MIN_PAGES: usize = 4096;

/// Ids up to this many are copied into an inline buffer (no heap allocation on the hot path).
const INLINE_IDS: usize = 16;

/// Ids copied out of the caller's object: inline when short, on the heap otherwise.
pub(crate) enum Ids {
    Inline([u32; INLINE_IDS], usize),
    Heap(Vec<u32>),
}

impl Ids {
    pub(crate) fn as_slice(&self) -> &[u32] {
        match self {
            Ids::Inline(buf, len) => &buf[..*len],
            Ids::Heap(v) => v,
        }
    }
}

impl AsRef<[u32]> for Ids {
    fn as_ref(&self) -> &[u32] {
        self.as_slice()
    }
}

impl From<Ids> for Vec<u32> {
    /// The copy itself when it is on the heap (a prompt kept by the manager is not copied again).
    fn from(ids: Ids) -> Vec<u32> {
        match ids {
            Ids::Inline(buf, len) => buf[..len].to_vec(),
            Ids::Heap(v) => v,
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn dtype_name(array: &Bound<'_, PyUntypedArray>) -> String {
    array
        .dtype()
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A contiguous, aligned 1-D array's data pointer and length, or an `InvalidDType` error.
fn view<T: numpy::Element>(
    array: &Bound<'_, PyArray1<T>>,
    what: &str,
) -> PyResult<(*const T, usize)> {
    contiguous(array).ok_or_else(|| {
        KvError::InvalidDType(format!("{what} must be a contiguous, aligned array")).into()
    })
}

/// A 1-D array's data pointer and length if it is contiguous and aligned.
fn contiguous<T: numpy::Element>(array: &Bound<'_, PyArray1<T>>) -> Option<(*const T, usize)> {
    let ptr = array.data() as *const T;
    (array.is_contiguous() && ptr.is_aligned()).then(|| (ptr, array.len()))
}

/// Copy `len` 32-bit values at `ptr` into [`Ids`].
///
/// # Safety
/// `ptr` must point to `len` aligned 4-byte values that stay allocated for the duration of the call
/// (the caller holds a reference to the array that owns them, so NumPy refuses to resize or free
/// them; only `resize(refcheck=False)`, which NumPy documents as unsafe, could break this).
unsafe fn copy_u32(ptr: *const u32, len: usize) -> PyResult<Ids> {
    // Other threads (free-threaded Python) may write these values while we copy: short arrays are
    // read with relaxed atomic loads, long ones by `shared_copy` (which never lets the compiler
    // assume the source is stable). Every bit pattern is a valid u32, and the copy is what gets
    // validated and used.
    if len <= INLINE_IDS {
        // SAFETY: aligned and live (the caller's contract); AtomicU32 has u32's layout.
        let src = unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU32>(), len) };
        let mut buf = [0u32; INLINE_IDS];
        for (dst, s) in buf.iter_mut().zip(src) {
            *dst = s.load(Ordering::Relaxed);
        }
        return Ok(Ids::Inline(buf, len));
    }
    let mut out = copy_buffer::<u32>(len)?;
    // SAFETY: `len` aligned values, live for the call (our contract); `out` has room for `len`.
    unsafe { crate::shared_copy::copy_shared_u32(ptr, len, &mut out) };
    Ok(Ids::Heap(out))
}

/// An empty vector with room for the copy of `len` ids, or `OutOfMemoryError` (a copy of a huge
/// array must not abort the process).
fn copy_buffer<T>(len: usize) -> PyResult<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| {
        PyErr::from(KvError::OutOfMemory(format!(
            "cannot copy an array of {len} ids ({} bytes each)",
            std::mem::size_of::<T>()
        )))
    })?;
    Ok(out)
}

/// Copy `len` int64 token ids at `ptr` as u32: `InvalidArgumentError` / `InvalidDTypeError` (as
/// [`token_id`]) for the first one out of `0..2**32`.
///
/// # Safety
/// As for [`copy_u32`], with 8-byte values.
unsafe fn copy_i64_tokens(ptr: *const i64, len: usize) -> PyResult<Ids> {
    let mut out = copy_buffer::<u32>(len)?;
    // SAFETY: `len` aligned values, live for the call (our contract); `out` has room for `len`.
    match unsafe { crate::shared_copy::copy_shared_i64_to_u32(ptr, len, &mut out) } {
        Ok(()) => Ok(Ids::Heap(out)),
        Err(bad) => Err(token_id(bad)
            .err()
            .unwrap_or_else(|| bad_tokens("an id >= 2**32"))),
    }
}

/// An iterator over `obj` (a list, tuple or any iterable but a string or bytes), or
/// `InvalidDTypeError` naming `name` and the type given.
pub(crate) fn iter_arg<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    let bad = || {
        PyErr::from(KvError::InvalidDType(format!(
            "{name} must be an iterable (a list or tuple), got {}",
            type_name(obj)
        )))
    };
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(bad());
    }
    obj.try_iter().map_err(|_| bad())
}

/// The items of a list, tuple or range (a snapshot: later changes to a list are not seen), or
/// `None` for any other object. Room for the items is had fallibly, so a list of 3e8 ids beyond the
/// memory left, or a lazy `range(10**12)`, is an `OutOfMemoryError`, not an aborted process.
fn int_sequence<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        let mut items = copy_buffer::<Bound<'py, PyAny>>(list.len())?;
        items.extend(list.iter());
        return Ok(Some(items));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        let mut items = copy_buffer::<Bound<'py, PyAny>>(tuple.len())?;
        items.extend(tuple.iter());
        return Ok(Some(items));
    }
    if obj.is_instance_of::<PyRange>() {
        // len() of a range past sys.maxsize raises OverflowError: too long either way.
        let len = obj.len().unwrap_or(usize::MAX);
        let mut items = copy_buffer::<Bound<'py, PyAny>>(len)?;
        for item in obj.try_iter()? {
            items.push(item?);
        }
        return Ok(Some(items));
    }
    Ok(None)
}

/// The elements of a 1-D array as a list of Python scalars, through `numpy.ndarray.tolist` itself
/// (never the object's own `tolist`, which a subclass may override to return anything, itself
/// included).
fn array_as_list<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let tolist = obj
        .py()
        .import("numpy")?
        .getattr("ndarray")?
        .getattr("tolist")?;
    let list = tolist.call1((obj,))?;
    list.cast_into_exact::<PyList>().map_err(|e| {
        KvError::InvalidDType(format!(
            "numpy.ndarray.tolist gave {}, not a list",
            type_name(e.into_inner().as_any())
        ))
        .into()
    })
}

/// Real numbers (`compact`'s scores): a 1-D array or a sequence (list, tuple, ...) of ints and
/// floats, as `f32`; an unordered collection (a set, a dict) or a one-shot iterator is refused: the
/// order is the pages'. The vector grows with what is iterated (a lying `__len__` reserves
/// nothing), and running out of memory is an `OutOfMemoryError`.
pub(crate) fn floats_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f32>> {
    let list;
    let items = if let Ok(array) = obj.cast::<PyUntypedArray>() {
        let kind = array.dtype().kind();
        if array.ndim() != 1 || !matches!(kind, b'f' | b'i' | b'u') {
            return Err(KvError::InvalidDType(format!(
                "{name} must be a 1-D sequence or array of floats, got a {}-D {} array",
                array.ndim(),
                dtype_name(array)
            ))
            .into());
        }
        list = array_as_list(obj)?;
        list.try_iter()?
    } else {
        let unordered = obj.is_instance_of::<pyo3::types::PySet>()
            || obj.is_instance_of::<pyo3::types::PyFrozenSet>()
            || obj.is_instance_of::<pyo3::types::PyDict>()
            || obj.hasattr("__next__").unwrap_or(true); // an iterator: one pass, its own order
        if unordered {
            return Err(KvError::InvalidDType(format!(
                "{name} must be a 1-D sequence or array of floats (in page order), got {}",
                type_name(obj)
            ))
            .into());
        }
        iter_arg(obj, name)?
    };
    // A sequence of the caller's may iterate in Python code: counted, as in `int_value_named`.
    let plain = obj.is_exact_instance_of::<PyList>()
        || obj.is_exact_instance_of::<PyTuple>()
        || obj.cast::<PyUntypedArray>().is_ok();
    let _active = (!plain).then(|| super::active(obj.py()));
    let mut out: Vec<f32> = Vec::new();
    for (i, item) in items.enumerate() {
        let v = float_arg(&item?, &format!("{name}[{i}]"))?;
        out.try_reserve(1)
            .map_err(|_| PyErr::from(KvError::OutOfMemory(format!("cannot hold {i} {name}"))))?;
        out.push(v as f32);
    }
    Ok(out)
}

/// The elements of a list, tuple or range as `u32`s, each converted from a Python int by `convert`;
/// `None` if `obj` is neither. Bools are refused: `True` is not an id.
fn copy_sequence(
    obj: &Bound<'_, PyAny>,
    what: &str,
    mut convert: impl FnMut(i64) -> PyResult<u32>,
) -> Option<PyResult<Ids>> {
    let items = match int_sequence(obj) {
        Ok(Some(items)) => items,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let mut out = match copy_buffer::<u32>(items.len()) {
        Ok(out) => out,
        Err(e) => return Some(Err(e)),
    };
    for (i, item) in items.iter().enumerate() {
        match int_value_named(item, || format!("{what}[{i}]")) {
            Ok(v) => match convert(v) {
                Ok(v) => out.push(v),
                Err(e) => return Some(Err(e)),
            },
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(Ids::Heap(out)))
}

/// Page ids: a 1-D contiguous `int32` array or a list/tuple/range of ints, copied. Negative ids become
/// huge values, which the core refuses as out of range; anything else raises `InvalidDTypeError`
/// (a list element beyond int32 too).
pub(crate) fn page_ids(obj: &Bound<'_, PyAny>) -> PyResult<Ids> {
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        let (ptr, len) = view(array, "page ids")?;
        // SAFETY: checked contiguous and aligned; `array` keeps the buffer alive; i32 and u32
        // share a layout.
        return unsafe { copy_u32(ptr.cast::<u32>(), len) };
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Err(KvError::InvalidDType(format!(
            "page ids must be a 1-D int32 array, got a {}-D {} array",
            array.ndim(),
            dtype_name(array)
        ))
        .into());
    }
    let page = |v: i64| {
        i32::try_from(v).map(|p| p as PageId).map_err(|_| {
            PyErr::from(KvError::InvalidDType(format!(
                "page ids must be integers that fit int32, got {v}"
            )))
        })
    };
    copy_sequence(obj, "page ids", page).unwrap_or_else(|| {
        Err(KvError::InvalidDType(format!(
            "page ids must be a 1-D int32 numpy array or a list of ints, got {}",
            type_name(obj)
        ))
        .into())
    })
}

fn bad_tokens(what: &str) -> PyErr {
    KvError::InvalidDType(format!(
        "token ids must be a 1-D int32/uint32/int64 array or a list of ints in 0..2**32; got {what}"
    ))
    .into()
}

fn negative_tokens() -> PyErr {
    KvError::InvalidArgument("token ids must be non-negative".into()).into()
}

/// Checked conversion of one 64-bit token id to `u32`.
fn token_id(t: i64) -> PyResult<u32> {
    u32::try_from(t).map_err(|_| {
        if t < 0 {
            negative_tokens()
        } else {
            bad_tokens("an id >= 2**32")
        }
    })
}

/// Token ids, copied (then validated): anything but integer ids raises `InvalidDTypeError`, negative
/// ids `InvalidArgumentError`.
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Ids> {
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        let (ptr, len) = view(array, "token ids")?;
        // SAFETY: checked contiguous and aligned; `array` keeps the buffer alive.
        let ids = unsafe { copy_u32(ptr.cast::<u32>(), len) }?;
        // The check runs on the copy. OR-ing every id and testing the sign bit vectorises (no
        // early exit): this check runs on every prompt.
        if ids.as_slice().iter().fold(0, |acc, &t| acc | t) >> 31 != 0 {
            return Err(negative_tokens());
        }
        return Ok(ids);
    }
    if let Ok(array) = obj.cast::<PyArray1<u32>>() {
        let (ptr, len) = view(array, "token ids")?;
        // SAFETY: checked contiguous and aligned; `array` keeps the buffer alive.
        return unsafe { copy_u32(ptr, len) };
    }
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        let (ptr, len) = view(array, "token ids")?;
        // SAFETY: checked contiguous and aligned; `array` keeps the buffer alive.
        return unsafe { copy_i64_tokens(ptr, len) };
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Err(bad_tokens(&format!(
            "a {}-D {} array",
            array.ndim(),
            dtype_name(array)
        )));
    }
    copy_sequence(obj, "token ids", token_id).unwrap_or_else(|| Err(bad_tokens(&type_name(obj))))
}

/// An integer argument as `i64`: bools and non-integers raise `InvalidDTypeError`, integers beyond
/// int64 `InvalidArgumentError`, each naming the argument.
pub(crate) fn int_value(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    int_value_named(obj, || name.to_owned())
}

/// [`int_value`] with the argument's name made only for an error message (list elements).
fn int_value_named(obj: &Bound<'_, PyAny>, name: impl FnOnce() -> String) -> PyResult<i64> {
    // Anything but an int may run Python code (`__index__`, `__repr__` for the message): counted,
    // for the interpreter's exit (see `super::active`).
    let _active = (!obj.is_exact_instance_of::<PyInt>()).then(|| super::active(obj.py()));
    if obj.is_instance_of::<PyBool>() {
        let name = name();
        return Err(KvError::InvalidDType(format!("{name} must be an integer, got a bool")).into());
    }
    obj.extract::<i64>().map_err(|_| {
        let name = name();
        let is_int = obj.is_instance_of::<PyInt>() || obj.hasattr("__index__").unwrap_or(false);
        if is_int {
            KvError::InvalidArgument(format!("{name} is out of range (int64), got {obj}")).into()
        } else {
            KvError::InvalidDType(format!("{name} must be an integer, got {}", type_name(obj)))
                .into()
        }
    })
}

/// An integer argument converted to `T`; out of `T`'s range raises `InvalidArgumentError` saying
/// which range (`range` is shown to the caller).
pub(crate) fn int_arg<T: TryFrom<i64>>(
    obj: &Bound<'_, PyAny>,
    name: &str,
    range: &str,
) -> PyResult<T> {
    let value = int_value(obj, name)?;
    T::try_from(value).map_err(|_| {
        KvError::InvalidArgument(format!("{name} must be in {range}, got {value}")).into()
    })
}

/// One page id argument (`ref_count(page)`): an integer that fits a page id, else
/// `InvalidPageError` naming the valid range (the core then checks it against the pool).
pub(crate) fn page_arg(obj: &Bound<'_, PyAny>, num_pages: usize) -> PyResult<PageId> {
    let value = int_value(obj, "page")?;
    PageId::try_from(value).map_err(|_| {
        KvError::InvalidPage(format!(
            "page {value} is out of range; valid pages are 1..={}",
            num_pages - 1
        ))
        .into()
    })
}

/// An optional argument: `None` when left out or None, else `convert`ed.
pub(crate) fn opt_arg<'py, T>(
    obj: Option<&Bound<'py, PyAny>>,
    convert: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    obj.filter(|o| !o.is_none()).map(convert).transpose()
}

/// An integer count argument: non-integers raise `InvalidDTypeError`, negatives `InvalidArgumentError`.
pub(crate) fn count_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let value = int_value(obj, name)?;
    usize::try_from(value)
        .map_err(|_| KvError::InvalidArgument(format!("{name} must be >= 0, got {value}")).into())
}

/// A real-number argument (int or float, not bool); anything else raises `InvalidDTypeError`.
pub(crate) fn float_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    // `__float__` may be Python code: counted, as in `int_value_named`.
    let _active = (!obj.is_exact_instance_of::<PyFloat>() && !obj.is_exact_instance_of::<PyInt>())
        .then(|| super::active(obj.py()));
    let numeric = !obj.is_instance_of::<PyBool>()
        && (obj.is_instance_of::<PyFloat>()
            || obj.is_instance_of::<PyInt>()
            || obj.hasattr("__float__").unwrap_or(false))
        && !obj.is_instance_of::<PyString>();
    if !numeric {
        return Err(KvError::InvalidDType(format!(
            "{name} must be a number, got {}",
            type_name(obj)
        ))
        .into());
    }
    obj.extract::<f64>().map_err(|_| {
        KvError::InvalidArgument(format!("{name} cannot be converted to a float: {obj}")).into()
    })
}

/// A bool argument (`bool` or `numpy.bool_`); anything else raises `InvalidDTypeError`.
pub(crate) fn bool_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    obj.extract::<bool>().map_err(|_| {
        KvError::InvalidDType(format!("{name} must be a bool, got {}", type_name(obj))).into()
    })
}

/// A string argument: non-strings raise `InvalidDTypeError`, strings that are not valid Unicode
/// (lone surrogates) `InvalidArgumentError`.
pub(crate) fn str_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    let s = obj.cast::<PyString>().map_err(|_| {
        PyErr::from(KvError::InvalidDType(format!(
            "{name} must be a str, got {}",
            type_name(obj)
        )))
    })?;
    s.to_str().map(str::to_owned).map_err(|_| {
        KvError::InvalidArgument(format!(
            "{name} must be valid Unicode (it holds a lone surrogate)"
        ))
        .into()
    })
}

/// A bytes argument (`bytes` or `bytearray`, copied); anything else raises `InvalidDTypeError`.
pub(crate) fn bytes_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    Err(KvError::InvalidDType(format!("{name} must be bytes, got {}", type_name(obj))).into())
}

/// An optional namespace: `None` (the default namespace) or a str.
pub(crate) fn namespace_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => str_arg(o, "namespace").map(Some),
    }
}

/// Sequence ids: a list or tuple of ints, or a 1-D integer array.
pub(crate) fn seq_ids_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    // Contiguous int64 / int32 arrays (a scheduler's id and count arrays, every step) are copied as
    // page ids are; other arrays go through a list.
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        if let Some((ptr, len)) = contiguous(array) {
            let mut out = copy_buffer::<i64>(len)?;
            // SAFETY: contiguous and aligned; `array` keeps the buffer alive; `out` has room for `len`.
            unsafe { crate::shared_copy::copy_shared_i64_vec(ptr, len, &mut out) };
            return Ok(out);
        }
    }
    if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        if let Some((ptr, len)) = contiguous(array) {
            // SAFETY: contiguous and aligned; `array` keeps the buffer alive; i32 and u32 share a layout.
            let ids = unsafe { copy_u32(ptr.cast::<u32>(), len) }?;
            let mut out = copy_buffer::<i64>(len)?;
            out.extend(ids.as_slice().iter().map(|&v| i64::from(v as i32)));
            return Ok(out);
        }
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        let dtype = array.dtype();
        let integer = dtype.is_equiv_to(&numpy::dtype::<i64>(obj.py()))
            || dtype.is_equiv_to(&numpy::dtype::<i32>(obj.py()));
        if !integer || array.ndim() != 1 {
            return Err(KvError::InvalidDType(format!(
                "{name} must be a 1-D int32/int64 array or a list of ints, got a {}-D {} array",
                array.ndim(),
                dtype_name(array)
            ))
            .into());
        }
        // A fresh list: no view of the array survives this line.
        let list = array_as_list(obj)?;
        return named_ints(list.iter(), list.len(), name);
    }
    let Some(items) = int_sequence(obj)? else {
        return Err(KvError::InvalidDType(format!(
            "{name} must be a list of ints or a 1-D integer array, got {}",
            type_name(obj)
        ))
        .into());
    };
    let len = items.len();
    named_ints(items.into_iter(), len, name)
}

/// The `len` items of `items` (a list's, or a snapshot of one) as int64s (`name[i]` in errors), in
/// a vector had fallibly: a huge list is an `OutOfMemoryError`, never an aborted process.
fn named_ints<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    len: usize,
    name: &str,
) -> PyResult<Vec<i64>> {
    let mut out = copy_buffer::<i64>(len)?;
    for (i, item) in items.enumerate() {
        out.push(int_value_named(&item, || format!("{name}[{i}]"))?);
    }
    Ok(out)
}

/// Non-negative counts (`num_tokens` per sequence): a list or tuple of ints, or a 1-D integer array.
pub(crate) fn counts_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    let ids = seq_ids_arg(obj, name)?;
    if let Some((i, v)) = ids.iter().enumerate().find(|&(_, &v)| v < 0) {
        return Err(KvError::InvalidArgument(format!("{name}[{i}] must be >= 0, got {v}")).into());
    }
    Ok(ids.into_iter().map(|v| v as usize).collect()) // in place: i64 and usize share a layout
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
    // SAFETY: the array is created here and not yet shared with Python (no other thread can reach
    // it, free-threaded or not), so no other view of its memory exists; the caller writes every
    // element before returning it.
    let array = unsafe { PyArray1::<i32>::new(py, len, false) };
    // SAFETY: a fresh 1-D array is contiguous; i32 -> u32 reinterpretation is valid (same layout,
    // all bit patterns valid). The slice lives as long as the array object ('py).
    let slice = unsafe {
        let data = array.data();
        std::slice::from_raw_parts_mut(data.cast::<PageId>(), len)
    };
    (array, slice)
}

/// An optional argument whose default is not `None`: `Missing` when the caller left it out, and
/// any object (`None` included, which is then refused like any other wrong value) when given.
pub(crate) enum Arg<'py> {
    Missing,
    Given(Bound<'py, PyAny>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Arg<'py> {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Arg::Given(obj.to_owned()))
    }
}

impl<'py> Arg<'py> {
    /// The converted argument, or `default` when it was left out.
    pub(crate) fn or<T>(
        &self,
        default: T,
        convert: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
    ) -> PyResult<T> {
        match self {
            Arg::Missing => Ok(default),
            Arg::Given(obj) => convert(obj),
        }
    }
}
