"""Hostile arguments to the kernels: refused with a kvcore error naming the argument, nothing written.

Index-like arguments (page ids, slots, CSR offsets, last-page lengths) are range-checked *before* the cast
to the kernels' int32/int64: ``kv_indices=[2**32 + 1]`` used to wrap onto page 1, and a uint64 slot
``2**64 - 1`` onto the -1 "skip" slot, silently dropping its row. Floats, bools, ``None`` and non-arrays are
:class:`InvalidDTypeError` (also ``TypeError``); out-of-range values are :class:`InvalidArgumentError` or
:class:`InvalidPageError` (also ``ValueError``). ``kv_helpers.assert_refused`` compares the pool's bytes and
scales with a copy taken before each refused call.

The CUDA entry points (:mod:`kvcore.kernels.gpu`) are called here with a *NumPy* pool: their checks run on
the host before anything touches a device, so a hostile call is refused with the same error before the
first CuPy call (which would fail with an ``AttributeError`` on a NumPy pool).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from kv_helpers import assert_refused, random_pool

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.kernels import gpu
from kvcore.kernels.plan import plan_attention
from kvcore.pool import KVPool

HKV, D, P = 2, 8, 4  # random_pool's kv heads, head_dim and page size; it has 6 pages
BIG = 2**32 + 1  # 1 once wrapped to int32
U64_MAX = 2**64 - 1  # -1 (the skip slot) once wrapped to int64

# The dispatching API (the NumPy reference for NumPy pools) and the CUDA entry points' host-side checks.
IMPLS = [pytest.param(K, id="reference"), pytest.param(gpu, id="gpu")]


def table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A valid page table: 6 keys over pages (3, 1), then 3 keys in page 5."""
    return np.array([0, 2, 3], np.int32), np.array([3, 1, 5], np.int32), np.array([2, 3], np.int32)


def rows(n: int, heads: int = HKV) -> np.ndarray:
    """float32 ``[n, heads, D]`` activations."""
    return np.random.default_rng(n).normal(size=(n, heads, D)).astype(np.float32)


def decode_plan() -> Any:
    return plan_attention(table(), np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV)


# ------------------------------------------------------------------------------------ page ids


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(np.array([BIG], np.int64), id="int64-2**32+1"),
        pytest.param(np.array([-(2**32) + 5], np.int64), id="int64-wraps-to-5"),
        pytest.param(np.array([BIG], np.uint64), id="uint64-2**32+1"),
        pytest.param(np.array([U64_MAX], np.uint64), id="uint64-max"),
        pytest.param([BIG], id="list-2**32+1"),
    ],
)
def test_page_ids_outside_int32_are_refused_not_wrapped(impl: ModuleType, bad: Any) -> None:
    pool = random_pool()
    indptr, indices, last = table()
    wide = np.asarray(bad)
    wrapped = np.concatenate([indices[:2].astype(wide.dtype), wide])  # [3, 1, bad] in bad's dtype
    q = rows(2)
    assert_refused(
        pool,
        InvalidPageError,
        "kv_indices",
        lambda: impl.paged_decode_attention(q, pool, 0, (indptr, wrapped, last)),
    )
    assert_refused(
        pool,
        InvalidPageError,
        "kv_indices",
        lambda: impl.paged_prefill_attention(q, pool, 0, (indptr, wrapped, last), np.arange(3)),
    )
    ids = wide
    assert_refused(
        pool, InvalidPageError, "page_ids", lambda: impl.gather_pages(pool, ids, pool.host_buffer(1))
    )
    src = np.ones_like(pool.host_buffer(1))
    assert_refused(pool, InvalidPageError, "page_ids", lambda: impl.scatter_pages(pool, ids, src))
    pairs = np.stack([np.array([2], ids.dtype), ids], axis=1)  # [[2, bad]]
    assert_refused(pool, InvalidPageError, "pairs", lambda: impl.copy_pages(pool, pairs))
    assert_refused(pool, InvalidPageError, "pairs", lambda: impl.copy_pages(pool, pairs[:, ::-1]))


