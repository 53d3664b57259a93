"""What the host and disk tiers share: argument checks, counters, and page <-> row copies.

A *row* is one stored page in host memory: uint8 ``[row_bytes]``, the page-major bytes of the page (or
its quantized payload, :mod:`kvcore.tiers.codec`). The host tier's slots are rows; the disk tier stages
rows for a quantized tier or a GPU pool, and otherwise writes and reads a page's row in place, as the
pool pieces :meth:`RowCodec.host_planes` lists.

Why copies go row by row (or run by run) rather than through ``gather_pages``: with NumPy, a fancy-indexed
gather into a staging buffer and a second copy into the slot rows would move every byte twice; one
assignment per page (per run of consecutive pages and rows) copies each byte once, at memcpy speed. On
the GPU the pages are gathered on the device by one kernel launch, then each run of consecutive rows
crosses PCIe in one ``cudaMemcpyAsync`` (one D2H per run into pinned memory, then one synchronization).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.pool import KVPool
from kvcore.pool import dtypes as kv_dtypes
from kvcore.pool.checks import index_array
from kvcore.tiers import codec
from kvcore.tiers.codec import Geometry

__all__ = ["STAGING_BYTES", "Counters", "RowCodec", "StoreArgs", "check_load", "check_store", "scale_digest"]

# Bytes of page data one staging step holds (device staging, disk staging, quantization temporaries):
# big enough that per-chunk overheads vanish, small enough to leave HBM and RAM to the cache itself.
STAGING_BYTES: Final[int] = 64 << 20


class Counters:
    """A flat ``name -> int`` dict of counters with a fixed set of names (every name is present, at 0,
    from the start, so a metrics exporter sees a stable schema)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._c: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, value: int = 1) -> None:
        self._c[name] += value  # KeyError on a misspelt name: a bug, caught by the tests

    def snapshot(self) -> dict[str, int]:
        return dict(self._c)


def scale_digest(pool: KVPool) -> bytes:
    """XXH3-128 of the pool's k_scale then v_scale (float32 LE) for fp8/int8 pools; 16 zeros otherwise.

    Stored beside every fp8/int8 page: its bytes mean ``x / scale`` and are garbage under other scales.
    """
    if not kv_dtypes.is_quantized(pool.kv_dtype):
        return codec.NO_SCALES
    k = np.ascontiguousarray(pool.backend.asnumpy(pool.k_scale), dtype="<f4")
    v = np.ascontiguousarray(pool.backend.asnumpy(pool.v_scale), dtype="<f4")
    return codec.checksum(np.concatenate([k.reshape(-1), v.reshape(-1)]).view(np.uint8))


def check_pool(geometry: Geometry, pool: Any, who: str) -> None:
    """``pool`` must be a KVPool of exactly the tier's geometry (InvalidArgumentError otherwise)."""
    if not isinstance(pool, KVPool):
        raise InvalidDTypeError(f"pool: expected a KVPool, got {type(pool).__name__}")
    try:
        got = Geometry.of_pool(pool, geometry.quantize)
    except ConfigError:  # an fp8/int8 pool given to a quantizing tier: another geometry, not a setting
        got = Geometry.of_pool(pool, None)
    if got != geometry:
        raise InvalidArgumentError(f"pool: {who} stores pages of {geometry}, this pool has {got}")


def _distinct(a: np.ndarray, name: str) -> None:
    if a.shape[0] > 1 and np.unique(a).shape[0] != a.shape[0]:
        raise InvalidArgumentError(f"{name}: a value appears twice")


def _rows(a: np.ndarray, n: int, name: str) -> None:
    if a.shape[0] != n:
        raise InvalidDTypeError(f"{name}: expected {n} rows (one per page), got {a.shape[0]}")


@dataclass(frozen=True)
class StoreArgs:
    """Checked arguments of a ``store`` call (n rows)."""

    pages: np.ndarray  # int64 [n], pool page ids in [1, num_pages) (one page may go to two slots)
    slots: np.ndarray  # int64 [n], distinct slots in [0, num_slots)
    keys: np.ndarray  # uint8 [n, 16]
    parent_keys: np.ndarray  # uint8 [n, 16]
    tokens: np.ndarray  # uint32 [n, page_size]
    namespaces: list[str | None]  # [n]


