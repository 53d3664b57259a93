"""Bounded caches: KV-cache groups with sliding windows, StreamingLLM sinks, heavy-hitter compaction.

The main check drives a manager with random admissions, appends, forks, truncations, frees and
evictions while emulating the engine: every computed token's slot in every group is written with a
value that identifies its context (namespace, the tokens up to it), copy-on-write pairs are applied
before each write, and after every call each kept page must hold what its sequence expects: prefix
hits (per group), copies and windows are checked against that model, not against the manager's own
bookkeeping. Reference counts, the usage split and the window bound are checked beside it.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import numpy as np
import pytest

import kvcore
from kvcore import InvalidArgumentError, KVCacheManager


def _value(ns: str | None, tokens: list[int]) -> int:
    h = hashlib.blake2b(repr((ns, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


class Engine:
    """Emulates an engine over a manager: writes each computed token's slot in every group."""

    def __init__(self, m: KVCacheManager, ps: int) -> None:
        self.m, self.ps = m, ps
        self.ngroups = len(m.groups)
        self.pool: dict[int, dict[int, int]] = {}
        self.seqs: dict[int, tuple[str | None, list[int]]] = {}

    def apply_copies(self) -> None:
        for src, dst in self.m.take_pending_copies():
            self.pool[int(dst)] = dict(self.pool.get(int(src), {}))

    def compute(self, sid: int, start: int, end: int) -> None:
        """The engine computes tokens [start, end) of `sid` (after applying queued copies)."""
        self.apply_copies()
        ns, toks = self.seqs[sid]
        if end <= start:
            return
        for g in range(self.ngroups):
            slots = self.m.slot_mapping(sid, end - start, start, group=g)
            for t, slot in zip(range(start, end), slots.tolist(), strict=True):
                page, off = divmod(slot, self.ps)
                self.pool.setdefault(page, {})[off] = _value(ns, toks[: t + 1])

    def add(self, sid: int, tokens: list[int], ns: str | None, **kw: object) -> int | None:
        hit = self.m.add_sequence(sid, tokens, ns, **kw)
        if hit is not None:
            self.seqs[sid] = (ns, list(tokens))
            self.compute(sid, hit, len(tokens))
        return hit

    def append(self, sid: int, tokens: list[int]) -> bool:
        ok = self.m.append(sid, tokens)
        if ok:
            toks = self.seqs[sid][1]
            old = len(toks)
            toks.extend(tokens)
            self.compute(sid, old, len(toks))
        return ok

    def check(self) -> None:
        m, ps = self.m, self.ps
        self.apply_copies()
        refs: Counter[int] = Counter()
        for sid, (ns, toks) in self.seqs.items():
            tables = [m.seq_pages(sid, group=g).tolist() for g in range(self.ngroups)]
            held = [p for t in tables for p in t if p]
            assert len(held) == len(set(held)), "a page twice in one sequence's tables"
            refs.update(held)
            for g, table in enumerate(tables):
                for i, page in enumerate(table):
                    if not page:
                        continue
                    for off in range(ps):
                        t = i * ps + off
                        if t >= len(toks):
                            break
                        got = self.pool.get(page, {}).get(off)
                        assert got == _value(ns, toks[: t + 1]), f"seq {sid} group {g} token {t}: wrong K/V"
        refs.update(int(p) for p in m.cached_pages())
        for page, n in refs.items():
            assert m.ref_count(page) == n, f"page {page}: {m.ref_count(page)} refs, {n} owners"
        s = m.stats()
        assert (
            s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free
            == s.num_pages_total
        )
        assert s.num_pages_total - s.num_pages_free == len(refs)


