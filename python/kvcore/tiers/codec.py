"""Byte formats of the lower tiers: the page geometry, KIVI-style page quantization, the disk header.

Why one module of pure functions: the host tier, the disk tier (and later a remote tier) must agree on
what a stored page is, byte for byte, and each format must be testable without a pool or a file. Nothing
here touches a file, a lock or a counter.

**Quantization on demote** (``"int8"`` or ``"int4"``, fp16/bf16 pools only), after KIVI (Liu et al.,
ICML 2024): K is quantized *per channel* (one float32 scale per (layer, kv head, head_dim channel), over
the page's tokens, since K's outliers sit in fixed channels) and V *per token* (one scale per (layer, kv
head, token), over head_dim). Symmetric: ``scale = max|x| / qmax`` (qmax 127 or 7; 1.0 for an all-zero
group), ``q = clip(rint(x / scale), -qmax, qmax)``, ``x' = q * scale``, so ``|x - x'| <= scale / 2``.
NaN is stored as 0 and an infinity as the largest finite magnitude of its group, with its sign (a K/V
cache holds finite values; the scales come from the finite ones, so a stray infinity or NaN does not
poison its whole group).

Quantized payload of one page, little-endian, always in HND order whatever the pool's layout::

    k_scale  float32 [num_layers, num_kv_heads, head_dim]
    v_scale  float32 [num_layers, num_kv_heads, page_size]
    values   int8    [num_layers, 2, num_kv_heads, page_size, head_dim]     ("int8")
             uint8   [num_layers * 2 * num_kv_heads * page_size * head_dim / 2]  ("int4": element 2i in
                     the low nibble, 2i + 1 in the high one, each two's complement in [-7, 7];
                     the count is always even because of the K/V axis)

An unquantized payload is the pool's bytes of the page, page-major ``[num_layers, 2, *page_shape]`` in the
pool's storage dtype (what :meth:`KVPool.host_buffer` holds).

**Disk header** (:func:`pack_header` / :func:`parse_header`), little-endian, ``struct`` framing, never
pickle; the header is padded to a multiple of 4096 bytes so the payload is page-aligned in the file::

    off  size  field
      0     8  magic b"KVCPAGE\\0"
      8     2  u16 format version (1)
     10     2  u16 flags (0; any other value is refused)
     12     4  u32 header_len: bytes before the payload, a multiple of 4096, the 16-byte header
               checksum included
     16    16  page key
     32    16  parent key
     48    16  u32 num_layers, u32 num_kv_heads, u32 page_size, u32 head_dim
     64     1  u8 layout (0 HND, 1 NHD)
     65     1  u8 kv_dtype (0 fp16, 1 bf16, 2 fp8, 3 int8)
     66     1  u8 quantization (0 none, 1 int8, 2 int4)
     67     1  u8 namespace kind (0 default/None, 1 named, 2 public "*"), as in the page-key format
     68     4  u32 namespace length in bytes (0 unless the kind is 1)
     72     8  u64 payload_len
     80    16  XXH3-128 of the payload
     96    16  scale digest: XXH3-128 of the pool's k_scale then v_scale (float32) for fp8/int8 pools,
               zeros for fp16/bf16 (fp8/int8 payloads mean nothing under other scales)
    112  4*P   u32 page tokens (P = page_size)
      .     n  namespace, UTF-8
      .     .  zeros up to header_len - 16
    header_len - 16   16  XXH3-128 of header bytes [0, header_len - 16)
    header_len        payload_len bytes of payload; the file is exactly header_len + payload_len bytes
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final, Literal

import numpy as np

from kvcore._kvcore import payload_checksum
from kvcore.exceptions import ConfigError, InvalidDTypeError, KVCoreError
from kvcore.pool import KVPool
from kvcore.pool import dtypes as kv_dtypes

__all__ = [
    "FORMAT_VERSION",
    "HEADER_ALIGN",
    "MAGIC",
    "NO_SCALES",
    "SCALE_DIGEST_OFFSET",
    "Geometry",
    "HeaderCheck",
    "HeaderError",
    "PageHeader",
    "QuantMode",
    "checksum",
    "dequantize_page",
    "dequantize_pages",
    "header_len",
    "namespace_room",
    "pack_header",
    "parse_header",
    "parse_header_prefix",
    "quantize_page",
    "quantize_pages",
    "quantized_bytes",
]

QuantMode = Literal["int8", "int4"]

MAGIC: Final[bytes] = b"KVCPAGE\x00"
FORMAT_VERSION: Final[int] = 1
HEADER_ALIGN: Final[int] = 4096  # payload offset alignment (page cache pages, a later O_DIRECT path)
_MIN_NAMESPACE_ROOM: Final[int] = 256  # bytes of namespace every header has room for, at least
_MAX_HEADER_LEN: Final[int] = 1 << 24  # a parsed header_len above this is corruption, not a geometry
SCALE_DIGEST_OFFSET: Final[int] = 96  # where a header holds its 16-byte scale digest
NO_SCALES: Final[bytes] = bytes(16)  # the scale digest of fp16/bf16 pages (no scales)

# magic, version, flags, header_len, key, parent, L, H, P, D, layout, kv_dtype, quant, ns kind, ns len,
# payload_len, payload checksum, scale digest
_FIXED: Final[struct.Struct] = struct.Struct("<8sHHI16s16sIIIIBBBBIQ16s16s")
FIXED_LEN: Final[int] = _FIXED.size  # 112
_CHECKSUM_LEN: Final[int] = 16

_LAYOUT_CODE: Final[dict[str, int]] = {"HND": 0, "NHD": 1}
_DTYPE_CODE: Final[dict[str, int]] = {"fp16": 0, "bf16": 1, "fp8": 2, "int8": 3}
_QUANT_CODE: Final[dict[str | None, int]] = {None: 0, "int8": 1, "int4": 2}
_QMAX: Final[dict[str, float]] = {"int8": 127.0, "int4": 7.0}

NS_DEFAULT: Final[int] = 0
NS_NAMED: Final[int] = 1
NS_PUBLIC: Final[int] = 2
PUBLIC_NAMESPACE: Final[str] = "*"


def _inverse(table: dict[Any, int]) -> dict[int, Any]:
    return {v: k for k, v in table.items()}


_LAYOUT_NAME: Final[dict[int, Any]] = _inverse(_LAYOUT_CODE)
_DTYPE_NAME: Final[dict[int, Any]] = _inverse(_DTYPE_CODE)
_QUANT_NAME: Final[dict[int, Any]] = _inverse(_QUANT_CODE)


class HeaderError(KVCoreError, ValueError):
    """A disk header that cannot be trusted; :attr:`reason` is ``"magic"``, ``"version"``,
    ``"checksum"`` or ``"malformed"`` (the tier counts and removes such files)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def checksum(data: np.ndarray | list[np.ndarray]) -> bytes:
    """XXH3-128 of a contiguous 1-D uint8 host array, or of the concatenation of a list of them (the
    same digest: a page in its pool pieces), 16 bytes: the native ``payload_checksum``."""
    return payload_checksum(data)


