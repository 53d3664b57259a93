"""kvcore.dtypes, the one precision table: its invariants, and pool, sizing and kernels agreeing with it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcore import dtypes as table
from kvcore.exceptions import ConfigError
from kvcore.kernels import _nvrtc
from kvcore.pool import dtypes as pool
from kvcore.sizing import dtypes as sizing

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "python" / "kvcore" / "kernels" / "csrc"

# Every spelling the table knows, in the forms configs and command lines use.
SPELLINGS = sorted({*table.PRECISIONS, *table.ALIASES})
VARIANTS = [v for s in SPELLINGS for v in (s, s.upper(), f" {s}\t")]


def _message(normalize: Callable[[str], str], name: str) -> str:
    with pytest.raises(ConfigError) as err:
        normalize(name)
    return str(err.value)


# ------------------------------------------------------------------------------------ the table


def test_table_invariants() -> None:
    for name, p in table.PRECISIONS.items():
        assert p.name == name == name.strip().lower()
        assert p.bits > 0 and (p.kv or p.weight)
        assert (p.qmax == 1.0) != p.quantized and p.qmax > 0
        off_pool = (p.storage, p.cuda_type, p.cuda_tag) == (None, None, None)
        on_pool = None not in (p.storage, p.cuda_type, p.cuda_tag)
        assert (on_pool, off_pool) == ((True, False) if name in table.POOL_DTYPES else (False, True))
    for alias, name in table.ALIASES.items():
        assert alias == alias.strip().lower() and alias not in table.PRECISIONS and name in table.PRECISIONS
    assert set(table.POOL_DTYPES) <= set(table.KV_DTYPES) <= set(table.WEIGHT_DTYPES) == set(table.PRECISIONS)
    assert table.KV_DTYPES == ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
    assert table.WEIGHT_DTYPES == (*table.KV_DTYPES, "fp4")


def test_int4_is_a_sized_quantized_precision_the_pool_refuses() -> None:
    p = table.PRECISIONS["int4"]
    assert (p.bits, p.kv, p.quantized, p.qmax) == (4, True, True, 7.0)
    assert sizing.kv_dtype_bits("int4") == 4 and sizing.is_quantized_kv_dtype("int4")
    assert not table.is_pool_dtype("int4")
    # The very error of an unknown name, and the list of what the pool stores is unchanged.
    for name in ("int4", "INT4", "fp32", "float"):
        assert _message(pool.normalize_kv_dtype, name) == (
            f"kv_dtype: the KV pool stores fp16, bf16, fp8, int8 (fp8 = e4m3), not {name!r}"
        )
    assert _message(pool.normalize_kv_dtype, "int4") == _message(pool.normalize_kv_dtype, "nonsense").replace(
        "'nonsense'", "'int4'"
    )


def test_canonical_of_unknown_names_is_none() -> None:
    for name in ("fp8_e5m2", "e5m2", "int2", "", "bf 16"):
        assert table.canonical(name) is None


# ------------------------------------------------------------------------------------ pool and sizing


@pytest.mark.parametrize("name", table.POOL_DTYPES)
def test_pool_and_sizing_agree_on_every_pool_dtype(name: str) -> None:
    p = table.PRECISIONS[name]
    assert pool.normalize_kv_dtype(name) == sizing.normalize_kv_dtype(name) == name
    assert sizing.kv_dtype_bits(name) == pool.storage_dtype(name).itemsize * 8 == p.bits
    assert pool.storage_dtype(name) == np.dtype(p.storage)
    assert pool.encode(np.zeros(3, np.float32), name).dtype == pool.storage_dtype(name)
    assert pool.is_quantized(name) == sizing.is_quantized_kv_dtype(name) == p.quantized
    assert pool.qmax(name) == p.qmax
    assert pool.KV_DTYPES == table.POOL_DTYPES
    assert (pool.FP8_E4M3_MAX, pool.INT8_MAX) == (448.0, 127.0)
    assert sizing.SCALE_BYTES == table.SCALE_BYTES == np.dtype(np.float32).itemsize


@pytest.mark.parametrize("spelling", VARIANTS)
def test_every_spelling_normalizes_the_same_everywhere(spelling: str) -> None:
    name = table.canonical(spelling)
    assert name is not None
    p = table.PRECISIONS[name]
    checks = [
        (pool.normalize_kv_dtype, table.is_pool_dtype(name)),
        (sizing.normalize_kv_dtype, p.kv),
        (sizing.normalize_weight_dtype, p.weight),
    ]
    for normalize, accepted in checks:
        if accepted:
            assert normalize(spelling) == name
        else:
            with pytest.raises(ConfigError, match=re.escape(repr(spelling))):
                normalize(spelling)
    if p.kv:
        assert sizing.kv_dtype_bits(spelling) == p.bits
    if p.weight:
        assert sizing.weight_dtype_bits(spelling) == p.bits


def test_sizing_errors_list_the_table() -> None:
    assert _message(sizing.normalize_kv_dtype, "fp4") == (
        "kv_dtype: unknown precision 'fp4'; expected one of fp32, fp16, bf16, fp8, int8, int4"
    )
    assert _message(sizing.normalize_weight_dtype, "e5m2") == (
        "weight_dtype: unknown precision 'e5m2'; expected one of fp32, fp16, bf16, fp8, int8, int4, fp4"
    )


# ------------------------------------------------------------------------------------ kernels


def test_kernel_cache_tags_and_types_match_the_table() -> None:
    assert _nvrtc.CACHE_DTYPES == table.POOL_DTYPES
    common = (KERNEL_DIR / "common.cuh").read_text()
    tags = dict(re.findall(r"struct (\w+) \{\s*typedef ([\w ]+?) storage;", common))
    for name in table.POOL_DTYPES:
        p = table.PRECISIONS[name]
        assert p.cuda_tag is not None and p.cuda_tag.startswith("kv::")
        assert tags[p.cuda_tag.removeprefix("kv::")] == p.cuda_type


def test_kernel_instantiations_use_the_table_types() -> None:
    append = (KERNEL_DIR / "append_kv.cu").read_text()
    seen = set()
    for kernel, act, tag in re.findall(r"^KV_APPEND\((\w+), ([\w ]+), ([\w:]+)\)$", append, re.M):
        a, c = kernel.removeprefix("append_kv_").split("_")
        assert (act, tag) == (table.PRECISIONS[a].cuda_type, table.PRECISIONS[c].cuda_tag)
        seen.add(kernel)
    assert seen == set(_nvrtc.KERNEL_NAMES["append_kv"])
    attention = (KERNEL_DIR / "paged_attention.cu").read_text()
    rows = re.findall(r"^KV_ATTENTION_ALL_DIMS\((\w+), ([\w ]+), (\w+), ([\w:]+)\)$", attention, re.M)
    for a, act, c, tag in rows:
        assert (act, tag) == (table.PRECISIONS[a].cuda_type, table.PRECISIONS[c].cuda_tag)
    want = {(a, c) for c in _nvrtc.CACHE_DTYPES for a in _nvrtc.ACTIVATIONS if _nvrtc.activation_for(a, c)}
    assert {(a, c) for a, _, c, _ in rows} == want


def test_nvrtc_module_loads_by_path_without_numpy_or_kvcore() -> None:
    # What tools/check_cuda_kernels.py does in CI: the table comes along by path, nothing else.
    code = (
        "import json, sys\n"
        "sys.modules['numpy'] = sys.modules['kvcore'] = None\n"
        f"sys.path.insert(0, {str(REPO / 'tools')!r})\n"
        "import check_cuda_kernels\n"
        "nv = check_cuda_kernels.load_nvrtc_module()\n"
        "print(json.dumps([nv.CACHE_DTYPES, nv.KERNEL_NAMES]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    cache, names = json.loads(out)
    assert tuple(cache) == _nvrtc.CACHE_DTYPES
    assert {k: tuple(v) for k, v in names.items()} == _nvrtc.KERNEL_NAMES
