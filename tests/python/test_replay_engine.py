"""kvcore.replay engine: hand-computed sequential and timed replays, capacity invariants, conservation of
requests, and the capacity resolution through kvcore.sizing."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

import kvcore
import kvcore.replay.engine
from kvcore import CacheStats
from kvcore.exceptions import ConfigError, RequestRejected
from kvcore.replay import (
    PolicyResult,
    ReplayConfig,
    Trace,
    UsageSplit,
    WorkloadConfig,
    default_sweep_pages,
    format_report,
    generate_workload,
    replay,
    resolve_capacity,
    run_replay,
)
from kvcore.replay.tokens import TokenSource
from kvcore.scheduler import Request, Scheduler, SchedulerEvent
from kvcore.sizing import load_model, plan


def make_trace(rows: list[tuple[list[int], int, int]], bs: int, times_ms: list[float] | None = None) -> Trace:
    """Rows of (hash ids, input_length, output_length)."""
    indptr = np.cumsum([0] + [len(r[0]) for r in rows]).astype(np.int64)
    return Trace(
        input_lens=np.array([r[1] for r in rows], dtype=np.int64),
        output_lens=np.array([r[2] for r in rows], dtype=np.int64),
        hash_indptr=indptr,
        hash_ids=np.array([h for r in rows for h in r[0]], dtype=np.int64),
        block_size=bs,
        timestamps_ms=np.array(times_ms, dtype=np.float64) if times_ms is not None else None,
    )


def check_split(t: float, s: CacheStats) -> None:
    assert (
        s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free == s.num_pages_total
    )
    assert 0 <= s.num_pages_in_use <= s.num_pages_total


# Blocks of 4 tokens, pages of 2: block h holds pages (h, 0) and (h, 1). Six usable pages.
HAND = make_trace(
    [
        ([1, 2], 8, 0),  # R0: empty cache, no hit; caches (1,0) (1,1) (2,0) (2,1)
        ([1, 3], 7, 0),  # R1: hits block 1 (4 tokens); caches (3,0); its partial page is freed
        ([1, 2], 8, 0),  # R2: all 8 cached (uncapped), 6 saved (capped at len - 1 -> 3 pages)
        ([4], 4, 0),  # R3: miss; needs 2 pages, 1 free: evicts the LRU page (3,0)
        ([1, 3], 7, 0),  # R4: hits block 1 again, (3,0) is gone; evicts (2,1) (2,0)
        ([1, 2], 8, 0),  # R5: hits block 1, (2,0) is gone; evicts (4,1)
    ],
    bs=4,
)


def test_sequential_hand_computed() -> None:
    seen: list[CacheStats] = []
    result = replay(
        HAND, ReplayConfig(capacity_pages=6, page_size=2, policy="lru"), observer=lambda t, s: seen.append(s)
    )
    assert result.num_requests == result.num_served == 6 and result.num_refused == 0
    assert result.prompt_tokens == 8 + 7 + 8 + 4 + 7 + 8
    assert result.hit_tokens == 0 + 4 + 8 + 0 + 4 + 4
    assert result.prefill_tokens_saved == 0 + 4 + 6 + 0 + 4 + 4
    assert result.prompt_pages == 4 + 4 + 4 + 2 + 4 + 4
    assert result.hit_pages == 0 + 2 + 4 + 0 + 2 + 2
    assert result.hit_rate_tokens == pytest.approx(20 / 42)
    assert result.hit_rate_pages == pytest.approx(10 / 22)
    assert result.num_evicted_pages == 1 + 2 + 1
    # In use while each request is live: its pages, plus for R2 the cached copy of its recomputed last page.
    assert [s.num_pages_in_use for s in seen] == [4, 4, 5, 2, 4, 4]
    assert result.peak.in_use == 5
    for s in seen:
        check_split(0, s)


def test_sequential_refuses_only_what_cannot_fit() -> None:
    trace = make_trace([([1, 2, 3], 12, 0), ([4], 4, 0), ([5, 6, 7, 8], 16, 0)], bs=4)
    result = replay(trace, ReplayConfig(capacity_pages=3, page_size=4))
    assert (result.num_served, result.num_refused, result.num_refused_too_large) == (2, 1, 1)
    assert result.num_served + result.num_refused == result.num_requests
    assert result.prompt_tokens == 16  # refused prompts are not looked-up tokens


def hits(rows: list[list[int]], policy: str) -> int:
    """Uncapped hit tokens of one-block prompts (4 tokens, one page each) in a two-page cache."""
    trace = make_trace([(ids, 4, 0) for ids in rows], bs=4)
    return replay(trace, ReplayConfig(capacity_pages=2, page_size=4, policy=policy)).hit_tokens


def test_lru_and_lfu_differ_as_they_should() -> None:
    a, b, c = [1], [2], [3]
    # A used often, then B, then C needs room: LRU drops A (older), LFU drops B (rarer). Then A again.
    frequent_trap = [a, a, a, a, b, c, a]
    assert hits(frequent_trap, "lru") == 3 * 4
    assert hits(frequent_trap, "lfu") == 3 * 4 + 4
    # A used often long ago, B recently: C evicts A under LRU and B under LFU. Then B again.
    recency_trap = [a, a, a, b, c, b]
    assert hits(recency_trap, "lru") == 2 * 4 + 4
    assert hits(recency_trap, "lfu") == 2 * 4
    # Without priorities the priority policy is LRU.
    assert hits(frequent_trap, "priority") == hits(frequent_trap, "lru")


def timed(trace: Trace, pages: int, ps: int, **kw: float) -> tuple[PolicyResult, list[CacheStats]]:
    """A timed replay at ``pages`` pages of ``ps`` tokens; the usage split it reported after each change."""
    seen: list[CacheStats] = []

    def observe(t: float, s: CacheStats) -> None:
        check_split(t, s)
        seen.append(s)

    cfg = ReplayConfig(capacity_pages=pages, page_size=ps, mode="timed", **kw)  # type: ignore[arg-type]
    return replay(trace, cfg, observer=observe), seen


def test_timed_preemption_hand_computed() -> None:
    # Sixteen one-page requests, 1 s apart, each answered by its prefill (output length 0 still samples
    # the one token that ends it): the scheduler's estimator learns that answers are 1 token long. Then
    # A and B (8-token prompts, 2 pages of 4, 8 output tokens) arrive together at 100 s: each is admitted
    # for its prompt and the one answer page it is expected to need (3 + 3 of the 6 pages).
    rows = [([100 + k], 4, 0) for k in range(16)] + [([1, 2], 8, 8), ([3, 4], 8, 8)]
    trace = make_trace(rows, bs=4, times_ms=[1000.0 * k for k in range(16)] + [100_000, 100_000])
    r, seen = timed(trace, 6, 4, prefill_rate=1e9, decode_rate=4.0)
    # Both prefill at 100 s and sample their first token, then decode 4 tokens a second; their 5th
    # decode step (position 12) needs a 4th page each: none is free or cached, so B (the youngest) is
    # preempted, its 3 full pages cached; A evicts one of them and finishes at 101.75 s (8 tokens: its
    # last one sampled, never computed). B comes back: its prompt's 8 tokens hit, the 4 generated tokens
    # it had computed and its sampled one are computed again (5 tokens, 4 of them recomputed), and it
    # decodes its last 2.
    assert (r.num_served, r.num_refused, r.num_preemptions, r.num_append_failures) == (18, 0, 1, 1)
    assert r.recomputed_tokens == 4
    # B's return is tried at each of A's last 3 steps and fails: the 2 pages it would hit are the only
    # ones A does not hold, so none is left for its new ones (add_sequence answers None, nothing changes).
    assert r.num_admission_failures == 3
    # 10 by the warm-up requests, 6 for A and B, B's third page (for A), one of A's (for B's return).
    assert r.num_evicted_pages == 18
    assert r.peak_running == 2 and r.peak.in_use == 6
    assert (r.prompt_tokens, r.hit_tokens) == (16 * 4 + 16, 0)
    assert r.simulated_s == pytest.approx(100 + 8e-9 + 7 / 4 + 5e-9 + 2 / 4, abs=1e-9)
    assert r.queue_wait_max_s == 0.0
    assert max(s.num_pages_in_use for s in seen) == 6


def test_timed_queue_timeout_and_too_large() -> None:
    # Three usable pages of 4 tokens. A holds 2 then 3 pages for 0.75 s (the scheduler admits it for its
    # prompt and its 4-token answer: all 3 pages); B cannot get in and waits too long (limit 0.5 s); C
    # (20 tokens = 5 pages) can never fit. The scheduler predicts that B does not fit, so no admission
    # is even tried and failed.
    trace = make_trace(
        [([1, 2], 8, 4), ([3, 4], 8, 4), ([5, 6, 7, 8, 9], 20, 1)], bs=4, times_ms=[0, 0, 5000]
    )
    r, _ = timed(trace, 3, 4, prefill_rate=1e9, decode_rate=4.0, max_queue_wait_s=0.5)
    assert (r.num_served, r.num_refused_timeout, r.num_refused_too_large, r.num_refused) == (1, 1, 1, 2)
    assert r.num_admission_failures == 0
    assert r.queue_wait_max_s == 0.0  # A, the one served, never waited


def test_timed_queue_head_that_times_out_unblocks_the_next() -> None:
    # Four usable pages of 4 tokens. A holds 3 pages until 0.75 s (its prefill, then 3 decode steps of
    # 0.25 s). B (3 pages and its answer's page) cannot fit and blocks the queue; C (1 page) waits behind
    # it; D arrives at 0.7 s. At the step of 0.75 s, B has waited too long: it is refused, and C, the new
    # head, is admitted (after 0.45 s), then D.
    rows = [([1, 2], 8, 4), ([3, 4, 5], 12, 0), ([6], 4, 0), ([7], 4, 0)]
    trace = make_trace(rows, bs=4, times_ms=[0, 100, 300, 700])
    r, _ = timed(trace, 4, 4, prefill_rate=1e9, decode_rate=4.0, max_queue_wait_s=0.5)
    assert (r.num_served, r.num_refused_timeout, r.num_refused) == (3, 1, 1)
    assert r.queue_wait_max_s == pytest.approx(0.45)


def test_timed_waiting_request_is_admitted_when_room_appears() -> None:
    # A's prefill step samples its first token, 3 decode steps its other 3: it leaves at 0.75 s, B runs next.
    trace = make_trace([([1, 2], 8, 4), ([3, 4], 8, 4)], bs=4, times_ms=[0, 0])
    r, _ = timed(trace, 3, 4, prefill_rate=1e9, decode_rate=4.0, max_queue_wait_s=10)
    assert (r.num_served, r.num_refused) == (2, 0)
    assert r.queue_wait_max_s == pytest.approx(0.75)
    assert r.simulated_s == pytest.approx(1.5)


def test_timed_multi_turn_hits_the_decoded_answer() -> None:
    # Turn 2 = turn 1's prompt (blocks 1, 2) + its answer (block 7) + a new message (block 8). Turn 1
    # answers 5 tokens (block 7 and the first token of block 10): the engine computes K/V for every
    # answer token but the last, so block 7's page is full, cached, and hit by turn 2.
    trace = Trace(
        input_lens=np.array([8, 16]),
        output_lens=np.array([5, 4]),
        hash_indptr=np.array([0, 2, 6]),
        hash_ids=np.array([1, 2, 1, 2, 7, 8]),
        block_size=4,
        timestamps_ms=np.array([0.0, 10_000.0]),
        output_indptr=np.array([0, 2, 3]),
        output_ids=np.array([7, 10, 9]),
    )
    r, _ = timed(trace, 100, 4)
    assert r.hit_tokens == 12  # 8 prompt + 4 answer tokens of turn 1


@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
def test_timed_generated_workload_under_pressure_loses_nothing(policy: str) -> None:
    trace = generate_workload(WorkloadConfig(num_requests=300, seed=3, session_rate=6.0))
    r, seen = timed(trace, 1_200, 16, decode_rate=20.0, max_queue_wait_s=20.0, policy=policy)  # type: ignore[arg-type]
    res = r
    assert res.num_served + res.num_refused == trace.num_requests
    assert res.num_preemptions > 0 and res.num_refused_timeout > 0 and res.num_refused_too_large > 0
    assert res.num_append_failures == res.num_preemptions  # each failed decode append preempts one
    assert res.num_admission_failures > 0
    assert all(s.num_pages_total == 1_200 for s in seen)
    assert res.peak.in_use <= 1_200
    mean = res.mean
    assert mean.in_use + mean.cached + mean.pinned + mean.free == pytest.approx(1_200)
    assert 0 < res.hit_rate_tokens < 1


def drive_by_hand(
    trace: Trace, pages: int, ps: int, prefill_rate: float, decode_rate: float, max_wait: float
) -> tuple[dict[str, float], list[SchedulerEvent]]:
    """The timed replay's engine as its documentation describes it, written plainly: a Scheduler over
    a fresh manager (no budget or cap that binds, chunks of prefill_rate / decode_rate tokens), every
    request submitted at its arrival, a step lasting as long as its slowest row, each sampled token the
    trace's answer token. The figures a replay reports, from the scheduler's own events."""
    m = kvcore.KVCacheManager(pages + 1, ps)
    src = TokenSource(trace)
    sched = Scheduler(
        m,
        max_num_batched_tokens=pages * ps,
        max_num_seqs=pages,
        max_queue_wait_s=max_wait,
        long_prefill_token_threshold=max(1, int(prefill_rate // decode_rate)),
    )
    arrival = (trace.timestamps_ms / 1000.0).tolist()
    order = sorted(range(trace.num_requests), key=lambda i: arrival[i])
    out_lens = trace.output_lens.tolist()
    in_lens = trace.input_lens.tolist()
    events: list[SchedulerEvent] = []
    t, k = arrival[order[0]], 0
    while k < len(order) or sched.has_work():
        while k < len(order) and arrival[order[k]] <= t:
            i = order[k]
            k += 1
            with contextlib.suppress(RequestRejected):  # its event is in the next plan
                sched.submit(Request(i, src.prompt(i), max_new_tokens=max(1, out_lens[i])), arrival[i])
        if not sched.has_work():
            t = arrival[order[k]]
            continue
        plan = sched.step(t)
        events += plan.events
        assert plan, "nothing computable"
        dt = 1 / decode_rate if (~plan.is_prefill).any() else 0.0
        for n, pre in zip(plan.num_tokens.tolist(), plan.is_prefill.tolist(), strict=True):
            if pre:
                dt = max(dt, n / prefill_rate)
        tokens = {}
        for rid, start, n in zip(
            plan.request_ids[plan.sample].tolist(),
            plan.starts[plan.sample].tolist(),
            plan.num_tokens[plan.sample].tolist(),
            strict=True,
        ):
            g = start + n - in_lens[rid]  # the answer token this row samples
            tokens[rid] = int(src.answer(rid, g, g + 1)[0]) if g < out_lens[rid] else 0
        sched.update(plan, tokens)
        t += dt
    events += sched.take_events()
    first = [e for e in events if e.kind == "admitted" and not e.detail["resumed"]]
    waits = np.array([e.time_s - arrival[e.request_id] for e in first])  # type: ignore[index]
    rejected = [e.detail["reason"] for e in events if e.kind == "rejected"]
    ends = [e.detail["reason"] for e in events if e.kind == "finished"]
    s = sched.stats()
    figures = {
        "num_served": ends.count("length"),
        "num_refused_timeout": rejected.count("timeout"),
        "num_refused_too_large": rejected.count("too_large") + ends.count("capacity"),
        "num_preemptions": s.num_preemptions,
        "num_admission_failures": s.num_failed_admissions,
        "recomputed_tokens": s.recomputed_tokens,
        "prompt_tokens": sum(in_lens[e.request_id] for e in first),  # type: ignore[index]
        "prefill_tokens_saved": sum(e.detail["hit_tokens"] for e in first),
        "queue_wait_mean_s": float(waits.mean()),
        "queue_wait_max_s": float(waits.max()),
        "simulated_s": t - arrival[order[0]],
    }
    return figures, events


def test_timed_replay_is_the_scheduler_driven_by_hand() -> None:
    """Every figure of a timed replay under pressure (waits, timeouts, preemptions, recomputation, the
    end time) is what kvcore.scheduler decides when driven plainly by hand on the same requests."""
    trace = generate_workload(WorkloadConfig(num_requests=200, seed=3, session_rate=6.0))
    want, events = drive_by_hand(trace, 1_200, 16, 10_000.0, 20.0, 20.0)
    assert want["num_preemptions"] > 0 and want["num_refused_timeout"] > 0  # the run is under pressure
    assert any(e.kind == "preempted" for e in events)
    r, _ = timed(trace, 1_200, 16, decode_rate=20.0, max_queue_wait_s=20.0)
    got = {name: getattr(r, name) for name in want}
    assert got == pytest.approx(want, rel=1e-12, abs=1e-9)
    assert r.num_served + r.num_refused == trace.num_requests


def test_timed_replay_follows_its_schedulers_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay has no scheduling of its own: a Scheduler that runs one request at a time makes the
    replay run one at a time, and every wait grows."""

    class OneAtATime(Scheduler):
        def __init__(self, cache: kvcore.KVCacheManager, **kw: Any) -> None:
            super().__init__(cache, **{**kw, "max_num_seqs": 1})

    trace = generate_workload(WorkloadConfig(num_requests=100, seed=1))
    cfg = ReplayConfig(capacity_pages=20_000, page_size=16, mode="timed")
    free = replay(trace, cfg)
    monkeypatch.setattr(kvcore.replay.engine, "Scheduler", OneAtATime)
    one = replay(trace, cfg)
    assert free.peak_running > 1 and one.peak_running == 1
    assert one.queue_wait_mean_s > free.queue_wait_mean_s and one.simulated_s > free.simulated_s
    assert one.num_served + one.num_refused == free.num_served + free.num_refused == 100


