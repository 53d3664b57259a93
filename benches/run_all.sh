#!/usr/bin/env bash
# Every kvcore benchmark behind a figure in BENCHMARKS.md, in one run (about 12 minutes on 2 cores).
# Not here: the peers (benches/peers/, needs their own venv) and the GPU check (benches/gpu/).
# Needs the environment `.ci/run` builds (.venv). Prints medians; compare rows of the same run only.
set -euo pipefail
cd "$(dirname "$0")/.."
cols=--benchmark-columns=median,iqr,ops
echo "== criterion: allocator (Rust)"; cargo bench --bench allocator 2>&1 | grep -E "^[a-z_]+/|time:"
echo "== radix tree alone (Rust, minimum of many calls)"
cargo test -q --release --test radix -- --ignored --nocapture 2>&1 | grep -vE "^(running|test result|$)"
echo "== pytest-benchmark: allocator (Python)"; .venv/bin/python -m pytest -q benches/python/bench_allocator.py $cols
echo "== pytest-benchmark: manager (Python)"; .venv/bin/python -m pytest -q benches/python/bench_manager.py $cols
echo "== manager in tight loops"; .venv/bin/python benches/manager_loop.py
echo "== pytest-benchmark: page keys (Python calls)"; .venv/bin/python -m pytest -q benches/python/bench_page_keys.py $cols
echo "== pytest-benchmark: replay (Python)"; .venv/bin/python -m pytest -q benches/python/bench_replay.py $cols
echo "== pytest-benchmark: NumPy kernel references"
OPENBLAS_NUM_THREADS=1 .venv/bin/python -m pytest -q benches/python/bench_kernels_cpu.py $cols
echo "== lower tiers: admissions and matching across tiers (Python calls; Rust timing)"
.venv/bin/python -m pytest -q benches/python/bench_tiers.py $cols
cargo test -q --release --test tiers -- --ignored --nocapture 2>&1 | grep -vE "^(running|test result|$)"
echo "== lower tiers: storage against memcpy and plain file I/O"; .venv/bin/python benches/tiers_storage.py --repeats 5
echo "== lower tiers: quantize-on-demote error on the tiny decoder"; .venv/bin/python benches/tiers_quant_error.py
echo "== lower tiers: Mooncake conversation replay grid"; .venv/bin/python benches/replay_tiers.py
echo "== remote tier: RedisTier, redis-py, RespClient, redis-benchmark (own server)"; .venv/bin/python benches/tiers_remote.py --repeats 5
echo "== remote tier: instances sharing it (replay grid, ~2 min)"; .venv/bin/python benches/replay_instances.py
echo "== scheduler: one step of 256 decoding requests (Python), with same-run baselines"
.venv/bin/python -m pytest -q benches/python/bench_scheduler.py $cols
echo "== scheduler under pressure: the conversation trace at 1x, 2x, 3x (~10 min)"; .venv/bin/python benches/replay_pressure.py --out /tmp/kvcore-replay-pressure
echo "== kvcore demo (the live engine, wall time)"; TIMEFORMAT="%R s"; time (.venv/bin/kvcore demo --no-live | tail -8)
