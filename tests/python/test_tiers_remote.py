"""The remote tier (RedisTier) against real Redis servers on 127.0.0.1 (fixtures in redis_servers.py).

Each test checks behaviour against a reference: pool bytes against the bytes stored (bit for bit),
quantized pages against what the host tier makes of the same pages (one codec), values on the server
against the header format (parsed with the codec), and every failure path (killed, restarted, paused,
full servers, a cluster node down, corrupt or foreign values) against the counters, the keys left on
the server and the wall time of the call. Replies no real server gives (hostile CLUSTER SLOTS tables,
MOVED to anywhere) come from small fake servers on 127.0.0.1 (:class:`FakeServer`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_helpers import metric_value
from redis_servers import RedisClusterServers, require_redis_server

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError
from kvcore.pool import KVPool, dtypes
from kvcore.tiers import HostTier, Mover, RedisTier, codec
from kvcore.tiers import remote as remote_mod

L, H, P, D = 2, 2, 4, 8  # small geometry: a page is 2*2*2*4*8 = 256 elements
TIMEOUT = 0.2  # tiers of the fault tests: every wait is at most this long
SLACK = 0.25  # what a call may take beyond its timeout on a loaded CI machine
NAMESPACES: list[str | None] = [None, "*", "tenant-a", "ünï/✓"]


def make_pool(
    kv_dtype: str = "bf16", layout: str = "HND", num_pages: int = 12, seed: int = 0, **kw: Any
) -> KVPool:
    """A pool whose every byte is random (NaN and infinity bit patterns included: copies are bitwise)."""
    shape = {"num_layers": L, "num_kv_heads": H, "head_dim": D, "page_size": P, **kw}
    pool = KVPool(num_pages=num_pages, kv_dtype=kv_dtype, layout=layout, **shape)  # type: ignore[arg-type]
    raw = np.random.default_rng(seed).integers(0, 256, size=pool.data.nbytes, dtype=np.uint8)
    pool.data.view(np.uint8).reshape(-1)[:] = raw
    return pool


def meta(n: int, seed: int = 0, namespaces: list[str | None] | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 1000)
    return {
        "keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "parent_keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "tokens": rng.integers(0, 2**32, size=(n, P), dtype=np.uint32),
        "namespaces": namespaces if namespaces is not None else [NAMESPACES[i % 4] for i in range(n)],
    }


def i32(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


def rng_i32(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def page_bytes(pool: KVPool, page: int) -> np.ndarray:
    out: np.ndarray = pool.data[:, :, page].copy()
    return out


def nonzero(stats: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in stats.items() if v and k not in ("num_slots", "nodes")}


@pytest.fixture
def tier_factory(redis_url: str, redis_prefix: str) -> Iterator[Any]:
    """``make(pool, **kw)``: RedisTiers on the shared server under this test's prefix, closed after."""
    made: list[RedisTier] = []

    def make(pool: KVPool, url: Any = None, **kw: Any) -> RedisTier:
        kw.setdefault("prefix", redis_prefix)
        t = RedisTier(redis_url if url is None else url, pool, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("staged", [False, True], ids=["from-pool", "staged"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "int8", "fp8"])
def test_round_trip_is_bit_exact(tier_factory: Any, kv_dtype: str, layout: str, staged: bool) -> None:
    pool = make_pool(kv_dtype, layout)
    tier = tier_factory(pool)
    if staged:  # the path of device pools: pages copied into the staging rows, then sent
        tier._planes = lambda pool: None
    pages, slots = i32(3, 4, 1, 9, 5), i32(6, 0, 1, 7, 2)
    m = meta(5, namespaces=[None, "*", "tenant-a", "", "ünï/✓"])
    want = [page_bytes(pool, int(p)) for p in pages]
    assert tier.store(pool, pages, slots, **m).tolist() == [True] * 5
    before = pool.data.copy()
    dst = i32(10, 11, 2, 7, 8)
    assert tier.load(pool, slots, dst, m["keys"]).tolist() == [True] * 5
    for i, p in enumerate(dst):
        assert np.array_equal(page_bytes(pool, int(p)).view(np.uint8), want[i].view(np.uint8))
    untouched = np.setdiff1d(np.arange(pool.num_pages), dst)
    assert np.array_equal(pool.data[:, :, untouched].view(np.uint8), before[:, :, untouched].view(np.uint8))
    s = tier.stats()
    assert s["stores"] == 5 and s["loads"] == 5 and s["store_failed"] == s["load_failed"] == 0
    assert s["bytes_written"] == s["bytes_read"] == 5 * tier.value_bytes
    # The values on the server are exactly header + payload, keyed prefix:tag:keyhex.
    with_client(tier, lambda r: _check_values(r, tier, m, want))


def with_client(tier: RedisTier, fn: Any) -> Any:
    import redis

    host, port = tier._startup[0]
    with redis.Redis(host=host, port=port, socket_timeout=2) as r:
        return fn(r)


def _check_values(r: Any, tier: RedisTier, m: dict[str, Any], want: list[np.ndarray]) -> None:
    for i, k in enumerate(m["keys"]):
        name = tier.redis_key(k)
        assert name == f"{tier.prefix}:{tier.geometry_tag}:{k.tobytes().hex()}".encode()
        v = r.get(name)
        assert len(v) == tier.value_bytes
        h = codec.parse_header(v)
        assert h.key == k.tobytes() and h.parent_key == m["parent_keys"][i].tobytes()
        assert h.namespace == m["namespaces"][i] and np.array_equal(h.tokens, m["tokens"][i])
        assert h.geometry == tier.geometry and h.payload_len == tier.payload_len
        payload = np.frombuffer(v, dtype=np.uint8, offset=h.header_len)
        assert np.array_equal(payload, want[i].reshape(-1).view(np.uint8))
        assert codec.checksum(payload) == h.payload_checksum


@pytest.mark.parametrize("staged", [False, True], ids=["from-pool", "staged"])
def test_calls_larger_than_the_staging_buffer(
    tier_factory: Any, monkeypatch: pytest.MonkeyPatch, staged: bool
) -> None:
    monkeypatch.setattr(remote_mod, "_MAX_CHUNK_PAGES", 3)  # 11 pages: 4 chunks
    monkeypatch.setattr(remote_mod, "WINDOW_BYTES", 1)  # one command in flight
    pool = make_pool(num_pages=23)
    tier = tier_factory(pool)
    if staged:
        tier._planes = lambda pool: None
    n = 11
    m = meta(n)
    want = pool.data[:, :, 1 : n + 1].copy()
    perm = np.random.default_rng(5).permutation(n).astype(np.int32)
    assert tier.store(pool, perm + 1, rng_i32(n), **{k: [v[i] for i in perm] for k, v in m.items()}).all()
    assert tier.load(pool, rng_i32(n), rng_i32(n, 12), m["keys"]).all()
    assert np.array_equal(pool.data[:, :, 12:].view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_quantized_pages_match_the_host_tier(tier_factory: Any, mode: str, layout: str) -> None:
    pool = make_pool("bf16", layout)
    x = np.random.default_rng(1).standard_normal(pool.data.shape).astype(np.float32)
    pool.data[...] = dtypes.encode(x, "bf16")
    tier = tier_factory(pool, quantize=mode)
    host = HostTier(pool, 8, quantize=mode)
    pages, m = i32(1, 2, 3), meta(3)
    assert tier.store(pool, pages, i32(0, 1, 2), **m).all()
    assert host.store(pool, pages, i32(0, 1, 2), **m).all()
    assert tier.payload_len == host.slot_bytes < pool.page_bytes
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).all()
    assert host.load(pool, i32(0, 1, 2), i32(7, 8, 9), m["keys"]).all()
    assert np.array_equal(pool.data[:, :, 4:7].view(np.uint8), pool.data[:, :, 7:10].view(np.uint8))
    # a quantized tier is another geometry: another key segment
    assert tier_factory(pool).geometry_tag != tier.geometry_tag


def test_store_nx_keeps_the_first_value(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    first = with_client(tier, lambda r: [r.get(tier.redis_key(k)) for k in m["keys"]])
    pool.data[:, :, 1:3] = pool.data[:, :, 5:7]  # other bytes under the same keys
    assert tier.store(pool, i32(1, 2), i32(3, 4), **m).tolist() == [True, True]
    assert with_client(tier, lambda r: [r.get(tier.redis_key(k)) for k in m["keys"]]) == first
    s = tier.stats()
    assert s["stores"] == 4 and s["store_exists"] == 2 and s["store_failed"] == 0


def test_a_store_that_finds_the_value_there_sets_its_ttl(tier_factory: Any) -> None:
    """SET NX PX sets the expiry only where it writes: a store finding another instance's value there
    reported it stored and left its older expiry (the page then vanished before this instance's TTL)."""
    pool = make_pool()
    m = meta(1)
    first = tier_factory(pool, ttl_ms=60_000)
    second = tier_factory(pool, ttl_ms=60_000)
    assert first.store(pool, i32(1), i32(0), **m).all()
    name = first.redis_key(m["keys"][0])
    with_client(first, lambda r: r.pexpire(name, 2_000))  # as if stored 58 s ago
    assert second.store(pool, i32(1), i32(0), **m).all()
    assert second.stats()["store_exists"] == 1
    assert 50_000 < with_client(second, lambda r: r.pttl(name)) <= 60_000


def test_an_acl_user_that_may_not_name_its_connection_is_served(private_redis: Any) -> None:
    """The hand-shake's CLIENT SETNAME only labels the connection: a least-privilege ACL user (no
    +client) could never connect (every call failed, the server went into back-off)."""
    assert private_redis.cli("ACL", "SETUSER", "kv", "on", ">pw", "~acl:*", "+@read", "+@write") == "OK"
    pool = make_pool()
    tier = RedisTier(f"redis://kv:pw@{private_redis.address}", pool, prefix="acl", ttl_ms=60_000)
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    assert tier.exists(m["keys"]) == 3
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).all()
    assert np.array_equal(page_bytes(pool, 4), page_bytes(pool, 1))
    assert tier.stats()["connection_errors"] == 0
    tier.close()
    wrong = RedisTier(f"redis://kv:nope@{private_redis.address}", pool, prefix="acl")
    assert not wrong.store(pool, i32(1), i32(0), **meta(1)).any()  # a refused AUTH still fails
    assert "WRONGPASS" in (wrong.last_error or "")
    wrong.close()


def test_ttl_is_set_by_stores_and_renewed_by_loads(tier_factory: Any) -> None:
    pool = make_pool()
    m = meta(2)
    plain = tier_factory(pool)
    assert plain.store(pool, i32(1), i32(0), **{k: v[:1] for k, v in m.items()}).all()
    assert with_client(plain, lambda r: r.pttl(plain.redis_key(m["keys"][0]))) == -1  # no expiry
    tier = tier_factory(pool, ttl_ms=60_000, prefix=plain.prefix + "-ttl")
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    name = tier.redis_key(m["keys"][1])
    assert 50_000 < with_client(tier, lambda r: r.pttl(name)) <= 60_000
    with_client(tier, lambda r: r.pexpire(name, 5_000))
    assert tier.load(pool, i32(0, 1), i32(3, 4), m["keys"]).all()  # GETEX PX renews
    assert with_client(tier, lambda r: r.pttl(name)) > 50_000


# ------------------------------------------------------------------------------------------ bad values


def test_corrupt_values_miss_are_counted_and_deleted(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    n = 5
    m = meta(n)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    names = [tier.redis_key(k) for k in m["keys"]]

    def corrupt(r: Any) -> None:
        r.set(names[0], b"garbage, not a page")  # short garbage
        v = bytearray(r.get(names[1]))
        v[-1] ^= 0x01  # one payload bit
        r.set(names[1], bytes(v))
        v = bytearray(r.get(names[2]))
        v[40] ^= 0x80  # one header bit (parent key): the header checksum fails
        r.set(names[2], bytes(v))
        r.set(names[3], r.get(names[3])[:-7])  # truncated

    with_client(tier, corrupt)
    before = pool.data.copy()
    ok = tier.load(pool, rng_i32(n), rng_i32(n, 6), m["keys"])
    assert ok.tolist() == [False, False, False, False, True]
    assert np.array_equal(pool.data[:, :, 6:10].view(np.uint8), before[:, :, 6:10].view(np.uint8))
    s = tier.stats()
    assert s["load_failed"] == 4 and s["load_failed_checksum"] == 1 and s["load_failed_corrupt"] == 3
    assert s["checksum_mismatches"] == 2 and s["deleted"] == 4
    assert with_client(tier, lambda r: [r.exists(x) for x in names]) == [0, 0, 0, 0, 1]


def test_a_value_of_another_geometry_misses_and_stays(tier_factory: Any) -> None:
    pool = make_pool("bf16")
    other = make_pool("fp16")  # same shape, other dtype
    tier, foreign = tier_factory(pool), tier_factory(other)
    assert tier.geometry_tag != foreign.geometry_tag
    longer = make_pool("bf16", page_size=2 * P)
    far = tier_factory(longer)
    m = meta(1)
    lm = {**m, "tokens": np.zeros((1, 2 * P), dtype=np.uint32)}
    assert foreign.store(other, i32(1), i32(0), **m).all()
    assert far.store(longer, i32(1), i32(0), **lm).all()
    ours = tier.redis_key(m["keys"][0])
    assert ours != foreign.redis_key(m["keys"][0])  # geometries never share a key ...

    def plant(r: Any, src: RedisTier) -> None:  # ... unless a foreign writer puts a value there
        r.set(ours, r.get(src.redis_key(m["keys"][0])))

    for src in (foreign, far):
        with_client(tier, lambda r, s=src: plant(r, s))
        assert tier.load(pool, i32(0), i32(2), m["keys"]).tolist() == [False]
        assert with_client(tier, lambda r: r.exists(ours)) == 1  # left alone
    s = tier.stats()
    assert s["load_failed_geometry"] == 2 and s["deleted"] == 0


def test_fp8_pages_under_other_scales_miss(tier_factory: Any) -> None:
    pool = make_pool("fp8")
    tier = tier_factory(pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    pool.set_scales(0, 2.0, 2.0)
    assert tier.load(pool, i32(0), i32(2), m["keys"]).tolist() == [False]
    assert tier.stats()["load_failed_scales"] == 1


def test_missing_keys_miss(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    m = meta(3)
    assert tier.store(pool, i32(1), i32(0), **{k: v[:1] for k, v in m.items()}).all()
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).tolist() == [True, False, False]
    s = tier.stats()
    assert s["load_failed_missing"] == 2 and s["load_failed"] == 2


def test_long_namespace_fails_its_row_only(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    room = codec.namespace_room(tier.geometry)
    m = meta(2, namespaces=["x" * (room + 1), "ok"])
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).tolist() == [False, True]
    assert tier.stats()["store_failed_namespace"] == 1


def test_fp8_value_with_a_wrong_key_echo_is_corrupt_whatever_its_scales(tier_factory: Any) -> None:
    """The key echo is checked before the scales: a value of another page under our key is corrupt
    (deleted), even when it was stored under other scales (it used to be 'scales', and kept)."""
    pool, other = make_pool("fp8"), make_pool("fp8", seed=3)
    other.set_scales(0, 2.0, 2.0)
    tier, theirs = tier_factory(pool), tier_factory(other)
    m = meta(2)
    assert theirs.store(other, i32(1), i32(0), **{k: v[1:] for k, v in m.items()}).all()
    ours = tier.redis_key(m["keys"][0])
    with_client(tier, lambda r: r.set(ours, r.get(theirs.redis_key(m["keys"][1]))))
    assert tier.load(pool, i32(0), i32(2), m["keys"][:1]).tolist() == [False]
    s = tier.stats()
    assert (s["load_failed_corrupt"], s["load_failed_scales"], s["deleted"]) == (1, 0, 1)
    assert with_client(tier, lambda r: r.exists(ours)) == 0


def getrange_calls(r: Any) -> int:
    return int(r.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))


def test_fp8_store_over_a_value_of_other_scales_is_not_reported_stored(tier_factory: Any) -> None:
    """NX leaves a value another instance stored under other pool scales, which this pool can never
    load: the store says False (``store_failed_scales``), not "stored". It costs a GETRANGE per row
    in the same pipeline, for fp8/int8 pools only."""
    a, b = make_pool("fp8"), make_pool("fp8", seed=3)
    b.set_scales(0, 2.0, 2.0)
    ta, tb = tier_factory(a), tier_factory(b)
    m = meta(2)
    g0 = with_client(ta, getrange_calls)
    assert ta.store(a, i32(1, 2), i32(0, 1), **m).all()
    first = with_client(ta, lambda r: [r.get(ta.redis_key(k)) for k in m["keys"]])
    assert tb.store(b, i32(1, 2), i32(0, 1), **m).tolist() == [False, False]
    assert with_client(ta, lambda r: [r.get(ta.redis_key(k)) for k in m["keys"]]) == first  # left alone
    s = tb.stats()
    assert (s["stores"], s["store_exists"], s["store_failed"], s["store_failed_scales"]) == (0, 0, 2, 2)
    assert tb.load(b, i32(0, 1), i32(3, 4), m["keys"]).tolist() == [False, False]
    assert tb.exists(m["keys"]) == 2  # exists asks for keys, not for values it could load (documented)
    assert ta.store(a, i32(1, 2), i32(0, 1), **m).all() and ta.stats()["store_exists"] == 2
    assert with_client(ta, getrange_calls) - g0 == 6
    bf16 = make_pool()
    plain = tier_factory(bf16, prefix=ta.prefix + "-bf16")
    assert plain.store(bf16, i32(1, 2), i32(0, 1), **m).all()
    assert with_client(ta, getrange_calls) - g0 == 6  # no GETRANGE for a pool without scales


def test_a_namespace_that_is_not_unicode_is_refused_before_anything_is_sent(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    m = meta(3, namespaces=["ok", None, "bad\ud800"])
    with pytest.raises(InvalidArgumentError, match="namespaces"):
        tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m)
    assert nonzero(tier.stats()) == {}
    assert tier.exists(m["keys"]) == 0  # no row went out


def test_one_page_may_be_stored_under_two_keys(tier_factory: Any) -> None:
    """A public page and a tenant's copy of it in one batch: the page is read twice, both keys load it."""
    pool = make_pool()
    tier = tier_factory(pool)
    m = meta(2)
    assert tier.store(pool, i32(3, 3), i32(0, 1), **m).all()
    assert tier.load(pool, i32(0, 1), i32(5, 6), m["keys"]).all()
    for page in (5, 6):
        np.testing.assert_array_equal(pool.data[:, :, page], pool.data[:, :, 3])


def test_caller_mistakes_raise_before_anything_is_sent(tier_factory: Any) -> None:
    pool = make_pool()
    tier = tier_factory(pool)
    with pytest.raises(InvalidArgumentError):
        tier.store(pool, i32(1, 2), i32(0, 0), **meta(2))  # one slot twice
    with pytest.raises(InvalidArgumentError):
        tier.store(make_pool("fp16"), i32(1), i32(0), **meta(1))
    for runs in (5, None, "keys"):  # builtin TypeErrors before
        with pytest.raises(InvalidDTypeError):
            tier.exists_runs(runs)
    for key in (16, "abcdefghijklmnop", np.zeros(16, dtype=np.int64)):  # 16: sixteen zero bytes before
        with pytest.raises(InvalidDTypeError):
            tier.redis_key(key)
    with pytest.raises(InvalidArgumentError):
        tier.redis_key(b"short")
    assert tier.redis_key(bytes(range(16))) == tier.redis_key(np.arange(16, dtype=np.uint8))
    assert nonzero(tier.stats()) == {}


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1:6379",
        "unix:///tmp/redis.sock",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:6379/x",
        "redis://a:1,b:2",
        "redis+cluster://127.0.0.1:1/3",
        "redis://127.0.0.1:6379?db=2",
        [],
        42,
    ],
)
def test_bad_urls_are_config_errors(url: Any) -> None:
    with pytest.raises(ConfigError):
        RedisTier(url, make_pool())


