"""Test helpers for the pool and kernel tests: page tables from a manager, dense attention, batches.

SWAP POINT: :func:`make_manager`. The kernel and end-to-end tests take every page table and slot mapping
from the Rust ``kvcore.KVCacheManager``, its free list first scrambled so page tables are non-contiguous.
:class:`EmulatedKVCacheManager` is a small Python model of the same API on ``kvcore.PageAllocator``
(copy-on-write copies included, through ``take_pending_copies``), used when the native module has no
manager or when ``KVCORE_TEST_EMULATED_MANAGER=1`` is set.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pytest

import kvcore
from kvcore import kernels as K
from kvcore.pool import KVPool, Layout, dtypes


class PageTable(NamedTuple):
    """FlashInfer CSR page table, as ``KVCacheManager.page_table`` returns it."""

    kv_indptr: np.ndarray  # [batch + 1] int32
    kv_indices: np.ndarray  # [kv_indptr[-1]] int32 page ids
    kv_last_page_len: np.ndarray  # [batch] int32 in [1, page_size]


@dataclass
class _Sequence:
    tokens: list[int]  # every token id of the sequence, prompt and generated
    pages: list[int]  # page ids, ceil(len(tokens) / page_size) of them


class EmulatedKVCacheManager:
    """A Python stand-in for ``kvcore.KVCacheManager``: prefix sharing, fork, CoW, LRU eviction.

    Pages come from a real ``kvcore.PageAllocator``. Full pages are registered in a prefix cache keyed by
    every token up to the page's end (page-aligned matching); the cache holds one reference on each, so
    freed sequences leave their full pages cached until :meth:`evict`. Appending into a shared partial
    last page (after :meth:`fork`) queues a copy; the runner takes the copies with
    :meth:`take_pending_copies` and applies them with ``copy_pages`` before writing K/V (as with the Rust
    manager).
    """

    def __init__(self, num_pages: int, page_size: int = 16, *, seed: int = 0) -> None:
        self.page_size = page_size
        self.alloc = kvcore.PageAllocator(num_pages)
        # Scramble the free list: allocate everything, free one page at a time in random order.
        every = self.alloc.allocate(self.alloc.num_free)
        assert every is not None
        for p in np.random.default_rng(seed).permutation(every):
            self.alloc.free(np.array([p], dtype=np.int32))
        self._seqs: dict[int, _Sequence] = {}
        self._cache: OrderedDict[tuple[int, ...], int] = OrderedDict()  # prefix -> page, LRU order
        self._copies: list[tuple[int, int]] = []  # pending (src, dst) copy-on-write pairs

    # ---------------------------------------------------------------- allocation with eviction

    def _allocate(self, n: int) -> list[int] | None:
        if n == 0:
            return []
        pages = self.alloc.allocate(n)
        if pages is None and self.evict(n - self.alloc.num_free) and self.alloc.num_free >= n:
            pages = self.alloc.allocate(n)
        return None if pages is None else [int(p) for p in pages]

    def _register_full_pages(self, seq: _Sequence, first_page: int) -> None:
        P = self.page_size
        for i in range(first_page, len(seq.tokens) // P):
            key = tuple(seq.tokens[: (i + 1) * P])
            if key not in self._cache:
                self._cache[key] = seq.pages[i]
                self.alloc.retain(np.array([seq.pages[i]], dtype=np.int32))

    # ---------------------------------------------------------------- the API

    def add_sequence(
        self, seq_id: int, prompt_tokens: Any, namespace: Any = None, priority: int = 0
    ) -> int | None:
        """Reserve slots for the prompt; returns the number of cached prompt tokens, or None (no room)."""
        assert seq_id not in self._seqs
        tokens = [int(t) for t in prompt_tokens]
        P = self.page_size
        matched: list[int] = []
        for i in range(len(tokens) // P):
            page = self._cache.get(tuple(tokens[: (i + 1) * P]))
            if page is None:
                break
            self._cache.move_to_end(tuple(tokens[: (i + 1) * P]))
            matched.append(page)
        if matched:
            self.alloc.retain(np.array(matched, dtype=np.int32))  # before any eviction can take them
        new = self._allocate(-(-len(tokens) // P) - len(matched))
        if new is None:
            if matched:
                self.alloc.free(np.array(matched, dtype=np.int32))
            return None
        seq = _Sequence(tokens, matched + new)
        self._seqs[seq_id] = seq
        self._register_full_pages(seq, len(matched))
        return len(matched) * P

    def append(self, seq_id: int, new_tokens: Any) -> bool:
        """Reserve slots for new tokens; False (nothing changed) when pages run out."""
        seq = self._seqs[seq_id]
        new_tokens = [int(t) for t in new_tokens]
        P = self.page_size
        n_old = len(seq.tokens)
        partial = n_old % P != 0
        cow = partial and new_tokens and self.alloc.ref_count(seq.pages[-1]) > 1
        need = -(-(n_old + len(new_tokens)) // P) - len(seq.pages) + (1 if cow else 0)
        pages = self._allocate(need)
        if pages is None:
            return False
        if cow:
            dst = pages.pop()
            src = seq.pages[-1]
            self._copies.append((src, dst))
            seq.pages[-1] = dst
            self.alloc.free(np.array([src], dtype=np.int32))
        seq.pages.extend(pages)
        seq.tokens.extend(new_tokens)
        self._register_full_pages(seq, n_old // P)
        return True

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every page of the parent (one more reference each)."""
        parent = self._seqs[parent_id]
        assert child_id not in self._seqs
        self.alloc.retain(np.array(parent.pages, dtype=np.int32))
        self._seqs[child_id] = _Sequence(list(parent.tokens), list(parent.pages))

    def free_sequence(self, seq_id: int) -> None:
        """Drop the sequence's references; cached full pages stay (evictable)."""
        seq = self._seqs.pop(seq_id)
        if seq.pages:
            self.alloc.free(np.array(seq.pages, dtype=np.int32))

    def page_table(self, seq_ids: list[int]) -> PageTable:
        P = self.page_size
        seqs = [self._seqs[s] for s in seq_ids]
        indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        indptr[1:] = np.cumsum([len(s.pages) for s in seqs])
        indices = np.array([p for s in seqs for p in s.pages], dtype=np.int32)
        last = np.array([(len(s.tokens) - 1) % P + 1 if s.tokens else 0 for s in seqs], dtype=np.int32)
        return PageTable(indptr, indices, last)

    def slot_mapping(self, seq_id: int, num_tokens: int) -> np.ndarray:
        """int64 [num_tokens]: slots of the sequence's last num_tokens tokens."""
        seq = self._seqs[seq_id]
        pos = np.arange(len(seq.tokens) - num_tokens, len(seq.tokens))
        pages = np.asarray(seq.pages, dtype=np.int64)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size

    def evict(self, num_pages: int) -> int:
        """Drop up to num_pages cached pages no sequence uses, least recently used first."""
        evicted = 0
        for key in list(self._cache):
            if evicted >= num_pages:
                break
            page = self._cache[key]
            if self.alloc.ref_count(page) == 1:  # only the cache holds it
                del self._cache[key]
                self.alloc.free(np.array([page], dtype=np.int32))
                evicted += 1
        return evicted

    def take_pending_copies(self) -> np.ndarray:
        """int32 [n, 2] copy-on-write (src, dst) pairs queued since the last call."""
        pairs = np.array(self._copies, dtype=np.int32).reshape(-1, 2)
        self._copies.clear()
        return pairs


