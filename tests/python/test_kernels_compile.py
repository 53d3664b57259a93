"""CI compile check as a test: every kvcore/kernels/csrc/*.cu compiles to an sm_90 cubin with NVRTC (no GPU).

The same options and kernel names as the runtime (kvcore.kernels._nvrtc), with -Werror=all-warnings.
Skipped when ``cuda.bindings`` (and the NVRTC wheel) is not installed.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from kvcore.kernels import _nvrtc

KERNEL_DIR = Path(__file__).resolve().parents[2] / "python" / "kvcore" / "kernels" / "csrc"
SOURCES = sorted(KERNEL_DIR.glob("*.cu"))

# ptxas registers of the plain attention kernels with NVRTC 13.5 for sm_90, measured before the
# bounded-cache variants existed: those are separate instantiations (kBounded = false compiles to the
# same machine code), so the plain kernels must never need more. Spills are 0 everywhere.
PLAIN_REGISTERS_NVRTC_13_5 = {
    **{f"paged_attention_{a}_{a}_d{d}": r for a in ("fp16", "bf16") for d, r in ((64, 124), (128, 193))},
    **{f"paged_attention_{a}_fp8_d{d}": r for a in ("fp16", "bf16") for d, r in ((64, 96), (128, 162))},
    **{f"paged_attention_{a}_int8_d{d}": r for a in ("fp16", "bf16") for d, r in ((64, 96), (128, 168))},
    "attention_merge_fp16": 32,
    "attention_merge_bf16": 32,
}


@functools.cache
def compiled(source: Path) -> _nvrtc.CompileResult:
    return _nvrtc.compile_cubin(
        source.read_bytes(), source.name, "sm_90", _nvrtc.include_dirs(KERNEL_DIR), verbose=True
    )


def test_every_family_has_a_source() -> None:
    assert {p.stem for p in SOURCES} == set(_nvrtc.KERNEL_NAMES)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_compiles_for_sm90_without_warnings(source: Path) -> None:
    res = compiled(source)
    assert res.ok, res.log
    assert res.cubin[:4] == b"\x7fELF"
    assert _nvrtc.missing_kernels(res.cubin, _nvrtc.KERNEL_NAMES[source.stem]) == []
    report = _nvrtc.register_report(res.log)
    assert {fn for fn, _, _ in report} >= set(_nvrtc.KERNEL_NAMES[source.stem])
    assert all(spill == 0 for _, _, spill in report), report


def test_every_bounded_cache_instantiation_compiles() -> None:
    """A bounded-cache attention kernel and a page_scores kernel per plain one, and an LSE merge per merge."""
    names = _nvrtc.KERNEL_NAMES["paged_attention"]
    plain = [n for n in names if n.startswith("paged_attention_") and "bounded" not in n]
    assert len(plain) == 12
    bounded = [n.replace("paged_attention_", "paged_attention_bounded_") for n in plain]
    scores = [n.replace("paged_attention_", "page_scores_") for n in plain]
    merges = ["attention_merge_lse_fp16", "attention_merge_lse_bf16"]
    assert set(bounded + scores + merges) <= set(names)
    res = compiled(KERNEL_DIR / "paged_attention.cu")
    assert res.ok, res.log
    assert _nvrtc.missing_kernels(res.cubin, bounded + scores + merges) == []
    report = {fn: (regs, spill) for fn, regs, spill in _nvrtc.register_report(res.log)}
    assert all(report[n][1] == 0 for n in bounded + scores + merges), report


def test_the_plain_attention_kernels_keep_their_registers() -> None:
    if _nvrtc.nvrtc_version() != (13, 5):
        pytest.skip("register counts were measured with NVRTC 13.5")
    res = compiled(KERNEL_DIR / "paged_attention.cu")
    report = {fn: regs for fn, regs, _ in _nvrtc.register_report(res.log)}
    grown = {n: (report[n], r) for n, r in PLAIN_REGISTERS_NVRTC_13_5.items() if report[n] > r}
    assert not grown, f"plain kernels need more registers (now, before): {grown}"


def test_a_warning_fails_the_build(tmp_path: Path) -> None:
    bad = b'#include "common.cuh"\nextern "C" __global__ void k(int* p) { int unused = 3; p[0] = 1; }\n'
    res = _nvrtc.compile_cubin(bad, "bad.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR))
    assert not res.ok and "unused" in res.log
