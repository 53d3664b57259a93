"""The manager's side of the lower tiers: residence, two-phase transfers, promotion, policies, restart.

No bytes move here (the tiers' storage has its own tests): transfers are taken and completed by
hand, so each rule of the contract is checked on its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from kv_helpers import ref_page_key

import kvcore
from kvcore import InvalidArgumentError, InvalidDTypeError, KVCacheManager

PS = 4


def tiered(
    num_pages: int = 32, host: int = 16, disk: int = 32, policy: str = "all", **kw: object
) -> KVCacheManager:
    return KVCacheManager(
        num_pages, PS, lower_tiers=[("host", host), ("disk", disk)], store_policy=policy, **kw
    )


def complete_all(m: KVCacheManager, ok: bool = True) -> kvcore.TransferBatch:
    b = m.take_transfers()
    ops = np.unique(b.store_ops).tolist() + b.load_ops.tolist()
    if ops:
        m.complete_transfers(ops, ok)
    return b


def demote(m: KVCacheManager, seq_id: int, tokens: list[int], ns: str | None = None) -> None:
    """Admit, store to the tiers, free, and drop from HBM."""
    assert m.add_sequence(seq_id, tokens, ns) is not None
    complete_all(m)
    m.free_sequence(seq_id)
    m.evict(1 << 20)
    assert m.peek_prefix_len(tokens, ns) == 0


PROMPT = list(range(1, 14))  # 3 full pages + 1 token


def test_store_is_invisible_until_completed_and_failed_store_frees_its_slots() -> None:
    m = tiered()
    m.add_sequence(1, PROMPT)
    b = m.take_transfers()
    assert sorted(set(b.store_tiers.tolist())) == [0, 1] and len(b.store_ops) == 6
    assert b.tier_names == ("host", "disk")
    # The pages are held by the stores: evicting finds nothing to take.
    m.free_sequence(1)
    assert m.evict(100) == 0
    assert m.stats().num_pages_in_use == 3
    # In flight: a new admission in HBM-less conditions sees no tier copy yet.
    assert m.tier_stats()["host"]["num_slots_in_flight"] == 3
    host_ops = np.unique(b.store_ops[b.store_tiers == 0]).tolist()
    disk_ops = np.unique(b.store_ops[b.store_tiers == 1]).tolist()
    m.complete_transfers(host_ops, False)
    m.complete_transfers(disk_ops, True)
    s = m.tier_stats()
    assert s["host"]["num_store_failed_pages"] == 3 and s["host"]["num_slots_free"] == 16
    assert s["disk"]["num_stored_pages"] == 3 and s["disk"]["num_slots_cached"] == 3
    assert m.evict(100) == 3
    assert m.add_sequence(2, PROMPT) == 12
    assert m.hit_tokens(2) == {"hbm": 0, "host": 0, "disk": 12}
    m._check_invariants()


def test_promotion_queues_loads_and_the_sequence_is_ready_once_they_complete() -> None:
    m = tiered()
    demote(m, 1, PROMPT)
    assert m.add_sequence(2, PROMPT) == 12
    assert not m.is_ready(2)
    for call in (
        lambda: m.append(2, [5]),
        lambda: m.page_table([2]),
        lambda: m.block_table([2]),
        lambda: m.slot_mapping(2, 1),
        lambda: m.commit(2, 4),
        lambda: m.fork(2, 3),
        lambda: m.truncate(2, 4),
    ):
        with pytest.raises(InvalidArgumentError, match="loading"):
            call()
    b = m.take_transfers()
    pages = m.seq_pages(2).tolist()
    assert b.load_pages.tolist() == pages[:3]
    assert (b.load_tiers == 0).all()  # host first
    assert len(b.store_ops) == 0  # the tiers already hold them
    m.complete_transfers(b.load_ops, True)
    assert m.is_ready(2)
    assert m.hit_tokens(2) == {"hbm": 0, "host": 12, "disk": 0}
    # The loaded pages are now cached in HBM: another admission shares them.
    assert m.add_sequence(3, PROMPT) == 12
    assert m.seq_pages(3).tolist()[:3] == pages[:3]
    assert m.tier_stats()["host"]["hit_tokens"] == 12
    m._check_invariants()


def test_a_failed_load_cuts_the_hit_before_it_and_its_copy_is_stored_again() -> None:
    """A failed load's slot was marked bad and kept its place for good: the recomputed page was
    never stored to that tier again (review: one transient remote failure lost a prefix for good)."""
    m = tiered(events=True)
    demote(m, 1, PROMPT)
    m.take_events()
    m.add_sequence(2, PROMPT)
    b = m.take_transfers()
    ok = [True, False, True]
    m.complete_transfers(b.load_ops, ok)
    assert m.is_ready(2)
    assert m.hit_tokens(2) == {"hbm": 0, "host": 4, "disk": 0}
    host = m.tier_stats()["host"]
    assert host["num_load_failed_pages"] == 1
    # The bad copy went, with the page below it in its run (unusable behind it): announced.
    assert host["num_slots_bad"] == 0 and host["num_dropped_bad_slots"] == 2
    assert host["num_slots_cached"] == 1
    removed = [e for e in m.take_events() if isinstance(e, kvcore.events.PageRemoved)]
    assert [(e.medium, len(e.keys)) for e in removed] == [("host", 2)]
    # The recomputed pages are stored there again.
    b = complete_all(m)
    assert sorted(b.store_tiers.tolist()) == [0, 0]
    m.free_sequence(2)
    m.evict(1 << 20)
    m.add_sequence(3, PROMPT)
    assert m.hit_tokens(3) == {"hbm": 0, "host": 12, "disk": 0}
    complete_all(m)
    assert m.is_ready(3)
    m._check_invariants()


def test_a_bad_slot_with_pages_below_it_keeps_its_place() -> None:
    """A failed load's slot that other stored pages continue (not a leaf) stays bad: the match
    stops before it and continues from another tier."""
    m = tiered(policy="all")
    demote(m, 1, PROMPT)
    longer = PROMPT[:12] + list(range(50, 59))  # continues the 3 pages with 2 more
    m.add_sequence(2, longer)
    while complete_all(m):  # its loads, then the stores of its new pages
        pass
    m.free_sequence(2)
    m.evict(1 << 20)
    assert m.tier_stats()["host"]["num_slots_cached"] == 5
    m.add_sequence(3, PROMPT)
    b = m.take_transfers()
    m.complete_transfers(b.load_ops, [True, False, True])
    host = m.tier_stats()["host"]
    assert host["num_slots_bad"] == 1 and host["num_dropped_bad_slots"] == 0
    m.free_sequence(3)
    m.evict(1 << 20)
    m.add_sequence(4, PROMPT)
    assert m.hit_tokens(4) == {"hbm": 0, "host": 4, "disk": 8}
    m._check_invariants()


def test_loads_complete_in_any_order_and_freeing_while_loading_cancels_the_untaken_ones() -> None:
    m = tiered()
    demote(m, 1, PROMPT)
    m.add_sequence(2, PROMPT)
    m.free_sequence(2)  # nothing taken yet: the loads are cancelled, everything released
    assert complete_all(m).load_ops.size == 0
    assert m.stats().num_pages_in_use == 0
    assert m.tier_stats()["host"]["num_slots_locked"] == 0
    m.add_sequence(3, PROMPT)
    b = m.take_transfers()
    m.free_sequence(3)  # taken: the pages stay held by the loads until they complete
    assert m.stats().num_pages_in_use == 3
    m.complete_transfers(b.load_ops[::-1], True)
    assert m.stats().num_pages_in_use == 0
    m._check_invariants()


def test_complete_transfers_refuses_bad_ids_and_changes_nothing() -> None:
    m = tiered()
    m.add_sequence(1, PROMPT)
    b = m.take_transfers()
    ops = np.unique(b.store_ops).tolist()
    before = m.tier_stats()
    with pytest.raises(InvalidArgumentError, match="not a transfer in flight"):
        m.complete_transfers([ops[0], 999], True)
    with pytest.raises(InvalidArgumentError, match="twice"):
        m.complete_transfers([ops[0], ops[0]], True)
    with pytest.raises(InvalidArgumentError, match="outcomes"):
        m.complete_transfers(ops, [True])
    with pytest.raises(InvalidArgumentError):
        m.complete_transfers([-1], True)
    with pytest.raises(InvalidDTypeError):
        m.complete_transfers(ops, ["yes"] * len(ops))
    assert m.tier_stats() == before
    m.complete_transfers(ops, True)
    m.add_sequence(2, [7] * 9)
    with pytest.raises(InvalidArgumentError, match="not taken"):
        queued = 1 + max(ops)
        m.complete_transfers([queued], True)


def test_a_store_without_room_is_skipped_and_counted() -> None:
    m = tiered(host=2, disk=2)
    m.add_sequence(1, PROMPT)  # 3 pages, 2 slots per tier: the leading 2 are stored, 1 skipped
    b = m.take_transfers()
    assert sorted(b.store_pages[b.store_tiers == 0].tolist()) == sorted(m.seq_pages(1)[:2].tolist())
    s = m.tier_stats()
    assert s["host"]["num_store_skipped_no_room"] == 1 and s["disk"]["num_store_skipped_no_room"] == 1
    # Every slot in flight (not evictable): another prompt finds no room at all, and never waits.
    m.add_sequence(2, [7] * 9)
    assert not m.take_transfers()
    s = m.tier_stats()
    assert s["host"]["num_store_skipped_no_room"] == 3 and s["host"]["num_slots_in_flight"] == 2
    m.complete_transfers(np.unique(b.store_ops), True)
    m._check_invariants()


def test_tier_eviction_is_leaf_first_and_lru() -> None:
    m = tiered(host=4, disk=1, num_pages=64)
    m.add_sequence(1, list(range(1, 10)))  # pages a, b
    complete_all(m)
    m.add_sequence(2, list(range(100, 109)))  # pages c, d: host full
    complete_all(m)
    m.add_sequence(3, list(range(200, 205)))  # page e: evicts the LRU leaf (b), not a
    complete_all(m)
    for i in (1, 2, 3):
        m.free_sequence(i)
    m.evict(1 << 20)
    m.add_sequence(4, list(range(1, 10)))
    assert m.hit_tokens(4)["host"] == 4  # a kept, b evicted
    assert m.tier_stats()["host"]["num_evicted_slots"] == 1


def test_selective_policy_stores_on_the_second_use_and_on_priority_and_pins() -> None:
    m = tiered(policy="selective")
    m.add_sequence(1, PROMPT)
    assert len(m.take_transfers().store_ops) == 0  # used once
    m.add_sequence(2, PROMPT)  # hit: used twice
    b = complete_all(m)
    assert len(b.store_ops) == 6
    m2 = tiered(policy="selective", store_options={"min_priority": 5})
    m2.add_sequence(1, PROMPT, priority=5)
    assert len(m2.take_transfers().store_ops) == 6
    m3 = tiered(policy="selective", store_options={"min_hits": 100})
    m3.add_sequence(1, PROMPT)
    m3.free_sequence(1)
    assert m3.pin(PROMPT, 10.0) == 3
    assert len(m3.take_transfers().store_ops) == 6


def test_value_policy_weighs_reuse_against_the_transfer_cost() -> None:
    # 256 KiB pages: the fast host is worth it for a page never reused yet; the 2 GB/s disk
    # (131 us a page against a 400 us prefill) only once the page was hit.
    m = KVCacheManager(
        64,
        16,
        lower_tiers=[("host", 64, 25.0), ("disk", 64, 2.0)],
        store_policy="value",
        store_options={"page_bytes": 262144.0},
    )
    m.add_sequence(1, list(range(1, 40)))
    assert set(complete_all(m).store_tiers.tolist()) == {0}
    m.add_sequence(2, list(range(1, 40)))
    assert set(complete_all(m).store_tiers.tolist()) == {1}
    # A disk slower than recomputing is never worth it, however often a page is hit.
    slow = KVCacheManager(64, 16, lower_tiers=[("disk", 64, 0.5)], store_policy="value")
    for i in range(6):
        slow.add_sequence(i, list(range(1, 40)))
    assert not slow.take_transfers()
    with pytest.raises(InvalidArgumentError, match="not an option"):
        tiered(policy="value", store_options={"min_hits": 2})


def test_namespaces_are_kept_in_every_tier() -> None:
    m = tiered()
    demote(m, 1, PROMPT, ns="tenant-a")
    assert m.add_sequence(2, PROMPT, "tenant-b") == 0
    assert m.add_sequence(3, PROMPT) == 0
    assert m.add_sequence(4, PROMPT, "tenant-a") == 12
    b = m.take_transfers()
    keys = kvcore.page_keys(np.asarray(PROMPT, dtype=np.int32), PS, namespace="tenant-a")
    assert (b.load_keys == keys[:3]).all()
    # A tenant whose only trace is in a lower tier keeps its name interned (no id reuse, no alias).
    m.complete_transfers(b.load_ops, True)
    # tenant-b's stores, in flight: a store keeps its namespace interned too.
    m.complete_transfers(np.unique(b.store_ops), True)
    for i in (2, 3, 4):
        m.free_sequence(i)
    m.evict(1 << 20)
    assert m.num_namespaces() >= 1
    m.reset_prefix_cache()
    assert m.num_namespaces() == 0
    assert m.tier_stats()["host"]["num_slots_cached"] == 0


def test_store_rows_describe_the_page_for_a_self_describing_value() -> None:
    m = tiered(fingerprint=b"model-x")
    m.add_sequence(1, PROMPT, "t")
    b = m.take_transfers()
    keys = kvcore.page_keys(np.asarray(PROMPT, dtype=np.int32), PS, fingerprint=b"model-x", namespace="t")
    host = b.store_tiers == 0
    assert (b.store_keys[host] == keys[:3]).all()
    assert bytes(b.store_parent_keys[host][0]) == m.root_key()
    assert (b.store_parent_keys[host][1:] == keys[:2]).all()
    assert b.store_tokens[host].tolist() == [PROMPT[0:4], PROMPT[4:8], PROMPT[8:12]]
    assert b.store_namespaces == ["t"] * 6


def entries_of(b: kvcore.TransferBatch, tier: int) -> list[tuple[int, bytes, bytes, str | None, np.ndarray]]:
    rows = np.flatnonzero(b.store_tiers == tier)
    return [
        (
            int(b.store_slots[i]),
            bytes(b.store_keys[i]),
            bytes(b.store_parent_keys[i]),
            b.store_namespaces[i],
            b.store_tokens[i],
        )
        for i in rows
    ]


def test_restore_rebuilds_a_tier_for_the_same_fingerprint_only() -> None:
    m = tiered(fingerprint=b"fp-1")
    m.add_sequence(1, PROMPT, "t")
    b1 = complete_all(m)
    m.add_sequence(2, PROMPT[:8] + [99] * 5, "t")
    entries = entries_of(b1, 1) + entries_of(complete_all(m), 1)
    assert len(entries) == 4  # a shared first page, then 2 + 1
    fresh = tiered(fingerprint=b"fp-1")
    assert fresh.restore_tier("disk", entries[::-1]).all()  # any order
    assert fresh.tier_stats()["disk"]["num_restored_pages"] == 4
    assert fresh.add_sequence(3, PROMPT, "t") == 12
    assert fresh.hit_tokens(3)["disk"] == 12
    assert fresh.add_sequence(4, PROMPT) == 0  # another namespace
    fresh._check_invariants()
    other = tiered(fingerprint=b"fp-2")
    assert not other.restore_tier("disk", entries).any()
    assert other.add_sequence(1, PROMPT, "t") == 0
    assert other.num_namespaces() == 1  # what the rejected entries interned was forgotten
    # A tampered entry (tokens that do not give its key) and its descendants are refused.
    bad = list(entries)
    slot, key, parent, ns, tokens = bad[0]
    bad[0] = (slot, key, parent, ns, tokens + 1)
    again = tiered(fingerprint=b"fp-1")
    assert not again.restore_tier("disk", bad).any()
    with pytest.raises(InvalidArgumentError, match="no lower tier"):
        again.restore_tier("ssd", entries)
    with pytest.raises(InvalidArgumentError, match="slot"):
        again.restore_tier("disk", [(10_000, key, parent, ns, tokens)])


@pytest.mark.parametrize(
    ("tiers", "match"),
    [
        ([("host", 0)], "num_slots"),
        (
            [("host", 2**32 - 1)],
            r"num_slots must be in 1\.\.=4294967294, got 4294967295",
        ),  # was "1..4294967295"
        ([("host", 4), ("host", 4)], "distinct"),
        ([("", 4)], "distinct"),
        ([("host", 4, -1.0)], "bandwidth"),
        ("host", "lower_tiers"),
        ([("host",)], "lower_tiers"),
        ([object()], "lower_tiers"),
    ],
)
def test_bad_tier_configs_are_refused(tiers: object, match: str) -> None:
    with pytest.raises((InvalidArgumentError, InvalidDTypeError), match=match):
        KVCacheManager(8, PS, lower_tiers=tiers)  # type: ignore[arg-type]


def test_bad_store_policies_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="store_policy"):
        tiered(policy="sometimes")
    with pytest.raises(InvalidArgumentError, match="dict"):
        tiered(policy="all", store_options=[1])
    with pytest.raises(InvalidArgumentError, match="value"):
        tiered(policy="value", store_options={"prior_misses": 0.0})


def test_without_tiers_nothing_is_queued() -> None:
    m = KVCacheManager(16, PS)
    m.add_sequence(1, PROMPT)
    b = m.take_transfers()
    assert not b and m.tier_names == [] and m.tier_stats() == {}
    assert m.is_ready(1) and m.hit_tokens(1) == {"hbm": 0}


def test_a_store_continues_after_pages_in_flight_to_the_same_tier() -> None:
    m = tiered()
    m.add_sequence(1, PROMPT)  # 3 pages in flight to each tier
    m.add_sequence(2, PROMPT[:12] + [50] * 9)  # shares them, adds 2 pages: stored after them
    complete_all(m)
    for name in ("host", "disk"):
        s = m.tier_stats()[name]
        got = (s["num_stored_pages"], s["num_store_skipped_in_flight"], s["num_store_failed_pages"])
        assert got == (5, 0, 0)


def test_making_room_never_evicts_the_prefix_a_store_extends() -> None:
    m = KVCacheManager(64, PS, lower_tiers=[("host", 4)], store_policy="all")
    m.add_sequence(1, list(range(8)))
    complete_all(m)
    m.free_sequence(1)
    m.add_sequence(2, list(range(100, 108)))
    complete_all(m)  # host full: A (least recently used) and B, 2 pages each
    m.add_sequence(3, list(range(16)))  # extends A by 2 pages: A, locked under the store, stays; B goes
    complete_all(m)
    s = m.tier_stats()["host"]
    assert (s["num_stored_pages"], s["num_store_failed_pages"], s["num_evicted_slots"]) == (6, 0, 2)
    for i in (2, 3):
        m.free_sequence(i)
    m.evict(1 << 20)
    m.add_sequence(4, list(range(17)))
    assert m.hit_tokens(4)["host"] == 16


def test_loads_can_be_taken_before_the_step_and_stores_after_it() -> None:
    m = tiered()
    demote(m, 1, PROMPT)
    m.add_sequence(2, PROMPT)  # loads queued
    m.add_sequence(3, [9] * 13)  # stores queued (its pages are computed in this step)
    early = m.take_transfers(stores=False)
    assert len(early.load_ops) == 3 and len(early.store_ops) == 0
    m.complete_transfers(early.load_ops, True)
    assert m.is_ready(2)
    late = m.take_transfers(loads=False)
    assert len(late.store_ops) == 6 and len(late.load_ops) == 0
    assert not m.take_transfers()
    with pytest.raises(InvalidDTypeError):
        m.take_transfers(stores="yes")  # type: ignore[arg-type]


def test_pages_inserted_from_elsewhere_are_offered_to_the_tiers() -> None:
    m = tiered()
    pages = m.allocate_pages(3)
    assert m.insert(PROMPT[:12], pages, "t") == 3
    b = complete_all(m)
    assert sorted(b.store_pages[b.store_tiers == 0].tolist()) == sorted(pages.tolist())
    keys = kvcore.page_keys(np.asarray(PROMPT[:12], dtype=np.int32), PS, namespace="t")
    assert (b.store_keys[b.store_tiers == 0] == keys).all()
    m.evict(1 << 20)
    assert m.peek_hit_tokens(PROMPT, "t") == {"hbm": 0, "host": 12, "disk": 0}


class SharedStore:
    """A shared tier in miniature: pages by key, visible to every cache using it (two instances)."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}


