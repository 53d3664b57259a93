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
    kernel = (KERNEL_DIR / "paged_attention.cuh").read_text()  # where kMinBlocks is: inlined, edited
    heavy = source.replace(
        '#include "paged_attention.cuh"',
        kernel.replace("constexpr int kMinBlocks = 3;", "constexpr int kMinBlocks = 1;"),
    )
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
    if source.stem in ("paged_attention", "decode_variants", "append_kv"):
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


# ------------------------------------------------------------------------------------ decode variants
# csrc/decode_variants.cu: compile-time variants of the attention kernel (csrc/paged_attention.cuh).
# Every arch family NVRTC can target that kvcore's kernels support (mma.sync m16n8k16 and cp.async need
# sm_80): Ampere, Ada, Hopper, Blackwell (datacenter and consumer).
ARCH_FAMILIES = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
# Blocks per SM each variant is built to reach on an H100/H200 (the 3-stage ring fits 2).
VARIANT_MIN_BLOCKS = {"wide": 3, "pipelined": 3, "pipelined3": 2, "pipelined_wide": 3}


def variant_problems(name: str, regs: int, spill: int, static_smem: int, min_blocks: int) -> list[str]:
    """Why a variant kernel misses its budget: registers, spills, or shared memory (static + dynamic)."""
    from kvcore.kernels.gpu import attention_kernel

    rest = name.removeprefix("paged_attention_")
    variant = next(
        v for v in sorted(_nvrtc.DECODE_VARIANTS, key=len, reverse=True) if rest.startswith(v + "_")
    )
    act, cache, dim = rest[len(variant) + 1 :].split("_")
    family, kernel, dynamic = attention_kernel(cache, act, int(dim.removeprefix("d")), 16, variant=variant)
    problems = []
    if (family, kernel) != ("decode_variants", name):
        problems.append(f"the launcher takes {kernel} for it")
    if regs > MAX_ATTENTION_REGISTERS or spill:
        problems.append(f"{regs} registers, {spill} B spilled")
    if min_blocks * (static_smem + dynamic + 1024) > SM90_SMEM_PER_SM:
        problems.append(
            f"{static_smem} + {dynamic} B of shared memory: fewer than {min_blocks} blocks per SM"
        )
    return problems


def test_every_variant_fits_its_budget() -> None:
    """Each variant kernel: <= 168 registers, no spill, and its blocks per SM in shared memory."""
    res = compiled(KERNEL_DIR / "decode_variants.cu")
    assert res.ok, res.log
    regs = {fn: (r, spill) for fn, r, spill in _nvrtc.register_report(res.log)}
    smem = _nvrtc.smem_report(res.log)
    names = _nvrtc.KERNEL_NAMES["decode_variants"]
    assert len(names) == 40 and set(names) <= set(regs)
    over = {}
    for n in names:
        variant = next(v for v in VARIANT_MIN_BLOCKS if n.startswith(f"paged_attention_{v}_"))
        variant = max((v for v in VARIANT_MIN_BLOCKS if n.startswith(f"paged_attention_{v}_")), key=len)
        problems = variant_problems(n, *regs[n], smem[n], VARIANT_MIN_BLOCKS[variant])
        if problems:
            over[n] = problems
    assert not over, over
    # the pipelined kernels keep nothing static (their shared memory is the dynamic PipeSmem)
    assert all(smem[n] == 0 for n in names if "_pipelined" in n), smem


def test_the_variant_budget_can_fail() -> None:
    """The same check flags a 3-stage ring asked for 3 blocks per SM, a spill and too many registers."""
    name = "paged_attention_pipelined3_bf16_bf16_d128"
    assert variant_problems(name, 128, 0, 0, 2) == []
    assert "fewer than 3 blocks per SM" in variant_problems(name, 128, 0, 0, 3)[0]
    assert variant_problems(name, 168, 8, 0, 2) == ["168 registers, 8 B spilled"]
    assert variant_problems(name, 176, 0, 0, 2) == ["176 registers, 0 B spilled"]


