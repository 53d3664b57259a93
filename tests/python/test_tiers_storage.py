"""Storage half of the lower tiers: HostTier, DiskTier and their codec.

Each test checks behaviour against a reference: pool bytes against the bytes stored (bit for bit),
quantized values against float32 originals with the codec's own error bound, tier state against a
dict model (Hypothesis), and every failure path (keys, checksums, torn/truncated/foreign files, full
or unwritable disks, links, FIFOs and directories planted at a file's name) against the counters and
the files left in the directory (and outside it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError, InvalidPageError
from kvcore.pool import KVPool, dtypes
from kvcore.pool._cupy import gpu_available
from kvcore.tiers import DiskTier, HostTier, codec
from kvcore.tiers import disk as disk_module
from kvcore.tiers.disk import slot_filename

L, H, P, D = 2, 2, 4, 8  # small geometry: a page is 2*2*2*4*8 = 256 elements
DTYPES = ("fp16", "bf16", "fp8", "int8")
LAYOUTS = ("HND", "NHD")
NAMESPACES: list[str | None] = [None, "*", "tenant-a", "", "ünïcødé/✓"]


def make_pool(
    kv_dtype: str = "bf16", layout: str = "HND", num_pages: int = 12, seed: int = 0, backend: str = "numpy"
) -> KVPool:
    """A pool whose every byte is random (NaN and infinity bit patterns included: copies are bitwise)."""
    pool = KVPool(
        num_layers=L,
        num_pages=num_pages,
        num_kv_heads=H,
        head_dim=D,
        page_size=P,
        kv_dtype=kv_dtype,
        layout=layout,  # type: ignore[arg-type]
        backend=backend,
    )
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=pool.data.nbytes, dtype=np.uint8)
    pool.data[...] = pool.xp.asarray(raw.view(pool.storage_dtype).reshape(pool.data.shape))
    return pool


def fill_values(pool: KVPool, seed: int = 0) -> np.ndarray:
    """Fill a fp16/bf16 pool with activation-like values (K with outlier channels); returns the float32
    values the pool holds ``[num_layers, 2, num_pages, *page_shape]``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(pool.data.shape).astype(np.float32)
    ch = (slice(None), 0, slice(None), Ellipsis, slice(0, 2))  # K, head_dim channels 0-1: 20x larger
    x[ch] *= 20.0
    pool.data[...] = dtypes.encode(x, pool.kv_dtype)
    out: np.ndarray = dtypes.decode(pool.data, pool.kv_dtype)
    return out


def meta(n: int, seed: int = 0, namespaces: list[str | None] | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 1000)
    return {
        "keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "parent_keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "tokens": rng.integers(0, 2**32, size=(n, P), dtype=np.uint32),
        "namespaces": namespaces
        if namespaces is not None
        else [NAMESPACES[i % len(NAMESPACES)] for i in range(n)],
    }


def i32(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


def page_bytes(pool: KVPool, page: int) -> np.ndarray:
    out: np.ndarray = pool.backend.asnumpy(pool.data[:, :, page]).copy()
    return out


def open_disk(path: Path, pool: KVPool, num_slots: int = 8, **kw: Any) -> DiskTier:
    g = codec.Geometry.of_pool(pool, kw.get("quantize"))
    return DiskTier(path / "tier", num_slots * (codec.header_len(g) + g.payload_bytes), pool, **kw)


def slot_path(tier: DiskTier, slot: int) -> Path:
    return Path(tier.path) / slot_filename(slot)


@pytest.fixture(params=["host", "disk"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_tier(kind: str, tmp_path: Path, pool: KVPool, num_slots: int = 8, **kw: Any) -> Any:
    if kind == "host":
        return HostTier(pool, num_slots, **kw)
    return open_disk(tmp_path, pool, num_slots, **kw)


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_round_trip_is_bit_exact(kind: str, tmp_path: Path, kv_dtype: str, layout: str) -> None:
    pool = make_pool(kv_dtype, layout)
    tier = make_tier(kind, tmp_path, pool)
    pages, slots = i32(3, 4, 1, 9, 5), i32(6, 0, 1, 7, 2)  # a run (3,4 -> 6,0 is not; 4->0,1 ... mixed)
    m = meta(5)
    want = [page_bytes(pool, int(p)) for p in pages]
    assert tier.store(pool, pages, slots, **m).tolist() == [True] * 5
    before = pool.data.copy()
    dst = i32(10, 11, 2, 7, 8)
    assert tier.load(pool, slots, dst, m["keys"]).tolist() == [True] * 5
    for d, w in zip(dst.tolist(), want, strict=True):
        assert np.array_equal(page_bytes(pool, d).view(np.uint8), w.view(np.uint8))
    untouched = np.setdiff1d(np.arange(pool.num_pages), dst)
    assert np.array_equal(pool.data[:, :, untouched].view(np.uint8), before[:, :, untouched].view(np.uint8))
    s = tier.stats()
    assert (s["stores"], s["loads"], s["load_failed"], s["slots_used"]) == (5, 5, 0, 5)
    assert s["bytes"] == 5 * (tier.slot_bytes if kind == "host" else tier.file_bytes)


def test_consecutive_runs_and_repeated_load_slots(kind: str, tmp_path: Path) -> None:
    """Runs of consecutive pages into consecutive slots (one block copy) and one slot loaded twice."""
    pool = make_pool("fp16", "NHD", num_pages=20)
    tier = make_tier(kind, tmp_path, pool, num_slots=10)
    pages, slots = np.arange(1, 9, dtype=np.int32), np.arange(2, 10, dtype=np.int32)
    m = meta(8)
    want = {int(s): page_bytes(pool, int(p)) for p, s in zip(pages, slots, strict=True)}
    assert tier.store(pool, pages, slots, **m).all()
    ok = tier.load(pool, i32(2, 3, 4, 2), i32(12, 13, 14, 19), m["keys"][[0, 1, 2, 0]])
    assert ok.all()
    for page, slot in ((12, 2), (13, 3), (14, 4), (19, 2)):
        assert np.array_equal(page_bytes(pool, page).view(np.uint8), want[slot].view(np.uint8))


def test_empty_batches(kind: str, tmp_path: Path) -> None:
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool)
    e = np.zeros(0, dtype=np.int32)
    assert tier.store(pool, e, e, **meta(0, namespaces=[])).shape == (0,)
    assert tier.load(pool, e, e, np.zeros((0, 16), np.uint8)).shape == (0,)


# ------------------------------------------------------------------------------------------ quantized


def _bound(x: np.ndarray, mode: str, layout: str) -> np.ndarray:
    """The codec's error bound per element: scale / 2 of the element's group (plus float32 slack)."""
    qmax = 127.0 if mode == "int8" else 7.0
    xh = x if layout == "HND" else x.swapaxes(-3, -2)  # [..., H, P, D]
    k_amax = np.abs(xh[..., 0, :, :, :]).max(axis=-2, keepdims=True)  # per channel over tokens
    v_amax = np.abs(xh[..., 1, :, :, :]).max(axis=-1, keepdims=True)  # per token over head_dim
    b = np.empty_like(xh)
    for kv, amax in ((0, k_amax), (1, v_amax)):
        # scale / 2, plus float32 rounding of x / scale and q * scale (a few ulps of the group's max)
        b[..., kv, :, :, :] = np.broadcast_to(
            amax / qmax / 2 + amax * 4e-7 + 1e-30, xh[..., kv, :, :, :].shape
        )
    return b if layout == "HND" else b.swapaxes(-3, -2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(("mode", "max_rel"), [("int8", 0.01), ("int4", 0.15)])
def test_quantized_round_trip_error_bounds(
    kind: str, tmp_path: Path, kv_dtype: str, layout: str, mode: str, max_rel: float
) -> None:
    pool = make_pool(kv_dtype, layout)
    x = fill_values(pool)
    tier = make_tier(kind, tmp_path, pool, quantize=mode)
    pages, slots = i32(1, 2, 3, 4), i32(0, 5, 6, 7)
    m = meta(4)
    assert tier.store(pool, pages, slots, **m).all()
    assert tier.load(pool, slots, i32(8, 9, 10, 11), m["keys"]).all()
    got = np.moveaxis(dtypes.decode(pool.data[:, :, 8:12], kv_dtype), 2, 0)  # [4, L, 2, *page_shape]
    ref = np.moveaxis(x[:, :, 1:5], 2, 0)
    eps = 2.0**-8 if kv_dtype == "bf16" else 2.0**-11  # rounding of the dequantized value to the pool
    bound = _bound(ref, mode, layout) + np.abs(got) * eps + 6e-8
    assert (np.abs(got - ref) <= bound).all()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < max_rel
    expected_bytes = codec.quantized_bytes(mode, L, H, P, D)
    assert (tier.slot_bytes if kind == "host" else tier.payload_len) == expected_bytes


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 9)),
    layout=st.sampled_from(LAYOUTS),
    mode=st.sampled_from(["int8", "int4"]),
    scale=st.floats(1e-6, 1e6),
    seed=st.integers(0, 2**31),
)
def test_codec_bound_and_exact_grid(
    shape: tuple[int, int, int, int], layout: str, mode: str, scale: float, seed: int
) -> None:
    """Any geometry (odd head_dim and page_size: int4 packs across rows): the error is within scale/2,
    and values already on the quantization grid come back exactly."""
    nl, nh, ps, hd = shape
    page_shape = (nh, ps, hd) if layout == "HND" else (ps, nh, hd)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((nl, 2, *page_shape)) * scale).astype(np.float32)
    q = codec.quantize_page(x, mode, layout)
    assert q.dtype == np.uint8 and q.shape == (codec.quantized_bytes(mode, nl, nh, ps, hd),)
    y = codec.dequantize_page(q, mode, layout, x.shape)
    assert y.shape == x.shape and y.dtype == np.float32
    assert (np.abs(y - x) <= _bound(x, mode, layout)).all()
    # dequantized values are on the grid: quantizing them again gives the same integers
    ks = 4 * nl * nh * (hd + ps)
    assert np.array_equal(codec.quantize_page(y, mode, layout)[ks:], q[ks:])