class FakeRemote:
    """The Tier protocol over a SharedStore, with `exists` (leading keys held)."""

    def __init__(self, store: SharedStore, pool: FakePool, num_slots: int = 64) -> None:
        self.name, self.num_slots, self.store_, self.pool = "remote", num_slots, store, pool

    def store(self, pool, pages, slots, keys, parent_keys, tokens, namespaces):  # type: ignore[no-untyped-def]
        for p, k in zip(pages, keys, strict=True):
            self.store_.values.setdefault(bytes(k), bytes(pool.content[p]))
        return np.ones(len(pages), dtype=bool)

    def load(self, pool, slots, pages, keys):  # type: ignore[no-untyped-def]
        ok = np.zeros(len(pages), dtype=bool)
        for i, (p, k) in enumerate(zip(pages, keys, strict=True)):
            v = self.store_.values.get(bytes(k))
            if v is not None:
                pool.content[p] = np.frombuffer(v, dtype=np.uint8)
                ok[i] = True
        return ok

    def exists(self, keys: np.ndarray) -> int:
        n = 0
        for k in keys:
            if bytes(k) not in self.store_.values:
                break
            n += 1
        return n

    def stats(self) -> dict[str, int]:
        return {"keys": len(self.store_.values)}


class FakePool:
    def __init__(self, num_pages: int) -> None:
        self.num_pages, self.page_size = num_pages, PS
        self.content = np.zeros((num_pages, 16), dtype=np.uint8)


