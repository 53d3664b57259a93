"""GPU implementations of the kernel operations (``backend="cupy"`` pools): argument checks, then launches.

Imported only when a CuPy pool calls a kernel. Every check runs before the first launch, so a rejected
call changes nothing. Host inputs (the manager's NumPy page tables and slot mappings, page ids, copy pairs)
are validated on the host by the same checks as the NumPy reference (:mod:`kvcore.pool.checks`: ranged
before any cast, so nothing wraps) and copied to the device; a device slot mapping is checked for shape and
for a dtype int64 holds exactly, not for its values (reading them would synchronize). An occupancy query
(which may compile a kernel) is only made for a plan made on the fly, after its inputs are checked.

Activations: the kernels take fp16 (``float16``) or bf16 (``uint16`` bit patterns). A 16-bit pool takes its
own type (a bf16 pool bf16, an fp16 pool fp16); an fp8/int8 pool takes either. Other inputs (float32, the
other 16-bit type) are converted on the device first, and attention returns the dtype of ``q``.

8-bit pools store the same bytes as the NumPy reference (``kvcore.pool.dtypes``: ``x / scale`` in
float32, then rounded): K/V of one 16-bit type go through the ``append_kv`` kernel, which divides their
exact float value; any other K/V (float32/64, or K and V of two types) are not rounded to 16 bits first
(that would change the stored byte, and overflow past 65504) but encoded on the device by
:func:`kvcore.pool.dtypes.encode` and scattered into the pool by array indexing. For float32/64 ``q`` on an
8-bit pool, attention runs in fp16 unless a value exceeds fp16's range (65504), then in bf16 (one device
read of ``max |q|``, which synchronizes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels import checks, loader, reference
from kvcore.kernels._nvrtc import DECODE_VARIANTS, HEAD_DIMS, pipeline_smem_bytes
from kvcore.kernels.plan import STEP_ALIGN, AttentionPlan, PageTableLike
from kvcore.pool import KVPool, dtypes
from kvcore.pool.checks import check_array

__all__ = [
    "append_kv",
    "attention_kernel",
    "attention_launcher",
    "copy_pages",
    "gather_pages",
    "occupancy",
    "paged_decode_attention",
    "paged_prefill_attention",
    "scatter_pages",
]

_THREADS = 128  # attention, merge and append blocks (csrc/paged_attention.cu kThreads)
_COPY_THREADS = 256  # page_copy.cu blocks


def _i32(x: int) -> np.int32:
    return np.int32(x)


def _i64(x: int) -> np.int64:
    return np.int64(x)


def _launch(
    pool: KVPool, family: str, name: str, grid: tuple[int, ...], block: int, args: tuple[Any, ...]
) -> None:
    kernel = loader.get_kernel(family, name, int(pool.data.device.id))
    if loader.device_checks():
        _checked(pool, (family,), lambda: kernel(grid, (block,), args))()
    else:
        kernel(grid, (block,), args)


_CHECK_WHAT = {1: "page id read from a device page table (at key", 2: "device slot (at token"}


def _checked(pool: KVPool, families: tuple[str, ...], launch: Callable[[], None]) -> Callable[[], None]:
    """``launch`` itself, or with device checks on (:func:`kvcore.kernels.loader.device_checks`) a
    callable that sets the pool's limits, launches, waits, and raises at the first failed check.

    ``families``: the modules whose kernels ``launch`` runs (each has its own check globals)."""
    if not loader.device_checks():
        return launch
    cp = pool.xp
    globals_ = []  # (family, limit, error) of every family that reads page tables or slots
    for family in families:
        module = loader.load_module(family, int(pool.data.device.id), True)
        try:
            limit = cp.ndarray((2,), cp.int64, module.get_global("kv_check_limit"))
            error = cp.ndarray((4,), cp.int64, module.get_global("kv_check_error"))
        except Exception:  # a family that reads no page table or slot (page_copy: ids checked on the host)
            continue
        globals_.append((family, limit, error))
    if not globals_:
        return launch
    sizes = cp.asarray([pool.num_pages, pool.num_pages * pool.page_size], cp.int64)

    def run() -> None:
        for _, limit, _ in globals_:
            limit[...] = sizes
        launch()
        for family, _, error in globals_:
            flag, code, where, value = (int(x) for x in cp.asnumpy(error))  # waits for the launch
            if flag:
                error[...] = 0
                raise InvalidPageError(
                    f"device check ({family}): {_CHECK_WHAT.get(code, 'value (at')} {where}) is {value}, "
                    f"outside the pool's {pool.num_pages} pages of {pool.page_size} slots; the kernel did "
                    "not use it"
                )

    return run


def _act_name(dtype: Any) -> str | None:
    return "fp16" if dtype == np.float16 else "bf16" if dtype == np.uint16 else None


_FP16_MAX = 65504.0  # the largest finite float16


def _as_activation(x: Any, pool: KVPool, want: str | None = None) -> tuple[Any, str]:
    """``x`` on the device in a kernel activation type (see the module docstring) and that type's name.

    Without ``want``: the pool's type (16-bit pools), the input's own (a 16-bit input), else fp16, or
    bf16 when a value is past fp16's range (one device read; fp16 would make it infinite)."""
    cp = pool.xp
    a = cp.asarray(x)
    have = _act_name(a.dtype)
    f = None
    if want is None:
        if pool.kv_dtype in ("fp16", "bf16"):
            want = pool.kv_dtype
        elif have is not None:
            want = have
        else:
            f = dtypes.to_float32(a, cp)
            want = "bf16" if bool((cp.abs(f) > _FP16_MAX).any()) else "fp16"
    if have == want:
        return a, want
    if f is None:
        f = dtypes.to_float32(a, cp)
    return (f.astype(cp.float16) if want == "fp16" else dtypes.float_to_bf16_bits(f, cp)), want