def test_codec_zero_and_non_finite_groups() -> None:
    x = np.zeros((1, 2, H, P, D), dtype=np.float32)
    for mode in ("int8", "int4"):
        assert np.array_equal(
            codec.dequantize_page(codec.quantize_page(x, mode, "HND"), mode, "HND", x.shape), x
        )
    x[0, 1, 0, 0, 0] = np.nan
    x[0, 1, 0, 1, 0] = np.inf
    x[0, 1, 0, 1, 1] = -2.0  # in the infinity's own V group (token 1 of head 0)
    x[0, 1, 0, 2, 1] = 3.0
    x[0, 0, 0, 0, 2] = -np.inf  # a K group (channel 2 of head 0) ...
    x[0, 0, 0, 1, 2] = 0.5  # ... with finite values beside it
    x[0, 0, 0, 3, 2] = 0.25
    for mode, qmax in (("int8", 127), ("int4", 7)):
        y = codec.dequantize_page(codec.quantize_page(x, mode, "HND"), mode, "HND", x.shape)
        assert y[0, 1, 0, 0, 0] == 0.0  # NaN is stored as 0
        # The scales come from the finite values: an infinity is its group's largest finite
        # magnitude, with its sign, and the rest of its group keeps its values (the scale was
        # FLT_MAX / qmax, so they all came back 0).
        assert y[0, 1, 0, 1, 0] == 2.0 and y[0, 1, 0, 1, 1] == -2.0
        assert y[0, 0, 0, 0, 2] == -0.5
        assert abs(y[0, 0, 0, 1, 2] - 0.5) <= 0.5 / (2 * qmax) * 1.0001
        assert abs(y[0, 0, 0, 3, 2] - 0.25) <= 0.5 / (2 * qmax) * 1.0001
        assert abs(y[0, 1, 0, 2, 1] - 3.0) <= 3.0 / (2 * qmax) * 1.0001  # its own token group
        assert np.isfinite(y).all()
    only_inf = np.zeros((1, 2, H, P, D), dtype=np.float32)
    only_inf[0, 1, 0, 0, :] = np.inf  # a group of infinities only: no finite magnitude, so 0
    y = codec.dequantize_page(codec.quantize_page(only_inf, "int8", "HND"), "int8", "HND", x.shape)
    assert (y == 0).all()


def test_quantize_refuses_fp8_int8_pools_and_unknown_modes(tmp_path: Path) -> None:
    for kv_dtype in ("fp8", "int8"):
        pool = make_pool(kv_dtype)
        with pytest.raises(ConfigError, match="fp16/bf16"):
            HostTier(pool, 2, quantize="int8")
        with pytest.raises(ConfigError, match="fp16/bf16"):
            DiskTier(tmp_path / kv_dtype, 1 << 20, pool, quantize="int4")
    with pytest.raises(ConfigError, match="quantize"):
        HostTier(make_pool(), 2, quantize="int2")
    with pytest.raises(ConfigError, match="mode"):
        codec.quantize_page(np.zeros((1, 2, 1, 1, 2), np.float32), "fp4", "HND")


# ------------------------------------------------------------------------------------------ misses


def test_key_mismatch_and_empty_slots_miss(kind: str, tmp_path: Path) -> None:
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    before = pool.data.copy()
    wrong = m["keys"].copy()
    wrong[0, 7] ^= 1
    ok = tier.load(pool, i32(0, 1, 5), i32(6, 7, 8), np.concatenate([wrong[:1], m["keys"][1:], wrong[:1]]))
    assert ok.tolist() == [False, True, False]
    assert np.array_equal(pool.data[:, :, 6].view(np.uint8), before[:, :, 6].view(np.uint8))  # untouched
    s = tier.stats()
    assert (s["load_failed"], s["load_failed_key"], s["load_failed_empty"], s["loads"]) == (2, 1, 1, 1)


def test_forget_empties_slots(kind: str, tmp_path: Path) -> None:
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool)
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    tier.forget(i32(1, 1, 5))  # a repeat and a slot holding nothing are fine
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).tolist() == [True, False, True]
    s = tier.stats()
    assert (s["forgets"], s["slots_used"], s["load_failed_empty"]) == (1, 2, 1)
    if kind == "disk":
        assert not slot_path(tier, 1).exists() and slot_path(tier, 0).exists()


def test_fp8_pages_miss_under_other_scales(kind: str, tmp_path: Path) -> None:
    """fp8/int8 bytes mean x / scale: a page stored under other pool scales is a miss, not wrong K/V."""
    pool = make_pool("fp8")
    tier = make_tier(kind, tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    pool.set_scales(0, 0.5, 2.0)
    assert tier.load(pool, i32(0), i32(2), m["keys"]).tolist() == [False]
    assert tier.stats()["load_failed_scales"] == 1
    pool.set_scales(0, 1.0, 1.0)
    assert tier.load(pool, i32(0), i32(2), m["keys"]).tolist() == [True]


# ------------------------------------------------------------------------------------------ caller mistakes


def test_a_namespace_that_is_not_unicode_is_refused_before_anything_is_written(
    kind: str, tmp_path: Path
) -> None:
    """A lone surrogate cannot be stored as UTF-8: the whole call is refused up front (it used to
    write the rows before it, then raise UnicodeEncodeError from the header; the host tier took it)."""
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool)
    m = meta(3, namespaces=["ok", None, "bad\ud800"])
    before = tier.stats()
    with pytest.raises(InvalidArgumentError, match="namespaces"):
        tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m)
    assert tier.stats() == before
    assert tier.load(pool, i32(0, 1), i32(4, 5), m["keys"][:2]).tolist() == [False, False]
    if kind == "disk":
        assert sorted(p.name for p in Path(tier.path).iterdir()) == ["tier.lock"]


def test_one_page_may_be_stored_to_two_slots(kind: str, tmp_path: Path) -> None:
    """A store reads its pages: one pool page stored twice (the manager does it when a public page is
    stored under the public key and a tenant's in one batch) lands in both slots, each loading back
    the page's bytes. Loads still refuse a repeated destination page (a page has one content)."""
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool, num_slots=4)
    m = meta(2)
    assert tier.store(pool, i32(3, 3), i32(1, 2), **m).all()
    assert tier.load(pool, i32(1, 2), i32(5, 6), m["keys"]).all()
    for page in (5, 6):
        np.testing.assert_array_equal(pool.data[:, :, page], pool.data[:, :, 3])
    with pytest.raises(InvalidArgumentError, match="pages"):
        tier.load(pool, i32(1, 2), i32(5, 5), m["keys"])


def test_caller_mistakes_raise_and_change_nothing(kind: str, tmp_path: Path) -> None:
    pool = make_pool()
    tier = make_tier(kind, tmp_path, pool, num_slots=4)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    before = tier.stats()
    bad: list[tuple[type[Exception], dict[str, Any]]] = [
        (InvalidArgumentError, {"slots": i32(0, 4)}),  # out of range
        (InvalidArgumentError, {"slots": i32(2, 2)}),  # repeated
        (InvalidPageError, {"pages": i32(0, 1)}),  # the null page
        (InvalidDTypeError, {"keys": np.zeros((2, 15), np.uint8)}),
        (InvalidDTypeError, {"tokens": np.zeros((2, P + 1), np.uint32)}),
        (InvalidDTypeError, {"parent_keys": np.zeros((3, 16), np.uint8)}),
        (InvalidDTypeError, {"namespaces": [None]}),
        (InvalidArgumentError, {"namespaces": [None, 7]}),
        (InvalidDTypeError, {"pages": np.array([1.0, 2.0])}),
    ]
    for exc, override in bad:
        args = {"pages": i32(3, 4), "slots": i32(2, 3), **meta(2), **override}
        with pytest.raises(exc):
            tier.store(pool, args.pop("pages"), args.pop("slots"), **args)
    with pytest.raises(InvalidArgumentError, match="stores pages of"):
        tier.store(make_pool(layout="NHD"), i32(3), i32(2), **meta(1))
    with pytest.raises(InvalidArgumentError, match="stores pages of"):
        tier.load(make_pool("fp16"), i32(0), i32(3), m["keys"][:1])
    with pytest.raises(InvalidArgumentError):
        tier.load(pool, i32(0, 1), i32(3, 3), m["keys"])  # a page loaded twice
    with pytest.raises(InvalidArgumentError):
        tier.load(pool, i32(-1), i32(3), m["keys"][:1])
    assert tier.stats() == before
    assert tier.load(pool, i32(0, 1), i32(5, 6), m["keys"]).all()


