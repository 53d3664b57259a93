"""PageAllocator: the Python API, and every bad input raising the right class while changing nothing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from kv_helpers import other_thread_steps_during

import kvcore
from kvcore import (
    DoubleFreeError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidPageError,
    KVCoreError,
    PageAllocator,
)


def snapshot(alloc: PageAllocator) -> tuple[int, list[int]]:
    """Everything observable: the free count and every page's count."""
    return alloc.num_free, [alloc.ref_count(p) for p in range(1, alloc.num_pages)]


def test_fresh_pool() -> None:
    alloc = PageAllocator(10, num_shards=1)
    assert alloc.num_pages == 10
    assert alloc.num_free == 9
    pages = alloc.allocate(3)
    assert pages is not None
    assert pages.dtype == np.int32 and pages.ndim == 1
    assert pages.tolist() == [1, 2, 3]
    assert [alloc.ref_count(int(p)) for p in pages] == [1, 1, 1]
    assert alloc.num_free == 6
    assert "PageAllocator(num_pages=10" in repr(alloc)


def test_allocate_is_all_or_nothing_and_none_when_short() -> None:
    alloc = PageAllocator(6)
    held = alloc.allocate(4)
    assert held is not None
    before = snapshot(alloc)
    assert alloc.allocate(2) is None
    assert snapshot(alloc) == before
    one = alloc.allocate(1)
    assert one is not None and one[0] not in held
    empty = alloc.allocate(0)
    assert empty is not None and empty.size == 0


def test_retain_and_free_share_pages() -> None:
    alloc = PageAllocator(8)
    pages = alloc.allocate(2)
    assert pages is not None
    alloc.retain(pages)
    alloc.retain([int(pages[0])])
    assert alloc.ref_count(int(pages[0])) == 3
    alloc.free(pages)
    assert alloc.num_free == 5  # both still referenced
    alloc.free(np.array([pages[0], pages[0], pages[1]], dtype=np.int32))
    assert alloc.num_free == 7
    assert alloc.ref_count(int(pages[0])) == 0


def test_views_and_tuples_are_accepted() -> None:
    alloc = PageAllocator(8)
    pages = alloc.allocate(4)
    assert pages is not None
    alloc.free(pages[:2])  # a contiguous slice of an int32 array: no copy needed
    alloc.free(tuple(int(p) for p in pages[2:]))
    assert alloc.num_free == 7


def test_errors_are_one_hierarchy() -> None:
    for cls, builtin in [
        (InvalidArgumentError, ValueError),
        (InvalidPageError, ValueError),
        (DoubleFreeError, InvalidPageError),
        (InvalidDTypeError, TypeError),
        (kvcore.UnknownSequenceError, KeyError),
        (kvcore.DuplicateSequenceError, ValueError),
    ]:
        assert issubclass(cls, KVCoreError) and issubclass(cls, builtin)


BAD_ALLOCATE = [
    (-1, InvalidArgumentError),
    (8, InvalidArgumentError),  # more than num_pages - 1 can never succeed
    (2**40, InvalidArgumentError),
    (1.5, InvalidDTypeError),
    ("2", InvalidDTypeError),
]


@pytest.mark.parametrize(("n", "error"), BAD_ALLOCATE)
def test_bad_allocate(n: object, error: type[Exception]) -> None:
    alloc = PageAllocator(8)
    alloc.allocate(2)
    before = snapshot(alloc)
    with pytest.raises(error):
        alloc.allocate(n)  # type: ignore[arg-type]
    assert snapshot(alloc) == before


