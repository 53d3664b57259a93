"""The correctness sweep: every kernel on the device against the NumPy reference, on the same pool contents.

Native-free: page tables are built here in NumPy (random, scattered page ids; the last page of a sequence
partly filled, its unused slots holding the fill pattern, which the kernels must not read), never by the
Rust manager. Each pool is written on the host through the reference ``append_kv`` (layer 1; layer 0 and
the unused pages keep the fill pattern, so a wrong layer or page offset shows), then copied to the device
with ``KVPool.to``; the device result is compared with the reference on the host pool.

What must agree, and how closely:
- ``append_kv``, ``copy_pages``, ``gather_pages``, ``scatter_pages``: bit for bit (the bytes of the pool or
  the buffer), 4 cache dtypes x 2 layouts (append: both activation types of 8-bit caches);
- decode (G in 1/4/8/32, page size 1 and 16, forced split-K and unsplit, HND and NHD, 4 cache dtypes) and
  prefill over a cached prefix (same grid): ``check_dense.ACT_TOLERANCE`` against the reference, and
  that plus 4e-3 against the dense float64 model of ``check_dense`` (the second opinion);
- the decode kernel variants (``kvcore.kernels.plan.DECODE_VARIANTS``: op "variant"), in a pass of their
  own after the benchmarks (``run_sweep(variants=True)``): every decode case of page size 16 again, on the
  same inputs, with a plan of each variant that has kernels for the cache, to the same tolerances (the
  reference and the dense model computed once per case for all its variants);
- the benchmark's fill kernel: the exact bits of ``check_backend.pattern_bits``, every value finite.

In the self-test the "device" is a NumPy pool too, so the reference meets itself (and the dense model is
the real check); fault injection (``--inject-fault``) proves a mismatch is caught.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from check_backend import Device, fill_pool_xp, pattern_bits
from check_dense import act_values, as_float, dense_attention, max_error, seq_kv, tolerance
from check_ledger import Ledger, short_error

SECTION = "sweep"


@dataclass(frozen=True)
class SweepShapes:
    """The sweep's grid (the device run's, or the self-test's tiny one)."""

    num_kv_heads: int  # kv heads of the attention pools
    head_dim: int  # 64 or 128 on the device
    groups: tuple[int, ...]  # G = query heads per kv head
    page_sizes: tuple[int, ...]  # tokens per page
    layouts: tuple[str, ...]  # "HND", "NHD"
    decode_lens: tuple[int, ...]  # kv_len of each decode sequence
    prefill_kv_lens: tuple[int, ...]  # kv_len of each prefill sequence (cached prefix + new tokens)
    prefill_q_lens: tuple[int, ...]  # new tokens of each (the first has no cached prefix)
    append_tokens: int  # rows written by each append_kv case


FULL = SweepShapes(
    num_kv_heads=2,
    head_dim=128,
    groups=(1, 4, 8, 32),
    page_sizes=(1, 16),
    layouts=("HND", "NHD"),
    decode_lens=(1, 37, 300, 1100),
    prefill_kv_lens=(45, 270, 50, 33),
    prefill_q_lens=(45, 20, 10, 1),
    append_tokens=50,
)
# The variants' second pass: their head_dim 64 kernels (and the 8-byte cp.async copies of 8-bit caches
# there), on fewer cases.
VARIANTS_D64 = SweepShapes(
    num_kv_heads=2,
    head_dim=64,
    groups=(1, 4),
    page_sizes=(16,),
    layouts=("HND", "NHD"),
    decode_lens=(37, 300),
    prefill_kv_lens=(45,),
    prefill_q_lens=(45,),
    append_tokens=20,
)
TINY = SweepShapes(
    num_kv_heads=2,
    head_dim=64,
    groups=(1, 4, 32),
    page_sizes=(1, 16),
    layouts=("HND", "NHD"),
    decode_lens=(1, 37, 130),
    prefill_kv_lens=(45, 70, 33),
    prefill_q_lens=(45, 10, 1),
    append_tokens=20,
)

KV_DTYPES = ("fp16", "bf16", "fp8", "int8")


def _acts(kv_dtype: str) -> tuple[str, ...]:
    """Activation types the kernels take for a cache: 16-bit caches their own, 8-bit ones either."""
    return (kv_dtype,) if kv_dtype in ("fp16", "bf16") else ("fp16", "bf16")


