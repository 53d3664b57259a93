"""Tenant floors in the prefix cache (KVCacheManager.set_tenant_floor): a noisy tenant cannot push a
quiet tenant's cached pages below its floor while anything else is evictable; the floor yields only
when nothing else is; the books stay exact (checked after every call)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import InvalidArgumentError, InvalidDTypeError, KVCacheManager

PS = 4


def cache_prompts(m: KVCacheManager, ns: str | None, first: int, count: int, pages: int) -> None:
    """``count`` distinct prompts of ``pages`` full pages each, admitted and freed (left cached)."""
    for i in range(count):
        sid = first + i
        base = (first + i) * 1000
        assert m.add_sequence(sid, np.arange(base, base + pages * PS), namespace=ns) is not None
        m.free_sequence(sid)
        m._check_invariants()


def cached_of(m: KVCacheManager, ns: str, tier: str = "hbm") -> int:
    return {(name, t): cached for name, t, _, cached in m.tenant_floors()}[(ns, tier)]


@pytest.mark.parametrize("eviction", ["lru", "lfu", "priority"])
def test_a_noisy_tenant_cannot_push_a_quiet_one_below_its_floor(eviction: str) -> None:
    m = KVCacheManager(41, PS, eviction)  # 40 pages
    m.set_tenant_floor("quiet", 12)
    cache_prompts(m, "quiet", 0, 4, 4)  # 16 cached pages, the oldest
    cache_prompts(m, "noisy", 100, 60, 4)  # far more than the cache holds
    assert cached_of(m, "quiet") == 12  # the 4 pages above the floor went, not one more
    assert m.stats().num_pages_cached == 40
    # The control: without the floor, the flood takes every quiet page.
    m2 = KVCacheManager(41, PS, eviction)
    cache_prompts(m2, "quiet", 0, 4, 4)
    cache_prompts(m2, "noisy", 100, 60, 4)
    assert m2.peek_prefix_len(np.arange(0, 16), namespace="quiet") == 0


def test_the_quiet_tenants_own_pages_above_the_floor_go_in_order_and_the_floor_yields_last() -> None:
    m = KVCacheManager(21, PS)  # 20 pages
    m.set_tenant_floor("quiet", 8)
    cache_prompts(m, "quiet", 0, 3, 4)  # 12 pages: prompts 0, 1, 2 (0 least recent)
    cache_prompts(m, "noisy", 100, 2, 4)  # 8 pages: the cache is full
    assert m.evict(4) == 4  # the least recent page that may go: quiet prompt 0 (above the floor)
    assert m.peek_prefix_len(np.arange(0, 16), namespace="quiet") == 0
    assert m.peek_prefix_len(np.arange(1000, 1016), namespace="quiet") == 16
    assert cached_of(m, "quiet") == 8
    assert m.evict(8) == 8  # now the noisy pages, though more recent than quiet's
    assert m.peek_prefix_len(np.arange(100_000, 100_016), namespace="noisy") == 0
    assert cached_of(m, "quiet") == 8
    # Nothing else is evictable: an admission that needs room takes floor pages (it never fails
    # for a floor), and the books stay exact.
    assert m.add_sequence(7, np.arange(50_000, 50_000 + 4 * 4 * PS), namespace="noisy") is not None
    assert cached_of(m, "quiet") < 8
    m._check_invariants()


def test_a_floor_outlives_its_name_and_applies_again() -> None:
    m = KVCacheManager(9, PS)  # 8 pages
    m.set_tenant_floor("vip", 4)
    assert m.tenant_floors() == [("vip", "hbm", 4, 0)]  # set before the name exists
    cache_prompts(m, "vip", 0, 1, 4)
    assert m.tenant_floors() == [("vip", "hbm", 4, 4)]
    assert m.evict(100) == 4  # only floor pages left: they go when asked
    assert m.num_namespaces() == 0  # the name is forgotten (nothing of it is left)
    cache_prompts(m, "vip", 10, 1, 4)  # it comes back under a new id: the floor too
    cache_prompts(m, "other", 20, 3, 4)
    assert m.tenant_floors() == [("vip", "hbm", 4, 4)]
    m.set_tenant_floor("vip", 0)
    assert m.tenant_floors() == []
    m._check_invariants()


def test_the_default_namespace_may_have_a_floor_and_the_public_one_may_not() -> None:
    m = KVCacheManager(21, PS)
    m.set_tenant_floor(None, 8)
    cache_prompts(m, None, 0, 2, 4)
    cache_prompts(m, "noisy", 100, 10, 4)
    assert [(ns, f) for ns, _, f, _ in m.tenant_floors()] == [(None, 8)]
    assert m.tenant_floors()[0][3] == 8
    with pytest.raises(InvalidArgumentError):
        m.set_tenant_floor("*", 4)
    with pytest.raises(InvalidArgumentError):
        m.set_tenant_floor("a", -1)
    with pytest.raises(InvalidDTypeError):
        m.set_tenant_floor("a", "4")
    with pytest.raises(InvalidDTypeError):
        m.set_tenant_floor(3, 4)
    with pytest.raises(InvalidArgumentError):
        m.set_tenant_floor("a", 4, tier="nvme")  # no such tier
    assert [(ns, f) for ns, _, f, _ in m.tenant_floors()] == [(None, 8)]


def test_random_traffic_with_floors_keeps_the_books_exact() -> None:
    rng = np.random.default_rng(0)
    m = KVCacheManager(65, PS, "lru")
    m.set_tenant_floor("a", 10)
    m.set_tenant_floor("b", 6)
    live: list[int] = []
    for step in range(600):
        op = rng.integers(0, 5)
        if op <= 1 or not live:
            ns = ["a", "b", "c", None][int(rng.integers(0, 4))]
            base = int(rng.integers(0, 40)) * 8  # shared prefixes now and then
            n = int(rng.integers(1, 30))
            if m.add_sequence(step, np.arange(base, base + n), namespace=ns) is not None:
                live.append(step)
        elif op == 2:
            m.free_sequence(live.pop(int(rng.integers(0, len(live)))))
        elif op == 3:
            sid = live[int(rng.integers(0, len(live)))]
            m.append(sid, [int(rng.integers(0, 1000))])
        else:
            m.evict(int(rng.integers(1, 20)))
        m._check_invariants()
    for sid in live:
        m.free_sequence(sid)
    m._check_invariants()
    assert m.stats().num_pages_in_use == 0


def test_through_the_scheduler_a_vip_keeps_its_prefix_under_a_noisy_flood() -> None:
    """tenant_min_pages sets the cache's floor: the VIP's system prompt (12 pages) survives 200 noisy
    requests through a 40-page cache, and the VIP's next request hits it; the noisy ones all ran."""
    from kvcore.scheduler import Request, Scheduler

    def run(floor: bool) -> tuple[int, int]:
        m = KVCacheManager(41, PS)
        sched = Scheduler(m, max_num_batched_tokens=256, tenant_min_pages={"vip": 12} if floor else None)
        system = list(range(5000, 5048))  # 12 pages
        sched.submit(Request(0, [*system, 1], max_new_tokens=1, namespace="vip"))
        for i in range(1, 201):
            sched.submit(
                Request(i, [i % 97, *range(i * 50, i * 50 + 20)], max_new_tokens=3, namespace="noisy")
            )
        t = 0
        while sched.has_work():
            plan = sched.step(float(t))
            sched.update(plan, {int(r): 9 for r in plan.request_ids[plan.sample]})
            t += 1
        served = sched.stats().finished_by_reason.get("length", 0)
        return m.peek_prefix_len([*system, 2], namespace="vip"), served

    assert run(floor=True) == (48, 201)
    assert run(floor=False)[0] == 0  # the control: the flood evicts it


