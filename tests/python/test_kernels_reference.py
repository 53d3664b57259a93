"""The NumPy kernels (the ground truth CI runs): paged attention equals dense attention without a cache.

K/V are written by ``append_kv`` through slot mappings, and read through page tables, both from the
manager of ``kv_helpers.make_manager`` (the swap point for the Rust ``KVCacheManager``). The dense side
is float64 attention over the unquantized K/V, computed with no cache at all.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_helpers import Batch, dense_outputs, write_batch

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels.plan import BLOCK_OVERHEAD_KEYS, ROWS_PER_TILE, plan_attention
from kvcore.pool import KVPool, Layout, dtypes

# (max, mean) of |paged - dense| against the *unquantized* K/V, for unit-variance K/V/q, per cache
# precision: the quantization error, with a margin over the largest errors measured on this file's cases
# (fp16 1.0e-3 / 2.3e-4, bf16 7.8e-3 / 7e-4, fp8 0.16 / 1.1e-2, int8 5.9e-2 / 5.6e-3; the means of tiny
# hypothesis cases are close to their max). fp8's max is one V row of a 1-token sequence: e4m3 keeps 3
# mantissa bits, a relative error up to 2^-4.
TOLERANCE = {"fp16": (2e-3, 5e-4), "bf16": (1.6e-2, 3e-3), "fp8": (0.3, 2.5e-2), "int8": (0.1, 1.2e-2)}
# Against dense attention over the values the pool *stores* (dequantized), only float32 rounding remains.
STORED_TOLERANCE = 2e-5


def check_against_dense(batch: Batch, q: np.ndarray, out: np.ndarray, kv_dtype: str) -> None:
    """The paged output equals dense attention: tightly over the stored K/V, within TOLERANCE otherwise."""
    scale = 1 / math.sqrt(q.shape[-1])
    stored = np.abs(out - dense_outputs(batch, q, scale, stored=True)).max()
    assert stored < STORED_TOLERANCE, f"vs stored K/V: max error {stored:.2e}"
    err = np.abs(out - dense_outputs(batch, q, scale))
    max_tol, mean_tol = TOLERANCE[kv_dtype]
    assert err.max() < max_tol and err.mean() < mean_tol, f"max {err.max():.2e}, mean {err.mean():.2e}"


# ------------------------------------------------------------------------------------ paged == dense


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_decode_paged_equals_dense(page_size: int, group: int, head_dim: int, kv_dtype: str) -> None:
    rng = np.random.default_rng(page_size * 1000 + group * 10 + head_dim)
    lens = [1, 37, 70]
    batch = write_batch(
        rng,
        lens=lens,
        q_lens=[1, 1, 1],
        page_size=page_size,
        num_kv_heads=2,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
    )
    q = rng.normal(size=(3, 2 * group, head_dim)).astype(np.float32)
    pt = batch.manager.page_table(batch.seq_ids)
    out = K.paged_decode_attention(q, batch.pool, 1, pt)
    assert out.shape == q.shape and out.dtype == np.float32
    check_against_dense(batch, q, out, kv_dtype)


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_prefill_over_cached_prefix_equals_dense(
    page_size: int, group: int, head_dim: int, kv_dtype: str
) -> None:
    """A ragged batch: a full prefill, two prefix hits (tail only) and a decode token, in one call."""
    rng = np.random.default_rng(page_size * 1000 + group * 10 + head_dim + 7)
    lens = [45, 70, 50, 33]
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
    # Sequences 1 and 2 hit sequence 0's cached full pages: their queries are the uncached tails.
    hits = [40 // page_size * page_size] * 2
    batch.q_len[1], batch.q_len[2] = lens[1] - hits[0], lens[2] - hits[1]
    q_indptr = np.concatenate([[0], np.cumsum(batch.q_len)]).astype(np.int32)
    q = rng.normal(size=(int(q_indptr[-1]), 2 * group, head_dim)).astype(np.float32)
    pt = batch.manager.page_table(batch.seq_ids)
    out = K.paged_prefill_attention(q, batch.pool, 1, pt, q_indptr)
    check_against_dense(batch, q, out, kv_dtype)


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
def test_nhd_layout_equals_dense(kv_dtype: str) -> None:
    rng = np.random.default_rng(5)
    batch = write_batch(
        rng,
        lens=[20, 50],
        q_lens=[20, 1],
        page_size=16,
        num_kv_heads=2,
        head_dim=64,
        kv_dtype=kv_dtype,
        layout="NHD",
    )
    q = rng.normal(size=(21, 8, 64)).astype(np.float32)
    out = K.paged_prefill_attention(q, batch.pool, 1, batch.manager.page_table([0, 1]), np.array([0, 20, 21]))
    check_against_dense(batch, q, out, kv_dtype)


def test_split_k_merge_equals_one_pass() -> None:
    """Forcing 64-key chunks (5 splits over 300 keys) gives the one-pass result; both match dense."""
    rng = np.random.default_rng(11)
    batch = write_batch(
        rng, lens=[300, 129], q_lens=[3, 1], page_size=16, num_kv_heads=2, head_dim=64, kv_dtype="fp16"
    )
    q = rng.normal(size=(4, 8, 64)).astype(np.float32)
    pt = batch.manager.page_table([0, 1])
    qi = np.array([0, 3, 4], np.int32)
    split = plan_attention(pt, qi, page_size=16, num_qo_heads=8, num_kv_heads=2, chunk_len=64)
    whole = plan_attention(pt, qi, page_size=16, num_qo_heads=8, num_kv_heads=2, chunk_len=1024)
    assert split.num_partials > 0 and whole.num_partials == 0
    a = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, plan=split)
    b = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, plan=whole)
    assert np.abs(a - b).max() < 1e-5
    check_against_dense(batch, q, a, "fp16")


@settings(max_examples=15, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    page_size=st.sampled_from([1, 2, 8, 16]),
    group=st.sampled_from([1, 2, 3, 5]),
    chunk=st.sampled_from([64, 128, None]),
    seed=st.integers(0, 2**16),
)
def test_decode_property(lens: list[int], page_size: int, group: int, chunk: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = write_batch(
        rng,
        lens=lens,
        q_lens=[1] * len(lens),
        page_size=page_size,
        num_kv_heads=1,
        head_dim=8,
        kv_dtype="fp16",
    )
    q = rng.normal(size=(len(lens), group, 8)).astype(np.float32)
    pt = batch.manager.page_table(batch.seq_ids)
    plan = plan_attention(
        pt, np.arange(len(lens) + 1), page_size=page_size, num_qo_heads=group, num_kv_heads=1, chunk_len=chunk
    )
    out = K.paged_decode_attention(q, batch.pool, 1, pt, plan=plan)
    check_against_dense(batch, q, out, "fp16")


def test_quantized_error_against_fp16(capsys: pytest.CaptureFixture[str]) -> None:
    """fp8/int8 caches (per-head scales) against an fp16 cache and against dense fp64: measured, bounded."""
    errs: dict[str, tuple[float, float]] = {}
    outs: dict[str, np.ndarray] = {}
    for kv_dtype in dtypes.KV_DTYPES:
        rng = np.random.default_rng(2024)
        batch = write_batch(
            rng, lens=[256, 512], q_lens=[1, 1], page_size=16, num_kv_heads=2, head_dim=128, kv_dtype=kv_dtype
        )
        q = (2 * rng.normal(size=(2, 16, 128))).astype(np.float32)  # peaked softmax: errors show
        outs[kv_dtype] = K.paged_decode_attention(q, batch.pool, 1, batch.manager.page_table([0, 1]))
        err = np.abs(outs[kv_dtype] - dense_outputs(batch, q, 1 / math.sqrt(128)))
        errs[kv_dtype] = (float(err.max()), float(err.mean()))
    vs16 = {k: float(np.abs(outs[k] - outs["fp16"]).max()) for k in ("bf16", "fp8", "int8")}
    with capsys.disabled():
        print(
            "\n  decode error vs dense fp64 (max / mean abs): "
            + ", ".join(f"{k} {a:.1e} / {m:.1e}" for k, (a, m) in errs.items())
        )
        print("  decode max |out - out(fp16 cache)|: " + ", ".join(f"{k} {e:.1e}" for k, e in vs16.items()))
    # Measured (seed 2024): vs dense fp16 6.0e-4 / 7.0e-5, bf16 5.5e-3 / 5.8e-4, fp8 0.15 / 9.0e-3,
    # int8 3.4e-2 / 4.4e-3; vs the fp16 cache bf16 5.5e-3, fp8 0.15, int8 3.4e-2.
    assert errs["fp16"][0] < 2e-3 and errs["bf16"][0] < 1.6e-2
    assert errs["fp8"][0] < 0.3 and errs["fp8"][1] < 2e-2
    assert (
        errs["int8"][0] < 0.1 and errs["int8"][1] < errs["fp8"][1]
    )  # 7 bits beat 3 mantissa bits on average
    assert vs16["fp8"] < 0.3 and vs16["int8"] < 0.1


# ------------------------------------------------------------------------------------ append_kv


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
def test_append_kv_writes_exactly_its_slots(kv_dtype: str) -> None:
    rng = np.random.default_rng(3)
    pool = KVPool(
        num_layers=2, num_pages=6, num_kv_heads=2, head_dim=16, page_size=4, kv_dtype=kv_dtype, layout="NHD"
    )
    if dtypes.is_quantized(kv_dtype):
        pool.set_scales(0, [0.01, 0.02], [0.03, 0.04])
    slots = np.array([5, -1, 22, 8], dtype=np.int64)
    k = rng.normal(size=(4, 2, 16)).astype(np.float16)
    v = rng.normal(size=(4, 2, 16)).astype(np.float16)
    K.append_kv(pool, 0, slots, k, v)
    written = slots[slots >= 0]
    rk, rv = pool.read_slots(0, written)
    ks = pool.k_scale[0][None, :, None]
    vs = pool.v_scale[0][None, :, None]
    keep = slots >= 0
    assert np.array_equal(rk, dtypes.decode(dtypes.encode(k[keep], kv_dtype, ks), kv_dtype, ks))
    assert np.array_equal(rv, dtypes.decode(dtypes.encode(v[keep], kv_dtype, vs), kv_dtype, vs))
    mask = np.ones(6 * 4, bool)
    mask[written] = False
    rest_k, rest_v = pool.read_slots(0, np.flatnonzero(mask))
    assert not rest_k.any() and not rest_v.any() and not pool.data[1].any()


def test_append_kv_rejects_bad_input_and_changes_nothing() -> None:
    pool = KVPool(num_layers=1, num_pages=4, num_kv_heads=1, head_dim=8, page_size=2, kv_dtype="fp16")
    k = np.ones((2, 1, 8), np.float32)
    for slots, err in (
        (np.array([3, 3]), InvalidArgumentError),  # duplicate slot
        (np.array([3, 8]), InvalidArgumentError),  # past the pool
        (np.array([-2, 3]), InvalidArgumentError),
        (np.array([1, 3]), InvalidArgumentError),  # slot 1 is in the null page 0
        (np.array([2.0, 3.0]), InvalidDTypeError),
        (np.array([3]), InvalidDTypeError),  # length mismatch
    ):
        with pytest.raises(err):
            K.append_kv(pool, 0, slots, k, k)
    with pytest.raises(InvalidDTypeError):
        K.append_kv(pool, 0, np.array([2, 3]), k, np.ones((2, 1, 4), np.float32))
    with pytest.raises(InvalidArgumentError):
        K.append_kv(pool, 3, np.array([2, 3]), k, k)
    assert not pool.data.any()


# ------------------------------------------------------------------------------------ plan & checks


def test_plan_items_partition_every_tile() -> None:
    pt = (np.array([0, 3, 3, 10], np.int32), np.arange(1, 11, dtype=np.int32), np.array([5, 0, 16], np.int32))
    qi = np.array([0, 33, 33, 34], np.int32)  # 33 query tokens, an empty sequence, one decode token
    plan = plan_attention(pt, qi, page_size=16, num_qo_heads=6, num_kv_heads=2, chunk_len=64)
    assert plan.kv_len.tolist() == [37, 0, 112]
    G = 3
    for seq, q_len in ((0, 33), (2, 1)):
        tiles = -(-q_len * G // ROWS_PER_TILE)
        for tile in range(tiles):
            rows = plan.items[(plan.items[:, 0] == seq) & (plan.items[:, 1] == tile)]
            last_row = min((tile + 1) * ROWS_PER_TILE, q_len * G) - 1
            keys = plan.kv_len[seq] - q_len + last_row // G + 1
            assert rows[0, 2] == 0 and rows[-1, 3] == keys and (rows[1:, 2] == rows[:-1, 3]).all()
            if len(rows) > 1:
                merge = plan.merges[(plan.merges[:, 0] == seq) & (plan.merges[:, 1] == tile)]
                assert merge.shape[0] == 1 and merge[0, 3] == len(rows)
                assert rows[:, 4].tolist() == list(range(merge[0, 2], merge[0, 2] + len(rows)))
            else:
                assert rows[0, 4] == -1
    assert not (plan.items[:, 0] == 1).any()
    assert sorted(plan.items[plan.items[:, 4] >= 0, 4].tolist()) == list(range(plan.num_partials))


def _uniform_decode_plan(batch: int, ctx: int, **kw: int) -> tuple[Any, int]:
    pages = ctx // 16
    pt = (
        np.arange(batch + 1, dtype=np.int32) * pages,
        np.arange(1, batch * pages + 1, dtype=np.int32),
        np.full(batch, 16, np.int32),
    )
    qi = np.arange(batch + 1, dtype=np.int32)
    plan = plan_attention(pt, qi, page_size=16, num_qo_heads=32, num_kv_heads=8, num_sms=132, **kw)
    return plan, plan.items.shape[0] * 8  # thread blocks: items x kv heads


def _estimate(plan: Any, slots: int) -> float:
    """The planner's cost model recomputed from the plan's items (8 kv heads): whole waves of the mean
    block (its keys + a fixed cost), never less than the longest block."""
    work = plan.items[:, 3] - plan.items[:, 2]
    blocks = plan.items.shape[0] * 8
    mean = int(work.sum()) * 8 / blocks + BLOCK_OVERHEAD_KEYS
    return max(-(-blocks // slots) * mean, int(work.max()) + BLOCK_OVERHEAD_KEYS)


@pytest.mark.parametrize(("batch", "ctx"), [(1, 32768), (8, 32768), (64, 1024), (128, 4096), (256, 16384)])
def test_split_k_fills_whole_waves(batch: int, ctx: int) -> None:
    """Llama-3.1-8B decode shapes on 132 SMs x 3 blocks: the chosen split beats every forced chunk length
    on the cost model, and the last wave is at least 75 % full (or the batch fits one wave)."""
    slots = 132 * 3
    plan, blocks = _uniform_decode_plan(batch, ctx)
    best = _estimate(plan, slots)
    for chunk in range(256, ctx + 64, 64):
        forced, _ = _uniform_decode_plan(batch, ctx, chunk_len=chunk)
        assert best <= _estimate(forced, slots) * 1.1, chunk  # candidates are a sample, not every length
    waves = blocks / slots
    assert waves <= 1 or waves / math.ceil(waves) >= 0.75, (blocks, waves)
    if batch == 1:  # one sequence: its splits spread over most of the GPU
        assert blocks >= slots // 2


def test_prefill_with_many_waves_is_not_split() -> None:
    """64 prompts of 8k tokens, each over 8k keys (Llama-3.1-8B heads): a million blocks unsplit, far
    more than any wave. A split would only add blocks and merges: none is made (one item per tile)."""
    batch, ctx = 64, 8192
    pages = ctx // 16
    pt = (
        np.arange(batch + 1, dtype=np.int32) * pages,
        np.arange(1, batch * pages + 1, dtype=np.int32),
        np.full(batch, 16, np.int32),
    )
    qi = (np.arange(batch + 1) * ctx).astype(np.int32)
    plan = plan_attention(pt, qi, page_size=16, num_qo_heads=32, num_kv_heads=8, num_sms=132)
    assert plan.num_partials == 0 and plan.items.shape[0] == batch * ctx * 4 // ROWS_PER_TILE


def test_work_items_start_on_16_key_steps() -> None:
    """Plain and windowed plans: every item begins at a multiple of 16 keys (one page per warp step)."""
    lens = np.array([5000, 777, 40, 300], np.int32)
    pages = -(-lens // 16)
    pt = (
        np.concatenate([[0], np.cumsum(pages)]).astype(np.int32),
        np.arange(1, pages.sum() + 1, dtype=np.int32),
        (lens - 1) % 16 + 1,
    )
    qi = np.array([0, 1, 8, 9, 40], np.int32)
    for window in (None, 100, 333):
        plan = plan_attention(pt, qi, page_size=16, num_qo_heads=8, num_kv_heads=2, window=window)
        assert (plan.items[:, 2] % 16 == 0).all()


@pytest.mark.parametrize("window", [None, 24])
def test_a_plan_keeps_its_own_page_table_when_the_caller_reuses_its_buffers(window: int | None) -> None:
    """An engine refills its page-table buffers each step (``page_table(ids, out=buf)``) while an earlier
    plan may still run: the plan's output stays the reference's over the table it was made from."""
    rng = np.random.default_rng(3)
    batch = write_batch(
        rng, lens=[37, 70, 20], q_lens=[1, 5, 1], page_size=16, num_kv_heads=2, head_dim=64, kv_dtype="fp16"
    )
    bufs = (np.zeros(8, np.int32), np.zeros(16, np.int32), np.zeros(8, np.int32))
    pt = batch.manager.page_table([0, 1, 2], out=bufs)
    original = tuple(np.array(a) for a in (pt.kv_indptr, pt.kv_indices, pt.kv_last_page_len))
    q_indptr = np.array([0, 1, 6, 7], np.int32)
    q = rng.normal(size=(7, 8, 64)).astype(np.float32)
    plan = plan_attention(pt, q_indptr, page_size=16, num_qo_heads=8, num_kv_heads=2, window=window)
    assert not any(np.shares_memory(a, b) for a in plan.page_table for b in (*bufs, q_indptr))
    want = K.paged_prefill_attention(q, batch.pool, 1, original, q_indptr.copy(), window=window)
    # The next step's table lands in the same buffers: other pages, one sequence shorter (indptr[1] = 1,
    # 4 keys where the plan's kv_len says 37), and the query offsets reused too.
    batch.manager.page_table([2, 1, 0], out=bufs)
    pt.kv_indptr[1], pt.kv_last_page_len[0] = 1, 4
    q_indptr[1:] = [2, 3, 7]
    got = K.paged_prefill_attention(q, batch.pool, 1, pt, q_indptr, plan=plan, window=window)
    np.testing.assert_array_equal(got, want)
    for kept, was in zip(plan.page_table, original, strict=True):
        np.testing.assert_array_equal(kept, was)
        assert not kept.flags.writeable  # what the plan validated cannot change under it either
    if window is None:
        check_against_dense(batch, q, got, "fp16")


def test_attention_rejects_bad_input() -> None:
    pool = KVPool(num_layers=1, num_pages=4, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype="fp16")
    pt = (np.array([0, 1], np.int32), np.array([2], np.int32), np.array([3], np.int32))
    q = np.ones((1, 4, 8), np.float32)
    K.paged_decode_attention(q, pool, 0, pt)
    with pytest.raises(InvalidDTypeError):
        K.paged_decode_attention(np.ones((1, 3, 8), np.float32), pool, 0, pt)  # 3 heads over 2 kv heads
    with pytest.raises(InvalidPageError):
        K.paged_decode_attention(q, pool, 0, (pt[0], np.array([4], np.int32), pt[2]))
    with pytest.raises(InvalidArgumentError):
        K.paged_decode_attention(q, pool, 0, (pt[0], pt[1], np.array([5], np.int32)))  # last page > page_size
    with pytest.raises(InvalidArgumentError):
        K.paged_prefill_attention(np.ones((4, 4, 8), np.float32), pool, 0, pt, np.array([0, 4]))  # 4 > 3 keys
    with pytest.raises(InvalidDTypeError):
        K.paged_decode_attention(q, pool, 0, pt, out=np.empty((1, 4, 8), np.float16))


def test_output_dtype_follows_q() -> None:
    rng = np.random.default_rng(0)
    batch = write_batch(rng, lens=[10], q_lens=[1], page_size=4, num_kv_heads=1, head_dim=16, kv_dtype="bf16")
    q = rng.normal(size=(1, 2, 16)).astype(np.float32)
    pt = batch.manager.page_table([0])
    ref = K.paged_decode_attention(q, batch.pool, 1, pt)
    half = K.paged_decode_attention(q.astype(np.float16), batch.pool, 1, pt)
    bf = K.paged_decode_attention(dtypes.float_to_bf16_bits(q), batch.pool, 1, pt)
    assert half.dtype == np.float16 and bf.dtype == np.uint16
    assert np.abs(half - ref).max() < 2e-3 and np.abs(dtypes.bf16_bits_to_float(bf) - ref).max() < 1e-2
    out = np.empty_like(q)
    assert K.paged_decode_attention(q, batch.pool, 1, pt, out=out) is out and np.array_equal(out, ref)


# ------------------------------------------------------------------------------------ page copies


def _random_pool(kv_dtype: str = "int8", layout: Layout = "HND", seed: int = 0) -> KVPool:
    pool = KVPool(
        num_layers=3, num_pages=9, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype=kv_dtype, layout=layout
    )
    pool.data[...] = np.random.default_rng(seed).integers(-100, 100, pool.data.shape).astype(pool.data.dtype)
    return pool


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_copy_pages_every_layer(layout: Layout) -> None:
    pool = _random_pool(layout=layout)
    before = pool.data.copy()
    K.copy_pages(pool, np.array([[3, 7], [5, 1], [3, 2]], np.int32))
    expected = before.copy()
    expected[:, :, [7, 1, 2]] = before[:, :, [3, 5, 3]]
    assert np.array_equal(pool.data, expected)


def test_copy_pages_rejects_conflicts() -> None:
    pool = _random_pool()
    before = pool.data.copy()
    for pairs, err in (
        ([[1, 2], [3, 2]], InvalidArgumentError),  # a destination twice
        ([[1, 2], [2, 3]], InvalidArgumentError),  # a destination is also a source
        ([[0, 2]], InvalidPageError),  # the null page
        ([[1, 9]], InvalidPageError),
        ([1, 2], InvalidDTypeError),
    ):
        with pytest.raises(err):
            K.copy_pages(pool, np.array(pairs))
    assert np.array_equal(pool.data, before)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gather_then_scatter_round_trip(layout: Layout) -> None:
    src = _random_pool(layout=layout, seed=1)
    dst = _random_pool(layout=layout, seed=2)
    ids = np.array([6, 2, 5], np.int32)
    buf = src.host_buffer(3)
    assert K.gather_pages(src, ids, buf) is buf
    for i, p in enumerate(ids):
        page = src.data[:, :, p]  # [L, 2, *page_shape]
        assert np.array_equal(buf[i], page) and buf[i].flags.c_contiguous
    target = np.array([1, 8, 3], np.int32)
    K.scatter_pages(dst, target, buf)
    assert np.array_equal(dst.data[:, :, target], src.data[:, :, ids])
    with pytest.raises(InvalidDTypeError):
        K.gather_pages(src, ids, src.host_buffer(2))
    with pytest.raises(InvalidArgumentError):
        K.scatter_pages(dst, np.array([1, 1, 3], np.int32), buf)
