"""Throughput of the remote tier (RedisTier) against redis-py and redis-benchmark, same run, same server.

Run: ``.venv/bin/python benches/tiers_remote.py [--pages 500] [--repeats 5] [--url redis://127.0.0.1:6379]``
(without ``--url`` it starts its own ``redis-server`` on 127.0.0.1, no persistence, and stops it at the
end; with ``--url`` the server's keys are FLUSHALL-ed between runs: use a scratch server).

Rows, per page size (2 MiB: Llama-3.1-8B bf16 16-token page, 32 layers x 8 kv heads x 16 x 128; and
64 KiB: 1 layer), GB/s of value bytes (the 4 KiB header included on every side), median of
``--repeats``:

- ``RedisTier.store`` / ``load`` of ``--pages`` pages (one ``SET NX`` / ``GET`` per page, pipelined);
  before each timed store the keys are deleted (the server reuses the freed memory, as a cache in
  steady state does); the ``after FLUSHALL`` rows store into fresh server memory instead;
- redis-py ``set`` / ``get`` of the same bytes one command at a time (the baseline; goal >= 2x);
- redis-py ``pipeline()`` of the same commands (what a tier built on redis-py pipelines would do);
- ``redis-benchmark -t set,get -d <value bytes> -n <N> -P 16 -q`` with its default 50 clients, with
  ``-c 1``, and with ``-c 1 -r <pages>`` (random keys: many values, as the tier's, instead of one key
  rewritten in cache): the ceiling, C and no Python; goal >= 50 % of the best of the three;
- one key per run of 16 pages instead of per page (a pool with 16x larger pages, same bytes), to
  decide the value granularity;
- ``RedisTier.exists`` of a 2,048-token prefix (128 keys, all present): µs per round trip;
- for reference, the Rust ``kvcore._kvcore.RespClient`` ``set_many`` / ``get_into`` on the same raw
  values (no header, checksum or pool copy), where the build has it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvcore.pool import KVPool
from kvcore.tiers import RedisTier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", workdir),
            *("--logfile", os.path.join(workdir, "redis.log")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def _pool(layers: int, page_size: int, num_pages: int, seed: int = 0) -> KVPool:
    pool = KVPool(
        num_layers=layers,
        num_pages=num_pages,
        num_kv_heads=8,
        head_dim=128,
        page_size=page_size,
        kv_dtype="bf16",
        layout="HND",
    )
    raw = np.random.default_rng(seed).integers(0, 256, size=pool.data.nbytes, dtype=np.uint8)
    pool.data.view(np.uint8).reshape(-1)[:] = raw
    return pool


def _median_time(fn: Callable[[], object], repeats: int, before: Callable[[], object]) -> float:
    out = []
    for _ in range(repeats):
        before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _redis_benchmark(port: int, size: int, n: int, clients: int | None, keys: int | None) -> dict[str, float]:
    """GB/s of SET and GET from redis-benchmark (requests/s x value bytes)."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-d", str(size)]
    cmd += ["-n", str(n), "-P", "16", "-q"] + ([] if clients is None else ["-c", str(clients)])
    cmd += [] if keys is None else ["-r", str(keys)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = (done.stdout + done.stderr).replace("\r", "\n")
    res = {}
    for kind in ("SET", "GET"):
        m = re.findall(rf"{kind}: ([0-9.]+) requests per second", out)
        res[kind.lower()] = float(m[-1]) * size / 1e9 if m else float("nan")
    if not all(math.isfinite(v) for v in res.values()):
        tail = [x for x in out.splitlines() if x.strip() and "rps=" not in x][-3:]
        print(f"  (redis-benchmark {' '.join(cmd[7:])}: exit {done.returncode}, {tail})")
    return res


def _row(what: str, nbytes: int, seconds: float, base: float | None = None) -> None:
    ratio = "" if base is None else f"{base / seconds:7.2f}x"
    print(f"  {what:<52} {seconds * 1e3:9.1f} ms {nbytes / seconds / 1e9:7.2f} GB/s {ratio}")


def bench_size(
    url: str, port: int, r: object, label: str, layers: int, n: int, repeats: int, run: int
) -> dict[str, float]:
    import redis

    assert isinstance(r, redis.Redis)
    pool = _pool(layers, 16, n + 1)
    tier = RedisTier(url, pool, timeout_s=5.0, prefix="bench")
    vb = tier.value_bytes
    nbytes = n * vb
    pages = np.arange(1, n + 1, dtype=np.int32)
    slots = np.arange(n, dtype=np.int32)
    rng = np.random.default_rng(1)
    meta: dict[str, Any] = {
        "keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "parent_keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "tokens": rng.integers(0, 1 << 31, size=(n, 16), dtype=np.uint32),
        "namespaces": ["bench"] * n,
    }
    # The same value bytes for redis-py: what the tier stored, read back once.
    r.flushall()
    assert tier.store(pool, pages, slots, **meta).all()
    names = [tier.redis_key(k) for k in meta["keys"]]
    values: list[bytes] = []
    for k in names:
        v = r.get(k)
        assert isinstance(v, bytes) and len(v) == vb
        values.append(v)
    plain_keys = [b"plain:" + k for k in names]
    print(f"{label}: {n} values of {vb} bytes ({vb - tier.payload_len} header + {tier.payload_len} payload)")

    out: dict[str, float] = {}

    def flush() -> None:
        r.flushall()

    def forget(keys: list[bytes]) -> Callable[[], None]:
        """Delete exactly these keys (untimed): the server keeps the freed memory and reuses it for
        the next writes, as a cache does in steady state (evicting or expiring values to store new
        ones). FLUSHALL also purges the allocator's free pages, so every write after it faults fresh
        memory in: on this machine that halves the server's SET rate for 64 KiB values."""

        def go() -> None:
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])

        return go

    forget_all = forget(names + plain_keys)

    def noop() -> None:
        pass

    def plain_set() -> None:
        for k, v in zip(plain_keys, values, strict=True):
            r.set(k, v)

    def plain_get() -> None:
        for k in plain_keys:
            r.get(k)

    def pipe_set() -> None:
        p = r.pipeline(transaction=False)
        for k, v in zip(plain_keys, values, strict=True):
            p.set(k, v, nx=True)
        p.execute()

    def pipe_get() -> None:
        p = r.pipeline(transaction=False)
        for k in plain_keys:
            p.get(k)
        p.execute()

    def tier_store() -> None:
        ok = tier.store(pool, pages, slots, **meta)
        assert ok.all(), tier.stats()

    def tier_load() -> None:
        ok = tier.load(pool, slots, pages, meta["keys"])
        assert ok.all(), tier.stats()

    t_ps = _median_time(plain_set, repeats, forget_all)
    t_pg = _median_time(plain_get, repeats, noop)
    t_qs = _median_time(pipe_set, repeats, forget_all)
    t_qg = _median_time(pipe_get, repeats, noop)
    t_ts = _median_time(tier_store, repeats, forget_all)
    t_tl = _median_time(tier_load, repeats, noop)
    t_ps_cold = _median_time(plain_set, repeats, flush)
    t_ts_cold = _median_time(tier_store, repeats, flush)
    _row("redis-py set, one command at a time (baseline)", nbytes, t_ps)
    _row("redis-py pipeline set NX", nbytes, t_qs, t_ps)
    _row("RedisTier.store (SET NX, pipelined, checksums)", nbytes, t_ts, t_ps)
    _row("redis-py set after FLUSHALL (fresh server memory)", nbytes, t_ps_cold)
    _row("RedisTier.store after FLUSHALL (fresh server memory)", nbytes, t_ts_cold, t_ps_cold)
    _row("redis-py get, one command at a time (baseline)", nbytes, t_pg)
    _row("redis-py pipeline get", nbytes, t_qg, t_pg)
    _row("RedisTier.load (GET, pipelined, checks, into the pool)", nbytes, t_tl, t_pg)
    out.update(
        store=nbytes / t_ts / 1e9,
        load=nbytes / t_tl / 1e9,
        store_cold=nbytes / t_ts_cold / 1e9,
        plain_set_cold=nbytes / t_ps_cold / 1e9,
        plain_set=nbytes / t_ps / 1e9,
        plain_get=nbytes / t_pg / 1e9,
    )

    # The Rust transport (kvcore._kvcore.RespClient) on the same values, raw: no header, checksum or
    # pool copy, for the choice of RedisTier's transport.
    from kvcore import _kvcore

    if hasattr(_kvcore, "RespClient"):
        rc = _kvcore.RespClient([f"127.0.0.1:{port}"], False, 5.0)
        rows = np.stack([np.frombuffer(v, dtype=np.uint8) for v in values])
        into = np.zeros_like(rows)
        t_rcs = _median_time(lambda: rc.set_many(plain_keys, rows, True, None), repeats, forget_all)
        t_rcg = _median_time(lambda: rc.get_into(plain_keys, into), repeats, noop)
        assert np.array_equal(into, rows)
        _row("RespClient.set_many (Rust, raw values)", nbytes, t_rcs, t_ps)
        _row("RespClient.get_into (Rust, raw values)", nbytes, t_rcg, t_pg)
        del rows, into

    # One key per run of `run` pages: the same bytes in values `run` times larger.
    if n // run >= 2:
        m = n // run
        big = _pool(layers, 16 * run, m + 1, seed=2)
        bt = RedisTier(url, big, timeout_s=5.0, prefix="benchrun")
        bp, bs = np.arange(1, m + 1, dtype=np.int32), np.arange(m, dtype=np.int32)
        bmeta: dict[str, Any] = {
            "keys": rng.integers(0, 256, size=(m, 16), dtype=np.uint8),
            "parent_keys": rng.integers(0, 256, size=(m, 16), dtype=np.uint8),
            "tokens": np.zeros((m, 16 * run), dtype=np.uint32),
            "namespaces": [None] * m,
        }
        bbytes = m * bt.value_bytes
        forget_run = forget([bt.redis_key(k) for k in bmeta["keys"]])
        forget_run()
        t_rs = _median_time(lambda: bt.store(big, bp, bs, **bmeta), repeats, forget_run)
        assert bt.store(big, bp, bs, **bmeta).all()
        t_rl = _median_time(lambda: bt.load(big, bs, bp, bmeta["keys"]), repeats, noop)
        assert bt.load(big, bs, bp, bmeta["keys"]).all()
        _row(f"RedisTier.store, one key per run of {run} pages", bbytes, t_rs, None)
        _row(f"RedisTier.load, one key per run of {run} pages", bbytes, t_rl, None)
        out.update(run_store=bbytes / t_rs / 1e9, run_load=bbytes / t_rl / 1e9)
        bt.close()

    # The ceiling, as asked (one key, 50 clients), with one client, and with one client over `n`
    # random keys (-r: values of many keys, as the tier's, rather than one key rewritten in cache).
    for clients, keys in ((None, None), (1, None), (1, n)):
        r.flushall()
        # with -r, 5 requests per key: the SETs cover 99 % of the keys, so the GETs rarely miss
        rb = _redis_benchmark(port, vb, n * (5 if keys else 4 if vb < (1 << 20) else 1), clients, keys)
        c = ("50 (default)" if clients is None else str(clients)) + ("" if keys is None else f" -r {keys}")
        print(f"  redis-benchmark -P 16 -c {c:<13} SET {rb['set']:6.2f} GB/s   GET {rb['get']:6.2f} GB/s")
        out[f"rb_set_{c}"], out[f"rb_get_{c}"] = rb["set"], rb["get"]
    ceil_set = max(
        (v for k, v in out.items() if k.startswith("rb_set") and math.isfinite(v)), default=math.nan
    )
    ceil_get = max(
        (v for k, v in out.items() if k.startswith("rb_get") and math.isfinite(v)), default=math.nan
    )
    print(
        f"  => store {out['store'] / out['plain_set']:.2f}x redis-py, {out['store'] / ceil_set:.0%} of "
        f"redis-benchmark; load {out['load'] / out['plain_get']:.2f}x redis-py, "
        f"{out['load'] / ceil_get:.0%} of redis-benchmark"
    )
    r.flushall()
    tier.close()
    return out


