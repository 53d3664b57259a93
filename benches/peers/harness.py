"""KV-cache bookkeeping on CPU: kvcore vs a pure-Python floor, vLLM 0.33 and SGLang 0.5.23, same streams.

How to run (from the repository root)::

    bash benches/peers/setup.sh                       # once: vLLM, SGLang, torch venv (~5.5 GB, ~3 min)
    V=${VENV:-${TMPDIR:-/tmp}/kvcore-peers-venv}
    $V/bin/python benches/peers/harness.py --reps 3   # every row, every workload (~100 s)
    $V/bin/python benches/peers/harness.py --impl kvcore,pyref,vllm --workloads ab --json out.json
    .venv/bin/python benches/peers/harness.py --impl kvcore,pyref   # no peers venv: any CPython >= 3.11
                                                                     # with numpy (the repo's .venv has it)

kvcore is imported from ``<repo>/python`` (the built ``_kvcore.abi3.so`` there), so no install is needed.

Workloads (one request at a time; every implementation gets exactly the same request stream):

- ``a``: allocate then free one request's pages; lengths uniform in 1..2,048 tokens, 16-token pages,
  a 10,000-page pool. Reports pairs/s and ns per page.
- ``b``: 64 shared 2,048-token system prompts (cached before timing); each request is one of them plus
  256..1,024 unique tokens: match, lock, allocate, insert/cache, release. Reports req/s, ns per matched
  token and the token hit rate. The pool holds everything: nothing is evicted.
- ``c``: eviction under pressure: a 10,000-page pool full of cached, unreferenced pages; each request is
  1,024 unique tokens, so it evicts exactly 64 pages. Reports req/s and evicted pages/s end to end, and
  the time per page inside explicit ``evict()`` calls on a full cache (vLLM has no such call).
- ``d``: the Mooncake conversation trace (``--trace``), sequential mode (longest cached prefix, cache the
  prompt, release; LRU), 16-token pages, the same capacity for all (``--trace-pages``). Hash block ``h``
  (512 tokens) is tokens ``h * 512 + j``. Only the cache calls are timed (token building is not).

Hygiene (as ``shared/research/peers.md``): reps interleaved across implementations, median of reps,
``gc.collect(); gc.freeze()`` before each timed loop, torch limited to 1 thread, the process pinned to
the last CPU (``--cpu -1`` disables). After every b/c/d run an accounting check runs (nothing in use,
free + cached == pool); a failure is printed and recorded, and the exit status is then 1 (as it is when a
row cannot be set up, e.g. vLLM/SGLang rows outside the peers venv).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"
PAGE = 16
EVICT_ROUNDS = 3  # c: fill the pool and evict it all with explicit evict(64) calls, this many times
TRACE_BLOCK = 512  # tokens per Mooncake hash block

ALL_IMPLS = (
    "kvcore",
    "pyref",
    "vllm",
    "sglang-radix-p1",
    "sglang-radix-p16",
    "sglang-urc-rust-p1",
    "sglang-urc-rust-p16",
)

perf = time.perf_counter

# --------------------------------------------------------------------------------------------------
# Request streams (built once, as numpy int64 arrays; each adapter converts them before timing)
# --------------------------------------------------------------------------------------------------


@dataclass
class Config:
    a_requests: int = 10_000
    a_pool: int = 10_000
    b_prompts: int = 64
    b_prompt_len: int = 2048
    b_requests: int = 2000
    b_unique: tuple[int, int] = (256, 1024)
    c_pool: int = 10_000
    c_requests: int = 1000
    c_len: int = 1024
    d_pages: int = 320_000
    d_requests: int = 1000  # d compares every row on the first d_requests requests (0: all)
    seed: int = 0


@dataclass
class Streams:
    a_pages: list[int]
    b_warm: list[Any]
    b_reqs: list[Any]
    c_fill: list[Any]
    c_reqs: list[Any]
    d_trace: list[tuple[Any, int]] = field(default_factory=list)  # (hash ids int64, input length)


def build_streams(cfg: Config, trace: Path | None) -> Streams:
    import numpy as np

    rng = random.Random(cfg.seed)
    a_pages = [-(-rng.randint(1, 2048) // PAGE) for _ in range(cfg.a_requests)]
    counter = [100_000_000]

    def fresh(n: int) -> Any:
        start = counter[0]
        counter[0] += n
        return np.arange(start, start + n, dtype=np.int64)

    prompts = [
        np.arange(p * cfg.b_prompt_len, (p + 1) * cfg.b_prompt_len, dtype=np.int64) + 10_000_000
        for p in range(cfg.b_prompts)
    ]
    b_reqs = [
        np.concatenate([prompts[rng.randrange(cfg.b_prompts)], fresh(rng.randint(*cfg.b_unique))])
        for _ in range(cfg.b_requests)
    ]
    per = cfg.c_len // PAGE
    c_fill = [fresh(cfg.c_len) for _ in range(cfg.c_pool // per)]
    if cfg.c_pool % per:
        c_fill.append(fresh(cfg.c_pool % per * PAGE))
    c_reqs = [fresh(cfg.c_len) for _ in range(cfg.c_requests)]
    d: list[tuple[Any, int]] = []
    if trace is not None:
        with open(trace) as f:
            for line in f:
                r = json.loads(line)
                d.append((np.asarray(r["hash_ids"], dtype=np.int64), int(r["input_length"])))
    return Streams(a_pages, prompts, b_reqs, c_fill, c_reqs, d)


class TraceTokens:
    """Token ids of trace requests: hash block ``h`` is ``h * 512 + [0, 512)``, cut at the input length."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.ramp = np.arange(TRACE_BLOCK, dtype=np.int64)

    def __call__(self, hash_ids: Any, n: int) -> Any:
        return (hash_ids[:, None] * TRACE_BLOCK + self.ramp).ravel()[:n]