def test_plan_refuses_page_ids_outside_int32() -> None:
    indptr, _, last = table()
    for bad in (np.array([3, 1, BIG], np.int64), np.array([3, 1, U64_MAX], np.uint64)):
        with pytest.raises(InvalidPageError, match="kv_indices"):
            plan_attention((indptr, bad, last), np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV)


# ------------------------------------------------------------------------------------ CSR offsets, lengths


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_offsets_and_lengths_outside_int32_are_refused_not_wrapped(impl: ModuleType, dtype: Any) -> None:
    pool = random_pool()
    indptr, indices, last = table()
    q = rows(2)
    hostile_indptr = np.array([0, 2, 2**32 + 3], dtype)  # [0, 2, 3] once wrapped
    hostile_last = np.array([2, 2**32 + 3], dtype)  # [2, 3] once wrapped
    assert_refused(
        pool,
        InvalidArgumentError,
        "kv_indptr",
        lambda: impl.paged_decode_attention(q, pool, 0, (hostile_indptr, indices, last)),
    )
    assert_refused(
        pool,
        InvalidArgumentError,
        "kv_last_page_len",
        lambda: impl.paged_decode_attention(q, pool, 0, (indptr, indices, hostile_last)),
    )
    hostile_q_indptr = np.array([0, 1, 2**32 + 2], dtype)  # [0, 1, 2] once wrapped
    assert_refused(
        pool,
        InvalidArgumentError,
        "q_indptr",
        lambda: impl.paged_prefill_attention(q, pool, 0, table(), hostile_q_indptr),
    )
    for pt, qi, name in (
        ((hostile_indptr, indices, last), np.arange(3), "kv_indptr"),
        ((indptr, indices, hostile_last), np.arange(3), "kv_last_page_len"),
        (table(), hostile_q_indptr, "q_indptr"),
    ):
        with pytest.raises(InvalidArgumentError, match=name):
            plan_attention(pt, qi, page_size=P, num_qo_heads=HKV, num_kv_heads=HKV)


def test_a_sequence_longer_than_int32_keys_is_refused() -> None:
    """kv_len = page_size * (pages - 1) + last is computed wide: 2**29 pages of 16 tokens would wrap."""
    n = 2**27 + 1
    indptr = np.array([0, n], np.int32)
    indices = np.ones(n, np.int32)
    with pytest.raises(InvalidArgumentError, match="kv_len"):
        plan_attention(
            (indptr, indices, np.array([16], np.int32)), [0, 1], page_size=16, num_qo_heads=1, num_kv_heads=1
        )


# ------------------------------------------------------------------------------------ slots


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "slots",
    [
        pytest.param(np.array([5, U64_MAX], np.uint64), id="uint64-max"),
        pytest.param([5, U64_MAX], id="list-uint64-max"),
        pytest.param(np.array([5, 2**63], np.uint64), id="uint64-2**63"),
    ],
)
def test_uint64_max_slot_is_refused_not_skipped(impl: ModuleType, slots: Any) -> None:
    pool = random_pool()
    k, v = rows(2), rows(2) + 1
    assert_refused(pool, InvalidArgumentError, "slot_mapping", lambda: impl.append_kv(pool, 0, slots, k, v))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "slots",
    [
        pytest.param(np.array([5.0, 6.0]), id="float"),
        pytest.param([5, 6.5], id="list-float"),
        pytest.param(np.array([True, False]), id="bool"),
        pytest.param(None, id="None"),
        pytest.param(np.array([[5, 6]]), id="2-D"),
        pytest.param(np.int64(5), id="0-D"),
        pytest.param("56", id="str"),
    ],
)
def test_non_integer_slot_mappings_are_dtype_errors(impl: ModuleType, slots: Any) -> None:
    pool = random_pool()
    k = rows(2)
    assert_refused(pool, InvalidDTypeError, "slot_mapping", lambda: impl.append_kv(pool, 0, slots, k, k))


