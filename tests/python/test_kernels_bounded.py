"""Bounded caches in the NumPy kernels: sliding windows, null pages, position maps and page scores.

Every case is checked against dense float64 attention of one sequence at a time, over the K/V the pool
stores, with the same masks applied literally: a query at position ``p`` sees the keys at positions ``j``
with ``p - window < j <= p`` that are not on the null page. ``page_scores`` is checked against the dense
probabilities summed over query heads and query tokens, per page-table entry.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from kv_helpers import Batch, write_batch

from kvcore import kernels as K
from kvcore.kernels.plan import ROWS_PER_TILE, plan_attention, window_starts
from kvcore.pool import KVPool, dtypes

# |reference - dense| over the stored K/V: float32 rounding only (as in test_kernels_reference.py).
STORED_TOLERANCE = 2e-5
# page_scores against the dense probabilities: float32 softmax, per entry and in total.
SCORE_RTOL, SCORE_ATOL = 1e-4, 2e-5


# ------------------------------------------------------------------------------------ the dense model


def dense_masked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    sm_scale: float,
    key_pos: np.ndarray,
    window: int | None,
    null: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """float64 attention of one sequence's last ``q_len`` tokens with the bounded masks.

    Args:
        q: ``[q_len, Hq, D]``; k, v: ``[kv_len, Hkv, D]`` stored K/V.
        key_pos: ``[kv_len]`` key positions (query token ``i`` is key ``kv_len - q_len + i``).
        window: the sliding window, or None.
        null: ``[kv_len]`` bool, keys on the null page.

    Returns:
        (``[q_len, Hq, D]`` output, ``[Hq, q_len, kv_len]`` probabilities; rows that see nothing are 0).
    """
    ql, Hq, _ = q.shape
    L, Hkv, _ = k.shape
    G = Hq // Hkv
    kk = np.repeat(k.astype(np.float64), G, axis=1)
    vv = np.repeat(np.where(null[:, None, None], 0.0, v.astype(np.float64)), G, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) * sm_scale
    qp = key_pos[L - ql :].astype(np.int64)
    kp = key_pos.astype(np.int64)
    visible = kp[None, :] <= qp[:, None]
    if window is not None:
        visible &= kp[None, :] > qp[:, None] - window
    visible &= ~null[None, :]
    s = np.where(visible[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = p.sum(axis=-1, keepdims=True)
    p = np.where(total > 0, p / np.where(total > 0, total, 1.0), 0.0)
    out: np.ndarray = np.einsum("hqk,khd->qhd", p, vv)
    return out, p


def dense_batch(
    batch: Batch,
    q: np.ndarray,
    pt: Any,
    *,
    window: int | None = None,
    positions: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense outputs ``[num_q_tokens, Hq, D]`` and page masses ``[kv_indptr[-1]]`` of a whole batch."""
    P = batch.pool.page_size
    scale = 1 / math.sqrt(q.shape[-1])
    outs, mass = [], np.zeros(pt[1].shape[0])
    start = key_start = 0
    for sid, ql in enumerate(batch.q_len):
        L = batch.k[sid].shape[0]
        k, v = batch.pool.read_slots(1, batch.manager.slot_mapping(sid, L))
        e0, e1 = int(pt[0][sid]), int(pt[0][sid + 1])
        null = np.repeat(pt[1][e0:e1] == 0, P)[:L]
        kp = np.arange(L) if positions is None else positions[key_start : key_start + L]
        out, p = dense_masked(q[start : start + ql], k, v, scale, kp, window, null)
        outs.append(out)
        mass[e0:e1] = np.bincount(np.arange(L) // P, p.sum(axis=(0, 1)), minlength=e1 - e0)
        start += ql
        key_start += L
    return np.concatenate(outs), mass


# ------------------------------------------------------------------------------------ batches


def make_batch(
    seed: int,
    lens: list[int],
    q_lens: list[int],
    *,
    page_size: int,
    group: int,
    kv_dtype: str = "fp16",
    head_dim: int = 32,
) -> tuple[Batch, np.ndarray, np.ndarray, Any]:
    """A batch written through the manager; returns (batch, q float32, q_indptr int32, page table)."""
    rng = np.random.default_rng(seed)
    batch = write_batch(
        rng,
        lens=lens,
        q_lens=q_lens,
        page_size=page_size,
        num_kv_heads=2,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
    )
    qi = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.normal(size=(int(qi[-1]), 2 * group, head_dim)).astype(np.float32)
    pt = batch.manager.page_table(batch.seq_ids)
    return batch, q, qi, (pt.kv_indptr, pt.kv_indices.copy(), pt.kv_last_page_len)


def null_out_of_window(pt: Any, batch: Batch, window: int) -> tuple[Any, int]:
    """The page table with every page before the window of all its sequence's queries set to the null
    page 0 (what a sliding-window manager hands out); returns (table, number of null entries)."""
    indptr, indices, last = pt
    indices = indices.copy()
    P = batch.pool.page_size
    for sid, ql in enumerate(batch.q_len):
        first = batch.k[sid].shape[0] - ql - window + 1  # the first query token's first key
        n = max(first, 0) // P  # pages that end before it
        indices[indptr[sid] : indptr[sid] + n] = 0
    return (indptr, indices, last), int((indices == 0).sum())


def poison_null_page(pool: KVPool) -> None:
    """Fill the null page with NaN (or the largest int8): a single read of it would show."""
    nan_bits = {"fp16": np.float16(np.nan), "bf16": 0x7FC0, "fp8": 0x7F, "int8": 127}
    pool.data[:, :, 0] = nan_bits[pool.kv_dtype]


def check_close(out: np.ndarray, dense: np.ndarray) -> None:
    assert np.isfinite(out).all()
    err = np.abs(out - dense).max() if out.size else 0.0
    assert err < STORED_TOLERANCE, f"max |reference - dense| = {err:.2e}"


# ------------------------------------------------------------------------------------ sliding window


@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("window", [1, 5, 16, 37, 100, 10_000])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_window_decode_equals_dense(page_size: int, group: int, window: int, chunk: int | None) -> None:
    """Windows below a page, not a multiple of it, and past the context; NULL pages before the window."""
    batch, q, qi, pt = make_batch(
        window + page_size, [1, 37, 70, 300], [1] * 4, page_size=page_size, group=group
    )
    pt, num_null = null_out_of_window(pt, batch, window)
    assert num_null > 0 or window >= 300 - page_size
    poison_null_page(batch.pool)
    plan = plan_attention(
        pt, qi, page_size=page_size, num_qo_heads=2 * group, num_kv_heads=2, chunk_len=chunk, window=window
    )
    out = K.paged_decode_attention(q, batch.pool, 1, pt, plan=plan, window=window)
    check_close(out, dense_batch(batch, q, pt, window=window)[0])
    again = K.paged_decode_attention(q, batch.pool, 1, pt, window=window)  # planned on the fly
    check_close(again, dense_batch(batch, q, pt, window=window)[0])


@pytest.mark.parametrize("window", [3, 16, 29, 1000])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("page_size", [1, 16])
def test_window_prefill_equals_dense(page_size: int, group: int, window: int) -> None:
    """A ragged prefill: a whole prompt, two chunked-prefill tails and a decode token, 64-key splits."""
    lens, q_lens = [45, 270, 50, 33], [45, 20, 10, 1]
    batch, q, qi, pt = make_batch(window + 7 * page_size, lens, q_lens, page_size=page_size, group=group)
    pt, _ = null_out_of_window(pt, batch, window)
    poison_null_page(batch.pool)
    plan = plan_attention(
        pt, qi, page_size=page_size, num_qo_heads=2 * group, num_kv_heads=2, chunk_len=64, window=window
    )
    out = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, plan=plan, window=window)
    check_close(out, dense_batch(batch, q, pt, window=window)[0])


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
def test_window_with_null_pages_every_precision(kv_dtype: str) -> None:
    batch, q, qi, pt = make_batch(3, [130, 61], [9, 1], page_size=16, group=2, kv_dtype=kv_dtype)
    pt, num_null = null_out_of_window(pt, batch, 40)
    assert num_null == 6  # pages 0-4 of the first sequence (first key 82), page 0 of the second (21)
    poison_null_page(batch.pool)
    out = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, window=40)
    check_close(out, dense_batch(batch, q, pt, window=40)[0])


