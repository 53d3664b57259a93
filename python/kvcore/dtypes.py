"""The one precision table of kvcore: every cache and weight precision, its width and how it is stored.

Why one table: the pool (which precisions it stores, as what), the sizing formulas (how many bits an
element takes) and the kernels (which instantiations exist, with which C++ types) must agree on the same
facts; three copies of them drifted apart (``'i8'`` was int8 to the pool and unknown to sizing). Each of
``kvcore.pool.dtypes``, ``kvcore.sizing.dtypes`` and ``kvcore.kernels._nvrtc`` now reads this table and
keeps only its own policy: which subset it accepts and the error it raises for the rest.

Why no exception here: the pool and sizing refuse different names with different messages, so
:func:`canonical` returns ``None`` for an unknown name and each caller raises its own ``ConfigError``.

Why only the standard library: ``tools/check_cuda_kernels.py`` (CI) loads ``kernels/_nvrtc.py`` by path,
without NumPy or the native extension, and that module loads this file by path too. Storage dtypes are
therefore NumPy dtype *names*; ``kvcore.pool.dtypes.storage_dtype`` turns them into ``np.dtype``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, TypeGuard, get_args

__all__ = [
    "ALIASES",
    "KV_DTYPES",
    "POOL_DTYPES",
    "PRECISIONS",
    "SCALE_BYTES",
    "WEIGHT_DTYPES",
    "PoolDType",
    "Precision",
    "canonical",
    "is_pool_dtype",
]


@dataclass(frozen=True)
class Precision:
    """One precision, under its canonical name. A cache of a quantized precision holds ``x / scale``."""

    name: str  # canonical, lower case: what every kvcore API returns, and the suffix of kernel names
    bits: int  # width of one element, > 0; in bits so that int4 (half a byte) stays exact
    kv: bool  # a cache precision kvcore.sizing sizes (the pool stores only PoolDType of them)
    weight: bool  # a weight precision kvcore.sizing counts (4-bit formats without their group scales)
    quantized: bool  # stored as x / scale: one fp32 scale per (layer, K/V tensor, KV head) for a cache
    qmax: float  # largest magnitude stored when quantized (e4m3 448, int8 127); 1.0 when not quantized
    storage: str | None  # NumPy dtype name of a pool element (bf16, fp8: bit patterns); None off the pool
    cuda_type: str | None  # C++ type of a stored element (the tag's `storage`); None off the pool
    cuda_tag: str | None  # the kernels' cache tag (csrc/common.cuh), a template type; None off the pool


# Table order is the order of every listing and error message (fp32 first, as sizing always listed it).
_TABLE: Final[tuple[Precision, ...]] = (
    # name, bits, kv, weight, quantized, qmax, storage, cuda_type, cuda_tag
    Precision("fp32", 32, True, True, False, 1.0, None, None, None),
    Precision("fp16", 16, True, True, False, 1.0, "float16", "__half", "kv::CacheF16"),
    Precision("bf16", 16, True, True, False, 1.0, "uint16", "__nv_bfloat16", "kv::CacheBF16"),
    # fp8 is e4m3fn (no infinities, max 448); e5m2 is refused, never mapped.
    Precision("fp8", 8, True, True, True, 448.0, "uint8", "unsigned char", "kv::CacheFP8"),
    # int8 is symmetric: [-127, 127], -128 is never produced.
    Precision("int8", 8, True, True, True, 127.0, "int8", "signed char", "kv::CacheI8"),
    # int4: a lower-tier cache precision that sizing counts (symmetric [-7, 7]); the pool does not store it.
    Precision("int4", 4, True, True, True, 7.0, None, None, None),
    # fp4 (NVFP4 / MXFP4, e2m1: max 6): weights only.
    Precision("fp4", 4, False, True, True, 6.0, None, None, None),
)

PRECISIONS: Final[Mapping[str, Precision]] = MappingProxyType({p.name: p for p in _TABLE})

# Spellings found in configs and on command lines (lower case) -> canonical name; canonical names map
# to themselves without an entry.
ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "float32": "fp32",
        "float": "fp32",
        "f32": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "f16": "fp16",
        "bfloat16": "bf16",
        "fp8_e4m3": "fp8",
        "fp8-e4m3": "fp8",
        "e4m3": "fp8",
        "float8_e4m3fn": "fp8",
        "i8": "int8",
        "nvfp4": "fp4",
        "mxfp4": "fp4",
    }
)

# The precisions kvcore.pool stores and the kernels read: those with a storage dtype and a CUDA tag.
PoolDType = Literal["fp16", "bf16", "fp8", "int8"]

POOL_DTYPES: Final[tuple[PoolDType, ...]] = get_args(PoolDType)
KV_DTYPES: Final[tuple[str, ...]] = tuple(p.name for p in _TABLE if p.kv)
WEIGHT_DTYPES: Final[tuple[str, ...]] = tuple(p.name for p in _TABLE if p.weight)

# Bytes of one scale (fp32) of a quantized cache; one per layer, K/V tensor and KV head.
SCALE_BYTES: Final = 4


def canonical(name: str) -> str | None:
    """Canonical name of any precision (``'BF16'`` -> ``'bf16'``, ``'e4m3'`` -> ``'fp8'``), else None."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in PRECISIONS else None


def is_pool_dtype(name: str) -> TypeGuard[PoolDType]:
    """Whether a canonical name is one the pool stores (fp16, bf16, fp8, int8)."""
    return name in POOL_DTYPES
