"""A dense attention model, independent of the paged reference: the second opinion of every attention check.

:func:`seq_kv` reads one sequence's pages straight from a pool (its own indexing of the layout, not the
reference's) and dequantizes them with :func:`kvcore.pool.dtypes.decode`; :func:`dense_attention` is
softmax attention over those keys in float64, with the causal rule of the kernels (query token ``i`` of
``q_len`` sees keys ``j <= kv_len - q_len + i``). A kernel and the reference that shared a bug (the split-K
merge, the page walk, a scale) would agree with each other and still disagree with this.

Tolerances (max |out - reference|, for outputs of magnitude <= 1; scaled by the output's magnitude above
that): P and V enter the tensor cores as fp16 or bf16, the reference is float32. Against the dense model,
4e-3 more (the reference's own rounding to the output type).
"""

from __future__ import annotations

from typing import Any

import numpy as np

ACT_TOLERANCE = {"fp16": 4e-3, "bf16": 2.5e-2}
DENSE_EXTRA = 4e-3


def act_values(x: np.ndarray, act: str) -> np.ndarray:
    """Host activations of float values: float16, or bf16 bit patterns (uint16)."""
    from kvcore.pool import dtypes

    return x.astype(np.float16) if act == "fp16" else dtypes.float_to_bf16_bits(x)


def as_float(x: np.ndarray) -> np.ndarray:
    """float32 values of host activations (float16, uint16 bf16 bits, float32)."""
    from kvcore.pool import dtypes

    return np.asarray(dtypes.to_float32(x), dtype=np.float32)


def seq_kv(dev: Any, pool: Any, layer: int, pages: np.ndarray, kv_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's dequantized K and V, float32 ``[num_kv_heads, kv_len, head_dim]`` each.

    Only this sequence's pages travel to the host (``pages``: int ``[ceil(kv_len / page_size)]``).
    """
    from kvcore.pool import dtypes

    block = dev.asnumpy(pool.data[layer][:, dev.asarray(np.asarray(pages, dtype=np.int64))])  # [2, n, ...]
    if pool.layout == "HND":  # [2, n, Hkv, P, D] -> [2, Hkv, n * P, D]
        rows = block.transpose(0, 2, 1, 3, 4).reshape(2, pool.num_kv_heads, -1, pool.head_dim)
    else:  # [2, n, P, Hkv, D] -> [2, n * P, Hkv, D] -> [2, Hkv, n * P, D]
        rows = block.reshape(2, -1, pool.num_kv_heads, pool.head_dim).transpose(0, 2, 1, 3)
    rows = rows[:, :, :kv_len]
    out = []
    for kv, scale in ((0, pool.k_scale), (1, pool.v_scale)):
        s = dev.asnumpy(scale[layer]).astype(np.float32)[:, None, None]
        out.append(np.asarray(dtypes.decode(np.ascontiguousarray(rows[kv]), pool.kv_dtype, s), np.float32))
    return out[0], out[1]


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sm_scale: float) -> np.ndarray:
    """Causal softmax attention of one sequence in float64: ``[q_len, Hq, D]``.

    ``q`` float ``[q_len, Hq, D]`` (its last ``q_len`` keys are its own tokens), ``k``/``v`` float
    ``[Hkv, kv_len, D]``; query head ``h`` reads kv head ``h // (Hq // Hkv)``.
    """
    ql, hq, d = q.shape
    hkv, kv_len, _ = k.shape
    g = hq // hkv
    qh = q.astype(np.float64).reshape(ql, hkv, g, d)
    s = np.einsum("ihgd,hjd->higj", qh, k.astype(np.float64)) * sm_scale  # [Hkv, ql, G, kv_len]
    limit = kv_len - ql + np.arange(ql)  # last key each query token sees
    s = np.where(np.arange(kv_len)[None, None, None, :] <= limit[None, :, None, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = np.einsum("higj,hjd->ihgd", p, v.astype(np.float64))  # [ql, Hkv, G, D]
    return o.reshape(ql, hq, d)


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| (float), infinite when ``got`` holds a NaN or an infinity."""
    with np.errstate(invalid="ignore"):  # a corrupted fp16 can be a signalling NaN
        g = np.asarray(got, dtype=np.float64)
    if not np.isfinite(g).all():
        return float("inf")
    return float(np.abs(g - np.asarray(want, dtype=np.float64)).max()) if g.size else 0.0


def tolerance(act: str, want: np.ndarray, *, dense: bool) -> float:
    """The allowed max error for outputs ``want`` of activation type ``act`` (see the module docstring)."""
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    return (ACT_TOLERANCE[act] + (DENSE_EXTRA if dense else 0.0)) * scale
