"""Hostile callers of KVCacheManager and PageAllocator: callbacks that mutate arguments,
stale copy-on-write pairs, forks of half-computed sequences, racing double frees, pools larger than
memory, namespaces that must not pile up, and arguments of every wrong type."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kvcore
from kvcore import (
    DoubleFreeError,
    InvalidArgumentError,
    InvalidDTypeError,
    KVCacheManager,
    KVCoreError,
    PageAllocator,
    UnknownSequenceError,
)
from kvcore._kvcore import RespClient
from kvcore.kernels import copy_pages
from kvcore.pool import KVPool


def run_python(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def state(m: KVCacheManager) -> tuple[object, ...]:
    pages = {sid: m.seq_pages(sid).tolist() for sid in sorted(m.seq_ids())}
    refs = [m.ref_count(p) for p in range(1, m.num_pages)]
    return m.stats().as_dict(), pages, refs, sorted(m.cached_pages().tolist()), m.num_namespaces()


# ----- 1. callbacks during a call ---------------------------------------------


def test_a_clock_that_resizes_the_prompt_cannot_crash_the_interpreter() -> None:
    r = run_python(
        """
        import numpy as np, kvcore
        n = 1 << 21  # 8 MiB: its own mapping, unmapped when the array moves
        t = np.arange(1, n + 1, dtype=np.int32)
        def clock():
            t.resize(4 * n, refcheck=False)   # frees the buffer a raw view would point into
            t[:] = 7
            return 1.0
        m = kvcore.KVCacheManager(n // 16 + 64, 16, clock=clock)
        assert m.add_sequence(1, t) == 0
        assert m.seq_len(1) == n
        m.append(1, t[:3]); m.pin(np.arange(1, 33, dtype=np.int32), 5.0)
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_a_clock_that_rewrites_the_prompt_cannot_smuggle_tokens_in(dtype: type) -> None:
    t = np.arange(1, 34, dtype=dtype)
    original = t.copy()

    def clock() -> float:
        t[:] = -1 if dtype != np.uint32 else 2**32 - 1
        return 1.0

    m = KVCacheManager(64, 4, clock=clock)
    assert m.add_sequence(1, t) == 0
    # What was validated is what got cached: the prompt as it was when the call began.
    assert m.peek_prefix_len(original.astype(np.int64)) == 32
    t[:] = original
    assert m.append(1, t[:2])
    m.free_sequence(1)
    assert m.peek_prefix_len(np.concatenate([original, original[:2]]).astype(np.int64)) == 32


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_a_clock_that_rewrites_appended_or_pinned_tokens_cannot_smuggle_them_in(dtype: type) -> None:
    """Page size 1: every appended token is cached at once, so a smuggled token would be seen."""
    bad = -1 if dtype != np.uint32 else 2**32 - 1
    armed: list[np.ndarray] = []  # the array the clock overwrites during the next call

    def clock() -> float:
        for a in armed:
            a[:] = bad
        return 1.0

    m = KVCacheManager(64, 1, clock=clock)
    assert m.add_sequence(1, [1, 2, 3, 4]) == 0
    new = np.array([7, 8], dtype=dtype)
    armed[:] = [new]
    assert m.append(1, new)
    armed.clear()
    assert m.peek_prefix_len(np.array([1, 2, 3, 4, 7, 8, 9])) == 6  # 7 and 8, as validated
    m.free_sequence(1)
    assert m.peek_prefix_len(np.array([1, 2, 3, 4, 7, 8, 9])) == 6
    pin = np.array([1, 2, 3, 4, 5], dtype=dtype)
    armed[:] = [pin]
    assert m.pin(pin, 100.0) == 4  # the cached prefix of [1..5] as given: 4 pages, never [bad...]
    armed.clear()
    assert m.stats().num_pages_pinned == 4


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_an_array_is_copied_exactly_at_every_offset_and_length(dtype: type) -> None:
    # Long arrays are read two ids per 8-byte load: an odd first id (a 4-byte-aligned view) and an
    # odd last one are read alone. Chained one-token page keys change from the first wrong token on.
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2**31 - 1, size=80).astype(dtype)
    for offset in range(3):
        for n in (0, 1, 15, 16, 17, 18, 33, 64, 65, 77):
            view = base[offset : offset + n]
            want = kvcore.page_keys(view.tolist(), 1)
            assert np.array_equal(kvcore.page_keys(view, 1), want), (offset, n)