def _scramble(manager: Any, num_pages: int, page_size: int, seed: int) -> None:
    """Leave the manager's free pages in a random order: fill the pool with one-page sequences, free
    them in random order (partial pages go straight back; with page_size 1 they are cached, so evict)."""
    ids = [10**9 + i for i in range(num_pages - 1)]
    width = max(page_size - 1, 1)
    for i, seq_id in enumerate(ids):
        hit = manager.add_sequence(seq_id, [10**6 + width * i + j for j in range(width)])
        assert hit == 0
    for seq_id in np.random.default_rng(seed).permutation(ids):
        manager.free_sequence(int(seq_id))
    manager.evict(num_pages)


def make_manager(num_pages: int, page_size: int, *, seed: int = 0) -> Any:
    """THE SWAP POINT: the manager the kernel tests take page tables and slot mappings from.

    The Rust ``kvcore.KVCacheManager`` (free list scrambled), or the Python emulation when the native
    module lacks it or ``KVCORE_TEST_EMULATED_MANAGER`` is set.
    """
    if os.environ.get("KVCORE_TEST_EMULATED_MANAGER") or not hasattr(kvcore, "KVCacheManager"):
        return EmulatedKVCacheManager(num_pages, page_size, seed=seed)
    manager = kvcore.KVCacheManager(num_pages, page_size)
    _scramble(manager, num_pages, page_size, seed)
    return manager


