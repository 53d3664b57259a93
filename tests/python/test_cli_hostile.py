"""The ``kvcore`` command line against hostile files and flags: every one is refused with exactly one
line on stderr that says what is wrong and where (the file, and the line of a trace), and exit code 2;
never a traceback, never memory sized by a number inside the input.

Most cases run ``kvcore.cli.main`` in-process (fast); a few run the real command in a subprocess, to
prove the exit status and the absence of a traceback end to end, and to bound memory with RLIMIT_AS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kv_helpers import llama_like

import kvcore.cli
import kvcore.demo
import kvcore.replay.engine
import kvcore.replay.trace
from kvcore.exceptions import KVCoreError, TraceFormatError
from kvcore.replay import ReplayConfig, read_trace, run_replay
from kvcore.replay.trace import write_trace

LLAMA = llama_like()
ROW = {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = kvcore.cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, *needles: str) -> str:
    """The single stderr line of a refused command; it contains every needle."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvcore "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    code, out, err = cli(argv, capsys)
    assert code == 2, (code, out, err)
    assert out == ""
    return one_line(err, *needles)


def replay_argv(trace: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "replay",
        str(trace),
        "--trace-block-size",
        "16",
        "--capacity-pages",
        "100",
        "--no-plot",
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


# ---- model config files (kvcore size / plan) ------------------------------------------------------


def test_config_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"num_hidden_layers": 32, "name": "\xff"}')
    refused(["size", str(path)], capsys, str(path), "UTF-8")


def test_config_nested_too_deeply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(["size", str(path)], capsys, str(path), "nested")


def test_config_with_a_5000_digit_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.json"
    path.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    refused(["plan", str(path), "--gpu", "H100-80G"], capsys, str(path), "digits")


def test_config_with_1e30_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": 10**30}))
    refused(["size", str(path)], capsys, str(path), "num_hidden_layers")


# ---- numeric flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["size", "llama-3.1-8b", "--batch", "²"], "batch"),
        (["size", "llama-3.1-8b", "--tp", "²"], "tp"),
        (["plan", "llama-3.1-8b", "--gpu", "H100-80G", "--page-size", "²"], "page_size"),
        (["plan", "llama-3.1-8b", "--gpu", "H100-80G", "--concurrency", "²"], "concurrency"),
        (["replay", "--capacity-pages", "²"], "--capacity-pages"),
        (["replay", "--limit", "²"], "--limit"),
        (["replay", "--page-size", "²"], "--page-size"),
        (["replay", "--decode-chunk", "²"], "--decode-chunk"),
        (["replay", "--instances", "²"], "--instances"),
        (["replay", "--remote-index-pages", "²"], "--remote-index-pages"),
        (["replay", "--remote-lookup-keys", "²"], "--remote-lookup-keys"),
        (["demo", "--allocator", "--threads", "²"], "--threads"),
        (["demo", "--num-pages", "²"], "--num-pages"),
        (["demo", "--requests", "²"], "--requests"),
    ],
)
def test_superscript_digits_in_numeric_flags(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # "²".isdigit() is True and int("²") raises: neither may reach the user as a traceback.
    refused(argv, capsys, flag, "'²'")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e999"])
@pytest.mark.parametrize("flag", ["--prefill-rate", "--decode-rate", "--max-queue-wait"])
def test_non_finite_rates_are_refused(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An infinite rate or wait would end up in report.json, which JSON cannot hold.
    argv = ["replay", "--requests", "20", "--no-plot", "--out", str(tmp_path), f"{flag}={value}"]
    refused(argv, capsys, flag, "finite")


@pytest.mark.parametrize("flag", ["--prefill-rate", "--decode-rate"])
def test_finite_rates_whose_times_overflow_are_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1e-320 is finite and > 0, but 32 tokens / 1e-320 tokens/s is infinite: report.json cannot hold it.
    argv = ["replay", "--requests", "20", "--no-plot", "--out", str(tmp_path), flag, "1e-320"]
    refused(argv, capsys, "kvcore replay: error: timed replay:", "overflows")
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("redis://[::1", "Invalid IPv6 URL"),
        ("redis://h:99999", "Port out of range"),
        ("redis://h:abc", "Port could not be cast"),
        ("redis://h:0", "[1, 65535]"),
        ("unix://", "socket's path"),
    ],
)
def test_malformed_remote_urls_are_refused_before_the_trace_is_read(
    url: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # urlsplit's ValueError used to escape as a traceback. The trace here is malformed too: the URL is
    # refused first, so its error is the one line, and no report is written.
    trace = write_lines(tmp_path / "t.jsonl", ["not json"])
    refused(replay_argv(trace, tmp_path, "--remote", url), capsys, "--remote", needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("load", ["1e-310", "1,1e-310"])
def test_loads_whose_arrival_times_overflow_are_refused(
    load: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1e-310 is finite and > 0, but 2 s of arrivals / 1e-310 is infinite: it used to end in an
    # AssertionError traceback (requests "still queued"), after the loads before it had run.
    rows = [{**ROW, "timestamp": 0}, {**ROW, "timestamp": 2000}]
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in rows])
    argv = replay_argv(trace, tmp_path, "--pressure", "none", "--load", load)
    refused(argv, capsys, "--load", "1e-310", "overflow")
    assert not (tmp_path / "out" / "report.json").exists()


def test_demo_page_size_zero(capsys: pytest.CaptureFixture[str]) -> None:
    # Was a ZeroDivisionError in every worker thread (one traceback each).
    argv = ["demo", "--allocator", "--threads", "2", "--requests", "5", "--page-size", "0"]
    refused(argv, capsys, "--page-size")
    refused(["demo", "--page-size", "0"], capsys, "--page-size")


# ---- trace lines (kvcore replay) ------------------------------------------------------------------


def write_lines(path: Path, lines: Sequence[str | bytes]) -> Path:
    data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        (json.dumps({**ROW, "hash_ids": [1, 2**63]}), ("field 'hash_ids'", "item 1")),
        (
            json.dumps({**ROW, "output_length": 20, "output_hash_ids": [7, 2**64]}),
            ("field 'output_hash_ids'", "item 1"),
        ),
        ('{"input_length": 20, "output_length": 4, "hash_ids": [1, 2], "x": ' + "[" * 100_000, ("nested",)),
        ('{"input_length": ' + "9" * 5000 + ', "output_length": 4, "hash_ids": [1, 2]}', ("digits",)),
        (json.dumps({**ROW, "output_length": 10**30}), ("field 'output_length'",)),
        (json.dumps({**ROW, "timestamp": 10**400}), ("field 'timestamp'",)),
        (json.dumps({**ROW, "priority": 10**300}), ("field 'priority'",)),
    ],
)
def test_malformed_trace_line_names_file_and_line(
    line: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW), line])
    refused(replay_argv(trace, tmp_path), capsys, f"{trace}: line 2", *needles)


