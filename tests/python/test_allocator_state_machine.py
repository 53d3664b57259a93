"""A Hypothesis state machine drives PageAllocator against a dict model, bad calls included."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcore import DoubleFreeError, InvalidArgumentError, InvalidPageError, PageAllocator


class AllocatorMachine(RuleBasedStateMachine):
    """Model: page -> references for every held page; every other page is free."""

    @initialize(num_pages=st.integers(1, 40), num_shards=st.integers(1, 4))
    def setup(self, num_pages: int, num_shards: int) -> None:
        self.alloc = PageAllocator(num_pages, num_shards=num_shards)
        self.num_pages = num_pages
        self.refs: dict[int, int] = {}

    def free_count(self) -> int:
        return self.num_pages - 1 - len(self.refs)

    def state(self) -> tuple[int, list[int]]:
        return self.alloc.num_free, [self.alloc.ref_count(p) for p in range(1, self.num_pages)]

    @rule(n=st.integers(0, 45))
    def allocate(self, n: int) -> None:
        if n > self.num_pages - 1:
            before = self.state()
            try:
                self.alloc.allocate(n)
            except InvalidArgumentError:
                assert self.state() == before
                return
            raise AssertionError("allocate beyond the pool did not raise")
        pages = self.alloc.allocate(n)
        if n > self.free_count():
            assert pages is None
            return
        assert pages is not None and pages.dtype == np.int32 and len(pages) == n
        for p in pages.tolist():
            assert p not in self.refs, f"page {p} handed out twice"
            assert 1 <= p < self.num_pages
            self.refs[p] = 1

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def retain(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.refs)), max_size=5))
        self.alloc.retain(np.array(pages, dtype=np.int32))
        for p in pages:
            self.refs[p] += 1

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.refs)), max_size=6))
        want: dict[int, int] = {}
        for p in pages:
            want[p] = want.get(p, 0) + 1
        legal = all(self.refs[p] >= k for p, k in want.items())
        before = self.state()
        try:
            self.alloc.free(pages)
        except DoubleFreeError:
            assert not legal
            assert self.state() == before
            return
        assert legal
        for p, k in want.items():
            self.refs[p] -= k
            if self.refs[p] == 0:
                del self.refs[p]

    @rule(page=st.integers(-3, 45), op=st.sampled_from(["free", "retain"]))
    def bad_call(self, page: int, op: str) -> None:
        if page in self.refs:
            return
        before = self.state()
        try:
            getattr(self.alloc, op)([page])
        except InvalidPageError:  # DoubleFreeError is a subclass
            assert self.state() == before
            return
        raise AssertionError(f"{op}([{page}]) of an unheld page did not raise")

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "alloc"):
            return
        assert self.alloc.num_free == self.free_count()
        for p in range(1, self.num_pages):
            assert self.alloc.ref_count(p) == self.refs.get(p, 0)


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase
