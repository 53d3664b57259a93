"""The two backends of the device check: CuPy on the GPU, NumPy for the CPU self-test.

Why one interface: the sweep, the benchmarks and the dense-reference check are written once against
:class:`Device`, and the self-test (``--self-test``) runs exactly that code with NumPy pools (the kernels
then dispatch to :mod:`kvcore.kernels.reference`), so the harness itself is tested in CI without a GPU.
What differs lives here: timing (CUDA events and CUDA graphs, or ``perf_counter``), the pool fill (a
RawKernel, or the same hash in NumPy), the bandwidth ceilings, the occupancy query and the launcher.

The fill pattern: element ``i`` of the pool (flat index of ``pool.data``) gets bits derived from
``mix(i, seed)`` (a splitmix64 finalizer), valid and finite for its precision: bf16/fp16 magnitudes in
[0.5, 2), fp8 e4m3 magnitudes in [0.5, 1.875] (never the NaN bytes 0x7F / 0xFF), int8 in [-127, 127].
Even elements (so even head_dim columns) are positive and odd ones take a hashed sign, so attention
outputs are O(1) and a wrong or missing row shows (an all-random-sign cache averages to zero). The CUDA
kernel and :func:`pattern_bits` compute the same bits; the sweep checks that on the device.

Fault injection (``--inject-fault``): :meth:`Device.fetch` hands results to the host; for a tag named in
``faults`` it flips one bit of the copy, so the comparisons after it must report a mismatch. The tests use
it to prove the harness detects a wrong kernel.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from check_ledger import FAULT_TAGS

__all__ = ["FAULT_TAGS", "CupyDevice", "Device", "Timing", "bits_view", "fill_pool_xp", "pattern_bits"]

# splitmix64 constants (Steele, Lea, Flood 2014), in the CUDA source and in pattern_bits alike.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

FILL_SOURCE = r"""
__device__ __forceinline__ unsigned long long kv_mix(unsigned long long i, unsigned long long seed) {
    unsigned long long z = i + seed * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// dst: [n] the pool's elements as bits; kind 0 fp16, 1 bf16 (16-bit), 2 fp8 e4m3, 3 int8 (8-bit).
// Odd elements take a hashed sign, even ones are positive (head_dim is even: the same per column).
extern "C" __global__ void fill_pattern_16(unsigned short* __restrict__ dst, unsigned long long n,
                                           unsigned long long seed, int kind) {
    typedef unsigned long long u64;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += stride) {
        const u64 h = kv_mix(i, seed);
        const unsigned int sign = (unsigned int)((h >> 32) & i & 1ull);
        const unsigned int mag = kind == 0 ? 0x3800u + (unsigned int)(h & 0x7FFull)
                                           : 0x3F00u + (unsigned int)(h & 0xFFull);
        dst[i] = (unsigned short)((sign << 15) | mag);
    }
}

extern "C" __global__ void fill_pattern_8(unsigned char* __restrict__ dst, unsigned long long n,
                                          unsigned long long seed, int kind) {
    typedef unsigned long long u64;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += stride) {
        const u64 h = kv_mix(i, seed);
        const unsigned int sign = (unsigned int)((h >> 32) & i & 1ull);
        unsigned int bits;
        if (kind == 2) {
            bits = (sign << 7) | (0x30u + (unsigned int)(h & 0xFull));
        } else {
            const unsigned int mag = (unsigned int)(h & 0x7Full);
            bits = sign ? ((256u - mag) & 0xFFu) : mag;
        }
        dst[i] = (unsigned char)bits;
    }
}
"""

# A read-only streaming kernel: 16-byte loads, 4 in flight per thread, XOR-reduced; the one write happens
# only if the reduction equals a runtime sentinel, so the loads stay live and nothing is written.
STREAM_SOURCE = r"""
struct alignas(16) kv_u32x4 { unsigned int x, y, z, w; };

