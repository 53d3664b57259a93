"""Threads and the interpreter: long manager calls release it, and no call waits
for the manager while holding it, so a Python thread (a transfer-completion thread, say) is never
stalled by the scheduler's large evictions, resets or tables."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from kv_helpers import other_thread_steps_during

from kvcore import KVCacheManager

pytestmark = pytest.mark.skipif(
    not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="free-threaded Python has no interpreter lock"
)


def full_cache(num_pages: int = 2_000_000) -> KVCacheManager:
    """A manager whose pages are all cached (page size 1, four long prompts)."""
    m = KVCacheManager(num_pages + 1, 1)
    step = num_pages // 4
    for i in range(4):
        m.add_sequence(i, np.arange(i * step, (i + 1) * step, dtype=np.int32))
        m.free_sequence(i)
    assert m.stats().num_pages_cached == num_pages
    return m


def test_long_calls_release_the_interpreter() -> None:
    caches = [full_cache() for _ in range(3)]
    small = KVCacheManager(1_001, 16)
    small.add_sequence(1, [1, 2, 3])

    def short_calls() -> None:
        for _ in range(2_000):
            small.append(1, [4])
            small.truncate(1, 3)

    # The control: short calls stay attached, so the spinner gets (almost) no step meanwhile.
    assert max(other_thread_steps_during(short_calls) for _ in range(3)) < 10
    assert min(other_thread_steps_during(m.reset_prefix_cache) for m in caches) >= 10


def test_a_call_waiting_for_a_long_one_does_not_hold_the_interpreter() -> None:
    """While thread A resets a large cache (detached, about 10 ms), this thread's short call waits
    for the manager: it must wait detached too, or a spinning thread could not run meanwhile."""
    progress = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            progress[0] += 1
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # the interpreter (almost) never switches threads on its own
    spinner = threading.Thread(target=spin)
    spinner.start()
    steps = []
    try:
        for _ in range(3):
            m = full_cache()
            inside = threading.Event()
            a = threading.Thread(target=lambda m=m, inside=inside: (inside.set(), m.reset_prefix_cache()))
            a.start()
            inside.wait()
            time.sleep(0.002)  # A is inside its reset by now
            before = progress[0]
            m.stats()  # waits for A's reset
            steps.append(progress[0] - before)
            a.join()
            assert m.stats().num_pages_free == 2_000_000
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old)
    assert max(steps) >= 10, steps


@pytest.mark.parametrize("call", ["free_sequence", "truncate", "fork", "commit"])
def test_calls_on_a_long_sequence_release_the_interpreter(call: str) -> None:
    """free, truncate, fork and commit cost in proportion to the sequence: on a long one they
    run detached (on 1M tokens they took 3-7 ms attached before), while the same calls on short
    ones stay attached (the control in test_long_calls_release_the_interpreter). 3M tokens: a free
    of 1M shared pages takes under 2 ms, too short for the spinner to be scheduled reliably."""
    n = 3_000_000

    def run_once() -> int:
        m = KVCacheManager(n + 8, 1)
        tokens = np.arange(n, dtype=np.int32)
        m.add_sequence(1, tokens, cache_prompt=call != "commit")
        action = {
            "free_sequence": lambda: m.free_sequence(1),
            "truncate": lambda: m.truncate(1, 1),
            "fork": lambda: m.fork(1, 2),
            "commit": lambda: m.commit(1, n),
        }[call]
        return other_thread_steps_during(action)

    # Up to 5 tries: on a loaded 2-core machine the OS may not run the spinner within one call's few
    # ms; an attached call gives it no step in any try (the short calls' control above).
    assert any(run_once() >= 10 for _ in range(5))
