"""``kvcore size`` and ``kvcore plan``: the sizing questions from the command line.

Readable tables by default, ``--json`` for scripts. Every error a user can cause (unknown preset, bad
size or count, contradictory or hostile config file) is a :class:`~kvcore.exceptions.ConfigError`;
:func:`kvcore.cli.main` prints its message as one line on stderr and exits with code 2, without a
traceback. ``plan`` exits 1 when what was asked does not fit (the warning says by how much), 0 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from kvcore.exceptions import ConfigError
from kvcore.sizing.units import plain_number

__all__ = ["register"]

_DEFAULT_CONTEXTS = "4k,32k,128k"


def register(subparsers: Any) -> None:
    """Add the ``size`` and ``plan`` sub-commands to an argparse subparsers object.

    Each sets ``func`` (``args -> exit code``) with ``set_defaults``; the top-level ``kvcore`` parser
    calls it. Nothing heavy is imported until a command runs.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="preset name (e.g. llama-3.1-70b, Qwen/Qwen3-8B) or path to a config.json / model directory",
    )
    common.add_argument(
        "--kv-dtype", default="bf16", help="cache precision: fp32, fp16, bf16, fp8, int8, int4"
    )
    common.add_argument("--tp", default="1", help="tensor-parallel degree; figures are per GPU (default 1)")
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument("--list-presets", action="store_true", help="list model and GPU presets and exit")

    size_p = subparsers.add_parser(
        "size",
        parents=[common],
        help="bytes of K/V cache per token, per sequence and per batch",
        description="Exact K/V cache bytes for a model, context length, batch and cache precision.",
    )
    size_p.add_argument(
        "--context",
        default=_DEFAULT_CONTEXTS,
        help=f"tokens per sequence, comma-separated for several (k = 1024; default {_DEFAULT_CONTEXTS})",
    )
    size_p.add_argument("--batch", default="1", help="sequences of that length (default 1)")
    size_p.set_defaults(func=_cmd_size)

    plan_p = subparsers.add_parser(
        "plan",
        parents=[common],
        help="what fits on a GPU: pages, active tokens, concurrent requests, longest context",
        description="Plan a deployment: weights + runtime reserve + K/V pages never exceed the GPU.",
    )
    plan_p.add_argument(
        "--gpu", help="GPU preset: H100-80G, H200-141G, A100-80G, A100-40G, L40S, L4, RTX-4090, …"
    )
    plan_p.add_argument("--gpu-mem", help="memory of one GPU instead of a preset (e.g. 80GiB, 24GB)")
    plan_p.add_argument("--weight-bytes", help="measured size of the whole checkpoint (e.g. 141GB)")
    plan_p.add_argument(
        "--params", help="parameter count for an estimate (e.g. 70.6B; default: the preset's)"
    )
    plan_p.add_argument("--weight-dtype", help="weight precision for the estimate (default: the config's)")
    plan_p.add_argument(
        "--reserve", default="10%", help="runtime reserve per GPU: a size or a %% (default 10%%)"
    )
    plan_p.add_argument("--page-size", default="16", help="tokens per page (default 16)")
    plan_p.add_argument("--context", help="tokens per request: how many such requests fit")
    plan_p.add_argument("--concurrency", help="requests at once: the longest context each can have")
    plan_p.add_argument(
        "--request",
        action="append",
        default=[],
        metavar="PROMPT+OUTPUT",
        help="one request of a distribution, e.g. 24k+8k (repeat, or comma-separate)",
    )
    plan_p.set_defaults(func=_cmd_plan)


# ---- size ----------------------------------------------------------------------------------------


def _cmd_size(args: argparse.Namespace) -> int:
    from kvcore.sizing import load_model, parse_tokens, size

    if args.list_presets:
        return _list_presets()
    spec = load_model(_need_model(args))
    tp = _int(args.tp, "tp")
    batch = _int(args.batch, "batch")
    # Every item is a count: an empty one ("1k,,2k") is refused, as --sweep-tokens refuses it.
    contexts = [parse_tokens(c.strip(), "context") for c in _split_list(str(args.context), "context")]
    reports = [size(spec, ctx, batch=batch, kv_dtype=args.kv_dtype, tp=tp) for ctx in contexts]
    if args.json:
        print(json.dumps({"reports": [r.to_dict() for r in reports]}, indent=2))
        return 0
    first = reports[0]
    source = "preset" if spec.source == "preset" else spec.source
    lines = [
        f"model        {spec.name} ({source})",
        f"layers       {first.description}",
        f"kv dtype     {first.kv_dtype}" + (f", per GPU at tp {tp}" if tp > 1 else ""),
        f"per token    {_fmt(first.bytes_per_token)}"
        + (f" (+ {first.scale_bytes:,} B of scales per pool)" if first.scale_bytes else ""),
        "",
    ]
    rows = [["context", "batch", "per sequence", "batch K/V", "batch total (+scales +state)"]]
    for r in reports:
        rows.append(
            [
                f"{r.context_len:,}",
                f"{r.batch:,}",
                _fmt(r.sequence_bytes),
                _fmt(r.kv_bytes),
                _fmt(r.total_bytes),
            ]
        )
    lines += _table(rows, right=(0, 1))
    last = reports[-1]
    lines += ["", f"per layer group at {last.context_len:,} tokens x batch {last.batch:,}:"]
    rows = [
        ["group", "layers", "kv heads/GPU", "head_dim", "tensors", "window", "bytes/token", "cached", "bytes"]
    ]
    for g in last.groups:
        rows.append(
            [
                g.kind,
                f"{g.num_layers}",
                f"{g.kv_heads_per_gpu}",
                f"{g.head_dim}",
                f"{g.num_tensors}",
                f"{g.window:,}" if g.window is not None else "-",
                f"{g.bytes_per_token:,}",
                f"{g.cached_tokens:,}",
                f"{g.kv_bytes + g.scale_bytes + g.state_bytes:,}",
            ]
        )
    lines += _table(rows, right=tuple(range(1, 9)))
    notes = list(dict.fromkeys(n for r in reports for n in r.notes))
    if notes:
        lines += ["", *(f"note: {n}" for n in notes)]
    print("\n".join(lines))
    return 0