def test_sequential_matches_between_runs_and_report_renders() -> None:
    trace = generate_workload(WorkloadConfig(num_requests=400, seed=1))
    cfg = ReplayConfig(capacity_pages=3_000, page_size=16, mode="sequential")
    report = run_replay(trace, cfg, policies=["lru", "priority"], sweep_pages=[1_000, 3_000, 100_000])
    a, b = report.results
    again = replay(trace, cfg)
    assert a.hit_tokens == again.hit_tokens and a.num_evicted_pages == again.num_evicted_pages
    # More cache never hurts LRU on the same trace (a stack algorithm at page granularity).
    curve = [r.hit_tokens for r in report.sweep if r.policy == "lru"]
    assert curve == sorted(curve) and len(report.sweep) == 6
    # At 100k pages nothing is evicted: the hit rate is the workload's best case in tokens.
    top = next(r for r in report.sweep if r.capacity_pages == 100_000 and r.policy == "lru")
    assert top.num_evicted_pages == 0
    text = format_report(report)
    assert "hit rate (tokens)" in text and "hit rate (tokens) vs capacity" in text
    d = report.to_dict()["results"]["lru"]
    for key in ("hit_rate_tokens", "hit_rate_pages", "num_requests", "num_evicted_pages", "num_refused"):
        assert key in d
    assert d["hit_rate_tokens"] == a.hit_rate_tokens and b.policy == "priority"


