"""The manager, a real pool, HostTier, DiskTier and the Mover together: tenants, restart, faults.

Pages carry recognisable K/V (a per-prefix pattern written by the "engine"), so a page that comes back
from a tier can be checked byte for byte against what was computed for that very prefix.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kv_helpers import metric_value

import kvcore
from kvcore import KVCacheManager
from kvcore.pool import KVPool
from kvcore.tiers import DiskTier, HostTier, Mover

PS = 4
FP = b"tiny-model/fp16/p4"


def make_pool(num_pages: int) -> KVPool:
    return KVPool(
        num_layers=2, num_pages=num_pages, num_kv_heads=2, head_dim=8, page_size=PS, kv_dtype="fp16"
    )


def pattern(key: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The K/V (fp16) an engine computes for the page with this key (a pattern seeded by it)."""
    seed = int.from_bytes(bytes(key[:8]), "little")
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


class Engine:
    """Admits prompts and 'computes' their pages: writes each page's pattern; checks hit pages."""

    def __init__(self, cache: KVCacheManager, pool: KVPool, mover: Mover) -> None:
        self.cache, self.pool, self.mover = cache, pool, mover
        self.next_id = 0

    def page_shape(self) -> tuple[int, ...]:
        return self.pool.data[:, :, 0].shape

    def run(self, prompt: list[int], ns: str | None) -> dict[str, int]:
        sid = self.next_id
        self.next_id += 1
        assert self.cache.add_sequence(sid, prompt, ns) is not None
        self.mover.run(stores=False)  # loads only: the pages just cached are not computed yet
        assert self.cache.is_ready(sid)
        hit = self.cache.hit_tokens(sid)
        keys = kvcore.page_keys(np.asarray(prompt, dtype=np.int32), PS, fingerprint=FP, namespace=ns)
        pages = self.cache.seq_pages(sid)
        hit_pages = sum(hit.values()) // PS
        for i, key in enumerate(keys):
            want = pattern(key, self.page_shape())
            if i < hit_pages:  # found cached or loaded: exactly this prefix's K/V
                np.testing.assert_array_equal(self.pool.data[:, :, pages[i]], want)
            else:  # computed now
                self.pool.data[:, :, pages[i]] = want
        self.mover.run()  # stores of what was just computed
        self.cache.free_sequence(sid)
        return hit


def setup(tmp_path: Path, *, host: int = 6, disk_pages: int = 64, num_pages: int = 16, fp: bytes = FP):
    pool = make_pool(num_pages)
    host_tier = HostTier(pool, host)
    disk_tier = DiskTier(tmp_path / "disk", disk_pages * (pool.page_bytes + 8192), pool)
    cache = KVCacheManager(
        num_pages, PS, fingerprint=fp, lower_tiers=[host_tier, disk_tier], store_policy="all"
    )
    return cache, pool, host_tier, disk_tier, Engine(cache, pool, Mover(cache, pool, [host_tier, disk_tier]))


def test_two_tenants_every_slot_and_file_belongs_to_the_tenant_that_stored_it(tmp_path: Path) -> None:
    cache, pool, host, disk, engine = setup(tmp_path)
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 50, 12).tolist()  # both tenants send the very same tokens
    keys: dict[str, set[bytes]] = {"A": set(), "B": set()}
    for step in range(40):
        ns = "A" if step % 2 else "B"
        prompt = shared + rng.integers(0, 50, int(rng.integers(1, 12))).tolist()
        engine.run(prompt, ns)
        if step % 5 == 4:
            cache.evict(1 << 20)
        for k in kvcore.page_keys(np.asarray(prompt, dtype=np.int32), PS, fingerprint=FP, namespace=ns):
            keys[ns].add(bytes(k))
    assert not keys["A"] & keys["B"]
    # Every host slot's page is a page one tenant stored.
    held = host.slot_keys()
    assert held and all(k in keys["A"] | keys["B"] for k in held.values())
    # Every disk file names its tenant, and that tenant stored exactly that page.
    disk.close()
    entries = DiskTier(tmp_path / "disk", disk.num_slots * disk.file_bytes, pool).entries()
    assert entries
    for e in entries:
        assert e.namespace in ("A", "B")
        assert e.key in keys[e.namespace], e
    # And B never loaded A's page: the engine checked every hit page's bytes against B's own prefix.
    tiers = cache.tier_stats()
    assert tiers["host"]["num_loaded_pages"] + tiers["disk"]["num_loaded_pages"] > 0
    assert tiers["host"]["num_load_failed_pages"] == tiers["disk"]["num_load_failed_pages"] == 0


def test_a_reopened_disk_tier_warms_a_new_manager_with_the_same_fingerprint_only(tmp_path: Path) -> None:
    cache, _pool, _host, disk, engine = setup(tmp_path)
    prompt = list(range(1, 22))  # 5 full pages
    engine.run(prompt, "t")
    assert cache.tier_stats()["disk"]["num_stored_pages"] == 5
    disk.close()
    for fp, expected in ((FP, 20), (b"another-model", 0)):
        pool2 = make_pool(16)
        disk2 = DiskTier(tmp_path / "disk", disk.num_slots * disk.file_bytes, pool2)
        cache2 = KVCacheManager(16, PS, fingerprint=fp, lower_tiers=[disk2], store_policy="all")
        accepted = cache2.restore_tier("disk", disk2.entries())
        assert accepted.sum() == (5 if expected else 0)
        hit = cache2.add_sequence(0, prompt, "t")
        assert hit == expected
        Mover(cache2, pool2, [disk2]).run()
        if expected:
            keys = kvcore.page_keys(np.asarray(prompt, dtype=np.int32), PS, fingerprint=FP, namespace="t")
            pages = cache2.seq_pages(0)
            for i in range(5):
                np.testing.assert_array_equal(
                    pool2.data[:, :, pages[i]], pattern(keys[i], pool2.data[:, :, 0].shape)
                )
        assert cache2.add_sequence(1, prompt, "u") == 0  # another tenant: nothing
        disk2.close()


