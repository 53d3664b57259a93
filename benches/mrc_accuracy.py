"""The online miss-ratio curve against replays at each size, on a real trace (same run).

One sequential LRU replay of the Mooncake conversation trace (16-token pages) with
``miss_ratio_curve=`` on gives the curve; then the trace is replayed through a manager of each size,
and the measured hit rates are printed beside the curve's:

    PYTHONPATH=python .venv/bin/python benches/mrc_accuracy.py [--trace PATH] [--samples N ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvcore.replay.engine import ReplayConfig, _Sequential, replay
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import read_trace

TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--samples", type=int, nargs="+", default=[8192, 65_536, 4_000_000])
    ap.add_argument("--sizes", type=int, nargs="+", default=[15_625, 62_500, 250_000, 1_000_000, 4_000_000])
    a = ap.parse_args()
    trace = read_trace(a.trace)
    src = TokenSource(trace)
    big = max(a.sizes) * 4
    curves = {}
    for n in a.samples:
        t = time.perf_counter()
        sim = _Sequential(trace, ReplayConfig(big, miss_ratio_curve=n), src, None)
        for i in range(trace.num_requests):
            sim.request(i, None)
        c = sim.m.miss_ratio_curve(a.sizes)
        curves[n] = c
        print(f"curve with {n:,} samples: {time.perf_counter() - t:.2f} s, sample rate {c.sample_rate:.4g}")
    t = time.perf_counter()
    off = replay(trace, ReplayConfig(big), tokens=src)
    print(f"the same replay, curve off: {time.perf_counter() - t:.2f} s (hit rate {off.hit_rate_tokens:.4f})")
    print("| pages | replayed | " + " | ".join(f"curve, {n:,} samples" for n in a.samples) + " |")
    for j, size in enumerate(a.sizes):
        real = replay(trace, ReplayConfig(size), tokens=src).hit_rate_tokens
        cells = " | ".join(
            f"{curves[n].hit_rate[j]:.4f} ({curves[n].hit_rate[j] - real:+.4f})" for n in a.samples
        )
        print(f"| {size:,} | {real:.4f} | {cells} |")


if __name__ == "__main__":
    main()
