"""Allocation per chunk (issue 11, item 1): add_sequence(reserve=...) and reserve()."""

from __future__ import annotations

import pytest

from kvcore import InvalidArgumentError, InvalidDTypeError, KVCacheManager

PS = 4


def state(m: KVCacheManager) -> tuple[object, ...]:
    pages = {sid: m.seq_pages(sid).tolist() for sid in sorted(m.seq_ids())}
    return m.stats().as_dict(), pages, sorted(m.cached_pages().tolist())


def test_a_prompt_is_reserved_chunk_by_chunk() -> None:
    m = KVCacheManager(64, PS)
    prompt = list(range(100, 118))  # 18 tokens
    assert m.add_sequence(1, prompt, cache_prompt=False, reserve=5) == 0
    assert (m.num_reserved(1), m.seq_len(1), len(m.seq_pages(1))) == (5, 18, 2)
    assert m.slot_mapping(1, 5).tolist() == [m.seq_pages(1)[t // PS] * PS + t % PS for t in range(5)]
    assert m.reserve(1, 7)
    assert (m.num_reserved(1), len(m.seq_pages(1))) == (12, 3)
    assert m.commit(1, 12) == 12  # computed: its 3 full pages are shared
    assert m.reserve(1, 6) and m.num_reserved(1) == 18
    m.commit(1, 18)
    assert m.append(1, [7])  # generation once the prompt is all reserved
    assert m.seq_len(1) == m.num_reserved(1) == 19


def test_reserve_counts_from_the_cached_prefix() -> None:
    m = KVCacheManager(64, PS)
    shared = list(range(12))
    m.add_sequence(1, [*shared, 0])
    m.free_sequence(1)
    assert m.add_sequence(2, [*shared, 50, 51, 52], reserve=2) == 12
    assert m.num_reserved(2) == 14 and len(m.seq_pages(2)) == 4
    assert m.add_sequence(3, [*shared, 60], reserve=0) == 12
    assert m.num_reserved(3) == 12


def test_cache_prompt_caches_only_reserved_full_pages() -> None:
    m = KVCacheManager(64, PS)
    prompt = list(range(200, 212))
    m.add_sequence(1, prompt, reserve=6)  # pages 0 (full) and 1 (half) reserved
    assert m.peek_prefix_len(prompt) == 4
    assert m.reserve(1, 6)
    assert m.peek_prefix_len(prompt) == 12


def test_refusals_and_mistakes_change_nothing() -> None:
    m = KVCacheManager(5, PS)  # 4 usable pages
    m.add_sequence(1, list(range(20)), cache_prompt=False, reserve=8)
    before = state(m)
    assert not m.reserve(1, 12)  # 3 more pages: only 2 free
    assert state(m)[1:] == before[1:]
    for call in (
        lambda: m.reserve(1, 13),  # past the prompt
        lambda: m.append(1, [5]),  # generating before the prompt is reserved
        lambda: m.fork(1, 2),  # tokens not computed yet
        lambda: m.commit(1, 9),  # beyond the reserved tokens
        lambda: m.slot_mapping(1, 1, start=8),
        lambda: m.page_table([1], num_tokens=[9]),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
        assert state(m)[1:] == before[1:]


def test_a_sequence_without_slots_has_no_table() -> None:
    m = KVCacheManager(16, PS)
    m.add_sequence(1, list(range(9)), reserve=0)
    assert m.num_reserved(1) == 0 and len(m.seq_pages(1)) == 0
    with pytest.raises(InvalidArgumentError, match="no slot"):
        m.page_table([1])
    assert m.block_table([1]).shape == (1, 0)
    assert m.reserve(1, 9) and m.page_table([1]).kv_last_page_len.tolist() == [1]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m: m.add_sequence(2, [1, 2], reserve=-1), InvalidArgumentError),
        (lambda m: m.add_sequence(2, [1, 2], reserve="1"), InvalidDTypeError),
        (lambda m: m.add_sequence(2, [1, 2], reserve=True), InvalidDTypeError),
        (lambda m: m.reserve(1, True), InvalidDTypeError),
        (lambda m: m.reserve(1, -2), InvalidArgumentError),
        (lambda m: m.reserve(None, 1), InvalidDTypeError),
        (lambda m: m.num_reserved("1"), InvalidDTypeError),
    ],
)
def test_wrong_reserve_arguments(call, error) -> None:  # type: ignore[no-untyped-def]
    m = KVCacheManager(16, PS)
    m.add_sequence(1, list(range(9)), reserve=2)
    before = state(m)
    with pytest.raises(error):
        call(m)
    assert state(m) == before
