"""The benchmarks: bandwidth ceilings, paged decode at Llama-3.1-8B shapes, offload to pinned memory.

Every benchmark row is its own try/except (one failure costs that row only, and counts as a failure),
checks the deadline first (a row that does not fit is "not run", a failure too), and rewrites the JSON
after it. Each attention row also checks what it timed:

- the timed batch (graph or plain launches) is replayed into an output poisoned with NaN, and must equal,
  bit for bit, the public ``paged_decode_attention`` on the same plan, with every row finite;
- for a few sequences (first, middle, last) the output is compared with the dense float64 model of
  ``check_dense``, computed from the dequantized pages of those sequences only (nothing else is copied to
  the host).

Timing (``check_backend.Device.time``): >= 200 ms of warm-up, then 7 batches of >= 25 ms timed with CUDA
events; median and min/max per call. Calls under 1 ms are replayed from a CUDA graph (plain launches,
with a note, if capture fails). Effective bandwidth = K/V bytes read / time per call, against the copy
ceiling (device-to-device, bytes read + written) and the read ceiling (a 16-byte streaming kernel). Per
row: CTAs (plan items x kv heads), CTAs per SM (occupancy API) and waves = CTAs / (SMs x CTAs per SM).
The working set is far above the L2 (50-60 MB) except the smallest rows, flagged "L2?".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from check_backend import Device
from check_dense import act_values, as_float, dense_attention, max_error, seq_kv, tolerance
from check_ledger import Budget, Ledger, short_error

SECTION = "bench"


@dataclass(frozen=True)
class BenchRow:
    """One decode benchmark: a batch of ``batch`` sequences of ``kv_len`` keys each."""

    kv_dtype: str  # "bf16", "fp8", "int8"
    layout: str  # "HND" or "NHD"
    batch: int
    kv_len: int  # a multiple of the page size (every page full)
    # also time every kernel variant with kernels for this cache (kvcore.kernels.plan.DECODE_VARIANTS) on
    # the same pool, after the default kernel: side by side, to choose the default
    variants: bool = False

    @property
    def name(self) -> str:
        return f"decode {self.kv_dtype} {self.layout} B={self.batch} L={self.kv_len}"


def variant_name(row: BenchRow, variant: str) -> str:
    """The ledger name of one variant's measurement of a row (the default keeps the row's name)."""
    return row.name if variant == "default" else f"{row.name} variant={variant}"


def row_variants(row: BenchRow) -> tuple[str, ...]:
    """The kernels a row times: "default", then (``row.variants``) every variant for its cache."""
    from kvcore.kernels._nvrtc import DECODE_VARIANTS

    if not row.variants:
        return ("default",)
    return tuple(v.name for v in DECODE_VARIANTS.values() if row.kv_dtype in v.caches)


@dataclass(frozen=True)
class BenchShapes:
    """The benchmark grid and its timing (the device run's, or the self-test's tiny one)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    act: str  # activation type of q / out ("bf16")
    rows: tuple[BenchRow, ...]
    ceiling_bytes: int  # buffer of the copy and streaming ceilings
    offload: tuple[int, int, int]  # (num_layers, num_pages, pages moved) of the offload pool
    warmup_s: float
    min_batch_s: float
    batches: int
    graph_below_s: float  # calls shorter than this are timed from a CUDA graph
    q_gain: float  # query scale: scores of std ~3.7, so each output depends on a few keys of its sequence
    min_row_s: float  # a row is only started with at least max(this, 1.5 x the slowest row) left
    targets: bool  # evaluate the device targets (Llama shapes only)


def llama_rows() -> tuple[BenchRow, ...]:
    """The targets first (so a tight deadline still measures them), then the grid, then 32k contexts."""
    first = [BenchRow(dt, "HND", 128, 4096, variants=True) for dt in ("bf16", "fp8", "int8")] + [
        BenchRow("bf16", "NHD", 128, 4096)
    ]
    grid = [
        BenchRow(dt, "HND", b, n)
        for dt in ("bf16", "fp8", "int8")
        for b in (64, 128, 256)
        for n in (1024, 4096, 16384)
    ]
    long = [BenchRow(dt, "HND", b, 32768) for dt in ("bf16", "fp8", "int8") for b in (1, 8)]
    firsts = {(r.kv_dtype, r.layout, r.batch, r.kv_len) for r in first}
    rest = [r for r in grid if (r.kv_dtype, r.layout, r.batch, r.kv_len) not in firsts]
    return tuple(first + rest + long)


