"""A Hypothesis state machine drives KVCacheManager against a pure-Python model.

The model knows each sequence's tokens and namespace, and every token prefix (whole pages) that was
ever offered to the cache, per namespace. The manager may have evicted some of them, so the model's
set is an upper bound of what is cached, and exact while nothing was evicted.

It also plays the engine over a simulated pool: a ``step`` takes the queued copy-on-write pairs,
checks they form one valid ``copy_pages`` batch, applies them all at once, then writes the K/V of
every token reserved since (each slot records which namespace wrote which token prefix). After every
step each live sequence must read, through its page table, exactly its own tokens' K/V: a stale copy
or a page shared across tenants shows up as a wrong slot.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvcore
from kvcore import (
    DuplicateSequenceError,
    InvalidArgumentError,
    InvalidDTypeError,
    KVCacheManager,
    UnknownSequenceError,
)
from kvcore.events import AllCleared, PageRemoved, PageStored

NAMESPACES = [None, "a", "b", kvcore.PUBLIC_NAMESPACE]
token_lists = st.lists(st.integers(0, 2), min_size=1, max_size=14)


@dataclass
class ModelSeq:
    tokens: list[int]
    ns: str | None
    manual: bool = False  # admitted with cache_prompt=False: pages are cached by commit() only
    cached_pages: int = 0  # leading full pages offered to the cache
    tree_pages: set[int] = field(default_factory=set)  # its pages seen in the tree: must stay there
    written: int = 0  # leading tokens whose K/V the engine wrote (or found cached)
    committed: int = 0  # manual sequences: tokens committed (what fork requires to be all)
    slots: int = -1  # tokens with a slot reserved (-1: all of them, set at admission)

    def computable(self) -> int:
        """Tokens both known and slotted: what the engine can have computed."""
        return min(self.slots, len(self.tokens))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ManagerMachine(RuleBasedStateMachine):
    @initialize(
        num_pages=st.integers(4, 48),
        page_size=st.sampled_from([1, 2, 4]),
        eviction=st.sampled_from(["lru", "lfu", "priority"]),
    )
    def setup(self, num_pages: int, page_size: int, eviction: str) -> None:
        self.clock = Clock()
        self.m = KVCacheManager(num_pages, page_size, eviction, clock=self.clock, events=True)
        self.router: dict[bytes, int] = {}  # a KV-aware router's index, built from the events alone
        self.ps = page_size
        self.num_pages = num_pages
        self.seqs: dict[int, ModelSeq] = {}
        self.offered: dict[str | None, set[tuple[int, ...]]] = {ns: set() for ns in NAMESPACES}
        self.pins: list[tuple[str | None, tuple[int, ...], float]] = []  # (ns, prefix, expiry)
        self.next_id = 0
        # The simulated pool: slot -> (writer's namespace, the token prefix whose last K/V it holds).
        self.pool: dict[int, tuple[str | None, tuple[int, ...]]] = {}
        self.held: list[int] = []  # pages the "engine" took with allocate_pages and still holds

    # ----- the model -----

    def offer(self, ns: str | None, tokens: list[int]) -> None:
        """Every whole-page prefix of ``tokens`` was offered to the cache under ``ns``."""
        for k in range(1, len(tokens) // self.ps + 1):
            self.offered[ns].add(tuple(tokens[: k * self.ps]))

    def model_longest(self, ns: str | None, tokens: list[int]) -> int:
        """Pages of the longest offered prefix visible from ``ns`` (its own and the public ones)."""
        visible = self.offered[ns] | self.offered[kvcore.PUBLIC_NAMESPACE]
        k = 0
        while (k + 1) * self.ps <= len(tokens) and tuple(tokens[: (k + 1) * self.ps]) in visible:
            k += 1
        return k

    def snapshot(self) -> tuple[object, ...]:
        stats = self.m.stats().as_dict()
        stats.pop("num_refused")
        pages = {sid: self.m.seq_pages(sid).tolist() for sid in sorted(self.seqs)}
        refs = [self.m.ref_count(p) for p in range(1, self.num_pages)]  # queued copies hold sources
        return stats, pages, refs, sorted(self.m.cached_pages().tolist())

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ----- rules -----

    @rule(
        tokens=token_lists,
        ns=st.sampled_from(NAMESPACES),
        priority=st.integers(0, 2),
        cache_prompt=st.booleans(),
        reserve=st.one_of(st.none(), st.integers(0, 14)),
    )
    def add_sequence(
        self, tokens: list[int], ns: str | None, priority: int, cache_prompt: bool, reserve: int | None
    ) -> None:
        sid = self.new_id()
        longest = self.model_longest(ns, tokens)
        evicted_before = self.m.stats().num_evicted_pages
        before = self.snapshot()
        prompt = np.array(tokens, dtype=np.int32)
        hit = self.m.add_sequence(
            sid, prompt, namespace=ns, priority=priority, cache_prompt=cache_prompt, reserve=reserve
        )

        def slots_for(hit: int) -> int:
            return len(tokens) if reserve is None else hit + min(reserve, len(tokens) - hit)

        if hit is None:
            assert self.snapshot() == before, "a refused admission changed the state"
            # Slots grow with the hit: the most the admission could have needed bounds it.
            cap = min(longest, (len(tokens) - 1) // self.ps) * self.ps
            needed = -(-slots_for(cap) // self.ps)
            assert needed > self.num_pages - 1 - self.m.stats().num_pages_in_use - self.pinned_floor()
            return
        slots = slots_for(hit)
        assert self.m.num_reserved(sid) == slots
        assert hit % self.ps == 0 and hit <= len(tokens) - 1
        cap = (len(tokens) - 1) // self.ps
        assert hit <= min(longest, cap) * self.ps, "a hit the model cannot explain (namespace leak?)"
        if evicted_before == 0 and not self.m.stats().num_evicted_pages:
            assert hit == min(longest, cap) * self.ps, "missed a cached prefix"
        if cache_prompt:
            computable = min(slots, len(tokens))
            self.seqs[sid] = ModelSeq(
                list(tokens), ns, cached_pages=computable // self.ps, written=hit, slots=slots
            )
            self.offer(ns, tokens[:computable])
        else:
            self.seqs[sid] = ModelSeq(
                list(tokens),
                ns,
                manual=True,
                cached_pages=hit // self.ps,
                written=hit,
                committed=hit,
                slots=slots,
            )

    @precondition(lambda self: any(s.slots < len(s.tokens) for s in self.seqs.values()))
    @rule(data=st.data())
    def reserve(self, data: st.DataObject) -> None:
        """The next chunk of a prompt admitted with ``reserve``."""
        sid = data.draw(st.sampled_from(sorted(k for k, s in self.seqs.items() if s.slots < len(s.tokens))))
        seq = self.seqs[sid]
        left = len(seq.tokens) - seq.slots
        n = data.draw(st.integers(0, left + 1))
        before = self.snapshot()
        if n > left:
            try:
                self.m.reserve(sid, n)
            except InvalidArgumentError:
                assert self.snapshot() == before
                return
            raise AssertionError("reserving past the prompt did not raise")
        if not self.m.reserve(sid, n):
            assert self.snapshot() == before, "a refused reserve changed the state"
            return
        seq.slots += n
        assert self.m.num_reserved(sid) == seq.slots
        if not seq.manual:
            seq.cached_pages = seq.computable() // self.ps
            self.offer(seq.ns, seq.tokens[: seq.computable()])

    def pinned_floor(self) -> int:
        return self.m.stats().num_pages_pinned

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), max_size=6), lookahead=st.integers(0, 3))
    def append(self, data: st.DataObject, new: list[int], lookahead: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        before = self.snapshot()
        seq = self.seqs[sid]
        if seq.slots < len(seq.tokens):  # its prompt is not all reserved: no generation yet
            try:
                self.m.append(sid, np.array(new, dtype=np.int32), num_lookahead=lookahead)
            except InvalidArgumentError:
                assert self.snapshot() == before
                return
            raise AssertionError("append before the prompt was reserved did not raise")
        if self.m.append(sid, np.array(new, dtype=np.int32), num_lookahead=lookahead):
            # Each append keeps exactly its own draft slots: an earlier call's go.
            seq.tokens += new
            seq.slots = len(seq.tokens) + lookahead
            seq.tree_pages &= set(self.m.seq_pages(sid).tolist())  # copied pages are no longer its
            assert self.m.num_reserved(sid) == seq.slots
            if not seq.manual:
                seq.cached_pages = len(seq.tokens) // self.ps
                self.offer(seq.ns, seq.tokens)
        else:
            assert self.snapshot() == before, "a refused append changed the state"

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """Speculative decoding: reject drafts (or any suffix); what stays is never written through."""
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        seq = self.seqs[sid]
        n = data.draw(st.integers(0, len(seq.tokens) + 1))
        if n == 0 or n > len(seq.tokens):
            before = self.snapshot()
            try:
                self.m.truncate(sid, n)
            except InvalidArgumentError:
                assert self.snapshot() == before
                return
            raise AssertionError("a bad truncate did not raise")
        if not seq.manual and seq.written < seq.computable() // self.ps * self.ps:
            # cache_prompt=True's promise: the step computes the pages cached for it before the
            # engine can reject any of its tokens (the verify pass comes first), as for free.
            self.step()
        self.m.truncate(sid, n)
        seq.tokens = seq.tokens[:n]
        seq.slots = min(seq.slots, n)
        seq.written = min(seq.written, n)
        seq.committed = min(seq.committed, n)
        seq.cached_pages = min(seq.cached_pages, n // self.ps)
        seq.tree_pages &= set(self.m.seq_pages(sid).tolist())
        assert self.m.seq_len(sid) == n and self.m.num_reserved(sid) == seq.slots

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        seq = self.seqs[sid]
        n = data.draw(st.integers(0, seq.computable()))
        # The engine computed the first n tokens in a step (their K/V is written), then commits.
        self.step(manual_upto={sid: n})
        seq.committed = max(seq.committed, n)
        seq.cached_pages = max(seq.cached_pages, n // self.ps)
        assert self.m.commit(sid, n) == seq.cached_pages * self.ps
        self.offer(seq.ns, seq.tokens[: seq.cached_pages * self.ps])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        child = self.new_id()
        p = self.seqs[parent]
        if (p.manual and p.committed < len(p.tokens)) or p.slots < len(p.tokens):  # not all computed
            before = self.snapshot()
            try:
                self.m.fork(parent, child)
            except InvalidArgumentError:
                assert self.snapshot() == before
                return
            raise AssertionError("forking a partly committed sequence did not raise")
        self.m.fork(parent, child)
        # The child computes its own uncomputed tokens (if any) in its own pages.
        self.seqs[child] = ModelSeq(
            list(p.tokens), p.ns, p.manual, p.cached_pages, set(p.tree_pages), p.written, p.committed, p.slots
        )
        assert self.m.seq_pages(child).tolist() == self.m.seq_pages(parent).tolist()

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def fork_then_append(self, data: st.DataObject, new: list[int]) -> None:
        """Beam search: fork a sequence and extend the child (a copy-on-write when the last page is
        partial), often several generations deep before the engine's next step."""
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        p = self.seqs[parent]
        if (p.manual and p.committed < len(p.tokens)) or p.slots < len(p.tokens):
            return
        child = self.next_id + 1
        self.fork(data)
        if child in self.seqs and self.m.append(child, new):
            c = self.seqs[child]
            c.tokens += new
            c.slots = len(c.tokens)  # an append keeps no earlier draft slots
            c.tree_pages &= set(self.m.seq_pages(child).tolist())
            if not self.seqs[child].manual:
                self.seqs[child].cached_pages = len(self.seqs[child].tokens) // self.ps
                self.offer(self.seqs[child].ns, self.seqs[child].tokens)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free_sequence(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        seq = self.seqs[sid]
        if not seq.manual and seq.written < seq.computable() // self.ps * self.ps:
            # Its full pages are cached as computed in this step (cache_prompt=True's promise): the
            # engine runs the step before the sequence can finish. A partial page needs no step, so
            # a fork's queued copy may outlive the fork.
            self.step()
        self.m.free_sequence(sid)
        del self.seqs[sid]

    @rule(n=st.integers(0, 10))
    def evict(self, n: int) -> None:
        cached = self.m.stats().num_pages_cached
        assert self.m.evict(n) == min(n, cached)

    @precondition(lambda self: any(self.offered.values()))
    @rule(data=st.data(), ttl=st.floats(1, 100))
    def pin(self, data: st.DataObject, ttl: float) -> None:
        ns = data.draw(st.sampled_from([n for n in NAMESPACES if self.offered[n]]))
        prefix = data.draw(st.sampled_from(sorted(self.offered[ns])))
        cached = self.m.peek_prefix_len(list(prefix), namespace=ns)
        pinned = self.m.pin(list(prefix), ttl, namespace=ns)
        assert pinned * self.ps <= cached
        if pinned:
            self.pins.append((ns, tuple(prefix[: pinned * self.ps]), self.clock.now + ttl))

    @precondition(lambda self: any(s.slots > 0 for s in self.seqs.values()))
    @rule(data=st.data())
    def tables_for_a_step(self, data: st.DataObject) -> None:
        """page_table(num_tokens=...), block_table and slot_mapping(start=...) against the pages."""
        slotted = sorted(k for k, s in self.seqs.items() if s.slots > 0)
        ids = data.draw(st.lists(st.sampled_from(slotted), min_size=1, max_size=4))
        counts = [data.draw(st.integers(1, self.seqs[sid].slots)) for sid in ids]
        full = {sid: self.m.seq_pages(sid).tolist() for sid in ids}
        pt = self.m.page_table(ids, num_tokens=np.array(counts, dtype=np.int64))
        total = 0
        for i, (sid, n) in enumerate(zip(ids, counts, strict=True)):
            pages = pt.kv_indices[pt.kv_indptr[i] : pt.kv_indptr[i + 1]].tolist()
            assert pages == full[sid][: -(-n // self.ps)]
            assert pt.kv_last_page_len[i] == n - (len(pages) - 1) * self.ps
            total += len(pages)
        out = kvcore.PageTable(
            np.full(len(ids) + 3, -1, np.int32),
            np.full(total + 2, -1, np.int32),
            np.full(len(ids), -1, np.int32),
        )
        into = self.m.page_table(ids, counts, out=out)
        assert all(np.array_equal(a, b) for a, b in zip(into, pt, strict=True))
        width = max(len(p) for p in full.values())
        bt = self.m.block_table(ids)
        assert bt.dtype == np.int32 and bt.shape == (len(ids), width)
        for i, sid in enumerate(ids):
            assert bt[i].tolist() == full[sid] + [0] * (width - len(full[sid]))
        buf = np.full((len(ids) + 1, width + 2), -1, np.int32)
        assert np.array_equal(self.m.block_table(ids, out=buf), bt)
        assert (buf[: len(ids), width:] == 0).all() and (buf[len(ids) :] == -1).all()
        sid = ids[0]
        length = self.seqs[sid].slots
        start = data.draw(st.integers(0, length))
        n = data.draw(st.integers(0, length - start))
        slots = self.m.slot_mapping(sid, n, start=start).tolist()
        assert slots == [full[sid][t // self.ps] * self.ps + t % self.ps for t in range(start, start + n)]
        before = self.snapshot()
        for call in (
            lambda: self.m.page_table(ids, num_tokens=[0] * len(ids)),
            lambda: self.m.page_table(ids, num_tokens=[length + 1, *counts[1:]]),
            lambda: self.m.page_table(ids, num_tokens=[*counts, 1]),
            lambda: self.m.slot_mapping(sid, 1, start=length),
            lambda: self.m.block_table(ids, out=np.zeros((len(ids), max(0, width - 1)), np.int32)),
        ):
            try:
                call()
            except InvalidArgumentError:
                pass
            else:
                raise AssertionError("a bad table request was not refused")
            assert self.snapshot() == before

    @rule(tokens=token_lists, ns=st.sampled_from(NAMESPACES))
    def match_prefix(self, tokens: list[int], ns: str | None) -> None:
        before = self.snapshot()
        found = self.m.match_prefix(tokens, namespace=ns)
        assert self.snapshot() == before, "match_prefix has side effects"
        assert found.num_tokens == self.m.peek_prefix_len(tokens, namespace=ns)
        assert found.pages.dtype == np.int32 and len(found.pages) * self.ps == found.num_tokens
        assert found.num_tokens <= self.model_longest(ns, tokens) * self.ps
        assert set(found.pages.tolist()) <= set(self.m.cached_pages().tolist())

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), keep=st.booleans())
    def load_and_insert(self, data: st.DataObject, ns: str | None, keep: bool) -> None:
        """An engine loads K/V computed elsewhere into pages of its own and inserts them."""
        k = data.draw(st.integers(1, 3))
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=k * self.ps, max_size=k * self.ps))
        existing = self.m.peek_prefix_len(tokens, namespace=ns) // self.ps
        before = self.snapshot()
        pages = self.m.allocate_pages(k)
        if pages is None:
            assert self.snapshot()[1:] == before[1:], "a refused allocate_pages changed the state"
            return
        for t in range(len(tokens)):  # the loaded K/V, written before the tree sees the pages
            self.pool[int(pages[t // self.ps]) * self.ps + t % self.ps] = (ns, tuple(tokens[: t + 1]))
        if self.m.stats().num_evicted_pages != before[0]["num_evicted_pages"]:
            existing = self.m.peek_prefix_len(tokens, namespace=ns) // self.ps  # what is still cached
        adopted = self.m.insert(tokens, pages, namespace=ns)
        assert adopted == k - existing, (adopted, k, existing)
        assert set(pages[k - adopted :].tolist()) <= set(self.m.cached_pages().tolist())
        self.offer(ns, tokens)
        self.held += pages[: k - adopted].tolist()  # the tree took over the adopted pages
        if not keep:
            self.release_held()

    @precondition(lambda self: self.held)
    @rule()
    def release_held(self) -> None:
        self.m.free_pages(self.held)
        self.held = []

    @rule()
    def reset_prefix_cache(self) -> None:
        stats = self.m.stats()
        dropped = self.m.reset_prefix_cache()
        assert dropped == stats.num_pages_cached + stats.num_pages_pinned
        after = self.m.stats()
        assert after.num_pages_cached == 0 and after.num_pages_pinned == 0
        self.pins = []

    @rule()
    def engine_step(self) -> None:
        self.step()

    def step(self, manual_upto: dict[int, int] | None = None) -> None:
        """One engine step: apply the queued copies as one batch, then write the reserved K/V."""
        owners = self.owners()
        held = {p: self.m.ref_count(p) - n for p, n in owners.items() if self.m.ref_count(p) != n}
        pairs = self.m.take_pending_copies()
        assert pairs.dtype == np.int32 and pairs.shape == (len(pairs), 2)
        src, dst = pairs[:, 0].tolist(), pairs[:, 1].tolist()
        # One valid copy_pages batch: distinct destinations, none of them a source, all real pages.
        assert len(set(dst)) == len(dst), f"a destination twice: {pairs.tolist()}"
        assert not set(dst) & set(src), f"a destination is also a source: {pairs.tolist()}"
        assert all(0 < p < self.num_pages for p in src + dst)
        # A copy lands only in a page someone still owns (a freed sequence's copies are cancelled).
        assert all(owners[d] > 0 for d in dst), f"a copy into an unowned page: {pairs.tolist()}"
        # Each queued pair held its source once, and nothing else holds a page beyond its owners.
        assert held == dict(Counter(src)), f"holds {held} for pairs {pairs.tolist()}"
        assert all(self.m.ref_count(p) == n for p, n in self.owners().items())
        reads = {
            (d, o): self.pool.get(s * self.ps + o)
            for s, d in zip(src, dst, strict=True)
            for o in range(self.ps)
        }
        for (d, o), kv in reads.items():
            if kv is None:
                self.pool.pop(d * self.ps + o, None)
            else:
                self.pool[d * self.ps + o] = kv
        for sid, seq in self.seqs.items():
            upto = seq.computable() if not seq.manual else (manual_upto or {}).get(sid, seq.written)
            pages = self.m.seq_pages(sid).tolist()
            for t in range(seq.written, upto):
                self.pool[pages[t // self.ps] * self.ps + t % self.ps] = (seq.ns, tuple(seq.tokens[: t + 1]))
            seq.written = max(seq.written, upto)
        for sid, seq in self.seqs.items():
            pages = self.m.seq_pages(sid).tolist()
            for t in range(seq.written):
                kv = self.pool.get(pages[t // self.ps] * self.ps + t % self.ps)
                assert kv is not None, f"sequence {sid} reads an unwritten slot at token {t}"
                writer, prefix = kv
                assert prefix == tuple(seq.tokens[: t + 1]), f"sequence {sid} reads another prefix at {t}"
                assert writer in (seq.ns, kvcore.PUBLIC_NAMESPACE), (
                    f"sequence {sid} of namespace {seq.ns!r} reads K/V written by {writer!r}"
                )

    def owners(self) -> dict[int, int]:
        """References each page should have: the tree's and each live sequence's."""
        owners = dict.fromkeys(range(1, self.num_pages), 0)
        for p in self.m.cached_pages().tolist():
            owners[p] += 1
        for sid in self.seqs:
            for p in self.m.seq_pages(sid).tolist():
                owners[p] += 1
        for p in self.held:
            owners[p] += 1
        assert self.m.caller_held_pages() == dict(Counter(self.held))
        return owners

    @rule(dt=st.floats(0, 60))
    def advance_clock(self, dt: float) -> None:
        self.clock.now += dt

    @rule(tokens=token_lists)
    def bad_calls(self, tokens: list[int]) -> None:
        before = self.snapshot()
        ghost = 10**9
        for call, error in [
            (lambda: self.m.append(ghost, tokens), UnknownSequenceError),
            (lambda: self.m.free_sequence(ghost), UnknownSequenceError),
            (lambda: self.m.fork(ghost, ghost + 1), UnknownSequenceError),
            (
                lambda: self.m.page_table([*(k for k, s in self.seqs.items() if s.slots), ghost]),
                UnknownSequenceError,
            ),
            (lambda: self.m.slot_mapping(ghost, 1), UnknownSequenceError),
            (lambda: self.m.commit(ghost, 0), UnknownSequenceError),
            (lambda: self.m.add_sequence(ghost, []), InvalidArgumentError),
            (lambda: self.m.add_sequence(ghost, [1, -2]), InvalidArgumentError),
            (lambda: self.m.add_sequence(ghost, np.array(tokens, dtype=np.float32)), InvalidDTypeError),
            (lambda: self.m.evict(-1), InvalidArgumentError),
        ]:
            try:
                call()
            except error:
                pass
            else:
                raise AssertionError(f"{error.__name__} not raised")
            assert self.snapshot() == before
        if self.seqs:
            sid = min(self.seqs)
            for call, error in [
                (lambda: self.m.add_sequence(sid, tokens), DuplicateSequenceError),
                (lambda: self.m.fork(sid, sid), DuplicateSequenceError),
                (lambda: self.m.slot_mapping(sid, self.seqs[sid].slots + 1), InvalidArgumentError),
                (lambda: self.m.commit(sid, self.seqs[sid].computable() + 1), InvalidArgumentError),
            ]:
                try:
                    call()
                except error:
                    pass
                else:
                    raise AssertionError(f"{error.__name__} not raised")
                assert self.snapshot() == before

    # ----- invariants -----

    @invariant()
    def page_tables_cover_exactly_the_tokens(self) -> None:
        if not hasattr(self, "m"):
            return
        for sid in self.seqs:
            assert self.m.seq_len(sid) == len(self.seqs[sid].tokens)
            assert self.m.num_reserved(sid) == self.seqs[sid].slots
            if self.seqs[sid].slots == 0:
                try:
                    self.m.page_table([sid])
                except InvalidArgumentError:
                    pass
                else:
                    raise AssertionError("a table of a sequence without slots did not raise")
        ids = sorted(k for k, s in self.seqs.items() if s.slots > 0)
        pt = self.m.page_table(ids)
        assert pt.kv_indptr.dtype == pt.kv_indices.dtype == pt.kv_last_page_len.dtype == np.int32
        assert len(pt.kv_indptr) == len(ids) + 1 and pt.kv_indptr[0] == 0
        for i, sid in enumerate(ids):
            n = self.seqs[sid].slots
            pages = pt.kv_indices[pt.kv_indptr[i] : pt.kv_indptr[i + 1]]
            assert len(pages) == -(-n // self.ps)
            assert pt.kv_last_page_len[i] == n - (len(pages) - 1) * self.ps
            assert pages.tolist() == self.m.seq_pages(sid).tolist()
            assert (pages > 0).all()
            slots = self.m.slot_mapping(sid, n)
            assert slots.dtype == np.int64
            expected = pages.astype(np.int64).repeat(self.ps)[:n] * self.ps + np.arange(n) % self.ps
            assert slots.tolist() == expected.tolist()

    @invariant()
    def events_index_exactly_the_cached_pages(self) -> None:
        if not hasattr(self, "m"):
            return
        for e in self.m.take_events():
            if isinstance(e, PageStored):
                assert e.medium == "hbm" and len(e.keys) == len(e.pages)
                assert e.parent_key is None or e.parent_key in self.router, "orphan stored page"
                for k, p in zip(e.keys, e.pages.tolist(), strict=True):
                    assert k not in self.router
                    self.router[k] = p
            elif isinstance(e, PageRemoved):
                for k, p in zip(e.keys, e.pages.tolist(), strict=True):
                    assert self.router.pop(k) == p
            else:
                assert isinstance(e, AllCleared)
                self.router.clear()
        assert sorted(self.router.values()) == sorted(self.m.cached_pages().tolist())
        cached = set(self.m.cached_pages().tolist())
        for sid in self.seqs:
            pages = self.m.seq_pages(sid).tolist()
            for key, page in zip(self.m.page_keys(sid).tolist(), pages, strict=False):
                if page in cached:
                    assert self.router.get(bytes(key)) == page, "a cached page the router cannot find"

    @invariant()
    def ref_counts_equal_owners(self) -> None:
        if not hasattr(self, "m"):
            return
        tree = set(self.m.cached_pages().tolist())
        refs = {p: self.m.ref_count(p) for p in range(1, self.num_pages)}
        for p, n in self.owners().items():
            # Beyond its owners a page is held only as the source of queued copies (checked by step).
            assert refs[p] >= n, f"page {p}: {refs[p]} refs, {n} owners"
            assert n > 0 or refs[p] == 0 or p not in tree
        stats = self.m.stats()
        assert stats.num_pages_free == sum(1 for n in refs.values() if n == 0)
        split = (
            stats.num_pages_in_use + stats.num_pages_cached + stats.num_pages_pinned + stats.num_pages_free
        )
        assert split == stats.num_pages_total == self.num_pages - 1
        assert stats.num_sequences == len(self.seqs)
        assert stats.num_pages_cached + stats.num_pages_pinned <= len(tree)

    @invariant()
    def locked_and_pinned_pages_stay_cached(self) -> None:
        if not hasattr(self, "m"):
            return
        tree = set(self.m.cached_pages().tolist())
        for seq in self.seqs.values():
            assert seq.tree_pages <= tree, "a page locked by a live sequence was evicted"
        for sid, seq in self.seqs.items():
            seq.tree_pages |= set(self.m.seq_pages(sid).tolist()) & tree
        self.pins = [p for p in self.pins if p[2] > self.clock.now]
        for ns, prefix, _ in self.pins:
            assert self.m.peek_prefix_len(list(prefix), namespace=ns) >= len(prefix), (
                "a pinned page was evicted"
            )

    @invariant()
    def same_prefix_same_tree_page(self) -> None:
        """Two live sequences of one namespace holding tree pages for the same prefix hold the same page.

        Prefixes also offered publicly are skipped: a tenant may hold a private copy made before the
        public one existed, and the longer of the two paths wins a lookup.
        """
        if not hasattr(self, "m"):
            return
        tree = set(self.m.cached_pages().tolist())
        public = self.offered[kvcore.PUBLIC_NAMESPACE]
        seen: dict[tuple[object, ...], int] = {}
        for sid, seq in self.seqs.items():
            pages = self.m.seq_pages(sid).tolist()
            for k in range(seq.computable() // self.ps):
                prefix = tuple(seq.tokens[: (k + 1) * self.ps])
                if pages[k] in tree and prefix not in public:
                    key = (seq.ns, prefix)
                    assert seen.setdefault(key, pages[k]) == pages[k], f"two cached pages for {key}"


ManagerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestManagerMachine = ManagerMachine.TestCase
