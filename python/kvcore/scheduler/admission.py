"""Admission that predicts demand: how many output tokens a request will still generate.

Reserving every request's ``max_new_tokens`` up front (TensorRT-LLM's ``GUARANTEED_NO_EVICT``) wastes
most of the cache on chat traffic, whose answers are far shorter than their caps; reserving nothing
(vLLM V1) admits until decode runs out of pages and preempts. SGLang's ``new_token_ratio`` sits between
them with one global ratio. :class:`OutputLengthEstimator` generalises it: online quantiles of the
observed output lengths *per request class* (a chat class, a summarisation class, ...), so the scheduler
reserves, for each request, the output length that a fraction ``1 - target_preemption_prob`` of its
class stayed under.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError, InvalidArgumentError
from kvcore.scheduler.request import is_int

__all__ = ["OutputLengthEstimator", "PageModel"]


class OutputLengthEstimator:
    """Online quantiles of output lengths per request class, over the last ``window`` finished requests
    of each class.

    ``expected(cls, max_new_tokens, generated)`` is the output length to plan for: the class quantile
    (``quantile``, e.g. 0.95 for a 5 % target preemption probability) once ``min_samples`` answers of the
    class have been seen, and before that ``max_new_tokens`` capped at ``clip`` (SGLang's
    ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096). Never below ``generated + 1`` (the request is still
    running) nor above ``max_new_tokens``.
    """

    def __init__(
        self, quantile: float = 0.95, *, window: int = 1024, min_samples: int = 16, clip: int = 4096
    ) -> None:
        if isinstance(quantile, bool) or not (isinstance(quantile, (int, float)) and 0.0 < quantile <= 1.0):
            raise ConfigError(f"quantile must be in (0, 1], got {quantile!r}")
        for name, value in (("window", window), ("min_samples", min_samples), ("clip", clip)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        self.quantile = float(quantile)
        self.window = window
        self.min_samples = min(min_samples, window)
        self.clip = clip
        self._order: dict[str, deque[int]] = {}  # per class: lengths in arrival order (the window)
        self._sorted: dict[str, list[int]] = {}  # per class: the same lengths, sorted
        self._cached: dict[str, int] = {}  # per class: the quantile, until the next observation

    def observe(self, request_class: str, output_len: int) -> None:
        """Record a finished request's output length (tokens generated, an integer >= 0)."""
        if not isinstance(request_class, str):
            raise InvalidArgumentError(f"request_class must be a str, got {type(request_class).__name__}")
        n = output_len
        if not is_int(n) or n < 0:
            raise InvalidArgumentError(f"output_len must be an integer >= 0, got {n!r}")
        output_len = int(n)
        order = self._order.setdefault(request_class, deque())
        ranked = self._sorted.setdefault(request_class, [])
        if len(order) == self.window:
            old = order.popleft()
            del ranked[bisect.bisect_left(ranked, old)]
        order.append(output_len)
        bisect.insort(ranked, output_len)
        self._cached.pop(request_class, None)

    def quantile_of(self, request_class: str) -> int | None:
        """The class's output-length quantile, or None with fewer than ``min_samples`` samples."""
        q = self._cached.get(request_class)
        if q is not None:
            return q
        ranked = self._sorted.get(request_class)
        if not ranked or len(ranked) < self.min_samples:
            return None
        q = ranked[min(len(ranked) - 1, max(0, math.ceil(self.quantile * len(ranked)) - 1))]
        self._cached[request_class] = q
        return q

    def expected(self, request_class: str, max_new_tokens: int, generated: int = 0) -> int:
        """Output tokens to plan for in total (see the class docstring)."""
        q = self.quantile_of(request_class)
        planned = min(max_new_tokens, self.clip) if q is None else q
        return min(max_new_tokens, max(planned, generated + 1))

    def num_samples(self, request_class: str) -> int:
        return len(self._order.get(request_class, ()))


class PageModel:
    """Pages a request holds over every KV-cache group of its manager, for admission's predictions.

    Every token takes a slot in each group (one shared pool): a full-attention group holds a page per
    ``page_size`` tokens, a sliding-window group of ``W`` tokens only the pages its window still needs
    (the manager releases a window page once no query to come reads it: see ``KVCacheManager(groups=)``).
    With one full group every count is the plain ``ceil(tokens / page_size)``, as before groups.

    - :meth:`held`: a decoding request of ``n`` tokens (all but its last computed; :meth:`holding` for
      any count computed), exactly what the manager holds for it: ``ceil(n / ps)`` per full group and
      ``ceil(n / ps) - max(0, n - W) // ps`` per window group; :meth:`peak`, the most it holds at any
      length up to ``n`` (``min(ceil(n / ps), (W - 2) // ps + 2)`` per window group).
    - :meth:`prompt`: the most a prompt of ``n`` tokens holds while its chunks of ``chunk`` tokens are
      computed (a window group holds the chunk's pages and the window's before it until the chunk is
      committed): at most ``(W + chunk - 3) // ps + 2`` pages per window group.
    - :meth:`hit`: the pages of an ``h``-token cached prefix an admission takes from the cache rather
      than allocating: all of them per full group, per window group those its window still needs
      (``h // ps - max(0, h + 1 - W) // ps``).
    """

    __slots__ = ("caps", "chunk_caps", "full", "page_size", "plain", "windows")

    def __init__(self, windows: list[int | None], page_size: int, chunk: int) -> None:
        ps = page_size
        self.page_size = ps
        self.full = sum(1 for w in windows if w is None)
        self.windows = [int(w) for w in windows if w is not None]
        self.plain = self.full == 1 and not self.windows
        # The most a window group holds: at a token's step, from the page of the window's first key
        # to the token's page (decode), or to the chunk's last page (prefill): exact bounds.
        self.caps = [(w - 2) // ps + 2 for w in self.windows]
        self.chunk_caps = [(w + chunk - 3) // ps + 2 for w in self.windows]

    def held(self, n: int) -> int:
        return self.holding(n, n - 1)

    def holding(self, reserved: int, computed: int) -> int:
        """What a request with ``reserved`` slots holds once ``computed`` tokens are committed."""
        p = -(-reserved // self.page_size)
        if self.plain:
            return p
        ps = self.page_size
        return self.full * p + sum(p - max(0, computed + 1 - w) // ps for w in self.windows)

    def peak(self, n: int) -> int:
        """The most a decoding request holds at any length up to ``n`` (a window group's count dips by
        one page where a page leaves its window before the next one fills, so :meth:`held` is not
        monotonic: planning an answer to ``n`` tokens must take its peak)."""
        p = -(-n // self.page_size)
        if self.plain:
            return p
        return self.full * p + sum(min(p, c) for c in self.caps)

    def peak_array(self, n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`peak` of each count in ``n``."""
        p = (n + (self.page_size - 1)) // self.page_size
        out = self.full * p
        for c in self.caps:
            out = out + np.minimum(p, c)
        return out

    def held_array(self, n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`held` of each count in ``n``."""
        ps = self.page_size
        p = (n + (ps - 1)) // ps
        out = self.full * p
        for w in self.windows:
            out = out + p - np.maximum(n - w, 0) // ps
        return out

    def prompt(self, n: int) -> int:
        p = -(-n // self.page_size)
        if self.plain:
            return p
        return self.full * p + sum(min(p, c) for c in self.chunk_caps)

    def hit(self, h: int) -> int:
        p = h // self.page_size
        if self.plain:
            return p
        return self.full * p + sum(p - max(0, h + 1 - w) // self.page_size for w in self.windows)