def test_a_flipped_byte_is_a_counted_miss_stored_again_and_nothing_wrong_is_read(tmp_path: Path) -> None:
    cache, pool, host, disk, engine = setup(tmp_path, host=1)
    prompt = list(range(1, 22))
    engine.run(prompt, None)
    engine.run(list(range(100, 110)), None)  # host (1 slot) now holds something else
    cache.evict(1 << 20)
    # Corrupt the payload of the file holding page 2 of the prompt.
    key2 = bytes(kvcore.page_keys(np.asarray(prompt, dtype=np.int32), PS, fingerprint=FP)[2])
    disk.close()
    reopened = DiskTier(tmp_path / "disk", disk.num_slots * disk.file_bytes, pool)
    target = next(e for e in reopened.entries() if e.key == key2)
    reopened.close()
    path = tmp_path / "disk" / f"slot-{target.slot:08d}.kv"
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    disk2 = DiskTier(tmp_path / "disk", disk.num_slots * disk.file_bytes, pool)
    engine.mover = Mover(cache, pool, [host, disk2])
    hit = engine.run(prompt, None)  # checks every page it reports as hit byte for byte
    assert hit == {"hbm": 0, "host": 0, "disk": 8}  # pages 0 and 1; page 2 failed, recomputed
    assert disk2.stats()["checksum_mismatches"] == 1
    # (The file may be back: the slot was dropped and the recomputed page stored in it again.)
    assert cache.tier_stats()["disk"]["num_load_failed_pages"] == 1
    text = engine.mover.metrics_text()
    assert metric_value(text, "kvcore_tier_storage_checksum_mismatches_total", tier="disk") == 1
    assert metric_value(text, "kvcore_tier_load_failed_pages_total", tier="disk") == 1
    # The bad copy is dropped (with the pages behind it in its run), so it can be stored again:
    # the recomputed pages were, and the next run reads them, checked byte for byte.
    assert cache.tier_stats()["disk"]["num_slots_bad"] == 0
    assert cache.tier_stats()["disk"]["num_dropped_bad_slots"] >= 1
    cache.evict(1 << 20)
    assert sum(engine.run(prompt, None).values()) == 20  # every full page of the prompt
    disk2.close()