def test_trace_line_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = b'{"input_length": 20, "output_length": 4, "hash_ids": [1, 2], "x": "\xc3\x28"}'
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW), "", bad])
    refused(replay_argv(trace, tmp_path), capsys, f"{trace}: line 3", "UTF-8")


@pytest.mark.parametrize("stamp", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_timestamp_is_refused_when_read(
    stamp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = f'{{"timestamp": {stamp}, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}}'
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW), line])
    refused(replay_argv(trace, tmp_path), capsys, f"{trace}: line 2", stamp, "finite")
    assert not (tmp_path / "out" / "report.json").exists()


NESTED_800 = "[" * 800 + "]" * 800  # parses, but its repr is 1,600 characters (and deeper, no stack)


@pytest.mark.parametrize(
    ("name", "text", "needles"),
    [
        (
            "t.jsonl",
            f'{{"input_length": {NESTED_800}, "output_length": 1, "hash_ids": [1]}}',
            ("line 1, field 'input_length'", "a list"),
        ),
        (
            "t.jsonl",
            f'{{"input_length": 20, "output_length": 1, "hash_ids": [1, {NESTED_800}]}}',
            ("line 1, field 'hash_ids'", "item 1"),
        ),
        (
            "t.jsonl",
            f'{{"input_length": {"9" * 4000}, "output_length": 1, "hash_ids": [1]}}',
            ("line 1, field 'input_length'", "bits"),
        ),
        ("config.json", f'{{"num_hidden_layers": 32, "n_layer": {NESTED_800}}}', ("n_layer", "a list")),
        ("config.json", f'{{"num_hidden_layers": {"9" * 4000}}}', ("num_hidden_layers", "bits")),
    ],
)
def test_values_quoted_from_a_file_are_short(
    name: str, text: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lines(tmp_path / name, [text])
    argv = replay_argv(path, tmp_path) if name.endswith(".jsonl") else ["size", str(path)]
    line = refused(argv, capsys, str(path), *needles)
    assert len(line) < 300 + len(str(path)), line


def test_every_trace_format_error_names_the_file(tmp_path: Path) -> None:
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW), json.dumps({**ROW, "input_length": 0})])
    with pytest.raises(TraceFormatError) as info:
        read_trace(trace, block_size=16)
    assert str(info.value).startswith(f"{trace}: line 2, field 'input_length': must be >= 1")


