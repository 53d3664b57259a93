"""What a replay measured, as dataclasses, JSON and a readable text report.

Why a separate module: the engine only counts; how counts become rates, tables and JSON is kept in one
place so the CLI, the tests and the benchmark all read the same definitions:

- ``hit_rate_tokens``: prompt tokens found cached at lookup / prompt tokens looked up, counted in whole
  pages and *not* capped (a fully cached prompt counts fully). This is the cache's hit rate, the way
  Mooncake counts hit blocks, so the figures compare with the paper. A refused request looks nothing
  up: with refusals, the text report adds the hits over *all* prompt tokens, the figure the workload's
  best case (an infinite cache) bounds.
- ``prefill_tokens_saved``: what the engine does not compute. ``add_sequence`` caps a hit at
  ``prompt_len - 1`` tokens (the last token must run to give logits), so this is at most the hits; the
  difference only arises for a fully cached, page-aligned prompt.
- ``hit_rate_pages``: pages found cached / ``ceil(prompt_len / page_size)`` pages per prompt (a partial
  last page never hits: the manager caches whole pages only).

With lower tiers (host DRAM, disk, a shared remote tier) a hit is found in HBM or loaded from a tier:
``hit_tokens`` is their sum, :class:`TierResult` holds each tier's part (a lower-tier hit is always
capped, so it is all prefill saved) and the bytes the tier would move. Without tiers none of this
appears in the result.

Several instances sharing a remote tier (:mod:`kvcore.replay.instances`) give an
:class:`InstancesReport`: per instance, its :class:`PolicyResult` with and without the remote tier
(:class:`InstanceResult`); in total, the sums over the instances (rates are of the sums), and what the
shared tier saves: its hit tokens, and the prefill tokens and hit rate the run with it gains over the
run without.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcore.replay.capacity import Capacity

__all__ = [
    "InstanceResult",
    "InstancesReport",
    "PolicyResult",
    "ReplayReport",
    "TierResult",
    "Timeline",
    "UsageSplit",
    "WorkloadSummary",
    "format_instances",
    "format_report",
]


@dataclass(frozen=True)
class UsageSplit:
    """Pages per class (the manager's honest split); fractional when averaged. As a peak, each class is
    its own extreme (``free`` its minimum), so the four need not sum to the total. Always floats (a peak
    too), so report.json writes every usage figure one way."""

    in_use: float  # held by live sequences or locked by them
    cached: float  # cached and evictable
    pinned: float  # cached and protected by a TTL pin
    free: float  # in the allocator's free pool

    def __post_init__(self) -> None:
        for name in ("in_use", "cached", "pinned", "free"):
            object.__setattr__(self, name, float(getattr(self, name)))


@dataclass
class Timeline:
    """Usage over the replay, for the plot (not in the JSON): parallel lists, one entry per sample."""

    x: list[float] = field(default_factory=list)  # simulated seconds (timed) or requests done (sequential)
    in_use: list[int] = field(default_factory=list)  # pages in use at that sample
    cached: list[int] = field(default_factory=list)  # pages cached (evictable)
    pinned: list[int] = field(default_factory=list)  # pages pinned
    free: list[int] = field(default_factory=list)  # pages free
    hit_rate: list[float] = field(default_factory=list)  # cumulative hit_rate_tokens so far, in [0, 1]
    x_label: str = "requests"  # what x counts


@dataclass(frozen=True)
class TierResult:
    """One lower tier's part in a replay. The replay reports every transfer OK, so its stored and loaded
    pages are the bytes it would move, ``page_bytes`` each (counted by the manager, ``tier_stats``); a
    store the manager itself fails is counted apart and moves no page."""

    name: str  # "host", "disk" or "remote"
    num_slots: int  # pages it holds (remote: pages this instance's index may know), >= 1
    bandwidth_gbps: float  # GB/s (10^9 B/s) of a load or store, > 0
    page_bytes: int  # K/V bytes of one page over all layers, >= 1
    hit_tokens: int  # prompt tokens of served requests loaded from it at first admission (all prefill saved)
    num_stored_pages: int  # pages stored into it
    num_loaded_pages: int  # pages loaded from it into HBM (timed: preempted requests' reloads too)
    num_store_skipped_no_room: int  # pages not stored: no slot could be freed for them
    num_store_skipped_in_flight: int  # pages not stored: a store of one of them was in flight
    num_store_failed_pages: int  # pages of stores reported OK that the manager could not insert
    num_load_failed_pages: int  # pages of loads that failed (0: the replay reports every load OK)
    num_evicted_slots: int  # slots emptied to make room for newer pages
    num_slots_cached: int  # slots holding a page at the end, <= num_slots
    load_s: float  # seconds its loads take at bandwidth_gbps (timed: simulated time requests wait on them)

    @property
    def stored_bytes(self) -> int:
        return self.num_stored_pages * self.page_bytes

    @property
    def loaded_bytes(self) -> int:
        return self.num_loaded_pages * self.page_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stored_bytes": self.stored_bytes, "loaded_bytes": self.loaded_bytes}


# PolicyResult fields that exist only with lower tiers: left out of to_dict without them.
_TIER_FIELDS = ("store_policy", "page_bytes", "tiers")


@dataclass
class PolicyResult:
    """One replay: one workload, one policy, one capacity. Counts are exact unless marked sampled."""

    policy: str  # eviction policy: "lru", "lfu" or "priority"
    mode: str  # "sequential" or "timed"
    capacity_pages: int  # usable pages of the cache, >= 1
    page_size: int  # tokens per page
    num_requests: int  # requests in the workload; == num_served + num_refused
    num_served: int  # requests admitted and (timed mode) run to their last token
    num_refused: int  # requests never served: num_refused_too_large + num_refused_timeout
    num_refused_too_large: int  # could not fit even in an otherwise empty cache (prompt, or prompt + output)
    num_refused_timeout: int  # timed: waited longer than max_queue_wait_s for admission
    num_admission_failures: int  # add_sequence calls answered None (a queued request may fail several times)
    num_preemptions: int  # timed: running requests freed and requeued to make room (the scheduler's count)
    num_append_failures: (
        int  # timed: decode appends and chunk reservations answered False (then a preemption)
    )
    prompt_tokens: int  # prompt tokens of the served requests, at their first admission
    hit_tokens: int  # of those, found cached (whole pages, uncapped; see the module docs)
    prefill_tokens_saved: int  # of those, not computed (hits capped at prompt_len - 1)
    recomputed_tokens: int  # timed: tokens computed before a preemption and again when the request came back
    prompt_pages: int  # sum of ceil(prompt_len / page_size) over the served requests
    hit_pages: int  # of those, found cached
    num_evicted_pages: int  # pages evicted from the prefix cache during the replay
    peak: UsageSplit  # largest in_use, cached, pinned and *smallest* free, each on its own (the tightest)
    mean: UsageSplit  # timed: time-weighted mean; sequential: mean over sampled admissions (or the idle pool)
    peak_running: int  # most sequences live at once (timed: admitted, loading ones too; 1 in sequential mode)
    queue_wait_mean_s: float  # timed: mean wait from arrival to first admission of served requests
    queue_wait_p50_s: float  # timed: median of the same
    queue_wait_p99_s: float  # timed: 99th percentile of the same
    queue_wait_max_s: float  # timed: longest of the same
    simulated_s: (
        float  # timed: simulated time from the first arrival to the end of the last step; 0 sequential
    )
    elapsed_s: float  # wall-clock seconds the replay took
    priority_hit_rates: dict[str, float] = field(
        default_factory=dict
    )  # hit_rate_tokens per priority ("0", "1")
    store_policy: str | None = (
        None  # the lower tiers' store policy ("selective", "all", "value"); None: HBM only
    )
    page_bytes: int | None = None  # K/V bytes of one page, for the tiers' bytes moved; None: HBM only
    tiers: list[TierResult] = field(
        default_factory=list
    )  # one per lower tier, fastest first; empty: HBM only
    timeline: Timeline = field(default_factory=Timeline, repr=False)  # samples for the plot

    @property
    def hit_rate_tokens(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def hit_rate_pages(self) -> float:
        return self.hit_pages / self.prompt_pages if self.prompt_pages else 0.0

    @property
    def prefill_saved_fraction(self) -> float:
        return self.prefill_tokens_saved / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def tier_hit_tokens(self) -> int:
        """Hit tokens loaded from the lower tiers: the prefill tokens they saved (0 without tiers)."""
        return sum(t.hit_tokens for t in self.tiers)

    @property
    def hit_tokens_by_tier(self) -> dict[str, int]:
        """``{"hbm": n, tier name: n, ...}``: where the hit tokens were found; they sum to hit_tokens."""
        return {"hbm": self.hit_tokens - self.tier_hit_tokens, **{t.name: t.hit_tokens for t in self.tiers}}

    @property
    def stored_bytes(self) -> int:
        """Bytes stored into every lower tier."""
        return sum(t.stored_bytes for t in self.tiers)

    @property
    def loaded_bytes(self) -> int:
        """Bytes loaded from every lower tier."""
        return sum(t.loaded_bytes for t in self.tiers)

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: the rates first, then every counter (the timeline is left out). With lower
        tiers, also the hits by tier, the prefill tokens the tiers saved, the bytes moved and ``tiers``
        (name -> its :class:`TierResult` with ``stored_bytes`` and ``loaded_bytes``)."""
        out: dict[str, Any] = {
            "hit_rate_tokens": self.hit_rate_tokens,
            "hit_rate_pages": self.hit_rate_pages,
            "prefill_saved_fraction": self.prefill_saved_fraction,
        }
        for name, value in asdict(self).items():
            if name != "timeline" and name not in _TIER_FIELDS:
                out[name] = value
        if self.tiers:
            out.update(
                store_policy=self.store_policy,
                page_bytes=self.page_bytes,
                hit_tokens_by_tier=self.hit_tokens_by_tier,
                tier_prefill_tokens_saved=self.tier_hit_tokens,
                stored_bytes=self.stored_bytes,
                loaded_bytes=self.loaded_bytes,
                tiers={t.name: t.to_dict() for t in self.tiers},
            )
        return out


@dataclass(frozen=True)
class WorkloadSummary:
    """The replayed workload at a glance."""

    name: str  # file name, or "generated (seed N)"
    num_requests: int  # requests
    prompt_tokens: int  # sum of prompt lengths
    output_tokens: int  # sum of output lengths
    block_size: int  # tokens per hash id
    unique_blocks: int  # distinct hash ids
    ideal_block_hit_rate: float  # 1 - unique / total blocks: an infinite cache's block hit rate
    ideal_token_hit_rate: float  # the same in tokens (partial last blocks weigh their tokens)
    duration_s: float  # first to last arrival (0 when untimed)

    @classmethod
    def of(cls, trace: Any) -> WorkloadSummary:
        return cls(
            name=trace.name,
            num_requests=trace.num_requests,
            prompt_tokens=int(trace.input_lens.sum()),
            output_tokens=int(trace.output_lens.sum()),
            block_size=trace.block_size,
            unique_blocks=trace.num_unique_blocks,
            ideal_block_hit_rate=trace.ideal_block_hit_rate,
            ideal_token_hit_rate=trace.ideal_token_hit_rate,
            duration_s=trace.duration_s,
        )


@dataclass
class ReplayReport:
    """Everything one ``kvcore replay`` run produced."""

    workload: WorkloadSummary  # what was replayed
    capacity: Capacity  # the cache size of ``results`` (the sweep varies it)
    mode: str  # "sequential" or "timed"
    settings: dict[str, Any]  # the engine knobs used (rates, chunk, queue wait), for the record
    results: list[PolicyResult]  # one per policy, at ``capacity``
    sweep: list[PolicyResult] = field(default_factory=list)  # one per (capacity, policy), capacity ascending
    plots: list[str] = field(default_factory=list)  # PNG files written

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: ``results`` maps each policy to its flat result."""
        return {
            "workload": asdict(self.workload),
            "capacity": self.capacity.to_dict(),
            "mode": self.mode,
            "settings": self.settings,
            "results": {r.policy: r.to_dict() for r in self.results},
            "sweep": [r.to_dict() for r in self.sweep],
            "plots": self.plots,
        }

    def to_json(self) -> str:
        """The ``--json`` document as text. Strict JSON: a NaN or an infinity raises ValueError rather
        than reach report.json (every input is checked finite where it is read)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)


