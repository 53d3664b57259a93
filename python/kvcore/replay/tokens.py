"""Token ids for a trace's hash ids, built fast enough to replay 145 M tokens in about a second.

Traces carry no text, only prefix-chained block ids, but the manager matches token ids. The rule:
block ``h`` holds the tokens ``h * block_size + [0, block_size)`` (the last block of a prompt is cut
to the prompt's length). So the same id always gives the same tokens, and different ids give
disjoint tokens, hence different page contents at every page size that divides the block (and at
every larger page size too, since a page then spans whole blocks). Ids are remapped to ``0..U-1``
first when the largest one would overflow ``uint32`` tokens.

Why runs: real traces number new blocks consecutively, so a prompt's ids are a few runs
``h, h+1, h+2, ...`` whose tokens form one contiguous integer range. Each run is one vectorized add
of a ramp into a reused buffer (no allocation, no page faults), about 0.1 s for the whole
conversation trace. Tokens are ``uint32``: the manager reads them in place without a sign check.

Why lazy: lengths come from the trace, and an 80-byte line may ask for 10**9 output tokens. Nothing here
is sized by a length up front: the buffers grow to the longest request actually built, answers without
ids of their own are never materialized, and the engine builds only what fits its cache (a decode
chunk at a time for answers), so memory follows the capacity and the file, never a number in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError, TraceFormatError
from kvcore.replay.trace import MAX_REQUEST_TOKENS, Trace

__all__ = ["TokenSource"]

_U32 = npt.NDArray[np.uint32]
_TOKEN_LIMIT = MAX_REQUEST_TOKENS  # tokens are uint32: 2**32 distinct ids


@dataclass(frozen=True)
class _Runs:
    """Runs of consecutive ids of every request, as flat Python lists (the replay loop indexes them)."""

    indptr: list[int]  # [num_requests + 1] request i's runs are [indptr[i], indptr[i + 1])
    starts: list[int]  # [num_runs] first token of the run, relative to the request's first token
    ends: list[int]  # [num_runs] one past its last token (cut to the request's length)
    bases: list[int]  # [num_runs] token id of the run's first token (id * block_size)


def _runs(
    ids: npt.NDArray[np.int64], indptr: npt.NDArray[np.int64], lens: npt.NDArray[np.int64], bs: int
) -> _Runs:
    n = len(lens)
    if len(ids) == 0:
        return _Runs([0] * (n + 1), [], [], [])
    brk = np.ones(len(ids), dtype=bool)
    brk[1:] = np.diff(ids) != 1
    first = indptr[:-1][indptr[:-1] < len(ids)]
    brk[first] = True  # every request starts a run
    start_idx = np.flatnonzero(brk)
    end_idx = np.append(start_idx[1:], len(ids))
    req = np.searchsorted(indptr, start_idx, side="right") - 1
    # A run never crosses a request: the next request's first id is a break.
    end_idx = np.minimum(end_idx, indptr[req + 1])
    starts = (start_idx - indptr[req]) * bs
    ends = np.minimum((end_idx - indptr[req]) * bs, lens[req])
    run_indptr = np.searchsorted(start_idx, indptr, side="left")
    return _Runs(run_indptr.tolist(), starts.tolist(), ends.tolist(), (ids[start_idx] * bs).tolist())


def _fresh_runs(
    first_id: int, first_block: npt.NDArray[np.int64], lens: npt.NDArray[np.int64], bs: int
) -> _Runs:
    """Runs of answers that have no ids in the trace: request ``i``'s answer is the consecutive blocks
    ``first_id + first_block[i] + [0, ceil(lens[i] / bs))``, so one run (none when ``lens[i]`` is 0)."""
    has = lens > 0  # [num_requests]
    indptr = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(has, out=indptr[1:])
    ends: list[int] = lens[has].tolist()
    bases: list[int] = ((first_id + first_block[has]) * bs).tolist()
    return _Runs(indptr.tolist(), [0] * len(ends), ends, bases)


def _dense(
    ids: npt.NDArray[np.int64], num_extra: int, bs: int, name: str
) -> tuple[npt.NDArray[np.int64], int]:
    """``ids`` renumbered ``0..U-1`` (same id, same number; order kept), and ``U``; refused when ``U``
    blocks plus ``num_extra`` more do not fit uint32 token ids."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    if (len(uniq) + num_extra) * bs > _TOKEN_LIMIT:
        answers = f", {num_extra:,} of them for the answers' output_length" if num_extra else ""
        raise TraceFormatError(
            f"{name}: {len(uniq) + num_extra:,} distinct blocks of {bs} tokens{answers} do not fit uint32 "
            "token ids"
        )
    return inverse.astype(np.int64, copy=False), len(uniq)


