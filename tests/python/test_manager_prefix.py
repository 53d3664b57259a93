"""The prefix cache driven directly: match_prefix without side effects,
pages loaded elsewhere inserted into the tree, and reset_prefix_cache."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
from kvcore import InvalidArgumentError, InvalidPageError, KVCacheManager, PrefixMatch
from kvcore.events import PageRemoved, PageStored

PS = 4


def cached(m: KVCacheManager, sid: int, tokens: list[int], **kw: object) -> None:
    assert m.add_sequence(sid, tokens, **kw) is not None
    m.free_sequence(sid)


def test_match_prefix_returns_the_pages_and_touches_nothing() -> None:
    m = KVCacheManager(64, PS, "lru")
    a, b = list(range(12)), list(range(100, 112))
    cached(m, 1, [*a, 0])
    cached(m, 2, [*b, 0])
    found = m.match_prefix([*a, 7, 7])
    assert isinstance(found, PrefixMatch) and found.num_tokens == 12
    assert found.pages.dtype == np.int32 and len(found.pages) == 3
    assert m.match_prefix(a[:6]).num_tokens == 4  # whole pages only
    assert m.match_prefix(a, namespace="other").num_tokens == 0
    # No recency touched: a is still the least recently used and goes first.
    m.evict(3)
    assert m.match_prefix(a).num_tokens == 0 and m.match_prefix(b).num_tokens == 12


def test_pages_loaded_elsewhere_are_inserted_and_hit() -> None:
    m = KVCacheManager(64, PS)
    tokens = list(range(200, 212))
    pages = m.allocate_pages(3)
    assert pages is not None and m.caller_held_pages() == {int(p): 1 for p in pages}
    assert m.stats().num_pages_in_use == 3  # held by the caller
    assert m.insert(tokens, pages) == 3
    assert m.caller_held_pages() == {}  # the tree took over the references
    assert m.stats().num_pages_cached == 3
    assert m.add_sequence(1, [*tokens, 9]) == 12
    assert m.seq_pages(1)[:3].tolist() == pages.tolist()


def test_a_prefix_already_cached_is_left_to_the_caller() -> None:
    m = KVCacheManager(64, PS)
    tokens = list(range(300, 312))
    cached(m, 1, [*tokens[:8], 0])  # the first two pages are cached already
    pages = m.allocate_pages(3)
    assert pages is not None
    assert m.insert(tokens, pages) == 1  # only the third page is new
    assert m.caller_held_pages() == {int(pages[0]): 1, int(pages[1]): 1}
    m.free_pages(pages[:2])
    s = m.stats()
    assert s.num_pages_cached == 3 and s.num_pages_free == 60 and s.num_pages_in_use == 0


def test_insert_refuses_what_the_caller_does_not_hold_and_changes_nothing() -> None:
    m = KVCacheManager(64, PS)
    m.add_sequence(1, list(range(9)))
    own = m.seq_pages(1)[:2]
    held = m.allocate_pages(2)
    assert held is not None
    before = (m.stats(), m.caller_held_pages(), sorted(m.cached_pages().tolist()))
    bad = [
        (lambda: m.insert(list(range(50, 58)), own), InvalidPageError),  # a live sequence's pages
        (lambda: m.insert(list(range(50, 58)), [int(held[0])] * 2), InvalidPageError),  # listed twice
        (lambda: m.insert(list(range(50, 57)), held), InvalidArgumentError),  # 7 tokens for 2 pages
        (lambda: m.free_pages([int(held[0])] * 2), InvalidPageError),  # held once
        (lambda: m.free_pages(own), InvalidPageError),
        (lambda: m.insert(list(range(8)), [0, int(held[0])]), InvalidPageError),
    ]
    for call, error in bad:
        with pytest.raises(error):
            call()
        assert (m.stats(), m.caller_held_pages(), sorted(m.cached_pages().tolist())) == before


def test_an_insert_under_a_new_namespace_keeps_it_only_while_cached() -> None:
    m = KVCacheManager(64, PS)
    pages = m.allocate_pages(1)
    assert pages is not None
    assert m.insert([1, 2, 3, 4], pages, namespace="tenant") == 1
    assert m.num_namespaces() == 1
    assert m.match_prefix([1, 2, 3, 4], namespace="tenant").num_tokens == 4
    assert m.match_prefix([1, 2, 3, 4]).num_tokens == 0  # the default namespace sees nothing
    m.evict(10)
    assert m.num_namespaces() == 0


def test_allocate_pages_evicts_and_refuses_without_changing_anything() -> None:
    m = KVCacheManager(5, PS)  # 4 usable pages
    cached(m, 1, list(range(8)))  # 2 cached pages
    assert m.allocate_pages(3) is not None  # evicts one
    before = m.stats()
    assert m.allocate_pages(2) is None  # 1 free + 1 evictable
    after = m.stats()
    assert (after.num_pages_cached, after.num_pages_free) == (before.num_pages_cached, before.num_pages_free)
    with pytest.raises(InvalidArgumentError):
        m.allocate_pages(5)


def test_reset_prefix_cache_drops_cached_and_pinned_pages_but_not_live_ones() -> None:
    m = KVCacheManager(64, PS)
    cached(m, 1, list(range(8)))
    cached(m, 2, list(range(50, 58)))
    assert m.pin(list(range(50, 58)), 100.0) == 2
    m.add_sequence(3, list(range(100, 109)))  # live: its two full pages stay
    assert m.reset_prefix_cache() == 4
    s = m.stats()
    assert s.num_pages_cached == 0 and s.num_pages_pinned == 0
    assert m.peek_prefix_len(list(range(8))) == 0 and m.peek_prefix_len(list(range(50, 58))) == 0
    assert m.peek_prefix_len(list(range(100, 109))) == 8
    assert m.seq_len(3) == 9
    m.free_sequence(3)
    assert m.reset_prefix_cache() == 2 and m.stats().num_pages_free == 63


def test_a_cached_copy_source_is_not_counted_evictable_until_the_copy_is_taken() -> None:
    """A queued copy holds its source: once that page fills and is cached, the tree must not count
    it as evictable (evicting it would free nothing), or a refusal would have evicted already."""
    m = KVCacheManager(5, PS)  # 4 usable pages
    m.add_sequence(1, [1, 2, 3, 4, 5, 6])  # p1 (full, cached), p2 (partial)
    m.fork(1, 2)
    assert m.append(2, [7])  # copies p2 -> p3: p2 is held by the copy
    assert m.append(1, [8, 9])  # sequence 1 fills p2, which is cached
    m.free_sequence(1)  # p2 is now only the tree's and the copy's
    s = m.stats()
    assert (s.num_pages_cached, s.num_pages_in_use, s.num_pages_free) == (0, 3, 1)
    before = m.stats()
    assert m.add_sequence(3, list(range(100, 108))) is None  # 2 pages: only 1 can be had
    assert m.stats().num_evicted_pages == before.num_evicted_pages  # the refusal evicted nothing
    m.take_pending_copies()  # the copy is done: p2 is an ordinary cached page again
    assert m.stats().num_pages_cached == 1
    assert m.add_sequence(3, list(range(100, 108))) == 0


def test_a_cancelled_copy_makes_its_cached_source_evictable_again() -> None:
    m = KVCacheManager(5, PS)
    m.add_sequence(1, [1, 2, 3, 4, 5, 6])
    m.fork(1, 2)
    assert m.append(2, [7])
    assert m.append(1, [8, 9])
    m.free_sequence(1)
    m.free_sequence(2)  # its copy is cancelled: nothing holds p2 beyond the tree
    s = m.stats()
    assert (s.num_pages_cached, s.num_pages_in_use, s.num_pages_free) == (2, 0, 2)
    assert m.take_pending_copies().shape == (0, 2)


def test_prefix_match_is_exported() -> None:
    assert kvcore.PrefixMatch is PrefixMatch


def test_usage_counts_pages_in_use_and_occupancy_everything_not_free() -> None:
    m = KVCacheManager(11, PS)  # 10 usable pages
    cached(m, 1, list(range(16)))  # 4 cached pages, nothing in use
    s = m.stats()
    assert s.usage == 0.0 and s.occupancy == pytest.approx(0.4)
    m.add_sequence(2, list(range(100, 108)))  # 2 pages in use (and cached)
    s = m.stats()
    assert s.usage == pytest.approx(0.2) and s.occupancy == pytest.approx(0.6)


def _live_pages(m: KVCacheManager, *ids: int) -> int:
    return len({int(p) for i in ids for p in m.seq_pages(i)})


def test_a_recomputed_last_page_replaces_the_cached_copy_once_computed() -> None:
    """A fully cached page-aligned prompt recomputes its last page (the model needs its logits) into a
    fresh page. Until that page is computed (the next append), the cached copy stays; then the tree
    takes the sequence's copy and frees its own, so nothing is counted in use that no sequence uses."""
    m = KVCacheManager(20, PS, events=True)
    prompt = list(range(1, 2 * PS + 1))  # 2 full pages
    cached(m, 1, prompt)
    m.take_events()
    old = m.match_prefix(prompt).pages.tolist()
    m.add_sequence(2, prompt)
    mine = m.seq_pages(2).tolist()
    assert mine[0] == old[0] and mine[1] != old[1]  # the hit stops one page short: a fresh last page
    assert m.stats().num_pages_in_use == 3  # the cached copy is still the valid one this step
    assert m.append(2, [99])
    s = m.stats()
    assert s.num_pages_in_use == _live_pages(m, 2) == 3 and s.num_pages_cached == 0
    assert m.match_prefix(prompt).pages.tolist() == mine[:2]  # the tree holds the sequence's copy
    assert s.num_pages_free == 20 - 1 - 3  # the old copy went back to the pool
    events = m.take_events()
    removed = [e for e in events if isinstance(e, PageRemoved)]
    stored = [e for e in events if isinstance(e, PageStored)]
    assert [e.pages for e in removed] == [[old[1]]] and [mine[1]] in [e.pages for e in stored]
    m.free_sequence(2)
    s = m.stats()
    assert s.num_pages_in_use == 0 and s.num_pages_cached == 2 and s.num_pages_free == 17


