"""kvcore.replay over several instances sharing a remote tier: hand-computed hits an instance never computed
itself, one instance finding only its own stores, the shared tier never lowering the hit rate, a store that
loses pages, the splits, the timed mode's remote load time, the stores (memory and a real Redis), the report
and JSON fields, and the CLI's options and their errors (one line, exit code 2). Small synthetic traces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from redis_servers import RedisServer, require_redis_py

import kvcore.cli
from kvcore.exceptions import ConfigError
from kvcore.replay import (
    InstancesReport,
    MemoryStore,
    ReplayConfig,
    Trace,
    WorkloadConfig,
    format_instances,
    generate_workload,
    replay,
    replay_instances,
    session_keys,
    split_requests,
)
from kvcore.replay.shared import RedisStore, open_store

PAGE_BYTES = 1_000_000


def make_trace(rows: list[tuple[list[int], int]], bs: int = 4, times_ms: list[float] | None = None) -> Trace:
    """Rows of (hash ids, input_length); one output token each."""
    indptr = np.cumsum([0] + [len(r[0]) for r in rows]).astype(np.int64)
    return Trace(
        input_lens=np.array([r[1] for r in rows], dtype=np.int64),
        output_lens=np.ones(len(rows), dtype=np.int64),
        hash_indptr=indptr,
        hash_ids=np.array([h for r in rows for h in r[0]], dtype=np.int64),
        block_size=bs,
        timestamps_ms=np.array(times_ms, dtype=np.float64) if times_ms is not None else None,
    )


# Pages of 4 tokens, one per hash id. The same 4-page prompt four times: round-robin over 2 instances, so
# instance 1's first request finds nothing in its own HBM, only what instance 0 stored in the shared tier.
AAAA = make_trace([([1, 2, 3, 4], 16)] * 4)


def config(**kw: Any) -> ReplayConfig:
    base: dict[str, Any] = dict(
        capacity_pages=8,
        page_size=4,
        mode="sequential",
        page_bytes=PAGE_BYTES,
        remote_index_slots=64,
        store_policy="all",
    )
    base.update(kw)
    return ReplayConfig(**base)


def run(trace: Trace, n: int, store: Any = None, split: str = "round-robin", **kw: Any) -> InstancesReport:
    return replay_instances(trace, config(**kw), num_instances=n, split=split, store=store, progress=False)


def test_two_instances_hand_computed() -> None:
    r = run(AAAA, 2)
    i0, i1 = r.instances
    assert (i0.num_requests, i1.num_requests) == (2, 2)
    # Instance 0 computes A (write-through: its 4 pages go to the shared store), then hits it whole in HBM.
    assert i0.with_remote.hit_tokens_by_tier == {"hbm": 16, "remote": 0}
    assert i0.num_remote_pages_from_others == 0 and i0.num_remote_marked_pages == 0
    # Instance 1 never computed A: its lookup learns the 4 pages from the store, its admission loads 3 of
    # them (a hit is capped at len - 1 = 15 tokens, whole pages: 12), all stored by instance 0.
    assert i1.num_remote_marked_pages == 4 and i1.num_remote_lookups == 1
    assert i1.with_remote.hit_tokens_by_tier == {"hbm": 16, "remote": 12}
    assert i1.num_remote_pages_from_others == 3 and i1.num_remote_load_failures == 0
    remote = i1.with_remote.tiers[-1]
    assert (remote.name, remote.num_loaded_pages, remote.loaded_bytes) == ("remote", 3, 3 * PAGE_BYTES)
    # Without the shared tier each instance computes A once, then hits it in HBM.
    assert i1.without_remote.hit_tokens_by_tier == {"hbm": 16}
    assert i1.without_remote.tiers == []
    assert (r.with_remote["hit_tokens"], r.without_remote["hit_tokens"]) == (44, 32)
    assert r.with_remote["hit_rate_tokens"] == pytest.approx(44 / 64)
    assert r.hit_rate_gain == pytest.approx(12 / 64)
    assert r.remote_hit_tokens == r.remote_tokens_from_others == r.prefill_tokens_saved_by_remote == 12
    assert r.num_store_keys == 4  # the second store of A by instance 1 is the same 4 keys (first store wins)


def test_one_instance_finds_only_its_own_stores() -> None:
    # A comes back after B and C pushed it out of HBM: the remote tier holds it, stored by this instance.
    trace = make_trace([([1, 2, 3, 4], 16), ([5, 6, 7, 8], 16), ([9, 10, 11, 12], 16), ([1, 2, 3, 4], 16)])
    r = run(trace, 1)
    (only,) = r.instances
    assert only.with_remote.hit_tokens_by_tier == {"hbm": 0, "remote": 12}
    assert only.num_remote_pages_from_others == 0
    # Its index knew every page it stored (64 slots, 12 pages): the store never taught it anything.
    assert only.num_remote_marked_pages == 0
    assert r.remote_tokens_from_others == 0 and r.remote_hit_tokens == 12
    # replay() with a remote tier alone is the same run: a private store.
    alone = replay(trace, config())
    assert alone.hit_tokens_by_tier == only.with_remote.hit_tokens_by_tier


def test_one_instance_on_a_workload_never_loads_from_others() -> None:
    trace = generate_workload(WorkloadConfig(seed=5, num_requests=300))
    r = run(trace, 1, capacity_pages=3_000, page_size=16, remote_index_slots=1 << 20)
    (only,) = r.instances
    assert only.num_remote_pages_from_others == 0 and only.num_remote_marked_pages == 0
    assert r.remote_hit_tokens > 0  # its own pages, evicted from HBM and found below


@pytest.mark.parametrize("mode", ["sequential", "timed"])
@pytest.mark.parametrize("split", ["round-robin", "session"])
@pytest.mark.parametrize("n", [2, 3])
def test_shared_tier_never_lowers_the_hit_rate(mode: str, split: str, n: int) -> None:
    trace = generate_workload(WorkloadConfig(seed=3, num_requests=300))
    # No queue timeout (the split overloads 2,000 pages in timed mode): both runs serve every request.
    r = run(
        trace,
        n,
        split=split,
        mode=mode,
        capacity_pages=2_000,
        page_size=16,
        remote_index_slots=1 << 20,
        max_queue_wait_s=3600.0,
    )
    assert len(r.instances) == n
    assert sum(i.num_requests for i in r.instances) == trace.num_requests
    for i in r.instances:
        a, b = i.without_remote, i.with_remote
        assert a.prompt_tokens == b.prompt_tokens and a.num_refused == b.num_refused == 0
        assert b.hit_rate_tokens >= a.hit_rate_tokens
        assert b.prefill_tokens_saved >= a.prefill_tokens_saved
        assert sum(b.hit_tokens_by_tier.values()) == b.hit_tokens
        assert i.num_remote_load_failures == 0
        remote = b.tiers[-1]
        assert remote.name == "remote" and remote.num_load_failed_pages == 0
        assert remote.load_s == pytest.approx(remote.loaded_bytes / 1e9)  # 1 GB/s by default
    assert r.with_remote["hit_rate_tokens"] >= r.without_remote["hit_rate_tokens"]
    if split == "round-robin":  # shared system prompts on every instance: some pages come from others
        assert r.remote_tokens_from_others > 0 and r.hit_rate_gain > 0
        assert r.prefill_tokens_saved_by_remote > 0
    # (The session split keys this workload by its system prompts: each stays on one instance.)


def test_without_remote_is_the_plain_replay_of_each_instances_requests() -> None:
    trace = generate_workload(WorkloadConfig(seed=2, num_requests=200))
    r = run(
        trace, 2, capacity_pages=2_000, page_size=16, remote_index_slots=1 << 20, store_policy="selective"
    )
    assign = split_requests(trace, 2, "round-robin")
    for i in r.instances:
        rows = np.flatnonzero(assign == i.instance)
        alone = replay(
            _subset(trace, rows), ReplayConfig(capacity_pages=2_000, page_size=16, mode="sequential")
        )
        assert (alone.hit_tokens, alone.prompt_tokens) == (
            i.without_remote.hit_tokens,
            i.without_remote.prompt_tokens,
        )
        assert alone.num_evicted_pages == i.without_remote.num_evicted_pages


def _subset(trace: Trace, rows: npt.NDArray[np.int64]) -> Trace:
    ids = [trace.prompt_ids(int(k)).tolist() for k in rows]
    return Trace(
        input_lens=trace.input_lens[rows],
        output_lens=trace.output_lens[rows],
        hash_indptr=np.cumsum([0] + [len(x) for x in ids]).astype(np.int64),
        hash_ids=np.array([h for x in ids for h in x], dtype=np.int64),
        block_size=trace.block_size,
        priorities=trace.priorities[rows] if trace.priorities is not None else None,
    )


class LosingStore(MemoryStore):
    """Says it holds every page it was given, but loses them all before a load reads them."""

    def origins(self, keys: Any) -> npt.NDArray[np.int32]:
        return np.full(len(keys), -1, dtype=np.int32)


@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_a_store_that_loses_pages_cuts_the_hits(mode: str) -> None:
    trace = make_trace([([1, 2, 3, 4], 16)] * 4, times_ms=[0, 1000, 2000, 3000]) if mode == "timed" else AAAA
    r = run(trace, 2, store=LosingStore(), mode=mode)
    i1 = r.instances[1]
    # Instance 1 is told of A's 4 pages, plans 3 loads; every one fails, so it computes A after all.
    assert i1.num_remote_marked_pages == 4 and i1.num_remote_load_failures == 3
    assert i1.with_remote.tiers[-1].num_load_failed_pages == 3
    assert i1.with_remote.hit_tokens_by_tier == i1.without_remote.hit_tokens_by_tier | {"remote": 0}
    assert r.with_remote["hit_tokens"] == r.without_remote["hit_tokens"] == 32
    assert r.remote_hit_tokens == r.remote_tokens_from_others == r.prefill_tokens_saved_by_remote == 0


def test_timed_remote_load_takes_bytes_over_bandwidth() -> None:
    # A at t = 0 on instance 0; A again at 1000 s on instance 1, which loads 3 pages at 0.5 GB/s.
    trace = make_trace([([1, 2, 3, 4], 16), ([1, 2, 3, 4], 16)], times_ms=[0, 1_000_000])
    r = run(trace, 2, mode="timed", remote_bandwidth_gbps=0.5, prefill_rate=1_000.0)
    i1 = r.instances[1]
    remote = i1.with_remote.tiers[-1]
    assert remote.num_loaded_pages == 3 and remote.load_s == pytest.approx(3 * PAGE_BYTES / 0.5e9)
    assert i1.num_remote_pages_from_others == 3
    # Served at 1000 s: loads, then 4 tokens of prefill at 1000 tokens/s, whose logits give the one
    # output token (no decode step).
    assert i1.with_remote.simulated_s == pytest.approx(remote.load_s + 4 / 1_000)
    assert i1.without_remote.simulated_s == pytest.approx(16 / 1_000)


def test_session_keys_and_splits() -> None:
    # Block 7 is shared by every request (a system prompt); sessions start at the second block.
    trace = make_trace(
        [([7, 1, 2], 12), ([7, 5], 8), ([7, 1, 2, 3], 16), ([7, 5, 6], 12), ([7, 9], 5), ([7], 4)]
    )
    assert session_keys(trace).tolist() == [1, 5, 1, 5, 9, 7]
    assert split_requests(trace, 2, "session").tolist() == [0, 1, 0, 1, 0, 1]
    assert split_requests(trace, 4, "round-robin").tolist() == [0, 1, 2, 3, 0, 1]
    # No common prefix: the first block is the key.
    assert session_keys(make_trace([([1, 2], 8), ([3], 4), ([1, 4], 8)])).tolist() == [1, 3, 1]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="num_instances"):
            split_requests(trace, bad, "session")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="split"):
        split_requests(trace, 2, "random")


def test_session_split_keeps_conversations_together() -> None:
    # Two conversations of three turns each, A1 A2 B1 B2 A3 B3: round-robin scatters them, session does not.
    a1, a2, a3 = ([7, 1], 8), ([7, 1, 3], 12), ([7, 1, 3, 5], 16)
    b1, b2, b3 = ([7, 2], 8), ([7, 2, 4], 12), ([7, 2, 4, 6], 16)
    trace = make_trace([a1, a2, b1, b2, a3, b3])
    assert split_requests(trace, 2, "session").tolist() == [0, 0, 1, 1, 0, 1]
    by_session = run(trace, 2, split="session", store_policy="selective")
    round_robin = run(trace, 2, split="round-robin", store_policy="selective")
    # Session: each instance holds one conversation, each turn hits the previous one in HBM.
    assert [i.without_remote.hit_tokens for i in by_session.instances] == [0 + 8 + 12] * 2
    # Round-robin: instance 0 gets A1 B1 A3 (B1 hits block 7, A3 blocks 7 and 1), instance 1 A2 B2 B3
    # (B2 hits block 7, B3 blocks 7, 2 and 4).
    assert [i.without_remote.hit_tokens for i in round_robin.instances] == [4 + 8, 4 + 12]


@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_more_instances_than_requests(mode: str) -> None:
    trace = make_trace([([1, 2, 3, 4], 16)] * 2, times_ms=[0, 10])
    r = run(trace, 3, mode=mode)
    assert [i.num_requests for i in r.instances] == [1, 1, 0]
    idle = r.instances[2]
    assert idle.with_remote.prompt_tokens == idle.without_remote.prompt_tokens == 0
    assert idle.with_remote.hit_rate_tokens == 0.0
    assert r.instances[1].with_remote.hit_tokens_by_tier["remote"] == 12
    json.loads(r.to_json())


def test_config_validation() -> None:
    for kw in (
        {"remote_index_slots": -1},
        {"remote_lookup_keys": 0},
        {"remote_bandwidth_gbps": 0.0},
        {"remote_bandwidth_gbps": float("inf")},
    ):
        with pytest.raises(ConfigError):
            ReplayConfig(capacity_pages=8, **kw)
    assert ReplayConfig(capacity_pages=8, remote_index_slots=5).lower_tiers == [("remote", 5, 1.0)]
    with pytest.raises(ConfigError, match="remote tier"):
        replay_instances(AAAA, ReplayConfig(capacity_pages=8, page_size=4), num_instances=2)
    with pytest.raises(ConfigError, match="timestamps"):
        replay_instances(AAAA, config(mode="timed"), num_instances=2)
    with pytest.raises(ConfigError, match="remote"):
        open_store("http://127.0.0.1:6379")


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An empty shared store of each kind (Redis: under this test's prefix; its keys are gone after close)."""
    if request.param == "memory":
        yield MemoryStore()
        return
    require_redis_py()
    import redis

    url = request.getfixturevalue("redis_url")
    s = RedisStore(url, prefix=request.getfixturevalue("redis_prefix"))
    yield s
    s.close()
    assert list(redis.Redis.from_url(url).scan_iter(match=s.prefix + b"*")) == []