@pytest.mark.parametrize(
    "kw",
    [
        {"prefix": "a{b}"},
        {"prefix": "a b"},
        {"prefix": ""},
        {"timeout_s": 0},
        {"timeout_s": float("nan")},
        {"timeout_s": 1e10},  # accepted, then every call raised OverflowError (time_t)
        {"timeout_s": 10**400},
        {"ttl_ms": 0},
        {"ttl_ms": 2**63},  # accepted, then every store failed ("value is not an integer")
        {"down_after": 0},
        {"max_lookup_keys": 0},
        {"backoff_s": -1},
        {"num_slots": 0},
        {"quantize": "int3"},
        {"bandwidth_gbps": 0},
    ],
)
def test_bad_settings_are_config_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RedisTier("redis://127.0.0.1:1", make_pool(), **kw)


def test_needs_no_redis_package() -> None:
    """The tier speaks RESP itself: kvcore.tiers imports, and a RedisTier is built, without redis-py."""
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from kvcore.pool import KVPool; from kvcore.tiers import RedisTier\n"
        "pool = KVPool(num_layers=1, num_pages=2, num_kv_heads=1, head_dim=8, page_size=4)\n"
        "t = RedisTier('redis://127.0.0.1:1', pool, timeout_s=0.1)\n"
        "import numpy as np; print(t.exists(np.zeros((1, 16), np.uint8)), t.stats()['connection_errors'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]


