"""Prometheus metrics of a cache, its lower tiers and its scheduler, through ``prometheus-client``.

Operators scrape kvcore the way they scrape everything else: :class:`KVCoreCollector` is a
``prometheus_client`` collector that reads the live objects at each scrape (nothing is kept or updated
on kvcore's hot paths), and :func:`serve` exposes it over HTTP, on 127.0.0.1 unless told otherwise::

    from kvcore.metrics import KVCoreCollector, serve
    server = serve(9400, KVCoreCollector(cache, scheduler=sched, mover=mover))
    ...
    server.shutdown()

Series (prefix ``kvcore``; fields in ``docs/api.md``):

- ``kvcore_pages{state}``: the HBM usage split (in_use / cached / pinned / free; they sum to the
  usable pages); ``kvcore_usage`` (in use / usable, what admission sees); ``kvcore_sequences``;
- ``kvcore_prefix_query_tokens_total``, ``kvcore_prefix_hit_tokens_total``, ``kvcore_prefix_hit_rate``:
  hit rates in tokens; ``kvcore_evicted_pages_total``, ``kvcore_cow_copies_total``,
  ``kvcore_refused_total``;
- per lower tier: ``kvcore_tier_slots{tier,state}`` (cached / in_flight / free; they sum to the tier's
  slots), ``kvcore_tier_slots_bad{tier}`` and ``kvcore_tier_slots_locked{tier}`` (subsets of the cached
  slots, so families of their own), ``kvcore_tier_*_total{tier}`` (stored, loaded, failed, hit tokens,
  evictions, restores, bad slots dropped), ``kvcore_tier_store_skipped_pages_total{tier,reason}``,
  and with a mover the storage's own stats ``kvcore_tier_storage_*{tier}``: counters ending ``_total``
  (``kvcore_tier_storage_stores_total``), levels as gauges (``kvcore_tier_storage_bytes``);
- with a scheduler: ``kvcore_requests{state}`` (running / waiting / loading),
  ``kvcore_requests_rejected_total{reason}``, ``kvcore_requests_finished_total{reason}``,
  ``kvcore_preemptions_total{kind}`` (swap / recompute), ``kvcore_preemption_tax``,
  ``kvcore_computed_tokens_total``, ``kvcore_recomputed_tokens_total``, ``kvcore_pressure_level``,
  ``kvcore_pressure_responses_total{response,signal}``;
- with ``miss_ratio_curve=`` on: ``kvcore_mrc_hit_rate{size_pages}``, the prompt-token hit rate an LRU
  cache of that many pages would have had (HBM x 1/8 .. 16, HBM plus each lower tier, the largest
  reuse distance), and ``kvcore_mrc_sample_rate``;
- ``kvcore_tenant_pages{tenant,default_namespace}``: pages held by each tenant's running requests, only
  with ``tenant_labels=True``: namespace names are the tenants' own, and never leave kvcore unless asked.
  The default namespace (``None``) is ``tenant="",default_namespace="true"``; every named namespace,
  ``""`` included, is ``tenant=<its name>,default_namespace="false"``, so no name can collide with it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import socket
import socketserver
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from kvcore.exceptions import ConfigError
from kvcore.manager import CacheStats, MissRatioCurve

__all__ = ["KVCoreCollector", "MetricsServer", "metrics_text", "serve"]

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
    (
        "num_dropped_bad_slots",
        "dropped_bad_slots",
        "Slots dropped after their load failed (with the slots after them in their run).",
    ),
)


# Overlapping subsets of a tier's slots, exported apart from the cached / in_flight / free split.
_TIER_SLOT_SUBSETS = (
    ("bad", "Cached slots of each lower tier whose load failed (invisible to lookups; evicted in time)."),
    ("locked", "Slots of each lower tier locked by loads in flight or stores below them (not evictable)."),
)


def _cache_families(stats: CacheStats, prefix: str) -> Iterator[Metric]:
    pages = GaugeMetricFamily(
        f"{prefix}_pages", "Pages of the KV pool by state (they sum to the usable pages).", labels=["state"]
    )
    for state in ("in_use", "cached", "pinned", "free"):
        pages.add_metric([state], getattr(stats, f"num_pages_{state}"))
    yield pages
    yield GaugeMetricFamily(
        f"{prefix}_usage", "Pages in use / usable pages (what admission sees).", stats.usage
    )
    yield GaugeMetricFamily(f"{prefix}_sequences", "Live sequences.", stats.num_sequences)
    for name, help_text in _COUNTERS:
        yield CounterMetricFamily(f"{prefix}_{name.removeprefix('num_')}", help_text, getattr(stats, name))
    yield GaugeMetricFamily(
        f"{prefix}_prefix_hit_rate", "Cached fraction of looked-up prompt tokens.", stats.hit_rate
    )


def _mrc_families(curve: MissRatioCurve | None, prefix: str) -> Iterator[Metric]:
    if curve is None:
        return
    fam = GaugeMetricFamily(
        f"{prefix}_mrc_hit_rate",
        "Prompt-token hit rate an LRU cache of size_pages pages would have had (miss-ratio curve).",
        labels=["size_pages"],
    )
    for size, rate in zip(curve.sizes_pages.tolist(), curve.hit_rate.tolist(), strict=True):
        fam.add_metric([str(size)], rate)
    yield fam
    yield GaugeMetricFamily(
        f"{prefix}_mrc_sample_rate",
        "Share of pages the miss-ratio curve samples (1: exact).",
        curve.sample_rate,
    )


def _tier_families(
    tiers: Mapping[str, Mapping[str, int]], storage: Mapping[str, Mapping[str, int]] | None, prefix: str
) -> Iterator[Metric]:
    if not tiers:
        return
    slots = GaugeMetricFamily(
        f"{prefix}_tier_slots",
        "Slots of each lower tier by state (cached + in_flight + free = all).",
        labels=["tier", "state"],
    )
    for name, t in tiers.items():
        for state in ("cached", "in_flight", "free"):
            slots.add_metric([name, state], t[f"num_slots_{state}"])
    yield slots
    # Bad and locked slots are subsets of the cached ones: each has a family of its own, so that
    # ``sum by (tier)`` over ``tier_slots`` stays the tier's slots (as ``pages`` sums to the pool).
    for state, help_text in _TIER_SLOT_SUBSETS:
        subset = GaugeMetricFamily(f"{prefix}_tier_slots_{state}", help_text, labels=["tier"])
        for name, t in tiers.items():
            subset.add_metric([name], t[f"num_slots_{state}"])
        yield subset
    for key, metric, help_text in _TIER_COUNTERS:
        fam = CounterMetricFamily(f"{prefix}_tier_{metric}", help_text, labels=["tier"])
        for name, t in tiers.items():
            fam.add_metric([name], t.get(key, 0))  # a hand-made dict may predate a counter
        yield fam
    skipped = CounterMetricFamily(
        f"{prefix}_tier_store_skipped_pages",
        "Pages not stored, by reason (never silently).",
        labels=["tier", "reason"],
    )
    for name, t in tiers.items():
        for reason in ("no_room", "in_flight"):
            skipped.add_metric([name, reason], t[f"num_store_skipped_{reason}"])
    yield skipped
    yield from _storage_families(storage or {}, prefix)


# Storage stats that are levels, not counts (HostTier, DiskTier, RedisTier): exported as gauges.
_STORAGE_GAUGES = frozenset({"num_slots", "slots_used", "bytes", "capacity_bytes", "nodes", "nodes_down"})


@functools.cache
def _storage_counter_names() -> frozenset[str]:
    """The stats the built-in storage tiers only ever count up: exported as counters (``_total``)."""
    from kvcore.tiers import disk, host, remote

    names = {*host._STAT_NAMES, *disk._STAT_NAMES, *remote._STAT_NAMES}
    return frozenset(names - _STORAGE_GAUGES)


def _storage_families(storage: Mapping[str, Mapping[str, int]], prefix: str) -> Iterator[Metric]:
    """``{prefix}_tier_storage_<stat>{tier}``: each storage tier's own stats.

    The built-in tiers' monotonic stats are counters (``..._stores_total``); their levels (``bytes``,
    ``slots_used``, ...) and any stat kvcore does not know (a custom tier's) are gauges, since nothing
    says they only grow. A stat name that is not a valid metric name is sanitised (every character but
    ``[A-Za-z0-9_]`` becomes ``_``); when two stats would then give the same series (``a-b`` and ``a_b``
    of one tier, or a counter's ``x_total`` and a gauge ``x_total``), the first one kept wins, in this
    order: tiers in order, the built-in tiers' stats first, then the other valid names, then sanitised
    ones, each in sorted order. The others
    are left out, so one scrape never holds a series twice or a family of two types.
    """
    counters = _storage_counter_names()
    known = counters | _STORAGE_GAUGES
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    taken: set[str] = set()  # every sample name of the families made so far
    seen: set[tuple[str, str]] = set()  # (family name, tier) already exported
    for tier, stats in storage.items():
        items = [(k, v) for k, v in stats.items() if isinstance(k, str) and k]
        items.sort(key=lambda kv: (kv[0] not in known, _METRIC_CHARS.sub("_", kv[0]) != kv[0], kv[0]))
        for key, value in items:
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            stat = _METRIC_CHARS.sub("_", key)
            counter = key in counters
            name = f"{prefix}_tier_storage_{stat}"
            family = families.get(name)
            if family is None:
                samples = {name, f"{name}_total", f"{name}_created"} if counter else {name}
                if samples & taken or (counter and name.endswith("_total")):
                    continue
                taken |= samples
                make = CounterMetricFamily if counter else GaugeMetricFamily
                kind = "counter" if counter else "gauge"
                family = families[name] = make(
                    name, f"The storage tier's own {stat} {kind}.", labels=["tier"]
                )
            elif (family.type == "counter") != counter or (name, tier) in seen:
                continue
            seen.add((name, tier))
            family.add_metric([tier], value)
    yield from families.values()


_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_]")


def _scheduler_families(sched: Any, prefix: str, tenant_labels: bool) -> Iterator[Metric]:
    s = sched.stats()
    reqs = GaugeMetricFamily(f"{prefix}_requests", "Live requests by state.", labels=["state"])
    for state in ("running", "waiting", "loading"):
        reqs.add_metric([state], getattr(s, f"num_{state}"))
    yield reqs
    rej = CounterMetricFamily(
        f"{prefix}_requests_rejected", "Requests refused, by reason.", labels=["reason"]
    )
    for reason, n in sorted(s.rejected_by_reason.items()):
        rej.add_metric([reason], n)
    yield rej
    fin = CounterMetricFamily(f"{prefix}_requests_finished", "Requests ended, by reason.", labels=["reason"])
    for reason, n in sorted(s.finished_by_reason.items()):
        fin.add_metric([reason], n)
    yield fin
    pre = CounterMetricFamily(f"{prefix}_preemptions", "Preemptions, by kind.", labels=["kind"])
    for kind, n in sorted(s.preemptions_by_kind.items()):
        pre.add_metric([kind], n)
    yield pre
    yield GaugeMetricFamily(
        f"{prefix}_preemption_tax", "Recomputed tokens / computed tokens since start.", s.preemption_tax
    )
    yield CounterMetricFamily(
        f"{prefix}_computed_tokens", "Tokens the engine was asked to compute.", s.computed_tokens
    )
    yield CounterMetricFamily(
        f"{prefix}_recomputed_tokens", "Computed tokens recomputed after a preemption.", s.recomputed_tokens
    )
    yield GaugeMetricFamily(f"{prefix}_pressure_level", "The pressure controller's level (0-5).", s.level)
    ctl = getattr(sched, "controller", None)
    resp = CounterMetricFamily(
        f"{prefix}_pressure_responses",
        "Pressure responses applied, with the signal that triggered each.",
        labels=["response", "signal"],
    )
    if ctl is not None:
        for response, per in sorted(ctl.counts.items()):
            for signal, n in sorted(per.items()):
                resp.add_metric([response, signal], n)
    yield resp
    if tenant_labels:
        ten = GaugeMetricFamily(
            f"{prefix}_tenant_pages",
            "Pages held by each tenant's running requests.",
            labels=["tenant", "default_namespace"],
        )
        # None (the default namespace) and "" are two tenants: a label of its own tells them apart,
        # where any spelling of None in ``tenant`` could be some tenant's real name.
        # tenant_pages, not _tenant_pages: a scrape runs in the server's thread, and must not write
        # the scheduler's lazy decode counts while the engine's thread steps (it raised there)
        for ns, n in sorted(sched.tenant_pages().items(), key=lambda kv: (kv[0] is not None, kv[0] or "")):
            ten.add_metric(["", "true"] if ns is None else [ns, "false"], n)
        yield ten


class KVCoreCollector:
    """A ``prometheus_client`` collector of a cache (and optionally its scheduler and mover), read at
    each scrape. Register it (``REGISTRY.register(c)``) or pass it to :func:`serve`."""

    def __init__(
        self,
        cache: Any,
        *,
        scheduler: Any = None,
        mover: Any = None,
        prefix: str = "kvcore",
        tenant_labels: bool = False,
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.mover = mover
        self.prefix = prefix
        self.tenant_labels = tenant_labels

    def collect(self) -> Iterator[Metric]:
        yield from _cache_families(self.cache.stats(), self.prefix)
        yield from _mrc_families(self.cache.miss_ratio_curve(), self.prefix)
        tiers = self.cache.tier_stats() if self.cache.tier_names else {}
        storage = self.mover.storage_stats() if self.mover is not None else None
        yield from _tier_families(tiers, storage, self.prefix)
        if self.scheduler is not None:
            yield from _scheduler_families(self.scheduler, self.prefix, self.tenant_labels)


class _Snapshot:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def metrics_text(
    stats: CacheStats,
    prefix: str = "kvcore",
    tiers: Mapping[str, Mapping[str, int]] | None = None,
    storage: Mapping[str, Mapping[str, int]] | None = None,
    mrc: MissRatioCurve | None = None,
) -> str:
    """Render ``stats`` (and the lower tiers' ``tiers`` / ``storage`` counters and the miss-ratio
    curve ``mrc``, if given) in the Prometheus text format, as ``prometheus_client`` writes it."""
    families = [
        *_cache_families(stats, prefix),
        *_mrc_families(mrc, prefix),
        *_tier_families(tiers or {}, storage, prefix),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))  # type: ignore[arg-type]
    return generate_latest(registry).decode("utf-8")


MAX_CONNECTIONS = 64  # connections served at once; more are closed at once (never queued)
CONNECTION_TIMEOUT_S = 10.0  # the longest wait for a client's next bytes
CONNECTION_DEADLINE_S = 30.0  # the longest a connection is served, however its bytes trickle in


class _QuietHandler(WSGIRequestHandler):
    """One scrape: a socket timeout on every read and write (``timeout``), the connection shut down
    ``deadline_s`` after it began whatever it is doing (a client trickling a byte every few seconds
    would never meet the timeout), nothing logged."""

    timeout = CONNECTION_TIMEOUT_S
    deadline_s = CONNECTION_DEADLINE_S

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(self.deadline_s, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        # shutdown (not close): a read or write blocked in the handler's thread returns at once
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._deadline.cancel()
        with contextlib.suppress(OSError):  # a client gone, or cut by the deadline
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer(socketserver.ThreadingMixIn, WSGIServer):
    """The server :func:`serve` returns: a thread per connection, at most ``max_connections`` at once
    (more are closed as they come), each read and write timed out after ``CONNECTION_TIMEOUT_S`` and
    each connection cut ``CONNECTION_DEADLINE_S`` after it began, so a client that connects and sends
    nothing, or trickles, holds one thread and one descriptor for seconds, and many of them never
    starve the engine's process of descriptors (nor lock scrapes out for longer than the deadline).
    ``shutdown()`` stops serving and closes the listening socket (the port is free again when it
    returns)."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    # The listen backlog: socketserver's 5 made a burst of clients wait out 1 s SYN retries.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._thread: threading.Thread | None = None
        super().__init__(address, _QuietHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: closed now, not queued behind the others
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out, went away or was cut by the deadline is no error worth a
        traceback on the engine's stderr; anything else is reported as the base class does."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def start(self) -> None:
        """Serve from a daemon thread of its own (what :func:`serve` does)."""
        self._thread = threading.Thread(target=self.serve_forever, name="kvcore-metrics", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving, close the listening socket and wait for the serving thread (a server never
        started: only closed)."""
        if self._thread is not None:
            super().shutdown()
            self._thread.join()
        self.server_close()


def serve(port: int, collector: KVCoreCollector, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``collector`` at ``http://addr:port/metrics`` from a daemon thread (``port=0``: any free
    port, ``server.server_port`` tells which). Loopback by default: exposing metrics beyond the host is
    the operator's choice. Returns the :class:`MetricsServer` (``shutdown()`` stops it and frees the
    port).

    Raises:
        ConfigError: a port outside ``[0, 65535]``, an address that does not resolve, or one that
            cannot be listened on (the port in use, no permission).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port: expected an integer in [0, 65535], got {port!r}")
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server = MetricsServer((addr, port), family)
    except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError
        raise ConfigError(f"metrics: cannot listen on {addr!r} port {port}: {e}") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    server.set_app(make_wsgi_app(registry))
    server.start()
    return server
