"""kvcore.metrics through prometheus-client: every series equals the live objects' own counters at the
scrape, the HTTP endpoint serves them on loopback, and tenants' names appear only when asked for."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from kv_helpers import metric_value
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

import kvcore
from kvcore.metrics import KVCoreCollector, metrics_text, serve
from kvcore.pool import KVPool
from kvcore.scheduler import OutputLengthEstimator, Request, Scheduler, SwapCost
from kvcore.tiers import HostTier, Mover
from kvcore.tiny import TinyDecoder, TinyEngine


def busy() -> tuple[kvcore.KVCacheManager, Scheduler, Mover]:
    """A scheduler that swapped and finished requests of two tenants, one still running."""
    model = TinyDecoder(1, "fp16")
    pool = TinyEngine.make_pool(model, 12, 4)
    host = HostTier(pool, 64)
    m = kvcore.KVCacheManager(12, 4, lower_tiers=[host])
    mover = Mover(m, pool, [host])
    est = OutputLengthEstimator(0.5, min_samples=1)
    est.observe("default", 1)
    sched = Scheduler(m, swap=SwapCost(1 << 16, 100.0, 25.0), estimator=est, max_queued_requests=8)
    engine = TinyEngine(model, pool, mover)
    for i in range(6):
        sched.submit(
            Request(i, [1, 2, 3, 4, 5, i, 7], max_new_tokens=8, namespace="acme" if i % 2 else "zeta")
        )
    t = 0.0
    while len(sched.running_ids) != 1 or sched.num_waiting:
        plan = sched.step(t)
        sched.update(plan, engine.forward(plan))
        t += 1.0
    return m, sched, mover


def scrape(collector: KVCoreCollector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_series_equal_the_live_counters() -> None:
    m, sched, mover = busy()
    text = scrape(KVCoreCollector(m, scheduler=sched, mover=mover))
    st, s, tier = m.stats(), sched.stats(), m.tier_stats()["host"]
    for state in ("in_use", "cached", "pinned", "free"):
        assert metric_value(text, "kvcore_pages", state=state) == getattr(st, f"num_pages_{state}")
    assert metric_value(text, "kvcore_prefix_hit_tokens_total") == st.prefix_hit_tokens
    assert metric_value(text, "kvcore_tier_loaded_pages_total", tier="host") == tier["num_loaded_pages"] > 0
    assert (
        metric_value(text, "kvcore_tier_storage_stores_total", tier="host")
        == mover.storage_stats()["host"]["stores"]
    )
    assert metric_value(text, "kvcore_preemptions_total", kind="swap") == s.preemptions_by_kind["swap"] > 0
    assert metric_value(text, "kvcore_preemption_tax") == s.preemption_tax
    assert metric_value(text, "kvcore_requests", state="running") == 1
    assert (
        metric_value(text, "kvcore_requests_finished_total", reason="length")
        == s.finished_by_reason["length"]
    )
    assert metric_value(text, "kvcore_computed_tokens_total") == s.computed_tokens
    # Tenant names stay inside unless asked for.
    assert "acme" not in text and "zeta" not in text
    text = scrape(KVCoreCollector(m, scheduler=sched, tenant_labels=True))
    held: dict[str, int] = {}
    for rid in m.seq_ids():  # the manager's own view of every live request's pages
        ns = "acme" if rid % 2 else "zeta"
        held[ns] = held.get(ns, 0) + len(m.seq_pages(rid))
    assert held
    for ns, pages in held.items():
        assert metric_value(text, "kvcore_tenant_pages", tenant=ns, default_namespace="false") == pages


# Names a tenant may pick, each a distinct namespace of the cache: the default one (None), the empty
# name, names spelling the label syntax, and names that look like the default's own label values.
HOSTILE_NAMESPACES = [None, "", 'a"b', "c\\d", "e\nf", "*", "ünï", "x" * 300, "a\x00b", "true", "None", "{}"]


def test_every_series_is_unique_with_hostile_tenant_names() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    cache = kvcore.KVCacheManager(num_pages=400, page_size=4)
    sched = Scheduler(cache)
    for i, ns in enumerate(HOSTILE_NAMESPACES):
        sched.submit(Request(i, [i + 1] * (4 * i + 5), max_new_tokens=3, namespace=ns), 0.0)
    sched.step(0.0)
    text = scrape(KVCoreCollector(cache, scheduler=sched, tenant_labels=True))
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in seen, f"two series {key}: Prometheus refuses the scrape"
            seen.add(key)
    # Each tenant is its own series, holding its own request's pages (prompt i: 4 i + 5 tokens).
    for i, ns in enumerate(HOSTILE_NAMESPACES):
        labels = (
            {"tenant": "", "default_namespace": "true"}
            if ns is None
            else {"tenant": ns, "default_namespace": "false"}
        )
        assert metric_value(text, "kvcore_tenant_pages", **labels) == len(cache.seq_pages(i))
    assert sum(1 for name, _ in seen if name == "kvcore_tenant_pages") == len(HOSTILE_NAMESPACES)


def test_serve_answers_on_loopback() -> None:
    m, sched, mover = busy()
    server = serve(0, KVCoreCollector(m, scheduler=sched, mover=mover))
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert metric_value(text, "kvcore_pages", state="free") == m.stats().num_pages_free
        assert metric_value(text, "kvcore_pressure_level") == 0
    finally:
        server.shutdown()
        server.server_close()


def test_tier_slots_sum_to_the_tiers_slots_and_bad_and_locked_have_families_of_their_own() -> None:
    """``kvcore_tier_slots{tier,state}`` is a partition (cached / in_flight / free), as ``kvcore_pages``
    is: ``sum by (tier)`` is the tier's slots. Bad and locked slots, subsets of the cached ones, are
    families of their own (they used to be states of the split too: 11 of an 8-slot tier)."""
    from prometheus_client.parser import text_string_to_metric_families

    pool = KVPool(num_layers=1, num_pages=16, num_kv_heads=1, head_dim=8, page_size=4, kv_dtype="fp16")
    host = HostTier(pool, 8)
    m = kvcore.KVCacheManager(16, 4, lower_tiers=[host], store_policy="all")
    mover = Mover(m, pool, [host])
    prompt = list(range(13))
    m.add_sequence(1, prompt)
    mover.run()
    m.free_sequence(1)
    m.evict(100)
    m.add_sequence(2, prompt)  # hits the host tier: its loads, taken, lock the slots until they run
    m.take_transfers(stores=False)
    live = m.tier_stats()["host"]
    assert live["num_slots_locked"] > 0 and live["num_slots_cached"] > 0
    bad = {**live, "num_slots_bad": 1}  # a cached slot whose load failed (the manager may drop it at once)
    for tiers, text in (
        (live, scrape(KVCoreCollector(m, mover=mover))),
        (bad, metrics_text(m.stats(), tiers={"host": bad}, storage=mover.storage_stats())),
    ):
        families = list(text_string_to_metric_families(text))
        names = [f.name for f in families]
        assert len(names) == len(set(names))  # no family twice, none clashing with the storage families
        slots = {f.name: f for f in families}["kvcore_tier_slots"]
        by_state = {s.labels["state"]: s.value for s in slots.samples if s.labels["tier"] == "host"}
        assert by_state == {st: tiers[f"num_slots_{st}"] for st in ("cached", "in_flight", "free")}
        assert sum(by_state.values()) == tiers["num_slots"] == 8  # like kvcore_pages: a partition
        for st in ("bad", "locked"):
            assert metric_value(text, f"kvcore_tier_slots_{st}", tier="host") == tiers[f"num_slots_{st}"]
        assert metric_value(text, "kvcore_tier_storage_num_slots", tier="host") == 8
    assert metric_value(text, "kvcore_tier_slots_bad", tier="host") == 1


def test_a_scrape_with_tenant_labels_never_writes_the_scheduler() -> None:
    """tenant_pages was read through _tenant_pages, which catches up the scheduler's lazy decode counts:
    a scrape from the server's thread wrote them while the engine stepped (RuntimeError "dictionary
    changed size during iteration" in 21 of the scrapes of 20 s; a count written onto a request just
    finished could make its stale row look live). A scrape now only reads, and matches the engine's
    own count."""
    m, sched, mover = busy()
    engine = TinyEngine(TinyDecoder(1, "fp16"), mover.pool, mover)
    plan = sched.step(100.0)
    sched.update(plan, engine.forward(plan))  # a fast (lazy) decode update: counts not caught up
    lazy = sched._lazy
    before = {r.rid: (r.computed, r.generated) for r in sched._running.values()}
    got = sched.tenant_pages()
    assert {r.rid: (r.computed, r.generated) for r in sched._running.values()} == before
    assert sched._lazy == lazy
    scrape(KVCoreCollector(m, scheduler=sched, tenant_labels=True))
    assert {r.rid: (r.computed, r.generated) for r in sched._running.values()} == before
    assert got == sched._tenant_pages()  # (which catches up first): the same counts


def test_scrapes_from_another_thread_while_the_engine_steps_never_fail() -> None:
    """The collector runs in the HTTP server's thread; the engine's thread meanwhile steps, submits
    and finishes requests of three tenants (ceilings on). No scrape may raise."""
    import random
    import sys
    import threading

    m = kvcore.KVCacheManager(64, 4)
    est = OutputLengthEstimator(0.5, min_samples=1)
    est.observe("default", 1)
    sched = Scheduler(
        m, max_num_batched_tokens=64, max_num_seqs=32, estimator=est, tenant_max_pages={"a": 30}
    )
    col = KVCoreCollector(m, scheduler=sched, tenant_labels=True)
    errors: list[BaseException] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.is_set():
            try:
                list(col.collect())
            except BaseException as e:  # any failure is the finding
                errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the race, often
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        rng = random.Random(0)
        rid = 0
        for step in range(1500):
            for _ in range(rng.randrange(0, 4)):
                prompt = [rng.randrange(64) for _ in range(rng.randrange(1, 30))]
                ns = rng.choice([None, "a", "b"])
                try:
                    sched.submit(
                        Request(rid, prompt, rng.choice([1, 3, 20]), namespace=ns, stop_token_ids={1}), step
                    )
                except kvcore.RequestRejected:
                    pass
                rid += 1
            plan = sched.step(step)
            toks = {int(r): rng.randrange(64) for r in plan.request_ids[plan.sample]}
            if plan.batch_size and rng.random() < 0.05:
                sched.finish(int(plan.request_ids[0]), "abort", step)
            sched.update(plan, toks)
    finally:
        done.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def test_serve_times_out_idle_connections_and_caps_them() -> None:
    """start_http_server kept a thread and a descriptor per connection for as long as the client held
    it: 258 half-sent requests exhausted an engine's 256 descriptors (its own files then failed with
    EMFILE). Connections over the cap are closed at once; an idle one is dropped after the timeout;
    a scrape is answered once a slot is free."""
    import socket
    import time

    from kvcore import metrics

    m = kvcore.KVCacheManager(16, 4)
    server = serve(0, KVCoreCollector(m))
    port = server.server_port
    held = []
    try:
        for _ in range(metrics.MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request
            held.append(s)
        time.sleep(0.5)  # every one taken by a thread
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        extra.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert extra.recv(100) == b""  # over the cap: closed, not queued
        extra.close()
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while True:  # the slots come back as their threads see the close
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    assert b"kvcore_pages" in resp.read()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        for s in held:
            s.close()
        server.shutdown()


def test_serve_drops_a_connection_that_sends_nothing(monkeypatch: Any, capfd: Any) -> None:
    import socket
    import time

    from kvcore import metrics

    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.5)
    server = serve(0, KVCoreCollector(kvcore.KVCacheManager(16, 4)))
    try:
        s = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
        s.sendall(b"GET /metrics HTT")  # and nothing more
        assert s.recv(100) == b""  # closed by the server after its timeout, not held
        s.close()
        time.sleep(0.2)
    finally:
        server.shutdown()
    assert "Traceback" not in capfd.readouterr().err  # a timed-out client is not an error to print


def test_serve_cuts_a_connection_that_trickles_at_its_deadline(monkeypatch: Any) -> None:
    """A byte every few seconds never meets a per-read timeout: 64 such clients held every slot,
    and every real scrape was refused, for as long as they went on. The deadline cuts each one."""
    import socket
    import time

    from kvcore import metrics

    monkeypatch.setattr(metrics._QuietHandler, "deadline_s", 1.0)
    server = serve(0, KVCoreCollector(kvcore.KVCacheManager(16, 4)))
    try:
        s = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
        t0 = time.monotonic()
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.2)  # well under the 10 s timeout
            s.setblocking(False)
            try:
                if s.recv(100) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
        assert closed and time.monotonic() - t0 < 5
        s.close()
    finally:
        server.shutdown()


def test_a_server_that_never_served_shuts_down() -> None:
    from kvcore.metrics import MetricsServer

    server = MetricsServer(("127.0.0.1", 0), __import__("socket").AF_INET)
    server.shutdown()  # waited forever on serve_forever's end before


def test_shutdown_frees_the_port_and_bad_ports_are_config_errors() -> None:
    """shutdown() only stopped serve_forever: the socket stayed open (clients hung, not refused) and
    serve() on the same port raised a builtin OSError (EADDRINUSE)."""
    import socket

    m = kvcore.KVCacheManager(16, 4)
    server = serve(0, KVCoreCollector(m))
    port = server.server_port
    server.shutdown()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        raise AssertionError("a stopped server still accepted a connection")
    except ConnectionRefusedError:
        pass
    again = serve(port, KVCoreCollector(m))  # the port is free again
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
        with pytest.raises(kvcore.ConfigError, match="cannot listen"):
            serve(port, KVCoreCollector(m))  # in use
    finally:
        again.shutdown()
    for bad in (-1, 70000, True, "9400", 1.5):
        with pytest.raises(kvcore.ConfigError, match="port"):
            serve(bad, KVCoreCollector(m))  # type: ignore[arg-type]
    with pytest.raises(kvcore.ConfigError, match="cannot listen"):
        serve(0, KVCoreCollector(m), addr="no-such-host.invalid")
