"""Tight loops of one scheduler round (``step`` + ``update``), medians in µs, for A/B comparisons.

The rows of ``benches/python/bench_scheduler.py`` without pytest-benchmark's overhead, and with the
joining requests made before the loop (the mixed row times the scheduler alone). Run it alternately
with two builds on ``PYTHONPATH`` and compare the minimum of the medians:

    PYTHONPATH=python .venv/bin/python benches/scheduler_loop.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "python"))
import bench_scheduler as b

from kvcore import KVCacheManager
from kvcore.scheduler import Request, Scheduler


def median_us(f: Callable[[], object], n: int = 300, warmup: int = 20) -> float:
    for _ in range(warmup):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6)


def main() -> None:
    out = {}
    s, tokens = b.decoding_scheduler()
    out["steady"] = median_us(lambda: s.update(s.step(0.0), tokens))
    s2, tokens2 = b.decoding_scheduler(stop=frozenset({1, 2}))
    out["stop"] = median_us(lambda: s2.update(s2.step(0.0), tokens2))

    m = KVCacheManager(b.BATCH * ((b.PROMPT + 1024) // b.PS + 1) + 1024, b.PS)
    s3 = Scheduler(m, max_num_batched_tokens=b.BATCH * b.PROMPT, max_num_seqs=b.BATCH)
    rng = np.random.default_rng(0)
    for i in range(b.BATCH):
        s3.submit(Request(i, rng.integers(0, 32_000, b.PROMPT), max_new_tokens=1024, stop_token_ids={1}))
    plan = s3.step(0.0)
    s3.update(plan, np.full(plan.batch_size, 7, np.int64))
    joining = iter(
        [
            Request(b.BATCH + k, rng.integers(2, 32_000, 16), max_new_tokens=1024, stop_token_ids={1})
            for k in range(400)
        ]
    )

    def mixed() -> None:  # one request ends (its stop token), one joins, every round
        s3.submit(next(joining))
        p = s3.step(0.0)
        t = np.full(int(p.sample.sum()), 7, np.int64)
        t[0] = 1
        s3.update(p, t)

    out["mixed"] = median_us(mixed)
    mb = b.decoding_manager()
    ids, toks = np.arange(b.BATCH, dtype=np.int64), np.full(b.BATCH, 7, np.uint32)
    out["floor"] = median_us(lambda: (mb.append_batch(ids, toks), mb.page_table(ids)))
    print(" ".join(f"{k}={v:.1f}" for k, v in out.items()))


if __name__ == "__main__":
    main()
