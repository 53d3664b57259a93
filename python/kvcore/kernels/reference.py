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

from typing import Any

import numpy as np

from kvcore.exceptions import InvalidDTypeError
from kvcore.kernels import checks
from kvcore.kernels.plan import (
    AttentionPlan,
    PageTableLike,
)
from kvcore.pool import KVPool, dtypes

__all__ = [
    "append_kv",
    "copy_pages",
    "gather_pages",
    "paged_decode_attention",
    "paged_prefill_attention",
    "scatter_pages",
]


def _from_float32(x: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """float32 values as ``dtype`` (uint16 = bf16 bits, rounded to nearest even)."""
    if dtype == np.uint16:
        out: np.ndarray = dtypes.float_to_bf16_bits(x)
        return out
    return x.astype(dtype)


# ------------------------------------------------------------------------------------ append_kv


def _host_rows(x: Any, name: str) -> np.ndarray:
    """``x`` (checked by :func:`checks.check_rows`) as a NumPy array, or InvalidDTypeError for an object
    that only looks like one (its ``__array__`` refuses, as a device array's does)."""
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise InvalidDTypeError(f"{name}: expected a NumPy array, got {type(x).__name__} ({e})") from None


def append_kv(pool: KVPool, layer: int, slot_mapping: Any, k: Any, v: Any) -> None:
    """NumPy ``append_kv``; the contract is :func:`kvcore.kernels.append_kv`.

    Both K and V are encoded before either is written, so a refused call leaves the pool as it was.
    """
    layer = pool.check_layer(layer)
    s = checks.check_slots(pool, slot_mapping)
    T = int(s.shape[0])
    checks.check_rows(k, "k", T, pool.num_kv_heads, pool.head_dim)
    checks.check_rows(v, "v", T, pool.num_kv_heads, pool.head_dim)
    keep = s >= 0
    page, off = s[keep] // pool.page_size, s[keep] % pool.page_size
    encoded = [
        dtypes.encode(_host_rows(x, name)[keep], pool.kv_dtype, scale[layer][None, :, None])
        for name, x, scale in (("k", k, pool.k_scale), ("v", v, pool.v_scale))
    ]
    write_rows(pool, layer, page, off, encoded)


def write_rows(pool: KVPool, layer: int, page: Any, off: Any, encoded: list[Any]) -> None:
    """Write encoded K and V rows (``[T, Hkv, D]`` storage dtype each) at ``(page, off)`` of ``layer``,
    in the pool's layout (the host path here, and the GPU path's 8-bit encode with device arrays)."""
    for kv, enc in enumerate(encoded):
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


# Scores of one query tile and one key chunk, at most (float32 elements: 16 MiB), and a few temporaries
# of that size each: the memory of the reference attention apart from K/V and q, whatever the prefill.
_SCORE_ELEMENTS = 2**22


def _attend_tile(
    q_tile: Any,
    K: np.ndarray,
    V: np.ndarray,
    kp: np.ndarray,
    qp: np.ndarray,
    bounds: list[tuple[int, int]],
    Hkv: int,
    G: int,
    D: int,
    sm_scale: float,
    W: int | None,
    null: np.ndarray | None,
    k0: int,
    mass: np.ndarray | None,
    page_size: int,
) -> np.ndarray:
    """float32 ``[n, Hkv * G, D]``: attention of ``n`` consecutive query tokens of one sequence.

    ``q_tile`` ``[n, Hq, D]`` the tokens, ``qp`` ``[n]`` their positions; ``bounds`` the sequence's key
    chunks (the plan's split). Each chunk gives a normalized partial output and its log-sum-exp, merged
    with ``w_i = exp(lse_i - max lse)``. A chunk past every token of the tile (causally masked for all its
    rows) is skipped: it would add exact zeros. ``mass`` (or None) ``[entries]`` float64 gets each
    page-table entry's probability mass from these rows added.
    """
    n = q_tile.shape[0]
    # [Hkv, G * n, D]: rows of one kv head are (query head g, query token i), g-major.
    Q = dtypes.to_float32(q_tile).reshape(n, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * n, D)
    Q = Q * np.float32(sm_scale)
    limit = np.tile(qp, G)[:, None]  # [G * n, 1]: last key (position) each row sees
    live = [(c0, c1) for c0, c1 in bounds if kp[c0] <= qp[-1]]  # never empty: each token sees itself
    parts_o, parts_lse = [], []
    for c0, c1 in live:
        s = _masked_scores(Q, K, c0, c1, kp, qp, limit, W, null, k0)  # [Hkv, G * n, chunk]
        m = s.max(axis=-1, keepdims=True)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m_safe)
        del s
        lsum = p.sum(axis=-1, keepdims=True)
        o = np.matmul(p, V[:, c0 - k0 : c1 - k0])  # [Hkv, G * n, D]
        del p
        with np.errstate(divide="ignore", invalid="ignore"):
            parts_o.append(np.where(lsum > 0, o / lsum, 0.0))
            parts_lse.append(np.where(lsum > 0, m_safe + np.log(lsum), -np.inf))
    lse = np.stack(parts_lse)  # [chunks, Hkv, G * n, 1]
    top = lse.max(axis=0, keepdims=True)
    w = np.exp(lse - np.where(np.isfinite(top), top, 0.0))  # a row that sees no key: all weights 0
    wsum = w.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        merged = np.where(wsum > 0, (w * np.stack(parts_o)).sum(axis=0) / wsum, 0.0)  # [Hkv, G * n, D]
    if mass is not None:
        # exp(s - lse) <= 1 with the merged log-sum-exp; a row that sees no key (lse -inf) adds 0.
        with np.errstate(divide="ignore"):
            row_lse = np.where(wsum > 0, top[0] + np.log(wsum), 0.0)  # [Hkv, G * n, 1]
        for c0, c1 in live:
            s = _masked_scores(Q, K, c0, c1, kp, qp, limit, W, null, k0)
            per_key = np.exp(s - row_lse).sum(axis=(0, 1))  # [c1 - c0]
            mass += np.bincount(np.arange(c0, c1) // page_size, per_key, minlength=mass.shape[0])
    res: np.ndarray = merged.reshape(Hkv, G, n, D).transpose(2, 0, 1, 3).reshape(n, Hkv * G, D)
    return res.astype(np.float32)


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
        chunk = int(plan.chunk_lens[b])
        bounds = [(max(c, first), min(c + chunk, L)) for c in range(first - first % chunk, L, chunk)]
        # Query tokens in tiles of n, so that a tile's scores [Hkv, G * n, chunk] stay within
        # _SCORE_ELEMENTS (a long prefill's [Hq, q_len, kv_len] would not fit in memory). Rows are
        # independent, so tiling changes no result beyond float32 rounding.
        n = max(1, min(ql, _SCORE_ELEMENTS // (Hkv * G * max(1, min(chunk, L - first)))))
        mass = np.zeros(e1 - e0, dtype=np.float64) if page_scores is not None else None
        for t0 in range(0, ql, n):
            t1 = min(ql, t0 + n)
            res = _attend_tile(
                q[q0 + t0 : q0 + t1],
                K,
                V,
                kp,
                qp[t0:t1],
                bounds,
                Hkv,
                G,
                D,
                sm_scale,
                W,
                null,
                k0,
                mass,
                pool.page_size,
            )
            out[q0 + t0 : q0 + t1] = _from_float32(res, out.dtype)
        if page_scores is not None and mass is not None:
            page_scores[e0:e1] += mass.astype(np.float32)
    return out


def _call(
    q: Any,
    pool: KVPool,
    layer: int,
    page_table: Any,
    q_indptr: Any,
    sm_scale: Any,
    plan: AttentionPlan | None,
    *,
    decode: bool,
    out: Any,
    window: Any,
    positions: Any,
    page_scores: Any,
) -> Any:
    """Decode (``decode``; ``q_indptr`` unused) or prefill: the checks, a plan if none, the attention."""
    layer, plan, scale = checks.prepare_attention(
        q,
        pool,
        layer,
        page_table,
        q_indptr,
        sm_scale,
        plan,
        decode=decode,
        out=out,
        window=window,
        positions=positions,
        page_scores=page_scores,
    )
    return attention(q, pool, layer, plan, scale, checks.output_like(q, np, out), page_scores)


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
    """NumPy ``paged_decode_attention``; the contract is :func:`kvcore.kernels.paged_decode_attention`."""
    mask = {"window": window, "positions": positions, "page_scores": page_scores}
    return _call(q, pool, layer, page_table, None, sm_scale, plan, decode=True, out=out, **mask)


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
    """NumPy ``paged_prefill_attention``; the contract is :func:`kvcore.kernels.paged_prefill_attention`."""
    mask = {"window": window, "positions": positions, "page_scores": page_scores}
    return _call(q, pool, layer, page_table, q_indptr, sm_scale, plan, decode=False, out=out, **mask)


# ------------------------------------------------------------------------------------ page copies


def copy_pages(pool: KVPool, pairs: Any) -> None:
    """NumPy ``copy_pages``; the contract is :func:`kvcore.kernels.copy_pages`."""
    p = checks.check_pairs(pool, pairs)
    pool.data[:, :, p[:, 1]] = pool.data[:, :, p[:, 0]]


def gather_pages(pool: KVPool, page_ids: Any, out: Any) -> Any:
    """NumPy ``gather_pages``; the contract is :func:`kvcore.kernels.gather_pages`."""
    ids = checks.check_page_ids(pool, page_ids)
    checks.check_host_buffer(pool, out, ids.shape[0], "out")
    out[...] = np.moveaxis(pool.data[:, :, ids], 2, 0)
    return out


def scatter_pages(pool: KVPool, page_ids: Any, src: Any) -> None:
    """NumPy ``scatter_pages``; the contract is :func:`kvcore.kernels.scatter_pages`."""
    ids = checks.check_page_ids(pool, page_ids)
    checks.check_host_buffer(pool, src, ids.shape[0], "src")
    pool.data[:, :, ids] = np.moveaxis(np.asarray(src), 0, 2)
