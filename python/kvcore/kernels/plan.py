"""Page tables in, a work partition out: the host-side "plan" of paged attention.

Why a plan: FlashInfer's split between *plan* (once per scheduler step, on the CPU, from the batch
composition) and *run* (once per layer, no host decisions). The plan cuts every sequence's query rows
into tiles of :data:`ROWS_PER_TILE` rows and its keys into chunks of ``chunk_lens[seq]`` (split-K, so a
few long sequences still fill every SM), and lists the work items and the LSE merges. The NumPy reference
uses the same chunks, so the CPU exercises exactly the split logic the GPU runs.

Split sizing: the thread blocks the device runs at once (``num_sms * blocks_per_sm``) are shared over the
kv heads; a sequence is cut into ``floor(kv_len / chunk)`` even chunks, so a batch never needs a nearly
empty extra wave (a few long sequences fill one wave; many short ones are left whole).

Rows: a sequence with ``q_len`` query tokens and group size ``G = num_qo_heads // num_kv_heads`` has
``q_len * G`` rows per kv head; row ``r`` is query token ``r // G`` and query head ``kv_head * G + r % G``.
Query token ``i`` sits at absolute position ``kv_len - q_len + i`` and sees keys ``j <= kv_len - q_len + i``
(causal with the cached prefix in front; decode is ``q_len == 1``).

Bounded caches: a plan made with a sliding ``window`` records the first key each query token sees
(:attr:`AttentionPlan.kv_first`) and starts every tile's first item there, so pages before every query's
window cost no work. Positions only ever shrink what a window covers (they increase strictly, so two keys
``n`` indices apart are at least ``n`` positions apart), which keeps the index-based cut safe for compacted
tables too; ``kv_first`` itself is exact (it is computed on the positions).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels._nvrtc import DECODE_VARIANTS
from kvcore.pool.checks import index_array

__all__ = [
    "DECODE_VARIANTS",
    "MAX_CHUNK_LEN",
    "ROWS_PER_TILE",
    "AttentionPlan",
    "PageTableArrays",
    "PageTableLike",
    "check_positions",
    "check_variant",
    "check_window",
    "kv_lengths",
    "plan_attention",
    "unpack_page_table",
    "window_starts",
]

# Query rows per work tile: the M dimension of one mma.sync m16n8k16 in the CUDA kernel.
ROWS_PER_TILE = 16
# Key chunks are multiples of this (4 warps x 16 keys per step in the CUDA kernel).
CHUNK_ALIGN = 64
# The longest chunk: the largest multiple of CHUNK_ALIGN that int32 holds (chunk_lens and the items'
# kv_begin/kv_end are int32; a chunk of 2**31 would wrap to -2**31).
MAX_CHUNK_LEN = (2**31 - 1) // CHUNK_ALIGN * CHUNK_ALIGN
# Below this many keys per chunk the merge costs more than the extra parallelism brings.
MIN_CHUNK_LEN = 256
# Work items start at multiples of this (a warp's step of 16 keys: with pages of 16 keys or more the CUDA
# kernel then finds all of a step's keys in one page).
STEP_ALIGN = 16
# Split counts tried per batch, and the fixed cost of one thread block in keys' worth of streaming
# (its Q load, the 4-warp merge, its output or partial; the merge kernel's pass per extra split).
SPLIT_CANDIDATES = np.array([1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128], np.int64)
BLOCK_OVERHEAD_KEYS = 64
# From this many waves of unsplit blocks on, no split is searched (at most 1/8 of the last wave idle).
SEARCH_BELOW_WAVES = 8


class PageTableLike(Protocol):
    """What :class:`kvcore.KVCacheManager.page_table` returns (FlashInfer's CSR page table)."""

    kv_indptr: Any  # [batch + 1] int32
    kv_indices: Any  # [kv_indptr[-1]] int32 page ids
    kv_last_page_len: Any  # [batch] int32, in [1, page_size] (0 only for an empty sequence)


class PageTableArrays(NamedTuple):
    """A page table as three host arrays (the kernels' input)."""

    kv_indptr: np.ndarray  # [batch + 1] int32, kv_indptr[0] == 0, non-decreasing
    kv_indices: np.ndarray  # [kv_indptr[-1]] int32 page ids in [1, num_pages)
    kv_last_page_len: np.ndarray  # [batch] int32 tokens used in each sequence's last page


def _offsets(a: Any, name: str) -> np.ndarray:
    """int32 ``[n]`` CSR offsets or lengths: integers in ``[0, 2**31)``, checked before the cast (on a
    private copy taken first, see :func:`index_array`)."""
    what = "offsets" if name.endswith("indptr") else "lengths"
    return index_array(a, name, dtype=np.int32, low=0, what=what)


def unpack_page_table(
    page_table: PageTableLike | tuple[Any, Any, Any], *, allow_null: bool = False
) -> PageTableArrays:
    """The three arrays of a page table (an object with the three attributes, or a 3-tuple), checked.

    Host arrays only: device copies are made by the plan, once per step. Lists and any integer dtype are
    taken; values are ranged before the cast to int32, so none wraps. ``allow_null`` (sliding-window
    attention) admits the null page 0 for pages that left the window; attention masks them. The three
    are private copies, taken before the checks (a caller's buffer written by another thread meanwhile
    cannot put an unchecked page id in them).

    Raises:
        InvalidDTypeError: ``page_table`` is neither, an array is not 1-D integer, or the lengths disagree.
        InvalidArgumentError: ``kv_indptr`` is not a CSR offset array, or a length is negative or past int32.
        InvalidPageError: a page id is 0 (the null page, unless ``allow_null``), negative or past int32.
    """
    if all(hasattr(page_table, a) for a in ("kv_indptr", "kv_indices", "kv_last_page_len")):
        pt: Any = page_table
        raw = (pt.kv_indptr, pt.kv_indices, pt.kv_last_page_len)
    elif isinstance(page_table, tuple | list) and len(page_table) == 3:
        raw = tuple(page_table)
    else:
        raise InvalidDTypeError(
            "page_table: expected a PageTable or a (kv_indptr, kv_indices, kv_last_page_len) tuple, "
            f"got {type(page_table).__name__}"
        )
    indptr = _offsets(raw[0], "kv_indptr")
    indices = index_array(
        raw[1],
        "kv_indices",
        dtype=np.int32,
        low=0 if allow_null else 1,
        what="page ids",
        hint="" if allow_null else " (page 0 is the null page; only a windowed plan takes it)",
        error=InvalidPageError,
    )
    last = _offsets(raw[2], "kv_last_page_len")
    if indptr.shape[0] != last.shape[0] + 1:
        raise InvalidDTypeError(f"kv_indptr has {indptr.shape[0]} entries for a batch of {last.shape[0]}")
    if indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != indices.shape[0]:
        raise InvalidArgumentError("kv_indptr: must start at 0, not decrease, and end at len(kv_indices)")
    return PageTableArrays(indptr, indices, last)


def kv_lengths(pt: PageTableArrays, page_size: int) -> np.ndarray:
    """int32 [batch]: ``page_size * (num_pages - 1) + last_page_len`` (0 for a sequence with no pages).

    Computed in int64 and checked, so a length past int32 (what the kernels index with) is refused, not
    wrapped.

    Raises:
        InvalidArgumentError: a last-page length outside ``[1, page_size]`` for a sequence with pages, or a
            sequence of more than ``2**31 - 1`` keys.
    """
    num_pages = np.diff(pt.kv_indptr).astype(np.int64)
    last = pt.kv_last_page_len
    has = num_pages > 0
    if ((last[has] < 1) | (last[has] > page_size)).any():
        raise InvalidArgumentError(f"kv_last_page_len: must be in [1, {page_size}] for every sequence")
    kv_len = np.where(has, page_size * (num_pages - 1) + last, 0)
    if kv_len.size and int(kv_len.max()) > np.iinfo(np.int32).max:
        raise InvalidArgumentError(
            f"kv_indptr, kv_last_page_len: a sequence of {int(kv_len.max())} keys (kv_len) is past int32"
        )
    return kv_len.astype(np.int32)


# What :func:`plan_attention` stores in a plan it made (``AttentionPlan._seal``): the kernels trust a plan's
# arrays (the CUDA ones index device memory with them), so only plans carrying it are run.
_SEAL = object()


@dataclass(frozen=True, eq=False)
class AttentionPlan:
    """The work partition of one batch for paged attention; reuse it for every layer of a step.

    ``items`` and ``merges`` are what the CUDA kernels read; the NumPy reference only needs
    ``chunk_lens`` (and the mask, ``window`` and ``positions``, which the CUDA kernels read as
    ``kv_first``). Device copies of the arrays are cached in :attr:`device` by the GPU path.

    Only :func:`plan_attention` makes plans the kernels run: it checks the arrays against each other
    (the CUDA kernels index device memory with ``items``, ``kv_len``, ``kv_indptr``, ``q_indptr`` and the
    partial indices, unchecked) and seals the plan. A plan is frozen and its arrays are read-only; one
    built directly or by ``dataclasses.replace`` is not sealed, and the kernels refuse it
    (:class:`~kvcore.exceptions.InvalidArgumentError`). ``copy.copy`` of a sealed plan is sealed (the
    same read-only arrays, the same device cache); ``copy.deepcopy`` returns the plan itself.
    """

    batch_size: int  # number of sequences
    num_qo_heads: int  # query heads
    num_kv_heads: int  # kv heads; group_size = num_qo_heads // num_kv_heads
    page_size: int  # tokens per page
    page_table: PageTableArrays  # the plan's own read-only copy of the host page table it was made from
    kv_len: np.ndarray  # [batch] int32 keys per sequence (prefix + new tokens)
    q_indptr: np.ndarray  # [batch + 1] int32 CSR offsets of each sequence's query tokens (own copy)
    chunk_lens: np.ndarray  # [batch] int32 keys per split (multiples of CHUNK_ALIGN): [k*chunk, (k+1)*chunk)
    items: np.ndarray  # [num_items, 5] int32: (seq, row_tile, kv_begin, kv_end, partial or -1)
    merges: np.ndarray  # [num_merges, 4] int32: (seq, row_tile, first_partial, num_partials)
    num_partials: int  # rows of the fp32 partial-output buffers (items with a partial index)
    window: int | None = None  # sliding window in positions (>= 1), or None: plain causal attention
    positions: np.ndarray | None = None  # [sum(kv_len)] int32 key positions (compacted tables), or None
    kv_first: np.ndarray | None = None  # [num_q_tokens] int32 first key index each token sees (window only)
    variant: str = "default"  # a key of DECODE_VARIANTS: the CUDA kernel variant (the NumPy path ignores it)
    # GPU copies of the arrays per device id (filled by the GPU path); never an __init__ argument, so
    # dataclasses.replace starts an empty one.
    device: dict[int, dict[Any, Any]] = field(default_factory=dict, init=False, repr=False)

    @property
    def group_size(self) -> int:
        """Query heads per kv head (G)."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def num_q_tokens(self) -> int:
        """Query tokens over the batch (rows of ``q``)."""
        return int(self.q_indptr[-1])

    @property
    def sealed(self) -> bool:
        """True for a plan :func:`plan_attention` made (what the kernels run); False for one built
        directly or by ``dataclasses.replace``. Its arrays are views of immutable ``bytes``: NumPy
        refuses to make them writable again, so a sealed plan's contents are the checked ones."""
        if getattr(self, "_seal", None) is not _SEAL:
            return False
        arrays = [*self.page_table, self.kv_len, self.q_indptr, self.chunk_lens, self.items, self.merges]
        arrays += [a for a in (self.positions, self.kv_first) if a is not None]
        return all(isinstance(a, np.ndarray) and not a.flags.writeable for a in arrays)

    def __deepcopy__(self, memo: dict[int, Any]) -> AttentionPlan:
        return self  # immutable: a deep copy would only make its arrays writable (and unsealed)


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` (a private copy, checked after it was taken) as an array over an immutable ``bytes``
    object: what a plan keeps. Its ``writeable`` flag cannot be turned back on (NumPy refuses it over
    a read-only buffer), so the checked contents stay what the kernels read."""
    out = np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=a.dtype).reshape(a.shape)
    assert not out.flags.writeable
    return out


def _int_arg(x: Any, name: str, low: int, high: int) -> int:
    """An integer scalar argument (Python or NumPy, never a bool) in ``[low, high]``, as an int.

    Raises:
        InvalidDTypeError: a bool, a float, a string, None.
        InvalidArgumentError: an integer outside ``[low, high]``.
    """
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Integral):
        raise InvalidDTypeError(f"{name}: expected an integer, got {x!r}")
    if not low <= int(x) <= high:
        raise InvalidArgumentError(f"{name}: expected an integer in [{low}, {high}], got {x}")
    return int(x)


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


def check_window(window: Any) -> int | None:
    """A sliding window: None (plain causal attention) or an integer >= 1 (keys, in positions).

    Raises:
        InvalidDTypeError: not an integer (a bool, a float, a string).
        InvalidArgumentError: an integer < 1.
    """
    if window is None:
        return None
    if isinstance(window, bool | np.bool_) or not isinstance(window, numbers.Integral):
        raise InvalidDTypeError(f"window: expected None or an integer >= 1, got {window!r}")
    if window < 1:
        raise InvalidArgumentError(f"window: expected an integer >= 1, got {window}")
    return int(window)


def check_variant(variant: Any) -> str:
    """A kernel variant: one of :data:`DECODE_VARIANTS` (``"default"``, ``"wide"``, ``"pipelined"``, ...).

    Raises:
        InvalidDTypeError: not a string.
        InvalidArgumentError: a string that names no variant.
    """
    if not isinstance(variant, str):
        raise InvalidDTypeError(f"variant: expected one of {list(DECODE_VARIANTS)}, got {variant!r}")
    if variant not in DECODE_VARIANTS:
        raise InvalidArgumentError(f"variant: expected one of {list(DECODE_VARIANTS)}, got {variant!r}")
    return variant


def check_positions(positions: Any, kv_len: np.ndarray) -> np.ndarray | None:
    """Key positions of a compacted table: int32 ``[sum(kv_len)]``, >= 0, increasing strictly per sequence.

    Returned as a private copy (a plan keeps it; the caller may reuse its buffer), or None for None.

    Raises:
        InvalidDTypeError: not a 1-D integer host array or list.
        InvalidArgumentError: a negative position or one past int32, another length than ``sum(kv_len)``,
            or positions that do not increase strictly within a sequence.
    """
    if positions is None:
        return None
    pos = index_array(positions, "positions", dtype=np.int32, low=0, what="positions")
    total = int(kv_len.astype(np.int64).sum())
    if pos.shape[0] != total:
        raise InvalidArgumentError(
            f"positions: expected one per key, sum(kv_len) = {total} (sequences in batch order), "
            f"got {pos.shape[0]}"
        )
    if total > 1:
        inner = np.ones(total - 1, dtype=bool)  # step i compares keys i and i + 1 of one sequence
        ends = np.cumsum(kv_len.astype(np.int64))[:-1]
        inner[ends[(ends > 0) & (ends < total)] - 1] = False
        if (np.diff(pos)[inner] <= 0).any():
            raise InvalidArgumentError("positions: must increase strictly within each sequence")
    return pos


def window_starts(
    kv_len: np.ndarray, q_indptr: np.ndarray, window: int, positions: np.ndarray | None
) -> np.ndarray:
    """int32 ``[num_q_tokens]``: the first key index each query token sees under a sliding window.

    Query token ``i`` of sequence ``b`` is key ``kv_len - q_len + i``, at position ``p`` (its index, or
    ``positions`` of it); it sees the keys at positions ``> p - window``. Positions increase strictly, so
    those keys are a suffix of the sequence: found by one binary search over every sequence at once
    (sequence ``b``'s positions offset by ``b * 2**33`` are sorted over the whole batch).
    """
    batch = kv_len.shape[0]
    q_len = np.diff(q_indptr).astype(np.int64)
    seq = np.repeat(np.arange(batch, dtype=np.int64), q_len)
    token = np.arange(seq.shape[0], dtype=np.int64) - q_indptr[seq]
    kv64 = kv_len.astype(np.int64)
    index = kv64[seq] - q_len[seq] + token
    reach = min(window, 2**32)  # past every int32 position: the same as an unbounded window
    if positions is None:
        first = np.maximum(index - reach + 1, 0)
    else:
        key_start = np.cumsum(kv64) - kv64
        keys = np.repeat(np.arange(batch, dtype=np.int64) << 33, kv64) + positions
        p = positions[key_start[seq] + index].astype(np.int64)
        first = np.searchsorted(keys, (seq << 33) + np.maximum(p - reach, -1), side="right") - key_start[seq]
    return first.astype(np.int32)


def _wave_chunks(
    span: np.ndarray, seq: np.ndarray, keys: np.ndarray, lo: np.ndarray, num_kv_heads: int, slots: int
) -> np.ndarray:
    """Keys per split of every sequence: the candidate split count whose blocks best fill whole waves.

    For each candidate ``s`` of :data:`SPLIT_CANDIDATES`, sequence ``b`` cuts its ``span[b]`` keys into
    ``ceil(span[b] / c)`` even chunks (multiples of :data:`CHUNK_ALIGN`, at least :data:`MIN_CHUNK_LEN`)
    with ``c = max(span) / s``; each tile then has as many items as chunks it touches (from ``lo`` to
    ``keys``), and the batch's time is estimated by :func:`_estimate_time`. The smallest estimate wins;
    ties go to fewer splits.
    """
    top = max(int(span.max(initial=1)), 1)
    span1 = np.maximum(span, 1)
    if seq.shape[0] * num_kv_heads >= SEARCH_BELOW_WAVES * slots:
        # Unsplit already fills many waves (a prefill): a last wave part empty costs little, and a
        # split only adds blocks. The search would cost a pass over every tile per candidate.
        unsplit: np.ndarray = _ceil_div(span1, CHUNK_ALIGN) * CHUNK_ALIGN
        return unsplit
    c = np.maximum(MIN_CHUNK_LEN, _ceil_div(_ceil_div(top, SPLIT_CANDIDATES), CHUNK_ALIGN) * CHUNK_ALIGN)
    c = np.unique(c)[::-1]  # distinct target lengths, fewest splits first
    splits = np.maximum(1, _ceil_div(span1[None, :], c[:, None]))  # [candidates, batch]
    chunks = _ceil_div(_ceil_div(span1[None, :], splits), CHUNK_ALIGN) * CHUNK_ALIGN
    tc = chunks[:, seq]  # [candidates, tiles]
    items = np.maximum(1, _ceil_div(keys[None, :], tc) - lo[None, :] // tc)
    longest = np.minimum(tc, np.maximum(keys - lo, 1)[None, :]).max(axis=1, initial=1)
    work = int((keys - lo).sum()) * num_kv_heads  # keys read in all: the same for every split
    est = _estimate_time(items.sum(axis=1) * num_kv_heads, work, longest, slots)
    best = int(np.argmin(est))  # the first minimum: the fewest splits
    out: np.ndarray = chunks[best]
    return out


def _estimate_time(blocks: Any, keys: int, longest: Any, slots: int) -> Any:
    """The planner's cost model, in keys' worth of streaming: ``blocks`` thread blocks reading ``keys``
    keys in all (each block also pays BLOCK_OVERHEAD_KEYS), on ``slots`` resident blocks. Whole waves of
    the mean block, and never less than the longest block: uniform batches (decode) then see the cost
    of a last wave left part empty, and batches with many waves (prefill) the cost of every extra split.
    """
    mean = keys / blocks + BLOCK_OVERHEAD_KEYS
    return np.maximum(_ceil_div(blocks, slots) * mean, longest + BLOCK_OVERHEAD_KEYS)


def plan_attention(
    page_table: PageTableLike | tuple[Any, Any, Any],
    q_indptr: Any,
    *,
    page_size: int,
    num_qo_heads: int,
    num_kv_heads: int,
    num_sms: int = 132,
    blocks_per_sm: int = 3,
    chunk_len: int | None = None,
    window: int | None = None,
    positions: Any = None,
    variant: str = "default",
) -> AttentionPlan:
    """Plan paged attention for one batch (decode: ``q_indptr = arange(batch + 1)``).

    Args:
        page_table: the batch's CSR page table (host arrays, as the manager returns them).
        q_indptr: int32 ``[batch + 1]`` offsets of each sequence's query tokens in ``q``.
        page_size: tokens per page of the pool.
        num_qo_heads: query heads; a multiple of ``num_kv_heads``.
        num_kv_heads: kv heads of the pool.
        num_sms: streaming multiprocessors (132 on H100/H200); only changes the split count.
        blocks_per_sm: attention thread blocks resident per SM (the kernels are built for 3; the GPU path
            asks the occupancy API). The split count is the one whose blocks best fill whole waves of
            ``num_sms * blocks_per_sm``: the smallest estimated time (whole waves of the mean block,
            each block paying a fixed cost, never less than the longest block) over a few candidate
            split counts.
        chunk_len: force the keys per split for every sequence: a multiple of 64 in
            ``[64, MAX_CHUNK_LEN]`` (``2**31 - 64``, so that no chunk length or bound wraps in int32). The
            planner's own chunk lengths never exceed it either.
        window, positions: the attention mask, as :func:`kvcore.kernels.paged_decode_attention` takes it;
            calls with this plan must pass the same. With a window the page table may hold the null
            page 0, and the work starts at the first key each tile's first query token sees.
        variant: the CUDA kernel every call with this plan launches, one of :data:`DECODE_VARIANTS`
            (their ``doc``; the kernels are ``csrc/decode_variants.cu``): ``"default"`` (16-key steps,
            K/V loaded into registers), ``"wide"`` (8-bit caches: 32-key steps), ``"pipelined"`` /
            ``"pipelined3"`` (a 2- / 3-stage cp.async ring of K/V in shared memory; ``"pipelined3"``
            fits 2 blocks per SM, so pass ``blocks_per_sm`` from
            :func:`kvcore.kernels.gpu.occupancy` for it), ``"pipelined_wide"`` (8-bit caches: both). A
            variant applies to plain decode calls (one query token per sequence) on pages of >= 16 keys
            with a cache it has kernels for; prefill, calls with a window or page scores, smaller pages
            and other caches run the default kernel
            (:func:`kvcore.kernels.gpu.attention_kernel` names the one a call launches). Every variant
            computes the same attention (to rounding); the NumPy reference ignores it. For measuring on
            a device which should be the default.

    Integer arguments (``page_size``, the head counts, ``num_sms``, ``blocks_per_sm``, ``chunk_len``) are
    Python or NumPy integers, never bools; each is at most ``2**31 - 1`` (the kernels take them as int32).

    Returns:
        A sealed, frozen plan with read-only arrays: the only kind the kernels run (see
        :class:`AttentionPlan`).

    Raises:
        InvalidDTypeError: an array is not 1-D integer (see :func:`unpack_page_table`), ``window`` is
            not an integer, ``variant`` not a string, or an integer argument is a bool, a float, a string
            or None (the message names it).
        InvalidArgumentError: inconsistent shapes, an offset or length outside int32, a sequence with more
            query tokens than keys, a bad page size / head count / SM count / chunk length / window, bad
            positions, or an unknown ``variant``.
        InvalidPageError: a page id that is negative, past int32, or 0 without a window.
    """
    i32_max = 2**31 - 1
    page_size = _int_arg(page_size, "page_size", 1, i32_max)
    num_qo_heads = _int_arg(num_qo_heads, "num_qo_heads", 1, i32_max)
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads", 1, i32_max)
    num_sms = _int_arg(num_sms, "num_sms", 1, i32_max)
    blocks_per_sm = _int_arg(blocks_per_sm, "blocks_per_sm", 1, i32_max)
    if chunk_len is not None:
        chunk_len = _int_arg(chunk_len, "chunk_len", CHUNK_ALIGN, MAX_CHUNK_LEN)
        if chunk_len % CHUNK_ALIGN:
            raise InvalidArgumentError(f"chunk_len: expected a multiple of {CHUNK_ALIGN}, got {chunk_len}")
    window = check_window(window)
    variant = check_variant(variant)
    # The plan keeps private copies, taken before they are checked: the caller may refill its buffers for
    # the next step (``page_table(ids, out=buf)``) while this plan is in use, or another thread may write
    # them during this call, and neither reaches the plan. A call with ``plan=`` reads only the plan's
    # table (read-only, so nothing writes it behind the checks either).
    pt = PageTableArrays(*(_frozen(a) for a in unpack_page_table(page_table, allow_null=window is not None)))
    qi = _frozen(_offsets(q_indptr, "q_indptr"))
    batch = pt.kv_last_page_len.shape[0]
    if qi.shape[0] != batch + 1 or qi[0] != 0 or (np.diff(qi) < 0).any():
        raise InvalidArgumentError(f"q_indptr: expected [{batch + 1}] offsets from 0, non-decreasing")
    if num_qo_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"num_qo_heads ({num_qo_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    kv_len = kv_lengths(pt, page_size)
    q_len = np.diff(qi).astype(np.int64)
    if (q_len > kv_len).any():
        raise InvalidArgumentError("a sequence has more query tokens than keys: append K/V first")
    G = num_qo_heads // num_kv_heads
    pos = check_positions(positions, kv_len)
    kv_first = None if window is None else window_starts(kv_len, qi, window, pos)

    # One entry per (sequence, row tile): the keys its last row may see (causal limit + 1), and the first
    # key its first row sees (0 without a window; rows of later tokens start no earlier).
    tiles_per_seq = _ceil_div(q_len * G, ROWS_PER_TILE)
    seq = np.repeat(np.arange(batch, dtype=np.int64), tiles_per_seq)
    first_tile = np.repeat(np.cumsum(tiles_per_seq) - tiles_per_seq, tiles_per_seq)
    tile = np.arange(seq.shape[0], dtype=np.int64) - first_tile
    last_row = np.minimum((tile + 1) * ROWS_PER_TILE, q_len[seq] * G) - 1
    keys = kv_len[seq] - q_len[seq] + last_row // G + 1
    kv64 = kv_len.astype(np.int64)
    if kv_first is None:
        lo = np.zeros_like(keys)
        span = kv64  # keys a sequence's queries see, together
    else:
        lo = kv_first[qi[seq] + tile * ROWS_PER_TILE // G].astype(np.int64)
        has_q = q_len > 0
        span = kv64.copy()
        span[has_q] -= kv_first[qi[:-1][has_q]]

    if chunk_len is None:
        slots = min(num_sms * blocks_per_sm, 2**40)  # past any device; keeps the cost model in int64
        # Clamped: a sequence of 2**31 - 1 keys left whole would need a chunk of 2**31 (-2**31 in int32).
        chunk_lens = np.minimum(_wave_chunks(span, seq, keys, lo, num_kv_heads, slots), MAX_CHUNK_LEN)
    else:
        chunk_lens = np.full(batch, chunk_len, dtype=np.int64)

    # Chunks stay at multiples of chunk_lens (the reference cuts there too); a tile skips the chunks
    # before its first visible key, and its first item starts at that key.
    tile_chunk = chunk_lens[seq]
    skipped = lo // tile_chunk
    n_splits = np.maximum(1, _ceil_div(keys, tile_chunk) - skipped)
    n_items = int(n_splits.sum())
    owner = np.repeat(np.arange(seq.shape[0]), n_splits)  # tile index of every item
    k = np.arange(n_items) - np.repeat(np.cumsum(n_splits) - n_splits, n_splits)  # split index in its tile
    begin = (skipped[owner] + k) * tile_chunk[owner]
    end = np.minimum(begin + tile_chunk[owner], keys[owner])
    begin = np.maximum(begin, lo[owner] // STEP_ALIGN * STEP_ALIGN)  # keys before lo are masked
    split_tile = n_splits[owner] > 1
    partial = np.full(n_items, -1, dtype=np.int64)
    partial[split_tile] = np.arange(int(split_tile.sum()))
    items = np.stack([seq[owner], tile[owner], begin, end, partial], axis=1).astype(np.int32)

    multi = n_splits > 1
    first = np.cumsum(np.where(multi, n_splits, 0)) - np.where(multi, n_splits, 0)
    merges = np.stack([seq[multi], tile[multi], first[multi], n_splits[multi]], axis=1).astype(np.int32)
    plan = AttentionPlan(
        batch_size=batch,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        page_size=page_size,
        page_table=pt,
        kv_len=_frozen(kv_len),
        q_indptr=qi,
        chunk_lens=_frozen(chunk_lens.astype(np.int32)),
        items=_frozen(items.reshape(-1, 5)),
        merges=_frozen(merges.reshape(-1, 4)),
        num_partials=int(split_tile.sum()),
        window=window,
        positions=None if pos is None else _frozen(pos),
        kv_first=None if kv_first is None else _frozen(kv_first),
        variant=variant,
    )
    object.__setattr__(plan, "_seal", _SEAL)  # the arrays above are consistent: the kernels may run it
    return plan
