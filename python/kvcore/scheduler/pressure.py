"""Memory-pressure control: signals in, graduated responses out (the seed's F9).

The controller reads four signals each step (:class:`Signals`): usage (pages in use / usable, what the
scheduler admits against), reservations that failed since the last step (each one a preemption or a
request left waiting), the p95 wait of the queue, and optionally the lower tiers' usage (their slots
in flight or locked under a transfer: a tier full of cached copies is a full cache, not pressure, as
HBM usage leaves cached pages out).

Two tracks, because memory and compute overloads need different answers:

- **memory** (usage, failed reservations, tier usage): when one is over its *high* threshold the level
  rises one step at a time (after ``escalate_after`` consecutive high readings spanning at least
  ``escalate_after_s`` seconds); it falls one step after ``relax_after`` readings (and
  ``relax_after_s`` seconds) with every memory signal under its *low* threshold. The gap between the
  thresholds is the hysteresis: a cache at 91 % does not flap between two levels every step.
- **queue** (the p95 wait): over its high threshold, on the same escalation rule, the controller starts
  refusing (level 4) whatever the memory level, since new requests would miss their latency target
  anyway: a shed request gets a 503 and a ``Retry-After`` at once instead of a timeout a minute later.
  Shrinking the batch would only slow a compute-bound engine down further, so the queue never does.

Each memory level adds one response to those below it, in the seed's order; each can be switched off
(the level still rises past it: it reads the pressure, and ``max_level`` caps it), and each application
is counted with the signal that triggered it (``counts``):

1. ``shrink_batch``: the running cap drops to ``shrink_factor`` of the requests running then.
2. ``evict_harder``: cached pages are evicted until ``free_target`` of the usable pages is free (room
   for the next admissions without evicting on their path), the lower tiers' store policy becomes
   more selective (``selective`` with one more use required, ``stricter_stores``; restored when the
   level falls back), the cache's pins are capped to expire within ``pin_ttl_cap_s``
   (``KVCacheManager.cap_pins``), and ``pin_ttl_scale`` tells the engine to shorten the TTL of the
   pins it makes from then on.
3. ``truncate``: requests that opt in (``Request.window``) are admitted with their prompt cut to its
   ``sink`` first tokens and its most recent ones.
4. ``refuse``: requests whose prompt is longer than ``long_request_tokens`` are refused at ``submit``
   with ``RequestRejected("overloaded", retry_after_s, needed_pages)`` (HTTP 503); while the queue
   track is high, every new request is.
5. ``scale_out``: while refusing, a signal (an event and a counter) with the pages the queue needs
   beyond what is free, for an autoscaler; nothing changes inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from kvcore.exceptions import ConfigError, InvalidArgumentError

__all__ = ["LEVELS", "SIGNALS", "PressureConfig", "PressureController", "PressureDecision", "Signals"]

#: The responses, by the level that first applies each (level 0: none).
LEVELS = ("none", "shrink_batch", "evict_harder", "truncate", "refuse", "scale_out")
#: The signals, in the order they are named as a trigger when several are high at once.
SIGNALS = ("usage", "failed_reservations", "queue_wait", "tier_usage")


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False


@dataclass(frozen=True)
class Signals:
    """One step's readings."""

    usage: float  # pages in use / usable pages, in [0, 1]
    failed_reservations: int  # admissions, reservations and appends refused for lack of pages, this step
    queue_wait_p95_s: float  # p95 of the waiting requests' time in the queue so far (0: queue empty)
    tier_usage: float | None = None  # in-flight + locked / all slots of the lower tiers (None: not watched)
    demand_pages: int = 0  # pages the queued requests need beyond what is free (for scale_out)

    def __post_init__(self) -> None:
        # A NaN reading compares false with every threshold: the controller would silently freeze.
        for name in ("usage", "queue_wait_p95_s", "tier_usage"):
            v = getattr(self, name)
            if v is None and name == "tier_usage":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise InvalidArgumentError(f"Signals.{name} must be a finite number >= 0, got {v!r}")
        for name in ("failed_reservations", "demand_pages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidArgumentError(f"Signals.{name} must be an integer >= 0, got {v!r}")


@dataclass(frozen=True)
class PressureConfig:
    """Thresholds and responses of a :class:`PressureController` (see the module docstring)."""

    usage_high: float = 0.90
    usage_low: float = 0.75
    failed_reservations_high: int = 1  # failures per step that count as high
    queue_wait_high_s: float = 5.0
    queue_wait_low_s: float = 1.0
    tier_usage_high: float = 0.95
    tier_usage_low: float = 0.80
    escalate_after: int = 2  # consecutive high readings before the level rises by one
    relax_after: int = 20  # consecutive low readings before it falls by one
    escalate_after_s: float = 0.0  # ... and for at least this long (the caller's clock)
    relax_after_s: float = 0.0
    max_level: int = 5  # highest level used (0..5); responses above it never apply
    shrink_batch: bool = True
    shrink_factor: float = 0.75
    min_running: int = 1
    evict_harder: bool = True
    free_target: float = 0.05
    pin_ttl_scale: float = 0.25
    pin_ttl_cap_s: float = 30.0  # under evict_harder, no pin outlives this many seconds from now
    stricter_stores: bool = True
    truncate: bool = True
    refuse: bool = True
    long_request_tokens: int = 8192  # prompts longer than this are refused at level 4
    retry_after_s: float = 5.0
    scale_out: bool = True

    def __post_init__(self) -> None:
        for name in ("usage_high", "usage_low", "tier_usage_high", "tier_usage_low", "free_target"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0):
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("shrink_factor", "pin_ttl_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 < v <= 1.0):
                raise ConfigError(f"{name} must be in (0, 1], got {v!r}")
        for name in (
            "queue_wait_high_s",
            "queue_wait_low_s",
            "retry_after_s",
            "escalate_after_s",
            "relax_after_s",
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be finite and >= 0, got {v!r}")
        for name, low in (
            ("failed_reservations_high", 1),
            ("escalate_after", 1),
            ("relax_after", 1),
            ("min_running", 1),
            ("long_request_tokens", 1),
            ("max_level", 0),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {v!r}")
        if self.max_level > len(LEVELS) - 1:
            raise ConfigError(f"max_level must be at most {len(LEVELS) - 1}, got {self.max_level}")
        if self.usage_low > self.usage_high or self.queue_wait_low_s > self.queue_wait_high_s:
            raise ConfigError("a low threshold is above its high threshold")
        if self.tier_usage_low > self.tier_usage_high:
            raise ConfigError("tier_usage_low is above tier_usage_high")

    def enabled(self, response: str) -> bool:
        """Whether ``response`` (one of :data:`LEVELS` but ``none``) is switched on and within max_level."""
        return LEVELS.index(response) <= self.max_level and bool(getattr(self, response))


@dataclass(frozen=True)
class PressureDecision:
    """What the scheduler applies this step."""

    level: int  # 0..5
    trigger: str | None  # the signal that raised the level last (None at level 0)
    running_cap: int | None  # the cap on running requests (None: the scheduler's own)
    evict_to_free: float | None  # keep this fraction of usable pages free (None: evict on demand)
    truncate: bool  # admit opted-in requests with their prompt cut to a window
    refuse_long_tokens: int | None  # refuse prompts longer than this at submit (None: refuse none)
    refuse_all: bool  # refuse every new request at submit (the queue is past its latency target)
    retry_after_s: float
    scale_out_pages: int | None  # pages an autoscaler should add (None: no signal)
    pin_ttl_scale: float  # multiply the TTL of new pins by this (1.0: unchanged)
    stricter_stores: bool = False  # make the lower tiers' store policy more selective
    pin_ttl_cap_s: float | None = None  # cap the cache's pins at this many seconds from now


class _Track:
    """Hysteresis of one track: consecutive high / low readings and when each run began."""

    __slots__ = ("high_run", "high_since", "low_run", "low_since")

    def __init__(self) -> None:
        self.high_run = self.low_run = 0
        self.high_since = self.low_since = 0.0

    def reading(self, high: bool, low: bool, now: float) -> None:
        if high:
            if not self.high_run:
                self.high_since = now
            self.high_run += 1
            self.low_run = 0
        elif low:
            if not self.low_run:
                self.low_since = now
            self.low_run += 1
            self.high_run = 0
        else:
            self.high_run = self.low_run = 0

    def escalates(self, steps: int, seconds: float, now: float) -> bool:
        if self.high_run >= steps and now - self.high_since >= seconds:
            self.high_run = 0
            return True
        return False

    def relaxes(self, steps: int, seconds: float, now: float) -> bool:
        if self.low_run >= steps and now - self.low_since >= seconds:
            self.low_run = 0
            return True
        return False


@dataclass
class PressureController:
    """Graduated responses to memory pressure, with hysteresis (see the module docstring).

    ``level`` is what is applied: the memory track's level (0..3), 4 while refusing (either track), 5
    while refusing and still high after another escalation period (the scale-out signal).
    """

    config: PressureConfig = field(default_factory=PressureConfig)
    level: int = 0
    trigger: str | None = None
    #: ``{response: {signal: times applied}}``: each response counted with the signal that triggered it.
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    mem_level: int = 0
    refusing: str | None = None  # the signal that started the refusals (None: not refusing)
    scaling_out: bool = False
    _mem: _Track = field(default_factory=_Track)
    _queue: _Track = field(default_factory=_Track)
    _cap: int | None = None
    _transitions: list[tuple[int, int, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        """The state a controller may start in (a restored one): ``level`` is what the tracks say."""
        c = self.config
        if not isinstance(c, PressureConfig):
            raise ConfigError(f"config must be a PressureConfig, got {type(c).__name__}")
        for name, top in (("level", len(LEVELS) - 1), ("mem_level", 3)):
            v = getattr(self, name)
            top = min(top, c.max_level)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                raise ConfigError(f"{name} must be an integer in [0, {top}], got {v!r}")
        for name in ("trigger", "refusing"):
            v = getattr(self, name)
            if v is not None and v not in SIGNALS:
                raise ConfigError(f"{name} must be None or one of {', '.join(SIGNALS)}, got {v!r}")
        if not isinstance(self.scaling_out, bool) or (self.scaling_out and self.refusing is None):
            raise ConfigError("scaling_out must be a bool, and True only while refusing")
        derived = 5 if self.scaling_out else 4 if self.refusing is not None else self.mem_level
        if self.level != derived:
            raise ConfigError(
                f"level {self.level} contradicts the tracks (mem_level {self.mem_level}, refusing "
                f"{self.refusing!r}, scaling_out {self.scaling_out}): it would be {derived}"
            )
        if not isinstance(self.counts, dict):
            raise ConfigError(f"counts must be a dict, got {type(self.counts).__name__}")

    def memory_signal(self, s: Signals) -> str | None:
        """The first memory signal over its high threshold, or None."""
        c = self.config
        if s.usage >= c.usage_high:
            return "usage"
        if s.failed_reservations >= c.failed_reservations_high:
            return "failed_reservations"
        if s.tier_usage is not None and s.tier_usage >= c.tier_usage_high:
            return "tier_usage"
        return None

    def high_signal(self, s: Signals) -> str | None:
        """The first signal over its high threshold (memory first), or None."""
        mem = self.memory_signal(s)
        if mem is not None:
            return mem
        return "queue_wait" if s.queue_wait_p95_s >= self.config.queue_wait_high_s else None

    def _memory_low(self, s: Signals) -> bool:
        c = self.config
        return (
            s.usage <= c.usage_low
            and s.failed_reservations == 0
            and (s.tier_usage is None or s.tier_usage <= c.tier_usage_low)
        )

    def _count(self, response: str, signal: str) -> None:
        per = self.counts.setdefault(response, {})
        per[signal] = per.get(signal, 0) + 1

    def observe(self, s: Signals, num_running: int, now: float = 0.0) -> PressureDecision:
        """Read one step's signals at time ``now``; returns what to apply (each track moves one level
        at most per reading)."""
        if not isinstance(s, Signals):
            raise InvalidArgumentError(f"observe takes a Signals, got {type(s).__name__}")
        if isinstance(num_running, bool) or not hasattr(num_running, "__index__") or num_running < 0:
            raise InvalidArgumentError(f"num_running must be an integer >= 0, got {num_running!r}")
        if isinstance(now, bool) or not isinstance(now, int | float) or not _finite(now):
            raise InvalidArgumentError(f"now must be a finite number of seconds, got {now!r}")
        c = self.config
        old = self.level
        mem = self.memory_signal(s)
        self._mem.reading(mem is not None, self._memory_low(s), now)
        queue_high = s.queue_wait_p95_s >= c.queue_wait_high_s
        self._queue.reading(queue_high, s.queue_wait_p95_s <= c.queue_wait_low_s, now)
        top = min(c.max_level, 3)
        if mem is not None and self._mem.escalates(c.escalate_after, c.escalate_after_s, now):
            if self.mem_level < top:
                self.mem_level += 1
                response = LEVELS[self.mem_level]
                if c.enabled(response):
                    self._count(response, mem)
                if response == "shrink_batch":
                    self._cap = max(c.min_running, int(num_running * c.shrink_factor))
                self.trigger = mem
            elif self.refusing is None and c.max_level >= 4:
                self._start_refusing(mem)  # the memory responses are spent: refuse next
            elif self.refusing is not None and not self.scaling_out and c.max_level >= 5:
                self.scaling_out = True  # refusing and still high: more capacity is needed
                if c.enabled("scale_out"):
                    self._count("scale_out", mem)
        elif mem is None and self._mem.relaxes(c.relax_after, c.relax_after_s, now) and self.mem_level > 0:
            self.mem_level -= 1
            if self.mem_level == 0:
                self._cap = None
        if queue_high and self._queue.escalates(c.escalate_after, c.escalate_after_s, now):
            if self.refusing is None and c.max_level >= 4:
                self._start_refusing("queue_wait")
            elif self.refusing is not None and not self.scaling_out and c.max_level >= 5:
                self.scaling_out = True
                if c.enabled("scale_out"):
                    self._count("scale_out", "queue_wait")
        if self.refusing is not None:
            if self.refusing == "queue_wait":  # until the queue is low again, for the relax period
                stop = not queue_high and self._queue.relaxes(c.relax_after, c.relax_after_s, now)
            else:  # memory: until its level has come down one step
                stop = self.mem_level < top
            if stop:
                self.refusing = None
                self.scaling_out = False
        self.level = 5 if self.scaling_out else 4 if self.refusing is not None else self.mem_level
        if self.level == 0:
            self.trigger = None
        if self.level != old:
            self._transitions.append((old, self.level, self.trigger if self.level > old else None))
        lvl = self.mem_level
        scale_out = None
        if self.scaling_out and c.enabled("scale_out"):
            scale_out = max(s.demand_pages, 1)
        return PressureDecision(
            level=self.level,
            trigger=self.trigger,
            running_cap=self._cap if lvl >= 1 and c.enabled("shrink_batch") else None,
            evict_to_free=c.free_target if lvl >= 2 and c.enabled("evict_harder") else None,
            truncate=lvl >= 3 and c.enabled("truncate"),
            refuse_long_tokens=c.long_request_tokens if self.refusing and c.enabled("refuse") else None,
            refuse_all=self.refusing == "queue_wait" and queue_high and c.enabled("refuse"),
            retry_after_s=c.retry_after_s,
            scale_out_pages=scale_out,
            pin_ttl_scale=c.pin_ttl_scale if lvl >= 2 and c.enabled("evict_harder") else 1.0,
            stricter_stores=lvl >= 2 and c.enabled("evict_harder") and c.stricter_stores,
            pin_ttl_cap_s=c.pin_ttl_cap_s if lvl >= 2 and c.enabled("evict_harder") else None,
        )

    def _start_refusing(self, signal: str) -> None:
        self.refusing = signal
        self.trigger = signal
        if self.config.enabled("refuse"):
            self._count("refuse", signal)

    def take_transitions(self) -> list[tuple[int, int, str | None]]:
        """Level changes since the last call: ``(from, to, trigger)`` (trigger None when relaxing)."""
        out, self._transitions = self._transitions, []
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "level": self.level,
            "trigger": self.trigger,
            "counts": {k: dict(v) for k, v in self.counts.items()},
            "config": {f.name: getattr(self.config, f.name) for f in fields(self.config)},
        }