# ------------------------------------------------------------------------------------ sm_scale


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("scale", "err"),
    [
        (float("nan"), InvalidArgumentError),
        (float("inf"), InvalidArgumentError),
        (-float("inf"), InvalidArgumentError),
        (0.0, InvalidArgumentError),
        (-0.125, InvalidArgumentError),
        (np.float32("nan"), InvalidArgumentError),
        ("0.35", InvalidDTypeError),
        (True, InvalidDTypeError),
        ([0.35], InvalidDTypeError),
        (1j, InvalidDTypeError),
    ],
)
def test_sm_scale_must_be_finite_and_positive(impl: ModuleType, scale: Any, err: type[Exception]) -> None:
    pool = random_pool()
    q = rows(2)
    out = np.full_like(q, 3.0)
    for plan in (None, decode_plan()):  # planned on the fly, and the per-layer path with a plan
        decode = (impl.paged_decode_attention, q, pool, 0, table(), scale)
        assert_refused(pool, err, "sm_scale", *decode, plan=plan, out=out)
        prefill = (impl.paged_prefill_attention, q, pool, 0, table(), np.arange(3), scale)
        assert_refused(pool, err, "sm_scale", *prefill, plan=plan, out=out)
    assert (out == 3.0).all()


def test_attention_launcher_checks_its_arguments() -> None:
    """The CUDA launcher is public (benchmarks, graph capture): it checks what the API checks."""
    pool = random_pool()
    q, out = rows(2), np.empty((2, HKV, D), np.float32)
    plan = decode_plan()
    assert_refused(
        pool,
        InvalidArgumentError,
        "sm_scale",
        lambda: gpu.attention_launcher(q, pool, 0, plan, float("nan"), out),
    )
    assert_refused(
        pool, InvalidArgumentError, "layer", lambda: gpu.attention_launcher(q, pool, -1, plan, 0.5, out)
    )
    not_a_plan: Any = "plan"
    assert_refused(pool, InvalidDTypeError, "plan", gpu.attention_launcher, q, pool, 0, not_a_plan, 0.5, out)
    bigger = plan_attention(
        (np.array([0, 1], np.int32), np.array([6], np.int32), np.array([1], np.int32)),
        np.arange(2),
        page_size=P,
        num_qo_heads=HKV,
        num_kv_heads=HKV,
    )  # page 6 is past this 6-page pool
    assert_refused(
        pool,
        InvalidPageError,
        "kv_indices",
        lambda: gpu.attention_launcher(q[:1], pool, 0, bigger, 0.5, out[:1]),
    )


def test_attention_launcher_refuses_what_its_vector_loads_cannot_take() -> None:
    """Q rows not 16-byte aligned, and a plan whose items do not start on a 16-key step, are refused."""
    pool = KVPool(num_layers=1, num_pages=6, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="fp16")
    pt = (np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([16], np.int32))
    plan = plan_attention(pt, np.arange(2), page_size=16, num_qo_heads=4, num_kv_heads=2)
    q = np.zeros((1, 4, 64), np.float16)
    out = np.zeros_like(q)
    shifted = np.zeros(4 * 64 + 1, np.float16)[1:].reshape(1, 4, 64)  # 2 bytes off a 16-byte boundary
    assert_refused(
        pool, InvalidDTypeError, "16-byte", lambda: gpu.attention_launcher(shifted, pool, 0, plan, 0.5, out)
    )
    # A hand-edited plan (its work would not start on a step): its arrays cannot be written, and a
    # plan rebuilt around other arrays is not sealed, which both paths refuse.
    with pytest.raises(ValueError, match="read-only"):
        plan.items[0, 2] = 5
    with pytest.raises(ValueError):
        plan.items.flags.writeable = True
    items = plan.items.copy()
    items[0, 2] = 5
    edited = dataclasses.replace(plan, items=items)
    assert_refused(
        pool,
        InvalidArgumentError,
        "plan_attention",
        lambda: gpu.attention_launcher(q, pool, 0, edited, 0.5, out),
    )


# ------------------------------------------------------------------------------------ non-arrays


