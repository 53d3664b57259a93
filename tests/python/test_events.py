"""KV events: in order, keyed as page_keys computes them, off by default."""

from __future__ import annotations

import pytest

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