LLAMA = BenchShapes(
    num_qo_heads=32,
    num_kv_heads=8,
    head_dim=128,
    page_size=16,
    act="bf16",
    rows=llama_rows(),
    ceiling_bytes=2 << 30,
    offload=(8, 1025, 512),
    warmup_s=0.2,
    min_batch_s=0.025,
    batches=7,
    graph_below_s=1e-3,
    q_gain=3.0,
    min_row_s=3.0,
    targets=True,
)
TINY = BenchShapes(
    num_qo_heads=8,
    num_kv_heads=2,
    head_dim=64,
    page_size=16,
    act="bf16",
    rows=(
        BenchRow("bf16", "HND", 2, 64, variants=True),
        BenchRow("fp8", "HND", 3, 128, variants=True),
        BenchRow("int8", "NHD", 2, 256),
        BenchRow("bf16", "HND", 1, 512),
    ),
    ceiling_bytes=8 << 20,
    offload=(2, 65, 32),
    warmup_s=0.002,
    min_batch_s=0.001,
    batches=5,
    graph_below_s=1e-3,
    q_gain=3.0,
    min_row_s=0.0,
    targets=False,
)

# Device targets (the issue): bf16 at B=128 x 4k >= 3.4 TB/s; fp8 there >= 80 % of the read ceiling.
BF16_TARGET_TBS = 3.4
FP8_TARGET_OF_READ = 0.8


def _timing_kwargs(shapes: BenchShapes, *, graph: bool) -> dict[str, Any]:
    return {
        "warmup_s": shapes.warmup_s,
        "min_batch_s": shapes.min_batch_s,
        "batches": shapes.batches,
        "graph_below_s": shapes.graph_below_s if graph else 0.0,
    }


def _fits(ledger: Ledger, budget: Budget, name: str, estimate: float) -> bool:
    """Whether ``estimate`` seconds are left before the deadline; records "not run" (a failure) if not."""
    left = budget.before_deadline()
    if left >= estimate:
        return True
    ledger.record(SECTION, name, "not_run", f"deadline: {left:.0f} s left, needs ~{estimate:.0f} s")
    print(f"  NOT RUN {name}: deadline ({left:.0f} s left, needs ~{estimate:.0f} s)")
    return False


# ------------------------------------------------------------------------------------ ceilings


def ceilings(dev: Device, ledger: Ledger, budget: Budget, shapes: BenchShapes) -> dict[str, float]:
    """The copy and read ceilings in bytes per second (a ceiling that failed is left out)."""
    out: dict[str, float] = {}
    gib = shapes.ceiling_bytes / 2**30
    kw = _timing_kwargs(shapes, graph=False)
    if _fits(ledger, budget, "copy ceiling", 2.0):
        try:
            bps, t = dev.copy_ceiling(shapes.ceiling_bytes, **kw)
            out["copy"] = bps
            ledger.ok(SECTION, "copy ceiling", True, f"{bps / 1e12:.3f} TB/s")
            print(
                f"  copy (device to device, read + write), {gib:.2f} GiB: {t.median_s * 1e3:.3f} ms "
                f"[{t.min_s * 1e3:.3f}-{t.max_s * 1e3:.3f}] -> {bps / 1e12:.3f} TB/s"
            )
        except Exception as e:
            ledger.ok(SECTION, "copy ceiling", False, short_error(e))
            print(f"  copy ceiling: FAILED {ledger.checks[-1].detail}")
    if _fits(ledger, budget, "read ceiling", 3.0):
        try:
            bps, t, shape = dev.stream_ceiling(shapes.ceiling_bytes, **kw)
            out["read"] = bps
            ledger.ok(SECTION, "read ceiling", True, f"{bps / 1e12:.3f} TB/s ({shape})")
            print(
                f"  read (16-byte streaming loads, {shape}), {gib:.2f} GiB: {t.median_s * 1e3:.3f} ms "
                f"[{t.min_s * 1e3:.3f}-{t.max_s * 1e3:.3f}] -> {bps / 1e12:.3f} TB/s"
            )
        except Exception as e:
            ledger.ok(SECTION, "read ceiling", False, short_error(e))
            print(f"  read ceiling: FAILED {ledger.checks[-1].detail}")
    ledger.results["ceilings"] = {k: v / 1e12 for k, v in out.items()}
    return out


