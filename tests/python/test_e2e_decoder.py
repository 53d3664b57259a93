"""End to end: a tiny random-weight decoder generates with the paged cache and matches a no-cache run.

The model (NumPy, float64, 3 layers, GQA 4 query / 2 kv heads, RoPE) is run two ways:
- paged: a manager (``kv_helpers.make_manager``, the swap point for ``kvcore.KVCacheManager``) hands out
  slots and page tables; ``append_kv`` writes K/V, ``paged_prefill_attention`` / ``paged_decode_attention``
  read them back; requests hit cached prefixes, fork (copy-on-write through ``copy_pages``), are freed and
  evicted, and evicted pages are reused by later requests;
- no cache: every step recomputes full causal attention over the sequence's whole history.
The cache stores K/V in its precision, so the no-cache model rounds K/V the same way (through
``kvcore.pool.dtypes``): the model's KV precision is part of the model. The logits then agree to float
rounding, and greedy generation picks the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from kv_helpers import make_manager, take_copies

from kvcore import kernels as K
from kvcore.kernels import plan_attention
from kvcore.pool import KVPool, dtypes
from kvcore.tiny import TinyConfig, TinyDecoder

_C = TinyConfig()
VOCAB, LAYERS, HQ, HKV, HEAD_DIM = _C.vocab, _C.num_layers, _C.num_qo_heads, _C.num_kv_heads, _C.head_dim


class PagedRunner:
    """Runs the model over the paged cache: the sequences' tokens, the manager, the pool."""

    def __init__(self, model: TinyDecoder, num_pages: int, page_size: int) -> None:
        self.model = model
        self.manager = make_manager(num_pages, page_size, seed=7)
        self.pool = KVPool(
            num_layers=LAYERS,
            num_pages=num_pages,
            num_kv_heads=HKV,
            head_dim=HEAD_DIM,
            page_size=page_size,
            kv_dtype=model.kv_dtype,
        )
        if dtypes.is_quantized(model.kv_dtype):
            for layer in range(LAYERS):
                self.pool.set_scales(layer, model.k_scale[layer], model.v_scale[layer])
        self.tokens: dict[int, list[int]] = {}
        self.hits: dict[int, int] = {}

    def admit(self, seq_id: int, prompt: list[int]) -> int:
        """Add a request; returns how many prompt tokens its K/V was found cached for."""
        hit = self.manager.add_sequence(seq_id, prompt)
        assert hit is not None and hit < len(prompt)
        self.tokens[seq_id] = list(prompt)
        self.hits[seq_id] = hit
        return int(hit)

    def append(self, seq_id: int, token: int) -> None:
        assert self.manager.append(seq_id, [token])
        self.tokens[seq_id].append(token)

    def fork(self, parent: int, child: int) -> None:
        self.manager.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    def free(self, seq_id: int) -> None:
        self.manager.free_sequence(seq_id)
        del self.tokens[seq_id]

    def step(
        self, work: dict[int, int], *, decode: bool = False, upto: dict[int, int] | None = None
    ) -> dict[int, np.ndarray]:
        """Compute ``work[seq]`` tokens of each sequence (slots reserved): its last ones, or those
        ending at ``upto[seq]`` (a prefill chunk, whose attention sees only the tokens before it);
        returns each chunk's last-token logits."""
        pairs = take_copies(self.manager)  # copy-on-write before anything writes the new pages
        if pairs.shape[0]:
            K.copy_pages(self.pool, pairs)
        ids = list(work)
        end = {s: (upto or {}).get(s, len(self.tokens[s])) for s in ids}
        # The table of a chunk covers the tokens up to its end only: a whole-sequence table would let
        # the chunk attend to (uncomputed) slots after it.
        pt = self.manager.page_table(ids, num_tokens=[end[s] for s in ids])
        q_indptr = np.concatenate([[0], np.cumsum([work[s] for s in ids])]).astype(np.int32)
        toks = np.concatenate([self.tokens[s][end[s] - work[s] : end[s]] for s in ids])
        pos = np.concatenate([np.arange(end[s] - work[s], end[s]) for s in ids]).astype(np.float64)
        slots = np.concatenate([self.manager.slot_mapping(s, work[s], start=end[s] - work[s]) for s in ids])
        plan = plan_attention(
            pt, q_indptr, page_size=self.pool.page_size, num_qo_heads=HQ, num_kv_heads=HKV, chunk_len=64
        )
        x = self.model.embed[toks]
        for layer in range(LAYERS):
            q, k, v = self.model.qkv(layer, x, pos)
            K.append_kv(self.pool, layer, slots, k, v)
            if decode:
                attn = K.paged_decode_attention(q, self.pool, layer, pt, plan=plan)
            else:
                attn = K.paged_prefill_attention(q, self.pool, layer, pt, q_indptr, plan=plan)
            x = self.model.finish_layer(layer, x, attn)
        last = self.model.logits(x[q_indptr[1:] - 1])
        return {s: last[i] for i, s in enumerate(ids)}


