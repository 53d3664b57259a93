"""The replay engine: a workload through the real :class:`kvcore.KVCacheManager`, one policy at a time.

Why the real manager and not a model of it: the question is what *kvcore* will do with this traffic at
this capacity (its page-granular matching, its eviction order, its refusals), so every admission,
decode step and release is a manager call, and every figure comes from the manager's answers.

Two modes:

**sequential** (Mooncake's Figure 9): requests in trace order, one at a time. Each takes its longest
cached prefix (``add_sequence``), its prompt's full pages are cached, and it is freed at once; outputs
are not generated, so not cached. The manager's eviction policy decides what goes when the cache is
full (LRU: least recently used leaves first). Only a prompt larger than the whole cache is refused.

**timed**: simulated time, no sleeping, through :class:`kvcore.scheduler.Scheduler` (the scheduler an
engine embeds, first come first served, no pressure controller), stepped as an engine would: requests
are submitted at their timestamps, each step's plan is computed (``step``), and its sampled tokens are
the trace's answer tokens (``update``). Every scheduling decision is the scheduler's, and the figures
come from its events (admissions, preemptions, refusals) and the manager's answers. Each request runs as
if alone: it computes its uncached prompt tokens at ``prefill_rate`` tokens/s and decodes at
``decode_rate`` tokens/s, so a step lasts ``1 / decode_rate`` when it decodes and a request's prefill
chunk is ``prefill_rate / decode_rate`` tokens (the scheduler's ``long_prefill_token_threshold``); the
step budget and the running cap never bind. What the scheduler does that shapes the figures:

- admission predicts demand: the head of the queue waits until its prompt's uncached pages and the
  answer its class is expected to give (:class:`~kvcore.scheduler.OutputLengthEstimator`: the whole
  ``output_length`` until 16 answers were seen, then their 95th percentile) fit beside what the running
  requests still need; a request that waits longer than ``max_queue_wait_s`` is refused (``timeout``),
  and so is one that cannot fit even when nothing else runs (``too_large``);
- prompts are prefilled in chunks, and their pages are cached as they are computed: a request that
  arrives while another still computes the same prefix does not hit it yet;
- the prefill step's logits give the first output token, and the last one is sampled but never
  computed (its page is not cached); a decode step reserves one slot per request;
- when a decode or a chunk finds no room, the lowest-priority, youngest running request is
  **preempted** by recompute (its full pages stay cached; it is requeued at the front and recomputes
  what it had computed, mostly cache hits). A request alone that still cannot grow is refused.

Every request ends served or refused; none is lost. ``decode_chunk`` is not used any more (the
scheduler reserves one slot per decode step); it stays accepted so that older configurations run.

Memory follows the capacity, not the trace's numbers: a prompt that cannot fit the cache with its first
token is refused without its tokens being built (as ``submit`` would refuse it), answer tokens are
built a step at a time, and a queued request holds its prompt's tokens, as an engine's queue does.

**Lower tiers** (``host_tier_slots``, ``disk_tier_slots``): the manager is built with a host-DRAM and/or a
disk tier below HBM and a store policy (``selective``, ``all``, ``value``; see ``_kvcore.pyi``). No bytes
move in a replay: after each admission and release (timed: after each step and each update) the engine
takes the queued stores and completes every one OK, so a store is visible to the next lookup. A request's
hit may then come partly from a tier (``hit_tokens(seq_id)``). Sequential: its loads complete at once.
Timed: the scheduler holds the request (``loading``) until its loads complete, which they do after
``pages x page_bytes / bandwidth`` of simulated time (its pages one after the other, the tiers one after
the other; the loads of the requests admitted in one step complete together, when the longest is
done); it then computes only the tokens found nowhere. Stores are write-backs off the request's path and
cost it nothing. Per tier, the result counts hits, pages stored and loaded (bytes = pages x
``page_bytes``), and the stores the manager skipped and why.

**Remote tier** (``remote_index_slots``): a lower tier below the others whose content lives in a shared
store of page keys (:mod:`kvcore.replay.shared`), which several instances may write
(:mod:`kvcore.replay.instances`). Before each admission (timed: the scheduler's ``prefix_lookup``) the
engine asks the store which pages of the prompt it holds beyond those the instance's remote index knows
(at most ``remote_lookup_keys`` of them, as :meth:`kvcore.tiers.Mover.lookup` does) and indexes them; a
remote store adds its keys to the store; a remote load succeeds only if the store holds its key
(otherwise the manager cuts the hit there, and the engine counts the shorter hit). ``replay`` alone
gives the remote tier a private store.

Hit accounting (see :mod:`kvcore.replay.report`): ``hit_tokens`` are uncapped. ``add_sequence`` caps
its answer at ``prompt_len - 1``; the two differ only for a page-aligned prompt, so the sequential engine
asks ``peek_prefix_len`` (no side effects) first for those prompts only, about one in ``page_size`` of
them, which costs almost nothing; the scheduler reports the same uncapped prefix in its ``admitted``
events (``hbm_prefix_tokens``). ``peek_prefix_len`` sees HBM only, so with tiers a page-aligned prompt
counts fully only when HBM holds all of it; otherwise its hit is the manager's capped answer, short by the
last page when that page is found only in a lower tier (the manager offers no uncapped lookup of them).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore import CacheStats, KVCacheManager, TransferBatch
from kvcore._json import show
from kvcore.exceptions import ConfigError, RequestRejected
from kvcore.replay.capacity import Capacity
from kvcore.replay.progress import Progress
from kvcore.replay.report import (
    PolicyResult,
    ReplayReport,
    TierResult,
    Timeline,
    UsageSplit,
    WorkloadSummary,
)
from kvcore.replay.shared import MemoryStore, SharedStore
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import Trace
from kvcore.scheduler import PressureController, Request, Scheduler, StepPlan

__all__ = [
    "DEFAULT_BANDWIDTH_GBPS",
    "DEFAULT_REMOTE_LOOKUP_KEYS",
    "DEFAULT_TOKEN_BYTES",
    "MODES",
    "POLICIES",
    "STORE_POLICIES",
    "Observer",
    "ReplayConfig",
    "default_sweep_pages",
    "replay",
    "run_replay",
]

POLICIES = ("lru", "lfu", "priority")
MODES = ("sequential", "timed")
#: The manager's store policies (which pages go down to the lower tiers); the first is its default.
STORE_POLICIES = ("selective", "all", "value")
#: GB/s (10^9 B/s) of each tier: the manager's own defaults (rust/py/tiers.rs). The engine always passes
#: a bandwidth to the manager, so the value policy and the timed mode's load times use the same figure.
DEFAULT_BANDWIDTH_GBPS = {"host": 25.0, "disk": 5.0, "remote": 1.0}
#: Most pages one lookup asks the shared store about (kvcore.tiers.RedisTier's max_lookup_keys).
DEFAULT_REMOTE_LOOKUP_KEYS = 2048
#: K/V bytes of one token over all layers when no model is given: Llama-3.1-8B in bf16 (32 layers x 8 KV
#: heads x 128 x 2 (K, V) x 2 B), the value policy's default of 2 MiB per 16-token page.
DEFAULT_TOKEN_BYTES = 128 * 1024

#: Called with (simulated time or request index, stats) after each step and update (timed), or admission.
Observer = Callable[[float, CacheStats], None]

_TIMELINE_POINTS = 2000  # samples kept for the plot, at most about this many


@dataclass(frozen=True)
class ReplayConfig:
    """One replay's settings. The timed-mode knobs are ignored in sequential mode."""

    capacity_pages: int  # usable pages, >= 1 (the manager is built with one more: the null page)
    page_size: int = 16  # tokens per page, >= 1 (512 reproduces Mooncake's blocks)
    policy: str = "lru"  # eviction policy: one of POLICIES
    mode: str = "sequential"  # one of MODES
    prefill_rate: float = 10_000.0  # timed: uncached prompt tokens computed per s per request, > 0, finite
    decode_rate: float = 50.0  # timed: tokens generated per second per request, > 0, finite
    decode_chunk: int = (
        32  # not used (the scheduler reserves one slot per decode step); >= 1, for old configs
    )
    max_queue_wait_s: float = 60.0  # timed: longest wait for admission before a refusal, >= 0, finite
    host_tier_slots: int = 0  # pages of the host-DRAM tier below HBM, >= 0 (0: no host tier)
    disk_tier_slots: int = 0  # pages of the disk tier below host, >= 0 (0: no disk tier)
    host_bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS["host"]  # GB/s of a host load or store, > 0, finite
    disk_bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS["disk"]  # GB/s of a disk load or store, > 0, finite
    remote_index_slots: int = 0  # remote-tier pages this instance's index may know, >= 0 (0: no remote)
    remote_bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS["remote"]  # GB/s of a remote load or store, > 0
    remote_lookup_keys: int = DEFAULT_REMOTE_LOOKUP_KEYS  # most pages one lookup asks the store about, >= 1
    store_policy: str = STORE_POLICIES[0]  # one of STORE_POLICIES (unused without a tier)
    page_bytes: int | None = None  # K/V bytes of one page, >= 1; None: DEFAULT_TOKEN_BYTES * page_size
    miss_ratio_curve: bool | int | None = None  # the manager's miss_ratio_curve= (None: off)

    def __post_init__(self) -> None:
        for name in ("capacity_pages", "page_size", "decode_chunk", "remote_lookup_keys"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {show(value)}")
        for name in ("host_tier_slots", "disk_tier_slots", "remote_index_slots"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {show(value)}")
        pb = self.page_bytes
        if pb is not None and (isinstance(pb, bool) or not isinstance(pb, int) or pb < 1):
            raise ConfigError(f"page_bytes must be None or an integer >= 1, got {show(pb)}")
        if self.store_policy not in STORE_POLICIES:
            raise ConfigError(
                f"store_policy must be one of {', '.join(STORE_POLICIES)}, got {show(self.store_policy)}"
            )
        bandwidths = (self.host_bandwidth_gbps, self.disk_bandwidth_gbps, self.remote_bandwidth_gbps)
        if not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
            for x in bandwidths
        ):
            raise ConfigError(
                "host_bandwidth_gbps, disk_bandwidth_gbps and remote_bandwidth_gbps must be finite and > 0, "
                f"got {', '.join(show(x) for x in bandwidths)}"
            )
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {show(self.policy)}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {show(self.mode)}")
        rates = (self.prefill_rate, self.decode_rate, self.max_queue_wait_s)
        # Finite: the settings go into report.json, and JSON has no infinity.
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in rates) or not (
            self.prefill_rate > 0 and self.decode_rate > 0 and self.max_queue_wait_s >= 0
        ):
            raise ConfigError(
                "prefill_rate and decode_rate must be finite and > 0, max_queue_wait_s finite and >= 0"
            )

    @property
    def lower_tiers(self) -> list[tuple[str, int, float]]:
        """``(name, num_slots, bandwidth_gbps)`` of each configured tier, fastest first (empty: HBM only)."""
        tiers = [
            ("host", self.host_tier_slots, float(self.host_bandwidth_gbps)),
            ("disk", self.disk_tier_slots, float(self.disk_bandwidth_gbps)),
            ("remote", self.remote_index_slots, float(self.remote_bandwidth_gbps)),
        ]
        return [t for t in tiers if t[1] > 0]

    @property
    def page_nbytes(self) -> int:
        """K/V bytes of one page: ``page_bytes``, or :data:`DEFAULT_TOKEN_BYTES` per token."""
        return self.page_bytes if self.page_bytes is not None else DEFAULT_TOKEN_BYTES * self.page_size