def test_urls_parse() -> None:
    pool = make_pool()
    t = RedisTier("redis://user:p%40ss@127.0.0.1:7001/3", pool)
    assert not t.cluster and t._startup == [("127.0.0.1", 7001)]
    assert (t._auth.username, t._auth.password, t._auth.db) == ("user", "p@ss", 3)
    t = RedisTier("redis://:secret@localhost", pool, prefix="team:model:")
    assert t._startup == [("localhost", 6379)] and t._auth.password == "secret" and t._auth.username is None
    assert t.prefix == "team:model"
    t = RedisTier("redis+cluster://127.0.0.1:7001,127.0.0.1:7002,[::1]:7003", pool)
    assert t.cluster and t._startup == [("127.0.0.1", 7001), ("127.0.0.1", 7002), ("::1", 7003)]
    assert RedisTier(["127.0.0.1:7001", "127.0.0.1:7002"], pool).cluster


# ------------------------------------------------------------------------------------------ exists


def _all_keys_but_the_fourth(tier_factory: Any) -> tuple[Any, np.ndarray]:
    """A tier asked for at most 6 keys at once, holding 7 of 8 pages (the fourth missing): (tier,
    the 8 keys)."""
    pool = make_pool()
    tier = tier_factory(pool, max_lookup_keys=6)
    m = meta(8)
    held = [0, 1, 2, 4, 5, 6, 7]
    assert tier.store(
        pool, rng_i32(7, 1), rng_i32(7), **{k: [v[i] for i in held] for k, v in m.items()}
    ).all()
    return tier, m["keys"]


def test_exists_counts_leading_keys_in_one_round_trip(
    tier_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, keys = _all_keys_but_the_fourth(tier_factory)
    assert tier.exists(keys[:0]) == 0
    assert tier.exists(keys[4:]) == 4 == tier.exists(keys[4:8])
    sends: list[int] = []
    orig = remote_mod._Conn.send
    monkeypatch.setattr(
        remote_mod._Conn, "send", lambda self, b, dl: (sends.append(len(b)), orig(self, b, dl))
    )

    def exists_calls(r: Any) -> int:
        return int(r.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))

    c0 = with_client(tier, exists_calls)
    assert tier.exists(keys) == 3
    assert len(sends) == 1  # one send of max_lookup_keys commands, then the replies: one round trip
    assert with_client(tier, exists_calls) - c0 == 6
    assert tier.exists(keys[::-1][:3]) == 3
    s = tier.stats()
    assert (
        s["lookups"] == 5 and s["lookup_keys"] == 0 + 4 + 4 + 6 + 3 and s["lookup_hit_keys"] == 4 + 4 + 3 + 3
    )
    assert s["lookup_failed"] == 0


def test_exists_runs_asks_several_chains_in_one_round_trip(
    tier_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mover.lookup asks for a prompt's public chain and its namespace's chain at once: each run's
    answer is what exists gives it alone (max_lookup_keys per run), in one round trip."""
    tier, keys = _all_keys_but_the_fourth(tier_factory)
    runs = [keys, keys[4:], keys[:0], keys[3:], keys[:2]]
    want = [tier.exists(k) for k in runs]
    assert want == [3, 4, 0, 0, 2]
    sends: list[int] = []
    orig = remote_mod._Conn.send
    monkeypatch.setattr(
        remote_mod._Conn, "send", lambda self, b, dl: (sends.append(len(b)), orig(self, b, dl))
    )
    assert tier.exists_runs(runs) == want
    assert len(sends) == 1  # every run's commands in one send, then the replies
    assert tier.exists_runs([]) == []
    for bad in (keys[:, :8], keys.astype(np.float32)):  # refused as exists refuses them
        with pytest.raises((InvalidDTypeError, InvalidArgumentError)) as alone:
            tier.exists(bad)
        with pytest.raises(alone.type):
            tier.exists_runs([keys, bad])


def test_exists_is_not_blocked_by_a_bulk_transfer(tier_factory: Any) -> None:
    pool = make_pool(num_pages=65, num_layers=8, head_dim=64)  # 64 x 32 KiB pages
    tier = tier_factory(pool)
    n = 64
    m = meta(n)
    assert tier.store(pool, rng_i32(1, 1), rng_i32(1), **{k: v[:1] for k, v in m.items()}).all()
    hold = threading.Event()
    orig = tier._codec.pages_to_rows

    def slow(*a: Any) -> None:  # a bulk store that sits inside its I/O lock for a while
        hold.set()
        time.sleep(0.5)
        orig(*a)

    tier._planes = lambda pool: None  # stage the pages (as for a device pool) ...
    tier._codec.pages_to_rows = slow  # type: ignore[method-assign]  # ... slowly
    th = threading.Thread(target=tier.store, args=(pool, rng_i32(n, 1), rng_i32(n)), kwargs=m)
    th.start()
    assert hold.wait(5)
    found, dt = timed(tier.exists, m["keys"])
    th.join()
    assert found == 1 and dt < 0.25


# ------------------------------------------------------------------------------------------ faults


def test_killed_server_misses_fast_then_restart_is_picked_up(private_redis: Any) -> None:
    pool = make_pool()
    tier = RedisTier(private_redis.url, pool, timeout_s=TIMEOUT, down_after=3, backoff_s=0.5)
    m = meta(4)
    assert tier.store(pool, rng_i32(4, 1), rng_i32(4), **m).all()
    private_redis.kill()
    for fn, args in (
        (tier.store, (pool, rng_i32(4, 1), rng_i32(4))),
        (tier.load, (pool, rng_i32(4), rng_i32(4, 5), m["keys"])),
    ):
        ok, dt = timed(fn, *args, **(m if fn == tier.store else {}))
        assert ok.tolist() == [False] * 4 and dt < TIMEOUT + SLACK
    assert tier.exists(m["keys"]) == 0
    s = tier.stats()
    assert s["store_failed_connection"] == 4 and s["load_failed_connection"] == 4
    assert s["down_events"] == 1 and s["nodes_down"] == 1  # 3 failed calls
    ok, dt = timed(tier.store, pool, rng_i32(4, 1), rng_i32(4), **m)
    assert not ok.any() and dt < 0.01 and tier.stats()["store_failed_down"] == 4
    assert tier.stats()["skipped_down"] == 1
    private_redis.restart()  # empty: no persistence
    time.sleep(0.5)  # the back-off
    assert tier.load(pool, rng_i32(4), rng_i32(4, 5), m["keys"]).tolist() == [False] * 4  # missing now
    assert tier.store(pool, rng_i32(4, 1), rng_i32(4), **m).all()
    assert tier.load(pool, rng_i32(4), rng_i32(4, 5), m["keys"]).all()
    s = tier.stats()
    assert s["load_failed_missing"] == 4 and s["reconnects"] >= 1 and s["nodes_down"] == 0
    tier.close()


def test_a_server_restarted_between_calls_costs_no_miss(private_redis: Any) -> None:
    pool = make_pool()
    tier = RedisTier(private_redis.url, pool, timeout_s=TIMEOUT)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    assert tier.exists(m["keys"]) == 2
    private_redis.restart()
    # the kept connections are dead: each channel notices, reconnects and retries once
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    assert tier.exists(m["keys"]) == 2
    s = tier.stats()
    assert s["store_failed"] == 0 and s["reconnects"] == 2 and s["connection_errors"] == 0
    tier.close()


def test_paused_server_times_out_goes_down_and_comes_back(private_redis: Any) -> None:
    pool = make_pool()
    tier = RedisTier(private_redis.url, pool, timeout_s=TIMEOUT, down_after=2, backoff_s=0.6)
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    private_redis.cli("CLIENT", "PAUSE", "1500")
    t0 = time.monotonic()
    ok, dt = timed(tier.load, pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"])
    assert ok.tolist() == [False] * 3 and TIMEOUT * 0.9 < dt < TIMEOUT + SLACK
    found, dt = timed(tier.exists, m["keys"])  # the lookup channel times out on its own
    assert found == 0 and dt < TIMEOUT + SLACK
    s = tier.stats()
    assert s["load_failed_timeout"] == 3 and s["timeouts"] == 2 and s["down_events"] == 1
    assert s["lookup_failed"] == 1
    # down: every call returns at once, without touching the network
    for _ in range(3):
        ok, dt = timed(tier.store, pool, i32(1, 2, 3), i32(0, 1, 2), **m)
        assert not ok.any() and dt < 0.01
        found, dt = timed(tier.exists, m["keys"])
        assert found == 0 and dt < 0.01
    assert tier.stats()["skipped_down"] == 6
    while time.monotonic() < t0 + 1.6:  # the pause ends
        time.sleep(0.05)
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).all()
    assert tier.exists(m["keys"]) == 3 and tier.stats()["nodes_down"] == 0
    tier.close()


def test_slow_store_returns_within_the_timeout(private_redis: Any) -> None:
    pool = make_pool()
    tier = RedisTier(private_redis.url, pool, timeout_s=TIMEOUT)
    m = meta(4)
    assert tier.store(pool, i32(1), i32(0), **{k: v[:1] for k, v in m.items()}).all()  # connected
    private_redis.cli("CLIENT", "PAUSE", "2000")
    ok, dt = timed(tier.store, pool, rng_i32(4, 1), rng_i32(4), **m)
    assert ok.tolist() == [False] * 4 and dt < TIMEOUT + SLACK
    assert tier.stats()["store_failed_timeout"] == 4
    tier.close()


def test_a_full_server_refuses_stores_counted_as_oom(private_redis: Any) -> None:
    private_redis.stop()
    private_redis.start(extra_args=["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"])
    pool = make_pool(num_pages=41, num_layers=8, head_dim=64)  # 40 x 32 KiB pages > 1 MiB
    tier = RedisTier(private_redis.url, pool, timeout_s=1.0)
    n = 40
    ok = tier.store(pool, rng_i32(n, 1), rng_i32(n), **meta(n))
    s = tier.stats()
    assert not ok.all() and s["store_failed_oom"] == n - ok.sum() and s["store_failed"] == n - ok.sum()
    assert s["down_events"] == 0 and s["nodes_down"] == 0  # a full server is up: no back-off
    assert int(private_redis.cli("DBSIZE")) == ok.sum()
    tier.close()


# ------------------------------------------------------------------------------------------ interrupts


def interrupt_once(monkeypatch: pytest.MonkeyPatch, method: str, nth: int = 1) -> None:
    """The ``nth`` call of ``_Conn.<method>`` from now raises KeyboardInterrupt (what a signal handler
    raises in the middle of a socket wait: the bytes in flight stay where they are); the others run."""
    real = getattr(remote_mod._Conn, method)
    calls = [0]

    def interrupted(self: Any, *a: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(remote_mod._Conn, method, interrupted)


def keys_held(tier: RedisTier, keys: np.ndarray) -> int:
    return int(with_client(tier, lambda r: sum(r.exists(tier.redis_key(k)) for k in keys)))


@pytest.mark.parametrize(
    ("method", "nth"), [("_recv_into", 1), ("line", 3)], ids=["first-read", "third-reply"]
)
def test_a_load_interrupted_mid_pipeline_leaves_no_stale_replies(
    tier_factory: Any, monkeypatch: pytest.MonkeyPatch, method: str, nth: int
) -> None:
    """KeyboardInterrupt while a load reads its replies goes on to the caller, and the connection, on
    which the rest of the interrupted pipeline's replies are still to come, is closed first: the next
    call reconnects. (Kept open, the next load read those replies as its own: every row of valid pages
    looked corrupt, and was DELeted from the server other instances share.)"""
    n = 20
    pool = make_pool(num_pages=3 * n + 1)
    tier = tier_factory(pool)
    m = meta(2 * n)
    assert tier.store(pool, rng_i32(2 * n, 1), rng_i32(2 * n), **m).all()  # connected
    a, b = m["keys"][:n], m["keys"][n:]
    want = pool.data[:, :, n + 1 : 2 * n + 1].copy()  # b's pages
    interrupt_once(monkeypatch, method, nth)
    with pytest.raises(KeyboardInterrupt):
        tier.load(pool, rng_i32(n), rng_i32(n, 2 * n + 1), a)
    assert tier._nodes[0].bulk.sock is None  # closed before the exception went on
    monkeypatch.undo()
    pool.data[:, :, 2 * n + 1 :] = 0
    assert tier.load(pool, rng_i32(n, n), rng_i32(n, 2 * n + 1), b).all()
    assert np.array_equal(pool.data[:, :, 2 * n + 1 :].view(np.uint8), want.view(np.uint8))
    s = tier.stats()
    assert s["load_failed"] == s["deleted"] == s["checksum_mismatches"] == 0 and s["reconnects"] == 1
    assert keys_held(tier, m["keys"]) == 2 * n  # nothing deleted
    assert tier.load(pool, rng_i32(n), rng_i32(n, 2 * n + 1), a).all()


def test_an_interrupted_exists_leaves_no_stale_replies(
    tier_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a load: after KeyboardInterrupt out of exists(), absent keys are not answered present by
    the interrupted call's replies."""
    n = 20
    pool = make_pool(num_pages=n + 1)
    tier = tier_factory(pool)
    m = meta(2 * n)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **{k: v[:n] for k, v in m.items()}).all()
    a, b = m["keys"][:n], m["keys"][n:]
    assert tier.exists(a) == n  # the lookup connection is made
    interrupt_once(monkeypatch, "_recv_into")
    with pytest.raises(KeyboardInterrupt):
        tier.exists(a)
    assert tier._nodes[0].lookup.sock is None
    monkeypatch.undo()
    assert tier.exists(b) == 0  # not the 20 ":1" the interrupted call was sent
    assert tier.exists(a) == n
    assert tier.stats()["lookup_failed"] == 0