def check(runner: PagedRunner, logits: dict[int, np.ndarray]) -> None:
    for seq_id, got in logits.items():
        want = runner.model.no_cache_logits(runner.tokens[seq_id])
        assert np.abs(got - want).max() < 2e-3 * max(1.0, np.abs(want).max()), f"sequence {seq_id}"
        assert int(np.argmax(got)) == int(np.argmax(want))


@pytest.mark.parametrize(("kv_dtype", "page_size"), [("fp16", 4), ("bf16", 2), ("fp8", 4), ("int8", 3)])
def test_paged_generation_matches_no_cache(kv_dtype: str, page_size: int) -> None:
    model = TinyDecoder(seed=1, kv_dtype=kv_dtype)
    runner = PagedRunner(model, num_pages=64, page_size=page_size)
    rng = np.random.default_rng(2)
    system = rng.integers(0, VOCAB, 10).tolist()
    prompt_a = system + rng.integers(0, VOCAB, 7).tolist()
    prompt_b = system + rng.integers(0, VOCAB, 5).tolist()

    # A: a cold prefill. B: a prefix hit on the system prompt's full pages, prefilling only its tail.
    assert runner.admit(0, prompt_a) == 0
    logits = runner.step({0: len(prompt_a)})
    check(runner, logits)
    first_a = logits[0]
    hit = runner.admit(1, prompt_b)
    assert hit == len(system) // page_size * page_size > 0
    logits.update(runner.step({1: len(prompt_b) - hit}))
    check(runner, logits)

    def decode(seqs: list[int], steps: int) -> None:
        for _ in range(steps):
            for s in seqs:
                runner.append(s, int(np.argmax(logits[s])))
            logits.update(runner.step(dict.fromkeys(seqs, 1), decode=True))
            check(runner, {s: logits[s] for s in seqs})

    decode([0, 1], 3)
    while len(runner.tokens[1]) % page_size == 0:  # fork when B's last page is partial: CoW follows
        decode([0, 1], 1)

    # Parallel sampling: C forks B and takes B's second-best token; B's append copies the shared page.
    runner.fork(1, 2)
    order = np.argsort(logits[1])
    runner.append(1, int(order[-1]))
    pairs = take_copies(runner.manager)  # applied here, before any K/V write, as step() would
    assert pairs.shape == (1, 2)
    K.copy_pages(runner.pool, pairs)
    runner.append(2, int(order[-2]))  # C now owns the old page alone: no copy
    assert take_copies(runner.manager).shape[0] == 0
    logits.update(runner.step({1: 1, 2: 1}, decode=True))
    check(runner, {1: logits[1], 2: logits[2]})
    decode([0, 1, 2], 3)

    # A finishes; its unshared cached pages are evicted; D re-sends A's prompt: only the system prompt
    # (kept alive by B and C) hits, and D's tail lands in reused pages.
    runner.free(0)
    assert runner.manager.evict(10_000) > 0
    assert runner.admit(3, prompt_a) == hit
    logits.update(runner.step({3: len(prompt_a) - hit}))
    check(runner, {3: logits[3]})
    assert np.abs(logits[3] - first_a).max() < 2e-3 * max(1.0, np.abs(first_a).max())
    decode([1, 2, 3], 3)
    for s in (1, 2, 3):
        runner.free(s)