def test_two_instances_share_a_remote_tier_through_lookup() -> None:
    from kvcore.tiers import Mover

    shared = SharedStore()
    instances = []
    for _ in range(2):
        pool = FakePool(32)
        cache = KVCacheManager(32, PS, fingerprint=b"m", lower_tiers=[("remote", 64)], store_policy="all")
        instances.append((cache, pool, Mover(cache, pool, [FakeRemote(shared, pool)])))
    (a, pool_a, mover_a), (b, pool_b, mover_b) = instances
    # A computes the prompt (its pages hold their keys) and stores it to the shared tier.
    a.add_sequence(1, PROMPT, "t")
    keys = a.prompt_keys(PROMPT, "t")
    for i, page in enumerate(a.seq_pages(1)[:3]):
        pool_a.content[page] = keys[i]
    mover_a.run()
    assert len(shared.values) == 3
    # B has never seen it: a lookup finds it remote; the admission loads it, bytes equal A's.
    assert b.peek_hit_tokens(PROMPT, "t") == {"hbm": 0, "remote": 0}  # before the lookup
    assert mover_b.lookup(PROMPT, "u") == 0  # another tenant: nothing
    assert mover_b.lookup(PROMPT, "t") == 3
    assert mover_b.lookup(PROMPT, "t") == 0  # already indexed: no new round trip result
    assert b.add_sequence(2, PROMPT, "t") == 12 and b.hit_tokens(2) == {"hbm": 0, "remote": 12}
    mover_b.run(stores=False)
    assert b.is_ready(2)
    for i, page in enumerate(b.seq_pages(2)[:3]):
        assert bytes(pool_b.content[page]) == bytes(keys[i])
    assert b.tier_stats()["remote"]["num_marked_pages"] == 3
    # A page the tier lost since the lookup fails its load: the hit is cut, nothing wrong read.
    shared.values.pop(bytes(keys[1]))
    b.free_sequence(2)
    b.evict(1 << 20)
    b.add_sequence(3, PROMPT, "t")
    mover_b.run(stores=False)
    assert b.hit_tokens(3) == {"hbm": 0, "remote": 4}
    with pytest.raises(InvalidArgumentError, match="no lower tier"):
        b.mark_tier_pages("ssd", PROMPT, 1)
    with pytest.raises(InvalidArgumentError, match="full pages"):
        b.mark_tier_pages("remote", PROMPT, 4)
    b._check_invariants()


