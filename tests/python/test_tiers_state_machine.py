"""A Hypothesis state machine over the manager with lower tiers, through the real ``Mover``.

The simulated pool holds, per page, the *content* written into it: the engine writes into each page
it computes the page key of the tokens it holds (``kvcore.page_keys``, which names the namespace and
the whole prefix). Fake tiers copy those 16 bytes between pool pages and slots. So:

- a sequence's hit pages (HBM or loaded) must hold exactly its own page keys: a page of another
  tenant, a stale slot, a torn or unfinished store, or a load reported OK into the wrong page reads
  as a wrong key;
- every slot a tier holds stores the content of the key it is stored under.

Transfers are taken and completed in any order, some failed on purpose, some left in flight across
other calls; after every step the core's own invariant check (slots partitioned between free,
cached and in flight; no slot owned twice; tree counts exact) and the usage split must hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvcore
from kvcore import InvalidArgumentError, KVCacheManager
from kvcore.events import AllCleared, PageRemoved, PageStored
from kvcore.manager import TransferBatch
from kvcore.tiers.mover import Mover

PS = 2
NAMESPACES = [None, "a", "b"]
token_lists = st.lists(st.integers(0, 1), min_size=1, max_size=12)


class FakePool:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.page_size = PS
        self.content = np.zeros((num_pages, 16), dtype=np.uint8)


class FakeTier:
    """A slot store of page contents; fails the rows listed in ``fail`` (then clears it)."""

    def __init__(self, name: str, num_slots: int) -> None:
        self.name = name
        self.num_slots = num_slots
        self.slot_key: dict[int, bytes] = {}
        self.slot_content: dict[int, bytes] = {}
        self.slot_ns: dict[int, str | None] = {}
        self.fail_next = False

    def store(self, pool, pages, slots, keys, parent_keys, tokens, namespaces):  # type: ignore[no-untyped-def]
        ok = np.ones(len(pages), dtype=bool)
        for i, (p, s) in enumerate(zip(pages, slots, strict=True)):
            if self.fail_next:
                ok[i] = False
                continue
            self.slot_key[int(s)] = bytes(keys[i])
            self.slot_content[int(s)] = bytes(pool.content[p])
            self.slot_ns[int(s)] = namespaces[i]
        self.fail_next = False
        return ok

    def load(self, pool, slots, pages, keys):  # type: ignore[no-untyped-def]
        ok = np.ones(len(pages), dtype=bool)
        for i, (s, p) in enumerate(zip(slots, pages, strict=True)):
            if self.fail_next or self.slot_key.get(int(s)) != bytes(keys[i]):
                ok[i] = False
                continue
            pool.content[p] = np.frombuffer(self.slot_content[int(s)], dtype=np.uint8)
        self.fail_next = False
        return ok


@dataclass
class Seq:
    tokens: list[int]
    ns: str | None
    checked: bool = False  # its hit pages were verified once it became ready


def keys_of(tokens: list[int], ns: str | None) -> np.ndarray:
    return kvcore.page_keys(np.asarray(tokens, dtype=np.int32), PS, namespace=ns)


class TiersMachine(RuleBasedStateMachine):
    @initialize(
        num_pages=st.integers(6, 14),
        host=st.integers(1, 16),
        disk=st.integers(1, 32),
        policy=st.sampled_from(["all", "selective", "value"]),
    )
    def setup(self, num_pages: int, host: int, disk: int, policy: str) -> None:
        options = (
            {"page_bytes": 1000.0}
            if policy == "value"
            else ({"min_hits": 1} if policy == "selective" else None)
        )
        self.tiers = [FakeTier("host", host), FakeTier("disk", disk)]
        self.cache = KVCacheManager(
            num_pages,
            PS,
            lower_tiers=[(t.name, t.num_slots) for t in self.tiers],
            store_policy=policy,
            store_options=options,
            events=True,
        )
        # A router's index per medium, built from the KV events alone.
        self.index: dict[str, dict[bytes, int]] = {"hbm": {}, "host": {}, "disk": {}}
        self.pool = FakePool(num_pages)
        self.mover = Mover(self.cache, self.pool, self.tiers)
        self.seqs: dict[int, Seq] = {}
        self.next_id = 0
        self.in_flight: list[TransferBatch] = []
        self.history: list[tuple[list[int], str | None]] = []

    # ---------------------------------------------------------------- the engine's side

    def compute(self, seq_id: int) -> None:
        """Write the K/V (page keys) of the sequence's full pages past its hit; check the hit."""
        seq = self.seqs[seq_id]
        if not self.cache.is_ready(seq_id):
            return
        pages = self.cache.seq_pages(seq_id)
        keys = keys_of(seq.tokens, seq.ns)
        hit = self.cache.hit_tokens(seq_id)
        hit_pages = sum(hit.values()) // PS
        if not seq.checked:
            event("hit from host" if hit["host"] else "no host hit")
            event("hit from disk" if hit["disk"] else "no disk hit")
        for i in range(len(keys)):
            if i >= len(pages):
                break
            if i < hit_pages and not seq.checked:
                # Found cached or loaded: it must be this tenant's page of this prefix.
                assert bytes(self.pool.content[pages[i]]) == bytes(keys[i]), (seq_id, i)
            elif i >= hit_pages:
                self.pool.content[pages[i]] = keys[i]
        seq.checked = True

    @rule(tokens=token_lists, ns=st.sampled_from(NAMESPACES))
    def add(self, tokens: list[int], ns: str | None) -> None:
        sid = self.next_id
        self.next_id += 1
        hit = self.cache.add_sequence(sid, tokens, ns)
        if hit is None:
            return
        self.seqs[sid] = Seq(tokens, ns)
        self.history.append((tokens, ns))
        assert hit == sum(self.cache.hit_tokens(sid).values())
        self.compute(sid)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), evict=st.booleans(), extra=st.lists(st.integers(0, 1), max_size=3))
    def readmit(self, data: st.DataObject, evict: bool, extra: list[int]) -> None:
        """A prompt seen before (plus a few tokens), after HBM lost its pages: a lower-tier hit."""
        tokens, ns = data.draw(st.sampled_from(self.history))
        self.move(False, False)
        if evict:
            self.cache.evict(1 << 20)
        self.add(tokens + extra, ns)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def append(self, data: st.DataObject, tokens: list[int]) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        if not self.cache.is_ready(sid):
            try:
                self.cache.append(sid, tokens)
            except InvalidArgumentError:
                return
            raise AssertionError("append on a loading sequence must be refused")
        self.compute(sid)  # the engine computes before it generates
        if self.cache.append(sid, tokens):
            self.seqs[sid].tokens += tokens
            self.compute(sid)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.compute(sid)
        self.cache.free_sequence(sid)
        del self.seqs[sid]

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(fail_host=st.booleans(), fail_disk=st.booleans())
    def move(self, fail_host: bool, fail_disk: bool) -> None:
        self.tiers[0].fail_next = fail_host
        self.tiers[1].fail_next = fail_disk
        self.mover.run()
        for t in self.tiers:
            t.fail_next = False
        for sid in list(self.seqs):
            self.compute(sid)

    @rule()
    def take_only(self) -> None:
        batch = self.cache.take_transfers()
        if batch:
            self.in_flight.append(batch)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), fail=st.booleans())
    def complete_later(self, data: st.DataObject, fail: bool) -> None:
        batch = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        self.tiers[0].fail_next = fail
        self.mover.execute(batch)
        self.tiers[0].fail_next = False
        with_ops = batch.store_ops.tolist() + batch.load_ops.tolist()
        if with_ops:  # completing twice is refused, nothing changed
            try:
                self.cache.complete_transfers(with_ops[:1], True)
            except InvalidArgumentError:
                pass
            else:
                raise AssertionError("an op completed twice")
        for sid in list(self.seqs):
            self.compute(sid)

    @rule()
    def reset(self) -> None:
        self.cache.reset_prefix_cache()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def core_invariants(self) -> None:
        self.cache._check_invariants()
        s = self.cache.stats()
        assert (
            s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free
            == s.num_pages_total
        )
        for name, t in self.cache.tier_stats().items():
            assert t["num_slots_cached"] + t["num_slots_in_flight"] + t["num_slots_free"] == t["num_slots"], (
                name
            )

    @invariant()
    def events_index_every_tier(self) -> None:
        for ev in self.cache.take_events():
            if isinstance(ev, AllCleared):
                self.index[ev.medium].clear()
                continue
            idx = self.index[ev.medium]
            if isinstance(ev, PageStored):
                if ev.parent_key is not None:
                    assert ev.parent_key in idx, "a stored page's parent is not indexed"
                for k, p in zip(ev.keys, ev.pages.tolist(), strict=True):
                    assert k not in idx, "a key stored twice in one medium"
                    idx[k] = p
            else:
                assert isinstance(ev, PageRemoved)
                for k, p in zip(ev.keys, ev.pages.tolist(), strict=True):
                    assert idx.pop(k, None) == p, "a removed key was not indexed there"
        stats = self.cache.tier_stats()
        for tier in self.tiers:
            idx = self.index[tier.name]
            assert len(idx) == stats[tier.name]["num_slots_cached"], tier.name
            for key, slot in idx.items():
                assert tier.slot_key.get(slot) == key, (tier.name, slot)

    @invariant()
    def slots_hold_their_keys(self) -> None:
        stats = self.cache.tier_stats()
        for tier in self.tiers:
            assert stats[tier.name]["num_slots_cached"] <= tier.num_slots
            for slot, key in tier.slot_key.items():
                # What a tier holds under a key is that key's content (no foreign or torn value).
                assert tier.slot_content[slot] == key or tier.slot_content[slot] == bytes(16), slot

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        # Everything completes, every sequence goes: nothing stays held.
        for batch in self.in_flight:
            self.mover.execute(batch)
        self.mover.run()
        for sid in list(self.seqs):
            self.cache.free_sequence(sid)
        self.mover.run()
        self.cache._check_invariants()
        s = self.cache.stats()
        assert s.num_pages_in_use == 0, s
        for t in self.cache.tier_stats().values():
            assert t["num_slots_in_flight"] == 0 and t["num_slots_locked"] == 0, t
        assert self.cache.caller_held_pages() == {}


TiersMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
test_tiers_state_machine = TiersMachine.TestCase