@dataclass
class _Case:
    op: str
    kv_dtype: str
    name: str
    status: str
    err: float | None = None  # max |device - reference| (None: compared bit for bit)
    tol: float | None = None
    dense_err: float | None = None  # max |device - dense model|
    dense_tol: float | None = None
    detail: str = ""


@dataclass
class _Table:
    stop_at: float = math.inf  # time.monotonic() past which no further group of cases starts
    cases: list[_Case] = field(default_factory=list)

    def add(self, ledger: Ledger, case: _Case) -> None:
        self.cases.append(case)
        ledger.ok(SECTION, case.name, case.status == "pass", case.detail)

    def out_of_time(self, ledger: Ledger, op: str, kv_dtype: str, name: str) -> bool:
        """Past :attr:`stop_at`, records ``name`` as not run (a failure) and returns True."""
        if time.monotonic() <= self.stop_at:
            return False
        why = "the sweep's time limit (--sweep-limit; for the variants' pass, the --deadline too)"
        case = _Case(op, kv_dtype, name, "not_run", detail=why)
        self.cases.append(case)
        ledger.record(SECTION, name, "not_run", case.detail)
        return True

    def summary_lines(self) -> list[str]:
        lines = [
            f"  {'op':<8} {'cache':<5} {'cases':>5} {'failed':>6}  {'max err (ref)':>13}  "
            f"{'max err (dense)':>15}  {'worst err/tol':>13}"
        ]
        keys = sorted({(c.op, c.kv_dtype) for c in self.cases}, key=lambda k: (_OPS.index(k[0]), k[1]))
        for op, dt in keys:
            mine = [c for c in self.cases if c.op == op and c.kv_dtype == dt]
            bad = sum(c.status != "pass" for c in mine)
            errs = [c.err for c in mine if c.err is not None]
            dens = [c.dense_err for c in mine if c.dense_err is not None]
            ratios = [c.err / c.tol for c in mine if c.err is not None and c.tol]
            ratios += [c.dense_err / c.dense_tol for c in mine if c.dense_err is not None and c.dense_tol]
            err = f"{max(errs):.2e}" if errs else "bit-exact"
            den = f"{max(dens):.2e}" if dens else "-"
            worst = f"{max(ratios):.2f}" if ratios else "-"
            lines.append(f"  {op:<8} {dt:<5} {len(mine):>5} {bad:>6}  {err:>13}  {den:>15}  {worst:>13}")
        return lines

    def full_text(self) -> str:
        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.2e}"

        out = [f"{'status':<6} {'case':<52} {'err':>9} {'tol':>9} {'dense':>9} {'tol':>9}  detail"]
        for c in self.cases:
            out.append(
                f"{c.status:<6} {c.name:<52} {f(c.err):>9} {f(c.tol):>9} {f(c.dense_err):>9} "
                f"{f(c.dense_tol):>9}  {c.detail}"
            )
        return "\n".join(out) + "\n"


_OPS = ("fill", "append", "attention", "decode", "variant", "prefill", "pages", "copy", "gather", "scatter")


def _same_bytes(a: np.ndarray, b: np.ndarray) -> tuple[bool, int]:
    """Bit-for-bit equality of two arrays of one dtype and shape, and the number of differing elements."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, -1
    ua = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1)
    ub = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1)
    diff = int((ua != ub).any(axis=1).sum())
    return diff == 0, diff


def _pool(
    kv_dtype: str, layout: str, *, layers: int, pages: int, heads: int, head_dim: int, page_size: int
) -> Any:
    from kvcore.pool import KVPool

    return KVPool(
        num_layers=layers,
        num_pages=pages,
        num_kv_heads=heads,
        head_dim=head_dim,
        page_size=page_size,
        kv_dtype=kv_dtype,
        layout=layout,  # type: ignore[arg-type]
        backend="numpy",
    )


# ------------------------------------------------------------------------------------ the fill pattern


def check_fill(dev: Device, ledger: Ledger, table: _Table, head_dim: int) -> None:
    """The benchmark fill: the device's bits are :func:`pattern_bits`, and every value is finite."""
    from kvcore.pool import dtypes

    for kv_dtype in KV_DTYPES:
        name = f"fill {kv_dtype} pattern (kernel = NumPy bits, all finite)"
        try:
            cpu = _pool(kv_dtype, "HND", layers=2, pages=9, heads=2, head_dim=head_dim, page_size=16)
            pool = cpu.to(dev.name)
            how = dev.fill(pool, 7)
            got = dev.asnumpy(pool.data).reshape(-1)
            bits = got.view(np.uint16 if got.dtype.itemsize == 2 else np.uint8)
            want = pattern_bits(0, bits.shape[0], 7, kv_dtype)
            same, diff = _same_bytes(bits, want)
            values = dtypes.decode(got.reshape(cpu.data.shape), kv_dtype, 1.0)
            finite = bool(np.isfinite(values).all())
            top = float(np.abs(values).max())
            ok = same and finite and 0.1 < top <= 127
            detail = f"{how}; {diff} elements differ; finite={finite}; max |x| {top:.3g}"
            table.add(ledger, _Case("fill", kv_dtype, name, "pass" if ok else "fail", detail=detail))
        except Exception as e:
            table.add(ledger, _Case("fill", kv_dtype, name, "fail", detail=short_error(e)))


