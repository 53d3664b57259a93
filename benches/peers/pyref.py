"""pyref: the pure-Python floor that ``harness.py`` measures kvcore and the peers against.

Stdlib only. vLLM's design with nothing optional: a free list (a Python list used as a stack), a dict
from a chained page hash ``hash((parent_hash, tuple(16 tokens)))`` to the page holding it, and an
``OrderedDict`` LRU of the cached pages no request holds. Python's 64-bit tuple hash is not collision
resistant: fine for a speed floor, not for a real cache.

Self-test: ``python3 benches/peers/pyref.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PyAllocator", "PyPrefixCache"]


class PyAllocator:
    """Pages ``1..num_pages-1`` (page 0 is the null page) on a list used as a stack; all or nothing."""

    def __init__(self, num_pages: int) -> None:
        self.free_list: list[int] = list(range(num_pages - 1, 0, -1))

    def allocate(self, n: int) -> list[int] | None:
        fl = self.free_list
        if n > len(fl):
            return None
        out = fl[-n:]
        del fl[-n:]
        return out

    def free(self, pages: list[int]) -> None:
        self.free_list += pages

    @property
    def num_free(self) -> int:
        return len(self.free_list)


class PyPrefixCache:
    """Prefix cache over ``num_pages`` pages (page 0 reserved), ``page_size`` tokens a page.

    ``serve(tokens)`` is one sequential-mode request: match the longest cached prefix (whole pages, at
    most ``len - 1`` tokens, as vLLM), pin it, allocate the rest (evicting LRU cached pages when short),
    cache the prompt's full pages, release. It returns the matched tokens, or None when the request
    cannot fit even after evicting (then nothing changed).
    """

    def __init__(self, num_pages: int, page_size: int = 16) -> None:
        self.page_size = page_size
        self.num_pages = num_pages - 1
        self.free_list: list[int] = list(range(num_pages - 1, 0, -1))
        self.ref = [0] * num_pages
        self.hash_of: list[int | None] = [None] * num_pages
        self.cached: dict[int, int] = {}  # chained hash -> page
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached pages with ref 0, oldest first
        self.num_evicted = 0

    def _evict_one(self) -> None:
        page, _ = self.lru.popitem(last=False)
        h = self.hash_of[page]
        if h is not None:
            del self.cached[h]
            self.hash_of[page] = None
        self.free_list.append(page)
        self.num_evicted += 1

    def evict(self, n: int) -> int:
        """Evict up to ``n`` cached unreferenced pages, least recently used first."""
        n = min(n, len(self.lru))
        for _ in range(n):
            self._evict_one()
        return n

    def serve(self, tokens: Sequence[int]) -> int | None:
        ps = self.page_size
        n = len(tokens)
        nfull = n // ps
        hashes: list[int] = []
        parent = 0
        for i in range(0, nfull * ps, ps):
            parent = hash((parent, tuple(tokens[i : i + ps])))
            hashes.append(parent)
        # Match: whole pages, at most n - 1 tokens.
        cached, ref, lru = self.cached, self.ref, self.lru
        limit = (n - 1) // ps
        pages: list[int] = []
        for h in hashes[:limit]:
            page = cached.get(h)
            if page is None:
                break
            pages.append(page)
        hit = len(pages)
        for page in pages:
            if ref[page] == 0:
                del lru[page]
            ref[page] += 1
        need = -(-n // ps) - hit
        short = need - len(self.free_list)
        if short > 0:
            if short > len(lru):
                self._release(pages)
                return None
            for _ in range(short):
                self._evict_one()
        fl = self.free_list
        new = fl[-need:] if need else []
        del fl[len(fl) - need :]
        hash_of = self.hash_of
        for page in new:
            ref[page] = 1
        for page, h in zip(new, hashes[hit:], strict=False):
            if h not in cached:  # a full page past the n - 1 cap may already be cached: keep that one
                cached[h] = page
                hash_of[page] = h
        pages += new
        self._release(pages)
        return hit * ps

    def _release(self, pages: list[int]) -> None:
        # Reverse order, so a sequence's tail pages are evicted before its head (as vLLM).
        ref, lru, hash_of, fl = self.ref, self.lru, self.hash_of, self.free_list
        for page in reversed(pages):
            ref[page] -= 1
            if ref[page] == 0:
                if hash_of[page] is not None:
                    lru[page] = None
                else:
                    fl.append(page)

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    @property
    def num_in_use(self) -> int:
        return self.num_pages - len(self.free_list) - len(self.lru)


def _self_test() -> None:
    a = PyAllocator(11)
    p = a.allocate(4)
    assert p is not None and len(set(p)) == 4 and 0 not in p and a.num_free == 6
    assert a.allocate(7) is None
    a.free(p)
    assert a.num_free == 10

    c = PyPrefixCache(11, page_size=4)
    assert c.serve(list(range(10))) == 0  # 3 pages, 2 full pages cached
    assert c.num_cached == 2 and c.num_free == 8
    assert c.serve(list(range(10))) == 8
    assert c.serve(list(range(8))) == 4  # at most len - 1 tokens
    assert c.serve(list(range(100, 144))) is None  # 11 pages never fit in 10
    assert c.num_in_use == 0 and c.num_cached == 2
    assert c.serve(list(range(100, 136))) == 0  # 9 pages, 8 free: evicts the LRU cached page
    assert c.num_evicted == 1 and c.num_cached == 10 and c.num_free == 0
    assert c.serve(list(range(10))) == 4  # the tail page went first: the head page is still cached
    assert c.num_in_use == 0 and c.num_free + len(c.lru) == 10
    c.evict(100)
    assert c.num_free == 10 and c.num_cached == 0
    print("pyref self-test ok")


if __name__ == "__main__":
    _self_test()
