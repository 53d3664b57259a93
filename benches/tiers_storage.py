"""Throughput of the lower tiers' storage against the plain copy of the same bytes, in the same run.

Run: ``.venv/bin/python benches/tiers_storage.py [--pages 1000] [--repeats 5] [--dir /var/tmp/x]``

Rows (median of ``--repeats``, GB/s of page payload, ratio to the baseline measured just before):

- host store / load: ``HostTier.store`` / ``load`` of ``--pages`` pages (scattered page ids and slots,
  and one contiguous run) against ``np.copyto`` of one contiguous buffer of the same bytes (targets: >=
  0.80 of it).
- disk write / read: ``DiskTier.store`` / ``load`` (one file per page, checksums, atomic rename)
  against a plain sequential ``write`` / ``readinto`` of the same bytes to/from one file (target: >=
  0.70). Before every read, both sides' files are fsynced and dropped from the page cache with
  ``posix_fadvise(POSIX_FADV_DONTNEED)``, so reads come from the device; writes go to the page cache
  (no fsync inside the timing, on either side).

Geometry: 8 layers, 8 kv heads, 16 tokens, head_dim 128, bf16 = 0.5 MiB pages (override with flags).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcore.pool import KVPool
from kvcore.tiers import DiskTier, HostTier
from kvcore.tiers.disk import slot_filename


def _paired(
    op: Callable[[], object],
    base: Callable[[], object],
    repeats: int,
    before_op: Callable[[], object] | None = None,
    before_base: Callable[[], object] | None = None,
) -> tuple[float, float, float]:
    """``(median op seconds, median baseline seconds, median of per-repeat baseline/op ratios)``.

    Each repeat times the baseline then the operation back to back, so drifts of a shared machine
    (other tenants, the page cache, writeback) hit both sides of a ratio alike.
    """
    t_op, t_base, ratio = [], [], []
    for _ in range(repeats):
        for fn, before, out in ((base, before_base, t_base), (op, before_op, t_op)):
            if before is not None:
                before()
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        ratio.append(t_base[-1] / t_op[-1])
    return statistics.median(t_op), statistics.median(t_base), statistics.median(ratio)


def _drop_cache(paths: list[str]) -> None:
    """fsync then POSIX_FADV_DONTNEED every file: the next read comes from the device."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _rows(name: str, base_name: str, nbytes: int, timing: tuple[float, float, float]) -> None:
    t_op, t_base, ratio = timing
    print(f"{base_name:<46} {t_base * 1e3:8.1f} ms {nbytes / t_base / 1e9:7.2f} GB/s")
    print(f"{name:<46} {t_op * 1e3:8.1f} ms {nbytes / t_op / 1e9:7.2f} GB/s   {ratio:5.2f}")


@dataclass
class _Batch:
    """What every timed call stores or loads (n pages)."""

    keys: np.ndarray  # uint8 [n, 16]
    parents: np.ndarray  # uint8 [n, 16]
    tokens: np.ndarray  # uint32 [n, page_size]
    namespaces: list[str | None]  # [n]
    pages: np.ndarray  # int32 [n] scattered page ids (a permutation of 1..n)
    slots: np.ndarray  # int32 [n] scattered slots (a permutation of 0..n-1)


def bench_host(pool: KVPool, b: _Batch, repeats: int) -> None:
    n = b.pages.shape[0]
    nbytes = n * pool.page_bytes
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    host = HostTier(pool, n)
    print(f"\n{'host tier':<46} {'time':>11} {'rate':>12}   ratio to the baseline above")
    memcpy = "  np.copyto, one contiguous buffer (baseline)"
    run_pages = np.arange(1, n + 1, dtype=np.int32)
    run_slots = np.arange(n, dtype=np.int32)
    for label, pages, slots in (("scattered", b.pages, b.slots), ("one run", run_pages, run_slots)):
        timing = _paired(
            lambda p=pages, s=slots: host.store(pool, p, s, b.keys, b.parents, b.tokens, b.namespaces),
            lambda: np.copyto(dst, src),
            repeats,
        )
        _rows(f"HostTier.store, {label} pages/slots", memcpy, nbytes, timing)
        timing = _paired(
            lambda p=pages, s=slots: host.load(pool, s, p, b.keys), lambda: np.copyto(dst, src), repeats
        )
        _rows(f"HostTier.load, {label} pages/slots", memcpy, nbytes, timing)


