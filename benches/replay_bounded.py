"""Memory held by a sliding-window model against the same model as full attention, on a real trace.

The first ``--limit`` requests of the Mooncake conversation trace (shared prefixes from its hash ids)
run ``--concurrency`` at a time through one manager: chunked prefill (``--chunk`` tokens per
request per step, ``cache_prompt=False`` + ``commit``), then one decode token per step until the
trace's output length, then free. The pool is large enough that nothing is refused, so what differs
is only what each design holds. Reported per design: mean and peak pages in use (held by live
sequences), the same in bytes of the model's pages, and the prefix hit rate.

- Mistral 7B v0.1 (every layer a 4,096-token window): ``groups=[4096]`` against ``[None]``; one
  page holds all 32 layers either way.
- Gemma 2 9B (21 sliding 4,096 + 21 full layers): ``groups=[4096, None]`` (pages of 21 layers)
  against one full group (pages of 42 layers).

Run: ``.venv/bin/python benches/replay_bounded.py [--limit N] [--concurrency C]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from kvcore import KVCacheManager
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import read_trace
from kvcore.sizing import load_model

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "conversation_trace.jsonl"
PS = 16


def run(
    groups: list[int | None], prompts: list[np.ndarray], outs: list[int], conc: int, chunk: int
) -> dict[str, float]:
    total_tokens = sum(len(p) + o for p, o in zip(prompts, outs, strict=True))
    m = KVCacheManager(total_tokens // PS * len(groups) + 1024, PS, groups=groups)
    waiting = list(range(len(prompts)))
    live: dict[int, list[int]] = {}  # id -> [done prompt tokens, generated]
    samples: list[int] = []
    hit = query = 0
    while waiting or live:
        while waiting and len(live) < conc:
            i = waiting.pop(0)
            h = m.add_sequence(i, prompts[i], cache_prompt=False, reserve=chunk)
            assert h is not None, "the pool is sized to refuse nothing"
            hit += h
            query += len(prompts[i])
            live[i] = [h + min(chunk, len(prompts[i]) - h), 0]
        for i, st in list(live.items()):
            n = len(prompts[i])
            if st[0] < n:  # the chunk reserved last step is computed: commit, reserve the next
                m.commit(i, st[0])
                k = min(chunk, n - st[0])
                assert m.reserve(i, k)
                st[0] += k
            elif st[1] < outs[i]:
                if st[1] == 0:
                    m.commit(i, n)
                assert m.append(i, [(i * 7919 + st[1]) % 50000 + 1])
                st[1] += 1
            else:
                m.free_sequence(i)
                del live[i]
        samples.append(m.stats().num_pages_in_use)
    return {
        "mean_pages": statistics.fmean(samples),
        "peak_pages": float(max(samples)),
        "hit_rate": hit / max(1, query),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--chunk", type=int, default=2048)
    a = p.parse_args()
    trace = read_trace(TRACE, limit=a.limit)
    src = TokenSource(trace)
    prompts = [np.asarray(src.prompt(i), np.uint32) for i in range(trace.num_requests)]
    outs = [max(1, int(x)) for x in trace.output_lens.tolist()]
    print(
        f"{trace.num_requests} requests, "
        f"mean prompt {statistics.fmean(len(x) for x in prompts):,.0f} tokens, "
        f"mean output {statistics.fmean(outs):,.0f}; {a.concurrency} at a time, chunks of {a.chunk}"
    )
    print(
        f"{'model':<12} {'groups':<14} {'mean pages':>11} {'peak pages':>11} "
        f"{'mean GiB':>9} {'peak GiB':>9} {'hits':>6}"
    )
    for name, designs in (
        ("mistral-7b", [[4096], [None]]),
        ("gemma-2-9b", [[4096, None], [None]]),
    ):
        spec = load_model(name)
        for groups in designs:
            t0 = time.perf_counter()
            r = run(groups, prompts, outs, a.concurrency, a.chunk)
            # A page holds the layers of one group: the model's layers split evenly over the groups.
            page = spec.page_bytes(PS) // len(groups)
            gib = page / 2**30
            print(
                f"{name:<12} {groups!s:<14} {r['mean_pages']:>11,.0f} {r['peak_pages']:>11,.0f} "
                f"{r['mean_pages'] * gib:>9.2f} {r['peak_pages'] * gib:>9.2f} {r['hit_rate']:>6.1%}"
                f"   ({time.perf_counter() - t0:.1f} s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