def test_an_interrupted_store_leaves_no_stale_replies(
    private_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a load: after KeyboardInterrupt out of a store, a store the server refuses (-OOM) is not
    reported stored on the strength of the interrupted call's ``+OK``s."""
    n = 20
    pool = make_pool(num_pages=2 * n + 1)
    tier = RedisTier(private_redis.url, pool, timeout_s=1.0)
    m = meta(3 * n)

    def rows(lo: int) -> dict[str, Any]:
        return {k: v[lo : lo + n] for k, v in m.items()}

    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **rows(0)).all()  # connected
    interrupt_once(monkeypatch, "_recv_into")
    with pytest.raises(KeyboardInterrupt):
        tier.store(pool, rng_i32(n, n + 1), rng_i32(n, n), **rows(n))
    assert tier._nodes[0].bulk.sock is None
    monkeypatch.undo()
    private_redis.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
    private_redis.cli("CONFIG", "SET", "maxmemory", "1")  # full: every SET is refused
    ok = tier.store(pool, rng_i32(n, 1), rng_i32(n, 2 * n), **rows(2 * n))
    assert not ok.any()
    s = tier.stats()
    assert s["store_failed_oom"] == s["store_failed"] == n and s["reconnects"] == 1
    assert keys_held(tier, m["keys"][2 * n :]) == 0
    tier.close()


def test_an_interrupted_cluster_exists_leaves_no_node_with_stale_replies(
    redis_cluster_nodes: list[str], redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exists() asks every node at once: KeyboardInterrupt in one node's exchange stops the others'
    (whose replies may not all be read), and every node's lookup connection is closed."""
    n = 30  # the keys spread over the three nodes (all on one with probability 3^-29)
    pool = make_pool(num_pages=n + 1)
    tier = RedisTier(redis_cluster_nodes, pool, prefix=redis_prefix)
    m = meta(2 * n)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **{k: v[:n] for k, v in m.items()}).all()
    a, b = m["keys"][:n], m["keys"][n:]
    assert tier.exists(a) == n  # every node's lookup connection is made
    assert len(tier._nodes) == 3 and all(nd.lookup.sock is not None for nd in tier._nodes)
    interrupt_once(monkeypatch, "gather")  # where a lookup of several nodes takes its replies in
    with pytest.raises(KeyboardInterrupt):
        tier.exists(a)
    assert all(nd.lookup.sock is None for nd in tier._nodes)
    monkeypatch.undo()
    assert [tier.exists(key[None]) for key in b] == [0] * n  # one per key: each node is asked
    assert tier.exists(a) == n
    tier.close()


def interrupt_in(monkeypatch: pytest.MonkeyPatch, main: bool) -> None:
    """The first ``_Conn._recv_into`` in the main thread (``main``), else in any other (a worker of a
    call's exchanges with several nodes), raises KeyboardInterrupt; the others run."""
    real = remote_mod._Conn._recv_into
    done = [False]

    def interrupted(self: Any, *a: Any) -> Any:
        if not done[0] and (threading.current_thread() is threading.main_thread()) == main:
            done[0] = True
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(remote_mod._Conn, "_recv_into", interrupted)


def test_a_cluster_load_interrupted_in_a_worker_leaves_no_stale_replies(
    redis_cluster_nodes: list[str], redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load's exchanges with several nodes run at once, in worker threads but the first: an
    exception in a worker (KeyboardInterrupt from a signal handler's equivalent) goes on to the caller
    once every exchange has ended, and every bulk connection is closed first: the next load reads no
    reply of the interrupted one as its own (valid pages would look corrupt and be deleted)."""
    n = 30
    pool = make_pool(num_pages=2 * n + 1)
    tier = RedisTier(redis_cluster_nodes, pool, prefix=redis_prefix)
    m = meta(n)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()  # every node's bulk connection made
    want = pool.data[:, :, 1 : n + 1].copy()
    assert len(tier._nodes) == 3 and all(nd.bulk.sock is not None for nd in tier._nodes)
    interrupt_in(monkeypatch, main=False)
    with pytest.raises(KeyboardInterrupt):
        tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"])
    assert all(nd.bulk.sock is None for nd in tier._nodes)
    monkeypatch.undo()
    pool.data[:, :, n + 1 :] = 0
    assert tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]).all()
    assert np.array_equal(pool.data[:, :, n + 1 :].view(np.uint8), want.view(np.uint8))
    s = tier.stats()
    assert s["load_failed"] == s["deleted"] == s["checksum_mismatches"] == 0
    assert tier.exists(m["keys"]) == n  # nothing deleted
    tier.close()


class _Alarm(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_random_interrupts_of_cluster_calls_leave_no_job_running_and_no_hang(
    private_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler's exception at random points of cluster stores and loads (the caller's thread
    hands each node's exchange to a worker): once the call has raised, none of its exchanges runs
    (with ``concurrent.futures`` an interrupt between two submits left a job running beside the next
    call: a load raised AssertionError, lost pages, deleted a valid value), and the tier never hangs
    (an interrupt inside the executor's own locking left a lock held: every later call blocked for
    good). Each interrupted call is followed by an uninterrupted load that must return every page."""
    import faulthandler

    n = 63
    pool = make_pool(num_pages=2 * n + 1)
    m = meta(n)
    tier = RedisTier(private_cluster.addresses, pool, timeout_s=TIMEOUT, down_after=10**6)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    want = pool.data[:, :, 1 : n + 1].copy()
    late: list[int] = []
    real = RedisTier._exchange

    def traced(self: RedisTier, node: int, *a: Any) -> Any:
        if not self._io_lock.locked():  # a call's exchange after the call ended
            late.append(node)
        return real(self, node, *a)

    monkeypatch.setattr(RedisTier, "_exchange", traced)

    armed = [False]

    def alarm(signum: int, frame: Any) -> None:
        if armed[0]:  # (one that comes once the call's round is over does nothing)
            armed[0] = False
            raise _Alarm

    old = signal.signal(signal.SIGALRM, alarm)
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails the run, loudly
    rnd = np.random.default_rng(5)
    try:
        for i in range(150):
            fresh = meta(n, seed=1000 + i)
            armed[0] = True
            try:
                try:  # armed inside: a signal that lands as setitimer returns is caught below too
                    signal.setitimer(signal.ITIMER_REAL, float(rnd.uniform(0.00005, 0.003)))
                    if i % 2:
                        tier.store(pool, rng_i32(n, 1), rng_i32(n), **fresh)
                    else:
                        tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"])
                finally:  # (the signal may land here too, before it is disarmed: caught below)
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Alarm:
                pass
            time.sleep(0.002)  # a job left running would run now
            assert late == []
            pool.data[:, :, n + 1 :] = 0
            assert tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]).all()
            assert np.array_equal(pool.data[:, :, n + 1 :].view(np.uint8), want.view(np.uint8))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()
    assert tier.stats()["deleted"] == 0
    tier.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_cluster_tiers_dropped_without_close_leave_no_worker_thread(private_cluster: Any) -> None:
    """Each tier's worker threads end with it (a first version of the tier's own worker threads held
    the tier through their last job: 30 tiers dropped left 60 threads; a guard, as
    ``concurrent.futures`` passed it too)."""
    import gc

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    n = 16
    pool = make_pool(num_pages=2 * n + 1)
    m = meta(n)
    before = threads()
    for _ in range(10):
        tier = RedisTier(private_cluster.addresses, pool, timeout_s=TIMEOUT)
        assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
        assert tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]).all()
        del tier
    gc.collect()
    deadline = time.monotonic() + 5
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads() <= before