def bench_exists(url: str, r: object, calls: int) -> None:
    import redis

    assert isinstance(r, redis.Redis)
    pool = _pool(1, 16, 129)
    tier = RedisTier(url, pool, prefix="benchx", max_lookup_keys=256)
    n = 128  # 2,048 tokens of 16-token pages
    rng = np.random.default_rng(3)
    meta: dict[str, Any] = {
        "keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "parent_keys": rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        "tokens": np.zeros((n, 16), dtype=np.uint32),
        "namespaces": [None] * n,
    }
    assert tier.store(pool, np.arange(1, n + 1, dtype=np.int32), np.arange(n, dtype=np.int32), **meta).all()
    assert tier.exists(meta["keys"]) == n
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        tier.exists(meta["keys"])
        ts.append(time.perf_counter() - t)
    names = [tier.redis_key(k) for k in meta["keys"]]
    tp = []
    for _ in range(calls):
        t = time.perf_counter()
        p = r.pipeline(transaction=False)
        for k in names:
            p.exists(k)
        p.execute()
        tp.append(time.perf_counter() - t)
    t1 = []
    for _ in range(max(1, calls // 10)):
        t = time.perf_counter()
        r.ping()
        t1.append(time.perf_counter() - t)
    print(f"exists of a 2,048-token prefix ({n} keys, all present), median of {calls} calls:")
    print(f"  RedisTier.exists                 {statistics.median(ts) * 1e6:8.0f} µs")
    print(f"  redis-py pipeline of {n} EXISTS  {statistics.median(tp) * 1e6:8.0f} µs")
    print(f"  redis-py PING (one round trip)   {statistics.median(t1) * 1e6:8.0f} µs")
    tier.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--run", type=int, default=16, help="pages per value in the one-key-per-run rows")
    ap.add_argument("--url", default=None, help="a scratch server (FLUSHALL-ed); default: start one")
    ap.add_argument("--exists-calls", type=int, default=300)
    args = ap.parse_args()
    import redis

    workdir = tempfile.mkdtemp(prefix="kvcore-bench-redis-")
    proc = None
    try:
        if args.url is None:
            if shutil.which("redis-server") is None:
                raise SystemExit("redis-server not found (apt-get install redis-server), or pass --url")
            proc, port = _start_server(workdir)
            url = f"redis://127.0.0.1:{port}"
        else:
            url = args.url
            port = int(url.rsplit(":", 1)[1].split("/")[0])
        r = redis.Redis.from_url(url)
        print(f"server {url}, redis-py {redis.__version__}, hiredis {redis.utils.HIREDIS_AVAILABLE}")
        bench_size(url, port, r, "2 MiB pages (32 layers)", 32, args.pages, args.repeats, args.run)
        bench_size(url, port, r, "64 KiB pages (1 layer)", 1, args.pages, args.repeats, args.run)
        bench_exists(url, r, args.exists_calls)
        r.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
