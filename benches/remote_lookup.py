"""Mover.lookup against a real Redis: a cold prompt (nothing stored) in a tenant's namespace, the
lookup every admission makes with ``prefix_lookup=mover.lookup``. Interleaved with the one-chain
lookup kvcore made before public prefixes were looked up (``6e43917``: one ``exists`` of the prompt's
own chain), so both rows come from the same run:

    redis-server --port 7355 --bind 127.0.0.1 --save '' --daemonize yes
    .venv/bin/python benches/remote_lookup.py --url redis://127.0.0.1:7355

``--baseline FILE`` loads another version of ``kvcore/tiers/remote.py`` beside the current one (e.g.
``git show cd4af37:python/kvcore/tiers/remote.py > /tmp/remote_old.py``) and alternates its
``Mover.lookup`` and ``exists`` of 128 keys with the current ones, in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np

import kvcore
from kvcore.pool import KVPool
from kvcore.tiers import Mover, RedisTier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a Redis you own, e.g. redis://127.0.0.1:7355")
    ap.add_argument("--rounds", type=int, default=1200)
    ap.add_argument("--baseline", help="another remote.py to alternate with the current one")
    args = ap.parse_args()
    if args.baseline:
        baseline(args.url, args.baseline, args.rounds)
        return
    mover, remote = setup(RedisTier, args.url, "kvcore-bench-lookup")
    cache = mover.cache
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 32_000, 2048).astype(np.int32) for _ in range(50)]

    def one_chain(tokens: np.ndarray, ns: str) -> int:
        keys = cache.prompt_keys(tokens, ns)
        known = cache.tier_prefix_len(remote.name, tokens, ns)
        found = int(remote.exists(keys[known:]))
        return cache.mark_tier_pages(remote.name, tokens, known + found, ns) if found else 0

    now: list[float] = []
    before: list[float] = []
    for i in range(args.rounds):
        p = prompts[i % len(prompts)]
        pair = [(mover.lookup, now), (one_chain, before)]
        for f, out in pair if i % 2 else pair[::-1]:
            t = time.perf_counter()
            f(p, "a")
            out.append(time.perf_counter() - t)
    print(
        f"cold tenant lookup, 2,048-token prompt (128 pages): Mover.lookup {np.median(now) * 1e6:.1f} us, "
        f"one chain {np.median(before) * 1e6:.1f} us (medians of {args.rounds})"
    )


def setup(cls: type, url: str, prefix: str) -> tuple[Mover, RedisTier]:
    """A cache over a remote tier of class ``cls`` (this RedisTier or a baseline's) and its Mover."""
    pool = KVPool(num_layers=2, num_pages=300, num_kv_heads=2, head_dim=8, page_size=16, kv_dtype="fp16")
    remote = cls(url, pool, num_slots=4096, prefix=prefix)
    cache = kvcore.KVCacheManager(300, 16, lower_tiers=[remote], store_policy="all")
    return Mover(cache, pool, [remote]), remote


def baseline(url: str, path: str, rounds: int) -> None:
    spec = importlib.util.spec_from_file_location("kvcore_remote_baseline", path)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # (its dataclasses look their module up)
    spec.loader.exec_module(old)

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 32_000, 2048).astype(np.int32) for _ in range(50)]
    keys = np.frombuffer(rng.bytes(128 * 16), dtype=np.uint8).reshape(128, 16)
    sides = [setup(RedisTier, url, "kvcore-bench-ab-now"), setup(old.RedisTier, url, "kvcore-bench-ab-base")]
    looks: list[list[float]] = [[], []]
    exists: list[list[float]] = [[], []]
    for i in range(rounds):
        order = (0, 1) if i % 2 else (1, 0)
        for k in order:
            t = time.perf_counter()
            sides[k][0].lookup(prompts[i % len(prompts)], "a")
            looks[k].append(time.perf_counter() - t)
        for k in order:
            t = time.perf_counter()
            sides[k][1].exists(keys)
            exists[k].append(time.perf_counter() - t)
    us = [[float(np.median(x)) * 1e6 for x in pair] for pair in (looks, exists)]
    print(
        f"cold tenant lookup: Mover.lookup now {us[0][0]:.1f} us, baseline {us[0][1]:.1f} us; "
        f"exists(128 keys) now {us[1][0]:.1f} us, baseline {us[1][1]:.1f} us (medians of {rounds})"
    )


if __name__ == "__main__":
    main()