def test_a_null_page_inside_the_window_is_masked() -> None:
    """Null entries are masked wherever they are; a query that sees only null keys returns zeros."""
    batch, q, _, pt = make_batch(4, [64, 40], [1, 1], page_size=8, group=2)
    indptr, indices, last = pt
    indices[indptr[0] + 5] = 0  # keys 40..47 of sequence 0, inside a 48-key window
    indices[indptr[1] + 4] = 0  # the last page of sequence 1: its query's own key
    poison_null_page(batch.pool)
    out = K.paged_decode_attention(q, batch.pool, 1, (indptr, indices, last), window=48)
    dense, mass = dense_batch(batch, q, (indptr, indices, last), window=48)
    check_close(out, dense)
    out1 = K.paged_decode_attention(q, batch.pool, 1, (indptr, indices, last), window=1)
    assert not out1[1].any() and np.abs(out1[0]).max() > 0  # sequence 1 sees nothing in a 1-key window
    scores = np.zeros(indices.shape[0], np.float32)
    K.paged_decode_attention(q, batch.pool, 1, (indptr, indices, last), window=1, page_scores=scores)
    assert scores[indptr[1] : indptr[2]].sum() == 0 and math.isclose(scores.sum(), 4.0, rel_tol=1e-5)
    assert mass[indptr[0] + 5] == 0