def test_an_interrupt_cuts_the_exchanges_with_stalled_nodes_short(
    private_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt in the caller's thread while a worker waits on a stalled node: the call ends
    within one socket wait (the worker's next wait fails at once), not after the whole exchange, and
    leaves no connection open whose replies nobody read."""
    addrs = private_cluster.addresses
    n = 30
    pool = make_pool(num_pages=4 * n + 1)
    tier = RedisTier(addrs, pool, timeout_s=TIMEOUT, down_after=100)
    m = meta(2 * n)
    assert tier.store(pool, rng_i32(2 * n, 1), rng_i32(2 * n), **m).all()
    want = pool.data[:, :, 1 : 2 * n + 1].copy()
    last = max(tier._node_index.values())  # not the first node: its exchange is the caller thread's
    node = next(nd for nd in private_cluster.nodes if nd.address == tier._nodes[last].name)
    interrupt_in(monkeypatch, main=True)
    with stalled([node]):
        t = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            tier.load(pool, rng_i32(n), rng_i32(n, 2 * n + 1), m["keys"][:n])
        assert time.perf_counter() - t < TIMEOUT + SLACK
        assert all(nd.bulk.sock is None for nd in tier._nodes)
    monkeypatch.undo()
    pool.data[:, :, 2 * n + 1 :] = 0
    assert tier.load(pool, rng_i32(2 * n), rng_i32(2 * n, 2 * n + 1), m["keys"]).all()
    assert np.array_equal(pool.data[:, :, 2 * n + 1 :].view(np.uint8), want.view(np.uint8))
    assert tier.stats()["deleted"] == 0
    tier.close()


# ------------------------------------------------------------------------------------------ cluster


@pytest.fixture
def private_cluster_5() -> Iterator[RedisClusterServers]:
    """A fresh 5-master cluster of this test's own."""
    require_redis_server()
    with RedisClusterServers(5) as cluster:
        yield cluster


def cluster_node_of(tier: RedisTier, key: np.ndarray, addresses: list[str]) -> int:
    """Index into ``addresses`` of the node that owns the key's slot (redis-py's own map)."""
    from redis.cluster import RedisCluster

    host, port = addresses[0].split(":")
    with RedisCluster(host=host, port=int(port)) as rc:
        node = rc.get_node_from_key(tier.redis_key(key))
        assert rc.keyslot(tier.redis_key(key)) == remote_mod._key_slot(tier.redis_key(key))
        return addresses.index(f"{node.host}:{node.port}")


def test_cluster_round_trip(redis_cluster_nodes: list[str], redis_prefix: str) -> None:
    n = 24
    pool = make_pool(num_pages=2 * n + 1)
    m = meta(n)
    want = pool.data[:, :, 1 : n + 1].copy()
    for url in (redis_cluster_nodes, "redis+cluster://" + redis_cluster_nodes[0]):
        tier = RedisTier(url, pool, prefix=redis_prefix + ("a" if isinstance(url, list) else "b"))
        owners = {cluster_node_of(tier, k, redis_cluster_nodes) for k in m["keys"]}
        assert owners == {0, 1, 2}  # the keys spread over every node
        assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
        pool.data[:, :, n + 1 :] = 0
        assert tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]).all()
        assert np.array_equal(pool.data[:, :, n + 1 :].view(np.uint8), want.view(np.uint8))
        assert tier.exists(m["keys"]) == n
        s = tier.stats()
        assert s["nodes"] == 3 and s["topology_refreshes"] == 1 and s["moved"] == 0
        tier.close()


def test_cluster_moved_replies_are_followed(redis_cluster_nodes: list[str], redis_prefix: str) -> None:
    n = 30  # some keys are not on node 0 (all 30 are with probability 3^-30)
    pool = make_pool(num_pages=n + 1)
    tier = RedisTier(redis_cluster_nodes, pool, prefix=redis_prefix)
    m = meta(n)
    assert tier.exists(m["keys"]) == 0  # reads the slot map
    tier._slots[:] = 0  # as if every slot had moved to node 0 since
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()  # MOVED: retried at the right node
    s = tier.stats()
    assert 0 < s["moved"] < n and s["store_failed"] == 0
    assert tier.load(pool, rng_i32(n), rng_i32(n, 1)[::-1].copy(), m["keys"][::-1].copy()).all()
    assert tier.stats()["topology_refreshes"] == 2  # the whole map was read again
    owner = np.array([cluster_node_of(tier, k, redis_cluster_nodes) for k in m["keys"]])
    node0 = tier._node_index[redis_cluster_nodes[0]]
    tier._slots[:] = node0
    assert not (owner == 0).all()
    moved = tier.stats()["moved"]
    assert tier.exists(m["keys"]) == n  # a key MOVED elsewhere is asked again where it went
    assert tier.stats()["moved"] - moved == int((owner != 0).sum())
    assert tier.exists(m["keys"]) == n and tier.stats()["moved"] - moved == int((owner != 0).sum())
    tier.close()


def test_cluster_node_down_fails_only_its_keys(private_cluster: Any) -> None:
    addrs = private_cluster.addresses
    for node in private_cluster.nodes:  # a cache cluster should keep serving the slots it still has
        node.cli("CONFIG", "SET", "cluster-require-full-coverage", "no")
    pool = make_pool(num_pages=40)
    tier = RedisTier(addrs, pool, timeout_s=TIMEOUT, down_after=2, backoff_s=30)
    n = 18
    m = meta(n)
    owner = np.array([cluster_node_of(tier, k, addrs) for k in m["keys"]])
    assert set(owner.tolist()) == {0, 1, 2}
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    private_cluster.stop_node(1)
    want = owner != 1
    for _ in range(2):
        ok, dt = timed(tier.load, pool, rng_i32(n), rng_i32(n, 20), m["keys"])
        assert ok.tolist() == want.tolist() and dt < TIMEOUT + SLACK
    s = tier.stats()
    assert s["load_failed_connection"] == 2 * (~want).sum() and s["down_events"] == 1
    assert s["nodes_down"] == 1
    ok, dt = timed(tier.store, pool, rng_i32(n, 1), rng_i32(n), **m)  # node 1 skipped, the others work
    assert ok.tolist() == want.tolist() and dt < TIMEOUT
    assert tier.stats()["store_failed_down"] == (~want).sum()
    lead = int(np.argmin(want)) if not want.all() else n
    assert tier.exists(m["keys"]) == lead  # the first key on the dead node ends the prefix
    tier.close()


@contextlib.contextmanager
def stalled(nodes: list[Any]) -> Iterator[None]:
    """The servers ``nodes`` stopped (SIGSTOP: a GC-like pause; the kernel still accepts connections
    and buffers what is sent), and continued at the end."""
    for nd in nodes:
        os.kill(nd.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for nd in nodes:
            os.kill(nd.pid, signal.SIGCONT)


def test_stalled_masters_cost_one_timeout_however_many(private_cluster_5: Any) -> None:
    """With masters stalled, a call waits on them at once, not one after another: about timeout_s
    (x 2 or 3 with the map re-read first), not one timeout_s more per stalled master (5 masters,
    timeout_s 0.2: an exists() on new connections took 1.0 s, a load 1.4 s), and the rows of the
    master that answers succeed, whichever node it is in the map (its replies used to be read last,
    once the deadline had passed: missed)."""
    cluster = private_cluster_5
    addrs = cluster.addresses
    for node in cluster.nodes:  # so that the one left does not leave the cluster for the stalled ones
        node.cli("CONFIG", "SET", "cluster-node-timeout", "60000")
    n = 64
    pool = make_pool(num_pages=2 * n + 1)
    tier = RedisTier(addrs, pool, timeout_s=TIMEOUT, down_after=100, prefix="stall")
    m = meta(n)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    assert tier.exists(m["keys"]) == n  # every lookup connection made, and kept
    want = pool.data[:, :, 1 : n + 1].copy()
    index = [tier._node_index[a] for a in addrs]
    owner = np.array(
        [index.index(int(tier._slots[remote_mod._key_slot(tier.redis_key(k))])) for k in m["keys"]]
    )
    assert set(owner.tolist()) == set(range(5))
    live = owner == 4
    runs = [m["keys"][live], np.stack([m["keys"][np.argmax(owner == i)] for i in range(4)])]  # every node
    with stalled(cluster.nodes[:4]):  # four of five
        found, dt = timed(tier.exists_runs, runs)  # on the kept connections
        assert found == [live.sum(), 0] and dt < TIMEOUT + SLACK
        found, dt = timed(tier.exists_runs, runs)  # the map re-read; new connections, hand-shakes at once
        assert found == [live.sum(), 0] and dt < 3 * TIMEOUT + SLACK
        pool.data[:, :, n + 1 :] = 0
        ok, dt = timed(tier.load, pool, rng_i32(n), rng_i32(n, n + 1), m["keys"])
        assert ok.tolist() == live.tolist() and dt < 3 * TIMEOUT + SLACK
        got, exp = pool.data[:, :, n + 1 :][:, :, live], want[:, :, live]
        assert np.array_equal(got.view(np.uint8), exp.view(np.uint8))
        s = tier.stats()
        assert s["load_failed_timeout"] == (~live).sum() and s["lookup_failed"] == 2
        assert s["timeouts"] >= 3 * 4  # each call timed out on every stalled node
        with stalled(cluster.nodes[4:]):  # all five
            for call in (
                lambda: tier.exists(m["keys"]),
                lambda: tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]),
                lambda: tier.store(pool, rng_i32(n, 1), rng_i32(n), **m),
            ):
                out, dt = timed(call)
                assert not np.any(out) and dt < 3 * TIMEOUT + SLACK
    s = tier.stats()
    assert s["store_failed_timeout"] == n and s["load_failed_connection"] == 0
    cluster.wait_state("ok")  # the nodes, stalled longer than their node timeout, see each other again
    assert tier.load(pool, rng_i32(n), rng_i32(n, n + 1), m["keys"]).all()
    assert np.array_equal(pool.data[:, :, n + 1 :].view(np.uint8), want.view(np.uint8))
    assert tier.exists(m["keys"]) == n
    tier.close()


# ------------------------------------------------------------------------------------------ hostile servers


def _read_command(f: Any) -> list[bytes] | None:
    line = f.readline()
    if not line.startswith(b"*"):
        return None
    out = []
    for _ in range(int(line[1:])):
        n = int(f.readline()[1:])
        out.append(f.read(n + 2)[:-2])
    return out


class FakeServer:
    """A RESP server on 127.0.0.1 (an ephemeral port) that answers each command with
    ``reply(args)`` (bytes; None closes the connection), CLIENT SETNAME with +OK. It counts the
    connections it accepted and those still open. ``trickle_s``: send replies one byte at a time, this
    long apart."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.sock = socket.create_server((HOST, 0))
        self.port = int(self.sock.getsockname()[1])
        self.address = f"{HOST}:{self.port}"
        self.accepted = 0
        self.open = 0
        self.commands: list[list[bytes]] = []
        self.trickle_s = 0.0
        self.client_reply = b"+OK\r\n"  # the reply to CLIENT SETNAME
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
                self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            with c.makefile("rb") as f:
                while (args := _read_command(f)) is not None:
                    with self._lock:
                        self.commands.append(args)
                    out = self.client_reply if args[0].upper() == b"CLIENT" else self.reply(args)
                    if out is None:
                        break
                    if self.trickle_s and args[0].upper() != b"CLIENT":
                        for k in range(len(out)):
                            c.sendall(out[k : k + 1])
                            time.sleep(self.trickle_s)
                    else:
                        c.sendall(out)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self.open -= 1
            c.close()

    def wait_open(self, n: int, timeout_s: float = 5.0) -> bool:
        """Until at most ``n`` connections are open; whether that happened within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.open > n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.open <= n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        self.sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)