def test_a_committed_copy_replaces_the_cached_one_at_once() -> None:
    m = KVCacheManager(20, PS)
    prompt = list(range(1, 2 * PS + 1))
    cached(m, 1, prompt)
    m.add_sequence(2, prompt, cache_prompt=False)
    m.commit(2, 2 * PS)  # the engine computed the prompt: its copy is the one to keep
    s = m.stats()
    assert s.num_pages_in_use == _live_pages(m, 2) == 2 and s.num_pages_cached == 0
    assert m.match_prefix(prompt).pages.tolist() == m.seq_pages(2).tolist()


def test_a_cached_copy_another_sequence_holds_is_kept_and_shared() -> None:
    """Two sequences recompute the same last page: the tree's copy is locked by both, so the tree
    keeps it (a swap would free a page the other's lock protects); each sequence, once its copy is
    computed, uses the tree's and frees its own: one page for the three, none freed under a holder."""
    m = KVCacheManager(20, PS)
    prompt = list(range(1, 2 * PS + 1))
    cached(m, 1, prompt)
    tree_copy = m.match_prefix(prompt).pages.tolist()
    m.add_sequence(2, prompt)
    m.add_sequence(3, prompt)
    own = {int(m.seq_pages(2)[1]), int(m.seq_pages(3)[1])}
    assert own.isdisjoint(tree_copy) and len(own) == 2
    assert m.append(2, [7]) and m.append(3, [8])
    assert m.match_prefix(prompt).pages.tolist() == tree_copy
    assert m.seq_pages(2)[:2].tolist() == m.seq_pages(3)[:2].tolist() == tree_copy
    s = m.stats()
    assert s.num_pages_in_use == _live_pages(m, 2, 3) == 4  # 2 shared + one new page each
    assert s.num_pages_free == 19 - 4
    m._check_invariants()
    m.free_sequence(2)
    m.free_sequence(3)
    s = m.stats()
    assert s.num_pages_in_use == 0 and s.num_pages_free + s.num_pages_cached == 19