def _convert(a: Any, dtype: Any, cp: Any) -> Any:
    """Device array ``a`` (fp16 or bf16 bits) as ``dtype`` (float16, uint16 bf16 bits or a float type)."""
    if a.dtype == dtype:
        return a
    f = dtypes.to_float32(a, cp)
    return dtypes.float_to_bf16_bits(f, cp) if dtype == np.uint16 else f.astype(dtype)


def _row_aligned(a: Any) -> bool:
    """16-byte vector loads of whole rows are legal: unit stride on head_dim, 16-byte aligned rows."""
    s = a.strides
    address = a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data  # CuPy, or NumPy (the checks' tests)
    return s[2] == a.itemsize and s[0] % 16 == 0 and s[1] % 16 == 0 and address % 16 == 0


def _layer_args(pool: KVPool, layer: int) -> tuple[Any, ...]:
    """How every kernel reads one layer of the pool: its K/V view, the (kv, page, head, token)
    element strides, and the K and V scales (``[num_kv_heads]`` float32)."""
    st = pool.strides
    return (
        pool.data[layer],
        _i64(st.kv),
        _i64(st.page),
        _i64(st.head),
        _i64(st.token),
        pool.k_scale[layer],
        pool.v_scale[layer],
    )


def _elem_strides(a: Any) -> tuple[np.int64, np.int64]:
    if a.strides[2] != a.itemsize:
        raise InvalidDTypeError("rows must be contiguous along head_dim")
    return _i64(a.strides[0] // a.itemsize), _i64(a.strides[1] // a.itemsize)


# ------------------------------------------------------------------------------------ append_kv


def _append_encoded(pool: KVPool, layer: int, slots: Any, k: Any, v: Any, *, device_slots: bool) -> None:
    """``append_kv`` into an 8-bit pool without the kernel: K and V (checked) encoded on the device by
    :func:`kvcore.pool.dtypes.encode`, the formula of the NumPy reference, so the bytes are the same
    (float32 ``x / scale``, never rounded to 16 bits first), then scattered by array indexing.

    ``slots``: host int64 ``[T]`` (checked: in the pool, or -1), or with ``device_slots`` a device array
    whose values are not checked: as in the kernel, only slots inside the pool are written (finding them
    reads the mapping's length back, which synchronizes); with device checks on
    (:func:`kvcore.kernels.loader.device_checks`) a slot outside the pool other than -1 raises
    InvalidPageError, here before anything is written. Both K and V are encoded before either is written.
    """
    xp = pool.xp
    if device_slots:
        sd = xp.asarray(slots).astype(xp.int64)
        inside = (sd >= 0) & (sd < pool.num_pages * pool.page_size)
        if loader.device_checks():
            bad = xp.flatnonzero(~inside & (sd != -1))
            if int(bad.shape[0]):
                token = int(bad[0])
                raise InvalidPageError(
                    f"device check: device slot (at token {token}) is {int(sd[token])}, outside the pool's "
                    f"{pool.num_pages} pages of {pool.page_size} slots; nothing was written"
                )
        rows = xp.flatnonzero(inside)
        used = sd[rows]
    else:
        host_rows = np.flatnonzero(slots >= 0)
        rows, used = xp.asarray(host_rows), xp.asarray(slots[host_rows])
    page, off = used // pool.page_size, used % pool.page_size
    encoded = [
        dtypes.encode(xp.asarray(x)[rows], pool.kv_dtype, scale[layer][None, :, None], xp)
        for x, scale in ((k, pool.k_scale), (v, pool.v_scale))
    ]
    reference.write_rows(pool, layer, page, off, encoded)


def append_kv(pool: KVPool, layer: int, slot_mapping: Any, k: Any, v: Any) -> None:
    """CUDA ``append_kv``; the contract is :func:`kvcore.kernels.append_kv`."""
    cp = pool.xp
    layer = pool.check_layer(layer)
    slots = checks.check_slots(pool, slot_mapping, device_ok=True)  # host: ranged; device: dtype only
    T = int(slots.shape[0])
    checks.check_rows(k, "k", T, pool.num_kv_heads, pool.head_dim, device=True)
    checks.check_rows(v, "v", T, pool.num_kv_heads, pool.head_dim, device=True)
    if pool.head_dim % 8:
        raise InvalidArgumentError(f"the CUDA append_kv needs head_dim % 8 == 0, got {pool.head_dim}")
    if T == 0:
        return
    if dtypes.is_quantized(pool.kv_dtype) and (_act_name(k.dtype) is None or k.dtype != v.dtype):
        # The kernel quantizes a 16-bit input; anything else would be rounded to 16 bits first.
        _append_encoded(pool, layer, slots, k, v, device_slots=hasattr(slots, "__cuda_array_interface__"))
        return
    kd, act = _as_activation(k, pool)
    vd, _ = _as_activation(v, pool, act)
    kd = kd if _row_aligned(kd) else cp.ascontiguousarray(kd)
    vd = vd if _row_aligned(vd) else cp.ascontiguousarray(vd)
    slots = cp.asarray(slots, dtype=cp.int64)
    _launch(
        pool,
        "append_kv",
        f"append_kv_{act}_{pool.kv_dtype}",
        (T,),
        _THREADS,
        (
            kd,
            vd,
            *_elem_strides(kd),
            *_elem_strides(vd),
            cp.ascontiguousarray(slots),
            *_layer_args(pool, layer),
            _i32(pool.num_kv_heads),
            _i32(pool.head_dim),
            _i32(pool.page_size),
            _i64(pool.num_pages * pool.page_size),  # the kernel skips device slots outside the pool
        ),
    )


# ------------------------------------------------------------------------------------ attention


def attention_kernel(
    kv_dtype: str,
    act: str,
    head_dim: int,
    page_size: int,
    *,
    variant: str = "default",
    bounded: bool = False,
    decode: bool = True,
) -> tuple[str, str, int]:
    """(family, kernel name, dynamic shared memory bytes) of the attention kernel a call launches.

    The plan's ``variant`` (:data:`kvcore.kernels.plan.DECODE_VARIANTS`) where it has a kernel: plain
    calls (not ``bounded``: no window, no page scores) of decode plans (``decode``: one query token per
    sequence at most; the variants are measured and checked on decode only) on pages of >= 16 keys, with a
    cache the variant covers; the default kernel otherwise. Pure (no device): the choice is tested on
    the CPU.
    """
    v = DECODE_VARIANTS[variant]
    kind = "paged_attention_bounded" if bounded else "paged_attention"
    if v.name == "default" or bounded or not decode or page_size < 16 or kv_dtype not in v.caches:
        return "paged_attention", f"{kind}_{act}_{kv_dtype}_d{head_dim}", 0
    return (
        "decode_variants",
        f"paged_attention_{v.name}_{act}_{kv_dtype}_d{head_dim}",
        pipeline_smem_bytes(kv_dtype, head_dim, v.name),
    )


_SMEM_ALLOWED: dict[int, int] = {}  # id of a (memoized) kernel -> the dynamic shared memory it may take


def _attention_function(name: tuple[str, str, int], dev: int) -> Any:
    """The kernel of :func:`attention_kernel`, allowed its dynamic shared memory (over 48 KiB is opt-in,
    once per kernel: the loader memoizes kernels)."""
    family, kernel_name, smem = name
    kernel = loader.get_kernel(family, kernel_name, dev)
    if smem and _SMEM_ALLOWED.get(id(kernel), 0) < smem:
        kernel.max_dynamic_shared_size_bytes = smem
        _SMEM_ALLOWED[id(kernel)] = smem
    return kernel


def occupancy(pool: KVPool, q: Any, *, bounded: bool = False, variant: str = "default") -> dict[str, int]:
    """``num_sms`` and ``blocks_per_sm`` of the attention kernel ``q`` would launch on the pool's device.

    From CUDA's occupancy calculator (registers and shared memory of the compiled kernel: the
    bounded-cache one when ``bounded``, else the one of ``variant``, see :func:`attention_kernel`); 3
    blocks per SM (what the kernels are built for) if it cannot be asked. These size the split-K
    partition (:func:`plan_attention`).

    Raises:
        InvalidDTypeError, InvalidArgumentError: ``variant`` is not one of the variants.
    """
    from kvcore.kernels.plan import check_variant

    variant = check_variant(variant)
    check_array(q, "q")
    cp = pool.xp
    dev = int(pool.data.device.id)
    num_sms = int(cp.cuda.Device(dev).attributes["MultiProcessorCount"])
    act = _act_name(q.dtype) or ("bf16" if pool.kv_dtype == "bf16" else "fp16")
    if pool.kv_dtype in ("fp16", "bf16"):
        act = pool.kv_dtype
    blocks = 3  # kMinBlocks of csrc/paged_attention.cu
    if pool.head_dim in HEAD_DIMS:
        try:
            name = attention_kernel(
                pool.kv_dtype, act, pool.head_dim, pool.page_size, variant=variant, bounded=bounded
            )
            kernel = _attention_function(name, dev)
            blocks = int(
                cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, _THREADS, name[2])
            )
        except Exception:  # an older CuPy without the call: what the kernels are built for
            blocks = 3
    return {"num_sms": num_sms, "blocks_per_sm": max(1, blocks)}


