#!/usr/bin/env bash
# Every kvcore benchmark behind a figure in BENCHMARKS.md, in one run (about 5 minutes on 2 cores).
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
echo "== pytest-benchmark: page keys (Python calls)"; .venv/bin/python -m pytest -q benches/python/bench_page_keys.py $cols
echo "== pytest-benchmark: replay (Python)"; .venv/bin/python -m pytest -q benches/python/bench_replay.py $cols
echo "== pytest-benchmark: NumPy kernel references"
OPENBLAS_NUM_THREADS=1 .venv/bin/python -m pytest -q benches/python/bench_kernels_cpu.py $cols
