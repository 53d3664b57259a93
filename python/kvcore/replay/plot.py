"""PNG plots of a replay (matplotlib, imported only here and only when a plot is asked for).

Two figures: the **sweep** (hit rate against capacity, one line per policy, with the infinite cache's
token hit rate as the ceiling) answers "how much cache is worth buying"; the **timeline** (usage split
over time and the running hit rate, one panel per policy) shows *why*: when the cache fills, when
requests crowd out cached prefixes. matplotlib is optional (``pip install kvcore[plot]``):
:func:`matplotlib_available` lets callers skip plots without an error.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from kvcore.replay.report import ReplayReport, hit_rate_of_all_prompts

__all__ = ["matplotlib_available", "plot_pressure", "plot_sweep", "plot_timeline"]


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(report: ReplayReport, path: str | os.PathLike[str]) -> Path:
    """Hit rate (tokens) against capacity in tokens, log x axis, one line per policy; returns the path."""
    if not report.sweep:
        raise ValueError("the report has no sweep")
    plt = _pyplot()
    ps = report.capacity.page_size
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for policy in dict.fromkeys(r.policy for r in report.sweep):
        points = sorted(
            (r.capacity_pages * ps, hit_rate_of_all_prompts(r, report.workload))
            for r in report.sweep
            if r.policy == policy
        )
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], marker="o", label=policy)
    ideal = 100 * report.workload.ideal_token_hit_rate
    ax.axhline(ideal, color="gray", linestyle="--", label="infinite cache")
    ax.axvline(report.capacity.tokens, color="gray", linestyle=":", label="configured capacity")
    ax.set_xscale("log")
    ax.set_xlabel(f"cache capacity (tokens; pages of {ps})")
    ax.set_ylabel("prefix hit rate (% of all prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{report.workload.name}: hit rate vs capacity ({report.mode})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_timeline(report: ReplayReport, path: str | os.PathLike[str]) -> Path:
    """Usage split (stacked, % of pages) and running hit rate over the replay, one panel per policy."""
    plt = _pyplot()
    n = len(report.results)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n + 0.6), dpi=110, squeeze=False, sharex=True)
    total = max(report.capacity.pages, 1)
    for ax, r in zip(axes[:, 0], report.results, strict=True):
        tl = r.timeline
        scale = [100.0 / total] * len(tl.x)
        stacks = [
            [v * s for v, s in zip(col, scale, strict=True)]
            for col in (tl.in_use, tl.cached, tl.pinned, tl.free)
        ]
        ax.stackplot(tl.x, *stacks, labels=["in use", "cached", "pinned", "free"], alpha=0.8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of pages")
        ax.set_title(
            f"{r.policy}: hit rate {100 * r.hit_rate_tokens:.1f} %, {r.num_evicted_pages:,} pages evicted"
        )
        twin = ax.twinx()
        twin.plot(
            tl.x, [100 * h for h in tl.hit_rate], color="black", linewidth=1.2, label="hit rate (running)"
        )
        twin.set_ylim(0, 100)
        twin.set_ylabel("hit rate %")
        ax.legend(loc="upper left", fontsize="small", ncol=4)
        twin.legend(loc="lower right", fontsize="small")
        ax.set_xlabel(tl.x_label)
    fig.suptitle(f"{report.workload.name}: {report.capacity.tokens:,}-token cache, {report.mode} mode")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_pressure(results: list[Any], path: str | os.PathLike[str]) -> Path:
    """``kvcore replay --pressure``: goodput, p99 time to first token and refusals against load, one
    line per pressure mode (:class:`kvcore.replay.pressure.PressureResult` rows); returns the path."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for mode in sorted({r.pressure for r in results}):
        rows = sorted((r for r in results if r.pressure == mode), key=lambda r: r.load)
        loads = [r.load for r in rows]
        axes[0].plot(loads, [r.goodput_rps for r in rows], marker="o", label=mode)
        axes[1].plot(loads, [r.ttft_p99_s for r in rows], marker="o", label=mode)
        axes[2].plot(loads, [r.num_refused / max(r.num_submitted, 1) for r in rows], marker="o", label=mode)
    for ax, title in zip(
        axes,
        ("goodput (requests/s within target)", "p99 time to first token (s)", "refused fraction"),
        strict=True,
    ):
        ax.set_title(title)
        ax.set_xlabel("load (x trace rate)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
