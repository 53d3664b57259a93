"""Argument checks of the kernel operations, shared by both backends (:mod:`.reference`, :mod:`.gpu`).

Every check runs on the host before anything is written or launched, so a refused call changes nothing.
Index-like arguments go through :func:`kvcore.pool.checks.index_array`, which ranges them before any cast,
so a value that would wrap is refused. Wrong types, shapes and dtypes raise
:class:`~kvcore.exceptions.InvalidDTypeError`; values out of range
:class:`~kvcore.exceptions.InvalidArgumentError` or :class:`~kvcore.exceptions.InvalidPageError`.
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
    check_variant,
    check_window,
    kv_lengths,
    plan_attention,
    unpack_page_table,
)
from kvcore.pool import KVPool
from kvcore.pool.checks import check_array, check_host, index_array, positive_scalar


def check_rows(
    x: Any, name: str, num_rows: int | None, num_heads: int, head_dim: int, *, device: bool = False
) -> None:
    """``x`` must be an array ``[num_rows, num_heads, head_dim]`` float (or uint16 bf16 bits); a host
    array unless ``device`` (a CuPy pool, which takes both).

    Raises:
        InvalidDTypeError: not an array, a device array without ``device``, another shape or dtype.
    """
    check_array(x, name)
    check_host(x, name, device)
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
    the cast and checked for repeats and for the null page's slots ``[0, page_size)``. Device arrays
    (only with ``device_ok``, the CUDA path) are checked for shape and for a dtype that int64 holds
    exactly, *not* for their values (reading them would synchronize): the kernel skips only slots outside
    the pool, so a device slot in ``[0, page_size)`` writes the null page and a repeated one races.
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
    (and writable when it is a NumPy ``out``); a host array for a NumPy pool (a CuPy pool takes both).

    Raises:
        InvalidDTypeError: not an array, a device array for a NumPy pool, or another shape, dtype or layout.
    """
    check_array(buf, name)
    check_host(buf, name, pool.backend.is_device)
    want = (num_pages, pool.num_layers, 2, *pool.page_shape)
    if tuple(buf.shape) != want or buf.dtype != pool.storage_dtype:
        raise InvalidDTypeError(
            f"{name}: expected {pool.storage_dtype}{list(want)}, got {buf.dtype}{list(buf.shape)}"
        )
    if not buf.flags.c_contiguous:
        raise InvalidDTypeError(f"{name}: must be C-contiguous")
    if name == "out" and isinstance(buf, np.ndarray) and not buf.flags.writeable:
        raise InvalidDTypeError(f"{name}: must be writable")


def check_out(q: Any, out: Any, *, device: bool = False) -> None:
    """An ``out`` buffer (unless None) must be an array shaped and typed like ``q`` (and writable); a host
    array unless ``device`` (a CuPy pool)."""
    if out is None:
        return
    check_array(out, "out")
    check_host(out, "out", device)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
        raise InvalidDTypeError(f"out: expected {q.dtype}{list(q.shape)}, got {out.dtype}{list(out.shape)}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise InvalidDTypeError("out: must be writable")


def output_like(q: Any, xp: Any, out: Any) -> Any:
    """The output array: ``out`` checked against ``q``, or a new array shaped and typed like ``q``."""
    if out is None:
        return xp.empty(q.shape, dtype=q.dtype)
    check_out(q, out, device=xp is not np)
    return out


def check_sm_scale(sm_scale: Any, head_dim: int) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` for None, else a real number finite and > 0 as float32."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else positive_scalar(sm_scale, "sm_scale")


def check_plan(plan: Any, pool: KVPool, q: Any) -> None:
    """``plan`` must be an :class:`AttentionPlan` for ``q``'s shape and this pool (heads, page size, pages).

    Both backends call it before the first read: the CUDA kernels index device memory with the plan's
    arrays unchecked, so only a sealed plan (:attr:`AttentionPlan.sealed`: made by :func:`plan_attention`,
    its arrays still read-only) is run.

    Raises:
        InvalidDTypeError: not a plan, or ``q`` is not ``[plan.num_q_tokens, num_qo_heads, head_dim]``.
        InvalidArgumentError: the plan is not sealed (built directly, by ``dataclasses.replace``, or its
            arrays made writable), was made for other head counts or another page size, or its
            ``variant`` names no kernel variant.
        InvalidPageError: the plan's page table reads a page this pool does not have.
    """
    if not isinstance(plan, AttentionPlan):
        raise InvalidDTypeError(
            f"plan: expected an AttentionPlan from plan_attention, got {type(plan).__name__}"
        )
    if not plan.sealed:
        raise InvalidArgumentError(
            "plan: not sealed (built directly, by dataclasses.replace, or its arrays made writable): "
            "make plans with plan_attention"
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
    check_variant(plan.variant)  # sealed plans hold a checked one; kept as a cheap guard
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


def prepare_attention(
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
    check_rows(q, "q", None, int(q.shape[1]), pool.head_dim, device=device)
    check_out(q, out, device=device)
    if plan is None:
        pt = unpack_page_table(page_table, allow_null=check_window(window) is not None)
        if decode:
            q_indptr = np.arange(pt.kv_last_page_len.shape[0] + 1, dtype=np.int32)
        else:
            q_indptr = index_array(q_indptr, "q_indptr", dtype=np.int32, low=0, what="offsets")
        # Checked here too (the plan checks them again), so that no occupancy query precedes a refusal.
        check_positions(positions, kv_lengths(pt, pool.page_size))
        check_page_scores(page_scores, pt.kv_indices.shape[0], device=device)
        sizing: dict[str, Any] = occupancy() if occupancy is not None else {}  # num_sms, blocks_per_sm
        plan = plan_attention(
            pt,
            q_indptr,
            page_size=pool.page_size,
            num_qo_heads=int(q.shape[1]),
            num_kv_heads=pool.num_kv_heads,
            window=window,
            positions=positions,
            **sizing,
        )
        check_plan(plan, pool, q)
        return layer, plan, scale
    check_plan(plan, pool, q)
    check_mask(plan, window, positions)
    check_page_scores(page_scores, plan.page_table.kv_indices.shape[0], device=device)
    return layer, plan, scale
