"""pytest-benchmark of page-key hashing, ns per token (16-token pages, an 8,192-token prompt).

Run: ``.venv/bin/python -m pytest benches/python/bench_page_keys.py --benchmark-columns=median``

Rows: kvcore's Rust keys (SHA-256, chained, SHA-NI where the CPU has it); the same format in Python
with ``hashlib`` (what a pure-Python implementation of it costs); and vLLM's own scheme as vLLM v1
computes it with its ``sha256`` option (``hashlib.sha256(pickle.dumps((parent, tokens, extra)))`` per
block, reimplemented here in three lines: vLLM itself is not installed in this environment).
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from typing import Any

import numpy as np

import kvcore

PS = 16
TOKENS = np.arange(100_000, 100_000 + 8_192, dtype=np.int32)


def test_bench_kvcore_rust(benchmark: Any) -> None:
    keys = benchmark(kvcore.page_keys, TOKENS, PS, b"model|bf16|16", "tenant")
    assert keys.shape == (len(TOKENS) // PS, 16)


def test_bench_same_format_python_hashlib(benchmark: Any) -> None:
    tokens = TOKENS.tolist()

    def run() -> bytes:
        parent = b"\0" * 16
        name = b"tenant"
        for i in range(0, len(tokens), PS):
            page = tokens[i : i + PS]
            data = (
                b"\1" + parent + b"\1" + struct.pack("<Q", len(name)) + name
                + struct.pack("<Q", len(page)) + struct.pack(f"<{len(page)}I", *page)
            )  # fmt: skip
            parent = hashlib.sha256(data).digest()[:16]
        return parent

    benchmark(run)


def test_bench_vllm_sha256_pickle_scheme(benchmark: Any) -> None:
    tokens = TOKENS.tolist()

    def run() -> bytes:
        parent: bytes | None = None
        for i in range(0, len(tokens), PS):
            parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i : i + PS]), None))).digest()
        assert parent is not None
        return parent

    benchmark(run)
