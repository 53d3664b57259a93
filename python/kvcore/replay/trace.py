"""Workload traces: the Mooncake JSONL format, read into columns and written back.

Why columns: a replay touches every request once per policy and capacity, and the real traces hold
hundreds of thousands of hash ids. Keeping them as NumPy arrays (CSR, like a page table) lets the
replay build token ids with a handful of vectorized operations instead of walking Python dicts.

Format (one JSON object per line, FAST'25 release of Mooncake):

- ``timestamp``: arrival time in ms, relative, ``>= 0`` (optional, but on every line or on none);
- ``input_length``: prompt tokens, ``>= 1``;
- ``output_length``: generated tokens, ``>= 0``;
- ``hash_ids``: one id per ``block_size`` prompt tokens (512 in Mooncake's traces), prefix chained: an
  id names a block *and everything before it*, so two requests share a prefix exactly as far as their
  ids agree. There must be ``ceil(input_length / block_size)`` of them: a wrong count almost always
  means a wrong ``--trace-block-size``. An id found behind two different prefixes (at two positions,
  or after two different ids) is refused by ``kvcore replay`` (:func:`check_chained`): the best case
  would count it as one block.

Two optional fields are kvcore's own (the generator writes them; other tools ignore them):
``priority`` (retention priority for the ``priority`` policy, an int) and ``output_hash_ids`` (the
ids of the answer's blocks, ``ceil(output_length / block_size)`` of them, so a later turn that
repeats the answer can find it cached in timed mode).

Limits, so that a line can never make the reader (or the replay) allocate by a number written in it:
lengths are at most :data:`MAX_REQUEST_TOKENS`, hash ids are int64 (``< 2**63``), timestamps finite, and a
line at most :data:`MAX_LINE_BYTES`. Lines are strict JSON (:mod:`kvcore._json`): UTF-8, no ``NaN`` or
``Infinity``, no integer too long to convert, no nesting deep enough to exhaust the stack.

Every malformed line raises :class:`~kvcore.exceptions.TraceFormatError` naming the file, the line
(1-based) and the field: ``trace.jsonl: line 4, field 'input_length': must be >= 1, got 0``.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import select
import stat
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from kvcore._json import JSONInputError, decode_utf8, loads, show
from kvcore.exceptions import TraceFormatError

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_REQUEST_TOKENS",
    "MOONCAKE_BLOCK_SIZE",
    "Trace",
    "read_trace",
    "write_trace",
]

# Tokens per hash id in Mooncake's traces ("hashing token blocks (with a block size of 512)").
MOONCAKE_BLOCK_SIZE = 512
# Most tokens in a prompt or an output, and the largest block size: token ids are uint32
# (kvcore.replay.tokens), so no longer sequence has distinct tokens. Lengths are only counted, never
# allocated: the replay builds the tokens of requests that fit the cache, so memory follows the capacity.
MAX_REQUEST_TOKENS = 2**32
# Largest hash id: ids are kept as int64.
_MAX_ID = 2**63 - 1
# Longest line read (a 128k-token prompt in 16-token blocks is about 60 KiB of ids).
MAX_LINE_BYTES = 64 * 2**20

_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Trace:
    """A workload in request order, as columns. Immutable; build with :func:`read_trace` or the generator.

    Request ``i``'s prompt is described by ``hash_ids[hash_indptr[i]:hash_indptr[i + 1]]``: block ``j``
    covers prompt tokens ``[j * block_size, (j + 1) * block_size)``, the last block possibly partial.
    """

    input_lens: _I64  # [num_requests] prompt tokens, each >= 1
    output_lens: _I64  # [num_requests] tokens to generate, each >= 0
    hash_indptr: _I64  # [num_requests + 1] CSR offsets into hash_ids; [0] == 0, non-decreasing
    hash_ids: _I64  # [hash_indptr[-1]] prefix-chained block ids, >= 0; ceil(input_len / block_size) each
    block_size: int  # tokens per hash id, >= 1 (Mooncake: 512)
    timestamps_ms: npt.NDArray[np.float64] | None = None  # [num_requests] arrivals in ms, >= 0; None: untimed
    priorities: npt.NDArray[np.int32] | None = None  # [num_requests] retention priority; None: all 0
    output_indptr: _I64 | None = None  # [num_requests + 1] CSR offsets into output_ids; None: no answer ids
    output_ids: _I64 | None = None  # [output_indptr[-1]] answer block ids, ceil(output_len / block_size) each
    name: str = "trace"  # where the workload came from (a file name, "generated"), for reports

    def __post_init__(self) -> None:
        _check_block_size(self.block_size)
        n = len(self.input_lens)
        if len(self.output_lens) != n or len(self.hash_indptr) != n + 1:
            raise TraceFormatError(
                "input_lens, output_lens and hash_indptr disagree on the number of requests"
            )
        if self.hash_indptr[-1] != len(self.hash_ids):
            raise TraceFormatError("hash_indptr[-1] must equal len(hash_ids)")
        expected = -(-self.input_lens // self.block_size)
        if not np.array_equal(np.diff(self.hash_indptr), expected):
            raise TraceFormatError("each request needs ceil(input_len / block_size) hash ids")
        for name, column in (("timestamps_ms", self.timestamps_ms), ("priorities", self.priorities)):
            if column is not None and len(column) != n:
                raise TraceFormatError(f"{name} must have one entry per request")
        if (self.output_indptr is None) != (self.output_ids is None):
            raise TraceFormatError("output_indptr and output_ids go together")
        if self.output_indptr is not None and self.output_ids is not None:
            out_expected = -(-self.output_lens // self.block_size)
            if len(self.output_indptr) != n + 1 or not np.array_equal(
                np.diff(self.output_indptr), out_expected
            ):
                raise TraceFormatError("each request needs ceil(output_len / block_size) output ids")
            if self.output_indptr[-1] != len(self.output_ids):
                raise TraceFormatError("output_indptr[-1] must equal len(output_ids)")

    @property
    def num_requests(self) -> int:
        return len(self.input_lens)

    def __len__(self) -> int:
        return len(self.input_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.input_lens.sum())

    @property
    def num_unique_blocks(self) -> int:
        """Distinct hash ids: the cache footprint in blocks of an infinite cache."""
        return int(np.unique(self.hash_ids).size)

    @property
    def ideal_block_hit_rate(self) -> float:
        """Block hit rate of an infinite cache in trace order: ``1 - unique / total`` blocks.

        Valid because ids are prefix chained (the same id always sits behind the same prefix: the
        replay command refuses a file where it does not, :func:`check_chained`; a Trace built in code
        is trusted); this is how Mooncake's "cache ratio" counts, the partial last block included.
        """
        total = len(self.hash_ids)
        return 1.0 - self.num_unique_blocks / total if total else 0.0

    @property
    def ideal_token_hit_rate(self) -> float:
        """Token hit rate of an infinite cache in trace order: the tokens of every block whose id was
        seen before (a partial last block counts its own tokens), over all prompt tokens."""
        ids = self.hash_ids
        if not len(ids):
            return 0.0
        repeated = np.ones(len(ids), dtype=bool)
        repeated[np.unique(ids, return_index=True)[1]] = False
        tokens = np.full(len(ids), self.block_size, dtype=np.int64)  # [len(ids)] tokens of each block
        counts = np.diff(self.hash_indptr)
        tokens[self.hash_indptr[1:] - 1] = self.input_lens - (counts - 1) * self.block_size
        return float(tokens[repeated].sum() / self.input_lens.sum())

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival (0 when untimed)."""
        if self.timestamps_ms is None or not len(self.timestamps_ms):
            return 0.0
        return float(self.timestamps_ms.max() - self.timestamps_ms.min()) / 1000.0

    def prompt_ids(self, i: int) -> _I64:
        """Hash ids of request ``i``'s prompt, ``[ceil(input_len / block_size)]`` int64 (a view)."""
        return self.hash_ids[self.hash_indptr[i] : self.hash_indptr[i + 1]]

    def head(self, num_requests: int) -> Trace:
        """The first ``num_requests`` requests (all of them if there are fewer)."""
        k = min(num_requests, self.num_requests)
        out_indptr = self.output_indptr[: k + 1] if self.output_indptr is not None else None
        return Trace(
            input_lens=self.input_lens[:k],
            output_lens=self.output_lens[:k],
            hash_indptr=self.hash_indptr[: k + 1],
            hash_ids=self.hash_ids[: self.hash_indptr[k]],
            block_size=self.block_size,
            timestamps_ms=self.timestamps_ms[:k] if self.timestamps_ms is not None else None,
            priorities=self.priorities[:k] if self.priorities is not None else None,
            output_indptr=out_indptr,
            output_ids=(
                self.output_ids[: out_indptr[-1]]
                if self.output_ids is not None and out_indptr is not None
                else None
            ),
            name=self.name,
        )