def test_a_window_past_the_context_is_plain_causal_attention() -> None:
    batch, q, qi, pt = make_batch(5, [45, 70, 33], [45, 7, 1], page_size=16, group=4)
    plain = K.paged_prefill_attention(q, batch.pool, 1, pt, qi)
    for window in (70, 71, 10**6, 2**40):
        assert np.array_equal(K.paged_prefill_attention(q, batch.pool, 1, pt, qi, window=window), plain)


# ------------------------------------------------------------------------------------ positions


def sinks_and_recent(total: int, num_sinks: int, num_recent: int) -> np.ndarray:
    """StreamingLLM's kept positions of a ``total``-token context: the first sinks, the last recent."""
    return np.concatenate([np.arange(num_sinks), np.arange(total - num_recent, total)]).astype(np.int32)


@pytest.mark.parametrize("window", [None, 24, 1000])
@pytest.mark.parametrize("page_size", [1, 16])
def test_streaming_sinks_and_recent(page_size: int, window: int | None) -> None:
    """Compacted tables: 4 sinks + the recent tokens of 500 / 90-token contexts, decode and prefill."""
    kept = [sinks_and_recent(500, 4, 60), sinks_and_recent(90, 4, 29)]
    lens = [k.shape[0] for k in kept]
    positions = np.concatenate(kept)
    for q_lens in ([1, 1], [12, 3]):
        batch, q, qi, pt = make_batch(len(q_lens) + page_size, lens, q_lens, page_size=page_size, group=4)
        out = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, window=window, positions=positions)
        check_close(out, dense_batch(batch, q, pt, window=window, positions=positions)[0])
        if window is None:  # positions increase: causality is the same, so is the output, bit for bit
            assert np.array_equal(out, K.paged_prefill_attention(q, batch.pool, 1, pt, qi))
        if q_lens == [1, 1]:
            dec = K.paged_decode_attention(q, batch.pool, 1, pt, window=window, positions=positions)
            assert np.array_equal(dec, out)


@pytest.mark.parametrize("seed", range(4))
def test_heavy_hitter_positions_with_gaps(seed: int) -> None:
    """Random evictions (gaps anywhere), a window in positions, GQA, 64-key splits."""
    rng = np.random.default_rng(seed)
    lens, q_lens = [200, 75, 1, 130], [1, 6, 1, 30]
    kept = [np.sort(rng.choice(4 * n, n, replace=False)).astype(np.int32) for n in lens]
    for k, ql in zip(kept, q_lens, strict=True):
        k[len(k) - ql :] = k[len(k) - ql - 1] + 1 + np.arange(ql) if len(k) > ql else np.arange(ql)
    positions = np.concatenate(kept)
    batch, q, qi, pt = make_batch(seed, lens, q_lens, page_size=16, group=3)
    window = int(rng.integers(20, 300))
    plan = plan_attention(
        pt, qi, page_size=16, num_qo_heads=6, num_kv_heads=2, chunk_len=64, window=window, positions=positions
    )
    out = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, plan=plan, window=window, positions=positions)
    check_close(out, dense_batch(batch, q, pt, window=window, positions=positions)[0])


