"""The KV pool: the bytes of every cached K/V page, in one allocation, on the host or the GPU.

Why one allocation: the Rust core decides which page holds what and hands out int32 page ids; the pool
only has to turn a page id into an address. With a single ``[num_layers, 2, num_pages, ...]`` array that
is one multiply by a stride, copy-on-write and defrag copy every layer in one kernel launch, and an engine
can take a layer's K and V through DLPack without copies. The strides are passed to the kernels, so the
layout (HND or NHD) changes without kernel edits.

Page 0 is the null page (never handed out by the allocator); it is allocated like any other page and
stays zero unless someone writes through slot 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError, OutOfMemoryError
from kvcore.pool import checks, dtypes
from kvcore.pool.backend import Backend, get_backend

__all__ = ["KVPool", "Layout", "PoolStrides"]

Layout = Literal["HND", "NHD"]

_F32_MAX = float(np.finfo(np.float32).max)  # the largest scale a pool holds


@dataclass(frozen=True)
class PoolStrides:
    """Element strides of :attr:`KVPool.data` (the head_dim axis is contiguous, stride 1).

    The element of (layer, kv, page, kv_head, offset, d) is at
    ``layer*layer + kv*kv + page*page + kv_head*head + offset*token + d``, for both layouts.
    """

    layer: int  # elements between layers: 2 * num_pages * page elements
    kv: int  # elements between K (0) and V (1) of one layer: num_pages * page elements
    page: int  # elements between pages: num_kv_heads * page_size * head_dim
    head: int  # elements between kv heads: page_size*head_dim (HND) or head_dim (NHD)
    token: int  # elements between tokens of a page: head_dim (HND) or num_kv_heads*head_dim (NHD)


def _positive_int(value: object, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < minimum:
        raise InvalidArgumentError(f"{field}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


class KVPool:
    """Paged K/V storage: ``data`` of shape ``[num_layers, 2, num_pages, num_kv_heads, page_size, head_dim]``.

    That is the HND layout (one (page, kv head) tile is one contiguous ``page_size*head_dim`` run, which
    suits a decode thread block that owns one kv head); ``layout="NHD"`` swaps the two middle axes to
    ``[..., page_size, num_kv_heads, head_dim]``. Axis 1 is K (0) and V (1).

    Precisions (``kv_dtype``): ``fp16``, ``bf16`` (stored as uint16 bit patterns), ``fp8`` (e4m3,
    uint8 bit patterns) and ``int8``. The quantized ones store ``x / scale`` with one float32 scale per
    (layer, kv head) for K and one for V, kept beside the pool in :attr:`k_scale` / :attr:`v_scale`
    (``[num_layers, num_kv_heads]``, 1.0 until :meth:`set_scales` or :meth:`calibrate_scales`). Scales
    are static: set them before writing a layer, since stored values are not rescaled.

    Side effects: allocates ``num_pages * page_bytes`` bytes (zeroed) in host memory (``backend="numpy"``)
    or GPU memory through CuPy's allocator (``backend="cupy"``); ``"auto"`` picks CuPy when a device is
    usable.

    Raises (the constructor):
        InvalidArgumentError: a count that is not an integer >= 1 (``num_pages`` >= 2).
        ConfigError: an unknown ``kv_dtype``, ``layout`` or ``backend``.
        OutOfMemoryError: the pages cannot be allocated: more memory than the process can get, or a size
            no array can have (``num_pages=2**62``, ``10**30``); nothing was built.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 16,
        kv_dtype: str = "bf16",
        layout: Layout = "HND",
        backend: str = "numpy",
    ) -> None:
        self.num_layers = _positive_int(num_layers, "num_layers")
        self.num_pages = _positive_int(num_pages, "num_pages", minimum=2)  # the null page + one
        self.num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = _positive_int(head_dim, "head_dim")
        self.page_size = _positive_int(page_size, "page_size")
        self.kv_dtype: dtypes.KVDType = dtypes.normalize_kv_dtype(kv_dtype)
        if layout not in ("HND", "NHD"):
            raise ConfigError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
        self.layout: Layout = layout
        self.backend: Backend = get_backend(backend)
        self.storage_dtype: np.dtype[Any] = dtypes.storage_dtype(self.kv_dtype)

        # Validate the byte size through the one formula before allocating anything.
        page_bytes = self.page_bytes
        L, H, P, D = self.num_layers, self.num_kv_heads, self.page_size, self.head_dim
        inner = (H, P, D) if layout == "HND" else (P, H, D)
        page_elems = H * P * D
        self.strides = PoolStrides(
            layer=2 * self.num_pages * page_elems,
            kv=self.num_pages * page_elems,
            page=page_elems,
            head=P * D if layout == "HND" else D,
            token=D if layout == "HND" else H * D,
        )
        # [num_layers, 2, num_pages, *inner] storage_dtype: every K/V byte of the pool.
        try:
            self.data: Any = self.backend.zeros((L, 2, self.num_pages, *inner), self.storage_dtype)
        except (MemoryError, ValueError, OverflowError) as e:
            # NumPy's and CuPy's out-of-memory errors are MemoryErrors; past NumPy's index range (2**62
            # pages, 10**30) it raises ValueError ("array is too big", "Maximum allowed dimension
            # exceeded"), and a size past a C integer OverflowError: no memory holds such a pool either.
            raise OutOfMemoryError(
                f"KVPool: cannot allocate {self.num_pages * page_bytes:,} bytes "
                f"({self.num_pages:,} pages of {page_bytes:,} bytes) on {self.backend.name}"
            ) from e
        # [num_layers, num_kv_heads] float32: dequantization scales (x = stored * scale); 1.0 by default.
        self.k_scale: Any = self.backend.xp.ones((L, H), dtype=np.float32)
        self.v_scale: Any = self.backend.xp.ones((L, H), dtype=np.float32)
        assert self.data.nbytes == self.num_pages * page_bytes

    # ------------------------------------------------------------------------------------ sizing

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over every layer, K and V: ``kvcore.sizing.kv_cache_bytes`` of one page."""
        from kvcore.sizing import kv_cache_bytes

        return kv_cache_bytes(
            self.num_layers, self.num_kv_heads, self.head_dim, self.page_size, kv_dtype=self.kv_dtype
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the page storage (``num_pages * page_bytes``), scales excluded."""
        return self.num_pages * self.page_bytes

    @property
    def scale_bytes(self) -> int:
        """Bytes of the scales kept beside a quantized pool (0 for fp16/bf16)."""
        return 2 * self.num_layers * self.num_kv_heads * 4 if dtypes.is_quantized(self.kv_dtype) else 0

    @classmethod
    def from_memory_budget(
        cls,
        budget_bytes: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 16,
        kv_dtype: str = "bf16",
        layout: Layout = "HND",
        backend: str = "numpy",
    ) -> KVPool:
        """The largest pool whose pages (and scales) fit in ``budget_bytes``.

        The page count is ``kvcore.sizing.pages_for_budget(budget_bytes - scale_bytes, page_bytes)`` and
        includes the null page, so the allocator over this pool hands out ``num_pages - 1`` pages.

        Integers are taken as the constructor takes them (Python or NumPy integers, never bools).

        Raises:
            ConfigError: ``budget_bytes`` is not an integer (a bool, a float, a string such as ``"1GiB"``),
                or the budget holds fewer than two pages.
            InvalidArgumentError: a shape argument the constructor refuses (not an integer >= 1).
        """
        from kvcore.sizing import kv_cache_bytes, pages_for_budget

        if isinstance(budget_bytes, bool | np.bool_) or not isinstance(budget_bytes, int | np.integer):
            raise ConfigError(f"budget_bytes: expected an integer number of bytes, got {budget_bytes!r}")
        budget_bytes = int(budget_bytes)
        num_layers = _positive_int(num_layers, "num_layers")
        num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
        head_dim = _positive_int(head_dim, "head_dim")
        page_size = _positive_int(page_size, "page_size")
        name = dtypes.normalize_kv_dtype(kv_dtype)
        page_bytes = kv_cache_bytes(num_layers, num_kv_heads, head_dim, page_size, kv_dtype=name)
        scale_bytes = 2 * num_layers * num_kv_heads * 4 if dtypes.is_quantized(name) else 0
        num_pages = pages_for_budget(budget_bytes - scale_bytes, page_bytes)
        if num_pages < 2:
            raise ConfigError(
                f"budget_bytes: {budget_bytes} bytes hold {num_pages} page(s) of {page_bytes} bytes; "
                "a pool needs at least 2 (the null page and one usable page)"
            )
        return cls(
            num_layers=num_layers,
            num_pages=num_pages,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            kv_dtype=name,
            layout=layout,
            backend=backend,
        )

    # ------------------------------------------------------------------------------------ access

    @property
    def xp(self) -> Any:
        """The array module of the pool's memory (numpy or cupy)."""
        return self.backend.xp

    @property
    def page_shape(self) -> tuple[int, int, int]:
        """Shape of one page of one layer's K (or V): ``(Hkv, P, D)`` for HND, ``(P, Hkv, D)`` for NHD."""
        shape: tuple[int, int, int] = tuple(self.data.shape[3:])
        return shape

    def check_layer(self, layer: int) -> int:
        """``layer`` as an int in ``[0, num_layers)``, or InvalidArgumentError."""
        if isinstance(layer, bool) or not isinstance(layer, int | np.integer):
            raise InvalidArgumentError(f"layer: expected an integer, got {layer!r}")
        if not 0 <= int(layer) < self.num_layers:
            raise InvalidArgumentError(f"layer: {layer} is out of range [0, {self.num_layers})")
        return int(layer)

    def k(self, layer: int) -> Any:
        """View of one layer's K pages: ``[num_pages, *page_shape]`` storage dtype (no copy)."""
        return self.data[self.check_layer(layer), 0]

    def v(self, layer: int) -> Any:
        """View of one layer's V pages: ``[num_pages, *page_shape]`` storage dtype (no copy)."""
        return self.data[self.check_layer(layer), 1]

    def dlpack(self, layer: int) -> tuple[Any, Any]:
        """One layer's K and V as DLPack-exportable arrays that share the pool's memory.

        Each is ``[num_pages, *page_shape]`` and implements ``__dlpack__``, so an engine takes it with
        ``torch.from_dlpack(k)`` without a copy. DLPack carries the *storage* type: bf16 pools export
        uint16 and fp8 pools uint8, to be reinterpreted on the consumer side
        (``.view(torch.bfloat16)``, ``.view(torch.float8_e4m3fn)``); scales are :attr:`k_scale` /
        :attr:`v_scale` ``[layer]``.
        """
        return self.k(layer), self.v(layer)

    def host_buffer(self, num_pages: int) -> np.ndarray:
        """A page-major host buffer for :func:`kvcore.kernels.gather_pages` / ``scatter_pages``.

        Shape ``[num_pages, num_layers, 2, *page_shape]``, storage dtype: one page's bytes over every
        layer are contiguous, ready for a host tier. Pinned memory on the GPU backend.

        Raises:
            InvalidArgumentError: ``num_pages`` is not an integer >= 0.
            OutOfMemoryError: the buffer cannot be allocated (as for a pool too large).
        """
        n = _positive_int(num_pages, "num_pages", minimum=0)
        try:
            return self.backend.empty_host((n, self.num_layers, 2, *self.page_shape), self.storage_dtype)
        except (
            MemoryError,
            ValueError,
            OverflowError,
        ) as e:  # NumPy: ValueError "array is too big" past its index range
            raise OutOfMemoryError(
                f"host_buffer: cannot allocate {n * self.page_bytes:,} bytes ({n:,} pages of "
                f"{self.page_bytes:,} bytes) on {self.backend.name}"
            ) from e

    # ------------------------------------------------------------------------------------ scales

    def set_scales(self, layer: int, k_scale: Any, v_scale: Any) -> None:
        """Set one layer's dequantization scales (fp8/int8 pools): scalars or ``[num_kv_heads]`` floats.

        Raises:
            InvalidArgumentError: a scale is not finite and positive (as float32), or the pool is fp16/bf16.
            InvalidDTypeError: a scale is not real numbers (a bool, string, complex, None), not a scalar
                or ``[num_kv_heads]``, or a device array on a NumPy pool.
        """
        layer = self.check_layer(layer)
        if not dtypes.is_quantized(self.kv_dtype):
            raise InvalidArgumentError(f"a {self.kv_dtype} pool stores values unscaled; it has no scales")
        ks = self._check_scale(k_scale, "k_scale")
        vs = self._check_scale(v_scale, "v_scale")
        self.k_scale[layer] = self.xp.asarray(ks)
        self.v_scale[layer] = self.xp.asarray(vs)

    def _check_scale(self, scale: Any, field: str) -> np.ndarray:
        s = checks.positive_array(self._host(scale, field), field)
        s = np.broadcast_to(s, (self.num_kv_heads,)) if s.ndim == 0 else s
        if s.shape != (self.num_kv_heads,):
            raise InvalidDTypeError(f"{field}: expected a scalar or [{self.num_kv_heads}], got {s.shape}")
        return s

    def _host(self, x: Any, name: str) -> Any:
        """``x`` as the host checks read it: a device array copied to the host on a CuPy pool, refused on
        a NumPy pool (InvalidDTypeError naming ``name``: there is no device to copy it from), anything
        else as it is."""
        if not hasattr(x, "__cuda_array_interface__"):
            return x
        checks.check_host(x, name, self.backend.is_device)
        return self.backend.asnumpy(x)

    def _sample(self, x: Any, name: str) -> np.ndarray:
        """A calibration sample as host float32 ``[num_tokens >= 1, Hkv, D]``, every value finite."""
        try:
            host = self.backend.asnumpy(self._host(x, name))
        except (TypeError, ValueError) as e:
            raise InvalidDTypeError(f"{name}: expected an array of sample activations ({e})") from None
        if not (host.dtype.kind == "f" or host.dtype == np.uint16):
            raise InvalidDTypeError(f"{name}: expected float16/32/64 or uint16 (bf16 bits), got {host.dtype}")
        a: np.ndarray = dtypes.to_float32(host)
        if a.ndim != 3 or a.shape[1:] != (self.num_kv_heads, self.head_dim):
            raise InvalidDTypeError(
                f"{name}: expected [num_tokens, {self.num_kv_heads}, {self.head_dim}], got {a.shape}"
            )
        if a.shape[0] == 0:
            raise InvalidArgumentError(f"{name}: an empty sample (0 tokens) cannot size a scale")
        if not np.isfinite(a).all():
            raise InvalidArgumentError(
                f"{name}: the sample holds NaN or infinite values; a scale is sized from finite activations"
            )
        return a

    def calibrate_scales(self, layer: int, k: Any, v: Any, headroom: float = 1.0) -> None:
        """Set one layer's scales from sample K/V so that the largest magnitude per head fits.

        ``scale[h] = headroom * max|x[:, h, :]| / qmax`` (qmax = 448 for fp8, 127 for int8), in float64
        then rounded to float32; heads whose sample is all zero, or whose scale underflows float32 (a
        sample below about 1e-43), get scale 1.0.

        Args:
            layer: the layer.
            k: ``[num_tokens, num_kv_heads, head_dim]`` sample keys (float, or uint16 bf16 bits), at least
                one token, every value finite.
            v: same shape, sample values.
            headroom: finite and > 0; >= 1 leaves room for values larger than the sample's.

        Raises:
            InvalidArgumentError: a bad layer or headroom, an empty sample, a sample holding NaN or an
                infinity (its scale would be NaN, infinite, or a silent 1.0), a scale beyond float32
                (headroom times the sample's largest magnitude), or a fp16/bf16 pool.
            InvalidDTypeError: a sample that is not float activations of that shape (or a device array
                on a NumPy pool).
        """
        layer = self.check_layer(layer)
        room = checks.positive_scalar(headroom, "headroom")
        q = dtypes.qmax(self.kv_dtype)
        scales = []
        for name, x in (("k", k), ("v", v)):
            amax = np.abs(self._sample(x, name)).max(axis=(0, 2)).astype(np.float64)
            wide = room * amax / q
            if not (wide <= _F32_MAX).all():
                raise InvalidArgumentError(
                    f"{name}: headroom {room} times the sample's largest magnitude {amax.max():.6g} gives a "
                    f"scale beyond float32 ({wide.max():.6g})"
                )
            s32 = wide.astype(np.float32)
            scales.append(np.where(s32 > 0, s32, np.float32(1.0)).astype(np.float32))
        self.set_scales(layer, scales[0], scales[1])

    def to(self, backend: str) -> KVPool:
        """A copy of the pool (bytes and scales) on another backend: ``"numpy"`` or ``"cupy"``."""
        other = KVPool(
            num_layers=self.num_layers,
            num_pages=self.num_pages,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=self.page_size,
            kv_dtype=self.kv_dtype,
            layout=self.layout,
            backend=backend,
        )
        for name in ("data", "k_scale", "v_scale"):
            getattr(other, name)[...] = other.backend.asarray(self.backend.asnumpy(getattr(self, name)))
        return other

    # ------------------------------------------------------------------------------------ reading

    def read_slots(self, layer: int, slots: Any) -> tuple[np.ndarray, np.ndarray]:
        """Dequantized K and V of some slots, on the host: two float32 ``[len(slots), Hkv, D]`` arrays.

        A debugging and test aid (one host copy), not a hot path. ``slots`` is int64 ``[n]`` (or a list,
        or any integer dtype), ``slot = page_id * page_size + offset``.

        Raises:
            InvalidDTypeError: ``slots`` is not a 1-D integer array or list (floats are not truncated), or
                is a device array on a NumPy pool.
            InvalidArgumentError: a slot outside ``[0, num_pages * page_size)``, checked before any cast.
        """
        layer = self.check_layer(layer)
        s = checks.index_array(
            self._host(slots, "slots"),
            "slots",
            dtype=np.int64,
            low=0,
            high=self.num_pages * self.page_size,
            what="slots",
        )
        page = self.backend.asarray(s // self.page_size)
        off = self.backend.asarray(s % self.page_size)
        out = []
        for kv, scale in ((0, self.k_scale), (1, self.v_scale)):
            plane = self.data[layer, kv]
            rows = plane[page, :, off] if self.layout == "HND" else plane[page, off]
            vals = dtypes.decode(
                self.backend.asnumpy(rows), self.kv_dtype, self.backend.asnumpy(scale[layer])[None, :, None]
            )
            out.append(np.asarray(vals, dtype=np.float32))
        return out[0], out[1]

    def __repr__(self) -> str:
        return (
            f"KVPool(num_layers={self.num_layers}, num_pages={self.num_pages}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, page_size={self.page_size}, "
            f"kv_dtype={self.kv_dtype!r}, layout={self.layout!r}, backend={self.backend.name!r}, "
            f"nbytes={self.nbytes})"
        )
