"""Two instances, one cache: two managers in two processes, each with its own pool, share a Redis tier.

Instance A computes prompts and stores them; instance B, asked for the same prompt in the same namespace,
finds them through ``Mover.lookup`` (one existence round trip), loads them, and its K/V bytes equal A's;
in another namespace B finds nothing. Then every key on the server is enumerated and each value's header
names the tenant whose prompt it holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

import kvcore
from kvcore.tiers import codec

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import kvcore
    from kvcore.pool import KVPool
    from kvcore.tiers import Mover, RedisTier

    role, url, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    PS, FP = 4, b"tiny/fp16/p4"
    prompts = {"A": list(range(1, 22)), "B": list(range(1, 22))}  # the same tokens for both tenants
    pool = KVPool(num_layers=2, num_pages=33, num_kv_heads=2, head_dim=8, page_size=PS, kv_dtype="fp16")
    remote = RedisTier(url, pool, num_slots=1024, prefix=prefix, timeout_s=2.0)
    cache = kvcore.KVCacheManager(33, PS, fingerprint=FP, lower_tiers=[remote], store_policy="all")
    mover = Mover(cache, pool, [remote])

    def pattern(key):
        rng = np.random.default_rng(int.from_bytes(bytes(key[:8]), "little"))
        return rng.standard_normal(pool.data[:, :, 0].shape).astype(np.float16)

    out = {}
    if role == "writer":
        for i, (ns, prompt) in enumerate(prompts.items()):
            cache.add_sequence(i, prompt, ns)
            keys = cache.prompt_keys(prompt, ns)
            for j, page in enumerate(cache.seq_pages(i)[: len(keys)]):
                pool.data[:, :, page] = pattern(keys[j])  # the step computes the pages
            mover.run()  # after the step: the stores
            out[ns] = cache.tier_stats()["remote"]["num_stored_pages"]
    else:
        ns = sys.argv[4]
        out["found"] = mover.lookup(prompts["A"], ns)
        out["hit"] = cache.add_sequence(0, prompts["A"], ns)
        mover.run(stores=False)
        out["ready"] = cache.is_ready(0)
        out["by_tier"] = cache.hit_tokens(0)
        keys = cache.prompt_keys(prompts["A"], ns)
        pages = cache.seq_pages(0)
        hit_pages = sum(out["by_tier"].values()) // PS
        out["equal"] = all(
            np.array_equal(pool.data[:, :, pages[j]], pattern(keys[j])) for j in range(hit_pages)
        )
    print(json.dumps(out))
    """
)


