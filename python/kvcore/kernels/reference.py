"""NumPy references of the paged KV kernels: the ground truth the CUDA kernels are tested against.

Same signatures as :mod:`kvcore.kernels` (which dispatches here for ``backend="numpy"`` pools). They are
vectorized per sequence (one einsum per key chunk), so CPU users can run them on real batches.
Precision: keys and values are dequantized to float32 and every product, softmax and merge is float32;
the result is rounded once to the dtype of ``q``.

Attention follows the plan's split-K partition exactly: sequence ``b``'s keys are cut at multiples of
``plan.chunk_lens[b]``, every chunk yields a normalized partial output and its log-sum-exp, and the chunks are
merged with ``w_i = exp(lse_i - max lse)``. So the CPU runs the split logic of the GPU kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels.plan import AttentionPlan, PageTableLike, plan_attention
from kvcore.pool import KVPool, dtypes

__all__ = [
    "append_kv",
    "copy_pages",
    "gather_pages",
    "paged_decode_attention",
    "paged_prefill_attention",
    "scatter_pages",
]


# ------------------------------------------------------------------------------------ validation
# (shared with the CUDA dispatch: every check runs before anything is written)


def check_rows(x: Any, name: str, num_rows: int | None, num_heads: int, head_dim: int) -> None:
    """``x`` must be ``[num_rows, num_heads, head_dim]`` float (or uint16 bf16 bits)."""
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


def check_slots(pool: KVPool, slot_mapping: Any, num_tokens: int) -> np.ndarray | None:
    """Validate a slot mapping; returns it as a host int64 array (None when it lives on the device).

    Device arrays are only checked for shape and dtype (checking values would synchronize).
    """
    if tuple(slot_mapping.shape) != (num_tokens,) or slot_mapping.dtype.kind not in "iu":
        raise InvalidDTypeError(
            f"slot_mapping: expected [{num_tokens}] int64, got {slot_mapping.dtype}{list(slot_mapping.shape)}"
        )
    if not isinstance(slot_mapping, np.ndarray):
        return None
    s = slot_mapping.astype(np.int64, copy=False)
    limit = pool.num_pages * pool.page_size
    if ((s < -1) | (s >= limit)).any():
        raise InvalidArgumentError(f"slot_mapping: slots must be -1 (skip) or in [0, {limit})")
    used = s[s >= 0]
    if np.unique(used).shape[0] != used.shape[0]:
        raise InvalidArgumentError("slot_mapping: a slot appears twice in one call")
    return s


def check_page_ids(pool: KVPool, page_ids: Any, name: str = "page_ids") -> np.ndarray:
    """1-D integer page ids in ``[1, num_pages)``, no repeats; returned as host int64."""
    ids = np.asarray(page_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InvalidDTypeError(f"{name}: expected 1-D int32 page ids, got {ids.dtype}{list(ids.shape)}")
    ids = ids.astype(np.int64)
    if ((ids < 1) | (ids >= pool.num_pages)).any():
        raise InvalidPageError(f"{name}: page ids must be in [1, {pool.num_pages}) (page 0 is the null page)")
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise InvalidArgumentError(f"{name}: a page appears twice")
    return ids


def check_pairs(pool: KVPool, pairs: Any) -> np.ndarray:
    """``[n, 2]`` (src, dst) page pairs: ids valid, destinations distinct and never a source."""
    p = np.asarray(pairs)
    if p.ndim != 2 or p.shape[1] != 2 or p.dtype.kind not in "iu":
        raise InvalidDTypeError(f"pairs: expected [n, 2] int (src, dst), got {p.dtype}{list(p.shape)}")
    p = p.astype(np.int64)
    if ((p < 1) | (p >= pool.num_pages)).any():
        raise InvalidPageError(f"pairs: page ids must be in [1, {pool.num_pages}) (page 0 is the null page)")
    src, dst = p[:, 0], p[:, 1]
    if np.unique(dst).shape[0] != dst.shape[0] or np.isin(dst, src).any():
        raise InvalidArgumentError("pairs: destinations must be distinct and none may also be a source")
    return p


def check_host_buffer(pool: KVPool, buf: Any, num_pages: int, name: str) -> None:
    """``buf`` must be ``[num_pages, num_layers, 2, *page_shape]``, the pool's storage dtype, C-contiguous."""
    want = (num_pages, pool.num_layers, 2, *pool.page_shape)
    if tuple(buf.shape) != want or buf.dtype != pool.storage_dtype:
        raise InvalidDTypeError(
            f"{name}: expected {pool.storage_dtype}{list(want)}, got {buf.dtype}{list(buf.shape)}"
        )
    if not buf.flags.c_contiguous:
        raise InvalidDTypeError(f"{name}: must be C-contiguous")