HOST = "127.0.0.1"


@pytest.fixture
def fake_server() -> Iterator[Any]:
    """``make(reply) -> FakeServer``, every one closed at teardown."""
    made: list[FakeServer] = []

    def make(reply: Any) -> FakeServer:
        made.append(FakeServer(reply))
        return made[-1]

    yield make
    for f in made:
        f.close()


def slots_reply(table: list[tuple[int, int, int]]) -> bytes:
    """A CLUSTER SLOTS reply: ``(first slot, last slot, port)`` ranges, every master on 127.0.0.1."""
    out = b"*%d\r\n" % len(table)
    for lo, hi, port in table:
        out += b"*3\r\n:%d\r\n:%d\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n" % (lo, hi, port)
    return out


@pytest.mark.parametrize("reply", [b":2\r\n", b":-1\r\n", b":10\r\n"])
def test_an_exists_reply_that_is_no_count_of_one_key_is_a_miss(fake_server: Any, reply: bytes) -> None:
    """EXISTS of one key answers :0 or :1; any other integer counted as a hit (a key the server never
    confirmed, then a load that misses). It is now a protocol error: the node's keys are absent and its
    connection closed."""
    server = fake_server(lambda args: reply if args[0].upper() == b"EXISTS" else b"+OK\r\n")
    tier = RedisTier(f"redis://{server.address}", make_pool(), timeout_s=TIMEOUT)
    m = meta(3)
    assert tier.exists(m["keys"]) == 0
    assert tier.exists(m["keys"][:1]) == 0  # the one-key path too
    assert "EXISTS: unexpected reply" in (tier.last_error or "")
    server.reply = lambda args: b":1\r\n" if args[0].upper() == b"EXISTS" else b"+OK\r\n"
    assert tier.exists(m["keys"]) == 3  # a new connection, read again
    tier.close()


@pytest.mark.parametrize(
    ("client_reply", "usable"),
    [
        (b"-NOPERM this user has no permissions to run the 'client|setname' command\r\n", True),
        (b"-ERR unknown command 'CLIENT', with args beginning with: 'SETNAME'\r\n", True),
        (b"-NOAUTH Authentication required.\r\n", False),  # a password needed, none in the URL
        (b"-LOADING Redis is loading the dataset in memory\r\n", False),
    ],
)
def test_only_a_refusal_to_name_the_connection_is_ignored(
    fake_server: Any, client_reply: bytes, usable: bool
) -> None:
    """CLIENT SETNAME, the hand-shake's last command, may be refused for want of the right (an ACL
    user without +client, CLIENT renamed away): the connection is used all the same. NOAUTH or
    LOADING there means the server serves nothing: the connection fails, counted, toward back-off."""
    server = fake_server(lambda args: b"+OK\r\n" if args[0].upper() == b"SET" else b":1\r\n")
    server.client_reply = client_reply
    pool = make_pool()
    tier = RedisTier(f"redis://{server.address}", pool, timeout_s=TIMEOUT, down_after=2)
    m = meta(2)
    ok = tier.store(pool, i32(1, 2), i32(0, 1), **m)
    s = tier.stats()
    if usable:
        assert ok.all() and tier.exists(m["keys"]) == 2 and s["connection_errors"] == 0
    else:
        assert not ok.any() and s["store_failed_connection"] == 2 and s["connection_errors"] >= 1
        assert client_reply[1:8].decode() in (tier.last_error or "")
        assert tier.exists(m["keys"]) == 0 and tier.stats()["lookup_failed"] == 1
    tier.close()


def test_a_plain_server_never_follows_moved(fake_server: Any) -> None:
    """A redis:// server is not a cluster: a MOVED from it fails the row (counted) and adds no node
    (each MOVED to a new address used to add one, with its 1 MiB buffer, for good)."""
    elsewhere = fake_server(lambda args: b"+OK\r\n")
    ports = iter(range(40_000, 50_000))
    server = fake_server(lambda args: b"-MOVED 1 127.0.0.1:%d\r\n" % next(ports))
    pool = make_pool(num_pages=41)
    tier = RedisTier(f"redis://{server.address}", pool, timeout_s=TIMEOUT)
    n = 8
    m = meta(n)
    moved = f"-MOVED 1 {elsewhere.address}\r\n".encode()
    server.reply = lambda args: moved if args[0] == b"SET" else b"-MOVED 1 127.0.0.1:%d\r\n" % next(ports)
    for _ in range(3):
        assert not tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).any()
        assert not tier.load(pool, rng_i32(n), rng_i32(n, 20), m["keys"]).any()
        assert tier.exists(m["keys"]) == 0
    s = tier.stats()
    assert (s["store_failed_other"], s["load_failed_other"], s["moved"]) == (3 * n, 3 * n, 3 * (3 * n))
    assert s["nodes"] == 1 and len(tier._nodes) == 1 and elsewhere.accepted == 0
    tier.close()


def test_a_node_trickling_its_lookup_reply_does_not_hold_up_the_others(fake_server: Any) -> None:
    """exists_runs reads every node's replies in one thread: a node sending one byte per 0.9 x
    timeout_s was read waiting until the call's deadline, and the healthy node's reply, waiting in
    the kernel all along, was then cut off: its keys counted absent, its connection closed."""
    state: dict[str, Any] = {}

    def answer(args: list[bytes]) -> bytes:
        if args[0].upper() == b"CLUSTER":
            return slots_reply(state["table"])
        return b":1\r\n" if args[0].upper() == b"EXISTS" else b"+OK\r\n"

    a, b = fake_server(answer), fake_server(answer)
    state["table"] = [(0, 8191, a.port), (8192, 16383, b.port)]
    timeout = 0.3
    tier = RedisTier([a.address], make_pool(), timeout_s=timeout, down_after=100)
    cand = np.random.default_rng(1).integers(0, 256, size=(400, 16), dtype=np.uint8)
    slot = np.array([remote_mod._key_slot(tier.redis_key(k)) for k in cand])
    ka, kb = cand[slot < 8192][:1], cand[slot >= 8192][:1]
    assert tier.exists(ka) == 1 and tier.exists(kb) == 1  # both connected, kept
    b.trickle_s = 0.9 * timeout
    for _ in range(3):
        found, dt = timed(tier.exists_runs, [ka, kb])
        assert found == [1, 0] and dt < 2 * timeout + SLACK
        b.trickle_s = 0.9 * timeout  # a new connection: trickling again
    s = tier.stats()
    assert s["timeouts"] == 3 and s["lookup_failed"] == 3
    b.trickle_s = 0.0
    assert tier.exists_runs([ka, kb]) == [1, 1]
    tier.close()


def test_cluster_nodes_are_the_masters_of_the_last_table(fake_server: Any) -> None:
    """The nodes known are the last CLUSTER SLOTS table's masters: a MOVED to an address off the
    table fails its row and connects nowhere; a node that leaves the table is closed and forgotten."""
    state: dict[str, Any] = {}

    def reply(port: int) -> Any:
        def answer(args: list[bytes]) -> bytes:
            cmd = args[0].upper()
            if cmd == b"CLUSTER":
                return slots_reply(state["table"])
            if cmd == b"SET":
                return state["set"](port, args)
            return b":0\r\n" if cmd == b"EXISTS" else b"$-1\r\n"

        return answer

    def moved(args: list[bytes], to: FakeServer) -> bytes:
        return f"-MOVED {remote_mod._key_slot(args[1])} {to.address}\r\n".encode()

    a = fake_server(None)
    b = fake_server(None)
    stranger = fake_server(lambda args: b"+OK\r\n")
    a.reply, b.reply = reply(a.port), reply(b.port)
    pool = make_pool(num_pages=41)
    tier = RedisTier([a.address], pool, timeout_s=TIMEOUT, down_after=100)
    n = 8
    m = meta(n)
    slot_of = [remote_mod._key_slot(tier.redis_key(k)) for k in m["keys"]]
    assert min(slot_of) < 8192 <= max(slot_of)  # some keys on each half

    # 1. one master; it answers MOVED to an address the table does not list
    state["table"] = [(0, 16383, a.port)]
    state["set"] = lambda port, args: moved(args, stranger)
    assert not tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).any()
    s = tier.stats()
    assert (s["nodes"], s["moved"], s["store_failed_other"], stranger.accepted) == (1, n, n, 0)

    # 2. the table grows to two masters: both serve their halves
    state["table"] = [(0, 8191, a.port), (8192, 16383, b.port)]
    state["set"] = lambda port, args: b"+OK\r\n"
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    assert tier.exists(m["keys"]) == 0
    assert tier.stats()["nodes"] == 2 and b.open == 2  # b's bulk and lookup connections

    # 3. b hands its slots back (MOVED to a, which the table lists: followed at once), then leaves
    state["table"] = [(0, 16383, a.port)]
    state["set"] = lambda port, args: b"+OK\r\n" if port == a.port else moved(args, a)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    with tier._lookup_lock:  # as if an exists() were in flight: its connection to b waits for it
        assert tier.load(pool, rng_i32(n), rng_i32(n, 20), m["keys"]).tolist() == [False] * n  # new map
        assert b.wait_open(1) and b.open == 1  # the load's own (bulk) connection to b is closed at once
    s = tier.stats()
    assert (s["nodes"], s["topology_refreshes"], stranger.accepted) == (1, 3, 0)
    assert len(tier._nodes) == 1 and tier._nodes[0].name == a.address
    assert tier.exists(m["keys"]) == 0
    assert b.wait_open(0) and b.accepted == 2  # ... the lookup one at the end of the next exists()
    tier.close()


