"""KVPool and its precisions: layout, byte sizes (sizing), scales, DLPack, bit-exact conversions."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError
from kvcore.pool import KVPool, Layout, dtypes, get_backend
from kvcore.pool._cupy import gpu_available
from kvcore.sizing import kv_cache_bytes

# ------------------------------------------------------------------------------------ bf16


def test_bf16_round_trip_of_every_finite_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = dtypes.bf16_bits_to_float(bits)
    finite = np.isfinite(values)
    assert np.array_equal(dtypes.float_to_bf16_bits(values[finite]), bits[finite])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 0x3F80),
        (1.0 + 2.0**-8, 0x3F80),  # halfway between 1.0 and 1+2^-7: ties to even (mantissa ...0)
        (1.0 + 3 * 2.0**-8, 0x3F82),  # halfway between 1+2^-7 (odd) and 1+2^-6: to even, upward
        (1.0 + 2.0**-8 + 2.0**-20, 0x3F81),  # just above the tie: upward
        (-2.5, 0xC020),
        (3.4e38, 0x7F80),  # rounds past the largest finite bf16: infinity, like __float2bfloat16_rn
        (float("inf"), 0x7F80),
    ],
)
def test_bf16_rounding_cases(value: float, expected: int) -> None:
    assert int(dtypes.float_to_bf16_bits(np.float32(value))) == expected


def test_bf16_nan_stays_nan() -> None:
    assert np.isnan(
        dtypes.bf16_bits_to_float(dtypes.float_to_bf16_bits(np.array([np.nan], np.float32)))
    ).all()


# ------------------------------------------------------------------------------------ fp8 e4m3


def test_e4m3_table_known_values() -> None:
    t = dtypes.E4M3_TABLE
    assert t[0x00] == 0 and t[0x01] == 2.0**-9 and t[0x08] == 2.0**-6 and t[0x38] == 1.0
    assert t[0x7E] == 448 and t[0xFE] == -448 and np.isnan(t[0x7F]) and np.isnan(t[0xFF])


def test_e4m3_round_trip_of_every_pattern() -> None:
    bits = np.arange(256, dtype=np.uint8)
    back = dtypes.float_to_e4m3_bits(dtypes.e4m3_bits_to_float(bits))
    finite = ~np.isnan(dtypes.E4M3_TABLE)
    assert np.array_equal(back[finite], bits[finite])
    assert (back[~finite] == 0x7F).all()  # NaN has one canonical encoding


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0625, 0x38),  # halfway between 1.0 (even) and 1.125: to 1.0
        (1.1875, 0x3A),  # halfway between 1.125 (odd) and 1.25: to 1.25
        (464.0, 0x7E),  # halfway between 448 and 480 (not finite in e4m3fn): to 448
        (449.0, 0x7E),
        (1e9, 0x7E),  # saturates (SATFINITE)
        (float("inf"), 0x7E),
        (float("-inf"), 0xFE),
        (2.0**-10, 0x00),  # half the smallest subnormal: ties to even zero
        (1.5 * 2.0**-9, 0x02),  # halfway between subnormals 1 and 2: to 2
        (-0.0, 0x80),
        (float("nan"), 0x7F),
    ],
)
def test_e4m3_rounding_cases(value: float, expected: int) -> None:
    assert int(dtypes.float_to_e4m3_bits(np.float32(value))) == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=-500, max_value=500, width=32), min_size=1, max_size=64))
def test_e4m3_is_nearest_with_ties_to_even(xs: list[float]) -> None:
    x = np.asarray(xs, dtype=np.float32)
    got = dtypes.float_to_e4m3_bits(x)
    finite = np.flatnonzero(~np.isnan(dtypes.E4M3_TABLE))
    vals = dtypes.E4M3_TABLE[finite].astype(np.float64)
    dist = np.abs(x.astype(np.float64)[:, None] - vals[None, :])
    best = dist.min(axis=1)
    got_dist = np.abs(x.astype(np.float64) - dtypes.E4M3_TABLE[got].astype(np.float64))
    saturated = np.abs(x) > 448
    assert np.all(got_dist[~saturated] == best[~saturated])
    # On a tie between two codes the mantissa's last bit is 0 (zeros of either sign count as even).
    tie = (dist == best[:, None]).sum(axis=1) > 1
    assert np.all((got[tie & ~saturated] & 1) == 0)
    assert np.all(dtypes.E4M3_TABLE[got[saturated]] == np.sign(x[saturated]) * 448)


def test_int8_encode_rounds_and_clamps() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, 300.0, -300.0, 12.3], dtype=np.float32)
    q = dtypes.encode(x, "int8", 1.0)
    assert q.dtype == np.int8
    assert q.tolist() == [0, 2, 2, 0, 127, -127, 12]  # ties to even, symmetric clamp
    assert np.allclose(
        dtypes.decode(dtypes.encode(x * 0.1, "int8", 0.1), "int8", 0.1)[:4], x[:4] * 0.1, atol=0.05
    )


@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
def test_encode_decode_error_bound(kv_dtype: str) -> None:
    x = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    scale = float(np.abs(x).max() / dtypes.qmax(kv_dtype)) if dtypes.is_quantized(kv_dtype) else 1.0
    back = dtypes.decode(dtypes.encode(x, kv_dtype, scale), kv_dtype, scale)
    bound = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4, "int8": 0.0}[kv_dtype]
    # Relative bound from the mantissa (fp) or half a quantization step (int8).
    tol = np.abs(x) * bound + (0.5 * scale + 1e-7 if kv_dtype == "int8" else 2.0**-9 * scale)
    assert np.all(np.abs(back - x) <= tol)


def test_dtype_names() -> None:
    assert dtypes.normalize_kv_dtype("BF16") == "bf16"
    assert dtypes.normalize_kv_dtype("fp8_e4m3") == "fp8"
    for bad in ("fp8_e5m2", "int4", "fp32", 3):
        with pytest.raises(ConfigError):
            dtypes.normalize_kv_dtype(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidDTypeError):
        dtypes.decode(np.zeros(3, np.uint8), "bf16")


# ------------------------------------------------------------------------------------ KVPool


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("kv_dtype", dtypes.KV_DTYPES)
def test_pool_shape_strides_and_bytes(layout: Layout, kv_dtype: str) -> None:
    pool = KVPool(
        num_layers=3, num_pages=7, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype=kv_dtype, layout=layout
    )
    inner = (2, 16, 64) if layout == "HND" else (16, 2, 64)
    assert pool.data.shape == (3, 2, 7, *inner)
    assert pool.data.dtype == dtypes.storage_dtype(kv_dtype)
    st_ = pool.strides
    elem = pool.data.itemsize
    expected = np.array(pool.data.strides) // elem
    assert (st_.layer, st_.kv, st_.page) == tuple(expected[:3])
    assert (st_.head, st_.token) == (
        (expected[3], expected[4]) if layout == "HND" else (expected[4], expected[3])
    )
    assert expected[5] == 1
    assert pool.page_bytes == kv_cache_bytes(3, 2, 64, 16, kv_dtype=kv_dtype)
    assert pool.nbytes == pool.data.nbytes == 7 * pool.page_bytes
    assert pool.scale_bytes == (2 * 3 * 2 * 4 if kv_dtype in ("fp8", "int8") else 0)
    assert not pool.data.any()  # zeroed: unwritten slots never hold NaN patterns


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_from_memory_budget_is_the_largest_pool_that_fits(kv_dtype: str) -> None:
    kw = dict(num_layers=4, num_kv_heads=8, head_dim=128, page_size=16, kv_dtype=kv_dtype)
    page_bytes = kv_cache_bytes(4, 8, 128, 16, kv_dtype=kv_dtype)
    budget = 37 * page_bytes + 1000
    pool = KVPool.from_memory_budget(budget, **kw)  # type: ignore[arg-type]
    assert pool.nbytes + pool.scale_bytes <= budget < (pool.num_pages + 1) * page_bytes + pool.scale_bytes
    assert pool.num_pages == 37
    with pytest.raises(ConfigError):
        KVPool.from_memory_budget(page_bytes, **kw)  # type: ignore[arg-type]


def test_pool_argument_errors() -> None:
    base = dict(num_layers=1, num_pages=4, num_kv_heads=1, head_dim=8)
    with pytest.raises(InvalidArgumentError):
        KVPool(**{**base, "num_pages": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        KVPool(**{**base, "head_dim": 0})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KVPool(**base, kv_dtype="fp8_e5m2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KVPool(**base, layout="NDH")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KVPool(**base, backend="torch")  # type: ignore[arg-type]
    pool = KVPool(**base)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        pool.k(1)
    with pytest.raises(InvalidArgumentError):
        pool.set_scales(0, 1.0, 1.0)  # bf16 pools have no scales


@pytest.mark.skipif(gpu_available(), reason="a device is present")
def test_backends_without_a_device() -> None:
    assert get_backend("auto").name == "numpy"
    with pytest.raises(ConfigError):
        KVPool(num_layers=1, num_pages=2, num_kv_heads=1, head_dim=8, backend="cupy")


def test_dlpack_shares_memory() -> None:
    pool = KVPool(num_layers=2, num_pages=3, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype="fp16")
    k, v = pool.dlpack(1)
    tk = np.from_dlpack(k)
    tk[2, 1, 3, :] = 7.0
    assert (pool.data[1, 0, 2, 1, 3] == 7.0).all()
    assert np.shares_memory(np.from_dlpack(v), pool.data)
    assert tk.shape == (3, *pool.page_shape)


def test_scales_set_and_calibrate() -> None:
    pool = KVPool(num_layers=2, num_pages=3, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype="int8")
    pool.set_scales(1, [0.5, 0.25], 2.0)
    assert pool.k_scale[1].tolist() == [0.5, 0.25] and pool.v_scale[1].tolist() == [2.0, 2.0]
    assert pool.k_scale[0].tolist() == [1.0, 1.0]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidArgumentError):
            pool.set_scales(0, bad, 1.0)
    with pytest.raises(InvalidDTypeError):
        pool.set_scales(0, [1.0, 2.0, 3.0], 1.0)
    assert pool.k_scale[0].tolist() == [1.0, 1.0]  # a failed call changes nothing
    k = np.zeros((5, 2, 8), np.float32)
    k[:, 0] = 12.7
    pool.calibrate_scales(0, k, -k)
    assert np.allclose(pool.k_scale[0], [0.1, 1.0]) and np.allclose(pool.v_scale[0], [0.1, 1.0])


def test_host_buffer_read_slots_and_copy() -> None:
    pool = KVPool(
        num_layers=2, num_pages=5, num_kv_heads=2, head_dim=8, page_size=4, kv_dtype="fp16", layout="NHD"
    )
    assert pool.host_buffer(3).shape == (3, 2, 2, 4, 2, 8)
    pool.data[1, 0, 3, 2] = 1.5  # page 3, offset 2, every head
    k, v = pool.read_slots(1, np.array([3 * 4 + 2, 0]))
    assert (k[0] == 1.5).all() and (k[1] == 0).all() and (v == 0).all()
    copy = pool.to("numpy")
    assert (
        copy is not pool
        and np.array_equal(copy.data, pool.data)
        and not np.shares_memory(copy.data, pool.data)
    )


def test_importing_pool_and_kernels_never_imports_cupy() -> None:
    code = "import sys, kvcore, kvcore.pool, kvcore.kernels; sys.exit('cupy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_sub_packages_load_on_first_use_after_a_plain_import() -> None:
    # `import kvcore` then `kvcore.tiers.HostTier` (docs/api.md's examples) works, and the plain import
    # loads none of the sub-packages' optional dependencies.
    code = (
        "import sys, kvcore\n"
        "heavy = {'matplotlib', 'prometheus_client', 'cupy', 'kvcore.tiers', 'kvcore.metrics'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "assert kvcore.tiers.HostTier and kvcore.metrics.serve and kvcore.scheduler.Scheduler\n"
        "assert kvcore.sizing and kvcore.kernels and kvcore.pool and kvcore.replay and kvcore.tiny\n"
        "try:\n"
        "    kvcore.no_such_thing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
