"""RedisTier during a live reshard of a real Redis Cluster: the ``-ASK`` redirections of a slot being
migrated are followed (``ASKING`` and the command, once, at the node named) and leave the slot map alone.

The migration is the one ``redis-cli --cluster reshard`` makes, caught half-way: the target marks the
slot IMPORTING, the source MIGRATING, and some of its keys are MIGRATEd. The source then serves the
keys it still holds and answers ``-ASK`` for the others (those moved, and new ones); the target serves
them only after ``ASKING``, and answers ``-MOVED`` back to the source without it. Each test checks the
bytes loaded against those stored, where each key lives on the servers (their own key counts), and the
tier's counters and slot map.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from redis_servers import RedisClusterServers, RedisServer, require_redis_server

from kvcore.pool import KVPool
from kvcore.tiers import RedisTier
from kvcore.tiers import remote as remote_mod

TIMEOUT = 0.5  # nothing here times out: a generous bound for a loaded machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    """A 3-master cluster of this module's own (each test migrates a slot of its own and ends it)."""
    require_redis_server()
    with RedisClusterServers() as c:
        yield c


def make_pool(num_pages: int = 16) -> KVPool:
    pool = KVPool(num_pages=num_pages, kv_dtype="bf16", layout="HND", num_layers=2, num_kv_heads=2,
                  head_dim=8, page_size=4)  # fmt: skip
    raw = np.random.default_rng(0).integers(0, 256, size=pool.data.nbytes, dtype=np.uint8)
    pool.data.view(np.uint8).reshape(-1)[:] = raw
    return pool


def keys_of_one_slot(tier: RedisTier, n: int, seed: int) -> tuple[int, np.ndarray]:
    """``(slot, uint8 [n, 16] page keys)``: ``n`` keys whose Redis keys all hash to one slot."""
    cand = np.random.default_rng(seed).integers(0, 256, size=(80_000, 16), dtype=np.uint8)
    slots = np.array([remote_mod._key_slot(tier.redis_key(k)) for k in cand])
    slot = int(np.argmax(np.bincount(slots, minlength=16384)))
    keys = cand[slots == slot]
    assert keys.shape[0] >= n
    return slot, keys[:n]


