"""KVCacheManager: eviction order per policy, TTL pins with an injected clock, pin budget, namespaces,
copy-on-write, the page table and stats formats, and concurrent callers."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_helpers import metric_value

import kvcore
from kvcore import CacheStats, InvalidArgumentError, KVCacheManager, PageTable

PS = 4


def toks(*pages: int, extra: int = 1) -> np.ndarray:
    """A prompt of whole pages (page k holds four copies of id k) plus ``extra`` trailing tokens."""
    ids = [p for p in pages for _ in range(PS)] + [999] * extra
    return np.array(ids, dtype=np.int32)


def cache_and_release(m: KVCacheManager, sid: int, prompt: np.ndarray, **kw: object) -> None:
    assert m.add_sequence(sid, prompt, **kw) is not None
    m.free_sequence(sid)


def evicted_order(m: KVCacheManager, prompts: dict[str, np.ndarray]) -> list[str]:
    """Evict one page at a time and report whose prefix went first."""
    order = []
    while m.stats().num_pages_cached:
        before = {name: m.peek_prefix_len(p) for name, p in prompts.items()}
        assert m.evict(1) == 1
        order += [name for name, p in prompts.items() if m.peek_prefix_len(p) < before[name]]
    return order


def test_lru_evicts_least_recently_used_first() -> None:
    m = KVCacheManager(64, PS, "lru")
    prompts = {"a": toks(1), "b": toks(2), "c": toks(3)}
    for i, p in enumerate(prompts.values()):
        cache_and_release(m, i, p)
    cache_and_release(m, 10, prompts["a"])  # a is now the most recent
    assert evicted_order(m, prompts) == ["b", "c", "a"]


def test_lfu_evicts_least_frequently_used_first() -> None:
    m = KVCacheManager(64, PS, "lfu")
    prompts = {"a": toks(1), "b": toks(2), "c": toks(3)}
    for i, p in enumerate(prompts.values()):
        cache_and_release(m, i, p)
    for sid in range(10, 13):
        cache_and_release(m, sid, prompts["a"])
    cache_and_release(m, 20, prompts["c"])
    assert evicted_order(m, prompts) == ["b", "c", "a"]


def test_priority_evicts_lower_priority_first_then_lru() -> None:
    m = KVCacheManager(64, PS, "priority")
    prompts = {"vip": toks(1), "old": toks(2), "new": toks(3)}
    cache_and_release(m, 1, prompts["vip"], priority=5)
    cache_and_release(m, 2, prompts["old"], priority=0)
    cache_and_release(m, 3, prompts["new"], priority=0)
    assert evicted_order(m, prompts) == ["old", "new", "vip"]


def test_only_unlocked_leaves_are_evicted() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, toks(1, 2, 3))  # live: its three pages are locked
    cache_and_release(m, 2, toks(1, 2, 4))  # shares pages 1, 2; page 4 is evictable
    assert m.stats().num_pages_cached == 1
    assert m.evict(10) == 1
    assert m.peek_prefix_len(toks(1, 2, 3)) == 3 * PS
    m.free_sequence(1)
    assert m.evict(10) == 3  # leaves first: the whole path goes once unlocked


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pins_keep_a_prefix_until_their_ttl_expires() -> None:
    clock = FakeClock()
    m = KVCacheManager(64, PS, clock=clock)
    system = toks(7, 8)
    cache_and_release(m, 1, system)
    assert m.pin(system, ttl_s=30.0) == 2
    s = m.stats()
    assert (s.num_pages_pinned, s.num_pages_cached) == (2, 0)
    assert m.evict(100) == 0
    clock.now += 29.0
    assert m.evict(100) == 0 and m.peek_prefix_len(system) == 2 * PS
    clock.now += 2.0  # expired
    assert m.stats().num_pages_pinned == 0
    assert m.evict(100) == 2


def test_pin_budget_is_enforced_and_a_refused_pin_changes_nothing() -> None:
    m = KVCacheManager(64, PS, pin_budget_pages=3)
    cache_and_release(m, 1, toks(1, 2))
    cache_and_release(m, 2, toks(5, 6))
    assert m.pin(toks(1, 2), 60) == 2
    before = m.stats()
    with pytest.raises(InvalidArgumentError):
        m.pin(toks(5, 6), 60)
    assert m.stats() == before
    assert m.unpin(toks(1, 2)) == 2
    assert m.pin(toks(5, 6), 60) == 2


def test_namespaces_isolate_and_public_is_shared() -> None:
    m = KVCacheManager(64, PS)
    cache_and_release(m, 1, toks(1, 2), namespace="tenant-a")
    assert m.peek_prefix_len(toks(1, 2), namespace="tenant-a") == 2 * PS
    assert m.peek_prefix_len(toks(1, 2), namespace="tenant-b") == 0
    assert m.peek_prefix_len(toks(1, 2)) == 0
    assert m.add_sequence(2, toks(1, 2), namespace="tenant-b") == 0
    cache_and_release(m, 3, toks(9), namespace=kvcore.PUBLIC_NAMESPACE)
    for ns in (None, "tenant-a", "tenant-b"):
        assert m.peek_prefix_len(toks(9, 3), namespace=ns) == PS
    # A tenant continuing a public prompt keeps its continuation private.
    cache_and_release(m, 4, toks(9, 3), namespace="tenant-a")
    assert m.peek_prefix_len(toks(9, 3), namespace="tenant-a") == 2 * PS
    assert m.peek_prefix_len(toks(9, 3), namespace="tenant-b") == PS


def test_fork_shares_pages_and_copies_on_write() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, toks(1, extra=2))  # one full page, one partial (2 tokens)
    m.fork(1, 2)
    p1 = m.seq_pages(1)
    assert m.seq_pages(2).tolist() == p1.tolist()
    assert m.ref_count(int(p1[1])) == 2
    assert m.append(2, [5])
    p2 = m.seq_pages(2)
    assert p2[0] == p1[0] and p2[1] != p1[1]
    copies = m.take_pending_copies()
    assert copies.dtype == np.int32 and copies.tolist() == [[p1[1], p2[1]]]
    assert m.take_pending_copies().shape == (0, 2)
    assert m.stats().num_cow_copies == 1
    assert m.append(1, [6])  # the parent is the sole owner now: written in place
    assert m.seq_pages(1).tolist() == p1.tolist() and m.take_pending_copies().shape == (0, 2)


def test_append_caches_full_pages_for_the_next_turn() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, toks(1, extra=1))
    assert m.append(1, [3, 3, 3, 4, 4, 4, 4])  # fills page 2 and page 3
    turn = np.concatenate([toks(1, extra=0), [999, 3, 3, 3, 4, 4, 4, 4, 5]]).astype(np.int32)
    m.free_sequence(1)
    assert m.add_sequence(2, turn) == 3 * PS


def test_out_of_pages_is_none_or_false_not_an_error() -> None:
    m = KVCacheManager(5, PS)  # 4 usable pages
    assert m.add_sequence(1, toks(1, 2, 3)) == 0  # 4 pages
    assert m.add_sequence(2, toks(5)) is None
    assert 2 not in m
    assert m.append(1, np.arange(4, dtype=np.int32)) is False
    assert m.seq_len(1) == 3 * PS + 1
    assert m.stats().num_refused == 2


def test_page_table_and_stats_formats() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, toks(1, 2, extra=3))
    m.add_sequence(2, toks(1, extra=1))
    pt = m.page_table([2, 1, 2])
    assert isinstance(pt, PageTable)
    assert pt.kv_indptr.tolist() == [0, 2, 5, 7]
    assert pt.kv_last_page_len.tolist() == [1, 3, 1]
    assert pt.kv_indices[:2].tolist() == pt.kv_indices[5:].tolist()
    empty = m.page_table([])
    assert empty.kv_indptr.tolist() == [0] and empty.kv_indices.size == 0
    s = m.stats()
    assert isinstance(s, CacheStats)
    assert s.prefix_query_tokens == (2 * PS + 3) + (PS + 1) and s.prefix_hit_tokens == PS
    assert 0 < s.hit_rate < 1
    text = m.metrics_text()
    assert metric_value(text, "kvcore_pages", state="in_use") == s.num_pages_in_use
    assert metric_value(text, "kvcore_prefix_hit_tokens_total") == PS
    assert metric_value(text, "kvcore_usage") == pytest.approx(s.usage)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_pages": 0}, InvalidArgumentError),
        ({"num_pages": 8, "page_size": 0}, InvalidArgumentError),
        ({"num_pages": 8, "eviction": "fifo"}, InvalidArgumentError),
        ({"num_pages": 8, "clock": 3}, InvalidArgumentError),
    ],
)
def test_bad_construction(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        KVCacheManager(**kwargs)  # type: ignore[arg-type]


def test_concurrent_callers_keep_the_books_exact() -> None:
    """Scheduler threads admit, extend and free sequences at once; every page comes back."""
    m = KVCacheManager(2_001, 16)
    shared = np.arange(256, dtype=np.int32)
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        rng = np.random.default_rng(tid)
        try:
            for i in range(300):
                sid = tid * 10_000 + i
                prompt = np.concatenate([shared, rng.integers(0, 50_000, rng.integers(1, 200))]).astype(
                    np.int32
                )
                if m.add_sequence(sid, prompt) is None:
                    continue
                m.append(sid, rng.integers(0, 50_000, 20).astype(np.int32))
                if i % 3 == 0:
                    m.fork(sid, sid + 5_000)
                    m.append(sid + 5_000, [1, 2, 3])
                    m.free_sequence(sid + 5_000)
                m.page_table([sid])
                m.free_sequence(sid)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # Copies queued for forks whose new page got cached still hold their sources until taken.
    sources = set(m.take_pending_copies()[:, 0].tolist())
    assert all(m.ref_count(p) == 0 or p in m.cached_pages() for p in sources)
    s = m.stats()
    assert s.num_sequences == 0 and s.num_pages_in_use == 0
    assert s.num_pages_cached + s.num_pages_free == 2_000
    assert m.evict(10_000) == s.num_pages_cached
    assert m.stats().num_pages_free == 2_000


def test_expired_pins_are_released_by_append_without_an_injected_clock() -> None:
    import time

    m = KVCacheManager(5, PS)  # 4 usable pages, monotonic clock
    cache_and_release(m, 1, toks(1, 2))  # 2 cached pages, pinned for 1 ms below
    assert m.pin(toks(1, 2), ttl_s=0.001) == 2
    m.add_sequence(2, toks(7, extra=3))  # 2 pages in use, 0 free
    time.sleep(0.01)
    assert m.append(2, np.arange(4, dtype=np.int32))  # needs one page: evicts the expired pin's


def test_a_refused_admission_does_not_raise_priorities() -> None:
    m = KVCacheManager(9, PS, "priority")  # 8 usable pages
    cache_and_release(m, 1, toks(1, 2))  # 2 cached (priority 0), older
    cache_and_release(m, 2, toks(3, 4))  # 2 cached (priority 0), newer
    assert m.add_sequence(3, toks(5, 6, 7, extra=3)) == 0  # 4 pages in use: none free
    big = np.concatenate([toks(1, 2, extra=0), np.arange(100, 140, dtype=np.int32)])
    assert m.add_sequence(4, big, priority=9) is None  # needs 11 pages: can never fit now
    assert m.evict(1) == 1
    assert m.peek_prefix_len(toks(1, 2)) < 2 * PS, "the refused request protected its prefix"
    assert m.peek_prefix_len(toks(3, 4)) == 2 * PS


def test_page_size_and_sizes_are_bounded() -> None:
    with pytest.raises(InvalidArgumentError):
        KVCacheManager(8, 2**40)
    m = KVCacheManager(8, PS)
    assert 2**70 not in m
    with pytest.raises(kvcore.InvalidPageError):
        m.ref_count(2**40)
    assert m.peek_prefix_len([1, 2, 3, 4, 5], namespace="never-seen") == 0


def test_chunked_prefill_shares_only_committed_pages() -> None:
    m = KVCacheManager(64, PS)
    prompt = toks(1, 2, 3, extra=2)
    assert m.add_sequence(1, prompt, cache_prompt=False) == 0
    assert m.peek_prefix_len(prompt) == 0  # nothing computed yet: nothing shared
    with pytest.raises(InvalidArgumentError):
        m.fork(1, 9)  # its full pages are not committed yet
    assert 9 not in m
    assert m.commit(1, 2 * PS + 1) == 2 * PS  # first chunk computed: its two full pages
    assert m.peek_prefix_len(prompt) == 2 * PS
    assert m.append(1, [5, 5])  # manual sequences cache on commit only
    assert m.peek_prefix_len(np.concatenate([prompt, [5, 5, 0]]).astype(np.int32)) == 2 * PS
    assert m.commit(1, m.seq_len(1)) == 4 * PS
    m.free_sequence(1)
    assert m.stats().num_pages_cached == 4


def test_a_sequence_freed_before_its_prefill_finished_leaves_nothing_half_written() -> None:
    m = KVCacheManager(64, PS)
    prompt = toks(1, 2, 3, extra=2)
    m.add_sequence(1, prompt, cache_prompt=False)
    m.commit(1, PS)
    m.free_sequence(1)  # aborted after one chunk
    assert m.peek_prefix_len(prompt) == PS
    assert m.add_sequence(2, prompt) == PS


def test_page_table_into_reused_buffers() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, toks(1, 2, extra=3))
    m.add_sequence(2, toks(1, extra=1))
    buf = PageTable(np.full(8, -7, np.int32), np.full(16, -7, np.int32), np.full(8, -7, np.int32))
    pt = m.page_table([2, 1], out=buf)
    fresh = m.page_table([2, 1])
    for got, want, storage in zip(pt, fresh, buf, strict=True):
        assert got.tolist() == want.tolist()
        assert np.shares_memory(got, storage)  # views of the caller's buffers: nothing allocated
    # Too short: an error, and nothing written.
    short = PageTable(np.full(8, -7, np.int32), np.full(2, -7, np.int32), np.full(8, -7, np.int32))
    with pytest.raises(InvalidArgumentError):
        m.page_table([2, 1], out=short)
    assert all((a == -7).all() for a in short)
    with pytest.raises(kvcore.InvalidDTypeError):
        m.page_table([1], out=PageTable(np.zeros(8, np.int64), buf.kv_indices, buf.kv_last_page_len))
    frozen = np.zeros(8, np.int32)
    frozen.flags.writeable = False
    with pytest.raises(kvcore.InvalidDTypeError):
        m.page_table([1], out=PageTable(frozen, buf.kv_indices, buf.kv_last_page_len))
    with pytest.raises(kvcore.UnknownSequenceError):
        m.page_table([1, 99], out=buf)


@pytest.mark.parametrize("length", [1, 7, 8, 33, 2_049])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_negative_token_ids_in_an_int32_array_are_refused_and_change_nothing(length: int, where: str) -> None:
    m = KVCacheManager(length // PS + 2, PS)
    prompt = np.arange(length, dtype=np.int32)
    prompt[{"first": 0, "middle": length // 2, "last": length - 1}[where]] = -1
    before = m.stats()
    for call in (lambda: m.add_sequence(1, prompt), lambda: m.peek_prefix_len(prompt)):
        with pytest.raises(InvalidArgumentError, match="non-negative"):
            call()
    assert 1 not in m and m.stats() == before
    prompt[prompt < 0] = np.iinfo(np.int32).max  # the largest id is valid
    assert m.add_sequence(1, prompt) == 0


@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    cuts=st.data(),
    ps=st.sampled_from([1, 4, 16]),
)
@settings(max_examples=60, deadline=None)
def test_batch_layout_equals_page_table_and_slot_mapping(
    lens: list[int], cuts: st.DataObject, ps: int
) -> None:
    """One call lays out a step: the page table cut at each row's end, q_indptr, positions and
    slots, exactly what page_table(num_tokens=ends) and slot_mapping give row by row."""
    m = KVCacheManager(sum(-(-n // ps) for n in lens) + 8, ps)
    for sid, n in enumerate(lens):
        assert m.add_sequence(sid, np.arange(n, dtype=np.int32) + 100 * sid, cache_prompt=False) is not None
    ids = list(range(len(lens)))[::-1]  # any order
    starts, counts = [], []
    for sid in ids:
        start = cuts.draw(st.integers(0, lens[sid] - 1))
        starts.append(start)
        counts.append(cuts.draw(st.integers(1, lens[sid] - start)))
    lay = m.batch_layout(np.array(ids), np.array(starts, np.int32), counts)
    ends = [s + c for s, c in zip(starts, counts, strict=True)]
    want = m.page_table(ids, num_tokens=ends)
    for got, ref in zip(lay.page_table, want, strict=True):
        assert got.dtype == np.int32 and got.tolist() == ref.tolist()
    assert lay.q_indptr.dtype == np.int32 and lay.q_indptr.tolist() == [0, *np.cumsum(counts).tolist()]
    assert lay.positions.dtype == np.int32
    assert lay.positions.tolist() == [t for s, e in zip(starts, ends, strict=True) for t in range(s, e)]
    slots = [m.slot_mapping(sid, c, s) for sid, s, c in zip(ids, starts, counts, strict=True)]
    assert lay.slot_mapping.dtype == np.int64
    assert lay.slot_mapping.tolist() == np.concatenate(slots).tolist()


def test_batch_layout_refuses_bad_rows_by_name() -> None:
    m = KVCacheManager(64, PS, groups=[None, 2 * PS])
    m.add_sequence(1, np.arange(6 * PS, dtype=np.int32), cache_prompt=False)
    m.add_sequence(2, np.arange(3, dtype=np.int32), cache_prompt=False)
    before = m.stats()
    bad = [
        (([1, 2], [0], [1, 1]), InvalidArgumentError, "2 sequences, 1 starts"),
        (([1], [0], [0]), InvalidArgumentError, "at least one"),
        (([2], [2], [2]), InvalidArgumentError, "within its 3 reserved"),
        (([1], [-1], [1]), InvalidArgumentError, "starts"),
        (([7], [0], [1]), kvcore.UnknownSequenceError, "7"),
        (([1], [2**62], [2**62]), InvalidArgumentError, "reserved"),
    ]
    for args, error, match in bad:
        with pytest.raises(error, match=match):
            m.batch_layout(*args)
    assert m.stats() == before  # read-only, and a refused call changes nothing
    m.commit(1, 6 * PS)
    assert m.append(1, [5])  # the window group releases the pages before its window
    with pytest.raises(InvalidArgumentError, match="released"):
        m.batch_layout([1], [0], [1], group=1)
    tail = m.batch_layout([1], [6 * PS], [1], group=1)  # the new token's page is live
    assert tail.slot_mapping.tolist() == m.slot_mapping(1, 1, 6 * PS, group=1).tolist()
    assert m.batch_layout([], [], []).q_indptr.tolist() == [0]
