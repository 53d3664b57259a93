"""The shared store a multi-instance replay's remote tier stands for: which page keys some instance stored.

Why a store of keys only: a replay moves no bytes, but whether a page exists in the shared tier is the
whole question a lookup asks, and the answer must reflect what *every* instance stored before it (that is
what a shared tier buys). So the store keeps, per page key (16 bytes, from ``prompt_keys`` or a
``TransferBatch``), the instance that stored it first; a load asks for that value, as a real load reads
the page, and learns whether another instance computed it.

Two stores behind one interface (``add``, ``leading``, ``contains``, ``origins``, ``close``):

- :class:`MemoryStore` (``--remote memory``): a dict in this process, for tests and quick looks;
- :class:`RedisStore` (``--remote redis://HOST:PORT[/DB]``): a real Redis server through redis-py, a
  tiny value per key (``SET key <instance> NX``; the first store wins, as in a shared tier where
  a page's content is fixed by its key), lookups as one pipelined ``EXISTS`` per key, loads as one
  ``MGET``. Keys carry a per-run prefix, so runs on one server never see each other's pages, and
  :meth:`RedisStore.close` deletes them.

A server error raises :class:`ConnectionError` (an ``OSError``), which ``kvcore`` prints as one line.
"""

from __future__ import annotations

import uuid
from itertools import repeat, takewhile
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError

__all__ = ["REMOTE_SCHEMES", "MemoryStore", "RedisStore", "SharedStore", "check_store", "open_store"]

#: URL schemes of ``--remote`` besides ``memory`` (redis-py's own: TCP, TLS, a Unix socket).
REMOTE_SCHEMES = ("redis", "rediss", "unix")

_Keys = npt.NDArray[np.uint8]  # [n, 16] page keys, a prompt's in order where the order matters


def _rows(keys: _Keys) -> list[bytes]:
    """The 16-byte keys of ``keys`` ([n, 16] uint8), as bytes (one C loop: a 16-byte void view)."""
    rows: list[bytes] = np.ascontiguousarray(keys, dtype=np.uint8).view("V16").ravel().tolist()
    return rows


class SharedStore(Protocol):
    """What the replay needs of a shared tier's store."""

    name: str  # "memory" or the URL, for reports (never a password)

    def add(self, keys: _Keys, origin: int) -> None:
        """Record ``keys`` ([n, 16] uint8) as stored by instance ``origin`` (kept if already there)."""

    def leading(self, keys: _Keys) -> int:
        """How many leading keys of ``keys`` ([n, 16] uint8, in prompt order) the store holds."""

    def contains(self, keys: _Keys) -> npt.NDArray[np.bool_]:
        """``[n]`` bool: whether the store holds each key."""

    def origins(self, keys: _Keys) -> npt.NDArray[np.int32]:
        """``[n]`` int32: the instance that stored each key first, or -1 where it is absent."""

    def __len__(self) -> int:
        """Keys held."""

    def close(self) -> None:
        """Release the store (a Redis store deletes its run's keys)."""


class MemoryStore:
    """The shared store as a dict in this process: page key -> first instance that stored it."""

    name = "memory"

    def __init__(self) -> None:
        self._origin: dict[bytes, int] = {}

    def add(self, keys: _Keys, origin: int) -> None:
        # Set operations, not a loop: a write-through replay adds millions of keys.
        new = set(_rows(keys)).difference(self._origin)
        self._origin.update(dict.fromkeys(new, origin))

    def leading(self, keys: _Keys) -> int:
        return sum(1 for _ in takewhile(self._origin.__contains__, _rows(keys)))

    def origins(self, keys: _Keys) -> npt.NDArray[np.int32]:
        found = list(map(self._origin.get, _rows(keys), repeat(-1)))
        return np.array(found, dtype=np.int32).reshape(len(found))

    def contains(self, keys: _Keys) -> npt.NDArray[np.bool_]:
        return self.origins(keys) >= 0

    def __len__(self) -> int:
        return len(self._origin)

    def close(self) -> None:
        self._origin.clear()


