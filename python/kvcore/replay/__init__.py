"""Workload replay (``kvcore replay``): what hit rate, memory and evictions a workload gets at a capacity.

Why: after "does it fit" (:mod:`kvcore.sizing`), an operator's next question is what the cache will do
with *their* traffic. This package runs a workload through the real :class:`kvcore.KVCacheManager`
and measures it:

- :func:`read_trace` / :func:`write_trace`: Mooncake-format JSONL (prefix-chained 512-token hash ids),
  read into a columnar :class:`Trace`; malformed lines raise ``TraceFormatError`` naming file, line and
  field;
- :func:`generate_workload`: the built-in, seeded workload (shared system prompts and tools with Zipf
  popularity, multi-turn chats, RAG documents);
- :func:`replay`: one policy at one capacity, in ``sequential`` mode (trace order, prompts only, as in
  Mooncake's Figure 9) or ``timed`` mode (arrivals, decoding, queueing, preemption), optionally with
  host-DRAM and disk tiers below HBM (:class:`TierResult`: their hits, bytes moved, skipped stores);
- :func:`run_replay`: several policies and a capacity sweep, as a :class:`ReplayReport`
  (:func:`format_report`, ``to_json``, :func:`plot_sweep`, :func:`plot_timeline`);
- :func:`replay_instances`: the trace split over several instances (:func:`split_requests`: round-robin
  or by session) that share a remote tier (a :class:`MemoryStore` or a :class:`RedisStore` of page
  keys), replayed with and without it, as an :class:`InstancesReport` (:func:`format_instances`);
- :func:`resolve_capacity`: pages from a count, tokens, bytes, or a model on a GPU via ``kvcore.sizing``.

Example::

    >>> from kvcore.replay import ReplayConfig, WorkloadConfig, generate_workload, replay
    >>> trace = generate_workload(WorkloadConfig(num_requests=200))
    >>> result = replay(trace, ReplayConfig(capacity_pages=20_000, mode="sequential"))
    >>> 0 < result.hit_rate_tokens < 1
    True
"""

from __future__ import annotations

from kvcore.replay.capacity import DEFAULT_GPU, DEFAULT_MODEL, Capacity, resolve_capacity
from kvcore.replay.engine import (
    DEFAULT_BANDWIDTH_GBPS,
    DEFAULT_REMOTE_LOOKUP_KEYS,
    DEFAULT_TOKEN_BYTES,
    MODES,
    POLICIES,
    STORE_POLICIES,
    Observer,
    ReplayConfig,
    default_sweep_pages,
    replay,
    run_replay,
)
from kvcore.replay.generator import WorkloadConfig, generate_workload
from kvcore.replay.instances import SPLITS, replay_instances, session_keys, split_requests
from kvcore.replay.plot import matplotlib_available, plot_sweep, plot_timeline
from kvcore.replay.progress import Progress
from kvcore.replay.report import (
    InstanceResult,
    InstancesReport,
    PolicyResult,
    ReplayReport,
    TierResult,
    Timeline,
    UsageSplit,
    WorkloadSummary,
    format_instances,
    format_report,
)
from kvcore.replay.shared import MemoryStore, RedisStore, SharedStore, open_store
from kvcore.replay.tokens import TokenSource
from kvcore.replay.trace import MAX_REQUEST_TOKENS, MOONCAKE_BLOCK_SIZE, Trace, read_trace, write_trace

__all__ = [
    "DEFAULT_BANDWIDTH_GBPS",
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "DEFAULT_REMOTE_LOOKUP_KEYS",
    "DEFAULT_TOKEN_BYTES",
    "MAX_REQUEST_TOKENS",
    "MODES",
    "MOONCAKE_BLOCK_SIZE",
    "POLICIES",
    "SPLITS",
    "STORE_POLICIES",
    "Capacity",
    "InstanceResult",
    "InstancesReport",
    "MemoryStore",
    "Observer",
    "PolicyResult",
    "Progress",
    "RedisStore",
    "ReplayConfig",
    "ReplayReport",
    "SharedStore",
    "TierResult",
    "Timeline",
    "TokenSource",
    "Trace",
    "UsageSplit",
    "WorkloadConfig",
    "WorkloadSummary",
    "default_sweep_pages",
    "format_instances",
    "format_report",
    "generate_workload",
    "matplotlib_available",
    "open_store",
    "plot_sweep",
    "plot_timeline",
    "read_trace",
    "replay",
    "replay_instances",
    "resolve_capacity",
    "run_replay",
    "session_keys",
    "split_requests",
    "write_trace",
]
