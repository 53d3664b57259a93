"""kvcore's Rust RESP client (``kvcore._kvcore.RespClient``) against real servers: a standalone one and a
3-node cluster, plus disposable ones killed, paused and filled for the failure paths."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvcore import InvalidArgumentError
from kvcore._kvcore import RespClient


def address(url: str) -> str:
    return url.removeprefix("redis://").split("/")[0]


def values(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size), dtype=np.uint8)


def test_round_trip_nx_px_missing_and_wrong_length(redis_url: str, redis_prefix: str) -> None:
    c = RespClient([address(redis_url)], timeout_s=2.0)
    keys = [f"{redis_prefix}{i}".encode() for i in range(20)]
    vals = values(20, 70_000)
    status, errors = c.set_many(keys, vals, nx=True, px_ms=60_000)
    assert status.tolist() == [1] * 20 and errors == [None] * 20
    # NX: the second store of a key does not rewrite it.
    status, _ = c.set_many(keys[:2], values(2, 70_000, seed=1), nx=True)
    assert status.tolist() == [0, 0]
    out = np.zeros_like(vals)
    status, _ = c.get_into(keys, out)
    assert status.tolist() == [1] * 20 and (out == vals).all()
    small = np.zeros((2, 8), np.uint8)
    status, errors = c.get_into([keys[0], f"{redis_prefix}missing".encode()], small)
    assert status.tolist() == [2, 0] and "70000" in errors[0] and not small.any()
    assert c.exists_many([*keys[:2], b"nope"])[0].tolist() == [1, 1, 0]
    assert c.del_many(keys[:1])[0].tolist() == [1]
    assert c.exists_many(keys[:1])[0].tolist() == [0]
    import redis

    assert 0 < redis.Redis.from_url(redis_url).pttl(keys[1]) <= 60_000


def test_zero_width_values_round_trip(redis_url: str, redis_prefix: str) -> None:
    """``[n, 0]`` rows (empty values): stored, read back as found, a longer value reported as of
    another length; it used to panic (``chunks_exact_mut(0)``) out of ``get_into``."""
    c = RespClient([address(redis_url)], timeout_s=2.0)
    empty, long, missing = (f"{redis_prefix}{k}".encode() for k in ("empty", "long", "missing"))
    assert c.set_many([empty], np.zeros((1, 0), np.uint8), nx=False)[0].tolist() == [1]
    assert c.set_many([long], values(1, 5), nx=False)[0].tolist() == [1]
    status, errors = c.get_into([empty, long, missing], np.zeros((3, 0), np.uint8))
    assert status.tolist() == [1, 2, 0] and errors[0] is None and "5" in errors[1]
    assert c.exists_many([empty])[0].tolist() == [1]  # the client is still usable


def test_a_cluster_routes_every_key_to_its_node(redis_cluster_nodes: list[str], redis_prefix: str) -> None:
    import redis.cluster

    c = RespClient(redis_cluster_nodes, cluster=True, timeout_s=2.0)
    keys = [f"{redis_prefix}{i}".encode() for i in range(64)]
    vals = values(64, 4096)
    assert (c.set_many(keys, vals, nx=False)[0] == 1).all()
    out = np.zeros_like(vals)
    assert (c.get_into(keys, out)[0] == 1).all() and (out == vals).all()
    rc = redis.cluster.RedisCluster(
        host=redis_cluster_nodes[0].split(":")[0], port=int(redis_cluster_nodes[0].split(":")[1])
    )
    nodes = {rc.get_node_from_key(k).name for k in keys}
    assert len(nodes) == 3  # the keys really were spread over the nodes
    assert rc.get(keys[5]) == vals[5].tobytes()


def test_a_killed_server_fails_fast_and_a_restarted_one_is_reached_again(private_redis) -> None:  # type: ignore[no-untyped-def]
    c = RespClient([private_redis.address], timeout_s=0.3)
    keys = [b"k1", b"k2"]
    assert (c.set_many(keys, values(2, 100), nx=False)[0] == 1).all()
    private_redis.kill()
    t = time.perf_counter()
    status, errors = c.get_into(keys, np.zeros((2, 100), np.uint8))
    assert (status == -2).all() and all(e.startswith(("connection", "timeout")) for e in errors)
    assert time.perf_counter() - t < 1.0
    private_redis.restart()
    assert (c.set_many(keys, values(2, 100), nx=False)[0] == 1).all()  # reconnected by itself


def test_a_paused_server_is_a_timeout_within_the_deadline(private_redis) -> None:  # type: ignore[no-untyped-def]
    c = RespClient([private_redis.address], timeout_s=0.2)
    assert c.set_many([b"k"], values(1, 10), nx=False)[0].tolist() == [1]
    private_redis.cli("CLIENT", "PAUSE", "1500", "ALL")
    t = time.perf_counter()
    status, errors = c.get_into([b"k"], np.zeros((1, 10), np.uint8))
    assert status.tolist() == [-2] and errors == ["timeout"]
    assert time.perf_counter() - t < 0.6


def test_maxmemory_refuses_with_oom(private_redis) -> None:  # type: ignore[no-untyped-def]
    private_redis.stop()
    private_redis.start(extra_args=["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"])
    c = RespClient([private_redis.address], timeout_s=1.0)
    status, errors = c.set_many([b"big1", b"big2"], values(2, 1 << 20), nx=False)
    assert -1 in status.tolist() and any(e and e.startswith("OOM") for e in errors)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        RespClient([], timeout_s=1.0)
    with pytest.raises(InvalidArgumentError):
        RespClient(["127.0.0.1:1", "127.0.0.1:2"], timeout_s=1.0)
    with pytest.raises(InvalidArgumentError):
        RespClient(["127.0.0.1:1"], timeout_s=0.0)


def test_a_dead_masters_slots_served_elsewhere_are_found_on_the_next_call() -> None:
    """A master is killed and its slots go to another node (a replica's promotion): the client
    re-read the slot map only on a MOVED, which a dead node never sends, so those keys failed on
    every call for good (review)."""
    import redis
    from redis_servers import RedisClusterServers, require_redis_py, require_redis_server

    require_redis_server()
    require_redis_py()
    with RedisClusterServers(3) as cluster:
        c = RespClient(cluster.addresses, cluster=True, timeout_s=1.0)
        keys = [f"failover-{i}".encode() for i in range(60)]
        vals = values(60, 64)
        assert (c.set_many(keys, vals, nx=False)[0] == 1).all()
        nodes = [redis.Redis(host="127.0.0.1", port=int(a.split(":")[1])) for a in cluster.addresses]
        port0 = int(cluster.addresses[0].split(":")[1])
        mine = [(int(r[0]), int(r[1])) for r in nodes[0].execute_command("CLUSTER SLOTS") if r[2][1] == port0]
        new_owner = nodes[1].execute_command("CLUSTER MYID").decode()
        cluster.kill_node(0)
        for node in nodes[1:]:  # node 1 takes node 0's slots, as a promoted replica would
            p = node.pipeline(transaction=False)
            for lo, hi in mine:
                for s in range(lo, hi + 1):
                    p.execute_command("CLUSTER SETSLOT", s, "NODE", new_owner)
            p.execute()
        moved = [
            i
            for i, k in enumerate(keys)
            if any(lo <= nodes[1].cluster("KEYSLOT", k) <= hi for lo, hi in mine)
        ]
        assert moved
        for i in moved:  # the replica's copy of the data
            nodes[1].set(keys[i], vals[i].tobytes())
        out = np.zeros_like(vals)
        status, _ = c.get_into(keys, out)
        assert (status[moved] != 1).all()  # this call meets the dead node
        out = np.zeros_like(vals)
        status, _ = c.get_into(keys, out)  # the next one uses the map as it is now
        assert (status == 1).all() and (out == vals).all()