# ---- plan ----------------------------------------------------------------------------------------


def _cmd_plan(args: argparse.Namespace) -> int:
    from kvcore.sizing import gpu_preset, load_model, parse_bytes, parse_count, parse_tokens, plan
    from kvcore.sizing.presets import GpuSpec

    if args.list_presets:
        return _list_presets()
    spec = load_model(_need_model(args))
    if (args.gpu is None) == (args.gpu_mem is None):
        raise ConfigError("gpu: give exactly one of --gpu NAME (a preset) or --gpu-mem SIZE")
    gpu = (
        gpu_preset(args.gpu)
        if args.gpu is not None
        else GpuSpec("custom", parse_bytes(args.gpu_mem, "gpu_mem"))
    )
    reserve_bytes, reserve_fraction = _parse_reserve(args.reserve)
    requests = [_parse_request(item) for arg in args.request for item in _split_list(arg, "request")]
    result = plan(
        spec,
        gpu=gpu,
        tp=_int(args.tp, "tp"),
        kv_dtype=args.kv_dtype,
        # `is not None`, not truthiness: an empty --params '' is a mistake to report, not "not given".
        weight_bytes=parse_bytes(args.weight_bytes, "weight_bytes")
        if args.weight_bytes is not None
        else None,
        num_params=parse_count(args.params, "params") if args.params is not None else None,
        weight_dtype=args.weight_dtype,
        reserve_bytes=reserve_bytes,
        reserve_fraction=reserve_fraction,
        page_size=_int(args.page_size, "page_size"),
        context_len=parse_tokens(args.context, "context") if args.context is not None else None,
        concurrency=_int(args.concurrency, "concurrency") if args.concurrency is not None else None,
        requests=requests,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(_plan_lines(result)))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0 if result.fits else 1


def _plan_lines(p: Any) -> list[str]:
    gpus = f"{p.tp} x {p.gpu}" if p.tp > 1 else p.gpu
    rows = [
        ["plan", f"{p.model} on {gpus}, kv cache {p.kv_dtype}, pages of {p.page_size} tokens"],
        ["GPU memory", f"{_fmt(p.gpu_mem_bytes)} per GPU"],
        [
            "weights",
            f"{_fmt(p.weight_bytes_per_gpu)} per GPU ({p.weight_source}; {p.weight_bytes:,} B in all)",
        ],
        ["reserve", _fmt(p.reserve_bytes)],
        ["KV budget", _fmt(p.kv_budget_bytes)],
        [
            "page",
            f"{p.page_bytes:,} B ({p.page_size} tokens of one KV-cache group of {p.group_size} layer slots)",
        ],
    ]
    if p.scale_bytes:
        rows.append(["scales", f"{p.scale_bytes:,} B (fp32 per layer, K/V and head)"])
    if p.state_bytes_per_request:
        rows.append(
            ["state", f"{p.state_bytes_per_request:,} B per request, {p.state_reserved_requests} set aside"]
        )
    rows += [
        ["pages", f"{p.num_pages:,} (pool num_pages; {p.usable_pages:,} usable, page 0 is the null page)"],
        ["pool", _fmt(p.pool_bytes)],
        [
            "active tokens",
            f"{p.max_active_tokens:,}"
            + (" (a token takes a slot in each group)" if len(p.groups) > 1 else ""),
        ],
        [
            "kv groups",
            f"{len(p.groups)}: KVCacheManager(num_pages={p.num_pages}, page_size={p.page_size}, "
            f"groups={list(p.group_windows)!r})",
        ],
    ]
    for i, g in enumerate(p.groups):
        held = ""
        if p.context_len is not None:
            held = f"; {g.pages_per_sequence(p.context_len, p.page_size):,} pages @ {p.context_len:,}"
        rows.append([f"  group {i}", g.describe() + held])
    if p.padding_layers or p.padding_bytes_per_request:
        waste = f"{p.padding_layers} empty layer slot{'s' if p.padding_layers != 1 else ''}"
        if p.padding_bytes_per_request is not None and p.pages_per_request:
            share = p.padding_bytes_per_request / (p.pages_per_request * p.page_bytes)
            waste += (
                f"; {p.padding_bytes_per_request:,} B ({share:.1%}) of each request's pages "
                f"@ {p.context_len:,} hold no layer"
            )
        rows.append(["padding", waste])
    if p.context_len is not None:
        rows.append(
            [
                f"requests @ {p.context_len:,}",
                f"{p.max_requests_at_context:,} ({p.pages_per_request:,} pages each)",
            ]
        )
    if p.concurrency is not None:
        longest = (
            "not limited by memory (windows)" if p.context_unbounded else f"{p.max_context_at_concurrency:,}"
        )
        rows.append(
            [
                f"context @ {p.concurrency} req",
                f"{longest} tokens each" if not p.context_unbounded else longest,
            ]
        )
    if p.request_lens:
        rows.append(
            [
                f"mix of {len(p.request_lens)}",
                f"{p.max_requests_for_mix:,} request(s) on average, {p.max_requests_worst_case:,} if all are "
                f"{max(p.request_lens):,} tokens",
            ]
        )
    rows.append(["fits", "yes" if p.fits else f"NO: short by {_fmt(p.shortfall_bytes)}"])
    return _table(rows, right=())