def test_report_json_never_holds_nan(tmp_path: Path) -> None:
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW)])
    report = run_replay(read_trace(trace, block_size=16), ReplayConfig(capacity_pages=10, page_size=4))
    report.settings["prefill_rate"] = float("nan")
    with pytest.raises(ValueError):
        report.to_json()


# ---- the job itself running out of memory ---------------------------------------------------------


def _out_of_memory(*args: object, **kwargs: object) -> object:
    raise MemoryError("cannot allocate 2,000,000,001 pages")


@pytest.mark.parametrize("command", ["replay", "demo"])
def test_memory_error_in_the_job_is_one_line(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the native core raises for `--capacity-pages 2000000000` on a small machine: caught once, in
    # kvcore.cli.main, for every sub-command.
    monkeypatch.setattr(kvcore.replay.engine, "KVCacheManager", _out_of_memory)
    monkeypatch.setattr(kvcore.demo, "PageAllocator", _out_of_memory)
    if command == "replay":
        argv = ["replay", "--requests", "10", "--capacity-pages", "2000000000", "--no-plot"]
        argv += ["--out", str(tmp_path)]
    else:
        argv = ["demo", "--allocator", "--num-pages", "2000000001"]
    line = refused(argv, capsys, f"kvcore {command}: error:", "out of memory", "2,000,000,001 pages")
    assert "Traceback" not in line


def test_kvcore_errors_of_every_command_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise KVCoreError("the core said no")

    monkeypatch.setattr(kvcore.demo, "PageAllocator", broken)
    refused(["demo", "--allocator"], capsys, "kvcore demo: error: the core said no")


# ---- end to end: exit status, no traceback, bounded memory ------------------------------------------


def run_kvcore(
    argv: list[str], cwd: Path, limit_bytes: int | None = None
) -> subprocess.CompletedProcess[str]:
    preexec = None
    if limit_bytes is not None:

        def preexec() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvcore", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=preexec,
    )