# ------------------------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class Geometry:
    """What makes two stored pages interchangeable: shape, layout, precision and tier quantization.

    A tier refuses a pool of another geometry (caller mistake) and never loads a page stored under
    another one (a miss).
    """

    num_layers: int  # >= 1
    num_kv_heads: int  # >= 1
    page_size: int  # >= 1, tokens per page
    head_dim: int  # >= 1
    layout: str  # "HND" or "NHD"
    kv_dtype: str  # "fp16", "bf16", "fp8" or "int8" (the pool's)
    quantize: str | None  # None (the pool's bytes), "int8" or "int4" (KIVI, fp16/bf16 pools only)

    @classmethod
    def of_pool(cls, pool: KVPool, quantize: str | None = None) -> Geometry:
        """The geometry of pages of ``pool`` stored with ``quantize``.

        Raises:
            ConfigError: an unknown quantization, or quantization of an fp8/int8 pool (already
                quantized, with per-head scales of its own).
        """
        if not isinstance(pool, KVPool):
            raise InvalidDTypeError(f"pool: expected a KVPool, got {type(pool).__name__}")
        if not (quantize is None or isinstance(quantize, str)) or quantize not in _QUANT_CODE:
            raise ConfigError(f"quantize: expected None, 'int8' or 'int4', got {quantize!r}")
        if quantize is not None and pool.kv_dtype not in ("fp16", "bf16"):
            raise ConfigError(
                f"quantize={quantize!r}: only fp16/bf16 pools are quantized on demote, "
                f"this pool is {pool.kv_dtype}"
            )
        return cls(
            num_layers=pool.num_layers,
            num_kv_heads=pool.num_kv_heads,
            page_size=pool.page_size,
            head_dim=pool.head_dim,
            layout=pool.layout,
            kv_dtype=pool.kv_dtype,
            quantize=quantize,
        )

    @property
    def page_shape(self) -> tuple[int, int, int]:
        """One layer's K (or V) page: ``(H, P, D)`` for HND, ``(P, H, D)`` for NHD."""
        H, P, D = self.num_kv_heads, self.page_size, self.head_dim
        return (H, P, D) if self.layout == "HND" else (P, H, D)

    @property
    def page_elems(self) -> int:
        """Elements of one page over every layer, K and V."""
        return self.num_layers * 2 * self.num_kv_heads * self.page_size * self.head_dim

    @property
    def page_bytes(self) -> int:
        """Bytes of one page as the pool stores it (every layer, K and V)."""
        return self.page_elems * kv_dtypes.storage_dtype(self.kv_dtype).itemsize

    @property
    def payload_bytes(self) -> int:
        """Bytes of one stored page: :attr:`page_bytes`, or the quantized payload's size."""
        if self.quantize is None:
            return self.page_bytes
        return quantized_bytes(
            self.quantize, self.num_layers, self.num_kv_heads, self.page_size, self.head_dim
        )

    @property
    def full_shape(self) -> tuple[int, int, int, int, int]:
        """``(num_layers, 2, *page_shape)``: one page, page-major."""
        return (self.num_layers, 2, *self.page_shape)