class RedisStore:
    """The shared store on a Redis server: ``prefix + key`` -> the first instance that stored it.

    Raises (at construction):
        ConfigError: redis-py is not installed, or ``url`` does not parse (:func:`check_store`).
        ConnectionError: the server does not answer a ``PING``.
    """

    def __init__(self, url: str, *, prefix: str | None = None, timeout_s: float = 10.0) -> None:
        try:
            import redis
        except ImportError:
            raise ConfigError(
                f"--remote {url}: needs the redis package (pip install 'kvcore[remote]')"
            ) from None
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError,)
        self.name = _url_name(url)  # the URL without user or password, for reports
        self.prefix = (prefix if prefix is not None else f"kvcore-replay:{uuid.uuid4().hex}:").encode()
        self._count = 0  # keys this run added (SET NX answered OK)
        try:
            self._r: Any = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
            self._r.ping()
        except self._errors as exc:
            raise ConnectionError(f"--remote {self.name}: {exc}") from None
        except ValueError as exc:  # redis-py's answer to a malformed URL
            raise ConfigError(f"--remote: {exc}") from None

    def _names(self, keys: _Keys) -> list[bytes]:
        p = self.prefix
        return [p + k for k in _rows(keys)]

    def _run(self, what: str, call: Any) -> Any:
        try:
            return call()
        except self._errors as exc:
            raise ConnectionError(f"remote store {self.name}: {what}: {exc}") from None

    def add(self, keys: _Keys, origin: int) -> None:
        names = self._names(keys)
        if not names:
            return
        value = str(origin).encode()

        def call() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.set(name, value, nx=True)
            return list(pipe.execute())

        self._count += sum(1 for ok in self._run("SET", call) if ok)

    def leading(self, keys: _Keys) -> int:
        names = self._names(keys)
        if not names:
            return 0

        def call() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            return list(pipe.execute())

        n = 0
        for found in self._run("EXISTS", call):
            if not found:
                break
            n += 1
        return n

    def origins(self, keys: _Keys) -> npt.NDArray[np.int32]:
        names = self._names(keys)
        if not names:
            return np.zeros(0, dtype=np.int32)
        values = self._run("MGET", lambda: self._r.mget(names))
        return np.array([-1 if v is None else int(v) for v in values], dtype=np.int32)

    def contains(self, keys: _Keys) -> npt.NDArray[np.bool_]:
        return self.origins(keys) >= 0

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        """Delete this run's keys (a ``SCAN`` over the prefix) and disconnect."""

        def call() -> None:
            batch: list[bytes] = []
            for name in self._r.scan_iter(match=self.prefix + b"*", count=1000):
                batch.append(name)
                if len(batch) >= 1000:
                    self._r.unlink(*batch)
                    batch.clear()
            if batch:
                self._r.unlink(*batch)

        try:
            self._run("cleanup", call)
        finally:
            self._r.close()


def _url_name(url: str) -> str:
    """``url`` without user or password (what reports show), once its parts parse.

    Raises:
        ConfigError: a URL ``urlsplit`` cannot take apart (``redis://[::1``), a port that is not a number
            in ``[1, 65535]`` (``redis://h:99999``, ``redis://h:0``), or a ``unix://`` URL without a path.
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # an unclosed IPv6 bracket, a port out of range or not a number
        raise ConfigError(f"--remote: {url[:80]!r} is not a valid URL ({exc})") from None
    if port == 0:
        raise ConfigError(f"--remote: {url[:80]!r}: the port must be in [1, 65535]")
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"--remote: {url[:80]!r}: a unix:// URL needs the socket's path (unix:///path)")
    if host is not None and ":" in host:
        host = f"[{host}]"  # an IPv6 address, bracketed again
    return f"{parts.scheme}://{host or ''}{f':{port}' if port else ''}{parts.path}"


def check_store(spec: str) -> str:
    """The kind of store ``--remote`` names, ``"memory"`` or a URL scheme of :data:`REMOTE_SCHEMES`,
    without connecting: a URL's host and port are parsed here, so a malformed one is refused before the
    trace is read.

    Raises:
        ConfigError: anything else, or a URL that does not parse (see :func:`_url_name`).
    """
    if spec == "memory":
        return spec
    scheme = spec.split("://", 1)[0] if "://" in spec else ""
    if scheme not in REMOTE_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in REMOTE_SCHEMES)
        raise ConfigError(f"--remote: expected memory or a URL {schemes}, got {spec[:80]!r}")
    _url_name(spec)
    return scheme


def open_store(spec: str) -> SharedStore:
    """The store ``--remote`` names: ``memory``, or a Redis URL (``redis://``, ``rediss://``, ``unix://``).

    Raises:
        ConfigError: another scheme, or no redis package.
        ConnectionError: the Redis server does not answer.
    """
    if check_store(spec) == "memory":
        return MemoryStore()
    return RedisStore(spec)
