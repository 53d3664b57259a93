"""A one-line progress bar on stderr, with no dependency.

Why our own: a replay loop calls it thousands of times a second, so an update must cost a comparison
and a clock read; and ``tqdm`` is not a dependency of kvcore. The bar redraws at most ten times a
second, only when enabled (stderr is a terminal, or ``--progress``), and clears its line when done so
the report that follows starts clean (in a log, it leaves one final line instead).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24  # characters of the bar itself


class Progress:
    """Progress of one task out of ``total`` units (requests), drawn as ``label [####----] 42% ...``.

    ``enabled=None`` draws only when ``stream`` is a terminal. A disabled bar costs one attribute
    check per :meth:`update`.
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        min_interval_s: float = 0.1,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(self.stream.isatty()) if enabled is None else enabled
        self.total = max(total, 1)
        self.label = label
        self.min_interval_s = min_interval_s
        self._start = time.monotonic()
        self._next_draw = self._start  # the first update draws
        self._drawn = False

    def update(self, done: int) -> None:
        """``done`` units finished so far (absolute, not an increment)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next_draw:
            return
        self._next_draw = now + self.min_interval_s
        self._draw(done, now)

    def _draw(self, done: int, now: float) -> None:
        frac = min(max(done / self.total, 0.0), 1.0)
        filled = int(frac * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        elapsed = now - self._start
        line = f"\r{self.label} [{bar}] {frac:4.0%} {done:,}/{self.total:,} requests {elapsed:5.1f} s"
        self.stream.write(line)
        self.stream.flush()
        self._drawn = True

    def close(self, done: int | None = None) -> None:
        """End the bar: on a terminal, clear its line; elsewhere (a log), leave a final line."""
        if not self._drawn:
            return
        if self.stream.isatty():
            self.stream.write("\r\x1b[2K")
        else:
            self._draw(self.total if done is None else done, time.monotonic())
            self.stream.write("\n")
        self.stream.flush()
        self._drawn = False