def test_a_budget_beyond_the_filesystem_is_refused_and_one_beyond_its_free_space_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capacity no filesystem could hold made the manager count slots free that no file could fill:
    it never evicted, and once the disk was full the tier stored nothing more, for good."""
    pool = make_pool()
    fs = os.statvfs(tmp_path)
    total = fs.f_blocks * fs.f_frsize
    with pytest.raises(ConfigError, match=r"holds \d+ bytes in all"):
        DiskTier(tmp_path / "big", total + 1, pool)
    DiskTier(tmp_path / "big", 1 << 20, pool).close()  # the refused one released the directory
    # A budget the filesystem could hold but whose free space is short: a ResourceWarning.
    real = os.statvfs

    class Full:
        def __init__(self, st: os.statvfs_result) -> None:
            self.f_blocks, self.f_frsize, self.f_bavail = st.f_blocks, st.f_frsize, 0

    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    with pytest.warns(ResourceWarning, match="stores past it fail"):
        DiskTier(tmp_path / "short", 1 << 20, pool).close()


def test_a_budget_of_many_filesystems_is_a_config_error_not_numpy_memory(tmp_path: Path) -> None:
    """The room check comes before the per-slot index: a budget 10,000x the filesystem raised
    NumPy's MemoryError allocating an index for slots no disk could hold."""
    pool = make_pool()
    fs = os.statvfs(tmp_path)
    total = fs.f_blocks * fs.f_frsize
    with pytest.raises(ConfigError, match=r"holds \d+ bytes in all"):
        DiskTier(tmp_path / "huge", total * 10_000, pool)
    DiskTier(tmp_path / "huge", 1 << 20, pool).close()  # the directory was released


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (5, "expected a str or os.PathLike"),
        (None, "expected a str or os.PathLike"),
        (b"bytes\0nul", "usable directory"),
        ("nul\0byte", "usable directory"),
        ("lone\udcffsurrogate\ud800", "usable directory"),
    ],
)
def test_a_path_of_the_wrong_kind_is_a_config_error(path: object, why: str, tmp_path: Path) -> None:
    pool = make_pool()
    if isinstance(path, str):
        path = f"{tmp_path}/{path}"
    with pytest.raises(ConfigError, match=why):
        DiskTier(path, 1 << 20, pool)  # type: ignore[arg-type]


def test_construction_errors(tmp_path: Path) -> None:
    pool = make_pool()
    tier = DiskTier(tmp_path / "a", 1 << 20, pool)
    size = tier.file_bytes
    tier.close()
    with pytest.raises(ConfigError, match="hold no slot"):
        DiskTier(tmp_path / "b", size - 1, pool)
    assert DiskTier(tmp_path / "c", size, pool).num_slots == 1
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ConfigError, match="usable directory"):
        DiskTier(tmp_path / "file", 1 << 20, pool)
    with pytest.raises(ConfigError, match="num_slots"):
        HostTier(pool, 0)


def test_one_disk_tier_per_directory(tmp_path: Path) -> None:
    pool = make_pool()
    first = DiskTier(tmp_path / "t", 1 << 20, pool)
    with pytest.raises(ConfigError, match="in use"):
        DiskTier(tmp_path / "t", 1 << 20, pool)
    first.close()
    with DiskTier(tmp_path / "t", 1 << 20, pool) as again:
        assert again.num_slots == first.num_slots


# ------------------------------------------------------------------------------------------ disk files


def test_reopen_lists_exactly_the_stored_entries(tmp_path: Path) -> None:
    pool = make_pool("int8", "NHD")
    tier = open_disk(tmp_path, pool, 8)
    m = meta(5)
    slots = i32(7, 0, 3, 4, 1)
    assert tier.store(pool, i32(1, 2, 3, 4, 5), slots, **m).all()
    tier.forget(i32(4))
    tier.close()
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    entries = again.entries()
    assert [e.slot for e in entries] == [0, 1, 3, 7]
    by_slot = {int(s): i for i, s in enumerate(slots)}
    for e in entries:
        i = by_slot[e.slot]
        assert e.key == m["keys"][i].tobytes() and e.parent_key == m["parent_keys"][i].tobytes()
        assert e.namespace == m["namespaces"][i]
        assert e.tokens.dtype == np.uint32 and np.array_equal(e.tokens, m["tokens"][i])
    assert again.stats()["open_entries"] == 4 and again.stats()["open_removed"] == 0
    assert again.load(pool, i32(7, 3), i32(9, 10), m["keys"][[0, 2]]).all()
    assert np.array_equal(page_bytes(pool, 9), page_bytes(pool, 1))


def test_header_pack_parse_round_trip() -> None:
    g = codec.Geometry.of_pool(make_pool("bf16", "NHD"), "int4")
    buf = bytearray(codec.header_len(g))
    toks = np.arange(P, dtype=np.uint32) + 2**31
    n = codec.pack_header(
        buf,
        geometry=g,
        key=b"k" * 16,
        parent_key=b"p" * 16,
        namespace="ns✓",
        tokens=toks,
        payload_len=123,
        payload_checksum=b"c" * 16,
        scale_digest=bytes(16),
    )
    assert n == len(buf) == 4096 and buf[:8] == codec.MAGIC
    h = codec.parse_header(bytes(buf))
    assert (h.key, h.parent_key, h.namespace, h.geometry, h.payload_len) == (
        b"k" * 16,
        b"p" * 16,
        "ns✓",
        g,
        123,
    )
    assert np.array_equal(h.tokens, toks) and h.payload_checksum == b"c" * 16
    for off, reason in (
        (0, "magic"),
        (8, "version"),
        (10, "malformed"),
        (20, "checksum"),
        (4095, "checksum"),
    ):
        bad = bytearray(buf)
        bad[off] ^= 0x40
        with pytest.raises(codec.HeaderError) as e:
            codec.parse_header(bytes(bad))
        assert e.value.reason == reason
    with pytest.raises(codec.HeaderError) as e:
        codec.pack_header(
            buf,
            geometry=g,
            key=b"k" * 16,
            parent_key=b"p" * 16,
            namespace="x" * (codec.namespace_room(g) + 1),
            tokens=toks,
            payload_len=1,
            payload_checksum=bytes(16),
            scale_digest=bytes(16),
        )
    assert e.value.reason == "namespace"


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_header_check_agrees_with_parse_header(namespace: str | None) -> None:
    """HeaderCheck (the loads' fast path) answers exactly what parse_header plus field compares
    answer, for the header as written and for every one-byte change to it, with the header checksum
    left stale (always refused) or recomputed (refused only where a field is wrong)."""
    g = codec.Geometry.of_pool(make_pool("bf16", "NHD"))
    hlen, end, key, digest = codec.header_len(g), codec.header_len(g) - 16, b"k" * 16, b"d" * 16
    check = codec.HeaderCheck(g, g.payload_bytes)

    def reference(buf: bytearray, key: bytes, digest: bytes) -> bytes | None:
        try:
            h = codec.parse_header(bytes(buf))
        except codec.HeaderError:
            return None
        same = (h.geometry, h.header_len, h.payload_len, h.key, h.scale_digest)
        return h.payload_checksum if same == (g, hlen, g.payload_bytes, key, digest) else None

    good = bytearray(hlen)
    codec.pack_header(
        good,
        geometry=g,
        key=key,
        parent_key=b"p" * 16,
        namespace=namespace,
        tokens=np.arange(P, dtype=np.uint32),
        payload_len=g.payload_bytes,
        payload_checksum=b"c" * 16,
        scale_digest=digest,
    )
    assert check.payload_checksum(good, key, digest) == b"c" * 16
    assert check.payload_checksum(good, b"K" * 16, digest) is None
    assert check.payload_checksum(good, key, bytes(16)) is None
    fields_end = codec.FIXED_LEN + 4 * P + len((namespace or "").encode()) + 8
    accepted = 0
    for off in [*range(fields_end), end - 1, end, hlen - 1]:
        for value in (good[off] ^ 0x01, 0xFF):
            bad = bytearray(good)
            bad[off] = value
            assert check.payload_checksum(bad, key, digest) is None  # stale header checksum
            bad[end:] = codec.checksum(np.frombuffer(bytes(bad[:end]), dtype=np.uint8))
            got = check.payload_checksum(bad, key, digest)
            assert got == reference(bad, key, digest), (off, value)
            accepted += got is not None
    assert accepted > 0  # changes to the parent key, tokens, payload checksum are still valid headers