def test_a_floor_on_a_lower_tier_keeps_the_tenants_slots() -> None:
    """Stores making room in a full host tier evict other tenants' slots before a floored tenant's."""
    m = KVCacheManager(41, PS, lower_tiers=[("host", 12)], store_policy="all")
    m.set_tenant_floor("vip", 8, tier="host")

    def settle() -> None:
        b = m.take_transfers()
        if b:
            m.complete_transfers(np.unique(b.store_ops).tolist() + b.load_ops.tolist(), True)

    cache_prompts(m, "vip", 0, 2, 4)  # 8 pages, stored to the host tier
    settle()
    assert cached_of(m, "vip", "host") == 8
    for i in range(10):  # noisy prompts, each stored in turn: the tier must make room
        cache_prompts(m, "noisy", 100 + i, 1, 4)
        settle()
        m._check_invariants()
    assert cached_of(m, "vip", "host") == 8
    assert m.tier_stats()["host"]["num_evicted_slots"] > 0


def test_the_tier_names_tenant_quotas_reports_are_accepted_back() -> None:
    """``tenant_floors`` names HBM ``"hbm"``: passing a floor back as reported sets the same HBM floor
    (it raised "no lower tier named 'hbm'"), so quotas can be saved and restored as read."""
    m = KVCacheManager(41, PS, lower_tiers=[("host", 12)])
    m.set_tenant_floor("a", 3)
    m.set_tenant_floor("b", 2, tier="host")
    m.set_tenant_ceiling("c", 5)
    saved = m.tenant_quotas()
    assert [q[:2] for q in saved] == [("a", "hbm"), ("b", "host"), ("c", "hbm")]
    fresh = KVCacheManager(41, PS, lower_tiers=[("host", 12)])
    for ns, tier, floor, ceiling, _ in saved:
        fresh.set_tenant_floor(ns, floor, tier=tier)
        fresh.set_tenant_ceiling(ns, ceiling, tier=tier)
    assert fresh.tenant_quotas() == saved
    fresh.set_tenant_floor("a", 0, tier="HBM")  # any case, as the name lower tiers may not take
    assert [q[0] for q in fresh.tenant_floors()] == ["b"]
    with pytest.raises(InvalidArgumentError, match="no lower tier named"):
        fresh.set_tenant_floor("a", 1, tier="disk")


