"""kvcore: the KV-cache manager an LLM serving engine embeds.

Public surface (see SPEC.md): :class:`PageAllocator`, the error hierarchy rooted at
:class:`KVCoreError`, and the sub-packages ``kvcore.sizing`` (how many tokens fit), and the ``kvcore``
command line. ``import kvcore`` never needs CuPy or a GPU.
"""

from __future__ import annotations

from kvcore._kvcore import PageAllocator, __version__
from kvcore.exceptions import (
    ConfigError,
    DoubleFreeError,
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidPageError,
    KVCoreError,
    TraceFormatError,
    UnknownSequenceError,
)

__all__ = [
    "ConfigError",
    "DoubleFreeError",
    "DuplicateSequenceError",
    "InvalidArgumentError",
    "InvalidDTypeError",
    "InvalidPageError",
    "KVCoreError",
    "PageAllocator",
    "TraceFormatError",
    "UnknownSequenceError",
    "__version__",
]
