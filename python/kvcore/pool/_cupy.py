"""The one place kvcore imports CuPy, so that ``import kvcore`` never needs it.

``cupy.cuda.is_available()`` only says whether a device is visible; the first real device call can still
fail (driver too old, no memory), and CuPy raises ``CUDARuntimeError``, a ``RuntimeError``. So
:func:`gpu_available` makes one tiny real call and remembers the answer.
"""

from __future__ import annotations

import functools
from types import ModuleType

__all__ = ["cupy_or_none", "gpu_available", "require_cupy"]


@functools.cache
def cupy_or_none() -> ModuleType | None:
    """The ``cupy`` module, or None when it is not installed (or fails to import)."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken install raising anything at import time
        return None
    return cupy


@functools.cache
def gpu_available() -> bool:
    """True when CuPy is importable and a device answers a real allocation."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        if not cp.cuda.is_available():
            return False
        cp.zeros(1, dtype=cp.uint8).sum().item()
    except RuntimeError:
        return False
    return True


def require_cupy() -> ModuleType:
    """The ``cupy`` module, with a usable device, or a clear error naming the missing piece."""
    from kvcore.exceptions import ConfigError

    cp = cupy_or_none()
    if cp is None:
        raise ConfigError("backend 'cupy' needs CuPy: pip install 'kvcore[gpu]' (cupy-cuda13x)")
    if not gpu_available():
        raise ConfigError("backend 'cupy': CuPy is installed but no CUDA device is usable")
    return cp