def _manager(cfg: ReplayConfig) -> KVCacheManager:
    """A fresh manager for ``cfg``: HBM of ``capacity_pages`` (plus the null page), and its lower tiers.

    The value policy weighs a store against the replay's own costs: ``page_bytes``, and in timed mode the
    prefill rate (sequential mode has none, so the manager's default per-token prefill cost applies).
    """
    tiers = cfg.lower_tiers
    if not tiers:
        return KVCacheManager(
            cfg.capacity_pages + 1,
            page_size=cfg.page_size,
            eviction=cfg.policy,
            miss_ratio_curve=cfg.miss_ratio_curve,
        )
    options: dict[str, float] | None = None
    if cfg.store_policy == "value":
        options = {"page_bytes": float(cfg.page_nbytes)}
        if cfg.mode == "timed":
            options["prefill_us_per_token"] = 1e6 / cfg.prefill_rate
    return KVCacheManager(
        cfg.capacity_pages + 1,
        page_size=cfg.page_size,
        eviction=cfg.policy,
        lower_tiers=tiers,
        store_policy=cfg.store_policy,
        store_options=options,
        miss_ratio_curve=cfg.miss_ratio_curve,
    )


class _Transfers:
    """Completes the queued transfers (a replay moves no bytes) and tallies the loads' time (``bytes /
    bandwidth``, which the timed mode makes requests wait).

    ``settle`` (sequential) completes everything at once, after each manager call that may queue stores
    or loads: a store not completed is invisible to lookups, and a sequence with a load in flight is not
    ready (its tables cannot be used). ``start`` (timed) completes the stores and the loads that fail at
    once and returns the others, which the timed replay completes when their simulated time is up.

    With a remote tier, its stores add their keys to the shared ``store`` (as instance ``instance``),
    and each of its loads succeeds only if the store holds the key (a failed load cuts the hit: the
    manager counts it); every other transfer succeeds.
    """

    def __init__(
        self, m: KVCacheManager, cfg: ReplayConfig, store: SharedStore | None = None, instance: int = 0
    ) -> None:
        self.take, self.complete = m.take_transfers, m.complete_transfers
        tiers = cfg.lower_tiers
        # Simulated seconds to load one page from each tier, indexed like TransferBatch.load_tiers.
        self.page_s = np.array([cfg.page_nbytes / (bw * 1e9) for _, _, bw in tiers])  # [num_tiers] float64
        self.load_s = [0.0] * len(tiers)  # simulated seconds of loads, per tier
        names = [name for name, _, _ in tiers]
        self.remote = names.index("remote") if "remote" in names else -1  # its index in tier rows; -1: none
        if self.remote >= 0 and store is None:
            raise ConfigError("a remote tier needs a shared store")
        self.store = store
        self.instance = instance  # this instance's number in the store's origins, >= 0
        self.num_pages_from_others = 0  # remote pages loaded that another instance stored
        self.num_load_failures = 0  # loads the store could not serve (their hits were cut)

    def _decide(self, b: TransferBatch) -> tuple[list[int], npt.NDArray[np.bool_], float]:
        """The batch's store op ids, which of its loads will succeed ([num_loads] bool) and their
        seconds (one after the other); counts those per tier, and adds the remote stores' keys to the
        shared store."""
        load_ok = np.ones(len(b.load_ops), dtype=bool)
        if self.remote >= 0 and self.store is not None:
            rows = np.flatnonzero(b.store_tiers == self.remote)
            if len(rows):
                self.store.add(b.store_keys[rows], self.instance)
            rows = np.flatnonzero(b.load_tiers == self.remote)
            if len(rows):
                origin = self.store.origins(b.load_keys[rows])  # [len(rows)] int32, -1: absent
                found = origin >= 0
                self.num_pages_from_others += int((found & (origin != self.instance)).sum())
                load_ok[rows] = found
                self.num_load_failures += int((~found).sum())
        seconds = 0.0
        if len(b.load_tiers):
            moved = b.load_tiers[load_ok]  # a missing page moves nothing
            per_tier = np.bincount(moved, minlength=len(self.page_s)) * self.page_s
            for t, s in enumerate(per_tier.tolist()):
                self.load_s[t] += s
            seconds = float(per_tier.sum())
        return np.unique(b.store_ops).tolist(), load_ok, seconds

    def settle(self) -> float:
        """Complete what is queued; the simulated seconds its loads take (one after the other)."""
        b = self.take()
        if not b:
            return 0.0
        stores, load_ok, seconds = self._decide(b)
        ok = np.concatenate([np.ones(len(stores), dtype=bool), load_ok])
        self.complete(stores + b.load_ops.tolist(), ok)
        return seconds

    def start(self) -> list[int]:
        """Complete the queued stores and the loads that fail now; the op ids of the loads that will
        succeed, for the caller to complete when they are done."""
        b = self.take()
        if not b:
            return []
        stores, load_ok, _ = self._decide(b)
        failed = b.load_ops[~load_ok].tolist()
        if stores or failed:
            self.complete(stores + failed, [True] * len(stores) + [False] * len(failed))
        return b.load_ops[load_ok].tolist()