def take_copies(manager: Any) -> np.ndarray:
    """Copy-on-write pairs ``[n, 2]`` int32 (src, dst) queued by ``manager`` since the last call."""
    pairs: np.ndarray = manager.take_pending_copies()
    return pairs


# ------------------------------------------------------------------------------------ dense attention


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sm_scale: float) -> np.ndarray:
    """Plain causal attention of one sequence, no cache, float64.

    Args:
        q: ``[q_len, Hq, D]`` the last q_len tokens' queries.
        k: ``[kv_len, Hkv, D]`` every token's keys (q_len <= kv_len); v likewise.

    Returns:
        ``[q_len, Hq, D]`` float64.
    """
    ql, Hq, _ = q.shape
    L, Hkv, _ = k.shape
    G = Hq // Hkv
    kk = np.repeat(k.astype(np.float64), G, axis=1)
    vv = np.repeat(v.astype(np.float64), G, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) * sm_scale
    visible = np.arange(L)[None, :] <= (L - ql + np.arange(ql))[:, None]
    s = np.where(visible[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("hqk,khd->qhd", p, vv)
    return out


# ------------------------------------------------------------------------------------ batches


@dataclass
class Batch:
    """Sequences written into a pool through a manager; everything a dense check needs."""

    pool: KVPool
    manager: Any
    seq_ids: list[int]
    k: list[np.ndarray] = field(default_factory=list)  # per sequence: [kv_len, Hkv, D] float32
    v: list[np.ndarray] = field(default_factory=list)  # per sequence: [kv_len, Hkv, D] float32
    q_len: list[int] = field(default_factory=list)  # query tokens per sequence (the last q_len tokens)


def write_batch(
    rng: np.random.Generator,
    *,
    lens: list[int],
    q_lens: list[int],
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    layout: Layout = "HND",
    shared_prefix: int = 0,
) -> Batch:
    """Add ``len(lens)`` sequences to a fresh manager and append their K/V to layer 1 of a fresh pool.

    Sequences 1.. share the first ``shared_prefix`` tokens (and K/V rows) of sequence 0, which is added
    first, so they hit its cached pages and only their uncached tail is appended.
    """
    num_pages = sum(-(-n // page_size) for n in lens) + 4
    mgr = make_manager(num_pages, page_size, seed=int(rng.integers(1 << 30)))
    pool = KVPool(
        num_layers=2,
        num_pages=num_pages,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        kv_dtype=kv_dtype,
        layout=layout,
    )
    batch = Batch(pool, mgr, list(range(len(lens))))
    base_tokens = rng.integers(0, 1000, max(lens))
    base_k = rng.normal(size=(max(lens), num_kv_heads, head_dim)).astype(np.float32)
    base_v = rng.normal(size=(max(lens), num_kv_heads, head_dim)).astype(np.float32)
    if dtypes.is_quantized(kv_dtype):
        pool.calibrate_scales(1, base_k, base_v, headroom=1.25)
    for sid, (n, ql) in enumerate(zip(lens, q_lens, strict=True)):
        shared = min(shared_prefix, n) if sid else 0
        tokens = np.concatenate([base_tokens[:shared], rng.integers(1000, 2000, n - shared)])
        k = np.concatenate([base_k[:shared], rng.normal(size=(n - shared, num_kv_heads, head_dim))]).astype(
            np.float32
        )
        v = np.concatenate([base_v[:shared], rng.normal(size=(n - shared, num_kv_heads, head_dim))]).astype(
            np.float32
        )
        if sid == 0:
            k[:], v[:], tokens = base_k[:n], base_v[:n], base_tokens[:n]
        hit = mgr.add_sequence(sid, tokens)
        assert hit is not None and hit % page_size == 0 and hit <= shared + (n if sid == 0 else 0)
        new = n - hit
        K.append_kv(pool, 1, mgr.slot_mapping(sid, new), k[hit:], v[hit:])
        batch.k.append(k)
        batch.v.append(v)
        batch.q_len.append(ql)
    return batch


def dense_outputs(batch: Batch, q: np.ndarray, sm_scale: float, *, stored: bool = False) -> np.ndarray:
    """Dense attention per sequence over the original K/V, or (``stored``) over what the pool holds."""
    out, start = [], 0
    for sid, (k, v, ql) in enumerate(zip(batch.k, batch.v, batch.q_len, strict=True)):
        if stored:
            k, v = batch.pool.read_slots(1, batch.manager.slot_mapping(sid, k.shape[0]))
        out.append(dense_attention(q[start : start + ql], k, v, sm_scale))
        start += ql
    return np.concatenate(out)


# ------------------------------------------------------------------------------------ hostile calls


def random_pool(kv_dtype: str = "int8", *, num_pages: int = 6, page_size: int = 4) -> KVPool:
    """A 2-layer, 2-kv-head, head_dim-8 pool of random bytes and distinct scales: a stray write shows."""
    pool = KVPool(
        num_layers=2, num_pages=num_pages, num_kv_heads=2, head_dim=8, page_size=page_size, kv_dtype=kv_dtype
    )
    rng = np.random.default_rng(7)
    pool.data[...] = rng.integers(1, 100, pool.data.shape).astype(pool.data.dtype)
    if dtypes.is_quantized(kv_dtype):
        pool.set_scales(0, [0.5, 0.25], [0.125, 2.0])
        pool.set_scales(1, 0.75, 1.5)
    return pool


def assert_refused(
    pool: KVPool, err: type[Exception], name: str, call: Callable[..., Any], *args: Any, **kwargs: Any
) -> pytest.ExceptionInfo[Exception]:
    """``call(*args, **kwargs)`` raises ``err`` naming ``name``; the pool's bytes and scales are unchanged."""
    before = (pool.data.copy(), pool.k_scale.copy(), pool.v_scale.copy())
    with pytest.raises(err) as info:
        call(*args, **kwargs)
    assert name in str(info.value), f"the message does not name {name!r}: {info.value}"
    assert np.array_equal(pool.data, before[0]), "a refused call wrote to the pool"
    assert np.array_equal(pool.k_scale, before[1]) and np.array_equal(pool.v_scale, before[2]), "scales moved"
    return info


def other_thread_steps_during(call: Callable[[], object]) -> int:
    """How many steps a spinning Python thread made while ``call`` ran. The switch interval is
    raised so that the interpreter (almost) never takes the lock from this thread on its own: the
    spinner runs while ``call`` has released it."""
    progress = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            progress[0] += 1
            time.sleep(0)  # hands the interpreter back at once

    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        while progress[0] == 0:
            time.sleep(0.001)
        before = progress[0]
        call()
        return progress[0] - before
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old)


def llama_like(**overrides: object) -> dict[str, object]:
    """A Llama-3.1-8B-shaped config (32 layers, 32 heads, 8 KV heads, hidden 4096 -> head_dim 128)."""
    config: dict[str, object] = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return {k: v for k, v in config.items() if v is not None}


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of sample ``name{labels}`` in Prometheus text (parsed by prometheus_client)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels} in the metrics text")


def ref_page_key(parent: bytes, namespace: str | None, page: list[int], version: int = 1) -> bytes:
    """One page key as docs/api.md defines it, written from the docs alone (``"*"``: the public
    namespace; ``None``: the default one)."""
    import hashlib
    import struct

    if namespace is None:
        kind, name = 0, b""
    elif namespace == "*":
        kind, name = 2, b""
    else:
        kind, name = 1, namespace.encode()
    data = (
        bytes([version])
        + parent
        + bytes([kind])
        + struct.pack("<Q", len(name))
        + name
        + struct.pack("<Q", len(page))
        + struct.pack(f"<{len(page)}I", *page)
    )
    return hashlib.sha256(data).digest()[:16]


class FakeDeviceArray:
    """What the checks see of a CuPy array: shape, dtype, ndim, flags, ``__cuda_array_interface__``; like
    ``cupy.ndarray.__array__``, it refuses an implicit host copy."""

    def __init__(self, a: np.ndarray) -> None:
        self.shape, self.dtype, self.ndim, self.flags = a.shape, a.dtype, a.ndim, a.flags
        self.__cuda_array_interface__ = {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (0, False),
            "version": 3,
        }

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed.")