class TokenSource:
    """Prompt and answer token ids of every request of a trace (``uint32``, see the module docs).

    Answers: a trace's ``output_ids`` when it has them (the generator's, so that a later turn which
    repeats an answer finds it cached); otherwise fresh ids after the largest prompt id, so each answer
    is unique, as it would be for a trace that does not link turns.

    ``answers=False``: prompts only (a sequential replay generates nothing): no token ids are set
    aside for the answers, so a trace whose ``output_length`` values would not leave room for them in
    uint32 is still replayed; the answer calls then raise ConfigError.

    Raises:
        TraceFormatError: the distinct blocks of the trace (and its answers') do not fit uint32 token ids.
    """

    def __init__(self, trace: Trace, *, answers: bool = True) -> None:
        bs = trace.block_size
        prompt_ids = trace.hash_ids
        top_prompt = int(prompt_ids.max()) if len(prompt_ids) else -1
        self.has_answers = answers
        if not answers:
            if (top_prompt + 1) * bs > _TOKEN_LIMIT:
                prompt_ids, _ = _dense(prompt_ids, 0, bs, trace.name)
            self._output = _Runs([0] * (trace.num_requests + 1), [], [], [])
        elif trace.output_ids is not None and trace.output_indptr is not None:
            out_ids = trace.output_ids
            top = max(top_prompt, int(out_ids.max()) if len(out_ids) else -1)
            if (top + 1) * bs > _TOKEN_LIMIT:
                # Dense ids keep the token ranges disjoint; the same id still maps to the same tokens.
                both, _ = _dense(np.concatenate([prompt_ids, out_ids]), 0, bs, trace.name)
                prompt_ids, out_ids = both[: len(prompt_ids)], both[len(prompt_ids) :]
            self._output = _runs(out_ids, trace.output_indptr, trace.output_lens, bs)
        else:
            first_block = np.zeros(trace.num_requests + 1, dtype=np.int64)  # [num_requests + 1]
            np.cumsum(-(-trace.output_lens // bs), out=first_block[1:])
            num_fresh = int(first_block[-1])
            first_fresh = top_prompt + 1
            if (first_fresh + num_fresh) * bs > _TOKEN_LIMIT:
                prompt_ids, first_fresh = _dense(prompt_ids, num_fresh, bs, trace.name)
            self._output = _fresh_runs(first_fresh, first_block[:-1], trace.output_lens, bs)
        self.block_size = bs
        self._prompt = _runs(prompt_ids, trace.hash_indptr, trace.input_lens, bs)
        self._input_lens: list[int] = trace.input_lens.tolist()
        self._output_lens: list[int] = trace.output_lens.tolist()
        # Grown on demand (see the module docs), never shrunk.
        self._ramp: _U32 = np.arange(1, dtype=np.uint32)  # [>= longest run built] 0, 1, 2, ...
        self._buf: _U32 = np.empty(1, dtype=np.uint32)  # [>= longest prompt built] the last prompt
        self._answer: _U32 = np.empty(1, dtype=np.uint32)  # [>= longest answer range] the last range
        # answer_at's tables, built at its first call: [num_requests] int64 each.
        self._answer_base: npt.NDArray[np.int64] | None = None
        self._answer_lens: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._answer_single = False  # every request's answer is one run (or empty)

    def _need_answers(self) -> None:
        if not self.has_answers:
            raise ConfigError("this TokenSource was built with answers=False (prompts only)")

    @staticmethod
    def _grown(buf: _U32, n: int) -> _U32:
        """``buf`` if it holds ``n`` tokens, else a new one of at least ``n`` (doubling, so a workload of
        growing prompts reallocates a few times only)."""
        if len(buf) >= n:
            return buf
        return np.empty(max(n, min(2 * len(buf), _TOKEN_LIMIT)), dtype=np.uint32)

    def _ramp_for(self, n: int) -> _U32:
        if len(self._ramp) < n:
            self._ramp = np.arange(len(self._grown(self._ramp, n)), dtype=np.uint32)
        return self._ramp

    def _fill(self, runs: _Runs, i: int, out: _U32, n: int) -> None:
        """Request ``i``'s first ``n`` tokens of ``runs`` (its whole prompt or answer) into ``out``."""
        ramp = self._ramp_for(n)
        add = np.add
        starts, ends, bases = runs.starts, runs.ends, runs.bases
        for k in range(runs.indptr[i], runs.indptr[i + 1]):
            a = starts[k]
            b = min(ends[k], n)
            if a >= b:
                break
            add(ramp[: b - a], bases[k], out=out[a:b])

    def prompt(self, i: int) -> _U32:
        """Request ``i``'s prompt, ``[input_len]`` uint32: a view of an internal buffer that the next
        call overwrites (the manager copies what it keeps)."""
        n = self._input_lens[i]
        self._buf = buf = self._grown(self._buf, n)
        self._fill(self._prompt, i, buf, n)
        return buf[:n]

    def output(self, i: int) -> _U32:
        """Request ``i``'s answer, ``[output_len]`` uint32, a new array."""
        self._need_answers()
        n = self._output_lens[i]
        out = np.empty(n, dtype=np.uint32)
        self._fill(self._output, i, out, n)
        return out

    def answer(self, i: int, start: int, stop: int) -> _U32:
        """Tokens ``[start, stop)`` of request ``i``'s answer (``0 <= start <= stop <= output_len``),
        ``[stop - start]`` uint32: a view of an internal buffer that the next call overwrites. What the
        engine appends per decode step, so an answer is never built whole."""
        self._need_answers()
        n = stop - start
        if len(self._answer) < n:
            self._answer = self._grown(self._answer, n)
        out, ramp, runs = self._answer, self._ramp_for(n), self._output
        first, last = runs.indptr[i], runs.indptr[i + 1]
        if last - first == 1 and runs.starts[first] <= start and stop <= runs.ends[first]:
            # One run holds the range: every fresh answer, and the generator's. One add per step.
            np.add(ramp[:n], runs.bases[first] + (start - runs.starts[first]), out=out[:n])
            return out[:n]
        if not 0 <= start <= stop <= self._output_lens[i]:
            raise IndexError(f"answer range [{start}, {stop}) outside [0, {self._output_lens[i]}]")
        for k in range(first, last):
            a = runs.starts[k]
            lo, hi = max(a, start), min(runs.ends[k], stop)
            if lo < hi:  # the run's tokens at answer positions [lo, hi)
                np.add(ramp[: hi - lo], runs.bases[k] + (lo - a), out=out[lo - start : hi - start])
        return out[:n]

    def answer_at(self, ids: npt.NDArray[np.int64], positions: npt.NDArray[np.int64]) -> _U32:
        """Answer token ``positions[k]`` of request ``ids[k]``, ``[len(ids)]`` uint32, a new array: the
        tokens a timed replay's engine samples in one step. A position at or past ``output_len`` (the
        one token a request of output length 0 still samples to finish) gives 0: it is never computed.
        One vectorized add for answers that are one run of ids (every fresh answer, the generator's)."""
        self._need_answers()
        if self._answer_base is None:
            runs = self._output
            n = len(self._output_lens)
            base = np.full(
                n, -1, dtype=np.int64
            )  # [num_requests] token id of answer position 0; -1: no single run
            lens = np.asarray(self._output_lens, dtype=np.int64)
            indptr = np.asarray(runs.indptr, dtype=np.int64)
            one = np.flatnonzero(np.diff(indptr) == 1)
            if len(one):
                first = indptr[one]
                starts = np.asarray(runs.starts, dtype=np.int64)[first]
                ends = np.asarray(runs.ends, dtype=np.int64)[first]
                whole = (starts == 0) & (ends >= lens[one])
                base[one[whole]] = np.asarray(runs.bases, dtype=np.int64)[first[whole]]
            self._answer_base, self._answer_lens = base, lens
            self._answer_single = bool(((base >= 0) | (lens == 0)).all())  # empty ones give 0 anyway
        base, lens = self._answer_base, self._answer_lens
        b = base[ids]
        inside = positions < lens[ids]
        if self._answer_single:  # every answer one run: one add, past-the-end positions zeroed
            return np.where(inside, b + positions, 0).astype(np.uint32)
        out = np.where(inside & (b >= 0), b + positions, 0).astype(np.uint32)
        for k in np.flatnonzero(inside & (b < 0)).tolist():  # answers of several runs: rare
            i, p = int(ids[k]), int(positions[k])
            out[k] = self.answer(i, p, p + 1)[0]
        return out

    def prompt_and_answer(self, i: int, num_answer: int) -> _U32:
        """The prompt followed by the first ``num_answer`` answer tokens (what a preempted request
        recomputes); buffer view as in :meth:`prompt`."""
        self._need_answers()
        n = self._input_lens[i]
        if not 0 <= num_answer <= self._output_lens[i]:
            raise IndexError(f"{num_answer} answer tokens outside [0, {self._output_lens[i]}]")
        self._buf = buf = self._grown(self._buf, n + num_answer)
        self._fill(self._prompt, i, buf, n)
        self._fill(self._output, i, buf[n:], num_answer)
        return buf[: n + num_answer]

    def prompt_and_output(self, i: int, output: _U32) -> _U32:
        """The prompt followed by ``output`` (any tokens); buffer view as in :meth:`prompt`."""
        n = self._input_lens[i]
        self._buf = buf = self._grown(self._buf, n + len(output))
        self._fill(self._prompt, i, buf, n)
        buf[n : n + len(output)] = output
        return buf[: n + len(output)]