def test_a_tenant_recomputing_a_public_page_shares_the_public_copy() -> None:
    """A public node never takes a tenant's page: a tenant that computed its own copy of a page the
    public path holds shares the public copy (its path locks it anyway) and frees its own, rather
    than holding two pages for one until it is freed."""
    m = KVCacheManager(6, 5)
    prompt = list(range(9))
    assert m.add_sequence(0, prompt, "*", cache_prompt=False) is not None
    m.append(0, [1])
    m.commit(0, 10)  # two public pages: [0..4], [5..8, 1]
    public = m.match_prefix([*prompt, 1], "*").pages.tolist()
    m.free_sequence(0)
    assert m.add_sequence(1, prompt, "a", cache_prompt=False) == 5  # the first public page
    m.commit(1, 9)
    m.append(1, [1])  # the same tokens: a copy of the second public page
    own = int(m.seq_pages(1)[1])
    assert own not in public
    m.commit(1, 10)
    assert m.seq_pages(1).tolist() == public
    assert m.stats().num_pages_in_use == 2 and m.stats().num_pages_free == 3
    m.append(1, [1])
    m.append(1, [1])
    m.commit(1, 12)
    m.evict(100)
    assert m.stats().num_pages_in_use == _live_pages(m, 1) == 3
    m._check_invariants()
    m.free_sequence(1)
    assert m.match_prefix([*prompt, 1], "a").pages.tolist() == public  # the tenant hits it still
    m._check_invariants()


