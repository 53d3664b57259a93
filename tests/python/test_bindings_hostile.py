"""The native bindings against hostile Python objects and threads: no crash, no abort, no aliasing.

Each case used to kill or corrupt the process: an ndarray subclass whose ``tolist`` returns itself
overflowed the Rust stack (SIGSEGV); a lazy ``range`` of 10**15 ids or a sequence whose ``__len__``
lies aborted on allocation; three ``out`` buffers over one memory (distinct base objects) were written
as three exclusive slices; and a daemon thread inside a kvcore call at interpreter exit aborted the
process (exit code 134) through ``pthread_exit``'s unwind of our frames.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import kvcore
from kvcore import InvalidDTypeError, KVCacheManager, OutOfMemoryError


def manager() -> KVCacheManager:
    m = KVCacheManager(64, 4)
    for i in range(4):
        m.add_sequence(i, list(range(i * 50, i * 50 + 13)))
    return m


class SelfListing(np.ndarray):
    """``tolist`` returns the array itself (a subclass may override anything)."""

    def tolist(self) -> Any:  # type: ignore[override]
        return self


def test_an_array_subclass_with_a_lying_tolist_is_read_as_an_array() -> None:
    m = manager()
    ids = np.array([1, 0, 2, 0], dtype=np.int64)[::2].view(SelfListing)  # strided: no fast path
    got = m.page_table(ids)
    want = m.page_table([1, 2])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(m.positions(ids), m.positions([1, 2]))


@pytest.mark.parametrize("call", ["tokens", "seq_ids"])
def test_a_huge_lazy_range_is_an_out_of_memory_error(call: str) -> None:
    m = manager()
    with pytest.raises(OutOfMemoryError):
        if call == "tokens":
            m.peek_prefix_len(range(10**15))
        else:
            m.page_table(range(10**15))
    assert m.page_table([0]).kv_indptr.tolist() == [0, 4]  # still usable


SCORES = [3.0, 1.0, 2.0, 4.0]


class LyingLength:
    """Claims 2**62 items, iterates four (one score per page of a 13-token sequence)."""

    def __len__(self) -> int:
        return 2**62

    def __iter__(self) -> Any:
        return iter(SCORES)

    def __getitem__(self, i: int) -> float:
        return SCORES[i]


def test_compact_scores_are_read_as_iterated_not_as_their_length_claims() -> None:
    m = manager()
    a, b = manager(), manager()
    assert a.compact(1, LyingLength(), 2) == b.compact(1, SCORES, 2)
    assert a.page_table([1]).kv_indices.tolist() == b.page_table([1]).kv_indices.tolist()
    assert m.compact(2, np.array(SCORES), 2) == b.compact(2, np.array(SCORES, np.float32)[::-1][::-1], 2)
    for bad in ("abc", np.ones((2, 2)), np.array(["a"]), [1.0, "x"], None, set(SCORES), iter(SCORES)):
        with pytest.raises(InvalidDTypeError):
            m.compact(3, bad, 2)


def test_out_buffers_over_one_memory_are_refused_and_left_unwritten() -> None:
    m = manager()
    buf = bytearray(4 * 64)
    views = [np.frombuffer(memoryview(buf), np.int32) for _ in range(3)]
    assert len({id(v.base) for v in views}) == 3  # three bases: rust-numpy's borrow check misses it
    with pytest.raises(InvalidDTypeError, match="share memory"):
        m.page_table([0, 1, 2, 3], out=tuple(views))
    assert bytes(buf) == bytes(len(buf))
    x = np.zeros(64, np.int32)
    with pytest.raises(InvalidDTypeError):
        m.page_table([0, 1], out=(x[0:8], x[4:40], x[40:48]))  # overlapping views of one array
    t = m.page_table([0, 1], out=(x[0:8], x[8:40], x[40:48]))  # disjoint views: fine
    assert t.kv_indptr.tolist() == [0, 4, 8]


DAEMON = """
import atexit, sys, threading, time
stop = threading.Event()
workers = []
def join_workers():  # registered before kvcore is imported: runs after kvcore's own exit hook
    stop.set()
    for t in workers:
        t.join()
if sys.argv[2] == "joined":
    atexit.register(join_workers)
import numpy as np
from kvcore import KVCacheManager, PageAllocator
which = sys.argv[1]
class Index:  # an id whose __index__ is Python code
    def __init__(self, i): self.i = i
    def __index__(self): return self.i
c = KVCacheManager(20000, 16)
for i in range(100):
    c.add_sequence(i, np.arange(i * 10**5, i * 10**5 + 1000, dtype=np.int64))
ids = list(range(100))
a = PageAllocator(100000)
def spin():
    while not stop.is_set():
        if which == "page_table":  # a Python class built under our frames
            c.page_table(ids)
        elif which == "peek":  # detached (a long prompt)
            c.peek_prefix_len(np.arange(10000))
        elif which == "allocate":  # detached (a large batch)
            a.free(a.allocate(5000))
        elif which == "metrics":  # Python code called from Rust
            c.metrics_text()
        elif which == "index":  # the caller's Python code run by an argument's conversion
            c.page_table([Index(i) for i in range(20)])
for _ in range(2):
    workers.append(threading.Thread(target=spin, daemon=True))
    workers[-1].start()
time.sleep(0.2)
print("done")
"""


@pytest.mark.parametrize("exit_kind", ["plain", "joined"])
@pytest.mark.parametrize("which", ["page_table", "peek", "allocate", "metrics", "index"])
def test_daemon_threads_in_kvcore_calls_do_not_abort_the_exit(which: str, exit_kind: str) -> None:
    """Daemon threads in kvcore calls at exit: the process exits 0, also when an exit hook registered
    before kvcore's (so run after it) stops and joins them (they are held 2 s at most then)."""
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(DAEMON), which, exit_kind],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.returncode, run.stdout.strip()) == (0, "done"), run.stderr[-2000:]


def test_cache_stats_are_values_copied_and_pickled_as_such() -> None:
    import copy
    import pickle

    m = manager()
    s = m.stats()
    assert copy.copy(s) is s and copy.deepcopy(s) is s  # immutable
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.as_dict() == s.as_dict() and back.hit_rate == s.hit_rate
    from kvcore._kvcore import _cache_stats

    with pytest.raises(kvcore.InvalidArgumentError):
        _cache_stats([1, 2])