def test_identity_positions_equal_the_index_window() -> None:
    batch, q, qi, pt = make_batch(6, [100, 37], [5, 1], page_size=16, group=2)
    positions = np.concatenate([np.arange(100), np.arange(37)]).astype(np.int32)
    for window in (None, 1, 20):
        a = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, window=window)
        b = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, window=window, positions=positions)
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------ page scores


@pytest.mark.parametrize(
    ("window", "compacted"), [(None, False), (29, False), (None, True), (50, True)], ids=str
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_page_scores_are_the_dense_probability_mass(
    page_size: int, window: int | None, compacted: bool
) -> None:
    lens, q_lens = [300, 45, 70, 33], [1, 45, 9, 1]
    batch, q, qi, pt = make_batch(8 + page_size, lens, q_lens, page_size=page_size, group=4)
    positions = None
    if compacted:
        positions = np.concatenate([3 * np.arange(n) + (n % 5) for n in lens]).astype(np.int32)
    elif window is not None:
        pt, _ = null_out_of_window(pt, batch, window)
        poison_null_page(batch.pool)
    plan = plan_attention(
        pt,
        qi,
        page_size=page_size,
        num_qo_heads=8,
        num_kv_heads=2,
        chunk_len=64,
        window=window,
        positions=positions,
    )
    assert plan.num_partials > 0  # the merged log-sum-exp of split rows is exercised
    start = np.linspace(0, 1, pt[1].shape[0]).astype(np.float32)
    scores = start.copy()
    kwargs: dict[str, Any] = {"plan": plan, "window": window, "positions": positions}
    out = K.paged_prefill_attention(q, batch.pool, 1, pt, qi, page_scores=scores, **kwargs)
    assert np.array_equal(out, K.paged_prefill_attention(q, batch.pool, 1, pt, qi, **kwargs))
    dense_out, mass = dense_batch(batch, q, pt, window=window, positions=positions)
    check_close(out, dense_out)
    added = scores - start
    assert math.isclose(float(added.astype(np.float64).sum()), 8 * int(qi[-1]), rel_tol=1e-5)
    np.testing.assert_allclose(added, mass, rtol=SCORE_RTOL, atol=SCORE_ATOL)
    if window is not None and not compacted:
        assert (added[pt[1] == 0] == 0).all()


def test_page_scores_accumulate_over_calls() -> None:
    """Two steps of a decode loop (one layer each) add up; a second layer's call adds its own mass."""
    batch, q, _, pt = make_batch(9, [64, 150], [1, 1], page_size=16, group=4)
    scores = np.zeros(pt[1].shape[0], np.float32)
    q2 = -2 * q[::-1].copy()
    K.paged_decode_attention(q, batch.pool, 1, pt, page_scores=scores)
    K.paged_decode_attention(q2, batch.pool, 1, pt, page_scores=scores)
    expected = dense_batch(batch, q, pt)[1] + dense_batch(batch, q2, pt)[1]
    np.testing.assert_allclose(scores, expected, rtol=SCORE_RTOL, atol=SCORE_ATOL)
    assert math.isclose(float(scores.sum()), 2 * 8 * 2, rel_tol=1e-5)
    K.paged_decode_attention(q, batch.pool, 0, pt, page_scores=scores)  # layer 0 holds zeros: uniform
    uniform = np.concatenate([np.bincount(np.arange(n) // 16, minlength=-(-n // 16)) / n for n in (64, 150)])
    np.testing.assert_allclose(scores - expected, 8 * uniform, rtol=SCORE_RTOL, atol=SCORE_ATOL)


# ------------------------------------------------------------------------------------ the plan


def test_window_starts_match_the_literal_mask() -> None:
    rng = np.random.default_rng(10)
    for _ in range(30):
        lens = rng.integers(1, 60, int(rng.integers(1, 5)))
        q_lens = [int(rng.integers(0, n + 1)) for n in lens]
        qi = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        kept = [np.sort(rng.choice(3 * int(n), int(n), replace=False)) for n in lens]
        window = int(rng.integers(1, 80))
        for positions in (None, np.concatenate(kept).astype(np.int32)):
            got = window_starts(lens.astype(np.int32), qi, window, positions)
            want, key_start = [], 0
            for n, ql in zip(lens, q_lens, strict=True):
                kp = np.arange(n) if positions is None else positions[key_start : key_start + n]
                for i in range(ql):
                    p = kp[n - ql + i]
                    want.append(int(np.flatnonzero((kp > p - window) & (kp <= p))[0]))
                key_start += n
            assert got.tolist() == want


def test_a_windowed_plan_skips_the_pages_before_every_window() -> None:
    """Decode: each tile's work is its window from the 16-key step holding the window's first key.

    (Items start at multiples of 16 keys, a warp's step: the CUDA kernel's one-page-per-step path.)
    """
    lens = np.array([5000, 3000, 40, 256], np.int32)
    pages = -(-lens // 16)
    pt = (
        np.concatenate([[0], np.cumsum(pages)]).astype(np.int32),
        np.arange(1, pages.sum() + 1, dtype=np.int32),
        (lens - 1) % 16 + 1,
    )
    qi = np.arange(5, dtype=np.int32)
    for chunk in (None, 64, 1024):
        plain = plan_attention(pt, qi, page_size=16, num_qo_heads=8, num_kv_heads=2, chunk_len=chunk)
        windowed = plan_attention(
            pt, qi, page_size=16, num_qo_heads=8, num_kv_heads=2, chunk_len=chunk, window=256
        )
        work = lambda plan: int((plan.items[:, 3] - plan.items[:, 2]).sum())  # noqa: E731
        first_step = np.maximum(lens - 256, 0) // 16 * 16
        assert work(plain) == lens.sum() and work(windowed) == (lens - first_step).sum()
        assert (windowed.items[:, 2] % 16 == 0).all()
        assert (
            windowed.kv_first is not None and windowed.kv_first.tolist() == np.maximum(lens - 256, 0).tolist()
        )


def test_windowed_items_cover_each_tile_from_its_first_visible_key() -> None:
    pt = (np.array([0, 3, 3, 10], np.int32), np.arange(1, 11, dtype=np.int32), np.array([5, 0, 16], np.int32))
    qi = np.array([0, 33, 33, 34], np.int32)
    G = 3
    plan = plan_attention(pt, qi, page_size=16, num_qo_heads=6, num_kv_heads=2, chunk_len=64, window=10)
    assert plan.kv_first is not None
    for seq, q_len in ((0, 33), (2, 1)):
        for tile in range(-(-q_len * G // ROWS_PER_TILE)):
            rows = plan.items[(plan.items[:, 0] == seq) & (plan.items[:, 1] == tile)]
            first_token = int(qi[seq]) + tile * ROWS_PER_TILE // G
            last_row = min((tile + 1) * ROWS_PER_TILE, q_len * G) - 1
            keys = plan.kv_len[seq] - q_len + last_row // G + 1
            # From the 16-key step holding the first visible key (a warp step; the keys before are masked).
            assert rows[0, 2] == plan.kv_first[first_token] // 16 * 16 and rows[-1, 3] == keys
            assert (rows[1:, 2] == rows[:-1, 3]).all() and (rows[1:, 2] % 64 == 0).all()
    assert sorted(plan.items[plan.items[:, 4] >= 0, 4].tolist()) == list(range(plan.num_partials))


def emulate_cuda_partition(batch: Batch, q: np.ndarray, pt: Any, plan: Any) -> tuple[np.ndarray, np.ndarray]:
    """The CUDA kernels' index logic in float64: every item of the plan over its keys ``[begin, end)``
    with the kernel's mask (``kv_first[token] <= key <= limit``, not on the null page), the LSE merge of a
    tile's items, and page scores from each row's final LSE, item by item. The positions reach the
    kernels only through ``plan.kv_first``: this checks that the plan's cut and that array are exact."""
    P, Hkv, G = batch.pool.page_size, plan.num_kv_heads, plan.group_size
    scale = 1 / math.sqrt(q.shape[-1])
    kv = [batch.pool.read_slots(1, batch.manager.slot_mapping(s, int(n))) for s, n in enumerate(plan.kv_len)]
    parts: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    scored = []
    for seq, tile, begin, end, _ in plan.items.tolist():
        q0, ql, L = (
            int(plan.q_indptr[seq]),
            int(plan.q_indptr[seq + 1] - plan.q_indptr[seq]),
            int(plan.kv_len[seq]),
        )
        rows = np.arange(tile * ROWS_PER_TILE, min((tile + 1) * ROWS_PER_TILE, ql * G))
        token, g = rows // G, rows % G
        first = 0 if plan.kv_first is None else plan.kv_first[q0 + token][:, None]
        keys = np.arange(begin, end)
        page = pt[1][pt[0][seq] + keys // P]
        visible = (keys >= first) & (keys <= (L - ql + token)[:, None]) & (page != 0)
        k, v = kv[seq]
        for h in range(Hkv):
            qr = q[q0 + token, h * G + g].astype(np.float64)  # [rows, D]
            s = np.where(visible, qr @ k[keys, h].T.astype(np.float64) * scale, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(m), m, 0))
            lsum = p.sum(axis=1, keepdims=True)
            o = p @ np.where((page != 0)[:, None], v[keys, h], 0).astype(np.float64)
            lse = np.where(
                lsum > 0, np.where(np.isfinite(m), m, 0) + np.log(np.maximum(lsum, 1e-300)), -np.inf
            )
            parts.setdefault((seq, tile, h), []).append((o / np.maximum(lsum, 1e-300), lse, rows))
            scored.append((seq, keys, q0 + token, h * G + g, s))
    out = np.zeros(q.shape)
    row_lse = np.full(q.shape[:2], -np.inf)
    for (seq, _, h), items in parts.items():
        lse = np.stack([x[1] for x in items])  # [items, rows, 1]
        top = lse.max(axis=0)
        w = np.exp(lse - np.where(np.isfinite(top), top, 0))
        rows = items[0][2]
        token, g = int(plan.q_indptr[seq]) + rows // G, h * G + rows % G
        out[token, g] = (w * np.stack([x[0] for x in items])).sum(axis=0) / np.maximum(w.sum(axis=0), 1e-300)
        row_lse[token, g] = np.where(w.sum(axis=0) > 0, top + np.log(w.sum(axis=0)), -np.inf)[:, 0]
    mass = np.zeros(pt[1].shape[0])
    for seq, keys, token, head, s in scored:
        lse = row_lse[token, head][:, None]
        p = np.exp(s - np.where(np.isfinite(lse), lse, 0)).sum(axis=0)
        np.add.at(mass, pt[0][seq] + keys // P, p)
    return out, mass


@pytest.mark.parametrize(
    ("window", "compacted"), [(None, False), (7, False), (40, False), (None, True), (33, True)], ids=str
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_cuda_work_partition_is_exact(page_size: int, window: int | None, compacted: bool) -> None:
    """Items + kv_first (what the CUDA kernels read) give dense attention and dense page masses."""
    lens, q_lens = [300, 45, 70, 1], [1, 45, 9, 1]
    batch, q, qi, pt = make_batch(11 + page_size, lens, q_lens, page_size=page_size, group=3)
    positions = None
    if compacted:
        positions = np.concatenate([np.arange(n) * 2 + n % 3 for n in lens]).astype(np.int32)
    elif window is not None:
        pt, _ = null_out_of_window(pt, batch, window)
    for chunk in (64, None):
        plan = plan_attention(
            pt,
            qi,
            page_size=page_size,
            num_qo_heads=6,
            num_kv_heads=2,
            chunk_len=chunk,
            window=window,
            positions=positions,
        )
        out, mass = emulate_cuda_partition(batch, q, pt, plan)
        dense, dense_mass = dense_batch(batch, q, pt, window=window, positions=positions)
        assert np.abs(out - dense).max() < 1e-9
        np.testing.assert_allclose(mass, dense_mass, rtol=1e-9, atol=1e-9)
