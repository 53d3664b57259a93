"""The host tier: pages demoted from the pool into one contiguous buffer of slots in host memory.

Why one buffer of page-major slots: a slot is one page over every layer, K and V, contiguous (the
layout of :meth:`KVPool.host_buffer`), so a demotion or a reload moves one 0.5-2 MiB block per page
instead of ``2 * num_layers`` fragments; vLLM measured 4-5x faster transfers from that change alone.
On the GPU backend the buffer is pinned, so device <-> host copies are asynchronous DMA.

The Rust core decides what to store where and hands out slot numbers; this class only moves bytes and
remembers, per slot, the key of the page it holds, so that a load of the wrong key is a miss (False and
counted), never the wrong K/V.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kvcore.exceptions import ConfigError, OutOfMemoryError
from kvcore.pool import KVPool
from kvcore.pool.checks import index_array
from kvcore.tiers import _batch
from kvcore.tiers.codec import Geometry

__all__ = ["HostTier"]

_STAT_NAMES = (
    "num_slots",
    "slots_used",
    "bytes",
    "capacity_bytes",
    "stores",
    "store_failed",
    "loads",
    "load_failed",
    "load_failed_empty",
    "load_failed_key",
    "load_failed_scales",
    "bytes_written",
    "bytes_read",
    "forgets",
)


class HostTier:
    """``num_slots`` slots of host memory, each holding one page of pools of one geometry.

    Args:
        pool: a pool of the geometry stored (layers, heads, page size, head_dim, layout, dtype).
        num_slots: slots to allocate, >= 1.
        quantize: None (store the pool's bytes), ``"int8"`` or ``"int4"`` (KIVI, fp16/bf16 pools;
            :mod:`kvcore.tiers.codec`): a slot then holds ~57% / ~32% of a bf16 page (16 tokens,
            head_dim 128; the fp32 scales weigh more with fewer tokens or channels).
        name: the tier's name in stats and logs.

    Side effects: allocates ``num_slots * slot_bytes`` bytes (pinned when the pool is on the GPU) and
    touches every byte once, so first-touch page faults never land on a store.

    Raises:
        ConfigError: ``num_slots < 1``, an unknown quantization, or quantization of an fp8/int8 pool.
        OutOfMemoryError: the buffer cannot be allocated.

    Calls are serialized by a lock (the Mover may call from a worker thread).
    """

    def __init__(
        self, pool: KVPool, num_slots: int, *, quantize: str | None = None, name: str = "host"
    ) -> None:
        self.geometry = Geometry.of_pool(pool, quantize)
        if isinstance(num_slots, bool) or not isinstance(num_slots, int | np.integer) or num_slots < 1:
            raise ConfigError(f"num_slots: expected an integer >= 1, got {num_slots!r}")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name: expected a non-empty string, got {name!r}")
        self.name = name
        self.num_slots = int(num_slots)
        self.quantize = quantize
        self._codec = _batch.RowCodec(self.geometry)
        self.slot_bytes = self._codec.row_bytes  # bytes of one slot
        try:
            # [num_slots, slot_bytes] uint8: slot i is row i (page-major page bytes, or a quantized payload)
            self._rows: np.ndarray = pool.backend.empty_host((self.num_slots, self.slot_bytes), np.uint8)
            self._rows.fill(0)
        except (MemoryError, ValueError, OverflowError) as e:  # CuPy's OutOfMemoryError is a
            # MemoryError; NumPy says ValueError ("array is too big") past its size limit
            raise OutOfMemoryError(
                f"{name}: {self.num_slots} slots of {self.slot_bytes} bytes do not fit in host memory ({e})"
            ) from None
        self._used = np.zeros(self.num_slots, dtype=bool)  # [num_slots] bool: slot holds a page
        self._keys = np.zeros((self.num_slots, 16), dtype=np.uint8)  # [num_slots, 16] page key per slot
        self._scales = np.zeros((self.num_slots, 16), dtype=np.uint8)  # [num_slots, 16] scale digest
        self._stats = _batch.Counters(_STAT_NAMES)
        self._lock = threading.Lock()

    def store(
        self,
        pool: KVPool,
        pages: Any,
        slots: Any,
        keys: Any,
        parent_keys: Any,
        tokens: Any,
        namespaces: list[str | None],
    ) -> np.ndarray:
        """Copy pool page ``pages[i]`` (every layer, K and V) into slot ``slots[i]``.

        Args:
            pool: a pool of this tier's geometry.
            pages: int32 ``[n]`` page ids in ``[1, num_pages)`` (one may repeat: read into two slots).
            slots: int32 ``[n]`` distinct slots in ``[0, num_slots)``; a used slot is overwritten.
            keys: uint8 ``[n, 16]`` page keys, checked again on load.
            parent_keys: uint8 ``[n, 16]``; tokens: uint32 ``[n, page_size]``; namespaces: ``[n]`` str or
                None. Checked, not kept: host memory does not outlive the process that holds the index.

        Returns:
            bool ``[n]``: all True (a memory copy has no failure mode once the arguments are checked).

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: wrong shapes or dtypes, a page or
                slot out of range or repeated, a pool of another geometry, a namespace that is not
                valid Unicode (a lone surrogate: the disk and remote tiers could not store it).
                Nothing is written then.
        """
        a = _batch.check_store(
            self.geometry,
            self.num_slots,
            self.name,
            pool,
            pages,
            slots,
            keys,
            parent_keys,
            tokens,
            namespaces,
        )
        n = a.pages.shape[0]
        digest = np.frombuffer(_batch.scale_digest(pool), dtype=np.uint8)
        with self._lock:
            # Empty while their bytes change: a store interrupted mid-copy (KeyboardInterrupt, a
            # signal handler that raises) left new bytes under the slots' old keys, and a load of
            # the old page returned the new one's K/V. Now such slots miss until stored again.
            self._used[a.slots] = False
            self._codec.pages_to_rows(pool, a.pages, self._rows, a.slots)
            self._keys[a.slots] = a.keys
            self._scales[a.slots] = digest
            self._used[a.slots] = True
            self._stats.add("stores", n)
            self._stats.add("bytes_written", n * self.slot_bytes)
        return np.ones(n, dtype=bool)

    def load(self, pool: KVPool, slots: Any, pages: Any, keys: Any) -> np.ndarray:
        """Copy slot ``slots[i]`` into pool page ``pages[i]`` where the slot holds the page keyed ``keys[i]``.

        Args:
            pool: a pool of this tier's geometry.
            slots: int32 ``[n]`` slots in ``[0, num_slots)``.
            pages: int32 ``[n]`` distinct page ids in ``[1, num_pages)``.
            keys: uint8 ``[n, 16]`` the keys expected.

        Returns:
            bool ``[n]``: False (counted by reason) for an empty slot, a slot holding another key, or an
            fp8/int8 page stored under other pool scales. A False row's pool page is left untouched.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: wrong shapes or dtypes, values out
                of range, repeated pages, a pool of another geometry. Nothing is written then.
        """
        s, p, k = _batch.check_load(self.geometry, self.num_slots, self.name, pool, slots, pages, keys)
        digest = np.frombuffer(_batch.scale_digest(pool), dtype=np.uint8)
        with self._lock:
            used = self._used[s]
            key_ok = (self._keys[s] == k).all(axis=1)
            scales_ok = (self._scales[s] == digest).all(axis=1)
            ok = used & key_ok & scales_ok
            self._codec.rows_to_pages(pool, self._rows, s[ok], p[ok])
            num_ok = int(ok.sum())
            self._stats.add("loads", num_ok)
            self._stats.add("bytes_read", num_ok * self.slot_bytes)
            self._stats.add("load_failed", ok.shape[0] - num_ok)
            self._stats.add("load_failed_empty", int((~used).sum()))
            self._stats.add("load_failed_key", int((used & ~key_ok).sum()))
            self._stats.add("load_failed_scales", int((used & key_ok & ~scales_ok).sum()))
        return np.asarray(ok, dtype=bool)

    def forget(self, slots: Any) -> None:
        """Mark slots empty (the manager dropped their pages); later loads of them miss.

        Raises:
            InvalidDTypeError, InvalidArgumentError: slots that are not integers in ``[0, num_slots)``.
        """
        s = np.unique(index_array(slots, "slots", dtype=np.int64, low=0, high=self.num_slots, what="slots"))
        with self._lock:
            self._stats.add("forgets", int(self._used[s].sum()))
            self._used[s] = False

    def slot_keys(self) -> dict[int, bytes]:
        """``{slot: page key}`` of every slot holding a page (for audits: which tenant owns what)."""
        with self._lock:
            return {int(s): bytes(self._keys[s]) for s in np.flatnonzero(self._used)}

    def stats(self) -> dict[str, int]:
        """Counters (flat, every name always present): ``slots_used``, ``bytes`` (held now),
        ``stores``/``loads`` (rows that succeeded), ``load_failed`` and its reasons, byte totals."""
        with self._lock:
            out = self._stats.snapshot()
            used = int(self._used.sum())
        out.update(
            num_slots=self.num_slots,
            slots_used=used,
            bytes=used * self.slot_bytes,
            capacity_bytes=self.num_slots * self.slot_bytes,
        )
        return out

    def __repr__(self) -> str:
        q = f", quantize={self.quantize!r}" if self.quantize else ""
        return f"HostTier(name={self.name!r}, num_slots={self.num_slots}, slot_bytes={self.slot_bytes}{q})"
