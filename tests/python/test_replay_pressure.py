"""``kvcore replay --pressure``: the trace through kvcore.scheduler at several loads, with and without the
pressure controller. Checked against the accounting (every request served or refused, with a reason),
against a hand-computed tiny trace, and on a real overload (the Mooncake conversation trace's first
requests on a small cache at 3x their rate), where graduated control must beat none on goodput and
p99 time to first token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvcore.cli
import kvcore.replay.engine
from kvcore import KVCacheManager
from kvcore.exceptions import ConfigError
from kvcore.replay import read_trace
from kvcore.replay.pressure import PressureReplayConfig, replay_pressure
from kvcore.scheduler import Scheduler

CONVERSATION = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"
)
needs_trace = pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not available")


def write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_tiny_trace_by_hand(tmp_path: Path) -> None:
    """Two requests, no contention: each prefills at 1,000 tokens/s and decodes 3 steps of 0.1 s."""
    rows = [
        {"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 10_000, "input_length": 100, "output_length": 3, "hash_ids": [1, 3]},
    ]
    trace = read_trace(write_trace(tmp_path / "t.jsonl", rows), block_size=50)
    cfg = PressureReplayConfig(capacity_pages=100, page_size=10, prefill_rate=1000.0, decode_rate=10.0)
    r = replay_pressure(trace, cfg, pressure="none")
    assert (r.num_served, r.num_refused, r.num_good) == (2, 0, 2)
    # The first token comes with the prefill step: 100 tokens, then 50 (the shared block hits).
    assert r.ttft_p99_s == pytest.approx(0.1, abs=1e-9) or r.ttft_p99_s <= 0.1 + 1e-9
    # 10 s of arrivals, then request 1: 0.05 s of prefill and 2 decode steps.
    assert r.simulated_s == pytest.approx(10.0 + 0.05 + 0.2)
    assert r.goodput_rps == pytest.approx(2 / r.simulated_s)  # per second the replay ran
    assert r.num_preemptions == 0 and r.preemption_tax == 0.0
    assert r.queue_wait_p50_s == r.queue_wait_p99_s == 0.0  # each admitted on arrival


def test_goodput_is_per_second_of_the_replay_even_when_all_arrive_at_once(tmp_path: Path) -> None:
    """Goodput divides the good requests by the simulated span the replay ran (first arrival to the end
    of the last request), never by the arrivals' own span, which is 0 here (it was 2 / 1e-9 = 2e9/s)."""
    rows = [
        {"timestamp": 5, "input_length": 100, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 5, "input_length": 100, "output_length": 3, "hash_ids": [3, 4]},
    ]
    trace = read_trace(write_trace(tmp_path / "t.jsonl", rows), block_size=50)
    cfg = PressureReplayConfig(capacity_pages=100, page_size=10, prefill_rate=1000.0, decode_rate=10.0)
    r = replay_pressure(trace, cfg, pressure="none")
    # One step prefills both (0.2 s) and two decode steps of 0.1 s finish both: 2 good in 0.4 s.
    assert r.num_good == 2 and r.simulated_s == pytest.approx(0.4)
    assert r.goodput_rps == pytest.approx(2 / 0.4)
    # Nothing good: 0 per second, whatever the span (a request too large for the cache, refused at once).
    huge = [{"timestamp": 0, "input_length": 5000, "output_length": 3, "hash_ids": list(range(100))}]
    none = replay_pressure(read_trace(write_trace(tmp_path / "h.jsonl", huge), block_size=50), cfg)
    assert (none.num_good, none.num_refused, none.goodput_rps) == (0, 1, 0.0)


