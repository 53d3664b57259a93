"""Real Redis servers for the remote tier's tests: the shared ones CI starts, or private ones started here.

Why real servers: the remote tier's failure modes (a server killed mid-run, ``OOM`` under
``--maxmemory ... noeviction``, ``CLIENT PAUSE``, a cluster node down, ``MOVED``) are the server's own
behaviour, which a fake would only guess at.

Where the servers come from, for the session fixtures:

* ``KVCORE_REDIS_URL`` (``redis://127.0.0.1:PORT``) and ``KVCORE_REDIS_CLUSTER``
  (``127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``): servers someone else runs (``.ci/run`` starts them).
  The fixtures FLUSHALL them once per session, so only 127.0.0.1 is accepted; any other host is refused.
* otherwise, with ``redis-server`` on PATH: private servers, started on free ports in a temporary
  directory and stopped at the end of the session;
* otherwise the tests skip, unless ``KVCORE_REQUIRE_REDIS=1`` (CI), where they fail instead.

Every server started here listens on 127.0.0.1 only, keeps nothing on disk (``--save '' --appendonly no``)
and, on Linux, dies with the process that started it (``PR_SET_PDEATHSIG``) even if pytest is killed.
Tests sharing ``redis_url`` keep apart through ``redis_prefix``; fault tests take their own disposable
server (``private_redis``) or cluster (``private_cluster``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest

HOST = "127.0.0.1"
# Client ports are drawn from [17000, 22000): below Linux's ephemeral range (32768+), so outgoing
# connections do not take them, and with room for the cluster bus port (client port + 10000).
PORT_BASE, PORT_SPAN, CLUSTER_BUS_OFFSET = 17000, 5000, 10000
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
CLUSTER_NODE_TIMEOUT_MS = 1000  # private clusters: a stopped node is marked failed after about this long

_unclosed: set[RedisServer] = set()  # created and not yet closed: atexit closes what a test forgot


def redis_required() -> bool:
    """CI sets ``KVCORE_REQUIRE_REDIS=1``: missing Redis then fails the test instead of skipping it."""
    return os.environ.get("KVCORE_REQUIRE_REDIS") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it where Redis is required."""
    if redis_required():
        pytest.fail(f"{reason} (KVCORE_REQUIRE_REDIS=1, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def require_redis_server() -> None:
    """Skip or fail unless redis-server, redis-cli and the redis package are all here."""
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            unavailable(f"needs {binary} on PATH (Debian: apt-get install redis-server)")
    require_redis_py()


def require_redis_py() -> None:
    try:
        import redis  # noqa: F401
    except ImportError:
        unavailable("needs the redis package (pip install -e '.[test]')")


def loopback_port(address: str, what: str) -> int:
    """The port of ``127.0.0.1:PORT``; any other host is refused, since the fixtures FLUSHALL it."""
    host, sep, port = address.rpartition(":")
    if host != HOST or not sep or not port.isdigit():
        raise ValueError(
            f"{what}={address!r}: the Redis test fixtures only use servers on {HOST}:PORT, "
            "because they FLUSHALL them; point it at a disposable local server"
        )
    return int(port)


def url_port(url: str, what: str) -> int:
    """The port of ``redis://127.0.0.1:PORT[/DB]``; other schemes and hosts are refused."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or parts.hostname != HOST or parts.port is None:
        raise ValueError(
            f"{what}={url!r}: the Redis test fixtures only use redis://{HOST}:PORT, "
            "because they FLUSHALL the server; point it at a disposable local server"
        )
    return parts.port


def port_is_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 now (a hint: someone may take it before the server)."""
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_port(*, cluster: bool = False) -> int:
    """A client port free now, with its cluster bus port free as well when ``cluster``."""
    for _ in range(200):
        port = PORT_BASE + random.randrange(PORT_SPAN)
        if port_is_free(port) and (not cluster or port_is_free(port + CLUSTER_BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free port in [{PORT_BASE}, {PORT_BASE + PORT_SPAN}) on {HOST}")


def _die_with_parent_hook() -> Any:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when the thread that started it ends.

    So no server outlives pytest, even killed with SIGKILL. Start servers from a thread that outlives
    them (pytest's main thread does). None elsewhere than Linux.
    """
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def no_retry() -> Any:
    """For clients of servers that tests kill: fail at once, not after redis-py's seconds of backoff."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def _client(port: int, **kwargs: Any) -> Any:
    import redis

    kwargs = {"socket_timeout": 2, "socket_connect_timeout": 2, "retry": no_retry(), **kwargs}
    return redis.Redis(host=HOST, port=port, **kwargs)


def _flushall(client: Any) -> None:
    """FLUSHALL, a replica excepted (it refuses writes; its master's flush reaches it)."""
    with contextlib.closing(client):
        if client.info("replication").get("role") != "slave":
            client.flushall()


def _cluster_state(port: int) -> str:
    """``cluster_state`` (``ok`` / ``fail``) of the node at 127.0.0.1:port."""
    with contextlib.closing(_client(port, decode_responses=True)) as client:
        info = str(client.execute_command("CLUSTER", "INFO"))
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return fields.get("cluster_state", "").strip()


class RedisServer:
    """One redis-server process owned by this test process, on 127.0.0.1, in its own temporary directory.

    ``start`` picks a free port unless given one and returns once this very process answers (its
    ``INFO`` ``process_id``, not just anything on the port). ``stop`` / ``kill`` end the process but keep
    the directory, so ``restart`` comes back on the same port with the same arguments (a cluster node
    keeps its ``nodes.conf``, so it rejoins); ``close`` stops and removes the directory.
    """

    def __init__(self, *, cluster: bool = False) -> None:
        self.cluster = cluster  # --cluster-enabled yes, and the bus port (port + 10000) must be free too
        self.port: int | None = None  # fixed by the first successful start, kept across restarts
        self.extra_args: tuple[str, ...] = ()  # given to start, kept for restart
        self.dir = Path(tempfile.mkdtemp(prefix="kvcore-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None
        _unclosed.add(self)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port()}"

    @property
    def address(self) -> str:
        return f"{HOST}:{self._port()}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, port: int | None = None, extra_args: Sequence[str] = ()) -> RedisServer:
        """Start the server: on ``port``, else on a free port (another is tried if it is taken first)."""
        if self.running:
            raise RuntimeError(f"redis-server already running on {self.address}")
        self.extra_args = tuple(extra_args)
        if port is not None:
            self._spawn(port)
            return self
        attempts = 10
        for attempt in range(attempts):
            try:
                self._spawn(pick_port(cluster=self.cluster))
                return self
            except RuntimeError as exc:  # most likely lost a race for the port: another one
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"redis-server did not start in {attempts} tries; last: {exc}"
                    ) from None
        raise AssertionError("unreachable")

    def restart(self) -> RedisServer:
        """Stop if running, then start again on the same port with the same arguments."""
        self.stop()
        return self.start(self._port(), self.extra_args)

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after a few seconds). Idempotent."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL and wait: the server vanishes mid-whatever, as in a crash."""
        self._end(signal.SIGKILL)

    def close(self) -> None:
        """Stop and remove the temporary directory. Idempotent."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        _unclosed.discard(self)

    def cli(self, *args: str, check: bool = True) -> str:
        """``redis-cli -h 127.0.0.1 -p PORT ARGS...``; its output, stripped. Raises on a nonzero exit."""
        done = subprocess.run(
            ["redis-cli", "-h", HOST, "-p", str(self._port()), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} on {self.address}: {done.stderr or done.stdout}")
        return done.stdout.strip()

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.Redis`` on this server that does not retry (close it, or use it in a ``with``)."""
        return _client(self._port(), **kwargs)

    def flushall(self) -> None:
        _flushall(self.client())

    def log(self) -> str:
        """The server's log and what it printed itself (config errors come before the log opens)."""
        text = []
        for name in ("stdout.log", "redis.log"):
            with contextlib.suppress(OSError):
                text.append((self.dir / name).read_text(errors="replace"))
        return "".join(text)

    def __enter__(self) -> RedisServer:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"RedisServer({HOST}:{self.port}, {state})"

    def _port(self) -> int:
        if self.port is None:
            raise RuntimeError("RedisServer not started yet")
        return self.port

    def _spawn(self, port: int) -> None:
        args = ["redis-server", "--port", str(port), "--bind", HOST, "--protected-mode", "yes"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.dir), "--logfile", "redis.log"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)]
        args += self.extra_args
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                args,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent_hook(),
            )
        self._proc = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if self._answers_as(proc.pid, port):
                self.port = port
                return
            time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"redis-server on port {port} did not come up; its log:\n{self.log()[-2000:]}")

    @staticmethod
    def _answers_as(pid: int, port: int) -> bool:
        import redis

        try:
            with contextlib.closing(_client(port)) as client:
                return bool(client.ping()) and client.info("server").get("process_id") == pid
        except redis.RedisError:  # not listening yet, or still loading
            return False

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisClusterServers:
    """A private Redis Cluster: ``num_nodes`` masters, no replicas, every slot assigned.

    Each of ``nodes`` is a plain :class:`RedisServer`. ``stop_node(i)`` / ``kill_node(i)`` take one down
    (after ``CLUSTER_NODE_TIMEOUT_MS`` the others mark it failed and, full coverage lost, answer
    ``CLUSTERDOWN``); ``restart_node(i)`` brings it back with its ``nodes.conf``, and it rejoins.
    """

    def __init__(self, num_nodes: int = 3) -> None:
        self.nodes = [RedisServer(cluster=True) for _ in range(num_nodes)]

    @property
    def addresses(self) -> list[str]:
        """``["127.0.0.1:PORT", ...]``, as ``KVCORE_REDIS_CLUSTER`` lists them."""
        return [node.address for node in self.nodes]

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            create = ["redis-cli", "--cluster", "create", *self.addresses, "--cluster-replicas", "0"]
            done = subprocess.run(
                [*create, "--cluster-yes"], capture_output=True, text=True, timeout=60, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
            self.wait_state("ok")
        except BaseException:
            self.close()
            raise
        return self

    def stop_node(self, i: int) -> None:
        self.nodes[i].stop()

    def kill_node(self, i: int) -> None:
        self.nodes[i].kill()

    def restart_node(self, i: int) -> None:
        self.nodes[i].restart()

    def state(self, i: int) -> str:
        """``cluster_state`` as node ``i`` sees it: ``ok`` or ``fail``."""
        return _cluster_state(self.nodes[i]._port())

    def wait_state(self, expected: str, timeout_s: float = 30.0) -> None:
        """Until every running node reports ``cluster_state:expected``."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {node.address: self.state(i) for i, node in enumerate(self.nodes) if node.running}
            if all(s == expected for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster never reached cluster_state:{expected}: {states}")
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _stop_forgotten() -> None:
    for server in list(_unclosed):
        server.close()


def _env_cluster() -> list[str] | None:
    value = os.environ.get("KVCORE_REDIS_CLUSTER", "").strip()
    if not value:
        return None
    nodes = [node.strip() for node in value.split(",") if node.strip()]
    for node in nodes:
        loopback_port(node, "KVCORE_REDIS_CLUSTER")
    return nodes


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a standalone server shared by the session, flushed at its start.

    ``KVCORE_REDIS_URL`` if set (only on 127.0.0.1; refused otherwise), else a private server; tests
    keep their keys apart with ``redis_prefix``.
    """
    url = os.environ.get("KVCORE_REDIS_URL", "").strip()
    if url:
        url_port(url, "KVCORE_REDIS_URL")
        require_redis_py()
        import redis

        try:
            _flushall(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2, retry=no_retry()))
        except Exception as exc:
            pytest.fail(f"KVCORE_REDIS_URL={url} does not answer: {exc}", pytrace=False)
        yield url
        return
    require_redis_server()
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster_nodes() -> Iterator[list[str]]:
    """``["127.0.0.1:P1", ...]``: a Redis Cluster shared by the session, every node flushed at its start.

    ``KVCORE_REDIS_CLUSTER`` if set (only 127.0.0.1 nodes; refused otherwise), else a private 3-node one.
    """
    nodes = _env_cluster()
    if nodes:
        require_redis_py()
        for node in nodes:
            try:
                port = loopback_port(node, "KVCORE_REDIS_CLUSTER")
                _flushall(_client(port))
                if _cluster_state(port) != "ok":
                    raise RuntimeError("cluster_state is not ok")
            except Exception as exc:
                pytest.fail(f"KVCORE_REDIS_CLUSTER node {node} does not answer: {exc}", pytrace=False)
        yield nodes
        return
    require_redis_server()
    with RedisClusterServers() as cluster:
        yield cluster.addresses


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test uses (``kvtest:<uuid4 hex>:``), for tests sharing a server.

    No hash tag (``{...}``): on the cluster, keys under one prefix still spread over every slot.
    """
    return f"kvtest:{uuid.uuid4().hex}:"


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A fresh, empty server of this test's own, to kill, restart, pause or fill; closed at teardown."""
    require_redis_server()
    with RedisServer() as server:
        yield server


@pytest.fixture
def private_cluster() -> Iterator[RedisClusterServers]:
    """A fresh 3-node cluster of this test's own (``stop_node`` for "a node down"); closed at teardown."""
    require_redis_server()
    with RedisClusterServers() as cluster:
        yield cluster
