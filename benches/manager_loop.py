"""Admission, release and eviction in tight loops (median per call over thousands of rounds): a
steadier figure than pytest-benchmark's for same-session A/B runs of two builds.

    .venv/bin/python benches/manager_loop.py            # this tree
    /path/to/other/venv/bin/python benches/manager_loop.py   # another build, same machine, alternating
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import kvcore


def admissions(rounds: int = 3_000, batch: int = 64) -> tuple[float, float]:
    """Median ns of add_sequence (2,048 tokens, the first 1,920 cached) and of free_sequence."""
    m = kvcore.KVCacheManager(20_001, 16)
    prefix = np.arange(1_920, dtype=np.int32)
    m.add_sequence(-1, prefix)
    m.free_sequence(-1)
    tails = [np.arange(10**6 + i * 128, 10**6 + (i + 1) * 128, dtype=np.int32) for i in range(batch)]
    prompts = [np.concatenate([prefix, t]) for t in tails]
    adds, frees = [], []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for i, p in enumerate(prompts):
            m.add_sequence(i, p)
        t1 = time.perf_counter_ns()
        for i in range(batch):
            m.free_sequence(i)
        t2 = time.perf_counter_ns()
        adds.append((t1 - t0) / batch)
        frees.append((t2 - t1) / batch)
    return statistics.median(adds), statistics.median(frees)


def evictions(rounds: int = 400) -> float:
    """Median ns of evict(1000) over 30 released 128-page prompts."""
    times = []
    prompts = [np.arange(s * 2_048, (s + 1) * 2_048, dtype=np.int32) for s in range(30)]
    for _ in range(rounds):
        m = kvcore.KVCacheManager(4_001, 16)
        for sid, p in enumerate(prompts):
            m.add_sequence(sid, p)
            m.free_sequence(sid)
        t = time.perf_counter_ns()
        assert m.evict(1_000) == 1_000
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times)


def main() -> None:
    add, free = admissions()
    print(f"add_sequence {add:.0f} ns  free_sequence {free:.0f} ns  evict(1000) {evictions():.0f} ns")


if __name__ == "__main__":
    main()
