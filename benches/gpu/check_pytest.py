"""The pytest part of the device check: ``tests/python/gpu`` in a subprocess, judged strictly.

Why strictly: pytest exits 0 when every test is skipped, and the GPU tests skip themselves without a usable
device, so "exit 0" alone would be a silent pass. The run counts from the JUnit XML and fails on a non-zero
exit, a timeout (the process group is killed), no test run at all, or any skipped test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass
class PytestResult:
    """What the pytest subprocess did."""

    ok: bool
    summary: str  # one line: the counts, or why it failed
    returncode: int | None  # None after a timeout
    seconds: float
    counts: dict[str, int]  # tests, failures, errors, skipped (from the JUnit XML; empty without one)


def junit_counts(path: Path) -> dict[str, int]:
    """tests / failures / errors / skipped summed over the test suites of a JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in out:
            out[k] += int(s.get(k, 0))
    return out


def judge(returncode: int | None, counts: dict[str, int], timeout: float) -> tuple[bool, str]:
    """The verdict on one pytest run (see the module docstring)."""
    if returncode is None:
        return False, f"pytest timed out after {timeout:.0f} s (killed)"
    if not counts:
        return False, f"pytest exited {returncode} and wrote no JUnit XML"
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    c = counts
    line = f"{passed} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped"
    if returncode != 0:
        return False, f"pytest exited {returncode}: {line}"
    if counts["tests"] == 0:
        return False, "pytest ran no test"
    if counts["skipped"]:
        return False, f"{line} (a skipped GPU test on the device is a failure: no CUDA device in pytest?)"
    return True, line


def run_pytest(
    paths: list[str], *, cwd: Path, out_dir: Path, timeout: float, extra_pythonpath: list[str], tail: int = 30
) -> PytestResult:
    """Run pytest on ``paths`` with ``--junitxml``, ``--maxfail=20``, ``-rfE`` and a timeout.

    The full output goes to ``out_dir/pytest.log``; the last ``tail`` lines are printed.
    """
    junit = out_dir / "junit.xml"
    log = out_dir / "pytest.log"
    junit.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--maxfail=20",
        "-rfE",
        f"--junitxml={junit}",
        *paths,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([*extra_pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)  # the group of the pytest we started, and nothing else
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    seconds = time.monotonic() - start
    lines = log.read_text(errors="replace").rstrip().splitlines()
    print("\n".join("  | " + ln for ln in lines[-tail:]))
    counts = junit_counts(junit) if junit.is_file() else {}
    ok, summary = judge(returncode, counts, timeout)
    return PytestResult(ok, summary, returncode, seconds, counts)
