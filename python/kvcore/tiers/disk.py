"""The disk tier: one self-describing file per slot, written so that a torn write is never visible.

Why one file per slot: a slot is rewritten under a temp name in the same directory and then renamed into
place, and POSIX renames are atomic, so a reader (a load, or this directory after a crash and restart)
finds the slot's old page, no page, or the new page, never a mix (LMCache#207, #4991: failed and partial
stores that stayed visible). The old file is itself renamed to the temp name first and overwritten in
place, which empties the slot atomically and frees no blocks (see ``DiskTier._write_one``). A crash
leaves at most a temp file, removed at the next open.

Every file carries its key, parent key, namespace, tokens and geometry (:mod:`kvcore.tiers.codec` has the
byte layout) plus XXH3-128 checksums of the header and of the payload, so the directory alone is a
restart index (:meth:`DiskTier.entries`) and a flipped bit reads as a miss, never as K/V. Headers are
verified at open (fast: one small read per file); payload checksums at load, where the payload is read
anyway. An unquantized page of a NumPy pool is written from, and read straight back into, its pool
page (``writev``/``readv`` of its ``2 * num_layers`` contiguous pieces, no staging copy); a load
reads its files on a few threads, so that one file's checksum overlaps another's read.

Failure policy: an I/O error (ENOSPC, EACCES, EIO, ...) never raises out of ``store``/``load``; the row
is False and counted by reason in :meth:`DiskTier.stats`. Caller mistakes (shapes, ranges, a pool of
another geometry) raise before anything is touched. An exception in the calling thread that is no I/O
error (KeyboardInterrupt, whatever a signal handler raises) goes on to the caller, but a load raises it
only once none of its reader threads can still write into the pool (``_Crew``).

Whatever sits at a slot's or a temp file's name may have been put there by someone else, so no open
follows a symlink (``O_NOFOLLOW``) or waits (``O_NONBLOCK``: a FIFO would hang the call under the
tier's lock), every descriptor is checked to be a regular file (``fstat``), an old file is written
over in place only if the descriptor is on the very inode this tier made or validated for that slot
(its ``st_dev, st_ino``, remembered) and it has no other hard link, and a new temp file is made with
``O_EXCL``: nothing outside the directory is ever written or truncated. The directory itself is
resolved by name once, at open, and every later call goes through that descriptor (``dir_fd``), so
swapping the directory for a symlink later moves nothing elsewhere. A link, FIFO, socket or directory
found at a slot's name fails its load (``load_failed_io``) and is removed (the entry, never what it
points to; a directory only if empty); a store replaces it (a directory only if empty: else the store
fails, counted).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from kvcore.exceptions import ConfigError, OutOfMemoryError
from kvcore.pool import KVPool
from kvcore.pool.checks import index_array
from kvcore.tiers import _batch, codec
from kvcore.tiers.codec import Geometry, HeaderError

__all__ = ["DiskEntry", "DiskTier", "slot_filename"]

_SLOT_RE = re.compile(r"slot-([0-9]{8,})\.kv")  # [0-9], not \d: other digits are not names of ours
_TEMP_RE = re.compile(r"slot-([0-9]{8,})\.kv\.tmp")
_TEMP_SUFFIX = ".tmp"
_LOCK_NAME = "tier.lock"
# Flags of every open of a slot or temp file: never through a symlink, never waiting (a FIFO)
_SAFE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# open() errors that mean "not a regular file": a symlink (ELOOP), a FIFO without a reader (ENXIO), a
# directory opened for writing (EISDIR), a device without its driver (ENODEV)
_NOT_A_FILE = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENODEV})
PREFETCH_BYTES = 32 << 20  # read-ahead requested beyond the file being loaded (page cache, not ours)
_PREFETCH_MIN_FILES = 4  # ... but at least this many files
READERS = 4  # threads reading the files of one load at once (see DiskTier._read_files)
_PAGES_PER_READER = 8  # ... but at most one thread per this many files (a thread start costs ~50 us)

# buffers one readv/writev takes (a page is 2 * num_layers pieces and a header); POSIX promises 16
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024)

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_PERMISSION = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})

# A load's verdict on one file -> (counters added, what becomes of its slot: "" it stays as it is,
# "empty" it is marked empty, "drop" its file is removed and it is marked empty)
_LOAD_VERDICTS: dict[str, tuple[tuple[str, ...], str]] = {
    "ok": ((), ""),
    "io": (("load_failed_io",), ""),
    "missing": (("load_failed_io",), "empty"),  # ENOENT: removed behind our back
    "special": (("load_failed_io",), "drop"),  # a symlink, FIFO, directory, ... put there behind our back
    "geometry": (("load_failed_geometry",), "empty"),  # not a file of this geometry: left alone
    "corrupt": (("load_failed_corrupt",), "drop"),
    "header_checksum": (("load_failed_corrupt", "checksum_mismatches"), "drop"),
    "key": (("load_failed_key",), ""),
    "scales": (("load_failed_scales",), ""),
    "checksum": (("load_failed_checksum", "checksum_mismatches"), "drop"),
}

_STAT_NAMES = (
    "num_slots",
    "slots_used",
    "bytes",
    "capacity_bytes",
    "stores",
    "store_failed",
    "store_failed_no_space",  # ENOSPC, EDQUOT, EFBIG
    "store_failed_permission",  # EACCES, EPERM, EROFS
    "store_failed_io",  # EIO
    "store_failed_other",  # any other OSError (EMFILE, ENAMETOOLONG, ...)
    "store_failed_namespace",  # a namespace longer than a header holds (codec.namespace_room)
    "loads",
    "load_failed",
    "load_failed_empty",  # the slot holds nothing (never stored, forgotten, or dropped on a failure)
    "load_failed_key",  # the slot holds another page
    "load_failed_geometry",  # the file is of another geometry, dtype or quantization
    "load_failed_scales",  # an fp8/int8 page stored under other pool scales
    "load_failed_checksum",  # payload checksum mismatch (file removed)
    "load_failed_corrupt",  # header unreadable or file truncated since open (file removed)
    "load_failed_io",  # an OSError while reading (ENOENT: the slot is marked empty), or not a regular file
    "checksum_mismatches",  # header or payload checksums that failed, at open or load
    "bytes_written",
    "bytes_read",
    "forgets",
    "remove_failed",  # entries that should have gone but could not (unlink failed, a non-empty directory)
    "fsync_failed",  # directory fsyncs that failed (fsync=True): the renames may not be durable
    "open_entries",  # valid files found at open
    "open_removed",  # files removed at open, all reasons
    "open_removed_temp",  # temp files a crash left (only those removed: a failure is remove_failed)
    "open_removed_header",  # bad magic, version, header checksum or fields
    "open_removed_truncated",  # a size that disagrees with the header
    "open_removed_out_of_range",  # a valid file (of this geometry or another) at a slot >= num_slots
    "open_foreign",  # files of another geometry or format version at slots < num_slots: left until stored
    "open_unreadable",  # files that could not be read at open: left alone, not listed
)


def slot_filename(slot: int) -> str:
    """The file name of a slot: ``slot-00000042.kv`` (8 digits at least)."""
    return f"slot-{slot:08d}.kv"


class DiskEntry(NamedTuple):
    """One valid file of the tier: what the Rust side needs to re-index it (``restore_tier``)."""

    slot: int
    key: bytes  # 16 bytes
    parent_key: bytes  # 16 bytes
    namespace: str | None  # None (default), "*" (public) or a name
    tokens: np.ndarray  # uint32 [page_size]


def _reason(e: OSError) -> str:
    if e.errno in _NO_SPACE:
        return "store_failed_no_space"
    if e.errno in _PERMISSION:
        return "store_failed_permission"
    if e.errno == errno.EIO:
        return "store_failed_io"
    return "store_failed_other"


def _trim(views: list[Any], n: int) -> None:
    """Drop the first ``n`` bytes of a list of buffers (after a partial readv/writev)."""
    while views and n >= len(views[0]):
        n -= len(views.pop(0))
    if views and n:
        views[0] = views[0][n:]


def _write_all(fd: int, bufs: list[Any]) -> None:
    """Write every buffer (1-D uint8 arrays or memoryviews), in order, with as few ``writev`` calls as
    the kernel allows (one, normally)."""
    views = [b for b in bufs if len(b)]
    while views:
        n = os.writev(fd, views if len(views) <= _IOV_MAX else views[:_IOV_MAX])
        if n <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        _trim(views, n)


def _read_all(fd: int, bufs: list[Any], total: int) -> int:
    """Fill the buffers (1-D uint8 arrays or memoryviews, ``total`` bytes in all) in order from ``fd``,
    ``readv`` straight into them; returns the bytes read (less than ``total`` only at end of file)."""
    n = os.readv(fd, bufs if len(bufs) <= _IOV_MAX else bufs[:_IOV_MAX])
    if n == total or n == 0:
        return n  # one call, normally
    views = [b for b in bufs if len(b)]
    _trim(views, n)
    done = n
    while views:
        n = os.readv(fd, views if len(views) <= _IOV_MAX else views[:_IOV_MAX])
        if n == 0:
            break
        done += n
        _trim(views, n)
    return done


class _Crew:
    """Helper threads of one call, which the call waits for before it returns or raises, however it
    is interrupted (:meth:`wait`); ``stop`` asks them to end early (each checks it between files).

    Why not ``Thread.join`` alone: an exception raised in the waiting thread during ``join`` (a signal
    handler's: KeyboardInterrupt) leaves the join, and on CPython 3.11 even marks the thread stopped
    while it still runs (``is_alive()`` False; a second ``join`` returns at once). So each helper also
    counts itself in ``running`` when it begins and in ``finished`` when it ends, and a wait that was
    interrupted, or a call that failed, waits on those counts instead.
    """

    __slots__ = ("finished", "running", "started", "stop")

    def __init__(self) -> None:
        self.stop = False
        self.started: list[threading.Thread] = []  # threads whose start() returned
        self.running: list[int] = []  # one item per helper that began (its first step)
        self.finished: list[int] = []  # one item per helper that ended (its last step)

    def start(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=self._run, args=(target,), name=name, daemon=True)
        t.start()
        self.started.append(t)

    def _run(self, target: Callable[[], None]) -> None:
        # Counted before it reads stop, which a failing call sets before it reads the count: either
        # the call waits for this thread, or this thread sees stop and does nothing (the GIL orders
        # the two). A thread whose start() was interrupted is waited for the same way.
        self.running.append(1)
        try:
            if not self.stop:
                target()
        finally:
            self.finished.append(1)

    def wait(self) -> BaseException | None:
        """Return once no helper can do anything more (set ``stop`` first if the call failed).

        An exception raised here meanwhile (KeyboardInterrupt) sets ``stop`` and the wait goes on;
        the first one is returned (the caller raises it, unless it is raising another already), else
        None.
        """
        interrupt: BaseException | None = None
        try:
            for t in self.started:
                t.join()  # the common case: exact and cheap
        except BaseException as e:  # interrupted: the helpers stop; their counts tell when
            self.stop = True
            interrupt = e
        while True:
            try:
                while len(self.finished) < len(self.running):
                    time.sleep(0.001)
                return interrupt
            except BaseException as e:  # interrupted again: keep waiting
                self.stop = True
                if interrupt is None:
                    interrupt = e


class _Prefetch:
    """A helper thread that keeps ``POSIX_FADV_WILLNEED`` read-ahead requested for the next files of
    a load, at most :data:`PREFETCH_BYTES` ahead of the file being read.

    Why a thread: WILLNEED submits the reads synchronously (about 0.2 ms per 0.5 MiB file here), so
    from a loading thread it would only move the wait; from a helper thread it keeps the device
    busy while the loading threads read and check. One file after another at queue depth 1 read
    about half as fast, cold, as one big file with the kernel's read-ahead; the reader threads
    alone (:data:`READERS`) did not make up for it.
    """

    def __init__(self, paths: list[str], dir_fd: int, file_bytes: int) -> None:
        self._paths = paths  # names in the directory dir_fd (open while the load runs)
        self._dir_fd = dir_fd
        self._read = 0  # files the loaders have consumed, about (a hint: the helper skips those)
        self._consumed = itertools.count(1)  # next() is atomic: several loading threads count here
        self._room = threading.Semaphore(max(_PREFETCH_MIN_FILES, PREFETCH_BYTES // file_bytes))
        self._crew = _Crew()
        self._crew.start(self._run, "kvcore-disk-prefetch")

    def _run(self) -> None:
        for i, path in enumerate(self._paths):
            self._room.acquire()
            if self._crew.stop:
                return
            if i < self._read:
                continue  # already read: the loader was faster (a warm page cache)
            try:
                fd = os.open(path, os.O_RDONLY | _SAFE_OPEN, dir_fd=self._dir_fd)
            except OSError:
                continue  # the load reports it
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    def consumed(self) -> None:
        """A loading thread has read one more file: the helper may request one more."""
        self._read = next(self._consumed)
        self._room.release()

    def close(self) -> None:
        """Stop the helper and wait for it (on, if interrupted: the interruption is raised after)."""
        self._crew.stop = True
        self._room.release()
        interrupt = self._crew.wait()
        if interrupt is not None:
            raise interrupt


class DiskTier:
    """Pages of pools of one geometry in ``path``, one file per slot, at most ``capacity_bytes`` in all.

    Args:
        path: the directory (created if missing; resolved once, here: see the module doc). One
            DiskTier per directory at a time: an advisory lock (``flock`` of ``tier.lock``) makes a
            second opener fail with ConfigError. Advisory only: deleting ``tier.lock`` while a tier
            holds it lets a second tier open the directory (and the two then undo each other's files).
        capacity_bytes: the disk budget; ``num_slots = capacity_bytes // file_bytes``.
        pool: a pool of the geometry stored.
        quantize: None, ``"int8"`` or ``"int4"`` (KIVI, fp16/bf16 pools; :mod:`kvcore.tiers.codec`).
        name: the tier's name in stats and logs.
        fsync: fsync every file before its rename, and the directory after each batch (durable across
            power loss; slower). Without it a power loss can leave short or zero-filled files, which the
            header checks at open and the payload checksum at load turn into misses.

    Side effects: creates the directory and the lock file and keeps both open until :meth:`close`;
    scans the directory (see :meth:`entries`),
    removing temp files, corrupt or truncated files and files at slots beyond ``num_slots`` (files
    of another geometry, quantization or format version at slots of ours are left until the slot is
    stored: another configuration or kvcore version may use the directory again). Pages of
    an unquantized NumPy pool go straight between the pool and the files (``writev``/``readv`` of
    their pieces); a quantized tier or a GPU pool stages them in a buffer of up to 64 MiB (pinned on
    the GPU backend), allocated at the first such call.

    Raises:
        ConfigError: a capacity below one file or above the size of the filesystem (a warning,
            ResourceWarning, when its free space and the tier's files cannot hold every slot), a
            path that is not a str or os.PathLike, not a usable directory (a NUL byte, a name the
            filesystem cannot encode, no permission) or is in use by another DiskTier, an unknown
            quantization or quantization of an fp8/int8 pool.
        OutOfMemoryError: the slot index (17 bytes a slot) does not fit in host memory.

    Calls are serialized by a lock. One process: a forked child that calls ``store``, ``load``,
    ``forget`` or ``entries`` gets ConfigError (it would share the parent's lock but not its index);
    it opens a DiskTier of its own, on its own directory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        pool: KVPool,
        *,
        quantize: str | None = None,
        name: str = "disk",
        fsync: bool = False,
    ) -> None:
        self.geometry = Geometry.of_pool(pool, quantize)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name: expected a non-empty string, got {name!r}")
        self.name = name
        self.quantize = quantize
        self.fsync = bool(fsync)
        self._pid = os.getpid()  # the process that holds the directory (see _check_process)
        self._codec = _batch.RowCodec(self.geometry)
        self.header_len = codec.header_len(self.geometry)  # bytes before the payload in every file
        self.payload_len = self._codec.row_bytes  # bytes of payload in every file
        self.file_bytes = self.header_len + self.payload_len  # bytes of every slot file
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int | np.integer):
            raise ConfigError(f"capacity_bytes: expected an integer, got {capacity_bytes!r}")
        self.num_slots = int(capacity_bytes) // self.file_bytes
        if self.num_slots < 1:
            raise ConfigError(
                f"capacity_bytes: {capacity_bytes} bytes hold no slot file of {self.file_bytes} bytes "
                f"({self.header_len} header + {self.payload_len} payload)"
            )
        self._dir_fd = self._lock_fd = -1
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise ConfigError(f"path: expected a str or os.PathLike, got {path!r}") from None
        try:
            os.makedirs(self.path, exist_ok=True)
            # the directory, resolved by name once: every later call goes through this descriptor
            self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._lock_fd = os.open(
                _LOCK_NAME,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=self._dir_fd,
            )
        except (OSError, ValueError) as e:  # ValueError: a NUL byte, a name the filesystem cannot encode
            self.close()
            raise ConfigError(f"path: {self.path!r} is not a usable directory ({e})") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self.close()
            raise ConfigError(f"path: {self.path!r} is in use by another DiskTier ({e})") from None

        self._check_room(int(capacity_bytes))  # before the per-slot arrays: a budget past the disk
        self._stats = _batch.Counters(_STAT_NAMES)
        self._lock = threading.Lock()
        try:
            self._used = np.zeros(self.num_slots, dtype=bool)  # [num_slots] bool: a valid file of ours
            self._keys = np.zeros((self.num_slots, 16), dtype=np.uint8)  # [num_slots, 16] its page key
        except MemoryError:
            self.close()
            raise OutOfMemoryError(
                f"{name}: the index of {self.num_slots} slots ({17 * self.num_slots} bytes) does not fit "
                "in host memory"
            ) from None
        # slot -> (st_dev, st_ino) of its file, for every used slot: the one inode a store may write
        # over in place (made or validated by this tier; see _open_temp)
        self._inodes: dict[int, tuple[int, int]] = {}
        # [chunk_pages, payload_len] uint8: staged payloads (quantized, or a GPU pool; see _staging)
        self._stage: np.ndarray | None = None
        self._whdr = bytearray(self.header_len)  # the header being written
        self._whdr_view = memoryview(self._whdr)
        self._header_check = codec.HeaderCheck(self.geometry, self.payload_len)
        self._foreign_bytes = 0  # bytes of the files of another geometry at slots of ours, at open
        self._entries = self._scan()
        self._warn_if_short()

    # ------------------------------------------------------------------------------------ paths

    def _check_room(self, capacity_bytes: int) -> None:
        """A budget larger than the whole filesystem is a mistake: the manager would count slots as
        free that no file can ever fill, never evict, and stop storing for good once the disk is
        full. Refused (the directory is closed and unlocked)."""
        try:
            fs = os.statvfs(self._dir_fd)
        except OSError:  # no statistics (an exotic filesystem): nothing to check against
            return
        total = fs.f_blocks * fs.f_frsize
        if total and capacity_bytes > total:
            self.close()
            raise ConfigError(
                f"capacity_bytes: {capacity_bytes} bytes, but the filesystem of {self.path!r} holds "
                f"{total} bytes in all: give at most what it can hold (and leave room for other users)"
            )

    def _warn_if_short(self) -> None:
        """Warn (ResourceWarning) when the free space and this tier's own files cannot hold every
        slot: stores past the free space fail (counted ``store_failed_no_space``)."""
        try:
            fs = os.statvfs(self._dir_fd)
        except OSError:
            return
        # Files take whole blocks: 4,608-byte files on a 64 KiB tmpfs of 4 KiB blocks fit 7, not 13.
        block = fs.f_frsize or fs.f_bsize or 1
        per_file = -(-self.file_bytes // block) * block
        have = fs.f_bavail * fs.f_frsize + int(self._used.sum()) * per_file + self._foreign_bytes
        if have < self.num_slots * per_file:
            import warnings

            warnings.warn(
                f"DiskTier {self.name!r}: {self.num_slots} slots of {self.file_bytes} bytes need "
                f"{self.num_slots * per_file} bytes on disk (in blocks of {block}), {self.path!r} has "
                f"{have} for them now (free space and the tier's files): stores past it fail with no "
                "space",
                ResourceWarning,
                stacklevel=3,
            )

    def _check_process(self) -> None:
        """Refuse a call from a forked child: it shares the parent's lock (a second opener is refused,
        a fork is not) but not its slot index, so the two would overwrite each other's files."""
        if os.getpid() != self._pid:
            raise ConfigError(
                f"DiskTier {self.name!r}: opened by process {self._pid}, used in {os.getpid()} (a forked "
                "child): give the child a DiskTier of its own on a directory of its own (this one's "
                "stays locked while any process holds the inherited descriptor: close() it in the child)"
            )

    def _file(self, slot: int) -> str:
        """A slot file's name in the directory (every path is relative to ``_dir_fd``)."""
        return slot_filename(slot)

    def _remove(self, path: str) -> bool:
        """Remove the entry at ``path`` (a link itself, never what it points to; a directory only if
        empty); True if this call removed it. A failure, other than nothing being there, is counted."""
        try:
            os.unlink(path, dir_fd=self._dir_fd)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno not in (errno.EISDIR, errno.EPERM):  # EPERM: unlink(2) of a directory on BSD
                self._stats.add("remove_failed")
                return False
        try:
            os.rmdir(path, dir_fd=self._dir_fd)
            return True
        except FileNotFoundError:
            return False
        except OSError:  # not empty (or not a directory after all: an EPERM that meant EPERM)
            self._stats.add("remove_failed")
            return False

    def _staging(self, pool: KVPool) -> np.ndarray:
        """The staging rows, allocated at first use (pinned when ``pool`` is on the GPU)."""
        if self._stage is None:
            self._stage = pool.backend.empty_host((self._codec.chunk_pages, self.payload_len), np.uint8)
            self._stage.fill(0)
        return self._stage

    def _drop(self, slot: int) -> None:
        """The slot no longer holds a valid page of ours: remove its file (if ours) and mark it empty."""
        if self._used[slot]:
            self._remove(self._file(slot))
        self._used[slot] = False
        self._inodes.pop(slot, None)

    # ------------------------------------------------------------------------------------ open

    def _scan(self) -> list[DiskEntry]:
        """Index the directory: valid files of this geometry become entries, the rest is removed or
        skipped and counted (see the ``open_*`` counters)."""
        entries: list[DiskEntry] = []
        try:
            listing = list(os.scandir(self._dir_fd))  # entry.path is then the name
        except OSError as e:
            raise ConfigError(f"path: cannot list {self.path!r} ({e})") from None
        for entry in listing:
            name = entry.name
            t = _TEMP_RE.fullmatch(name)
            if t is not None:
                # only names this tier writes (8 digits at least, no extra leading zero)
                if name == slot_filename(int(t[1])) + _TEMP_SUFFIX and self._remove(entry.path):
                    self._stats.add("open_removed_temp")
                    self._stats.add("open_removed")
                continue
            m = _SLOT_RE.fullmatch(name)
            if m is None or name != slot_filename(int(m[1])):
                continue  # not a slot file of ours (the lock file, an operator's file)
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue  # a symlink, FIFO, directory, ...: not a file of ours
                verdict, header, inode = self._check_file(entry.path)
            except OSError:
                self._stats.add("open_unreadable")
                continue
            slot = int(m[1])
            if slot >= self.num_slots and verdict in ("ok", "foreign"):
                # Beyond the budget, ours or another geometry's (a directory used before with
                # another quantization or dtype): no store ever replaces it, so it would hold disk
                # past capacity_bytes for good.
                verdict = "out_of_range"
            if verdict == "foreign":
                # At a slot of ours: left until the slot's first store replaces it (counted as
                # this tier's room until then).
                self._stats.add("open_foreign")
                with contextlib.suppress(OSError):
                    self._foreign_bytes += os.stat(
                        entry.path, dir_fd=self._dir_fd, follow_symlinks=False
                    ).st_size
            elif verdict != "ok":
                if self._remove(entry.path):
                    self._stats.add(f"open_removed_{verdict}")
                    self._stats.add("open_removed")
            else:
                assert header is not None
                self._used[slot] = True
                self._keys[slot] = np.frombuffer(header.key, dtype=np.uint8)
                self._inodes[slot] = inode
                entries.append(
                    DiskEntry(slot, header.key, header.parent_key, header.namespace, header.tokens)
                )
        self._stats.add("open_entries", len(entries))
        entries.sort(key=lambda e: e.slot)
        return entries

    def _check_file(self, path: str) -> tuple[str, codec.PageHeader | None, tuple[int, int]]:
        """``(verdict, header, (st_dev, st_ino))``: verdict "ok", "foreign", "header" or "truncated"
        (from the header alone; the payload checksum is verified at load). OSError if it is not a
        regular file (it was replaced since the directory was listed) or cannot be read."""
        fd = os.open(path, os.O_RDONLY | _SAFE_OPEN, dir_fd=self._dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            inode = (st.st_dev, st.st_ino)
            size = st.st_size
            prefix = os.pread(fd, codec.FIXED_LEN, 0)
            if len(prefix) < codec.FIXED_LEN:
                return "truncated", None, inode
            try:
                hlen = codec.parse_header_prefix(prefix)
            except HeaderError as e:
                # Another format version (a newer kvcore's file, or an older one's): kept, as
                # another geometry's is, until this tier stores its slot (opening a directory with
                # another version no longer erases it).
                return ("foreign" if e.reason == "version" else "header"), None, inode
            if size < hlen:
                return "truncated", None, inode
            buf = os.pread(fd, hlen, 0)
        finally:
            os.close(fd)
        try:
            header = codec.parse_header(buf)
        except HeaderError as e:
            if e.reason == "checksum":
                self._stats.add("checksum_mismatches")
            return "header", None, inode
        if size != header.header_len + header.payload_len:
            return "truncated", None, inode
        if header.geometry != self.geometry:
            return "foreign", None, inode
        if header.header_len != self.header_len or header.payload_len != self.payload_len:
            return "header", None, inode  # our geometry but not our sizes: no writer of this format made it
        return "ok", header, inode

    def entries(self) -> list[DiskEntry]:
        """Every valid file the tier holds now, by slot: what ``restore_tier`` re-indexes (a restart,
        or a manager that forgot its index: ``reset_prefix_cache``).

        Files validated at open come from the open's scan; files stored since are read back (their
        header only, one small read each), and a file whose header no longer matches its slot's key
        is left out. The Rust side re-verifies each key from its parent key, namespace and tokens
        before trusting it; an entry it refuses stays on disk until its slot is stored again
        (:meth:`forget` its slot to drop it at once).
        """
        self._check_process()
        with self._lock:
            known = {e.slot: e for e in self._entries}
            entries: list[DiskEntry] = []
            for slot in np.flatnonzero(self._used).tolist():
                key = self._keys[slot].tobytes()
                entry = known.get(slot)
                if entry is None or entry.key != key:  # stored since it was listed: read it back
                    entry = self._read_entry(slot, key)
                if entry is not None:
                    entries.append(entry)
            self._entries = entries
            return list(entries)

    def _read_entry(self, slot: int, key: bytes) -> DiskEntry | None:
        """The entry of ``slot``'s file from its header, if the file is valid and holds ``key``."""
        try:
            verdict, header, _ = self._check_file(slot_filename(slot))
        except OSError:
            return None
        if verdict != "ok" or header is None or header.key != key:
            return None
        return DiskEntry(slot, header.key, header.parent_key, header.namespace, header.tokens)

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
        """Write pool page ``pages[i]`` (every layer, K and V) to the file of slot ``slots[i]``.

        Args:
            pool: a pool of this tier's geometry.
            pages: int32 ``[n]`` page ids in ``[1, num_pages)`` (one may repeat: read into two slots).
            slots: int32 ``[n]`` distinct slots in ``[0, num_slots)``; a used slot is overwritten (its
                old page, then no page, then the new one: never a mix).
            keys: uint8 ``[n, 16]``; parent_keys: uint8 ``[n, 16]``; tokens: uint32 ``[n, page_size]``;
                namespaces: ``[n]`` str or None (``"*"`` is the public namespace). All go in the header.

        Returns:
            bool ``[n]``: False where the write failed (an OSError, counted by reason as
            ``store_failed_*``, or a namespace too long for a header). A failed row's slot is empty
            afterwards: its old file is removed too, so the tier never holds what the caller thinks gone.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry, a namespace that is not valid Unicode), before
                anything is written.
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
        self._check_process()
        n = a.pages.shape[0]
        digest = _batch.scale_digest(pool)
        ok = np.zeros(n, dtype=bool)
        chunk = self._codec.chunk_pages
        with self._lock:
            planes = self._codec.host_planes(pool)
            if planes is not None:  # straight from the pool's pieces of each page
                for i, page in enumerate(a.pages.tolist()):
                    ok[i] = self._write_one(a, i, list(planes[:, page]), digest)
            else:
                stage = self._staging(pool)
                for c in range(0, n, chunk):
                    ids = a.pages[c : c + chunk]
                    self._codec.pages_to_rows(pool, ids, stage, np.arange(ids.shape[0]))
                    for j in range(ids.shape[0]):
                        ok[c + j] = self._write_one(a, c + j, [stage[j]], digest)
            if self.fsync and ok.any():
                self._fsync_dir()
            num_ok = int(ok.sum())
            self._stats.add("stores", num_ok)
            self._stats.add("store_failed", n - num_ok)
        return ok

    def _write_one(self, a: _batch.StoreArgs, i: int, payload: list[np.ndarray], digest: bytes) -> bool:
        """Write row ``i`` of a store, its payload the concatenation of ``payload`` (1-D uint8)."""
        slot = int(a.slots[i])
        try:
            codec.pack_header(
                self._whdr,
                geometry=self.geometry,
                key=a.keys[i].tobytes(),
                parent_key=a.parent_keys[i].tobytes(),
                namespace=a.namespaces[i],
                tokens=a.tokens[i],
                payload_len=self.payload_len,
                payload_checksum=codec.checksum(payload),
                scale_digest=digest,
            )
        except HeaderError:
            self._stats.add("store_failed_namespace")
            self._drop(slot)
            return False
        final = self._file(slot)
        tmp = final + _TEMP_SUFFIX
        dir_fd = self._dir_fd
        fd = -1
        was_used = bool(self._used[slot])
        self._used[slot] = False  # until the new file is in place
        old = self._inodes.pop(slot, None)
        try:
            fd, inode, recycled = self._open_temp(final, tmp, old if was_used else None)
            _write_all(fd, [self._whdr_view, *payload])
            if recycled:
                os.ftruncate(fd, self.file_bytes)  # a no-op for our own files, which all have this size
            if self.fsync:
                os.fsync(fd)
            os.close(fd)
            fd = -1
            try:
                os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except IsADirectoryError:  # a directory put at the slot's name: replaced only if empty
                if not self._remove(final):
                    raise
                os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as e:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            if was_used:
                self._remove(final)  # the old page must not outlive a failed overwrite
            self._stats.add(_reason(e))
            return False
        except BaseException:
            # KeyboardInterrupt: raised on, the descriptor closed; the rest stays as a crash leaves it
            # (the slot empty, a temp file the next store of the slot or the next open removes)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        self._used[slot] = True
        self._keys[slot] = a.keys[i]
        self._inodes[slot] = inode
        self._stats.add("bytes_written", self.file_bytes)
        return True

    def _open_temp(
        self, final: str, tmp: str, old: tuple[int, int] | None
    ) -> tuple[int, tuple[int, int], bool]:
        """``(fd, (st_dev, st_ino), recycled)``: a descriptor open for writing on ``tmp``, where the
        slot's new file is written, the inode it is open on, and whether that is the slot's old
        file, ``old`` (recycled: written over in place, then truncated to size).

        Recycling: renaming the old file away empties the slot atomically, and overwriting its blocks
        in place frees and allocates nothing (replacing files made ext4 free and discard 0.5 MiB per
        store: half the write throughput). But whatever is at ``final`` or ``tmp`` may have been put
        there by someone else, and a write through a symlink or a second hard link would land
        outside the directory. So the file opened (without following links or blocking) is recycled
        only if it is the inode this tier made or validated for the slot (``old``: a name can be
        swapped between the open and the check, a descriptor cannot) and still has one link: one
        ``fstat`` on this, the hot path. Anything else is removed (the entry itself) and a new file
        made with ``O_EXCL``, which never follows a link either.

        Raises:
            OSError: the error of the open (or of the removal, as EEXIST) that failed.
        """
        dir_fd = self._dir_fd
        if old is not None:
            try:
                try:
                    os.rename(final, tmp, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the entry itself
                except IsADirectoryError:  # a directory at the temp name: removed only if empty
                    if not self._remove(tmp):
                        raise
                    os.rename(final, tmp, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            else:
                try:
                    fd = os.open(tmp, os.O_WRONLY | _SAFE_OPEN, dir_fd=dir_fd)
                except OSError as e:
                    if e.errno not in _NOT_A_FILE:
                        raise
                    fd = -1
                if fd >= 0:
                    try:  # everything after the open: a KeyboardInterrupt too closes the descriptor
                        st = os.fstat(fd)
                        same = st.st_ino == old[1] and st.st_dev == old[0]
                        if same and st.st_nlink == 1 and stat.S_ISREG(st.st_mode):
                            return fd, old, True
                    except BaseException:
                        os.close(fd)
                        raise
                    os.close(fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE_OPEN
        try:
            fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        except FileExistsError:  # what was not recycled above, a crash's leftover, someone's entry
            self._remove(tmp)
            fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)  # EEXIST again if it could not be removed
        try:
            st = os.fstat(fd)
        except BaseException:  # (a descriptor leaked here kept a removed temp file's blocks)
            os.close(fd)
            raise
        return fd, (st.st_dev, st.st_ino), False

    def _fsync_dir(self) -> None:
        try:
            os.fsync(self._dir_fd)
        except OSError:
            self._stats.add("fsync_failed")

    # ------------------------------------------------------------------------------------ load

    def load(self, pool: KVPool, slots: Any, pages: Any, keys: Any) -> np.ndarray:
        """Read slot ``slots[i]``'s file into pool page ``pages[i]`` where it holds the page ``keys[i]``.

        Args:
            pool: a pool of this tier's geometry.
            slots: int32 ``[n]`` slots in ``[0, num_slots)``.
            pages: int32 ``[n]`` distinct page ids in ``[1, num_pages)``.
            keys: uint8 ``[n, 16]`` the keys expected.

        Returns:
            bool ``[n]``: False (counted as ``load_failed_*``) for an empty slot, another key, another
            geometry/dtype/quantization or pool scales, a checksum mismatch or a corrupt file (both
            removed), or an OSError. A False row leaves its pool page's bytes unspecified (the file
            is read straight into the page before it is checked; the engine recomputes the page).

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry), before anything is read.
        """
        s, p, k = _batch.check_load(self.geometry, self.num_slots, self.name, pool, slots, pages, keys)
        self._check_process()
        n = s.shape[0]
        digest = _batch.scale_digest(pool)
        ok = np.zeros(n, dtype=bool)
        chunk = self._codec.chunk_pages
        with self._lock:
            used = self._used[s]
            key_ok = (self._keys[s] == k).all(axis=1)
            self._stats.add("load_failed_empty", int((~used).sum()))
            self._stats.add("load_failed_key", int((used & ~key_ok).sum()))
            todo = np.flatnonzero(used & key_ok)
            todo_slots = s[todo].tolist()
            todo_keys = [bytes(key) for key in k[todo]]
            paths = [self._file(slot) for slot in todo_slots]
            planes = self._codec.host_planes(pool)
            prefetch = None
            try:
                if len(paths) > 1:
                    prefetch = _Prefetch(paths, self._dir_fd, self.file_bytes)
                if planes is not None:  # straight into the pool's pieces of each page
                    todo_pages = p[todo].tolist()
                    verdicts = self._read_files(
                        paths, todo_keys, lambda j: list(planes[:, todo_pages[j]]), digest, prefetch
                    )
                    for j, verdict in enumerate(verdicts):
                        ok[todo[j]] = self._account(todo_slots[j], verdict)
                else:
                    stage = self._staging(pool)
                    for c in range(0, todo.shape[0], chunk):
                        idx = todo[c : c + chunk]
                        verdicts = self._read_files(
                            paths[c : c + chunk],
                            todo_keys[c : c + chunk],
                            lambda j: [stage[j]],
                            digest,
                            prefetch,
                        )
                        good = [j for j, v in enumerate(verdicts) if self._account(todo_slots[c + j], v)]
                        rows = np.asarray(good, dtype=np.int64)
                        self._codec.rows_to_pages(pool, stage, rows, p[idx[rows]])
                        ok[idx[rows]] = True
            finally:
                if prefetch is not None:
                    prefetch.close()
            num_ok = int(ok.sum())
            self._stats.add("loads", num_ok)
            self._stats.add("load_failed", n - num_ok)
        return ok

    def _read_files(
        self,
        paths: list[str],
        keys: list[bytes],
        payload_of: Callable[[int], list[np.ndarray]],
        digest: bytes,
        prefetch: _Prefetch | None,
    ) -> list[tuple[str, int]]:
        """Read file ``paths[j]`` into its header and ``payload_of(j)`` for every j; returns each
        file's ``(verdict, bytes read)``, the tier's state untouched (see :meth:`_account`).

        Why threads: ``readv`` (the copy out of the page cache, or the wait for the device) runs with
        the interpreter released but the checksum does not, so one thread reading while another checks
        hides most of the checksum, and several files in flight keep a cold device busy. Files are
        handed out in order, one at a time; each thread has its own header buffer.

        Never returns or raises while a reader thread may still write into a payload (pool pages,
        which the engine gives to another request as soon as the call is over): an exception in the
        calling thread (KeyboardInterrupt, a signal handler's, even one during the wait for the
        readers) stops them after the file each is reading, and goes on once they are done
        (:class:`_Crew`).
        """
        m = len(paths)
        verdicts = [("", 0)] * m
        jobs = itertools.count()  # next() is atomic: each j goes to one thread
        errors: list[BaseException] = []
        crew = _Crew()

        def work() -> None:
            hdr = bytearray(self.header_len)
            view = memoryview(hdr)
            for j in jobs:
                if j >= m or errors or crew.stop:
                    return
                verdicts[j] = self._fetch(paths[j], keys[j], payload_of(j), hdr, view, digest)
                if prefetch is not None:
                    prefetch.consumed()

        def helper() -> None:
            try:
                work()
            except BaseException as e:  # a bug: re-raised by the calling thread below
                errors.append(e)

        try:
            for _ in range(min(READERS, -(-m // _PAGES_PER_READER)) - 1):
                crew.start(helper, "kvcore-disk-read")
            work()
        except BaseException:  # KeyboardInterrupt, a bug: the readers stop, waited for below
            crew.stop = True
            raise
        finally:
            interrupt = crew.wait()
        if interrupt is not None:  # the wait was interrupted: raised now that no reader runs
            raise interrupt
        if errors:
            raise errors[0]
        return verdicts

    def _account(self, slot: int, verdict: tuple[str, int]) -> bool:
        """Count a file's ``(verdict, bytes read)`` and apply it to its slot; True for "ok"."""
        self._stats.add("bytes_read", verdict[1])
        counters, fate = _LOAD_VERDICTS[verdict[0]]
        for name in counters:
            self._stats.add(name)
        if fate == "drop":
            self._drop(slot)
        elif fate == "empty":
            self._used[slot] = False
        return verdict[0] == "ok"

    def _fetch(
        self,
        path: str,
        key: bytes,
        payload: list[np.ndarray],
        hdr: bytearray,
        view: memoryview,
        digest: bytes,
    ) -> tuple[str, int]:
        """Read ``path`` into ``hdr`` (through ``view``) and ``payload`` (1-D uint8 pieces, in order);
        ``(verdict, bytes read)``, the verdict a key of ``_LOAD_VERDICTS``: "ok" where the file holds
        page ``key`` of this geometry under ``digest``, its checksum verified.

        Reads no mutable state of the tier and changes none: it runs on several threads at once (the
        directory descriptor is shared: :meth:`close` waits for the load under the tier's lock).
        """
        try:
            fd = os.open(path, os.O_RDONLY | _SAFE_OPEN, dir_fd=self._dir_fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return "special", 0
                got = _read_all(fd, [view, *payload], self.file_bytes)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return "missing", 0
            return ("special" if e.errno in _NOT_A_FILE else "io"), 0
        if got == self.file_bytes:  # the common case: byte compares instead of a parse
            want = self._header_check.payload_checksum(hdr, key, digest)
            if want is not None:
                return ("ok" if codec.checksum(payload) == want else "checksum"), got
        return self._classify(hdr, key, payload, got, digest), got

    def _classify(
        self, hdr: bytearray, key: bytes, payload: list[np.ndarray], got: int, digest: bytes
    ) -> str:
        """:meth:`_fetch`'s verdict by the full checks (parse_header), where the fast ones failed."""
        try:
            if got < codec.FIXED_LEN:
                return "corrupt"  # truncated since open, inside the fixed part
            if codec.parse_header_prefix(hdr) != self.header_len:
                return "geometry"
            if got < self.header_len:  # the rest of the buffer is stale: no checksum to judge
                return "corrupt"
            header = codec.parse_header(hdr)
        except HeaderError as e:
            return "header_checksum" if e.reason == "checksum" else "corrupt"
        if header.geometry != self.geometry or header.payload_len != self.payload_len:
            return "geometry"
        if got != self.file_bytes:
            return "corrupt"  # truncated since open
        if header.key != key:
            return "key"
        if header.scale_digest != digest:
            return "scales"
        if codec.checksum(payload) != header.payload_checksum:
            return "checksum"
        return "ok"

    # ------------------------------------------------------------------------------------ rest

    def forget(self, slots: Any) -> None:
        """Delete the files of these slots (the manager dropped their pages) and mark them empty.

        Slots that hold nothing of ours are skipped (a foreign file is left alone). A file that cannot
        be removed is counted (``remove_failed``); its slot is empty all the same.

        Raises:
            InvalidDTypeError, InvalidArgumentError: slots that are not integers in ``[0, num_slots)``.
        """
        s = index_array(slots, "slots", dtype=np.int64, low=0, high=self.num_slots, what="slots")
        self._check_process()
        with self._lock:
            for slot in np.unique(s).tolist():
                if self._used[slot]:
                    self._stats.add("forgets")
                    self._drop(slot)

    def stats(self) -> dict[str, int]:
        """Counters (flat, every name always present; see ``_STAT_NAMES`` in the source for each)."""
        with self._lock:
            out = self._stats.snapshot()
            used = int(self._used.sum())
        out.update(
            num_slots=self.num_slots,
            slots_used=used,
            bytes=used * self.file_bytes,
            capacity_bytes=self.num_slots * self.file_bytes,
        )
        return out

    def close(self) -> None:
        """Release the directory lock and the directory (the files stay), after any call in flight.
        The tier must not be used afterwards (its calls then fail, counted: EBADF)."""
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            self._close_fds()

    def _close_fds(self) -> None:
        for attr in ("_lock_fd", "_dir_fd"):
            fd = getattr(self, attr, -1)
            setattr(self, attr, -1)  # -1: a later call fails (EBADF), never resolves by name
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the lock's descriptor releases the flock

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._close_fds()  # nothing can be in flight on an unreachable tier: no lock to take

    def __repr__(self) -> str:
        q = f", quantize={self.quantize!r}" if self.quantize else ""
        return (
            f"DiskTier(name={self.name!r}, path={self.path!r}, num_slots={self.num_slots}, "
            f"file_bytes={self.file_bytes}{q})"
        )