class _Lookup:
    """Before an admission, asks the shared store which pages of the prompt it holds beyond those this
    instance's remote index knows, and indexes them, so that ``add_sequence`` loads them. The few lines
    of :meth:`kvcore.tiers.Mover.lookup`, with the replay's store; one bounded question per prompt. The
    timed replay gives it to the scheduler as its ``prefix_lookup``."""

    def __init__(self, m: KVCacheManager, store: SharedStore, max_keys: int) -> None:
        self.keys, self.known, self.mark = m.prompt_keys, m.tier_prefix_len, m.mark_tier_pages
        self.page_size = m.page_size
        self.store = store
        self.max_keys = max_keys  # most keys asked per lookup, >= 1
        self.num_lookups = 0  # questions asked of the store (prompts whose pages the index did not all know)
        self.num_marked_pages = 0  # pages the store held that the index did not know, newly indexed

    def __call__(self, tokens: npt.NDArray[np.uint32], namespace: str | None = None) -> None:
        known = self.known("remote", tokens, namespace)
        if known >= len(tokens) // self.page_size:  # the index knows every full page: nothing to ask
            return
        keys = self.keys(tokens, namespace)  # [full pages, 16] uint8
        self.num_lookups += 1
        found = self.store.leading(keys[known : known + self.max_keys])
        if found:
            self.num_marked_pages += self.mark("remote", tokens, known + found, namespace)


def _tier_results(
    m: KVCacheManager, cfg: ReplayConfig, hits: dict[str, int], load_s: Sequence[float]
) -> list[TierResult]:
    """One :class:`TierResult` per lower tier, from the manager's counters and the engine's tallies."""
    stats = m.tier_stats()
    out = []
    for (name, slots, bw), seconds in zip(cfg.lower_tiers, load_s, strict=True):
        s = stats[name]
        out.append(
            TierResult(
                name=name,
                num_slots=slots,
                bandwidth_gbps=bw,
                page_bytes=cfg.page_nbytes,
                hit_tokens=hits[name],
                num_stored_pages=s["num_stored_pages"],
                num_loaded_pages=s["num_loaded_pages"],
                num_store_skipped_no_room=s["num_store_skipped_no_room"],
                num_store_skipped_in_flight=s["num_store_skipped_in_flight"],
                num_store_failed_pages=s["num_store_failed_pages"],
                num_load_failed_pages=s["num_load_failed_pages"],
                num_evicted_slots=s["num_evicted_slots"],
                num_slots_cached=s["num_slots_cached"],
                load_s=seconds,
            )
        )
    return out