def _device_plan(plan: AttentionPlan, pool: KVPool) -> dict[Any, Any]:
    """The plan's arrays on the pool's device (copied once per plan and device), from the plan's own
    read-only host copies, never from the caller's page-table buffers (which it may refill)."""
    dev = int(pool.data.device.id)
    arrays: dict[Any, Any] | None = plan.device.get(dev)
    if arrays is None:
        cp = pool.xp
        with cp.cuda.Device(dev):
            pt = plan.page_table
            arrays = {
                "kv_indptr": cp.asarray(pt.kv_indptr),
                "kv_indices": cp.asarray(pt.kv_indices if pt.kv_indices.size else np.zeros(1, np.int32)),
                "kv_len": cp.asarray(plan.kv_len),
                "q_indptr": cp.asarray(plan.q_indptr),
                "items": cp.asarray(plan.items),
                "merges": cp.asarray(plan.merges),
            }
            if plan.kv_first is not None:  # [num_q_tokens] int32 (one dummy entry when empty)
                first = plan.kv_first
                arrays["kv_first"] = cp.asarray(first if first.size else np.zeros(1, np.int32))
        plan.device[dev] = arrays
    return arrays


def attention_launcher(
    q: Any,
    pool: KVPool,
    layer: int,
    plan: AttentionPlan,
    sm_scale: float,
    out: Any,
    page_scores: Any = None,
) -> Callable[[], None]:
    """A zero-argument callable that launches the attention (and merge) kernels, with no host decisions.

    ``q`` and ``out`` are device arrays of the kernel activation type (float16, or uint16 bf16 bits; a
    bf16 pool takes bf16, an fp16 pool fp16), ``out`` C-contiguous; every check is done here, once. The
    callable suits per-layer replays and CUDA graph capture; the benchmark times it back to back.

    The mask is the plan's (its ``window``; positions are already folded into ``plan.kv_first``). A
    windowed plan, or a ``page_scores`` device array (float32 ``[kv_indptr[-1]]``, added to), launches
    the bounded-cache kernel; ``page_scores`` then adds the page_scores kernel after the merge. Otherwise
    the kernel is the plan's ``variant`` where it applies (decode plans, :func:`attention_kernel`).

    Raises:
        InvalidArgumentError: head_dim not in HEAD_DIMS, page_size not a power of two, an activation
            type the pool's kernels do not take, a layer out of range, ``sm_scale`` not finite and > 0,
            or a plan made for other head counts or another page size.
        InvalidDTypeError: ``q``, ``out`` or ``plan`` of the wrong type or shape.
        InvalidPageError: the plan reads a page this pool does not have.
    """
    cp = pool.xp
    layer = pool.check_layer(layer)
    sm_scale = checks.check_sm_scale(sm_scale, pool.head_dim)
    check_array(q, "q")
    check_array(out, "out")
    checks.check_plan(plan, pool, q)
    checks.check_page_scores(page_scores, plan.page_table.kv_indices.shape[0], device=True)
    D = pool.head_dim
    if D not in HEAD_DIMS:
        raise InvalidArgumentError(f"the CUDA attention kernels support head_dim {HEAD_DIMS}, got {D}")
    if pool.page_size & (pool.page_size - 1):
        raise InvalidArgumentError(
            f"the CUDA attention kernels need a power-of-two page_size, got {pool.page_size}"
        )
    act = _act_name(q.dtype)
    if act is None or (pool.kv_dtype in ("fp16", "bf16") and act != pool.kv_dtype) or out.dtype != q.dtype:
        raise InvalidArgumentError(
            f"a {pool.kv_dtype} pool's kernels do not take {q.dtype} queries / {out.dtype} outputs"
        )
    if not out.flags.c_contiguous or tuple(out.shape) != tuple(q.shape):
        raise InvalidDTypeError("out: must be C-contiguous and shaped like q")
    if not _row_aligned(q):
        raise InvalidDTypeError("q: rows must be contiguous along head_dim and 16-byte aligned")
    if 16 * pool.strides.token + D >= 2**31:  # the kernel's per-lane row offsets within a step are int32
        raise InvalidArgumentError(f"the pool's token stride ({pool.strides.token} elements) is too large")
    if plan.items.shape[0] and (plan.items[:, 2] % STEP_ALIGN).any():
        raise InvalidArgumentError(f"plan: work items must start at multiples of {STEP_ALIGN} keys")
    if not plan.items.shape[0]:
        return lambda: None
    arrays = _device_plan(plan, pool)
    Hkv = pool.num_kv_heads
    # Scratch per (head_dim, stream): the same plan launched on two streams at once must not share the
    # partial outputs (the launcher captures the stream current now; launch it on that stream).
    stream = int(cp.cuda.get_current_stream().ptr)
    key = ("partials", D, stream)
    if key not in arrays:
        n = max(plan.num_partials, 1)
        arrays[key] = (cp.empty((n, Hkv, 16, D), cp.float32), cp.empty((n, Hkv, 16), cp.float32))
    o_part, lse_part = arrays[key]
    dev = int(pool.data.device.id)
    bounded = plan.window is not None or page_scores is not None
    decode = bool((np.diff(plan.q_indptr) <= 1).all())  # one query token per sequence (or none)
    attn_name = attention_kernel(
        pool.kv_dtype, act, D, pool.page_size, variant=plan.variant, bounded=bounded, decode=decode
    )
    attn = _attention_function(attn_name, dev)
    attn_smem = attn_name[2]  # dynamic shared memory (pipelined variants), bytes
    null = np.uint64(0)  # a null pointer argument
    kv_first = arrays.get("kv_first", null)
    lse_rows = null
    if page_scores is not None:
        lse_key = ("lse_rows", stream)  # every row's final log-sum-exp (base 2), for page_scores
        if lse_key not in arrays:
            arrays[lse_key] = cp.empty((max(plan.num_q_tokens, 1), plan.num_qo_heads), cp.float32)
        lse_rows = arrays[lse_key]
    common = (
        arrays["kv_indptr"],
        arrays["kv_indices"],
        arrays["kv_len"],
        arrays["q_indptr"],
        arrays["items"],
    )
    attn_args = (
        q,
        *_elem_strides(q),
        *_layer_args(pool, layer),
        *common,
        out,
        o_part,
        lse_part,
        np.float32(sm_scale),
        _i32(plan.group_size),
        _i32(Hkv),
        _i32(pool.page_size.bit_length() - 1),
    ) + ((kv_first, lse_rows) if bounded else ())
    attn_grid = (int(plan.items.shape[0]), Hkv)
    launches = [(attn, attn_grid, attn_args, attn_smem)]
    if plan.merges.shape[0]:
        merge_kind = "attention_merge_lse" if page_scores is not None else "attention_merge"
        merge = loader.get_kernel("paged_attention", f"{merge_kind}_{act}", dev)
        merge_args = (
            o_part,
            lse_part,
            arrays["merges"],
            arrays["q_indptr"],
            out,
            _i32(plan.group_size),
            _i32(Hkv),
            _i32(D),
        ) + ((lse_rows,) if page_scores is not None else ())
        launches.append((merge, (int(plan.merges.shape[0]), Hkv), merge_args, 0))
    if page_scores is not None:
        scores = loader.get_kernel("paged_attention", f"page_scores_{act}_{pool.kv_dtype}_d{D}", dev)
        scores_args = (
            q,
            *_elem_strides(q),
            *_layer_args(pool, layer),
            *common,
            kv_first,
            lse_rows,
            page_scores,
            np.float32(sm_scale),
            _i32(plan.group_size),
            _i32(Hkv),
            _i32(pool.page_size.bit_length() - 1),
        )
        launches.append((scores, attn_grid, scores_args, 0))
    # The device checks' globals are per module: a variant's kernel records into decode_variants'.
    families = tuple(dict.fromkeys((attn_name[0], "paged_attention")))
    if len(launches) == 1:
        return _checked(pool, families, lambda: attn(attn_grid, (_THREADS,), attn_args, shared_mem=attn_smem))

    def launch() -> None:
        for kernel, grid, args, smem in launches:
            kernel(grid, (_THREADS,), args, shared_mem=smem)

    return _checked(pool, families, launch)


