"""The scheduler under a hostile review: tenant quotas that must never wedge the queue, the one-update-
per-plan contract and a step that raises, arguments the manager would refuse later, and stale plans.
Each test asserts what the scheduler and the manager hold against a model (the quotas' arithmetic, the
tiny decoder's no-cache generation, the prefix cache's contents), never only that a call returned."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcore
from kvcore.exceptions import ConfigError, InvalidArgumentError, RequestRejected, UnknownSequenceError
from kvcore.scheduler import (
    EVENT_KINDS,
    FINISH_REASONS,
    MAX_SEQ_LEN,
    OutputLengthEstimator,
    PressureConfig,
    PressureController,
    Request,
    Scheduler,
    Signals,
    SwapCost,
)
from kvcore.tiny import TinyDecoder, TinyEngine

MODEL = TinyDecoder(1, "fp16")
PS = 4


def pages(num_tokens: int) -> int:
    return -(-num_tokens // PS)


def drive(
    sched: Scheduler, engine: TinyEngine | None = None, t0: float = 0.0, max_steps: int = 2000
) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Step until idle: the tokens each request generated from here, and how each ended."""
    outs: dict[int, list[int]] = {}
    ended: dict[int, str] = {}
    t = t0
    while sched.has_work():
        plan = sched.step(t)
        ended |= {e.request_id: e.reason for e in plan.rejected if e.request_id is not None}
        ended |= dict(plan.finished)
        toks = (
            engine.forward(plan) if engine is not None else {int(r): 1 for r in plan.request_ids[plan.sample]}
        )
        for rid, tok in toks.items():
            outs.setdefault(rid, []).append(tok)
        ended |= dict(sched.update(plan, toks))
        sched.cache._check_invariants()
        t += 1.0
        assert t - t0 < max_steps, "the scheduler made no progress"
    return outs, ended


def tiny(num_pages: int) -> tuple[kvcore.KVCacheManager, TinyEngine]:
    pool = TinyEngine.make_pool(MODEL, num_pages, PS)
    return kvcore.KVCacheManager(num_pages, PS), TinyEngine(MODEL, pool)