def test_a_tenant_above_its_ceiling_is_evicted_first() -> None:
    """A ceiling is a share: the tenant may exceed it while there is room, and past it its pages go
    before anyone's, however recent (the others' least recent pages stay)."""
    m = KVCacheManager(21, PS)  # 20 pages
    m.set_tenant_ceiling("greedy", 4)
    cache_prompts(m, "calm", 0, 2, 4)  # 8 pages, the least recent
    cache_prompts(m, "greedy", 100, 3, 4)  # 12 pages: 8 over its ceiling
    assert m.tenant_quotas() == [("greedy", "hbm", 0, 4, 12)]
    assert m.evict(8) == 8
    assert m.tenant_quotas() == [("greedy", "hbm", 0, 4, 4)]
    assert m.peek_prefix_len(np.arange(0, 16), namespace="calm") == 16  # untouched
    assert m.evict(2) == 2  # at its ceiling now: plain LRU order again (calm's oldest)
    assert m.peek_prefix_len(np.arange(0, 16), namespace="calm") < 16
    m.set_tenant_ceiling("greedy", None)
    assert m.tenant_quotas() == []
    with pytest.raises(InvalidArgumentError):
        m.set_tenant_ceiling("*", 3)
    m._check_invariants()


def test_floor_and_ceiling_together_and_through_the_scheduler() -> None:
    from kvcore.scheduler import Scheduler

    m = KVCacheManager(41, PS, lower_tiers=[("host", 8)])
    Scheduler(m, tenant_max_pages={"a": 10}, tenant_min_pages={"a": 2, "b": 6})
    quotas = {(ns, tier): (floor, ceiling) for ns, tier, floor, ceiling, _ in m.tenant_quotas()}
    assert quotas == {("a", "hbm"): (2, 10), ("b", "hbm"): (6, None)}
    m.set_tenant_ceiling("a", 3, tier="host")
    assert ("a", "host", 0, 3, 0) in m.tenant_quotas()


@pytest.mark.parametrize("groups", [[8, None], [None, 8], [8], [None, None], [8, 12, None]])
@pytest.mark.parametrize("floor", [True, False])
def test_on_a_grouped_manager_a_floor_keeps_the_tenants_hit(groups: list[int | None], floor: bool) -> None:
    """A hit needs every group's pages (a window group's last pages before the hit point): floors
    protected the tree's pages only, so a noisy flood evicted the quiet tenant's window pages and its
    whole prefix was recomputed though its floor held. A floor now counts in each group cache too;
    without one (the control) the flood takes the prefix."""
    m = KVCacheManager(81, PS, groups=groups)
    if floor:
        m.set_tenant_floor("vip", 8)
    prompt = list(range(1, 34))  # 8 full pages + 1 token
    assert m.add_sequence(0, prompt, "vip") == 0
    m.free_sequence(0)
    assert m.peek_prefix_len(prompt, "vip") == 32
    for i in range(20):  # 4-page prompts: several times the pool, through eviction
        cache_prompts(m, "noisy", 100 + i, 1, 4)
    hit = m.peek_prefix_len(prompt, "vip")
    assert hit == 32 if floor else hit < 32
    if floor:
        assert m.add_sequence(1, prompt, "vip") == 32
        m.free_sequence(1)
    m._check_invariants()


def test_on_a_grouped_manager_a_floor_yields_when_nothing_else_can_go() -> None:
    """The floor is a preference: with only the floored tenant's pages evictable, they go (an
    admission is never refused for a floor)."""
    m = KVCacheManager(41, PS, groups=[8, None])
    m.set_tenant_floor("vip", 100)
    cache_prompts(m, "vip", 0, 3, 4)
    big = np.arange(50_000, 50_000 + 16 * PS)  # with its window pages, most of the pool
    assert m.add_sequence(99, big, namespace="noisy") is not None
    m._check_invariants()


def test_on_a_grouped_manager_a_tenant_past_its_ceiling_loses_its_group_pages_first() -> None:
    """The older tenant's pages would go first by recency; the ceiling takes the newer greedy
    tenant's excess first, in a group cache as in the tree (the older tenant keeps its hit)."""
    m = KVCacheManager(81, PS, groups=[8])  # every group windowed: the group cache is the cache
    m.set_tenant_ceiling("greedy", 4)
    cache_prompts(m, "other", 0, 1, 8)  # older
    cache_prompts(m, "greedy", 10, 1, 8)  # newer, 8 pages in each group: 4 past its ceiling
    other = np.arange(0, 8 * PS + 1)
    greedy = np.arange(10_000, 10_000 + 8 * PS + 1)
    assert (m.peek_prefix_len(other, "other"), m.peek_prefix_len(greedy, "greedy")) == (32, 32)
    assert m.evict(8) == 8  # by recency alone: all of the older tenant's pages
    assert m.peek_prefix_len(other, "other") == 32
    # The greedy tenant's 4 oldest went (a window hit needs only its last pages: it keeps its hit).
    assert m.peek_prefix_len(greedy, "greedy") == 32
    assert m.evict(1) == 1  # at its ceiling now: recency again, the older tenant's oldest page
    assert m.peek_prefix_len(greedy, "greedy") == 32
    m._check_invariants()