def test_a_full_or_unwritable_disk_skips_stores_and_nothing_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, _pool, _host, disk, engine = setup(tmp_path)

    def no_space(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", no_space)
    monkeypatch.setattr(os, "write", no_space)
    engine.run(list(range(1, 22)), None)
    s = cache.tier_stats()
    assert s["disk"]["num_store_failed_pages"] == 5 and s["disk"]["num_slots_cached"] == 0
    assert s["host"]["num_stored_pages"] == 5
    assert disk.stats()["store_failed"] >= 5
    monkeypatch.undo()
    engine.run(list(range(1, 22)), None)  # room again: stored this time (a hit now stores)
    cache._check_invariants()


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_a_public_prefix_and_a_tenant_storing_it_in_one_batch_both_land(kind: str, tmp_path: Path) -> None:
    """A public system prompt and a tenant's prompt over it offer the same HBM pages in one step: the
    public pages are stored once, under their public keys (the tenant's store no longer writes them
    again under its own), the tenant's page after them chained from the last public key, as HBM keys
    them; no store fails, and after HBM is emptied the tenant's next prompt loads exactly the K/V
    that was computed."""
    pool = make_pool(32)
    disk = (tmp_path / "d", 16 * (pool.page_bytes + 8192), pool)
    tier = HostTier(pool, 16) if kind == "host" else DiskTier(*disk)
    cache = KVCacheManager(32, PS, lower_tiers=[tier], store_policy="all", events=True)
    mover = Mover(cache, pool, [tier])
    system = list(range(100, 108))  # two full pages
    own = [7, 7, 7, 7]  # the tenant's page after them
    assert cache.add_sequence(1, [*system, 1], "*") == 0
    assert cache.add_sequence(2, [*system, *own, 2], "a") == 8  # hits the public pages
    computed = {}
    for p in cache.seq_pages(2)[:3].tolist():
        pool.data[:, :, p] = np.random.default_rng(p).standard_normal(pool.data[:, :, p].shape)
        computed[p] = pool.data[:, :, p].copy()
    batch = cache.take_transfers(loads=False)
    assert sorted(batch.store_pages.tolist()) == sorted(computed)  # each page once
    prompt = np.array([*system, *own], np.int32)
    public_keys = kvcore.page_keys(prompt, PS, namespace="*")
    tenant_keys = kvcore.page_keys(prompt, PS, namespace="a", public_pages=2)
    assert (tenant_keys[:2] == public_keys[:2]).all()
    assert sorted(map(bytes, batch.store_keys)) == sorted(map(bytes, tenant_keys))
    assert (cache.page_keys(2) == tenant_keys).all()  # HBM and the tier key the pages alike
    result = mover.execute(batch)
    assert result.store_failed == 0 and result.stored == 3
    stats = cache.tier_stats()[tier.name]
    assert stats["num_store_failed_pages"] == 0 and stats["num_slots_cached"] == 3
    stored = [e for e in cache.take_events() if type(e).__name__ == "PageStored" and e.medium == tier.name]
    assert [(e.namespace, [bytes(k) for k in e.keys], e.parent_key) for e in stored] == [
        ("*", [bytes(k) for k in public_keys[:2]], None),
        ("a", [bytes(tenant_keys[2])], bytes(public_keys[1])),
    ]
    cache.free_sequence(1)
    cache.free_sequence(2)
    cache.evict(1000)
    pool.data[...] = 0
    assert cache.add_sequence(3, [*system, *own, 3], "a") is not None
    mover.run(stores=False)
    assert cache.is_ready(3) and cache.hit_tokens(3)[tier.name] == 12
    for page, want in zip(cache.seq_pages(3)[:3].tolist(), computed.values(), strict=True):
        np.testing.assert_array_equal(pool.data[:, :, page], want)
    cache._check_invariants()


class _InterruptedOnReturn:
    """A cache whose take_transfers is interrupted as the native call returns (where CPython runs a
    signal handler, so a KeyboardInterrupt lands before the caller can hold the batch)."""

    def __init__(self, cache: KVCacheManager) -> None:
        self._cache = cache

    def __getattr__(self, name: str) -> object:
        return getattr(self._cache, name)

    def take_transfers(self, **kw: object) -> object:
        self._cache.take_transfers(**kw)
        raise KeyboardInterrupt


def _queued_store_and_load(tmp_path: Path) -> tuple[KVCacheManager, KVPool, HostTier]:
    pool = make_pool(16)
    host = HostTier(pool, 8)
    cache = KVCacheManager(16, PS, lower_tiers=[host], store_policy="all")
    mover = Mover(cache, pool, [host])
    assert cache.add_sequence(1, list(range(9))) == 0
    mover.run()  # two pages stored
    cache.free_sequence(1)
    cache.evict(100)
    assert cache.add_sequence(2, list(range(9))) == 8  # loads from the host tier queued
    assert cache.add_sequence(3, list(range(50, 59))) == 0  # stores queued
    return cache, pool, host


def _nothing_held(cache: KVCacheManager) -> None:
    # Transfers queued since (the stores of pages recomputed after failed loads) are not lost ones:
    # run them (failed) first.
    while b := cache.take_transfers():
        cache.complete_transfers(np.unique(b.store_ops).tolist() + b.load_ops.tolist(), False)
    t = cache.tier_stats()["host"]
    assert t["num_slots_in_flight"] == 0 and t["num_slots_locked"] == 0
    cache.free_sequence(2)
    cache.free_sequence(3)
    cache.evict(100)
    assert cache.stats().num_pages_in_use == 0  # no page held by a lost transfer
    cache._check_invariants()


def test_an_interrupt_as_take_transfers_returns_leaves_nothing_held(tmp_path: Path) -> None:
    cache, pool, host = _queued_store_and_load(tmp_path)
    mover = Mover(_InterruptedOnReturn(cache), pool, [host])
    with pytest.raises(KeyboardInterrupt):
        mover.run()
    assert not cache.is_ready(2) or cache.hit_tokens(2)["host"] == 0  # its loads failed: recomputed
    _nothing_held(cache)


@pytest.mark.parametrize("where", ["store", "load"])
def test_an_interrupt_inside_a_tier_reports_every_op(where: str, tmp_path: Path) -> None:
    cache, pool, host = _queued_store_and_load(tmp_path)

    def interrupted(*a: object, **k: object) -> object:
        raise KeyboardInterrupt

    setattr(host, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        Mover(cache, pool, [host]).run()
    _nothing_held(cache)


def test_a_raising_tier_fails_its_rows_and_the_other_tiers_still_move(tmp_path: Path) -> None:
    """One tier's exception no longer fails the rest of the batch untried: the other tier's rows
    move, every op is reported, then the exception is raised."""
    pool = make_pool(16)
    host, disk = HostTier(pool, 8), DiskTier(tmp_path / "d", 8 * (pool.page_bytes + 8192), pool)
    cache = KVCacheManager(16, PS, lower_tiers=[host, disk], store_policy="all")

    def broken(*a: object, **k: object) -> object:
        raise OSError("host tier down")

    host.store = broken  # type: ignore[method-assign]
    assert cache.add_sequence(1, list(range(9))) == 0
    with pytest.raises(OSError, match="host tier down"):
        Mover(cache, pool, [host, disk]).run()
    ts = cache.tier_stats()
    assert ts["host"]["num_store_failed_pages"] == 2 and ts["host"]["num_slots_cached"] == 0
    assert ts["disk"]["num_stored_pages"] == 2  # tried after the host tier raised, and landed
    assert all(t["num_slots_in_flight"] == 0 for t in ts.values())


def test_take_transfers_sink_must_be_a_list() -> None:
    cache = KVCacheManager(16, PS, lower_tiers=[("host", 4)])
    with pytest.raises(kvcore.InvalidArgumentError, match="sink must be a list"):
        cache.take_transfers(sink=())  # type: ignore[arg-type]
    sink: list[object] = []
    batch = cache.take_transfers(sink=sink)
    assert len(sink) == 1 and sink[0] is batch


def test_a_tenants_pages_after_a_public_prefix_survive_a_disk_restart(tmp_path: Path) -> None:
    """Each file names its parent by the key the cache chains from (the public prefix's last key for
    a tenant's first own page): a restarted cache accepts every file and loads the whole prompt."""
    pool = make_pool(32)
    size = 16 * (pool.page_bytes + 8192)
    disk = DiskTier(tmp_path / "d", size, pool)
    cache = KVCacheManager(32, PS, fingerprint=FP, lower_tiers=[disk], store_policy="all")
    system, own = list(range(100, 108)), [7, 7, 7, 7, 8, 8, 8, 8]
    assert cache.add_sequence(1, [*system, 1], "*") == 0
    assert cache.add_sequence(2, [*system, *own, 2], "a") == 8
    for p in cache.seq_pages(2)[:4].tolist():
        pool.data[:, :, p] = np.random.default_rng(p).standard_normal(pool.data[:, :, p].shape)
    written = pool.data[:, :, cache.seq_pages(2)[:4]].copy()
    Mover(cache, pool, [disk]).run()
    disk.close()
    pool.data[...] = 0
    disk = DiskTier(tmp_path / "d", size, pool)
    fresh = KVCacheManager(32, PS, fingerprint=FP, lower_tiers=[disk], store_policy="all")
    entries = disk.entries()
    assert len(entries) == 4  # the public pages once (no second copy under the tenant's keys)
    assert all(fresh.restore_tier(disk.name, entries))
    assert fresh.add_sequence(3, [*system, *own, 3], "a") == 16
    Mover(fresh, pool, [disk]).run(stores=False)
    assert fresh.is_ready(3) and fresh.hit_tokens(3)[disk.name] == 16
    np.testing.assert_array_equal(pool.data[:, :, fresh.seq_pages(3)[:4]], written)
    assert fresh.peek_hit_tokens([*system, 9], "b")["hbm"] == 8  # loaded as public pages: b shares them
    fresh._check_invariants()


def test_rows_written_for_a_failed_store_op_are_forgotten(tmp_path: Path) -> None:
    """A store op fails whole when one row fails; the rows the tier wrote are dropped before the op
    is reported (a full disk kept them, taking the room later stores needed)."""
    pool = make_pool(16)
    disk = DiskTier(tmp_path / "d", 8 * (pool.page_bytes + 8192), pool)
    real_store = disk.store

    def last_row_fails(pool: KVPool, *rows: Any) -> np.ndarray:  # writes every row but the last
        ok = real_store(pool, *(r[:-1] for r in rows))
        return np.append(np.asarray(ok, dtype=bool), False)

    disk.store = last_row_fails  # type: ignore[method-assign]
    cache = KVCacheManager(16, PS, lower_tiers=[disk], store_policy="all")
    assert cache.add_sequence(1, list(range(13))) == 0  # three full pages: one op of three rows
    result = Mover(cache, pool, [disk]).run()
    assert result.stored == 2 and result.store_failed == 1
    assert cache.tier_stats()[disk.name]["num_store_failed_pages"] == 3
    assert disk.stats()["forgets"] == 2 and disk.stats()["slots_used"] == 0
    assert os.listdir(tmp_path / "d") == ["tier.lock"]  # no page file left behind


def test_a_store_taken_while_its_parent_was_in_flight_keeps_that_parent_in_the_tier() -> None:
    """Op B continues op A's last page and was taken while A was in flight (its tier lock ends above
    A). Once A lands, B holds A's pages: making room for another store must not evict them (B was
    stored by the tier, then counted failed and dropped)."""
    pool = make_pool(16)
    host = HostTier(pool, 3)
    cache = KVCacheManager(16, PS, lower_tiers=[host], store_policy="all")
    mover = Mover(cache, pool, [host])
    a = list(range(1, 2 * PS + 1))
    cache.add_sequence(1, [*a, 99])  # pages 0, 1: store op A, two slots
    batch_a = cache.take_transfers()
    cache.append(1, list(range(100, 100 + PS)))  # page 2 fills: store op B, continues A
    batch_b = cache.take_transfers()
    mover.execute(batch_a)  # A lands; every slot is taken (A's two, B's one)
    cache.add_sequence(2, [500 + i for i in range(PS)] + [7])  # wants a slot: only A's leaf could go
    assert len(cache.take_transfers().store_ops) == 0  # skipped: no room (A is held for B)
    assert mover.execute(batch_b).stored == 1
    t = cache.tier_stats()["host"]
    assert (t["num_stored_pages"], t["num_store_failed_pages"], t["num_evicted_slots"]) == (3, 0, 0)
    assert cache.tier_prefix_len("host", [*a, 99, 100, 101, 102]) == 3
    assert t["num_slots_locked"] == 0 and t["num_slots_in_flight"] == 0
    cache._check_invariants()


@pytest.mark.parametrize("answer", [None, float("nan"), 1.0, True, -1, "2"])
def test_lookup_refuses_an_exists_answer_that_is_not_a_count(answer: Any) -> None:
    """A shared tier's exists() answer was passed to int(): None raised a builtin TypeError, NaN a
    ValueError, 1.0 and True were taken as counts."""
    pool = make_pool(16)

    class Shared(HostTier):
        def exists(self, keys: np.ndarray) -> Any:
            return answer

    tier = Shared(pool, 8, name="remote")
    cache = KVCacheManager(16, PS, lower_tiers=[tier])
    with pytest.raises(kvcore.ConfigError, match="exists answered"):
        Mover(cache, pool, [tier]).lookup(list(range(13)), "ns")
    assert cache.tier_prefix_len("remote", list(range(13)), "ns") == 0


def test_lookup_cuts_an_exists_answer_at_the_keys_asked() -> None:
    """A tier answering more leading keys than it was asked about made mark_tier_pages raise
    InvalidArgumentError ("4 pages asked, the tokens hold 3") out of the lookup."""
    pool = make_pool(16)

    class Shared(HostTier):
        def exists(self, keys: np.ndarray) -> int:
            return len(keys) + 5

    class SharedRuns(Shared):
        def exists_runs(self, runs: list[np.ndarray]) -> list[int]:
            return [len(k) + 5 for k in runs]

    prompt = list(range(13))  # three full pages
    for kind in (Shared, SharedRuns):
        tier = kind(pool, 8, name="remote")
        cache = KVCacheManager(16, PS, lower_tiers=[tier])
        assert Mover(cache, pool, [tier]).lookup(prompt, "ns") == 3
        assert cache.tier_prefix_len("remote", prompt, "ns") == 3

    class WrongRuns(Shared):
        def exists_runs(self, runs: list[np.ndarray]) -> list[int]:
            return [0]

    tier = WrongRuns(pool, 8, name="remote")
    cache = KVCacheManager(16, PS, lower_tiers=[tier])
    with pytest.raises(kvcore.ConfigError, match="answered 1 counts for 2 runs"):
        Mover(cache, pool, [tier]).lookup(prompt, "ns")


def test_lookup_probes_the_public_prefix_only_when_the_index_cannot_tell() -> None:
    """Mover.lookup asks a shared tier for a prompt's public chain and its namespace's chain in one
    round trip (exists_runs; two exists calls for a tier without it), and only for the namespace's
    chain when the cache's index already holds the namespace's own pages after the public ones (the
    public prefix ends there), or for a "*" prompt."""
    pool = make_pool(16)

    class Shared(HostTier):
        calls: list[list[int]]

        def exists(self, keys: np.ndarray) -> int:
            self.calls.append([len(keys)])
            return 0

    class SharedRuns(Shared):
        def exists_runs(self, runs: list[np.ndarray]) -> list[int]:
            self.calls.append([len(k) for k in runs])
            return [0] * len(runs)

    prompt = list(range(1, 13))
    for kind, cold in ((Shared, [[1], [3]]), (SharedRuns, [[1, 3]])):
        tier = kind(pool, 8)
        tier.calls = []
        cache = KVCacheManager(16, PS, lower_tiers=[tier], store_policy="all")
        mover = Mover(cache, pool, [tier])
        assert mover.lookup(prompt, "a") == 0 and tier.calls == cold  # nothing indexed: both chains
        tier.calls.clear()
        assert mover.lookup(prompt, "*") == 0 and tier.calls == [[3]]
        cache.add_sequence(1, [*prompt, 0], "a")
        mover.run()  # a's three pages stored and indexed
        cache.free_sequence(1)
        tier.calls.clear()
        assert mover.lookup([*prompt, 5, 6, 7, 8], "a") == 0 and tier.calls == [[1]]  # the 4th page


def _chained(events: list[object], medium: str) -> None:
    """Every key a medium's PageStored events report is the documented hash of its parent key, its
    namespace and its tokens (the tests' own implementation), and its parent is on that medium."""
    from kv_helpers import ref_page_key

    from kvcore.events import PageStored

    seen: set[bytes] = set()
    for e in events:
        if not isinstance(e, PageStored) or e.medium != medium:
            continue
        parent = e.parent_key
        assert parent is None or parent in seen, "a parent that is not on the medium"
        prev = parent if parent is not None else None
        for i, key in enumerate(e.keys):
            page = e.tokens[i * PS : (i + 1) * PS].tolist()
            want = ref_page_key(prev if prev is not None else _ROOT, e.namespace, page)
            assert bytes(key) == want, "a key not chained from its parent"
            prev = bytes(key)
            seen.add(prev)


_ROOT = bytes(KVCacheManager(2, PS).root_key())


def test_a_tenants_own_copy_of_public_tokens_is_never_continued_below_the_public_copy(tmp_path: Path) -> None:
    """HBM holds a tenant's own copy of a system prompt (computed before it was public), the tier the
    public copy: the tenant's later pages, keyed in its own chain, are not stored below the public
    pages (an event chain a router cannot follow, a file whose parent has no file), and a restart
    accepts every file (review)."""
    pool = make_pool(32)
    size = 32 * (pool.page_bytes + 8192)
    disk = DiskTier(tmp_path / "d", size, pool)
    cache = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="selective", events=True)
    mover = Mover(cache, pool, [disk])
    system, x, y = list(range(100, 108)), [7] * 4, [8] * 4

    def admit(sid: int, tokens: list[int], ns: str | None) -> None:
        assert cache.add_sequence(sid, tokens, ns) is not None
        mover.run()
        mover.run()
        cache.free_sequence(sid)

    admit(1, [*system, *x, 0], None)  # the default namespace's own copy, used once: not stored
    admit(2, [*system, 1], "*")
    admit(3, [*system, 2], "*")  # the public copy, hit: stored
    admit(4, [*system, *x, *y, 3], None)  # hits its own copy: its path is offered
    events = cache.take_events()
    _chained(events, disk.name)
    _chained(events, "hbm")
    cache._check_invariants()
    disk.close()
    disk = DiskTier(tmp_path / "d", size, pool)
    fresh = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="all", events=True)
    assert all(fresh.restore_tier(disk.name, disk.entries()))
    _chained(fresh.take_events(), disk.name)


