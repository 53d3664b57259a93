"""Regressions from a hostile review of the kernels: device arrays on NumPy pools, half-written appends,
int32 chunk lengths, hand-made plans, scalar plan arguments, the 8-bit encode of float32 K/V on the CUDA
path, and the reference prefill's memory.

The CUDA entry points are called with a NumPy pool where their host logic is what is tested (their ``cp``
is then NumPy); the one test that needs a device is marked ``gpu`` and skips without one.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tracemalloc
from typing import Any

import numpy as np
import pytest
from kv_helpers import FakeDeviceArray, assert_refused, random_pool

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, KVCoreError
from kvcore.kernels import gpu, reference
from kvcore.kernels.plan import AttentionPlan, plan_attention
from kvcore.pool import KVPool, dtypes
from kvcore.pool._cupy import cupy_or_none, gpu_available

MAX_CHUNK_LEN = 2**31 - 64  # the largest multiple of 64 that int32 holds (kvcore.kernels.plan.MAX_CHUNK_LEN)


# ------------------------------------------------------------------------------------ 1: device arrays


@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("impl", [K, reference])
def test_append_kv_refuses_a_device_array_on_a_numpy_pool_and_writes_nothing(impl: Any, which: str) -> None:
    pool = random_pool("int8")
    x = np.ones((2, 2, 8), np.float32)
    k = FakeDeviceArray(x) if which == "k" else x
    v = FakeDeviceArray(x) if which == "v" else x
    info = assert_refused(pool, InvalidDTypeError, which, impl.append_kv, pool, 0, [4, 5], k, v)
    assert "device array" in str(info.value)


def test_append_kv_encodes_k_and_v_before_writing_either(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while encoding V (after K was encoded) leaves the pool as it was."""
    pool = random_pool("int8")
    x = np.ones((2, 2, 8), np.float32)
    real = dtypes.encode
    calls = []

    def failing_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise InvalidDTypeError("v: refused while encoding")
        return real(*args, **kwargs)

    monkeypatch.setattr(dtypes, "encode", failing_second)
    assert_refused(pool, InvalidDTypeError, "v", reference.append_kv, pool, 0, [4, 5], x, x)
    assert len(calls) == 2


def test_attention_and_page_copies_refuse_device_arrays_on_a_numpy_pool() -> None:
    pool = random_pool("int8")
    pt = (np.array([0, 1]), np.array([1]), np.array([2]))
    q = np.ones((1, 2, 8), np.float32)
    fake_q = FakeDeviceArray(q)
    assert_refused(pool, InvalidDTypeError, "q", K.paged_decode_attention, fake_q, pool, 0, pt)
    assert_refused(
        pool, InvalidDTypeError, "out", K.paged_decode_attention, q, pool, 0, pt, out=FakeDeviceArray(q)
    )
    buf = pool.host_buffer(1)
    assert_refused(pool, InvalidDTypeError, "src", K.scatter_pages, pool, [1], FakeDeviceArray(buf))
    assert_refused(pool, InvalidDTypeError, "out", K.gather_pages, pool, [1], FakeDeviceArray(buf))


# ------------------------------------------------------------------------------------ 2: chunk lengths


@pytest.mark.parametrize("chunk_len", [2**31, 2**31 + 64, 2**32, 10**30, 0, -64, 32, 100])
def test_chunk_len_out_of_range_is_refused(chunk_len: int) -> None:
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    with pytest.raises(InvalidArgumentError, match="chunk_len"):
        plan_attention(pt, [0, 1], page_size=4, num_qo_heads=1, num_kv_heads=1, chunk_len=chunk_len)


def test_the_largest_chunk_len_is_taken() -> None:
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    plan = plan_attention(pt, [0, 1], page_size=4, num_qo_heads=1, num_kv_heads=1, chunk_len=MAX_CHUNK_LEN)
    assert plan.chunk_lens.tolist() == [MAX_CHUNK_LEN]