# ---- helpers -------------------------------------------------------------------------------------


def _int(text: str, field: str) -> int:
    """A plain non-negative integer (GPU, request and page counts take no suffixes), at most int64."""
    from kvcore.sizing.formula import check_int

    value = plain_number(text, field)
    # ASCII digits only: "²".isdigit() is True, and int("²") raises.
    if not (value.isascii() and value.isdigit()):
        raise ConfigError(f"{field}: {text!r:.60} is not a whole number")
    if len(value) > 19:
        raise ConfigError(f"{field}: {text!r:.60} is too large")
    return check_int(int(value), field)


def _need_model(args: argparse.Namespace) -> str:
    if not args.model:
        raise ConfigError("model: give a preset name or a path to a config.json (see --list-presets)")
    return str(args.model)


def _parse_reserve(text: str) -> tuple[int | None, float]:
    from kvcore.sizing import DEFAULT_RESERVE_FRACTION, parse_bytes

    value = text.strip()
    if value.endswith("%"):
        try:
            share = float(Decimal(value[:-1].strip()) / 100)
        except ArithmeticError:  # decimal's InvalidOperation, Overflow, ...
            share = float("nan")
        if not 0 <= share < 1:  # also NaN and infinities
            raise ConfigError(f"reserve: {text!r:.60} is not a percentage in [0, 100) (example: 10%)")
        return None, share
    if not value:
        raise ConfigError(f"reserve: {text!r:.60} is empty; give a size or a percentage (example: 10%)")
    return parse_bytes(value, "reserve"), DEFAULT_RESERVE_FRACTION


_THOUSANDS_GROUP = re.compile(r"[0-9]{3}(?![0-9])")


def _split_list(text: str, field: str) -> list[str]:
    """Comma-separated values; a comma that reads as a thousands separator (a digit before it, three
    digits after: ``131,072``, ``1,000+500``) is refused as ambiguous: split, it silently gave two
    values (131 and 72 tokens; a 1-token and a 500-token request). A space after the comma says
    "two values"."""
    items = text.split(",")
    for before, item in itertools.pairwise(items):
        if before[-1:].isdigit() and _THOUSANDS_GROUP.match(item):
            raise ConfigError(
                f"{field}: {text!r:.60} is ambiguous: a comma separates values here; write numbers without "
                f"thousands separators ({before.strip()}{item.strip()}), or a space after a comma "
                "that separates two values"
            )
    return items


def _parse_request(text: str) -> tuple[int, int]:
    from kvcore.sizing import parse_tokens

    prompt, plus, output = text.strip().partition("+")
    output_len = parse_tokens(output, "request output") if plus else 0
    return parse_tokens(prompt, "request prompt"), output_len


def _list_presets() -> int:
    from kvcore.sizing import GPU_PRESETS, MODEL_PRESETS, model_preset

    rows = [["model", "layers", "per token (bf16)", "params"]]
    for name, preset in MODEL_PRESETS.items():
        spec = model_preset(name)
        params = f"{preset.num_params / 1e9:.3g}B" if preset.num_params else "-"
        rows.append([name, spec.describe(), f"{spec.bytes_per_token():,} B", params])
    lines = _table(rows, right=(2,))
    lines += [
        "",
        *_table([["gpu", "memory"]] + [[g.name, _fmt(g.mem_bytes)] for g in GPU_PRESETS.values()], ()),
    ]
    print("\n".join(lines))
    return 0


def _fmt(value: int) -> str:
    from kvcore.sizing import format_bytes

    return format_bytes(value)


def _table(rows: Sequence[Sequence[str]], right: tuple[int, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out
