"""Memory-pressure control: signals in, graduated responses out (the seed's F9).

The controller reads four signals each step (:class:`Signals`): usage (pages in use / usable, what the
scheduler admits against), reservations that failed since the last step, the p95 wait of the queue, and
optionally the lower tiers' usage. When one crosses its *high* threshold the pressure level rises one
step at a time (after ``escalate_after`` consecutive high readings); it falls one step after
``relax_after`` consecutive readings with every signal under its *low* threshold. The gap between the
two thresholds is the hysteresis: a cache at 91 % does not flap between two levels every step.

Each level adds one response to the ones below it, in the seed's order; each can be switched off, and
each application is counted with the signal that triggered it (``counts``):

1. ``shrink_batch``: the running cap drops to ``shrink_factor`` of the requests running then.
2. ``evict_harder``: cached pages are evicted until ``free_target`` of the usable pages is free (room
   for the next admissions without evicting on their path), and ``pin_ttl_scale`` tells the engine to
   shorten the TTL of the pins it makes.
3. ``truncate``: requests that opt in (``Request.window``) are admitted with their prompt cut to its
   ``sink`` first tokens and its most recent ones.
4. ``refuse``: requests whose prompt is longer than ``long_request_tokens`` are refused at ``submit``
   with ``RequestRejected("overloaded", retry_after_s, needed_pages)`` (HTTP 503); shorter ones queue.
5. ``scale_out``: a signal (an event and a counter) with the pages that would have been needed, for an
   autoscaler; nothing changes inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from kvcore.exceptions import ConfigError

__all__ = ["LEVELS", "SIGNALS", "PressureConfig", "PressureController", "PressureDecision", "Signals"]

#: The responses, by the level that first applies each (level 0: none).
LEVELS = ("none", "shrink_batch", "evict_harder", "truncate", "refuse", "scale_out")
#: The signals, in the order they are named as a trigger when several are high at once.
SIGNALS = ("usage", "failed_reservations", "queue_wait", "tier_usage")


@dataclass(frozen=True)
class Signals:
    """One step's readings."""

    usage: float  # pages in use / usable pages, in [0, 1]
    failed_reservations: int  # admissions, reservations and appends refused for lack of pages, this step
    queue_wait_p95_s: float  # p95 of the waiting requests' time in the queue so far (0: queue empty)
    tier_usage: float | None = None  # occupied / all slots of the lower tiers (None: not watched)
    demand_pages: int = 0  # pages the queued requests need beyond what is free (for scale_out)


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
    max_level: int = 5  # highest level used (0..5); responses above it never apply
    shrink_batch: bool = True
    shrink_factor: float = 0.75
    min_running: int = 1
    evict_harder: bool = True
    free_target: float = 0.05
    pin_ttl_scale: float = 0.25
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
        for name in ("queue_wait_high_s", "queue_wait_low_s", "retry_after_s"):
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
    retry_after_s: float
    scale_out_pages: int | None  # pages an autoscaler should add (None: no signal)
    pin_ttl_scale: float  # multiply the TTL of new pins by this (1.0: unchanged)


@dataclass
class PressureController:
    """Graduated responses to memory pressure, with hysteresis (see the module docstring)."""

    config: PressureConfig = field(default_factory=PressureConfig)
    level: int = 0
    trigger: str | None = None
    #: ``{response: {signal: times applied}}``: each response counted with the signal that triggered it.
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    _high_run: int = 0
    _low_run: int = 0
    _cap: int | None = None
    _transitions: list[tuple[int, int, str | None]] = field(default_factory=list)

    def high_signal(self, s: Signals) -> str | None:
        """The first signal over its high threshold, or None."""
        c = self.config
        if s.usage >= c.usage_high:
            return "usage"
        if s.failed_reservations >= c.failed_reservations_high:
            return "failed_reservations"
        if s.queue_wait_p95_s >= c.queue_wait_high_s:
            return "queue_wait"
        if s.tier_usage is not None and s.tier_usage >= c.tier_usage_high:
            return "tier_usage"
        return None

    def all_low(self, s: Signals) -> bool:
        c = self.config
        return (
            s.usage <= c.usage_low
            and s.failed_reservations == 0
            and s.queue_wait_p95_s <= c.queue_wait_low_s
            and (s.tier_usage is None or s.tier_usage <= c.tier_usage_low)
        )

    def _count(self, response: str, signal: str) -> None:
        per = self.counts.setdefault(response, {})
        per[signal] = per.get(signal, 0) + 1

    def observe(self, s: Signals, num_running: int) -> PressureDecision:
        """Read one step's signals; returns what to apply (escalating or relaxing one level at most)."""
        c = self.config
        high = self.high_signal(s)
        if high is not None:
            self._low_run = 0
            self._high_run += 1
            if self._high_run >= c.escalate_after and self.level < c.max_level:
                self._high_run = 0
                self._transitions.append((self.level, self.level + 1, high))
                self.level += 1
                self.trigger = high
                response = LEVELS[self.level]
                if c.enabled(response):
                    self._count(response, high)
                if response == "shrink_batch":
                    self._cap = max(c.min_running, int(num_running * c.shrink_factor))
        else:
            self._high_run = 0
            if self.all_low(s):
                self._low_run += 1
                if self._low_run >= c.relax_after and self.level > 0:
                    self._low_run = 0
                    self._transitions.append((self.level, self.level - 1, None))
                    self.level -= 1
                    if self.level == 0:
                        self.trigger = None
                    if self.level < 1:
                        self._cap = None
            else:
                self._low_run = 0
        lvl = self.level
        scale_out = None
        if lvl >= 5 and c.enabled("scale_out") and high is not None:
            scale_out = max(s.demand_pages, 1)
            self._count("scale_out_signal", high)
        return PressureDecision(
            level=lvl,
            trigger=self.trigger,
            running_cap=self._cap if lvl >= 1 and c.enabled("shrink_batch") else None,
            evict_to_free=c.free_target if lvl >= 2 and c.enabled("evict_harder") else None,
            truncate=lvl >= 3 and c.enabled("truncate"),
            refuse_long_tokens=c.long_request_tokens if lvl >= 4 and c.enabled("refuse") else None,
            retry_after_s=c.retry_after_s,
            scale_out_pages=scale_out,
            pin_ttl_scale=c.pin_ttl_scale if lvl >= 2 and c.enabled("evict_harder") else 1.0,
        )

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