def _page_ids(pool: KVPool, pages: Any, *, distinct: bool) -> np.ndarray:
    ids = index_array(
        pages,
        "pages",
        dtype=np.int64,
        low=1,
        high=pool.num_pages,
        what="page ids",
        hint=" (page 0 is the null page)",
        error=InvalidPageError,
    )
    if distinct:
        _distinct(ids, "pages")
    return ids


def _slot_ids(slots: Any, num_slots: int) -> np.ndarray:
    return index_array(slots, "slots", dtype=np.int64, low=0, high=num_slots, what="slots")


def _keys(keys: Any, n: int, name: str) -> np.ndarray:
    k = index_array(keys, name, dtype=np.uint8, trailing=(16,), what="key bytes")
    _rows(k, n, name)
    return k


def check_store(
    geometry: Geometry,
    num_slots: int,
    who: str,
    pool: Any,
    pages: Any,
    slots: Any,
    keys: Any,
    parent_keys: Any,
    tokens: Any,
    namespaces: Any,
) -> StoreArgs:
    """Every argument of ``store``, checked before anything is written.

    Raises:
        InvalidDTypeError: wrong types, shapes or row counts.
        InvalidPageError: a page id out of ``[1, num_pages)``.
        InvalidArgumentError: a pool of another geometry, a slot out of range, a slot repeated, a
            namespace that is not a str or None, or not encodable as UTF-8 (a lone surrogate: every
            tier stores the namespace as UTF-8, so this is checked before any row is written, not
            found midway).

    A page may repeat (read twice, into two slots): one batch can store a public page under the
    public namespace's key and, for a tenant whose prompt runs through it, under the tenant's.
    """
    check_pool(geometry, pool, who)
    p = _page_ids(pool, pages, distinct=False)
    n = p.shape[0]
    s = _slot_ids(slots, num_slots)
    _rows(s, n, "slots")
    _distinct(s, "slots")
    k = _keys(keys, n, "keys")
    pk = _keys(parent_keys, n, "parent_keys")
    t = index_array(tokens, "tokens", dtype=np.uint32, trailing=(geometry.page_size,), what="token ids")
    _rows(t, n, "tokens")
    if not isinstance(namespaces, list | tuple) or len(namespaces) != n:
        raise InvalidDTypeError(
            f"namespaces: expected a list of {n} str or None, got {type(namespaces).__name__}"
        )
    ns = list(namespaces)
    for x in ns:
        if x is None:
            continue
        if not isinstance(x, str):
            raise InvalidArgumentError(f"namespaces: expected str or None, got {x!r}")
        if not x.isascii():  # ASCII (the common case, O(1) in CPython) always encodes
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgumentError(
                    f"namespaces: {x[:40]!r} is not valid Unicode (it holds a lone surrogate)"
                ) from None
    return StoreArgs(p, s, k, pk, t, ns)


def check_load(
    geometry: Geometry, num_slots: int, who: str, pool: Any, slots: Any, pages: Any, keys: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(slots int64[n], pages int64[n], keys uint8[n, 16])`` of a ``load`` call, checked.

    Slots may repeat (one stored page copied to two pool pages); pages may not (a page has one content).
    """
    check_pool(geometry, pool, who)
    s = _slot_ids(slots, num_slots)
    n = s.shape[0]
    p = _page_ids(pool, pages, distinct=True)
    _rows(p, n, "pages")
    return s, p, _keys(keys, n, "keys")


def runs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Blocks ``(a0, b0, start, length)`` covering ``i`` in ``[0, n)``: ``a[start + j] == a0 + j`` and
    ``b[start + j] == b0 + j`` for ``j < length``, i.e. each block is one copy of ``length`` pages."""
    n = a.shape[0]
    if n == 0:
        return []
    brk = (np.flatnonzero((np.diff(a) != 1) | (np.diff(b) != 1)) + 1).tolist()
    starts = [0, *brk]
    a0, b0 = a[starts].tolist(), b[starts].tolist()
    return [(x, y, s, e - s) for x, y, s, e in zip(a0, b0, starts, [*brk, n], strict=True)]


def _by_page(pages: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int, int]]:
    """:func:`runs` of (page, row) pairs in page order: the pool is then walked forward, which the
    hardware prefetchers prefer, and consecutive pages that land in consecutive rows merge."""
    order = np.argsort(pages, kind="stable")
    return runs(pages[order], rows[order])


