"""TTL pins on grouped managers and the miss-ratio curve of sequences that do not cache, hostile
review of 2026-12-02 (second pass): each test failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import InvalidArgumentError, KVCacheManager

PS = 4
GROUPED = [[None, None], [None, 8, None], [8, None], [8]]
S = list(range(1, 17))  # a public system prompt (4 pages)
X = list(range(100, 124))  # tenant A's own part (6 pages)


def cached(m: KVCacheManager, seq: int, prompt: list[int], ns: str | None = None) -> None:
    """Cache `prompt`'s full pages (one decode token makes the last one full)."""
    assert m.add_sequence(seq, prompt, ns) is not None
    m.append(seq, [6])
    m.free_sequence(seq)


@pytest.mark.parametrize("groups", [None, *GROUPED])
def test_an_unpin_from_another_tenant_leaves_a_pin_it_does_not_remove(
    groups: list[int | None] | None,
) -> None:
    """Tenant B's unpin of the public prefix (no pin ends there: 0) unpinned the group pages of
    tenant A's longer pin: A's pinned prompt missed after eviction."""
    m = KVCacheManager(200, PS, groups=groups)
    cached(m, 0, [*S, 1], "*")
    cached(m, 1, [*S, *X, 5], "A")
    assert m.add_sequence(2, [7] * 9, "B") is not None  # B, a live tenant
    assert m.pin([*S, *X, 5], 1e6, "A") > 0
    pinned = m.stats().num_pages_pinned
    assert m.unpin(S, "B") == 0
    assert m.stats().num_pages_pinned == pinned
    m.evict(10**6)
    assert m.peek_prefix_len([*S, *X, 5], "A") == 40


@pytest.mark.parametrize("groups", GROUPED)
def test_unpinning_a_longer_prefix_keeps_the_shorter_pin(groups: list[int | None]) -> None:
    """The group pages of the short pin went with the long one's."""
    m = KVCacheManager(200, PS, groups=groups)
    long = list(range(1, 42))
    short = long[:21]
    cached(m, 1, long)
    m.pin(short, 1e6)
    both = (m.pin(long, 1e6), m.stats().num_pages_pinned)
    assert m.unpin(long) > 0
    assert 0 < m.stats().num_pages_pinned < both[1]
    m.evict(10**6)
    assert m.peek_prefix_len(short) == 20
    assert m.peek_prefix_len(long) == 20  # the long one is unpinned: only the short hit is left
    assert m.unpin(long) > 0  # the short pin is the deepest on the path now
    assert m.stats().num_pages_pinned == 0
    m.evict(10**6)
    assert m.peek_prefix_len(short) == 0


def test_unpin_with_no_pin_returns_0_on_an_all_window_manager() -> None:
    """It returned the hit (10), not the pages it unpinned."""
    m = KVCacheManager(200, PS, groups=[8])
    p = list(range(1, 42))
    cached(m, 1, p)
    assert m.unpin(p) == 0
    assert m.pin(p, 100) == 10
    pinned = m.stats().num_pages_pinned  # the window's pages before the hit's end
    assert pinned == 2
    assert m.unpin(p) == pinned
    assert m.stats().num_pages_pinned == 0
    assert m.unpin(p) == 0


@pytest.mark.parametrize("groups", [None, *GROUPED])
def test_cap_pins_counts_each_pin_once(groups: list[int | None] | None) -> None:
    """A hybrid manager's one pin counted as the tree's pin plus each group page shortened (3)."""
    m = KVCacheManager(200, PS, groups=groups)
    p = list(range(1, 42))
    cached(m, 1, p)
    m.pin(p, 1000)
    m.pin(p[:21], 1000)
    assert m.cap_pins(5) == 2
    assert m.cap_pins(5) == 0  # due by then already