@pytest.mark.parametrize("where", [0, 1, 40, 63, 64])
def test_a_negative_token_is_found_wherever_the_copy_reads_it(where: int) -> None:
    t = np.arange(1, 66, dtype=np.int32)
    t[where] = -3
    for offset in (0, 1):
        if where >= offset:
            with pytest.raises(InvalidArgumentError, match="non-negative"):
                kvcore.page_keys(t[offset:], 1)
        else:
            assert len(kvcore.page_keys(t[offset:], 1)) == 65 - offset


def test_page_ids_are_copied_exactly_from_an_odd_offset() -> None:
    a = PageAllocator(100)
    pages = a.allocate(65)
    assert pages is not None
    a.free(pages[1:])
    assert [a.ref_count(int(p)) for p in pages] == [1] + [0] * 64


def test_copying_a_huge_array_is_an_out_of_memory_error_not_an_abort() -> None:
    """The argument copy is allocated fallibly: a 1.6 GB prompt under a 3 GiB address-space limit
    (it fits once, not twice) raises OutOfMemoryError; the process lives on."""
    code = (
        "import resource, numpy as np, kvcore\n"
        "t = np.ones(400_000_000, dtype=np.int32)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "m = kvcore.KVCacheManager(64, 16)\n"
        "for call in (lambda: m.peek_prefix_len(t), lambda: m.add_sequence(1, t)):\n"
        "    try:\n"
        "        call()\n"
        "    except kvcore.OutOfMemoryError as e:\n"
        "        assert isinstance(e, MemoryError)\n"
        "        print('refused')\n"
        "print(len(m), m.stats().num_pages_free)\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["refused", "refused", "0 63"]


_HUGE_OUTPUTS = """
import resource, numpy as np, kvcore
m = kvcore.KVCacheManager(2**20 + 2, 1)
m.add_sequence(1, np.zeros(2**20, dtype=np.int32), cache_prompt=False)
big = [1] * 150_000_000  # 1.2 GB of references to one int
calls = {
    "block_table": lambda: m.block_table([1] * 50_000),  # [50,000, 2**20] int32: 200 GB
    "page_table": lambda: m.page_table([1] * 2000),  # 8 GB of kv_indices, a total under int32
    "batch_layout": lambda: m.batch_layout([1] * 1000, [0] * 1000, [2**20] * 1000),  # 4 + 8 + 4 GB
    "positions": lambda: m.positions([1] * 2000),  # 8 GB
    "list_arg": lambda: m.page_table(big),  # the list's copy
}
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
limit = vm + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
before = (len(m), m.stats().num_pages_free)
for name, call in calls.items():
    try:
        call()
        print(name, "returned")
    except kvcore.OutOfMemoryError:
        print(name, "refused")
    assert (len(m), m.stats().num_pages_free) == before
print(m.page_table([1]).kv_indices.shape[0], m.block_table([1]).shape)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc are Linux's")
def test_outputs_a_batch_makes_huge_are_out_of_memory_errors_not_aborts() -> None:
    """Repeated ids are allowed, so a batch's table, positions or slot mapping may be far larger than
    the manager: they were allocated with Rust's aborting allocator (block_table of 200 GB killed
    the process with SIGABRT, no limit needed), as was the copy of a long list argument."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _HUGE_OUTPUTS], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[:5] == [
        f"{n} refused" for n in ("block_table", "page_table", "batch_layout", "positions", "list_arg")
    ]
    assert lines[5] == f"{2**20} (1, {2**20})"


@pytest.mark.parametrize(
    "call",
    [
        lambda: KVCacheManager(8, 4).restore_tier("disk", None),
        lambda: KVCacheManager(8, 4).restore_tier("disk", 3),
        lambda: RespClient(None),
        lambda: RespClient("127.0.0.1:1"),
        lambda: RespClient(["127.0.0.1:1"], timeout_s=0.01).exists_many(None),
    ],
)
def test_a_non_iterable_argument_is_an_invalid_dtype_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidDTypeError):
        call()


# ----- 2. stale copy-on-write pairs -----------------------------------------------------------------