@pytest.mark.parametrize(("kv_dtype", "page_size", "chunk"), [("fp16", 4, 5), ("bf16", 3, 4), ("fp8", 4, 8)])
def test_chunked_prefill_matches_no_cache(kv_dtype: str, page_size: int, chunk: int) -> None:
    """A prompt prefilled in chunks gives the no-cache logits: vLLM's allocate_slots flow, with slots
    reserved a chunk at a time (add_sequence(reserve=...), reserve), each chunk's table cut at its
    end (page_table(num_tokens=...)), and the computed pages committed; only committed pages are
    shared with a later request."""
    model = TinyDecoder(seed=3, kv_dtype=kv_dtype)
    runner = PagedRunner(model, num_pages=64, page_size=page_size)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, VOCAB, 19).tolist()
    m = runner.manager
    assert m.add_sequence(0, prompt, cache_prompt=False, reserve=chunk) == 0
    assert m.num_reserved(0) == chunk and len(m.seq_pages(0)) == -(-chunk // page_size)
    runner.tokens[0] = list(prompt)
    done = 0
    while done < len(prompt):
        n = min(chunk, len(prompt) - done)
        if m.num_reserved(0) < done + n:
            assert m.reserve(0, n)  # the pages of the next chunk only
        assert len(m.seq_pages(0)) == -(-(done + n) // page_size)
        logits = runner.step({0: n}, upto={0: done + n})
        done += n
        if done < len(prompt):  # a mid-prompt chunk: its last logits predict the next prompt token
            want = model.no_cache_logits(prompt[:done])
            assert np.abs(logits[0] - want).max() < 2e-3 * max(1.0, np.abs(want).max())
        runner.manager.commit(0, done)
    check(runner, logits)
    # A second request with the same first 11 tokens hits exactly the committed full pages.
    other = prompt[:11] + rng.integers(0, VOCAB, 4).tolist()
    hit = runner.admit(1, other)
    assert hit == 11 // page_size * page_size
    logits.update(runner.step({1: len(other) - hit}))
    check(runner, {1: logits[1]})


@pytest.mark.parametrize(("kv_dtype", "page_size"), [("fp16", 4), ("bf16", 3), ("fp8", 2)])
@pytest.mark.parametrize("flow", ["lookahead", "truncate"])
def test_speculative_decoding_matches_no_cache(kv_dtype: str, page_size: int, flow: str) -> None:
    """Speculative decoding over the paged cache equals the no-cache logits. Each round the target
    model verifies 3 draft tokens after its own token, then keeps a random number of them:

    - ``lookahead``: ``append(seq, [token], num_lookahead=3)`` reserves draft slots, the forward pass
      writes the drafts' K/V there, and the accepted drafts are appended (their K/V is in place);
    - ``truncate``: the drafts are appended as tokens and the rejected ones truncated away (their
      pages may have been cached: what stays cached is never written through).
    """
    model = TinyDecoder(seed=5, kv_dtype=kv_dtype)
    runner = PagedRunner(model, num_pages=96, page_size=page_size)
    rng = np.random.default_rng(6)
    prompt = rng.integers(0, VOCAB, 9).tolist()
    m = runner.manager
    runner.admit(0, prompt)
    logits = runner.step({0: len(prompt)})
    for _ in range(6):
        token = int(np.argmax(logits[0]))
        drafts = rng.integers(0, VOCAB, 3).tolist()
        accepted = int(rng.integers(0, 4))
        base = len(runner.tokens[0])
        if flow == "lookahead":
            assert m.append(0, [token], num_lookahead=len(drafts))
            runner.tokens[0] = [*runner.tokens[0], token, *drafts]  # what the verify pass computes
            runner.step({0: 1 + len(drafts)}, upto={0: base + 1 + len(drafts)})
            runner.tokens[0] = runner.tokens[0][: base + 1 + accepted]
            assert m.append(0, drafts[:accepted])  # their K/V was written by the verify pass
        else:
            runner.append(0, token)
            for d in drafts:
                runner.append(0, d)
            runner.step({0: 1 + len(drafts)})
            m.truncate(0, base + 1 + accepted)
            runner.tokens[0] = runner.tokens[0][: base + 1 + accepted]
        assert m.seq_len(0) == len(runner.tokens[0])
        # The next round starts from the logits after the last kept token (recomputed in place).
        logits = runner.step({0: 1}, upto={0: len(runner.tokens[0])})
        check(runner, logits)
    # A new request repeating the sequence's tokens hits only K/V that is right for them.
    again = [*runner.tokens[0][:-1], 1]
    hit = runner.admit(1, again)
    logits.update(runner.step({1: len(again) - hit}))
    check(runner, {1: logits[1]})
