"""Logit error of quantized host tiers (int8, int4) on the tiny decoder, against the unquantized tier.

Run: ``.venv/bin/python benches/tiers_quant_error.py [--seqs 8] [--steps 40] [--reload-every 10]``

Each sequence's prompt is computed in HBM, stored to a host tier (``store_policy="all"``), evicted from
HBM and reloaded from the tier; then it decodes ``--steps`` tokens, and every ``--reload-every`` steps it
is preempted (freed, evicted from HBM) and readmitted, so its whole context so far comes back from the
tier and only the last, partial page is recomputed. The same run is made with an unquantized tier (the
reference: bit-exact, greedy tokens) and with int8 / int4 tiers, teacher-forced with the reference's
tokens so that every step's logits compare position for position. Rows: logit vectors compared, max and
mean |logit error| against the reference, the largest |logit| (for scale), top-1 agreement, and the
largest reference top-1/top-2 margin among the steps whose top-1 flipped (how near a tie they
were). The reference row compares the unquantized tier against the no-cache model instead (float
rounding only).

The tiny decoder (NumPy, float64 compute, K/V rounded to the pool's dtype) and its paged runner are
the end-to-end tests' (``tests/python/test_e2e_decoder.py``, ``test_e2e_tiers.py``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from test_e2e_decoder import VOCAB, TinyDecoder
from test_e2e_tiers import TieredRunner


@dataclass
class Run:
    """Per step of every sequence: the logits [VOCAB] float64, and the token fed after them."""

    logits: list[np.ndarray]
    tokens: list[int]


def generate(
    model: TinyDecoder,
    prompts: list[list[int]],
    *,
    page_size: int,
    quantize: str | None,
    steps: int,
    reload_every: int,
    forced: Run | None,
) -> Run:
    """One run over every prompt (one sequence at a time); ``forced``: feed its tokens (teacher
    forcing) instead of this run's own greedy ones."""
    pages = max(-(-(len(p) + steps) // page_size) for p in prompts) + 4
    runner = TieredRunner(model, pages, page_size, host_slots=len(prompts) * pages, quantize=quantize)
    out = Run([], [])
    seq_id = 0
    for prompt in prompts:
        runner.admit(seq_id, prompt)
        runner.prefill(seq_id)  # computed in HBM, stored to the tier by the step's mover run
        runner.drop_from_hbm(seq_id)
        seq_id += 1
        assert runner.admit(seq_id, prompt) > 0 and runner.manager.hit_tokens(seq_id)["host"] > 0
        logits = runner.prefill(seq_id)[seq_id]
        for step in range(steps):
            i = len(out.logits)
            out.logits.append(logits)
            token = forced.tokens[i] if forced is not None else int(np.argmax(logits))
            out.tokens.append(token)
            if (step + 1) % reload_every == 0:  # preempted: the context comes back from the tier
                tokens = [*runner.tokens[seq_id], token]
                runner.drop_from_hbm(seq_id)
                seq_id += 1
                assert runner.admit(seq_id, tokens) > 0 and runner.manager.hit_tokens(seq_id)["hbm"] == 0
                logits = runner.prefill(seq_id)[seq_id]
            else:
                runner.append(seq_id, token)
                logits = runner.step({seq_id: 1}, decode=True)[seq_id]
        runner.drop_from_hbm(seq_id)
        seq_id += 1
    return out


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> dict[str, float]:
    err = np.abs(np.stack(got) - np.stack(want))  # [n, VOCAB]
    ref = np.stack(want)
    top = np.sort(ref, axis=1)
    margin = top[:, -1] - top[:, -2]  # [n] reference top-1 minus top-2
    same = np.argmax(np.stack(got), axis=1) == np.argmax(ref, axis=1)
    return {
        "n": len(got),
        "max_err": float(err.max()),
        "mean_err": float(err.mean()),
        "max_logit": float(np.abs(ref).max()),
        "top1": float(same.mean()),
        "flip_margin": float(margin[~same].max(initial=0.0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="decode steps per sequence")
    ap.add_argument("--reload-every", type=int, default=10, help="decode steps between preemptions")
    ap.add_argument("--prompt-len", type=int, default=22)
    ap.add_argument("--page-size", type=int, default=4)
    ap.add_argument("--kv-dtypes", default="fp16,bf16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("command: .venv/bin/python " + shlex.join(["benches/tiers_quant_error.py", *sys.argv[1:]]))
    header = (
        "kv_dtype",
        "tier",
        "vs",
        "logits",
        "max|err|",
        "mean|err|",
        "max|logit|",
        "top-1",
        "flip_margin",
    )
    rows = []
    for kv_dtype in args.kv_dtypes.split(","):
        model = TinyDecoder(seed=args.seed, kv_dtype=kv_dtype)
        rng = np.random.default_rng(args.seed + 1)
        prompts = [rng.integers(0, VOCAB, args.prompt_len).tolist() for _ in range(args.seqs)]
        kw = {"page_size": args.page_size, "steps": args.steps, "reload_every": args.reload_every}
        ref = generate(model, prompts, quantize=None, forced=None, **kw)
        # The reference against the no-cache model, on the same contexts.
        no_cache = []
        for s, prompt in enumerate(prompts):
            toks = ref.tokens[s * args.steps : (s + 1) * args.steps]
            no_cache += [model.no_cache_logits(prompt + toks[:i]) for i in range(args.steps)]
        results = [("none", "no cache", compare(ref.logits, no_cache))]
        for q in ("int8", "int4"):
            run = generate(model, prompts, quantize=q, forced=ref, **kw)
            assert run.tokens == ref.tokens
            results.append((q, "none", compare(run.logits, ref.logits)))
        for q, vs, r in results:
            rows.append(
                (
                    kv_dtype,
                    q,
                    vs,
                    str(r["n"]),
                    f"{r['max_err']:.2e}",
                    f"{r['mean_err']:.2e}",
                    f"{r['max_logit']:.2f}",
                    f"{r['top1']:.4f}",
                    f"{r['flip_margin']:.2e}",
                )
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
    print(
        f"{args.seqs} sequences x {args.steps} steps, prompt {args.prompt_len} tokens, page size "
        f"{args.page_size}, context reloaded from the tier every {args.reload_every} steps"
    )


if __name__ == "__main__":
    main()
