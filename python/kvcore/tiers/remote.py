"""The remote tier: pages in Redis (or Valkey, or a Redis Cluster), one self-describing value per page.

Why a remote tier at all: it outlives the process and is shared by every instance that can reach it,
so a prompt one instance computed is a load, not a recompute, for the others (``Mover.lookup`` asks
:meth:`RedisTier.exists` before an admission). What the projects before it got wrong, and what this
module does instead (see ``research/tiers.md`` sections 2, 3 and 8):

- **Identity.** The Redis key is ``{prefix}:{geometry tag}:{page key hex}``. The 16-byte page key
  already chains the namespace and the cache fingerprint (so no tenant finds another's pages, unlike
  sglang#26747); the tag (8 hex digits of XXH3-128 over the format version, geometry, dtype, layout
  and quantization) keeps pools of another shape from ever meeting the same key.
- **Integrity.** A value is the disk tier's header (magic, version, key echo, parent key, namespace,
  tokens, geometry, payload length, XXH3-128 of the payload, the fp8/int8 scale digest and the
  header's own checksum; :mod:`kvcore.tiers.codec`) followed by the payload; never pickle. A load
  checks all of it; a value that fails its header or payload checksum is a miss, counted, and
  deleted (LMCache#4991: corrupt values that stayed visible).
- **Atomicity.** One ``SET key value NX [PX ttl]`` per page: Redis applies a command whole, so a
  half-written value is never visible; with NX an existing value (another instance stored the same
  page, whose key fixes its bytes) is left alone and counts as stored. Except for fp8/int8 pools,
  whose bytes mean ``x / scale``: there the key does not fix the value (an instance with other pool
  scales stores other bytes under it), so each SET is followed, in the same pipeline, by a
  ``GETRANGE`` of the value's scale digest, and a value found there under other scales is not
  counted as stored (``store_failed_scales``; it is left alone, for the instances it belongs to).
- **Deadlines.** Every socket wait is bounded by ``timeout_s``, a whole exchange with one server
  by ``timeout_s`` times 2 plus one per 64 MiB, and a ``CLUSTER SLOTS`` read by ``timeout_s`` times 2
  whichever nodes it tries; a timeout is a miss (False) and a counter, never a hang (LMCache#4123,
  #1491). The exchanges of one call with several servers run at once, so a call waits on its slowest
  server, not on the sum of them, and its time does not grow with the number of nodes (the bound is
  in :class:`RedisTier`'s ``timeout_s``): store and load run them in the caller's thread and worker
  threads of the tier's own (up to 64 servers at once); exists sends to every server, then reads
  the replies in the order they come (``poll``), connecting at once (threads) where it must. After
  ``down_after`` consecutive failed calls a server is *down* for ``backoff_s``: its rows fail at
  once without touching the network, so a scheduler never waits on a dead server; then the next
  call tries again and reconnects by itself.
- **Cluster.** Keys are spread by page key (no hash tags: a prefix on one node would make it hot);
  each call sends one pipeline per node; no multi-key command ever crosses slots. The nodes known
  are exactly the masters of the last ``CLUSTER SLOTS`` table (at most :data:`MAX_NODES`; a node
  that leaves the table is closed and forgotten), and a reply that does not parse as one (a bad
  range, host or port, an oversized value) fails the refresh like a lost connection. A ``MOVED``
  reply to a node of the table points the slot there and the row is retried once; one to any other
  address fails the row (nothing is connected to an address the table does not list); either way
  the full map is re-read on the next call. An ``ASK`` reply (a slot being migrated, its key not on
  the node asked) to a node of the table sends the row there once more, after ``ASKING``, leaving the
  map as it is (the Redis Cluster specification's client rules); one to any other address, an ``ASK``
  after that, or a plain server's fails the row (``*_failed_other``). A table that leaves slots
  without a master (a failover in progress, unassigned slots) is used for the slots it covers; a
  row of an uncovered slot fails at once (``*_failed_other``, as the ``-CLUSTERDOWN`` a node would
  answer: no connection is involved) and the map is re-read at the next call, backing off like a
  failed read (for ``backoff_s`` after ``down_after`` incomplete or failed reads in a row; rows then
  count as ``*_failed_down``). A plain ``redis://`` server is not a cluster: a ``MOVED`` or ``ASK``
  from it fails the row and is never followed.
- **Memory.** A connection's read buffer (1 MiB for store/load, 64 KiB for lookups) is allocated
  when it connects and freed when it is closed or lost: a cluster node that refuses connections
  holds none, however long it stays in the map.

Why a small RESP client on plain sockets rather than redis-py (measured on loopback,
``benches/tiers_remote.py``): redis-py pipelines are *slower* than one command at a time for big
GETs (0.3x at 2 MiB: the server buffers every reply of the pipeline), barely faster for 64 KiB
values, every value comes back as a fresh ``bytes`` to copy again, and its retries and socket
timeouts are its own. Here a store sends each value with vectored ``sendmsg`` straight from the
pool's pages (NumPy pools; staged rows otherwise) and its header, a load reads each value through a
cache-hot 1 MiB read buffer into its staging row (a third of the client CPU of ``recv_into`` on the
large row itself), checks it there and copies it into the pool; a byte window
(:data:`WINDOW_BYTES`, at least one command) bounds what is in flight per server, so replies never
pile up in the server's output buffer. Only RESP2 commands of every Redis >= 6.2 and Valkey are
used (SET NX PX, GET / GETEX PX, GETRANGE, EXISTS, DEL, CLUSTER SLOTS, ASKING, AUTH, SELECT,
CLIENT SETNAME), and no third-party package: ``import kvcore.tiers`` needs nothing more. No TLS yet:
``rediss://`` is refused.

Failure policy: server problems (timeouts, refused or reset connections, ``-OOM`` under
``maxmemory``, a cluster node down, any error reply, a reply that is not RESP or not what the command
can produce) never raise out of ``store``/``load``/``exists``; the row is False and counted by reason
in :meth:`RedisTier.stats`. Caller mistakes (shapes, ranges, a pool of another geometry, a namespace
that is not valid Unicode) raise before anything is sent. An exception that is no server problem
(KeyboardInterrupt, whatever a signal handler raises) goes on to the caller, but first closes every
connection the call left in the middle of an exchange, replies unread: the next call reconnects
instead of reading them as its own (``_Conn.pending``).
"""

from __future__ import annotations

import _thread
import binascii
import contextlib
import functools
import math
import os
import queue
import select
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import numpy as np

from kvcore.exceptions import ConfigError, InvalidArgumentError, InvalidDTypeError
from kvcore.pool import KVPool
from kvcore.pool.checks import index_array
from kvcore.tiers import _batch, codec
from kvcore.tiers.codec import Geometry, HeaderError

__all__ = ["RedisTier"]

_T = TypeVar("_T")

WINDOW_BYTES = 1 << 20  # value bytes in flight per server, at least one command (see the module doc)
BUDGET_BYTES: Final[int] = 64 << 20  # an exchange with one server gets one more timeout_s per 64 MiB
_READ_BUF: Final[int] = 1 << 20  # read buffer of a bulk connection (values pass through it)
_LINE_BUF: Final[int] = 1 << 16  # read buffer of other connections (lookups, CLUSTER SLOTS)
# The longest settings: a socket timeout past about 9e9 s overflows the platform's time_t (every call
# then raised OverflowError), and Redis refuses a PX whose expiry overflows its millisecond clock.
MAX_TIMEOUT_S: Final[float] = 86_400.0  # one day
MAX_TTL_MS: Final[int] = 10**14  # about 3,000 years
_MAX_IOV: Final[int] = 512  # buffers per sendmsg (IOV_MAX is 1024 on Linux)
_MAX_CHUNK_PAGES: Final[int] = 1024  # pages staged at once (and as many 4 KiB headers), under 64 MiB
_NUM_CLUSTER_SLOTS: Final[int] = 16384
_DEFAULT_PORT: Final[int] = 6379
MAX_NODES: Final[int] = 1000  # masters a CLUSTER SLOTS table may list (Redis Cluster's own limit)
# A control reply (CLUSTER SLOTS) holds at most this many values and bytes of bulk strings in all: a
# table of 16,384 one-slot ranges with a few replicas each fits; a hostile length does not allocate.
_CONTROL_VALUES: Final[int] = 1 << 19
_CONTROL_BYTES: Final[int] = 8 << 20
_MAX_HOST_LEN: Final[int] = 255
# Nodes whose exchanges of one call run at once (the caller's thread and the channel's worker threads):
# a call waits on its slowest server, not on the sum of them, up to this many servers.
_MAX_PARALLEL: Final[int] = 64

# Outcome of one row (int8 codes in a status array).
_PENDING, _OK, _EXISTS, _MISSING, _VALUE, _BADLEN, _OOM, _MOVED, _ERROR, _TIMEOUT, _CONN, _DOWN = range(12)
_NAMESPACE = 12  # store: a namespace too long for a header (never sent)
_SCALES = 13  # store: NX found a value of other fp8/int8 pool scales (or not a page) under the key
# A cluster slot the last CLUSTER SLOTS table gives no master (counted as *_failed_other, like the
# -CLUSTERDOWN a node answers for such a slot: no connection was tried or lost). Rows of a cluster
# whose table was never read fail as connections instead (the failed read counts connection_errors).
_UNMAPPED = 14
# -ASK: a slot being migrated, the key not (or no longer) on the node asked; the row is sent once more,
# after ASKING, to the node named, when the call's map lists it. Counted as *_failed_other if it stays.
_ASK = 15
_TRANSPORT: Final = frozenset({_TIMEOUT, _CONN})
_REPLIED: Final = (_ERROR, _MOVED, _ASK)  # error replies that fail a row as *_failed_other

_STAT_NAMES = (
    "num_slots",
    "nodes",  # servers known: 1, or the masters of the last CLUSTER SLOTS table
    "nodes_down",  # servers in back-off now
    "stores",  # rows stored (a value already there counts, NX, if it is of this pool's scales)
    "store_exists",  # ... of which the key was already there (not rewritten)
    "store_failed",  # rows not stored, every reason below
    "store_failed_timeout",  # no reply within the deadline
    "store_failed_connection",  # refused, reset or closed connections, a refused handshake
    "store_failed_oom",  # -OOM: maxmemory reached under a noeviction policy
    "store_failed_down",  # the server was in back-off: nothing sent
    "store_failed_namespace",  # a namespace longer than a header holds (codec.namespace_room)
    "store_failed_scales",  # fp8/int8: NX left a value of other pool scales there (this pool cannot load it)
    # any other error reply (CLUSTERDOWN, READONLY, MOVED or ASK twice or off the map, ...), or a cluster slot
    # the last CLUSTER SLOTS table gives no master (nothing sent; the map is re-read)
    "store_failed_other",
    "loads",  # rows loaded into the pool
    "load_failed",  # rows not loaded, every reason below
    "load_failed_missing",  # no such key (never stored, expired, evicted, deleted)
    "load_failed_checksum",  # payload checksum mismatch (value deleted)
    "load_failed_corrupt",  # header unreadable, wrong length or key echo (value deleted)
    "load_failed_geometry",  # a value of another geometry, dtype or quantization (left alone)
    "load_failed_scales",  # an fp8/int8 page stored under other pool scales (left alone)
    "load_failed_timeout",
    "load_failed_connection",
    "load_failed_down",
    "load_failed_other",  # as store_failed_other
    "checksum_mismatches",  # header or payload checksums that failed
    "deleted",  # corrupt values deleted
    "lookups",  # runs of keys asked: one per exists() call, one per run of exists_runs()
    "lookup_keys",  # keys asked (at most max_lookup_keys per call)
    "lookup_hit_keys",  # leading keys found
    "lookup_failed",  # exists() calls that could not ask every key they needed
    "bytes_written",  # value bytes sent in SETs that got a reply
    "bytes_read",  # value bytes received
    "timeouts",  # exchanges with one server that timed out
    "connection_errors",  # exchanges with one server that lost or could not make the connection
    "down_events",  # times a server went into back-off
    "skipped_down",  # exchanges not attempted because the server was in back-off
    "reconnects",  # connections made again after one was closed or lost
    "moved",  # MOVED replies (a cluster resharded, or failed over)
    "asks",  # ASK replies (a slot being migrated: the row is asked again, after ASKING, at the node named)
    "topology_refreshes",  # CLUSTER SLOTS reads
)