def assert_cache_holds_only_real_tokens(m: kvcore.KVCacheManager, tokens: list[int]) -> None:
    """The prefix cache has every page the request's steps filled, for its real tokens (the last
    sampled one was never computed), and nothing for a sequence that differs in its last token."""
    computed = len(tokens) - 1
    assert m.peek_prefix_len(tokens) == computed // PS * PS
    if computed >= PS:
        other = [*tokens[: computed // PS * PS - 1], (tokens[computed // PS * PS - 1] + 1) % 64]
        assert m.peek_prefix_len(other) == (computed // PS - 1) * PS


# ----- 1. tenant quotas never wedge the queue -------------------------------------------------------


def test_a_request_above_its_tenants_ceiling_is_refused_at_submit() -> None:
    m = kvcore.KVCacheManager(33, PS)  # 32 pages
    sched = Scheduler(m, tenant_max_pages={"a": 2})
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(1, list(range(20)), max_new_tokens=4, namespace="a"))  # 6 pages with a token
    assert (e.value.reason, e.value.http_status, e.value.retry_after_s) == ("tenant_quota", 503, None)
    assert e.value.needed_pages == 6 and "ceiling" in str(e.value)
    sched.submit(Request(2, [1, 2, 3], max_new_tokens=2, namespace="b"))
    _, ended = drive(sched)
    assert ended == {2: "length"}
    assert sched.stats().rejected_by_reason == {"tenant_quota": 1} and len(m) == 0


def test_a_request_that_cannot_fit_beside_the_other_tenants_floors_is_refused_at_submit() -> None:
    m = kvcore.KVCacheManager(33, PS)
    sched = Scheduler(m, tenant_min_pages={"b": 30})  # 2 pages left to the others
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(1, list(range(20)), max_new_tokens=4))
    assert (e.value.reason, e.value.retry_after_s) == ("tenant_quota", None) and "floors" in str(e.value)
    sched.submit(Request(2, [1, 2, 3], max_new_tokens=4))  # 2 pages: fits beside the floor
    sched.submit(Request(3, list(range(50, 70)), max_new_tokens=4, namespace="b"))  # b's own floor
    _, ended = drive(sched)
    assert ended == {2: "length", 3: "length"}


@pytest.mark.parametrize(
    "quotas",
    [
        {"tenant_max_pages": {"a": 8}},  # the prediction (100 tokens) is above the ceiling
        {"tenant_min_pages": {"x": 0}},  # any floor: the prediction (200 tokens) is above the cache
        {"tenant_max_pages": {"a": 8}, "tenant_min_pages": {"b": 4}},
    ],
)
def test_a_request_alone_is_admitted_when_its_prompt_fits_the_quotas(quotas: dict[str, Any]) -> None:
    """Its predicted demand is above its tenant's ceiling, or above the cache: with nothing of its
    tenant running (nothing at all, for floors) it is admitted as without quotas, and grows alone."""
    results = []
    for kw in ({}, quotas):
        m = kvcore.KVCacheManager(33, PS)  # 32 pages: 128 tokens
        sched = Scheduler(m, **kw)
        sched.submit(Request(1, list(range(8)), max_new_tokens=200, namespace="a"))
        outs, ended = drive(sched)
        results.append((len(outs[1]), ended))
    assert results[0] == results[1]  # 121 tokens generated, then capacity: the quotas changed nothing
    assert results[1][1] == {1: "capacity"} and results[1][0] == 32 * PS - 8 + 1


def test_the_ceiling_counts_the_pages_a_hit_holds_so_admission_does_not_churn() -> None:
    """Two requests that share a cached prefix each hold it: admitting both by their new pages only
    put the tenant past its ceiling, and the next step preempted the younger, again and again."""
    m = kvcore.KVCacheManager(65, PS)
    sched = Scheduler(m, tenant_max_pages={"a": 12})
    prefix = list(range(16))
    sched.submit(Request(1, prefix, max_new_tokens=1, namespace="a"))
    drive(sched)
    for rid in (2, 3):  # 5 prompt pages (4 of them cached) and 3 for the answer each: 8 pages
        sched.submit(Request(rid, [*prefix, 20 * rid, 21, 22, 23], max_new_tokens=12, namespace="a"))
    t = 10.0
    while sched.has_work():
        plan = sched.step(t)
        live = [int(r) for r in plan.request_ids]
        if len(live) > 1:
            assert sum(len(m.seq_pages(r)) for r in live) <= 12
        sched.update(plan, {int(r): 5 for r in plan.request_ids[plan.sample]})
        t += 1
    assert sched.stats().num_preemptions == 0 and sched.stats().finished_by_reason == {"length": 3}


def test_a_window_not_cut_is_refused_in_the_step_and_a_cut_one_admitted() -> None:
    """Submit judges a windowed prompt by its window when the controller may truncate; a step that
    does not truncate (level 0) finds the whole prompt above the ceiling: refused in plan.rejected.
    Under pressure (level 3) the same request is cut and admitted."""
    m = kvcore.KVCacheManager(65, PS)
    sched = Scheduler(m, tenant_max_pages={"a": 4}, controller=PressureController())
    req = Request(1, list(range(40)), max_new_tokens=1, namespace="a", window=8, sink_tokens=2)
    sched.submit(req)  # 3 pages by its window: accepted
    plan = sched.step(0.0)
    assert [(e.request_id, e.reason, e.retry_after_s) for e in plan.rejected] == [(1, "tenant_quota", None)]
    assert not sched.has_work() and len(m) == 0
    # Without a controller that truncates, submit judges the whole prompt.
    with pytest.raises(RequestRejected, match="tenant_quota"):
        Scheduler(kvcore.KVCacheManager(65, PS), tenant_max_pages={"a": 4}).submit(req)
    # At level 3 the step cuts it to its window: 3 pages with its token, within the ceiling.
    cfg = PressureConfig(usage_high=0.0, usage_low=0.0, escalate_after=1, max_level=3)
    sched = Scheduler(
        kvcore.KVCacheManager(65, PS), tenant_max_pages={"a": 4}, controller=PressureController(cfg)
    )
    for t in range(4):
        sched.step(float(t))
    sched.submit(req, 4.0)
    _, ended = drive(sched, t0=5.0)
    assert ended == {1: "length"} and sched.stats().num_truncated == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_pages=st.integers(4, 40),
    ceiling=st.integers(0, 40),
    floor=st.integers(0, 30),
    reqs=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 60), st.sampled_from([None, "a", "b"])),
        min_size=1,
        max_size=10,
    ),
)
def test_quotas_never_wedge_the_queue(
    num_pages: int, ceiling: int, floor: int, reqs: list[tuple[int, int, str | None]]
) -> None:
    """Random ceilings, floors and requests: every request ends (served, capacity, or refused), a
    tenant_quota refusal is exactly a prompt that can never fit its quotas, and two or more running
    requests of the ceilinged tenant hold at most its ceiling."""
    m = kvcore.KVCacheManager(num_pages, PS)
    usable = num_pages - 1
    floors = {"b": min(floor, usable)}
    sched = Scheduler(m, max_num_batched_tokens=64, tenant_max_pages={"a": ceiling}, tenant_min_pages=floors)
    ended: dict[int, str] = {}
    for i, (n, new, ns) in enumerate(reqs):
        try:
            sched.submit(Request(i, [(i * 7 + j) % 50 for j in range(n)], max_new_tokens=new, namespace=ns))
        except RequestRejected as e:
            ended[i] = e.reason
    t = 0.0
    while sched.has_work():
        plan = sched.step(t)
        ended |= {e.request_id: e.reason for e in plan.rejected if e.request_id is not None}
        ended |= dict(plan.finished)
        mine = [rid for rid in sched.running_ids if reqs[rid][2] == "a"]
        if len(mine) > 1:
            assert sum(len(m.seq_pages(rid)) for rid in mine) <= ceiling
        ended |= dict(sched.update(plan, {int(r): 1 for r in plan.request_ids[plan.sample]}))
        t += 1.0
        assert t < 3000, "wedged"
    assert set(ended) == set(range(len(reqs)))
    for i, (n, _, ns) in enumerate(reqs):
        need = pages(n + 1)
        never = need > usable or (ns == "a" and need > ceiling) or (ns != "b" and need > usable - floors["b"])
        assert (ended[i] in ("too_large", "tenant_quota")) == never, (i, ended[i])
    assert m.stats().num_pages_in_use == 0