def assert_one_copy_batch(pairs: np.ndarray, num_pages: int) -> None:
    """The pairs are one valid copy_pages batch, as the NumPy kernel checks it."""
    pool = KVPool(num_layers=1, num_pages=num_pages, num_kv_heads=1, head_dim=8, page_size=4)
    copy_pages(pool, pairs)  # raises on a repeated destination or a destination that is a source


def test_a_freed_forks_copies_are_cancelled_and_never_reach_another_tenant() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7), namespace="A")
    m.fork(1, 2)
    assert m.append(2, [50])
    m.free_sequence(2)  # its queued copy is cancelled with it
    m.add_sequence(4, range(500, 503), namespace="B")
    m.fork(4, 5)
    assert m.append(5, [9])
    pairs = m.take_pending_copies()
    # Exactly B's own copy: sequence 4's partial page into sequence 5's new one.
    assert pairs.tolist() == [[int(m.seq_pages(4)[-1]), int(m.seq_pages(5)[-1])]]
    assert_one_copy_batch(pairs, 64)
    assert m.take_pending_copies().shape == (0, 2)


def test_a_fork_of_a_fork_resolves_the_chain_to_its_original_source() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7))
    original = int(m.seq_pages(1)[-1])
    m.fork(1, 2)
    assert m.append(2, [50])
    m.fork(2, 3)
    assert m.append(3, [60])
    pairs = m.take_pending_copies()
    dst2, dst3 = int(m.seq_pages(2)[-1]), int(m.seq_pages(3)[-1])
    # Applied in order, [[orig, dst2], [dst2, dst3]] reads dst2 before it is written; resolved:
    assert pairs.tolist() == [[original, dst2], [original, dst3]]
    assert_one_copy_batch(pairs, 64)


def test_a_queued_copy_holds_its_source_until_taken() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7))
    src = int(m.seq_pages(1)[-1])
    m.fork(1, 2)
    assert m.append(2, [50])
    m.free_sequence(1)  # the source's last owner: the page must not be reused before the copy
    assert m.ref_count(src) == 1
    assert src not in [
        int(p) for sid in (10, 11, 12) if m.add_sequence(sid, [sid] * 3) is not None for p in m.seq_pages(sid)
    ]
    assert m.take_pending_copies().tolist() == [[src, int(m.seq_pages(2)[-1])]]
    assert m.ref_count(src) == 0


def test_a_queued_copys_hold_does_not_make_its_source_shared() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7))
    m.fork(1, 2)
    assert m.append(2, [50])  # copies sequence 1's partial page
    page = int(m.seq_pages(1)[-1])
    assert m.append(1, [51])  # now its sole owner: it writes in place, no second copy
    assert int(m.seq_pages(1)[-1]) == page and m.stats().num_cow_copies == 1


def test_copies_of_an_evicted_destination_are_cancelled() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7))
    src = int(m.seq_pages(1)[-1])
    m.fork(1, 2)
    assert m.append(2, [50, 51])  # the copy fills its page: it is cached by the tree
    dst = int(m.seq_pages(2)[1])
    m.free_sequence(2)
    assert m.ref_count(dst) == 1 and dst in m.cached_pages().tolist()
    m.free_sequence(1)
    m.evict(100)
    assert m.ref_count(dst) == 0 and m.ref_count(src) == 0
    assert m.take_pending_copies().shape == (0, 2)
    s = m.stats()
    assert s.num_pages_free == s.num_pages_total


def test_a_refused_admission_does_not_refresh_its_matched_prefix() -> None:
    """The early refusal is exact: the admission's own matched prefix cannot make room for it, so a
    refused call never got to touch that prefix (its LRU position is as before)."""
    m = KVCacheManager(5, 4, "lru")  # 4 usable pages
    a, b = list(range(100, 108)), list(range(200, 208))
    for sid, prompt in ((1, a), (2, b)):
        m.add_sequence(sid, prompt)
        m.free_sequence(sid)
    assert m.stats().num_pages_cached == 4
    before = state(m)
    assert m.add_sequence(3, a + list(range(13))) is None  # 6 pages: a's 2 + 4 more than can be had
    after = state(m)
    assert after[0].pop("num_refused") == 1 and before[0].pop("num_refused") == 0  # type: ignore[attr-defined]
    assert after == before
    m.add_sequence(4, list(range(300, 308)))  # needs 2 pages: evicts the least recently used, a
    assert m.peek_prefix_len([*a, 0]) == 0 and m.peek_prefix_len([*b, 0]) == 8


