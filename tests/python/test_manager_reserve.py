"""Allocation per chunk: add_sequence(reserve=...) and reserve()."""

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


# ----- speculative decoding: append(num_lookahead=...) and truncate ---------------------------------


def test_lookahead_reserves_draft_slots_and_accepted_drafts_use_them() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, list(range(6)))
    assert m.append(1, [7], num_lookahead=3)  # the new token and 3 draft slots
    assert (m.seq_len(1), m.num_reserved(1), len(m.seq_pages(1))) == (7, 10, 3)
    drafts = m.slot_mapping(1, 4, start=6)  # where the token and the drafts' K/V go
    assert m.append(1, [8, 9])  # two drafts accepted: their slots were already reserved
    # The third draft's slot goes with this append (it asks for no lookahead): no table covers it.
    assert (m.seq_len(1), m.num_reserved(1)) == (9, 9)
    assert m.slot_mapping(1, 2, start=7).tolist() == drafts[1:3].tolist()
    assert m.page_table([1]).kv_last_page_len.tolist() == [9 - 2 * PS]
    m.truncate(1, 9)  # nothing left to roll back
    assert m.num_reserved(1) == 9


def test_stale_draft_slots_are_released_by_the_next_append() -> None:
    """An engine that stops speculating (or lowers k) never reads stale draft slots."""
    m = KVCacheManager(64, PS)
    m.add_sequence(2, list(range(6)))
    assert m.append(2, [7], num_lookahead=3)
    pages = m.seq_pages(2).tolist()
    assert len(pages) == 3
    assert m.append(2, [])  # no draft accepted, none asked: the draft slots go
    assert (m.seq_len(2), m.num_reserved(2)) == (7, 7)
    assert m.seq_pages(2).tolist() == pages[:2] and m.ref_count(pages[2]) == 0
    assert m.append(2, [8])
    assert m.slot_mapping(2, 1, start=7).tolist() == [pages[1] * PS + 7 % PS]
    assert m.append(2, [9], num_lookahead=1)  # a smaller lookahead: exactly one draft slot
    assert m.num_reserved(2) == 10
    m._check_invariants()


def test_truncate_releases_pages_and_keeps_cached_ones_cached() -> None:
    m = KVCacheManager(64, PS)
    tokens = list(range(100, 114))  # 14 tokens: 3 full pages cached, 1 partial
    m.add_sequence(1, tokens)
    pages = m.seq_pages(1).tolist()
    m.truncate(1, 5)  # keeps pages 0 (full) and 1 (cached, now ends inside it)
    assert m.seq_pages(1).tolist() == pages[:2] and m.seq_len(1) == 5
    assert m.ref_count(pages[3]) == 0  # the partial page is free again
    assert m.peek_prefix_len(tokens) == 12  # the cached prefix is intact
    s = m.stats()
    # Page 1 is still held (and locked) by the sequence; page 2 is cached and evictable.
    assert (s.num_pages_in_use, s.num_pages_cached) == (2, 1)
    assert m.evict(10) == 1 and m.stats().num_pages_free == 63 - 2


def test_a_truncated_cached_page_is_copied_before_it_is_written() -> None:
    m = KVCacheManager(64, PS)
    tokens = list(range(100, 110))
    m.add_sequence(1, tokens)
    cached_page = int(m.seq_pages(1)[1])  # tokens 4..7, cached
    m.truncate(1, 6)
    assert m.append(1, [55])  # writes slot 6: inside the cached page, so copy it first
    pairs = m.take_pending_copies().tolist()
    own = int(m.seq_pages(1)[1])
    assert own != cached_page and pairs == [[cached_page, own]]
    assert m.peek_prefix_len(tokens) == 8  # the cached page still holds tokens 4..7
    m.add_sequence(2, [*tokens[:8], 1])
    assert int(m.seq_pages(2)[1]) == cached_page
    s = m.stats()
    assert s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free == 63


def test_truncate_mistakes_change_nothing() -> None:
    m = KVCacheManager(16, PS)
    m.add_sequence(1, list(range(9)))
    before = state(m)
    for call, error in (
        (lambda: m.truncate(1, 0), InvalidArgumentError),
        (lambda: m.truncate(1, 10), InvalidArgumentError),
        (lambda: m.truncate(1, -1), InvalidArgumentError),
        (lambda: m.truncate(1, 2.0), InvalidDTypeError),
        (lambda: m.append(1, [1], num_lookahead=-1), InvalidArgumentError),
        (lambda: m.append(1, [1], num_lookahead=True), InvalidDTypeError),
    ):
        with pytest.raises(error):
            call()
        assert state(m) == before


def test_a_cached_page_copied_after_a_truncate_stays_locked_until_the_copy_is_taken() -> None:
    """Found by the Rust model (tests/rust/manager.rs): the cached page a truncated sequence copies
    is read by the queued copy, so it must not count as evictable (evicting it frees nothing)."""
    m = KVCacheManager(13, 2)  # 12 usable pages of 2 tokens
    m.add_sequence(1, [0, 2, 0, 0])  # two cached pages
    cached = int(m.seq_pages(1)[0])
    m.truncate(1, 1)
    assert m.append(1, [0, 0], num_lookahead=2)  # copies the cached page first
    s = m.stats()
    free_before = s.num_pages_free
    evicted = m.evict(100)
    assert m.stats().num_pages_free == free_before + evicted  # every evicted page came back
    assert cached in m.cached_pages().tolist()  # the copy's source is still cached
    assert m.take_pending_copies().tolist() == [[cached, int(m.seq_pages(1)[0])]]
    assert m.evict(100) == 1 and m.ref_count(cached) == 0


def test_the_cached_prefix_of_a_chunked_prefill_counts_as_computed() -> None:
    m = KVCacheManager(16, 1)
    pages = m.allocate_pages(1)
    assert pages is not None and m.insert([2], pages, namespace="*") == 1
    assert m.add_sequence(1, [2, 0], cache_prompt=False) == 1  # token 2 comes from the cache
    m.truncate(1, 1)  # what is left is all cached: computed
    m.fork(1, 2)


@pytest.mark.parametrize("k", [2**33, 2**40, 2**63 - 1])
def test_a_lookahead_no_pool_could_hold_is_refused_before_anything_is_sized(k: int) -> None:
    """Found by review: a huge num_lookahead sized a vector before the pool refused it (a panic,
    or an abort of the process for 2**40)."""
    m = KVCacheManager(8, 2)
    m.add_sequence(1, [0, 1, 2])
    before = state(m)
    assert m.append(1, [1], num_lookahead=k) is False  # no room, as for any lack of pages
    after = state(m)
    assert after[0].pop("num_refused") == 1 and before[0].pop("num_refused") == 0  # type: ignore[attr-defined]
    assert after == before
    with pytest.raises(InvalidArgumentError, match="num_lookahead"):  # beyond int64: not a count
        m.append(1, [1], num_lookahead=2**64 - 1)
    assert m.append(1, [1], num_lookahead=2)