@pytest.mark.parametrize(
    "kw",
    [
        {"tenant_max_pages": [1]},
        {"tenant_min_pages": "a"},
        {"tenant_max_pages": {"a": -1}},
        {"tenant_max_pages": {"a": 1.5}},
        {"tenant_min_pages": {"a": True}},
        {"tenant_min_pages": {5: 1}},
        {"tenant_min_pages": {"*": 1}},
        {"tenant_max_pages": {"\ud800": 1}},
        {"tenant_max_pages": {"a": 2**70}},
        {"tenant_min_pages": {"a": 20, "b": 13}},  # 33 > 32 usable pages
        {"tenant_min_pages": {"a": 5}, "tenant_max_pages": {"a": 4}},
    ],
)
def test_bad_quotas_are_refused_before_anything_is_set(kw: dict[str, Any]) -> None:
    m = kvcore.KVCacheManager(33, PS)
    with pytest.raises(ConfigError):
        Scheduler(m, **({"tenant_max_pages": {"ok": 3}, "tenant_min_pages": {"ok": 1}} | kw))
    assert m.tenant_quotas() == []  # no floor or ceiling reached the cache
    Scheduler(m, tenant_min_pages={"a": 16, "b": 16}, tenant_max_pages={None: 0})  # exactly usable: fine


# ----- 2. one update per plan; a step that raises ---------------------------------------------------


def test_step_refuses_until_the_last_plan_is_recorded() -> None:
    """Planning again before update appended the sampled token twice and committed pages with the
    wrong tokens; now the second step raises and changes nothing, and the plan stays valid."""
    m, engine = tiny(33)
    sched = Scheduler(m)
    prompt = [1, 2, 3, 4, 5]
    sched.submit(Request(1, prompt, max_new_tokens=10))
    out: list[int] = []
    plan = sched.step(0.0)
    toks = engine.forward(plan)
    out += toks.values()
    sched.update(plan, toks)
    plan = sched.step(1.0)
    before = (sched.request_tokens(1), m.seq_len(1), m.stats().num_pages_in_use)
    for t in (2.0, 3.0):
        with pytest.raises(InvalidArgumentError, match="update"):
            sched.step(t)
        assert (sched.request_tokens(1), m.seq_len(1), m.stats().num_pages_in_use) == before
    toks = engine.forward(plan)  # the same plan, run again after a "failed" forward pass
    out += toks.values()
    sched.update(plan, toks)
    more, ended = drive(sched, engine, t0=4.0)
    out += more[1]
    assert ended == {1: "length"} and out == MODEL.generate_no_cache(prompt, 10)
    assert_cache_holds_only_real_tokens(m, prompt + out)
    assert sched.update(plan, toks) == []  # recorded already: nothing changes
    assert not Scheduler(m).step() and not Scheduler(m).step()  # empty plans need no update


def test_a_plan_whose_requests_all_ended_needs_no_update() -> None:
    m = kvcore.KVCacheManager(33, PS)
    sched = Scheduler(m)
    sched.submit(Request(1, [1, 2, 3], max_new_tokens=5))
    sched.submit(Request(2, [4, 5, 6], max_new_tokens=5))
    old = sched.step(0.0)
    sched.finish(1, "abort")
    with pytest.raises(InvalidArgumentError):
        sched.step(1.0)  # 2 is still in it
    sched.finish(2, "abort")
    assert not sched.step(1.0) and len(m) == 0
    sched.submit(Request(3, [7, 8], max_new_tokens=2))
    plan = sched.step(2.0)
    assert sched.update(old, {1: 9, 2: 9}) == [] and sched.request_tokens(3) == [7, 8]
    assert sched.update(plan, {3: 9}) == [] and sched.request_tokens(3) == [7, 8, 9]


def test_a_stale_plan_never_applies_to_a_request_back_at_the_same_position() -> None:
    """A row of an old plan matched a request that had come back to the row's start (here a new
    request under the same id, chunked): its K/V was taken as computed though never written."""
    m = kvcore.KVCacheManager(64, PS)
    sched = Scheduler(m, long_prefill_token_threshold=4)
    sched.submit(Request(1, list(range(12)), max_new_tokens=3))
    sched.update(sched.step(0.0), {})
    stale = sched.step(1.0)  # tokens 4..8
    assert (stale.starts.tolist(), stale.num_tokens.tolist()) == ([4], [4])
    sched.update(stale, {})
    sched.finish(1, "abort")
    sched.submit(Request(1, list(range(100, 112)), max_new_tokens=3))
    sched.update(sched.step(2.0), {})  # its tokens 0..4: back at the stale row's start
    assert sched.update(stale, {}) == []
    plan = sched.step(3.0)
    assert plan.starts.tolist() == [4]  # tokens 4..8 still to compute


