"""Cache precisions of the KV pool and their bit-exact conversions, in NumPy (or CuPy) alone.

Why hand-written conversions: NumPy has neither bfloat16 nor float8, and kvcore takes no dependency for
them (no ``ml_dtypes``). The rules below are exactly those of the CUDA intrinsics the kernels call, so a
pool written on the CPU and one written on the GPU hold the same bytes:

- bf16: ``__float2bfloat16_rn`` = round to nearest, ties to even; stored as ``uint16`` bit patterns.
- fp8 e4m3 (``e4m3fn``: no infinities, max 448): ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``
  = round to nearest even, finite overflow and +-inf saturate to +-448, NaN -> 0x7F; stored as ``uint8``.
- int8: ``__float2int_rn`` then a clamp to [-127, 127] (symmetric: -128 is never produced).

Which precisions exist, their storage dtypes and their ``qmax`` come from :mod:`kvcore.dtypes` (the one
precision table); this module keeps the pool's policy (only those four, and its error for the rest) and
the conversions.

Quantized caches (fp8, int8) hold ``x / scale`` with one fp32 scale per (layer, kv head) for K and one for
V; the division is IEEE float32 on both backends so the stored bytes agree bit for bit.

The functions take an ``xp`` array module (``numpy`` by default, ``cupy`` works the same way) so the CuPy
backend can convert on the device without a kernel of its own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

import numpy as np

from kvcore import dtypes as _table
from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError
from kvcore.pool.checks import positive_array

__all__ = [
    "FP8_E4M3_MAX",
    "INT8_MAX",
    "KV_DTYPES",
    "KVDType",
    "bf16_bits_to_float",
    "decode",
    "e4m3_bits_to_float",
    "encode",
    "float_to_bf16_bits",
    "float_to_e4m3_bits",
    "is_quantized",
    "normalize_kv_dtype",
    "qmax",
    "storage_dtype",
    "to_float32",
]

KVDType = _table.PoolDType

# The pool's precisions, in kvcore.dtypes (the one table): fp8 means e4m3 (e5m2 is refused, not mapped).
KV_DTYPES: Final[tuple[KVDType, ...]] = _table.POOL_DTYPES

_STORAGE: Final[dict[KVDType, np.dtype[Any]]] = {
    name: np.dtype(storage) for name in KV_DTYPES if (storage := _table.PRECISIONS[name].storage)
}

FP8_E4M3_MAX: Final = _table.PRECISIONS["fp8"].qmax
INT8_MAX: Final = _table.PRECISIONS["int8"].qmax


def normalize_kv_dtype(kv_dtype: str) -> KVDType:
    """Canonical pool precision: ``'fp16' | 'bf16' | 'fp8' | 'int8'`` (fp8 is e4m3).

    Raises:
        ConfigError: an unknown name, or one the pool does not store (fp32, int4, fp8 e5m2).
    """
    if not isinstance(kv_dtype, str):
        raise ConfigError(f"kv_dtype: expected a precision name such as 'bf16', got {kv_dtype!r}")
    name = _table.canonical(kv_dtype)
    if name is None or not _table.is_pool_dtype(name):
        raise ConfigError(
            f"kv_dtype: the KV pool stores {', '.join(KV_DTYPES)} (fp8 = e4m3), not {kv_dtype!r}"
        )
    return name


def storage_dtype(kv_dtype: str) -> np.dtype[Any]:
    """NumPy dtype of the pool's elements: float16, uint16 (bf16 bits), uint8 (e4m3 bits) or int8."""
    return _STORAGE[normalize_kv_dtype(kv_dtype)]


def is_quantized(kv_dtype: str) -> bool:
    """True for the precisions stored as ``x / scale`` (fp8, int8)."""
    return _table.PRECISIONS[normalize_kv_dtype(kv_dtype)].quantized


def qmax(kv_dtype: str) -> float:
    """Largest magnitude a quantized precision stores (448 for e4m3, 127 for int8; 1.0 otherwise)."""
    return _table.PRECISIONS[normalize_kv_dtype(kv_dtype)].qmax


