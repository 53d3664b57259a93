"""The scheduler (kvcore.scheduler) against references: the tiny decoder's no-cache generation for
outputs (preempted and resumed requests included, by swap and by recompute), a model of the queues
for refusals and ordering, and the manager's own invariants after every step."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvcore
from kvcore.exceptions import InvalidArgumentError, RequestRejected, UnknownSequenceError
from kvcore.scheduler import (
    OutputLengthEstimator,
    PressureConfig,
    PressureController,
    Request,
    Scheduler,
    Signals,
    SwapCost,
)
from kvcore.tiers import HostTier, Mover
from kvcore.tiny import TinyDecoder, TinyEngine

MODEL = TinyDecoder(1, "fp16")


def optimistic() -> OutputLengthEstimator:
    """An estimator that believes answers are 1 token long: admission over-commits, decode preempts."""
    est = OutputLengthEstimator(0.5, min_samples=1)
    est.observe("default", 1)
    return est


def serve(
    sched: Scheduler, engine: TinyEngine | None, requests: list[Request], max_steps: int = 5000
) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Submit everything, step until idle; the tokens each request generated and how it ended."""
    outs: dict[int, list[int]] = {r.request_id: [] for r in requests}
    ended: dict[int, str] = {}
    for r in requests:
        try:
            sched.submit(r, 0.0)
        except RequestRejected as e:
            ended[r.request_id] = e.reason
    steps = 0
    while sched.has_work():
        plan = sched.step(float(steps))
        assert plan.num_batched_tokens <= sched.max_num_batched_tokens
        if sched.long_prefill_token_threshold is not None:
            assert (plan.num_tokens[plan.is_prefill] <= sched.long_prefill_token_threshold).all()
        assert len(set(plan.request_ids.tolist())) == plan.batch_size
        if engine is not None:
            toks = engine.forward(plan)
        else:
            toks = {int(r): 1 for r in plan.request_ids[plan.sample]}
        for rid, t in toks.items():
            outs[rid].append(t)
        sched.cache._check_invariants()
        for ev in plan.events:
            if ev.kind == "finished":
                ended[ev.request_id] = ev.detail["reason"]
            elif ev.kind == "rejected":
                ended[ev.request_id] = ev.detail["reason"]
        for ev in [*sched.update(plan, toks)]:
            ended[ev[0]] = ev[1]
        steps += 1
        assert steps < max_steps, "the scheduler made no progress"
    for ev in sched.take_events():
        if ev.kind in ("finished", "rejected"):
            ended[ev.request_id] = ev.detail.get("reason", "")
    return outs, ended


def tiny_setup(
    num_pages: int, page_size: int, swap: bool
) -> tuple[kvcore.KVCacheManager, TinyEngine, Mover | None]:
    pool = TinyEngine.make_pool(MODEL, num_pages, page_size)
    if swap:
        host = HostTier(pool, 256)
        m = kvcore.KVCacheManager(num_pages, page_size, lower_tiers=[host])
        mover = Mover(m, pool, [host])
        return m, TinyEngine(MODEL, pool, mover), mover
    return kvcore.KVCacheManager(num_pages, page_size), TinyEngine(MODEL, pool), None


def prompts(seed: int, n: int, shared: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 64, shared).tolist()
    return [head + rng.integers(0, 64, int(rng.integers(3, 18))).tolist() for _ in range(n)]


@pytest.mark.parametrize(
    ("num_pages", "swap", "budget", "preempts"),
    [
        (200, False, 32, False),  # room for all: no preemption
        (200, False, 5, False),  # chunked prefill: 5 tokens a step
        (12, False, 32, True),  # recompute preemption
        (12, True, 32, True),  # swap preemption through a host tier
        (10, True, 7, True),  # both, with chunks
    ],
)
def test_outputs_equal_uninterrupted_generation(
    num_pages: int, swap: bool, budget: int, preempts: bool
) -> None:
    m, engine, _mover = tiny_setup(num_pages, 4, swap)
    cost = SwapCost(page_bytes=1 << 16, prefill_tokens_per_s=100.0, bandwidth_gbps=25.0) if swap else None
    sched = Scheduler(m, max_num_batched_tokens=budget, max_num_seqs=8, swap=cost, estimator=optimistic())
    ps = prompts(3, 6, shared=5)
    reqs = [Request(i, p, max_new_tokens=10) for i, p in enumerate(ps)]
    outs, ended = serve(sched, engine, reqs)
    assert ended == dict.fromkeys(range(6), "length")
    for i, p in enumerate(ps):
        assert outs[i] == MODEL.generate_no_cache(p, 10), f"request {i}"
    s = sched.stats()
    assert (s.num_preemptions > 0) == preempts
    if swap and preempts:
        assert s.preemptions_by_kind["swap"] > 0
        assert m.tier_stats()["host"]["num_loaded_pages"] > 0  # resumed from the host copies
    if not swap and preempts:
        assert s.preemptions_by_kind["recompute"] > 0 and s.recomputed_tokens > 0
    assert 0.0 <= s.preemption_tax < 1.0
    assert s.generated_tokens == 60 and s.num_finished == 6
    assert len(m) == 0 and m.stats().num_pages_in_use == 0


def test_recompute_is_chosen_when_swap_costs_more() -> None:
    m, engine, _ = tiny_setup(12, 4, True)
    slow = SwapCost(page_bytes=1 << 30, prefill_tokens_per_s=1e9, bandwidth_gbps=1.0)
    sched = Scheduler(m, max_num_batched_tokens=32, swap=slow, estimator=optimistic())
    ps = prompts(3, 6, shared=5)
    outs, _ = serve(sched, engine, [Request(i, p, max_new_tokens=10) for i, p in enumerate(ps)])
    s = sched.stats()
    assert s.preemptions_by_kind == {"swap": 0, "recompute": s.num_preemptions} and s.num_preemptions > 0
    assert all(outs[i] == MODEL.generate_no_cache(p, 10) for i, p in enumerate(ps))


