"""``kvcore replay --pressure`` on the whole Mooncake conversation trace: none against graduated at 1x,
2x and 3x its arrival rate (the BENCHMARKS.md table).

Run: ``.venv/bin/python benches/replay_pressure.py [--limit N] [--capacity-pages P] [--out DIR]``

The defaults (40,000 pages of 16 tokens, 640k tokens, about 50 of the trace's 12k-token prompts at
once; the engine prefilling 400k tokens/s) fit the trace at its own rate: 2x and 3x overload it.
``--capacity-pages 15000 --prefill-rate 200000`` overloads it even at 1x. Prints the table and
writes report.json and pressure.png to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import kvcore.cli

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "conversation_trace.jsonl"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--capacity-pages", type=int, default=40_000)
    p.add_argument("--prefill-rate", default="400000")
    p.add_argument("--out", default="kvcore-replay-pressure")
    a = p.parse_args()
    argv = ["replay", str(TRACE), "--capacity-pages", str(a.capacity_pages), "--prefill-rate", a.prefill_rate]
    argv += ["--pressure", "none,graduated", "--load", "1,2,3", "--out", a.out, "--no-progress"]
    if a.limit:
        argv += ["--limit", str(a.limit)]
    return kvcore.cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