@pytest.mark.parametrize("sizing", [{}, {"num_sms": 1, "blocks_per_sm": 1}])
@pytest.mark.parametrize("heads", [1, 8])
def test_planned_chunk_lengths_never_wrap_in_int32(heads: int, sizing: dict[str, int]) -> None:
    """A sequence of 2**31 - 1 keys (legal): unsplit it needed a chunk of 2**31, stored as -2**31."""
    P = 2**30
    pt = (np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([P - 1], np.int32))
    plan = plan_attention(pt, [0, 1], page_size=P, num_qo_heads=heads, num_kv_heads=heads, **sizing)
    assert int(plan.kv_len[0]) == 2**31 - 1
    chunk = int(plan.chunk_lens[0])
    assert 0 < chunk <= MAX_CHUNK_LEN and chunk % 64 == 0
    items = plan.items.astype(np.int64)
    assert (items[:, 2] >= 0).all() and (items[:, 3] > items[:, 2]).all()
    # The items tile [0, kv_len) exactly, on the plan's chunk grid.
    assert items[0, 2] == 0 and items[-1, 3] == 2**31 - 1 and (items[1:, 2] == items[:-1, 3]).all()


# ------------------------------------------------------------------------------------ 3: sealed plans


def _plan_and_pool() -> tuple[AttentionPlan, KVPool, np.ndarray, np.ndarray]:
    pool = KVPool(num_layers=1, num_pages=6, num_kv_heads=1, head_dim=64, page_size=16, kv_dtype="fp16")
    pt = (np.array([0, 1], np.int32), np.array([3], np.int32), np.array([5], np.int32))
    plan = plan_attention(pt, [0, 1], page_size=16, num_qo_heads=1, num_kv_heads=1)
    q = np.zeros((1, 1, 64), np.float16)
    return plan, pool, q, np.zeros_like(q)


def _tampered(plan: AttentionPlan) -> dict[str, Any]:
    items = plan.items.copy()
    far = items.copy()
    far[:, 3] = 10**6
    seq = items.copy()
    seq[:, 0] = 1000
    part = items.copy()
    part[:, 4] = 5000
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.init}
    return {
        "kv_len": dataclasses.replace(plan, kv_len=np.array([10**6], np.int32), items=far),
        "seq": dataclasses.replace(plan, items=seq),
        "partial": dataclasses.replace(plan, items=part),
        "kv_indptr": dataclasses.replace(
            plan, page_table=plan.page_table._replace(kv_indptr=np.array([0, 1000], np.int32))
        ),
        "unchanged replace": dataclasses.replace(plan),
        "direct": AttentionPlan(**fields),
    }


@pytest.mark.parametrize("case", ["kv_len", "seq", "partial", "kv_indptr", "unchanged replace", "direct"])
def test_plans_not_made_by_plan_attention_are_refused_by_both_paths(case: str) -> None:
    plan, pool, q, out = _plan_and_pool()
    bad = _tampered(plan)[case]
    assert not bad.sealed
    msg = "make plans with plan_attention"
    assert_refused(pool, InvalidArgumentError, msg, gpu.attention_launcher, q, pool, 0, bad, 0.125, out)
    pt = plan.page_table
    assert_refused(
        pool, InvalidArgumentError, msg, reference.paged_decode_attention, q, pool, 0, pt, plan=bad
    )
    assert bad.device == {} or bad.device is not plan.device


def test_a_plan_is_frozen_and_its_arrays_read_only() -> None:
    plan, pool, q, _ = _plan_and_pool()
    assert plan.sealed
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.items = plan.items.copy()  # type: ignore[misc]
    arrays = [*plan.page_table, plan.kv_len, plan.q_indptr, plan.chunk_lens, plan.items, plan.merges]
    for a in arrays:
        root = a
        while isinstance(root, np.ndarray):
            root = root.base
        assert not a.flags.writeable and isinstance(root, bytes)  # over immutable memory
        with pytest.raises(ValueError):
            a.flags.writeable = True  # so the checked contents cannot be rewritten
    assert plan.sealed
    assert np.isfinite(reference.paged_decode_attention(q, pool, 0, plan.page_table, plan=plan)).all()


