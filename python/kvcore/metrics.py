"""Prometheus text exposition of :class:`~kvcore.manager.CacheStats` (fields: ``docs/api.md``)."""

from __future__ import annotations

from collections.abc import Mapping

from kvcore.manager import CacheStats

__all__ = ["metrics_text", "tier_metrics_lines"]

_COUNTERS = (
    ("prefix_query_tokens", "Prompt tokens looked up for cached prefixes."),
    ("prefix_hit_tokens", "Prompt tokens found cached."),
    ("num_evicted_pages", "Pages evicted from the prefix cache."),
    ("num_cow_copies", "Copy-on-write page copies queued."),
    ("num_refused", "Admissions and appends refused for lack of pages."),
)


_TIER_COUNTERS = (
    ("num_stored_pages", "stored_pages", "Pages stored into the tier (stores completed OK)."),
    ("num_store_failed_pages", "store_failed_pages", "Pages whose store failed."),
    ("num_loaded_pages", "loaded_pages", "Pages loaded from the tier into HBM."),
    ("num_load_failed_pages", "load_failed_pages", "Pages whose load failed (I/O, checksum, key)."),
    ("hit_tokens", "hit_tokens", "Prompt tokens admitted from the tier."),
    ("num_evicted_slots", "evicted_slots", "Slots evicted to make room."),
    ("num_restored_pages", "restored_pages", "Pages restored from a previous run."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def tier_metrics_lines(
    tiers: Mapping[str, Mapping[str, int]],
    storage: Mapping[str, Mapping[str, int]] | None = None,
    prefix: str = "kvcore",
) -> list[str]:
    """Prometheus lines of ``KVCacheManager.tier_stats()`` (and, if given, each storage tier's own
    ``stats()``: bytes, checksum mismatches, I/O failures by reason), labelled by tier."""
    if not tiers:
        return []
    lines = [
        f"# HELP {prefix}_tier_slots Slots of each lower tier by state (cached + in_flight + free = all).",
        f"# TYPE {prefix}_tier_slots gauge",
    ]
    for name, t in tiers.items():
        tier = _label(name)
        for state in ("cached", "in_flight", "free", "bad", "locked"):
            lines.append(f'{prefix}_tier_slots{{tier="{tier}",state="{state}"}} {t[f"num_slots_{state}"]}')
    for key, metric, help_text in _TIER_COUNTERS:
        full = f"{prefix}_tier_{metric}_total"
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} counter"]
        lines += [f'{full}{{tier="{_label(name)}"}} {t[key]}' for name, t in tiers.items()]
    full = f"{prefix}_tier_store_skipped_pages_total"
    lines += [f"# HELP {full} Pages not stored, by reason (never silently).", f"# TYPE {full} counter"]
    for name, t in tiers.items():
        tier = _label(name)
        for reason in ("no_room", "in_flight"):
            lines.append(f'{full}{{tier="{tier}",reason="{reason}"}} {t[f"num_store_skipped_{reason}"]}')
    for name, counters in (storage or {}).items():
        for key, value in sorted(counters.items()):
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            full = f"{prefix}_tier_storage_{key}"
            lines.append(f'{full}{{tier="{_label(name)}"}} {value}')
    return lines


def metrics_text(
    stats: CacheStats,
    prefix: str = "kvcore",
    tiers: Mapping[str, Mapping[str, int]] | None = None,
    storage: Mapping[str, Mapping[str, int]] | None = None,
) -> str:
    """Render ``stats`` (and the lower tiers' ``tiers`` / ``storage`` counters, if given) in the
    Prometheus text format (version 0.0.4)."""
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
    lines += tier_metrics_lines(tiers or {}, storage, prefix)
    return "\n".join(lines) + "\n"
