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


def decoding_scheduler(max_new_tokens: int = 1024) -> tuple[Scheduler, dict[int, int]]:
    """256 requests of 2,048-token prompts, all prefilled and decoding (room for their answers)."""
    pages = BATCH * ((PROMPT + max_new_tokens) // PS + 1) + 1
    m = KVCacheManager(pages, PS)
    sched = Scheduler(m, max_num_batched_tokens=BATCH * PROMPT, max_num_seqs=BATCH)
    rng = np.random.default_rng(0)
    for i in range(BATCH):
        sched.submit(Request(i, rng.integers(0, 32_000, PROMPT), max_new_tokens=max_new_tokens))
    plan = sched.step(0.0)
    assert plan.batch_size == BATCH and plan.num_prefill_tokens == BATCH * PROMPT
    tokens = dict.fromkeys(range(BATCH), 7)
    sched.update(plan, tokens)
    return sched, tokens


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
