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

# The attention kernels are built for 3 blocks of 128 threads per SM (kMinBlocks in paged_attention.cu): at
# most 65536 / (3 * 128) = 170, so 168 registers (ptxas allocates in 8s), no spill, and the static shared
# memory of 3 blocks within the 228 KiB of an H100/H200 SM (1 KiB of it reserved per block).
MAX_ATTENTION_REGISTERS = 168
SM90_SMEM_PER_SM = 228 * 1024
MIN_BLOCKS_PER_SM = 3


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


def test_attention_fits_three_blocks_per_sm_without_spills() -> None:
    """bf16 head_dim 128 decode (Llama-3.1-8B) and every other attention kernel: <= 168 registers, 0 spill."""
    res = compiled(KERNEL_DIR / "paged_attention.cu")
    assert res.ok, res.log
    regs = {fn: (r, spill) for fn, r, spill in _nvrtc.register_report(res.log)}
    smem = _nvrtc.smem_report(res.log)
    attention = [n for n in _nvrtc.KERNEL_NAMES["paged_attention"] if n.startswith("paged_attention_")]
    assert "paged_attention_bf16_bf16_d128" in attention
    over = {n: regs[n] for n in attention if regs[n][0] > MAX_ATTENTION_REGISTERS or regs[n][1]}
    assert not over, f"(registers, spilled bytes) over {MAX_ATTENTION_REGISTERS} / 0: {over}"
    too_big = {n: smem[n] for n in attention if MIN_BLOCKS_PER_SM * (smem[n] + 1024) > SM90_SMEM_PER_SM}
    assert not too_big, f"static shared memory of 3 blocks exceeds an SM: {too_big}"


def test_the_register_budget_test_can_fail() -> None:
    """The same parse flags a kernel that needs more: head_dim 256 built without the 3-blocks bound.

    (Its 73 KiB of static shared memory is refused after ptxas has reported its registers: the log is
    what is read, whatever the result.)
    """
    source = (KERNEL_DIR / "paged_attention.cu").read_text()
    heavy = source.replace("constexpr int kMinBlocks = 3;", "constexpr int kMinBlocks = 1;")
    heavy += "\nKV_ATTENTION(paged_attention_bf16_bf16_d256, __nv_bfloat16, kv::CacheBF16, 256)\n"
    assert "kMinBlocks = 1;" in heavy
    res = _nvrtc.compile_cubin(
        heavy.encode(), "paged_attention.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR), verbose=True
    )
    regs = {fn: r for fn, r, _ in _nvrtc.register_report(res.log)}
    assert regs["paged_attention_bf16_bf16_d256"] > MAX_ATTENTION_REGISTERS, res.log


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_device_checks_build_compiles(source: Path) -> None:
    """-DKV_DEVICE_CHECKS (KVCORE_DEVICE_CHECKS=1): every family compiles without warnings, every entry
    point is there, and the families that read device page tables or slots hold the host's globals."""
    res = _nvrtc.compile_cubin(
        source.read_bytes(), source.name, "sm_90", _nvrtc.include_dirs(KERNEL_DIR), device_checks=True
    )
    assert res.ok, res.log
    assert _nvrtc.missing_kernels(res.cubin, _nvrtc.KERNEL_NAMES[source.stem]) == []
    if source.stem in ("paged_attention", "append_kv"):
        assert b"kv_check_limit" in res.cubin and b"kv_check_error" in res.cubin
    plain = compiled(source)
    assert b"kv_check_limit" not in plain.cubin  # the default build has no checks


def test_device_checks_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcore.kernels import loader

    for value, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("KVCORE_DEVICE_CHECKS", value)
        assert loader.device_checks() is on
    monkeypatch.delenv("KVCORE_DEVICE_CHECKS")
    assert loader.device_checks() is False
    assert "-DKV_DEVICE_CHECKS" in _nvrtc.nvrtc_options("sm_90", [], device_checks=True)
    assert "-DKV_DEVICE_CHECKS" not in _nvrtc.nvrtc_options("sm_90", [])


def test_a_warning_fails_the_build(tmp_path: Path) -> None:
    bad = b'#include "common.cuh"\nextern "C" __global__ void k(int* p) { int unused = 3; p[0] = 1; }\n'
    res = _nvrtc.compile_cubin(bad, "bad.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR))
    assert not res.ok and "unused" in res.log


def _byte_perm(x: int, y: int, selector: int) -> int:
    """CUDA's __byte_perm (PRMT, default mode): result byte i = byte (selector nibble i & 7) of y:x."""
    pool = (y << 32 | x).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(selector >> (4 * i)) & 7] for i in range(4)), "little")


def test_the_int8_widen_tricks_of_common_cuh_are_exact_for_every_pair() -> None:
    """widen2<CacheI8, __half> and <CacheI8, __nv_bfloat16> (no I2F), emulated bit for bit in NumPy."""
    import numpy as np

    for lo in range(-128, 128):
        for hi in (-128, -127, -1, 0, 1, 126, 127, lo):
            pair = (lo & 0xFF) | (hi & 0xFF) << 8
            halves = _byte_perm(pair ^ 0x8080, 0x64646464, 0x4140)  # two fp16: 1024 + (b + 128)
            h = np.array([halves & 0xFFFF, halves >> 16], np.uint16).view(np.float16)
            assert (h - np.float16(1152)).tolist() == [lo, hi]  # __hsub2 by 0x6480 = 1152, exact
            x = pair ^ 0x8080
            f = np.array([_byte_perm(x, 0x4B000000, 0x7540), _byte_perm(x, 0x4B000000, 0x7541)], np.uint32)
            assert (f.view(np.float32) - np.float32(8388736.0)).tolist() == [lo, hi]
    source = (KERNEL_DIR / "common.cuh").read_text()  # the constants above are the header's
    constants = ("0x64646464u, 0x4140", "0x6480", "0x4B000000u, 0x7540", "0x4B000000u, 0x7541", "8388736.0f")
    assert all(c in source for c in constants)