def test_infinite_cache_reaches_the_ideal_block_hit_rate() -> None:
    """With block-sized pages, no eviction and whole blocks everywhere, the page hit rate is exactly
    1 - unique / total blocks (the generator's segments are whole blocks)."""
    trace = generate_workload(WorkloadConfig(num_requests=300, seed=5))
    r = replay(trace, ReplayConfig(capacity_pages=10**6, page_size=trace.block_size))
    assert r.num_evicted_pages == 0
    assert r.hit_rate_pages == pytest.approx(trace.ideal_block_hit_rate)


def test_default_sweep_spans_the_footprint() -> None:
    trace = make_trace([([1, 2], 8, 0), ([1, 3], 8, 0)], bs=4)
    # 3 distinct blocks of 4 tokens = 6 pages of 2; halvings 6, 3, 1 (and the given capacity 5).
    assert default_sweep_pages(trace, 5, 2, num_points=3) == [1, 3, 5, 6]


@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_usage_with_no_request_admitted_is_the_idle_pool(mode: str) -> None:
    """Every request is larger than the cache, so none is admitted and no usage sample is taken: peak and
    mean are both the pool as it stayed (all 6 pages free), not a mean of zero samples (0 free), and every
    figure is a float, in report.json too."""
    trace = make_trace([([1, 2, 3, 4], 16, 2), ([1, 5, 6, 7], 16, 2)], bs=4, times_ms=[0.0, 100.0])
    r = replay(trace, ReplayConfig(capacity_pages=6, page_size=2, mode=mode))
    assert r.num_served == 0 and r.num_refused == 2
    assert r.peak == UsageSplit(in_use=0.0, cached=0.0, pinned=0.0, free=6.0)
    assert asdict(r.mean) == pytest.approx(asdict(r.peak))  # timed: a time integral, to rounding
    doc = r.to_dict()
    for split in (doc["peak"], doc["mean"]):
        assert split == pytest.approx({"in_use": 0, "cached": 0, "pinned": 0, "free": 6})
        assert all(type(v) is float for v in split.values())
    text = format_report(run_replay(trace, ReplayConfig(capacity_pages=6, page_size=2, mode=mode)))
    (line,) = [x for x in text.splitlines() if x.strip().startswith("free min/mean")]
    assert line.split("free min/mean")[1].split() == ["100.0", "%", "/", "100.0", "%"]