def test_store_semantics(store: Any) -> None:
    keys = np.arange(5 * 16, dtype=np.uint8).reshape(5, 16)  # [5, 16] five distinct keys
    store.add(keys[[0, 1, 3]], 2)
    store.add(keys[[1, 2]], 7)  # key 1 stays instance 2's: the first store wins
    store.add(keys[:0], 9)
    assert store.leading(keys) == 4  # keys 0..3 held, 4 is not
    assert store.leading(keys[4:]) == 0 and store.leading(keys[:0]) == 0 and store.leading(keys[2:]) == 2
    assert store.origins(keys).tolist() == [2, 2, 7, 2, -1]
    assert store.origins(keys[:0]).tolist() == []
    assert store.contains(keys).tolist() == [True, True, True, True, False]
    assert len(store) == 4


def test_redis_store_gives_the_memory_stores_figures(redis_url: str, redis_prefix: str) -> None:
    require_redis_py()
    trace = generate_workload(WorkloadConfig(seed=4, num_requests=120))
    kw: dict[str, Any] = dict(capacity_pages=1_500, page_size=16, remote_index_slots=1 << 16)
    mem = run(trace, 3, **kw)
    store = RedisStore(redis_url, prefix=redis_prefix)
    try:
        red = run(trace, 3, store=store, **kw)
        assert red.num_store_keys == mem.num_store_keys > 0
    finally:
        store.close()
    a, b = json.loads(mem.to_json()), json.loads(red.to_json())
    for doc in (a, b):
        doc["settings"].pop("remote")
        for part in ("with_remote", "without_remote"):
            doc[part].pop("elapsed_s")
        for inst in doc["instances"]:
            for part in ("with_remote", "without_remote"):
                inst[part].pop("elapsed_s")
    assert a == b
    assert red.settings["remote"] == redis_url and mem.settings["remote"] == "memory"