def _tier_fields(
    m: KVCacheManager, cfg: ReplayConfig, hits: dict[str, int], load_s: Sequence[float]
) -> dict[str, Any]:
    """The PolicyResult fields of the lower tiers (none without tiers: the result is as before)."""
    if not cfg.lower_tiers:
        return {}
    return dict(
        store_policy=cfg.store_policy,
        page_bytes=cfg.page_nbytes,
        tiers=_tier_results(m, cfg, hits, load_s),
    )


class _Usage:
    """Integrates the usage split over time, keeps its extremes, its per-sample sums and the plot's samples.

    Scalars rather than lists: this runs after every change of usage (tens of thousands of times).
    """

    def __init__(self, m: KVCacheManager, t0: float, span: float, observer: Observer | None, x_label: str):
        self.stats = m.stats
        self.observer = observer
        self.t = t0
        total = m.num_pages - 1
        self.u = self.c = self.p = 0  # in use, cached, pinned now (an empty cache)
        self.f = total  # free now
        self.area_u = self.area_c = self.area_p = self.area_f = 0.0  # time integrals
        self.max_u = self.max_c = self.max_p = 0
        self.min_f = total
        self.sum_u = self.sum_c = self.sum_p = self.sum_f = 0  # over samples
        self.count = 0
        self.timeline = Timeline(x_label=x_label)
        self.step = span / _TIMELINE_POINTS if span > 0 else 0.0
        self.next_point = t0

    def sample(self, t: float, hit_rate: float) -> None:
        s = self.stats()
        u, c, p, f = s.num_pages_in_use, s.num_pages_cached, s.num_pages_pinned, s.num_pages_free
        dt = t - self.t
        if dt > 0:
            self.area_u += self.u * dt
            self.area_c += self.c * dt
            self.area_p += self.p * dt
            self.area_f += self.f * dt
            self.t = t
        self.u, self.c, self.p, self.f = u, c, p, f
        if u > self.max_u:
            self.max_u = u
        if c > self.max_c:
            self.max_c = c
        if p > self.max_p:
            self.max_p = p
        if f < self.min_f:
            self.min_f = f
        self.sum_u += u
        self.sum_c += c
        self.sum_p += p
        self.sum_f += f
        self.count += 1
        if self.observer is not None:
            self.observer(t, s)
        if t >= self.next_point:
            self.next_point = t + self.step
            tl = self.timeline
            tl.x.append(t)
            tl.in_use.append(u)
            tl.cached.append(c)
            tl.pinned.append(p)
            tl.free.append(f)
            tl.hit_rate.append(hit_rate)

    def close(self, t_end: float) -> None:
        """Extend the last sample to ``t_end`` (the end of the run) in the time integrals."""
        self.sample(t_end, self.timeline.hit_rate[-1] if self.timeline.hit_rate else 0.0)

    def extremes(self) -> UsageSplit:
        return UsageSplit(self.max_u, self.max_c, self.max_p, self.min_f)

    def sample_mean(self) -> UsageSplit:
        """The mean over samples; with none (no request admitted), the pool as it stayed: idle, as its
        extremes say (a mean of zero samples would say 0 pages free of a pool that never lost one)."""
        n = self.count
        if n == 0:
            return UsageSplit(self.u, self.c, self.p, self.f)
        return UsageSplit(self.sum_u / n, self.sum_c / n, self.sum_p / n, self.sum_f / n)

    def time_mean(self, span: float) -> UsageSplit:
        if span <= 0:
            return UsageSplit(self.u, self.c, self.p, self.f)
        return UsageSplit(self.area_u / span, self.area_c / span, self.area_p / span, self.area_f / span)


def _counters(n: int) -> dict[str, int | float]:
    """The counters of a PolicyResult, zeroed (the engines update them in place)."""
    return dict(
        num_requests=n,
        num_served=0,
        num_refused=0,
        num_refused_too_large=0,
        num_refused_timeout=0,
        num_admission_failures=0,
        num_preemptions=0,
        num_append_failures=0,
        prompt_tokens=0,
        hit_tokens=0,
        prefill_tokens_saved=0,
        recomputed_tokens=0,
        prompt_pages=0,
        hit_pages=0,
        peak_running=0,
        queue_wait_mean_s=0.0,
        queue_wait_p50_s=0.0,
        queue_wait_p99_s=0.0,
        queue_wait_max_s=0.0,
        simulated_s=0.0,
    )


def _by_priority(trace: Trace, got: list[int], looked_up: npt.NDArray[np.bool_]) -> dict[str, float]:
    """Hit rate (tokens) per retention priority, when the workload has priorities."""
    if trace.priorities is None:
        return {}
    hits = np.asarray(got, dtype=np.int64)
    out = {}
    for p in np.unique(trace.priorities[looked_up]).tolist():
        mask = looked_up & (trace.priorities == p)
        out[str(p)] = float(hits[mask].sum() / max(int(trace.input_lens[mask].sum()), 1))
    return out