def test_capacity_resolution_uses_sizing() -> None:
    p = plan("llama-3.1-8b", gpu="H100-80G", page_size=16)
    cap = resolve_capacity()
    assert (cap.pages, cap.page_bytes) == (p.usable_pages, p.page_bytes)
    assert resolve_capacity(capacity_pages=100).tokens == 1600
    assert resolve_capacity(capacity_tokens=1000, page_size=16).pages == 62
    page = load_model("llama-3.1-8b").page_bytes(16, "bf16", 1)
    by_bytes = resolve_capacity(capacity_bytes=10 * page + 5, model="llama-3.1-8b")
    assert by_bytes.pages == 9 and by_bytes.bytes == 9 * page  # one page of the pool is the null page
    h200 = resolve_capacity(model="qwen3-8b", gpu="H200-141G", page_size=32, kv_dtype="fp8")
    assert h200.pages == plan("qwen3-8b", gpu="H200-141G", page_size=32, kv_dtype="fp8").usable_pages
    for bad in (
        dict(capacity_pages=1, capacity_tokens=16),
        dict(capacity_bytes=10**9),
        dict(capacity_tokens=8, page_size=16),
        dict(capacity_pages=10, gpu="H100-80G"),
        dict(model="no-such-model", gpu="H100-80G"),
    ):
        with pytest.raises(ConfigError):
            resolve_capacity(**bad)  # type: ignore[arg-type]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="policy"):
        ReplayConfig(capacity_pages=10, policy="fifo")
    with pytest.raises(ValueError, match="timestamps"):
        replay(HAND, ReplayConfig(capacity_pages=10, mode="timed"))