def output_like(q: Any, xp: Any, out: Any) -> Any:
    """The output array: ``out`` checked against ``q``, or a new array shaped and typed like ``q``."""
    if out is None:
        return xp.empty(q.shape, dtype=q.dtype)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
        raise InvalidDTypeError(f"out: expected {q.dtype}{list(q.shape)}, got {out.dtype}{list(out.shape)}")
    return out


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
        slot_mapping: int64 ``[num_tokens]``; ``slot = page_id * page_size + offset``; -1 skips the row.
        k: ``[num_tokens, num_kv_heads, head_dim]`` keys (float, or uint16 bf16 bits).
        v: same shape, values.

    Side effects: writes ``pool.data[layer]`` at the given slots (and nothing else).
    """
    layer = pool.check_layer(layer)
    T = int(slot_mapping.shape[0]) if hasattr(slot_mapping, "shape") else len(slot_mapping)
    check_rows(k, "k", T, pool.num_kv_heads, pool.head_dim)
    check_rows(v, "v", T, pool.num_kv_heads, pool.head_dim)
    s = check_slots(pool, np.asarray(slot_mapping), T)
    assert s is not None
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


def attention(q: Any, pool: KVPool, layer: int, plan: AttentionPlan, sm_scale: float, out: Any) -> Any:
    """Causal paged attention of ``q`` over the plan's page table; see :func:`paged_prefill_attention`."""
    G, Hkv, D = plan.group_size, plan.num_kv_heads, pool.head_dim
    qf = dtypes.to_float32(q)
    pt = plan.page_table
    for b in range(plan.batch_size):
        q0, q1 = int(plan.q_indptr[b]), int(plan.q_indptr[b + 1])
        if q1 == q0:
            continue
        L, ql = int(plan.kv_len[b]), q1 - q0
        pages = pt.kv_indices[pt.kv_indptr[b] : pt.kv_indptr[b + 1]]
        K = _gather_keys(pool, layer, 0, pages, L)
        V = _gather_keys(pool, layer, 1, pages, L)
        # [Hkv, G * ql, D]: rows of one kv head are (query head g, query token i), g-major.
        Q = qf[q0:q1].reshape(ql, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * ql, D) * np.float32(
            sm_scale
        )
        limit = np.tile(L - ql + np.arange(ql), G)[:, None]  # [G * ql, 1]: last key each row sees
        parts_o, parts_lse = [], []
        chunk = int(plan.chunk_lens[b])
        for c0 in range(0, L, chunk):
            c1 = min(c0 + chunk, L)
            s = np.matmul(Q, K[:, c0:c1].transpose(0, 2, 1))  # [Hkv, G * ql, chunk]
            if c1 - 1 > L - ql:  # causal mask: only chunks that reach past the first query token
                s = np.where(np.arange(c0, c1)[None, :] <= limit, s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m_safe)
            lsum = p.sum(axis=-1, keepdims=True)
            o = np.matmul(p, V[:, c0:c1])  # [Hkv, G * ql, D]
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
    return out