# ----- 3. fork during chunked prefill ---------------------------------------------


def test_fork_refuses_a_parent_with_uncomputed_tokens_in_its_partial_page() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 7), cache_prompt=False)
    m.commit(1, 4)  # the full page is committed, tokens 4 and 5 (the partial page) are not
    before = state(m)
    with pytest.raises(InvalidArgumentError, match="commit"):
        m.fork(1, 2)
    assert state(m) == before
    m.commit(1, 6)
    m.fork(1, 2)
    assert m.seq_pages(2).tolist() == m.seq_pages(1).tolist()


def test_fork_refuses_appended_tokens_not_committed() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(1, 5), cache_prompt=False)
    m.commit(1, 4)
    assert m.append(1, [9])
    with pytest.raises(InvalidArgumentError):
        m.fork(1, 2)
    m.commit(1, 5)
    m.fork(1, 2)


# ----- 4. racing double frees ---------------------------------------------


@pytest.mark.parametrize("n", [1, 64, 50_000])
def test_of_two_racing_frees_of_a_batch_exactly_one_succeeds(n: int) -> None:
    alloc = PageAllocator(n + 1)
    for _ in range(30 if n > 1000 else 300):
        pages = alloc.allocate(n)
        assert pages is not None
        results: list[str] = []
        barrier = threading.Barrier(2)

        def free(
            pages: np.ndarray = pages, barrier: threading.Barrier = barrier, results: list[str] = results
        ) -> None:
            barrier.wait()
            try:
                alloc.free(pages)
                results.append("ok")
            except DoubleFreeError:
                results.append("raised")

        threads = [threading.Thread(target=free) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["ok", "raised"]
        # Every page came back exactly once: all free, each handed out once by the next allocation.
        assert alloc.num_free == n
        assert all(alloc.ref_count(int(p)) == 0 for p in pages[:: max(1, n // 64)])
    again = alloc.allocate(n)
    assert again is not None and len(np.unique(again)) == n and alloc.num_free == 0


def test_crossing_double_frees_never_both_succeed_and_leave_every_count_exact() -> None:
    """Two frees of one sole-owned batch, one of them listed backwards: they meet in the middle."""
    n = 200_000
    alloc = PageAllocator(n + 1)
    for _ in range(60):
        pages = alloc.allocate(n)
        assert pages is not None
        results: list[bool] = []
        barrier = threading.Barrier(2)

        def free(
            batch: np.ndarray, barrier: threading.Barrier = barrier, results: list[bool] = results
        ) -> None:
            barrier.wait()
            try:
                alloc.free(batch)
                results.append(True)
            except DoubleFreeError:
                results.append(False)

        threads = [threading.Thread(target=free, args=(b,)) for b in (pages, pages[::-1].copy())]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) <= 1, "both frees succeeded"
        counts = {alloc.ref_count(int(p)) for p in pages}
        if True in results:
            assert counts == {0} and alloc.num_free == n
        else:  # both raised: each gave back what it took, so the pages are held once, as before
            assert counts == {1} and alloc.num_free == 0
            alloc.free(pages)
    again = alloc.allocate(n)
    assert again is not None and len(np.unique(again)) == n


# ----- 5. out of memory ---------------------------------------------


@pytest.mark.parametrize(
    "construct",
    ["kvcore.PageAllocator(10**9)", "kvcore.KVCacheManager(2_000_000_000, 16)"],
)
def test_a_pool_larger_than_the_address_space_raises_memory_error(construct: str) -> None:
    r = run_python(
        f"""
        import resource
        import kvcore
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            {construct}
        except kvcore.OutOfMemoryError as e:
            assert isinstance(e, MemoryError) and isinstance(e, kvcore.KVCoreError)
            print("refused:", e)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("refused: cannot allocate")


# ----- 6. namespaces ---------------------------------------------


def test_namespaces_that_hold_nothing_cost_nothing() -> None:
    m = KVCacheManager(256, 4)
    for i in range(20_000):
        ns = f"{i:0200d}"
        assert m.add_sequence(1, [1, 2, 3], namespace=ns) == 0  # no full page: nothing cached
        m.free_sequence(1)
    assert m.num_namespaces() == 0


def test_fresh_namespaces_do_not_grow_memory() -> None:
    """100k admissions under fresh 200-character namespaces (per-request cache salts): the resident
    memory does not grow (it grew by 25 MiB when every name was kept forever)."""
    r = run_python(
        """
        import kvcore

        def rss_kib():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4

        m = kvcore.KVCacheManager(256, 4)
        def cycles(start, n):
            for i in range(start, start + n):
                m.add_sequence(1, [1, 2, 3, 4, 5], namespace=f"{i:0200d}")
                m.free_sequence(1)
                m.evict(1)
        cycles(0, 20_000)  # warm up the allocator's and the maps' steady state
        before = rss_kib()
        cycles(20_000, 100_000)
        print(rss_kib() - before, getattr(m, "num_namespaces", lambda: -1)())
        """,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    growth_kib, live = map(int, r.stdout.split())
    assert growth_kib < 2048, f"resident memory grew by {growth_kib} KiB"
    assert 0 <= live <= 1


def test_refused_calls_intern_nothing() -> None:
    m = KVCacheManager(3, 4)  # 2 usable pages
    assert m.add_sequence(1, range(100), namespace="too-long") is None
    assert m.pin(range(8), 10.0, namespace="never-used") == 0
    assert m.unpin(range(8), namespace="never-used") == 0
    assert m.peek_prefix_len(range(8), namespace="never-used") == 0
    assert m.num_namespaces() == 0


def test_a_namespace_lives_while_it_caches_and_is_forgotten_after_eviction() -> None:
    m = KVCacheManager(64, 4)
    m.add_sequence(1, range(9), namespace="tenant")
    m.fork(1, 2)
    m.free_sequence(1)
    assert m.num_namespaces() == 1
    m.free_sequence(2)
    assert m.num_namespaces() == 1  # its pages are cached: the name must still map to them
    assert m.peek_prefix_len(range(9), namespace="tenant") == 8
    assert m.peek_prefix_len(range(9), namespace="other") == 0
    m.evict(100)
    assert m.num_namespaces() == 0
    # A new tenant of the same name starts empty and never aliases another namespace.
    m.add_sequence(3, range(9), namespace="other")
    m.free_sequence(3)
    assert m.peek_prefix_len(range(9), namespace="tenant") == 0
    assert m.peek_prefix_len(range(9), namespace="other") == 8


# ----- 7. arguments of the wrong type ---------------------------------------------

A = np.zeros(4, dtype=np.int32)

BAD_CALLS: list[tuple[str, object, type[Exception], str]] = [
    ("add_sequence", lambda m: m.add_sequence(None, [1]), InvalidDTypeError, "seq_id"),
    ("add_sequence", lambda m: m.add_sequence(2**63, [1]), InvalidArgumentError, "seq_id"),
    ("add_sequence", lambda m: m.add_sequence(True, [1]), InvalidDTypeError, "seq_id"),
    ("add_sequence", lambda m: m.add_sequence(1.5, [1]), InvalidDTypeError, "seq_id"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], priority=2**31), InvalidArgumentError, "priority"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], priority="high"), InvalidDTypeError, "priority"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], namespace=5), InvalidDTypeError, "namespace"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], namespace="\ud800"), InvalidArgumentError, "namespace"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], cache_prompt="no"), InvalidDTypeError, "cache_prompt"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], cache_prompt=None), InvalidDTypeError, "cache_prompt"),
    ("add_sequence", lambda m: m.add_sequence(9, [1], priority=None), InvalidDTypeError, "priority"),
    ("add_sequence", lambda m: m.add_sequence(9, [True, 2]), InvalidDTypeError, "token"),
    ("add_sequence", lambda m: m.add_sequence(9, None), InvalidDTypeError, "token"),
    ("append", lambda m: m.append("1", [1]), InvalidDTypeError, "seq_id"),
    ("append", lambda m: m.append(1, [2**40]), InvalidDTypeError, "token"),
    ("commit", lambda m: m.commit(1, True), InvalidDTypeError, "num_tokens"),
    ("commit", lambda m: m.commit(1, 2**70), InvalidArgumentError, "num_tokens"),
    ("fork", lambda m: m.fork(1, None), InvalidDTypeError, "child_id"),
    ("fork", lambda m: m.fork([1], 2), InvalidDTypeError, "parent_id"),
    ("free_sequence", lambda m: m.free_sequence(None), InvalidDTypeError, "seq_id"),
    ("page_table", lambda m: m.page_table(None), InvalidDTypeError, "seq_ids"),
    ("page_table", lambda m: m.page_table("1"), InvalidDTypeError, "seq_ids"),
    ("page_table", lambda m: m.page_table([1, None]), InvalidDTypeError, "seq_ids[1]"),
    ("page_table", lambda m: m.page_table([1], out=(A, A)), InvalidDTypeError, "out"),
    ("page_table", lambda m: m.page_table([1], out=5), InvalidDTypeError, "out"),
    ("page_table", lambda m: m.page_table([1], out=(A, A, A.astype(np.int64))), InvalidDTypeError, "out"),
    ("page_table", lambda m: m.page_table([1], num_tokens="3"), InvalidDTypeError, "num_tokens"),
    ("page_table", lambda m: m.page_table([1], num_tokens=[1.5]), InvalidDTypeError, "num_tokens[0]"),
    ("page_table", lambda m: m.page_table([1], num_tokens=[-1]), InvalidArgumentError, "num_tokens[0]"),
    ("page_table", lambda m: m.page_table([1], num_tokens=[7]), InvalidArgumentError, "num_tokens[0]"),
    (
        "page_table",
        lambda m: m.page_table([1], num_tokens=np.array([-1], np.int64)),
        InvalidArgumentError,
        "num_tokens[0]",
    ),
    (
        "page_table",
        lambda m: m.page_table([1], num_tokens=np.array([-1], np.int32)),
        InvalidArgumentError,
        "num_tokens[0]",
    ),
    ("page_table", lambda m: m.page_table(np.array([1, 99], np.int64)), UnknownSequenceError, "99"),
    ("page_table", lambda m: m.page_table(np.array([[1]], np.int64)), InvalidDTypeError, "seq_ids"),
    ("page_table", lambda m: m.page_table(np.array([1.0])), InvalidDTypeError, "seq_ids"),
    ("block_table", lambda m: m.block_table([1], out=np.zeros((2, 4))), InvalidDTypeError, "out"),
    ("block_table", lambda m: m.block_table([1], out=np.zeros(8, np.int32)), InvalidDTypeError, "out"),
    (
        "block_table",
        lambda m: m.block_table([1], out=np.zeros((2, 1), np.int32)),
        InvalidArgumentError,
        "block",
    ),
    ("block_table", lambda m: m.block_table(None), InvalidDTypeError, "seq_ids"),
    ("slot_mapping", lambda m: m.slot_mapping(1, 1, start=-1), InvalidArgumentError, "start"),
    ("slot_mapping", lambda m: m.slot_mapping(1, 1, start=True), InvalidDTypeError, "start"),
    ("slot_mapping", lambda m: m.slot_mapping(1, 2, start=5), InvalidArgumentError, "from token 5"),
    ("slot_mapping", lambda m: m.slot_mapping(1, -1), InvalidArgumentError, "num_tokens"),
    ("slot_mapping", lambda m: m.slot_mapping(1, 1.0), InvalidDTypeError, "num_tokens"),
    ("evict", lambda m: m.evict(None), InvalidDTypeError, "num_pages"),
    ("pin", lambda m: m.pin([1, 2, 3, 4], "10"), InvalidDTypeError, "ttl_s"),
    ("pin", lambda m: m.pin([1, 2, 3, 4], True), InvalidDTypeError, "ttl_s"),
    ("pin", lambda m: m.pin([1, 2, 3, 4], float("nan")), InvalidArgumentError, "ttl_s"),
    ("pin", lambda m: m.pin([1, 2, 3, 4], 1e300), InvalidArgumentError, "ttl_s"),
    ("pin", lambda m: m.pin([1, 2, 3, 4], 5.0, namespace=b"a"), InvalidDTypeError, "namespace"),
    ("unpin", lambda m: m.unpin([1, 2, 3, 4], namespace=1), InvalidDTypeError, "namespace"),
    (
        "peek_prefix_len",
        lambda m: m.peek_prefix_len([1], namespace="\udfff"),
        InvalidArgumentError,
        "namespace",
    ),
    ("ref_count", lambda m: m.ref_count(None), InvalidDTypeError, "page"),
    ("ref_count", lambda m: m.ref_count(True), InvalidDTypeError, "page"),
    ("ref_count", lambda m: m.ref_count(2**64), InvalidArgumentError, "page"),
    ("seq_len", lambda m: m.seq_len(2**64), InvalidArgumentError, "seq_id"),
    ("seq_pages", lambda m: m.seq_pages(None), InvalidDTypeError, "seq_id"),
    ("check_pages", lambda m: m.check_pages([True]), InvalidDTypeError, "page ids"),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "arg"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
def test_wrong_arguments_raise_a_kvcore_error_naming_them(name: str, call, error, arg: str) -> None:  # type: ignore[no-untyped-def]
    m = KVCacheManager(64, 4, clock=lambda: 1.0)
    m.add_sequence(1, range(1, 7), namespace="t")
    before = state(m)
    with pytest.raises(error) as info:
        call(m)
    assert isinstance(info.value, KVCoreError)
    assert arg in str(info.value), str(info.value)
    assert state(m) == before


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_pages": None}, InvalidDTypeError),
        ({"num_pages": True}, InvalidDTypeError),
        ({"num_pages": 8, "page_size": "4"}, InvalidDTypeError),
        ({"num_pages": 8, "eviction": None}, InvalidDTypeError),
        ({"num_pages": 8, "eviction": 3}, InvalidDTypeError),
        ({"num_pages": 8, "pin_budget_pages": 1.5}, InvalidDTypeError),
        ({"num_pages": 2**80}, InvalidArgumentError),
    ],
)
def test_wrong_construction_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        KVCacheManager(**kwargs)  # type: ignore[arg-type]


def test_a_clock_returning_garbage_is_a_kvcore_error() -> None:
    m = KVCacheManager(8, 4, clock=lambda: "soon")
    with pytest.raises(InvalidDTypeError, match="clock"):
        m.add_sequence(1, [1])
    assert len(m) == 0


@pytest.mark.parametrize("batch", [[True], [1, False], (True,)])
def test_bools_are_not_page_ids(batch: list[object]) -> None:
    alloc = PageAllocator(8)
    alloc.allocate(2)
    with pytest.raises(InvalidDTypeError):
        alloc.free(batch)
    assert alloc.ref_count(1) == 1 and alloc.num_free == 5


@pytest.mark.parametrize("n", [True, False, 1.0, "2", None])
def test_bools_and_non_integers_are_not_counts(n: object) -> None:
    with pytest.raises(InvalidDTypeError):
        PageAllocator(8).allocate(n)  # type: ignore[arg-type]


def test_stats_is_one_native_class() -> None:
    s = KVCacheManager(8, 4).stats()
    assert isinstance(s, kvcore.CacheStats)
    assert list(s.as_dict()) == [
        "num_pages_total",
        "num_pages_in_use",
        "num_pages_cached",
        "num_pages_pinned",
        "num_pages_free",
        "num_sequences",
        "prefix_query_tokens",
        "prefix_hit_tokens",
        "num_evicted_pages",
        "num_cow_copies",
        "num_refused",
    ]
    assert s == KVCacheManager(8, 4).stats() and s.usage == 0.0 and s.hit_rate == 0.0


def test_id_and_count_arrays_of_every_layout_give_the_same_table() -> None:
    # Contiguous int64 / int32 arrays are copied directly, others go through a list: one answer.
    m = kvcore.KVCacheManager(64, 4)
    for i, n in enumerate([5, 9, 13]):
        m.add_sequence(10 + i, list(range(100 * i, 100 * i + n)))
    ids, counts = [10, 11, 12, 10], [5, 3, 13, 1]
    want = m.page_table(ids, num_tokens=counts)
    wide_ids = np.array([[v, -1] for v in ids], np.int64)[:, 0]  # strided views
    wide_counts = np.array([[v, -1] for v in counts], np.int32)[:, 0]
    assert not wide_ids.flags.c_contiguous
    for dtype in (np.int64, np.int32):
        for got in (
            m.page_table(np.array(ids, dtype), num_tokens=np.array(counts, dtype)),
            m.page_table(wide_ids.astype(dtype)[::1], num_tokens=wide_counts),
            m.page_table(wide_ids, num_tokens=np.array(counts, dtype)),
        ):
            for a, b in zip(got, want, strict=True):
                assert np.array_equal(a, b)
    assert np.array_equal(
        m.page_table(np.array([2**31 + 10], np.int64) - 2**31).kv_indices, want.kv_indices[:2]
    )


def test_a_tenants_recomputed_page_never_replaces_a_public_one() -> None:
    # A page-aligned prompt over a public prefix recomputes its last page; the tree keeps its own
    # public copy (adopting the tenant's would serve tenant a's K/V to every tenant).
    m = kvcore.KVCacheManager(100, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    m.add_sequence(1, [*prompt, 9], namespace="*")
    public = m.seq_pages(1)[:2].tolist()
    m.free_sequence(1)
    assert m.add_sequence(2, prompt, namespace="a") == 4  # the last page is computed again
    a_page = int(m.seq_pages(2)[1])
    assert a_page != public[1]
    m.append(2, [77])
    m.free_sequence(2)
    m.add_sequence(3, [*prompt, 9], namespace="b")
    assert m.seq_pages(3)[:2].tolist() == public
    assert a_page not in m.seq_pages(3).tolist()
    m._check_invariants()


def test_a_tenants_own_copy_is_still_adopted_in_its_own_namespace() -> None:
    # The same recomputation in one namespace: the tree takes the copy and frees its own.
    m = kvcore.KVCacheManager(100, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    m.add_sequence(1, [*prompt, 9], namespace="a")
    m.free_sequence(1)
    m.add_sequence(2, prompt, namespace="a")
    copy = int(m.seq_pages(2)[1])
    m.append(2, [77])
    m.free_sequence(2)
    m.add_sequence(3, [*prompt, 9], namespace="a")
    assert int(m.seq_pages(3)[1]) == copy
    m._check_invariants()


def test_a_tenants_window_group_pages_are_never_cached_under_a_public_key() -> None:
    m = kvcore.KVCacheManager(100, 4, groups=[8, None])
    prompt = list(range(1, 14))
    m.add_sequence(1, prompt, namespace="*")
    m.free_sequence(1)
    m.add_sequence(9, prompt[:8] + [99] * 5, namespace="*")  # the first two pages, still in use
    m.evict(1000)  # the tree keeps pages 0-1 (in use), the window group's page 2 goes
    m.free_sequence(9)
    public = set(m.cached_pages().tolist())
    # Each tenant computes its own window page 2 over the public path: never shared.
    m.add_sequence(2, prompt, namespace="a")
    m.add_sequence(3, prompt, namespace="b")
    a_own = set(m.seq_pages(2, group=0).tolist()) - {0} - public
    b_own = set(m.seq_pages(3, group=0).tolist()) - {0} - public
    assert a_own and b_own
    assert not a_own & b_own
    m._check_invariants()


def test_tokens_computed_again_after_a_compaction_stay_private() -> None:
    m = kvcore.KVCacheManager(200, 4)
    prompt = list(range(1, 41))
    m.add_sequence(1, prompt)
    m.append(1, [500])
    m.compact(1, np.arange(11, dtype=np.float32), 6)  # drops pages 0-4
    m.truncate(1, 21)
    new = [900 + i for i in range(20)]
    m.append(1, new)
    m.free_sequence(1)
    # Tokens 21.. attended to the compacted context: nothing from token 21 on is cached.
    assert m.peek_prefix_len([*prompt[:21], *new]) <= 20
    m._check_invariants()


def test_block_table_refuses_a_fortran_ordered_buffer() -> None:
    m = kvcore.KVCacheManager(50, 4)
    m.add_sequence(1, list(range(9)))
    m.add_sequence(2, list(range(100, 117)))
    out = np.full((3, 6), -7, np.int32, order="F")
    with pytest.raises(InvalidDTypeError, match="C-contiguous"):
        m.block_table([1, 2], out=out)
    assert (out == -7).all()
    got = m.block_table([1, 2], out=np.full((3, 6), -7, np.int32))
    assert np.array_equal(got, m.block_table([1, 2]))


def test_a_lower_tier_cannot_be_named_hbm() -> None:
    for name in ("hbm", "HBM", "Hbm"):  # "HBM" beside "hbm" in hits and metrics labels read as one tier
        with pytest.raises(InvalidArgumentError, match="hbm"):
            kvcore.KVCacheManager(50, 4, lower_tiers=[("host", 4), (name, 8)])
    m = kvcore.KVCacheManager(50, 4, lower_tiers=[("hbm2", 8), ("HBMx", 8)])
    assert m.tier_names == ["hbm2", "HBMx"]
