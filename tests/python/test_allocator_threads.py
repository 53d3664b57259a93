"""Several Python threads allocate, share and free at once (the interpreter is released on large
batches, and the module is free-threading ready): no page is ever held twice, and every page returns."""

from __future__ import annotations

import random
import threading

import numpy as np

from kvcore import PageAllocator

NUM_THREADS = 4
OPS_PER_THREAD = 20_000


def test_threads_never_share_a_page_and_every_page_returns() -> None:
    alloc = PageAllocator(513)
    owner = np.full(513, -1, dtype=np.int64)  # page -> thread holding it (-1: nobody)
    owner_lock = threading.Lock()  # guards `owner` only; the allocator itself takes no lock
    errors: list[str] = []
    barrier = threading.Barrier(NUM_THREADS)

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        held: list[int] = []
        barrier.wait()
        for _ in range(OPS_PER_THREAD):
            n = rng.randrange(0, 9)
            if rng.random() < 0.6:
                pages = alloc.allocate(n)
                if pages is None:
                    continue
                ids = pages.tolist()
                with owner_lock:
                    clash = [p for p in ids if owner[p] != -1]
                    owner[ids] = tid
                if clash:
                    errors.append(f"thread {tid} got pages {clash} held by another thread")
                alloc.retain(pages)  # share, then drop the extra reference
                alloc.free(pages)
                held.extend(ids)
            else:
                k = min(n, len(held))
                gone, held[:] = held[:k], held[k:]
                with owner_lock:
                    owner[gone] = -1
                alloc.free(gone)
        with owner_lock:
            owner[held] = -1
        alloc.free(held)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(NUM_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert alloc.num_free == 512
    assert all(alloc.ref_count(p) == 0 for p in range(1, 513))


def test_big_batches_from_threads_balance() -> None:
    """Threads moving 5,000-page batches (detached from the interpreter) never lose a page."""
    alloc = PageAllocator(40_001)

    def worker() -> None:
        for _ in range(30):
            pages = alloc.allocate(5_000)
            if pages is not None:
                alloc.retain(pages)
                alloc.free(pages)
                alloc.free(pages)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert alloc.num_free == 40_000