def test_copies_of_a_sealed_plan_share_its_arrays_and_run() -> None:
    plan, pool, q, _ = _plan_and_pool()
    shallow, deep = copy.copy(plan), copy.deepcopy(plan)
    assert shallow.sealed and shallow.items is plan.items and shallow.device is plan.device
    assert deep is plan
    want = reference.paged_decode_attention(q, pool, 0, plan.page_table, plan=plan)
    got = reference.paged_decode_attention(q, pool, 0, plan.page_table, plan=shallow)
    assert np.array_equal(want, got)


# ------------------------------------------------------------------------------------ 7: scalar arguments


@pytest.mark.parametrize(
    "name", ["page_size", "num_qo_heads", "num_kv_heads", "num_sms", "blocks_per_sm", "chunk_len"]
)
@pytest.mark.parametrize("value", ["64", None, 64.0, True, np.float32(64), np.bool_(True), [64]])
def test_plan_scalar_arguments_of_the_wrong_type_are_refused_by_name(name: str, value: Any) -> None:
    if value is None and name == "chunk_len":
        return  # None is chunk_len's default: the planner's own split
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    kwargs: dict[str, Any] = {"page_size": 4, "num_qo_heads": 2, "num_kv_heads": 2, name: value}
    with pytest.raises(InvalidDTypeError, match=name):
        plan_attention(pt, [0, 1], **kwargs)


def test_plan_scalar_arguments_take_numpy_integers() -> None:
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    want = plan_attention(pt, [0, 1], page_size=4, num_qo_heads=2, num_kv_heads=1, num_sms=4, chunk_len=128)
    got = plan_attention(
        pt,
        [0, 1],
        page_size=np.int64(4),
        num_qo_heads=np.int32(2),
        num_kv_heads=np.uint8(1),
        num_sms=np.int16(4),
        blocks_per_sm=np.int64(3),
        chunk_len=np.uint64(128),
    )
    assert got.items.tolist() == want.items.tolist() and got.page_size == 4 and type(got.page_size) is int


@pytest.mark.parametrize(
    ("name", "value"), [("page_size", 0), ("page_size", 2**31), ("num_sms", 0), ("blocks_per_sm", 10**30)]
)
def test_plan_scalar_arguments_out_of_range_are_refused_by_name(name: str, value: int) -> None:
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    kwargs: dict[str, Any] = {"page_size": 4, "num_qo_heads": 2, "num_kv_heads": 2, name: value}
    with pytest.raises(InvalidArgumentError, match=name):
        plan_attention(pt, [0, 1], **kwargs)


# ------------------------------------------------------------------------------------ 4: 8-bit encode


