"""The Redis fixtures themselves: real servers that answer, keep nothing, die and come back on demand."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import pytest
from redis_servers import (
    RedisClusterServers,
    RedisServer,
    loopback_port,
    no_retry,
    require_redis_server,
    unavailable,
    url_port,
)

redis = pytest.importorskip("redis")
from redis.cluster import ClusterNode, RedisCluster  # noqa: E402

_seen_prefixes: set[str] = set()


def cluster_client(addresses: list[str]) -> RedisCluster:
    nodes = [ClusterNode(host, int(port)) for host, port in (a.rsplit(":", 1) for a in addresses)]
    return RedisCluster(startup_nodes=nodes, socket_timeout=2, socket_connect_timeout=2, retry=no_retry())


def test_standalone_set_get(redis_url: str, redis_prefix: str) -> None:
    if os.environ.get("KVCORE_REDIS_URL"):
        assert redis_url == os.environ["KVCORE_REDIS_URL"].strip()
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        assert client.ping() is True
        value = os.urandom(4096)
        assert client.set(redis_prefix + "page", value) is True
        assert client.get(redis_prefix + "page") == value
        assert client.get(redis_prefix + "absent") is None


@pytest.mark.parametrize("run", range(3))
def test_prefix_is_unique_per_test(redis_prefix: str, run: int) -> None:
    assert redis_prefix.startswith("kvtest:") and redis_prefix.endswith(":")
    assert "{" not in redis_prefix  # no hash tag: a prefix must not pin keys to one cluster slot
    assert redis_prefix not in _seen_prefixes
    _seen_prefixes.add(redis_prefix)


def test_cluster_spreads_keys_over_every_node(redis_cluster_nodes: list[str], redis_prefix: str) -> None:
    assert len(redis_cluster_nodes) == 3
    with contextlib.closing(cluster_client(redis_cluster_nodes)) as client:
        assert len(client.get_primaries()) == 3
        keys = [f"{redis_prefix}{i}" for i in range(64)]
        for i, key in enumerate(keys):
            assert client.set(key, i.to_bytes(2, "little")) is True
        assert [client.get(key) for key in keys] == [i.to_bytes(2, "little") for i in range(64)]
        owners = {client.get_node_from_key(key).name for key in keys}
    assert owners == set(redis_cluster_nodes)


def test_killed_server_restarts_on_its_port_empty(private_redis: RedisServer) -> None:
    port, pid = private_redis.port, private_redis.pid
    with contextlib.closing(private_redis.client()) as client:
        client.set("k", b"v")
        private_redis.kill()
        assert not private_redis.running
        with pytest.raises(redis.ConnectionError):
            client.ping()
        private_redis.restart()
        assert private_redis.port == port and private_redis.pid != pid
        assert client.ping() is True  # the same client reconnects
        assert client.get("k") is None  # nothing persisted across the crash
    assert private_redis.cli("PING") == "PONG"


def test_noeviction_refuses_a_big_set_with_oom() -> None:
    require_redis_server()
    args = ["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]
    with RedisServer().start(extra_args=args) as server, contextlib.closing(server.client()) as client:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("big", b"x" * (2 << 20))
        assert client.exists("big") == 0
        assert client.ping() is True  # refused, not dead


def test_client_pause_holds_writes(private_redis: RedisServer) -> None:
    with contextlib.closing(private_redis.client()) as client:
        assert private_redis.cli("CLIENT", "PAUSE", "300", "WRITE") == "OK"
        start = time.monotonic()
        client.set("k", b"v")
        assert time.monotonic() - start >= 0.25
        assert client.get("k") == b"v"


def test_cluster_with_a_node_down(private_cluster: RedisClusterServers) -> None:
    with contextlib.closing(cluster_client(private_cluster.addresses)) as client:
        client.set("k", b"v")
        private_cluster.stop_node(0)
        private_cluster.wait_state("fail")  # the two left lose full slot coverage
        with pytest.raises(redis.RedisError):
            client.get("k")
        private_cluster.restart_node(0)
        private_cluster.wait_state("ok")  # it rejoins from its nodes.conf
    with contextlib.closing(cluster_client(private_cluster.addresses)) as client:
        assert client.set("k", b"w") is True and client.get("k") == b"w"


def test_servers_die_with_the_thread_that_started_them() -> None:
    """PR_SET_PDEATHSIG: a server started from a thread that ends goes with it, so none outlives pytest."""
    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    require_redis_server()
    started: list[RedisServer] = []
    thread = threading.Thread(target=lambda: started.append(RedisServer().start()))
    thread.start()
    thread.join()
    server = started[0]
    try:
        deadline = time.monotonic() + 5
        while server.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.running
    finally:
        server.close()


def test_only_loopback_is_accepted() -> None:
    assert url_port("redis://127.0.0.1:6379", "X") == 6379
    assert url_port("redis://127.0.0.1:6379/2", "X") == 6379
    assert loopback_port("127.0.0.1:7000", "X") == 7000
    for url in (
        "redis://10.0.0.5:6379",
        "redis://localhost:6379",
        "rediss://127.0.0.1:6379",
        "redis://127.0.0.1",
    ):
        with pytest.raises(ValueError, match="only use"):
            url_port(url, "KVCORE_REDIS_URL")
    for node in ("0.0.0.0:7000", "redis.example:7000", "127.0.0.1", "127.0.0.1:x"):
        with pytest.raises(ValueError, match="only use"):
            loopback_port(node, "KVCORE_REDIS_CLUSTER")


def test_missing_redis_skips_or_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVCORE_REQUIRE_REDIS", raising=False)
    with pytest.raises(pytest.skip.Exception):
        unavailable("needs redis-server")
    monkeypatch.setenv("KVCORE_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception, match="instead of skipping"):
        unavailable("needs redis-server")