extern "C" __global__ void stream_read(const kv_u32x4* __restrict__ src, unsigned long long n,
                                       unsigned int sentinel, unsigned int* __restrict__ out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const kv_u32x4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const kv_u32x4 a = src[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == sentinel) out[0] = acc;
}
"""

_KIND = {"fp16": 0, "bf16": 1, "fp8": 2, "int8": 3}


def pattern_bits(start: int, count: int, seed: int, kv_dtype: str, xp: Any = np) -> Any:
    """The fill pattern of elements ``[start, start + count)``: uint16 (fp16/bf16) or uint8 (fp8/int8)."""
    u = xp.uint64
    i = xp.arange(start, start + count, dtype=u)
    z = i + u((seed * _GOLDEN) % 2**64)
    z = (z ^ (z >> u(30))) * u(_MIX1)
    z = (z ^ (z >> u(27))) * u(_MIX2)
    h = z ^ (z >> u(31))
    sign = (h >> u(32)) & i & u(1)
    if kv_dtype in ("fp16", "bf16"):
        mag = u(0x3800) + (h & u(0x7FF)) if kv_dtype == "fp16" else u(0x3F00) + (h & u(0xFF))
        return ((sign << u(15)) | mag).astype(xp.uint16)
    if kv_dtype == "fp8":
        return ((sign << u(7)) | (u(0x30) + (h & u(0xF)))).astype(xp.uint8)
    mag = h & u(0x7F)
    negated = ((mag ^ u(0xFF)) + u(1)) & u(0xFF)  # two's complement of -mag in 8 bits (array on the left)
    return xp.where(sign == u(1), negated, mag).astype(xp.uint8)


def bits_view(pool: Any) -> Any:
    """``pool.data`` flat, as unsigned bits (uint16 or uint8), sharing its memory."""
    flat = pool.data.reshape(-1)
    return flat.view(pool.xp.uint16 if flat.dtype.itemsize == 2 else pool.xp.uint8)


def fill_pool_xp(pool: Any, seed: int, chunk: int = 1 << 24) -> None:
    """The fill pattern with array operations (NumPy, or CuPy without a compiled kernel), chunk by chunk."""
    flat = bits_view(pool)
    for start in range(0, flat.shape[0], chunk):
        count = min(chunk, flat.shape[0] - start)
        flat[start : start + count] = pattern_bits(start, count, seed, pool.kv_dtype, pool.xp)


# ------------------------------------------------------------------------------------ timing


def _nothing() -> None:
    """The replay of a timing whose buffers are gone."""


@dataclass
class Timing:
    """Seconds per call of a timed callable: median and spread over the timed batches."""

    median_s: float
    min_s: float
    max_s: float
    calls_per_batch: int  # calls in one timed batch (one graph replays them all)
    batches: int  # timed batches (5-10)
    mode: str  # "graph" (CUDA graph replay), "stream" (plain launches), "host" (NumPy)
    warmup_s: float  # time spent warming up before the timed batches
    note: str  # why graphs were not used, if they were asked for
    replay: Callable[[], None]  # one timed batch again (graph or plain), for checking what was timed


def _batches(
    run: Callable[[Callable[[], None], int], float],
    fn: Callable[[], None],
    *,
    warmup_s: float,
    min_batch_s: float,
    batches: int,
    max_calls: int,
) -> tuple[float, float, int]:
    """Warm up (at least ``warmup_s`` of calls) and size a batch of at least ``min_batch_s``.

    Returns (seconds spent warming up, seconds per call in the last warm-up chunk, calls per batch).
    """
    per = run(fn, 1)  # the first call (loads the kernel on first use)
    spent = per
    # A wall-clock cap too: a callable that put no work where ``run`` measures must not spin forever.
    cap = time.monotonic() + 5.0 + 10.0 * warmup_s
    while spent < warmup_s and time.monotonic() < cap:
        n = max(1, min(max_calls, math.ceil(0.02 / max(per, 1e-7))))
        t = run(fn, n)
        per, spent = t / n, spent + t
    return spent, per, max(1, min(max_calls, math.ceil(min_batch_s / max(per, 1e-7))))


class Device:
    """The NumPy backend: NumPy pools (the reference kernels), host timing. :class:`CupyDevice` overrides."""

    name = "numpy"

    def __init__(self, faults: frozenset[str] = frozenset()) -> None:
        self.xp: Any = np
        self.faults = faults

    # ---------------------------------------------------------------- memory

    def asarray(self, a: Any) -> Any:
        return self.xp.asarray(a)

    def asnumpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for on the host)."""

    def free(self) -> None:
        """Give cached device memory back (between benchmark rows)."""

    def fetch(self, a: Any, tag: str) -> np.ndarray:
        """A host copy of a result; with ``tag`` in :attr:`faults`, one bit of it flipped (fault injection).

        The flipped bit is bit 6 of the first element's most significant byte: an exponent bit of a 16-bit
        float, a high bit of an 8-bit value, so any comparison after this sees the change.
        """
        host = np.array(self.asnumpy(a), copy=True)
        if tag in self.faults and host.size:
            raw = host.reshape(-1).view(np.uint8)
            raw[host.dtype.itemsize - 1] ^= 0x40
        return host

    # ---------------------------------------------------------------- kernels

    def fill(self, pool: Any, seed: int) -> str:
        """Fill every element of the pool with the pattern; returns how ("kernel" or "array ops")."""
        fill_pool_xp(pool, seed)
        return "array ops"

    def occupancy(self, pool: Any, q: Any, variant: str = "default") -> dict[str, int]:
        """``num_sms`` and ``blocks_per_sm`` for the plan (fixed stand-ins on the host)."""
        return {"num_sms": 4, "blocks_per_sm": 2}

    def kernel_name(self, pool: Any, q: Any, plan: Any) -> str:
        """The CUDA kernel a plain call with ``plan`` launches (the one it would launch, on the host)."""
        from kvcore.kernels.gpu import attention_kernel

        act = "fp16" if q.dtype == np.float16 else "bf16"
        return attention_kernel(pool.kv_dtype, act, pool.head_dim, pool.page_size, variant=plan.variant)[1]

    def launcher(self, q: Any, pool: Any, plan: Any, sm_scale: float, out: Any) -> Callable[[], None]:
        """A zero-argument callable that runs the attention of ``plan`` into ``out``."""
        from kvcore.kernels import reference

        return lambda: reference.attention(q, pool, 0, plan, sm_scale, out)

    # ---------------------------------------------------------------- timing

    def time(
        self,
        fn: Callable[[], None],
        *,
        warmup_s: float,
        min_batch_s: float,
        batches: int,
        graph_below_s: float = 0.0,
        max_calls: int = 1000,
    ) -> Timing:
        """Warm-up, then ``batches`` timed batches of ``fn`` calls; seconds per call."""

        def run(f: Callable[[], None], n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            return time.perf_counter() - t0

        spent, _, k = _batches(
            run, fn, warmup_s=warmup_s, min_batch_s=min_batch_s, batches=batches, max_calls=max_calls
        )
        times = sorted(run(fn, k) / k for _ in range(batches))

        def replay() -> None:
            for _ in range(k):
                fn()

        return Timing(times[len(times) // 2], times[0], times[-1], k, batches, "host", spent, "", replay)

    # ---------------------------------------------------------------- ceilings

    def copy_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing]:
        """Copy bandwidth, bytes read + written per second, and its timing."""
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        t = self.time(lambda: np.copyto(dst, src), **timing)
        return 2 * nbytes / t.median_s, t

    def stream_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing, str]:
        """Read-only streaming bandwidth, bytes read per second; its timing and launch shape."""
        buf = np.ones(nbytes // 8, dtype=np.uint64)
        t = self.time(lambda: np.bitwise_xor.reduce(buf), **timing)
        return nbytes / t.median_s, t, "numpy xor-reduce"

    def clocks_start(self) -> Any:
        return None

    def clocks_finish(self, handle: Any) -> dict[str, str] | None:
        return None


class CupyDevice(Device):
    """The CUDA backend: CuPy pools, the CUDA kernels, CUDA events and graphs."""

    name = "cupy"

    def __init__(self, faults: frozenset[str] = frozenset()) -> None:
        super().__init__(faults)
        import cupy as cp

        self.cp: Any = cp
        self.xp = cp
        dev = cp.cuda.Device()
        self.num_sms = int(dev.attributes["MultiProcessorCount"])
        self._fill: dict[int, Any] = {}
        self._fill_error = ""
        self._stream: Any = None

    def asnumpy(self, a: Any) -> np.ndarray:
        out: np.ndarray = self.cp.asnumpy(a)
        return out

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()

    def free(self) -> None:
        self.sync()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()

    # ---------------------------------------------------------------- kernels

    def compile_helpers(self) -> dict[str, str]:
        """Compile (and smoke-launch) the fill and streaming RawKernels; {kernel: "ok" or the error}."""
        cp = self.cp
        status: dict[str, str] = {}
        try:
            mod = cp.RawModule(code=FILL_SOURCE)
            self._fill = {2: mod.get_function("fill_pattern_16"), 1: mod.get_function("fill_pattern_8")}
            probe = cp.zeros(256, cp.uint16)
            self._fill[2]((1,), (256,), (probe, np.uint64(256), np.uint64(1), np.int32(1)))
            self.sync()
            status["fill_pattern"] = "ok"
        except Exception as e:
            self._fill, self._fill_error = {}, f"{type(e).__name__}: {e}"
            status["fill_pattern"] = self._fill_error
        try:
            self._stream = cp.RawKernel(STREAM_SOURCE, "stream_read")
            buf = cp.zeros(64, cp.uint8)
            out = cp.zeros(1, cp.uint32)
            self._stream((1,), (32,), (buf, np.uint64(4), np.uint32(0x9E3779B9), out))
            self.sync()
            status["stream_read"] = "ok"
        except Exception as e:
            self._stream = None
            status["stream_read"] = f"{type(e).__name__}: {e}"
        return status

    def fill(self, pool: Any, seed: int) -> str:
        flat = bits_view(pool)
        kernel = self._fill.get(flat.dtype.itemsize)
        if kernel is None:  # no compiled kernel: the same pattern with CuPy array ops (slower, same bits)
            fill_pool_xp(pool, seed, chunk=1 << 25)
            return f"array ops (fill kernel unavailable: {self._fill_error or 'not compiled'})"
        grid = self.num_sms * 8
        kernel(
            (grid,),
            (256,),
            (flat, np.uint64(flat.shape[0]), np.uint64(seed % 2**64), np.int32(_KIND[pool.kv_dtype])),
        )
        return "kernel"

    def occupancy(self, pool: Any, q: Any, variant: str = "default") -> dict[str, int]:
        from kvcore.kernels.gpu import occupancy

        return occupancy(pool, q, variant=variant)

    def launcher(self, q: Any, pool: Any, plan: Any, sm_scale: float, out: Any) -> Callable[[], None]:
        from kvcore.kernels.gpu import attention_launcher

        return attention_launcher(q, pool, 0, plan, sm_scale, out)

    # ---------------------------------------------------------------- timing

    def time(
        self,
        fn: Callable[[], None],
        *,
        warmup_s: float,
        min_batch_s: float,
        batches: int,
        graph_below_s: float = 0.0,
        max_calls: int = 1000,
    ) -> Timing:
        """CUDA-event timing on a stream of its own; short calls are replayed from a CUDA graph.

        Graphs (when a call takes less than ``graph_below_s``): one batch of calls is captured once and each
        timed batch is one graph launch, so the host's launch overhead cannot leave the GPU idle between
        calls. If the capture fails, plain launches are timed and :attr:`Timing.note` says why.
        """
        cp = self.cp
        self.sync()  # the pool and inputs were written on the default stream
        stream = cp.cuda.Stream(non_blocking=True)
        start, stop = cp.cuda.Event(), cp.cuda.Event()

        def run(f: Callable[[], None], n: int) -> float:
            start.record(stream)
            for _ in range(n):
                f()
            stop.record(stream)
            stop.synchronize()
            return float(cp.cuda.get_elapsed_time(start, stop)) / 1e3

        with stream:
            spent, per, k = _batches(
                run, fn, warmup_s=warmup_s, min_batch_s=min_batch_s, batches=batches, max_calls=max_calls
            )

            def plain() -> None:
                for _ in range(k):
                    fn()

            batch, mode, note = plain, "stream", ""
            if per < graph_below_s:
                try:
                    graph = self._capture(fn, k)
                    batch, mode = (lambda: graph.launch(stream=stream)), "graph"
                    run(batch, 1)  # the first replay uploads the graph
                except Exception as e:
                    note = f"CUDA graph capture failed ({type(e).__name__}: {e}); plain launches timed"
                    print(f"  note: {note}")
            times = sorted(run(batch, 1) / k for _ in range(batches))
        self.sync()

        def replay() -> None:
            self.sync()  # what the caller wrote since (on the default stream) lands first
            with stream:
                batch()
            stream.synchronize()

        return Timing(times[len(times) // 2], times[0], times[-1], k, batches, mode, spent, note, replay)

    def _capture(self, fn: Callable[[], None], k: int) -> Any:
        """A CUDA graph of ``k`` calls of ``fn``, captured on a stream of its own."""
        cp = self.cp
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            try:
                for _ in range(k):
                    fn()
            except BaseException:
                try:
                    s.end_capture()
                except Exception:  # the capture is already invalid: the launch error is the one to see
                    pass
                raise
            return s.end_capture()

    # ---------------------------------------------------------------- ceilings

    def copy_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing]:
        try:
            return self._copy_ceiling(nbytes, **timing)
        finally:
            self.free()  # the buffers died with the call

    def _copy_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing]:
        cp = self.cp
        src = cp.ones(nbytes, dtype=cp.uint8)
        dst = cp.empty_like(src)
        t = self.time(lambda: cp.copyto(dst, src), **timing)
        return 2 * nbytes / t.median_s, replace(t, replay=_nothing)

    def stream_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing, str]:
        """The best of a few launch shapes of the streaming kernel (blocks per SM x threads)."""
        try:
            return self._stream_ceiling(nbytes, **timing)
        finally:
            self.free()

    def _stream_ceiling(self, nbytes: int, **timing: Any) -> tuple[float, Timing, str]:
        cp = self.cp
        kernel = self._stream
        if kernel is None:
            raise RuntimeError("the stream_read kernel did not compile (see the compile section)")
        n = nbytes // 16
        buf = cp.ones(n * 16, dtype=cp.uint8)
        out = cp.zeros(1, cp.uint32)
        best: tuple[float, Timing, str] | None = None
        args = (buf, np.uint64(n), np.uint32(0x9E3779B9), out)
        for per_sm, threads in ((4, 512), (8, 256), (16, 256)):
            grid = self.num_sms * per_sm

            def launch(g: int = grid, b: int = threads) -> None:
                kernel((g,), (b,), args)

            t = self.time(launch, **timing)
            bw = nbytes / t.median_s
            if best is None or bw > best[0]:
                best = (bw, replace(t, replay=_nothing), f"{grid} blocks x {threads} threads")
        assert best is not None
        return best

    def clocks_start(self) -> Any:
        from check_env import clocks_start

        return clocks_start()

    def clocks_finish(self, handle: Any) -> dict[str, str] | None:
        from check_env import clocks_finish

        return clocks_finish(handle)
