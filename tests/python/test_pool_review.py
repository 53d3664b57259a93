"""Regressions from a hostile review of the pool: device arrays on a NumPy pool, page counts past any
array's size, and index lists NumPy would read wrongly (bools as 0/1, mixed NumPy and Python integers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kv_helpers import FakeDeviceArray, assert_refused, random_pool

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, InvalidPageError, OutOfMemoryError
from kvcore.pool import KVPool
from kvcore.pool.checks import index_array

# ------------------------------------------------------------------------------------ device arrays


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
def test_set_scales_refuses_a_device_array_on_a_numpy_pool(which: str) -> None:
    pool = random_pool("int8")
    scale = FakeDeviceArray(np.ones(2, np.float32))
    ks, vs = (scale, 1.0) if which == "k_scale" else (1.0, scale)
    assert_refused(pool, InvalidDTypeError, which, pool.set_scales, 0, ks, vs)


def test_calibrate_scales_and_read_slots_refuse_device_arrays_on_a_numpy_pool() -> None:
    pool = random_pool("int8")
    x = np.ones((2, 2, 8), np.float32)
    assert_refused(pool, InvalidDTypeError, "v", pool.calibrate_scales, 0, x, FakeDeviceArray(x))
    assert_refused(pool, InvalidDTypeError, "slots", pool.read_slots, 0, FakeDeviceArray(np.array([4, 5])))


# ------------------------------------------------------------------------------------ huge pools


@pytest.mark.parametrize("num_pages", [2**62, 10**30, np.int64(2**62)])
def test_a_page_count_past_any_array_is_an_out_of_memory_error(num_pages: int) -> None:
    with pytest.raises(OutOfMemoryError, match="KVPool"):
        KVPool(num_layers=1, num_pages=num_pages, num_kv_heads=1, head_dim=8)


# ------------------------------------------------------------------------------------ index lists


@pytest.mark.parametrize("slots", [[True, 5], [5, False], [np.bool_(True), 5], (5, True)])
def test_a_bool_in_an_index_list_is_refused(slots: Any) -> None:
    pool = random_pool("fp16")
    x = np.ones((2, 2, 8), np.float32)
    assert_refused(pool, InvalidDTypeError, "slot_mapping", K.append_kv, pool, 0, slots, x, x)
    with pytest.raises(InvalidDTypeError, match="slots"):
        pool.read_slots(0, slots)


def test_a_bool_in_a_page_table_list_is_refused() -> None:
    pool = random_pool("fp16")
    q = np.ones((1, 2, 8), np.float32)
    pt = (np.array([0, 2]), [True, 2], np.array([4]))  # True would have been read as page 1
    assert_refused(pool, InvalidDTypeError, "kv_indices", K.paged_decode_attention, q, pool, 0, pt)


def test_a_list_mixing_numpy_and_python_integers_is_ranged_on_its_values() -> None:
    pool = random_pool("fp16")
    x = np.ones((2, 2, 8), np.float32)
    K.append_kv(pool, 0, [np.uint64(5), -1], x, x)  # NumPy reads this list as float64
    k, _ = pool.read_slots(0, [5])
    assert np.array_equal(k[0], x[0])
    limit = pool.num_pages * pool.page_size
    info = assert_refused(
        pool, InvalidArgumentError, "slot_mapping", K.append_kv, pool, 0, [np.uint64(limit), -1], x, x
    )
    assert str(info.value).endswith(f"got {limit}")
    info = assert_refused(
        pool, InvalidArgumentError, "slot_mapping", K.append_kv, pool, 0, [np.uint64(5), -2], x, x
    )
    assert str(info.value).endswith("got -2")


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([np.uint64(2**63 + 5), np.int8(-3)], None),  # out of int64: refused with the real value
        ([np.uint64(7), np.int64(-1), 3], [7, -1, 3]),
        ([np.array(4), 2], [4, 2]),  # a 0-d array inside a list, as NumPy reads it
        ([[1, np.uint32(2)], (3, 4)], [[1, 2], [3, 4]]),
    ],
)
def test_index_lists_are_exact(values: list[Any], want: list[Any] | None) -> None:
    trailing = (2,) if isinstance(values[0], list) else ()
    if want is None:
        with pytest.raises(InvalidPageError, match=str(2**63 + 5)):
            index_array(values, "ids", dtype=np.int64, trailing=trailing, error=InvalidPageError)
        return
    got = index_array(values, "ids", dtype=np.int64, low=-1, trailing=trailing)
    assert got.dtype == np.int64 and got.flags.c_contiguous and got.tolist() == want


@pytest.mark.parametrize("bad", [[1.0, 2], [1, "2"], [1, None], [[1, 2], [3]]])
def test_index_lists_of_non_integers_are_refused(bad: list[Any]) -> None:
    with pytest.raises(InvalidDTypeError, match="ids"):
        index_array(bad, "ids", dtype=np.int64)
