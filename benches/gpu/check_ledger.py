"""Bookkeeping of the device check: every check's outcome, the time budget, the JSON summary and the log.

Why a ledger: the run must never pass silently. Every check (a sweep case, a benchmark row, a missing
prerequisite, the pytest part) is one :class:`Check` with a status; the verdict is PASS only when nothing
failed and nothing was left unrun. A section that raises records a failure and the run goes on, so one
broken piece costs its own figures only.

Output: stdout stays short (the device returns only its tail); the full text, tracebacks included, goes to
``device_check.log`` beside ``device_check.json`` under the output folder.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

Status = Literal["pass", "fail", "not_run", "skipped"]

# The results --inject-fault can corrupt (check_backend.Device.fetch), each before its comparison.
FAULT_TAGS = ("append", "decode", "variant", "prefill", "pages", "bench")


@dataclass
class Check:
    """One checked thing."""

    section: str  # "prerequisites", "sweep", "bench", "pytest", ...
    name: str  # what was checked, e.g. "decode bf16 HND ps16 G4 split"
    status: Status  # "skipped" only in the self-test, for what it cannot check (no GPU, no native module)
    detail: str = ""  # the measured error and its tolerance, or why it failed / did not run


class Tee:
    """A text stream that writes to the terminal and to the log file."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream = stream
        self.log = log

    def write(self, s: str) -> int:
        self.stream.write(s)
        self.log.write(s)
        return len(s)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return False


_LOG: TextIO | None = None


def open_log(out_dir: Path) -> None:
    """Send stdout and stderr to ``out_dir/device_check.log`` as well."""
    global _LOG
    _LOG = (out_dir / "device_check.log").open(
        "w", encoding="utf-8", buffering=1
    )  # line by line: a kill keeps it
    sys.stdout = Tee(sys.__stdout__ or sys.stdout, _LOG)
    sys.stderr = Tee(sys.__stderr__ or sys.stderr, _LOG)


def log_only(text: str) -> None:
    """Text for the log file only (tracebacks): the terminal tail is kept for the results."""
    if _LOG is not None:
        _LOG.write(text if text.endswith("\n") else text + "\n")
        _LOG.flush()


def short_error(e: BaseException) -> str:
    """``Type: message`` on one line (at most 300 characters); the full traceback goes to the log."""
    log_only("".join(traceback.format_exception(type(e), e, e.__traceback__)))
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:300]


class Budget:
    """The run's clock: a deadline for everything before pytest, and a limit for the whole run."""

    def __init__(self, deadline_s: float, time_limit_s: float) -> None:
        self.started = time.monotonic()
        self.deadline_s = deadline_s  # sweep + benchmarks must end by then (rows are skipped near it)
        self.time_limit_s = time_limit_s  # the whole run, pytest included

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def before_deadline(self) -> float:
        """Seconds left before the deadline (negative past it)."""
        return self.deadline_s - self.elapsed()

    def total_left(self) -> float:
        return self.time_limit_s - self.elapsed()


class Ledger:
    """Every check of the run, the JSON summary (rewritten after each section and benchmark row)."""

    def __init__(self, out_dir: Path, *, strict: bool, budget: Budget) -> None:
        self.out_dir = out_dir
        self.strict = strict  # the device run: what cannot be checked is a failure ("not run")
        self.budget = budget
        self.checks: list[Check] = []
        self.results: dict[str, Any] = {}  # section name -> its figures, for the JSON
        self.sections: list[dict[str, Any]] = []  # name, seconds, counts

    # ---------------------------------------------------------------- recording

    def record(self, section: str, name: str, status: Status, detail: str = "") -> Check:
        check = Check(section, name, status, detail)
        self.checks.append(check)
        return check

    def ok(self, section: str, name: str, passed: bool, detail: str = "") -> Check:
        return self.record(section, name, "pass" if passed else "fail", detail)

    def unavailable(self, section: str, name: str, reason: str) -> Check:
        """What this run cannot check: "not run" (a failure) on the device, "skipped" in the self-test."""
        return self.record(section, name, "not_run" if self.strict else "skipped", reason)

    def counts(self, section: str | None = None) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "not_run": 0, "skipped": 0}
        for c in self.checks:
            if section is None or c.section == section:
                out[c.status] += 1
        return out

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("fail", "not_run")]

    # ---------------------------------------------------------------- sections

    @contextmanager
    def section(self, name: str, title: str) -> Iterator[None]:
        """Print the section header; on exit its time and counts. An exception ends the section only."""
        print(f"\n=== {title}", flush=True)
        start = time.monotonic()
        before = len(self.checks)
        try:
            yield
        except Exception as e:
            self.record(name, f"{name} (aborted)", "fail", short_error(e))
            print(f"  {name}: ABORTED: {self.checks[-1].detail}")
        seconds = time.monotonic() - start
        mine = self.checks[before:]
        counts = {s: sum(c.status == s for c in mine) for s in ("pass", "fail", "not_run", "skipped")}
        self.sections.append({"name": name, "seconds": round(seconds, 2), **counts})
        extra = f", {counts['skipped']} skipped" if counts["skipped"] else ""
        print(
            f"--- {name}: {seconds:.1f} s (elapsed {self.budget.elapsed():.0f} s): {counts['pass']} passed, "
            f"{counts['fail']} failed, {counts['not_run']} not run{extra}",
            flush=True,
        )
        self.write_json()

    # ---------------------------------------------------------------- output

    def verdict(self) -> tuple[bool, str]:
        c = self.counts()
        passed = c["fail"] == 0 and c["not_run"] == 0 and c["pass"] > 0
        extra = f", {c['skipped']} skipped" if c["skipped"] else ""
        line = (
            f"VERDICT: {'PASS' if passed else 'FAIL'} ({c['pass']} passed, {c['fail']} failed, "
            f"{c['not_run']} not run{extra}) in {self.budget.elapsed():.0f} s"
        )
        return passed, line

    def write_json(self, *, final: bool = False) -> Path:
        """``device_check.json``, written whole each time (atomically: a kill leaves the last good one).

        Only the last write (``final``, from the recap) can say ``"passed": true``: the ones after each
        section and row say ``"complete": false`` and ``"passed": false``, so the file a run killed midway
        (a timeout, the OOM killer, a crash) leaves behind never reads as a pass. Strict JSON: a
        non-finite figure (the infinite error of a NaN output) is written as a string ("inf", "nan").
        """
        passed, line = self.verdict()
        doc = {
            **self.results,
            "sections": self.sections,
            "checks": [asdict(c) for c in self.checks],
            "counts": self.counts(),
            "verdict": line if final else f"INCOMPLETE (the run was still going, or was killed): {line}",
            "passed": passed and final,
            "complete": final,
            "seconds": round(self.budget.elapsed(), 1),
        }
        path = self.out_dir / "device_check.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(_finite(doc), indent=1, default=str, allow_nan=False))
        tmp.replace(path)
        return path


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float (at any depth of dicts, lists, tuples) as its string."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x