def store(tier: RedisTier, pool: KVPool, pages: list[int], keys: np.ndarray) -> np.ndarray:
    n = len(pages)
    return tier.store(
        pool,
        np.array(pages, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        keys=keys,
        parent_keys=keys,
        tokens=np.zeros((n, 4), dtype=np.uint32),
        namespaces=[None] * n,
    )


def load(tier: RedisTier, pool: KVPool, pages: list[int], keys: np.ndarray) -> np.ndarray:
    pool.data[:, :, pages] = 0
    return tier.load(pool, np.arange(len(pages), dtype=np.int32), np.array(pages, dtype=np.int32), keys)


class Migration:
    """Slot ``slot`` migrating from ``src`` to ``dst`` (IMPORTING / MIGRATING), ended by ``finish``."""

    def __init__(self, cluster: RedisClusterServers, tier: RedisTier, slot: int) -> None:
        owner = tier._nodes[int(tier._slots[slot])].name
        self.nodes = cluster.nodes
        self.src = next(nd for nd in cluster.nodes if nd.address == owner)
        self.dst = next(nd for nd in cluster.nodes if nd is not self.src)
        self.slot, self.tier = slot, tier
        self.src_id, self.dst_id = self.src.cli("CLUSTER", "MYID"), self.dst.cli("CLUSTER", "MYID")
        assert self.dst.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", self.src_id) == "OK"
        assert self.src.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", self.dst_id) == "OK"

    def move(self, keys: np.ndarray) -> None:
        names = [self.tier.redis_key(k).decode() for k in keys]
        host, port = self.dst.address.split(":")
        assert self.src.cli("MIGRATE", host, port, "", "0", "5000", "KEYS", *names) == "OK"

    def count(self, node: RedisServer) -> int:
        return int(node.cli("CLUSTER", "COUNTKEYSINSLOT", str(self.slot)))

    def finish(self, rest: np.ndarray) -> None:
        """As the reshard ends: the keys ``rest`` the source still holds are moved, then the slot is
        the target's on every node (the source answers MOVED from now on)."""
        if rest.shape[0]:
            self.move(rest)
        assert self.count(self.src) == 0
        others = [nd for nd in self.nodes if nd is not self.src and nd is not self.dst]
        for nd in (self.dst, self.src, *others):
            assert nd.cli("CLUSTER", "SETSLOT", str(self.slot), "NODE", self.dst_id) == "OK"


@pytest.fixture
def tier(cluster: RedisClusterServers, request: pytest.FixtureRequest) -> Iterator[RedisTier]:
    pool = make_pool()
    t = RedisTier(cluster.addresses, pool, timeout_s=TIMEOUT, prefix=f"ask-{request.node.name}")
    assert t.exists(np.zeros((1, 16), dtype=np.uint8)) == 0  # reads the slot map
    yield t
    t.close()


def test_keys_of_a_migrating_slot_are_loaded_stored_and_found_through_ask(
    cluster: RedisClusterServers, tier: RedisTier
) -> None:
    pool = make_pool()
    slot, keys = keys_of_one_slot(tier, 4, seed=1)
    kept, moved, new = keys[:1], keys[1:3], keys[3:]
    assert store(tier, pool, [1, 2, 3], keys[:3]).all()
    want = pool.data[:, :, [1, 2, 3]].copy()
    mig = Migration(cluster, tier, slot)
    mig.move(moved)  # half-way: one key left on the source, two on the target
    assert (mig.count(mig.src), mig.count(mig.dst)) == (1, 2)
    src_index = int(tier._slots[slot])
    before = tier.stats()

    ok = load(tier, pool, [9, 10, 11], keys[:3])  # the kept key at the source, the moved ones via ASK
    assert ok.tolist() == [True] * 3
    assert np.array_equal(pool.data[:, :, [9, 10, 11]].view(np.uint8), want.view(np.uint8))
    assert store(tier, pool, [4], new).tolist() == [True]  # a new key of the slot: on the target
    assert (mig.count(mig.src), mig.count(mig.dst)) == (1, 3)
    assert tier.exists(keys) == 4  # kept, moved, moved, new
    assert tier.exists(np.concatenate([moved, new])) == 3

    s = tier.stats()
    delta = {k: s[k] - before[k] for k in s}
    assert delta["asks"] == 2 + 1 + 3 + 3  # load, store, the two exists: each row the source lacks
    assert delta["load_failed"] == delta["store_failed"] == delta["lookup_failed"] == 0
    assert delta["moved"] == delta["topology_refreshes"] == delta["deleted"] == 0
    assert delta["loads"] == 3 and delta["stores"] == 1
    assert int(tier._slots[slot]) == src_index and not tier._topology_stale  # the map is left alone

    # The reshard ends: the source now answers MOVED, followed, and the map is read again.
    mig.finish(kept)
    assert load(tier, pool, [9, 10, 11], keys[:3]).all()
    assert np.array_equal(pool.data[:, :, [9, 10, 11]].view(np.uint8), want.view(np.uint8))
    s = tier.stats()
    assert s["moved"] - before["moved"] == 3 and s["asks"] - before["asks"] == delta["asks"]
    assert tier.exists(keys) == 4
    assert tier._nodes[int(tier._slots[slot])].name == mig.dst.address
    assert tier.stats()["topology_refreshes"] - before["topology_refreshes"] == 1


def test_a_corrupt_value_found_through_ask_is_deleted_there(
    cluster: RedisClusterServers, tier: RedisTier
) -> None:
    """A load that finds a corrupt value on the target of an ASK deletes it there: the DEL to the
    source is answered ASK too, and followed."""
    pool = make_pool()
    slot, keys = keys_of_one_slot(tier, 2, seed=2)
    assert store(tier, pool, [1, 2], keys).all()
    mig = Migration(cluster, tier, slot)
    mig.move(keys[1:])
    name = tier.redis_key(keys[1]).decode()
    with mig.dst.client() as r:
        pipe = r.pipeline(transaction=False)  # one connection: ASKING holds for the next command
        pipe.execute_command("ASKING")
        pipe.execute_command("SETRANGE", name, str(tier.value_bytes - 1), "\x00\x01")  # corrupt, longer
        pipe.execute_command("ASKING")
        pipe.execute_command("EXISTS", name)
        assert pipe.execute()[3] == 1
    before = tier.stats()
    assert load(tier, pool, [9, 10], keys).tolist() == [True, False]
    s = tier.stats()
    assert s["load_failed_corrupt"] - before["load_failed_corrupt"] == 1
    assert s["deleted"] - before["deleted"] == 1 and s["asks"] - before["asks"] == 2  # GET and DEL
    assert (mig.count(mig.src), mig.count(mig.dst)) == (1, 0)
    assert tier.exists(keys) == 1
    mig.finish(keys[:1])


def test_exists_follows_a_moved_reply_once(cluster: RedisClusterServers, tier: RedisTier) -> None:
    """Right after a slot moved (the map not read again yet), exists asks the keys the old owner
    answered MOVED for at the new one, as store and load do (it answered the keys short: a false miss
    and a recompute of pages the load right after found)."""
    pool = make_pool()
    slot, keys = keys_of_one_slot(tier, 4, seed=3)
    other = np.random.default_rng(9).integers(0, 256, size=(3, 16), dtype=np.uint8)
    assert store(tier, pool, [1, 2, 3, 4], keys).all()
    assert store(tier, pool, [5, 6, 7], other).all()
    mig = Migration(cluster, tier, slot)
    mig.finish(keys)  # every key moved, the slot the target's: the source answers MOVED
    before = tier.stats()
    assert tier.exists(keys) == 4
    assert tier.exists_runs([keys, other, keys[:2]]) == [4, 3, 2]
    s = tier.stats()
    assert s["moved"] - before["moved"] == 4  # the first call's (the map is read again after it)
    assert s["lookup_failed"] == before["lookup_failed"]
    absent = np.random.default_rng(10).integers(0, 256, size=(2, 16), dtype=np.uint8)
    assert tier.exists(np.concatenate([keys[:1], absent, keys[1:]])) == 1  # absent keys stay absent


@pytest.mark.parametrize("ttl_ms", [None, 60_000])
def test_an_8bit_page_stored_again_through_ask_is_stored(
    cluster: RedisClusterServers, ttl_ms: int | None
) -> None:
    """An fp8/int8 store is SET, [PEXPIRE,] GETRANGE per page; an ASK retry put ASKING before the SET
    only, so the target answered the GETRANGE with MOVED and a page already there under this pool's
    own scales was reported store_failed_scales (the manager then dropped a page the server holds)."""
    pool = KVPool(num_pages=16, kv_dtype="fp8", layout="HND", num_layers=2, num_kv_heads=2, head_dim=8,
                  page_size=4)  # fmt: skip
    raw = np.random.default_rng(0).integers(0, 256, size=pool.data.nbytes, dtype=np.uint8)
    pool.data.view(np.uint8).reshape(-1)[:] = raw
    prefix = f"ask8-{ttl_ms}"
    tier = RedisTier(cluster.addresses, pool, timeout_s=TIMEOUT, prefix=prefix, ttl_ms=ttl_ms)
    assert tier.exists(np.zeros((1, 16), dtype=np.uint8)) == 0  # reads the slot map
    slot, keys = keys_of_one_slot(tier, 3, seed=4)
    assert store(tier, pool, [1, 2], keys[:2]).all()
    mig = Migration(cluster, tier, slot)
    mig.move(keys[:2])  # both on the target now: the source answers ASK
    before = tier.stats()
    assert store(tier, pool, [1, 2, 3], keys).tolist() == [True] * 3  # two there, one new (target)
    s = tier.stats()
    delta = {k: s[k] - before[k] for k in s}
    assert delta["store_failed"] == delta["store_failed_scales"] == 0
    assert delta["store_exists"] == 2 and delta["asks"] == 3
    assert (mig.count(mig.src), mig.count(mig.dst)) == (0, 3)
    if ttl_ms is not None:  # the PEXPIRE after ASKING reached the target too
        with mig.dst.client() as r:
            pipe = r.pipeline(transaction=False)  # ASKING holds for the next command
            for k in keys:
                pipe.execute_command("ASKING")
                pipe.execute_command("PTTL", tier.redis_key(k).decode())
            ttls = pipe.execute()[1::2]
        assert all(ttl_ms - 10_000 < t <= ttl_ms for t in ttls), ttls
    assert load(tier, pool, [9, 10, 11], keys).all()
    mig.finish(keys[:0])
    tier.close()