def test_a_restore_keeps_no_page_below_a_copy_in_other_namespaces(tmp_path: Path) -> None:
    """A tenant's own copy of public tokens, and its pages after it, sit in a directory beside the
    public copy: the restore accepts both paths, each in its namespaces (it refused the tenant's copy
    as a duplicate of the public one, then hung the tenant's later pages below the public pages: keys
    chained from a page not on their path)."""
    pool = make_pool(32)
    size = 32 * (pool.page_bytes + 8192)
    disk = DiskTier(tmp_path / "d", size, pool)
    cache = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="all")
    mover = Mover(cache, pool, [disk])
    system, own = list(range(100, 108)), [7] * 4 + [8] * 4
    for sid, (ns, tokens) in enumerate([("a", [*system, *own, 1]), ("*", [*system, 2])]):
        assert cache.add_sequence(sid, tokens, ns) is not None
        mover.run()
        cache.free_sequence(sid)
        cache.evict(100)
    assert cache.tier_stats()[disk.name]["num_slots_cached"] == 6
    disk.close()
    disk = DiskTier(tmp_path / "d", size, pool)
    entries = disk.entries()
    fresh = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="all", events=True)
    accepted = fresh.restore_tier(disk.name, entries)
    assert len(entries) == 6 and all(accepted)
    _chained(fresh.take_events(), disk.name)
    assert fresh.tier_prefix_len(disk.name, [*system, *own], "a") == 4  # the tenant's own path
    assert fresh.tier_prefix_len(disk.name, system, "*") == 2
    prompt = [*system, *own, 3]
    assert fresh.add_sequence(9, prompt, "a") == 16
    Mover(fresh, pool, [disk]).run(stores=False)
    assert fresh.is_ready(9) and fresh.hit_tokens(9)[disk.name] == 16
    assert (fresh.page_keys(9) == kvcore.page_keys(np.array(prompt, np.int32), PS, namespace="a")).all()
    fresh._check_invariants()
    # Given in two calls, public entries first or last: the same two paths (the tenant's own copy
    # was refused as a duplicate of the public one restored before it, and every page below with it).
    public = [e for e in entries if e.namespace == "*"]
    tenant = [e for e in entries if e.namespace != "*"]
    for first, second in ((public, tenant), (tenant, public)):
        split = KVCacheManager(32, PS, lower_tiers=[("d", disk.num_slots)], store_policy="all")
        assert split.restore_tier("d", first, reasons=True) == ["accepted"] * len(first)
        assert split.restore_tier("d", second, reasons=True) == ["accepted"] * len(second)
        assert split.tier_prefix_len("d", [*system, *own], "a") == 4
        assert split.tier_prefix_len("d", system, "*") == 2
        assert split.tier_prefix_len("d", system, "b") == 2  # public: visible from every tenant
        assert split.tier_prefix_len("d", [*system, *own], "b") == 2
        split._check_invariants()


