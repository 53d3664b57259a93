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
    "REJECTION_STATUS",
    "ConfigError",
    "DoubleFreeError",
    "DuplicateSequenceError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidDTypeError",
    "InvalidPageError",
    "KVCoreError",
    "OutOfMemoryError",
    "RequestRejected",
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


#: ``RequestRejected.reason`` values and their HTTP status: 429 when the client sends too fast (retry
#: later with the same request), 503 when the server lacks the capacity (now, or ever: ``too_large`` and
#: ``tenant_quota`` come with ``retry_after_s=None``).
REJECTION_STATUS = {
    "queue_full": 429,  # the waiting queue holds max_queued_requests already
    # its prompt and first token need more pages than its tenant may ever hold (the tenant's ceiling,
    # or the cache less the other tenants' floors): no wait will help
    "tenant_quota": 503,
    "overloaded": 503,  # under memory pressure, long requests are refused (the controller's step 4)
    "timeout": 503,  # waited longer than max_queue_wait_s without getting memory
    "too_large": 503,  # needs more pages than the whole cache has: no wait will help
}


class RequestRejected(KVCoreError):
    """A request the scheduler refuses, decided before any work is spent on it.

    ``reason`` is one of :data:`REJECTION_STATUS` (``http_status`` maps it to 429 or 503);
    ``retry_after_s`` is a hint for the ``Retry-After`` header (None: retrying will not help);
    ``needed_pages`` is what the request would need that the cache could not give.
    """

    def __init__(
        self,
        reason: str,
        retry_after_s: float | None,
        needed_pages: int,
        request_id: int | None = None,
        message: str | None = None,
    ) -> None:
        if reason not in REJECTION_STATUS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.needed_pages = needed_pages
        self.request_id = request_id
        text = message or f"request rejected: {reason}"
        super().__init__(text)

    @property
    def http_status(self) -> int:
        """429 (rate: retry later) or 503 (capacity)."""
        return REJECTION_STATUS[self.reason]

    def __reduce__(self) -> tuple[object, ...]:  # picklable across processes (a server's workers)
        return (type(self), (self.reason, self.retry_after_s, self.needed_pages, self.request_id, str(self)))
