"""pytest-benchmark of kvcore.scheduler: the scheduler's own time per step (Python, median).

Run: ``.venv/bin/python -m pytest benches/python/bench_scheduler.py --benchmark-columns=median,mean,ops``

Target: a step with 256 running sequences ≤ 100 µs of kvcore time, that is ``step()`` (the
batched append, the page table cut to the step, the slot mapping and the token ids) plus ``update()``
(the sampled tokens recorded, the pages that filled committed), with no model in between. Baselines in
the same run: the manager calls alone that such a step cannot avoid (one ``append`` per sequence, one
``page_table``), so the table shows what the scheduler's bookkeeping adds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcore import KVCacheManager
from kvcore.scheduler import Request, Scheduler

PS = 16
BATCH = 256
PROMPT = 2048


def decoding_scheduler(
    max_new_tokens: int = 1024, stop: frozenset[int] = frozenset()
) -> tuple[Scheduler, np.ndarray]:
    """256 requests of 2,048-token prompts, all prefilled and decoding (room for their answers); each
    finishes on a token of ``stop`` (none sampled here)."""
    pages = BATCH * ((PROMPT + max_new_tokens) // PS + 1) + 1
    m = KVCacheManager(pages, PS)
    sched = Scheduler(m, max_num_batched_tokens=BATCH * PROMPT, max_num_seqs=BATCH)
    rng = np.random.default_rng(0)
    for i in range(BATCH):
        sched.submit(
            Request(i, rng.integers(0, 32_000, PROMPT), max_new_tokens=max_new_tokens, stop_token_ids=stop)
        )
    plan = sched.step(0.0)
    assert plan.batch_size == BATCH and plan.num_prefill_tokens == BATCH * PROMPT
    sched.update(plan, dict.fromkeys(range(BATCH), 7))
    return sched, np.full(BATCH, 7, np.int64)  # an engine's argmax in row order (the fast path)


def decoding_manager() -> KVCacheManager:
    """The same 256 sequences admitted straight into a manager (the baselines' state)."""
    m = KVCacheManager(BATCH * (PROMPT // PS + 64) + 1, PS)
    rng = np.random.default_rng(0)
    for i in range(BATCH):
        m.add_sequence(i, rng.integers(0, 32_000, PROMPT).astype(np.int32))
    return m


def test_bench_scheduler_step_256_decoding(benchmark: Any) -> None:
    sched, tokens = decoding_scheduler()

    def step() -> None:
        plan = sched.step(0.0)
        sched.update(plan, tokens)

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)  # 320 of the 1,024 tokens
    plan = sched.step(0.0)
    assert plan.batch_size == BATCH and plan.num_decode == BATCH


def test_bench_scheduler_step_256_decoding_with_stop_tokens(benchmark: Any) -> None:
    """The same, each request with two EOS ids (as real requests have): the steady path checks them."""
    sched, tokens = decoding_scheduler(stop=frozenset({1, 2}))

    def step() -> None:
        plan = sched.step(0.0)
        sched.update(plan, tokens)

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)
    plan = sched.step(0.0)
    assert plan.batch_size == BATCH and plan.num_decode == BATCH


def test_bench_scheduler_step_256_one_ends_one_joins(benchmark: Any) -> None:
    """Continuous batching as it runs: each step one request samples its stop token and ends, and a
    new one (a 16-token prompt) is admitted and prefilled beside the 255 decode rows."""
    pages = BATCH * ((PROMPT + 1024) // PS + 1) + 1024
    m = KVCacheManager(pages, PS)
    sched = Scheduler(m, max_num_batched_tokens=BATCH * PROMPT, max_num_seqs=BATCH)
    rng = np.random.default_rng(0)
    for i in range(BATCH):
        sched.submit(Request(i, rng.integers(0, 32_000, PROMPT), max_new_tokens=1024, stop_token_ids={1}))
    plan = sched.step(0.0)
    sched.update(plan, np.full(plan.batch_size, 7, np.int64))
    next_id = [BATCH]

    def step() -> None:
        rid = next_id[0]
        next_id[0] += 1
        sched.submit(Request(rid, rng.integers(2, 32_000, 16), max_new_tokens=1024, stop_token_ids={1}))
        plan = sched.step(0.0)
        toks = np.full(int(plan.sample.sum()), 7, np.int64)
        toks[0] = 1  # the oldest decode row stops
        sched.update(plan, toks)

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)
    assert len(sched.running_ids) + sched.num_waiting == BATCH


def test_bench_baseline_manager_calls_of_a_decode_step(benchmark: Any) -> None:
    """What any engine pays the manager per step: 256 appends (one call each) and a table."""
    m = decoding_manager()
    ids = np.arange(BATCH, dtype=np.int64)
    one = [7]
    append, table = m.append, m.page_table

    def step() -> None:
        for i in range(BATCH):
            append(i, one)
        table(ids)

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)


def test_bench_baseline_batched_append_and_table(benchmark: Any) -> None:
    """The floor under the scheduler: one append_batch and one table (no Python per sequence)."""
    m = decoding_manager()
    ids = np.arange(BATCH, dtype=np.int64)
    toks = np.full(BATCH, 7, np.uint32)

    def step() -> None:
        assert m.append_batch(ids, toks) == BATCH
        m.page_table(ids)

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)
