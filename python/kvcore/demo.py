"""``kvcore demo``: a short, honest demonstration of what kvcore does today.

Several threads share one lock-free :class:`~kvcore.PageAllocator`: each admits "requests" (allocates
their pages), shares some pages with a forked sibling (``retain``), and frees them when the request
finishes. At the end every page must be back, and the demo prints the counts and the throughput.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcore import PageAllocator

_MAX_THREADS = 1024  # a demo of sharing, not of the OS thread limit


@dataclass
class WorkerStats:
    requests: int = 0  # requests admitted (pages allocated)
    refused: int = 0  # requests that found too few free pages (allocate returned None)
    shared: int = 0  # pages shared with a fork (retain)
    pages: int = 0  # pages allocated in total


def _worker(alloc: PageAllocator, seed: int, num_requests: int, page_size: int, out: WorkerStats) -> None:
    rng = random.Random(seed)
    running: list[npt.NDArray[np.int32]] = []
    for _ in range(num_requests):
        prompt_len = rng.randint(1, 4096)
        pages = alloc.allocate(-(-prompt_len // page_size))
        if pages is None:
            out.refused += 1
        else:
            out.requests += 1
            out.pages += len(pages)
            if rng.random() < 0.25:  # a fork (parallel sampling) shares every page
                alloc.retain(pages)
                out.shared += len(pages)
                running.append(pages)
            running.append(pages)
        while len(running) > 8 or (running and rng.random() < 0.5):
            alloc.free(running.pop(rng.randrange(len(running))))
    for pages in running:
        alloc.free(pages)


def run_demo(num_threads: int, num_requests: int, num_pages: int, page_size: int) -> int:
    alloc = PageAllocator(num_pages)
    stats = [WorkerStats() for _ in range(num_threads)]
    threads = [
        threading.Thread(target=_worker, args=(alloc, t, num_requests, page_size, stats[t]))
        for t in range(num_threads)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    total = WorkerStats(
        requests=sum(s.requests for s in stats),
        refused=sum(s.refused for s in stats),
        shared=sum(s.shared for s in stats),
        pages=sum(s.pages for s in stats),
    )
    leaked = alloc.num_pages - 1 - alloc.num_free
    print(f"kvcore demo: {num_threads} threads share one lock-free PageAllocator")
    usable = alloc.num_pages - 1
    print(f"  pool            {usable:>12,} usable pages of {page_size} tokens ({alloc.num_shards} shards)")
    print(f"  requests        {total.requests:>12,} admitted, {total.refused:,} refused (pool full)")
    print(f"  pages           {total.pages:>12,} allocated, {total.shared:,} shared by forks")
    print(f"  throughput      {total.pages / elapsed:>12,.0f} pages/s allocated and freed ({elapsed:.2f} s)")
    print(f"  pages returned  {alloc.num_free:>12,} / {usable:,} free at the end, {leaked} leaked")
    return 0 if leaked == 0 else 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvcore.cli import int_arg

    parser = subparsers.add_parser("demo", help="threads allocating, sharing and freeing pages")
    parser.add_argument("--threads", type=int_arg(1, _MAX_THREADS), default=4, help="threads (default 4)")
    parser.add_argument("--requests", type=int_arg(0), default=20_000, help="requests per thread")
    parser.add_argument(
        "--num-pages", type=int_arg(2), default=20_001, help="pages of the pool, page 0 included"
    )
    parser.add_argument("--page-size", type=int_arg(1), default=16, help="tokens per page (default 16)")
    parser.set_defaults(
        func=lambda a: run_demo(a.threads, a.requests, a.num_pages, a.page_size),
    )
