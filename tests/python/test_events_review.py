"""KV events, hostile review of 2026-12-02: each test failed before its fix."""

from __future__ import annotations

import signal
import sys

import numpy as np
import pytest

import kvcore
from kvcore import InvalidArgumentError, KVCacheManager


def _stored_keys(events: list) -> list[bytes]:
    return [k for e in events if isinstance(e, kvcore.events.PageStored) for k in e.keys]


def _filled(n: int) -> KVCacheManager:
    c = KVCacheManager(4 * n + 1, 2, events=True)
    for i in range(n):
        c.add_sequence(i, [i, i + 1, 7])
        c.free_sequence(i)
    return c


def test_events_a_call_could_not_hand_over_come_back_first() -> None:
    """take_events emptied the log before building the events: an exception while they were built
    (or handed over) lost them for good, and no snapshot replaced them."""
    c = _filled(5)

    class Refusing(list):
        def extend(self, items: object) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        c.take_events(sink=Refusing())
    c.add_sequence(99, [50, 51, 7])  # recorded after the failed call: comes after the put-back ones
    events = c.take_events()
    keys = _stored_keys(events)
    assert len(keys) == 6 and len(set(keys)) == 6
    assert keys[-1] == c.page_keys(99)[0].tobytes()
    assert c.take_events() == []
    assert c.num_events_dropped == 0


def test_a_sink_receives_the_events_and_the_call_returns_none_of_them() -> None:
    c = _filled(3)
    got: list = []
    assert c.take_events(sink=got) == []
    assert len(_stored_keys(got)) == 3
    with pytest.raises(InvalidArgumentError, match="sink must be a list"):
        c.take_events(sink=())
    assert c.take_events() == []


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_interrupts_during_take_events_with_a_sink_lose_no_event() -> None:
    """Signals land at random points around take_events(sink=): every page is announced exactly once."""

    class Interrupt(Exception):
        pass

    armed = [False]

    def handler(signum: int, frame: object) -> None:
        if armed[0]:  # (a signal that comes once the round is over does nothing)
            armed[0] = False
            raise Interrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        got: list = []
        c = KVCacheManager(200_001, 2, events=True)
        interrupted = 0
        for rnd in range(30):
            for i in range(2_000):
                sid = rnd * 10_000 + i
                c.add_sequence(sid, [sid, sid + 1, 7])
                c.free_sequence(sid)
            armed[0] = True
            try:
                try:  # armed inside: a signal that lands as setitimer returns is caught below too
                    signal.setitimer(signal.ITIMER_REAL, 0.0005 * (rnd % 7 + 1))
                    c.take_events(sink=got)
                    for _ in range(200):  # the signal may land here instead
                        pass
                finally:  # (it may land here too, before it is disarmed: caught below all the same)
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupt:
                interrupted += 1
        c.take_events(sink=got)
    finally:
        signal.signal(signal.SIGALRM, old)
    keys = _stored_keys(got)
    assert len(keys) == len(set(keys)) == 60_000
    print(f"{interrupted} interrupts", file=sys.stderr)


def _replay(events: list, index: dict[bytes, int]) -> None:
    """A router's index (key -> page) from the events alone."""
    for e in events:
        if isinstance(e, kvcore.events.AllCleared):
            index.clear()
        elif isinstance(e, kvcore.events.PageStored):
            assert e.medium == "hbm" and len(e.tokens) == len(e.keys) * 4
            for k, p in zip(e.keys, e.pages.tolist(), strict=True):
                assert k not in index
                index[k] = p
        else:
            for k, p in zip(e.keys, e.pages.tolist(), strict=True):
                assert index.pop(k) == p


@pytest.mark.parametrize("groups", [[8], [8, 12]])
def test_a_manager_whose_groups_are_all_windows_reports_its_cache(groups: list[int]) -> None:
    """Mistral-style managers (every group a sliding window) cached, hit and evicted pages with no
    event at all: a router saw an empty cache."""
    rng = np.random.default_rng(0)
    m = KVCacheManager(120, 4, groups=groups, events=True)
    index: dict[bytes, int] = {}
    prompts = [rng.integers(0, 50, int(rng.integers(5, 60))).tolist() for _ in range(12)]
    live: list[int] = []
    for step in range(400):
        op = rng.integers(0, 10)
        if op < 5 and len(live) < 4:
            sid = step
            p = prompts[int(rng.integers(0, len(prompts)))] + rng.integers(0, 50, 3).tolist()
            if m.add_sequence(sid, p, ["a", None][int(rng.integers(0, 2))]) is not None:
                live.append(sid)
        elif op < 8 and live:
            sid = live[int(rng.integers(0, len(live)))]
            m.append(sid, rng.integers(0, 50, int(rng.integers(1, 9))).tolist())
        elif op < 9 and live:
            m.free_sequence(live.pop(int(rng.integers(0, len(live)))))
        elif op == 9:
            m.evict(int(rng.integers(1, 20)))
        if rng.random() < 0.3:
            _replay(m.take_events(), index)
            cached = sorted(m.cached_pages().tolist())
            if len(groups) == 1:
                assert sorted(index.values()) == cached
            else:  # the events describe the primary group: the first window here
                assert set(index.values()) <= set(cached)
    assert index
    for sid in live:
        m.free_sequence(sid)
    m.reset_prefix_cache()
    _replay(m.take_events(), index)
    assert index == {} and len(m.cached_pages()) == 0


def test_a_window_only_snapshot_holds_the_group_cache() -> None:
    """Past MAX_EVENTS the next call is a snapshot: it must list a windowed primary's pages too."""
    m = KVCacheManager(300_001, 1, groups=[4], events=True)
    for i in range(kvcore.MAX_EVENTS + 10):
        m.add_sequence(i, [i, i + 1])
        m.free_sequence(i)
    events = m.take_events()
    assert m.num_events_dropped > 0 and isinstance(events[0], kvcore.events.AllCleared)
    index: dict[bytes, int] = {}
    for e in events:
        if isinstance(e, kvcore.events.PageStored):
            index.update(zip(e.keys, e.pages.tolist(), strict=True))
    assert sorted(index.values()) == sorted(m.cached_pages().tolist())