# ----------------------------------------------------------------------------------------------- bf16


def float_to_bf16_bits(x: Any, xp: ModuleType = np) -> Any:
    """Round float values to bf16 (nearest, ties to even); returns ``uint16`` bit patterns, same shape.

    NaN becomes a quiet NaN of the same sign (0x7FC0 | sign); values that round past the largest finite
    bf16 become infinity, as ``__float2bfloat16_rn`` does.
    """
    f = xp.asarray(x, dtype=xp.float32)
    flat = xp.ascontiguousarray(f.reshape(-1))
    u = flat.view(xp.uint32)
    rounded = (u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
    nan = (u >> xp.uint32(16) & xp.uint32(0x8000)) | xp.uint32(0x7FC0)
    return xp.where(xp.isnan(flat), nan, rounded).astype(xp.uint16).reshape(f.shape)


def bf16_bits_to_float(bits: Any, xp: ModuleType = np) -> Any:
    """Exact float32 values of ``uint16`` bf16 bit patterns, same shape."""
    b = xp.asarray(bits)
    if b.dtype != xp.uint16:
        raise InvalidDTypeError(f"bf16 bit patterns must be uint16, got {b.dtype}")
    wide = xp.ascontiguousarray((b.astype(xp.uint32) << xp.uint32(16)).reshape(-1))
    return wide.view(xp.float32).reshape(b.shape)


# ---------------------------------------------------------------------------------------------- e4m3


def _e4m3_table() -> np.ndarray:
    """float32 [256]: the value of every e4m3fn bit pattern (0x7F and 0xFF are NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    mag = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    out = (sign * mag).astype(np.float32)
    out[(b & 0x7F) == 0x7F] = np.nan
    return out


E4M3_TABLE: Final[np.ndarray] = _e4m3_table()


def float_to_e4m3_bits(x: Any, xp: ModuleType = np) -> Any:
    """Round float values to fp8 e4m3fn with saturation; returns ``uint8`` bit patterns, same shape.

    Rules of ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``: round to nearest even at the
    precision of the value's binade (3 mantissa bits; subnormals are multiples of 2^-9), magnitudes
    above 448 (infinities included) saturate to 448, NaN becomes 0x7F.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        f = xp.asarray(x, dtype=xp.float32).astype(xp.float64)
    a = xp.abs(f)
    # Binade exponent floor(log2 a), floored at -6 (the subnormal range shares the quantum 2^-9).
    _, e = xp.frexp(a)
    e = xp.maximum(e - 1, -6)
    quantum = xp.ldexp(xp.ones_like(a), e - 3)
    # Exact in float64: a / quantum is a scaled float32 value; rint rounds ties to even.
    q = xp.minimum(xp.rint(a / quantum) * quantum, FP8_E4M3_MAX)
    q = xp.where(xp.isnan(a), 0.0, q)
    _, e2 = xp.frexp(q)
    e2 = e2 - 1
    normal = q >= 2.0**-6
    exp_bits = xp.where(normal, e2 + 7, 0)
    man_bits = xp.where(normal, (xp.ldexp(q, -e2) - 1.0) * 8.0, q * 2.0**9)
    mag_bits = (exp_bits.astype(xp.int64) << 3) | xp.rint(man_bits).astype(xp.int64)
    sign_bits = xp.where(xp.signbit(f), 0x80, 0)
    return xp.where(xp.isnan(a), 0x7F, sign_bits | mag_bits).astype(xp.uint8)


def e4m3_bits_to_float(bits: Any, xp: ModuleType = np) -> Any:
    """Exact float32 values of ``uint8`` e4m3fn bit patterns, same shape (by a 256-entry table)."""
    b = xp.asarray(bits)
    if b.dtype != xp.uint8:
        raise InvalidDTypeError(f"fp8 e4m3 bit patterns must be uint8, got {b.dtype}")
    return xp.asarray(E4M3_TABLE)[b]


# ------------------------------------------------------------------------------------- encode/decode


def _scale(scale: Any, shape: tuple[int, ...], xp: ModuleType) -> Any:
    """A quantization scale as float32, broadcastable to ``shape`` (the values' shape, kept): host scales
    must be finite and > 0 (x / 0 or x * NaN would be stored silently); device scales are the pool's,
    checked when set (reading them here would synchronize)."""
    s = positive_array(scale, "scale") if xp is np else xp.asarray(scale, dtype=xp.float32)
    try:
        fits = np.broadcast_shapes(s.shape, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise InvalidArgumentError(
            f"scale: shape {list(s.shape)} does not broadcast to the values' {list(shape)}"
        )
    return s


def to_float32(x: Any, xp: ModuleType = np) -> Any:
    """Activation values as float32: float16/32/64 are cast, ``uint16`` is read as bf16 bit patterns."""
    a = xp.asarray(x)
    if a.dtype == xp.uint16:
        return bf16_bits_to_float(a, xp)
    if a.dtype.kind != "f":
        raise InvalidDTypeError(f"expected float16/32/64 or uint16 (bf16 bits) values, got {a.dtype}")
    return a.astype(xp.float32, copy=False)


def encode(x: Any, kv_dtype: str, scale: Any = 1.0, xp: ModuleType = np) -> Any:
    """Values as stored in a pool of ``kv_dtype``: ``x`` (fp16/bf16) or ``x / scale`` (fp8/int8).

    Args:
        x: activation values (any float dtype, or uint16 bf16 bits), any shape ``S``. float64 values are
            rounded to float32 first, as :func:`to_float32` does (so a value within about 2**-29 of a tie
            of the target may round the other way; the kernels take 16-bit or float32 activations).
        kv_dtype: the pool precision.
        scale: float32 broadcastable to ``S`` (per-head scales broadcast over the head axis), finite and
            > 0; only used by fp8 and int8.

    Returns:
        ``S`` array of :func:`storage_dtype` (``kv_dtype``).

    Raises:
        InvalidDTypeError: ``x`` is not float activations, or a host ``scale`` is not real numbers.
        InvalidArgumentError: a host ``scale`` that is not finite and > 0, or that does not broadcast to
            ``S`` (fp8, int8).
    """
    name = normalize_kv_dtype(kv_dtype)
    f = to_float32(x, xp)
    if name == "fp16":
        return f.astype(xp.float16)
    if name == "bf16":
        return float_to_bf16_bits(f, xp)
    y = f / _scale(scale, f.shape, xp)
    if name == "fp8":
        return float_to_e4m3_bits(y, xp)
    return xp.clip(xp.rint(y), -INT8_MAX, INT8_MAX).astype(xp.int8)


def decode(stored: Any, kv_dtype: str, scale: Any = 1.0, xp: ModuleType = np) -> Any:
    """float32 values of pool elements: the inverse of :func:`encode` up to its rounding.

    Args:
        stored: ``S`` array of :func:`storage_dtype` (``kv_dtype``).
        kv_dtype: the pool precision.
        scale: float32 broadcastable to ``S``, finite and > 0; only used by fp8 and int8.

    Raises:
        InvalidDTypeError: ``stored`` is not the storage dtype of ``kv_dtype``, or a host ``scale`` is
            not real numbers.
        InvalidArgumentError: a host ``scale`` that is not finite and > 0, or that does not broadcast to
            ``S`` (fp8, int8).
    """
    name = normalize_kv_dtype(kv_dtype)
    s = xp.asarray(stored)
    if s.dtype != _STORAGE[name]:
        raise InvalidDTypeError(f"a {name} pool stores {_STORAGE[name]}, got {s.dtype}")
    if name == "fp16":
        return s.astype(xp.float32)
    if name == "bf16":
        return bf16_bits_to_float(s, xp)
    base = e4m3_bits_to_float(s, xp) if name == "fp8" else s.astype(xp.float32)
    return base * _scale(scale, base.shape, xp)
