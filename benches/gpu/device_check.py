#!/usr/bin/env python3
"""The one device check of kvcore's CUDA kernels (H200), ready to run in a single call of a few minutes.

Steps (each prints a section; a JSON summary goes to ``--out``/device_check.json):
1. environment: GPU, driver, CuPy, NVRTC; whether a 13.x-NVRTC PTX loads (the PTX-version trap) and a
   cubin does;
2. the GPU tests (``tests/python/gpu``: each kernel against its NumPy reference), unless ``--skip-tests``;
3. the copy ceiling: device-to-device copy bandwidth (bytes read + written) on this machine;
4. paged decode bandwidth: B x L in {64 x 2k, 8 x 32k}, 8 kv heads, head_dim 128, G = 8, page size 16,
   bf16 and fp8 caches, pages scattered at random (working set 0.27-0.54 GB, far above the 60 MB L2).
   Effective bandwidth = K/V bytes read / kernel time; target >= 3.4 TB/s (80 % of the 4.3 TB/s copy);
5. gather/scatter of pages to/from pinned host memory (zero-copy kernel, and staging + one copy).

Usage (from the repository root, with the native module built for the device's Python or carried):
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 benches/gpu/device_check.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

RESULTS: dict[str, Any] = {}


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def import_kvcore() -> bool:
    """Import kvcore; without the native module, a stand-in lets the benchmarks (not the tests) run."""
    try:
        import kvcore  # noqa: F401

        return True
    except ImportError as e:
        print(
            f"kvcore native module unavailable ({e}); benchmarks only (carry python/kvcore/_kvcore.abi3.so)"
        )
        import types

        stub = types.ModuleType("kvcore._kvcore")
        for name in ("PageAllocator", "KVCacheManager"):
            setattr(stub, name, type(name, (), {}))
        stub.__version__ = "stub"  # type: ignore[attr-defined]
        sys.modules["kvcore._kvcore"] = stub
        return False


def environment() -> None:
    import cupy as cp
    import numpy as np

    section("environment")
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    info = {
        "gpu": props["name"].decode(),
        "compute_capability": dev.compute_capability,
        "sms": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "memory_bytes": props["totalGlobalMem"],
        "driver": cp.cuda.runtime.driverGetVersion(),
        "runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    try:
        from kvcore.kernels import _nvrtc

        info["nvrtc"] = _nvrtc.nvrtc_version()
    except Exception as e:  # reported, not fatal: the loader then falls back to CuPy's NVRTC
        info["nvrtc"] = f"unavailable: {e}"
    for k, v in info.items():
        print(f"{k:>20}: {v}")
    RESULTS["environment"] = info


def ptx_trap() -> None:
    """Does a PTX of this NVRTC load under this driver? (It should not if NVRTC is newer than the driver.)"""
    import cupy as cp

    section("PTX-version trap")
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        print("cuda.bindings missing: skipped")
        return
    src = b'extern "C" __global__ void probe(float* x) { x[threadIdx.x] += 1.0f; }\n'
    out: dict[str, str] = {}
    for target, kind in (("compute_90", "ptx"), ("sm_90", "cubin")):
        _, prog = nvrtc.nvrtcCreateProgram(src, b"probe.cu", 0, [], [])
        nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={target}".encode()])
        if kind == "ptx":
            size = nvrtc.nvrtcGetPTXSize(prog)[1]
            buf = b" " * size
            nvrtc.nvrtcGetPTX(prog, buf)
            version = next(
                (ln for ln in buf.decode(errors="replace").splitlines() if ln.startswith(".version")), "?"
            )
        else:
            size = nvrtc.nvrtcGetCUBINSize(prog)[1]
            buf = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, buf)
            version = "cubin"
        nvrtc.nvrtcDestroyProgram(prog)
        path = Path(f"/tmp/kvcore-probe.{kind}")
        path.write_bytes(buf.rstrip(b"\x00 ") + (b"\x00" if kind == "ptx" else b""))
        try:
            fn = cp.RawModule(path=str(path)).get_function("probe")
            x = cp.zeros(32, cp.float32)
            fn((1,), (32,), (x,))
            out[kind] = f"loads and runs ({version})"
        except Exception as e:
            out[kind] = f"FAILS ({version}): {type(e).__name__}: {e}"
        print(f"{kind:>6}: {out[kind]}")
    RESULTS["ptx_trap"] = out


def run_tests(timeout: int) -> None:
    section("GPU tests (tests/python/gpu, each kernel against its NumPy reference)")
    start = time.time()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "tests/python/gpu",
    ]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])
    )
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        print("\n".join(tail[-25:]))
        RESULTS["tests"] = {
            "returncode": proc.returncode,
            "summary": tail[-1] if tail else "",
            "seconds": time.time() - start,
        }
    except subprocess.TimeoutExpired:
        print(f"GPU tests stopped after {timeout} s")
        RESULTS["tests"] = {"returncode": None, "summary": f"timeout {timeout}s"}


def timed(fn: Any, iters: int, warmup: int = 3) -> float:
    """Seconds per call of ``fn()``: ``iters`` calls back to back between two CUDA events.

    Back to back keeps the GPU busy, so host-side launch overhead hides behind the previous call.
    """
    import cupy as cp

    for _ in range(warmup):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return float(cp.cuda.get_elapsed_time(start, stop)) / 1e3 / iters


def copy_ceiling() -> float:
    import cupy as cp

    section("copy ceiling (device-to-device, bytes read + written)")
    n = 2 << 30
    buffers = [cp.ones(n, dtype=cp.uint8), cp.empty(n, dtype=cp.uint8)]
    t = timed(lambda: cp.copyto(buffers[1], buffers[0]), 10)
    gbs = 2 * n / t / 1e9
    print(f"copy of {n / 2**30:.0f} GiB: {t * 1e3:.2f} ms -> {gbs:.0f} GB/s")
    buffers.clear()
    cp.get_default_memory_pool().free_all_blocks()
    RESULTS["copy_ceiling_gbs"] = gbs
    return gbs


def decode_bandwidth(ceiling: float) -> None:
    import cupy as cp
    import numpy as np

    from kvcore import kernels as K
    from kvcore.kernels.gpu import attention_launcher, occupancy
    from kvcore.pool import KVPool

    section("paged decode bandwidth (Hkv 8, head_dim 128, G 8, page 16)")
    H, D, P, G = 8, 128, 16, 8
    rows = []
    for B, L in ((64, 2048), (8, 32768)):
        for kv_dtype in ("bf16", "fp8"):
            num_pages = B * L // P + 1
            pool = KVPool(
                num_layers=1,
                num_pages=num_pages,
                num_kv_heads=H,
                head_dim=D,
                page_size=P,
                kv_dtype=kv_dtype,
                backend="cupy",
            )
            if kv_dtype == "bf16":  # bf16 patterns of values in [2^-7, 2): finite, no NaN
                pool.data[...] = cp.random.randint(0x3C00, 0x4000, pool.data.shape, dtype=cp.int32).astype(
                    cp.uint16
                )
            else:  # finite e4m3 patterns
                pool.data[...] = cp.random.randint(0, 0x77, pool.data.shape, dtype=cp.int32).astype(cp.uint8)
            rng = np.random.default_rng(0)
            pages = rng.permutation(np.arange(1, num_pages)).astype(np.int32)
            pt = (np.arange(0, B * L // P + 1, L // P, dtype=np.int32), pages, np.full(B, P, np.int32))
            q = cp.asarray(rng.normal(size=(B, H * G, D)).astype(np.float32)).astype(cp.float16)
            if kv_dtype == "bf16":
                from kvcore.pool import dtypes

                q = dtypes.float_to_bf16_bits(q.astype(cp.float32), cp)
            plan = K.plan_attention(
                pt, np.arange(B + 1), page_size=P, num_qo_heads=H * G, num_kv_heads=H, **occupancy(pool, q)
            )
            out = cp.empty_like(q)
            ref = K.paged_decode_attention(q, pool, 0, pt, plan=plan)  # the public path, once
            launch = attention_launcher(q, pool, 0, plan, 1 / D**0.5, out)
            t = timed(launch, 50)
            assert bool(cp.all(out == ref)), "launcher and public path disagree"
            kv_bytes = 2 * B * L * H * D * pool.storage_dtype.itemsize
            gbs = kv_bytes / t / 1e9
            row = {
                "B": B,
                "L": L,
                "kv_dtype": kv_dtype,
                "ms": t * 1e3,
                "kv_gb": kv_bytes / 1e9,
                "gbs": gbs,
                "of_ceiling": gbs / ceiling,
                "items": int(plan.items.shape[0]),
                "splits": int(plan.num_partials),
                "chunk_len": int(plan.chunk_lens.max()),
            }
            rows.append(row)
            print(
                f"B={B:3d} L={L:6d} {kv_dtype:>4}: {t * 1e3:7.3f} ms, K/V {kv_bytes / 1e9:.3f} GB "
                f"-> {gbs:6.0f} GB/s "
                f"({100 * gbs / ceiling:.0f} % of the {ceiling:.0f} GB/s copy; target 3400) "
                f"[{row['items']} blocks x {H} heads, chunk {row['chunk_len']}]",
                flush=True,
            )
            del pool
            cp.get_default_memory_pool().free_all_blocks()
    RESULTS["decode"] = rows


def offload_bandwidth() -> None:
    import cupy as cp
    import numpy as np

    from kvcore import kernels as K
    from kvcore.pool import KVPool

    section("gather / scatter of pages to pinned host memory")
    pool = KVPool(
        num_layers=8,
        num_pages=1025,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
        kv_dtype="bf16",
        backend="cupy",
    )
    ids = np.random.default_rng(1).permutation(np.arange(1, 1025))[:512].astype(np.int32)
    pinned = pool.host_buffer(512)
    staging = cp.empty(pinned.shape, dtype=pinned.dtype)
    nbytes = pinned.nbytes
    res = {}
    res["gather_zero_copy_gbs"] = nbytes / timed(lambda: K.gather_pages(pool, ids, pinned), 5) / 1e9
    res["gather_to_device_gbs"] = nbytes / timed(lambda: K.gather_pages(pool, ids, staging), 5) / 1e9
    res["d2h_copy_gbs"] = nbytes / timed(lambda: staging.get(out=pinned), 5) / 1e9
    res["scatter_zero_copy_gbs"] = nbytes / timed(lambda: K.scatter_pages(pool, ids, pinned), 5) / 1e9
    res["h2d_copy_gbs"] = nbytes / timed(lambda: staging.set(pinned), 5) / 1e9
    try:  # kvcore.tiers.HostTier (pinned slots) through its store/load, against the copies above
        from kvcore.tiers import HostTier

        host = HostTier(pool, 512)
        slots = np.arange(512, dtype=np.int32)
        keys = np.zeros((512, 16), dtype=np.uint8)
        toks = np.zeros((512, pool.page_size), dtype=np.uint32)
        names: list[str | None] = [None] * 512

        def store() -> None:
            assert host.store(pool, ids, slots, keys, keys, toks, names).all()
            cp.cuda.Device().synchronize()

        def load() -> None:
            assert host.load(pool, slots, ids, keys).all()
            cp.cuda.Device().synchronize()

        res["host_tier_store_gbs"] = nbytes / timed(store, 5) / 1e9
        res["host_tier_load_gbs"] = nbytes / timed(load, 5) / 1e9
        res["host_tier_store_vs_d2h"] = res["host_tier_store_gbs"] / res["d2h_copy_gbs"]
        res["host_tier_load_vs_h2d"] = res["host_tier_load_gbs"] / res["h2d_copy_gbs"]
    except Exception as e:  # one failure does not hide the other figures
        print(f"host tier: FAILED {type(e).__name__}: {e}")
        res["host_tier_error"] = f"{type(e).__name__}: {e}"
    for k, v in res.items():
        if isinstance(v, str):
            continue
        size = f"{nbytes / 2**20:.0f} MiB, 512 pages of {pool.page_bytes / 2**10:.0f} KiB"
        print(f"{k:>24}: {v:8.1f} GB/s   ({size})")
    RESULTS["offload"] = res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for device_check.json")
    ap.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    ap.add_argument("--test-timeout", type=int, default=300, help="seconds for the GPU tests")
    args = ap.parse_args()
    started = time.time()
    have_native = import_kvcore()
    from kvcore.pool._cupy import gpu_available

    if not gpu_available():
        print("no usable CUDA device (or no CuPy): nothing to check here")
        return 2
    environment()
    ptx_trap()
    if not args.skip_tests and have_native:
        run_tests(args.test_timeout)
    ceiling = copy_ceiling()
    for step in (lambda: decode_bandwidth(ceiling), offload_bandwidth):
        try:
            step()
        except Exception as e:  # report and go on: every figure that can be measured is worth having
            import traceback

            traceback.print_exc()
            RESULTS.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
    RESULTS["seconds"] = time.time() - started
    out = Path(args.out) / "device_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2, default=str))
    print(f"\nwrote {out} ({RESULTS['seconds']:.0f} s)")
    failed = RESULTS.get("errors") or (RESULTS.get("tests", {}).get("returncode") not in (0, None))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
