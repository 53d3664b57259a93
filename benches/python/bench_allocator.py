"""pytest-benchmark of the Python-facing allocator.

Run: ``.venv/bin/python -m pytest benches/python/bench_allocator.py --benchmark-columns=median,mean,ops``

``bench_alloc_free_1`` and ``bench_alloc_free_256`` time one ``allocate(n)`` + ``free`` round trip
(targets: 0.6 µs and 1.5 µs median). ``bench_pure_python_free_list_256`` is the same round trip on a
bare Python list, the floor of the project's targets, measured in the same run. ``bench_contention_*``: T
threads each do 2,000 ``allocate(1)`` + ``free`` pairs on one allocator; the figure is the wall time
of the whole batch.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvcore import PageAllocator

POOL = 10_001


def test_bench_alloc_free_1(benchmark: Any) -> None:
    alloc = PageAllocator(POOL)

    def round_trip() -> None:
        alloc.free(alloc.allocate(1))

    benchmark(round_trip)
    assert alloc.num_free == POOL - 1


def test_bench_alloc_free_256(benchmark: Any) -> None:
    alloc = PageAllocator(POOL)

    def round_trip() -> None:
        alloc.free(alloc.allocate(256))

    benchmark(round_trip)
    assert alloc.num_free == POOL - 1


def test_bench_pure_python_free_list_256(benchmark: Any) -> None:
    free = list(range(1, POOL))

    def round_trip() -> None:
        taken = free[-256:]
        del free[-256:]
        free.extend(taken)

    benchmark(round_trip)


PAIRS_PER_THREAD = 2_000


@pytest.mark.parametrize("num_threads", [1, 2, 4])
def test_bench_contention(benchmark: Any, num_threads: int) -> None:
    alloc = PageAllocator(POOL)

    def run() -> None:
        def worker() -> None:
            allocate, free = alloc.allocate, alloc.free
            for _ in range(PAIRS_PER_THREAD):
                free(allocate(1))

        threads = [threading.Thread(target=worker) for _ in range(num_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    benchmark.pedantic(run, rounds=10, iterations=1)
    benchmark.extra_info["pairs"] = num_threads * PAIRS_PER_THREAD
    assert alloc.num_free == POOL - 1