# --------------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------------


class Adapter:
    """One implementation. ``serve`` is one sequential-mode request; ``run_*`` time whole loops."""

    name = ""
    page_size = PAGE
    has_evict = True
    workloads = "abcd"

    def setup(self) -> None:
        """Import the implementation (raise on failure)."""

    def versions(self) -> dict[str, str]:
        return {}

    def convert(self, toks: Any) -> Any:
        """numpy int64 token ids -> what this implementation takes (done before timing)."""
        return toks.tolist()

    # workload a
    def run_a(self, pages: Sequence[int], pool: int) -> float:
        raise NotImplementedError

    # prefix cache: b, c, d
    def new_cache(self, num_pages: int) -> None:
        raise NotImplementedError

    def serve(self, toks: Any) -> int | None:
        raise NotImplementedError

    def evict(self, num_pages: int) -> int:
        raise NotImplementedError

    def usage(self) -> tuple[int, int, int]:
        """(free, cached, in use) in tokens (pages x 16 where the cache counts pages); free counts
        never-used and evicted pages only."""
        raise NotImplementedError

    def cacheable(self, n: int) -> int:
        """Tokens a request of ``n`` tokens leaves in the cache (its full pages)."""
        return n // self.page_size * self.page_size

    def run_serve(self, reqs: Sequence[Any]) -> tuple[float, int, int]:
        """Serve ``reqs`` in order; returns (seconds, matched tokens, refused requests)."""
        serve = self.serve
        hits = refused = 0
        _gc_quiet()
        t0 = perf()
        for t in reqs:
            h = serve(t)
            if h is None:
                refused += 1
            else:
                hits += h
        dt = perf() - t0
        gc.unfreeze()
        return dt, hits, refused


def _gc_quiet() -> None:
    gc.collect()
    gc.freeze()


def _time_alloc_free(alloc: Any, pages: Sequence[int], pool: int) -> float:
    """Workload a on an allocator with ``allocate(n)``/``free(ids)``/``num_free``: seconds."""
    allocate, free = alloc.allocate, alloc.free
    _gc_quiet()
    t0 = perf()
    for k in pages:
        free(allocate(k))
    dt = perf() - t0
    gc.unfreeze()
    assert alloc.num_free == pool
    return dt


class KvcoreAdapter(Adapter):
    name = "kvcore"

    def setup(self) -> None:
        if (REPO / "python" / "kvcore" / "__init__.py").exists() and str(REPO / "python") not in sys.path:
            sys.path.insert(0, str(REPO / "python"))
        import kvcore

        self.kv = kvcore
        self.seq = 0

    def versions(self) -> dict[str, str]:
        return {"kvcore": f"{getattr(self.kv, '__version__', '?')} ({Path(self.kv.__file__).parent})"}

    def convert(self, toks: Any) -> Any:
        import numpy as np

        return np.ascontiguousarray(toks, dtype=np.int32)

    def run_a(self, pages: Sequence[int], pool: int) -> float:
        return _time_alloc_free(self.kv.PageAllocator(pool + 1), pages, pool)

    def new_cache(self, num_pages: int) -> None:
        self.m = self.kv.KVCacheManager(num_pages + 1, page_size=PAGE, eviction="lru")

    def serve(self, toks: Any) -> int | None:
        self.seq += 1
        hit = self.m.add_sequence(self.seq, toks)
        if hit is not None:
            self.m.free_sequence(self.seq)
        return hit

    def run_serve(self, reqs: Sequence[Any]) -> tuple[float, int, int]:
        add, free = self.m.add_sequence, self.m.free_sequence
        sid = self.seq
        hits = refused = 0
        _gc_quiet()
        t0 = perf()
        for t in reqs:
            sid += 1
            h = add(sid, t)
            if h is None:
                refused += 1
            else:
                free(sid)
                hits += h
        dt = perf() - t0
        gc.unfreeze()
        self.seq = sid
        return dt, hits, refused

    def evict(self, num_pages: int) -> int:
        return int(self.m.evict(num_pages))

    def usage(self) -> tuple[int, int, int]:
        s = self.m.stats()
        return (
            PAGE * s.num_pages_free,
            PAGE * (s.num_pages_cached + s.num_pages_pinned),
            PAGE * s.num_pages_in_use,
        )

    def evicted_total(self) -> int:
        return int(self.m.stats().num_evicted_pages)