def test_a_copy_cut_by_truncate_is_not_adopted_when_its_page_is_refilled() -> None:
    """A recomputed last page, truncated away before its copy was adopted, then refilled with the same
    tokens in one append: that new copy is written by this very step, so the tree keeps its computed
    copy until the next append (a stale range adopted at once would free the only computed copy)."""
    m = KVCacheManager(20, PS)
    prompt = list(range(1, 2 * PS + 1))
    cached(m, 1, prompt)
    tree_copy = m.match_prefix(prompt).pages.tolist()
    m.add_sequence(2, prompt)
    m.truncate(2, PS)  # back to the first page: the recomputed last page is released
    assert m.append(2, prompt[PS:])  # the same tokens again, into a fresh page
    assert m.match_prefix(prompt).pages.tolist() == tree_copy  # not swapped in the step that writes it
    assert m.append(2, [99])  # that page is computed now: the tree takes it
    mine = m.seq_pages(2).tolist()
    assert m.match_prefix(prompt).pages.tolist() == mine[:2] != tree_copy


def test_commit_on_a_caching_sequence_does_not_adopt_its_uncomputed_copy() -> None:
    """commit is harmless on a cache_prompt=True sequence: it does not adopt the recomputed last page
    (reserved at admission, computed only by the step before the next append)."""
    m = KVCacheManager(20, PS)
    prompt = list(range(1, 2 * PS + 1))
    cached(m, 1, prompt)
    tree_copy = m.match_prefix(prompt).pages.tolist()
    m.add_sequence(2, prompt)
    m.commit(2, PS)
    assert m.match_prefix(prompt).pages.tolist() == tree_copy
    assert m.append(2, [5])
    assert m.match_prefix(prompt).pages.tolist() == m.seq_pages(2).tolist()[:2]
