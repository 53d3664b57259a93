"""``kvcore replay`` from the command line: the report, --json, the plot, and errors on stderr with exit
code 2. Through ``kvcore.cli.main``, which is where errors become one line and the exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvcore.cli


def run(argv: list[str]) -> int:
    return kvcore.cli.main(["replay", *argv])


def write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 100, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 4]},
    {"timestamp": 200, "input_length": 20, "output_length": 4, "hash_ids": [1, 5]},
]


def test_json_report_on_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    argv = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    code = run([*argv, "--mode", "sequential", "--json", "--out", str(tmp_path / "out"), "--no-plot"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    lru = doc["results"]["lru"]
    # Request 1 shares 32 tokens (blocks 1 and 2 = 8 pages); request 2 shares block 1 (16 tokens).
    assert lru["hit_rate_tokens"] == pytest.approx((32 + 16) / 100)
    assert lru["hit_rate_pages"] == pytest.approx((8 + 4) / 25)
    assert (lru["num_requests"], lru["num_refused"], lru["num_evicted_pages"]) == (3, 0, 0)
    assert set(doc["results"]) == {"lru", "lfu", "priority"}
    assert doc["mode"] == "sequential" and doc["capacity"]["pages"] == 100
    assert json.loads((tmp_path / "out" / "report.json").read_text())["results"]["lru"] == lru


def test_built_in_workload_with_sweep_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    argv = [
        "--requests",
        "150",
        "--policy",
        "lru",
        "--capacity-tokens",
        "40000",
        "--sweep-tokens",
        "10000,80000",
    ]
    assert run([*argv, "--out", str(out), "--progress"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "kvcore replay: built-in workload (seed 0), timed mode" in text
    assert "hit rate (tokens) vs capacity" in text
    for name in ("timeline-timed.png", "sweep-timed.png"):
        png = out / name
        assert f"plot written: {png}" in text
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "requests" in captured.err  # the progress bar, forced on


def test_save_trace_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "gen.jsonl"
    common = ["--policy", "lru", "--capacity-pages", "3000", "--json", "--no-plot", "--out", str(tmp_path)]
    assert run(["--requests", "100", "--save-trace", str(saved), *common]) == 0
    first = json.loads(capsys.readouterr().out)["results"]["lru"]
    assert run([str(saved), "--trace-block-size", "16", *common]) == 0
    second = json.loads(capsys.readouterr().out)["results"]["lru"]
    for key in ("hit_tokens", "num_evicted_pages", "num_preemptions", "prompt_tokens", "simulated_s"):
        assert first[key] == second[key]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{trace}", "--trace-block-size", "8"], "line 1, field 'hash_ids'"),
        (["{missing}"], "No such file"),
        (["{trace}", "--trace-block-size", "16", "--policy", "fifo"], "--policy"),
        (["{trace}", "--trace-block-size", "16", "--capacity-bytes", "1GiB"], "needs --model"),
        (["{trace}", "--trace-block-size", "16", "--model", "nope-7b", "--gpu", "H100-80G"], "nope-7b"),
        (
            ["{trace}", "--trace-block-size", "16", "--capacity-pages", "5", "--capacity-tokens", "80"],
            "one of",
        ),
        (["--requests", "10", "--capacity-tokens", "lots"], "--capacity-tokens"),
    ],
)
def test_errors_go_to_stderr_with_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    argv = [a.format(trace=trace, missing=tmp_path / "missing.jsonl") for a in argv]
    assert run([*argv, "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kvcore replay: error: ") and message in captured.err
    assert "Traceback" not in captured.err


def test_timed_mode_needs_timestamps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{k: v for k, v in r.items() if k != "timestamp"} for r in ROWS]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    argv = [str(trace), "--trace-block-size", "16", "--mode", "timed", "--out", str(tmp_path), "--no-plot"]
    assert run(argv) == 2
    assert "timestamps" in capsys.readouterr().err


def test_timed_json_names_the_scheduler_chunk_and_decode_chunk_is_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old command lines with --decode-chunk still run, give the same figures and say it is ignored;
    the settings give the prompt tokens a request computes per step instead."""
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    base = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    base += ["--policy", "lru", "--json", "--no-plot", "--out", str(tmp_path / "out")]
    assert run([*base, "--decode-chunk", "8"]) == 0
    with_chunk = capsys.readouterr()
    assert run(base) == 0
    without = capsys.readouterr()
    assert "--decode-chunk is ignored" in with_chunk.err and without.err == ""
    a, b = json.loads(with_chunk.out), json.loads(without.out)
    assert a["mode"] == "timed" and a["settings"]["prefill_chunk_tokens"] == 200  # 10,000 / 50 tok/s
    assert "decode_chunk" not in a["settings"]
    for doc in (a, b):
        del doc["results"]["lru"]["elapsed_s"]
    assert a["results"] == b["results"] and a["results"]["lru"]["num_served"] == 3