def test_a_conservative_admission_does_not_preempt() -> None:
    """Before it has seen any answer, the estimator plans for max_new_tokens: no preemption."""
    m, engine, _ = tiny_setup(12, 4, False)
    sched = Scheduler(m, max_num_batched_tokens=32)
    ps = prompts(3, 6, shared=5)
    _outs, ended = serve(sched, engine, [Request(i, p, max_new_tokens=10) for i, p in enumerate(ps)])
    assert sched.stats().num_preemptions == 0 and set(ended.values()) == {"length"}


def test_stop_tokens_and_finish_end_requests_anywhere() -> None:
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m, max_num_batched_tokens=8, max_num_seqs=2)
    for i in range(4):
        sched.submit(Request(i, [1, 2, 3, 4, 5], max_new_tokens=50, stop_token_ids=frozenset({9})), 0.0)
    plan = sched.step(0.0)
    running = sorted(set(plan.request_ids.tolist()))
    assert running == [0, 1]
    sched.finish(3, "abort")  # still queued
    ended = sched.update(plan, {0: 9, 1: 4})  # 0 samples its stop token
    assert ended == [(0, "stop")]
    sched.finish(1, "abort", 1.0)  # running
    with pytest.raises(UnknownSequenceError):
        sched.finish(1)
    plan = sched.step(2.0)
    assert plan.request_ids.tolist() == [2]
    assert 0 not in m and 1 not in m and 3 not in m
    s = sched.stats()
    assert s.finished_by_reason == {"stop": 1, "abort": 2} and s.num_waiting == 0


def test_rejections_carry_their_reason_status_and_pages() -> None:
    m = kvcore.KVCacheManager(11, 4)  # 10 usable pages: 40 tokens
    sched = Scheduler(m, max_queued_requests=2, max_queue_wait_s=5.0)
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(1, list(range(40)), max_new_tokens=4))
    assert (e.value.reason, e.value.http_status, e.value.retry_after_s) == ("too_large", 503, None)
    assert e.value.needed_pages == 11 and e.value.request_id == 1
    assert isinstance(e.value, kvcore.KVCoreError)
    copy = pickle.loads(pickle.dumps(e.value))
    assert (copy.reason, copy.needed_pages, str(copy)) == ("too_large", 11, str(e.value))
    sched.submit(Request(2, [1, 2], max_new_tokens=4))
    sched.submit(Request(3, [1, 2], max_new_tokens=4))
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(4, [1, 2], max_new_tokens=4))
    assert (e.value.reason, e.value.http_status) == ("queue_full", 429)
    assert e.value.retry_after_s is not None and e.value.retry_after_s > 0
    with pytest.raises(InvalidArgumentError):
        sched.submit(Request(2, [1], max_new_tokens=1))  # live already
    assert sched.num_waiting == 2 and len(m) == 0  # refused work cost the cache nothing


def test_a_request_that_waits_too_long_is_refused_in_the_plan() -> None:
    m = kvcore.KVCacheManager(9, 4)  # 8 pages
    sched = Scheduler(m, max_queue_wait_s=2.0, max_num_batched_tokens=64)
    sched.submit(Request(1, list(range(20)), max_new_tokens=12), 0.0)  # 8 pages with its answer
    sched.submit(Request(2, list(range(50, 60)), max_new_tokens=2), 0.0)
    plan = sched.step(0.0)
    assert plan.request_ids.tolist() == [1]  # 2 would not fit beside 1's expected answer
    sched.update(plan, {1: 7})
    plan = sched.step(3.0)
    assert [(e.request_id, e.reason, e.http_status) for e in plan.rejected] == [(2, "timeout", 503)]
    assert sched.stats().rejected_by_reason == {"timeout": 1}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_pages=st.integers(4, 40),
    page_size=st.sampled_from([1, 2, 4, 16]),
    budget=st.integers(1, 48),
    cap=st.integers(1, 6),
    queue=st.sampled_from(["fcfs", "priority"]),
    lens=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 20), st.integers(0, 2)), min_size=1, max_size=12
    ),
    quantile=st.sampled_from([0.3, 0.95]),
    chunk=st.one_of(st.none(), st.integers(1, 16)),
)
def test_every_request_is_served_or_refused_and_the_cache_ends_empty(
    num_pages: int,
    page_size: int,
    budget: int,
    cap: int,
    queue: str,
    lens: list,
    quantile: float,
    chunk: int | None,
) -> None:
    m = kvcore.KVCacheManager(num_pages, page_size)
    est = OutputLengthEstimator(quantile, min_samples=1)
    sched = Scheduler(
        m,
        max_num_batched_tokens=budget,
        max_num_seqs=cap,
        queue=queue,
        estimator=est,
        long_prefill_token_threshold=chunk,
    )
    reqs = [
        Request(i, [(i * 7 + j) % 50 for j in range(n)], max_new_tokens=o, priority=p)
        for i, (n, o, p) in enumerate(lens)
    ]
    outs, ended = serve(sched, None, reqs)
    assert set(ended) == set(range(len(reqs)))  # none lost
    s = sched.stats()
    assert s.num_finished + s.num_rejected == len(reqs) == s.num_submitted
    for r in reqs:
        if ended[r.request_id] == "length":
            assert len(outs[r.request_id]) == r.max_new_tokens
    assert len(m) == 0 and m.stats().num_pages_in_use == 0


