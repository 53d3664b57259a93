"""What the online miss-ratio curve costs an admission (``miss_ratio_curve=``), in the same run.

One round = ``add_sequence`` of a 2,048-token prompt whose first 1,920 tokens are cached (a fresh
128-token tail each round) + ``free_sequence``; medians of alternated batches, in µs:

    PYTHONPATH=python .venv/bin/python benches/mrc_overhead.py

Rows: off; on and exact (every page tracked: the workload has fewer distinct pages than the bound);
on and sampled (the bound reached, a low sampling rate: what a long-running server pays).
"""

from __future__ import annotations

import time

import numpy as np

from kvcore import KVCacheManager

PS, PROMPT, CACHED = 16, 2048, 1920


def manager(curve: bool | int | None) -> tuple[KVCacheManager, np.ndarray]:
    m = KVCacheManager(20_001, PS, miss_ratio_curve=curve)
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 32_000, CACHED).astype(np.uint32)
    assert m.add_sequence(-1, np.append(prefix, 1)) is not None
    m.free_sequence(-1)
    if isinstance(curve, int) and not isinstance(curve, bool) and curve < 1000:
        # Reach the bound first: many distinct pages, so the sampling rate is low.
        for i in range(200):
            assert m.add_sequence(-2 - i, rng.integers(0, 32_000, PROMPT).astype(np.uint32)) is not None
            m.free_sequence(-2 - i)
    return m, prefix


def batch_us(m: KVCacheManager, prefix: np.ndarray, rng: np.random.Generator, n: int = 200) -> float:
    tails = [np.append(prefix, rng.integers(0, 32_000, PROMPT - CACHED).astype(np.uint32)) for _ in range(n)]
    t = time.perf_counter()
    for i, p in enumerate(tails):
        m.add_sequence(i, p)
        m.free_sequence(i)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    rows = {"off": None, "on, exact": 1_000_000, "on, sampled (bound 256)": 256}
    built = {k: manager(v) for k, v in rows.items()}
    rng = np.random.default_rng(1)
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(15):
        for k, (m, prefix) in built.items():
            times[k].append(batch_us(m, prefix, rng))
    for k in rows:
        m = built[k][0]
        c = m.miss_ratio_curve()
        rate = "" if c is None else f"  (sample rate {c.sample_rate:.3g}, {c.num_samples} pages tracked)"
        print(f"{k:28s} {np.median(times[k]):7.2f} µs{rate}")


if __name__ == "__main__":
    main()
