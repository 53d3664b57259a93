"""The KV pool: paged K/V bytes in one allocation, NumPy or CuPy, fp16/bf16/fp8/int8.

``import kvcore.pool`` never imports CuPy; the ``cupy`` backend imports it when a pool asks for it.
Reference: ``docs/api.md`` (``kvcore.pool.KVPool``).
"""

from __future__ import annotations

from kvcore.pool.backend import Backend, BackendName, get_backend
from kvcore.pool.dtypes import KV_DTYPES, KVDType
from kvcore.pool.kv_pool import KVPool, Layout, PoolStrides

__all__ = [
    "KV_DTYPES",
    "Backend",
    "BackendName",
    "KVDType",
    "KVPool",
    "Layout",
    "PoolStrides",
    "get_backend",
]