# Hybrid presets (KV-cache groups of fewer layers than the model: Gemma 3 27B 7 groups of 10 slots, Gemma 3
# 1B with padding slots, gpt-oss two groups of 12) and plain ones (one group of every layer).
@pytest.mark.parametrize("model", ["gemma-3-27b", "gemma-3-1b", "gpt-oss-20b", "llama-3.1-8b", "qwen3-8b"])
def test_gpu_and_bytes_routes_agree_on_the_replayed_page(model: str) -> None:
    p = plan(model, gpu="H200-141G", page_size=16)
    page = load_model(model).page_bytes(16)
    by_gpu = resolve_capacity(model=model, gpu="H200-141G", page_size=16)
    by_bytes = resolve_capacity(model=model, capacity_bytes=p.pool_bytes, page_size=16)
    # The replay's manager has one page table per sequence: its page is 16 tokens of every layer, whatever
    # the route, and the plan's pool bytes hold as many of them (the null page paid out of them).
    assert by_gpu.page_bytes == by_bytes.page_bytes == page
    assert by_gpu.pages == by_bytes.pages == p.pool_bytes // page - 1
    assert by_gpu.bytes is not None and by_gpu.bytes <= p.pool_bytes
    if len(p.groups) == 1:
        assert (by_gpu.pages, page) == (p.usable_pages, p.page_bytes)
    else:  # a group page holds group_size layer slots, fewer than the model's layers
        assert page > p.page_bytes and by_gpu.pages < p.usable_pages


