"""End to end with a hybrid model: a sliding-window layer and a full-attention layer, each layer in its
own KV-cache group, generate with the paged cache and match a dense reference with the same masks.

The tiny random-weight decoder (``kvcore.tiny``, 2 layers) runs two ways:
- paged: ``KVCacheManager(groups=[W, None])``; layer 0 reads and writes group 0's table (pages that
  left its window are the null page, and the kernels' ``window`` masks them), layer 1 group 1's; requests
  hit cached prefixes (the window group taking only its last pages), fork, are freed and evicted;
- no cache: every step recomputes the whole history with a causal mask, windowed on layer 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import KVCacheManager
from kvcore import kernels as K
from kvcore.pool import KVPool
from kvcore.tiny import TinyConfig, TinyDecoder

CFG = TinyConfig(num_layers=2)


def _dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None) -> np.ndarray:
    t, g = q.shape[0], CFG.num_qo_heads // CFG.num_kv_heads
    s = np.einsum("qhd,khd->hqk", q, np.repeat(k, g, axis=1)) / np.sqrt(CFG.head_dim)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    mask = j <= i if window is None else (j <= i) & (j > i - window)
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("hqk,khd->qhd", p, np.repeat(v, g, axis=1))
    return out


class HybridRunner:
    def __init__(self, window: int, num_pages: int, page_size: int) -> None:
        self.model = TinyDecoder(seed=3, kv_dtype="fp16", config=CFG)
        self.windows: list[int | None] = [window, None]  # layer l is in group l
        self.m = KVCacheManager(num_pages, page_size, groups=self.windows)
        self.pool = KVPool(
            num_layers=CFG.num_layers,
            num_pages=num_pages,
            num_kv_heads=CFG.num_kv_heads,
            head_dim=CFG.head_dim,
            page_size=page_size,
            kv_dtype="fp16",
        )
        self.tokens: dict[int, list[int]] = {}

    def reference(self, tokens: list[int]) -> np.ndarray:
        x, pos = self.model.embed[np.asarray(tokens)], np.arange(len(tokens), dtype=np.float64)
        for layer in range(CFG.num_layers):
            q, k, v = self.model.qkv(layer, x, pos)
            kv = self.model.stored(k, layer, 0), self.model.stored(v, layer, 1)
            x = self.model.finish_layer(layer, x, _dense(q, *kv, self.windows[layer]))
        return self.model.logits(x[-1:])[0]

    def step(self, work: dict[int, int]) -> dict[int, np.ndarray]:
        """Compute the last ``work[s]`` tokens of each sequence; its last-token logits."""
        pairs = self.m.take_pending_copies()
        if pairs.shape[0]:
            K.copy_pages(self.pool, pairs)
        ids = list(work)
        q_indptr = np.concatenate([[0], np.cumsum([work[s] for s in ids])]).astype(np.int32)
        toks = np.concatenate([self.tokens[s][len(self.tokens[s]) - work[s] :] for s in ids])
        pos = np.concatenate(
            [np.arange(len(self.tokens[s]) - work[s], len(self.tokens[s])) for s in ids]
        ).astype(np.float64)
        x = self.model.embed[toks]
        for layer in range(CFG.num_layers):
            pt = self.m.page_table(ids, group=layer)
            slots = np.concatenate([self.m.slot_mapping(s, work[s], group=layer) for s in ids])
            q, k, v = self.model.qkv(layer, x, pos)
            K.append_kv(self.pool, layer, slots, k, v)
            attn = K.paged_prefill_attention(q, self.pool, layer, pt, q_indptr, window=self.windows[layer])
            x = self.model.finish_layer(layer, x, attn)
        last = self.model.logits(x[q_indptr[1:] - 1])
        return {s: last[i] for i, s in enumerate(ids)}

    def check(self, logits: dict[int, np.ndarray]) -> None:
        for s, got in logits.items():
            want = self.reference(self.tokens[s])
            assert np.abs(got - want).max() < 2e-3 * max(1.0, np.abs(want).max()), f"sequence {s}"
            assert int(np.argmax(got)) == int(np.argmax(want))

    def admit(self, sid: int, prompt: list[int]) -> int:
        hit = self.m.add_sequence(sid, prompt)
        assert hit is not None
        self.tokens[sid] = list(prompt)
        self.check(self.step({sid: len(prompt) - hit}))
        return hit

    def decode(self, sids: list[int], steps: int) -> None:
        for _ in range(steps):
            nxt = {s: int(np.argmax(self.reference(self.tokens[s]))) for s in sids}  # greedy
            for s in sids:
                assert self.m.append(s, [nxt[s]])
                self.tokens[s].append(nxt[s])
            self.check(self.step({s: 1 for s in sids}))


@pytest.mark.parametrize(("window", "page_size"), [(5, 2), (8, 4), (3, 4), (16, 4)])
def test_hybrid_model_matches_the_windowed_reference(window: int, page_size: int) -> None:
    rng = np.random.default_rng(window * 10 + page_size)
    r = HybridRunner(window, 80, page_size)
    system = rng.integers(0, CFG.vocab, 13).tolist()
    assert r.admit(1, [*system, 5, 6, 7]) == 0
    r.decode([1], 10)
    # The window group's released pages really are released: only the window's pages held.
    held = np.count_nonzero(r.m.seq_pages(1, group=0))
    n = len(r.tokens[1])
    assert held <= (window - 2) // page_size + 2
    assert np.count_nonzero(r.m.seq_pages(1, group=1)) == -(-n // page_size)
    # A fork decodes on its own copy of the partial page in both groups.
    r.m.fork(1, 2)
    r.tokens[2] = list(r.tokens[1])
    r.decode([1, 2], 6)
    first = list(r.tokens[1])
    r.m.free_sequence(1)
    r.m.free_sequence(2)
    del r.tokens[1], r.tokens[2]
    # A prefix hit: the full group's whole prefix, the window group's last pages before the hit.
    hit = r.admit(3, [*first, 9, 9])
    assert hit >= (len(first) // page_size - 1) * page_size
    r.decode([3], 5)
    # Pressure: other prompts evict cached pages (both groups); generation stays exact.
    for sid in range(10, 16):
        r.admit(sid, rng.integers(0, CFG.vocab, 29).tolist())
        r.decode([sid], 2)
        r.m.free_sequence(sid)
        del r.tokens[sid]
    assert r.m.stats().num_evicted_pages > 0
    r.decode([3], 4)
    hit = r.admit(4, [*first, 9, 9, 1])
    r.decode([4], 3)
