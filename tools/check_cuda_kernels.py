#!/usr/bin/env python3
"""CI check: every kvcore/kernels/csrc/*.cu compiles to an sm_90 cubin with NVRTC from PyPI (no GPU, no nvcc).

Fails (exit 1) on any compiler error or warning (``-Werror=all-warnings``), on an entry point the runtime
launches that the cubin lacks (kvcore.kernels._nvrtc.KERNEL_NAMES), on a .cu file the runtime does not
know, and on an empty folder. The options are those of the runtime loader: both call
``kvcore.kernels._nvrtc.nvrtc_options``. That module is loaded by path, so the check needs neither the
native extension nor NumPy, only ``cuda-bindings``, ``nvidia-cuda-nvrtc`` and ``nvidia-cuda-runtime``.

Usage: python tools/check_cuda_kernels.py [kernels_dir] (targets: $KV_ARCHS, default sm_90, comma-separated)
Prints one line per (file, arch), the registers and spills of every kernel, and "N passed, N failed".
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_nvrtc_module() -> ModuleType:
    """kvcore/kernels/_nvrtc.py, imported by path (without importing the kvcore package)."""
    path = REPO / "python" / "kvcore" / "kernels" / "_nvrtc.py"
    spec = importlib.util.spec_from_file_location("kvcore_nvrtc_standalone", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is created
    spec.loader.exec_module(module)
    return module


def main(folder: str = str(REPO / "python" / "kvcore" / "kernels" / "csrc")) -> int:
    nv = load_nvrtc_module()
    archs = os.environ.get("KV_ARCHS", "sm_90").split(",")
    kernel_dir = Path(folder).resolve()
    files = sorted(kernel_dir.glob("*.cu"))
    includes = nv.include_dirs(kernel_dir)
    options = nv.nvrtc_options(archs[0], includes, verbose=True)
    print(f"NVRTC {nv.nvrtc_version()} archs={archs} options={options}")
    passed = failed = 0
    for path in files:
        expected = nv.KERNEL_NAMES.get(path.stem)
        for arch in archs:
            res = nv.compile_cubin(path.read_bytes(), path.name, arch, includes, verbose=True)
            problems = []
            if not res.ok:
                problems.append("compilation failed")
            elif expected is None:
                problems.append("unknown to the runtime (add it to KERNEL_NAMES in kvcore/kernels/_nvrtc.py)")
            else:
                missing = nv.missing_kernels(res.cubin, expected)
                if missing:
                    problems.append(f"missing entry points: {', '.join(missing)}")
            good = not problems
            rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            print(
                f"{'ok' if good else 'FAIL'} {rel} [{arch}] {len(res.cubin)} B cubin, "
                f"{len(expected or ())} entry points, {res.seconds:.2f}s"
            )
            if not good:
                print("   " + "; ".join(problems))
                if res.log:
                    print(res.log)
            for fn, regs, spill in nv.register_report(res.log):
                print(f"   {fn}: {regs} regs, {spill} B spilled")
            passed += good
            failed += not good
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not files else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
