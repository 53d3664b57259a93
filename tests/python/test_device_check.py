"""The device check (``benches/gpu/device_check.py``) on the CPU: its harness, not the kernels.

The script's ``--self-test`` runs the same sweep, benchmark rows and dense-model checks as on the GPU, with
NumPy pools and tiny shapes. These tests prove that it passes when nothing is wrong, that it FAILs when a
result is wrong (``--inject-fault`` flips a bit of each result before the comparison), when a benchmark row
does not fit the deadline, when a prerequisite is missing, and that its pytest part never passes on
skipped tests or a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benches" / "gpu" / "device_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import check_backend  # noqa: E402
import check_pytest  # noqa: E402


def _run(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "out"
    base = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads((out / "device_check.json").read_text(), parse_constant=_no_constant)  # strict JSON
    assert doc["complete"] is True  # the recap wrote it last
    return proc.returncode, proc.stdout, doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"device_check.json holds {name}, which is not JSON")


def _last_line(text: str) -> str:
    """The verdict line: the last line of stdout."""
    return text.rstrip().splitlines()[-1]


def _by_op(doc: dict[str, Any]) -> dict[str, set[str]]:
    """Statuses of the sweep's cases per operation, and of the decode benchmark rows."""
    out: dict[str, set[str]] = {}
    for c in doc["checks"]:
        op = c["name"].split()[0]
        if c["section"] == "sweep" or (c["section"] == "bench" and op == "decode"):
            out.setdefault(f"{c['section']}:{op}", set()).add(c["status"])
    return out


def test_self_test_passes_without_the_native_module(tmp_path: Path) -> None:
    rc, text, doc = _run(["--self-test", "--simulate-missing-native"], tmp_path)
    assert rc == 0, text[-3000:]
    assert re.match(r"VERDICT: PASS \(\d+ passed, 0 failed, 0 not run, 2 skipped\)", _last_line(text))
    assert "kvcore imported without its native module" in text
    cases = doc["sweep"]["cases"]
    ops = {c["op"] for c in cases}
    assert ops == {"fill", "append", "decode", "variant", "prefill", "copy", "gather", "scatter"}
    assert len(cases) > 200 and all(c["status"] == "pass" for c in cases)
    # every decode case of page size 16 again per kernel variant with kernels for its cache
    variants = {c["name"].split("variant=")[1] for c in cases if c["op"] == "variant"}
    assert variants == {"wide", "pipelined", "pipelined3", "pipelined_wide"}
    assert all(" ps16 " in c["name"] for c in cases if c["op"] == "variant")
    attention = [c for c in cases if c["op"] in ("decode", "variant", "prefill")]
    # The dense model is a second opinion, not the reference again: it differs, within tolerance.
    assert all(0 < c["dense_err"] <= c["dense_tol"] for c in attention)
    rows = doc["bench"]
    assert len(rows) == 10 and all(r["ok"] and 0 < r["dense_err"] <= r["dense_tol"] for r in rows)
    # two rows also timed with every variant for their cache (bf16: 2, fp8: 4), each its own record
    timed = [(r["kv_dtype"], r["variant"]) for r in rows if r["variant"] != "default"]
    assert timed == [("bf16", "pipelined"), ("bf16", "pipelined3")] + [
        ("fp8", v) for v in ("wide", "pipelined", "pipelined3", "pipelined_wide")
    ]
    assert {r["kernel"] for r in rows if r["variant"] == "pipelined"} == {
        "paged_attention_pipelined_bf16_bf16_d64",
        "paged_attention_pipelined_bf16_fp8_d64",
    }
    assert "kernel variants, TB/s" in text
    assert all(r["ctas"] > 0 and r["waves"] > 0 and r["timing"] == "host" for r in rows)
    skipped = [c["name"] for c in doc["checks"] if c["status"] == "skipped"]
    assert skipped == ["offload host tier store", "offload host tier load"]  # need the native module
    for name in ("device_check.log", "sweep.txt"):
        assert (tmp_path / "out" / name).is_file()
    assert "VERDICT: PASS" in (tmp_path / "out" / "device_check.log").read_text()


