"""``kvcore demo``: a live engine under a burst, on the CPU, in seconds.

The tiny random-weight decoder (:mod:`kvcore.tiny`, NumPy; its pool and kernels on CuPy when a GPU
answers, else the NumPy references) serves
a burst of chat requests that share a system prompt, through the whole stack:
:class:`~kvcore.scheduler.Scheduler` (continuous batching, chunked prefill, admission that predicts
demand), the :class:`~kvcore.scheduler.PressureController` (it sheds load with 503s when the queue
passes its target), preemption by swap to a host tier (``kvcore.tiers.HostTier`` + ``Mover``) or by
recompute, prefix hits, copy-on-write. A live table shows running / queued / refused / usage; the
summary checks a sample of the answers against a no-cache run of the same model, token for token.

``kvcore demo --allocator`` runs the older demonstration of the lock-free allocator alone: several
threads share one :class:`~kvcore.PageAllocator`, admit, fork and free, and every page must come back.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore import PageAllocator

_MAX_THREADS = 1024  # a demo of sharing, not of the OS thread limit
# The defaults, one place for the run and its --help.
ENGINE_REQUESTS = 400  # the burst
ENGINE_PAGES = 65  # page 0 included: 64 usable pages
ALLOCATOR_REQUESTS = 20_000  # per thread
ALLOCATOR_PAGES = 20_001


@dataclass
class WorkerStats:
    requests: int = 0  # requests admitted (pages allocated)
    refused: int = 0  # requests that found too few free pages (allocate returned None)
    too_long: int = 0  # requests needing more pages than the whole pool has (never admissible)
    shared: int = 0  # pages shared with a fork (retain)
    pages: int = 0  # pages allocated in total
    error: str | None = None  # what stopped the worker early, if anything (the summary reports it)


def _worker(alloc: PageAllocator, seed: int, num_requests: int, page_size: int, out: WorkerStats) -> None:
    try:
        _serve(alloc, seed, num_requests, page_size, out)
    except Exception as exc:  # reported in the summary (and the exit status), not as a thread traceback
        out.error = f"{type(exc).__name__}: {exc}"


def _serve(alloc: PageAllocator, seed: int, num_requests: int, page_size: int, out: WorkerStats) -> None:
    rng = random.Random(seed)
    usable = alloc.num_pages - 1
    running: list[npt.NDArray[np.int32]] = []
    for _ in range(num_requests):
        prompt_len = rng.randint(1, 4096)
        need = -(-prompt_len // page_size)
        # allocate() refuses a count above the usable pages (it could never succeed): such a request
        # is refused here, as a server refuses a prompt longer than its cache.
        pages = alloc.allocate(need) if need <= usable else None
        if need > usable:
            out.too_long += 1
        elif pages is None:
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


def run_allocator_demo(num_threads: int, num_requests: int, num_pages: int, page_size: int) -> int:
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
        too_long=sum(s.too_long for s in stats),
        shared=sum(s.shared for s in stats),
        pages=sum(s.pages for s in stats),
    )
    errors = [f"thread {i}: {s.error}" for i, s in enumerate(stats) if s.error is not None]
    leaked = alloc.num_pages - 1 - alloc.num_free
    print(f"kvcore demo: {num_threads} threads share one lock-free PageAllocator")
    usable = alloc.num_pages - 1
    print(f"  pool            {usable:>12,} usable pages of {page_size} tokens ({alloc.num_shards} shards)")
    too_long = f", {total.too_long:,} refused (longer than the whole pool)" if total.too_long else ""
    print(
        f"  requests        {total.requests:>12,} admitted, {total.refused:,} refused (pool full){too_long}"
    )
    print(f"  pages           {total.pages:>12,} allocated, {total.shared:,} shared by forks")
    print(f"  throughput      {total.pages / elapsed:>12,.0f} pages/s allocated and freed ({elapsed:.2f} s)")
    print(f"  pages returned  {alloc.num_free:>12,} / {usable:,} free at the end, {leaked} leaked")
    for error in errors:
        print(f"  FAILED          {error}")
    return 0 if leaked == 0 and not errors else 1


def _live_line(t: float, sched: Any, m: Any, refused: int, served: int) -> str:
    s = sched.stats()
    st = m.stats()
    return (
        f"  {t:5.1f} s  running {s.num_running:>3}  queued {s.num_waiting:>3}  loading {s.num_loading:>2}  "
        f"served {served:>4}  refused {refused:>3}  usage {st.usage:>4.0%}  hit {st.hit_rate:>4.0%}  "
        f"preempted {s.num_preemptions:>3}  level {s.level}"
    )


def run_engine_demo(
    num_requests: int, num_pages: int, page_size: int, seed: int, live: bool | None, check: int = 6
) -> int:
    """The live engine demo (module docstring); returns 0 when the checked answers match."""
    import sys

    from kvcore import KVCacheManager
    from kvcore.exceptions import RequestRejected
    from kvcore.scheduler import PressureConfig, PressureController, Request, Scheduler, SwapCost
    from kvcore.tiers import HostTier, Mover
    from kvcore.tiny import TinyDecoder, TinyEngine

    out = sys.stdout
    live = out.isatty() if live is None else live
    rng = np.random.default_rng(seed)
    model = TinyDecoder(seed, "fp16")
    vocab = model.config.vocab
    pool = TinyEngine.make_pool(model, num_pages, page_size, backend="auto")  # CuPy when a GPU answers
    host = HostTier(pool, num_pages * 2)
    cache = KVCacheManager(num_pages, page_size, lower_tiers=[host])
    mover = Mover(cache, pool, [host])
    engine = TinyEngine(model, pool, mover)
    controller = PressureController(
        PressureConfig(queue_wait_high_s=1.5, queue_wait_low_s=0.3, escalate_after_s=0.2, relax_after_s=1.0)
    )
    page_bytes = (
        2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim * 2 * page_size
    )
    sched = Scheduler(
        cache,
        max_num_batched_tokens=256,
        max_num_seqs=32,
        max_queue_wait_s=5.0,
        controller=controller,
        swap=SwapCost(page_bytes=page_bytes, prefill_tokens_per_s=5e3, bandwidth_gbps=1.0),
        target_preemption_prob=0.2,
    )
    system = rng.integers(0, vocab, 3 * page_size).tolist()  # shared by every request: prefix hits
    prompts = [
        system + rng.integers(0, vocab, int(rng.integers(4, 40))).tolist() for _ in range(num_requests)
    ]
    # Chat-like answers: most short, one in six long (the ones that outgrow the admission's plan).
    max_new = [
        int(rng.integers(120, 240)) if rng.random() < 1 / 6 else int(rng.integers(8, 32)) for _ in prompts
    ]
    # A burst: half the requests at once, the rest over the next two seconds.
    arrivals = sorted(
        [0.0] * (num_requests // 2) + rng.uniform(0, 2.0, num_requests - num_requests // 2).tolist()
    )
    outputs: dict[int, list[int]] = {i: [] for i in range(num_requests)}
    served: list[int] = []
    refused: dict[int, int] = {}  # HTTP status -> count
    print(
        f"kvcore demo: {num_requests} requests (a burst) on a {model.config.num_layers}-layer tiny decoder, "
        f"{num_pages - 1} pages of {page_size} tokens, host tier {host.num_slots} slots, "
        f"pool on {'CuPy (CUDA kernels)' if pool.backend.name == 'cupy' else 'NumPy (reference kernels)'}",
        file=out,
    )
    start = time.perf_counter()
    nxt = 0
    last_draw = -1.0
    while nxt < num_requests or sched.has_work():
        now = time.perf_counter() - start
        while nxt < num_requests and arrivals[nxt] <= now:
            try:
                sched.submit(Request(nxt, prompts[nxt], max_new_tokens=max_new[nxt]), now)
            except RequestRejected as e:
                refused[e.http_status] = refused.get(e.http_status, 0) + 1
            nxt += 1
        if not sched.has_work():
            time.sleep(min(0.01, max(0.0, arrivals[nxt] - now)) if nxt < num_requests else 0)
            continue
        plan = sched.step(now)
        for rej in plan.rejected:
            refused[rej.http_status] = refused.get(rej.http_status, 0) + 1
        for rid, _ in plan.finished:
            refused[503] = refused.get(503, 0) + 1
            outputs.pop(rid, None)
        tokens = engine.forward(plan)
        for rid, tok in tokens.items():
            outputs[rid].append(tok)
        for rid, reason in sched.update(plan, tokens):
            if reason in ("length", "stop"):
                served.append(rid)
        if live and now - last_draw >= 0.1:
            last_draw = now
            print(
                "\r" + _live_line(now, sched, cache, sum(refused.values()), len(served)),
                end="",
                file=out,
                flush=True,
            )
        elif not live and now - last_draw >= 1.0:
            last_draw = now
            print(_live_line(now, sched, cache, sum(refused.values()), len(served)), file=out)
    elapsed = time.perf_counter() - start
    if live:
        print("\r" + _live_line(elapsed, sched, cache, sum(refused.values()), len(served)), file=out)
    s = sched.stats()
    st = cache.stats()
    generated = s.generated_tokens
    print(
        f"  served          {len(served):>6} of {num_requests} "
        f"({generated:,} tokens, {generated / elapsed:,.0f} tokens/s)",
        file=out,
    )
    print(
        "  refused         "
        + (", ".join(f"{n} x HTTP {code}" for code, n in sorted(refused.items())) or "none")
        + f" (reasons: {dict(sorted(s.rejected_by_reason.items())) or '-'})",
        file=out,
    )
    print(
        f"  preemptions     {s.preemptions_by_kind['swap']:>6} swap, {s.preemptions_by_kind['recompute']} "
        f"recompute; preemption tax {s.preemption_tax:.1%}",
        file=out,
    )
    print(
        f"  prefix hits     {st.hit_rate:>6.0%} of prompt tokens; host tier loaded "
        f"{cache.tier_stats()['host']['num_loaded_pages']} pages",
        file=out,
    )
    print(f"  pressure        {controller.counts or 'no response needed'}", file=out)
    if len(served) + sum(refused.values()) != num_requests:
        print(f"  LOST REQUESTS: {num_requests - len(served) - sum(refused.values())}", file=out)
        return 1
    sample = rng.choice(served, size=min(check, len(served)), replace=False).tolist() if served else []
    check_start = time.perf_counter()
    bad = [i for i in sample if not _equals_no_cache_run(model, prompts[i], outputs[i], max_new[i])]
    checked_s = time.perf_counter() - check_start
    print(
        f"  checked         {len(sample) - len(bad)}/{len(sample)} answers equal a no-cache run, "
        f"token for token (served in {elapsed:.1f} s, checked in {checked_s:.1f} s)",
        file=out,
    )
    leaked = st.num_pages_in_use
    if leaked:
        print(f"  LEAKED PAGES: {leaked}", file=out)
    return 0 if not bad and not leaked else 1


def _equals_no_cache_run(model: Any, prompt: list[int], output: list[int], max_new_tokens: int) -> bool:
    """Whether ``output`` is the greedy answer of a no-cache run (``generate_no_cache``), checked in one
    forward pass over ``prompt + output`` from scratch instead of one per generated token.

    The same thing, in O(T) layer passes instead of O(T) per token: attention is causal, so the logits
    at position ``i`` of one pass over the whole sequence are those of a pass over its first ``i + 1``
    tokens; ``output`` is the greedy answer exactly when each of its tokens is the argmax of the logits
    at the position before it.
    """
    if len(output) != max_new_tokens:
        return False
    if not output:
        return True
    logits = model.no_cache_all_logits([*prompt, *output[:-1]], last=len(output))
    greedy = np.argmax(logits, axis=-1)
    return bool(greedy.tolist() == output)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvcore.cli import int_arg

    parser = subparsers.add_parser(
        "demo", help="a live engine (tiny model, scheduler, pressure control, swap) under a burst"
    )
    parser.add_argument(
        "--allocator",
        action="store_true",
        help="the lock-free allocator alone: threads allocating and freeing",
    )
    parser.add_argument(
        "--requests",
        type=int_arg(1),
        default=None,
        help=f"requests (default {ENGINE_REQUESTS}; --allocator: per thread, {ALLOCATOR_REQUESTS:,})",
    )
    parser.add_argument(
        "--num-pages",
        type=int_arg(2),
        default=None,
        help=f"pages of the pool, page 0 included (default {ENGINE_PAGES}, {ENGINE_PAGES - 1} usable; "
        f"--allocator {ALLOCATOR_PAGES:,})",
    )
    parser.add_argument(
        "--page-size", type=int_arg(1), default=16, help="tokens per page (default %(default)s)"
    )
    parser.add_argument("--seed", type=int_arg(0), default=0, help="random seed (default %(default)s)")
    parser.add_argument(
        "--threads",
        type=int_arg(1, _MAX_THREADS),
        default=4,
        help="--allocator: threads (default %(default)s)",
    )
    live = parser.add_mutually_exclusive_group()
    live.add_argument(
        "--live", dest="live", action="store_true", default=None, help="redraw the table in place"
    )
    live.add_argument("--no-live", dest="live", action="store_false", help="print a line a second instead")
    parser.set_defaults(func=_run)


def _run(a: argparse.Namespace) -> int:
    if a.allocator:
        pages = a.num_pages or ALLOCATOR_PAGES
        return run_allocator_demo(a.threads, a.requests or ALLOCATOR_REQUESTS, pages, a.page_size)
    return run_engine_demo(
        a.requests or ENGINE_REQUESTS, a.num_pages or ENGINE_PAGES, a.page_size, a.seed, a.live
    )