def test_priority_queue_admits_the_highest_first_and_preempts_the_lowest() -> None:
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m, max_num_seqs=1, queue="priority")
    for rid, prio in [(1, 0), (2, 5), (3, 1)]:
        sched.submit(Request(rid, [rid, 1, 2], max_new_tokens=1, priority=prio))
    order = []
    while sched.has_work():
        plan = sched.step()
        order += plan.request_ids.tolist()
        sched.update(plan, {int(r): 0 for r in plan.request_ids[plan.sample]})
    assert order == [2, 3, 1]
    # Victims: lowest priority first, then the youngest.
    m = kvcore.KVCacheManager(9, 2)
    sched = Scheduler(m, max_num_seqs=4, estimator=optimistic())
    for rid, prio in [(1, 1), (2, 0), (3, 0), (4, 2)]:
        sched.submit(Request(rid, [rid, 9, 9], max_new_tokens=20, priority=prio))
    preempted = []
    for t in range(40):
        plan = sched.step(float(t))
        preempted += [e.request_id for e in plan.events if e.kind == "preempted"]
        sched.update(plan, {int(r): 0 for r in plan.request_ids[plan.sample]})
        if preempted:
            break
    assert preempted[0] == 3  # priority 0, admitted after 2


def test_tenant_ceiling_and_floor() -> None:
    """A noisy tenant's running requests stay under its ceiling; a quiet tenant's floor stays
    available to it however many noisy requests wait."""
    m = kvcore.KVCacheManager(41, 4)  # 40 pages
    sched = Scheduler(
        m, max_num_batched_tokens=4096, tenant_max_pages={"noisy": 20}, tenant_min_pages={"quiet": 12}
    )
    for i in range(20):
        sched.submit(Request(i, [i % 7, 1, 2, 3, 4, 5, 6, 7], max_new_tokens=8, namespace="noisy"))
    plan = sched.step(0.0)
    held = sum(len(m.seq_pages(int(r))) for r in plan.request_ids)
    assert held <= 20 and len(plan.request_ids) > 0
    for i in range(100, 103):
        sched.submit(Request(i, list(range(8)), max_new_tokens=8, namespace="quiet"))
    sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
    plan = sched.step(1.0)
    assert {100, 101, 102} <= set(plan.request_ids.tolist())  # within its floor: admitted at once
    sched2 = Scheduler(kvcore.KVCacheManager(41, 4), tenant_min_pages={"quiet": 30})
    for i in range(10):
        sched2.submit(Request(i, list(range(8)), max_new_tokens=8, namespace="noisy"))
    plan = sched2.step(0.0)
    # 40 pages, 30 of them the quiet tenant's floor: 10 pages for noisy requests of 4 pages each.
    assert sum(len(sched2.cache.seq_pages(int(r))) for r in plan.request_ids) <= 10


def test_update_checks_its_tokens() -> None:
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m)
    sched.submit(Request(1, [1, 2, 3], max_new_tokens=3))
    plan = sched.step()
    with pytest.raises(InvalidArgumentError):
        sched.update(plan, {})
    with pytest.raises(InvalidArgumentError):
        sched.update(plan, [1, 2])
    with pytest.raises(InvalidArgumentError):
        sched.update(plan, {1: -1})
    assert sched.update(plan, {1: 5}) == [] and sched.request_tokens(1) == [1, 2, 3, 5]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Request(-1, [1], 1),
        lambda: Request(1, [], 1),
        lambda: Request(1, [[1]], 1),
        lambda: Request(1, [-1], 1),
        lambda: Request(1, [2**32], 1),
        lambda: Request(1, [1.5], 1),
        lambda: Request(1, [1], 0),
        lambda: Request(1, [1], 1, window=2, sink_tokens=4),
        lambda: Request(True, [1], 1),
    ],
)
def test_bad_requests_are_refused(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError):
        bad()


# ----- the estimator and the controller ------------------------------------------------------------


def test_estimator_quantiles_follow_numpy_over_its_window() -> None:
    rng = np.random.default_rng(0)
    est = OutputLengthEstimator(0.9, window=100, min_samples=10)
    data = rng.integers(1, 500, 400).tolist()
    assert est.expected("chat", 300) == 300  # nothing seen: max_new_tokens
    assert est.expected("chat", 10_000) == 4096  # ... clipped
    for i, x in enumerate(data):
        est.observe("chat", x)
        if i >= 9:
            window = data[max(0, i - 99) : i + 1]
            assert est.quantile_of("chat") == int(np.quantile(window, 0.9, method="inverted_cdf"))
    q = est.quantile_of("chat")
    assert q is not None
    assert est.expected("chat", 10_000, generated=q + 5) == q + 6  # running past its plan
    assert est.expected("chat", 3) == 3  # never above max_new_tokens
    assert est.quantile_of("other") is None


def test_controller_escalates_in_order_with_hysteresis() -> None:
    c = PressureController(PressureConfig(escalate_after=2, relax_after=3))
    high, mid, low = Signals(0.95, 0, 0.0), Signals(0.85, 0, 0.0), Signals(0.5, 0, 0.0)
    levels = [c.observe(high, 100).level for _ in range(12)]
    assert levels == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5]
    d = c.observe(high, 100)
    assert d.running_cap == 75 and d.evict_to_free == 0.05 and d.truncate and d.refuse_long_tokens == 8192
    assert d.scale_out_pages is not None
    assert [c.observe(mid, 10).level for _ in range(5)] == [5] * 5  # between the thresholds: no change
    # Memory relaxes one level per relax period; refusing stops once it has come down a level.
    assert [c.observe(low, 10).level for _ in range(6)] == [5, 5, 2, 2, 2, 1]
    assert c.counts["shrink_batch"] == {"usage": 1} and c.counts["refuse"] == {"usage": 1}
    assert c.counts["scale_out"] == {"usage": 1}
    # The queue track never shrinks the batch: it refuses (load shedding), then signals scale-out.
    c2 = PressureController(PressureConfig(escalate_after=1, relax_after=2))
    assert c2.observe(Signals(0.1, 3, 0.0), 8).trigger == "failed_reservations"
    d = c2.observe(Signals(0.1, 0, 9.0), 8)
    assert (d.level, d.refuse_all, d.running_cap) == (4, True, 6)
    assert c2.observe(Signals(0.1, 0, 9.0), 8).level == 5
    assert c2.observe(Signals(0.1, 0, 3.0), 8).refuse_all is False  # under high: new requests queue
    levels = [c2.observe(Signals(0.1, 0, 0.5), 8).level for _ in range(4)]
    assert levels == [5, 0, 0, 0]  # queue low for 2 readings: refusals stop (memory relaxed already)
    assert c2.counts == {
        "shrink_batch": {"failed_reservations": 1},
        "refuse": {"queue_wait": 1},
        "scale_out": {"queue_wait": 1},
    }
    # Time-based hysteresis: high readings must span escalate_after_s of the caller's clock.
    c3 = PressureController(PressureConfig(escalate_after=1, escalate_after_s=2.0))
    assert [c3.observe(Signals(0.95, 0, 0.0), 1, now=t).level for t in (0.0, 1.0, 2.5)] == [0, 0, 1]


