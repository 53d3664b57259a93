"""KV events: in order, keyed as page_keys computes them, off by default."""

from __future__ import annotations

import numpy as np
import pytest
from kv_helpers import ref_page_key

import kvcore
from kvcore import InvalidDTypeError, KVCacheManager
from kvcore.events import AllCleared, PageRemoved, PageStored

PS = 4


def as_bytes(keys: object) -> list[bytes]:
    return [bytes(k) for k in keys]  # type: ignore[attr-defined]


def test_events_are_off_by_default() -> None:
    m = KVCacheManager(16, PS)
    m.add_sequence(1, list(range(9)))
    m.free_sequence(1)
    m.evict(10)
    assert m.take_events() == []


def test_stored_removed_cleared_in_order_with_the_page_keys() -> None:
    fp = b"model|bf16|4"
    m = KVCacheManager(32, PS, fingerprint=fp, events=True)
    prompt = list(range(100, 113))  # 3 full pages
    m.add_sequence(1, prompt, namespace="tenant")
    keys = as_bytes(m.page_keys(1))
    pages = m.seq_pages(1)[:3].tolist()
    [stored] = m.take_events()
    assert isinstance(stored, PageStored)
    assert stored.keys == keys == as_bytes(kvcore.page_keys(prompt, PS, fp, "tenant"))
    assert stored.parent_key is None and stored.namespace == "tenant" and stored.medium == "hbm"
    assert stored.pages.tolist() == pages
    assert m.append(1, [1, 2, 3])  # the 4th page fills: stored, chained to the 3rd
    [more] = m.take_events()
    assert isinstance(more, PageStored) and more.parent_key == keys[2]
    m.free_sequence(1)
    assert m.evict(2) == 2  # leaves first
    [removed] = m.take_events()
    assert isinstance(removed, PageRemoved)
    assert sorted(removed.pages.tolist()) == sorted([int(more.pages[0]), pages[2]])
    assert set(removed.keys) == {more.keys[0], keys[2]}
    assert m.reset_prefix_cache() == 2
    events = m.take_events()
    assert isinstance(events[0], PageRemoved) and set(events[0].keys) == set(keys[:2])
    assert events[-1] == AllCleared()


def test_a_public_prefix_is_keyed_in_the_public_namespace() -> None:
    m = KVCacheManager(32, PS, events=True)
    system = list(range(8))
    m.add_sequence(1, system, namespace="*")
    m.free_sequence(1)
    m.take_events()
    m.add_sequence(2, [*system, 50, 51, 52, 53, 54], namespace="tenant")  # hits the public pages
    [stored] = m.take_events()
    public = as_bytes(kvcore.page_keys(system, PS, None, "*"))
    assert stored.namespace == "tenant" and stored.parent_key == public[1]
    assert as_bytes(m.page_keys(2))[:2] == public  # the sequence's keys follow the tree


def test_inserted_pages_are_stored_events() -> None:
    m = KVCacheManager(32, PS, events=True)
    pages = m.allocate_pages(2)
    assert pages is not None
    assert m.insert(list(range(8)), pages) == 2
    [stored] = m.take_events()
    assert stored.pages.tolist() == pages.tolist()
    assert stored.keys == as_bytes(kvcore.page_keys(list(range(8)), PS))


def test_events_argument_must_be_a_bool() -> None:
    with pytest.raises(InvalidDTypeError, match="events"):
        KVCacheManager(8, PS, events="yes")  # type: ignore[arg-type]


def _check_chain(ev: PageStored, root: bytes, page_size: int) -> None:
    """A stored run's keys are the documented hash of its parent key, namespace and tokens (checked
    with the independent implementation of the tests): a router can index them from the tokens."""
    assert ev.tokens.dtype == np.uint32 and len(ev.tokens) == len(ev.keys) * page_size
    parent = root if ev.parent_key is None else ev.parent_key
    for key, i in zip(as_bytes(ev.keys), range(len(ev.keys)), strict=True):
        page = ev.tokens[i * page_size : (i + 1) * page_size].tolist()
        parent = ref_page_key(parent, ev.namespace, page)
        assert key == parent, f"{ev.medium}: a key that its tokens and parent do not give"


