"""Replays of the real Mooncake FAST'25 traces against an independent brute-force model.

Each 512-token block is 32 pages of 16 tokens whose ids come from its hash id; requests are fed in
order and freed after their prompt; LRU at 10,000 and 50,000 blocks' worth of pages. The model is an
OrderedDict over chained page keys ``(hash id, page in block)``: a request's lookup is the longest run
of its pages present; its pages are then touched deepest first (so a page is always more recent than
the pages after it, and the least recent page is always a leaf, as in the manager's tree); missing pages
evict the least recent ones, never the matched prefix. Its hit counts and evictions must equal the
manager's exactly.

The traces are third-party data kept outside the repository (../shared/data/traces); without them
these tests are skipped.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from itertools import repeat, starmap, takewhile
from pathlib import Path

import numpy as np
import pytest

from kvcore import KVCacheManager
from kvcore.replay import ReplayConfig, Trace, read_trace, replay

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
CONVERSATION = TRACES / "conversation_trace.jsonl"
BLOCK = 512
PAGE = 16
PAGES_PER_BLOCK = BLOCK // PAGE

pytestmark = pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not available")


@pytest.fixture(scope="module")
def conversation() -> Trace:
    return read_trace(CONVERSATION)


def lru_model(trace: Trace, capacity_pages: int) -> tuple[int, int, int, int]:
    """(uncapped hit tokens, capped hit tokens, evicted pages, refused requests) of an LRU page cache.

    The per-page loops run through itertools (C speed), which keeps the model readable and the test
    short; the semantics are those of the plain loops in the comments.
    """
    cache: OrderedDict[int, None] = OrderedDict()  # page key -> None, least recent first
    hits = capped_hits = evicted = refused = 0
    offsets = np.arange(PAGES_PER_BLOCK, dtype=np.int64)
    for i in range(trace.num_requests):
        n = int(trace.input_lens[i])
        full = n // PAGE
        keys = (trace.prompt_ids(i)[:, None] * PAGES_PER_BLOCK + offsets).ravel()[:full].tolist()
        # matched = length of the longest prefix of keys that is cached
        matched = len(list(takewhile(cache.__contains__, keys)))
        capped = min(matched, (n - 1) // PAGE)  # the engine computes at least the last token
        # the lookup refreshes the matched prefix, deepest first: for k in reversed(...): move_to_end(k)
        consume(map(cache.move_to_end, reversed(keys[:capped])))
        need = -(-n // PAGE) - capped
        if need > capacity_pages - capped:  # even evicting every unlocked page is not enough
            refused += 1
            continue
        short = need - (capacity_pages - len(cache))
        if short > 0:  # evict the least recent pages: for _ in range(short): popitem(last=False)
            consume(starmap(cache.popitem, repeat((False,), short)))
            evicted += short
        # cache the prompt's full pages, touched deepest first: new pages (not cached, so deeper than
        # every cached one) are added in reverse order, then the cached prefix is moved after them.
        present = len(list(takewhile(cache.__contains__, keys[:matched])))
        cache.update(zip(reversed(keys[present:]), repeat(None)))
        consume(map(cache.move_to_end, reversed(keys[:present])))
        hits += matched * PAGE
        capped_hits += capped * PAGE
    return hits, capped_hits, evicted, refused


def consume(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)


def manager_direct(trace: Trace, capacity_pages: int) -> tuple[int, int, int]:
    """The manager fed by hand: tokens of block h are h * 512 + [0, 512), int32; free after the prompt."""
    m = KVCacheManager(capacity_pages + 1, page_size=PAGE, eviction="lru")
    ramp = np.arange(BLOCK, dtype=np.int32)
    uncapped = 0
    for i in range(trace.num_requests):
        n = int(trace.input_lens[i])
        tokens = (trace.prompt_ids(i).astype(np.int32)[:, None] * BLOCK + ramp).ravel()[:n]
        whole = m.peek_prefix_len(tokens)
        assert m.add_sequence(i, tokens) is not None
        uncapped += whole
        m.free_sequence(i)
    s = m.stats()
    assert s.num_pages_in_use == 0 and s.num_sequences == 0
    return uncapped, s.prefix_hit_tokens, s.num_evicted_pages


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [10_000, 50_000])
def test_conversation_lru_equals_the_model(conversation: Trace, blocks: int) -> None:
    pages = blocks * PAGES_PER_BLOCK
    hits, capped, evicted, refused = lru_model(conversation, pages)
    assert refused == 0
    result = replay(conversation, ReplayConfig(capacity_pages=pages, page_size=PAGE, policy="lru"))
    assert (result.hit_tokens, result.prefill_tokens_saved, result.num_evicted_pages) == (
        hits,
        capped,
        evicted,
    )
    assert result.num_served == conversation.num_requests
    assert result.hit_rate_tokens == pytest.approx(hits / conversation.num_prompt_tokens, abs=0)
    if blocks == 10_000:
        # The same through the bare manager API, with int32 tokens built here.
        assert manager_direct(conversation, pages) == (hits, capped, evicted)


@pytest.mark.slow
def test_conversation_with_unlimited_cache_reaches_the_ideal(conversation: Trace) -> None:
    """With room for every block, 512-token pages hit every block seen before, except partial last
    blocks (never cached: only full pages are). Counted here from the ids alone."""
    r = replay(conversation, ReplayConfig(capacity_pages=200_000, page_size=BLOCK, policy="lru"))
    seen: set[int] = set()
    expected = 0
    for i in range(conversation.num_requests):
        ids = conversation.prompt_ids(i).tolist()
        n = int(conversation.input_lens[i])
        full = n // BLOCK
        matched = 0
        while matched < full and ids[matched] in seen:
            matched += 1
        expected += matched
        seen.update(ids[:full])
    assert r.num_evicted_pages == 0
    assert r.hit_pages == expected
    # Partial blocks aside, this is the infinite-cache rate of the trace's README (36.64 % of blocks).
    assert r.hit_pages / len(conversation.hash_ids) == pytest.approx(0.3664, abs=0.005)
