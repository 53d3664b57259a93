"""``kvcore replay``: hit rate, memory and evictions of a workload at a given capacity.

Runs a Mooncake-format trace (or the built-in workload) through the real manager, once per policy,
optionally over a capacity sweep, and prints a report; the plot (and ``report.json``) go to ``--out``.
With ``--instances N`` / ``--remote STORE`` it splits the trace over N instances sharing a remote tier
(:mod:`kvcore.replay.instances`), with and without that tier, for one policy; no plot.
Every error a user can cause (malformed trace line, unknown preset, contradictory capacity, missing
file, a cache too large for memory) prints one line on stderr and exits with code 2, without a
traceback: the jobs raise ``ConfigError`` / ``TraceFormatError`` (naming the flag, or the file and line),
and :func:`kvcore.cli.main` prints them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcore.cli import float_arg, int_arg

if TYPE_CHECKING:
    from kvcore.replay.capacity import Capacity
    from kvcore.replay.engine import ReplayConfig
    from kvcore.replay.trace import Trace

__all__ = ["register"]

_DEFAULT_OUT = "kvcore-replay"
# The remote index of each instance: the pages the trace can store (its prompts' and answers' pages),
# at most 64 M tokens of 16-token pages. Sized to the trace, not to the cap: each slot costs 16 bytes an
# instance, so a fixed 4 M slots made --instances 100 hold 8.6 GB for a five-line trace.
_REMOTE_INDEX_PAGES = 1 << 22
# Options that only some replays use have no argparse default, so that one given where it has no
# effect is an error naming it (a flag silently ignored reads as a measured setting); these fill in
# the rest. They are ReplayConfig's, PressureReplayConfig's, WorkloadConfig's and sizing's defaults.
_DEFAULTS: dict[str, Any] = {
    "trace_block_size": 512,
    "seed": 0,
    "kv_dtype": "bf16",
    "tp": 1,
    "prefill_rate": 10_000.0,
    "decode_rate": 50.0,
    "max_queue_wait": 60.0,
    "load": "1",
    "ttft_target": 10.0,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
}


def register(subparsers: Any) -> None:
    """Add the ``replay`` sub-command to an argparse subparsers object (sets ``func``: args -> exit code)."""
    p = subparsers.add_parser(
        "replay",
        help="replay a workload through the cache: hit rate, memory, evictions per policy and capacity",
        description=(
            "Replay a Mooncake-format JSONL trace (or, without TRACE, the built-in workload: shared system "
            "prompts and tools, multi-turn chats, RAG documents) through kvcore's KVCacheManager and report "
            "hit rates, the usage split, evictions and refusals per eviction policy."
        ),
    )
    p.add_argument(
        "trace", nargs="?", metavar="TRACE", help="Mooncake JSONL trace (default: built-in workload)"
    )
    src = p.add_argument_group("workload")
    src.add_argument(
        "--trace-block-size",
        type=int_arg(1),
        metavar="N",
        help=f"tokens per hash id in TRACE (default {_DEFAULTS['trace_block_size']})",
    )
    src.add_argument("--limit", type=int_arg(1), metavar="N", help="replay only the first N requests")
    src.add_argument(
        "--requests",
        type=int_arg(1),
        metavar="N",
        help="built-in workload: number of requests (default 4000)",
    )
    src.add_argument(
        "--seed", type=int_arg(0), metavar="N", help="built-in workload: random seed (default 0)"
    )
    src.add_argument("--save-trace", metavar="PATH", help="also write the workload as Mooncake JSONL")
    cap = p.add_argument_group("capacity (default: what kvcore plan gives llama-3.1-8b on H100-80G)")
    cap.add_argument("--capacity-pages", type=int_arg(1), metavar="N", help="usable pages of the cache")
    cap.add_argument(
        "--capacity-tokens", metavar="T", help="tokens of cache, e.g. 3000000 or 512k (k = 1024)"
    )
    cap.add_argument("--capacity-bytes", metavar="B", help="bytes of pool memory, e.g. 40GiB (needs --model)")
    cap.add_argument(
        "--model", help="model preset or config.json: bytes per page, and with --gpu the page count"
    )
    cap.add_argument("--gpu", help="GPU preset (H100-80G, H200-141G, A100-80G, L40S, L4, ...)")
    cap.add_argument(
        "--weight-bytes",
        metavar="B",
        help="with --gpu: measured checkpoint size (e.g. 16GB), for a config.json that declares none",
    )
    cap.add_argument(
        "--params",
        metavar="N",
        help="with --gpu: parameter count for an estimate (e.g. 8B; default: the preset's)",
    )
    cap.add_argument(
        "--kv-dtype", metavar="DTYPE", help="cache precision for --model or --gpu (default bf16)"
    )
    cap.add_argument(
        "--tp",
        type=int_arg(1),
        metavar="N",
        help="tensor-parallel degree for --model/--gpu (default 1)",
    )
    cap.add_argument(
        "--page-size",
        type=int_arg(1),
        default=16,
        metavar="N",
        help="tokens per page (default 16; 512 = Mooncake blocks)",
    )
    tiers = p.add_argument_group(
        "lower tiers (below HBM; default none): KV pages stored to and loaded back from host DRAM and disk"
    )
    tiers.add_argument(
        "--host-tier-tokens", metavar="T", help="tokens of host-DRAM tier, e.g. 4M (k = 1024, M = 1024^2)"
    )
    tiers.add_argument("--disk-tier-tokens", metavar="T", help="tokens of disk tier, e.g. 40M")
    tiers.add_argument(
        "--store-policy",
        choices=("selective", "all", "value"),
        help="pages stored to the tiers: selective (hit again or pinned), all (every cached page), value "
        "(when reuse is worth the transfer) (default selective)",
    )
    tiers.add_argument(
        "--host-bandwidth-gbps",
        type=float_arg(0, strict=True),
        metavar="GB_S",
        help="host tier GB/s: timed load times and the value policy (default 25)",
    )
    tiers.add_argument(
        "--disk-bandwidth-gbps",
        type=float_arg(0, strict=True),
        metavar="GB_S",
        help="disk tier GB/s (default 5)",
    )
    tiers.add_argument(
        "--remote-bandwidth-gbps",
        type=float_arg(0, strict=True),
        metavar="GB_S",
        help="shared remote tier GB/s (default 1)",
    )
    tiers.add_argument(
        "--page-bytes",
        metavar="B",
        help="K/V bytes of a page, for bytes moved, e.g. 2MiB (default: from --model, else 128 KiB a token)",
    )
    shared = p.add_argument_group(
        "instances sharing a remote tier: the trace split over N instances, each its own HBM and tiers, "
        "all reading and writing one remote store; replayed with it and without it"
    )
    shared.add_argument(
        "--instances", type=int_arg(1), metavar="N", help="simulated engine instances (default 1)"
    )
    shared.add_argument(
        "--remote",
        metavar="STORE",
        help="the shared store: memory (in this process; default with --instances) or "
        "redis://HOST:PORT[/DB] (keys under a per-run prefix, deleted at the end)",
    )
    shared.add_argument(
        "--split",
        choices=("round-robin", "session"),
        help="round-robin: request i to instance i mod N; session: a conversation stays on one instance "
        "(key: its first hash id past the prefix all requests share) (default round-robin)",
    )
    shared.add_argument(
        "--remote-index-pages",
        type=int_arg(1),
        metavar="N",
        help="remote pages each instance's index may know (default: the pages the trace's prompts and "
        f"answers fill, at most {_REMOTE_INDEX_PAGES:,})",
    )
    shared.add_argument(
        "--remote-lookup-keys",
        type=int_arg(1),
        metavar="N",
        help="most pages one lookup asks the store about (default 2048)",
    )
    run = p.add_argument_group("replay")
    run.add_argument(
        "--mode",
        choices=("sequential", "timed"),
        help="sequential: trace order, one request at a time, prompts only (Mooncake Figure 9); "
        "timed: arrivals at timestamps, decoding holds pages (default: timed when the trace has timestamps)",
    )
    run.add_argument(
        "--policy",
        help="eviction policies, comma-separated (default lru,lfu,priority; with --instances one, lru)",
    )
    run.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep capacities (8 halvings of the workload's footprint): the hit-rate curve and its PNG",
    )
    run.add_argument(
        "--sweep-tokens",
        metavar="T,T,...",
        help="sweep these capacities instead, in tokens (e.g. 3000000,50000000; k = 1024); implies --sweep",
    )
    run.add_argument(
        "--prefill-rate",
        type=float_arg(0, strict=True),
        metavar="TOK_S",
        help="timed: prefill tokens/s per request (each step: prefill-rate / decode-rate prompt tokens) "
        "(default 10000)",
    )
    run.add_argument(
        "--decode-rate",
        type=float_arg(0, strict=True),
        metavar="TOK_S",
        help="timed: decode tokens/s per request (one kvcore.scheduler step per decode token) (default 50)",
    )
    run.add_argument(
        "--decode-chunk",
        type=int_arg(1),
        metavar="N",
        help="ignored, kept for old command lines: the scheduler reserves one slot per decode step",
    )
    run.add_argument(
        "--max-queue-wait",
        type=float_arg(0),
        metavar="S",
        help="timed: seconds a request may wait before it is refused (default 60)",
    )
    pr = p.add_argument_group(
        "memory pressure (--pressure): the timed replay's engine (kvcore.scheduler, step by step) at each "
        "--load, with and without the pressure controller; --prefill-rate is then the whole engine's "
        "tokens/s (a step lasts its prefill tokens / rate, plus a decode step) and --decode-rate its "
        "decode steps/s"
    )
    pr.add_argument(
        "--pressure",
        metavar="MODES",
        help="compare pressure modes, comma-separated: none (the scheduler alone), graduated "
        "(with the PressureController)",
    )
    pr.add_argument("--load", metavar="X,X,...", help="arrival-rate multipliers (default 1; e.g. 1,2,3)")
    pr.add_argument(
        "--ttft-target",
        type=float_arg(0, strict=True),
        metavar="S",
        help="a request is good when served with its first token within S seconds (default 10)",
    )
    pr.add_argument(
        "--max-num-batched-tokens", type=int_arg(1), metavar="N", help="tokens per step (default 2048)"
    )
    pr.add_argument("--max-num-seqs", type=int_arg(1), metavar="N", help="running requests (default 256)")
    out = p.add_argument_group("output")
    out.add_argument(
        "--out",
        default=_DEFAULT_OUT,
        metavar="DIR",
        help=f"directory for the plot and report.json (default ./{_DEFAULT_OUT})",
    )
    out.add_argument("--no-plot", action="store_true", help="write no PNG")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    prog = out.add_mutually_exclusive_group()
    prog.add_argument(
        "--progress", dest="progress", action="store_true", default=None, help="always draw progress"
    )
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="never draw progress")
    p.set_defaults(func=_run)


def _tokens(text: str, what: str) -> int:
    from kvcore.sizing import parse_tokens

    return parse_tokens(text, what)


def _tier_settings(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """``(flag, value)`` of the options that only set up lower tiers (None: not given)."""
    return (
        ("--store-policy", args.store_policy),
        ("--host-bandwidth-gbps", args.host_bandwidth_gbps),
        ("--disk-bandwidth-gbps", args.disk_bandwidth_gbps),
        ("--page-bytes", args.page_bytes),
    )


def _out_dir(text: str) -> Path:
    """``--out`` as a path, checked before any replay runs (a replay of minutes then never ends in
    "File exists"): the path, or its nearest existing parent, must be a directory this process can
    write in. Created later, when the reports are written.

    Raises:
        ConfigError: a path that is a file (or a link to nothing), or a directory that cannot be
            written in.
    """
    from kvcore.exceptions import ConfigError

    if not text:  # Path("") is ".": the reports would land in the working directory unasked
        raise ConfigError("--out: '' is not a directory name")
    path = Path(text)
    try:
        probe = path.absolute()
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise ConfigError(f"--out: {str(probe)!r} exists and is not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"--out: cannot write in {str(probe)!r} (permission denied)")
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"--out: {text!r:.200}: {getattr(exc, 'strerror', None) or exc}") from None
    return path


def _trace_pages(trace: Trace, page_size: int) -> int:
    """Pages the trace's prompts and answers fill, all requests together: no run stores more."""
    return int((-(-(trace.input_lens + trace.output_lens) // page_size)).sum())


def _tier_options(
    args: argparse.Namespace, page_size: int, model_page_bytes: int | None, trace_pages: int
) -> dict[str, Any]:
    """ReplayConfig's lower-tier fields from the flags (none when no tier is given); ``trace_pages``
    bounds the default remote index (the pages the trace can ever store).

    Raises:
        ConfigError: a tier under one page, a bad size, or a tier flag without a tier.
    """
    from kvcore.exceptions import ConfigError
    from kvcore.replay.engine import DEFAULT_BANDWIDTH_GBPS
    from kvcore.sizing import parse_bytes

    out: dict[str, Any] = {}
    for name in ("host", "disk"):
        flag = f"--{name}-tier-tokens"
        text = getattr(args, f"{name}_tier_tokens")
        if text is None:
            continue
        slots = _tokens(text, flag) // page_size
        if slots < 1:
            raise ConfigError(f"{flag}: {text!r} is less than one page of {page_size} tokens")
        out[f"{name}_tier_slots"] = slots
    if _shared(args):
        out["remote_index_slots"] = args.remote_index_pages or max(1, min(trace_pages, _REMOTE_INDEX_PAGES))
    given = [flag for flag, value in _tier_settings(args) if value is not None]
    if not out:
        if given:
            raise ConfigError(
                f"{given[0]} needs a lower tier: --host-tier-tokens, --disk-tier-tokens or --remote"
            )
        return out
    if args.page_bytes is not None and args.model is not None:
        raise ConfigError("--page-bytes and --model both give the bytes of a page: give one")
    page_bytes = (
        parse_bytes(args.page_bytes, "--page-bytes") if args.page_bytes is not None else model_page_bytes
    )
    if page_bytes is not None and page_bytes < 1:
        raise ConfigError(f"--page-bytes: expected at least 1 byte, got {args.page_bytes!r}")
    for name in ("host", "disk", "remote"):
        bw = getattr(args, f"{name}_bandwidth_gbps")
        out[f"{name}_bandwidth_gbps"] = DEFAULT_BANDWIDTH_GBPS[name] if bw is None else bw
    if args.remote_lookup_keys is not None:
        out["remote_lookup_keys"] = args.remote_lookup_keys
    if args.store_policy is not None:  # else ReplayConfig's default, the manager's
        out["store_policy"] = args.store_policy
    out["page_bytes"] = page_bytes
    return out


def _shared(args: argparse.Namespace) -> bool:
    """Whether the run is a multi-instance one (``--instances`` or ``--remote``).

    Raises:
        ConfigError: a shared-tier flag without ``--instances`` or ``--remote``.
    """
    from kvcore.exceptions import ConfigError

    if args.instances is not None or args.remote is not None:
        return True
    for flag, value in (
        ("--split", args.split),
        ("--remote-index-pages", args.remote_index_pages),
        ("--remote-lookup-keys", args.remote_lookup_keys),
        ("--remote-bandwidth-gbps", args.remote_bandwidth_gbps),
    ):
        if value is not None:
            raise ConfigError(f"{flag} needs a shared remote tier: --instances N or --remote STORE")
    return False


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _fill_defaults(args: argparse.Namespace) -> None:
    """Record which of :data:`_DEFAULTS` the command line gave (``args.given``), fill in the others."""
    args.given = {dest for dest in _DEFAULTS if getattr(args, dest) is not None}
    for dest in _DEFAULTS.keys() - args.given:
        setattr(args, dest, _DEFAULTS[dest])


def _refuse_unused(args: argparse.Namespace, unused: tuple[str, ...], why: str) -> None:
    """Raise ``ConfigError`` naming the first of ``unused`` (dests) the command line gave."""
    from kvcore.exceptions import ConfigError

    for dest in unused:
        if dest in args.given:
            raise ConfigError(f"{_flag(dest)} {why}")


def _trace_and_capacity(args: argparse.Namespace) -> tuple[Trace, Capacity]:
    """The workload (TRACE, or the built-in one) and the capacity the flags give.

    Raises:
        ConfigError: ``--requests`` with a TRACE, or a capacity the flags do not describe.
    """
    from kvcore.exceptions import ConfigError
    from kvcore.replay.capacity import resolve_capacity
    from kvcore.replay.generator import WorkloadConfig, generate_workload
    from kvcore.replay.trace import check_chained, read_trace
    from kvcore.sizing import parse_bytes, parse_count

    if args.trace is not None:
        if args.requests is not None:
            raise ConfigError("--requests sizes the built-in workload; with a TRACE use --limit")
        _refuse_unused(args, ("seed",), "seeds the built-in workload: a TRACE has no use for it")
    else:
        _refuse_unused(args, ("trace_block_size",), "reads a TRACE: the built-in workload has none")
    if args.model is None and (args.capacity_pages is not None or args.capacity_tokens is not None):
        _refuse_unused(
            args, ("kv_dtype", "tp"), "sizes pages of --model: with --capacity-pages/-tokens it needs --model"
        )
    if args.trace is not None:
        trace = read_trace(args.trace, block_size=args.trace_block_size, limit=args.limit)
        check_chained(trace)
    else:
        trace = generate_workload(WorkloadConfig(seed=args.seed, num_requests=args.requests or 4000))
        if args.limit is not None:
            trace = trace.head(args.limit)
    capacity = resolve_capacity(
        page_size=args.page_size,
        capacity_pages=args.capacity_pages,
        capacity_tokens=(
            _tokens(args.capacity_tokens, "--capacity-tokens") if args.capacity_tokens is not None else None
        ),
        capacity_bytes=(
            parse_bytes(args.capacity_bytes, "--capacity-bytes") if args.capacity_bytes is not None else None
        ),
        model=args.model,
        gpu=args.gpu,
        kv_dtype=args.kv_dtype,
        tp=args.tp,
        weight_bytes=parse_bytes(args.weight_bytes, "--weight-bytes")
        if args.weight_bytes is not None
        else None,
        num_params=parse_count(args.params, "--params") if args.params is not None else None,
    )
    return trace, capacity


def _run(args: argparse.Namespace) -> int:
    from kvcore.exceptions import ConfigError
    from kvcore.replay.engine import POLICIES, ReplayConfig, default_sweep_pages, run_replay
    from kvcore.replay.plot import matplotlib_available, plot_sweep, plot_timeline
    from kvcore.replay.report import format_report
    from kvcore.replay.trace import write_trace

    _fill_defaults(args)
    _out_dir(args.out)
    shared = _shared(args)
    if args.pressure is not None:
        return _run_pressure(args)
    _refuse_unused(
        args, ("load", "ttft_target", "max_num_batched_tokens", "max_num_seqs"), "needs --pressure MODES"
    )
    text = args.policy if args.policy is not None else ("lru" if shared else ",".join(POLICIES))
    policies = [p.strip().lower() for p in text.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise ConfigError(f"--policy: expected some of {', '.join(POLICIES)}, got {text!r}")
    if shared and len(policies) > 1:
        raise ConfigError(f"--instances replays one policy: give one of {', '.join(POLICIES)} to --policy")
    if shared and (args.sweep or args.sweep_tokens is not None):
        raise ConfigError("--instances and --sweep cannot be combined: sweep one instance")
    if args.remote is not None:  # before the trace is read: a bad scheme costs nothing
        from kvcore.replay.shared import check_store

        check_store(args.remote)
    trace, capacity = _trace_and_capacity(args)
    if args.instances is not None and args.instances > trace.num_requests:
        raise ConfigError(
            f"--instances: {args.instances:,} instances for {trace.num_requests:,} requests: "
            "some would replay nothing"
        )
    mode = args.mode or ("timed" if trace.timestamps_ms is not None else "sequential")
    if mode == "timed" and trace.timestamps_ms is None:
        raise ConfigError("--mode timed needs a trace with timestamps")
    if mode == "sequential":
        _refuse_unused(
            args,
            ("prefill_rate", "decode_rate", "max_queue_wait"),
            "paces the timed replay: this one is sequential (--mode sequential, or a trace without "
            "timestamps), prompts one after the other",
        )
    config = ReplayConfig(
        capacity_pages=capacity.pages,
        page_size=capacity.page_size,
        policy=policies[0],
        mode=mode,
        prefill_rate=args.prefill_rate,
        decode_rate=args.decode_rate,
        **({"decode_chunk": args.decode_chunk} if args.decode_chunk is not None else {}),
        max_queue_wait_s=args.max_queue_wait,
        **_tier_options(
            args, capacity.page_size, capacity.page_bytes, _trace_pages(trace, capacity.page_size)
        ),
    )
    if shared:
        if args.save_trace is not None:
            write_trace(trace, args.save_trace)
        return _run_instances(args, trace, config, capacity)
    sweep_pages: list[int] = []
    if args.sweep_tokens is not None:
        for item in args.sweep_tokens.split(","):
            pages = _tokens(item.strip(), "--sweep-tokens") // capacity.page_size
            if pages < 1:
                raise ConfigError(f"--sweep-tokens: {item.strip()!r} is less than one page")
            sweep_pages.append(pages)
        sweep_pages = sorted(set(sweep_pages) | {capacity.pages})
    elif args.sweep:
        sweep_pages = default_sweep_pages(trace, capacity.pages, capacity.page_size)
    out_dir = Path(args.out)
    if args.save_trace is not None:
        write_trace(trace, args.save_trace)
    report = run_replay(
        trace, config, policies=policies, capacity=capacity, sweep_pages=sweep_pages, progress=args.progress
    )
    notes: list[str] = []
    if args.decode_chunk is not None:
        notes.append("--decode-chunk is ignored: the timed replay reserves one slot per decode step")
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        if matplotlib_available():
            report.plots.append(str(plot_timeline(report, out_dir / f"timeline-{mode}.png")))
            if report.sweep:
                report.plots.append(str(plot_sweep(report, out_dir / f"sweep-{mode}.png")))
        else:
            notes.append("no plot: matplotlib is not installed (pip install 'kvcore[plot]')")
    (out_dir / "report.json").write_text(report.to_json() + "\n", encoding="utf-8")
    if args.json:
        print(report.to_json())
    else:
        print(format_report(report))
        print(f"report written: {out_dir / 'report.json'}")
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def _run_instances(args: argparse.Namespace, trace: Trace, config: ReplayConfig, capacity: Capacity) -> int:
    """``--instances`` / ``--remote``: the split replay, its report and report.json (no plot)."""
    from kvcore.replay.instances import replay_instances
    from kvcore.replay.report import format_instances
    from kvcore.replay.shared import open_store

    out_dir = Path(args.out)
    store = open_store(args.remote if args.remote is not None else "memory")
    try:
        report = replay_instances(
            trace,
            config,
            num_instances=args.instances or 1,
            split=args.split or "round-robin",
            store=store,
            capacity=capacity,
            progress=args.progress,
        )
    finally:
        store.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(report.to_json() + "\n", encoding="utf-8")
    if args.json:
        print(report.to_json())
    else:
        print(format_instances(report))
        print(f"report written: {out_dir / 'report.json'}")
    return 0


def _run_pressure(args: argparse.Namespace) -> int:
    """``--pressure``: each mode at each load, the table, report.json and pressure.png."""
    import json

    from kvcore.exceptions import ConfigError
    from kvcore.replay.plot import matplotlib_available, plot_pressure
    from kvcore.replay.pressure import (
        PRESSURE_MODES,
        PressureReplayConfig,
        arrival_times,
        format_pressure,
        replay_pressure,
        same_window,
    )
    from kvcore.replay.tokens import TokenSource
    from kvcore.replay.trace import write_trace

    modes = [m.strip().lower() for m in args.pressure.split(",") if m.strip()]
    if not modes or any(m not in PRESSURE_MODES for m in modes):
        raise ConfigError(f"--pressure: expected some of {', '.join(PRESSURE_MODES)}, got {args.pressure!r}")
    loads: list[float] = []
    for item in args.load.split(","):
        try:
            x = float(item)
        except ValueError:
            raise ConfigError(f"--load: {item.strip()!r} is not a number") from None
        if not (x > 0 and x < float("inf")):
            raise ConfigError(f"--load: expected numbers > 0, got {item.strip()!r}")
        loads.append(x)
    conflicts = [
        flag
        for flag, value in (
            ("--policy", args.policy),
            ("--sweep", args.sweep or None),
            ("--sweep-tokens", args.sweep_tokens),
            ("--host-tier-tokens", args.host_tier_tokens),
            ("--disk-tier-tokens", args.disk_tier_tokens),
            ("--instances", args.instances),
            ("--remote", args.remote),
            ("--mode", args.mode if args.mode == "sequential" else None),
            *_tier_settings(args),
        )
        if value is not None
    ]
    if conflicts:
        raise ConfigError(
            f"--pressure replays one HBM cache in timed mode: {conflicts[0]} is not supported with it"
        )
    trace, capacity = _trace_and_capacity(args)
    if trace.timestamps_ms is None:
        raise ConfigError("--pressure needs a trace with timestamps")
    for load in loads:  # every load's arrival times, before the first replay
        try:
            arrival_times(trace, load)
        except ConfigError as exc:
            raise ConfigError(f"--load: {exc}") from None
    config = PressureReplayConfig(
        capacity_pages=capacity.pages,
        page_size=capacity.page_size,
        prefill_rate=args.prefill_rate,
        decode_rate=args.decode_rate,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue_wait_s=args.max_queue_wait,
        ttft_target_s=args.ttft_target,
    )
    if args.save_trace is not None:
        write_trace(trace, args.save_trace)
    src = TokenSource(trace)
    results = same_window(
        [
            replay_pressure(trace, config, pressure=mode, load=load, tokens=src)
            for load in loads
            for mode in modes
        ]
    )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "workload": trace.name,
        "capacity": capacity.source,
        "capacity_pages": capacity.pages,
        "page_size": capacity.page_size,
        "settings": {
            "prefill_rate": config.prefill_rate,
            "decode_rate": config.decode_rate,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_num_seqs": config.max_num_seqs,
            "max_queue_wait_s": config.max_queue_wait_s,
            "ttft_target_s": config.ttft_target_s,
        },
        "results": [r.to_dict() for r in results],
        "plots": [],
    }
    notes: list[str] = []
    plots: list[str] = []
    if args.decode_chunk is not None:
        notes.append("--decode-chunk is ignored: the scheduler reserves one slot per decode step")
    if not args.no_plot:
        if matplotlib_available():
            plots = [str(plot_pressure(results, out_dir / "pressure.png"))]
            report["plots"] = plots
        else:
            notes.append("no plot: matplotlib is not installed (pip install 'kvcore[plot]')")
    text = json.dumps(report, indent=2, allow_nan=False)
    (out_dir / "report.json").write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    else:
        print(
            f"kvcore replay --pressure: {trace.num_requests:,} requests, {capacity.pages:,} pages of "
            f"{capacity.page_size} tokens, TTFT target {config.ttft_target_s:g} s"
        )
        print(format_pressure(results))
        print(f"report written: {out_dir / 'report.json'}")
        for plot in plots:
            print(f"plot written: {plot}")
    for note in notes:
        print(note, file=sys.stderr)
    return 0
