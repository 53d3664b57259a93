"""kvcore.replay with lower tiers (host DRAM, disk): hand-computed hits, stores and loads; the bytes moved;
the store policies against each other; the timed mode's load time; the report and JSON fields; the CLI's
tier options and their errors (one line, exit code 2). Small synthetic traces only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvcore.cli
from kvcore.exceptions import ConfigError
from kvcore.replay import (
    DEFAULT_TOKEN_BYTES,
    STORE_POLICIES,
    PolicyResult,
    ReplayConfig,
    Trace,
    WorkloadConfig,
    format_report,
    generate_workload,
    replay,
    run_replay,
)


def make_trace(rows: list[tuple[list[int], int, int]], bs: int, times_ms: list[float] | None = None) -> Trace:
    """Rows of (hash ids, input_length, output_length)."""
    indptr = np.cumsum([0] + [len(r[0]) for r in rows]).astype(np.int64)
    return Trace(
        input_lens=np.array([r[1] for r in rows], dtype=np.int64),
        output_lens=np.array([r[2] for r in rows], dtype=np.int64),
        hash_indptr=indptr,
        hash_ids=np.array([h for r in rows for h in r[0]], dtype=np.int64),
        block_size=bs,
        timestamps_ms=np.array(times_ms, dtype=np.float64) if times_ms is not None else None,
    )


# Pages of 4 tokens, one page per hash id; 8 usable HBM pages. A, B, C have 4 pages each, so A is evicted
# from HBM (LRU) by the time it comes back: only a lower tier can still hold it.
ABCA = make_trace(
    [([1, 2, 3, 4], 16, 1), ([5, 6, 7, 8], 16, 1), ([9, 10, 11, 12], 16, 1), ([1, 2, 3, 4], 16, 1)],
    bs=4,
    times_ms=[0, 1_000_000, 2_000_000, 3_000_000],  # 1000 s apart: each request runs alone
)
PAGE_BYTES = 1_000_000


def seq(trace: Trace, **kw: object) -> PolicyResult:
    cfg = ReplayConfig(capacity_pages=8, page_size=4, mode="sequential", page_bytes=PAGE_BYTES, **kw)  # type: ignore[arg-type]
    return replay(trace, cfg)


def tiers(r: PolicyResult) -> dict[str, tuple[int, int, int]]:
    """name -> (hit tokens, stored pages, loaded pages)."""
    return {t.name: (t.hit_tokens, t.num_stored_pages, t.num_loaded_pages) for t in r.tiers}


def test_sequential_hand_computed_all() -> None:
    hbm = seq(ABCA)
    assert (hbm.hit_tokens, hbm.tiers, hbm.store_policy) == (0, [], None)
    r = seq(ABCA, host_tier_slots=16, disk_tier_slots=32, store_policy="all")
    # Write-through: every page cached in HBM is stored to both tiers (12 distinct pages); A's second
    # lookup finds it in host (the fastest tier holding it), capped at len - 1: 3 pages loaded.
    assert tiers(r) == {"host": (12, 12, 3), "disk": (0, 12, 0)}
    assert r.hit_tokens_by_tier == {"hbm": 0, "host": 12, "disk": 0}
    assert (r.hit_tokens, r.prefill_tokens_saved, r.tier_hit_tokens) == (12, 12, 12)
    assert r.hit_pages == 3 and r.num_served == 4
    host, disk = r.tiers
    assert (host.stored_bytes, host.loaded_bytes) == (12 * PAGE_BYTES, 3 * PAGE_BYTES)
    assert (disk.stored_bytes, disk.loaded_bytes) == (12 * PAGE_BYTES, 0)
    assert (r.stored_bytes, r.loaded_bytes) == (24 * PAGE_BYTES, 3 * PAGE_BYTES)
    assert host.num_slots_cached == 12 and host.num_evicted_slots == 0
    assert host.num_store_skipped_no_room == host.num_store_skipped_in_flight == 0
    assert host.load_s == pytest.approx(3 * PAGE_BYTES / 25e9)  # what the loads take at 25 GB/s
    assert host.num_store_failed_pages == host.num_load_failed_pages == 0


def test_selective_stores_only_what_was_hit() -> None:
    # No page is hit in HBM, so selective (pages hit again) stores nothing and finds nothing below.
    r = seq(ABCA, host_tier_slots=16, store_policy="selective")
    assert tiers(r) == {"host": (0, 0, 0)}
    # A page-aligned prompt hit twice in HBM is stored on its second hit (min_hits = 2), then found in
    # host after HBM lost it. A hit is capped at len - 1, so only its first page is hit, hence stored.
    trace = make_trace(
        [([1, 2], 8, 0), ([1, 2], 8, 0), ([1, 2], 8, 0), ([3, 4, 5, 6, 7, 8, 9, 10], 32, 0), ([1, 2], 8, 0)],
        bs=4,
    )
    r = seq(trace, host_tier_slots=16, store_policy="selective")
    (host,) = r.tiers
    assert host.num_stored_pages == 1 and host.hit_tokens == 4 and host.num_loaded_pages == 1
    # HBM hits uncapped (R1, R2: 8 tokens each, page-aligned and wholly in HBM); R4 capped, from host.
    assert r.hit_tokens_by_tier == {"hbm": 16, "host": 4}


def test_host_too_small_evicts_and_counts() -> None:
    # 4 host slots hold one prompt: each new prompt evicts the last one's slots; A is gone when it returns.
    r = seq(ABCA, host_tier_slots=4, store_policy="all")
    (host,) = r.tiers
    assert (host.num_stored_pages, host.num_evicted_slots, host.hit_tokens) == (16, 12, 0)
    assert host.num_slots_cached == 4


@pytest.mark.parametrize("mode", ["sequential", "timed"])
@pytest.mark.parametrize("store_policy", STORE_POLICIES)
def test_tiers_never_lower_the_hit_rate(mode: str, store_policy: str) -> None:
    trace = generate_workload(WorkloadConfig(seed=3, num_requests=300))
    hbm = replay(trace, ReplayConfig(capacity_pages=4_000, page_size=16, mode=mode))
    kw = dict(host_tier_slots=8_000, disk_tier_slots=40_000, store_policy=store_policy)
    r = replay(trace, ReplayConfig(capacity_pages=4_000, page_size=16, mode=mode, **kw))  # type: ignore[arg-type]
    assert r.prompt_tokens == hbm.prompt_tokens and r.num_refused == hbm.num_refused == 0
    assert r.hit_rate_tokens >= hbm.hit_rate_tokens
    assert r.prefill_tokens_saved >= hbm.prefill_tokens_saved
    assert sum(r.hit_tokens_by_tier.values()) == r.hit_tokens
    for t in r.tiers:
        assert t.stored_bytes == t.num_stored_pages * DEFAULT_TOKEN_BYTES * 16
        assert t.loaded_bytes == t.num_loaded_pages * DEFAULT_TOKEN_BYTES * 16
        assert t.num_slots_cached <= t.num_slots
        assert t.load_s == pytest.approx(t.loaded_bytes / (t.bandwidth_gbps * 1e9))
        if mode == "sequential":  # every lower-tier hit is a page loaded once (no preemption reloads)
            assert t.num_loaded_pages * 16 == t.hit_tokens
    if store_policy == "all":  # write-through on a workload with reuse: the tiers must find something
        assert r.tier_hit_tokens > 0 and r.hit_rate_tokens > hbm.hit_rate_tokens


def test_all_stores_at_least_what_selective_stores() -> None:
    trace = generate_workload(WorkloadConfig(seed=1, num_requests=300))

    def stored(policy: str) -> int:
        cfg = ReplayConfig(
            capacity_pages=600, page_size=16, mode="sequential", host_tier_slots=4_000, store_policy=policy
        )
        return sum(t.num_stored_pages for t in replay(trace, cfg).tiers)

    assert stored("all") >= stored("selective") > 0
    assert seq(ABCA, host_tier_slots=16, store_policy="all").tiers[0].num_stored_pages > 0
    assert seq(ABCA, host_tier_slots=16, store_policy="selective").tiers[0].num_stored_pages == 0


def test_value_policy_weighs_the_replays_page_bytes() -> None:
    # Distinct 4-page prompts, pages of 16 tokens. The value model (rust/manager/tiers.rs) stores a page
    # first cached at depth d when reuses(0, d) * (prefill - reload) > store: with 2 MiB pages a host
    # reload is 84 us against 400 us of prefill (stored); a disk reload is 419 us, more than the prefill
    # (never worth it). With 64 KiB pages both tiers are worth it.
    trace = make_trace([([i], 64, 0) for i in range(10)], bs=64)

    def stored(page_bytes: int | None) -> dict[str, int]:
        cfg = ReplayConfig(
            capacity_pages=100,
            page_size=16,
            mode="sequential",
            host_tier_slots=1_000,
            disk_tier_slots=1_000,
            store_policy="value",
            page_bytes=page_bytes,
        )
        r = replay(trace, cfg)
        assert r.page_bytes == (page_bytes or 2 * 2**20)
        return {t.name: t.num_stored_pages for t in r.tiers}

    assert stored(None) == {"host": 40, "disk": 0}
    assert stored(64 * 2**10) == {"host": 40, "disk": 40}


def test_timed_load_time_replaces_prefill() -> None:
    # R3 finds 3 pages of A in host. Its prefill waits for the loads, 3 x 1 MB at 1 MB/s = 3 s, then
    # computes the 4 tokens found nowhere; without the tier it computes all 16. Each request's one output
    # token is sampled from its prefill step's logits (no decode step). Requests are 1000 s apart, so R3
    # ends the run.
    def run(**kw: object) -> PolicyResult:
        cfg = ReplayConfig(capacity_pages=8, page_size=4, mode="timed", page_bytes=PAGE_BYTES, **kw)  # type: ignore[arg-type]
        return replay(ABCA, cfg)

    hbm = run()
    assert hbm.simulated_s == pytest.approx(3000 + 16 / 10_000)
    r = run(host_tier_slots=16, store_policy="all", host_bandwidth_gbps=0.001)
    (host,) = r.tiers
    assert (host.hit_tokens, host.num_loaded_pages) == (12, 3)
    assert host.load_s == pytest.approx(3.0)
    assert r.simulated_s == pytest.approx(3000 + 3.0 + 4 / 10_000)
    assert (r.num_served, r.num_preemptions, r.queue_wait_max_s) == (4, 0, 0.0)


def test_config_validation() -> None:
    for kw in (
        {"host_tier_slots": -1},
        {"disk_tier_slots": 1.5},
        {"store_policy": "some"},
        {"host_bandwidth_gbps": 0.0},
        {"disk_bandwidth_gbps": float("inf")},
        {"page_bytes": 0},
        {"page_bytes": True},
    ):
        with pytest.raises(ConfigError):
            ReplayConfig(capacity_pages=8, **kw)  # type: ignore[arg-type]
    cfg = ReplayConfig(capacity_pages=8, page_size=4, disk_tier_slots=3)
    assert cfg.lower_tiers == [("disk", 3, 5.0)] and cfg.page_nbytes == 4 * DEFAULT_TOKEN_BYTES
    assert ReplayConfig(capacity_pages=8).lower_tiers == []


def test_report_text_and_json_have_the_tier_fields() -> None:
    cfg = ReplayConfig(
        capacity_pages=8,
        page_size=4,
        mode="sequential",
        host_tier_slots=16,
        store_policy="all",
        page_bytes=2**20,
    )
    report = run_replay(ABCA, cfg, policies=("lru", "lfu"), progress=False)
    doc = json.loads(report.to_json())
    lru = doc["results"]["lru"]
    assert lru["store_policy"] == "all" and lru["page_bytes"] == 2**20
    assert lru["hit_tokens_by_tier"] == {"hbm": 0, "host": 12}
    assert lru["tier_prefill_tokens_saved"] == 12
    assert (lru["stored_bytes"], lru["loaded_bytes"]) == (12 * 2**20, 3 * 2**20)
    host = lru["tiers"]["host"]
    assert (host["num_stored_pages"], host["stored_bytes"], host["loaded_bytes"]) == (
        12,
        12 * 2**20,
        3 * 2**20,
    )
    assert set(host) >= {"num_store_skipped_no_room", "num_store_skipped_in_flight", "hit_tokens", "load_s"}
    assert doc["settings"]["lower_tiers"] == [{"name": "host", "num_slots": 16, "bandwidth_gbps": 25.0}]
    assert doc["settings"]["store_policy"] == "all"
    text = format_report(report)
    assert "tiers      host 16 pages (64 tokens, 25 GB/s); store policy all, 1.00 MiB per page" in text
    for label in ("hits in hbm", "hits in host", "prefill saved by tiers", "host stored/loaded"):
        assert label in text
    assert "12.00 MiB / 3.00 MiB" in text and "0 no room, 0 in flight, 0 failed" in text
    # Without tiers, none of it.
    plain = run_replay(ABCA, ReplayConfig(capacity_pages=8, page_size=4, mode="sequential"), progress=False)
    plain_doc = plain.to_dict()
    assert "lower_tiers" not in plain_doc["settings"]
    assert not {"tiers", "store_policy", "page_bytes", "stored_bytes"} & set(plain_doc["results"]["lru"])
    assert "tiers " not in format_report(plain) and "hits in" not in format_report(plain)


# ---- the command line ------------------------------------------------------------------------------


def write_trace(path: Path) -> Path:
    rows = [
        {"timestamp": 1000 * i, "input_length": 16, "output_length": 1, "hash_ids": ids}
        for i, ids in enumerate([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [1, 2, 3, 4]])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    argv = [
        "replay",
        str(write_trace(tmp_path / "t.jsonl")),
        "--trace-block-size",
        "4",
        "--page-size",
        "4",
        "--capacity-pages",
        "8",
        "--policy",
        "lru",
        "--no-plot",
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]
    code = kvcore.cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_cli_tier_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    code, out, err = cli(
        tmp_path,
        capsys,
        *("--mode", mode, "--json", "--host-tier-tokens", "64", "--disk-tier-tokens", "1k"),
        *("--store-policy", "all", "--host-bandwidth-gbps", "10", "--disk-bandwidth-gbps", "2.5"),
        *("--page-bytes", "1MiB"),
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["lower_tiers"] == [
        {"name": "host", "num_slots": 16, "bandwidth_gbps": 10.0},
        {"name": "disk", "num_slots": 256, "bandwidth_gbps": 2.5},  # 1k = 1024 tokens / 4 per page
    ]
    lru = doc["results"]["lru"]
    assert lru["page_bytes"] == 2**20 and lru["store_policy"] == "all"
    assert lru["hit_tokens_by_tier"] == {"hbm": 0, "host": 12, "disk": 0}
    assert lru["tiers"]["host"]["loaded_bytes"] == 3 * 2**20


def test_cli_tier_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(tmp_path, capsys, "--mode", "sequential", "--json", "--disk-tier-tokens", "64")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["lower_tiers"] == [{"name": "disk", "num_slots": 16, "bandwidth_gbps": 5.0}]
    assert doc["settings"]["store_policy"] == "selective"
    assert doc["settings"]["page_bytes"] == 4 * DEFAULT_TOKEN_BYTES  # no model: 128 KiB a token
    # --model gives the bytes of a page: llama-3.1-8b in fp8 is 64 KiB a token.
    code, out, err = cli(
        tmp_path,
        capsys,
        *("--mode", "sequential", "--json", "--host-tier-tokens", "64"),
        "--model",
        "llama-3.1-8b",
    )
    assert code == 0, err
    assert json.loads(out)["settings"]["page_bytes"] == 4 * 128 * 2**10
    code, out, err = cli(
        tmp_path,
        capsys,
        *("--mode", "sequential", "--json", "--host-tier-tokens", "64"),
        *("--model", "llama-3.1-8b", "--kv-dtype", "fp8"),
    )
    assert code == 0, err
    assert json.loads(out)["settings"]["page_bytes"] == 4 * 64 * 2**10


def test_cli_text_report_shows_the_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(
        tmp_path, capsys, "--mode", "timed", "--host-tier-tokens", "64", "--store-policy", "all"
    )
    assert code == 0, err
    assert "host 16 pages (64 tokens, 25 GB/s); store policy all, 512.00 KiB per page" in out
    assert "host load time" in out and "hits in host" in out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--host-tier-tokens", "lots"], "--host-tier-tokens"),
        (["--host-tier-tokens", "3"], "--host-tier-tokens: '3' is less than one page"),
        (["--disk-tier-tokens", "-4"], "--disk-tier-tokens"),
        (["--host-tier-tokens", "64", "--store-policy", "some"], "--store-policy"),
        (["--host-tier-tokens", "64", "--host-bandwidth-gbps", "0"], "--host-bandwidth-gbps"),
        (["--host-tier-tokens", "64", "--disk-bandwidth-gbps", "inf"], "--disk-bandwidth-gbps"),
        (["--host-tier-tokens", "64", "--page-bytes", "0"], "--page-bytes"),
        (["--host-tier-tokens", "64", "--page-bytes", "much"], "--page-bytes"),
        (["--host-tier-tokens", "64", "--page-bytes", "1MiB", "--model", "llama-3.1-8b"], "--page-bytes"),
        (["--store-policy", "all"], "--store-policy needs a lower tier"),
        (["--page-bytes", "1MiB"], "--page-bytes needs a lower tier"),
        (["--host-bandwidth-gbps", "10"], "--host-bandwidth-gbps needs a lower tier"),
        # Finite and > 0, but a page takes an infinite time to load: report.json could not hold it.
        (
            [
                "--mode",
                "timed",
                "--host-tier-tokens",
                "64",
                "--store-policy",
                "all",
                "--host-bandwidth-gbps",
                "1e-320",
            ],
            "overflows",
        ),
    ],
)
def test_cli_bad_tier_options_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    code, out, err = cli(tmp_path, capsys, *extra)
    assert code == 2 and out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcore replay: error: "), err
    assert needle in lines[0], lines[0]
