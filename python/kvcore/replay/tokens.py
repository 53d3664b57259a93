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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcore.replay.trace import Trace

__all__ = ["TokenSource"]

_U32 = npt.NDArray[np.uint32]
_TOKEN_LIMIT = 2**32  # tokens are uint32


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


class TokenSource:
    """Prompt and answer token ids of every request of a trace (``uint32``, see the module docs).

    Answers: a trace's ``output_ids`` when it has them (the generator's, so that a later turn which
    repeats an answer finds it cached); otherwise fresh ids after the largest prompt id, so each answer
    is unique, as it would be for a trace that does not link turns.
    """

    def __init__(self, trace: Trace) -> None:
        bs = trace.block_size
        prompt_ids = trace.hash_ids
        if trace.output_ids is not None and trace.output_indptr is not None:
            out_ids, out_indptr = trace.output_ids, trace.output_indptr
        else:
            counts = -(-trace.output_lens // bs)
            out_indptr = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=out_indptr[1:])
            first_fresh = int(prompt_ids.max()) + 1 if len(prompt_ids) else 0
            out_ids = np.arange(first_fresh, first_fresh + out_indptr[-1], dtype=np.int64)
        top = max(int(prompt_ids.max()) if len(prompt_ids) else 0, int(out_ids.max()) if len(out_ids) else 0)
        if (top + 1) * bs > _TOKEN_LIMIT:
            # Dense ids keep the token ranges disjoint; the same id still maps to the same tokens.
            uniq, inverse = np.unique(np.concatenate([prompt_ids, out_ids]), return_inverse=True)
            if len(uniq) * bs > _TOKEN_LIMIT:
                raise ValueError(f"{len(uniq):,} distinct blocks of {bs} tokens do not fit uint32 token ids")
            prompt_ids, out_ids = inverse[: len(prompt_ids)], inverse[len(prompt_ids) :]
        self.block_size = bs
        self._prompt = _runs(prompt_ids, trace.hash_indptr, trace.input_lens, bs)
        self._output = _runs(out_ids, out_indptr, trace.output_lens, bs)
        self._input_lens: list[int] = trace.input_lens.tolist()
        self._output_lens: list[int] = trace.output_lens.tolist()
        longest = int((trace.input_lens + trace.output_lens).max()) if trace.num_requests else 0
        self._ramp: _U32 = np.arange(max(longest, 1), dtype=np.uint32)  # [longest] 0, 1, 2, ...
        self._buf: _U32 = np.empty(max(longest, 1), dtype=np.uint32)  # [longest] the last prompt built

    def _fill(self, runs: _Runs, i: int, out: _U32) -> None:
        ramp = self._ramp
        add = np.add
        starts, ends, bases = runs.starts, runs.ends, runs.bases
        for k in range(runs.indptr[i], runs.indptr[i + 1]):
            a = starts[k]
            b = ends[k]
            add(ramp[: b - a], bases[k], out=out[a:b])

    def prompt(self, i: int) -> _U32:
        """Request ``i``'s prompt, ``[input_len]`` uint32: a view of an internal buffer that the next
        call overwrites (the manager copies what it keeps)."""
        n = self._input_lens[i]
        self._fill(self._prompt, i, self._buf)
        return self._buf[:n]

    def output(self, i: int) -> _U32:
        """Request ``i``'s answer, ``[output_len]`` uint32, a new array."""
        out = np.empty(self._output_lens[i], dtype=np.uint32)
        self._fill(self._output, i, out)
        return out

    def prompt_and_output(self, i: int, output: _U32) -> _U32:
        """The prompt followed by ``output`` (what a preempted request recomputes); buffer view as in
        :meth:`prompt`."""
        n = self._input_lens[i]
        self._fill(self._prompt, i, self._buf)
        self._buf[n : n + len(output)] = output
        return self._buf[: n + len(output)]