class _Sequential:
    """State of one sequential replay, fed one request at a time (``request``), so that several instances
    can take turns over one trace in its order, each with its own manager, sharing one remote ``store``
    (``num_requests``: how many requests this instance gets; None: all of the trace)."""

    def __init__(
        self,
        trace: Trace,
        cfg: ReplayConfig,
        src: TokenSource,
        observer: Observer | None,
        *,
        num_requests: int | None = None,
        store: SharedStore | None = None,
        instance: int = 0,
    ) -> None:
        self.start = time.perf_counter()
        self.trace, self.cfg = trace, cfg
        self.ps = ps = cfg.page_size
        m = self.m = _manager(cfg)
        self.tier_names = [name for name, _, _ in cfg.lower_tiers]
        if "remote" in self.tier_names and store is None:
            store = MemoryStore()  # one instance alone: the remote tier holds only its own stores
        self.moves = _Transfers(m, cfg, store, instance)
        self.lookup = _Lookup(m, store, cfg.remote_lookup_keys) if store is not None else None
        # Hit tokens from each lower tier (capped: all saved).
        self.tier_hits = dict.fromkeys(self.tier_names, 0)
        n = trace.num_requests
        self.num_requests = n if num_requests is None else num_requests  # requests this instance gets
        self.lens: list[int] = trace.input_lens.tolist()
        self.prios: list[int] = trace.priorities.tolist() if trace.priorities is not None else [0] * n
        self.served = np.zeros(n, dtype=bool)  # [num_requests of the trace] admitted here
        self.full_hit = np.zeros(n, dtype=bool)  # page-aligned prompt entirely cached: one more page in use
        self.got = [0] * n  # uncapped hit tokens per request
        self.every = 1 if observer is not None else max(1, self.num_requests // _TIMELINE_POINTS)
        self.usage = _Usage(m, 0.0, float(n), observer, "requests")
        self.add, self.free, self.peek = m.add_sequence, m.free_sequence, m.peek_prefix_len
        self.build = src.prompt
        self.cache_tokens = cfg.capacity_pages * ps
        self.hits = self.saved = self.queried = 0
        self.seen = 0  # requests given to this instance so far

    def request(self, i: int, progress: Progress | None) -> None:
        """Admit request ``i`` (its longest cached prefix; its prompt's full pages cached), then free it."""
        self.seen += 1
        length = self.lens[i]
        if length > self.cache_tokens:  # longer than the whole cache: add_sequence would refuse it
            return
        ps, m, moves = self.ps, self.m, self.moves
        tokens = self.build(i)
        if self.lookup is not None:
            self.lookup(tokens)
        whole = self.peek(tokens) if length % ps == 0 else -1
        hit = self.add(i, tokens, None, self.prios[i])
        if hit is None:
            return
        if self.tier_names:
            failed = moves.num_load_failures
            moves.settle()
            if hit:
                split = m.hit_tokens(i)
                if moves.num_load_failures != failed:  # a page the store lost: the hit was cut there
                    hit = sum(split.values())
                for name in self.tier_names:
                    self.tier_hits[name] += split[name]
        self.served[i] = True
        self.saved += hit
        self.queried += length
        # HBM holds the whole page-aligned prompt: count it uncapped. Short of that, peek (HBM only) is
        # the capped hit itself without tiers, and with them the hit's lower-tier part is missing from it.
        if whole == length:
            self.full_hit[i] = True
            hit = whole
        self.hits += hit
        self.got[i] = hit
        if (self.seen - 1) % self.every == 0:
            self.usage.sample(float(i), self.hits / max(self.queried, 1))
            if progress is not None:
                progress.update(i)
        self.free(i)
        if self.tier_names:
            moves.settle()

    def result(self) -> PolicyResult:
        trace, cfg, ps, m = self.trace, self.cfg, self.ps, self.m
        served, n = self.served, self.num_requests
        stats = m.stats()
        pages = -(-trace.input_lens // ps)
        # The live request's pages, plus the cached copy of a recomputed last page.
        in_use = pages + self.full_hit
        extremes = self.usage.extremes()
        # Exact, not sampled: the one live request holds all in-use pages.
        peak = replace(extremes, in_use=float(in_use[served].max()) if served.any() else 0.0)
        num_served = int(served.sum())
        out = _counters(n)
        out.update(
            num_served=num_served,
            num_refused=n - num_served,
            num_refused_too_large=n - num_served,
            num_admission_failures=n - num_served,
            prompt_tokens=int(trace.input_lens[served].sum()),
            hit_tokens=self.hits,
            prefill_tokens_saved=self.saved,
            prompt_pages=int(pages[served].sum()),
            hit_pages=self.hits // ps,
            peak_running=1 if num_served else 0,
        )
        return PolicyResult(
            priority_hit_rates=_by_priority(trace, self.got, served),
            policy=cfg.policy,
            mode=cfg.mode,
            capacity_pages=cfg.capacity_pages,
            page_size=ps,
            num_evicted_pages=stats.num_evicted_pages,
            peak=peak,
            mean=self.usage.sample_mean(),
            elapsed_s=time.perf_counter() - self.start,
            timeline=self.usage.timeline,
            **_tier_fields(m, cfg, self.tier_hits, self.moves.load_s),
            **out,  # type: ignore[arg-type]
        )


def _sequential(
    trace: Trace, cfg: ReplayConfig, src: TokenSource, progress: Progress | None, observer: Observer | None
) -> PolicyResult:
    sim = _Sequential(trace, cfg, src, observer)
    step = sim.request
    for i in range(trace.num_requests):
        step(i, progress)
    return sim.result()


def _prefill_chunk_tokens(cfg: ReplayConfig) -> int:
    """Prompt tokens one request computes per step in a timed replay: what it prefills in a decode
    step's time, ``prefill_rate / decode_rate`` (at least 1, at most the cache's tokens)."""
    cache_tokens = cfg.capacity_pages * cfg.page_size
    ratio = cfg.prefill_rate / cfg.decode_rate  # may overflow to infinity: the cache bounds it
    return cache_tokens if ratio >= cache_tokens else max(1, math.floor(ratio))


def _finite(t: float) -> float:
    """``t``, a simulated time; a ConfigError when it overflowed (finite inputs can: a rate of 1e-320
    tokens/s), since nothing after it could be simulated or reported."""
    if not math.isfinite(t):
        raise ConfigError(
            "timed replay: the simulated time overflows a double (rates too small or timestamps too large)"
        )
    return t


@dataclass(frozen=True)
class _Engine:
    """The engine a timed replay simulates around its :class:`~kvcore.scheduler.Scheduler`.

    ``shared_prefill`` False (``kvcore replay``): each request prefills at ``prefill_rate`` and decodes at
    ``decode_rate`` as if it ran alone, so a step lasts as long as its slowest row (a decode token
    ``1 / decode_rate``, a chunk of ``n`` prompt tokens ``n / prefill_rate``), and a request's chunk is
    ``prefill_rate / decode_rate`` tokens at most (the scheduler's ``long_prefill_token_threshold``), so
    that no chunk holds the decodes back. True (``kvcore replay --pressure``): the rates are the whole
    engine's: a step lasts its prefill tokens over ``prefill_rate``, plus ``1 / decode_rate`` when it
    decodes. None for the budget or the cap: never binding (the cache's tokens, its pages).
    """

    shared_prefill: bool = False
    max_num_batched_tokens: int | None = None  # tokens per step; None: the cache's tokens
    max_num_seqs: int | None = None  # running requests; None: the cache's pages
    max_queued_requests: int | None = None  # waiting requests past which submit refuses; None: no limit
    controller: PressureController | None = None  # None: the scheduler alone


class _Timed:
    """State of one timed replay: the requests through a :class:`~kvcore.scheduler.Scheduler` over a
    fresh manager, stepped as an engine would, in simulated time (a class so the hot paths read
    attributes, not closures' cells).

    ``requests``: the indices of the requests this instance gets ([k] int64; None: all). Several
    instances over one trace, each its own manager and scheduler, share a remote ``store`` and take
    turns in global time order (``next_time`` / ``advance``); one alone runs to the end with ``run``.
    ``arrival_s``: each request's arrival, seconds ([num_requests]; None: the trace's timestamps).
    """

    def __init__(
        self,
        trace: Trace,
        cfg: ReplayConfig,
        src: TokenSource,
        observer: Observer | None,
        *,
        requests: npt.NDArray[np.int64] | None = None,
        store: SharedStore | None = None,
        instance: int = 0,
        engine: _Engine | None = None,
        arrival_s: list[float] | None = None,
    ) -> None:
        if trace.timestamps_ms is None:
            raise ConfigError("timed mode needs a trace with timestamps")
        self.start = time.perf_counter()
        self.cfg = cfg
        self.src = src
        self.ps = ps = cfg.page_size
        m = self.m = _manager(cfg)
        self.tiered = bool(cfg.lower_tiers)
        self.tier_names = [name for name, _, _ in cfg.lower_tiers]
        if "remote" in self.tier_names and store is None:
            store = MemoryStore()  # one instance alone: the remote tier holds only its own stores
        self.moves = _Transfers(m, cfg, store, instance)
        self.lookup = _Lookup(m, store, cfg.remote_lookup_keys) if store is not None else None
        self.tier_hits = dict.fromkeys(self.tier_names, 0)  # hit tokens from each tier at first admission
        # Seconds to load one page from each tier, by name (a request's loads: its hit pages per tier).
        self.tier_page_s = dict(zip(self.tier_names, self.moves.page_s.tolist(), strict=True))
        n = trace.num_requests
        self.arrival: list[float] = (
            (trace.timestamps_ms / 1000.0).tolist() if arrival_s is None else list(arrival_s)
        )
        if requests is None:
            self.order: list[int] = np.argsort(self.arrival, kind="stable").tolist()
        else:
            arr = np.asarray(self.arrival)
            self.order = requests[np.argsort(arr[requests], kind="stable")].tolist()
        self.n = len(self.order)  # requests this instance gets
        self.ai = 0  # arrivals submitted (an index into order)
        self.t = self.arrival[self.order[0]] if self.order else 0.0  # when the engine is next free
        self.in_lens: list[int] = trace.input_lens.tolist()
        self.in_lens_np = trace.input_lens.astype(np.int64)  # [num_requests]
        self.out_lens: list[int] = trace.output_lens.tolist()
        self.prios: list[int] = trace.priorities.tolist() if trace.priorities is not None else [0] * n
        self.cache_tokens = cache_tokens = cfg.capacity_pages * ps  # no sequence can ever hold more
        eng = self.engine = engine if engine is not None else _Engine()
        self.prefill_s = 1.0 / cfg.prefill_rate  # seconds per prompt token
        self.decode_s = 1.0 / cfg.decode_rate  # seconds per decode step
        chunk = None if eng.shared_prefill else _prefill_chunk_tokens(cfg)
        self.sched = Scheduler(
            m,
            max_num_batched_tokens=eng.max_num_batched_tokens or cache_tokens,
            max_num_seqs=eng.max_num_seqs or cfg.capacity_pages,
            max_queue_wait_s=cfg.max_queue_wait_s,
            max_queued_requests=eng.max_queued_requests,
            controller=eng.controller,
            long_prefill_token_threshold=chunk,
            prefix_lookup=self.lookup,
        )
        self.busy = False  # the last step computed something and work is left: the next starts at t
        self.loads: list[tuple[float, int, list[int]]] = []  # heap: (done at, tie-break, load op ids)
        self.tie = count()
        self.served = np.zeros(n, dtype=bool)  # [num_requests] ended by length (or stop)
        self.refused: dict[str, int] = {}  # refusals by the scheduler's reason (capacity is too_large)
        self.admitted_at = np.full(n, math.nan)  # [num_requests] first admission, s (NaN: never admitted)
        self.first_token = np.full(n, math.nan)  # [num_requests] first token sampled, s (NaN: none)
        self.waits: list[float] = []  # arrival to first admission, per admitted request
        self.got = [0] * n  # uncapped hit tokens at first admission, per request
        self.saved = [0] * n  # prefill tokens saved at first admission, per request
        self.tier_got: dict[int, dict[str, int]] = {}  # hit tokens per tier at first admission (tiered)
        self.looked_up = np.zeros(n, dtype=bool)  # admitted at least once
        self.running = 0  # admitted and not yet preempted or ended (loading ones included)
        self.num_steps = 0  # scheduler steps, empty ones included
        self.max_level = 0  # highest pressure level a plan applied
        self.c = _counters(self.n)
        t0 = self.t
        span = (max(self.arrival[i] for i in self.order) - t0) if self.order else 0.0
        self.usage = _Usage(m, t0, span, observer, "simulated seconds")
        self.done = 0  # requests ended, served or refused

    def hit_rate(self) -> float:
        c = self.c
        return c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0

    def end(self, rid: int, reason: str) -> None:
        """Request ``rid`` left the scheduler: served (``length`` or ``stop``) or refused (the
        scheduler's reason; ``capacity``, an answer that outgrew the cache, counts as ``too_large``)."""
        self.done += 1
        if reason in ("length", "stop"):
            self.served[rid] = True
            self.tier_got.pop(rid, None)
            return
        key = "too_large" if reason == "capacity" else reason
        self.refused[key] = self.refused.get(key, 0) + 1
        if rid >= 0 and self.looked_up[rid]:
            self.unobserve(rid)

    def unobserve(self, rid: int) -> None:
        """A request admitted, then refused (its answer outgrew the cache): out of the served
        requests' figures its first admission entered (it counted as served in the hit rate)."""
        c, ps, length, got = self.c, self.ps, self.in_lens[rid], self.got[rid]
        c["prompt_tokens"] -= length
        c["hit_tokens"] -= got
        c["hit_pages"] -= got // ps
        c["prompt_pages"] -= -(-length // ps)
        c["prefill_tokens_saved"] -= self.saved[rid]
        for name, tokens in self.tier_got.pop(rid, {}).items():
            self.tier_hits[name] -= tokens
        self.got[rid] = self.saved[rid] = 0
        self.looked_up[rid] = False

    def submit(self, t: float) -> None:
        """Submit the arrivals due by ``t``. A prompt that cannot fit the cache with its first token
        is refused as ``submit`` would refuse it, without its tokens being built (memory follows the
        capacity, not the numbers in the trace)."""
        order, arrival, sched, src = self.order, self.arrival, self.sched, self.src
        while self.ai < self.n and arrival[order[self.ai]] <= t:
            i = order[self.ai]
            self.ai += 1
            if self.in_lens[i] >= self.cache_tokens:
                self.end(i, "too_large")
                continue
            request = Request(
                i, src.prompt(i), max_new_tokens=max(1, self.out_lens[i]), priority=self.prios[i]
            )
            try:
                sched.submit(request, arrival[i])  # it waits from its arrival, during the last step
            except RequestRejected as e:
                self.end(i, e.reason)

    def observe(self, plan: StepPlan) -> list[int]:
        """Read the plan's events: first admissions (their wait and hits), the running count; the
        requests that wait for loads since this plan."""
        c, ps, m = self.c, self.ps, self.m
        loading: list[int] = []
        for ev in plan.events:
            kind = ev.kind
            if kind == "admitted":
                self.running += 1
                if self.running > c["peak_running"]:
                    c["peak_running"] = self.running
                if ev.detail["resumed"]:
                    continue
                rid = ev.request_id
                assert rid is not None
                length = self.in_lens[rid]
                hit = ev.detail["hit_tokens"]
                if self.tiered:
                    split = m.hit_tokens(rid)  # after the failed loads: a cut hit counts cut
                    hit = sum(split.values())
                    for name in self.tier_names:
                        self.tier_hits[name] += split[name]
                    self.tier_got[rid] = {name: split[name] for name in self.tier_names}
                # A whole page-aligned prompt in HBM counts uncapped (hit_tokens is at most len - 1).
                prefix = ev.detail["hbm_prefix_tokens"]
                got = prefix if prefix == length else hit
                self.got[rid] = got
                self.saved[rid] = hit
                self.looked_up[rid] = True
                self.admitted_at[rid] = ev.time_s
                self.waits.append(ev.time_s - self.arrival[rid])
                c["prompt_tokens"] += length
                c["hit_tokens"] += got
                c["hit_pages"] += got // ps
                c["prompt_pages"] += -(-length // ps)
                c["prefill_tokens_saved"] += hit
            elif kind in ("preempted", "finished"):
                self.running -= 1
            elif kind == "loading" and ev.request_id is not None:
                loading.append(ev.request_id)
        return loading

    def defer_loads(self, t: float, ops: list[int], loading: list[int]) -> None:
        """The loads ``ops`` of the requests admitted at ``t`` complete when the longest of them is
        done (a request's pages one after the other, the tiers one after the other; requests do not
        contend, as prefills do not)."""
        page_s, ps = self.tier_page_s, self.ps
        longest = 0.0
        for rid in loading:
            split = self.m.hit_tokens(rid)
            longest = max(longest, sum(split[name] // ps * s for name, s in page_s.items()))
        heapq.heappush(self.loads, (_finite(t + longest), next(self.tie), ops))

    def step_s(self, plan: StepPlan) -> float:
        """Simulated seconds of a non-empty plan's forward pass (see :class:`_Engine`)."""
        pre = plan.num_tokens[plan.is_prefill]  # [prefill rows] int32
        decode = self.decode_s if len(pre) < plan.batch_size else 0.0
        if not len(pre):
            return decode
        if self.engine.shared_prefill:
            return int(pre.sum()) * self.prefill_s + decode
        return max(decode, int(pre.max()) * self.prefill_s)

    def next_time(self) -> float:
        """Simulated time of the next event (infinite: none is left): the next step when the engine is
        busy, else the next arrival or load completion (and, while requests wait with nothing
        computable and nothing loading, a decode step's time on)."""
        if self.busy:
            return self.t
        nxt = self.arrival[self.order[self.ai]] if self.ai < self.n else math.inf
        if self.loads:
            return min(nxt, self.loads[0][0])
        if self.sched.has_work():
            return min(nxt, self.t + self.decode_s)
        return nxt

    def advance(self) -> bool:
        """Process the next event: complete the loads due, submit the arrivals due, then one scheduler
        step and its forward pass; False when none is left."""
        t = self.next_time()
        if t == math.inf:
            return False
        self.t = t
        loads = self.loads
        while loads and loads[0][0] <= t:
            self.m.complete_transfers(heapq.heappop(loads)[2], True)
        self.submit(t)
        sched = self.sched
        if not sched.has_work():
            self.busy = False
            return True
        plan = sched.step(t)
        self.num_steps += 1
        if plan.level > self.max_level:
            self.max_level = plan.level
        # Stores, and loads that fail, complete now (a failed load cuts the hit the events count).
        ops = self.moves.start() if self.tiered else []
        loading = self.observe(plan)
        if ops:
            self.defer_loads(t, ops, loading)
        for rej in plan.rejected:
            self.end(rej.request_id if rej.request_id is not None else -1, rej.reason)
        for rid, reason in plan.finished:
            self.end(rid, reason)
        usage = self.usage
        usage.sample(t, self.hit_rate())
        if not plan:  # nothing computable: requests loading (ready now if all their loads failed)
            self.busy = any(self.m.is_ready(rid) for rid in plan.loading)
            return True
        t_end = _finite(t + self.step_s(plan))
        ids = plan.request_ids[plan.sample]
        ends = (plan.starts + plan.num_tokens)[plan.sample]
        tokens = self.src.answer_at(ids, ends - self.in_lens_np[ids])  # each row's next answer token
        first = self.first_token[ids]
        self.first_token[ids[np.isnan(first)]] = t_end
        for rid, reason in sched.update(plan, tokens):
            self.end(rid, reason)
        if self.tiered:
            self.moves.start()  # the stores of the pages this step filled (update queues no load)
        self.t = t_end
        self.busy = sched.has_work()
        usage.sample(t_end, self.hit_rate())
        return True

    def finish(self) -> float:
        """Check that every request ended; returns the simulated end time."""
        if self.sched.has_work() or self.ai < self.n or self.loads:
            raise AssertionError("timed replay ended with requests still queued or running")
        if self.done != self.n:
            raise AssertionError("timed replay lost requests")
        return self.t

    def run(self, progress: Progress | None) -> float:
        """Process every event; returns the simulated end time."""
        advance = self.advance
        events = 0
        while advance():
            events += 1
            if progress is not None and events & 63 == 0:
                progress.update(self.done)
        return self.finish()

    def result(self, trace: Trace) -> PolicyResult:
        """The figures of a finished replay (after ``run``, or ``advance`` until it is False)."""
        t_end = self.finish()
        usage = self.usage
        usage.close(t_end)
        t0 = self.arrival[self.order[0]] if self.n else 0.0
        span = t_end - t0
        c = self.c
        if self.waits:
            waits = np.asarray(self.waits)
            c.update(
                queue_wait_mean_s=float(waits.mean()),
                queue_wait_p50_s=float(np.percentile(waits, 50)),
                queue_wait_p99_s=float(np.percentile(waits, 99)),
                queue_wait_max_s=float(waits.max()),
            )
        s = self.sched.stats()
        refused = dict(self.refused)
        too_large, timeout = refused.pop("too_large", 0), refused.pop("timeout", 0)
        if refused:  # a controller or a queue limit: the pressure replay's, not this report's
            raise AssertionError(f"timed replay refused for reasons it does not report: {refused}")
        c.update(
            num_served=int(self.served[self.order].sum()),
            num_refused=too_large + timeout,
            num_refused_too_large=too_large,
            num_refused_timeout=timeout,
            num_admission_failures=s.num_failed_admissions,
            num_preemptions=s.num_preemptions,
            num_append_failures=s.num_failed_reservations - s.num_failed_admissions,
            recomputed_tokens=s.recomputed_tokens,
            simulated_s=span,
        )
        if c["num_served"] + c["num_refused"] != self.n:
            raise AssertionError("timed replay lost requests")
        cfg = self.cfg
        return PolicyResult(
            priority_hit_rates=_by_priority(trace, self.got, self.looked_up),
            policy=cfg.policy,
            mode=cfg.mode,
            capacity_pages=cfg.capacity_pages,
            page_size=cfg.page_size,
            num_evicted_pages=self.m.stats().num_evicted_pages,
            peak=usage.extremes(),
            mean=usage.time_mean(span),
            elapsed_s=time.perf_counter() - self.start,
            timeline=usage.timeline,
            **_tier_fields(self.m, cfg, self.tier_hits, self.moves.load_s),
            **c,  # type: ignore[arg-type]
        )


def _timed(
    trace: Trace, cfg: ReplayConfig, src: TokenSource, progress: Progress | None, observer: Observer | None
) -> PolicyResult:
    sim = _Timed(trace, cfg, src, observer)
    sim.run(progress)
    return sim.result(trace)


def replay(
    trace: Trace,
    config: ReplayConfig,
    *,
    tokens: TokenSource | None = None,
    progress: Progress | None = None,
    observer: Observer | None = None,
) -> PolicyResult:
    """Replay ``trace`` through a fresh :class:`~kvcore.KVCacheManager` (see the module docs).

    ``tokens`` reuses the token source of an earlier replay of the same trace (it costs a little to
    build). ``observer(t, stats)`` is called after every step's plan and its update (timed) or after
    every admission (sequential), for invariant checks; it slows the replay down.

    Raises:
        ConfigError: timed mode on a trace without timestamps (ConfigError is a ValueError).
    """
    timed = config.mode != "sequential"
    src = tokens if tokens is not None else TokenSource(trace, answers=timed)
    if timed and not src.has_answers:
        raise ConfigError("tokens: a timed replay generates answers; this TokenSource has none")
    if config.mode == "sequential":
        result = _sequential(trace, config, src, progress, observer)
    else:
        result = _timed(trace, config, src, progress, observer)
    if progress is not None:
        progress.close(trace.num_requests)
    _check_finite(result.to_dict(), config)
    return result


def _check_finite(figures: dict[str, object], config: ReplayConfig, prefix: str = "") -> None:
    """Refuse a result that JSON cannot hold: finite inputs can still overflow a double in timed mode
    (a rate of 1e-320 tokens/s, arrivals 1e308 ms apart)."""
    for name, value in figures.items():
        if isinstance(value, dict):
            _check_finite(value, config, f"{prefix}{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"{config.mode} replay: {prefix}{name} is {value}: the simulated time overflows a double "
                "(rates too small or timestamps too large)"
            )


def default_sweep_pages(trace: Trace, capacity_pages: int, page_size: int, num_points: int = 8) -> list[int]:
    """Capacities for a hit-rate curve: ``num_points`` halvings down from the workload's footprint (the
    pages of every distinct block: beyond it the curve is flat), plus ``capacity_pages`` itself."""
    per_block = trace.block_size / page_size
    footprint = max(1, int(np.ceil(trace.num_unique_blocks * per_block)))
    points = {max(1, footprint >> k) for k in range(num_points)}
    points.add(capacity_pages)
    return sorted(points)


def run_replay(
    trace: Trace,
    config: ReplayConfig,
    *,
    policies: Sequence[str] = ("lru",),
    capacity: Capacity | None = None,
    sweep_pages: Sequence[int] = (),
    progress: bool | None = None,
) -> ReplayReport:
    """Replay ``trace`` once per policy at ``config.capacity_pages``, then (if ``sweep_pages``) once
    per policy and capacity; the report holds every result. ``capacity`` only describes the capacity
    for the report (default: "given"). ``progress``: draw bars on stderr (None: if it is a terminal).
    """
    if capacity is None:
        capacity = Capacity(
            config.capacity_pages, config.page_size, f"{config.capacity_pages:,} pages (given)"
        )
    if capacity.pages != config.capacity_pages or capacity.page_size != config.page_size:
        raise ConfigError("capacity does not describe config")
    src = TokenSource(trace, answers=config.mode != "sequential")  # sequential replays generate nothing

    def bar(label: str) -> Progress:
        return Progress(trace.num_requests, label, enabled=progress)

    results = [
        replay(trace, replace(config, policy=p), tokens=src, progress=bar(f"{p:>8}")) for p in policies
    ]
    sweep: list[PolicyResult] = []
    by_key = {(r.capacity_pages, r.policy): r for r in results}
    for pages in sweep_pages:
        for p in policies:
            if (pages, p) in by_key:
                sweep.append(by_key[(pages, p)])
                continue
            label = f"{p:>8} @ {pages:,} pages"
            sweep.append(
                replay(
                    trace, replace(config, policy=p, capacity_pages=pages), tokens=src, progress=bar(label)
                )
            )
    settings: dict[str, object] = {
        "prefill_rate": config.prefill_rate,
        "decode_rate": config.decode_rate,
        "prefill_chunk_tokens": _prefill_chunk_tokens(config),
        "max_queue_wait_s": config.max_queue_wait_s,
    }
    if config.lower_tiers:  # only then: the HBM-only report stays as it was
        settings.update(
            lower_tiers=[
                {"name": name, "num_slots": slots, "bandwidth_gbps": bw}
                for name, slots, bw in config.lower_tiers
            ],
            store_policy=config.store_policy,
            page_bytes=config.page_nbytes,
        )
    return ReplayReport(
        workload=WorkloadSummary.of(trace),
        capacity=capacity,
        mode=config.mode,
        settings=settings,
        results=results,
        sweep=sweep,
    )