def bench_disk(pool: KVPool, b: _Batch, repeats: int, root: str) -> None:
    n = b.pages.shape[0]
    nbytes = n * pool.page_bytes
    plain = os.path.join(root, "plain.bin")
    buf = np.random.default_rng(1).integers(0, 256, size=nbytes, dtype=np.uint8)
    back = np.zeros_like(buf)

    def plain_write() -> None:
        with open(plain, "wb", buffering=0) as f:
            f.write(memoryview(buf))

    def plain_read() -> None:
        with open(plain, "rb", buffering=0) as f:
            f.readinto(memoryview(back))

    tier_dir = os.path.join(root, "tier")
    with DiskTier(tier_dir, n * (pool.page_bytes + 8192), pool) as disk:
        files = [os.path.join(tier_dir, slot_filename(int(s))) for s in b.slots]
        print(f"\n{f'disk tier (files of {disk.file_bytes} B)':<46} {'time':>11} {'rate':>12}   ratio")
        print(
            "(writes: into the page cache, no fsync inside the timing on either side, os.sync() before each;"
        )
        print(" cold reads: the files fsynced, then dropped with POSIX_FADV_DONTNEED before each read)")

        def store() -> None:
            ok = disk.store(pool, b.pages, b.slots, b.keys, b.parents, b.tokens, b.namespaces)
            assert ok.all(), disk.stats()

        def load() -> None:
            ok = disk.load(pool, b.slots, b.pages, b.keys)
            assert ok.all(), disk.stats()

        store()  # the files exist before the first timed store, as the plain file does
        timing = _paired(store, plain_write, repeats, before_op=os.sync, before_base=os.sync)
        _rows("DiskTier.store, scattered pages/slots", "  plain write, one file (baseline)", nbytes, timing)
        timing = _paired(
            load,
            plain_read,
            repeats,
            before_op=lambda: _drop_cache(files),
            before_base=lambda: _drop_cache([plain]),
        )
        assert np.array_equal(buf, back)
        _rows("DiskTier.load, scattered, cold", "  plain readinto, one file, cold (baseline)", nbytes, timing)
        row = np.zeros(disk.file_bytes, dtype=np.uint8)

        def bare_reads() -> None:  # what one file per page costs on this device, before any check
            for path in files:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.readv(fd, [row.data])
                finally:
                    os.close(fd)

        timing = _paired(
            bare_reads,
            plain_read,
            repeats,
            before_op=lambda: _drop_cache(files),
            before_base=lambda: _drop_cache([plain]),
        )
        _rows(
            "  (bare open+readv of the same files, cold)",
            "  plain readinto, one file, cold (baseline)",
            nbytes,
            timing,
        )
        timing = _paired(load, plain_read, repeats)
        _rows("DiskTier.load, scattered, warm", "  plain readinto, one file, warm (baseline)", nbytes, timing)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv-dtype", default="bf16")
    ap.add_argument(
        "--dir", default=None, help="parent directory of the disk rows' files (default: the temp dir)"
    )
    ap.add_argument("--skip-disk", action="store_true")
    ap.add_argument("--skip-host", action="store_true")
    args = ap.parse_args()

    n = args.pages
    pool = KVPool(
        num_layers=args.layers,
        num_pages=n + 1,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        page_size=args.page_size,
        kv_dtype=args.kv_dtype,
    )
    rng = np.random.default_rng(0)
    raw = pool.data.reshape(-1).view(np.uint8)
    raw[:] = rng.integers(0, 256, size=raw.shape[0], dtype=np.uint8)
    print(
        f"geometry: {args.layers} layers x {args.kv_heads} kv heads x {args.page_size} tokens x "
        f"{args.head_dim} head_dim, {pool.kv_dtype}: page {pool.page_bytes / 2**20:.3f} MiB; "
        f"{n} pages = {n * pool.page_bytes / 2**20:.0f} MiB; median of {args.repeats}; "
        "rates are page bytes per second"
    )
    batch = _Batch(
        keys=rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        parents=rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        tokens=rng.integers(0, 2**32, size=(n, args.page_size), dtype=np.uint32),
        namespaces=[None] * n,
        pages=rng.permutation(np.arange(1, n + 1)).astype(np.int32),
        slots=rng.permutation(n).astype(np.int32),
    )
    if not args.skip_host:
        bench_host(pool, batch, args.repeats)
    if not args.skip_disk:
        root = tempfile.mkdtemp(prefix="kvcore-tiers-bench-", dir=args.dir)
        try:
            bench_disk(pool, batch, args.repeats, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
