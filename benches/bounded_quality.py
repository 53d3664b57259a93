"""StreamingLLM and page-level heavy hitters (H2O on pages) on the tiny decoder: how far their logits are
from the full cache at 25 % and 50 % page budgets.

A 3-layer random-weight decoder (``kvcore.tiny``, fp16 K/V) reads a ``--prompt``-token prompt, then
decodes ``--steps`` tokens teacher-forced on the full-cache run's greedy tokens. Each design keeps a
sequence within ``budget`` pages of ``--page-size`` tokens:
- **full**: no bound (the reference);
- **streaming**: ``add_sequence(sink_tokens=S, recent_tokens=budget * page_size - S - page_size)``: the
  sink page and the most recent pages; the kernels read the compact table with ``positions``;
- **h2o**: the attention kernels accumulate each page's attention mass (``page_scores``, summed over
  layers and steps); after each step ``compact(scores, budget, sink_tokens=S, recent_tokens=R)`` drops
  the lowest-scoring middle pages.
Reported: max |logit error| over the decode steps and top-1 agreement with the full cache.

Inputs: **random** tokens, and **planted**: a few middle tokens' keys scaled up (x ``--plant-scale``)
in every layer, so the attention mass concentrates on them, as heavy hitters do in trained models.
What a random tiny model can show: whether a design keeps the pages that carry the attention mass
(planted: H2O should, StreamingLLM cannot). What it cannot: task quality; random weights have no
language structure, so on random inputs every design's error mostly measures how much mass the
dropped pages carried, not what a trained model would lose.

Run: ``.venv/bin/python benches/bounded_quality.py [--prompt 256] [--steps 32] [--page-size 8]``
"""

from __future__ import annotations

import argparse

import numpy as np

from kvcore import KVCacheManager
from kvcore import kernels as K
from kvcore.pool import KVPool
from kvcore.tiny import TinyConfig, TinyDecoder

CFG = TinyConfig()


