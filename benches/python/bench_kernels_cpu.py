"""pytest-benchmark of the NumPy kernel references: what CPU users run (``backend="numpy"`` pools).

Run: ``.venv/bin/python -m pytest benches/python/bench_kernels_cpu.py --benchmark-columns=median,mean,ops``

Shapes are those of an 8-kv-head, head_dim-128 model (Llama-3-8B / 70B-TP8 class), page size 16:
- ``append_kv``: 256 new tokens into one layer (bf16 copy, fp8 quantization);
- ``decode``: batch 8, 2,048 cached tokens each, G = 4 (32 query heads), one layer;
- ``prefill``: 2 sequences, 256 new tokens over a 1,024-token cached prefix, one layer;
- ``copy_pages``: 64 pairs over 8 layers; ``gather``/``scatter``: 64 pages over 8 layers.
``extra_info`` holds the bytes moved (and K/V bytes read for attention) so GB/s can be derived.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcore import kernels as K
from kvcore.pool import KVPool

H, D, P = 8, 128, 16


def _pool(num_layers: int, num_pages: int, kv_dtype: str) -> KVPool:
    pool = KVPool(
        num_layers=num_layers, num_pages=num_pages, num_kv_heads=H, head_dim=D, page_size=P, kv_dtype=kv_dtype
    )
    rng = np.random.default_rng(0)
    if kv_dtype == "bf16":
        pool.data[...] = rng.integers(
            0x3C00, 0x4000, pool.data.shape, dtype=np.uint16
        )  # bf16 values in [2^-7, 2)
    else:
        pool.data[...] = rng.integers(0, 0x77, pool.data.shape, dtype=np.uint8)  # finite e4m3 values
    return pool


def _table(
    rng: np.random.Generator, num_pages: int, lens: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts = [-(-n // P) for n in lens]
    indices = rng.permutation(np.arange(1, num_pages))[: sum(counts)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([(n - 1) % P + 1 for n in lens], np.int32)
    return indptr, indices, last


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_bench_append_kv(benchmark: Any, kv_dtype: str) -> None:
    pool = _pool(1, 64, kv_dtype)
    rng = np.random.default_rng(1)
    k, v = rng.normal(size=(2, 256, H, D)).astype(np.float16)
    slots = rng.permutation(np.arange(P, 64 * P))[:256].astype(np.int64)
    benchmark(K.append_kv, pool, 0, slots, k, v)
    benchmark.extra_info["bytes_in"] = int(k.nbytes + v.nbytes)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_bench_decode(benchmark: Any, kv_dtype: str) -> None:
    B, L, G = 8, 2048, 4
    num_pages = B * L // P + 1
    pool = _pool(1, num_pages, kv_dtype)
    rng = np.random.default_rng(2)
    pt = _table(rng, num_pages, [L] * B)
    q = rng.normal(size=(B, H * G, D)).astype(np.float16)
    plan = K.plan_attention(pt, np.arange(B + 1), page_size=P, num_qo_heads=H * G, num_kv_heads=H)
    out = np.empty_like(q)
    benchmark(K.paged_decode_attention, q, pool, 0, pt, plan=plan, out=out)
    benchmark.extra_info["kv_bytes_read"] = int(2 * B * L * H * D * pool.storage_dtype.itemsize)


def test_bench_prefill_over_prefix(benchmark: Any) -> None:
    B, ctx, new, G = 2, 1024, 256, 4
    L = ctx + new
    num_pages = B * (-(-L // P)) + 1
    pool = _pool(1, num_pages, "bf16")
    rng = np.random.default_rng(3)
    pt = _table(rng, num_pages, [L] * B)
    q_indptr = np.array([0, new, 2 * new], np.int32)
    q = rng.normal(size=(B * new, H * G, D)).astype(np.float16)
    plan = K.plan_attention(pt, q_indptr, page_size=P, num_qo_heads=H * G, num_kv_heads=H)
    benchmark(K.paged_prefill_attention, q, pool, 0, pt, q_indptr, plan=plan)
    benchmark.extra_info["query_tokens"] = B * new


def test_bench_copy_pages(benchmark: Any) -> None:
    pool = _pool(8, 257, "bf16")
    pairs = np.stack([np.arange(1, 65), np.arange(129, 193)], axis=1).astype(np.int32)
    benchmark(K.copy_pages, pool, pairs)
    benchmark.extra_info["bytes_copied"] = 64 * pool.page_bytes


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_bench_gather_scatter(benchmark: Any, op: str) -> None:
    pool = _pool(8, 257, "bf16")
    ids = np.random.default_rng(4).permutation(np.arange(1, 257))[:64].astype(np.int32)
    buf = pool.host_buffer(64)
    K.gather_pages(pool, ids, buf)
    if op == "gather":
        benchmark(K.gather_pages, pool, ids, buf)
    else:
        benchmark(K.scatter_pages, pool, ids, buf)
    benchmark.extra_info["bytes_moved"] = 64 * pool.page_bytes
