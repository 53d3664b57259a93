"""pytest-benchmark of ``kvcore replay``: the Mooncake conversation trace through the real manager.

Run: ``.venv/bin/python -m pytest benches/python/bench_replay.py --benchmark-columns=median,mean,min,max``

``bench_conversation_sequential``: the whole conversation trace (12,031 requests, 144.8 M prompt tokens,
12,031 x ``add_sequence`` + ``free_sequence``) in sequential mode at 16-token pages, LRU, at 10,000 and
50,000 blocks' worth of pages. Each round builds every token id from the hash ids (a fresh
:class:`~kvcore.replay.TokenSource`) and builds a fresh manager. Target: 1.5 s. Reading the
JSONL is not timed here (``bench_read_conversation``: about 0.25 s, ``json`` bound).
``bench_builtin_timed``: the default ``kvcore replay`` workload (4,000 requests), timed mode, one policy.

The trace lives outside the repository (../shared/data/traces); without it those benchmarks are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcore.replay import (
    ReplayConfig,
    WorkloadConfig,
    generate_workload,
    read_trace,
    replay,
    resolve_capacity,
)

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
CONVERSATION = TRACES / "conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not available")


@needs_trace
@pytest.mark.parametrize("blocks", [10_000, 50_000])
def test_bench_conversation_sequential(benchmark: Any, blocks: int) -> None:
    trace = read_trace(CONVERSATION)
    config = ReplayConfig(capacity_pages=blocks * 32, page_size=16, policy="lru")
    result = benchmark.pedantic(replay, args=(trace, config), rounds=5, iterations=1, warmup_rounds=1)
    assert result.num_served == trace.num_requests == 12_031
    benchmark.extra_info["prompt_tokens"] = result.prompt_tokens
    benchmark.extra_info["hit_rate_tokens"] = round(result.hit_rate_tokens, 4)
    benchmark.extra_info["num_evicted_pages"] = result.num_evicted_pages


@needs_trace
def test_bench_read_conversation(benchmark: Any) -> None:
    trace = benchmark.pedantic(read_trace, args=(CONVERSATION,), rounds=5, iterations=1)
    assert trace.num_requests == 12_031


def test_bench_builtin_timed(benchmark: Any) -> None:
    trace = generate_workload(WorkloadConfig())
    config = ReplayConfig(capacity_pages=resolve_capacity().pages, page_size=16, mode="timed")
    result = benchmark.pedantic(replay, args=(trace, config), rounds=3, iterations=1)
    assert result.num_served + result.num_refused == trace.num_requests
