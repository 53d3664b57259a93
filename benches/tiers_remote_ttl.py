"""RedisTier stores with a TTL (``ttl_ms``): ``SET NX PX``, then ``PEXPIRE`` (a value NX finds there
gets this store's TTL too), against another ``remote.py`` (the version before PEXPIRE), alternated
in one run:

    redis-server --port 7371 --bind 127.0.0.1 --save '' --daemonize yes
    git show 027a8d6:python/kvcore/tiers/remote.py > /tmp/remote_old.py
    PYTHONPATH=python .venv/bin/python benches/tiers_remote_ttl.py --baseline /tmp/remote_old.py

Each round stores 256 new 256 KiB pages, then the same pages again (every SET finds its value there),
then empties the server (FLUSHDB: give a Redis of the bench's own), so memory stays flat.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys
import time
import urllib.parse
from typing import Any

import numpy as np

from kvcore.pool import KVPool
from kvcore.tiers import RedisTier

N = 256


def rounds(cls: Any, url: str, pool: KVPool, prefix: str, num: int, rng: np.random.Generator) -> list[float]:
    """``[fresh, again] * num`` store times, seconds."""
    tier = cls(url, pool, prefix=prefix, ttl_ms=600_000)
    pages = np.arange(1, N + 1, dtype=np.int32)
    slots = np.arange(N, dtype=np.int32)
    times = []
    for _ in range(num):
        keys = rng.integers(0, 256, (N, 16), dtype=np.uint8)
        kw = {
            "keys": keys,
            "parent_keys": keys,
            "tokens": np.zeros((N, 16), np.uint32),
            "namespaces": [None] * N,
        }
        for _twice in range(2):
            t0 = time.perf_counter()
            ok = tier.store(pool, pages, slots, **kw)
            times.append(time.perf_counter() - t0)
            assert ok.all()
        flushdb(url)
    tier.close()
    return times


def flushdb(url: str) -> None:
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=10) as s:
        s.sendall(b"*1\r\n$7\r\nFLUSHDB\r\n")
        assert s.recv(16).startswith(b"+OK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="redis://127.0.0.1:7371", help="a Redis you own")
    ap.add_argument("--baseline", required=True, help="another remote.py to alternate with the current one")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("remote_baseline", args.baseline)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules["remote_baseline"] = old  # (dataclasses look their module up)
    spec.loader.exec_module(old)
    pool = KVPool(num_layers=8, num_pages=N + 1, num_kv_heads=8, head_dim=64, page_size=16, kv_dtype="bf16")
    rng = np.random.default_rng(0)
    res: dict[str, list[float]] = {"now": [], "baseline": []}
    for k in range(args.runs):
        res["now"] += rounds(RedisTier, args.url, pool, f"ttl-bench-now-{k}", 15, rng)
        res["baseline"] += rounds(old.RedisTier, args.url, pool, f"ttl-bench-base-{k}", 15, rng)
    for name, ts in res.items():
        fresh, again = np.median(ts[0::2]) * 1e3, np.median(ts[1::2]) * 1e3
        print(
            f"{name}: store of {N} new 256 KiB pages {fresh:.1f} ms, of the same pages again {again:.2f} ms"
        )


if __name__ == "__main__":
    main()