def unchained(indptr: _I64, ids: _I64) -> tuple[int, int, int] | None:
    """``(id, request, other request)`` of the first id found behind two different prefixes (another
    id before it, or none in one request and one in the other), or None when the ids are prefix
    chained, as the format requires: the best case (``ideal_*_hit_rate``) and the hit figures count
    an id's block as the same prefix wherever it occurs. O(n log n) in the ids."""
    n = len(ids)
    if n < 2:
        return None
    starts = np.zeros(n, dtype=bool)  # [n] first id of its request
    counts = np.diff(indptr)
    starts[indptr[:-1][counts > 0]] = True
    parent = np.empty(n, dtype=np.int64)  # [n] the id before (-1: the request's first)
    parent[0] = -1
    parent[1:] = ids[:-1]
    parent[starts] = -1
    order = np.lexsort((parent, ids))
    sid, spar = ids[order], parent[order]
    bad = np.flatnonzero((sid[1:] == sid[:-1]) & (spar[1:] != spar[:-1]))
    if not len(bad):
        return None
    k = int(bad[0])
    owner = np.searchsorted(indptr, order[[k, k + 1]], side="right") - 1  # the requests of both
    a, b = sorted(int(x) for x in owner)
    return int(sid[k]), a, b


def check_chained(trace: Trace) -> None:
    """Raise :class:`TraceFormatError` if an id of ``trace`` sits behind two different prefixes (see
    :func:`unchained`). Not part of :func:`read_trace`, whose peak memory follows the ids' bytes: the
    check sorts them, as the best case does anyway (``kvcore replay`` runs it after reading)."""
    clash = unchained(trace.hash_indptr, trace.hash_ids)
    if clash is not None:
        h, a, b = clash
        where = f"in request {b + 1} than in request {a + 1}" if a != b else f"twice in request {a + 1}"
        raise TraceFormatError(
            f"{trace.name}: hash id {h} follows another prefix {where} (in file order): ids must be prefix "
            "chained (an id names a block and everything before it)"
        )