def test_flipped_payload_byte_is_a_counted_miss_and_the_file_is_removed(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    path = slot_path(tier, 0)
    raw = bytearray(path.read_bytes())
    raw[tier.header_len + 17] ^= 0x01
    path.write_bytes(bytes(raw))
    assert tier.load(pool, i32(0, 1), i32(5, 6), m["keys"]).tolist() == [False, True]
    s = tier.stats()
    assert (s["load_failed_checksum"], s["checksum_mismatches"], s["slots_used"]) == (1, 1, 1)
    assert not path.exists()
    assert tier.load(pool, i32(0), i32(5), m["keys"][:1]).tolist() == [False]  # now simply empty
    assert tier.stats()["load_failed_empty"] == 1


@pytest.mark.parametrize(("offset", "counter"), [(0, "open_removed_header"), (40, "open_removed_header")])
def test_flipped_header_byte_is_removed_at_reopen(tmp_path: Path, offset: int, counter: str) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    tier.close()
    path = slot_path(tier, 1)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x80
    path.write_bytes(bytes(raw))
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    assert [e.slot for e in again.entries()] == [0]
    assert again.stats()[counter] == 1 and again.stats()["open_removed"] == 1
    assert not path.exists()
    assert again.load(pool, i32(1), i32(5), m["keys"][1:]).tolist() == [False]


def test_header_corrupted_after_open_is_a_counted_miss(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    path = slot_path(tier, 0)
    raw = bytearray(path.read_bytes())
    raw[50] ^= 0x01  # inside the geometry fields, covered by the header checksum
    path.write_bytes(bytes(raw))
    assert tier.load(pool, i32(0), i32(5), m["keys"]).tolist() == [False]
    s = tier.stats()
    assert (s["load_failed_corrupt"], s["checksum_mismatches"]) == (1, 1)
    assert not path.exists()


@pytest.mark.parametrize("cut", [1, 100, "header"])
def test_truncated_file_is_removed_at_reopen(tmp_path: Path, cut: int | str) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    tier.close()
    path = slot_path(tier, 0)
    size = path.stat().st_size
    os.truncate(path, 50 if cut == "header" else size - int(cut))
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    assert [e.slot for e in again.entries()] == [1]
    assert again.stats()["open_removed_truncated"] == 1 and not path.exists()


@pytest.mark.parametrize("cut", ["payload", "header", "fixed"])
def test_file_truncated_after_open_is_a_counted_miss(tmp_path: Path, cut: str) -> None:
    """Counted as corrupt only: a file cut inside its header is not a checksum mismatch (the rest of
    the read buffer held another file's header bytes, whose checksum then failed)."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    keep = {"payload": tier.file_bytes - 3, "header": tier.header_len - 3, "fixed": 10}[cut]
    os.truncate(slot_path(tier, 0), keep)
    assert tier.load(pool, i32(1, 0), i32(5, 6), m["keys"][::-1]).tolist() == [True, False]
    s = tier.stats()
    assert s["load_failed_corrupt"] == 1 and not slot_path(tier, 0).exists()
    assert s["checksum_mismatches"] == 0 and s["load_failed"] == 1


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("readers", [1, 4])
def test_a_load_on_reader_threads_matches_one_page_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, quantize: str | None
) -> None:
    """A load of many files runs on ``disk.READERS`` threads: its results, counters and pages are
    those of loading each page alone, good files and bad ones mixed."""
    monkeypatch.setattr(disk_module, "READERS", readers)
    n, cut = 40, 100
    pool = make_pool("bf16", num_pages=2 * n + 2)
    if quantize:
        fill_values(pool)
    tier = open_disk(tmp_path, pool, n, quantize=quantize)
    m = meta(n)
    slots = np.arange(n, dtype=np.int32)
    assert tier.store(pool, np.arange(1, n + 1, dtype=np.int32), slots, **m).all()
    want = {i: page_bytes(pool, i + 1) for i in range(n)}
    for slot, offset in ((3, tier.header_len + 5), (17, 50)):  # a payload byte, a header byte
        raw = bytearray(slot_path(tier, slot).read_bytes())
        raw[offset] ^= 0x01
        slot_path(tier, slot).write_bytes(bytes(raw))
    os.truncate(slot_path(tier, 22), tier.file_bytes - cut)
    os.unlink(slot_path(tier, 30))
    bad = {3, 17, 22, 30}
    dst = np.arange(n + 1, 2 * n + 1, dtype=np.int32)
    ok = tier.load(pool, slots, dst, m["keys"])
    assert ok.tolist() == [i not in bad for i in range(n)]
    s = tier.stats()
    assert (s["loads"], s["load_failed"], s["load_failed_checksum"], s["load_failed_corrupt"]) == (
        36,
        4,
        1,
        2,
    )
    assert (s["load_failed_io"], s["checksum_mismatches"], s["slots_used"]) == (1, 2, 36)
    assert s["bytes_read"] == 39 * tier.file_bytes - cut
    assert not any(slot_path(tier, i).exists() for i in bad)
    alone = 2 * n + 1  # a scratch page: each good slot loaded by itself (one thread, no prefetch)
    for i in sorted(set(range(n)) - bad):
        assert tier.load(pool, i32(i), i32(alone), m["keys"][i : i + 1]).tolist() == [True]
        assert np.array_equal(
            page_bytes(pool, int(dst[i])).view(np.uint8), page_bytes(pool, alone).view(np.uint8)
        )
        if quantize is None:
            assert np.array_equal(page_bytes(pool, alone).view(np.uint8), want[i].view(np.uint8))


def test_a_bug_on_a_reader_thread_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception other than an OSError on a reader thread is not swallowed: the load raises it."""
    n = 32
    pool = make_pool(num_pages=2 * n + 1)
    tier = open_disk(tmp_path, pool, n)
    m = meta(n)
    slots = np.arange(n, dtype=np.int32)
    assert tier.store(pool, np.arange(1, n + 1, dtype=np.int32), slots, **m).all()
    real = DiskTier._fetch

    def fetch(self: DiskTier, path: str, *a: Any) -> Any:
        if path.endswith(slot_filename(n - 3)):
            raise RuntimeError("a bug")
        return real(self, path, *a)

    monkeypatch.setattr(DiskTier, "_fetch", fetch)
    with pytest.raises(RuntimeError, match="a bug"):
        tier.load(pool, slots, np.arange(n + 1, 2 * n + 1, dtype=np.int32), m["keys"])


@contextlib.contextmanager
def _sigusr1_raises_keyboard_interrupt() -> Any:
    """SIGUSR1 raises KeyboardInterrupt in the main thread (as SIGINT does), for the block's duration."""
    assert threading.current_thread() is threading.main_thread()  # where signal handlers run

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)


def stored_pages(
    path: Path, n: int
) -> tuple[KVPool, DiskTier, dict[str, Any], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """A disk tier holding pool pages ``1..n`` in slots ``0..n-1``: (pool, tier, their meta, slots, the
    other ``n`` pool pages to load them into)."""
    pool = make_pool(num_pages=2 * n + 1)
    tier = open_disk(path, pool, n)
    m = meta(n)
    slots = np.arange(n, dtype=np.int32)
    assert tier.store(pool, np.arange(1, n + 1, dtype=np.int32), slots, **m).all()
    return pool, tier, m, slots, np.arange(n + 1, 2 * n + 1, dtype=np.int32)


def test_a_load_interrupted_while_it_waits_for_its_readers_ends_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt (SIGINT, or any signal handler's exception) reaching the loading thread while
    it waits for its reader threads goes on to the caller only once no reader can still write into the
    pool: the engine frees those pages at once and gives them to another request, whose K/V a late
    ``readv`` would overwrite. (Not checked with ``Thread.is_alive``: after a join interrupted so,
    CPython 3.11 reports a running thread stopped.)"""
    monkeypatch.setattr(disk_module, "READERS", 2)  # the loading thread and one reader thread
    n = 32
    pool, tier, m, slots, dst = stored_pages(tmp_path, n)
    main = threading.get_ident()
    real = disk_module._read_all
    loader_reads = [0]
    interrupted, late_read_done = threading.Event(), threading.Event()
    late_read_end = [0.0]

    def read_all(fd: int, bufs: list[Any], total: int) -> int:
        if threading.get_ident() == main:
            loader_reads[0] += 1
            return real(fd, bufs, total)
        if interrupted.is_set():
            return real(fd, bufs, total)
        # the reader's file: once the loading thread has read every other one and waits (its
        # innermost frame in threading.py), interrupt it; this read lands well after that
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            if (
                loader_reads[0] == n - 1
                and frame is not None
                and frame.f_code.co_filename == threading.__file__
            ):
                break
            time.sleep(0.001)
        interrupted.set()
        signal.pthread_kill(main, signal.SIGUSR1)
        time.sleep(0.2)  # a slow device
        try:
            return real(fd, bufs, total)
        finally:
            late_read_end[0] = time.monotonic()
            late_read_done.set()

    monkeypatch.setattr(disk_module, "_read_all", read_all)
    pool.data[:, :, n + 1 :] = 0
    with _sigusr1_raises_keyboard_interrupt():
        with pytest.raises(KeyboardInterrupt):
            tier.load(pool, slots, dst, m["keys"])
        raised = time.monotonic()
        after = pool.data.copy()
        assert late_read_done.wait(5)
    assert interrupted.is_set() and loader_reads[0] == n - 1
    assert late_read_end[0] < raised  # the reader's readv was over before the load raised ...
    assert np.array_equal(pool.data.view(np.uint8), after.view(np.uint8))  # ... nothing written after
    monkeypatch.undo()
    assert tier.load(pool, slots, dst, m["keys"]).all()  # and the tier is as it was
    assert tier.stats()["load_failed"] == 0


def test_an_interrupted_load_stops_its_readers_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt in the loading thread's own read: the reader threads take no further file, and
    the load raises it once they are done with the file each was reading."""
    n = 64
    pool, tier, m, slots, dst = stored_pages(tmp_path, n)
    main = threading.get_ident()
    real = disk_module._read_all
    begun, ended = [0], [0]

    def read_all(fd: int, bufs: list[Any], total: int) -> int:
        if threading.get_ident() == main:
            time.sleep(0.02)
            raise KeyboardInterrupt
        begun[0] += 1
        time.sleep(0.01)
        try:
            return real(fd, bufs, total)
        finally:
            ended[0] += 1

    monkeypatch.setattr(disk_module, "_read_all", read_all)
    with pytest.raises(KeyboardInterrupt):
        tier.load(pool, slots, dst, m["keys"])
    assert begun[0] == ended[0]  # no reader mid-file
    assert 0 < ended[0] < n // 4  # 3 reader threads, a few files each, not the other 63
    time.sleep(0.05)
    assert begun[0] == ended[0]  # none took another file
    monkeypatch.undo()
    assert tier.load(pool, slots, dst, m["keys"]).all()


@pytest.mark.parametrize("where", ["write", "fstat_recycled", "fstat_new"])
def test_an_interrupted_store_leaks_no_descriptor(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt mid-write, or right after the temp file's open (its fstat: on the slot's old
    file, recycled, or on a new one), goes on to the caller, the temp file's descriptor closed (one
    leaked per interrupt before, holding a removed temp file's blocks); the slot is empty and the
    next store of it succeeds."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    slot = 1 if where == "fstat_new" else 0
    if slot:
        assert tier.store(pool, i32(1), i32(1), **m).all()
        tier.forget(i32(1))  # slot 1 empty: its next store opens a new file
    fds = set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None

    def interrupted(*args: Any) -> None:
        if where != "write":
            monkeypatch.undo()  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(*((disk_module, "_write_all") if where == "write" else (os, "fstat")), interrupted)
    with pytest.raises(KeyboardInterrupt):
        tier.store(pool, i32(2), i32(slot), **meta(1, seed=3))
    monkeypatch.undo()
    if fds is not None:
        assert set(os.listdir("/proc/self/fd")) == fds
    if slot:
        assert tier.store(pool, i32(2), i32(1), **meta(1, seed=3)).all()
        return
    assert tier.load(pool, i32(0), i32(3), m["keys"]).tolist() == [False]  # the old page is gone
    assert tier.store(pool, i32(2), i32(0), **m).all()
    assert tier.load(pool, i32(0), i32(3), m["keys"]).all()
    assert np.array_equal(page_bytes(pool, 3).view(np.uint8), page_bytes(pool, 2).view(np.uint8))


def test_leftover_temp_files_are_removed_at_open(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(2), **m).all()
    tier.close()
    good = slot_path(tier, 2).read_bytes()
    (Path(tier.path) / (slot_filename(3) + ".tmp")).write_bytes(good[:1000])  # torn
    (Path(tier.path) / (slot_filename(4) + ".tmp")).write_bytes(good)  # complete but never renamed
    (Path(tier.path) / "notes.txt").write_text("an operator's file")
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    assert [e.slot for e in again.entries()] == [2]
    assert again.stats()["open_removed_temp"] == 2
    assert sorted(p.name for p in Path(tier.path).iterdir()) == ["notes.txt", slot_filename(2), "tier.lock"]


def test_a_crash_mid_store_is_never_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the store between writing the temp file and renaming it (the worst moment: the slot's old
    file was recycled as the temp file): after a restart the slot is simply absent."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()

    class Crash(BaseException):
        pass

    def crash(*a: Any, **k: Any) -> None:
        raise Crash

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(Crash):
        tier.store(pool, i32(3), i32(0), **meta(1, seed=5))
    monkeypatch.undo()
    tier.close()
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    assert [e.slot for e in again.entries()] == [1]
    assert again.stats()["open_removed_temp"] == 1


def test_foreign_geometry_files_are_left_alone(tmp_path: Path) -> None:
    bf16, fp16 = make_pool("bf16"), make_pool("fp16")
    tier = open_disk(tmp_path, bf16)
    m = meta(2)
    assert tier.store(bf16, i32(1, 2), i32(0, 1), **m).all()
    tier.close()
    other = DiskTier(tier.path, 8 * tier.file_bytes, fp16)
    assert other.entries() == [] and other.stats()["open_foreign"] == 2 and other.stats()["open_removed"] == 0
    assert other.load(fp16, i32(0), i32(3), m["keys"][:1]).tolist() == [False]
    other.close()
    quantized = DiskTier(tier.path, 8 * tier.file_bytes, bf16, quantize="int8")
    assert quantized.entries() == [] and quantized.stats()["open_foreign"] == 2
    quantized.close()
    back = DiskTier(tier.path, 8 * tier.file_bytes, bf16)
    assert [e.slot for e in back.entries()] == [0, 1]
    assert back.load(bf16, i32(0, 1), i32(3, 4), m["keys"]).all()


def test_files_of_another_format_version_are_left_alone(tmp_path: Path) -> None:
    """A directory another kvcore version wrote (its format version in the header): opening it here
    deleted every file (a bad header); they are now left alone as another geometry's are, and a
    store of their slot replaces them."""
    pool = make_pool("bf16")
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    tier.close()
    original = {slot: slot_path(tier, slot).read_bytes() for slot in (0, 1)}
    for slot in (0, 1):  # the u16 at offset 8: format version 2
        raw = bytearray(original[slot])
        raw[8:10] = (2).to_bytes(2, "little")
        slot_path(tier, slot).write_bytes(bytes(raw))
    newer = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    s = newer.stats()
    assert newer.entries() == [] and (s["open_foreign"], s["open_removed"]) == (2, 0)
    assert slot_path(tier, 0).exists() and slot_path(tier, 1).exists()
    assert newer.load(pool, i32(0), i32(3), m["keys"][:1]).tolist() == [False]
    assert newer.store(pool, i32(5), i32(1), **meta(1, seed=9)).all()  # replaces slot 1's file
    newer.close()
    back = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    assert [e.slot for e in back.entries()] == [1] and back.stats()["open_foreign"] == 1


def test_slots_beyond_a_smaller_capacity_are_removed(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    assert tier.store(pool, i32(1, 2), i32(1, 6), **meta(2)).all()
    tier.close()
    small = DiskTier(tier.path, 4 * tier.file_bytes, pool)
    assert [e.slot for e in small.entries()] == [1]
    assert small.stats()["open_removed_out_of_range"] == 1 and not slot_path(tier, 6).exists()


def test_namespace_too_long_for_a_header_is_a_counted_failure(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    room = codec.namespace_room(tier.geometry)
    m = meta(2, namespaces=["x" * room, "y" * (room + 1)])
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).tolist() == [True, False]
    assert tier.stats()["store_failed_namespace"] == 1
    tier.close()
    assert DiskTier(tier.path, 8 * tier.file_bytes, pool).entries()[0].namespace == "x" * room


def test_fsync_mode_syncs_every_file_and_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool, fsync=True)
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    assert len(synced) == 4  # three files, then the directory once for the batch
    monkeypatch.undo()
    assert tier.load(pool, i32(0, 1, 2), i32(4, 5, 6), m["keys"]).all()


# ------------------------------------------------------------------------------------------ I/O failures


def _fail_nth(n: int, err: int, real: Any) -> Any:
    calls = {"n": 0}

    def fake(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if n < 0 or calls["n"] == n:
            raise OSError(err, os.strerror(err))
        return real(*a, **k)

    return fake


@pytest.mark.parametrize(
    ("fn", "err", "counter"),
    [
        ("writev", errno.ENOSPC, "store_failed_no_space"),
        ("writev", errno.EDQUOT, "store_failed_no_space"),
        ("open", errno.EACCES, "store_failed_permission"),
        ("replace", errno.EIO, "store_failed_io"),
        ("rename", errno.EIO, "store_failed_io"),  # recycling the old file fails: it must go all the same
        ("open", errno.EMFILE, "store_failed_other"),
    ],
)
def test_io_errors_are_counted_failures_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fn: str, err: int, counter: str
) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    # the second of three stores fails; slot 1 held a page, which is gone afterwards (not stale)
    monkeypatch.setattr(os, fn, _fail_nth(2, err, getattr(os, fn)))
    m2 = meta(3, seed=9)
    assert tier.store(pool, i32(4, 5, 6), i32(0, 1, 2), **m2).tolist() == [True, False, True]
    monkeypatch.undo()
    s = tier.stats()
    assert (s[counter], s["store_failed"], s["stores"], s["slots_used"]) == (1, 1, 5, 2)
    keys = np.stack([m2["keys"][0], m2["keys"][1], m["keys"][1], m2["keys"][2]])
    assert tier.load(pool, i32(0, 1, 1, 2), i32(7, 8, 9, 10), keys).tolist() == [True, False, False, True]
    assert sorted(p.name for p in Path(tier.path).iterdir()) == [
        slot_filename(0),
        slot_filename(2),
        "tier.lock",
    ]


def test_full_disk_fails_every_store_without_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    monkeypatch.setattr(os, "writev", _fail_nth(-1, errno.ENOSPC, os.writev))
    monkeypatch.setattr(os, "write", _fail_nth(-1, errno.ENOSPC, os.write))
    assert not tier.store(pool, i32(1, 2, 3, 4), i32(0, 1, 2, 3), **meta(4)).any()
    assert tier.stats()["store_failed_no_space"] == 4 and tier.stats()["slots_used"] == 0
    monkeypatch.undo()
    assert sorted(p.name for p in Path(tier.path).iterdir()) == ["tier.lock"]
    assert tier.store(pool, i32(1), i32(0), **meta(1)).all()  # space is back


def test_short_writes_and_reads_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writev/readv may move fewer bytes than asked; the tier loops until every byte is through."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    real_writev, real_readv = os.writev, os.readv

    def short_writev(fd: int, bufs: list[Any]) -> int:
        return real_writev(fd, [memoryview(bufs[0])[:777]])

    def short_readv(fd: int, bufs: list[Any]) -> int:
        return real_readv(fd, [memoryview(bufs[0])[:333]])

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(os, "readv", short_readv)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    assert tier.load(pool, i32(0, 1), i32(3, 4), m["keys"]).all()
    assert np.array_equal(page_bytes(pool, 3), page_bytes(pool, 1))


def test_read_errors_are_counted_misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    monkeypatch.setattr(os, "readv", _fail_nth(-1, errno.EIO, os.readv))
    assert not tier.load(pool, i32(0, 1), i32(3, 4), m["keys"]).any()
    monkeypatch.undo()
    assert tier.stats()["load_failed_io"] == 2
    os.unlink(slot_path(tier, 1))  # removed behind the tier's back
    assert tier.load(pool, i32(0, 1), i32(3, 4), m["keys"]).tolist() == [True, False]
    assert tier.stats()["load_failed_io"] == 3 and tier.stats()["slots_used"] == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_directory_fails_stores_without_raising(tmp_path: Path) -> None:
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1), i32(0), **m)[:1].all()
    os.chmod(tier.path, 0o500)
    try:
        assert tier.store(pool, i32(2, 3), i32(1, 0), **meta(2, seed=3)).tolist() == [False, False]
        assert tier.stats()["store_failed_permission"] == 2
        assert tier.load(pool, i32(0), i32(4), m["keys"][:1]).tolist() == [False]  # slot 0 was dropped
    finally:
        os.chmod(tier.path, 0o700)


# ------------------------------------------------------------------------------------------ planted entries


def _temp_path(tier: DiskTier, slot: int) -> Path:
    return Path(str(slot_path(tier, slot)) + ".tmp")


@pytest.mark.parametrize(
    "plant", ["symlink at the slot", "symlink at the temp name", "dangling symlink", "hard link at the slot"]
)
def test_links_at_slot_and_temp_names_are_never_written_through(tmp_path: Path, plant: str) -> None:
    """Whatever someone puts at a slot file's or a temp file's name, a store writes and truncates
    nothing outside the directory: the link itself is replaced, never followed. Slot 0 is in use (its
    old file is recycled), slot 5 is not (a new file is made)."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **meta(2)).all()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    precious = b"precious data\n" * 10
    victim.write_bytes(precious)
    if plant == "symlink at the slot":
        slot_path(tier, 0).unlink()
        slot_path(tier, 0).symlink_to(victim)
    elif plant == "symlink at the temp name":
        _temp_path(tier, 0).symlink_to(victim)
        _temp_path(tier, 5).symlink_to(victim)
    elif plant == "dangling symlink":  # an O_CREAT through it would make a file outside
        _temp_path(tier, 0).symlink_to(outside / "made0")
        _temp_path(tier, 5).symlink_to(outside / "made5")
    else:
        slot_path(tier, 0).unlink()
        os.link(victim, slot_path(tier, 0))
    m = meta(2, seed=3)
    assert tier.store(pool, i32(3, 4), i32(0, 5), **m).tolist() == [True, True]
    assert victim.read_bytes() == precious and victim.stat().st_nlink == 1
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    for slot in (0, 5):
        st = os.lstat(slot_path(tier, slot))
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == tier.file_bytes
        assert not os.path.lexists(_temp_path(tier, slot))
    assert tier.load(pool, i32(0, 5), i32(8, 9), m["keys"]).all()
    assert np.array_equal(page_bytes(pool, 8).view(np.uint8), page_bytes(pool, 3).view(np.uint8))
    assert np.array_equal(page_bytes(pool, 9).view(np.uint8), page_bytes(pool, 4).view(np.uint8))


def _within(seconds: float, fn: Any, *args: Any, fifos: list[Path], **kw: Any) -> Any:
    """``fn(*args, **kw)`` on a thread; the test fails if it has not returned within ``seconds``
    (then the FIFOs are opened at the other end, so that the stuck thread can end)."""
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(fn(*args, **kw)), daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():
        fds = []
        for f in fifos:
            with contextlib.suppress(OSError):
                fds.append(os.open(f, os.O_RDWR | os.O_NONBLOCK))
        th.join(1)
        for fd in fds:
            os.close(fd)
        pytest.fail(f"{fn.__name__} still blocked after {seconds} s")
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_at_slot_and_temp_names_never_block(tmp_path: Path) -> None:
    """A FIFO at a slot's name fails its load at once, counted, and is removed; a store over one
    (recycling the slot's old file) or onto one (a FIFO at a new file's temp name) replaces it.
    These used to block in open() forever, holding the tier's lock."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(3)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **m).all()
    fifos = [slot_path(tier, 0), slot_path(tier, 1), _temp_path(tier, 5)]
    for f in fifos[:2]:
        f.unlink()
    for f in fifos:
        os.mkfifo(f)
    loads = tier.stats()["loads"]
    ok = _within(
        10, tier.load, pool, i32(0, 2), i32(6, 7), np.stack([m["keys"][0], m["keys"][2]]), fifos=fifos
    )
    assert ok.tolist() == [False, True]
    s = tier.stats()
    assert (s["load_failed_io"], s["loads"] - loads, s["slots_used"]) == (1, 1, 2)
    assert not os.path.lexists(slot_path(tier, 0))  # the FIFO is gone: the slot is empty
    m2 = meta(2, seed=4)
    ok = _within(10, tier.store, pool, i32(4, 5), i32(1, 5), **m2, fifos=fifos)
    assert ok.tolist() == [True, True]
    for slot in (1, 5):
        assert stat.S_ISREG(os.lstat(slot_path(tier, slot)).st_mode)
    assert tier.load(pool, i32(1, 5), i32(8, 9), m2["keys"]).all()
    assert np.array_equal(page_bytes(pool, 9).view(np.uint8), page_bytes(pool, 5).view(np.uint8))


def test_a_directory_at_a_slot_name_fails_one_load_and_empties_the_slot(tmp_path: Path) -> None:
    """A directory put at a used slot's name: one counted miss, then the slot is empty; the directory
    is removed only if empty (an operator's files in it are not ours)."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    for slot in (0, 1):
        slot_path(tier, slot).unlink()
        slot_path(tier, slot).mkdir()
    (slot_path(tier, 1) / "keep.txt").write_text("an operator's file")
    for _ in range(3):
        assert tier.load(pool, i32(0, 1), i32(4, 5), m["keys"]).tolist() == [False, False]
    s = tier.stats()
    assert (s["load_failed_io"], s["load_failed_empty"], s["slots_used"], s["remove_failed"]) == (2, 4, 0, 1)
    assert not os.path.lexists(slot_path(tier, 0))
    assert (slot_path(tier, 1) / "keep.txt").read_text() == "an operator's file"


def test_only_temp_files_of_ours_are_removed_and_only_removals_are_counted(tmp_path: Path) -> None:
    """At open, a temp file is removed only under a name this tier writes ([0-9], not any Unicode
    digit; 8 digits or the slot's own), a directory only if empty, and only what was removed is
    counted as removed. A store whose temp name holds a non-empty directory fails, counted; an empty
    one is removed and the store goes through."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    assert tier.store(pool, i32(1), i32(2), **meta(1)).all()
    tier.close()
    d = Path(tier.path)
    busy = _temp_path(tier, 3)
    busy.mkdir()
    (busy / "keep.txt").write_text("an operator's file")
    _temp_path(tier, 4).mkdir()  # empty: nothing to lose
    _temp_path(tier, 6).write_bytes(b"torn")  # a crash's leftover
    foreign = [
        d / "slot-\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668.kv.tmp",
        d / "slot-000000005.kv.tmp",
    ]
    for f in foreign:
        f.write_text("not a name this tier writes")
    again = DiskTier(tier.path, 8 * tier.file_bytes, pool)
    s = again.stats()
    assert (s["open_removed_temp"], s["open_removed"], s["remove_failed"]) == (2, 2, 1)
    assert all(f.exists() for f in foreign) and (busy / "keep.txt").exists()
    assert not os.path.lexists(_temp_path(tier, 4)) and not os.path.lexists(_temp_path(tier, 6))
    _temp_path(tier, 7).mkdir()  # after open, at a new file's temp name
    m = meta(3, seed=2)
    assert again.store(pool, i32(3, 4, 5), i32(3, 4, 7), **m).tolist() == [False, True, True]
    s = again.stats()
    assert (s["store_failed_other"], s["remove_failed"]) == (1, 2)
    assert (busy / "keep.txt").read_text() == "an operator's file"
    assert again.load(pool, i32(4, 7), i32(8, 9), m["keys"][1:]).all()


def test_a_hard_link_swapped_out_before_the_check_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of a hard link at a used slot's name: the store renames it to the temp name and opens
    it, and before its fstat the attacker renames something else over the temp name, so the victim
    has one link again. Only the inode the tier made is recycled: the victim is never written."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    precious = b"precious data\n" * 10
    victim.write_bytes(precious)
    d = Path(tier.path)
    os.link(victim, d / "x")
    os.replace(d / "x", slot_path(tier, 0))  # nlink 2: the tier's old file is gone
    real = os.fstat
    swapped: list[int] = []

    def fstat(fd: int) -> os.stat_result:
        if real(fd).st_ino == victim.stat().st_ino and not swapped:
            swapped.append(fd)
            (d / "y").write_bytes(b"the attacker's")
            os.replace(d / "y", _temp_path(tier, 0))  # the victim's link at the temp name goes
        return real(fd)

    monkeypatch.setattr(os, "fstat", fstat)
    m2 = meta(1, seed=3)
    assert tier.store(pool, i32(2), i32(0), **m2).tolist() == [True]
    monkeypatch.undo()
    assert swapped and victim.read_bytes() == precious and victim.stat().st_nlink == 1
    st = os.lstat(slot_path(tier, 0))
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_ino != victim.stat().st_ino
    assert not os.path.lexists(_temp_path(tier, 0))
    assert tier.load(pool, i32(0), i32(5), m2["keys"]).all()
    assert np.array_equal(page_bytes(pool, 5).view(np.uint8), page_bytes(pool, 2).view(np.uint8))


def test_a_store_recycles_only_its_own_files_with_one_fstat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path: a store over a used slot writes its old file in place (same inode, one fstat),
    whether the tier wrote it or validated it at open; a file put there by anyone else, even a
    regular file with one link, is replaced by a new one."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    assert tier.store(pool, i32(1, 2, 3), i32(0, 1, 2), **meta(3)).all()
    tier.close()
    tier = DiskTier(tier.path, 8 * tier.file_bytes, pool)  # slots 0-2 validated by the scan
    assert [e.slot for e in tier.entries()] == [0, 1, 2]
    stranger = Path(tier.path) / "stranger"
    stranger.write_bytes(slot_path(tier, 2).read_bytes())
    os.replace(stranger, slot_path(tier, 2))  # one link, a regular file, not the tier's inode
    inodes = [os.lstat(slot_path(tier, slot)).st_ino for slot in range(3)]
    real = os.fstat
    calls: list[int] = []
    monkeypatch.setattr(os, "fstat", lambda fd: (calls.append(fd), real(fd))[1])
    m = meta(2, seed=4)
    assert tier.store(pool, i32(4, 5), i32(0, 1), **m).all()
    assert len(calls) == 2  # one per recycled row
    for _ in range(2):  # the tier's own writes are recycled too
        assert tier.store(pool, i32(4, 5), i32(0, 1), **m).all()
    assert len(calls) == 6
    assert tier.store(pool, i32(6), i32(2), **meta(1, seed=5)).all()
    monkeypatch.undo()
    assert [os.lstat(slot_path(tier, slot)).st_ino for slot in (0, 1)] == inodes[:2]
    assert os.lstat(slot_path(tier, 2)).st_ino != inodes[2]
    assert tier.load(pool, i32(0, 1), i32(8, 9), m["keys"]).all()


def test_the_directory_swapped_for_a_symlink_is_never_followed(tmp_path: Path) -> None:
    """The tier's directory is resolved once, at open: renaming it away and putting a symlink to
    another directory at its path moves nothing of that other directory's (no write, no delete)."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1, 2), i32(0, 1), **m).all()
    other = tmp_path / "other"
    other.mkdir()
    for slot in (0, 1, 2):
        (other / slot_filename(slot)).write_bytes(b"someone else's")
    moved = tmp_path / "moved"
    os.rename(tier.path, moved)
    os.symlink(other, tier.path)
    m2 = meta(2, seed=7)
    assert tier.store(pool, i32(3, 4), i32(0, 2), **m2).all()
    tier.forget(i32(1))
    assert tier.load(pool, i32(0, 2), i32(8, 9), m2["keys"]).all()
    assert sorted(p.name for p in other.iterdir()) == [slot_filename(s) for s in (0, 1, 2)]
    assert all((other / slot_filename(s)).read_bytes() == b"someone else's" for s in (0, 1, 2))
    assert sorted(p.name for p in moved.iterdir()) == [slot_filename(0), slot_filename(2), "tier.lock"]
    tier.close()
    assert tier.store(pool, i32(5), i32(3), **meta(1, seed=8)).tolist() == [False]  # closed: EBADF
    assert not (other / slot_filename(3)).exists() and not (moved / slot_filename(3)).exists()


def test_an_empty_directory_at_an_unused_slot_name_is_replaced(tmp_path: Path) -> None:
    """A store replaces an empty directory at a slot's name (it used to fail for good: EISDIR); a
    non-empty one holds someone's files: a counted failure, every time, its files untouched."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    slot_path(tier, 0).mkdir()
    slot_path(tier, 1).mkdir()
    (slot_path(tier, 1) / "keep.txt").write_text("an operator's file")
    m = meta(2)
    for n in (1, 2):
        assert tier.store(pool, i32(1, 2), i32(0, 1), **m).tolist() == [True, False]
        s = tier.stats()
        assert (s["store_failed_other"], s["remove_failed"], s["slots_used"]) == (n, n, 1)
    assert stat.S_ISREG(os.lstat(slot_path(tier, 0)).st_mode)
    assert (slot_path(tier, 1) / "keep.txt").read_text() == "an operator's file"
    assert not os.path.lexists(_temp_path(tier, 1))
    assert tier.load(pool, i32(0), i32(5), m["keys"][:1]).all()


def test_an_empty_directory_at_a_used_slot_temp_name_is_replaced(tmp_path: Path) -> None:
    """A store over a used slot whose temp name holds an empty directory removes it and recycles the
    old file (it used to fail and destroy the old page: rename -> EISDIR)."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    assert tier.store(pool, i32(1), i32(0), **meta(1)).all()
    inode = os.lstat(slot_path(tier, 0)).st_ino
    _temp_path(tier, 0).mkdir()
    m = meta(1, seed=2)
    assert tier.store(pool, i32(2), i32(0), **m).tolist() == [True]
    assert os.lstat(slot_path(tier, 0)).st_ino == inode and not os.path.lexists(_temp_path(tier, 0))
    assert tier.load(pool, i32(0), i32(5), m["keys"]).all()
    assert np.array_equal(page_bytes(pool, 5).view(np.uint8), page_bytes(pool, 2).view(np.uint8))


@pytest.mark.parametrize("plant", ["unix socket", "ENODEV", "EISDIR", "ENXIO"])
def test_any_non_regular_file_at_a_used_slot_is_removed_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: str
) -> None:
    """Every open() error that means "not a regular file" (a socket gives ENXIO, a device without its
    driver ENODEV) is one counted miss, and the entry is removed, the slot emptied."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(1)
    assert tier.store(pool, i32(1), i32(0), **m).all()
    if plant == "unix socket":
        slot_path(tier, 0).unlink()
        monkeypatch.chdir(tier.path)  # a short name: sun_path holds 108 bytes
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(slot_filename(0))
        monkeypatch.undo()
    else:
        real = os.open
        err = getattr(errno, plant)

        def fake(path: Any, flags: int, *a: Any, **k: Any) -> int:
            if os.path.basename(os.fspath(path)) == slot_filename(0) and not flags & os.O_WRONLY:
                raise OSError(err, os.strerror(err))
            return real(path, flags, *a, **k)

        monkeypatch.setattr(os, "open", fake)
    try:
        for _ in range(2):
            assert tier.load(pool, i32(0), i32(5), m["keys"]).tolist() == [False]
        monkeypatch.undo()
        s = tier.stats()
        assert (s["load_failed_io"], s["load_failed_empty"], s["slots_used"]) == (1, 1, 0)
        assert not os.path.lexists(slot_path(tier, 0))
    finally:
        if plant == "unix socket":
            sock.close()


# ------------------------------------------------------------------------------------------ model-based


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["store", "load", "forget", "reopen"]),
            st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=12,
    ),
    kind=st.sampled_from(["host", "disk"]),
)
def test_tier_matches_a_dict_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any], kind: str
) -> None:
    """Random stores, loads, forgets and (disk) reopens against ``{slot: (key, page bytes)}``."""
    pool = make_pool("bf16", num_pages=16)
    path = tmp_path_factory.mktemp("model")
    tier: Any = HostTier(pool, 6) if kind == "host" else open_disk(path, pool, 6)
    model: dict[int, tuple[bytes, bytes]] = {}
    rng = np.random.default_rng(0)
    for op, slots, salt in ops:
        s = np.array(slots, dtype=np.int32)
        n = s.shape[0]
        if op == "store":
            pages = np.arange(1, 1 + n, dtype=np.int32) + salt
            m = meta(n, seed=int(rng.integers(1 << 30)))
            assert tier.store(pool, pages, s, **m).all()
            for i, slot in enumerate(slots):
                model[slot] = (m["keys"][i].tobytes(), page_bytes(pool, int(pages[i])).tobytes())
        elif op == "load":
            keys = np.array(
                [
                    np.frombuffer(model[x][0], np.uint8) if x in model and salt else np.full(16, 7, np.uint8)
                    for x in slots
                ]
            )
            dst = np.arange(10, 10 + n, dtype=np.int32)
            ok = tier.load(pool, s, dst, keys)
            for i, slot in enumerate(slots):
                hit = slot in model and model[slot][0] == keys[i].tobytes()
                assert ok[i] == hit
                if hit:
                    assert page_bytes(pool, int(dst[i])).tobytes() == model[slot][1]
        elif op == "forget":
            tier.forget(s)
            for slot in slots:
                model.pop(slot, None)
        elif kind == "disk":
            tier.close()
            tier = DiskTier(tier.path, 6 * tier.file_bytes, pool)
        if kind == "disk":  # what the tier holds now, reopened or not
            assert {e.slot: e.key for e in tier.entries()} == {k: v[0] for k, v in model.items()}
        assert tier.stats()["slots_used"] == len(model)
    if kind == "disk":
        tier.close()


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_cupy_pool_round_trip_matches_numpy(kind: str, tmp_path: Path, quantize: str | None) -> None:
    """The CuPy path (device gather, one D2H per run into pinned rows) stores the bytes the NumPy path
    stores, and loads them back the same."""
    host_pool = make_pool("bf16", "NHD")
    if quantize:
        fill_values(host_pool)
    dev_pool = host_pool.to("cupy")
    pages, slots, m = i32(1, 2, 3, 7), i32(0, 1, 2, 5), meta(4)
    results = []
    for i, pool in enumerate((host_pool, dev_pool)):
        tier = make_tier(kind, tmp_path / str(i), pool, quantize=quantize)
        assert tier.store(pool, pages, slots, **m).all()
        assert tier.load(pool, slots, i32(8, 9, 10, 11), m["keys"]).all()
        results.append(pool.backend.asnumpy(pool.data))
        if kind == "disk":
            tier.close()
    assert np.array_equal(results[0].view(np.uint8), results[1].view(np.uint8))


