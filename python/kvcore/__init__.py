"""kvcore: the KV-cache manager an LLM serving engine embeds.

Public surface (see SPEC.md): :class:`PageAllocator`, :class:`KVCacheManager` (with
:class:`PageTable` and :class:`CacheStats`), the error hierarchy rooted at
:class:`KVCoreError`, and the sub-packages ``kvcore.sizing`` (how many tokens fit), and the ``kvcore``
command line. ``import kvcore`` never needs CuPy or a GPU.
"""

from __future__ import annotations

from kvcore._kvcore import KVCacheManager, PageAllocator, __version__
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
from kvcore.manager import PUBLIC_NAMESPACE, CacheStats, PageTable

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
    "TraceFormatError",
    "UnknownSequenceError",
    "__version__",
]
