"""Each CUDA kernel against its NumPy reference, on identical pool contents. Needs CuPy and a device.

append_kv and the page copies must agree bit for bit (same rounding rules on both sides); attention
agrees to the precision of its tensor-core inputs (probabilities rounded to fp16/bf16 before P V).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from kv_helpers import dense_outputs, write_batch
from test_kernels_bounded import (
    dense_batch,
    make_batch,
    null_out_of_window,
    poison_null_page,
    sinks_and_recent,
)

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels import loader, plan_attention
from kvcore.pool import KV_DTYPES, KVPool, Layout, dtypes
from kvcore.pool._cupy import cupy_or_none, gpu_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")]

cp: Any = cupy_or_none()

# Max |gpu - reference| per activation type, for unit-scale outputs (P and V enter the tensor cores
# as fp16 or bf16; the reference is float32).
ACT_TOLERANCE = {"fp16": 4e-3, "bf16": 2.5e-2}


def _act_values(x: np.ndarray, act: str) -> np.ndarray:
    """Host activations: float16, or bf16 bit patterns (uint16)."""
    return x.astype(np.float16) if act == "fp16" else dtypes.float_to_bf16_bits(x)


def _as_float(x: Any) -> np.ndarray:
    a = x.get() if hasattr(x, "get") else np.asarray(x)
    return np.asarray(dtypes.to_float32(a), dtype=np.float32)


# ------------------------------------------------------------------------------------ append_kv


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("act", ["fp16", "bf16"])
def test_append_kv_is_bit_exact(act: str, kv_dtype: str, layout: Layout) -> None:
    rng = np.random.default_rng(1)
    T, H, D = 50, 4, 128
    cpu = KVPool(
        num_layers=2, num_pages=40, num_kv_heads=H, head_dim=D, page_size=16, kv_dtype=kv_dtype, layout=layout
    )
    if dtypes.is_quantized(kv_dtype):
        cpu.set_scales(1, rng.uniform(0.005, 0.02, H), rng.uniform(0.005, 0.02, H))
    gpu = cpu.to("cupy")
    qkv = _act_values(3 * rng.normal(size=(T, 3 * H, D)), act)  # k and v are strided views of it
    slots = rng.permutation(np.arange(16, 40 * 16))[:T].astype(np.int64)
    slots[[3, 17]] = -1
    K.append_kv(cpu, 1, slots, qkv[:, H : 2 * H], qkv[:, 2 * H :])
    qkv_d = cp.asarray(qkv)
    K.append_kv(gpu, 1, cp.asarray(slots), qkv_d[:, H : 2 * H], qkv_d[:, 2 * H :])
    assert np.array_equal(cpu.data, gpu.data.get())


def test_append_kv_float32_input_and_host_slots() -> None:
    rng = np.random.default_rng(2)
    cpu = KVPool(num_layers=1, num_pages=8, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="bf16")
    gpu = cpu.to("cupy")
    k, v = rng.normal(size=(2, 20, 2, 64)).astype(np.float32)
    slots = np.arange(20, dtype=np.int64) + 32
    K.append_kv(cpu, 0, slots, k, v)
    K.append_kv(gpu, 0, slots, cp.asarray(k), cp.asarray(v))  # float32 is rounded to bf16 on the device
    assert np.array_equal(cpu.data, gpu.data.get())


# ------------------------------------------------------------------------------------ attention


def _compare(batch: Any, q: np.ndarray, plan: Any, act: str, q_indptr: np.ndarray | None = None) -> None:
    gpu = batch.pool.to("cupy")
    pt = batch.manager.page_table(batch.seq_ids)
    if q_indptr is None:
        ref = K.paged_decode_attention(q, batch.pool, 1, pt, plan=plan)
        out = K.paged_decode_attention(cp.asarray(q), gpu, 1, pt, plan=plan)
    else:
        ref = K.paged_prefill_attention(q, batch.pool, 1, pt, q_indptr, plan=plan)
        out = K.paged_prefill_attention(cp.asarray(q), gpu, 1, pt, q_indptr, plan=plan)
    assert out.dtype == q.dtype and out.shape == q.shape
    err = np.abs(_as_float(out) - _as_float(ref)).max()
    assert err < ACT_TOLERANCE[act], f"max |gpu - reference| = {err:.2e}"
    dense = dense_outputs(batch, _as_float(q), 1 / math.sqrt(q.shape[-1]), stored=True)
    assert np.abs(_as_float(out) - dense).max() < ACT_TOLERANCE[act] + 4e-3


@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize("group", [1, 4, 7, 8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_decode_matches_reference(
    kv_dtype: str, head_dim: int, group: int, page_size: int, chunk: int | None
) -> None:
    rng = np.random.default_rng(group * 100 + page_size + head_dim)
    lens = [1, 37, 300, 1100]
    batch = write_batch(
        rng,
        lens=lens,
        q_lens=[1] * 4,
        page_size=page_size,
        num_kv_heads=2,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
    )
    act = "bf16" if kv_dtype == "bf16" or group == 7 else "fp16"  # 8-bit caches take either
    q = _act_values(rng.normal(size=(4, 2 * group, head_dim)), act)
    plan = plan_attention(
        batch.manager.page_table(batch.seq_ids),
        np.arange(5),
        page_size=page_size,
        num_qo_heads=2 * group,
        num_kv_heads=2,
        chunk_len=chunk,
    )
    _compare(batch, q, plan, act)


@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_prefill_matches_reference(
    kv_dtype: str, head_dim: int, group: int, page_size: int, chunk: int | None
) -> None:
    rng = np.random.default_rng(group * 100 + page_size + head_dim + 1)
    lens = [45, 270, 50, 33]
    batch = write_batch(
        rng,
        lens=lens,
        q_lens=[45, 0, 0, 1],
        page_size=page_size,
        num_kv_heads=2,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
        shared_prefix=40,
    )
    hit = 40 // page_size * page_size
    batch.q_len[1], batch.q_len[2] = lens[1] - hit, lens[2] - hit
    q_indptr = np.concatenate([[0], np.cumsum(batch.q_len)]).astype(np.int32)
    act = "bf16" if kv_dtype == "bf16" else "fp16"
    q = _act_values(rng.normal(size=(int(q_indptr[-1]), 2 * group, head_dim)), act)
    plan = plan_attention(
        batch.manager.page_table(batch.seq_ids),
        q_indptr,
        page_size=page_size,
        num_qo_heads=2 * group,
        num_kv_heads=2,
        chunk_len=chunk,
    )
    _compare(batch, q, plan, act, q_indptr)


# ------------------------------------------------------------------------------------ bounded caches


def _compare_bounded(
    batch: Any,
    q: np.ndarray,
    qi: np.ndarray,
    pt: Any,
    act: str,
    *,
    window: int | None,
    positions: np.ndarray | None = None,
    chunk: int | None = None,
) -> None:
    """CUDA against the reference with a window / positions, page scores on both sides; both against
    the dense model of test_kernels_bounded."""
    gpu = batch.pool.to("cupy")
    Hq = q.shape[1]
    plan = plan_attention(
        pt,
        qi,
        page_size=batch.pool.page_size,
        num_qo_heads=Hq,
        num_kv_heads=batch.pool.num_kv_heads,
        chunk_len=chunk,
        window=window,
        positions=positions,
    )
    nnz = pt[1].shape[0]
    ref_scores, dev_scores = np.ones(nnz, np.float32), cp.ones(nnz, cp.float32)
    mask = {"plan": plan, "window": window, "positions": positions}
    ref = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, page_scores=ref_scores, **mask)
    out = K.paged_prefill_attention(cp.asarray(q), gpu, 1, pt, qi, page_scores=dev_scores, **mask)
    plain = K.paged_prefill_attention(cp.asarray(q), gpu, 1, pt, qi, **mask)  # no page scores
    assert out.dtype == q.dtype and out.shape == q.shape
    assert np.array_equal(_as_float(out), _as_float(plain))
    err = np.abs(_as_float(out) - _as_float(ref)).max()
    assert err < ACT_TOLERANCE[act], f"max |gpu - reference| = {err:.2e}"
    dense, mass = dense_batch(batch, _as_float(q), pt, window=window, positions=positions)
    assert np.abs(_as_float(out) - dense).max() < ACT_TOLERANCE[act] + 4e-3
    got = dev_scores.get() - 1
    np.testing.assert_allclose(got, ref_scores - 1, rtol=2e-3, atol=2e-4 * Hq)
    np.testing.assert_allclose(got, mass, rtol=2e-3, atol=2e-4 * Hq)
    assert abs(float(got.sum()) - Hq * int(qi[-1])) < 1e-3 * Hq * int(qi[-1])
    if window is not None and (pt[1] == 0).any():
        assert (got[pt[1] == 0] == 0).all()


@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("window", [None, 5, 37, 10_000])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_window_decode_matches_reference(
    kv_dtype: str, head_dim: int, page_size: int, window: int | None, chunk: int | None
) -> None:
    """NULL pages before the window (the null page holding NaN), GQA 4, page scores accumulated."""
    batch, q, qi, pt = make_batch(
        page_size + head_dim,
        [1, 37, 300, 1100],
        [1] * 4,
        page_size=page_size,
        group=4,
        kv_dtype=kv_dtype,
        head_dim=head_dim,
    )
    if window is not None:
        pt, _ = null_out_of_window(pt, batch, window)
    poison_null_page(batch.pool)
    act = "bf16" if kv_dtype == "bf16" else "fp16"
    _compare_bounded(batch, _act_values(q, act), qi, pt, act, window=window, chunk=chunk)


@pytest.mark.parametrize("window", [None, 3, 29, 1000])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_window_prefill_matches_reference(
    kv_dtype: str, group: int, page_size: int, window: int | None
) -> None:
    batch, q, qi, pt = make_batch(
        group + page_size,
        [45, 270, 50, 33],
        [45, 20, 10, 1],
        page_size=page_size,
        group=group,
        kv_dtype=kv_dtype,
        head_dim=128,
    )
    if window is not None:
        pt, _ = null_out_of_window(pt, batch, window)
    poison_null_page(batch.pool)
    act = "bf16" if kv_dtype == "bf16" else "fp16"
    _compare_bounded(batch, _act_values(q, act), qi, pt, act, window=window, chunk=64)


@pytest.mark.parametrize("window", [None, 24, 300])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("q_lens", [[1, 1], [12, 3]], ids=["decode", "prefill"])
def test_compacted_positions_match_reference(q_lens: list[int], page_size: int, window: int | None) -> None:
    """StreamingLLM (sinks + recent) and a table with gaps, as position maps."""
    kept = [sinks_and_recent(900, 4, 120), np.sort(np.random.default_rng(1).choice(400, 70, replace=False))]
    positions = np.concatenate(kept).astype(np.int32)
    batch, q, qi, pt = make_batch(
        page_size, [k.shape[0] for k in kept], q_lens, page_size=page_size, group=4, head_dim=64
    )
    _compare_bounded(
        batch, _act_values(q, "fp16"), qi, pt, "fp16", window=window, positions=positions, chunk=64
    )


def test_attention_rejects_unsupported_shapes() -> None:
    pool = KVPool(
        num_layers=1, num_pages=4, num_kv_heads=1, head_dim=32, page_size=4, kv_dtype="fp16", backend="cupy"
    )
    pt = (np.array([0, 1], np.int32), np.array([1], np.int32), np.array([2], np.int32))
    with pytest.raises(InvalidArgumentError):
        K.paged_decode_attention(cp.zeros((1, 1, 32), cp.float16), pool, 0, pt)
    odd = KVPool(
        num_layers=1, num_pages=4, num_kv_heads=1, head_dim=64, page_size=3, kv_dtype="fp16", backend="cupy"
    )
    with pytest.raises(InvalidArgumentError):
        K.paged_decode_attention(cp.zeros((1, 1, 64), cp.float16), odd, 0, pt)


def test_large_pool_offsets_are_64_bit() -> None:
    """A 2.3 GB fp8 pool: the V plane of the last pages lies beyond 2^31 elements."""
    H, D, P = 8, 128, 16
    num_pages = 70_000
    pool = KVPool(
        num_layers=1,
        num_pages=num_pages,
        num_kv_heads=H,
        head_dim=D,
        page_size=P,
        kv_dtype="fp8",
        backend="cupy",
    )
    assert pool.data.size > 2**31
    pages = np.array([num_pages - 1, num_pages - 7], np.int32)
    slots = pages[np.arange(20) // P].astype(np.int64) * P + np.arange(20) % P
    rng = np.random.default_rng(3)
    k, v = (rng.normal(size=(2, 20, H, D)) * 100).astype(np.float16)
    K.append_kv(pool, 0, cp.asarray(slots), cp.asarray(k), cp.asarray(v))
    rk, rv = pool.read_slots(0, slots)
    assert np.array_equal(rk, dtypes.decode(dtypes.encode(k, "fp8"), "fp8"))
    assert np.array_equal(rv, dtypes.decode(dtypes.encode(v, "fp8"), "fp8"))
    pt = (np.array([0, 2], np.int32), pages, np.array([4], np.int32))
    q = rng.normal(size=(1, 8, D)).astype(np.float16)
    out = K.paged_decode_attention(cp.asarray(q), pool, 0, pt, sm_scale=0.001)
    s = np.einsum("hd,thd->ht", q[0].astype(np.float64), rk.astype(np.float64)) * 0.001
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), rv.astype(np.float64))
    assert np.abs(_as_float(out)[0] - ref).max() < 2e-3 * np.abs(ref).max()
    K.copy_pages(pool, np.array([[num_pages - 1, 1]]))
    assert np.array_equal(pool.data[0, :, 1].get(), pool.data[0, :, num_pages - 1].get())


# ------------------------------------------------------------------------------------ page copies


def _random_pools(kv_dtype: str = "bf16", layout: Layout = "HND") -> tuple[KVPool, KVPool]:
    cpu = KVPool(
        num_layers=3,
        num_pages=30,
        num_kv_heads=2,
        head_dim=64,
        page_size=16,
        kv_dtype=kv_dtype,
        layout=layout,
    )
    cpu.data[...] = np.random.default_rng(4).integers(0, 255, cpu.data.shape).astype(cpu.data.dtype)
    return cpu, cpu.to("cupy")


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_copy_pages_matches_reference(layout: Layout, kv_dtype: str) -> None:
    cpu, gpu = _random_pools(kv_dtype, layout)
    pairs = np.array([[3, 7], [5, 1], [3, 2], [29, 11]], np.int32)
    K.copy_pages(cpu, pairs)
    K.copy_pages(gpu, pairs)
    assert np.array_equal(cpu.data, gpu.data.get())


@pytest.mark.parametrize("where", ["pinned", "pageable", "device"])
def test_gather_scatter_match_reference(where: str) -> None:
    cpu, gpu = _random_pools()
    ids = np.array([6, 2, 25, 13], np.int32)
    ref = K.gather_pages(cpu, ids, cpu.host_buffer(4))
    buf: Any = {
        "pinned": gpu.host_buffer(4),
        "pageable": np.empty_like(ref),
        "device": cp.empty(ref.shape, dtype=ref.dtype),
    }[where]
    got = K.gather_pages(gpu, ids, buf)
    assert got is buf and np.array_equal(cp.asnumpy(got), ref)
    target = np.array([1, 8, 3, 29], np.int32)
    K.scatter_pages(cpu, target, ref)
    K.scatter_pages(gpu, target, buf)
    assert np.array_equal(cpu.data, gpu.data.get())


def test_kernels_are_memoized_and_cached_on_disk() -> None:
    dev = int(cp.cuda.Device().id)
    a = loader.get_kernel("page_copy", "copy_pages", dev)
    assert loader.get_kernel("page_copy", "copy_pages", dev) is a
    assert any(loader.cache_dir().glob(f"page_copy-{loader.device_arch()}-*.cubin"))


# ------------------------------------------------------------------------------------ hostile arguments


def test_hostile_arguments_change_nothing_on_the_device() -> None:
    """The CUDA path's host checks (``tests/python/test_kernels_hostile.py``) on a real CuPy pool."""
    pool = KVPool(
        num_layers=1, num_pages=6, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="fp16", backend="cupy"
    )
    pool.data[...] = 1
    before = pool.data.get()
    k = cp.ones((2, 2, 64), cp.float16)
    with pytest.raises(InvalidArgumentError, match="slot_mapping"):  # uint64 max would wrap to -1 (skip)
        K.append_kv(pool, 0, np.array([5, 2**64 - 1], np.uint64), k, k)
    with pytest.raises(InvalidDTypeError, match="slot_mapping"):  # int64 cannot hold every uint64
        K.append_kv(pool, 0, cp.asarray(np.array([5, 6], np.uint64)), k, k)
    with pytest.raises(InvalidPageError, match="pairs"):
        K.copy_pages(pool, np.array([[1, 2**32 + 2]], np.int64))
    q = cp.ones((1, 2, 64), cp.float16)
    with pytest.raises(InvalidPageError, match="kv_indices"):  # 2**32 + 1 would wrap to page 1
        K.paged_decode_attention(q, pool, 0, (np.array([0, 1]), np.array([2**32 + 1]), np.array([3])))
    with pytest.raises(InvalidArgumentError, match="sm_scale"):
        K.paged_decode_attention(q, pool, 0, (np.array([0, 1]), np.array([1]), np.array([3])), float("nan"))
    assert np.array_equal(pool.data.get(), before)