def _cases(impl: ModuleType) -> list[tuple[str, Any]]:
    """(argument name, a call passing None or a list where that argument must be an array)."""
    q, k = rows(2), rows(2)
    indptr, indices, last = table()
    buf = np.zeros((1, 2, 2, HKV, P, D), np.int8)
    return [
        ("slot_mapping", lambda pool: impl.append_kv(pool, 0, None, k, k)),
        ("k", lambda pool: impl.append_kv(pool, 0, np.array([5, 6]), k.tolist(), k)),
        ("v", lambda pool: impl.append_kv(pool, 0, np.array([5, 6]), k, None)),
        ("q", lambda pool: impl.paged_decode_attention(None, pool, 0, table())),
        ("q", lambda pool: impl.paged_decode_attention(q.tolist(), pool, 0, table())),
        ("page_table", lambda pool: impl.paged_decode_attention(q, pool, 0, None)),
        ("page_table", lambda pool: impl.paged_decode_attention(q, pool, 0, (indptr, indices))),
        ("kv_indices", lambda pool: impl.paged_decode_attention(q, pool, 0, (indptr, None, last))),
        (
            "kv_indices",
            lambda pool: impl.paged_decode_attention(q, pool, 0, (indptr, indices.astype(float), last)),
        ),
        ("q_indptr", lambda pool: impl.paged_prefill_attention(q, pool, 0, table(), None)),
        ("out", lambda pool: impl.paged_decode_attention(q, pool, 0, table(), out=q.tolist())),
        ("plan", lambda pool: impl.paged_decode_attention(q, pool, 0, table(), plan="plan")),
        ("page_ids", lambda pool: impl.gather_pages(pool, None, buf)),
        ("page_ids", lambda pool: impl.gather_pages(pool, np.array([True]), buf)),
        ("page_ids", lambda pool: impl.scatter_pages(pool, [1.0], buf)),
        ("out", lambda pool: impl.gather_pages(pool, [1], None)),
        ("src", lambda pool: impl.scatter_pages(pool, [1], buf.tolist())),
        ("pairs", lambda pool: impl.copy_pages(pool, None)),
        ("pairs", lambda pool: impl.copy_pages(pool, [[1.0, 2.0]])),
        ("pairs", lambda pool: impl.copy_pages(pool, [1, 2])),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_non_arrays_are_dtype_errors(impl: ModuleType) -> None:
    pool = random_pool()
    for name, call in _cases(impl):
        assert_refused(pool, InvalidDTypeError, name, call, pool)


def test_the_api_refuses_a_pool_that_is_not_a_pool() -> None:
    for call in (
        lambda: K.append_kv(None, 0, [1], rows(1), rows(1)),  # type: ignore[arg-type]
        lambda: K.copy_pages(np.zeros(3), [[1, 2]]),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidDTypeError, match="pool"):
            call()


# ------------------------------------------------------------------------------------ valid inputs still work


def test_lists_and_narrow_integers_are_accepted() -> None:
    """The checks refuse what would wrap, not what merely is not int32: lists, int8..uint32, empty lists."""
    pool = random_pool(kv_dtype="fp16")
    ref = random_pool(kv_dtype="fp16")
    k = rows(2)
    K.append_kv(pool, 0, [5, -1], k, k)
    K.append_kv(ref, 0, np.array([5, -1], np.int64), k, k)
    assert np.array_equal(pool.data, ref.data)
    K.append_kv(pool, 0, np.array([7, 9], np.uint32), k, k)
    K.append_kv(ref, 0, np.array([7, 9], np.int64), k, k)
    assert np.array_equal(pool.data, ref.data)
    q = rows(2)
    indptr, indices, last = table()
    a = K.paged_decode_attention(q, pool, 0, table())
    b = K.paged_decode_attention(
        q, pool, 0, (indptr.tolist(), indices.astype(np.uint8), last.astype(np.int64))
    )
    assert np.array_equal(a, b)
    assert K.gather_pages(pool, [], pool.host_buffer(0)).shape[0] == 0
    K.copy_pages(pool, [])
    K.copy_pages(pool, np.array([[3, 2]], np.uint64))
    assert np.array_equal(pool.data[:, :, 2], pool.data[:, :, 3])


# ------------------------------------------------------------------------------------ bounded caches

# table(): sequence 0 has 6 keys on pages (3, 1), sequence 1 has 3 keys on page 5 (9 keys in all).
GOOD_POSITIONS = np.array([0, 1, 5, 6, 7, 9, 2, 3, 4], np.int32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("window", "err"),
    [
        (0, InvalidArgumentError),
        (-3, InvalidArgumentError),
        (2.5, InvalidDTypeError),
        (4.0, InvalidDTypeError),
        ("8", InvalidDTypeError),
        (True, InvalidDTypeError),
        ([4], InvalidDTypeError),
    ],
)
def test_window_must_be_a_positive_integer(impl: ModuleType, window: Any, err: type[Exception]) -> None:
    pool = random_pool()
    q = rows(2)
    assert_refused(
        pool, err, "window", lambda: impl.paged_decode_attention(q, pool, 0, table(), window=window)
    )
    assert_refused(
        pool,
        err,
        "window",
        lambda: impl.paged_prefill_attention(q, pool, 0, table(), np.arange(3), window=window),
    )
    assert_refused(
        pool,
        err,
        "window",
        lambda: impl.paged_decode_attention(q, pool, 0, table(), plan=decode_plan(), window=window),
    )
    with pytest.raises(err, match="window"):
        plan_attention(table(), np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV, window=window)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("positions", "err"),
    [
        pytest.param(GOOD_POSITIONS.astype(np.float32), InvalidDTypeError, id="float"),
        pytest.param(GOOD_POSITIONS.reshape(3, 3), InvalidDTypeError, id="2-D"),
        pytest.param(GOOD_POSITIONS.astype(bool), InvalidDTypeError, id="bool"),
        pytest.param("0123", InvalidDTypeError, id="str"),
        pytest.param(GOOD_POSITIONS[:-1], InvalidArgumentError, id="too-short"),
        pytest.param(np.append(GOOD_POSITIONS, 10), InvalidArgumentError, id="too-long"),
        pytest.param(np.array([0, 1, 5, 5, 7, 9, 2, 3, 4]), InvalidArgumentError, id="repeat"),
        pytest.param(np.array([0, 1, 5, 6, 7, 9, 2, 1, 4]), InvalidArgumentError, id="decreasing"),
        pytest.param(np.array([-1, 1, 5, 6, 7, 9, 2, 3, 4]), InvalidArgumentError, id="negative"),
        pytest.param(
            np.array([0, 1, 5, 6, 7, 2**32 + 1, 2, 3, 4], np.int64), InvalidArgumentError, id="past-int32"
        ),
    ],
)
def test_positions_are_checked(impl: ModuleType, positions: Any, err: type[Exception]) -> None:
    pool = random_pool()
    q = rows(2)
    for window in (None, 3):
        decode = (impl.paged_decode_attention, q, pool, 0, table())
        assert_refused(pool, err, "positions", *decode, window=window, positions=positions)
        prefill = (impl.paged_prefill_attention, q, pool, 0, table(), np.arange(3))
        assert_refused(pool, err, "positions", *prefill, window=window, positions=positions)
        with pytest.raises(err, match="positions"):
            plan_attention(
                table(),
                np.arange(3),
                page_size=P,
                num_qo_heads=HKV,
                num_kv_heads=HKV,
                window=window,
                positions=positions,
            )


