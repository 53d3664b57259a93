"""Replay under memory pressure: a trace through :class:`kvcore.scheduler.Scheduler`, with and without the
:class:`~kvcore.scheduler.PressureController`, at several loads (``kvcore replay --pressure``).

Why: the question an operator asks before an overload is whether it becomes refusals with a reason or
an engine that thrashes (preempting and recomputing) while every request's latency explodes. This
replays the arrivals of a trace, compressed by ``load`` (2.0: twice as fast), on the timed replay's
engine (:mod:`kvcore.replay.engine`: the real scheduler and manager stepped in simulated time; ``none``
is that engine as ``kvcore replay`` runs it, but for the step's time and limits below), with this
comparison's settings:

- each step computes the plan's prefill tokens at ``prefill_rate`` tokens/s (the whole engine) and its
  decode rows in ``1 / decode_rate`` s (one token each, a memory-bound step), one after the other;
  ``max_num_batched_tokens`` and ``max_num_seqs`` bound a step;
- requests arrive at their (compressed) timestamps and are submitted; a refusal at submit
  (``RequestRejected``) or in the queue (a timeout after ``max_queue_wait_s``) is counted by reason;
- prompts are the trace's blocks (a shared prefix is a cache hit); answers are ``output_length`` tokens
  (a request whose answer outgrows the cache ends with reason ``capacity``).

A request is **good** when it is served and its first token came within ``ttft_target_s`` of its
arrival; **goodput** is good requests per simulated second the replay ran, from the first arrival to the
end of the last request (served or refused), ``simulated_s``: the span the good requests were served in,
also when every request arrives at one instant (0.0 when none is good). Runs compared at one load
(``kvcore replay --pressure a,b``) are put over one span, the longest of theirs (:func:`same_window`),
so that ending sooner by refusing more does not raise a mode's goodput. Every request ends served or refused:
``served + refused == submitted`` is checked, and an engine that lost one raises.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from kvcore.exceptions import ConfigError
from kvcore.replay.engine import ReplayConfig, _Engine, _Timed
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import Trace
from kvcore.scheduler import PressureConfig, PressureController

__all__ = [
    "PRESSURE_MODES",
    "PressureReplayConfig",
    "PressureResult",
    "arrival_times",
    "format_pressure",
    "replay_pressure",
    "same_window",
]

PRESSURE_MODES = ("none", "graduated")


@dataclass(frozen=True)
class PressureReplayConfig:
    capacity_pages: int  # usable pages
    page_size: int = 16
    prefill_rate: float = 10_000.0  # tokens/s the engine prefills (all requests together)
    decode_rate: float = 50.0  # decode steps per second (one token per running request each)
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_queue_wait_s: float = 60.0
    ttft_target_s: float = 10.0
    max_queued_requests: int | None = None

    def __post_init__(self) -> None:
        for name in ("capacity_pages", "page_size", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("prefill_rate", "decode_rate", "ttft_target_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be finite and > 0, got {v!r}")
        if not (math.isfinite(self.max_queue_wait_s) and self.max_queue_wait_s >= 0):
            raise ConfigError("max_queue_wait_s must be finite and >= 0")


@dataclass
class PressureResult:
    pressure: str
    load: float
    num_submitted: int
    num_served: int
    num_good: int  # served with first token within ttft_target_s
    num_refused: int
    refused_by_reason: dict[str, int]
    num_preemptions: int
    preemptions_by_kind: dict[str, int]
    preemption_tax: float
    queue_wait_p50_s: float
    queue_wait_p99_s: float
    ttft_p99_s: float
    goodput_rps: float  # num_good / goodput_window_s (0.0 when num_good is 0)
    simulated_s: float  # first arrival (0) to the end of the last request, simulated seconds
    num_steps: int
    peak_usage: float  # most pages in use / usable pages, read after each step's plan
    max_level: int
    controller_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # The span goodput is over: simulated_s, or with same_window() the longest run at this load.
    goodput_window_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arrival_times(trace: Trace, load: float) -> np.ndarray:
    """float64 ``[num_requests]``: each request's arrival in seconds after the first, compressed by ``load``.

    Raises:
        ConfigError: the trace has no timestamps, ``load`` is not finite and > 0, or an arrival divided by
            ``load`` is not finite (``load=1e-310``: a tiny load stretches the trace past any float).
    """
    if not (isinstance(load, (int, float)) and math.isfinite(load) and load > 0):
        raise ConfigError(f"load must be finite and > 0, got {load!r}")
    if trace.timestamps_ms is None:
        raise ConfigError("a pressure replay needs a trace with timestamps")
    ts = trace.timestamps_ms
    with np.errstate(over="ignore"):
        arrival = (ts - ts.min()) / 1000.0 / load if len(ts) else np.zeros(0)
    if not np.isfinite(arrival).all():
        raise ConfigError(
            f"load {load!r}: the trace's {float(ts.max() - ts.min()) / 1000:g} s of arrivals divided by it "
            "overflow to infinite times (give a larger load)"
        )
    return arrival


def replay_pressure(
    trace: Trace,
    config: PressureReplayConfig,
    *,
    pressure: str = "graduated",
    load: float = 1.0,
    controller_config: PressureConfig | None = None,
    tokens: TokenSource | None = None,
) -> PressureResult:
    """Replay ``trace`` at ``load`` through a fresh manager and scheduler (see the module docstring)."""
    if pressure not in PRESSURE_MODES:
        raise ConfigError(f"pressure must be one of {', '.join(PRESSURE_MODES)}, got {pressure!r}")
    arrival = arrival_times(trace, load)  # [n] float64 s
    src = tokens if tokens is not None else TokenSource(trace)
    cfg = config
    controller = None
    if pressure == "graduated":
        cc = controller_config or PressureConfig(
            queue_wait_high_s=cfg.ttft_target_s * 0.75,
            queue_wait_low_s=cfg.ttft_target_s / 10,
            long_request_tokens=max(1, cfg.capacity_pages * cfg.page_size // 8),
            retry_after_s=cfg.ttft_target_s,
            escalate_after_s=1.0,
            relax_after_s=10.0,
        )
        controller = PressureController(cc)
    engine = _Engine(
        shared_prefill=True,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        max_queued_requests=cfg.max_queued_requests,
        controller=controller,
    )
    replay_cfg = ReplayConfig(
        capacity_pages=cfg.capacity_pages,
        page_size=cfg.page_size,
        mode="timed",
        prefill_rate=cfg.prefill_rate,
        decode_rate=cfg.decode_rate,
        max_queue_wait_s=cfg.max_queue_wait_s,
    )
    n = trace.num_requests
    sim = _Timed(trace, replay_cfg, src, None, engine=engine, arrival_s=arrival.tolist())
    sim.run(None)
    t_end = sim.finish()
    s = sim.sched.stats()
    refused = dict(sim.refused)
    served = int(sim.served.sum())
    if served + sum(refused.values()) != n:
        raise AssertionError(f"pressure replay lost requests: {served} served, {refused} refused of {n}")
    ttft = sim.first_token - arrival  # [n] s; NaN: no first token
    got = ~np.isnan(ttft)
    waits_first = ttft[got]
    admitted_at = sim.admitted_at
    queue_waits = (admitted_at - arrival)[~np.isnan(admitted_at)]  # arrival to first admission
    good = int(np.sum(sim.served & got & (np.nan_to_num(ttft, nan=np.inf) <= cfg.ttft_target_s)))
    # The span the replay ran (arrivals start at 0), not the arrivals' own: they may all be at one instant.
    # A good request was prefilled, which takes simulated time, so the span is > 0 whenever good is.
    span = t_end
    if good and not (span > 0 and math.isfinite(good / span)):
        raise ConfigError(
            f"rates so high that the replay took {span!r} simulated s: goodput is undefined (lower them)"
        )
    return PressureResult(
        pressure=pressure,
        load=float(load),
        num_submitted=n,
        num_served=served,
        num_good=good,
        num_refused=sum(refused.values()),
        refused_by_reason=refused,
        num_preemptions=s.num_preemptions,
        preemptions_by_kind=dict(s.preemptions_by_kind),
        preemption_tax=s.preemption_tax,
        queue_wait_p50_s=float(np.percentile(queue_waits, 50)) if len(queue_waits) else 0.0,
        queue_wait_p99_s=float(np.percentile(queue_waits, 99)) if len(queue_waits) else 0.0,
        ttft_p99_s=float(np.percentile(waits_first, 99)) if len(waits_first) else 0.0,
        goodput_rps=good / span if good else 0.0,
        simulated_s=t_end,
        num_steps=sim.num_steps,
        peak_usage=sim.usage.max_u / cfg.capacity_pages,
        max_level=sim.max_level,
        controller_counts={k: dict(v) for k, v in controller.counts.items()} if controller else {},
        elapsed_s=time.perf_counter() - sim.start,
        goodput_window_s=span,
    )


def same_window(results: list[PressureResult]) -> list[PressureResult]:
    """``results`` with the goodput of every run at one load over the same span: the longest of those
    runs. Over its own span, a mode that refused more ended sooner and scored a higher goodput with
    the same good requests (8 good: 0.067/s without pressure control, 0.109/s with it)."""
    window: dict[float, float] = {}
    for r in results:
        window[r.load] = max(window.get(r.load, 0.0), r.simulated_s)
    return [
        replace(
            r, goodput_rps=r.num_good / window[r.load] if r.num_good else 0.0, goodput_window_s=window[r.load]
        )
        for r in results
    ]


def format_pressure(results: list[PressureResult]) -> str:
    """The comparison table: one row per (load, pressure)."""
    head = (
        f"{'load':>5} {'pressure':>10} {'served':>7} {'good':>7} {'refused':>8} {'goodput/s':>10} "
        f"{'wait p99 s':>10} {'ttft p99 s':>11} {'preempt':>8} {'tax':>6} {'level':>5}  refusals"
    )
    lines = [head]
    for r in results:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.refused_by_reason.items())) or "-"
        lines.append(
            f"{r.load:>5.1f} {r.pressure:>10} {r.num_served:>7,} {r.num_good:>7,} {r.num_refused:>8,} "
            f"{r.goodput_rps:>10.3f} {r.queue_wait_p99_s:>10.1f} {r.ttft_p99_s:>11.1f} "
            f"{r.num_preemptions:>8,} {r.preemption_tax:>6.3f} "
            f"{r.max_level:>5}  {reasons}"
        )
    return "\n".join(lines)
