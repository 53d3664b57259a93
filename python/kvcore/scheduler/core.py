"""The continuous-batching scheduler: requests in, one :class:`StepPlan` per forward pass out.

An engine (or ``kvcore replay`` in timed mode, in simulated time, or ``kvcore demo``) drives it::

    sched = Scheduler(cache, max_num_batched_tokens=2048, max_num_seqs=256, controller=PressureController())
    sched.submit(Request(7, prompt, max_new_tokens=256), now)   # may raise RequestRejected (429 / 503)
    while sched.has_work():
        plan = sched.step(now)          # who computes which tokens, their tables and slots
        logits = engine.forward(plan)   # apply plan.copies, write K/V at plan.slot_mapping, attend
        sched.update(plan, {rid: token for the rows with plan.sample})
    sched.finish(rid)                   # EOS seen by the engine, or the client went away

There is no clock inside (``now`` is the caller's, real or simulated) and no metrics: everything it
decides is an event (:class:`SchedulerEvent`) in the next plan, and counted in :meth:`Scheduler.stats`.

**The contract: one update per plan with rows, before the next step.** A step appends each decoding
request's sampled token to its sequence; ``update`` says the K/V were written. So ``step`` raises
InvalidArgumentError (nothing changed) while the last plan with rows is not recorded, unless every
request of it has ended since (``finish``); an engine whose forward pass failed runs the same plan
again. ``update`` records the latest plan only, once (any other plan changes nothing). A step that
raises (the manager, an estimator) releases its decode appends first (``truncate``), so that the
manager holds what the scheduler does; ``prefix_lookup`` is advisory and its failures never escape
(a ``lookup_failed`` event, ``stats().num_failed_lookups``).

**Each step**, in order (vLLM V1's order: running requests first, then admissions):

1. Requests that waited longer than ``max_queue_wait_s`` are refused (``timeout``, 503).
2. The pressure controller, if any, reads the step's signals and decides the level's responses.
   Requests whose lower-tier loads completed join the running ones (a failed load cut the hit: the
   prompt is computed from there).
3. Running requests that decode get one slot each (``append``, one batched call); a prefill chunk
   (chunked prefill) gets its slots (``reserve``), within the token budget
   ``max_num_batched_tokens`` and at most ``long_prefill_token_threshold`` tokens per request (more
   decoding requests than the budget has tokens take turns, round robin). When a
   slot cannot be had, a victim is preempted: lowest priority first, then the youngest (most recently
   admitted); it leaves by **swap** (its pages stored to the first lower tier, when that costs less
   than recomputing them, see :class:`SwapCost`) or by **recompute**, and returns to the front of the
   queue. A request that cannot grow even alone ends (``capacity``), unless room comes back (pages
   being swapped out, or requests still loading, which hold pages and can be preempted once they run):
   then it waits a step.
4. Queued requests are admitted while the budget, the running cap and the memory allow: preempted ones
   first, then by arrival (``fcfs``) or by priority (``priority``). **Admission predicts demand**: a
   request needs its prompt's pages not already cached (an exact, side-effect-free prefix lookup)
   plus the output pages its class's answers reach at quantile ``1 - target_preemption_prob``
   (:class:`OutputLengthEstimator`), and the live requests keep the pages of their own expected
   answers and of their prompts' chunks not yet reserved. After each admission the room is read again
   from the cache (a hit on cached, evictable pages takes them out of it). ``prefix_lookup`` (e.g.
   ``Mover.lookup``, for a shared tier) runs just before each admission's ``add_sequence``. Past
   ``max_preemption_tax`` (recomputed / computed tokens), no new request is admitted until the tax
   falls back; preempted ones still return.

**Tenant quotas** (``tenant_max_pages``, ``tenant_min_pages``): a tenant's running requests hold at most
its ceiling (every page they hold counts, prefix hits included, with their expected answers), and no
admission of another tenant eats into the part of a tenant's floor it does not use; the floor is also
the cache's (``KVCacheManager.set_tenant_floor``): the tenant's cached pages up to it are evicted only
when nothing else can be. As with memory, a quota never holds a request back forever: with nothing
of its tenant live, the ceiling's predicted-demand test is waived (alone, a request may outgrow its
plan), and with nothing live at all, so is the floors'. A request that can never fit, its prompt and
first token above its tenant's ceiling or above the cache less the other tenants' floors, is refused
(``tenant_quota``, 503, no ``retry_after_s``): at submit, or in the step that would have admitted it
when its prompt was judged by a window that was not cut.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import (
    ConfigError,
    InvalidArgumentError,
    RequestRejected,
    UnknownSequenceError,
)
from kvcore.manager import PUBLIC_NAMESPACE, PageTable
from kvcore.scheduler.admission import OutputLengthEstimator, PageModel
from kvcore.scheduler.pressure import PressureController, PressureDecision, Signals
from kvcore.scheduler.request import Request, SchedulerEvent, StepPlan, check_namespace, check_time, is_int

__all__ = ["FINISH_REASONS", "QUEUE_POLICIES", "Scheduler", "SchedulerStats", "SwapCost"]

QUEUE_POLICIES = ("fcfs", "priority")
#: Reasons an engine may give :meth:`Scheduler.finish`: ``stop`` (an EOS or a stop string the engine
#: saw), ``length`` (a length limit of the engine's own, e.g. the model's context), ``abort`` (the
#: client went away). ``stop`` and ``length`` answers feed the output-length estimator; the scheduler's
#: own endings are ``length`` and ``stop`` (update) and ``capacity`` (counted as a ``too_large``
#: rejection).
FINISH_REASONS = ("stop", "length", "abort")
_MAX_PAGES = 2**63 - 1

_WAITING, _LOADING, _RUNNING, _DONE = 0, 1, 2, 3
_EMPTY_I32 = np.zeros(0, np.int32)


@dataclass(frozen=True)
class SwapCost:
    """What a preemption by swap costs against one by recompute.

    Swap: the victim's computed pages go to the manager's first lower tier and come back on resume,
    ``2 x pages x page_bytes / bandwidth``. Recompute: its computed tokens are prefilled again,
    ``tokens / prefill_tokens_per_s``. The cheaper one is taken.
    """

    page_bytes: int  # K/V bytes of one page (all layers)
    prefill_tokens_per_s: float  # the engine's prefill rate
    bandwidth_gbps: float  # GB/s between HBM and the lower tier, each way

    def __post_init__(self) -> None:
        if not is_int(self.page_bytes) or self.page_bytes < 1:
            raise ConfigError(f"page_bytes must be an integer >= 1, got {self.page_bytes!r}")
        object.__setattr__(self, "page_bytes", int(self.page_bytes))
        for name in ("prefill_tokens_per_s", "bandwidth_gbps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be finite and > 0, got {v!r}")

    def swap_s(self, num_pages: int) -> float:
        return 2.0 * num_pages * self.page_bytes / (self.bandwidth_gbps * 1e9)

    def recompute_s(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s


@dataclass
class SchedulerStats:
    """Counters since the scheduler was built (a snapshot: :meth:`Scheduler.stats`)."""

    num_submitted: int = 0
    num_admitted: int = 0  # first admissions
    num_finished: int = 0  # by every reason but capacity
    num_rejected: int = 0  # at submit or in the queue
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    preemptions_by_kind: dict[str, int] = field(default_factory=lambda: {"swap": 0, "recompute": 0})
    num_failed_reservations: int = 0  # add_sequence / reserve / append that found no room
    num_failed_admissions: int = 0  # of those, add_sequence (an admission the predicted room allowed)
    num_truncated: int = 0
    num_evicted_pages: int = 0  # by the controller's evict_harder
    num_failed_lookups: int = 0  # prefix_lookup calls that raised (each admission went on without it)
    computed_tokens: int = 0  # tokens the engine was asked to compute (every chunk and decode)
    recomputed_tokens: int = 0  # of those, tokens computed before a preemption and computed again
    prompt_tokens: int = 0  # prompt tokens at first admission
    hit_tokens: int = 0  # of those, found cached (HBM or a lower tier) at first admission
    generated_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_loading: int = 0
    level: int = 0

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions_by_kind.values())

    @property
    def preemption_tax(self) -> float:
        """Recomputed tokens / computed tokens (0 before any computation)."""
        return self.recomputed_tokens / self.computed_tokens if self.computed_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["num_preemptions"] = self.num_preemptions
        out["preemption_tax"] = self.preemption_tax
        return out


class _Req:
    """A request's scheduling state. ``tokens`` = prompt (possibly truncated) + generated tokens;
    ``known``: tokens the manager's sequence holds; ``reserved``: of those, with a slot; ``computed``:
    with K/V written. While decoding, ``tokens[-1]`` is the sampled token not yet given to the manager."""

    __slots__ = (
        "array",
        "arrival",
        "base",
        "cls",
        "committed_pages",
        "computed",
        "ever_computed",
        "generated",
        "known",
        "max_new",
        "ns",
        "order",
        "priority",
        "request",
        "reserved",
        "resumed",
        "rid",
        "started",
        "state",
        "stop",
        "tokens",
    )

    def __init__(self, request: Request, arrival: float) -> None:
        self.request = request
        self.rid = request.request_id
        self.tokens: list[int] = request.prompt.tolist()  # type: ignore[union-attr]
        # ``tokens`` as an array, kept while they do not change (waiting, prefilling): the admission's
        # lookups and the prefill rows read it every step without converting the list again.
        self.array: npt.NDArray[np.uint32] = request.prompt  # type: ignore[assignment]
        self.arrival = arrival
        self.priority = int(request.priority)
        self.ns = request.namespace
        self.cls = request.request_class
        self.max_new = int(request.max_new_tokens)
        self.stop = request.stop_token_ids
        self.generated = 0
        self.base = len(self.tokens)  # tokens not generated: len(tokens) == base + generated
        self.known = self.reserved = self.computed = 0
        self.committed_pages = 0
        self.ever_computed = 0  # most tokens computed at once (what a preemption throws away)
        self.order = 0  # admission order (the youngest has the largest)
        self.started = False  # admitted at least once
        self.resumed = False  # the last admission was a resume (after a preemption)
        self.state = _WAITING

    def token_array(self) -> npt.NDArray[np.uint32]:
        """``tokens`` as a uint32 array (tokens only grow, or are replaced by ``_truncate``, which
        resets the array: a length that matches is a current array)."""
        a = self.array
        if len(a) != len(self.tokens):
            a = self.array = np.asarray(self.tokens, np.uint32)
        return a


def _stop_groups(stops: list[frozenset[int]], base: int) -> dict[frozenset[int], npt.NDArray[np.int64]]:
    """Rows (offset by ``base``) grouped by their stop-token set; rows without one are left out."""
    groups: dict[frozenset[int], list[int]] = {}
    for i, stop in enumerate(stops):
        if stop:
            groups.setdefault(stop, []).append(base + i)
    return {stop: np.array(rows, np.int64) for stop, rows in groups.items()}


_NO_STOP: frozenset[int] = frozenset()


def _stops_of(
    stops: list[frozenset[int]],
) -> tuple[frozenset[int], dict[frozenset[int], npt.NDArray[np.int64]]]:
    """``(stop_all, stop_groups)`` of rows with these stop sets: the one set every row has (and no
    groups), or no common set and the rows grouped by :func:`_stop_groups`."""
    if stops and stops[0] and all(stop == stops[0] for stop in stops):
        return stops[0], {}
    return _NO_STOP, _stop_groups(stops, 0)


def _in_stop(values: npt.NDArray[Any], stop: frozenset[int]) -> npt.NDArray[np.bool_]:
    """``values`` in ``stop``, elementwise: one comparison per stop id for the usual few (EOS ids);
    ``np.isin`` sets up a sort or a table per call, about 40 µs, on every decode step."""
    if len(stop) > 8:
        out: npt.NDArray[np.bool_] = np.isin(values, list(stop))
        return out
    ids = iter(stop)
    hit: npt.NDArray[np.bool_] = values == next(ids)
    for t in ids:
        hit |= values == t
    return hit


def _merge_stop_groups(
    a: dict[frozenset[int], npt.NDArray[np.int64]], b: dict[frozenset[int], npt.NDArray[np.int64]]
) -> dict[frozenset[int], npt.NDArray[np.int64]]:
    merged = dict(a)
    for stop, rows in b.items():
        merged[stop] = np.concatenate([merged[stop], rows]) if stop in merged else rows
    return merged


# Rows of _DecodeRows.num.
_ID, _START, _TOKEN, _LEFT, _MAX_NEW = range(5)
_ONE_STEP = np.array([[0], [1], [0], [-1], [0]], np.int64)  # a decode step: start + 1, one token fewer left


class _DecodeRows:
    """The next step's decode rows in steady state: every decoding request, in ``_decoding``'s order,
    built by patching the last step's (no Python pass per request). ``num`` is one int64 array of
    five rows (``_ID``: request id, ``_START``: the position computed, ``_TOKEN``: the token there,
    ``_LEFT``: tokens still to generate, ``_MAX_NEW``), so dropping the rows that end and adding those
    that join is one NumPy call; ``appends`` are the requests' token lists' ``append``,
    ``stop_all`` the stop set every row has when they all share one (the usual: the model's EOS ids;
    then ``stop_groups`` is empty and nothing is re-indexed as rows come and go), else
    ``stop_groups`` maps a stop set to its rows; ``classes`` are the rows' request classes and
    ``names`` their set."""

    __slots__ = ("appends", "classes", "names", "num", "stop_all", "stop_groups", "version")

    def __init__(
        self,
        version: int,
        num: npt.NDArray[np.int64],
        appends: list[Callable[[int], None]],
        stop_all: frozenset[int],
        stop_groups: dict[frozenset[int], npt.NDArray[np.int64]],
        classes: list[str],
        names: set[str],
    ) -> None:
        self.version = version
        self.num = num
        self.appends = appends
        self.stop_all = stop_all
        self.stop_groups = stop_groups
        self.classes = classes
        self.names = names


def _quota(name: str, quota: object) -> dict[str | None, int]:
    """``tenant_max_pages`` / ``tenant_min_pages`` checked: a mapping of namespaces (None or a str, not
    the public ``"*"``, which no tenant owns) to page counts."""
    if quota is None:
        return {}
    if not isinstance(quota, Mapping):
        raise ConfigError(
            f"{name} must be None or a mapping {{namespace: pages}}, got {type(quota).__name__}"
        )
    out: dict[str | None, int] = {}
    for ns, v in quota.items():
        try:
            check_namespace(ns, f"{name} key {ns!r}")
        except InvalidArgumentError as e:
            raise ConfigError(str(e)) from None
        if ns == PUBLIC_NAMESPACE:
            raise ConfigError(f"{name}: the public namespace {PUBLIC_NAMESPACE!r} is no tenant's")
        if not is_int(v) or not 0 <= v <= _MAX_PAGES:
            raise ConfigError(f"{name}[{ns!r}] must be an integer in [0, 2**63), got {v!r}")
        out[ns] = int(v)
    return out


class Scheduler:
    """Continuous batching over a :class:`~kvcore.KVCacheManager` (see the module docstring).

    Args:
        cache: the manager (its ``page_size`` and pages are the scheduler's).
        max_num_batched_tokens: tokens computed per step, prefill chunks and decodes together.
        max_num_seqs: running requests at most (the controller may lower it).
        queue: ``"fcfs"`` or ``"priority"`` (higher first, FCFS among equals).
        max_queued_requests: more waiting requests are refused at submit (``queue_full``, 429).
        max_queue_wait_s: a request that waited longer is refused (``timeout``, 503). None: no limit.
        controller: a :class:`PressureController` (None: no pressure responses).
        estimator: output-length quantiles (default: :class:`OutputLengthEstimator` at ``1 -
            target_preemption_prob``).
        target_preemption_prob: the admission's tolerated chance that a request outgrows its plan.
        max_preemption_tax: recomputed / computed tokens past which new admissions wait (None: never).
        swap: the cost model that chooses swap over recompute (None: always recompute). Swap needs a
            lower tier in the manager, and the engine to run its transfers (``kvcore.tiers.Mover``).
        tenant_max_pages / tenant_min_pages: per-namespace ceiling and floor of pages held by running
            requests (``None`` is the default namespace); each floor is set on the cache too.
        long_prefill_token_threshold: prompt tokens one request computes in a step at most (vLLM's
            name), so that a long prompt is chunked over several steps even when the budget would
            take it whole. None: the budget alone limits a chunk.
        prefix_lookup: called as ``prefix_lookup(tokens, namespace)`` just before each admission's
            ``add_sequence`` (not for a request that waits for memory), so that pages a shared tier
            holds are indexed first and loaded rather than recomputed: ``Mover.lookup``.
    """

    def __init__(
        self,
        cache: Any,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
        queue: str = "fcfs",
        max_queued_requests: int | None = None,
        max_queue_wait_s: float | None = None,
        controller: PressureController | None = None,
        estimator: OutputLengthEstimator | None = None,
        target_preemption_prob: float = 0.05,
        max_preemption_tax: float | None = None,
        swap: SwapCost | None = None,
        tenant_max_pages: Mapping[str | None, int] | None = None,
        tenant_min_pages: Mapping[str | None, int] | None = None,
        long_prefill_token_threshold: int | None = None,
        prefix_lookup: Callable[[npt.NDArray[np.uint32], str | None], object] | None = None,
    ) -> None:
        for name, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if queue not in QUEUE_POLICIES:
            raise ConfigError(f"queue must be one of {', '.join(QUEUE_POLICIES)}, got {queue!r}")
        mq = max_queued_requests
        if mq is not None and (isinstance(mq, bool) or not isinstance(mq, int) or mq < 1):
            raise ConfigError(f"max_queued_requests must be None or an integer >= 1, got {mq!r}")
        w = max_queue_wait_s
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0):
            raise ConfigError(f"max_queue_wait_s must be None or >= 0, got {w!r}")
        tp = target_preemption_prob
        if isinstance(tp, bool) or not (isinstance(tp, (int, float)) and 0 <= tp < 1):
            raise ConfigError(f"target_preemption_prob must be in [0, 1), got {target_preemption_prob!r}")
        tax = max_preemption_tax
        if tax is not None and (isinstance(tax, bool) or not isinstance(tax, (int, float)) or not tax >= 0):
            raise ConfigError(f"max_preemption_tax must be None or >= 0, got {tax!r}")
        chunk = long_prefill_token_threshold
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ConfigError(f"long_prefill_token_threshold must be None or an integer >= 1, got {chunk!r}")
        if prefix_lookup is not None and not callable(prefix_lookup):
            raise ConfigError("prefix_lookup must be None or a callable (tokens, namespace)")
        if controller is not None and not isinstance(controller, PressureController):
            got = type(controller).__name__
            raise ConfigError(f"controller must be None or a PressureController, got {got}")
        if estimator is not None and not isinstance(estimator, OutputLengthEstimator):
            got = type(estimator).__name__
            raise ConfigError(f"estimator must be None or an OutputLengthEstimator, got {got}")
        if swap is not None and not isinstance(swap, SwapCost):
            raise ConfigError(f"swap must be None or a SwapCost, got {type(swap).__name__}")
        if swap is not None and not cache.tier_names:
            raise ConfigError("swap needs a manager with a lower tier (lower_tiers=[('host', n)])")
        usable = cache.num_pages - 1
        ceilings = _quota("tenant_max_pages", tenant_max_pages)
        floors = _quota("tenant_min_pages", tenant_min_pages)
        if sum(floors.values()) > usable:
            raise ConfigError(
                f"tenant_min_pages sum to {sum(floors.values())} pages, the cache has {usable} usable pages"
            )
        for ns, floor in floors.items():
            if ns in ceilings and ceilings[ns] < floor:
                raise ConfigError(
                    f"tenant {ns!r}: its ceiling ({ceilings[ns]} pages) is below its floor ({floor} pages)"
                )
        self.cache = cache
        self.page_size: int = cache.page_size
        self.usable_pages: int = cache.num_pages - 1
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.queue_policy = queue
        self.max_queued_requests = mq
        self.max_queue_wait_s = None if w is None else float(w)
        self.controller = controller
        self.estimator = estimator or OutputLengthEstimator(1.0 - target_preemption_prob)
        self.max_preemption_tax = tax
        self.swap = swap
        self.long_prefill_token_threshold = chunk
        # Pages per request over every KV-cache group (one full group: ceil(tokens / page_size)).
        groups = getattr(cache, "groups", None) or [None]
        self._pages = PageModel(list(groups), self.page_size, chunk or max_num_batched_tokens)
        self.prefix_lookup = prefix_lookup
        self.tenant_max = ceilings
        self.tenant_min = floors
        for ns, floor in self.tenant_min.items():  # and its cached pages go last in the cache
            cache.set_tenant_floor(ns, floor)
        for ns, ceiling in self.tenant_max.items():  # and past it, first
            cache.set_tenant_ceiling(ns, ceiling)
        self._reqs: dict[int, _Req] = {}  # every live request (waiting, loading or running)
        self._running: dict[int, _Req] = {}  # in admission order
        self._loading: dict[int, _Req] = {}
        self._fifo: deque[_Req] = deque()  # fcfs waiting
        self._heap: list[tuple[int, int, _Req]] = []  # priority waiting: (-priority, arrival order, req)
        self._preempted: deque[_Req] = deque()  # served before every new request
        self._arrivals = count()
        self._admissions = count(1)
        self._events: list[SchedulerEvent] = []
        self._failed_this_step = 0
        self._stats = SchedulerStats()
        self._decision: PressureDecision | None = None
        self._tiered = bool(cache.tier_names)
        self._rejected_in_step: list[RequestRejected] = []
        # The plan being built (step): a preempted request leaves it.
        self._rows: list[_Req] = []
        self._starts: list[int] = []
        self._counts: list[int] = []
        self._swapping = 0
        self._decoding: dict[int, _Req] = {}  # running requests whose next row is one decode token
        self._decode_rows: list[_Req] = []  # this step's decode rows
        self._decode_arrays_now: tuple[Any, Any, Any] = (None, None, None)
        # Membership changes of _decoding; the next step's decode rows, when the last update saw
        # every decode row through (steady state).
        self._dec_version = 0
        self._dec_cache: _DecodeRows | None = None
        self._plan_dec_version = -1
        # Steady-state decode: the rows the current plan's decode rows came from (None: built
        # afresh), and whether decoding requests' computed / generated counts lag their tokens
        # (the fast update appends tokens only; _sync_decoding catches the counts up).
        self._dec_used: _DecodeRows | None = None
        self._lazy = False
        self._dirty = False  # finish() ran since the last plan: its rows need checking
        self._decode_planned = False  # this step's decode rows are chosen (3a is done)
        self._saved_store_policy: tuple[str, dict[str, Any]] | None = None
        # The latest plan, until update records it (a plan with rows must be, before the next step).
        self._last_plan: StepPlan | None = None
        self._carry_finished: list[tuple[int, str]] = []  # of a step that raised, for the next plan
        self._carry_rejected: list[RequestRejected] = []

    # ---- requests in ------------------------------------------------------------------------------

    def submit(self, request: Request, now: float = 0.0) -> None:
        """Queue ``request``. Raises RequestRejected (nothing queued, nothing computed) when it can
        never fit (``too_large``: the cache; ``tenant_quota``: its tenant's ceiling, or the cache less
        the other tenants' floors), when the queue is full, or under pressure for a long prompt;
        InvalidArgumentError for an id already live.

        "Never fits" is judged on the prompt and its first generated token; on the prompt cut to its
        ``window`` only when the controller may truncate (``truncate`` on, ``max_level`` >= 3), else on
        the whole prompt."""
        now = check_time(now)
        if not isinstance(request, Request):
            got = type(request).__name__
            raise InvalidArgumentError(f"submit takes a kvcore.scheduler.Request, got {got}")
        rid = request.request_id
        if rid in self._reqs or rid in self.cache:
            raise InvalidArgumentError(f"request {rid} is already live")
        plen = request.prompt_len
        if request.window is not None and self._may_truncate():
            plen = min(plen, request.window)  # truncation may bring it under the cache's size
        pages = self._alone_pages(plen)
        self._stats.num_submitted += 1
        if pages > self.usable_pages:
            msg = f"needs {pages} pages, the cache has {self.usable_pages}"
            self._reject(rid, "too_large", None, pages, now, msg)
        misfit = self._quota_misfit(request.namespace, pages)
        if misfit is not None:
            self._reject(rid, "tenant_quota", None, pages, now, misfit)
        waiting = len(self._fifo) + len(self._heap)
        if self.max_queued_requests is not None and waiting >= self.max_queued_requests:
            self._reject(rid, "queue_full", self._retry_after(), pages, now, "the waiting queue is full")
        d = self._decision
        if d is not None and d.refuse_all:
            self._reject(
                rid,
                "overloaded",
                d.retry_after_s,
                pages,
                now,
                "the queue is past its latency target: new requests are refused until it drains",
            )
        if d is not None and d.refuse_long_tokens is not None and request.prompt_len > d.refuse_long_tokens:
            self._reject(
                rid,
                "overloaded",
                d.retry_after_s,
                pages,
                now,
                f"under memory pressure, prompts over {d.refuse_long_tokens} tokens are refused",
            )
        r = _Req(request, now)
        self._reqs[rid] = r
        self._enqueue(r)
        self._event("queued", rid, now)

    def finish(self, request_id: int, reason: str = "stop", now: float = 0.0) -> None:
        """End a request the engine is done with, wherever it is; its pages are released (full pages
        stay cached). ``reason`` is one of :data:`FINISH_REASONS`: ``stop`` (EOS, a stop string),
        ``length`` (a limit of the engine's own), ``abort`` (the client went away). A bad argument
        raises InvalidArgumentError (UnknownSequenceError for an id not live) and changes nothing."""
        if not is_int(request_id):
            raise InvalidArgumentError(f"request_id must be an integer, got {request_id!r}")
        if not isinstance(reason, str) or reason not in FINISH_REASONS:
            raise InvalidArgumentError(f"reason must be one of {', '.join(FINISH_REASONS)}, got {reason!r}")
        now = check_time(now)
        r = self._reqs.get(int(request_id))
        if r is None:
            raise UnknownSequenceError(f"request {request_id} is not live in this scheduler")
        self._dirty = True  # a row of the current plan may be this request's
        self._end(r, reason, now)

    def has_work(self) -> bool:
        """Whether any request is waiting, loading or running, or a step that raised left endings or
        refusals for the next plan to report."""
        return bool(self._reqs or self._carry_finished or self._carry_rejected)

    # ---- one step ---------------------------------------------------------------------------------

    def step(self, now: float = 0.0) -> StepPlan:
        """Plan one forward pass at time ``now`` (see the module docstring).

        A plan with rows must be recorded (:meth:`update`) before the next step: until then step raises
        InvalidArgumentError and changes nothing (unless every request of the plan has ended since). An
        exception raised inside a step (by the manager, the estimator, ...) is re-raised after the
        step's decode appends are rolled back (``truncate``), so that the manager holds what the
        scheduler does; what else the step decided (preemptions, admissions, endings) stands and is
        reported by the next plan. ``prefix_lookup`` failures do not escape (``lookup_failed``)."""
        now = check_time(now)
        last = self._last_plan
        if last is not None and last.batch_size:
            self._check_recorded(last)
        try:
            return self._step(now)
        except BaseException:
            self._undo_decode_appends()
            raise

    def _check_recorded(self, last: StepPlan) -> None:
        if any(r.state != _DONE for r in (*self._decode_rows, *self._rows)):
            raise InvalidArgumentError(
                f"step: the last plan ({last.batch_size} row{'s' * (last.batch_size != 1)}) is not "
                "recorded yet: run it (again, if its forward pass failed) and pass its tokens to "
                "update(plan, tokens), or finish() its requests, before the next step"
            )
        self._last_plan = None  # every request of it ended since: nothing of it is left to record

    def _undo_decode_appends(self) -> None:
        """After a step raised: release the slots its decode appends took (outside a step, a decoding
        request's sequence holds every token but the sampled one, ``tokens[-1]``). A raise between a
        reservation and its bookkeeping needs nothing here: ``_reserve`` reads the count back."""
        m = self.cache
        self._sync_decoding()
        for r in self._decoding.values():
            keep = len(r.tokens) - 1
            if r.state == _RUNNING and r.rid in m and m.seq_len(r.rid) > keep:
                m.truncate(r.rid, keep)
        self._dec_used = None
        self._decode_planned = False

    def _step(self, now: float) -> StepPlan:
        m = self.cache
        # Ended and refused requests of a step that raised are reported by this one.
        finished: list[tuple[int, str]] = self._carry_finished
        rejected: list[RequestRejected] = self._carry_rejected
        self._expire(now, rejected)
        decision = self._observe(now)
        cap = (
            self.max_num_seqs
            if decision is None or decision.running_cap is None
            else min(self.max_num_seqs, decision.running_cap)
        )
        if self._loading:
            for r in list(self._loading.values()):
                if m.is_ready(r.rid):
                    del self._loading[r.rid]
                    self._running[r.rid] = r
                    r.state = _RUNNING
                    self._check_loaded_hit(r)
        budget = self.max_num_batched_tokens
        rows: list[_Req] = []  # scheduled, in plan order
        starts: list[int] = []
        counts: list[int] = []
        self._rows, self._starts, self._counts = rows, starts, counts
        self._swapping = 0  # pages swapped out in this step (free once the engine stores them)
        self._dec_used = None
        self._decode_planned = False
        if self.tenant_max:
            self._enforce_ceilings(now)
        # 3a. decodes: one token each, one batched append. In steady state (the same requests
        # decoding as last step) the arrays come from the last update: no Python per sequence.
        decoding: list[_Req] = []
        dec = self._decoding
        d_ids = d_st = d_tok = None
        if dec:
            decoding = list(dec.values())
            cached = self._dec_cache
            if cached is not None and cached.version == self._dec_version and len(decoding) <= budget:
                num = cached.num
                d_ids, d_st, d_tok = num[_ID], num[_START].astype(np.int32), num[_TOKEN].astype(np.uint32)
                self._dec_used = cached
            else:
                self._sync_decoding()
                if len(decoding) > budget:
                    decoding = decoding[:budget]
                    for r in decoding:  # served: the others lead the next step (round robin)
                        dec[r.rid] = dec.pop(r.rid)
                d_ids, d_st, d_tok = self._decode_arrays(decoding)
            done = m.append_batch(d_ids, d_tok)
            failed = done < len(decoding)
            if failed:  # preemptions follow: every count must be current
                self._dec_used = None
                self._sync_decoding()
            while done < len(decoding):
                self._stats.num_failed_reservations += 1
                self._failed_this_step += 1
                stuck = decoding[done]
                victim = self._victim()
                if victim is stuck and len(self._running) == 1:
                    del decoding[done]
                    if not self._pages_coming_back():  # alone, nothing comes back: it never grows
                        self._end(stuck, "capacity", now)
                        finished.append((stuck.rid, "capacity"))
                    # else it waits a step: this step's swaps free their pages once stored, and the
                    # loading requests (which hold pages) can be preempted once they run.
                    continue
                self._preempt(victim, now)
                if victim in decoding:
                    i = decoding.index(victim)
                    del decoding[i]
                    if i < done:
                        done -= 1
                if done < len(decoding):
                    part = decoding[done:]
                    ids_p, _, tok_p = self._decode_arrays(part)
                    done += m.append_batch(ids_p, tok_p)
            if failed:
                d_ids, d_st, d_tok = self._decode_arrays(decoding)
            budget -= len(decoding)
        # The decode rows lead the plan; known/reserved of those grew by one (update records it).
        self._decode_rows = decoding
        self._decode_arrays_now = (d_ids, d_st, d_tok)
        self._decode_planned = True
        # 3b. running prefills (chunked), oldest first.
        chunk = self.long_prefill_token_threshold or budget
        prefilling = (
            [r for r in self._running.values() if r.rid not in dec] if len(self._running) > len(dec) else []
        )
        for r in prefilling:
            if budget <= 0:
                break
            if r.state != _RUNNING or r.computed >= r.known:
                continue
            n = min(r.known - r.computed, budget, chunk)
            if not self._reserve(r, r.computed + n, now, finished):
                continue
            rows.append(r)
            starts.append(r.computed)
            counts.append(n)
            budget -= n
        # 4. admissions.
        loading: list[int] = []
        if budget > 0 and len(self._running) + len(self._loading) < cap and self.num_waiting:
            budget = self._admit(now, budget, cap, decision, rows, starts, counts, loading)
        loading.extend(r.rid for r in self._loading.values() if r.rid not in loading)
        plan = self._plan(now, rows, starts, counts, loading, finished, rejected, decision)
        self._carry_finished, self._carry_rejected = [], []
        self._plan_dec_version = self._dec_version
        self._last_plan = plan
        self._dec_cache = None
        self._dirty = False
        if self._dec_version != self._plan_dec_version or not self._decode_rows:
            self._dec_used = None
        return plan

    def update(self, plan: StepPlan, new_tokens: Mapping[int, int] | Iterable[int]) -> list[tuple[int, str]]:
        """Record a computed plan: its chunks' K/V is written, and each sampling row's next token
        (``{request_id: token}``, or tokens in the order of the rows with ``plan.sample``: a 1-D integer
        array is the fast path). Requests that reach ``max_new_tokens`` or a stop token finish here;
        returns ``(request_id, reason)`` of those. Only the latest plan is recorded, once: an update of
        any other plan (or of this one again) checks its tokens and changes nothing."""
        if not isinstance(plan, StepPlan):
            raise InvalidArgumentError(f"update takes the StepPlan of step(), got {type(plan).__name__}")
        m, ps = self.cache, self.page_size
        num_sampled = int(np.count_nonzero(plan.sample))
        if isinstance(new_tokens, np.ndarray):  # the fast path: an engine's argmax, in row order
            arr = new_tokens
            if arr.ndim != 1 or len(arr) != num_sampled:
                raise InvalidArgumentError(f"update: {arr.shape} tokens for {num_sampled} sampling rows")
        elif isinstance(new_tokens, Mapping):
            try:
                given = [new_tokens[rid] for rid in plan.request_ids[plan.sample].tolist()]
            except KeyError as e:
                raise InvalidArgumentError(f"update: no token for sampling request {e.args[0]}") from None
            arr = np.array(given)
        else:
            try:
                given = list(new_tokens)
            except TypeError:
                got = type(new_tokens).__name__
                raise InvalidArgumentError(
                    f"update: tokens must be a mapping or an iterable, got {got}"
                ) from None
            if len(given) != num_sampled:
                raise InvalidArgumentError(f"update: {len(given)} tokens for {num_sampled} sampling rows")
            arr = np.array(given)
        if arr.size and (arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= 2**32):
            raise InvalidArgumentError("update: token ids must be integers in [0, 2**32)")
        toks: list[int] = arr.tolist()
        if plan is not self._last_plan:
            # Recorded already, or not this scheduler's latest plan (a stale row could match a request
            # that was preempted and recomputed back to the same position): nothing of it applies.
            return []
        reqs, dec = self._reqs, self._decoding
        ended: list[tuple[int, str]] = []
        now = plan.time_s
        nd = plan.num_decode  # the decode rows lead the plan, and each samples
        void = 0
        ended_rows: list[int] = []  # decode rows that end here
        joined: list[_Req] = []  # prefill rows that start decoding here
        # Whether the decode rows were every decoding request, unchanged since the plan: then the
        # next step's arrays are these, patched for the rows that end and join (no Python pass).
        steady = not self._dirty and self._dec_version == self._plan_dec_version
        steady = steady and nd > 0 and nd == len(dec)
        # The hot loop: a decode row's request is live and decoding unless it ended since the plan
        # (finish). The plan's rows are its requests themselves (no lookup). While decoding, ``known``
        # and ``reserved`` are not kept up to date: they equal ``computed`` (see _tenant_pages).
        d_starts = plan.starts[:nd]
        used = self._dec_used if not self._dirty else None
        if used is None:
            self._sync_decoding()
        drows = self._decode_rows
        r: _Req | None
        # First the manager, then the scheduler's own state: a commit that raises leaves nothing of
        # the scheduler changed, and the same update can be run again (commits are idempotent).
        # Rows whose token filled a page commit it (one in page_size rows); a live row's computed is
        # its start (an ended request's is -1, a lagging decode count is current in steady state).
        for i in np.flatnonzero((d_starts + 1) % ps == 0).tolist():
            r = drows[i]
            start = int(d_starts[i])
            if used is not None or (r.computed == start and r.state == _RUNNING):
                m.commit(r.rid, start + 1)
                r.committed_pages = (start + 1) // ps
        void_prefill = 0
        it = iter(toks[nd:])
        prefills: list[tuple[_Req, int, int]] = []  # (request, end, sampled token or -1)
        rows = zip(
            plan.request_ids[nd:].tolist(),
            plan.starts[nd:].tolist(),
            plan.num_tokens[nd:].tolist(),
            plan.sample[nd:].tolist(),
            strict=True,
        )
        for rid, start, n, samples in rows:
            tok = next(it) if samples else -1
            r = reqs.get(rid)
            if r is None or r.state != _RUNNING or r.computed != start:
                void_prefill += 1
                continue  # finished or preempted since the plan: its row is void
            end = start + n
            if end // ps > r.committed_pages:
                m.commit(rid, end)
                r.committed_pages = end // ps
            prefills.append((r, end, tok))
        if used is not None:
            # Steady state: the rows are the cached decoding requests, all live. Only their tokens
            # grow here; their counts lag (self._lazy) and the countdown is one array.
            appends, stop_all, stop_groups = used.appends, used.stop_all, used.stop_groups
            d_toks = toks[:nd]
            for app, tok in zip(appends, d_toks, strict=True):
                app(tok)
            rem = used.num[_LEFT] - 1
            done_rows = [(i, "length") for i in np.flatnonzero(rem <= 0).tolist()]
            if stop_all:  # every row has this stop set
                hit = np.flatnonzero(_in_stop(arr[:nd], stop_all) & (rem > 0))
                if hit.size:
                    done_rows += [(i, "stop") for i in hit.tolist()]
                    done_rows.sort()  # row order, as the checked loop ends them
            elif stop_groups:
                tok_arr = arr[:nd]
                for stop, group in stop_groups.items():  # rows sharing one stop set (EOS ids, usually one)
                    hit = group[_in_stop(tok_arr[group], stop) & (rem[group] > 0)]
                    done_rows += [(i, "stop") for i in hit.tolist()]
                done_rows.sort()  # row order, as the checked loop ends them
            for i, reason in done_rows:
                ended.append((drows[i].rid, reason))
                ended_rows.append(i)
            self._lazy = True
        else:
            for i, (r, start, tok) in enumerate(zip(drows, d_starts.tolist(), toks[:nd], strict=True)):
                if r.computed != start:  # ended since the plan (its computed is -1)
                    void += 1
                    continue
                r.computed = start + 1
                r.tokens.append(tok)
                r.generated += 1
                if r.generated >= r.max_new:
                    ended.append((r.rid, "length"))
                    ended_rows.append(i)
                elif r.stop and tok in r.stop:
                    ended.append((r.rid, "stop"))
                    ended_rows.append(i)
        gen = nd - void
        for r, end, tok in prefills:
            r.computed = end
            if tok < 0 or end != len(r.tokens):
                continue
            r.tokens.append(tok)
            r.generated += 1
            gen += 1
            if r.generated >= r.max_new:  # as for decode rows: the length first, then a stop token
                ended.append((r.rid, "length"))
            elif tok in r.stop:
                ended.append((r.rid, "stop"))
            else:
                dec[r.rid] = r
                self._dec_version += 1
                joined.append(r)
        self._stats.generated_tokens += gen
        self._last_plan = None  # recorded: an update of this plan again changes nothing
        self._dec_used = None
        for rid, reason in ended:
            self._end(reqs[rid], reason, now)
        self._dec_cache = self._next_decode_cache(
            plan, nd, arr, used, steady and not void, ended_rows, joined
        )
        return ended

    def _next_decode_cache(
        self,
        plan: StepPlan,
        nd: int,
        arr: npt.NDArray[Any],
        used: _DecodeRows | None,
        steady: bool,
        ended_rows: list[int],
        joined: list[_Req],
    ) -> _DecodeRows | None:
        """The next step's decode rows, in the order of the decoding requests: this plan's decode
        rows one step on, less the rows that ended, plus the requests that joined (None: rebuild)."""
        if not steady:
            return None
        if used is not None:
            num = used.num + _ONE_STEP  # a fresh array: the plan's views of ``used.num`` stay as given
            appends, classes, names = used.appends, used.classes, used.names
            stop_all, stop_groups = used.stop_all, used.stop_groups
        else:  # counts are current after the checked loop
            rows = self._decode_rows
            num = np.empty((5, nd), np.int64)
            num[_ID] = plan.request_ids[:nd]
            num[_START] = plan.starts[:nd] + 1
            num[_LEFT] = np.fromiter([r.max_new - r.generated for r in rows], np.int64, nd)
            num[_MAX_NEW] = np.fromiter([r.max_new for r in rows], np.int64, nd)
            appends = [r.tokens.append for r in rows]
            stop_all, stop_groups = _stops_of([r.stop for r in rows])
            classes = [r.cls for r in rows]
            names = set(classes)
        num[_TOKEN] = arr[:nd]
        if not ended_rows and not joined:
            return _DecodeRows(self._dec_version, num, appends, stop_all, stop_groups, classes, names)
        # One concatenation: the kept runs of columns between the rows that end, then the joiners.
        pieces: list[npt.NDArray[np.int64]] = []
        if ended_rows:
            gone = sorted(ended_rows)  # few rows end per step
            prev = 0
            for i in gone:
                pieces.append(num[:, prev:i])
                prev = i + 1
            pieces.append(num[:, prev:])
            appends, classes = list(appends), list(classes)
            for i in reversed(gone):
                del appends[i], classes[i]
            if stop_groups:
                keep = np.ones(nd, bool)
                keep[gone] = False
                new_index = np.cumsum(keep) - 1
                stop_groups = {stop: new_index[g[keep[g]]] for stop, g in stop_groups.items()}
                stop_groups = {stop: g for stop, g in stop_groups.items() if len(g)}
            if len(names) > 1:  # a class may have left (one class stays exact)
                names = set(classes)
        else:
            pieces.append(num)
        if joined:
            base = nd - len(ended_rows)
            rows_in = [(r.rid, r.computed, r.tokens[-1], r.max_new - r.generated, r.max_new) for r in joined]
            pieces.append(np.array(rows_in, np.int64).T)
            appends = [*appends, *(r.tokens.append for r in joined)]
            classes = [*classes, *(r.cls for r in joined)]
            names = names | {r.cls for r in joined}
            if not (stop_all and all(r.stop == stop_all for r in joined)):
                if stop_all:  # the rows no longer share one stop set: group them
                    stop_groups = {stop_all: np.arange(base, dtype=np.int64)} if base else {}
                    stop_all = _NO_STOP
                if any(r.stop for r in joined):
                    stop_groups = _merge_stop_groups(
                        stop_groups, _stop_groups([r.stop for r in joined], base)
                    )
        num = np.concatenate(pieces, axis=1)
        if num.shape[1] != len(self._decoding):  # anything else changed the set: rebuild next step
            return None
        if len(stop_groups) == 1:  # one group of every row (distinct rows): they share one stop set
            ((stop, group),) = stop_groups.items()
            if len(group) == num.shape[1]:
                stop_all, stop_groups = stop, {}
        return _DecodeRows(self._dec_version, num, appends, stop_all, stop_groups, classes, names)

    def _sync_decoding(self) -> None:
        """Catch up the counts of decoding requests after fast updates (their tokens are right)."""
        if not self._lazy:
            return
        for r in self._decoding.values():
            n = len(r.tokens)
            r.computed = n - 1
            r.generated = n - r.base
        self._lazy = False

    def _sync_one(self, r: _Req) -> None:
        if self._lazy and r.rid in self._decoding:
            n = len(r.tokens)
            r.computed = n - 1
            r.generated = n - r.base

    # ---- views ------------------------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """A copy of the counters. Safe to call from another thread while the engine steps (a metrics
        scrape): the dicts are copied by ``dict()`` (one C call under the GIL), never iterated in
        Python code (a deepcopy could meet a reason added meanwhile: "dictionary changed size")."""
        s = self._stats
        out = copy.copy(s)
        out.rejected_by_reason = dict(s.rejected_by_reason)
        out.finished_by_reason = dict(s.finished_by_reason)
        out.preemptions_by_kind = dict(s.preemptions_by_kind)
        out.num_running = len(self._running)
        out.num_loading = len(self._loading)
        out.num_waiting = len(self._fifo) + len(self._heap) + len(self._preempted)
        out.level = self.controller.level if self.controller is not None else 0
        return out

    def take_events(self) -> list[SchedulerEvent]:
        """Events not yet delivered in a plan (those of submit and finish since the last step)."""
        out, self._events = self._events, []
        return out

    def request_tokens(self, request_id: int) -> list[int]:
        """The request's tokens so far: its (possibly truncated) prompt and its generated tokens."""
        return list(self._live(request_id).tokens)

    def _live(self, request_id: int) -> _Req:
        """The live request ``request_id`` (an integer id: InvalidArgumentError otherwise)."""
        if not is_int(request_id):
            raise InvalidArgumentError(f"request_id must be an integer, got {request_id!r}")
        r = self._reqs.get(int(request_id))
        if r is None:
            raise UnknownSequenceError(f"request {request_id} is not live in this scheduler")
        return r

    def num_generated(self, request_id: int) -> int:
        r = self._live(request_id)
        self._sync_one(r)
        return r.generated

    @property
    def running_ids(self) -> list[int]:
        return list(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._fifo) + len(self._heap) + len(self._preempted)

    # ---- internals --------------------------------------------------------------------------------

    def _event(self, kind: str, rid: int | None, now: float, /, **detail: Any) -> None:
        self._events.append(SchedulerEvent(kind, rid, now, detail))

    def _may_truncate(self) -> bool:
        """Whether the controller may cut an opted-in prompt to its window (level 3's response)."""
        c = self.controller
        return c is not None and c.config.enabled("truncate")

    def _retry_after(self) -> float:
        d = self._decision
        return d.retry_after_s if d is not None else 1.0

    def _reject(self, rid: int, reason: str, retry: float | None, pages: int, now: float, msg: str) -> None:
        s = self._stats
        s.num_rejected += 1
        s.rejected_by_reason[reason] = s.rejected_by_reason.get(reason, 0) + 1
        err = RequestRejected(reason, retry, pages, rid, f"request {rid} rejected ({reason}): {msg}")
        self._event("rejected", rid, now, reason=reason, http_status=err.http_status, needed_pages=pages)
        raise err

    def _enqueue(self, r: _Req) -> None:
        r.state = _WAITING
        if self.queue_policy == "fcfs":
            self._fifo.append(r)
        else:
            heapq.heappush(self._heap, (-r.priority, next(self._arrivals), r))

    def _queue_head(self) -> _Req | None:
        if self._preempted:
            return self._preempted[0]
        if self._fifo:
            return self._fifo[0]
        return self._heap[0][2] if self._heap else None

    def _pop_head(self) -> None:
        if self._preempted:
            self._preempted.popleft()
        elif self._fifo:
            self._fifo.popleft()
        else:
            heapq.heappop(self._heap)

    def _next_waiting(self, skipped: set[str | None]) -> _Req | None:
        """The first waiting request, in queue order, whose tenant is not in ``skipped`` (tenants at
        their quota: the requests behind them are not blocked by theirs)."""
        if not skipped:
            return self._queue_head()
        for r in self._preempted:
            if r.ns not in skipped:
                return r
        for r in self._fifo:
            if r.ns not in skipped:
                return r
        for _, _, r in sorted(self._heap, key=lambda e: (e[0], e[1])):
            if r.ns not in skipped:
                return r
        return None

    def _take_waiting(self, r: _Req) -> None:
        """Remove ``r`` from its queue (the head, usually)."""
        if self._queue_head() is r:
            self._pop_head()
        elif r in self._preempted:
            self._preempted.remove(r)
        elif self.queue_policy == "fcfs":
            self._fifo.remove(r)
        else:
            self._heap = [e for e in self._heap if e[2] is not r]
            heapq.heapify(self._heap)

    def _expire(self, now: float, rejected: list[RequestRejected]) -> None:
        limit = self.max_queue_wait_s
        if limit is None:
            return
        stale: list[_Req] = []
        if self._fifo:
            while self._fifo and now - self._fifo[0].arrival > limit:
                stale.append(self._fifo.popleft())
        if self._heap and any(now - r.arrival > limit for _, _, r in self._heap):
            keep = [e for e in self._heap if now - e[2].arrival <= limit]
            stale += [e[2] for e in self._heap if now - e[2].arrival > limit]
            heapq.heapify(keep)
            self._heap = keep
        for r in stale:
            del self._reqs[r.rid]
            r.state = _DONE
            pages = self._alone_pages(len(r.tokens))
            try:
                self._reject(r.rid, "timeout", self._retry_after(), pages, now, f"waited over {limit} s")
            except RequestRejected as e:
                rejected.append(e)

    def _observe(self, now: float) -> PressureDecision | None:
        c = self.controller
        if c is None:
            self._failed_this_step = 0
            return None
        st = self.cache.stats()
        usage = st.num_pages_in_use / max(self.usable_pages, 1)
        waits = [now - r.arrival for r in self._fifo] + [now - e[2].arrival for e in self._heap]
        p95 = max(0.0, float(np.percentile(waits, 95))) if waits else 0.0  # a clock set back: no wait
        demand = 0
        if c.level >= 4:
            held = self._pages.held
            queued = sum(held(len(r.tokens)) for r in self._fifo)
            queued += sum(held(len(e[2].tokens)) for e in self._heap)
            demand = max(0, queued - st.num_pages_free - st.num_pages_cached)
        tier_usage = None
        if self._tiered and c.config.tier_usage_high < 1.0:
            # Slots the tiers cannot reclaim (in flight, or locked under a transfer): a tier full of
            # cached copies is a full cache, not pressure (HBM usage leaves cached pages out too).
            ts = self.cache.tier_stats()
            total = sum(t["num_slots"] for t in ts.values())
            held = sum(t["num_slots_in_flight"] + t["num_slots_locked"] for t in ts.values())
            tier_usage = held / total if total else None
        sig = Signals(usage, self._failed_this_step, p95, tier_usage, demand)
        self._failed_this_step = 0
        d = c.observe(sig, len(self._running), now)
        for old, new, trig in c.take_transitions():
            self._event("pressure", None, now, **{"from": old, "to": new, "trigger": trig})
        if d.scale_out_pages is not None:
            self._event("scale_out", None, now, pages=d.scale_out_pages)
        if self._tiered:
            self._apply_store_policy(d.stricter_stores, now)
        if d.pin_ttl_cap_s is not None:
            capped = self.cache.cap_pins(d.pin_ttl_cap_s)
            if capped:
                self._event("pins_capped", None, now, pins=capped, ttl_s=d.pin_ttl_cap_s)
        if d.evict_to_free is not None:
            target = int(d.evict_to_free * self.usable_pages)
            short = target - st.num_pages_free
            if short > 0 and st.num_pages_cached > 0:
                got = self.cache.evict(min(short, st.num_pages_cached))
                if got:
                    self._stats.num_evicted_pages += got
                    self._event("evicted", None, now, pages=got)
        self._decision = d
        return d

    def _decode_arrays(
        self, rows: list[_Req]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.uint32]]:
        """ids, starts and tokens of decode rows (each computes its last token); counts current."""
        assert not self._lazy, "decode rows read while their counts lag (call _sync_decoding)"
        n = len(rows)
        ids = np.fromiter([r.rid for r in rows], np.int64, n)
        st = np.fromiter([r.computed for r in rows], np.int32, n)
        tok = np.fromiter([r.tokens[-1] for r in rows], np.uint32, n)
        return ids, st, tok

    def _apply_store_policy(self, stricter: bool, now: float) -> None:
        """Make the lower tiers' stores more selective under pressure (one more use required), and
        restore the policy the cache had once the pressure falls back."""
        m = self.cache
        if stricter and self._saved_store_policy is None:
            name, options = m.store_policy
            self._saved_store_policy = (name, options)
            min_hits = int(options["min_hits"]) + 1 if name == "selective" else 3
            m.set_store_policy("selective", {"min_hits": min_hits})
            self._event("store_policy", None, now, policy="selective", min_hits=min_hits)
        elif not stricter and self._saved_store_policy is not None:
            name, options = self._saved_store_policy
            self._saved_store_policy = None
            m.set_store_policy(name, options or None)
            self._event("store_policy", None, now, policy=name, **options)

    def _pages_coming_back(self) -> bool:
        """Whether pages held now come back without a request ending: this step's swaps (free once
        stored), loading requests (preemptible once they run), and transfers in flight (a store
        locks the HBM pages it reads until the engine's mover completes it, in the next forward).
        A request that fails alone while this holds waits a step rather than being refused."""
        if self._swapping or self._loading:
            return True
        if not self._tiered:
            return False
        return any(t["num_slots_in_flight"] for t in self.cache.tier_stats().values())

    def _victim(self) -> _Req:
        """Lowest priority first, then the youngest."""
        return min(self._running.values(), key=lambda r: (r.priority, -r.order))

    def _preempt(self, r: _Req, now: float) -> None:
        self._sync_one(r)
        m, ps = self.cache, self.page_size
        if r.computed > r.ever_computed:  # what the preemption throws away, recomputed on resume
            r.ever_computed = r.computed
        kind = "recompute"
        if self.swap is not None and r.computed >= ps:
            pages = r.computed // ps
            if self.swap.swap_s(pages) < self.swap.recompute_s(r.computed):
                kind = "swap"
                # Its pages stay locked until their stores complete (after this step): room comes then.
                self._swapping += m.offload(r.rid)
        m.free_sequence(r.rid)
        del self._running[r.rid]
        if r in self._rows:  # scheduled earlier in this step: its row goes
            i = self._rows.index(r)
            del self._rows[i], self._starts[i], self._counts[i]
        if self._decoding.pop(r.rid, None) is not None:
            self._dec_version += 1
            self._dec_used = None
            if self._decode_planned and r in self._decode_rows:
                # A decode row of this step (preempted for a prefill chunk): the arrays follow.
                self._decode_rows.remove(r)
                self._sync_decoding()
                self._decode_arrays_now = self._decode_arrays(self._decode_rows)
        # What the sequence held of tokens past its computed ones (a sampled token) stays in tokens.
        self._event("preempted", r.rid, now, kind=kind, computed_tokens=r.computed)
        self._stats.preemptions_by_kind[kind] += 1
        r.known = r.reserved = r.computed = r.committed_pages = 0
        r.state = _WAITING
        self._preempted.appendleft(r)

    def _reserve(self, r: _Req, upto: int, now: float, finished: list[tuple[int, str]]) -> bool:
        """Slots for r's tokens up to ``upto``, preempting others if needed; False if r itself left."""
        m = self.cache
        # The manager's count, not ours: a step that raised may have fallen between a reservation and
        # its bookkeeping (one call per prefill row, never on the decode path).
        r.reserved = int(m.num_reserved(r.rid))
        while r.reserved < upto:
            if m.reserve(r.rid, upto - r.reserved):
                r.reserved = upto
                return True
            self._stats.num_failed_reservations += 1
            self._failed_this_step += 1
            victim = self._victim()
            if victim is r and len(self._running) == 1:
                if not self._pages_coming_back():  # as for a decode row (step)
                    self._end(r, "capacity", now)
                    finished.append((r.rid, "capacity"))
                return False
            self._preempt(victim, now)
            if victim is r:
                return False
        return True

    def tenant_pages(self) -> dict[str | None, int]:
        """Pages each tenant's live requests hold now (None: the default namespace). Read-only and
        safe from another thread while the engine steps (the metrics scrape's ``tenant_pages``
        family): the live requests are taken in one C call each, and a decoding request's count is
        read from its tokens, without catching up the scheduler's own lazy counts (which only the
        engine's thread may write)."""
        reqs = [*list(self._running.values()), *list(self._loading.values())]
        lazy = self._lazy
        decoding = self._decoding
        out: dict[str | None, int] = {}
        for r in reqs:
            computed = r.computed
            if lazy and r.rid in decoding:
                computed = max(computed, len(r.tokens) - 1)
            n = self._pages.held(max(r.reserved, r.known, computed))
            out[r.ns] = out.get(r.ns, 0) + n
        return out

    def _tenant_pages(self, expected: bool = False) -> dict[str | None, int]:
        """Pages each tenant's live requests hold (and, ``expected``, will hold with their answers)."""
        self._sync_decoding()
        out: dict[str | None, int] = {}
        for r in (*self._running.values(), *self._loading.values()):
            n = self._pages.held(max(r.reserved, r.known, r.computed))
            if expected:
                n += self._expected_extra_pages(r)
            out[r.ns] = out.get(r.ns, 0) + n
        return out

    def _enforce_ceilings(self, now: float) -> None:
        """A tenant whose requests outgrew their plan past its ceiling gives back its youngest ones."""
        held = self._tenant_pages()
        for ns, ceiling in self.tenant_max.items():
            while held.get(ns, 0) > ceiling:
                mine = [r for r in self._running.values() if r.ns == ns]
                if len(mine) <= 1:
                    break  # one request alone may use the pool; the ceiling holds admissions back
                victim = min(mine, key=lambda r: (r.priority, -r.order))
                held[ns] -= self._pages.held(max(victim.reserved, victim.known, victim.computed))
                self._preempt(victim, now)

    def _expected_extra_pages(self, r: _Req) -> int:
        """Pages r's answer will still need beyond those its tokens hold now (the plan's quantile)."""
        total = self.estimator.expected(r.cls, r.max_new, r.generated)
        have = len(r.tokens)
        later = have + max(0, total - r.generated)
        return self._pages.peak(later) - self._pages.held(have)

    def _future_pages(self, r: _Req, extra: int) -> int:
        """Pages a prefilling (or loading) request will still take beyond those it holds: its prompt's
        next chunks (``prompt``: at most what they hold at once) or its expected answer (``extra`` of
        ``_expected_extra_pages``), whichever is more. With one full group: the prompt's unreserved
        pages plus the answer's (a window group releases the chunks' pages as they are committed)."""
        n, pages = len(r.tokens), self._pages
        now = pages.holding(max(r.reserved, r.computed), r.computed)
        return max(0, max(pages.prompt(n), pages.held(n) + extra) - now)

    def _decode_promised(self, used: _DecodeRows) -> int:
        """``_expected_extra_pages`` summed over the decoding requests, from their cached rows: each
        row's tokens are its start + 1, its generated count max_new - left (no Python pass).

        Per row, with ``planned`` the class's quantile (or ``max_new`` clipped, before any is known):
        the answer's expected length is ``min(max_new, max(planned, generated + 1))``, so the tokens
        still expected are ``min(left, max(planned - generated, 1))`` (``left >= 0``)."""
        ps, est = self.page_size, self.estimator
        num = used.num
        left, max_new = num[_LEFT], num[_MAX_NEW]
        gen = max_new - left
        if len(used.names) == 1:
            (name,) = used.names
            q = est.quantile_of(name)
            planned: npt.NDArray[np.int64] | int = np.minimum(max_new, est.clip) if q is None else q
        else:
            per_row = np.empty_like(max_new)
            cls = np.array(used.classes, dtype=object)
            for name in used.names:
                mask = cls == name
                q = est.quantile_of(name)
                per_row[mask] = np.minimum(max_new[mask], est.clip) if q is None else q
            planned = per_row
        expected = np.minimum(left, np.maximum(planned - gen, 1))
        if not self._pages.plain:
            have = num[_START] + 1
            return int((self._pages.peak_array(have + expected) - self._pages.held_array(have)).sum())
        ceil_have = num[_START] + ps  # (tokens + ps - 1): tokens = start + 1
        return int(((ceil_have + expected) // ps - ceil_have // ps).sum())

    def _admit(
        self,
        now: float,
        budget: int,
        cap: int,
        decision: PressureDecision | None,
        rows: list[_Req],
        starts: list[int],
        counts: list[int],
        loading: list[int],
    ) -> int:
        m, ps = self.cache, self.page_size
        chunk = self.long_prefill_token_threshold or budget
        st = m.stats()
        # Pages the live requests still need (their expected answers; prefills and loads, the rest of
        # their prompts too), kept out of the admissions.
        used, dec = self._dec_used, self._decoding
        if used is not None:  # every decoding request is a row of this step's cached arrays
            promised = self._decode_promised(used)
        else:
            self._sync_decoding()
            promised = sum(self._expected_extra_pages(r) for r in dec.values())
        if len(self._running) > len(dec) or self._loading:
            promised += sum(
                self._future_pages(r, self._expected_extra_pages(r))
                for r in (*self._running.values(), *self._loading.values())
                if r.rid not in dec
            )
        avail = st.num_pages_free + st.num_pages_cached  # pages an admission can take now
        quotas = bool(self.tenant_max or self.tenant_min)
        tenants = self._tenant_pages(expected=True) if quotas else {}
        # Tenants with a live request (the predicted-demand test against a ceiling is theirs only).
        active = {r.ns for r in (*self._running.values(), *self._loading.values())} if quotas else set()
        tax_ok = self.max_preemption_tax is None or self._stats.preemption_tax <= self.max_preemption_tax
        skipped: set[str | None] = set()  # tenants at their quota this step
        while budget > 0 and len(self._running) + len(self._loading) < cap:
            r = self._next_waiting(skipped)
            if r is None:
                break
            resumed = r.started
            if not resumed and not tax_ok and (self._running or self._loading):
                break  # the preemption budget is spent: new requests wait (alone, one may run)
            if not resumed and decision is not None and decision.truncate:
                self._truncate(r, now)
            if quotas and not resumed:  # its prompt as admitted (a window not cut) may never fit
                misfit = self._quota_misfit(r.ns, self._pages.held(len(r.tokens) + 1))
                if misfit is not None:
                    self._refuse_waiting(r, "tenant_quota", misfit, now)
                    continue
            tokens = r.token_array()
            prefix = m.peek_prefix_len(tokens, r.ns)  # uncapped, HBM only (the admitted event's)
            extra = self._expected_extra_pages(r)
            n = len(r.tokens)  # its prompt's chunks, or its expected answer, whichever holds more
            need = max(self._pages.prompt(n), self._pages.held(n) + extra) - self._pages.hit(
                self._taken_hit(tokens, r.ns, prefix)
            )
            if (self._running or self._loading) and need > avail - promised:
                break  # it would likely be preempted: wait for the running ones to finish
            if quotas and not self._tenant_allows(r, need, extra, avail, tenants, active):
                skipped.add(r.ns)
                continue
            if self.prefix_lookup is not None:
                try:
                    self.prefix_lookup(tokens, r.ns)
                except Exception as e:  # advisory: admitted with what HBM (and earlier lookups) hold
                    self._stats.num_failed_lookups += 1
                    self._event("lookup_failed", r.rid, now, error=f"{type(e).__name__}: {e}")
            hit = m.add_sequence(
                r.rid, tokens, r.ns, r.priority, cache_prompt=False, reserve=min(budget, chunk)
            )
            if hit is None:
                self._stats.num_failed_reservations += 1
                self._stats.num_failed_admissions += 1
                self._failed_this_step += 1
                if not self._running and not self._pages_coming_back():
                    self._refuse_waiting(r, "too_large", "does not fit even alone", now)
                    continue
                break
            # Registered (running) before the next manager call, so that the manager's sequence is a
            # live request's whatever raises from here: a step that raises leaves it running, and the
            # next step plans it from what it holds.
            self._take_waiting(r)
            r.known = len(r.tokens)
            r.computed = int(hit)
            r.committed_pages = int(hit) // ps
            r.order = next(self._admissions)
            r.resumed = resumed
            # Loading until the manager says it is ready: a lookup that raises leaves it waiting for
            # its loads (the step's loading check asks again), never computing over pages in flight.
            r.state = _LOADING if self._tiered else _RUNNING
            (self._loading if self._tiered else self._running)[r.rid] = r
            r.reserved = int(m.num_reserved(r.rid))
            if self._tiered and m.is_ready(r.rid):
                del self._loading[r.rid]
                r.state = _RUNNING
                self._running[r.rid] = r
            ready = r.state == _RUNNING
            s = self._stats
            if resumed:
                s.recomputed_tokens += max(0, min(r.ever_computed, r.known) - r.computed)
            else:
                r.started = True
                s.num_admitted += 1
                s.prompt_tokens += r.known
                s.hit_tokens += r.computed
            self._event(
                "admitted", r.rid, now, hit_tokens=r.computed, resumed=resumed, hbm_prefix_tokens=prefix
            )
            if quotas:
                tenants[r.ns] = tenants.get(r.ns, 0) + self._pages.held(len(r.tokens)) + extra
                active.add(r.ns)
            # What it took (its new pages, and its hit pages that were evictable: the estimate above
            # cannot tell those from pages other requests hold) and what it will still take.
            st = m.stats()
            avail = st.num_pages_free + st.num_pages_cached
            promised += self._future_pages(r, extra)
            if not ready:
                loading.append(r.rid)
                self._event("loading", r.rid, now)
                continue
            n = min(r.known - r.computed, budget, r.reserved - r.computed)
            if n > 0:
                rows.append(r)
                starts.append(r.computed)
                counts.append(n)
                budget -= n
        return budget

    def _taken_hit(self, tokens: npt.NDArray[np.uint32], ns: str | None, prefix: int) -> int:
        """The HBM hit ``add_sequence`` will take, given the uncapped ``prefix`` of ``tokens``: it
        looks up the first ``len - 1`` tokens. Where the prefix is shorter than that it is the same
        hit; a whole page-aligned prompt takes one page less on a plain cache, and on a grouped one
        what the shorter lookup finds (the window pages before its hit point may be gone: the hit can
        be far shorter, down to none)."""
        cap = (len(tokens) - 1) // self.page_size * self.page_size
        if prefix <= cap:
            return prefix
        return cap if self._pages.plain else self.cache.peek_prefix_len(tokens[:-1], ns)

    def _refuse_waiting(self, r: _Req, reason: str, msg: str, now: float) -> None:
        """Reject a queued request in the step (it is in the plan's ``rejected``): it can never fit."""
        self._take_waiting(r)
        del self._reqs[r.rid]
        r.state = _DONE
        pages = self._alone_pages(len(r.tokens))
        try:
            self._reject(r.rid, reason, None, pages, now, msg)
        except RequestRejected as e:
            self._rejected_in_step.append(e)

    def _check_loaded_hit(self, r: _Req) -> None:
        """A request whose loads completed: a failed load cut its hit before the failed page (the
        manager's rule), so the tokens from there on are computed after all."""
        hit = sum(self.cache.hit_tokens(r.rid).values())
        if hit >= r.computed:
            return
        lost = r.computed - hit
        s = self._stats
        if r.resumed:
            s.recomputed_tokens += lost
        else:
            s.hit_tokens -= lost
        r.computed = hit
        r.committed_pages = hit // self.page_size

    def _alone_pages(self, n: int) -> int:
        """The most a request with an ``n``-token prompt holds alone up to its first generated token:
        its prompt's chunks as they are computed, or the prompt and that token, whichever holds more
        (the same in every group for a plain cache: ``ceil((n + 1) / page_size)``)."""
        return max(self._pages.prompt(n), self._pages.held(n + 1))

    def _quota_misfit(self, ns: str | None, pages: int) -> str | None:
        """Why a request of tenant ``ns`` that holds ``pages`` pages with its first generated token can
        never run within the quotas (None: it can). Every page a request holds counts, its prefix hits
        included (as ``_tenant_pages`` counts them)."""
        ceiling = self.tenant_max.get(ns)
        if ceiling is not None and pages > ceiling:
            return f"needs {pages} pages, the ceiling of tenant {ns!r} is {ceiling}"
        if self.tenant_min:
            room = self.usable_pages - sum(f for t, f in self.tenant_min.items() if t != ns)
            if pages > room:
                return f"needs {pages} pages, the cache less the other tenants' floors has {room}"
        return None

    def _tenant_allows(
        self,
        r: _Req,
        need: int,
        extra: int,
        avail: int,
        held: dict[str | None, int],
        active: set[str | None],
    ) -> bool:
        """Whether the quotas let ``r`` in now (``need``: its new pages with its expected answer,
        ``extra`` of them its answer's; ``held``: each tenant's pages with their expected answers).

        Its tenant's ceiling must hold its prompt's pages (hits included) and its expected answer's
        beside the tenant's live requests'; with none of them live, that test is waived, as the memory
        test is with nothing running (alone, a request may outgrow its plan): that its prompt and first
        token fit (``_quota_misfit``, checked before) is enough. No admission takes the part of another
        tenant's floor that tenant does not use; with nothing live at all, waiting frees nothing and
        that test is waived too."""
        ceiling = self.tenant_max.get(r.ns)
        if ceiling is not None and r.ns in active:
            if held.get(r.ns, 0) + self._pages.held(len(r.tokens)) + extra > ceiling:
                return False
        if not self.tenant_min or not (self._running or self._loading):
            return True
        # Floors of the other tenants that their running requests do not use yet stay available to them.
        reserved = sum(max(0, f - held.get(ns, 0)) for ns, f in self.tenant_min.items() if ns != r.ns)
        mine = max(0, self.tenant_min.get(r.ns, 0) - held.get(r.ns, 0))
        return need <= avail - reserved or need <= mine

    def _truncate(self, r: _Req, now: float) -> None:
        w = r.request.window
        if w is None or len(r.tokens) <= w or r.generated:
            return
        sink = r.request.sink_tokens
        before = len(r.tokens)
        r.tokens = r.tokens[:sink] + r.tokens[before - (w - sink) :]
        r.array = np.asarray(r.tokens, np.uint32)
        r.base = len(r.tokens)
        self._stats.num_truncated += 1
        self._event("truncated", r.rid, now, from_len=before, to_len=len(r.tokens))

    def _end(self, r: _Req, reason: str, now: float) -> None:
        self._sync_one(r)
        rid = r.rid
        if r.state in (_RUNNING, _LOADING):
            self.cache.free_sequence(rid)  # first: if it raises, the request is as it was
            self._running.pop(rid, None)
            self._loading.pop(rid, None)
        elif r.state == _WAITING:
            self._take_waiting(r)
        if self._decoding.pop(rid, None) is not None:
            self._dec_version += 1
        r.state = _DONE
        r.computed = -1  # a stale plan row of it is void
        del self._reqs[rid]
        s = self._stats
        if reason == "capacity":
            s.num_rejected += 1
            s.rejected_by_reason["too_large"] = s.rejected_by_reason.get("too_large", 0) + 1
        else:
            s.num_finished += 1
            if reason in ("length", "stop") and r.generated:  # an answer (none: nothing to learn)
                self.estimator.observe(r.cls, r.generated)
        s.finished_by_reason[reason] = s.finished_by_reason.get(reason, 0) + 1
        self._event("finished", rid, now, reason=reason, output_len=r.generated)

    def _plan(
        self,
        now: float,
        rows: list[_Req],
        starts: list[int],
        counts: list[int],
        loading: list[int],
        finished: list[tuple[int, str]],
        rejected: list[RequestRejected],
        decision: PressureDecision | None,
    ) -> StepPlan:
        m, ps = self.cache, self.page_size
        rejected.extend(self._rejected_in_step)
        self._rejected_in_step.clear()
        d = self._decode_rows
        nd, npf = len(d), len(rows)
        n = nd + npf
        d_ids, d_st, d_tok = self._decode_arrays_now
        if d_ids is None or not nd:
            d_ids, d_st, d_tok = np.zeros(0, np.int64), _EMPTY_I32, np.zeros(0, np.uint32)
        if npf:
            ids = np.concatenate([d_ids, np.fromiter([r.rid for r in rows], np.int64, npf)])
            st = np.concatenate([d_st, np.asarray(starts, np.int32)])
            nt = np.ones(n, np.int32)
            nt[nd:] = counts
        else:
            ids, st = d_ids, d_st
            nt = np.ones(n, np.int32)
        sample = np.ones(n, bool)
        is_prefill = np.zeros(n, bool)
        if npf:
            is_prefill[nd:] = True
            sample[nd:] = [s0 + c == len(r.tokens) for r, s0, c in zip(rows, starts, counts, strict=True)]
            # Decode rows end at their sequence's length (no lookahead), prefill rows at their chunk's
            # end: one core call lays out every row's table, positions and slots.
            pt, q_indptr, positions, slots = m.batch_layout(ids, st, nt)
            chunks = [r.token_array()[s0 : s0 + c] for r, s0, c in zip(rows, starts, counts, strict=True)]
            tok = np.concatenate([d_tok, *chunks])
        elif n:  # decodes only: the whole table is theirs, each row's token sits in its last page
            pt = m.page_table(ids)
            q_indptr = np.arange(n + 1, dtype=np.int32)
            positions = st
            last = pt.kv_indices[pt.kv_indptr[1:] - 1].astype(np.int64)
            slots = last * ps + st % ps
            tok = d_tok
        else:
            pt = PageTable(np.zeros(1, np.int32), _EMPTY_I32, _EMPTY_I32)
            q_indptr = np.zeros(1, np.int32)
            positions = _EMPTY_I32
            slots = np.zeros(0, np.int64)
            tok = np.zeros(0, np.uint32)
        total = int(q_indptr[-1])
        # Taken last: a step that raised before leaves the copies (and the events) to the next plan.
        copies = m.take_pending_copies()
        self._stats.computed_tokens += total
        events, self._events = self._events, []
        return StepPlan(
            time_s=now,
            request_ids=ids,
            starts=st,
            num_tokens=nt,
            is_prefill=is_prefill,
            sample=sample,
            q_indptr=q_indptr,
            token_ids=tok,
            positions=positions,
            slot_mapping=slots,
            page_table=pt,
            copies=copies,
            loading=loading,
            finished=finished,
            rejected=rejected,
            events=events,
            level=decision.level if decision is not None else 0,
        )