def test_every_injected_fault_fails_the_run(tmp_path: Path) -> None:
    faults = ",".join(check_backend.FAULT_TAGS)
    rc, text, doc = _run(["--self-test", "--inject-fault", faults], tmp_path)
    assert rc == 1
    assert _last_line(text).startswith("VERDICT: FAIL (")
    statuses = _by_op(doc)
    for op in ("append", "decode", "prefill", "copy", "gather", "scatter"):
        assert statuses[f"sweep:{op}"] == {"fail"}, op  # every case of every corrupted result is caught
    variant_cases = [c for c in doc["sweep"]["cases"] if c["op"] == "variant"]
    assert variant_cases and all(c["status"] == "fail" for c in variant_cases)
    assert statuses["sweep:fill"] == {"pass"}  # ... and nothing else is blamed
    assert statuses["bench:decode"] == {"fail"}
    details = [
        c["detail"] for c in doc["checks"] if c["section"] == "bench" and c["name"].startswith("decode")
    ]
    assert all("dense model" in d for d in details)
    assert all(c["status"] == "pass" for c in doc["checks"] if c["name"].startswith("offload"))


def test_a_wrong_variant_output_fails_only_the_variant_cases(tmp_path: Path) -> None:
    """A corrupted variant result (the sweep's "variant" fetches) is caught, and the default kernel's
    cases, compared to the same memoized reference, still pass."""
    rc, _, doc = _run(["--self-test", "--inject-fault", "variant"], tmp_path)
    assert rc == 1
    by_op: dict[str, set[str]] = {}
    for c in doc["sweep"]["cases"]:
        by_op.setdefault(c["op"], set()).add(c["status"])
    assert by_op["variant"] == {"fail"}
    assert all(status == {"pass"} for op, status in by_op.items() if op != "variant"), by_op


def test_rows_past_the_deadline_are_not_run_and_fail(tmp_path: Path) -> None:
    rc, text, doc = _run(["--self-test", "--deadline", "0", "--skip-sweep"], tmp_path)
    assert rc == 1
    assert re.match(r"VERDICT: FAIL \(\d+ passed, 0 failed, 7 not run, 1 skipped\)", _last_line(text))
    bench = [c for c in doc["checks"] if c["section"] == "bench"]
    assert bench and all(c["status"] == "not_run" and "deadline" in c["detail"] for c in bench)


