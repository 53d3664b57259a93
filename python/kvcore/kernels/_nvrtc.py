"""Compile kvcore's CUDA sources to cubin with NVRTC: the one definition CI and the runtime share.

Why one module: ``tools/check_cuda_kernels.py`` (CI, no GPU) and the run-time loader must compile with
exactly the same options and see exactly the same kernel names, or CI would prove something other than
what runs. This file imports only the standard library, ``cuda.bindings`` (lazily) and the precision
table ``kvcore/dtypes.py`` (stdlib only too), so the CI tool loads it by path without the native extension
or NumPy; loaded that way, it loads the table by path as well.

Why cubin and not PTX: PTX from NVRTC 13.5 is ISA 9.5, which a CUDA 13.0 driver (580) refuses to JIT
(``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``); a cubin for the device's exact SM loads on any driver of the
13.x family (minor-version compatibility). So both CI and the runtime ask NVRTC for ``sm_XX`` cubins.

Headers: NVRTC does not find ``cuda_fp16.h`` & co. by itself. They come from the ``nvidia-cuda-runtime``
wheel (found by ``cuda.pathfinder``), or else from the copy NVRTC >= 13.3 carries
(``nvrtcInstallBundledHeaders``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any


def _load_table_by_path() -> ModuleType:
    """``kvcore/dtypes.py`` without importing the kvcore package (which needs the native extension)."""
    path = Path(__file__).resolve().parents[1] / "dtypes.py"
    spec = importlib.util.spec_from_file_location("kvcore_dtypes_standalone", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is created
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING or __package__ == "kvcore.kernels":
    from kvcore import dtypes as _table
else:  # loaded by path (tools/check_cuda_kernels.py)
    _table = _load_table_by_path()

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_KINDS",
    "CACHE_DTYPES",
    "DECODE_VARIANTS",
    "HEAD_DIMS",
    "KERNEL_NAMES",
    "CompileResult",
    "DecodeVariant",
    "compile_cubin",
    "cuda_header_dirs",
    "find_kernel_dir",
    "include_dirs",
    "missing_kernels",
    "nvrtc_options",
    "nvrtc_version",
    "pipeline_smem_bytes",
    "register_report",
    "smem_report",
]

# ------------------------------------------------------------------------------------ kernel names
# Every entry point the runtime can launch, per source file. CI checks each one is in the cubin, so a
# template instantiation the runtime needs can never be missing.

ACTIVATIONS: tuple[str, ...] = ("fp16", "bf16")  # q/k/v/out types: their cuda_type in kvcore.dtypes
CACHE_DTYPES: tuple[str, ...] = _table.POOL_DTYPES  # kernel-name suffixes; tags and types: kvcore.dtypes
HEAD_DIMS: tuple[int, ...] = (64, 128)  # head_dim values with an attention instantiation


# Attention entry points per (activation, cache, head_dim): the plain causal kernel; its bounded-cache
# twin (sliding window, null pages, row log-sum-exps), compiled apart so the plain one keeps its code;
# and the page_scores kernel of calls that accumulate page scores.
ATTENTION_KINDS: tuple[str, ...] = ("paged_attention", "paged_attention_bounded", "page_scores")


def activation_for(act: str, cache: str) -> bool:
    """Whether (activation, cache) has kernels: 16-bit caches take their own type, 8-bit ones either."""
    return _table.PRECISIONS[cache].quantized or act == cache


@dataclass(frozen=True)
class DecodeVariant:
    """A compile-time variant of the attention kernel (``csrc/paged_attention.cuh``, "decode variants").

    The launcher takes it for plain (unbounded) decode calls on pages of >= 16 keys whose cache is in
    ``caches``, and the default kernel everywhere else (:func:`kvcore.kernels.gpu.attention_kernel`).
    """

    name: str  # what plan_attention(variant=...) takes; the kernel-name infix (none for "default")
    sub_steps: int  # 16-key sub-steps per warp step (kSub): 1, or 2 (32 keys, 8-bit caches)
    stages: int  # cp.async ring stages per warp (kStages); 0: loads straight into registers
    caches: tuple[str, ...]  # cache dtypes with kernels of this variant
    doc: str  # one line for documentation and error messages


_EIGHT_BIT: tuple[str, ...] = tuple(c for c in CACHE_DTYPES if _table.PRECISIONS[c].quantized)

# Every decode variant, the default first. Not "default": csrc/decode_variants.cu (its own family).
DECODE_VARIANTS: dict[str, DecodeVariant] = {
    v.name: v
    for v in (
        DecodeVariant("default", 1, 0, CACHE_DTYPES, "16-key steps, K/V loaded into registers"),
        DecodeVariant("wide", 2, 0, _EIGHT_BIT, "8-bit caches: 32-key steps, loaded into registers"),
        DecodeVariant("pipelined", 1, 2, CACHE_DTYPES, "16-key steps through a 2-stage cp.async ring"),
        DecodeVariant("pipelined3", 1, 3, CACHE_DTYPES, "16-key steps through a 3-stage cp.async ring"),
        DecodeVariant("pipelined_wide", 2, 2, _EIGHT_BIT, "8-bit caches: 32-key steps, 2-stage ring"),
    )
}


def pipeline_smem_bytes(cache: str, head_dim: int, variant: str) -> int:
    """Dynamic shared memory of a variant's kernel per block: ``sizeof(PipeSmem)``, 0 without a ring.

    The Q fragments (``32 * head_dim`` bytes), the warps' m and l (512), and the larger of the rings
    (warps x stages x 16-byte slots per step x 32 lanes) and the warps' O states they alias. CI checks this
    against the compiled ``sizeof`` (tests/python/test_kernels_compile.py).
    """
    v = DECODE_VARIANTS[variant]
    if v.stages == 0:
        return 0
    size = _table.PRECISIONS[cache].bits // 8
    k_loads = head_dim * size // 64  # 16-byte loads per key row per lane: D / (4 * (16 / size))
    v_words = head_dim // 8 * size // 4  # 32-bit words of V per key per lane
    slots = v.sub_steps * (2 * k_loads + 4 * max(1, v_words // 4))
    ring = 4 * v.stages * slots * 32 * 16
    o_states = 4 * 16 * (head_dim + 1) * 4
    return 32 * head_dim + 512 + max(ring, o_states)


KERNEL_NAMES: dict[str, tuple[str, ...]] = {
    "append_kv": tuple(
        f"append_kv_{a}_{c}" for c in CACHE_DTYPES for a in ACTIVATIONS if activation_for(a, c)
    ),
    "paged_attention": tuple(
        f"{kind}_{a}_{c}_d{d}"
        for kind in ATTENTION_KINDS
        for c in CACHE_DTYPES
        for a in ACTIVATIONS
        if activation_for(a, c)
        for d in HEAD_DIMS
    )
    + tuple(f"{kind}_{a}" for kind in ("attention_merge", "attention_merge_lse") for a in ACTIVATIONS),
    "page_copy": ("copy_pages", "gather_pages", "scatter_pages"),
    "decode_variants": tuple(
        f"paged_attention_{v.name}_{a}_{c}_d{d}"
        for v in DECODE_VARIANTS.values()
        if v.name != "default"
        for c in v.caches
        for a in ACTIVATIONS
        if activation_for(a, c)
        for d in HEAD_DIMS
    ),
}


# ------------------------------------------------------------------------------------ locations


def find_kernel_dir() -> Path:
    """The folder holding ``common.cuh`` and the ``*.cu`` sources: ``kvcore/kernels/csrc``, beside this file.

    One place for a source checkout, an editable install and a wheel (package data) alike.

    Raises:
        FileNotFoundError: the folder has no ``common.cuh`` (a broken install).
    """
    folder = Path(__file__).resolve().parent / "csrc"
    if not (folder / "common.cuh").is_file():
        raise FileNotFoundError(f"kvcore CUDA sources not found in {folder} (a broken install)")
    return folder


def _nvrtc() -> Any:
    from cuda.bindings import nvrtc  # the NVRTC wheel (nvidia-cuda-nvrtc) is loaded on first use

    return nvrtc


def _call(result: tuple[Any, ...]) -> Any:
    """Unwrap a ``cuda.bindings`` return tuple ``(err, *values)``, raising on an error code."""
    nvrtc = _nvrtc()
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {nvrtc.nvrtcGetErrorString(result[0])[1].decode()}")
    return result[1] if len(result) == 2 else result[1:]


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library ``cuda.bindings`` loads."""
    major, minor = _call(_nvrtc().nvrtcVersion())
    return int(major), int(minor)