def _attention(
    q: Any, pool: KVPool, layer: int, plan: AttentionPlan, sm_scale: float, out: Any, page_scores: Any
) -> Any:
    cp = pool.xp
    result_dtype = np.dtype(q.dtype)
    if out is not None:
        checks.output_like(q, cp, out)
    qd, _ = _as_activation(q, pool)
    if not _row_aligned(qd):  # the kernel reads Q rows with 16-byte loads: a fresh C-contiguous copy
        qd = cp.array(qd, copy=True, order="C")
    kernel_out = out if out is not None and out.dtype == qd.dtype and out.flags.c_contiguous else None
    if kernel_out is None:
        kernel_out = cp.empty(qd.shape, dtype=qd.dtype)
    attention_launcher(qd, pool, layer, plan, sm_scale, kernel_out, page_scores)()
    result = _convert(kernel_out, result_dtype, cp)
    if out is not None and result is not out:
        out[...] = result
        return out
    return result


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
    """Decode (``decode``; ``q_indptr`` unused) or prefill: the checks, a plan if none, the launches."""
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
        occupancy=lambda: occupancy(pool, q, bounded=window is not None or page_scores is not None),
        window=window,
        positions=positions,
        page_scores=page_scores,
        device=True,
    )
    return _attention(q, pool, layer, plan, scale, out, page_scores)


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
    """CUDA ``paged_decode_attention``; the contract is :func:`kvcore.kernels.paged_decode_attention`."""
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
    """CUDA ``paged_prefill_attention``; the contract is :func:`kvcore.kernels.paged_prefill_attention`."""
    mask = {"window": window, "positions": positions, "page_scores": page_scores}
    return _call(q, pool, layer, page_table, q_indptr, sm_scale, plan, decode=False, out=out, **mask)