class FlakyEstimator(OutputLengthEstimator):
    """An estimator that raises while ``fail`` is set (a failure injected inside a step)."""

    fail = False

    def expected(self, request_class: str, max_new_tokens: int, generated: int = 0) -> int:
        if self.fail:
            raise RuntimeError("injected")
        return super().expected(request_class, max_new_tokens, generated)


def test_a_step_that_raises_rolls_its_decode_appends_back() -> None:
    """The estimator raises during admission, after the decode rows' appends: the appends are undone,
    the queued request still waits, and every answer and cached page is the uninterrupted one's."""
    m, engine = tiny(33)
    est = FlakyEstimator()
    sched = Scheduler(m, estimator=est)
    prompts = {1: [1, 2, 3, 4, 5, 6, 7], 2: [9, 9, 9]}
    sched.submit(Request(1, prompts[1], max_new_tokens=10))
    outs: dict[int, list[int]] = {1: [], 2: []}
    plan = sched.step(0.0)
    for rid, tok in engine.forward(plan).items():
        outs[rid].append(tok)
    sched.update(plan, {1: outs[1][-1]})
    sched.submit(Request(2, prompts[2], max_new_tokens=6))
    est.fail = True
    for t in (1.0, 2.0):  # twice: a retried step after a failure fails the same way, changing nothing
        with pytest.raises(RuntimeError, match="injected"):
            sched.step(t)
        assert m.seq_len(1) == len(sched.request_tokens(1)) - 1 == 7
        assert 2 not in m and sched.num_waiting == 1
        m._check_invariants()
    est.fail = False
    more, ended = drive(sched, engine, t0=3.0)
    for rid in (1, 2):
        outs[rid] += more[rid]
    assert ended == {1: "length", 2: "length"}
    for rid, n in ((1, 10), (2, 6)):
        assert outs[rid] == MODEL.generate_no_cache(prompts[rid], n), rid
        assert_cache_holds_only_real_tokens(m, prompts[rid] + outs[rid])