def test_the_scheduler_applies_the_controller() -> None:
    m = kvcore.KVCacheManager(33, 4)  # 32 pages
    ctl = PressureController(
        PressureConfig(
            escalate_after=1, relax_after=1000, long_request_tokens=16, usage_high=0.5, usage_low=0.3
        )
    )
    sched = Scheduler(m, controller=ctl, max_num_batched_tokens=4096, estimator=optimistic())
    for i in range(6):
        sched.submit(Request(i, [i, *range(1, 12)], max_new_tokens=40))
    levels = []
    for t in range(60):
        plan = sched.step(float(t))
        levels.append(plan.level)
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        if plan.level >= 4:
            break
    assert levels[-1] >= 4 and levels == sorted(levels)
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(99, list(range(20)), max_new_tokens=4), float(t))
    assert (e.value.reason, e.value.http_status) == ("overloaded", 503)
    sched.submit(Request(98, list(range(10)), max_new_tokens=4), float(t))  # short: queued
    # Truncation at level 3+: an opted-in long prompt is admitted cut to its window.
    sched.submit(Request(97, list(range(15)), max_new_tokens=1, window=8, sink_tokens=2), float(t))
    while sched.has_work():
        t += 1
        plan = sched.step(float(t))
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        assert t < 2000
    s = sched.stats()
    assert s.num_truncated == 1
    assert ctl.counts["shrink_batch"] and ctl.counts["evict_harder"]


def test_a_lower_tier_full_of_cached_copies_is_not_pressure() -> None:
    """A cache tier is full in steady state: its evictable copies must not drive the controller up
    (it pinned the running cap at 1 with HBM empty); slots held by transfers in flight do."""
    m = kvcore.KVCacheManager(201, 4, lower_tiers=[("host", 8)], store_policy="all")
    sched = Scheduler(m, max_num_batched_tokens=256, max_num_seqs=16, controller=PressureController())
    rng = np.random.default_rng(0)
    levels, full = [], 0
    for step in range(300):
        if step < 250 and step % 2 == 0:
            sched.submit(Request(step, rng.integers(0, 1000, 12), max_new_tokens=4), step * 0.1)
        plan = sched.step(step * 0.1)
        levels.append(plan.level)
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        _complete(m)
        ts = m.tier_stats()["host"]
        full += ts["num_slots_cached"] == ts["num_slots"]
    assert full > 200  # the tier was full of cached copies for most of the run
    assert max(levels) == 0 and not sched.controller.counts
    s = sched.stats()
    assert s.num_finished == 125 and s.num_rejected == 0
    # Stores the engine never completes hold their slots: that is pressure, and it is read.
    held = kvcore.KVCacheManager(201, 4, lower_tiers=[("host", 8)], store_policy="all")
    ctl = PressureController(PressureConfig(escalate_after=1))
    sched = Scheduler(held, max_num_batched_tokens=256, controller=ctl)
    for i in range(4):
        sched.submit(Request(i, rng.integers(0, 1000, 12), max_new_tokens=4))
    for step in range(6):
        plan = sched.step(float(step))
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
    ts = held.tier_stats()["host"]
    assert ts["num_slots_in_flight"] == ts["num_slots"]
    assert ctl.level >= 1 and "tier_usage" in ctl.counts.get("shrink_batch", {})


def test_past_the_preemption_budget_new_requests_wait() -> None:
    """With max_preemption_tax=0, the first recompute stops new admissions while anything runs (the
    tax never falls back to 0 here): each queued request starts alone, once the running ones are done."""
    m = kvcore.KVCacheManager(12, 4)
    sched = Scheduler(m, max_num_batched_tokens=32, estimator=optimistic(), max_preemption_tax=0.0)
    ps = prompts(3, 6, shared=5)
    for i, p in enumerate(ps):
        sched.submit(Request(i, p, max_new_tokens=10))
    admitted_after_tax: list[int] = []
    t = 0
    while sched.has_work():
        taxed = sched.stats().preemption_tax > 0
        busy = bool(sched.running_ids)
        plan = sched.step(float(t))
        if taxed and busy:
            admitted_after_tax += [
                e.request_id for e in plan.events if e.kind == "admitted" and not e.detail["resumed"]
            ]
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        t += 1
        assert t < 5000
    s = sched.stats()
    assert s.num_preemptions > 0 and s.preemption_tax > 0
    assert admitted_after_tax == []
    assert s.num_finished == 6  # the waiting ones still ran, once nothing else was running


