"""NumPy references of the paged KV kernels: the ground truth the CUDA kernels are tested against.

Same signatures as :mod:`kvcore.kernels` (which dispatches here for ``backend="numpy"`` pools). They are
vectorized per sequence (one einsum per key chunk), so CPU users can run them on real batches.
Precision: keys and values are dequantized to float32 and every product, softmax and merge is float32;
the result is rounded once to the dtype of ``q``.

Attention follows the plan's split-K partition exactly: sequence ``b``'s keys are cut at multiples of
``plan.chunk_lens[b]``, every chunk yields a normalized partial output and its log-sum-exp, and the chunks are
merged with ``w_i = exp(lse_i - max lse)``. So the CPU runs the split logic of the GPU kernel.

Bounded caches: the masks compare key positions literally (indices, or the plan's ``positions``), null-page
keys are masked and their K/V replaced by zeros before any product (so whatever the null page holds, NaN
included, cannot reach the output), and the pages before the first query token's window are not read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels.plan import (
    AttentionPlan,
    PageTableLike,
    check_positions,
    check_window,
    kv_lengths,
    plan_attention,
    unpack_page_table,
)
from kvcore.pool import KVPool, dtypes
from kvcore.pool.checks import check_array, index_array, positive_scalar

__all__ = [
    "append_kv",
    "copy_pages",
    "gather_pages",
    "paged_decode_attention",
    "paged_prefill_attention",
    "scatter_pages",
]


# ------------------------------------------------------------------------------------ validation
# (shared with the CUDA dispatch: every check runs on the host before anything is written or launched;
# index-like arguments go through kvcore.pool.checks.index_array, which ranges them before any cast)


def check_rows(x: Any, name: str, num_rows: int | None, num_heads: int, head_dim: int) -> None:
    """``x`` must be an array ``[num_rows, num_heads, head_dim]`` float (or uint16 bf16 bits)."""
    check_array(x, name)
    shape = tuple(x.shape)
    if (
        len(shape) != 3
        or shape[1:] != (num_heads, head_dim)
        or (num_rows is not None and shape[0] != num_rows)
    ):
        want = f"[{'n' if num_rows is None else num_rows}, {num_heads}, {head_dim}]"
        raise InvalidDTypeError(f"{name}: expected shape {want}, got {list(shape)}")
    if not (x.dtype.kind == "f" or x.dtype == np.uint16):
        raise InvalidDTypeError(f"{name}: expected float16/32/64 or uint16 (bf16 bits), got {x.dtype}")


def check_slots(pool: KVPool, slot_mapping: Any, *, device_ok: bool = False) -> Any:
    """A slot mapping as int64 ``[num_tokens]``: checked values on the host, or a device array as it is.

    Host inputs (arrays or lists, any integer dtype) are ranged to ``[-1, num_pages * page_size)`` before
    the cast and checked for repeats. Device arrays (only with ``device_ok``, the CUDA path) are checked
    for shape and for a dtype that int64 holds exactly (reading their values would synchronize).
    """
    if device_ok and hasattr(slot_mapping, "__cuda_array_interface__"):
        if (
            slot_mapping.ndim != 1
            or slot_mapping.dtype.kind not in "iu"
            or not np.can_cast(slot_mapping.dtype, np.int64)
        ):
            got = f"{slot_mapping.dtype}{list(slot_mapping.shape)}"
            raise InvalidDTypeError(f"slot_mapping: expected a 1-D int64 device array, got {got}")
        return slot_mapping
    limit = pool.num_pages * pool.page_size
    s = index_array(
        slot_mapping,
        "slot_mapping",
        dtype=np.int64,
        low=-1,
        high=limit,
        what="slots",
        hint=" (-1 skips a row)",
    )
    used = s[s >= 0]
    if used.shape[0] and int(used.min()) < pool.page_size:
        raise InvalidArgumentError(
            f"slot_mapping: slots 0..{pool.page_size - 1} are the null page 0, which is never written"
        )
    if np.unique(used).shape[0] != used.shape[0]:
        raise InvalidArgumentError("slot_mapping: a slot appears twice in one call")
    return s


def check_page_ids(pool: KVPool, page_ids: Any, name: str = "page_ids") -> np.ndarray:
    """1-D integer page ids (array or list) in ``[1, num_pages)``, no repeats; returned as host int64."""
    ids = index_array(
        page_ids,
        name,
        dtype=np.int64,
        low=1,
        high=pool.num_pages,
        what="page ids",
        hint=" (page 0 is the null page)",
        error=InvalidPageError,
    )
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise InvalidArgumentError(f"{name}: a page appears twice")
    return ids


def check_pairs(pool: KVPool, pairs: Any) -> np.ndarray:
    """``[n, 2]`` (src, dst) page pairs: ids valid, destinations distinct and never a source; host int64."""
    p = index_array(
        pairs,
        "pairs",
        dtype=np.int64,
        low=1,
        high=pool.num_pages,
        trailing=(2,),
        what="page ids",
        hint=" (page 0 is the null page)",
        error=InvalidPageError,
    )
    src, dst = p[:, 0], p[:, 1]
    if np.unique(dst).shape[0] != dst.shape[0] or np.isin(dst, src).any():
        raise InvalidArgumentError("pairs: destinations must be distinct and none may also be a source")
    return p


def check_host_buffer(pool: KVPool, buf: Any, num_pages: int, name: str) -> None:
    """``buf`` must be ``[num_pages, num_layers, 2, *page_shape]``, the pool's storage dtype, C-contiguous
    (and writable when it is a NumPy ``out``)."""
    check_array(buf, name)
    want = (num_pages, pool.num_layers, 2, *pool.page_shape)
    if tuple(buf.shape) != want or buf.dtype != pool.storage_dtype:
        raise InvalidDTypeError(
            f"{name}: expected {pool.storage_dtype}{list(want)}, got {buf.dtype}{list(buf.shape)}"
        )
    if not buf.flags.c_contiguous:
        raise InvalidDTypeError(f"{name}: must be C-contiguous")
    if name == "out" and isinstance(buf, np.ndarray) and not buf.flags.writeable:
        raise InvalidDTypeError(f"{name}: must be writable")


def check_out(q: Any, out: Any) -> None:
    """An ``out`` buffer (unless None) must be an array shaped and typed like ``q`` (and writable)."""
    if out is None:
        return
    check_array(out, "out")
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
        raise InvalidDTypeError(f"out: expected {q.dtype}{list(q.shape)}, got {out.dtype}{list(out.shape)}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise InvalidDTypeError("out: must be writable")


def output_like(q: Any, xp: Any, out: Any) -> Any:
    """The output array: ``out`` checked against ``q``, or a new array shaped and typed like ``q``."""
    if out is None:
        return xp.empty(q.shape, dtype=q.dtype)
    check_out(q, out)
    return out


def check_sm_scale(sm_scale: Any, head_dim: int) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` for None, else a real number finite and > 0 as float32."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else positive_scalar(sm_scale, "sm_scale")


def check_plan(plan: Any, pool: KVPool, q: Any) -> None:
    """``plan`` must be an :class:`AttentionPlan` for ``q``'s shape and this pool (heads, page size, pages).

    Raises:
        InvalidDTypeError: not a plan, or ``q`` is not ``[plan.num_q_tokens, num_qo_heads, head_dim]``.
        InvalidArgumentError: the plan was made for other head counts or another page size.
        InvalidPageError: the plan's page table reads a page this pool does not have.
    """
    if not isinstance(plan, AttentionPlan):
        raise InvalidDTypeError(
            f"plan: expected an AttentionPlan from plan_attention, got {type(plan).__name__}"
        )
    if len(q.shape) != 3 or q.shape[2] != pool.head_dim:
        raise InvalidDTypeError(
            f"q: expected [num_tokens, num_qo_heads, {pool.head_dim}], got {list(q.shape)}"
        )
    if (
        plan.num_qo_heads != q.shape[1]
        or plan.num_kv_heads != pool.num_kv_heads
        or plan.page_size != pool.page_size
    ):
        raise InvalidArgumentError("plan: made for other head counts or another page size")
    if q.shape[0] != plan.num_q_tokens:
        raise InvalidDTypeError(f"q: the plan has {plan.num_q_tokens} query tokens, q has {q.shape[0]}")
    idx = plan.page_table.kv_indices
    low = 0 if plan.window is not None else 1  # a windowed plan may hold the null page (always masked)
    if idx.size and (int(idx.min()) < low or int(idx.max()) >= pool.num_pages):
        raise InvalidPageError(
            f"kv_indices: page ids must be in [{low}, {pool.num_pages}) (page 0 is the null page)"
        )


def check_mask(plan: AttentionPlan, window: Any, positions: Any) -> None:
    """A call's ``window`` and ``positions`` must be those the plan was made with (it cut its work there).

    Raises:
        InvalidDTypeError: ``window`` or ``positions`` of the wrong type (see :func:`plan_attention`).
        InvalidArgumentError: bad values, or another window or other positions than the plan's.
    """
    w = check_window(window)
    if w != plan.window:
        raise InvalidArgumentError(
            f"window: the plan was made for window={plan.window}, this call has window={w} "
            "(make the plan with the call's window)"
        )
    pos = check_positions(positions, plan.kv_len)
    if (pos is None) != (plan.positions is None) or (
        pos is not None and plan.positions is not None and not np.array_equal(pos, plan.positions)
    ):
        raise InvalidArgumentError(
            "positions: not those the plan was made with (make the plan with the call's positions)"
        )


def check_page_scores(page_scores: Any, nnz: int, *, device: bool = False) -> None:
    """``page_scores`` (unless None) must be float32 ``[nnz]`` (``kv_indptr[-1]``): writable NumPy, or
    (``device``, the CUDA path) a C-contiguous device array."""
    if page_scores is None:
        return
    check_array(page_scores, "page_scores")
    on_device = hasattr(page_scores, "__cuda_array_interface__")
    where = "a device" if device else "a NumPy"
    if (
        on_device != device
        or (not device and not isinstance(page_scores, np.ndarray))
        or page_scores.dtype != np.float32
        or tuple(page_scores.shape) != (nnz,)
    ):
        raise InvalidDTypeError(
            f"page_scores: expected {where} float32[{nnz}] array (one entry per page-table entry), got "
            f"{'a device array ' if on_device else ''}{page_scores.dtype}{list(page_scores.shape)}"
        )
    if device and not page_scores.flags.c_contiguous:
        raise InvalidDTypeError("page_scores: must be C-contiguous")
    if not device and not page_scores.flags.writeable:
        raise InvalidDTypeError("page_scores: must be writable")


def _from_float32(x: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """float32 values as ``dtype`` (uint16 = bf16 bits, rounded to nearest even)."""
    if dtype == np.uint16:
        out: np.ndarray = dtypes.float_to_bf16_bits(x)
        return out
    return x.astype(dtype)


# ------------------------------------------------------------------------------------ append_kv


def append_kv(pool: KVPool, layer: int, slot_mapping: Any, k: Any, v: Any) -> None:
    """Scatter new K/V rows into their slots (vLLM's reshape_and_cache), quantizing for fp8/int8.

    Args:
        pool: a numpy-backend pool.
        layer: the layer written.
        slot_mapping: int64 ``[num_tokens]`` (or a list, or any integer dtype whose values fit);
            ``slot = page_id * page_size + offset``; -1 skips the row.
        k: ``[num_tokens, num_kv_heads, head_dim]`` keys (float, or uint16 bf16 bits).
        v: same shape, values.

    Side effects: writes ``pool.data[layer]`` at the given slots (and nothing else; nothing at all when an
    argument is refused).
    """
    layer = pool.check_layer(layer)
    s = check_slots(pool, slot_mapping)
    T = int(s.shape[0])
    check_rows(k, "k", T, pool.num_kv_heads, pool.head_dim)
    check_rows(v, "v", T, pool.num_kv_heads, pool.head_dim)
    keep = s >= 0
    page, off = s[keep] // pool.page_size, s[keep] % pool.page_size
    for kv, x, scale in ((0, k, pool.k_scale), (1, v, pool.v_scale)):
        enc = dtypes.encode(np.asarray(x)[keep], pool.kv_dtype, scale[layer][None, :, None])
        plane = pool.data[layer, kv]
        if pool.layout == "HND":
            plane[page, :, off] = enc
        else:
            plane[page, off] = enc


# ------------------------------------------------------------------------------------ attention


def _gather_keys(pool: KVPool, layer: int, kv: int, pages: np.ndarray, kv_len: int) -> np.ndarray:
    """float32 [Hkv, kv_len, D]: one sequence's dequantized K (kv=0) or V (kv=1), in token order."""
    block = pool.data[layer, kv][pages]  # HND [n, Hkv, P, D] / NHD [n, P, Hkv, D]
    if pool.layout == "HND":
        rows = block.transpose(1, 0, 2, 3).reshape(pool.num_kv_heads, -1, pool.head_dim)[:, :kv_len]
    else:
        rows = block.reshape(-1, pool.num_kv_heads, pool.head_dim)[:kv_len].transpose(1, 0, 2)
    scale = (pool.k_scale if kv == 0 else pool.v_scale)[layer]
    if pool.kv_dtype == "fp8":  # one table lookup per head, the scale folded into the table
        out = np.empty(rows.shape, dtype=np.float32)
        for h in range(pool.num_kv_heads):
            np.take(dtypes.E4M3_TABLE * scale[h], rows[h], out=out[h])
        return out
    decoded: np.ndarray = dtypes.decode(rows, pool.kv_dtype, scale[:, None, None])
    return decoded


def _masked_scores(
    Q: np.ndarray,
    K: np.ndarray,
    c0: int,
    c1: int,
    kp: np.ndarray,
    qp: np.ndarray,
    limit: np.ndarray,
    window: int | None,
    null: np.ndarray | None,
    k0: int = 0,
) -> np.ndarray:
    """``[Hkv, rows, c1 - c0]`` scores of keys ``[c0, c1)`` of one sequence, masked keys at -inf.

    ``Q`` ``[Hkv, rows, D]`` scaled queries; ``K`` ``[Hkv, kv_len - k0, D]`` the keys from ``k0`` on and
    ``null`` (or None) ``[kv_len - k0]`` which of them are on the null page; ``kp`` ``[kv_len]`` key
    positions, ``qp`` ``[q_len]`` query positions, ``limit`` ``[rows, 1]`` each row's query position. A
    mask is only built where some key of the chunk needs it.
    """
    s = np.matmul(Q, K[:, c0 - k0 : c1 - k0].transpose(0, 2, 1))
    kc = kp[c0:c1]
    visible = None
    if kc[-1] > qp[0]:  # causal mask: only chunks that reach past the first query token
        visible = kc[None, :] <= limit
    if window is not None and kc[0] <= qp[-1] - window:  # window: chunks reaching before the last row's
        inside = kc[None, :] > limit - window
        visible = inside if visible is None else visible & inside
    if null is not None and null[c0 - k0 : c1 - k0].any():
        live = ~null[None, c0 - k0 : c1 - k0]
        visible = live if visible is None else visible & live
    return s if visible is None else np.where(visible, s, -np.inf)


def attention(
    q: Any,
    pool: KVPool,
    layer: int,
    plan: AttentionPlan,
    sm_scale: float,
    out: Any,
    page_scores: np.ndarray | None = None,
) -> Any:
    """Paged attention of ``q`` over the plan's page table and mask; see :func:`paged_prefill_attention`.

    ``page_scores`` (float32 ``[kv_indptr[-1]]``, checked) gets each page-table entry's probability mass
    added: ``exp(s - lse)`` of the merged log-sum-exp, summed over the rows and keys of the entry.
    """
    G, Hkv, D = plan.group_size, plan.num_kv_heads, pool.head_dim
    qf = dtypes.to_float32(q)
    pt = plan.page_table
    W = None if plan.window is None else min(plan.window, 2**32)  # past every int32 position: unbounded
    key_start = np.cumsum(plan.kv_len, dtype=np.int64) - plan.kv_len
    for b in range(plan.batch_size):
        q0, q1 = int(plan.q_indptr[b]), int(plan.q_indptr[b + 1])
        if q1 == q0:
            continue
        L, ql = int(plan.kv_len[b]), q1 - q0
        e0, e1 = int(pt.kv_indptr[b]), int(pt.kv_indptr[b + 1])
        # Key positions (indices, or the compacted table's); query token i is key L - ql + i.
        kp = np.arange(L)
        if plan.positions is not None:
            kp = plan.positions[key_start[b] : key_start[b] + L].astype(np.int64)
        qp = kp[L - ql :]
        # The first query token's window starts the work (later tokens see no earlier key): only the
        # pages from the one holding that key on are read, keys k0.. of the sequence.
        first = 0 if W is None else int(np.searchsorted(kp, qp[0] - W, side="right"))
        skip = first // pool.page_size
        k0 = skip * pool.page_size
        pages = pt.kv_indices[e0 + skip : e1]
        K = _gather_keys(pool, layer, 0, pages, L - k0)
        V = _gather_keys(pool, layer, 1, pages, L - k0)
        null = None
        if W is not None and not pages.all():  # null-page keys: masked, and their K/V never multiplied
            null = np.repeat(pages == 0, pool.page_size)[: L - k0]
            K = np.where(null[None, :, None], np.float32(0), K)
            V = np.where(null[None, :, None], np.float32(0), V)
        # [Hkv, G * ql, D]: rows of one kv head are (query head g, query token i), g-major.
        Q = qf[q0:q1].reshape(ql, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * ql, D) * np.float32(
            sm_scale
        )
        limit = np.tile(qp, G)[:, None]  # [G * ql, 1]: last key (position) each row sees

        chunk = int(plan.chunk_lens[b])
        bounds = [(max(c, first), min(c + chunk, L)) for c in range(first - first % chunk, L, chunk)]
        parts_o, parts_lse = [], []
        for c0, c1 in bounds:
            s = _masked_scores(Q, K, c0, c1, kp, qp, limit, W, null, k0)  # [Hkv, G * ql, chunk]
            m = s.max(axis=-1, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m_safe)
            lsum = p.sum(axis=-1, keepdims=True)
            o = np.matmul(p, V[:, c0 - k0 : c1 - k0])  # [Hkv, G * ql, D]
            with np.errstate(divide="ignore", invalid="ignore"):
                parts_o.append(np.where(lsum > 0, o / lsum, 0.0))
                parts_lse.append(np.where(lsum > 0, m_safe + np.log(lsum), -np.inf))
        lse = np.stack(parts_lse)  # [chunks, Hkv, G * ql, 1]
        top = lse.max(axis=0, keepdims=True)
        w = np.exp(lse - np.where(np.isfinite(top), top, 0.0))  # a row that sees no key: all weights 0
        wsum = w.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            merged = np.where(wsum > 0, (w * np.stack(parts_o)).sum(axis=0) / wsum, 0.0)  # [Hkv, G * ql, D]
        res = merged.reshape(Hkv, G, ql, D).transpose(2, 0, 1, 3).reshape(ql, Hkv * G, D).astype(np.float32)
        out[q0:q1] = _from_float32(res, out.dtype)
        if page_scores is not None:
            # exp(s - lse) <= 1 with the merged log-sum-exp; a row that sees no key (lse -inf) adds 0.
            with np.errstate(divide="ignore"):
                row_lse = np.where(wsum > 0, top[0] + np.log(wsum), 0.0)  # [Hkv, G * ql, 1]
            mass = np.zeros(e1 - e0, dtype=np.float64)  # this sequence's entries
            for c0, c1 in bounds:
                s = _masked_scores(Q, K, c0, c1, kp, qp, limit, W, null, k0)
                per_key = np.exp(s - row_lse).sum(axis=(0, 1))  # [c1 - c0]
                mass += np.bincount(np.arange(c0, c1) // pool.page_size, per_key, minlength=e1 - e0)
            page_scores[e0:e1] += mass.astype(np.float32)
    return out


def _prepare(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: PageTableLike | tuple[Any, Any, Any],
    q_indptr: Any,
    sm_scale: Any,
    plan: AttentionPlan | None,
    *,
    decode: bool = False,
    out: Any = None,
    occupancy: Callable[[], dict[str, int]] | None = None,
    window: Any = None,
    positions: Any = None,
    page_scores: Any = None,
    device: bool = False,
) -> tuple[int, AttentionPlan, float]:
    """Shared argument checks of decode and prefill (both backends); returns (layer, plan, sm_scale).

    ``decode``: one query token per sequence (``q_indptr`` is not read); ``out``: the caller's output
    buffer, checked against ``q``. Without a ``plan`` one is made here, with ``window`` and ``positions``,
    after the page table and ``q_indptr`` are checked; ``occupancy`` (the CUDA path) then gives its
    ``num_sms`` and ``blocks_per_sm``. With a plan, ``page_table`` and ``q_indptr`` are not read, and
    ``window`` and ``positions`` must be the plan's. ``page_scores`` is checked against the plan's table,
    as a device array when ``device`` (the CUDA path).
    """
    layer = pool.check_layer(layer)
    scale = check_sm_scale(sm_scale, pool.head_dim)
    check_array(q, "q")
    if len(q.shape) != 3 or q.shape[2] != pool.head_dim or q.shape[1] % pool.num_kv_heads:
        raise InvalidDTypeError(
            f"q: expected [num_tokens, num_qo_heads, {pool.head_dim}] with num_qo_heads a multiple of "
            f"{pool.num_kv_heads}, got {list(q.shape)}"
        )
    check_rows(q, "q", None, int(q.shape[1]), pool.head_dim)
    check_out(q, out)
    if plan is None:
        pt = unpack_page_table(page_table, allow_null=check_window(window) is not None)
        if decode:
            q_indptr = np.arange(pt.kv_last_page_len.shape[0] + 1, dtype=np.int32)
        else:
            q_indptr = index_array(q_indptr, "q_indptr", dtype=np.int32, low=0, what="offsets")
        # Checked here too (the plan checks them again), so that no occupancy query precedes a refusal.
        check_positions(positions, kv_lengths(pt, pool.page_size))
        check_page_scores(page_scores, pt.kv_indices.shape[0], device=device)
        plan = plan_attention(
            pt,
            q_indptr,
            page_size=pool.page_size,
            num_qo_heads=int(q.shape[1]),
            num_kv_heads=pool.num_kv_heads,
            window=window,
            positions=positions,
            **(occupancy() if occupancy is not None else {}),
        )
        check_plan(plan, pool, q)
        return layer, plan, scale
    check_plan(plan, pool, q)
    check_mask(plan, window, positions)
    check_page_scores(page_scores, plan.page_table.kv_indices.shape[0], device=device)
    return layer, plan, scale


def paged_decode_attention(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: PageTableLike | tuple[Any, Any, Any],
    sm_scale: float | None = None,
    *,
    plan: AttentionPlan | None = None,
    out: Any = None,
    window: int | None = None,
    positions: Any = None,
    page_scores: Any = None,
) -> Any:
    """Attention of one new query token per sequence over its paged K/V (GQA, split-K).

    Args:
        q: ``[batch, num_qo_heads, head_dim]`` (float, or uint16 bf16 bits); query head ``h`` reads kv
            head ``h // (num_qo_heads // num_kv_heads)``.
        pool: the pool, with this step's K/V already appended.
        layer: the layer read.
        page_table: the batch's CSR page table (int32 host arrays; lists and other integer dtypes are
            ranged, then converted).
        sm_scale: softmax scale, finite and > 0; ``1/sqrt(head_dim)`` by default.
        plan: a plan from :func:`plan_attention` for this batch, to reuse across layers.
        out: optional output, shaped and typed like ``q``.
        window, positions, page_scores: bounded caches, see :func:`kvcore.kernels.paged_decode_attention`
            (``page_scores`` a NumPy array here).

    Returns:
        ``[batch, num_qo_heads, head_dim]`` in the dtype of ``q``.

    Raises:
        InvalidDTypeError: an argument of the wrong type, shape or dtype (``None`` or a list for ``q``).
        InvalidArgumentError, InvalidPageError: a value out of range (a page id, an offset, ``sm_scale``).
    """
    layer, plan, scale = _prepare(
        q,
        pool,
        layer,
        page_table,
        None,
        sm_scale,
        plan,
        decode=True,
        out=out,
        window=window,
        positions=positions,
        page_scores=page_scores,
    )
    return attention(q, pool, layer, plan, scale, output_like(q, np, out), page_scores)


def paged_prefill_attention(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: PageTableLike | tuple[Any, Any, Any],
    q_indptr: Any,
    sm_scale: float | None = None,
    *,
    plan: AttentionPlan | None = None,
    out: Any = None,
    window: int | None = None,
    positions: Any = None,
    page_scores: Any = None,
) -> Any:
    """Causal attention of new tokens over their cached prefix plus themselves (the prefix-hit path).

    Sequence ``b`` has query tokens ``q[q_indptr[b]:q_indptr[b+1]]``, which are the *last* ``q_len``
    of its ``kv_len`` keys (append them first): query token ``i`` sees keys ``j <= kv_len - q_len + i``.

    Args:
        q: ``[q_indptr[-1], num_qo_heads, head_dim]`` (float, or uint16 bf16 bits).
        pool, layer, page_table, sm_scale, plan, out: as :func:`paged_decode_attention`.
        q_indptr: int32 ``[batch + 1]`` offsets of each sequence's query tokens.
        window, positions, page_scores: as :func:`paged_decode_attention`.

    Returns:
        ``[q_indptr[-1], num_qo_heads, head_dim]`` in the dtype of ``q``.
    """
    layer, plan, scale = _prepare(
        q,
        pool,
        layer,
        page_table,
        q_indptr,
        sm_scale,
        plan,
        out=out,
        window=window,
        positions=positions,
        page_scores=page_scores,
    )
    return attention(q, pool, layer, plan, scale, output_like(q, np, out), page_scores)


# ------------------------------------------------------------------------------------ page copies


def copy_pages(pool: KVPool, pairs: Any) -> None:
    """Copy whole pages, every layer, K and V: ``pool[:, :, dst] = pool[:, :, src]`` (CoW and defrag).

    Args:
        pairs: ``[n, 2]`` int (src page, dst page); destinations distinct, none also a source.
    """
    p = check_pairs(pool, pairs)
    pool.data[:, :, p[:, 1]] = pool.data[:, :, p[:, 0]]


def gather_pages(pool: KVPool, page_ids: Any, out: Any) -> Any:
    """Pack pages into a page-major host buffer (offload): ``out[i] = pool[:, :, page_ids[i]]``.

    Args:
        page_ids: int32 ``[n]`` page ids (or a list, or any integer dtype whose values are page ids).
        out: ``[n, num_layers, 2, *page_shape]`` storage dtype, C-contiguous (:meth:`KVPool.host_buffer`).

    Returns:
        ``out``.
    """
    ids = check_page_ids(pool, page_ids)
    check_host_buffer(pool, out, ids.shape[0], "out")
    out[...] = np.moveaxis(pool.data[:, :, ids], 2, 0)
    return out


def scatter_pages(pool: KVPool, page_ids: Any, src: Any) -> None:
    """Unpack a page-major host buffer into pages (reload): ``pool[:, :, page_ids[i]] = src[i]``.

    Args:
        page_ids: int32 ``[n]`` distinct page ids.
        src: ``[n, num_layers, 2, *page_shape]`` storage dtype, C-contiguous.
    """
    ids = check_page_ids(pool, page_ids)
    check_host_buffer(pool, src, ids.shape[0], "src")
    pool.data[:, :, ids] = np.moveaxis(np.asarray(src), 0, 2)