def test_an_impossible_tier_size_is_an_out_of_memory_error_not_an_abort() -> None:
    # 2**30 slots (16 GiB of keys) under a 2 GiB address-space limit, in a child process: refused
    # before anything is filled, whatever the machine's memory or overcommit policy.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import resource
        import kvcore
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            kvcore.KVCacheManager(8, 4, lower_tiers=[("host", 2**30)])
        except kvcore.OutOfMemoryError as e:
            print("refused:", e)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith('refused: cannot allocate lower tier "host"')


@pytest.mark.parametrize(
    ("first", "second", "ok"),
    [("a", "b", False), (None, "*", False), ("a", None, False), ("*", "a", True), ("a", "a", True)],
)
def test_a_restored_chain_continues_only_its_own_namespace_or_a_public_one(
    first: str | None, second: str | None, ok: bool
) -> None:
    # A chain crossing tenants is no chain kvcore writes (a foreign or tampered directory): the
    # child is refused, a bool like any bad entry, and the tier stays consistent.
    m = KVCacheManager(16, 2, lower_tiers=[("disk", 8)])
    root = bytes(m.root_key())
    k1 = ref_page_key(root, first, [1, 2])
    k2 = ref_page_key(k1, second, [3, 4])
    got = m.restore_tier("disk", [(0, k1, root, first, [1, 2]), (1, k2, k1, second, [3, 4])])
    assert got.tolist() == [True, ok]
    m._check_invariants()
    stats = m.tier_stats()["disk"]
    assert stats["num_slots_free"] == 8 - 1 - ok
    assert stats["num_restored_pages"] == 1 + ok
    assert m.tier_prefix_len("disk", [1, 2, 3, 4], second) == (2 if ok else 0)


