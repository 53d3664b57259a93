"""The continuous-batching scheduler and its memory-pressure controller (F9, F5).

- :class:`Scheduler`: ``submit(request, now)`` / ``step(now) -> StepPlan`` / ``update(plan, tokens)`` /
  ``finish(request_id)``; FCFS or priority queues, a token budget per step (chunked prefill), a cap on
  running requests, admission that predicts demand, preemption by swap or recompute, tenant quotas.
- :class:`PressureController`: signals (usage, failed reservations, queue wait, tier usage) with
  hysteresis, and the seed's graduated responses (shrink the batch, evict harder, truncate to a window,
  refuse long requests, signal scale-out).
- :class:`OutputLengthEstimator`: online output-length quantiles per request class.
- :class:`~kvcore.exceptions.RequestRejected`: a refusal, with its HTTP status (429 / 503).

No clock and no metrics inside: the caller passes ``now``; every decision is a
:class:`SchedulerEvent`, and :meth:`Scheduler.stats` counts them.
"""

from __future__ import annotations

from kvcore.exceptions import REJECTION_STATUS, RequestRejected
from kvcore.scheduler.admission import OutputLengthEstimator
from kvcore.scheduler.core import FINISH_REASONS, QUEUE_POLICIES, Scheduler, SchedulerStats, SwapCost
from kvcore.scheduler.pressure import (
    LEVELS,
    SIGNALS,
    PressureConfig,
    PressureController,
    PressureDecision,
    Signals,
)
from kvcore.scheduler.request import EVENT_KINDS, MAX_SEQ_LEN, Request, SchedulerEvent, StepPlan

__all__ = [
    "EVENT_KINDS",
    "FINISH_REASONS",
    "LEVELS",
    "MAX_SEQ_LEN",
    "QUEUE_POLICIES",
    "REJECTION_STATUS",
    "SIGNALS",
    "OutputLengthEstimator",
    "PressureConfig",
    "PressureController",
    "PressureDecision",
    "Request",
    "RequestRejected",
    "Scheduler",
    "SchedulerEvent",
    "SchedulerStats",
    "Signals",
    "StepPlan",
    "SwapCost",
]
