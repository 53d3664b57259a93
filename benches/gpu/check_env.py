"""What the device check runs on: how it imports kvcore, which pieces are missing, the GPU and its clocks.

Native-free import (why): ``kvcore/__init__.py`` imports the native extension ``kvcore._kvcore`` (git-ignored,
so it may not travel to the device), while the kernels, the pool and the NumPy reference are pure Python
and never touch it. :func:`import_kvcore` first imports the real package; only when that fails *because of
the native module* does it put a bare package object for ``kvcore`` in ``sys.modules`` (a "shell": a
package spec whose search path is ``python/kvcore``, with no code run). ``import kvcore.kernels`` then loads
the subpackages from their own files, exactly as usual, but ``kvcore/__init__.py`` never runs. Unlike a
stand-in ``kvcore._kvcore`` with fake classes, nothing is faked: whatever does need the native module
(``kvcore.KVCacheManager``, the host tier) fails loudly with an ImportError instead of working wrongly.
The pytest part runs in a subprocess with the real package, so it needs the native module; its absence is
reported at the start and makes the run FAIL at the end.

This module imports nothing of kvcore at import time, so the script can call it before anything else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "python" / "kvcore"
NATIVE = "kvcore._kvcore"

# nvidia-smi fields logged beside the benchmarks (read-only queries; clocks are never set).
CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw", "temperature.gpu")


@dataclass(frozen=True)
class ImportInfo:
    """How kvcore was imported."""

    native: bool  # the native module imported (the real kvcore/__init__ ran)
    how: str  # one line for the log
    error: str  # why the native module did not import ("" when it did)


class _BlockNative(importlib.abc.MetaPathFinder):
    """A finder that refuses ``kvcore._kvcore``: simulates a device without the carried extension."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname == NATIVE:
            raise ModuleNotFoundError(
                f"No module named {NATIVE!r} (simulated by --simulate-missing-native)", name=NATIVE
            )
        return None


def _is_native_failure(e: ImportError) -> bool:
    return e.name == NATIVE or "_kvcore" in str(e)


def _install_shell() -> None:
    """``kvcore`` as a package object with no code run: its submodules import from ``python/kvcore``."""
    for name in [n for n in sys.modules if n == "kvcore" or n.startswith("kvcore.")]:
        del sys.modules[name]  # half-imported leftovers of the failed attempt
    spec = importlib.machinery.ModuleSpec("kvcore", None, is_package=True)
    spec.submodule_search_locations = [str(PACKAGE_DIR)]
    shell = importlib.util.module_from_spec(spec)
    shell.__doc__ = "kvcore without its native module (device_check's shell package: subpackages only)"
    sys.modules["kvcore"] = shell


def import_kvcore(*, simulate_missing_native: bool = False) -> ImportInfo:
    """Import kvcore from this checkout; without its native module, as a shell package (module docstring).

    Raises:
        ImportError: kvcore failed to import for another reason than the native module.
    """
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    if simulate_missing_native:
        sys.meta_path.insert(0, _BlockNative())
    try:
        import kvcore  # noqa: F401
    except ImportError as e:
        if not _is_native_failure(e):
            raise
        _install_shell()
        return ImportInfo(
            native=False,
            how="kvcore imported without its native module (shell package: kvcore/__init__.py not run)",
            error=f"{type(e).__name__}: {e}",
        )
    return ImportInfo(native=True, how="kvcore imported with its native module", error="")


# ------------------------------------------------------------------------------------ prerequisites


@dataclass(frozen=True)
class Piece:
    """One thing the check needs (or would like), and whether it is there."""

    name: str
    present: bool
    required: bool  # its absence makes the run FAIL
    detail: str  # version, or what is missing and how to get it


def prerequisites(info: ImportInfo, *, device: bool) -> list[Piece]:
    """Every piece the run needs, checked before anything is measured.

    ``device``: the CUDA run (CuPy, a GPU, the native module and pytest are required); the NumPy self-test
    needs none of them.
    """
    import numpy as np

    from kvcore.pool._cupy import cupy_or_none, gpu_available

    cp = cupy_or_none()
    pieces = [Piece("numpy", True, True, np.__version__)]
    why = ""
    if cp is None:
        try:
            import cupy  # noqa: F401  (again, for its error message)
        except Exception as e:
            why = f" ({type(e).__name__}: {e})"[:300]
    pieces.append(
        Piece(
            "CuPy",
            cp is not None,
            device,
            cp.__version__ if cp is not None else f"cannot import cupy{why}; pip install cupy-cuda13x",
        )
    )
    usable = cp is not None and gpu_available()
    if cp is None:
        device_detail = "no CuPy"
    elif usable:
        device_detail = "a real allocation answered"
    else:
        try:
            count = cp.cuda.runtime.getDeviceCount()
            device_detail = f"CuPy sees {count} device(s) but a real allocation failed"
        except Exception as e:
            device_detail = f"CuPy imports but no CUDA device answers ({type(e).__name__}: {e})"[:300]
    pieces.append(Piece("CUDA device", usable, device, device_detail))
    pieces.append(
        Piece(
            f"native module {NATIVE}",
            info.native,
            device,
            "imported"
            if info.native
            else f"{info.error}; carry python/kvcore/_kvcore.abi3.so (needed by the pytest part)",
        )
    )
    has_pytest = importlib.util.find_spec("pytest") is not None
    pieces.append(Piece("pytest", has_pytest, device, "importable" if has_pytest else "pip install pytest"))
    try:
        bindings = importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        bindings = False
    pieces.append(
        Piece(
            "cuda.bindings (NVRTC)",
            bindings,
            False,
            "present" if bindings else "absent: the loader falls back to CuPy's NVRTC",
        )
    )
    smi = shutil.which("nvidia-smi")
    pieces.append(Piece("nvidia-smi", smi is not None, False, smi or "absent: no clock log"))
    return pieces