def test_files_take_whole_blocks_in_the_free_space_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning counted bytes, not blocks: 13 slots of 4,608 bytes on a 64 KiB tmpfs of 4 KiB
    blocks raised none, yet 7 files fit (8 KiB each) and the other 6 slots failed every store."""
    pool = make_pool()
    probe = open_disk(tmp_path / "probe", pool, num_slots=1)
    file_bytes = probe.file_bytes
    probe.close()
    block = 4096
    assert file_bytes % block, "the test needs files that are not whole blocks"
    slots = 13
    real = os.statvfs

    class Fs:
        def __init__(self, st: os.statvfs_result, bavail: int) -> None:
            self.f_blocks, self.f_frsize, self.f_bsize, self.f_bavail = st.f_blocks, block, block, bavail

    fits_bytes = -(-slots * file_bytes // block)  # the bytes fit, the blocks do not
    monkeypatch.setattr(os, "statvfs", lambda p: Fs(real(p), fits_bytes))
    with pytest.warns(ResourceWarning, match="in blocks of 4096"):
        open_disk(tmp_path / "short", pool, num_slots=slots).close()
    fits_blocks = slots * -(-file_bytes // block)
    monkeypatch.setattr(os, "statvfs", lambda p: Fs(real(p), fits_blocks))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        open_disk(tmp_path / "enough", pool, num_slots=slots).close()


def test_files_of_another_geometry_beyond_the_slots_are_removed_at_open(tmp_path: Path) -> None:
    """A directory used with int4, then unquantized with fewer (larger) slots: the int4 files at slots
    past the new num_slots were left for good (152 % of the budget on disk); they are removed as
    out of range. Those at slots in range are left until their slot is stored."""
    pool = make_pool(kv_dtype="fp16")
    small = open_disk(tmp_path, pool, num_slots=16, quantize="int4")
    m = meta(16)
    assert small.store(pool, np.arange(16, dtype=np.int32) % 11 + 1, np.arange(16, dtype=np.int32), **m).all()
    small.close()
    big = open_disk(tmp_path, pool, num_slots=4)
    s = big.stats()
    assert (s["open_foreign"], s["open_removed_out_of_range"], s["open_entries"]) == (4, 12, 0)
    names = sorted(p.name for p in (tmp_path / "tier").iterdir())
    assert names == sorted([*(slot_filename(i) for i in range(4)), "tier.lock"])
    assert big.entries() == []
    assert big.store(pool, i32(1), i32(0), **meta(1, seed=5)).all()  # a foreign file replaced
    big.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_may_not_use_its_parents_tier(tmp_path: Path) -> None:
    """A fork shares the directory lock (a second opener is refused, a child is not) but not the slot
    index: parent and child overwrote each other's files without an error."""
    pool = make_pool()
    tier = open_disk(tmp_path, pool)
    m = meta(2)
    assert tier.store(pool, i32(1), i32(0), **{k: v[:1] for k, v in m.items()}).all()
    pid = os.fork()
    if pid == 0:  # the child: every call that reads or writes the directory is refused
        code = 0
        calls = [
            lambda: tier.store(pool, i32(2), i32(1), **{k: v[1:] for k, v in m.items()}),
            lambda: tier.load(pool, i32(0), i32(3), m["keys"][:1]),
            lambda: tier.forget(i32(0)),
            tier.entries,
        ]
        for call in calls:
            try:
                call()
                code = 1
            except ConfigError:
                pass
            except BaseException:
                code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [e.slot for e in tier.entries()] == [0]  # the parent's tier is as it was
    assert tier.load(pool, i32(0), i32(3), m["keys"][:1]).all()
    tier.close()


