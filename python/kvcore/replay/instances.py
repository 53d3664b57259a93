"""Several engine instances over one trace, sharing one remote tier: what the shared tier saves.

Why: a cluster's instances each have their own HBM (and host or disk tiers), so a prefix computed on one
is recomputed on another unless they share a tier below. This replays a trace split over ``N``
instances, each a real :class:`kvcore.KVCacheManager` with a ``remote`` lower tier whose store
(:mod:`kvcore.replay.shared`) all of them read and write, and then the same split without the remote
tier, so the difference is what sharing (and the remote tier's capacity) buys.

How an instance uses the shared tier (what an engine with :class:`kvcore.tiers.Mover` does): before
each admission it asks the store which pages of the prompt it holds beyond those its own remote index
knows (one bounded question, ``remote_lookup_keys`` pages) and indexes them (``mark_tier_pages``);
``add_sequence`` then plans loads from the remote tier for them; a load succeeds if the store holds the
key. Stores to the remote tier follow the store policy, like the other tiers, and add their keys to the
store. No bytes move.

**Splits** (:data:`SPLITS`): ``round-robin`` gives request ``i`` (trace order) to instance ``i mod N``;
``session`` keeps a conversation on one instance, the way a sticky router does: Mooncake traces name no
sessions, so a request's session key is its first hash id past the prefix every request of the trace
shares (:func:`session_keys`; on the conversation trace, block 0 is in all 12,031 requests and the key
is the second block's id), and sessions go round-robin in order of first appearance. Where requests
share no common prefix but a few system prompts (the built-in workload), the key is the system
prompt's first block: the split then keeps each system prompt on one instance.

**Modes**: sequential (trace order, one request at a time on each instance, the instances taking turns
in trace order) and timed (each instance its own queue and clock; events of all instances in global
time order, ties by instance; a remote load costs ``page_bytes / remote bandwidth`` of simulated time).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError
from kvcore.replay.capacity import Capacity
from kvcore.replay.engine import ReplayConfig, _check_finite, _prefill_chunk_tokens, _Sequential, _Timed
from kvcore.replay.progress import Progress
from kvcore.replay.report import InstanceResult, InstancesReport, PolicyResult, WorkloadSummary
from kvcore.replay.shared import MemoryStore, SharedStore
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import Trace

__all__ = ["SPLITS", "replay_instances", "session_keys", "split_requests"]

#: How requests are given to instances: the first is the default.
SPLITS = ("round-robin", "session")


def session_keys(trace: Trace) -> npt.NDArray[np.int64]:
    """``[num_requests]`` int64: each request's session key, its first hash id past the prefix every
    request shares (its last id when it has none past it)."""
    indptr = trace.hash_indptr
    counts = np.diff(indptr)  # [num_requests] ids per request, >= 1
    heads = indptr[:-1]
    common = 0  # leading positions where every request has the same id
    limit = int(counts.min()) if len(counts) else 0
    while common < limit:
        column = trace.hash_ids[heads + common]
        if (column != column[0]).any():
            break
        common += 1
    return trace.hash_ids[heads + np.minimum(common, counts - 1)]


def split_requests(trace: Trace, num_instances: int, split: str) -> npt.NDArray[np.int32]:
    """``[num_requests]`` int32: the instance, in ``[0, num_instances)``, each request goes to.

    Raises:
        ConfigError: ``num_instances`` < 1 or an unknown ``split``.
    """
    if isinstance(num_instances, bool) or not isinstance(num_instances, int) or num_instances < 1:
        raise ConfigError(f"num_instances must be an integer >= 1, got {num_instances!r}")
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    n = trace.num_requests
    if split == "round-robin":
        return (np.arange(n) % num_instances).astype(np.int32)
    _, first, inverse = np.unique(session_keys(trace), return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # [sessions] order of first appearance
    return (rank[inverse.ravel()] % num_instances).astype(np.int32)


# One instance's replay: its figures, and its shared-tier counters (lookups, pages marked, pages from others,
# failed loads) where it had the remote tier.
_Run = tuple[PolicyResult, tuple[int, int, int, int]]


def _shared_counters(sim: _Sequential | _Timed) -> tuple[int, int, int, int]:
    look, moves = sim.lookup, sim.moves
    if look is None:
        return (0, 0, 0, 0)
    return (look.num_lookups, look.num_marked_pages, moves.num_pages_from_others, moves.num_load_failures)


def _run(
    trace: Trace,
    cfg: ReplayConfig,
    src: TokenSource,
    assign: npt.NDArray[np.int32],
    num_instances: int,
    store: SharedStore | None,
    tick: Callable[[int], None],
) -> list[_Run]:
    """Every instance over its requests, the instances taking turns (see the module docs)."""
    if cfg.mode == "sequential":
        sizes = np.bincount(assign, minlength=num_instances).tolist()
        seq = [
            _Sequential(trace, cfg, src, None, num_requests=sizes[k], store=store, instance=k)
            for k in range(num_instances)
        ]
        steps = [s.request for s in seq]
        for i, k in enumerate(assign.tolist()):
            steps[k](i, None)
            if i & 63 == 0:
                tick(i)
        return [(s.result(), _shared_counters(s)) for s in seq]
    timed = [
        _Timed(trace, cfg, src, None, requests=np.flatnonzero(assign == k), store=store, instance=k)
        for k in range(num_instances)
    ]
    heap = [(s.next_time(), k) for k, s in enumerate(timed)]
    heap = [e for e in heap if e[0] < math.inf]
    heapq.heapify(heap)
    events = 0
    while heap:
        k = heap[0][1]
        sim = timed[k]
        sim.advance()
        t = sim.next_time()
        if t < math.inf:
            heapq.heapreplace(heap, (t, k))
        else:
            heapq.heappop(heap)
        events += 1
        if events & 255 == 0:
            tick(sum(s.done for s in timed))
    return [(s.result(trace), _shared_counters(s)) for s in timed]


def replay_instances(
    trace: Trace,
    config: ReplayConfig,
    *,
    num_instances: int,
    split: str = SPLITS[0],
    store: SharedStore | None = None,
    capacity: Capacity | None = None,
    tokens: TokenSource | None = None,
    progress: bool | None = None,
) -> InstancesReport:
    """Replay ``trace`` over ``num_instances`` instances of ``config`` (per instance: HBM, lower tiers,
    the remote tier's index) sharing ``store`` (default: a fresh :class:`MemoryStore`), then again
    without the remote tier; one policy (``config.policy``). ``store`` should be empty: what it holds
    counts as stored by an instance (its origin says which).

    Raises:
        ConfigError: no remote tier in ``config`` (``remote_index_slots`` is 0), a bad ``num_instances``
            or ``split``, ``capacity`` not describing ``config``, or timed mode on an untimed trace.
    """
    if config.remote_index_slots < 1:
        raise ConfigError("replay_instances needs a remote tier: remote_index_slots >= 1")
    if capacity is None:
        capacity = Capacity(
            config.capacity_pages, config.page_size, f"{config.capacity_pages:,} pages (given)"
        )
    if capacity.pages != config.capacity_pages or capacity.page_size != config.page_size:
        raise ConfigError("capacity does not describe config")
    if config.mode == "timed" and trace.timestamps_ms is None:
        raise ConfigError("timed mode needs a trace with timestamps")
    assign = split_requests(trace, num_instances, split)
    timed = config.mode != "sequential"
    src = tokens if tokens is not None else TokenSource(trace, answers=timed)
    if timed and not src.has_answers:
        raise ConfigError("tokens: a timed replay generates answers; this TokenSource has none")
    shared = store if store is not None else MemoryStore()
    n = trace.num_requests
    runs: dict[bool, list[_Run]] = {}
    for remote in (True, False):
        label = f"{num_instances} x {'with' if remote else 'w/o'} remote"
        bar = Progress(n, label, enabled=progress)
        cfg = config if remote else replace(config, remote_index_slots=0)
        runs[remote] = _run(trace, cfg, src, assign, num_instances, shared if remote else None, bar.update)
        bar.close(n)
        for result, _ in runs[remote]:
            _check_finite(result.to_dict(), cfg)
    instances = [
        InstanceResult(
            instance=k,
            num_requests=with_r.num_requests,
            with_remote=with_r,
            without_remote=without_r,
            num_remote_lookups=extra[0],
            num_remote_marked_pages=extra[1],
            num_remote_pages_from_others=extra[2],
            num_remote_load_failures=extra[3],
        )
        for k, ((with_r, extra), (without_r, _)) in enumerate(zip(runs[True], runs[False], strict=True))
    ]
    settings: dict[str, object] = {
        "num_instances": num_instances,
        "split": split,
        "remote": shared.name,
        "policy": config.policy,
        "lower_tiers": [
            {"name": name, "num_slots": slots, "bandwidth_gbps": bw} for name, slots, bw in config.lower_tiers
        ],
        "remote_lookup_keys": config.remote_lookup_keys,
        "store_policy": config.store_policy,
        "page_bytes": config.page_nbytes,
    }
    if config.mode == "timed":
        settings.update(
            prefill_rate=config.prefill_rate,
            decode_rate=config.decode_rate,
            prefill_chunk_tokens=_prefill_chunk_tokens(config),
            max_queue_wait_s=config.max_queue_wait_s,
        )
    return InstancesReport(
        workload=WorkloadSummary.of(trace),
        capacity=capacity,
        mode=config.mode,
        settings=settings,
        instances=instances,
        num_store_keys=len(shared),
    )
