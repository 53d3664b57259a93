#!/usr/bin/env python3
"""The one device check of kvcore's CUDA kernels (H200): a trustworthy answer in one run of <= 6 minutes.

Usage, on the device (from the repository root, with the native module python/kvcore/_kvcore.abi3.so
carried; the sweep and the benchmarks run without it, the pytest part needs it):
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 benches/gpu/device_check.py --out "$OUT"
The CPU self-test of this harness (NumPy pools, tiny shapes, no GPU; what tests/python/test_device_check.py
runs, with --inject-fault to prove a wrong result is caught):
    PYTHONPATH=python python3 benches/gpu/device_check.py --self-test --out /tmp/device_check

Sections, in order; each prints its elapsed time, and device_check.json under --out is rewritten after each:
0. prerequisites: CuPy, a CUDA device, the native module, pytest. Each missing piece prints a
   "MISSING: ..." line and makes the run FAIL; without CuPy or a device it stops there (exit 2). Then
   the environment, the clocks (nvidia-smi, read-only) and the PTX-version trap (informational).
1. compile: kvcore's kernel modules (NVRTC, cached on disk for the pytest part) and this check's
   RawKernels (the pool fill pattern, the 16-byte streaming read).
2. sweep (native-free, check_sweep.py): every kernel against kvcore.kernels.reference on the same pool
   contents, page tables built in NumPy: append_kv bit-exact (fp16/bf16/fp8/int8 x HND/NHD), decode
   (G 1/4/8/32, page size 1/16, split-K forced on and off, HND/NHD, every cache dtype), prefill over a
   cached prefix, copy/gather/scatter pages; attention also against a dense float64 model. ~30-40 s;
   cases not started within --sweep-limit are "not run" (a failure).
3. benchmarks (check_bench.py): copy and read ceilings; paged decode at Llama-3.1-8B shapes (32 q heads,
   8 kv heads, head_dim 128, G 4, page 16, pages scattered at random; bf16/fp8/int8; B 64/128/256 x
   1k/4k/16k, B 1/8 x 32k, one NHD row), each row timed (CUDA events, graphs for short calls) and its
   output checked against the dense model; gather/scatter to pinned host memory. A row that does not
   fit before --deadline is "not run" (a failure).
4. variants (kvcore.kernels.plan.DECODE_VARIANTS), last in this process, so that a variant kernel that
   faults (which leaves the CUDA context unusable) costs no default figure: the sweep's decode cases of
   page size 16 again with every kernel variant (op "variant", same inputs and tolerances), then the three
   B=128 x 4k HND rows timed with every variant on the same pool contents (each checked the same way),
   printed side by side (TB/s and ratio to the default kernel), to choose the default. The recap and the
   verdict line say how many failures are the variants' (JSON: "variant_failures").
5. pytest tests/python/gpu (--junitxml=$OUT/junit.xml, --maxfail=20, -rfE, a timeout that keeps the
   whole run within --time-limit); a failure, a timeout or a skipped test fails the run.
Then a recap; the last line is the verdict: "VERDICT: PASS|FAIL (n passed, n failed, n not run) in N s"
(with "; targets n/2 met" on the device: bf16 B=128 x 4k >= 3.4 TB/s, fp8 there >= 80 % of the read
ceiling; a missed target is a result, not a failure of the check).
Budget: sweep and benchmarks ~2-3 minutes (--deadline 240 s at most); pytest gets what is left of
--time-limit (360 s) minus 20 s (room to stop a timed-out pytest), so at least 100 s.

Exit status: 0 PASS, 1 FAIL, 2 FAIL with CuPy or the device missing (nothing could be measured).
Files under --out: device_check.json (every check and figure; "complete" and "passed" stay false until
the recap writes it last, so a killed run never reads as a pass), device_check.log (all output, with the
tracebacks stdout leaves out), sweep.txt (every sweep case), junit.xml and pytest.log (the pytest part).

Importing kvcore without its native module: see check_env.py (a bare "shell" package object for kvcore,
so kvcore/__init__.py, the one importer of the native module, never runs; nothing is faked).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))  # the check_* helpers beside this file

from check_ledger import FAULT_TAGS, Budget, Ledger, open_log, short_error  # noqa: E402

FAMILIES = ("append_kv", "paged_attention", "decode_variants", "page_copy")
VARIANT_ROWS_RESERVE_S = 20.0  # kept before the deadline, by the variants' sweep, for their timed rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", default=os.environ.get("OUT") or str(REPO / "out"), help="output folder (default $OUT)"
    )
    ap.add_argument("--self-test", action="store_true", help="NumPy backend, tiny shapes, no GPU, no pytest")
    ap.add_argument(
        "--deadline", type=float, default=240.0, help="seconds for everything before pytest (rows skipped)"
    )
    ap.add_argument("--time-limit", type=float, default=360.0, help="seconds for the whole run")
    ap.add_argument(
        "--sweep-limit", type=float, default=150.0, help="seconds for the sweep (later cases not run)"
    )
    ap.add_argument("--test-timeout", type=float, default=None, help="cap on the pytest part's seconds")
    ap.add_argument("--skip-tests", action="store_true", help="no pytest part (the verdict is then FAIL)")
    ap.add_argument(
        "--skip-sweep", action="store_true", help="no correctness sweep (the verdict is then FAIL)"
    )
    ap.add_argument(
        "--inject-fault",
        default="",
        help=f"comma-separated results to corrupt before comparison ({', '.join(FAULT_TAGS)}): must FAIL",
    )
    ap.add_argument(
        "--simulate-missing-native",
        action="store_true",
        help="refuse to import kvcore._kvcore (as on a device where it was not carried)",
    )
    args = ap.parse_args(argv)
    faults = {f.strip() for f in args.inject_fault.split(",") if f.strip()}
    unknown = faults - set(FAULT_TAGS)
    if unknown:
        ap.error(f"--inject-fault: unknown {sorted(unknown)}; choose from {', '.join(FAULT_TAGS)}")
    args.faults = frozenset(faults)
    return args


def prerequisites(ledger: Ledger, info: Any, *, device: bool) -> bool:
    """Print every piece and record the required ones; False when nothing can be measured."""
    from check_env import prerequisites as pieces

    print(f"  {info.how}")
    found = pieces(info, device=device)
    for p in found:
        mark = "ok" if p.present else ("MISSING" if p.required else "absent")
        print(f"  {p.name:>32}: {mark} ({p.detail})")
    for p in found:
        if p.required and not p.present:
            print(f"MISSING: {p.name}: {p.detail}")
        if p.required:
            ledger.ok("prerequisites", p.name, p.present, p.detail)
    ledger.results["prerequisites"] = {p.name: {"present": p.present, "detail": p.detail} for p in found}
    ledger.results["import"] = asdict(info)
    return all(p.present for p in found if p.name in ("CuPy", "CUDA device")) or not device


def environment(ledger: Ledger, *, device: bool) -> dict[str, Any]:
    import check_env

    env = check_env.environment() if device else check_env.host_environment()
    for k, v in env.items():
        print(f"  {k:>32}: {v}")
    if device:
        clk = check_env.clocks_now()
        print(f"  {check_env.format_clocks(clk)}")
        env["clocks_idle"] = clk
        env["ptx_trap"] = check_env.ptx_trap(str(env["compute_capability"]))
        for kind, status in env["ptx_trap"].items():
            print(f"  {'PTX trap ' + kind:>32}: {status}")
    ledger.results["environment"] = env
    return env


def compile_kernels(dev: Any, ledger: Ledger) -> None:
    """kvcore's kernel modules (timed apart, so the sweep's time is its own) and the check's RawKernels."""
    from kvcore.kernels import loader

    device_id = int(dev.cp.cuda.Device().id)
    for family in FAMILIES:
        start = time.monotonic()
        try:
            # The arguments get_kernel passes (functools.cache keys on them): the module loaded here is
            # the one every later launch takes its kernels from.
            loader.load_module(family, device_id, loader.device_checks())
            ledger.ok("compile", f"compile {family}", True)
            print(f"  {family}.cu: loaded in {time.monotonic() - start:.1f} s")
        except Exception as e:
            ledger.ok("compile", f"compile {family}", False, short_error(e))
            print(f"  {family}.cu: FAILED {ledger.checks[-1].detail}")
    for kernel, status in dev.compile_helpers().items():
        ledger.ok("compile", f"compile {kernel}", status == "ok", "" if status == "ok" else status)
        print(f"  {kernel} (this check's RawKernel): {status}")