def _check_block_size(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TraceFormatError(f"block_size must be an integer, got {show(block_size)}")
    if not 1 <= block_size <= MAX_REQUEST_TOKENS:
        raise TraceFormatError(f"block_size must be in [1, {MAX_REQUEST_TOKENS:,}], got {block_size:,}")
    return block_size


class _Line:
    """Where the line being read is, for its errors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.no = 0

    def fail(self, field: str | None, message: str, line_no: int | None = None) -> TraceFormatError:
        where = f"{self.path}: line {self.no if line_no is None else line_no}"
        return TraceFormatError(where + (f", field {field!r}" if field else "") + f": {message}")


def _int_field(obj: dict[str, Any], field: str, at: _Line, minimum: int) -> int:
    if field not in obj:
        raise at.fail(field, "missing")
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise at.fail(field, f"expected an integer, got {show(value)}")
    if value < minimum:
        raise at.fail(field, f"must be >= {minimum}, got {show(value)}")
    if value > MAX_REQUEST_TOKENS:
        raise at.fail(field, f"must be <= {MAX_REQUEST_TOKENS:,} (uint32 token ids), got {show(value)}")
    return value


def _id_list(obj: dict[str, Any], field: str, at: _Line, expected: int) -> list[int]:
    ids = obj[field]
    if not isinstance(ids, list):
        raise at.fail(field, f"expected a list of integers, got {type(ids).__name__}")
    # The common case in C (type, min, max over the list); the item loop only to name a bad item.
    if ids and not (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= _MAX_ID):
        for k, h in enumerate(ids):
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= _MAX_ID:
                raise at.fail(field, f"item {k} must be a non-negative integer below 2**63, got {show(h)}")
    if len(ids) != expected:
        raise at.fail(
            field,
            f"{len(ids)} ids, expected ceil(length / block_size) = {expected}"
            " (is the trace block size right? see --trace-block-size)",
        )
    return ids


def _timestamp(stamp: object, at: _Line) -> float:
    if not isinstance(stamp, bool) and isinstance(stamp, (int, float)):
        try:
            ms = float(stamp)
        except OverflowError:  # an integer beyond any double
            ms = math.inf
        if math.isfinite(ms) and ms >= 0:
            return ms
    raise at.fail("timestamp", f"expected a number of ms >= 0 (and finite), got {show(stamp)}")


FIFO_WAIT_S = 10.0  # how long a FIFO may wait for its other end (a writer to read, a reader to write)


def _open_stream(path: str | os.PathLike[str], *, write: bool) -> IO[bytes]:
    """``path`` opened for reading, or for writing (created or truncated).

    A FIFO streams (``kvcore replay <(zcat t.jsonl.gz)``, ``--save-trace >(gzip > t.gz)``, or a named
    one whose other end comes a little later), but never waits for good: its other end must appear
    within :data:`FIFO_WAIT_S`. Read from, a FIFO is opened non-blocking and polled for its first
    bytes (or its writer's close); written to, the open is retried while no process reads. Then the
    descriptor blocks again, as a file's.

    Raises:
        OSError: the path cannot be opened, is a directory, or is a FIFO whose other end did not
            come in time (ETIMEDOUT, ENXIO).
    """
    name = os.fspath(path)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY) | os.O_NONBLOCK
    flags |= getattr(os, "O_CLOEXEC", 0)
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(path, flags, 0o666)
            break
        except OSError as exc:
            if not (write and exc.errno == errno.ENXIO and _is_fifo(path)):
                raise  # (ENXIO is also a socket's answer, /dev/stdout on one: not a FIFO's wait)
            if time.monotonic() >= deadline:
                raise OSError(
                    errno.ENXIO, f"a FIFO that no process read within {FIFO_WAIT_S:g} s", name
                ) from None
            time.sleep(0.05)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a trace file", name)
        if stat.S_ISFIFO(mode) and not write:
            # POLLIN at the first bytes, POLLHUP once a writer came and closed; neither while no
            # writer has come (a non-blocking reader of a FIFO no one opened reads end of file)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
                raise OSError(
                    errno.ETIMEDOUT, f"a FIFO that no process wrote to within {FIFO_WAIT_S:g} s", name
                )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb" if write else "rb")
    except BaseException:
        os.close(fd)
        raise


def _is_fifo(path: str | os.PathLike[str]) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def read_trace(
    path: str | os.PathLike[str],
    *,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    limit: int | None = None,
) -> Trace:
    """Read a Mooncake-format JSONL trace (see the module docs) into a :class:`Trace`.

    Blank lines are skipped; line numbers in errors count them. ``limit`` keeps the first requests
    only (for quick looks at long traces).

    Raises:
        TraceFormatError: a malformed line (the message names the file, the line and the field), an
            empty trace, or a ``block_size`` outside ``[1, MAX_REQUEST_TOKENS]``.
        OSError: the file cannot be read.
    """
    _check_block_size(block_size)
    at = _Line(os.fspath(path))
    # Per-request columns and ids in typed buffers (array.array), never lists of Python objects.
    inputs = array("q")  # [num_requests] input_length
    outputs = array("q")  # [num_requests] output_length
    stamps = array("d")  # [num_requests] timestamp in ms (empty when untimed)
    prios = array("i")  # [num_requests] priority, int32
    # Every line's ids go straight into one flat int64 buffer (8 bytes an id; a list of Python ints
    # holds 36): a multi-GB trace then costs about its ids' bytes, not several times the file.
    ids_buf = array("q")  # all prompt ids, in request order
    counts = array("q")  # [num_requests] ids of each request
    out_buf = array("q")  # all answer ids, in request order
    out_counts = array("q")  # [num_requests] answer ids of each request (0 without output_hash_ids)
    line_nos = array("q")  # [num_requests] line of each request, for errors found after the loop
    timed: bool | None = None  # decided by the first request
    has_prio = has_out = False
    first_line = 0
    # Binary lines: a line that is not UTF-8 is an error of that line, not of the whole file.
    f = _open_stream(path, write=False)
    with f:
        while limit is None or len(inputs) < limit:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            at.no += 1
            if at.no == 1:  # a UTF-8 byte-order mark (some Windows editors write one) is not JSON
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if len(raw) > MAX_LINE_BYTES:
                raise at.fail(None, f"longer than {MAX_LINE_BYTES:,} bytes")
            if not raw.strip():
                continue
            try:
                obj = loads(decode_utf8(raw))
            except JSONInputError as exc:
                raise at.fail(None, str(exc)) from None
            if not isinstance(obj, dict):
                raise at.fail(None, f"expected a JSON object, got {type(obj).__name__}")
            n_in = _int_field(obj, "input_length", at, 1)
            n_out = _int_field(obj, "output_length", at, 0)
            if "hash_ids" not in obj:
                raise at.fail("hash_ids", "missing")
            prompt_ids = _id_list(obj, "hash_ids", at, -(-n_in // block_size))
            stamp = obj.get("timestamp")
            if timed is None:
                timed, first_line = stamp is not None, at.no
            if (stamp is not None) != timed:
                state = "has" if timed else "has no"
                raise at.fail("timestamp", f"missing or extra: line {first_line} {state} timestamp")
            if stamp is not None:
                stamps.append(_timestamp(stamp, at))
            prio = obj.get("priority", 0)
            if isinstance(prio, bool) or not isinstance(prio, int) or not -(2**31) <= prio < 2**31:
                raise at.fail("priority", f"expected a 32-bit integer, got {show(prio)}")
            has_prio |= prio != 0
            prios.append(prio)
            answer_ids = None
            if "output_hash_ids" in obj:
                has_out = True
                answer_ids = _id_list(obj, "output_hash_ids", at, -(-n_out // block_size))
            # The line is valid: its ids join the flat buffers.
            ids_buf.extend(prompt_ids)
            counts.append(len(prompt_ids))
            if answer_ids is not None:
                out_buf.extend(answer_ids)
            out_counts.append(0 if answer_ids is None else len(answer_ids))
            line_nos.append(at.no)
            inputs.append(n_in)
            outputs.append(n_out)
    if not inputs:
        raise TraceFormatError(f"{at.path}: no requests")
    if has_out:
        for k, (count, n_out) in enumerate(zip(out_counts, outputs, strict=True)):
            if count != -(-n_out // block_size):
                raise at.fail("output_hash_ids", "missing (other lines have it)", line_nos[k])
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    ids = _int64_array(ids_buf)
    out_indptr = out_ids = None
    if has_out:
        out_indptr = np.zeros(len(out_counts) + 1, dtype=np.int64)
        np.cumsum(out_counts, out=out_indptr[1:])
        out_ids = _int64_array(out_buf)
    return Trace(
        input_lens=np.array(inputs, dtype=np.int64),
        output_lens=np.array(outputs, dtype=np.int64),
        hash_indptr=indptr,
        hash_ids=ids,
        block_size=block_size,
        timestamps_ms=np.array(stamps, dtype=np.float64) if timed else None,
        priorities=np.array(prios, dtype=np.int32) if has_prio else None,
        output_indptr=out_indptr,
        output_ids=out_ids,
        name=Path(path).name,
    )


def _int64_array(buf: array[int]) -> _I64:
    """``buf`` as an int64 NumPy array without a copy (the array shares the buffer, which then stays)."""
    if not len(buf):
        return np.zeros(0, dtype=np.int64)
    out: _I64 = np.frombuffer(buf, dtype=np.int64)
    return out


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` as Mooncake JSONL (plus kvcore's optional fields when set); :func:`read_trace`
    with the same ``block_size`` reads it back unchanged."""
    ids = trace.hash_ids.tolist()
    indptr = trace.hash_indptr.tolist()
    out_ids = trace.output_ids.tolist() if trace.output_ids is not None else None
    out_indptr = trace.output_indptr.tolist() if trace.output_indptr is not None else None
    raw = _open_stream(path, write=True)
    with io.TextIOWrapper(raw, encoding="utf-8") as f:
        for i in range(trace.num_requests):
            row: dict[str, Any] = {}
            if trace.timestamps_ms is not None:
                stamp = float(trace.timestamps_ms[i])
                row["timestamp"] = int(stamp) if stamp.is_integer() else stamp
            row["input_length"] = int(trace.input_lens[i])
            row["output_length"] = int(trace.output_lens[i])
            row["hash_ids"] = ids[indptr[i] : indptr[i + 1]]
            if trace.priorities is not None:
                row["priority"] = int(trace.priorities[i])
            if out_ids is not None and out_indptr is not None:
                row["output_hash_ids"] = out_ids[out_indptr[i] : out_indptr[i + 1]]
            f.write(json.dumps(row, separators=(", ", ": "), allow_nan=False) + "\n")