def quantized_bytes(mode: str, num_layers: int, num_kv_heads: int, page_size: int, head_dim: int) -> int:
    """Bytes of one quantized page: the K and V scales plus the packed values."""
    L, H, P, D = num_layers, num_kv_heads, page_size, head_dim
    values = L * 2 * H * P * D
    return 4 * L * H * D + 4 * L * H * P + (values if mode == "int8" else values // 2)


# --------------------------------------------------------------------------------------- quantization


def _check_mode(mode: str) -> float:
    if mode not in _QMAX:
        raise ConfigError(f"mode: expected 'int8' or 'int4', got {mode!r}")
    return _QMAX[mode]


def _scales(amax: Any, qmax: float, xp: ModuleType) -> Any:
    """float32 scales ``amax / qmax``; 1.0 where that is 0 (an all-zero group, or amax underflowing)."""
    s = (amax / xp.float32(qmax)).astype(xp.float32, copy=False)
    return xp.where(s > 0, s, xp.float32(1.0)).astype(xp.float32, copy=False)


def quantize_pages(x: Any, mode: str, layout: str, xp: ModuleType = np) -> Any:
    """Quantize pages (K per channel, V per token; see the module docstring).

    Args:
        x: float32 ``[n, num_layers, 2, *page_shape]`` page values (``page_shape`` per ``layout``).
        mode: ``"int8"`` or ``"int4"``.
        layout: ``"HND"`` or ``"NHD"``: how ``x``'s page axes are ordered.
        xp: the array module of ``x`` (numpy, or cupy for device pages).

    Returns:
        uint8 ``[n, quantized_bytes(...)]``, C-contiguous, in ``xp``'s memory.
    """
    qmax = _check_mode(mode)
    x = xp.asarray(x, dtype=xp.float32)
    if x.ndim != 6 or x.shape[2] != 2:
        raise InvalidDTypeError(f"x: expected float32 [n, num_layers, 2, *page_shape], got {list(x.shape)}")
    if layout == "NHD":
        x = x.swapaxes(3, 4)  # canonical HND order, as a view
    elif layout != "HND":
        raise ConfigError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
    n, L, _, H, P, D = x.shape
    k, v = x[:, :, 0], x[:, :, 1]  # [n, L, H, P, D] each
    k_amax = xp.abs(k).max(axis=3)  # [n, L, H, D]: per channel over the page's tokens
    v_amax = xp.abs(v).max(axis=4)  # [n, L, H, P]: per token over head_dim
    if not (bool(xp.isfinite(k_amax).all()) and bool(xp.isfinite(v_amax).all())):
        # The scales from the finite values only (an infinity made its group's scale FLT_MAX/qmax:
        # every other value of it came back 0); NaN is 0, an infinity its group's largest magnitude.
        finite = xp.where(xp.isfinite(x), x, xp.float32(0.0))
        k_amax = xp.abs(finite[:, :, 0]).max(axis=3)
        v_amax = xp.abs(finite[:, :, 1]).max(axis=4)
        k_lim, v_lim = k_amax[:, :, :, None, :], v_amax[..., None]
        k = xp.clip(xp.nan_to_num(k, nan=0.0), -k_lim, k_lim)
        v = xp.clip(xp.nan_to_num(v, nan=0.0), -v_lim, v_lim)
    k_scale = _scales(k_amax, qmax, xp)
    v_scale = _scales(v_amax, qmax, xp)
    q = xp.empty((n, L, 2, H, P, D), dtype=xp.int8)
    q[:, :, 0] = xp.clip(xp.rint(k / k_scale[:, :, :, None, :]), -qmax, qmax)
    q[:, :, 1] = xp.clip(xp.rint(v / v_scale[..., None]), -qmax, qmax)

    ks, vs = L * H * D * 4, L * H * P * 4
    out = xp.empty((n, quantized_bytes(mode, L, H, P, D)), dtype=xp.uint8)
    out[:, :ks] = xp.ascontiguousarray(k_scale.astype("<f4", copy=False)).reshape(n, -1).view(xp.uint8)
    out[:, ks : ks + vs] = (
        xp.ascontiguousarray(v_scale.astype("<f4", copy=False)).reshape(n, -1).view(xp.uint8)
    )
    u = q.reshape(n, -1).view(xp.uint8)  # two's complement bytes
    if mode == "int8":
        out[:, ks + vs :] = u
    else:
        out[:, ks + vs :] = (u[:, 0::2] & xp.uint8(0x0F)) | (u[:, 1::2] << xp.uint8(4))
    return out


def dequantize_pages(data: Any, mode: str, layout: str, shape: tuple[int, ...], xp: ModuleType = np) -> Any:
    """The inverse of :func:`quantize_pages` up to its rounding.

    Args:
        data: uint8 ``[n, quantized_bytes(...)]``.
        mode: ``"int8"`` or ``"int4"``.
        layout: the layout of the pages returned.
        shape: ``(num_layers, 2, *page_shape)`` of one page, in ``layout``.

    Returns:
        float32 ``[n, *shape]``.
    """
    _check_mode(mode)
    if len(shape) != 5 or shape[1] != 2:
        raise InvalidDTypeError(f"shape: expected (num_layers, 2, *page_shape), got {shape}")
    if layout == "HND":
        L, _, H, P, D = shape
    elif layout == "NHD":
        L, _, P, H, D = shape
    else:
        raise ConfigError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
    d = xp.asarray(data)
    nbytes = quantized_bytes(mode, L, H, P, D)
    if d.dtype != xp.uint8 or d.ndim != 2 or d.shape[1] != nbytes:
        raise InvalidDTypeError(f"data: expected uint8 [n, {nbytes}], got {d.dtype}{list(d.shape)}")
    d = xp.ascontiguousarray(d)
    n = d.shape[0]
    ks, vs = L * H * D * 4, L * H * P * 4
    k_scale = d[:, :ks].copy().view("<f4").reshape(n, L, H, D)
    v_scale = d[:, ks : ks + vs].copy().view("<f4").reshape(n, L, H, P)
    packed = d[:, ks + vs :]
    if mode == "int8":
        q = packed.view(xp.int8)
    else:
        q = xp.empty((n, 2 * packed.shape[1]), dtype=xp.int8)
        q[:, 0::2] = (packed << xp.uint8(4)).view(xp.int8) >> 4  # arithmetic shift: sign-extends
        q[:, 1::2] = packed.view(xp.int8) >> 4
    q = q.reshape(n, L, 2, H, P, D)
    x = xp.empty((n, L, 2, H, P, D), dtype=xp.float32)
    with np.errstate(over="ignore"):  # a saturated infinity (127 * FLT_MAX / 127) may round back to inf
        x[:, :, 0] = q[:, :, 0] * k_scale[:, :, :, None, :]
        x[:, :, 1] = q[:, :, 1] * v_scale[..., None]
    return x if layout == "HND" else xp.ascontiguousarray(x.swapaxes(3, 4))


def quantize_page(x: Any, mode: str, layout: str, xp: ModuleType = np) -> Any:
    """One page: float32 ``[num_layers, 2, *page_shape]`` -> uint8 ``[quantized_bytes(...)]``."""
    return quantize_pages(xp.asarray(x)[None], mode, layout, xp)[0]


def dequantize_page(data: Any, mode: str, layout: str, shape: tuple[int, ...], xp: ModuleType = np) -> Any:
    """One page: uint8 ``[quantized_bytes(...)]`` -> float32 ``shape`` = ``(num_layers, 2, *page_shape)``."""
    return dequantize_pages(xp.asarray(data)[None], mode, layout, shape, xp)[0]


# -------------------------------------------------------------------------------------------- header


@dataclass(frozen=True)
class PageHeader:
    """The parsed header of one stored page (see the module docstring for the byte layout)."""

    key: bytes  # 16 bytes, the page key
    parent_key: bytes  # 16 bytes
    namespace: str | None  # None (default), "*" (public) or a name
    tokens: np.ndarray  # uint32 [page_size]
    geometry: Geometry
    header_len: int  # bytes before the payload, a multiple of HEADER_ALIGN
    payload_len: int  # bytes of payload after the header
    payload_checksum: bytes  # 16 bytes, XXH3-128 of the payload
    scale_digest: bytes  # 16 bytes


def header_len(geometry: Geometry) -> int:
    """Header bytes of every file of this geometry: room for the tokens, a namespace of at least
    256 bytes and the checksum, rounded up to :data:`HEADER_ALIGN`."""
    need = FIXED_LEN + 4 * geometry.page_size + _MIN_NAMESPACE_ROOM + _CHECKSUM_LEN
    return -(-need // HEADER_ALIGN) * HEADER_ALIGN


def namespace_room(geometry: Geometry) -> int:
    """The longest namespace (UTF-8 bytes) a header of this geometry holds."""
    return header_len(geometry) - FIXED_LEN - 4 * geometry.page_size - _CHECKSUM_LEN


def _namespace_bytes(namespace: str | None) -> tuple[int, bytes]:
    if namespace is None:
        return NS_DEFAULT, b""
    if namespace == PUBLIC_NAMESPACE:
        return NS_PUBLIC, b""
    return NS_NAMED, namespace.encode("utf-8")


def pack_header(
    out: bytearray | memoryview,
    *,
    geometry: Geometry,
    key: bytes,
    parent_key: bytes,
    namespace: str | None,
    tokens: np.ndarray,
    payload_len: int,
    payload_checksum: bytes,
    scale_digest: bytes,
) -> int:
    """Write a header into ``out`` (``header_len(geometry)`` bytes, reused between pages: every byte is
    rewritten); returns its length.

    Args:
        out: a writable buffer of at least ``header_len(geometry)`` bytes.
        key, parent_key, payload_checksum, scale_digest: 16 bytes each.
        namespace: None, ``"*"`` or a name of at most :func:`namespace_room` UTF-8 bytes.
        tokens: uint32 ``[page_size]``.

    Raises:
        HeaderError: ``reason == "namespace"`` when the namespace does not fit.
    """
    hlen = header_len(geometry)
    kind, ns = _namespace_bytes(namespace)
    if len(ns) > namespace_room(geometry):
        raise HeaderError(
            "namespace", f"namespace: {len(ns)} UTF-8 bytes, a header holds {namespace_room(geometry)}"
        )
    mv = memoryview(out).cast("B")
    _FIXED.pack_into(
        mv,
        0,
        MAGIC,
        FORMAT_VERSION,
        0,
        hlen,
        key,
        parent_key,
        geometry.num_layers,
        geometry.num_kv_heads,
        geometry.page_size,
        geometry.head_dim,
        _LAYOUT_CODE[geometry.layout],
        _DTYPE_CODE[geometry.kv_dtype],
        _QUANT_CODE[geometry.quantize],
        kind,
        len(ns),
        payload_len,
        payload_checksum,
        scale_digest,
    )
    off = FIXED_LEN
    tok = np.ascontiguousarray(tokens, dtype="<u4")
    mv[off : off + tok.nbytes] = tok.view(np.uint8).data
    off += tok.nbytes
    mv[off : off + len(ns)] = ns
    off += len(ns)
    end = hlen - _CHECKSUM_LEN
    mv[off:end] = bytes(end - off)
    mv[end:hlen] = checksum(np.frombuffer(mv[:end], dtype=np.uint8))
    return hlen


def parse_header_prefix(prefix: bytes | bytearray | memoryview) -> int:
    """The ``header_len`` a file announces, from its first :data:`FIXED_LEN` bytes (magic and version
    checked, so a caller knows how much to read).

    Raises:
        HeaderError: a short prefix, a wrong magic, another format version, nonzero flags or an
            implausible header_len.
    """
    mv = memoryview(prefix).cast("B")
    if len(mv) < FIXED_LEN:
        raise HeaderError("malformed", f"header: {len(mv)} bytes, the fixed part is {FIXED_LEN}")
    if bytes(mv[:8]) != MAGIC:
        raise HeaderError("magic", f"header: magic {bytes(mv[:8])!r}, expected {MAGIC!r}")
    version, flags, hlen = struct.unpack_from("<HHI", mv, 8)
    if version != FORMAT_VERSION:
        raise HeaderError("version", f"header: format version {version}, this kvcore reads {FORMAT_VERSION}")
    if flags != 0:
        raise HeaderError("malformed", f"header: flags {flags:#x}, expected 0")
    if hlen % HEADER_ALIGN or not FIXED_LEN + _CHECKSUM_LEN <= hlen <= _MAX_HEADER_LEN:
        raise HeaderError("malformed", f"header: header_len {hlen} is not a plausible header size")
    return int(hlen)


def parse_header(buf: bytes | bytearray | memoryview) -> PageHeader:
    """Parse and verify a header (the first ``header_len`` bytes of a file; more bytes are ignored).

    Raises:
        HeaderError: a wrong magic or version (``reason`` "magic"/"version"), a header checksum that
            does not match ("checksum"), or fields out of their ranges ("malformed").
    """
    mv = memoryview(buf).cast("B")
    hlen = parse_header_prefix(mv)
    if len(mv) < hlen:
        raise HeaderError("malformed", f"header: {len(mv)} bytes, its header_len says {hlen}")
    end = hlen - _CHECKSUM_LEN
    if checksum(np.frombuffer(mv[:end], dtype=np.uint8)) != bytes(mv[end:hlen]):
        raise HeaderError("checksum", "header: checksum mismatch")
    (_, _, _, _, key, parent, L, H, P, D, lay, dt, qu, kind, ns_len, payload_len, pcs, digest) = (
        _FIXED.unpack_from(mv, 0)
    )
    if lay not in _LAYOUT_NAME or dt not in _DTYPE_NAME or qu not in _QUANT_NAME or kind > NS_PUBLIC:
        raise HeaderError(
            "malformed", f"header: unknown layout/dtype/quantization/namespace code {lay}/{dt}/{qu}/{kind}"
        )
    if min(L, H, P, D) < 1 or FIXED_LEN + 4 * P + ns_len > end or (kind != NS_NAMED and ns_len):
        raise HeaderError("malformed", "header: geometry or namespace length out of range")
    tokens = np.frombuffer(mv, dtype="<u4", count=P, offset=FIXED_LEN).astype(np.uint32)
    off = FIXED_LEN + 4 * P
    namespace: str | None
    if kind == NS_NAMED:
        try:
            namespace = bytes(mv[off : off + ns_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError("malformed", "header: the namespace is not UTF-8") from None
    else:
        namespace = None if kind == NS_DEFAULT else PUBLIC_NAMESPACE
    geometry = Geometry(
        num_layers=L,
        num_kv_heads=H,
        page_size=P,
        head_dim=D,
        layout=_LAYOUT_NAME[lay],
        kv_dtype=_DTYPE_NAME[dt],
        quantize=_QUANT_NAME[qu],
    )
    return PageHeader(
        key=bytes(key),
        parent_key=bytes(parent),
        namespace=namespace,
        tokens=tokens,
        geometry=geometry,
        header_len=hlen,
        payload_len=int(payload_len),
        payload_checksum=bytes(pcs),
        scale_digest=bytes(digest),
    )


class HeaderCheck:
    """:func:`parse_header`'s verdict on one question, by byte compares against a template: is this
    a valid header of ``geometry`` and ``payload_len``, of page ``key`` under ``scale_digest``?

    Why: a load expects exactly one header per file and only needs its payload checksum; parsing it
    (a struct unpack, a token copy, two dataclasses) costs several times the compares. It accepts
    exactly the headers that parse_header accepts with these fields; for any other the caller learns
    why from parse_header itself.
    """

    def __init__(self, geometry: Geometry, payload_len: int) -> None:
        hlen = header_len(geometry)
        t = bytearray(hlen)
        pack_header(
            t,
            geometry=geometry,
            key=bytes(16),
            parent_key=bytes(16),
            namespace=None,
            tokens=np.zeros(geometry.page_size, dtype=np.uint32),
            payload_len=payload_len,
            payload_checksum=bytes(16),
            scale_digest=bytes(16),
        )
        self.header_len = hlen  # bytes of every header checked
        self._end = hlen - _CHECKSUM_LEN  # where the header checksum starts
        self._ns_at = FIXED_LEN + 4 * geometry.page_size  # where the namespace starts
        self._ns_room = self._end - self._ns_at
        self._prefix = bytes(t[:16])  # magic, version, flags, header_len
        self._geometry = bytes(t[48:67])  # num_layers .. quantization
        self._payload_len = bytes(t[72:80])

    def payload_checksum(self, buf: bytearray, key: bytes, scale_digest: bytes) -> bytes | None:
        """The payload checksum ``buf`` (at least :attr:`header_len` bytes) records if it is such a
        header; None otherwise."""
        if (
            buf[:16] != self._prefix
            or buf[48:67] != self._geometry
            or buf[72:80] != self._payload_len
            or buf[16:32] != key
            or buf[96:112] != scale_digest
        ):
            return None
        kind = buf[67]
        ns_len = int.from_bytes(buf[68:72], "little")
        if kind > NS_PUBLIC or ns_len > self._ns_room or (kind != NS_NAMED and ns_len):
            return None
        end = self._end
        if checksum(np.frombuffer(buf, dtype=np.uint8, count=end)) != buf[end : self.header_len]:
            return None
        if kind == NS_NAMED:
            try:
                bytes(buf[self._ns_at : self._ns_at + ns_len]).decode("utf-8")
            except UnicodeDecodeError:
                return None
        return bytes(buf[80:96])