def test_the_pressure_replay_is_the_timed_replays_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--pressure runs on the timed replay's engine (kvcore.replay.engine), whose every decision is its
    Scheduler's: one that runs a single request at a time makes two simultaneous requests run one after
    the other."""
    rows = [
        {"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [3, 4]},
    ]
    trace = read_trace(write_trace(tmp_path / "t.jsonl", rows), block_size=50)
    cfg = PressureReplayConfig(capacity_pages=100, page_size=10, prefill_rate=1000.0, decode_rate=10.0)
    both = replay_pressure(trace, cfg, pressure="none")
    # One step prefills both (0.2 s), two decode steps of 0.1 s finish both.
    assert both.simulated_s == pytest.approx(0.4) and both.queue_wait_p99_s == 0.0

    class OneAtATime(Scheduler):
        def __init__(self, cache: KVCacheManager, **kw: Any) -> None:
            super().__init__(cache, **{**kw, "max_num_seqs": 1})

    monkeypatch.setattr(kvcore.replay.engine, "Scheduler", OneAtATime)
    one = replay_pressure(trace, cfg, pressure="none")
    assert one.simulated_s == pytest.approx(2 * (0.1 + 0.2))  # 0.1 s of prefill, 2 decode steps each
    assert one.queue_wait_p99_s == pytest.approx(0.3, rel=0.02) and one.num_served == 2


@needs_trace
@pytest.mark.parametrize("pressure", ["none", "graduated"])
def test_every_request_ends_served_or_refused(pressure: str) -> None:
    trace = read_trace(CONVERSATION, limit=300)
    cfg = PressureReplayConfig(capacity_pages=6000, prefill_rate=100_000.0, max_queue_wait_s=20.0)
    for load in (1.0, 4.0):
        r = replay_pressure(trace, cfg, pressure=pressure, load=load)
        assert r.num_served + r.num_refused == r.num_submitted == 300
        assert sum(r.refused_by_reason.values()) == r.num_refused
        assert r.num_good <= r.num_served and r.peak_usage <= 1.0


@needs_trace
def test_graduated_control_beats_none_under_overload() -> None:
    """At 3x the rate the small cache serves, unmanaged requests wait out their minute and time out;
    the controller sheds load at submit (503 with Retry-After) so the admitted ones meet the target."""
    trace = read_trace(CONVERSATION, limit=600)
    cfg = PressureReplayConfig(capacity_pages=15_000, prefill_rate=200_000.0)
    none = replay_pressure(trace, cfg, pressure="none", load=3.0)
    grad = replay_pressure(trace, cfg, pressure="graduated", load=3.0)
    assert none.refused_by_reason.get("timeout", 0) > 0
    assert grad.goodput_rps >= 1.5 * none.goodput_rps  # 2.0x measured on these 600 requests
    assert grad.ttft_p99_s < none.ttft_p99_s
    assert grad.queue_wait_p99_s < none.queue_wait_p99_s <= none.ttft_p99_s
    assert grad.refused_by_reason.get("overloaded", 0) > 0 and grad.max_level >= 4
    assert "refuse" in grad.controller_counts


@needs_trace
def test_bad_settings_are_config_errors() -> None:
    trace = read_trace(CONVERSATION, limit=5)
    cfg = PressureReplayConfig(capacity_pages=100)
    with pytest.raises(ConfigError):
        replay_pressure(trace, cfg, pressure="panic")
    with pytest.raises(ConfigError):
        replay_pressure(trace, cfg, load=0.0)
    with pytest.raises(ConfigError):
        PressureReplayConfig(capacity_pages=0)


@needs_trace
def test_the_cli_writes_the_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = [
        "replay", str(CONVERSATION), "--limit", "200", "--capacity-pages", "8000", "--prefill-rate", "100000",
        "--pressure", "none,graduated", "--load", "1,2", "--out", str(out), "--json", "--no-progress",
    ]  # fmt: skip
    assert kvcore.cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["load"], r["pressure"]) for r in doc["results"]] == [
        (1.0, "none"), (1.0, "graduated"), (2.0, "none"), (2.0, "graduated"),
    ]  # fmt: skip
    assert all(r["num_served"] + r["num_refused"] == 200 for r in doc["results"])
    assert (out / "report.json").exists() and (out / "pressure.png").stat().st_size > 0


@needs_trace
def test_the_cli_names_the_plot_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As every other replay does: the text report ends with the report's and the plot's paths."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    argv = [
        "replay", str(CONVERSATION), "--limit", "50", "--capacity-pages", "8000", "--prefill-rate", "100000",
        "--pressure", "none", "--load", "1", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert kvcore.cli.main(argv) == 0
    text = capsys.readouterr().out
    assert f"report written: {out / 'report.json'}" in text
    assert f"plot written: {out / 'pressure.png'}" in text and (out / "pressure.png").stat().st_size > 0


@needs_trace
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pressure", "panic"], "--pressure"),
        (["--pressure", "none", "--load", "0"], "--load"),
        (["--pressure", "none", "--load", "x"], "--load"),
        (["--pressure", "none", "--policy", "lru"], "--policy"),
        (["--pressure", "none", "--host-tier-tokens", "1M"], "--host-tier-tokens"),
    ],
)
def test_cli_errors(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [
        "replay",
        str(CONVERSATION),
        "--limit",
        "5",
        "--capacity-pages",
        "100",
        "--out",
        str(tmp_path),
        *extra,
    ]
    assert kvcore.cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_runs_at_one_load_share_one_goodput_window() -> None:
    """Goodput was good requests over each run's own span: a mode that refused more ended sooner and
    scored higher with the same good requests. same_window puts the runs of one load over the longest
    of their spans (and leaves other loads alone)."""
    from dataclasses import replace

    from kvcore.replay.pressure import PressureResult, same_window

    base = PressureResult(
        pressure="none", load=1.0, num_submitted=10, num_served=8, num_good=8, num_refused=2,
        refused_by_reason={}, num_preemptions=0, preemptions_by_kind={}, preemption_tax=0.0,
        queue_wait_p50_s=0.0, queue_wait_p99_s=0.0, ttft_p99_s=0.0, goodput_rps=8 / 120,
        simulated_s=120.0, num_steps=1, peak_usage=0.5, max_level=0, goodput_window_s=120.0,
    )  # fmt: skip
    quick = replace(base, pressure="graduated", simulated_s=73.0, goodput_rps=8 / 73, goodput_window_s=73.0)
    other = replace(base, load=2.0, simulated_s=50.0, num_good=5, goodput_rps=0.1, goodput_window_s=50.0)
    none_good = replace(base, load=2.0, pressure="graduated", simulated_s=30.0, num_good=0, goodput_rps=0.0)
    a, b, c, d = same_window([base, quick, other, none_good])
    assert a.goodput_rps == b.goodput_rps == pytest.approx(8 / 120)
    assert a.goodput_window_s == b.goodput_window_s == 120.0
    assert b.simulated_s == 73.0  # its own span is still reported
    assert (c.goodput_rps, c.goodput_window_s) == (pytest.approx(5 / 50), 50.0)
    assert (d.goodput_rps, d.goodput_window_s) == (0.0, 50.0)