def run(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_two_processes_share_prefixes_through_redis_and_tenants_stay_apart(
    redis_url: str, redis_prefix: str
) -> None:
    prefix = redis_prefix.rstrip(":")
    wrote = run("writer", redis_url, prefix)
    assert wrote["A"] == 5 and wrote["B"] == 10  # 5 pages per tenant
    got = run("reader", redis_url, prefix, "A")
    assert got["found"] == 5 and got["hit"] == 20 and got["ready"]
    assert got["by_tier"] == {"hbm": 0, "remote": 20}
    assert got["equal"]  # B's K/V bytes are A's
    other = run("reader", redis_url, prefix, "C")  # a tenant that never stored anything
    assert other["found"] == 0 and other["hit"] == 0
    # Every key on the server belongs to the tenant whose prompt it holds.
    import redis

    r = redis.Redis.from_url(redis_url)
    names = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    assert len(names) == 10
    expected = {
        ns: {
            bytes(k)
            for k in kvcore.page_keys(
                np.arange(1, 22, dtype=np.int32), 4, fingerprint=b"tiny/fp16/p4", namespace=ns
            )
        }
        for ns in ("A", "B")
    }
    for name in names:
        header = codec.parse_header(r.get(name))
        assert header.namespace in ("A", "B")
        assert header.key in expected[header.namespace], name


def test_a_public_system_prompt_and_a_tenants_pages_after_it_are_found_by_another_instance(
    redis_url: str, redis_prefix: str
) -> None:
    """Instance A stores a public ("*") system prompt and tenant a's page after it in the shared tier;
    instance B, asked for tenant a's prompt, finds all three pages (the public prefix under its public
    keys, then a's page keyed from it: before, it found none) and loads A's bytes; the public pages
    join B's HBM as public pages, keyed as A keys them, so tenant b shares them."""
    from kvcore.pool import KVPool
    from kvcore.tiers import Mover, RedisTier

    def instance() -> tuple[kvcore.KVCacheManager, KVPool, Mover]:
        pool = KVPool(num_layers=1, num_pages=33, num_kv_heads=1, head_dim=8, page_size=4, kv_dtype="fp16")
        remote = RedisTier(redis_url, pool, num_slots=64, prefix=redis_prefix.rstrip(":"), timeout_s=2.0)
        cache = kvcore.KVCacheManager(33, 4, fingerprint=b"fp", lower_tiers=[remote], store_policy="all")
        return cache, pool, Mover(cache, pool, [remote])

    (a, pool_a, mover_a), (b, pool_b, mover_b) = instance(), instance()
    system, own = list(range(8)), [50, 51, 52, 53]
    assert a.add_sequence(1, [*system, 99], "*") == 0
    assert a.add_sequence(2, [*system, *own, 54], "a") == 8
    rng = np.random.default_rng(0)
    for p in a.seq_pages(2)[:3].tolist():
        pool_a.data[:, :, p] = rng.standard_normal(pool_a.data[:, :, p].shape)
    written = {i: pool_a.data[:, :, p].copy() for i, p in enumerate(a.seq_pages(2)[:3].tolist())}
    mover_a.run()
    assert a.tier_stats()["remote"]["num_stored_pages"] == 3  # once each
    prompt = [*system, *own, 54]
    assert b.peek_hit_tokens(prompt, "a") == {"hbm": 0, "remote": 0}
    assert mover_b.lookup(prompt, "a") == 3
    assert b.add_sequence(7, prompt, "a") == 12
    mover_b.run(stores=False)
    assert b.is_ready(7) and b.hit_tokens(7) == {"hbm": 0, "remote": 12}
    for i, p in enumerate(b.seq_pages(7)[:3].tolist()):
        np.testing.assert_array_equal(pool_b.data[:, :, p], written[i])
    assert (b.page_keys(7) == a.page_keys(2)).all()
    assert mover_b.lookup([*system, *own, 54], "b") == 0  # the public pages are indexed already
    # The loaded public pages are public in B's HBM too: tenant b shares them, and never sees a's page.
    assert b.peek_hit_tokens(prompt, "b") == {"hbm": 8, "remote": 0}


def test_a_lookup_never_indexes_a_key_the_shared_tier_was_not_asked_for(
    redis_url: str, redis_prefix: str
) -> None:
    """A's index holds tenant a's own copy of a system prompt and the public copy; B stored a's page
    after the public copy. A's lookup asked for a's page keyed over the public copy, then indexed the
    answer along a's own copy, a key Redis never held: the admission's load failed and the slot went
    bad (review). Now nothing is indexed there, and no load fails."""
    from kvcore.pool import KVPool
    from kvcore.tiers import Mover, RedisTier

    def instance() -> tuple[kvcore.KVCacheManager, Mover]:
        pool = KVPool(num_layers=1, num_pages=16, num_kv_heads=1, head_dim=8, page_size=4, kv_dtype="fp16")
        remote = RedisTier(redis_url, pool, num_slots=64, prefix=redis_prefix.rstrip(":"), timeout_s=2.0)
        cache = kvcore.KVCacheManager(16, 4, fingerprint=b"fp", lower_tiers=[remote], store_policy="all")
        return cache, Mover(cache, pool, [remote])

    (a, mover_a), (b, mover_b) = instance(), instance()
    system, own = list(range(100, 108)), [7] * 4
    assert a.add_sequence(1, [*system, 1], "a") == 0  # a's own copy of the system prompt
    mover_a.run()
    a.free_sequence(1)
    a.evict(100)
    assert b.add_sequence(1, [*system, 1], "*") == 0
    assert b.add_sequence(2, [*system, *own, 2], "a") == 8  # a's page after the public copy
    mover_b.run()
    assert mover_a.lookup([*system, 1], "*") == 2  # A indexes the public copy too
    prompt = [*system, *own, 3]
    mover_a.lookup(prompt, "a")
    hit = a.add_sequence(5, prompt, "a")
    assert hit is not None
    result = mover_a.run(stores=False)
    assert result.load_failed == 0 and a.tier_stats()["remote"]["num_slots_bad"] == 0
    assert a.hit_tokens(5)["remote"] == hit
    a._check_invariants()
