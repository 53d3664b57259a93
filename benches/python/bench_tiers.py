"""pytest-benchmark of admissions across the lower tiers (Python calls, median).

Run: ``.venv/bin/python -m pytest benches/python/bench_tiers.py --benchmark-columns=median,mean,ops``

Target: matching across tiers costs ≤ 2× HBM-only matching per token. The same
2,048-token prompt, its first 1,920 tokens cached, is admitted and freed:

- ``hbm``: cached in HBM, on a manager without tiers (the baseline);
- ``hbm_with_tiers``: cached in HBM, on a manager with a host and a disk tier (the tiers are looked
  at after the HBM hit and hold nothing more);
- ``host``: cached only in the host tier (HBM empty): the admission matches HBM (nothing), then
  the host tier (120 pages), reserves 128 HBM pages and queues 120 loads, which the release then
  cancels.

The matching alone (no side effects) is measured the same three ways: ``peek_prefix_len`` on the
HBM-only manager against ``peek_hit_tokens`` (HBM then each tier).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from kvcore import KVCacheManager

PS = 16
PREFIX = np.arange(1_920, dtype=np.int32)
PROMPT = np.concatenate([PREFIX, np.arange(10**6, 10**6 + 128, dtype=np.int32)])


def manager(tiers: bool) -> KVCacheManager:
    lower = [("host", 4_096), ("disk", 8_192)] if tiers else None
    # Stores only on purpose (priority), so the timed admissions queue none.
    return KVCacheManager(
        20_001, PS, lower_tiers=lower, store_policy="selective", store_options={"min_priority": 1}
    )


def seeded(tiers: bool, in_hbm: bool) -> KVCacheManager:
    m = manager(tiers)
    m.add_sequence(-1, np.concatenate([PREFIX, [0]]).astype(np.int32), priority=1)
    b = m.take_transfers()
    if len(b.store_ops):
        m.complete_transfers(np.unique(b.store_ops), True)
    m.free_sequence(-1)
    if not in_hbm:
        m.evict(1 << 20)
    return m


@pytest.mark.parametrize(
    ("where", "tiers", "in_hbm"),
    [("hbm", False, True), ("hbm_with_tiers", True, True), ("host", True, False)],
)
def test_bench_admit_free_2048_with_1920_cached(
    benchmark: Any, where: str, tiers: bool, in_hbm: bool
) -> None:
    m = seeded(tiers, in_hbm)
    ids = itertools.count()

    def fresh_prompt() -> tuple[tuple[np.ndarray], dict[str, Any]]:
        # A distinct tail each round (as a real stream): every admission allocates 8 fresh pages.
        n = next(ids)
        tail = np.arange(10**6 + n * 128, 10**6 + (n + 1) * 128, dtype=np.int32)
        return (np.concatenate([PREFIX, tail]),), {}

    def admit_free(prompt: np.ndarray) -> None:
        assert m.add_sequence(1, prompt) == 1_920
        m.free_sequence(1)

    benchmark.pedantic(admit_free, setup=fresh_prompt, rounds=2_000)
    # Nothing leaked: the host admissions' loads were cancelled with their sequence.
    assert m.stats().num_pages_in_use == 0
    assert not m.take_transfers().load_ops.size


@pytest.mark.parametrize(
    ("where", "tiers", "in_hbm"),
    [("hbm", False, True), ("hbm_with_tiers", True, True), ("host", True, False)],
)
def test_bench_match_2048_with_1920_cached(benchmark: Any, where: str, tiers: bool, in_hbm: bool) -> None:
    m = seeded(tiers, in_hbm)
    if tiers:
        hit = benchmark(m.peek_hit_tokens, PROMPT)
        assert sum(hit.values()) == 1_920 and hit["hbm"] == (1_920 if in_hbm else 0)
    else:
        assert benchmark(m.peek_prefix_len, PROMPT) == 1_920


@pytest.mark.parametrize("depth", [64, 1024])
def test_bench_commit_a_page_stored_to_the_host_tier(benchmark: Any, depth: int) -> None:
    """Decode with ``store_policy="all"``: one more page's tokens are appended and committed at
    ``depth`` pages, and its store is queued, taken and completed (200 rounds: the depth grows by
    200). The tier path grows by one page per store; the cost must not grow with the whole path (it
    walked it several times per page: 180 us per commit at 1,024 pages)."""
    m = KVCacheManager(4_096, PS, lower_tiers=[("host", 8_192)], store_policy="all")
    m.add_sequence(1, np.arange(1, depth * PS + 1, dtype=np.int32), cache_prompt=False)
    done = itertools.count(1)

    def commit_next() -> None:
        m.commit(1, next(done) * PS)
        b = m.take_transfers()
        m.complete_transfers(np.unique(b.store_ops), True)

    for _ in range(depth):
        commit_next()
    fresh = itertools.count(10**6)

    def one() -> None:
        assert m.append(1, [next(fresh) for _ in range(PS)])
        commit_next()

    benchmark.pedantic(one, rounds=200, iterations=1, warmup_rounds=5)