def test_endings_of_a_step_that_raised_are_in_the_next_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while building the plan (after the timeouts and the decode appends): the timed-out
    request is reported by the next plan, and the decode rows are planned again, identically."""
    m, engine = tiny(33)
    sched = Scheduler(m, max_num_seqs=2, max_queue_wait_s=2.0)
    prompts = {1: [1, 2, 3], 2: [4, 5, 6, 7, 8]}
    for rid, p in prompts.items():
        sched.submit(Request(rid, p, max_new_tokens=4))
    sched.submit(Request(3, [9], max_new_tokens=4))  # waits: two run
    plan = sched.step(0.0)
    first = engine.forward(plan)
    sched.update(plan, first)
    real = sched._plan
    failures: list[int] = []

    def plan_once_failing(*args: Any, **kw: Any) -> Any:
        if not failures:
            failures.append(1)
            raise MemoryError("injected")
        return real(*args, **kw)

    monkeypatch.setattr(sched, "_plan", plan_once_failing)
    with pytest.raises(MemoryError):
        sched.step(5.0)
    assert [m.seq_len(r) for r in (1, 2)] == [3, 5] and 3 not in sched._reqs
    plan = sched.step(6.0)
    assert [(e.request_id, e.reason) for e in plan.rejected] == [(3, "timeout")]
    assert (plan.request_ids.tolist(), plan.starts.tolist()) == ([1, 2], [3, 5])
    outs = {rid: [first[rid]] for rid in (1, 2)}
    toks = engine.forward(plan)
    for rid, tok in toks.items():
        outs[rid].append(tok)
    sched.update(plan, toks)
    more, _ = drive(sched, engine, t0=7.0)
    for rid, p in prompts.items():
        assert outs[rid] + more[rid] == MODEL.generate_no_cache(p, 4)


def test_a_failing_prefix_lookup_is_counted_and_the_admission_goes_on() -> None:
    calls: list[int] = []

    def lookup(tokens: np.ndarray, namespace: str | None) -> None:  # a shared tier that times out once
        calls.append(int(tokens[0]))
        if len(calls) == 2:
            raise ConnectionError("redis timeout")

    m, engine = tiny(33)
    sched = Scheduler(m, prefix_lookup=lookup)
    prompts = {1: [1, 2, 3, 4, 5], 2: [9, 9, 9]}
    sched.submit(Request(1, prompts[1], max_new_tokens=10))
    plan = sched.step(0.0)
    outs = {1: list(engine.forward(plan).values()), 2: []}
    sched.update(plan, {1: outs[1][0]})
    sched.submit(Request(2, prompts[2], max_new_tokens=4))
    plan = sched.step(1.0)  # the lookup raises inside: the step does not
    assert plan.request_ids.tolist() == [1, 2] and calls == [1, 9]
    (ev,) = [e for e in plan.events if e.kind == "lookup_failed"]
    assert ev.request_id == 2 and ev.detail["error"] == "ConnectionError: redis timeout"
    assert sched.stats().num_failed_lookups == 1 and "lookup_failed" in EVENT_KINDS
    toks = engine.forward(plan)
    for rid, tok in toks.items():
        outs[rid].append(tok)
    sched.update(plan, toks)
    more, _ = drive(sched, engine, t0=2.0)
    assert outs[1] + more[1] == MODEL.generate_no_cache(prompts[1], 10)
    assert outs[2] + more[2] == MODEL.generate_no_cache(prompts[2], 4)


def test_more_decoding_requests_than_the_budget_take_turns() -> None:
    """With a budget lowered below the decoding requests, each step serves the ones served least
    recently: none waits more than one step behind the others."""
    m = kvcore.KVCacheManager(64, PS)
    sched = Scheduler(m, max_num_batched_tokens=10, max_num_seqs=5)
    for i in range(5):
        sched.submit(Request(i, [i + 1, 2], max_new_tokens=30))
    sched.update(sched.step(0.0), dict.fromkeys(range(5), 3))
    sched.max_num_batched_tokens = 2
    served = dict.fromkeys(range(5), 0)
    for t in range(1, 21):
        plan = sched.step(float(t))
        assert plan.num_decode == 2
        for rid in plan.request_ids.tolist():
            served[rid] += 1
        assert max(served.values()) - min(served.values()) <= 1, served
        sched.update(plan, {int(r): 3 for r in plan.request_ids})
    assert served == dict.fromkeys(range(5), 8)


# ----- 3-5. requests the manager would refuse later --------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"namespace": 5}, "namespace"),
        ({"namespace": ["a"]}, "namespace"),
        ({"namespace": b"a"}, "namespace"),
        ({"namespace": "\ud800"}, "namespace"),
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"priority": 2**40}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 1.0}, "priority"),
        ({"max_new_tokens": 2**63}, "max_new_tokens"),
        ({"max_new_tokens": MAX_SEQ_LEN - 2}, "max_new_tokens"),  # 3 prompt tokens + this > 2**31 - 1
        ({"stop_token_ids": "ab"}, "stop_token_ids"),
        ({"stop_token_ids": b"ab"}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"stop_token_ids": [1.5]}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [2**32]}, "stop_token_ids"),
        ({"stop_token_ids": np.array(5)}, "stop_token_ids"),
        ({"window": 8.0}, "window"),
    ],
)
def test_request_fields_the_manager_would_refuse_are_refused_at_once(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        Request(1, [1, 2, 3], **({"max_new_tokens": 4} | kw))


def test_the_widest_accepted_requests_run_through_the_manager() -> None:
    m = kvcore.KVCacheManager(33, PS)
    sched = Scheduler(m, queue="priority")
    reqs = [  # 1 is served last (its predicted answer outgrows the cache: it runs alone)
        Request(1, [1, 2, 3], max_new_tokens=MAX_SEQ_LEN - 3, priority=np.int64(-(2**31)), namespace="*"),
        Request(2, [1, 2], max_new_tokens=2, priority=2**31 - 1, namespace="\u00e9"),
        Request(3, [4], max_new_tokens=2, stop_token_ids=np.array([2**32 - 1, 7]), window=np.int64(9)),
    ]
    assert reqs[2].stop_token_ids == frozenset({2**32 - 1, 7}) and type(reqs[0].priority) is int
    for r in reqs:
        sched.submit(r)
    for t in range(6):
        plan = sched.step(float(t))
        sched.update(plan, {int(r): 5 for r in plan.request_ids[plan.sample]})
    assert sched.num_generated(1) == 4 and sched.stats().finished_by_reason == {"length": 2}
    sched.finish(1, "abort")
    assert len(m) == 0


# ----- 6. finish checks its arguments before it changes anything ------------------------------------


@pytest.mark.parametrize(
    ("rid", "reason"),
    [(1, ["x"]), (1, "capacity"), (1, "bogus"), (1, None), (True, "stop"), (1.0, "abort"), ("1", "stop")],
)
def test_finish_refuses_bad_arguments_and_changes_nothing(rid: Any, reason: Any) -> None:
    m = kvcore.KVCacheManager(33, PS)
    sched = Scheduler(m)
    sched.submit(Request(1, [1, 2, 3], max_new_tokens=5))
    sched.take_events()
    plan = sched.step(0.0)
    with pytest.raises(InvalidArgumentError):
        sched.finish(rid, reason)
    assert 1 in m and sched.has_work() and sched.take_events() == []
    assert sched.stats().finished_by_reason == {} and sched.stats().rejected_by_reason == {}
    sched.update(plan, {1: 4})  # the plan is still the scheduler's to record


def test_finish_reasons() -> None:
    est = OutputLengthEstimator(min_samples=1)
    m = kvcore.KVCacheManager(33, PS)
    sched = Scheduler(m, estimator=est)
    for rid in range(4):
        sched.submit(Request(rid, [rid, 1, 2], max_new_tokens=50))
    sched.finish(3, "length")  # never generated: nothing for the estimator to learn
    plan = sched.step(0.0)
    sched.update(plan, dict.fromkeys(range(3), 7))
    for rid, reason in zip(range(3), FINISH_REASONS, strict=True):
        sched.finish(np.int64(rid), reason)
    assert sched.stats().finished_by_reason == {"stop": 1, "length": 2, "abort": 1}
    assert est.num_samples("default") == 2  # the stop and length answers, of one token each
    with pytest.raises(UnknownSequenceError):
        sched.finish(0)


# ----- 7. constructors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"controller": "x"},
        {"controller": PressureConfig()},
        {"estimator": 5},
        {"swap": "x"},
        {"target_preemption_prob": False},
    ],
)
def test_scheduler_arguments_of_the_wrong_kind_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Scheduler(kvcore.KVCacheManager(33, PS, lower_tiers=[("host", 8)]), **kw)


def test_estimator_and_controller_arguments_are_checked() -> None:
    with pytest.raises(ConfigError):
        OutputLengthEstimator(True)
    est = OutputLengthEstimator(min_samples=1)
    for cls, n in (("d", -5), ("d", 1.5), ("d", True), (5, 3)):
        with pytest.raises(InvalidArgumentError):
            est.observe(cls, n)  # type: ignore[arg-type]
    assert est.num_samples("d") == 0 and est.expected("d", 10) == 10
    est.observe("d", np.int64(3))
    assert est.quantile_of("d") == 3
    for kw in (
        {"level": 9},
        {"level": 2},  # mem_level 0: a level the tracks do not give
        {"level": True},
        {"mem_level": 4, "level": 4},
        {"refusing": "x", "level": 4},
        {"scaling_out": True, "level": 5},  # scaling out without refusing
        {"config": "x"},
        {"level": 4, "refusing": "usage", "config": PressureConfig(max_level=3)},
    ):
        with pytest.raises(ConfigError):
            PressureController(**kw)  # type: ignore[arg-type]
    c = PressureController(mem_level=2, level=2)  # a restored state
    assert c.observe(Signals(0.1, 0, 0.0), 4).level == 2
    SwapCost(np.int64(5), 1.0, 1.0)


def test_a_switched_off_response_does_not_stop_the_level() -> None:
    """Level 4 with refuse=False refuses nothing (as level 1 with shrink_batch=False shrinks nothing):
    the level reads the pressure, max_level caps it."""
    ctl = PressureController(PressureConfig(escalate_after=1, refuse=False, scale_out=False))
    levels = [ctl.observe(Signals(0.95, 0, 0.0), 8).level for _ in range(5)]
    d = ctl.observe(Signals(0.95, 0, 9.0), 8)
    assert levels == [1, 2, 3, 4, 5] and d.level == 5
    assert d.refuse_long_tokens is None and not d.refuse_all and d.scale_out_pages is None
    assert "refuse" not in ctl.counts and "scale_out" not in ctl.counts
    capped = PressureController(PressureConfig(escalate_after=1, max_level=3))
    assert max(capped.observe(Signals(0.95, 0, 9.0), 8).level for _ in range(8)) == 3


# ----- 9-10. the reference engine's vocabulary; a window without truncation -------------------------


def test_the_tiny_engine_refuses_a_token_outside_its_vocabulary_before_writing() -> None:
    m, engine = tiny(33)
    sched = Scheduler(m)
    sched.submit(Request(1, [1, 2, 100], max_new_tokens=3))
    plan = sched.step(0.0)
    before = engine.pool.data.copy()
    with pytest.raises(InvalidArgumentError, match=r"token 100 of request 1 .*vocabulary of 64"):
        engine.forward(plan)
    assert np.array_equal(engine.pool.data, before)


def test_a_windowed_prompt_above_the_cache_is_refused_at_submit_without_truncation() -> None:
    req = Request(1, list(range(100)), max_new_tokens=4, window=10)
    with pytest.raises(RequestRejected) as e:
        Scheduler(kvcore.KVCacheManager(9, PS)).submit(req)  # 8 pages; no controller: never cut
    assert (e.value.reason, e.value.needed_pages) == ("too_large", 26)
    off = PressureController(PressureConfig(truncate=False))
    with pytest.raises(RequestRejected, match="too_large"):
        Scheduler(kvcore.KVCacheManager(9, PS), controller=off).submit(req)
    sched = Scheduler(kvcore.KVCacheManager(9, PS), controller=PressureController())
    sched.submit(req)  # may be cut to 10 tokens under pressure: it waits for that
    assert sched.num_waiting == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"usage": float("nan")},
        {"usage": float("inf")},
        {"usage": -0.1},
        {"queue_wait_p95_s": float("nan")},
        {"tier_usage": float("nan")},
        {"failed_reservations": -1},
        {"failed_reservations": True},
        {"demand_pages": 1.5},
    ],
)
def test_signals_that_would_freeze_the_controller_are_refused(kwargs: dict[str, object]) -> None:
    # A NaN compares false with every threshold: the level would never move again.
    from kvcore.scheduler import Signals

    args: dict[str, object] = {"usage": 0.5, "failed_reservations": 0, "queue_wait_p95_s": 0.0}
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        Signals(**{**args, **kwargs})  # type: ignore[arg-type]


def test_a_clock_set_back_reads_as_no_queue_wait() -> None:
    from kvcore.scheduler import PressureController

    m = kvcore.KVCacheManager(33, 4)
    s = Scheduler(m, controller=PressureController())
    s.submit(Request(1, [1, 2, 3], 2), now=10.0)
    plan = s.step(5.0)  # earlier than the arrival: the wait is 0, not negative
    s.update(plan, {1: 4})
    assert s.step(6.0).batch_size == 1


class _Flaky:
    """A manager whose method ``name`` raises once, armed with ``arm()`` (``after``: once the real call
    returned, as an interrupt landing just after a native call would)."""

    def __init__(self, m: kvcore.KVCacheManager, name: str, after: bool = False) -> None:
        self.m, self.name, self.after, self.armed = m, name, after, False

    def arm(self) -> None:
        self.armed = True

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.m

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self.m, attr)
        if attr != self.name or not self.armed:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.armed = False
            if self.after:
                real(*args, **kwargs)
            raise MemoryError(f"injected in {attr}")

        return call


def _drain(sched: Scheduler, t: float = 0.0) -> None:
    while sched.has_work():
        plan = sched.step(t)
        sched.update(plan, np.full(int(plan.sample.sum()), 3, np.int64))
        t += 1
        assert t < 500


def _assert_released(m: kvcore.KVCacheManager) -> None:
    assert not m.seq_ids()
    m.evict(m.num_pages)
    assert m.stats().num_pages_free == m.num_pages - 1
    m._check_invariants()


@pytest.mark.parametrize("name", ["num_reserved", "is_ready"])
def test_a_raise_just_after_an_admission_leaves_the_request_live(name: str) -> None:
    m = kvcore.KVCacheManager(16, 4, lower_tiers=[("host", 8)])
    p = _Flaky(m, name)
    sched = Scheduler(p)  # type: ignore[arg-type]
    sched.submit(Request(1, [1, 2, 3, 4, 5], 4))
    p.arm()
    with pytest.raises(MemoryError):
        sched.step(0.0)
    assert m.seq_ids() == [1]  # the manager's sequence is the scheduler's request
    assert sched.has_work() and sched.num_waiting == 0
    sched.finish(1, "abort")  # was a bare ValueError (in no queue)
    _assert_released(m)
    sched.submit(Request(2, [1, 2, 3, 4, 5], 4))
    p.arm()
    with pytest.raises(MemoryError):
        sched.step(1.0)
    _drain(sched, 2.0)  # and it runs to its end from there
    _assert_released(m)


def test_a_free_that_raises_while_a_request_ends_leaves_it_to_end_again() -> None:
    m = kvcore.KVCacheManager(3, 4)  # 2 usable pages: 8 tokens
    p = _Flaky(m, "free_sequence")
    sched = Scheduler(p)  # type: ignore[arg-type]
    sched.submit(Request(1, [1, 2, 3, 4, 5], 10))
    t = 0.0
    while 1 not in m or m.seq_len(1) < 8:
        plan = sched.step(t)
        sched.update(plan, {1: 7})
        t += 1
    p.arm()
    with pytest.raises(MemoryError):
        sched.step(t)  # the next append fails, the request ends (capacity), its free raises
    plan = sched.step(t + 1)
    assert plan.finished == [(1, "capacity")]
    assert not sched.has_work()
    _assert_released(m)


@pytest.mark.parametrize("steady", [True, False])
def test_an_update_whose_commit_raises_can_be_run_again(steady: bool) -> None:
    m = kvcore.KVCacheManager(32, 4)
    p = _Flaky(m, "commit")
    sched = Scheduler(p)  # type: ignore[arg-type]
    sched.submit(Request(1, [1, 2], 10))
    sched.submit(Request(2, [4, 5], 10))
    sched.update(sched.step(0.0), {1: 7, 2: 7})
    sched.update(sched.step(1.0), {1: 8, 2: 8})
    plan = sched.step(2.0)  # both fill their first page: one commit each
    assert sched._dec_used is not None  # the steady path
    if not steady:
        sched._dec_used = None  # the checked path
    p.arm()
    with pytest.raises(MemoryError):
        sched.update(plan, {1: 9, 2: 9})
    assert sched.request_tokens(1) == [1, 2, 7, 8]  # nothing recorded yet
    sched.update(plan, {1: 9, 2: 9})
    assert sched.request_tokens(1) == [1, 2, 7, 8, 9] and m.seq_len(1) == 4
    assert m.peek_prefix_len([1, 2, 7, 8, 9]) == 4  # the filled page was committed
    _drain(sched, 3.0)
    _assert_released(m)


def test_a_reservation_interrupted_after_the_call_is_read_back() -> None:
    m = kvcore.KVCacheManager(32, 4)
    p = _Flaky(m, "reserve", after=True)
    sched = Scheduler(p, long_prefill_token_threshold=4)  # type: ignore[arg-type]
    sched.submit(Request(1, list(range(12)), 3))
    sched.update(sched.step(0.0), {})  # the first chunk
    p.arm()
    with pytest.raises(MemoryError):
        sched.step(1.0)  # the second chunk's slots are reserved, then the call raises
    _drain(sched, 2.0)  # was: "0 prompt tokens left to reserve" at every step
    _assert_released(m)


def test_has_work_until_the_endings_of_a_step_that_raised_are_reported() -> None:
    m = kvcore.KVCacheManager(16, 4)
    p = _Flaky(m, "take_pending_copies")
    sched = Scheduler(p, max_queue_wait_s=1.0, max_num_seqs=1)  # type: ignore[arg-type]
    sched.submit(Request(1, [1, 2, 3], 2))
    sched.submit(Request(2, [4, 5], 2))
    sched.update(sched.step(0.0), {1: 9})
    p.arm()
    with pytest.raises(MemoryError):
        sched.step(5.0)  # request 2 waited past its limit: refused in this step
    sched.finish(1, "abort")
    assert sched.has_work()  # request 2's refusal is still to be reported
    assert [(e.request_id, e.reason) for e in sched.step(6.0).rejected] == [(2, "timeout")]
    assert not sched.has_work()


def test_bad_ids_times_plans_and_signals_are_kvcore_errors_and_change_nothing() -> None:
    sched = Scheduler(kvcore.KVCacheManager(65, 16))
    sched.submit(Request(1, np.arange(1, 40, dtype=np.uint32), max_new_tokens=4))
    for bad_time in (10**400, -(10**400), float("nan"), "1", None):
        with pytest.raises(InvalidArgumentError, match="finite number of seconds"):
            sched.step(bad_time)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="finite number of seconds"):
            sched.submit(Request(2, np.arange(1, 9, dtype=np.uint32), 1), bad_time)  # type: ignore[arg-type]
    for bad_id in ([1], 1.0, "1", None, True):
        with pytest.raises(InvalidArgumentError, match="request_id must be an integer"):
            sched.request_tokens(bad_id)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="request_id must be an integer"):
            sched.num_generated(bad_id)  # type: ignore[arg-type]
    assert sched.request_tokens(np.int64(1)) == list(range(1, 40))
    with pytest.raises(UnknownSequenceError):
        sched.num_generated(7)
    plan = sched.step(0.0)
    for bad_plan in (None, {}, plan.request_ids):
        with pytest.raises(InvalidArgumentError, match="update takes the StepPlan"):
            sched.update(bad_plan, {})  # type: ignore[arg-type]
    sched.update(plan, np.full(int(plan.sample.sum()), 7, np.int64))  # the plan is still recordable
    assert sched.num_generated(1) == 1
    assert 2 not in {int(r) for r in plan.request_ids}  # no bad submit queued anything
    controller = PressureController()
    ok = Signals(usage=0.5, failed_reservations=0, queue_wait_p95_s=0.0)
    for args in (("x", 1), (ok, "1"), (ok, -1), (ok, 1, 10**400), (ok, 1, None)):
        with pytest.raises(InvalidArgumentError):
            controller.observe(*args)  # type: ignore[arg-type]
    assert controller.level == 0
    controller.observe(ok, np.int64(3), 1.0)


def test_a_submitted_prompt_cannot_be_changed_under_the_scheduler() -> None:
    """Request.prompt was a writable copy that the scheduler computes later prefill chunks from: a
    caller zeroing it after the first chunk made pages committed under the original tokens' keys hold
    K/V of zeros, and a later request with the original prompt got a wrong answer from the cache."""
    from kvcore.tiny import TinyDecoder, TinyEngine

    model = TinyDecoder(0, "fp16")
    pool = TinyEngine.make_pool(model, 33, 4)
    m = kvcore.KVCacheManager(33, 4)
    engine = TinyEngine(model, pool)
    sched = Scheduler(m, max_num_batched_tokens=4)
    prompt = list(range(10, 22))
    first = Request(1, prompt, 2)
    assert not first.prompt.flags.writeable
    sched.submit(first, 0)
    out: dict[int, list[int]] = {}

    def run(t: float) -> None:
        while sched.has_work():
            plan = sched.step(t)
            toks = engine.forward(plan)
            for r, x in toks.items():
                out.setdefault(r, []).append(x)
            sched.update(plan, toks)
            t += 1

    plan = sched.step(0)  # the first 4-token chunk
    sched.update(plan, engine.forward(plan))
    with pytest.raises(ValueError, match="read-only"):
        first.prompt[:] = 0
    with pytest.raises(ValueError):
        first.prompt.setflags(write=True)  # over immutable bytes: not even on purpose
    run(1)
    sched.submit(Request(2, prompt, 5), 10)
    run(10)
    assert out[2] == model.generate_no_cache(prompt, 5)


def test_a_copied_or_unpickled_request_is_checked_and_read_only_too() -> None:
    """pickle and copy.deepcopy restored a Request's __dict__ without __post_init__: the copy's prompt
    was a writable array again (the cache poisoning above, through a request sent to a worker)."""
    import copy
    import pickle

    r = Request(7, [3, 1, 4, 1, 5], 6, priority=2, namespace="t", window=5, sink_tokens=1, stop_token_ids={9})
    for c in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
        assert c is not r
        assert not c.prompt.flags.writeable
        with pytest.raises(ValueError):
            c.prompt.setflags(write=True)
        assert c.prompt.tolist() == [3, 1, 4, 1, 5]
        assert (c.request_id, c.max_new_tokens, c.priority, c.namespace) == (7, 6, 2, "t")
        assert (c.window, c.sink_tokens, c.stop_token_ids) == (5, 1, frozenset({9}))
    # Rebuilt through the constructor, so its checks run: a reduced form with a bad field is refused.
    cls, args = r.__reduce__()
    with pytest.raises(InvalidArgumentError, match="request_id"):
        cls(-1, *args[1:])