def test_device_slots_outside_the_pool_are_skipped_not_written() -> None:
    """A device slot mapping is not read back on the host: the kernel itself skips slots outside the pool."""
    pool = KVPool(
        num_layers=1, num_pages=4, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="fp16", backend="cupy"
    )
    pool.data[...] = 1
    before = pool.data.get()
    k = cp.full((3, 2, 64), 7, cp.float16)
    num_slots = pool.num_pages * pool.page_size
    K.append_kv(pool, 0, cp.asarray([num_slots, num_slots + 10**9, -5], cp.int64), k, k)
    assert np.array_equal(pool.data.get(), before)


def test_device_checks_raise_at_a_bad_device_slot_or_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """KVCORE_DEVICE_CHECKS=1: the debug build reports what the default build silently skips."""
    monkeypatch.setenv("KVCORE_DEVICE_CHECKS", "1")
    pool = KVPool(
        num_layers=1, num_pages=4, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="fp16", backend="cupy"
    )
    pool.data[...] = 0
    before = pool.data.get()
    k = cp.full((2, 2, 64), 7, cp.float16)
    with pytest.raises(InvalidPageError, match="device slot"):
        K.append_kv(pool, 0, cp.asarray([-1, 64], cp.int64), k, k)  # -1 is padding; 64 is past the pool
    assert np.array_equal(pool.data.get(), before)
    K.append_kv(pool, 0, cp.asarray([-1, 63], cp.int64), k, k)  # good slots: no error left behind
    # A device page table edited after planning (what a CUDA-graph engine does): page 9 of a 4-page pool.
    pt = (np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([16], np.int32))
    plan = plan_attention(pt, np.arange(2), page_size=16, num_qo_heads=4, num_kv_heads=2)
    q = cp.zeros((1, 4, 64), cp.float16)
    out = cp.zeros_like(q)
    from kvcore.kernels import gpu

    launch = gpu.attention_launcher(q, pool, 0, plan, 0.125, out)
    launch()
    plan.device[int(pool.data.device.id)]["kv_indices"][1] = 9
    with pytest.raises(InvalidPageError, match="page id"):
        launch()
    assert bool(cp.isfinite(out).all())