def cuda_header_dirs() -> list[str]:
    """Folders holding ``cuda_fp16.h`` & co.: the runtime wheel's, else NVRTC's bundled copy.

    Raises:
        ImportError: the runtime wheel's headers are not found and ``cuda.bindings`` is missing.
    """
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:  # pathfinder missing or unable to look: fall back to the bundle
        found = None
    if found and (Path(found) / "cuda_fp16.h").is_file():
        return [str(found)]
    major, minor = nvrtc_version()
    bundle = Path(tempfile.gettempdir()) / f"kvcore-nvrtc-headers-{major}.{minor}"
    if not (bundle / "cuda_fp16.h").is_file():
        _call(_nvrtc().nvrtcInstallBundledHeaders(str(bundle).encode(), 0))
    return [str(bundle), str(bundle / "cccl")]


def include_dirs(kernel_dir: Path | None = None) -> list[str]:
    """``-I`` folders: the kernel sources, then the CUDA headers (:func:`cuda_header_dirs`)."""
    return [str(kernel_dir or find_kernel_dir()), *cuda_header_dirs()]


# ------------------------------------------------------------------------------------ compiling


def nvrtc_options(
    arch: str | None, includes: Sequence[str], *, verbose: bool = False, device_checks: bool = False
) -> list[str]:
    """THE NVRTC options of kvcore, for CI and run time alike.

    Args:
        arch: ``"sm_90"`` and the like (a cubin for exactly that SM); None leaves the architecture to
            the caller (CuPy's own NVRTC path adds ``-arch=sm_XX`` itself).
        includes: folders for ``-I`` (:func:`include_dirs`).
        verbose: add ptxas's register/spill report to the log (changes no code).
        device_checks: compile the device-side bounds checks in (``-DKV_DEVICE_CHECKS``, see
            ``csrc/common.cuh``): the debug build the loader uses when ``$KVCORE_DEVICE_CHECKS`` is set.

    No ``--use_fast_math``: the quantizing division ``x / scale`` must round like NumPy's (IEEE), so the
    pool's bytes agree across backends; the softmax calls ``ex2.approx`` explicitly instead.
    """
    opts = ["-std=c++17", "-Werror=all-warnings", "-lineinfo"]
    if arch is not None:
        opts.insert(0, f"--gpu-architecture={arch}")
    if verbose:
        opts.append("--ptxas-options=-v")
    if device_checks:
        opts.append("-DKV_DEVICE_CHECKS")
    return opts + [f"-I{d}" for d in includes]