@pytest.mark.parametrize("model", ["gemma-3-27b", "llama-3.1-8b"])  # hybrid (7 KV-cache groups), plain
def test_gpu_and_capacity_bytes_flags_give_the_same_cache(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcore.sizing import load_model, plan

    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    common = [str(trace), "--trace-block-size", "16", "--model", model, "--policy", "lru", "--json"]
    common += ["--no-plot", "--out", str(tmp_path / "out")]
    pool_bytes = plan(model, gpu="H200-141G").pool_bytes
    caps = []
    for flags in (["--gpu", "H200-141G"], ["--capacity-bytes", str(pool_bytes)]):
        assert run([*common, *flags]) == 0
        caps.append(json.loads(capsys.readouterr().out)["capacity"])
    page = load_model(model).page_bytes(16)  # 16 tokens of every layer: the replayed manager's page
    for cap in caps:
        assert (cap["pages"], cap["page_bytes"]) == (pool_bytes // page - 1, page)
        assert cap["bytes"] <= pool_bytes


CONFIG = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "configs" / "llama-3.1-8b.json"


@pytest.mark.skipif(not CONFIG.is_file(), reason=f"no {CONFIG}")
def test_a_config_json_on_a_gpu_takes_its_weights_from_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A config.json declares no weight size: --weight-bytes (or --params) gives it, as for kvcore plan.
    from kvcore.replay.capacity import resolve_capacity

    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    base = [str(trace), "--trace-block-size", "16", "--mode", "sequential", "--policy", "lru", "--no-plot"]
    assert run([*base, "--model", str(CONFIG), "--gpu", "H100-80G"]) == 2
    assert "--weight-bytes or --params" in capsys.readouterr().err
    out = tmp_path / "out"
    argv = [*base, "--model", str(CONFIG), "--gpu", "H100-80G", "--weight-bytes", "16GB", "--json"]
    assert run([*argv, "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = resolve_capacity(model="llama-3.1-8b", gpu="H100-80G", weight_bytes=16 * 10**9)
    assert doc["capacity"]["pages"] == want.pages  # the same architecture as the preset
    assert run([*base, "--capacity-pages", "50", "--params", "8B"]) == 2
    assert "need --gpu" in capsys.readouterr().err


def test_save_trace_writes_the_workload_under_pressure_too(tmp_path: Path) -> None:
    from kvcore.replay.trace import read_trace

    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    saved = tmp_path / "saved.jsonl"
    argv = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    code = run([*argv, "--pressure", "none", "--save-trace", str(saved), "--out", str(tmp_path / "o")])
    assert code == 0
    back = read_trace(saved, block_size=16)
    assert back.input_lens.tolist() == [40, 40, 20]


def test_with_refusals_the_report_adds_hits_over_all_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The third request never fits: the served hit rate is over 80 tokens, the best case over 480.
    rows = [
        *ROWS[:2],
        {"timestamp": 300, "input_length": 400, "output_length": 4, "hash_ids": list(range(9, 34))},
    ]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    argv = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "40"]
    assert (
        run([*argv, "--mode", "sequential", "--policy", "lru", "--no-plot", "--out", str(tmp_path / "o")])
        == 0
    )
    text = capsys.readouterr().out
    served = next(line for line in text.splitlines() if line.strip().startswith("hit rate (tokens), served"))
    every = next(line for line in text.splitlines() if line.strip().startswith("of all prompt tokens"))
    assert served.split()[-2:] == ["40.0", "%"]  # 32 of the 80 served tokens
    assert every.split()[-2:] == ["6.7", "%"]  # 32 of all 480


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        # options of --pressure without it
        (["--load", "2"], "--load needs --pressure"),
        (["--ttft-target", "5"], "--ttft-target needs --pressure"),
        (["--max-num-seqs", "8"], "--max-num-seqs needs --pressure"),
        (["--max-num-batched-tokens", "64"], "--max-num-batched-tokens needs --pressure"),
        # the pace of a timed replay in a sequential one (also when the value is the default)
        (["--mode", "sequential", "--prefill-rate", "10000"], "--prefill-rate paces the timed replay"),
        (["--mode", "sequential", "--decode-rate", "7"], "--decode-rate paces the timed replay"),
        (["--mode", "sequential", "--max-queue-wait", "1"], "--max-queue-wait paces the timed replay"),
        # the built-in workload's seed with a TRACE
        (["--seed", "3"], "--seed seeds the built-in workload"),
        # the precision and TP of a model's pages with no model to size
        (["--kv-dtype", "fp8"], "--kv-dtype sizes pages of --model"),
        (["--tp", "2"], "--tp sizes pages of --model"),
        # lower-tier options under --pressure (which replays one HBM cache)
        (["--pressure", "none", "--store-policy", "all"], "--store-policy is not supported with it"),
        (["--pressure", "none", "--page-bytes", "1MiB"], "--page-bytes is not supported with it"),
        (["--pressure", "none", "--host-bandwidth-gbps", "9"], "--host-bandwidth-gbps is not supported"),
    ],
)
def test_an_option_the_replay_does_not_use_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    """A flag given where it has no effect would read as a measured setting: it is an error naming it,
    before anything runs, and the same command without it runs."""
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    base = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    base += ["--policy", "lru"] if "--pressure" not in argv else []
    base += ["--no-plot", "--out", str(tmp_path / "o"), "--json"]
    assert run([*base, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and flag in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "o").exists()
    value_flags = {"--mode", "--pressure"}
    rest = [a for i, a in enumerate(argv) if a in value_flags or (i > 0 and argv[i - 1] in value_flags)]
    assert run([*base, *rest]) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_trace_block_size_without_a_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--requests", "10", "--trace-block-size", "16", "--no-plot", "--out", str(tmp_path)]) == 2
    assert "--trace-block-size reads a TRACE" in capsys.readouterr().err


def test_the_options_defaults_are_the_configs_defaults() -> None:
    """The CLI fills in the defaults of options it leaves unset in argparse: they must be the ones the
    configs document (and the help strings say)."""
    from kvcore.replay import cli
    from kvcore.replay.engine import ReplayConfig
    from kvcore.replay.generator import WorkloadConfig
    from kvcore.replay.pressure import PressureReplayConfig

    d = cli._DEFAULTS
    assert d["prefill_rate"] == ReplayConfig.prefill_rate == PressureReplayConfig.prefill_rate
    assert d["decode_rate"] == ReplayConfig.decode_rate == PressureReplayConfig.decode_rate
    assert d["max_queue_wait"] == ReplayConfig.max_queue_wait_s == PressureReplayConfig.max_queue_wait_s
    assert d["ttft_target"] == PressureReplayConfig.ttft_target_s
    assert d["max_num_batched_tokens"] == PressureReplayConfig.max_num_batched_tokens
    assert d["max_num_seqs"] == PressureReplayConfig.max_num_seqs
    assert d["seed"] == WorkloadConfig.seed
    help_text = " ".join(_replay_help().split())
    for flag, shown in [
        ("--prefill-rate", "(default 10000)"),
        ("--decode-rate", "(default 50)"),
        ("--max-queue-wait", "(default 60)"),
        ("--ttft-target", "(default 10)"),
        ("--max-num-batched-tokens", "(default 2048)"),
        ("--max-num-seqs", "(default 256)"),
        ("--seed", "(default 0)"),
        ("--trace-block-size", "(default 512)"),
    ]:
        entry = help_text.split(f" {flag} ")[1].split(" --")[0]
        assert shown in entry, (flag, entry)


def _replay_help() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        kvcore.cli.main(["replay", "--help"])
    return out.getvalue()


def test_decode_chunk_under_pressure_says_it_is_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    argv = [str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    argv += ["--pressure", "none", "--no-plot", "--out", str(tmp_path / "o"), "--json"]
    assert run([*argv, "--decode-chunk", "8"]) == 0
    assert "--decode-chunk is ignored" in capsys.readouterr().err
