"""Load kvcore's CUDA kernels on the current device: compile lazily, once, as a cubin for its exact SM.

Path (the same compiler and options CI uses, :mod:`kvcore.kernels._nvrtc`):
1. ``cuda.bindings.nvrtc`` compiles ``kernels/csrc/<family>.cu`` for ``sm_<major><minor>`` of the current
   device; the cubin is cached on disk under ``$KVCORE_CACHE_DIR`` (default ``~/.cache/kvcore/cubin``),
   keyed by the sources, the options and the NVRTC version;
2. ``cupy.RawModule(path=cubin)`` loads it.
Without ``cuda.bindings`` the loader falls back to CuPy's own NVRTC (``RawModule(code=...)`` with the
same options; CuPy also emits a cubin for the device's SM, so the PTX-version trap is avoided either way).

Modules are memoized per (family, device, checks); kernels per (family, name, device, checks).

Device checks (a debug build): with ``$KVCORE_DEVICE_CHECKS`` set (to anything but ``0``), the kernels are
compiled with ``-DKV_DEVICE_CHECKS`` (a cubin of their own): page ids read from device page tables and
device slot mappings are checked against the pool on the device, and the launcher raises
:class:`~kvcore.exceptions.InvalidPageError` after the launch (which it then waits for) at the first bad
one, which the kernel did not use. For debugging an engine that writes its tables on the device (CUDA
graphs); it synchronizes every launch.
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

__all__ = ["cache_dir", "device_arch", "device_checks", "get_kernel", "load_module"]


def cache_dir() -> Path:
    """Folder of compiled cubins: ``$KVCORE_CACHE_DIR`` or ``~/.cache/kvcore/cubin``."""
    env = os.environ.get("KVCORE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvcore" / "cubin"


def device_checks() -> bool:
    """Whether kernels load in their device-checks build: ``$KVCORE_DEVICE_CHECKS`` set, not ``0``."""
    return os.environ.get("KVCORE_DEVICE_CHECKS", "0") not in ("", "0")


def device_arch(device_id: int | None = None) -> str:
    """``sm_XY`` of a device (the current one by default), e.g. ``sm_90`` on H100/H200."""
    cp = require_cupy()
    dev = cp.cuda.Device(device_id) if device_id is not None else cp.cuda.Device()
    return f"sm_{dev.compute_capability}"


def _sources(kernel_dir: Path, family: str) -> tuple[bytes, bytes]:
    """The family's source, and every header of the folder (``common.cuh``, ``paged_attention.cuh``):
    what the cubin cache key covers, so that editing a header recompiles."""
    path = kernel_dir / f"{family}.cu"
    if family not in _nvrtc.KERNEL_NAMES or not path.is_file():
        raise ConfigError(f"no CUDA kernel family {family!r} in {kernel_dir}")
    headers = b"\0".join(h.name.encode() + b"\0" + h.read_bytes() for h in sorted(kernel_dir.glob("*.cuh")))
    return path.read_bytes(), headers


@functools.cache
def load_module(family: str, device_id: int, checks: bool = False) -> Any:
    """The ``cupy.RawModule`` of ``kernels/csrc/<family>.cu`` on device ``device_id`` (compiled once).

    ``checks``: the device-checks build (see the module docstring).
    """
    cp = require_cupy()
    try:
        kernel_dir = _nvrtc.find_kernel_dir()
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    source, header_bytes = _sources(kernel_dir, family)
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
            cupy_opts = tuple(_nvrtc.nvrtc_options(None, [str(kernel_dir), *headers], device_checks=checks))
            return cp.RawModule(code=source.decode(), options=cupy_opts)
        includes = _nvrtc.include_dirs(kernel_dir)
        opts = _nvrtc.nvrtc_options(arch, includes, device_checks=checks)
        key = hashlib.sha256(
            b"\0".join(
                [source, header_bytes, " ".join(opts[: -len(includes)]).encode(), repr(version).encode()]
            )
        )
        path = cache_dir() / f"{family}-{arch}-{key.hexdigest()[:16]}.cubin"
        if not path.is_file():
            res = _nvrtc.compile_cubin(source, f"{family}.cu", arch, includes, device_checks=checks)
            if not res.ok:
                raise ConfigError(f"NVRTC failed to compile {family}.cu for {arch}:\n{res.log}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(res.cubin)
            tmp.replace(path)  # atomic: a concurrent loader sees a whole cubin or none
        return cp.RawModule(path=str(path))


def get_kernel(family: str, name: str, device_id: int) -> Any:
    """The ``cupy.RawKernel`` ``name`` of ``kernels/csrc/<family>.cu`` on device ``device_id``.

    From the device-checks build when :func:`device_checks` says so.
    """
    return _get_kernel(family, name, device_id, device_checks())


@functools.cache
def _get_kernel(family: str, name: str, device_id: int, checks: bool) -> Any:
    if name not in _nvrtc.KERNEL_NAMES.get(family, ()):
        raise ConfigError(f"no kernel {name!r} in {family}.cu (see kvcore.kernels._nvrtc.KERNEL_NAMES)")
    return load_module(family, device_id, checks).get_function(name)