@pytest.mark.parametrize("tiered", [False, True])
def test_timed_a_request_admitted_then_refused_is_not_in_the_served_figures(tiered: bool) -> None:
    """A request admitted, then refused when its answer outgrew the cache, stayed in prompt_tokens,
    hit_tokens (and its tiers' hits), saved tokens and pages, documented as the served requests':
    the report said 5 % hit rate, served, while the served requests had no hit at all."""
    ps = 4
    # Seventeen one-page requests teach the estimator one-token answers; then a page of prompt C,
    # then D: C's page again (a hit) and an answer that can never fit 10 pages.
    rows = [([100 + k], 4, 1) for k in range(17)] + [([0], 4, 1), ([0, 99], 8, 3000)]
    times = [1000.0 * k for k in range(17)] + [20_000, 21_000]
    trace = make_trace(rows, bs=ps, times_ms=times)
    kw: dict[str, Any] = {"host_tier_slots": 64} if tiered else {}
    r, _ = timed(trace, 10, ps, prefill_rate=1e9, decode_rate=1000.0, **kw)
    assert (r.num_served, r.num_refused_too_large) == (18, 1)
    # A model of the served requests: 18 one-page prompts, none with a prefix anyone cached before.
    assert (r.prompt_tokens, r.prompt_pages) == (18 * ps, 18)
    assert (r.hit_tokens, r.hit_pages, r.prefill_tokens_saved) == (0, 0, 0)
    assert r.hit_rate_tokens == 0.0
    if tiered:
        assert all(t.hit_tokens == 0 for t in r.tiers)