def test_positions_may_restart_at_each_sequence() -> None:
    """Only the order within a sequence matters: the next sequence may start lower."""
    pool = random_pool(kv_dtype="fp16")
    out = K.paged_decode_attention(rows(2), pool, 0, table(), positions=GOOD_POSITIONS, window=2)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_plan_is_used_with_its_own_window_and_positions(impl: ModuleType) -> None:
    pool = random_pool()
    q = rows(2)
    windowed = plan_attention(
        table(), np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV, window=4
    )
    compacted = plan_attention(
        table(), np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV, positions=GOOD_POSITIONS
    )
    for plan, kwargs in (
        (windowed, {}),
        (windowed, {"window": 5}),
        (decode_plan(), {"window": 4}),
        (compacted, {"window": 4, "positions": GOOD_POSITIONS}),
    ):
        assert_refused(
            pool,
            InvalidArgumentError,
            "window",
            impl.paged_decode_attention,
            q,
            pool,
            0,
            table(),
            plan=plan,
            **kwargs,
        )
    for plan, kwargs in (
        (compacted, {}),
        (decode_plan(), {"positions": GOOD_POSITIONS}),
        (compacted, {"positions": GOOD_POSITIONS + 1}),
    ):
        assert_refused(
            pool,
            InvalidArgumentError,
            "positions",
            impl.paged_decode_attention,
            q,
            pool,
            0,
            table(),
            plan=plan,
            **kwargs,
        )