def test_events_cover_every_decision() -> None:
    m = kvcore.KVCacheManager(12, 4)
    sched = Scheduler(m, max_num_batched_tokens=32, estimator=optimistic())
    for i, p in enumerate(prompts(3, 6, shared=5)):
        sched.submit(Request(i, p, max_new_tokens=10))
    kinds: dict[str, int] = {}
    for ev in sched.take_events():
        kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    t = 0
    while sched.has_work():
        plan = sched.step(float(t))
        for ev in plan.events:
            kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        t += 1
    for ev in sched.take_events():
        kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    s = sched.stats()
    assert kinds["queued"] == 6 and kinds["finished"] == 6
    assert kinds["preempted"] == s.num_preemptions > 0
    assert kinds["admitted"] == 6 + s.num_preemptions  # every resume is an admission again


def test_store_policy_can_be_read_and_replaced() -> None:
    m = kvcore.KVCacheManager(20, 4, lower_tiers=[("host", 8)], store_policy="value")
    name, options = m.store_policy
    assert name == "value" and options["page_bytes"] > 0
    m.set_store_policy("selective", {"min_hits": 4})
    assert m.store_policy == ("selective", {"min_hits": 4, "min_priority": 2**31 - 1})
    with pytest.raises(InvalidArgumentError):
        m.set_store_policy("value", {"prior_misses": 0.0})
    with pytest.raises(InvalidArgumentError):
        m.set_store_policy("fifo")
    assert m.store_policy[0] == "selective"  # a refused policy changed nothing
    m.set_store_policy(name, options)
    assert m.store_policy == (name, options)


def test_evict_harder_makes_stores_more_selective_and_restores_them() -> None:
    m = kvcore.KVCacheManager(33, 4, lower_tiers=[("host", 64)], store_policy="all")
    ctl = PressureController(
        PressureConfig(escalate_after=1, relax_after=3, usage_high=0.5, usage_low=0.3, max_level=2)
    )
    sched = Scheduler(m, controller=ctl, max_num_batched_tokens=4096)
    for i in range(4):
        sched.submit(Request(i, [i, *range(1, 16)], max_new_tokens=4))
    seen: list[str] = []
    t = 0
    while sched.has_work() or t < 60:
        plan = sched.step(float(t))
        seen += [e.detail["policy"] for e in plan.events if e.kind == "store_policy"]
        if plan.level >= 2:
            assert m.store_policy == ("selective", {"min_hits": 3, "min_priority": 2**31 - 1})
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
        t += 1
        b = m.take_transfers()  # no bytes move here: every transfer simply succeeds
        if b:
            m.complete_transfers(np.unique(b.store_ops).tolist() + b.load_ops.tolist(), True)
    assert seen == ["selective", "all"] and m.store_policy == ("all", {})
    assert ctl.counts["evict_harder"] == {"usage": 1}


def test_generated_pages_are_cached_as_they_fill() -> None:
    """Decode rows commit each page their tokens fill: a finished request's prompt and answer are in
    the prefix cache up to the last full page, and a follow-up turn hits all of it."""
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m)
    prompt = list(range(10, 17))  # 7 tokens
    sched.submit(Request(1, prompt, max_new_tokens=10))
    answer: list[int] = []
    while sched.has_work():
        plan = sched.step()
        toks = {int(r): 40 + len(answer) for r in plan.request_ids[plan.sample]}
        answer += list(toks.values())
        sched.update(plan, toks)
    full = prompt + answer  # 17 tokens; the last sampled one was never computed
    assert len(answer) == 10
    assert m.peek_prefix_len(full) == (len(full) - 1) // 4 * 4  # 16: every page the steps filled


class _SlowScheduler(Scheduler):
    """The reference: the same scheduler with its steady-state decode cache switched off."""

    def update(self, plan, new_tokens):  # type: ignore[no-untyped-def]
        out = super().update(plan, new_tokens)
        self._dec_cache = None
        return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(seed=5, num_pages=19, budget=5, aborts=[], stops="some")  # a stop and a length in one step
@example(seed=5, num_pages=40, budget=40, aborts=[], stops="all")
@example(seed=7, num_pages=40, budget=40, aborts=[2], stops="late")
@given(
    seed=st.integers(0, 10**6),
    num_pages=st.integers(6, 40),
    budget=st.integers(1, 40),
    aborts=st.lists(st.integers(0, 11), max_size=3),
    stops=st.sampled_from(["some", "all", "two", "late"]),
)
def test_the_fast_decode_path_plans_exactly_what_the_reference_does(
    seed: int, num_pages: int, budget: int, aborts: list[int], stops: str
) -> None:
    """Plans (rows, starts, slots, tables), events and answers of the scheduler equal those of the same
    scheduler without its steady-state shortcut, step by step, through preemptions, stop tokens and
    aborts between a step and its update. Stop sets: on some requests, one set on all (the shortcut
    checks it on every row at once), two sets, or one set until requests with another join."""
    rng = np.random.default_rng(seed)
    stop_of = {
        "some": lambda i: frozenset({29}) if i % 3 == 0 else frozenset(),
        "all": lambda i: frozenset({29}),
        "two": lambda i: frozenset({29}) if i % 2 else frozenset({27, 29}),
        "late": lambda i: frozenset({29}) if i < 7 else frozenset({28}),
    }[stops]
    reqs = [
        Request(
            i,
            rng.integers(0, 30, int(rng.integers(1, 25))).tolist(),
            max_new_tokens=int(rng.integers(1, 30)),
            stop_token_ids=stop_of(i),
            priority=int(rng.integers(0, 2)),
            request_class="default" if i % 4 else "new",  # a class without a quantile yet
        )
        for i in range(12)
    ]
    runs = []
    for cls in (Scheduler, _SlowScheduler):
        m = kvcore.KVCacheManager(num_pages, 2)
        sched = cls(m, max_num_batched_tokens=budget, max_num_seqs=6, estimator=optimistic())
        for r in reqs:
            try:
                sched.submit(r)
            except RequestRejected:
                pass
        trace = []
        tok_rng = np.random.default_rng(seed + 1)
        t = 0
        while sched.has_work():
            plan = sched.step(float(t))
            events = [(e.kind, e.request_id) for e in plan.events]
            arrays = [
                plan.request_ids,
                plan.starts,
                plan.num_tokens,
                plan.sample,
                plan.q_indptr,
                plan.token_ids,
                plan.positions,
                plan.slot_mapping,
                *plan.page_table,
            ]
            trace.append(([(a.dtype.str, a.tolist()) for a in arrays], events))
            if sched._dec_used is not None:  # the admission's room for the decoding requests' answers
                expected = 0
                for r in sched._decoding.values():  # their counts lag their tokens: a synced copy
                    r = copy.copy(r)
                    r.generated = len(r.tokens) - r.base
                    expected += sched._expected_extra_pages(r)
                assert sched._decode_promised(sched._dec_used) == expected
            if t in aborts:
                live = [rid for rid in plan.request_ids.tolist() if rid in sched._reqs]
                if live:
                    sched.finish(live[0], "abort")
            toks = tok_rng.integers(0, 30, int(plan.sample.sum()))
            trace.append(sched.update(plan, toks))
            m._check_invariants()
            t += 1
            assert t < 3000
        trace.append(sorted(sched.stats().to_dict().items()))
        runs.append(trace)
    assert runs[0] == runs[1]