def pytest_part(ledger: Ledger, budget: Budget, args: argparse.Namespace, info: Any, out_dir: Path) -> None:
    import importlib.util

    from check_pytest import run_pytest

    name = "pytest tests/python/gpu"
    if args.self_test:
        print("  skipped in the self-test (it checks this harness on the CPU, not the kernels)")
        return
    reason = ""
    if args.skip_tests:
        reason = "--skip-tests"
    elif not info.native:
        reason = "the native module kvcore._kvcore is missing (carry python/kvcore/_kvcore.abi3.so)"
    elif importlib.util.find_spec("pytest") is None:
        reason = "pytest is not installed"
    timeout = budget.total_left() - 20  # killing a timed-out pytest may take up to 15 s (TERM, then KILL)
    if args.test_timeout is not None:
        timeout = min(timeout, args.test_timeout)
    if not reason and timeout < 20:
        reason = f"out of time: {budget.total_left():.0f} s left of --time-limit {budget.time_limit_s:.0f}"
    if reason:
        ledger.record("pytest", name, "not_run", reason)
        print(f"  NOT RUN: {reason}")
        return
    print(f"  timeout {timeout:.0f} s")
    res = run_pytest(
        ["tests/python/gpu"],
        cwd=REPO,
        out_dir=out_dir,
        timeout=timeout,
        extra_pythonpath=[str(REPO / "python")],
        tail=20,
    )
    ledger.ok("pytest", name, res.ok, res.summary)
    ledger.results["pytest"] = asdict(res)
    print(f"  pytest: {'ok' if res.ok else 'FAILED'}: {res.summary} ({res.seconds:.0f} s)")