@pytest.mark.parametrize("parent_ok", [True, False])
def test_a_store_completed_before_its_parents_waits_for_it(parent_ok: bool) -> None:
    """A mover that finishes batches out of order: the child page's store (taken second) completes
    OK first. It waits, in flight, for its parent's store; it then lands if the parent did (the tier
    holds both pages, a later prompt loads them), and is counted failed if the parent failed. It
    used to be counted failed and dropped either way. A waiting op cannot be completed twice."""
    from kvcore.tiers import HostTier, Mover
    from kvcore.tiny import TinyDecoder, TinyEngine

    pool = TinyEngine.make_pool(TinyDecoder(0), 16, 4)
    host = HostTier(pool, 8)
    cache = kvcore.KVCacheManager(16, 4, lower_tiers=[host], store_policy="all")
    mover = Mover(cache, pool, [host])
    prompt = list(range(1, 10))  # two full pages and one token
    cache.add_sequence(1, prompt, cache_prompt=False, reserve=4)
    cache.commit(1, 4)
    parent = cache.take_transfers()
    cache.reserve(1, 5)
    cache.commit(1, 8)
    child = cache.take_transfers()
    assert len(parent.store_ops) == len(child.store_ops) == 1
    mover.execute(child)  # OK, before its parent
    stats = cache.tier_stats()["host"]
    assert stats["num_slots_in_flight"] == 2 and stats["num_store_failed_pages"] == 0
    with pytest.raises(kvcore.InvalidArgumentError, match="not a transfer in flight"):
        cache.complete_transfers(child.store_ops, True)
    cache.complete_transfers(parent.store_ops, parent_ok)
    stats = cache.tier_stats()["host"]
    assert stats["num_slots_in_flight"] == 0
    assert (stats["num_stored_pages"], stats["num_store_failed_pages"]) == ((2, 0) if parent_ok else (0, 2))
    cache.free_sequence(1)
    cache.evict(100)
    assert cache.peek_hit_tokens(prompt)["host"] == (8 if parent_ok else 0)
    cache._check_invariants()


