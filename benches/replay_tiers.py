"""What host-DRAM and disk tiers below HBM add on the Mooncake conversation trace, per store policy.

Run: ``.venv/bin/python benches/replay_tiers.py [--limit N] [--json]``

Sequential replay (trace order, prompts only, LRU), 16-token pages, 1M tokens of HBM (k = 1024); the grid:
HBM only; + 4M host; + 4M host + 40M disk; each tiered row once per store policy (all, selective, value).
Rows: hit tokens found in HBM / host / disk (whole pages, uncapped in HBM as ``kvcore replay`` counts them),
the total hit rate, the prefill tokens the tiers saved, the bytes stored into and loaded from each tier
(pages x page bytes, 2 MiB per page: Llama-3.1-8B in bf16), and the stores the manager dropped (no room,
a store in flight, failed). Every figure is a count of the real manager's, not a timing: no bytes move.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvcore.replay import PolicyResult, ReplayConfig, TokenSource, read_trace, replay
from kvcore.sizing import parse_bytes, parse_tokens

_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "conversation_trace.jsonl"


def _tok(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.0f}"


def _row(label: str, r: PolicyResult) -> list[str]:
    by = {t.name: t for t in r.tiers}
    hits = r.hit_tokens_by_tier
    return [
        label,
        r.store_policy or "-",
        _tok(hits["hbm"]),
        _tok(hits.get("host", 0)),
        _tok(hits.get("disk", 0)),
        f"{100 * r.hit_rate_tokens:.2f} %",
        _tok(r.tier_hit_tokens),
        *(
            f"{_gib(by[n].stored_bytes)} / {_gib(by[n].loaded_bytes)}" if n in by else "-"
            for n in ("host", "disk")
        ),
        f"{sum(t.num_store_skipped_no_room for t in r.tiers):,}",
        f"{sum(t.num_store_skipped_in_flight for t in r.tiers):,}",
        f"{sum(t.num_store_failed_pages for t in r.tiers):,}",
    ]


_HEADER = [
    "tiers",
    "store",
    "hit hbm",
    "hit host",
    "hit disk",
    "hit rate",
    "saved by tiers",
    "host GiB st/ld",
    "disk GiB st/ld",
    "skip room",
    "skip in flight",
    "failed",
]


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[c]) for r in [_HEADER, *rows]) for c in range(len(_HEADER))]
    for r in [_HEADER, ["-" * w for w in widths], *rows]:
        print("  ".join(v.ljust(widths[c]) if c < 2 else v.rjust(widths[c]) for c, v in enumerate(r)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trace", default=str(_TRACE), help="Mooncake JSONL trace (default: the conversation trace)"
    )
    ap.add_argument("--limit", type=int, help="replay only the first N requests (a prefix of the trace)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--hbm-tokens", default="1M")
    ap.add_argument("--host-tokens", default="4M")
    ap.add_argument("--disk-tokens", default="40M")
    ap.add_argument("--page-bytes", help="bytes of one page (default 128 KiB a token)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    args = ap.parse_args()
    ps = args.page_size
    trace = read_trace(args.trace, limit=args.limit)
    src = TokenSource(trace)
    base = ReplayConfig(
        capacity_pages=parse_tokens(args.hbm_tokens, "--hbm-tokens") // ps,
        page_size=ps,
        mode="sequential",
        page_bytes=parse_bytes(args.page_bytes, "--page-bytes") if args.page_bytes else None,
    )
    host = parse_tokens(args.host_tokens, "--host-tokens") // ps
    disk = parse_tokens(args.disk_tokens, "--disk-tokens") // ps
    grid: list[tuple[str, ReplayConfig]] = [("HBM only", base)]
    for label, tiers in (
        (f"+ {args.host_tokens} host", (host, 0)),
        (f"+ {args.host_tokens} host + {args.disk_tokens} disk", (host, disk)),
    ):
        for policy in ("all", "selective", "value"):
            cfg = ReplayConfig(
                capacity_pages=base.capacity_pages,
                page_size=ps,
                mode="sequential",
                page_bytes=base.page_bytes,
                host_tier_slots=tiers[0],
                disk_tier_slots=tiers[1],
                store_policy=policy,
            )
            grid.append((label, cfg))
    start = time.perf_counter()
    results = [(label, replay(trace, cfg, tokens=src)) for label, cfg in grid]
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps([{"tiers": label, **r.to_dict()} for label, r in results], indent=2))
        return
    prompt = results[0][1].prompt_tokens
    print(
        f"{trace.name}: {trace.num_requests:,} requests, {_tok(prompt)} prompt tokens; sequential, LRU,"
        f" {ps}-token pages, HBM {args.hbm_tokens} tokens ({base.capacity_pages:,} pages),"
        f" {base.page_nbytes / 2**20:g} MiB per page"
    )
    _print_table([_row(label, r) for label, r in results])
    print(f"({len(results)} replays in {elapsed:.1f} s)")


if __name__ == "__main__":
    main()