# ------------------------------------------------------------------------------------------ review


def test_a_host_store_interrupted_mid_copy_never_loads_new_bytes_under_old_keys() -> None:
    """The slots' keys were updated after the copy: an exception during it (KeyboardInterrupt, a
    signal handler that raises) left page B's bytes under page A's key, and a load of A returned
    B's K/V. Slots are now empty while their bytes change: every load of them misses."""
    pool = make_pool(num_pages=12)
    tier = HostTier(pool, 8)
    slots, first, second = i32(0, 1, 2, 3, 4, 5), i32(1, 2, 3, 4, 5, 6), i32(7, 8, 9, 10, 11, 1)
    m1, m2 = meta(6, seed=1), meta(6, seed=2)
    tier.store(pool, first, slots, **m1)
    real = tier._codec.pages_to_rows

    def interrupted(pool_: KVPool, pages: np.ndarray, rows: np.ndarray, at: np.ndarray) -> None:
        real(pool_, pages[:3], rows, at[:3])  # half the rows copied, then the interrupt
        raise KeyboardInterrupt

    tier._codec.pages_to_rows = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        tier.store(pool, second, slots, **m2)
    tier._codec.pages_to_rows = real  # type: ignore[method-assign]
    before = [page_bytes(pool, p) for p in range(12)]
    for keys in (m1["keys"], m2["keys"]):
        assert not tier.load(pool, slots, i32(6, 7, 8, 9, 10, 11), keys).any()
    assert all(np.array_equal(page_bytes(pool, p), before[p]) for p in range(12))  # nothing written
    assert tier.slot_keys() == {} and tier.stats()["slots_used"] == 0
    assert tier.stats()["load_failed_empty"] == 12
    # Stored again, the slots hold and load the new pages.
    assert tier.store(pool, second, slots, **m2).all()
    want = [page_bytes(pool, p) for p in second]
    assert tier.load(pool, slots, i32(6, 7, 8, 9, 10, 11), m2["keys"]).all()
    assert all(np.array_equal(page_bytes(pool, p), w) for p, w in zip(range(6, 12), want, strict=True))


def test_host_and_disk_tiers_name_their_errors() -> None:
    """A slot count NumPy cannot allocate was a bare ValueError (OutOfMemoryError is documented); an
    fp8 pool given to a quantizing tier's store was ConfigError (another geometry:
    InvalidArgumentError, as for any other pool); a list as quantize was a TypeError (unhashable)."""
    from kvcore.exceptions import OutOfMemoryError

    pool = make_pool()
    for n in (2**62, np.uint64(2**63)):
        with pytest.raises(OutOfMemoryError):
            HostTier(pool, n)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="quantize"):
        HostTier(pool, 2, quantize=["int8"])  # type: ignore[arg-type]
    tier = HostTier(pool, 2, quantize="int8")
    fp8 = make_pool("fp8")
    with pytest.raises(InvalidArgumentError, match="stores pages of"):
        tier.load(fp8, i32(0), i32(1), np.zeros((1, 16), np.uint8))
    with pytest.raises(InvalidArgumentError, match="stores pages of"):
        tier.store(fp8, i32(1), i32(0), **meta(1))
    assert tier.stats()["stores"] == 0
    # The host tier keeps no checksum: it reports no checksum counter that could never move.
    assert "checksum_mismatches" not in tier.stats()
