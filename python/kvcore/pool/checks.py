"""Argument checks shared by the pool and the kernels: index arrays, arrays, positive scales.

Why one place: page ids, slots and CSR offsets reach the kernels as int32 or int64, and a NumPy cast wraps
(an int64 page id ``2**32 + 1`` becomes page 1; a uint64 slot ``2**64 - 1`` becomes the -1 "skip" slot). So
every index-like argument goes through :func:`index_array`, which ranges the values in their *own* dtype
before converting, and refuses what is not an integer array at all. The NumPy reference, the CUDA path (on
the host, before any launch) and the pool all call these, so a refused call has written nothing.

Cost: one copy (taken first, so that what is checked is what is used, whatever another thread writes to
the caller's array meanwhile), and one ``min`` and one ``max`` reduction per array.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import numpy as np

from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError

__all__ = ["check_array", "check_host", "index_array", "positive_array", "positive_scalar"]


def _describe(x: Any) -> str:
    """How an unacceptable argument reads in a message: ``None``, ``float64[2]``, ``list of object[1]``."""
    if x is None:
        return "None"
    if hasattr(x, "__cuda_array_interface__"):
        return f"a device array {x.dtype}{list(x.shape)}"
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, OverflowError):
        return f"{type(x).__name__} (not an array)"
    return f"{type(x).__name__} of {a.dtype}{list(a.shape)}"


def check_host(x: Any, name: str, device: bool) -> None:
    """A device array (anything with ``__cuda_array_interface__``) is refused unless ``device`` (a CuPy
    pool): a NumPy pool's kernels cannot read one (CuPy refuses the implicit host copy).

    Raises:
        InvalidDTypeError: ``x`` is a device array and ``device`` is false.
    """
    if not device and hasattr(x, "__cuda_array_interface__"):
        raise InvalidDTypeError(
            f"{name}: a NumPy pool takes host (NumPy) arrays, got a device array "
            f"{getattr(x, 'dtype', '?')}{list(getattr(x, 'shape', ()))} (copy it to the host first)"
        )


def index_array(
    x: Any,
    name: str,
    *,
    dtype: Any = np.int32,
    low: int | None = None,
    high: int | None = None,
    trailing: tuple[int, ...] = (),
    what: str = "values",
    hint: str = "",
    error: type[Exception] = InvalidArgumentError,
) -> np.ndarray:
    """``x`` as a C-contiguous ``dtype`` array ``[n, *trailing]`` whose values all lie in ``[low, high)``.

    Takes NumPy integer arrays of any width, signed or unsigned, and lists or tuples of ints (an empty one
    is ``[0, *trailing]``; a list's elements are checked one by one as exact integers, so a bool in a
    list is refused and a list mixing NumPy and Python integers is ranged on its true values). The range
    is checked on the input's own values (exact integer ``min``/``max``) and narrowed to what ``dtype``
    holds, *before* the cast, so nothing wraps. The result is always a
    private array, copied *before* the checks: what was checked is what the caller uses (page ids and
    slots reach raw kernels and files), even if another thread writes ``x`` meanwhile.

    Args:
        x: the argument.
        name: the argument's name, for messages.
        dtype: np.int32 or np.int64, the type the kernels read.
        low, high: the half-open value range (None: the bounds of ``dtype``).
        trailing: the shape after the first axis (``(2,)`` for ``[n, 2]`` pairs).
        what, hint: how the message calls the values, and a note after the range.
        error: the class raised for a value out of range (InvalidPageError for page ids).

    Raises:
        InvalidDTypeError: ``x`` is a device array, None, a bool/float/complex/object/str array, a list
            holding anything but integers (a bool, a float), or has another shape.
        error: a value outside ``[low, high)``.
    """
    shape_text = "[n" + "".join(f", {t}" for t in trailing) + "]" if trailing else "1-D"
    if hasattr(x, "__cuda_array_interface__"):
        raise InvalidDTypeError(
            f"{name}: expected a host (NumPy) {shape_text} integer array, got {_describe(x)}"
        )
    t_lo, t_hi = _bounds(np.dtype(dtype))
    lo = t_lo if low is None else max(low, t_lo)
    hi = t_hi if high is None else min(high, t_hi)
    if isinstance(x, list | tuple):
        return _index_list(x, name, np.dtype(dtype), lo, hi, trailing, shape_text, what, hint, error)
    try:
        a = np.array(x, copy=True)  # never x itself, nor a view of it (see above)
    except (TypeError, ValueError, OverflowError):
        a = None
    if a is None or a.dtype.kind not in "iu" or a.ndim != 1 + len(trailing) or a.shape[1:] != trailing:
        want = f"a {shape_text} integer array or list ({np.dtype(dtype)} {what})"
        raise InvalidDTypeError(f"{name}: expected {want}, got {_describe(x)}")
    if a.size:
        # Exact Python ints of the input's own values; a side its dtype cannot reach is not reduced.
        a_lo, a_hi = _bounds(a.dtype)
        if a_lo < lo and (mn := int(a.min())) < lo:
            raise error(f"{name}: {what} must be in [{lo}, {hi}){hint}, got {mn}")
        if a_hi > hi and (mx := int(a.max())) >= hi:
            raise error(f"{name}: {what} must be in [{lo}, {hi}){hint}, got {mx}")
    return np.ascontiguousarray(a, dtype=dtype)


def _index_list(
    x: list[Any] | tuple[Any, ...],
    name: str,
    dtype: np.dtype[Any],
    lo: int,
    hi: int,
    trailing: tuple[int, ...],
    shape_text: str,
    what: str,
    hint: str,
    error: type[Exception],
) -> np.ndarray:
    """:func:`index_array` of a list or tuple, on its exact values: every element must be a Python or NumPy
    integer (never a bool: ``[True, 2]`` is refused as ``[True]`` is), ranged as a Python int.

    Why not ``np.array(x)``: NumPy turns a list that mixes types into float64 or object (``[np.uint64(5),
    -1]`` is float64: exact only below 2**53) and a bool beside ints into 0/1.
    """
    want = f"a {shape_text} integer array or list ({dtype} {what})"
    if len(x) == 0:
        return np.empty((0, *trailing), dtype=dtype)
    if not trailing:
        # The usual list of Python ints: NumPy's own conversion, when no bool hides in it (NumPy reads
        # a bool beside ints as 0/1) and the result is an integer array (exact: it holds each value).
        kinds = set(map(type, x))
        if bool not in kinds and np.bool_ not in kinds:
            try:
                a = np.array(x)
            except (TypeError, ValueError, OverflowError):
                a = None
            if a is not None and a.ndim == 1 and a.dtype.kind in "iu":
                mn, mx = int(a.min()), int(a.max())
                if mn < lo or mx >= hi:
                    raise error(f"{name}: {what} must be in [{lo}, {hi}){hint}, got {mn if mn < lo else mx}")
                return np.ascontiguousarray(a, dtype=dtype)
    try:
        exact = np.array(x, dtype=object)  # the elements themselves, nested lists unpacked
    except (TypeError, ValueError, OverflowError):
        exact = None
    if exact is None or exact.ndim != 1 + len(trailing) or exact.shape[1:] != trailing:
        raise InvalidDTypeError(f"{name}: expected {want}, got {_describe(x)}")
    values = [
        e.item() if isinstance(e, np.ndarray) and e.ndim == 0 else e  # a 0-d array inside a list
        for e in exact.reshape(-1).tolist()
    ]
    for e in values:
        if isinstance(e, bool | np.bool_) or not isinstance(e, int | np.integer):
            raise InvalidDTypeError(
                f"{name}: expected {want}, got a {type(e).__name__} element {e!r} (indices are integers)"
            )
    ints = [int(e) for e in values]
    if ints:
        mn, mx = min(ints), max(ints)
        if mn < lo or mx >= hi:
            raise error(f"{name}: {what} must be in [{lo}, {hi}){hint}, got {mn if mn < lo else mx}")
    return np.array(ints, dtype=dtype).reshape(exact.shape)


@functools.cache
def _bounds(dtype: np.dtype[Any]) -> tuple[int, int]:
    """The half-open value range ``[min, max + 1)`` of an integer dtype, as Python ints."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max) + 1


