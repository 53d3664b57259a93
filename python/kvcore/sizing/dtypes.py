"""Element widths of cache and weight precisions, and the scale overhead of quantized caches.

Why a module of its own: the cache precision and the weight precision are *separate* decisions (a
4-bit model can keep a BF16 cache), so kvcore names them separately and never derives one from the
other. Widths are kept in bits so that int4 (half a byte) stays exact; byte counts are rounded up to
whole bytes only once, at the end of a computation.

Scale overhead (kvcore's layout, shared with ``kvcore.pool``): a quantized cache (fp8, int8, int4) keeps
one fp32 scale per layer, per K/V tensor and per KV head (static per-head scaling, like vLLM's
``k_scale``/``v_scale``). That is a constant ``2 × layers × kv_heads × 4`` bytes per pool, not a cost per
token: 2,048 bytes for 32 layers × 8 heads. The plain formula (:func:`kvcore.sizing.kv_cache_bytes`)
never includes scales; totals that do say so.

The widths, names and spellings are those of :mod:`kvcore.dtypes` (the one precision table, shared with
the pool and the kernels); this module keeps sizing's policy: which names it accepts and its errors.
"""

from __future__ import annotations

from kvcore import dtypes as _table
from kvcore.exceptions import ConfigError

__all__ = [
    "KV_DTYPES",
    "SCALE_BYTES",
    "WEIGHT_DTYPES",
    "is_quantized_kv_dtype",
    "kv_dtype_bits",
    "kv_dtype_bytes",
    "normalize_kv_dtype",
    "normalize_weight_dtype",
    "weight_dtype_bits",
]

# Canonical cache and weight precisions, their widths and spellings: kvcore.dtypes (the one table).
KV_DTYPES: tuple[str, ...] = _table.KV_DTYPES
WEIGHT_DTYPES: tuple[str, ...] = _table.WEIGHT_DTYPES

# Bytes of one scale (fp32) in a quantized cache; one per layer, K/V tensor and KV head (module docstring).
SCALE_BYTES = _table.SCALE_BYTES


def _canonical(name: object, names: tuple[str, ...], field: str) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"{field}: expected a precision name such as 'bf16', got {name!r}")
    key = _table.canonical(name)
    if key is None or key not in names:
        raise ConfigError(f"{field}: unknown precision {name!r}; expected one of {', '.join(names)}")
    return key


def normalize_kv_dtype(kv_dtype: str) -> str:
    """Canonical name of a cache precision (``'BF16'`` -> ``'bf16'``, ``'e4m3'`` -> ``'fp8'``).

    Raises:
        ConfigError: the name is not a cache precision kvcore knows (fp32, fp16, bf16, fp8, int8, int4).
    """
    return _canonical(kv_dtype, KV_DTYPES, "kv_dtype")


def normalize_weight_dtype(weight_dtype: str) -> str:
    """Canonical name of a weight precision (the cache precision names plus ``fp4``)."""
    return _canonical(weight_dtype, WEIGHT_DTYPES, "weight_dtype")


def kv_dtype_bits(kv_dtype: str) -> int:
    """Width of one cached element in bits (int4 -> 4), so that sums stay exact integers."""
    return _table.PRECISIONS[normalize_kv_dtype(kv_dtype)].bits


def kv_dtype_bytes(kv_dtype: str) -> float:
    """Bytes per cached element: fp32 4, fp16/bf16 2, fp8/int8 1, int4 0.5 (case-insensitive).

    Raises:
        ConfigError: unknown precision (the message names ``kv_dtype`` and lists the valid ones).
    """
    return kv_dtype_bits(kv_dtype) / 8


def weight_dtype_bits(weight_dtype: str) -> int:
    """Width of one weight in bits (group scales of 4-bit formats are not counted)."""
    return _table.PRECISIONS[normalize_weight_dtype(weight_dtype)].bits


def is_quantized_kv_dtype(kv_dtype: str) -> bool:
    """True for the precisions that carry scales in kvcore's layout (fp8, int8, int4)."""
    return _table.PRECISIONS[normalize_kv_dtype(kv_dtype)].quantized