@dataclass(frozen=True)
class CompileResult:
    """The outcome of one NVRTC compilation."""

    ok: bool  # True when NVRTC produced a cubin
    cubin: bytes  # the cubin (empty on failure)
    log: str  # NVRTC's program log (errors, warnings, ptxas report)
    seconds: float  # wall time of the compilation


def compile_cubin(
    source: bytes,
    name: str,
    arch: str,
    includes: Sequence[str],
    *,
    verbose: bool = False,
    device_checks: bool = False,
) -> CompileResult:
    """Compile one translation unit to a cubin for ``arch`` with :func:`nvrtc_options`. Needs no GPU."""
    nvrtc = _nvrtc()
    start = time.perf_counter()
    prog = _call(nvrtc.nvrtcCreateProgram(source, name.encode(), 0, [], []))
    try:
        options = nvrtc_options(arch, includes, verbose=verbose, device_checks=device_checks)
        opts = [o.encode() for o in options]
        status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        log_size = _call(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * log_size
        nvrtc.nvrtcGetProgramLog(prog, log)
        ok = status == nvrtc.nvrtcResult.NVRTC_SUCCESS
        cubin = b""
        if ok:
            cubin = b" " * _call(nvrtc.nvrtcGetCUBINSize(prog))
            nvrtc.nvrtcGetCUBIN(prog, cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    text = log.decode(errors="replace").rstrip("\x00 \n")
    return CompileResult(ok, cubin, text, time.perf_counter() - start)


def missing_kernels(cubin: bytes, names: Sequence[str]) -> list[str]:
    """The entry points of ``names`` that the cubin does not define (each has a ``.text.<name>`` section)."""
    return [n for n in names if b".text." + n.encode() + b"\x00" not in cubin]


def register_report(log: str) -> list[tuple[str, int, int]]:
    """(kernel, registers, spilled bytes) for every function in a ``--ptxas-options=-v`` log."""
    out = []
    for fn, spill, regs in re.findall(
        r"function '(\w+)'.*?(\d+) bytes spill stores.*?Used (\d+) regi", log, re.S
    ):
        out.append((fn, int(regs), int(spill)))
    return out


def smem_report(log: str) -> dict[str, int]:
    """Static shared memory bytes of every function in a ``--ptxas-options=-v`` log (0: none reported).

    Read from each function's own "Used N registers" line: a function without static shared memory (the
    pipelined variants take theirs dynamically) must not be given the next function's.
    """
    out = {}
    for fn, used in re.findall(r"function '(\w+)'.*?(Used \d+ registers[^\n]*)", log, re.S):
        m = re.search(r"(\d+) bytes smem", used)
        out[fn] = int(m.group(1)) if m else 0
    return out
