"""Mover.lookup against a real Redis: a cold prompt (nothing stored) in a tenant's namespace, the
lookup every admission makes with ``prefix_lookup=mover.lookup``. Interleaved with the one-chain
lookup kvcore made before public prefixes were looked up (``6e43917``: one ``exists`` of the prompt's
own chain), so both rows come from the same run:

    redis-server --port 7355 --bind 127.0.0.1 --save '' --daemonize yes
    .venv/bin/python benches/remote_lookup.py --url redis://127.0.0.1:7355
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import kvcore
from kvcore.pool import KVPool
from kvcore.tiers import Mover, RedisTier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a Redis you own, e.g. redis://127.0.0.1:7355")
    ap.add_argument("--rounds", type=int, default=1200)
    args = ap.parse_args()
    pool = KVPool(num_layers=2, num_pages=300, num_kv_heads=2, head_dim=8, page_size=16, kv_dtype="fp16")
    remote = RedisTier(args.url, pool, num_slots=4096, prefix="kvcore-bench-lookup")
    cache = kvcore.KVCacheManager(300, 16, lower_tiers=[remote], store_policy="all")
    mover = Mover(cache, pool, [remote])
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


if __name__ == "__main__":
    main()
