"""kvcore: the KV-cache manager an LLM serving engine embeds.

Public surface: :class:`PageAllocator`, :class:`KVCacheManager` (with :class:`PageTable` and
:class:`CacheStats`), the error hierarchy rooted at :class:`KVCoreError`, the sub-packages
``kvcore.sizing`` (how many tokens fit), ``kvcore.pool`` and ``kvcore.kernels`` (the K/V bytes and the
kernels that read them) and ``kvcore.replay`` (a workload through the real manager), and the ``kvcore``
command line. ``import kvcore`` never needs CuPy or a GPU.

Reference: ``docs/api.md`` (every call, its contract and its failures) and ``docs/architecture.md``
(layers, page ownership, concurrency, errors).
"""

from __future__ import annotations

from kvcore._kvcore import KVCacheManager, PageAllocator, __version__, page_keys
from kvcore.exceptions import (
    ConfigError,
    DoubleFreeError,
    DuplicateSequenceError,
    InternalError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidPageError,
    KVCoreError,
    OutOfMemoryError,
    TraceFormatError,
    UnknownSequenceError,
)
from kvcore.manager import PUBLIC_NAMESPACE, CacheStats, PageTable, PrefixHit, PrefixMatch, TransferBatch

__all__ = [
    "PUBLIC_NAMESPACE",
    "CacheStats",
    "ConfigError",
    "DoubleFreeError",
    "DuplicateSequenceError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidDTypeError",
    "InvalidPageError",
    "KVCacheManager",
    "KVCoreError",
    "OutOfMemoryError",
    "PageAllocator",
    "PageTable",
    "PrefixHit",
    "PrefixMatch",
    "TraceFormatError",
    "TransferBatch",
    "UnknownSequenceError",
    "__version__",
    "page_keys",
]
