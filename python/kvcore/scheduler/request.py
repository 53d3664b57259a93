"""What goes into the scheduler (:class:`Request`) and what comes out of each step (:class:`StepPlan`,
:class:`SchedulerEvent`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import InvalidArgumentError, RequestRejected
from kvcore.manager import PageTable

__all__ = ["EVENT_KINDS", "MAX_SEQ_LEN", "Request", "SchedulerEvent", "StepPlan"]

_MAX_TOKEN = 2**32 - 1
_MAX_SEQ_ID = 2**63 - 1
#: Most tokens a sequence may reach, its prompt and answer together: positions are int32.
MAX_SEQ_LEN = 2**31 - 1
_PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # the manager's priorities are int32


def is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_namespace(ns: object, what: str = "namespace") -> str | None:
    """``ns`` if the manager accepts it as a namespace (None, or a str without lone surrogates)."""
    if ns is None:
        return None
    if not isinstance(ns, str):
        raise InvalidArgumentError(f"{what} must be None or a str, got {type(ns).__name__}")
    try:
        ns.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} must be valid Unicode (it holds a lone surrogate)") from None
    return ns


@dataclass(frozen=True, eq=False)
class Request:
    """One generation request.

    ``request_id`` is also its sequence id in the manager: unique among the scheduler's live requests.
    ``priority``: higher is served first (priority queue) and preempted last; an int32, as the manager's.
    ``namespace``: the tenant (prefix sharing and quotas): None (the default one) or a str.
    ``request_class``: the class whose output lengths predict this one's
    (:class:`~kvcore.scheduler.OutputLengthEstimator`). ``max_new_tokens``: at most this many tokens are
    generated; the prompt and the answer together stay within :data:`MAX_SEQ_LEN` tokens (positions are
    int32). ``window``: opt in to truncation under pressure, the prompt then keeps its ``sink_tokens``
    first tokens and its most recent ones, ``window`` tokens in all. ``stop_token_ids``: token ids in
    ``[0, 2**32)``; a sampled one finishes the request (reason ``"stop"``).

    Every field is checked here (InvalidArgumentError naming it), so that a request the scheduler
    accepts is one the manager accepts too. ``prompt`` is kept as a read-only uint32 copy: what the
    scheduler computes is what was submitted, whatever the caller does with its own buffer.
    """

    request_id: int
    prompt: Sequence[int] | npt.NDArray[np.integer[Any]]
    max_new_tokens: int
    priority: int = 0
    namespace: str | None = None
    request_class: str = "default"
    window: int | None = None
    sink_tokens: int = 4
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        rid = self.request_id
        if not is_int(rid) or not 0 <= rid <= _MAX_SEQ_ID:
            raise InvalidArgumentError(f"request_id must be an integer in [0, 2**63), got {rid!r}")
        object.__setattr__(self, "request_id", int(rid))
        arr = np.asarray(self.prompt)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidArgumentError("prompt must be a non-empty 1-D sequence of token ids")
        if arr.dtype.kind not in "iu":
            raise InvalidArgumentError(f"prompt token ids must be integers, got dtype {arr.dtype}")
        if int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN:
            raise InvalidArgumentError("prompt token ids must be in [0, 2**32)")
        if arr.size >= MAX_SEQ_LEN:
            raise InvalidArgumentError(f"prompt must be shorter than {MAX_SEQ_LEN} tokens")
        # A private, read-only copy: the scheduler computes later prefill chunks from it, under the
        # keys of the tokens the manager was given at admission; a caller writing to it then made
        # cached pages of other tokens than their keys say (other requests read them).
        # Over immutable bytes: setflags(write=True) cannot make it writable again.
        prompt = np.frombuffer(arr.astype(np.uint32, copy=False).tobytes(), dtype=np.uint32)
        object.__setattr__(self, "prompt", prompt)
        for name, low in (("max_new_tokens", 1), ("sink_tokens", 0)):
            v = getattr(self, name)
            if not is_int(v) or v < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {v!r}")
            object.__setattr__(self, name, int(v))
        room = MAX_SEQ_LEN - arr.size
        if self.max_new_tokens > room:
            raise InvalidArgumentError(
                f"max_new_tokens must be at most {room} (prompt and answer within {MAX_SEQ_LEN} tokens, "
                f"positions are int32), got {self.max_new_tokens}"
            )
        w = self.window
        if w is not None and (not is_int(w) or w <= self.sink_tokens):
            raise InvalidArgumentError(f"window must be None or an integer > sink_tokens, got {w!r}")
        if w is not None:
            object.__setattr__(self, "window", int(w))
        p = self.priority
        low, high = _PRIORITY_RANGE
        if not is_int(p) or not low <= p <= high:
            raise InvalidArgumentError(f"priority must be an integer in the int32 range, got {p!r}")
        object.__setattr__(self, "priority", int(p))
        check_namespace(self.namespace)
        if not isinstance(self.request_class, str):
            raise InvalidArgumentError("request_class must be a string")
        object.__setattr__(self, "stop_token_ids", _stop_ids(self.stop_token_ids))

    def __reduce__(self) -> tuple[type[Request], tuple[Any, ...]]:
        # pickle and copy.deepcopy rebuild through __init__, so the copy is checked and its prompt
        # read-only as well (their default restores __dict__, with a writable prompt array).
        return (type(self), tuple(getattr(self, f.name) for f in fields(self)))

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


def _stop_ids(ids: object) -> frozenset[int]:
    """``stop_token_ids`` as a frozenset of ints: an iterable (not a string) of token ids."""
    bad = InvalidArgumentError(f"stop_token_ids must be an iterable of token ids, got {type(ids).__name__}")
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
        raise bad
    try:
        items = list(ids)
    except TypeError:  # a 0-d array, an iterator that fails
        raise bad from None
    out: set[int] = set()
    for t in items:
        if not is_int(t) or not 0 <= t <= _MAX_TOKEN:
            raise InvalidArgumentError(f"stop_token_ids must be integers in [0, 2**32), got {t!r}")
        out.add(int(t))
    return frozenset(out)


#: Kinds of :class:`SchedulerEvent`.
EVENT_KINDS = (
    "queued",  # accepted by submit
    "rejected",  # refused (detail: reason, http_status, needed_pages)
    "admitted",  # got its sequence (detail: hit_tokens, resumed, hbm_prefix_tokens: its uncapped HBM prefix)
    "loading",  # admitted with a lower-tier hit still loading
    "truncated",  # prompt cut to its window (detail: from_len, to_len)
    "preempted",  # freed to make room (detail: kind swap|recompute, computed_tokens)
    "finished",  # done (detail: reason length|stop|abort|capacity, output_len)
    "pressure",  # the controller changed level (detail: from, to, trigger)
    "evicted",  # the controller evicted cached pages (detail: pages)
    "scale_out",  # the controller's scale-out signal (detail: pages)
    "store_policy",  # the controller changed the lower tiers' store policy (detail: policy, options)
    "pins_capped",  # the controller shortened the cache's pins (detail: pins, ttl_s)
    # prefix_lookup raised: the lookup is advisory, the admission went on as if it found nothing more
    # (detail: error, the exception's type and message); counted in SchedulerStats.num_failed_lookups
    "lookup_failed",
)


@dataclass(frozen=True)
class SchedulerEvent:
    """One decision of the scheduler, at simulated or real time ``time_s`` (the caller's clock)."""

    kind: str
    request_id: int | None
    time_s: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepPlan:
    """What to compute in one forward pass, and what the scheduler decided to get there.

    Row ``i`` of the batch is request ``request_ids[i]``: compute its tokens ``[starts[i], starts[i] +
    num_tokens[i])`` (``token_ids`` / ``positions`` / ``slot_mapping`` rows ``q_indptr[i]:q_indptr[i +
    1]``), attending to the pages of ``page_table`` row ``i`` (cut at the chunk's end, so a chunk never
    sees the slots after it). ``sample[i]``: the row's last logits give the request's next token (report
    it with :meth:`Scheduler.update`); a prefill chunk that ends before the prompt does not sample.
    Apply ``copies`` (``kernels.copy_pages``) before any K/V write.
    """

    time_s: float
    request_ids: npt.NDArray[np.int64]  # [batch]
    starts: npt.NDArray[np.int32]  # [batch] first position computed
    num_tokens: npt.NDArray[np.int32]  # [batch] tokens computed (1 for a decode row)
    is_prefill: npt.NDArray[np.bool_]  # [batch] prompt (or recomputed) tokens, not a decode step
    sample: npt.NDArray[np.bool_]  # [batch] the row samples a token
    q_indptr: npt.NDArray[np.int32]  # [batch + 1]
    token_ids: npt.NDArray[np.uint32]  # [q_indptr[-1]]
    positions: npt.NDArray[np.int32]  # [q_indptr[-1]] each token's position in its sequence
    slot_mapping: npt.NDArray[np.int64]  # [q_indptr[-1]] page * page_size + offset of each token
    page_table: PageTable  # batch rows
    copies: npt.NDArray[np.int32]  # [n, 2] copy-on-write (src, dst) pairs, before any write
    loading: list[int]  # admitted requests waiting for lower-tier loads (not in the batch)
    finished: list[tuple[int, str]]  # (request_id, reason) ended during planning
    rejected: list[RequestRejected]  # queued requests refused during planning (timeouts)
    events: list[SchedulerEvent]  # every decision since the last plan, in order
    level: int  # the pressure level applied (0 without a controller)

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    @property
    def num_batched_tokens(self) -> int:
        return int(self.q_indptr[-1])

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.num_tokens[self.is_prefill].sum())

    @property
    def num_decode(self) -> int:
        return int((~self.is_prefill).sum())

    def __bool__(self) -> bool:
        return self.batch_size > 0


def check_time(now: float) -> float:
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise InvalidArgumentError(f"now must be a finite number of seconds, got {now!r}")
    try:
        t = float(now)  # an int past a float's range overflows here
    except OverflowError:
        t = math.inf
    if not math.isfinite(t):
        raise InvalidArgumentError(f"now must be a finite number of seconds, got {now!r}")
    return t