def _check_windows(m: KVCacheManager, sid: int, n: int, computed: int, ps: int) -> None:
    """A window group keeps exactly the pages holding a key a query at `computed` or later reads."""
    for g, w in enumerate(m.groups):
        table = m.seq_pages(sid, group=g)
        assert len(table) == -(-n // ps)
        for i, page in enumerate(table.tolist()):
            last_pos = (i + 1) * ps - 1  # the page's last token
            needed = w is None or last_pos >= computed - w + 1
            assert (page != 0) == needed, f"group {g} (window {w}) page {i} at {computed} computed"


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("groups", [[8, None], [None, 5, 12], [6], [4, 4, None, None]])
def test_random_calls_keep_every_kept_page_right(seed: int, groups: list[int | None]) -> None:
    rng = random.Random(seed * 31 + len(groups))
    ps = 4
    m = KVCacheManager(rng.choice([40, 70, 120]), ps, groups=groups)
    e = Engine(m, ps)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    next_id = 0
    for _ in range(160):
        live = list(e.seqs)
        op = rng.random()
        if op < 0.3 or not live:
            base = list(rng.choice(prefixes))
            tokens = base + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
            e.add(next_id, tokens, rng.choice([None, "b"]))
            next_id += 1
        elif op < 0.65:
            sid = rng.choice(live)
            e.append(sid, [rng.randrange(1, 50) for _ in range(rng.choice([1, 1, 1, 3]))])
        elif op < 0.72:
            sid = rng.choice(live)
            m.fork(sid, next_id)
            e.seqs[next_id] = (e.seqs[sid][0], list(e.seqs[sid][1]))
            next_id += 1
        elif op < 0.8:
            sid = rng.choice(live)
            toks = e.seqs[sid][1]
            n = len(toks) - rng.randrange(1, 3)
            if n >= 1:
                try:
                    m.truncate(sid, n)
                    del toks[n:]
                except InvalidArgumentError:
                    pass  # pages that tokens from n on would read were released: refused, unchanged
        elif op < 0.95:
            sid = rng.choice(live)
            m.free_sequence(sid)
            del e.seqs[sid]
        else:
            m.evict(rng.randrange(1, 10))
        e.check()


def test_window_group_keeps_exactly_the_window() -> None:
    ps = 4
    m = KVCacheManager(200, ps, groups=[10, None])
    e = Engine(m, ps)
    e.add(1, list(range(1, 30)), None)
    _check_windows(m, 1, 29, 0, ps)
    for t in range(60):
        assert e.append(1, [t + 100])
        n = 29 + t + 1
        _check_windows(m, 1, n, n - 1, ps)
    e.check()


def test_mistral_geometry_32k_tokens_hold_a_bounded_table() -> None:
    """Mistral 7B v0.1: every layer a 4,096-token window, pages of 16: at most ceil(4096/16) + 1."""
    ps, n = 16, 32768
    m = KVCacheManager(3000, ps, groups=[4096])
    full = KVCacheManager(3000, ps)
    for mgr in (m, full):
        mgr.add_sequence(1, [1, 2, 3])
    most = 0
    for t in range(3, n):
        assert m.append(1, [t % 30000 + 1])
        assert full.append(1, [t % 30000 + 1])
        if t % 64 == 0 or t > n - 40:
            most = max(most, int(np.count_nonzero(m.seq_pages(1))))
    assert most == 4096 // ps + 1
    assert m.stats().num_pages_in_use <= 4096 // ps + 1
    assert len(full.seq_pages(1)) == n // ps == 2048
    assert full.stats().num_pages_in_use == 2048


def test_chunked_prefill_holds_the_window_plus_the_chunk() -> None:
    ps, w, chunk = 16, 256, 64
    m = KVCacheManager(400, ps, groups=[w])
    prompt = list(range(1, 4001))
    assert m.add_sequence(1, prompt, cache_prompt=False, reserve=chunk) == 0
    done = chunk
    while done < len(prompt):
        m.commit(1, done)
        k = min(chunk, len(prompt) - done)
        assert m.reserve(1, k)
        done += k
        held = int(np.count_nonzero(m.seq_pages(1)))
        assert held <= -(-(w + chunk) // ps) + 1


def test_hybrid_hits_survive_window_eviction() -> None:
    """Gemma-style hybrid (a window group and a full group): the hit needs only the window's pages
    before the hit point, so multi-turn hits stay high where requiring every window page (vLLM's
    pitfall) would give 0."""
    ps, w = 16, 64
    m = KVCacheManager(160, ps, groups=[w, None])
    convo = list(range(1, 401))
    hits = []
    for turn in range(6):
        sid = turn
        hit = m.add_sequence(sid, convo)
        assert hit is not None
        hits.append(hit / len(convo))
        for t in range(20):
            assert m.append(sid, [1000 + turn * 50 + t])
        convo = convo + [1000 + turn * 50 + t for t in range(20)] + [2000 + turn * 10 + i for i in range(30)]
        m.free_sequence(sid)
        # Another tenant's traffic pushes the pool: window pages far from any hit point go first.
        m.add_sequence(100 + turn, [5000 + turn] * 600, "other")
        m.free_sequence(100 + turn)
    assert hits[0] == 0
    assert min(hits[1:]) > 0.5, hits
    # The window group needed only its last pages: its own hit equals the full group's.
    m.add_sequence(99, convo)
    hit = m.prefix_hit(99)
    assert hit.num_tokens > 0 and hit.reason in ("primary_miss", "full")
    assert hit.group_tokens[0] >= hit.num_tokens


def test_hit_reason_names_missing_window_pages() -> None:
    ps = 4
    m = KVCacheManager(35, ps, groups=[8, None])  # 34 usable pages
    m.add_sequence(1, list(range(1, 10)))
    for t in range(32):
        assert m.append(1, [100 + t])  # 41 tokens: window pages 0..7 released (cached, evictable)
    tokens = m.seq_len(1)
    assert tokens == 41 and m.stats().num_pages_cached == 8
    # Another tenant takes every free page and every evictable one: the released window pages.
    assert m.add_sequence(2, [7] * 40, "other") == 0
    assert m.stats().num_pages_cached == 0
    m.free_sequence(2)
    prompt = [*range(1, 10), *range(100, 128), 999]
    assert m.peek_prefix_len(prompt) == 0  # the full group holds 9 pages of it, the window none
    assert m.add_sequence(3, prompt) == 0
    hit = m.prefix_hit(3)
    assert hit.reason == "window_pages_missing"
    assert hit.group_tokens == [0, 36]
    m.free_sequence(3)
    assert m.add_sequence(4, [*range(1, 10), *range(100, 131), 5]) == 40
    assert m.prefix_hit(4).reason == "full"
    assert m.add_sequence(5, [9] * 5) == 0
    assert m.prefix_hit(5).reason == "primary_miss"


def test_window_only_model_hits_through_its_group_cache() -> None:
    ps = 4
    m = KVCacheManager(100, ps, groups=[8])
    m.add_sequence(1, list(range(1, 30)))
    for t in range(10):
        m.append(1, [t + 50])
    m.free_sequence(1)
    prompt = list(range(1, 30)) + [t + 50 for t in range(10)] + [1]
    assert m.add_sequence(2, prompt) == 36
    assert m.prefix_hit(2) == kvcore.PrefixHit(36, [36], "full")
    table = m.seq_pages(2)
    assert np.count_nonzero(table[: 36 // ps]) == 2  # only the window's pages were taken
    assert m.match_prefix(prompt).num_tokens == 40  # its own last page is cached now


def test_namespaces_never_share_group_pages() -> None:
    ps = 4
    m = KVCacheManager(100, ps, groups=[8, None])
    m.add_sequence(1, list(range(1, 30)), "a")
    m.free_sequence(1)
    assert m.add_sequence(2, list(range(1, 30)), "b") == 0
    assert m.add_sequence(3, list(range(1, 30)), "a") == 28


def test_streaming_keeps_sinks_and_recent_tokens_and_stays_private() -> None:
    ps = 4
    m = KVCacheManager(200, ps)
    e = Engine(m, ps)
    e.add(1, list(range(1, 11)), None, sink_tokens=4, recent_tokens=8)
    for t in range(40):
        assert e.append(1, [t + 100])
    table = m.seq_pages(1)
    n = 50
    computed = n - 1
    for i, page in enumerate(table.tolist()):
        kept = i < 1 or (i + 1) * ps - 1 >= computed - 8 + 1
        assert (page != 0) == kept
    pt = m.page_table([1], compact=True)
    pos = m.positions([1])
    assert len(pos) == (len(pt.kv_indices) - 1) * ps + int(pt.kv_last_page_len[0])
    assert pos.tolist() == [0, 1, 2, 3, *range(40, 50)]
    assert m.stats().num_pages_in_use == np.count_nonzero(table)
    e.check()
    # Its own pages are private: nothing past its (empty) hit was cached.
    m.free_sequence(1)
    assert m.peek_prefix_len(list(range(1, 11)) + [100 + t for t in range(40)]) == 0


def test_compact_drops_the_lowest_scores_between_sinks_and_recent() -> None:
    ps = 4
    m = KVCacheManager(200, ps)
    e = Engine(m, ps)
    e.add(1, list(range(1, 41)), None)  # 10 pages
    scores = np.array([5, 1, 9, 0.5, 7, 3, 8, 0.1, 6, 4], dtype=np.float32)
    assert m.compact(1, scores, 6, sink_tokens=4, recent_tokens=8) == 4
    table = m.seq_pages(1)
    dropped = [i for i, p in enumerate(table.tolist()) if p == 0]
    assert dropped == [1, 3, 5, 7]  # lowest among pages 1..7 (page 0 sinks, 8..9 recent)
    pos = m.positions([1])
    assert pos.tolist() == [t for i in range(10) if i not in dropped for t in range(i * 4, i * 4 + 4)]
    e.check()
    # Scores given for the kept pages only (the compacted table's order).
    kept = np.array([3.0, 1.0, 2.0, 0.0, 9.0, 9.0], dtype=np.float32)
    assert m.compact(1, kept, 5) == 1
    assert m.seq_pages(1).tolist()[6] == 0
    with pytest.raises(InvalidArgumentError):
        m.compact(1, np.ones(3, np.float32), 2)
    with pytest.raises(InvalidArgumentError):
        m.compact(1, np.full(10, np.nan, np.float32), 2)
    # Appended pages after compaction are private.
    for t in range(8):
        assert e.append(1, [200 + t])
    e.check()
    toks = e.seqs[1][1]
    m.free_sequence(1)
    assert m.peek_prefix_len(toks) <= 40


def test_compact_never_releases_a_streaming_sequences_own_sinks() -> None:
    # A StreamingLLM sequence with 8 sink tokens (2 pages) and a long recent window: a compaction
    # that names no sinks still keeps its 2 sink pages, however low their scores.
    ps = 4
    m = KVCacheManager(200, ps)
    e = Engine(m, ps)
    e.add(1, list(range(1, 41)), None, sink_tokens=8, recent_tokens=1000)  # 10 pages, none released
    scores = np.array([0, 0, 9, 1, 9, 2, 9, 3, 9, 9], dtype=np.float32)
    assert m.compact(1, scores, 7) == 3
    dropped = [i for i, p in enumerate(m.seq_pages(1).tolist()) if p == 0]
    assert dropped == [3, 5, 7]  # the lowest but the sinks (0, 1)
    assert m.compact(1, np.zeros(7, np.float32), 2, sink_tokens=4) == 4
    assert [i for i, p in enumerate(m.seq_pages(1).tolist()) if p != 0] == [0, 1, 9]
    e.check()


def test_truncate_into_a_released_window_is_refused_unchanged() -> None:
    ps = 4
    m = KVCacheManager(100, ps, groups=[8, None])
    m.add_sequence(1, list(range(1, 9)))
    for t in range(20):
        m.append(1, [t + 10])
    before = [m.seq_pages(1, group=g).tolist() for g in range(2)]
    with pytest.raises(InvalidArgumentError, match="released"):
        m.truncate(1, 10)
    assert [m.seq_pages(1, group=g).tolist() for g in range(2)] == before
    m.truncate(1, 27)  # a rejected draft: fine
    with pytest.raises(InvalidArgumentError, match="released"):
        m.slot_mapping(1, 1, 0, group=0)


def test_hostile_group_arguments() -> None:
    for bad in ([0], "ab", [], [1.5], [-3], [None] * 65):
        with pytest.raises((InvalidArgumentError, kvcore.InvalidDTypeError, TypeError)):
            KVCacheManager(10, 4, groups=bad)
    with pytest.raises(InvalidArgumentError):
        KVCacheManager(10, 4, groups=[8, None], lower_tiers=[("host", 8)])
    m = KVCacheManager(50, 4, groups=[8, None])
    m.add_sequence(1, [1, 2, 3, 4, 5])
    for call in (
        lambda: m.seq_pages(1, group=2),
        lambda: m.page_table([1], group=5),
        lambda: m.block_table([1], group=9),
        lambda: m.positions([1], group=2),
        lambda: m.add_sequence(2, [1, 2], sink_tokens=4),
        lambda: m.add_sequence(2, [1, 2], sink_tokens=4, recent_tokens=0),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert 2 not in m.seq_ids()
    pages = m.allocate_pages(1)
    with pytest.raises(InvalidArgumentError):
        m.insert([1, 2, 3, 4], pages)
    m.free_pages(pages)


def test_tables_per_group_feed_the_block_and_csr_formats() -> None:
    ps = 4
    m = KVCacheManager(100, ps, groups=[8, None])
    m.add_sequence(1, list(range(1, 30)))
    for g in range(2):
        pt = m.page_table([1], group=g)
        assert pt.kv_indices.tolist() == m.seq_pages(1, group=g).tolist()
        bt = m.block_table([1], group=g)
        assert bt[0].tolist() == m.seq_pages(1, group=g).tolist()
    for t in range(12):
        m.append(1, [t])
    pt = m.page_table([1], group=0, compact=True)
    assert 0 not in pt.kv_indices.tolist()
    assert len(m.positions([1], group=0)) == (len(pt.kv_indices) - 1) * ps + int(pt.kv_last_page_len[0])


@pytest.mark.parametrize(
    "model",
    ["mistral-7b", "gemma-2-9b", "gemma-3-1b", "gpt-oss-20b", "../shared/data/configs/gemma-2-27b.json"],
)
def test_plan_concurrency_is_what_the_manager_holds(model: str) -> None:
    """`kvcore plan` says R requests of C tokens fit: a manager built from the plan holds R such
    sequences, and one more does not fit. The plan counts each window at its widest (a window of W
    tokens not aligned to pages spans `(W - 2) // page_size + 2` pages), which a sequence growing to
    C tokens reaches at C - 1 tokens: grown there, R fit and R + 1 do not."""
    from pathlib import Path

    from kvcore.sizing import plan

    if model.endswith(".json"):
        path = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "configs" / Path(model).name
        if not path.exists():
            pytest.skip("shared configs not beside the checkout")
        model = str(path)
    context = 4096
    p = plan(model, gpu=3 << 30, weight_bytes=1 << 30, reserve_bytes=0, context_len=context)
    r = p.max_requests_at_context
    assert r is not None and 1 <= r < 256
    m = KVCacheManager(**p.manager_kwargs())
    assert m.groups == list(p.group_windows)

    def grow(sid: int) -> bool:
        if m.add_sequence(sid, [sid * 100000 + 1, sid * 100000 + 2]) is None:
            return False
        return all(m.append(sid, [sid * 100000 + 3 + t]) for t in range(context - 3))

    for sid in range(r):
        assert grow(sid), f"request {sid} of the plan's {r} does not fit"
    assert not grow(r), "one more request than the plan fits"
