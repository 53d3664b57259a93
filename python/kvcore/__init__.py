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

from typing import Any

from kvcore._kvcore import MAX_EVENTS, KVCacheManager, PageAllocator, __version__, page_keys
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
from kvcore.manager import (
    PUBLIC_NAMESPACE,
    BatchLayout,
    CacheStats,
    MissRatioCurve,
    PageTable,
    PrefixHit,
    PrefixMatch,
    TransferBatch,
)

# Sub-packages, imported on first use (``kvcore.tiers.HostTier`` after a plain ``import kvcore``): none
# of them is paid for by a caller that does not use it (matplotlib, prometheus_client, CuPy stay
# unimported until their own module asks).
_SUBMODULES = frozenset(
    {"events", "kernels", "metrics", "pool", "replay", "scheduler", "sizing", "tiers", "tiny", "dtypes"}
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"kvcore.{name}")
    raise AttributeError(f"module 'kvcore' has no attribute {name!r}")


__all__ = [
    "MAX_EVENTS",
    "PUBLIC_NAMESPACE",
    "BatchLayout",
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
    "MissRatioCurve",
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
