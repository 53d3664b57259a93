"""Hostile arguments to the pool: refused with a kvcore error naming the argument, scales and bytes unchanged.

``read_slots`` used to truncate float slots (``[1.7]`` read slot 1); ``calibrate_scales`` turned an all-NaN
sample into scale 1.0; the conversions of :mod:`kvcore.pool.dtypes` quantized with a zero or NaN scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kv_helpers import assert_refused, random_pool

import kvcore
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError
from kvcore.pool import KVPool, dtypes

NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------------ read_slots


@pytest.mark.parametrize(
    ("slots", "err"),
    [
        pytest.param([1.7], InvalidDTypeError, id="list-float"),
        pytest.param(np.array([1.7]), InvalidDTypeError, id="float"),
        pytest.param(np.array([1.0, 2.0]), InvalidDTypeError, id="integral-float"),
        pytest.param([True], InvalidDTypeError, id="bool"),
        pytest.param(None, InvalidDTypeError, id="None"),
        pytest.param(np.array([[1, 2]]), InvalidDTypeError, id="2-D"),
        pytest.param(np.array([2**64 - 1], np.uint64), InvalidArgumentError, id="uint64-max"),
        pytest.param(np.array([2**32 + 1], np.int64), InvalidArgumentError, id="past-the-pool"),
        pytest.param([-1], InvalidArgumentError, id="skip-slot"),
    ],
)
def test_read_slots_refuses_what_is_not_a_slot(slots: Any, err: type[Exception]) -> None:
    pool = random_pool()
    assert_refused(pool, err, "slots", lambda: pool.read_slots(0, slots))


def test_read_slots_takes_lists_and_narrow_integers() -> None:
    pool = random_pool()
    a = pool.read_slots(1, np.array([1, 23], np.int64))
    for slots in ([1, 23], (1, 23), np.array([1, 23], np.uint8), np.array([1, 23], np.int32)):
        b = pool.read_slots(1, slots)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert pool.read_slots(0, [])[0].shape == (0, 2, 8)


# ------------------------------------------------------------------------------------ calibrate_scales


def _sample(fill: float | None = None, n: int = 5) -> np.ndarray:
    x = np.random.default_rng(1).normal(size=(n, 2, 8)).astype(np.float32)
    if fill is not None:
        x[...] = fill
    return x


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_calibrate_scales_refuses_a_sample_without_finite_values(kv_dtype: str) -> None:
    pool = random_pool(kv_dtype)
    good = _sample()
    one_head_nan = _sample()
    one_head_nan[:, 1] = NAN
    one_inf = _sample()
    one_inf[2, 0, 3] = INF
    for k, v, name in (
        (_sample(NAN), good, "k:"),
        (good, _sample(NAN), "v:"),
        (_sample(INF), good, "k:"),
        (good, _sample(-INF), "v:"),
        (one_head_nan, good, "k:"),
        (good, one_inf, "v:"),
        (_sample(n=0), good, "k:"),  # an empty sample says nothing about the range
        (dtypes.float_to_bf16_bits(_sample(NAN)), good, "k:"),  # bf16 NaN bit patterns
    ):
        assert_refused(pool, InvalidArgumentError, name, pool.calibrate_scales, 1, k, v)


@pytest.mark.parametrize(
    ("headroom", "err"),
    [
        (NAN, InvalidArgumentError),
        (0.0, InvalidArgumentError),
        (-2.0, InvalidArgumentError),
        (INF, InvalidArgumentError),
        ("2", InvalidDTypeError),
        (True, InvalidDTypeError),
    ],
)
def test_calibrate_scales_refuses_a_bad_headroom(headroom: Any, err: type[Exception]) -> None:
    pool = random_pool()
    assert_refused(
        pool, err, "headroom", lambda: pool.calibrate_scales(1, _sample(), _sample(), headroom=headroom)
    )


def test_calibrate_scales_refuses_non_arrays_and_integers() -> None:
    pool = random_pool()
    for k, name in ((None, "k:"), (np.ones((5, 2, 8), np.int32), "k:"), (np.ones((5, 2, 8), bool), "k:")):
        assert_refused(pool, InvalidDTypeError, name, pool.calibrate_scales, 1, k, _sample())
    assert_refused(
        pool, InvalidArgumentError, "layer", lambda: pool.calibrate_scales(2, _sample(), _sample())
    )


def test_calibrate_scales_still_sets_zero_heads_to_one() -> None:
    pool = random_pool()
    k = _sample(0.0)
    k[:, 0, 0] = 12.7
    pool.calibrate_scales(0, k, _sample(0.0))
    assert np.allclose(pool.k_scale[0], [0.1, 1.0]) and pool.v_scale[0].tolist() == [1.0, 1.0]


# ------------------------------------------------------------------------------------ set_scales


@pytest.mark.parametrize(
    ("scale", "err"),
    [
        pytest.param(1e40, InvalidArgumentError, id="inf-as-float32"),
        pytest.param(1e-50, InvalidArgumentError, id="zero-as-float32"),
        pytest.param("0.5", InvalidDTypeError, id="str"),
        pytest.param(None, InvalidDTypeError, id="None"),
        pytest.param(True, InvalidDTypeError, id="bool"),
        pytest.param([0.5, 1j], InvalidDTypeError, id="complex"),
    ],
)
def test_set_scales_refuses_what_is_not_a_scale(scale: Any, err: type[Exception]) -> None:
    pool = random_pool()
    assert_refused(pool, err, "k_scale", lambda: pool.set_scales(0, scale, 1.0))


# ------------------------------------------------------------------------------------ dtypes


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
@pytest.mark.parametrize("scale", [0.0, -1.0, NAN, INF, np.array([0.5, 0.0])])
def test_quantizing_conversions_refuse_a_bad_scale(kv_dtype: str, scale: Any) -> None:
    x = np.ones((3, 2), np.float32)
    stored = dtypes.encode(x, kv_dtype, 0.5)
    with pytest.raises(InvalidArgumentError, match="scale"):
        dtypes.encode(x, kv_dtype, scale)
    with pytest.raises(InvalidArgumentError, match="scale"):
        dtypes.decode(stored, kv_dtype, scale)


def test_a_pool_too_large_for_memory_is_an_out_of_memory_error() -> None:
    """NumPy's own _ArrayMemoryError never reaches the caller: kvcore's OutOfMemoryError (a MemoryError)."""
    with pytest.raises(kvcore.OutOfMemoryError, match="cannot allocate"):
        KVPool(num_layers=80, num_pages=10**6, num_kv_heads=8, head_dim=128, page_size=16)


@pytest.mark.parametrize("num_pages", [2**48, 2**62])  # past the address space; past NumPy's index range
def test_a_host_buffer_too_large_for_memory_is_an_out_of_memory_error(num_pages: int) -> None:
    pool = random_pool()
    with pytest.raises(kvcore.OutOfMemoryError, match="host_buffer: cannot allocate"):
        pool.host_buffer(num_pages)


# ------------------------------------------------------------------------------------ from_memory_budget

BUDGET_SHAPE = dict(num_layers=2, num_kv_heads=2, head_dim=8, page_size=4)  # 512-byte bf16 pages


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param("1GiB", id="str"),
        pytest.param(True, id="bool"),
        pytest.param(np.True_, id="numpy-bool"),
        pytest.param(1e6, id="float"),
        pytest.param(np.float64(1e6), id="numpy-float"),
        pytest.param(None, id="None"),
    ],
)
def test_from_memory_budget_refuses_a_budget_that_is_not_an_integer(budget: Any) -> None:
    with pytest.raises(kvcore.ConfigError, match="budget_bytes: expected an integer"):
        KVPool.from_memory_budget(budget, **BUDGET_SHAPE)  # type: ignore[arg-type]


@pytest.mark.parametrize("as_int", [int, np.int64, np.uint32], ids=["int", "int64", "uint32"])
def test_from_memory_budget_takes_integers_as_the_constructor_does(as_int: Any) -> None:
    """NumPy integers are budgets and shapes, as KVPool(num_pages=np.int64(2)) takes them."""
    shape = {k: as_int(v) for k, v in BUDGET_SHAPE.items()}
    pool = KVPool.from_memory_budget(as_int(10 * 512 + 100), **shape)
    assert (pool.num_pages, pool.page_bytes) == (10, 512)
    assert type(pool.num_pages) is int and type(pool.num_layers) is int
    with pytest.raises(InvalidArgumentError, match="num_layers"):
        KVPool.from_memory_budget(10**6, **{**BUDGET_SHAPE, "num_layers": True})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ checked copies


def test_index_checks_return_a_private_copy_of_what_they_checked() -> None:
    """Page ids and slots reach raw kernels after their checks: the checked array must be the pool's
    own copy (taken before the checks), never the caller's buffer, which another thread may write
    between the check and the launch. Each array is already of the target dtype and contiguous, the
    case a no-copy fast path would hand back as is."""
    from kvcore.kernels.checks import check_page_ids, check_pairs, check_slots
    from kvcore.pool.checks import index_array

    pool = random_pool()
    ids = np.array([1, 2, 3], dtype=np.int64)
    slots = np.array([pool.page_size, -1, pool.page_size + 1], dtype=np.int64)
    pairs = np.array([[1, 2], [3, 4]], dtype=np.int64)
    i32 = np.array([0, 1, 2], dtype=np.int32)
    for got, given in [
        (index_array(i32, "x", dtype=np.int32), i32),
        (check_page_ids(pool, ids), ids),
        (check_slots(pool, slots), slots),
        (check_pairs(pool, pairs), pairs),
    ]:
        np.testing.assert_array_equal(got, given)
        assert not np.shares_memory(got, given)


def test_a_writer_racing_the_checks_never_gets_an_unchecked_page_id_through() -> None:
    """A thread flips one entry of the caller's array between a valid and an out-of-range page id while
    the main thread checks it: every call either refuses or returns only valid ids."""
    import sys
    import threading

    from kvcore.exceptions import InvalidPageError
    from kvcore.kernels.checks import check_page_ids

    pool = random_pool()
    ids = np.arange(1, 257, dtype=np.int64) % (pool.num_pages - 1) + 1
    ids = np.unique(ids)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            ids[-1] = 10**9
            ids[-1] = pool.num_pages - 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(3000):
            try:
                got = check_page_ids(pool, ids)
            except InvalidPageError:
                continue
            assert int(got.max()) < pool.num_pages and int(got.min()) >= 1
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)


def test_calibrate_scales_of_tiny_and_huge_samples() -> None:
    """A finite sample whose scale underflows float32 was refused, blamed on k_scale; one whose scale
    overflows was blamed on v_scale with a RuntimeWarning. The first now gets 1.0 (as an all-zero
    head), the second is refused naming its sample and the headroom; nothing changes either way."""
    import warnings

    from kvcore.exceptions import InvalidArgumentError
    from kvcore.pool import KVPool

    for kv_dtype, qmax in (("int8", 127.0), ("fp8", 448.0)):
        p = KVPool(num_layers=1, num_pages=2, num_kv_heads=2, head_dim=4, page_size=2, kv_dtype=kv_dtype)
        tiny = np.full((1, 2, 4), 1e-44, np.float32)
        tiny[0, 1] = 2.0  # head 1 has a usual magnitude
        p.calibrate_scales(0, tiny, np.ones((1, 2, 4), np.float32))
        assert p.k_scale[0].tolist() == [1.0, np.float32(2.0 / qmax)]
        before = (p.k_scale.copy(), p.v_scale.copy())
        huge = np.full((1, 2, 4), 3e38, np.float32)
        ones = np.ones((1, 2, 4), np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (headroom * amax overflowed float32 on the way)
            with pytest.raises(InvalidArgumentError, match=r"^k: headroom 1000"):
                p.calibrate_scales(0, huge, ones, headroom=1e3)
            with pytest.raises(InvalidArgumentError, match=r"^v: headroom 1000"):
                p.calibrate_scales(0, ones, huge, headroom=1e3)
            assert np.array_equal(p.k_scale, before[0]) and np.array_equal(p.v_scale, before[1])
            p.calibrate_scales(0, huge, huge, headroom=2.0)  # 6e38 / qmax fits a float32 scale
        assert p.k_scale[0].tolist() == [np.float32(6e38 / qmax)] * 2


def test_encode_and_decode_refuse_a_scale_that_does_not_broadcast_to_the_values() -> None:
    """A scale of another shape was a bare ValueError from NumPy (or, broadcasting the other way, an
    output of another shape than the values'): InvalidArgumentError now."""
    from kvcore.exceptions import InvalidArgumentError
    from kvcore.pool import dtypes

    x = np.ones((2, 2), np.float32)
    for kv_dtype in ("int8", "fp8"):
        for scale in (np.array([1.0, 2.0, 3.0], np.float32), np.ones((3, 2, 2), np.float32)):
            with pytest.raises(InvalidArgumentError, match="broadcast"):
                dtypes.encode(x, kv_dtype, scale)
            stored = dtypes.encode(x, kv_dtype, 1.0)
            with pytest.raises(InvalidArgumentError, match="broadcast"):
                dtypes.decode(stored, kv_dtype, scale)
        per_row = np.array([[1.0], [2.0]], np.float32)  # broadcasts: fine
        assert (
            dtypes.decode(dtypes.encode(x * per_row, kv_dtype, per_row), kv_dtype, per_row).tolist()
            == (x * per_row).tolist()
        )
