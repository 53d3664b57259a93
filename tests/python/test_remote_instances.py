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