def variant_failures(bad: list[Any]) -> tuple[dict[str, int], int]:
    """Failed or unrun checks of the non-default kernel variants: per variant (``"all"``: a check of every
    variant at once), and how many checks those are."""
    per: dict[str, int] = {}
    count = 0
    for c in bad:
        m = re.search(r"variants?=([\w,]+)", c.name)
        names = m.group(1).split(",") if m else ["all"] if "variant" in c.name else []
        count += bool(names)
        for n in names:
            per[n] = per.get(n, 0) + 1
    return per, count


def finish(ledger: Ledger) -> bool:
    """The recap (short: the device returns only the tail of stdout) and, last, the verdict line."""
    print("\n=== recap")
    print(f"  {'section':<14} {'seconds':>8} {'passed':>7} {'failed':>7} {'not run':>8}")
    for s in ledger.sections:
        print(f"  {s['name']:<14} {s['seconds']:>8.1f} {s['pass']:>7} {s['fail']:>7} {s['not_run']:>8}")
    targets = ledger.results.get("targets") or []
    for t in targets:
        got = "not measured" if t["measured_tbs"] is None else f"{t['measured_tbs']:.3f} TB/s"
        print(f"  target {t['target']}: {got} -> {'met' if t['met'] else 'NOT met'}")
    bad = ledger.failures()
    if bad:
        print(f"  {len(bad)} failures (at most 6 per section here; all in device_check.json):")
        for section in dict.fromkeys(c.section for c in bad):
            mine = [c for c in bad if c.section == section]
            for c in mine[:6]:
                what = c.status.replace("_", " ")
                print(f"    [{section}] {c.name}: {what}{': ' + c.detail[:160] if c.detail else ''}")
            if len(mine) > 6:
                print(f"    [{section}] ... {len(mine) - 6} more")
    passed, line = ledger.verdict()
    if targets:
        line += f"; targets {sum(t['met'] for t in targets)}/{len(targets)} met"
    per_variant, count = variant_failures(bad)
    ledger.results["variant_failures"] = per_variant
    if count:
        what = ", ".join(f"{k} {n}" for k, n in sorted(per_variant.items()))
        only = "only kernel variants failed: " if count == len(bad) else ""
        print(f"  {only}{count} of the {len(bad)} failures are kernel variants' ({what})")
        line += f"; {count} of the failures in kernel variants ({', '.join(sorted(per_variant))})"
    path = ledger.write_json(final=True)
    print(f"  JSON: {path}")
    print(line, flush=True)
    return passed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    open_log(out_dir)
    budget = Budget(args.deadline, args.time_limit)
    device = not args.self_test
    ledger = Ledger(out_dir, strict=device, budget=budget)
    ledger.results["run"] = {
        "mode": "device (CuPy)" if device else "self-test (NumPy)",
        "argv": sys.argv[1:] if argv is None else argv,
        "deadline_s": args.deadline,
        "time_limit_s": args.time_limit,
        "sweep_limit_s": args.sweep_limit,
        "faults": sorted(args.faults),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"device_check: {ledger.results['run']['mode']}, output in {out_dir}")
    if args.faults:
        print(f"  injecting faults into: {', '.join(sorted(args.faults))} (the run must FAIL)")

    import check_env

    try:
        info = check_env.import_kvcore(simulate_missing_native=args.simulate_missing_native)
    except Exception as e:  # kvcore itself is broken (not just its native module): nothing can run
        ledger.record("prerequisites", "import kvcore", "fail", short_error(e))
        print(f"MISSING: an importable kvcore: {ledger.checks[-1].detail}")
        finish(ledger)
        return 1
    usable = False
    env: dict[str, Any] = {}
    with ledger.section("prerequisites", "prerequisites and environment"):
        usable = prerequisites(ledger, info, device=device)
        if usable:
            env = environment(ledger, device=device)
    if not usable:
        print("MISSING: CuPy or a usable CUDA device: nothing can be checked on this machine")
        finish(ledger)
        return 2
    try:
        run_sections(ledger, budget, args, info, env, out_dir)
    except Exception as e:  # outside any section (the device could not even be opened): still a verdict
        ledger.record("harness", "device_check", "fail", short_error(e))
        print(f"  ABORTED: {ledger.checks[-1].detail}")
    return 0 if finish(ledger) else 1


