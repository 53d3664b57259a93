"""kvcore.replay traces: the Mooncake JSONL reader (and its errors), the writer, and the token ids built
from hash ids (checked against a per-token construction written here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from kvcore.exceptions import KVCoreError, TraceFormatError
from kvcore.replay import TokenSource, Trace, read_trace, write_trace

GOOD = [
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 512, "output_length": 0, "hash_ids": [0]},
    {"timestamp": 1500, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]},
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows_file(path: Path, rows: list[dict[str, object]]) -> Path:
    return write_lines(path, [json.dumps(r) for r in rows])


def test_reads_columns(tmp_path: Path) -> None:
    trace = read_trace(rows_file(tmp_path / "t.jsonl", GOOD))
    assert trace.num_requests == 3 and trace.block_size == 512
    assert trace.input_lens.tolist() == [1000, 512, 1100]
    assert trace.output_lens.tolist() == [10, 0, 3]
    assert trace.hash_indptr.tolist() == [0, 2, 3, 6]
    assert trace.hash_ids.tolist() == [0, 1, 0, 0, 1, 2]
    assert trace.timestamps_ms is not None and trace.timestamps_ms.tolist() == [0.0, 1500.0, 1500.0]
    assert trace.priorities is None and trace.output_ids is None
    assert trace.duration_s == 1.5
    # 3 distinct ids among 6 blocks: an infinite cache hits 3 of 6.
    assert trace.num_unique_blocks == 3 and trace.ideal_block_hit_rate == 0.5
    # Token-weighted: block 0 again in requests 2 and 3 (512 each), block 1 again in request 3, where it
    # is a full block (512); the partial last blocks weigh 488 and 76 tokens.
    assert trace.ideal_token_hit_rate == pytest.approx((512 + 512 + 512) / (1000 + 512 + 1100))
    assert trace.name == "t.jsonl"


def test_blank_lines_and_limit(tmp_path: Path) -> None:
    lines = ["", json.dumps(GOOD[0]), "   ", json.dumps(GOOD[1]), json.dumps(GOOD[2])]
    path = write_lines(tmp_path / "t.jsonl", lines)
    assert read_trace(path).num_requests == 3
    assert read_trace(path, limit=2).hash_ids.tolist() == [0, 1, 0]


def test_untimed_trace(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "timestamp"} for r in GOOD]
    trace = read_trace(rows_file(tmp_path / "t.jsonl", rows))
    assert trace.timestamps_ms is None and trace.duration_s == 0.0


def bad(tmp_path: Path, rows: Sequence[object], **kw: int) -> str:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    with pytest.raises(TraceFormatError) as info:
        read_trace(write_lines(tmp_path / "bad.jsonl", lines), **kw)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KVCoreError)
    return str(info.value)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ('{"timestamp": 3, "input_length": 5', "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        ({"timestamp": 3, "output_length": 1, "hash_ids": [0]}, "line 2, field 'input_length': missing"),
        (
            {"timestamp": 3, "input_length": 0, "output_length": 1, "hash_ids": []},
            "'input_length': must be >= 1",
        ),
        (
            {"timestamp": 3, "input_length": "9", "output_length": 1, "hash_ids": [0]},
            "expected an integer, got '9'",
        ),
        (
            {"timestamp": 3, "input_length": 9.5, "output_length": 1, "hash_ids": [0]},
            "'input_length': expected an",
        ),
        (
            {"timestamp": 3, "input_length": True, "output_length": 1, "hash_ids": [0]},
            "'input_length': expected an",
        ),
        (
            {"timestamp": 3, "input_length": 9, "output_length": -1, "hash_ids": [0]},
            "'output_length': must be >= 0",
        ),
        ({"timestamp": 3, "input_length": 9, "hash_ids": [0]}, "line 2, field 'output_length': missing"),
        ({"timestamp": 3, "input_length": 9, "output_length": 1}, "line 2, field 'hash_ids': missing"),
        (
            {"timestamp": 3, "input_length": 9, "output_length": 1, "hash_ids": 7},
            "'hash_ids': expected a list",
        ),
        (
            {"timestamp": 3, "input_length": 9, "output_length": 1, "hash_ids": [-4]},
            "'hash_ids': item 0 must be",
        ),
        (
            {"timestamp": 3, "input_length": 600, "output_length": 1, "hash_ids": [1, "x"]},
            "item 1 must be a non-neg",
        ),
        (
            {"timestamp": 3, "input_length": 600, "output_length": 1, "hash_ids": [1]},
            "'hash_ids': 1 ids, expected",
        ),
        ({"timestamp": 3, "input_length": 9, "output_length": 1, "hash_ids": [1, 2]}, "2 ids, expected ceil"),
        (
            {"timestamp": -1, "input_length": 9, "output_length": 1, "hash_ids": [1]},
            "'timestamp': expected a number",
        ),
        (
            {"timestamp": "0", "input_length": 9, "output_length": 1, "hash_ids": [1]},
            "'timestamp': expected a num",
        ),
        (
            {"input_length": 9, "output_length": 1, "hash_ids": [1]},
            "line 2, field 'timestamp': missing or extra",
        ),
        (
            {"timestamp": 3, "input_length": 9, "output_length": 1, "hash_ids": [1], "priority": 1.5},
            "'priority'",
        ),
    ],
)
def test_malformed_line_names_line_and_field(tmp_path: Path, row: object, expected: str) -> None:
    assert expected in bad(tmp_path, [GOOD[0], row])


def test_error_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    message = bad(
        tmp_path, [GOOD[0], "", "", {"timestamp": 1, "input_length": 0, "output_length": 0, "hash_ids": []}]
    )
    assert message.startswith(f"{tmp_path / 'bad.jsonl'}: line 4, field 'input_length'")


def test_block_size_mismatch_is_reported(tmp_path: Path) -> None:
    # Right for 512-token blocks, wrong for 256: the message points at --trace-block-size.
    message = bad(tmp_path, [GOOD[0]], block_size=256)
    assert "line 1, field 'hash_ids': 2 ids, expected ceil(length / block_size) = 4" in message
    assert "--trace-block-size" in message


def test_empty_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no requests"):
        read_trace(write_lines(tmp_path / "e.jsonl", ["", " "]))


def test_output_hash_ids_on_some_lines_only(tmp_path: Path) -> None:
    rows = [dict(GOOD[0], output_hash_ids=[9]), GOOD[1], GOOD[2]]
    # Line 2 has output_length 0: no ids needed. Line 3 has 3 output tokens and no ids.
    assert "line 3, field 'output_hash_ids': missing" in bad(tmp_path, rows)


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    rows = [
        dict(r, priority=i, output_hash_ids=[100 + i] if r["output_length"] else [])
        for i, r in enumerate(GOOD)
    ]
    first = read_trace(rows_file(tmp_path / "a.jsonl", rows))
    write_trace(first, tmp_path / "b.jsonl")
    second = read_trace(tmp_path / "b.jsonl")
    for name in ("input_lens", "output_lens", "hash_indptr", "hash_ids", "timestamps_ms", "priorities"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    assert second.output_ids is not None and second.output_ids.tolist() == [100, 102]
    # The written file is plain Mooncake JSONL plus the optional fields.
    line = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])
    assert line == {**GOOD[0], "priority": 0, "output_hash_ids": [100]}


def test_reading_holds_the_ids_as_int64_not_as_python_objects(tmp_path: Path) -> None:
    """Peak memory while reading follows the ids' bytes: a list of Python ints per line held about 36
    bytes an id (over 5x the file for 5-digit ids); one flat int64 buffer holds 8, about the file."""
    import tracemalloc

    rng = np.random.default_rng(0)
    n, per = 4000, 40
    ids = rng.permutation(np.arange(10_000, 10_000 + n * per)).reshape(n, per)  # distinct: chained
    rows = [
        {"timestamp": i, "input_length": per * 16, "output_length": 8, "hash_ids": ids[i].tolist()}
        for i in range(n)
    ]
    path = rows_file(tmp_path / "big.jsonl", rows)
    tracemalloc.start()
    try:
        trace = read_trace(path, block_size=16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert trace.hash_ids.dtype == np.int64 and np.array_equal(trace.hash_ids, ids.reshape(-1))
    assert trace.hash_indptr.tolist() == list(range(0, n * per + 1, per))
    assert peak < 2 * path.stat().st_size, (peak, path.stat().st_size)


def test_trace_rejects_inconsistent_columns() -> None:
    with pytest.raises(ValueError, match="ceil"):
        Trace(
            input_lens=np.array([5]),
            output_lens=np.array([0]),
            hash_indptr=np.array([0, 1]),
            hash_ids=np.array([1]),  # 5 tokens in blocks of 4 need 2 ids
            block_size=4,
        )


def reference_tokens(ids: list[int], length: int, bs: int) -> np.ndarray:
    """Token t of a prompt = (id of its block) * bs + (t mod bs): one token at a time."""
    return np.array([ids[t // bs] * bs + t % bs for t in range(length)], dtype=np.uint64)


def make_trace(id_lists: list[list[int]], lens: list[int], outs: list[int], bs: int) -> Trace:
    indptr = np.cumsum([0] + [len(x) for x in id_lists])
    return Trace(
        input_lens=np.array(lens, dtype=np.int64),
        output_lens=np.array(outs, dtype=np.int64),
        hash_indptr=indptr.astype(np.int64),
        hash_ids=np.array([h for x in id_lists for h in x], dtype=np.int64),
        block_size=bs,
    )


def test_tokens_follow_the_rule_for_runs_and_gaps() -> None:
    bs = 8
    rng = np.random.default_rng(7)
    id_lists, lens = [], []
    for _ in range(50):
        k = int(rng.integers(1, 12))
        # Mix consecutive runs (the fast path) with jumps and repeats.
        ids = np.cumsum(rng.choice([1, 1, 1, 5, -3], size=k)) + 40
        id_lists.append([int(max(h, 0)) for h in ids])
        lens.append((k - 1) * bs + int(rng.integers(1, bs + 1)))
    trace = make_trace(id_lists, lens, [3] * 50, bs)
    src = TokenSource(trace)
    for i in range(50):
        got = src.prompt(i)
        assert got.dtype == np.uint32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got.astype(np.uint64), reference_tokens(id_lists[i], lens[i], bs))
    # Answers without ids are fresh: past every prompt id, distinct per request.
    top = max(h for x in id_lists for h in x)
    answers = [src.output(i) for i in range(50)]
    assert all(len(a) == 3 and int(a.min()) >= (top + 1) * bs for a in answers)
    assert len({a.tobytes() for a in answers}) == 50


def test_prompt_and_output_concatenates() -> None:
    trace = make_trace([[3, 4]], [13], [5], 8)
    src = TokenSource(trace)
    out = src.output(0)
    both = src.prompt_and_output(0, out[:4])
    np.testing.assert_array_equal(both[:13], reference_tokens([3, 4], 13, 8).astype(np.uint32))
    np.testing.assert_array_equal(both[13:], out[:4])


def test_huge_ids_are_remapped_and_stay_distinct() -> None:
    big = 2**40
    trace = make_trace([[big, big + 1], [big, 7]], [16, 10], [0, 0], 8)
    src = TokenSource(trace)
    a, b = src.prompt(0).copy(), src.prompt(1).copy()
    assert a.dtype == np.uint32
    # Same first id, same first block; different second ids, different second blocks; runs kept.
    np.testing.assert_array_equal(a[:8], b[:8])
    assert not set(a[8:16].tolist()) & set(b[8:10].tolist())
    np.testing.assert_array_equal(np.diff(a.astype(np.int64)), np.ones(15))


def test_answer_at_gives_each_rows_answer_token() -> None:
    """answer_at (one step's sampled tokens, vectorized) against answer() one token at a time: answers
    of one run (fresh ids), of several runs (answer ids with jumps and repeats), empty answers, and
    positions at or past output_len (0: never computed)."""
    bs = 4
    outs = [6, 0, 9, 3]
    trace = Trace(
        input_lens=np.array([5, 4, 8, 2], dtype=np.int64),
        output_lens=np.array(outs, dtype=np.int64),
        hash_indptr=np.array([0, 2, 3, 5, 6], dtype=np.int64),
        hash_ids=np.array([1, 2, 1, 3, 4, 5], dtype=np.int64),
        block_size=bs,
        output_indptr=np.array([0, 2, 2, 5, 6], dtype=np.int64),
        output_ids=np.array([10, 11, 20, 7, 20, 30], dtype=np.int64),  # request 2: three runs
    )
    for tr in (trace, make_trace([[1, 2], [1], [1, 3], [5]], [5, 4, 8, 2], outs, bs)):  # + fresh answers
        src = TokenSource(tr)
        ids = np.array([i for i in range(4) for _ in range(outs[i] + 2)], dtype=np.int64)
        pos = np.array([p for i in range(4) for p in range(outs[i] + 2)], dtype=np.int64)
        pairs = zip(ids.tolist(), pos.tolist(), strict=True)
        want = [int(src.answer(i, p, p + 1)[0]) if p < outs[i] else 0 for i, p in pairs]
        got = src.answer_at(ids, pos)
        assert got.dtype == np.uint32 and got.tolist() == want
        assert src.answer_at(ids[::-1], pos[::-1]).tolist() == want[::-1]


def _unchained_model(rows: list[list[int]]) -> bool:
    """True when some id sits behind two different prefixes (the id before it, or none)."""
    seen: dict[int, int | None] = {}
    for ids in rows:
        for j, h in enumerate(ids):
            before = ids[j - 1] if j else None
            if seen.setdefault(h, before) != before:
                return True
    return False


@pytest.mark.parametrize(
    ("rows", "second"),
    [
        ([[0, 0], [0, 0]], 2),  # the same id at two positions: the best case said 74 %, the replay 50 %
        ([[0, 1], [2, 1]], 2),  # id 1 behind 0, then behind 2
        ([[5, 6], [6]], 2),  # id 6 behind 5, then first
    ],
)
def test_replay_refuses_ids_that_are_not_prefix_chained(
    tmp_path: Path, rows: list[list[int]], second: int
) -> None:
    import subprocess
    import sys

    from kvcore.replay.trace import check_chained

    lines = [{"timestamp": 0, "input_length": 16 * len(r), "output_length": 1, "hash_ids": r} for r in rows]
    path = rows_file(tmp_path / "t.jsonl", lines)  # type: ignore[arg-type]
    trace = read_trace(path, block_size=16)  # read: the reader's memory stays the ids' bytes
    with pytest.raises(
        TraceFormatError, match=rf"t.jsonl: hash id \d+ follows another prefix in request {second}"
    ):
        check_chained(trace)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvcore",
            "replay",
            str(path),
            "--trace-block-size",
            "16",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "prefix chained" in out.stderr and "Traceback" not in out.stderr
    one = [{"input_length": 32, "output_length": 1, "hash_ids": [7, 7]}]
    with pytest.raises(TraceFormatError, match="hash id 7 follows another prefix twice in request 1"):
        check_chained(read_trace(rows_file(tmp_path / "one.jsonl", one), block_size=16))  # type: ignore[arg-type]
    chained = [
        {"input_length": 16 * len(r), "output_length": 1, "hash_ids": r} for r in ([0, 1], [0, 2], [3])
    ]
    check_chained(read_trace(rows_file(tmp_path / "ok.jsonl", chained), block_size=16))  # type: ignore[arg-type]


def test_unchained_finds_exactly_the_traces_the_model_does() -> None:
    from kvcore.replay.trace import unchained

    rng = np.random.default_rng(3)
    found = 0
    for _ in range(400):
        rows = [rng.integers(0, 6, int(rng.integers(0, 5))).tolist() for _ in range(int(rng.integers(1, 5)))]
        indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        ids = np.array([h for r in rows for h in r], dtype=np.int64)
        got = unchained(indptr, ids)
        assert (got is not None) == _unchained_model(rows), rows
        if got is not None:
            found += 1
            h, a, b = got
            assert a <= b and h in rows[a] and h in rows[b] and (a < b or rows[a].count(h) > 1)
    assert 50 < found < 400  # both outcomes exercised