class RowCodec:
    """Moves pages of a pool of one geometry to and from host rows, quantizing on the way if asked.

    Holds the device staging buffers of the CuPy path (allocated on first use, at most
    :data:`STAGING_BYTES` each), so steady-state calls allocate nothing large.
    """

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.row_bytes = geometry.payload_bytes  # bytes of one row
        # float32 temporaries dominate quantization: ~4 float32 copies of a page live at once
        per_page = max(geometry.page_bytes, 16 * geometry.page_elems if geometry.quantize else 0)
        self.chunk_pages = max(1, STAGING_BYTES // per_page)  # pages per staging step
        self._dev_pages: Any = None  # cupy [chunk_pages, L, 2, *page_shape] storage dtype
        self._dev_rows: Any = None  # cupy uint8 [chunk_pages, row_bytes] (quantized loads)

    def host_planes(self, pool: KVPool) -> np.ndarray | None:
        """uint8 ``[num_layers * 2, num_pages, piece_bytes]``, a view of a NumPy pool's data (no copy),
        where a page's row is the concatenation of ``planes[:, page]`` (``piece_bytes`` = one layer's
        K or V page); None for a quantized geometry or a device pool (their rows are staged).

        Why: a page's row is already in the pool, in ``2 * num_layers`` contiguous pieces, so the disk
        tier writes it from there and reads it back there (``writev``/``readv``), copying nothing.
        """
        data = pool.data
        if self.geometry.quantize is not None or pool.backend.is_device or not data.flags.c_contiguous:
            return None
        planes: np.ndarray = data.view(np.uint8).reshape(data.shape[0] * 2, data.shape[2], -1)
        return planes

    # --------------------------------------------------------------------------- pool -> rows

    def pages_to_rows(self, pool: KVPool, pages: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> None:
        """``dst[rows[i]] = page pages[i]`` (stored form) for every i.

        Args:
            pool: a pool of this geometry.
            pages: int64 ``[n]`` page ids.
            dst: uint8 ``[S, row_bytes]`` host rows (pinned memory when the pool is on the GPU, for
                asynchronous copies; pageable memory works, synchronously).
            rows: int64 ``[n]`` distinct row indices into ``dst``.
        """
        if pages.shape[0] == 0:
            return
        if pool.backend.is_device:
            self._device_to_rows(pool, pages, dst, rows)
        elif self.geometry.quantize is None:
            typed = self._typed(dst, pool)
            data = pool.data
            for p, r, _, k in _by_page(pages, rows):
                if k == 1:
                    typed[r] = data[:, :, p]
                else:
                    typed[r : r + k] = np.moveaxis(data[:, :, p : p + k], 2, 0)
        else:
            mode = self.geometry.quantize
            for s in range(0, pages.shape[0], self.chunk_pages):
                ids = pages[s : s + self.chunk_pages]
                x = kv_dtypes.decode(np.moveaxis(pool.data[:, :, ids], 2, 0), pool.kv_dtype)
                dst[rows[s : s + self.chunk_pages]] = codec.quantize_pages(x, mode, pool.layout)

    def rows_to_pages(self, pool: KVPool, src: np.ndarray, rows: np.ndarray, pages: np.ndarray) -> None:
        """Page ``pages[i] = src[rows[i]]`` (dequantized to the pool's dtype if the rows are quantized).

        Args:
            pool: a pool of this geometry.
            src: uint8 ``[S, row_bytes]`` host rows.
            rows: int64 ``[n]`` row indices into ``src``.
            pages: int64 ``[n]`` distinct page ids.
        """
        if pages.shape[0] == 0:
            return
        if pool.backend.is_device:
            self._rows_to_device(pool, src, rows, pages)
        elif self.geometry.quantize is None:
            typed = self._typed(src, pool)
            data = pool.data
            for p, r, _, k in _by_page(pages, rows):
                if k == 1:
                    data[:, :, p] = typed[r]
                else:
                    data[:, :, p : p + k] = np.moveaxis(typed[r : r + k], 0, 2)
        else:
            mode = self.geometry.quantize
            for s in range(0, pages.shape[0], self.chunk_pages):
                ids = pages[s : s + self.chunk_pages]
                x = codec.dequantize_pages(
                    src[rows[s : s + self.chunk_pages]], mode, pool.layout, self.geometry.full_shape
                )
                pool.data[:, :, ids] = np.moveaxis(kv_dtypes.encode(x, pool.kv_dtype), 0, 2)

    def _typed(self, rows: np.ndarray, pool: KVPool) -> np.ndarray:
        """uint8 ``[S, page_bytes]`` rows viewed as ``[S, L, 2, *page_shape]`` storage dtype (no copy)."""
        out: np.ndarray = rows.view(pool.storage_dtype).reshape(rows.shape[0], *self.geometry.full_shape)
        return out

    # --------------------------------------------------------------------------- CuPy path

    def _stage(self, pool: KVPool) -> Any:
        if self._dev_pages is None:
            self._dev_pages = pool.xp.empty(
                (self.chunk_pages, *self.geometry.full_shape), dtype=pool.storage_dtype
            )
        return self._dev_pages

    def _device_to_rows(self, pool: KVPool, pages: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> None:
        """Per chunk: gather the pages on the device (one launch), quantize there if asked, then one
        D2H ``cudaMemcpyAsync`` per run of consecutive destination rows, then synchronize."""
        from kvcore import kernels  # the pool already holds CuPy: nothing new is imported

        cp = pool.xp
        stream = cp.cuda.get_current_stream()
        stage = self._stage(pool)
        rb = self.row_bytes
        for s in range(0, pages.shape[0], self.chunk_pages):
            ids = pages[s : s + self.chunk_pages]
            k = ids.shape[0]
            kernels.gather_pages(pool, ids, stage[:k])  # device out: stream-ordered
            if self.geometry.quantize is None:
                src = stage[:k]
            else:
                x = kv_dtypes.decode(stage[:k], pool.kv_dtype, xp=cp)
                src = codec.quantize_pages(x, self.geometry.quantize, pool.layout, xp=cp)
            src_ptr = int(src.data.ptr)
            dst_ptr = int(dst.ctypes.data)
            for a, r, _, m in runs(np.arange(k), rows[s : s + k]):
                cp.cuda.runtime.memcpyAsync(
                    dst_ptr + r * rb,
                    src_ptr + a * rb,
                    m * rb,
                    cp.cuda.runtime.memcpyDeviceToHost,
                    stream.ptr,
                )
            stream.synchronize()  # src (and the stage) are reused or freed by the next chunk

    def _rows_to_device(self, pool: KVPool, src: np.ndarray, rows: np.ndarray, pages: np.ndarray) -> None:
        """Per chunk: one H2D ``cudaMemcpyAsync`` per run of consecutive source rows into a device
        staging buffer, dequantize there if needed, scatter into the pages (one launch), synchronize."""
        from kvcore import kernels

        cp = pool.xp
        stream = cp.cuda.get_current_stream()
        rb = self.row_bytes
        if self.geometry.quantize is None:
            dev_rows = self._stage(pool)
        else:
            if self._dev_rows is None:
                self._dev_rows = cp.empty((self.chunk_pages, rb), dtype=cp.uint8)
            dev_rows = self._dev_rows
        for s in range(0, pages.shape[0], self.chunk_pages):
            ids = pages[s : s + self.chunk_pages]
            k = ids.shape[0]
            src_ptr = int(src.ctypes.data)
            dev_ptr = int(dev_rows.data.ptr)
            for r, a, _, m in runs(rows[s : s + k], np.arange(k)):
                cp.cuda.runtime.memcpyAsync(
                    dev_ptr + a * rb,
                    src_ptr + r * rb,
                    m * rb,
                    cp.cuda.runtime.memcpyHostToDevice,
                    stream.ptr,
                )
            if self.geometry.quantize is None:
                kernels.scatter_pages(pool, ids, dev_rows[:k])
            else:
                x = codec.dequantize_pages(
                    dev_rows[:k], self.geometry.quantize, pool.layout, self.geometry.full_shape, xp=cp
                )
                kernels.scatter_pages(
                    pool, ids, cp.ascontiguousarray(kv_dtypes.encode(x, pool.kv_dtype, xp=cp))
                )
            stream.synchronize()  # the host rows may be rewritten as soon as we return
