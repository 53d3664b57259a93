"""Page keys against vLLM's own block hashing, same process, same prompt (ns per token, median).

Run (the peers' venv, ``bash benches/peers/setup.sh``):
``/tmp/kvcore-peers-venv/bin/python benches/peers/page_keys.py [--reps 7]``

Rows, for an 8,192-token prompt in 16-token blocks:
- kvcore: ``kvcore.page_keys`` (SHA-256, chained, 128-bit, namespace in every key; Rust);
- vLLM 0.33 ``hash_block_tokens`` chained over the prompt with its hash functions ``sha256``
  (pickle + SHA-256, the default), ``sha256_cbor`` and ``xxhash`` (``--prefix-caching-hash-algo``),
  after ``init_none_hash`` as the engine does; the extra keys (cache salt) of the first block only, as
  vLLM passes them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import kvcore  # noqa: E402

PS = 16
TOKENS = np.arange(100_000, 100_000 + 8_192, dtype=np.int32)


def timed(fn: Any, reps: int, inner: int) -> float:
    """Median ns per token over ``reps`` rounds of ``inner`` calls."""
    fn()
    rounds = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        rounds.append((time.perf_counter() - t) / inner / len(TOKENS) * 1e9)
    return statistics.median(rounds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    rows: list[tuple[str, float]] = []
    rows.append(
        (
            "kvcore page_keys (Rust SHA-256)",
            timed(lambda: kvcore.page_keys(TOKENS, PS, b"m", "salt"), a.reps, 50),
        )
    )
    try:
        import vllm
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
    except ImportError as e:
        print(f"vLLM is not importable ({e}): run with the peers' venv", file=sys.stderr)
        return 2
    tokens = TOKENS.tolist()
    for name in ("sha256", "sha256_cbor", "xxhash"):
        try:
            fn = get_hash_fn_by_name(name)
            init_none_hash(fn)
        except Exception as e:  # a hash the venv lacks (xxhash needs its package)
            print(f"vLLM {name}: not available ({e})", file=sys.stderr)
            continue

        def chain(fn: Any = fn) -> Any:
            parent = None
            for i in range(0, len(tokens), PS):
                extra = ("salt",) if i == 0 else None
                parent = hash_block_tokens(fn, parent, tokens[i : i + PS], extra)
            return parent

        rows.append((f"vLLM {vllm.__version__} hash_block_tokens ({name})", timed(chain, a.reps, 5)))
    base = rows[0][1]
    print(f"{'row':<50} {'ns/token':>9} {'x kvcore':>9}")
    for name, ns in rows:
        print(f"{name:<50} {ns:>9.1f} {ns / base:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