def test_the_sweep_counts_refused_prompts_as_misses(tmp_path: Any) -> None:
    """The sweep (table and plot) showed the served requests' hit rate: at small capacities large
    prompts were refused and left the denominator, so the curve fell as capacity grew. It now shows
    hits over every prompt token, which LRU (a stack algorithm) never lowers with more cache."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from kvcore.replay.plot import plot_sweep
    from kvcore.replay.report import hit_rate_of_all_prompts

    # A long prompt repeated (refused at 4 and 8 pages) and short ones repeated (hit at every capacity).
    long = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 40, 1)
    short = [([20 + k], 4, 1) for k in range(3)]
    trace = make_trace([long, *short, long, *short, long, *short], bs=4)
    cfg = ReplayConfig(capacity_pages=64, page_size=4, mode="sequential")
    report = run_replay(trace, cfg, sweep_pages=[4, 8, 64])
    rows = {r.capacity_pages: r for r in report.sweep}
    assert [rows[c].num_refused for c in (4, 8, 64)] == [3, 3, 0]
    total = 3 * 40 + 9 * 4
    # The model: the short prompts hit twice each (2 x 3 x 4 tokens) at every capacity; at 64 pages
    # the long prompt hits twice too (2 x 40).
    want = {4: 24 / total, 8: 24 / total, 64: (24 + 80) / total}
    for c, rate in want.items():
        assert hit_rate_of_all_prompts(rows[c], report.workload) == pytest.approx(rate)
    assert rows[4].hit_rate_tokens == pytest.approx(24 / 36)  # served only: higher than at 64 pages
    text = format_report(report)
    assert f"{100 * want[4]:.1f} % (3 refused; {100 * 24 / 36:.1f} % of served)" in text
    captured: list[list[float]] = []
    real_plot = plt.Axes.plot

    def spy(self: Any, x: Any, y: Any, *a: Any, **kw: Any) -> Any:
        captured.append(list(y))
        return real_plot(self, x, y, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Axes, "plot", spy)
        plot_sweep(report, tmp_path / "s.png")
    assert captured == [[pytest.approx(100 * want[c]) for c in (4, 8, 64)]]


def test_a_sequential_replay_sets_no_token_ids_aside_for_answers() -> None:
    """Sequential mode generates nothing, yet its token source numbered every answer: a valid trace
    with one output_length of 2**32 was refused ("8,388,610 distinct blocks ... do not fit"), the
    trace having 2 blocks. Timed mode still needs them, and says the answers are the cause."""
    from kvcore.exceptions import TraceFormatError

    trace = make_trace([([0, 1], 1000, 2**32), ([0, 2], 1000, 5)], bs=512, times_ms=[0.0, 1.0])
    r = replay(trace, ReplayConfig(capacity_pages=100, page_size=16, mode="sequential"))
    assert (r.num_served, r.hit_tokens) == (2, 512)  # the shared first block, whole pages of 16
    report = run_replay(trace, ReplayConfig(capacity_pages=100, page_size=16, mode="sequential"))
    assert report.results[0].hit_tokens == 512
    with pytest.raises(TraceFormatError, match="for the answers' output_length"):
        replay(trace, ReplayConfig(capacity_pages=100, page_size=16, mode="timed"))
    src = TokenSource(trace, answers=False)
    assert (
        src.prompt(1).tolist()[:3]
        == TokenSource(make_trace([([0, 2], 1000, 5)], bs=512)).prompt(0).tolist()[:3]
    )
    with pytest.raises(ConfigError, match="answers=False"):
        src.output(1)
    small = make_trace([([0], 16, 2)], bs=16, times_ms=[0.0])
    with pytest.raises(ConfigError, match="has none"):
        replay(
            small,
            ReplayConfig(capacity_pages=10, page_size=16, mode="timed"),
            tokens=TokenSource(small, answers=False),
        )