@pytest.mark.parametrize("reset", [True, False])
def test_restoring_a_tenant_page_whose_slot_a_queued_store_took_refuses_it_and_changes_nothing(
    reset: bool, tmp_path: Path
) -> None:
    """A tenant's page (tokens T) sits in disk slot 0, evicted from the index; a public prompt
    starting with T fills the tier, and its next commit queues a store into slot 0 (the file still
    holds the tenant's page, the slot's key still names it). Restoring the directory then took the
    tenant's entry as "held here" (its lookup found the public copy of T), inserted it as a new page
    in the slot the store owns, and refused it with the insert left in the index: the slot was owned
    twice and completing the store raised InternalError out of Mover.run (found by a fuzzer)."""
    pool = make_pool(8)
    probe = DiskTier(tmp_path / "probe", 1 << 20, pool)
    file_bytes = probe.file_bytes
    probe.close()
    disk = DiskTier(tmp_path / "d", 3 * file_bytes, pool)
    assert disk.num_slots == 3
    cache = KVCacheManager(8, PS, lower_tiers=[disk], store_policy="all")
    mover = Mover(cache, pool, [disk])
    assert cache.add_sequence(0, [1, 2, 3, 4, 44], "a") == 0  # T = [1, 2, 3, 4] stored in slot 0
    mover.run()
    cache.free_sequence(0)
    assert cache.add_sequence(1, list(range(1, 18)), "*", cache_prompt=False) == 0
    cache.commit(1, 8)
    mover.run()  # the public pages 0-1 in slots 1-2
    cache.commit(1, 12)  # page 2's store queued, into slot 0 (its LRU slot: the tenant's page)
    assert cache.tier_stats()[disk.name]["num_slots_in_flight"] == 1
    if reset:
        cache.reset_prefix_cache()
    entries = disk.entries()
    tenant = [i for i, e in enumerate(entries) if e.namespace == "a"]
    assert len(entries) == 3 and len(tenant) == 1 and entries[tenant[0]].slot == 0
    got = cache.restore_tier(disk.name, entries, reasons=True)
    assert got[tenant[0]] == "slot_in_use"
    assert got.count("accepted") == 2
    cache._check_invariants()
    assert cache.tier_prefix_len(disk.name, [1, 2, 3, 4], "a") == 1  # through the public copy
    assert cache.restore_tier(disk.name, entries, reasons=True) == got  # again: nothing changes
    assert mover.run().store_failed == 0  # the queued store completes
    cache._check_invariants()
    cache.free_sequence(1)
    cache.reset_prefix_cache()
    cache._check_invariants()