def run(
    model: TinyDecoder,
    prompt: list[int],
    forced: list[int],
    ps: int,
    design: str,
    budget: int,
    planted: set[int],
    plant_scale: float,
) -> list[np.ndarray]:
    num_pages = 4 * (len(prompt) + len(forced)) // ps + 8
    m = KVCacheManager(num_pages, ps)
    pool = KVPool(
        num_layers=CFG.num_layers,
        num_pages=num_pages,
        num_kv_heads=CFG.num_kv_heads,
        head_dim=CFG.head_dim,
        page_size=ps,
        kv_dtype="fp16",
    )
    sink = ps
    recent = budget * ps - sink - ps
    kw = {"sink_tokens": sink, "recent_tokens": recent} if design == "streaming" else {}
    assert m.add_sequence(1, prompt, cache_prompt=False, **kw) == 0
    tokens = list(prompt)
    scores: np.ndarray | None = None
    out = []

    def step(start: int) -> np.ndarray:
        nonlocal scores
        n = len(tokens) - start
        pt = m.page_table([1], compact=True)
        positions = m.positions([1])
        q_indptr = np.array([0, n], np.int32)
        slots = m.slot_mapping(1, n, start)
        pos = np.arange(start, len(tokens), dtype=np.float64)
        x = model.embed[np.asarray(tokens[start:])]
        step_scores = np.zeros(len(pt.kv_indices), np.float32)
        for layer in range(CFG.num_layers):
            q, k, v = model.qkv(layer, x, pos)
            boost = np.array([plant_scale if p in planted else 1.0 for p in range(start, len(tokens))])
            k = k * boost[:, None, None]
            K.append_kv(pool, layer, slots, k, v)
            attn = K.paged_prefill_attention(
                q, pool, layer, pt, q_indptr, positions=positions, page_scores=step_scores
            )
            x = model.finish_layer(layer, x, attn)
        if design == "h2o":
            kept = m.seq_pages(1) != 0
            acc = np.zeros(len(kept), np.float32)
            if scores is not None:
                acc[: len(scores)] = scores
            acc[np.flatnonzero(kept)] += step_scores
            scores = acc
            m.compact(1, scores, budget, sink_tokens=sink, recent_tokens=ps)
        return model.logits(x[-1:])[0]

    step(0)
    for t in forced:
        assert m.append(1, [t])
        tokens.append(t)
        out.append(step(len(tokens) - 1))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--page-size", type=int, default=8)
    p.add_argument("--plant-scale", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    model = TinyDecoder(seed=a.seed, kv_dtype="fp16")
    prompt = rng.integers(0, CFG.vocab, a.prompt).tolist()
    total_pages = -(-(a.prompt + a.steps) // a.page_size)
    print(
        f"prompt {a.prompt} tokens + {a.steps} decode steps, pages of {a.page_size} "
        f"({total_pages} pages at the end)"
    )
    print(f"{'input':<8} {'budget':>7} {'design':<10} {'max |err|':>10} {'top-1':>7}")
    for name, planted in (
        ("random", set()),
        (
            "planted",
            set(range(a.prompt // 3, a.prompt // 3 + 3)) | set(range(a.prompt // 2, a.prompt // 2 + 2)),
        ),
    ):
        # The full cache's greedy continuation, teacher-forced into every design.
        forced, logits = _reference(model, prompt, a.steps, a.page_size, planted, a.plant_scale)
        for frac in (0.25, 0.5):
            budget = max(3, int(total_pages * frac))
            for design in ("streaming", "h2o"):
                got = run(model, prompt, forced, a.page_size, design, budget, planted, a.plant_scale)
                err = max(float(np.abs(g - w).max()) for g, w in zip(got, logits, strict=True))
                top1 = np.mean(
                    [int(np.argmax(g)) == int(np.argmax(w)) for g, w in zip(got, logits, strict=True)]
                )
                print(f"{name:<8} {frac:>6.0%} {design:<10} {err:>10.4f} {top1:>7.1%}")
    return 0


def _reference(
    model: TinyDecoder, prompt: list[int], steps: int, ps: int, planted: set[int], plant_scale: float
) -> tuple[list[int], list[np.ndarray]]:
    """The full cache's greedy tokens and their logits (one run, unbounded)."""
    forced: list[int] = []
    toks = list(prompt)
    for _ in range(steps):  # greedy, from a whole-sequence prefill each step
        lg = _full_logits(model, toks, ps, planted, plant_scale)
        t = int(np.argmax(lg))
        toks.append(t)
        forced.append(t)
    return forced, run(model, prompt, forced, ps, "full", 0, planted, plant_scale)


def _full_logits(
    model: TinyDecoder, toks: list[int], ps: int, planted: set[int], plant_scale: float
) -> np.ndarray:
    """Next-token logits after ``toks`` with the full cache (prefill of the whole sequence)."""
    m = KVCacheManager(len(toks) // ps + 4, ps)
    pool = KVPool(
        num_layers=CFG.num_layers,
        num_pages=len(toks) // ps + 4,
        num_kv_heads=CFG.num_kv_heads,
        head_dim=CFG.head_dim,
        page_size=ps,
        kv_dtype="fp16",
    )
    m.add_sequence(1, toks, cache_prompt=False)
    pt = m.page_table([1])
    slots = m.slot_mapping(1, len(toks), 0)
    x = model.embed[np.asarray(toks)]
    pos = np.arange(len(toks), dtype=np.float64)
    q_indptr = np.array([0, len(toks)], np.int32)
    for layer in range(CFG.num_layers):
        q, k, v = model.qkv(layer, x, pos)
        boost = np.array([plant_scale if p in planted else 1.0 for p in range(len(toks))])
        K.append_kv(pool, layer, slots, k * boost[:, None, None], v)
        x = model.finish_layer(layer, x, K.paged_prefill_attention(q, pool, layer, pt, q_indptr))
    return model.logits(x[-1:])[0]


if __name__ == "__main__":
    raise SystemExit(main())