# ------------------------------------------------------------------------------------ append_kv


def check_append(dev: Device, ledger: Ledger, table: _Table, shapes: SweepShapes) -> None:
    """append_kv bit-exact: strided k/v views, skipped (-1) slots, saturating values for 8-bit caches."""
    from kvcore import kernels as K
    from kvcore.pool import dtypes

    heads, pages, page_size, T = 4, 40, 16, shapes.append_tokens
    for kv_dtype in KV_DTYPES:
        for act in _acts(kv_dtype):
            for layout in shapes.layouts:
                name = f"append {kv_dtype} {layout} act={act}"
                try:
                    rng = np.random.default_rng(zlib.crc32(name.encode()))
                    cpu = _pool(
                        kv_dtype, layout, layers=2, pages=pages, heads=heads, head_dim=shapes.head_dim,
                        page_size=page_size,
                    )  # fmt: skip
                    fill_pool_xp(cpu, 3)
                    if dtypes.is_quantized(kv_dtype):
                        cpu.set_scales(1, rng.uniform(0.005, 0.02, heads), rng.uniform(0.005, 0.02, heads))
                    pool = cpu.to(dev.name)
                    before = cpu.data.copy()
                    qkv = act_values(3 * rng.normal(size=(T, 3 * heads, shapes.head_dim)), act)
                    slots = rng.permutation(np.arange(page_size, pages * page_size))[:T].astype(np.int64)
                    slots[[1, T // 2]] = -1
                    K.append_kv(cpu, 1, slots, qkv[:, heads : 2 * heads], qkv[:, 2 * heads :])
                    qkv_d = dev.asarray(qkv)  # k and v as strided views, on both sides
                    K.append_kv(
                        pool, 1, dev.asarray(slots), qkv_d[:, heads : 2 * heads], qkv_d[:, 2 * heads :]
                    )
                    got = dev.fetch(pool.data, "append")
                    same, diff = _same_bytes(got, cpu.data)
                    wrote = not _same_bytes(before, cpu.data)[0]  # a case that writes nothing proves nothing
                    status = "pass" if same and wrote else "fail"
                    detail = f"{diff} elements differ" if not same else ("" if wrote else "nothing written")
                    table.add(ledger, _Case("append", kv_dtype, name, status, detail=detail))
                except Exception as e:
                    table.add(ledger, _Case("append", kv_dtype, name, "fail", detail=short_error(e)))


# ------------------------------------------------------------------------------------ attention


@dataclass
class _SeqPool:
    """A host pool holding a batch's K/V in layer 1, its page table, and each sequence's dense K/V."""

    cpu: Any  # KVPool (numpy)
    page_table: tuple[np.ndarray, np.ndarray, np.ndarray]  # kv_indptr [B+1], kv_indices [nnz], last [B]
    kv: list[tuple[np.ndarray, np.ndarray]]  # per sequence: K, V float32 [Hkv, kv_len, D]
    act: str  # activation type the K/V were written with


def _seq_pool(
    rng: np.random.Generator,
    kv_dtype: str,
    page_size: int,
    layout: str,
    lens: tuple[int, ...],
    shapes: SweepShapes,
) -> _SeqPool:
    from kvcore import kernels as K
    from kvcore.pool import dtypes

    H, D = shapes.num_kv_heads, shapes.head_dim
    lens_a = np.asarray(lens, dtype=np.int64)
    per_seq = -(-lens_a // page_size)
    total = int(per_seq.sum())
    num_pages = total + 4  # the null page, the sequences' pages, spares holding the fill pattern
    cpu = _pool(kv_dtype, layout, layers=2, pages=num_pages, heads=H, head_dim=D, page_size=page_size)
    fill_pool_xp(cpu, int(rng.integers(1 << 30)))
    cpu.data[:, :, 0] = 0  # the null page stays zero
    ids = rng.permutation(np.arange(1, num_pages))[:total].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(per_seq)]).astype(np.int32)
    last = (lens_a - (per_seq - 1) * page_size).astype(np.int32)
    tok_page = np.concatenate([ids[indptr[b] + np.arange(n) // page_size] for b, n in enumerate(lens)])
    tok_off = np.concatenate([np.arange(n) % page_size for n in lens])
    slots = tok_page.astype(np.int64) * page_size + tok_off
    act = kv_dtype if kv_dtype in ("fp16", "bf16") else "fp16"
    k = act_values(rng.normal(size=(slots.shape[0], H, D)), act)
    v = act_values(rng.normal(size=(slots.shape[0], H, D)), act)
    if dtypes.is_quantized(kv_dtype):
        cpu.calibrate_scales(1, k, v)
        cpu.set_scales(0, 0.5, 0.25)  # another layer's scales: reading them would show
    K.append_kv(cpu, 1, slots, k, v)
    host = Device()
    kv = [seq_kv(host, cpu, 1, ids[indptr[b] : indptr[b + 1]], n) for b, n in enumerate(lens)]
    return _SeqPool(cpu, (indptr, ids, last), kv, act)


def _plan(
    sp: _SeqPool,
    q_indptr: np.ndarray,
    page_size: int,
    hq: int,
    hkv: int,
    split: bool,
    variant: str = "default",
) -> Any:
    """A plan with split-K forced (64-key chunks) or forced off (one chunk per sequence); checked."""
    from kvcore.kernels import plan_attention

    longest = int(max(np.diff(sp.page_table[0]).max() * page_size, 64))
    chunk = 64 if split else math.ceil(longest / 64) * 64
    plan = plan_attention(
        sp.page_table,
        q_indptr,
        page_size=page_size,
        num_qo_heads=hq,
        num_kv_heads=hkv,
        chunk_len=chunk,
        variant=variant,
    )
    merges = int(plan.merges.shape[0])
    if split != (merges > 0):
        raise AssertionError(f"plan has {merges} merges with split={'forced' if split else 'off'}")
    return plan


def _attention_case(
    dev: Device,
    ledger: Ledger,
    table: _Table,
    *,
    op: str,
    sp: _SeqPool,
    pool: Any,
    name: str,
    act: str,
    q: np.ndarray,
    q_indptr: np.ndarray,
    plan: Any,
    memo: dict[str, Any] | None = None,
) -> None:
    """One case against the reference and the dense model; ``memo`` keeps both for the same case run again
    with another kernel variant (the plan's ``variant``; the reference ignores it: the same partition)."""
    from kvcore import kernels as K

    memo = {} if memo is None else memo
    scale = 1 / math.sqrt(q.shape[-1])
    pt = sp.page_table
    if op == "decode":
        if "ref" not in memo:
            memo["ref"] = K.paged_decode_attention(q, sp.cpu, 1, pt, plan=plan)
        out = K.paged_decode_attention(dev.asarray(q), pool, 1, pt, plan=plan)
    else:
        if "ref" not in memo:
            memo["ref"] = K.paged_prefill_attention(q, sp.cpu, 1, pt, q_indptr, plan=plan)
        out = K.paged_prefill_attention(dev.asarray(q), pool, 1, pt, q_indptr, plan=plan)
    tag = op if plan.variant == "default" else "variant"
    got = as_float(dev.fetch(out, tag))
    want = as_float(memo["ref"])
    err, tol = max_error(got, want), tolerance(act, want, dense=False)
    if "dense" not in memo:  # per sequence: (rows of q, the dense model)
        memo["dense"] = [
            (
                int(q_indptr[b]),
                int(q_indptr[b + 1]),
                dense_attention(as_float(q[q_indptr[b] : q_indptr[b + 1]]), *sp.kv[b], scale),
            )
            for b in range(q_indptr.shape[0] - 1)
            if q_indptr[b + 1] > q_indptr[b]
        ]
    dense_err, dense_tol = 0.0, 0.0
    for q0, q1, d in memo["dense"]:
        dense_err = max(dense_err, max_error(got[q0:q1], d))
        dense_tol = max(dense_tol, tolerance(act, d, dense=True))
    ok = err <= tol and dense_err <= dense_tol and out.dtype == q.dtype and tuple(out.shape) == q.shape
    detail = "" if ok else f"err {err:.2e} (tol {tol:.1e}), dense {dense_err:.2e} (tol {dense_tol:.1e})"
    status = "pass" if ok else "fail"
    table.add(ledger, _Case(tag, sp.cpu.kv_dtype, name, status, err, tol, dense_err, dense_tol, detail))


def check_attention(
    dev: Device, ledger: Ledger, table: _Table, shapes: SweepShapes, *, variants: bool = False
) -> None:
    """Decode and prefill over every (cache, page size, layout, G, split) of the grid with the default
    kernel; or (``variants``) the decode cases with pages of 16 keys again, on the same inputs (seeded per
    case), with every other kernel variant that has kernels for the cache. The variants run in a pass of
    their own, after every default check: a variant kernel that faults leaves the CUDA context unusable."""
    from kvcore.kernels._nvrtc import DECODE_VARIANTS

    H, D = shapes.num_kv_heads, shapes.head_dim
    for kv_dtype in KV_DTYPES:
        kernels: tuple[str, ...] = ("default",)
        if variants:
            kernels = tuple(v.name for v in DECODE_VARIANTS.values() if kv_dtype in v.caches)[1:]
        for page_size in shapes.page_sizes:
            for layout in shapes.layouts:
                for op, lens in (("decode", shapes.decode_lens), ("prefill", shapes.prefill_kv_lens)):
                    if variants and (op != "decode" or page_size < 16):
                        continue
                    base = f"{op} {kv_dtype} {layout} ps{page_size}"
                    # the variants' names say the head_dim (they run at 128 and at 64); the seed is the
                    # default case's, so a variant sees the inputs its default case saw
                    tag = f"{base} d{D}" if variants else base
                    group = f"{tag} (every G, split and whole{'; every variant' if variants else ''})"
                    if table.out_of_time(ledger, "variant" if variants else op, kv_dtype, group):
                        continue
                    rng = np.random.default_rng(zlib.crc32(base.encode()))
                    try:
                        sp = _seq_pool(rng, kv_dtype, page_size, layout, lens, shapes)
                        pool = sp.cpu.to(dev.name)
                    except Exception as e:
                        table.add(ledger, _Case(op, kv_dtype, f"{tag} (pool)", "fail", detail=short_error(e)))
                        continue
                    q_lens = [1] * len(lens) if op == "decode" else list(shapes.prefill_q_lens)
                    q_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
                    for G in shapes.groups:
                        # 8-bit caches take both activation types: alternate them over G
                        act = sp.act if kv_dtype in ("fp16", "bf16") else ("fp16" if G in (1, 8) else "bf16")
                        q = act_values(rng.normal(size=(int(q_indptr[-1]), H * G, D)), act)
                        for split in (True, False):
                            name = f"{tag} G{G} {'split' if split else 'whole'} act={act}"
                            memo: dict[str, Any] = {}
                            for variant in kernels:
                                vname = name if variant == "default" else f"{name} variant={variant}"
                                try:
                                    plan = _plan(sp, q_indptr, page_size, H * G, H, split, variant)
                                    _attention_case(
                                        dev, ledger, table, op=op, sp=sp, pool=pool, name=vname, act=act,
                                        q=q, q_indptr=q_indptr, plan=plan, memo=memo,
                                    )  # fmt: skip
                                except Exception as e:
                                    vop = op if variant == "default" else "variant"
                                    table.add(
                                        ledger, _Case(vop, kv_dtype, vname, "fail", detail=short_error(e))
                                    )


# ------------------------------------------------------------------------------------ page copies


def check_pages(dev: Device, ledger: Ledger, table: _Table, shapes: SweepShapes) -> None:
    """copy_pages over every cache and layout; gather/scatter to pinned, pageable and device buffers."""
    from kvcore import kernels as K

    def pools(kv_dtype: str, layout: str) -> tuple[Any, Any]:
        cpu = _pool(kv_dtype, layout, layers=3, pages=30, heads=2, head_dim=shapes.head_dim, page_size=16)
        fill_pool_xp(cpu, 11)
        return cpu, cpu.to(dev.name)

    pairs = np.array([[3, 7], [5, 1], [3, 2], [29, 11]], np.int32)
    for kv_dtype in KV_DTYPES:
        for layout in shapes.layouts:
            name = f"copy {kv_dtype} {layout}"
            try:
                cpu, pool = pools(kv_dtype, layout)
                K.copy_pages(cpu, pairs)
                K.copy_pages(pool, pairs)
                same, diff = _same_bytes(dev.fetch(pool.data, "pages"), cpu.data)
                table.add(ledger, _Case("copy", kv_dtype, name, "pass" if same else "fail",
                                        detail="" if same else f"{diff} elements differ"))  # fmt: skip
            except Exception as e:
                table.add(ledger, _Case("copy", kv_dtype, name, "fail", detail=short_error(e)))
    ids = np.array([6, 2, 25, 13], np.int32)
    target = np.array([1, 8, 3, 29], np.int32)
    for kv_dtype, layout in (("bf16", "HND"), ("fp8", "NHD")):
        for where in ("pinned", "pageable", "device"):
            tag = f"{kv_dtype} {layout} {where}"
            try:
                cpu, pool = pools(kv_dtype, layout)
                ref = K.gather_pages(cpu, ids, cpu.host_buffer(4))
                buf: Any = {
                    "pinned": pool.host_buffer(4),
                    "pageable": np.empty_like(ref),
                    "device": dev.xp.empty(ref.shape, dtype=ref.dtype),
                }[where]
                got = K.gather_pages(pool, ids, buf)
                same, diff = _same_bytes(dev.fetch(got, "pages"), ref)
                same = same and got is buf
                table.add(ledger, _Case("gather", kv_dtype, f"gather {tag}", "pass" if same else "fail",
                                        detail="" if same else f"{diff} elements differ"))  # fmt: skip
                K.scatter_pages(cpu, target, ref)
                K.scatter_pages(pool, target, buf)
                same, diff = _same_bytes(dev.fetch(pool.data, "pages"), cpu.data)
                table.add(ledger, _Case("scatter", kv_dtype, f"scatter {tag}", "pass" if same else "fail",
                                        detail="" if same else f"{diff} elements differ"))  # fmt: skip
            except Exception as e:
                table.add(
                    ledger, _Case("gather", kv_dtype, f"gather/scatter {tag}", "fail", detail=short_error(e))
                )


# ------------------------------------------------------------------------------------ the sweep


def run_sweep(
    dev: Device, ledger: Ledger, shapes: SweepShapes, out_dir: Path, limit_s: float, *, variants: bool = False
) -> None:
    """Every check of the sweep; prints the summary table, writes the full one to ``sweep.txt``.

    ``variants``: the kernel variants' pass instead (op "variant", see :func:`check_attention`), run after
    the benchmarks; its cases join the sweep's in the JSON and in ``sweep.txt``.

    A group of cases not started within ``limit_s`` seconds is recorded as not run (a failure), so a slow
    sweep cannot eat the benchmarks' time.
    """
    table = _Table(stop_at=time.monotonic() + limit_s)
    steps: tuple[tuple[str, Callable[[], None]], ...] = (
        ("fill", lambda: check_fill(dev, ledger, table, shapes.head_dim)),
        ("append", lambda: check_append(dev, ledger, table, shapes)),
        ("attention", lambda: check_attention(dev, ledger, table, shapes)),
        ("pages", lambda: check_pages(dev, ledger, table, shapes)),
    )
    if variants:
        steps = (("variant", lambda: check_attention(dev, ledger, table, shapes, variants=True)),)
    try:
        for name, step in steps:
            if not table.out_of_time(ledger, name, "-", f"{name} (every case)"):
                step()
    finally:
        with (out_dir / "sweep.txt").open("a" if variants else "w") as f:
            f.write(table.full_text())
        doc = ledger.results.setdefault("sweep", {"cases": [], "shapes": shapes.__dict__})
        if not variants:
            doc["cases"] = []
        doc["cases"] += [c.__dict__ for c in table.cases]
        print("\n".join(table.summary_lines()))
        bad = [c for c in table.cases if c.status != "pass"]
        groups: dict[tuple[str, str], list[_Case]] = {}  # one line per distinct reason (a compile error
        for c in bad:  # fails every case the same way)
            groups.setdefault((c.status, c.detail), []).append(c)
        for (status, detail), cases in list(groups.items())[:15]:
            more = f" (and {len(cases) - 1} more)" if len(cases) > 1 else ""
            print(f"  {status.upper().replace('_', ' ')} {cases[0].name}{more}: {detail[:140]}")
        if len(groups) > 15:
            print(f"  ... {len(groups) - 15} more distinct failures in sweep.txt")
        print(f"  ({len(table.cases)} cases; every case in {out_dir / 'sweep.txt'})")
