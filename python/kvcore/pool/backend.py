"""Array backends of the KV pool: one interface, NumPy on the CPU and CuPy on the GPU.

Why a tiny interface instead of calling ``xp`` everywhere: allocation is where the two differ (device
memory through CuPy's pool, pinned host buffers for offload, synchronization), and the kernels dispatch on
:attr:`Backend.name`. Everything else uses the array module :attr:`Backend.xp`, which NumPy and CuPy share.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np

from kvcore.exceptions import ConfigError
from kvcore.pool._cupy import gpu_available, require_cupy

__all__ = ["Backend", "BackendName", "get_backend"]

BackendName = Literal["numpy", "cupy"]


@dataclass(frozen=True)
class Backend:
    """An array module plus the few operations that differ between host and device memory."""

    name: BackendName  # "numpy" (host memory, the reference kernels) or "cupy" (device memory, CUDA)
    xp: ModuleType  # numpy or cupy

    @property
    def is_device(self) -> bool:
        """True when arrays live in GPU memory."""
        return self.name == "cupy"

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zero-filled array (zeroed so unwritten slots never hold NaN bit patterns)."""
        return self.xp.zeros(shape, dtype=dtype)

    def empty_host(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A host array for offload: pinned (page-locked) memory on the GPU backend, plain on the CPU.

        Pinned memory lets the gather kernel write into it directly (zero-copy through UVA) and makes
        host/device copies asynchronous.
        """
        if self.name == "cupy":
            import cupyx  # shipped with cupy; imported only on this backend

            out: np.ndarray = cupyx.empty_pinned(shape, dtype=dtype)
            return out
        return np.empty(shape, dtype=dtype)

    def asnumpy(self, a: Any) -> np.ndarray:
        """A host copy (or the array itself on the CPU backend)."""
        if self.name == "cupy":
            out: np.ndarray = self.xp.asnumpy(a)
            return out
        return np.asarray(a)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """``a`` in this backend's memory (a host-to-device copy on the GPU backend when needed)."""
        return self.xp.asarray(a, dtype=dtype)

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU backend)."""
        if self.name == "cupy":
            self.xp.cuda.get_current_stream().synchronize()


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name``: ``'numpy'``, ``'cupy'``, or ``'auto'`` (CuPy when a device is usable).

    Raises:
        ConfigError: an unknown name, or ``'cupy'`` without CuPy or without a usable device.
    """
    if name == "auto":
        name = "cupy" if gpu_available() else "numpy"
    if name == "numpy":
        return Backend("numpy", np)
    if name == "cupy":
        return Backend("cupy", require_cupy())
    raise ConfigError(f"backend: expected 'numpy', 'cupy' or 'auto', got {name!r}")