# ------------------------------------------------------------------------------------ page copies


def _byte_strides(pool: KVPool) -> tuple[np.int64, np.int64, np.int64, np.int64]:
    """(layer, kv, page, plane bytes) strides in bytes; a page of one plane is contiguous in both layouts."""
    b = pool.storage_dtype.itemsize
    st = pool.strides
    return _i64(st.layer * b), _i64(st.kv * b), _i64(st.page * b), _i64(st.page * b)


def copy_pages(pool: KVPool, pairs: Any) -> None:
    """CUDA ``copy_pages``; the contract is :func:`kvcore.kernels.copy_pages`."""
    p = checks.check_pairs(pool, pairs)
    if p.shape[0] == 0:
        return
    cp = pool.xp
    _launch(
        pool,
        "page_copy",
        "copy_pages",
        (p.shape[0], 2 * pool.num_layers),
        _COPY_THREADS,
        (pool.data, cp.asarray(p), *_byte_strides(pool)),
    )


def _pinned_device_pointer(a: np.ndarray, cp: Any) -> int | None:
    """The device address of page-locked host memory (UVA), or None for ordinary host memory."""
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(a.ctypes.data)
    except RuntimeError:
        return None
    if attrs.type != cp.cuda.runtime.memoryTypeHost:
        return None
    return int(attrs.devicePointer)