def test_without_cupy_the_device_run_fails_and_names_what_is_missing(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "cupy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("no CuPy on this machine (test stand-in)")\n')
    path = os.pathsep.join([str(fake.parent), str(REPO / "python"), os.environ.get("PYTHONPATH", "")])
    rc, text, doc = _run(["--simulate-missing-native"], tmp_path, {"PYTHONPATH": path})
    assert rc == 2
    lines = text.splitlines()
    assert any(ln.startswith("MISSING: CuPy") for ln in lines)
    assert any(ln.startswith("MISSING: native module kvcore._kvcore") for ln in lines)
    assert _last_line(text).startswith("VERDICT: FAIL (")
    failed = {c["name"] for c in doc["checks"] if c["status"] == "fail"}
    assert {"CuPy", "CUDA device", "native module kvcore._kvcore"} <= failed
    assert not doc["passed"]


def test_the_json_of_an_unfinished_run_never_reads_as_a_pass(tmp_path: Path) -> None:
    """A run killed midway (a timeout, a crash) leaves the JSON of its last section: not a pass."""
    import check_ledger

    ledger = check_ledger.Ledger(tmp_path, strict=True, budget=check_ledger.Budget(10, 10))
    ledger.ok("sweep", "a case", True)
    ledger.record("sweep", "an infinite error", "pass", "err inf")
    ledger.results["figures"] = {"err": float("inf"), "nested": [float("nan"), 1.5]}
    for final in (False, True):
        doc = json.loads(ledger.write_json(final=final).read_text(), parse_constant=_no_constant)
        assert doc["passed"] is final and doc["complete"] is final
        assert doc["verdict"].startswith("VERDICT: PASS" if final else "INCOMPLETE")
        assert doc["figures"] == {"err": "inf", "nested": ["nan", 1.5]}


def test_the_ptx_trap_loads_the_whole_cubin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's cubin reaches the loader byte for byte (an ELF may end in zero bytes)."""
    pytest.importorskip("cuda.bindings.nvrtc")  # the probe is compiled for real
    import struct
    import types

    import check_env

    loaded: dict[str, bytes] = {}

    class RawModule:
        def __init__(self, path: str) -> None:
            data = Path(path).read_bytes()
            loaded[Path(path).suffix] = data
            if data[:4] == b"\x7fELF":  # the program headers, the last part of NVRTC's cubin, are whole
                (phoff,) = struct.unpack_from("<Q", data, 0x20)
                phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
                if phoff + phentsize * phnum > len(data):
                    raise RuntimeError("CUDA_ERROR_INVALID_IMAGE (truncated cubin)")
            elif not data.endswith(b"}\n\n\x00"):
                raise RuntimeError("not a NUL-terminated PTX")

        def get_function(self, name: str) -> Any:
            return lambda grid, block, args: None

    fake = types.SimpleNamespace(
        RawModule=RawModule,
        zeros=lambda n, dtype: np.zeros(n, dtype),
        float32=np.float32,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    out = check_env.ptx_trap("90")
    assert out["cubin"] == "loads and runs (cubin)", out
    assert out["ptx"].startswith("loads and runs (.version"), out
    assert loaded[".cubin"][:4] == b"\x7fELF"


# ------------------------------------------------------------------------------------ the pytest part


def test_pytest_verdicts_are_strict() -> None:
    judge = check_pytest.judge
    counts = {"tests": 5, "failures": 0, "errors": 0, "skipped": 0}
    assert judge(0, counts, 60) == (True, "5 passed, 0 failed, 0 errors, 0 skipped")
    assert not judge(0, {**counts, "skipped": 5}, 60)[0]  # all skipped: no device in pytest
    assert not judge(0, {**counts, "tests": 0}, 60)[0]
    assert not judge(1, {**counts, "failures": 1}, 60)[0]
    assert not judge(0, {}, 60)[0]  # no JUnit XML
    ok, why = judge(None, {}, 60)
    assert not ok and "timed out" in why


@pytest.mark.parametrize(
    ("body", "timeout", "ok", "needle"),
    [
        ("def test_a():\n    assert True\n", 60, True, "1 passed"),
        ("import pytest\n\n@pytest.mark.skip\ndef test_a():\n    pass\n", 60, False, "skipped"),
        ("def test_a():\n    assert False\n", 60, False, "exited 1"),
        ("import time\n\ndef test_a():\n    time.sleep(60)\n", 3, False, "timed out"),
    ],
    ids=["passes", "skipped", "fails", "times-out"],
)
def test_pytest_part_runs_and_judges_a_subprocess(
    tmp_path: Path, body: str, timeout: float, ok: bool, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_x.py").write_text(body)
    out = tmp_path / "out"
    out.mkdir()
    res = check_pytest.run_pytest(
        ["test_x.py"], cwd=tmp_path, out_dir=out, timeout=timeout, extra_pythonpath=[]
    )
    assert res.ok is ok and needle in res.summary, res.summary
    assert (out / "pytest.log").is_file()
    if needle == "timed out":
        assert res.returncode is None and res.seconds < 30
    else:
        assert (out / "junit.xml").is_file()
    capsys.readouterr()


# ------------------------------------------------------------------------------------ the fill pattern


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp8", "int8"])
def test_fill_pattern_is_finite_and_chunk_independent(kv_dtype: str) -> None:
    from kvcore.pool import KVPool, dtypes

    bits = check_backend.pattern_bits(0, 1 << 16, 5, kv_dtype)
    values = dtypes.decode(bits.view(dtypes.storage_dtype(kv_dtype)), kv_dtype, 1.0)
    assert np.isfinite(values).all()
    assert (values[0::2] >= 0).all() and 0.4 < (values[1::2] < 0).mean() < 0.6  # O(1) means per column
    if kv_dtype == "fp8":
        assert not np.isin(bits, [0x7F, 0xFF]).any()
    if kv_dtype == "int8":
        assert values.min() >= -127
    pool = KVPool(num_layers=2, num_pages=5, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype=kv_dtype)
    check_backend.fill_pool_xp(pool, 5, chunk=1000)  # chunks that do not divide the pool
    flat = check_backend.bits_view(pool)
    assert np.array_equal(flat, check_backend.pattern_bits(0, flat.shape[0], 5, kv_dtype))


# ------------------------------------------------------------------------------------ CUDA timing logic


class _FakeCupy:
    """Just enough of CuPy for ``CupyDevice.time``: events read the host clock, and a stream capture
    records the calls made while it is open (the callable asks :attr:`capturing`), a graph replays them."""

    def __init__(self, *, capture_fails: bool = False) -> None:
        self.capturing: list[Any] | None = None
        fake = self

        class Device:
            id = 0

            def __init__(self) -> None:
                self.attributes = {"MultiProcessorCount": 4}

            def synchronize(self) -> None:
                pass

        class Event:
            def record(self, stream: Any = None) -> None:
                self.t = time.perf_counter()

            def synchronize(self) -> None:
                pass

        class Graph:
            def __init__(self, calls: list[Any]) -> None:
                self.calls = calls

            def launch(self, stream: Any = None) -> None:
                for c in self.calls:
                    c()

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                pass

            def __enter__(self) -> Stream:
                return self

            def __exit__(self, *exc: Any) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def begin_capture(self) -> None:
                if capture_fails:
                    raise RuntimeError("cudaErrorStreamCaptureUnsupported")
                fake.capturing = []

            def end_capture(self) -> Graph:
                calls, fake.capturing = fake.capturing or [], None
                return Graph(calls)

        self.cuda = type(
            "cuda",
            (),
            {
                "Device": Device,
                "Event": Event,
                "Stream": Stream,
                "get_elapsed_time": staticmethod(lambda a, b: (b.t - a.t) * 1e3),
            },
        )


@pytest.mark.parametrize("capture_fails", [False, True])
def test_cuda_timing_uses_graphs_for_short_calls(
    monkeypatch: pytest.MonkeyPatch, capture_fails: bool
) -> None:
    fake = _FakeCupy(capture_fails=capture_fails)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    dev = check_backend.CupyDevice()
    done = []

    def work() -> None:
        time.sleep(2e-4)
        done.append(1)

    def launch() -> None:  # a kernel launch: recorded while a capture is open, run otherwise
        if fake.capturing is not None:
            fake.capturing.append(work)
        else:
            work()

    t = dev.time(launch, warmup_s=0.01, min_batch_s=0.004, batches=5, graph_below_s=1e-2)
    assert t.mode == ("stream" if capture_fails else "graph")
    assert ("capture failed" in t.note) is capture_fails
    assert t.batches == 5 and t.calls_per_batch >= 1
    assert 2e-4 <= t.min_s <= t.median_s <= t.max_s < 5e-2 and t.warmup_s >= 0.01
    before = len(done)
    t.replay()  # one timed batch again, however it was timed
    assert len(done) - before == t.calls_per_batch
    plain = dev.time(launch, warmup_s=0.0, min_batch_s=0.001, batches=5)  # no graphs asked for
    assert plain.mode == "stream" and plain.note == ""