def _small_disk_cache(tmp_path: Path) -> tuple[KVCacheManager, KVPool, DiskTier, Mover]:
    pool = KVPool(num_layers=1, num_pages=16, num_kv_heads=1, head_dim=8, page_size=2, kv_dtype="fp16")
    disk = DiskTier(tmp_path / "d", 10**6, pool)
    cache = KVCacheManager(16, 2, lower_tiers=[disk], store_policy="all")
    return cache, pool, disk, Mover(cache, pool, [disk])


def test_restored_siblings_below_a_node_a_load_holds_stay_siblings(tmp_path: Path) -> None:
    """A reset while a load holds the disk node of [1, 1]; the restore then added its children [2, 2]
    and [3, 3] from that node, and the first went *into* it (a leaf locked once grew in place, as if
    the restore held that lock): [3, 3] was indexed below [1, 1, 2, 2], and a later admission of
    [1, 1, 2, 2, 3, 3] loaded the K/V computed after [1, 1] as that page's, reported loaded (found by
    a KV-events fuzzer: the events named the real parent, the index another)."""
    cache, _, disk, mover = _small_disk_cache(tmp_path)
    for sid, prompt in enumerate([[1, 1, 9], [1, 1, 2, 2, 9], [1, 1, 3, 3, 9]]):
        cache.add_sequence(sid, prompt, "*")
        mover.run()
        cache.free_sequence(sid)
    cache.evict(100)
    cache.add_sequence(10, [1, 1, 5], "*")  # a disk hit: its load, queued, locks the node of [1, 1]
    cache.reset_prefix_cache()  # drops [2, 2] and [3, 3] from the index; [1, 1] is held
    assert cache.restore_tier(disk.name, disk.entries(), reasons=True) == ["accepted"] * 3
    assert cache.tier_prefix_len(disk.name, [1, 1, 2, 2], "*") == 2
    assert cache.tier_prefix_len(disk.name, [1, 1, 3, 3], "*") == 2
    assert cache.tier_prefix_len(disk.name, [1, 1, 3, 3, 2, 2], "*") == 2
    assert cache.tier_prefix_len(disk.name, [1, 1, 2, 2, 3, 3], "*") == 2
    mover.run()
    cache.free_sequence(10)
    cache.evict(100)
    prompt = [1, 1, 3, 3, 2, 2, 9]
    cache.add_sequence(11, prompt, "*")
    batch = cache.take_transfers(stores=False)
    want = kvcore.page_keys(np.array(prompt, np.int32), 2, namespace="*")
    index = {int(p): i for i, p in enumerate(cache.seq_pages(11).tolist())}
    assert len(batch.load_pages) == 2  # [1, 1] and [3, 3]: [2, 2] was never computed after them
    for key, page in zip(batch.load_keys, batch.load_pages, strict=True):
        assert bytes(key) == bytes(want[index[int(page)]])
    mover.execute(batch)
    cache._check_invariants()


def test_a_store_in_flight_through_a_restore_lands_below_its_own_parent(tmp_path: Path) -> None:
    """A tenant's store is queued below the disk node of public [1, 1]; a restore then re-added public
    [2, 2] from that node, in place, so the store landed one page too deep: the tier indexed a:[3, 3]
    below [1, 1, 2, 2] instead of [1, 1] (its event's key did not chain from its parent)."""
    cache, _, disk, mover = _small_disk_cache(tmp_path)
    for sid, (prompt, ns) in enumerate([([1, 1, 2, 2, 9], "*"), ([7, 7, 9], "*")]):
        cache.add_sequence(sid, prompt, ns)
        mover.run()
        cache.free_sequence(sid)
    cache.reset_prefix_cache()  # the index forgotten, the files stay
    cache.add_sequence(2, [1, 1, 9], "*")
    mover.run()
    cache.free_sequence(2)
    cache.add_sequence(3, [1, 1, 3, 3, 9], "a")  # queues the store of a:[3, 3] below [1, 1]
    got = cache.restore_tier(disk.name, disk.entries(), reasons=True)
    assert got.count("accepted") >= 2
    mover.run()  # the store lands
    assert cache.tier_prefix_len(disk.name, [1, 1, 3, 3], "a") == 2
    assert cache.tier_prefix_len(disk.name, [1, 1, 2, 2, 3, 3], "a") == 2  # [3, 3] is not below [2, 2]
    cache.free_sequence(3)
    cache._check_invariants()


def test_restoring_the_intact_file_of_a_bad_slot_makes_it_good(tmp_path: Path) -> None:
    """A transient failed load marks the slot of a shared prefix page bad; with children it keeps
    its place and every prompt below it missed the disk for good. restore_tier of that very file
    said "accepted" (the index holds it) but left the slot bad; it is now good again."""
    cache, _, disk, mover = _small_disk_cache(tmp_path)
    a, b = [1, 2, 3, 4, 5, 6, 0], [1, 2, 3, 4, 9, 9, 0]  # pages 0-1 shared
    for sid, prompt in enumerate((a, b)):
        cache.add_sequence(sid, prompt)
        mover.run()
        cache.free_sequence(sid)
    cache.evict(100)
    assert cache.peek_hit_tokens(a[:-1]) == {"hbm": 0, "disk": 6}
    cache.add_sequence(5, a)
    batch = cache.take_transfers()
    cache.complete_transfers(batch.load_ops[:1], False)  # page 0's load fails (an EIO), once
    cache.complete_transfers(batch.load_ops[1:], True)
    cache.free_sequence(5)
    mover.run()
    cache.evict(100)
    assert cache.tier_stats()[disk.name]["num_slots_bad"] == 1
    assert cache.peek_hit_tokens(b[:-1]) == {"hbm": 0, "disk": 0}
    assert cache.restore_tier(disk.name, disk.entries(), reasons=True) == ["accepted"] * 4
    assert cache.tier_stats()[disk.name]["num_slots_bad"] == 0
    for prompt in (a, b):
        assert cache.peek_hit_tokens(prompt[:-1]) == {"hbm": 0, "disk": 6}
    cache.add_sequence(6, b)
    mover.run(stores=False)
    assert cache.hit_tokens(6) == {"hbm": 0, "disk": 6}  # and the load succeeds
    cache.free_sequence(6)
    cache._check_invariants()