def test_cap_pins_shortens_only_the_pins_that_outlive_the_cap() -> None:
    now = [100.0]
    m = kvcore.KVCacheManager(33, 4, clock=lambda: now[0])
    for base in (0, 100):
        m.add_sequence(base, list(range(base, base + 8)))
        m.free_sequence(base)
    assert m.pin(list(range(0, 8)), 1000.0) == 2
    assert m.pin(list(range(100, 108)), 5.0) == 2
    assert m.cap_pins(30.0) == 1  # only the 1,000 s pin outlives 30 s
    now[0] += 10.0
    assert m.stats().num_pages_pinned == 2  # the 5 s pin is gone, the capped one holds
    now[0] += 25.0  # 35 s on: the 1,000 s pin, capped to 30 s, has expired too
    assert m.stats().num_pages_pinned == 0
    m._check_invariants()
    with pytest.raises(InvalidArgumentError):
        m.cap_pins(-1.0)


def test_evict_harder_caps_the_caches_pins() -> None:
    now = [0.0]
    m = kvcore.KVCacheManager(33, 4, clock=lambda: now[0])
    m.add_sequence(99, list(range(500, 516)))
    m.free_sequence(99)
    assert m.pin(list(range(500, 516)), 10_000.0) == 4
    ctl = PressureController(
        PressureConfig(
            escalate_after=1, relax_after=1000, usage_high=0.3, usage_low=0.1, max_level=2, pin_ttl_cap_s=5.0
        )
    )
    sched = Scheduler(m, controller=ctl, max_num_batched_tokens=4096)
    for i in range(4):
        sched.submit(Request(i, [i, *range(1, 16)], max_new_tokens=20))
    kinds: list[str] = []
    for t in range(8):
        now[0] = float(t)
        plan = sched.step(now[0])
        kinds += [e.kind for e in plan.events]
        sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]})
    assert "pins_capped" in kinds
    now[0] = 20.0
    assert m.stats().num_pages_pinned == 0  # the 10,000 s pin ended within 5 s of the cap


def test_a_plan_recorded_twice_changes_nothing_the_second_time() -> None:
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m)
    sched.submit(Request(1, [1, 2, 3], max_new_tokens=5))
    sched.submit(Request(2, [4, 5, 6], max_new_tokens=5))
    for step in range(4):  # a prefill, then decode steps: the steady path from the third step
        plan = sched.step()
        sched.update(plan, np.full(int(plan.sample.sum()), 8))
        before = [(sched.request_tokens(r), sched.num_generated(r), m.seq_len(r)) for r in (1, 2)]
        assert sched.update(plan, np.full(int(plan.sample.sum()), 9)) == []
        after = [(sched.request_tokens(r), sched.num_generated(r), m.seq_len(r)) for r in (1, 2)]
        assert after == before, f"step {step}"
    m._check_invariants()


def test_long_prefill_token_threshold_chunks_each_prompt() -> None:
    """With a budget that would take both prompts whole, each request still computes at most the
    threshold per step, and samples only with its prompt's last chunk."""
    m = kvcore.KVCacheManager(64, 4)
    sched = Scheduler(m, max_num_batched_tokens=1000, long_prefill_token_threshold=16)
    sched.submit(Request(1, list(range(40)), max_new_tokens=2))
    sched.submit(Request(2, list(range(100, 120)), max_new_tokens=2))
    rows = []
    while sched.has_work():
        plan = sched.step()
        cols = (plan.request_ids.tolist(), plan.num_tokens.tolist(), plan.sample.tolist())
        rows.append(list(zip(*cols, strict=True)))
        sched.update(plan, {int(r): 7 for r in plan.request_ids[plan.sample]})
    assert rows[:3] == [
        [(1, 16, False), (2, 16, False)],
        [(1, 16, False), (2, 4, True)],
        [(2, 1, True), (1, 8, True)],  # decode rows lead the plan
    ]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(kvcore.ConfigError):
            Scheduler(m, long_prefill_token_threshold=bad)  # type: ignore[arg-type]