@pytest.mark.parametrize("groups", GROUPED)
def test_the_pin_budget_counts_every_groups_pages(groups: list[int | None]) -> None:
    """The group caches' pins were outside the budget: an all-window manager with a budget of one
    page pinned 60 pages and refused admissions; a hybrid pinned 12 pages on a budget of 10."""
    p = list(range(1, 42))
    m = KVCacheManager(200, PS, groups=groups, pin_budget_pages=1)
    cached(m, 1, p)
    before = m.stats()
    with pytest.raises(InvalidArgumentError, match="pin budget"):
        m.pin(p, 1e6)
    after = m.stats()
    assert (after.num_pages_pinned, after.num_pages_cached) == (0, before.num_pages_cached)
    m.evict(10**6)
    assert m.stats().num_pages_cached == 0  # no pin was made anywhere
    # A budget that holds the pin exactly: the pages a pin covers, every group's.
    m = KVCacheManager(200, PS, groups=groups)
    cached(m, 1, p)
    m.pin(p, 1e6)
    need = m.stats().num_pages_pinned
    m = KVCacheManager(200, PS, groups=groups, pin_budget_pages=need)
    cached(m, 1, p)
    assert m.pin(p, 1e6) > 0
    assert m.stats().num_pages_pinned == need
    assert m.pin(p, 2e6) > 0  # extending a pin adds no page
    cached(m, 2, list(range(500, 541)))
    with pytest.raises(InvalidArgumentError, match="pin budget"):
        m.pin(list(range(500, 541)), 1e6)
    m.evict(10**6)
    assert m.peek_prefix_len(p) == 40


@pytest.mark.parametrize("groups", GROUPED)
def test_random_pins_and_unpins_keep_exactly_the_pinned_prefixes(groups: list[int | None]) -> None:
    """A model of the pins: where each ends (the tree's match on a full primary, else the hit it
    keeps) and the hit it keeps; an unpin removes the deepest within its tokens. After each step
    and a full eviction every pin's hit is there; once all are removed nothing is left."""
    rng = np.random.default_rng(7)
    m = KVCacheManager(300, PS, groups=groups)
    base = list(range(1, 42))  # 10 full pages
    windowed = all(w is not None for w in groups)  # (else a full group is the tree's)
    kept: dict[int, int] = {}  # where a pin ends -> the hit it keeps (pages)
    for _ in range(80):
        cached(m, 1, base)  # a re-admission over pinned pages need not cache every window page again
        n = int(rng.integers(1, 11))
        prefix = base[: n * PS + 1]
        if rng.random() < 0.6:
            hit = m.peek_prefix_len(prefix) // PS
            assert m.pin(prefix, 1e6) == (hit if windowed else n)
            kept.setdefault(hit if windowed else n, hit)
        else:
            within = [k for k in kept if k <= n]
            m.unpin(prefix)  # (its pages may all be covered by other pins still: then it says 0)
            if within:
                del kept[max(within)]
        m.evict(10**6)
        for end, hit in kept.items():
            assert m.peek_prefix_len(base[: end * PS + 1]) >= hit * PS
        assert m.stats().num_pages_pinned > 0 or not any(kept.values())
    while kept:
        assert m.stats().num_pages_pinned > 0 or not any(kept.values())
        m.unpin(base)
        del kept[max(kept)]
    assert m.unpin(base) == 0
    assert m.stats().num_pages_pinned == 0
    m.evict(10**6)
    assert m.stats().num_pages_cached == 0


def test_a_tenants_pin_over_a_public_prefix_keeps_its_hit_on_an_all_window_manager() -> None:
    """The public prefix's last page (where the lookup finds the public part ends) was not pinned:
    once evicted, the tenant's pages chained from it could not be found (hit 0)."""
    m = KVCacheManager(200, PS, groups=[8])
    cached(m, 0, [*S, 1], "*")
    cached(m, 1, [*S, *X, 5], "A")
    assert m.pin([*S, *X, 5], 1e6, "A") == 10
    m.evict(10**6)
    assert m.peek_prefix_len([*S, *X, 5], "A") == 40
    assert m.peek_prefix_len([*S, 1], "B") == 0  # (its own hit needs the public window pages)
    assert m.unpin([*S, *X, 5], "A") == 3
    m.evict(10**6)
    assert m.stats().num_pages_cached == 0


PROMPT = list(range(1, 42))  # 10 full lookup pages


def curve_at(m: KVCacheManager, pages: int) -> float:
    c = m.miss_ratio_curve([pages])
    assert c is not None
    return float(c.hit_rate[0])


@pytest.mark.parametrize(
    "kw", [{"cache_prompt": False}, {"sink_tokens": 4, "recent_tokens": 8}], ids=["uncommitted", "streaming"]
)
def test_the_curve_counts_no_hit_for_pages_never_cached(kw: dict[str, object]) -> None:
    """Every looked-up page was used as cached: 0.73 at the manager's own size, where it hit 0."""
    m = KVCacheManager(201, PS, miss_ratio_curve=True)
    for i in range(4):
        assert m.add_sequence(i, PROMPT, **kw) == 0
        m.free_sequence(i)
    assert m.stats().hit_rate == 0
    assert curve_at(m, 200) == 0