class PyrefAdapter(Adapter):
    name = "pyref"

    def setup(self) -> None:
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        import pyref

        self.mod = pyref

    def run_a(self, pages: Sequence[int], pool: int) -> float:
        return _time_alloc_free(self.mod.PyAllocator(pool + 1), pages, pool)

    def new_cache(self, num_pages: int) -> None:
        self.c = self.mod.PyPrefixCache(num_pages + 1, PAGE)
        self.serve = self.c.serve  # type: ignore[method-assign]

    def evict(self, num_pages: int) -> int:
        return int(self.c.evict(num_pages))

    def usage(self) -> tuple[int, int, int]:
        return PAGE * self.c.num_free, PAGE * len(self.c.lru), PAGE * self.c.num_in_use


class VllmAdapter(Adapter):
    """vLLM v1 ``KVCacheManager`` (prefix caching on, SHA-256 block hashes, the default) per request:
    ``Request`` (hashes its blocks), ``get_computed_blocks``, ``allocate_slots`` (caches the full
    blocks), ``free``. Workload a: ``BlockPool.get_new_blocks`` / ``free_blocks``, as the scheduler."""

    name = "vllm"
    has_evict = False

    def setup(self) -> None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request

        init_none_hash(sha256)
        self.torch, self.vllm = torch, vllm
        self.BlockPool, self.KVCacheManager, self.Request = BlockPool, KVCacheManager, Request
        self.KVCacheConfig, self.KVCacheGroupSpec, self.FullAttentionSpec = (
            KVCacheConfig,
            KVCacheGroupSpec,
            FullAttentionSpec,
        )
        self.hasher = get_request_block_hasher(PAGE, sha256)
        self.sp = SamplingParams(max_tokens=1)
        self.rid = 0

    def versions(self) -> dict[str, str]:
        return {"vllm": self.vllm.__version__, "torch": self.torch.__version__}

    def run_a(self, pages: Sequence[int], pool: int) -> float:
        bp = self.BlockPool(pool + 1, enable_caching=True, hash_block_size=PAGE)
        get, free = bp.get_new_blocks, bp.free_blocks
        _gc_quiet()
        t0 = perf()
        for k in pages:
            free(get(k))
        dt = perf() - t0
        gc.unfreeze()
        assert bp.get_num_free_blocks() == pool
        return dt

    def new_cache(self, num_pages: int) -> None:
        spec = self.FullAttentionSpec(block_size=PAGE, num_kv_heads=1, head_size=1, dtype=self.torch.float16)
        cfg = self.KVCacheConfig(
            num_blocks=num_pages + 1,
            kv_cache_tensors=[],
            kv_cache_groups=[self.KVCacheGroupSpec(["layer.0"], spec)],
        )
        self.n = num_pages
        self.m = self.KVCacheManager(
            cfg, max_model_len=1 << 21, scheduler_block_size=PAGE, hash_block_size=PAGE, enable_caching=True
        )
        self.bp = self.m.block_pool

    def serve(self, toks: Any) -> int | None:
        self.rid += 1
        m = self.m
        req = self.Request(str(self.rid), toks, self.sp, None, block_hasher=self.hasher)
        blocks, hit, _ = m.get_computed_blocks(req)
        n = len(toks)
        if m.allocate_slots(req, n - hit, hit, blocks) is None:
            return None
        req.num_computed_tokens = n
        m.free(req)
        return hit

    def usage(self) -> tuple[int, int, int]:
        free_q = self.bp.get_num_free_blocks()  # includes cached blocks no request holds
        cached = len(self.bp.cached_block_hash_to_block)
        return PAGE * (free_q - cached), PAGE * cached, PAGE * (self.n - free_q)