def run_sections(
    ledger: Ledger, budget: Budget, args: argparse.Namespace, info: Any, env: dict[str, Any], out_dir: Path
) -> None:
    """Every section after the prerequisites, in order; each one's failure is its own."""
    import check_bench
    import check_env
    import check_sweep
    from check_backend import CupyDevice, Device

    device = not args.self_test
    dev = CupyDevice(args.faults) if device else Device(args.faults)
    sweep_shapes = check_sweep.FULL if device else check_sweep.TINY
    bench_shapes = check_bench.LLAMA if device else check_bench.TINY
    if device:
        with ledger.section("compile", "compile (kvcore kernels via NVRTC, this check's RawKernels)"):
            compile_kernels(dev, ledger)
    with ledger.section("sweep", "correctness sweep (native-free): kernels against kvcore.kernels.reference"):
        if args.skip_sweep:
            ledger.unavailable("sweep", "correctness sweep", "--skip-sweep")
            print("  NOT RUN: --skip-sweep")
        else:
            check_sweep.run_sweep(dev, ledger, sweep_shapes, out_dir, args.sweep_limit)
    ceiling: dict[str, float] = {}  # bytes per second: "copy" (read + write), "read"
    with ledger.section("ceilings", "bandwidth ceilings"):
        if device:
            print(f"  {check_env.format_clocks(check_env.clocks_now())}")
        ceiling.update(check_bench.ceilings(dev, ledger, budget, bench_shapes))
    slowest = 0.0  # the slowest decode row's seconds per kernel, to size the variants' rows
    with ledger.section("decode", "paged decode attention: bandwidth and output check per row"):
        slowest = check_bench.attention_rows(dev, ledger, budget, bench_shapes, ceiling, env.get("l2_bytes"))
    with ledger.section("offload", "gather / scatter of pages to pinned host memory"):
        check_bench.offload(dev, ledger, budget, bench_shapes, native=info.native)
        if device:
            print(f"  {check_env.format_clocks(check_env.clocks_now())}")
    # Last before pytest (its own process): a variant kernel that faults leaves this process's CUDA context
    # unusable, so every default check above is done by then.
    with ledger.section("variants", "decode kernel variants: the sweep's decode cases, then timed rows"):
        if args.skip_sweep:
            print("  sweep: NOT RUN: --skip-sweep")
        else:
            # what is left before the deadline, less a reserve for the timed rows after it
            limit = min(args.sweep_limit, budget.before_deadline() - VARIANT_ROWS_RESERVE_S)
            check_sweep.run_sweep(dev, ledger, sweep_shapes, out_dir, max(0.0, limit), variants=True)
            if device:  # and their head_dim 64 kernels, which no other check runs
                limit = min(args.sweep_limit, budget.before_deadline() - VARIANT_ROWS_RESERVE_S)
                d64 = check_sweep.VARIANTS_D64
                check_sweep.run_sweep(dev, ledger, d64, out_dir, max(0.0, limit), variants=True)
        check_bench.variant_rows(dev, ledger, budget, bench_shapes, ceiling, env.get("l2_bytes"), slowest)
    with ledger.section("pytest", "GPU tests (tests/python/gpu, each kernel against its NumPy reference)"):
        pytest_part(ledger, budget, args, info, out_dir)


if __name__ == "__main__":
    sys.exit(main())
