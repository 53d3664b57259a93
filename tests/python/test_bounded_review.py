"""Bounded caches (F8), hostile review of 2026-12-02: each test failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import InvalidArgumentError, KVCacheManager

PS = 4


@pytest.mark.parametrize("groups", [None, [8, None]])
def test_a_streaming_sequence_admitted_over_a_hit_releases_the_hit_pages_between_sinks_and_recent(
    groups: list[int | None] | None,
) -> None:
    """It kept every hit page (40 keys read instead of 12: not StreamingLLM, memory unbounded)."""
    m = KVCacheManager(200, PS, groups=groups)
    prompt = list(range(1, 42))
    m.add_sequence(1, prompt)
    m.append(1, [7])
    m.free_sequence(1)  # 40 tokens cached
    sinks, recent = 4, 8
    assert m.add_sequence(2, [*prompt, 3, 4], sink_tokens=sinks, recent_tokens=recent) == 40
    m.append(2, [9])  # 44 tokens, 43 computed
    full = len(m.groups) - 1
    table = m.seq_pages(2, group=full).tolist()
    # The model: sink pages, and pages holding one of the last `recent` keys of the next query.
    computed = 43
    want = [i for i in range(len(table)) if i < -(-sinks // PS) or (i + 1) * PS - 1 >= computed + 1 - recent]
    assert [i for i, p in enumerate(table) if p] == want
    assert len(m.positions([2], group=full)) == sum(
        min(PS, 44 - i * PS) for i in want
    )  # what the kernels read
    m.free_sequence(2)
    s = m.stats()
    assert s.num_pages_in_use == 0 and s.num_sequences == 0


def test_slot_mapping_refuses_a_range_over_released_pages() -> None:
    """Only the first page of the range was checked: slots on the null page 0 came back."""
    m = KVCacheManager(100, PS)
    m.add_sequence(1, list(range(1, 30)), sink_tokens=4, recent_tokens=8)
    m.append(1, [5])
    with pytest.raises(InvalidArgumentError, match="released"):
        m.slot_mapping(1, 30, start=0)
    slots = m.slot_mapping(1, 4, start=0)  # the sink page alone is fine
    assert np.all(slots // PS != 0)
    m2 = KVCacheManager(100, PS)
    m2.add_sequence(2, list(range(1, 30)))
    m2.append(2, [5])
    assert m2.compact(2, [5, 0, 5, 5, 5, 5, 5, 5], 7) == 1
    with pytest.raises(InvalidArgumentError, match="token 4's page"):
        m2.slot_mapping(2, 12, start=0)
    assert np.all(m2.slot_mapping(2, 22, start=8) // PS != 0)


def test_compact_with_draft_slots_keeps_the_window_the_next_query_reads() -> None:
    """compact counted reserved draft slots as computed: the next append released a window page
    its own query needed."""
    window, k = 8, 3
    m = KVCacheManager(200, PS, groups=[window, None])
    m.add_sequence(1, list(range(1, 30)))
    m.append(1, [5], num_lookahead=k)
    scores = [1.0] * len(m.seq_pages(1, group=1))
    scores[1] = 0.0
    assert m.compact(1, scores, len(scores) - 1) == 1
    m.append(1, [6])  # every draft rejected: the bonus token sits at position 30
    table = m.seq_pages(1, group=0).tolist()
    q = 30
    assert all(table[t // PS] != 0 for t in range(q - window + 1, q + 1))


def test_compact_on_a_window_only_manager_is_refused() -> None:
    """It reported 9 pages released, released none, and made the sequence private."""
    m = KVCacheManager(200, PS, groups=[8])
    m.add_sequence(1, list(range(1, 42)))
    before = m.seq_pages(1).tolist()
    with pytest.raises(InvalidArgumentError, match="sliding window"):
        m.compact(1, [1.0] * len(before), 2)
    assert m.seq_pages(1).tolist() == before
    m.append(1, [7])
    m.free_sequence(1)
    assert m.peek_prefix_len(list(range(1, 42))) == 40  # not made private


def test_match_prefix_on_a_window_only_manager_gives_its_pages() -> None:
    """PrefixMatch(num_tokens=40, pages=[]): the count and the pages disagreed."""
    prompt = list(range(1, 42))
    m = KVCacheManager(200, PS, groups=[8])
    m.add_sequence(1, prompt)
    m.append(1, [7])
    m.free_sequence(1)
    pm = m.match_prefix(prompt)
    assert pm.num_tokens == len(pm.pages) * PS == 40
    assert np.all(pm.pages[-2:] != 0)  # the window's pages before the hit point
    assert m.add_sequence(2, prompt) == 40
    assert m.seq_pages(2)[8:10].tolist() == pm.pages[8:10].tolist()  # the very pages it takes


@pytest.mark.parametrize("groups", [[8, None], [8]])
def test_peek_hit_tokens_is_what_an_admission_would_find_with_groups(groups: list[int | None]) -> None:
    """It read the tree alone: 40 HBM tokens where a hybrid admission found 0 (its window pages
    evicted), 0 where a window-only admission found 40."""
    prompt = list(range(1, 42))
    m = KVCacheManager(200, PS, groups=groups)
    m.add_sequence(1, prompt)
    m.append(1, [7])
    m.free_sequence(1)
    assert m.peek_hit_tokens(prompt) == {"hbm": m.peek_prefix_len(prompt)} == {"hbm": 40}
    m.evict(3)  # the least recently used: group caches and tree in proportion
    want = m.peek_prefix_len(prompt)
    assert m.peek_hit_tokens(prompt) == {"hbm": want}
    assert m.add_sequence(2, prompt) == want


def test_a_window_only_manager_keeps_a_tenants_prefix_and_shares_public_ones() -> None:
    """Every group windowed (Mistral): a named tenant's prefix was never hit again once its last
    sequence ended (its name was forgotten while the group cache held its pages), and a public
    prefix was invisible from every other namespace."""
    prompt = list(range(1, 42))
    m = KVCacheManager(200, PS, groups=[8])
    m.add_sequence(1, prompt, "tenant-a")
    m.append(1, [7])
    m.free_sequence(1)
    assert m.num_namespaces() == 1  # kept: its pages are cached
    assert m.add_sequence(2, [*prompt, 5], "tenant-a") == 40
    m.free_sequence(2)
    assert m.peek_prefix_len(prompt, "tenant-b") == 0  # never another tenant's
    system = list(range(100, 141))
    m.add_sequence(3, system, "*")
    m.append(3, [7])
    m.free_sequence(3)
    for ns in (None, "tenant-b", "never-seen"):
        assert m.peek_prefix_len(system, ns) == 40
    # A tenant's own pages after the public prefix chain from it, and hit for that tenant only.
    mine = [*system[:40], *range(200, 221)]
    assert m.add_sequence(4, mine, "tenant-b") == 40
    m.append(4, [7])
    m.free_sequence(4)
    assert m.peek_prefix_len(mine, "tenant-b") == 60
    assert m.peek_prefix_len(mine, "tenant-a") == 40
    m.reset_prefix_cache()
    assert m.num_namespaces() == 0  # forgotten once nothing is cached


@pytest.mark.parametrize("groups", [[8, None], [8]])
def test_a_ttl_pin_keeps_a_grouped_managers_hit_until_it_expires(groups: list[int | None]) -> None:
    """pin() protected the tree's pages only: the window group's pages were evicted anyway (hybrid:
    the hit fell to 0) and a window-only manager pinned nothing."""
    t = [0.0]
    prompt = list(range(1, 42))
    m = KVCacheManager(200, PS, groups=groups, clock=lambda: t[0])

    def split_ok() -> None:
        s = m.stats()
        assert (
            s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free
            == s.num_pages_total
        )

    m.add_sequence(1, prompt)
    m.append(1, [7])
    m.free_sequence(1)
    assert m.pin(prompt, 100) == 10
    split_ok()
    assert m.stats().num_pages_pinned >= 2  # at least the window's two pages
    m.evict(10**6)
    assert m.peek_prefix_len(prompt) == 40
    split_ok()
    # A sequence using the pinned pages, then leaving: they stay pinned.
    assert m.add_sequence(2, prompt) == 40
    m.free_sequence(2)
    m.evict(10**6)
    assert m.peek_prefix_len(prompt) == 40
    t[0] = 101.0  # expired: ordinary LRU pages again
    split_ok()
    assert m.stats().num_pages_pinned == 0
    m.evict(10**6)
    assert m.peek_prefix_len(prompt) == 0
    split_ok()
    # unpin and cap_pins release them too.
    m.add_sequence(3, prompt)
    m.append(3, [7])
    m.free_sequence(3)
    m.pin(prompt, 100)
    assert m.unpin(prompt) > 0
    m.evict(10**6)
    assert m.peek_prefix_len(prompt) == 0
    m.add_sequence(4, prompt)
    m.append(4, [7])
    m.free_sequence(4)
    m.pin(prompt, 1000)
    assert m.cap_pins(5) > 0
    t[0] = 107.0
    m.evict(10**6)
    assert m.peek_prefix_len(prompt) == 0
    assert m.stats().num_pages_free == 199


def test_the_tiny_engine_refuses_a_plan_over_released_pages() -> None:
    """It ran its kernels over the null page 0 (InvalidPageError mid-step, after writing K/V)."""
    from kvcore.scheduler import Request, Scheduler
    from kvcore.tiny import TinyDecoder, TinyEngine

    model = TinyDecoder(1, "fp16")
    m = KVCacheManager(200, PS, groups=[8, None])
    pool = TinyEngine.make_pool(model, 200, PS)
    eng = TinyEngine(model, pool)
    s = Scheduler(m, max_num_batched_tokens=64)
    s.submit(Request(1, list(range(1, 30)), 10), 0.0)
    with pytest.raises(InvalidArgumentError, match="released pages"):
        for step in range(40):
            plan = s.step(float(step))
            before = pool.data.copy()
            s.update(plan, eng.forward(plan))
    assert np.array_equal(before, pool.data)  # refused before anything was written