@pytest.mark.parametrize("impl", IMPLS)
def test_the_null_page_needs_a_window(impl: ModuleType) -> None:
    pool = random_pool()
    q = rows(2)
    indptr, _, last = table()
    nulled = (indptr, np.array([0, 1, 5], np.int32), last)
    assert_refused(
        pool, InvalidPageError, "kv_indices", lambda: impl.paged_decode_attention(q, pool, 0, nulled)
    )
    with pytest.raises(InvalidPageError, match="kv_indices"):
        plan_attention(nulled, np.arange(3), page_size=P, num_qo_heads=HKV, num_kv_heads=HKV)
    negative = (indptr, np.array([-1, 1, 5], np.int32), last)
    assert_refused(
        pool,
        InvalidPageError,
        "kv_indices",
        lambda: impl.paged_decode_attention(q, pool, 0, negative, window=2),
    )


@pytest.mark.parametrize(
    "scores",
    [
        pytest.param(np.zeros(3, np.float64), id="float64"),
        pytest.param(np.zeros(3, np.float16), id="float16"),
        pytest.param(np.zeros(4, np.float32), id="too-long"),
        pytest.param(np.zeros((3, 1), np.float32), id="2-D"),
        pytest.param([0.0, 0.0, 0.0], id="list"),
    ],
)
def test_page_scores_must_be_a_float32_array_per_table_entry(scores: Any) -> None:
    pool = random_pool()
    q = rows(2)
    assert_refused(
        pool,
        InvalidDTypeError,
        "page_scores",
        lambda: K.paged_decode_attention(q, pool, 0, table(), page_scores=scores),
    )


def test_page_scores_must_be_writable_and_are_untouched_by_a_refused_call() -> None:
    pool = random_pool()
    q = rows(2)
    frozen = np.zeros(3, np.float32)
    frozen.setflags(write=False)
    assert_refused(
        pool,
        InvalidDTypeError,
        "page_scores",
        lambda: K.paged_decode_attention(q, pool, 0, table(), page_scores=frozen),
    )
    scores = np.full(3, 7.0, np.float32)
    assert_refused(
        pool,
        InvalidArgumentError,
        "window",
        lambda: K.paged_decode_attention(q, pool, 0, table(), window=0, page_scores=scores),
    )
    assert_refused(
        pool,
        InvalidArgumentError,
        "sm_scale",
        lambda: K.paged_decode_attention(q, pool, 0, table(), -1.0, page_scores=scores),
    )
    assert (scores == 7.0).all()


def test_the_cuda_path_takes_device_page_scores_only() -> None:
    """A NumPy ``page_scores`` is refused on the host by the CUDA entry points (with a plan, or without)."""
    pool = random_pool()
    q = rows(2)
    scores = np.zeros(3, np.float32)
    for plan in (None, decode_plan()):
        call = (gpu.paged_decode_attention, q, pool, 0, table())
        assert_refused(pool, InvalidDTypeError, "page_scores", *call, plan=plan, page_scores=scores)
    assert_refused(
        pool,
        InvalidDTypeError,
        "page_scores",
        lambda: gpu.paged_decode_attention(q, pool, 0, table(), plan=plan, page_scores=scores),
    )
    assert_refused(
        pool,
        InvalidDTypeError,
        "page_scores",
        lambda: gpu.attention_launcher(q, pool, 0, decode_plan(), 0.5, q, scores),
    )
