#!/usr/bin/env python3
"""Registers, spills, shared memory, blocks per SM and SASS instructions per main-loop step of the
attention kernels, the decode variants included (no GPU needed).

Compiles ``python/kvcore/kernels/csrc/paged_attention.cu`` (or ``--source FILE``: an older version from
``git show REV:...``, with the headers of that revision beside it) and ``decode_variants.cu`` (or
``--variants-source FILE``) for sm_90 with kvcore's NVRTC options, disassembles them with
``cuobjdump -sass`` and, for every loop holding tensor-core instructions, prints its static instructions
per step (one warp step: 16 keys, 32 for the "wide" variants; "/16 keys" normalizes) and the most
frequent opcodes. A kernel with two loops has the generic (page size < 16) and the one-page path; the
second is the one page-size-16 decode runs (the variants only have the one-page path).
Conditional blocks count in full (the lazy O rescale usually skips its multiplies).

Shared memory per block is the static one ptxas reports plus the dynamic one of the pipelined variants
(``_nvrtc.pipeline_smem_bytes``); blocks per SM are those of an sm_90 SM (64 K registers allocated per
warp in 8s, 228 KiB of shared memory with 1 KiB reserved per block, 2048 threads).

Needs NVIDIA's ``nvidia-cuda-cuobjdump`` wheel (``pip install nvidia-cuda-cuobjdump``) or ``cuobjdump`` on
PATH, and the NVRTC wheels of ``.[test]``.

Usage: python tools/kernel_sass.py [--source FILE] [--variants-source FILE] [--markdown] [KERNEL ...]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "python" / "kvcore" / "kernels" / "csrc"
DEFAULT = [
    "paged_attention_bf16_bf16_d128",
    "paged_attention_fp16_fp16_d128",
    "paged_attention_bf16_fp8_d128",
    "paged_attention_fp16_fp8_d128",
    "paged_attention_bf16_int8_d128",
    "paged_attention_fp16_int8_d128",
    "paged_attention_bounded_bf16_bf16_d128",
    "paged_attention_bf16_bf16_d64",
    # the decode variants at Llama-3.1-8B shapes (head_dim 128, bf16 activations)
    *(
        f"paged_attention_{v}_bf16_{c}_d128"
        for v in ("wide", "pipelined", "pipelined3", "pipelined_wide")
        for c in ("bf16", "fp8", "int8")
        if not (v.endswith("wide") and c == "bf16")
    ),
]
SM90_REGISTERS = 65536
SM90_SMEM = 228 * 1024
SM90_THREADS = 2048
THREADS = 128


def _nvrtc() -> Any:
    spec = importlib.util.spec_from_file_location("kvcore_nvrtc_sass", CSRC.parent / "_nvrtc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in {sysconfig.get_paths()["purelib"], *sys.path}:
        candidate = Path(base) / "nvidia" / "cu13" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    sys.exit("cuobjdump not found: pip install nvidia-cuda-cuobjdump")


def loops(sass: str) -> list[tuple[int, list[str]]]:
    """(tensor-core instruction count, body) of every innermost backward-branch loop with HMMA."""
    ins = [
        (int(m.group(1), 16), m.group(2).strip())
        for m in (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines())
        if m
    ]
    spans = []
    for addr, text in ins:
        m = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [t for a, t in ins if lo <= a <= addr]
            if sum("HMMA" in t for t in body) >= 16:
                spans.append((lo, addr, body))
    inner = [s for s in spans if not any(o[0] > s[0] and o[1] < s[1] for o in spans if o is not s)]
    return [(sum("HMMA" in t for t in body), body) for _, _, body in inner]


def blocks_per_sm(regs: int, smem: int) -> int:
    """Resident 128-thread blocks per sm_90 SM for this many registers per thread and smem bytes per block."""
    by_regs = SM90_REGISTERS // (THREADS * (-(-regs // 8) * 8))
    by_smem = SM90_SMEM // (smem + 1024)
    return min(by_regs, by_smem, SM90_THREADS // THREADS, 32)


def _variant(nv: Any, name: str) -> tuple[str, str, int]:
    """(variant, cache, head_dim) of an attention kernel name."""
    rest = name.removeprefix("paged_attention_").removeprefix("bounded_")
    variant = "default"
    for v in sorted(nv.DECODE_VARIANTS, key=len, reverse=True):
        if v != "default" and rest.startswith(v + "_"):
            variant, rest = v, rest[len(v) + 1 :]
            break
    _, cache, dim = rest.split("_")
    return variant, cache, int(dim.removeprefix("d"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=CSRC / "paged_attention.cu")
    ap.add_argument("--variants-source", type=Path, default=CSRC / "decode_variants.cu")
    ap.add_argument("--markdown", action="store_true", help="one markdown table row per kernel")
    ap.add_argument("kernels", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    nv = _nvrtc()
    variant_names = set(nv.KERNEL_NAMES.get("decode_variants", ()))
    sources = {"default": args.source}
    if any(k in variant_names for k in args.kernels):
        sources["variants"] = args.variants_source
    cubins: dict[str, bytes] = {}
    regs: dict[str, tuple[int, int]] = {}
    smem: dict[str, int] = {}
    for which, source in sources.items():
        res = nv.compile_cubin(
            source.read_bytes(), source.name, "sm_90", nv.include_dirs(source.parent), verbose=True
        )
        if not res.ok:
            print(res.log)
            return 1
        cubins[which] = res.cubin
        regs.update({fn: (r, s) for fn, r, s in nv.register_report(res.log)})
        smem.update(nv.smem_report(res.log))
    if args.markdown:
        print(
            "| kernel | registers | spilled B | smem/block B (static + dynamic) | blocks/SM | "
            "SASS per step (one-page loop) | keys/step | SASS per 16 keys | HMMA | LDG | LDGSTS | LDS |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.kernels:
        which = "variants" if name in variant_names else "default"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubins[which])
            f.flush()
            sass = subprocess.run(
                [_cuobjdump(), "-sass", "-fun", name, f.name], capture_output=True, text=True, check=True
            ).stdout
        r, spill = regs.get(name, (0, -1))
        variant, cache, dim = _variant(nv, name)
        dynamic = nv.pipeline_smem_bytes(cache, dim, variant) if hasattr(nv, "pipeline_smem_bytes") else 0
        block_smem = smem.get(name, 0) + dynamic
        keys = 16 * (nv.DECODE_VARIANTS[variant].sub_steps if hasattr(nv, "DECODE_VARIANTS") else 1)
        found = loops(sass)
        steps = []
        for hmma, body in found:
            ops = collections.Counter(t.split()[1] if t.startswith("@") else t.split()[0] for t in body)
            top = ", ".join(f"{k}:{v}" for k, v in ops.most_common(6))
            steps.append(f"{len(body)} ({hmma} HMMA, {sum('LDG' in t for t in body)} LDG; {top})")
        occupancy = blocks_per_sm(r, block_smem)
        if args.markdown:
            hmma, body = found[-1] if found else (0, [])

            def count(op: str, body: list[str] = body) -> int:
                return sum(op in t.split()[1 if t.startswith("@") else 0] for t in body)

            print(
                f"| `{name}` | {r} | {spill} | {block_smem} ({smem.get(name, 0)} + {dynamic}) | "
                f"{occupancy} | "
                f"{len(body)} | {keys} | {len(body) * 16 / keys:.0f} | {hmma} | {count('LDG.')} | "
                f"{count('LDGSTS')} | {count('LDS')} |"
            )
        else:
            print(
                f"{name}: {r} registers, {spill} B spilled, {block_smem} B smem/block ({dynamic} dynamic), "
                f"{occupancy} blocks/SM; per step ({keys} keys): " + " | ".join(steps or ["no loop"])
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