def _quantized_pool(kv_dtype: str, layout: str = "HND") -> KVPool:
    pool = KVPool(
        num_layers=2, num_pages=6, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype=kv_dtype, layout=layout
    )  # type: ignore[arg-type]
    pool.set_scales(1, [0.01, 1000.0], [0.001, 3.0])
    return pool


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
@pytest.mark.parametrize("device_slots", [False, True])
def test_cuda_path_encodes_float32_kv_like_the_reference(
    kv_dtype: str, layout: str, device_slots: bool
) -> None:
    """The GPU path's float32 K/V into an 8-bit pool (its ``xp`` is NumPy here): the reference's bytes,
    not those of the value rounded to fp16 first (which also overflows past 65504)."""
    rng = np.random.default_rng(3)
    k = (rng.normal(size=(5, 2, 8)) * np.array([0.3, 3e4])[None, :, None]).astype(np.float32)
    v = (rng.normal(size=(5, 2, 8)) * np.array([0.1, 200.0])[None, :, None]).astype(np.float32)
    k[0, 1, :2] = [1e5, -7e4]  # past fp16's range
    slots = np.array([5, -1, 12, 23, 4], np.int64)
    ref, dev = _quantized_pool(kv_dtype, layout), _quantized_pool(kv_dtype, layout)
    reference.append_kv(ref, 1, slots, k, v)
    if device_slots:  # as a device mapping: not checked on the host, slots outside the pool skipped
        gpu._append_encoded(dev, 1, np.array([5, -1, 12, 23, 4]), k, v, device_slots=True)
    else:
        gpu.append_kv(dev, 1, slots, k, v)  # routed around the kernel: no launch on a NumPy pool
    assert np.array_equal(ref.data, dev.data)
    with np.errstate(over="ignore"):  # what rounding to fp16 first did: 1e5 becomes infinite
        fp16_first = dtypes.encode(k.astype(np.float16), kv_dtype, ref.k_scale[1][None, :, None])
    assert not np.array_equal(dtypes.encode(k, kv_dtype, ref.k_scale[1][None, :, None]), fp16_first)


def test_cuda_path_skips_device_slots_outside_the_pool_when_encoding() -> None:
    pool = _quantized_pool("int8")
    before = pool.data.copy()
    x = np.ones((3, 2, 8), np.float32)
    limit = pool.num_pages * pool.page_size
    gpu._append_encoded(pool, 1, np.array([limit, limit + 10**9, -5]), x, x, device_slots=True)
    assert np.array_equal(pool.data, before)


def test_cuda_activation_of_float32_queries_past_fp16_range_is_bf16() -> None:
    pool = _quantized_pool("int8")
    small = np.full((1, 4, 8), 3.0, np.float32)
    big = small.copy()
    big[0, 0, 0] = 1e5
    assert gpu._as_activation(small, pool)[1] == "fp16"
    qd, act = gpu._as_activation(big, pool)
    assert act == "bf16" and math.isfinite(float(dtypes.to_float32(qd).max()))
    assert gpu._as_activation(small.astype(np.float16), pool)[1] == "fp16"  # a 16-bit input keeps its type


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_gpu_float32_kv_into_an_8bit_pool_is_bit_exact(kv_dtype: str) -> None:
    cp: Any = cupy_or_none()
    rng = np.random.default_rng(4)
    cpu = KVPool(num_layers=1, num_pages=8, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype=kv_dtype)
    cpu.set_scales(0, [0.01, 700.0], [0.002, 5.0])
    dev = cpu.to("cupy")
    k, v = (rng.normal(size=(2, 20, 2, 64)) * 3).astype(np.float32)
    k[0, 1, :3] = [1e5, -7e4, 65520.0]
    slots = np.arange(20, dtype=np.int64) + 32
    slots[5] = -1
    K.append_kv(cpu, 0, slots, k, v)
    K.append_kv(dev, 0, cp.asarray(slots), cp.asarray(k), cp.asarray(v))
    assert np.array_equal(cpu.data, dev.data.get())


# ------------------------------------------------------------------------------------ 5: prefill memory


