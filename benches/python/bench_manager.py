"""pytest-benchmark of the scheduler-facing calls of KVCacheManager (Python calls, median).

Run: ``.venv/bin/python -m pytest benches/python/bench_manager.py --benchmark-columns=median,mean,ops``

Targets: add_sequence of a 2,048-token prompt whose first 1,920 tokens are cached
≤ 5 µs; append of one token ≤ 0.5 µs; page_table for 256 running sequences of 2,048 tokens ≤ 50 µs;
evict(1000) ≤ 50 µs. free_sequence is measured alone (its admission runs in the untimed setup) and
paired with add_sequence.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from kvcore import KVCacheManager, PageTable

PS = 16


def test_bench_add_sequence_2048_with_1920_cached(benchmark: Any) -> None:
    m = KVCacheManager(20_001, PS)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)  # caches the 120 shared pages
    m.free_sequence(-1)
    ids = itertools.count()

    def fresh_prompt() -> tuple[tuple[int, np.ndarray], dict[str, Any]]:
        # A distinct tail each round, so every call allocates 8 fresh pages as a real admission does;
        # the previous round's sequence is released outside the timing.
        sid = next(ids)
        if sid:
            m.free_sequence(sid - 1)
        tail = np.arange(10**6 + sid * 128, 10**6 + (sid + 1) * 128, dtype=np.int32)
        return (sid, np.concatenate([prefix, tail])), {}

    def admit(sid: int, prompt: np.ndarray) -> None:
        assert m.add_sequence(sid, prompt) == 1_920

    benchmark.pedantic(admit, setup=fresh_prompt, rounds=2_000)


def test_bench_add_then_free_sequence_2048_with_1920_cached(benchmark: Any) -> None:
    """The same admission followed by its release (what a finished request costs end to end)."""
    m = KVCacheManager(20_001, PS)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)
    m.free_sequence(-1)
    prompt = np.concatenate([prefix, np.arange(10**6, 10**6 + 128)]).astype(np.int32)

    def admit_free() -> None:
        m.add_sequence(1, prompt)
        m.free_sequence(1)

    benchmark(admit_free)


def test_bench_free_sequence_2048_with_1920_cached(benchmark: Any) -> None:
    """Releasing a finished 2,048-token request: 120 shared pages unlocked, 8 own pages cached."""
    m = KVCacheManager(20_001, PS)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)
    m.free_sequence(-1)
    ids = itertools.count()

    def admitted() -> tuple[tuple[int], dict[str, Any]]:
        # A distinct tail each round (as a real stream), admitted outside the timing.
        sid = next(ids)
        tail = np.arange(10**6 + sid * 128, 10**6 + (sid + 1) * 128, dtype=np.int32)
        assert m.add_sequence(sid, np.concatenate([prefix, tail])) == 1_920
        return (sid,), {}

    benchmark.pedantic(m.free_sequence, setup=admitted, rounds=2_000)
    assert m.stats().num_pages_in_use == 0


def test_bench_append_one_token(benchmark: Any) -> None:
    m = KVCacheManager(200_001, PS)
    m.add_sequence(1, np.arange(2_000, dtype=np.int32))
    token = np.array([7], dtype=np.int32)
    benchmark.pedantic(lambda: m.append(1, token), rounds=200, iterations=500)


def test_bench_page_table_256_x_2048(benchmark: Any) -> None:
    m = KVCacheManager(256 * 128 + 1, PS)
    for sid in range(256):
        assert m.add_sequence(sid, np.arange(sid * 2_048, (sid + 1) * 2_048, dtype=np.int32)) is not None
    ids = list(range(256))
    pt = benchmark(m.page_table, ids)
    assert pt.kv_indptr[-1] == 256 * 128


def test_bench_page_table_256_x_2048_into_buffers(benchmark: Any) -> None:
    """The same, written into buffers the scheduler reuses from step to step."""
    m = KVCacheManager(256 * 128 + 1, PS)
    for sid in range(256):
        assert m.add_sequence(sid, np.arange(sid * 2_048, (sid + 1) * 2_048, dtype=np.int32)) is not None
    ids = list(range(256))
    out = PageTable(np.empty(257, np.int32), np.empty(256 * 128, np.int32), np.empty(256, np.int32))
    pt = benchmark(m.page_table, ids, out=out)
    assert pt.kv_indptr[-1] == 256 * 128


def test_bench_evict_1000(benchmark: Any) -> None:
    def setup() -> tuple[tuple[KVCacheManager], dict[str, Any]]:
        m = KVCacheManager(4_001, PS)
        for sid in range(30):  # 30 released prompts of 128 pages: 3,840 cached pages
            m.add_sequence(sid, np.arange(sid * 2_048, (sid + 1) * 2_048, dtype=np.int32))
            m.free_sequence(sid)
        return (m,), {}

    def evict(m: KVCacheManager) -> None:
        assert m.evict(1_000) == 1_000

    benchmark.pedantic(evict, setup=setup, rounds=30)


def test_bench_match_prefix_2048_with_1920_cached(benchmark: Any) -> None:
    """match_prefix (no side effects) of the admission above: the pages of the cached prefix."""
    m = KVCacheManager(20_001, PS)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)
    m.free_sequence(-1)
    prompt = np.concatenate([prefix, np.arange(10**6, 10**6 + 128, dtype=np.int32)])
    found = benchmark(m.match_prefix, prompt)
    assert found.num_tokens == 1_920


def test_bench_allocate_insert_free_8_pages(benchmark: Any) -> None:
    """Pages loaded from elsewhere: allocate_pages(8), insert them (all adopted), evict them again."""
    m = KVCacheManager(20_001, PS)
    rounds = itertools.count()

    def load() -> None:
        base = 10**6 + next(rounds) * 128
        pages = m.allocate_pages(8)
        assert pages is not None
        assert m.insert(np.arange(base, base + 128, dtype=np.int32), pages) == 8
        m.evict(8)

    benchmark(load)


@pytest.mark.parametrize("events", [False, True])
def test_bench_add_then_free_with_events(benchmark: Any, events: bool) -> None:
    """The admission + release above with KV events off and on (on: keys hashed for the 8 pages
    stored, then taken each round): the A/B that shows events off cost nothing."""
    m = KVCacheManager(20_001, PS, events=events)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)
    m.free_sequence(-1)
    rounds = itertools.count()

    def admit_free() -> None:
        base = 10**6 + next(rounds) * 128
        m.add_sequence(1, np.concatenate([prefix, np.arange(base, base + 128, dtype=np.int32)]))
        m.free_sequence(1)
        m.evict(8)
        m.take_events()

    benchmark(admit_free)