def test_prefix_lookup_runs_before_each_admission_only() -> None:
    """The lookup hook sees each admitted request's tokens and namespace just before its add_sequence
    (the sequence does not exist yet), and never runs for a request that waits for memory."""
    m = kvcore.KVCacheManager(9, 4)  # 8 pages
    calls: list[tuple[int, str | None, bool]] = []

    def lookup(tokens: np.ndarray, namespace: str | None) -> None:
        rid = int(tokens[0])  # the test's prompts start with their request id
        calls.append((rid, namespace, rid in m))

    sched = Scheduler(m, max_num_batched_tokens=64, prefix_lookup=lookup)
    sched.submit(Request(1, [1, *range(20, 39)], max_new_tokens=8, namespace="a"))  # 7 pages with its answer
    sched.submit(Request(2, [2, *range(50, 59)], max_new_tokens=2))  # waits: 3 pages
    steps = 0
    while sched.has_work():
        plan = sched.step(float(steps))
        if steps < 8:
            assert calls == [(1, "a", False)], steps  # 2 waited all along, without lookups
        sched.update(plan, {int(r): 7 for r in plan.request_ids[plan.sample]})
        steps += 1
    assert calls == [(1, "a", False), (2, None, False)]
    with pytest.raises(kvcore.ConfigError):
        Scheduler(m, prefix_lookup=42)  # type: ignore[arg-type]


def test_admitted_events_carry_the_uncapped_hbm_prefix() -> None:
    """A page-aligned prompt found whole in HBM: its hit is capped at len - 1 (the last page is
    computed again, for its logits), its hbm_prefix_tokens are all of it."""
    m = kvcore.KVCacheManager(33, 4)
    sched = Scheduler(m)
    prompt = list(range(16))
    for rid in (1, 2):
        sched.submit(Request(rid, prompt, max_new_tokens=1))
        plan = sched.step()
        (ev,) = [e for e in plan.events if e.kind == "admitted"]
        sched.update(plan, {rid: 5})
        if rid == 1:
            assert (ev.detail["hit_tokens"], ev.detail["hbm_prefix_tokens"]) == (0, 0)
    assert (ev.detail["hit_tokens"], ev.detail["hbm_prefix_tokens"], ev.detail["resumed"]) == (12, 16, False)


def test_admission_keeps_room_for_unreserved_prompt_chunks() -> None:
    """A prompt prefilled in chunks reserves its pages a chunk at a time; the pages of its later
    chunks stay promised to it, so a request that arrives meanwhile waits instead of being admitted
    into them (which would preempt one of the two)."""
    m = kvcore.KVCacheManager(11, 4)  # 10 pages
    sched = Scheduler(m, long_prefill_token_threshold=4)
    sched.submit(Request(1, list(range(32)), max_new_tokens=1), 0.0)  # 8 pages, 1 a step
    admitted: dict[int, int] = {}
    step = 0
    while sched.has_work():
        if step == 1:
            sched.submit(Request(2, list(range(100, 108)), max_new_tokens=1), 1.0)  # 2 pages + 1
        plan = sched.step(float(step))
        admitted |= {e.request_id: step for e in plan.events if e.kind == "admitted"}  # type: ignore[misc]
        sched.update(plan, {int(r): 7 for r in plan.request_ids[plan.sample]})
        step += 1
    assert admitted == {1: 0, 2: 8}  # 2 starts once 1 has computed its whole prompt and left
    assert sched.stats().num_preemptions == 0


def test_admission_counts_the_evictable_pages_a_hit_takes() -> None:
    """An admission that hits cached, evictable pages takes them out of the room as well: a second
    admission in the same step sees the room that is really left."""
    m = kvcore.KVCacheManager(11, 4)  # 10 pages
    sched = Scheduler(m, max_num_batched_tokens=256)
    prompt = list(range(24))  # 6 pages
    sched.submit(Request(1, prompt, max_new_tokens=1))
    plan = sched.step()
    sched.update(plan, {1: 7})
    assert m.stats().num_pages_cached == 6
    sched.submit(Request(2, [*prompt, 90, 91, 92, 93], max_new_tokens=4))  # hits 6 pages, 2 more
    sched.submit(Request(3, list(range(200, 212)), max_new_tokens=4))  # 3 pages + 1
    plan = sched.step(1.0)
    assert plan.request_ids.tolist() == [2]  # 10 - 8 pages left for 3's 4: it waits
    t = 2.0
    while sched.has_work():
        sched.update(plan, {int(r): 7 for r in plan.request_ids[plan.sample]})
        plan = sched.step(t)
        t += 1
    assert sched.stats().num_preemptions == 0 and sched.stats().num_finished == 3


def _host_cache(num_pages: int) -> kvcore.KVCacheManager:
    return kvcore.KVCacheManager(num_pages, 4, lower_tiers=[("host", 64)], store_policy="all")


def _complete(m: kvcore.KVCacheManager, *, loads_ok: bool | list[bool] = True) -> int:
    """Complete the queued transfers (no bytes move here); the number of loads."""
    b = m.take_transfers()
    stores = np.unique(b.store_ops).tolist()
    ok = [True] * len(stores) + ([loads_ok] * len(b.load_ops) if isinstance(loads_ok, bool) else loads_ok)
    if stores or len(b.load_ops):
        m.complete_transfers(stores + b.load_ops.tolist(), ok)
    return len(b.load_ops)


def test_a_failed_load_is_computed_after_all() -> None:
    """A request admitted with a host-tier hit waits for its loads; when one fails, the manager cuts
    the hit before it, and the scheduler computes the prompt from there on."""
    m = _host_cache(9)
    sched = Scheduler(m, max_num_batched_tokens=64)
    prompt = list(range(17))
    sched.submit(Request(1, prompt, max_new_tokens=1))
    sched.update(sched.step(), {1: 5})
    _complete(m)  # 1's 4 full pages stored to host
    m.evict(8)
    sched.submit(Request(2, prompt, max_new_tokens=1))
    plan = sched.step(1.0)
    assert [e.kind for e in plan.events] == ["finished", "queued", "admitted", "loading"]
    assert plan.loading == [2] and not plan and sched.stats().hit_tokens == 16
    assert _complete(m, loads_ok=[True, False, True, True]) == 4  # the second page is lost
    plan = sched.step(2.0)
    assert (plan.request_ids.tolist(), plan.starts.tolist(), plan.num_tokens.tolist()) == ([2], [4], [13])
    assert sched.stats().hit_tokens == 4
    assert sched.update(plan, {2: 5}) == [(2, "length")]