def test_the_curve_of_a_chunked_prefill_matches_the_cache() -> None:
    """A `cache_prompt=False` sequence caches what it commits: the curve sees the same hits."""
    m = KVCacheManager(201, PS, miss_ratio_curve=True)
    hits = []
    for i in range(4):
        hits.append(m.add_sequence(i, PROMPT, cache_prompt=False))
        m.commit(i, 24)  # 6 pages of 10
        m.free_sequence(i)
    assert hits == [0, 24, 24, 24]
    assert curve_at(m, 200) == pytest.approx(m.stats().hit_rate, abs=1e-9)
    m = KVCacheManager(201, PS, miss_ratio_curve=True)
    for i in range(4):
        m.add_sequence(i, PROMPT, cache_prompt=False)
        m.commit(i, 24)
        m.commit(i, len(PROMPT))
        m.free_sequence(i)
    assert curve_at(m, 200) == pytest.approx(m.stats().hit_rate, abs=1e-9) and m.stats().hit_rate > 0.7


@pytest.mark.parametrize("groups", [[None, 8], [8, None], [None, 8, None], [None, None]])
def test_evict_all_and_reset_drain_every_unused_page_after_forks_and_chunks(
    groups: list[int | None],
) -> None:
    """One `evict(all)` (so `reset_prefix_cache`) made one pass per side: a page one side freed
    could leave the other's last reference evictable, and it stayed cached (a second evict took
    it). Random admissions (cached and chunked), commits, forks, appends, truncations and frees;
    then, with no live sequence, one reset must leave nothing cached."""
    rng = np.random.default_rng(3)
    bases = [list(range(1 + 100 * k, 49 + 100 * k)) for k in range(3)]
    for _ in range(12):
        m = KVCacheManager(120, PS, groups=groups)
        live: list[int] = []
        for sid in range(60):
            op = rng.random()
            if op < 0.45 or not live:
                toks = bases[int(rng.integers(0, 3))][: int(rng.integers(2, 48))]
                ns = [None, "A", "*"][int(rng.integers(0, 3))]
                chunked = bool(rng.random() < 0.3)
                r = m.add_sequence(sid, [*toks, 7], ns, cache_prompt=not chunked)
                if r is not None:
                    if chunked:
                        m.commit(sid, int(rng.integers(r, len(toks) + 2)))
                    live.append(sid)
                continue
            k = live[int(rng.integers(0, len(live)))]
            try:
                if op < 0.6:
                    m.free_sequence(k)
                    live.remove(k)
                elif op < 0.75:
                    m.fork(k, sid)
                    live.append(sid)
                elif op < 0.9:
                    m.append(k, [int(rng.integers(0, 5))] * int(rng.integers(1, 6)))
                elif m.seq_len(k) > 1:
                    m.truncate(k, int(rng.integers(1, m.seq_len(k))))
            except InvalidArgumentError:
                pass  # (a loading, unreserved or windowed case the manager refuses: nothing changed)
        for k in live:
            m.free_sequence(k)
        m.reset_prefix_cache()
        s = m.stats()
        assert (s.num_pages_cached, s.num_pages_pinned, s.num_pages_free) == (0, 0, s.num_pages_total)


@pytest.mark.parametrize("fillers", range(11))
def test_a_pinned_window_hit_is_admitted_while_a_page_can_be_had(fillers: int) -> None:
    """A windowed cache: the 41-token prompt's hit is the window's 2 pinned pages, and it needs one
    fresh page. Admission subtracted the pinned hit pages from the evictable ones as if they were
    evictable: with 8 live fillers (2 idle cached pages left to evict) it was refused, with 9 (1
    left) admitted. It is admitted while a free or evictable page is left, refused after."""
    m = KVCacheManager(13, PS, groups=[8])  # 12 usable pages
    prompt = list(range(1, 42))
    cached(m, 1, prompt)
    assert m.pin(prompt, 1e6) > 0
    for i in range(fillers):  # one live page each
        assert m.add_sequence(100 + i, [1000 + 10 * i + j for j in range(3)]) is not None
    s = m.stats()
    assert s.num_pages_pinned == 2 and s.num_pages_free + s.num_pages_cached == 10 - fillers
    hit = m.add_sequence(2, prompt)
    assert hit == (40 if fillers < 10 else None)
    m._check_invariants()