def _one_kernel_per_variant() -> bytes:
    """decode_variants.cu with one entry point per variant (both head dims, 16- and 8-bit caches)."""
    source = (KERNEL_DIR / "decode_variants.cu").read_text()
    head = source[: source.index("KV_VARIANT_8BIT(wide, 2, 0)")]
    picks = (  # (name, act, cache tag, head_dim, kSub, kStages)
        ("wide_bf16_int8_d128", "__nv_bfloat16", "kv::CacheI8", 128, 2, 0),
        ("pipelined_bf16_bf16_d128", "__nv_bfloat16", "kv::CacheBF16", 128, 1, 2),
        ("pipelined3_fp16_fp8_d64", "__half", "kv::CacheFP8", 64, 1, 3),
        ("pipelined_wide_bf16_fp8_d128", "__nv_bfloat16", "kv::CacheFP8", 128, 2, 2),
    )
    lines = [
        f"KV_ATTENTION_VARIANT(paged_attention_{n}, {a}, {c}, {d}, {sub}, {st})"
        for n, a, c, d, sub, st in picks
    ]
    return (head + "\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("arch", ARCH_FAMILIES)
def test_the_variants_compile_for_every_arch_family(arch: str) -> None:
    """cp.async is sm_80+: every family compiles each variant without warnings or spills, and emits
    LDGSTS for the ring where the hardware has it (the helpers' plain fallback is below sm_80 only)."""
    res = _nvrtc.compile_cubin(
        _one_kernel_per_variant(), "decode_variants.cu", arch, _nvrtc.include_dirs(KERNEL_DIR), verbose=True
    )
    assert res.ok, res.log
    names = [
        f"paged_attention_{n}"
        for n in (
            "wide_bf16_int8_d128",
            "pipelined_bf16_bf16_d128",
            "pipelined3_fp16_fp8_d64",
            "pipelined_wide_bf16_fp8_d128",
        )
    ]
    assert _nvrtc.missing_kernels(res.cubin, names) == []
    report = _nvrtc.register_report(res.log)
    assert {fn for fn, _, _ in report} == set(names)
    assert all(regs <= MAX_ATTENTION_REGISTERS for _, regs, _ in report), report
    # No spill, but for e4m3 before sm_89 (no conversion instruction: emulated) in 32-key steps through
    # a ring, which spills a few bytes there (12 B on sm_80); the sm_90 budget above has no exception.
    emulated = arch in ("sm_80", "sm_86")
    assert all(
        spill == 0 or (emulated and "wide" in fn and "fp8" in fn and spill <= 64) for fn, _, spill in report
    ), report


def test_the_pipeline_smem_formula_is_sizeof_pipesmem() -> None:
    """kvcore.kernels._nvrtc.pipeline_smem_bytes (the launcher's dynamic shared memory) = sizeof(PipeSmem)."""
    lines = ['#include "paged_attention.cuh"']
    tags = {"fp16": "kv::CacheF16", "bf16": "kv::CacheBF16", "fp8": "kv::CacheFP8", "int8": "kv::CacheI8"}
    count = 0
    for v in _nvrtc.DECODE_VARIANTS.values():
        for cache in v.caches:
            for d in _nvrtc.HEAD_DIMS:
                want = _nvrtc.pipeline_smem_bytes(cache, d, v.name)
                if v.stages == 0:
                    assert want == 0
                    continue
                t = f"kv::PipeSmem<{tags[cache]}, {d}, {v.sub_steps}, {v.stages}>"
                lines.append(f'static_assert(sizeof({t}) == {want}, "{v.name} {cache} d{d}");')
                count += 1
    assert count == 20  # pipelined, pipelined3: 4 caches x 2 head dims; pipelined_wide: 2 x 2
    res = _nvrtc.compile_cubin("\n".join(lines).encode(), "smem.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR))
    assert res.ok, res.log
    wrong = "\n".join(
        [*lines, 'static_assert(sizeof(kv::PipeSmem<kv::CacheBF16, 128, 1, 2>) == 70145, "x");']
    )
    res = _nvrtc.compile_cubin(wrong.encode(), "smem.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR))
    assert not res.ok and "static assertion failed" in res.log  # the check can fail


def test_the_default_kernel_keeps_its_code() -> None:
    """The variants live in their own family: the default decode kernel is still the one-page loop of 336
    SASS instructions at bf16 head_dim 128 (same registers), whatever the variants compile to."""
    res = compiled(KERNEL_DIR / "paged_attention.cu")
    regs = {fn: r for fn, r, _ in _nvrtc.register_report(res.log)}
    assert regs["paged_attention_bf16_bf16_d128"] == 168
    assert not set(_nvrtc.KERNEL_NAMES["decode_variants"]) & set(_nvrtc.KERNEL_NAMES["paged_attention"])
    assert b"LDGSTS" not in res.cubin and b"kv_dynamic_smem" not in res.cubin


def test_the_launcher_takes_a_variant_only_where_it_has_kernels() -> None:
    from kvcore.kernels.gpu import attention_kernel

    assert attention_kernel("bf16", "bf16", 128, 16) == (
        "paged_attention",
        "paged_attention_bf16_bf16_d128",
        0,
    )
    pipelined = attention_kernel("bf16", "bf16", 128, 16, variant="pipelined")
    assert pipelined == ("decode_variants", "paged_attention_pipelined_bf16_bf16_d128", 70144)
    assert attention_kernel("fp8", "fp16", 64, 32, variant="wide")[1] == "paged_attention_wide_fp16_fp8_d64"
    # the default kernel: 16-bit caches for the 8-bit-only variants, pages under 16 keys, bounded calls
    assert attention_kernel("bf16", "bf16", 128, 16, variant="wide")[1] == "paged_attention_bf16_bf16_d128"
    assert attention_kernel("fp8", "bf16", 128, 8, variant="pipelined")[1] == "paged_attention_bf16_fp8_d128"
    prefill = attention_kernel("bf16", "bf16", 128, 16, variant="pipelined", decode=False)
    assert prefill == ("paged_attention", "paged_attention_bf16_bf16_d128", 0)
    bounded = attention_kernel("int8", "bf16", 128, 16, variant="pipelined", bounded=True)
    assert bounded == ("paged_attention", "paged_attention_bounded_bf16_int8_d128", 0)
    # every name it can return is compiled (CI checks KERNEL_NAMES against the cubins)
    for v in _nvrtc.DECODE_VARIANTS:
        for cache in _nvrtc.CACHE_DTYPES:
            for act in _nvrtc.ACTIVATIONS:
                if not _nvrtc.activation_for(act, cache):
                    continue
                for page_size in (8, 16, 64):
                    family, name, _ = attention_kernel(cache, act, 128, page_size, variant=v)
                    assert name in _nvrtc.KERNEL_NAMES[family]


def test_plans_carry_a_checked_variant() -> None:
    import numpy as np

    from kvcore.exceptions import InvalidArgumentError, InvalidDTypeError, KVCoreError
    from kvcore.kernels import plan_attention
    from kvcore.kernels.plan import DECODE_VARIANTS

    pt = (np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([5], np.int32))
    kw = {"page_size": 16, "num_qo_heads": 4, "num_kv_heads": 1}
    assert plan_attention(pt, [0, 1], **kw).variant == "default"
    for v in DECODE_VARIANTS:
        plan = plan_attention(pt, [0, 1], variant=v, **kw)
        assert plan.variant == v and plan.items.tolist() == plan_attention(pt, [0, 1], **kw).items.tolist()
    with pytest.raises(InvalidArgumentError, match="pipelined"):
        plan_attention(pt, [0, 1], variant="pipelined4", **kw)
    with pytest.raises(InvalidDTypeError):
        plan_attention(pt, [0, 1], variant=2, **kw)  # type: ignore[arg-type]
    assert issubclass(InvalidArgumentError, KVCoreError)