def test_ask_is_followed_once_to_a_node_of_the_table_only(fake_server: Any) -> None:
    """``-ASK slot host:port`` (a slot being migrated): the row is sent once more, ``ASKING`` first, to
    the node named if the table lists it, and never further (an ASK back is not followed: no loop);
    one to an address off the table connects nowhere. The slot map is never changed nor re-read for it
    (unlike MOVED). Real migrations: test_remote_ask.py."""
    state: dict[int, Any] = {}

    def served(cmd: bytes, slot: int) -> bytes:  # every key is there, but no value is a page
        return b"+OK\r\n" if cmd == b"SET" else b":1\r\n" if cmd == b"EXISTS" else b"$-1\r\n"

    def answer(port: int) -> Any:
        def reply(args: list[bytes]) -> bytes:
            cmd = args[0].upper()
            if cmd == b"CLUSTER":
                return slots_reply([(0, 8191, a.port), (8192, 16383, b.port)])
            if cmd == b"ASKING":
                return b"+OK\r\n"
            slot = remote_mod._key_slot(args[1])
            out: bytes = (served if port == b.port and slot >= 8192 else state[port])(cmd, slot)  # b's own
            return out

        return reply

    def ask(slot: int, to: FakeServer) -> bytes:
        return f"-ASK {slot} {to.address}\r\n".encode()

    a = fake_server(None)
    b = fake_server(None)
    stranger = fake_server(lambda args: b"+OK\r\n")
    a.reply, b.reply = answer(a.port), answer(b.port)
    pool = make_pool(num_pages=41)
    tier = RedisTier([a.address], pool, timeout_s=TIMEOUT, down_after=100)
    n = 12
    m = meta(n)
    on_a = np.array([remote_mod._key_slot(tier.redis_key(k)) < 8192 for k in m["keys"]])
    k = int(on_a.sum())
    assert 0 < k < n

    def commands(server: FakeServer, name: bytes) -> int:
        return sum(1 for c in server.commands if c[0].upper() == name)

    # 1. a, migrating its slots, sends every key it is asked for to an address off the table
    state[a.port] = lambda cmd, slot: ask(slot, stranger)
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).tolist() == (~on_a).tolist()
    s = tier.stats()
    assert (s["asks"], s["store_failed_other"], s["moved"], stranger.accepted) == (k, k, 0, 0)
    slots_before = tier._slots.copy()

    # 2. a asks b, which asks a back: followed once, then the row fails
    state[a.port] = lambda cmd, slot: ask(slot, b)
    state[b.port] = lambda cmd, slot: ask(slot, a)
    sets_a, sets_b, asking_b = commands(a, b"SET"), commands(b, b"SET"), commands(b, b"ASKING")
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).tolist() == (~on_a).tolist()
    assert commands(a, b"SET") - sets_a == k  # once each, no loop
    assert (commands(b, b"SET") - sets_b, commands(b, b"ASKING") - asking_b) == (n, k)
    s = tier.stats()
    assert (s["asks"], s["store_failed_other"]) == (k + 2 * k, 2 * k)

    # 3. b, importing, serves them after ASKING: stored, loaded (nothing there: missing) and found
    state[b.port] = served
    del b.commands[:]
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()
    for i, c in enumerate(b.commands):  # each key b got from an ASK came right after an ASKING
        if c[0] == b"SET" and remote_mod._key_slot(c[1]) < 8192:
            assert b.commands[i - 1] == [b"ASKING"]
    assert not tier.load(pool, rng_i32(n), rng_i32(n, 20), m["keys"]).any()
    assert tier.exists(m["keys"]) == n
    s = tier.stats()
    assert s["load_failed_missing"] == n and s["load_failed_other"] == 0 and s["lookup_failed"] == 0
    assert (s["moved"], s["topology_refreshes"], stranger.accepted) == (0, 1, 0)
    assert commands(a, b"CLUSTER") == 1 and np.array_equal(tier._slots, slots_before)  # never re-read
    tier.close()


def test_a_plain_server_never_follows_ask(fake_server: Any) -> None:
    elsewhere = fake_server(lambda args: b"+OK\r\n")
    server = fake_server(lambda args: f"-ASK 1 {elsewhere.address}\r\n".encode())
    pool = make_pool(num_pages=41)
    tier = RedisTier(f"redis://{server.address}", pool, timeout_s=TIMEOUT)
    n = 4
    m = meta(n)
    assert not tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).any()
    assert not tier.load(pool, rng_i32(n), rng_i32(n, 20), m["keys"]).any()
    assert tier.exists(m["keys"]) == 0
    s = tier.stats()
    assert (s["store_failed_other"], s["load_failed_other"], s["asks"]) == (n, n, 3 * n)
    assert elsewhere.accepted == 0 and s["nodes"] == 1
    assert not any(c[0].upper() == b"ASKING" for c in server.commands)
    tier.close()


def test_a_table_of_too_many_masters_is_refused(fake_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_mod, "MAX_NODES", 2)
    server = fake_server(None)
    ports = [server.port, 1, 2]  # the two others are never connected to
    table = [(i * 5000, min(16383, i * 5000 + 4999), p) for i, p in enumerate(ports)] + [(15000, 16383, 1)]
    server.reply = lambda args: slots_reply(table) if args[0].upper() == b"CLUSTER" else b"$-1\r\n"
    pool = make_pool()
    tier = RedisTier([server.address], pool, timeout_s=TIMEOUT)
    m = meta(2)
    assert tier.load(pool, i32(0, 1), i32(2, 3), m["keys"]).tolist() == [False, False]
    s = tier.stats()
    assert (s["nodes"], s["topology_refreshes"], s["connection_errors"]) == (0, 0, 1)
    assert "more than 2 masters" in tier.last_error
    tier.close()


def test_a_table_that_leaves_slots_unserved_is_read_again(fake_server: Any) -> None:
    """A CLUSTER SLOTS table covering half the slots: rows of the other half fail at once, counted
    as other errors (no connection was tried: connection_errors stays 0), and the map is re-read by
    the next call (it used to be kept for good), backing off after down_after incomplete reads."""
    state = {"full": False}

    def answer(args: list[bytes]) -> bytes:
        if args[0].upper() == b"CLUSTER":
            full = [(8192, 16383, server.port)] if state["full"] else []
            return slots_reply([(0, 8191, server.port), *full])
        return b"+OK\r\n" if args[0] == b"SET" else b":1\r\n"

    server = fake_server(answer)
    pool = make_pool(num_pages=41)
    tier = RedisTier([server.address], pool, timeout_s=TIMEOUT, down_after=3, backoff_s=60)
    n = 16
    m = meta(n)
    served = np.array([remote_mod._key_slot(tier.redis_key(k)) < 8192 for k in m["keys"]])
    unserved = int(n - served.sum())
    assert 0 < unserved < n

    def refreshes() -> int:
        return sum(1 for c in server.commands if c[0].upper() == b"CLUSTER")

    def counts() -> tuple[int, ...]:
        s = tier.stats()
        names = ("store_failed_other", "store_failed_down", "store_failed_connection", "connection_errors")
        return tuple(s[k] for k in names)

    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).tolist() == served.tolist()
    assert counts() == (unserved, 0, 0, 0) and refreshes() == 1
    state["full"] = True
    assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).all()  # re-read: the whole table now
    assert (refreshes(), tier.stats()["topology_refreshes"]) == (2, 2)
    assert tier.exists(m["keys"]) == n and refreshes() == 2  # a whole map is not re-read

    # an incomplete table again (as after a failover): re-read by each call until down_after reads
    # in a row were incomplete; then its unserved rows fail as down, without a re-read, until backoff_s
    state["full"] = False
    tier._topology_stale = True
    for _ in range(4):
        assert tier.store(pool, rng_i32(n, 1), rng_i32(n), **m).tolist() == served.tolist()
    assert refreshes() == 5
    assert counts() == (3 * unserved, 2 * unserved, 0, 0) and tier.stats()["down_events"] == 1
    assert tier.exists(m["keys"][served]) == served.sum() and tier.exists(m["keys"][~served]) == 0
    assert refreshes() == 5 and tier.stats()["lookup_failed"] == 1
    tier.close()


def _held_buffer_bytes(tier: RedisTier) -> int:
    """Bytes of read buffers the tier's connections (every node's, both channels) hold now."""
    nodes = [*tier._nodes, *tier._to_close[True], *tier._to_close[False]]
    return sum(len(c._buf) for nd in nodes for c in (nd._bulk, nd._lookup) if c is not None)


def test_unreachable_masters_hold_no_read_buffers(fake_server: Any) -> None:
    """A table of many masters that refuse connections: their rows fail as connections, and the
    tier holds the read buffers of its one reachable node only (a 1 MiB + 64 KiB buffer per master
    used to be allocated at its first try and kept: 1000 masters, +1 GiB)."""
    num_masters = 200
    refused = [socket.socket() for _ in range(num_masters - 1)]
    try:
        for sk in refused:
            sk.bind((HOST, 0))  # bound, never listening: connect() is refused
        ports = [int(sk.getsockname()[1]) for sk in refused]
        step = 16384 // num_masters
        server = fake_server(None)
        table = [(0, step - 1, server.port)] + [
            (step * i, step * i + step - 1 if i < num_masters - 1 else 16383, ports[i - 1])
            for i in range(1, num_masters)
        ]
        server.reply = lambda args: (
            slots_reply(table)
            if args[0].upper() == b"CLUSTER"
            else (b"+OK\r\n" if args[0] == b"SET" else b":0\r\n" if args[0] == b"EXISTS" else b"$-1\r\n")
        )
        n = 1000
        pool = make_pool(num_pages=n + 1)
        tier = RedisTier([server.address], pool, timeout_s=TIMEOUT, down_after=100)
        m = meta(n)
        ok = tier.store(pool, rng_i32(n, 1), rng_i32(n), **m)
        tier.load(pool, rng_i32(n), rng_i32(n, 1), m["keys"])
        tier.exists(m["keys"])
        s = tier.stats()
        assert s["nodes"] == num_masters and 0 < ok.sum() < n
        assert s["store_failed_connection"] == n - ok.sum() and s["connection_errors"] > num_masters
        bound = remote_mod._READ_BUF + remote_mod._LINE_BUF  # the reachable node's two channels
        assert _held_buffer_bytes(tier) == bound
        assert tier._buffer_bytes() == bound
        tier.close()
        assert tier._buffer_bytes() == 0
    finally:
        for sk in refused:
            sk.close()


