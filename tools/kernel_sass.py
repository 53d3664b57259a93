#!/usr/bin/env python3
"""Registers, spills and SASS instructions per main-loop step of the attention kernels (no GPU needed).

Compiles ``python/kvcore/kernels/csrc/paged_attention.cu`` (or ``--source FILE``: an older version from
``git show REV:...``, with the ``common.cuh`` of that revision beside it) for sm_90 with kvcore's NVRTC
options, disassembles it with ``cuobjdump -sass`` and, for every loop holding tensor-core instructions,
prints its static instructions per step (one 16-key warp step) and the most frequent opcodes. A kernel
with two loops has the generic (page size < 16) and the one-page path; the second is the one page-size-16
decode runs.
Conditional blocks count in full (the lazy O rescale usually skips its multiplies).

Needs NVIDIA's ``nvidia-cuda-cuobjdump`` wheel (``pip install nvidia-cuda-cuobjdump``) or ``cuobjdump`` on
PATH, and the NVRTC wheels of ``.[test]``.

Usage: python tools/kernel_sass.py [--source FILE] [KERNEL ...]
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
]


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=CSRC / "paged_attention.cu")
    ap.add_argument("kernels", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    nv = _nvrtc()
    res = nv.compile_cubin(
        args.source.read_bytes(),
        "paged_attention.cu",
        "sm_90",
        nv.include_dirs(args.source.parent),
        verbose=True,
    )
    if not res.ok:
        print(res.log)
        return 1
    regs = {fn: (r, s) for fn, r, s in nv.register_report(res.log)}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.cubin)
        f.flush()
        for name in args.kernels:
            sass = subprocess.run(
                [_cuobjdump(), "-sass", "-fun", name, f.name], capture_output=True, text=True, check=True
            ).stdout
            r, spill = regs.get(name, ("?", "?"))
            steps = []
            for hmma, body in loops(sass):
                ops = collections.Counter(t.split()[1] if t.startswith("@") else t.split()[0] for t in body)
                top = ", ".join(f"{k}:{v}" for k, v in ops.most_common(6))
                steps.append(f"{len(body)} ({hmma} HMMA, {sum('LDG' in t for t in body)} LDG; {top})")
            print(f"{name}: {r} registers, {spill} B spilled; per step: " + " | ".join(steps or ["no loop"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