def _prepare(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: PageTableLike | tuple[Any, Any, Any],
    q_indptr: Any,
    sm_scale: float | None,
    plan: AttentionPlan | None,
    num_sms: int = 132,
    blocks_per_sm: int = 2,
) -> tuple[int, AttentionPlan, float]:
    """Shared argument checks of decode and prefill (both backends); returns (layer, plan, sm_scale)."""
    layer = pool.check_layer(layer)
    if len(q.shape) != 3 or q.shape[2] != pool.head_dim or q.shape[1] % pool.num_kv_heads:
        raise InvalidDTypeError(
            f"q: expected [num_tokens, num_qo_heads, {pool.head_dim}] with num_qo_heads a multiple of "
            f"{pool.num_kv_heads}, got {list(q.shape)}"
        )
    check_rows(q, "q", None, int(q.shape[1]), pool.head_dim)
    if plan is None:
        plan = plan_attention(
            page_table,
            q_indptr,
            page_size=pool.page_size,
            num_qo_heads=int(q.shape[1]),
            num_kv_heads=pool.num_kv_heads,
            num_sms=num_sms,
            blocks_per_sm=blocks_per_sm,
        )
    elif (
        plan.num_qo_heads != q.shape[1]
        or plan.num_kv_heads != pool.num_kv_heads
        or plan.page_size != pool.page_size
    ):
        raise InvalidArgumentError("plan: made for other head counts or another page size")
    if q.shape[0] != plan.num_q_tokens:
        raise InvalidDTypeError(f"q: the plan has {plan.num_q_tokens} query tokens, q has {q.shape[0]}")
    if (
        plan.page_table.kv_indices.size
        and ((plan.page_table.kv_indices < 1) | (plan.page_table.kv_indices >= pool.num_pages)).any()
    ):
        raise InvalidPageError(f"kv_indices: page ids must be in [1, {pool.num_pages})")
    scale = 1.0 / math.sqrt(pool.head_dim) if sm_scale is None else float(sm_scale)
    return layer, plan, scale


def decode_q_indptr(page_table: PageTableLike | tuple[Any, Any, Any]) -> np.ndarray:
    """int32 [batch + 1] ``arange``: one query token per sequence."""
    pt: Any = page_table
    last = pt.kv_last_page_len if hasattr(pt, "kv_last_page_len") else tuple(pt)[2]
    return np.arange(np.asarray(last).shape[0] + 1, dtype=np.int32)


def paged_decode_attention(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: PageTableLike | tuple[Any, Any, Any],
    sm_scale: float | None = None,
    *,
    plan: AttentionPlan | None = None,
    out: Any = None,
) -> Any:
    """Attention of one new query token per sequence over its paged K/V (GQA, split-K).

    Args:
        q: ``[batch, num_qo_heads, head_dim]`` (float, or uint16 bf16 bits); query head ``h`` reads kv
            head ``h // (num_qo_heads // num_kv_heads)``.
        pool: the pool, with this step's K/V already appended.
        layer: the layer read.
        page_table: the batch's CSR page table (int32 host arrays).
        sm_scale: softmax scale; ``1/sqrt(head_dim)`` by default.
        plan: a plan from :func:`plan_attention` for this batch, to reuse across layers.
        out: optional output, shaped and typed like ``q``.

    Returns:
        ``[batch, num_qo_heads, head_dim]`` in the dtype of ``q``.
    """
    layer, plan, scale = _prepare(q, pool, layer, page_table, decode_q_indptr(page_table), sm_scale, plan)
    return attention(q, pool, layer, plan, scale, output_like(q, np, out))


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
) -> Any:
    """Causal attention of new tokens over their cached prefix plus themselves (the prefix-hit path).

    Sequence ``b`` has query tokens ``q[q_indptr[b]:q_indptr[b+1]]``, which are the *last* ``q_len``
    of its ``kv_len`` keys (append them first): query token ``i`` sees keys ``j <= kv_len - q_len + i``.

    Args:
        q: ``[q_indptr[-1], num_qo_heads, head_dim]`` (float, or uint16 bf16 bits).
        pool, layer, page_table, sm_scale, plan, out: as :func:`paged_decode_attention`.
        q_indptr: int32 ``[batch + 1]`` offsets of each sequence's query tokens.

    Returns:
        ``[q_indptr[-1], num_qo_heads, head_dim]`` in the dtype of ``q``.
    """
    layer, plan, scale = _prepare(q, pool, layer, page_table, q_indptr, sm_scale, plan)
    return attention(q, pool, layer, plan, scale, output_like(q, np, out))


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
        page_ids: int32 ``[n]`` page ids.
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