def test_a_shared_tier_page_whose_load_failed_is_indexed_again_by_a_lookup() -> None:
    """A transient failure (a paused server) marked the slot bad: the page the store still held was
    never indexed again (mark_tier_pages stopped at the bad slot), so the prefix was lost for good."""
    m = KVCacheManager(32, PS, lower_tiers=[("remote", 64)], store_policy="all")
    demote(m, 1, PROMPT)
    m.add_sequence(2, PROMPT)
    b = m.take_transfers(stores=False)
    m.complete_transfers(b.load_ops, [True, False, True])
    complete_all(m, ok=False)  # the stores of its recomputed pages fail too (the server is paused)
    m.free_sequence(2)
    m.evict(1 << 20)
    assert m.tier_prefix_len("remote", PROMPT) == 1  # pages
    # The store still holds pages 1 and 2 (a lookup asked it): they are indexed again.
    assert m.mark_tier_pages("remote", PROMPT, 3) == 2
    m.add_sequence(3, PROMPT)
    assert m.hit_tokens(3) == {"hbm": 0, "remote": 12}
    m._check_invariants()


def test_restore_tier_says_why_it_refused_each_entry() -> None:
    """reasons=True: per entry "accepted" or why not, so an operator can tell a fingerprint change
    from a damaged directory; the bool answer is the same walk's."""
    m = KVCacheManager(16, 2, lower_tiers=[("disk", 16)])
    root = bytes(m.root_key())
    k1 = ref_page_key(root, "a", [1, 2])
    k2 = ref_page_key(k1, "a", [3, 4])
    k3 = ref_page_key(k2, "a", [5, 6])
    other_root = bytes(KVCacheManager(4, 2, fingerprint=b"other").root_key())
    o1 = ref_page_key(other_root, "a", [1, 2])
    x = ref_page_key(k1, "b", [7, 8])  # b's page below a's: a chain no cache writes
    entries = [
        (0, k1, root, "a", [1, 2]),
        (1, k2, k1, "a", [3, 4]),
        (2, k2, k1, "a", [3, 4]),  # the same page in another file
        (3, k3, k2, "a", [5, 9]),  # tampered tokens
        (4, ref_page_key(k3, "a", [7, 7]), k3, "a", [7, 7]),  # below the tampered page
        (5, o1, other_root, "a", [1, 2]),  # another fingerprint's
        (0, ref_page_key(k1, "a", [9, 9]), k1, "a", [9, 9]),  # slot 0 holds k1
        (6, x, k1, "b", [7, 8]),
    ]
    want = [
        "accepted",
        "accepted",
        "duplicate",  # (or the other way round with the entry before: which copy comes first)
        "key_mismatch",
        "parent_refused",
        "unknown_parent",
        "slot_in_use",
        "crosses_namespace",
    ]
    got = m.restore_tier("disk", entries, reasons=True)
    assert sorted(got[1:3]) == ["accepted", "duplicate"]
    assert got[:1] + got[3:] == want[:1] + want[3:]
    assert m.tier_stats()["disk"]["num_restored_pages"] == 2
    fresh = KVCacheManager(16, 2, lower_tiers=[("disk", 16)])
    assert fresh.restore_tier("disk", entries).tolist() == [w == "accepted" for w in got]
    # Restoring again: the index holds both pages in their slots, the rest is refused as before.
    assert m.restore_tier("disk", entries, reasons=True) == got
    assert m.tier_prefix_len("disk", [1, 2, 3, 4, 5, 6], "a") == 2
    m._check_invariants()
    with pytest.raises(InvalidDTypeError, match="reasons"):
        m.restore_tier("disk", entries, reasons="yes")