def _bad_page_batches(held: np.ndarray) -> list[tuple[object, type[Exception]]]:
    a, b, shared = int(held[0]), int(held[1]), int(held[2])  # shared has 2 references
    return [
        ([a, 0], InvalidPageError),  # the null page
        ([a, 8], InvalidPageError),  # out of range
        ([a, -1], InvalidPageError),
        ([a, 7], DoubleFreeError),  # a free page
        ([b, a, a], DoubleFreeError),  # listed twice with one reference
        ([shared, shared, shared], DoubleFreeError),  # three times with two
        (np.array([a, b], dtype=np.int64), InvalidDTypeError),
        (np.array([[a, b]], dtype=np.int32), InvalidDTypeError),
        (np.array([a, b, shared, b], dtype=np.int32)[::2], InvalidDTypeError),  # not contiguous
        (np.array([1.0, 2.0]), InvalidDTypeError),
        ([1.5], InvalidDTypeError),
        ([a, 2**40], InvalidDTypeError),
        ("12", InvalidDTypeError),
        (a, InvalidDTypeError),
        (None, InvalidDTypeError),
    ]


@pytest.mark.parametrize("case", range(15))
@pytest.mark.parametrize("op", ["free", "retain"])
def test_bad_batches_raise_and_change_nothing(case: int, op: str) -> None:
    alloc = PageAllocator(8)
    held = alloc.allocate(3)
    assert held is not None
    alloc.retain([int(held[2])])
    batch, error = _bad_page_batches(held)[case]
    if op == "retain" and error is DoubleFreeError and case != 3:
        pytest.skip("duplicates are legal for retain")
    before = snapshot(alloc)
    with pytest.raises(error) as info:
        getattr(alloc, op)(batch)
    assert str(info.value)  # a message, not an empty exception
    assert snapshot(alloc) == before


@pytest.mark.parametrize("page", [0, -1, 8, 2**40])
def test_ref_count_of_bad_page(page: int) -> None:
    alloc = PageAllocator(8)
    with pytest.raises(InvalidPageError):
        alloc.ref_count(page)


@pytest.mark.parametrize("num_pages", [0, -3, 2**31])
def test_bad_pool_sizes(num_pages: int) -> None:
    with pytest.raises(InvalidArgumentError):
        PageAllocator(num_pages)


def test_large_batches_release_the_interpreter() -> None:
    """The detached path (>= 4096 pages) behaves exactly like the attached one."""
    alloc = PageAllocator(20_001)
    pages = alloc.allocate(10_000)
    assert pages is not None and len(np.unique(pages)) == 10_000
    alloc.retain(pages)
    alloc.free(pages)
    alloc.free(pages)
    assert alloc.num_free == 20_000


@pytest.mark.skipif(
    not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="free-threaded Python has no interpreter lock"
)
def test_large_batches_really_release_the_interpreter() -> None:
    alloc = PageAllocator(2_000_001)

    def big_round_trip() -> None:
        pages = alloc.allocate(2_000_000)  # detached: >= 4096 pages
        assert pages is not None
        alloc.free(pages)

    def small_round_trip() -> None:
        for _ in range(200):
            pages = alloc.allocate(4_000)  # attached: below the threshold
            assert pages is not None
            alloc.free(pages)

    # A spinner step takes about a microsecond: a detached call of milliseconds lets it take
    # hundreds; attached calls none (at most a stray step or two if the interpreter switches
    # threads on its own anyway). The control is what makes the check able to fail.
    assert max(other_thread_steps_during(small_round_trip) for _ in range(3)) < 10
    assert max(other_thread_steps_during(big_round_trip) for _ in range(5)) >= 10
    assert alloc.num_free == 2_000_000


def test_misaligned_arrays_are_refused() -> None:
    alloc = PageAllocator(8)
    pages = alloc.allocate(2)
    assert pages is not None
    raw = np.zeros(4 * 2 + 1, dtype=np.uint8)
    misaligned = raw[1:].view(np.int32)  # a valid int32 array whose data is not 4-byte aligned
    misaligned[:] = pages
    before = snapshot(alloc)
    with pytest.raises(InvalidDTypeError):
        alloc.free(misaligned)
    assert snapshot(alloc) == before


def test_large_batches_are_read_from_a_copy() -> None:
    """Ids of a detached (large) call are copied first: changing the array afterwards is harmless."""
    alloc = PageAllocator(20_001)
    pages = alloc.allocate(5_000)
    assert pages is not None
    batch = pages.copy()
    alloc.free(batch)
    batch[:] = 1  # mutating the caller's array after the call changes nothing
    assert alloc.num_free == 20_000
