"""The built-in workload: reproducible from its seed, and built the way its docs say (shared prefixes with
Zipf popularity, turns that extend the previous prompt and answer, unique RAG documents)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from kvcore.replay import Trace, WorkloadConfig, generate_workload

SMALL = WorkloadConfig(num_requests=600, seed=11)


def columns(t: Trace) -> dict[str, object]:
    return {
        name: getattr(t, name).tolist()
        for name in (
            "input_lens",
            "output_lens",
            "hash_indptr",
            "hash_ids",
            "timestamps_ms",
            "priorities",
            "output_indptr",
            "output_ids",
        )
    }


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    a, b = generate_workload(SMALL), generate_workload(SMALL)
    assert columns(a) == columns(b)
    c = generate_workload(WorkloadConfig(num_requests=600, seed=12))
    assert columns(c)["hash_ids"] != columns(a)["hash_ids"]


def test_shape_and_units() -> None:
    t = generate_workload(SMALL)
    bs = SMALL.block_size
    assert t.num_requests == 600 and t.block_size == bs
    assert (t.input_lens % bs == 0).all() and (t.output_lens % bs == 0).all()  # whole blocks
    assert t.timestamps_ms is not None and t.timestamps_ms[0] == 0
    assert (np.diff(t.timestamps_ms) >= 0).all()  # arrival order
    assert (t.input_lens <= SMALL.max_prompt_tokens + SMALL.block_size).all()


def prompts(t: Trace) -> list[tuple[int, ...]]:
    return [tuple(t.prompt_ids(i).tolist()) for i in range(t.num_requests)]


def test_ids_are_prefix_chained() -> None:
    """An id always has the same parent (the previous id, or none): the Mooncake convention."""
    parent: dict[int, int] = {}
    for ids in prompts(generate_workload(SMALL)):
        for k, h in enumerate(ids):
            p = ids[k - 1] if k else -1
            assert parent.setdefault(h, p) == p


def test_turns_extend_previous_prompt_and_answer() -> None:
    t = generate_workload(SMALL)
    assert t.output_ids is not None and t.output_indptr is not None
    rows = prompts(t)
    answers = [
        tuple(t.output_ids[t.output_indptr[i] : t.output_indptr[i + 1]].tolist()) for i in range(len(rows))
    ]
    by_prefix = {row + answers[i]: i for i, row in enumerate(rows)}
    followups = 0
    for i, row in enumerate(rows):
        # A later turn starts with an earlier turn's prompt + answer, then its new message.
        for cut in range(len(row) - 1, 0, -1):
            j = by_prefix.get(row[:cut])
            if j is not None and j != i:
                assert t.timestamps_ms is not None and t.timestamps_ms[j] <= t.timestamps_ms[i]
                followups += 1
                break
    chats = 1 - SMALL.rag_share
    expected = SMALL.num_requests * chats * (1 - 1 / SMALL.mean_turns)  # turns after the first
    assert 0.6 * expected < followups < 1.4 * expected


def test_system_prompts_are_shared_with_zipf_popularity() -> None:
    t = generate_workload(WorkloadConfig(num_requests=3000, seed=2))
    first = Counter(int(t.prompt_ids(i)[0]) for i in range(t.num_requests))
    counts = sorted(first.values(), reverse=True)
    assert len(counts) == WorkloadConfig().num_system_prompts  # every request starts with one of them
    # Zipf(1.2): the most popular prompt is well ahead of the second and the tail.
    assert counts[0] > 1.5 * counts[1] and counts[0] > 0.25 * sum(counts)


def test_rag_documents_are_unique() -> None:
    t = generate_workload(WorkloadConfig(num_requests=400, seed=4, rag_share=1.0))
    # RAG only: every session is one request; past the system prompt nothing is shared.
    seen: Counter[int] = Counter()
    for ids in prompts(t):
        seen.update(ids)
    shared = {h for h, c in seen.items() if c > 1}
    for ids in prompts(t):
        tail = ids[len([h for h in ids if h in shared]) :]
        assert all(seen[h] == 1 for h in tail) and len(tail) > 0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        WorkloadConfig(rag_share=1.5)
    with pytest.raises(ValueError):
        WorkloadConfig(num_requests=0)