def _apply(
    index: dict[str, dict[bytes, int]], events: list[object], chain: tuple[bytes, int] | None = None
) -> None:
    """A router's index, per medium: key -> page (or slot); with ``chain`` (root key, page size),
    every stored key is checked against its tokens."""
    for ev in events:
        if isinstance(ev, AllCleared):
            index.setdefault(ev.medium, {}).clear()
        elif isinstance(ev, PageStored):
            if chain is not None:
                _check_chain(ev, *chain)
            idx = index.setdefault(ev.medium, {})
            if ev.parent_key is not None:
                assert ev.parent_key in idx, "a stored page's parent is not indexed"
            for k, p in zip(as_bytes(ev.keys), ev.pages.tolist(), strict=True):
                assert k not in idx, "a key stored twice in one medium"
                idx[k] = p
        else:
            assert isinstance(ev, PageRemoved)
            idx = index.setdefault(ev.medium, {})
            for k, p in zip(as_bytes(ev.keys), ev.pages.tolist(), strict=True):
                assert idx.pop(k) == p


def test_an_overflowing_event_log_is_replaced_by_a_snapshot_of_every_medium() -> None:
    """A consumer that stops taking events does not grow the manager without bound: past MAX_EVENTS
    the log is dropped (counted), and the next take returns, per medium, AllCleared and its whole
    content; a router that applies it holds what a router that kept up holds, and later events
    follow on from it."""
    from kvcore.pool import KVPool
    from kvcore.tiers import HostTier, Mover

    def build() -> tuple[KVCacheManager, Mover]:
        pool = KVPool(num_layers=1, num_pages=65, num_kv_heads=1, head_dim=8, page_size=2, kv_dtype="fp16")
        host = HostTier(pool, 40)
        m = KVCacheManager(65, 2, events=True, lower_tiers=[host], store_policy="all")
        return m, Mover(m, pool, [host])

    (kept, kept_mover), (stalled, stalled_mover) = build(), build()
    kept_index: dict[str, dict[bytes, int]] = {}
    rng = np.random.default_rng(0)
    steps = 0
    while stalled.num_events_dropped == 0:
        prompt = rng.integers(0, 50, int(rng.integers(2, 12))).tolist()
        ns = [None, "a", kvcore.PUBLIC_NAMESPACE][steps % 3]
        for m, mover in ((kept, kept_mover), (stalled, stalled_mover)):
            assert m.add_sequence(steps, prompt, ns) is not None
            m.free_sequence(steps)
            mover.run()
        if steps % 50 == 0:
            _apply(kept_index, kept.take_events(), (kept.root_key(), 2))
        steps += 1
        assert steps < 200_000
    assert stalled.num_events_dropped > 0 and kept.num_events_dropped == 0
    _apply(kept_index, kept.take_events())
    snapshot = stalled.take_events()
    assert len(snapshot) < kvcore.MAX_EVENTS
    assert [e.medium for e in snapshot if isinstance(e, AllCleared)] == ["hbm", "host"]
    stalled_index: dict[str, dict[bytes, int]] = {"hbm": {b"stale": 1}, "host": {b"stale": 2}}
    _apply(stalled_index, snapshot, (stalled.root_key(), 2))
    assert stalled_index == kept_index and kept_index["hbm"] and kept_index["host"]
    # Events go on from the snapshot as usual.
    for m, mover in ((kept, kept_mover), (stalled, stalled_mover)):
        m.add_sequence(10**6, [7, 8, 9, 10, 11], "a")
        m.free_sequence(10**6)
        mover.run()
    _apply(kept_index, kept.take_events())
    _apply(stalled_index, stalled.take_events())
    assert stalled_index == kept_index
    stalled._check_invariants()