def _pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def _tokens(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _tier_line(report: ReplayReport) -> str | None:
    """The tiers' header line, or None for an HBM-only replay."""
    tiers = report.settings.get("lower_tiers")
    if not tiers:
        return None
    ps = report.capacity.page_size
    parts = [
        f"{t['name']} {t['num_slots']:,} pages ({_tokens(t['num_slots'] * ps)} tokens,"
        f" {t['bandwidth_gbps']:g} GB/s)"
        for t in tiers
    ]
    return (
        f"  tiers      {', '.join(parts)}; store policy {report.settings['store_policy']},"
        f" {_bytes(report.settings['page_bytes'])} per page"
    )


def _tier_rows(res: list[PolicyResult], row: Any) -> None:
    """The rows of the lower tiers (their hits, what they saved, moved and skipped) in the policy table."""
    names = list(dict.fromkeys(t.name for r in res for t in r.tiers))
    if not names:
        return

    def share(r: PolicyResult, n: int) -> str:
        return f"{_tokens(n)} ({_pct(n / r.prompt_tokens if r.prompt_tokens else 0.0).strip()})"

    for name in ["hbm", *names]:
        row(f"  hits in {name}", [share(r, r.hit_tokens_by_tier.get(name, 0)) for r in res])
    row("prefill saved by tiers", [share(r, r.tier_hit_tokens) for r in res])
    for name in names:
        by = [{t.name: t for t in r.tiers}.get(name) for r in res]
        row(
            f"{name} stored/loaded",
            [f"{_bytes(t.stored_bytes)} / {_bytes(t.loaded_bytes)}" if t else "" for t in by],
        )
        row(
            f"{name} stores dropped",
            [
                f"{t.num_store_skipped_no_room:,} no room, {t.num_store_skipped_in_flight:,} in flight,"
                f" {t.num_store_failed_pages:,} failed"
                if t
                else ""
                for t in by
            ],
        )
        row(f"{name} load time", [f"{t.load_s:,.1f} s" if t else "" for t in by])


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Left-aligned first column, right-aligned others."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(r: list[str]) -> str:
        return "  " + "  ".join(v.ljust(widths[c]) if c == 0 else v.rjust(widths[c]) for c, v in enumerate(r))

    return [line(header), "  " + "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def _peak_mean(peak: float, mean: float, total: int) -> str:
    return f"{_pct(peak / total).strip()} / {_pct(mean / total).strip()}"


def hit_rate_of_all_prompts(r: PolicyResult, workload: WorkloadSummary) -> float:
    """Hit tokens over every prompt token of the workload: refused prompts count as misses. The sweep's
    figure: comparable with the best case, and across capacities (the served requests' rate has a
    denominator that shrinks as smaller capacities refuse more, so it could fall as capacity grew)."""
    return r.hit_tokens / workload.prompt_tokens if workload.prompt_tokens else 0.0


def _sweep_cell(r: PolicyResult | None, workload: WorkloadSummary) -> str:
    if r is None:
        return ""
    cell = _pct(hit_rate_of_all_prompts(r, workload))
    if r.num_refused:
        cell += f" ({r.num_refused:,} refused; {_pct(r.hit_rate_tokens).strip()} of served)"
    return cell


def format_report(report: ReplayReport) -> str:
    """The human-readable report: workload, capacity, one column per policy, the sweep table, the plots."""
    w, cap = report.workload, report.capacity
    lines = [
        f"kvcore replay: {w.name}, {report.mode} mode",
        f"  workload   {w.num_requests:,} requests, {_tokens(w.prompt_tokens)} prompt tokens"
        f" ({_tokens(w.output_tokens)} output), {w.unique_blocks:,} distinct blocks of {w.block_size}"
        + (f", over {w.duration_s:,.0f} s" if w.duration_s else ""),
        f"  best case  {_pct(w.ideal_token_hit_rate).strip()} of prompt tokens"
        f" ({_pct(w.ideal_block_hit_rate).strip()} of blocks) repeat earlier prompts: an infinite cache of"
        " prompts hits (a timed replay also caches answers, which later prompts may hit)",
        f"  capacity   {cap.pages:,} pages x {cap.page_size} tokens = {_tokens(cap.tokens)} tokens"
        + (f" ({cap.bytes / 2**30:,.1f} GiB)" if cap.bytes is not None else "")
        + f"  [{cap.source}]",
    ]
    if report.mode == "timed":
        s = report.settings
        lines.append(
            f"  engine     kvcore.scheduler; per request prefill {s['prefill_rate']:,.0f} tok/s"
            f" ({s['prefill_chunk_tokens']:,} a step), decode {s['decode_rate']:,.0f} tok/s;"
            f" queue wait <= {s['max_queue_wait_s']:g} s"
        )
    tier_line = _tier_line(report)
    if tier_line is not None:
        lines.append(tier_line)
    lines.append("")
    res = report.results
    header = ["", *[r.policy for r in res]]
    rows: list[list[str]] = []

    def row(label: str, values: list[str]) -> None:
        rows.append([label, *values])

    refused = any(r.num_refused for r in res)
    row("hit rate (tokens)" + (", served" if refused else ""), [_pct(r.hit_rate_tokens) for r in res])
    if refused:  # comparable with the best case above: refused prompts count as misses
        total = report.workload.prompt_tokens
        row("  of all prompt tokens", [_pct(r.hit_tokens / total if total else 0.0) for r in res])
    row("hit rate (pages)", [_pct(r.hit_rate_pages) for r in res])
    for prio in sorted({p for r in res for p in r.priority_hit_rates}, key=int):
        row(f"  priority {prio} (tokens)", [_pct(r.priority_hit_rates.get(prio, 0.0)) for r in res])
    row(
        "prefill tokens saved",
        [f"{_tokens(r.prefill_tokens_saved)} ({_pct(r.prefill_saved_fraction).strip()})" for r in res],
    )
    _tier_rows(res, row)
    row("requests served", [f"{r.num_served:,}" for r in res])
    row("refused", [f"{r.num_refused:,}" for r in res])
    if report.mode == "timed":
        row("  waited too long", [f"{r.num_refused_timeout:,}" for r in res])
        row("  too large", [f"{r.num_refused_too_large:,}" for r in res])
        row("admission failures", [f"{r.num_admission_failures:,}" for r in res])
        row("preemptions", [f"{r.num_preemptions:,}" for r in res])
        row("recomputed tokens", [_tokens(r.recomputed_tokens) for r in res])
        row("queue wait mean/p99", [f"{r.queue_wait_mean_s:.2f}/{r.queue_wait_p99_s:.2f} s" for r in res])
        row("peak running", [f"{r.peak_running:,}" for r in res])
    row("evicted pages", [f"{r.num_evicted_pages:,}" for r in res])
    total = max(cap.pages, 1)
    for name in ("in_use", "cached", "pinned", "free"):
        label = "free min/mean" if name == "free" else f"{name.replace('_', ' ')} peak/mean"
        row(label, [_peak_mean(getattr(r.peak, name), getattr(r.mean, name), total) for r in res])
    row("replay time", [f"{r.elapsed_s:.2f} s" for r in res])
    lines += _table(rows, header)
    if report.mode == "sequential":
        lines.append("  (usage split sampled at admissions; in use = the one live request)")
    if report.sweep:
        lines += ["", "hit rate (tokens) vs capacity, of all prompt tokens (a refused prompt misses)"]
        policies = list(dict.fromkeys(r.policy for r in report.sweep))
        caps = sorted({r.capacity_pages for r in report.sweep})
        by_key = {(r.capacity_pages, r.policy): r for r in report.sweep}
        sweep_rows = []
        for c in caps:
            marker = " *" if c == cap.pages else ""
            sweep_rows.append(
                [f"{c:,} pages ({_tokens(c * cap.page_size)} tok){marker}"]
                + [_sweep_cell(by_key.get((c, p)), w) for p in policies]
            )
        lines += _table(sweep_rows, ["capacity", *policies])
        best = _pct(w.ideal_token_hit_rate).strip()
        lines.append(f"  infinite cache, prompts only: {best};  * = the capacity above")
        if report.mode == "timed":
            lines.append("  (timed mode also caches answers, which later turns may hit)")
    if report.plots:
        lines.append("")
        lines += [f"plot written: {p}" for p in report.plots]
    return "\n".join(lines)


@dataclass(frozen=True)
class InstanceResult:
    """One instance of a multi-instance replay: its requests with the shared remote tier and without."""

    instance: int  # its number, in [0, num_instances)
    num_requests: int  # requests the split gave it
    with_remote: PolicyResult  # its replay with the remote tier (``tiers`` ends with "remote")
    without_remote: PolicyResult  # the same requests, the same HBM and other tiers, no remote tier
    num_remote_lookups: int  # prompts it asked the shared store about (its index did not know every page)
    num_remote_marked_pages: int  # pages the store held that its index did not know, indexed (loaded if used)
    num_remote_pages_from_others: int  # remote pages it loaded that another instance stored: sharing alone
    num_remote_load_failures: int  # remote loads the store could not serve (the hit was cut before them)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "num_requests": self.num_requests,
            "num_remote_lookups": self.num_remote_lookups,
            "num_remote_marked_pages": self.num_remote_marked_pages,
            "num_remote_pages_from_others": self.num_remote_pages_from_others,
            "num_remote_load_failures": self.num_remote_load_failures,
            "with_remote": self.with_remote.to_dict(),
            "without_remote": self.without_remote.to_dict(),
        }


def _sum_results(results: list[PolicyResult]) -> dict[str, Any]:
    """The instances' figures summed (rates are of the sums); per tier in HBM, host, disk, remote order."""
    prompt = sum(r.prompt_tokens for r in results)
    hits = sum(r.hit_tokens for r in results)
    saved = sum(r.prefill_tokens_saved for r in results)
    names = ["hbm", *dict.fromkeys(t.name for r in results for t in r.tiers)]
    by_tier = {name: sum(r.hit_tokens_by_tier.get(name, 0) for r in results) for name in names}

    def per_tier(get: Any) -> dict[str, Any]:
        return {name: sum(get(t) for r in results for t in r.tiers if t.name == name) for name in names[1:]}

    return {
        "hit_rate_tokens": hits / prompt if prompt else 0.0,
        "prefill_saved_fraction": saved / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "hit_tokens": hits,
        "prefill_tokens_saved": saved,
        "hit_tokens_by_tier": by_tier,
        "hit_rate_by_tier": {name: n / prompt if prompt else 0.0 for name, n in by_tier.items()},
        "num_requests": sum(r.num_requests for r in results),
        "num_served": sum(r.num_served for r in results),
        "num_refused": sum(r.num_refused for r in results),
        "num_preemptions": sum(r.num_preemptions for r in results),
        "num_evicted_pages": sum(r.num_evicted_pages for r in results),
        "stored_bytes_by_tier": per_tier(lambda t: t.stored_bytes),
        "loaded_bytes_by_tier": per_tier(lambda t: t.loaded_bytes),
        "load_s_by_tier": per_tier(lambda t: t.load_s),
        # The instances run interleaved, each from the start to the end of the run: the longest is the run.
        "elapsed_s": max((r.elapsed_s for r in results), default=0.0),
    }


@dataclass
class InstancesReport:
    """A trace split over instances that share a remote tier, replayed with it and without it."""

    workload: WorkloadSummary  # the whole trace
    capacity: Capacity  # HBM of each instance
    mode: str  # "sequential" or "timed"
    settings: dict[str, Any]  # instances, split, store, tiers (per instance), policy; timed: the rates
    instances: list[InstanceResult]  # one per instance, in instance order
    num_store_keys: int  # keys in the shared store at the end (Redis: keys this run added)

    @property
    def with_remote(self) -> dict[str, Any]:
        """The instances' figures with the shared tier, summed (see :func:`_sum_results`)."""
        return _sum_results([i.with_remote for i in self.instances])

    @property
    def without_remote(self) -> dict[str, Any]:
        """The same without it: the baseline."""
        return _sum_results([i.without_remote for i in self.instances])

    @property
    def remote_hit_tokens(self) -> int:
        """Prompt tokens loaded from the shared tier (at first admission; all prefill saved)."""
        return int(self.with_remote["hit_tokens_by_tier"].get("remote", 0))

    @property
    def remote_tokens_from_others(self) -> int:
        """Tokens of the remote pages loaded that another instance had stored (pages x page size)."""
        return sum(i.num_remote_pages_from_others for i in self.instances) * self.capacity.page_size

    @property
    def prefill_tokens_saved_by_remote(self) -> int:
        """Prompt tokens not recomputed thanks to the shared tier: prefill saved with it minus without."""
        return int(self.with_remote["prefill_tokens_saved"] - self.without_remote["prefill_tokens_saved"])

    @property
    def hit_rate_gain(self) -> float:
        """Total hit rate (tokens) with the shared tier minus without it."""
        return float(self.with_remote["hit_rate_tokens"] - self.without_remote["hit_rate_tokens"])

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: the totals with and without the shared tier, what it saves, and every
        instance's own results."""
        with_r = self.with_remote
        return {
            "workload": asdict(self.workload),
            "capacity": self.capacity.to_dict(),
            "mode": self.mode,
            "settings": self.settings,
            "num_instances": len(self.instances),
            "with_remote": with_r,
            "without_remote": self.without_remote,
            "shared_tier": {
                "remote_hit_tokens": self.remote_hit_tokens,
                "remote_hit_rate": with_r["hit_rate_by_tier"].get("remote", 0.0),
                "remote_tokens_from_others": self.remote_tokens_from_others,
                "prefill_tokens_saved": self.prefill_tokens_saved_by_remote,
                "hit_rate_gain": self.hit_rate_gain,
                "num_lookups": sum(i.num_remote_lookups for i in self.instances),
                "num_marked_pages": sum(i.num_remote_marked_pages for i in self.instances),
                "num_pages_from_others": sum(i.num_remote_pages_from_others for i in self.instances),
                "num_load_failures": sum(i.num_remote_load_failures for i in self.instances),
                "num_store_keys": self.num_store_keys,
            },
            "instances": [i.to_dict() for i in self.instances],
        }

    def to_json(self) -> str:
        """The ``--json`` document as text (strict JSON, as :meth:`ReplayReport.to_json`)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)


def format_instances(report: InstancesReport) -> str:
    """The human-readable report of a multi-instance replay: totals without and with the shared tier,
    what it saves, and one row per instance."""
    w, cap, s = report.workload, report.capacity, report.settings
    ps = cap.page_size
    tiers = ", ".join(
        f"{t['name']} {t['num_slots']:,} pages ({_tokens(t['num_slots'] * ps)} tokens,"
        f" {t['bandwidth_gbps']:g} GB/s)"
        for t in s["lower_tiers"]
    )
    lines = [
        f"kvcore replay: {w.name}, {report.mode} mode, {len(report.instances)}"
        f" instance{'' if len(report.instances) == 1 else 's'}"
        f" ({s['split']} split), shared remote tier: {s['remote']}",
        f"  workload   {w.num_requests:,} requests, {_tokens(w.prompt_tokens)} prompt tokens"
        f" ({_tokens(w.output_tokens)} output), {w.unique_blocks:,} distinct blocks of {w.block_size}",
        f"  best case  {_pct(w.ideal_token_hit_rate).strip()} of prompt tokens repeat earlier prompts:"
        " one infinite cache hits",
        f"  per instance  HBM {cap.pages:,} pages x {ps} tokens = {_tokens(cap.tokens)} tokens"
        f"  [{cap.source}]",
        f"                {tiers}",
        f"                store policy {s['store_policy']}, {_bytes(s['page_bytes'])} per page,"
        f" {s['remote_lookup_keys']} pages a lookup, {s['policy']} eviction",
        "",
    ]
    without, with_r = report.without_remote, report.with_remote
    cols = [without, with_r]
    rows: list[list[str]] = []

    def share(t: dict[str, Any], n: float) -> str:
        return f"{_tokens(n)} ({_pct(n / t['prompt_tokens'] if t['prompt_tokens'] else 0.0).strip()})"

    rows.append(["hit rate (tokens)", *[_pct(t["hit_rate_tokens"]) for t in cols]])
    for name in with_r["hit_tokens_by_tier"]:
        rows.append(
            [
                f"  hits in {name}",
                *[
                    share(t, t["hit_tokens_by_tier"][name]) if name in t["hit_tokens_by_tier"] else "-"
                    for t in cols
                ],
            ]
        )
    rows.append(["prefill tokens saved", *[share(t, t["prefill_tokens_saved"]) for t in cols]])
    for name in with_r["stored_bytes_by_tier"]:
        rows.append(
            [
                f"{name} stored/loaded",
                *[
                    f"{_bytes(t['stored_bytes_by_tier'][name])} / {_bytes(t['loaded_bytes_by_tier'][name])}"
                    if name in t["stored_bytes_by_tier"]
                    else "-"
                    for t in cols
                ],
            ]
        )
    rows.append(["requests served", *[f"{t['num_served']:,}" for t in cols]])
    rows.append(["refused", *[f"{t['num_refused']:,}" for t in cols]])
    if report.mode == "timed":
        rows.append(["preemptions", *[f"{t['num_preemptions']:,}" for t in cols]])
    rows.append(["evicted pages", *[f"{t['num_evicted_pages']:,}" for t in cols]])
    rows.append(["replay time", *[f"{t['elapsed_s']:.2f} s" for t in cols]])
    lines += _table(rows, ["all instances", "without remote", "with remote"])
    d = report.to_dict()["shared_tier"]
    lines += [
        "",
        f"  the shared tier saves {_tokens(report.prefill_tokens_saved_by_remote)} prefill tokens"
        f" ({100 * report.hit_rate_gain:+.2f} points of hit rate)",
        f"  remote hits {_tokens(report.remote_hit_tokens)} tokens; loaded from pages other instances"
        f" stored: {_tokens(report.remote_tokens_from_others)} tokens",
        f"  shared store: {report.num_store_keys:,} keys; {d['num_lookups']:,} lookups taught the indexes"
        f" {d['num_marked_pages']:,} pages; {d['num_load_failures']:,} loads failed",
        "",
    ]
    inst_rows = []
    for i in report.instances:
        a, b = i.without_remote, i.with_remote
        inst_rows.append(
            [
                str(i.instance),
                f"{i.num_requests:,}",
                _pct(a.hit_rate_tokens),
                _pct(b.hit_rate_tokens),
                _tokens(b.hit_tokens_by_tier.get("remote", 0)),
                _tokens(i.num_remote_pages_from_others * ps),
            ]
        )
    lines += _table(inst_rows, ["instance", "requests", "hit w/o", "hit with", "remote hits", "from others"])
    return "\n".join(lines)
