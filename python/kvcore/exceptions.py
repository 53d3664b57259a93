"""The one exception hierarchy of kvcore.

Every error kvcore raises on purpose derives from :class:`KVCoreError`. Where a built-in category
fits, the class also derives from it (``ValueError``, ``KeyError``, ``TypeError``, ``MemoryError``,
``RuntimeError``), so callers can catch either. Running out of pages is *not* an error: allocation
returns ``None`` and ``append`` returns ``False``. The Rust core raises these same classes (its
bindings resolve them all once, when the native module is imported, into a typed table), so there is
exactly one definition of each.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DoubleFreeError",
    "DuplicateSequenceError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidDTypeError",
    "InvalidPageError",
    "KVCoreError",
    "OutOfMemoryError",
    "TraceFormatError",
    "UnknownSequenceError",
]


class KVCoreError(Exception):
    """Root of every kvcore error."""


class InvalidArgumentError(KVCoreError, ValueError):
    """An argument is out of its allowed range (a negative count, an empty prompt, ...)."""


class InvalidDTypeError(KVCoreError, TypeError):
    """An array has the wrong dtype, shape or memory layout (page ids must be 1-D int32)."""


class InvalidPageError(KVCoreError, ValueError):
    """A page id is out of range, is the null page 0, or is not in the state the call needs."""


class DoubleFreeError(InvalidPageError):
    """A page was freed (or retained) while it was already free."""


class UnknownSequenceError(KVCoreError, KeyError):
    """A sequence id that the manager does not hold."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicateSequenceError(KVCoreError, ValueError):
    """A sequence id that the manager already holds."""


class OutOfMemoryError(KVCoreError, MemoryError):
    """A construction needs more memory than the process can get (nothing was built)."""


class InternalError(KVCoreError, RuntimeError):
    """One of kvcore's own invariants is broken: a bug in kvcore, never the caller's mistake.

    Please report it with the call that raised it.
    """


class ConfigError(KVCoreError, ValueError):
    """A model description, preset or plan request is unknown, incomplete or contradictory."""


class TraceFormatError(KVCoreError, ValueError):
    """A workload trace line is malformed; the message names the line and the field."""