def check_array(x: Any, name: str) -> None:
    """``x`` must be an array (NumPy, CuPy or anything else with ``shape``, ``dtype`` and ``ndim``)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
        raise InvalidDTypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}")


def positive_scalar(x: Any, name: str) -> float:
    """A real number that is finite and > 0 as float32 (the kernels' type); returned as a float.

    Raises:
        InvalidDTypeError: a bool, a string, a complex number, a sequence, None.
        InvalidArgumentError: NaN, an infinity, zero, a negative number, or one that float32 turns into one.
    """
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iuf":
        x = x.item()
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Real):
        raise InvalidDTypeError(f"{name}: expected a real number, got {x!r}")
    try:
        value = float(x)
    except OverflowError:
        value = math.inf
    with np.errstate(over="ignore"):
        f32 = np.float32(value)
    if not (np.isfinite(f32) and f32 > 0):
        raise InvalidArgumentError(f"{name}: expected a finite number > 0 (as float32), got {x!r}")
    return value


def positive_array(x: Any, name: str) -> np.ndarray:
    """Host float32 values of ``x`` (any shape), each finite and > 0 after the cast to float32.

    Raises:
        InvalidDTypeError: ``x`` is not real numbers (bool, complex, object, str, None).
        InvalidArgumentError: a value is NaN, infinite, zero or negative as float32.
    """
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, OverflowError):
        a = None
    if a is None or a.dtype.kind not in "iuf":
        raise InvalidDTypeError(f"{name}: expected real numbers, got {_describe(x)}")
    with np.errstate(over="ignore", under="ignore"):
        f = a.astype(np.float32)
    bad = ~(np.isfinite(f) & (f > 0))
    if bad.any():
        raise InvalidArgumentError(
            f"{name}: scales must be finite and > 0 (as float32), got {a.reshape(-1)[bad.reshape(-1)][0]!r}"
        )
    return f