def test_a_request_alone_waits_for_loading_ones_rather_than_ending() -> None:
    """The only running request finds no room to grow while another, admitted, still waits for its
    loads and holds pages: it waits (it used to end with reason capacity), and once the other runs,
    the other, the younger, is preempted for it."""
    m = _host_cache(9)  # 8 pages
    sched = Scheduler(m, max_num_batched_tokens=64, estimator=optimistic())
    shared = list(range(100, 116))  # 4 pages, stored to host then evicted from HBM
    sched.submit(Request(9, shared, max_new_tokens=1))
    reasons = dict(sched.update(sched.step(), {9: 5}))
    _complete(m)
    m.evict(8)
    # 1: 2 pages, then grows to 6 (24 tokens); at 6 s it needs its 4th page, which 2 holds.
    sched.submit(Request(1, list(range(8)), max_new_tokens=16), 1.0)
    sched.submit(Request(2, [*shared, 1], max_new_tokens=1), 2.0)  # its 4 pages load, and 1 more
    t = 1.0
    preempted: list[int] = []
    stuck_steps = 0
    while sched.has_work():
        plan = sched.step(t)
        preempted += [e.request_id for e in plan.events if e.kind == "preempted"]  # type: ignore[misc]
        if 6.0 <= t < 12.0:
            assert plan.loading == [2] and not plan  # 1 waits, alone: no row this step
            stuck_steps += 1
        if t >= 12.0:  # 2's loads complete only from here
            _complete(m)
        else:
            m.complete_transfers(np.unique(m.take_transfers(loads=False).store_ops).tolist(), True)
        reasons |= dict(sched.update(plan, {int(r): 5 for r in plan.request_ids[plan.sample]}))
        t += 1.0
        assert t < 200
    assert reasons == {9: "length", 1: "length", 2: "length"}
    assert preempted == [2] and stuck_steps == 6


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(0, 40), max_size=64),
    stop=st.frozensets(st.integers(0, 2**33), min_size=1, max_size=12),
    dtype=st.sampled_from([np.int64, np.uint32, np.int32]),
)
def test_the_stop_token_check_equals_isin(values: list[int], stop: frozenset[int], dtype: type) -> None:
    # the steady decode path's stop check (one comparison per stop id, np.isin past 8 ids), ids past
    # the array's dtype included
    from kvcore.scheduler.core import _in_stop

    arr = np.array(values, dtype=dtype)
    assert np.array_equal(_in_stop(arr, stop), np.isin(arr.astype(np.int64), list(stop)))


def test_a_request_waits_for_the_stores_that_hold_the_pool_instead_of_being_refused() -> None:
    # A 3-page pool (4 less the null page) under write-through: the first request computes 12
    # tokens, and its last page is cached as it finishes; that page's store (queued by update, run
    # in the next forward) keeps it locked a step. The next request needs the whole pool: alone,
    # it fits once the store is taken, so it waits a step; it is not "too_large".
    pool = TinyEngine.make_pool(MODEL, 4, 4)
    host = HostTier(pool, 16)
    m = kvcore.KVCacheManager(4, 4, lower_tiers=[host], store_policy="all")
    engine = TinyEngine(MODEL, pool, Mover(m, pool, [host]))
    sched = Scheduler(m, max_num_batched_tokens=32, max_num_seqs=1)
    ps = [list(range(1, 12)), list(range(20, 29))]
    reqs = [Request(i, p, max_new_tokens=2) for i, p in enumerate(ps)]
    outs, ended = serve(sched, engine, reqs)
    assert ended == {0: "length", 1: "length"}
    assert all(outs[i] == MODEL.generate_no_cache(p, 2) for i, p in enumerate(ps))
    assert sched.stats().rejected_by_reason.get("too_large", 0) == 0


def test_tenants_sharing_public_copies_of_their_recomputed_pages_generate_the_same_tokens() -> None:
    # A public request, then tenants with the same prompts: each tenant hits the public pages of
    # its prompt, recomputes the rest, and reads the public copy of each page it finds there once
    # computed (its own freed). The answers must not change, and nothing leaks past the end.
    m, engine, _ = tiny_setup(64, 4, False)
    ps = prompts(11, 3, shared=6)
    reqs = [Request(i, p, max_new_tokens=9, namespace="*") for i, p in enumerate(ps)]
    reqs += [Request(10 + i, p, max_new_tokens=9, namespace=f"t{i % 2}") for i, p in enumerate(ps)]
    for r in reqs:
        sched = Scheduler(m, max_num_batched_tokens=32, max_num_seqs=1)
        answer = MODEL.generate_no_cache(list(r.prompt), 9)
        sched.submit(r, 0.0)
        out: list[int] = []
        shared = step = 0
        while sched.has_work():
            plan = sched.step(float(step))
            toks = engine.forward(plan)
            out += [t for rid, t in toks.items() if rid == r.request_id]
            assert [e[1] for e in sched.update(plan, toks)] in ([], ["length"])
            step += 1
            if r.request_id in m:
                public = m.match_prefix(list(r.prompt) + answer, "*").pages.tolist()
                shared = max(shared, len(set(public) & set(m.seq_pages(r.request_id).tolist())))
        assert out == answer
        if r.namespace != "*":  # more public pages than its prompt's hit: its copies were swapped
            assert shared > len(r.prompt) // 4
        m._check_invariants()
    assert len(m) == 0 and m.stats().num_pages_in_use == 0
