"""One decode page's cost with a lower tier: ``append`` of a page of tokens, ``commit``, then
``take_transfers`` + ``complete_transfers`` of its store, for a sequence deep in its context (a
4,096-page path by default), plain and as a tenant's over a public system prompt. Medians in µs.
Compare two builds in one session by alternating ``PYTHONPATH``:

    PYTHONPATH=python .venv/bin/python benches/tiers_commit.py
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from kvcore import KVCacheManager

PS = 16


def run(depth: int, rounds: int, over_public: bool) -> dict[str, float]:
    m = KVCacheManager(2 * depth + 256, PS, lower_tiers=[("host", 4 * depth + 512)], store_policy="all")
    ns = None
    if over_public:
        m.add_sequence(99, np.arange(1, 4 * PS + 2, dtype=np.int32), "*")
        b = m.take_transfers()
        m.complete_transfers(np.unique(b.store_ops), True)
        ns = "a"
    m.add_sequence(1, np.arange(1, depth * PS + 1, dtype=np.int32), ns, cache_prompt=False)
    done = itertools.count(1)

    def store() -> None:
        b = m.take_transfers()
        m.complete_transfers(np.unique(b.store_ops), True)

    for _ in range(depth):
        m.commit(1, next(done) * PS)
        store()
    fresh = itertools.count(10**7)
    times: dict[str, list[float]] = {"append": [], "commit": [], "take+complete": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        m.append(1, [next(fresh) for _ in range(PS)])
        t1 = time.perf_counter()
        m.commit(1, next(done) * PS)
        t2 = time.perf_counter()
        store()
        t3 = time.perf_counter()
        for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[k].append(dt)
    return {k: float(np.median(v)) * 1e6 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=4096, help="pages on the sequence's path")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    for label, over in (("plain", False), ("over a public prefix", True)):
        r = run(args.depth, args.rounds, over)
        print(f"{label}: " + ", ".join(f"{k} {v:.1f} us" for k, v in r.items()))


if __name__ == "__main__":
    main()