# ---------------------------------------------------------------------------------------------------- CLI

ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 100, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 4]},
    {"timestamp": 200, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 300, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 4]},
]


def cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, rows: list[dict[str, Any]] = ROWS
) -> tuple[int, str, str]:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    argv = ["replay", str(trace), "--trace-block-size", "16", "--page-size", "4", "--capacity-pages", "100"]
    code = kvcore.cli.main([*argv, "--out", str(tmp_path / "out"), "--no-progress", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("mode", ["sequential", "timed"])
def test_cli_json_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    extra = ["--instances", "2", "--mode", mode, "--store-policy", "all", "--host-tier-tokens", "64"]
    code, out, err = cli(tmp_path, capsys, *extra, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc == json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["num_instances"] == 2 and doc["mode"] == mode
    s = doc["settings"]
    assert (s["split"], s["remote"], s["policy"], s["remote_lookup_keys"]) == (
        "round-robin",
        "memory",
        "lru",
        2048,  # the default: a 32k-token prompt in one lookup
    )
    assert [t["name"] for t in s["lower_tiers"]] == ["host", "remote"]
    # The default index: the pages the trace's prompts and answers fill (pages of 4 tokens), not 4 M.
    trace_pages = sum(-(-(r["input_length"] + r["output_length"]) // 4) for r in ROWS)
    assert s["lower_tiers"][1] == {"name": "remote", "num_slots": trace_pages, "bandwidth_gbps": 1.0}
    for part in ("with_remote", "without_remote"):
        t = doc[part]
        for key in (
            "hit_rate_tokens",
            "hit_tokens",
            "prompt_tokens",
            "prefill_tokens_saved",
            "hit_rate_by_tier",
        ):
            assert key in t, key
    assert list(doc["with_remote"]["hit_tokens_by_tier"]) == ["hbm", "host", "remote"]
    assert list(doc["without_remote"]["hit_tokens_by_tier"]) == ["hbm", "host"]
    shared = doc["shared_tier"]
    for key in (
        "remote_hit_tokens",
        "remote_hit_rate",
        "remote_tokens_from_others",
        "prefill_tokens_saved",
        "hit_rate_gain",
        "num_lookups",
        "num_marked_pages",
        "num_pages_from_others",
        "num_load_failures",
        "num_store_keys",
    ):
        assert key in shared, key
    # Request 1 (instance 1) finds 32 tokens of request 0's prompt (instance 0) in the shared tier.
    assert shared["remote_tokens_from_others"] > 0
    assert (
        doc["with_remote"]["hit_tokens"] - doc["without_remote"]["hit_tokens"] == shared["remote_hit_tokens"]
    )
    assert [i["instance"] for i in doc["instances"]] == [0, 1]
    inst = doc["instances"][1]
    assert inst["num_requests"] == 2
    assert inst["with_remote"]["hit_tokens_by_tier"]["remote"] > 0
    assert set(inst["with_remote"]["tiers"]) == {"host", "remote"}
    assert set(inst["without_remote"]["tiers"]) == {"host"}


def test_cli_text_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(
        tmp_path, capsys, "--instances", "2", "--mode", "sequential", "--store-policy", "all"
    )
    assert code == 0, err
    assert "2 instances (round-robin split), shared remote tier: memory" in out
    assert "hits in remote" in out and "the shared tier saves" in out
    assert "without remote" in out and "with remote" in out
    assert out.rstrip().endswith(f"report written: {tmp_path / 'out' / 'report.json'}")
    r = run(AAAA, 1)
    assert "1 instance (round-robin split)" in format_instances(r)


def test_cli_remote_alone_is_one_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(tmp_path, capsys, "--remote", "memory", "--mode", "sequential", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["num_instances"] == 1 and doc["shared_tier"]["num_pages_from_others"] == 0


def test_cli_redis(tmp_path: Path, capsys: pytest.CaptureFixture[str], redis_url: str) -> None:
    require_redis_py()
    import redis

    client = redis.Redis.from_url(redis_url)
    before = set(client.scan_iter(match=b"kvcore-replay:*"))
    code, out, err = cli(tmp_path, capsys, "--instances", "2", "--remote", redis_url, "--mode", "sequential",
                         "--store-policy", "all", "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["remote"] == redis_url
    assert doc["shared_tier"]["num_pages_from_others"] > 0 and doc["shared_tier"]["num_store_keys"] > 0
    assert set(client.scan_iter(match=b"kvcore-replay:*")) == before  # the run deleted its keys
    code, out, err = cli(tmp_path, capsys, "--instances", "2", "--remote", redis_url, "--mode", "sequential",
                         "--store-policy", "all", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["shared_tier"] == doc["shared_tier"]  # a fresh prefix per run


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--instances", "0"], "--instances"),
        (["--instances", "-2"], "--instances"),
        (["--instances", "two"], "--instances"),
        (["--instances", "1.5"], "--instances"),
        (["--remote", "foo://127.0.0.1:1"], "--remote"),
        (["--remote", "127.0.0.1:6379"], "--remote"),
        (["--remote", ""], "--remote"),
        (["--instances", "2", "--remote", "memcached://x"], "--remote"),
        (["--split", "session"], "--split needs"),
        (["--split", "random", "--instances", "2"], "--split"),
        (["--remote-index-pages", "10"], "--remote-index-pages needs"),
        (["--remote-lookup-keys", "8"], "--remote-lookup-keys needs"),
        (["--remote-bandwidth-gbps", "2"], "--remote-bandwidth-gbps needs"),
        (["--instances", "2", "--remote-lookup-keys", "0"], "--remote-lookup-keys"),
        (["--instances", "2", "--remote-bandwidth-gbps", "0"], "--remote-bandwidth-gbps"),
        (["--instances", "2", "--policy", "lru,lfu"], "one policy"),
        (["--instances", "2", "--sweep"], "--sweep"),
        (["--instances", "2", "--remote", "redis://127.0.0.1:1"], "--remote redis://127.0.0.1:1"),
    ],
)
def test_cli_bad_options_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    if "redis://127.0.0.1:1" in extra:
        require_redis_py()  # port 1: nothing listens; the connection is refused at once
    code, out, err = cli(tmp_path, capsys, *extra)
    assert code == 2 and out == "", (code, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcore "), err
    assert needle in lines[0], lines[0]


def test_a_server_killed_mid_replay_ends_it_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    private_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared store dies during the run (the server is killed at the replay's first store): the
    replay stops with one line naming the store and the call, exit 2, no traceback and no report; its
    figures would otherwise be wrong without saying so."""
    require_redis_py()
    from kvcore.replay import shared

    add = shared.RedisStore.add
    calls = [0]

    def add_then_die(self: Any, keys: Any, origin: int) -> None:
        calls[0] += 1
        if calls[0] == 1:
            private_redis.kill()
        add(self, keys, origin)

    monkeypatch.setattr(shared.RedisStore, "add", add_then_die)
    url = private_redis.url
    flags = ["--instances", "2", "--remote", url, "--mode", "sequential", "--store-policy", "all", "--json"]
    code, out, err = cli(tmp_path, capsys, *flags)
    assert calls[0] == 1 and code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "remote store" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "out" / "report.json").exists()
