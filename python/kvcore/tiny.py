"""A tiny random-weight decoder that runs over the paged cache: kvcore's reference engine.

:class:`TinyDecoder` is a pre-norm transformer (RMSNorm, GQA attention with RoPE, SiLU MLP) in
float64 NumPy, small enough to run a burst of requests in seconds on a CPU. :class:`TinyEngine`
executes a :class:`~kvcore.scheduler.StepPlan` with it: copy-on-write pairs first, then per layer
K/V written at the plan's slots (``kernels.append_kv``) and attention over the plan's page table
(``kernels.paged_prefill_attention``, which serves decode rows as one-token chunks), and greedy
sampling of the rows that sample. With lower tiers it runs their transfers (``kvcore.tiers.Mover``)
after each step, so a swapped-out request comes back with its own K/V.

The pool may live on CuPy (``make_pool(..., backend="auto")``): K/V then go through the CUDA kernels
(fp16 activations), the model itself staying in NumPy.

It exists to prove the scheduler end to end (a preempted-and-resumed request generates exactly what an
uninterrupted one does) and for ``kvcore demo``; :meth:`TinyDecoder.no_cache_logits` recomputes a
sequence from scratch, the reference every cached result is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore import kernels as K
from kvcore.exceptions import InvalidArgumentError
from kvcore.kernels import plan_attention
from kvcore.pool import KVPool, dtypes

__all__ = ["TinyConfig", "TinyDecoder", "TinyEngine"]

_F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 64
    d_model: int = 48
    num_layers: int = 3
    num_qo_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 96


class TinyDecoder:
    """Pre-norm decoder, float64. ``kv_dtype`` is the cache's precision: K/V are rounded to it (the
    model's KV precision is part of the model), with static per-head scales for int8 / fp8."""

    def __init__(self, seed: int = 0, kv_dtype: str = "fp16", config: TinyConfig | None = None) -> None:
        c = self.config = config or TinyConfig()
        rng = np.random.default_rng(seed)

        def w(*shape: int) -> _F64:
            out: _F64 = rng.normal(size=shape) / np.sqrt(shape[0])
            return out

        self.embed = rng.normal(size=(c.vocab, c.d_model))
        hq, hkv, d = c.num_qo_heads, c.num_kv_heads, c.head_dim
        self.layers = [
            {
                "wq": w(c.d_model, hq * d),
                "wk": w(c.d_model, hkv * d),
                "wv": w(c.d_model, hkv * d),
                "wo": w(hq * d, c.d_model),
                "w1": w(c.d_model, c.ffn),
                "w2": w(c.ffn, c.d_model),
            }
            for _ in range(c.num_layers)
        ]
        self.head = w(c.d_model, c.vocab)
        self.kv_dtype = kv_dtype
        self.k_scale = np.ones((c.num_layers, hkv), np.float32)
        self.v_scale = np.ones((c.num_layers, hkv), np.float32)
        if dtypes.is_quantized(kv_dtype):  # static per-head scales from a calibration run
            ks, vs = self._calibration_kv(rng.integers(0, c.vocab, 64))
            qmax = dtypes.qmax(kv_dtype)
            for layer in range(c.num_layers):
                self.k_scale[layer] = 1.25 * np.abs(ks[layer]).max(axis=(0, 2)) / qmax
                self.v_scale[layer] = 1.25 * np.abs(vs[layer]).max(axis=(0, 2)) / qmax

    @staticmethod
    def _norm(x: _F64) -> _F64:
        out: _F64 = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
        return out

    @staticmethod
    def _rope(x: _F64, pos: _F64) -> _F64:
        """x [T, H, D], pos [T]: rotate pairs (d, d + D/2) by pos * 10000^(-2d/D)."""
        half = x.shape[-1] // 2
        ang = pos[:, None] * 10000.0 ** (-np.arange(half) / half)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def qkv(self, layer: int, x: _F64, pos: _F64) -> tuple[_F64, _F64, _F64]:
        """q [T, Hq, D], k / v [T, Hkv, D] of hidden states x [T, d_model] at positions pos [T]."""
        c, p = self.config, self.layers[layer]
        h = self._norm(x)
        q = self._rope((h @ p["wq"]).reshape(-1, c.num_qo_heads, c.head_dim), pos)
        k = self._rope((h @ p["wk"]).reshape(-1, c.num_kv_heads, c.head_dim), pos)
        return q, k, (h @ p["wv"]).reshape(-1, c.num_kv_heads, c.head_dim)

    def finish_layer(self, layer: int, x: _F64, attn: _F64) -> _F64:
        p = self.layers[layer]
        x = x + attn.reshape(x.shape[0], -1) @ p["wo"]
        hmid = self._norm(x) @ p["w1"]
        out: _F64 = x + (hmid / (1 + np.exp(-hmid))) @ p["w2"]
        return out

    def logits(self, x: _F64) -> _F64:
        out: _F64 = self._norm(x) @ self.head
        return out

    def stored(self, x: _F64, layer: int, kv: int) -> _F64:
        """K (kv=0) or V (kv=1) as the cache holds them (the model's KV precision)."""
        scale = (self.k_scale if kv == 0 else self.v_scale)[layer][None, :, None]
        out: _F64 = dtypes.decode(dtypes.encode(x, self.kv_dtype, scale), self.kv_dtype, scale)
        return out

    def _dense(self, q: _F64, k: _F64, v: _F64) -> _F64:
        c = self.config
        t = q.shape[0]
        g = c.num_qo_heads // c.num_kv_heads
        s = np.einsum("qhd,khd->hqk", q, np.repeat(k, g, axis=1)) / np.sqrt(c.head_dim)
        s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out: _F64 = np.einsum("hqk,khd->qhd", p, np.repeat(v, g, axis=1))
        return out

    def _calibration_kv(self, tokens: npt.NDArray[np.int64]) -> tuple[list[_F64], list[_F64]]:
        x, pos, ks, vs = self.embed[tokens], np.arange(len(tokens), dtype=np.float64), [], []
        for layer in range(self.config.num_layers):
            q, k, v = self.qkv(layer, x, pos)
            ks.append(k)
            vs.append(v)
            x = self.finish_layer(layer, x, self._dense(q, k, v))
        return ks, vs

    def no_cache_logits(self, tokens: list[int]) -> _F64:
        """Logits [vocab] of the last token, recomputing everything from scratch (no cache at all)."""
        return self.no_cache_all_logits(tokens, last=1)[0]

    def no_cache_all_logits(self, tokens: list[int], *, last: int | None = None) -> _F64:
        """Logits ``[T, vocab]`` at every position (or the ``last`` ones) of one pass from scratch:
        attention is causal, so row ``i`` is what a pass over the first ``i + 1`` tokens gives."""
        x, pos = self.embed[np.asarray(tokens)], np.arange(len(tokens), dtype=np.float64)
        for layer in range(self.config.num_layers):
            q, k, v = self.qkv(layer, x, pos)
            kv = self.stored(k, layer, 0), self.stored(v, layer, 1)
            x = self.finish_layer(layer, x, self._dense(q, *kv))
        return self.logits(x if last is None else x[len(tokens) - last :])

    def generate_no_cache(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy tokens from scratch at every step: what any cached run must reproduce."""
        tokens = list(prompt)
        out = []
        for _ in range(max_new_tokens):
            t = int(np.argmax(self.no_cache_logits(tokens)))
            out.append(t)
            tokens.append(t)
        return out


class TinyEngine:
    """Runs :class:`TinyDecoder` over a :class:`KVPool` shaped for it, one :class:`StepPlan` at a time.

    ``pool`` must have the cache's pages and page size; ``mover`` (a ``kvcore.tiers.Mover`` over the
    same pool), if given, runs the cache's transfers after each step."""

    def __init__(self, model: TinyDecoder, pool: KVPool, mover: Any = None) -> None:
        self.model = model
        self.pool = pool
        self.mover = mover
        c = model.config
        if dtypes.is_quantized(model.kv_dtype):
            for layer in range(c.num_layers):
                pool.set_scales(layer, model.k_scale[layer], model.v_scale[layer])

    @staticmethod
    def make_pool(model: TinyDecoder, num_pages: int, page_size: int, backend: str = "numpy") -> KVPool:
        """A pool shaped for ``model``: on NumPy (the reference kernels), or ``"cupy"`` / ``"auto"``
        (the CUDA kernels when a device is usable; the model itself stays in NumPy)."""
        c = model.config
        return KVPool(
            num_layers=c.num_layers,
            num_pages=num_pages,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=page_size,
            kv_dtype=model.kv_dtype,
            backend=backend,
        )

    def forward(self, plan: Any) -> dict[int, int]:
        """Compute ``plan``; returns ``{request_id: greedy next token}`` for its sampling rows.
        InvalidArgumentError, before anything is written, for a token outside the model's vocabulary."""
        vocab = self.model.config.vocab
        toks = plan.token_ids
        if toks.size and int(toks.max()) >= vocab:
            i = int(np.flatnonzero(toks >= vocab)[0])
            row = int(np.searchsorted(plan.q_indptr, i, side="right")) - 1
            raise InvalidArgumentError(
                f"token {int(toks[i])} of request {int(plan.request_ids[row])} (position "
                f"{int(plan.positions[i])}) is outside the model's vocabulary of {vocab} tokens"
            )
        if plan.batch_size and np.any(plan.page_table.kv_indices == 0):
            # A released page (window, StreamingLLM, compaction): the plan's one table is not a
            # full-attention context. Refused before anything is written.
            raise InvalidArgumentError(
                "TinyEngine runs full attention over one page table; this plan's table holds released "
                "pages (a manager with sliding-window groups, streaming or compacted sequences): build "
                "each group's table with KVCacheManager.batch_layout(..., group=g) instead"
            )
        if plan.copies.shape[0]:
            K.copy_pages(self.pool, plan.copies)
        out: dict[int, int] = {}
        if plan.batch_size:
            c = self.model.config
            pt = plan.page_table
            attn_plan = plan_attention(
                pt,
                plan.q_indptr,
                page_size=self.pool.page_size,
                num_qo_heads=c.num_qo_heads,
                num_kv_heads=c.num_kv_heads,
                chunk_len=64,
            )
            x = self.model.embed[plan.token_ids.astype(np.int64)]
            pos = plan.positions.astype(np.float64)
            backend = self.pool.backend
            on_gpu = backend.name == "cupy"
            for layer in range(c.num_layers):
                q, k, v = self.model.qkv(layer, x, pos)
                if on_gpu:  # the CUDA kernels take fp16 activations on the device
                    q, k, v = (backend.asarray(a.astype(np.float16)) for a in (q, k, v))
                K.append_kv(self.pool, layer, plan.slot_mapping, k, v)
                attn = K.paged_prefill_attention(q, self.pool, layer, pt, plan.q_indptr, plan=attn_plan)
                if on_gpu:
                    attn = backend.asnumpy(attn).astype(np.float64)
                x = self.model.finish_layer(layer, x, attn)
            rows = np.flatnonzero(plan.sample)
            if len(rows):
                last = self.model.logits(x[plan.q_indptr[rows + 1] - 1])
                for i, r in enumerate(rows.tolist()):
                    out[int(plan.request_ids[r])] = int(np.argmax(last[i]))
        if self.mover is not None:
            self.mover.run()
        return out
