"""Prometheus text exposition of :class:`~kvcore.manager.CacheStats` (fields: ``docs/api.md``)."""

from __future__ import annotations

from kvcore.manager import CacheStats

__all__ = ["metrics_text"]

_COUNTERS = (
    ("prefix_query_tokens", "Prompt tokens looked up for cached prefixes."),
    ("prefix_hit_tokens", "Prompt tokens found cached."),
    ("num_evicted_pages", "Pages evicted from the prefix cache."),
    ("num_cow_copies", "Copy-on-write page copies queued."),
    ("num_refused", "Admissions and appends refused for lack of pages."),
)


def metrics_text(stats: CacheStats, prefix: str = "kvcore") -> str:
    """Render ``stats`` in the Prometheus text format (version 0.0.4)."""
    lines = [
        f"# HELP {prefix}_pages Pages of the KV pool by state (they sum to the usable pages).",
        f"# TYPE {prefix}_pages gauge",
    ]
    for state in ("in_use", "cached", "pinned", "free"):
        lines.append(f'{prefix}_pages{{state="{state}"}} {getattr(stats, f"num_pages_{state}")}')
    lines += [
        f"# HELP {prefix}_sequences Live sequences.",
        f"# TYPE {prefix}_sequences gauge",
        f"{prefix}_sequences {stats.num_sequences}",
    ]
    for name, help_text in _COUNTERS:
        metric = f"{prefix}_{name.removeprefix('num_')}_total"
        lines += [
            f"# HELP {metric} {help_text}",
            f"# TYPE {metric} counter",
            f"{metric} {getattr(stats, name)}",
        ]
    lines += [
        f"# HELP {prefix}_prefix_hit_rate Cached fraction of looked-up prompt tokens.",
        f"# TYPE {prefix}_prefix_hit_rate gauge",
        f"{prefix}_prefix_hit_rate {stats.hit_rate:.6f}",
    ]
    return "\n".join(lines) + "\n"