class SglangAdapter(Adapter):
    """SGLang ``RadixCache`` (legacy) or ``UnifiedRadixCache`` (FULL component, Rust TreeCore) over
    SGLang's own CPU allocator, page size 1 or 16, per request a simplified ``cache_finished_req``:
    ``match_prefix`` (key capped at len - 1), ``lock``, ``path_device_indices``, ``evict`` when short,
    ``alloc``, ``insert`` (legacy: the caller frees the duplicates; URC: ``prev_prefix_len`` = matched,
    it frees them itself), free the partial tail page, ``unlock``."""

    def __init__(self, urc: str | None, page_size: int) -> None:
        self.urc = urc
        self.page_size = page_size
        self.name = f"sglang-{'urc-' + urc if urc else 'radix'}-p{page_size}"
        if page_size != PAGE:
            self.workloads = "abc"  # d is defined at 16-token pages

    def setup(self) -> None:
        import torch

        torch.set_num_threads(1)
        import sglang
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.torch, self.sglang = torch, sglang
        self.TokenAlloc, self.PagedAlloc = TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator
        self.EvictParams, self.InsertParams = EvictParams, InsertParams
        self.MatchPrefixParams = MatchPrefixParams
        self.CacheInitParams, self.RadixCache, self.RadixKey = CacheInitParams, RadixCache, RadixKey
        self.URC, self.FULL = UnifiedRadixCache, ComponentType.FULL
        self.new_cache(64)  # fail here (not mid-run) if the tree core cannot be built
        self.core = type(getattr(self.c, "tree_core", self.c)).__name__
        if self.urc == "rust" and "Rust" not in self.core:
            raise RuntimeError(f"asked for the Rust TreeCore, got {self.core}")

    def versions(self) -> dict[str, str]:
        return {"sglang": self.sglang.__version__, "torch": self.torch.__version__, self.name: self.core}

    def convert(self, toks: Any) -> Any:
        a = array("q")
        a.frombytes(toks.astype("int64").tobytes())
        return a

    def _allocator(self, num_pages: int) -> Any:
        f16 = self.torch.float16
        if self.page_size == 1:
            return self.TokenAlloc(num_pages * PAGE, f16, "cpu", None, need_sort=False)
        return self.PagedAlloc(num_pages * PAGE, self.page_size, f16, "cpu", None, need_sort=False)

    def run_a(self, pages: Sequence[int], pool: int) -> float:
        a = self._allocator(pool)
        alloc = a.alloc
        free = a.free if self.page_size == 1 else a.free_segment
        kw: dict[str, int] = {} if self.page_size == 1 else {"start_pos": 0}
        sizes = [k * PAGE for k in pages]
        _gc_quiet()
        t0 = perf()
        for n in sizes:
            free(alloc(n), **kw)
        dt = perf() - t0
        gc.unfreeze()
        assert a.available_size() == pool * PAGE
        return dt

    def new_cache(self, num_pages: int) -> None:
        self.a = self._allocator(num_pages)
        self.n = num_pages
        p = self.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.a, page_size=self.page_size
        )
        if self.urc:
            p = self.CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.a,
                page_size=self.page_size,
                tree_components=(self.FULL,),
                tree_core_backend=self.urc,
            )
            self.c = self.URC(p)
        else:
            self.c = self.RadixCache(p)

    def serve(self, toks: Any) -> int | None:
        c, a, ps = self.c, self.a, self.page_size
        n = len(toks)
        mr = c.match_prefix(self.MatchPrefixParams(key=self.RadixKey(toks, limit=n - 1)))
        hit = mr.device_prefix_len
        lock = c.lock(mr.last_device_node)
        prefix = c.path_device_indices(mr.last_device_node)[:hit]
        need = n - hit
        if ps > 1:
            need = -(-need // ps) * ps
        avail = a.available_size()
        if avail < need:
            c.evict(self.EvictParams(num_tokens=need - avail))
        new = a.alloc(need)
        if new is None:
            c.unlock(lock)
            return None
        kv = self.torch.cat((prefix, new))
        full = n // ps * ps
        key = self.RadixKey(toks, limit=full) if full < n else self.RadixKey(toks)
        if self.urc:
            c.insert(self.InsertParams(key=key, value=kv[:full].clone(), prev_prefix_len=hit))
        else:
            res = c.insert(self.InsertParams(key=key, value=kv[:full].clone()))
            if res.prefix_len > hit:
                a.free_segment(kv[hit : res.prefix_len], start_pos=hit)
        if full < len(kv):
            a.free_segment(kv[full:], start_pos=full)
        c.unlock(lock)
        return hit

    def evict(self, num_pages: int) -> int:
        return int(self.c.evict(self.EvictParams(num_tokens=num_pages * PAGE)).num_tokens_evicted) // PAGE

    def usage(self) -> tuple[int, int, int]:
        return self.a.available_size(), self.c.evictable_size(), self.c.protected_size()


def make_adapter(name: str) -> Adapter:
    if name == "kvcore":
        return KvcoreAdapter()
    if name == "pyref":
        return PyrefAdapter()
    if name == "vllm":
        return VllmAdapter()
    if name.startswith("sglang-"):
        parts = name.split("-")  # sglang-radix-p16 / sglang-urc-rust-p1
        ps = int(parts[-1][1:])
        return SglangAdapter(parts[2] if parts[1] == "urc" else None, ps)
    raise SystemExit(f"unknown --impl {name!r}; known: {', '.join(ALL_IMPLS)}")


# --------------------------------------------------------------------------------------------------
# Workload runners: each returns one rep's metrics (and raises on a failed accounting check)
# --------------------------------------------------------------------------------------------------


def _check_idle(ad: Adapter, pool: int, what: str) -> tuple[int, int]:
    """Nothing in use and free + cached == pool; returns (free, cached) in tokens."""
    free, cached, in_use = ad.usage()
    if in_use != 0 or free + cached != pool * PAGE:
        raise AssertionError(
            f"{what}: accounting (tokens) free={free} cached={cached} in_use={in_use} pool={pool * PAGE}"
        )
    return free, cached


def run_a(ad: Adapter, s: Streams, cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    dt = ad.run_a(s.a_pages, cfg.a_pool)
    pages = sum(s.a_pages)
    return {"a_pairs_per_s": len(s.a_pages) / dt, "a_ns_per_page": dt / pages * 1e9, "a_s": dt}


def run_b(ad: Adapter, s: Streams, cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    # Room for everything (the prompts once, every request's own pages): nothing is evicted in b.
    own = sum(-(-(len(t) - cfg.b_prompt_len) // PAGE) for t in s.b_reqs)
    pool = cfg.b_prompts * (cfg.b_prompt_len // PAGE) + own + 64
    ad.new_cache(pool)
    for t in conv["b_warm"]:
        assert ad.serve(t) is not None
    _, cached0 = _check_idle(ad, pool, "b warm")
    dt, hits, refused = ad.run_serve(conv["b_reqs"])
    _, cached1 = _check_idle(ad, pool, "b")
    tokens = sum(len(t) for t in s.b_reqs)
    new_tokens = sum(ad.cacheable(len(t)) for t in s.b_reqs) - hits
    return {
        "b_req_per_s": len(s.b_reqs) / dt,
        "b_ns_per_tok": dt / max(hits, 1) * 1e9,
        "b_hit": hits / tokens,
        "b_refused": refused,
        "b_evicted": (cached0 + new_tokens - cached1) / PAGE,
        "b_s": dt,
    }


def run_c(ad: Adapter, s: Streams, cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    pool = cfg.c_pool
    out: dict[str, float] = {}
    ad.new_cache(pool)
    for t in conv["c_fill"]:
        assert ad.serve(t) is not None
    free0, cached0 = _check_idle(ad, pool, "c fill")
    assert free0 == 0, f"c fill left {free0} pages free"
    ev0 = ad.evicted_total() if isinstance(ad, KvcoreAdapter) else 0
    dt, hits, refused = ad.run_serve(conv["c_reqs"])
    _, cached1 = _check_idle(ad, pool, "c")
    new_tokens = sum(ad.cacheable(len(t)) for t in s.c_reqs) - hits
    evicted = (cached0 + new_tokens - cached1) / PAGE
    if isinstance(ad, KvcoreAdapter):
        assert ad.evicted_total() - ev0 == evicted, (ad.evicted_total() - ev0, evicted)
    out.update(
        c_req_per_s=len(s.c_reqs) / dt,
        c_evict_per_s=evicted / dt,
        c_evicted=evicted,
        c_refused=refused,
        c_s=dt,
    )
    if ad.has_evict:  # explicit evict() calls on a full cache, 64 pages a call; EVICT_ROUNDS refills
        total, dt2 = 0, 0.0
        for _ in range(EVICT_ROUNDS):
            ad.new_cache(pool)
            for t in conv["c_fill"]:
                ad.serve(t)
            target = total + pool // 64 * 64
            evict = ad.evict
            _gc_quiet()
            t0 = perf()
            while total < target:
                got = evict(64)
                if got == 0:
                    break
                total += got
            dt2 += perf() - t0
            gc.unfreeze()
            _check_idle(ad, pool, "c evict")
        out.update(c_evict_ns_per_page=dt2 / max(total, 1) * 1e9, c_evict_calls_pages=total)
    return out


def run_d(ad: Adapter, s: Streams, cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    """The first ``cfg.d_requests`` trace requests (every row)."""
    reqs = s.d_trace[: cfg.d_requests] if cfg.d_requests else s.d_trace
    return {f"d_{k}": v for k, v in _replay(ad, reqs, cfg, conv).items()}


def run_full(ad: Adapter, s: Streams, cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    """The whole trace (kvcore only, for its 1.5 s target)."""
    return {f"D_{k}": v for k, v in _replay(ad, s.d_trace, cfg, conv).items()}


def _replay(ad: Adapter, reqs: list[tuple[Any, int]], cfg: Config, conv: dict[str, Any]) -> dict[str, float]:
    build = conv["d_build"]
    convert = ad.convert
    ad.new_cache(cfg.d_pages)
    serve = ad.serve
    hits = refused = tokens = 0
    total = 0.0
    _gc_quiet()
    w0 = perf()
    for hids, n in reqs:
        t = convert(build(hids, n))
        t0 = perf()
        h = serve(t)
        total += perf() - t0
        tokens += n
        if h is None:
            refused += 1
        else:
            hits += h
    wall = perf() - w0
    gc.unfreeze()
    _check_idle(ad, cfg.d_pages, "d")
    return {
        "req_per_s": len(reqs) / total,
        "total_s": total,
        "wall_s": wall,
        "hit": hits / tokens,
        "refused": refused,
        "tokens": tokens,
        "requests": len(reqs),
    }


RUNNERS: dict[str, Callable[[Adapter, Streams, Config, dict[str, Any]], dict[str, float]]] = {
    "a": run_a,
    "b": run_b,
    "c": run_c,
    "d": run_d,
    "D": run_full,
}


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------

COLUMNS: list[tuple[str, str, str]] = [  # (metric, header, format)
    ("a_pairs_per_s", "a alloc+free/s", "rate"),
    ("a_ns_per_page", "a ns/page", "ns"),
    ("b_req_per_s", "b req/s", "rate"),
    ("b_ns_per_tok", "b ns/tok matched", "ns"),
    ("b_hit", "b hit", "pct"),
    ("c_req_per_s", "c req/s", "rate"),
    ("c_evict_per_s", "c evicted/s", "rate"),
    ("c_evict_ns_per_page", "c evict() ns/page", "ns"),
    ("d_req_per_s", "d req/s", "rate"),
    ("d_total_s", "d total s", "s"),
    ("d_hit", "d hit", "pct"),
]


def _fmt(v: float | None, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "rate":
        for div, suf in ((1e6, "M"), (1e3, "k")):
            if v >= 10 * div or (div == 1e6 and v >= div):
                return f"{v / div:.2f}{suf}" if v < 100 * div else f"{v / div:.1f}{suf}"
        return f"{v:.0f}"
    if kind == "ns":
        return f"{v:.1f}" if v < 100 else f"{v:.0f}"
    if kind == "pct":
        return f"{100 * v:.2f}%"
    return f"{v:.3f}"


def median_metrics(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for smp in samples for k in smp}
    return {k: statistics.median(smp[k] for smp in samples if k in smp) for k in sorted(keys)}


def print_table(impls: list[str], med: dict[str, dict[str, float]], errors: dict[str, str]) -> None:
    cols = [c for c in COLUMNS if any(c[0] in med.get(i, {}) for i in impls)]
    w0 = max(len(i) for i in impls) + 1
    heads = [h for _, h, _ in cols]
    widths = [max(len(h), 8) for h in heads]
    print(f"{'impl':<{w0}}| " + " | ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True)))
    print("-" * (w0 + 2 + sum(widths) + 3 * (len(widths) - 1)))
    for i in impls:
        if i in errors and not med.get(i):
            print(f"{i:<{w0}}| {errors[i]}")
            continue
        row = med.get(i, {})
        cells = [_fmt(row.get(k), kind) for k, _, kind in cols]
        print(f"{i:<{w0}}| " + " | ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))


# The best peer figures in shared/research/peers.md (2026-11-29 run, torch 2.13.0+cpu), for context.
PEERS_MD_BEST: dict[str, tuple[str, float]] = {
    "a_ns_per_page": ("sglang-urc-rust-p16", 373.0),
    "b_ns_per_tok": ("sglang-urc-rust-p1", 23.0),
    "c_evict_ns_per_page": ("sglang-radix-p1", 464.0),
    "c_evict_per_s": ("sglang-radix-p1", 1.09e6),
}


def targets(med: dict[str, dict[str, float]]) -> list[str]:
    kv = med.get("kvcore")
    if not kv:
        return ["kvcore did not run"]
    peers = {i: m for i, m in med.items() if i.startswith(("vllm", "sglang"))}
    lines = []

    def best(metric: str, low: bool) -> tuple[str, float] | None:
        vals = [(i, m[metric]) for i, m in peers.items() if metric in m]
        if not vals:
            return None
        return min(vals, key=lambda x: x[1]) if low else max(vals, key=lambda x: x[1])

    def check(label: str, metric: str, low: bool, need: float) -> None:
        b = best(metric, low)
        if metric not in kv or b is None:
            lines.append(f"{label}: n/a (no peer or no kvcore figure)")
            return
        kind = "ns" if low else "rate"
        ratio = b[1] / kv[metric] if low else kv[metric] / b[1]
        ok = "MET" if ratio >= need else "MISSED"
        extra = []
        if metric in med.get("pyref", {}):
            r = med["pyref"][metric] / kv[metric] if low else kv[metric] / med["pyref"][metric]
            extra.append(f"vs pyref {_fmt(med['pyref'][metric], kind)}: {r:.1f}x")
        if metric in PEERS_MD_BEST:
            who, v = PEERS_MD_BEST[metric]
            r = v / kv[metric] if low else kv[metric] / v
            extra.append(f"vs peers.md's best ({who} {_fmt(v, kind)}): {r:.1f}x")
        lines.append(
            f"{label}: kvcore {_fmt(kv[metric], kind)} vs best peer {b[0]} {_fmt(b[1], kind)} -> "
            f"{ratio:.1f}x (target >= {need:g}x) {ok}\n      ({'; '.join(extra)})"
        )

    check("allocation, ns/page (a)", "a_ns_per_page", True, 20)
    check("eviction, explicit evict() ns/page (c)", "c_evict_ns_per_page", True, 20)
    check("eviction, end-to-end evicted pages/s (c)", "c_evict_per_s", False, 20)
    check("prefix match, ns/matched token (b)", "b_ns_per_tok", True, 10)
    for pre in ("D", "d"):
        if f"{pre}_total_s" in kv:
            t, n = kv[f"{pre}_total_s"], int(kv[f"{pre}_requests"])
            ok = "MET" if t <= 1.5 else "MISSED"
            lines.append(
                f"conversation trace through kvcore ({n} requests): {t:.3f} s (target <= 1.5 s) {ok}"
            )
            break
    return lines


def hit_agreement(impls: list[str], med: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for metric in ("b_hit", "d_hit"):
        vals = {i: med[i][metric] for i in impls if metric in med.get(i, {})}
        if len(vals) < 2:
            continue
        ref = vals.get("kvcore", next(iter(vals.values())))
        diffs = {i: v - ref for i, v in vals.items() if abs(v - ref) > 5e-5}
        if not diffs:
            lines.append(f"{metric}: all {len(vals)} implementations agree ({100 * ref:.3f}%)")
        else:
            d = ", ".join(f"{i} {100 * v:+.3f} pt" for i, v in diffs.items())
            lines.append(f"{metric}: kvcore {100 * ref:.3f}%; differ: {d}")
    return lines


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default=",".join(ALL_IMPLS), help=f"comma list of {', '.join(ALL_IMPLS)}")
    ap.add_argument("--workloads", default="abcd", help="any of a, b, c, d")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the request counts of a, b, c")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--trace-pages", type=int, default=320_000, help="capacity of d in 16-token pages")
    ap.add_argument(
        "--trace-requests",
        type=int,
        default=1000,
        help="d runs every row on the first N trace requests (0: all); kvcore also runs the whole trace",
    )
    ap.add_argument("--d-reps", type=int, default=0, help="reps of d (0: --reps)")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: last; -1: none)")
    ap.add_argument("--json", type=Path, default=None, help="write every rep's metrics here")
    args = ap.parse_args(argv)

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import warnings

    warnings.filterwarnings("ignore")
    t_start = perf()
    load0 = os.getloadavg()

    cfg = Config(
        a_requests=max(1, round(10_000 * args.scale)),
        b_requests=max(1, round(2000 * args.scale)),
        c_requests=max(1, round(1000 * args.scale)),
        d_pages=args.trace_pages,
        d_requests=args.trace_requests,
    )
    wl = "".join(w for w in "abcd" if w in args.workloads)
    if "d" in wl and not args.trace.exists():
        print(f"note: trace {args.trace} not found: skipping workload d", file=sys.stderr)
        wl = wl.replace("d", "")

    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    adapters: dict[str, Adapter] = {}
    errors: dict[str, str] = {}
    versions: dict[str, str] = {"python": platform.python_version()}
    for name in impls:
        ad = make_adapter(name)
        try:
            ad.setup()
            adapters[name] = ad
            versions.update(ad.versions())
        except Exception as e:  # a peer that does not import is reported, not fatal
            errors[name] = f"setup failed: {type(e).__name__}: {e}"[:200]
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1] if args.cpu is None else args.cpu
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})

    streams = build_streams(cfg, args.trace if "d" in wl else None)
    convs: dict[str, dict[str, Any]] = {}
    for name, ad in adapters.items():
        convs[name] = {
            "b_warm": [ad.convert(t) for t in streams.b_warm] if "b" in wl else [],
            "b_reqs": [ad.convert(t) for t in streams.b_reqs] if "b" in wl else [],
            "c_fill": [ad.convert(t) for t in streams.c_fill] if "c" in wl else [],
            "c_reqs": [ad.convert(t) for t in streams.c_reqs] if "c" in wl else [],
            "d_build": TraceTokens() if "d" in wl else None,
        }

    samples: dict[str, list[dict[str, float]]] = {n: [] for n in adapters}
    if "d" in wl and "kvcore" in adapters and 0 < cfg.d_requests < len(streams.d_trace):
        wl += "D"
    for w in wl:
        reps = (args.d_reps or args.reps) if w in "dD" else args.reps
        per: dict[str, list[dict[str, float]]] = {n: [] for n in adapters}
        for rep in range(reps):
            for name, ad in adapters.items():
                if w.lower() not in ad.workloads or name in errors or (w == "D" and name != "kvcore"):
                    continue
                try:
                    per[name].append(RUNNERS[w](ad, streams, cfg, convs[name]))
                except Exception as e:
                    errors[name] = f"{w} rep {rep} failed: {type(e).__name__}: {e}"[:300]
                    print(f"!! {name}: {errors[name]}", file=sys.stderr)
            print(f"  [{w}] rep {rep + 1}/{reps} done, {perf() - t_start:.0f} s", file=sys.stderr)
        for name, reps_m in per.items():
            if reps_m:
                for i, m in enumerate(reps_m):
                    if i >= len(samples[name]):
                        samples[name].append({})
                    samples[name][i].update(m)

    med = {n: median_metrics(smp) for n, smp in samples.items() if smp}
    wall = perf() - t_start
    load1 = os.getloadavg()
    print()
    print(
        f"KV-cache bookkeeping, CPU only, page_size=16, python {platform.python_version()}, "
        f"{os.cpu_count()} cpus (pinned to cpu {cpu if cpu >= 0 else 'none'}), median of {args.reps} reps"
    )
    print(
        f"a: {cfg.a_requests} reqs U[1,2048] tok, pool {cfg.a_pool} | b: {cfg.b_prompts}x{cfg.b_prompt_len} "
        f"prompts + U{list(cfg.b_unique)}, {cfg.b_requests} reqs | c: pool {cfg.c_pool}, "
        f"{cfg.c_requests} reqs x {cfg.c_len} tok | d: first {cfg.d_requests or len(streams.d_trace)} of "
        f"{len(streams.d_trace)} trace reqs, {cfg.d_pages} pages"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(
        f"load average (1/5/15 min): start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
        f"end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}"
    )
    print()
    print_table(impls, med, errors)
    for name, err in errors.items():
        if med.get(name):
            print(f"!! {name}: {err}")
    print()
    kv = med.get("kvcore", {})
    if "D_total_s" in kv:
        rate = _fmt(kv["D_req_per_s"], "rate")
        print(
            f"kvcore, whole trace ({int(kv['D_requests'])} reqs, {kv['D_tokens'] / 1e6:.1f} M prompt tokens, "
            f"{cfg.d_pages} pages): {kv['D_total_s']:.3f} s in the cache calls ({kv['D_wall_s']:.3f} s with "
            f"building the token ids), {rate} req/s, "
            f"hit {100 * kv['D_hit']:.2f}%, refused {int(kv['D_refused'])}"
        )
    skipped_d = [n for n, ad in adapters.items() if "d" in wl and "d" not in ad.workloads]
    if skipped_d:
        print(f"d not run for {', '.join(skipped_d)}: the trace workload is defined at 16-token pages")
    for line in hit_agreement(impls, med):
        print(line)
    if any(n.startswith("sglang") for n in med):
        print(
            "  (policy: kvcore, pyref and vLLM evict single pages, least recently used first\n"
            "   (a sequence's tail before its head); SGLang evicts whole radix-tree leaves by node\n"
            "   access time, and a leaf can hold many pages, so under pressure it drops more than it\n"
            "   needs: a lower d hit rate, and a few extra pages evicted in c that stay free)"
        )
    print(
        f"checks (median per rep): b must evict 0 pages; c must evict {cfg.c_requests * (cfg.c_len // PAGE)} "
        "pages (64 a request); nothing refused; accounting (free + cached == pool) passed after every run"
    )
    for name, m in med.items():
        extra = {k: m[k] for k in ("b_evicted", "b_refused", "c_evicted", "c_refused", "d_refused") if k in m}
        print(f"  {name}: {', '.join(f'{k}={v:g}' for k, v in extra.items())}")
    print()
    print("targets (kvcore vs the best vLLM/SGLang row, same run):")
    for line in targets(med):
        print("  " + line)
    print(f"total wall time {wall:.1f}s")

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": {**cfg.__dict__, "reps": args.reps, "workloads": wl, "cpu": cpu},
                    "versions": versions,
                    "load": {"start": load0, "end": load1},
                    "median": med,
                    "reps": samples,
                    "errors": errors,
                    "wall_s": wall,
                },
                indent=1,
            )
        )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