@pytest.mark.parametrize("answer", [True, [True], [True, True, True, True], [[True, True, True]], [1, 2, 1]])
def test_a_tier_answer_that_is_not_one_bool_per_row_fails_its_rows(answer: object, tmp_path: Path) -> None:
    """A scalar or length-1 answer broadcast to every row (pages nobody wrote reported loaded); a
    wrong length failed the ops but kept what the tier wrote. Now the rows fail, what they may have
    written is dropped, every op is reported, and the mistake is named (review)."""
    pool = make_pool(16)
    disk = DiskTier(tmp_path / "d", 8 * (pool.page_bytes + 8192), pool)
    real = disk.store
    disk.store = lambda *a: (real(*a), answer)[1]  # type: ignore[method-assign]
    cache = KVCacheManager(16, PS, lower_tiers=[disk], store_policy="all")
    assert cache.add_sequence(1, list(range(13))) == 0  # three pages: one store op
    with pytest.raises(kvcore.ConfigError, match="one bool per row"):
        Mover(cache, pool, [disk]).run()
    t = cache.tier_stats()[disk.name]
    assert t["num_store_failed_pages"] == 3 and t["num_slots_in_flight"] == 0
    assert os.listdir(tmp_path / "d") == ["tier.lock"]  # what it wrote is dropped


def test_an_interrupt_burst_while_failing_an_unreported_batch_loses_nothing(tmp_path: Path) -> None:
    cache, pool, host = _queued_store_and_load(tmp_path)
    calls = {"n": 0}

    class Bursty(_InterruptedOnReturn):
        def complete_transfers(self, *a: object) -> object:
            calls["n"] += 1
            if calls["n"] <= 3:  # the first tries are cut short by more interrupts
                raise KeyboardInterrupt
            return self._cache.complete_transfers(*a)

    with pytest.raises(KeyboardInterrupt):
        Mover(Bursty(cache), pool, [host]).run()
    assert calls["n"] == 4
    _nothing_held(cache)


def test_a_restore_keeps_the_indexed_branch_beside_a_stale_own_copy(tmp_path: Path) -> None:
    """Files a reset left (it forgets, it does not erase) hold tenant b's own copy of a system
    prompt; the tier then indexed the public copy and b's pages after it. A restart restores both
    branches, each below its own parent: b's hit is what it was (the stale copy won and b's pages
    after the public copy were refused: 12 tokens became 8; review)."""
    pool = make_pool(32)
    size = 16 * (pool.page_bytes + 8192)
    disk = DiskTier(tmp_path / "d", size, pool)
    cache = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="all")
    mover = Mover(cache, pool, [disk])
    system, x, y = list(range(100, 104)), [7] * 4, [8] * 4
    assert cache.add_sequence(1, [*system, *x, 0], "b") == 0  # b's own copy
    cache.free_sequence(1)
    mover.run()
    cache.evict(100)
    for i in range(4):  # other pages after them: the slots a reset frees first are not b's
        assert cache.add_sequence(50 + i, [60 + i] * 8 + [0], "z") == 0
        cache.free_sequence(50 + i)
        mover.run()
        cache.evict(100)
    cache.reset_prefix_cache()
    assert cache.add_sequence(2, [*system, 0], "*") == 0
    cache.append(2, [1])
    mover.run()
    assert cache.add_sequence(3, [*system, *x, *y, 0], "b") == 4  # over the public copy
    cache.append(3, [1])
    mover.run()
    for sid in (2, 3):
        cache.free_sequence(sid)
    mover.run()
    cache.evict(100)
    prompt = [*system, *x, *y, 0]
    assert cache.peek_hit_tokens(prompt, "b") == {"hbm": 0, "disk": 12}
    disk.close()
    disk = DiskTier(tmp_path / "d", size, pool)
    fresh = KVCacheManager(32, PS, lower_tiers=[disk], store_policy="all", events=True)
    entries = disk.entries()
    assert any(e.namespace == "b" and e.tokens.tolist() == system for e in entries)  # the stale copy
    accepted = fresh.restore_tier(disk.name, entries)
    assert all(a for e, a in zip(entries, accepted, strict=True) if e.namespace != "z")
    assert fresh.peek_hit_tokens(prompt, "b") == {"hbm": 0, "disk": 12}
    _chained(fresh.take_events(), disk.name)
    fresh._check_invariants()


def test_a_tier_may_answer_0_1_integers(tmp_path: Path) -> None:
    pool = make_pool(16)
    host = HostTier(pool, 8)
    real = host.store
    host.store = lambda *a: np.asarray(real(*a), dtype=np.uint8)  # type: ignore[method-assign]
    cache = KVCacheManager(16, PS, lower_tiers=[host], store_policy="all")
    assert cache.add_sequence(1, list(range(13))) == 0
    assert Mover(cache, pool, [host]).run().stored == 3


def test_a_public_prefix_longer_than_one_question_is_reached_without_asking_in_vain() -> None:
    """With max_lookup_keys below the public prefix's length, a lookup indexes what one question
    reaches and stops there: it no longer asks for the tenant's pages keyed over a public prefix it
    has not seen the end of (keys that cannot exist); the next lookups go on from there."""
    pool = make_pool(32)

    class Shared(HostTier):
        max_lookup_keys = 2
        held: set[bytes]
        calls: list[int]

        def exists(self, keys: np.ndarray) -> int:
            self.calls.append(len(keys))
            n = 0
            for k in keys[: self.max_lookup_keys]:
                if bytes(k) not in self.held:
                    break
                n += 1
            return n

    tier = Shared(pool, 32)
    cache = KVCacheManager(32, PS, lower_tiers=[tier], store_policy="all")
    system, own = list(range(100, 120)), [7] * 4  # five public pages, then one of tenant a
    prompt = np.array([*system, *own, 0], np.int32)
    public = kvcore.page_keys(prompt[:20], PS, namespace="*")
    tenant = kvcore.page_keys(prompt[:24], PS, namespace="a", public_pages=5)
    tier.held = {bytes(k) for k in [*public, tenant[5]]}
    mover = Mover(cache, pool, [tier])
    reached, questions = [], []
    for _ in range(4):
        tier.calls = []
        mover.lookup(prompt, "a")
        reached.append(cache.tier_prefix_len(tier.name, prompt, "a"))
        questions.append(len(tier.calls))
    assert reached == [2, 4, 6, 6]  # two public pages a question, then the tenant's page
    # The next public key with the tenant's chain, then the public run: no tenant question over a
    # public prefix cut short (it made one more each time); the third lookup reaches its end.
    assert questions[:2] == [3, 3] and questions[2] == 4
    assert cache.tier_prefix_len(tier.name, prompt, "*") == 5