def test_restore_tier_of_duplicate_files_at_every_level_takes_linear_time() -> None:
    """Two files per page of one chain (the same pages stored again in other slots): each copy
    pushed its children again, 2^depth visits under the manager's lock; depth 60 never returned.
    Run in a child process, so that the old behaviour fails the test instead of hanging it."""
    import subprocess
    import sys

    code = """
import kvcore
ps, depth = 4, 60
toks = list(range(1, ps * depth + 1))
m = kvcore.KVCacheManager(8, ps, lower_tiers=[("disk", 2 * depth)])
keys, parent, entries = m.prompt_keys(toks), bytes(m.root_key()), []
for d in range(depth):
    for c in range(2):
        entries.append((2 * d + c, bytes(keys[d]), parent, None, toks[d * ps:(d + 1) * ps]))
    parent = bytes(keys[d])
got = m.restore_tier("disk", entries, reasons=True)
assert all(sorted(got[2 * d:2 * d + 2]) == ["accepted", "duplicate"] for d in range(depth)), got
assert m.tier_prefix_len("disk", toks) == depth  # (pages)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("policy", ["all", "value"])
def test_sequences_growing_in_a_full_tier_store_each_page_at_most_once(policy: str) -> None:
    # Two 48-page prompts side by side, then decode; the host tier holds 64 of their pages. Each
    # new page is stored below its own tier copy; a sequence whose tail the tier evicted (to make
    # room for the other's prompt) is not copied back by evicting the other's tail in turn: a key
    # stored twice is a write the tier threw away.
    ps, prompt = 16, 48 * 16
    m = KVCacheManager(1024, ps, lower_tiers=[("host", 64)], store_policy=policy)
    stored: list[bytes] = []

    def drain() -> None:
        b = complete_all(m)
        stored.extend(bytes(k) for k in b.store_keys[b.store_tiers == 0])

    for s in (1, 2):
        assert m.add_sequence(s, [s * 10_000 + i for i in range(prompt)]) is not None
        drain()
    for step in range(4 * ps):
        for s in (1, 2):
            m.append(s, [s * 10_000 + prompt + step])
            m.commit(s, prompt + step + 1)
        drain()
    assert len(stored) == len(set(stored))
    host = m.tier_stats()["host"]
    assert host["num_slots_cached"] == 64 and host["num_stored_pages"] == len(stored)
    if policy == "all":  # both prompts were stored, and the new pages below the copies kept
        assert len(stored) >= 96 + 4
    m._check_invariants()