def gather_pages(pool: KVPool, page_ids: Any, out: Any) -> Any:
    """CUDA ``gather_pages``; the contract is :func:`kvcore.kernels.gather_pages`.

    Into a device buffer, or straight into pinned host memory (zero-copy).
    """
    cp = pool.xp
    ids = checks.check_page_ids(pool, page_ids)
    checks.check_host_buffer(pool, out, ids.shape[0], "out")
    if ids.shape[0] == 0:
        return out
    grid = (ids.shape[0], 2 * pool.num_layers)
    ids_d = cp.asarray(ids)
    if isinstance(out, cp.ndarray):
        _launch(
            pool,
            "page_copy",
            "gather_pages",
            grid,
            _COPY_THREADS,
            (pool.data, ids_d, out, *_byte_strides(pool)),
        )
        return out
    ptr = _pinned_device_pointer(out, cp)
    if ptr is not None:
        _launch(
            pool,
            "page_copy",
            "gather_pages",
            grid,
            _COPY_THREADS,
            (pool.data, ids_d, np.uint64(ptr), *_byte_strides(pool)),
        )
        pool.backend.synchronize()
        return out
    staging = cp.empty(out.shape, dtype=out.dtype)
    _launch(
        pool,
        "page_copy",
        "gather_pages",
        grid,
        _COPY_THREADS,
        (pool.data, ids_d, staging, *_byte_strides(pool)),
    )
    staging.get(out=out)
    return out


def scatter_pages(pool: KVPool, page_ids: Any, src: Any) -> None:
    """CUDA ``scatter_pages``; the contract is :func:`kvcore.kernels.scatter_pages`.

    From a device buffer, pinned host memory (zero-copy) or pageable memory.
    """
    cp = pool.xp
    ids = checks.check_page_ids(pool, page_ids)
    checks.check_host_buffer(pool, src, ids.shape[0], "src")
    if ids.shape[0] == 0:
        return
    grid = (ids.shape[0], 2 * pool.num_layers)
    ids_d = cp.asarray(ids)
    if isinstance(src, cp.ndarray):
        buf: Any = src
    else:
        ptr = _pinned_device_pointer(src, cp)
        buf = np.uint64(ptr) if ptr is not None else cp.asarray(src)
    _launch(
        pool, "page_copy", "scatter_pages", grid, _COPY_THREADS, (pool.data, ids_d, buf, *_byte_strides(pool))
    )
    if not isinstance(src, cp.ndarray):
        pool.backend.synchronize()  # the caller may reuse its host buffer as soon as we return
