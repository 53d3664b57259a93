"""The paged KV kernels: one API, a NumPy reference and a CUDA kernel behind each operation.

Each call dispatches on the pool's backend: ``numpy`` pools run :mod:`kvcore.kernels.reference` (the
ground truth, what CPU users run), ``cupy`` pools run the CUDA kernels of ``kernels/csrc/*.cu``, compiled by
NVRTC on first use (:mod:`kvcore.kernels.loader`). Page tables and slot mappings are the int32/int64
arrays the Rust core produces (FlashInfer CSR; ``slot = page_id * page_size + offset``).

Both paths check every argument on the host before the first write or launch, with the same checks
(:mod:`kvcore.pool.checks`): index-like arguments may be lists or any integer dtype, and are ranged before
the cast to int32/int64, so a value that would wrap is refused. Wrong types, shapes and dtypes raise
:class:`~kvcore.exceptions.InvalidDTypeError`, values out of range
:class:`~kvcore.exceptions.InvalidArgumentError` or :class:`~kvcore.exceptions.InvalidPageError`; a
refused call has written nothing. Contracts of each call: ``docs/api.md``.

Bounded caches (sliding-window layers, StreamingLLM, page-level heavy hitters) use three optional
arguments of both attention calls: ``window``, ``positions`` and ``page_scores``; without them the calls
are exactly the plain causal kernels.

Typical step of a model runner::

    plan = plan_attention(pt, q_indptr, page_size=pool.page_size, num_qo_heads=Hq, num_kv_heads=Hkv)
    for layer in range(num_layers):
        append_kv(pool, layer, slots, k[layer], v[layer])
        o = paged_prefill_attention(q[layer], pool, layer, pt, q_indptr, plan=plan)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kvcore.exceptions import InvalidDTypeError
from kvcore.kernels.plan import AttentionPlan, PageTableArrays, PageTableLike, plan_attention
from kvcore.pool import KVPool

__all__ = [
    "AttentionPlan",
    "PageTableArrays",
    "PageTableLike",
    "append_kv",
    "copy_pages",
    "gather_pages",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_attention",
    "scatter_pages",
]


def _impl(pool: KVPool) -> ModuleType:
    if not isinstance(pool, KVPool):
        raise InvalidDTypeError(f"pool: expected a KVPool, got {type(pool).__name__}")
    if pool.backend.name == "numpy":
        from kvcore.kernels import reference

        return reference
    from kvcore.kernels import gpu  # imports nothing of CuPy itself: the pool already holds it

    return gpu


def append_kv(pool: KVPool, layer: int, slot_mapping: Any, k: Any, v: Any) -> None:
    """Scatter new K/V rows into their slots (skip slot -1), quantizing for fp8/int8 pools.

    Args:
        pool: the KV pool.
        layer: the layer written.
        slot_mapping: int64 ``[num_tokens]``, ``slot = page_id * page_size + offset``, -1 = skip; distinct.
            A list or any integer dtype whose values fit is taken too; on the GPU path a device array
            is checked for shape and dtype only (reading its values would synchronize). Device slot
            mappings are therefore not range-checked on the host: the kernel skips only slots outside
            the pool (``[0, num_pages * page_size)``), so a device slot in ``[0, page_size)`` writes the
            null page 0 (a host mapping with one is refused) and repeated device slots race; keep them
            to ``-1`` or slots of pages the manager handed out.
        k: ``[num_tokens, num_kv_heads, head_dim]`` keys: float16, uint16 (bf16 bits) or float32/64.
        v: same shape, values.

    Side effects: writes layer ``layer`` of the pool at the given slots, and nothing else (nothing at all
    when an argument is refused). An fp8/int8 pool stores the same bytes on both paths: float32 ``x /
    scale``, then rounded (on the GPU path, K/V that are not both of one 16-bit type are encoded on the
    device and scattered by indexing rather than by the kernel, see :mod:`kvcore.kernels.gpu`).

    Raises:
        InvalidDTypeError: a slot mapping, ``k`` or ``v`` of the wrong type, shape or dtype (a device
            array on a NumPy pool).
        InvalidArgumentError: a bad layer, a host slot out of range, on the null page, or repeated.
    """
    _impl(pool).append_kv(pool, layer, slot_mapping, k, v)


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
    """One query token per sequence over its paged K/V (GQA, split-K with an LSE merge).

    Args:
        q: ``[batch, num_qo_heads, head_dim]``; query head ``h`` reads kv head ``h // G``.
        pool: the pool, with this step's K/V already appended.
        layer: the layer read.
        page_table: ``PageTable(kv_indptr [batch+1], kv_indices [nnz], kv_last_page_len [batch])`` int32.
        sm_scale: softmax scale, finite and > 0; ``1/sqrt(head_dim)`` by default.
        plan: :func:`plan_attention` of this batch, reused across layers (made on the fly otherwise). A
            plan is made for one ``window`` and ``positions``: another window or other positions in
            the call are refused (:class:`~kvcore.exceptions.InvalidArgumentError`).
        out: optional output buffer shaped and typed like ``q``.
        window: sliding-window attention (an integer >= 1, or None): a query at position ``p`` sees the
            keys at positions ``p - window < j <= p``. Key ``j`` of a sequence (its pages in table
            order, ``page_size`` tokens each) is at position ``j``, and its query tokens are its last
            keys (``kv_len - q_len + i``). With a window the page table may hold the null page 0 for
            pages that left it: such keys are always masked and their K/V are never read into the
            output. The plan starts each tile's work at its first visible key, so pages before every
            query's window cost nothing.
        positions: int32 ``[sum(kv_len)]`` host array (sequences concatenated in batch order): the
            original position of every key of a compacted table (StreamingLLM sinks + recent tokens,
            heavy-hitter eviction), >= 0 and increasing strictly within each sequence. The masks then
            compare positions instead of indices; query token ``i`` is at the position of key
            ``kv_len - q_len + i`` (its K/V were appended first). Causality is unchanged by positions
            (they increase), so they only move the window.
        page_scores: optional float32 ``[kv_indptr[-1]]`` (one entry per page-table entry, in
            ``kv_indices`` order; a NumPy array for NumPy pools, a CuPy array for CuPy pools). The call
            *adds* to each entry the softmax probability its keys received, summed over every query
            head and query token: ``num_qo_heads * num_q_tokens`` in all (less only for a query that
            sees no key). Accumulate it over layers and steps to find heavy-hitter pages (H2O at page
            granularity). The CUDA path gets it from a second small kernel (``q . k`` again, with
            each row's final log-sum-exp); it is stream-ordered, accumulated with atomics.

    Returns:
        ``[batch, num_qo_heads, head_dim]`` in the dtype of ``q``.

    Raises:
        InvalidDTypeError: an argument of the wrong type, shape or dtype (``None`` or a list for ``q``).
        InvalidArgumentError, InvalidPageError: a value out of range (a page id, an offset, ``sm_scale``,
            a plan made for another batch, window or pool).
    """
    return _impl(pool).paged_decode_attention(
        q,
        pool,
        layer,
        page_table,
        sm_scale,
        plan=plan,
        out=out,
        window=window,
        positions=positions,
        page_scores=page_scores,
    )


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
    """Causal attention of new tokens over their cached prefix plus themselves (prefix-cache hits).

    Sequence ``b``'s query tokens ``q[q_indptr[b]:q_indptr[b+1]]`` are the last ``q_len`` of its
    ``kv_len`` keys (append their K/V first); token ``i`` sees keys ``j <= kv_len - q_len + i``.

    Args:
        q: ``[q_indptr[-1], num_qo_heads, head_dim]``.
        q_indptr: int32 ``[batch + 1]``.
        pool, layer, page_table, sm_scale, plan, out: as :func:`paged_decode_attention`.
        window, positions, page_scores: as :func:`paged_decode_attention`.

    Returns:
        ``[q_indptr[-1], num_qo_heads, head_dim]`` in the dtype of ``q``.
    """
    return _impl(pool).paged_prefill_attention(
        q,
        pool,
        layer,
        page_table,
        q_indptr,
        sm_scale,
        plan=plan,
        out=out,
        window=window,
        positions=positions,
        page_scores=page_scores,
    )


def copy_pages(pool: KVPool, pairs: Any) -> None:
    """Copy whole pages (every layer, K and V) in one launch: copy-on-write and defrag.

    Args:
        pairs: ``[n, 2]`` int (src page, dst page); destinations distinct and never a source.
    """
    _impl(pool).copy_pages(pool, pairs)


def gather_pages(pool: KVPool, page_ids: Any, out: Any) -> Any:
    """Pack pages into a page-major buffer ``[n, num_layers, 2, *page_shape]`` (offload); returns ``out``.

    ``out`` comes from :meth:`KVPool.host_buffer` (pinned on the GPU backend: the kernel writes it
    directly), or is a device array of that shape.
    """
    return _impl(pool).gather_pages(pool, page_ids, out)


def scatter_pages(pool: KVPool, page_ids: Any, src: Any) -> None:
    """Unpack a page-major buffer ``[n, num_layers, 2, *page_shape]`` into pages (reload from offload)."""
    _impl(pool).scatter_pages(pool, page_ids, src)