def test_reference_prefill_memory_is_bounded_by_tiles_not_q_len_times_kv_len() -> None:
    """A 2048-token prefill of 8 query heads: one [Hq, q_len, kv_len] float32 score matrix is 128 MiB."""
    T, Hq, Hkv, D, P = 2048, 8, 1, 8, 16
    pool = KVPool(
        num_layers=1, num_pages=T // P + 2, num_kv_heads=Hkv, head_dim=D, page_size=P, kv_dtype="fp16"
    )
    rng = np.random.default_rng(5)
    pool.data[...] = rng.normal(size=pool.data.shape).astype(np.float16)
    pt = (np.array([0, T // P], np.int32), np.arange(1, T // P + 1, dtype=np.int32), np.array([P], np.int32))
    qi = np.array([0, T], np.int32)
    plan = plan_attention(pt, qi, page_size=P, num_qo_heads=Hq, num_kv_heads=Hkv, num_sms=1, blocks_per_sm=1)
    assert plan.chunk_lens.tolist() == [T]  # unsplit: one chunk of every key
    q = rng.normal(size=(T, Hq, D)).astype(np.float16)
    out = np.empty_like(q)
    tracemalloc.start()
    try:
        K.paged_prefill_attention(q, pool, 0, pt, qi, plan=plan, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    full = Hq * T * T * 4
    assert peak < full // 2, f"peak {peak / 2**20:.0f} MiB for a {full / 2**20:.0f} MiB score matrix"
    # The same result as a dense float64 softmax over the stored keys.
    Kf = dtypes.to_float32(pool.data[0, 0, 1 : T // P + 1]).transpose(1, 0, 2, 3).reshape(Hkv, T, D)[0]
    Vf = dtypes.to_float32(pool.data[0, 1, 1 : T // P + 1]).transpose(1, 0, 2, 3).reshape(Hkv, T, D)[0]
    rows = np.array([0, 1, 700, T - 1])
    s = q[rows].astype(np.float64) @ Kf.T.astype(np.float64) / math.sqrt(D)  # [rows, Hq, T]
    s = np.where(np.arange(T)[None, None, :] <= rows[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    dense = (p / p.sum(axis=-1, keepdims=True)) @ Vf.astype(np.float64)
    assert np.abs(out[rows].astype(np.float64) - dense).max() < 2e-3


def test_tiled_prefill_matches_one_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of one query token give what one tile of every token gives (to float32 rounding), with a
    split plan, GQA and page scores."""
    T, Hq, Hkv, D, P = 200, 4, 2, 8, 16
    n = -(-T // P)
    pool = KVPool(num_layers=1, num_pages=n + 1, num_kv_heads=Hkv, head_dim=D, page_size=P, kv_dtype="bf16")
    rng = np.random.default_rng(6)
    pool.data[...] = dtypes.float_to_bf16_bits(rng.normal(size=pool.data.shape))
    pt = (
        np.array([0, n], np.int32),
        np.arange(1, n + 1, dtype=np.int32),
        np.array([T - (n - 1) * P], np.int32),
    )
    qi = np.array([0, T - 10], np.int32)  # a prefix of 10 keys, then 190 query tokens
    q = rng.normal(size=(T - 10, Hq, D)).astype(np.float32)
    plan = plan_attention(pt, qi, page_size=P, num_qo_heads=Hq, num_kv_heads=Hkv, chunk_len=64)
    whole_scores, tiled_scores = np.zeros(n, np.float32), np.zeros(n, np.float32)
    whole = K.paged_prefill_attention(q, pool, 0, pt, qi, plan=plan, page_scores=whole_scores)
    monkeypatch.setattr(reference, "_SCORE_ELEMENTS", 1)
    tiled = K.paged_prefill_attention(q, pool, 0, pt, qi, plan=plan, page_scores=tiled_scores)
    np.testing.assert_allclose(tiled, whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tiled_scores, whole_scores, rtol=1e-5)
    assert abs(float(tiled_scores.sum()) - Hq * (T - 10)) < 1e-2


def test_review_errors_are_kvcore_errors() -> None:
    """Every refusal above is a KVCoreError (no builtin exception escapes)."""
    pt = (np.array([0, 1]), np.array([1]), np.array([3]))
    for kwargs in ({"chunk_len": 2**32}, {"page_size": "4"}, {"num_sms": None}):
        base: dict[str, Any] = {"page_size": 4, "num_qo_heads": 1, "num_kv_heads": 1}
        with pytest.raises(KVCoreError):
            plan_attention(pt, [0, 1], **{**base, **kwargs})
