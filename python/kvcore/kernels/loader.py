"""Load kvcore's CUDA kernels on the current device: compile lazily, once, as a cubin for its exact SM.

Path (the same compiler and options CI uses, :mod:`kvcore.kernels._nvrtc`):
1. ``cuda.bindings.nvrtc`` compiles ``kernels/csrc/<family>.cu`` for ``sm_<major><minor>`` of the current
   device; the cubin is cached on disk under ``$KVCORE_CACHE_DIR`` (default ``~/.cache/kvcore/cubin``),
   keyed by the sources, the options and the NVRTC version;
2. ``cupy.RawModule(path=cubin)`` loads it.
Without ``cuda.bindings`` the loader falls back to CuPy's own NVRTC (``RawModule(code=...)`` with the
same options; CuPy also emits a cubin for the device's SM, so the PTX-version trap is avoided either way).

Modules are memoized per (family, device); kernels per (family, name, device).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from kvcore.exceptions import ConfigError
from kvcore.kernels import _nvrtc
from kvcore.pool._cupy import require_cupy

__all__ = ["cache_dir", "device_arch", "get_kernel", "load_module"]


def cache_dir() -> Path:
    """Folder of compiled cubins: ``$KVCORE_CACHE_DIR`` or ``~/.cache/kvcore/cubin``."""
    env = os.environ.get("KVCORE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvcore" / "cubin"


def device_arch(device_id: int | None = None) -> str:
    """``sm_XY`` of a device (the current one by default), e.g. ``sm_90`` on H100/H200."""
    cp = require_cupy()
    dev = cp.cuda.Device(device_id) if device_id is not None else cp.cuda.Device()
    return f"sm_{dev.compute_capability}"


def _sources(kernel_dir: Path, family: str) -> tuple[bytes, bytes]:
    path = kernel_dir / f"{family}.cu"
    if family not in _nvrtc.KERNEL_NAMES or not path.is_file():
        raise ConfigError(f"no CUDA kernel family {family!r} in {kernel_dir}")
    return path.read_bytes(), (kernel_dir / "common.cuh").read_bytes()


@functools.cache
def load_module(family: str, device_id: int) -> Any:
    """The ``cupy.RawModule`` of ``kernels/csrc/<family>.cu`` on device ``device_id`` (compiled once)."""
    cp = require_cupy()
    try:
        kernel_dir = _nvrtc.find_kernel_dir()
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    source, common = _sources(kernel_dir, family)
    with cp.cuda.Device(device_id):
        arch = device_arch(device_id)
        try:
            version = _nvrtc.nvrtc_version()
        except ImportError:
            # No cuda.bindings: CuPy compiles with its NVRTC (it adds -arch=sm_XX, emits a cubin and
            # adds its CUDA include folder when it knows one).
            try:
                headers = _nvrtc.cuda_header_dirs()
            except ImportError:
                headers = []
            cupy_opts = tuple(_nvrtc.nvrtc_options(None, [str(kernel_dir), *headers]))
            return cp.RawModule(code=source.decode(), options=cupy_opts)
        includes = _nvrtc.include_dirs(kernel_dir)
        opts = _nvrtc.nvrtc_options(arch, includes)
        key = hashlib.sha256(
            b"\0".join([source, common, " ".join(opts[: -len(includes)]).encode(), repr(version).encode()])
        )
        path = cache_dir() / f"{family}-{arch}-{key.hexdigest()[:16]}.cubin"
        if not path.is_file():
            res = _nvrtc.compile_cubin(source, f"{family}.cu", arch, includes)
            if not res.ok:
                raise ConfigError(f"NVRTC failed to compile {family}.cu for {arch}:\n{res.log}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(res.cubin)
            tmp.replace(path)  # atomic: a concurrent loader sees a whole cubin or none
        return cp.RawModule(path=str(path))


@functools.cache
def get_kernel(family: str, name: str, device_id: int) -> Any:
    """The ``cupy.RawKernel`` ``name`` of ``kernels/csrc/<family>.cu`` on device ``device_id``."""
    if name not in _nvrtc.KERNEL_NAMES.get(family, ()):
        raise ConfigError(f"no kernel {name!r} in {family}.cu (see kvcore.kernels._nvrtc.KERNEL_NAMES)")
    return load_module(family, device_id).get_function(name)
