"""What one shared remote tier saves N engine instances on the Mooncake conversation trace.

Run: ``.venv/bin/python benches/replay_instances.py [--limit N] [--store-policy selective,all] [--json]``

Sequential replay (trace order, prompts only, LRU), 16-token pages, 1M tokens of HBM per instance (k = 1024),
the trace split round-robin over 1, 2, 4 and 8 instances; each split replayed with a remote tier shared by
all instances (``--remote memory``: an in-process store of page keys; a 4M-page index per instance, 1 GB/s)
and without it, once per store policy and lookup bound: 256 pages a lookup (``RedisTier``'s
``max_lookup_keys``, what ``Mover.lookup`` asks) and 8192 (more than the longest prompt's 7,888 pages: no
bound). Columns: the total hit rate without and with the shared tier (tokens, all instances), the remote
tier's hit tokens and the part of them loaded from pages another instance stored, and the recompute it
saves (prefill tokens saved with it minus without, and the hit-rate gain in points). Every figure is a
count of the real managers', not a timing. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvcore.replay import (
    SPLITS,
    STORE_POLICIES,
    InstancesReport,
    ReplayConfig,
    TokenSource,
    read_trace,
    replay_instances,
)
from kvcore.sizing import parse_tokens

_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "conversation_trace.jsonl"


def _tok(n: float) -> str:
    return f"{n / 1e6:.2f}M"


_HEADER = [
    "instances",
    "store",
    "lookup",
    "hit w/o remote",
    "hit with remote",
    "remote hits",
    "from others",
    "recompute saved",
    "gain",
    "store keys",
    "time",
]


def _row(policy: str, r: InstancesReport, seconds: float) -> list[str]:
    return [
        str(len(r.instances)),
        policy,
        str(r.settings["remote_lookup_keys"]),
        f"{100 * r.without_remote['hit_rate_tokens']:.2f} %",
        f"{100 * r.with_remote['hit_rate_tokens']:.2f} %",
        _tok(r.remote_hit_tokens),
        _tok(r.remote_tokens_from_others),
        _tok(r.prefill_tokens_saved_by_remote),
        f"{100 * r.hit_rate_gain:+.2f}",
        f"{r.num_store_keys:,}",
        f"{seconds:.1f} s",
    ]


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[c]) for r in [_HEADER, *rows]) for c in range(len(_HEADER))]
    for r in [_HEADER, ["-" * w for w in widths], *rows]:
        print("  ".join(v.ljust(widths[c]) if c < 3 else v.rjust(widths[c]) for c, v in enumerate(r)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trace", default=str(_TRACE), help="Mooncake JSONL trace (default: the conversation trace)"
    )
    ap.add_argument("--limit", type=int, help="replay only the first N requests (a prefix of the trace)")
    ap.add_argument("--instances", default="1,2,4,8", help="instance counts, comma-separated")
    ap.add_argument("--store-policy", default="selective,all", help="store policies, comma-separated")
    ap.add_argument("--lookup-keys", default="256,8192", help="pages a lookup asks for, comma-separated")
    ap.add_argument("--split", choices=SPLITS, default=SPLITS[0])
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--hbm-tokens", default="1M", help="HBM of each instance (default 1M = 2^20 tokens)")
    ap.add_argument("--remote-index-pages", type=int, default=1 << 22)
    ap.add_argument("--json", action="store_true", help="print the reports as JSON instead of the table")
    args = ap.parse_args()
    policies = [p.strip() for p in args.store_policy.split(",") if p.strip()]
    if not policies or any(p not in STORE_POLICIES for p in policies):
        ap.error(f"--store-policy: expected some of {', '.join(STORE_POLICIES)}")
    counts = [int(x) for x in args.instances.split(",")]
    bounds = [int(x) for x in args.lookup_keys.split(",")]
    ps = args.page_size
    trace = read_trace(args.trace, limit=args.limit)
    src = TokenSource(trace)
    start = time.perf_counter()
    results: list[tuple[str, InstancesReport, float]] = []
    for policy in policies:
        for bound in bounds:
            cfg = ReplayConfig(
                capacity_pages=parse_tokens(args.hbm_tokens, "--hbm-tokens") // ps,
                page_size=ps,
                mode="sequential",
                remote_index_slots=args.remote_index_pages,
                remote_lookup_keys=bound,
                store_policy=policy,
            )
            for n in counts:
                t0 = time.perf_counter()
                r = replay_instances(
                    trace, cfg, num_instances=n, split=args.split, tokens=src, progress=False
                )
                results.append((policy, r, time.perf_counter() - t0))
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps([{"store_policy": p, **r.to_dict()} for p, r, _ in results], indent=2))
        return
    r0 = results[0][1]
    print(
        f"{trace.name}: {trace.num_requests:,} requests, {_tok(r0.workload.prompt_tokens)} prompt tokens"
        f" (an infinite cache hits {100 * r0.workload.ideal_token_hit_rate:.1f} %); sequential, LRU,"
        f" {ps}-token pages, HBM {args.hbm_tokens} tokens per instance, {args.split} split,"
        f" shared remote index {args.remote_index_pages:,} pages per instance"
    )
    _print_table([_row(p, r, s) for p, r, s in results])
    print(f"({len(results)} splits, each with and without the shared tier, in {elapsed:.1f} s)")


if __name__ == "__main__":
    main()