# ------------------------------------------------------------------------------------ environment


def environment() -> dict[str, Any]:
    """GPU, driver, CuPy, NVRTC, Python: printed once and kept in the JSON."""
    import cupy as cp
    import numpy as np

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props.get("name", b"?")
    info: dict[str, Any] = {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "compute_capability": dev.compute_capability,
        "sms": props.get("multiProcessorCount"),
        "l2_bytes": props.get("l2CacheSize"),
        "memory_bytes": props.get("totalGlobalMem"),
        "driver": cp.cuda.runtime.driverGetVersion(),
        "runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "kvcore_cache_dir": os.environ.get("KVCORE_CACHE_DIR", "~/.cache/kvcore/cubin"),
    }
    try:
        from kvcore.kernels import _nvrtc

        info["nvrtc"] = _nvrtc.nvrtc_version()
    except Exception as e:  # reported, not fatal: the loader then uses CuPy's NVRTC
        info["nvrtc"] = f"unavailable: {type(e).__name__}: {e}"
    return info


def host_environment() -> dict[str, Any]:
    """The self-test's environment: no GPU."""
    import numpy as np

    return {"numpy": np.__version__, "python": sys.version.split()[0], "platform": platform.platform()}


def ptx_trap(compute_capability: str) -> dict[str, str]:
    """Does a PTX of this NVRTC load under this driver, and a cubin? (Informational: the loader uses cubins.)

    A PTX newer than the driver fails (``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``), a cubin for the exact SM
    loads; see ``kvcore/kernels/_nvrtc.py``.
    """
    import cupy as cp

    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return {"skipped": "cuda.bindings missing"}
    src = b'extern "C" __global__ void probe(float* x) { x[threadIdx.x] += 1.0f; }\n'
    out: dict[str, str] = {}
    for target, kind in ((f"compute_{compute_capability}", "ptx"), (f"sm_{compute_capability}", "cubin")):
        try:
            _, prog = nvrtc.nvrtcCreateProgram(src, b"probe.cu", 0, [], [])
            nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={target}".encode()])
            if kind == "ptx":
                buf = b" " * nvrtc.nvrtcGetPTXSize(prog)[1]
                nvrtc.nvrtcGetPTX(prog, buf)
                text = buf.decode(errors="replace").splitlines()
                version = next((ln for ln in text if ln.startswith(".version")), "?")
            else:
                buf = b" " * nvrtc.nvrtcGetCUBINSize(prog)[1]
                nvrtc.nvrtcGetCUBIN(prog, buf)
                version = "cubin"
            nvrtc.nvrtcDestroyProgram(prog)
            path = Path(f"/tmp/kvcore-probe-{os.getpid()}.{kind}")
            # PTX: text, NUL-terminated once. A cubin is an ELF image of exactly the size NVRTC gave:
            # it may end in zero bytes (the last program header's p_align), so it is written untouched.
            path.write_bytes((buf.rstrip(b"\x00 ") + b"\x00") if kind == "ptx" else buf)
            fn = cp.RawModule(path=str(path)).get_function("probe")
            x = cp.zeros(32, cp.float32)
            fn((1,), (32,), (x,))
            cp.cuda.Device().synchronize()
            out[kind] = f"loads and runs ({version})"
        except Exception as e:
            out[kind] = f"FAILS: {type(e).__name__}: {e}"
    return out


def clocks_start() -> subprocess.Popen[str] | None:
    """Start one read-only nvidia-smi query (clocks, power, temperature); None without nvidia-smi.

    Started just before a timed run, so that the sample lands while the kernels run.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        return subprocess.Popen(
            [smi, f"--query-gpu={','.join(CLOCK_FIELDS)}", "--format=csv,noheader"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError:
        return None


def clocks_finish(proc: subprocess.Popen[str] | None) -> dict[str, str] | None:
    """The sample of :func:`clocks_start` (first GPU), as {field: value}; None when there is none."""
    if proc is None:
        return None
    try:
        text, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    values = [v.strip() for v in line.split(",")]
    if proc.returncode != 0 or len(values) != len(CLOCK_FIELDS):
        return {"error": line[:200]}
    return dict(zip(CLOCK_FIELDS, values, strict=True))


def clocks_now() -> dict[str, str] | None:
    """One clock sample, now."""
    return clocks_finish(clocks_start())


def format_clocks(c: dict[str, str] | None) -> str:
    if not c:
        return "clocks: unavailable (no nvidia-smi)"
    if "error" in c:
        return f"clocks: nvidia-smi failed: {c['error']}"
    return (
        f"clocks: SM {c['clocks.sm']} (max {c['clocks.max.sm']}), memory {c['clocks.mem']} "
        f"(max {c['clocks.max.mem']}), {c['power.draw']}, {c['temperature.gpu']} C"
    )