# ------------------------------------------------------------------------------------ decode rows


def _scales(kv_dtype: str, heads: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-head scales (distinct per head, so a wrong head's scale shows), dequantized values O(1)."""
    base = {"fp8": 1.0, "int8": 1 / 64}.get(kv_dtype)
    if base is None:
        return None
    h = np.arange(heads, dtype=np.float32)
    return (base * (1 + 0.1 * h)).astype(np.float32), (base * (1.2 - 0.05 * h)).astype(np.float32)


def attention_row(
    dev: Device,
    row: BenchRow,
    shapes: BenchShapes,
    ceiling: dict[str, float],
    variants: tuple[str, ...] = ("default",),
) -> list[dict[str, Any]]:
    """Measure and check one decode row, once per kernel of ``variants`` (names of :func:`row_variants`),
    all on the same pool and queries (the same for every call: the fill and the queries are seeded by the
    row); returns their JSON records (``ok`` and ``problems`` included)."""
    from kvcore import kernels as K
    from kvcore.pool import KVPool

    P, Hq, Hkv, D = shapes.page_size, shapes.num_qo_heads, shapes.num_kv_heads, shapes.head_dim
    B, L = row.batch, row.kv_len
    per_seq = L // P
    num_pages = B * per_seq + 1
    pool = KVPool(
        num_layers=1,
        num_pages=num_pages,
        num_kv_heads=Hkv,
        head_dim=D,
        page_size=P,
        kv_dtype=row.kv_dtype,
        layout=row.layout,  # type: ignore[arg-type]
        backend=dev.name,
    )
    scales = _scales(row.kv_dtype, Hkv)
    if scales is not None:
        pool.set_scales(0, *scales)
    fill = dev.fill(pool, B * 131 + L)
    rng = np.random.default_rng(B * 7 + L)
    pages = rng.permutation(np.arange(1, num_pages)).astype(np.int32)  # scattered over the whole pool
    pt = (np.arange(0, B * per_seq + 1, per_seq, dtype=np.int32), pages, np.full(B, P, np.int32))
    q_host = act_values(rng.normal(size=(B, Hq, D)) * shapes.q_gain, shapes.act)
    q = dev.asarray(q_host)
    sm_scale = 1 / math.sqrt(D)
    seqs = sorted({0, B // 2, B - 1})
    dense: list[np.ndarray] = []  # the dense float64 model of those sequences, once for every kernel
    for b in seqs:
        k, v = seq_kv(dev, pool, 0, pages[b * per_seq : (b + 1) * per_seq], L)
        dense.append(dense_attention(as_float(q_host[b : b + 1]), k, v, sm_scale))
    dense_tol = max(tolerance(shapes.act, d, dense=True) for d in dense)
    records = []
    for variant in variants:
        occ = dev.occupancy(pool, q, variant=variant)
        plan = K.plan_attention(
            pt, np.arange(B + 1), page_size=P, num_qo_heads=Hq, num_kv_heads=Hkv, variant=variant, **occ
        )
        record = _time_kernel(dev, row, shapes, ceiling, pool, q, pt, plan, occ, sm_scale, seqs, dense)
        record.update({"fill": fill, "dense_tol": dense_tol})
        if not record["dense_err"] <= dense_tol:
            record["problems"].append(
                f"dense model of sequences {seqs}: max err {record['dense_err']:.2e} > {dense_tol:.1e}"
            )
        record["ok"] = not record["problems"]
        records.append(record)
    return records


def _time_kernel(
    dev: Device,
    row: BenchRow,
    shapes: BenchShapes,
    ceiling: dict[str, float],
    pool: Any,
    q: Any,
    pt: tuple[np.ndarray, np.ndarray, np.ndarray],
    plan: Any,
    occ: dict[str, int],
    sm_scale: float,
    seqs: list[int],
    dense: list[np.ndarray],
) -> dict[str, Any]:
    """Time the plan's kernel and check what was timed: its record, less ``ok`` and the dense tolerance."""
    from kvcore import kernels as K
    from kvcore.pool import dtypes

    xp = dev.xp
    B, L, Hkv, D = row.batch, row.kv_len, shapes.num_kv_heads, shapes.head_dim
    public = K.paged_decode_attention(q, pool, 0, pt, plan=plan)  # the public path, once
    out = xp.empty_like(q)
    launch = dev.launcher(q, pool, plan, sm_scale, out)
    clocks = dev.clocks_start()  # sampled while the warm-up and the timed batches run
    t = dev.time(launch, **_timing_kwargs(shapes, graph=True))
    clk = dev.clocks_finish(clocks)

    # What was timed, checked: one timed batch again into an output poisoned with NaN (0xFFFF).
    out.view(xp.uint16)[...] = 0xFFFF
    t.replay()
    dev.sync()
    problems = []
    if not bool(xp.array_equal(out.view(xp.uint16), public.view(xp.uint16))):
        problems.append("timed output != public paged_decode_attention")
    if not bool(xp.isfinite(dtypes.to_float32(out, xp)).all()):
        problems.append("non-finite or unwritten output rows")
    got = dev.fetch(out[dev.asarray(np.asarray(seqs))], SECTION)
    dense_err = max(max_error(as_float(got[i : i + 1]), d) for i, d in enumerate(dense))

    kv_bytes = 2 * B * L * Hkv * D * pool.storage_dtype.itemsize
    bps = kv_bytes / t.median_s
    ctas = int(plan.items.shape[0]) * Hkv
    slots = occ["num_sms"] * occ["blocks_per_sm"]
    return {
        "name": variant_name(row, plan.variant),
        "variant": plan.variant,
        "kernel": dev.kernel_name(pool, q, plan),
        "kv_dtype": row.kv_dtype,
        "layout": row.layout,
        "B": B,
        "L": L,
        "act": shapes.act,
        "median_ms": t.median_s * 1e3,
        "min_ms": t.min_s * 1e3,
        "max_ms": t.max_s * 1e3,
        "calls_per_batch": t.calls_per_batch,
        "batches": t.batches,
        "timing": t.mode,
        "timing_note": t.note,
        "warmup_ms": t.warmup_s * 1e3,
        "kv_gb": kv_bytes / 1e9,
        "tbs": bps / 1e12,
        "of_copy": bps / ceiling["copy"] if "copy" in ceiling else None,
        "of_read": bps / ceiling["read"] if "read" in ceiling else None,
        "ctas": ctas,
        "ctas_per_sm": occ["blocks_per_sm"],
        "num_sms": occ["num_sms"],
        "waves": ctas / slots,
        "items": int(plan.items.shape[0]),
        "partials": int(plan.num_partials),
        "merges": int(plan.merges.shape[0]),
        "chunk_len": int(plan.chunk_lens.max()),
        "dense_seqs": seqs,
        "dense_err": dense_err,
        "clocks": clk,
        "problems": problems,
    }


# (header, width) of the row table; "|" separates groups.
_COLUMNS = (
    ("cache", 5), ("lay", 3), ("B", 4), ("L", 6), ("variant", 14), ("|", 1), ("ms/call", 8),
    ("[min-max]", 17), ("mode", 6), ("|", 1), ("K/V GB", 6), ("TB/s", 5), ("%copy", 5), ("%read", 5),
    ("|", 1), ("CTAs", 6), ("/SM", 3), ("waves", 6), ("|", 1), ("dense err", 9), ("|", 1),
    ("SM/mem MHz", 11), ("|", 1), ("s", 5),
)  # fmt: skip


def _cols(values: list[str]) -> str:
    return "  " + " ".join(v.rjust(w) if w > 1 else v for v, (_, w) in zip(values, _COLUMNS, strict=True))


_HEADER = _cols([h for h, _ in _COLUMNS]) + " result"


def _row_line(r: dict[str, Any], seconds: float, l2_bytes: int | None) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}"

    clk = r.get("clocks") or {}
    mhz = f"{clk.get('clocks.sm', '-').split()[0]}/{clk.get('clocks.mem', '-').split()[0]}" if clk else "-"
    l2 = " (L2?)" if l2_bytes and r["kv_gb"] * 1e9 < 2 * l2_bytes else ""
    status = "ok" if r["ok"] else "FAIL: " + "; ".join(r["problems"])
    values = [
        r["kv_dtype"], r["layout"], str(r["B"]), str(r["L"]), r.get("variant", "default"), "|",
        f"{r['median_ms']:.3f}",
        f"[{r['min_ms']:.3f}-{r['max_ms']:.3f}]", r["timing"], "|", f"{r['kv_gb']:.2f}", f"{r['tbs']:.2f}",
        pct(r["of_copy"]), pct(r["of_read"]), "|", str(r["ctas"]), str(r["ctas_per_sm"]), f"{r['waves']:.2f}",
        "|", f"{r['dense_err']:.1e}", "|", mhz, "|", f"{seconds:.1f}",
    ]  # fmt: skip
    return _cols(values) + f" {status}{l2}"


def attention_rows(
    dev: Device,
    ledger: Ledger,
    budget: Budget,
    shapes: BenchShapes,
    ceiling: dict[str, float],
    l2_bytes: int | None = None,
) -> float:
    """Every decode row with the default kernel, each on its own; the JSON is rewritten after each.

    Returns the slowest row's seconds per kernel timed, for sizing :func:`variant_rows`. The variants are
    timed apart, after every default measurement (and the offload section): a variant kernel that faults
    leaves the CUDA context unusable, which must not cost the default kernel's figures.
    """
    rows: list[dict[str, Any]] = []
    ledger.results["bench"] = rows
    print(f"  Hq {shapes.num_qo_heads}, Hkv {shapes.num_kv_heads}, head_dim {shapes.head_dim}, page "
          f"{shapes.page_size}, act {shapes.act}, pages scattered at random")  # fmt: skip
    print(_HEADER)
    slowest = 0.0  # seconds per kernel timed, of the slowest row so far
    for row in shapes.rows:
        slowest = max(slowest, _bench_row(dev, ledger, budget, shapes, ceiling, l2_bytes, row, ("default",),
                                          row.name, slowest))  # fmt: skip
    if shapes.targets:
        ledger.results["targets"] = targets(rows, ceiling)
    return slowest


def _bench_row(
    dev: Device,
    ledger: Ledger,
    budget: Budget,
    shapes: BenchShapes,
    ceiling: dict[str, float],
    l2_bytes: int | None,
    row: BenchRow,
    variants: tuple[str, ...],
    name: str,
    slowest: float,
) -> float:
    """Time ``row`` with ``variants`` if it fits the deadline (``name``: its ledger name if it does not, or
    fails as a whole); records and prints every measurement. Returns its seconds per kernel (0: not run)."""
    rows: list[dict[str, Any]] = ledger.results["bench"]
    if not _fits(ledger, budget, name, max(shapes.min_row_s, 1.5 * slowest * len(variants))):
        return 0.0
    start = time.monotonic()
    try:
        measured = attention_row(dev, row, shapes, ceiling, variants)
        seconds = time.monotonic() - start
        for r in measured:
            rows.append(r)
            ledger.ok(SECTION, r["name"], r["ok"], "; ".join(r["problems"]) or f"{r['tbs']:.3f} TB/s")
            print(_row_line(r, seconds / len(measured), l2_bytes), flush=True)
            if r["timing_note"]:
                print(f"    note: {r['timing_note']}")
    except Exception as e:
        seconds = time.monotonic() - start
        ledger.ok(SECTION, name, False, short_error(e))
        rows.append({"name": name, "ok": False, "problems": [ledger.checks[-1].detail]})
        print(f"  FAIL {name}: {ledger.checks[-1].detail[:140]}", flush=True)
    finally:
        dev.free()
    ledger.write_json()
    return seconds / len(variants)


def variant_rows(
    dev: Device,
    ledger: Ledger,
    budget: Budget,
    shapes: BenchShapes,
    ceiling: dict[str, float],
    l2_bytes: int | None = None,
    slowest: float = 0.0,
) -> None:
    """The rows marked ``variants`` again, with every other kernel variant for their cache, on the same
    pool contents and queries as their default measurement (:func:`attention_rows`, run first); then the
    variants side by side. A row whose default measurement was not even started (the deadline: already a
    failure) is left out."""
    rows: list[dict[str, Any]] = ledger.results.setdefault("bench", [])
    print(_HEADER)
    for row in shapes.rows:
        names = row_variants(row)[1:]
        if not names:
            continue
        if not any(r.get("name") == row.name for r in rows):
            print(f"  {row.name}: variants not timed (its default row did not run)")
            continue
        slowest = max(slowest, _bench_row(dev, ledger, budget, shapes, ceiling, l2_bytes, row, names,
                                          f"{row.name} variants={','.join(names)}", slowest))  # fmt: skip
    print_variants(rows)


def print_variants(rows: list[dict[str, Any]]) -> None:
    """The kernel variants side by side (TB/s, and against the default kernel), per row timed with them."""
    timed: dict[str, dict[str, dict[str, Any]]] = {}  # row name -> variant -> record
    for r in rows:
        if "variant" in r:
            base = r["name"].split(" variant=")[0]
            timed.setdefault(base, {})[r["variant"]] = r
    timed = {k: v for k, v in timed.items() if len(v) > 1}
    if not timed:
        return
    names = list(dict.fromkeys(v for by in timed.values() for v in by))
    print("  kernel variants, TB/s (x default); FAIL: the output check failed (see the rows above):")
    print("  " + f"{'row':<36}" + "".join(f"{n:>16}" for n in names))
    for base, by in timed.items():
        ref = by.get("default", {}).get("tbs")
        cells = []
        for n in names:
            got = by.get(n)
            if got is None:
                cells.append(f"{'-':>16}")
            elif not got["ok"]:
                cells.append(f"{'FAIL':>16}")
            else:
                ratio = f" (x{got['tbs'] / ref:.2f})" if ref else ""
                cells.append(f"{got['tbs']:.2f}{ratio}".rjust(16))
        print("  " + f"{base:<36}" + "".join(cells))


def targets(rows: list[dict[str, Any]], ceiling: dict[str, float]) -> list[dict[str, Any]]:
    """The device targets, measured or not; printed (they are results, not checks of the harness)."""
    found = {
        (r.get("kv_dtype"), r.get("layout"), r.get("B"), r.get("L")): r
        for r in rows
        if r.get("ok") and r.get("variant") == "default"
    }
    out: list[dict[str, Any]] = []
    bf16 = found.get(("bf16", "HND", 128, 4096))
    out.append(
        {
            "target": f"bf16 B=128 L=4096 >= {BF16_TARGET_TBS} TB/s",
            "measured_tbs": bf16["tbs"] if bf16 else None,
            "met": bool(bf16 and bf16["tbs"] >= BF16_TARGET_TBS),
        }
    )
    fp8 = found.get(("fp8", "HND", 128, 4096))
    read = ceiling.get("read")
    out.append(
        {
            "target": f"fp8 B=128 L=4096 >= {100 * FP8_TARGET_OF_READ:.0f} % of the read ceiling",
            "measured_tbs": fp8["tbs"] if fp8 else None,
            "of_read": fp8["of_read"] if fp8 else None,
            "met": bool(fp8 and read and fp8["tbs"] * 1e12 >= FP8_TARGET_OF_READ * read),
        }
    )
    for t in out:
        got = "not measured" if t["measured_tbs"] is None else f"{t['measured_tbs']:.3f} TB/s"
        if t.get("of_read") is not None:
            got += f" ({100 * t['of_read']:.0f} % of read)"
        print(f"  target {t['target']}: {got} -> {'met' if t['met'] else 'NOT met'}")
    return out


# ------------------------------------------------------------------------------------ offload


def offload(dev: Device, ledger: Ledger, budget: Budget, shapes: BenchShapes, *, native: bool) -> None:
    """gather/scatter of pages to/from pinned host memory (zero-copy kernels), staging copies, host tier."""
    try:
        _offload(dev, ledger, budget, shapes, native=native)
    finally:
        dev.free()  # the pool and the buffers died with the call


def _offload(dev: Device, ledger: Ledger, budget: Budget, shapes: BenchShapes, *, native: bool) -> None:
    from kvcore import kernels as K
    from kvcore.pool import KVPool

    layers, num_pages, n = shapes.offload
    if not _fits(ledger, budget, "offload", max(shapes.min_row_s, 5.0)):
        return
    xp = dev.xp
    pool = KVPool(
        num_layers=layers,
        num_pages=num_pages,
        num_kv_heads=shapes.num_kv_heads,
        head_dim=shapes.head_dim,
        page_size=shapes.page_size,
        kv_dtype="bf16",
        backend=dev.name,
    )
    dev.fill(pool, 5)
    ids = np.random.default_rng(1).permutation(np.arange(1, num_pages))[:n].astype(np.int32)
    pinned = pool.host_buffer(n)
    staging = xp.empty(pinned.shape, dtype=pinned.dtype)
    nbytes = pinned.nbytes
    size = f"{nbytes / 2**20:.0f} MiB, {n} pages of {pool.page_bytes / 2**10:.0f} KiB"
    kw = _timing_kwargs(shapes, graph=False)
    res: dict[str, Any] = {"bytes": nbytes}
    ledger.results["offload"] = res

    def d2h() -> None:
        if dev.name == "cupy":
            staging.get(out=pinned)
        else:
            np.copyto(pinned, staging)

    def h2d() -> None:
        if dev.name == "cupy":
            staging.set(pinned)
        else:
            np.copyto(staging, pinned)

    steps = (
        ("gather to pinned (zero-copy)", lambda: K.gather_pages(pool, ids, pinned)),
        ("gather to device", lambda: K.gather_pages(pool, ids, staging)),
        ("device -> pinned copy", d2h),
        ("scatter from pinned (zero-copy)", lambda: K.scatter_pages(pool, ids, pinned)),
        ("pinned -> device copy", h2d),
    )
    for label, fn in steps:
        name = f"offload {label}"
        if not _fits(ledger, budget, name, 1.0):
            continue
        try:
            t = dev.time(fn, **kw)
            res[label] = nbytes / t.median_s / 1e9
            ledger.ok(SECTION, name, True, f"{res[label]:.1f} GB/s")
            print(f"  {label:>32}: {res[label]:8.1f} GB/s  [{t.median_s * 1e3:.2f} ms]  ({size})")
        except Exception as e:
            ledger.ok(SECTION, name, False, short_error(e))
            print(f"  {label:>32}: FAILED {ledger.checks[-1].detail}")
    try:  # the pinned buffer, the device buffer and the pool's pages hold the same bytes
        K.gather_pages(pool, ids, pinned)
        K.gather_pages(pool, ids, staging)
        dev.sync()
        pages = dev.asnumpy(xp.moveaxis(pool.data[:, :, dev.asarray(ids.astype(np.int64))], 2, 0))
        same = np.array_equal(np.asarray(pinned).view(np.uint8), dev.asnumpy(staging).view(np.uint8)) and (
            np.array_equal(np.asarray(pinned).view(np.uint8), np.ascontiguousarray(pages).view(np.uint8))
        )
        ledger.ok(SECTION, "offload contents", same, "" if same else "pinned / device / pool pages differ")
        print(f"  {'contents':>32}: {'pinned = device buffer = pool pages' if same else 'FAIL: differ'}")
    except Exception as e:
        ledger.ok(SECTION, "offload contents", False, short_error(e))
        print(f"  {'contents':>32}: FAILED {ledger.checks[-1].detail}")
    if not native:
        for label in ("host tier store", "host tier load"):
            ledger.unavailable(SECTION, f"offload {label}", "needs the native module (kvcore.tiers)")
        print(f"  {'host tier':>32}: not run (kvcore.tiers needs the native module)")
    else:
        _host_tier(dev, ledger, pool, ids, nbytes, kw, res)


def _host_tier(
    dev: Device,
    ledger: Ledger,
    pool: Any,
    ids: np.ndarray,
    nbytes: int,
    kw: dict[str, Any],
    res: dict[str, Any],
) -> None:
    n = ids.shape[0]
    try:  # kvcore.tiers.HostTier (pinned slots) through its store/load, against the copies above
        from kvcore.tiers import HostTier

        host = HostTier(pool, n)
        slots = np.arange(n, dtype=np.int32)
        keys = np.zeros((n, 16), dtype=np.uint8)
        toks = np.zeros((n, pool.page_size), dtype=np.uint32)
        names: list[str | None] = [None] * n

        def store() -> None:
            assert host.store(pool, ids, slots, keys, keys, toks, names).all()
            dev.sync()

        def load() -> None:
            assert host.load(pool, slots, ids, keys).all()
            dev.sync()

        for label, fn in (("host tier store", store), ("host tier load", load)):
            t = dev.time(fn, **kw)
            res[label] = nbytes / t.median_s / 1e9
            ledger.ok(SECTION, f"offload {label}", True, f"{res[label]:.1f} GB/s")
            print(f"  {label:>32}: {res[label]:8.1f} GB/s  [{t.median_s * 1e3:.2f} ms]")
    except Exception as e:
        ledger.ok(SECTION, "offload host tier", False, short_error(e))
        print(f"  {'host tier':>32}: FAILED {ledger.checks[-1].detail}")