def test_subprocess_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"num_hidden_layers": "\xff\xfe"}')
    proc = run_kvcore(["size", str(path)], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line(proc.stderr, str(path), "UTF-8")


def test_subprocess_deep_trace_exits_2_without_traceback(tmp_path: Path) -> None:
    trace = write_lines(tmp_path / "t.jsonl", ["[" * 200_000 + "]" * 200_000])
    proc = run_kvcore(replay_argv(trace, tmp_path), tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line(proc.stderr, f"{trace}: line 1", "nested")


@pytest.mark.parametrize(
    "argv",
    [
        ["size", "llama-3.1-8b"],
        ["plan", "--list-presets"],
        ["--help"],
        ["replay", "--requests", "20", "--json"],
    ],
)
def test_a_closed_stdout_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    # `kvcore size ... | head -1` printed "kvcore size: error: [Errno 32] Broken pipe" and exited 2. The
    # pipe's reader is closed before the command starts, so its first write meets EPIPE, as head's exit
    # would: the output stops with exit code 141 (128 + SIGPIPE) and nothing on stderr.
    if argv[0] == "replay":
        argv = [*argv, "--no-plot", "--out", str(tmp_path)]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvcore", *argv],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    # argparse prints --help itself and ignores a failed write (then exits 0); the rest is kvcore's.
    assert proc.returncode in ((0, 141) if argv == ["--help"] else (141,))


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["size", "llama-3.1-8b", "--context", "1k,,2k"], ("context", "''")),
        (["size", "llama-3.1-8b", "--context", "1k,"], ("context", "''")),
        (["plan", "llama-3.1-8b", "--gpu", "H100-80G", "--request", "1k,,2k"], ("request", "''")),
        (["replay", "--requests", "5", "--sweep-tokens", "16,,32"], ("--sweep-tokens", "''")),
    ],
)
def test_empty_items_of_comma_lists_are_refused(
    argv: list[str], needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --context 1k,,2k used to drop the empty item where --sweep-tokens 16,,32 refuses it.
    if argv[0] == "replay":
        argv = [*argv, "--no-plot", "--out", str(tmp_path)]
    refused(argv, capsys, *needles, "is not a token count")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_output_length_1e9_allocates_nothing_near_it(mode: str, tmp_path: Path) -> None:
    # An 80-byte line asking for 10**9 output tokens used to allocate 3.7 GiB of token ids up front.
    # Memory now follows the cache (100 pages of 16 tokens) and the file, never the number: under a
    # 1 GiB address-space limit the replay finishes, and the request is refused as too large.
    row = {"timestamp": 0, "input_length": 10, "output_length": 10**9, "hash_ids": [1]}
    line = json.dumps(row, separators=(",", ":"))
    assert len(line) <= 80
    trace = write_lines(tmp_path / "t.jsonl", [line])
    argv = [*replay_argv(trace, tmp_path, "--mode", mode, "--json", "--page-size", "16")]
    proc = run_kvcore(argv, tmp_path, limit_bytes=1 << 30)
    assert proc.returncode == 0, proc.stderr
    lru = json.loads(proc.stdout)["results"]["lru"]
    if mode == "timed":
        assert (lru["num_served"], lru["num_refused_too_large"]) == (0, 1)
    else:  # sequential replays prompts only
        assert (lru["num_served"], lru["prompt_tokens"]) == (1, 10)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_subprocess_capacity_beyond_memory_is_one_line(tmp_path: Path) -> None:
    # The real core, no patching: 2e9 pages need 24 GiB of counts and links; under a 2 GiB address
    # space the core's fallible allocation raises OutOfMemoryError (it used to abort with SIGABRT).
    argv = ["replay", "--requests", "10", "--capacity-pages", "2000000000", "--no-plot"]
    proc = run_kvcore([*argv, "--out", str(tmp_path)], tmp_path, limit_bytes=2 << 30)
    assert proc.returncode == 2, proc.stderr
    one_line(proc.stderr, "out of memory", "cannot allocate")


# ---- FIFOs, empty values, --out and --instances (replay) -------------------------------------------


def _in_thread(func: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """``func()`` in a daemon thread, failing the test if it has not returned within ``timeout_s`` (a
    call that used to block forever on a FIFO)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(func()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still blocked after {timeout_s} s"
    assert box, "the call raised in its thread"
    return box[0]


def refused_in_time(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """:func:`refused`, the command run in a thread that must end in time (one that used to hang)."""
    code = _in_thread(lambda: kvcore.cli.main(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == ""
    return one_line(err, *needles)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_trace_fifo_no_process_writes_is_refused_after_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # open() of a FIFO for reading waits for a writer: kvcore replay FIFO hung forever.
    monkeypatch.setattr(kvcore.replay.trace, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "t.fifo"
    os.mkfifo(fifo)
    refused_in_time(
        replay_argv(fifo, tmp_path), capsys, "t.fifo", "a FIFO that no process wrote to within 0.3 s"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_trace_fifo_whose_writer_comes_late_is_read(tmp_path: Path) -> None:
    # mkfifo p; kvcore replay p & zcat t.gz > p: the reader opens first, the writer after it.
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW)] * 4)
    fifo = tmp_path / "t.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        time.sleep(0.5)
        with open(fifo, "wb") as f:
            f.write(path.read_bytes())

    threading.Thread(target=writer, daemon=True).start()
    trace = _in_thread(lambda: read_trace(fifo, block_size=16))
    assert trace.num_requests == 4


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_trace_streamed_through_a_fifo_is_read(tmp_path: Path) -> None:
    # A FIFO with a writer streams (kvcore replay <(zcat trace.jsonl.gz)): read as the file would be.
    rows = [json.dumps({**ROW, "timestamp": i, "hash_ids": [1, 2 + i]}) for i in range(20)]
    path = write_lines(tmp_path / "t.jsonl", rows)
    fifo = tmp_path / "t.fifo"
    os.mkfifo(fifo)
    data = path.read_bytes()

    def writer() -> None:
        with open(fifo, "wb") as f:  # blocks until the reader opens its end
            for k in range(0, len(data), 7):  # in pieces smaller than a line
                f.write(data[k : k + 7])
                f.flush()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    streamed = _in_thread(lambda: read_trace(fifo, block_size=16))
    thread.join(10)
    expected = read_trace(path, block_size=16)
    assert streamed.num_requests == expected.num_requests == 20
    assert np.array_equal(streamed.hash_ids, expected.hash_ids)
    assert np.array_equal(streamed.timestamps_ms, expected.timestamps_ms)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_save_trace_to_a_fifo_no_process_reads_is_refused_after_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # open(FIFO, "w") waits for a reader: --save-trace FIFO hung forever before the replay began.
    monkeypatch.setattr(kvcore.replay.trace, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)
    argv = ["replay", "--requests", "5", "--save-trace", str(fifo), "--no-plot", "--out", str(tmp_path)]
    refused_in_time(argv, capsys, "w.fifo", "a FIFO that no process read within 0.3 s")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_save_trace_streams_to_a_fifo_with_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as f:  # blocks until the writer opens its end
            got.append(f.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(0.2)  # the reader is waiting in open() (a reader that came later would do too)
    trace = read_trace(write_lines(tmp_path / "t.jsonl", [json.dumps(ROW)] * 3), block_size=16)
    _in_thread(lambda: write_trace(trace, fifo))
    thread.join(10)
    (tmp_path / "back.jsonl").write_bytes(got[0])
    back = read_trace(tmp_path / "back.jsonl", block_size=16)
    assert back.num_requests == 3 and np.array_equal(back.hash_ids, trace.hash_ids)


def test_a_trace_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # A config's BOM was skipped, a trace's refused as "not valid JSON" on line 1.
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(ROW) + "\n").encode() * 2)
    trace = read_trace(path, block_size=16)
    assert trace.num_requests == 2 and trace.hash_ids.tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--capacity-tokens", "--capacity-tokens"),
        ("--capacity-bytes", "--capacity-bytes"),
        ("--sweep-tokens", "--sweep-tokens"),
        ("--save-trace", "No such file"),
        ("--weight-bytes", "--weight-bytes"),
        ("--params", "--params"),
        ("--out", "--out"),
    ],
)
def test_an_empty_value_is_refused_not_ignored(
    flag: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `if args.capacity_tokens:` read --capacity-tokens= as "not given": the replay ran at the default
    # capacity, exit 0.
    argv = ["replay", "--requests", "5", "--no-plot", "--out", str(tmp_path), f"{flag}="]  # (the last wins)
    if flag in ("--weight-bytes", "--params"):
        argv += ["--model", "llama-3.1-8b", "--gpu", "H100-80G"]
    refused(argv, capsys, needle)


@pytest.mark.parametrize("kind", ["file", "file_parent", "dangling_link"])
def test_a_bad_out_is_refused_before_the_replay_runs(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # --out naming a file was found by mkdir after the whole replay (minutes on a real trace), whose
    # results were then lost.
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = {"file": afile, "file_parent": afile / "sub", "dangling_link": tmp_path / "link"}[kind]
    if kind == "dangling_link":
        out.symlink_to(tmp_path / "nowhere")
    ran: list[object] = []
    monkeypatch.setattr(kvcore.replay.engine, "run_replay", lambda *a, **k: ran.append(a))
    for extra in ([], ["--pressure", "none", "--load", "1"], ["--instances", "2"]):
        argv = ["replay", "--requests", "5", *extra, "--no-plot", "--out", str(out)]
        refused(argv, capsys, "--out", "not a directory")
    assert not ran


def test_an_out_in_a_new_directory_is_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a" / "b"
    code, _, err = cli(
        ["replay", "--requests", "5", "--policy", "lru", "--no-plot", "--out", str(out)], capsys
    )
    assert code == 0, err
    assert (out / "report.json").is_file()


def test_more_instances_than_requests_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_lines(tmp_path / "t.jsonl", [json.dumps(ROW)] * 5)
    refused(replay_argv(trace, tmp_path, "--instances", "6"), capsys, "--instances", "6", "5 requests")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_instances_hold_memory_by_the_trace_not_by_the_index_cap(tmp_path: Path) -> None:
    # Each instance's remote index was 4 M slots whatever the trace: --instances 100 on a five-line trace
    # held 8.6 GB. It is now the pages the trace can store: 40 instances of 40 short requests fit 1 GiB.
    trace = write_lines(
        tmp_path / "t.jsonl", [json.dumps({**ROW, "hash_ids": [1, 2 + i]}) for i in range(40)]
    )
    argv = replay_argv(trace, tmp_path, "--instances", "40", "--json")
    proc = run_kvcore(argv, tmp_path, limit_bytes=1 << 30)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["num_instances"] == 40


def test_a_whole_number_past_int64_names_the_upper_bound() -> None:
    """--seed 99999999999999999999999 said "must be >= 0": the bound it broke is the upper one."""
    import argparse

    from kvcore.cli import int_arg

    parse = int_arg(0)
    with pytest.raises(argparse.ArgumentTypeError, match=r"in \[0, 9,223,372,036,854,775,807\]"):
        parse("99999999999999999999999")
    with pytest.raises(argparse.ArgumentTypeError, match=r"in \[0, 9,223,372,036,854,775,807\]"):
        parse("9223372036854775808")
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -1"):
        parse("-1")
    assert parse("9223372036854775807") == 2**63 - 1