BAD_TABLES = {
    "huge bulk length": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$1099511627776\r\n",
    "huge array length": b"*1099511627776\r\n",
    "host is an integer": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n:7\r\n:7000\r\n",
    "host with a space": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0 0.1\r\n:7000\r\n",
    "negative bulk length": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$-7\r\n:7000\r\n",
    "port out of range": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:99999\r\n",
    "negative port": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:-1\r\n",
    "port as a string": b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n$%d\r\n%d\r\n",
    "range as strings": b"*1\r\n*3\r\n$1\r\n0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
    "range reversed": b"*1\r\n*3\r\n:9\r\n:3\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
    "entry not a list": b"*1\r\n:5\r\n",
    "master too short": b"*1\r\n*3\r\n:0\r\n:16383\r\n*1\r\n$9\r\n127.0.0.1\r\n",
    "nested too deep": b"*1\r\n" * 20 + b":1\r\n",
    "not RESP": b"hello\r\n",
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_hostile_cluster_slots_replies_fail_rows_and_never_raise(fake_server: Any, case: str) -> None:
    """Server problems never raise out of store/load/exists, a malformed topology included: the
    refresh fails like a lost connection (rows False, counted), and no length a server claims is
    allocated before it is checked (a MemoryError, an AttributeError used to come out)."""
    server = fake_server(None)
    raw = BAD_TABLES[case]
    if b"%d" in raw:
        port = server.port
        raw = raw % ((len(str(port)), port) if raw.count(b"%d") == 2 else (port,))
    server.reply = lambda args: raw if args[0].upper() == b"CLUSTER" else b"+OK\r\n"
    pool = make_pool()
    tier = RedisTier(f"redis+cluster://{server.address}", pool, timeout_s=TIMEOUT, down_after=100)
    m = meta(2)
    for _ in range(2):
        assert tier.load(pool, i32(0, 1), i32(2, 3), m["keys"]).tolist() == [False, False]
        assert tier.exists(m["keys"]) == 0
        assert tier.store(pool, i32(1, 2), i32(0, 1), **m).tolist() == [False, False]
    s = tier.stats()
    assert (s["nodes"], s["topology_refreshes"], s["connection_errors"]) == (0, 0, 6)
    assert (s["load_failed_connection"], s["store_failed_connection"], s["lookup_failed"]) == (4, 4, 2)
    assert not any(c[0].upper() == b"SET" for c in server.commands)
    tier.close()


# ------------------------------------------------------------------------------------------ with the manager


PS = P  # tokens per page of the manager: the pool's page size


def _manager(tier: RedisTier, fingerprint: bytes = b"model") -> Any:
    from kvcore import KVCacheManager

    return KVCacheManager(12, PS, fingerprint=fingerprint, lower_tiers=[tier], store_policy="all")


MANAGED_SLOTS = 64  # the manager's index of the remote tier in these tests


def test_tenants_values_carry_their_namespace(tier_factory: Any) -> None:
    import redis

    prompt = np.arange(3 * PS + 1, dtype=np.int32)  # 3 full pages
    pool = make_pool(num_pages=12)
    tier = tier_factory(pool, num_slots=MANAGED_SLOTS)
    cache = _manager(tier)
    mover = Mover(cache, pool, [tier])
    cache.add_sequence(1, prompt, "tenant-a")
    cache.add_sequence(2, prompt, "tenant-b")
    res = mover.run()
    assert res.stored == 6 and res.store_failed == 0
    host, port = tier._startup[0]
    with redis.Redis(host=host, port=port) as r:
        names = sorted(r.scan_iter(match=f"{tier.prefix}:*", count=1000))
        assert len(names) == 6
        seen: dict[str | None, list[bytes]] = {}
        for name in names:
            h = codec.parse_header(r.get(name))
            assert name == tier.redis_key(h.key)
            seen.setdefault(h.namespace, []).append(h.key)
    for ns in ("tenant-a", "tenant-b"):
        keys = cache.prompt_keys(prompt, ns)
        assert sorted(seen[ns]) == sorted(k.tobytes() for k in keys)
    assert set(seen) == {"tenant-a", "tenant-b"}
    text = mover.metrics_text()  # the tier's counters reach the Prometheus text
    assert metric_value(text, "kvcore_tier_storage_stores_total", tier="remote") == 6, text


def test_two_instances_share_pages_through_lookup(tier_factory: Any) -> None:
    prompt = np.arange(3 * PS + 1, dtype=np.int32)
    pool_a, pool_b = make_pool(num_pages=12, seed=1), make_pool(num_pages=12, seed=2)
    ta, tb = tier_factory(pool_a, num_slots=MANAGED_SLOTS), tier_factory(pool_b, num_slots=MANAGED_SLOTS)
    a, b = _manager(ta), _manager(tb)
    ma, mb = Mover(a, pool_a, [ta]), Mover(b, pool_b, [tb])
    a.add_sequence(1, prompt, "t")
    pages_a = a.seq_pages(1)[:3]
    want = pool_a.data[:, :, pages_a].copy()
    assert ma.run().stored == 3
    assert mb.lookup(prompt, "u") == 0  # another tenant finds nothing
    assert mb.lookup(prompt, "t") == 3
    assert b.add_sequence(2, prompt, "t") == 3 * PS
    mb.run(stores=False)
    assert b.is_ready(2)
    assert np.array_equal(pool_b.data[:, :, b.seq_pages(2)[:3]].view(np.uint8), want.view(np.uint8))
    assert tb.stats()["loads"] == 3 and tb.stats()["lookup_hit_keys"] == 3


# ------------------------------------------------------------------------------------------ the RESP reader


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([0, 1, 5, 4096, 65535, 65536, 70000, (1 << 20) + 3, 5 << 19]), max_size=6),
    cuts=st.lists(st.integers(1, 300_000), min_size=1, max_size=20),
    skip=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_reader_parses_replies_cut_anywhere(sizes: list[int], cuts: list[int], skip: list[bool]) -> None:
    """Bulk values (some larger than the read buffer), nils, status lines, integers and nested
    arrays, written in arbitrary fragments, read back exactly: against the bytes written."""
    rng = np.random.default_rng(len(sizes) * 7 + sum(cuts))
    values = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in sizes]
    stream = b"".join(b"$%d\r\n%b\r\n+OK\r\n$-1\r\n:42\r\n" % (len(v), v) for v in values)
    stream += b"*2\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n$-1\r\n"
    a, b = socket.socketpair()
    conn = remote_mod._Conn("x", 0, remote_mod._Auth(None, None, 0), remote_mod._READ_BUF)
    conn.attach(a)
    dl = remote_mod._Deadline(5.0)

    def write() -> None:
        off, i = 0, 0
        while off < len(stream):
            k = max(cuts[i % len(cuts)], len(stream) // 400)  # at most ~400 fragments
            b.sendall(stream[off : off + k])
            off, i = off + k, i + 1

    th = threading.Thread(target=write)
    th.start()
    try:
        for i, v in enumerate(values):
            assert conn.line(dl) == b"$%d" % len(v)
            if skip[i]:
                conn.skip(len(v) + 2, dl)
            else:
                out = bytearray(len(v))
                head = min(len(v), 4096)  # header and payload, as a load reads them
                conn.read_into(memoryview(out)[:head], dl)
                conn.read_into(memoryview(out)[head:], dl)
                assert bytes(out) == v
                conn.skip(2, dl)
            assert [conn.line(dl) for _ in range(3)] == [b"+OK", b"$-1", b":42"]
        assert conn.value(dl) == [[0, 16383, [b"127.0.0.1", 7000]], None]
    finally:
        th.join()
        a.close()
        b.close()


def test_reader_times_out_and_sees_a_closed_connection() -> None:
    a, b = socket.socketpair()
    conn = remote_mod._Conn("x", 0, remote_mod._Auth(None, None, 0))
    conn.attach(a)
    b.sendall(b"+OK\r\n+PART")
    assert conn.line(remote_mod._Deadline(0.1)) == b"+OK"
    t = time.perf_counter()
    with pytest.raises(TimeoutError):
        conn.line(remote_mod._Deadline(0.1))  # "+PART" never ends
    assert 0.09 < time.perf_counter() - t < 0.1 + SLACK
    b.close()
    with pytest.raises(ConnectionResetError):
        conn.line(remote_mod._Deadline(0.1))
    a.close()


def _instance(tier_factory: Any, num_pages: int = 40) -> tuple[Any, Mover, RedisTier]:
    from kvcore import KVCacheManager

    pool = make_pool(num_pages=num_pages)
    remote = tier_factory(pool, num_slots=64, timeout_s=2.0)
    cache = KVCacheManager(num_pages, P, fingerprint=b"heal", lower_tiers=[remote], store_policy="all")
    return cache, Mover(cache, pool, [remote]), remote


def _serve(inst: tuple[Any, Mover, RedisTier], sid: int, prompt: list[int], ns: str | None) -> dict[str, int]:
    """Admit (after a lookup), load, 'compute' and store, free: the prompt's hit by medium."""
    cache, mover, _ = inst
    mover.lookup(prompt, ns)
    assert cache.add_sequence(sid, prompt, ns) is not None
    mover.run(stores=False)
    hit = dict(cache.hit_tokens(sid))
    mover.run()
    cache.free_sequence(sid)
    cache._check_invariants()
    return hit


def test_a_prefix_whose_loads_failed_is_loaded_again_once_the_tier_holds_it_again(
    tier_factory: Any,
) -> None:
    """A flushed (restarted) server: instance A's loads of its tenant prefix fail and its slots go bad;
    the first pages' slot has children (two prompts branch below it), so it was never dropped, and A
    never indexed, loaded or stored that prefix again, though instance B stored it anew and a fresh
    instance hit it. A lookup that finds the keys again makes those slots good."""
    a, b = _instance(tier_factory), _instance(tier_factory)
    system = list(range(100, 100 + 2 * P))
    t1 = [*system, *range(1, 1 + P), 9]
    t2 = [*system, *range(50, 50 + P), 9]
    assert _serve(a, 1, t1, "a") == {"hbm": 0, "remote": 0}
    _serve(a, 2, t2, "a")
    with_client(a[2], lambda r: r.delete(*r.keys(a[2].redis_key(a[0].prompt_keys(t1)[0])[:-32] + b"*")))
    a[0].evict(1000)
    assert _serve(a, 3, t1, "a") == {"hbm": 0, "remote": 0}  # the loads fail: the hit is cut
    assert a[0].tier_stats()["remote"]["num_slots_bad"] > 0
    _serve(b, 1, t1, "a")
    _serve(b, 2, t2, "a")  # B stores every page anew
    width = (len(t2) - 1) // P * P  # whole pages of the prompt less its last token
    for sid, prompt in ((4, t2), (5, t1)):
        a[0].evict(1000)
        assert _serve(a, sid, prompt, "a") == {"hbm": 0, "remote": width}


def test_a_value_of_another_type_under_a_page_key_is_deleted_and_the_prefix_heals(tier_factory: Any) -> None:
    """A third client's list under a page key: every load failed WRONGTYPE, the value was never
    deleted (only corrupt strings were), the recompute's SET NX found it and counted it stored, and
    no instance ever hit that prefix again. The load now deletes it, as a corrupt value."""
    a, b = _instance(tier_factory), _instance(tier_factory)
    prompt = [*range(1, 1 + 3 * P), 9]
    _serve(a, 1, prompt, None)
    name = a[2].redis_key(a[0].prompt_keys(prompt)[0])
    with_client(a[2], lambda r: (r.delete(name), r.rpush(name, b"not", b"a", b"page")))
    assert _serve(b, 1, prompt, None) == {"hbm": 0, "remote": 0}  # its first page fails: no hit
    assert b[2].stats()["deleted"] == 1
    assert with_client(a[2], lambda r: r.type(name)) == b"string"  # B's recompute stored it again
    c = _instance(tier_factory)
    assert _serve(c, 1, prompt, None) == {"hbm": 0, "remote": 3 * P}