class _Refused(Exception):
    """The server refused the handshake (AUTH, SELECT): a configuration problem, counted as a
    connection failure so that the server goes into back-off instead of being hammered."""


class _ProtocolError(Exception):
    """A reply that is not what the command sent can produce: the stream cannot be trusted."""


class _ReplyError(Exception):
    """An error reply where a value was needed (CLUSTER SLOTS)."""


class _Stop:
    """A call's "cut short" flag: set and read with one attribute store or load each, so that an
    interrupt never leaves it half set (a ``threading.Event`` takes a lock to set)."""

    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


def _no_job() -> None:
    return None


class _Task:
    """One job for a :class:`_Workers` thread. The caller's side of it is only C-level steps (a
    ``SimpleQueue`` put, a lock acquire, attribute stores), each whole or not done, so that an
    interrupt in the caller's thread leaves nothing half changed; a worker runs a task once
    (``claim``), however many times it was put."""

    __slots__ = ("cancelled", "claim", "done", "error", "finished", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.claim = _thread.allocate_lock()
        self.finished = _thread.allocate_lock()
        self.finished.acquire()  # released once, by the worker that ran (or skipped) it
        self.done = False
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        if not self.claim.acquire(False):
            return  # a copy of a task run already
        try:
            if not self.cancelled:
                self.result = self.fn()
        except BaseException as e:  # (handed to the caller, which raises it)
            self.error = e
        finally:
            self.fn = _no_job  # (a worker holds its last task: not the tier through it)
            self.done = True
            self.finished.release()

    def wait(self) -> None:
        while not self.done:
            self.finished.acquire()


class _Workers:
    """A channel's worker threads (at most ``size``, started at first need, kept until
    :meth:`close`), fed through a ``SimpleQueue``: not ``concurrent.futures``, whose submit and wait
    run Python-level locking in the caller's thread, where an interrupt can leave a lock held (the
    tier hung for good) or a job running after the call has raised."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self.threads = 0

    def _loop(self) -> None:
        while True:
            task = self.queue.get()
            if task is None:
                return
            task.run()
            del task  # (nor the tier its job was of, while it waits)

    def _start(self, n: int) -> None:
        while self.threads < min(n, self.size):
            _thread.start_new_thread(self._loop, ())  # (RuntimeError at interpreter exit)
            self.threads += 1

    def submit(self, tasks: Sequence[_Task]) -> None:
        """Queue ``tasks``; where no thread can start (the interpreter is exiting), run the rest here."""
        try:
            self._start(len(tasks))
        except RuntimeError:
            if self.threads == 0:
                for t in tasks:
                    t.run()
                return
        for t in tasks:
            self.queue.put(t)

    def cancel(self, tasks: Sequence[_Task]) -> None:
        """Make sure no task of ``tasks`` runs any more: those not started never do, then wait for
        the running ones. Idempotent: a second interrupt calls it again."""
        for t in tasks:
            t.cancelled = True
        with contextlib.suppress(RuntimeError):
            self._start(len(tasks))
        for t in tasks:
            if not t.done:
                if self.threads == 0:
                    t.run()
                else:
                    self.queue.put(t)  # (maybe once more: a copy is skipped)
        for t in tasks:
            t.wait()

    def close(self) -> None:
        for _ in range(self.threads):
            self.queue.put(None)
        self.threads = 0


def _close_pools(pools: dict[bool, tuple[int, _Workers]]) -> None:
    """End the worker threads of ``pools`` (a tier's channels) made in this process (a forked
    child's copies have no threads to end)."""
    for pid, pool in pools.values():
        if pid == os.getpid():
            pool.close()


class _Deadline:
    """``wait()`` is the timeout for the next socket operation: ``step``, less near the end.

    The end is ``step * (2 + nbytes // BUDGET_BYTES)`` away: a server that answers nothing fails
    the first wait, after ``step``; one that dribbles is cut off there. (Not ``1 + ...``: then every
    wait would be a little under ``step``, and the kernel timeouts re-armed before every call.)
    Once ``stop`` (the call's, see :meth:`RedisTier._parallel`) is set, every wait fails at once.
    """

    __slots__ = ("end", "step", "stop")

    def __init__(self, step: float, nbytes: int = 0, stop: _Stop | None = None) -> None:
        self.step = step
        self.end = time.monotonic() + step * (2 + nbytes // BUDGET_BYTES)
        self.stop = stop

    def wait(self) -> float:
        if self.stop is not None and self.stop.is_set():
            raise TimeoutError("the call was cut short")
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline")
        return self.step if left >= self.step else left


@dataclass(frozen=True)
class _Auth:
    username: str | None
    password: str | None
    db: int  # 0 on a cluster


def _bulk(x: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(x), x)


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


_ASKING: Final[bytes] = _command(b"ASKING")  # before the one command an -ASK reply sends elsewhere


def _asking_reply(conn: _Conn, dl: _Deadline) -> None:
    """Read ASKING's own reply: +OK, or an error (the command after it then tells the rest)."""
    line = conn.line(dl)
    if line[:1] not in (b"+", b"-"):
        raise _ProtocolError(f"ASKING: unexpected reply {line[:40]!r}")


class _Conn:
    """One RESP2 connection to one server, with a read-ahead buffer. Not thread-safe: each channel
    (bulk store/load, lookups) has its own, used under its channel's lock, by the call holding it
    or by one of that call's worker threads (one per node: :meth:`RedisTier._parallel`).

    The buffer (``buf_bytes``) exists only while connected: allocated when a connection is made,
    freed when it is closed or lost, so a node that cannot be reached (refused, down, unroutable)
    holds no buffer however long it stays in the slot map (:meth:`RedisTier._buffer_bytes`).

    The socket is blocking with kernel timeouts (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``, re-armed only
    when a deadline gets closer than ``timeout_s``): one syscall per send or receive (Python's own
    socket timeouts cost a ``poll`` before every call).

    ``pending`` is True from the first byte an exchange sends (or the connection is made) until the
    exchange has read its last reply. An exchange cut short by an exception that is no server problem
    (KeyboardInterrupt, whatever a signal handler raises) leaves replies unread on the socket, which
    the next exchange would read as its own: such a connection is closed where the exception passes
    (:meth:`RedisTier._exchange`, :meth:`RedisTier._lookup_io`, :func:`_close_pending`), and in any
    case never reused (:meth:`reusable`, :meth:`open`).
    """

    def __init__(self, host: str, port: int, auth: _Auth, buf_bytes: int = _LINE_BUF) -> None:
        self.host, self.port, self.auth = host, port, auth
        self.sock: socket.socket | None = None
        self.opened = 0  # connections made so far
        self.pending = False  # replies may be unread (see the class doc)
        self._armed = -1.0  # the kernel timeouts set on the socket, seconds
        self._buf_bytes = buf_bytes
        self._buf = bytearray()  # buf_bytes while connected, else empty (see the class doc)
        self._view = memoryview(self._buf)
        self._lo = 0  # unread bytes are _buf[_lo:_hi]
        self._hi = 0
        self.digest = memoryview(bytearray(16))  # the scale digest a store's GETRANGE returned

    def buffered(self) -> bool:
        """Whether reply bytes are in the read buffer already (nothing to wait for on the socket)."""
        return self._lo < self._hi

    def reusable(self) -> bool:
        """Whether a connection from an earlier exchange is here to use; one that exchange left
        ``pending`` (cut short: its replies may still come) is closed first, and is not."""
        if self.sock is not None and self.pending:
            self.close()
        return self.sock is not None

    def open(self, dl: _Deadline) -> bool:
        """Connect and hand-shake if not connected (or left ``pending``: then anew); True if a
        connection was made again."""
        if self.reusable():
            return False
        sock = self.attach(socket.create_connection((self.host, self.port), timeout=dl.wait()))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)  # blocking: the kernel timeouts bound every call (_arm)
            cmds = []
            if self.auth.password is not None:
                user = [] if self.auth.username is None else [self.auth.username.encode()]
                cmds.append(_command(b"AUTH", *user, self.auth.password.encode()))
            if self.auth.db:
                cmds.append(_command(b"SELECT", str(self.auth.db).encode()))
            # The name only labels the connection in CLIENT LIST: a server that may not run it for
            # this user (an ACL user without +client: NOPERM; CLIENT renamed away: unknown command)
            # is used all the same. Any other refusal fails the connection, as AUTH's or SELECT's
            # does: NOAUTH (a password needed and none given), LOADING, DENIED, ...
            cmds.append(_command(b"CLIENT", b"SETNAME", b"kvcore"))
            self.send(cmds, dl)
            for k in range(len(cmds)):
                line = self.line(dl)
                if line[:1] != b"-":
                    continue
                naming = k == len(cmds) - 1
                if naming and (line.startswith(b"-NOPERM") or line.startswith(b"-ERR unknown")):
                    continue
                raise _Refused(line[1:].decode("utf-8", "replace"))
        except BaseException:
            self.close()
            raise
        self.pending = False
        self.opened += 1
        return self.opened > 1

    def attach(self, sock: socket.socket) -> socket.socket:
        """Make ``sock`` (connected) this connection's socket, with a new, empty read buffer;
        ``pending`` until its hand-shake is done."""
        self.sock, self._lo, self._hi, self._armed = sock, 0, 0, -1.0
        self.pending = True
        self._buf = bytearray(self._buf_bytes)
        self._view = memoryview(self._buf)
        return sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self.pending = False
        self._lo = self._hi = 0
        self._buf = bytearray()  # the old one is freed with its last view
        self._view = memoryview(self._buf)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _arm(self, dl: _Deadline) -> socket.socket:
        """The socket, its kernel send/receive timeouts set to ``dl.wait()`` (a syscall only when
        that changed: near a deadline's end)."""
        sock = self.sock
        assert sock is not None
        t = dl.wait()
        if t != self._armed:
            sec = int(t)
            usec = max(int((t - sec) * 1e6), 0 if sec else 1)  # 0 s 0 µs would mean "no timeout"
            tv = struct.pack("ll", sec, usec)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self._armed = t
        return sock

    def send(self, bufs: Sequence[Any], dl: _Deadline) -> None:
        """Send every buffer in order (vectored ``sendmsg``, no copies)."""
        views = list(bufs)  # bytes, bytearrays, 1-D uint8 arrays and memoryviews: len() is their size
        i, num = 0, len(views)
        self.pending = True  # until the exchange has read every reply
        while i < num:
            group = views[i : i + _MAX_IOV]
            sock = self._arm(dl)
            try:
                n = sock.sendmsg(group)
            except BlockingIOError:  # SO_SNDTIMEO expired with nothing sent
                raise TimeoutError("send timed out") from None
            if n == sum(map(len, group)):  # all of it: the common case, no per-buffer walk
                i += len(group)
                continue
            while n > 0:
                size = len(views[i])
                if n >= size:
                    n -= size
                    i += 1
                else:
                    views[i] = memoryview(views[i]).cast("B")[n:]
                    n = 0

    def _recv_into(self, mv: memoryview, dl: _Deadline) -> int:
        sock = self._arm(dl)
        try:
            n = sock.recv_into(mv)
        except BlockingIOError:  # SO_RCVTIMEO expired with nothing received
            raise TimeoutError("receive timed out") from None
        if n == 0:
            raise ConnectionResetError("the server closed the connection")
        return n

    def _fill(self, dl: _Deadline) -> None:
        if self._lo == self._hi:
            self._lo = self._hi = 0
        elif self._hi == len(self._buf):
            k = self._hi - self._lo
            if k == len(self._buf):
                raise _ProtocolError("a reply line longer than the read buffer")
            self._buf[:k] = self._buf[self._lo : self._hi]
            self._lo, self._hi = 0, k
        self._hi += self._recv_into(self._view[self._hi :], dl)

    def gather(self, lines: int) -> bool:
        """Take in the reply bytes the kernel holds now, without waiting; True once ``lines`` reply
        lines are in the buffer (or it is full, or the connection ended or failed: the read that
        follows finds out, waiting), False while more are to come.

        Why: a lookup reads several nodes' replies in one thread; a node whose reply is not all here
        (one that trickles it) must not be read waiting while the others' replies sit unread.
        """
        sock = self.sock
        if sock is None:
            return True
        while self._buf.count(b"\r\n", self._lo, self._hi) < lines:
            if self._lo == self._hi:
                self._lo = self._hi = 0
            elif self._hi == len(self._buf):
                if self._lo == 0:
                    return True
                k = self._hi - self._lo
                self._buf[:k] = self._buf[self._lo : self._hi]
                self._lo, self._hi = 0, k
            try:
                n = sock.recv_into(self._view[self._hi :], 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return True
            if n == 0:
                return True
            self._hi += n
        return True

    def line(self, dl: _Deadline) -> bytes:
        """The next reply line, without its CRLF."""
        while True:
            i = self._buf.find(b"\r\n", self._lo, self._hi)
            if i >= 0:
                out = bytes(self._view[self._lo : i])
                self._lo = i + 2
                return out
            self._fill(dl)

    def flags(self, m: int, dl: _Deadline) -> np.ndarray | None:
        """bool ``[m]``: the next ``m`` replies if every one is ``:0`` or ``:1`` (EXISTS), consumed;
        None (nothing consumed) if any is not, or if they cannot all sit in the buffer.

        Why: checking 4 bytes per key with NumPy is ten times cheaper than a line per key.
        """
        need = 4 * m
        if need > len(self._buf):
            return None
        while self._hi - self._lo < need:  # every reply is at least 4 bytes: these will come
            if self._hi == len(self._buf):
                k = self._hi - self._lo
                self._buf[:k] = self._buf[self._lo : self._hi]
                self._lo, self._hi = 0, k
            self._hi += self._recv_into(self._view[self._hi :], dl)
        r = np.frombuffer(self._buf, dtype=np.uint8, count=need, offset=self._lo).reshape(m, 4)
        digit = r[:, 1]
        if not ((r[:, 0] == 58) & (r[:, 2] == 13) & (r[:, 3] == 10) & ((digit == 48) | (digit == 49))).all():
            return None
        self._lo += need
        out: np.ndarray = digit == 49
        return out

    def read_into(self, mv: memoryview, dl: _Deadline) -> None:
        """Fill ``mv`` with the next ``len(mv)`` bytes, through the read buffer.

        Why not ``recv_into(mv)`` straight: the kernel's copy into a large, cache-cold destination
        cost three times the client CPU of a copy into this small, cache-hot buffer followed by a
        ``memcpy`` out of it (2 MiB values, loopback; ``benches/tiers_remote.py``).
        """
        n = len(mv)
        got = 0
        while got < n:
            if self._lo == self._hi:
                self._lo = 0
                self._hi = self._recv_into(self._view, dl)
            k = min(n - got, self._hi - self._lo)
            mv[got : got + k] = self._view[self._lo : self._lo + k]
            self._lo += k
            got += k

    def skip(self, n: int, dl: _Deadline) -> None:
        """Drop the next ``n`` bytes."""
        while n > 0:
            if self._lo == self._hi:
                self._fill(dl)
            k = min(n, self._hi - self._lo)
            self._lo += k
            n -= k

    def value(self, dl: _Deadline) -> Any:
        """One whole reply, parsed (small control replies only: CLUSTER SLOTS): at most
        :data:`_CONTROL_VALUES` values and :data:`_CONTROL_BYTES` bytes of bulk strings, checked
        before anything is allocated (a length is only a claim of the server's)."""
        return self._value(dl, 0, [_CONTROL_VALUES, _CONTROL_BYTES])

    def _value(self, dl: _Deadline, depth: int, left: list[int]) -> Any:
        """:meth:`value`; ``left`` is ``[values, bytes]`` the rest of the reply may still hold."""
        if depth > 8:
            raise _ProtocolError("reply nested too deep")
        left[0] -= 1
        if left[0] < 0:
            raise _ProtocolError(f"a reply of more than {_CONTROL_VALUES} values")
        line = self.line(dl)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise _ReplyError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind in (b"$", b"*"):
            n = int(rest)
            if n == -1:
                return None
            if n < 0:
                raise _ProtocolError(f"unexpected reply {line[:40]!r}")
            if kind == b"*":
                if n > left[0]:
                    raise _ProtocolError(f"an array of {n} values, more than a control reply holds")
                return [self._value(dl, depth + 1, left) for _ in range(n)]
            left[1] -= n
            if left[1] < 0:
                raise _ProtocolError(f"more than {_CONTROL_BYTES} bytes of bulk strings in a reply")
            buf = bytearray(n)
            self.read_into(memoryview(buf), dl)
            self.skip(2, dl)
            return bytes(buf)
        raise _ProtocolError(f"unexpected reply {line[:40]!r}")


class _Node:
    """One server: a connection per channel, each made at first use, and its health. A connection's
    read buffer lives only while it is connected (see :class:`_Conn`): a node of the slot map that
    no call reaches, or that refuses every connection, holds none."""

    __slots__ = ("_bulk", "_lookup", "auth", "down_until", "failures", "host", "port", "retired")

    def __init__(self, host: str, port: int, auth: _Auth) -> None:
        self.host, self.port, self.auth = host, port, auth
        self._bulk: _Conn | None = None  # store / load (used under the tier's _io_lock only)
        self._lookup: _Conn | None = None  # exists (under _lookup_lock only)
        self.failures = 0  # consecutive failed calls
        self.down_until = 0.0  # time.monotonic() before which it is not tried
        self.retired = False  # no longer in the slot map: never connected again

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def bulk(self) -> _Conn:
        if self._bulk is None:
            self._bulk = _Conn(self.host, self.port, self.auth, _READ_BUF)
        return self._bulk

    @property
    def lookup(self) -> _Conn:
        if self._lookup is None:
            self._lookup = _Conn(self.host, self.port, self.auth)
        return self._lookup

    def conn(self, bulk: bool) -> _Conn | None:
        """The channel's connection if it was ever made."""
        return self._bulk if bulk else self._lookup

    def buffer_bytes(self) -> int:
        """Bytes of read buffers this node holds now (its connected channels')."""
        return sum(len(c._buf) for c in (self._bulk, self._lookup) if c is not None)

    def close(self) -> None:
        for c in (self._bulk, self._lookup):
            if c is not None:
                c.close()


@dataclass
class _Call:
    """What one call did, merged into the counters at its end (one lock acquisition).

    The exchanges of one call with several nodes run at once (:meth:`RedisTier._parallel`), each
    touching its own node's connection and its own rows only; what they share here is safe so:
    ``add`` takes ``lock`` (once ``stop`` exists), and the dicts are only ever assigned a key (one
    bytecode, atomic) by them.
    """

    counts: dict[str, int] = field(default_factory=dict)
    failed: dict[int, int] = field(default_factory=dict)  # node index -> transport failure code
    touched: set[int] = field(default_factory=set)  # node indices whose exchange succeeded
    # The nodes of the slot map the call routed by (node indices index this), and its name -> index:
    # a refresh by the other channel meanwhile replaces the tier's map, never this one.
    nodes: Sequence[_Node] = ()
    index: dict[str, int] = field(default_factory=dict)
    moved: dict[int, int] = field(default_factory=dict)  # cluster slot -> node index a MOVED named
    asked: dict[int, int] = field(default_factory=dict)  # row -> node index an ASK named (to ask once)
    # Rows of the retry sent after ASKING (RedisTier._run): a row of several commands (a store's SET,
    # PEXPIRE and GETRANGE) sends ASKING before each, as ASKING holds for one command.
    asking: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)  # counts, from several threads
    # Set: cut the call's exchanges short. Made (:meth:`stopper`) before exchanges run at once, and
    # only then: a call with one server, the common case, pays for no event and no lock in ``add``.
    stop: _Stop | None = None

    def add(self, name: str, n: int = 1) -> None:
        if not n:
            return
        if self.stop is None:  # nothing runs at once (see ``stop``)
            self.counts[name] = self.counts.get(name, 0) + n
            return
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def stopper(self) -> _Stop:
        """``stop``, made at first need (before any exchange that is to heed it starts)."""
        if self.stop is None:
            self.stop = _Stop()
        return self.stop


def _parse_host_port(s: str, what: str) -> tuple[str, int]:
    s = s.strip()
    if s.startswith("["):  # [v6]:port
        host, sep, port = s[1:].partition("]")
        port = port[1:] if port.startswith(":") else port
    else:
        host, sep, port = s.rpartition(":")
        if not sep:
            host, port = s, ""
    try:
        p = int(port) if port else _DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"{what}: bad port in {s!r}") from None
    if not host or not 0 < p < 65536:
        raise ConfigError(f"{what}: expected host:port, got {s!r}")
    return host, p


def _parse_url(url: Any) -> tuple[bool, list[tuple[str, int]], _Auth]:
    """``(is_cluster, [(host, port)], auth)`` of the ``url`` argument."""
    if isinstance(url, list | tuple):
        if not url or not all(isinstance(u, str) for u in url):
            raise ConfigError(f"url: expected a non-empty list of 'host:port' strings, got {url!r}")
        return True, [_parse_host_port(u, "url") for u in url], _Auth(None, None, 0)
    if not isinstance(url, str):
        raise ConfigError(f"url: expected a redis:// URL or a list of 'host:port', got {url!r}")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("redis", "redis+cluster"):
        hint = " (TLS is not supported yet)" if scheme == "rediss" else ""
        raise ConfigError(
            f"url: expected redis://host:port[/db] or redis+cluster://h1:p1,h2:p2, got {url!r}{hint}"
        )
    netloc, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    if query:
        raise ConfigError(f"url: query parameters are not supported, got {url!r}")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(pw) if colon else urllib.parse.unquote(user)
        if not colon:
            username = None
    try:
        db = int(path) if path else 0
    except ValueError:
        raise ConfigError(f"url: bad database number {path!r} in {url!r}") from None
    if db < 0:
        raise ConfigError(f"url: bad database number {path!r} in {url!r}")
    cluster = scheme == "redis+cluster"
    if cluster and db:
        raise ConfigError(f"url: a cluster has only database 0, got {url!r}")
    parts = [h for h in hosts.split(",") if h.strip()]
    if not parts or (not cluster and len(parts) > 1):
        raise ConfigError(f"url: expected {'hosts' if cluster else 'one host'} in {url!r}")
    return cluster, [_parse_host_port(h, "url") for h in parts], _Auth(username, password, db)


def _close_conns(nodes: Sequence[_Node], bulk: bool) -> None:
    """Close the ``bulk`` (else lookup) channel's connection of each node, where one was made."""
    for nd in nodes:
        c = nd.conn(bulk)
        if c is not None:
            c.close()


def _close_pending(nodes: Sequence[_Node], bulk: bool) -> None:
    """Close the ``bulk`` (else lookup) channel's connections of ``nodes`` left ``pending``: a call cut
    short by an exception that is no server problem (KeyboardInterrupt) may have sent commands whose
    replies nobody read, and the next call would read them as its own (see :class:`_Conn`)."""
    for nd in nodes:
        c = nd.conn(bulk)
        if c is not None and c.pending:
            c.close()


class _ClosePending:
    """``with lock, _ClosePending(call, bulk):`` around a call's exchanges on a channel: an exception
    out of it (KeyboardInterrupt anywhere in the call, a bug) first closes the channel's connections
    the call left ``pending`` (:func:`_close_pending`), under the channel's lock still."""

    __slots__ = ("bulk", "call")

    def __init__(self, call: _Call, *, bulk: bool) -> None:
        self.call, self.bulk = call, bulk

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            _close_pending(self.call.nodes, self.bulk)


def _key_slot(key: bytes) -> int:
    """The cluster hash slot of a key without a hash tag: CRC16-XMODEM mod 16384 (the prefix may
    hold no braces, so a kvcore key never has one)."""
    return binascii.crc_hqx(key, 0) & (_NUM_CLUSTER_SLOTS - 1)


class RedisTier:
    """Pages of pools of one geometry in Redis or a Redis Cluster, one value per page.

    Args:
        url: ``redis://[[user]:password@]host:port[/db]``, ``redis+cluster://[[user]:password@]h1:p1,
            h2:p2,...`` (any reachable nodes of the cluster), or a list of ``"host:port"`` (a cluster).
        pool: a pool of the geometry stored.
        num_slots: the size of the manager's index of remote pages (``lower_tiers``' slot count).
            Redis is addressed by key, so slots are only checked for range and distinctness.
        prefix: the first key segments (``"kvcore"``, ``"team:model"``; a trailing ``:`` is dropped): a
            non-empty printable string without whitespace or braces (braces would make a cluster hash
            tag and put every page on one node).
        ttl_ms: None (keys live until the server evicts them: set a ``maxmemory-policy``) or a TTL in
            milliseconds, ``1..=MAX_TTL_MS``, set by every store (also one that finds the value there,
            stored by another instance: ``PEXPIRE``) and renewed by every load (``GETEX``, Redis >= 6.2).
        timeout_s: the longest wait on any socket operation (connect, send, reply), in
            ``(0, MAX_TIMEOUT_S]`` (a day). A server that answers nothing fails after ``timeout_s``;
            an exchange with one server takes at most ``timeout_s * (2 + value bytes // 64 MiB)``. A
            store's or load's exchanges with its servers run at once, up to 64 at a time (see below),
            so up to 64 servers its time does not grow with the number of nodes: at most about
            ``timeout_s`` x 2 for a ``CLUSTER SLOTS`` read (when the map is stale), plus, per chunk (up
            to 1,024 pages, under 64 MiB), x 2 for its exchanges and x 2 for one retry of the rows a
            ``MOVED`` or ``ASK`` sent elsewhere (a load that deletes corrupt values: x 4 more). Stalled
            masters cost ``timeout_s`` per 64 of them in one chunk (x 3 with the map re-read; they go
            in waves: 512 stalled masters, about 8 x ``timeout_s``) until ``down_after`` failures put
            them in back-off. An :meth:`exists` reads every node's reply in one thread as it comes:
            ``timeout_s`` x 2 at most, however many nodes stall or trickle their replies.
        max_lookup_keys: the most keys one :meth:`exists` asks, >= 1 (2,048: a 32k-token prompt of
            16-token pages in one round trip; a bound of 256 cost round-robin instances up to 15
            points of hit rate in the replay, BENCHMARKS.md).
        down_after: consecutive failed calls (timeouts, lost connections) after which a server is
            skipped for ``backoff_s``, >= 1.
        backoff_s: how long a down server is skipped, >= 0.
        quantize: None, ``"int8"`` or ``"int4"`` (KIVI, fp16/bf16 pools; :mod:`kvcore.tiers.codec`).
        name: the tier's name in the manager's ``lower_tiers``, stats and logs.
        bandwidth_gbps: what the manager's ``value`` store policy assumes a load costs, GB/s, > 0.

    Side effects: none at construction (no connection is made until the first call, so an engine
    starts while the server is away); allocates a staging buffer of up to 1,024 pages and 64 MiB
    (pinned on the GPU backend) plus one 4 KiB header per staged page.

    Raises:
        ConfigError: a bad URL, prefix or numeric setting, an unknown quantization or quantization of
            an fp8/int8 pool.

    Store/load calls are serialized by one lock, lookups by another (with their own connections),
    so an :meth:`exists` from the scheduler never waits behind a bulk transfer of the Mover's. A store
    or load that reaches several servers runs its exchanges with them at once: the first in the
    caller's thread, the others in worker threads of the channel's own (at most 63 per channel,
    started at first need, ended by :meth:`close`), each touching its own server's connection and
    rows only. An :meth:`exists` sends to every server, then reads the replies as they come, in the
    caller's thread; its channel's threads only make several new connections at once.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        pool: KVPool,
        *,
        num_slots: int = 1 << 20,
        prefix: str = "kvcore",
        ttl_ms: int | None = None,
        timeout_s: float = 0.5,
        max_lookup_keys: int = 2048,
        down_after: int = 3,
        backoff_s: float = 5.0,
        quantize: str | None = None,
        name: str = "remote",
        bandwidth_gbps: float = 1.0,
    ) -> None:
        self.geometry = Geometry.of_pool(pool, quantize)
        self.cluster, endpoints, self._auth = _parse_url(url)
        self.num_slots = _int_arg(num_slots, "num_slots", 1)
        self.max_lookup_keys = _int_arg(max_lookup_keys, "max_lookup_keys", 1)
        self.down_after = _int_arg(down_after, "down_after", 1)
        self.ttl_ms = None if ttl_ms is None else _int_arg(ttl_ms, "ttl_ms", 1, MAX_TTL_MS)
        self.timeout_s = _float_arg(timeout_s, "timeout_s", positive=True, maximum=MAX_TIMEOUT_S)
        self.backoff_s = _float_arg(backoff_s, "backoff_s", positive=False)
        self.bandwidth_gbps = _float_arg(bandwidth_gbps, "bandwidth_gbps", positive=True)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name: expected a non-empty string, got {name!r}")
        if isinstance(prefix, str):
            prefix = prefix.rstrip(":")
        if (
            not isinstance(prefix, str)
            or not prefix
            or any(c.isspace() or c in "{}" for c in prefix)
            or not prefix.isprintable()
        ):
            raise ConfigError(
                f"prefix: expected a non-empty printable string without whitespace or braces, got {prefix!r}"
            )
        self.name = name
        self.prefix = prefix
        self.quantize = quantize
        self._codec = _batch.RowCodec(self.geometry)
        self.header_len = codec.header_len(self.geometry)  # bytes before the payload in every value
        self.payload_len = self._codec.row_bytes  # bytes of payload in every value
        self.value_bytes = self.header_len + self.payload_len  # bytes of every value
        self._check = codec.HeaderCheck(self.geometry, self.payload_len)
        self.geometry_tag = self._tag()
        self._key_prefix = f"{prefix}:{self.geometry_tag}:".encode()
        self._key_len = len(self._key_prefix) + 32

        # RESP pieces around each key (every key has the same length).
        kl, vl = self._key_len, self.value_bytes
        ttl = b"" if self.ttl_ms is None else b"%d" % self.ttl_ms
        self._set_head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n" % (4 if self.ttl_ms is None else 6, kl)
        self._set_mid = b"\r\n$%d\r\n" % vl
        self._set_tail = b"\r\n$2\r\nNX\r\n" + (b"" if not ttl else b"$2\r\nPX\r\n" + _bulk(ttl))
        # PEXPIRE after each SET when there is a TTL: SET NX sets PX only where it writes, so a value
        # another instance stored earlier kept its older (shorter) expiry.
        self._pexpire = (b"*3\r\n$7\r\nPEXPIRE\r\n$%d\r\n" % kl, b"\r\n" + _bulk(ttl)) if ttl else None
        self._getex = self.ttl_ms is not None  # renew the TTL on load (falls back to GET if refused)
        self._get_plain = (b"*2\r\n$3\r\nGET\r\n$%d\r\n" % kl, b"\r\n")
        self._get_ex = (b"*4\r\n$5\r\nGETEX\r\n$%d\r\n" % kl, b"\r\n$2\r\nPX\r\n" + _bulk(ttl))
        self._exists_head = b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n" % kl
        self._del_head = b"*2\r\n$3\r\nDEL\r\n$%d\r\n" % kl
        at = codec.SCALE_DIGEST_OFFSET  # GETRANGE's end is inclusive
        self._digest_get = (
            b"*4\r\n$8\r\nGETRANGE\r\n$%d\r\n" % kl,
            b"\r\n" + _bulk(b"%d" % at) + _bulk(b"%d" % (at + 15)),
        )
        self._value_line = b"$%d" % vl

        # Staging: payload rows (pinned on the GPU backend) and one header per row, reused; a call
        # moves its pages `chunk` at a time (one exchange per server per chunk).
        chunk = self._chunk = max(1, min(self._codec.chunk_pages, _MAX_CHUNK_PAGES))
        self._stage: np.ndarray = pool.backend.empty_host((chunk, self.payload_len), np.uint8)
        self._stage.fill(0)
        self._stage_mv = [memoryview(self._stage[j]) for j in range(chunk)]
        self._hdr = [bytearray(self.header_len) for _ in range(chunk)]
        self._hdr_mv = [memoryview(h) for h in self._hdr]
        self._hdr_got = np.zeros(chunk, dtype=np.int64)  # [chunk] header bytes read (wrong lengths)

        self._startup = endpoints
        # The slot map: replaced whole by a refresh, never changed in place but for a MOVED's slot
        # (a call keeps the one it routed by: see _Call.nodes). One node for a plain server.
        self._nodes: list[_Node] = [] if self.cluster else [_Node(*endpoints[0], self._auth)]
        self._node_index: dict[str, int] = {nd.name: i for i, nd in enumerate(self._nodes)}
        # [16384] int32 node index per cluster slot, -1 unknown (a cluster before its first read)
        self._slots = np.full(_NUM_CLUSTER_SLOTS, -1, dtype=np.int32)
        # nodes a refresh dropped whose connection of a channel, busy then, that channel closes at the
        # end of its call (bulk channel? -> nodes)
        self._to_close: dict[bool, list[_Node]] = {True: [], False: []}
        self._topology_stale = self.cluster
        self._topology_failures = 0
        self._topology_retry_at = 0.0
        self._last_good: tuple[str, int] | None = None  # the node whose CLUSTER SLOTS was read last
        self._stats = _batch.Counters(_STAT_NAMES)
        self._io_lock = threading.Lock()  # store / load, the bulk connections and the staging buffers
        self._lookup_lock = threading.Lock()  # exists, the lookup connections
        self._topology_lock = threading.Lock()  # CLUSTER SLOTS reads
        self._state_lock = threading.Lock()  # counters, node health, the slot map (short sections)
        # each channel's worker threads (bulk? -> (the pid that made them, them)), made at first need
        self._pools: dict[bool, tuple[int, _Workers]] = {}
        self.last_error = ""  # the last server problem seen, for logs ("" if none yet)

    def _buffer_bytes(self) -> int:
        """Bytes of read buffers the tier's connections hold now (tests: they stay bounded)."""
        with self._state_lock:
            nodes = [*self._nodes, *self._to_close[True], *self._to_close[False]]
        return sum(nd.buffer_bytes() for nd in nodes)

    # ------------------------------------------------------------------------------------ keys

    def _tag(self) -> str:
        """8 hex digits naming the value format and geometry (format version, shape, layout, dtype,
        quantization, payload length): the key segment that keeps geometries apart."""
        t = bytearray(self.header_len)
        codec.pack_header(
            t,
            geometry=self.geometry,
            key=bytes(16),
            parent_key=bytes(16),
            namespace=None,
            tokens=np.zeros(self.geometry.page_size, dtype=np.uint32),
            payload_len=self.payload_len,
            payload_checksum=bytes(16),
            scale_digest=bytes(16),
        )
        fields = bytes(t[8:10]) + bytes(t[48:67]) + bytes(t[72:80])
        return codec.checksum(np.frombuffer(fields, dtype=np.uint8))[:4].hex()

    def _planes(self, pool: KVPool) -> np.ndarray | None:
        """uint8 ``[num_layers * 2, num_pages, piece_bytes]``, a view of a NumPy pool's data (no copy),
        where a page's payload is the concatenation of ``planes[:, page]``; None for a quantized
        geometry or a device pool (their pages are staged).

        Why: a store then sends each page from the pool itself (vectored ``sendmsg``), skipping
        the copy into the staging buffer (a sixth of a store's client time for 2 MiB pages here).
        """
        data = pool.data
        if self.geometry.quantize is not None or pool.backend.is_device or not data.flags.c_contiguous:
            return None
        planes: np.ndarray = data.view(np.uint8).reshape(data.shape[0] * 2, data.shape[2], -1)
        return planes

    def redis_key(self, key: bytes | np.ndarray) -> bytes:
        """The Redis key of a 16-byte page key (bytes, or a uint8 array ``[16]``):
        ``{prefix}:{geometry_tag}:{key hex}``.

        Raises:
            InvalidDTypeError: a key of another type (an int, a str) or dtype.
            InvalidArgumentError: a key that is not 16 bytes.
        """
        if isinstance(key, np.ndarray) and key.dtype == np.uint8:
            k = key.tobytes()
        elif isinstance(key, bytes | bytearray | memoryview):
            k = bytes(key)
        else:
            what = f"{key.dtype} array" if isinstance(key, np.ndarray) else type(key).__name__
            raise InvalidDTypeError(f"key: expected 16 bytes or a uint8 array, got {what}")
        if len(k) != 16:
            raise InvalidArgumentError(f"key: expected 16 bytes, got {len(k)}")
        return self._key_prefix + k.hex().encode()

    def _names(self, keys: np.ndarray) -> list[bytes]:
        h = keys.tobytes().hex().encode()
        pre = self._key_prefix
        return [pre + h[32 * i : 32 * i + 32] for i in range(keys.shape[0])]

    # ------------------------------------------------------------------------------------ nodes

    def _refresh_topology(self, call: _Call, *, bulk: bool) -> None:
        """Read CLUSTER SLOTS from the first node that answers (known nodes, then the URL's) and
        replace the slot map: its nodes are the table's masters (those already known keep their
        connections and health; the others are closed and forgotten). On failure the old map stays;
        a cluster never read counts as down. ``bulk``: called by store/load (which wait for a refresh
        in progress), else by exists (which does not)."""
        if not self._topology_lock.acquire(blocking=bulk):
            return
        try:
            now = time.monotonic()
            if not self._topology_stale or now < self._topology_retry_at:
                return
            with self._state_lock:
                live = sorted((n for n in self._nodes if n.down_until <= now), key=lambda n: n.failures)
                candidates = [(n.host, n.port) for n in live]
            candidates += [e for e in self._startup if e not in candidates]
            if self._last_good in candidates:  # the node that answered last time first
                candidates.remove(self._last_good)
                candidates.insert(0, self._last_good)
            dl = _Deadline(self.timeout_s)  # one deadline for the whole refresh, whoever answers
            for host, port in candidates:
                conn = _Conn(host, port, self._auth)
                try:
                    conn.open(dl)
                    conn.send([_command(b"CLUSTER", b"SLOTS")], dl)
                    reply = conn.value(dl)
                    table = self._slot_table(reply, host)
                except (
                    OSError,
                    _Refused,
                    _ProtocolError,
                    _ReplyError,
                    ValueError,
                    TypeError,
                    IndexError,
                ) as e:
                    self.last_error = f"CLUSTER SLOTS from {host}:{port}: {e!r}"
                    continue
                finally:
                    conn.close()
                call.add("topology_refreshes")
                self._last_good = (host, port)
                self._install(table, bulk=bulk)
                return
            call.add("connection_errors")
            self._topology_failures += 1
            if self._topology_failures >= self.down_after:
                self._topology_retry_at = time.monotonic() + self.backoff_s
                call.add("down_events")
        finally:
            self._topology_lock.release()

    def _install(self, table: list[tuple[int, int, str, int]], *, bulk: bool) -> None:
        """Make ``table`` the slot map (under the topology lock and the ``bulk`` channel's lock).

        Why the dance on the dropped nodes: each channel's connections are used only under that
        channel's lock, so this channel closes its own at once and the other channel's are closed
        here only if that lock is free; else that channel, whose call in flight may still be using
        (or even be about to make) them, closes them at the end of that call
        (:meth:`_close_dropped`). A dropped node is ``retired`` first, so no later call connects
        to it again.
        """
        with self._state_lock:
            old = self._node_index
            nodes: list[_Node] = []
            index: dict[str, int] = {}
            slots = np.full(_NUM_CLUSTER_SLOTS, -1, dtype=np.int32)
            for lo, hi, host, port in table:
                name = f"{host}:{port}"
                j = index.get(name)
                if j is None:
                    k = old.get(name)
                    j = index[name] = len(nodes)
                    nodes.append(self._nodes[k] if k is not None else _Node(host, port, self._auth))
                slots[lo : hi + 1] = j
            dropped = [nd for nd in self._nodes if nd.name not in index]
            for nd in dropped:
                nd.retired = True
            self._nodes, self._node_index, self._slots = nodes, index, slots
            self._topology_stale = False
            if (slots >= 0).all():
                self._topology_failures = 0
            else:
                # slots no master serves (a cluster mid-failover or with slots unassigned): the map
                # is used, and re-read as a failed read would be (a call that reaches such a slot
                # marks it stale, _finish), backing off after down_after incomplete reads in a row
                self._topology_failures += 1
                if self._topology_failures >= self.down_after:
                    self._topology_retry_at = time.monotonic() + self.backoff_s
                    self._stats.add("down_events")
        if not dropped:
            return
        _close_conns(dropped, bulk)
        lock = self._lookup_lock if bulk else self._io_lock
        if lock.acquire(blocking=False):
            try:
                _close_conns(dropped, not bulk)
            finally:
                lock.release()
        else:
            with self._state_lock:
                self._to_close[not bulk] += dropped

    def _close_dropped(self, *, bulk: bool) -> None:
        """At the end of a call, under its channel's lock: close this channel's connections of the
        dropped nodes :meth:`_install` left to it."""
        if not self._to_close[bulk]:
            return
        with self._state_lock:
            nodes, self._to_close[bulk] = self._to_close[bulk], []
        _close_conns(nodes, bulk)

    @staticmethod
    def _slot_table(reply: Any, asked: str) -> list[tuple[int, int, str, int]]:
        """``[(first slot, last slot, master host, master port)]`` of a CLUSTER SLOTS reply.

        Raises:
            _ProtocolError: anything but a list of ``[int lo, int hi, [host, int port, ...], ...]``
                with ``0 <= lo <= hi < 16384``, a printable host (or ``""``/``"?"``/nil: the node
                asked), a port in ``[1, 65535]``, and at most :data:`MAX_NODES` masters.
        """
        if not isinstance(reply, list) or not reply:
            raise _ProtocolError("CLUSTER SLOTS: no slots (not a cluster, or not one yet)")
        out = []
        masters: set[tuple[str, int]] = set()
        for r in reply:
            if (
                not isinstance(r, list)
                or len(r) < 3
                or not isinstance(r[0], int)
                or not isinstance(r[1], int)
                or not isinstance(r[2], list)
                or len(r[2]) < 2
            ):
                raise _ProtocolError(f"CLUSTER SLOTS: not a slot range {str(r)[:60]}")
            lo, hi, (raw, port) = r[0], r[1], r[2][:2]
            if not 0 <= lo <= hi < _NUM_CLUSTER_SLOTS:
                raise _ProtocolError(f"CLUSTER SLOTS: bad range {lo}-{hi}")
            if raw is None or raw in (b"", b"?"):
                host = asked  # "the node you asked", Redis 7's unknown endpoint
            elif isinstance(raw, bytes) and len(raw) <= _MAX_HOST_LEN:
                host = raw.decode("utf-8", "replace")
                if not host.isprintable() or any(c.isspace() for c in host):
                    raise _ProtocolError(f"CLUSTER SLOTS: bad host {raw[:60]!r}")
            else:
                raise _ProtocolError(f"CLUSTER SLOTS: bad host {str(raw)[:60]}")
            if not isinstance(port, int) or not 0 < port < 65536:
                raise _ProtocolError(f"CLUSTER SLOTS: bad port {str(port)[:20]}")
            masters.add((host, port))
            if len(masters) > MAX_NODES:
                raise _ProtocolError(f"CLUSTER SLOTS: more than {MAX_NODES} masters")
            out.append((lo, hi, host, port))
        return out

    def _route(self, names: list[bytes], call: _Call, *, bulk: bool) -> np.ndarray:
        """int64 ``[n]`` node index of each key in the slot map, which becomes the call's
        (``call.nodes``); -1 where no node is known (a cluster not read). ``bulk``: see
        :meth:`_refresh_topology`."""
        n = len(names)
        if self.cluster and self._topology_stale:
            self._refresh_topology(call, bulk=bulk)
        slots = np.fromiter((_key_slot(k) for k in names), dtype=np.int64, count=n) if self.cluster else None
        with self._state_lock:
            call.nodes, call.index = self._nodes, self._node_index
            if slots is None:
                return np.zeros(n, dtype=np.int64)
            return self._slots[slots].astype(np.int64)

    def _moved(self, line: bytes, call: _Call) -> None:
        """``-MOVED slot host:port``: where that node is in the call's map, point the slot at it now
        (``call.moved``, and the tier's map if it is still the call's); re-read the map next call.
        Nothing else is followed: not a plain server's MOVED, nor one to an address off the map."""
        call.add("moved")
        self.last_error = line[1:].decode("utf-8", "replace")
        if not self.cluster:
            return
        parts = line.split()
        try:
            slot = int(parts[1])
            host, port = _parse_host_port(parts[2].decode(), "MOVED")
        except (IndexError, ValueError, ConfigError):
            return
        with self._state_lock:
            self._topology_stale = True
            j = call.index.get(f"{host}:{port}")
            if j is None or not 0 <= slot < _NUM_CLUSTER_SLOTS:
                return
            call.moved[slot] = j
            if self._nodes is call.nodes:
                self._slots[slot] = j

    def _ask(self, line: bytes, row: int, call: _Call) -> None:
        """``-ASK slot host:port`` for ``row``: a slot being migrated, whose key is not (or no longer) on
        the node asked. Where that node is in the call's map, ``row`` is sent there once more, after
        ``ASKING`` (``call.asked``, :meth:`_run`); the slot map is left as it is (the slot stays the
        asked node's until the migration ends, and a MOVED says so then). Nothing else is followed: not
        a plain server's ASK, nor one to an address off the map (a new master that serves no slot yet:
        the row fails, until the table lists it)."""
        call.add("asks")
        self.last_error = line[1:].decode("utf-8", "replace")
        if not self.cluster:
            return
        parts = line.split()
        try:
            host, port = _parse_host_port(parts[2].decode(), "ASK")
        except (IndexError, ValueError, ConfigError):
            return
        j = call.index.get(f"{host}:{port}")
        if j is not None:
            call.asked[row] = j

    # ------------------------------------------------------------------------------------ exchange

    def _exchange(
        self,
        node: int,
        rows: list[int],
        pieces: Callable[[int], list[Any]],
        cost: int,
        handle: Callable[[_Conn, int, _Deadline], None],
        call: _Call,
    ) -> tuple[int, int]:
        """Send the command ``pieces(r)`` of each row ``r`` of ``rows`` to one server, at most
        :data:`WINDOW_BYTES` (``cost`` per command) in flight, and read each reply in order with
        ``handle(conn, r, deadline)``.

        Returns ``(replies handled, outcome)``: ``_OK``, ``_TIMEOUT``, ``_CONN`` or ``_ERROR`` (a
        stream that cannot be trusted: closed). A failure on a connection kept from an earlier call,
        before any reply, is retried once on a new one (the server restarted meanwhile). Any other
        exception (KeyboardInterrupt, a signal handler's) goes on to the caller, the connection,
        whose replies are not all read, closed first.
        """
        nd = call.nodes[node]
        conn = nd.bulk
        n = len(rows)
        dl = _Deadline(self.timeout_s, n * cost, call.stop)
        for attempt in (0, 1):
            done = 0
            kept = conn.reusable()
            try:
                if conn.open(dl):
                    call.add("reconnects")
                sent = inflight = 0
                while done < n:
                    # refill to the window once half of it is answered: fewer, larger sendmsg calls
                    if sent < n and (sent == done or 2 * inflight <= WINDOW_BYTES):
                        bufs: list[Any] = []
                        while sent < n and (sent == done or inflight < WINDOW_BYTES):
                            bufs += pieces(rows[sent])
                            inflight += cost
                            sent += 1
                        conn.send(bufs, dl)
                    handle(conn, rows[done], dl)
                    inflight -= cost
                    done += 1
                conn.pending = False  # every reply read
                return done, _OK
            except TimeoutError as e:
                conn.close()
                self.last_error = f"{nd.name}: timeout ({e})"
                call.add("timeouts")
                return done, _TIMEOUT
            except (OSError, _Refused) as e:
                conn.close()
                self.last_error = f"{nd.name}: {e!r}"
                if kept and done == 0 and attempt == 0 and not isinstance(e, _Refused):
                    continue
                call.add("connection_errors")
                return done, _CONN
            except (_ProtocolError, ValueError) as e:
                conn.close()
                self.last_error = f"{nd.name}: protocol error ({e})"
                return done, _ERROR
            except BaseException:  # not a server problem: the caller's, raised on after the close
                conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _usable(self, node: int, call: _Call) -> int:
        """``_OK`` if the node may be tried in this call; else the code its rows fail with."""
        if node in call.failed:
            return call.failed[node]
        if node < 0:  # a slot no node serves: a map never read (connection), or one it leaves out (other)
            if time.monotonic() < self._topology_retry_at:
                code = _DOWN
                call.add("skipped_down")
            else:
                code = _UNMAPPED if call.nodes else _CONN
            call.failed[node] = code
            return code
        nd = call.nodes[node]
        if nd.retired:  # dropped from the slot map since the call routed by it: its slots moved
            call.failed[node] = _MOVED
            return _MOVED
        with self._state_lock:
            down = nd.down_until > time.monotonic()
        if down:
            call.add("skipped_down")
            call.failed[node] = _DOWN
            return _DOWN
        return _OK

    def _finish(self, call: _Call) -> None:
        """Merge the call's counters; update each touched server's health (consecutive failures)."""
        now = time.monotonic()
        with self._state_lock:
            for name, v in call.counts.items():
                self._stats.add(name, v)
            for i, code in call.failed.items():
                if i < 0:  # rows of slots the map has no node for: re-read it (see _refresh_topology)
                    self._topology_stale = True
                    continue
                if code not in _TRANSPORT:
                    continue
                nd = call.nodes[i]
                nd.failures += 1
                if nd.failures >= self.down_after:
                    # failures are not reset: after the back-off one more failure (the probe)
                    # puts the server straight back; a success resets them
                    nd.down_until = now + self.backoff_s
                    self._stats.add("down_events")
                if self.cluster:
                    self._topology_stale = True  # a failover may have moved its slots
            for i in call.touched - call.failed.keys():
                call.nodes[i].failures = 0

    def _run(
        self,
        rows: np.ndarray,
        route: np.ndarray,
        status: np.ndarray,
        pieces: Callable[[int], list[Any]],
        cost: int,
        handle: Callable[[_Conn, int, _Deadline], None],
        names: list[bytes],
        call: _Call,
    ) -> None:
        """Run ``rows`` (indices into ``status``, ``route`` and ``names``) on their servers, one bulk
        exchange per server, every server's at once (:meth:`_parallel`), then retry once, in one more
        such pass, the rows a MOVED reply sent to another node of the map (a cluster's only: see
        :meth:`_moved`; ``route`` follows it) and those an ASK reply sent to one (:meth:`_ask`: with
        ``ASKING`` before the command, and ``route`` left as it is, as an ASK holds for one command)."""
        target = route
        asking = call.asking  # rows of the retry sent after ASKING
        asking.clear()
        call.asked.clear()  # ASKs of an earlier run of the call (not followed: asked twice) are done

        def pieces_asking(r: int) -> list[Any]:
            return [_ASKING, *pieces(r)] if r in asking else pieces(r)

        def handle_asking(conn: _Conn, r: int, dl: _Deadline) -> None:
            if r in asking:
                _asking_reply(conn, dl)
            handle(conn, r, dl)

        for attempt in (0, 1):
            groups: list[tuple[int, np.ndarray]] = []
            at = target[rows]
            for node in np.unique(at).tolist():
                mine = rows[at == node]
                code = self._usable(node, call)
                if code != _OK:
                    status[mine] = code
                    continue
                groups.append((node, mine))
            p, h = (pieces_asking, handle_asking) if asking else (pieces, handle)
            jobs = [
                functools.partial(self._exchange, node, mine.tolist(), p, cost, h, call)
                for node, mine in groups
            ]
            for (node, mine), (done, code) in zip(groups, self._parallel(jobs, call, bulk=True), strict=True):
                if code == _OK:
                    call.touched.add(node)
                else:
                    status[mine[done:]] = code
                    if code in _TRANSPORT:
                        call.failed[node] = code
                    else:
                        call.touched.add(node)
            again = rows[(status[rows] == _MOVED) | (status[rows] == _ASK)]
            if attempt or not again.shape[0] or not (call.moved or call.asked):
                return
            target = route.copy()
            retry = []
            for r in again.tolist():
                if status[r] == _MOVED:
                    j = call.moved.get(_key_slot(names[r]))
                    if j is None:
                        continue
                    route[r] = j
                else:
                    j = call.asked.pop(r, None)
                    if j is None:
                        continue
                    asking.add(r)
                target[r] = j
                retry.append(r)
            rows = np.asarray(retry, dtype=np.int64)

    def _parallel(self, jobs: Sequence[Callable[[], _T]], call: _Call, *, bulk: bool) -> list[_T]:
        """``[job() for job in jobs]``, the jobs run at once: the first in this thread, the others in
        the ``bulk`` (else lookup) channel's worker threads (:meth:`_workers`), so that a call waits on
        its slowest server, not on the sum of them. Each job is one node's exchange, touching that
        node's connection of the channel and its own rows only.

        An exception out of any job or in this thread (KeyboardInterrupt) goes on to the caller once
        no job runs any more: ``call.stop`` makes every socket wait of the others fail at once (the
        longest they then take is one wait, ``timeout_s``); then every connection of the channel the
        call routed by is closed, replies read or not, and the exception raised on.
        """
        if len(jobs) < 2:
            return [job() for job in jobs]
        stop = call.stopper()  # (the jobs' deadlines read it as they start)
        workers = self._workers(bulk)
        tasks = [_Task(job) for job in jobs[1:]]
        try:
            workers.submit(tasks)
            first = jobs[0]()
            for t in tasks:
                t.wait()
            for t in tasks:
                if t.error is not None:
                    raise t.error
            return [first, *(t.result for t in tasks)]
        except BaseException:
            stop.set()
            while True:  # a second interrupt waits too: a job still running uses its connection
                try:
                    workers.cancel(tasks)
                    break
                except BaseException:
                    continue
            _close_conns(call.nodes, bulk)
            raise

    def _workers(self, bulk: bool) -> _Workers:
        """The ``bulk`` (else lookup) channel's worker threads (under that channel's lock): at most
        ``_MAX_PARALLEL - 1``, started at first need and kept; anew in a forked child (whose parent's
        threads do not run there)."""
        pid = os.getpid()
        got = self._pools.get(bulk)
        if got is not None and got[0] == pid:
            return got[1]
        pool = _Workers(_MAX_PARALLEL - 1)
        self._pools[bulk] = (pid, pool)
        return pool

    # ------------------------------------------------------------------------------------ store

    def store(
        self,
        pool: KVPool,
        pages: Any,
        slots: Any,
        keys: Any,
        parent_keys: Any,
        tokens: Any,
        namespaces: list[str | None],
    ) -> np.ndarray:
        """Write pool page ``pages[i]`` (every layer, K and V) as the value of key ``keys[i]``.

        Args:
            pool: a pool of this tier's geometry.
            pages: int32 ``[n]`` page ids in ``[1, num_pages)`` (one may repeat: read into two slots).
            slots: int32 ``[n]`` distinct slots in ``[0, num_slots)`` (the manager's index; not sent).
            keys: uint8 ``[n, 16]``; parent_keys: uint8 ``[n, 16]``; tokens: uint32 ``[n, page_size]``;
                namespaces: ``[n]`` str or None (``"*"`` is the public namespace). All go in the header.

        Returns:
            bool ``[n]``: True where the server holds the page's value now (stored, or already there:
            for an fp8/int8 pool, only if that value is of this pool's scales); False, counted by
            reason (``store_failed_*``), for a timeout, a lost connection, ``-OOM``, a server in
            back-off, a namespace too long for a header, a value of other scales left there by NX
            (``store_failed_scales``), or another error reply.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry, a namespace that is not valid Unicode), before
                anything is sent.
        """
        a = _batch.check_store(
            self.geometry,
            self.num_slots,
            self.name,
            pool,
            pages,
            slots,
            keys,
            parent_keys,
            tokens,
            namespaces,
        )
        n = a.pages.shape[0]
        status = np.full(n, _PENDING, dtype=np.int8)
        if n == 0:
            return np.zeros(0, dtype=bool)
        call = _Call()
        digest = _batch.scale_digest(pool)
        names = self._names(a.keys)
        chunk = self._chunk
        # fp8/int8: the key does not fix the value (see the module doc), so each SET is followed by a
        # GETRANGE of the scale digest of what the key holds afterwards, in the same pipeline; with a
        # TTL, by a PEXPIRE before it (the TTL of a value NX found there). In an ASK retry, each of
        # these commands goes after an ASKING of its own (call.asking).
        scaled = digest != codec.NO_SCALES
        digest_head, digest_tail = self._digest_get
        pexpire = self._pexpire
        extra = [(pexpire[0], pexpire[1])] if pexpire is not None else []
        if scaled:
            extra.append((digest_head, digest_tail))
        with self._io_lock, _ClosePending(call, bulk=True):
            route = self._route(names, call, bulk=True)
            pos = np.zeros(n, dtype=np.int64)  # [n] staging row (and header) of each row in its chunk
            oom: set[str] = set()  # nodes ("host:port") that answered -OOM in this call: the rest is not sent
            planes = self._planes(pool)
            body: dict[int, list[Any]] = {}  # row -> its payload buffers (views of the pool or stage)

            def pieces(r: int) -> list[Any]:
                cmd = [
                    self._set_head,
                    names[r],
                    self._set_mid,
                    self._hdr[int(pos[r])],
                    *body[r],
                    self._set_tail,
                ]
                asked = r in call.asking
                for head, tail in extra:
                    cmd += [_ASKING, head, names[r], tail] if asked else [head, names[r], tail]
                return cmd

            def handle(conn: _Conn, r: int, dl: _Deadline) -> None:
                line = conn.line(dl)
                asked = r in call.asking
                if pexpire is not None:
                    if asked:
                        _asking_reply(conn, dl)
                    self._expire_reply(conn, dl)
                if scaled:
                    if asked:
                        _asking_reply(conn, dl)
                    held = self._held_digest(conn, dl)
                    if line == b"$-1" and held != digest:
                        status[r] = _SCALES
                        return
                if line == b"+OK":
                    status[r] = _OK
                elif line == b"$-1":
                    status[r] = _EXISTS
                elif line[:4] == b"-OOM":
                    status[r] = _OOM
                    oom.add(f"{conn.host}:{conn.port}")
                    self.last_error = line[1:].decode("utf-8", "replace")
                elif line[:6] == b"-MOVED":
                    status[r] = _MOVED
                    self._moved(line, call)
                elif line[:5] == b"-ASK ":
                    status[r] = _ASK
                    self._ask(line, r, call)
                elif line[:1] == b"-":
                    status[r] = _ERROR
                    self.last_error = line[1:].decode("utf-8", "replace")
                else:
                    raise _ProtocolError(f"SET: unexpected reply {line[:40]!r}")

            for c in range(0, n, chunk):
                rows = np.arange(c, min(n, c + chunk))
                for node in np.unique(route[rows]).tolist():  # rows of unusable nodes: not staged
                    code = _OOM if node >= 0 and call.nodes[node].name in oom else self._usable(node, call)
                    if code != _OK:
                        status[rows[route[rows] == node]] = code
                rows = rows[status[rows] == _PENDING]
                if not rows.shape[0]:
                    continue
                pos[rows] = np.arange(rows.shape[0])
                body.clear()
                if planes is None:
                    self._codec.pages_to_rows(pool, a.pages[rows], self._stage, pos[rows])
                for r in rows.tolist():
                    j = int(pos[r])
                    # the page's 2 * num_layers pieces where they lie, or its staged row
                    body[r] = list(planes[:, a.pages[r]]) if planes is not None else [self._stage[j]]
                    try:
                        codec.pack_header(
                            self._hdr[j],
                            geometry=self.geometry,
                            key=a.keys[r].tobytes(),
                            parent_key=a.parent_keys[r].tobytes(),
                            namespace=a.namespaces[r],
                            tokens=a.tokens[r],
                            payload_len=self.payload_len,
                            payload_checksum=codec.checksum(body[r]),
                            scale_digest=digest,
                        )
                    except HeaderError:
                        status[r] = _NAMESPACE
                rows = rows[status[rows] == _PENDING]
                self._run(rows, route, status, pieces, self.value_bytes, handle, names, call)
            self._close_dropped(bulk=True)
        ok = (status == _OK) | (status == _EXISTS)
        replied = np.isin(status, (_OK, _EXISTS, _OOM, _SCALES, *_REPLIED))
        call.add("stores", int(ok.sum()))
        call.add("store_exists", int((status == _EXISTS).sum()))
        call.add("store_failed", int(n - ok.sum()))
        call.add("bytes_written", int(replied.sum()) * self.value_bytes)
        for code, reason in (
            (_TIMEOUT, "timeout"),
            (_CONN, "connection"),
            (_OOM, "oom"),
            (_DOWN, "down"),
            (_NAMESPACE, "namespace"),
            (_SCALES, "scales"),
        ):
            call.add(f"store_failed_{reason}", int((status == code).sum()))
        call.add("store_failed_other", int(np.isin(status, (*_REPLIED, _PENDING, _UNMAPPED)).sum()))
        self._finish(call)
        return ok

    @staticmethod
    def _expire_reply(conn: _Conn, dl: _Deadline) -> None:
        """Read a store's PEXPIRE reply: ``:1`` (set), ``:0`` (no such key: the SET failed, which its
        own reply says) or an error (a MOVED/ASK like the SET's: the SET's reply decides)."""
        line = conn.line(dl)
        if line[:1] not in (b":", b"-"):
            raise _ProtocolError(f"PEXPIRE: unexpected reply {line[:40]!r}")

    def _held_digest(self, conn: _Conn, dl: _Deadline) -> bytes | None:
        """The reply to a store's GETRANGE of the scale digest: the 16 bytes the key's value holds
        there, or None (no such key, a value too short to hold them, an error reply)."""
        line = conn.line(dl)
        if line[:1] == b"-":
            return None
        if line[:1] != b"$":
            raise _ProtocolError(f"GETRANGE: unexpected reply {line[:40]!r}")
        m = int(line[1:])
        if m == -1:
            return None
        if not 0 <= m <= 16:
            raise _ProtocolError(f"GETRANGE: unexpected reply {line[:40]!r}")
        conn.read_into(conn.digest[:m], dl)
        conn.skip(2, dl)
        return bytes(conn.digest) if m == 16 else None

    # ------------------------------------------------------------------------------------ load

    def load(self, pool: KVPool, slots: Any, pages: Any, keys: Any) -> np.ndarray:
        """Read the value of key ``keys[i]`` into pool page ``pages[i]``, where it is a valid page.

        Args:
            pool: a pool of this tier's geometry.
            slots: int32 ``[n]`` slots in ``[0, num_slots)`` (the manager's index; not sent).
            pages: int32 ``[n]`` distinct page ids in ``[1, num_pages)``.
            keys: uint8 ``[n, 16]`` the page keys.

        Returns:
            bool ``[n]``: False (counted as ``load_failed_*``) for a missing key, a value that fails
            its header, length, key echo or payload checksum (deleted), a value of another geometry or
            pool scales (left alone), a timeout, a lost connection, a server in back-off or an error
            reply. A False row leaves its pool page untouched. A value that is not a string (another
            client's list or hash under the key: ``WRONGTYPE``) is deleted too.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry), before anything is sent.
        """
        s, p, k = _batch.check_load(self.geometry, self.num_slots, self.name, pool, slots, pages, keys)
        del s
        n = p.shape[0]
        status = np.full(n, _PENDING, dtype=np.int8)
        if n == 0:
            return np.zeros(0, dtype=bool)
        call = _Call()
        digest = _batch.scale_digest(pool)
        names = self._names(k)
        chunk = self._chunk
        ok = np.zeros(n, dtype=bool)
        verdicts = {name: 0 for name in ("checksum", "corrupt", "geometry", "scales")}
        with self._io_lock, _ClosePending(call, bulk=True):
            route = self._route(names, call, bulk=True)
            pos = np.zeros(n, dtype=np.int64)
            head, tail = self._get_ex if self._getex else self._get_plain
            vb, hl = self.value_bytes, self.header_len

            bad: list[int] = []  # rows whose value is deleted

            def pieces(r: int) -> list[Any]:
                return [head, names[r], tail]

            def handle(conn: _Conn, r: int, dl: _Deadline) -> None:
                line = conn.line(dl)
                j = int(pos[r])
                if line == self._value_line:
                    conn.read_into(self._hdr_mv[j], dl)
                    conn.read_into(self._stage_mv[j], dl)
                    conn.skip(2, dl)
                    call.add("bytes_read", vb)
                    status[r] = _VALUE
                elif line == b"$-1":
                    status[r] = _MISSING
                elif line[:1] == b"$":
                    m = int(line[1:])
                    if m < 0:
                        raise _ProtocolError(f"GET: unexpected reply {line[:40]!r}")
                    got = min(m, hl)
                    conn.read_into(self._hdr_mv[j][:got], dl)
                    conn.skip(m - got + 2, dl)
                    call.add("bytes_read", m)
                    self._hdr_got[j] = got
                    status[r] = _BADLEN
                elif line[:6] == b"-MOVED":
                    status[r] = _MOVED
                    self._moved(line, call)
                elif line[:5] == b"-ASK ":
                    status[r] = _ASK
                    self._ask(line, r, call)
                elif line[:1] == b"-":
                    if b"unknown command" in line and self._getex:
                        self._getex = False  # a server before 6.2: plain GET from the next call
                    elif line[:10] == b"-WRONGTYPE":
                        # Not a string (another client's list, hash...): no load can ever read it,
                        # and SET NX would keep finding it: deleted, as a corrupt value is.
                        bad.append(r)
                    status[r] = _ERROR
                    self.last_error = line[1:].decode("utf-8", "replace")
                else:
                    raise _ProtocolError(f"GET: unexpected reply {line[:40]!r}")

            for c in range(0, n, chunk):
                rows = np.arange(c, min(n, c + chunk))
                pos[rows] = np.arange(rows.shape[0])
                self._run(rows, route, status, pieces, vb, handle, names, call)
                good = []
                for r in rows[np.isin(status[rows], (_VALUE, _BADLEN))].tolist():
                    verdict, bad_header = self._verify(
                        int(pos[r]), status[r] == _VALUE, k[r].tobytes(), digest
                    )
                    call.add("checksum_mismatches", int(bad_header))
                    if verdict == "ok":
                        good.append(r)
                    else:
                        verdicts[verdict] += 1
                        if verdict in ("checksum", "corrupt"):
                            bad.append(r)
                g = np.asarray(good, dtype=np.int64)
                self._codec.rows_to_pages(pool, self._stage, pos[g], p[g])
                ok[g] = True
            if bad:
                self._delete(np.asarray(bad, dtype=np.int64), route, names, call)
            self._close_dropped(bulk=True)
        num_ok = int(ok.sum())
        call.add("loads", num_ok)
        call.add("load_failed", n - num_ok)
        call.add("load_failed_missing", int((status == _MISSING).sum()))
        for name, v in verdicts.items():
            call.add(f"load_failed_{name}", v)
        call.add("checksum_mismatches", verdicts["checksum"])
        for code, reason in ((_TIMEOUT, "timeout"), (_CONN, "connection"), (_DOWN, "down")):
            call.add(f"load_failed_{reason}", int((status == code).sum()))
        call.add("load_failed_other", int(np.isin(status, (*_REPLIED, _PENDING, _UNMAPPED)).sum()))
        self._finish(call)
        return ok

    def _verify(self, j: int, full: bool, key: bytes, digest: bytes) -> tuple[str, bool]:
        """``(verdict, header checksum failed)``: verdict ``"ok"`` or why the value staged at row ``j``
        (header ``_hdr[j]``) is not page ``key``: ``"checksum"``, ``"corrupt"`` (both deleted),
        ``"geometry"`` or ``"scales"`` (left alone).

        The order is what makes a value deletable: one of another geometry is some other writer's
        (its key cannot be ours by accident: the tag differs), so it is left alone; one of ours with
        a wrong length or key echo is not what this key can hold, whatever its scales, so it is
        corrupt; only a whole value of this page under other scales is another instance's, kept.
        """
        hdr = self._hdr[j]
        if full:
            expected = self._check.payload_checksum(hdr, key, digest)
            if expected is not None:
                return ("ok" if codec.checksum(self._stage[j]) == expected else "checksum"), False
            got = self.header_len
        else:
            got = int(self._hdr_got[j])
        # Not a valid header of this page: find out why (the slow path, failures only).
        try:
            hlen = codec.parse_header_prefix(hdr[:got])
            if hlen != self.header_len:
                return "geometry", False  # another geometry's (longer or shorter) header
            if got < hlen:
                return "corrupt", False  # truncated
            h = codec.parse_header(hdr)
        except HeaderError as e:
            return "corrupt", e.reason == "checksum"
        if h.geometry != self.geometry or h.payload_len != self.payload_len:
            return "geometry", False
        if not full or h.key != key:
            return "corrupt", False  # our geometry but a wrong length or key echo
        if h.scale_digest != digest:
            return "scales", False
        return "corrupt", False  # not what HeaderCheck accepts, though parse_header did

    def _delete(self, rows: np.ndarray, route: np.ndarray, names: list[bytes], call: _Call) -> None:
        status = np.full(len(names), _PENDING, dtype=np.int8)

        def handle(conn: _Conn, r: int, dl: _Deadline) -> None:
            line = conn.line(dl)
            if line[:1] == b":":
                call.add("deleted", int(line[1:]))
                status[r] = _OK
            elif line[:6] == b"-MOVED":
                status[r] = _MOVED
                self._moved(line, call)
            elif line[:5] == b"-ASK ":  # a value found where an ASK led: deleted there
                status[r] = _ASK
                self._ask(line, r, call)
            elif line[:1] == b"-":
                status[r] = _ERROR
            else:
                raise _ProtocolError(f"DEL: unexpected reply {line[:40]!r}")

        self._run(rows, route, status, lambda r: [self._del_head, names[r], b"\r\n"], 0, handle, names, call)

    # ------------------------------------------------------------------------------------ exists

    def exists(self, keys: Any) -> int:
        """How many leading keys of ``keys`` (uint8 ``[m, 16]`` page keys, a prompt's in order) the
        server holds, asking at most ``max_lookup_keys`` of them in one pipelined round trip (per
        cluster node, every node asked at once). A key on a server that is down, times out
        or errs counts as absent, so the answer is never more than what a load would reach.

        It asks whether each key exists, not what its value holds: a value a load would refuse (an
        fp8/int8 page stored by an instance with other pool scales, a corrupt value) is counted, and
        that load then misses (``load_failed_scales``, ``load_failed_corrupt``); the manager cuts
        the hit there and recomputes. A store of such a page under this pool's scales is reported
        as failed (``store_failed_scales``), so it does not look stored.

        Raises:
            InvalidDTypeError, InvalidArgumentError: keys that are not a uint8 ``[m, 16]`` array.
        """
        return self.exists_runs([keys])[0]

    def exists_runs(self, runs: Sequence[Any]) -> list[int]:
        """:meth:`exists` of several runs of keys (each a uint8 ``[m, 16]`` array: candidate key
        chains of one prompt) in one pipelined round trip: the leading keys the server holds, per
        run, each run asked for at most ``max_lookup_keys`` keys.

        Raises:
            InvalidDTypeError, InvalidArgumentError: ``runs`` not a list or tuple, or a run that is not
                a uint8 ``[m, 16]`` array.
        """
        if not isinstance(runs, list | tuple):
            raise InvalidDTypeError(
                f"runs: expected a list or tuple of key arrays, got {type(runs).__name__}"
            )
        arrays = [
            index_array(keys, "keys", dtype=np.uint8, trailing=(16,), what="key bytes") for keys in runs
        ]
        sizes = [min(k.shape[0], self.max_lookup_keys) for k in arrays]
        call = _Call()
        call.add("lookups", len(arrays))
        m = sum(sizes)
        if m == 0:
            self._finish(call)
            return [0] * len(arrays)
        names = [name for k, n in zip(arrays, sizes, strict=True) for name in self._names(k[:n])]
        found = np.zeros(m, dtype=bool)
        asked: dict[int, int] = {}  # key index -> the node an ASK sent it to
        with self._lookup_lock, _ClosePending(call, bulk=False):
            route = self._route(names, call, bulk=False)
            groups = [(node, np.flatnonzero(route == node).tolist()) for node in np.unique(route).tolist()]
            # Every node's exchange at once; then once more the keys a reply sent elsewhere: after
            # ASKING those an ASK sent to a node, and those of a slot a MOVED pointed at another node.
            passes = [(groups, False)]
            for k, (groups, asking) in enumerate(passes):
                groups = [(node, mine) for node, mine in groups if self._usable(node, call) == _OK]
                call.touched.update(self._lookup_pass(groups, names, found, call, asking=asking))
                if k:
                    continue  # (followed once, as store and load do)
                asked, call.asked = call.asked, {}
                moved = {}
                if call.moved:
                    for i in np.flatnonzero(~found).tolist():
                        j = call.moved.get(_key_slot(names[i]))
                        if j is not None and j != route[i] and i not in asked:
                            moved[i] = j
                for rows, after_asking in ((asked, True), (moved, False)):
                    per: dict[int, list[int]] = {}
                    for i, j in sorted(rows.items()):
                        per.setdefault(j, []).append(i)
                    if per:
                        passes.append((sorted(per.items()), after_asking))
                asked = {**asked, **moved}
            self._close_dropped(bulk=False)
        call.add("lookup_keys", m)
        leads = []
        at = 0
        for n in sizes:
            run = found[at : at + n]
            lead = int(n if run.all() else np.argmin(run))
            leads.append(lead)
            call.add("lookup_hit_keys", lead)
            if lead < n:
                node = asked.get(at + lead, int(route[at + lead]))
                if node < 0 or node in call.failed:
                    call.add("lookup_failed")  # the answer stops at a key nobody could ask about
            at += n
        self._finish(call)
        return leads

    def _lookup_pass(
        self,
        groups: list[tuple[int, list[int]]],
        names: list[bytes],
        found: np.ndarray,
        call: _Call,
        *,
        asking: bool,
    ) -> list[int]:
        """Ask each node ``node`` of ``groups`` whether each key ``names[i]`` of its ``mine`` exists
        (each after ``ASKING`` if ``asking``), into ``found``; the nodes whose every reply came.

        Every node at once, in one thread while the connections are kept (the common case): the
        nodes to connect to are connected to at once (:meth:`_parallel`; a hand-shake waits for its
        reply), then every node's commands are sent, then the replies are read in the order they
        come (``poll``), so that a stalled node costs one ``timeout_s``, whatever the others do. The
        whole pass has one deadline (``timeout_s`` x 2); a node that sent nothing ``timeout_s`` after
        the last send has timed out.
        """
        fresh = {node for node, _ in groups if not call.nodes[node].lookup.reusable()}
        dl = _Deadline(self.timeout_s, 0, call.stopper() if len(fresh) > 1 else None)
        if len(fresh) > 1:  # (one is connected to by its send below)
            opens = [
                functools.partial(self._lookup_io, node, [], None, found, dl, call) for node in sorted(fresh)
            ]
            self._parallel(opens, call, bulk=False)
        pre = _ASKING + self._exists_head if asking else self._exists_head
        sent = []
        for node, mine in groups:
            if node in call.failed:
                continue
            cmds = [b"".join(pre + names[i] + b"\r\n" for i in mine)]
            kept = node not in fresh and call.nodes[node].lookup.reusable()
            if self._lookup_io(node, cmds, None, found, dl, call, last=not kept, asking=asking):
                sent.append((node, mine, cmds, kept))

        def read(node: int, mine: list[int], cmds: list[bytes], kept: bool) -> bool:
            ok = self._lookup_io(node, None, mine, found, dl, call, last=not kept, asking=asking)
            if not ok and node not in call.failed:  # a dead kept connection: once more, anew
                ok = self._lookup_io(node, cmds, mine, found, dl, call, last=True, asking=asking)
            return ok

        if len(sent) == 1:  # one node (a plain server): read it, waiting
            return [sent[0][0]] if read(*sent[0]) else []
        # A node is read once its whole reply is here (_Conn.gather: one line per EXISTS, and per
        # ASKING), so one that trickles its reply never holds up the others'. A node that sent
        # nothing by `until` has timed out; one that began its reply has until the pass's deadline.
        until = min(dl.end, time.monotonic() + self.timeout_s)
        lines = 2 if asking else 1
        poller = select.poll()
        waiting: dict[int, tuple[int, list[int], list[bytes], bool]] = {}
        started: set[int] = set()  # fds of the waiting nodes whose reply began
        answered = []
        ready = sent
        while True:
            for item in ready:
                conn = call.nodes[item[0]].lookup
                if conn.sock is not None and not conn.gather(lines * len(item[1])):
                    fd = conn.sock.fileno()
                    poller.register(fd, select.POLLIN)
                    waiting[fd] = item
                    if conn.buffered():
                        started.add(fd)
                elif read(*item):
                    answered.append(item[0])
            if not waiting:
                return answered
            left = until - time.monotonic()
            events = poller.poll(max(0, math.ceil(left * 1000)))
            if not events:
                late = [fd for fd in waiting if fd not in started]
                if until >= dl.end or len(late) == len(waiting):
                    break
                self._lookup_timed_out([waiting.pop(fd) for fd in late], call)
                for fd in late:
                    poller.unregister(fd)
                until = dl.end
                continue
            ready = []
            for fd, _ in events:
                poller.unregister(fd)
                started.discard(fd)
                ready.append(waiting.pop(fd))
        self._lookup_timed_out(list(waiting.values()), call)  # nothing (or not all) came in time
        return answered

    def _lookup_timed_out(self, items: list[tuple[int, list[int], list[bytes], bool]], call: _Call) -> None:
        """The nodes of ``items`` (lookup pass items) timed out: their connections closed (their
        replies may still come), each counted."""
        for node, _, _, _ in items:
            nd = call.nodes[node]
            nd.lookup.close()
            self.last_error = f"{nd.name}: timeout"
            call.add("timeouts")
            call.failed[node] = _TIMEOUT

    def _lookup_io(
        self,
        node: int,
        cmds: list[bytes] | None,
        mine: list[int] | None,
        found: np.ndarray,
        dl: _Deadline,
        call: _Call,
        *,
        last: bool = True,
        asking: bool = False,
    ) -> bool:
        """Connect if need be and send ``cmds`` (if given; ``[]``: only connect) on the node's lookup
        connection, then read one EXISTS reply per key index of ``mine`` (if given) into ``found``,
        each after the reply to its ``ASKING`` if ``asking``. False on a failure, recorded in
        ``call.failed`` except for a connection failure before any reply when not ``last`` (a
        connection kept from an earlier call that died meanwhile: sending, this retries once on a new
        one; reading, the caller does). Any other exception goes on to the caller, the connection
        closed first (as in :meth:`_exchange`)."""
        nd = call.nodes[node]
        conn = nd.lookup
        done = 0
        try:
            if cmds is not None:
                if conn.open(dl):
                    call.add("reconnects")
                if cmds:
                    conn.send(cmds, dl)
            fast = conn.flags(len(mine), dl) if mine and not asking else None
            if fast is not None:
                found[mine] = fast
                conn.pending = False  # every reply read
                return True
            for i in mine or ():
                if asking:
                    _asking_reply(conn, dl)
                line = conn.line(dl)
                if line == b":0" or line == b":1":  # EXISTS of one key: nothing else is a count of it
                    found[i] = line == b":1"
                elif line[:1] == b":":
                    raise _ProtocolError(f"EXISTS: unexpected reply {line[:40]!r}")
                elif line[:1] == b"-":
                    if line[:6] == b"-MOVED":
                        self._moved(line, call)
                    elif line[:5] == b"-ASK " and not asking:
                        self._ask(line, i, call)
                    self.last_error = line[1:].decode("utf-8", "replace")
                else:
                    raise _ProtocolError(f"EXISTS: unexpected reply {line[:40]!r}")
                done += 1
            if mine is not None:
                conn.pending = False  # every reply read (else they are still to be read)
            return True
        except TimeoutError:
            conn.close()
            self.last_error = f"{nd.name}: timeout"
            call.add("timeouts")
            call.failed[node] = _TIMEOUT
        except (OSError, _Refused) as e:
            conn.close()
            self.last_error = f"{nd.name}: {e!r}"
            if not last and done == 0 and not isinstance(e, _Refused):
                if cmds is not None:  # a dead kept connection: send again on a new one
                    return self._lookup_io(node, cmds, mine, found, dl, call, last=True, asking=asking)
                return False  # the caller resends
            call.add("connection_errors")
            call.failed[node] = _CONN
        except (_ProtocolError, ValueError) as e:
            conn.close()
            self.last_error = f"{nd.name}: protocol error ({e})"
            call.failed[node] = _ERROR
        except BaseException:  # not a server problem (KeyboardInterrupt): raised on after the close
            conn.close()
            raise
        return False

    # ------------------------------------------------------------------------------------ rest

    def stats(self) -> dict[str, int]:
        """Counters (flat, every name always present; see ``_STAT_NAMES`` in the source for each)."""
        now = time.monotonic()
        with self._state_lock:
            out = self._stats.snapshot()
            nodes = len(self._nodes)
            down = sum(1 for nd in self._nodes if nd.down_until > now)
        out.update(num_slots=self.num_slots, nodes=nodes, nodes_down=down)
        return out

    def close(self) -> None:
        """Close every connection and end the worker threads (a later call reconnects, and starts
        threads again where it needs them)."""
        with self._io_lock, self._lookup_lock, self._state_lock:
            for nd in self._nodes:
                nd.close()
            for nodes in self._to_close.values():
                for nd in nodes:
                    nd.close()
                nodes.clear()
            pools, self._pools = self._pools, {}
        _close_pools(pools)  # idle: no call is in flight under the two locks

    def __enter__(self) -> RedisTier:
        return self

    def __del__(self) -> None:
        _close_pools(getattr(self, "_pools", {}))  # (its threads would wait on its queue for good)
        for nd in getattr(self, "_nodes", ()):
            nd.close()
        for nodes in getattr(self, "_to_close", {}).values():
            for nd in nodes:
                nd.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        q = f", quantize={self.quantize!r}" if self.quantize else ""
        where = ",".join(f"{h}:{p}" for h, p in self._startup)
        kind = "redis+cluster" if self.cluster else "redis"
        return (
            f"RedisTier(name={self.name!r}, url='{kind}://{where}', prefix={self.prefix!r}, "
            f"geometry_tag={self.geometry_tag!r}, value_bytes={self.value_bytes}{q})"
        )


def _int_arg(x: Any, name: str, low: int, high: int | None = None) -> int:
    if (
        isinstance(x, bool)
        or not isinstance(x, int | np.integer)
        or x < low
        or (high is not None and x > high)
    ):
        bound = f">= {low}" if high is None else f"in [{low}, {high:,}]"
        raise ConfigError(f"{name}: expected an integer {bound}, got {x!r:.60}")
    return int(x)


def _float_arg(x: Any, name: str, *, positive: bool, maximum: float = math.inf) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating):
        raise ConfigError(f"{name}: expected a number, got {x!r}")
    try:
        v = float(x)
    except OverflowError:  # an integer beyond any double
        v = math.inf
    if not math.isfinite(v) or v < 0 or (positive and v == 0) or v > maximum:
        bound = f" and <= {maximum:g}" if maximum < math.inf else ""
        raise ConfigError(
            f"{name}: expected a finite number {'> 0' if positive else '>= 0'}{bound}, got {x!r:.60}"
        )
    return v
