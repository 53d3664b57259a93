"""The scheduler over hybrid KV-cache groups: preemptions, recomputed tokens and steps for one burst of
requests, per group layout, beside a plain manager of the same capacity per group. Every answer is
``max_new_tokens`` long; the step count is the simulated schedule's length (a step is a step,
whatever its tokens: it flatters recomputation, which costs prefill compute a decode step does not).
Compare two builds by alternating ``PYTHONPATH``:

    PYTHONPATH=python .venv/bin/python benches/scheduler_groups.py
"""

from __future__ import annotations

import argparse

import numpy as np

from kvcore import KVCacheManager
from kvcore.scheduler import Request, Scheduler

LAYOUTS: list[list[int | None]] = [
    [64],
    [100, 33],
    [None],
    [None, None],
    [64, None],
    [64, 64, 64, 64, 64, None],
    [1024, 1024, 1024, 1024, 1024, None],
]


def run(groups: list[int | None], num_pages: int, requests: int) -> dict[str, int]:
    sched = Scheduler(KVCacheManager(num_pages, 16, groups=groups))
    rng = np.random.default_rng(0)
    for i in range(requests):
        sched.submit(Request(i, rng.integers(1, 1000, 300).astype(np.uint32), max_new_tokens=400))
    steps = 0
    while sched.has_work() and steps < 100_000:
        plan = sched.step(steps * 0.02)
        sched.update(plan, rng.integers(1, 1000, int(plan.sample.sum())).astype(np.int64))
        steps += 1
    s = sched.stats()
    return {
        "steps": steps,
        "preemptions": s.num_preemptions,
        "failed_reservations": s.num_failed_reservations,
        "recomputed_tokens": s.recomputed_tokens,
        "computed_tokens": s.computed_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=400, help="pool pages of the grouped managers")
    ap.add_argument("--requests", type=int, default=60)
    args = ap.parse_args()
    for groups in LAYOUTS:
        r = run(groups, args.pages, args.requests)
        print(f"groups={groups}: " + ", ".join(f"{k} {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