@pytest.mark.parametrize("kind", ["load", "store"])
def test_a_batch_executed_again_is_refused_before_any_byte_moves(kind: str, tmp_path: Path) -> None:
    """A retry of a batch already executed (a loop around a raising tier) must not copy again: its
    HBM pages and tier slots went back to the cache and hold another sequence's K/V by then."""
    cache, pool, host = _queued_store_and_load(tmp_path)
    mover = Mover(cache, pool, [host])
    batch = cache.take_transfers(stores=kind == "store", loads=kind == "load")
    assert len(batch.load_ops if kind == "load" else batch.store_ops)
    mover.execute(batch)
    # Another sequence's K/V land in the pages and slots the batch used.
    pool.data[...] = 7
    host._rows[...] = 9
    pool_before, host_before = pool.data.copy(), host._rows.copy()
    stats_before = cache.tier_stats()
    with pytest.raises(kvcore.InvalidArgumentError, match="not a transfer in flight"):
        mover.execute(batch)
    np.testing.assert_array_equal(pool.data, pool_before)  # no stale load over live pages
    np.testing.assert_array_equal(host._rows, host_before)  # no stale store over live slots
    assert cache.tier_stats() == stats_before
    with pytest.raises(kvcore.InvalidArgumentError, match="check_transfers: op"):
        cache.check_transfers(np.unique(batch.store_ops).tolist() + batch.load_ops.tolist())
    cache._check_invariants()


def test_check_transfers_accepts_taken_ops_and_refuses_the_rest(tmp_path: Path) -> None:
    cache, _pool, _host = _queued_store_and_load(tmp_path)
    batch = cache.take_transfers(stores=False)
    ops = batch.load_ops.tolist()
    cache.check_transfers(ops)  # in flight: nothing raised, nothing changed
    cache.check_transfers([])
    with pytest.raises(kvcore.InvalidArgumentError, match="listed twice"):
        cache.check_transfers(ops + ops[:1])
    with pytest.raises(kvcore.InvalidArgumentError, match="not an op id"):
        cache.check_transfers([-1])
    cache.complete_transfers(ops, True)
    assert cache.is_ready(2)
    with pytest.raises(kvcore.InvalidArgumentError, match="not a transfer in flight"):
        cache.check_transfers(ops[:1])


def test_after_a_reset_the_disk_files_stored_since_open_are_restored(tmp_path: Path) -> None:
    """entries() lists what the tier holds now, not what it found at open: after
    reset_prefix_cache, restore_tier(name, disk.entries()) finds the pages stored since (it restored
    none), and a slot forgotten since is no longer listed."""
    cache, _pool, _host, disk, engine = setup(tmp_path, host=2)
    assert disk.entries() == []  # an empty directory at open
    prompts = [list(range(i * 100, i * 100 + 13)) for i in range(3)]
    for p in prompts:
        engine.run(p, None)
    held = cache.tier_stats()["disk"]["num_slots_cached"]
    assert held == 9  # three pages of each prompt
    entries = disk.entries()
    assert sorted(e.slot for e in entries) == np.flatnonzero(disk._used).tolist()
    assert len(entries) == held
    cache.reset_prefix_cache()
    assert cache.tier_stats()["disk"]["num_slots_cached"] == 0
    assert all(cache.restore_tier("disk", disk.entries()))
    assert cache.tier_stats()["disk"]["num_slots_cached"] == held
    for p in prompts:  # every page comes back from disk, byte for byte (Engine.run checks them)
        assert engine.run(p, None)["disk"] == 12
    # A slot forgotten since is no longer listed.
    gone = entries[0].slot
    disk.forget(np.array([gone], dtype=np.int32))
    assert gone not in {e.slot for e in disk.entries()}
    cache._check_invariants()


def test_a_reset_during_a_load_loses_no_page_below_it(tmp_path: Path) -> None:
    """A reset cannot drop tier pages a load in flight holds: restore_tier refused their entries (the
    slot was not free) and with them every page below, then and on every later restore (8 of 10
    pages never indexed again). An entry the index holds in that very slot is now accepted, and the
    walk goes on below it; restoring twice changes nothing."""
    pool = make_pool(32)
    disk = DiskTier(tmp_path / "disk", 64 * 8192, pool)
    cache = KVCacheManager(32, PS, fingerprint=b"fp", lower_tiers=[disk], store_policy="all")
    mover = Mover(cache, pool, [disk])
    prompt = list(range(1, 42))  # 10 full pages
    cache.add_sequence(1, prompt)
    mover.run(stores=False)
    mover.run()
    cache.free_sequence(1)
    cache.evict(1 << 20)
    assert cache.peek_hit_tokens(prompt)["disk"] == 40
    cache.add_sequence(2, prompt[:9])  # loads the first two disk pages ...
    batch = cache.take_transfers(stores=False)  # ... in flight
    cache.reset_prefix_cache()
    assert cache.tier_stats()["disk"]["num_slots_locked"] == 2
    entries = disk.entries()
    assert cache.restore_tier("disk", entries).tolist() == [True] * 10
    assert cache.peek_hit_tokens(prompt)["disk"] == 40
    assert mover.execute(batch).loaded == 2
    cache.free_sequence(2)
    cache.evict(1 << 20)
    assert cache.restore_tier("disk", disk.entries()).tolist() == [True] * 10  # held: kept, not reused
    stats = cache.tier_stats()["disk"]
    assert (stats["num_slots_cached"], stats["num_slots_free"]) == (10, disk.num_slots - 10)
    assert cache.peek_hit_tokens(prompt)["disk"] == 40
    cache._check_invariants()  # (the tiers' invariants too)
